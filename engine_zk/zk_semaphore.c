/*
 * zk_semaphore.c — semaphores on ZooKeeper in Apache Curator's
 * InterProcessSemaphoreV2 layout (DESIGN.md §16, docs/semaphore.md), so a
 * Curator service and a Cerberus one count the same permits:
 *
 *   <root>/<name>/locks/_c_<uuid>-lock-<seq>    a Curator InterProcessMutex
 *                                               (zk_mutex.c) that lines the
 *                                               acquirers up
 *   <root>/<name>/leases/_c_<uuid>-lease-<seq>  one EPHEMERAL_SEQUENTIAL node
 *                                               per permit held
 *   <root>/<name>/count                         the stored limit: a Curator
 *                                               SharedCount (4-byte big-endian)
 *
 * Acquire of k permits:
 *  1. Take the locks/ mutex, with everything the mutex does (a create
 *     checked against the fence offset and, with an epoch, the closure
 *     record; a lost reply settled; the predecessor watched; the wait
 *     bounded by the caller's deadline). Only its holder creates leases, so
 *     acquirers are served in arrival order and a big request is not
 *     passed by small ones behind it.
 *  2. Holding it, compare the stored limit (count) with the caller's: the
 *     node is created with the caller's limit when missing; a different
 *     one is CERB_ECONFIG (grant->no_prim), unless nobody holds a lease and
 *     nobody else queues on locks/: then the semaphore is not in use and
 *     takes the caller's limit (a versioned setData).
 *  3. Create k lease nodes (Curator creates one per lease; ours share the
 *     uuid of our locks/ node, so an inspection can tell them apart and a
 *     release deletes them by uuid), pipelined in batches, with a watched
 *     listing of leases/ behind them in the same round trip. A reply lost
 *     to a connection loss is settled by listing leases/ and counting the
 *     nodes with our uuid (only this acquisition, on this session, made
 *     them).
 *  4. While leases/ has more children than the limit, wait for its child
 *     watch (the one holder of locks/ waits there: one watch, no herd) and
 *     list again; a trylock gives up at once.
 *  5. Release the locks/ mutex, after a failure once our leases are
 *     deleted (or handed to the keeper: an orphan lease only counts as a
 *     holder until it is deleted or its session ends, never lets anyone
 *     in).
 * The outcome of a failed acquire is never UNKNOWN: the grant is decided
 * here from a listing we read, and a lease node whose create reply was lost
 * is deleted by uuid.
 *
 * The fence is the czxid of our first lease node plus the fence offset our
 * locks/ create checked (zk_fence.c). Lease nodes are created only by the
 * holder of locks/, after it was granted that mutex and before it releases
 * it, and the offset only grows, so successive grants of a name get
 * strictly growing fences; a raise for a floor lands before our locks/
 * create, and our lease nodes come later still, so the fence exceeds it.
 *
 * A permit lives as long as the session, as a lock does: renew is the
 * mutex's (zk_mutex.c, no I/O), and the hold is on the engine's held list
 * with its first lease node, which the keeper checks after a reconnect.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_mutex.h"

#define SEM_LOCKS "locks"
#define SEM_LEASES "leases"
#define SEM_COUNT "count"
/* The data of our lease nodes (Curator's: the holder's address). */
#define SEM_LEASE_DATA "cerb:permit"
/* Lease creates sent in one round trip. */
#define SEM_BATCH 64
/* Attempts after a lost session; rounds of reading the limit or creating
 * leases when replies get lost or someone writes in between. */
#define SEM_MAX_RESTARTS 10
#define SEM_MAX_ROUNDS 8
/* Deleting our leases when leaving, at least this long. */
#define SEM_CLEANUP_GRACE_MS 200

struct sem_paths {
    char *base;   /* <root>/<name> */
    char *locks;  /* <root>/<name>/locks */
    char *leases; /* <root>/<name>/leases */
    char *count;  /* <root>/<name>/count */
};

static void paths_free(struct sem_paths *sp)
{
    cerb__free(sp->base);
    cerb__free(sp->locks);
    cerb__free(sp->leases);
    cerb__free(sp->count);
    memset(sp, 0, sizeof *sp);
}

static cerb_status paths_make(cerb_engine *e, const char *name, struct sem_paths *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->base = cerb__zk_parent_path(e->zc->root, name);
    if (sp->base) {
        sp->locks = cerb__zk_join(sp->base, SEM_LOCKS);
        sp->leases = cerb__zk_join(sp->base, SEM_LEASES);
        sp->count = cerb__zk_join(sp->base, SEM_COUNT);
    }
    if (!sp->base || !sp->locks || !sp->leases || !sp->count) {
        paths_free(sp);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }
    return CERB_OK;
}

/* How long to go on deleting our leases when leaving (see zk_mutex.c's
 * cleanup_deadline_at): not at all while disconnected (the keeper does it). */
static int64_t cleanup_deadline(cerb_engine *e, int64_t base)
{
    struct zk_state st;
    cerb__zk_state(e, &st);
    if (!st.connected)
        return cerb_monotime();
    if (base == 0 || base == CERB_DEADLINE_NEVER)
        return cerb__deadline_in(e->zc->connect_timeout_ms);
    int64_t g = cerb__deadline_in(SEM_CLEANUP_GRACE_MS);
    return base > g ? base : g;
}

/* One acquire() call. */
struct sem {
    cerb_engine *e;
    cerb_engine_lock *lk;
    struct zk_lock_priv *p;
    struct sem_paths sp;
    char *locks_name;      /* "<name>/locks": the inner mutex's name */
    char *prefix;          /* <leases>/_c_<uuid>-lease- */
    int64_t deadline, bound;
    const atomic_int *intr;
    cerb_engine_lock mlk;  /* the locks/ mutex hold */
    struct zk_lock_priv mx;
    bool mx_held;
    char uuid[ZK_UUID_LEN + 1]; /* our locks/ node's, and our leases' */
    uint64_t offset;       /* the fence offset our locks/ create checked */
    uint64_t gen;
    int64_t sid;
    bool leases_sent;      /* a lease create of ours may have landed */
    unsigned have;         /* our lease nodes on the server */
    uint64_t czxid;        /* the lowest czxid among them */
    char *first;           /* that node's path */
    bool restart;          /* the session was lost: start over */
};

static uint32_t be32(const char *b)
{
    const unsigned char *u = (const unsigned char *)b;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

static void put_be32(char *b, uint32_t v)
{
    b[0] = (char)(v >> 24);
    b[1] = (char)(v >> 16);
    b[2] = (char)(v >> 8);
    b[3] = (char)v;
}

/* After an unanswered or lost request on our session: wait for it to come
 * back (CERB_OK), or note the loss (a->restart, CERB_OK), or fail. */
static cerb_status reconnect(struct sem *a)
{
    struct zk_state st;
    cerb_status ws = cerb__zk_wait_connected(a->e, a->bound, a->intr, a->gen, &st);
    if (ws == CERB_NOT_OWNER) {
        a->restart = true;
        return CERB_OK;
    }
    if (ws == CERB_OK && cerb_monotime() >= a->bound)
        ws = cerb__error_set(CERB_EIO, "zk %s: no answer in time", a->e->hosts);
    if (ws == CERB_EIO && a->deadline != 0)
        return cerb__error_set(CERB_TIMEOUT, "wait for semaphore \"%s\" timed out "
                                             "(disconnected)",
                               a->lk->name);
    return ws;
}

static bool transient(int rc)
{
    return rc == ZINVALIDSTATE || rc == ZSESSIONEXPIRED || cerb__zk_rc_ambiguous(rc);
}

/* ---- step 2: the stored limit ---- */

static cerb_status mismatch(struct sem *a, const char *what, cerb_grant *g)
{
    g->no_prim = 1;
    return cerb__error_set(CERB_ECONFIG, "zk %s: semaphore \"%s\": %s %s, this caller asks %lld",
                           a->e->hosts, a->lk->name, a->sp.count, what, (long long)a->lk->limit);
}

static cerb_status check_limit(struct sem *a, cerb_grant *g)
{
    cerb_engine *e = a->e;
    char want[4];
    put_be32(want, (uint32_t)a->lk->limit);

    for (int round = 0; round < SEM_MAX_ROUNDS; round++) {
        struct zk_call *c = cerb__zk_call_new(3);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        struct zk_session *s = cerb__zk_session_begin(e);
        int kd = -1, kl = -1, kk = -1;
        if (s && s->gen == a->gen) {
            kd = cerb__zk_call_getdata(c, s, a->sp.count);
            kl = cerb__zk_call_list(c, s, a->sp.locks);
            kk = cerb__zk_call_list(c, s, a->sp.leases);
        }
        cerb__zk_session_end(e);
        if (kd < 0) {
            cerb__zk_call_put(c);
            a->restart = true;
            return CERB_OK;
        }
        bool sent;
        int rc = cerb__zk_call_wait_rc(e, c, kk, a->bound, &sent);
        int rcd = c->res[kd].rc, rcl = c->res[kl].rc;
        if (rc == ZNONODE)
            rc = ZOK; /* no leases/ yet: nobody holds */
        if (rc == ZOK && rcl != ZOK)
            rc = rcl;
        if (rc == ZOK && rcd != ZOK && rcd != ZNONODE)
            rc = rcd;
        if (rc != ZOK) {
            cerb__zk_call_put(c);
            if (!transient(rc) && rc != CERB_ZK_RC_ABANDONED)
                return cerb__zk_fail(e->hosts, "read limit", a->sp.count, rc, sent, NULL);
            cerb_status st = reconnect(a);
            if (st != CERB_OK || a->restart)
                return st;
            continue;
        }
        /* Not in use: only our locks/ node, and no lease. */
        bool idle = c->res[kl].n_names <= 1 && c->res[kk].n_names == 0;
        int version = c->res[kd].stat.version;
        int len = c->res[kd].data_len;
        uint32_t stored = rcd == ZOK && len == 4 ? be32(c->res[kd].buf) : 0;
        cerb__zk_call_put(c);
        if (rcd == ZOK && len == 4 && stored == (uint32_t)a->lk->limit)
            return CERB_OK;
        if (rcd == ZOK && !idle) {
            char what[96];
            if (len == 4)
                snprintf(what, sizeof what, "stores a limit of %" PRIu32 " (in use)", stored);
            else
                snprintf(what, sizeof what, "holds %d bytes, not a 4-byte count", len);
            return mismatch(a, what, g);
        }
        /* Missing: create it; or not in use: take the caller's limit. */
        c = cerb__zk_call_new(1);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        s = cerb__zk_session_begin(e);
        int k = -1;
        if (s && s->gen == a->gen) {
            if (rcd == ZNONODE) {
                zoo_op_t op;
                zoo_create_op_init(&op, a->sp.count, want, 4, &e->acl, ZOO_PERSISTENT, NULL, 0);
                k = cerb__zk_call_multi(c, s, &op, 1);
            } else {
                k = cerb__zk_call_set_bytes(c, s, a->sp.count, want, 4, version, NULL, NULL, 0);
            }
        }
        cerb__zk_session_end(e);
        rc = cerb__zk_call_wait_rc(e, c, k, a->bound, &sent);
        cerb__zk_call_put(c);
        if (rc == ZOK) {
            if (rcd == ZOK)
                CERB_LOG_I("zk %s: semaphore \"%s\" was not in use: its limit is now %lld",
                           e->hosts, a->lk->name, (long long)a->lk->limit);
            return CERB_OK;
        }
        if (rc == ZNODEEXISTS || rc == ZBADVERSION || rc == ZNONODE)
            continue; /* someone wrote meanwhile: read again */
        if (!transient(rc) && rc != CERB_ZK_RC_ABANDONED)
            return cerb__zk_fail(e->hosts, "store limit", a->sp.count, rc, sent, NULL);
        cerb_status st = reconnect(a);
        if (st != CERB_OK || a->restart)
            return st;
    }
    return cerb__error_set(CERB_EIO, "zk %s: semaphore \"%s\": the limit node %s keeps changing",
                           e->hosts, a->lk->name, a->sp.count);
}

/* ---- step 3: the lease nodes ---- */

/* A lease node of ours came to light (its path and czxid). */
static cerb_status note_lease(struct sem *a, const char *path, uint64_t czxid)
{
    a->have++;
    cerb__zk_fence_seen(a->e, (int64_t)czxid);
    if (!a->first || czxid < a->czxid) {
        char *f = cerb__strdup(path);
        if (!f)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", a->e->hosts);
        cerb__free(a->first);
        a->first = f;
        a->czxid = czxid;
    }
    return CERB_OK;
}

/* A create's reply was lost: count our nodes (the uuid's) and learn their
 * czxids. */
static cerb_status settle_leases(struct sem *a)
{
    cerb_engine *e = a->e;
    for (int round = 0; round < SEM_MAX_ROUNDS; round++) {
        cerb_status st = reconnect(a);
        if (st != CERB_OK || a->restart)
            return st;
        struct zk_call *c = cerb__zk_call_new(1);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        struct zk_session *s = cerb__zk_session_begin(e);
        int k = s && s->gen == a->gen ? cerb__zk_call_list(c, s, a->sp.leases) : -1;
        cerb__zk_session_end(e);
        bool sent;
        int rc = cerb__zk_call_wait_rc(e, c, k, a->bound, &sent);
        if (rc == ZNONODE) {
            cerb__zk_call_put(c);
            a->have = 0;
            return CERB_OK;
        }
        if (rc != ZOK) {
            cerb__zk_call_put(c);
            if (!transient(rc) && rc != CERB_ZK_RC_ABANDONED)
                return cerb__zk_fail(e->hosts, "getChildren", a->sp.leases, rc, sent, NULL);
            continue;
        }
        size_t n = 0;
        for (int i = 0; i < c->res[k].n_names; i++)
            n += cerb__zk_child_has_uuid(c->res[k].names[i], a->uuid);
        struct zk_call *c2 = n ? cerb__zk_call_new(n) : NULL;
        char **paths = n ? cerb__calloc(n, sizeof *paths) : NULL;
        if (n && (!c2 || !paths)) {
            cerb__zk_call_put(c2);
            cerb__free(paths);
            cerb__zk_call_put(c);
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        }
        size_t j = 0;
        for (int i = 0; i < c->res[k].n_names && j < n; i++)
            if (cerb__zk_child_has_uuid(c->res[k].names[i], a->uuid))
                paths[j++] = cerb__zk_join(a->sp.leases, c->res[k].names[i]);
        cerb__zk_call_put(c);
        st = CERB_OK;
        for (j = 0; j < n; j++)
            if (!paths[j])
                st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        bool again = false;
        if (st == CERB_OK && n) {
            s = cerb__zk_session_begin(e);
            bool ok = s && s->gen == a->gen;
            for (j = 0; ok && j < n; j++)
                cerb__zk_call_exists(c2, s, paths[j]);
            cerb__zk_session_end(e);
            if (!ok || !cerb__zk_call_wait(c2, cerb__zk_call_deadline(e, a->bound))) {
                again = true;
            } else {
                a->have = 0;
                cerb__free(a->first);
                a->first = NULL;
                for (j = 0; j < n && st == CERB_OK; j++) {
                    const struct zk_res *r = &c2->res[j];
                    if (r->rc == ZOK)
                        st = note_lease(a, paths[j], (uint64_t)r->stat.czxid);
                    else if (r->rc != ZNONODE)
                        again = true;
                }
            }
        } else if (st == CERB_OK) {
            a->have = 0;
        }
        for (j = 0; j < n; j++)
            cerb__free(paths[j]);
        cerb__free(paths);
        cerb__zk_call_put(c2);
        if (st != CERB_OK || !again)
            return st;
    }
    return cerb__error_set(CERB_EIO, "zk %s: semaphore \"%s\": could not count our leases",
                           e->hosts, a->lk->name);
}

static cerb_status make_leases(struct sem *a)
{
    cerb_engine *e = a->e;
    bool parent_sent = false;

    for (int round = 0; a->have < a->lk->count; round++) {
        if (round >= SEM_MAX_ROUNDS || cerb_monotime() >= a->bound)
            return cerb__error_set(CERB_EIO, "zk %s: semaphore \"%s\": leases not created in "
                                             "time",
                                   e->hosts, a->lk->name);
        unsigned n = a->lk->count - a->have;
        if (n > SEM_BATCH)
            n = SEM_BATCH;
        struct zk_call *c = cerb__zk_call_new(n + 1);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        struct zk_session *s = cerb__zk_session_begin(e);
        int k0 = -1;
        if (s && s->gen == a->gen) {
            /* leases/ as a CONTAINER (the server removes it once empty);
             * Curator makes it persistent: either way it is there. */
            if (!parent_sent)
                cerb__zk_call_create(c, s, a->sp.leases, NULL, &e->acl, ZOO_CONTAINER);
            for (unsigned i = 0; i < n; i++) {
                int k = cerb__zk_call_create(c, s, a->prefix, SEM_LEASE_DATA, &e->acl,
                                             ZOO_EPHEMERAL_SEQUENTIAL);
                if (i == 0)
                    k0 = k;
            }
        }
        cerb__zk_session_end(e);
        if (k0 < 0) {
            cerb__zk_call_put(c);
            a->restart = true;
            return CERB_OK;
        }
        parent_sent = true;
        a->leases_sent = true;
        bool answered = cerb__zk_call_wait(c, cerb__zk_call_deadline(e, a->bound));
        bool doubt = !answered, nonode = false;
        cerb_status st = CERB_OK;
        for (unsigned i = 0; answered && i < n && st == CERB_OK; i++) {
            const struct zk_res *r = &c->res[k0 + (int)i];
            if (r->rc == ZOK)
                st = note_lease(a, r->path, (uint64_t)r->stat.czxid);
            else if (r->rc == ZNONODE)
                nonode = true; /* leases/ removed between our two creates */
            else if (r->sent && cerb__zk_rc_ambiguous(r->rc))
                doubt = true;
            else if (r->rc == ZINVALIDSTATE || r->rc == ZSESSIONEXPIRED)
                a->restart = true;
            else
                st = cerb__zk_fail(e->hosts, "create", a->prefix, r->rc, r->sent, NULL);
        }
        cerb__zk_call_put(c);
        if (st != CERB_OK || a->restart)
            return st;
        if (nonode)
            parent_sent = false;
        if (doubt) {
            st = settle_leases(a);
            if (st != CERB_OK || a->restart)
                return st;
        }
    }
    return CERB_OK;
}

/* ---- step 4: the wait for room ---- */

/* The child watch on leases/ (the C client's completion thread): wake the
 * waiter of this engine that set it (routed by path, as zk_mutex.c's
 * lock_watcher; one waiter per name and client: the holder of locks/). */
static void lease_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_session *s = ctx;
    cerb_engine *e = s->e;
    (void)zh;
    (void)state;
    if (type != ZOO_CHILD_EVENT || !path)
        return;
    cerb__mutex_lock(&e->mu);
    if (s->gen == e->gen_counter)
        for (struct zk_lock_priv *p = e->waiting; p; p = p->next) {
            struct zk_wait *w = p->w;
            if (!w || p->gen != s->gen || !w->watch || strcmp(w->watch, path) != 0)
                continue;
            w->woken = true;
            ZK_COUNT(e, wakeups);
            cerb__cond_signal(&w->cond);
        }
    cerb__mutex_unlock(&e->mu);
}

/* List leases/ with a child watch until there is room for us. */
static cerb_status wait_room(struct sem *a, struct zk_wait *w)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;

    for (;;) {
        cerb__mutex_lock(&e->mu);
        w->woken = false;
        cerb__mutex_unlock(&e->mu);
        struct zk_call *c = cerb__zk_call_new(1);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        struct zk_session *s = cerb__zk_session_begin(e);
        int k = s && s->gen == a->gen ? cerb__zk_call_wchildren(c, s, a->sp.leases,
                                                                lease_watcher, s, NULL, p,
                                                                p->acq_id)
                                      : -1;
        cerb__zk_session_end(e);
        bool sent;
        int rc = cerb__zk_call_wait_rc(e, c, k, a->bound, &sent);
        if (rc == ZOK) {
            size_t n = (size_t)c->res[k].n_names, mine = 0;
            for (size_t i = 0; i < n; i++)
                mine += cerb__zk_child_has_uuid(c->res[k].names[i], a->uuid);
            cerb__zk_call_put(c);
            if (mine < a->have) {
                /* Our leases went while our session lives: someone deleted
                 * them (Curator: "Sequential path not found"). */
                CERB_LOG_W("zk %s: semaphore \"%s\": our lease nodes disappeared", e->hosts,
                           a->lk->name);
                a->restart = true;
                return CERB_OK;
            }
            if ((int64_t)n <= a->lk->limit)
                return CERB_OK;
            if (a->deadline == 0)
                return cerb__error_set(CERB_BUSY, "zk %s: semaphore \"%s\": no %u permits free",
                                       e->hosts, a->lk->name, a->lk->count);
        } else {
            cerb__zk_call_put(c);
            if (k < 0 || rc == ZINVALIDSTATE || rc == ZSESSIONEXPIRED) {
                a->restart = true;
                return CERB_OK;
            }
            if (!transient(rc) && rc != CERB_ZK_RC_ABANDONED && rc != ZNONODE)
                return cerb__zk_fail(e->hosts, "getChildren", a->sp.leases, rc, sent, NULL);
            if (rc == ZNONODE) {
                a->restart = true; /* leases/ gone, and ours with it */
                return CERB_OK;
            }
            cerb_status st = reconnect(a);
            if (st != CERB_OK || a->restart)
                return st;
            continue;
        }
        /* Sleep until the watch fires, the session changes, the caller
         * gives up; the interrupt flag is looked at every slice. */
        cerb__mutex_lock(&e->mu);
        cerb_status st = CERB_OK;
        for (;;) {
            if (w->woken)
                break;
            if (e->gen_counter != a->gen) {
                a->restart = true;
                break;
            }
            if (a->intr && atomic_load(a->intr)) {
                st = CERB_INTERRUPTED;
                break;
            }
            int64_t now = cerb_monotime();
            if (now >= a->deadline) {
                st = CERB_TIMEOUT;
                break;
            }
            int64_t until = now + ZK_INTR_SLICE_MS * CERB_NS_PER_MS;
            cerb__cond_wait_until(&w->cond, &e->mu, a->deadline < until ? a->deadline : until);
        }
        cerb__mutex_unlock(&e->mu);
        if (st == CERB_INTERRUPTED)
            return cerb__error_set(st, "wait for semaphore \"%s\" interrupted", a->lk->name);
        if (st == CERB_TIMEOUT)
            return cerb__error_set(st, "wait for semaphore \"%s\" timed out", a->lk->name);
        if (a->restart)
            return CERB_OK;
    }
}

/* ---- the acquisition ---- */

/* Leave: our leases deleted (or left to the keeper), then locks/ released. */
static void leave(struct sem *a)
{
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    if (a->uuid[0] && a->leases_sent) {
        if (a->restart)
            cerb__zk_reap_add(a->e, a->sp.leases, NULL, a->uuid);
        else if (cerb__zk_remove(a->e, a->sp.leases, NULL, a->uuid,
                                 cleanup_deadline(a->e, a->deadline == 0 ? a->bound
                                                                         : a->deadline)) ==
                 ZK_REMOVE_FAILED)
            CERB_LOG_W("%s", cerb_last_error());
    }
    a->leases_sent = false;
    a->have = 0;
    cerb__free(a->first);
    a->first = NULL;
    if (a->mx_held) {
        cerb_status st = cerb__zk_op_release(a->e, &a->mlk);
        if (st != CERB_OK && st != CERB_NOT_OWNER)
            CERB_LOG_I("zk %s: semaphore \"%s\": releasing locks/: %s", a->e->hosts,
                       a->lk->name, cerb_last_error());
        a->mx_held = false;
    }
    cerb__error_set(CERB_OK, "%s", why);
}

static cerb_status grant(struct sem *a, cerb_grant *g)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    struct zk_state st;

    cerb__mutex_lock(&e->mu);
    cerb__zk_state_locked(e, &st);
    if (st.gen != a->gen) {
        cerb__mutex_unlock(&e->mu);
        a->restart = true;
        return CERB_OK;
    }
    char *old = p->node;
    p->node = a->first;
    a->first = NULL;
    p->gen = a->gen;
    p->czxid = a->czxid;
    p->offset = a->offset;
    memcpy(p->uuid, a->uuid, sizeof p->uuid);
    p->gone = false;
    cerb__zk_list_link_locked(e, p, ZK_LIST_HELD);
    cerb__mutex_unlock(&e->mu);
    cerb__free(old);
    a->have = 0; /* the hold's now */
    a->leases_sent = false;
    g->fence = p->czxid + p->offset;
    g->sent_ns = st.last_ok_ns ? st.last_ok_ns : cerb_monotime();
    g->ttl_ms = cerb__zk_grant_ttl(&st, a->lk);
    g->outcome = CERB_OUTCOME_YES;
    ZK_COUNT(e, grants);
    return CERB_OK;
}

/* One attempt on the current session: steps 1 to 5. */
static cerb_status attempt(struct sem *a, struct zk_wait *w, cerb_grant *g)
{
    cerb_engine *e = a->e;
    struct zk_lock_priv *p = a->p;
    cerb_grant mg = {0};
    cerb_status st;

    memset(&a->mx, 0, sizeof a->mx);
    memset(&a->mlk, 0, sizeof a->mlk);
    a->mlk.name = a->locks_name;
    memcpy(a->mlk.token, a->lk->token, sizeof a->mlk.token);
    a->mlk.lease_ms = a->lk->lease_ms;
    a->mlk.priv = &a->mx;
    a->mlk.fence_floor = a->lk->fence_floor;
    a->mlk.epoch = a->lk->epoch;
    a->mlk.prim = CERB_PRIM_MUTEX;
    a->uuid[0] = '\0';
    a->restart = false;

    cerb__mutex_lock(&e->mu);
    p->inner = &a->mx;
    cerb__mutex_unlock(&e->mu);
    st = cerb__zk_op_acquire(e, &a->mlk, a->deadline, a->intr, &mg);
    cerb__mutex_lock(&e->mu);
    p->inner = NULL;
    cerb__mutex_unlock(&e->mu);
    if (st != CERB_OK) {
        g->closed_epoch = mg.closed_epoch;
        if (mg.outcome == CERB_OUTCOME_UNKNOWN) /* delete it by its uuid */
            cerb__zk_op_release(e, &a->mlk);
        return st;
    }
    a->mx_held = true;
    memcpy(a->uuid, a->mx.uuid, sizeof a->uuid);
    a->offset = a->mx.offset;
    a->gen = a->mx.gen;
    struct zk_state ss;
    cerb__zk_state(e, &ss);
    a->sid = ss.id;
    if (ss.gen != a->gen) {
        a->restart = true;
        leave(a);
        return CERB_OK;
    }
    cerb__free(a->prefix);
    a->prefix = cerb__zk_node_prefix_mark(a->sp.leases, a->uuid, ZK_LEASE_MARK);
    if (!a->prefix) {
        leave(a);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }

    st = check_limit(a, g);
    if (st == CERB_OK && !a->restart)
        st = make_leases(a);
    if (st == CERB_OK && !a->restart) {
        cerb__mutex_lock(&e->mu);
        p->gen = a->gen;
        p->w = w;
        cerb__free(w->watch);
        w->watch = cerb__strdup(a->sp.leases);
        if (w->watch)
            cerb__zk_list_link_locked(e, p, ZK_LIST_WAITING);
        cerb__mutex_unlock(&e->mu);
        st = w->watch ? wait_room(a, w)
                      : cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        cerb__mutex_lock(&e->mu);
        cerb__zk_list_unlink_locked(e, p);
        p->w = NULL;
        cerb__mutex_unlock(&e->mu);
    }
    if (st == CERB_OK && !a->restart)
        st = grant(a, g);
    leave(a); /* our leases too, unless granted */
    return st;
}

static cerb_status sem_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                               const atomic_int *interrupted, cerb_grant *g)
{
    struct zk_lock_priv *p = lk->priv;
    struct sem a = {.e = e, .lk = lk, .p = p, .deadline = deadline_ns, .intr = interrupted};
    a.bound = deadline_ns != 0 ? deadline_ns : cerb__deadline_in(e->zc->connect_timeout_ms);
    struct zk_wait *w = cerb__calloc(1, sizeof *w);
    cerb_status st = paths_make(e, lk->name, &a.sp);
    size_t nl = strlen(lk->name);

    g->outcome = CERB_OUTCOME_NO;
    g->closed_epoch = 0;
    if (st == CERB_OK && (!w || !(a.locks_name = cerb__malloc(nl + sizeof "/" SEM_LOCKS))))
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (st != CERB_OK) {
        cerb__free(w);
        paths_free(&a.sp);
        return st;
    }
    memcpy(a.locks_name, lk->name, nl);
    memcpy(a.locks_name + nl, "/" SEM_LOCKS, sizeof "/" SEM_LOCKS);
    cerb__cond_init(&w->cond);
    cerb__mutex_lock(&e->mu);
    cerb__zk_list_unlink_locked(e, p);
    p->lk = lk;
    p->gone = p->reaped = false;
    p->uuid[0] = '\0';
    p->acq_id = atomic_fetch_add(&e->stats.acq_ids, 1) + 1;
    cerb__mutex_unlock(&e->mu);

    for (int n = 0;; n++) {
        st = attempt(&a, w, g);
        if (st != CERB_OK || !a.restart)
            break;
        if (n >= SEM_MAX_RESTARTS || (deadline_ns != 0 && cerb_monotime() >= deadline_ns) ||
            deadline_ns == 0) {
            st = cerb__error_set(CERB_EIO, "zk %s: the session was lost while acquiring "
                                           "semaphore \"%s\"",
                                 e->hosts, lk->name);
            break;
        }
    }
    if (st != CERB_OK)
        g->outcome = CERB_OUTCOME_NO; /* nothing of ours holds: leases deleted */
    cerb__cond_destroy(&w->cond);
    cerb__free(w->watch);
    cerb__free(w);
    cerb__free(a.prefix);
    cerb__free(a.first);
    cerb__free(a.locks_name);
    paths_free(&a.sp);
    return st;
}

/* ---- release, check_owner, held ---- */

static cerb_status sem_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct zk_lock_priv *p = lk->priv;
    struct sem_paths sp;
    bool gone;

    cerb__mutex_lock(&e->mu);
    cerb__zk_list_unlink_locked(e, p);
    gone = p->gone || p->gen != e->gen_counter;
    cerb__mutex_unlock(&e->mu);
    if (p->reaped)
        return cerb__error_set(CERB_EIO, "zk %s: the leases of \"%s\" are deleted when the "
                                         "session reconnects",
                               e->hosts, lk->name);
    if (!p->uuid[0])
        return cerb__error_set(CERB_NOT_OWNER, "zk %s: semaphore \"%s\": no permit held",
                               e->hosts, lk->name);
    cerb_status st = paths_make(e, lk->name, &sp);
    if (st != CERB_OK)
        return st;
    enum zk_removed r = cerb__zk_remove(e, sp.leases, NULL, p->uuid, cleanup_deadline(e, 0));
    switch (r) {
    case ZK_REMOVED:
        st = gone ? cerb__error_set(CERB_NOT_OWNER, "zk %s: the session of semaphore \"%s\" "
                                                    "had been lost",
                                    e->hosts, lk->name)
                  : CERB_OK;
        break;
    case ZK_REMOVED_NONODE:
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: the leases of \"%s\" were gone", e->hosts,
                             lk->name);
        break;
    case ZK_REMOVED_LATER:
        p->reaped = true;
        st = cerb__error_set(CERB_EIO, "zk %s: not connected; the leases of \"%s\" are "
                                       "deleted when the session reconnects",
                             e->hosts, lk->name);
        break;
    case ZK_REMOVE_FAILED:
    default:
        p->reaped = true;
        st = CERB_EIO;
        break;
    }
    cerb__mutex_lock(&e->mu);
    char *node = p->node;
    p->node = NULL;
    cerb__mutex_unlock(&e->mu);
    cerb__free(node);
    p->uuid[0] = '\0';
    paths_free(&sp);
    return st;
}

static cerb_status sem_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    struct zk_lock_priv *p = lk->priv;
    struct zk_state ss;

    if (!p->uuid[0])
        return cerb__error_set(CERB_NOT_OWNER, "zk %s: no permit of \"%s\" to check", e->hosts,
                               lk->name);
    int64_t bound = cerb__deadline_in(e->zc->connect_timeout_ms);
    cerb_status st = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&e->mu);
    char *node = p->node && !p->gone && p->gen == ss.gen ? cerb__strdup(p->node) : NULL;
    cerb__mutex_unlock(&e->mu);
    if (node) {
        struct zk_call *c = cerb__zk_call_new(1);
        if (!c) {
            cerb__free(node);
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        }
        struct zk_session *s = cerb__zk_session_begin(e);
        int k = s && s->gen == ss.gen ? cerb__zk_call_exists(c, s, node) : -1;
        cerb__zk_session_end(e);
        bool sent;
        int rc = cerb__zk_call_wait_rc(e, c, k, bound, &sent);
        bool mine = rc == ZOK && c->res[k].stat.ephemeralOwner == ss.id;
        cerb__zk_call_put(c);
        if (rc != ZOK && rc != ZNONODE) {
            st = cerb__zk_fail(e->hosts, "exists", node, rc, sent, NULL);
            cerb__free(node);
            return st;
        }
        cerb__free(node);
        if (mine) {
            cerb__zk_state(e, &ss);
            g->fence = p->czxid + p->offset;
            g->sent_ns = ss.last_ok_ns;
            g->ttl_ms = cerb__zk_grant_ttl(&ss, lk);
            g->outcome = CERB_OUTCOME_YES;
            return CERB_OK;
        }
    }
    /* Not granted (or gone): nothing of ours may stay. */
    struct sem_paths sp;
    if (paths_make(e, lk->name, &sp) == CERB_OK) {
        cerb__zk_remove(e, sp.leases, NULL, p->uuid, cleanup_deadline(e, bound));
        paths_free(&sp);
    }
    cerb__mutex_lock(&e->mu);
    cerb__zk_list_unlink_locked(e, p);
    node = p->node;
    p->node = NULL;
    cerb__mutex_unlock(&e->mu);
    cerb__free(node);
    p->uuid[0] = '\0';
    return cerb__error_set(CERB_NOT_OWNER, "zk %s: semaphore \"%s\": no permit of this owner",
                           e->hosts, lk->name);
}

/* Any lease, or anyone queued on locks/ (who may be granted at any moment,
 * and whose create may predate a closure record: zk_session.c's held). */
static cerb_status sem_held(cerb_engine *e, const char *name)
{
    struct sem_paths sp;
    struct zk_state zs;
    cerb__zk_state(e, &zs);
    if (!zs.connected)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    cerb_status st = paths_make(e, name, &sp);
    if (st != CERB_OK)
        return st;
    struct zk_call *c = cerb__zk_call_new(2);
    if (!c) {
        paths_free(&sp);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }
    struct zk_session *s = cerb__zk_session_begin(e);
    int k1 = s ? cerb__zk_call_list(c, s, sp.leases) : -1;
    int k2 = s ? cerb__zk_call_list(c, s, sp.locks) : -1;
    cerb__zk_session_end(e);
    bool sent;
    int rc = cerb__zk_call_wait_rc(e, c, k1, cerb__deadline_in(e->zc->connect_timeout_ms),
                                   &sent);
    int rc2 = k2 >= 0 ? c->res[k2].rc : rc;
    if ((rc == ZOK || rc == ZNONODE) && (rc2 == ZOK || rc2 == ZNONODE))
        st = (rc == ZOK && c->res[k1].n_names > 0) || (rc2 == ZOK && c->res[k2].n_names > 0)
                 ? cerb__error_set(CERB_BUSY, "zk %s: semaphore \"%s\" is held", e->hosts, name)
                 : CERB_OK;
    else
        st = cerb__zk_fail(e->hosts, "held: children", sp.leases, rc != ZOK && rc != ZNONODE
                                                                      ? rc
                                                                      : rc2,
                           sent, NULL);
    cerb__zk_call_put(c);
    paths_free(&sp);
    return st;
}

const struct cerb_queue_methods cerb__zk_semaphore = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = sem_acquire,
    .renew = cerb__zk_op_renew,
    .release = sem_release,
    .check_owner = sem_check,
    .held = sem_held,
    .inspect = cerb__zk_sem_inspect,
};
