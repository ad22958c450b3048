/*
 * serve_parse.c — routes, path parts and bodies of `cerberus serve`
 * requests, with no libmicrohttpd (serve_parse.h says what the path is).
 *
 * Routes are matched on the method and the whole path. A path that no
 * route takes with its method is tried with the other methods (GET, POST,
 * DELETE): those that would take it are the Allow of a 405, which tells
 * the caller its mistake; a path no method takes is no route (404). The
 * path parts are copied out:
 *
 *   /v1/locks/{name}                 name: no '/' (GET)
 *   /v1/locks/{name}/acquire         name: anything non-empty (the library
 *                                    judges it)
 *   /v1/holds/{id}[/keepalive|/events]  id: non-empty, no '/'
 *   /v1/guard/attempts/{id}/keepalive   id: non-empty, no '/'
 *   /v1/guard/{scope}/{key}/begin|finish  scope: up to the first '/' after
 *                                    the prefix (non-empty); key: all that
 *                                    follows, up to the last /begin or
 *                                    /finish (may be empty, may hold '/')
 *
 * (the guard's attempts keepalive is matched first: a scope named
 * "attempts" still works for begin and finish, whose suffix differs).
 *
 * A lock name must be UTF-8 (checked here, 400 otherwise): a path's %XX
 * escapes can make any bytes, but the answers that name a lock are JSON,
 * which carries only UTF-8. Hold and attempt ids are judged by their table
 * (an id that is not one is 404), and the error replies make what they
 * echo UTF-8 (serve_reply.c).
 *
 * Bodies are parsed with jansson (duplicate members refused, \u0000 kept
 * in strings) into struct cerb__serve_req, with the same bounds as the
 * configuration's keys, so the library sees only values it accepts.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve_parse.h"

#define LOCKS "/v1/locks/"
#define HOLDS "/v1/holds/"
#define GUARD "/v1/guard/"
#define ATTEMPTS "/v1/guard/attempts/"

static const char *const rt_names[CERB_SERVE_RT_COUNT] = {
    [CERB_SERVE_RT_NONE] = "unknown",
    [CERB_SERVE_RT_HEALTHZ] = "healthz",
    [CERB_SERVE_RT_METRICS] = "metrics",
    [CERB_SERVE_RT_STATUS] = "status",
    [CERB_SERVE_RT_SWITCH] = "switch",
    [CERB_SERVE_RT_LOCK_INSPECT] = "lock_inspect",
    [CERB_SERVE_RT_LOCK_ACQUIRE] = "lock_acquire",
    [CERB_SERVE_RT_HOLD_RELEASE] = "hold_release",
    [CERB_SERVE_RT_HOLD_KEEPALIVE] = "hold_keepalive",
    [CERB_SERVE_RT_HOLD_EVENTS] = "hold_events",
    [CERB_SERVE_RT_GUARD_BEGIN] = "guard_begin",
    [CERB_SERVE_RT_GUARD_FINISH] = "guard_finish",
    [CERB_SERVE_RT_GUARD_KEEPALIVE] = "guard_keepalive",
    [CERB_SERVE_RT_DAPR] = "dapr",
};

const char *cerb__serve_rt_name(enum cerb__serve_rt rt)
{
    return (unsigned)rt < CERB_SERVE_RT_COUNT ? rt_names[rt] : "unknown";
}

bool cerb__serve_is_id(const char *s)
{
    size_t i;

    for (i = 0; s[i]; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return i == CERB_SERVE_ID_LEN;
}

/* ---- the path ---- */

/* Unicode 15, table 3-7: the second byte's range depends on the first. */
size_t cerb__serve_utf8_seq(const unsigned char *p, size_t n)
{
    unsigned char lo = 0x80, hi = 0xbf;
    size_t len;

    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        len = 2;
    else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        len = 3;
        if (p[0] == 0xe0)
            lo = 0xa0; /* overlong below */
        else if (p[0] == 0xed)
            hi = 0x9f; /* surrogates above */
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4;
        if (p[0] == 0xf0)
            lo = 0x90;
        else if (p[0] == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xbf)
            return 0;
    return len;
}

/* Whether @s (@n bytes) is well-formed UTF-8 (a lock name must be: every
 * answer that names it is JSON, which carries only UTF-8). */
static bool is_utf8(const char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if ((k = cerb__serve_utf8_seq((const unsigned char *)s + i, n - i)) == 0)
            return false;
    return true;
}


static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Whether @s (@n bytes) ends with @suffix; the length before it in *@before. */
static bool ends(const char *s, size_t n, const char *suffix, size_t *before)
{
    size_t sl = strlen(suffix);

    if (n < sl || memcmp(s + n - sl, suffix, sl) != 0)
        return false;
    *before = n - sl;
    return true;
}

static char *copy(const char *s, size_t n)
{
    char *c = malloc(n + 1);

    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

/* Matches the path (after @prefix) as {part}@suffix, the part non-empty
 * and, with @no_slash, without '/'. */
static bool part_then(const char *rest, const char *suffix, bool no_slash, const char **p,
                      size_t *n)
{
    size_t before;

    if (!ends(rest, strlen(rest), suffix, &before) || before == 0)
        return false;
    if (no_slash && memchr(rest, '/', before))
        return false;
    *p = rest;
    *n = before;
    return true;
}

/* The route of @method @path, its part in *@p/@n and for the guard its
 * key in *@k/@kn. */
static enum cerb__serve_rt match(const char *method, const char *path, const char **p,
                                 size_t *n, const char **k, size_t *kn)
{
    bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0,
         del = strcmp(method, "DELETE") == 0;
    const char *rest;
    size_t before;

    if (get && strcmp(path, "/healthz") == 0)
        return CERB_SERVE_RT_HEALTHZ;
    if (get && strcmp(path, "/metrics") == 0)
        return CERB_SERVE_RT_METRICS;
    if (get && strcmp(path, "/v1/status") == 0)
        return CERB_SERVE_RT_STATUS;
    if (post && strcmp(path, "/v1/switch") == 0)
        return CERB_SERVE_RT_SWITCH;
    if (starts(path, LOCKS)) {
        rest = path + strlen(LOCKS);
        if (post && part_then(rest, "/acquire", false, p, n))
            return CERB_SERVE_RT_LOCK_ACQUIRE;
        if (get && part_then(rest, "", true, p, n))
            return CERB_SERVE_RT_LOCK_INSPECT;
        return CERB_SERVE_RT_NONE;
    }
    if (starts(path, HOLDS)) {
        rest = path + strlen(HOLDS);
        if (post && part_then(rest, "/keepalive", true, p, n))
            return CERB_SERVE_RT_HOLD_KEEPALIVE;
        if (get && part_then(rest, "/events", true, p, n))
            return CERB_SERVE_RT_HOLD_EVENTS;
        if (del && part_then(rest, "", true, p, n))
            return CERB_SERVE_RT_HOLD_RELEASE;
        return CERB_SERVE_RT_NONE;
    }
    if (!post || !starts(path, GUARD))
        return CERB_SERVE_RT_NONE;
    if (starts(path, ATTEMPTS) &&
        part_then(path + strlen(ATTEMPTS), "/keepalive", true, p, n))
        return CERB_SERVE_RT_GUARD_KEEPALIVE;
    rest = path + strlen(GUARD);
    {
        enum cerb__serve_rt rt;
        const char *slash;
        if (ends(rest, strlen(rest), "/begin", &before))
            rt = CERB_SERVE_RT_GUARD_BEGIN;
        else if (ends(rest, strlen(rest), "/finish", &before))
            rt = CERB_SERVE_RT_GUARD_FINISH;
        else
            return CERB_SERVE_RT_NONE;
        slash = memchr(rest, '/', before);
        if (!slash || slash == rest)
            return CERB_SERVE_RT_NONE; /* no scope, or no key part */
        *p = rest;
        *n = (size_t)(slash - rest);
        *k = slash + 1;
        *kn = before - *n - 1;
        return rt;
    }
}

/* The methods other than @method that take @path, as an Allow header's
 * value in @allow (@cap bytes; "" when none does). */
static void allowed(const char *method, const char *path, char *allow, size_t cap)
{
    static const char *const methods[] = {"GET", "POST", "DELETE"};
    const char *p, *k;
    size_t n, kn, o = 0;

    allow[0] = '\0';
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        if (strcmp(method, methods[i]) == 0 ||
            match(methods[i], path, &p, &n, &k, &kn) == CERB_SERVE_RT_NONE)
            continue;
        int w = snprintf(allow + o, cap - o, "%s%s", o ? ", " : "", methods[i]);
        if (w < 0 || (size_t)w >= cap - o)
            break; /* cannot happen: the buffer holds all three */
        o += (size_t)w;
    }
}

/* ---- base64 ---- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

bool cerb__serve_b64_decode(const char *in, size_t n, char **out, size_t *out_len)
{
    size_t pad = 0, o = 0;
    char *buf;

    *out = NULL;
    *out_len = 0;
    if (n % 4 != 0)
        return false;
    if (n >= 1 && in[n - 1] == '=')
        pad++;
    if (n >= 2 && in[n - 2] == '=')
        pad++;
    buf = malloc(n / 4 * 3 + 1);
    if (!buf)
        return false;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        bool last = i + 4 == n;
        for (int j = 0; j < 4; j++) {
            bool padded = last && j >= 4 - (int)pad;
            v[j] = padded ? 0 : b64_value((unsigned char)in[i + (size_t)j]);
            if (v[j] < 0) {
                free(buf);
                return false;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        /* Canonical only: the bits a padding drops must be zero. */
        if ((last && pad == 1 && (w & 0xff)) || (last && pad == 2 && (w & 0xffff))) {
            free(buf);
            return false;
        }
        buf[o++] = (char)(w >> 16);
        if (!last || pad < 2)
            buf[o++] = (char)(w >> 8 & 0xff);
        if (!last || pad < 1)
            buf[o++] = (char)(w & 0xff);
    }
    buf[o] = '\0';
    *out = buf;
    *out_len = o;
    return true;
}

/* ---- the body ---- */

/* Reads optional integer member @key of @obj into *v (left alone when
 * absent); false when present but not an integer in [min, max]. */
static bool get_int(json_t *obj, const char *key, json_int_t min, json_int_t max, int64_t *v)
{
    json_t *m = json_object_get(obj, key);

    if (!m)
        return true;
    if (!json_is_integer(m) || json_integer_value(m) < min || json_integer_value(m) > max)
        return false;
    *v = (int64_t)json_integer_value(m);
    return true;
}

/* Whether every member of @obj is one of @known (NULL-terminated); the
 * first that is not in *@bad. */
static bool only(json_t *obj, const char *const *known, const char **bad)
{
    const char *k;
    json_t *v;

    json_object_foreach(obj, k, v) {
        size_t i;
        for (i = 0; known[i] && strcmp(known[i], k) != 0; i++)
            ;
        if (!known[i]) {
            *bad = k;
            return false;
        }
    }
    return true;
}

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), CERB_EINVAL)

static cerb_status body_acquire(json_t *o, struct cerb__serve_req *rq, char *why,
                                size_t whylen)
{
    if (!get_int(o, "wait_ms", 0, CERB_SERVE_MAX_WAIT_MS, &rq->wait_ms) ||
        !get_int(o, "lease_ms", 100, 86400000, &rq->lease_ms))
        return WHY("body: wait_ms must be an integer from 0 to 3600000, "
                   "lease_ms one from 100 to 86400000");
    return CERB_OK;
}

static cerb_status body_begin(json_t *o, struct cerb__serve_req *rq, char *why,
                              size_t whylen)
{
    static const char *const known[] = {"running_ms", "keep_ms", "on_unavailable", NULL};
    const char *bad;
    json_t *pol = json_object_get(o, "on_unavailable");

    if (!only(o, known, &bad))
        return WHY("body: unknown member \"%.64s\" (running_ms, keep_ms, on_unavailable)",
                   bad);
    if (!get_int(o, "running_ms", 100, 86400000, &rq->guard.running_ms))
        return WHY("body: running_ms must be an integer from 100 to 86400000");
    if (!get_int(o, "keep_ms", -1, INT64_C(31536000000), &rq->guard.keep_ms) ||
        (json_object_get(o, "keep_ms") && rq->guard.keep_ms == 0))
        return WHY("body: keep_ms must be -1 (forever) or an integer from 1 to "
                   "31536000000");
    if (pol) {
        const char *s = json_string_value(pol);
        if (s && strcmp(s, "refuse") == 0 && json_string_length(pol) == 6)
            rq->guard.on_unavailable = CERB_GUARD_REFUSE;
        else if (s && strcmp(s, "allow") == 0 && json_string_length(pol) == 5)
            rq->guard.on_unavailable = CERB_GUARD_ALLOW;
        else
            return WHY("body: on_unavailable must be \"refuse\" or \"allow\"");
    }
    return CERB_OK;
}

static cerb_status body_finish(json_t *o, struct cerb__serve_req *rq, char *why,
                               size_t whylen)
{
    static const char *const known[] = {"attempt", "succeeded", "result", "result_base64",
                                        NULL};
    json_t *a = json_object_get(o, "attempt"), *ok = json_object_get(o, "succeeded");
    json_t *res = json_object_get(o, "result"), *b64 = json_object_get(o, "result_base64");
    const char *bad;

    if (!only(o, known, &bad))
        return WHY("body: unknown member \"%.64s\" (attempt, succeeded, result, "
                   "result_base64)",
                   bad);
    if (!json_is_string(a) || json_string_length(a) != CERB_SERVE_ID_LEN ||
        !cerb__serve_is_id(json_string_value(a)))
        return WHY("body: attempt must be the id begin answered (32 hex characters)");
    memcpy(rq->attempt, json_string_value(a), CERB_SERVE_ID_LEN + 1);
    if (!json_is_boolean(ok))
        return WHY("body: succeeded must be true or false");
    rq->succeeded = json_is_true(ok);
    if (res && b64)
        return WHY("body: result and result_base64 are one or the other");
    if ((res || b64) && !rq->succeeded)
        return WHY("body: a failure stores no result");
    if (res) {
        if (!json_is_string(res))
            return WHY("body: result must be a string (result_base64 for bytes)");
        rq->result_len = json_string_length(res);
        rq->result = copy(json_string_value(res), rq->result_len);
        if (!rq->result)
            return CERB_ENOMEM;
    } else if (b64) {
        if (!json_is_string(b64) ||
            !cerb__serve_b64_decode(json_string_value(b64), json_string_length(b64),
                                    &rq->result, &rq->result_len))
            return WHY("body: result_base64 must be padded base64 (RFC 4648)");
    }
    return CERB_OK;
}

static cerb_status body_switch(json_t *o, struct cerb__serve_req *rq, char *why,
                               size_t whylen)
{
    static const char *const known[] = {"engine", NULL};
    json_t *e = json_object_get(o, "engine");
    const char *bad;

    if (!only(o, known, &bad))
        return WHY("body: unknown member \"%.64s\" (engine)", bad);
    if (!e)
        return CERB_OK;
    if (!json_is_string(e) || json_string_length(e) == 0 ||
        strlen(json_string_value(e)) != json_string_length(e))
        return WHY("body: engine must be an engine's name, or \"auto\"");
    rq->engine = copy(json_string_value(e), json_string_length(e));
    return rq->engine ? CERB_OK : CERB_ENOMEM;
}

cerb_status cerb__serve_parse(const char *method, const char *path, const char *body,
                              size_t len, struct cerb__serve_req *rq, char *why,
                              size_t whylen)
{
    cerb_status (*read_body)(json_t *, struct cerb__serve_req *, char *, size_t) = NULL;
    const char *p = NULL, *k = NULL;
    size_t n = 0, kn = 0;
    json_error_t jerr;
    json_t *o;
    cerb_status st;

    memset(rq, 0, sizeof *rq);
    rq->guard.on_unavailable = -1;
    if (whylen)
        why[0] = '\0';
    rq->rt = match(method, path, &p, &n, &k, &kn);
    if (rq->rt == CERB_SERVE_RT_NONE) {
        allowed(method, path, rq->allow, sizeof rq->allow);
        return CERB_OK;
    }
    if (p && !(rq->part = copy(p, n)))
        return CERB_ENOMEM;
    if (k) {
        if (!(rq->key = copy(k, kn)))
            return CERB_ENOMEM;
        rq->key_len = kn;
    }
    if ((rq->rt == CERB_SERVE_RT_LOCK_ACQUIRE || rq->rt == CERB_SERVE_RT_LOCK_INSPECT) &&
        !is_utf8(p, n))
        return WHY("path: the lock name is not UTF-8 (a name is echoed in JSON answers, "
                   "which carry only UTF-8)");
    switch (rq->rt) {
    case CERB_SERVE_RT_LOCK_ACQUIRE:
        read_body = body_acquire;
        break;
    case CERB_SERVE_RT_GUARD_BEGIN:
        read_body = body_begin;
        break;
    case CERB_SERVE_RT_GUARD_FINISH:
        read_body = body_finish;
        if (len == 0)
            return WHY("body: finish needs {\"attempt\": ID, \"succeeded\": BOOL}");
        break;
    case CERB_SERVE_RT_SWITCH:
        read_body = body_switch;
        break;
    default:
        return CERB_OK; /* the other routes read no body */
    }
    if (len == 0)
        return CERB_OK;
    o = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!o || !json_is_object(o)) {
        st = WHY("body: %s", o ? "not a JSON object" : jerr.text);
        json_decref(o);
        return st;
    }
    st = read_body(o, rq, why, whylen);
    json_decref(o);
    return st;
}

void cerb__serve_req_free(struct cerb__serve_req *rq)
{
    free(rq->part);
    free(rq->key);
    free(rq->result);
    free(rq->engine);
    memset(rq, 0, sizeof *rq);
}
