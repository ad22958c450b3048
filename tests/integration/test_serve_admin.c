/*
 * test_serve_admin.c — the administrative routes of `cerberus serve`
 * in-process on a temporary unix socket, spoken to with libcurl, with two
 * engines configured: the built-in "local" and the "fault" test engine
 * (the local engine wrapped; a configuration cannot name one engine twice):
 *
 *  - GET /v1/status lists every configured engine in configuration order,
 *    with cerb_engine_info's fields, and the current one;
 *  - POST /v1/switch: no body switches to the next engine, {"engine"} to
 *    that one ("auto" included); an unknown engine or a bad body is 400
 *    and changes nothing;
 *  - GET /metrics is text/plain; version=0.0.4, every sample belongs to a
 *    family with one HELP and one TYPE line (no family twice), and the
 *    server's own families count requests by route and code, the holds,
 *    streams and attempts;
 *  - a request to no route is 404 (and counted as route "unknown").
 */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "cerberus.h"
#include "fault_engine.h"
#include "serve.h"
#include "serve_http.h"
#include "test_util.h"

struct fixture {
    char dir[64];
    char sock[128];
    cerb_client *client;
    struct cerb__serve *serve;
};

/* One request: the code, the text, its content type and (when JSON) the
 * parsed body. */
static struct serve_http_reply request(struct fixture *f, const char *method, const char *path,
                            const char *body)
{
    struct serve_http_reply r;
    CURLcode rc = serve_http_try(f->sock, 0, NULL, method, path, body, true, &r);

    if (rc != CURLE_OK)
        fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    assert_non_null(r.text);
    return r;
}

static void done(struct serve_http_reply *r)
{
    json_decref(r->body);
    free(r->text);
}

static const char *str(const struct serve_http_reply *r, const char *key)
{
    const char *v = json_string_value(json_object_get(r->body, key));
    return v ? v : "";
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    char err[256];

    assert_non_null(f);
    fault_engine_register();
    fault_engine_reset();
    snprintf(f->dir, sizeof f->dir, "/tmp/cerb-serve-admin-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/serve.sock", f->dir);
    /* "local" first, "fault" second: configuration order, not the
     * alphabet's, and not the built-in names' order either. */
    assert_int_equal(cerb_client_open_string(&f->client,
                                             "engines = (\"local\", \"fault\");\n"),
                     CERB_OK);
    if (cerb__serve_start(f->client, f->sock, &f->serve, err, sizeof err) != CERB_OK)
        fail_msg("cerb__serve_start: %s", err);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    cerb__serve_stop(f->serve);
    cerb_client_close(f->client);
    fault_engine_reset();
    rmdir(f->dir);
    free(f);
    return 0;
}

static void expect_current(struct fixture *f, const char *name)
{
    struct serve_http_reply r = request(f, "GET", "/v1/status", NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "current"), name);
    done(&r);
    assert_string_equal(cerb_engine_current(f->client), name);
}

static void test_status_lists_every_engine(void **state)
{
    struct fixture *f = *state;
    struct serve_http_reply r = request(f, "GET", "/v1/status", NULL);
    static const char *const fields[] = {
        "name", "active", "breaker", "wanted", "last_probe_us", "acquires", "failures",
        "lost", "acquire_calls", "wakeups", "handoffs", "breaker_transitions", "switches",
        "epoch", "guard_begins", "guard_duplicates", "guard_busy", "guard_degraded",
        "gate_questions", "closed_epoch",
    };
    json_t *engines, *e;

    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "current"), "local");
    engines = json_object_get(r.body, "engines");
    assert_int_equal(json_array_size(engines), 2);
    e = json_array_get(engines, 0);
    assert_string_equal(json_string_value(json_object_get(e, "name")), "local");
    assert_true(json_is_true(json_object_get(e, "active")));
    e = json_array_get(engines, 1);
    assert_string_equal(json_string_value(json_object_get(e, "name")), "fault");
    assert_true(json_is_false(json_object_get(e, "active")));
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!json_object_get(e, fields[i]))
            fail_msg("status: no \"%s\"", fields[i]);
    done(&r);

    /* After a switch the other one is active, the order the same. */
    assert_string_equal(cerb_engine_switch_to(f->client, "fault"), "fault");
    r = request(f, "GET", "/v1/status", NULL);
    assert_string_equal(str(&r, "current"), "fault");
    engines = json_object_get(r.body, "engines");
    assert_int_equal(json_array_size(engines), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(engines, 0), "name")),
                        "local");
    assert_true(json_is_true(json_object_get(json_array_get(engines, 1), "active")));
    done(&r);
}

static void test_switch(void **state)
{
    struct fixture *f = *state;
    struct serve_http_reply r;

    /* No body: the next engine. */
    r = request(f, "POST", "/v1/switch", NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "from"), "local");
    assert_string_equal(str(&r, "to"), "fault");
    done(&r);
    expect_current(f, "fault");

    r = request(f, "POST", "/v1/switch", "{\"engine\": \"local\"}");
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "from"), "fault");
    assert_string_equal(str(&r, "to"), "local");
    done(&r);
    expect_current(f, "local");

    /* An engine not configured: 400 with the library's text, no switch. */
    r = request(f, "POST", "/v1/switch", "{\"engine\": \"redis\"}");
    assert_int_equal(r.code, 400);
    assert_string_equal(str(&r, "status"), "EINVAL");
    assert_true(strlen(str(&r, "error")) > 0);
    done(&r);
    expect_current(f, "local");

    /* Bad bodies: 400, no switch (not even to the next engine). */
    {
        static const char *const bad[] = {
            "{\"engine\": 5}", "{\"engine\": \"\"}", "{\"engin\": \"fault\"}", "[]", "{",
            "{\"engine\": \"fault\", \"engine\": \"local\"}",
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            r = request(f, "POST", "/v1/switch", bad[i]);
            if (r.code != 400)
                fail_msg("%s: %ld", bad[i], r.code);
            assert_string_equal(str(&r, "status"), "EINVAL");
            done(&r);
            expect_current(f, "local");
        }
    }

    /* "auto": automatic selection again (the first engine that opens). */
    r = request(f, "POST", "/v1/switch", "{\"engine\": \"fault\"}");
    assert_int_equal(r.code, 200);
    done(&r);
    r = request(f, "POST", "/v1/switch", "{\"engine\": \"auto\"}");
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "from"), "fault");
    done(&r);

    /* GET is not its method: 405 (with Allow: POST). */
    r = request(f, "GET", "/v1/switch", NULL);
    assert_int_equal(r.code, 405);
    done(&r);
}

/* ---- the metrics text ---- */

struct family {
    char name[128];
    char type[16];
    bool help, typed;
};

/* The metric name at the start of @line (up to '{' or ' '). */
static void metric_name(const char *line, char *out, size_t cap)
{
    size_t n = strcspn(line, "{ ");
    assert_true(n > 0 && n < cap);
    memcpy(out, line, n);
    out[n] = '\0';
}

static struct family *find_family(struct family *v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, name) == 0)
            return &v[i];
    return NULL;
}

/* The family a sample @name belongs to: itself, or for a histogram or
 * summary without its _bucket/_sum/_count suffix. */
static struct family *family_of(struct family *v, size_t n, const char *name)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    struct family *fam = find_family(v, n, name);

    if (fam)
        return fam;
    for (size_t i = 0; i < 3; i++) {
        size_t nl = strlen(name), sl = strlen(suffixes[i]);
        char base[128];
        if (nl > sl && strcmp(name + nl - sl, suffixes[i]) == 0 && nl - sl < sizeof base) {
            memcpy(base, name, nl - sl);
            base[nl - sl] = '\0';
            fam = find_family(v, n, base);
            if (fam && (strcmp(fam->type, "histogram") == 0 ||
                        strcmp(fam->type, "summary") == 0))
                return fam;
        }
    }
    return NULL;
}

/* Checks the exposition format line by line; the value of sample @want
 * (its whole name and labels, as printed) in *@value (-1 when absent). */
static void check_metrics(const char *text, const char *want, double *value)
{
    struct family fams[128];
    size_t n = 0;
    char *copy = strdup(text), *save = NULL;

    assert_non_null(copy);
    *value = -1;
    assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[128];
        struct family *fam;
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            bool help = line[2] == 'H';
            metric_name(line + 7, name, sizeof name);
            fam = find_family(fams, n, name);
            if (!fam) {
                assert_true(n < sizeof fams / sizeof fams[0]);
                fam = &fams[n++];
                memset(fam, 0, sizeof *fam);
                snprintf(fam->name, sizeof fam->name, "%s", name);
            }
            if (help ? fam->help : fam->typed)
                fail_msg("family %s: a second %s line", name, help ? "HELP" : "TYPE");
            if (help) {
                fam->help = true;
            } else {
                const char *t = line + 7 + strlen(name) + 1;
                if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram") &&
                    strcmp(t, "summary") && strcmp(t, "untyped"))
                    fail_msg("family %s: type \"%s\"", name, t);
                snprintf(fam->type, sizeof fam->type, "%s", t);
                fam->typed = true;
            }
            continue;
        }
        assert_true(line[0] != '#' && line[0] != ' ');
        metric_name(line, name, sizeof name);
        fam = family_of(fams, n, name);
        if (!fam || !fam->help || !fam->typed)
            fail_msg("sample without its HELP and TYPE: %s", line);
        {
            const char *sp = strrchr(line, ' ');
            char *end;
            double v;
            assert_non_null(sp);
            v = strtod(sp + 1, &end);
            if (*end != '\0' && strcmp(sp + 1, "+Inf") != 0 && strcmp(sp + 1, "NaN") != 0)
                fail_msg("not a value: %s", line);
            if (strncmp(line, want, strlen(want)) == 0 && line[strlen(want)] == ' ')
                *value = v;
        }
    }
    free(copy);
}

static double metric(struct fixture *f, const char *sample)
{
    struct serve_http_reply r = request(f, "GET", "/metrics", NULL);
    double v;

    assert_int_equal(r.code, 200);
    assert_non_null(strstr(r.type, "text/plain"));
    assert_non_null(strstr(r.type, "version=0.0.4"));
    check_metrics(r.text, sample, &v);
    /* The library's families are there too, for both engines. */
    assert_non_null(strstr(r.text, "cerberus_engine_active{engine=\"local\"}"));
    assert_non_null(strstr(r.text, "cerberus_engine_active{engine=\"fault\"}"));
    done(&r);
    return v;
}

static void test_metrics(void **state)
{
    struct fixture *f = *state;
    const char *healthz = "cerberus_serve_requests_total{route=\"healthz\",code=\"200\"}";
    const char *unknown = "cerberus_serve_requests_total{route=\"unknown\",code=\"404\"}";
    char *name = test_name("serve-metrics");
    char path[256], hold[33];
    double before;
    struct serve_http_reply r;

    before = metric(f, healthz);
    for (int i = 0; i < 3; i++) {
        r = request(f, "GET", "/healthz", NULL);
        assert_int_equal(r.code, 200);
        done(&r);
    }
    assert_true(metric(f, healthz) == (before < 0 ? 0 : before) + 3);

    before = metric(f, unknown);
    r = request(f, "GET", "/v1/nothing-here", NULL);
    assert_int_equal(r.code, 404);
    done(&r);
    assert_true(metric(f, unknown) == (before < 0 ? 0 : before) + 1);

    assert_true(metric(f, "cerberus_serve_holds") == 0);
    assert_true(metric(f, "cerberus_serve_attempts") == 0);
    assert_true(metric(f, "cerberus_serve_event_streams") == 0);
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, NULL);
    assert_int_equal(r.code, 200);
    snprintf(hold, sizeof hold, "%s", str(&r, "hold"));
    done(&r);
    assert_true(metric(f, "cerberus_serve_holds") == 1);
    assert_true(metric(f, "cerberus_serve_requests_total{route=\"lock_acquire\",code=\"200\"}") >=
                1);

    snprintf(path, sizeof path, "/v1/guard/%s/k/begin", name);
    r = request(f, "POST", path, NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "state"), "run");
    done(&r);
    assert_true(metric(f, "cerberus_serve_attempts") == 1);

    /* A bad body is counted under its route, with 400. */
    before = metric(f, "cerberus_serve_requests_total{route=\"lock_acquire\",code=\"400\"}");
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"wait_ms\": -1}");
    assert_int_equal(r.code, 400);
    done(&r);
    assert_true(metric(f, "cerberus_serve_requests_total{route=\"lock_acquire\",code=\"400\"}") ==
                (before < 0 ? 0 : before) + 1);

    snprintf(path, sizeof path, "/v1/holds/%s", hold);
    r = request(f, "DELETE", path, NULL);
    assert_int_equal(r.code, 200);
    done(&r);
    assert_true(metric(f, "cerberus_serve_holds") == 0);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_status_lists_every_engine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_switch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup, teardown),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
