/*
 * etcd_http.h — the gateway client: endpoints, pooled curl easy handles,
 * authentication, and the one function every unary request goes through.
 *
 * Ownership: struct etcd_http lives inside the engine (etcd_internal.h) and
 * owns its endpoint strings, idle handles and token. A handle taken with
 * cerb__etcd_conn_get() belongs to the caller until cerb__etcd_conn_put().
 * Thread-safety: everything here may be called from any thread; a handle
 * is used by one thread at a time.
 */
#ifndef CERB_ETCD_HTTP_H
#define CERB_ETCD_HTTP_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "etcd_errors.h"
#include "sync.h"

/* Idle handles kept for reuse; more are freed when given back. */
#define ETCD_MAX_IDLE 64

/* Answers larger than this are refused (a lock never needs more). */
#define ETCD_MAX_BODY (16u << 20)

/* One curl easy handle with its own connection cache and buffers. */
struct etcd_conn {
    CURL *h;
    struct curl_slist *hdr_unary;  /* headers of unary requests */
    struct curl_slist *hdr_stream; /* of streams (no Grpc-Timeout) */
    struct curl_slist *hdr_plain;  /* unary without a token (authenticate) */
    uint64_t hdr_auth_gen;         /* token generation the lists carry */
    char err[CURL_ERROR_SIZE];
    char *url;                     /* scratch for base + path */
    size_t url_cap;
    char *buf;                     /* answer body (unary) */
    size_t len, cap;
    const atomic_int *abort;       /* xferinfo stops the transfer when set */
    struct etcd_conn *next;        /* idle list */
};

struct etcd_http {
    const struct cerb_etcd_config *ec;
    size_t n_ep;
    char *ep[CERB_MAX_ENDPOINTS];  /* base URLs, no trailing '/' */
    atomic_uint cur;               /* sticky endpoint index */
    cerb_mutex mu;                 /* idle list */
    struct etcd_conn *idle;
    int n_idle;
    cerb_mutex auth_mu;            /* token, refresh */
    char *auth_header;             /* "Authorization: <token>", NULL = none */
    atomic_uint_fast64_t auth_gen; /* bumped per new token */
    char grpc_timeout[40];         /* "Grpc-Timeout: <op_timeout>m" */
};

struct cerb_engine;

/* Set up (no network) and tear down. init fails only on out of memory or
 * an endpoint curl cannot take. */
cerb_status cerb__etcd_http_init(struct etcd_http *h, const struct cerb_etcd_config *ec);
void cerb__etcd_http_destroy(struct etcd_http *h);

/* The endpoint in use, for messages (borrowed, valid until destroy). */
const char *cerb__etcd_endpoint(struct etcd_http *h);
/* Move off endpoint `idx` after a failure there (a no-op if another thread
 * has already moved on): sticky until the next failure. */
void cerb__etcd_rotate(struct cerb_engine *e, unsigned idx);

/* ---- unary requests ---- */

struct etcd_call {
    /* in */
    const char *what;        /* for messages: "txn", "lease grant" ... */
    const char *path;        /* "/v3/kv/txn", or "/health" */
    json_t *body;            /* borrowed; NULL = GET */
    int64_t deadline_ns;     /* bounds every attempt together */
    bool idempotent;         /* may be re-sent after an unknown outcome */
    bool no_auth;            /* the authenticate request itself */
    const atomic_int *abort; /* optional: give up as soon as it is set */
    /* out */
    json_t *resp;            /* on CERB_OK: the answer (a stream's single
                                "result" unwrapped); json_decref it */
    int grpc_code;           /* code of the last failure, -1 = none */
    long http_status;        /* status of the last answer, 0 = none */
    cerb_outcome outcome;    /* on failure: may it have taken effect? */
    int64_t sent_ns;         /* monotonic time before the send that was
                                answered (or of the last attempt) */
    bool resent;             /* an attempt before the answered one may
                                have taken effect (idempotent re-send) */
};

/*
 * POST c->body as JSON to c->path (GET without a body) on the current
 * endpoint, with `Grpc-Metadata-hasleader: true`, the auth token, and a
 * per-attempt timeout of min(op_timeout, time left). A failure that leaves
 * the outcome definite (cannot connect, no leader, bad token) is tried again
 * on the next endpoint, after a fresh token, until the deadline; an unknown
 * outcome only when c->idempotent. An answer that carries an error — an
 * HTTP error body or an in-band {"error": ...} — is a failure mapped by
 * cerb__etcd_fail (c->grpc_code tells the caller which).
 * Returns: CERB_OK with c->resp, CERB_INTERRUPTED when c->abort fired, or
 * the mapped error with c->outcome (UNKNOWN if any attempt may have landed).
 */
cerb_status cerb__etcd_call(struct cerb_engine *e, struct etcd_call *c);

/* An idempotent POST of @body (taken: freed here; NULL, as a failed
 * json_pack gives, is CERB_ENOMEM) to @path, named @what in messages, by
 * @deadline_ns; @abort may be NULL. On CERB_OK *resp is the answer (the
 * caller json_decref()s it), else NULL. */
cerb_status cerb__etcd_post(struct cerb_engine *e, const char *what, const char *path,
                            json_t *body, int64_t deadline_ns, const atomic_int *abort,
                            json_t **resp);

/* A linearizable range of one key (ordered after every write acknowledged
 * before it): the response in *resp (the caller json_decref()s it) and its
 * header revision in *rev. */
cerb_status cerb__etcd_read_key(struct cerb_engine *e, const char *key, size_t key_len,
                                const char *what, int64_t deadline_ns, json_t **resp,
                                int64_t *rev);

/* Authenticate with etcd.user/password and keep the token, unless another
 * thread has already replaced the token of generation `seen_gen`. */
cerb_status cerb__etcd_authenticate(struct cerb_engine *e, int64_t deadline_ns,
                                    uint64_t seen_gen);

/* ---- handles, for streams (etcd_watch.c) ---- */

cerb_status cerb__etcd_conn_get(struct cerb_engine *e, struct etcd_conn **out);
void cerb__etcd_conn_put(struct cerb_engine *e, struct etcd_conn *c);
/*
 * Prepare c for one request to endpoint idx: URL, body (text kept by the
 * caller until the transfer ends; NULL = GET), headers (stream: without
 * Grpc-Timeout), timeouts (timeout_ms 0 = none), the default body sink
 * (c->buf). The caller may then override the write callback.
 */
cerb_status cerb__etcd_conn_prepare(struct cerb_engine *e, struct etcd_conn *c, unsigned idx,
                                    const char *path, const char *body, bool stream,
                                    int64_t timeout_ms);
/* Send the next request prepared on c without the auth token. */
void cerb__etcd_conn_no_token(struct etcd_conn *c);
/* Give c the pool's own callbacks back after a caller overrode them. */
void cerb__etcd_conn_restore(struct etcd_conn *c);
/* Did the last transfer on c get as far as sending (pretransfer)? */
bool cerb__etcd_conn_connected(struct etcd_conn *c);

#endif
