/*
 * ceiling_guard_etcd.c — the raw ceiling of the guard scenario on etcd: the
 * requests engine_etcd/etcd_guard.c sends for a begin + finish(1) and for
 * a duplicate, on the bare session of the etcd ceiling (ceiling_etcd.c: one
 * kept-alive HTTP/1.1 connection, the engine's headers, JSON by jansson),
 * with no library logic (no SHA-256 of the key, no fresh token, no handle,
 * no renewer, no breaker, no re-check of an unknown outcome), so the bench
 * can say what fraction of the server's speed the etcd guard keeps.
 *
 * The layout is etcd_guard.c's: a record is the key
 * `<etcd.prefix>cerb:guard:<64 hex>`, its value a state byte ('R' running,
 * 'D' done), the 32-char token, then (done) the result. The requests:
 *   begin:     POST /v3/kv/txn  if create_revision(key) == 0
 *                               then put R<token> (running lease)
 *                               else range key
 *   finish(1): POST /v3/kv/txn  if value(key) == R<token>
 *                               then put D<token><result> (done lease)
 *                               else range key
 * A duplicate is the begin alone on a done record: one txn, whose failure
 * branch's range carries the result. The leases are the engine's too,
 * shared by the records and held per session here (per client there): the
 * running lease of TTL running_ms + max(1 s, running_ms / 4), used while
 * it has running_ms left by our count and kept alive (POST
 * /v3/lease/keepalive) when not; the done lease of TTL keep_ms + bucket
 * (bucket = keep_ms / 8, 1 s..1 h), used for new done-records during the
 * bucket less a margin, then granted again. Both are granted lazily by the
 * first operation (the scenario's unmeasured warm-up), so a measured round
 * sends what the library's sends in its steady state. The id is 64 hex
 * characters made from the caller's counters, the token is fixed per
 * thread (scenario_guard.c). Closing revokes the running lease, as the
 * engine does; done-records end with their lease, as there.
 *
 * The server counts its requests: /metrics has grpc_server_started_total
 * per gRPC method, which the gateway's JSON requests go through (a txn is
 * one Txn, a keepalive one LeaseKeepAlive stream), and the GET of /metrics
 * is not one of them; server_commands sums them.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <openssl/evp.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

#define GUARD_TAG "cerb:guard:"
#define VAL_HDR 33 /* state byte + token */
#define NS_PER_MS INT64_C(1000000)

struct eg_lease {
    long long id;     /* 0: none yet */
    int64_t cls;      /* running: TTL in s; done: keep_ms */
    int64_t ttl_s;
    int64_t alive_ns; /* send time of its grant or last keepalive */
};

struct eg_sess {
    void *base;        /* bench_etcd_open's session */
    char prefix[256];  /* etcd.prefix */
    int64_t op_timeout_ms;
    struct eg_lease run, done;
};

static int64_t ceil_s(int64_t ms) { return (ms + 999) / 1000; }

/* etcd_guard.c's run_ttl_s and bucket_ms. */
static int64_t run_ttl_s(int64_t running_ms)
{
    int64_t slack = running_ms / 4 > 1000 ? running_ms / 4 : 1000;
    return ceil_s(running_ms + slack);
}

static int64_t bucket_ms(int64_t keep_ms)
{
    int64_t b = keep_ms / 8;
    return b < 1000 ? 1000 : b > 3600000 ? 3600000 : b;
}

/* A lease of ttl_s into *l (ID chosen by the server). */
static int eg_grant(struct eg_sess *s, int64_t ttl_s, struct eg_lease *l, char *err,
                    size_t errlen)
{
    json_t *r = NULL;
    int64_t sent = bench_now_ns();
    if (bench_etcd_post(s->base, "/v3/lease/grant",
                        json_pack("{s:o}", "TTL", bench_etcd_i64(ttl_s)), &r, err, errlen) != 0)
        return -1;
    const char *id = json_string_value(json_object_get(r, "ID"));
    l->id = id ? strtoll(id, NULL, 10) : 0;
    json_decref(r);
    if (l->id == 0) {
        snprintf(err, errlen, "etcd lease grant: no ID in the answer");
        return -1;
    }
    l->ttl_s = ttl_s;
    l->alive_ns = sent;
    return 0;
}

/* The running lease for a claim of running_ms: kept alive first when it
 * has less than running_ms left, granted when there is none or it is gone. */
static int eg_run_lease(struct eg_sess *s, int64_t running_ms, char *err, size_t errlen)
{
    int64_t ttl_s = run_ttl_s(running_ms), now = bench_now_ns();
    struct eg_lease *l = &s->run;
    if (l->id && l->cls == ttl_s) {
        if (now + running_ms * NS_PER_MS <= l->alive_ns + ttl_s * 1000 * NS_PER_MS)
            return 0;
        json_t *r = NULL;
        if (bench_etcd_post(s->base, "/v3/lease/keepalive",
                            json_pack("{s:o}", "ID", bench_etcd_i64(l->id)), &r, err,
                            errlen) != 0)
            return -1;
        const char *left = json_string_value(
            json_object_get(json_object_get(r, "result"), "TTL"));
        long long ttl = left ? strtoll(left, NULL, 10) : 0;
        json_decref(r);
        if (ttl > 0) {
            l->alive_ns = now;
            return 0;
        }
    }
    l->cls = ttl_s;
    return eg_grant(s, ttl_s, l, err, errlen);
}

/* The done lease for a record kept keep_ms (a new one per bucket). */
static int eg_done_lease(struct eg_sess *s, int64_t keep_ms, char *err, size_t errlen)
{
    int64_t b = bucket_ms(keep_ms);
    int64_t margin = s->op_timeout_ms < b / 2 ? s->op_timeout_ms : b / 2;
    struct eg_lease *l = &s->done;
    if (l->id && l->cls == keep_ms && bench_now_ns() <= l->alive_ns + (b - margin) * NS_PER_MS)
        return 0;
    l->cls = keep_ms;
    return eg_grant(s, ceil_s(keep_ms + b), l, err, errlen);
}

static void eg_close(void *p)
{
    struct eg_sess *s = p;
    char err[256];
    if (!s)
        return;
    if (s->base && s->run.id)
        bench_etcd_post(s->base, "/v3/lease/revoke",
                        json_pack("{s:o}", "ID", bench_etcd_i64(s->run.id)), NULL, err,
                        sizeof err);
    bench_etcd_close(s->base);
    free(s);
}

static void *eg_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct eg_sess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(s->base = bench_etcd_open(e, err, errlen))) {
        free(s);
        return NULL;
    }
    snprintf(s->prefix, sizeof s->prefix, "%s", e->cfg->etcd.prefix ? e->cfg->etcd.prefix : "");
    s->op_timeout_ms = e->cfg->etcd.op_timeout_ms;
    return s;
}

/* The txn `if <cmp> then put key=val (lease) else range key`: 1 when the
 * compare held, 0 when not (the range's first value's state byte in
 * *state, 0 for no key), -1 on error. */
static int eg_txn(struct eg_sess *s, const char *what, json_t *cmp, const char *key, int klen,
                  const char *val, size_t vlen, long long lease, char *state, char *err,
                  size_t errlen)
{
    json_t *r = NULL;
    json_t *put = json_pack("{s:o, s:o}", "key", bench_etcd_b64(key, (size_t)klen), "value",
                            bench_etcd_b64(val, vlen));
    if (put && lease)
        json_object_set_new(put, "lease", bench_etcd_i64(lease));
    json_t *req = json_pack("{s:[o], s:[{s:o}], s:[{s:{s:o}}]}", "compare", cmp, "success",
                            "request_put", put, "failure", "request_range", "key",
                            bench_etcd_b64(key, (size_t)klen));
    if (!req) {
        snprintf(err, errlen, "etcd %s: out of memory", what);
        return -1;
    }
    if (bench_etcd_post(s->base, "/v3/kv/txn", req, &r, err, errlen) != 0)
        return -1;
    int ok = json_is_true(json_object_get(r, "succeeded"));
    *state = 0;
    if (!ok) {
        /* responses[0].response_range.kvs[0].value, base64 */
        json_t *kvs = json_object_get(
            json_object_get(json_array_get(json_object_get(r, "responses"), 0),
                            "response_range"),
            "kvs");
        const char *v64 = json_string_value(json_object_get(json_array_get(kvs, 0), "value"));
        unsigned char buf[4096];
        size_t n = v64 ? strlen(v64) : 0;
        if (n >= 4 && n / 4 * 3 <= sizeof buf &&
            EVP_DecodeBlock(buf, (const unsigned char *)v64, (int)n) >= VAL_HDR)
            *state = (char)buf[0];
    }
    json_decref(r);
    return ok;
}

static int eg_key(struct eg_sess *s, const char *id, char *buf, size_t n)
{
    return snprintf(buf, n, "%s" GUARD_TAG "%s", s->prefix, id);
}

/* begin: 1 claimed, 0 a done-record is there, -1 anything else (@err). */
static int eg_begin(struct eg_sess *s, const char *key, int klen, const char *token,
                    int64_t running_ms, char *err, size_t errlen)
{
    char val[VAL_HDR], state = 0;
    if (eg_run_lease(s, running_ms, err, errlen) != 0)
        return -1;
    val[0] = 'R';
    memcpy(val + 1, token, 32);
    json_t *cmp = json_pack("{s:o, s:s, s:s, s:o}", "key", bench_etcd_b64(key, (size_t)klen),
                            "target", "CREATE", "result", "EQUAL", "create_revision",
                            bench_etcd_i64(0));
    int got = eg_txn(s, "guard begin", cmp, key, klen, val, sizeof val, s->run.id, &state, err,
                     errlen);
    if (got == 0 && state != 'D') {
        snprintf(err, errlen, "etcd guard begin on %s: a record in state '%c'", key,
                 state ? state : '?');
        return -1;
    }
    return got;
}

static int eg_cycle(void *p, const char *id, const char *token, const void *result, size_t len,
                    int64_t running_ms, int64_t keep_ms, char *err, size_t errlen)
{
    struct eg_sess *s = p;
    char key[400], run_val[VAL_HDR], done[VAL_HDR + 256], state = 0;
    int klen = eg_key(s, id, key, sizeof key);
    int got = eg_begin(s, key, klen, token, running_ms, err, errlen);

    if (got == 0)
        snprintf(err, errlen, "etcd guard begin on %s: already done", key);
    if (got != 1)
        return -1;
    if (len > sizeof done - VAL_HDR) {
        snprintf(err, errlen, "etcd guard finish: result of %zu bytes too long", len);
        return -1;
    }
    if (eg_done_lease(s, keep_ms, err, errlen) != 0)
        return -1;
    run_val[0] = 'R';
    done[0] = 'D';
    memcpy(run_val + 1, token, 32);
    memcpy(done + 1, token, 32);
    memcpy(done + VAL_HDR, result, len);
    json_t *cmp = json_pack("{s:o, s:s, s:s, s:o}", "key", bench_etcd_b64(key, (size_t)klen),
                            "target", "VALUE", "result", "EQUAL", "value",
                            bench_etcd_b64(run_val, VAL_HDR));
    got = eg_txn(s, "guard finish", cmp, key, klen, done, VAL_HDR + len, s->done.id, &state,
                 err, errlen);
    if (got == 0)
        snprintf(err, errlen, "etcd guard finish on %s: not our claim (state '%c')", key,
                 state ? state : '?');
    return got == 1 ? 0 : -1;
}

static int eg_duplicate(void *p, const char *id, const char *token, int64_t running_ms,
                        char *err, size_t errlen)
{
    struct eg_sess *s = p;
    char key[400];
    int klen = eg_key(s, id, key, sizeof key);
    int got = eg_begin(s, key, klen, token, running_ms, err, errlen);
    if (got == 1)
        snprintf(err, errlen, "etcd guard begin on %s: claimed, not a duplicate (expired?)",
                 key);
    return got == 0 ? 0 : -1;
}

/* The sum of grpc_server_started_total over every method in /metrics. */
static int eg_commands(void *p, uint64_t *out, char *err, size_t errlen)
{
    struct eg_sess *s = p;
    static const char name[] = "grpc_server_started_total{";
    size_t len = 0;
    const char *body = bench_etcd_get(s->base, "/metrics", &len, err, errlen);
    uint64_t sum = 0;
    int seen = 0;

    if (!body)
        return -1;
    for (const char *line = body; line && *line;) {
        const char *eol = strchr(line, '\n');
        if (strncmp(line, name, sizeof name - 1) == 0) {
            /* name{labels} value: no label of these holds "} ". */
            const char *v = strstr(line, "} ");
            if (v && (!eol || v < eol)) {
                sum += (uint64_t)strtod(v + 2, NULL); /* "1234" or "1.234e+06" */
                seen = 1;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
    if (!seen) {
        snprintf(err, errlen, "etcd /metrics: no grpc_server_started_total");
        return -1;
    }
    *out = sum;
    return 0;
}

const struct bench_guard_ceiling bench_guard_ceiling_etcd = {
    "etcd", eg_open, eg_cycle, eg_duplicate, eg_commands, eg_close,
};
