/*
 * serve_routes.c — the /v1 routes of `cerberus serve` (DESIGN.md §15):
 *
 *   GET    /healthz                     {"ok": true}
 *   GET    /metrics                     Prometheus text (serve_metrics.c)
 *   POST   /v1/locks/{name}/acquire     {"wait_ms", "lease_ms"} →
 *                                       {"hold", "fencing_token", "engine"}
 *   DELETE /v1/holds/{hold}             {"released": true}
 *   POST   /v1/holds/{hold}/keepalive   {"ok": true}
 *   GET    /v1/holds/{hold}/events      text/event-stream (serve_events.c)
 *   GET    /v1/status                   engines, breakers (serve_inspect.c)
 *   GET    /v1/locks/{name}             holders and waiters (serve_inspect.c)
 *   POST   /v1/switch                   {"engine"} → {"from", "to"}
 *   POST   /v1/guard/{scope}/{key}/begin, .../finish,
 *          /v1/guard/attempts/{id}/keepalive   the guard (serve_guard.c)
 *   /v1.0-alpha1/..., /v1.0/...     Dapr's lock API (serve_dapr.c)
 *
 * serve_parse.c matches the route and reads the path's parts and the body
 * (a bad body is 400 before the library is called, so nothing changes).
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

static enum MHD_Result acquire(struct cerb__serve *s, struct MHD_Connection *conn,
                               const struct cerb__serve_req *rq)
{
    cerb_lock_opts opts = CERB_LOCK_OPTS_INIT;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    int64_t wait_ms = rq->wait_ms;
    const char *name = rq->part;
    cerb_lock *lk = NULL;
    cerb_hold *hold = NULL;
    cerb_cancel *cancel = NULL;
    cerb_status st;
    char id[CERB_SERVE_HOLD_ID_LEN + 1], why[512], token[24];
    const char *engine;
    int64_t valid_ms, window_ms;

    opts.lease_ms = rq->lease_ms;
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
    window_ms = opts.lease_ms ? opts.lease_ms : CERB_SERVE_DEFAULT_WINDOW_MS;
    /* Never beyond the window either: counted down by a silent caller. */
    valid_ms = cerb_hold_valid_ms(hold);
    if (valid_ms > window_ms)
        valid_ms = window_ms;
    st = cerb__serve_holds_add(&s->holds, hold, window_ms, id);
    if (st != CERB_OK) {
        cerb_hold_free(hold);
        return cerb__serve_reply_error(conn, st, "cannot record the hold");
    }
    /* TODO: the engine the hold was granted on, once the library says;
     * the current engine is that one unless a switch came in between. */
    engine = cerb_engine_current(s->client);
    return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                  json_pack("{s:s, s:s, s:s, s:I, s:I}", "hold", id,
                                            "fencing_token", token, "engine",
                                            engine ? engine : "", "valid_ms",
                                            (json_int_t)valid_ms, "window_ms",
                                            (json_int_t)window_ms));
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
    enum cerb_lock_state ls;
    int64_t valid_ms;
    cerb_status st = cerb__serve_holds_touch(&s->holds, id, &lost, &ls, &valid_ms);

    if (st == CERB_NOT_OWNER)
        return unknown_hold(conn, id);
    if (st == CERB_LOST) {
        cerb_hold_free(lost); /* nothing to release on the server */
        return cerb__serve_reply_error(conn, CERB_LOST,
                                       "the hold was lost (its lease could not be renewed "
                                       "in time); the name may be another's now");
    }
    /* valid_ms: the caller counts down from when it sent this keepalive,
     * which makes its deadline never later than the library's. */
    return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                  json_pack("{s:b, s:s, s:I}", "ok", 1, "state",
                                            ls == CERB_LOCK_SUSPECT ? "suspect" : "valid",
                                            "valid_ms", (json_int_t)valid_ms));
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

/* POST /v1/switch: {"engine": NAME} switches to it (cerb_engine_switch_to,
 * "auto" included), no engine to the next one (cerb_engine_switch). */
static enum MHD_Result do_switch(struct cerb__serve *s, struct MHD_Connection *conn,
                                 const struct cerb__serve_req *rq)
{
    const char *cur = cerb_engine_current(s->client);
    char from[256], why[512];
    const char *to;

    snprintf(from, sizeof from, "%s", cur ? cur : "");
    to = rq->engine ? cerb_engine_switch_to(s->client, rq->engine)
                    : cerb_engine_switch(s->client);
    if (!to) {
        struct cerb_engine_info in;
        snprintf(why, sizeof why, "%s", cerb_last_error());
        /* A configured engine that would not open is unavailable; any
         * other name is not one of the configuration's. */
        return cerb__serve_reply_error(conn,
                                       rq->engine && strcmp(rq->engine, "auto") != 0 &&
                                               cerb_engine_info(s->client, rq->engine,
                                                                &in) == CERB_OK
                                           ? CERB_UNAVAILABLE
                                           : CERB_EINVAL,
                                       why);
    }
    return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                  json_pack("{s:s, s:s}", "from", from, "to", to));
}

static enum MHD_Result dispatch(struct cerb__serve *s, struct MHD_Connection *conn,
                                const struct cerb__serve_req *rq)
{
    switch (rq->rt) {
    case CERB_SERVE_RT_HEALTHZ:
        return cerb__serve_reply_json(conn, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
    case CERB_SERVE_RT_METRICS:
        return cerb__serve_metrics(s, conn);
    case CERB_SERVE_RT_STATUS:
        return cerb__serve_status(s, conn);
    case CERB_SERVE_RT_SWITCH:
        return do_switch(s, conn, rq);
    case CERB_SERVE_RT_LOCK_INSPECT:
        return cerb__serve_inspect(s, conn, rq->part);
    case CERB_SERVE_RT_LOCK_ACQUIRE:
        return acquire(s, conn, rq);
    case CERB_SERVE_RT_HOLD_RELEASE:
        return release(s, conn, rq->part);
    case CERB_SERVE_RT_HOLD_KEEPALIVE:
        return keepalive(s, conn, rq->part);
    case CERB_SERVE_RT_HOLD_EVENTS:
        return cerb__serve_events(&s->holds, conn, rq->part);
    case CERB_SERVE_RT_GUARD_BEGIN:
        return cerb__serve_guard_begin(s, conn, rq);
    case CERB_SERVE_RT_GUARD_FINISH:
        return cerb__serve_guard_finish(s, conn, rq);
    case CERB_SERVE_RT_GUARD_KEEPALIVE:
        return cerb__serve_guard_keepalive(s, conn, rq->part);
    case CERB_SERVE_RT_NONE:
    case CERB_SERVE_RT_DAPR: /* cerb__serve_route sends those on first */
    case CERB_SERVE_RT_COUNT:
        break;
    }
    return cerb__serve_reply_json(conn, MHD_HTTP_NOT_FOUND,
                                  json_pack("{s:s, s:s}", "status", "EINVAL", "error",
                                            "no such route"));
}

enum MHD_Result cerb__serve_route(struct cerb__serve *s, struct MHD_Connection *conn,
                                  const char *method, const char *url,
                                  const char *body, size_t len)
{
    struct cerb__serve_req rq;
    char why[512];
    cerb_status st;
    enum MHD_Result ret;

    if (cerb__serve_dapr_path(url)) { /* Dapr's lock API (serve_dapr.c) */
        cerb__serve_metrics_enter(CERB_SERVE_RT_DAPR);
        ret = cerb__serve_dapr_route(s, conn, method, url, body, len);
        cerb__serve_metrics_leave(ret);
        return ret;
    }
    st = cerb__serve_parse(method, url, body, len, &rq, why, sizeof why);
    cerb__serve_metrics_enter(rq.rt);
    if (st != CERB_OK)
        ret = cerb__serve_reply_error(conn, st, why);
    else if (rq.rt == CERB_SERVE_RT_NONE && rq.allow[0]) /* another method would do */
        ret = cerb__serve_reply_method(conn, method, rq.allow);
    else
        ret = dispatch(s, conn, &rq);
    cerb__serve_metrics_leave(ret);
    cerb__serve_req_free(&rq);
    return ret;
}
