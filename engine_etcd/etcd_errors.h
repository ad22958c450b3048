/*
 * etcd_errors.h — the one place where a failed exchange with the etcd v3
 * JSON gateway (a libcurl error, an HTTP status, a gRPC code in the error
 * body or in a stream) becomes a cerb_status, an outcome, what to do next
 * (rotate the endpoint, authenticate again) and the text of
 * cerb_last_error().
 */
#ifndef CERB_ETCD_ERRORS_H
#define CERB_ETCD_ERRORS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

/* gRPC status codes the gateway puts in `code` (google.golang.org/grpc/codes). */
enum etcd_grpc_code {
    ETCD_GRPC_OK = 0,
    ETCD_GRPC_CANCELED = 1,
    ETCD_GRPC_UNKNOWN = 2,
    ETCD_GRPC_INVALID_ARGUMENT = 3,
    ETCD_GRPC_DEADLINE_EXCEEDED = 4,
    ETCD_GRPC_NOT_FOUND = 5,
    ETCD_GRPC_ALREADY_EXISTS = 6,
    ETCD_GRPC_PERMISSION_DENIED = 7,
    ETCD_GRPC_RESOURCE_EXHAUSTED = 8,
    ETCD_GRPC_FAILED_PRECONDITION = 9,
    ETCD_GRPC_ABORTED = 10,
    ETCD_GRPC_OUT_OF_RANGE = 11,
    ETCD_GRPC_UNIMPLEMENTED = 12,
    ETCD_GRPC_INTERNAL = 13,
    ETCD_GRPC_UNAVAILABLE = 14,
    ETCD_GRPC_DATA_LOSS = 15,
    ETCD_GRPC_UNAUTHENTICATED = 16
};

/* What the caller should do about the failure besides reporting it. */
enum etcd_action {
    ETCD_ACT_NONE = 0,
    ETCD_ACT_ROTATE, /* this endpoint cannot serve now: try the next one */
    ETCD_ACT_REAUTH  /* the auth token is missing, expired or stale */
};

/*
 * One failure, described by whichever of its parts are known:
 *  - `curl_code` (a CURLcode, 0 = none) with `curl_msg` (the error buffer)
 *    and `connected` (the connection was up, so the request may have left);
 *  - `http_status` (0 = no HTTP answer) and `grpc_code` (-1 = no error body)
 *    with the gateway's `message`;
 *  - `bad_body`: HTTP 200, but the body is not what the request expects.
 */
struct etcd_failure {
    const char *what;      /* "txn", "lease grant", "watch" ... */
    int curl_code;
    const char *curl_msg;
    bool connected;
    long http_status;
    int grpc_code;
    const char *message;
    bool bad_body;
    int64_t timeout_ms;    /* the timeout in force, for the message */
};

/*
 * Map a failure to a status, set *outcome and *action (each may be NULL) and
 * the thread's last error to "etcd ENDPOINT: WHAT: reason". In short:
 *   cannot connect, TLS set-up, connect timeout   -> CERB_EIO, NO, rotate
 *   timeout or I/O error after connecting        -> CERB_EIO, UNKNOWN, rotate
 *   code 14 UNAVAILABLE (HTTP 503): "no leader"  -> CERB_EIO, NO, rotate
 *                          any other reason      -> CERB_EIO, UNKNOWN, rotate
 *   code 4 DEADLINE_EXCEEDED                     -> CERB_EIO, UNKNOWN, rotate
 *   code 16 UNAUTHENTICATED (HTTP 401), "auth
 *     revision is old", "user name is empty"     -> CERB_EIO, NO, re-auth
 *   bad credentials, PERMISSION_DENIED,
 *     RESOURCE_EXHAUSTED (too many requests,
 *     no space alarm)                            -> CERB_EIO, NO
 *   other gateway errors (bad request, not found,
 *     failed precondition ...)                   -> CERB_EPROTO, NO
 *   INTERNAL / UNKNOWN / CANCELED / DATA_LOSS    -> CERB_EPROTO, UNKNOWN
 *   HTTP error without a gateway body: 503       -> CERB_EIO, NO, rotate
 *                    other 5xx                   -> CERB_EIO, UNKNOWN, rotate
 *                    4xx (not a v3 gateway?)     -> CERB_EPROTO, NO
 *   an answer we cannot read                     -> CERB_EPROTO, UNKNOWN
 *   out of memory                                -> CERB_ENOMEM
 */
cerb_status cerb__etcd_fail(const char *endpoint, const struct etcd_failure *f,
                            cerb_outcome *outcome, enum etcd_action *action);

#endif
