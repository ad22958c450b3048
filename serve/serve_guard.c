/*
 * serve_guard.c — the idempotency guard over HTTP (cerb_guard_*, DESIGN.md
 * §11), for callers that cannot load the library:
 *
 *   POST /v1/guard/{scope}/{key}/begin
 *        {"running_ms", "keep_ms" (-1: forever), "on_unavailable":
 *        "refuse"|"allow"}, all optional →
 *        200 {"state": "run", "attempt": ID, "degraded": BOOL, "window_ms": N}
 *            run the operation, then finish; keep the attempt alive
 *            meanwhile (it is freed, = failed, after window_ms of silence);
 *        200 {"state": "duplicate", "result": TEXT} (or "result_base64"
 *            when the stored bytes are not UTF-8): it already succeeded;
 *        409 BUSY: another attempt runs (ask again after a pause);
 *        503 UNAVAILABLE: no engine can tell and the policy refuses.
 *   POST /v1/guard/{scope}/{key}/finish
 *        {"attempt": ID, "succeeded": BOOL, "result": TEXT |
 *        "result_base64": B64} →
 *        200 {"finished": true, "succeeded": BOOL};
 *        410 LOST: the claim was lost, nothing was stored;
 *        404 NOT_OWNER: no such attempt open (finished, expired, or begun
 *            for another scope or key);
 *        409 BUSY: a finish of this attempt is running now;
 *        400 EINVAL with "open": true: a result over guard.max_result —
 *            the attempt stays open: finish again;
 *        503 (the engine's status) with "open": true: a success the
 *            engine did not confirm — the attempt stays open, its claim
 *            renewed: finish again (a repeated finish of a success that
 *            did land answers 200); with "open": false: a failure's
 *            delete not confirmed — the library retries it, the attempt
 *            is gone.
 *   POST /v1/guard/attempts/{id}/keepalive →
 *        200 {"ok": true, "state": "valid"|"suspect"|"lost"|"free"}
 *        (cerb_guard_state: "lost" means another attempt may begin:
 *        stop if you can); 404 for no such attempt.
 *
 * The attempt handle (cerb_guard) belongs to the server, in the table
 * below, by a random id as holds are. The library renews the claim while
 * the handle is open, so a caller that died would keep others BUSY for
 * as long as the server runs; the expiry thread (serve_expiry.c) frees an
 * attempt nobody finished nor kept alive within its window — its
 * running_ms, or CERB_SERVE_DEFAULT_WINDOW_MS when not given — which
 * counts it as failed (the record is deleted: a retry may run), and the
 * server's stop frees those left. A handle is used by one thread at a
 * time: a finish marks its entry busy for the length of the call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "serve_internal.h"

static void entry_free(struct cerb__serve_attempt *a)
{
    cerb_guard_free(a->g); /* unfinished: failed, its record deleted */
    free(a->scope);
    free(a->key);
    free(a);
}

void cerb__serve_attempts_init(struct cerb__serve_attempts *t)
{
    if (pthread_mutex_init(&t->mu, NULL) != 0)
        abort();
    t->head = NULL;
    t->n = 0;
}

size_t cerb__serve_attempts_expire(struct cerb__serve_attempts *t)
{
    struct cerb__serve_attempt *gone = NULL;
    int64_t now = cerb__serve_now_ns();
    size_t n = 0;

    cerb__serve_lock(&t->mu);
    for (struct cerb__serve_attempt **p = &t->head; *p;) {
        struct cerb__serve_attempt *a = *p;
        if (!a->busy && now - a->last_seen_ns > a->window_ns) {
            *p = a->next;
            a->next = gone;
            gone = a;
            if (!a->done)
                t->n--;
        } else {
            p = &a->next;
        }
    }
    cerb__serve_unlock(&t->mu);
    while (gone) { /* the library is called without the table's mutex */
        struct cerb__serve_attempt *next = gone->next;
        entry_free(gone);
        gone = next;
        n++;
    }
    return n;
}

size_t cerb__serve_attempts_count(struct cerb__serve_attempts *t)
{
    size_t n;

    cerb__serve_lock(&t->mu);
    n = t->n;
    cerb__serve_unlock(&t->mu);
    return n;
}

void cerb__serve_attempts_destroy(struct cerb__serve_attempts *t)
{
    struct cerb__serve_attempt *a;

    cerb__serve_lock(&t->mu);
    a = t->head;
    t->head = NULL;
    t->n = 0;
    cerb__serve_unlock(&t->mu);
    while (a) {
        struct cerb__serve_attempt *next = a->next;
        entry_free(a);
        a = next;
    }
    if (pthread_mutex_destroy(&t->mu) != 0)
        abort();
}

/* Adds attempt @g of (@scope, @key) under a new id (written to @id). */
static cerb_status attempts_add(struct cerb__serve_attempts *t, cerb_guard *g,
                                const struct cerb__serve_req *rq, int64_t window_ms,
                                char id[CERB_SERVE_ID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[CERB_SERVE_ID_LEN / 2];
    struct cerb__serve_attempt *a;

    if (RAND_bytes(raw, (int)sizeof raw) != 1)
        return CERB_EIO;
    a = calloc(1, sizeof *a);
    if (!a || !(a->scope = strdup(rq->part)) || !(a->key = malloc(rq->key_len + 1))) {
        if (a)
            free(a->scope);
        free(a);
        return CERB_ENOMEM;
    }
    memcpy(a->key, rq->key, rq->key_len);
    a->key[rq->key_len] = '\0';
    a->key_len = rq->key_len;
    for (size_t i = 0; i < sizeof raw; i++) {
        a->id[2 * i] = hex[raw[i] >> 4];
        a->id[2 * i + 1] = hex[raw[i] & 15];
    }
    a->id[CERB_SERVE_ID_LEN] = '\0';
    a->g = g;
    a->last_seen_ns = cerb__serve_now_ns();
    a->window_ns = window_ms * 1000000;
    memcpy(id, a->id, sizeof a->id);
    cerb__serve_lock(&t->mu);
    a->next = t->head;
    t->head = a;
    t->n++;
    cerb__serve_unlock(&t->mu);
    return CERB_OK;
}

static struct cerb__serve_attempt *find(struct cerb__serve_attempts *t, const char *id)
{
    for (struct cerb__serve_attempt *a = t->head; a; a = a->next)
        if (strcmp(a->id, id) == 0)
            return a;
    return NULL;
}

/* Takes @a (busy, found earlier) out of the table. */
static void attempts_remove(struct cerb__serve_attempts *t, struct cerb__serve_attempt *a)
{
    cerb__serve_lock(&t->mu);
    for (struct cerb__serve_attempt **p = &t->head; *p; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            t->n--;
            break;
        }
    }
    cerb__serve_unlock(&t->mu);
}

static const char *state_name(enum cerb_lock_state st)
{
    switch (st) {
    case CERB_LOCK_VALID:
        return "valid";
    case CERB_LOCK_SUSPECT:
        return "suspect";
    case CERB_LOCK_LOST:
        return "lost";
    case CERB_LOCK_FREE:
        return "free";
    }
    return "unknown"; /* after the switch: -Wswitch names a new state */
}

/* The stored result as "result" (valid UTF-8: jansson checks) or, for any
 * other bytes, "result_base64". */
static cerb_status set_result(json_t *o, const char *p, size_t n)
{
    json_t *text = json_stringn(p ? p : "", p ? n : 0);
    unsigned char *b64;

    if (text)
        return json_object_set_new(o, "result", text) == 0 ? CERB_OK : CERB_ENOMEM;
    b64 = malloc(4 * ((n + 2) / 3) + 1);
    if (!b64)
        return CERB_ENOMEM;
    EVP_EncodeBlock(b64, (const unsigned char *)p, (int)n);
    if (json_object_set_new(o, "result_base64", json_string((char *)b64)) != 0) {
        free(b64);
        return CERB_ENOMEM;
    }
    free(b64);
    return CERB_OK;
}

enum MHD_Result cerb__serve_guard_begin(struct cerb__serve *s, struct MHD_Connection *conn,
                                        const struct cerb__serve_req *rq)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1, degraded;
    cerb_guard *g = NULL;
    cerb_cancel *cancel = NULL;
    char why[512], id[CERB_SERVE_ID_LEN + 1];
    int64_t window_ms =
        rq->guard.running_ms ? rq->guard.running_ms : CERB_SERVE_DEFAULT_WINDOW_MS;
    cerb_status st = cerb_cancel_new(&cancel);
    json_t *o;

    /* A cancel of its own, fired when the server stops (serve_waits.c). */
    if (st == CERB_OK) {
        /* Its caller's socket is watched: a begin whose caller hung up is
         * cancelled (its claim given up), not left to keep the key BUSY. */
        st = cerb__serve_waits_add(&s->waits, cancel, fd);
        if (st == CERB_OK) {
            st = cerb_guard_begin_ex(s->client, rq->part, rq->key, rq->key_len, &rq->guard,
                                     cancel, &g);
            snprintf(why, sizeof why, "%s",
                     cerb_last_error()[0] ? cerb_last_error() : cerb_cancel_error(cancel));
            cerb__serve_waits_remove(&s->waits, cancel);
        } else {
            snprintf(why, sizeof why, "%s", st == CERB_UNAVAILABLE ? "the server is stopping"
                                                                   : "out of memory");
        }
        cerb_cancel_free(cancel);
    } else {
        snprintf(why, sizeof why, "%s", cerb_last_error());
    }
    if (st == CERB_DUPLICATE) {
        size_t n = 0;
        const char *res = cerb_guard_result(g, &n);
        o = json_pack("{s:s}", "state", "duplicate");
        if (o && set_result(o, res, n) != CERB_OK) {
            json_decref(o);
            o = NULL;
        }
        cerb_guard_free(g);
        if (!o)
            return MHD_NO;
        return cerb__serve_reply_json(conn, MHD_HTTP_OK, o);
    }
    if (st != CERB_OK) {
        cerb_guard_free(g); /* NULL for every other answer */
        return cerb__serve_reply_error(conn, st, why);
    }
    /* A caller gone meanwhile would keep the key BUSY for the window. */
    if (cerb__serve_hung_up(fd)) {
        cerb_guard_free(g); /* as failed: a retry may run at once */
        return MHD_NO;
    }
    /* Read before the attempt is published: from then on the expiry
     * thread may free it. */
    degraded = cerb_guard_degraded(g);
    st = attempts_add(&s->holds.attempts, g, rq, window_ms, id);
    if (st != CERB_OK) {
        cerb_guard_free(g); /* failed: a retry may run */
        return cerb__serve_reply_error(conn, st, "cannot record the attempt");
    }
    return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                  json_pack("{s:s, s:s, s:b, s:I}", "state", "run",
                                            "attempt", id, "degraded", degraded, "window_ms",
                                            (json_int_t)window_ms));
}

static enum MHD_Result unknown_attempt(struct MHD_Connection *conn, const char *id,
                                       const char *more)
{
    char why[160];
    snprintf(why, sizeof why, "no attempt \"%.40s\"%s", id, more);
    return cerb__serve_reply_error(conn, CERB_NOT_OWNER, why);
}

enum MHD_Result cerb__serve_guard_finish(struct cerb__serve *s, struct MHD_Connection *conn,
                                         const struct cerb__serve_req *rq)
{
    struct cerb__serve_attempts *t = &s->holds.attempts;
    struct cerb__serve_attempt *a;
    cerb_status st;
    bool open;
    char why[512];

    cerb__serve_lock(&t->mu);
    a = find(t, rq->attempt);
    if (!a) {
        cerb__serve_unlock(&t->mu);
        return unknown_attempt(conn, rq->attempt, " open (finished, or freed after its "
                                                  "window)");
    }
    if (strcmp(a->scope, rq->part) != 0 || a->key_len != rq->key_len ||
        memcmp(a->key, rq->key, rq->key_len) != 0) {
        cerb__serve_unlock(&t->mu);
        return unknown_attempt(conn, rq->attempt, " for this scope and key");
    }
    if (a->done) {
        /* A finish repeated (its first answer was lost): the same answer. */
        bool ok = a->done_succeeded;
        cerb__serve_unlock(&t->mu);
        return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                      json_pack("{s:b, s:b, s:b}", "finished", 1, "succeeded",
                                                ok, "repeated", 1));
    }
    if (a->busy) {
        cerb__serve_unlock(&t->mu);
        return cerb__serve_reply_error(conn, CERB_BUSY, "a finish of this attempt is running");
    }
    a->busy = true;
    cerb__serve_unlock(&t->mu);

    st = cerb_guard_finish(a->g, rq->succeeded, rq->result, rq->result_len);
    snprintf(why, sizeof why, "%s", st == CERB_OK ? "" : cerb_last_error());
    /* Open after a result refused (EINVAL) or a success not confirmed;
     * done after a success, a loss, or a failure (its delete, if not
     * confirmed, is retried by the library). */
    open = st != CERB_OK && st != CERB_LOST && (st == CERB_EINVAL || rq->succeeded);
    if (open) {
        cerb__serve_lock(&t->mu);
        a->busy = false;
        a->last_seen_ns = cerb__serve_now_ns();
        cerb__serve_unlock(&t->mu);
    } else if (st == CERB_OK) {
        /* Done: the handle goes, the id stays for a window as a record of
         * the answer (keepalives of it are 404 from now on). */
        cerb_guard *g = a->g;
        cerb__serve_lock(&t->mu);
        a->g = NULL;
        a->done = true;
        a->done_succeeded = rq->succeeded;
        a->busy = false;
        a->last_seen_ns = cerb__serve_now_ns();
        t->n--;
        cerb__serve_unlock(&t->mu);
        cerb_guard_free(g);
    } else {
        attempts_remove(t, a);
        entry_free(a);
    }
    if (st == CERB_OK)
        return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                      json_pack("{s:b, s:b}", "finished", 1, "succeeded",
                                                rq->succeeded));
    return cerb__serve_reply_json(conn, cerb__serve_http_code(st),
                                  json_pack("{s:s, s:s, s:b}", "status",
                                            cerb_status_name(st), "error",
                                            why[0] ? why : cerb_strerror(st), "open", open));
}

enum MHD_Result cerb__serve_guard_keepalive(struct cerb__serve *s,
                                            struct MHD_Connection *conn, const char *id)
{
    struct cerb__serve_attempts *t = &s->holds.attempts;
    struct cerb__serve_attempt *a;
    enum cerb_lock_state ls = CERB_LOCK_FREE;
    int64_t window_ms = 0;

    cerb__serve_lock(&t->mu);
    a = find(t, id);
    if (a && a->done)
        a = NULL; /* finished: nothing to keep alive */
    if (a) {
        /* Never blocks, any thread: the handle is freed only once out of
         * the table, which this mutex prevents meanwhile. */
        ls = cerb_guard_state(a->g);
        /* A lost claim is not kept alive: a 200 would tell the caller to
         * go on with an operation another attempt may be running. */
        if (ls != CERB_LOCK_LOST)
            a->last_seen_ns = cerb__serve_now_ns();
        window_ms = a->window_ns / 1000000;
    }
    cerb__serve_unlock(&t->mu);
    if (!a)
        return unknown_attempt(conn, id, "");
    if (ls == CERB_LOCK_LOST)
        return cerb__serve_reply_json(
            conn, cerb__serve_http_code(CERB_LOST),
            json_pack("{s:s, s:s, s:b}", "status", "LOST", "error",
                      "the attempt's claim was lost: another attempt may run the operation; "
                      "its finish will answer LOST",
                      "open", 1));
    return cerb__serve_reply_json(conn, MHD_HTTP_OK,
                                  json_pack("{s:b, s:s, s:I}", "ok", 1, "state", state_name(ls),
                                            "window_ms", (json_int_t)window_ms));
}
