/*
 * test_oom_loop.c — allocation failure at every position (SQLite style):
 * for N = 1, 2, … fail the Nth allocation of a whole client life cycle (open,
 * new, lock, inspect, reentrant lock, unlock, multilock, free, close) and check that
 * each step either succeeds or fails cleanly with CERB_ENOMEM, that nothing
 * leaks (LSan runs on this suite) and nothing crashes, until a run sees no
 * failure at all.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "alloc.h"
#include "cerberus.h"

static int ok_or_nomem(cerb_status st)
{
    return st == CERB_OK || st == CERB_ENOMEM;
}

/* One life cycle; returns how many steps failed. */
static int cycle(const char *cfg_text)
{
    cerb_client *c = NULL;
    cerb_lock *a = NULL, *b = NULL;
    int failed = 0;
    cerb_status st;

    st = cfg_text ? cerb_client_open_string(&c, cfg_text) : cerb_client_open(&c, NULL);
    assert_true(ok_or_nomem(st) || st == CERB_ECONFIG);
    if (st != CERB_OK) {
        assert_null(c);
        return 1;
    }
    st = cerb_lock_new(c, "oom-a", NULL, &a);
    assert_true(ok_or_nomem(st));
    failed += st != CERB_OK;
    st = cerb_lock_new(c, "oom-b", NULL, &b);
    assert_true(ok_or_nomem(st));
    failed += st != CERB_OK;
    if (a) {
        st = cerb_lock_lock(a);
        assert_true(ok_or_nomem(st));
        failed += st != CERB_OK;
        if (st == CERB_OK) {
            /* Inspection while held: the holder, or ENOMEM and nothing. */
            cerb_holder_info *v = NULL;
            size_t n = 0;
            cerb_status si = cerb_lock_inspect(c, "oom-a", NULL, &v, &n);
            assert_true(ok_or_nomem(si));
            failed += si != CERB_OK;
            assert_int_equal(n, si == CERB_OK ? 1 : 0);
            assert_true(si == CERB_OK || v == NULL);
            cerb_holders_free(v, n);
            assert_int_equal(cerb_lock_lock(a), CERB_OK); /* reentry allocates nothing */
            assert_int_equal(cerb_lock_unlock(a), CERB_OK);
            assert_int_equal(cerb_lock_unlock(a), CERB_OK);
        }
    }
    if (a && b) {
        cerb_lock *set[] = {b, a};
        st = cerb_multilock_lock(set, 2, 100);
        assert_true(ok_or_nomem(st));
        failed += st != CERB_OK;
        if (st == CERB_OK)
            assert_int_equal(cerb_multilock_unlock(set, 2), CERB_OK);
    }
    assert_int_equal(cerb_lock_free(a), CERB_OK);
    assert_int_equal(cerb_lock_free(b), CERB_OK);
    cerb_client_close(c);
    return failed;
}

static void run_loop(const char *cfg_text)
{
    long n;
    for (n = 1; n < 10000; n++) {
        cerb__alloc_fail_after(n, 0);
        int failed = cycle(cfg_text);
        long injected = cerb__alloc_fail_after(0, 0);
        if (injected == 0) {
            assert_int_equal(failed, 0);
            break;
        }
    }
    assert_true(n > 3); /* the cycle does allocate: the loop really ran */
    assert_true(n < 10000);
}

static void test_oom_defaults(void **state)
{
    (void)state;
    run_loop(NULL);
}

static void test_oom_with_config_text(void **state)
{
    (void)state;
    run_loop("engines = (\"local\");\nlock = { lease_ms = 5000; };\n");
}

static void test_oom_persistent(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    cerb__alloc_fail_after(1, 1);
    assert_int_equal(cerb_client_open(&c, NULL), CERB_ENOMEM);
    assert_null(c);
    cerb__alloc_fail_after(0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_defaults),
        cmocka_unit_test(test_oom_with_config_text),
        cmocka_unit_test(test_oom_persistent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
