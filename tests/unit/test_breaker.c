/*
 * test_breaker.c — the circuit breaker (failover/breaker.c) with a fake
 * clock: a plain int64 of milliseconds the test advances, never a sleep.
 *
 * Covers every transition of DESIGN.md §5 with its reason and bookkeeping,
 * both trips (a run of failures; a failure rate that needs min_calls), the
 * open period (doubling, cap, bounded and seed-deterministic jitter), the
 * half-open phase (only probes decide; N good ones close, one bad one
 * re-opens), the window discarded on close, the forced states, the defaults
 * taken from the config, a random walk checked against the allowed edges,
 * and a primary that flaps every 2 s for 30 s.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "breaker.h"
#include "config.h"

#define SEED 0x5eedULL

/* The design defaults, without jitter, so periods are exact. */
static struct cerb_breaker_cfg base_cfg(void)
{
    struct cerb_breaker_cfg c = {
        .consecutive_failures = 3,
        .failure_rate = 50,
        .window_ms = 10000,
        .min_calls = 10,
        .open_ms = 5000,
        .open_max_ms = 60000,
        .half_open_successes = 3,
        .jitter_percent = 0,
    };
    return c;
}

/* Rate trip only: the run of failures is switched off. */
static struct cerb_breaker_cfg rate_cfg(void)
{
    struct cerb_breaker_cfg c = base_cfg();
    c.consecutive_failures = 0;
    return c;
}

static void fail_n(struct cerb_breaker *b, int64_t now, int n, enum cerb_breaker_kind k)
{
    for (int i = 0; i < n; i++)
        assert_false(cerb__breaker_on_failure(b, now, k));
}

static void succeed_n(struct cerb_breaker *b, int64_t now, int n, enum cerb_breaker_kind k)
{
    for (int i = 0; i < n; i++)
        assert_false(cerb__breaker_on_success(b, now, k));
}

static void assert_transition(const struct cerb_breaker *b, enum cerb_breaker_state from,
                              enum cerb_breaker_state to, const char *reason, int64_t at)
{
    assert_int_equal(b->from, from);
    assert_int_equal(b->to, to);
    assert_string_equal(b->reason, reason);
    assert_int_equal(b->changed_ms, at);
    assert_int_equal(cerb__breaker_state(b), to);
}

/* Trip with three failures at `now`; returns the open period. */
static int64_t trip(struct cerb_breaker *b, int64_t now)
{
    assert_false(cerb__breaker_on_failure(b, now, CERB_CALL));
    assert_false(cerb__breaker_on_failure(b, now, CERB_CALL));
    assert_true(cerb__breaker_on_failure(b, now, CERB_CALL));
    assert_int_equal(cerb__breaker_state(b), CERB_BREAKER_OPEN);
    return b->open_until_ms - now;
}

/* From OPEN, wait out the period and close with good probes; returns the
 * time of the close. */
static int64_t wait_and_close(struct cerb_breaker *b)
{
    int64_t t = cerb__breaker_due_ms(b);
    assert_true(cerb__breaker_poll(b, t));
    for (int i = 1; i < b->cfg.half_open_successes; i++)
        assert_false(cerb__breaker_on_success(b, t, CERB_PROBE));
    assert_true(cerb__breaker_on_success(b, t, CERB_PROBE));
    assert_int_equal(cerb__breaker_state(b), CERB_BREAKER_CLOSED);
    return t;
}

/* ------------------------------------------------------------ basics */

static void test_init_closed_allows(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 1000);
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    assert_true(cerb__breaker_allow(&b, 1000));
    assert_int_equal(b.transitions, 0);
    assert_int_equal(b.opens, 0);
    assert_int_equal(b.changed_ms, 1000);
    assert_int_equal(cerb__breaker_due_ms(&b), INT64_MAX);
    assert_false(cerb__breaker_poll(&b, INT64_C(1) << 50));
    assert_true(cerb__breaker_allow(&b, INT64_C(1) << 50));
}

static void test_state_names(void **state)
{
    (void)state;
    assert_string_equal(cerb__breaker_state_name(CERB_BREAKER_CLOSED), "closed");
    assert_string_equal(cerb__breaker_state_name(CERB_BREAKER_OPEN), "open");
    assert_string_equal(cerb__breaker_state_name(CERB_BREAKER_HALF_OPEN), "half_open");
    assert_string_equal(cerb__breaker_state_name(CERB_BREAKER_DISABLED), "disabled");
    assert_string_equal(cerb__breaker_state_name(CERB_BREAKER_FORCED_OPEN), "forced_open");
    assert_string_equal(cerb__breaker_state_name((enum cerb_breaker_state)42), "unknown");
}

/* Out-of-range settings are fixed at init rather than misbehaving. */
static void test_cfg_fixups(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = {
        .consecutive_failures = 3, .failure_rate = 50, .window_ms = 0,
        .min_calls = -4, .open_ms = 0, .open_max_ms = -1,
        .half_open_successes = 0, .jitter_percent = 150,
    };
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_int_equal(b.cfg.window_ms, 1);
    assert_int_equal(b.cfg.min_calls, 1);
    assert_int_equal(b.cfg.open_ms, 1);
    assert_int_equal(b.cfg.open_max_ms, 1);
    assert_int_equal(b.cfg.half_open_successes, 1);
    assert_int_equal(b.cfg.jitter_percent, 100);
    c.jitter_percent = -5;
    c.open_ms = 7000;
    c.open_max_ms = 6000; /* below open_ms: raised to it (no doubling) */
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_int_equal(b.cfg.jitter_percent, 0);
    assert_int_equal(b.cfg.open_max_ms, 7000);
    /* With 100 % jitter every period is still >= 1 ms and <= the cap. */
    c = base_cfg();
    c.jitter_percent = 100;
    c.open_ms = 10;
    c.open_max_ms = 10;
    for (uint64_t seed = 0; seed < 200; seed++) {
        cerb__breaker_init(&b, &c, seed, 0);
        int64_t p = trip(&b, 0);
        assert_in_range(p, 1, 10);
    }
}

/* ------------------------------------------------------- CLOSED → OPEN */

static void test_consecutive_failures_trip(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_false(cerb__breaker_on_failure(&b, 100, CERB_CALL));
    assert_false(cerb__breaker_on_failure(&b, 200, CERB_CALL));
    assert_true(cerb__breaker_allow(&b, 250));
    assert_int_equal(b.transitions, 0);
    assert_true(cerb__breaker_on_failure(&b, 300, CERB_CALL));
    assert_transition(&b, CERB_BREAKER_CLOSED, CERB_BREAKER_OPEN, "3 consecutive failures", 300);
    assert_int_equal(b.transitions, 1);
    assert_int_equal(b.opens, 1);
    assert_false(cerb__breaker_allow(&b, 300));
    assert_int_equal(cerb__breaker_due_ms(&b), 300 + 5000);
}

/* The prober alone detects an idle engine's failure: probes count in CLOSED. */
static void test_probe_failures_trip_closed(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    fail_n(&b, 0, 2, CERB_PROBE);
    assert_true(cerb__breaker_on_failure(&b, 250, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_CLOSED, CERB_BREAKER_OPEN, "3 consecutive failures", 250);
}

static void test_success_resets_consecutive(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    c.min_calls = 1000; /* keep the rate out of it */
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    for (int round = 0; round < 50; round++) {
        fail_n(&b, round, 2, CERB_CALL);
        succeed_n(&b, round, 1, round % 2 ? CERB_CALL : CERB_PROBE);
    }
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    assert_int_equal(b.failures_in_row, 0);
    fail_n(&b, 60, 2, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&b, 60, CERB_CALL));
    assert_string_equal(b.reason, "3 consecutive failures");
}

static void test_singular_reasons(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    c.consecutive_failures = 1;
    c.half_open_successes = 1;
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_true(cerb__breaker_on_failure(&b, 0, CERB_CALL));
    assert_string_equal(b.reason, "1 consecutive failure");
    assert_true(cerb__breaker_poll(&b, 5000));
    assert_true(cerb__breaker_on_success(&b, 5000, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_HALF_OPEN, CERB_BREAKER_CLOSED, "1 good probe", 5000);
}

/* 9 calls, all failed, do not trip with min_calls = 10; the 10th does. */
static void test_rate_trip_needs_min_calls(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = rate_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    for (int i = 0; i < 9; i++)
        assert_false(cerb__breaker_on_failure(&b, i * 100, CERB_CALL));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    assert_true(cerb__breaker_allow(&b, 900));
    assert_true(cerb__breaker_on_failure(&b, 900, CERB_CALL));
    assert_transition(&b, CERB_BREAKER_CLOSED, CERB_BREAKER_OPEN,
                      "failure rate 100% over 10 calls", 900);
    assert_int_equal(b.opens, 1);
}

/* The rate trips at >= failure_rate, not below: 51 successes then failures;
 * 50/101 (49.5 %) stays closed, 51/102 (50 %) trips. */
static void test_rate_threshold(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = rate_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    succeed_n(&b, 10, 51, CERB_CALL);
    fail_n(&b, 20, 50, CERB_CALL);
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    assert_true(cerb__breaker_on_failure(&b, 30, CERB_CALL));
    assert_string_equal(b.reason, "failure rate 50% over 102 calls");
    /* Both trips at once: S F F three times keeps the run below 3 and the
     * calls below min_calls; the next failure is the 3rd in a row and 7/10,
     * and the run is checked first. */
    c = base_cfg();
    cerb__breaker_init(&b, &c, SEED, 0);
    for (int i = 0; i < 3; i++) {
        succeed_n(&b, 0, 1, CERB_CALL);
        fail_n(&b, 0, 2, CERB_CALL);
    }
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    assert_true(cerb__breaker_on_failure(&b, 0, CERB_CALL));
    assert_string_equal(b.reason, "3 consecutive failures");
    /* S F five times: never two in a row, and the 10th call makes 5/10. */
    cerb__breaker_init(&b, &c, SEED, 0);
    for (int i = 0; i < 4; i++) {
        succeed_n(&b, 0, 1, CERB_CALL);
        fail_n(&b, 0, 1, CERB_CALL);
    }
    succeed_n(&b, 0, 1, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&b, 0, CERB_CALL));
    assert_string_equal(b.reason, "failure rate 50% over 10 calls");
}

/* Failures older than window_ms no longer count toward the rate: 8 failures
 * at t=0, then 6 successes and 4 failures later. Inside the window the first
 * of those failures makes 9/15 and trips; after it, 4/10 does not. */
/* A batch of n call successes acts as n single ones: the same rate trip
 * point afterwards, the run of failures reset, nothing counted while OPEN,
 * and a batch never closes a HALF_OPEN breaker (only probes do). */
static void test_batched_call_successes(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = rate_cfg();
    struct cerb_breaker one, many;
    cerb__breaker_init(&one, &c, SEED, 0);
    cerb__breaker_init(&many, &c, SEED, 0);
    succeed_n(&one, 100, 40, CERB_CALL);
    assert_false(cerb__breaker_on_call_successes(&many, 100, 40));
    assert_false(cerb__breaker_on_call_successes(&many, 100, 0));
    /* 40 good + 39 failures: 49 %, still closed; the 40th trips both. */
    fail_n(&one, 200, 39, CERB_CALL);
    fail_n(&many, 200, 39, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&one, 200, CERB_CALL));
    assert_true(cerb__breaker_on_failure(&many, 200, CERB_CALL));
    assert_int_equal(cerb__breaker_state(&many), CERB_BREAKER_OPEN);

    /* While OPEN a batch is not counted; at the due time it reports the
     * move to HALF_OPEN, and later batches leave HALF_OPEN alone. */
    int64_t due = cerb__breaker_due_ms(&many);
    assert_false(cerb__breaker_on_call_successes(&many, due - 1, 1000));
    assert_true(cerb__breaker_on_call_successes(&many, due, 1000));
    assert_int_equal(cerb__breaker_state(&many), CERB_BREAKER_HALF_OPEN);
    assert_false(cerb__breaker_on_call_successes(&many, due + 1, 1000000));
    assert_int_equal(cerb__breaker_state(&many), CERB_BREAKER_HALF_OPEN);

    /* The run of failures: 2 failures, a batch, 2 more → no trip at 3. */
    struct cerb_breaker run;
    struct cerb_breaker_cfg rc = base_cfg();
    rc.failure_rate = 0;
    cerb__breaker_init(&run, &rc, SEED, 0);
    fail_n(&run, 10, 2, CERB_CALL);
    assert_false(cerb__breaker_on_call_successes(&run, 10, 5));
    fail_n(&run, 10, 2, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&run, 10, CERB_CALL));
}

static void test_rate_window_slides(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = rate_cfg();
    struct cerb_breaker b;
    const int64_t later[] = {9000, 10000};
    for (int k = 0; k < 2; k++) {
        cerb__breaker_init(&b, &c, SEED, 0);
        fail_n(&b, 0, 8, CERB_CALL);
        int64_t t = later[k];
        succeed_n(&b, t, 6, CERB_CALL);
        bool tripped = false;
        for (int i = 0; i < 4; i++)
            tripped |= cerb__breaker_on_failure(&b, t, CERB_CALL);
        if (k == 0) {
            assert_true(tripped);
            assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_OPEN);
            assert_string_equal(b.reason, "failure rate 60% over 15 calls");
        } else {
            assert_false(tripped);
            assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
        }
    }
}

/* --------------------------------------------------- OPEN → HALF_OPEN */

static void test_open_period_elapses(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_int_equal(trip(&b, 1000), 5000);
    assert_int_equal(b.open_period_ms, 5000);
    /* Results and polls during OPEN change nothing. */
    fail_n(&b, 2000, 5, CERB_CALL);
    fail_n(&b, 2000, 5, CERB_PROBE);
    succeed_n(&b, 3000, 5, CERB_PROBE);
    succeed_n(&b, 3000, 5, CERB_CALL);
    assert_false(cerb__breaker_poll(&b, 5999));
    assert_false(cerb__breaker_allow(&b, 5999));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_OPEN);
    assert_int_equal(cerb__breaker_due_ms(&b), 6000);
    assert_int_equal(b.transitions, 1);
    /* allow() applies the time and still says no: HALF_OPEN takes probes only. */
    assert_false(cerb__breaker_allow(&b, 6000));
    assert_transition(&b, CERB_BREAKER_OPEN, CERB_BREAKER_HALF_OPEN, "open period elapsed", 6000);
    assert_int_equal(b.transitions, 2);
    assert_int_equal(b.opens, 1);
    assert_int_equal(cerb__breaker_due_ms(&b), INT64_MAX);
    assert_false(cerb__breaker_poll(&b, 7000));
    assert_false(cerb__breaker_allow(&b, 7000));
    assert_int_equal(b.transitions, 2);
}

static void test_poll_reports_half_open(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_false(cerb__breaker_poll(&b, 4999));
    assert_true(cerb__breaker_poll(&b, 5001)); /* late poll: at its own time */
    assert_transition(&b, CERB_BREAKER_OPEN, CERB_BREAKER_HALF_OPEN, "open period elapsed", 5001);
}

/* A result arriving after the due time, before any poll, makes the
 * time-driven step and is itself not counted: one call, one transition. */
static void test_result_at_due_time_only_moves_to_half_open(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    c.half_open_successes = 1;
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_true(cerb__breaker_on_success(&b, 5000, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_OPEN, CERB_BREAKER_HALF_OPEN, "open period elapsed", 5000);
    assert_int_equal(b.transitions, 2);
    assert_true(cerb__breaker_on_success(&b, 5100, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_HALF_OPEN, CERB_BREAKER_CLOSED, "1 good probe", 5100);

    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_true(cerb__breaker_on_failure(&b, 5000, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_OPEN, CERB_BREAKER_HALF_OPEN, "open period elapsed", 5000);
    assert_int_equal(b.opens, 1);
}

/* -------------------------------------------------------- HALF_OPEN */

static void test_half_open_closes_after_n_good_probes(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_true(cerb__breaker_poll(&b, 5000));
    /* Real calls do not decide in HALF_OPEN, good or bad. */
    succeed_n(&b, 5010, 20, CERB_CALL);
    fail_n(&b, 5010, 20, CERB_CALL);
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_HALF_OPEN);
    assert_false(cerb__breaker_on_success(&b, 5250, CERB_PROBE));
    assert_false(cerb__breaker_on_success(&b, 5500, CERB_PROBE));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_HALF_OPEN);
    assert_false(cerb__breaker_allow(&b, 5600));
    assert_true(cerb__breaker_on_success(&b, 5750, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_HALF_OPEN, CERB_BREAKER_CLOSED, "3 good probes", 5750);
    assert_int_equal(b.transitions, 3);
    assert_int_equal(b.opens, 1);
    assert_true(cerb__breaker_allow(&b, 5750));
    assert_int_equal(cerb__breaker_due_ms(&b), INT64_MAX);
}

static void test_half_open_reopens_on_one_failure(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_true(cerb__breaker_poll(&b, 5000));
    succeed_n(&b, 5250, 2, CERB_PROBE);
    assert_true(cerb__breaker_on_failure(&b, 5500, CERB_PROBE));
    assert_transition(&b, CERB_BREAKER_HALF_OPEN, CERB_BREAKER_OPEN, "probe failed", 5500);
    assert_int_equal(b.opens, 2);
    assert_int_equal(b.transitions, 3);
    assert_int_equal(b.open_period_ms, 10000); /* doubled */
    assert_int_equal(cerb__breaker_due_ms(&b), 15500);
    assert_false(cerb__breaker_allow(&b, 15499));
    assert_true(cerb__breaker_poll(&b, 15500));
    /* The two good probes before the failure do not carry over. */
    succeed_n(&b, 15600, 2, CERB_PROBE);
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_HALF_OPEN);
    assert_true(cerb__breaker_on_success(&b, 15700, CERB_PROBE));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
}

/* Closing discards the window: the failures that tripped the breaker (still
 * inside window_ms) must not trip it again with one more failure, and the
 * run of failures starts from zero. */
static void test_window_discarded_on_close(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = rate_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    fail_n(&b, 0, 9, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&b, 0, CERB_CALL));
    int64_t t = wait_and_close(&b); /* 5000: the failures at 0 are in the window */
    uint64_t calls = 99;
    cerb__window_counts(&b.window, t, &calls, NULL);
    assert_int_equal(calls, 0);
    assert_false(cerb__breaker_on_failure(&b, t + 1, CERB_CALL));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    /* it takes a fresh min_calls to trip again */
    fail_n(&b, t + 2, 8, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&b, t + 3, CERB_CALL));
    assert_string_equal(b.reason, "failure rate 100% over 10 calls");

    /* Same for the run: two failures just before a close plus one after. */
    c = base_cfg();
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    t = wait_and_close(&b);
    fail_n(&b, t, 2, CERB_CALL);
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
}

/* ---------------------------------------------------- the open period */

/* 5 s, 10, 20, 40, then capped at 60; a close resets it to 5 s. */
static void test_open_period_doubles_and_caps(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    const int64_t want[] = {5000, 10000, 20000, 40000, 60000, 60000, 60000};
    int64_t t = 0;
    assert_int_equal(trip(&b, t), want[0]);
    for (size_t i = 1; i < sizeof want / sizeof want[0]; i++) {
        t = cerb__breaker_due_ms(&b);
        assert_true(cerb__breaker_poll(&b, t));
        assert_true(cerb__breaker_on_failure(&b, t, CERB_PROBE));
        assert_int_equal(b.open_period_ms, want[i]);
        assert_int_equal(cerb__breaker_due_ms(&b), t + want[i]);
    }
    /* Many more re-opens stay at the cap (no overflow of the doubling). */
    for (int i = 0; i < 200; i++) {
        t = cerb__breaker_due_ms(&b);
        assert_true(cerb__breaker_poll(&b, t));
        assert_true(cerb__breaker_on_failure(&b, t, CERB_PROBE));
        assert_int_equal(b.open_period_ms, 60000);
    }
    t = wait_and_close(&b);
    assert_int_equal(trip(&b, t + 10), 5000);
    /* A trip from CLOSED is never a re-open, however many before. */
    t = wait_and_close(&b);
    assert_int_equal(trip(&b, t + 10), 5000);
}

/* open_ms above the fixed cap: no doubling, the period stays open_ms. */
static void test_open_ms_above_cap(void **state)
{
    (void)state;
    struct cerb_failover_config fc = {
        .consecutive_failures = 3, .failure_rate = 50, .window_ms = 10000,
        .min_calls = 10, .open_ms = 120000, .half_open_successes = 3,
    };
    struct cerb_breaker_cfg c;
    cerb__breaker_cfg_from(&fc, &c);
    assert_int_equal(c.open_max_ms, 120000);
    c.jitter_percent = 0;
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_int_equal(trip(&b, 0), 120000);
    assert_true(cerb__breaker_poll(&b, 120000));
    assert_true(cerb__breaker_on_failure(&b, 120000, CERB_PROBE));
    assert_int_equal(b.open_period_ms, 120000);
}

/* Walk one breaker through 8 re-opens and return the periods. */
static void periods_for_seed(uint64_t seed, int jitter, int64_t out[8])
{
    struct cerb_breaker_cfg c = base_cfg();
    c.jitter_percent = jitter;
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, seed, 0);
    out[0] = trip(&b, 0);
    for (int i = 1; i < 8; i++) {
        int64_t t = cerb__breaker_due_ms(&b);
        assert_true(cerb__breaker_poll(&b, t));
        assert_true(cerb__breaker_on_failure(&b, t, CERB_PROBE));
        out[i] = b.open_period_ms;
        assert_int_equal(cerb__breaker_due_ms(&b), t + out[i]);
    }
}

/* Jitter: every period within ±20 % of its base and never above the cap; the
 * same seed gives the same periods; different seeds spread them, both below
 * and above the base. */
static void test_jitter_bounded_and_deterministic(void **state)
{
    (void)state;
    const int64_t base[8] = {5000, 10000, 20000, 40000, 60000, 60000, 60000, 60000};
    int64_t lo[8], hi[8];
    for (int i = 0; i < 8; i++) {
        lo[i] = INT64_MAX;
        hi[i] = INT64_MIN;
    }
    int differ = 0;
    int64_t prev[8] = {0};
    for (uint64_t seed = 1; seed <= 500; seed++) {
        int64_t p[8], again[8];
        periods_for_seed(seed, 20, p);
        periods_for_seed(seed, 20, again);
        assert_memory_equal(p, again, sizeof p);
        for (int i = 0; i < 8; i++) {
            assert_in_range(p[i], base[i] * 80 / 100, base[i] * 120 / 100);
            assert_true(p[i] <= 60000);
            lo[i] = p[i] < lo[i] ? p[i] : lo[i];
            hi[i] = p[i] > hi[i] ? p[i] : hi[i];
        }
        if (seed > 1 && memcmp(p, prev, sizeof p) != 0)
            differ++;
        memcpy(prev, p, sizeof p);
    }
    assert_true(differ >= 490);
    for (int i = 0; i < 8; i++) {
        /* The spread really uses the range (catches "no jitter" and a
         * one-sided jitter alike). */
        assert_true(lo[i] < base[i] * 85 / 100);
        if (base[i] < 60000)
            assert_true(hi[i] > base[i] * 115 / 100);
        else
            assert_true(hi[i] > base[i] * 99 / 100); /* capped: up to the cap */
    }
    /* jitter 0: exactly the base, whatever the seed */
    int64_t p[8];
    periods_for_seed(77, 0, p);
    assert_memory_equal(p, base, sizeof p);
}

/* ------------------------------------------------------ forced states */

static void test_forced_disabled_never_opens(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_DISABLED, 10));
    assert_transition(&b, CERB_BREAKER_CLOSED, CERB_BREAKER_DISABLED, "forced", 10);
    assert_int_equal(b.transitions, 1);
    assert_false(cerb__breaker_force(&b, CERB_BREAKER_DISABLED, 11)); /* already */
    assert_int_equal(b.transitions, 1);
    for (int64_t t = 100; t < 100000; t += 100) {
        assert_false(cerb__breaker_on_failure(&b, t, t % 200 ? CERB_CALL : CERB_PROBE));
        assert_true(cerb__breaker_allow(&b, t));
        assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_DISABLED);
    }
    assert_int_equal(b.transitions, 1);
    assert_int_equal(b.opens, 0);
    /* still counted */
    uint64_t calls, fails;
    cerb__window_counts(&b.window, 99900, &calls, &fails);
    assert_int_equal(calls, 100); /* the last window_ms of them */
    assert_int_equal(fails, 100);
    assert_int_equal(b.failures_in_row, 999);
    /* back to normal: CLOSED with a fresh window and run */
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_CLOSED, 100000));
    assert_transition(&b, CERB_BREAKER_DISABLED, CERB_BREAKER_CLOSED, "forced", 100000);
    cerb__window_counts(&b.window, 100000, &calls, NULL);
    assert_int_equal(calls, 0);
    fail_n(&b, 100001, 2, CERB_CALL);
    assert_true(cerb__breaker_on_failure(&b, 100002, CERB_CALL));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_OPEN);
}

/* Disabling an open breaker routes to it at once; lifting the force does
 * not bring the old OPEN back. */
static void test_disable_while_open(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_DISABLED, 100));
    assert_transition(&b, CERB_BREAKER_OPEN, CERB_BREAKER_DISABLED, "forced", 100);
    assert_true(cerb__breaker_allow(&b, 100));
    assert_int_equal(cerb__breaker_due_ms(&b), INT64_MAX);
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_CLOSED, 200));
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_CLOSED);
    assert_true(cerb__breaker_allow(&b, 200));
    assert_true(cerb__breaker_allow(&b, 6000));
}

static void test_forced_open_never_allows(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_FORCED_OPEN, 5));
    assert_transition(&b, CERB_BREAKER_CLOSED, CERB_BREAKER_FORCED_OPEN, "forced", 5);
    for (int64_t t = 10; t < 200000; t += 250) {
        assert_false(cerb__breaker_allow(&b, t));
        assert_false(cerb__breaker_poll(&b, t));
        assert_false(cerb__breaker_on_success(&b, t, CERB_PROBE));
        assert_false(cerb__breaker_on_success(&b, t, CERB_CALL));
        assert_false(cerb__breaker_on_failure(&b, t, CERB_PROBE));
        assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_FORCED_OPEN);
    }
    assert_int_equal(cerb__breaker_due_ms(&b), INT64_MAX);
    assert_int_equal(b.transitions, 1);
    assert_int_equal(b.opens, 0); /* FORCED_OPEN is not OPEN */
    /* forced_open → disabled → back to normal */
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_DISABLED, 200000));
    assert_transition(&b, CERB_BREAKER_FORCED_OPEN, CERB_BREAKER_DISABLED, "forced", 200000);
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_FORCED_OPEN, 200001));
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_CLOSED, 200002));
    assert_transition(&b, CERB_BREAKER_FORCED_OPEN, CERB_BREAKER_CLOSED, "forced", 200002);
    assert_true(cerb__breaker_allow(&b, 200002));
    assert_int_equal(b.transitions, 4);
}

/* force(CLOSED) is also a reset: OPEN → CLOSED now, period back to open_ms.
 * OPEN and HALF_OPEN cannot be forced. */
static void test_force_closed_resets_and_bad_forces(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    trip(&b, 0);
    assert_true(cerb__breaker_poll(&b, 5000));
    assert_true(cerb__breaker_on_failure(&b, 5000, CERB_PROBE)); /* 10 s now */
    uint64_t n = b.transitions;
    assert_false(cerb__breaker_force(&b, CERB_BREAKER_OPEN, 5100));
    assert_false(cerb__breaker_force(&b, CERB_BREAKER_HALF_OPEN, 5100));
    assert_false(cerb__breaker_force(&b, (enum cerb_breaker_state)99, 5100));
    assert_int_equal(b.transitions, n);
    assert_int_equal(cerb__breaker_state(&b), CERB_BREAKER_OPEN);
    assert_int_equal(cerb__breaker_due_ms(&b), 15000);
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_CLOSED, 5200));
    assert_transition(&b, CERB_BREAKER_OPEN, CERB_BREAKER_CLOSED, "forced", 5200);
    assert_int_equal(trip(&b, 6000), 5000);
    /* Forcing CLOSED when already CLOSED reports no change. */
    assert_true(cerb__breaker_force(&b, CERB_BREAKER_CLOSED, 6100));
    assert_false(cerb__breaker_force(&b, CERB_BREAKER_CLOSED, 6200));
}

/* ---------------------------------------------------------- defaults */

static void test_defaults_from_config(void **state)
{
    (void)state;
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_defaults(&cfg), CERB_OK);
    struct cerb_breaker_cfg c;
    memset(&c, 0xa5, sizeof c);
    cerb__breaker_cfg_from(&cfg->failover, &c);
    assert_int_equal(c.consecutive_failures, 3);
    assert_int_equal(c.failure_rate, 50);
    assert_int_equal(c.window_ms, 10000);
    assert_int_equal(c.min_calls, 10);
    assert_int_equal(c.open_ms, 5000);
    assert_int_equal(c.open_max_ms, 60000);
    assert_int_equal(c.half_open_successes, 3);
    assert_int_equal(c.jitter_percent, 20);
    cerb__config_free(cfg);

    /* Keys from a file reach the breaker. */
    assert_int_equal(cerb__config_from_string(
                         "failover = { consecutive_failures = 5; failure_rate = 80;"
                         " window_ms = 2000; min_calls = 4; open_ms = 700;"
                         " half_open_successes = 2; };\n",
                         &cfg),
                     CERB_OK);
    cerb__breaker_cfg_from(&cfg->failover, &c);
    assert_int_equal(c.consecutive_failures, 5);
    assert_int_equal(c.failure_rate, 80);
    assert_int_equal(c.window_ms, 2000);
    assert_int_equal(c.min_calls, 4);
    assert_int_equal(c.open_ms, 700);
    assert_int_equal(c.open_max_ms, 60000);
    assert_int_equal(c.half_open_successes, 2);
    cerb__config_free(cfg);
}

/* The defaults drive the machine as DESIGN.md §5 says: 3 failures trip,
 * 4 .. 6 s open (5 s ± 20 %), 3 good probes close. */
static void test_default_breaker_end_to_end(void **state)
{
    (void)state;
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_defaults(&cfg), CERB_OK);
    struct cerb_breaker_cfg c;
    cerb__breaker_cfg_from(&cfg->failover, &c);
    cerb__config_free(cfg);
    struct cerb_breaker b;
    cerb__breaker_init(&b, &c, SEED, 0);
    int64_t p = trip(&b, 0);
    assert_in_range(p, 4000, 6000);
    assert_string_equal(b.reason, "3 consecutive failures");
    wait_and_close(&b);
    assert_string_equal(b.reason, "3 good probes");
    assert_int_equal(b.transitions, 3);
}

/* ---------------------------------------------------------- random walk */

static uint64_t lcg(uint64_t *s)
{
    *s = *s * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
    return *s >> 33;
}

static bool edge_ok(enum cerb_breaker_state from, enum cerb_breaker_state to, const char *why)
{
    if (strcmp(why, "forced") == 0)
        return to == CERB_BREAKER_CLOSED || to == CERB_BREAKER_DISABLED ||
               to == CERB_BREAKER_FORCED_OPEN;
    switch (from) {
    case CERB_BREAKER_CLOSED:
        return to == CERB_BREAKER_OPEN;
    case CERB_BREAKER_OPEN:
        return to == CERB_BREAKER_HALF_OPEN && strcmp(why, "open period elapsed") == 0;
    case CERB_BREAKER_HALF_OPEN:
        return (to == CERB_BREAKER_CLOSED && strstr(why, "good probe")) ||
               (to == CERB_BREAKER_OPEN && strcmp(why, "probe failed") == 0);
    case CERB_BREAKER_DISABLED:
    case CERB_BREAKER_FORCED_OPEN:
        return false; /* only a force leaves them */
    }
    return false;
}

/* Random events at random times: every `true` is exactly one transition along
 * an allowed edge, every `false` none; allow() agrees with the state; the
 * open period always lies within its bounds. */
static void test_random_walk_invariants(void **state)
{
    (void)state;
    struct cerb_breaker_cfg c = base_cfg();
    c.jitter_percent = 20;
    c.min_calls = 5;
    struct cerb_breaker b;
    uint64_t rs = 12345;
    int64_t t = 0;
    cerb__breaker_init(&b, &c, 99, t);
    int seen[5] = {0};
    for (int i = 0; i < 200000; i++) {
        t += (int64_t)(lcg(&rs) % 400);
        enum cerb_breaker_state before = cerb__breaker_state(&b);
        uint64_t n = b.transitions;
        uint64_t opens = b.opens;
        bool changed;
        int ev = (int)(lcg(&rs) % 1000);
        enum cerb_breaker_kind k = lcg(&rs) % 2 ? CERB_CALL : CERB_PROBE;
        if (ev < 2) {
            const enum cerb_breaker_state f[] = {CERB_BREAKER_CLOSED, CERB_BREAKER_DISABLED,
                                                 CERB_BREAKER_FORCED_OPEN};
            changed = cerb__breaker_force(&b, f[lcg(&rs) % 3], t);
        } else if (ev < 300) {
            changed = cerb__breaker_on_failure(&b, t, k);
        } else if (ev < 800) {
            changed = cerb__breaker_on_success(&b, t, k);
        } else if (ev < 900) {
            changed = cerb__breaker_poll(&b, t);
        } else {
            bool ok = cerb__breaker_allow(&b, t);
            changed = b.transitions != n;
            enum cerb_breaker_state s = cerb__breaker_state(&b);
            assert_int_equal(ok, s == CERB_BREAKER_CLOSED || s == CERB_BREAKER_DISABLED);
        }
        enum cerb_breaker_state after = cerb__breaker_state(&b);
        seen[after]++;
        assert_int_equal(changed, before != after);
        assert_int_equal(b.transitions, n + (changed ? 1 : 0));
        if (changed) {
            assert_int_equal(b.from, before);
            assert_int_equal(b.to, after);
            assert_int_equal(b.changed_ms, t);
            assert_true(edge_ok(before, after, b.reason));
            assert_int_equal(b.opens, opens + (after == CERB_BREAKER_OPEN));
            if (after == CERB_BREAKER_OPEN) {
                int64_t base = 5000;
                for (int r = 0; r < b.reopens && base < 60000; r++)
                    base *= 2;
                base = base < 60000 ? base : 60000;
                assert_in_range(b.open_period_ms, base * 80 / 100,
                                base < 60000 ? base * 120 / 100 : 60000);
                assert_int_equal(cerb__breaker_due_ms(&b), t + b.open_period_ms);
            }
        } else {
            assert_int_equal(b.opens, opens);
        }
        if (after == CERB_BREAKER_OPEN)
            assert_true(t < cerb__breaker_due_ms(&b));
    }
    for (int s = 0; s < 5; s++)
        assert_true(seen[s] > 0); /* the walk visited every state */
}

/* ---------------------------------------------------- flapping primary */

struct flap_result {
    int opens, trips, closes;
    int64_t open_at[64];
    int64_t period[64];
};

/*
 * A primary down for 1 s every 2 s ([0, 1000) of every 2000 ms) for 30 s of
 * fake time, the default breaker, real calls every 10 ms whenever the breaker
 * allows, and the prober every 250 ms ± 20 %. Collects every entry into OPEN.
 */
/* After every call: it made at most one transition; record entries into OPEN
 * and closes. */
static void flap_note(const struct cerb_breaker *b, struct flap_result *r, uint64_t *seen)
{
    assert_true(b->transitions - *seen <= 1);
    if (b->transitions == *seen)
        return;
    *seen = b->transitions;
    if (b->to == CERB_BREAKER_OPEN) {
        assert_true(r->opens < 64);
        r->open_at[r->opens] = b->changed_ms;
        r->period[r->opens] = b->open_period_ms;
        r->opens++;
        if (b->from == CERB_BREAKER_CLOSED)
            r->trips++;
    }
    if (b->to == CERB_BREAKER_CLOSED)
        r->closes++;
}

static void flap_result_of(struct cerb_breaker *b, int64_t t, bool down,
                           enum cerb_breaker_kind k)
{
    if (down)
        cerb__breaker_on_failure(b, t, k);
    else
        cerb__breaker_on_success(b, t, k);
}

static void flap(uint64_t seed, const struct cerb_breaker_cfg *c, struct flap_result *r)
{
    struct cerb_breaker b;
    memset(r, 0, sizeof *r);
    cerb__breaker_init(&b, c, seed, 0);
    uint64_t rs = seed * 2 + 1;
    int64_t next_probe = 0;
    uint64_t seen = 0;
    for (int64_t t = 0; t <= 30000; t += 10) {
        bool down = t % 2000 < 1000;
        bool ok = cerb__breaker_allow(&b, t);
        flap_note(&b, r, &seen);
        if (ok) {
            flap_result_of(&b, t, down, CERB_CALL);
            flap_note(&b, r, &seen);
        }
        if (t >= next_probe) {
            cerb__breaker_poll(&b, t);
            flap_note(&b, r, &seen);
            flap_result_of(&b, t, down, CERB_PROBE);
            flap_note(&b, r, &seen);
            next_probe = t + 200 + (int64_t)(lcg(&rs) % 101); /* 250 ± 20 % */
        }
    }
    assert_int_equal((uint64_t)r->opens, b.opens);
}

static void test_flapping_primary(void **state)
{
    (void)state;
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_defaults(&cfg), CERB_OK);
    struct cerb_breaker_cfg c;
    cerb__breaker_cfg_from(&cfg->failover, &c);
    cerb__config_free(cfg);
    int max_opens = 0, max_trips = 0;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        struct flap_result r;
        flap(seed, &c, &r);
        /* The flapping is noticed at once (the primary is down at t = 0). */
        assert_true(r.opens >= 1);
        assert_true(r.open_at[0] < 100);
        /* At most one OPEN per open period: each entry waits out the period
         * chosen by the one before (at least 4 s, 5 s − 20 %). */
        for (int i = 1; i < r.opens; i++) {
            assert_true(r.open_at[i] - r.open_at[i - 1] >= r.period[i - 1]);
            assert_true(r.open_at[i] - r.open_at[i - 1] >= 4000);
        }
        assert_true(r.opens <= 1 + 30000 / 4000);
        /* Every trip from CLOSED but the first follows a close, and every
         * close follows an open: the selector switches away from the
         * primary `trips` times. */
        assert_true(r.closes <= r.opens);
        assert_true(r.trips <= r.closes + 1);
        max_opens = r.opens > max_opens ? r.opens : max_opens;
        max_trips = r.trips > max_trips ? r.trips : max_trips;
    }
    print_message("flapping 30 s, 50 seeds: at most %d opens, %d trips from closed\n",
                  max_opens, max_trips);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_closed_allows),
        cmocka_unit_test(test_state_names),
        cmocka_unit_test(test_cfg_fixups),
        cmocka_unit_test(test_consecutive_failures_trip),
        cmocka_unit_test(test_probe_failures_trip_closed),
        cmocka_unit_test(test_success_resets_consecutive),
        cmocka_unit_test(test_singular_reasons),
        cmocka_unit_test(test_rate_trip_needs_min_calls),
        cmocka_unit_test(test_rate_threshold),
        cmocka_unit_test(test_batched_call_successes),
        cmocka_unit_test(test_rate_window_slides),
        cmocka_unit_test(test_open_period_elapses),
        cmocka_unit_test(test_poll_reports_half_open),
        cmocka_unit_test(test_result_at_due_time_only_moves_to_half_open),
        cmocka_unit_test(test_half_open_closes_after_n_good_probes),
        cmocka_unit_test(test_half_open_reopens_on_one_failure),
        cmocka_unit_test(test_window_discarded_on_close),
        cmocka_unit_test(test_open_period_doubles_and_caps),
        cmocka_unit_test(test_open_ms_above_cap),
        cmocka_unit_test(test_jitter_bounded_and_deterministic),
        cmocka_unit_test(test_forced_disabled_never_opens),
        cmocka_unit_test(test_disable_while_open),
        cmocka_unit_test(test_forced_open_never_allows),
        cmocka_unit_test(test_force_closed_resets_and_bad_forces),
        cmocka_unit_test(test_defaults_from_config),
        cmocka_unit_test(test_default_breaker_end_to_end),
        cmocka_unit_test(test_random_walk_invariants),
        cmocka_unit_test(test_flapping_primary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
