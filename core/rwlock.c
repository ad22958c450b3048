/*
 * rwlock.c — read-write locks (DESIGN.md §16): each mode is a lock handle.
 *
 * Each thread that reads or writes gets private lock handles of its own
 * (a slot each, prim CERB_PRIM_RWLOCK, variant CERB_RW_READ or
 * CERB_RW_WRITE), made at its first read or write and freed when it holds
 * neither: cerb_lock_lock() on them gives the thread reentrancy, the
 * deadline, the switch gate, claims, settling, the fence, renewal and loss
 * exactly as a lock's. Every reader and every writer of a process is thus
 * a member of the server's queue, which is what keeps the order first
 * come, first served across threads and processes alike (a reader behind
 * a waiting writer waits, wherever either runs).
 *
 * Reads inside the thread's own write are counted on its reader entry
 * (`nested`) without a server call: the writer's hold already excludes
 * everybody. A thread that reads cannot write (its writer would wait
 * behind its own reader): refused at once instead of deadlocking.
 *
 * rw->mu guards the threads' entries (their handles and nesting, written
 * by their own thread, read by the free) and the count of calls inside;
 * it is taken before a handle's slot mutex, only for a look (the free's),
 * and no lock call, which may wait, is made under it. A call counts itself
 * in (`calls`) before it touches an entry, so the free refuses while one
 * is inside. The callback (cb_mu) is a leaf the watchdog reads under a
 * slot mutex.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"

#define CERB_RWLOCK_MAGIC 0x52574c4bu /* "RWLK" */

/* One thread's holds of the lock. */
struct rw_thread {
    uint64_t tid;
    cerb_lock *rd, *wr;  /* its handles, NULL until it reads / writes */
    unsigned nested;     /* reads taken inside its write */
    struct rw_thread *next;
};

struct cerb_rwlock {
    atomic_uint magic;
    cerb_client *c;
    char *name;
    cerb_lock_opts lo;
    cerb_mutex mu;       /* threads, their fields, calls */
    struct rw_thread *threads;
    unsigned calls;      /* public calls inside */
    cerb_mutex cb_mu;    /* a leaf: cb, cb_ud */
    void (*cb)(cerb_rwlock *, void *);
    void *cb_ud;
};

static cerb_status bad(const char *what)
{
    return cerb__error_set(CERB_EINVAL, "%s: bad read-write lock", what);
}

/* Count a call in; false (nothing counted) for a bad or freed handle. */
static bool call_in(cerb_rwlock *rw)
{
    if (!rw || atomic_load(&rw->magic) != CERB_RWLOCK_MAGIC)
        return false;
    cerb__mutex_lock(&rw->mu);
    bool ok = atomic_load(&rw->magic) == CERB_RWLOCK_MAGIC;
    if (ok)
        rw->calls++;
    cerb__mutex_unlock(&rw->mu);
    return ok;
}

static cerb_status call_out(cerb_rwlock *rw, cerb_status st)
{
    cerb__mutex_lock(&rw->mu);
    rw->calls--;
    cerb__mutex_unlock(&rw->mu);
    return st;
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
    if (!name)
        return cerb__error_set(CERB_EINVAL, "lock name is NULL");
    cerb_rwlock_opts o = CERB_RWLOCK_OPTS_INIT;
    if (opts)
        o = *opts;
    cerb_rwlock *rw = cerb__calloc(1, sizeof *rw);
    if (!rw || !(rw->name = cerb__strdup(name))) {
        cerb__free(rw);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    rw->c = c;
    rw->lo = (cerb_lock_opts)CERB_LOCK_OPTS_INIT;
    rw->lo.lease_ms = o.lease_ms;
    rw->lo.renew = 1;
    rw->lo.fair = 1;
    /* The name and options are checked as a lock's, once, here. */
    cerb_lock *probe = NULL;
    cerb_status st = handle_new(rw, CERB_RW_WRITE, &probe);
    if (st != CERB_OK) {
        cerb__free(rw->name);
        cerb__free(rw);
        return st;
    }
    cerb_lock_free(probe);
    cerb__mutex_init(&rw->mu);
    cerb__mutex_init(&rw->cb_mu);
    atomic_store(&rw->magic, CERB_RWLOCK_MAGIC);
    *out = rw;
    return CERB_OK;
}

/* The calling thread's entry; NULL when it has none (or, with make, on
 * OOM). Only a thread makes or drops its own entry. */
static struct rw_thread *thread_of(cerb_rwlock *rw, bool make)
{
    uint64_t me = cerb__thread_id();
    cerb__mutex_lock(&rw->mu);
    struct rw_thread *t = rw->threads;
    while (t && t->tid != me)
        t = t->next;
    if (!t && make && (t = cerb__calloc(1, sizeof *t))) {
        t->tid = me;
        t->next = rw->threads;
        rw->threads = t;
    }
    cerb__mutex_unlock(&rw->mu);
    return t;
}

static unsigned held_through(cerb_lock *h)
{
    return h ? cerb_lock_hold_count(h) : 0;
}

/* The thread's handle of @mode, made when missing. */
static cerb_status handle_of(cerb_rwlock *rw, struct rw_thread *t, int mode, cerb_lock **out)
{
    cerb_lock **slot = mode == CERB_RW_READ ? &t->rd : &t->wr;
    if (*slot) {
        *out = *slot;
        return CERB_OK;
    }
    cerb_lock *h = NULL;
    cerb_status st = handle_new(rw, mode, &h);
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&rw->mu);
    *slot = h;
    cerb__mutex_unlock(&rw->mu);
    *out = h;
    return CERB_OK;
}

/* Drop the calling thread's entry and handles when it holds nothing. */
static void thread_trim(cerb_rwlock *rw, struct rw_thread *t)
{
    if (t->nested > 0 || held_through(t->rd) > 0 || held_through(t->wr) > 0)
        return;
    cerb__mutex_lock(&rw->mu);
    struct rw_thread **pp = &rw->threads;
    while (*pp != t)
        pp = &(*pp)->next;
    *pp = t->next;
    cerb__mutex_unlock(&rw->mu);
    cerb_lock_free(t->rd);
    cerb_lock_free(t->wr);
    cerb__free(t);
}

/* wait_ms: -1 without limit, 0 one try, else the longest wait. A new
 * hold (not a reentry) is counted for the metrics. */
static cerb_status take(cerb_rwlock *rw, cerb_lock *h, int mode, int64_t wait_ms)
{
    cerb_status st = wait_ms < 0    ? cerb_lock_lock(h)
                     : wait_ms == 0 ? cerb_lock_trylock(h)
                                    : cerb_lock_trylock_for(h, wait_ms);
    int idx;
    if (st == CERB_OK && cerb_lock_hold_count(h) == 1 && (idx = cerb__lock_engine_idx(h)) >= 0)
        atomic_fetch_add(mode == CERB_RW_WRITE ? &rw->c->engines[idx].write_grants
                                               : &rw->c->engines[idx].read_grants,
                         1);
    return st;
}

/* Keep st's error text across the trim (which may free handles). */
static cerb_status trim_keeping(cerb_rwlock *rw, struct rw_thread *t, cerb_status st)
{
    char why[CERB_ERROR_MAX];
    if (st != CERB_OK)
        cerb__error_copy(why, sizeof why);
    thread_trim(rw, t);
    if (st != CERB_OK)
        cerb__error_set(st, "%s", why);
    return st;
}

static cerb_status lock_mode(cerb_rwlock *rw, int mode, int64_t wait_ms, const char *what)
{
    if (wait_ms < -1)
        return cerb__error_set(CERB_EINVAL, "%s: wait_ms %lld", what, (long long)wait_ms);
    if (!call_in(rw))
        return bad(what);
    struct rw_thread *t = thread_of(rw, true);
    if (!t)
        return call_out(rw, cerb__error_set(CERB_ENOMEM, "out of memory"));
    cerb_status st;
    if (mode == CERB_RW_READ && held_through(t->wr) > 0) {
        /* Inside our own write: nobody else holds, unless it was lost. */
        st = cerb_lock_state(t->wr) == CERB_LOCK_LOST
                 ? cerb__error_set(CERB_LOST, "read-write lock \"%s\": the write hold this "
                                              "thread reads inside was lost", rw->name)
                 : CERB_OK;
        if (st == CERB_OK) {
            cerb__mutex_lock(&rw->mu);
            t->nested++;
            cerb__mutex_unlock(&rw->mu);
        }
        return call_out(rw, st);
    }
    if (mode == CERB_RW_WRITE && (held_through(t->rd) > 0 || t->nested > 0) &&
        held_through(t->wr) == 0)
        return call_out(rw, cerb__error_set(CERB_EINVAL, "read-write lock \"%s\": this thread "
                                                         "holds a read lock; taking the write "
                                                         "lock would wait for itself "
                                                         "(read_unlock first)", rw->name));
    cerb_lock *h = NULL;
    st = handle_of(rw, t, mode, &h);
    if (st == CERB_OK)
        st = take(rw, h, mode, wait_ms);
    return call_out(rw, trim_keeping(rw, t, st));
}

cerb_status cerb_rwlock_read_lock(cerb_rwlock *rw)
{
    return lock_mode(rw, CERB_RW_READ, -1, "cerb_rwlock_read_lock");
}

cerb_status cerb_rwlock_read_trylock_for(cerb_rwlock *rw, int64_t wait_ms)
{
    if (wait_ms < 0)
        return cerb__error_set(CERB_EINVAL, "cerb_rwlock_read_trylock_for: wait_ms %lld",
                               (long long)wait_ms);
    return lock_mode(rw, CERB_RW_READ, wait_ms, "cerb_rwlock_read_trylock_for");
}

cerb_status cerb_rwlock_write_lock(cerb_rwlock *rw)
{
    return lock_mode(rw, CERB_RW_WRITE, -1, "cerb_rwlock_write_lock");
}

cerb_status cerb_rwlock_write_trylock_for(cerb_rwlock *rw, int64_t wait_ms)
{
    if (wait_ms < 0)
        return cerb__error_set(CERB_EINVAL, "cerb_rwlock_write_trylock_for: wait_ms %lld",
                               (long long)wait_ms);
    return lock_mode(rw, CERB_RW_WRITE, wait_ms, "cerb_rwlock_write_trylock_for");
}

static cerb_status unlock_mode(cerb_rwlock *rw, int mode, const char *what)
{
    if (!call_in(rw))
        return bad(what);
    struct rw_thread *t = thread_of(rw, false);
    cerb_lock *h = t ? (mode == CERB_RW_READ ? t->rd : t->wr) : NULL;
    cerb_status st;
    if (mode == CERB_RW_READ && t && t->nested > 0) {
        cerb__mutex_lock(&rw->mu);
        t->nested--;
        cerb__mutex_unlock(&rw->mu);
        st = CERB_OK;
    } else if (!h || held_through(h) == 0) {
        st = cerb__error_set(CERB_NOT_OWNER, "read-write lock \"%s\": this thread holds no %s "
                                             "lock", rw->name,
                             mode == CERB_RW_READ ? "read" : "write");
    } else if (mode == CERB_RW_WRITE && t->nested > 0 && held_through(h) == 1) {
        st = cerb__error_set(CERB_EINVAL, "read-write lock \"%s\": %u read lock(s) taken "
                                          "inside the write are still held (read_unlock "
                                          "them first)", rw->name, t->nested);
    } else {
        st = cerb_lock_unlock(h);
    }
    if (t)
        st = trim_keeping(rw, t, st);
    return call_out(rw, st);
}

cerb_status cerb_rwlock_read_unlock(cerb_rwlock *rw)
{
    return unlock_mode(rw, CERB_RW_READ, "cerb_rwlock_read_unlock");
}

cerb_status cerb_rwlock_write_unlock(cerb_rwlock *rw)
{
    return unlock_mode(rw, CERB_RW_WRITE, "cerb_rwlock_write_unlock");
}

/* The calling thread's hold, write first; NULL when it holds neither. */
static cerb_lock *mine(struct rw_thread *t)
{
    if (!t)
        return NULL;
    if (held_through(t->wr) > 0)
        return t->wr;
    return held_through(t->rd) > 0 ? t->rd : NULL;
}

enum cerb_lock_state cerb_rwlock_state(const cerb_rwlock *crw)
{
    cerb_rwlock *rw = (cerb_rwlock *)crw;
    if (!call_in(rw))
        return CERB_LOCK_FREE;
    cerb_lock *h = mine(thread_of(rw, false));
    enum cerb_lock_state st = h ? cerb_lock_state(h) : CERB_LOCK_FREE;
    call_out(rw, CERB_OK);
    return st;
}

uint64_t cerb_rwlock_fencing_token(const cerb_rwlock *crw)
{
    cerb_rwlock *rw = (cerb_rwlock *)crw;
    if (!call_in(rw))
        return 0;
    cerb_lock *h = mine(thread_of(rw, false));
    uint64_t f = h ? cerb_lock_fencing_token(h) : 0;
    call_out(rw, CERB_OK);
    return f;
}

cerb_status cerb_rwlock_on_lost(cerb_rwlock *rw, void (*cb)(cerb_rwlock *, void *), void *ud)
{
    if (!call_in(rw))
        return bad("cerb_rwlock_on_lost");
    cerb__mutex_lock(&rw->cb_mu);
    rw->cb = cb;
    rw->cb_ud = ud;
    cerb__mutex_unlock(&rw->cb_mu);
    return call_out(rw, CERB_OK);
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
    if (atomic_load(&rw->magic) != CERB_RWLOCK_MAGIC)
        return bad("cerb_rwlock_free");
    cerb__mutex_lock(&rw->mu);
    bool busy = rw->calls > 0;
    for (struct rw_thread *t = rw->threads; t && !busy; t = t->next)
        busy = t->nested > 0 || (t->rd && cerb__lock_busy(t->rd)) ||
               (t->wr && cerb__lock_busy(t->wr));
    if (busy) {
        cerb__mutex_unlock(&rw->mu);
        return cerb__error_set(CERB_BUSY, "read-write lock \"%s\" is held, awaited or in use",
                               rw->name);
    }
    atomic_store(&rw->magic, CERB_DEAD_MAGIC);
    struct rw_thread *t = rw->threads;
    rw->threads = NULL;
    cerb__mutex_unlock(&rw->mu);
    while (t) {
        struct rw_thread *next = t->next;
        cerb_lock_free(t->rd);
        cerb_lock_free(t->wr);
        cerb__free(t);
        t = next;
    }
    cerb_client *c = rw->c;
    cerb__free(rw->name);
    cerb__mutex_destroy(&rw->mu);
    cerb__mutex_destroy(&rw->cb_mu);
    /* Its queued callbacks are dropped; a running one keeps the memory
     * until it returns (the callback thread frees it then). */
    if (!cerb__notify_forget(c, rw))
        cerb__free(rw);
    return CERB_OK;
}
