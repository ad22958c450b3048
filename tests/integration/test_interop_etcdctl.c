/*
 * test_interop_etcdctl.c — Cerberus and `etcdctl lock` (Debian etcd-client,
 * Go's concurrency.Mutex) on the same name exclude each other, both ways:
 *  - etcdctl holds: Cerberus trylock is BUSY, a timed wait times out, a
 *    waiter gets the lock as soon as etcdctl releases (SIGTERM makes it
 *    unlock), and after a kill -9 once etcdctl's session lease expires;
 *  - Cerberus holds: `etcdctl lock NAME -- CMD` queues and runs CMD only
 *    after our unlock;
 *  - mixed contention: etcdctl processes and Cerberus threads increment one
 *    counter file under the lock; no update is lost.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "etcd_util.h"
#include "test_util.h"

static cerb_client *open_client(void)
{
    char *cfg = etcd_test_config(NULL, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, name, NULL, &l) != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

struct queued {
    const char *name;
    int n;
};

static bool n_keys(void *ud)
{
    struct queued *q = ud;
    struct etcd_test_kv kv[16];
    char p[512];
    snprintf(p, sizeof p, "%s/", q->name);
    return etcd_test_keys(etcd_test_port(), p, kv, 16) == q->n;
}

struct waiter {
    cerb_lock *l;
    int64_t wait_ms;
    cerb_status st;
    int64_t got_at;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_lock_trylock_for(w->l, w->wait_ms);
    w->got_at = cerb_test_now_ms();
    if (w->st == CERB_OK)
        cerb_lock_unlock(w->l);
    atomic_store(&w->done, true);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

/* ---- etcdctl holds, Cerberus waits ---- */

static void etcdctl_holds(int sig, const char *ttl)
{
    char *name = test_name("ctl-holds");
    const char *args[] = {"lock", name, ttl, NULL};
    pid_t pid = etcd_test_etcdctl(etcd_test_port(), args);
    assert_true(pid > 0);
    struct queued q1 = {name, 1};
    assert_wait_until(n_keys, &q1, 10000);

    cerb_client *c = open_client();
    cerb_lock *l = mk(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock_for(l, 200), CERB_TIMEOUT);
    assert_true(n_keys(&q1)); /* nothing of ours left queued */

    struct waiter w = {.l = l, .wait_ms = 20000};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    struct queued q2 = {name, 2};
    assert_wait_until(n_keys, &q2, 3000);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(kill(pid, sig), 0);
    assert_wait_until(waiter_done, &w, 15000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    int64_t took = w.got_at - t0;
    if (sig == SIGTERM)
        assert_true(took < 1000); /* etcdctl unlocked: the watch fired */
    else
        assert_true(took >= 1000 && took < 6000); /* its lease (--ttl=2) expired */
    cerb_test_wait(pid, 10000);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

static void test_etcdctl_holds_then_unlocks(void **state)
{
    (void)state;
    etcdctl_holds(SIGTERM, "--ttl=10");
}

static void test_etcdctl_holds_then_dies(void **state)
{
    (void)state;
    etcdctl_holds(SIGKILL, "--ttl=2");
}

/* ---- Cerberus holds, etcdctl waits ---- */

static bool file_exists(void *ud)
{
    struct stat sb;
    return stat(ud, &sb) == 0;
}

static void test_cerberus_holds(void **state)
{
    (void)state;
    char *name = test_name("cerb-holds");
    char dir[] = "/tmp/cerb-etcdctl-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char mark[600], cmd[700];
    snprintf(mark, sizeof mark, "%s/ran", dir);
    snprintf(cmd, sizeof cmd, "touch %s", mark);

    cerb_client *c = open_client();
    cerb_lock *l = mk(c, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    const char *args[] = {"lock", name, "--", "sh", "-c", cmd, NULL};
    pid_t pid = etcd_test_etcdctl(etcd_test_port(), args);
    assert_true(pid > 0);
    /* etcdctl queued its key behind ours and waits. */
    struct queued q2 = {name, 2};
    assert_wait_until(n_keys, &q2, 10000);
    assert_false(file_exists(mark));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_wait_until(file_exists, mark, 5000);
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    struct queued q0 = {name, 0};
    assert_wait_until(n_keys, &q0, 3000);
    /* And Cerberus can have it again. */
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    unlink(mark);
    rmdir(dir);
    free(name);
}

/* ---- mixed contention on one counter file ---- */

struct mixed {
    const char *name;
    const char *file;
    atomic_int errors;
};

static long read_counter(const char *file)
{
    FILE *f = fopen(file, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static void *mixed_main(void *arg)
{
    struct mixed *m = arg;
    cerb_client *c = open_client();
    cerb_lock *l = mk(c, m->name);
    for (int i = 0; i < 10; i++) {
        if (cerb_lock_lock(l) != CERB_OK) {
            atomic_fetch_add(&m->errors, 1);
            continue;
        }
        long v = read_counter(m->file);
        FILE *f = fopen(m->file, "w");
        if (!f || v < 0) {
            atomic_fetch_add(&m->errors, 1);
        } else {
            fprintf(f, "%ld\n", v + 1);
            fclose(f);
        }
        cerb_lock_unlock(l);
    }
    cerb_lock_free(l);
    cerb_client_close(c);
    return NULL;
}

static void test_mixed_contention(void **state)
{
    (void)state;
    char *name = test_name("mixed");
    char file[] = "/tmp/cerb-etcdctl-counter-XXXXXX";
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "0\n", 2), 2);
    close(fd);
    /* Each etcdctl round: read, pause a little inside the lock, write. */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "v=$(cat %s); sleep 0.02; echo $((v+1)) > %s", file, file);
    const char *args[] = {"lock", name, "--", "sh", "-c", cmd, NULL};

    struct mixed m = {.name = name, .file = file};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, mixed_main, &m);
    enum { ROUNDS = 4, PROCS = 3 };
    for (int r = 0; r < ROUNDS; r++) {
        pid_t pids[PROCS];
        for (int i = 0; i < PROCS; i++)
            pids[i] = etcd_test_etcdctl(etcd_test_port(), args);
        for (int i = 0; i < PROCS; i++)
            assert_int_equal(cerb_test_wait(pids[i], 60000), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&m.errors), 0);
    assert_int_equal(read_counter(file), 2 * 10 + ROUNDS * PROCS);
    unlink(file);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_etcdctl_holds_then_unlocks),
        cmocka_unit_test(test_etcdctl_holds_then_dies),
        cmocka_unit_test(test_cerberus_holds),
        cmocka_unit_test(test_mixed_contention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
