/*
 * zk_mutex.c — Curator's InterProcessMutex protocol: acquire (with waiting),
 * release, renew, check_owner and cancel.
 *
 * Acquire, one attempt (a fresh uuid each, from libuuid):
 *  1. Wait for a connected session (bounded by the connect timeout and the
 *     caller's deadline).
 *  2. Send, back to back without waiting in between, a create of
 *     <root>/<name>/_c_<uuid>-lock- (EPHEMERAL_SEQUENTIAL) and a
 *     getChildren of <root>/<name>. The create is one transaction (multi)
 *     with a check of the fence offset node's version and a rewrite of
 *     <root>/<name>'s (empty) data, whose stat gives the transaction's zxid
 *     — our node's czxid; the fencing token is czxid + the offset checked
 *     (zk_fence.c, which reads the offset first, or raises it for a
 *     client's fence floor). For a client with a configuration epoch
 *     (lk->epoch >= 0) the same transaction checks the version of the
 *     switch closure record (zk_closure.c): a record that refuses the
 *     epoch refuses before anything is sent, and one stored after our
 *     reading fails the check, so no node of a refused epoch is created
 *     after the record. The server answers a session's requests
 *     in order, so the listing already contains our node and the whole
 *     uncontended acquire costs one round trip (Curator spends two). When
 *     the parent is missing (NONODE), the missing ancestors are created as
 *     CONTAINER nodes in front of the same two requests, still one round
 *     trip. A lost create reply is settled in zk_cleanup.c (adopt the node
 *     with our uuid owned by our current session, or create again); one
 *     not settled by the call's bound fails with an UNKNOWN outcome and
 *     keeps the uuid, for the core's check_owner or release.
 *  3. Order the children by the text after the last "lock-" (zk_layout.c).
 *     None before ours: we hold the lock. Otherwise, with no time to wait
 *     (trylock), delete our node and answer BUSY.
 *  4. Watch the child just before ours only (each release wakes exactly one
 *     waiter, there is no herd), with two watches set in one round trip: a
 *     data watch (getData, not exists: an exists watch on a node that is
 *     already gone stays armed as a creation watch) and a child watch
 *     (getChildren on it: it has no children, but its deletion fires it).
 *     When the predecessor goes (or is already gone):
 *       - if it was first — the only child before ours in our listing, or
 *         it told us it held the lock — we now hold the lock without
 *         listing again: sequence numbers only grow, so no child created
 *         after ours can sort before it, and while it held the lock the
 *         ones before it were all gone;
 *       - otherwise list again (a waiter in the middle gave up) and go to 3.
 *     How it tells us: our lock nodes are created with the data
 *     ZK_DATA_WAITING, and a holder that may have a successor (it waited
 *     itself, or its listing shows a later child) rewrites its own node to
 *     ZK_DATA_HOLDING as soon as it is granted — one write, sent without
 *     waiting, before its release can follow on the same session. The
 *     successor reads the data with its data watch; ZK_DATA_HOLDING, or a
 *     change of a node that read ZK_DATA_WAITING (only its owner writes it,
 *     and only this once), says the predecessor holds. That change uses up
 *     the data watch, which is why the child watch is there: it stays set
 *     for the deletion, so no watch has to be set again between the two
 *     (the holder may release a few microseconds after its grant). A
 *     release then hands over in the time of one deletion and one
 *     notification; Curator lists again first (one more round trip, behind
 *     the releaser's own next create). Curator's nodes (data: an IP
 *     address) never change, so behind one of them we list as Curator
 *     does; a Curator waiter behind one of ours sees the change as a
 *     spurious wake-up and lists again.
 *  5. Giving up (deadline, interrupt, error) deletes our node, retried
 *     through connection loss (zk_cleanup.c) until shortly after the
 *     call's bound, then left to the keeper.
 * Election terms (lk->prim CERB_PRIM_ELECTION, zk_election.c) go through
 * the same steps in their layout: the mark after the uuid is "latch-"
 * (Curator's LeaderLatch) or "lock-" (LeaderSelector), which also orders
 * the children; the node is created with the candidate's value as its data
 * instead of ZK_DATA_WAITING; no ZK_DATA_HOLDING mark is written, so a
 * successor lists again on the term's end, as behind a Curator node; and a
 * term's waiter reads no mark in its predecessor's data (a peer's
 * participant id could read like one), so it takes over without listing
 * only when its predecessor was first. Our nodes' uuids (locks' and
 * terms') have the version nibble ZK_OUR_UUID_VERSION (not Curator's random
 * 4): a lock waiter reads marks only in a node of ours, and a proclaim
 * tells our candidates from Curator's (zk_election.c).
 * Every wait of a call ends by its bound: the caller's deadline, or the
 * connect timeout for trylock and check_owner (op_bound).
 * A session lost while waiting (zk_session.c) ends the attempt: its node
 * dies with the session, and a new attempt starts on the next session
 * while the deadline allows.
 *
 * The blocked waiter sleeps on its own condition variable, woken by the
 * predecessor's watch (routed by path, see lock_watcher), by a session
 * change, or by cancel(); it looks at its interrupt flag at least every
 * ZK_INTR_SLICE_MS. cancel() only sets a flag and signals: it never touches
 * the network.
 *
 * A grant is valid as long as the session: renew() does no I/O, it reports
 * the session's state — OK with the send time of the last answered request
 * (the keeper's heartbeat keeps it within a sixth of the session timeout),
 * EIO while disconnected, NOT_OWNER once the session is gone. Its ttl is the
 * negotiated session timeout, also when the lock's lease is longer: the
 * server drops our node that long after our last contact whatever the lease
 * (the core then renews every ttl/3, which costs nothing here).
 */
#include "internal_posix.h"

#include "zk_mutex.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uuid/uuid.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "zk_call.h"
#include "zk_errors.h"

/* The data of our lock nodes: queued, and granted (see the header). */
#define ZK_DATA_WAITING "cerb:waiting"
#define ZK_DATA_HOLDING "cerb:holding"

const char *cerb__zk_variant_mark(int variant)
{
    return variant == CERB_ELECT_LAYOUT_SELECTOR ? ZK_LOCK_MARK : ZK_LATCH_MARK;
}

const char *cerb__zk_lock_mark(const cerb_engine_lock *lk)
{
    if (lk->prim == CERB_PRIM_RWLOCK)
        return lk->variant == CERB_RW_WRITE ? ZK_WRITE_MARK : ZK_READ_MARK;
    return lk->prim == CERB_PRIM_ELECTION ? cerb__zk_variant_mark(lk->variant) : ZK_LOCK_MARK;
}

/* Restarts of an acquisition after its session was lost. */
#define ZK_MAX_RESTARTS 10
/* Rounds of create when parents vanish under us or replies get lost. */
#define ZK_MAX_CREATE_ROUNDS 6
/* Creates sent again because a node their transaction checks (the fence
 * offset, the closure record) changed under them. */
#define ZK_MAX_CHECK_CHANGES 16
/* create_round's codes when the fence offset (zk_fence.c) or the closure
 * record (zk_closure.c) stopped a create: it could not be read or raised
 * (not sent), it changed since we read it (the check refused the create),
 * or the record refuses this client's epoch (not sent). Nothing was
 * created. */
#define CERB_ZK_RC_FENCE_FAILED (-10200)
#define CERB_ZK_RC_FENCE_CHANGED (-10201)
#define CERB_ZK_RC_CLOSURE_FAILED (-10202)
#define CERB_ZK_RC_CLOSURE_CHANGED (-10203)
#define CERB_ZK_RC_CLOSED (-10204)

/* One acquire() call. */
struct acq {
    cerb_engine *e;
    cerb_engine_lock *lk;
    struct zk_lock_priv *p;
    char *parent;             /* <root>/<name> */
    int64_t deadline;         /* the caller's; 0 = one attempt */
    int64_t bound;            /* no wait of this call ends later (below) */
    bool unknown;             /* failed with a create unanswered: it may
                                 have landed; the uuid stays for check_owner
                                 and release */
    const atomic_int *intr;
    char *prefix;             /* create path: <parent>/_c_<uuid>-lock- */
    struct zk_children kids;  /* the latest listing */
    bool listed;              /* kids is current */
    bool waited;              /* we were queued behind someone */
    int64_t closed_epoch;     /* the epoch of the closure record that
                                 refused us, 0 if none did */
    const char *mark;         /* the layout's (cerb__zk_lock_mark) */
    const char *order;        /* how children are ordered: the mark, or
                                 ZK_RW_ORDER for a read-write lock */
    int rw;                   /* a read-write lock hold: CERB_RW_READ or
                                 CERB_RW_WRITE (zk_rwlock.c); 0 otherwise */
    bool term;                /* an election term: data = its value, and
                                 no ZK_DATA_HOLDING mark (zk_election.c) */
};

/* How a blocked wait ended. */
enum woke {
    W_DELETED, W_CHANGED, W_OTHER, W_GONE, W_CONN, W_SESSION, W_TIMEOUT, W_INTR, W_ERROR
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/*
 * The bound of one operation: the caller's deadline, or for a call without
 * one (trylock, check_owner) the connect timeout from its start. Every wait
 * inside — for a connection, for an answer, for settling a lost reply —
 * ends by it: on a stopped server an answer comes only when the C client
 * gives the connection up (2/3 of the session timeout, seconds), and the
 * caller must not wait for that past its deadline.
 */
static int64_t op_bound(cerb_engine *e, int64_t deadline)
{
    return deadline != 0 ? deadline : cerb__deadline_in(e->zc->connect_timeout_ms);
}

/* Waiting for a connection: the connect timeout, or less if the bound is
 * nearer. */
static int64_t conn_deadline(const struct acq *a)
{
    return min64(a->bound, cerb__deadline_in(a->e->zc->connect_timeout_ms));
}

/* Deleting our node when leaving, past the bound: a delete takes a round
 * trip, and one not answered by then is finished by the keeper. */
#define ZK_CLEANUP_GRACE_MS 200

/*
 * How long to wait when cleaning up after ourselves (deleting our node):
 * while connected, until the operation's bound `base` (at least
 * ZK_CLEANUP_GRACE_MS, for the delete's round trip), or the connect
 * timeout for an operation without one (an unlock, an interrupted lock());
 * while disconnected already, not at all. What is not done by then — a
 * connection loss in the middle, a server that stopped — the keeper
 * finishes when the session is back (or the node goes with the session),
 * and the caller is not held up for it.
 */
static int64_t cleanup_deadline_at(cerb_engine *e, int64_t base)
{
    struct zk_state st;
    cerb__zk_state(e, &st);
    if (!st.connected)
        return cerb_monotime();
    if (base == 0 || base == CERB_DEADLINE_NEVER)
        return cerb__deadline_in(e->zc->connect_timeout_ms);
    int64_t g = cerb__deadline_in(ZK_CLEANUP_GRACE_MS);
    return base > g ? base : g;
}

static int64_t cleanup_deadline(const struct acq *a)
{
    return cleanup_deadline_at(a->e, a->deadline == 0 ? a->bound : a->deadline);
}

/*
 * A hold lives as long as its session, and the server ends a silent session
 * the negotiated timeout after it last heard from us — which is after the
 * send time we report with it — whatever lease the lock asked for. So the
 * ttl is that timeout, never more: a longer lease would put the core's
 * deadline past the moment someone else can be granted the lock. A lease
 * shorter than the session only makes the core renew (and the keeper
 * heartbeat, ZK_HEARTBEATS) more often.
 */
static int64_t grant_ttl(const struct zk_state *st, const cerb_engine_lock *lk)
{
    /* Never 0 ("until session loss"): a session not yet told its timeout
     * (cannot happen once it answered) falls back to the lease. */
    return st->timeout_ms > 0 ? st->timeout_ms : lk->lease_ms;
}

/* The fence of our node: its czxid plus the offset its create checked. */
static uint64_t hold_fence(const struct zk_lock_priv *p) { return p->czxid + p->offset; }

static void list_unlink(cerb_engine *e, struct zk_lock_priv *p)
{
    struct zk_lock_priv **head = p->list == ZK_LIST_WAITING ? &e->waiting : &e->held;
    if (p->list == ZK_LIST_NONE)
        return;
    if (p->prev)
        p->prev->next = p->next;
    else
        *head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    p->next = p->prev = NULL;
    p->list = ZK_LIST_NONE;
}

/* A hold joins e->held (mu): a short lease may need the heartbeat sooner
 * (see ZK_HEARTBEATS). */
static void hb_sooner_locked(cerb_engine *e, const cerb_engine_lock *lk)
{
    int64_t ms = lk->lease_ms / ZK_HEARTBEATS;
    if (ms < ZK_HEARTBEAT_MIN_MS)
        ms = ZK_HEARTBEAT_MIN_MS;
    int64_t at = cerb_monotime() + ms * CERB_NS_PER_MS;
    if (at < e->next_hb_ns) {
        e->next_hb_ns = at;
        cerb__cond_signal(&e->keeper_cond);
    }
}

static void list_link(cerb_engine *e, struct zk_lock_priv *p, enum zk_list which)
{
    struct zk_lock_priv **head = which == ZK_LIST_WAITING ? &e->waiting : &e->held;
    if (p->list == which)
        return;
    list_unlink(e, p);
    p->prev = NULL;
    p->next = *head;
    if (*head)
        (*head)->prev = p;
    *head = p;
    p->list = which;
}

void cerb__zk_list_link_locked(cerb_engine *e, struct zk_lock_priv *p, enum zk_list which)
{
    list_link(e, p, which);
    if (which == ZK_LIST_HELD && p->lk)
        hb_sooner_locked(e, p->lk);
}

void cerb__zk_list_unlink_locked(cerb_engine *e, struct zk_lock_priv *p) { list_unlink(e, p); }

int64_t cerb__zk_grant_ttl(const struct zk_state *st, const cerb_engine_lock *lk)
{
    return grant_ttl(st, lk);
}

/* Replace p->node (under mu: the watch callbacks read it). */
static void set_node(cerb_engine *e, struct zk_lock_priv *p, char *node)
{
    cerb__mutex_lock(&e->mu);
    char *old = p->node;
    p->node = node;
    cerb__mutex_unlock(&e->mu);
    cerb__free(old);
}

static void drop_node(cerb_engine *e, struct zk_lock_priv *p) { set_node(e, p, NULL); }

/* ---- watches (the C client's completion thread) ---- */

/*
 * Watches are routed by path to the waiter that set them (its zk_wait's
 * watch), under e->mu. The watcher context is the session, which outlives
 * every callback of its handle; a watch left set by a waiter that gave up
 * finds nobody and is dropped. Session events (delivered to every set
 * watcher) are the session watcher's business. Only the predecessor's
 * deletion wakes the waiter; its data change is noted (see the header).
 */
static void lock_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_session *s = ctx;
    cerb_engine *e = s->e;
    (void)zh;
    (void)state;

    if (type == ZOO_SESSION_EVENT || !path)
        return;
    cerb__mutex_lock(&e->mu);
    if (s->gen == e->gen_counter) {
        for (struct zk_lock_priv *p = e->waiting; p; p = p->next) {
            struct zk_wait *w = p->w;
            if (p->gen != s->gen || !w)
                continue;
            if (!w->watch || strcmp(w->watch, path) != 0)
                continue;
            if (type == ZOO_CHANGED_EVENT) {
                /* A data change: our kind of predecessor saying it holds
                 * (nothing else writes our nodes). No need to wake: the
                 * child watch is still set for its deletion. */
                w->data_armed = false;
                if (w->pred_ours)
                    w->pred_holds = true;
                ZK_COUNT(e, notices);
                continue;
            }
            if (type != ZOO_DELETED_EVENT)
                continue; /* a child event cannot happen to an ephemeral */
            if (w->woken && w->pred_event == ZOO_DELETED_EVENT)
                continue; /* the other watch of the same deletion */
            w->woken = true;
            w->pred_event = type;
            w->data_armed = w->child_armed = false;
            ZK_COUNT(e, wakeups); /* "woken by a release" */
            cerb__cond_signal(&w->cond);
        }
    }
    cerb__mutex_unlock(&e->mu);
}

/* The waiter a watch-arming answer belongs to, if it still waits (mu). */
static struct zk_lock_priv *waiter_of(cerb_engine *e, const struct zk_res *r)
{
    for (struct zk_lock_priv *p = e->waiting; p; p = p->next)
        if (p == r->owner && p->acq_id == r->owner_id)
            return p;
    return NULL;
}

static bool data_is(const struct zk_res *r, const char *what)
{
    return r->data_len == (int)strlen(what) && memcmp(r->data, what, strlen(what)) == 0;
}

/* The predecessor's getData answer (in order with the events): its data
 * watch is set until an event for it comes, and its data says whose it is
 * and whether it holds. */
static void data_armed(struct zk_res *r)
{
    struct zk_session *s = r->call->sess;
    cerb__mutex_lock(&s->e->mu);
    struct zk_lock_priv *p = waiter_of(s->e, r);
    if (p && p->w && r->rc == ZOK) {
        p->w->data_armed = true;
        /* An election term reads no marks: a predecessor's data may be a
         * peer's participant id (Curator's LeaderLatch and LeaderSelector
         * write any id there), and a foreign waiter whose id reads
         * "cerb:holding" would make us take over when it gives up, while
         * the leader before it still leads. A term's waiter takes over
         * without listing only when its predecessor was first. */
        if (p->lk && p->lk->prim == CERB_PRIM_ELECTION)
            ;
        /* Nor a read-write lock's: a reader that holds is not first, so
         * "it holds" says nothing to the one behind it. */
        else if (p->lk && p->lk->prim == CERB_PRIM_RWLOCK)
            ;
        /* Nor does anyone read marks in a peer's node: its data is its
         * user's (a LeaderSelector participant id may read like a mark),
         * and a peer waiter that gives up behind a holder would hand us
         * the name while that holder still holds it. */
        else if (!p->w->watch || !cerb__zk_child_is_ours(cerb__zk_basename(p->w->watch)))
            ;
        else if (data_is(r, ZK_DATA_HOLDING))
            p->w->pred_holds = true;
        else if (data_is(r, ZK_DATA_WAITING))
            p->w->pred_ours = true;
    }
    cerb__mutex_unlock(&s->e->mu);
}

/* Its getChildren answer: the child watch is set. */
static void child_armed(struct zk_res *r)
{
    struct zk_session *s = r->call->sess;
    cerb__mutex_lock(&s->e->mu);
    struct zk_lock_priv *p = waiter_of(s->e, r);
    if (p && p->w && r->rc == ZOK)
        p->w->child_armed = true;
    cerb__mutex_unlock(&s->e->mu);
}

/* ---- requests ---- */

/* The ancestors of `parent` and itself: "/a", "/a/b", ..., parent. */
static size_t ancestors(const char *parent, char **out, size_t max, bool *oom)
{
    size_t n = 0;
    for (const char *p = parent + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            if (n == max)
                break;
            size_t len = (size_t)(p - parent);
            out[n] = cerb__malloc(len + 1);
            if (!out[n]) {
                *oom = true;
                break;
            }
            memcpy(out[n], parent, len);
            out[n][len] = '\0';
            n++;
        }
        if (*p == '\0')
            break;
    }
    return n;
}

#define ZK_MAX_DEPTH 32

/*
 * One round of create (+ parents) + getChildren on session `gen`.
 * CERB_OK: p->node is set, and a->listed says whether the listing came too.
 * Otherwise *rc_create is the create's result and *ambiguous says whether
 * it may have landed.
 */
static cerb_status create_round(struct acq *a, uint64_t gen, bool with_parents, int *rc_create,
                                bool *ambiguous)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    char *anc[ZK_MAX_DEPTH];
    size_t n_anc = 0;
    bool oom = false;
    cerb_status st;

    *ambiguous = false;
    *rc_create = ZOK;
    cerb__zk_children_clear(&a->kids);
    a->listed = false;
    /* The closure record our create checks, for a client with an epoch:
     * one that refuses the epoch refuses here, before anything is sent —
     * also a trylock or a wait with time left — and before the fence
     * offset could be raised for a grant that will not be made. */
    struct zk_closure_snap cs = {.version = -1};
    bool lost = false;
    const bool with_closure = a->lk->epoch >= 0;
    if (with_closure) {
        st = cerb__zk_closure_prepare(e, gen, a->bound, a->intr, &lost, &cs);
        if (st != CERB_OK || lost) {
            *rc_create = lost ? ZINVALIDSTATE : CERB_ZK_RC_CLOSURE_FAILED;
            return lost ? cerb__error_set(CERB_EIO, "zk %s: the session changed", e->hosts) : st;
        }
        if (cerb__zk_closure_refuses(&cs.rec, a->lk->epoch)) {
            *rc_create = CERB_ZK_RC_CLOSED;
            a->closed_epoch = cs.rec.epoch;
            return cerb__error_set(CERB_UNAVAILABLE, "zk %s: closed by a switch at epoch %" PRId64
                                   "; this client is at epoch %" PRId64
                                   ": reload the configuration",
                                   e->hosts, cs.rec.epoch, a->lk->epoch);
        }
    }
    /* The offset our create checks (raised first if the floor needs it). */
    struct zk_fence_snap fs;
    st = cerb__zk_fence_prepare(e, gen, a->lk->fence_floor, a->bound, a->intr, &lost, &fs);
    if (st != CERB_OK || lost) {
        /* Nothing sent: an error is returned as it is (create_node). */
        *rc_create = lost ? ZINVALIDSTATE : CERB_ZK_RC_FENCE_FAILED;
        return lost ? cerb__error_set(CERB_EIO, "zk %s: the session changed", e->hosts) : st;
    }
    /* Set before sending: a create settled later (adopted by uuid, here or
     * in check_owner) got this offset, the last one sent with the uuid. */
    p->offset = fs.value;
    if (with_parents)
        n_anc = ancestors(a->parent, anc, ZK_MAX_DEPTH, &oom);
    struct zk_call *c = oom ? NULL : cerb__zk_call_new(n_anc + 2);
    if (!c) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    struct zk_session *s = cerb__zk_session_begin(e);
    int kc = -1, kl = -1;
    if (s && s->gen == gen) {
        /* Counted before it is sent: whoever sees the node sees the count. */
        ZK_COUNT(e, acquire_calls);
        for (size_t i = 0; i < n_anc; i++)
            cerb__zk_call_create(c, s, anc[i], NULL, &e->acl, ZOO_CONTAINER);
        /* A term's node carries its value from its creation (Curator's
         * participant id); a lock's says it waits. */
        const void *data = a->term ? (a->lk->value ? a->lk->value : "") : ZK_DATA_WAITING;
        int data_len = a->term ? (int)a->lk->value_len : (int)strlen(ZK_DATA_WAITING);
        kc = cerb__zk_call_lock_multi(c, s, e->fence.path, fs.version,
                                      with_closure ? e->closure.path : NULL,
                                      with_closure ? cs.version : -1, a->prefix, data,
                                      data_len, &e->acl, a->parent);
        kl = cerb__zk_call_children_mark(c, s, a->parent, kc, NULL, NULL, a->order);
    }
    cerb__zk_session_end(e);
    if (kc < 0) {
        *rc_create = ZINVALIDSTATE;
        st = cerb__error_set(CERB_EIO, "zk %s: the session changed", e->hosts);
        goto out;
    }
    if (!cerb__zk_call_wait(c, cerb__zk_call_deadline(e, a->bound))) {
        *rc_create = CERB_ZK_RC_ABANDONED;
        *ambiguous = true;
        st = cerb__zk_fail(e->hosts, "create", a->prefix, CERB_ZK_RC_ABANDONED, true, NULL);
        goto out;
    }
    struct zk_res *r = &c->res[kc];
    *rc_create = r->rc;
    if (r->rc == ZOK) {
        set_node(e, p, r->path);
        r->path = NULL;
        p->czxid = (uint64_t)r->zxid;
        cerb__zk_fence_seen(e, r->zxid);
        p->gen = gen;
        if (c->res[kl].rc == ZOK) {
            a->kids = c->res[kl].kids;
            memset(&c->res[kl].kids, 0, sizeof c->res[kl].kids);
            a->listed = true;
        }
        st = CERB_OK;
        goto out;
    }
    int rc_check = cerb__zk_multi_err(r, ZK_MULTI_CHECK);
    if (rc_check == ZBADVERSION || rc_check == ZNONODE) {
        /* The offset was raised (or its node deleted) since we read it:
         * nothing was created; read it again and create again. */
        cerb__zk_fence_stale(e, &fs);
        *rc_create = CERB_ZK_RC_FENCE_CHANGED;
        st = cerb__zk_fail(e->hosts, "check", e->fence.path, rc_check, true, NULL);
        goto out;
    }
    int rc_closure = cerb__zk_multi_err(r, ZK_MULTI_CLOSURE);
    if (rc_closure == ZBADVERSION || rc_closure == ZNONODE) {
        /* A record was stored (or its node deleted) since we read it:
         * nothing was created; read it, decide again, create again. */
        cerb__zk_closure_stale(e, &cs);
        *rc_create = CERB_ZK_RC_CLOSURE_CHANGED;
        st = cerb__zk_fail(e->hosts, "check", e->closure.path, rc_closure, true, NULL);
        goto out;
    }
    if (r->rc == ZNONODE && with_parents) {
        /* Say why a parent is missing, if one of ours was refused. */
        for (size_t i = 0; i < n_anc; i++)
            if (c->res[i].rc != ZOK && c->res[i].rc != ZNODEEXISTS) {
                *rc_create = c->res[i].rc;
                st = cerb__zk_fail(e->hosts, "create", anc[i], c->res[i].rc, c->res[i].sent,
                                   NULL);
                goto out;
            }
    }
    *ambiguous = r->sent && cerb__zk_rc_ambiguous(r->rc);
    st = cerb__zk_fail(e->hosts, "create", a->prefix, r->rc, r->sent, NULL);
out:
    for (size_t i = 0; i < n_anc; i++)
        cerb__free(anc[i]);
    cerb__zk_call_put(c);
    return st;
}

/* A new attempt: a new uuid, hence a new create path. */
static cerb_status new_uuid(struct acq *a)
{
    uuid_t u;
    uuid_generate_random(u);
    u[6] = (unsigned char)((u[6] & 0x0f) | (ZK_OUR_UUID_VERSION << 4)); /* ours */
    uuid_unparse_lower(u, a->p->uuid);
    cerb__free(a->prefix);
    a->prefix = cerb__zk_node_prefix_mark(a->parent, a->p->uuid, a->mark);
    if (!a->prefix)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", a->e->hosts);
    return CERB_OK;
}

/*
 * Create our node on session (gen, sid), settling lost replies.
 * CERB_OK with p->node set; or *restart when the session was lost (any
 * node of ours is gone with it, or left to the keeper); or an error.
 */
static cerb_status create_node(struct acq *a, uint64_t gen, int64_t sid, bool *restart)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    bool with_parents = false;
    int changes = 0;

    for (int round = 0;; round++) {
        int rcc;
        bool amb;
        cerb_status st = create_round(a, gen, with_parents, &rcc, &amb);
        if (st == CERB_OK)
            return CERB_OK;
        if (rcc == CERB_ZK_RC_FENCE_CHANGED || rcc == CERB_ZK_RC_CLOSURE_CHANGED) {
            /* Another client raised the offset or stored a record between
             * our reading and our create: not a round of trouble, but
             * bounded all the same. */
            if (++changes > ZK_MAX_CHECK_CHANGES || cerb_monotime() >= a->bound)
                return st;
            round--;
            continue;
        }
        if (round + 1 >= ZK_MAX_CREATE_ROUNDS) {
            if (amb)
                cerb__zk_reap_add(e, a->parent, NULL, p->uuid);
            return st;
        }
        if (rcc == ZNONODE && !amb) {
            with_parents = true; /* the parent is missing: make it */
            continue;
        }
        if (rcc == ZINVALIDSTATE || rcc == ZSESSIONEXPIRED || rcc == ZCLOSING) {
            /* The handle is expired or being closed. */
            if (amb)
                cerb__zk_reap_add(e, a->parent, NULL, p->uuid);
            *restart = true;
            return CERB_OK;
        }
        if (!amb)
            return st; /* the server refused: nothing happened */

        /* The create may have landed: wait for this session to come back
         * and look (again, should the connection drop while we look), as
         * long as the bound allows. */
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        char *node = NULL;
        uint64_t czxid = 0;
        for (int look = 0;; look++) {
            struct zk_state s2;
            cerb_status ws = cerb__zk_wait_connected(e, a->bound, NULL, gen, &s2);
            if (ws == CERB_NOT_OWNER) {
                /* Lost with the session; an old session's node may linger
                 * if we gave up before the server did: delete it by uuid. */
                cerb__zk_reap_add(e, a->parent, NULL, p->uuid);
                *restart = true;
                return CERB_OK;
            }
            if (ws == CERB_OK)
                st = cerb__zk_find_mine(e, gen, sid, a->parent, p->uuid, a->bound, &node,
                                        &czxid);
            if (ws == CERB_OK && st == CERB_OK)
                break;
            if (ws != CERB_OK || look >= ZK_MAX_CREATE_ROUNDS || cerb_monotime() >= a->bound) {
                /* Unsettled by the bound: the outcome is unknown. The core
                 * asks check_owner (which adopts the node or says it is not
                 * there) or releases it in the background by its uuid;
                 * deleting it here could delete a node check_owner is about
                 * to adopt. */
                a->unknown = true;
                return cerb__error_set(CERB_EIO, "%s (outcome unknown: not settled in time)",
                                       why);
            }
        }
        if (node) {
            set_node(e, p, node);
            p->czxid = czxid;
            p->gen = gen;
            a->listed = false;
            return CERB_OK;
        }
        /* It did not land: create again (nothing carries the uuid now). */
    }
}

/*
 * List the children again. CERB_OK with a->kids current; *restart when the
 * session was lost; or an error (the caller's deadline, an interrupt, a
 * refusal).
 */
static cerb_status relist(struct acq *a, uint64_t gen, bool *restart)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;

    for (;;) {
        cerb__zk_children_clear(&a->kids);
        a->listed = false;
        struct zk_call *c = cerb__zk_call_new(1);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        struct zk_session *s = cerb__zk_session_begin(e);
        int k = s && s->gen == gen
                    ? cerb__zk_call_children_mark(c, s, a->parent, -1,
                                                  cerb__zk_basename(p->node), NULL, a->order)
                    : -1;
        cerb__zk_session_end(e);
        int rc = k < 0 ? ZINVALIDSTATE
                 : cerb__zk_call_wait(c, cerb__zk_call_deadline(e, a->bound))
                     ? c->res[k].rc
                     : CERB_ZK_RC_ABANDONED;
        if (rc == ZOK) {
            a->kids = c->res[k].kids;
            memset(&c->res[k].kids, 0, sizeof c->res[k].kids);
        }
        bool sent = k >= 0 && c->res[k].sent;
        cerb__zk_call_put(c);
        ZK_COUNT(e, relists);
        if (rc == ZOK || rc == ZNONODE) {
            a->listed = true; /* NONODE: no parent, so no node of ours */
            return CERB_OK;
        }
        if (rc != ZINVALIDSTATE && rc != ZSESSIONEXPIRED && !cerb__zk_rc_ambiguous(rc))
            return cerb__zk_fail(e->hosts, "getChildren", a->parent, rc, sent, NULL);
        /* Connection trouble: wait for this session to come back, within
         * the bound (a server that stopped answering leaves the session
         * "connected" for seconds: no answer by the bound is a timeout). */
        struct zk_state st;
        cerb_status ws = cerb__zk_wait_connected(e, a->bound, a->intr, gen, &st);
        if (ws == CERB_NOT_OWNER) {
            *restart = true;
            return CERB_OK;
        }
        if (ws == CERB_OK && cerb_monotime() >= a->bound)
            ws = cerb__error_set(CERB_EIO, "zk %s: getChildren %s: no answer in time", e->hosts,
                                 a->parent);
        if (ws == CERB_EIO && a->deadline != 0)
            return cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out (disconnected)",
                                   a->lk->name);
        if (ws != CERB_OK)
            return ws;
    }
}

/* Set the watch on the predecessor (unless it is still set from before)
 * and sleep until something happens. */
static enum woke arm_and_wait(struct acq *a, uint64_t gen, cerb_status *err)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    struct zk_wait *wt = p->w;
    char *watch = cerb__zk_join(a->parent, a->rw == CERB_RW_READ ? a->kids.wpred : a->kids.pred);
    enum woke w;

    if (!watch) {
        *err = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        return W_ERROR;
    }
    cerb__mutex_lock(&e->mu);
    if (!wt->watch || strcmp(wt->watch, watch) != 0) {
        /* A new predecessor: learn about it anew. */
        wt->data_armed = wt->child_armed = wt->pred_ours = wt->pred_holds = false;
    }
    /* Watches still set from before (no event since) are kept; the data
     * watch is no use once we know the predecessor holds. */
    bool arm_data = !wt->data_armed && !wt->pred_holds;
    bool arm_child = !wt->child_armed;
    cerb__free(wt->watch);
    wt->watch = watch;
    wt->woken = false;
    wt->pred_event = 0;
    list_link(e, p, ZK_LIST_WAITING);
    uint64_t id = p->acq_id;
    cerb__mutex_unlock(&e->mu);

    if (arm_data || arm_child) {
        struct zk_call *c = cerb__zk_call_new(2);
        if (!c) {
            *err = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
            return W_ERROR;
        }
        struct zk_session *s = cerb__zk_session_begin(e);
        int kd = -1, kc = -1;
        if (s && s->gen == gen) {
            if (arm_data)
                kd = cerb__zk_call_wget(c, s, watch, lock_watcher, s, data_armed, p, id);
            if (arm_child)
                kc = cerb__zk_call_wchildren(c, s, watch, lock_watcher, s, child_armed, p, id);
        }
        cerb__zk_session_end(e);
        int k = kc >= 0 ? kc : kd; /* either answer tells whether it is there */
        int rc = k < 0 ? ZINVALIDSTATE
                 : cerb__zk_call_wait(c, cerb__zk_call_deadline(e, a->bound))
                     ? c->res[k].rc
                     : CERB_ZK_RC_ABANDONED;
        if (rc == ZOK && kd >= 0 && kc >= 0 && c->res[kd].rc != ZOK)
            rc = c->res[kd].rc; /* both must be set */
        bool sent = k >= 0 && c->res[k].sent;
        cerb__zk_call_put(c);
        if (rc == ZNONODE)
            return W_GONE;
        if (rc == ZINVALIDSTATE || rc == ZSESSIONEXPIRED || cerb__zk_rc_ambiguous(rc))
            return W_CONN;
        if (rc != ZOK) {
            *err = cerb__zk_fail(e->hosts, "watch", watch, rc, sent, NULL);
            return W_ERROR;
        }
    }

    cerb__mutex_lock(&e->mu);
    for (;;) {
        if (wt->woken) {
            w = wt->pred_event == ZOO_DELETED_EVENT   ? W_DELETED
                : wt->pred_event == ZOO_CHANGED_EVENT ? W_CHANGED
                                                      : W_OTHER;
            break;
        }
        if (e->gen_counter != gen) {
            w = W_SESSION;
            break;
        }
        if (a->intr && atomic_load(a->intr)) {
            w = W_INTR;
            break;
        }
        int64_t now = cerb_monotime();
        if (now >= a->deadline) {
            w = W_TIMEOUT;
            break;
        }
        cerb__cond_wait_until(&wt->cond, &e->mu,
                              min64(a->deadline, now + ZK_INTR_SLICE_MS * CERB_NS_PER_MS));
    }
    cerb__mutex_unlock(&e->mu);
    return w;
}

/* A mark is sent again at most this many times per hold. */
#define ZK_MARK_MAX_TRIES 5
/* The keeper sends at most this many marks per pass. */
#define ZK_MARK_BATCH 64

/*
 * The mark of hold `owner` (acquisition acq_id, session gen) did not land
 * (refused by the client, or answered with an error such as a connection
 * loss): have the keeper send it again while the hold lasts on that
 * session. Without the mark the successor only lists once more when we
 * release, so this is about speed, not safety. mu not held.
 */
static void mark_again(cerb_engine *e, const void *owner, uint64_t acq_id, uint64_t gen, int rc)
{
    bool again = false, held = false;
    ZK_COUNT(e, mark_failures);
    cerb__mutex_lock(&e->mu);
    for (struct zk_lock_priv *p = e->held; p; p = p->next)
        if (p == owner && p->acq_id == acq_id && p->gen == gen && !p->gone) {
            held = true;
            if (p->mark_tries < ZK_MARK_MAX_TRIES) {
                p->mark_pending = true;
                cerb__zk_keeper_poke_locked(e, ZK_PEND_MARK);
                again = true;
            }
            break;
        }
    cerb__mutex_unlock(&e->mu);
    if (held)
        CERB_LOG_W("zk %s: marking a held lock node for its successor failed: %s%s", e->hosts,
                   zerror(rc), again ? "; sent again when connected" : "");
}

/* A mark's answer (completion thread). NONODE: released meanwhile. */
static void mark_done(struct zk_res *r)
{
    if (r->rc == ZOK || r->rc == ZNONODE)
        return;
    mark_again(r->call->sess->e, r->owner, r->owner_id, r->call->sess->gen, r->rc);
}

/* Send the mark of hold p (node path `node`) on session s, whose handle
 * the caller keeps open. ZOK, or the client's refusal (for mark_again once
 * the handle is let go: it logs). */
static int mark_send(struct zk_session *s, const char *node, struct zk_lock_priv *p,
                     uint64_t acq_id)
{
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return ZOK; /* out of memory: the successor lists again */
    int k = cerb__zk_call_set(c, s, node, ZK_DATA_HOLDING, -1, mark_done, p, acq_id);
    int rc = c->res[k].sent ? ZOK : c->res[k].rc;
    cerb__zk_call_put(c); /* the completion frees it */
    return rc;
}

/*
 * Tell a successor we hold the lock (see the header): rewrite our node's
 * data, without waiting for the answer. Only when someone may be queued
 * behind us: we waited ourselves, or the listing shows a later child. One
 * that does not land is sent again by the keeper (mark_again).
 */
static void announce(struct acq *a, uint64_t gen)
{
    size_t after = a->kids.n_children - a->kids.n_lower - (a->kids.found_self ? 1 : 0);
    if (a->term || a->rw)
        return; /* a term's data is its value, and a reader that holds is
                   not first: successors list again, as Curator's */
    if (!a->waited && (!a->listed || after == 0))
        return;
    int rc = ZOK;
    struct zk_session *s = cerb__zk_session_begin(a->e);
    if (s && s->gen == gen) {
        ZK_COUNT(a->e, announces);
        rc = mark_send(s, a->p->node, a->p, a->p->acq_id);
    }
    cerb__zk_session_end(a->e);
    if (rc != ZOK)
        mark_again(a->e, a->p, a->p->acq_id, gen, rc);
}

void cerb__zk_marks_retry(cerb_engine *e)
{
    struct {
        struct zk_lock_priv *p;
        uint64_t acq_id;
        char *node;
        int rc;
    } todo[ZK_MARK_BATCH];
    size_t n = 0;
    uint64_t gen;

    cerb__mutex_lock(&e->mu);
    gen = e->gen_counter;
    for (struct zk_lock_priv *p = e->held; p && n < ZK_MARK_BATCH; p = p->next) {
        if (!p->mark_pending)
            continue;
        p->mark_pending = false;
        if (p->gone || p->gen != gen || !p->node)
            continue;
        todo[n].node = cerb__strdup(p->node);
        if (!todo[n].node)
            continue; /* out of memory: the successor lists again */
        todo[n].p = p;
        todo[n].acq_id = p->acq_id;
        p->mark_tries++;
        n++;
    }
    if (n == ZK_MARK_BATCH)
        e->pend |= ZK_PEND_MARK; /* more next pass */
    cerb__mutex_unlock(&e->mu);

    struct zk_session *s = cerb__zk_session_begin(e);
    for (size_t i = 0; i < n; i++) {
        todo[i].rc = ZOK;
        if (s && s->gen == gen) {
            ZK_COUNT(e, mark_retries);
            todo[i].rc = mark_send(s, todo[i].node, todo[i].p, todo[i].acq_id);
        }
        cerb__free(todo[i].node);
    }
    cerb__zk_session_end(e);
    for (size_t i = 0; i < n; i++)
        if (todo[i].rc != ZOK)
            mark_again(e, todo[i].p, todo[i].acq_id, gen, todo[i].rc);
}

/*
 * Is it our turn, by the latest listing? The mutex (and a term, and a
 * read-write lock's writer): nobody before us. A reader: no writer before
 * us (Curator's readLockPredicate). A reader waits on the last writer
 * before it (Curator watches the first: the last one leaves after all
 * those before it, in the usual case, so one wake-up suffices).
 */
static bool turn_now(const struct acq *a)
{
    return a->rw == CERB_RW_READ ? a->kids.n_wlower == 0 : a->kids.n_lower == 0;
}

/* When the one we watch went: was it the last obstacle? Sequence numbers
 * only grow, so nothing can come in before us: if it was the only child
 * (for a reader: the only writer) before ours, the turn is ours. */
static bool turn_after_deletion(const struct acq *a, const struct zk_wait *w)
{
    if (a->rw == CERB_RW_READ)
        return a->kids.n_wlower == 1;
    if (a->rw == CERB_RW_WRITE)
        return a->kids.n_lower == 1;
    return a->kids.n_lower == 1 || w->pred_holds;
}

/* We are first: the grant. *restart when the session went meanwhile. */
static cerb_status grant(struct acq *a, uint64_t gen, cerb_grant *g, bool *restart)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    struct zk_state st;

    cerb__mutex_lock(&e->mu);
    cerb__zk_state_locked(e, &st);
    if (st.gen != gen) {
        cerb__mutex_unlock(&e->mu);
        *restart = true;
        return CERB_OK;
    }
    p->gone = false;
    list_link(e, p, ZK_LIST_HELD);
    hb_sooner_locked(e, a->lk);
    cerb__mutex_unlock(&e->mu);
    announce(a, gen);

    g->fence = hold_fence(p);
    /* Answered after our create was sent, so never 0 here. */
    g->sent_ns = st.last_ok_ns ? st.last_ok_ns : cerb_monotime();
    g->ttl_ms = grant_ttl(&st, a->lk);
    g->outcome = CERB_OUTCOME_YES;
    ZK_COUNT(e, grants);
    return CERB_OK;
}

/* Leave: delete our node (or have the keeper do it), return `st` with its
 * message. The outcome is NO either way: nothing of ours will hold. */
static cerb_status give_up(struct acq *a, cerb_status st, cerb_grant *g)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    char why[CERB_ERROR_MAX];

    cerb__error_copy(why, sizeof why);
    cerb__mutex_lock(&e->mu);
    list_unlink(e, p);
    cerb__mutex_unlock(&e->mu);
    if (p->node) {
        if (cerb__zk_remove(e, a->parent, p->node, NULL, cleanup_deadline(a)) ==
            ZK_REMOVE_FAILED)
            CERB_LOG_W("%s", cerb_last_error());
        drop_node(e, p);
    }
    g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(st, "%s", why);
}

/* The queue: steps 3–5 of the algorithm. */
static cerb_status wait_turn(struct acq *a, uint64_t gen, cerb_grant *g, bool *restart)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    cerb_status st;

    for (;;) {
        if (!a->listed) {
            st = relist(a, gen, restart);
            if (st != CERB_OK)
                return give_up(a, st, g);
            if (*restart)
                return CERB_OK;
        }
        if (!a->kids.found_self) {
            /* Our node went while our session lives: someone deleted it. */
            CERB_LOG_W("zk %s: our lock node %s disappeared while waiting", e->hosts, p->node);
            drop_node(e, p);
            *restart = true;
            return CERB_OK;
        }
        if (turn_now(a))
            return grant(a, gen, g, restart);
        if (a->deadline == 0) {
            st = cerb__error_set(CERB_BUSY, "zk %s: \"%s\" is held by another owner", e->hosts,
                                 a->lk->name);
            return give_up(a, st, g);
        }
        cerb_status err = CERB_OK;
        a->waited = true;
        enum woke w = arm_and_wait(a, gen, &err);
        bool first;
        switch (w) {
        case W_DELETED:
        case W_GONE:
            /* Our predecessor went: if it was first, ours now (see the
             * header). */
            cerb__mutex_lock(&e->mu);
            first = turn_after_deletion(a, p->w);
            cerb__mutex_unlock(&e->mu);
            if (first) {
                ZK_COUNT(e, quick_grants);
                return grant(a, gen, g, restart);
            }
            a->listed = false;
            break;
        case W_CHANGED:
            break; /* not used: data changes do not wake */
        case W_OTHER:
        case W_CONN:
            a->listed = false; /* relist waits for the connection */
            break;
        case W_SESSION:
            *restart = true;
            return CERB_OK;
        case W_TIMEOUT:
            st = cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out", a->lk->name);
            return give_up(a, st, g);
        case W_INTR:
            st = cerb__error_set(CERB_INTERRUPTED, "wait for \"%s\" interrupted", a->lk->name);
            return give_up(a, st, g);
        case W_ERROR:
            return give_up(a, err, g);
        }
    }
}

static cerb_status acquire_flow(struct acq *a, cerb_grant *g)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    cerb_status st;

    for (int attempt = 0;; attempt++) {
        struct zk_state ss;
        bool restart = false;

        if (attempt > 0) {
            /* The previous attempt's session is gone. Any node of it that
             * outlives our giving up is deleted by path (or by uuid). */
            if (p->node) {
                cerb__zk_reap_add(e, a->parent, p->node, NULL);
                drop_node(e, p);
            }
            if (attempt > ZK_MAX_RESTARTS || (a->deadline != 0 && cerb_monotime() >= a->deadline) ||
                (a->deadline == 0 && attempt > 1))
                return cerb__error_set(CERB_EIO, "zk %s: the session was lost while acquiring "
                                       "\"%s\"",
                                       e->hosts, a->lk->name);
        }
        cerb__mutex_lock(&e->mu);
        p->w->data_armed = p->w->child_armed = false;
        p->w->pred_ours = p->w->pred_holds = false;
        cerb__free(p->w->watch);
        p->w->watch = NULL;
        cerb__mutex_unlock(&e->mu);
        st = new_uuid(a);
        if (st != CERB_OK)
            return st;
        st = cerb__zk_wait_connected(e, conn_deadline(a), a->intr, 0, &ss);
        if (st != CERB_OK)
            return st;
        st = create_node(a, ss.gen, ss.id, &restart);
        if (st != CERB_OK)
            return st;
        if (restart)
            continue;
        st = wait_turn(a, ss.gen, g, &restart);
        if (st != CERB_OK || !restart)
            return st;
    }
}

cerb_status cerb__zk_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant_out)
{
    struct zk_lock_priv *p = lk->priv;
    struct acq a = {.e = e, .lk = lk, .p = p, .deadline = deadline_ns, .intr = interrupted,
                    .mark = cerb__zk_lock_mark(lk), .term = lk->prim == CERB_PRIM_ELECTION};
    a.rw = lk->prim == CERB_PRIM_RWLOCK ? lk->variant : 0;
    a.order = a.rw ? ZK_RW_ORDER : a.mark;
    a.bound = op_bound(e, deadline_ns);
    struct zk_wait *w = cerb__calloc(1, sizeof *w);
    cerb_status st;

    grant_out->outcome = CERB_OUTCOME_NO;
    grant_out->closed_epoch = 0;
    a.parent = cerb__zk_parent_path(e->zc->root, lk->name);
    if (!w || !a.parent) {
        cerb__free(w);
        cerb__free(a.parent);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }
    cerb__cond_init(&w->cond);
    cerb__mutex_lock(&e->mu);
    list_unlink(e, p);
    p->lk = lk;
    p->node = NULL;
    p->gone = false;
    p->reaped = false;
    p->acq_id = atomic_fetch_add(&e->stats.acq_ids, 1) + 1;
    p->w = w;
    cerb__mutex_unlock(&e->mu);

    st = acquire_flow(&a, grant_out);

    cerb__mutex_lock(&e->mu);
    if (p->list == ZK_LIST_WAITING)
        list_unlink(e, p);
    p->w = NULL;
    cerb__mutex_unlock(&e->mu);
    cerb__cond_destroy(&w->cond);
    cerb__free(w->watch);
    cerb__free(w);
    cerb__free(a.prefix);
    cerb__free(a.parent);
    cerb__zk_children_clear(&a.kids);
    if (st != CERB_OK) {
        drop_node(e, p);
        grant_out->closed_epoch = a.closed_epoch;
        if (a.unknown)
            grant_out->outcome = CERB_OUTCOME_UNKNOWN; /* check or release by uuid */
        else
            p->uuid[0] = '\0'; /* nothing to check or release */
    }
    return st;
}

/* ---- cancel, renew, release, check ---- */

void cerb__zk_op_cancel(cerb_engine *e, cerb_engine_lock *lk)
{
    struct zk_lock_priv *p = lk->priv;
    if (!p)
        return;
    cerb__mutex_lock(&e->mu);
    if (p->w) {
        p->w->cancelled = true;
        cerb__cond_signal(&p->w->cond);
    }
    if (p->inner && p->inner->w) { /* a semaphore taking its locks/ mutex */
        p->inner->w->cancelled = true;
        cerb__cond_signal(&p->inner->w->cond);
    }
    cerb__mutex_unlock(&e->mu);
}

cerb_status cerb__zk_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    struct zk_lock_priv *p = lk->priv;
    struct zk_state st;
    bool gone;

    cerb__mutex_lock(&e->mu);
    cerb__zk_state_locked(e, &st);
    gone = p->gone || !p->node || p->gen != st.gen;
    cerb__mutex_unlock(&e->mu);
    if (gone)
        return cerb__error_set(CERB_NOT_OWNER, "zk %s: the session or the lock node of \"%s\" "
                               "is gone",
                               e->hosts, lk->name);
    if (!st.connected)
        return cerb__error_set(CERB_EIO, "zk %s: disconnected; the session may expire",
                               e->hosts);
    g->fence = hold_fence(p);
    g->sent_ns = st.last_ok_ns;
    g->ttl_ms = grant_ttl(&st, lk);
    g->outcome = CERB_OUTCOME_YES;
    return CERB_OK;
}

cerb_status cerb__zk_op_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct zk_lock_priv *p = lk->priv;
    cerb_status st;
    bool gone;

    cerb__mutex_lock(&e->mu);
    list_unlink(e, p);
    gone = p->gone || p->gen != e->gen_counter;
    cerb__mutex_unlock(&e->mu);
    if (p->reaped)
        return cerb__error_set(CERB_EIO, "zk %s: the lock node of \"%s\" is deleted when the "
                               "session reconnects",
                               e->hosts, lk->name);
    if (!p->uuid[0])
        return cerb__error_set(CERB_NOT_OWNER, "zk %s: \"%s\" is not held", e->hosts, lk->name);
    char *parent = cerb__zk_parent_path(e->zc->root, lk->name);
    if (!parent)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);

    int64_t dl = cleanup_deadline_at(e, 0);
    enum zk_removed r = cerb__zk_remove(e, parent, p->node, p->node ? NULL : p->uuid, dl);
    switch (r) {
    case ZK_REMOVED:
        st = gone || !p->node ? cerb__error_set(CERB_NOT_OWNER, "zk %s: the session of \"%s\" "
                                                "had been lost",
                                                e->hosts, lk->name)
                              : CERB_OK;
        break;
    case ZK_REMOVED_NONODE:
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: the lock node of \"%s\" was gone",
                             e->hosts, lk->name);
        break;
    case ZK_REMOVED_LATER:
        p->reaped = true;
        st = cerb__error_set(CERB_EIO, "zk %s: not connected; the lock node of \"%s\" is "
                             "deleted when the session reconnects",
                             e->hosts, lk->name);
        break;
    case ZK_REMOVE_FAILED:
    default:
        p->reaped = true;
        st = CERB_EIO; /* message set by cerb__zk_remove */
        break;
    }
    drop_node(e, p);
    p->uuid[0] = '\0';
    cerb__free(parent);
    return st;
}

cerb_status cerb__zk_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    struct zk_lock_priv *p = lk->priv;
    struct zk_state ss;
    cerb_status st;

    if (!p->uuid[0])
        return cerb__error_set(CERB_NOT_OWNER, "zk %s: no acquisition of \"%s\" to check",
                               e->hosts, lk->name);
    struct acq a = {.e = e, .lk = lk, .p = p, .deadline = 0, .mark = cerb__zk_lock_mark(lk),
                    .term = lk->prim == CERB_PRIM_ELECTION};
    a.rw = lk->prim == CERB_PRIM_RWLOCK ? lk->variant : 0;
    a.order = a.rw ? ZK_RW_ORDER : a.mark;
    a.bound = op_bound(e, 0);
    st = cerb__zk_wait_connected(e, a.bound, NULL, 0, &ss);
    if (st != CERB_OK)
        return st;
    a.parent = cerb__zk_parent_path(e->zc->root, lk->name);
    if (!a.parent)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (p->node && p->gen != ss.gen) {
        /* A node of a session we gave up: not a hold; make sure it goes. */
        cerb__zk_remove(e, a.parent, p->node, NULL, cerb__deadline_in(0));
        drop_node(e, p);
    }
    if (!p->node) {
        char *node = NULL;
        uint64_t czxid = 0;
        st = cerb__zk_find_mine(e, ss.gen, ss.id, a.parent, p->uuid, a.bound, &node, &czxid);
        if (st != CERB_OK) {
            cerb__free(a.parent);
            return st;
        }
        if (!node)
            goto not_owner;
        set_node(e, p, node);
        p->czxid = czxid;
        p->gen = ss.gen;
    }

    bool restart = false;
    st = relist(&a, ss.gen, &restart);
    if (st != CERB_OK) {
        cerb__zk_children_clear(&a.kids);
        cerb__free(a.parent);
        return st;
    }
    bool first = !restart && a.kids.found_self && turn_now(&a);
    bool queued = !restart && a.kids.found_self && !turn_now(&a);
    cerb__zk_children_clear(&a.kids);
    if (first) {
        cerb__mutex_lock(&e->mu);
        cerb__zk_state_locked(e, &ss);
        p->gone = false;
        list_link(e, p, ZK_LIST_HELD);
        hb_sooner_locked(e, lk);
        cerb__mutex_unlock(&e->mu);
        g->fence = hold_fence(p);
        g->sent_ns = ss.last_ok_ns;
        g->ttl_ms = grant_ttl(&ss, lk);
        g->outcome = CERB_OUTCOME_YES;
        cerb__free(a.parent);
        return CERB_OK;
    }
    if (queued) /* in the queue but not first: nobody waits on it, leave */
        cerb__zk_remove(e, a.parent, p->node, NULL, cleanup_deadline_at(e, a.bound));
not_owner:
    drop_node(e, p);
    p->uuid[0] = '\0';
    cerb__free(a.parent);
    return cerb__error_set(CERB_NOT_OWNER, "zk %s: \"%s\" is not held by this owner", e->hosts,
                           lk->name);
}
