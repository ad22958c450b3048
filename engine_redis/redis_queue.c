/*
 * redis_queue.c — semaphores and read-write locks on Redis: engine.h's
 * cerb_queue_methods over a layout described by a struct redis_qkind
 * (redis_semaphore.c, redis_rwlock.c).
 *
 * Every step is one Lua script, atomic on the server, which takes the
 * primitive's keys (all in one cluster slot) and the data-loss marker
 * (redis_marker.h) and compares the marker first: a server that lost its
 * data answers "L", the instance learns the new marker (every hold is told
 * LOST) and an acquire asks once more under it, where the quarantine holds
 * back every grant. Release, renew and check find a member by its token;
 * a renewal or check of a member that is gone, expired or only waiting
 * answers "not owner".
 *
 * Waiting follows the mutex's waiters (redis_wait.c): one run of the
 * acquire script grants, or puts the token in the name's queue with an
 * alive deadline; the waiter then blocks in BLPOP on its own wake list,
 * woken once when its turn may have come (the script of whoever made room
 * pushes one "w"; a semaphore's pushes "f<fence>" when it granted the
 * waiter already, which then holds without another run), and re-runs
 * acquire on a timer too: the head of a
 * semaphore's queue every REDIS_HEAD_POLL_MS (npm peers release without a
 * word), every other waiter every REDIS_TAIL_POLL_MS to stay alive (and
 * sooner when a holder ahead of it expires sooner). The socket is polled in
 * slices of REDIS_INTR_SLICE_MS for the interrupt flag and the deadline,
 * and registered for cancel() (the mutex's). Giving up runs the release
 * script in leave mode; when that cannot be confirmed the outcome is
 * UNKNOWN and the entry lapses by its alive deadline.
 *
 * In cluster mode every operation is routed to the master of the base
 * key's slot (cerb__redis_cl_route); a wait cut by a redirect (the slot
 * migrating under it) ends there, and leaves as above.
 */
#include "internal_posix.h"

#include "redis_queue.h"
#include "redis_redlock.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_closure.h"
#include "redis_cluster.h"
#include "redis_marker.h"
#include "redis_replies.h"

#define BLPOP_TICK_MS 100

/* ---- keys ---- */

struct q_keys {
    struct redis_keys ks; /* B as ks.k[REDIS_K]; slot and marker key */
    int n;
    const char *k[REDIS_QK_MAX];
    size_t len[REDIS_QK_MAX];
    char *mem;
};

static void q_keys_free(struct q_keys *qk)
{
    cerb__redis_keys_free(&qk->ks);
    cerb__free(qk->mem);
    qk->mem = NULL;
}

/* B = prefix + infix + name: into buf (len bytes) or a new allocation. */
static char *base_name(const struct redis_qkind *k, const char *name, char *buf, size_t len)
{
    size_t il = strlen(k->infix), nl = strlen(name);
    char *p = il + nl + 1 <= len ? buf : cerb__malloc(il + nl + 1);
    if (!p)
        return NULL;
    memcpy(p, k->infix, il);
    memcpy(p + il, name, nl + 1);
    return p;
}

static cerb_status q_keys_init(const struct redis_qkind *k, cerb_engine *e, const char *name,
                               const char *token, struct q_keys *qk)
{
    char nb[300];
    char *bn = base_name(k, name, nb, sizeof nb);
    memset(qk, 0, sizeof *qk);
    if (!bn)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for key names");
    cerb_status st = cerb__redis_keys_init(&qk->ks, e, bn, token);
    if (bn != nb)
        cerb__free(bn);
    if (st != CERB_OK)
        return st;
    /* The helpers' common head: the fence key less its "fence". */
    size_t hb = qk->ks.len[REDIS_F] - 5, tl = strlen(token), need = 0;
    for (int i = 0; i < k->nkeys; i++)
        if (k->keys[i].sfx)
            need += hb + strlen(k->keys[i].sfx) + tl + 1;
    char *p = qk->mem = cerb__malloc(need ? need : 1);
    if (!p) {
        cerb__redis_keys_free(&qk->ks);
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for key names");
    }
    qk->n = k->nkeys;
    for (int i = 0; i < k->nkeys; i++) {
        switch (k->keys[i].what) {
        case REDIS_QK_BASE:
            qk->k[i] = qk->ks.k[REDIS_K];
            qk->len[i] = qk->ks.len[REDIS_K];
            break;
        case REDIS_QK_MARK:
            qk->k[i] = qk->ks.mk ? qk->ks.mk : e->marker_key;
            qk->len[i] = qk->ks.mk ? qk->ks.mk_len : e->marker_key_len;
            break;
        case REDIS_QK_HELPER:
        case REDIS_QK_WAKE: {
            size_t sl = strlen(k->keys[i].sfx);
            qk->k[i] = p;
            memcpy(p, qk->ks.k[REDIS_F], hb);
            memcpy(p + hb, k->keys[i].sfx, sl);
            size_t l = hb + sl;
            if (k->keys[i].what == REDIS_QK_WAKE) {
                memcpy(p + l, token, tl);
                l += tl;
            }
            p[l] = '\0';
            qk->len[i] = l;
            p += l + 1;
            break;
        }
        }
    }
    return CERB_OK;
}

/* The caller's wake list (the kind's REDIS_QK_WAKE key). */
static int wake_index(const struct redis_qkind *k)
{
    for (int i = 0; i < k->nkeys; i++)
        if (k->keys[i].what == REDIS_QK_WAKE)
            return i;
    return 0;
}

/* ---- running a script ---- */

#define NUM 24

/* Run script id with qk's keys and args (NUL-terminated strings) on c.
 * A reply that is not an error in *out. */
static cerb_status q_eval(cerb_engine *e, struct redis_conn *c, enum redis_script id,
                          const struct q_keys *qk, int nargs, const char *const *args,
                          int64_t *sent_ns, redisReply **out, cerb_outcome *oc)
{
    size_t alen[8];
    for (int i = 0; i < nargs; i++)
        alen[i] = strlen(args[i]);
    if (sent_ns)
        *sent_ns = cerb_monotime();
    return cerb__redis_eval_argv(e, c, id, qk->n, qk->k, qk->len, nargs, args, alen, out, oc);
}

static cerb_status bad(cerb_engine *e, const char *what, const redisReply *r, cerb_outcome *oc)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(e->where, what, &f, oc);
}

static const char *kind_name(const struct redis_qkind *k)
{
    return k->prim == CERB_PRIM_SEMAPHORE ? "semaphore" : "read-write lock";
}

/* What one run of acquire said. */
struct q_res {
    bool granted;
    uint64_t fence;
    int64_t hint;   /* ms until a holder ahead may expire, -1 unknown */
    bool head;
    bool quarantine;
};

static bool is_tagged(const redisReply *r, char tag)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
           r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len == 1 &&
           r->element[0]->str[0] == tag && r->element[1]->type == REDIS_REPLY_STRING;
}

/*
 * One run of the acquire script on c; wait_ms > 0 joins (or stays in) the
 * queue when not granted. Limit mismatch and closure refusals are final
 * errors with g->no_prim / g->closed_epoch set.
 */
static cerb_status run_acquire(const struct redis_qkind *k, cerb_engine *e, struct redis_conn *c,
                               struct q_keys *qk, const cerb_engine_lock *lk, int64_t wait_ms,
                               struct q_res *res, int64_t *sent_ns, cerb_grant *g)
{
    char cnt[NUM], lim[NUM], lease[NUM], wait[NUM], floor[NUM], epoch[NUM];
    struct redis_marker_view mv;
    if (wait_ms > INT64_C(100000000000))
        wait_ms = INT64_C(100000000000);
    if (k->prim == CERB_PRIM_SEMAPHORE)
        snprintf(cnt, sizeof cnt, "%u", lk->count);
    else
        snprintf(cnt, sizeof cnt, "%s", lk->variant == CERB_RW_WRITE ? "w" : "r");
    snprintf(lim, sizeof lim, "%lld", (long long)lk->limit);
    snprintf(lease, sizeof lease, "%lld", (long long)lk->lease_ms);
    snprintf(wait, sizeof wait, "%lld", (long long)wait_ms);
    snprintf(floor, sizeof floor, "%llu",
             (unsigned long long)(lk->fence_floor & ((UINT64_C(1) << 48) - 1)));
    snprintf(epoch, sizeof epoch, "%lld", (long long)(lk->epoch >= 0 ? lk->epoch : -1));
    const char *args[8] = {lk->token, cnt, lim, lease, wait, mv.value, floor, epoch};
    int nargs = qk->ks.mk || !e->closure_key ? 7 : 8;
    redisReply *r = NULL;
    cerb_status st;

    memset(res, 0, sizeof *res);
    res->hint = -1;
    for (int round = 0;; round++) {
        st = cerb__redis_marker_for(e, c, &qk->ks, &mv);
        if (st != CERB_OK)
            return st;
        REDIS_COUNT(e, acquire_calls);
        st = q_eval(e, c, k->acquire, qk, nargs, args, sent_ns, &r, &g->outcome);
        if (st != CERB_OK)
            return st;
        if (!cerb__redis_is_lost(r))
            break;
        freeReplyObject(r);
        if (round > 0)
            return cerb__error_set(CERB_EIO, "redis %s: acquire: the server keeps losing its "
                                   "data (marker changed twice)", e->where);
        g->outcome = CERB_OUTCOME_NO;
        st = cerb__redis_marker_lost(e, c, &qk->ks, &mv);
        if (st != CERB_OK)
            return st;
    }
    if (r->type == REDIS_REPLY_INTEGER && r->integer > 0) {
        res->granted = true;
        res->fence = (uint64_t)r->integer;
    } else if (is_tagged(r, 'E')) {
        g->outcome = CERB_OUTCOME_NO;
        g->no_prim = 1;
        st = cerb__error_set(CERB_ECONFIG, "semaphore \"%s\": the engine has a limit of %s "
                             "stored, this caller asks %lld (redis %s)",
                             lk->name, r->element[1]->str, (long long)lk->limit, e->where);
    } else if (is_tagged(r, 'C')) {
        cerb_closure cl = {0, 0};
        g->outcome = CERB_OUTCOME_NO;
        if (!cerb__redis_closure_parse(r->element[1]->str, r->element[1]->len, &cl)) {
            st = cerb__error_set(CERB_EPROTO, "redis %s: the closure record is not \"<epoch> "
                                 "closed|open\": nothing is granted until a switch writes it "
                                 "again", e->where);
        } else {
            g->closed_epoch = cl.epoch;
            st = cerb__error_set(CERB_UNAVAILABLE, "redis %s: %s \"%s\": %s by a switch at "
                                 "epoch %lld; this client is at epoch %lld: reload the "
                                 "configuration", e->where, kind_name(k), lk->name,
                                 cl.closed ? "closed" : "opened", (long long)cl.epoch,
                                 (long long)lk->epoch);
        }
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 4 &&
               r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer == 0 &&
               r->element[1]->type == REDIS_REPLY_INTEGER &&
               r->element[2]->type == REDIS_REPLY_INTEGER &&
               r->element[3]->type == REDIS_REPLY_INTEGER) {
        res->hint = r->element[1]->integer;
        res->head = r->element[2]->integer == 1;
        res->quarantine = r->element[3]->integer == 1;
    } else {
        st = bad(e, "acquire", r, &g->outcome);
    }
    freeReplyObject(r);
    return st;
}

/* Run the release script in leave mode (leave = 1) or as a release. *ok:
 * the script's 1 (a live hold released, or left) or 0 (not ours). */
static cerb_status run_release(const struct redis_qkind *k, cerb_engine *e, struct redis_conn *c,
                               struct q_keys *qk, const cerb_engine_lock *lk, int leave, int *ok,
                               cerb_outcome *oc)
{
    char lease[NUM];
    struct redis_marker_view mv;
    snprintf(lease, sizeof lease, "%lld", (long long)lk->lease_ms);
    /* "1": single and Sentinel mode, where the closure record is read (a
     * semaphore's release hands nothing over while it says closed). */
    const char *args[5] = {lk->token, leave ? "1" : "0", mv.value, lease, "1"};
    int nargs = qk->ks.mk || !e->closure_key ? 4 : 5;
    redisReply *r = NULL;
    cerb_status st = cerb__redis_marker_for(e, c, &qk->ks, &mv);
    if (st == CERB_OK)
        st = q_eval(e, c, k->release, qk, nargs, args, NULL, &r, oc);
    if (st != CERB_OK)
        return st;
    if (cerb__redis_is_lost(r)) {
        /* The data the member lived in is gone: nothing to release. */
        freeReplyObject(r);
        cerb__redis_marker_lost(e, c, &qk->ks, &mv);
        *oc = CERB_OUTCOME_NO;
        *ok = 0;
        return CERB_OK;
    }
    if (r->type != REDIS_REPLY_INTEGER) {
        st = bad(e, "release", r, oc);
        freeReplyObject(r);
        return st;
    }
    *ok = r->integer == 1;
    freeReplyObject(r);
    return CERB_OK;
}

/* ---- acquire ---- */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t ms_ceil(int64_t ns) { return ns <= 0 ? 0 : (ns + CERB_NS_PER_MS - 1) / CERB_NS_PER_MS; }

static void grant_fill(cerb_grant *g, uint64_t fence, int64_t sent_ns, int64_t ttl_ms)
{
    g->fence = fence;
    g->sent_ns = sent_ns;
    g->ttl_ms = ttl_ms;
    g->outcome = CERB_OUTCOME_YES;
}

/* When the next re-check is due after a run sent at sent_ns. */
static int64_t next_check_at(const struct redis_qkind *k, const struct q_res *res, int64_t sent_ns)
{
    int64_t iv = res->head && k->prim == CERB_PRIM_SEMAPHORE ? REDIS_HEAD_POLL_MS
                                                             : REDIS_TAIL_POLL_MS;
    if ((res->head || res->quarantine) && res->hint >= 0 && res->hint + 1 < iv)
        iv = res->hint + 1;
    return sent_ns + iv * CERB_NS_PER_MS;
}

/* Leave the queue (best effort) and return st with its message; outcome
 * UNKNOWN when the leave is not confirmed. */
static cerb_status give_up(const struct redis_qkind *k, cerb_engine *e, struct redis_conn *bc,
                           struct q_keys *qk, const cerb_engine_lock *lk, cerb_status st,
                           cerb_grant *g)
{
    char why[CERB_ERROR_MAX];
    cerb_outcome oc = CERB_OUTCOME_NO;
    int ok = 0;
    cerb_status ls;
    cerb__error_copy(why, sizeof why);
    REDIS_COUNT(e, leaves);
    if (bc && !bc->broken) {
        ls = run_release(k, e, bc, qk, lk, 1, &ok, &oc);
    } else {
        struct redis_conn *c;
        ls = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
        if (ls == CERB_OK) {
            ls = run_release(k, e, c, qk, lk, 1, &ok, &oc);
            cerb__redis_put(e, c);
        }
    }
    if (ls != CERB_OK) {
        g->outcome = CERB_OUTCOME_UNKNOWN;
        return cerb__error_set(st, "%s (and leaving the queue failed)", why);
    }
    g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(st, "%s", why);
}

/* A failure on the blocking connection that cancel() caused: drop it and
 * go on (the interrupt flag is looked at next). */
static bool cancel_hit(cerb_engine *e, cerb_engine_lock *lk, struct redis_conn **bc,
                       int64_t *next_check)
{
    if (!cerb__redis_wait_unregister(e, lk))
        return false;
    REDIS_COUNT(e, cancel_wakeups);
    cerb__redis_redirect_clear();
    (*bc)->broken = true;
    cerb__redis_block_put(e, *bc);
    *bc = NULL;
    *next_check = 0;
    return true;
}

static cerb_status q_wait(const struct redis_qkind *k, cerb_engine *e, cerb_engine_lock *lk,
                          struct q_keys *qk, int64_t deadline_ns, const atomic_int *intr,
                          struct q_res res, int64_t last_sent, cerb_grant *g)
{
    struct redis_conn *bc = NULL;
    bool inflight = false;
    int64_t blpop_due = 0;
    int64_t next_check = next_check_at(k, &res, last_sent);
    int wi = wake_index(k);
    cerb_outcome oc = CERB_OUTCOME_NO;
    cerb_status st;

    for (;;) {
        if (intr && atomic_load(intr)) {
            st = cerb__error_set(CERB_INTERRUPTED, "wait for %s \"%s\" interrupted", kind_name(k),
                                 lk->name);
            break;
        }
        if (!bc) {
            st = cerb__redis_block_get(e, &bc);
            if (st != CERB_OK)
                break;
            cerb__redis_wait_register(e, lk, bc);
            inflight = false;
            if (intr && atomic_load(intr)) {
                st = cerb__error_set(CERB_INTERRUPTED, "wait for %s \"%s\" interrupted",
                                     kind_name(k), lk->name);
                break;
            }
        }
        int64_t now = cerb_monotime();
        if (now >= deadline_ns) {
            st = cerb__error_set(CERB_TIMEOUT, "wait for %s \"%s\" timed out", kind_name(k),
                                 lk->name);
            break;
        }
        if (!inflight && now >= next_check) {
            int64_t sent, left = cerb__ms_left(deadline_ns);
            REDIS_COUNT(e, acquire_polls);
            st = run_acquire(k, e, bc, qk, lk, left > 0 ? left : 1, &res, &sent, g);
            if (st != CERB_OK) {
                if (g->no_prim || g->closed_epoch)
                    break; /* nothing of ours is left queued */
                if (cancel_hit(e, lk, &bc, &next_check))
                    continue;
                break;
            }
            if (res.granted) {
                grant_fill(g, res.fence, sent, lk->lease_ms);
                break;
            }
            last_sent = sent;
            next_check = next_check_at(k, &res, sent);
            continue;
        }
        if (!inflight) {
            int64_t t = ms_ceil(min64(next_check, deadline_ns) - now);
            char tmo[32];
            if (t < 1)
                t = 1;
            snprintf(tmo, sizeof tmo, "%lld.%03lld", (long long)(t / 1000), (long long)(t % 1000));
            const char *argv[3] = {"BLPOP", qk->k[wi], tmo};
            size_t argl[3] = {5, qk->len[wi], strlen(tmo)};
            st = cerb__redis_append(bc, 3, argv, argl);
            if (st == CERB_OK)
                st = cerb__redis_send(e, bc, "BLPOP", &oc);
            if (st != CERB_OK) {
                if (cancel_hit(e, lk, &bc, &next_check))
                    continue;
                break;
            }
            inflight = true;
            blpop_due = now + (t + BLPOP_TICK_MS + e->rc->op_timeout_ms) * CERB_NS_PER_MS;
        }
        struct pollfd pfd = {.fd = bc->ctx->fd, .events = POLLIN};
        int64_t slice = ms_ceil(min64(deadline_ns - now, REDIS_INTR_SLICE_MS * CERB_NS_PER_MS));
        int pr = poll(&pfd, 1, (int)(slice > 0 ? slice : 1));
        if (pr < 0 && errno != EINTR) {
            bc->broken = true;
            st = cerb__error_set(CERB_EIO, "redis %s: poll: %s", e->where, strerror(errno));
            break;
        }
        if (pr <= 0) {
            if (cerb_monotime() > blpop_due) {
                bc->broken = true;
                st = cerb__error_set(CERB_EIO, "redis %s: BLPOP: no reply", e->where);
                break;
            }
            continue;
        }
        redisReply *r;
        st = cerb__redis_recv(e, bc, "BLPOP", &r, &oc);
        inflight = false;
        if (st != CERB_OK) {
            if (cancel_hit(e, lk, &bc, &next_check))
                continue;
            break;
        }
        if (r->type == REDIS_REPLY_NIL) {
            freeReplyObject(r);
            continue;
        }
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            r->element[1]->type == REDIS_REPLY_STRING) {
            uint64_t fence;
            enum redis_read rv = cerb__redis_read_wake(r->element[1]->str, r->element[1]->len,
                                                       &fence);
            freeReplyObject(r);
            REDIS_COUNT(e, wakeups);
            if (rv == REDIS_READ_YES) {
                /* "f<fence>": a semaphore's release (or another member's
                 * acquire) granted us at the head of the queue, with a
                 * lease of min(ours, REDIS_HANDOFF_TTL_MS). It came after
                 * our last acquire run, which found us waiting and emptied
                 * this list: its lease started after last_sent. With half
                 * of it gone already, a run of acquire extends it (or
                 * finds it lost) before we say yes. */
                int64_t ttl = min64(lk->lease_ms, REDIS_HANDOFF_TTL_MS);
                if (cerb_monotime() - last_sent < ttl * CERB_NS_PER_MS / 2) {
                    grant_fill(g, fence, last_sent, ttl);
                    REDIS_COUNT(e, handoffs_received);
                    st = CERB_OK;
                    break;
                }
            } else if (rv == REDIS_READ_BAD) {
                CERB_LOG_W("redis %s: a wake list held a message that is no hand-off; "
                           "looking again", e->where);
            }
            /* "w": our turn may have come; run acquire now. */
            next_check = 0;
            continue;
        }
        st = bad(e, "BLPOP", r, &oc);
        freeReplyObject(r);
        break;
    }
    if (bc && (cerb__redis_wait_unregister(e, lk) || inflight))
        bc->broken = true;
    if (st != CERB_OK && !g->no_prim && !g->closed_epoch)
        st = give_up(k, e, bc, qk, lk, st, g);
    if (bc)
        cerb__redis_block_put(e, bc);
    return st;
}

/*
 * redis.min_replicas_ack = n > 0: a grant counts once n replicas have it.
 * The grant was written by our own script on c: a WAIT there covers it.
 * Not confirmed: released (token compared), an error with outcome NO.
 */
static cerb_status confirm(const struct redis_qkind *k, cerb_engine *e, struct q_keys *qk,
                           cerb_engine_lock *lk, cerb_grant *g)
{
    int n = e->rc->min_replicas_ack;
    struct redis_conn *c;
    char nb[16], tb[24];
    long long acked = -1;
    /* WAIT on a fresh pool connection covers only its own writes: refresh
     * the grant there (the idempotent acquire), then WAIT. */
    struct q_res res = {0};
    int64_t sent = 0;
    cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = run_acquire(k, e, c, qk, lk, 0, &res, &sent, g);
        if (st == CERB_OK && !res.granted)
            st = cerb__error_set(CERB_LOST, "redis %s: %s \"%s\" was lost before its replicas "
                                 "confirmed it", e->where, kind_name(k), lk->name);
        if (st == CERB_OK) {
            redisReply *r = NULL;
            size_t got = 0;
            cerb_outcome oc;
            snprintf(nb, sizeof nb, "%d", n);
            snprintf(tb, sizeof tb, "%lld", (long long)e->rc->op_timeout_ms);
            const char *argv[3] = {"WAIT", nb, tb};
            size_t argl[3] = {4, strlen(nb), strlen(tb)};
            st = cerb__redis_conn_set_timeout(e, c, 2 * e->rc->op_timeout_ms);
            if (st == CERB_OK)
                st = cerb__redis_append(c, 3, argv, argl);
            if (st == CERB_OK)
                st = cerb__redis_exchange(e, c, "WAIT", &r, &got, &oc);
            if (st == CERB_OK && r->type == REDIS_REPLY_INTEGER)
                acked = r->integer;
            if (r)
                freeReplyObject(r);
            if (st == CERB_OK)
                st = cerb__redis_conn_set_timeout(e, c, e->rc->op_timeout_ms);
        }
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK && acked >= n) {
        g->fence = res.fence;
        g->sent_ns = sent;
        g->ttl_ms = lk->lease_ms;
        g->outcome = CERB_OUTCOME_YES;
        return CERB_OK;
    }
    cerb__redis_q_release(k, e, lk);
    g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "redis %s: %s \"%s\" granted, but %lld of %d replicas "
                           "confirmed it: released", e->where, kind_name(k), lk->name, acked, n);
}

static cerb_status node_acquire(const struct redis_qkind *k, cerb_engine *e, cerb_engine_lock *lk,
                                int64_t deadline_ns, const atomic_int *intr, cerb_grant *g)
{
    struct q_keys qk;
    struct q_res res = {0};
    struct redis_conn *c;
    int64_t sent = 0, wait_ms = 0;
    cerb_status st = q_keys_init(k, e, lk->name, lk->token, &qk);
    if (st != CERB_OK)
        return st;
    cerb__redis_marker_note_lease(e, lk->lease_ms);
    if (deadline_ns != 0)
        wait_ms = cerb__ms_left(deadline_ns);
    g->outcome = CERB_OUTCOME_NO;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = run_acquire(k, e, c, &qk, lk, wait_ms, &res, &sent, g);
        cerb__redis_put(e, c);
    }
    if (st != CERB_OK) {
        /* A lost request may have queued us, or granted: leave, which also
         * settles it (nothing held, nothing queued) when confirmed. */
        if (g->outcome == CERB_OUTCOME_UNKNOWN)
            st = give_up(k, e, NULL, &qk, lk, st, g);
    } else if (res.granted) {
        grant_fill(g, res.fence, sent, lk->lease_ms);
    } else if (deadline_ns == 0 && res.quarantine) {
        st = cerb__error_set(CERB_BUSY, "redis %s: %s \"%s\": no grants for %lld ms yet: the "
                             "server lost its data and holders elsewhere may not know",
                             e->where, kind_name(k), lk->name, (long long)res.hint);
    } else if (deadline_ns == 0) {
        st = cerb__error_set(CERB_BUSY, "redis %s: %s \"%s\" is busy", e->where, kind_name(k),
                             lk->name);
    } else if (wait_ms == 0) {
        st = cerb__error_set(CERB_TIMEOUT, "wait for %s \"%s\" timed out", kind_name(k),
                             lk->name);
    } else {
        st = q_wait(k, e, lk, &qk, deadline_ns, intr, res, sent, g);
    }
    if (st == CERB_OK && e->rc->min_replicas_ack > 0)
        st = confirm(k, e, &qk, lk, g);
    if (st == CERB_OK)
        REDIS_COUNT(e, grants);
    q_keys_free(&qk);
    return st;
}

/* ---- the other operations (one script each) ---- */

static cerb_status node_release(const struct redis_qkind *k, cerb_engine *e, cerb_engine_lock *lk,
                                cerb_outcome *oc)
{
    struct q_keys qk;
    struct redis_conn *c;
    int ok = 0;
    cerb_status st = q_keys_init(k, e, lk->name, lk->token, &qk);
    *oc = CERB_OUTCOME_NO;
    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = run_release(k, e, c, &qk, lk, 0, &ok, oc);
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK && !ok)
        st = cerb__error_set(CERB_NOT_OWNER, "redis %s: %s \"%s\" is not held by this owner",
                             e->where, kind_name(k), lk->name);
    q_keys_free(&qk);
    return st;
}

/* renew (check = false) or check_owner (check = true). */
static cerb_status node_keep(const struct redis_qkind *k, cerb_engine *e, cerb_engine_lock *lk,
                             cerb_grant *g, bool check)
{
    struct q_keys qk;
    struct redis_conn *c;
    struct redis_marker_view mv;
    redisReply *r = NULL;
    char lease[NUM];
    snprintf(lease, sizeof lease, "%lld", (long long)lk->lease_ms);
    const char *rargs[3] = {lk->token, lease, mv.value};
    const char *cargs[2] = {lk->token, mv.value};
    cerb_status st = q_keys_init(k, e, lk->name, lk->token, &qk);
    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_marker_for(e, c, &qk.ks, &mv);
        if (st == CERB_OK)
            st = check ? q_eval(e, c, k->check, &qk, 2, cargs, &g->sent_ns, &r, &g->outcome)
                       : q_eval(e, c, k->renew, &qk, 3, rargs, &g->sent_ns, &r, &g->outcome);
        if (st == CERB_OK && cerb__redis_is_lost(r)) {
            cerb__redis_marker_lost(e, c, &qk.ks, &mv);
            g->outcome = CERB_OUTCOME_NO;
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: %s \"%s\": the server lost its data",
                                 e->where, kind_name(k), lk->name);
        }
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK) {
        if (!check && r->type == REDIS_REPLY_INTEGER) {
            if (r->integer > 0) {
                g->fence = (uint64_t)r->integer;
                g->ttl_ms = lk->lease_ms;
            } else {
                st = cerb__error_set(CERB_NOT_OWNER, "redis %s: %s \"%s\" is no longer held by "
                                     "this owner", e->where, kind_name(k), lk->name);
            }
        } else if (check && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                   r->element[0]->type == REDIS_REPLY_INTEGER &&
                   r->element[1]->type == REDIS_REPLY_INTEGER) {
            if (r->element[0]->integer > 0) {
                g->fence = (uint64_t)r->element[0]->integer;
                g->ttl_ms = r->element[1]->integer;
            } else {
                st = cerb__error_set(CERB_NOT_OWNER, "redis %s: %s \"%s\" is not held by this "
                                     "owner", e->where, kind_name(k), lk->name);
            }
        } else {
            st = bad(e, check ? "check" : "renew", r, &g->outcome);
        }
    }
    if (r)
        freeReplyObject(r);
    q_keys_free(&qk);
    return st;
}

/* Run the read-only script id with the keys of name (wake list of token)
 * and args, the marker's id as args[mi]; its reply in *out. A marker found
 * changed is learnt and the script run once more under it. */
static cerb_status node_read(const struct redis_qkind *k, cerb_engine *e, const char *name,
                             const char *token, enum redis_script id, const char **args,
                             int nargs, int mi, const char *what, redisReply **out)
{
    struct q_keys qk;
    struct redis_conn *c = NULL;
    struct redis_marker_view mv;
    redisReply *r = NULL;
    cerb_outcome oc;
    args[mi] = mv.value;
    cerb_status st = q_keys_init(k, e, name, token, &qk);
    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    for (int round = 0; st == CERB_OK; round++) {
        st = cerb__redis_marker_for(e, c, &qk.ks, &mv);
        if (st == CERB_OK)
            st = q_eval(e, c, id, &qk, nargs, args, NULL, &r, &oc);
        if (st != CERB_OK || !cerb__redis_is_lost(r))
            break;
        freeReplyObject(r);
        r = NULL;
        st = round == 0 ? cerb__redis_marker_lost(e, c, &qk.ks, &mv)
                        : cerb__error_set(CERB_EIO, "redis %s: %s: the server keeps losing "
                                          "its data (marker changed twice)", e->where, what);
    }
    if (c)
        cerb__redis_put(e, c);
    q_keys_free(&qk);
    if (st != CERB_OK && r) {
        freeReplyObject(r);
        r = NULL;
    }
    *out = r;
    return st;
}

static cerb_status node_held(const struct redis_qkind *k, cerb_engine *e, const char *name)
{
    const char *args[1];
    redisReply *r = NULL;
    cerb_status st = node_read(k, e, name, "", k->held, args, 1, 0, "held", &r);
    if (st == CERB_OK) {
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 0)
            st = CERB_OK;
        else if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            st = cerb__error_set(CERB_BUSY, "redis %s: %s \"%s\" is held", e->where,
                                 kind_name(k), name);
        else if (r->type == REDIS_REPLY_INTEGER && r->integer == 2)
            st = cerb__error_set(CERB_BUSY, "redis %s: no answer for %s \"%s\" before the "
                                 "quarantine after a loss of data ends", e->where, kind_name(k),
                                 name);
        else
            st = bad(e, "held", r, NULL);
    }
    if (r)
        freeReplyObject(r);
    return st;
}

/* Would a new member like lk be granted at the tail now (engine.h's fits)?
 * One read-only script: CERB_OK, or CERB_BUSY naming why not. */
static cerb_status node_fits(const struct redis_qkind *k, cerb_engine *e,
                             const cerb_engine_lock *lk)
{
    char cnt[NUM], lim[NUM], lease[NUM];
    const char *args[5] = {lk->token, cnt, NULL, NULL, NULL};
    redisReply *r = NULL;
    cerb_status st;
    if (k->prim == CERB_PRIM_SEMAPHORE) {
        snprintf(cnt, sizeof cnt, "%u", lk->count);
        snprintf(lim, sizeof lim, "%lld", (long long)lk->limit);
        snprintf(lease, sizeof lease, "%lld", (long long)lk->lease_ms);
        args[2] = lim;
        args[3] = lease;
        st = node_read(k, e, lk->name, lk->token, k->fits, args, 5, 4, "fits", &r);
    } else {
        snprintf(cnt, sizeof cnt, "%s", lk->variant == CERB_RW_WRITE ? "w" : "r");
        st = node_read(k, e, lk->name, lk->token, k->fits, args, 3, 2, "fits", &r);
    }
    if (st == CERB_OK) {
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 0)
            st = CERB_OK;
        else if (r->type == REDIS_REPLY_INTEGER && r->integer == 1 &&
                 k->prim == CERB_PRIM_SEMAPHORE)
            st = cerb__error_set(CERB_BUSY, "redis %s: semaphore \"%s\": %u permit(s) more "
                                 "would exceed its limit now", e->where, lk->name, lk->count);
        else if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            st = cerb__error_set(CERB_BUSY, "redis %s: read-write lock \"%s\": a %s would "
                                 "not be granted now (%s)", e->where, lk->name,
                                 lk->variant == CERB_RW_WRITE ? "writer" : "reader",
                                 lk->variant == CERB_RW_WRITE ? "members there"
                                                              : "a writer there");
        else if (r->type == REDIS_REPLY_INTEGER && r->integer == 2)
            st = cerb__error_set(CERB_BUSY, "redis %s: no answer for %s \"%s\" before the "
                                 "quarantine after a loss of data ends", e->where, kind_name(k),
                                 lk->name);
        else
            st = bad(e, "fits", r, NULL);
    }
    if (r)
        freeReplyObject(r);
    return st;
}

static cerb_status node_inspect(const struct redis_qkind *k, cerb_engine *e, const char *name,
                                struct cerb_holders *out)
{
    struct q_keys qk;
    struct redis_conn *c = NULL;
    redisReply *r = NULL;
    cerb_outcome oc;
    cerb_status st = q_keys_init(k, e, name, "", &qk);
    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = q_eval(e, c, k->inspect, &qk, 0, NULL, NULL, &r, &oc);
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK)
        st = k->read_inspect(e, name, r, out);
    if (r)
        freeReplyObject(r);
    q_keys_free(&qk);
    return st;
}

/* ---- routing (cluster mode) and the tables ---- */

struct q_arg {
    const struct redis_qkind *k;
    cerb_engine_lock *lk;
    const cerb_engine_lock *clk; /* fits */
    const char *name;
    int64_t deadline_ns;
    const atomic_int *intr;
    cerb_grant *g;
    struct cerb_holders *out;
    size_t n_before; /* inspect: entries there before a redirected try */
};

/* Route op over the master of the slot of name's base key. */
static cerb_status route(cerb_engine *top, const struct redis_qkind *k, const char *name,
                         int64_t deadline_ns,
                         cerb_status (*op)(cerb_engine *, void *, cerb_outcome *), void *arg)
{
    const char *prefix = top->rc->prefix ? top->rc->prefix : "";
    size_t pl = strlen(prefix), il = strlen(k->infix), nl = strlen(name);
    char buf[600], *key = pl + il + nl <= sizeof buf ? buf : cerb__malloc(pl + il + nl);
    if (!key)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for key names");
    memcpy(key, prefix, pl);
    memcpy(key + pl, k->infix, il);
    memcpy(key + pl + il, name, nl);
    cerb_status st = cerb__redis_cl_route(top, key, pl + il + nl, deadline_ns, op, arg);
    if (key != buf)
        cerb__free(key);
    return st;
}

static cerb_status acq_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    if (a->intr && atomic_load(a->intr)) {
        *oc = a->g->outcome = CERB_OUTCOME_NO;
        return cerb__error_set(CERB_INTERRUPTED, "wait for \"%s\" interrupted", a->lk->name);
    }
    cerb_status st = node_acquire(a->k, e, a->lk, a->deadline_ns, a->intr, a->g);
    *oc = a->g->outcome;
    return st;
}

static cerb_status rel_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    return node_release(a->k, e, a->lk, oc);
}

static cerb_status renew_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    cerb_status st = node_keep(a->k, e, a->lk, a->g, false);
    *oc = a->g->outcome;
    return st;
}

static cerb_status check_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    cerb_status st = node_keep(a->k, e, a->lk, a->g, true);
    *oc = a->g->outcome;
    return st;
}

static cerb_status held_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    *oc = CERB_OUTCOME_NO;
    return node_held(a->k, e, a->name);
}

static cerb_status fits_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    *oc = CERB_OUTCOME_NO;
    return node_fits(a->k, e, a->clk);
}

static cerb_status inspect_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct q_arg *a = arg;
    *oc = CERB_OUTCOME_NO;
    return node_inspect(a->k, e, a->name, a->out);
}

cerb_status cerb__redis_q_acquire(const struct redis_qkind *k, cerb_engine *e,
                                  cerb_engine_lock *lk, int64_t deadline_ns,
                                  const atomic_int *interrupted, cerb_grant *g)
{
    if (!e->cl_top)
        return node_acquire(k, e, lk, deadline_ns, interrupted, g);
    struct q_arg a = {.k = k, .lk = lk, .deadline_ns = deadline_ns, .intr = interrupted, .g = g};
    int64_t dl = deadline_ns == 0 ? cerb__deadline_in(e->rc->op_timeout_ms) : deadline_ns;
    return route(e, k, lk->name, dl, acq_op, &a);
}

cerb_status cerb__redis_q_release(const struct redis_qkind *k, cerb_engine *e,
                                  cerb_engine_lock *lk)
{
    cerb_outcome oc;
    if (!e->cl_top)
        return node_release(k, e, lk, &oc);
    struct q_arg a = {.k = k, .lk = lk};
    return route(e, k, lk->name, cerb__deadline_in(e->rc->op_timeout_ms), rel_op, &a);
}

cerb_status cerb__redis_q_renew(const struct redis_qkind *k, cerb_engine *e,
                                cerb_engine_lock *lk, cerb_grant *g)
{
    if (!e->cl_top)
        return node_keep(k, e, lk, g, false);
    struct q_arg a = {.k = k, .lk = lk, .g = g};
    return route(e, k, lk->name, cerb__deadline_in(e->rc->op_timeout_ms), renew_op, &a);
}

cerb_status cerb__redis_q_check(const struct redis_qkind *k, cerb_engine *e,
                                cerb_engine_lock *lk, cerb_grant *g)
{
    if (!e->cl_top)
        return node_keep(k, e, lk, g, true);
    struct q_arg a = {.k = k, .lk = lk, .g = g};
    return route(e, k, lk->name, cerb__deadline_in(e->rc->op_timeout_ms), check_op, &a);
}

cerb_status cerb__redis_q_held(const struct redis_qkind *k, cerb_engine *e, const char *name)
{
    if (!e->cl_top)
        return node_held(k, e, name);
    struct q_arg a = {.k = k, .name = name};
    return route(e, k, name, cerb__deadline_in(e->rc->op_timeout_ms), held_op, &a);
}

cerb_status cerb__redis_q_fits(const struct redis_qkind *k, cerb_engine *e,
                             const cerb_engine_lock *lk)
{
    if (!e->cl_top)
        return node_fits(k, e, lk);
    struct q_arg a = {.k = k, .clk = lk};
    return route(e, k, lk->name, cerb__deadline_in(e->rc->op_timeout_ms), fits_op, &a);
}

cerb_status cerb__redis_q_inspect(const struct redis_qkind *k, cerb_engine *e, const char *name,
                                  struct cerb_holders *out)
{
    if (!e->cl_top)
        return node_inspect(k, e, name, out);
    struct q_arg a = {.k = k, .name = name, .out = out};
    return route(e, k, name, cerb__deadline_in(e->rc->op_timeout_ms), inspect_op, &a);
}

#define QTABLE(fn, kind)                                                                     \
    static cerb_status fn##_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t dl,        \
                                    const atomic_int *intr, cerb_grant *g)                   \
    {                                                                                        \
        if (e->rl_top)                                                                       \
            return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), g);                  \
        return cerb__redis_q_acquire(&kind, e, lk, dl, intr, g);                             \
    }                                                                                        \
    static cerb_status fn##_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)       \
    {                                                                                        \
        if (e->rl_top)                                                                       \
            return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), g);                  \
        return cerb__redis_q_renew(&kind, e, lk, g);                                         \
    }                                                                                        \
    static cerb_status fn##_release(cerb_engine *e, cerb_engine_lock *lk)                    \
    {                                                                                        \
        if (e->rl_top)                                                                       \
            return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), NULL);               \
        return cerb__redis_q_release(&kind, e, lk);                                          \
    }                                                                                        \
    static cerb_status fn##_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)       \
    {                                                                                        \
        if (e->rl_top)                                                                       \
            return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), g);                  \
        return cerb__redis_q_check(&kind, e, lk, g);                                         \
    }                                                                                        \
    static cerb_status fn##_held(cerb_engine *e, const char *name)                           \
    {                                                                                        \
        if (e->rl_top) /* nobody can hold one here */                                        \
            return CERB_OK;                                                                  \
        return cerb__redis_q_held(&kind, e, name);                                           \
    }                                                                                        \
    static cerb_status fn##_fits(cerb_engine *e, const cerb_engine_lock *lk)                 \
    {                                                                                        \
        if (e->rl_top)                                                                       \
            return CERB_OK;                                                                  \
        return cerb__redis_q_fits(&kind, e, lk);                                             \
    }                                                                                        \
    static cerb_status fn##_inspect(cerb_engine *e, const char *name,                        \
                                    struct cerb_holders *out)                                \
    {                                                                                        \
        if (e->rl_top)                                                                       \
            return cerb__redis_rl_no_prim(e, "queued primitive", NULL);                      \
        return cerb__redis_q_inspect(&kind, e, name, out);                                   \
    }

QTABLE(sem, cerb__redis_qkind_sem)
QTABLE(rw, cerb__redis_qkind_rw)

const struct cerb_queue_methods cerb__redis_semaphore = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = sem_acquire,
    .renew = sem_renew,
    .release = sem_release,
    .check_owner = sem_check,
    .held = sem_held,
    .inspect = sem_inspect,
    .fits = sem_fits,
};

const struct cerb_queue_methods cerb__redis_rwlock = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = rw_acquire,
    .renew = rw_renew,
    .release = rw_release,
    .check_owner = rw_check,
    .held = rw_held,
    .inspect = rw_inspect,
    .fits = rw_fits,
};
