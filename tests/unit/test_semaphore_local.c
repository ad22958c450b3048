/*
 * test_semaphore_local.c — semaphores (core/semaphore.c) on the in-process
 * local engine: at most the limit held at once, many permits per process,
 * first come first served (a big request is not passed by smaller ones),
 * fences growing, a stored limit that refuses another, the lost callback,
 * a cancel, inspection, bad input, and the clear refusal of an engine
 * without semaphores (the local engine in file mode).
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "fault_engine.h"
#include "test_util.h"

static cerb_client *open_local(void)
{
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"local\");\n"), CERB_OK);
    return c;
}

static cerb_semaphore *sem(cerb_client *c, const char *name, int64_t n)
{
    cerb_semaphore *s = NULL;
    assert_int_equal(cerb_semaphore_new(c, name, n, NULL, &s), CERB_OK);
    return s;
}

static void test_limit_holds(void **state)
{
    (void)state;
    cerb_client *c1 = open_local(), *c2 = open_local();
    cerb_semaphore *a = sem(c1, "sem-limit", 3), *b = sem(c2, "sem-limit", 3);
    cerb_permit *p1 = NULL, *p2 = NULL, *p3 = NULL, *p4 = NULL;
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p1), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p2), CERB_OK); /* same process */
    assert_int_equal(cerb_semaphore_acquire(b, 2, 0, NULL, &p3), CERB_BUSY);
    assert_null(p3);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 0, NULL, &p3), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 50, NULL, &p4), CERB_TIMEOUT);
    assert_int_equal(cerb_permit_count(p3), 1);
    assert_int_equal(cerb_permit_state(p1), CERB_LOCK_VALID);
    assert_true(cerb_permit_valid_ms(p1) > 0);
    uint64_t f1 = cerb_permit_fencing_token(p1), f2 = cerb_permit_fencing_token(p2),
             f3 = cerb_permit_fencing_token(p3);
    assert_true(f1 < f2 && f2 < f3);

    /* Inspection: three holders, each one permit of three. */
    cerb_holder_info *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(c2, CERB_KIND_SEMAPHORE, "sem-limit", NULL, &v, &n), CERB_OK);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].waiting, 0);
        assert_string_equal(v[i].detail, "permits 1 of 3");
    }
    cerb_holders_free(v, n);
    /* The lock of the same name is another thing. */
    assert_int_equal(cerb_inspect(c2, CERB_KIND_LOCK, "sem-limit", NULL, &v, &n), CERB_OK);
    assert_int_equal(n, 0);

    char *m = NULL;
    assert_int_equal(cerb_metrics_text(c1, &m), CERB_OK);
    assert_non_null(strstr(m, "cerberus_semaphore_acquisitions_total{engine=\"local\"} 2\n"));
    cerb_free(m);
    assert_int_equal(cerb_permit_release(p2), CERB_OK);
    assert_int_equal(cerb_permit_release(p2), CERB_NOT_OWNER);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 0, NULL, &p4), CERB_OK);
    assert_true(cerb_permit_fencing_token(p4) > f3);
    assert_int_equal(cerb_permit_free(p1), CERB_OK);
    assert_int_equal(cerb_permit_free(p2), CERB_OK);
    assert_int_equal(cerb_permit_free(p3), CERB_OK);
    assert_int_equal(cerb_permit_free(p4), CERB_OK);
    assert_int_equal(cerb_semaphore_free(a), CERB_OK);
    assert_int_equal(cerb_semaphore_free(b), CERB_OK);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

static void test_stored_limit_refuses_another(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_semaphore *a = sem(c, "sem-mismatch", 2), *b = sem(c, "sem-mismatch", 5);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 1000, NULL, &q), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "limit of 2"));
    assert_null(q);
    /* Drained, the name takes the next caller's limit. */
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 5, 0, NULL, &q), CERB_OK);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    cerb_semaphore_free(a);
    cerb_semaphore_free(b);
    cerb_client_close(c);
}

struct taker {
    cerb_semaphore *s;
    unsigned k;
    atomic_int done;
    cerb_permit *p;
    cerb_status st;
};

static void *take_main(void *arg)
{
    struct taker *t = arg;
    t->st = cerb_semaphore_acquire(t->s, t->k, 5000, NULL, &t->p);
    atomic_store(&t->done, 1);
    return NULL;
}

struct waiters {
    cerb_client *c;
    const char *name;
    size_t want;
};

static bool enough_waiters(void *ud)
{
    struct waiters *w = ud;
    cerb_holder_info *v = NULL;
    size_t n = 0, k = 0;
    if (cerb_inspect(w->c, CERB_KIND_SEMAPHORE, w->name, NULL, &v, &n) != CERB_OK)
        return false;
    for (size_t i = 0; i < n; i++)
        k += (size_t)v[i].waiting;
    cerb_holders_free(v, n);
    return k >= w->want;
}

/* Until @want members of @name wait (listed as waiters), or fail. */
static void wait_for_waiters(cerb_client *c, const char *name, size_t want)
{
    struct waiters w = {c, name, want};
    assert_true(wait_until(enough_waiters, &w, 5000));
}

static void test_first_come_first_served(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_semaphore *s = sem(c, "sem-fifo", 2);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    /* A request for both permits waits; a later one for one permit, which
     * would fit now, waits behind it. */
    struct taker big = {.s = s, .k = 2}, small = {.s = s, .k = 1};
    pthread_t tb, ts;
    pthread_create(&tb, NULL, take_main, &big);
    wait_for_waiters(c, "sem-fifo", 1);
    /* Not freed under a waiting acquisition (review finding 5). */
    assert_int_equal(cerb_semaphore_free(s), CERB_BUSY);
    pthread_create(&ts, NULL, take_main, &small);
    wait_for_waiters(c, "sem-fifo", 2);
    assert_int_equal(atomic_load(&small.done), 0);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    pthread_join(tb, NULL);
    assert_int_equal(big.st, CERB_OK);
    assert_int_equal(atomic_load(&small.done), 0);
    assert_int_equal(cerb_permit_free(big.p), CERB_OK);
    pthread_join(ts, NULL);
    assert_int_equal(small.st, CERB_OK);
    assert_int_equal(cerb_permit_free(small.p), CERB_OK);
    cerb_semaphore_free(s);
    cerb_client_close(c);
}

static void test_cancel_and_bad_input(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_semaphore *s = NULL;
    assert_int_equal(cerb_semaphore_new(c, "sem-bad", 0, NULL, &s), CERB_EINVAL);
    assert_int_equal(cerb_semaphore_new(c, "sem-bad", CERB_SEMAPHORE_MAX + 1, NULL, &s),
                     CERB_EINVAL);
    assert_int_equal(cerb_semaphore_new(c, "", 1, NULL, &s), CERB_EINVAL);
    s = sem(c, "sem-bad", 1);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 2, 0, NULL, &p), CERB_EINVAL);
    assert_int_equal(cerb_semaphore_acquire(s, 0, 0, NULL, &p), CERB_EINVAL);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    cerb_cancel *k = NULL;
    assert_int_equal(cerb_cancel_new(&k), CERB_OK);
    cerb_cancel_fire(k);
    assert_int_equal(cerb_semaphore_acquire(s, 1, -1, k, &q), CERB_INTERRUPTED);
    cerb_cancel_free(k);
    assert_int_equal(cerb_permit_release(NULL), CERB_EINVAL);
    assert_int_equal(cerb_permit_release((cerb_permit *)(void *)s), CERB_EINVAL);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_inspect(c, 1, "sem-bad", NULL, &(cerb_holder_info *){NULL},
                                  &(size_t){0}),
                     CERB_EINVAL);
    cerb_semaphore_free(s);
    cerb_client_close(c);
}

static void on_permit_lost(cerb_permit *p, void *ud)
{
    (void)p;
    atomic_fetch_add((atomic_int *)ud, 1);
}

static bool flag_set(void *ud)
{
    return atomic_load((atomic_int *)ud) > 0;
}

/* A permit whose lease ran out while the machine slept is lost and told
 * once; another caller gets it; its release says CERB_LOST. */
static void test_lost_permit_told(void **state)
{
    (void)state;
    cerb_client *c = open_local(), *c2 = open_local();
    cerb_semaphore_opts o = CERB_SEMAPHORE_OPTS_INIT;
    o.lease_ms = 3000;
    cerb_semaphore *s = NULL, *s2 = sem(c2, "sem-lost", 1);
    assert_int_equal(cerb_semaphore_new(c, "sem-lost", 1, &o, &s), CERB_OK);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    atomic_int n = 0;
    assert_int_equal(cerb_permit_on_lost(p, on_permit_lost, &n), CERB_OK);
    cerb__clock_test_suspend(5000);
    assert_int_equal(cerb_permit_state(p), CERB_LOCK_LOST);
    assert_true(wait_until(flag_set, &n, 2000));
    assert_int_equal(cerb_semaphore_acquire(s2, 1, 2000, NULL, &q), CERB_OK);
    assert_int_equal(cerb_permit_release(p), CERB_LOST);
    assert_int_equal(atomic_load(&n), 1);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    cerb_semaphore_free(s);
    cerb_semaphore_free(s2);
    cerb_client_close(c);
    cerb_client_close(c2);
}

struct holds {
    cerb_hold *h[6];
    cerb_permit *p;
};

static bool released_once(void *ud)
{
    return fault_engine_calls(FAULT_RELEASE) > *(long *)ud;
}

static bool permit_lost(void *ud)
{
    return cerb_permit_state(ud) == CERB_LOCK_LOST;
}

static bool any_lost(void *ud)
{
    struct holds *hs = ud;
    for (int i = 0; i < 6; i++)
        if (cerb_hold_state(hs->h[i]) == CERB_LOCK_LOST)
            return true;
    return cerb_permit_state(hs->p) == CERB_LOCK_LOST;
}

/* On an engine that renews in batches, a permit among the holds due keeps
 * the locks' batch (review finding 1): with every round trip 200 ms and a
 * lease of 1 s, one call per hold (seven: 1.4 s) lost them all; the batch,
 * then the permit, take two. */
static void test_permit_keeps_renewals_batched(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"faultbatch\");\n"
                                                 "lock = { lease_ms = 1000; };\n"),
                     CERB_OK);
    struct holds hs;
    for (int i = 0; i < 6; i++) {
        char name[32];
        snprintf(name, sizeof name, "batch-%d", i);
        cerb_lock *l = NULL;
        assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
        assert_int_equal(cerb_lock_acquire(l, 0, NULL, &hs.h[i]), CERB_OK);
        cerb_lock_free(l);
    }
    cerb_semaphore *s = sem(c, "batch-sem", 2);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &hs.p), CERB_OK);
    fault_engine_delay(FAULT_RENEW, 200, false);
    /* Two and a half leases: nothing may be lost. */
    assert_false(wait_until(any_lost, &hs, 2500));
    assert_true(fault_engine_batch_calls() >= 2);
    fault_engine_reset();
    for (int i = 0; i < 6; i++)
        assert_int_equal(cerb_hold_free(hs.h[i]), CERB_OK);
    assert_int_equal(cerb_permit_free(hs.p), CERB_OK);
    cerb_semaphore_free(s);
    cerb_client_close(c);
}

/* A batch in which one lock's renewal fails (its node down) while the
 * others are answered still lets the permits after it be renewed (review
 * round 2, finding 1: they went unsent, and were lost). */
static void test_partial_batch_failure_keeps_permits(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"faultbatch\");\n"
                                                 "lock = { lease_ms = 1000; };\n"),
                     CERB_OK);
    struct holds hs;
    for (int i = 0; i < 6; i++) {
        char name[32];
        snprintf(name, sizeof name, "pbatch-%d", i);
        cerb_lock *l = NULL;
        assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
        assert_int_equal(cerb_lock_acquire(l, 0, NULL, &hs.h[i]), CERB_OK);
        cerb_lock_free(l);
    }
    cerb_semaphore *s = sem(c, "pbatch-sem", 2);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &hs.p), CERB_OK);
    fault_engine_batch_fail("pbatch-0");
    /* Each batch a slow round trip, so that the failing lock's retries and
     * the permit's renewals fall due together, into the same chunks. */
    fault_engine_delay(FAULT_RENEW, 300, false);
    /* Two and a half leases: the permit is renewed all along. */
    assert_false(wait_until(permit_lost, hs.p, 2500));
    fault_engine_reset();
    for (int i = 0; i < 6; i++)
        cerb_hold_free(hs.h[i]);
    assert_int_equal(cerb_permit_free(hs.p), CERB_OK);
    cerb_semaphore_free(s);
    cerb_client_close(c);
}

/* An acquire whose reply was lost, which check_owner then finds not
 * granted, may have left a waiting member on a server: the core releases
 * its token in the background (review finding 6) and tries again with a
 * fresh one. */
static void test_unknown_refusal_is_released(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"fault\");\n"), CERB_OK);
    cerb_semaphore *s = sem(c, "sem-unknown", 1);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    long rel0 = fault_engine_calls(FAULT_RELEASE);
    fault_engine_set(FAULT_ACQUIRE, 1, false, FAULT_LOST_REPLY);
    cerb_status st = cerb_semaphore_acquire(s, 1, 0, NULL, &q);
    assert_true(st == CERB_EIO || st == CERB_BUSY);
    assert_null(q);
    /* The background release of the first token (it may answer NOT_OWNER). */
    assert_true(wait_until(released_once, &rel0, 3000));
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    fault_engine_reset();
    cerb_semaphore_free(s);
    cerb_client_close(c);
}

static void test_file_mode_has_none(void **state)
{
    (void)state;
    char dir[] = "/tmp/cerb-sem-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cfg[256];
    snprintf(cfg, sizeof cfg, "engines = (\"local\");\nlocal = { dir = \"%s\"; };\n", dir);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    cerb_semaphore *s = sem(c, "sem-file", 2);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 1000, NULL, &p), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "semaphores"));
    cerb_semaphore_free(s);
    cerb_client_close(c);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_holds),
        cmocka_unit_test(test_stored_limit_refuses_another),
        cmocka_unit_test(test_first_come_first_served),
        cmocka_unit_test(test_cancel_and_bad_input),
        cmocka_unit_test(test_lost_permit_told),
        cmocka_unit_test(test_permit_keeps_renewals_batched),
        cmocka_unit_test(test_partial_batch_failure_keeps_permits),
        cmocka_unit_test(test_unknown_refusal_is_released),
        cmocka_unit_test(test_file_mode_has_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
