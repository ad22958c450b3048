/*
 * inspect_conformance.c — cerb_lock_inspect (DESIGN.md §13) on every engine,
 * written once and built once per engine (inspect_local, inspect_redis,
 * inspect_zk, inspect_etcd, inspect_pg, inspect_mysql;
 * tests/conformance.cmake), the engine fixed at compile time by
 * CERB_CONFORMANCE_ENGINE.
 *
 * The cases: a name nobody holds inspects as empty; a holder and two
 * waiters — each in a client of its own, blocked in a thread of this test,
 * so each one queues on the server — are listed holder first, then the
 * waiters in the order they arrived, the holder's fence equal to the low 48
 * bits of the fencing token it got and its ttl_ms plausible for its lease;
 * the order is proven by what happens next: the holder lets go and the
 * first listed waiter is the one that holds, the other still waits; asking
 * every engine (NULL) gives the same answer; bad input (a NULL name, an
 * invalid name, an engine not configured, NULL out) is CERB_EINVAL.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#ifdef CERB_CONF_ZK
#include "zk_util.h"
#endif
#ifdef CERB_CONF_ETCD
#include "etcd_util.h"
#endif
#ifdef CERB_CONF_PG
#include "pg_util.h"
#endif
#ifdef CERB_CONF_MYSQL
#include "mysql_util.h"
#endif

#ifndef CERB_CONFORMANCE_ENGINE
#error "compile with -DCERB_CONFORMANCE_ENGINE=\"<engine>\" (tests/conformance.cmake does)"
#endif

#define FENCE_MASK ((UINT64_C(1) << 48) - 1)
#define LEASE_MS 8000

static const char *const ENGINE = CERB_CONFORMANCE_ENGINE;

/* Config text with this engine alone (malloc'd). */
static char *config(void)
{
    if (strcmp(ENGINE, "local") == 0) {
        char *s = strdup("engines = (\"local\");\n");
        assert_non_null(s);
        return s;
    }
#ifdef CERB_CONF_REDIS
    if (strcmp(ENGINE, "redis") == 0)
        return cerb_test_redis_config(NULL, NULL);
#endif
#ifdef CERB_CONF_ZK
    if (strcmp(ENGINE, "zk") == 0)
        return cerb_test_zk_config(NULL, NULL, NULL);
#endif
#ifdef CERB_CONF_ETCD
    if (strcmp(ENGINE, "etcd") == 0)
        return etcd_test_config(NULL, NULL);
#endif
#ifdef CERB_CONF_PG
    if (strcmp(ENGINE, "pg") == 0)
        return pg_test_config(NULL, NULL);
#endif
#ifdef CERB_CONF_MYSQL
    if (strcmp(ENGINE, "mysql") == 0)
        return mysql_test_config(NULL, NULL);
#endif
    fail_msg("engine \"%s\" is not built into this suite", ENGINE);
    return NULL;
}

static cerb_client *open_client(void)
{
    char *cfg = config();
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("%s: open: %s: %s", ENGINE, cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = LEASE_MS;
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, name, &o, &l) != CERB_OK)
        fail_msg("lock_new(%s): %s", name, cerb_last_error());
    return l;
}

/* Inspect @name on the engine (or every engine) and return the entries. */
static cerb_holder_info *inspect(cerb_client *c, const char *name, const char *engine,
                                 size_t *n)
{
    cerb_holder_info *v = (cerb_holder_info *)1;
    cerb_status st = cerb_lock_inspect(c, name, engine, &v, n);
    if (st != CERB_OK)
        fail_msg("inspect(%s, %s): %s: %s", name, engine ? engine : "NULL",
                 cerb_status_name(st), cerb_last_error());
    return v;
}

/* ---- a waiter: a client of its own, blocked in a thread ---- */

struct waiter {
    cerb_client *c;
    cerb_lock *l;
    pthread_t t;
    cerb_status st;
    uint64_t fence;
    atomic_bool held, release, done;
};

static bool flag_set(void *ud) { return atomic_load((atomic_bool *)ud); }

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_lock_trylock_for(w->l, 60000);
    if (w->st == CERB_OK) {
        w->fence = cerb_lock_fencing_token(w->l);
        atomic_store(&w->held, true);
        wait_until(flag_set, &w->release, 60000);
        cerb_lock_unlock(w->l);
    }
    atomic_store(&w->done, true);
    return NULL;
}

static void waiter_start(struct waiter *w, const char *name)
{
    memset(w, 0, sizeof *w);
    w->c = open_client();
    w->l = mk(w->c, name);
    assert_int_equal(pthread_create(&w->t, NULL, waiter_main, w), 0);
}

static void waiter_end(struct waiter *w)
{
    atomic_store(&w->release, true);
    pthread_join(w->t, NULL);
    cerb_lock_free(w->l);
    cerb_client_close(w->c);
}

/* Polled: @name shows a holder and exactly `want` waiters. */
struct shows {
    cerb_client *c;
    const char *name;
    size_t want;
};

static bool shows_waiters(void *ud)
{
    struct shows *s = ud;
    cerb_holder_info *v = NULL;
    size_t n = 0;
    if (cerb_lock_inspect(s->c, s->name, ENGINE, &v, &n) != CERB_OK)
        return false;
    bool ok = n == s->want + 1 && !v[0].waiting;
    cerb_holders_free(v, n);
    return ok;
}

/* ------------------------------------------------------------ cases */

static void test_free_name_is_empty(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    char *name = test_name("inspect-free");
    size_t n = 99;
    cerb_holder_info *v = inspect(c, name, ENGINE, &n);
    assert_null(v);
    assert_int_equal(n, 0);
    v = inspect(c, name, NULL, &n);
    assert_null(v);
    assert_int_equal(n, 0);
    cerb_holders_free(NULL, 0);

    /* Held, then released: empty again. */
    cerb_lock *l = mk(c, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    v = inspect(c, name, ENGINE, &n);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].waiting, 0);
    assert_string_equal(v[0].engine, ENGINE);
    cerb_holders_free(v, n);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    v = inspect(c, name, ENGINE, &n);
    assert_int_equal(n, 0);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

static void test_holder_then_waiters_in_order(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    char *name = test_name("inspect-queue");
    cerb_lock *l = mk(c, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    uint64_t token = cerb_lock_fencing_token(l);

    struct waiter w1, w2;
    struct shows sh = {c, name, 1};
    waiter_start(&w1, name);
    assert_wait_until(shows_waiters, &sh, 10000);
    waiter_start(&w2, name);
    sh.want = 2;
    assert_wait_until(shows_waiters, &sh, 10000);

    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, ENGINE, &n);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        print_message("%s: %s %s fence %llu ttl %lld (%s)\n", v[i].engine,
                      v[i].waiting ? "waiting" : "holder", v[i].owner,
                      (unsigned long long)v[i].fence, (long long)v[i].ttl_ms, v[i].detail);
        assert_string_equal(v[i].engine, ENGINE);
        assert_int_equal(v[i].waiting, i > 0);
        assert_true(v[i].owner[0] != '\0');
        assert_non_null(v[i].detail);
    }
    assert_string_not_equal(v[1].owner, v[2].owner);
    assert_string_not_equal(v[0].owner, v[1].owner);
    /* The fence the holder was given, without the epoch. On zk the fence
     * is the node's czxid plus an ensemble-wide offset, which other
     * clients of the server may raise after the grant (a switch's fence
     * floor): then inspection can give only an upper bound, and says so. */
    if (strstr(v[0].detail, "fence at most"))
        assert_true(v[0].fence >= (token & FENCE_MASK));
    else
        assert_int_equal(v[0].fence, token & FENCE_MASK);
    /* A lease: what is left of LEASE_MS (renewed in the background). On
     * zk the hold lives with the session: no lease. */
    if (strcmp(ENGINE, "zk") == 0) {
        assert_int_equal(v[0].ttl_ms, -1);
        assert_true(strncmp(v[0].detail, "session 0x", 10) == 0);
    } else if (strcmp(ENGINE, "etcd") == 0) {
        /* The client's session lease, in whole seconds, not the lock's. */
        long granted = 0;
        assert_int_equal(sscanf(v[0].detail, "TTL %ld s", &granted), 1);
        assert_true(v[0].ttl_ms > 0);
        assert_true(v[0].ttl_ms <= granted * 1000);
    } else {
        assert_true(v[0].ttl_ms > 0);
        assert_true(v[0].ttl_ms <= LEASE_MS);
    }

    /* Every engine (NULL) says the same with one engine configured. */
    size_t n2 = 0;
    cerb_holder_info *v2 = inspect(c, name, NULL, &n2);
    assert_int_equal(n2, n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(v2[i].owner, v[i].owner);
    cerb_holders_free(v2, n2);

    /* Queue order: the first listed waiter is the next holder, and the
     * second one still waits behind it. */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_true(wait_until(flag_set, &w1.held, 10000)); /* w2 would hold on */
    assert_false(atomic_load(&w2.held));
    size_t n3 = 0;
    cerb_holder_info *v3 = inspect(c, name, ENGINE, &n3);
    assert_int_equal(n3, 2);
    assert_string_equal(v3[0].owner, v[1].owner);
    assert_int_equal(v3[0].waiting, 0);
    assert_int_equal(v3[0].fence, w1.fence & FENCE_MASK);
    assert_string_equal(v3[1].owner, v[2].owner);
    assert_int_equal(v3[1].waiting, 1);
    cerb_holders_free(v3, n3);
    cerb_holders_free(v, n);

    waiter_end(&w1);
    assert_true(wait_until(flag_set, &w2.held, 10000));
    waiter_end(&w2);
    assert_int_equal(w1.st, CERB_OK);
    assert_int_equal(w2.st, CERB_OK);
    assert_true(w2.fence > w1.fence && w1.fence > token);
    v = inspect(c, name, ENGINE, &n);
    assert_int_equal(n, 0);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

static void test_bad_input(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    cerb_holder_info *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_lock_inspect(c, NULL, ENGINE, &v, &n), CERB_EINVAL);
    assert_int_equal(cerb_lock_inspect(c, NULL, NULL, &v, &n), CERB_EINVAL);
    assert_int_equal(cerb_lock_inspect(c, "", ENGINE, &v, &n), CERB_EINVAL);
    assert_int_equal(cerb_lock_inspect(c, "a\tb", ENGINE, &v, &n), CERB_EINVAL);
    assert_int_equal(cerb_lock_inspect(c, "x", "nosuch", &v, &n), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "nosuch"));
    assert_int_equal(cerb_lock_inspect(c, "x", ENGINE, NULL, &n), CERB_EINVAL);
    assert_int_equal(cerb_lock_inspect(c, "x", ENGINE, &v, NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_inspect(NULL, "x", ENGINE, &v, &n), CERB_EINVAL);
    assert_null(v);
    assert_int_equal(n, 0);
    if (strcmp(ENGINE, "zk") == 0 || strcmp(ENGINE, "etcd") == 0) {
        /* A name the engine cannot represent. */
        assert_int_equal(cerb_lock_inspect(c, "a/b", ENGINE, &v, &n), CERB_EINVAL);
        assert_non_null(strstr(cerb_last_error(), ENGINE));
    }
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_name_is_empty),
        cmocka_unit_test(test_holder_then_waiters_in_order),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("inspect_" CERB_CONFORMANCE_ENGINE, tests, NULL, NULL);
}
