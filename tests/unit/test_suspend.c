/*
 * test_suspend.c — lease deadlines run while the machine sleeps. The servers'
 * leases keep running during a suspend, so a hold whose lease ran out while
 * the machine slept must be LOST as soon as it wakes, not a lease later.
 * cerb__clock_test_suspend() simulates the suspend: the boot-time clock jumps
 * ahead, the monotonic one does not.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "test_util.h"

static atomic_int lost_calls;

static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

static bool lost_seen(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void hold_through_suspend(int renew)
{
    cerb_client *c = NULL;
    cerb_lock *l = NULL;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 3000;
    o.renew = renew;
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_client_open(&c, NULL), CERB_OK);
    assert_int_equal(cerb_lock_new(c, renew ? "suspend-renew" : "suspend-once", &o, &l), CERB_OK);
    assert_int_equal(cerb_lock_on_lost(l, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);

    cerb__clock_test_suspend(5000); /* asleep longer than the lease */

    /* At once: the deadline is the truth, whatever the renewal thread is
     * doing; and the holder is told within the renewal thread's wake-up. */
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_LOST);
    assert_wait_until(lost_seen, NULL, 1500);
    assert_int_equal(cerb_lock_unlock(l), CERB_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);
    cerb_lock_free(l);
    cerb_client_close(c);
}

static void test_hold_lost_after_suspend(void **state)
{
    (void)state;
    hold_through_suspend(0);
}

static void test_renewed_hold_lost_after_suspend(void **state)
{
    (void)state;
    hold_through_suspend(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hold_lost_after_suspend),
        cmocka_unit_test(test_renewed_hold_lost_after_suspend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
