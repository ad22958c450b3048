/*
 * engine_local.c — the reference engine: locks inside this process, and
 * optionally across processes on this host through flock(2) files.
 *
 * In-process mode keeps one process-wide table of names, so two clients of
 * one process exclude each other exactly as two processes would on a server.
 * Each entry holds the owner token, a lease deadline on the monotonic clock
 * (an expired lease counts as free, as a server's TTL would), a fence counter
 * that only grows, and a FIFO of waiters so fair mode grants in arrival
 * order. A release signals the entry's own condition variable, so waiters on
 * other names never wake (no herd).
 *
 * A leader election's term is a hold of the entry like a lock's, with the
 * candidate's value kept in the entry while the term lasts (in-process
 * mode only: file mode has no elections yet).
 *
 * Semaphores and read-write locks are engine_local_queue.c's (in-process
 * mode too).
 *
 * File mode (`local.dir` set) takes an exclusive flock on
 * <dir>/<sha256(name)>.lock for the whole hold; the kernel drops it when the
 * holder dies, which plays the part of a session. The fence counter lives in
 * the file and is bumped under the flock. Waiting polls with LOCK_NB every
 * 20 ms because a blocking flock cannot be interrupted without signals.
 */
#include "internal_posix.h"

#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "../config/config.h"
#include "alloc.h"
#include "clock.h"
#include "engine_local.h"
#include "error.h"
#include "sync.h"

#define POLL_NS (20 * CERB_NS_PER_MS)
#define WAKE_NS (100 * CERB_NS_PER_MS)

struct local_waiter {
    const char *token;
    struct local_waiter *next;
};

struct local_entry {
    char *name;
    char token[33];      /* "" when free */
    int64_t expires_ns;  /* lease end; CERB_DEADLINE_NEVER for no lease */
    uint64_t fence;
    void *value;         /* an election term's value (value_len bytes), else NULL */
    size_t value_len;
    cerb_cond cond;
    struct local_waiter *head, *tail;
    struct local_entry *next;
};

#define NBUCKETS 1024
static cerb_mutex table_mu = {PTHREAD_MUTEX_INITIALIZER};
static struct local_entry *table[NBUCKETS];

struct cerb_engine {
    char *dir; /* NULL: in-process mode */
};

struct local_priv {
    int fd; /* file mode: the flocked file, -1 otherwise */
};

static unsigned hash_name(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % NBUCKETS;
}

/* Find or create; table_mu held. NULL on OOM. */
static struct local_entry *entry_get(const char *name)
{
    unsigned b = hash_name(name);
    for (struct local_entry *e = table[b]; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    struct local_entry *e = cerb__calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->name = cerb__strdup(name);
    if (!e->name) {
        cerb__free(e);
        return NULL;
    }
    cerb__cond_init(&e->cond);
    e->next = table[b];
    table[b] = e;
    return e;
}

static int entry_free_now(struct local_entry *e, int64_t now)
{
    return e->token[0] == '\0' || e->expires_ns <= now;
}

static void waiter_remove(struct local_entry *e, struct local_waiter *w)
{
    struct local_waiter **pp = &e->head;
    struct local_waiter *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = w->next;
    if (e->tail == w)
        e->tail = prev;
    /* The new head may now be first in line: wake the entry's waiters. */
    cerb__cond_broadcast(&e->cond);
}

/* Keep (a copy of) value as the entry's; false when out of memory.
 * table_mu held. */
static bool value_set(struct local_entry *e, const void *value, size_t len, bool keep)
{
    void *v = NULL;
    if (keep && !(v = cerb__memdup0(value, len)))
        return false;
    cerb__free(e->value);
    e->value = v;
    e->value_len = keep ? len : 0;
    return true;
}

static void grant_to(struct local_entry *e, cerb_engine_lock *lk, int64_t now,
                     cerb_grant *g)
{
    /* Out of memory for a term's value: led with none rather than failed. */
    if (!value_set(e, lk->value, lk->value_len, lk->prim == CERB_PRIM_ELECTION))
        value_set(e, NULL, 0, false);
    memcpy(e->token, lk->token, sizeof e->token);
    e->expires_ns = now + lk->lease_ms * CERB_NS_PER_MS;
    if (e->fence < lk->fence_floor)
        e->fence = lk->fence_floor;
    e->fence++;
    g->fence = e->fence;
    g->sent_ns = now;
    g->ttl_ms = lk->lease_ms;
}

static cerb_status mem_acquire(cerb_engine_lock *lk, int64_t deadline_ns,
                               const atomic_int *interrupted, cerb_grant *g)
{
    struct local_waiter w = {lk->token, NULL};
    int queued = 0;
    cerb_status st;

    cerb__mutex_lock(&table_mu);
    struct local_entry *e = entry_get(lk->name);
    if (!e) {
        cerb__mutex_unlock(&table_mu);
        return cerb__error_set(CERB_ENOMEM, "local: out of memory");
    }
    for (;;) {
        int64_t now = cerb_monotime();
        int first = !lk->fair || !e->head || e->head == &w;
        if (entry_free_now(e, now) && first) {
            grant_to(e, lk, now, g);
            st = CERB_OK;
            break;
        }
        if (strcmp(e->token, lk->token) == 0 && !entry_free_now(e, now)) {
            st = CERB_OK; /* idempotent: already ours */
            g->fence = e->fence;
            g->sent_ns = now;
            g->ttl_ms = (e->expires_ns - now) / CERB_NS_PER_MS;
            break;
        }
        if (deadline_ns == 0) {
            st = CERB_BUSY;
            break;
        }
        if (interrupted && atomic_load(interrupted)) {
            st = CERB_INTERRUPTED;
            break;
        }
        if (now >= deadline_ns) {
            st = CERB_TIMEOUT;
            break;
        }
        if (!queued) {
            if (e->tail)
                e->tail->next = &w;
            else
                e->head = &w;
            e->tail = &w;
            queued = 1;
        }
        /* Wake at the deadline, the lease end of the holder, or every
         * 100 ms to look at the interrupt flag. */
        int64_t until = now + WAKE_NS;
        if (deadline_ns < until)
            until = deadline_ns;
        if (e->token[0] && e->expires_ns < until)
            until = e->expires_ns;
        cerb__cond_wait_until(&e->cond, &table_mu, until);
    }
    if (queued)
        waiter_remove(e, &w);
    cerb__mutex_unlock(&table_mu);
    return st;
}

static cerb_status mem_renew(cerb_engine_lock *lk, cerb_grant *g)
{
    cerb_status st = CERB_NOT_OWNER;
    cerb__mutex_lock(&table_mu);
    struct local_entry *e = entry_get(lk->name);
    int64_t now = cerb_monotime();
    if (e && strcmp(e->token, lk->token) == 0 && !entry_free_now(e, now)) {
        e->expires_ns = now + lk->lease_ms * CERB_NS_PER_MS;
        g->fence = e->fence;
        g->sent_ns = now;
        g->ttl_ms = lk->lease_ms;
        st = CERB_OK;
    }
    cerb__mutex_unlock(&table_mu);
    return st;
}

static cerb_status mem_release(cerb_engine_lock *lk)
{
    cerb_status st = CERB_NOT_OWNER;
    cerb__mutex_lock(&table_mu);
    struct local_entry *e = entry_get(lk->name);
    if (e && strcmp(e->token, lk->token) == 0) {
        st = entry_free_now(e, cerb_monotime()) ? CERB_NOT_OWNER : CERB_OK;
        e->token[0] = '\0';
        value_set(e, NULL, 0, false);
        cerb__cond_broadcast(&e->cond);
    }
    cerb__mutex_unlock(&table_mu);
    return st;
}

static cerb_status mem_check(cerb_engine_lock *lk, cerb_grant *g)
{
    cerb_status st = CERB_NOT_OWNER;
    cerb__mutex_lock(&table_mu);
    struct local_entry *e = entry_get(lk->name);
    if (e && strcmp(e->token, lk->token) == 0 && !entry_free_now(e, cerb_monotime())) {
        g->fence = e->fence;
        st = CERB_OK;
    }
    cerb__mutex_unlock(&table_mu);
    return st;
}

static void mem_cancel(cerb_engine_lock *lk)
{
    cerb__mutex_lock(&table_mu);
    struct local_entry *e = entry_get(lk->name);
    if (e)
        cerb__cond_broadcast(&e->cond);
    cerb__mutex_unlock(&table_mu);
}

/* ---- file mode ---- */

static cerb_status file_path(cerb_engine *eng, const char *name, char *out, size_t len)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];

    if (EVP_Digest(name, strlen(name), md, &mdlen, EVP_sha256(), NULL) != 1)
        return cerb__error_set(CERB_EIO, "local: sha256 failed");
    for (unsigned i = 0; i < mdlen; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    if ((size_t)snprintf(out, len, "%s/%s.lock", eng->dir, hex) >= len)
        return cerb__error_set(CERB_EINVAL, "local: lock directory path too long");
    return CERB_OK;
}

static cerb_status file_acquire(cerb_engine *eng, cerb_engine_lock *lk,
                                int64_t deadline_ns, const atomic_int *interrupted,
                                cerb_grant *g)
{
    struct local_priv *p = lk->priv;
    char path[4096];
    cerb_status st = file_path(eng, lk->name, path, sizeof path);
    if (st != CERB_OK)
        return st;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return cerb__error_set(CERB_EIO, "local: open %s: %s", path, strerror(errno));
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            st = cerb__error_set(CERB_EIO, "local: flock %s: %s", path, strerror(errno));
            goto fail;
        }
        if (deadline_ns == 0) {
            st = CERB_BUSY;
            goto fail;
        }
        if (interrupted && atomic_load(interrupted)) {
            st = CERB_INTERRUPTED;
            goto fail;
        }
        int64_t now = cerb_monotime();
        if (now >= deadline_ns) {
            st = CERB_TIMEOUT;
            goto fail;
        }
        int64_t nap = deadline_ns - now < POLL_NS ? deadline_ns - now : POLL_NS;
        cerb__nap_ms((nap + CERB_NS_PER_MS - 1) / CERB_NS_PER_MS);
    }
    /* The fence counter: 20 decimal digits at the start of the file. */
    char buf[24] = {0};
    uint64_t fence = 0;
    if (pread(fd, buf, sizeof buf - 1, 0) > 0)
        sscanf(buf, "%20lu", (unsigned long *)&fence);
    if (fence < lk->fence_floor)
        fence = lk->fence_floor;
    fence++;
    int n = snprintf(buf, sizeof buf, "%020lu\n", (unsigned long)fence);
    if (pwrite(fd, buf, (size_t)n, 0) != n) {
        st = cerb__error_set(CERB_EIO, "local: write %s: %s", path, strerror(errno));
        goto fail;
    }
    p->fd = fd;
    g->fence = fence;
    g->sent_ns = cerb_monotime();
    g->ttl_ms = 0; /* held until released or the process dies */
    return CERB_OK;
fail:
    close(fd);
    return st;
}

/* ---- the table ---- */

static cerb_status local_open(const cerb_engine_env *env, cerb_engine **out)
{
    cerb_engine *e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "local: out of memory");
    const char *dir = env && env->cfg ? env->cfg->local.dir : NULL;
    if (dir && *dir) {
        e->dir = cerb__strdup(dir);
        if (!e->dir) {
            cerb__free(e);
            return cerb__error_set(CERB_ENOMEM, "local: out of memory");
        }
        if (access(dir, W_OK) != 0) {
            cerb_status st = cerb__error_set(CERB_ECONFIG, "local.dir %s: %s", dir, strerror(errno));
            cerb__free(e->dir);
            cerb__free(e);
            return st;
        }
    }
    *out = e;
    return CERB_OK;
}

static void local_close(cerb_engine *e)
{
    cerb__free(e->dir);
    cerb__free(e);
}

static cerb_status local_acquire(cerb_engine *e, cerb_engine_lock *lk,
                                 int64_t deadline_ns, const atomic_int *interrupted,
                                 cerb_grant *g)
{
    struct local_priv *p = lk->priv;
    p->fd = -1;
    if (e->dir)
        return file_acquire(e, lk, deadline_ns, interrupted, g);
    return mem_acquire(lk, deadline_ns, interrupted, g);
}

static cerb_status local_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    if (e->dir) {
        g->sent_ns = cerb_monotime();
        g->ttl_ms = 0;
        return CERB_OK;
    }
    return mem_renew(lk, g);
}

static cerb_status local_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct local_priv *p = lk->priv;
    if (e->dir) {
        if (p->fd < 0)
            return CERB_NOT_OWNER;
        close(p->fd); /* drops the flock */
        p->fd = -1;
        return CERB_OK;
    }
    return mem_release(lk);
}

static cerb_status local_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    struct local_priv *p = lk->priv;
    if (e->dir)
        return p->fd >= 0 ? CERB_OK : CERB_NOT_OWNER;
    return mem_check(lk, g);
}

static void local_cancel(cerb_engine *e, cerb_engine_lock *lk)
{
    if (e->dir)
        return;
    if (lk->prim == CERB_PRIM_SEMAPHORE || lk->prim == CERB_PRIM_RWLOCK)
        cerb__local_queue_cancel(lk);
    else
        mem_cancel(lk);
}

static cerb_status local_held(cerb_engine *e, const char *name)
{
    if (e->dir) {
        char path[4096];
        cerb_status st = file_path(e, name, path, sizeof path);
        if (st != CERB_OK)
            return st;
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return cerb__error_set(CERB_EIO, "local: open %s: %s", path, strerror(errno));
        st = flock(fd, LOCK_EX | LOCK_NB) == 0 ? CERB_OK : CERB_BUSY;
        close(fd); /* drops the probe's flock, if it got one */
        return st;
    }
    cerb__mutex_lock(&table_mu);
    struct local_entry *en = entry_get(name);
    cerb_status st = en && !entry_free_now(en, cerb_monotime()) ? CERB_BUSY : CERB_OK;
    cerb__mutex_unlock(&table_mu);
    return st;
}

/*
 * inspect(): in-process, the entry's holder (token, fence, lease left) and
 * its FIFO of waiters; with local.dir, whether another open file holds the
 * flock (the holder is then known only as the file, with the fence the
 * file records, and waiters poll, so none are listed).
 */
static cerb_status local_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    cerb_status st = CERB_OK;
    if (e->dir) {
        char path[4096], buf[24] = {0};
        uint64_t fence = 0;
        st = file_path(e, name, path, sizeof path);
        if (st != CERB_OK)
            return st;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return errno == ENOENT ? CERB_OK /* never locked */
                                   : cerb__error_set(CERB_EIO, "local: open %s: %s", path,
                                                     strerror(errno));
        if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
            if (pread(fd, buf, sizeof buf - 1, 0) > 0)
                sscanf(buf, "%20lu", (unsigned long *)&fence);
            st = cerb__holders_add(out, path, strlen(path), 0, fence, -1, "flock");
        }
        close(fd); /* drops the shared flock, if it got one */
        return st;
    }
    cerb__mutex_lock(&table_mu);
    struct local_entry *en = table[hash_name(name)];
    while (en && strcmp(en->name, name) != 0)
        en = en->next;
    int64_t now = cerb_monotime();
    if (en && !entry_free_now(en, now)) {
        int64_t ttl = en->expires_ns == CERB_DEADLINE_NEVER
                          ? -1
                          : (en->expires_ns - now) / CERB_NS_PER_MS;
        st = cerb__holders_add(out, en->token, strlen(en->token), 0, en->fence, ttl, "");
    }
    for (struct local_waiter *w = en ? en->head : NULL; st == CERB_OK && w; w = w->next)
        st = cerb__holders_add(out, w->token, strlen(w->token), 1, 0, -1, "");
    cerb__mutex_unlock(&table_mu);
    return st;
}

/* ---- leader election (in-process mode) ---- */

static cerb_status elect_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                 const atomic_int *interrupted, cerb_grant *g)
{
    if (e->dir) {
        g->no_prim = 1;
        return cerb__error_set(CERB_UNAVAILABLE, "local engine with local.dir (file mode) has "
                                                 "no leader election yet");
    }
    return mem_acquire(lk, deadline_ns, interrupted, g);
}

static cerb_status elect_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                  size_t n, cerb_outcome *outcome)
{
    (void)e;
    cerb_status st = CERB_NOT_OWNER;
    cerb__mutex_lock(&table_mu);
    struct local_entry *en = entry_get(lk->name);
    if (en && strcmp(en->token, lk->token) == 0 && !entry_free_now(en, cerb_monotime()))
        st = value_set(en, value, n, true) ? CERB_OK
                                            : cerb__error_set(CERB_ENOMEM, "local: out of memory");
    cerb__mutex_unlock(&table_mu);
    *outcome = st == CERB_OK ? CERB_OUTCOME_YES : CERB_OUTCOME_NO;
    return st;
}

static cerb_status elect_leader(cerb_engine *e, const char *name, int variant,
                                cerb_leader_rec *out)
{
    (void)variant;
    if (e->dir)
        return cerb__error_set(CERB_UNAVAILABLE, "local engine with local.dir (file mode) has "
                                                 "no leader election yet");
    cerb_status st = CERB_OK;
    cerb__mutex_lock(&table_mu);
    struct local_entry *en = table[hash_name(name)];
    while (en && strcmp(en->name, name) != 0)
        en = en->next;
    int64_t now = cerb_monotime();
    if (en && !entry_free_now(en, now)) {
        out->state = CERB_LEADER_SOME;
        snprintf(out->owner, sizeof out->owner, "%s", en->token);
        out->counter = en->fence;
        out->ttl_ms = en->expires_ns == CERB_DEADLINE_NEVER
                          ? -1
                          : (en->expires_ns - now) / CERB_NS_PER_MS;
        if (en->value) {
            out->value = cerb__memdup0(en->value, en->value_len);
            if (!out->value) {
                st = cerb__error_set(CERB_ENOMEM, "local: out of memory");
            } else {
                out->value_len = en->value_len;
                out->value_known = 1;
            }
        }
    }
    cerb__mutex_unlock(&table_mu);
    return st;
}

static const struct cerb_election_methods local_election = {
    .version = CERB_ELECTION_METHODS_V1,
    .flags = CERB_ELECT_VALUE_AT_GRANT,
    .acquire = elect_acquire,
    .proclaim = elect_proclaim,
    .leader = elect_leader,
};

const char *cerb__local_dir(const cerb_engine *e)
{
    return e->dir;
}

static cerb_status local_probe(cerb_engine *e, int64_t timeout_ms)
{
    return CERB_OK;
}

const struct cerb_engine_ops cerb__local_engine_ops = {
    .version = CERB_ENGINE_OPS_V5,
    .name = "local",
    .caps = CERB_CAP_FENCING | CERB_CAP_FAIR_QUEUE | CERB_CAP_WAIT | CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct local_priv),
    .open = local_open,
    .close = local_close,
    .acquire = local_acquire,
    .renew = local_renew,
    .release = local_release,
    .check_owner = local_check,
    .cancel = local_cancel,
    .probe = local_probe,
    .held = local_held,
    /* version 2: guard records (engine_local_guard.c) */
    .guard_begin = cerb__local_guard_begin,
    .guard_renew = cerb__local_guard_renew,
    .guard_finish = cerb__local_guard_finish,
    .guard_check = cerb__local_guard_check,
    /* version 3: inspection */
    .inspect = local_inspect,
    /* version 5: primitives */
    .election = &local_election,
    .semaphore = &cerb__local_semaphore,
    .rwlock = &cerb__local_rwlock,
};
