/*
 * engine_local_queue.c — the local engine's semaphores and read-write
 * locks (in-process mode): the queue of engine.h's cerb_queue_methods, as
 * plainly as it can be written, for the other engines to be compared with.
 *
 * One process-wide table of queues keyed by (primitive, name): a
 * semaphore's and a read-write lock's of one name are apart, as they are
 * on the servers. A member joins at the tail and is granted by the rule on
 * the members ahead of it (engine.h); granted, it keeps a lease like a
 * lock's (an expired member is dropped, as a server's TTL would) and the
 * queue's fence counter, which only grows. A waiting member is a thread
 * inside acquire, so it leaves when that call returns. Any member leaving
 * signals the queue's condition: waiters of other names never wake.
 *
 * A waiting member is a thread inside acquire, which removes it when the
 * call returns; nothing here answers with an unknown outcome, so release
 * never has a waiting member of its token to remove (engine.h asks it to).
 *
 * A semaphore's limit is stored while the queue has members; a caller with
 * another limit is refused then, and an empty queue takes the next
 * caller's (docs/semaphore.md).
 */
#include "internal_posix.h"

#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "engine_local.h"
#include "error.h"
#include "sync.h"

#define WAKE_NS (100 * CERB_NS_PER_MS)
#define NBUCKETS 256

struct q_member {
    char token[33];
    int mode;            /* rwlock: enum cerb_rw_mode */
    unsigned count;      /* semaphore: permits */
    bool granted;
    uint64_t fence;      /* once granted */
    int64_t expires_ns;  /* granted: its lease end; waiting: never */
    struct q_member *next;
};

struct q_name {
    int prim;
    char *name;
    int64_t limit;       /* semaphore: stored while members exist */
    uint64_t counter;
    struct q_member *head;
    cerb_cond cond;
    struct q_name *next;
};

static cerb_mutex q_mu = {PTHREAD_MUTEX_INITIALIZER};
static struct q_name *q_table[NBUCKETS];

static unsigned q_hash(int prim, const char *s)
{
    unsigned h = 2166136261u ^ (unsigned)prim;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % NBUCKETS;
}

/* Find (create when asked); q_mu held. NULL when absent or on OOM. */
static struct q_name *q_get(int prim, const char *name, bool create)
{
    unsigned b = q_hash(prim, name);
    for (struct q_name *q = q_table[b]; q; q = q->next)
        if (q->prim == prim && strcmp(q->name, name) == 0)
            return q;
    if (!create)
        return NULL;
    struct q_name *q = cerb__calloc(1, sizeof *q);
    if (!q || !(q->name = cerb__strdup(name))) {
        cerb__free(q);
        return NULL;
    }
    q->prim = prim;
    cerb__cond_init(&q->cond);
    q->next = q_table[b];
    q_table[b] = q;
    return q;
}

static void q_unlink(struct q_name *q, struct q_member *m)
{
    struct q_member **pp = &q->head;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = m->next;
        cerb__cond_broadcast(&q->cond);
    }
}

/* Drop granted members whose lease ran out; q_mu held. */
static void q_prune(struct q_name *q, int64_t now)
{
    struct q_member **pp = &q->head;
    while (*pp) {
        struct q_member *m = *pp;
        if (m->granted && m->expires_ns <= now) {
            *pp = m->next;
            cerb__free(m);
            cerb__cond_broadcast(&q->cond);
        } else {
            pp = &m->next;
        }
    }
    if (!q->head)
        q->limit = 0;
}

static struct q_member *q_find(struct q_name *q, const char *token)
{
    struct q_member *m = q->head;
    while (m && strcmp(m->token, token) != 0)
        m = m->next;
    return m;
}

/* The rule (engine.h): may m be granted, given the members ahead of it? */
static bool q_may(const struct q_name *q, const struct q_member *m)
{
    if (q->prim == CERB_PRIM_SEMAPHORE) {
        int64_t ahead = 0;
        for (const struct q_member *a = q->head; a != m; a = a->next)
            ahead += a->count;
        return ahead + m->count <= q->limit;
    }
    if (m->mode == CERB_RW_WRITE)
        return q->head == m;
    for (const struct q_member *a = q->head; a != m; a = a->next)
        if (a->mode == CERB_RW_WRITE)
            return false;
    return true;
}

static void grant(struct q_name *q, struct q_member *m, const cerb_engine_lock *lk, int64_t now,
                  cerb_grant *g)
{
    if (q->counter < lk->fence_floor)
        q->counter = lk->fence_floor;
    m->granted = true;
    m->fence = ++q->counter;
    m->expires_ns = now + lk->lease_ms * CERB_NS_PER_MS;
    g->fence = m->fence;
    g->sent_ns = now;
    g->ttl_ms = lk->lease_ms;
}

static cerb_status file_mode(cerb_engine *e, const cerb_engine_lock *lk, cerb_grant *g)
{
    (void)e;
    if (g)
        g->no_prim = 1;
    return cerb__error_set(CERB_UNAVAILABLE, "local engine with local.dir (file mode) has no %s "
                                             "yet", lk->prim == CERB_PRIM_SEMAPHORE
                                                        ? "semaphores"
                                                        : "read-write locks");
}

static cerb_status q_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                             const atomic_int *interrupted, cerb_grant *g)
{
    if (cerb__local_dir(e))
        return file_mode(e, lk, g);
    cerb_status st;
    cerb__mutex_lock(&q_mu);
    struct q_name *q = q_get(lk->prim, lk->name, true);
    if (!q) {
        cerb__mutex_unlock(&q_mu);
        return cerb__error_set(CERB_ENOMEM, "local: out of memory");
    }
    int64_t now = cerb_monotime();
    q_prune(q, now);
    struct q_member *m = q_find(q, lk->token);
    if (m && m->granted) { /* idempotent: already ours */
        g->fence = m->fence;
        g->sent_ns = now;
        g->ttl_ms = (m->expires_ns - now) / CERB_NS_PER_MS;
        cerb__mutex_unlock(&q_mu);
        return CERB_OK;
    }
    if (lk->prim == CERB_PRIM_SEMAPHORE) {
        if (q->head && q->limit != lk->limit) {
            g->no_prim = 1;
            st = cerb__error_set(CERB_ECONFIG, "semaphore \"%s\": the engine has a limit of %lld "
                                               "stored, this caller asks %lld",
                                 lk->name, (long long)q->limit, (long long)lk->limit);
            cerb__mutex_unlock(&q_mu);
            return st;
        }
        q->limit = lk->limit;
    }
    m = cerb__calloc(1, sizeof *m);
    if (!m) {
        cerb__mutex_unlock(&q_mu);
        return cerb__error_set(CERB_ENOMEM, "local: out of memory");
    }
    memcpy(m->token, lk->token, sizeof m->token);
    m->mode = lk->variant;
    m->count = lk->count;
    m->expires_ns = CERB_DEADLINE_NEVER;
    struct q_member **tail = &q->head;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    for (;;) {
        now = cerb_monotime();
        q_prune(q, now);
        if (q_may(q, m)) {
            grant(q, m, lk, now, g);
            cerb__mutex_unlock(&q_mu);
            return CERB_OK;
        }
        if (deadline_ns == 0)
            st = CERB_BUSY;
        else if (interrupted && atomic_load(interrupted))
            st = CERB_INTERRUPTED;
        else if (now >= deadline_ns)
            st = CERB_TIMEOUT;
        else
            st = CERB_OK;
        if (st != CERB_OK)
            break;
        /* Wake at the deadline, the first lease end ahead, or every
         * 100 ms to look at the interrupt flag. */
        int64_t until = now + WAKE_NS;
        if (deadline_ns < until)
            until = deadline_ns;
        for (struct q_member *a = q->head; a != m; a = a->next)
            if (a->granted && a->expires_ns < until)
                until = a->expires_ns;
        cerb__cond_wait_until(&q->cond, &q_mu, until);
    }
    q_unlink(q, m);
    cerb__free(m);
    if (!q->head)
        q->limit = 0;
    cerb__mutex_unlock(&q_mu);
    return st;
}

/* lk's granted, live member; q_mu held. */
static struct q_member *q_mine(const cerb_engine_lock *lk, struct q_name **qp)
{
    struct q_name *q = q_get(lk->prim, lk->name, false);
    if (!q)
        return NULL;
    q_prune(q, cerb_monotime());
    struct q_member *m = q_find(q, lk->token);
    if (qp)
        *qp = q;
    return m && m->granted ? m : NULL;
}

static cerb_status q_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    if (cerb__local_dir(e))
        return file_mode(e, lk, NULL);
    cerb__mutex_lock(&q_mu);
    struct q_member *m = q_mine(lk, NULL);
    if (m) {
        int64_t now = cerb_monotime();
        m->expires_ns = now + lk->lease_ms * CERB_NS_PER_MS;
        g->fence = m->fence;
        g->sent_ns = now;
        g->ttl_ms = lk->lease_ms;
    }
    cerb__mutex_unlock(&q_mu);
    return m ? CERB_OK : CERB_NOT_OWNER;
}

static cerb_status q_release(cerb_engine *e, cerb_engine_lock *lk)
{
    if (cerb__local_dir(e))
        return file_mode(e, lk, NULL);
    cerb__mutex_lock(&q_mu);
    struct q_name *q = NULL;
    struct q_member *m = q_mine(lk, &q);
    if (m) {
        q_unlink(q, m);
        cerb__free(m);
        if (!q->head)
            q->limit = 0;
    }
    cerb__mutex_unlock(&q_mu);
    return m ? CERB_OK : CERB_NOT_OWNER;
}

static cerb_status q_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    if (cerb__local_dir(e))
        return file_mode(e, lk, NULL);
    cerb__mutex_lock(&q_mu);
    struct q_member *m = q_mine(lk, NULL);
    if (m) {
        int64_t now = cerb_monotime();
        g->fence = m->fence;
        g->sent_ns = now;
        g->ttl_ms = (m->expires_ns - now) / CERB_NS_PER_MS;
    }
    cerb__mutex_unlock(&q_mu);
    return m ? CERB_OK : CERB_NOT_OWNER;
}

static cerb_status q_held(int prim, cerb_engine *e, const char *name)
{
    if (cerb__local_dir(e))
        return CERB_OK; /* file mode grants none */
    cerb__mutex_lock(&q_mu);
    struct q_name *q = q_get(prim, name, false);
    bool held = false;
    if (q) {
        q_prune(q, cerb_monotime());
        for (struct q_member *m = q->head; m && !held; m = m->next)
            held = m->granted;
    }
    cerb__mutex_unlock(&q_mu);
    return held ? CERB_BUSY : CERB_OK;
}

static cerb_status q_inspect(int prim, cerb_engine *e, const char *name, struct cerb_holders *out)
{
    if (cerb__local_dir(e))
        return CERB_OK;
    cerb_status st = CERB_OK;
    cerb__mutex_lock(&q_mu);
    struct q_name *q = q_get(prim, name, false);
    int64_t now = cerb_monotime();
    if (q)
        q_prune(q, now);
    /* Holders first, then waiters: the granted members are a prefix. */
    for (struct q_member *m = q ? q->head : NULL; st == CERB_OK && m; m = m->next) {
        char detail[64];
        if (prim == CERB_PRIM_SEMAPHORE)
            snprintf(detail, sizeof detail, "permits %u of %lld", m->count, (long long)q->limit);
        else
            snprintf(detail, sizeof detail, "%s", m->mode == CERB_RW_WRITE ? "write" : "read");
        st = cerb__holders_add(out, m->token, strlen(m->token), !m->granted,
                               m->granted ? m->fence : 0,
                               m->granted ? (m->expires_ns - now) / CERB_NS_PER_MS : -1, detail);
    }
    cerb__mutex_unlock(&q_mu);
    return st;
}

/* The rule for a new member like lk at the tail (engine.h, fits). */
static cerb_status q_fits(cerb_engine *e, const cerb_engine_lock *lk)
{
    if (cerb__local_dir(e))
        return CERB_OK; /* file mode grants none */
    cerb__mutex_lock(&q_mu);
    struct q_name *q = q_get(lk->prim, lk->name, false);
    bool fits = true;
    if (q) {
        q_prune(q, cerb_monotime());
        int64_t permits = 0;
        for (struct q_member *m = q->head; m; m = m->next) {
            if (strcmp(m->token, lk->token) == 0)
                continue;
            permits += m->count;
            if (lk->prim == CERB_PRIM_RWLOCK &&
                (lk->variant == CERB_RW_WRITE || m->mode == CERB_RW_WRITE))
                fits = false;
        }
        int64_t limit = q->head && q->limit ? q->limit : lk->limit;
        if (lk->prim == CERB_PRIM_SEMAPHORE && permits + lk->count > limit)
            fits = false;
    }
    cerb__mutex_unlock(&q_mu);
    return fits ? CERB_OK : CERB_BUSY;
}

static cerb_status sem_held(cerb_engine *e, const char *name)
{
    return q_held(CERB_PRIM_SEMAPHORE, e, name);
}

static cerb_status rw_held(cerb_engine *e, const char *name)
{
    return q_held(CERB_PRIM_RWLOCK, e, name);
}

static cerb_status sem_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    return q_inspect(CERB_PRIM_SEMAPHORE, e, name, out);
}

static cerb_status rw_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    return q_inspect(CERB_PRIM_RWLOCK, e, name, out);
}

const struct cerb_queue_methods cerb__local_semaphore = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = q_acquire,
    .renew = q_renew,
    .release = q_release,
    .check_owner = q_check,
    .held = sem_held,
    .inspect = sem_inspect,
    .fits = q_fits,
};

const struct cerb_queue_methods cerb__local_rwlock = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = q_acquire,
    .renew = q_renew,
    .release = q_release,
    .check_owner = q_check,
    .held = rw_held,
    .inspect = rw_inspect,
    .fits = q_fits,
};

void cerb__local_queue_cancel(const cerb_engine_lock *lk)
{
    cerb__mutex_lock(&q_mu);
    struct q_name *q = q_get(lk->prim, lk->name, false);
    if (q)
        cerb__cond_broadcast(&q->cond);
    cerb__mutex_unlock(&q_mu);
}
