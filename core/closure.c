/*
 * closure.c — an operator's switch as an event the engines know (DESIGN.md
 * §5): closure records, kept by every client that follows the file.
 *
 * `cerberus switch B` raises the file's epoch to E and pins B. Every client
 * at epoch E (the switch command itself, each process that reloads the
 * file, each one that opens it later) records on each engine it leaves
 * "closed from epoch E on", and on B "open from E on" (engine.h, version 4).
 * An engine's grant step checks its record atomically: a process still on
 * an older file — a laggard that never reloaded — is refused there, reloads
 * and follows (lock.c, acq_closed), or is told why it cannot.
 *
 * What that buys. Before, a grant on B had to ask each engine A it left
 * before and after the grant, and take the name on A too (a claim), as long
 * as A answered: a laggard could be granted on A at any time. With the
 * record in place on A, nobody is granted on A any more, so what B must
 * respect on A are the holds from before the record, which end and never
 * come back. One question per name settles it: once A says a name is free
 * after its record was seen there, it stays free on A; the answer is kept
 * in the name's slot and the name costs nothing on A again (health.c,
 * gate_one). No second question after the grant, no claim.
 *
 * What keeps that true. The record must stay on A. A Redis that restarts
 * without its data, or is flushed, loses it together with the marker; the
 * engine then quarantines every name for a lease (redis_marker.h) before
 * it grants again, laggards included. So the record is read again every
 * probe round and written back when it is gone; kept answers are trusted
 * only while the record was seen within half a lease, and are dropped
 * (closure_gen moves) whenever it was not found, or not seen in time. A
 * client whose prober stalls longer than that falls back to the full gate
 * (ask before and after, claim), never to trust.
 *
 * Only a switch through the file does this. An automatic switch (a breaker)
 * keeps the full gate: the engine it left is failing, and other processes'
 * breakers may still send them there at the same epoch. A file with one
 * engine, or at epoch 1 (never switched), writes nothing.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"

/* A refusal reloads the file at most this often (a burst of refused
 * acquisitions would otherwise reread it once each). */
#define RELOAD_EVERY_NS (200 * CERB_NS_PER_MS)

/*
 * The record this client wants on engine i, from its current file: closed
 * on every engine but the one `active` names, open there (and everywhere
 * with `active = "auto"` after a switch). False when it wants none.
 */
static bool want(cerb_client *c, size_t i, cerb_closure *rec)
{
    if (c->n_engines < 2 || !cerb__engine_has_closure(c->engines[i].ops))
        return false;
    char active[CERB_ENGINE_NAME_MAX];
    cerb__mutex_lock(&c->mu);
    snprintf(active, sizeof active, "%s", c->cfg->active);
    cerb__mutex_unlock(&c->mu);
    int64_t epoch = atomic_load(&c->epoch);
    /* Every `cerberus switch` raises the epoch: a file at epoch 1 was never
     * switched (a hand-written pin keeps the full gate, as other files at
     * that epoch may say otherwise). */
    if (epoch < 2)
        return false;
    bool autom = strcmp(active, "auto") == 0;
    rec->epoch = epoch;
    rec->closed = !autom && strcmp(active, c->engines[i].name) != 0;
    return true;
}

static void window_update(cerb_client *c)
{
    struct cerb_failover_config fo;
    int64_t lease;
    cerb__client_failover_cfg(c, &fo, &lease);
    int64_t w = lease / 2;
    /* Records are read once a probe round (up to 1.2 intervals apart, plus
     * the round): a lease too short for that would have holds that rely on
     * them told LOST between readings. Then trust none (the full gate). */
    if (w < 2 * fo.probe_interval_ms + fo.probe_timeout_ms)
        w = 0;
    atomic_store(&c->closure_window_ns, w * CERB_NS_PER_MS);
    atomic_store(&c->closure_lease_ms, lease);
    atomic_store(&c->closure_claims, fo.switch_claims);
}

/* Engine i's record read or written once; fo_mu not held. */
static void keep_one(cerb_client *c, size_t i)
{
    struct cerb_client_engine *ce = &c->engines[i];
    cerb_closure w, cur;
    if (!want(c, i, &w)) {
        atomic_store(&ce->closure_seen_ns, 0);
        return;
    }
    if (!ce->e)
        return;
    /* Open records are watched too: holds granted elsewhere while this
     * engine was closed still rely on its record refusing older epochs
     * once it is open again (cerb__closure_cap). */
    int64_t t0 = cerb_monotime();
    cerb_status st = cerb__engine_closure_get(ce->ops, ce->e, &cur);
    if (st == CERB_OK && (cur.epoch != w.epoch || cur.closed != w.closed) && w.closed) {
        /* Not the record we want (gone, or never written): anyone may have
         * been granted there meanwhile, so nothing asked before counts. */
        atomic_store(&ce->closure_seen_ns, 0);
        atomic_fetch_add(&ce->closure_gen, 1);
    }
    if (st == CERB_OK && cur.epoch < w.epoch)
        st = cerb__engine_closure_put(ce->ops, ce->e, &w, &cur);
    if (st != CERB_OK) {
        CERB_LOG_D("engine %s: closure record: %s", ce->name, cerb_last_error());
        return; /* what was seen lapses by itself */
    }
    if (cur.epoch > w.epoch) {
        /* A newer switch: its record refuses every older epoch, ours too,
         * so it still answers for the holds that rely on it. */
        atomic_store(&ce->closure_ok_ns, t0);
        atomic_store(&ce->closure_seen_ns, 0);
        cerb__closure_refused(c, (int)i, cur.epoch);
        return;
    }
    if (cur.closed != w.closed) {
        atomic_store(&ce->closure_seen_ns, 0);
        if (!atomic_exchange(&ce->closure_warned, true))
            CERB_LOG_W("engine %s: its closure record says %s from epoch %lld, but this "
                       "client's file says %s at that epoch: two files share one epoch; "
                       "asking that engine before and after every grant (run `cerberus "
                       "switch` again to settle it)",
                       ce->name, cur.closed ? "closed" : "open", (long long)cur.epoch,
                       w.closed ? "closed" : "open");
        return;
    }
    /* Wanted and there: a record at this epoch refuses every older one,
     * open or closed. */
    atomic_store(&ce->closure_ok_ns, t0);
    if (!w.closed) {
        atomic_store(&ce->closure_epoch, w.epoch);
        atomic_store(&ce->closure_seen_ns, 0);
        return;
    }
    int64_t prev = atomic_load(&ce->closure_seen_ns);
    int64_t win = atomic_load(&c->closure_window_ns);
    if (prev == 0 || t0 - prev > win || atomic_load(&ce->closure_epoch) != w.epoch)
        atomic_fetch_add(&ce->closure_gen, 1); /* answers kept before may be stale */
    atomic_store(&ce->closure_epoch, w.epoch);
    atomic_store(&ce->closure_seen_ns, t0);
}

void cerb__closure_round(cerb_client *c)
{
    if (c->n_engines < 2)
        return;
    window_update(c);
    for (size_t i = 0; i < c->n_engines; i++)
        keep_one(c, i);
}

bool cerb__closure_holds(cerb_client *c, int i, uint64_t *gen)
{
    struct cerb_client_engine *ce = &c->engines[i];
    /* failover.switch_claims: the record refuses laggards, the gate still
     * asks and claims for clients that read none (other libraries). */
    if (atomic_load_explicit(&c->closure_claims, memory_order_relaxed))
        return false;
    int64_t seen = atomic_load(&ce->closure_seen_ns);
    if (seen == 0 || atomic_load(&ce->closure_epoch) != atomic_load(&c->epoch) ||
        atomic_load(&c->closure_window_ns) == 0)
        return false;
    if (cerb_monotime() - seen > atomic_load(&c->closure_window_ns))
        return false;
    *gen = atomic_load(&ce->closure_gen);
    /* Read seen again: a round that found the record gone in between
     * cleared it after moving gen. */
    return atomic_load(&ce->closure_seen_ns) != 0;
}

void cerb__closure_refused(cerb_client *c, int i, int64_t record_epoch)
{
    (void)i;
    if (record_epoch <= atomic_load(&c->epoch) || !c->boot_cfg->path || c->manual ||
        c->n_engines < 2)
        return; /* closed at our own epoch, or no file or probe thread to read it */
    /* Read on the probe thread, not here: a reload parses the file, may
     * open an engine and writes records, each bounded only by an engine's
     * timeouts, and a lock call must keep its own bound. */
    atomic_store(&c->closure_reload_want, record_epoch);
}

void cerb__closure_reload_if_wanted(cerb_client *c)
{
    int64_t rec = atomic_exchange(&c->closure_reload_want, 0);
    if (rec == 0)
        return;
    int64_t now = cerb_monotime();
    int64_t last = atomic_load(&c->closure_reload_ns);
    if (last == 0 || now - last >= RELOAD_EVERY_NS) {
        atomic_store(&c->closure_reload_ns, now);
        CERB_LOG_I("an engine was closed by a switch at epoch %lld (this client is at %lld): "
                   "reloading %s",
                   (long long)rec, (long long)atomic_load(&c->epoch), c->boot_cfg->path);
        if (cerb_client_reload(c) != CERB_OK)
            CERB_LOG_W("reload after a closed engine: %s", cerb_last_error());
    }
    atomic_fetch_add(&c->closure_reloads, 1);
}

uint32_t cerb__closure_relied(cerb_client *c, int idx)
{
    uint32_t mask = 0;
    uint64_t gen;
    for (size_t i = 0; i < c->n_engines; i++)
        if ((int)i != idx && atomic_load(&c->engines[i].gated) &&
            cerb__closure_holds(c, (int)i, &gen))
            mask |= 1u << i;
    return mask;
}

/*
 * Why a cap. A hold granted on B without a claim on A relies on A's record
 * to keep processes on older files from being granted there. A record
 * lost with A's data (a Redis restarted empty or flushed) is written back
 * by the next probe round of any client that reads it; meanwhile A
 * quarantines every name for a lease, so nobody is granted there before a
 * lease has passed since the loss. If this client cannot read A (a
 * partition), nobody may write it back, and after that lease a laggard may
 * be granted the name on A: so a hold here is valid no longer than a lease
 * (less drift) after A's record was last read as wanted (closed, or open
 * again after a switch back: either refuses the older epochs) — and is
 * told LOST when A stays unreadable, as it was with a claim it could not
 * renew. The watchdog applies it as the readings come (scan), so a round
 * slower than a renewal period or a long per-lock lease costs nothing.
 */
int64_t cerb__closure_cap(cerb_client *c, uint32_t mask)
{
    int64_t cap = CERB_DEADLINE_NEVER;
    int64_t lease = atomic_load(&c->closure_lease_ms);
    int64_t span = (lease - lease * CERB_DRIFT_PERMILLE / 1000 - CERB_DRIFT_FIXED_MS) *
                   CERB_NS_PER_MS;
    for (size_t i = 0; i < c->n_engines && mask; i++) {
        if (!(mask & (1u << i)))
            continue;
        int64_t until = atomic_load(&c->engines[i].closure_ok_ns) + span;
        if (until < cap)
            cap = until;
    }
    return cap;
}

int64_t cerb__hold_until(cerb_client *c, const struct cerb_engine_hold *h)
{
    int64_t until = h->valid_until_ns;
    if (h->relies) {
        int64_t cap = cerb__closure_cap(c, h->relies);
        if (cap < until)
            until = cap;
    }
    return until;
}
