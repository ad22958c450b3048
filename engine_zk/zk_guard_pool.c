/*
 * zk_guard_pool.c — the guard's extra ZooKeeper sessions (zk_guard_pool.h).
 *
 * A guard begin or finish that starts while another of this client's is
 * under way counts an overlap; after ZK_GUARD_POOL_OVERLAPS of them the
 * extra sessions are opened (a client that uses the guard from one thread,
 * like `cerberus once`, keeps its one connection). A record's requests then
 * go to the session its id picks (ids are SHA-256, so the picks spread
 * evenly), or to the client's own while that one is not connected. An
 * extra session that expired, failed authentication, or stayed
 * disconnected for a session timeout is closed by the sweeper (tend); the
 * next overlaps open it again, ZK_GUARD_POOL_RETRY_MS later at the
 * earliest, so a server that refuses connections (maxClientCnxns) is not
 * asked again and again (within a session timeout the C client itself
 * retries a connection it was refused).
 */
#include "internal_posix.h"

#include "zk_guard_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "sync.h"

/* The most sessions the guard uses (the schema's limit of
 * zk.guard_sessions). */
#define ZK_GUARD_POOL_MAX 4
/* Overlapping calls seen before the extra sessions are opened. */
#define ZK_GUARD_POOL_OVERLAPS 32
/* After an extra session was closed or could not be made: this long
 * before the next is opened. */
#define ZK_GUARD_POOL_RETRY_MS 5000

struct pool_slot {
    _Atomic(struct zk_session *) s; /* written under the write lock */
    atomic_bool up;                 /* connected (its watcher) */
    atomic_bool dead;               /* expired or refused: close it */
    _Atomic int64_t down_ns;        /* monotonic, since not connected; 0 up */
};

struct zk_guard_pool {
    cerb_engine *e;
    int n;                          /* extra sessions allowed */
    pthread_rwlock_t lock;
    cerb_mutex mu;                  /* opening, closing */
    atomic_bool opening;            /* a caller is opening them */
    atomic_int n_open;              /* slots with a session */
    atomic_int active;              /* begin / finish calls under way */
    atomic_uint overlaps;
    _Atomic int64_t retry_ns;       /* no opening before (monotonic) */
    struct pool_slot slot[ZK_GUARD_POOL_MAX - 1];
};

struct zk_guard_pool *cerb__zk_guard_pool_new(cerb_engine *e)
{
    struct zk_guard_pool *p = cerb__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->e = e;
    p->n = e->zc->guard_sessions - 1;
    if (p->n > ZK_GUARD_POOL_MAX - 1)
        p->n = ZK_GUARD_POOL_MAX - 1;
    if (p->n < 0)
        p->n = 0;
    pthread_rwlock_init(&p->lock, NULL);
    cerb__mutex_init(&p->mu);
    atomic_init(&p->opening, false);
    atomic_init(&p->n_open, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->overlaps, 0);
    atomic_init(&p->retry_ns, 0);
    for (int i = 0; i < ZK_GUARD_POOL_MAX - 1; i++) {
        atomic_init(&p->slot[i].s, NULL);
        atomic_init(&p->slot[i].up, false);
        atomic_init(&p->slot[i].dead, false);
        atomic_init(&p->slot[i].down_ns, 0);
    }
    return p;
}

/* The C client's events for an extra session (its completion thread); the
 * session's gen is its slot. Only atomics: no lock is taken here, so
 * closing a session (which waits for this thread) holds nothing it needs.
 * A slot's session is closed (its threads gone) before the slot is opened
 * again, so no event of an earlier session reaches a later one; one from
 * a session being closed finds the slot empty, which pool_begin checks. */
static void pool_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh;
    (void)path;
    struct zk_session *s = ctx;
    if (type != ZOO_SESSION_EVENT)
        return;
    struct pool_slot *sl = &s->e->gpool->slot[s->gen];
    if (state == ZOO_CONNECTED_STATE) {
        atomic_store(&sl->down_ns, 0);
        atomic_store(&sl->up, true);
        return;
    }
    atomic_store(&sl->up, false);
    int64_t zero = 0;
    atomic_compare_exchange_strong(&sl->down_ns, &zero, cerb_monotime());
    if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE)
        atomic_store(&sl->dead, true);
}

/* Open the extra sessions not open (mu held). */
static void open_locked(struct zk_guard_pool *p)
{
    for (int i = 0; i < p->n; i++) {
        if (atomic_load(&p->slot[i].s))
            continue;
        struct zk_session *s = NULL;
        atomic_store(&p->slot[i].up, false);
        atomic_store(&p->slot[i].dead, false);
        atomic_store(&p->slot[i].down_ns, cerb_monotime());
        if (cerb__zk_session_open(p->e, (uint64_t)i, pool_watcher, &s) != CERB_OK) {
            char why[256];
            cerb__error_copy(why, sizeof why);
            CERB_LOG_W("zk %s: the guard's extra session: %s", p->e->hosts, why);
            atomic_store(&p->retry_ns, cerb_monotime() + ZK_GUARD_POOL_RETRY_MS * CERB_NS_PER_MS);
            break;
        }
        pthread_rwlock_wrlock(&p->lock);
        atomic_store(&p->slot[i].s, s);
        pthread_rwlock_unlock(&p->lock);
        atomic_fetch_add(&p->n_open, 1);
    }
}

/* Take slot i's session out, then close it (mu held; never on the
 * session's own threads). */
static void close_slot_locked(struct zk_guard_pool *p, int i)
{
    pthread_rwlock_wrlock(&p->lock);
    struct zk_session *s = atomic_exchange(&p->slot[i].s, NULL);
    atomic_store(&p->slot[i].up, false);
    pthread_rwlock_unlock(&p->lock);
    if (!s)
        return;
    atomic_fetch_sub(&p->n_open, 1);
    cerb__zk_session_close(s);
}

void cerb__zk_guard_pool_free(struct zk_guard_pool *p)
{
    if (!p)
        return;
    cerb__mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++)
        close_slot_locked(p, i);
    cerb__mutex_unlock(&p->mu);
    cerb__mutex_destroy(&p->mu);
    pthread_rwlock_destroy(&p->lock);
    cerb__free(p);
}

void cerb__zk_guard_pool_enter(struct zk_guard_pool *p)
{
    /* One session only: nothing to count (n never changes). */
    if (p->n == 0 || atomic_fetch_add_explicit(&p->active, 1, memory_order_relaxed) == 0 ||
        atomic_load_explicit(&p->n_open, memory_order_relaxed) == p->n)
        return;
    if (atomic_fetch_add(&p->overlaps, 1) + 1 < ZK_GUARD_POOL_OVERLAPS ||
        cerb_monotime() < atomic_load(&p->retry_ns) || atomic_exchange(&p->opening, true))
        return;
    /* This caller opens (zookeeper_init only starts the client's threads;
     * the connection is made in the background); the others go on. */
    cerb__mutex_lock(&p->mu);
    open_locked(p);
    cerb__mutex_unlock(&p->mu);
    atomic_store(&p->opening, false);
}

void cerb__zk_guard_pool_leave(struct zk_guard_pool *p)
{
    if (p->n > 0) /* as enter counted */
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_relaxed);
}

/* The session index a record id picks: 0 the client's, i > 0 slot i - 1. */
static unsigned pick(const struct zk_guard_pool *p, const char *id)
{
    /* FNV-1a over the hex id: ids are SHA-256, so any mix spreads them. */
    uint32_t h = 2166136261u;
    for (const char *c = id; *c; c++)
        h = (h ^ (unsigned char)*c) * 16777619u;
    return h % (unsigned)(p->n + 1);
}

struct zk_session *cerb__zk_guard_pool_begin(struct zk_guard_pool *p, const char *id, int *slot)
{
    *slot = -1;
    if (p->n > 0 && atomic_load_explicit(&p->n_open, memory_order_relaxed) > 0) {
        unsigned t = pick(p, id);
        if (t > 0 && atomic_load_explicit(&p->slot[t - 1].up, memory_order_relaxed)) {
            pthread_rwlock_rdlock(&p->lock);
            struct zk_session *s = atomic_load(&p->slot[t - 1].s);
            if (s) {
                *slot = (int)t - 1;
                return s;
            }
            pthread_rwlock_unlock(&p->lock);
        }
    }
    return cerb__zk_session_begin(p->e);
}

void cerb__zk_guard_pool_end(struct zk_guard_pool *p, int slot)
{
    if (slot >= 0)
        pthread_rwlock_unlock(&p->lock);
    else
        cerb__zk_session_end(p->e);
}

void cerb__zk_guard_pool_tend(struct zk_guard_pool *p)
{
    int64_t now = cerb_monotime();
    int64_t limit = p->e->zc->session_timeout_ms * CERB_NS_PER_MS;
    bool closed = false;
    for (int i = 0; i < p->n; i++) {
        struct pool_slot *sl = &p->slot[i];
        int64_t down = atomic_load(&sl->down_ns);
        bool stale = down != 0 && now - down > limit;
        if (!atomic_load(&sl->s) || (!atomic_load(&sl->dead) && !stale))
            continue;
        cerb__mutex_lock(&p->mu);
        CERB_LOG_I("zk %s: the guard's extra session %d %s; opened again when needed",
                   p->e->hosts, i + 1,
                   atomic_load(&sl->dead) ? "ended" : "stayed disconnected");
        close_slot_locked(p, i);
        atomic_store(&sl->dead, false);
        cerb__mutex_unlock(&p->mu);
        closed = true;
    }
    if (closed) {
        atomic_store(&p->overlaps, 0);
        atomic_store(&p->retry_ns, now + ZK_GUARD_POOL_RETRY_MS * CERB_NS_PER_MS);
    }
}
