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
 * trip), for as long as A answers — a hold taken on A before the switch is
 * renewed there as long as A lives, so a time limit while A is up would let
 * B grant it twice. Whether A is "down" is learnt only by asking it (bounded
 * by its op timeout): a breaker opened by slow probes says nothing about
 * holders whose renewals still succeed there (a gray failure). Every answer
 * counts — a probe, a question, a successful lock call or renewal. When A
 * does not answer, B waits until A's grace has passed since the first
 * request of ours on A's lock path that A left unanswered after its last
 * answer (other clients may have renewed there until then; a failed probe
 * proves nothing, see unanswered()): switch_grace_ms, default the longest a hold on A can outlive
 * its holder's last contact (the lease or session timeout) plus drift;
 * every hold on A has then expired and acquisitions pass — until A answers
 * again, when asking resumes (a process that failed back to A may be
 * granting there). Only switching back to A ends its gate. With
 * switch_grace_ms = 0 there is no gate: availability first, as in the
 * original Cerberus. A client that opens on a lower engine because a higher
 * one would not open gates the higher one the same way, and a client whose
 * configuration pins an engine gates all the others: other processes may
 * hold names there (a process started after `cerberus switch` must respect
 * the holds taken before it).
 *
 * Asking before the grant leaves a window: two processes on different
 * engines each hear "free" from the other's engine, then both are granted.
 * So a grant made while another engine is gated is checked once more after
 * it (lock.c): a name held elsewhere by then is released again. Of two
 * racing grants the later one's check sees the earlier, so at most one
 * survives. Questions cannot stop a process that did not switch (its
 * breaker stayed closed) from granting on A without asking anyone, so a
 * grant made while A is gated and answering also takes the name on A (a
 * claim, lock.c), which A then refuses to everyone else. One window stays: after a question to A went unanswered, this
 * client does not ask A again for 250 ms unless A answers a probe first; a
 * process that fails back to A and is granted there within that time can
 * overlap with a grant here. Failing back takes A's breaker closing
 * (half_open_successes good probes after open_ms) plus failback_after_ms,
 * while this client's own probes see A answer within one probe interval.
 *
 * Fencing. Tokens carry the configuration's `epoch` (16 bits) above the
 * engine's 48-bit counter. `cerberus switch` bumps it for every client at
 * once, so every grant after it ranks above every grant before it, in any
 * process. A switch this client makes by itself leaves it alone: the
 * engines' counters are incomparable, and bits that counted this client's
 * own switches would differ between clients on one engine and put one
 * client's grants below another's earlier ones. Instead the new engine is
 * asked to rank its grants above the highest fence this client had
 * elsewhere (fence_floor, lock.c): each engine raises its own counter on
 * the server, where every client's later grants see it.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"
#include "selector.h"

int64_t cerb__now_ms(void) { return cerb_monotime() / CERB_NS_PER_MS; }

/* After a question to a gated engine went unanswered, how long nobody asks
 * it again unless it answers something first (gate_one). */
#define ASK_BACKOFF_NS (250 * CERB_NS_PER_MS)

static int64_t grace_ms(cerb_client *c, int i);

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
    atomic_store(&c->epoch, c->cfg->epoch);
    cerb__route_update(c);
    int cur = atomic_load(&c->current);
    atomic_store(&c->pin_pending, c->pinned >= 0 && c->pinned != cur ? c->pinned : -1);
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
        }
    }
}

/* Count a transition and keep its log line for fo_unlock(); fo_mu held.
 * The log sink is user code: it never runs under a library mutex. */
static void noted(cerb_client *c, struct cerb_client_engine *ce, bool changed)
{
    (void)c;
    if (!changed)
        return;
    ce->transitions++;
    enum cerb_breaker_state st = cerb__breaker_state(&ce->brk);
    if (st == CERB_BREAKER_CLOSED || st == CERB_BREAKER_DISABLED)
        ce->healthy_since_ms = cerb__now_ms();
    char line[sizeof ce->log_note];
    snprintf(line, sizeof line, "engine %s: breaker %s (%s)", ce->name,
             cerb__breaker_state_name(st), ce->brk.reason);
    memcpy(ce->log_note, line, sizeof line);
}

/* Release fo_mu, then write the log lines noted under it. */
static void fo_unlock(cerb_client *c)
{
    char notes[CERB_MAX_ENGINES][sizeof c->engines[0].log_note];
    size_t n = 0;
    for (size_t i = 0; i < c->n_engines; i++) {
        struct cerb_client_engine *ce = &c->engines[i];
        if (ce->log_note[0]) {
            memcpy(notes[n++], ce->log_note, sizeof ce->log_note);
            ce->log_note[0] = '\0';
        }
    }
    cerb__mutex_unlock(&c->fo_mu);
    for (size_t i = 0; i < n; i++)
        CERB_LOG_W("%s", notes[i]);
}

/* Fold batched successes in; fo_mu held. */
static void fold_ok(cerb_client *c, struct cerb_client_engine *ce, int64_t now)
{
    uint64_t n = atomic_exchange(&ce->pending_ok, 0);
    noted(c, ce, cerb__breaker_on_call_successes(&ce->brk, now, n));
}

/* The engine answered us at `now`: the gate counts its grace from here. */
static void answered(struct cerb_client_engine *ce, int64_t now)
{
    int64_t t = atomic_load_explicit(&ce->last_ok_ns, memory_order_relaxed);
    while (t < now && !atomic_compare_exchange_weak(&ce->last_ok_ns, &t, now))
        ;
}

/*
 * A request of ours on engine ce's lock path (a call, a question, a claim)
 * got no answer at `now`; fo_mu held. The first such silence after its last
 * answer is when the gate's grace starts: it may have gone down only just
 * before, and other clients may have renewed holds there until then, long
 * after it last answered us (a probe interval or more). A failed probe is
 * not silence: in a gray failure probes time out while lock calls, other
 * clients' renewals among them, still succeed.
 */
static void unanswered(struct cerb_client_engine *ce, int64_t now)
{
    /* A silence that began before its last answer, or before we left it
     * (answers to calls on the current engine are not recorded), is over. */
    int64_t heard = atomic_load(&ce->last_ok_ns);
    if (ce->gated && ce->gate_from_ns > heard)
        heard = ce->gate_from_ns;
    if (ce->quiet_from_ns <= heard)
        ce->quiet_from_ns = now;
}

void cerb__health_ok(cerb_client *c, int idx)
{
    struct cerb_client_engine *ce = &c->engines[idx];
    atomic_fetch_add_explicit(&ce->pending_ok, 1, memory_order_relaxed);
    if (atomic_load_explicit(&ce->gated, memory_order_relaxed))
        answered(ce, cerb_monotime()); /* a renewal on an engine we left */
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
    fo_unlock(c);
    if (to >= 0)
        cerb__client_switch(c, to, why ? why : "selector", 0);
}

void cerb__health_fail(cerb_client *c, int idx, const char *what)
{
    struct cerb_client_engine *ce = &c->engines[idx];
    int64_t now = cerb__now_ms();
    atomic_fetch_add(&ce->failures, 1);
    cerb__mutex_lock(&c->fo_mu);
    unanswered(ce, cerb_monotime());
    fold_ok(c, ce, now);
    noted(c, ce, cerb__breaker_on_failure(&ce->brk, now, CERB_CALL));
    fo_unlock(c);
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
        answered(ce, now_ns);
    if (ok)
        noted(c, ce, cerb__breaker_on_success(&ce->brk, now, CERB_PROBE));
    else
        noted(c, ce, cerb__breaker_on_failure(&ce->brk, now, CERB_PROBE));
    fo_unlock(c);
}

/* How long a hold on engine i can outlive our last contact with it. */
static int64_t grace_ms(cerb_client *c, int i)
{
    struct cerb_failover_config fo;
    int64_t g;
    cerb__client_failover_cfg(c, &fo, &g);
    if (fo.switch_grace_ms >= 0)
        return fo.switch_grace_ms;
    int64_t lease = g; /* lock.lease_ms */
    /* A session engine keeps a hold as long as the server granted the
     * session (the negotiated ZooKeeper timeout, the etcd TTL), which may
     * be longer than what the file asked for. */
    struct cerb_client_engine *ce = &c->engines[i];
    int64_t bound = cerb__engine_hold_bound_ms(ce->ops, ce->e);
    if (bound > g)
        g = bound;
    if (strcmp(ce->name, "zk") == 0 && c->boot_cfg->zk.session_timeout_ms > g)
        g = c->boot_cfg->zk.session_timeout_ms;
    if (strcmp(ce->name, "etcd") == 0 && c->boot_cfg->etcd.session_ttl_s * 1000 > g)
        g = c->boot_cfg->etcd.session_ttl_s * 1000;
    /* memcached keeps an item T = the lease rounded up to seconds + 2
     * (its clock ticks by the second and drifts), and up to a second more
     * on a late tick: (T + 1) s, as its hold_bound_ms. Known from the file
     * alone, also for an engine that never opened. */
    int64_t mc_bound = ((lease + 999) / 1000 + 3) * 1000;
    if (strcmp(ce->name, "memcached") == 0 && mc_bound > g)
        g = mc_bound;
    return g + g * CERB_DRIFT_PERMILLE / 1000 + CERB_DRIFT_FIXED_MS;
}

/* Refresh c->pin_pending; fo_mu held. */
static void pin_update(cerb_client *c)
{
    int cur = atomic_load(&c->current);
    atomic_store(&c->pin_pending, c->pinned >= 0 && c->pinned != cur ? c->pinned : -1);
}

/*
 * A pin keeps this client on engine `to` whatever its breakers say, while
 * other clients' breakers move them away and they grant elsewhere. So a
 * pinned client asks every other engine before granting, as one pinned by
 * the configuration does from the start (cerb__health_init) — also when
 * the pin names the engine it is already on. fo_mu held.
 */
static void gate_all_but(cerb_client *c, int to)
{
    for (size_t i = 0; i < c->n_engines; i++) {
        struct cerb_client_engine *ce = &c->engines[i];
        /* The engine still current while the pin waits for `to` to open
         * grants; it asks the others. */
        bool cur = (int)i == atomic_load(&c->current) && !c->engines[to].e;
        if ((int)i == to || cur || ce->gated || grace_ms(c, (int)i) <= 0)
            continue;
        ce->gate_from_ns = cerb_monotime();
        ce->gated = true;
    }
}

int cerb__client_switch(cerb_client *c, int to, const char *why, int pin)
{
    cerb__mutex_lock(&c->fo_mu);
    if (pin > 0)
        c->pinned = to;
    else if (pin < 0)
        c->pinned = -1;
    int from = atomic_load(&c->current);
    if (pin > 0)
        gate_all_but(c, to);
    /* Never make current an engine without an instance: a pin on one that
     * has not opened stays a wish until the prober opens it. */
    if (from == to || !c->engines[to].e) {
        pin_update(c);
        fo_unlock(c);
        return from;
    }
    if (grace_ms(c, from) > 0) {
        struct cerb_client_engine *fe = &c->engines[from];
        if (!fe->gated)
            fe->gate_from_ns = cerb_monotime();
        fe->gated = true;
    }
    /* Back to an engine we had left (a failback, or a pin applied once it
     * opened): other processes may still be on the engines we leave, their
     * gates on `to` paused after unanswered questions until a probe of
     * theirs hears it again. Grant there only once they can have heard it:
     * two probe intervals plus their question back-off. */
    struct cerb_client_engine *te = &c->engines[to];
    if (te->gated && grace_ms(c, from) > 0) {
        struct cerb_failover_config fo;
        cerb__client_failover_cfg(c, &fo, NULL);
        atomic_store(&te->grant_after_ns,
                     cerb_monotime() + (2 * fo.probe_interval_ms + fo.probe_timeout_ms) *
                                           CERB_NS_PER_MS + ASK_BACKOFF_NS);
    }
    te->gated = false; /* no need to ask where we go */
    c->switches++;
    atomic_store(&c->current, to);
    cerb__route_update(c);
    pin_update(c);
    fo_unlock(c);
    cerb__inflight_follow_switch(c, to);

    CERB_LOG_W("engine switch %s -> %s (%s)", c->engines[from].name, c->engines[to].name, why);
    /* Called on the callback thread, never here: this may be the renewal
     * or prober thread, or a caller holding its own mutexes. */
    cerb__notify_switch(c, c->engines[from].name, c->engines[to].name, why);
    return to;
}

/*
 * One gated engine's answer for `name`: CERB_OK (free there, or silent for
 * its whole grace: every hold there has expired), CERB_BUSY (held there),
 * or CERB_UNAVAILABLE with *until_ns = when its grace ends.
 */
static cerb_status gate_one(cerb_client *c, struct cerb_client_engine *ce, struct cerb_slot *s,
                            const cerb_engine_lock *lk, int64_t now, int64_t *until_ns)
{
    const char *name = s->name;
    /* The hot path, without fo_mu: not gated. */
    if (!atomic_load(&ce->gated))
        return CERB_OK;
    /* Closed by a record this client saw (closure.c): nobody is granted
     * there any more, so a name it said was free since stays free. */
    uint64_t gen = 0;
    bool closed = cerb__closure_holds(c, ce->idx, &gen);
    if (closed && s->free_gen[ce->idx] == gen)
        return CERB_OK;
    cerb__mutex_lock(&c->fo_mu);
    bool gated = ce->gated;
    int64_t from = ce->gate_from_ns;
    int64_t ask_fail = ce->ask_fail_ns;
    fo_unlock(c);
    if (!gated)
        return CERB_OK;
    int64_t g = grace_ms(c, ce->idx);
    int64_t last = atomic_load(&ce->last_ok_ns);
    if (last < from)
        last = from;
    /* Down only when asking gets no answer. For ASK_BACKOFF_NS after a
     * question went unanswered, with nothing heard from the engine since,
     * nobody asks again: a paused engine costs one op timeout per interval,
     * not one per acquisition. Any answer (a probe every probe interval)
     * ends the pause at once; so does the interval, so a slow engine whose
     * probes time out (a gray failure) is still asked. */
    if (ce->e && !(ask_fail > last && now - ask_fail < ASK_BACKOFF_NS)) {
        atomic_fetch_add_explicit(&ce->gate_questions, 1, memory_order_relaxed);
        /* A semaphore's permits add up across engines. Claims make the
         * engine switched from count ours too, so a member that fits
         * there fits in all; without them (it is closed by a record, or
         * not claimable), permits granted here are not counted there, and
         * only an engine with no member of anybody else's is safe. */
        bool strict = lk->prim == CERB_PRIM_SEMAPHORE &&
                      (closed || !cerb__gate_claimable(c, ce->idx));
        cerb_status st = cerb__engine_gate_ask(ce->ops, ce->e, lk, strict);
        int64_t t = cerb_monotime();
        if (st == CERB_OK || st == CERB_BUSY) {
            answered(ce, t);
        } else {
            cerb__mutex_lock(&c->fo_mu);
            if (ce->ask_fail_ns < t)
                ce->ask_fail_ns = t;
            unanswered(ce, t);
            fo_unlock(c);
        }
        if (st == CERB_BUSY)
            return cerb__error_set(CERB_BUSY, "lock \"%s\" is still held on engine %s after a switch",
                                   name, ce->name);
        if (st == CERB_OK) {
            /* Kept only when the record was seen before the question and
             * is still trusted after it, under the same generation. */
            uint64_t now_gen = 0;
            if (closed && cerb__closure_holds(c, ce->idx, &now_gen) && now_gen == gen)
                s->free_gen[ce->idx] = gen;
            return CERB_OK;
        }
        last = atomic_load(&ce->last_ok_ns) > last ? atomic_load(&ce->last_ok_ns) : last;
    }
    /* The grace runs from the first silence since its last answer: holds
     * others renewed there until it went down end a lease after that. */
    cerb__mutex_lock(&c->fo_mu);
    int64_t quiet = ce->quiet_from_ns;
    fo_unlock(c);
    if (quiet > last)
        last = quiet;
    *until_ns = last + (g > 0 ? g : 0) * CERB_NS_PER_MS;
    if (now < *until_ns)
        return cerb__error_set(CERB_UNAVAILABLE, "lock \"%s\": engine %s, switched from, cannot "
                                                 "confirm it is free (waiting out its grace)",
                               name, ce->name);
    /* Silent for a whole grace: every hold there has expired. The gate
     * stays: once the engine answers again, it is asked again. */
    return CERB_OK;
}

bool cerb__gate_claimable(cerb_client *c, int i)
{
    struct cerb_client_engine *ce = &c->engines[i];
    uint64_t gen;
    /* A closed engine refuses everyone by itself: no claim needed. */
    if (!atomic_load(&ce->gated) || !ce->e || cerb__closure_holds(c, i, &gen))
        return false;
    cerb__mutex_lock(&c->fo_mu);
    int64_t last = atomic_load(&ce->last_ok_ns);
    if (last < ce->gate_from_ns)
        last = ce->gate_from_ns;
    bool quiet = ce->ask_fail_ns > last && cerb_monotime() - ce->ask_fail_ns < ASK_BACKOFF_NS;
    bool gated = ce->gated;
    fo_unlock(c);
    return gated && !quiet;
}

bool cerb__gate_heard(cerb_client *c, int i, int64_t *heard_ns)
{
    struct cerb_client_engine *ce = &c->engines[i];
    *heard_ns = 0;
    if (!atomic_load(&ce->gated))
        return false;
    cerb__mutex_lock(&c->fo_mu);
    bool gated = ce->gated;
    int64_t h = ce->gate_from_ns;
    int64_t last = atomic_load(&ce->last_ok_ns);
    if (last > h)
        h = last;
    if (ce->quiet_from_ns > h)
        h = ce->quiet_from_ns;
    fo_unlock(c);
    *heard_ns = h;
    return gated;
}

void cerb__gate_no_answer(cerb_client *c, int i)
{
    int64_t t = cerb_monotime();
    cerb__mutex_lock(&c->fo_mu);
    if (c->engines[i].ask_fail_ns < t)
        c->engines[i].ask_fail_ns = t;
    unanswered(&c->engines[i], t);
    fo_unlock(c);
}

bool cerb__gate_any(cerb_client *c, int idx)
{
    for (size_t i = 0; i < c->n_engines; i++)
        if ((int)i != idx && atomic_load(&c->engines[i].gated))
            return true;
    return false;
}

bool cerb__gate_confirm_any(cerb_client *c, int idx, const struct cerb_slot *s)
{
    uint64_t gen;
    /* Only an answer taken under the record seen now counts: one asked
     * before the record was seen (or under an older generation) may predate
     * a laggard's grant there. */
    for (size_t i = 0; i < c->n_engines; i++)
        if ((int)i != idx && atomic_load(&c->engines[i].gated) &&
            !(cerb__closure_holds(c, (int)i, &gen) && s->free_gen[i] == gen))
            return true;
    return false;
}

/*
 * The configuration pins an engine that would not open here. Every process
 * that could open it has moved there and asks this engine only before and
 * after its own grants; a grant here that asks nobody could overlap. So
 * with a switch grace nothing is granted until the pin is applied.
 */
static cerb_status pin_gate(cerb_client *c, int idx)
{
    int p = atomic_load(&c->pin_pending);
    if (p < 0 || p == idx || grace_ms(c, p) <= 0)
        return CERB_OK;
    return cerb__error_set(CERB_UNAVAILABLE,
                           "engine %s, which the configuration makes active, is not open here "
                           "(retried every probe round): nothing is granted on %s meanwhile",
                           c->engines[p].name, c->engines[idx].name);
}

/* Every engine but idx closed by a record at our epoch (closure.c): no
 * process can be granted there, however long its questions pause. */
static bool others_closed(cerb_client *c, int idx)
{
    uint64_t gen;
    for (size_t i = 0; i < c->n_engines; i++)
        if ((int)i != idx && !cerb__closure_holds(c, (int)i, &gen))
            return false;
    return true;
}

cerb_status cerb__switch_gate(cerb_client *c, int idx, struct cerb_slot *s,
                              const cerb_engine_lock *lk, int64_t deadline_ns,
                              const atomic_int *intr)
{
    char why[CERB_ERROR_MAX] = "";
    for (int round = 0;; round++) {
        int64_t now = cerb_monotime();
        int64_t wait_until = 0;
        cerb_status worst = pin_gate(c, idx);
        if (worst != CERB_OK)
            cerb__error_copy(why, sizeof why);
        int64_t after = atomic_load(&c->engines[idx].grant_after_ns);
        if (worst == CERB_OK && now < after && !others_closed(c, idx)) {
            worst = cerb__error_set(CERB_UNAVAILABLE,
                                    "engine %s was switched back to: granting once every "
                                    "client can have heard it answer again",
                                    c->engines[idx].name);
            cerb__error_copy(why, sizeof why);
            wait_until = after;
        }
        for (size_t i = 0; i < c->n_engines; i++) {
            if ((int)i == idx)
                continue;
            int64_t until = 0;
            cerb_status st = gate_one(c, &c->engines[i], s, lk, now, &until);
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
