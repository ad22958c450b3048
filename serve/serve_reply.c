/*
 * serve_reply.c — JSON answers of `cerberus serve`, and the one mapping of
 * library statuses to HTTP codes (DESIGN.md §15): 409 busy, 408 timeout,
 * 503 when no engine could answer, 400 bad input, 404 unknown hold or
 * attempt, 410 lost. Every reply made here is noted for the metrics
 * (serve_metrics.c: cerberus_serve_requests_total).
 */
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

/* Queues @body (stolen) with HTTP @code and, when @auth, the
 * WWW-Authenticate: Bearer challenge of a 401. */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, json_t *body,
                             bool auth)
{
    struct MHD_Response *r;
    enum MHD_Result ret;
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    size_t len;

    json_decref(body);
    if (!text)
        return MHD_NO; /* out of memory: MHD closes the connection */
    len = strlen(text);
    text[len] = '\n'; /* json_dumps' NUL becomes the line's end */
    r = MHD_create_response_from_buffer(len + 1, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (auth)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Bearer realm=\"cerberus\"");
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
        return MHD_NO;
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
    return reply(conn, code, body, false);
}

enum MHD_Result cerb__serve_reply_unauthorized(struct MHD_Connection *conn,
                                               const char *text)
{
    return reply(conn, MHD_HTTP_UNAUTHORIZED,
                 json_pack("{s:s, s:s}", "status", "UNAUTHORIZED", "error", text), true);
}

enum MHD_Result cerb__serve_reply_error(struct MHD_Connection *conn, cerb_status st,
                                        const char *text)
{
    json_t *body = json_pack("{s:s, s:s}", "status", cerb_status_name(st),
                             "error", text && text[0] ? text : cerb_strerror(st));
    return cerb__serve_reply_json(conn, cerb__serve_http_code(st), body);
}
