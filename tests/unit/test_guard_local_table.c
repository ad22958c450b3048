/*
 * test_guard_local_table.c — the local engine's in-process guard table under
 * many records: it grows with them (a begin does not walk a long chain), and
 * expired records are freed again by the operations that follow, so the
 * table goes back down. The engine's guard methods are called directly (no
 * client): the test is about the table, and 200 000 records through the
 * whole guard would take too long under the sanitizers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "engine.h"
#include "engine_local.h"
#include "test_util.h"

#define NRECORDS 200000
#define KEEP_MS 1500

extern const struct cerb_engine_ops cerb__local_engine_ops;

/* splitmix64: ids spread like the SHA-256 the guard makes, without the cost. */
static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static void make_rec(cerb_guard_rec *rec, uint64_t n)
{
    memset(rec, 0, sizeof *rec);
    rec->scope = "table";
    for (int i = 0; i < 4; i++)
        snprintf(rec->id + 16 * i, 17, "%016llx", (unsigned long long)mix(n * 4 + (uint64_t)i));
    snprintf(rec->token, sizeof rec->token, "%032llx", (unsigned long long)n);
    rec->running_ms = KEEP_MS;
}

static bool none_live(void *ud)
{
    (void)ud;
    return cerb__local_guard_count() == 0;
}

static void test_table_grows_and_shrinks(void **state)
{
    (void)state;
    cerb_engine *e = NULL;
    assert_int_equal(cerb__local_engine_ops.open(NULL, &e), CERB_OK);
    size_t stored0, buckets0;
    cerb__local_guard_stats(&stored0, &buckets0);
    assert_int_equal(stored0, 0);

    /* Many records, each claimed and finished with a short keep. */
    int64_t t0 = cerb_test_now_ms();
    size_t peak_buckets = 0;
    for (uint64_t n = 0; n < NRECORDS; n++) {
        cerb_guard_rec rec;
        cerb_grant g;
        void *res = NULL;
        size_t len = 0;
        make_rec(&rec, n);
        assert_int_equal(cerb__local_guard_begin(e, &rec, &g, &res, &len), CERB_OK);
        assert_int_equal(cerb__local_guard_finish(e, &rec, 1, "ok", 2, KEEP_MS, NULL), CERB_OK);
        if (n % 1024 == 1023) {
            size_t s, b;
            cerb__local_guard_stats(&s, &b);
            if (b > peak_buckets)
                peak_buckets = b;
        }
    }
    int64_t took = cerb_test_now_ms() - t0;
    size_t stored1, buckets1;
    cerb__local_guard_stats(&stored1, &buckets1);
    print_message("%d records in %lld ms: %zu stored, %zu buckets (peak %zu, from %zu)\n",
                  NRECORDS, (long long)took, stored1, buckets1, peak_buckets, buckets0);
    /* The table grew: at least 64 times its first size, and never more
     * than about one record a bucket on average while it was full. */
    assert_true(peak_buckets >= 64 * buckets0);
    if (took < KEEP_MS)
        assert_true(stored1 <= 2 * buckets1);

    /* A duplicate is still found among them while they last. */
    {
        cerb_guard_rec rec;
        cerb_grant g;
        void *res = NULL;
        size_t len = 0;
        make_rec(&rec, NRECORDS - 1);
        cerb_status st = cerb__local_guard_begin(e, &rec, &g, &res, &len);
        if (cerb_test_now_ms() - t0 < KEEP_MS) {
            assert_int_equal(st, CERB_DUPLICATE);
            assert_memory_equal(res, "ok", 2);
        }
        free(res);
    }

    /* Once they expire, the operations that follow free them: checks of
     * other ids, each sweeping a few buckets. Bounded in count (a full
     * sweep of every shard takes about buckets / SWEEP_BUCKETS checks) and
     * in time. */
    assert_wait_until(none_live, NULL, 10 * KEEP_MS);
    int64_t t1 = cerb_test_now_ms();
    uint64_t ops = 0;
    size_t stored2, buckets2;
    for (;;) {
        cerb__local_guard_stats(&stored2, &buckets2);
        if ((stored2 == 0 && buckets2 <= 4 * buckets0) || ops >= 4 * (uint64_t)NRECORDS)
            break;
        for (int i = 0; i < 256; i++, ops++) {
            cerb_guard_rec rec;
            cerb_guard_found found;
            make_rec(&rec, NRECORDS + ops);
            assert_int_equal(cerb__local_guard_check(e, &rec, &found), CERB_OK);
            assert_int_equal(found, CERB_GUARD_FOUND_NONE);
        }
    }
    print_message("freed after %llu checks in %lld ms: %zu stored, %zu buckets\n",
                  (unsigned long long)ops, (long long)(cerb_test_now_ms() - t1), stored2,
                  buckets2);
    assert_int_equal(stored2, 0);
    /* And the emptied table gave its buckets back. */
    assert_true(buckets2 <= 4 * buckets0);
    cerb__local_engine_ops.close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_grows_and_shrinks),
    };
    return cmocka_run_group_tests_name("guard_local_table", tests, NULL, NULL);
}
