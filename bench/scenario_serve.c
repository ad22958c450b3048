/*
 * scenario_serve.c — the serve scenario of cerberus-bench: what a lock
 * costs through `cerberus serve` (DESIGN.md §15) over taking it in-process,
 * and how a blocking acquisition through the daemon hands a name over
 * compared with the try-lock-and-poll pattern Dapr's lock API forces on
 * its callers.
 *
 * The daemon runs in this process (serve/, the code `cerberus serve` runs)
 * on a unix socket of its own, with a client of its own on the engine, as
 * a daemon on the host would; the callers speak HTTP/1.1 to it with
 * libcurl, one easy handle (one kept-alive connection) per thread, and in
 * the serve row also through a lean client (below). Two rows:
 *
 *   serve          N threads, each on a name of its own: POST
 *                  /v1/locks/{name}/acquire {"wait_ms": 0}, then DELETE
 *                  /v1/holds/{hold}. The ceiling is the same cycle
 *                  in-process on a client of the bench's own
 *                  (cerb_lock_acquire, cerb_hold_release), in alternating
 *                  rounds of about half a second after a warm-up of each;
 *                  the ratio is ops/s over in-process ops/s, and the report
 *                  gives the p50 overhead per cycle (serve p50 − in-process
 *                  p50; the target is 100 µs or less) beside the round
 *                  trip of a bare GET /healthz by the same callers, two of
 *                  which are a cycle's floor on this machine.
 *   serve-handoff  W waiters on one name through the daemon. Blocking: each
 *                  waits in POST acquire {"wait_ms": 10000}; when it is
 *                  granted it records the time since the previous holder
 *                  stamped its release, stamps its own and releases. Polling
 *                  (Dapr's pattern): each tries (POST
 *                  /v1.0-alpha1/lock/{store}, expiryInSeconds 30) and, told
 *                  false, sleeps a poll period and tries again; granted,
 *                  the same stamp and unlock, then a period's sleep before
 *                  its next try (its next tick). Each sleep is the period
 *                  times a random factor from 0.5 to 1.5, as a client that
 *                  polls well jitters (pollers in step would all wake a
 *                  whole period after a release). Only a grant to another
 *                  worker than the last releaser counts as a hand-off, on
 *                  both sides. Polling runs twice, every 10 ms (a tight
 *                  poll: W waiters then send W x 100 requests a second)
 *                  and every 100 ms; the ceiling is the 10 ms side's p50,
 *                  the ratio its p50 / blocking p50 (the target is 10 or
 *                  more), and the report gives the 100 ms side too.
 *
 * The lean client writes each request with one write() on a kept-alive
 * unix socket and reads the answer by its Content-Length, as small HTTP
 * clients do (Python's http.client, Go's net/http): libcurl's own work per
 * request is a large part of a round trip on this kind of machine, and it
 * belongs to the caller, not to the daemon. The serve row measures the
 * cycle and the bare round trip both ways, in the same rounds.
 *
 * The hand-off sides run one after the other (blocking, then polling), each
 * for the scenario's duration, since the polling side's latency is the
 * poll period, not the machine's speed of the moment.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <errno.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <curl/curl.h>
#include <jansson.h>

#include "scenarios.h"
#include "serve.h"

#define HANDOFF_WAIT_MS 10000
#define DAPR_STORE "cerberus"

/* One caller's connection to the daemon. */
struct http {
    CURL *curl;
    struct curl_slist *headers;
    char url[512];
    char body[2048];
    size_t len;
    long code;
    /* the lean client: its connection (-1 until the first call) */
    bool lean;
    int fd;
    char sock[108];
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct http *h = ud;
    size_t k = size * n, room = sizeof h->body - 1 - h->len;

    memcpy(h->body + h->len, p, k < room ? k : room);
    h->len += k < room ? k : room;
    h->body[h->len] = '\0';
    return k;
}

static int http_init(struct http *h, const char *sock)
{
    memset(h, 0, sizeof *h);
    h->fd = -1;
    snprintf(h->sock, sizeof h->sock, "%s", sock);
    h->curl = curl_easy_init();
    h->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (!h->curl || !h->headers)
        return -1;
    curl_easy_setopt(h->curl, CURLOPT_UNIX_SOCKET_PATH, sock);
    curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, h);
    curl_easy_setopt(h->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h->curl, CURLOPT_TIMEOUT_MS, (long)HANDOFF_WAIT_MS + 5000L);
    curl_easy_setopt(h->curl, CURLOPT_HTTPHEADER, h->headers);
    return 0;
}

static void http_free(struct http *h)
{
    if (h->fd >= 0)
        close(h->fd);
    if (h->curl)
        curl_easy_cleanup(h->curl);
    curl_slist_free_all(h->headers);
}

/* ---- the lean client ---- */

static int lean_fail(struct http *h, const char *what)
{
    snprintf(h->body, sizeof h->body, "lean client: %s", what);
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    return -1;
}

static int lean_connect(struct http *h)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};

    snprintf(a.sun_path, sizeof a.sun_path, "%s", h->sock);
    h->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (h->fd < 0)
        return lean_fail(h, strerror(errno));
    if (connect(h->fd, (struct sockaddr *)&a, sizeof a) != 0)
        return lean_fail(h, strerror(errno));
    return 0;
}

/* The Content-Length of the head @hd (ended by its blank line), or -1. */
static long lean_length(const char *hd)
{
    for (const char *l = strstr(hd, "\r\n"); l; l = strstr(l + 2, "\r\n")) {
        if (strncasecmp(l + 2, "Content-Length:", 15) == 0)
            return strtol(l + 17, NULL, 10);
        if (l[2] == '\r')
            break;
    }
    return -1;
}

/* http_call over the lean client's socket: one write of the whole request,
 * reads until the head's blank line and then the body's Content-Length
 * bytes. The daemon answers every request with a Content-Length. */
static int lean_call(struct http *h, const char *method, const char *path, const char *body)
{
    char req[1024], in[sizeof h->body + 1024];
    size_t bl = body ? strlen(body) : 0, got = 0;
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: cerberus\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, path, bl, body ? body : "");
    char *end = NULL;
    long len;

    h->len = 0;
    h->body[0] = '\0';
    h->code = 0;
    if (n < 0 || (size_t)n >= sizeof req)
        return lean_fail(h, "request too long");
    if (h->fd < 0 && lean_connect(h) != 0)
        return -1;
    for (ssize_t off = 0, w; off < n; off += w)
        if ((w = write(h->fd, req + off, (size_t)(n - off))) <= 0)
            return lean_fail(h, w < 0 ? strerror(errno) : "write: nothing written");
    while (!end) {
        ssize_t r = read(h->fd, in + got, sizeof in - 1 - got);
        if (r <= 0)
            return lean_fail(h, r < 0 ? strerror(errno) : "the daemon closed the connection");
        got += (size_t)r;
        in[got] = '\0';
        end = strstr(in, "\r\n\r\n");
        if (!end && got == sizeof in - 1)
            return lean_fail(h, "head too long");
    }
    if (sscanf(in, "HTTP/1.%*d %ld", &h->code) != 1 || (len = lean_length(in)) < 0)
        return lean_fail(h, "an answer without a status or a Content-Length");
    end += 4;
    if ((size_t)len > sizeof in - 1 - (size_t)(end - in))
        return lean_fail(h, "body too long");
    while ((size_t)(in + got - end) < (size_t)len) {
        ssize_t r = read(h->fd, in + got, sizeof in - 1 - got);
        if (r <= 0)
            return lean_fail(h, r < 0 ? strerror(errno) : "the daemon closed the connection");
        got += (size_t)r;
    }
    h->len = (size_t)len < sizeof h->body ? (size_t)len : sizeof h->body - 1;
    memcpy(h->body, end, h->len);
    h->body[h->len] = '\0';
    return 0;
}

/* One request: @method on @path with @body (NULL: none). The HTTP code in
 * h->code and the answer in h->body. Returns 0, or -1 (transport error,
 * its text in h->body). */
static int http_call(struct http *h, const char *method, const char *path, const char *body)
{
    CURLcode rc;

    if (h->lean)
        return lean_call(h, method, path, body);
    snprintf(h->url, sizeof h->url, "http://cerberus%s", path);
    h->len = 0;
    h->body[0] = '\0';
    h->code = 0;
    curl_easy_setopt(h->curl, CURLOPT_URL, h->url);
    curl_easy_setopt(h->curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h->curl, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(h->curl, CURLOPT_POSTFIELDSIZE, body ? (long)strlen(body) : 0L);
    rc = curl_easy_perform(h->curl);
    if (rc != CURLE_OK) {
        snprintf(h->body, sizeof h->body, "%s", curl_easy_strerror(rc));
        return -1;
    }
    curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &h->code);
    return 0;
}

/* The string member @key of the JSON answer, copied to @out. */
static int answer_str(const struct http *h, const char *key, char *out, size_t cap)
{
    json_t *j = json_loads(h->body, 0, NULL);
    const char *v = json_string_value(json_object_get(j, key));
    int ok = v && strlen(v) < cap;

    if (ok)
        memcpy(out, v, strlen(v) + 1);
    json_decref(j);
    return ok ? 0 : -1;
}

struct serve_ctx {
    /* in-process side */
    cerb_lock *lock;
    /* daemon side */
    struct http http;
    char name[96];
    char owner[64];
    struct serve_shared *sh;
    int poll_ms;       /* polling: the period */
    unsigned seed;     /* and its jitter (rand_r) */
};

/* Sleeps @c's poll period times a factor from 0.5 to 1.5: the pattern
 * measured (a poll), not a synchronisation. */
static void poll_sleep(struct serve_ctx *c)
{
    long ns = (long)c->poll_ms * 1000000L / 2 +
              (long)((double)rand_r(&c->seed) / RAND_MAX * c->poll_ms * 1000000.0);
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&ts, NULL);
}

struct serve_shared {
    _Atomic int64_t released_ns; /* hand-off: the last holder's release stamp; 0 = none */
    atomic_int released_by;      /* and which worker it was */
};

static void fail_http(struct bench_worker *w, const char *what, const struct http *h)
{
    bench_worker_fail(w, "%s: HTTP %ld: %.300s", what, h->code, h->body);
}

static void *inproc_body(void *p)
{
    struct bench_worker *w = p;
    struct serve_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        cerb_hold *hold = NULL;
        cerb_status st = cerb_lock_acquire(c->lock, 0, NULL, &hold);
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "acquire", c->lock, st);
            break;
        }
        st = cerb_hold_release(hold);
        cerb_hold_free(hold);
        if (st != CERB_OK) {
            bench_worker_fail(w, "release \"%s\": %s", c->name, cerb_status_name(st));
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

/* One acquire + release through the daemon; 0, or -1 after failing @w. */
static int serve_cycle(struct bench_worker *w, struct serve_ctx *c)
{
    char path[256], hold[64];

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", c->name);
    if (http_call(&c->http, "POST", path, "{\"wait_ms\": 0}") != 0 || c->http.code != 200 ||
        answer_str(&c->http, "hold", hold, sizeof hold) != 0) {
        fail_http(w, "acquire", &c->http);
        return -1;
    }
    snprintf(path, sizeof path, "/v1/holds/%s", hold);
    if (http_call(&c->http, "DELETE", path, NULL) != 0 || c->http.code != 200) {
        fail_http(w, "release", &c->http);
        return -1;
    }
    return 0;
}

static void *healthz_body(void *p)
{
    struct bench_worker *w = p;
    struct serve_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        if (http_call(&c->http, "GET", "/healthz", NULL) != 0 || c->http.code != 200) {
            fail_http(w, "healthz", &c->http);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

static void *serve_body(void *p)
{
    struct bench_worker *w = p;
    struct serve_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        if (serve_cycle(w, c) != 0)
            break;
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

/* Hand-off, a grant at @now: the time since the last release stamp is
 * recorded when another worker made it (none before the first release of
 * the phase; a worker that takes the name back is no hand-off). */
static void record_handoff(struct bench_worker *w, struct serve_ctx *c, int64_t now,
                           uint64_t *n)
{
    int64_t rel = atomic_load(&c->sh->released_ns);

    if (rel > 0 && now > rel && atomic_load(&c->sh->released_by) != w->idx) {
        bench_hist_record(w->hist, now - rel);
        atomic_store_explicit(&w->ops, ++*n, memory_order_relaxed);
    }
}

static void *blocking_body(void *p)
{
    struct bench_worker *w = p;
    struct serve_ctx *c = w->ctx;
    uint64_t n = 0;

    while (!bench_worker_done(w, bench_now_ns())) {
        char path[256], body[64], hold[64];
        snprintf(path, sizeof path, "/v1/locks/%s/acquire", c->name);
        snprintf(body, sizeof body, "{\"wait_ms\": %d}", HANDOFF_WAIT_MS);
        if (http_call(&c->http, "POST", path, body) != 0 || c->http.code != 200 ||
            answer_str(&c->http, "hold", hold, sizeof hold) != 0) {
            /* The phase's end leaves waiters queued: a timeout then is
             * no failure. */
            if (c->http.code == 408 && bench_worker_done(w, bench_now_ns()))
                break;
            fail_http(w, "acquire (hand-off)", &c->http);
            break;
        }
        record_handoff(w, c, bench_now_ns(), &n);
        atomic_store(&c->sh->released_by, w->idx);
        atomic_store(&c->sh->released_ns, bench_now_ns());
        snprintf(path, sizeof path, "/v1/holds/%s", hold);
        if (http_call(&c->http, "DELETE", path, NULL) != 0 || c->http.code != 200) {
            fail_http(w, "release (hand-off)", &c->http);
            break;
        }
    }
    w->end_ns = bench_now_ns();
    return NULL;
}

static void *polling_body(void *p)
{
    struct bench_worker *w = p;
    struct serve_ctx *c = w->ctx;
    uint64_t n = 0;
    char path[128], body[512];

    snprintf(path, sizeof path, "/v1.0-alpha1/lock/%s", DAPR_STORE);
    while (!bench_worker_done(w, bench_now_ns())) {
        json_t *j;
        int got;
        snprintf(body, sizeof body,
                 "{\"resourceId\": \"%s\", \"lockOwner\": \"%s\", \"expiryInSeconds\": 30}",
                 c->name, c->owner);
        if (http_call(&c->http, "POST", path, body) != 0 || c->http.code != 200) {
            fail_http(w, "Dapr lock", &c->http);
            break;
        }
        j = json_loads(c->http.body, 0, NULL);
        got = json_is_true(json_object_get(j, "success"));
        json_decref(j);
        if (!got) {
            poll_sleep(c);
            continue;
        }
        record_handoff(w, c, bench_now_ns(), &n);
        atomic_store(&c->sh->released_by, w->idx);
        atomic_store(&c->sh->released_ns, bench_now_ns());
        snprintf(path, sizeof path, "/v1.0-alpha1/unlock/%s", DAPR_STORE);
        snprintf(body, sizeof body, "{\"resourceId\": \"%s\", \"lockOwner\": \"%s\"}",
                 c->name, c->owner);
        if (http_call(&c->http, "POST", path, body) != 0 || c->http.code != 200 ||
            !strstr(c->http.body, "\"status\"")) {
            fail_http(w, "Dapr unlock", &c->http);
            break;
        }
        {
            /* A poller tries again at its next tick, not at once: at once
             * it would take the name back before any other poller woke. */
            poll_sleep(c);
        }
        snprintf(path, sizeof path, "/v1.0-alpha1/lock/%s", DAPR_STORE);
    }
    w->end_ns = bench_now_ns();
    return NULL;
}

/* The daemon and the callers' contexts of one run. */
struct serve_run {
    const struct bench_engine *e;
    const struct bench_opts *o;
    int n;
    cerb_client *daemon_client, *client;
    struct cerb__serve *srv;
    char sock[108];
    struct serve_ctx *ctxs;
    void **ctxp;
    struct bench_hist *hists;
    struct serve_shared sh;
};

static void run_close(struct serve_run *r)
{
    for (int i = 0; r->ctxs && i < r->n; i++) {
        cerb_lock_free(r->ctxs[i].lock);
        http_free(&r->ctxs[i].http);
    }
    cerb__serve_stop(r->srv);
    cerb_client_close(r->daemon_client);
    cerb_client_close(r->client);
    free(r->ctxs);
    free(r->ctxp);
    free(r->hists);
}

/* Start the daemon and @n callers; names of their own unless @one_name.
 * Returns 0, or -1 (printed; run_close frees what was made). */
static int run_open(struct serve_run *r, const struct bench_engine *e,
                    const struct bench_opts *o, int n, int one_name)
{
    static atomic_int seq;
    int run = atomic_fetch_add(&seq, 1);
    char err[256];
    cerb_status st;

    memset(r, 0, sizeof *r);
    r->e = e;
    r->o = o;
    r->n = n;
    r->ctxs = calloc((size_t)n, sizeof *r->ctxs);
    r->ctxp = calloc((size_t)n, sizeof *r->ctxp);
    r->hists = calloc((size_t)n, sizeof *r->hists);
    if (!r->ctxs || !r->ctxp || !r->hists) {
        bench_errorf("out of memory");
        return -1;
    }
    if (!(r->daemon_client = bench_client_open(e)) || !(r->client = bench_client_open(e)))
        return -1;
    snprintf(r->sock, sizeof r->sock, "/tmp/cerb-bench-serve-%ld-%d.sock", (long)getpid(), run);
    st = cerb__serve_start(r->daemon_client, r->sock, &r->srv, err, sizeof err);
    if (st != CERB_OK) {
        bench_errorf("cannot start the daemon on %s: %s (%s)", r->sock, err,
                     cerb_status_name(st));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        struct serve_ctx *c = &r->ctxs[i];
        c->sh = &r->sh;
        snprintf(c->name, sizeof c->name, "bench-serve-%ld-%d-%d", (long)getpid(), run,
                 one_name ? 0 : i);
        snprintf(c->owner, sizeof c->owner, "bench-owner-%ld-%d", (long)getpid(), i);
        if (http_init(&c->http, r->sock) != 0) {
            bench_errorf("out of memory (libcurl)");
            return -1;
        }
        st = cerb_lock_new(r->client, c->name, NULL, &c->lock);
        if (st != CERB_OK) {
            bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", c->name, cerb_last_error(),
                         cerb_status_name(st));
            return -1;
        }
        r->ctxp[i] = c;
    }
    return 0;
}

static void row_init(struct bench_result *out, const char *scenario, const char *engine,
                     int threads)
{
    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "%s", scenario);
    snprintf(out->engine, sizeof out->engine, "%s", engine);
    out->threads = threads;
    out->ratio = out->ratio_paired_median = -1;
    out->cmds_per_op = out->ceiling_cmds_per_op = -1;
    out->cmds_per_op_least = out->ceiling_cmds_per_op_least = -1;
}

/* Every caller of @r on the lean client (@on) or on libcurl. */
static void use_lean(struct serve_run *r, bool on)
{
    for (int i = 0; i < r->n; i++)
        r->ctxs[i].http.lean = on;
}

int bench_serve(const struct bench_engine *e, const struct bench_opts *o, int threads,
                struct bench_result *out)
{
    struct serve_run r;
    struct bench_hist *lib = malloc(sizeof *lib), *raw = malloc(sizeof *raw);
    struct bench_hist *one = malloc(sizeof *one), *lean = malloc(sizeof *lean);
    int64_t lib_ns = 0, raw_ns = 0, lean_ns = 0, side_ns = (int64_t)(o->duration_s * 1e9);
    int rounds = bench_rounds_for(o->duration_s), n_paired = 0, rc = -1;
    double paired[BENCH_MAX_ROUNDS];
    char label[96];

    row_init(out, "serve", e->name, threads);
    if (!lib || !raw || !one || !lean) {
        bench_errorf("out of memory");
        free(lib);
        free(raw);
        free(one);
        free(lean);
        return -1;
    }
    if (run_open(&r, e, o, threads, 0) != 0)
        goto done;
    side_ns /= rounds;
    bench_hist_init(lib);
    bench_hist_init(raw);
    bench_hist_init(lean);
    snprintf(label, sizeof label, "serve %s x%d warm-up", e->name, threads);
    if (bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s), inproc_body, r.ctxp,
                            NULL, r.hists, NULL, NULL, o->progress) != 0 ||
        bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s), serve_body, r.ctxp,
                            NULL, r.hists, NULL, NULL, o->progress) != 0)
        goto done;
    use_lean(&r, true);
    if (bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s), serve_body, r.ctxp,
                            NULL, r.hists, NULL, NULL, o->progress) != 0)
        goto done;
    for (int round = 1; round <= rounds; round++) {
        int64_t raw_before = raw_ns, lib_before_ns = lib_ns;
        uint64_t lib_before = lib->n;
        snprintf(label, sizeof label, "serve %s x%d in-process %d/%d", e->name, threads, round,
                 rounds);
        bench_hist_init(one);
        if (bench_run_and_merge(label, threads, side_ns, inproc_body, r.ctxp, NULL, r.hists, one,
                                &raw_ns, o->progress) != 0)
            goto done;
        bench_hist_merge(raw, one);
        bench_note_round_p50(out, one);
        snprintf(label, sizeof label, "serve %s x%d daemon %d/%d", e->name, threads, round,
                 rounds);
        use_lean(&r, false);
        if (bench_run_and_merge(label, threads, side_ns, serve_body, r.ctxp, NULL, r.hists, lib,
                                &lib_ns, o->progress) != 0)
            goto done;
        if (one->n && raw_ns > raw_before && lib_ns > lib_before_ns)
            paired[n_paired++] = ((double)(lib->n - lib_before) / (double)(lib_ns - lib_before_ns)) /
                                 ((double)one->n / (double)(raw_ns - raw_before));
        snprintf(label, sizeof label, "serve %s x%d daemon, lean client %d/%d", e->name, threads,
                 round, rounds);
        use_lean(&r, true);
        if (bench_run_and_merge(label, threads, side_ns, serve_body, r.ctxp, NULL, r.hists, lean,
                                &lean_ns, o->progress) != 0)
            goto done;
    }
    /* The floor of a cycle on this machine: two bare round trips. */
    snprintf(label, sizeof label, "serve %s x%d healthz", e->name, threads);
    use_lean(&r, false);
    bench_hist_init(one);
    if (bench_run_and_merge(label, threads, side_ns, healthz_body, r.ctxp, NULL, r.hists, one,
                            NULL, o->progress) != 0)
        goto done;
    out->http_rtt_p50_us = (double)bench_hist_quantile(one, 0.50) / 1000.0;
    out->http_rtt_p99_us = (double)bench_hist_quantile(one, 0.99) / 1000.0;
    snprintf(label, sizeof label, "serve %s x%d healthz, lean client", e->name, threads);
    use_lean(&r, true);
    bench_hist_init(one);
    if (bench_run_and_merge(label, threads, side_ns, healthz_body, r.ctxp, NULL, r.hists, one,
                            NULL, o->progress) != 0)
        goto done;
    out->lean_rtt_p50_us = (double)bench_hist_quantile(one, 0.50) / 1000.0;
    out->lean_rtt_p99_us = (double)bench_hist_quantile(one, 0.99) / 1000.0;
    out->lean_p50_us = (double)bench_hist_quantile(lean, 0.50) / 1000.0;
    out->lean_p99_us = (double)bench_hist_quantile(lean, 0.99) / 1000.0;
    out->lean_ops_per_s = lean_ns > 0 ? (double)lean->n / ((double)lean_ns / 1e9) : 0;
    out->ratio_paired_median = bench_median(paired, n_paired);
    out->elapsed_s = (double)lib_ns / 1e9;
    out->ops = lib->n;
    out->ops_per_s = lib_ns > 0 ? (double)lib->n / out->elapsed_s : 0;
    bench_fill_latency(out, lib);
    if (raw_ns > 0) {
        out->ceiling_kind = "in-process";
        out->ceiling_ops_per_s = (double)raw->n / ((double)raw_ns / 1e9);
        bench_fill_ceiling_latency(out, raw);
        if (out->ceiling_ops_per_s > 0)
            out->ratio = out->ops_per_s / out->ceiling_ops_per_s;
    }
    rc = 0;
done:
    run_close(&r);
    free(lib);
    free(raw);
    free(one);
    free(lean);
    return rc;
}

int bench_serve_handoff(const struct bench_engine *e, const struct bench_opts *o,
                        struct bench_result *out)
{
    struct serve_run r;
    struct bench_hist *blk = malloc(sizeof *blk), *poll = malloc(sizeof *poll);
    struct bench_hist *slow = malloc(sizeof *slow);
    int64_t blk_ns = 0, poll_ns = 0, dur = (int64_t)(o->duration_s * 1e9);
    int n = o->waiters > 0 ? o->waiters : 8, rc = -1;
    char label[96];

    row_init(out, "serve-handoff", e->name, n);
    if (!blk || !poll || !slow) {
        bench_errorf("out of memory");
        free(blk);
        free(poll);
        free(slow);
        return -1;
    }
    bench_hist_init(blk);
    bench_hist_init(poll);
    bench_hist_init(slow);
    if (run_open(&r, e, o, n, 1) != 0)
        goto done;
    snprintf(label, sizeof label, "serve-handoff %s x%d blocking", e->name, n);
    atomic_store(&r.sh.released_ns, 0);
    if (bench_run_and_merge(label, n, dur, blocking_body, r.ctxp, NULL, r.hists, blk, &blk_ns,
                            o->progress) != 0)
        goto done;
    for (int i = 0; i < n; i++) {
        r.ctxs[i].poll_ms = 10;
        r.ctxs[i].seed = (unsigned)i + 1;
    }
    snprintf(label, sizeof label, "serve-handoff %s x%d polling 10 ms", e->name, n);
    atomic_store(&r.sh.released_ns, 0);
    if (bench_run_and_merge(label, n, dur, polling_body, r.ctxp, NULL, r.hists, poll, &poll_ns,
                            o->progress) != 0)
        goto done;
    for (int i = 0; i < n; i++)
        r.ctxs[i].poll_ms = 100;
    snprintf(label, sizeof label, "serve-handoff %s x%d polling 100 ms", e->name, n);
    atomic_store(&r.sh.released_ns, 0);
    if (bench_run_and_merge(label, n, dur, polling_body, r.ctxp, NULL, r.hists, slow, NULL,
                            o->progress) != 0)
        goto done;
    out->poll_slow_p50_us = (double)bench_hist_quantile(slow, 0.50) / 1000.0;
    out->poll_slow_p99_us = (double)bench_hist_quantile(slow, 0.99) / 1000.0;
    out->elapsed_s = (double)blk_ns / 1e9;
    out->ops = blk->n;
    out->acquisitions = blk->n;
    out->ops_per_s = blk_ns > 0 ? (double)blk->n / out->elapsed_s : 0;
    bench_fill_latency(out, blk);
    if (poll->n) {
        out->ceiling_kind = "poll";
        out->ceiling_ops_per_s = poll_ns > 0 ? (double)poll->n / ((double)poll_ns / 1e9) : 0;
        bench_fill_ceiling_latency(out, poll);
        if (out->p50_us > 0)
            out->ratio = out->ceiling_p50_us / out->p50_us;
    }
    rc = 0;
done:
    run_close(&r);
    free(blk);
    free(poll);
    free(slow);
    return rc;
}
