/*
 * election.c — leader election (DESIGN.md §16): a term is a hold.
 *
 * A candidate is a private lock handle (the template) whose holds are
 * terms: prim CERB_PRIM_ELECTION, the layout, and the value to lead with,
 * which start_hold copies into each engine hold. So a campaign is
 * cerb_lock_acquire() on the template — the local FIFO (one wake-up), the
 * deadline and the cancel, the switch gate, claims, settling of ambiguous
 * answers, the fence (epoch + the engine's counter + the client's floor),
 * renewal by the watchdog and the loss at the drift-shortened deadline are
 * the lock's own. What an election adds goes through the engine's election
 * table (engine.h): its layout in acquire, proclaim (the value changed,
 * atomically with still leading) and leader (who leads, or nobody).
 *
 * The lost callback is the election's, not the term's: the watchdog queues
 * it (cerb__election_lost_locked) with the election as the object, so that
 * cerb_election_free() can drop it or, when it is running, leave the
 * election's memory to the callback thread (notify.c), as a lock's handle.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"

#define CERB_ELECTION_MAGIC 0x454c4543u /* "ELEC" */
/* Proclaim: tries after an answer that did not say (the request is
 * idempotent), with a jittered pause between them. */
#define PROCLAIM_TRIES 3
#define PROCLAIM_PAUSE_MS 20

struct cerb_election {
    atomic_uint magic;
    cerb_client *c;
    cerb_lock *tmpl;          /* the candidate: a private handle, prim ELECTION */
    /* mu is held only for moments, never across a wait or the network:
     * the calls in flight say so in flags, and whoever must not overlap
     * them waits on `idle` (a proclaim or a resign, bounded by the
     * engines' timeouts) or is refused (a campaign, unbounded). */
    cerb_mutex mu;
    cerb_cond idle;           /* signalled when proclaiming or resigning ends */
    bool campaigning, proclaiming, resigning, freeing;
    cerb_hold *term;          /* the term while leading, else NULL */
    void *value;              /* the value led with (or to campaign with) */
    size_t value_len;
    _Atomic uint64_t fence;   /* the last term's */
    /* under the name's slot->mu (tmpl->slot) */
    void (*cb)(cerb_election *, void *);
    void *cb_ud;
    bool told;                /* the current term's loss was queued */
};

static bool election_ok(const cerb_election *e)
{
    return e && atomic_load(&((cerb_election *)e)->magic) == CERB_ELECTION_MAGIC;
}

static cerb_status bad(const char *what)
{
    return cerb__error_set(CERB_EINVAL, "%s: bad election", what);
}

static cerb_status value_check(const char *what, const void *value, size_t len)
{
    if (len > CERB_ELECTION_VALUE_MAX)
        return cerb__error_set(CERB_EINVAL, "%s: a value of %zu bytes (at most %d)", what, len,
                               CERB_ELECTION_VALUE_MAX);
    if (len && !value)
        return cerb__error_set(CERB_EINVAL, "%s: value is NULL with a length of %zu", what, len);
    return CERB_OK;
}

cerb_status cerb_election_new(cerb_client *c, const char *name, const cerb_election_opts *opts,
                              cerb_election **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_election_new: out is NULL");
    *out = NULL;
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    if (opts)
        o = *opts;
    if (o.layout < CERB_ELECTION_LAYOUT_DEFAULT || o.layout > CERB_ELECTION_LAYOUT_SELECTOR)
        return cerb__error_set(CERB_EINVAL, "cerb_election_new: layout %d (0 default, 1 latch, "
                                            "2 selector)", o.layout);
    cerb_election *e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    /* A term renews as a lock does and hands over in arrival order. */
    cerb_lock_opts lo = CERB_LOCK_OPTS_INIT;
    lo.lease_ms = o.lease_ms;
    lo.renew = 1;
    lo.fair = 1;
    cerb_status st = cerb_lock_new(c, name, &lo, &e->tmpl);
    if (st != CERB_OK) {
        cerb__free(e);
        return st;
    }
    e->c = c;
    e->tmpl->prim = CERB_PRIM_ELECTION;
    e->tmpl->variant = o.layout;
    e->tmpl->election = e;
    cerb__mutex_init(&e->mu);
    cerb__cond_init(&e->idle);
    atomic_store(&e->magic, CERB_ELECTION_MAGIC);
    *out = e;
    return CERB_OK;
}

/* The engine hold of term t, and its engine; NULL when t holds nothing
 * (released, or not the slot's holder). */
static struct cerb_engine_hold *term_hold(cerb_hold *t)
{
    struct cerb_slot *s = t->l.slot;
    cerb__mutex_lock(&s->mu);
    struct cerb_engine_hold *h = CERB__OBJECT_HOLD(s, &t->l);
    cerb__mutex_unlock(&s->mu);
    return h;
}

/* Store value as h's proclamation on its engine, re-sent (idempotent)
 * after an answer that did not say. CERB_LOST when h leads no more there,
 * made known to the watchdog (the lost callback). */
static cerb_status proclaim_on(cerb_client *c, struct cerb_engine_hold *h, const void *value,
                               size_t len, bool tell)
{
    struct cerb_client_engine *ce = &c->engines[h->engine_idx];
    cerb_status st = CERB_OK;
    for (int i = 0; i < PROCLAIM_TRIES; i++) {
        cerb_outcome oc;
        st = cerb__engine_proclaim(ce->ops, ce->e, &h->lk, value, len, &oc);
        if (st == CERB_OK)
            break;
        if (st == CERB_NOT_OWNER) {
            if (tell) /* a term the caller was told of: its loss goes the usual way */
                cerb__watchdog_event(ce, CERB_EV_LOST, h->lk.name, h->lk.token);
            return cerb__error_set(CERB_LOST, "election \"%s\": the term was lost on engine %s",
                                   h->lk.name, ce->name);
        }
        if (oc == CERB_OUTCOME_NO && st != CERB_UNAVAILABLE && st != CERB_EIO &&
            st != CERB_TIMEOUT)
            break; /* refused for good (a bad value): no point in asking again */
        if (i + 1 < PROCLAIM_TRIES)
            cerb__nap_ms(cerb__backoff_ms(i, PROCLAIM_PAUSE_MS, 4 * PROCLAIM_PAUSE_MS));
    }
    return st;
}

cerb_status cerb_election_campaign(cerb_election *e, const void *value, size_t len,
                                   int64_t wait_ms, cerb_cancel *cancel)
{
    if (!election_ok(e))
        return cerb__cancel_note(cancel, bad("cerb_election_campaign"));
    cerb_status st = value_check("cerb_election_campaign", value, len);
    if (st != CERB_OK)
        return cerb__cancel_note(cancel, st);
    const char *name = e->tmpl->slot->name;
    cerb__mutex_lock(&e->mu);
    if (e->term || e->campaigning || e->resigning || e->freeing) {
        cerb__mutex_unlock(&e->mu);
        return cerb__cancel_note(
            cancel, cerb__error_set(CERB_EINVAL, "election \"%s\": this candidate %s", name,
                                    e->term       ? "leads already (resign first)"
                                    : e->resigning ? "is resigning"
                                    : e->freeing   ? "is being freed"
                                                   : "is campaigning already"));
    }
    /* Refused by any engine that could elect it, before anything is sent. */
    for (size_t i = 0; i < e->c->n_engines; i++) {
        const struct cerb_engine_ops *ops = e->c->engines[i].ops;
        if (cerb__engine_has_election(ops) &&
            (st = cerb__engine_check_value(ops, e->tmpl->variant, value, len)) != CERB_OK) {
            cerb__mutex_unlock(&e->mu);
            return cerb__cancel_note(cancel, st);
        }
    }
    void *v = cerb__memdup0(value, len);
    if (!v) {
        cerb__mutex_unlock(&e->mu);
        return cerb__cancel_note(cancel, cerb__error_set(CERB_ENOMEM, "out of memory"));
    }
    cerb__free(e->value);
    e->value = v;
    e->value_len = len;
    e->tmpl->value = v; /* stays while campaigning: proclaim needs a term */
    e->tmpl->value_len = len;
    e->campaigning = true;
    /* Muted until the campaign returns its term: a loss meanwhile (during
     * the post-grant proclaim) is the campaign's answer, not a callback
     * for a term the caller never got. */
    cerb__mutex_lock(&e->tmpl->slot->mu);
    e->told = true;
    cerb__mutex_unlock(&e->tmpl->slot->mu);
    cerb__mutex_unlock(&e->mu);

    cerb_hold *t = NULL;
    st = cerb_lock_acquire(e->tmpl, wait_ms, cancel, &t);
    if (st == CERB_OK) {
        struct cerb_engine_hold *h = term_hold(t);
        const struct cerb_engine_ops *ops = h ? e->c->engines[h->engine_idx].ops : NULL;
        if (!h) {
            st = cerb__error_set(CERB_LOST, "election \"%s\": the term ended as it began", name);
        } else if (!(ops->election->flags & CERB_ELECT_VALUE_AT_GRANT)) {
            /* Led only once the value is there: nobody reads a leader with
             * the previous term's value. */
            st = proclaim_on(e->c, h, v, len, false);
        }
        if (st == CERB_OK && cancel && cerb_cancel_fired(cancel))
            st = cerb__error_set(CERB_INTERRUPTED, "election \"%s\": cancelled as it was "
                                                   "elected; the term was given back", name);
        /* Past its deadline already (a slow post-grant proclaim): a term the
         * caller would lead with after its loss. */
        if (st == CERB_OK && cerb_hold_state(t) == CERB_LOCK_LOST)
            st = cerb__error_set(CERB_LOST, "election \"%s\": the term was lost before its "
                                            "campaign could return it", name);
        if (st != CERB_OK) {
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            cerb_hold_free(t);
            t = NULL;
            cerb__error_set(st, "%s", why);
        }
    }
    cerb__mutex_lock(&e->mu);
    e->campaigning = false;
    e->tmpl->value = NULL;
    e->tmpl->value_len = 0;
    if (st == CERB_OK) {
        /* Unmuted: a loss from here on is told, also one the watchdog
         * found while muted (it then queued nothing). */
        struct cerb_slot *s = t->l.slot;
        cerb__mutex_lock(&s->mu);
        e->told = false;
        struct cerb_engine_hold *h = CERB__OBJECT_HOLD(s, &t->l);
        if (h && atomic_load(&h->state) == CERB_LOCK_LOST)
            cerb__election_lost_locked(e->c, e, t);
        cerb__mutex_unlock(&s->mu);
        e->term = t;
        atomic_store(&e->fence, cerb_hold_fencing_token(t));
        if (h)
            atomic_fetch_add(&e->c->engines[h->engine_idx].terms, 1);
    }
    cerb__mutex_unlock(&e->mu);
    return st;
}

/* Wait until no proclaim or resign is in flight; e->mu held. */
static void wait_idle(cerb_election *e)
{
    while (e->proclaiming || e->resigning)
        cerb__cond_wait(&e->idle, &e->mu);
}

cerb_status cerb_election_proclaim(cerb_election *e, const void *value, size_t len)
{
    if (!election_ok(e))
        return bad("cerb_election_proclaim");
    cerb_status st = value_check("cerb_election_proclaim", value, len);
    if (st != CERB_OK)
        return st;
    const char *name = e->tmpl->slot->name;
    cerb__mutex_lock(&e->mu);
    wait_idle(e);
    cerb_hold *t = e->term;
    struct cerb_engine_hold *h = t && !e->freeing ? term_hold(t) : NULL;
    if (!h) {
        cerb__mutex_unlock(&e->mu);
        return cerb__error_set(CERB_NOT_OWNER, "election \"%s\": this candidate does not lead",
                               name);
    }
    if (cerb_hold_state(t) == CERB_LOCK_LOST) {
        cerb__mutex_unlock(&e->mu);
        return cerb__error_set(CERB_LOST, "election \"%s\": the term was lost", name);
    }
    e->proclaiming = true; /* the term stays: resign and free wait for us */
    cerb__mutex_unlock(&e->mu);

    const struct cerb_engine_ops *ops = e->c->engines[h->engine_idx].ops;
    st = cerb__engine_check_value(ops, h->lk.variant, value, len);
    void *v = st == CERB_OK ? cerb__memdup0(value, len) : NULL;
    if (st == CERB_OK && !v)
        st = cerb__error_set(CERB_ENOMEM, "out of memory");
    if (st == CERB_OK)
        st = proclaim_on(e->c, h, value, len, true);
    if (st == CERB_OK) {
        atomic_fetch_add(&e->c->engines[h->engine_idx].proclaims, 1);
        /* The engine hold's copy follows, for an engine that sends it
         * again. (Claims on engines switched from keep the value the term
         * began with.) */
        cerb__mutex_lock(&t->l.slot->mu);
        cerb__engine_hold_prim(h, h->lk.prim, h->lk.variant, value, len);
        cerb__mutex_unlock(&t->l.slot->mu);
    }

    cerb__mutex_lock(&e->mu);
    if (st == CERB_OK) {
        cerb__free(e->value);
        e->value = v;
        e->value_len = len;
        v = NULL;
    }
    e->proclaiming = false;
    cerb__cond_broadcast(&e->idle);
    cerb__mutex_unlock(&e->mu);
    cerb__free(v);
    return st;
}

cerb_status cerb_election_resign(cerb_election *e)
{
    if (!election_ok(e))
        return bad("cerb_election_resign");
    cerb__mutex_lock(&e->mu);
    wait_idle(e);
    cerb_hold *t = e->freeing ? NULL : e->term;
    e->term = NULL;
    e->resigning = t != NULL;
    cerb__mutex_unlock(&e->mu);
    if (!t)
        return cerb__error_set(CERB_NOT_OWNER, "election \"%s\": this candidate does not lead",
                               e->tmpl->slot->name);
    cerb_status st = cerb_hold_free(t);
    cerb__mutex_lock(&e->mu);
    e->resigning = false;
    cerb__cond_broadcast(&e->idle);
    cerb__mutex_unlock(&e->mu);
    return st;
}

enum cerb_lock_state cerb_election_state(const cerb_election *e)
{
    if (!election_ok(e))
        return CERB_LOCK_FREE;
    cerb_election *m = (cerb_election *)e;
    cerb__mutex_lock(&m->mu);
    enum cerb_lock_state st = m->term ? cerb_hold_state(m->term) : CERB_LOCK_FREE;
    cerb__mutex_unlock(&m->mu);
    return st;
}

uint64_t cerb_election_fencing_token(const cerb_election *e)
{
    return election_ok(e) ? atomic_load(&((cerb_election *)e)->fence) : 0;
}

int64_t cerb_election_valid_ms(const cerb_election *e)
{
    if (!election_ok(e))
        return 0;
    cerb_election *m = (cerb_election *)e;
    cerb__mutex_lock(&m->mu);
    int64_t ms = m->term ? cerb_hold_valid_ms(m->term) : 0;
    cerb__mutex_unlock(&m->mu);
    return ms;
}

bool cerb__election_lost_locked(cerb_client *c, cerb_election *e, struct cerb_hold *o)
{
    (void)o; /* only the current term is watched: one at a time */
    if (!e->cb || e->told)
        return true;
    return e->told = cerb__notify_election_lost(c, e, e->cb, e->cb_ud);
}

cerb_status cerb_election_on_lost(cerb_election *e, void (*cb)(cerb_election *, void *),
                                  void *ud)
{
    if (!election_ok(e))
        return bad("cerb_election_on_lost");
    cerb__mutex_lock(&e->mu);
    cerb_hold *t = e->term;
    struct cerb_slot *s = e->tmpl->slot;
    cerb__mutex_lock(&s->mu);
    e->cb = cb;
    e->cb_ud = ud;
    /* A term lost before anyone listened: the watchdog told nobody. */
    cerb_status st = CERB_OK;
    struct cerb_engine_hold *h = t ? CERB__OBJECT_HOLD(s, &t->l) : NULL;
    if (cb && !e->told && h && atomic_load(&h->state) == CERB_LOCK_LOST &&
        !cerb__election_lost_locked(e->c, e, t))
        st = cerb__error_set(CERB_ENOMEM, "cerb_election_on_lost: out of memory to queue the "
                                          "callback of a term already lost; set it again");
    cerb__mutex_unlock(&s->mu);
    cerb__mutex_unlock(&e->mu);
    return st;
}

cerb_status cerb_election_free(cerb_election *e)
{
    if (!e)
        return CERB_OK;
    if (!election_ok(e))
        return bad("cerb_election_free");
    cerb_client *c = e->c;
    struct cerb_slot *s = e->tmpl->slot;
    cerb__mutex_lock(&e->mu);
    if (e->campaigning || e->freeing) {
        cerb__mutex_unlock(&e->mu);
        return cerb__error_set(CERB_BUSY, "election \"%s\": %s on another thread", s->name,
                               e->freeing ? "being freed" : "a campaign is in progress (fire "
                                                            "its cancel first)");
    }
    e->freeing = true; /* no call starts from here on */
    wait_idle(e);
    cerb_hold *t = e->term;
    e->term = NULL;
    cerb__mutex_unlock(&e->mu);
    /* No callback is queued from here on (the watchdog reads cb under the
     * slot mutex); the term goes before the template it came from. */
    cerb__mutex_lock(&s->mu);
    e->cb = NULL;
    cerb__mutex_unlock(&s->mu);
    cerb_status st = t ? cerb_hold_free(t) : CERB_OK;
    atomic_store(&e->magic, CERB_DEAD_MAGIC);
    cerb_lock_free(e->tmpl);
    cerb__free(e->value);
    cerb__cond_destroy(&e->idle);
    cerb__mutex_destroy(&e->mu);
    if (!cerb__notify_forget(c, e)) /* else its running callback still reads it */
        cerb__free(e);
    return st;
}

/* ---- who leads ---- */

static cerb_status leader_fill(cerb_leader_info *out, const char *engine, cerb_leader_rec *r)
{
    snprintf(out->engine, sizeof out->engine, "%s", engine);
    if (r->state != CERB_LEADER_SOME)
        return CERB_OK;
    out->has_leader = 1;
    out->value_known = r->value_known && r->value;
    if (out->value_known) {
        out->value = r->value; /* handed over */
        out->value_len = r->value_len;
        r->value = NULL;
    }
    out->term = r->counter;
    out->ttl_ms = r->ttl_ms;
    snprintf(out->owner, sizeof out->owner, "%s", r->owner);
    return CERB_OK;
}

cerb_status cerb_election_leader(cerb_client *c, const char *name, int layout,
                                 cerb_leader_info *out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_election_leader: out is NULL");
    memset(out, 0, sizeof *out);
    out->ttl_ms = -1;
    if (!cerb__client_ok(c))
        return cerb__error_set(CERB_EINVAL, "cerb_election_leader: bad client");
    if (layout < CERB_ELECTION_LAYOUT_DEFAULT || layout > CERB_ELECTION_LAYOUT_SELECTOR)
        return cerb__error_set(CERB_EINVAL, "cerb_election_leader: layout %d", layout);
    cerb_status st = cerb__lock_name_check(c, name);
    if (st != CERB_OK)
        return st;
    int64_t epoch;
    int at = cerb__route(c, &epoch);
    struct cerb_client_engine *ce = &c->engines[at];
    cerb_leader_rec r;
    st = cerb__engine_leader(ce->ops, ce->e, name, layout, &r);
    if (st != CERB_OK)
        return st;
    if (r.state == CERB_LEADER_UNKNOWN) {
        st = cerb__error_set(CERB_UNAVAILABLE, "election \"%s\": engine %s cannot tell who "
                                               "leads (%s)", name, ce->name, r.detail);
        cerb__leader_rec_clear(&r);
        return st;
    }
    if (r.state == CERB_LEADER_SOME) {
        leader_fill(out, ce->name, &r);
        cerb__leader_rec_clear(&r);
        return CERB_OK;
    }
    cerb__leader_rec_clear(&r);
    /* Nobody on the engine in use; a term granted before a switch may
     * still stand on an engine switched away from, until its grace. */
    for (size_t i = 0; i < c->n_engines; i++) {
        struct cerb_client_engine *ge = &c->engines[i];
        if ((int)i == at || !atomic_load(&ge->gated))
            continue;
        if (!cerb__engine_has_election(ge->ops))
            return cerb__error_set(CERB_UNAVAILABLE, "election \"%s\": nobody leads on engine "
                                                     "%s, but engine %s, switched from, has no "
                                                     "leader election to ask", name, ce->name,
                                                     ge->name);
        st = cerb__engine_leader(ge->ops, ge->e, name, layout, &r);
        if (st != CERB_OK || r.state == CERB_LEADER_UNKNOWN) {
            char why[CERB_ERROR_MAX];
            if (st != CERB_OK)
                cerb__error_copy(why, sizeof why);
            else
                snprintf(why, sizeof why, "%s", r.detail);
            cerb__leader_rec_clear(&r);
            return cerb__error_set(CERB_UNAVAILABLE, "election \"%s\": nobody leads on engine %s, "
                                                     "but engine %s, switched from, cannot tell "
                                                     "(%s)", name, ce->name, ge->name, why);
        }
        if (r.state == CERB_LEADER_SOME) {
            leader_fill(out, ge->name, &r);
            cerb__leader_rec_clear(&r);
            return CERB_OK;
        }
        cerb__leader_rec_clear(&r);
    }
    snprintf(out->engine, sizeof out->engine, "%s", ce->name);
    return CERB_OK;
}

void cerb_leader_info_clear(cerb_leader_info *info)
{
    if (!info)
        return;
    cerb__free(info->value);
    memset(info, 0, sizeof *info);
    info->ttl_ms = -1;
}
