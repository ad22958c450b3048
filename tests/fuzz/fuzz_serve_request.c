/*
 * fuzz_serve_request.c — the request parser of `cerberus serve`
 * (serve/serve_parse.c: route, path parts, JSON body), as the HTTP server
 * hands it a request once libmicrohttpd has read it.
 *
 * Input: METHOD '\n' PATH '\n' BODY — the method and path as C strings
 * (a NUL ends them early, as for MHD's), the body as bytes of its own
 * length (not NUL-terminated: a read past it is a finding).
 *
 * Properties, for every input:
 *  - the parse returns CERB_OK, or CERB_EINVAL with a reason, or
 *    CERB_ENOMEM; a route that did not match leaves every part empty;
 *  - the path is exactly the route's shape with the parts put back
 *    (nothing lost or invented), and the parts respect the route's rules:
 *    ids and scopes without '/', nothing empty but a guard key;
 *  - the body's values are within the bounds the library accepts
 *    (wait_ms, lease_ms, running_ms, keep_ms, on_unavailable), a finish
 *    names a well-formed attempt id, a switch a non-empty engine name;
 *  - base64: whatever the strict decoder accepts (the body tried as base64)
 *    encodes back to exactly the same text, and any bytes (the body)
 *    encoded decode back to themselves.
 */
#include "fuzz.h"

#include "serve_parse.h"

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Standard padded base64 of @p (@n bytes), written independently of the
 * server's decoder; free it. */
static char *encode(const unsigned char *p, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;

    if (!out)
        abort();
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *o++ = b64[w >> 18 & 63];
        *o++ = b64[w >> 12 & 63];
        *o++ = i + 1 < n ? b64[w >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[w & 63] : '=';
    }
    *o = '\0';
    return out;
}

static void check_b64(const uint8_t *data, size_t size)
{
    char *dec = NULL, *enc;
    size_t n;

    if (cerb__serve_b64_decode((const char *)data, size, &dec, &n)) {
        enc = encode((const unsigned char *)dec, n);
        FUZZ_CHECK(strlen(enc) == size && memcmp(enc, data, size) == 0,
                   "base64 \"%.*s\" decoded to %zu bytes that encode to \"%s\"", (int)size,
                   (const char *)data, n, enc);
        FUZZ_CHECK(dec[n] == '\0', "the decoded bytes are not NUL-terminated");
        free(enc);
        free(dec);
    }
    enc = encode(data, size);
    FUZZ_CHECK(cerb__serve_b64_decode(enc, strlen(enc), &dec, &n),
               "the encoding of %zu bytes was refused: %s", size, enc);
    FUZZ_CHECK(n == size && memcmp(dec, data, size) == 0,
               "%zu bytes did not survive base64 (%zu back)", size, n);
    free(dec);
    free(enc);
}

/* The path the route's parts make, as the server's routes spell it. */
static char *rebuild(const struct cerb__serve_req *rq)
{
    const char *fmt = NULL;
    size_t cap = 64 + (rq->part ? strlen(rq->part) : 0) + rq->key_len;
    char *s = malloc(cap);

    if (!s)
        abort();
    switch (rq->rt) {
    case CERB_SERVE_RT_HEALTHZ:
        snprintf(s, cap, "/healthz");
        return s;
    case CERB_SERVE_RT_METRICS:
        snprintf(s, cap, "/metrics");
        return s;
    case CERB_SERVE_RT_STATUS:
        snprintf(s, cap, "/v1/status");
        return s;
    case CERB_SERVE_RT_SWITCH:
        snprintf(s, cap, "/v1/switch");
        return s;
    case CERB_SERVE_RT_LOCK_INSPECT:
        fmt = "/v1/locks/%s";
        break;
    case CERB_SERVE_RT_LOCK_ACQUIRE:
        fmt = "/v1/locks/%s/acquire";
        break;
    case CERB_SERVE_RT_HOLD_RELEASE:
        fmt = "/v1/holds/%s";
        break;
    case CERB_SERVE_RT_HOLD_KEEPALIVE:
        fmt = "/v1/holds/%s/keepalive";
        break;
    case CERB_SERVE_RT_HOLD_EVENTS:
        fmt = "/v1/holds/%s/events";
        break;
    case CERB_SERVE_RT_GUARD_KEEPALIVE:
        fmt = "/v1/guard/attempts/%s/keepalive";
        break;
    case CERB_SERVE_RT_GUARD_BEGIN:
        snprintf(s, cap, "/v1/guard/%s/%s/begin", rq->part, rq->key);
        return s;
    case CERB_SERVE_RT_GUARD_FINISH:
        snprintf(s, cap, "/v1/guard/%s/%s/finish", rq->part, rq->key);
        return s;
    case CERB_SERVE_RT_NONE:
    case CERB_SERVE_RT_DAPR: /* never parsed: cerb__serve_route sends it on first */
    case CERB_SERVE_RT_COUNT:
        break;
    }
    FUZZ_CHECK(fmt, "route %d has no shape", (int)rq->rt);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(s, cap, fmt, rq->part);
#pragma GCC diagnostic pop
    return s;
}

static void check_req(const char *method, const char *path, const struct cerb__serve_req *rq)
{
    char *back;

    if (rq->rt == CERB_SERVE_RT_NONE) {
        FUZZ_CHECK(!rq->part && !rq->key && !rq->result && !rq->engine,
                   "no route, yet parts were read");
        return;
    }
    FUZZ_CHECK(rq->rt > CERB_SERVE_RT_NONE && rq->rt < CERB_SERVE_RT_DAPR, "route %d",
               (int)rq->rt);
    FUZZ_CHECK(strcmp(method, "GET") == 0 || strcmp(method, "POST") == 0 ||
                   strcmp(method, "DELETE") == 0,
               "method \"%s\" routed", method);
    back = rebuild(rq);
    FUZZ_CHECK(strcmp(back, path) == 0, "path \"%s\" parsed as route %s, rebuilt \"%s\"",
               path, cerb__serve_rt_name(rq->rt), back);
    free(back);
    switch (rq->rt) {
    case CERB_SERVE_RT_LOCK_INSPECT:
    case CERB_SERVE_RT_HOLD_RELEASE:
    case CERB_SERVE_RT_HOLD_KEEPALIVE:
    case CERB_SERVE_RT_HOLD_EVENTS:
    case CERB_SERVE_RT_GUARD_KEEPALIVE:
    case CERB_SERVE_RT_GUARD_BEGIN:
    case CERB_SERVE_RT_GUARD_FINISH:
        FUZZ_CHECK(rq->part && rq->part[0] && !strchr(rq->part, '/'),
                   "route %s: part \"%s\" empty or with a '/'", cerb__serve_rt_name(rq->rt),
                   rq->part ? rq->part : "(null)");
        break;
    case CERB_SERVE_RT_LOCK_ACQUIRE:
        FUZZ_CHECK(rq->part && rq->part[0], "acquire: no name");
        break;
    default:
        FUZZ_CHECK(!rq->part, "route %s has no part", cerb__serve_rt_name(rq->rt));
    }
    if (rq->rt == CERB_SERVE_RT_GUARD_BEGIN || rq->rt == CERB_SERVE_RT_GUARD_FINISH)
        FUZZ_CHECK(rq->key && strlen(rq->key) == rq->key_len, "guard key length");
    else
        FUZZ_CHECK(!rq->key, "a key outside the guard");
}

/* The body's values, once it was accepted. */
static void check_body(const struct cerb__serve_req *rq)
{
    FUZZ_CHECK(rq->wait_ms >= 0 && rq->wait_ms <= CERB_SERVE_MAX_WAIT_MS, "wait_ms %lld",
               (long long)rq->wait_ms);
    FUZZ_CHECK(rq->lease_ms == 0 || (rq->lease_ms >= 100 && rq->lease_ms <= 86400000),
               "lease_ms %lld", (long long)rq->lease_ms);
    FUZZ_CHECK(rq->guard.running_ms == 0 ||
                   (rq->guard.running_ms >= 100 && rq->guard.running_ms <= 86400000),
               "running_ms %lld", (long long)rq->guard.running_ms);
    FUZZ_CHECK(rq->guard.keep_ms == 0 || rq->guard.keep_ms == -1 ||
                   (rq->guard.keep_ms >= 1 && rq->guard.keep_ms <= INT64_C(31536000000)),
               "keep_ms %lld", (long long)rq->guard.keep_ms);
    FUZZ_CHECK(rq->guard.on_unavailable >= -1 && rq->guard.on_unavailable <= 1,
               "on_unavailable %d", rq->guard.on_unavailable);
    if (rq->rt == CERB_SERVE_RT_GUARD_FINISH) {
        FUZZ_CHECK(cerb__serve_is_id(rq->attempt), "finish: attempt \"%s\"", rq->attempt);
        FUZZ_CHECK(rq->succeeded || !rq->result, "a failure with a result");
    } else {
        FUZZ_CHECK(!rq->attempt[0] && !rq->result, "an attempt outside a finish");
    }
    FUZZ_CHECK(!rq->result || rq->result[rq->result_len] == '\0', "result not terminated");
    if (rq->engine)
        FUZZ_CHECK(rq->rt == CERB_SERVE_RT_SWITCH && rq->engine[0], "engine \"%s\"",
                   rq->engine);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl1 = memchr(data, '\n', size), *nl2, *body;
    size_t body_len;
    char *method, *path, *body_copy, why[512];
    struct cerb__serve_req rq;
    cerb_status st;

    check_b64(data, size);
    if (!nl1)
        return 0;
    nl2 = memchr(nl1 + 1, '\n', size - (size_t)(nl1 + 1 - data));
    if (!nl2)
        return 0;
    method = fuzz_cstr(data, (size_t)(nl1 - data));
    path = fuzz_cstr(nl1 + 1, (size_t)(nl2 - nl1 - 1));
    body = nl2 + 1;
    body_len = size - (size_t)(body - data);
    /* A copy of exactly its length: a read past the body is a finding. */
    body_copy = malloc(body_len ? body_len : 1);
    if (!body_copy)
        abort();
    if (body_len)
        memcpy(body_copy, body, body_len);

    st = cerb__serve_parse(method, path, body_copy, body_len, &rq, why, sizeof why);
    FUZZ_CHECK(st == CERB_OK || st == CERB_EINVAL || st == CERB_ENOMEM, "status %d", st);
    if (st == CERB_EINVAL)
        FUZZ_CHECK(why[0] && rq.rt != CERB_SERVE_RT_NONE, "EINVAL without a reason or route");
    if (st != CERB_ENOMEM)
        check_req(method, path, &rq);
    if (st == CERB_OK)
        check_body(&rq);
    cerb__serve_req_free(&rq);
    free(body_copy);
    free(method);
    free(path);
    return 0;
}
