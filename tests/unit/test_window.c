/*
 * test_window.c — the sliding failure-rate window (failover/window.c) against
 * a fake clock: results count while they are inside window_ms and fall out
 * after it, long idle gaps clear everything at once, late timestamps and
 * negative times are handled, reset forgets, and a random run agrees with a
 * brute-force model that keeps every sample.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "window.h"

static uint64_t calls_at(struct cerb_window *w, int64_t now)
{
    uint64_t c = 0;
    cerb__window_counts(w, now, &c, NULL);
    return c;
}

static uint64_t fails_at(struct cerb_window *w, int64_t now)
{
    uint64_t f = 0;
    cerb__window_counts(w, now, NULL, &f);
    return f;
}

static void test_empty_and_add(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 10000, 0);
    assert_int_equal(w.nbuckets, CERB_WINDOW_BUCKETS);
    assert_int_equal(w.bucket_ms, 1000);
    assert_int_equal(calls_at(&w, 0), 0);
    assert_int_equal(fails_at(&w, 0), 0);
    cerb__window_add(&w, 0, true);
    cerb__window_add(&w, 10, false);
    cerb__window_add(&w, 2500, true);
    cerb__window_add(&w, 2600, false);
    cerb__window_add(&w, 9999, false);
    uint64_t c = 99, f = 99;
    cerb__window_counts(&w, 9999, &c, &f);
    assert_int_equal(c, 5);
    assert_int_equal(f, 2);
    cerb__window_counts(&w, 9999, NULL, NULL); /* both outs optional */
}

/* A result stays while now < t + window − bucket and is gone at t + window:
 * bucket 0 = [0, 1000) leaves at 10000, bucket 1 at 11000. */
static void test_results_fall_out_after_window(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 10000, 0);
    cerb__window_add(&w, 500, true);  /* bucket 0 */
    cerb__window_add(&w, 1000, true); /* bucket 1 */
    cerb__window_add(&w, 1999, false);
    assert_int_equal(fails_at(&w, 9000), 2);  /* 500 + window − bucket: still in */
    assert_int_equal(fails_at(&w, 9999), 2);
    assert_int_equal(fails_at(&w, 10000), 1); /* t=500 gone, no later than t + window */
    assert_int_equal(calls_at(&w, 10000), 2);
    assert_int_equal(fails_at(&w, 10999), 1);
    assert_int_equal(fails_at(&w, 11000), 0);
    assert_int_equal(calls_at(&w, 11000), 0);
    /* New results after the slide are counted normally. */
    cerb__window_add(&w, 11000, true);
    assert_int_equal(fails_at(&w, 11000), 1);
    assert_int_equal(calls_at(&w, 20999), 1);
    assert_int_equal(calls_at(&w, 21000), 0);
}

/* Reading the window at intermediate times must not change what it counts
 * later: the slide is the same whether it happens in steps or at once. */
static void test_slide_in_steps_equals_slide_at_once(void **state)
{
    (void)state;
    struct cerb_window a, b;
    cerb__window_init(&a, 10000, 0);
    cerb__window_init(&b, 10000, 0);
    for (int64_t t = 0; t < 10000; t += 100) {
        cerb__window_add(&a, t, t % 300 == 0);
        cerb__window_add(&b, t, t % 300 == 0);
    }
    for (int64_t t = 10000; t <= 15500; t += 7)
        (void)calls_at(&a, t);
    uint64_t ca, fa, cb, fb;
    cerb__window_counts(&a, 15500, &ca, &fa);
    cerb__window_counts(&b, 15500, &cb, &fb);
    assert_int_equal(ca, cb);
    assert_int_equal(fa, fb);
    assert_int_equal(ca, 40); /* buckets 6..9 = t 6000..9900, 10 calls each */
}

/* An idle gap of a whole window or more clears every bucket at once, in
 * O(1): a gap of 10^15 ms must neither hang nor leave stale counts. A gap one
 * bucket short keeps the newest bucket. */
static void test_long_gap_clears(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 10000, 0);
    for (int i = 0; i < 10; i++)
        cerb__window_add(&w, i * 1000, true);
    assert_int_equal(fails_at(&w, 9000), 10);
    assert_int_equal(fails_at(&w, 18999), 1); /* only bucket 9 left */
    assert_int_equal(fails_at(&w, 19000), 0);
    cerb__window_add(&w, 19000, true);
    cerb__window_add(&w, INT64_C(1000000000000000), true);
    assert_int_equal(calls_at(&w, INT64_C(1000000000000000)), 1);
    assert_int_equal(fails_at(&w, INT64_C(1000000000000000)), 1);
}

static void test_reset_forgets(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 10000, 0);
    for (int i = 0; i < 50; i++)
        cerb__window_add(&w, i * 10, i % 2);
    assert_int_equal(calls_at(&w, 500), 50);
    cerb__window_reset(&w, 600);
    assert_int_equal(calls_at(&w, 600), 0);
    assert_int_equal(fails_at(&w, 600), 0);
    cerb__window_add(&w, 700, true);
    assert_int_equal(calls_at(&w, 700), 1);
    assert_int_equal(fails_at(&w, 700), 1);
    /* Nothing from before the reset reappears as the window slides. */
    assert_int_equal(calls_at(&w, 9999), 1);
    assert_int_equal(calls_at(&w, 10000), 0);
}

/* A timestamp older than one already seen counts in the newest bucket, and
 * leaves with it: totals stay consistent. */
static void test_late_timestamp_counts_in_head(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 10000, 0);
    cerb__window_add(&w, 5000, false);
    cerb__window_add(&w, 100, true); /* late: goes to bucket 5, not bucket 0 */
    assert_int_equal(fails_at(&w, 5000), 1);
    assert_int_equal(fails_at(&w, 10000), 1); /* bucket 0 would have left here */
    assert_int_equal(fails_at(&w, 14999), 1);
    assert_int_equal(fails_at(&w, 15000), 0);
    assert_int_equal(calls_at(&w, 15000), 0);
    /* Reading at an older time changes nothing either. */
    cerb__window_add(&w, 15000, true);
    assert_int_equal(fails_at(&w, 1), 1);
}

static void test_small_and_odd_windows(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 5, 0); /* 5 buckets of 1 ms */
    assert_int_equal(w.nbuckets, 5);
    assert_int_equal(w.bucket_ms, 1);
    cerb__window_add(&w, 0, true);
    assert_int_equal(fails_at(&w, 4), 1);
    assert_int_equal(fails_at(&w, 5), 0);

    cerb__window_init(&w, 0, 0); /* taken as 1 ms */
    assert_int_equal(w.nbuckets, 1);
    assert_int_equal(w.bucket_ms, 1);
    cerb__window_add(&w, 7, true);
    assert_int_equal(fails_at(&w, 7), 1);
    assert_int_equal(fails_at(&w, 8), 0);

    /* 10005 ms: buckets of 1000 ms, so the window spans 10000 <= 10005. */
    cerb__window_init(&w, 10005, 0);
    assert_int_equal(w.bucket_ms, 1000);
    cerb__window_add(&w, 0, true);
    assert_int_equal(fails_at(&w, 9999), 1);
    assert_int_equal(fails_at(&w, 10000), 0);
}

static void test_negative_times(void **state)
{
    (void)state;
    struct cerb_window w;
    cerb__window_init(&w, 10000, -20000);
    cerb__window_add(&w, -15500, true); /* bucket -16 = [-16000, -15000) */
    cerb__window_add(&w, -1, true);     /* bucket -1 */
    assert_int_equal(fails_at(&w, -1), 1); /* -15500 left at -6000 */
    assert_int_equal(fails_at(&w, 8999), 1);
    assert_int_equal(fails_at(&w, 9000), 0);
}

/* Brute force model: every sample kept with its time; a sample counts iff its
 * bucket is one of the last nbuckets (the documented granularity), which
 * implies now − t < window. */
struct sample {
    int64_t t;
    bool failed;
};

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static void test_random_run_matches_model(void **state)
{
    (void)state;
    enum { N = 20000 };
    struct sample *s = calloc(N, sizeof *s);
    assert_non_null(s);
    const int64_t windows[] = {100, 1000, 10000, 12345, 7};
    srand(42);
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
        struct cerb_window w;
        int64_t win = windows[wi];
        int64_t t = -500;
        cerb__window_init(&w, win, t);
        int n = 0;
        for (int i = 0; i < N; i++) {
            int r = rand() % 100;
            /* mostly small steps, sometimes a long pause */
            t += r < 90 ? rand() % (win / 10 + 2) : rand() % (3 * win);
            bool failed = rand() % 3 == 0;
            if (rand() % 4 != 0) {
                cerb__window_add(&w, t, failed);
                s[n].t = t;
                s[n].failed = failed;
                n++;
            }
            uint64_t c, f, mc = 0, mf = 0;
            cerb__window_counts(&w, t, &c, &f);
            for (int k = n - 1; k >= 0; k--) {
                if (floor_div(t, w.bucket_ms) - floor_div(s[k].t, w.bucket_ms) >= w.nbuckets)
                    break;
                assert_true(t - s[k].t < win);
                mc++;
                mf += s[k].failed;
            }
            assert_int_equal(c, mc);
            assert_int_equal(f, mf);
        }
    }
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_and_add),
        cmocka_unit_test(test_results_fall_out_after_window),
        cmocka_unit_test(test_slide_in_steps_equals_slide_at_once),
        cmocka_unit_test(test_long_gap_clears),
        cmocka_unit_test(test_reset_forgets),
        cmocka_unit_test(test_late_timestamp_counts_in_head),
        cmocka_unit_test(test_small_and_odd_windows),
        cmocka_unit_test(test_negative_times),
        cmocka_unit_test(test_random_run_matches_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
