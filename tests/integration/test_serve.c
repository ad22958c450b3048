/*
 * test_serve.c — `cerberus serve` (serve/, DESIGN.md §15) in-process on a
 * temporary unix socket, with the built-in "local" engine, spoken to with
 * libcurl (CURLOPT_UNIX_SOCKET_PATH): /healthz; an acquisition gives a hold
 * id and a fencing token; a second acquisition of the held name with
 * wait_ms 0 is 409 BUSY; DELETE releases (200) once, then 404; a malformed
 * or oversized body is 400 with nothing held; a wait ends 408 TIMEOUT, or
 * 200 when the name is released meanwhile; a live server's socket (or a
 * file that is no socket) is never taken over; a stop ends a waiting
 * acquisition with 503 and answers it; a hold nobody keeps alive is
 * released after its lease_ms. GET /v1/holds/{hold}/events streams
 * heartbeats (text/event-stream; 404 for an unknown hold); a hold listened
 * to past its window is kept; a DELETE ends the stream; with a client that
 * does not renew leases (lock.renew = false) a hold is lost at its lease's
 * end and the stream says `event: lost`, then DELETE is 410 LOST. Over TCP (127.0.0.1, a port the kernel
 * chose): a request without `Authorization: Bearer TOKEN`, or with another
 * token, is 401 UNAUTHORIZED with a Bearer challenge (healthz too), one
 * with it is answered; an address that is not loopback, or TCP without a
 * token, is refused. Bytes that are not UTF-8 in a path part (or a
 * character an error text's cut would halve), on the native and the Dapr
 * routes, get a JSON answer (a lock name 400, an id 404), never a dropped
 * connection. The unix socket: a plain file at its path is refused and
 * left as it was; a live listener whose backlog is full (connect: EAGAIN)
 * is neither waited on nor taken over; a stop removes its socket file only
 * while it is still its own (a newer server's file at the path stays).
 * With the fault engine releasing slowly (1 s each), a stop with 50 holds
 * returns within its bound (serve.drain_ms 1000: well under 5 s, where
 * one release after another took 50 s) and says how many it left.
 * A lock name of 300 to 4000 bytes answers the library's 400 and reason
 * (the helper's URL buffer once cut such paths into a 404); a method a
 * route does not answer is 405 with Allow, a path no method takes 404.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
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

/* One request, without cmocka asserts (it also runs on other threads):
 * CURLE_OK with the reply's code and parsed JSON body (decref it; NULL when
 * the body is not JSON), or the transfer's error. */
static CURLcode try_request(struct fixture *f, const char *method, const char *path,
                            const char *body, struct serve_http_reply *r)
{
    return serve_http_try(f->sock, 0, NULL, method, path, body, false, r);
}

/* One request; the reply's code and parsed JSON body (decref it). */
static struct serve_http_reply request(struct fixture *f, const char *method, const char *path,
                            const char *body)
{
    struct serve_http_reply r;
    CURLcode rc = try_request(f, method, path, body, &r);

    if (rc != CURLE_OK)
        fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    assert_non_null(r.body);
    return r;
}

/* A POST of @n bytes of JSON-ish text sent chunked, with no Content-Length. */
struct source {
    size_t left;
};

static size_t produce(char *buf, size_t size, size_t n, void *ud)
{
    struct source *src = ud;
    size_t k = size * n < src->left ? size * n : src->left;
    memset(buf, ' ', k);
    src->left -= k;
    return k;
}

static struct serve_http_reply chunked_post(struct fixture *f, const char *path, size_t n)
{
    struct serve_http_reply r = {0};
    struct source src = {n};
    struct curl_slist *h = curl_slist_append(NULL, "Transfer-Encoding: chunked");
    char url[600], *text = NULL;
    CURL *c = curl_easy_init();

    assert_non_null(c);
    snprintf(url, sizeof url, "http://localhost%s", path);
    curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, f->sock);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, produce);
    curl_easy_setopt(c, CURLOPT_READDATA, &src);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, serve_http_collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &text);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    assert_non_null(text);
    r.body = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(r.body);
    return r;
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
    snprintf(f->dir, sizeof f->dir, "/tmp/cerb-serve-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/serve.sock", f->dir);
    assert_int_equal(cerb_client_open_string(&f->client, "engines = (\"local\");\n"),
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
    rmdir(f->dir);
    free(f);
    return 0;
}

static void test_healthz(void **state)
{
    struct fixture *f = *state;
    struct stat st;
    struct serve_http_reply r = request(f, "GET", "/healthz", NULL);

    assert_int_equal(r.code, 200);
    assert_true(json_is_true(json_object_get(r.body, "ok")));
    json_decref(r.body);
    assert_int_equal(stat(f->sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
}

static void test_acquire_busy_release(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve");
    char path[512], hold[64], del[128];
    struct serve_http_reply r;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"wait_ms\": 0, \"lease_ms\": 5000}");
    assert_int_equal(r.code, 200);
    assert_int_equal(strlen(str(&r, "hold")), 32);
    snprintf(hold, sizeof hold, "%s", str(&r, "hold"));
    assert_true(strtoull(str(&r, "fencing_token"), NULL, 10) > 0);
    assert_string_equal(str(&r, "engine"), "local");
    /* How long the daemon's library counts it valid: within its lease. */
    {
        json_int_t v = json_integer_value(json_object_get(r.body, "valid_ms"));
        assert_true(v > 0 && v <= 5000);
    }
    json_decref(r.body);

    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 409);
    assert_string_equal(str(&r, "status"), "BUSY");
    json_decref(r.body);

    snprintf(del, sizeof del, "/v1/holds/%s/keepalive", hold);
    r = request(f, "POST", del, "");
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "state"), "valid");
    {
        json_int_t v = json_integer_value(json_object_get(r.body, "valid_ms"));
        assert_true(v > 0 && v <= 5000);
    }
    json_decref(r.body);

    snprintf(del, sizeof del, "/v1/holds/%s", hold);
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 200);
    assert_true(json_is_true(json_object_get(r.body, "released")));
    json_decref(r.body);

    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 404);
    json_decref(r.body);

    /* Released: free again, without a body (both members are optional). */
    r = request(f, "POST", path, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    free(name);
    /* That hold is left to cerb__serve_stop, which releases it. */
}

static void test_bad_bodies(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-bad");
    char path[512], *big;
    struct serve_http_reply r;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"wait_ms\": ");
    assert_int_equal(r.code, 400);
    assert_string_equal(str(&r, "status"), "EINVAL");
    json_decref(r.body);

    r = request(f, "POST", path, "{\"wait_ms\": \"soon\"}");
    assert_int_equal(r.code, 400);
    json_decref(r.body);

    big = malloc(8192);
    assert_non_null(big);
    memset(big, ' ', 8191);
    big[0] = '{';
    big[8190] = '}';
    big[8191] = '\0';
    r = request(f, "POST", path, big);
    assert_int_equal(r.code, 400);
    json_decref(r.body);
    free(big);

    /* The same without a Content-Length (chunked): read, and refused. */
    r = chunked_post(f, path, 8192);
    assert_int_equal(r.code, 400);
    assert_string_equal(str(&r, "status"), "EINVAL");
    json_decref(r.body);

    /* Nothing was held: the name is free. */
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    free(name);
}

/* A second server on the path of a live one is refused, and the first one
 * goes on answering; a file that is not a socket is never replaced. */
static void test_socket_in_use(void **state)
{
    struct fixture *f = *state;
    struct cerb__serve *other = NULL;
    char err[256], file[160];
    struct serve_http_reply r;
    FILE *fp;

    assert_int_not_equal(cerb__serve_start(f->client, f->sock, &other, err, sizeof err),
                         CERB_OK);
    assert_null(other);
    assert_non_null(strstr(err, "another server"));
    r = request(f, "GET", "/healthz", NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);

    snprintf(file, sizeof file, "%s/plain", f->dir);
    fp = fopen(file, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_not_equal(cerb__serve_start(f->client, file, &other, err, sizeof err),
                         CERB_OK);
    assert_non_null(strstr(err, "not a socket"));
    assert_int_equal(unlink(file), 0);
}

/* wait_ms makes the server wait: 408 TIMEOUT when the holder keeps the
 * name, 200 when it is released during the wait. */
struct waiter {
    struct fixture *f;
    const char *path;
    struct serve_http_reply r;
    CURLcode rc;
};

static void *wait_acquire(void *ud)
{
    struct waiter *w = ud;
    w->rc = try_request(w->f, "POST", w->path, "{\"wait_ms\": 10000}", &w->r);
    return NULL;
}

static void test_blocking_wait(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-wait");
    char path[512], del[128];
    struct waiter w = {f, path, {0}, CURLE_OK};
    struct serve_http_reply r;
    pthread_t t;
    struct timespec nap = {0, 200 * 1000000L};
    int64_t t0;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, NULL);
    assert_int_equal(r.code, 200);
    snprintf(del, sizeof del, "/v1/holds/%s", str(&r, "hold"));
    json_decref(r.body);

    t0 = cerb_test_now_ms();
    r = request(f, "POST", path, "{\"wait_ms\": 300}");
    assert_int_equal(r.code, 408);
    assert_string_equal(str(&r, "status"), "TIMEOUT");
    assert_true(cerb_test_now_ms() - t0 >= 290);
    json_decref(r.body);

    assert_int_equal(pthread_create(&t, NULL, wait_acquire, &w), 0);
    nanosleep(&nap, NULL); /* let it wait (if not, it simply gets the name later) */
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(w.rc, CURLE_OK);
    assert_int_equal(w.r.code, 200);
    assert_int_equal(strlen(str(&w.r, "hold")), 32);
    json_decref(w.r.body);
    free(name);
}

/* A stop does not wait out a caller's wait_ms: the waiting acquisition
 * ends with 503 INTERRUPTED at once, and the stop releases the hold. */
static void test_stop_ends_waits(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-stop");
    char path[512];
    struct waiter w = {f, path, {0}, CURLE_OK};
    struct serve_http_reply r;
    pthread_t t;
    struct timespec nap = {0, 200 * 1000000L};
    int64_t t0;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    assert_int_equal(pthread_create(&t, NULL, wait_acquire, &w), 0);
    nanosleep(&nap, NULL); /* let it wait (if not, it is refused: 503 too) */
    t0 = cerb_test_now_ms();
    cerb__serve_stop(f->serve);
    f->serve = NULL;
    assert_true(cerb_test_now_ms() - t0 < 3000);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (w.rc != CURLE_OK)
        fail_msg("the waiting request: %s", curl_easy_strerror(w.rc));
    assert_int_equal(w.r.code, 503);
    assert_non_null(w.r.body);
    if (strcmp(str(&w.r, "status"), "INTERRUPTED") != 0) /* not waiting yet */
        assert_string_equal(str(&w.r, "status"), "UNAVAILABLE");
    json_decref(w.r.body);
    free(name);
}

/* A hold whose caller neither keeps it alive nor releases it is released
 * once its lease_ms passed; keepalives keep it. */
static void test_silent_caller_loses_hold(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-expiry");
    char path[512], keep[128], del[128];
    struct serve_http_reply r;
    struct timespec tick = {0, 100 * 1000000L};
    int64_t t0;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"lease_ms\": 400}");
    assert_int_equal(r.code, 200);
    snprintf(keep, sizeof keep, "/v1/holds/%s/keepalive", str(&r, "hold"));
    snprintf(del, sizeof del, "/v1/holds/%s", str(&r, "hold"));
    json_decref(r.body);

    /* Kept alive every 100 ms for three leases: still held. */
    t0 = cerb_test_now_ms();
    while (cerb_test_now_ms() - t0 < 1200) {
        r = request(f, "POST", keep, "");
        assert_int_equal(r.code, 200);
        json_decref(r.body);
        nanosleep(&tick, NULL);
    }
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 409);
    json_decref(r.body);

    /* Silent: released within a lease and a tick or so; the name is then
     * granted to a waiter, and the old hold id is unknown. */
    t0 = cerb_test_now_ms();
    r = request(f, "POST", path, "{\"wait_ms\": 5000}");
    assert_int_equal(r.code, 200);
    assert_true(cerb_test_now_ms() - t0 < 2000);
    json_decref(r.body);
    r = request(f, "POST", keep, "");
    assert_int_equal(r.code, 404);
    json_decref(r.body);
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 404);
    json_decref(r.body);
    free(name);
}

/* ---- event streams ---- */

/* What one GET of an event stream received: stops at the @count-th
 * @until (when not NULL) or at @timeout_ms. */
struct sse {
    char text[16384];
    size_t len;
    const char *until;
    int count;
    atomic_int got; /* something came (read by another thread) */
};

static int occurrences(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

static size_t sse_collect(char *p, size_t size, size_t n, void *ud)
{
    struct sse *e = ud;
    size_t k = size * n;

    if (k > sizeof e->text - 1 - e->len)
        k = sizeof e->text - 1 - e->len;
    memcpy(e->text + e->len, p, k);
    e->len += k;
    e->text[e->len] = '\0';
    atomic_store(&e->got, 1);
    if (e->until && occurrences(e->text, e->until) >= e->count)
        return 0; /* enough: the transfer stops (CURLE_WRITE_ERROR) */
    return size * n;
}

struct listen_args {
    struct fixture *f;
    char path[160];
    long timeout_ms;
    struct sse e;
    long code;
    char type[64];
    CURLcode rc;
    int64_t ms; /* how long it listened */
};

/* Listens to a->path; no cmocka asserts (it also runs on other threads). */
static void *listen_events(void *ud)
{
    struct listen_args *a = ud;
    char url[256], *type = NULL;
    CURL *c = curl_easy_init();
    int64_t t0 = cerb_test_now_ms();

    a->code = 0;
    a->type[0] = '\0';
    a->rc = CURLE_OUT_OF_MEMORY;
    if (!c)
        return NULL;
    snprintf(url, sizeof url, "http://localhost%s", a->path);
    curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, a->f->sock);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, a->timeout_ms);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sse_collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &a->e);
    a->rc = curl_easy_perform(c);
    a->ms = cerb_test_now_ms() - t0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a->code);
    if (curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type) == CURLE_OK && type)
        snprintf(a->type, sizeof a->type, "%s", type);
    curl_easy_cleanup(c);
    return NULL;
}

/* Acquires @name with @body; the hold id in @id (33 bytes). */
static void acquire_hold(struct fixture *f, const char *name, const char *body, char *id)
{
    char path[512];
    struct serve_http_reply r;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, body);
    assert_int_equal(r.code, 200);
    assert_int_equal(strlen(str(&r, "hold")), 32);
    strcpy(id, str(&r, "hold"));
    json_decref(r.body);
}

static void test_events_heartbeat(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-events");
    char id[33];
    struct listen_args a = {0};
    struct serve_http_reply r;

    cerb__serve_set_heartbeat_ms(f->serve, 200);
    acquire_hold(f, name, "{}", id);
    a.f = f;
    snprintf(a.path, sizeof a.path, "/v1/holds/%s/events", id);
    a.timeout_ms = 5000;
    a.e.until = "event: heartbeat\n";
    a.e.count = 3; /* one at once, two more 200 ms apart */
    listen_events(&a);
    assert_int_equal(a.rc, CURLE_WRITE_ERROR); /* we stopped it */
    assert_int_equal(a.code, 200);
    assert_string_equal(a.type, "text/event-stream");
    assert_true(a.ms >= 300 && a.ms < 4000);
    assert_non_null(strstr(a.e.text, "data: {\"hold\":\""));
    assert_non_null(strstr(a.e.text, id));
    /* Each heartbeat says the hold's state and how long it is valid. */
    assert_non_null(strstr(a.e.text, "\",\"state\":\"valid\",\"valid_ms\":"));

    /* An unknown hold: 404, no stream. */
    r = request(f, "GET", "/v1/holds/0123456789abcdef0123456789abcdef/events", NULL);
    assert_int_equal(r.code, 404);
    assert_string_equal(str(&r, "status"), "NOT_OWNER");
    json_decref(r.body);
    r = request(f, "GET", "/v1/holds/nope/events", NULL);
    assert_int_equal(r.code, 404);
    json_decref(r.body);
    free(name);
}

static void test_listened_hold_kept(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-listened");
    char id[33], path[512], keep[128];
    struct listen_args a = {0};
    struct serve_http_reply r;
    int64_t t0;

    cerb__serve_set_heartbeat_ms(f->serve, 100);
    acquire_hold(f, name, "{\"lease_ms\": 300}", id);
    /* Listened to for four windows with no keepalive: still held. */
    a.f = f;
    snprintf(a.path, sizeof a.path, "/v1/holds/%s/events", id);
    a.timeout_ms = 1200;
    listen_events(&a);
    assert_int_equal(a.rc, CURLE_OPERATION_TIMEDOUT); /* it listened to the end */
    assert_int_equal(a.code, 200);
    assert_true(occurrences(a.e.text, "event: heartbeat\n") >= 5);
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 409);
    json_decref(r.body);
    snprintf(keep, sizeof keep, "/v1/holds/%s/keepalive", id);
    r = request(f, "POST", keep, "");
    assert_int_equal(r.code, 200);
    json_decref(r.body);

    /* Nobody listens now: released within its window, as any silent hold. */
    t0 = cerb_test_now_ms();
    r = request(f, "POST", path, "{\"wait_ms\": 5000}");
    assert_int_equal(r.code, 200);
    assert_true(cerb_test_now_ms() - t0 < 2000);
    json_decref(r.body);
    free(name);
}

static void *delete_later(void *ud)
{
    struct listen_args *a = ud;
    char del[128];
    struct serve_http_reply r;
    struct timespec nap = {0, 300 * 1000000L};

    nanosleep(&nap, NULL);
    snprintf(del, sizeof del, "/v1/holds/%.32s", a->path + strlen("/v1/holds/"));
    try_request(a->f, "DELETE", del, NULL, &r);
    a->code = r.code;
    json_decref(r.body);
    return NULL;
}

static void test_events_end_on_release(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-events-end");
    char id[33];
    struct listen_args a = {0}, d = {0};
    pthread_t t;

    acquire_hold(f, name, "{}", id); /* heartbeats every 5 s: only the first */
    a.f = d.f = f;
    snprintf(a.path, sizeof a.path, "/v1/holds/%s/events", id);
    snprintf(d.path, sizeof d.path, "%s", a.path);
    a.timeout_ms = 10000;
    assert_int_equal(pthread_create(&t, NULL, delete_later, &d), 0);
    listen_events(&a);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(d.code, 200);
    assert_int_equal(a.rc, CURLE_OK); /* the server ended the stream */
    assert_int_equal(a.code, 200);
    assert_true(a.ms < 5000);
    assert_int_equal(occurrences(a.e.text, "event: heartbeat\n"), 1);
    assert_null(strstr(a.e.text, "event: lost"));
    /* Told before the stop releases the hold. */
    assert_non_null(strstr(a.e.text, "event: released\n"));
    free(name);
}

static void *listen_thread(void *ud)
{
    return listen_events(ud);
}

static void test_stop_ends_streams(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-events-stop");
    char id[33];
    struct listen_args a = {0};
    struct timespec nap = {0, 10 * 1000000L};
    pthread_t t;
    int64_t t0;

    acquire_hold(f, name, "{}", id); /* heartbeats every 5 s: only the first */
    a.f = f;
    snprintf(a.path, sizeof a.path, "/v1/holds/%s/events", id);
    a.timeout_ms = 10000;
    assert_int_equal(pthread_create(&t, NULL, listen_thread, &a), 0);
    t0 = cerb_test_now_ms();
    while (!atomic_load(&a.e.got) && cerb_test_now_ms() - t0 < 5000)
        nanosleep(&nap, NULL);
    assert_true(atomic_load(&a.e.got));
    /* The stop ends the stream at once, not at the next heartbeat. */
    t0 = cerb_test_now_ms();
    cerb__serve_stop(f->serve);
    f->serve = NULL;
    assert_true(cerb_test_now_ms() - t0 < 2000);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.rc, CURLE_OK);
    assert_int_equal(a.code, 200);
    assert_null(strstr(a.e.text, "event: lost"));
    free(name);
}

/* A server whose client does not renew leases: a hold is lost at its
 * lease's end (the local engine's watchdog), as an engine paused past the
 * lease would lose it. */
static int setup_no_renew(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    char err[256];

    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/cerb-serve-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/serve.sock", f->dir);
    assert_int_equal(cerb_client_open_string(&f->client,
                                             "engines = (\"local\");\n"
                                             "lock = { renew = false; };\n"),
                     CERB_OK);
    if (cerb__serve_start(f->client, f->sock, &f->serve, err, sizeof err) != CERB_OK)
        fail_msg("cerb__serve_start: %s", err);
    *state = f;
    return 0;
}

static void test_events_lost(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-lost");
    char id[33], del[128];
    struct listen_args a = {0};
    struct serve_http_reply r;

    acquire_hold(f, name, "{\"lease_ms\": 600}", id);
    a.f = f;
    snprintf(a.path, sizeof a.path, "/v1/holds/%s/events", id);
    a.timeout_ms = 5000;
    listen_events(&a);
    assert_int_equal(a.rc, CURLE_OK); /* the server ended it after `lost` */
    assert_int_equal(a.code, 200);
    assert_non_null(strstr(a.e.text, "event: lost\ndata: {\"hold\":\""));
    assert_true(a.ms < 3000);
    /* Listening again: `lost` at once. */
    memset(&a.e, 0, sizeof a.e);
    listen_events(&a);
    assert_int_equal(a.rc, CURLE_OK);
    assert_non_null(strstr(a.e.text, "event: lost\n"));
    assert_true(a.ms < 1000);
    /* Its release says so. */
    snprintf(del, sizeof del, "/v1/holds/%s", id);
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 410);
    assert_string_equal(str(&r, "status"), "LOST");
    json_decref(r.body);
    free(name);
}

/* valid_ms never runs past the daemon's own window: a caller that counts
 * it down from a keepalive is never told more than the daemon keeps the
 * hold for while it is silent (here 1 s, beside the library's 10 s). */
static void test_valid_ms_within_the_window(void **state)
{
    struct fixture *f = *state;
    struct cerb__serve_opts o = CERB__SERVE_OPTS_INIT;
    char *name = test_name("serve-window");
    char path[512], keep[128];
    struct serve_http_reply r;

    o.keepalive_ms = 1000;
    cerb__serve_configure(f->serve, &o);
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, NULL);
    assert_int_equal(r.code, 200);
    assert_int_equal(json_integer_value(json_object_get(r.body, "window_ms")), 1000);
    assert_true(json_integer_value(json_object_get(r.body, "valid_ms")) > 0);
    assert_true(json_integer_value(json_object_get(r.body, "valid_ms")) <= 1000);
    snprintf(keep, sizeof keep, "/v1/holds/%s/keepalive", str(&r, "hold"));
    json_decref(r.body);
    r = request(f, "POST", keep, "");
    assert_int_equal(r.code, 200);
    assert_true(json_integer_value(json_object_get(r.body, "valid_ms")) > 0);
    assert_true(json_integer_value(json_object_get(r.body, "valid_ms")) <= 1000);
    json_decref(r.body);
    free(name);
}

/* A keepalive of a hold the library lost answers 410 LOST, not 200: a
 * caller that only keeps its hold alive (no event stream) must learn that
 * the name may be another's. The hold is dropped: the name is free here. */
static void test_keepalive_of_lost_hold(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-keep-lost");
    char id[33], keep[128], path[512];
    struct serve_http_reply r;
    struct timespec tick = {0, 50 * 1000000L};
    int64_t t0 = cerb_test_now_ms();
    long code = 200;

    acquire_hold(f, name, "{\"lease_ms\": 300}", id);
    snprintf(keep, sizeof keep, "/v1/holds/%s/keepalive", id);
    /* Not renewed (renew = false): lost after its 300 ms lease. */
    while (code == 200 && cerb_test_now_ms() - t0 < 5000) {
        r = request(f, "POST", keep, "");
        code = r.code;
        if (code == 410)
            assert_string_equal(str(&r, "status"), "LOST");
        json_decref(r.body);
        if (code == 200)
            nanosleep(&tick, NULL); /* the keepalive period of a caller */
    }
    assert_int_equal(code, 410);
    assert_true(cerb_test_now_ms() - t0 >= 250);
    r = request(f, "POST", keep, "");
    assert_int_equal(r.code, 404);
    json_decref(r.body);
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    free(name);
}

/* An acquisition whose caller hung up while it waited takes no hold: the
 * name goes to the next live caller, not to nobody for 60 s. */
static void test_waiter_that_hung_up(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-hung-up");
    char id[33], path[512], del[128], url[600];
    struct serve_http_reply r;
    CURL *c;
    CURLcode rc;
    int64_t t0;

    acquire_hold(f, name, NULL, id);
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    /* A waiter that gives up after 300 ms: its connection closes. */
    c = curl_easy_init();
    assert_non_null(c);
    snprintf(url, sizeof url, "http://localhost%s", path);
    curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, f->sock);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 300L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{\"wait_ms\": 5000, \"lease_ms\": 60000}");
    rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    assert_int_equal(rc, CURLE_OPERATION_TIMEDOUT);
    /* The holder lets go: a live caller gets the name. */
    snprintf(del, sizeof del, "/v1/holds/%s", id);
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    t0 = cerb_test_now_ms();
    r = request(f, "POST", path, "{\"wait_ms\": 3000}");
    assert_int_equal(r.code, 200);
    assert_true(cerb_test_now_ms() - t0 < 2000);
    json_decref(r.body);
    free(name);
}

/* A caller that stops listening (its process died) leaves the hold its
 * window from then on, not a heartbeat more: the name is free within the
 * lease, however long the heartbeat period. */
static void test_listener_that_hung_up(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-listener-gone");
    char id[33], path[512];
    struct listen_args a = {0};
    struct serve_http_reply r;
    int64_t t0;

    cerb__serve_set_heartbeat_ms(f->serve, 4000);
    acquire_hold(f, name, "{\"lease_ms\": 300}", id);
    a.f = f;
    snprintf(a.path, sizeof a.path, "/v1/holds/%s/events", id);
    a.e.until = "event: heartbeat\n";
    a.e.count = 1;
    listen_events(&a); /* hangs up after the first heartbeat */
    assert_int_equal(a.rc, CURLE_WRITE_ERROR);
    t0 = cerb_test_now_ms();
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
    r = request(f, "POST", path, "{\"wait_ms\": 10000}");
    assert_int_equal(r.code, 200);
    assert_true(cerb_test_now_ms() - t0 < 1500);
    json_decref(r.body);
    free(name);
}

static void test_status_and_inspect(void **state)
{
    struct fixture *f = *state;
    char *name = test_name("serve-inspect");
    char id[33], path[512];
    struct serve_http_reply r;
    json_t *engines, *e;

    r = request(f, "GET", "/v1/status", NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "current"), "local");
    engines = json_object_get(r.body, "engines");
    assert_int_equal(json_array_size(engines), 1);
    e = json_array_get(engines, 0);
    assert_string_equal(json_string_value(json_object_get(e, "name")), "local");
    assert_true(json_is_true(json_object_get(e, "active")));
    assert_string_equal(json_string_value(json_object_get(e, "breaker")), "closed");
    assert_true(json_is_integer(json_object_get(e, "acquires")));
    json_decref(r.body);

    acquire_hold(f, name, "{}", id);
    snprintf(path, sizeof path, "/v1/locks/%s", name);
    r = request(f, "GET", path, NULL);
    assert_int_equal(r.code, 200);
    assert_string_equal(str(&r, "name"), name);
    engines = json_object_get(r.body, "holders");
    assert_int_equal(json_array_size(engines), 1);
    e = json_array_get(engines, 0);
    assert_string_equal(json_string_value(json_object_get(e, "engine")), "local");
    assert_true(json_is_false(json_object_get(e, "waiting")));
    assert_true(json_is_string(json_object_get(e, "fence"))); /* decimal string */
    assert_true(json_integer_value(json_object_get(e, "ttl_ms")) > 0);
    json_decref(r.body);

    /* Released: nobody holds it. */
    snprintf(path, sizeof path, "/v1/holds/%s", id);
    r = request(f, "DELETE", path, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    snprintf(path, sizeof path, "/v1/locks/%s", name);
    r = request(f, "GET", path, NULL);
    assert_int_equal(r.code, 200);
    assert_int_equal(json_array_size(json_object_get(r.body, "holders")), 0);
    json_decref(r.body);
    free(name);
}

/* A request over TCP to 127.0.0.1:@port with the header `Authorization:
 * @auth` (none when NULL); the reply's headers in *@headers (free them). */
static struct serve_http_reply tcp_request(unsigned port, const char *method, const char *path,
                                const char *body, const char *auth, char **headers)
{
    char url[256], hdr[256], *text = NULL;
    struct curl_slist *h = NULL;
    struct serve_http_reply r = {0};
    CURL *c = curl_easy_init();

    assert_non_null(c);
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, serve_http_collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &text);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, serve_http_collect);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, headers);
    if (auth) {
        snprintf(hdr, sizeof hdr, "Authorization: %s", auth);
        h = curl_slist_append(h, hdr);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    assert_non_null(text);
    r.body = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(r.body);
    return r;
}

/* A TCP request refused: 401 UNAUTHORIZED with the Bearer challenge. */
static void assert_unauthorized(unsigned port, const char *method, const char *path,
                                const char *body, const char *auth)
{
    char *headers = NULL;
    struct serve_http_reply r = tcp_request(port, method, path, body, auth, &headers);

    assert_int_equal(r.code, 401);
    assert_string_equal(str(&r, "status"), "UNAUTHORIZED");
    assert_non_null(headers);
    assert_non_null(strstr(headers, "WWW-Authenticate: Bearer"));
    json_decref(r.body);
    free(headers);
}

#define TOKEN "s3cret-Token_for-tests"

/* Over TCP, only a request with the token is answered; the unix socket
 * needs none. */
static void test_tcp_token(void **state)
{
    struct fixture *f = *state;
    char err[256], path[256], *headers = NULL, *name = test_name("serve-tcp");
    unsigned port = 0;
    struct serve_http_reply r;

    if (cerb__serve_listen_tcp(f->serve, "127.0.0.1:0", TOKEN, &port, err, sizeof err) !=
        CERB_OK)
        fail_msg("cerb__serve_listen_tcp: %s", err);
    assert_true(port > 0);
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);

    assert_unauthorized(port, "POST", path, "{}", NULL);
    assert_unauthorized(port, "GET", "/healthz", NULL, NULL);
    assert_unauthorized(port, "POST", path, "{}", "Bearer wrong");
    assert_unauthorized(port, "POST", path, "{}", "Bearer " TOKEN "x");
    assert_unauthorized(port, "POST", path, "{}", "Bearer s3cret-Token_for-testX");
    assert_unauthorized(port, "POST", path, "{}", "Bearer s3cret");
    assert_unauthorized(port, "POST", path, "{}", "Basic " TOKEN);
    assert_unauthorized(port, "POST", path, "{}", TOKEN);
    /* Nothing was acquired by the refused ones. */
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 200);
    {
        char del[128];
        snprintf(del, sizeof del, "/v1/holds/%s", str(&r, "hold"));
        json_decref(r.body);
        r = request(f, "DELETE", del, NULL);
        assert_int_equal(r.code, 200);
        json_decref(r.body);
    }

    r = tcp_request(port, "GET", "/healthz", NULL, "Bearer " TOKEN, &headers);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    r = tcp_request(port, "POST", path, "{\"wait_ms\": 0}", "Bearer " TOKEN, &headers);
    assert_int_equal(r.code, 200);
    assert_int_equal(strlen(str(&r, "hold")), 32);
    {
        char del[128];
        snprintf(del, sizeof del, "/v1/holds/%s", str(&r, "hold"));
        json_decref(r.body);
        /* Held: busy for a caller on the unix socket too. */
        r = request(f, "POST", path, "{\"wait_ms\": 0}");
        assert_int_equal(r.code, 409);
        json_decref(r.body);
        assert_unauthorized(port, "DELETE", del, NULL, NULL);
        r = tcp_request(port, "DELETE", del, NULL, "bearer " TOKEN, &headers);
        assert_int_equal(r.code, 200);
        json_decref(r.body);
    }
    /* The token is in no answer. */
    assert_null(strstr(headers, TOKEN));
    free(headers);
    free(name);
}

/* TCP only on loopback, and only with a token. */
static void test_tcp_refused(void **state)
{
    struct fixture *f = *state;
    static const char *const not_loopback[] = {"0.0.0.0:0",   "10.1.2.3:0", "[::]:0",
                                               "[::ffff:127.0.0.1]:0", "192.168.0.1:80"};
    static const char *const malformed[] = {"127.0.0.1",   "localhost:0", "127.0.0.1:x",
                                            "127.0.0.1:65536", ":80", "::1:80",
                                            "[::1]80", "127.0.0.1: 80", "127.0.0.1:+80",
                                            "127.0.0.1:-0", "127.0.0.1:000080000",
                                            "127.1:0", "[::1]:", "[]:0"};
    char err[256];
    unsigned port = 0;
    cerb_status st;

    for (size_t i = 0; i < sizeof not_loopback / sizeof *not_loopback; i++) {
        err[0] = '\0';
        assert_int_equal(cerb__serve_listen_tcp(f->serve, not_loopback[i], TOKEN, &port, err,
                                                sizeof err),
                         CERB_EINVAL);
        assert_non_null(strstr(err, "loopback"));
    }
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++)
        assert_int_equal(cerb__serve_listen_tcp(f->serve, malformed[i], TOKEN, &port, err,
                                                sizeof err),
                         CERB_EINVAL);
    assert_int_equal(cerb__serve_listen_tcp(f->serve, "127.0.0.1:0", NULL, &port, err,
                                            sizeof err),
                     CERB_EINVAL);
    assert_non_null(strstr(err, "--token-file"));
    assert_int_equal(cerb__serve_listen_tcp(f->serve, "127.0.0.1:0", "", &port, err,
                                            sizeof err),
                     CERB_EINVAL);
    /* ::1 is loopback (EIO only where the host has no IPv6). */
    st = cerb__serve_listen_tcp(f->serve, "[::1]:0", TOKEN, &port, err, sizeof err);
    assert_true(st == CERB_OK || st == CERB_EIO);
    if (st == CERB_OK) {
        struct serve_http_reply r;
        char url[64], *text = NULL;
        CURL *c = curl_easy_init();
        snprintf(url, sizeof url, "http://[::1]:%u/healthz", port);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, serve_http_collect);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &text);
        assert_int_equal(curl_easy_perform(c), CURLE_OK);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
        curl_easy_cleanup(c);
        free(text);
        assert_int_equal(r.code, 401);
    }
}

/* Bytes that are not UTF-8 in a path part, or a character the error text
 * would cut in half, still get a JSON answer: the echoed text is made
 * valid UTF-8, never a dropped connection. */
static void test_bad_utf8_answered(void **state)
{
    struct fixture *f = *state;
    static const struct {
        const char *method, *path, *body;
        long code;
    } cases[] = {
        {"DELETE", "/v1/holds/%ff", NULL, 404},
        {"GET", "/v1/locks/%ff", NULL, 400},
        {"POST", "/v1/locks/%ff%fe/acquire", "{}", 400},
        {"POST", "/v1/holds/%e2%82/keepalive", "", 404},
        {"GET", "/v1/holds/%c0%af/events", NULL, 404},
        /* 39 bytes, then a 3-byte character the 40-byte cut would halve. */
        {"DELETE", "/v1/holds/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa%e2%82%ac", NULL, 404},
        {"POST", "/v1/guard/attempts/%ff/keepalive", "", 404},
        {"POST", "/v1/guard/s/k%ff/finish",
         "{\"attempt\": \"0123456789abcdef0123456789abcdef\", \"succeeded\": false}", 404},
        {"POST", "/v1.0-alpha1/lock/%ff",
         "{\"resourceId\": \"r\", \"lockOwner\": \"o\", \"expiryInSeconds\": 5}", 404}, /* Dapr: no such store */
        {"POST", "/v1.0-alpha1/lock/cerberus",
         "{\"resourceId\": \"r\xff\", \"lockOwner\": \"o\", \"expiryInSeconds\": 5}", 400},
        {"POST", "/v1.0-alpha1/unlock/cerberus", "{\"resourceId\": \"\xe2\x82\", "
                                                  "\"lockOwner\": \"o\"}", 400},
    };

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct serve_http_reply r;
        CURLcode rc = try_request(f, cases[i].method, cases[i].path, cases[i].body, &r);
        if (rc != CURLE_OK)
            fail_msg("%s %s: %s", cases[i].method, cases[i].path, curl_easy_strerror(rc));
        if (!r.body)
            fail_msg("%s %s: %ld without a JSON body", cases[i].method, cases[i].path,
                     r.code);
        if (r.code != cases[i].code)
            fail_msg("%s %s: %ld, not %ld", cases[i].method, cases[i].path, r.code,
                     cases[i].code);
        json_decref(r.body);
    }
}

/* A server's socket file replaced by a newer server's (its file removed,
 * the newer one started at the same path): stopping the older one leaves
 * the newer one's socket in place, and it goes on answering. */
static void test_stop_keeps_newer_socket(void **state)
{
    struct fixture *f = *state;
    struct cerb__serve *newer = NULL;
    struct stat before, after;
    char err[256];
    struct serve_http_reply r;

    assert_int_equal(unlink(f->sock), 0);
    if (cerb__serve_start(f->client, f->sock, &newer, err, sizeof err) != CERB_OK)
        fail_msg("the newer server: %s", err);
    assert_int_equal(lstat(f->sock, &before), 0);
    cerb__serve_stop(f->serve); /* the older one */
    f->serve = newer;
    if (lstat(f->sock, &after) != 0)
        fail_msg("the older server's stop removed the newer server's socket");
    assert_true(S_ISSOCK(after.st_mode));
    assert_true(before.st_ino == after.st_ino && before.st_dev == after.st_dev);
    r = request(f, "GET", "/healthz", NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    /* Its own stop removes its own socket. */
    cerb__serve_stop(f->serve);
    f->serve = NULL;
    assert_int_not_equal(lstat(f->sock, &after), 0);
}

/* A file that is not a socket is refused and left as it was. */
static void test_plain_file_left_alone(void **state)
{
    struct fixture *f = *state;
    struct cerb__serve *other = NULL;
    char err[256], file[160], text[16] = "";
    FILE *fp;

    snprintf(file, sizeof file, "%s/plain", f->dir);
    fp = fopen(file, "w");
    assert_non_null(fp);
    fputs("keep me", fp);
    fclose(fp);
    assert_int_not_equal(cerb__serve_start(f->client, file, &other, err, sizeof err),
                         CERB_OK);
    assert_null(other);
    assert_non_null(strstr(err, "not a socket"));
    fp = fopen(file, "r");
    assert_non_null(fp);
    assert_non_null(fgets(text, sizeof text, fp));
    fclose(fp);
    assert_string_equal(text, "keep me");
    assert_int_equal(unlink(file), 0);
}

/* A start on the path of a live listener whose backlog is full (its
 * connect() fails with EAGAIN, not ECONNREFUSED) must neither hang nor take
 * the socket over. The start runs on a thread, waited for with a deadline. */
struct starter {
    cerb_client *client;
    const char *path;
    struct cerb__serve *serve;
    cerb_status st;
    char err[256];
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *run_start(void *ud)
{
    struct starter *s = ud;
    cerb_status st = cerb__serve_start(s->client, s->path, &s->serve, s->err, sizeof s->err);

    pthread_mutex_lock(&s->mu);
    s->st = st;
    s->done = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void test_busy_listener_not_taken(void **state)
{
    struct fixture *f = *state;
    static struct starter s; /* static: a thread that hung may still use it */
    struct sockaddr_un sa;
    struct stat before, after;
    struct timespec deadline;
    int lfd, cfd[64], n = 0;
    pthread_t th;
    bool done;

    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/busy.sock", f->dir);
    lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(lfd >= 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 0), 0);
    /* Fill its backlog: a non-blocking connect then fails with EAGAIN. */
    for (; n < 64; n++) {
        cfd[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert_true(cfd[n] >= 0);
        if (connect(cfd[n], (struct sockaddr *)&sa, sizeof sa) != 0) {
            assert_int_equal(errno, EAGAIN);
            close(cfd[n]);
            break;
        }
    }
    assert_true(n < 64);
    assert_int_equal(lstat(sa.sun_path, &before), 0);

    memset(&s, 0, sizeof s);
    s.client = f->client;
    s.path = sa.sun_path;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    assert_int_equal(pthread_create(&th, NULL, run_start, &s), 0);
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    pthread_mutex_lock(&s.mu);
    while (!s.done && pthread_cond_timedwait(&s.cv, &s.mu, &deadline) == 0)
        ;
    done = s.done;
    pthread_mutex_unlock(&s.mu);
    if (!done) {
        pthread_detach(th);
        fail_msg("the start hung on a live listener with a full backlog");
    }
    pthread_join(th, NULL);
    if (s.st == CERB_OK) {
        cerb__serve_stop(s.serve);
        fail_msg("the start took over a live listener's socket");
    }
    assert_null(s.serve);
    assert_non_null(strstr(s.err, "another server"));
    assert_int_equal(lstat(sa.sun_path, &after), 0);
    assert_true(before.st_ino == after.st_ino);
    for (int i = 0; i < n; i++)
        close(cfd[i]);
    close(lfd);
    unlink(sa.sun_path);
}

/* A stop with many holds on a server that releases slowly (1 s each, the
 * fault engine) returns within its bound: the holds are released in
 * parallel until a deadline, the rest left to expire with their lease. */
static int setup_fault(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    struct cerb__serve_opts o = CERB__SERVE_OPTS_INIT;
    char err[256];

    assert_non_null(f);
    fault_engine_register();
    fault_engine_reset();
    snprintf(f->dir, sizeof f->dir, "/tmp/cerb-serve-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/serve.sock", f->dir);
    assert_int_equal(cerb_client_open_string(&f->client, "engines = (\"fault\");\n"),
                     CERB_OK);
    o.drain_ms = 1000;
    if (cerb__serve_start(f->client, NULL, &f->serve, err, sizeof err) != CERB_OK)
        fail_msg("cerb__serve_start: %s", err);
    cerb__serve_configure(f->serve, &o);
    if (cerb__serve_listen_unix(f->serve, f->sock, err, sizeof err) != CERB_OK)
        fail_msg("listen: %s", err);
    *state = f;
    return 0;
}

static int teardown_fault(void **state)
{
    fault_engine_reset();
    return teardown(state);
}

static void test_stop_bounded(void **state)
{
    struct fixture *f = *state;
    enum { HOLDS = 50 };
    char *name = test_name("serve-stop");
    char path[512];
    size_t released;
    bool drained;
    int64_t t0, ms;
    struct timespec ts;

    for (int i = 0; i < HOLDS; i++) {
        struct serve_http_reply r;
        snprintf(path, sizeof path, "/v1/locks/%s-%d/acquire", name, i);
        r = request(f, "POST", path, "{\"wait_ms\": 0, \"lease_ms\": 60000}");
        assert_int_equal(r.code, 200);
        json_decref(r.body);
    }
    fault_engine_delay(FAULT_RELEASE, 1000, false);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    cerb__serve_stop_report(f->serve, &released, &drained);
    f->serve = NULL;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 - t0;
    /* The close releases what is left at once. */
    fault_engine_delay(FAULT_RELEASE, 0, false);
    /* drain_ms 1000: nothing to drain, 1 s of releasing, the releases in
     * flight then (1 s): well under 5 s, where one after another took 50. */
    if (ms >= 5000)
        fail_msg("the stop took %lld ms with %d slow releases", (long long)ms, HOLDS);
    assert_true(released >= 1 && released < HOLDS);
    assert_true(drained);
    free(name);
}

/* Silent callers' holds are released several at once: with each release
 * taking 1 s (an engine that answers slowly), 16 holds whose window passed
 * together are all released within about 2 s, where one after another
 * took 16 s and kept the next expiries (and the hang-up watch) waiting. */
static void test_expiry_in_parallel(void **state)
{
    struct fixture *f = *state;
    enum { HOLDS = 16 };
    char *name = test_name("serve-expire");
    char path[512];
    struct serve_http_reply r;
    int64_t t0;

    for (int i = 0; i < HOLDS; i++) {
        snprintf(path, sizeof path, "/v1/locks/%s-%d/acquire", name, i);
        r = request(f, "POST", path, "{\"wait_ms\": 0, \"lease_ms\": 300}");
        assert_int_equal(r.code, 200);
        json_decref(r.body);
    }
    fault_engine_delay(FAULT_RELEASE, 1000, false);
    t0 = cerb_test_now_ms();
    /* The last name comes free once every release before it is done. */
    for (int i = 0; i < HOLDS; i++) {
        snprintf(path, sizeof path, "/v1/locks/%s-%d/acquire", name, i);
        r = request(f, "POST", path, "{\"wait_ms\": 15000}");
        assert_int_equal(r.code, 200);
        json_decref(r.body);
    }
    fault_engine_delay(FAULT_RELEASE, 0, false);
    if (cerb_test_now_ms() - t0 >= 6000)
        fail_msg("16 silent holds with 1 s releases took %lld ms to come free",
                 (long long)(cerb_test_now_ms() - t0));
    free(name);
}

/* A name longer than the library allows answers the library's 400 and its
 * reason, however long (not 404 "no such route"). */
static void test_long_names(void **state)
{
    struct fixture *f = *state;
    static const size_t lens[] = {300, 1023, 1024, 4000};
    char path[4200], *name;
    struct serve_http_reply r;

    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        name = malloc(lens[i] + 1);
        assert_non_null(name);
        memset(name, 'n', lens[i]);
        name[lens[i]] = '\0';
        snprintf(path, sizeof path, "/v1/locks/%s/acquire", name);
        r = request(f, "POST", path, "{\"wait_ms\": 0}");
        if (r.code != 400 || !strstr(str(&r, "error"), "longer than"))
            fail_msg("acquire, a %zu-byte name: %ld %s", lens[i], r.code, str(&r, "error"));
        json_decref(r.body);
        snprintf(path, sizeof path, "/v1/locks/%s", name);
        r = request(f, "GET", path, NULL);
        if (r.code != 400 || !strstr(str(&r, "error"), "longer than"))
            fail_msg("inspect, a %zu-byte name: %ld %s", lens[i], r.code, str(&r, "error"));
        json_decref(r.body);
        free(name);
    }
}

/* A method a route does not answer is 405 with an Allow header; a path
 * that is no route is still 404. */
static void test_wrong_method(void **state)
{
    struct fixture *f = *state;
    static const struct {
        const char *method, *path, *allow;
    } cases[] = {
        {"PUT", "/v1/holds/0123456789abcdef0123456789abcdef", "DELETE"},
        {"GET", "/v1/holds/0123456789abcdef0123456789abcdef/keepalive", "POST"},
        {"POST", "/v1/holds/0123456789abcdef0123456789abcdef/events", "GET"},
        {"DELETE", "/v1/locks/x/acquire", "POST"},
        {"POST", "/v1/locks/x", "GET"},
        {"POST", "/healthz", "GET"},
        {"GET", "/v1/switch", "POST"},
        {"GET", "/v1/guard/s/k/begin", "POST"},
    };

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char url[256], *text = NULL, *headers = NULL, want[64];
        long code = 0;
        CURL *c = curl_easy_init();
        assert_non_null(c);
        snprintf(url, sizeof url, "http://localhost%s", cases[i].path);
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, f->sock);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, cases[i].method);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, serve_http_collect);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &text);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, serve_http_collect);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &headers);
        assert_int_equal(curl_easy_perform(c), CURLE_OK);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(c);
        snprintf(want, sizeof want, "Allow: %s\r\n", cases[i].allow);
        if (code != 405 || !headers || !strstr(headers, want))
            fail_msg("%s %s: %ld, headers %s", cases[i].method, cases[i].path, code,
                     headers ? headers : "none");
        assert_non_null(text);
        assert_non_null(strstr(text, "\"EINVAL\""));
        free(text);
        free(headers);
    }
    {
        struct serve_http_reply r = request(f, "GET", "/v1/nothing", NULL);
        assert_int_equal(r.code, 404);
        json_decref(r.body);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_healthz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_acquire_busy_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_bodies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_in_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blocking_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_ends_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_caller_loses_hold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_heartbeat, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listened_hold_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_end_on_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_ends_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_lost, setup_no_renew, teardown),
        cmocka_unit_test_setup_teardown(test_valid_ms_within_the_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keepalive_of_lost_hold, setup_no_renew, teardown),
        cmocka_unit_test_setup_teardown(test_waiter_that_hung_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listener_that_hung_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_and_inspect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_utf8_answered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_keeps_newer_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_file_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_listener_not_taken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_bounded, setup_fault, teardown_fault),
        cmocka_unit_test_setup_teardown(test_expiry_in_parallel, setup_fault, teardown_fault),
        cmocka_unit_test_setup_teardown(test_long_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_method, setup, teardown),
    };
    int rc;

    cerb_test_debug_aids();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
