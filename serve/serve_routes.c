/*
 * serve_routes.c — the /v1 routes of `cerberus serve` (DESIGN.md §15):
 *
 *   GET    /healthz                     {"ok": true}
 *   POST   /v1/locks/{name}/acquire     {"wait_ms", "lease_ms"} →
 *                                       {"hold", "fencing_token", "engine"}
 *   DELETE /v1/holds/{hold}             {"released": true}
 *   POST   /v1/holds/{hold}/keepalive   {"ok": true}
 *   GET    /v1/holds/{hold}/events      text/event-stream (serve_events.c)
 *   GET    /v1/status                   engines, breakers (serve_inspect.c)
 *   GET    /v1/locks/{name}             holders and waiters (serve_inspect.c)
 *
 * A hold whose caller neither releases it nor keeps it alive within its
 * lease_ms (10 s when not given) is released by serve_expiry.c.
 *
 * Each handler parses, calls the library, formats: no state of its own
 * beyond the hold table. An acquisition makes a lock handle for the name,
 * acquires a hold object through it (cerb_lock_acquire) and frees the
 * handle at once; the hold then belongs to the server, and any request can
 * release it. The acquisition runs with a cancel the server fires when it
 * stops (503 INTERRUPTED), so a stop never waits out a caller's wait_ms. The fencing token is a decimal string, since tokens above
 * 2^53 are not safe integers in JavaScript.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "serve_internal.h"

#define LOCKS_PREFIX "/v1/locks/"
#define HOLDS_PREFIX "/v1/holds/"
#define ACQUIRE_SUFFIX "/acquire"
#define KEEPALIVE_SUFFIX "/keepalive"
#define EVENTS_SUFFIX "/events"

/* The longest wait a request may ask for: an hour. */
#define MAX_WAIT_MS 3600000

/* The part of @url between @prefix and @suffix, copied to @out (@cap
 * bytes), or false when @url is not of that shape or the part is empty. */
static bool url_part(const char *url, const char *prefix, const char *suffix, char *out,
                     size_t cap)
{
    size_t pl = strlen(prefix), sl = strlen(suffix), ul = strlen(url), n;

    if (ul < pl + sl || strncmp(url, prefix, pl) != 0 ||
        strcmp(url + ul - sl, suffix) != 0)
        return false;
    n = ul - pl - sl;
    if (n == 0 || n >= cap)
        return false;
    memcpy(out, url + pl, n);
    out[n] = '\0';
    return true;
}

/* Reads optional integer member @key of @obj into *v (left alone when
 * absent); false when present but not an integer in [min, max]. */
static bool get_ms(json_t *obj, const char *key, json_int_t min, json_int_t max, int64_t *v)
{
    json_t *m = json_object_get(obj, key);

    if (!m)
        return true;
    if (!json_is_integer(m) || json_integer_value(m) < min || json_integer_value(m) > max)
        return false;
    *v = (int64_t)json_integer_value(m);
    return true;
}

static enum MHD_Result bad_request(struct MHD_Connection *conn, const char *why)
{
    return cerb__serve_reply_error(conn, CERB_EINVAL, why);
}

static enum MHD_Result acquire(struct cerb__serve *s, struct MHD_Connection *conn,
                               const char *name, const char *body, size_t len)
{
    cerb_lock_opts opts = CERB_LOCK_OPTS_INIT;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    int64_t wait_ms = 0;
    cerb_lock *lk = NULL;
    cerb_hold *hold = NULL;
    cerb_cancel *cancel = NULL;
    cerb_status st;
    char id[CERB_SERVE_HOLD_ID_LEN + 1], why[512], token[24];
    const char *engine;

    if (len > 0) {
        json_error_t jerr;
        json_t *req = json_loadb(body, len, 0, &jerr);
        bool ok;
        if (!req || !json_is_object(req)) {
            snprintf(why, sizeof why, "body: %s", req ? "not a JSON object" : jerr.text);
            json_decref(req);
            return bad_request(conn, why);
        }
        ok = get_ms(req, "wait_ms", 0, MAX_WAIT_MS, &wait_ms) &&
             get_ms(req, "lease_ms", 100, 86400000, &opts.lease_ms);
        json_decref(req);
        if (!ok)
            return bad_request(conn, "body: wait_ms must be an integer from 0 to 3600000, "
                                     "lease_ms one from 100 to 86400000");
    }
    st = cerb_lock_new(s->client, name, &opts, &lk);
    if (st != CERB_OK)
        return cerb__serve_reply_error(conn, st, cerb_last_error());
    /* A cancel of its own, fired when the server stops (serve_waits.c). */
    st = cerb_cancel_new(&cancel);
    if (st == CERB_OK) {
        st = cerb__serve_waits_add(&s->waits, cancel, fd);
        if (st == CERB_OK) {
            st = cerb_lock_acquire(lk, wait_ms, cancel, &hold);
            cerb__serve_waits_remove(&s->waits, cancel);
            snprintf(why, sizeof why, "%s", cerb_cancel_error(cancel));
        } else {
            snprintf(why, sizeof why, "%s", st == CERB_UNAVAILABLE
                                                ? "the server is stopping"
                                                : "out of memory");
        }
        cerb_cancel_free(cancel);
    } else {
        snprintf(why, sizeof why, "%s", cerb_last_error());
    }
    cerb_lock_free(lk); /* allowed once the acquisition returned */
    if (st != CERB_OK)
        return cerb__serve_reply_error(conn, st, why);
    /* A caller that went away while it waited gets no hold: one kept
     * would keep the name from everyone for its window. */
    if (cerb__serve_hung_up(fd)) {
        cerb_hold_free(hold); /* releases it first */
        return MHD_NO;
    }
    /* Read before the hold is published: from then on the expiry thread
     * may release and free it. */
    snprintf(token, sizeof token, "%" PRIu64, cerb_hold_fencing_token(hold));
    st = cerb__serve_holds_add(&s->holds, hold,
                               opts.lease_ms ? opts.lease_ms : CERB_SERVE_DEFAULT_WINDOW_MS, id);
    if (st != CERB_OK) {
        cerb_hold_free(hold);
        return cerb__serve_reply_error(conn, st, "cannot record the hold");
    }
    /* TODO: the engine the hold was granted on, once the library says;
     * the current engine is that one unless a switch came in between. */
    engine = cerb_engine_current(s->client);
    return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                  json_pack("{s:s, s:s, s:s}", "hold", id,
                                            "fencing_token", token, "engine",
                                            engine ? engine : ""));
}

static enum MHD_Result unknown_hold(struct MHD_Connection *conn, const char *id)
{
    char why[128];
    snprintf(why, sizeof why, "no hold \"%.40s\"", id);
    return cerb__serve_reply_error(conn, CERB_NOT_OWNER, why);
}

/* A keepalive for a lost hold answers 410 LOST and drops it: a 200 would
 * tell the caller it still holds a name that may be another's now. */
static enum MHD_Result keepalive(struct cerb__serve *s, struct MHD_Connection *conn,
                                 const char *id)
{
    cerb_hold *lost = NULL;
    cerb_status st = cerb__serve_holds_touch(&s->holds, id, &lost);

    if (st == CERB_NOT_OWNER)
        return unknown_hold(conn, id);
    if (st == CERB_LOST) {
        cerb_hold_free(lost); /* nothing to release on the server */
        return cerb__serve_reply_error(conn, CERB_LOST,
                                       "the hold was lost (its lease could not be renewed "
                                       "in time); the name may be another's now");
    }
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
}

static enum MHD_Result release(struct cerb__serve *s, struct MHD_Connection *conn,
                               const char *id)
{
    cerb_hold *hold = cerb__serve_holds_take(&s->holds, id);
    cerb_status st;
    char why[512];

    if (!hold)
        return unknown_hold(conn, id);
    st = cerb_hold_release(hold);
    if (st != CERB_OK)
        snprintf(why, sizeof why, "%s", cerb_hold_error(hold));
    cerb_hold_free(hold);
    if (st != CERB_OK)
        return cerb__serve_reply_error(conn, st, why);
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, json_pack("{s:b}", "released", 1));
}

enum MHD_Result cerb__serve_route(struct cerb__serve *s, struct MHD_Connection *conn,
                                  const char *method, const char *url,
                                  const char *body, size_t len)
{
    char part[1024]; /* longer than any name, so the library judges the name */
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    bool del = strcmp(method, MHD_HTTP_METHOD_DELETE) == 0;

    if (cerb__serve_dapr_path(url)) /* Dapr's lock API (serve_dapr.c) */
        return cerb__serve_dapr_route(s, conn, method, url, body, len);
    if (get && strcmp(url, "/healthz") == 0)
        return cerb__serve_reply_json(conn, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
    if (get && strcmp(url, "/v1/status") == 0)
        return cerb__serve_status(s, conn);
    if (get && url_part(url, LOCKS_PREFIX, "", part, sizeof part) && !strchr(part, '/'))
        return cerb__serve_inspect(s, conn, part);
    if (post && url_part(url, LOCKS_PREFIX, ACQUIRE_SUFFIX, part, sizeof part))
        return acquire(s, conn, part, body, len);
    if (post && url_part(url, HOLDS_PREFIX, KEEPALIVE_SUFFIX, part, sizeof part))
        return keepalive(s, conn, part);
    if (get && url_part(url, HOLDS_PREFIX, EVENTS_SUFFIX, part, sizeof part))
        return cerb__serve_events(&s->holds, conn, part);
    if (del && url_part(url, HOLDS_PREFIX, "", part, sizeof part) && !strchr(part, '/'))
        return release(s, conn, part);
    return cerb__serve_reply_json(conn, MHD_HTTP_NOT_FOUND,
                                  json_pack("{s:s, s:s}", "status", "EINVAL", "error",
                                            "no such route"));
}
