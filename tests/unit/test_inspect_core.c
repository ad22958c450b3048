/*
 * test_inspect_core.c — what the core adds around the engines' inspect
 * (core/inspect.c): an engine whose table has no inspect (the fault
 * engine's is a version-1 table) answers CERB_UNAVAILABLE "engine fault
 * cannot be inspected"; asking every engine (NULL) goes on past that
 * failure, returns it, and still hands over what the other engines said
 * (the partial results cerberus.h documents); entries carry their engine's
 * name, holder first.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "fault_engine.h"
#include "test_util.h"

static void test_engine_without_inspect(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = cerb_test_open("engines = (\"local\", \"fault\");\n");
    cerb_lock *l = cerb_test_handle(c, "inspect-core");
    assert_int_equal(cerb_lock_lock(l), CERB_OK); /* on local, the first */

    cerb_holder_info *v = (cerb_holder_info *)1;
    size_t n = 7;
    assert_int_equal(cerb_lock_inspect(c, "inspect-core", "fault", &v, &n), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "engine fault cannot be inspected"));
    assert_null(v);
    assert_int_equal(n, 0);

    /* Every engine: local answers, fault cannot; the answer is partial. */
    assert_int_equal(cerb_lock_inspect(c, "inspect-core", NULL, &v, &n), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "fault"));
    assert_int_equal(n, 1);
    assert_string_equal(v[0].engine, "local");
    assert_int_equal(v[0].waiting, 0);
    assert_int_equal(v[0].fence, cerb_lock_fencing_token(l) & ((UINT64_C(1) << 48) - 1));
    cerb_holders_free(v, n);

    /* Local alone is whole. */
    assert_int_equal(cerb_lock_inspect(c, "inspect-core", "local", &v, &n), CERB_OK);
    assert_int_equal(n, 1);
    cerb_holders_free(v, n);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_inspect(c, "inspect-core", "local", &v, &n), CERB_OK);
    assert_int_equal(n, 0);
    assert_null(v);
    cerb_lock_free(l);
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_without_inspect),
    };
    return cmocka_run_group_tests_name("inspect_core", tests, NULL, NULL);
}
