/*
 * test_status.c — every status code has a distinct name and a text, values
 * outside the list are named "unknown", and cerb_last_error() is per thread.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"

static void test_names_complete_and_distinct(void **state)
{
    (void)state;
    assert_int_equal(CERB_OK, 0);
    for (int i = 0; i < CERB_STATUS_COUNT; i++) {
        const char *n = cerb_status_name((cerb_status)i);
        const char *t = cerb_strerror((cerb_status)i);
        assert_non_null(n);
        assert_non_null(t);
        assert_string_not_equal(n, "UNKNOWN");
        assert_string_not_equal(t, "unknown status");
        assert_true(strlen(t) > 3);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(n, cerb_status_name((cerb_status)j));
    }
    assert_string_equal(cerb_status_name(CERB_BUSY), "BUSY");
    assert_string_equal(cerb_status_name((cerb_status)CERB_STATUS_COUNT), "UNKNOWN");
    assert_string_equal(cerb_strerror((cerb_status)-1), "unknown status");
    assert_string_equal(cerb_strerror((cerb_status)9999), "unknown status");
}

static void *other_thread(void *arg)
{
    (void)arg;
    cerb_lock *l = NULL;
    /* A failing call here sets this thread's message only. */
    cerb_lock_new(NULL, "x", NULL, &l);
    return strstr(cerb_last_error(), "bad client") ? (void *)1 : NULL;
}

static void test_last_error_is_thread_local(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    cerb_lock *l = NULL;
    assert_int_equal(cerb_client_open(&c, NULL), CERB_OK);
    assert_int_equal(cerb_lock_new(c, "", NULL, &l), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "empty"));
    pthread_t t;
    void *ret = NULL;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, &ret);
    assert_non_null(ret);
    assert_non_null(strstr(cerb_last_error(), "empty")); /* ours is untouched */
    cerb_client_close(c);
}

static void test_log_level_checked(void **state)
{
    (void)state;
    assert_int_equal(cerb_log_set(NULL, NULL, (cerb_log_level)42), CERB_EINVAL);
    assert_int_equal(cerb_log_set(NULL, NULL, CERB_LOG_WARN), CERB_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_complete_and_distinct),
        cmocka_unit_test(test_last_error_is_thread_local),
        cmocka_unit_test(test_log_level_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
