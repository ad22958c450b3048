/*
 * ceiling_etcd.c — the raw ceiling of the etcd engine: the fewest gateway
 * requests a lock needs, sent by a bare libcurl client with no library
 * logic, so the bench can say what fraction of the server's speed the etcd
 * engine keeps.
 *
 * A session is one curl easy handle (one kept-alive HTTP/1.1 connection to
 * the first configured endpoint) and one lease, granted once at open with
 * TTL 60 s and revoked at close (as the engine's session is granted once
 * per client). A cycle is the lock protocol reduced to its two writes:
 *   POST /v3/kv/txn  if create_revision(K) == 0 then put K (lease)
 *   POST /v3/kv/deleterange K
 * with K = <name>/<lease hex>, the engine's layout. The round trip for the
 * hand-off scenario is POST /v3/maintenance/status, which the member
 * answers without consensus. Requests carry the same headers as the
 * engine's (`Grpc-Metadata-hasleader: true`, no `Expect`), JSON is built
 * with jansson and keys are base64 by libcrypto's EVP_EncodeBlock. With
 * etcd.user set, the session authenticates once and sends the token.
 *
 * The bare session (connection, headers, authentication, a POST of jansson
 * JSON, a GET) is shared with the guard's ceiling (ceiling_guard_etcd.c)
 * through the bench_etcd_* functions of scenarios.h; the lock ceiling adds
 * its lease.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

struct etcd_sess {
    CURL *h;
    struct curl_slist *hdrs;
    char base[512];
    char url[600];
    char *body;   /* answer */
    size_t len, cap;
    long long lease;
    char hex[24];
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct etcd_sess *s = ud;
    size_t k = size * n;
    if (s->len + k + 1 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        while (cap < s->len + k + 1)
            cap *= 2;
        char *nb = realloc(s->body, cap);
        if (!nb)
            return 0;
        s->body = nb;
        s->cap = cap;
    }
    memcpy(s->body + s->len, p, k);
    s->len += k;
    s->body[s->len] = '\0';
    return k;
}

/* POST req (stolen) to path; the answer parsed into *out (may be NULL). */
int bench_etcd_post(void *sess, const char *path, json_t *req, json_t **out, char *err,
                    size_t errlen)
{
    struct etcd_sess *s = sess;
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!text) {
        snprintf(err, errlen, "etcd %s: out of memory", path);
        return -1;
    }
    snprintf(s->url, sizeof s->url, "%s%s", s->base, path);
    s->len = 0;
    curl_easy_setopt(s->h, CURLOPT_URL, s->url);
    curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(s->h, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
    CURLcode cc = curl_easy_perform(s->h);
    free(text);
    long status = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK) {
        snprintf(err, errlen, "etcd %s%s: %s", s->base, path, curl_easy_strerror(cc));
        return -1;
    }
    if (status != 200) {
        snprintf(err, errlen, "etcd %s%s: HTTP %ld: %.200s", s->base, path, status,
                 s->body ? s->body : "");
        return -1;
    }
    if (out) {
        *out = json_loadb(s->body ? s->body : "", s->len, 0, NULL);
        if (!*out) {
            snprintf(err, errlen, "etcd %s%s: answer is not JSON", s->base, path);
            return -1;
        }
    }
    return 0;
}

/* GET path: the answer's body (the session's buffer, valid until its next
 * request) and its length in *len, or NULL with @err. */
const char *bench_etcd_get(void *sess, const char *path, size_t *len, char *err, size_t errlen)
{
    struct etcd_sess *s = sess;
    snprintf(s->url, sizeof s->url, "%s%s", s->base, path);
    s->len = 0;
    curl_easy_setopt(s->h, CURLOPT_URL, s->url);
    curl_easy_setopt(s->h, CURLOPT_HTTPGET, 1L);
    CURLcode cc = curl_easy_perform(s->h);
    long status = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK) {
        snprintf(err, errlen, "etcd %s%s: %s", s->base, path, curl_easy_strerror(cc));
        return NULL;
    }
    if (status != 200) {
        snprintf(err, errlen, "etcd %s%s: HTTP %ld", s->base, path, status);
        return NULL;
    }
    *len = s->len;
    return s->body ? s->body : "";
}

json_t *bench_etcd_b64(const char *p, size_t n)
{
    char out[1024];
    if (4 * ((n + 2) / 3) + 1 > sizeof out)
        return NULL;
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)p, (int)n);
    return json_string(out);
}

json_t *bench_etcd_i64(long long v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", v);
    return json_string(buf);
}

void bench_etcd_close(void *p)
{
    struct etcd_sess *s = p;
    if (!s)
        return;
    if (s->h)
        curl_easy_cleanup(s->h);
    curl_slist_free_all(s->hdrs);
    free(s->body);
    free(s);
}

static void etcd_close(void *p)
{
    struct etcd_sess *s = p;
    char err[256];
    if (s && s->h && s->lease)
        bench_etcd_post(s, "/v3/lease/revoke",
                        json_pack("{s:o}", "ID", bench_etcd_i64(s->lease)), NULL, err,
                        sizeof err);
    bench_etcd_close(s);
}

void *bench_etcd_open(const struct bench_engine *e, char *err, size_t errlen)
{
    const struct cerb_etcd_config *ec = &e->cfg->etcd;
    struct etcd_sess *s = calloc(1, sizeof *s);
    json_t *r = NULL;

    if (!s || !(s->h = curl_easy_init())) {
        snprintf(err, errlen, "out of memory");
        free(s);
        return NULL;
    }
    snprintf(s->base, sizeof s->base, "%s", ec->endpoints[0]);
    size_t bl = strlen(s->base);
    while (bl > 0 && s->base[bl - 1] == '/')
        s->base[--bl] = '\0';
    curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(s->h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(s->h, CURLOPT_CONNECTTIMEOUT_MS, (long)ec->connect_timeout_ms);
    curl_easy_setopt(s->h, CURLOPT_TIMEOUT_MS, (long)ec->op_timeout_ms);
    curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
    s->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    s->hdrs = curl_slist_append(s->hdrs, "Grpc-Metadata-hasleader: true");
    s->hdrs = curl_slist_append(s->hdrs, "Expect:");
    curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, s->hdrs);
    if (ec->user && ec->user[0]) {
        if (bench_etcd_post(s, "/v3/auth/authenticate",
                            json_pack("{s:s, s:s}", "name", ec->user, "password",
                                      ec->password ? ec->password : ""),
                            &r, err, errlen) != 0) {
            json_decref(r);
            bench_etcd_close(s);
            return NULL;
        }
        const char *tok = json_string_value(json_object_get(r, "token"));
        char hdr[600];
        snprintf(hdr, sizeof hdr, "Authorization: %s", tok ? tok : "");
        s->hdrs = curl_slist_append(s->hdrs, hdr);
        curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, s->hdrs);
        json_decref(r);
    }
    return s;
}

static void *etcd_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct etcd_sess *s = bench_etcd_open(e, err, errlen);
    json_t *r = NULL;

    if (!s)
        return NULL;
    unsigned long long id = 0;
    RAND_bytes((unsigned char *)&id, sizeof id);
    id &= 0x7fffffffffffffffULL;
    s->lease = (long long)(id ? id : 1);
    if (bench_etcd_post(s, "/v3/lease/grant",
                        json_pack("{s:o, s:o}", "TTL", bench_etcd_i64(60), "ID",
                                  bench_etcd_i64(s->lease)),
                        &r, err, errlen) != 0) {
        s->lease = 0;
        etcd_close(s);
        return NULL;
    }
    json_decref(r);
    snprintf(s->hex, sizeof s->hex, "%llx", (unsigned long long)s->lease);
    return s;
}

static int etcd_cycle(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct etcd_sess *s = p;
    char key[512];
    json_t *r = NULL;
    (void)token; /* the key names the owner: <name>/<lease hex> */

    int kl = snprintf(key, sizeof key, "%s/%s", name, s->hex);
    json_t *req = json_pack("{s:[{s:o, s:s, s:s, s:o}], s:[{s:{s:o, s:o}}]}", "compare", "key",
                            bench_etcd_b64(key, (size_t)kl), "target", "CREATE", "result",
                            "EQUAL", "create_revision", bench_etcd_i64(0), "success",
                            "request_put", "key", bench_etcd_b64(key, (size_t)kl), "lease",
                            bench_etcd_i64(s->lease));
    if (bench_etcd_post(s, "/v3/kv/txn", req, &r, err, errlen) != 0)
        return -1;
    int ok = json_is_true(json_object_get(r, "succeeded"));
    json_decref(r);
    if (!ok) {
        snprintf(err, errlen, "etcd txn: key \"%s\" already exists", key);
        return -1;
    }
    return bench_etcd_post(s, "/v3/kv/deleterange",
                           json_pack("{s:o}", "key", bench_etcd_b64(key, (size_t)kl)), NULL,
                           err, errlen);
}

static int etcd_round_trip(void *p, char *err, size_t errlen)
{
    return bench_etcd_post(p, "/v3/maintenance/status", json_object(), NULL, err, errlen);
}

const struct bench_ceiling bench_ceiling_etcd = {
    "etcd", etcd_open, etcd_cycle, etcd_round_trip, etcd_close,
};
