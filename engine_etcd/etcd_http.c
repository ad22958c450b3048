/*
 * etcd_http.c — the gateway client on libcurl: handles, endpoints, tokens,
 * and the unary request with its retry rules.
 *
 * Handles. curl easy handles are pooled: a stack of idle handles under a
 * mutex, a new one made when none is idle, so concurrency never waits for a
 * handle and a warm handle (with its kept-alive connection in its own
 * connection cache) is reused first. Every handle forces HTTP/1.1 (curl
 * would otherwise try h2c, which reaches etcd's raw gRPC side rather than
 * the gateway), sets CURLOPT_NOSIGNAL (a library must not take over
 * SIGALRM or die of SIGPIPE), keeps TCP alive, and sends an empty `Expect:`
 * so a larger body does not wait a round trip for "100 Continue". Headers
 * are kept per handle as two lists (unary with `Grpc-Timeout`, stream
 * without), rebuilt only when the auth token changes. Every request says
 * `Grpc-Metadata-hasleader: true`: without it a write on a member without
 * a leader hangs for seconds and a watch stays silently open.
 *
 * Endpoints. One index, shared by all threads, is used until a request
 * fails there in a way that says "this member cannot serve": connect
 * failure, timeout, HTTP 503 / gRPC UNAVAILABLE. Then it moves to the next
 * endpoint (compare-and-swap, so that threads failing together move it
 * once), and stays there.
 *
 * Retries. A failure whose outcome is definite (not sent, or refused before
 * any work) is tried again at once on the next endpoint, and after a whole
 * round of endpoints with a short jittered pause, until the caller's
 * deadline. An unknown outcome (timeout after sending, etcd's "request timed
 * out") is tried again only for requests the caller marked idempotent —
 * the lock txns are, because the key is derived from the lease. A 401 or a
 * stale-auth answer fetches a new token once and tries again.
 */
#include "internal_posix.h"

#include "etcd_http.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

/*
 * TLS client files for https:// endpoints: etcd.ca_file (a private CA;
 * "" = the system's store), etcd.cert_file and etcd.key_file (a client
 * certificate). Handed to libcurl as they are.
 */
static void set_tls(CURL *h, const struct cerb_etcd_config *ec)
{
    if (ec->ca_file && ec->ca_file[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, ec->ca_file);
    if (ec->cert_file && ec->cert_file[0])
        curl_easy_setopt(h, CURLOPT_SSLCERT, ec->cert_file);
    if (ec->key_file && ec->key_file[0])
        curl_easy_setopt(h, CURLOPT_SSLKEY, ec->key_file);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    /* Process-wide and never undone: the host may use curl itself. */
    curl_init_rc = curl_global_init(CURL_GLOBAL_ALL);
}

/* ---- endpoints ---- */

cerb_status cerb__etcd_http_init(struct etcd_http *h, const struct cerb_etcd_config *ec)
{
    memset(h, 0, sizeof *h);
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return cerb__error_set(CERB_EIO, "etcd: curl_global_init: %s",
                               curl_easy_strerror(curl_init_rc));
    h->ec = ec;
    for (size_t i = 0; i < ec->n_endpoints && i < CERB_MAX_ENDPOINTS; i++) {
        size_t n = strlen(ec->endpoints[i]);
        while (n > 0 && ec->endpoints[i][n - 1] == '/')
            n--;
        h->ep[i] = cerb__malloc(n + 1);
        if (!h->ep[i]) {
            cerb__etcd_http_destroy(h);
            return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
        }
        memcpy(h->ep[i], ec->endpoints[i], n);
        h->ep[i][n] = '\0';
        h->n_ep++;
    }
    if (h->n_ep == 0)
        return cerb__error_set(CERB_ECONFIG, "etcd: no endpoints configured");
    /* A fresh client starts at a random endpoint, so many clients spread
     * over a cluster instead of all loading the first member. */
    atomic_init(&h->cur, (unsigned)cerb__rand_below(h->n_ep));
    atomic_init(&h->auth_gen, 1);
    snprintf(h->grpc_timeout, sizeof h->grpc_timeout, "Grpc-Timeout: %lldm",
             (long long)ec->op_timeout_ms);
    cerb__mutex_init(&h->mu);
    cerb__mutex_init(&h->auth_mu);
    return CERB_OK;
}

static void conn_free(struct etcd_conn *c)
{
    if (!c)
        return;
    if (c->h)
        curl_easy_cleanup(c->h);
    curl_slist_free_all(c->hdr_unary);
    curl_slist_free_all(c->hdr_stream);
    curl_slist_free_all(c->hdr_plain);
    cerb__free(c->url);
    cerb__free(c->buf);
    cerb__free(c);
}

void cerb__etcd_http_destroy(struct etcd_http *h)
{
    bool inited = h->n_ep > 0;
    while (h->idle) {
        struct etcd_conn *c = h->idle;
        h->idle = c->next;
        conn_free(c);
    }
    for (size_t i = 0; i < CERB_MAX_ENDPOINTS; i++)
        cerb__free(h->ep[i]);
    cerb__free(h->auth_header);
    if (inited) {
        cerb__mutex_destroy(&h->mu);
        cerb__mutex_destroy(&h->auth_mu);
    }
    memset(h, 0, sizeof *h);
}

const char *cerb__etcd_endpoint(struct etcd_http *h)
{
    return h->ep[atomic_load(&h->cur) % h->n_ep];
}

void cerb__etcd_rotate(cerb_engine *e, unsigned idx)
{
    struct etcd_http *h = &e->http;
    if (h->n_ep < 2)
        return;
    unsigned next = (unsigned)((idx + 1) % h->n_ep);
    if (atomic_compare_exchange_strong(&h->cur, &idx, next)) {
        ETCD_COUNT(e, rotations);
        CERB_LOG_I("etcd: moving from %s to %s", h->ep[idx], h->ep[next]);
    }
}

/* ---- handles ---- */

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct etcd_conn *c = ud;
    size_t k = size * n;
    if (c->len + k + 1 > c->cap) {
        if (c->len + k + 1 > ETCD_MAX_BODY)
            return 0; /* CURLE_WRITE_ERROR */
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < c->len + k + 1)
            cap *= 2;
        char *nb = cerb__realloc(c->buf, cap);
        if (!nb)
            return 0;
        c->buf = nb;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, p, k);
    c->len += k;
    c->buf[c->len] = '\0';
    return k;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    struct etcd_conn *c = ud;
    (void)dt, (void)dn, (void)ut, (void)un;
    return c->abort && atomic_load(c->abort) ? 1 : 0;
}

cerb_status cerb__etcd_conn_get(cerb_engine *e, struct etcd_conn **out)
{
    struct etcd_http *h = &e->http;
    struct etcd_conn *c;

    cerb__mutex_lock(&h->mu);
    c = h->idle;
    if (c) {
        h->idle = c->next;
        h->n_idle--;
    }
    cerb__mutex_unlock(&h->mu);
    if (c) {
        c->next = NULL;
        *out = c;
        return CERB_OK;
    }
    c = cerb__calloc(1, sizeof *c);
    if (!c || !(c->h = curl_easy_init())) {
        cerb__free(c);
        return cerb__error_set(CERB_ENOMEM, "etcd: cannot make a curl handle");
    }
    CURL *ch = c->h;
    curl_easy_setopt(ch, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(ch, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(ch, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(ch, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(ch, CURLOPT_ERRORBUFFER, c->err);
    curl_easy_setopt(ch, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(ch, CURLOPT_XFERINFODATA, c);
    curl_easy_setopt(ch, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(ch, CURLOPT_FOLLOWLOCATION, 0L);
    /* Endpoints are reached directly: no proxy from the environment (and
     * no getenv() per request to look for one). */
    curl_easy_setopt(ch, CURLOPT_PROXY, "");
    set_tls(ch, e->ec);
    *out = c;
    return CERB_OK;
}

void cerb__etcd_conn_put(cerb_engine *e, struct etcd_conn *c)
{
    struct etcd_http *h = &e->http;
    if (!c)
        return;
    c->abort = NULL;
    /* A handle that held a big answer gives the memory back. */
    if (c->cap > 65536) {
        cerb__free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
    c->len = 0;
    cerb__mutex_lock(&h->mu);
    if (h->n_idle < ETCD_MAX_IDLE) {
        c->next = h->idle;
        h->idle = c;
        h->n_idle++;
        c = NULL;
    }
    cerb__mutex_unlock(&h->mu);
    conn_free(c); /* a burst of concurrent requests is over */
}

/* (Re)build c's header lists for the current token. */
static cerb_status conn_headers(cerb_engine *e, struct etcd_conn *c)
{
    struct etcd_http *h = &e->http;
    uint64_t gen = atomic_load(&h->auth_gen);
    struct curl_slist *u = NULL, *s = NULL, *pl = NULL;
    bool ok = true;

    if (c->hdr_unary && c->hdr_auth_gen == gen)
        return CERB_OK;
    static const char *const common[] = {
        "Content-Type: application/json",
        "Grpc-Metadata-hasleader: true",
        "Expect:",
    };
    for (size_t i = 0; i < sizeof common / sizeof *common && ok; i++) {
        struct curl_slist *t = curl_slist_append(u, common[i]);
        ok = t != NULL;
        u = t ? t : u;
        t = ok ? curl_slist_append(s, common[i]) : NULL;
        ok = t != NULL;
        s = t ? t : s;
    }
    for (size_t i = 0; i < sizeof common / sizeof *common && ok; i++) {
        struct curl_slist *t = curl_slist_append(pl, common[i]);
        ok = t != NULL;
        pl = t ? t : pl;
    }
    if (ok) {
        struct curl_slist *t = curl_slist_append(u, h->grpc_timeout);
        ok = t != NULL;
        u = t ? t : u;
        t = ok ? curl_slist_append(pl, h->grpc_timeout) : NULL;
        ok = t != NULL;
        pl = t ? t : pl;
    }
    cerb__mutex_lock(&h->auth_mu);
    gen = atomic_load(&h->auth_gen);
    if (ok && h->auth_header) {
        struct curl_slist *t = curl_slist_append(u, h->auth_header);
        ok = t != NULL;
        u = t ? t : u;
        t = ok ? curl_slist_append(s, h->auth_header) : NULL;
        ok = t != NULL;
        s = t ? t : s;
    }
    cerb__mutex_unlock(&h->auth_mu);
    if (!ok) {
        curl_slist_free_all(u);
        curl_slist_free_all(s);
        curl_slist_free_all(pl);
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for headers");
    }
    curl_slist_free_all(c->hdr_unary);
    curl_slist_free_all(c->hdr_stream);
    curl_slist_free_all(c->hdr_plain);
    c->hdr_unary = u;
    c->hdr_stream = s;
    c->hdr_plain = pl;
    c->hdr_auth_gen = gen;
    return CERB_OK;
}

cerb_status cerb__etcd_conn_prepare(cerb_engine *e, struct etcd_conn *c, unsigned idx,
                                    const char *path, const char *body, bool stream,
                                    int64_t timeout_ms)
{
    struct etcd_http *h = &e->http;
    const char *base = h->ep[idx % h->n_ep];
    size_t need = strlen(base) + strlen(path) + 1;
    CURL *ch = c->h;

    if (need > c->url_cap) {
        char *u = cerb__realloc(c->url, need);
        if (!u)
            return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
        c->url = u;
        c->url_cap = need;
    }
    snprintf(c->url, c->url_cap, "%s%s", base, path);
    cerb_status st = conn_headers(e, c);
    if (st != CERB_OK)
        return st;
    c->len = 0;
    c->err[0] = '\0';
    curl_easy_setopt(ch, CURLOPT_URL, c->url);
    if (body) {
        curl_easy_setopt(ch, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(ch, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    } else {
        curl_easy_setopt(ch, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(ch, CURLOPT_HTTPHEADER, stream ? c->hdr_stream : c->hdr_unary);
    int64_t cto = e->ec->connect_timeout_ms;
    if (timeout_ms > 0 && timeout_ms < cto)
        cto = timeout_ms;
    curl_easy_setopt(ch, CURLOPT_CONNECTTIMEOUT_MS, (long)(cto > 0 ? cto : 1));
    curl_easy_setopt(ch, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 0));
    curl_easy_setopt(ch, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(ch, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(ch, CURLOPT_NOPROGRESS, c->abort ? 0L : 1L);
    return CERB_OK;
}

void cerb__etcd_conn_restore(struct etcd_conn *c)
{
    curl_easy_setopt(c->h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c->h, CURLOPT_XFERINFODATA, c);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->h, CURLOPT_NOPROGRESS, 1L);
}

void cerb__etcd_conn_no_token(struct etcd_conn *c)
{
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hdr_plain);
}

bool cerb__etcd_conn_connected(struct etcd_conn *c)
{
    curl_off_t t = 0;
    if (curl_easy_getinfo(c->h, CURLINFO_PRETRANSFER_TIME_T, &t) != CURLE_OK)
        return true;
    return t > 0;
}

/* ---- one attempt ---- */

/*
 * Interpret the answer in c->buf. CERB_OK with *resp, or a failure mapped
 * through cerb__etcd_fail with its outcome and action.
 */
static cerb_status read_answer(cerb_engine *e, struct etcd_call *call, struct etcd_conn *c,
                               unsigned idx, long status, cerb_outcome *oc,
                               enum etcd_action *act)
{
    const char *ep = e->http.ep[idx];
    struct etcd_failure f = {.what = call->what, .http_status = status, .grpc_code = -1};
    struct etcd_error_body eb;

    if (status != 200) {
        cerb__etcd_parse_error(c->buf ? c->buf : "", c->len, &eb);
        f.grpc_code = eb.code;
        f.message = eb.message;
        call->grpc_code = eb.code;
        return cerb__etcd_fail(ep, &f, oc, act);
    }
    json_error_t jerr;
    json_t *root = c->len ? json_loadb(c->buf, c->len, 0, &jerr) : NULL;
    if (!json_is_object(root)) {
        json_decref(root);
        f.bad_body = true;
        f.message = c->len ? jerr.text : "empty body";
        return cerb__etcd_fail(ep, &f, oc, act);
    }
    if (cerb__etcd_error_of(root, &eb)) {
        /* An in-band error of a stream answered with 200. */
        json_decref(root);
        f.grpc_code = eb.code;
        f.message = eb.message;
        call->grpc_code = eb.code;
        return cerb__etcd_fail(ep, &f, oc, act);
    }
    json_t *r = json_object_get(root, "result");
    if (json_is_object(r)) {
        json_incref(r);
        json_decref(root);
        root = r;
    }
    call->resp = root;
    return CERB_OK;
}

static cerb_status attempt(cerb_engine *e, struct etcd_call *call, struct etcd_conn *c,
                           unsigned idx, const char *body, int64_t timeout_ms, cerb_outcome *oc,
                           enum etcd_action *act)
{
    cerb_status st = cerb__etcd_conn_prepare(e, c, idx, call->path, body, false, timeout_ms);
    if (st != CERB_OK) {
        *oc = CERB_OUTCOME_NO;
        *act = ETCD_ACT_NONE;
        return st;
    }
    if (call->no_auth)
        cerb__etcd_conn_no_token(c); /* a stale token would fail authenticate itself */
    ETCD_COUNT(e, requests);
    call->sent_ns = cerb_monotime();
    CURLcode cc = curl_easy_perform(c->h);
    if (cc == CURLE_ABORTED_BY_CALLBACK) {
        *oc = cerb__etcd_conn_connected(c) ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
        *act = ETCD_ACT_NONE;
        return cerb__error_set(CERB_INTERRUPTED, "etcd %s: %s: stopped", e->http.ep[idx],
                               call->what);
    }
    if (cc != CURLE_OK) {
        struct etcd_failure f = {.what = call->what,
                                 .curl_code = (int)cc,
                                 .curl_msg = c->err,
                                 .connected = cerb__etcd_conn_connected(c),
                                 .grpc_code = -1,
                                 .timeout_ms = timeout_ms};
        return cerb__etcd_fail(e->http.ep[idx], &f, oc, act);
    }
    long status = 0;
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    call->http_status = status;
    return read_answer(e, call, c, idx, status, oc, act);
}

cerb_status cerb__etcd_call(cerb_engine *e, struct etcd_call *call)
{
    struct etcd_http *h = &e->http;
    struct etcd_conn *c = NULL;
    char *body = NULL;
    cerb_status st;
    bool any_unknown = false, reauthed = false;
    int tries = 0, unconnected = 0;
    /* The error of the last attempt that had a whole op timeout: when the
     * final one was cut short by the deadline ("no answer within 6 ms"),
     * this says what actually went wrong. */
    char full_why[CERB_ERROR_MAX] = "";
    bool cut_short = false;

    call->resp = NULL;
    call->grpc_code = -1;
    call->http_status = 0;
    call->outcome = CERB_OUTCOME_NO;
    call->sent_ns = 0;
    if (call->body) {
        body = json_dumps(call->body, JSON_COMPACT);
        if (!body)
            return cerb__error_set(CERB_ENOMEM, "etcd: %s: out of memory", call->what);
    }
    st = cerb__etcd_conn_get(e, &c);
    if (st != CERB_OK) {
        free(body); /* jansson's allocator */
        return st;
    }
    c->abort = call->abort;
    for (;;) {
        cerb_outcome oc = CERB_OUTCOME_NO;
        enum etcd_action act = ETCD_ACT_NONE;
        unsigned idx = atomic_load(&h->cur) % (unsigned)h->n_ep;
        int64_t left = cerb__ms_left(call->deadline_ns);
        int64_t tmo = e->ec->op_timeout_ms;
        if (left < tmo)
            tmo = left > 0 ? left : 1;
        call->grpc_code = -1;
        st = attempt(e, call, c, idx, body, tmo, &oc, &act);
        tries++;
        if (st == CERB_OK)
            break;
        cut_short = tmo < e->ec->op_timeout_ms;
        if (!cut_short)
            cerb__error_copy(full_why, sizeof full_why);
        if (oc == CERB_OUTCOME_UNKNOWN)
            any_unknown = true;
        if (st == CERB_INTERRUPTED || st == CERB_ENOMEM)
            break;
        bool again = false;
        if (act == ETCD_ACT_REAUTH && !call->no_auth && e->ec->user && e->ec->user[0] &&
            !reauthed) {
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            reauthed = true;
            cerb_status as = cerb__etcd_authenticate(e, call->deadline_ns, c->hdr_auth_gen);
            if (as != CERB_OK) {
                st = as;
                break;
            }
            cerb__error_set(st, "%s", why);
            again = true;
        } else if (act == ETCD_ACT_ROTATE) {
            cerb__etcd_rotate(e, idx);
            again = oc == CERB_OUTCOME_NO || call->idempotent;
            /* No endpoint would even take a connection: the servers are
             * down, not busy. Say so now — the caller's retry policy and
             * the breaker decide what next — instead of knocking until
             * the deadline (a dead etcd was noticed 300+ ms late). */
            unconnected = oc == CERB_OUTCOME_NO && !cerb__etcd_conn_connected(c)
                              ? unconnected + 1 : 0;
            if (unconnected >= (int)h->n_ep)
                again = false;
        }
        if (!again || cerb_monotime() >= call->deadline_ns)
            break;
        if (act == ETCD_ACT_ROTATE && tries % (int)h->n_ep == 0) {
            /* Every endpoint failed once: pause before the next round. */
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            int64_t nap = 10 + (int64_t)cerb__rand_below(40);
            left = cerb__ms_left(call->deadline_ns);
            if (left <= nap)
                break;
            cerb__nap_ms(nap);
            cerb__error_set(st, "%s", why);
            if (call->abort && atomic_load(call->abort)) {
                st = cerb__error_set(CERB_INTERRUPTED, "etcd: %s: stopped", call->what);
                break;
            }
        }
    }
    if (st != CERB_OK && st != CERB_INTERRUPTED && cut_short && full_why[0])
        cerb__error_set(st, "%s (retried until the deadline)", full_why);
    call->resent = any_unknown;
    call->outcome = st == CERB_OK ? CERB_OUTCOME_YES
                                  : (any_unknown ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO);
    cerb__etcd_conn_put(e, c);
    free(body);
    return st;
}

/* ---- authentication ---- */

cerb_status cerb__etcd_authenticate(cerb_engine *e, int64_t deadline_ns, uint64_t seen_gen)
{
    struct etcd_http *h = &e->http;
    const struct cerb_etcd_config *ec = e->ec;
    cerb_status st;

    if (!ec->user || !ec->user[0])
        return CERB_OK;
    cerb__mutex_lock(&h->auth_mu);
    bool fresh = atomic_load(&h->auth_gen) != seen_gen && h->auth_header;
    cerb__mutex_unlock(&h->auth_mu);
    if (fresh)
        return CERB_OK; /* another thread got a new token meanwhile */
    json_t *req = json_pack("{s:s, s:s}", "name", ec->user, "password",
                            ec->password ? ec->password : "");
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    struct etcd_call call = {.what = "authenticate",
                             .path = "/v3/auth/authenticate",
                             .body = req,
                             .deadline_ns = deadline_ns,
                             .idempotent = true,
                             .no_auth = true};
    st = cerb__etcd_call(e, &call);
    json_decref(req);
    if (st != CERB_OK) {
        cerb__error_prefix("as user \"%s\"", ec->user);
        return st;
    }
    const json_t *tok = json_object_get(call.resp, "token");
    if (!json_is_string(tok) || !json_string_value(tok)[0]) {
        json_decref(call.resp);
        return cerb__error_set(CERB_EPROTO,
                               "etcd %s: authenticate: no token in the answer (is auth enabled?)",
                               cerb__etcd_endpoint(h));
    }
    size_t n = strlen(json_string_value(tok)) + sizeof "Authorization: ";
    char *hdr = cerb__malloc(n);
    if (!hdr) {
        json_decref(call.resp);
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    }
    snprintf(hdr, n, "Authorization: %s", json_string_value(tok));
    json_decref(call.resp);
    cerb__mutex_lock(&h->auth_mu);
    cerb__free(h->auth_header);
    h->auth_header = hdr;
    atomic_fetch_add(&h->auth_gen, 1);
    cerb__mutex_unlock(&h->auth_mu);
    ETCD_COUNT(e, reauths);
    CERB_LOG_D("etcd: authenticated as \"%s\"", ec->user);
    return CERB_OK;
}

cerb_status cerb__etcd_post(struct cerb_engine *e, const char *what, const char *path,
                            json_t *body, int64_t deadline_ns, const atomic_int *abort,
                            json_t **resp)
{
    *resp = NULL;
    if (!body)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    struct etcd_call call = {.what = what,
                             .path = path,
                             .body = body,
                             .deadline_ns = deadline_ns,
                             .idempotent = true,
                             .abort = abort};
    cerb_status st = cerb__etcd_call(e, &call);
    json_decref(body);
    if (st == CERB_OK)
        *resp = call.resp;
    return st;
}

cerb_status cerb__etcd_read_key(struct cerb_engine *e, const char *key, size_t key_len,
                                const char *what, int64_t deadline_ns, json_t **resp,
                                int64_t *rev)
{
    struct etcd_range_req r = {.key = key, .key_len = key_len};
    cerb_status st = cerb__etcd_post(e, what, "/v3/kv/range", cerb__etcd_range_json(&r),
                                     deadline_ns, NULL, resp);
    if (st == CERB_OK)
        st = cerb__etcd_header_rev(*resp, rev);
    if (st != CERB_OK && *resp) {
        json_decref(*resp);
        *resp = NULL;
    }
    return st;
}
