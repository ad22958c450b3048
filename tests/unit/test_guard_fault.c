/*
 * test_guard_fault.c — the guard's ambiguity and failure paths, on the
 * "gfault" engine (the local engine with injected guard failures): a begin
 * or finish whose reply was lost after it took effect is settled on the
 * server before anything is retried or reported; one that failed before
 * leaving is sent again; an engine that keeps failing gives CERB_UNAVAILABLE
 * (refuse) or a degraded OK (allow) and feeds the breaker; a claim whose
 * renewals fail runs out, another attempt takes over, and the first
 * attempt's finish is CERB_LOST.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "guard_fault_engine.h"
#include "test_util.h"

static cerb_client *open_gfault(void)
{
    guard_fault_register();
    guard_fault_reset();
    cerb_client *c = cerb_test_open("engines = (\"gfault\"); guard = { keep_ms = 5000; };");
    assert_non_null(c);
    return c;
}

static cerb_status begin(cerb_client *c, const char *key, const cerb_guard_opts *o,
                         cerb_guard **g)
{
    return cerb_guard_begin(c, "fault", key, strlen(key), o, g);
}

static void test_begin_reply_lost(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("begin-lost");
    cerb_guard *g = NULL, *h = NULL;
    guard_fault_set(GFAULT_BEGIN, 1, false, GFAULT_AFTER); /* claimed, answer lost */
    assert_int_equal(begin(c, key, NULL, &g), CERB_OK);      /* the resend finds our claim */
    assert_int_equal(guard_fault_calls(GFAULT_BEGIN), 2);
    assert_int_equal(begin(c, key, NULL, &h), CERB_BUSY);    /* one claim, ours */
    assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(begin(c, key, NULL, &h), CERB_DUPLICATE);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

/* cerb_guard_begin_ex: a cancel fired while the begin is on its way ends
 * it with CERB_INTERRUPTED and gives up the claim it took (a retry begins
 * at once, not BUSY); fired before, the call does not reach the store. */
static void fire(void *ud) { cerb_cancel_fire(ud); }

static void test_begin_cancelled(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("begin-cancel");
    cerb_cancel *k = NULL;
    cerb_guard *g = NULL;
    assert_int_equal(cerb_cancel_new(&k), CERB_OK);
    /* Not fired: a plain begin. */
    assert_int_equal(cerb_guard_begin_ex(c, "fault", key, strlen(key), NULL, k, &g), CERB_OK);
    assert_string_equal(cerb_cancel_error(k), "");
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    /* Fired midway: the claim it took is given up. */
    guard_fault_on_begin(fire, k);
    assert_int_equal(cerb_guard_begin_ex(c, "fault", key, strlen(key), NULL, k, &g),
                     CERB_INTERRUPTED);
    guard_fault_on_begin(NULL, NULL);
    assert_null(g);
    assert_non_null(strstr(cerb_cancel_error(k), "claim taken meanwhile was given up"));
    assert_int_equal(begin(c, key, NULL, &g), CERB_OK);
    /* A success's duplicate answer is dropped the same way. */
    assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
    cerb_guard_free(g);
    cerb_cancel_free(k);
    assert_int_equal(cerb_cancel_new(&k), CERB_OK);
    guard_fault_on_begin(fire, k);
    assert_int_equal(cerb_guard_begin_ex(c, "fault", key, strlen(key), NULL, k, &g),
                     CERB_INTERRUPTED);
    guard_fault_on_begin(NULL, NULL);
    assert_non_null(strstr(cerb_cancel_error(k), "duplicate"));
    /* Fired before: the store is not asked. */
    long calls = guard_fault_calls(GFAULT_BEGIN);
    assert_int_equal(cerb_guard_begin_ex(c, "fault", key, strlen(key), NULL, k, &g),
                     CERB_INTERRUPTED);
    assert_int_equal(guard_fault_calls(GFAULT_BEGIN), calls);
    assert_int_equal(cerb_guard_begin_ex(c, "fault", key, strlen(key), NULL, NULL, NULL),
                     CERB_EINVAL);
    cerb_cancel_free(k);
    free(key);
    cerb_client_close(c);
}

static void test_finish_success_reply_lost(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("fin-lost");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(begin(c, key, NULL, &g), CERB_OK);
    guard_fault_set(GFAULT_FINISH, 1, false, GFAULT_AFTER);
    assert_int_equal(cerb_guard_finish(g, 1, "done", 4), CERB_OK); /* settled by check */
    assert_int_equal(guard_fault_calls(GFAULT_FINISH), 1);          /* not sent twice */
    assert_int_equal(guard_fault_calls(GFAULT_CHECK), 1);
    cerb_guard_free(g);
    assert_int_equal(begin(c, key, NULL, &h), CERB_DUPLICATE);
    size_t n;
    assert_memory_equal(cerb_guard_result(h, &n), "done", 4);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

static void test_finish_failure_reply_lost(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("del-lost");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(begin(c, key, NULL, &g), CERB_OK);
    guard_fault_set(GFAULT_FINISH, 1, false, GFAULT_AFTER);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK); /* deleted: the goal */
    cerb_guard_free(g);
    assert_int_equal(begin(c, key, NULL, &h), CERB_OK); /* a retry runs at once */
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

static void test_finish_not_sent_is_resent(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("fin-before");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(begin(c, key, NULL, &g), CERB_OK);
    guard_fault_set(GFAULT_FINISH, 1, false, GFAULT_BEFORE);
    assert_int_equal(cerb_guard_finish(g, 1, "x", 1), CERB_OK);
    assert_int_equal(guard_fault_calls(GFAULT_FINISH), 2);
    assert_int_equal(guard_fault_calls(GFAULT_CHECK), 0); /* nothing to settle */
    cerb_guard_free(g);
    assert_int_equal(begin(c, key, NULL, &h), CERB_DUPLICATE);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

/* A success the engine never confirmed is an error, not LOST, and the
 * attempt stays open, its claim renewed: once the engine answers, finishing
 * again records it, so a redelivery is a duplicate. (Before: the second
 * finish was EINVAL "already finished", the claim ran out after running_ms
 * and a retry ran the operation again.) */
static void test_finish_unconfirmed(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("fin-down");
    cerb_guard *g = NULL, *h = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 300;
    assert_int_equal(begin(c, key, &o, &g), CERB_OK);
    guard_fault_set(GFAULT_FINISH, 1, true, GFAULT_BEFORE);
    assert_int_equal(cerb_guard_finish(g, 1, "x", 1), CERB_EIO);
    assert_non_null(strstr(cerb_last_error(), "still open"));
    /* Longer than running_ms: the claim is renewed meanwhile. */
    struct timespec ts = {0, 600 * 1000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(begin(c, key, NULL, &h), CERB_BUSY);
    guard_fault_reset();
    assert_int_equal(cerb_guard_finish(g, 1, "x", 1), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "x", 1), CERB_EINVAL); /* finished now */
    cerb_guard_free(g);
    assert_int_equal(begin(c, key, NULL, &h), CERB_DUPLICATE);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

/* A success that landed with its answer lost, finished again: the second
 * finish finds its own done-record and answers OK (not LOST). */
static void test_finish_again_after_landed(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    char *key = test_name("fin-landed");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(begin(c, key, NULL, &g), CERB_OK);
    /* Applied, then an I/O error; the settling check fails too. */
    guard_fault_set(GFAULT_FINISH, 1, false, GFAULT_AFTER);
    guard_fault_set(GFAULT_CHECK, 1, true, GFAULT_BEFORE);
    assert_int_not_equal(cerb_guard_finish(g, 1, "y", 1), CERB_OK);
    guard_fault_reset();
    assert_int_equal(cerb_guard_finish(g, 1, "y", 1), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(begin(c, key, NULL, &h), CERB_DUPLICATE);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

static void test_engine_down_policy(void **state)
{
    (void)state;
    cerb_client *c = open_gfault();
    cerb_guard *g = (cerb_guard *)1;
    guard_fault_set(GFAULT_BEGIN, 1, true, GFAULT_BEFORE);
    assert_int_equal(begin(c, "k", NULL, &g), CERB_UNAVAILABLE);
    assert_null(g);
    assert_non_null(strstr(cerb_last_error(), "cannot answer"));
    assert_int_equal(guard_fault_calls(GFAULT_BEGIN), 2); /* tried, and once more */
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.on_unavailable = CERB_GUARD_ALLOW;
    assert_int_equal(begin(c, "k", &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_degraded(g), 1);
    long fin = guard_fault_calls(GFAULT_FINISH);
    assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
    assert_int_equal(guard_fault_calls(GFAULT_FINISH), fin); /* no server touched */
    cerb_guard_free(g);
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "gfault", &info), CERB_OK);
    assert_true(info.failures >= 4); /* each failed begin told the breaker */
    cerb_client_close(c);
}

static bool renewed(void *ud)
{
    (void)ud;
    return guard_fault_calls(GFAULT_RENEW) >= 2;
}

static void test_renewal_failures_lose_the_claim(void **state)
{
    (void)state;
    cerb_client *a = open_gfault();
    cerb_client *b = cerb_test_open("engines = (\"gfault\");");
    char *key = test_name("renew");
    cerb_guard *g = NULL, *h = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 300;
    assert_int_equal(begin(a, key, &o, &g), CERB_OK);
    /* Renewed while open: still BUSY well past running_ms. */
    assert_wait_until(renewed, NULL, 2000);
    assert_int_equal(begin(b, key, NULL, &h), CERB_BUSY);
    /* Renewals now fail: the claim runs out and another attempt begins. */
    guard_fault_set(GFAULT_RENEW, 1, true, GFAULT_BEFORE);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st;
    while ((st = begin(b, key, NULL, &h)) == CERB_BUSY && cerb_test_now_ms() < t0 + 3000) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "late", 4), CERB_LOST);
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    cerb_guard_free(h);
    assert_int_equal(begin(a, key, NULL, &g), CERB_DUPLICATE);
    size_t n;
    assert_memory_equal(cerb_guard_result(g, &n), "new", 3);
    cerb_guard_free(g);
    guard_fault_reset();
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

struct told {
    atomic_int calls;
    atomic_int state_in_cb; /* cerb_guard_state() seen by the callback */
    atomic_int warned;      /* WARN lines about a passed deadline */
};

static void on_lost(cerb_guard *g, void *ud)
{
    struct told *t = ud;
    atomic_store(&t->state_in_cb, (int)cerb_guard_state(g));
    atomic_fetch_add(&t->calls, 1);
}

static void log_sink(cerb_log_level level, const char *line, void *ud)
{
    struct told *t = ud;
    if (level == CERB_LOG_WARN && strstr(line, "passed its deadline unrenewed"))
        atomic_fetch_add(&t->warned, 1);
}

static bool suspect(void *ud) { return cerb_guard_state(ud) == CERB_LOCK_SUSPECT; }

/* A running attempt hears that its claim is lost (issue 22, finding 3):
 * VALID while renewed, SUSPECT once a renewal failed, LOST at its
 * conservative deadline — before any other attempt can begin — with the
 * callback called once and a WARN line; LOST stays. Before, the renewer
 * wrote a flag nobody read: the attempt learnt it only from its finish. */
static bool called_once(void *ud) { return atomic_load(&((struct told *)ud)->calls) == 1; }

static void test_lost_claim_is_told(void **state)
{
    (void)state;
    struct told t = {0};
    assert_int_equal(cerb_log_set(log_sink, &t, CERB_LOG_WARN), CERB_OK);
    cerb_client *a = open_gfault();
    cerb_client *b = cerb_test_open("engines = (\"gfault\");");
    char *key = test_name("told");
    cerb_guard *g = NULL, *h = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 300;
    assert_int_equal(cerb_guard_state(NULL), CERB_LOCK_FREE);
    assert_int_equal(cerb_guard_on_lost(NULL, on_lost, &t), CERB_EINVAL);
    assert_int_equal(begin(a, key, &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_on_lost(g, on_lost, &t), CERB_OK);
    assert_wait_until(renewed, NULL, 2000);
    assert_int_equal(cerb_guard_state(g), CERB_LOCK_VALID);
    guard_fault_set(GFAULT_RENEW, 1, true, GFAULT_BEFORE);
    assert_wait_until(suspect, g, 2000);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st;
    while ((st = begin(b, key, NULL, &h)) == CERB_BUSY && cerb_test_now_ms() < t0 + 3000)
        cerb_test_let_time_pass(5);
    assert_int_equal(st, CERB_OK);
    /* Told before the other attempt could begin. */
    assert_int_equal(cerb_guard_state(g), CERB_LOCK_LOST);
    assert_wait_until(called_once, &t, 2000);
    assert_int_equal(atomic_load(&t.state_in_cb), CERB_LOCK_LOST);
    assert_true(atomic_load(&t.warned) >= 1);
    /* The renewals answer again: LOST stays, and the callback is not
     * called twice. */
    guard_fault_reset();
    cerb_test_let_time_pass(300);
    assert_int_equal(cerb_guard_state(g), CERB_LOCK_LOST);
    assert_int_equal(atomic_load(&t.calls), 1);
    assert_int_equal(cerb_guard_finish(g, 1, "late", 4), CERB_LOST);
    assert_int_equal(cerb_guard_state(g), CERB_LOCK_FREE); /* finished */
    assert_int_equal(cerb_guard_state(h), CERB_LOCK_VALID);
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    assert_int_equal(cerb_guard_state(h), CERB_LOCK_FREE);
    cerb_guard_free(g);
    cerb_guard_free(h);
    assert_int_equal(begin(a, key, NULL, &g), CERB_DUPLICATE);
    assert_int_equal(cerb_guard_state(g), CERB_LOCK_FREE); /* a duplicate's answer */
    cerb_guard_free(g);
    cerb_log_set(NULL, NULL, CERB_LOG_INFO);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

struct begin_try {
    cerb_client *c;
    const char *key;
    cerb_guard *g;
};

static bool begins(void *ud)
{
    struct begin_try *t = ud;
    return begin(t->c, t->key, NULL, &t->g) == CERB_OK;
}

/* A failed attempt's delete that could not be sent is retried in the
 * background, also when it is queued while the engine waits out the back-off
 * after an unanswered renewal (found by review: the renewer then slept with
 * no timeout, no renewing claim left, so the delete was never sent and a
 * retry stayed BUSY for the whole running_ms: 3990 ms measured). */
static void test_delete_during_back_off_is_sent(void **state)
{
    (void)state;
    cerb_client *a = open_gfault();
    cerb_client *b = cerb_test_open("engines = (\"gfault\");");
    char *key = test_name("backoff");
    cerb_guard *g = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 6000;
    assert_int_equal(begin(a, key, &o, &g), CERB_OK);
    guard_fault_set(GFAULT_RENEW, 1, false, GFAULT_BEFORE); /* one unanswered renewal */
    assert_wait_until(suspect, g, 5000);
    guard_fault_set(GFAULT_FINISH, 1, true, GFAULT_BEFORE);
    assert_int_not_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK); /* to the background */
    guard_fault_reset();
    struct begin_try t = {b, key, NULL};
    assert_wait_until(begins, &t, 1500);
    cerb_guard_free(t.g);
    cerb_guard_free(g);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* An unanswered renewal makes the engine's other claims wait out a short
 * back-off, but never past what a short claim can afford (found by review:
 * a 200 ms claim beside a 3 s one whose renewal failed waited 250 ms and
 * lapsed, in 3 runs of 3). */
static void test_failed_renewal_spares_short_claims(void **state)
{
    (void)state;
    cerb_client *a = open_gfault();
    char *ka = test_name("long"), *kb = test_name("short");
    cerb_guard *ga = NULL, *gb = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 3000;
    assert_int_equal(begin(a, ka, &o, &ga), CERB_OK);
    cerb_test_let_time_pass(950); /* its first renewal is due at 1000 ms */
    o.running_ms = 200;
    assert_int_equal(begin(a, kb, &o, &gb), CERB_OK);
    guard_fault_set(GFAULT_RENEW, 1, false, GFAULT_BEFORE); /* the long claim's renewal */
    int64_t end = cerb_test_now_ms() + 1000;
    while (cerb_test_now_ms() < end) {
        if (cerb_guard_state(gb) == CERB_LOCK_LOST)
            fail_msg("the 200 ms claim lapsed after the other claim's renewal failed");
        cerb_test_let_time_pass(10);
    }
    assert_true(guard_fault_calls(GFAULT_RENEW) >= 3);
    assert_int_equal(cerb_guard_finish(gb, 1, "b", 1), CERB_OK);
    assert_int_equal(cerb_guard_finish(ga, 1, "a", 1), CERB_OK);
    cerb_guard_free(ga);
    cerb_guard_free(gb);
    guard_fault_reset();
    free(ka);
    free(kb);
    cerb_client_close(a);
}

/* After a suspend the deadline thread looks at the time again within a
 * second (§5a.2): its wait is on the monotonic clock, which stops while the
 * machine sleeps, and it used to sleep until the claim's deadline, so an
 * attempt whose engine stopped answering was told LOST up to running_ms
 * late. Last in the suite: the simulated suspend moves the clock for good. */
static void test_lost_told_soon_after_suspend(void **state)
{
    (void)state;
    struct told t = {0};
    cerb_client *a = open_gfault();
    char *key = test_name("suspend");
    cerb_guard *g = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 20000;
    assert_int_equal(begin(a, key, &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_on_lost(g, on_lost, &t), CERB_OK);
    guard_fault_set(GFAULT_RENEW, 1, true, GFAULT_BEFORE); /* silent: no "not owner" */
    cerb_test_let_time_pass(300); /* the threads asleep until the deadline */
    cerb__clock_test_suspend(30000);
    assert_int_equal(cerb_guard_state(g), CERB_LOCK_LOST);
    assert_wait_until(called_once, &t, 1500);
    guard_fault_reset();
    cerb_guard_free(g);
    free(key);
    cerb_client_close(a);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_begin_reply_lost),
        cmocka_unit_test(test_begin_cancelled),
        cmocka_unit_test(test_finish_success_reply_lost),
        cmocka_unit_test(test_finish_failure_reply_lost),
        cmocka_unit_test(test_finish_not_sent_is_resent),
        cmocka_unit_test(test_finish_unconfirmed),
        cmocka_unit_test(test_finish_again_after_landed),
        cmocka_unit_test(test_engine_down_policy),
        cmocka_unit_test(test_renewal_failures_lose_the_claim),
        cmocka_unit_test(test_lost_claim_is_told),
        cmocka_unit_test(test_delete_during_back_off_is_sent),
        cmocka_unit_test(test_failed_renewal_spares_short_claims),
        /* last: the simulated suspend moves the clock for good */
        cmocka_unit_test(test_lost_told_soon_after_suspend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
