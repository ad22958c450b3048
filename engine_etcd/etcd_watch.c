/*
 * etcd_watch.c — a waiter's watch on the key just ahead of it (or, for a
 * semaphore's waiter, on its queue's range, judged by the waiter's own
 * arithmetic: cerb__etcd_watch_range, etcd_queue.c).
 *
 * One POST /v3/watch per wait, on a connection of its own: the gateway
 * turns the request body into the stream's single create request and then
 * answers with newline-delimited JSON messages for as long as the
 * connection lives (several requests on one chunked body do not work over
 * HTTP/1.1, so a watch is never shared). The create request filters PUT
 * events out, so the stream says "created" and then, at most, the DELETE
 * we wait for. Other messages end the wait early and send the waiter back
 * to read: a cancel (the token refused — then we fetch a new one), an
 * in-band {"error": ...}, or the end of the stream (the member went away:
 * rotate).
 *
 * Which revision to watch from. The waiter must see every DELETE after its
 * read (at revision R). Asking for start_revision R + 1 says exactly that,
 * but etcd puts a watcher whose start revision is not in the future into
 * its "unsynced" group, served by a loop that runs every 100 ms; and the
 * revision is global, so on a busy server any write by anyone between our
 * read and the watch's creation makes R + 1 the past (measured: hand-off
 * p90 13 ms and p99 80 ms with 8 contenders; starting at R itself, the
 * usual way, costs ~90 ms every time). So the watch starts "now"
 * (start_revision left out: always synced, events after the creation
 * revision X), and when X > R a single read of the key closes the gap
 * (R, X]: gone, or re-created under another create revision, means the
 * DELETE already happened.
 *
 * The transfer is driven by a curl multi handle in slices of at most
 * ETCD_SLICE_MS, so the waiter looks at its interrupt flag, its deadline
 * and the session generation several times a second, and cancel() wakes it
 * at once with curl_multi_wakeup() — thread-safe and non-blocking, so
 * cerb_lock_interrupt() never waits for the network. The multi handle is
 * published in lk->priv under e->wait_mu while it exists. The progress
 * callback (CURLOPT_XFERINFOFUNCTION) checks the same flags inside curl, so
 * a transfer that keeps curl busy is stopped too. Leaving a watch (event,
 * flag, deadline) removes the easy handle from the multi handle mid-stream,
 * which closes that connection and with it the watch on the server.
 */
#include "internal_posix.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

struct watch_ctx {
    cerb_engine *e;
    struct etcd_lock_priv *p;
    const atomic_int *intr;
    char *line;          /* bytes of an unfinished line */
    size_t len, cap;
    bool created;
    int64_t created_rev; /* header revision of the "created" message */
    bool done;           /* stop reading: see deleted / restart / failed */
    bool deleted;
    bool restart;        /* the server ended the watch: read again */
    bool reauth;         /* ... because the token was refused */
    bool failed;         /* an in-band error or an unreadable line */
    int code;            /* gRPC code of the failure, -1 = none */
    char msg[256];
    const struct etcd_watch_range *range; /* range mode (NULL: one key) */
};

static void range_deleted(void *ud, const char *key, size_t n)
{
    struct watch_ctx *w = ud;
    if (w->range->deleted(w->range->ud, key, n))
        w->deleted = w->done = true;
}

static void handle_line(struct watch_ctx *w, const char *line, size_t len)
{
    struct etcd_watch_msg m;

    if (len == 0 || w->done)
        return;
    if (cerb__etcd_parse_watch_line(line, len, &m) != CERB_OK) {
        w->failed = w->done = true;
        w->code = -1;
        cerb__error_copy(w->msg, sizeof w->msg);
        return;
    }
    if (m.is_error) {
        w->failed = w->done = true;
        w->code = m.code;
        snprintf(w->msg, sizeof w->msg, "%s", m.message);
        return;
    }
    if (m.created && !w->created) {
        w->created = true;
        w->created_rev = m.header_rev;
    }
    if (m.canceled) {
        /* A watch refused at creation says why in cancel_reason, e.g.
         * "rpc error: code = Unauthenticated desc = ...". */
        if (strstr(m.cancel_reason, "Unauthenticated") || strstr(m.cancel_reason, "auth token")) {
            w->reauth = true;
        } else if (strstr(m.cancel_reason, "PermissionDenied") ||
                   strstr(m.cancel_reason, "permission denied")) {
            w->failed = true;
            w->code = 7;
            snprintf(w->msg, sizeof w->msg, "%s", m.cancel_reason);
        }
        if (m.compact_revision > 0)
            CERB_LOG_D("etcd: watch start revision compacted (now %lld)",
                       (long long)m.compact_revision);
        w->restart = w->done = true;
        return;
    }
    if (m.n_delete > 0 && !w->range) {
        w->deleted = w->done = true;
    } else if (m.n_delete > 0) {
        /* Range mode: only a delete that may bring the waiter's turn ends
         * the watch; the others were counted by the callback. */
        if (cerb__etcd_watch_line_deletes(line, len, range_deleted, w) != CERB_OK) {
            w->failed = w->done = true;
            w->code = -1;
            cerb__error_copy(w->msg, sizeof w->msg);
        }
    }
}

static size_t on_stream(char *data, size_t size, size_t n, void *ud)
{
    struct watch_ctx *w = ud;
    size_t k = size * n;
    size_t at = 0;

    /* Whole lines straight from curl's buffer; only a tail is copied. */
    while (at < k) {
        const char *nl = memchr(data + at, '\n', k - at);
        size_t seg = nl ? (size_t)(nl - (data + at)) : k - at;
        if (w->len + seg + 1 > w->cap) {
            if (w->len + seg + 1 > ETCD_MAX_BODY)
                return 0;
            size_t cap = w->cap ? w->cap : 512;
            while (cap < w->len + seg + 1)
                cap *= 2;
            char *nb = cerb__realloc(w->line, cap);
            if (!nb)
                return 0;
            w->line = nb;
            w->cap = cap;
        }
        if (!nl) {
            memcpy(w->line + w->len, data + at, seg);
            w->len += seg;
            break;
        }
        if (w->len == 0) {
            handle_line(w, data + at, seg);
        } else {
            memcpy(w->line + w->len, data + at, seg);
            handle_line(w, w->line, w->len + seg);
            w->len = 0;
        }
        at += seg + 1;
    }
    return k;
}

static bool flagged(struct watch_ctx *w)
{
    if (w->intr && atomic_load(w->intr))
        return true;
    cerb__mutex_lock(&w->e->wait_mu);
    bool c = w->p->cancelled;
    cerb__mutex_unlock(&w->e->wait_mu);
    return c;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    return flagged(ud) ? 1 : 0;
}

/* The request body: {"create_request": {key, [range_end,] filters: [NOPUT]}}. */
static char *create_body(const char *key, size_t len, const struct etcd_watch_range *r)
{
    json_t *cr = json_pack("{s:o, s:[s]}", "key", cerb__etcd_json_bytes(key, len), "filters",
                           "NOPUT");
    if (cr && r &&
        json_object_set_new(cr, "range_end", cerb__etcd_json_bytes(r->end, r->end_len)) != 0) {
        json_decref(cr);
        cr = NULL;
    }
    json_t *req = cr ? json_pack("{s:o}", "create_request", cr) : NULL;
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return body;
}

/*
 * After a watch came up at revision X > R: does `key` still exist with
 * create revision key_rev? 1 yes, 0 no (deleted meanwhile), -1 unknown.
 */
static int still_there(cerb_engine *e, const char *key, size_t len, int64_t key_rev)
{
    struct etcd_range_req r = {.key = key, .key_len = len, .keys_only = true};
    struct etcd_range_res rr = {0};
    json_t *req = cerb__etcd_range_json(&r);
    if (!req)
        return -1;
    struct etcd_call call = {.what = "watch check",
                             .path = "/v3/kv/range",
                             .body = req,
                             .deadline_ns = cerb__deadline_in(e->ec->op_timeout_ms),
                             .idempotent = true};
    cerb_status st = cerb__etcd_call(e, &call);
    json_decref(req);
    if (st != CERB_OK)
        return -1;
    st = cerb__etcd_parse_range(call.resp, &rr);
    json_decref(call.resp);
    int there = st != CERB_OK ? -1 : (rr.n_kvs > 0 && rr.first.create_revision == key_rev);
    cerb__etcd_kv_clear(&rr.first);
    return there;
}

static cerb_status watch(cerb_engine *e, cerb_engine_lock *lk, const char *key, size_t len,
                         int64_t key_rev, const struct etcd_watch_range *range,
                         int64_t read_rev, int64_t until_ns, const atomic_int *interrupted,
                         uint64_t gen, enum etcd_watch_end *end)
{
    struct etcd_lock_priv *p = lk->priv;
    struct watch_ctx w = {.e = e, .p = p, .intr = interrupted, .code = -1, .range = range};
    struct etcd_conn *c = NULL;
    CURLM *multi = NULL;
    cerb_status st;
    unsigned idx = atomic_load(&e->http.cur) % (unsigned)e->http.n_ep;
    const char *where = e->http.ep[idx];
    int64_t created_by = cerb__deadline_in(e->ec->connect_timeout_ms + e->ec->op_timeout_ms);
    CURLcode done_rc = CURLE_OK;
    bool ended = false;

    *end = ETCD_WATCH_EXPIRED;
    bool checked = false;
    char *body = create_body(key, len, range);
    if (!body)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a watch");
    st = cerb__etcd_conn_get(e, &c);
    if (st == CERB_OK)
        st = cerb__etcd_conn_prepare(e, c, idx, "/v3/watch", body, true, 0);
    if (st == CERB_OK) {
        curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_stream);
        curl_easy_setopt(c->h, CURLOPT_WRITEDATA, &w);
        curl_easy_setopt(c->h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c->h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c->h, CURLOPT_XFERINFODATA, &w);
        multi = curl_multi_init();
        if (!multi || curl_multi_add_handle(multi, c->h) != CURLM_OK)
            st = cerb__error_set(CERB_ENOMEM, "etcd: cannot set up a watch");
    }
    if (st != CERB_OK) {
        if (multi)
            curl_multi_cleanup(multi);
        if (c) {
            cerb__etcd_conn_restore(c);
            cerb__etcd_conn_put(e, c);
        }
        free(body);
        return st;
    }

    cerb__mutex_lock(&e->wait_mu);
    bool cancelled = p->cancelled;
    p->cancelled = false;
    p->multi = cancelled ? NULL : multi;
    cerb__mutex_unlock(&e->wait_mu);
    if (cancelled)
        *end = ETCD_WATCH_WAKE;
    else
        ETCD_COUNT(e, watches);

    while (!cancelled) {
        int running = 0;
        CURLMcode mc = curl_multi_perform(multi, &running);
        if (mc != CURLM_OK) {
            st = cerb__error_set(CERB_EIO, "etcd %s: watch: %s", where, curl_multi_strerror(mc));
            break;
        }
        if (w.done)
            break;
        if (w.created && !checked) {
            checked = true;
            if (w.created_rev > read_rev && range) {
                /* Range mode: the caller reads what it waits for. */
                ETCD_COUNT(e, watch_checks);
                int g = range->gap(range->ud);
                if (g != 0) {
                    *end = g > 0 ? ETCD_WATCH_DELETED : ETCD_WATCH_RESTART;
                    break;
                }
            } else if (w.created_rev > read_rev) {
                ETCD_COUNT(e, watch_checks);
                int there = still_there(e, key, len, key_rev);
                if (there <= 0) {
                    *end = there == 0 ? ETCD_WATCH_DELETED : ETCD_WATCH_RESTART;
                    break;
                }
            }
        }
        if (!running) {
            int q;
            CURLMsg *m;
            while ((m = curl_multi_info_read(multi, &q)))
                if (m->msg == CURLMSG_DONE)
                    done_rc = m->data.result;
            ended = true;
            break;
        }
        struct etcd_session s;
        cerb__etcd_session_peek(e, &s);
        if (flagged(&w) || s.gen != gen || !s.live) {
            cerb__mutex_lock(&e->wait_mu);
            p->cancelled = false;
            cerb__mutex_unlock(&e->wait_mu);
            *end = ETCD_WATCH_WAKE;
            break;
        }
        int64_t now = cerb_monotime();
        if (now >= until_ns) {
            *end = ETCD_WATCH_EXPIRED;
            break;
        }
        if (!w.created && now >= created_by) {
            struct etcd_failure f = {.what = "watch",
                                     .curl_code = CURLE_OPERATION_TIMEDOUT,
                                     .connected = true,
                                     .grpc_code = -1,
                                     .timeout_ms = e->ec->connect_timeout_ms +
                                                   e->ec->op_timeout_ms};
            enum etcd_action act;
            st = cerb__etcd_fail(where, &f, NULL, &act);
            cerb__error_prefix("no \"created\" from the server");
            cerb__etcd_rotate(e, idx);
            break;
        }
        int64_t slice = cerb__ms_left(until_ns);
        if (slice > ETCD_SLICE_MS)
            slice = ETCD_SLICE_MS;
        curl_multi_poll(multi, NULL, 0, (int)(slice > 0 ? slice : 1), NULL);
    }

    cerb__mutex_lock(&e->wait_mu);
    p->multi = NULL;
    cerb__mutex_unlock(&e->wait_mu);
    curl_multi_remove_handle(multi, c->h);
    curl_multi_cleanup(multi);

    if (st == CERB_OK && w.done) {
        if (w.failed) {
            struct etcd_failure f = {.what = "watch", .grpc_code = w.code, .message = w.msg};
            enum etcd_action act;
            if (w.code < 0)
                f.bad_body = true;
            st = cerb__etcd_fail(where, &f, NULL, &act);
            if (act == ETCD_ACT_ROTATE)
                cerb__etcd_rotate(e, idx);
        } else if (w.reauth) {
            uint64_t seen = c->hdr_auth_gen;
            st = cerb__etcd_authenticate(e, cerb__deadline_in(e->ec->op_timeout_ms), seen);
            *end = ETCD_WATCH_RESTART;
        } else if (w.deleted) {
            *end = ETCD_WATCH_DELETED;
        } else {
            *end = ETCD_WATCH_RESTART;
        }
    } else if (st == CERB_OK && ended) {
        /* The stream ended: the member closed it or went away. */
        struct etcd_failure f = {.what = "watch", .grpc_code = -1};
        enum etcd_action act = ETCD_ACT_ROTATE;
        if (done_rc != CURLE_OK) {
            f.curl_code = (int)done_rc;
            f.curl_msg = c->err;
            f.connected = cerb__etcd_conn_connected(c);
            st = cerb__etcd_fail(where, &f, NULL, &act);
        } else {
            long status = 0;
            curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
            f.http_status = status;
            f.message = "the server ended the watch stream";
            st = cerb__etcd_fail(where, &f, NULL, &act);
            act = ETCD_ACT_ROTATE;
        }
        if (act == ETCD_ACT_ROTATE)
            cerb__etcd_rotate(e, idx);
    }
    cerb__etcd_conn_restore(c);
    cerb__etcd_conn_put(e, c);
    cerb__free(w.line);
    free(body);
    return st;
}

cerb_status cerb__etcd_watch_delete(cerb_engine *e, cerb_engine_lock *lk, const char *key,
                                    size_t len, int64_t key_rev, int64_t read_rev,
                                    int64_t until_ns, const atomic_int *interrupted,
                                    uint64_t gen, enum etcd_watch_end *end)
{
    return watch(e, lk, key, len, key_rev, NULL, read_rev, until_ns, interrupted, gen, end);
}

cerb_status cerb__etcd_watch_range(cerb_engine *e, cerb_engine_lock *lk, const char *key,
                                   size_t len, const struct etcd_watch_range *wr,
                                   int64_t read_rev, int64_t until_ns,
                                   const atomic_int *interrupted, uint64_t gen,
                                   enum etcd_watch_end *end)
{
    return watch(e, lk, key, len, 0, wr, read_rev, until_ns, interrupted, gen, end);
}
