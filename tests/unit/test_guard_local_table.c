/*
 * test_guard_local_table.c — the local engine's in-process guard table under
 * many records: it grows with them (a begin does not walk a long chain), and
 * expired records are freed again by the operations that follow, so the
 * table goes back down; and threads filling it at once (shards growing
 * under their own locks) each find every other thread's records. The engine's guard methods are called directly (no
 * client): the test is about the table, and 200 000 records through the
 * whole guard would take too long under the sanitizers.
 */
#include <pthread.h>
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

/* ---- threads: claims made at once, seen by the others, deleted ---- */

#define NTHREADS 4
#define PER_THREAD 20000

static cerb_engine *shared_e;
static pthread_barrier_t phase;

static void thread_rec(cerb_guard_rec *rec, int t, int i)
{
    make_rec(rec, (uint64_t)(t + 1) * 1000000 + (uint64_t)i);
    rec->running_ms = 60000;
}

/* Returns NULL when every step answered as it should, else what did not. */
static void *claimer(void *arg)
{
    int t = (int)(intptr_t)arg;
    const char *bad = NULL;
    for (int i = 0; i < PER_THREAD && !bad; i++) {
        cerb_guard_rec rec;
        cerb_grant g;
        void *res = NULL;
        size_t len = 0;
        thread_rec(&rec, t, i);
        if (cerb__local_guard_begin(shared_e, &rec, &g, &res, &len) != CERB_OK)
            bad = "claim";
    }
    pthread_barrier_wait(&phase);
    /* The next thread's claims: another's, both to a begin and a check. */
    int o = (t + 1) % NTHREADS;
    for (int i = 0; i < PER_THREAD && !bad; i++) {
        cerb_guard_rec rec;
        cerb_grant g;
        cerb_guard_found found;
        void *res = NULL;
        size_t len = 0;
        thread_rec(&rec, o, i);
        memset(rec.token, 'f', 32); /* not the owner's token */
        if (cerb__local_guard_begin(shared_e, &rec, &g, &res, &len) != CERB_BUSY)
            bad = "another's claim not busy";
        else if (cerb__local_guard_check(shared_e, &rec, &found) != CERB_OK ||
                 found != CERB_GUARD_FOUND_OTHER)
            bad = "another's claim not found";
    }
    pthread_barrier_wait(&phase);
    for (int i = 0; i < PER_THREAD && !bad; i++) {
        cerb_guard_rec rec;
        thread_rec(&rec, t, i);
        if (cerb__local_guard_finish(shared_e, &rec, 0, NULL, 0, 0, NULL) != CERB_OK)
            bad = "delete";
    }
    return (void *)bad;
}

static void test_table_threads(void **state)
{
    (void)state;
    size_t stored0, buckets0;
    cerb__local_guard_stats(&stored0, &buckets0);
    assert_int_equal(cerb__local_engine_ops.open(NULL, &shared_e), CERB_OK);
    assert_int_equal(pthread_barrier_init(&phase, NULL, NTHREADS), 0);
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, claimer, (void *)(intptr_t)t), 0);
    const char *bad[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        void *r = NULL;
        assert_int_equal(pthread_join(th[t], &r), 0);
        bad[t] = r;
    }
    pthread_barrier_destroy(&phase);
    cerb__local_engine_ops.close(shared_e);
    for (int t = 0; t < NTHREADS; t++)
        if (bad[t])
            fail_msg("thread %d: %s", t, bad[t]);
    /* Deletes free at once: nothing of theirs is left. */
    size_t stored1, buckets1;
    cerb__local_guard_stats(&stored1, &buckets1);
    assert_int_equal(stored1, stored0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_grows_and_shrinks),
        cmocka_unit_test(test_table_threads),
    };
    return cmocka_run_group_tests_name("guard_local_table", tests, NULL, NULL);
}
