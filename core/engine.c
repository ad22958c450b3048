/*
 * engine.c — the engine registry and the checking shims.
 *
 * The core reaches an engine only through the cerb__engine_* shims below, in
 * the way SQLite reaches a VFS only through os.c: each shim checks that the
 * table's version covers the method and that the slot is filled, fills a
 * sane default (renew_batch becomes a loop; a missing cancel is a no-op, the
 * engine's bounded waits notice the interrupt flag), and normalises what
 * comes back (a grant's outcome is NO unless the engine says otherwise).
 *
 * Registered tables are immutable and live for the process; the registry is
 * a small fixed array guarded by a mutex, searched by name.
 */
#include "internal_posix.h"

#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "sync.h"

#define MAX_REGISTERED 16

static cerb_mutex reg_mu = {PTHREAD_MUTEX_INITIALIZER};
static const struct cerb_engine_ops *registry[MAX_REGISTERED];
static size_t n_registered;

cerb_status cerb__engine_register(const struct cerb_engine_ops *ops)
{
    cerb_status st = CERB_OK;

    if (!ops || !ops->name || !ops->open || !ops->close || !ops->acquire ||
        !ops->release || !ops->check_owner)
        return cerb__error_set(CERB_EINVAL, "engine table incomplete");
    if (ops->version < CERB_ENGINE_OPS_V1 || ops->version > CERB_ENGINE_OPS_VERSION)
        return cerb__error_set(CERB_EINVAL, "engine %s: unsupported table version %d",
                               ops->name, ops->version);
    if (ops->version >= CERB_ENGINE_OPS_V5 && ops->election &&
        (ops->election->version != CERB_ELECTION_METHODS_V1 || !ops->election->proclaim ||
         !ops->election->leader))
        return cerb__error_set(CERB_EINVAL, "engine %s: election table incomplete or of an "
                                            "unknown version", ops->name);
    if (ops->version >= CERB_ENGINE_OPS_V5) {
        const struct cerb_queue_methods *qs[] = {ops->semaphore, ops->rwlock};
        for (size_t i = 0; i < 2; i++)
            if (qs[i] && (qs[i]->version != CERB_QUEUE_METHODS_V1 || !qs[i]->acquire ||
                          !qs[i]->release || !qs[i]->check_owner || !qs[i]->held ||
                          !qs[i]->inspect))
                return cerb__error_set(CERB_EINVAL, "engine %s: %s table incomplete or of an "
                                                    "unknown version",
                                       ops->name, i ? "read-write lock" : "semaphore");
    }
    cerb__mutex_lock(&reg_mu);
    for (size_t i = 0; i < n_registered; i++) {
        if (registry[i] == ops)
            goto out; /* idempotent */
        if (strcmp(registry[i]->name, ops->name) == 0) {
            st = cerb__error_set(CERB_EINVAL, "engine %s already registered", ops->name);
            goto out;
        }
    }
    if (n_registered == MAX_REGISTERED) {
        st = cerb__error_set(CERB_ENOMEM, "engine registry full");
        goto out;
    }
    registry[n_registered++] = ops;
out:
    cerb__mutex_unlock(&reg_mu);
    return st;
}

void cerb__engine_names(char *buf, size_t len)
{
    size_t used = 0;

    if (len == 0)
        return;
    buf[0] = '\0';
    cerb__mutex_lock(&reg_mu);
    for (size_t i = 0; i < n_registered && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", registry[i]->name);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    cerb__mutex_unlock(&reg_mu);
}

const struct cerb_engine_ops *cerb__engine_find(const char *name)
{
    const struct cerb_engine_ops *found = NULL;
    char names[256];

    cerb__engines_builtin();
    if (!name)
        name = "local";
    cerb__mutex_lock(&reg_mu);
    for (size_t i = 0; i < n_registered; i++)
        if (strcmp(registry[i]->name, name) == 0)
            found = registry[i];
    cerb__mutex_unlock(&reg_mu);
    if (!found) {
        cerb__engine_names(names, sizeof names);
        cerb__error_set(CERB_EINVAL, "unknown engine \"%s\" (available: %s)", name, names);
    }
    return found;
}

/* ---- shims ---- */

cerb_status cerb__engine_open(const struct cerb_engine_ops *ops,
                              const cerb_engine_env *env, cerb_engine **out)
{
    *out = NULL;
    return ops->open(env, out);
}

void cerb__engine_close(const struct cerb_engine_ops *ops, cerb_engine *e)
{
    if (e)
        ops->close(e);
}

static void grant_reset(cerb_grant *g)
{
    memset(g, 0, sizeof *g);
    g->outcome = CERB_OUTCOME_NO;
}

/* The engine's election table, or NULL. */
static const struct cerb_election_methods *election_of(const struct cerb_engine_ops *ops)
{
    return ops->version >= CERB_ENGINE_OPS_V5 ? ops->election : NULL;
}

/* The engine's table for a queued primitive (semaphore, read-write lock),
 * or NULL (none, or prim is not one). */
static const struct cerb_queue_methods *queue_of(const struct cerb_engine_ops *ops, int prim)
{
    if (ops->version < CERB_ENGINE_OPS_V5)
        return NULL;
    return prim == CERB_PRIM_SEMAPHORE ? ops->semaphore
           : prim == CERB_PRIM_RWLOCK  ? ops->rwlock
                                       : NULL;
}

static bool is_queued(int prim)
{
    return prim == CERB_PRIM_SEMAPHORE || prim == CERB_PRIM_RWLOCK;
}

bool cerb__engine_has_election(const struct cerb_engine_ops *ops)
{
    return election_of(ops) != NULL;
}

bool cerb__engine_has_prim(const struct cerb_engine_ops *ops, int prim)
{
    if (prim == CERB_PRIM_MUTEX)
        return true;
    if (prim == CERB_PRIM_ELECTION)
        return election_of(ops) != NULL;
    return queue_of(ops, prim) != NULL;
}

const char *cerb__prim_name(int prim)
{
    switch (prim) {
    case CERB_PRIM_ELECTION: return "leader election";
    case CERB_PRIM_SEMAPHORE: return "semaphore";
    case CERB_PRIM_RWLOCK: return "read-write lock";
    default: return "lock";
    }
}

static cerb_status no_election(const struct cerb_engine_ops *ops)
{
    return cerb__error_set(CERB_UNAVAILABLE, "engine %s has no leader election", ops->name);
}

static cerb_status no_prim(const struct cerb_engine_ops *ops, int prim)
{
    if (prim == CERB_PRIM_ELECTION)
        return no_election(ops);
    return cerb__error_set(CERB_UNAVAILABLE, "engine %s has no %s", ops->name,
                           cerb__prim_name(prim));
}

/* The check of lk's grant: the primitive's table's when it has one. */
static cerb_status check_of(const struct cerb_engine_ops *ops, cerb_engine *e,
                            cerb_engine_lock *lk, cerb_grant *grant)
{
    const struct cerb_election_methods *em = election_of(ops);
    if (lk->prim == CERB_PRIM_ELECTION && em && em->check_owner)
        return em->check_owner(e, lk, grant);
    if (is_queued(lk->prim))
        return queue_of(ops, lk->prim)->check_owner(e, lk, grant);
    return ops->check_owner(e, lk, grant);
}

cerb_status cerb__engine_acquire(const struct cerb_engine_ops *ops,
                                 cerb_engine *e, cerb_engine_lock *lk,
                                 int64_t deadline_ns,
                                 const atomic_int *interrupted,
                                 cerb_grant *grant)
{
    grant_reset(grant);
    cerb_status st;
    if (!cerb__engine_has_prim(ops, lk->prim)) {
        grant->no_prim = 1;
        return no_prim(ops, lk->prim); /* outcome NO: nothing was sent */
    }
    if (lk->prim == CERB_PRIM_ELECTION) {
        const struct cerb_election_methods *em = election_of(ops);
        st = em->acquire ? em->acquire(e, lk, deadline_ns, interrupted, grant)
                         : ops->acquire(e, lk, deadline_ns, interrupted, grant);
    } else if (is_queued(lk->prim)) {
        st = queue_of(ops, lk->prim)->acquire(e, lk, deadline_ns, interrupted, grant);
    } else {
        st = ops->acquire(e, lk, deadline_ns, interrupted, grant);
    }
    if (st == CERB_OK)
        grant->outcome = CERB_OUTCOME_YES;
    else if (grant->outcome == CERB_OUTCOME_YES)
        grant->outcome = CERB_OUTCOME_UNKNOWN; /* an error cannot be a grant */
    return st;
}

cerb_status cerb__engine_renew(const struct cerb_engine_ops *ops,
                               cerb_engine *e, cerb_engine_lock *lk,
                               cerb_grant *grant)
{
    grant_reset(grant);
    if (!cerb__engine_has_prim(ops, lk->prim))
        return no_prim(ops, lk->prim);
    cerb_status (*renew)(cerb_engine *, cerb_engine_lock *, cerb_grant *) =
        is_queued(lk->prim) ? queue_of(ops, lk->prim)->renew : ops->renew;
    if (!renew) {
        /* An engine without renewal holds until release (session based):
         * confirm ownership instead, which is what a renewal proves. */
        cerb_status st = check_of(ops, e, lk, grant);
        if (st == CERB_OK && grant->sent_ns == 0)
            grant->sent_ns = cerb_monotime();
        return st;
    }
    return renew(e, lk, grant);
}

void cerb__engine_renew_batch(const struct cerb_engine_ops *ops,
                              cerb_engine *e, cerb_renew_item *items, size_t n)
{
    /* The engine's batch renews the mutex's layout (and an election's,
     * which shares it); a queued primitive's holds go one by one, apart:
     * one of them must not turn the whole chunk into one call per hold
     * (the watchdog counts on a chunk taking one round trip). */
    size_t nq = 0;
    for (size_t i = 0; i < n; i++)
        nq += is_queued(items[i].lk->prim);
    if (!ops->renew_batch || n - nq < 2) {
        for (size_t i = 0; i < n; i++)
            items[i].st = cerb__engine_renew(ops, e, items[i].lk, &items[i].grant);
        return;
    }
    cerb_renew_item *batch = items;
    if (nq > 0 && !(batch = cerb__calloc(n - nq, sizeof *batch))) {
        for (size_t i = 0; i < n; i++) /* no memory: one by one */
            items[i].st = cerb__engine_renew(ops, e, items[i].lk, &items[i].grant);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (nq > 0 && is_queued(items[i].lk->prim))
            continue;
        if (nq > 0)
            batch[k++].lk = items[i].lk;
    }
    for (size_t i = 0; i < n - nq; i++)
        grant_reset(&batch[i].grant);
    ops->renew_batch(e, batch, n - nq);
    if (nq == 0)
        return;
    k = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_queued(items[i].lk->prim)) {
            items[i].st = cerb__engine_renew(ops, e, items[i].lk, &items[i].grant);
        } else {
            items[i].st = batch[k].st;
            items[i].grant = batch[k].grant;
            k++;
        }
    }
    cerb__free(batch);
}

cerb_status cerb__engine_release(const struct cerb_engine_ops *ops,
                                 cerb_engine *e, cerb_engine_lock *lk)
{
    if (is_queued(lk->prim)) {
        const struct cerb_queue_methods *q = queue_of(ops, lk->prim);
        return q ? q->release(e, lk) : no_prim(ops, lk->prim);
    }
    return ops->release(e, lk);
}

cerb_status cerb__engine_check_owner(const struct cerb_engine_ops *ops,
                                     cerb_engine *e, cerb_engine_lock *lk,
                                     cerb_grant *grant)
{
    grant_reset(grant);
    if (!cerb__engine_has_prim(ops, lk->prim))
        return no_prim(ops, lk->prim);
    return check_of(ops, e, lk, grant);
}

cerb_status cerb__engine_proclaim(const struct cerb_engine_ops *ops, cerb_engine *e,
                                  cerb_engine_lock *lk, const void *value, size_t n,
                                  cerb_outcome *outcome)
{
    const struct cerb_election_methods *em = election_of(ops);
    *outcome = CERB_OUTCOME_NO;
    if (!em)
        return no_election(ops);
    if (!e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s is not open", ops->name);
    cerb_status st = em->proclaim(e, lk, value, n, outcome);
    if (st == CERB_OK)
        *outcome = CERB_OUTCOME_YES;
    else if (*outcome == CERB_OUTCOME_YES)
        *outcome = CERB_OUTCOME_UNKNOWN; /* an error cannot be a success */
    return st;
}

cerb_status cerb__engine_leader(const struct cerb_engine_ops *ops, cerb_engine *e,
                                const char *name, int variant, cerb_leader_rec *out)
{
    const struct cerb_election_methods *em = election_of(ops);
    memset(out, 0, sizeof *out);
    out->ttl_ms = -1;
    if (!em)
        return no_election(ops);
    if (!e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s is not open", ops->name);
    cerb_status st = cerb__engine_check_name(ops, name);
    if (st != CERB_OK)
        return st;
    st = em->leader(e, name, variant, out);
    if (st != CERB_OK)
        cerb__leader_rec_clear(out);
    return st;
}

cerb_status cerb__engine_check_value(const struct cerb_engine_ops *ops, int variant,
                                     const void *value, size_t n)
{
    const struct cerb_election_methods *em = election_of(ops);
    if (!em)
        return no_election(ops);
    return em->check_value ? em->check_value(variant, value, n) : CERB_OK;
}

void cerb__leader_rec_clear(cerb_leader_rec *out)
{
    cerb__free(out->value);
    memset(out, 0, sizeof *out);
    out->ttl_ms = -1;
}

void cerb__engine_cancel(const struct cerb_engine_ops *ops, cerb_engine *e,
                         cerb_engine_lock *lk)
{
    if (ops->cancel)
        ops->cancel(e, lk);
}

cerb_status cerb__engine_probe(const struct cerb_engine_ops *ops,
                               cerb_engine *e, int64_t timeout_ms)
{
    if (!ops->probe)
        return CERB_OK; /* no probe: health is learnt from real calls */
    return ops->probe(e, timeout_ms);
}

cerb_status cerb__engine_check_name(const struct cerb_engine_ops *ops,
                                    const char *name)
{
    if (!ops->check_name)
        return CERB_OK;
    return ops->check_name(name);
}

void cerb__engine_stats(const struct cerb_engine_ops *ops, cerb_engine *e,
                        struct cerb_engine_stats *out)
{
    memset(out, 0, sizeof *out);
    if (ops->stats && e)
        ops->stats(e, out);
}

cerb_status cerb__engine_gate_ask(const struct cerb_engine_ops *ops, cerb_engine *e,
                                  const cerb_engine_lock *lk, bool whole)
{
    if (!is_queued(lk->prim))
        return cerb__engine_held(ops, e, lk->name, lk->prim);
    const struct cerb_queue_methods *q = queue_of(ops, lk->prim);
    if (!q)
        return CERB_OK; /* nobody can hold this primitive there */
    if (!e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s is not open", ops->name);
    if (!q->fits)
        return q->held(e, lk->name);
    if (!whole || lk->prim != CERB_PRIM_SEMAPHORE)
        return q->fits(e, lk);
    /* Is nobody else's member there: no permit held (whatever limit it
     * was taken under), and the whole limit would fit past the waiters. */
    cerb_status st = q->held(e, lk->name);
    if (st != CERB_OK)
        return st;
    cerb_engine_lock all = *lk;
    all.count = (unsigned)lk->limit;
    return q->fits(e, &all);
}

cerb_status cerb__engine_held(const struct cerb_engine_ops *ops, cerb_engine *e,
                              const char *name, int prim)
{
    if (is_queued(prim)) {
        const struct cerb_queue_methods *q = queue_of(ops, prim);
        if (!q)
            return CERB_OK; /* nobody can hold this primitive there */
        if (!e)
            return cerb__error_set(CERB_UNAVAILABLE, "engine %s is not open", ops->name);
        return q->held(e, name);
    }
    if (!ops->held || !e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s cannot tell whether a name is held",
                               ops->name);
    return ops->held(e, name);
}

int64_t cerb__engine_hold_bound_ms(const struct cerb_engine_ops *ops, cerb_engine *e)
{
    if (!ops || !ops->hold_bound_ms || !e)
        return 0;
    int64_t ms = ops->hold_bound_ms(e);
    return ms > 0 ? ms : 0;
}

unsigned cerb__engine_caps(const struct cerb_engine_ops *ops, cerb_engine *e)
{
    if (!ops)
        return 0;
    if (!ops->instance_caps || !e)
        return ops->caps;
    return ops->instance_caps(e) & ops->caps;
}

bool cerb__engine_has_closure(const struct cerb_engine_ops *ops)
{
    return ops && ops->version >= CERB_ENGINE_OPS_V4 && ops->closure_get && ops->closure_put;
}

cerb_status cerb__engine_closure_get(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     cerb_closure *out)
{
    memset(out, 0, sizeof *out);
    if (!cerb__engine_has_closure(ops) || !e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s keeps no closure records",
                               ops ? ops->name : "?");
    return ops->closure_get(e, out);
}

cerb_status cerb__engine_closure_put(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_closure *rec, cerb_closure *now)
{
    memset(now, 0, sizeof *now);
    if (!cerb__engine_has_closure(ops) || !e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s keeps no closure records",
                               ops ? ops->name : "?");
    if (rec->epoch <= 0)
        return cerb__error_set(CERB_EINVAL, "closure record with epoch %lld",
                               (long long)rec->epoch);
    return ops->closure_put(e, rec, now);
}
