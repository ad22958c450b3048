/*
 * zk_guard_pool.c — the guard's extra ZooKeeper sessions (zk_guard_pool.h).
 *
 * A guard call that finds requests of this client already out on its own
 * session counts an overlap; after ZK_GUARD_POOL_OVERLAPS of them the extra
 * sessions are opened (a client that uses the guard from one thread, like
 * `cerberus once`, keeps its one connection). Calls then take the sessions
 * in turn, skipping any not connected. An extra session that expires or
 * fails authentication is closed by the sweeper (tend) and opened again by
 * the next overlap; meanwhile its turns go to the client's session.
 */
#include "internal_posix.h"

#include "zk_guard_pool.h"

#include <pthread.h>
#include <stdatomic.h>

#include "alloc.h"
#include "log.h"
#include "sync.h"

/* The most sessions the guard uses (the schema's limit of
 * zk.guard_sessions). */
#define ZK_GUARD_POOL_MAX 4
/* Overlapping calls seen before the extra sessions are opened. */
#define ZK_GUARD_POOL_OVERLAPS 32

struct pool_slot {
    _Atomic(struct zk_session *) s; /* written under the write lock */
    atomic_bool up;                 /* connected (its watcher) */
    atomic_bool dead;               /* expired or refused: close it */
};

struct zk_guard_pool {
    cerb_engine *e;
    int n;                          /* extra sessions allowed */
    pthread_rwlock_t lock;
    cerb_mutex mu;                  /* opening, closing */
    atomic_bool opened;
    atomic_bool opening;            /* a thread is opening them */
    atomic_uint overlaps;
    atomic_uint turn;
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
    atomic_init(&p->opened, false);
    atomic_init(&p->opening, false);
    atomic_init(&p->overlaps, 0);
    atomic_init(&p->turn, 0);
    for (int i = 0; i < ZK_GUARD_POOL_MAX - 1; i++) {
        atomic_init(&p->slot[i].s, NULL);
        atomic_init(&p->slot[i].up, false);
        atomic_init(&p->slot[i].dead, false);
    }
    return p;
}

/* The C client's events for an extra session (its completion thread). The
 * session's gen is its slot. Only atomics: no lock is taken here, so
 * closing a session (which waits for this thread) holds nothing it needs. */
static void pool_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh;
    (void)path;
    struct zk_session *s = ctx;
    if (type != ZOO_SESSION_EVENT)
        return;
    /* A slot's session is closed (its threads gone) before the slot is
     * opened again, so no event of an earlier session reaches a later one;
     * one from a session being closed finds the slot empty, which
     * pool_begin checks. */
    struct pool_slot *sl = &s->e->gpool->slot[s->gen];
    if (state == ZOO_CONNECTED_STATE) {
        atomic_store(&sl->up, true);
    } else {
        atomic_store(&sl->up, false);
        if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE)
            atomic_store(&sl->dead, true);
    }
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
        if (cerb__zk_session_open(p->e, (uint64_t)i, pool_watcher, &s) != CERB_OK) {
            char why[256];
            cerb__error_copy(why, sizeof why);
            CERB_LOG_W("zk %s: the guard's extra session: %s", p->e->hosts, why);
            break;
        }
        pthread_rwlock_wrlock(&p->lock);
        atomic_store(&p->slot[i].s, s);
        pthread_rwlock_unlock(&p->lock);
    }
    atomic_store(&p->opened, true);
}

/* Take slot i's session out, then close it (mu held; never on the
 * session's own threads). */
static void close_slot_locked(struct zk_guard_pool *p, int i)
{
    pthread_rwlock_wrlock(&p->lock);
    struct zk_session *s = atomic_exchange(&p->slot[i].s, NULL);
    atomic_store(&p->slot[i].up, false);
    pthread_rwlock_unlock(&p->lock);
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

/* Requests of this client out on its own session: another call overlaps. */
static bool main_busy(cerb_engine *e)
{
    bool busy = false;
    struct zk_session *s = cerb__zk_session_begin(e);
    if (s) {
        cerb__mutex_lock(&s->out_mu);
        busy = s->outstanding != NULL;
        cerb__mutex_unlock(&s->out_mu);
    }
    cerb__zk_session_end(e);
    return busy;
}

struct zk_session *cerb__zk_guard_pool_begin(struct zk_guard_pool *p, int *slot)
{
    *slot = -1;
    if (p->n > 0 && !atomic_load_explicit(&p->opened, memory_order_acquire) &&
        main_busy(p->e) && atomic_fetch_add(&p->overlaps, 1) + 1 >= ZK_GUARD_POOL_OVERLAPS &&
        !atomic_exchange(&p->opening, true)) {
        /* One thread opens; the others go on on the client's session. */
        cerb__mutex_lock(&p->mu);
        if (!atomic_load(&p->opened))
            open_locked(p);
        cerb__mutex_unlock(&p->mu);
        atomic_store(&p->opening, false);
    }
    if (p->n > 0 && atomic_load_explicit(&p->opened, memory_order_acquire)) {
        unsigned t = atomic_fetch_add_explicit(&p->turn, 1, memory_order_relaxed) %
                     (unsigned)(p->n + 1);
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
    bool any = false;
    for (int i = 0; i < p->n; i++)
        any = any || atomic_load(&p->slot[i].dead);
    if (!any)
        return;
    cerb__mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) {
        if (!atomic_load(&p->slot[i].dead))
            continue;
        CERB_LOG_I("zk %s: the guard's extra session %d ended; opened again when needed",
                   p->e->hosts, i + 1);
        close_slot_locked(p, i);
        atomic_store(&p->slot[i].dead, false);
    }
    /* The next overlaps open them again. */
    atomic_store(&p->overlaps, 0);
    atomic_store(&p->opened, false);
    cerb__mutex_unlock(&p->mu);
}

int cerb__zk_guard_pool_open_count(struct zk_guard_pool *p)
{
    int n = 0;
    for (int i = 0; p && i < p->n; i++)
        n += atomic_load(&p->slot[i].s) != NULL;
    return n;
}
