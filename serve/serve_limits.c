/*
 * serve_limits.c — the request rate limit of `cerberus serve`: one token
 * bucket per listening socket, and its 429 answer.
 *
 * Token bucket: a socket's bucket holds up to `burst` tokens (serve.
 * rate_burst; 0 means one second's worth, `rate`) and gains `rate` tokens a
 * second (serve.rate_limit) on the monotonic clock; every request, from its
 * first header on and before its token is checked, takes one. A request
 * that finds less than one is answered 429 {"status": "RATE_LIMITED"} with
 * `Retry-After`, the whole seconds until a token is there (at least 1), and
 * its body is not read. The refill is computed when a request comes (no
 * timer): tokens += elapsed * rate, capped at burst.
 *
 * Why per socket and not per caller: a unix socket has no peer address,
 * and on loopback TCP every caller is 127.0.0.1, so a per-address bucket
 * would be one bucket anyway; one per socket lets an operator give the
 * local socket and a TCP port their own budget through their own
 * sockets. rate 0 turns the limit off (the default), and a reload (SIGHUP)
 * applies a new rate and burst to the next request, keeping the tokens
 * already there (capped at the new burst).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

void cerb__serve_bucket_init(struct cerb__serve_bucket *b)
{
    if (pthread_mutex_init(&b->mu, NULL) != 0)
        abort();
    b->tokens = -1; /* full at the first request */
    b->last_ns = 0;
}

void cerb__serve_bucket_destroy(struct cerb__serve_bucket *b)
{
    pthread_mutex_destroy(&b->mu);
}

bool cerb__serve_bucket_take(struct cerb__serve_bucket *b, int rate, int burst,
                             int64_t now_ns, unsigned *retry_after_s)
{
    double cap, need;
    bool ok;

    if (rate <= 0)
        return true;
    cap = burst > 0 ? burst : rate;
    if (pthread_mutex_lock(&b->mu) != 0)
        abort();
    if (b->tokens < 0) {
        b->tokens = cap;
    } else if (now_ns > b->last_ns) {
        b->tokens += (double)(now_ns - b->last_ns) / 1e9 * rate;
    }
    if (b->tokens > cap)
        b->tokens = cap;
    b->last_ns = now_ns;
    ok = b->tokens >= 1.0;
    if (ok) {
        b->tokens -= 1.0;
    } else {
        need = (1.0 - b->tokens) / rate;
        *retry_after_s = (unsigned)need + ((double)(unsigned)need < need); /* ceil */
        if (*retry_after_s < 1)
            *retry_after_s = 1;
    }
    if (pthread_mutex_unlock(&b->mu) != 0)
        abort();
    return ok;
}

enum MHD_Result cerb__serve_reply_rate_limited(struct MHD_Connection *conn,
                                               unsigned retry_after_s)
{
    struct MHD_Response *r;
    enum MHD_Result ret;
    char secs[16], why[128];
    json_t *body;
    char *text;
    size_t len;

    snprintf(why, sizeof why, "too many requests on this socket: retry after %u s",
             retry_after_s);
    body = json_pack("{s:s, s:s}", "status", "RATE_LIMITED", "error", why);
    text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return MHD_NO;
    len = strlen(text);
    text[len] = '\n'; /* json_dumps' NUL becomes the line's end */
    r = MHD_create_response_from_buffer(len + 1, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    snprintf(secs, sizeof secs, "%u", retry_after_s);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, secs);
    ret = MHD_queue_response(conn, MHD_HTTP_TOO_MANY_REQUESTS, r);
    MHD_destroy_response(r);
    return ret;
}
