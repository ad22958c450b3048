/*
 * test_renew_backlog.c — the renewer (core/watchdog.c) behind: more
 * renewals due than one engine call takes, for longer than a renewal
 * period. As long as it renews every hold once a lease, none may be lost:
 * the holds whose deadlines come first must go first, whatever their
 * place in the client's list.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cerberus.h"
#include "fault_engine.h"
#include "test_util.h"

/* Each batch is a 300 ms round trip. 4 000 holds on a 3 s lease want
 * 4 000 renewals a second at one every lease/3, so the renewer is behind;
 * but each hold needs only one within its lease (1 330 a second). With
 * 256 holds to a call, taken in list order, the renewer managed 850 a
 * second, and 2 720 of the 4 000 ran out. */
enum { HOLDS = 4000, LEASE_MS = 3000, ROUND_TRIP_MS = 300 };

static cerb_hold *holds[HOLDS];

static int count_lost(void)
{
    int n = 0;
    for (int i = 0; i < HOLDS; i++)
        n += cerb_hold_state(holds[i]) == CERB_LOCK_LOST;
    return n;
}

static void test_backlog_loses_nothing(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = NULL;
    char cfg[128];
    snprintf(cfg, sizeof cfg, "engines = (\"faultbatch\");\nlock = { lease_ms = %d; };\n",
             LEASE_MS);
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    fault_engine_delay(FAULT_RENEW, ROUND_TRIP_MS, false);
    for (int i = 0; i < HOLDS; i++) {
        char name[32];
        snprintf(name, sizeof name, "backlog-%d", i);
        cerb_lock *l = NULL;
        assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
        assert_int_equal(cerb_lock_acquire(l, 0, NULL, &holds[i]), CERB_OK);
        cerb_lock_free(l);
    }
    /* Three leases behind: nothing may be lost (LOST is final, so one
     * look at the end sees every loss). */
    cerb_test_let_time_pass(3 * LEASE_MS);
    int n_lost = count_lost();
    print_message("%ld batches; %d of %d holds lost\n", fault_engine_batch_calls(), n_lost,
                  HOLDS);
    fault_engine_reset();
    for (int i = 0; i < HOLDS; i++)
        cerb_hold_free(holds[i]);
    cerb_client_close(c);
    assert_int_equal(n_lost, 0);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backlog_loses_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
