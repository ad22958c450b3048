/*
 * rwlock.c — read-write locks (DESIGN.md §16): each mode is a lock handle.
 *
 * The writer side is one private lock handle (a slot of its own, prim
 * CERB_PRIM_RWLOCK, variant CERB_RW_WRITE): cerb_lock_lock() on it gives
 * the thread reentrancy, the deadline, the switch gate, claims, settling,
 * the fence, renewal and loss exactly as a lock's. Readers are many at
 * once, so each thread that reads gets a private handle of its own
 * (variant CERB_RW_READ), made at its first read and freed when it stops
 * reading; a process's readers are each a member of the server's queue,
 * which is what keeps the order first come first served across processes
 * (a reader behind a waiting writer waits, wherever either runs).
 *
 * Reads inside the thread's own write are counted on its reader entry
 * (`nested`) without a server call: the writer's hold already excludes
 * everybody. A thread that reads cannot write (its writer would wait
 * behind its own reader): refused at once instead of deadlocking.
 *
 * Lock order: rw->mu (the reader list) before a handle's slot mutex, and
 * only for a look (the free's); no lock call, which may wait, is made
 * under it. The callback (cb_mu) is a leaf the watchdog reads under a slot
 * mutex.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"

#define CERB_RWLOCK_MAGIC 0x52574c4bu /* "RWLK" */

struct rw_reader {
    uint64_t tid;
    cerb_lock *h;      /* the thread's reader handle, NULL while it only nests */
    unsigned nested;   /* reads taken inside the thread's write */
    struct rw_reader *next;
};

struct cerb_rwlock {
    atomic_uint magic;
    cerb_client *c;
    char *name;
    cerb_lock_opts lo;
    cerb_lock *writer;
    cerb_mutex mu;                 /* readers */
    struct rw_reader *readers;
    cerb_mutex cb_mu;              /* a leaf: cb, cb_ud */
    void (*cb)(cerb_rwlock *, void *);
    void *cb_ud;
};

static bool rw_ok(const cerb_rwlock *rw)
{
    return rw && atomic_load(&((cerb_rwlock *)rw)->magic) == CERB_RWLOCK_MAGIC;
}

static cerb_status bad(const char *what)
{
    return cerb__error_set(CERB_EINVAL, "%s: bad read-write lock", what);
}

static cerb_status handle_new(cerb_rwlock *rw, int mode, cerb_lock **out)
{
    cerb_status st = cerb__lock_new_private(rw->c, rw->name, &rw->lo, CERB_PRIM_RWLOCK, out);
    if (st == CERB_OK) {
        (*out)->variant = mode;
        (*out)->rwlock = rw;
    }
    return st;
}

cerb_status cerb_rwlock_new(cerb_client *c, const char *name, const cerb_rwlock_opts *opts,
                            cerb_rwlock **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_rwlock_new: out is NULL");
    *out = NULL;
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_rwlock_new");
    cerb_rwlock_opts o = CERB_RWLOCK_OPTS_INIT;
    if (opts)
        o = *opts;
    cerb_rwlock *rw = cerb__calloc(1, sizeof *rw);
    if (!rw || !(rw->name = cerb__strdup(name ? name : ""))) {
        cerb__free(rw);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    rw->c = c;
    rw->lo = (cerb_lock_opts)CERB_LOCK_OPTS_INIT;
    rw->lo.lease_ms = o.lease_ms;
    rw->lo.renew = 1;
    rw->lo.fair = 1;
    /* The writer's handle checks the name and options, as a lock's. */
    cerb_status st = name ? handle_new(rw, CERB_RW_WRITE, &rw->writer)
                          : cerb__error_set(CERB_EINVAL, "lock name is NULL");
    if (st != CERB_OK) {
        cerb__free(rw->name);
        cerb__free(rw);
        return st;
    }
    cerb__mutex_init(&rw->mu);
    cerb__mutex_init(&rw->cb_mu);
    atomic_store(&rw->magic, CERB_RWLOCK_MAGIC);
    *out = rw;
    return CERB_OK;
}

/* The calling thread's reader entry; NULL when it has none. */
static struct rw_reader *reader_find(cerb_rwlock *rw, uint64_t me)
{
    cerb__mutex_lock(&rw->mu);
    struct rw_reader *r = rw->readers;
    while (r && r->tid != me)
        r = r->next;
    cerb__mutex_unlock(&rw->mu);
    return r;
}

/* The calling thread's entry, made when missing (only this thread makes or
 * drops its own, so no other can race it). */
static cerb_status reader_get(cerb_rwlock *rw, uint64_t me, struct rw_reader **out)
{
    struct rw_reader *r = reader_find(rw, me);
    if (!r) {
        r = cerb__calloc(1, sizeof *r);
        if (!r)
            return cerb__error_set(CERB_ENOMEM, "out of memory");
        r->tid = me;
        cerb__mutex_lock(&rw->mu);
        r->next = rw->readers;
        rw->readers = r;
        cerb__mutex_unlock(&rw->mu);
    }
    *out = r;
    return CERB_OK;
}

/* Drop the calling thread's entry when it neither reads nor nests. */
static void reader_trim(cerb_rwlock *rw, struct rw_reader *r)
{
    if (r->nested > 0 || (r->h && cerb_lock_hold_count(r->h) > 0))
        return;
    cerb__mutex_lock(&rw->mu);
    struct rw_reader **pp = &rw->readers;
    while (*pp != r)
        pp = &(*pp)->next;
    *pp = r->next;
    cerb__mutex_unlock(&rw->mu);
    if (r->h)
        cerb_lock_free(r->h);
    cerb__free(r);
}

/* wait_ms: -1 without limit, 0 one try, else the longest wait. A new
 * hold (not a reentry) is counted for the metrics. */
static cerb_status take(cerb_rwlock *rw, cerb_lock *h, int64_t wait_ms)
{
    cerb_status st = wait_ms < 0    ? cerb_lock_lock(h)
                     : wait_ms == 0 ? cerb_lock_trylock(h)
                                    : cerb_lock_trylock_for(h, wait_ms);
    int idx;
    if (st == CERB_OK && cerb_lock_hold_count(h) == 1 && (idx = cerb__lock_engine_idx(h)) >= 0)
        atomic_fetch_add(h == rw->writer ? &rw->c->engines[idx].write_grants
                                         : &rw->c->engines[idx].read_grants,
                         1);
    return st;
}

static cerb_status read_lock(cerb_rwlock *rw, int64_t wait_ms, const char *what)
{
    if (!rw_ok(rw))
        return bad(what);
    if (wait_ms < -1)
        return cerb__error_set(CERB_EINVAL, "%s: wait_ms %lld", what, (long long)wait_ms);
    uint64_t me = cerb__thread_id();
    struct rw_reader *r = NULL;
    cerb_status st = reader_get(rw, me, &r);
    if (st != CERB_OK)
        return st;
    if (cerb_lock_hold_count(rw->writer) > 0) {
        r->nested++; /* inside our own write: nobody else holds */
        return CERB_OK;
    }
    if (!r->h && (st = handle_new(rw, CERB_RW_READ, &r->h)) != CERB_OK) {
        reader_trim(rw, r);
        return st;
    }
    st = take(rw, r->h, wait_ms);
    if (st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        reader_trim(rw, r);
        cerb__error_set(st, "%s", why);
    }
    return st;
}

cerb_status cerb_rwlock_read_lock(cerb_rwlock *rw)
{
    return read_lock(rw, -1, "cerb_rwlock_read_lock");
}

cerb_status cerb_rwlock_read_trylock_for(cerb_rwlock *rw, int64_t wait_ms)
{
    if (wait_ms < 0)
        return cerb__error_set(CERB_EINVAL, "cerb_rwlock_read_trylock_for: wait_ms %lld",
                               (long long)wait_ms);
    return read_lock(rw, wait_ms, "cerb_rwlock_read_trylock_for");
}

cerb_status cerb_rwlock_read_unlock(cerb_rwlock *rw)
{
    if (!rw_ok(rw))
        return bad("cerb_rwlock_read_unlock");
    struct rw_reader *r = reader_find(rw, cerb__thread_id());
    if (!r)
        return cerb__error_set(CERB_NOT_OWNER, "read-write lock \"%s\": this thread holds no "
                                               "read lock", rw->name);
    cerb_status st;
    if (r->nested > 0) {
        r->nested--;
        st = CERB_OK;
    } else {
        st = r->h ? cerb_lock_unlock(r->h)
                  : cerb__error_set(CERB_NOT_OWNER, "read-write lock \"%s\": this thread "
                                                    "holds no read lock", rw->name);
    }
    char why[CERB_ERROR_MAX];
    if (st != CERB_OK)
        cerb__error_copy(why, sizeof why);
    reader_trim(rw, r);
    if (st != CERB_OK)
        cerb__error_set(st, "%s", why);
    return st;
}

static cerb_status write_lock(cerb_rwlock *rw, int64_t wait_ms, const char *what)
{
    if (!rw_ok(rw))
        return bad(what);
    struct rw_reader *r = reader_find(rw, cerb__thread_id());
    if (r && r->h && cerb_lock_hold_count(r->h) > 0)
        return cerb__error_set(CERB_EINVAL, "read-write lock \"%s\": this thread holds a read "
                                            "lock; taking the write lock would wait for itself "
                                            "(read_unlock first)", rw->name);
    return take(rw, rw->writer, wait_ms);
}

cerb_status cerb_rwlock_write_lock(cerb_rwlock *rw)
{
    return write_lock(rw, -1, "cerb_rwlock_write_lock");
}

cerb_status cerb_rwlock_write_trylock_for(cerb_rwlock *rw, int64_t wait_ms)
{
    if (wait_ms < 0)
        return cerb__error_set(CERB_EINVAL, "cerb_rwlock_write_trylock_for: wait_ms %lld",
                               (long long)wait_ms);
    return write_lock(rw, wait_ms, "cerb_rwlock_write_trylock_for");
}

cerb_status cerb_rwlock_write_unlock(cerb_rwlock *rw)
{
    if (!rw_ok(rw))
        return bad("cerb_rwlock_write_unlock");
    struct rw_reader *r = reader_find(rw, cerb__thread_id());
    if (r && r->nested > 0 && cerb_lock_hold_count(rw->writer) == 1)
        return cerb__error_set(CERB_EINVAL, "read-write lock \"%s\": %u read lock(s) taken "
                                            "inside the write are still held (read_unlock "
                                            "them first)", rw->name, r->nested);
    return cerb_lock_unlock(rw->writer);
}

/* The calling thread's hold: its writer handle when it writes, else its
 * reader handle when it reads, else NULL. */
static cerb_lock *mine(const cerb_rwlock *rw)
{
    cerb_rwlock *m = (cerb_rwlock *)rw;
    if (cerb_lock_hold_count(m->writer) > 0)
        return m->writer;
    struct rw_reader *r = reader_find(m, cerb__thread_id());
    return r && r->h && cerb_lock_hold_count(r->h) > 0 ? r->h : NULL;
}

enum cerb_lock_state cerb_rwlock_state(const cerb_rwlock *rw)
{
    cerb_lock *h = rw_ok(rw) ? mine(rw) : NULL;
    return h ? cerb_lock_state(h) : CERB_LOCK_FREE;
}

uint64_t cerb_rwlock_fencing_token(const cerb_rwlock *rw)
{
    cerb_lock *h = rw_ok(rw) ? mine(rw) : NULL;
    return h ? cerb_lock_fencing_token(h) : 0;
}

cerb_status cerb_rwlock_on_lost(cerb_rwlock *rw, void (*cb)(cerb_rwlock *, void *), void *ud)
{
    if (!rw_ok(rw))
        return bad("cerb_rwlock_on_lost");
    cerb__mutex_lock(&rw->cb_mu);
    rw->cb = cb;
    rw->cb_ud = ud;
    cerb__mutex_unlock(&rw->cb_mu);
    return CERB_OK;
}

bool cerb__rwlock_lost(cerb_client *c, cerb_rwlock *rw)
{
    cerb__mutex_lock(&rw->cb_mu);
    void (*cb)(cerb_rwlock *, void *) = rw->cb;
    void *ud = rw->cb_ud;
    cerb__mutex_unlock(&rw->cb_mu);
    return cerb__notify_rwlock_lost(c, rw, cb, ud);
}

cerb_status cerb_rwlock_free(cerb_rwlock *rw)
{
    if (!rw)
        return CERB_OK;
    if (!rw_ok(rw))
        return bad("cerb_rwlock_free");
    cerb__mutex_lock(&rw->mu);
    bool busy = cerb__lock_busy(rw->writer);
    for (struct rw_reader *r = rw->readers; r && !busy; r = r->next)
        busy = r->nested > 0 || (r->h && cerb__lock_busy(r->h));
    if (busy) {
        cerb__mutex_unlock(&rw->mu);
        return cerb__error_set(CERB_BUSY, "read-write lock \"%s\" is held or awaited", rw->name);
    }
    atomic_store(&rw->magic, CERB_DEAD_MAGIC);
    struct rw_reader *r = rw->readers;
    rw->readers = NULL;
    cerb__mutex_unlock(&rw->mu);
    while (r) {
        struct rw_reader *next = r->next;
        if (r->h)
            cerb_lock_free(r->h);
        cerb__free(r);
        r = next;
    }
    cerb_client *c = rw->c;
    cerb_lock_free(rw->writer);
    cerb__free(rw->name);
    cerb__mutex_destroy(&rw->mu);
    cerb__mutex_destroy(&rw->cb_mu);
    /* Its queued callbacks are dropped; a running one keeps the memory
     * until it returns (the callback thread frees it then). */
    if (!cerb__notify_forget(c, rw))
        cerb__free(rw);
    return CERB_OK;
}
