/*
 * test_redis_guard_pause.c — the guard while the redis server stops
 * answering (SIGSTOP; this suite owns its server, see tests/CMakeLists.txt):
 * begin is bounded and refused with CERB_UNAVAILABLE under the default
 * policy, or runs degraded (cerb_guard_degraded = 1) with "allow", and the
 * claims those requests leave when the server resumes are cleaned up well
 * before running_ms; a pause
 * shorter than the claim does not lose a running attempt (its renewals
 * resume and its finish records the success); a pause longer than the
 * claim lets the record expire, and the attempt's finish is then CERB_LOST.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

static cerb_client *open_client(const char *guard)
{
    char ex[256];
    snprintf(ex, sizeof ex, "guard = { keep_ms = 5000; %s };", guard ? guard : "");
    char *cfg = cerb_test_redis_config("op_timeout_ms = 200; prefix = \"gpause:\";", ex);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    return c;
}

static int teardown(void **state)
{
    (void)state;
    cerb_test_redis_resume(); /* whatever a failed case left */
    return 0;
}

static void test_paused_server_policy(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL);
    char *key = test_name("pol");
    cerb_guard *g = (cerb_guard *)1;
    assert_int_equal(cerb_test_redis_pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g), CERB_UNAVAILABLE);
    assert_null(g);
    assert_true(cerb_test_now_ms() - t0 < 2000); /* two op timeouts and a connect */
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.on_unavailable = CERB_GUARD_ALLOW;
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_degraded(g), 1);
    assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_test_redis_resume(), 0);
    /* The requests sent while the server was paused land when it resumes:
     * claims nobody renews. They are deleted in the background (orphans),
     * so a retry runs well before running_ms (30 s). */
    cerb_status st;
    int64_t end = cerb_test_now_ms() + 5000;
    while ((st = cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g)) != CERB_OK &&
           cerb_test_now_ms() < end) {
        assert_true(st == CERB_BUSY || st == CERB_UNAVAILABLE);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_guard_degraded(g), 0);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    free(key);
    cerb_client_close(c);
}

static void test_short_pause_keeps_the_attempt(void **state)
{
    (void)state;
    cerb_client *c = open_client("running_ms = 3000;");
    char *key = test_name("short");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_test_redis_pause(), 0);
    struct timespec ts = {0, 800 * 1000000L};
    nanosleep(&ts, NULL); /* the fault's length: a renewal falls in it */
    assert_int_equal(cerb_test_redis_resume(), 0);
    /* Still ours past running_ms: renewals went on after the pause. */
    int64_t end = cerb_test_now_ms() + 4000;
    while (cerb_test_now_ms() < end) {
        cerb_status st = cerb_guard_begin(c, "pause", key, strlen(key), NULL, &h);
        assert_true(st == CERB_BUSY || st == CERB_UNAVAILABLE); /* never OK */
        if (h)
            cerb_guard_free(h);
        h = NULL;
        nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    }
    assert_int_equal(cerb_guard_finish(g, 1, "kept", 4), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &h), CERB_DUPLICATE);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

static void test_long_pause_loses_the_claim(void **state)
{
    (void)state;
    cerb_client *c = open_client("running_ms = 500;");
    char *key = test_name("long");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_test_redis_pause(), 0);
    struct timespec ts = {1, 500 * 1000000L};
    nanosleep(&ts, NULL); /* well past the claim: the server expires it on resume */
    assert_int_equal(cerb_test_redis_resume(), 0);
    cerb_status st;
    int64_t end = cerb_test_now_ms() + 5000;
    while ((st = cerb_guard_begin(c, "pause", key, strlen(key), NULL, &h)) != CERB_OK &&
           cerb_test_now_ms() < end)
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "late", 4), CERB_LOST);
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_paused_server_policy, teardown),
        cmocka_unit_test_teardown(test_short_pause_keeps_the_attempt, teardown),
        cmocka_unit_test_teardown(test_long_pause_loses_the_claim, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
