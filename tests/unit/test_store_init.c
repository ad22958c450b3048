/*
 * test_store_init.c — cerb_store_init() without a server: its argument
 * checks, a bad file (no reports, the file's error), and engines that need
 * nothing before their first use (the local engine of the defaults, and a
 * file naming it) answer "nothing to do" with CERB_OK, without connecting
 * anywhere. Redis is covered against real servers by
 * tests/integration/test_redis_init_*.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

static void test_arguments(void **state)
{
    (void)state;
    cerb_store_report dummy;
    cerb_store_report *v = &dummy;
    size_t n = 7;
    assert_int_equal(cerb_store_init(NULL, 0, NULL, &n), CERB_EINVAL);
    assert_int_equal(n, 0);
    assert_int_equal(cerb_store_init(NULL, 0, &v, NULL), CERB_EINVAL);
    assert_null(v);
    assert_int_equal(cerb_store_init(NULL, 0x80, &v, &n), CERB_EINVAL);
    assert_null(v);
    assert_non_null(strstr(cerb_last_error(), "flags"));
    cerb_store_reports_free(NULL, 0);
}

static void test_defaults_need_nothing(void **state)
{
    (void)state;
    cerb_store_report *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_store_init(NULL, CERB_STORE_INIT_FORCE, &v, &n), CERB_OK);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].engine, "local");
    assert_int_equal(v[0].result, CERB_STORE_NOTHING);
    assert_int_equal(v[0].status, CERB_OK);
    assert_non_null(strstr(v[0].text, "local: nothing to do"));
    cerb_store_reports_free(v, n);
}

static void test_bad_file(void **state)
{
    (void)state;
    char *path = cerb_test_write_config("engines = (\"local\");\nbogus = 1;\n");
    assert_non_null(path);
    cerb_store_report *v = NULL;
    size_t n = 3;
    assert_int_equal(cerb_store_init(path, 0, &v, &n), CERB_ECONFIG);
    assert_null(v);
    assert_int_equal(n, 0);
    assert_non_null(strstr(cerb_last_error(), ":2:"));
    cerb_test_remove_file(path);
}

static void test_file_with_local(void **state)
{
    (void)state;
    char *path = cerb_test_write_config("engines = (\"local\");\n");
    assert_non_null(path);
    cerb_store_report *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_store_init(path, 0, &v, &n), CERB_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].result, CERB_STORE_NOTHING);
    cerb_store_reports_free(v, n);
    cerb_test_remove_file(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_defaults_need_nothing),
        cmocka_unit_test(test_bad_file),
        cmocka_unit_test(test_file_with_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
