/*
 * test_watchdog_fault.c — the watchdog against slow and frozen servers, with
 * the fault engine's latency injection: holds are told LOST at their
 * deadline even while a renewal is stuck on their engine, holds on another
 * engine are not delayed by it, a LOST event stays LOST when a late renewal
 * answers OK, and cerb_client_close() has a bound with a frozen server.
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

#include <cmocka.h>

#include "cerberus.h"
#include "engine.h"
#include "fault_engine.h"
#include "test_util.h"

#define NFAULT 20
#define NLOCAL 10

struct rec {
    int64_t locked_at; /* before the lock call */
    int64_t lease_ms;
    _Atomic int64_t lost_at;
    atomic_int calls;
};

static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    struct rec *r = ud;
    if (atomic_fetch_add(&r->calls, 1) == 0)
        atomic_store(&r->lost_at, cerb_test_now_ms());
}

static cerb_lock *mk(cerb_client *c, const char *name, int64_t lease, int renew, struct rec *r)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = lease;
    o.renew = renew;
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, &o, &l), CERB_OK);
    if (r) {
        r->lease_ms = lease;
        assert_int_equal(cerb_lock_on_lost(l, on_lost, r), CERB_OK);
    }
    return l;
}

struct recs {
    struct rec *r;
    size_t n;
};

static bool all_lost(void *ud)
{
    struct recs *rs = ud;
    for (size_t i = 0; i < rs->n; i++)
        if (atomic_load(&rs->r[i].calls) == 0)
            return false;
    return true;
}

static int setup(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    return 0;
}

/* The test's client, closed here when an assertion left it open, so that
 * a failed case does not keep renewing into the next one. */
static cerb_client *open_client;

static int teardown(void **state)
{
    (void)state;
    fault_engine_reset();
    cerb_client_close(open_client);
    open_client = NULL;
    return 0;
}

/* Holds on a frozen engine whose renewals stall (1.5 s each, then fail)
 * are told LOST at their deadline, not after the stuck renewals; holds on
 * another engine of the same client too. */
static void test_lost_on_time_while_renewals_stall(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"fault\", \"local\");\n"
                                                 "failover = { switch_grace_ms = 0; };\n"),
                     CERB_OK);
    open_client = c;
    static struct rec r[NFAULT + NLOCAL];
    cerb_lock *l[NFAULT + NLOCAL];
    for (size_t i = 0; i < NFAULT + NLOCAL; i++)
        r[i] = (struct rec){0};
    fault_engine_delay(FAULT_RENEW, 1500, true);
    for (int i = 0; i < NFAULT; i++) {
        char name[32];
        snprintf(name, sizeof name, "stall-f%d", i);
        l[i] = mk(c, name, 600, 1, &r[i]);
        r[i].locked_at = cerb_test_now_ms();
        assert_int_equal(cerb_lock_lock(l[i]), CERB_OK);
    }
    assert_non_null(cerb_engine_switch_to(c, "local"));
    for (int i = NFAULT; i < NFAULT + NLOCAL; i++) {
        char name[32];
        snprintf(name, sizeof name, "stall-l%d", i);
        l[i] = mk(c, name, 400, 0, &r[i]);
        r[i].locked_at = cerb_test_now_ms();
        assert_int_equal(cerb_lock_lock(l[i]), CERB_OK);
    }
    struct recs rs = {r, NFAULT + NLOCAL};
    assert_true(wait_until(all_lost, &rs, 10000));
    assert_true(fault_engine_calls(FAULT_RENEW) >= 1); /* renewals did stall */
    for (size_t i = 0; i < NFAULT + NLOCAL; i++) {
        int64_t late = atomic_load(&r[i].lost_at) - (r[i].locked_at + r[i].lease_ms);
        if (late > 200)
            fail_msg("hold %zu told LOST %lld ms after its lease", i, (long long)late);
        assert_int_equal(atomic_load(&r[i].calls), 1);
    }
    for (size_t i = 0; i < NFAULT + NLOCAL; i++) {
        assert_int_equal(cerb_lock_unlock(l[i]), CERB_LOST);
        cerb_lock_free(l[i]);
    }
    open_client = NULL;
    cerb_client_close(c);
}

static bool renew_started(void *ud)
{
    (void)ud;
    return fault_engine_calls(FAULT_RENEW) >= 1;
}

static bool one_lost(void *ud) { return atomic_load(&((struct rec *)ud)->calls) > 0; }

/* The engine reports the hold LOST while its renewal is in flight; the
 * renewal then answers OK. LOST stays: the holder is told once, and the
 * hold is not VALID again. */
static void test_lost_event_is_final(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"fault\");\n"), CERB_OK);
    open_client = c;
    static struct rec r;
    r = (struct rec){0};
    cerb_lock *l = mk(c, "final-lost", 3000, 1, &r);
    fault_engine_delay(FAULT_RENEW, 700, false); /* slow, then OK */
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_true(wait_until(renew_started, NULL, 3000)); /* at lease/3 */
    assert_true(fault_engine_emit(CERB_EV_LOST, "final-lost") >= 1);
    assert_true(wait_until(one_lost, &r, 2000));
    /* Past the slow renewal's answer, it is still LOST and told once. */
    int64_t end = cerb_test_now_ms() + 1000;
    while (cerb_test_now_ms() < end) {
        assert_int_equal(cerb_lock_state(l), CERB_LOCK_LOST);
        assert_int_equal(atomic_load(&r.calls), 1);
    }
    fault_engine_reset();
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    open_client = NULL;
    cerb_client_close(c);
}

/* Ten renewals due together on a slow server (400 ms a call, each answered):
 * releasing the ten holds waits at most for the one renewal on the wire,
 * not for the whole queue of renewals before it. */
static void test_unlock_does_not_wait_for_queued_renewals(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"fault\");\n"), CERB_OK);
    open_client = c;
    cerb_lock *l[10];
    for (int i = 0; i < 10; i++) {
        char name[32];
        snprintf(name, sizeof name, "queued-%d", i);
        l[i] = mk(c, name, 1500, 1, NULL);
        assert_int_equal(cerb_lock_lock(l[i]), CERB_OK);
    }
    fault_engine_delay(FAULT_RENEW, 400, false);
    assert_true(wait_until(renew_started, NULL, 3000)); /* at lease/3 */
    int64_t t0 = cerb_test_now_ms();
    for (int i = 0; i < 10; i++)
        assert_int_equal(cerb_lock_unlock(l[i]), CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    if (took > 1200)
        fail_msg("releasing ten holds took %lld ms", (long long)took);
    for (int i = 0; i < 10; i++)
        cerb_lock_free(l[i]);
    open_client = NULL;
    cerb_client_close(c);
}

struct closer {
    cerb_client *c;
    atomic_int done;
};

static void *close_main(void *arg)
{
    struct closer *k = arg;
    cerb_client_close(k->c);
    atomic_store(&k->done, 1);
    return NULL;
}

static bool closed(void *ud) { return atomic_load(&((struct closer *)ud)->done) != 0; }

/* Thirty holds on a server that freezes (every call stalls 1 s, like an op
 * timeout): close returns within a few op timeouts, not one per hold. */
static void test_close_bounded_with_frozen_engine(void **state)
{
    (void)state;
    static struct closer k;
    k.c = NULL;
    atomic_store(&k.done, 0);
    assert_int_equal(cerb_client_open_string(&k.c, "engines = (\"fault\");\n"), CERB_OK);
    for (int i = 0; i < 30; i++) {
        char name[32];
        snprintf(name, sizeof name, "frozen-close-%d", i);
        cerb_lock *l = mk(k.c, name, 5000, 1, NULL);
        assert_int_equal(cerb_lock_lock(l), CERB_OK);
    }
    fault_engine_delay(FAULT_ANY, 1000, true);
    pthread_t t;
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(pthread_create(&t, NULL, close_main, &k), 0);
    if (!wait_until(closed, &k, 4000)) {
        pthread_detach(t);
        fail_msg("close still running after 4 s");
    }
    pthread_join(t, NULL);
    assert_true(cerb_test_now_ms() - t0 < 4000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lost_on_time_while_renewals_stall, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_event_is_final, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unlock_does_not_wait_for_queued_renewals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_bounded_with_frozen_engine, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
