/*
 * test_oracle.c — the chaos oracle's bookkeeping on synthetic event
 * sequences: each check of oracle.h (explained and unsafe overlaps, token
 * regressions per engine, per client and after a switch mark, tokens of 0,
 * overruns, LOST counts, acquisitions per engine, guard claims and their
 * reruns) is shown to fire on the
 * sequence that breaks it and to stay silent on the one that does not; and
 * two processes recording into one file see each other; the hold of a
 * process that died inside ends, rather than overlapping every later one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oracle.h"
#include "test_util.h"

#define MS 1000000LL
#define TOK(epoch, n) (((uint64_t)(epoch) << 48) | (uint64_t)(n))

static char path[64];

static int setup(void **state)
{
    snprintf(path, sizeof(path), "/tmp/cerb-oracle-test-%d", (int)getpid());
    *state = oracle_create(path);
    return *state ? 0 : -1;
}

static int teardown(void **state)
{
    oracle_close(*state);
    unlink(path);
    return 0;
}

static oracle_report rep(oracle *o)
{
    oracle_report r;
    oracle_report_get(o, &r);
    return r;
}

static void mutual_exclusion_is_clean(void **state)
{
    oracle *o = *state;
    for (int i = 0; i < 10; i++) {
        int h = oracle_enter(o, "a", i % 3, TOK(1, i + 1), "redis", (10 * i + 1) * MS);
        assert_true(h >= 0);
        oracle_leave(o, h, (10 * i + 5) * MS);
    }
    oracle_report r = rep(o);
    assert_int_equal(r.acquisitions, 10);
    assert_int_equal(r.overlaps_unsafe, 0);
    assert_int_equal(r.overlaps_explained, 0);
    assert_int_equal(r.token_regressions, 0);
    assert_int_equal(r.zero_tokens, 0);
    assert_int_equal(r.notes, 0);
    assert_string_equal(r.engine_name[1], "redis");
    assert_int_equal(r.acq_engine[1], 10);
}

static void overlap_without_lost_is_unsafe(void **state)
{
    oracle *o = *state;
    int a = oracle_enter(o, "a", 0, 5, "redis", 1 * MS);
    int b = oracle_enter(o, "a", 1, 6, "redis", 2 * MS);
    /* Told LOST after the newer entered: still unsafe. */
    oracle_told_lost(o, a, 3 * MS);
    oracle_leave(o, a, 4 * MS);
    oracle_leave(o, b, 5 * MS);
    oracle_report r = rep(o);
    assert_int_equal(r.overlaps_unsafe, 1);
    assert_int_equal(r.overlaps_explained, 0);
    assert_int_equal(r.lost, 1);
    assert_non_null(strstr(oracle_note_get(o, 0), "UNSAFE overlap on a"));
    /* Other names are independent. */
    int c = oracle_enter(o, "b", 0, 7, "redis", 6 * MS);
    oracle_leave(o, c, 7 * MS);
    assert_int_equal(rep(o).overlaps_unsafe, 1);
}

static void overlap_after_lost_is_explained(void **state)
{
    oracle *o = *state;
    int a = oracle_enter(o, "a", 0, 5, "zk", 1 * MS);
    oracle_told_lost(o, a, 2 * MS);
    oracle_told_lost(o, a, 3 * MS); /* counted once */
    int b = oracle_enter(o, "a", 1, 6, "zk", 2 * MS);
    oracle_leave(o, b, 4 * MS);
    oracle_leave(o, a, 5 * MS);
    /* After both left, a late lost report of a stale id changes nothing. */
    oracle_told_lost(o, b, 6 * MS);
    int c = oracle_enter(o, "a", 0, 7, "zk", 7 * MS);
    oracle_leave(o, c, 8 * MS);
    oracle_report r = rep(o);
    assert_int_equal(r.overlaps_explained, 1);
    assert_int_equal(r.overlaps_unsafe, 0);
    assert_int_equal(r.lost, 1);
}

static void token_regressions(void **state)
{
    oracle *o = *state;
    int h;
    /* Per engine: redis 10 then redis 10 (a restart that forgot its counter). */
    h = oracle_enter(o, "a", 0, 10, "redis", 1 * MS);
    oracle_leave(o, h, 2 * MS);
    h = oracle_enter(o, "a", 1, 10, "redis", 3 * MS);
    oracle_leave(o, h, 4 * MS);
    assert_int_equal(rep(o).token_regressions, 1);
    assert_non_null(strstr(oracle_note_get(o, 0), "regression (engine)"));
    /* Another engine may count lower, for another client... */
    h = oracle_enter(o, "a", 2, 3, "zk", 5 * MS);
    oracle_leave(o, h, 6 * MS);
    assert_int_equal(rep(o).token_regressions, 1);
    /* ...but not for a client that saw a higher one (its own switch). */
    h = oracle_enter(o, "a", 0, 4, "zk", 7 * MS);
    oracle_leave(o, h, 8 * MS);
    assert_int_equal(rep(o).token_regressions, 2);
    assert_non_null(strstr(oracle_note_get(o, 1), "regression (client)"));
    /* An unknown engine is not judged per engine, still per client. */
    h = oracle_enter(o, "a", 3, 1, "?", 9 * MS);
    oracle_leave(o, h, 10 * MS);
    assert_int_equal(rep(o).token_regressions, 2);
    /* Zero is counted apart. */
    h = oracle_enter(o, "a", 3, 0, "zk", 11 * MS);
    oracle_leave(o, h, 12 * MS);
    assert_int_equal(rep(o).zero_tokens, 1);
    assert_int_equal(rep(o).token_regressions, 2);
}

static void switch_mark_floor(void **state)
{
    oracle *o = *state;
    int h = oracle_enter(o, "a", 0, TOK(1, 100), "redis", 1 * MS);
    oracle_leave(o, h, 2 * MS);
    oracle_mark_switch(o, 10 * MS, 50);
    /* Within the settle time a client that has not reloaded may still grant
     * on the old epoch... */
    h = oracle_enter(o, "a", 1, TOK(1, 5), "zk", 20 * MS);
    oracle_leave(o, h, 21 * MS);
    assert_int_equal(rep(o).token_regressions, 0);
    /* ...after it, every grant ranks above what came before the switch. */
    h = oracle_enter(o, "a", 2, TOK(1, 6), "zk", 100 * MS);
    oracle_leave(o, h, 101 * MS);
    assert_int_equal(rep(o).token_regressions, 1);
    assert_non_null(strstr(oracle_note_get(o, 0), "regression (switch)"));
    h = oracle_enter(o, "a", 3, TOK(2, 1), "zk", 102 * MS);
    oracle_leave(o, h, 103 * MS);
    assert_int_equal(rep(o).token_regressions, 1);
}

static void overruns(void **state)
{
    oracle *o = *state;
    oracle_call(o, "trylock_for", 0, 1500 * MS, 1000); /* 0.5 s late: within slack */
    assert_int_equal(rep(o).overruns, 0);
    assert_int_equal(rep(o).max_overrun_ms, 500);
    oracle_call(o, "unlock", 0, 2100 * MS, 1000);
    oracle_report r = rep(o);
    assert_int_equal(r.overruns, 1);
    assert_int_equal(r.calls, 2);
    assert_int_equal(r.max_overrun_ms, 1100);
    assert_non_null(strstr(oracle_note_get(o, 0), "overrun: unlock"));
}

static void guard_claims(void **state)
{
    oracle *o = *state;
    /* Claims carry no token: no token-0 or regression count. */
    int a = oracle_enter_claim(o, "k", 0, "zk", 1 * MS, 2 * MS);
    oracle_leave(o, a, 3 * MS);
    int b = oracle_enter_claim(o, "k", 1, "zk", 3 * MS, 4 * MS);
    /* A second attempt while the first runs, not told LOST: unsafe. */
    int c = oracle_enter_claim(o, "k", 2, "zk", 4 * MS, 5 * MS);
    oracle_leave(o, c, 6 * MS);
    /* Told LOST before the next began: explained. */
    oracle_told_lost(o, b, 7 * MS);
    int d = oracle_enter_claim(o, "k", 2, "zk", 7 * MS, 8 * MS);
    oracle_leave(o, d, 9 * MS);
    oracle_leave(o, b, 10 * MS);
    oracle_report r = rep(o);
    assert_int_equal(r.acquisitions, 4);
    assert_int_equal(r.zero_tokens, 0);
    assert_int_equal(r.token_regressions, 0);
    assert_int_equal(r.overlaps_unsafe, 1);
    assert_int_equal(r.overlaps_explained, 1);
    assert_non_null(strstr(oracle_note_get(o, 0), "UNSAFE overlap on guard key k"));
}

/* memcached's locks carry no token: none is judged (no "token 0"), the
 * overlap rule still is. */
static void unfenced_locks(void **state)
{
    oracle *o = *state;
    int a = oracle_enter_unfenced(o, "m", 0, "memcached", 1 * MS);
    oracle_leave(o, a, 2 * MS);
    int b = oracle_enter_unfenced(o, "m", 1, "memcached", 3 * MS);
    int c = oracle_enter_unfenced(o, "m", 2, "memcached", 4 * MS);
    oracle_leave(o, c, 5 * MS);
    oracle_told_lost(o, b, 6 * MS);
    int d = oracle_enter_unfenced(o, "m", 2, "memcached", 7 * MS);
    oracle_leave(o, d, 8 * MS);
    oracle_leave(o, b, 9 * MS);
    oracle_report r = rep(o);
    assert_int_equal(r.acquisitions, 4);
    assert_int_equal(r.zero_tokens, 0);
    assert_int_equal(r.token_regressions, 0);
    assert_int_equal(r.reruns, 0);
    assert_int_equal(r.overlaps_unsafe, 1);
    assert_int_equal(r.overlaps_explained, 1);
    assert_non_null(strstr(oracle_note_get(o, 0), "UNSAFE overlap on unfenced lock m"));
}

static void guard_reruns(void **state)
{
    oracle *o = *state;
    /* A success finished over [10, 12] ms, kept 100 ms: done until 110. */
    int a = oracle_enter_claim(o, "k", 0, "redis", 1 * MS, 2 * MS);
    oracle_leave(o, a, 9 * MS);
    oracle_done(o, "k", 10 * MS, 12 * MS, 100);
    /* A begin sent before the finish returned may have been judged first. */
    int b = oracle_enter_claim(o, "k", 1, "redis", 11 * MS, 13 * MS);
    oracle_leave(o, b, 14 * MS);
    assert_int_equal(rep(o).reruns, 0);
    /* Answered past the window's end (less the slack): the record may have
     * expired. */
    b = oracle_enter_claim(o, "k", 1, "redis", 20 * MS, 107 * MS);
    oracle_leave(o, b, 108 * MS);
    assert_int_equal(rep(o).reruns, 0);
    /* Wholly inside: the operation ran twice. */
    b = oracle_enter_claim(o, "k", 1, "redis", 20 * MS, 30 * MS);
    oracle_leave(o, b, 31 * MS);
    assert_int_equal(rep(o).reruns, 1);
    assert_non_null(strstr(oracle_note_get(o, 0), "rerun of guard key k"));
    /* Another key is not kept by it; a lock's hold is not judged by it. */
    b = oracle_enter_claim(o, "j", 1, "redis", 20 * MS, 30 * MS);
    oracle_leave(o, b, 31 * MS);
    b = oracle_enter(o, "k", 1, 5, "redis", 40 * MS);
    oracle_leave(o, b, 41 * MS);
    assert_int_equal(rep(o).reruns, 1);
}

static void two_processes_share_the_file(void **state)
{
    oracle *o = *state;
    int h = oracle_enter(o, "shared", 0, 1, "redis", oracle_now());
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        oracle *c = oracle_open(path);
        if (!c)
            _exit(2);
        int k = oracle_enter(c, "shared", 1, 2, "redis", oracle_now());
        oracle_leave(c, k, oracle_now());
        oracle_close(c);
        _exit(0);
    }
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    oracle_leave(o, h, oracle_now());
    oracle_report r = rep(o);
    assert_int_equal(r.acquisitions, 2);
    assert_int_equal(r.overlaps_unsafe, 1);
}

static void dead_holder_is_no_overlap(void **state)
{
    oracle *o = *state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        oracle *c = oracle_open(path);
        if (!c)
            _exit(2);
        /* Enters and dies inside, never leaving. */
        oracle_enter(c, "d", 1, 1, "zk", oracle_now());
        _exit(0);
    }
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    int h = oracle_enter(o, "d", 0, 2, "zk", oracle_now());
    oracle_leave(o, h, oracle_now());
    oracle_report r = rep(o);
    assert_int_equal(r.overlaps_unsafe, 0);
    assert_non_null(strstr(oracle_note_get(o, 0), "died inside d"));
}

/* Permits share up to the limit; one more, or a writer with anybody, is
 * unsafe unless those inside were told LOST first; readers share; a
 * writer's token must exceed every grant before it, a reader's every
 * writer's. */
static void shared_holds(void **state)
{
    oracle *o = *state;
    int a = oracle_enter_shared(o, "s", 0, TOK(1, 1), "redis", 1 * MS, ORACLE_PERMITS, 1, 3);
    int b = oracle_enter_shared(o, "s", 1, TOK(1, 3), "redis", 2 * MS, ORACLE_PERMITS, 2, 3);
    assert_int_equal(rep(o).overlaps_unsafe, 0);
    int c = oracle_enter_shared(o, "s", 2, TOK(1, 2), "redis", 3 * MS, ORACLE_PERMITS, 1, 3);
    oracle_report r = rep(o);
    assert_int_equal(r.overlaps_unsafe, 2); /* the fourth permit of three, against both */
    assert_int_equal(r.token_regressions, 0); /* permits are not ordered */
    oracle_leave(o, c, 4 * MS);
    oracle_told_lost(o, b, 5 * MS);
    int d = oracle_enter_shared(o, "s", 2, TOK(1, 4), "redis", 6 * MS, ORACLE_PERMITS, 2, 3);
    r = rep(o);
    assert_int_equal(r.overlaps_unsafe, 2); /* b was told: its permits are not counted */
    oracle_leave(o, a, 7 * MS);
    oracle_leave(o, b, 7 * MS);
    oracle_leave(o, d, 7 * MS);

    int r1 = oracle_enter_shared(o, "rw", 0, TOK(1, 1), "zk", 10 * MS, ORACLE_READ, 1, 0);
    int r2 = oracle_enter_shared(o, "rw", 1, TOK(1, 2), "zk", 11 * MS, ORACLE_READ, 1, 0);
    assert_int_equal(rep(o).overlaps_unsafe, 2);
    int w = oracle_enter_shared(o, "rw", 2, TOK(1, 3), "zk", 12 * MS, ORACLE_WRITE, 1, 0);
    assert_int_equal(rep(o).overlaps_unsafe, 4); /* a writer with two readers */
    oracle_leave(o, r1, 13 * MS);
    oracle_leave(o, r2, 13 * MS);
    oracle_leave(o, w, 13 * MS);
    int w2 = oracle_enter_shared(o, "rw", 2, TOK(1, 3), "zk", 14 * MS, ORACLE_WRITE, 1, 0);
    assert_int_equal(rep(o).token_regressions, 1); /* not above the writer before */
    oracle_leave(o, w2, 15 * MS);
    int r3 = oracle_enter_shared(o, "rw", 0, TOK(1, 2), "zk", 16 * MS, ORACLE_READ, 1, 0);
    assert_int_equal(rep(o).token_regressions, 2); /* a reader below the last writer */
    oracle_leave(o, r3, 17 * MS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(mutual_exclusion_is_clean, setup, teardown),
        cmocka_unit_test_setup_teardown(overlap_without_lost_is_unsafe, setup, teardown),
        cmocka_unit_test_setup_teardown(overlap_after_lost_is_explained, setup, teardown),
        cmocka_unit_test_setup_teardown(token_regressions, setup, teardown),
        cmocka_unit_test_setup_teardown(switch_mark_floor, setup, teardown),
        cmocka_unit_test_setup_teardown(overruns, setup, teardown),
        cmocka_unit_test_setup_teardown(guard_claims, setup, teardown),
        cmocka_unit_test_setup_teardown(guard_reruns, setup, teardown),
        cmocka_unit_test_setup_teardown(unfenced_locks, setup, teardown),
        cmocka_unit_test_setup_teardown(two_processes_share_the_file, setup, teardown),
        cmocka_unit_test_setup_teardown(dead_holder_is_no_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(shared_holds, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
