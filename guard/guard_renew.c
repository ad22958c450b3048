/*
 * guard_renew.c — the client's set of guard handles, the renewers that keep
 * running attempts' claims alive, and the deadline thread that tells an
 * attempt, on time, when they are not.
 *
 * Every guard handle of a client is on one list (so close can end the ones
 * left open). A running attempt — and each of its mirror claims on engines
 * switched from — carries a renewal schedule in the watchdog's style: next
 * renewal at a third of running_ms after the send of the request that last
 * set the claim, and a conservative local end of the claim, valid_until =
 * that send + running_ms × (1 − drift). The threads share the set's mutex
 * and do no I/O under it:
 *  - one renewer per engine (started with the first claim or orphan there)
 *    sends that engine's due renewals, earliest first, one engine call at a
 *    time, and applies the answers: OK moves both times on (VALID); "not
 *    owner" (the record is gone, done or another attempt's) is definitive —
 *    the claim is LOST and no longer renewed; any other error makes it
 *    SUSPECT and is retried after a tenth of running_ms, so a server that
 *    comes back in time still sees the claim renewed. A call on engine A
 *    therefore never delays a due renewal on engine B: a silent engine
 *    (paused, slower than its operation timeout) costs its own claims only.
 *    After a call there went unanswered, the engine's other claims wait out
 *    a short back-off (and a gated engine's question back-off is renewed),
 *    so a silent engine gets about one call per operation timeout plus
 *    back-off, not one per claim;
 *  - the deadline thread does no I/O at all: it sleeps until the earliest
 *    valid_until and marks every claim past it LOST (even one whose renewal
 *    is on the wire), logs it at WARN, and queues the attempt's lost
 *    callback (notify.c). A mirror's loss is its attempt's: processes still
 *    on that engine may begin there once its claim is gone.
 * LOST is final for the state; the attempt's other claims are still renewed
 * until finish or free (they keep others out while the caller may still be
 * running the operation), and finish decides on the server by the token.
 * The renewers never bring a claim back: renewals compare the token and the
 * state on the server. Stopping a handle's renewal withdraws it and waits
 * for a renewal on the wire (one engine call, bounded by the engine's
 * operation timeout), so a finish is never overtaken by a renewal and a
 * handle is never freed under a renewer.
 *
 * Orphans. A begin that failed after its request left (a timeout: the claim
 * may land later, when a paused server resumes) and a failed attempt's
 * delete that was not confirmed leave a claim nobody renews, which would
 * keep retries out for running_ms. The engine's renewer deletes such a
 * claim, compared with its token, every tenth of running_ms (50 ms to
 * 500 ms) until a delete is confirmed or the claim must have run out by
 * itself (its request's send time + running_ms), as the lock watchdog does
 * for acquires whose outcome was unknown. "Not ours" is no proof (the
 * request may still land), so only the deadline ends the retries. A
 * done-record is never touched: the delete compares the state too. A
 * success that a mirror claim (an engine switched from) did not confirm is
 * an orphan too, one that writes the done-record instead, until confirmed
 * or until the claim there may have run out. A renewer takes one orphan at
 * a time and its due renewals before it.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "guard.h"
#include "internal.h"
#include "log.h"

/* A claim that may have landed although its request failed (the answer was
 * lost): deleted again and again, compared with its token, until a delete
 * is confirmed or the claim must have run out by itself. */
struct orphan {
    cerb_guard_rec rec;          /* rec.scope points at `scope` */
    char *scope;
    int idx;
    int64_t until_ns, next_ns;
    /* A success to record (a mirror's done-record not confirmed), else a
     * delete: */
    bool succeeded;
    void *result;                /* owned copy */
    size_t len;
    int64_t keep_ms;
    struct orphan *next;
};

/* One engine's renewer. */
struct grenewer {
    pthread_t thread;
    bool started;
    cerb_cond cond;              /* a new earliest renewal or orphan, or stop */
    /* Asleep until this (CERB_DEADLINE_NEVER: nothing due), or awake (0):
     * it looks at the list again before it sleeps, so only an earlier
     * deadline needs to wake it (not one wake-up per begin). */
    int64_t asleep_until;
    /* A call here went unanswered: the engine's other claims wait until
     * then (one call per operation timeout and back-off on a silent
     * engine, not one per claim). */
    int64_t quiet_until;
    struct orphan *orphans;
};

struct cerb_guard_set {
    cerb_client *c;
    cerb_mutex mu;
    cerb_cond wake;   /* the deadline thread: an earlier deadline, or stop */
    cerb_cond idle;   /* a busy flag was cleared */
    pthread_t thread; /* the deadline thread */
    bool started, stop;
    int64_t asleep_until;        /* the deadline thread's, as a renewer's */
    struct cerb_guard *head;
    struct grenewer rn[CERB_MAX_ENGINES];
};

struct renewer_arg {
    struct cerb_guard_set *s;
    int idx;
};

/* Wake a sleeper whose sleep ends after `due_ns`, or should have ended
 * already: deadlines are on the boot-time clock and waits on the monotonic
 * one, which stops during a suspend, so after one a thread sleeps on past a
 * deadline that lies in the past; s->mu held. */
static void wake_if(cerb_cond *cond, int64_t asleep_until, int64_t due_ns)
{
    if (asleep_until != 0 && (due_ns < asleep_until || asleep_until <= cerb_monotime()))
        cerb__cond_signal(cond);
}

static void wake_renewer(struct cerb_guard_set *s, int idx, int64_t due_ns)
{
    wake_if(&s->rn[idx].cond, s->rn[idx].asleep_until, due_ns);
}

static cerb_mutex sets_mu = {PTHREAD_MUTEX_INITIALIZER};

/* The client's set, made on first use (under a process-wide mutex: it is
 * taken once per client). */
static struct cerb_guard_set *set_of(cerb_client *c, bool make)
{
    struct cerb_guard_set *s = atomic_load(&c->guards);
    if (s || !make)
        return s;
    cerb__mutex_lock(&sets_mu);
    s = atomic_load(&c->guards);
    if (!s) {
        s = cerb__calloc(1, sizeof *s);
        if (s) {
            s->c = c;
            cerb__mutex_init(&s->mu);
            cerb__cond_init(&s->wake);
            cerb__cond_init(&s->idle);
            for (int i = 0; i < CERB_MAX_ENGINES; i++)
                cerb__cond_init(&s->rn[i].cond);
            atomic_store(&c->guards, s);
        }
    }
    cerb__mutex_unlock(&sets_mu);
    return s;
}

static void schedule(struct cerb_guard *g, const cerb_grant *grant)
{
    atomic_store(&g->valid_until_ns, cerb__grant_deadline(grant));
    int64_t ttl = grant->ttl_ms > 0 ? grant->ttl_ms : g->rec.running_ms;
    g->next_renew_ns = grant->sent_ns + ttl * CERB_NS_PER_MS / 3;
}

/* Move a claim to VALID or SUSPECT unless it is LOST: LOST is final. */
static void set_cstate(struct cerb_guard *g, int to)
{
    int cur = atomic_load(&g->cstate);
    while (cur != CERB_LOCK_LOST && cur != to &&
           !atomic_compare_exchange_weak(&g->cstate, &cur, to))
        ;
}

/* Mark claim g LOST, and its attempt with it; queue the attempt's lost
 * callback once. s->mu held (the callback and its data are read under it). */
static void tell_lost(struct cerb_guard_set *s, struct cerb_guard *a)
{
    /* Told once a callback is queued: one set later is still called
     * (cerb__guard_set_lost_cb). Out of memory: the next loss found, or a
     * callback set again, tries again. */
    if (a->lost_told || !a->lost_cb || atomic_load(&a->ended))
        return;
    a->lost_told = cerb__notify_guard_lost(s->c, a, a->lost_cb, a->lost_ud);
}

static void declare_lost(struct cerb_guard_set *s, struct cerb_guard *g)
{
    struct cerb_guard *a = g->parent ? g->parent : g;
    atomic_store(&g->cstate, CERB_LOCK_LOST);
    atomic_store(&a->cstate, CERB_LOCK_LOST);
    tell_lost(s, a);
}

static void renew_one(struct cerb_guard_set *s, struct cerb_guard *g)
{
    cerb_client *c = s->c;
    int idx = g->engine_idx;
    struct cerb_client_engine *ce = &c->engines[idx];
    cerb_grant grant;
    cerb_status st = cerb__engine_guard_renew(ce->ops, atomic_load(&ce->e), &g->rec, &grant);
    bool silent = st == CERB_TIMEOUT || st == CERB_EIO || st == CERB_UNAVAILABLE;
    int64_t now = cerb_monotime();
    int64_t step = g->rec.running_ms * CERB_NS_PER_MS / 10;
    char scope[256];

    /* What the log needs is copied before busy is cleared: from then on
     * the handle's owner may free it. */
    snprintf(scope, sizeof scope, "%s", g->rec.scope);
    bool late = false;
    cerb__mutex_lock(&s->mu);
    if (st == CERB_OK) {
        /* Answered after the claim's deadline (before the deadline thread
         * saw it): another attempt may have begun meanwhile, so LOST,
         * which is final; the claim is still renewed. */
        late = now >= atomic_load(&g->valid_until_ns) && !g->past;
        if (late) {
            g->past = true;
            declare_lost(s, g);
        }
        schedule(g, &grant);
        set_cstate(g, CERB_LOCK_VALID);
    } else if (st == CERB_NOT_OWNER) {
        g->renewing = false;
        declare_lost(s, g);
    } else {
        set_cstate(g, CERB_LOCK_SUSPECT);
        g->next_renew_ns = now + step;
        if (silent) {
            int64_t quiet = step < 50 * CERB_NS_PER_MS    ? 50 * CERB_NS_PER_MS
                            : step > 250 * CERB_NS_PER_MS ? 250 * CERB_NS_PER_MS
                                                          : step;
            s->rn[idx].quiet_until = now + quiet;
        }
    }
    g->busy = false;
    cerb__cond_broadcast(&s->idle);
    cerb__mutex_unlock(&s->mu);

    if (st == CERB_OK) {
        cerb__health_ok(c, idx);
        if (late)
            CERB_LOG_W("guard %s: the claim on %s was renewed only after its deadline: another "
                       "attempt may have begun; the attempt is LOST", scope, ce->name);
    } else if (st == CERB_NOT_OWNER) {
        cerb__health_ok(c, idx);
        CERB_LOG_W("guard %s: the running attempt's claim on %s was lost (taken over or "
                   "deleted); its finish will return LOST", scope, ce->name);
    } else {
        cerb__health_fail(c, idx, "guard renew");
        if (silent && atomic_load(&ce->gated))
            cerb__gate_no_answer(c, idx);
    }
}

static int64_t orphan_step(const struct orphan *o)
{
    int64_t ms = o->rec.running_ms / 10;
    ms = ms < 50 ? 50 : ms > 500 ? 500 : ms;
    return ms * CERB_NS_PER_MS;
}

static void orphan_free(struct orphan *o)
{
    cerb__free(o->result);
    cerb__free(o->scope);
    cerb__free(o);
}

/* One delete (or done-write) of a due orphan (mutex not held); true when
 * it is settled. A done-write that finds the claim gone ("not owner": it
 * landed earlier with its answer lost, or the claim expired) is settled
 * too: the guard check tells which, for the log. */
static bool orphan_try(struct cerb_guard_set *s, struct orphan *o)
{
    struct cerb_client_engine *ce = &s->c->engines[o->idx];
    cerb_engine *e = atomic_load(&ce->e);
    cerb_outcome oc;
    cerb_status st = cerb__engine_guard_finish(ce->ops, e, &o->rec, o->succeeded, o->result,
                                               o->len, o->keep_ms, &oc);
    if (!o->succeeded)
        return st == CERB_OK || cerb_monotime() >= o->until_ns;
    if (st == CERB_OK)
        return true;
    cerb_guard_found found = CERB_GUARD_FOUND_NONE;
    if (st == CERB_NOT_OWNER &&
        cerb__engine_guard_check(ce->ops, e, &o->rec, &found) == CERB_OK &&
        found == CERB_GUARD_FOUND_DONE)
        return true;
    if (st == CERB_NOT_OWNER || cerb_monotime() >= o->until_ns) {
        CERB_LOG_E("guard %s: the success could not be recorded on engine %s (switched from): "
                   "processes still on it may run the operation again", o->rec.scope, ce->name);
        return true;
    }
    return false;
}

/* Take engine idx's first due orphan off its list and try it; s->mu held
 * (released around the call). Returns true when one was tried, else false
 * with *next the earliest next try. */
static bool orphan_run(struct cerb_guard_set *s, int idx, int64_t *next)
{
    struct grenewer *rn = &s->rn[idx];
    int64_t now = cerb_monotime();
    *next = CERB_DEADLINE_NEVER;
    struct orphan **pp = &rn->orphans, *due = NULL;
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->next_ns <= now) {
            due = *pp;
            *pp = due->next;
            break;
        }
        if ((*pp)->next_ns < *next)
            *next = (*pp)->next_ns;
    }
    if (!due)
        return false;
    cerb__mutex_unlock(&s->mu);
    bool done = orphan_try(s, due);
    cerb__mutex_lock(&s->mu);
    if (done) {
        orphan_free(due);
    } else {
        due->next_ns = cerb_monotime() + orphan_step(due);
        due->next = rn->orphans;
        rn->orphans = due;
    }
    return true;
}

/*
 * One step of engine idx's renewer at `now`: its earliest due renewal, else
 * one due orphan (each may cost an operation timeout on a silent engine:
 * due renewals come first). s->mu held (released around the call). Returns
 * true when it sent something; else false with *next the time it wants to
 * look again.
 */
static bool renewer_step(struct cerb_guard_set *s, int idx, int64_t *next)
{
    struct grenewer *rn = &s->rn[idx];
    int64_t now = cerb_monotime();
    bool quiet = rn->quiet_until > now;
    struct cerb_guard *due = NULL;
    *next = CERB_DEADLINE_NEVER;
    for (struct cerb_guard *g = s->head; g; g = g->next) {
        if (g->engine_idx != idx || !g->renewing || g->busy)
            continue;
        int64_t at = g->next_renew_ns;
        /* A silent engine: its claims wait out the back-off, unless that
         * would leave one no retry before its deadline (a short claim
         * beside the one whose call went unanswered). */
        int64_t step = g->rec.running_ms * CERB_NS_PER_MS / 10;
        if (quiet && at < rn->quiet_until &&
            atomic_load(&g->valid_until_ns) > rn->quiet_until + step)
            at = rn->quiet_until;
        if (at < *next) {
            *next = at;
            due = g;
        }
    }
    if (due && *next <= now) {
        due->busy = true;
        cerb__mutex_unlock(&s->mu);
        renew_one(s, due);
        cerb__mutex_lock(&s->mu);
        return true;
    }
    int64_t o = CERB_DEADLINE_NEVER;
    if (quiet) { /* orphans wait out the back-off too, never longer */
        for (struct orphan *x = rn->orphans; x; x = x->next)
            if (x->next_ns < o)
                o = x->next_ns;
        if (o < rn->quiet_until)
            o = rn->quiet_until;
    } else if (orphan_run(s, idx, &o)) {
        return true;
    }
    if (o < *next)
        *next = o;
    return false;
}

/* Sleep until `next`, or 1 s at most: deadlines are on the boot-time clock,
 * waits on the monotonic one, which stops while the machine is suspended;
 * a thread must look at the time again soon after a resume (§5a.2). */
static int64_t nap_until(int64_t next)
{
    int64_t cap = cerb_monotime() + CERB_NS_PER_MS * 1000;
    return next < cap ? next : cap;
}

static void *renewer_main(void *arg)
{
    struct renewer_arg *ra = arg;
    struct cerb_guard_set *s = ra->s;
    int idx = ra->idx;
    struct grenewer *rn = &s->rn[idx];
    cerb__free(ra);
    cerb__mutex_lock(&s->mu);
    while (!s->stop) {
        int64_t next;
        if (renewer_step(s, idx, &next))
            continue;
        rn->asleep_until = nap_until(next);
        cerb__cond_wait_until(&rn->cond, &s->mu, rn->asleep_until);
        rn->asleep_until = 0;
    }
    cerb__mutex_unlock(&s->mu);
    return NULL;
}

/* Log lines of claims found past their deadline, written after s->mu. */
#define PAST_LOG 4
struct past_log {
    char line[PAST_LOG][CERB_ENGINE_NAME_MAX + 400];
    size_t n, more;
};

/* Mark every claim past its deadline LOST (no I/O); s->mu held. Returns the
 * earliest deadline still ahead. */
static int64_t deadline_scan(struct cerb_guard_set *s, struct past_log *pl)
{
    int64_t now = cerb_monotime(), next = CERB_DEADLINE_NEVER;
    for (struct cerb_guard *g = s->head; g; g = g->next) {
        /* Only claims being renewed (a finish stops the renewal of the
         * claim it ends; one on the wire keeps it renewing). */
        if (g->past || !g->renewing)
            continue;
        int64_t until = atomic_load(&g->valid_until_ns);
        if (until > now) {
            if (until < next)
                next = until;
            continue;
        }
        g->past = true;
        bool was_lost = atomic_load(&g->cstate) == CERB_LOCK_LOST;
        declare_lost(s, g);
        if (was_lost)
            continue;
        if (pl->n < PAST_LOG)
            snprintf(pl->line[pl->n++], sizeof pl->line[0],
                     "guard %s: the %s claim on %s passed its deadline unrenewed: another "
                     "attempt may begin; the attempt is LOST",
                     g->rec.scope, g->parent ? "mirror" : "attempt's",
                     s->c->engines[g->engine_idx].name);
        else
            pl->more++;
    }
    return next;
}

/* Write what deadline_scan collected; s->mu not held. */
static void past_log_write(const struct past_log *pl)
{
    for (size_t i = 0; i < pl->n; i++)
        CERB_LOG_W("%s", pl->line[i]);
    if (pl->more)
        CERB_LOG_W("guard: %zu more claims passed their deadline unrenewed", pl->more);
}

/* The deadline thread: no I/O, so no engine can delay a LOST. */
static void *deadline_main(void *arg)
{
    struct cerb_guard_set *s = arg;
    cerb__mutex_lock(&s->mu);
    while (!s->stop) {
        struct past_log pl = {.n = 0};
        int64_t next = deadline_scan(s, &pl);
        if (pl.n) {
            cerb__mutex_unlock(&s->mu);
            past_log_write(&pl);
            cerb__mutex_lock(&s->mu);
            continue;
        }
        s->asleep_until = nap_until(next);
        cerb__cond_wait_until(&s->wake, &s->mu, s->asleep_until);
        s->asleep_until = 0;
    }
    cerb__mutex_unlock(&s->mu);
    return NULL;
}

int64_t cerb__guard_deadlines(cerb_client *c)
{
    struct cerb_guard_set *s = atomic_load(&c->guards);
    if (!s)
        return CERB_DEADLINE_NEVER;
    struct past_log pl = {.n = 0};
    cerb__mutex_lock(&s->mu);
    int64_t next = deadline_scan(s, &pl);
    cerb__mutex_unlock(&s->mu);
    past_log_write(&pl);
    return next;
}

int64_t cerb__guard_step(cerb_client *c)
{
    struct cerb_guard_set *s = atomic_load(&c->guards);
    if (!s)
        return CERB_DEADLINE_NEVER;
    int64_t next = cerb__guard_deadlines(c);
    cerb__mutex_lock(&s->mu);
    for (size_t i = 0; i < c->n_engines; i++) {
        int64_t n = CERB_DEADLINE_NEVER;
        /* Bounded: every claim or orphan is sent at most once a step. */
        for (int sent = 0; sent < 64 && renewer_step(s, (int)i, &n); sent++)
            ;
        if (n < next)
            next = n;
    }
    cerb__mutex_unlock(&s->mu);
    /* Answers may have moved deadlines; a renewal that came back late
     * (the manual caller's clock moved on) is judged now. */
    int64_t d = cerb__guard_deadlines(c);
    return d < next ? d : next;
}

/* Start engine idx's renewer (and the deadline thread) if not running;
 * s->mu held. */
static cerb_status start_locked(struct cerb_guard_set *s, int idx)
{
    int rc = 0;
    if (s->c->manual) { /* no threads: the caller runs cerb__guard_step */
        s->started = s->rn[idx].started = true;
        return CERB_OK;
    }
    if (!s->started) {
        rc = pthread_create(&s->thread, NULL, deadline_main, s);
        if (rc != 0)
            return cerb__error_set(CERB_ENOMEM, "guard: cannot start the deadline thread: %s",
                                   strerror(rc));
        s->started = true;
    }
    struct grenewer *rn = &s->rn[idx];
    if (rn->started)
        return CERB_OK;
    struct renewer_arg *ra = cerb__malloc(sizeof *ra);
    if (!ra)
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
    ra->s = s;
    ra->idx = idx;
    rc = pthread_create(&rn->thread, NULL, renewer_main, ra);
    if (rc != 0) {
        cerb__free(ra);
        return cerb__error_set(CERB_ENOMEM, "guard: cannot start the renewer: %s",
                               strerror(rc));
    }
    rn->started = true;
    return CERB_OK;
}

static void orphan_add(cerb_client *c, const cerb_guard_rec *rec, int idx, int64_t until_ns,
                       const void *result, size_t len, int64_t keep_ms, bool succeeded);

void cerb__guard_orphan(cerb_client *c, const cerb_guard_rec *rec, int idx, int64_t sent_ns)
{
    orphan_add(c, rec, idx, sent_ns + rec->running_ms * CERB_NS_PER_MS, NULL, 0, 0, false);
}

void cerb__guard_orphan_done(cerb_client *c, const cerb_guard_rec *rec, int idx,
                             int64_t until_ns, const void *result, size_t len, int64_t keep_ms)
{
    orphan_add(c, rec, idx, until_ns, result, len, keep_ms, true);
}

static void orphan_add(cerb_client *c, const cerb_guard_rec *rec, int idx, int64_t until_ns,
                       const void *result, size_t len, int64_t keep_ms, bool succeeded)
{
    struct cerb_guard_set *s = set_of(c, true);
    struct orphan *o = s ? cerb__calloc(1, sizeof *o) : NULL;
    if (o)
        o->scope = cerb__strdup(rec->scope);
    if (o && succeeded) {
        o->result = cerb__malloc(len + 1);
        if (o->result && len)
            memcpy(o->result, result, len);
    }
    if (!o || !o->scope || (succeeded && !o->result)) {
        if (o)
            orphan_free(o);
        CERB_LOG_W("guard %s: out of memory: a claim that may have landed expires after %lld "
                   "ms", rec->scope, (long long)rec->running_ms);
        return;
    }
    o->rec = *rec;
    o->rec.scope = o->scope;
    o->idx = idx;
    o->until_ns = until_ns;
    o->succeeded = succeeded;
    o->len = len;
    o->keep_ms = keep_ms;
    o->next_ns = cerb_monotime() + orphan_step(o);
    cerb__mutex_lock(&s->mu);
    if (s->stop || start_locked(s, idx) != CERB_OK) {
        cerb__mutex_unlock(&s->mu);
        orphan_free(o);
        return;
    }
    o->next = s->rn[idx].orphans;
    s->rn[idx].orphans = o;
    wake_renewer(s, idx, o->next_ns);
    cerb__mutex_unlock(&s->mu);
}

cerb_status cerb__guard_track(struct cerb_guard *g, const cerb_grant *grant, bool renew)
{
    struct cerb_guard_set *s = set_of(g->client, true);
    if (!s)
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
    cerb__mutex_lock(&s->mu);
    if (renew) {
        cerb_status st = start_locked(s, g->engine_idx);
        if (st != CERB_OK) {
            cerb__mutex_unlock(&s->mu);
            return st;
        }
    }
    g->prev = NULL;
    g->next = s->head;
    if (s->head)
        s->head->prev = g;
    s->head = g;
    g->renewing = renew;
    g->busy = false;
    g->past = false;
    g->tracked = true;
    atomic_store(&g->cstate, renew ? CERB_LOCK_VALID : CERB_LOCK_FREE);
    if (renew) {
        schedule(g, grant);
        wake_renewer(s, g->engine_idx, g->next_renew_ns);
        wake_if(&s->wake, s->asleep_until, atomic_load(&g->valid_until_ns));
    }
    cerb__mutex_unlock(&s->mu);
    return CERB_OK;
}

/* A claim's state with its deadline read now: LOST once it has passed
 * (the deadline thread may not have run yet). */
static int claim_state(const struct cerb_guard *g, int64_t now)
{
    int st = atomic_load(&((struct cerb_guard *)g)->cstate);
    if (st != CERB_LOCK_FREE && now >= atomic_load(&((struct cerb_guard *)g)->valid_until_ns))
        return CERB_LOCK_LOST;
    return st;
}

enum cerb_lock_state cerb__guard_state(const struct cerb_guard *g)
{
    int64_t now = cerb_monotime();
    int worst = claim_state(g, now);
    if (worst == CERB_LOCK_FREE)
        return CERB_LOCK_FREE; /* a duplicate's answer or a degraded attempt */
    struct cerb_guard_set *s = set_of(g->client, false);
    if (!s)
        return (enum cerb_lock_state)worst;
    /* Under the set's mutex: free takes the mirrors off under it, after
     * marking the handle ended, so they are never read freed. */
    cerb__mutex_lock(&s->mu);
    if (atomic_load(&((struct cerb_guard *)g)->ended))
        worst = CERB_LOCK_FREE;
    for (const struct cerb_guard *m = g->mirrors; m && worst != CERB_LOCK_FREE &&
                                                  worst != CERB_LOCK_LOST;
         m = m->mirror_next) {
        int ms = claim_state(m, now);
        if (ms == CERB_LOCK_LOST || (ms == CERB_LOCK_SUSPECT && worst == CERB_LOCK_VALID))
            worst = ms;
    }
    cerb__mutex_unlock(&s->mu);
    return (enum cerb_lock_state)worst;
}

struct cerb_guard *cerb__guard_take_mirrors(struct cerb_guard *g)
{
    struct cerb_guard_set *s = set_of(g->client, false);
    if (s)
        cerb__mutex_lock(&s->mu);
    struct cerb_guard *m = g->mirrors;
    g->mirrors = NULL;
    if (s)
        cerb__mutex_unlock(&s->mu);
    return m;
}

void cerb__guard_set_lost_cb(struct cerb_guard *g, void (*cb)(struct cerb_guard *, void *),
                             void *ud)
{
    struct cerb_guard_set *s = set_of(g->client, true);
    if (!s) { /* out of memory: no set, so no renewer could report a loss */
        g->lost_cb = cb;
        g->lost_ud = ud;
        return;
    }
    cerb__mutex_lock(&s->mu);
    g->lost_cb = cb;
    g->lost_ud = ud;
    /* Lost before anyone listened (a mirror lapsed during begin): told now. */
    if (atomic_load(&g->cstate) == CERB_LOCK_LOST)
        tell_lost(s, g);
    cerb__mutex_unlock(&s->mu);
}

void cerb__guard_stop_renew(struct cerb_guard *g)
{
    struct cerb_guard_set *s = set_of(g->client, false);
    if (!s)
        return;
    cerb__mutex_lock(&s->mu);
    g->renewing = false;
    while (g->busy)
        cerb__cond_wait(&s->idle, &s->mu);
    cerb__mutex_unlock(&s->mu);
}

void cerb__guard_resume_renew(struct cerb_guard *g)
{
    struct cerb_guard_set *s = set_of(g->client, false);
    if (!s)
        return;
    cerb__mutex_lock(&s->mu);
    if (g->tracked && !s->stop) {
        g->renewing = true;
        g->next_renew_ns = cerb_monotime();
        wake_renewer(s, g->engine_idx, g->next_renew_ns);
        wake_if(&s->wake, s->asleep_until, atomic_load(&g->valid_until_ns));
    }
    cerb__mutex_unlock(&s->mu);
}

static void unlink_locked(struct cerb_guard_set *s, struct cerb_guard *g)
{
    if (g->prev)
        g->prev->next = g->next;
    else if (s->head == g)
        s->head = g->next;
    if (g->next)
        g->next->prev = g->prev;
    g->next = g->prev = NULL;
    g->tracked = false;
}

void cerb__guard_untrack(struct cerb_guard *g)
{
    struct cerb_guard_set *s = set_of(g->client, false);
    if (!s)
        return;
    cerb__mutex_lock(&s->mu);
    g->renewing = false;
    while (g->busy)
        cerb__cond_wait(&s->idle, &s->mu);
    if (g->tracked)
        unlink_locked(s, g);
    cerb__mutex_unlock(&s->mu);
}

void cerb__guard_close_all(cerb_client *c)
{
    struct cerb_guard_set *s = atomic_load(&c->guards);
    if (!s)
        return;
    cerb__mutex_lock(&s->mu);
    s->stop = true;
    cerb__cond_broadcast(&s->wake);
    for (int i = 0; i < CERB_MAX_ENGINES; i++)
        cerb__cond_broadcast(&s->rn[i].cond);
    cerb__mutex_unlock(&s->mu);
    if (s->started && !c->manual)
        pthread_join(s->thread, NULL);
    for (int i = 0; i < CERB_MAX_ENGINES; i++)
        if (s->rn[i].started && !c->manual)
            pthread_join(s->rn[i].thread, NULL);
    /* Orphans get one more delete each (not on an engine that failed),
     * then are left to expire. */
    for (int i = 0; i < CERB_MAX_ENGINES; i++) {
        bool silent_o = false;
        while (s->rn[i].orphans) {
            struct orphan *o = s->rn[i].orphans;
            s->rn[i].orphans = o->next;
            if (!silent_o) {
                struct cerb_client_engine *ce = &c->engines[o->idx];
                cerb_outcome oc;
                cerb_status st = cerb__engine_guard_finish(ce->ops, atomic_load(&ce->e), &o->rec,
                                                           o->succeeded, o->result, o->len,
                                                           o->keep_ms, &oc);
                if (st != CERB_OK && st != CERB_NOT_OWNER)
                    silent_o = true;
            }
            orphan_free(o);
        }
    }
    /* The renewers are gone: nothing is busy. End what is left, deleting an
     * unfinished attempt's claim once per engine that still answers. */
    bool silent[CERB_MAX_ENGINES] = {false};
    size_t left = 0;
    while (s->head) {
        struct cerb_guard *g = s->head;
        unlink_locked(s, g);
        g->renewing = false;
        if (g->parent)
            continue; /* a mirror claim: ended and freed with its attempt */
        int idx = g->engine_idx;
        bool open = g->kind == CERB_GUARD_RUNNING && !g->degraded;
        if (open && silent[idx])
            left++;
        cerb_status st = cerb__guard_end(g, silent[idx]);
        if (open && st != CERB_OK && st != CERB_LOST)
            silent[idx] = true;
    }
    if (left)
        CERB_LOG_W("close: %zu unfinished guard attempt(s) left to expire with running_ms", left);
    atomic_store(&c->guards, NULL);
    for (int i = 0; i < CERB_MAX_ENGINES; i++)
        cerb__cond_destroy(&s->rn[i].cond);
    cerb__cond_destroy(&s->wake);
    cerb__cond_destroy(&s->idle);
    cerb__mutex_destroy(&s->mu);
    cerb__free(s);
}
