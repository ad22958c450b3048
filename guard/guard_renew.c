/*
 * guard_renew.c — the client's set of guard handles and the renewer that
 * keeps running attempts' claims alive.
 *
 * Every guard handle of a client is on one list (so close can end the ones
 * left open). A running attempt also carries a renewal schedule in the
 * watchdog's style: next renewal at a third of running_ms after the send of
 * the request that last set the claim, and a conservative local end of the
 * claim, valid_until = that send + running_ms × (1 − drift). One thread per
 * client (started with the first running attempt) sleeps until the earliest
 * renewal, takes it off the list's lock (busy), sends it with no mutex held,
 * and applies the answer: OK moves both times on; "not owner" (the record is
 * gone, done or another attempt's) is definitive — the claim is lost, it is
 * no longer renewed, a warning is logged and the holder learns it from
 * cerb_guard_finish (CERB_LOST, decided by the token compare on the server);
 * any other error is retried after a tenth of running_ms, so a server that
 * comes back in time still sees the claim renewed. The renewer never brings
 * a claim back: renewals compare the token and the state on the server.
 * Stopping a handle's renewal withdraws it and waits for a renewal on the
 * wire (one engine call, bounded by the engine's operation timeout), so a
 * finish is never overtaken by a renewal and a handle is never freed under
 * the renewer. The renewer handles one claim per engine call; attempts are
 * short-lived and few per process compared with locks.
 *
 * Orphans. A begin that failed after its request left (a timeout: the claim
 * may land later, when a paused server resumes) and a failed attempt's
 * delete that was not confirmed leave a claim nobody renews, which would
 * keep retries out for running_ms. The renewer deletes such a claim,
 * compared with its token, every tenth of running_ms (50 ms to 500 ms) until
 * a delete is confirmed or the claim must have run out by itself (its
 * request's send time + running_ms), as the lock watchdog does for acquires
 * whose outcome was unknown. "Not ours" is no proof (the request may still
 * land), so only the deadline ends the retries. A done-record is never
 * touched: the delete compares the state too. A success that a mirror
 * claim (an engine switched from) did not confirm is an orphan too, one
 * that writes the done-record instead, until confirmed or until the claim
 * there may have run out. The renewer takes one orphan at a time and due
 * renewals before it, so orphans on a silent engine (an operation timeout
 * each) never make live claims lapse.
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

struct cerb_guard_set {
    cerb_client *c;
    struct orphan *orphans;
    cerb_mutex mu;
    cerb_cond wake;   /* a new earliest renewal, or stop */
    cerb_cond idle;   /* a busy flag was cleared */
    pthread_t thread;
    bool started, stop;
    /* The renewer is asleep until this (CERB_DEADLINE_NEVER: nothing due),
     * or awake (0): it looks at the list again before it sleeps, so only an
     * earlier deadline needs to wake it (not one wake-up per begin). */
    int64_t asleep_until;
    struct cerb_guard *head;
};

/* Wake the renewer if `due_ns` comes before its sleep ends, or if its sleep
 * should have ended already: the deadline is on the boot-time clock and the
 * wait on the monotonic one, which stops during a suspend, so after one the
 * renewer sleeps on past a deadline that lies in the past; s->mu held. */
static void wake_for(struct cerb_guard_set *s, int64_t due_ns)
{
    if (s->asleep_until != 0 &&
        (due_ns < s->asleep_until || s->asleep_until <= cerb_monotime()))
        cerb__cond_signal(&s->wake);
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
            atomic_store(&c->guards, s);
        }
    }
    cerb__mutex_unlock(&sets_mu);
    return s;
}

static void schedule(struct cerb_guard *g, const cerb_grant *grant)
{
    g->valid_until_ns = cerb__grant_deadline(grant);
    int64_t ttl = grant->ttl_ms > 0 ? grant->ttl_ms : g->rec.running_ms;
    g->next_renew_ns = grant->sent_ns + ttl * CERB_NS_PER_MS / 3;
}

static void renew_one(struct cerb_guard_set *s, struct cerb_guard *g)
{
    cerb_client *c = s->c;
    int idx = g->engine_idx;
    struct cerb_client_engine *ce = &c->engines[idx];
    cerb_grant grant;
    cerb_status st = cerb__engine_guard_renew(ce->ops, atomic_load(&ce->e), &g->rec, &grant);
    int64_t now = cerb_monotime();
    char scope[256];
    bool late = false;

    /* What the log needs is copied before busy is cleared: from then on
     * the handle's owner may free it. */
    snprintf(scope, sizeof scope, "%s", g->rec.scope);
    cerb__mutex_lock(&s->mu);
    if (st == CERB_OK) {
        schedule(g, &grant);
    } else if (st == CERB_NOT_OWNER) {
        atomic_store(&g->lost, true);
        if (g->parent)
            atomic_store(&g->parent->lost, true);
        g->renewing = false;
    } else {
        late = now > g->valid_until_ns;
        g->next_renew_ns = now + g->rec.running_ms * CERB_NS_PER_MS / 10;
    }
    g->busy = false;
    cerb__cond_broadcast(&s->idle);
    cerb__mutex_unlock(&s->mu);

    if (st == CERB_OK) {
        cerb__health_ok(c, idx);
    } else if (st == CERB_NOT_OWNER) {
        cerb__health_ok(c, idx);
        CERB_LOG_W("guard %s: the running attempt's claim on %s was lost (taken over or "
                   "deleted); its finish will return LOST", scope, ce->name);
    } else {
        cerb__health_fail(c, idx, "guard renew");
        if (late)
            CERB_LOG_W("guard %s: the claim on %s could not be renewed before its end: another "
                       "attempt may begin", scope, ce->name);
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

/* Take due orphans off the list one at a time and try them; s->mu held
 * (released around each call). Returns the earliest next try. */
static int64_t orphans_run(struct cerb_guard_set *s)
{
    for (;;) {
        int64_t now = cerb_monotime(), next = CERB_DEADLINE_NEVER;
        struct orphan **pp = &s->orphans, *due = NULL;
        for (; *pp; pp = &(*pp)->next) {
            if ((*pp)->next_ns <= now) {
                due = *pp;
                *pp = due->next;
                break;
            }
            if ((*pp)->next_ns < next)
                next = (*pp)->next_ns;
        }
        if (!due)
            return next;
        cerb__mutex_unlock(&s->mu);
        bool done = orphan_try(s, due);
        cerb__mutex_lock(&s->mu);
        if (done) {
            orphan_free(due);
        } else {
            due->next_ns = cerb_monotime() + orphan_step(due);
            due->next = s->orphans;
            s->orphans = due;
        }
        /* One at a time: each may cost an operation timeout on a silent
         * engine, and running claims' renewals come first (renewer_main). */
        return s->stop ? CERB_DEADLINE_NEVER : cerb_monotime();
    }
}

static void *renewer_main(void *arg)
{
    struct cerb_guard_set *s = arg;
    cerb__mutex_lock(&s->mu);
    while (!s->stop) {
        /* Due renewals first: an orphan on a silent engine costs an
         * operation timeout, which must not make live claims lapse. */
        int64_t now = cerb_monotime(), next = CERB_DEADLINE_NEVER;
        struct cerb_guard *due = NULL;
        for (struct cerb_guard *g = s->head; g; g = g->next) {
            if (!g->renewing || g->busy)
                continue;
            if (g->next_renew_ns <= now) {
                due = g;
                break;
            }
            if (g->next_renew_ns < next)
                next = g->next_renew_ns;
        }
        if (due) {
            due->busy = true;
            cerb__mutex_unlock(&s->mu);
            renew_one(s, due);
            cerb__mutex_lock(&s->mu);
            continue;
        }
        int64_t o = orphans_run(s);
        if (s->stop)
            break;
        if (o <= cerb_monotime())
            continue; /* one ran: look at the renewals again */
        s->asleep_until = o < next ? o : next;
        cerb__cond_wait_until(&s->wake, &s->mu, s->asleep_until);
        s->asleep_until = 0;
    }
    cerb__mutex_unlock(&s->mu);
    return NULL;
}

/* Start the renewer if it is not running; s->mu held. */
static cerb_status start_locked(struct cerb_guard_set *s)
{
    if (s->started)
        return CERB_OK;
    int rc = pthread_create(&s->thread, NULL, renewer_main, s);
    if (rc != 0)
        return cerb__error_set(CERB_ENOMEM, "guard: cannot start the renewer: %s", strerror(rc));
    s->started = true;
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
    if (s->stop || start_locked(s) != CERB_OK) {
        cerb__mutex_unlock(&s->mu);
        orphan_free(o);
        return;
    }
    o->next = s->orphans;
    s->orphans = o;
    wake_for(s, o->next_ns);
    cerb__mutex_unlock(&s->mu);
}

cerb_status cerb__guard_track(struct cerb_guard *g, const cerb_grant *grant, bool renew)
{
    struct cerb_guard_set *s = set_of(g->client, true);
    if (!s)
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
    cerb__mutex_lock(&s->mu);
    if (renew && !s->started) {
        int rc = pthread_create(&s->thread, NULL, renewer_main, s);
        if (rc != 0) {
            cerb__mutex_unlock(&s->mu);
            return cerb__error_set(CERB_ENOMEM, "guard: cannot start the renewer: %s",
                                   strerror(rc));
        }
        s->started = true;
    }
    g->prev = NULL;
    g->next = s->head;
    if (s->head)
        s->head->prev = g;
    s->head = g;
    g->renewing = renew;
    g->busy = false;
    g->tracked = true;
    if (renew) {
        schedule(g, grant);
        wake_for(s, g->next_renew_ns);
    }
    cerb__mutex_unlock(&s->mu);
    return CERB_OK;
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
        wake_for(s, g->next_renew_ns);
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
    cerb__mutex_unlock(&s->mu);
    if (s->started)
        pthread_join(s->thread, NULL);
    /* Orphans get one more delete each (not on an engine that failed),
     * then are left to expire. */
    bool silent_o[CERB_MAX_ENGINES] = {false};
    while (s->orphans) {
        struct orphan *o = s->orphans;
        s->orphans = o->next;
        if (!silent_o[o->idx]) {
            struct cerb_client_engine *ce = &c->engines[o->idx];
            cerb_outcome oc;
            cerb_status st = cerb__engine_guard_finish(ce->ops, atomic_load(&ce->e), &o->rec,
                                                       o->succeeded, o->result, o->len,
                                                       o->keep_ms, &oc);
            if (st != CERB_OK && st != CERB_NOT_OWNER)
                silent_o[o->idx] = true;
        }
        orphan_free(o);
    }
    /* The renewer is gone: nothing is busy. End what is left, deleting an
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
    cerb__cond_destroy(&s->wake);
    cerb__cond_destroy(&s->idle);
    cerb__mutex_destroy(&s->mu);
    cerb__free(s);
}
