/*
 * test_selector.c — the active-engine rule with a fake clock: pinning,
 * failover to the first usable engine, failback only after
 * failback_after_ms of health (never when manual), half-open not usable,
 * nothing usable → stay.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "selector.h"

static struct cerb_sel_engine E[3];

static struct cerb_sel_in in_at(int current, int pinned, bool auto_fb, int64_t now)
{
    struct cerb_sel_in in = {3, E, current, pinned, auto_fb, 60000, now};
    return in;
}

static void healthy_all(void)
{
    for (int i = 0; i < 3; i++)
        E[i] = (struct cerb_sel_engine){true, CERB_BREAKER_CLOSED, 0};
}

static void test_stays_on_healthy_primary(void **state)
{
    (void)state;
    healthy_all();
    const char *why;
    struct cerb_sel_in in = in_at(0, -1, true, 1000);
    assert_int_equal(cerb__select(&in, &why), 0);
    assert_null(why);
}

static void test_fails_over_to_first_usable(void **state)
{
    (void)state;
    healthy_all();
    const char *why;
    E[0].st = CERB_BREAKER_OPEN;
    struct cerb_sel_in in = in_at(0, -1, true, 1000);
    assert_int_equal(cerb__select(&in, &why), 1);
    assert_string_equal(why, "breaker open");
    E[1].st = CERB_BREAKER_HALF_OPEN; /* not usable either */
    assert_int_equal(cerb__select(&in, &why), 2);
    E[2].open = false;
    assert_int_equal(cerb__select(&in, &why), 0); /* nothing usable: stay */
    assert_null(why);
}

static void test_failback_waits(void **state)
{
    (void)state;
    healthy_all();
    const char *why;
    E[0].healthy_since_ms = 10000; /* primary closed again at t=10 s */
    struct cerb_sel_in in = in_at(1, -1, true, 10000 + 59999);
    assert_int_equal(cerb__select(&in, &why), 1);
    in.now_ms = 10000 + 60000;
    assert_int_equal(cerb__select(&in, &why), 0);
    assert_string_equal(why, "failback: healthy again");
    /* Manual failback: never by itself. */
    in = in_at(1, -1, false, 10000 + 600000);
    assert_int_equal(cerb__select(&in, &why), 1);
}

static void test_pinned(void **state)
{
    (void)state;
    healthy_all();
    const char *why;
    E[2].st = CERB_BREAKER_OPEN;
    struct cerb_sel_in in = in_at(0, 2, true, 0);
    assert_int_equal(cerb__select(&in, &why), 2); /* even when unhealthy */
    assert_string_equal(why, "pinned");
    in.current = 2;
    assert_int_equal(cerb__select(&in, &why), 2);
    assert_null(why);
}

/* A pin on an engine that has no instance (it would not open) is a wish:
 * never selected until it opens (issue 10, item 1: NULL engine). */
static void test_pinned_unopened_is_a_wish(void **state)
{
    (void)state;
    healthy_all();
    const char *why;
    E[0].open = false;
    struct cerb_sel_in in = in_at(1, 0, true, 0);
    assert_int_equal(cerb__select(&in, &why), 1);
    assert_null(why);
    E[1].st = CERB_BREAKER_OPEN; /* until it opens, the automatic rules */
    assert_int_equal(cerb__select(&in, &why), 2);
    E[0].open = true;
    assert_int_equal(cerb__select(&in, &why), 0);
    assert_string_equal(why, "pinned");
}

static void test_disabled_is_usable(void **state)
{
    (void)state;
    healthy_all();
    const char *why;
    E[0].st = CERB_BREAKER_DISABLED;
    struct cerb_sel_in in = in_at(0, -1, true, 0);
    assert_int_equal(cerb__select(&in, &why), 0);
    E[0].st = CERB_BREAKER_FORCED_OPEN;
    assert_int_equal(cerb__select(&in, &why), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stays_on_healthy_primary),
        cmocka_unit_test(test_fails_over_to_first_usable),
        cmocka_unit_test(test_failback_waits),
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_pinned_unopened_is_a_wish),
        cmocka_unit_test(test_disabled_is_usable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
