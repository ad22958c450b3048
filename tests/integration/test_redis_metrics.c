/*
 * test_redis_metrics.c — cerb_metrics_text() after a scripted run, parsed by
 * Prometheus' own parser (tests/metrics/check_metrics.py, python3-prometheus-
 * client) and checked value by value: a client on redis then local does 5
 * acquisitions on redis, has one hold there lost (its key deleted behind its
 * back: the renewal finds it gone), is switched to local by hand, does 3
 * acquisitions there (one still held at the end), and one guard attempt and
 * its duplicate. Every counter, gauge and histogram count is what that run
 * must give; the histograms are also checked for shape (monotone buckets,
 * +Inf = count). A second case checks the text a fresh client gives, and
 * bad arguments.
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

static char prefix[64];

static cerb_client *client(void)
{
    char buf[768];
    snprintf(buf, sizeof buf,
             "engines = (\"redis\", \"local\");\n"
             "lock = { lease_ms = 900; };\n"
             "redis = { port = %d; prefix = \"%s\"; };\n",
             cerb_test_redis_port(), prefix);
    cerb_client *c = cerb_test_open(buf);
    assert_non_null(c);
    return c;
}

/* Write @text to a file and run the checker on it with @expect. */
static int check(const char *text, const char *const *expect, size_t n)
{
    char path[] = "/tmp/cerb-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    char script[1024];
    snprintf(script, sizeof script, "%s/tests/metrics/check_metrics.py", cerb_test_source_dir());
    const char *argv[64] = {cerb_test_python(), script, path};
    assert_true(n + 4 < sizeof argv / sizeof argv[0]);
    for (size_t i = 0; i < n; i++)
        argv[3 + i] = expect[i];
    int rc = cerb_test_run((char *const *)argv, 30000);
    unlink(path);
    return rc;
}

static void lock_unlock(cerb_client *c, const char *name)
{
    cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_free(l), CERB_OK);
}

static bool is_lost(void *ud) { return cerb_lock_state(ud) == CERB_LOCK_LOST; }

static void test_scripted_run(void **state)
{
    (void)state;
    cerb_client *c = client();
    char *name = test_name("m");
    for (int i = 0; i < 5; i++)
        lock_unlock(c, name);

    /* One hold lost: its key deleted on the server. */
    char *lname = test_name("lost");
    cerb_lock *l = cerb_test_handle(c, lname);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    redisContext *r = redisConnect("127.0.0.1", cerb_test_redis_port());
    assert_non_null(r);
    redisReply *rep = redisCommand(r, "DEL %s%s", prefix, lname);
    assert_non_null(rep);
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    redisFree(r);
    assert_wait_until(is_lost, l, 5000);
    assert_int_equal(cerb_lock_unlock(l), CERB_LOST);
    assert_int_equal(cerb_lock_free(l), CERB_OK);

    assert_string_equal(cerb_engine_switch_to(c, "local"), "local");
    char *lname2 = test_name("local");
    lock_unlock(c, lname2);
    lock_unlock(c, lname2);
    cerb_lock *held = cerb_test_handle(c, lname2);
    assert_int_equal(cerb_lock_lock(held), CERB_OK);

    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "metrics", "k", 1, NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "v", 1), CERB_OK);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    assert_int_equal(cerb_guard_begin(c, "metrics", "k", 1, NULL, &g), CERB_DUPLICATE);
    assert_int_equal(cerb_guard_free(g), CERB_OK);

    char *text = NULL;
    assert_int_equal(cerb_metrics_text(c, &text), CERB_OK);
    assert_non_null(text);
    print_message("%s", text);
    static const char *const expect[] = {
        "cerberus_acquisitions_total{engine=\"redis\"}=6",
        "cerberus_acquisitions_total{engine=\"local\"}=3",
        "cerberus_lost_holds_total{engine=\"redis\"}=1",
        "cerberus_lost_holds_total{engine=\"local\"}=0",
        "cerberus_engine_switches_total=1",
        "cerberus_engine_active{engine=\"local\"}=1",
        "cerberus_engine_active{engine=\"redis\"}=0",
        "cerberus_engine_breaker_state{engine=\"redis\",state=\"closed\"}=1",
        "cerberus_engine_breaker_state{engine=\"redis\",state=\"open\"}=0",
        "cerberus_holds=1",
        "cerberus_acquire_wait_seconds_count{engine=\"redis\"}=6",
        "cerberus_acquire_wait_seconds_count{engine=\"local\"}=3",
        "cerberus_hold_duration_seconds_count{engine=\"redis\"}=6",
        "cerberus_hold_duration_seconds_count{engine=\"local\"}=2",
        "cerberus_guard_begins_total{engine=\"local\",result=\"ok\"}=1",
        "cerberus_guard_begins_total{engine=\"local\",result=\"duplicate\"}=1",
        "cerberus_guard_begins_total{engine=\"local\",result=\"degraded\"}=0",
        "cerberus_guard_begins_total{engine=\"redis\",result=\"ok\"}=0",
        "cerberus_fencing_epoch=1",
    };
    int rc = check(text, expect, sizeof expect / sizeof expect[0]);
    cerb_free(text);
    assert_int_equal(rc, 0);

    /* The checker can fail: a wrong expectation is caught. */
    assert_int_equal(cerb_metrics_text(c, &text), CERB_OK);
    static const char *const wrong[] = {"cerberus_holds=2"};
    assert_int_equal(check(text, wrong, 1), 1);
    cerb_free(text);

    assert_int_equal(cerb_lock_unlock(held), CERB_OK);
    assert_int_equal(cerb_lock_free(held), CERB_OK);
    cerb_client_close(c);
    free(name), free(lname), free(lname2);
}

static void test_fresh_client_and_bad_args(void **state)
{
    (void)state;
    char *text = NULL;
    assert_int_equal(cerb_metrics_text(NULL, &text), CERB_EINVAL);
    assert_null(text);
    cerb_client *c = client();
    assert_int_equal(cerb_metrics_text(c, NULL), CERB_EINVAL);
    assert_int_equal(cerb_metrics_text(c, &text), CERB_OK);
    static const char *const expect[] = {
        "cerberus_acquisitions_total{engine=\"redis\"}=0",
        "cerberus_holds=0",
        "cerberus_engine_switches_total=0",
        "cerberus_engine_active{engine=\"redis\"}=1",
        "cerberus_acquire_wait_seconds_count{engine=\"redis\"}=0",
    };
    int rc = check(text, expect, sizeof expect / sizeof expect[0]);
    cerb_free(text);
    cerb_free(NULL);
    assert_int_equal(rc, 0);
    cerb_client_close(c);
}

int main(void)
{
    snprintf(prefix, sizeof prefix, "met%ld:", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scripted_run),
        cmocka_unit_test(test_fresh_client_and_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
