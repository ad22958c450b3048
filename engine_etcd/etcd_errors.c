/*
 * etcd_errors.c — gateway, HTTP and libcurl failures to cerb_status, in
 * exactly one function.
 *
 * A request to the gateway can fail in three layers, and the outcome (may
 * the request have taken effect?) depends on the layer. Nothing can have
 * happened before the connection was up, nor when etcd refused the request
 * up front (no leader with `Grpc-Metadata-hasleader`, bad token, bad
 * argument). Once the request may have left and no definite answer came
 * back — a timeout, a reset connection, etcd's own "request timed out" —
 * it may have been applied, and the caller must settle it (engine.h).
 * gRPC codes come from the error body `{"error","message","code"}` the
 * gateway sends with a matching HTTP status, or from an in-band error or a
 * cancel reason in a stream; a few codes need the message to decide, since
 * etcd maps both "no leader" (refused) and "request timed out" (ambiguous)
 * to UNAVAILABLE.
 */
#include "internal_posix.h"

#include "etcd_errors.h"

#include <curl/curl.h>
#include <string.h>

#include "error.h"

static bool has(const char *s, const char *needle)
{
    return s && strstr(s, needle) != NULL;
}

static const char *grpc_name(int code)
{
    switch (code) {
    case ETCD_GRPC_OK: return "OK";
    case ETCD_GRPC_CANCELED: return "CANCELED";
    case ETCD_GRPC_UNKNOWN: return "UNKNOWN";
    case ETCD_GRPC_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case ETCD_GRPC_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case ETCD_GRPC_NOT_FOUND: return "NOT_FOUND";
    case ETCD_GRPC_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case ETCD_GRPC_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case ETCD_GRPC_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case ETCD_GRPC_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case ETCD_GRPC_ABORTED: return "ABORTED";
    case ETCD_GRPC_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case ETCD_GRPC_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case ETCD_GRPC_INTERNAL: return "INTERNAL";
    case ETCD_GRPC_UNAVAILABLE: return "UNAVAILABLE";
    case ETCD_GRPC_DATA_LOSS: return "DATA_LOSS";
    case ETCD_GRPC_UNAUTHENTICATED: return "UNAUTHENTICATED";
    }
    return "?";
}

/* A gRPC error answered by the gateway (HTTP status + body, or in-band). */
static cerb_status grpc_fail(const char *ep, const struct etcd_failure *f, cerb_outcome *oc,
                             enum etcd_action *act)
{
    const char *msg = f->message && f->message[0] ? f->message : "(no message)";
    const char *hint = "";
    cerb_status st;

    *oc = CERB_OUTCOME_NO;
    *act = ETCD_ACT_NONE;
    switch (f->grpc_code) {
    case ETCD_GRPC_UNAVAILABLE:
        /* "no leader" and "not capable" are refusals before any work;
         * "request timed out" (also when the leader failed or the
         * connection to it was lost) is a proposal that may yet apply. */
        st = CERB_EIO;
        *act = ETCD_ACT_ROTATE;
        if (!has(msg, "no leader") && !has(msg, "not capable") && !has(msg, "server stopped") &&
            !has(msg, "unhealthy"))
            *oc = CERB_OUTCOME_UNKNOWN;
        break;
    case ETCD_GRPC_DEADLINE_EXCEEDED:
        st = CERB_EIO;
        *act = ETCD_ACT_ROTATE;
        *oc = CERB_OUTCOME_UNKNOWN;
        break;
    case ETCD_GRPC_UNAUTHENTICATED:
        st = CERB_EIO;
        *act = ETCD_ACT_REAUTH;
        break;
    case ETCD_GRPC_INVALID_ARGUMENT:
        if (has(msg, "user name is empty")) {
            /* Auth is on and the request carried no token. */
            st = CERB_EIO;
            *act = ETCD_ACT_REAUTH;
            hint = " (the server requires authentication: set etcd.user and etcd.password)";
        } else if (has(msg, "revision of auth store is old")) {
            st = CERB_EIO;
            *act = ETCD_ACT_REAUTH;
        } else if (has(msg, "authentication failed")) {
            st = CERB_EIO;
            hint = " (check etcd.user and etcd.password)";
        } else {
            st = CERB_EPROTO;
        }
        break;
    case ETCD_GRPC_PERMISSION_DENIED:
    case ETCD_GRPC_RESOURCE_EXHAUSTED:
        st = CERB_EIO;
        break;
    case ETCD_GRPC_UNKNOWN:
    case ETCD_GRPC_CANCELED:
    case ETCD_GRPC_INTERNAL:
    case ETCD_GRPC_DATA_LOSS:
    case ETCD_GRPC_ABORTED:
        st = CERB_EPROTO;
        *oc = CERB_OUTCOME_UNKNOWN;
        break;
    default:
        /* NOT_FOUND (e.g. lease), FAILED_PRECONDITION (lease exists),
         * OUT_OF_RANGE (compacted), UNIMPLEMENTED ...: the server looked
         * and said no. The caller checks the codes it expects. */
        st = CERB_EPROTO;
        break;
    }
    if (f->http_status > 0)
        return cerb__error_set(st, "etcd %s: %s: %s (HTTP %ld, code %d %s)%s", ep, f->what, msg,
                               f->http_status, f->grpc_code, grpc_name(f->grpc_code), hint);
    return cerb__error_set(st, "etcd %s: %s: %s (code %d %s)%s", ep, f->what, msg, f->grpc_code,
                           grpc_name(f->grpc_code), hint);
}

static cerb_status curl_fail(const char *ep, const struct etcd_failure *f, cerb_outcome *oc,
                             enum etcd_action *act)
{
    CURLcode cc = (CURLcode)f->curl_code;
    const char *msg = f->curl_msg && f->curl_msg[0] ? f->curl_msg : curl_easy_strerror(cc);
    cerb_status st = CERB_EIO;

    *oc = f->connected ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
    *act = ETCD_ACT_ROTATE;
    switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        *oc = CERB_OUTCOME_NO;
        break;
    case CURLE_OPERATION_TIMEDOUT:
        if (!f->connected)
            return cerb__error_set(CERB_EIO, "etcd %s: %s: connect timed out after %lld ms", ep,
                                   f->what, (long long)f->timeout_ms);
        cerb__error_set(CERB_EIO, "etcd %s: %s: no answer within %lld ms", ep, f->what,
                        (long long)f->timeout_ms);
        return CERB_EIO;
    case CURLE_OUT_OF_MEMORY:
        st = CERB_ENOMEM;
        *act = ETCD_ACT_NONE;
        break;
    case CURLE_WRITE_ERROR:
        /* Our write callback refused the body (too large, out of memory). */
        st = CERB_EPROTO;
        *act = ETCD_ACT_NONE;
        *oc = CERB_OUTCOME_UNKNOWN;
        break;
    default:
        /* Send/receive errors, empty replies, resets: whatever was sent
         * may have been applied if the connection was up. */
        break;
    }
    return cerb__error_set(st, "etcd %s: %s: %s", ep, f->what, msg);
}

cerb_status cerb__etcd_fail(const char *endpoint, const struct etcd_failure *f,
                            cerb_outcome *outcome, enum etcd_action *action)
{
    cerb_outcome oc = CERB_OUTCOME_UNKNOWN;
    enum etcd_action act = ETCD_ACT_NONE;
    cerb_status st;
    const char *ep = endpoint ? endpoint : "(no endpoint)";

    if (f->curl_code != 0) {
        st = curl_fail(ep, f, &oc, &act);
    } else if (f->grpc_code >= 0) {
        st = grpc_fail(ep, f, &oc, &act);
    } else if (f->http_status != 0 && f->http_status != 200) {
        long s = f->http_status;
        const char *body = f->message && f->message[0] ? f->message : "";
        if (s == 503) {
            st = CERB_EIO;
            oc = CERB_OUTCOME_NO;
            act = ETCD_ACT_ROTATE;
        } else if (s >= 500) {
            st = CERB_EIO;
            act = ETCD_ACT_ROTATE;
        } else {
            st = CERB_EPROTO;
            oc = CERB_OUTCOME_NO;
        }
        cerb__error_set(st, "etcd %s: %s: HTTP %ld%s%.200s%s%s", ep, f->what, s,
                        body[0] ? " \"" : "", body, body[0] ? "\"" : "",
                        s == 404 || s == 405 ? " (is this the etcd v3 JSON gateway, etcd >= 3.4?)"
                                             : "");
    } else {
        st = CERB_EPROTO;
        oc = CERB_OUTCOME_UNKNOWN;
        cerb__error_set(st, "etcd %s: %s: unexpected answer%s%.200s", ep, f->what,
                        f->message && f->message[0] ? ": " : "", f->message ? f->message : "");
    }
    if (outcome)
        *outcome = oc;
    if (action)
        *action = act;
    return st;
}
