/*
 * test_serve_parse.c — serve/serve_parse.c alone (no server, no MHD): which
 * route a method and path name, the parts read from the path (as
 * libmicrohttpd hands it over: already percent-decoded), and the bodies
 * accepted and refused, with the defaults of what is absent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve_parse.h"

#define ID "0123456789abcdef0123456789abcdef"

static cerb_status parse(const char *method, const char *path, const char *body,
                         struct cerb__serve_req *rq)
{
    char why[512];
    cerb_status st = cerb__serve_parse(method, path, body, body ? strlen(body) : 0, rq, why,
                                       sizeof why);
    if (st == CERB_EINVAL)
        assert_true(why[0] != '\0');
    return st;
}

/* @method @path routes to @rt with part @part (NULL: none). */
static void route(const char *method, const char *path, enum cerb__serve_rt rt,
                  const char *part)
{
    struct cerb__serve_req rq;

    assert_int_equal(parse(method, path, NULL, &rq), CERB_OK);
    if (rq.rt != rt)
        fail_msg("%s %s: route %s, not %s", method, path, cerb__serve_rt_name(rq.rt),
                 cerb__serve_rt_name(rt));
    if (part)
        assert_string_equal(rq.part, part);
    else
        assert_null(rq.part);
    cerb__serve_req_free(&rq);
}

static void test_routes(void **state)
{
    (void)state;
    route("GET", "/healthz", CERB_SERVE_RT_HEALTHZ, NULL);
    route("GET", "/metrics", CERB_SERVE_RT_METRICS, NULL);
    route("GET", "/v1/status", CERB_SERVE_RT_STATUS, NULL);
    route("POST", "/v1/switch", CERB_SERVE_RT_SWITCH, NULL);
    route("GET", "/v1/locks/orders", CERB_SERVE_RT_LOCK_INSPECT, "orders");
    route("POST", "/v1/locks/jobs/nightly/acquire", CERB_SERVE_RT_LOCK_ACQUIRE, "jobs/nightly");
    route("DELETE", "/v1/holds/" ID, CERB_SERVE_RT_HOLD_RELEASE, ID);
    route("POST", "/v1/holds/" ID "/keepalive", CERB_SERVE_RT_HOLD_KEEPALIVE, ID);
    route("GET", "/v1/holds/" ID "/events", CERB_SERVE_RT_HOLD_EVENTS, ID);
    route("POST", "/v1/guard/attempts/" ID "/keepalive", CERB_SERVE_RT_GUARD_KEEPALIVE, ID);
    route("POST", "/v1/guard/attempts/k/begin", CERB_SERVE_RT_GUARD_BEGIN, "attempts");

    /* Not routes: other methods, a '/' where none may be, empty parts. */
    route("PUT", "/v1/locks/a/acquire", CERB_SERVE_RT_NONE, NULL);
    route("GET", "/v1/switch", CERB_SERVE_RT_NONE, NULL);
    route("POST", "/healthz", CERB_SERVE_RT_NONE, NULL);
    route("GET", "/v1/locks/a/b", CERB_SERVE_RT_NONE, NULL);
    route("GET", "/v1/locks/", CERB_SERVE_RT_NONE, NULL);
    route("POST", "/v1/locks//acquire", CERB_SERVE_RT_NONE, NULL);
    route("DELETE", "/v1/holds/a/b", CERB_SERVE_RT_NONE, NULL);
    route("POST", "/v1/holds//keepalive", CERB_SERVE_RT_NONE, NULL);
    route("POST", "/v1/guard/s/begin", CERB_SERVE_RT_NONE, NULL);
    route("POST", "/v1/guard//k/begin", CERB_SERVE_RT_NONE, NULL);
    route("POST", "/v1/guard/s/k/end", CERB_SERVE_RT_NONE, NULL);
    route("GET", "/v1/guard/s/k/begin", CERB_SERVE_RT_NONE, NULL);
    route("GET", "/v1.0/lock/store", CERB_SERVE_RT_NONE, NULL);
    route("GET", "", CERB_SERVE_RT_NONE, NULL);
}

/* Scope: the first segment; key: the rest up to the last suffix. */
static void test_guard_parts(void **state)
{
    static const struct {
        const char *path, *scope, *key;
        enum cerb__serve_rt rt;
    } cases[] = {
        {"/v1/guard/s/k/begin", "s", "k", CERB_SERVE_RT_GUARD_BEGIN},
        {"/v1/guard/s/a/b/c/finish", "s", "a/b/c", CERB_SERVE_RT_GUARD_FINISH},
        {"/v1/guard/s//begin", "s", "", CERB_SERVE_RT_GUARD_BEGIN},
        {"/v1/guard/s/x/begin/begin", "s", "x/begin", CERB_SERVE_RT_GUARD_BEGIN},
        {"/v1/guard/s/x/finish/begin", "s", "x/finish", CERB_SERVE_RT_GUARD_BEGIN},
        {"/v1/guard/my scope/%41/begin", "my scope", "%41", CERB_SERVE_RT_GUARD_BEGIN},
    };
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cerb__serve_req rq;
        const char *body = cases[i].rt == CERB_SERVE_RT_GUARD_FINISH
                               ? "{\"attempt\": \"" ID "\", \"succeeded\": false}"
                               : NULL;
        assert_int_equal(parse("POST", cases[i].path, body, &rq), CERB_OK);
        assert_int_equal(rq.rt, cases[i].rt);
        assert_string_equal(rq.part, cases[i].scope);
        assert_string_equal(rq.key, cases[i].key);
        assert_int_equal(rq.key_len, strlen(cases[i].key));
        cerb__serve_req_free(&rq);
    }
}

static void test_bodies(void **state)
{
    struct cerb__serve_req rq;
    (void)state;

    /* Defaults. */
    assert_int_equal(parse("POST", "/v1/guard/s/k/begin", NULL, &rq), CERB_OK);
    assert_int_equal(rq.guard.running_ms, 0);
    assert_int_equal(rq.guard.keep_ms, 0);
    assert_int_equal(rq.guard.on_unavailable, -1);
    cerb__serve_req_free(&rq);
    assert_int_equal(parse("POST", "/v1/locks/a/acquire", "{\"other\": 1}", &rq), CERB_OK);
    assert_int_equal(rq.wait_ms, 0);
    assert_int_equal(rq.lease_ms, 0);
    cerb__serve_req_free(&rq);

    assert_int_equal(parse("POST", "/v1/guard/s/k/begin",
                           "{\"running_ms\": 100, \"keep_ms\": -1, \"on_unavailable\": "
                           "\"allow\"}",
                           &rq),
                     CERB_OK);
    assert_int_equal(rq.guard.running_ms, 100);
    assert_int_equal(rq.guard.keep_ms, -1);
    assert_int_equal(rq.guard.on_unavailable, CERB_GUARD_ALLOW);
    cerb__serve_req_free(&rq);

    assert_int_equal(parse("POST", "/v1/guard/s/k/finish",
                           "{\"attempt\": \"" ID "\", \"succeeded\": true, \"result_base64\": "
                           "\"/wABQQ==\"}",
                           &rq),
                     CERB_OK);
    assert_string_equal(rq.attempt, ID);
    assert_true(rq.succeeded);
    assert_int_equal(rq.result_len, 4);
    assert_memory_equal(rq.result, "\xff\x00\x01\x41", 4);
    cerb__serve_req_free(&rq);

    assert_int_equal(parse("POST", "/v1/guard/s/k/finish",
                           "{\"attempt\": \"" ID "\", \"succeeded\": true, \"result\": "
                           "\"a\\u0000b\"}",
                           &rq),
                     CERB_OK);
    assert_int_equal(rq.result_len, 3);
    assert_memory_equal(rq.result, "a\0b", 3);
    cerb__serve_req_free(&rq);

    assert_int_equal(parse("POST", "/v1/switch", "{\"engine\": \"zk\"}", &rq), CERB_OK);
    assert_string_equal(rq.engine, "zk");
    cerb__serve_req_free(&rq);

    /* Refused. */
    {
        static const struct {
            const char *path, *body;
        } bad[] = {
            {"/v1/locks/a/acquire", "{\"wait_ms\": 3600001}"},
            {"/v1/locks/a/acquire", "{\"lease_ms\": 99}"},
            {"/v1/locks/a/acquire", "[]"},
            {"/v1/locks/a/acquire", " "},
            {"/v1/guard/s/k/begin", "{\"running_ms\": 86400001}"},
            {"/v1/guard/s/k/begin", "{\"keep_ms\": -2}"},
            {"/v1/guard/s/k/begin", "{\"keep_ms\": 0}"},
            {"/v1/guard/s/k/begin", "{\"on_unavailable\": \"allow\\u0000x\"}"},
            {"/v1/guard/s/k/begin", "{\"x\": 1}"},
            {"/v1/guard/s/k/finish", ""},
            {"/v1/guard/s/k/finish", "{\"attempt\": \"" ID "0\", \"succeeded\": true}"},
            {"/v1/guard/s/k/finish", "{\"attempt\": \"0123456789ABCDEF0123456789abcdef\", "
                                     "\"succeeded\": true}"},
            {"/v1/guard/s/k/finish",
             "{\"attempt\": \"" ID "\", \"succeeded\": true, \"result_base64\": \"QQ\"}"},
            {"/v1/guard/s/k/finish",
             "{\"attempt\": \"" ID "\", \"succeeded\": true, \"result_base64\": \"QR==\"}"},
            {"/v1/guard/s/k/finish",
             "{\"attempt\": \"" ID "\", \"succeeded\": true, \"result_base64\": \"Q===\"}"},
            {"/v1/switch", "{\"engine\": \"\"}"},
            {"/v1/switch", "{\"engine\": \"a\\u0000b\"}"},
            {"/v1/switch", "{\"engine\": null}"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            cerb_status st = parse("POST", bad[i].path, bad[i].body, &rq);
            if (st != CERB_EINVAL)
                fail_msg("%s %s: %s", bad[i].path, bad[i].body, cerb_status_name(st));
            cerb__serve_req_free(&rq);
        }
    }
}

static void test_b64(void **state)
{
    static const struct {
        const char *in, *out;
        size_t n;
    } good[] = {{"", "", 0}, {"QQ==", "A", 1}, {"QUI=", "AB", 2}, {"QUJD", "ABC", 3},
                {"/wABQQ==", "\xff\x00\x01\x41", 4}};
    static const char *const bad[] = {"Q", "QQ=", "QQ=A", "Q===", "QR==", "QUJ=", "QU J",
                                      "QQ==QQ==", "====", "QUJD\n"};
    char *out;
    size_t n;
    (void)state;

    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_true(cerb__serve_b64_decode(good[i].in, strlen(good[i].in), &out, &n));
        assert_int_equal(n, good[i].n);
        assert_memory_equal(out, good[i].out, n);
        free(out);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (cerb__serve_b64_decode(bad[i], strlen(bad[i]), &out, &n))
            fail_msg("\"%s\" decoded", bad[i]);
        assert_null(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_guard_parts),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_b64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
