/*
 * serve_events.c — GET /v1/holds/{hold}/events: a server-sent-events
 * stream (text/event-stream) for as long as the caller listens.
 *
 * The answer is made with MHD_create_response_from_callback and no length,
 * so MHD sends it chunked and calls the reader below whenever it can send
 * more. MHD runs a thread per connection, so the reader may wait: it waits
 * on the hold table's condition (serve_holds.c), never past the deadline
 * of the next heartbeat, and returns one event at a time:
 *
 *   event: heartbeat   at once, then every heartbeat_ms (5 s), with data
 *                      {"hold", "state": "valid"|"suspect", "valid_ms"}
 *                      (cerb_hold_valid_ms as the heartbeat was made);
 *   event: lost        when the library reports the hold lost; the
 *                      stream then ends (the hold stays in the table:
 *                      DELETE answers 410 LOST);
 *   event: released    when the hold is released (DELETE, its window
 *                      passed, or the server's stop releases it); the
 *                      stream then ends.
 *
 * The other events' data is {"hold": ID}. Before each heartbeat the reader
 * looks whether the hold was lost, released or the server stops, so a
 * heartbeat never says "valid" for a hold that is not, and a stopping
 * server's callers hear `released` before the name goes. While a
 * stream is open the hold counts as kept alive (the expiry thread skips
 * it); when it closes, the caller has the hold's window from then on to
 * listen again or keep it alive. A caller that goes away must not keep the
 * hold for a heartbeat more (5 s, longer than many a lease): the reader
 * waits in slices of WATCH_MS and looks between them whether the caller
 * hung up (serve_waits.c's cerb__serve_hung_up on the connection's socket,
 * which reads nothing); it then ends the stream, and the hold has its
 * window from then on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve_internal.h"

/* How often a waiting stream looks whether its caller hung up. */
#define WATCH_MS 100

struct stream {
    struct cerb__serve_holds *t;
    char id[CERB_SERVE_HOLD_ID_LEN + 1];
    int64_t heartbeat_ns;      /* the period */
    int64_t next_heartbeat_ns; /* CLOCK_MONOTONIC */
    bool ended;                /* the last event was sent */
    int fd;                    /* the connection's socket (-1: unknown) */
};

static ssize_t event(struct stream *st, const char *what, char *buf, size_t max)
{
    int n = snprintf(buf, max, "event: %s\ndata: {\"hold\":\"%s\"}\n\n", what, st->id);
    return n < 0 || (size_t)n >= max ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

/* A heartbeat with the hold's state read now; `lost` (and the end) when it
 * reads LOST, `released` when the hold is gone. */
static ssize_t heartbeat(struct stream *st, char *buf, size_t max)
{
    enum cerb_lock_state ls;
    int64_t valid_ms;
    int n;

    if (!cerb__serve_holds_info(st->t, st->id, &ls, &valid_ms)) {
        st->ended = true;
        return event(st, "released", buf, max);
    }
    if (ls == CERB_LOCK_LOST) {
        st->ended = true;
        return event(st, "lost", buf, max);
    }
    n = snprintf(buf, max,
                 "event: heartbeat\ndata: {\"hold\":\"%s\",\"state\":\"%s\","
                 "\"valid_ms\":%lld}\n\n",
                 st->id, ls == CERB_LOCK_SUSPECT ? "suspect" : "valid", (long long)valid_ms);
    return n < 0 || (size_t)n >= max ? MHD_CONTENT_READER_END_WITH_ERROR : n;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;

    (void)pos;
    if (st->ended)
        return MHD_CONTENT_READER_END_OF_STREAM;
    for (;;) {
        /* Looks first (a deadline already passed returns at once), so
         * neither a heartbeat nor the wait hides a loss or a release. */
        int64_t now = cerb__serve_now_ns(), slice = now + (int64_t)WATCH_MS * 1000000;
        switch (cerb__serve_holds_wait(st->t, st->id, now >= st->next_heartbeat_ns ? now
                                                      : slice < st->next_heartbeat_ns
                                                          ? slice
                                                          : st->next_heartbeat_ns)) {
        case CERB_SERVE_EV_TIMEOUT:
            if (cerb__serve_now_ns() >= st->next_heartbeat_ns) {
                st->next_heartbeat_ns = cerb__serve_now_ns() + st->heartbeat_ns;
                return heartbeat(st, buf, max);
            }
            if (cerb__serve_hung_up(st->fd))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        case CERB_SERVE_EV_LOST:
            st->ended = true;
            return event(st, "lost", buf, max);
        case CERB_SERVE_EV_GONE:
        case CERB_SERVE_EV_STOP:
            /* The stop releases the holds after its streams end: say so
             * first, so the caller stops relying on the name now. */
            st->ended = true;
            return event(st, "released", buf, max);
        }
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls)
{
    struct stream *st = cls;

    cerb__serve_holds_unlisten(st->t, st->id);
    free(st);
}

enum MHD_Result cerb__serve_events(struct cerb__serve_holds *t,
                                   struct MHD_Connection *conn, const char *id)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct MHD_Response *r;
    struct stream *st;
    enum MHD_Result ret;
    char why[128];

    int64_t heartbeat_ms;

    if (strlen(id) != CERB_SERVE_HOLD_ID_LEN ||
        !cerb__serve_holds_listen(t, id, &heartbeat_ms)) {
        snprintf(why, sizeof why, "no hold \"%.40s\"", id);
        return cerb__serve_reply_error(conn, CERB_NOT_OWNER, why);
    }
    st = calloc(1, sizeof *st);
    if (!st) {
        cerb__serve_holds_unlisten(t, id);
        return MHD_NO;
    }
    st->t = t;
    st->fd = ci ? ci->connect_fd : -1;
    st->heartbeat_ns = heartbeat_ms * 1000000;
    memcpy(st->id, id, CERB_SERVE_HOLD_ID_LEN + 1);
    st->next_heartbeat_ns = cerb__serve_now_ns(); /* the first heartbeat at once */
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, reader, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r); /* MHD keeps it (and st) until the stream ends */
    return ret;
}
