/*
 * test_zk_guard_pause.c — the guard while the ZooKeeper server stops
 * answering or comes back empty (this suite owns its server: the name has
 * "_pause", see tests/CMakeLists.txt):
 *  - server SIGSTOPped: begin is bounded and refused with CERB_UNAVAILABLE
 *    under the default policy, or runs degraded with "allow"; the claims its
 *    unanswered requests leave when the server resumes are deleted well
 *    before running_ms (the core's orphans, compared with their tokens);
 *  - a pause shorter than the claim does not lose a running attempt: its
 *    renewals go on after it, past running_ms, and its finish records the
 *    success;
 *  - the server restarted without its data in the middle of an attempt:
 *    the record is gone, so the attempt's finish is CERB_LOST (its claim was
 *    lost; nothing is written back), and a new attempt begins on the new
 *    server (the base and scope are made again).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"
#include "zk_util.h"

static cerb_client *open_client(const char *guard)
{
    char ex[256];
    snprintf(ex, sizeof ex, "guard = { %s };", guard ? guard : "keep_ms = 5000;");
    char *cfg = cerb_test_zk_config(NULL, "connect_timeout_ms = 500;", ex);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    return c;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int resume(void **state)
{
    (void)state;
    cerb_test_zk_resume(cerb_test_zk_port()); /* a failed case must not leave it stopped */
    return 0;
}

static void test_paused_server_policy(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL);
    char *key = test_name("pol");
    cerb_guard *g = (cerb_guard *)1;
    /* A first begin: the scope exists, the answer below is about the
     * record, not about making parents. */
    assert_int_equal(cerb_guard_begin(c, "pause", "warm", 4, NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    g = (cerb_guard *)1;
    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g), CERB_UNAVAILABLE);
    assert_null(g);
    int64_t took = cerb_test_now_ms() - t0;
    print_message("begin on a stopped server: UNAVAILABLE after %lld ms\n", (long long)took);
    assert_true(took < 2500); /* two requests of at most connect_timeout_ms */
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.on_unavailable = CERB_GUARD_ALLOW;
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_degraded(g), 1);
    assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);
    /* The creates sent while it was stopped land now: claims nobody
     * renews, deleted in the background, so a retry runs well before
     * running_ms (30 s). */
    cerb_status st;
    int64_t end = cerb_test_now_ms() + 8000;
    while ((st = cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g)) != CERB_OK &&
           cerb_test_now_ms() < end) {
        assert_true(st == CERB_BUSY || st == CERB_UNAVAILABLE);
        pause_ms(50);
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
    cerb_client *c = open_client("keep_ms = 5000; running_ms = 3000;");
    char *key = test_name("short");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    pause_ms(1500); /* the fault's length: a renewal falls in it */
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);
    /* Still ours well past running_ms: renewals went on after the pause. */
    while (cerb_test_now_ms() < t0 + 3000 + 3000) {
        cerb_status st = cerb_guard_begin(c, "pause", key, strlen(key), NULL, &h);
        assert_true(st == CERB_BUSY || st == CERB_UNAVAILABLE); /* never OK */
        if (h)
            cerb_guard_free(h);
        h = NULL;
        pause_ms(100);
    }
    assert_int_equal(cerb_guard_finish(g, 1, "kept", 4), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_begin(c, "pause", key, strlen(key), NULL, &h), CERB_DUPLICATE);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(c);
}

/* Does c's engine answer a begin again? */
static bool answers(void *ud)
{
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(ud, "restart-probe", "p", 1, NULL, &g);
    cerb_guard_free(g);
    return st == CERB_OK;
}

static void test_restart_without_data_mid_attempt(void **state)
{
    (void)state;
    cerb_client *a = open_client("keep_ms = 60000; running_ms = 3000;");
    char *key = test_name("restart");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(cerb_guard_begin(a, "restart", key, strlen(key), NULL, &g), CERB_OK);
    int port = cerb_test_zk_port();
    assert_int_equal(cerb_test_zk_servers("stop", port, 1), 0);
    assert_int_equal(cerb_test_zk_servers("start", port, 1), 0);
    /* The new server has no record: another client begins (making the
     * base and the scope again) and finishes first. */
    cerb_client *b = open_client("keep_ms = 60000;");
    cerb_status st;
    int64_t end = cerb_test_now_ms() + 15000;
    while ((st = cerb_guard_begin(b, "restart", key, strlen(key), NULL, &h)) != CERB_OK &&
           cerb_test_now_ms() < end)
        pause_ms(100);
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    cerb_guard_free(h);
    /* The first attempt's claim went with the data: once its client has a
     * session on the new server, its finish changes nothing and says so. */
    int64_t t_wait = cerb_test_now_ms();
    assert_wait_until(answers, a, 20000);
    print_message("the first client answers again after %lld ms\n",
                  (long long)(cerb_test_now_ms() - t_wait));
    assert_int_equal(cerb_guard_finish(g, 1, "old", 3), CERB_LOST);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_begin(a, "restart", key, strlen(key), NULL, &h), CERB_DUPLICATE);
    size_t len = 0;
    const void *r = cerb_guard_result(h, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(r, "new", 3);
    cerb_guard_free(h);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_paused_server_policy, resume),
        cmocka_unit_test_teardown(test_short_pause_keeps_the_attempt, resume),
        cmocka_unit_test_teardown(test_restart_without_data_mid_attempt, resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
