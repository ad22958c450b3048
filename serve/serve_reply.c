/*
 * serve_reply.c — JSON answers of `cerberus serve`, and the one mapping of
 * library statuses to HTTP codes (DESIGN.md §15): 409 busy, 408 timeout,
 * 503 when no engine could answer, 400 bad input, 404 unknown hold or
 * attempt, 410 lost. Every reply made here is noted for the metrics
 * (serve_metrics.c: cerberus_serve_requests_total).
 *
 * Every request gets an answer. Error texts echo what the caller sent (a
 * hold id, a lock name, a store), and a path's %XX escapes can make any
 * bytes, which JSON strings cannot carry: jansson refuses to pack text that
 * is not UTF-8. So echoed text goes through cerb__serve_utf8() first, which
 * replaces each byte that does not belong to a well-formed UTF-8 sequence
 * (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF) by
 * U+FFFD, and a snprintf("%.40s") that cut a character in half leaves only
 * such a replacement, never half a character. A body that still cannot be
 * made (no memory) is answered with a fixed 500 body from static memory
 * rather than a dropped connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

unsigned cerb__serve_http_code(cerb_status st)
{
    switch (st) {
    case CERB_OK:
    case CERB_DUPLICATE:
        return MHD_HTTP_OK;
    case CERB_BUSY:
        return MHD_HTTP_CONFLICT;
    case CERB_TIMEOUT:
        return MHD_HTTP_REQUEST_TIMEOUT;
    case CERB_INTERRUPTED:
    case CERB_UNAVAILABLE:
    case CERB_EIO:
    case CERB_EPROTO:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    case CERB_EINVAL:
        return MHD_HTTP_BAD_REQUEST;
    case CERB_NOT_OWNER:
        return MHD_HTTP_NOT_FOUND;
    case CERB_LOST:
        return MHD_HTTP_GONE;
    case CERB_ECONFIG:
    case CERB_ENOMEM:
    case CERB_STATUS_COUNT:
        break;
    }
    /* After the switch on purpose: -Wswitch names a status added later. */
    return MHD_HTTP_INTERNAL_SERVER_ERROR;
}

char *cerb__serve_utf8(const char *text)
{
    static const char repl[] = "\xef\xbf\xbd"; /* U+FFFD */
    const unsigned char *p = (const unsigned char *)(text ? text : "");
    size_t n = strlen((const char *)p), o = 0;
    /* At worst every byte becomes three. */
    char *out = malloc(n * 3 + 1);

    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = cerb__serve_utf8_seq(p + i, n - i);
        if (k == 0) {
            memcpy(out + o, repl, 3);
            o += 3;
            i++;
        } else {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
    return out;
}

/* A JSON string of @text made valid UTF-8 (NULL: no memory). */
static json_t *text_value(const char *text)
{
    char *clean = cerb__serve_utf8(text);
    json_t *v = clean ? json_string(clean) : NULL;

    free(clean);
    return v;
}

/* The answer when the real one cannot be made: static, so it needs no
 * memory of its own. */
static const char fallback[] = "{\"status\":\"ENOMEM\",\"error\":\"the answer could not "
                               "be made\"}\n";

static enum MHD_Result reply_fallback(struct MHD_Connection *conn)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        sizeof fallback - 1, (void *)fallback, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret;

    if (!r)
        return MHD_NO; /* nothing left to answer with: MHD closes it */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    ret = MHD_queue_response(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES)
        cerb__serve_metrics_replied(MHD_HTTP_INTERNAL_SERVER_ERROR);
    return ret;
}

/* Queues @body (stolen; NULL when it could not be made: the fixed 500)
 * with HTTP @code and, when @auth, the WWW-Authenticate: Bearer challenge
 * of a 401; with @allow, the Allow header of a 405. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, json_t *body,
                             bool auth, const char *allow)
{
    struct MHD_Response *r;
    enum MHD_Result ret;
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    size_t len;

    json_decref(body);
    if (!text)
        return reply_fallback(conn);
    len = strlen(text);
    text[len] = '\n'; /* json_dumps' NUL becomes the line's end */
    r = MHD_create_response_from_buffer(len + 1, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return reply_fallback(conn);
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (auth)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Bearer realm=\"cerberus\"");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES)
        cerb__serve_metrics_replied(code);
    return ret;
}

enum MHD_Result cerb__serve_reply_text(struct MHD_Connection *conn, unsigned code,
                                       const char *content_type, const char *text,
                                       size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;

    if (!r)
        return reply_fallback(conn);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES)
        cerb__serve_metrics_replied(code);
    return ret;
}

enum MHD_Result cerb__serve_reply_json(struct MHD_Connection *conn, unsigned code,
                                       json_t *body)
{
    return reply(conn, code, body, false, NULL);
}

enum MHD_Result cerb__serve_reply_unauthorized(struct MHD_Connection *conn,
                                               const char *text)
{
    return reply(conn, MHD_HTTP_UNAUTHORIZED,
                 json_pack("{s:s, s:o*}", "status", "UNAUTHORIZED", "error",
                           text_value(text)),
                 true, NULL);
}

enum MHD_Result cerb__serve_reply_error(struct MHD_Connection *conn, cerb_status st,
                                        const char *text)
{
    json_t *body = json_pack("{s:s, s:o*}", "status", cerb_status_name(st), "error",
                             text_value(text && text[0] ? text : cerb_strerror(st)));
    return cerb__serve_reply_json(conn, cerb__serve_http_code(st), body);
}

enum MHD_Result cerb__serve_reply_dapr_error(struct MHD_Connection *conn, unsigned code,
                                             const char *error_code, const char *message)
{
    return cerb__serve_reply_json(conn, code,
                                  json_pack("{s:s, s:o*}", "errorCode", error_code,
                                            "message", text_value(message)));
}

enum MHD_Result cerb__serve_reply_method(struct MHD_Connection *conn, const char *method,
                                         const char *allow)
{
    char why[160];

    snprintf(why, sizeof why, "this route answers %s, not %.16s", allow, method);
    return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                 json_pack("{s:s, s:o*}", "status", "EINVAL", "error", text_value(why)),
                 false, allow);
}
