/*
 * lock.c — lock handles: validation, per-thread reentrancy, the acquire and
 * release paths, interruption, state.
 *
 * Acquire, in order:
 *  1. A thread that already holds the name only bumps its count: no round
 *     trip, no token change (reentrancy is counted here, the server holds one
 *     token).
 *  2. Otherwise it joins the name's local FIFO (waitq.c) and waits to be
 *     head with the slot unoccupied, bounded by its deadline.
 *  3. The head marks the slot occupied and takes a fresh owner token to the
 *     engines, in explicit steps (engine_acquire: choose the engine, pass
 *     the safe-switch gate, acquire, settle a failure, confirm the grant).
 *     Errors are retried with full-jitter backoff, at most retry.max times
 *     and never past the deadline. An error whose outcome is UNKNOWN (the
 *     request left, no answer came) is first settled with check_owner: if
 *     the server says we own it, it is a grant; if it cannot be settled, a
 *     best-effort release by token makes sure no orphan stays.
 *  4. On a grant the hold goes to the watchdog for renewal and loss
 *     detection.
 * Release takes the hold away from the watchdog first (waiting for a renewal
 * in flight), so a renewal can never land after the release, then releases
 * on the server with the token compare, retried like acquire.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"
#include "token.h"

#define NAME_MAX_LEN 255
#define FENCE_MASK ((UINT64_C(1) << 48) - 1)

static const atomic_int never_interrupted;

bool cerb__lock_alive(const cerb_lock *l)
{
    return l && atomic_load(&((cerb_lock *)l)->magic) == CERB_LOCK_MAGIC &&
           cerb__client_ok(l->client);
}

bool cerb__lock_ok(const cerb_lock *l)
{
    return cerb__lock_alive(l) && !l->as_hold;
}

cerb_status cerb__lock_refused(const cerb_lock *l, const char *what)
{
    if (l && atomic_load(&((cerb_lock *)l)->magic) == CERB_LOCK_MAGIC &&
        cerb__client_forked(l->client))
        return cerb__client_refused(l->client, what);
    return cerb__error_set(CERB_EINVAL, "%s", what);
}

uint64_t cerb__fence_compose(int64_t epoch, uint64_t counter)
{
    return ((uint64_t)epoch << 48) | (counter & FENCE_MASK);
}

/*
 * The fence a grant on engine idx must exceed: the highest this client had
 * on any other engine in the same epoch (an older epoch ranks below anyway).
 * Raising it is the engine's work, on the server, so that the grants of
 * every client on that engine stay in order (engine.h, fence_floor).
 */
static uint64_t fence_floor(cerb_client *c, int idx, int64_t epoch)
{
    uint64_t floor = 0;
    for (size_t j = 0; j < c->n_engines; j++) {
        uint64_t m = atomic_load(&c->engines[j].max_fence);
        if ((int)j != idx && (int64_t)(m >> 48) == epoch && (m & FENCE_MASK) > floor)
            floor = m & FENCE_MASK;
    }
    return floor;
}

static void fence_granted(cerb_client *c, struct cerb_engine_hold *h)
{
    struct cerb_client_engine *ce = &c->engines[h->engine_idx];
    uint64_t m = atomic_load(&ce->max_fence);
    while (h->fence > m && !atomic_compare_exchange_weak(&ce->max_fence, &m, h->fence))
        ;
    if ((h->fence >> 48) == (uint64_t)h->epoch && (h->fence & FENCE_MASK) <= h->lk.fence_floor &&
        (cerb__engine_caps(ce->ops, atomic_load(&ce->e)) & CERB_CAP_FENCING))
        CERB_LOG_W("fencing: %s granted \"%s\" fence %llu, not above %llu (this client's "
                   "highest on another engine): its tokens went backwards across a switch",
                   ce->name, h->lk.name, (unsigned long long)(h->fence & FENCE_MASK),
                   (unsigned long long)h->lk.fence_floor);
}


cerb_status cerb__lock_name_check(cerb_client *c, const char *name)
{
    if (!name)
        return cerb__error_set(CERB_EINVAL, "lock name is NULL");
    size_t n = strnlen(name, NAME_MAX_LEN + 1);
    if (n == 0)
        return cerb__error_set(CERB_EINVAL, "lock name is empty");
    if (n > NAME_MAX_LEN)
        return cerb__error_set(CERB_EINVAL, "lock name is longer than %d bytes", NAME_MAX_LEN);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x20 || ch == 0x7f)
            return cerb__error_set(CERB_EINVAL,
                                   "lock name has a control character (0x%02x) at byte %zu", ch, i);
    }
    for (size_t i = 0; i < c->n_engines; i++) {
        cerb_status st = cerb__engine_check_name(c->engines[i].ops, name);
        if (st != CERB_OK) {
            cerb__error_prefix("lock name not valid for engine %s", c->engines[i].name);
            return st;
        }
    }
    return CERB_OK;
}

static cerb_status lock_new(cerb_client *c, const char *name, const cerb_lock_opts *opts,
                           int prim, cerb_lock **out);

cerb_status cerb_lock_new(cerb_client *c, const char *name, const cerb_lock_opts *opts,
                          cerb_lock **out)
{
    return lock_new(c, name, opts, -1, out);
}

cerb_status cerb__lock_new_private(cerb_client *c, const char *name, const cerb_lock_opts *opts,
                                   int prim, cerb_lock **out)
{
    return lock_new(c, name, opts, prim, out);
}

/* prim -1: a lock's handle on the name's shared slot; else a handle of
 * primitive prim on a private slot. */
static cerb_status lock_new(cerb_client *c, const char *name, const cerb_lock_opts *opts,
                           int prim, cerb_lock **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_lock_new: out is NULL");
    *out = NULL;
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_lock_new");
    cerb_status st = cerb__lock_name_check(c, name);
    if (st != CERB_OK)
        return st;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    if (opts)
        o = *opts;
    if (o.lease_ms < 0 || (o.lease_ms > 0 && (o.lease_ms < 100 || o.lease_ms > 86400000)))
        return cerb__error_set(CERB_EINVAL, "lease_ms %lld is out of range 100..86400000 (0 = default)",
                               (long long)o.lease_ms);
    if (o.renew < -1 || o.renew > 1 || o.fair < -1 || o.fair > 1)
        return cerb__error_set(CERB_EINVAL, "renew and fair take -1 (default), 0 or 1");
    const char *quarantined = cerb__config_engine_index(c->boot_cfg, "redis") >= 0   ? "redis"
                              : cerb__config_engine_index(c->boot_cfg, "pg") >= 0    ? "pg"
                              : cerb__config_engine_index(c->boot_cfg, "mysql") >= 0 ? "mysql"
                              : cerb__config_engine_index(c->boot_cfg, "memcached") >= 0
                                  ? "memcached"
                                  : NULL;
    if (o.lease_ms > 0 && quarantined) {
        /* After a data loss (redis) or a failover (pg, mysql), the engine
         * quarantines grants for the longest lease it knows; another
         * process that finds the loss knows only lock.lease_ms. */
        struct cerb_failover_config fo;
        int64_t cfg_lease;
        cerb__client_failover_cfg(c, &fo, &cfg_lease);
        if (o.lease_ms > cfg_lease)
            return cerb__error_set(CERB_EINVAL,
                                   "lease_ms %lld is above lock.lease_ms %lld: the %s engine's "
                                   "quarantine after a %s (in any process) covers only "
                                   "lock.lease_ms; raise lock.lease_ms",
                                   (long long)o.lease_ms, (long long)cfg_lease, quarantined,
                                   strcmp(quarantined, "redis") == 0       ? "data loss"
                                   : strcmp(quarantined, "memcached") == 0 ? "restart or loss"
                                                                           : "failover");
    }
    if (o.lease_ms > 0 && c->n_engines > 1) {
        /* The safe grace (switch_grace_ms = -1) is what every process can
         * derive from the file: lock.lease_ms. A longer per-lock lease would
         * outlive it, and another process would be granted the name on the
         * next engine while this hold still stands on the old one. */
        struct cerb_failover_config fo;
        int64_t cfg_lease;
        cerb__client_failover_cfg(c, &fo, &cfg_lease);
        if (fo.switch_grace_ms < 0 && o.lease_ms > cfg_lease)
            return cerb__error_set(CERB_EINVAL,
                                   "lease_ms %lld is above lock.lease_ms %lld: with more than one "
                                   "engine and failover.switch_grace_ms = -1 the switch grace covers "
                                   "only lock.lease_ms; raise lock.lease_ms or set switch_grace_ms",
                                   (long long)o.lease_ms, (long long)cfg_lease);
    }

    cerb_lock *l = cerb__calloc(1, sizeof *l);
    if (!l)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    l->lease_ms = o.lease_ms;
    l->renew = o.renew;
    l->fair = o.fair;
    l->renew_set = o.renew >= 0;
    l->fair_set = o.fair >= 0;
    if (prim >= 0) {
        struct cerb_slot *s = cerb__slot_private(c, name, prim);
        if (!s) {
            cerb__free(l);
            return cerb__error_set(CERB_ENOMEM, "out of memory");
        }
        l->prim = prim;
        cerb__lock_enlist_slot(c, s, l);
        *out = l;
        return CERB_OK;
    }
    st = cerb__lock_enlist(c, name, l);
    if (st != CERB_OK) {
        cerb__free(l);
        return st;
    }
    *out = l;
    return CERB_OK;
}

cerb_status cerb__lock_enlist(cerb_client *c, const char *name, cerb_lock *l)
{
    struct cerb_slot *s = cerb__slot_get(c, name);
    if (!s)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    cerb__lock_enlist_slot(c, s, l);
    return CERB_OK;
}

void cerb__lock_enlist_slot(cerb_client *c, struct cerb_slot *s, cerb_lock *l)
{
    l->slot = s;
    l->client = c;
    cerb__mutex_lock(&c->mu);
    l->next = c->handles;
    if (c->handles)
        c->handles->prev = l;
    c->handles = l;
    cerb__mutex_unlock(&c->mu);
    atomic_store(&l->magic, CERB_LOCK_MAGIC);
}

/* ---- the engine call with retries and ambiguity settling ---- */

void cerb__engine_hold_free(struct cerb_engine_hold *h)
{
    if (!h)
        return;
    cerb__free(h->lk.priv);
    cerb__free((void *)h->lk.value);
    cerb__free(h);
}

static void hold_free(struct cerb_engine_hold *h)
{
    cerb__engine_hold_free(h);
}

cerb_status cerb__engine_hold_prim(struct cerb_engine_hold *h, int prim, int variant,
                                   const void *value, size_t len)
{
    h->lk.prim = prim;
    h->lk.variant = variant;
    cerb__free((void *)h->lk.value);
    h->lk.value = NULL;
    h->lk.value_len = 0;
    if (prim == CERB_PRIM_MUTEX)
        return CERB_OK;
    void *v = cerb__memdup0(value, len); /* an empty value is not NULL */
    if (!v)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    h->lk.value = v;
    h->lk.value_len = len;
    return CERB_OK;
}

static struct cerb_engine_hold *hold_new(cerb_client *c, struct cerb_slot *s, int idx, int64_t epoch)
{
    struct cerb_engine_hold *h = cerb__calloc(1, sizeof *h);
    if (!h)
        return NULL;
    size_t psz = c->engines[idx].ops->lock_priv_size;
    h->lk.priv = psz ? cerb__calloc(1, psz) : NULL;
    if (psz && !h->lk.priv) {
        cerb__free(h);
        return NULL;
    }
    h->slot = s;
    h->engine_idx = idx;
    h->epoch = epoch;
    h->lk.name = s->name;
    /* Engines with closure records refuse grants their record closes for
     * this epoch (closure.c). A client with one engine takes part in no
     * switch (like other libraries on the store, it is kept out after one
     * only by failover.switch_claims): no epoch, no record to read or make. */
    h->lk.epoch = c->n_engines > 1 ? epoch : -1;
    return h;
}

static bool hard_error(cerb_status st)
{
    return st != CERB_OK && st != CERB_BUSY && st != CERB_TIMEOUT && st != CERB_INTERRUPTED;
}

/*
 * Settle an UNKNOWN outcome: ask the server whether the token holds the
 * lock. Returns CERB_OK (it does; fence filled), CERB_NOT_OWNER (it does
 * not), or the last error when no answer came in retry.max + 1 tries — one
 * for a trylock (deadline 0), whose documented bound is one re-check.
 */
static cerb_status settle(cerb_client *c, struct cerb_client_engine *ce, struct cerb_engine_hold *h,
                          const struct cerb_retry_config *rc, int64_t deadline_ns,
                          cerb_grant *g)
{
    cerb_status st = CERB_EIO;
    int tries = deadline_ns == 0 ? 1 : rc->max + 1;
    for (int k = 0; k < tries; k++) {
        if (k > 0)
            cerb__nap_ms(cerb__backoff_ms(k - 1, rc->backoff_ms, rc->backoff_max_ms));
        /* No question after the caller's deadline, the first one included:
         * the caller hands an unsettled hold to the background, which
         * releases it if it landed, and returns on time. */
        if (deadline_ns != 0 && cerb_monotime() >= deadline_ns)
            break;
        st = cerb__engine_check_owner(ce->ops, ce->e, &h->lk, g);
        if (st == CERB_OK || st == CERB_NOT_OWNER)
            return st;
        /* Give up settling here once the caller's time is up or new
         * acquisitions have moved to another engine. */
        if (deadline_ns != 0 && cerb_monotime() >= deadline_ns)
            break;
        if (atomic_load(&c->current) != h->engine_idx)
            break;
    }
    return st;
}

/*
 * Carry an acquisition over to engine `to` after its engine failed: a fresh
 * hold (same token, or a new one when the old request may have landed)
 * replaces *hp, and the old one — whose last request may
 * still land on the failed engine — goes to the watchdog, which releases it
 * there in the background once that engine answers (or its lease has run
 * out), so no orphan outlives its lease and the caller does not wait for a
 * dead server. slot->mu guards the swap: an interrupt may be looking at the
 * hold through the waiter.
 */
static cerb_status rehome(cerb_client *c, struct cerb_engine_hold **hp, struct cerb_waiter *w, int to,
                          int64_t epoch, bool maybe_landed)
{
    struct cerb_engine_hold *old = *hp;
    struct cerb_engine_hold *h = hold_new(c, old->slot, to, epoch);
    if (!h)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    h->lk.lease_ms = old->lk.lease_ms;
    h->lk.fair = old->lk.fair;
    h->renew = old->renew;
    if (cerb__engine_hold_prim(h, old->lk.prim, old->lk.variant, old->lk.value,
                               old->lk.value_len) != CERB_OK) {
        hold_free(h);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    h->lk.limit = old->lk.limit;
    h->lk.count = old->lk.count;
    /* When the old request may have landed, the new hold gets a token of
     * its own: the background release of the old one compares tokens, and
     * with one token it would also release what the new hold takes later —
     * its claim on the old engine, or the name itself after a switch
     * back there. */
    cerb_status st = CERB_OK;
    if (maybe_landed)
        st = cerb__token_new(h->lk.token);
    else
        memcpy(h->lk.token, old->lk.token, sizeof h->lk.token);
    if (st != CERB_OK) {
        hold_free(h);
        return st;
    }
    cerb__mutex_lock(&old->slot->mu);
    if (w)
        w->engine_hold = h;
    *hp = h;
    cerb__mutex_unlock(&old->slot->mu);
    if (maybe_landed)
        cerb__watchdog_orphan(c, old);
    else
        hold_free(old);
    return CERB_OK;
}

/* ---- claims on the engines switched away from ---- */

/* Take h's claims out of the watchdog (before h itself, so no claim can
 * report h LOST while it is being released). */
static void claims_unwatch(cerb_client *c, struct cerb_engine_hold *h)
{
    for (struct cerb_engine_hold *k = h->claims; k; k = k->claim_next)
        cerb__watchdog_remove(c, k);
}

/*
 * Release and free every claim of h (out of the watchdog); a claim whose
 * release got no answer goes to the background release. Returns false when
 * a claim was found gone ("not owner") although it had not been given up:
 * someone may have been granted the name there during the hold.
 */
static bool claims_drop(cerb_client *c, struct cerb_engine_hold *h)
{
    bool intact = true;
    claims_unwatch(c, h);
    while (h->claims) {
        struct cerb_engine_hold *k = h->claims;
        h->claims = k->claim_next;
        struct cerb_client_engine *ce = &c->engines[k->engine_idx];
        bool quiet = atomic_load(&k->state) != CERB_LOCK_VALID; /* dormant or over */
        cerb_status st = cerb__engine_release(ce->ops, ce->e, &k->lk);
        if (st == CERB_NOT_OWNER && !quiet)
            intact = false;
        if (st == CERB_OK || st == CERB_NOT_OWNER)
            hold_free(k);
        else
            cerb__watchdog_orphan(c, k);
    }
    return intact;
}

/*
 * The gate's questions leave a hole: a process that did not switch (its
 * breaker stayed closed) grants on the engine we left without asking us.
 * So after a grant, every gated engine that answers is made to refuse the
 * name itself: we take it there too, with the same token (a claim),
 * renewed with the hold and released with it. CERB_OK (claims taken where
 * the engine answered), or CERB_BUSY with the reason (held there: the
 * caller undoes the grant).
 */
static cerb_status claims_take(cerb_client *c, struct cerb_engine_hold *h)
{
    bool unclaimed = false; /* a gated engine left without a claim */
    for (size_t i = 0; i < c->n_engines; i++) {
        if ((int)i == h->engine_idx)
            continue;
        if (!cerb__gate_claimable(c, (int)i)) {
            unclaimed = unclaimed || atomic_load(&c->engines[i].gated);
            continue;
        }
        /* An engine without the primitive elects nobody: nothing to claim
         * there (its held() still gates the name), and its refusal is no
         * silence. */
        if (!cerb__engine_has_prim(c->engines[i].ops, h->lk.prim))
            continue;
        struct cerb_engine_hold *k = hold_new(c, h->slot, (int)i, h->epoch);
        if (!k)
            return cerb__error_set(CERB_ENOMEM, "out of memory for a claim on engine %s",
                                   c->engines[i].name);
        k->lk.lease_ms = h->lk.lease_ms;
        k->lk.fair = 0;
        k->renew = h->renew;
        k->claim_of = h;
        /* A term's claim is laid out as a term, with its value: observers
         * of that engine see the leader there too. */
        if (cerb__engine_hold_prim(k, h->lk.prim, h->lk.variant, h->lk.value,
                                   h->lk.value_len) != CERB_OK) {
            hold_free(k);
            return cerb__error_set(CERB_ENOMEM, "out of memory for a claim on engine %s",
                                   c->engines[i].name);
        }
        k->lk.limit = h->lk.limit; /* a semaphore's claim takes as many permits */
        k->lk.count = h->lk.count;
        /* A claim marks the name taken for whoever reads no record; the
         * engine's record must not refuse it (it is no grant to use). */
        k->lk.epoch = -1;
        memcpy(k->lk.token, h->lk.token, sizeof k->lk.token);
        struct cerb_client_engine *ce = &c->engines[i];
        cerb_grant g;
        memset(&g, 0, sizeof g);
        cerb_status st = cerb__engine_acquire(ce->ops, ce->e, &k->lk, 0, &never_interrupted, &g);
        if (st == CERB_OK) {
            cerb__health_ok(c, (int)i);
            k->valid_until_ns = cerb__grant_deadline(&g);
            int64_t ttl = g.ttl_ms > 0 && g.ttl_ms < k->lk.lease_ms ? g.ttl_ms : k->lk.lease_ms;
            k->next_renew_ns = g.sent_ns + ttl * CERB_NS_PER_MS / 3;
            k->renew_once = g.ttl_ms > 0 && g.ttl_ms < k->lk.lease_ms;
            atomic_store(&k->state, CERB_LOCK_VALID);
            k->claim_next = h->claims;
            h->claims = k;
            continue;
        }
        if (st == CERB_BUSY) {
            hold_free(k);
            return cerb__error_set(CERB_BUSY, "lock \"%s\" is held on engine %s, switched from",
                                   h->slot->name, ce->name);
        }
        if (g.no_prim && st == CERB_ECONFIG) {
            /* Refused for good there (a semaphore's stored limit differs):
             * a final answer about this acquisition, not silence. */
            hold_free(k);
            cerb__error_prefix("claim on engine %s, switched from", ce->name);
            return st;
        }
        if (g.no_prim) {
            /* The primitive is not there in the mode it runs in: nothing
             * to claim, as on an engine without it. */
            hold_free(k);
            continue;
        }
        /* No answer: the gate's grace rules that engine, as for a question:
         * the grant stands only once it has been silent for its grace. */
        cerb__gate_no_answer(c, (int)i);
        if (g.outcome == CERB_OUTCOME_UNKNOWN)
            cerb__watchdog_orphan(c, k);
        else
            hold_free(k);
        st = cerb__switch_gate(c, h->engine_idx, h->slot, &h->lk, 0, NULL);
        if (st != CERB_OK)
            return st;
    }
    /* A semaphore's permits add up across engines: one that turned
     * unclaimable (closed, or quiet) since the gate asked cannot count
     * this grant, so it is asked again, now strictly (health.c). */
    if (unclaimed && h->lk.prim == CERB_PRIM_SEMAPHORE)
        return cerb__switch_gate(c, h->engine_idx, h->slot, &h->lk, 0, NULL);
    return CERB_OK;
}

/*
 * Take back a grant the gate refused after the fact: released on its
 * engine, the acquisition goes on with a fresh hold and token there. When
 * the release gets no answer, the old hold goes to the background release.
 */
static cerb_status undo_grant(cerb_client *c, struct cerb_engine_hold **hp, struct cerb_waiter *w)
{
    struct cerb_engine_hold *h = *hp;
    claims_drop(c, h);
    struct cerb_client_engine *ce = &c->engines[h->engine_idx];
    cerb_status st = cerb__engine_release(ce->ops, ce->e, &h->lk);
    bool gone = st == CERB_OK || st == CERB_NOT_OWNER;
    st = rehome(c, hp, w, h->engine_idx, h->epoch, !gone);
    if (st == CERB_OK)
        st = cerb__token_new((*hp)->lk.token);
    return st;
}

/* ---- acquisitions follow a switch (the list: inflight.c) ---- */

/*
 * The engine or the gate stopped on w->stop. A caller's interrupt: false.
 * A switch: true, with *hp moved to the current engine (the old hold goes
 * to the background release when a request was @sent — a hand-off may have
 * landed) or left alone when its engine is current again.
 */
static bool follow_switch(cerb_client *c, struct cerb_engine_hold **hp, struct cerb_waiter *w, bool sent)
{
    if (atomic_load(&w->interrupted) || !atomic_exchange(&w->moved, 0))
        return false;
    atomic_store(&w->stop, 0);
    if (atomic_load(&w->interrupted)) {
        atomic_store(&w->stop, 1); /* an interrupt raced the reset: keep it */
        return false;
    }
    int64_t ep;
    int cur = cerb__route(c, &ep);
    if (cur == (*hp)->engine_idx || !c->engines[cur].e)
        return true;
    if (rehome(c, hp, w, cur, ep, sent) == CERB_OK)
        return true;
    cerb__error_set(CERB_ENOMEM, "out of memory");
    return false;
}

/*
 * ---- the acquisition on the engines, as explicit steps ----
 *
 * One attempt is, top-down:
 *   acq_choose   the engine: the route (a switch may have moved new
 *                acquisitions before anything was sent);
 *   acq_gate     the engines switched away from must agree (health.c),
 *                waiting within the deadline;
 *   acq_try      the engine's acquire, with the fence floor;
 *   acq_failed   a hard error: the breaker told, the acquisition carried
 *                to the engine new ones go to, an UNKNOWN outcome settled
 *                by check_owner, or a back-off before the next attempt;
 *   acq_confirm  a grant while another engine is gated: the gate asked
 *                again and claims taken, or the grant undone and the
 *                acquisition started over;
 * and, once granted, acq_lease sets the hold's deadline and renewal time.
 * Each step reads the state in `struct acq` and says what comes next. A
 * switch that stops the engine's wait (follow_switch) starts over on the
 * new engine; cerb__lock_acquire registers the hold afterwards.
 */

/* An acquisition in progress on the engines. */
struct acq {
    cerb_client *c;
    struct cerb_engine_hold **hp;        /* the hold; replaced when it moves */
    struct cerb_waiter *w;
    int64_t deadline_ns;          /* 0: one try, no wait */
    const atomic_int *intr;
    const struct cerb_retry_config *rc;
    int attempt;                  /* tries since the last start-over */
    size_t moves;                 /* engines carried to after a failure */
    int follows;                  /* reloads after a closed engine refused */
    uint32_t relied;              /* engines whose records the confirmation
                                     relied on instead of claims (closure.c) */
    int64_t t0;                   /* when the last acquire was sent */
    cerb_grant g;                 /* the last acquire's (or settle's) grant */
    cerb_status st;               /* the outcome once ACQ_DONE */
    char why[CERB_ERROR_MAX];     /* the last failure's reason */
};

enum acq_next {
    ACQ_ON,       /* go on with the next step of this attempt */
    ACQ_FAILED,   /* the engine failed (hard error): acq_failed */
    ACQ_GRANTED,  /* granted: acq_confirm */
    ACQ_RETRY,    /* next attempt on the same engine */
    ACQ_RESTART,  /* start over (attempts from 0): moved, or a grant undone */
    ACQ_DONE      /* finished with a.st */
};

static enum acq_next acq_done(struct acq *a, cerb_status st)
{
    a->st = st;
    return ACQ_DONE;
}

/* A switch between choosing the engine and registering in the in-flight
 * list: nothing was sent yet, just move. */
static void acq_choose(struct acq *a)
{
    if (a->attempt != 0 || a->moves != 0)
        return;
    int64_t ep;
    int cur = cerb__route(a->c, &ep);
    if (cur != (*a->hp)->engine_idx && a->c->engines[cur].e)
        rehome(a->c, a->hp, a->w, cur, ep, false);
}

/* After a switch, the engine we left must agree first. */
static enum acq_next acq_gate(struct acq *a)
{
    struct cerb_engine_hold *h = *a->hp;
    cerb_status st = cerb__switch_gate(a->c, h->engine_idx, h->slot, &h->lk, a->deadline_ns, &a->w->stop);
    if (st == CERB_INTERRUPTED && follow_switch(a->c, a->hp, a->w, false))
        return ACQ_RESTART;
    if (st != CERB_OK) {
        a->w->gate_said = st != CERB_INTERRUPTED; /* its reason is the one to keep */
        return acq_done(a, st);
    }
    return ACQ_ON;
}

/*
 * The engine's closure record refused the grant: a switch closed it to this
 * client's epoch. Not a failure of the engine (its breaker is not told).
 * When the record is newer than our file, the file is read again; if that
 * moved new acquisitions (another engine, or a new epoch), go on there.
 */
static enum acq_next acq_closed(struct acq *a)
{
    cerb_client *c = a->c;
    struct cerb_engine_hold *h = *a->hp;
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    uint64_t done0 = atomic_load(&c->closure_reloads);
    cerb__closure_refused(c, h->engine_idx, a->g.closed_epoch);
    bool asked = atomic_load(&c->closure_reload_want) != 0;
    /* The probe thread reloads the file; a wait with time left watches the
     * route move, a trylock does not wait for it. */
    for (;;) {
        int64_t ep;
        int cur = cerb__route(c, &ep);
        if ((cur != h->engine_idx || ep != h->epoch) && a->follows++ < 3 && c->engines[cur].e &&
            rehome(c, a->hp, a->w, cur, ep, false) == CERB_OK)
            return ACQ_RESTART;
        if (!asked || a->deadline_ns == 0 || cerb__ms_left(a->deadline_ns) <= 0 ||
            (atomic_load(&c->closure_reloads) != done0 && !atomic_load(&c->closure_reload_want)))
            break;
        int64_t nap = cerb__ms_left(a->deadline_ns);
        cerb__nap_ms(nap < 20 ? nap : 20);
        if (a->intr && atomic_load(a->intr))
            return acq_done(a, CERB_INTERRUPTED);
    }
    /* Closed at our own epoch: this client was moved there by itself (an
     * in-process switch or pin), which no reload can change. */
    bool own = a->g.closed_epoch == h->epoch;
    return acq_done(a, cerb__error_set(CERB_UNAVAILABLE, "%s%s", why,
                                       own ? " (the configuration file makes another engine "
                                             "active at this epoch: an in-process switch "
                                             "cannot reopen it; `cerberus switch` can)"
                                       : !c->boot_cfg->path ? " (this client has no file)"
                                       : asked ? " (its file is being read again)" : ""));
}

static enum acq_next acq_try(struct acq *a)
{
    cerb_client *c = a->c;
    struct cerb_engine_hold *h = *a->hp;
    struct cerb_client_engine *ce = &c->engines[h->engine_idx];
    a->t0 = cerb_monotime();
    h->lk.fence_floor = (cerb__engine_caps(ce->ops, atomic_load(&ce->e)) & CERB_CAP_FENCE_FLOOR)
                            ? fence_floor(c, h->engine_idx, h->epoch) : 0;
    cerb_status st = cerb__engine_acquire(ce->ops, ce->e, &h->lk, a->deadline_ns, &a->w->stop,
                                          &a->g);
    if (st != CERB_OK && a->g.closed_epoch > 0)
        return acq_closed(a);
    if (st != CERB_OK && a->g.no_prim)
        return acq_done(a, st); /* the engine is fine; it has no such primitive */
    if (st == CERB_OK) {
        cerb__health_ok(c, h->engine_idx);
        /* Granted on the engine a switch was moving us away from, in the
         * same instant: give it back there (the background release) and
         * carry on where the switch sent us. */
        if (atomic_load(&a->w->moved) && atomic_load(&c->current) != h->engine_idx &&
            follow_switch(c, a->hp, a->w, true))
            return ACQ_RESTART;
        return ACQ_GRANTED;
    }
    if (st == CERB_INTERRUPTED && follow_switch(c, a->hp, a->w, true))
        return ACQ_RESTART;
    if (!hard_error(st))
        return acq_done(a, st);
    a->st = st;
    cerb__error_copy(a->why, sizeof a->why);
    return ACQ_FAILED;
}

/* The selector may have moved new acquisitions elsewhere by now: carry on
 * there, within the same deadline, leaving whatever our last request did on
 * the failed engine to the background. */
static bool acq_move(struct acq *a, bool maybe_landed)
{
    int64_t ep;
    int cur = cerb__route(a->c, &ep);
    if (cur == (*a->hp)->engine_idx || a->moves >= a->c->n_engines ||
        (a->deadline_ns != 0 && cerb_monotime() >= a->deadline_ns) || !a->c->engines[cur].e ||
        rehome(a->c, a->hp, a->w, cur, ep, maybe_landed) != CERB_OK)
        return false;
    a->moves++;
    return true;
}

static enum acq_next acq_failed(struct acq *a)
{
    cerb_client *c = a->c;
    struct cerb_engine_hold *h = *a->hp;
    struct cerb_client_engine *ce = &c->engines[h->engine_idx];
    cerb__health_fail(c, h->engine_idx, "acquire");
    bool unknown = a->g.outcome == CERB_OUTCOME_UNKNOWN;
    if (acq_move(a, unknown))
        return ACQ_RESTART;
    if (unknown) {
        cerb_grant g2;
        cerb_status s2 = settle(c, ce, h, a->rc, a->deadline_ns, &g2);
        if (s2 == CERB_OK) {
            /* It landed. What the server said about the key is the truth
             * (a Redis hand-off key lives only PX 2000); only an engine
             * that reports no TTL gets the lease from t0, when the request
             * left at the earliest. */
            a->g.fence = g2.fence;
            if (g2.ttl_ms > 0 && g2.sent_ns > 0) {
                a->g.sent_ns = g2.sent_ns;
                a->g.ttl_ms = g2.ttl_ms;
            } else {
                a->g.sent_ns = a->g.sent_ns ? a->g.sent_ns : a->t0;
                a->g.ttl_ms = h->lk.lease_ms;
            }
            h->next_renew_ns = cerb_monotime(); /* refresh at once */
            h->renew_once = true;
            return ACQ_GRANTED; /* a settled grant is checked like any other */
        }
        if (s2 == CERB_NOT_OWNER && (h->lk.prim == CERB_PRIM_SEMAPHORE ||
                                     h->lk.prim == CERB_PRIM_RWLOCK)) {
            /* Not granted is not absent: a queued primitive's member may
             * wait there still (on a session, for good). The background
             * release removes it; the next try goes with a fresh token. */
            if (rehome(c, a->hp, a->w, h->engine_idx, h->epoch, true) != CERB_OK)
                cerb__engine_release(ce->ops, ce->e, &h->lk); /* no memory: try now */
            h = *a->hp;
        }
        if (s2 != CERB_NOT_OWNER) {
            /* Unsettled: a late landing must leave no orphan. Move on if
             * the selector has switched meanwhile; otherwise hand the
             * release to the background and report the failure. */
            if (acq_move(a, true))
                return ACQ_RESTART;
            if (rehome(c, a->hp, a->w, h->engine_idx, h->epoch, true) != CERB_OK)
                cerb__engine_release(ce->ops, ce->e, &h->lk); /* no memory: try now */
            return acq_done(a, cerb__error_set(a->st, "%s (outcome unknown, re-check failed)",
                                               a->why));
        }
    }
    if (a->deadline_ns == 0 || a->attempt >= a->rc->max)
        return acq_done(a, cerb__error_set(a->st, "%s", a->why));
    int64_t nap = cerb__backoff_ms(a->attempt, a->rc->backoff_ms, a->rc->backoff_max_ms);
    if (cerb__ms_left(a->deadline_ns) <= nap)
        return acq_done(a, cerb__error_set(a->st, "%s", a->why));
    cerb__nap_ms(nap);
    if (a->intr && atomic_load(a->intr))
        return acq_done(a, CERB_INTERRUPTED);
    return ACQ_RETRY;
}

/* The grant's conservative deadline, its claims' included. */
static int64_t acq_valid_until(const struct acq *a)
{
    int64_t until = cerb__grant_deadline(&a->g);
    for (struct cerb_engine_hold *k = (*a->hp)->claims; k; k = k->claim_next)
        if (k->valid_until_ns < until)
            until = k->valid_until_ns;
    return until;
}

/* Give back a grant that cannot be reported (its deadline passed, or the
 * caller's did): it and its claims are released in the background (the
 * engines of a slow confirmation would make the caller wait for each), the
 * acquisition goes on with a fresh hold and token, and starts over after a
 * jittered back-off while the caller's deadline leaves time, else ends
 * with `st`. */
static enum acq_next acq_give_back(struct acq *a, cerb_status st, const char *why)
{
    cerb_client *c = a->c;
    struct cerb_engine_hold *h = *a->hp;
    snprintf(a->why, sizeof a->why, "%s", why);
    claims_unwatch(c, h);
    while (h->claims) {
        struct cerb_engine_hold *k = h->claims;
        h->claims = k->claim_next;
        cerb__watchdog_orphan(c, k);
    }
    cerb_status us = rehome(c, a->hp, a->w, h->engine_idx, h->epoch, true);
    if (us != CERB_OK)
        return acq_done(a, us);
    int64_t nap = cerb__backoff_ms(a->attempt, a->rc->backoff_ms, a->rc->backoff_max_ms);
    if (a->deadline_ns == 0 || cerb__ms_left(a->deadline_ns) <= nap)
        return acq_done(a, cerb__error_set(st, "%s", a->why));
    cerb__nap_ms(nap);
    if (a->intr && atomic_load(a->intr))
        return acq_done(a, CERB_INTERRUPTED);
    return ACQ_RESTART;
}

/*
 * A short hand-off lease (a Redis hand-off key lives PX 2000) extended to
 * the full lease at once, before anything slow comes between the grant and
 * its registration (the watchdog extends it only after that). CERB_OK
 * (extended, or the engine did not answer: the deadline check after the
 * confirmation decides), or CERB_NOT_OWNER (it lapsed already).
 */
static cerb_status acq_extend(struct acq *a)
{
    struct cerb_engine_hold *h = *a->hp;
    if (a->g.ttl_ms <= 0 || a->g.ttl_ms >= h->lk.lease_ms)
        return CERB_OK;
    struct cerb_client_engine *ce = &a->c->engines[h->engine_idx];
    cerb_grant g2;
    memset(&g2, 0, sizeof g2);
    cerb_status st = cerb__engine_renew(ce->ops, ce->e, &h->lk, &g2);
    if (st == CERB_NOT_OWNER)
        return st;
    if (st == CERB_OK && g2.sent_ns > 0) {
        a->g.sent_ns = g2.sent_ns;
        a->g.ttl_ms = g2.ttl_ms > 0 ? g2.ttl_ms : h->lk.lease_ms;
    }
    return CERB_OK;
}

/*
 * A grant while another engine is gated: asked again, and claimed there.
 * The confirmation can be slow (a gated engine in a gray failure: a
 * question and a claim, an operation timeout each), so the grant's short
 * lease is extended first, no step starts once the caller's deadline has
 * passed, and a grant whose deadline passed meanwhile is given back, never
 * reported: another process may hold the name by then (§5a.1, §5a.2).
 */
static enum acq_next acq_confirm(struct acq *a)
{
    cerb_client *c = a->c;
    struct cerb_engine_hold *h = *a->hp;
    /* Taken now, before anything slow: an engine skipped here for its
     * record stays relied on even if the record's trust lapses before the
     * grant is registered (acq_lease). */
    a->relied = cerb__closure_relied(c, h->engine_idx);
    if (!cerb__gate_confirm_any(c, h->engine_idx, h->slot))
        return acq_done(a, CERB_OK);
    bool timed = a->deadline_ns != 0;
    cerb_status late = timed ? CERB_TIMEOUT : CERB_BUSY;
    static const char ran_out[] = "the wait ran out while the grant was confirmed with the "
                                  "engines switched from";
    if (timed && cerb__ms_left(a->deadline_ns) <= 0)
        return acq_give_back(a, CERB_TIMEOUT, ran_out);
    if (acq_extend(a) == CERB_NOT_OWNER)
        return acq_give_back(a, late, "a hand-off lapsed before it could be confirmed");
    if (timed && cerb__ms_left(a->deadline_ns) <= 0)
        return acq_give_back(a, CERB_TIMEOUT, ran_out);
    /* The gate asked before the grant; ask again after it, or a process
     * granted on the gated engine in between (it asked us before our
     * grant) would hold the name with us. */
    cerb_status st = cerb__switch_gate(c, h->engine_idx, h->slot, &h->lk, 0, NULL);
    if (st == CERB_OK && timed && cerb__ms_left(a->deadline_ns) <= 0)
        return acq_give_back(a, CERB_TIMEOUT, ran_out);
    if (st == CERB_OK)
        st = claims_take(c, h);
    if (st == CERB_OK) {
        if (cerb_monotime() < acq_valid_until(a))
            return acq_done(a, CERB_OK);
        return acq_give_back(a, late, "the grant's lease ran out while it was confirmed with "
                                      "the engines switched from");
    }
    cerb__error_copy(a->why, sizeof a->why);
    if (st == CERB_ECONFIG) {
        /* A claim refused for good (claims_take): no retry changes it. */
        undo_grant(c, a->hp, a->w);
        return acq_done(a, cerb__error_set(st, "%s", a->why));
    }
    if (undo_grant(c, a->hp, a->w) != CERB_OK || a->deadline_ns == 0 ||
        cerb__ms_left(a->deadline_ns) <= a->rc->backoff_ms) {
        a->w->gate_said = true;
        return acq_done(a, cerb__error_set(CERB_BUSY, "%s", a->why));
    }
    /* Two racing grants may both have stepped back: apart again with
     * jitter before asking the gate once more. */
    cerb__nap_ms(cerb__backoff_ms(a->attempt, a->rc->backoff_ms, a->rc->backoff_max_ms));
    return ACQ_RESTART;
}

/* The grant's deadline and first renewal. */
static void acq_lease(struct acq *a)
{
    struct cerb_engine_hold *h = *a->hp;
    const cerb_grant *g = &a->g;
    atomic_fetch_add(&a->c->engines[h->engine_idx].acquires, 1);
    h->fence = g->fence;
    h->valid_until_ns = cerb__grant_deadline(g);
    /* No longer than its claims from the start (the watchdog keeps it so
     * at each renewal): a claim's engine may promise less (a session's
     * remaining TTL), and cerb_lock_state reads this deadline alone. */
    for (struct cerb_engine_hold *k = h->claims; k; k = k->claim_next)
        if (k->valid_until_ns < h->valid_until_ns)
            h->valid_until_ns = k->valid_until_ns;
    /* Engines that took no claim because their record closes them: this
     * hold relies on their records instead, a bound the watchdog applies as
     * they are read (closure.c, cerb__closure_cap). */
    h->relies = a->relied | cerb__closure_relied(a->c, h->engine_idx);
    for (struct cerb_engine_hold *k = h->claims; k; k = k->claim_next)
        h->relies &= ~(1u << k->engine_idx);
    int64_t eff = g->ttl_ms > 0 && g->ttl_ms < h->lk.lease_ms ? g->ttl_ms : h->lk.lease_ms;
    if (g->ttl_ms > 0 && g->ttl_ms < h->lk.lease_ms) {
        /* A short hand-off lease: extended to the full lease once (even
         * without renewal), soon but not at once: a release waits for a
         * renewal in flight, so a holder done within a round trip paid for
         * the extension in its hand-off to the next (about one round trip
         * of redis's two). A twentieth of the hand-off lease (100 ms of 2 s
         * at most) spares short holds and leaves nearly all of it for
         * retries should the extension fail (a third left too little for a
         * retry after one operation timeout). An earlier renewal already
         * set (a settled grant: at once) stays. */
        int64_t delay = eff * CERB_NS_PER_MS / 20;
        if (delay > 100 * CERB_NS_PER_MS)
            delay = 100 * CERB_NS_PER_MS;
        int64_t at = (g->sent_ns ? g->sent_ns : cerb_monotime()) + delay;
        if (h->next_renew_ns == 0 || at < h->next_renew_ns)
            h->next_renew_ns = at;
        h->renew_once = true;
    } else if (h->next_renew_ns == 0) {
        h->next_renew_ns = g->sent_ns + eff * CERB_NS_PER_MS / 3;
    }
}

static cerb_status engine_acquire(cerb_client *c, struct cerb_engine_hold **hp, struct cerb_waiter *w,
                                  int64_t deadline_ns, const atomic_int *intr,
                                  const struct cerb_retry_config *rc)
{
    struct acq a = {.c = c, .hp = hp, .w = w, .deadline_ns = deadline_ns, .intr = intr, .rc = rc};
    enum acq_next next = ACQ_RESTART;
    for (;;) {
        if (next == ACQ_RESTART)
            a.attempt = 0;
        else
            a.attempt++;
        acq_choose(&a);
        next = acq_gate(&a);
        if (next == ACQ_ON)
            next = acq_try(&a);
        if (next == ACQ_FAILED)
            next = acq_failed(&a);
        if (next == ACQ_GRANTED)
            next = acq_confirm(&a);
        if (next == ACQ_DONE)
            break;
    }
    if (a.st == CERB_OK)
        acq_lease(&a);
    return a.st;
}

static void iwaiter_unlink(cerb_lock *l, struct cerb_waiter *w)
{
    for (struct cerb_waiter **pp = &l->iwaiters; *pp; pp = &(*pp)->hnext)
        if (*pp == w) {
            *pp = w->hnext;
            break;
        }
}

/*
 * ---- the acquisition, top-down ----
 *
 * cerb__lock_acquire is the whole sequence:
 *   reenter      a thread that holds the name counts one more hold;
 *   line_up      the name's local line (waitq.c): only its head goes on;
 *   start_hold   the slot taken, a hold with a fresh token on the engine
 *                and epoch of the route;
 *   engine_acquire  the engines' steps above (choose, gate, try, settle,
 *                confirm, lease);
 *   finish       the grant registered (fence with its epoch, VALID, the
 *                slot's holder) and watched, or the slot given back.
 */

/* Step 1. Returns true when the calling thread already held the name;
 * *st is then the outcome. slot->mu held. */
static bool reenter(cerb_client *c, struct cerb_slot *s, uint64_t me, cerb_status *st)
{
    if (s->holder_tid != me || me == CERB_HOLDER_OBJECT)
        return false;
    /* The deadline is the truth even before the watchdog marked it. */
    if (atomic_load(&s->hold->state) == CERB_LOCK_LOST ||
        cerb_monotime() >= cerb__hold_until(c, s->hold)) {
        *st = cerb__error_set(CERB_LOST, "lock \"%s\" was lost; unlock it first", s->name);
        return true;
    }
    s->count++;
    *st = CERB_OK;
    return true;
}

/* Step 2: w joins the line and waits to be its head with the slot free
 * (a try does not wait). CERB_OK leaves w registered on the handle; any
 * other outcome has undone that. slot->mu held. */
static cerb_status line_up(cerb_lock *l, struct cerb_waiter *w, int64_t deadline_ns,
                           bool interruptible, bool try_only, uint64_t me)
{
    struct cerb_slot *s = l->slot;
    memset(w, 0, sizeof *w);
    w->handle = l;
    w->interruptible = interruptible;
    cerb__cond_init(&w->cond);
    cerb__waitq_push(s, w);
    l->nwaiting++;
    if (interruptible) {
        w->hnext = l->iwaiters;
        l->iwaiters = w;
    }
    cerb_status st;
    if (try_only) {
        st = s->qhead == w && !s->occupied ? CERB_OK : CERB_BUSY;
        if (st != CERB_OK)
            cerb__waitq_remove(s, w);
    } else {
        st = cerb__waitq_wait(s, w, deadline_ns);
    }
    if (st == CERB_OK)
        return CERB_OK;
    iwaiter_unlink(l, w);
    l->nwaiting--;
    cerb__cond_destroy(&w->cond);
    if (st == CERB_BUSY)
        return cerb__error_set(st, "lock \"%s\" is held %s", s->name,
                               s->holder_tid == CERB_HOLDER_OBJECT ? "by a hold object of this process"
                               : s->holder_tid == me ? "by this thread (holds are not reentrant)"
                                                     : "by another thread of this process");
    return cerb__error_set(st, "lock \"%s\": %s", s->name, cerb_strerror(st));
}

/* Step 3: the head takes the slot and a hold for the engines, on the
 * engine and epoch of the route. slot->mu held. */
static cerb_status start_hold(cerb_lock *l, struct cerb_waiter *w, struct cerb_call_cfg *cc,
                              struct cerb_engine_hold **hp)
{
    cerb_client *c = l->client;
    struct cerb_slot *s = l->slot;
    cerb__waitq_remove(s, w);
    s->occupied = true;
    cerb__client_call_cfg(c, cc);
    int64_t epoch;
    int idx = cerb__route(c, &epoch);
    struct cerb_engine_hold *h = hold_new(c, s, idx, epoch);
    cerb_status st;
    if (!h) {
        st = cerb__error_set(CERB_ENOMEM, "out of memory");
    } else {
        h->lk.lease_ms = l->lease_ms > 0 ? l->lease_ms : cc->lease_ms;
        h->lk.fair = l->fair_set ? l->fair : cc->fair;
        h->renew = l->renew_set ? l->renew : cc->renew;
        st = cerb__engine_hold_prim(h, l->prim, l->variant, l->value, l->value_len);
        h->lk.limit = l->limit;
        h->lk.count = l->count;
        if (st == CERB_OK)
            st = cerb__token_new(h->lk.token);
    }
    w->engine_hold = h;
    *hp = h;
    return st;
}

/* Step 5: register the grant, or give the slot back. slot->mu held. */
static void finish(cerb_lock *l, struct cerb_waiter *w, struct cerb_engine_hold *h, uint64_t me,
                   cerb_status st)
{
    cerb_client *c = l->client;
    struct cerb_slot *s = l->slot;
    w->engine_hold = NULL;
    iwaiter_unlink(l, w);
    l->nwaiting--;
    if (st != CERB_OK) {
        s->occupied = false;
        cerb__waitq_wake(s);
        return;
    }
    /* A wait that began before an epoch bump (cerberus switch) on the
     * engine still current is granted after it: it ranks with the grants
     * made after the bump, not before. */
    int64_t ep_now, ep = h->epoch;
    if (cerb__route(c, &ep_now) == h->engine_idx && ep_now > ep)
        ep = ep_now;
    /* An engine instance without fencing has no token: 0, not a constant
     * epoch << 48 that a resource would take for one. */
    struct cerb_client_engine *gce = &c->engines[h->engine_idx];
    if (cerb__engine_caps(gce->ops, atomic_load(&gce->e)) & CERB_CAP_FENCING)
        h->fence = cerb__fence_compose(ep, h->fence);
    else
        h->fence = 0;
    fence_granted(c, h);
    h->owner_handle = l;
    atomic_store(&h->state, CERB_LOCK_VALID);
    s->hold = h;
    s->holder_tid = me;
    s->count = 1;
}

cerb_status cerb__lock_acquire_as(cerb_lock *l, int64_t deadline_ns, bool interruptible,
                                  bool try_only, uint64_t me)
{
    if (!cerb__lock_alive(l))
        return cerb__lock_refused(l, "bad lock handle");
    cerb_client *c = l->client;
    struct cerb_slot *s = l->slot;
    struct cerb_call_cfg cc;
    struct cerb_waiter w;
    struct cerb_engine_hold *h = NULL;
    cerb_status st;

    int64_t called_ns = cerb_monotime();
    cerb__mutex_lock(&s->mu);
    if (reenter(c, s, me, &st)) {
        cerb__mutex_unlock(&s->mu);
        return st;
    }
    if (interruptible && l->intr_pending) {
        l->intr_pending = false;
        cerb__mutex_unlock(&s->mu);
        return cerb__error_set(CERB_INTERRUPTED, "interrupted");
    }
    st = line_up(l, &w, deadline_ns, interruptible, try_only, me);
    if (st != CERB_OK) {
        cerb__mutex_unlock(&s->mu);
        return st;
    }
    st = start_hold(l, &w, &cc, &h);
    cerb__mutex_unlock(&s->mu);

    if (st == CERB_OK) {
        /* Only acquisitions that may wait are moved by a switch: a try is
         * over within an op timeout, well inside the settling time before
         * anyone trusts the old engine's "free" for good. */
        if (!try_only)
            cerb__inflight_add(c, &w);
        st = engine_acquire(c, &h, &w, try_only ? 0 : deadline_ns,
                            interruptible ? &w.interrupted : &never_interrupted, &cc.retry);
        if (!try_only)
            cerb__inflight_del(c, &w);
    }

    cerb__mutex_lock(&s->mu);
    finish(l, &w, h, me, st);
    cerb__mutex_unlock(&s->mu);
    cerb__cond_destroy(&w.cond);
    if (st != CERB_OK) {
        hold_free(h);
        if (w.gate_said) /* "still held on engine A after a switch", or
                            "A cannot confirm it is free": not another owner here */
            return st;
        if (st == CERB_BUSY)
            return cerb__error_set(st, "lock \"%s\" is held by another owner", s->name);
        if (st == CERB_TIMEOUT || st == CERB_INTERRUPTED)
            return cerb__error_set(st, "lock \"%s\": %s", s->name, cerb_strerror(st));
        return st;
    }
    h->granted_ns = cerb_monotime();
    cerb__histo_observe(&c->engines[h->engine_idx].wait_h, CERB_HISTO_WAIT,
                        h->granted_ns - called_ns);
    atomic_fetch_add_explicit(&c->holds_in_force, 1, memory_order_relaxed);
    cerb__watchdog_add(c, h);
    for (struct cerb_engine_hold *k = h->claims; k; k = k->claim_next)
        cerb__watchdog_add(c, k);
    return CERB_OK;
}

cerb_status cerb__lock_acquire(cerb_lock *l, int64_t deadline_ns, bool interruptible,
                               bool try_only)
{
    if (!cerb__lock_ok(l))
        return cerb__lock_refused(l, "bad lock handle");
    return cerb__lock_acquire_as(l, deadline_ns, interruptible, try_only, cerb__thread_id());
}

cerb_status cerb_lock_lock(cerb_lock *l)
{
    return cerb__lock_acquire(l, CERB_DEADLINE_NEVER, false, false);
}

cerb_status cerb_lock_trylock(cerb_lock *l)
{
    return cerb__lock_acquire(l, 0, false, true);
}

cerb_status cerb_lock_trylock_for(cerb_lock *l, int64_t wait_ms)
{
    if (wait_ms == 0) {
        cerb_status st = cerb__lock_acquire(l, 0, true, true);
        return st == CERB_BUSY ? CERB_TIMEOUT : st;
    }
    return cerb__lock_acquire(l, cerb__deadline_in(wait_ms), true, false);
}

cerb_status cerb_lock_lock_interruptibly(cerb_lock *l)
{
    return cerb__lock_acquire(l, CERB_DEADLINE_NEVER, true, false);
}

cerb_status cerb_lock_interrupt(cerb_lock *l)
{
    if (!cerb__lock_ok(l))
        return cerb__lock_refused(l, "bad lock handle");
    cerb__lock_interrupt(l);
    return CERB_OK;
}

void cerb__lock_interrupt(cerb_lock *l)
{
    struct cerb_slot *s = l->slot;
    cerb__mutex_lock(&s->mu);
    if (!l->iwaiters)
        l->intr_pending = true;
    for (struct cerb_waiter *w = l->iwaiters; w; w = w->hnext) {
        atomic_store(&w->interrupted, 1);
        atomic_store(&w->stop, 1);
        cerb__cond_signal(&w->cond);
        if (w->engine_hold) {
            /* The hold stays alive: its thread needs s->mu to free it. */
            struct cerb_client_engine *ce = &l->client->engines[w->engine_hold->engine_idx];
            cerb__engine_cancel(ce->ops, ce->e, &w->engine_hold->lk);
        }
    }
    cerb__mutex_unlock(&s->mu);
}

/* ---- release ---- */

static cerb_status engine_release(cerb_client *c, struct cerb_engine_hold *h)
{
    struct cerb_client_engine *ce = &c->engines[h->engine_idx];
    struct cerb_call_cfg cc;
    cerb_status st;

    cerb__client_call_cfg(c, &cc);
    for (int attempt = 0;; attempt++) {
        st = cerb__engine_release(ce->ops, ce->e, &h->lk);
        /* A failed attempt may have deleted the key with its reply lost.
         * Then the retry's "not owner" is our own release, not a loss: the
         * hold was in force (nobody else can be granted it before our
         * deadline), so the first attempt must have taken it. */
        if (st == CERB_NOT_OWNER && attempt > 0 && atomic_load(&h->state) != CERB_LOCK_LOST &&
            cerb_monotime() < cerb__hold_until(c, h))
            st = CERB_OK;
        if (st == CERB_OK || st == CERB_NOT_OWNER)
            break;
        cerb__health_fail(c, h->engine_idx, "release");
        /* Once new acquisitions have left this engine (its breaker opened),
         * the caller is not kept waiting on it: the lease ends the hold. */
        if (attempt >= cc.retry.max || atomic_load(&c->current) != h->engine_idx)
            break;
        cerb__nap_ms(cerb__backoff_ms(attempt, cc.retry.backoff_ms, cc.retry.backoff_max_ms));
    }
    return st;
}

/* Drop the calling thread's hold entirely; slot->mu not held. */
static cerb_status release_hold(cerb_lock *l)
{
    cerb_client *c = l->client;
    struct cerb_slot *s = l->slot;
    struct cerb_engine_hold *h = s->hold;

    claims_unwatch(c, h);
    cerb__watchdog_remove(c, h);
    cerb__histo_observe(&c->engines[h->engine_idx].hold_h, CERB_HISTO_HOLD,
                        cerb_monotime() - h->granted_ns);
    atomic_fetch_sub_explicit(&c->holds_in_force, 1, memory_order_relaxed);
    bool was_lost = atomic_load(&h->state) == CERB_LOCK_LOST;
    cerb_status st = engine_release(c, h);
    /* Claims after the hold: until it is released the engines it claimed
     * keep refusing the processes that did not switch. */
    if (!claims_drop(c, h))
        was_lost = true;
    const char *verb = l->as_hold ? "release" : "unlock";
    if (was_lost || st == CERB_NOT_OWNER)
        st = cerb__error_set(CERB_LOST, "lock \"%s\" had been lost before %s", s->name, verb);
    else if (st != CERB_OK)
        cerb__error_prefix("%s \"%s\" (the lease will expire by itself)", verb, s->name);

    cerb__mutex_lock(&s->mu);
    s->hold = NULL;
    s->holder_tid = 0;
    s->count = 0;
    s->occupied = false;
    cerb__waitq_wake(s);
    cerb__mutex_unlock(&s->mu);
    hold_free(h);
    return st;
}

cerb_status cerb_lock_unlock(cerb_lock *l)
{
    if (!cerb__lock_ok(l))
        return cerb__lock_refused(l, "bad lock handle");
    struct cerb_slot *s = l->slot;
    uint64_t me = cerb__thread_id();

    cerb__mutex_lock(&s->mu);
    if (s->holder_tid != me) {
        cerb__mutex_unlock(&s->mu);
        return cerb__error_set(CERB_NOT_OWNER, "lock \"%s\" is not held by this thread", s->name);
    }
    if (--s->count > 0) {
        cerb__mutex_unlock(&s->mu);
        return CERB_OK;
    }
    cerb__mutex_unlock(&s->mu);
    return release_hold(l);
}

cerb_status cerb__lock_release_object(cerb_lock *l)
{
    struct cerb_slot *s = l->slot;
    cerb__mutex_lock(&s->mu);
    bool mine = s->holder_tid == CERB_HOLDER_OBJECT && s->hold && s->hold->owner_handle == l;
    cerb__mutex_unlock(&s->mu);
    return mine ? release_hold(l) : CERB_NOT_OWNER;
}

cerb_status cerb__lock_release_all(cerb_lock *l)
{
    struct cerb_slot *s = l->slot;
    cerb__mutex_lock(&s->mu);
    bool mine = s->holder_tid == cerb__thread_id();
    cerb__mutex_unlock(&s->mu);
    return mine ? release_hold(l) : CERB_NOT_OWNER;
}

/* ---- queries ---- */

uint64_t cerb_lock_fencing_token(const cerb_lock *cl)
{
    if (!cerb__lock_ok(cl))
        return 0;
    struct cerb_slot *s = cl->slot;
    uint64_t f = 0;
    cerb__mutex_lock(&s->mu);
    if (s->holder_tid == cerb__thread_id())
        f = s->hold->fence;
    cerb__mutex_unlock(&s->mu);
    return f;
}

unsigned cerb_lock_hold_count(const cerb_lock *cl)
{
    if (!cerb__lock_ok(cl))
        return 0;
    struct cerb_slot *s = cl->slot;
    unsigned n = 0;
    cerb__mutex_lock(&s->mu);
    if (s->holder_tid == cerb__thread_id())
        n = s->count;
    cerb__mutex_unlock(&s->mu);
    return n;
}

const char *cerb_lock_name(const cerb_lock *cl)
{
    return cerb__lock_ok(cl) ? cl->slot->name : NULL;
}

enum cerb_lock_state cerb_lock_state(const cerb_lock *cl)
{
    if (!cerb__lock_ok(cl))
        return CERB_LOCK_FREE;
    struct cerb_slot *s = cl->slot;
    enum cerb_lock_state st = CERB_LOCK_FREE;
    cerb__mutex_lock(&s->mu);
    if (s->holder_tid == cerb__thread_id())
        st = cerb__hold_state(cl->client, s->hold);
    cerb__mutex_unlock(&s->mu);
    return st;
}

enum cerb_lock_state cerb__hold_state(cerb_client *c, const struct cerb_engine_hold *h)
{
    enum cerb_lock_state st = (enum cerb_lock_state)atomic_load(&((struct cerb_engine_hold *)h)->state);
    /* The watchdog may not have run yet: the deadline is the truth (with
     * the records the hold relies on, closure.c). */
    if (st != CERB_LOCK_LOST && cerb_monotime() >= cerb__hold_until(c, h))
        st = CERB_LOCK_LOST;
    return st;
}

cerb_status cerb_lock_on_lost(cerb_lock *l, void (*cb)(cerb_lock *, void *), void *ud)
{
    if (!cerb__lock_ok(l))
        return cerb__lock_refused(l, "bad lock handle");
    cerb__mutex_lock(&l->slot->mu);
    l->lost_cb = cb;
    l->lost_ud = ud;
    cerb__mutex_unlock(&l->slot->mu);
    return CERB_OK;
}

int cerb__lock_engine_idx(cerb_lock *l)
{
    struct cerb_slot *s = l->slot;
    int idx = -1;
    cerb__mutex_lock(&s->mu);
    uint64_t who = l->as_hold ? CERB_HOLDER_OBJECT : cerb__thread_id();
    if (s->hold && s->holder_tid == who && s->hold->owner_handle == l)
        idx = s->hold->engine_idx;
    cerb__mutex_unlock(&s->mu);
    return idx;
}

bool cerb__lock_busy(cerb_lock *l)
{
    struct cerb_slot *s = l->slot;
    cerb__mutex_lock(&s->mu);
    bool busy = l->nwaiting > 0 || (s->hold && s->hold->owner_handle == l);
    cerb__mutex_unlock(&s->mu);
    return busy;
}

cerb_status cerb_lock_free(cerb_lock *l)
{
    if (!l)
        return CERB_OK;
    if (!cerb__lock_ok(l))
        return cerb__lock_refused(l, "bad lock handle");
    struct cerb_slot *s = l->slot;
    uint64_t me = cerb__thread_id();

    cerb__mutex_lock(&s->mu);
    bool through_me = s->hold && s->hold->owner_handle == l;
    if ((through_me && s->holder_tid != me) || l->nwaiting > 0) {
        cerb__mutex_unlock(&s->mu);
        return cerb__error_set(CERB_BUSY, "lock \"%s\" is held or awaited through this handle by another thread",
                               s->name);
    }
    bool mine = through_me && s->holder_tid == me;
    cerb__mutex_unlock(&s->mu);
    cerb_status st = mine ? release_hold(l) : CERB_OK;
    if (st == CERB_LOST)
        st = CERB_OK; /* freeing a lost hold is what the caller should do */
    cerb__lock_retire(l);
    return st;
}

void cerb__lock_retire(cerb_lock *l)
{
    cerb_client *c = l->client;
    cerb__mutex_lock(&c->mu);
    if (l->prev)
        l->prev->next = l->next;
    else
        c->handles = l->next;
    if (l->next)
        l->next->prev = l->prev;
    cerb__mutex_unlock(&c->mu);
    atomic_store(&l->magic, CERB_DEAD_MAGIC);
    cerb__slot_put(c, l->slot);
    /* Its queued lost callbacks are dropped; a running one keeps reading
     * the (dead) handle until it returns, and the callback thread frees it. */
    if (!cerb__notify_forget(c, l))
        cerb__free(l);
}
