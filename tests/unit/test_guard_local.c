/*
 * test_guard_local.c — the idempotency guard on the local engine: the
 * engine-independent cases (guard_cases.h) with records under local.dir
 * (shared by processes, so the fork cases run), the in-process cases with
 * records in memory, the guard's configuration keys, and on_unavailable on
 * an engine that has no guard.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "engine_local.h"
#include "fault_engine.h"
#include "test_util.h"

static char dir[256];    /* "" = records in memory */

static char *guard_cfg(const char *guard_extra)
{
    char *out = NULL;
    int n;
    if (dir[0])
        n = asprintf(&out, "engines = (\"local\"); local = { dir = \"%s\"; };\n"
                           "guard = { keep_ms = 4000; %s };\n", dir, guard_extra ? guard_extra : "");
    else
        n = asprintf(&out, "engines = (\"local\");\nguard = { keep_ms = 4000; %s };\n",
                     guard_extra ? guard_extra : "");
    return n < 0 ? NULL : out;
}

/* Live records: in memory, or files under <dir>/guard whose expiry (ns on
 * CLOCK_BOOTTIME, 0 = never) has not passed. */
static size_t guard_records(void)
{
    if (!dir[0])
        return cerb__local_guard_count();
    char path[512];
    snprintf(path, sizeof path, "%s/guard", dir);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *de;
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    while ((de = readdir(d)) != NULL) {
        if (strlen(de->d_name) != 64)
            continue;
        char f[sizeof path + 2 + sizeof de->d_name], hdr[54] = {0};
        snprintf(f, sizeof f, "%s/%s", path, de->d_name);
        FILE *fp = fopen(f, "rb");
        if (!fp)
            continue;
        size_t got = fread(hdr, 1, 53, fp);
        fclose(fp);
        if (got < 53)
            continue;
        long long exp = strtoll(hdr + 33, NULL, 10);
        n += exp == 0 || exp > now;
    }
    closedir(d);
    return n;
}

#include "guard_cases.h"

static int setup_file(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/cerb-guard-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown_file(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    dir[0] = '\0';
    return system(cmd) == 0 ? 0 : -1;
}

static int setup_mem(void **state)
{
    (void)state;
    dir[0] = '\0';
    return 0;
}

/* ---- configuration ---- */

/*
 * A 200 ms claim begun while the renewer sleeps for a 60 s one (its renewal
 * 20 s away) is still held 1 s later: BUSY to a second caller. @suspend_ms:
 * a simulated suspend first, which moves the boot-time clock only.
 */
static void short_claim_stays_held(int64_t suspend_ms)
{
    cerb_client *c = NULL;
    char *cfg = guard_cfg(NULL);
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    free(cfg);
    char *klong = test_name("long"), *kshort = test_name("short");
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 60000;
    cerb_guard *gl = NULL, *gs = NULL, *other = NULL;
    assert_int_equal(cerb_guard_begin(c, "wake", klong, strlen(klong), &o, &gl), CERB_OK);
    /* Not observable: time for the renewer to go to sleep until the long
     * claim's renewal, so the short one must wake it. */
    cerb_test_let_time_pass(50);
    if (suspend_ms)
        cerb__clock_test_suspend(suspend_ms);
    o.running_ms = 200;
    assert_int_equal(cerb_guard_begin(c, "wake", kshort, strlen(kshort), &o, &gs), CERB_OK);
    int64_t until = cerb_test_now_ms() + 1000;
    while (cerb_test_now_ms() < until) {
        assert_int_equal(cerb_guard_begin(c, "wake", kshort, strlen(kshort), &o, &other),
                         CERB_BUSY);
        cerb_guard_free(other);
        other = NULL;
    }
    assert_int_equal(cerb_guard_finish(gs, 1, "s", 1), CERB_OK);
    assert_int_equal(cerb_guard_finish(gl, 1, "l", 1), CERB_OK);
    cerb_guard_free(gs);
    cerb_guard_free(gl);
    cerb_client_close(c);
    free(klong);
    free(kshort);
}

/*
 * A claim shorter than every one open wakes the sleeping renewer: it
 * sleeps until the earliest renewal it knows of, and is woken only for an
 * earlier one (not at every begin).
 */
static void test_guard_short_claim_wakes_renewer(void **state)
{
    (void)state;
    short_claim_stays_held(0);
}

/*
 * The same after a suspend: the renewer's sleep ends on the boot-time clock
 * but waits on the monotonic one, which stopped, so it sleeps on past its
 * deadline; a claim begun then must wake it (it did not when only an
 * earlier deadline woke the renewer: the claim lapsed and a second caller
 * got CERB_OK while the first still ran).
 */
static void test_guard_claim_after_suspend_wakes_renewer(void **state)
{
    (void)state;
    short_claim_stays_held(25000); /* past its wake-up (20 s), not the long claim's end */
}

static void test_guard_config(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "guard = {\n keep_ms = 0; };"), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "config:2: guard.keep_ms"));
    assert_int_equal(cerb_client_open_string(&c, "guard = { on_unavailable = \"maybe\"; };"),
                     CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "refuse"));
    assert_int_equal(cerb_client_open_string(&c, "guard = { running_ms = 5; };"), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "guard.running_ms"));
    assert_int_equal(cerb_client_open_string(&c, "guard = { max_rezult = 5; };"), CERB_ECONFIG);
    assert_int_equal(cerb_client_open_string(&c,
        "guard = { app = \"shop\"; running_ms = 1000; keep_ms = 3000; on_unavailable = \"allow\";"
        " max_result = 0; };"), CERB_OK);
    /* max_result = 0: only empty results. */
    cerb_guard *g = NULL;
    char *key = test_name("cfg");
    assert_int_equal(cerb_guard_begin(c, "cfg", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "x", 1), CERB_EINVAL);
    assert_int_equal(cerb_guard_finish(g, 1, "", 0), CERB_OK);
    cerb_guard_free(g);
    cerb_client_close(c);
    /* guard.app is part of the id: another app's same key is another
     * operation, while the same app's is a duplicate. */
    assert_int_equal(cerb_client_open_string(&c, "guard = { app = \"other\"; };"), CERB_OK);
    assert_int_equal(cerb_guard_begin(c, "cfg", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    cerb_client_close(c);
    assert_int_equal(cerb_client_open_string(&c, "guard = { app = \"shop\"; };"), CERB_OK);
    assert_int_equal(cerb_guard_begin(c, "cfg", key, strlen(key), NULL, &g), CERB_DUPLICATE);
    cerb_guard_free(g);
    cerb_client_close(c);
    free(key);
}

static void test_guard_reload(void **state)
{
    (void)state;
    char *path = cerb_test_write_config("guard = { app = \"a\"; keep_ms = 1000; };");
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    FILE *f = fopen(path, "w");
    fputs("guard = { app = \"a\"; keep_ms = 2000; max_result = 10; };", f);
    fclose(f);
    assert_int_equal(cerb_client_reload(c), CERB_OK);
    f = fopen(path, "w");
    fputs("guard = { app = \"b\"; };", f);
    fclose(f);
    assert_int_equal(cerb_client_reload(c), CERB_ECONFIG); /* app is immutable */
    assert_non_null(strstr(cerb_last_error(), "guard.app"));
    /* max_result = 10 applies to attempts begun after the reload. */
    cerb_guard *g = NULL;
    char *key = test_name("reload");
    assert_int_equal(cerb_guard_begin(c, "reload", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "01234567890", 11), CERB_EINVAL);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    free(key);
    cerb_client_close(c);
    cerb_test_remove_file(path);
}

/* ---- an engine without a guard: the policy decides ---- */

static void test_guard_engine_without_guard(void **state)
{
    (void)state;
    fault_engine_register(); /* a version-1 table: no guard methods */
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"fault\");"), CERB_OK);
    cerb_guard *g = (cerb_guard *)1;
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, NULL, &g), CERB_UNAVAILABLE);
    assert_null(g);
    assert_non_null(strstr(cerb_last_error(), "no idempotency guard"));
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.on_unavailable = CERB_GUARD_ALLOW;
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_degraded(g), 1);
    assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
    cerb_guard_free(g);
    /* The breaker was not told: a missing guard is not a failing engine. */
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "fault", &info), CERB_OK);
    assert_int_equal(info.failures, 0);
    cerb_client_close(c);
}

/* The processes of GUARD_CASES, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {GC_ROLE, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    const struct CMUnitTest file_cases[] = {GUARD_CASES};
    const struct CMUnitTest mem_cases[] = {
        cmocka_unit_test(test_guard_once_then_duplicate),
        cmocka_unit_test(test_guard_failure_then_retry_at_once),
        cmocka_unit_test(test_guard_threads_race),
        cmocka_unit_test(test_guard_keep_expiry),
        cmocka_unit_test(test_guard_result_limit),
        cmocka_unit_test(test_guard_bad_input),
        cmocka_unit_test(test_guard_close_ends_open_attempts),
        cmocka_unit_test(test_guard_config),
        cmocka_unit_test(test_guard_reload),
        cmocka_unit_test(test_guard_engine_without_guard),
        cmocka_unit_test(test_guard_short_claim_wakes_renewer),
        cmocka_unit_test(test_guard_no_records_left),
        /* last: the simulated suspend moves the clock for good */
        cmocka_unit_test(test_guard_claim_after_suspend_wakes_renewer),
    };
    int failed = cmocka_run_group_tests_name("guard_local_dir", file_cases, setup_file,
                                             teardown_file);
    failed += cmocka_run_group_tests_name("guard_local_memory", mem_cases, setup_mem, NULL);
    return failed;
}
