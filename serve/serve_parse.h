/*
 * serve_parse.h — the pure part of answering a `cerberus serve` request:
 * which route a method and path name, the parts of the path (a lock name,
 * a hold or attempt id, a guard's scope and key) and the JSON body checked
 * into a small struct. No libmicrohttpd here: serve_routes.c calls it with
 * what MHD handed over, tests/fuzz/fuzz_serve_request.c with anything.
 *
 * The path is the one libmicrohttpd gives the access handler: the query
 * (from '?') is cut off and %XX escapes are already decoded, once
 * (MHD_http_unescape; a '%' not followed by two hex digits stays as it is).
 * So the parser decodes nothing more (a second decoding would turn a key's
 * literal "%41" into "A"), and a '/' sent as %2F is a '/' here: a path part
 * that may hold a '/' is only ever the last one before a fixed suffix
 * (a lock name, a guard key), and the parts before it (a guard scope, an
 * id) cannot hold one. A NUL sent as %00 ends the path, so keys with a NUL
 * byte cannot be sent (a client must refuse them).
 */
#ifndef CERB_SERVE_PARSE_H
#define CERB_SERVE_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

/* A hold or attempt id: 16 random bytes as 32 lowercase hex characters. */
#define CERB_SERVE_ID_LEN 32

/* The longest wait an acquisition may ask for: an hour. */
#define CERB_SERVE_MAX_WAIT_MS 3600000

enum cerb__serve_rt {
    CERB_SERVE_RT_NONE = 0,        /* no such route (404) */
    CERB_SERVE_RT_HEALTHZ,         /* GET /healthz */
    CERB_SERVE_RT_METRICS,         /* GET /metrics */
    CERB_SERVE_RT_STATUS,          /* GET /v1/status */
    CERB_SERVE_RT_SWITCH,          /* POST /v1/switch */
    CERB_SERVE_RT_LOCK_INSPECT,    /* GET /v1/locks/{name} */
    CERB_SERVE_RT_LOCK_ACQUIRE,    /* POST /v1/locks/{name}/acquire */
    CERB_SERVE_RT_HOLD_RELEASE,    /* DELETE /v1/holds/{id} */
    CERB_SERVE_RT_HOLD_KEEPALIVE,  /* POST /v1/holds/{id}/keepalive */
    CERB_SERVE_RT_HOLD_EVENTS,     /* GET /v1/holds/{id}/events */
    CERB_SERVE_RT_GUARD_BEGIN,     /* POST /v1/guard/{scope}/{key}/begin */
    CERB_SERVE_RT_GUARD_FINISH,    /* POST /v1/guard/{scope}/{key}/finish */
    CERB_SERVE_RT_GUARD_KEEPALIVE, /* POST /v1/guard/attempts/{id}/keepalive */
    CERB_SERVE_RT_DAPR,            /* Dapr's /v1.0-alpha1 and /v1.0 (serve_dapr.c) */
    CERB_SERVE_RT_COUNT
};

/* The route's name, as the `route` label of cerberus_serve_requests_total
 * ("unknown" for NONE). */
const char *cerb__serve_rt_name(enum cerb__serve_rt rt);

/* What was read from a request; free with cerb__serve_req_free(). */
struct cerb__serve_req {
    enum cerb__serve_rt rt;
    /* The path part: the lock name, the hold or attempt id, the guard's
     * scope (NUL-terminated, never NULL once a route matched). */
    char *part;
    /* The guard's key (begin, finish): may be empty, may hold '/'. */
    char *key;
    size_t key_len;
    /* acquire: wait_ms (0 when absent), lease_ms (0: the default). */
    int64_t wait_ms;
    int64_t lease_ms;
    /* begin: cerb_guard_opts (0, 0, -1 when absent). */
    cerb_guard_opts guard;
    /* finish: the attempt id, whether it succeeded, what to store
     * (result_len bytes, a NUL after them; NULL when none). */
    char attempt[CERB_SERVE_ID_LEN + 1];
    bool succeeded;
    char *result;
    size_t result_len;
    /* switch: the engine to switch to ("auto" included); NULL = the next. */
    char *engine;
    /* rt NONE: the methods that would take this path ("GET, POST"...), the
     * Allow of a 405; "" when none would (404). */
    char allow[24];
};

/*
 * cerb__serve_parse — read @method, @path (as MHD gives it) and @body
 * (@len bytes; need not be NUL-terminated) into *@rq (zeroed here first).
 * Routes that take a body accept none (every member has its default) or
 * a JSON object whose members are known and well-typed (guard and switch
 * bodies refuse unknown members; an acquisition ignores them).
 * Returns: CERB_OK with rq->rt set (CERB_SERVE_RT_NONE when no route
 * matches: not an error; rq->allow then says which methods would take the
 * path, if any); CERB_EINVAL when a route matched but its body or
 * path part is bad, with the reason in @why (@whylen bytes); CERB_ENOMEM.
 * Free *@rq with cerb__serve_req_free() whatever it returned.
 */
cerb_status cerb__serve_parse(const char *method, const char *path, const char *body,
                              size_t len, struct cerb__serve_req *rq, char *why,
                              size_t whylen);

void cerb__serve_req_free(struct cerb__serve_req *rq);

/*
 * cerb__serve_utf8_seq — the length (1 to 4) of the well-formed UTF-8
 * sequence (RFC 3629: no overlong form, no surrogate, nothing above
 * U+10FFFF) that starts at @p, @n bytes left (n >= 1).
 * Returns: 0 when none starts there. Thread-safety: pure.
 */
size_t cerb__serve_utf8_seq(const unsigned char *p, size_t n);

/* Whether @s is an id as the server makes them (32 lowercase hex). */
bool cerb__serve_is_id(const char *s);

/*
 * cerb__serve_b64_decode — strict standard base64 (RFC 4648 §4, padded,
 * no whitespace) of @in (@n bytes) into a new buffer *@out (*@out_len
 * bytes and a NUL; free it). Returns false for text that is not that, or
 * no memory (*@out NULL).
 */
bool cerb__serve_b64_decode(const char *in, size_t n, char **out, size_t *out_len);

#endif /* CERB_SERVE_PARSE_H */
