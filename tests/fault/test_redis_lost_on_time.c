/*
 * test_redis_lost_on_time.c — a real Redis frozen with SIGSTOP while a client
 * holds hundreds of renewed locks there: every holder is told LOST within a
 * small margin of its deadline, although each renewal chunk now waits an op
 * timeout for an answer that never comes. (It used to be reported after all
 * chunks had timed out, one op timeout per 256 holds, seconds late.)
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#define NHOLDS 600
#define LEASE_MS 1500
#define MARGIN_MS 200

static _Atomic int64_t lost_at[NHOLDS];
static atomic_int lost_n;

static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    size_t i = (size_t)(uintptr_t)ud;
    int64_t zero = 0;
    if (atomic_compare_exchange_strong(&lost_at[i], &zero, cerb_test_now_ms()))
        atomic_fetch_add(&lost_n, 1);
}

static bool all_lost(void *ud)
{
    (void)ud;
    return atomic_load(&lost_n) == NHOLDS;
}

static void test_paused_redis_lost_on_time(void **state)
{
    (void)state;
    char *cfg = cerb_test_redis_config("op_timeout_ms = 1000;", NULL);
    assert_non_null(cfg);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    free(cfg);
    static cerb_lock *l[NHOLDS];
    char *prefix = test_name("lost-on-time");
    assert_non_null(prefix);
    for (size_t i = 0; i < NHOLDS; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s-%zu", prefix, i);
        cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
        o.lease_ms = LEASE_MS;
        o.renew = 1;
        assert_int_equal(cerb_lock_new(c, name, &o, &l[i]), CERB_OK);
        assert_int_equal(cerb_lock_on_lost(l[i], on_lost, (void *)(uintptr_t)i), CERB_OK);
        atomic_store(&lost_at[i], 0);
        assert_int_equal(cerb_lock_lock(l[i]), CERB_OK);
    }
    free(prefix);
    atomic_store(&lost_n, 0);

    /* Every renewal from here on goes unanswered: each hold's deadline is
     * at most a lease after the pause (its last renewal went before). */
    int64_t paused_at = cerb_test_now_ms();
    assert_int_equal(cerb_test_redis_pause(), 0);
    bool told = wait_until(all_lost, NULL, LEASE_MS + 8000);
    int64_t latest = 0;
    for (size_t i = 0; i < NHOLDS; i++)
        if (atomic_load(&lost_at[i]) > latest)
            latest = atomic_load(&lost_at[i]);
    assert_int_equal(cerb_test_redis_resume(), 0);

    assert_true(told);
    int64_t late = latest - (paused_at + LEASE_MS);
    if (late > MARGIN_MS)
        fail_msg("the last of %d holds was told LOST %lld ms after its deadline", NHOLDS,
                 (long long)late);
    for (size_t i = 0; i < NHOLDS; i++) {
        cerb_lock_unlock(l[i]);
        cerb_lock_free(l[i]);
    }
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paused_redis_lost_on_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
