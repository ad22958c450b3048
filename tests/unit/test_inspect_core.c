/*
 * test_inspect_core.c — what the core adds around the engines' inspect
 * (core/inspect.c): an engine whose table has no inspect (the fault
 * engine's is a version-1 table) answers CERB_UNAVAILABLE "engine fault
 * cannot be inspected"; asking every engine (NULL) goes on past that
 * failure, returns it, and still hands over what the other engines said
 * (the partial results cerberus.h documents); entries carry their engine's
 * name, holder first. With local.dir the holder is the lock file's flock.
 */
#define _POSIX_C_SOURCE 200809L
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

/* With local.dir the holder is another open file's flock: seen as the
 * lock file, with the fence the file records. */
static void test_local_dir(void **state)
{
    (void)state;
    char dir[] = "/tmp/cerb-inspect-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cfg[256];
    snprintf(cfg, sizeof cfg, "engines = (\"local\");\nlocal = { dir = \"%s\"; };\n", dir);
    cerb_client *c = cerb_test_open(cfg);
    cerb_lock *l = cerb_test_handle(c, "inspect-dir");
    cerb_holder_info *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_lock_inspect(c, "inspect-dir", "local", &v, &n), CERB_OK);
    assert_int_equal(n, 0);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(cerb_lock_inspect(c, "inspect-dir", NULL, &v, &n), CERB_OK);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].waiting, 0);
    assert_true(strncmp(v[0].owner, dir, strlen(dir)) == 0);
    assert_string_equal(v[0].detail, "flock");
    assert_int_equal(v[0].ttl_ms, -1);
    assert_int_equal(v[0].fence, cerb_lock_fencing_token(l) & ((UINT64_C(1) << 48) - 1));
    cerb_holders_free(v, n);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_inspect(c, "inspect-dir", "local", &v, &n), CERB_OK);
    assert_int_equal(n, 0);
    cerb_lock_free(l);
    cerb_client_close(c);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_without_inspect),
        cmocka_unit_test(test_local_dir),
    };
    return cmocka_run_group_tests_name("inspect_core", tests, NULL, NULL);
}
