/*
 * holders_etcd.c — `cerberus holders NAME` on etcd: who holds lock NAME and
 * who waits for it, read through the v3 JSON gateway in the layout of etcd's
 * concurrency.Mutex (DESIGN.md §4, engine_etcd/etcd_mutex.c), the one
 * `etcdctl lock NAME` uses too.
 *
 * Every contender for NAME is one key P + <its session lease ID in hex>
 * under the prefix P = <etcd.prefix><NAME>/, attached to that lease. The key
 * with the lowest create revision holds the lock, and the others wait in
 * create-revision order. So one range read of [P, end(P)) sorted by create
 * revision gives the holder and the queue at one revision; a
 * second request, /v3/lease/timetolive on the holder's lease, gives the
 * time the holder's lease has left (whole seconds: that is what etcd
 * keeps). The holder's create revision plus the fence offset its value
 * holds (engine_etcd/etcd_fence.c; none in etcdctl's keys) is the engine's
 * fencing counter (the low 48 bits of the token the holder was given). A key without a lease is
 * held until someone deletes it ("no expiry").
 *
 * Requests follow the engine's rules (engine_etcd/etcd_http.c): HTTP/1.1,
 * `Grpc-Metadata-hasleader: true` so a member without a leader answers at
 * once instead of hanging, `Grpc-Timeout`, no proxy from the environment,
 * no signals, the TLS files of etcd.ca_file / cert_file / key_file, and with
 * etcd.user a token from /v3/auth/authenticate. Each request is bounded by
 * etcd.connect_timeout_ms (connect) and etcd.op_timeout_ms (whole request).
 * The endpoints are tried in configuration order; one that cannot be
 * reached, times out or has no leader is skipped, and the engine is
 * unreachable when every endpoint was. A TLS failure (wrong CA, missing
 * client certificate) and an error answer stop there and are shown. Keys are base64 through the engine's
 * own helpers (libcrypto), JSON through jansson. Nothing is written.
 */
#include "internal_posix.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cli.h"
#include "config.h"
#include "etcd_json.h"

/* Answers larger than this are refused (16 MiB, as the engine does). */
#define MAX_BODY (16u << 20)

/* How one request ended. */
enum ask {
    ASK_OK,    /* a JSON object came back with 200 */
    ASK_DOWN,  /* this endpoint cannot serve now: try the next one */
    ASK_ERROR, /* the server answered with an error (or nonsense) */
    ASK_OOM
};

struct reader {
    const struct cerb_etcd_config *ec;
    CURL *h;
    struct curl_slist *hdr;
    char *auth;     /* "Authorization: <token>", NULL without */
    char *buf;
    size_t len, cap;
    char curl_err[CURL_ERROR_SIZE];
    char err[512];  /* why the last request failed */
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct reader *r = ud;
    size_t k = size * n;

    if (r->len + k + 1 > r->cap) {
        if (r->len + k + 1 > MAX_BODY)
            return 0; /* CURLE_WRITE_ERROR */
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + k + 1)
            cap *= 2;
        char *nb = realloc(r->buf, cap);
        if (!nb)
            return 0;
        r->buf = nb;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, p, k);
    r->len += k;
    r->buf[r->len] = '\0';
    return k;
}

/* The request headers, with the token when there is one. */
static bool make_headers(struct reader *r)
{
    char tmo[48];
    const char *h[] = {"Content-Type: application/json", "Grpc-Metadata-hasleader: true",
                       "Expect:", tmo, r->auth};

    snprintf(tmo, sizeof tmo, "Grpc-Timeout: %" PRId64 "m", r->ec->op_timeout_ms);
    curl_slist_free_all(r->hdr);
    r->hdr = NULL;
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) {
        if (!h[i])
            continue;
        struct curl_slist *t = curl_slist_append(r->hdr, h[i]);
        if (!t)
            return false;
        r->hdr = t;
    }
    return true;
}

/* A TLS failure says our settings and the server's disagree (CA, client
 * certificate, https to an http port): an error to show, not a member
 * that is down. */
static bool tls_error(CURLcode cc)
{
    switch (cc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
        return true;
    default:
        return false;
    }
}

/* POST @body to @ep + @path; on ASK_OK *out is the answer (json_decref it). */
static enum ask ask(struct reader *r, const char *ep, const char *path, json_t *body,
                    json_t **out)
{
    char url[1024];
    char *text;
    long status = 0;
    CURLcode cc;

    *out = NULL;
    r->err[0] = '\0';
    size_t n = strlen(ep);
    while (n > 0 && ep[n - 1] == '/')
        n--;
    if (snprintf(url, sizeof url, "%.*s%s", (int)n, ep, path) >= (int)sizeof url) {
        snprintf(r->err, sizeof r->err, "%s: endpoint too long", ep);
        return ASK_ERROR;
    }
    text = json_dumps(body, JSON_COMPACT);
    if (!text || !make_headers(r)) {
        free(text);
        return ASK_OOM;
    }
    r->len = 0;
    r->curl_err[0] = '\0';
    curl_easy_setopt(r->h, CURLOPT_URL, url);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(r->h, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
    curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdr);
    cc = curl_easy_perform(r->h);
    free(text);
    if (cc != CURLE_OK) {
        snprintf(r->err, sizeof r->err, "%s: %s", ep,
                 r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc));
        return cc == CURLE_OUT_OF_MEMORY ? ASK_OOM : tls_error(cc) ? ASK_ERROR : ASK_DOWN;
    }
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
    json_error_t jerr;
    json_t *root = r->len ? json_loadb(r->buf, r->len, 0, &jerr) : NULL;
    if (status != 200) {
        /* {"error": "...", "message": "...", "code": N} from the gateway. */
        const char *msg = json_string_value(json_object_get(root, "message"));
        snprintf(r->err, sizeof r->err, "%s%s: HTTP %ld: %s", ep, path, status,
                 msg ? msg : (r->len ? r->buf : "no body"));
        json_decref(root);
        /* 503: this member has no leader, or is stopping. */
        return status == 503 ? ASK_DOWN : ASK_ERROR;
    }
    if (!json_is_object(root)) {
        snprintf(r->err, sizeof r->err, "%s%s: not a JSON object: %.80s", ep, path,
                 r->len ? r->buf : "(empty)");
        json_decref(root);
        return ASK_ERROR;
    }
    *out = root;
    return ASK_OK;
}

static enum ask authenticate(struct reader *r, const char *ep)
{
    const struct cerb_etcd_config *ec = r->ec;
    json_t *req, *resp;
    enum ask a;

    free(r->auth);
    r->auth = NULL;
    if (!ec->user || !ec->user[0])
        return ASK_OK;
    req = json_pack("{s:s, s:s}", "name", ec->user, "password", ec->password ? ec->password : "");
    if (!req)
        return ASK_OOM;
    a = ask(r, ep, "/v3/auth/authenticate", req, &resp);
    json_decref(req);
    if (a != ASK_OK) {
        size_t k = strlen(r->err);
        snprintf(r->err + k, sizeof r->err - k, " (as user \"%s\")", ec->user);
        return a;
    }
    const char *tok = json_string_value(json_object_get(resp, "token"));
    if (!tok || !tok[0]) {
        snprintf(r->err, sizeof r->err, "%s: authenticate: no token in the answer", ep);
        json_decref(resp);
        return ASK_ERROR;
    }
    size_t n = strlen(tok) + sizeof "Authorization: ";
    r->auth = malloc(n);
    if (r->auth)
        snprintf(r->auth, n, "Authorization: %s", tok);
    json_decref(resp);
    return r->auth ? ASK_OK : ASK_OOM;
}

/* The range of every key under P, oldest first, keys only. */
static json_t *range_request(const char *p, size_t pl, char *end, size_t *el)
{
    cerb__etcd_prefix_end(p, pl, end, el);
    struct etcd_range_req rq = {.key = p,
                                .key_len = pl,
                                .end = end,
                                .end_len = *el,
                                .sort_order = ETCD_SORT_ASCEND,
                                .sort_target = ETCD_TARGET_CREATE};
    return cerb__etcd_range_json(&rq);
}

/* Prints the key of @kv without the prefix (the contender's lease in hex). */
static enum ask print_owner(const json_t *kv, size_t pl)
{
    const char *b64 = json_string_value(json_object_get(kv, "key"));
    char *key = NULL;
    size_t n = 0;

    if (!b64 || cerb__etcd_b64_decode(b64, &key, &n) != CERB_OK)
        return ASK_ERROR;
    if (n > pl)
        cerb__cli_print_bytes(key + pl, n - pl);
    else
        printf("(the prefix key itself)");
    cerb__free(key);
    return ASK_OK;
}

/* The fence offset a Cerberus key was put with (its value), which its
 * fence adds to the create revision; 0 for a key without one (etcdctl's). */
static int64_t fence_offset(const json_t *kv)
{
    const char *b64 = json_string_value(json_object_get(kv, "value"));
    char *v = NULL;
    size_t n = 0;
    int64_t off = 0;

    if (b64 && cerb__etcd_b64_decode(b64, &v, &n) == CERB_OK &&
        !cerb__etcd_fence_parse(v, n, &off))
        off = 0;
    cerb__free(v);
    return off;
}

/* Reads and prints on endpoint @ep. */
static enum ask read_on(struct reader *r, const char *ep, const char *name)
{
    const char *prefix = r->ec->prefix ? r->ec->prefix : "";
    size_t pl = strlen(prefix) + strlen(name) + 1, el = 0;
    char *p = malloc(pl + 1), *end = malloc(pl + 1);
    json_t *req = NULL, *resp = NULL, *ttl_resp = NULL;
    enum ask a = ASK_OOM;

    if (!p || !end)
        goto out;
    snprintf(p, pl + 1, "%s%s/", prefix, name);
    a = authenticate(r, ep);
    if (a != ASK_OK)
        goto out;
    req = range_request(p, pl, end, &el);
    if (!req) {
        a = ASK_OOM;
        goto out;
    }
    a = ask(r, ep, "/v3/kv/range", req, &resp);
    if (a != ASK_OK)
        goto out;
    const json_t *kvs = json_object_get(resp, "kvs");
    size_t n = json_is_array(kvs) ? json_array_size(kvs) : 0;
    if (n == 0) {
        printf("etcd: free\n");
        goto out;
    }

    /* The holder: its lease's time to live, then the line. */
    const json_t *first = json_array_get(kvs, 0);
    int64_t lease = 0, rev = 0, ttl = -1, granted = 0;
    if (cerb__etcd_get_i64(first, "lease", &lease) != CERB_OK ||
        cerb__etcd_get_i64(first, "create_revision", &rev) != CERB_OK) {
        snprintf(r->err, sizeof r->err, "%s/v3/kv/range: unexpected answer", ep);
        a = ASK_ERROR;
        goto out;
    }
    if (lease != 0) {
        json_t *tq = json_pack("{s:o}", "ID", cerb__etcd_json_i64(lease));
        if (!tq) {
            a = ASK_OOM;
            goto out;
        }
        a = ask(r, ep, "/v3/lease/timetolive", tq, &ttl_resp);
        json_decref(tq);
        if (a != ASK_OK)
            goto out;
        if (cerb__etcd_get_i64(ttl_resp, "TTL", &ttl) != CERB_OK ||
            cerb__etcd_get_i64(ttl_resp, "grantedTTL", &granted) != CERB_OK) {
            snprintf(r->err, sizeof r->err, "%s/v3/lease/timetolive: unexpected answer", ep);
            a = ASK_ERROR;
            goto out;
        }
    }
    printf("etcd: held by ");
    if (print_owner(first, pl) != ASK_OK) {
        printf("\n");
        snprintf(r->err, sizeof r->err, "%s/v3/kv/range: a key is not base64", ep);
        a = ASK_ERROR;
        goto out;
    }
    if (lease == 0)
        printf(", no expiry");
    else if (ttl >= 0)
        printf(", %" PRId64 " s left (TTL %" PRId64 " s)", ttl, granted);
    else
        printf(", lease %" PRIx64 " expired", (uint64_t)lease);
    printf(", fence %" PRId64 "\n", rev + fence_offset(first));

    /* The queue, in create-revision order. */
    for (size_t i = 1; i < n; i++) {
        printf(i == 1 ? "etcd: waiting: " : ", ");
        if (print_owner(json_array_get(kvs, i), pl) != ASK_OK)
            printf("?");
    }
    if (n > 1)
        printf("\n");
    a = ASK_OK;
out:
    json_decref(req);
    json_decref(resp);
    json_decref(ttl_resp);
    free(p);
    free(end);
    return a;
}

int cerb__cli_holders_etcd(const struct cerb_etcd_config *ec, const char *name, int verbose)
{
    struct reader r;
    char downs[2048] = "";
    size_t dl = 0;
    enum ask a = ASK_DOWN;
    int rc = CLI_EXIT_OK;

    memset(&r, 0, sizeof r);
    r.ec = ec;
    if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK || !(r.h = curl_easy_init())) {
        cerb__cli_error("etcd: cannot start libcurl");
        return CLI_EXIT_OSERR;
    }
    curl_easy_setopt(r.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r.h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(r.h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(r.h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(r.h, CURLOPT_PROXY, "");
    curl_easy_setopt(r.h, CURLOPT_ERRORBUFFER, r.curl_err);
    curl_easy_setopt(r.h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(r.h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(r.h, CURLOPT_CONNECTTIMEOUT_MS, (long)ec->connect_timeout_ms);
    curl_easy_setopt(r.h, CURLOPT_TIMEOUT_MS, (long)ec->op_timeout_ms);
    curl_easy_setopt(r.h, CURLOPT_VERBOSE, verbose >= 2 ? 1L : 0L);
    if (ec->ca_file && ec->ca_file[0])
        curl_easy_setopt(r.h, CURLOPT_CAINFO, ec->ca_file);
    if (ec->cert_file && ec->cert_file[0])
        curl_easy_setopt(r.h, CURLOPT_SSLCERT, ec->cert_file);
    if (ec->key_file && ec->key_file[0])
        curl_easy_setopt(r.h, CURLOPT_SSLKEY, ec->key_file);

    /* Endpoints in order; the first that answers tells. */
    for (size_t i = 0; i < ec->n_endpoints; i++) {
        fflush(stdout);
        a = read_on(&r, ec->endpoints[i], name);
        if (a != ASK_DOWN)
            break;
        if (verbose)
            cerb__cli_error("etcd: %s (trying the next endpoint)", r.err);
        dl += (size_t)snprintf(downs + dl, sizeof downs - dl, "%s%s", dl ? "; " : "", r.err);
        if (dl >= sizeof downs)
            dl = sizeof downs - 1;
    }
    switch (a) {
    case ASK_OK:
        break;
    case ASK_DOWN:
        printf("etcd: unreachable\n");
        cerb__cli_error("etcd: unreachable: %s", downs);
        rc = CLI_EXIT_UNAVAILABLE;
        break;
    case ASK_ERROR:
        printf("etcd: error\n");
        cerb__cli_error("etcd: %s", r.err);
        rc = CLI_EXIT_UNAVAILABLE;
        break;
    case ASK_OOM:
        cerb__cli_error("etcd: out of memory");
        rc = CLI_EXIT_OSERR;
        break;
    }
    curl_slist_free_all(r.hdr);
    curl_easy_cleanup(r.h);
    if (r.auth) {
        memset(r.auth, 0, strlen(r.auth));
        free(r.auth);
    }
    free(r.buf);
    curl_global_cleanup();
    return rc;
}
