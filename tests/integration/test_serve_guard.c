/*
 * test_serve_guard.c — the idempotency guard over `cerberus serve`
 * (serve/serve_guard.c) in-process on a temporary unix socket, spoken to
 * with libcurl, on the built-in "local" engine (and on the "gfault" test
 * engine, which makes guard calls fail on purpose):
 *
 *  - begin runs (an attempt id), a second begin is 409 BUSY, a finish
 *    stores the result, a third begin is a duplicate with it, a second
 *    finish of the attempt is 404; a failed finish lets a retry run;
 *  - bytes that are not UTF-8 come back as result_base64;
 *  - an attempt nobody finishes nor keeps alive is freed after its window
 *    (a retry runs); keepalives keep it (others stay BUSY);
 *  - a stop frees the open attempts;
 *  - scope and key are percent-decoded once (libmicrohttpd's decoding): a
 *    key may hold '/' as %2F, "%2541" is the key "%41", not "A";
 *  - a bad body is 400 and changes nothing (no claim, the attempt open);
 *    a finish for another scope or key is 404 and leaves it open;
 *  - a claim lost (renewals failing, gfault) makes keepalive say "lost"
 *    and the finish 410 LOST; a success the engine did not confirm is 503
 *    with "open": true, and finishing again stores it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "cerberus.h"
#include "guard_fault_engine.h"
#include "serve.h"
#include "serve_http.h"
#include "test_util.h"

struct fixture {
    char dir[64];
    char sock[128];
    cerb_client *client;
    struct cerb__serve *serve;
};

/* One request (the path sent as it is); the code and parsed JSON body. */
static struct serve_http_reply request(struct fixture *f, const char *method, const char *path,
                            const char *body)
{
    struct serve_http_reply r;
    CURLcode rc = serve_http_try(f->sock, 0, NULL, method, path, body, false, &r);

    if (rc != CURLE_OK)
        fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    if (!r.body)
        fail_msg("%s %s: not JSON (HTTP %ld)", method, path, r.code);
    return r;
}

static const char *str(const struct serve_http_reply *r, const char *key)
{
    const char *v = json_string_value(json_object_get(r->body, key));
    return v ? v : "";
}

static int start(void **state, const char *config)
{
    struct fixture *f = calloc(1, sizeof *f);
    char err[256];

    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/cerb-serve-guard-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/serve.sock", f->dir);
    assert_int_equal(cerb_client_open_string(&f->client, config), CERB_OK);
    if (cerb__serve_start(f->client, f->sock, &f->serve, err, sizeof err) != CERB_OK)
        fail_msg("cerb__serve_start: %s", err);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return start(state, "engines = (\"local\");\n");
}

static int setup_gfault(void **state)
{
    guard_fault_register();
    guard_fault_reset();
    return start(state, "engines = (\"gfault\");\n");
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    cerb__serve_stop(f->serve);
    cerb_client_close(f->client);
    guard_fault_reset();
    rmdir(f->dir);
    free(f);
    return 0;
}

/* POST /v1/guard/@scope/@key/@what (@key as it goes in the path). */
static struct serve_http_reply guard(struct fixture *f, const char *scope, const char *key,
                          const char *what, const char *body)
{
    char path[768];
    snprintf(path, sizeof path, "/v1/guard/%s/%s/%s", scope, key, what);
    return request(f, "POST", path, body);
}

/* Begins and expects to run; the attempt id in @id (33 bytes). */
static void begin_run(struct fixture *f, const char *scope, const char *key,
                      const char *body, char *id)
{
    struct serve_http_reply r = guard(f, scope, key, "begin", body);

    if (r.code != 200)
        fail_msg("begin %s/%s: %ld %s", scope, key, r.code, str(&r, "error"));
    assert_string_equal(str(&r, "state"), "run");
    assert_int_equal(strlen(str(&r, "attempt")), 32);
    assert_true(json_is_false(json_object_get(r.body, "degraded")));
    assert_true(json_integer_value(json_object_get(r.body, "window_ms")) >= 100);
    strcpy(id, str(&r, "attempt"));
    json_decref(r.body);
}

static void expect_code(struct serve_http_reply r, long code, const char *status)
{
    if (r.code != code)
        fail_msg("expected %ld, got %ld: %s", code, r.code,
                 json_string_value(json_object_get(r.body, "error")));
    if (status)
        assert_string_equal(str(&r, "status"), status);
    json_decref(r.body);
}

static void finish(struct fixture *f, const char *scope, const char *key, const char *id,
                   const char *rest, long code)
{
    char body[512];
    snprintf(body, sizeof body, "{\"attempt\": \"%s\"%s}", id, rest);
    expect_code(guard(f, scope, key, "finish", body), code, NULL);
}

static void test_begin_busy_finish_duplicate(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-basic");
    char id[33];
    struct serve_http_reply r;

    begin_run(f, scope, "order-1", NULL, id);
    expect_code(guard(f, scope, "order-1", "begin", "{}"), 409, "BUSY");
    /* Another key of the scope is another operation. */
    {
        char other[33];
        begin_run(f, scope, "order-2", "{}", other);
        finish(f, scope, "order-2", other, ", \"succeeded\": false", 200);
    }
    r = guard(f, scope, "order-1", "finish", NULL);
    expect_code(r, 400, "EINVAL"); /* a finish needs a body */
    finish(f, scope, "order-1", id, ", \"succeeded\": true, \"result\": \"done \\u00e9\"",
           200);

    r = guard(f, scope, "order-1", "begin", NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "state"), "duplicate");
    assert_string_equal(str(&r, "result"), "done \xc3\xa9");
    assert_null(json_object_get(r.body, "result_base64"));
    json_decref(r.body);

    /* The attempt is finished: a repeated finish gets the same answer
     * (test_finish_repeated). */
    finish(f, scope, "order-1", id, ", \"succeeded\": true", 200);
    free(scope);
}

/* A failure deletes the record: a retry runs at once. */
static void test_failure_lets_retry(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-fail");
    char id[33], id2[33];

    begin_run(f, scope, "k", NULL, id);
    finish(f, scope, "k", id, ", \"succeeded\": false, \"result\": \"x\"", 400);
    finish(f, scope, "k", id, ", \"succeeded\": false", 200);
    begin_run(f, scope, "k", NULL, id2);
    assert_string_not_equal(id, id2);
    finish(f, scope, "k", id2, ", \"succeeded\": true", 200);
    free(scope);
}

/* Bytes that are not UTF-8 are stored exactly and come back in base64. */
static void test_binary_result(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-bin");
    char id[33];
    struct serve_http_reply r;

    begin_run(f, scope, "k", NULL, id);
    /* "\xff\x00\x01A" */
    finish(f, scope, "k", id, ", \"succeeded\": true, \"result_base64\": \"/wABQQ==\"", 200);
    r = guard(f, scope, "k", "begin", NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "state"), "duplicate");
    assert_string_equal(str(&r, "result_base64"), "/wABQQ==");
    assert_null(json_object_get(r.body, "result"));
    json_decref(r.body);

    /* A text with a NUL is UTF-8: sent and answered as text. */
    begin_run(f, scope, "k2", NULL, id);
    finish(f, scope, "k2", id, ", \"succeeded\": true, \"result\": \"a\\u0000b\"", 200);
    r = guard(f, scope, "k2", "begin", NULL);
    assert_int_equal(r.code, 200);
    assert_int_equal(json_string_length(json_object_get(r.body, "result")), 3);
    assert_memory_equal(str(&r, "result"), "a\0b", 3);
    json_decref(r.body);
    free(scope);
}

/* A caller that died: its attempt is freed after its window, so a retry
 * runs; one that keeps it alive keeps the others out. */
static void test_dead_caller_attempt_expires(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-expiry");
    char id[33], id2[33], keep[128];
    struct timespec tick = {0, 100 * 1000000L};
    int64_t t0;
    struct serve_http_reply r;

    /* Kept alive every 100 ms for two windows of 800 ms: still running. */
    begin_run(f, scope, "k", "{\"running_ms\": 800}", id);
    snprintf(keep, sizeof keep, "/v1/guard/attempts/%s/keepalive", id);
    t0 = cerb_test_now_ms();
    while (cerb_test_now_ms() - t0 < 1600) {
        r = request(f, "POST", keep, NULL);
        assert_int_equal(r.code, 200);
        assert_string_equal(str(&r, "state"), "valid");
        json_decref(r.body);
        nanosleep(&tick, NULL);
    }
    expect_code(guard(f, scope, "k", "begin", NULL), 409, "BUSY");

    /* Silent from now: freed within its window and a tick or so. */
    t0 = cerb_test_now_ms();
    for (;;) {
        r = guard(f, scope, "k", "begin", "{\"running_ms\": 400}");
        if (r.code == 200)
            break;
        assert_int_equal(r.code, 409);
        json_decref(r.body);
        assert_true(cerb_test_now_ms() - t0 < 5000);
        nanosleep(&tick, NULL);
    }
    assert_true(cerb_test_now_ms() - t0 >= 600); /* not before its window */
    assert_string_equal(str(&r, "state"), "run");
    strcpy(id2, str(&r, "attempt"));
    json_decref(r.body);
    expect_code(request(f, "POST", keep, NULL), 404, "NOT_OWNER");
    finish(f, scope, "k", id, ", \"succeeded\": true", 404);
    finish(f, scope, "k", id2, ", \"succeeded\": true", 200);
    free(scope);
}

/* The stop frees the attempts left: a new server on the same client lets
 * the operation run again. */
static void test_stop_frees_attempts(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-stop");
    char id[33], err[256];

    begin_run(f, scope, "k", NULL, id);
    cerb__serve_stop(f->serve);
    f->serve = NULL;
    if (cerb__serve_start(f->client, f->sock, &f->serve, err, sizeof err) != CERB_OK)
        fail_msg("cerb__serve_start: %s", err);
    begin_run(f, scope, "k", NULL, id);
    free(scope);
}

/* Scope and key are decoded once: %2F is a '/' of the key, %25 a '%'. */
static void test_percent_encoded(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("sg-pct");
    char scope[160], id[33];
    struct serve_http_reply r;

    snprintf(scope, sizeof scope, "%s%%20x", name); /* "NAME x" */
    begin_run(f, scope, "a%2Fb%20c%25", NULL, id);
    /* The same key spelled otherwise is the same operation. */
    expect_code(guard(f, scope, "a/b%20c%25", "begin", NULL), 409, "BUSY");
    expect_code(guard(f, scope, "a%2fb%20c%", "begin", NULL), 409, "BUSY");
    /* And the same scope spelled otherwise ("%78" is "x"). */
    {
        char spelled[200];
        snprintf(spelled, sizeof spelled, "%s%%20%%78", name);
        expect_code(guard(f, spelled, "a%2Fb%20c%25", "begin", NULL), 409, "BUSY");
    }
    /* A finish with the key decoded elsewise still finds it. */
    finish(f, scope, "a/b%20c%25", id, ", \"succeeded\": true, \"result\": \"r\"", 200);
    r = guard(f, scope, "a%2Fb%20c%25", "begin", NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "state"), "duplicate");
    json_decref(r.body);
    /* Not decoded twice: the key "%41" is not the key "A". */
    begin_run(f, scope, "%2541", NULL, id);
    begin_run(f, scope, "A", NULL, id);
    /* A key ending like a route suffix, and an empty key. */
    begin_run(f, scope, "x%2Fbegin", NULL, id);
    finish(f, scope, "x/begin", id, ", \"succeeded\": true", 200);
    begin_run(f, scope, "", NULL, id);
    finish(f, scope, "", id, ", \"succeeded\": true", 200);
    /* No key part at all: no such route. */
    expect_code(request(f, "POST", "/v1/guard/onlyscope/begin", NULL), 404, NULL);
    free(name);
}

/* A bad body is 400 and changes nothing. */
static void test_bad_bodies(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-bad");
    char id[33], body[256];
    struct serve_http_reply r;
    static const char *const bad_begin[] = {
        "{\"running_ms\": \"x\"}", "{\"running_ms\": 5}", "{\"keep_ms\": 0}",
        "{\"on_unavailable\": \"maybe\"}", "{\"runing_ms\": 1000}", "[1]", "{",
        "{\"keep_ms\": 1, \"keep_ms\": 2}",
    };

    for (size_t i = 0; i < sizeof bad_begin / sizeof bad_begin[0]; i++)
        expect_code(guard(f, scope, "k", "begin", bad_begin[i]), 400, "EINVAL");
    /* None of them claimed it. */
    begin_run(f, scope, "k", "{\"running_ms\": 1000, \"keep_ms\": -1, "
                             "\"on_unavailable\": \"refuse\"}", id);

    /* Bad finishes leave the attempt open. */
    {
        /* What follows the attempt's id ("-" : no attempt member). */
        static const char *const bad_finish[] = {
            "",
            ", \"succeeded\": 1",
            ", \"succeeded\": true, \"result\": 5",
            ", \"succeeded\": true, \"result_base64\": \"!!\"",
            ", \"succeeded\": true, \"result_base64\": \"YR==\"",
            ", \"succeeded\": true, \"result\": \"a\", \"result_base64\": \"YQ==\"",
            ", \"succeeded\": true, \"extra\": 1",
        };
        expect_code(guard(f, scope, "k", "finish", "{\"succeeded\": true}"), 400, "EINVAL");
        expect_code(guard(f, scope, "k", "finish",
                          "{\"attempt\": \"nothex\", \"succeeded\": true}"),
                    400, "EINVAL");
        for (size_t i = 0; i < sizeof bad_finish / sizeof bad_finish[0]; i++) {
            snprintf(body, sizeof body, "{\"attempt\": \"%s\"%s}", id, bad_finish[i]);
            expect_code(guard(f, scope, "k", "finish", body), 400, "EINVAL");
        }
    }
    /* Another scope's or key's finish does not finish it. */
    finish(f, scope, "other", id, ", \"succeeded\": true", 404);
    {
        char other[200];
        snprintf(other, sizeof other, "%s-x", scope);
        finish(f, other, "k", id, ", \"succeeded\": true", 404);
    }
    expect_code(guard(f, scope, "k", "begin", NULL), 409, "BUSY");
    finish(f, scope, "k", id, ", \"succeeded\": true, \"result\": \"ok\"", 200);
    r = guard(f, scope, "k", "begin", NULL);
    assert_string_equal(str(&r, "result"), "ok");
    json_decref(r.body);
    free(scope);
}

/* A finish repeated after its answer was lost (the caller's read timed
 * out, it retries) gets the same answer, not 404 "no such attempt": a
 * success that landed is never reported as a failure. */
static void test_finish_repeated(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-again");
    char id[33], keep[128];
    struct serve_http_reply r;

    begin_run(f, scope, "k", NULL, id);
    finish(f, scope, "k", id, ", \"succeeded\": true, \"result\": \"once\"", 200);
    {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"attempt\": \"%s\", \"succeeded\": true, \"result\": \"once\"}", id);
        r = guard(f, scope, "k", "finish", body);
        assert_int_equal(r.code, 200);
        assert_true(json_is_true(json_object_get(r.body, "succeeded")));
        assert_true(json_is_true(json_object_get(r.body, "repeated")));
        json_decref(r.body);
    }
    /* Finished: nothing to keep alive; the result is stored once. */
    snprintf(keep, sizeof keep, "/v1/guard/attempts/%s/keepalive", id);
    r = request(f, "POST", keep, NULL);
    assert_int_equal(r.code, 404);
    json_decref(r.body);
    r = guard(f, scope, "k", "begin", NULL);
    assert_string_equal(str(&r, "state"), "duplicate");
    assert_string_equal(str(&r, "result"), "once");
    json_decref(r.body);
    free(scope);
}

/* gfault: the claim's renewals fail, so it is lost at its deadline: the
 * keepalive says so and the finish is 410 LOST (nothing stored). */
static void test_lost(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-lost");
    char id[33], keep[128];
    struct timespec tick = {0, 50 * 1000000L};
    int64_t t0 = cerb_test_now_ms();
    struct serve_http_reply r;

    begin_run(f, scope, "k", "{\"running_ms\": 300}", id);
    guard_fault_set(GFAULT_RENEW, 1, true, GFAULT_BEFORE);
    snprintf(keep, sizeof keep, "/v1/guard/attempts/%s/keepalive", id);
    /* Kept alive (200, "valid" or "suspect") until the claim is lost;
     * then 410 LOST, never a 200 that says go on. */
    for (;;) {
        r = request(f, "POST", keep, NULL);
        if (r.code == 410)
            break;
        assert_int_equal(r.code, 200);
        assert_string_not_equal(str(&r, "state"), "lost");
        assert_true(json_integer_value(json_object_get(r.body, "window_ms")) == 300);
        json_decref(r.body);
        assert_true(cerb_test_now_ms() - t0 < 5000);
        nanosleep(&tick, NULL);
    }
    assert_string_equal(str(&r, "status"), "LOST");
    json_decref(r.body);
    r = guard(f, scope, "k", "finish",
              NULL); /* no body: 400 first, the attempt still there */
    expect_code(r, 400, "EINVAL");
    {
        char body[256];
        snprintf(body, sizeof body, "{\"attempt\": \"%s\", \"succeeded\": true}", id);
        r = guard(f, scope, "k", "finish", body);
    }
    assert_int_equal(r.code, 410);
    assert_string_equal(str(&r, "status"), "LOST");
    assert_true(json_is_false(json_object_get(r.body, "open")));
    json_decref(r.body);
    expect_code(request(f, "POST", keep, NULL), 404, "NOT_OWNER");
    guard_fault_reset();
    /* Nothing was stored: the operation runs again. */
    begin_run(f, scope, "k", NULL, id);
    free(scope);
}

/* gfault: a success the engine did not confirm leaves the attempt open;
 * finishing again stores it. */
static void test_unconfirmed_finish_stays_open(void **state)
{
    struct fixture *f = *state;
    char *scope = test_name("sg-unconfirmed");
    char id[33], body[256];
    struct serve_http_reply r;

    begin_run(f, scope, "k", NULL, id);
    guard_fault_set(GFAULT_FINISH, 1, true, GFAULT_BEFORE);
    snprintf(body, sizeof body,
             "{\"attempt\": \"%s\", \"succeeded\": true, \"result\": \"v\"}", id);
    r = guard(f, scope, "k", "finish", body);
    assert_int_equal(r.code, 503);
    assert_true(json_is_true(json_object_get(r.body, "open")));
    json_decref(r.body);
    expect_code(guard(f, scope, "k", "begin", NULL), 409, "BUSY");
    guard_fault_reset();
    expect_code(guard(f, scope, "k", "finish", body), 200, NULL);
    r = guard(f, scope, "k", "begin", NULL);
    assert_string_equal(str(&r, "state"), "duplicate");
    assert_string_equal(str(&r, "result"), "v");
    json_decref(r.body);
    free(scope);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_begin_busy_finish_duplicate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_lets_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_repeated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_result, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_caller_attempt_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_frees_attempts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_percent_encoded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_bodies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost, setup_gfault, teardown),
        cmocka_unit_test_setup_teardown(test_unconfirmed_finish_stays_open, setup_gfault,
                                        teardown),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
