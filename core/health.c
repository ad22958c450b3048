/*
 * health.c — the client's side of failover: feeding each engine's circuit
 * breaker, choosing the active engine, switching, and the safe-switch gate.
 *
 * Breakers (failover/breaker.c) are pure state machines; this file gives
 * them the time, holds the client's failover mutex around them, logs and
 * counts their transitions, and asks the selector (failover/selector.c)
 * after every change whether new acquisitions should move.
 *
 * Successes of real calls are frequent and must not serialise the lock hot
 * path on one mutex, so they are counted in an atomic and folded into the
 * breaker the next time anything takes the mutex (a failure, a probe — the
 * prober runs every probe_interval_ms). Their time stamp is then a little
 * late, which only matters at the edge of the rate window.
 *
 * Safe switch. When acquisitions leave engine A for engine B, A is gated:
 * B grants a name only after A confirms the name is free there (one round
 * trip, the fast path), for as long as A answers — a hold taken on A before
 * the switch is renewed there as long as A lives, so a time limit while A
 * is up would let B grant it twice. When A cannot answer (its breaker is
 * open, or the question fails) B waits until A's grace has passed since A
 * last answered anyone here: switch_grace_ms, default the longest a hold on
 * A can outlive its holder's last contact (the lease or session timeout)
 * plus drift; every hold on A has then expired, and the gate is lifted.
 * Switching back to A lifts it too. With switch_grace_ms = 0 there is no
 * gate: availability first, as in the original Cerberus. A client that
 * opens on a lower engine because a higher one would not open gates the
 * higher one the same way, and a client whose configuration pins an engine
 * gates all the others: other processes may hold names there (a process
 * started after `cerberus switch` must respect the holds taken before it).
 * Asking on every acquisition would cost a pinned client a round trip per
 * other engine forever, so a gate the configuration set — every process
 * follows it, nobody acquires on the old engine once all have read it
 * (CERB_SWITCH_SETTLE_MS after the file changed) — remembers per name that
 * the old engine confirmed it free after that; a switch the client made by
 * itself (breaker, API) does not, as others may still be using the engine.
 *
 * Fencing epoch. Tokens carry a 16-bit epoch above the engine's 48-bit
 * counter: the configuration's `epoch` (12 bits), which `cerberus switch`
 * bumps for every client at once — so every grant after it ranks above
 * every grant before it, in any process — and below it (4 bits) the
 * switches this client made since that epoch, so that its own tokens never
 * go backwards when the new engine's counter is lower. Adding the switches
 * to the whole field instead would let a client that switched by itself
 * reach the next configuration epoch early and outrank grants made after a
 * `cerberus switch`. The count saturates at 15 (logged): bump the epoch.
 */
#include "internal_posix.h"

#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"
#include "selector.h"

int64_t cerb__now_ms(void) { return cerb_monotime() / CERB_NS_PER_MS; }

static int64_t grace_ms(cerb_client *c, int i);

/*
 * How long from now until every process that follows this configuration
 * file has read it: CERB_SWITCH_SETTLE_MS after its last change (its
 * mtime; clients follow a change within a second). A configuration that
 * is not a file (or whose change is that old) is settled now.
 */
static int64_t config_settle_ns(const struct cerb_config *cfg)
{
    struct stat st;
    struct timespec now;
    if (!cfg->path || stat(cfg->path, &st) != 0 || clock_gettime(CLOCK_REALTIME, &now) != 0)
        return 0;
    int64_t age_ms = ((int64_t)now.tv_sec - (int64_t)st.st_mtim.tv_sec) * 1000 +
                     ((int64_t)now.tv_nsec - (int64_t)st.st_mtim.tv_nsec) / CERB_NS_PER_MS;
    if (age_ms < 0)
        age_ms = 0; /* a clock step: assume it just changed */
    return age_ms >= CERB_SWITCH_SETTLE_MS ? 0 : (CERB_SWITCH_SETTLE_MS - age_ms) * CERB_NS_PER_MS;
}

static void breaker_cfg(const struct cerb_config *cfg, struct cerb_breaker_cfg *out)
{
    cerb__breaker_cfg_from(&cfg->failover, out);
}

void cerb__health_init(cerb_client *c)
{
    struct cerb_breaker_cfg bc;
    int64_t now = cerb__now_ms();

    cerb__mutex_init(&c->fo_mu);
    breaker_cfg(c->cfg, &bc);
    c->pinned = strcmp(c->cfg->active, "auto") == 0 ? -1
                                                     : cerb__config_engine_index(c->cfg, c->cfg->active);
    atomic_store(&c->epoch, c->cfg->epoch << CERB_EPOCH_LOCAL_BITS);
    int cur = atomic_load(&c->current);
    int64_t now_ns = cerb_monotime();
    for (size_t i = 0; i < c->n_engines; i++) {
        struct cerb_client_engine *ce = &c->engines[i];
        cerb__breaker_init(&ce->brk, &bc, (uint64_t)cerb_monotime() ^ (i * 0x9e3779b97f4a7c15ull), now);
        ce->healthy_since_ms = now;
        /* Others may hold names on an engine we do not start on: above
         * us when it would not open (auto mode), or any other one when the
         * configuration pins us (`cerberus switch` left it). */
        bool maybe_held = c->pinned >= 0 ? (int)i != cur : (int)i < cur && !ce->e;
        if (maybe_held && grace_ms(c, (int)i) > 0) {
            ce->gated = true;
            ce->gate_from_ns = now_ns;
            ce->gate_gen++;
            ce->gate_cacheable = c->pinned >= 0;
            ce->cache_after_ns = now_ns + config_settle_ns(c->boot_cfg);
        }
    }
}

/* Log and count a transition; fo_mu held. */
static void noted(cerb_client *c, struct cerb_client_engine *ce, bool changed)
{
    (void)c;
    if (!changed)
        return;
    ce->transitions++;
    enum cerb_breaker_state st = cerb__breaker_state(&ce->brk);
    if (st == CERB_BREAKER_CLOSED || st == CERB_BREAKER_DISABLED)
        ce->healthy_since_ms = cerb__now_ms();
    CERB_LOG_W("engine %s: breaker %s (%s)", ce->name, cerb__breaker_state_name(st),
               ce->brk.reason);
}

/* Fold batched successes in; fo_mu held. */
static void fold_ok(cerb_client *c, struct cerb_client_engine *ce, int64_t now)
{
    uint64_t n = atomic_exchange(&ce->pending_ok, 0);
    noted(c, ce, cerb__breaker_on_call_successes(&ce->brk, now, n));
}

void cerb__health_ok(cerb_client *c, int idx)
{
    atomic_fetch_add_explicit(&c->engines[idx].pending_ok, 1, memory_order_relaxed);
}

/* Run the selector; fo_mu held. Returns the index to switch to, or -1. */
static int pick_locked(cerb_client *c, const char **why)
{
    struct cerb_sel_engine se[CERB_MAX_ENGINES];
    struct cerb_failover_config fo;
    cerb__client_failover_cfg(c, &fo, NULL);
    int64_t now = cerb__now_ms();
    for (size_t i = 0; i < c->n_engines; i++) {
        struct cerb_client_engine *ce = &c->engines[i];
        noted(c, ce, cerb__breaker_poll(&ce->brk, now)); /* OPEN ages into HALF_OPEN */
        se[i].open = ce->e != NULL;
        se[i].st = cerb__breaker_state(&ce->brk);
        se[i].healthy_since_ms = ce->healthy_since_ms;
    }
    struct cerb_sel_in in = {c->n_engines, se, atomic_load(&c->current), c->pinned,
                             fo.failback_auto, fo.failback_after_ms, now};
    int to = cerb__select(&in, why);
    return to == in.current ? -1 : to;
}

void cerb__health_reselect(cerb_client *c)
{
    const char *why = NULL;
    cerb__mutex_lock(&c->fo_mu);
    int to = pick_locked(c, &why);
    cerb__mutex_unlock(&c->fo_mu);
    if (to >= 0)
        cerb__client_switch(c, to, why ? why : "selector", 0);
}

void cerb__health_fail(cerb_client *c, int idx, const char *what)
{
    struct cerb_client_engine *ce = &c->engines[idx];
    int64_t now = cerb__now_ms();
    atomic_fetch_add(&ce->failures, 1);
    cerb__mutex_lock(&c->fo_mu);
    fold_ok(c, ce, now);
    noted(c, ce, cerb__breaker_on_failure(&ce->brk, now, CERB_CALL));
    cerb__mutex_unlock(&c->fo_mu);
    CERB_LOG_D("engine %s: %s failed: %s", ce->name, what, cerb_last_error());
    cerb__health_reselect(c);
}

void cerb__health_probe(cerb_client *c, int idx, bool ok, int64_t latency_us)
{
    struct cerb_client_engine *ce = &c->engines[idx];
    int64_t now = cerb__now_ms();
    atomic_store(&ce->last_probe_us, latency_us);
    int64_t now_ns = cerb_monotime();
    cerb__mutex_lock(&c->fo_mu);
    fold_ok(c, ce, now);
    if (ok)
        ce->last_ok_ns = now_ns;
    if (ok)
        noted(c, ce, cerb__breaker_on_success(&ce->brk, now, CERB_PROBE));
    else
        noted(c, ce, cerb__breaker_on_failure(&ce->brk, now, CERB_PROBE));
    cerb__mutex_unlock(&c->fo_mu);
}

/* How long a hold on engine i can outlive our last contact with it. */
static int64_t grace_ms(cerb_client *c, int i)
{
    struct cerb_failover_config fo;
    int64_t g;
    cerb__client_failover_cfg(c, &fo, &g);
    if (fo.switch_grace_ms >= 0)
        return fo.switch_grace_ms;
    const char *name = c->engines[i].name;
    if (strcmp(name, "zk") == 0 && c->boot_cfg->zk.session_timeout_ms > g)
        g = c->boot_cfg->zk.session_timeout_ms;
    if (strcmp(name, "etcd") == 0 && c->boot_cfg->etcd.session_ttl_s * 1000 > g)
        g = c->boot_cfg->etcd.session_ttl_s * 1000;
    return g + g * CERB_DRIFT_PERMILLE / 1000 + CERB_DRIFT_FIXED_MS;
}

int cerb__client_switch(cerb_client *c, int to, const char *why, int pin)
{
    cerb__mutex_lock(&c->fo_mu);
    if (pin > 0)
        c->pinned = to;
    else if (pin < 0)
        c->pinned = -1;
    int from = atomic_load(&c->current);
    if (from == to) {
        cerb__mutex_unlock(&c->fo_mu);
        return to;
    }
    if (grace_ms(c, from) > 0) {
        struct cerb_client_engine *fe = &c->engines[from];
        int64_t now_ns = cerb_monotime();
        if (!fe->gated)
            fe->gate_from_ns = now_ns;
        fe->gated = true;
        fe->gate_gen++;
        /* Only a switch every process makes (the configuration's) lets
         * a name confirmed free there stay confirmed. */
        fe->gate_cacheable = pin == CERB_PIN_CONFIG;
        fe->cache_after_ns = now_ns + config_settle_ns(c->boot_cfg);
    }
    c->engines[to].gated = false; /* no need to ask where we go */
    int64_t ep = atomic_load(&c->epoch);
    if ((ep & CERB_EPOCH_LOCAL_MAX) < CERB_EPOCH_LOCAL_MAX)
        atomic_store(&c->epoch, ep + 1); /* fo_mu: the only writer but reload's raise */
    else
        CERB_LOG_W("fencing: %d switches since epoch %lld; tokens of this client may go "
                   "backwards until the epoch is bumped (cerberus switch)",
                   CERB_EPOCH_LOCAL_MAX, (long long)(ep >> CERB_EPOCH_LOCAL_BITS));
    c->switches++;
    atomic_store(&c->current, to);
    cerb__mutex_unlock(&c->fo_mu);
    cerb__lock_follow_switch(c, to);

    CERB_LOG_W("engine switch %s -> %s (%s)", c->engines[from].name, c->engines[to].name, why);
    /* Called on the callback thread, never here: this may be the renewal
     * or prober thread, or a caller holding its own mutexes. */
    cerb__notify_switch(c, c->engines[from].name, c->engines[to].name, why);
    return to;
}

/*
 * One gated engine's answer for `name`: CERB_OK (ask no more: free there,
 * or every hold there has expired), CERB_BUSY (held there), or
 * CERB_UNAVAILABLE with *until_ns = when its grace ends.
 */
static cerb_status gate_one(cerb_client *c, struct cerb_client_engine *ce, struct cerb_slot *s,
                            int64_t now, int64_t *until_ns)
{
    const char *name = s->name;
    /* The hot path, without fo_mu: not gated, or this name confirmed. */
    if (!atomic_load(&ce->gated))
        return CERB_OK;
    uint64_t gen0 = atomic_load(&ce->gate_gen);
    if (atomic_load(&ce->gate_cacheable) && now >= atomic_load(&ce->cache_after_ns) &&
        s->clear_gen[ce->idx] == gen0)
        return CERB_OK;
    cerb__mutex_lock(&c->fo_mu);
    bool gated = ce->gated;
    uint64_t gen = ce->gate_gen;
    bool cacheable = ce->gate_cacheable && now >= ce->cache_after_ns;
    int64_t last = ce->last_ok_ns > ce->gate_from_ns ? ce->last_ok_ns : ce->gate_from_ns;
    enum cerb_breaker_state bs = cerb__breaker_state(&ce->brk);
    int64_t g = grace_ms(c, ce->idx);
    cerb__mutex_unlock(&c->fo_mu);
    if (!gated || (cacheable && s->clear_gen[ce->idx] == gen))
        return CERB_OK;
    /* An engine whose breaker is open is known not to answer: asking would
     * only cost every caller an op timeout for the same "cannot tell". */
    bool down = !ce->e || bs == CERB_BREAKER_OPEN || bs == CERB_BREAKER_FORCED_OPEN;
    if (!down) {
        cerb_status st = cerb__engine_held(ce->ops, ce->e, name);
        if (st == CERB_OK || st == CERB_BUSY) {
            cerb__mutex_lock(&c->fo_mu);
            if (ce->last_ok_ns < now)
                ce->last_ok_ns = now;
            cerb__mutex_unlock(&c->fo_mu);
            if (st == CERB_BUSY)
                cerb__error_set(CERB_BUSY, "lock \"%s\" is still held on engine %s after a switch",
                                name, ce->name);
            else if (cacheable)
                s->clear_gen[ce->idx] = gen; /* nobody takes it there any more */
            return st;
        }
    }
    *until_ns = last + (g > 0 ? g : 0) * CERB_NS_PER_MS;
    if (now < *until_ns)
        return cerb__error_set(CERB_UNAVAILABLE, "lock \"%s\": engine %s, switched from, cannot "
                                                 "confirm it is free (waiting out its grace)",
                               name, ce->name);
    /* Silent for a whole grace: every hold there has expired. */
    cerb__mutex_lock(&c->fo_mu);
    if (ce->gated && ce->last_ok_ns <= last) {
        ce->gated = false;
        CERB_LOG_I("engine %s: no answer for its grace since the switch; no longer asked",
                   ce->name);
    }
    cerb__mutex_unlock(&c->fo_mu);
    return CERB_OK;
}

cerb_status cerb__switch_gate(cerb_client *c, int idx, struct cerb_slot *s, int64_t deadline_ns,
                              const atomic_int *intr)
{
    char why[CERB_ERROR_MAX] = "";
    for (int round = 0;; round++) {
        int64_t now = cerb_monotime();
        int64_t wait_until = 0;
        cerb_status worst = CERB_OK;
        for (size_t i = 0; i < c->n_engines; i++) {
            if ((int)i == idx)
                continue;
            int64_t until = 0;
            cerb_status st = gate_one(c, &c->engines[i], s, now, &until);
            if (st == CERB_OK)
                continue;
            if (worst == CERB_OK || st == CERB_BUSY)
                cerb__error_copy(why, sizeof why);
            worst = st == CERB_BUSY ? st : (worst == CERB_OK ? st : worst);
            if (until > wait_until)
                wait_until = until;
        }
        if (worst == CERB_OK)
            return CERB_OK;
        if (deadline_ns == 0)
            return cerb__error_set(CERB_BUSY, "%s", why);
        if (now >= deadline_ns)
            return cerb__error_set(CERB_TIMEOUT, "%s", why);
        /* Ask again soon: the engine may answer (or free the name) before
         * its grace ends; a grace that ends sooner ends the nap. */
        int64_t nap_ns = (round < 5 ? 20 : 100) * CERB_NS_PER_MS;
        if (worst != CERB_BUSY && wait_until > now && wait_until - now < nap_ns)
            nap_ns = wait_until - now;
        if (now + nap_ns > deadline_ns)
            nap_ns = deadline_ns - now;
        /* Bounded naps so an interrupt is seen within 50 ms. */
        for (int64_t slept = 0; slept < nap_ns;) {
            int64_t piece = nap_ns - slept < 50 * CERB_NS_PER_MS ? nap_ns - slept : 50 * CERB_NS_PER_MS;
            cerb__nap_ms((piece + CERB_NS_PER_MS - 1) / CERB_NS_PER_MS);
            slept += piece;
            if (intr && atomic_load(intr))
                return CERB_INTERRUPTED;
        }
    }
}
