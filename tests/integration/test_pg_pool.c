/*
 * test_pg_pool.c — the pg engine behind a transaction-pooling proxy
 * (integration/pg_txn_pool_proxy.py, which hands each transaction of a
 * client connection to one of two server sessions in turn, as PgBouncer's
 * pool_mode = transaction does), against the shared test PostgreSQL:
 *  - hybrid mode refuses to open there, saying why and what to do: a
 *    session lock taken through it would stay on a backend the client no
 *    longer talks to (authentik#23876, DistributedLock#168);
 *  - lease mode (the row alone) works there: locks exclude, also against
 *    a hybrid client connected directly, fences grow, unlock frees;
 *  - with pg.notify_conninfo, a waiter in lease mode is woken by the
 *    release's NOTIFY instead of polling.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "pg_util.h"
#include "test_util.h"

static pid_t proxy_pid;
static int proxy_port;

static bool accepts(void *ud)
{
    int port = *(int *)ud;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static int setup(void **state)
{
    (void)state;
    char script[1024], lp[16], sp[16];
    snprintf(script, sizeof script, "%s/tests/integration/pg_txn_pool_proxy.py",
             cerb_test_source_dir());
    proxy_port = pg_test_port() + 57;
    snprintf(lp, sizeof lp, "%d", proxy_port);
    snprintf(sp, sizeof sp, "%d", pg_test_port());
    char *argv[] = {(char *)cerb_test_python(), script, lp, sp, NULL};
    proxy_pid = cerb_test_spawn(argv);
    if (proxy_pid <= 0 || !wait_until(accepts, &proxy_port, 10000)) {
        fprintf(stderr, "pg_txn_pool_proxy.py did not start on port %d\n", proxy_port);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (proxy_pid > 0) {
        kill(proxy_pid, SIGTERM);
        cerb_test_wait(proxy_pid, 5000);
    }
    return 0;
}

/* A config for the pg engine through the proxy (mode given) or direct. */
static char *config(bool through_proxy, const char *mode)
{
    char buf[512];
    snprintf(buf, sizeof buf,
             "engines = (\"pg\");\npg = { conninfo = \"host=127.0.0.1 port=%d dbname=cerb "
             "user=cerb\"; mode = \"%s\"; };\n",
             through_proxy ? proxy_port : pg_test_port(), mode);
    return strdup(buf);
}

static cerb_client *open_cfg(bool through_proxy, const char *mode)
{
    char *cfg = config(through_proxy, mode);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static void test_hybrid_refused_behind_a_pooler(void **state)
{
    (void)state;
    char *cfg = config(true, "hybrid");
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    assert_int_not_equal(st, CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "transaction-pooling"));
    assert_non_null(strstr(cerb_last_error(), "lease"));
}

static void test_lease_mode_behind_a_pooler(void **state)
{
    (void)state;
    cerb_client *a = open_cfg(true, "lease");
    cerb_client *b = open_cfg(false, "hybrid");
    cerb_client *c = open_cfg(true, "lease");
    char *name = test_name("pg-pool");
    cerb_lock *la = NULL, *lb = NULL, *lc = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    assert_int_equal(cerb_lock_new(c, name, NULL, &lc), CERB_OK);

    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    uint64_t f1 = cerb_lock_fencing_token(la);
    /* Excluded through the row: another lease client, and a hybrid one
     * whose advisory lock is free. */
    assert_int_equal(cerb_lock_trylock(lc), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock(lb), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);

    assert_int_equal(cerb_lock_trylock(lb), CERB_OK);
    uint64_t f2 = cerb_lock_fencing_token(lb);
    assert_true(f2 > f1);
    assert_int_equal(cerb_lock_trylock(la), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    /* A waiter in lease mode gets it once it is freed. */
    assert_int_equal(cerb_lock_lock(lc), CERB_OK);
    assert_true(cerb_lock_fencing_token(lc) > f2);
    assert_int_equal(cerb_lock_unlock(lc), CERB_OK);

    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_lock_free(lc);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(c);
}

struct waiter {
    cerb_lock *l;
    cerb_status st;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_lock_trylock_for(w->l, 8000);
    if (w->st == CERB_OK)
        cerb_lock_unlock(w->l);
    return NULL;
}

static uint64_t acquire_calls(cerb_client *c)
{
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "pg", &info), CERB_OK);
    return info.acquire_calls;
}

struct calls_arg {
    cerb_client *c;
    uint64_t above;
};

static bool calls_above(void *ud)
{
    struct calls_arg *a = ud;
    return acquire_calls(a->c) > a->above;
}

/* Lease mode with pg.notify_conninfo: a waiter behind the pooler naps
 * until the holder's lease would end, and the release's NOTIFY, heard on a
 * direct session, wakes it: a handful of claims, not one per poll. */
static void test_lease_waiter_woken_by_notify(void **state)
{
    (void)state;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "engines = (\"pg\");\nlock = { lease_ms = 10000; };\npg = { conninfo = "
             "\"host=127.0.0.1 port=%d dbname=cerb user=cerb\"; mode = \"lease\"; "
             "notify_conninfo = \"host=127.0.0.1 port=%d dbname=cerb user=cerb\"; };\n",
             proxy_port, pg_test_port());
    cerb_client *a = open_cfg(true, "lease"), *b = NULL;
    assert_int_equal(cerb_client_open_string(&b, cfg), CERB_OK);
    char *name = test_name("pg-notify");
    cerb_lock *la = NULL, *lb = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);

    uint64_t before = acquire_calls(b);
    struct waiter w = {.l = lb};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
    struct calls_arg ca = {b, before};
    assert_true(wait_until(calls_above, &ca, 5000)); /* it tried once and waits */
    cerb_test_let_time_pass(1000);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    uint64_t calls = acquire_calls(b) - before;
    print_message("waiter behind the pooler: %llu claims for one acquisition\n",
                  (unsigned long long)calls);
    assert_true(calls <= 3); /* polling took ten in that second (without notify_conninfo) */

    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_refused_behind_a_pooler),
        cmocka_unit_test(test_lease_mode_behind_a_pooler),
        cmocka_unit_test(test_lease_waiter_woken_by_notify),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
