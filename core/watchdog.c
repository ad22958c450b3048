/*
 * watchdog.c — keeps held locks alive and tells their holders, on time,
 * when they are not.
 *
 * Every hold carries a conservative local deadline, valid_until = the send
 * time of the last request that set its lease + lease × (1 − drift) on the
 * library clock (boot time, clock.c): the server's lease cannot have started
 * before we sent the request, so until then nobody else can hold the name.
 *
 * Two kinds of thread per client share one mutex (wd->mu) and no I/O is done
 * under it:
 *  - the deadline thread does no I/O at all. It sleeps until the earliest
 *    renewal or deadline, marks every hold past its deadline LOST (even one
 *    whose renewal is in flight) and queues its lost callback (notify.c),
 *    and hands due renewals to the renewer of their engine. A frozen server
 *    therefore cannot delay a LOST, on its engine or on another.
 *  - one renewer per engine sends the renewals it was handed, at most
 *    CERB_RENEW_CHUNK per call to an engine that renews in batches (a
 *    few pipelines on Redis), CERB_RENEW_CHUNK_ONE to one that renews a
 *    hold per call; when more are due, those with the earliest deadlines
 *    go first. It applies the answers: OK extends the deadline (VALID, next renewal at
 *    lease/3 after the send), "not owner" is a definitive loss (LOST), any
 *    other error makes the hold SUSPECT, retried with jitter until it
 *    succeeds or the deadline passes. A chunk nobody answered fails the rest
 *    of the engine's due renewals at once, without sending them: with
 *    thousands of holds on a frozen server each round costs one op timeout,
 *    not one per chunk. The renewer also releases the engine's orphans
 *    (acquires whose outcome was unknown), which the deadline thread must
 *    not wait for either.
 * LOST is final: a renewal answered after the hold was declared LOST (by its
 * deadline or by an engine event) does not bring it back. A hold whose
 * renewal is queued or in flight is marked wd_busy; cerb__watchdog_remove
 * withdraws a queued one and waits for one on the wire (wd_sending: one
 * engine call, bounded by the engine's op timeout), so a release is never
 * overtaken by a renewal of the same hold. Nothing waits for a
 * callback, and log lines are formatted under the mutex and written after.
 */
#include "internal_posix.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"

/* Renewals per batch call. A batch's cost is mostly per call, not per
 * hold: a round trip on Redis, and on the SQL engines a statement per
 * pooled connection, each waiting for that connection to finish what it
 * is doing. So the chunk is what sets the renewal rate under load: with
 * 256, 8 threads taking names on a pool of 8 left the renewer about 3 000
 * renewals a second on MariaDB, and 10 000 holds on a 3 s lease ran out
 * (integration_mysql's test_renewals_keep_up lost 2 000 to 4 000). On a
 * frozen server a chunk still costs one request timeout on Redis (one
 * pipeline) and on MySQL (its batch stops at the first statement left
 * unanswered); PostgreSQL's costs one per pooled session, as before. */
#define CERB_RENEW_CHUNK 1024
/* Renewals handed over at once that go one per call (an engine without
 * batches; semaphores and read-write locks everywhere): a renewal falling
 * due meanwhile (a retry of a SUSPECT hold) waits for all of them. */
#define CERB_RENEW_CHUNK_ONE 256
/* Lost holds named in the log per round; the rest are counted. */
#define LOG_NAMES 4

struct renewer {
    struct cerb_watchdog *wd;
    int idx;
    pthread_t thread;
    bool started;
    cerb_cond cond;              /* work handed over, orphans, or stop */
    cerb_renew_item *items;      /* CERB_RENEW_CHUNK of them */
    int64_t *until;              /* their holds' deadlines while scan() fills items */
    size_t n;                    /* items handed over, 0 = idle */
    struct cerb_engine_hold *orphans;   /* wd_next chain; only this thread releases */
    int64_t next_orphan_ns;
};

struct cerb_watchdog {
    cerb_client *c;
    pthread_t thread;
    cerb_mutex mu;
    cerb_cond wake;  /* work may be due earlier than planned, or stop */
    cerb_cond idle;  /* a wd_busy flag was cleared */
    bool stop;
    int64_t next_wake_ns;
    struct cerb_engine_hold *head;
    size_t n;
    struct renewer rn[CERB_MAX_ENGINES];
    bool manual;     /* no threads: cerb__watchdog_step does their work */
};

/* Log lines collected under wd->mu, written after it is released. */
struct pending_log {
    char lost[LOG_NAMES][CERB_ENGINE_NAME_MAX + 300];
    size_t nlost, more_lost;
};

/* Renewal items carry &hold->lk; the hold is found from it by this. */
_Static_assert(offsetof(struct cerb_engine_hold, lk) == 0, "lk must be the first field of cerb_hold");

static int64_t period_ns(const struct cerb_engine_hold *h)
{
    return h->lk.lease_ms * CERB_NS_PER_MS / 3;
}

/* Move a hold to VALID or SUSPECT unless it is LOST: LOST is final. */
static void set_state(struct cerb_engine_hold *h, int to)
{
    int cur = atomic_load(&h->state);
    while (cur != CERB_LOCK_LOST && cur != to &&
           !atomic_compare_exchange_weak(&h->state, &cur, to))
        ;
}

/*
 * Mark h LOST and queue its callback, once. wd->mu held; takes the slot
 * mutex to read the callback (order: wd->mu, then slot->mu; nobody takes
 * wd->mu under a slot mutex). A hold is linked here until its release has
 * taken it away, so its handle is alive.
 */
static void declare_lost(struct cerb_watchdog *wd, struct cerb_engine_hold *h, struct pending_log *pl)
{
    cerb_client *c = wd->c;
    atomic_store(&h->state, CERB_LOCK_LOST);
    if (h->lost_reported)
        return;
    void (*cb)(cerb_lock *, void *) = NULL;
    void *ud = NULL;
    cerb_lock *l = h->owner_handle;
    bool told = true;
    if (l && l->as_hold) {
        /* A hold object: its callback is queued under the slot mutex, so
         * that one set after the loss (cerb_hold_on_lost) is queued once,
         * by whichever comes second. */
        struct cerb_hold *o = l->as_hold;
        cerb__mutex_lock(&h->slot->mu);
        if (l->election)
            told = cerb__election_lost_locked(c, l->election, o);
        else
            told = cerb__hold_tell_locked(c, o);
        cerb__mutex_unlock(&h->slot->mu);
    } else if (l && l->rwlock) {
        told = cerb__rwlock_lost(c, l->rwlock);
    } else {
        if (l && h->slot) {
            cerb__mutex_lock(&h->slot->mu);
            cb = l->lost_cb;
            ud = l->lost_ud;
            cerb__mutex_unlock(&h->slot->mu);
        }
        told = cerb__notify_lost(c, l, cb, ud);
    }
    if (!told)
        return; /* no memory for the event: tried again next round */
    h->lost_reported = true;
    atomic_fetch_add(&c->engines[h->engine_idx].lost, 1);
    if (pl->nlost < LOG_NAMES)
        snprintf(pl->lost[pl->nlost++], sizeof pl->lost[0], "lock \"%s\" lost on engine %s",
                 h->lk.name, c->engines[h->engine_idx].name);
    else
        pl->more_lost++;
}

/*
 * A hold is over (LOST, or past its deadline); wd->mu held. A claim (a hold
 * taken on an engine switched away from, lock.c) has no holder to tell, but
 * it is all that keeps the processes that did not switch (a fresh one on
 * that engine asks nobody) from being granted the name there: once it is
 * gone ("not owner", an expired session, a server that lost its data) or
 * past its deadline, they may be, so the hold it protects is LOST. That
 * engine looking silent from here says nothing about the others: one lost
 * reply, or a renewal chunk failed whole, is enough to look silent while it
 * answers everyone else and expires the claim (cerb_sim seed 707472).
 */
static void hold_over(struct cerb_watchdog *wd, struct cerb_engine_hold *h, struct pending_log *pl)
{
    if (!h->claim_of) {
        declare_lost(wd, h, pl);
        return;
    }
    atomic_store(&h->state, CERB_LOCK_LOST);
    h->lost_reported = true;
    declare_lost(wd, h->claim_of, pl);
}

static void write_log(struct pending_log *pl)
{
    for (size_t i = 0; i < pl->nlost; i++)
        CERB_LOG_W("%s", pl->lost[i]);
    if (pl->more_lost)
        CERB_LOG_W("... and %zu more locks lost", pl->more_lost);
    pl->nlost = pl->more_lost = 0;
}

/* A renewal's answer; wd->mu held. */
static void apply_result(cerb_client *c, struct cerb_engine_hold *h, cerb_status st, const cerb_grant *g,
                         int64_t now)
{
    (void)c;
    if (atomic_load(&h->state) == CERB_LOCK_LOST)
        return; /* told LOST already: final, whatever this answer says */
    if (st == CERB_OK) {
        h->failing_since_ns = 0;
        int64_t until = g->sent_ns ? cerb__grant_deadline(g) : h->valid_until_ns;
        /* A hold is valid no longer than its claims: once a claim's lease
         * ends there, processes that did not switch are granted the name,
         * and a holder paused past it must find its deadline passed. A
         * claim's deadline moves only with its own good renewals. */
        for (struct cerb_engine_hold *k = h->claims; k; k = k->claim_next)
            if (atomic_load(&k->state) != CERB_LOCK_LOST && k->valid_until_ns < until)
                until = k->valid_until_ns;
        h->valid_until_ns = until;
        h->renew_failures = 0;
        /* Space renewals by the shorter of the lease and what the grant
         * gave (a session TTL can be shorter than the lease asked). */
        int64_t period = period_ns(h);
        if (g->ttl_ms > 0 && g->ttl_ms * CERB_NS_PER_MS / 3 < period)
            period = g->ttl_ms * CERB_NS_PER_MS / 3;
        h->next_renew_ns = (g->sent_ns ? g->sent_ns : now) + period;
        /* An engine answering from an older heartbeat (sent_ns well in the
         * past) must not make us renew again at once, in a loop. */
        if (h->next_renew_ns < now + period_ns(h) / 10)
            h->next_renew_ns = now + period_ns(h) / 10;
        h->renew_once = false;
        set_state(h, CERB_LOCK_VALID);
        return;
    }
    if (st == CERB_NOT_OWNER) {
        h->failing_since_ns = 0; /* an answer: a claim is gone, not dormant */
        atomic_store(&h->state, CERB_LOCK_LOST);
        return;
    }
    /* Transient: suspect, and try again soon with jitter. */
    if (h->failing_since_ns == 0)
        h->failing_since_ns = now;
    h->renew_failures++;
    set_state(h, CERB_LOCK_SUSPECT);
    int64_t base = h->lk.lease_ms / 10;
    if (base > 1000)
        base = 1000;
    if (base < 10)
        base = 10;
    h->next_renew_ns = now + (base / 2 + (int64_t)cerb__rand_below((uint64_t)base)) * CERB_NS_PER_MS;
}

static bool renews(const struct cerb_engine_hold *h)
{
    return h->renew || h->renew_once;
}

/* Renewals due by `now` get this much slack so that neighbours share a
 * batch; not a hand-off lease's extension (renew_once), which lock.c puts
 * a little after the grant on purpose: with the slack it ran at once, and
 * the holder's release waited for it. */
static bool renewal_due(const struct cerb_engine_hold *h, int64_t now)
{
    int64_t slack = h->renew_once ? 0 : period_ns(h) / 20;
    return renews(h) && h->next_renew_ns <= now + slack;
}

/*
 * Try to release every queued orphan of rn's engine once; keep those the
 * engine did not answer for, until their lease must have run out. Their
 * token is unique to them, so the server-side compare makes this safe
 * whatever happened meanwhile. wd->mu held on entry and exit.
 */
static void release_orphans(struct renewer *rn)
{
    struct cerb_watchdog *wd = rn->wd;
    struct cerb_engine_hold *list = rn->orphans, *keep = NULL;
    rn->orphans = NULL;
    cerb__mutex_unlock(&wd->mu);
    struct cerb_client_engine *ce = &wd->c->engines[rn->idx];
    while (list) {
        struct cerb_engine_hold *h = list;
        list = h->wd_next;
        cerb_status st = cerb__engine_release(ce->ops, ce->e, &h->lk);
        /* An answer like any other: the gate of an engine switched from
         * counts its silence from the last one (health.c). Lock-free. */
        if (st == CERB_OK || st == CERB_NOT_OWNER)
            cerb__health_ok(wd->c, rn->idx);
        if (st == CERB_OK || st == CERB_NOT_OWNER || cerb_monotime() >= h->orphan_until_ns) {
            if (st == CERB_OK)
                CERB_LOG_I("released \"%s\" on %s: an acquire had landed after its reply was lost",
                           h->lk.name, ce->name);
            cerb__free((char *)h->lk.name);
            cerb__engine_hold_free(h);
        } else {
            h->wd_next = keep;
            keep = h;
        }
    }
    cerb__mutex_lock(&wd->mu);
    while (keep) {
        struct cerb_engine_hold *h = keep;
        keep = h->wd_next;
        h->wd_next = rn->orphans;
        rn->orphans = h;
    }
    rn->next_orphan_ns = cerb_monotime() + 200 * CERB_NS_PER_MS;
}

void cerb__watchdog_orphan(cerb_client *c, struct cerb_engine_hold *h)
{
    struct cerb_watchdog *wd = c->wd;
    int64_t lease = h->lk.lease_ms;
    h->orphan_until_ns = cerb_monotime() + (lease + lease * CERB_DRIFT_PERMILLE / 1000 + 1000) *
                                               CERB_NS_PER_MS;
    /* lk.name points into the slot, which may go away: own a copy. */
    char *name = cerb__strdup(h->lk.name);
    if (!name) {
        cerb__engine_hold_free(h);
        return;
    }
    h->lk.name = name;
    h->slot = NULL;
    struct renewer *rn = &wd->rn[h->engine_idx];
    cerb__mutex_lock(&wd->mu);
    h->wd_next = rn->orphans;
    rn->orphans = h;
    rn->next_orphan_ns = cerb_monotime();
    cerb__cond_signal(&rn->cond);
    cerb__mutex_unlock(&wd->mu);
}

/*
 * A chunk of rn's engine got no answer at all: the server is not answering
 * now, so every other renewal due there fails at once too (SUSPECT, retried
 * with jitter) instead of costing an op timeout per chunk. wd->mu held.
 */
static void fail_due(struct renewer *rn, int64_t now)
{
    for (struct cerb_engine_hold *h = rn->wd->head; h; h = h->wd_next)
        if (h->engine_idx == rn->idx && !h->wd_busy && !h->lost_reported && renewal_due(h, now))
            apply_result(rn->wd->c, h, CERB_UNAVAILABLE, NULL, now);
}

/* One renewal's answer back under wd->mu: apply it, report a loss, let
 * go of the hold. */
static void settle_item(struct renewer *rn, cerb_renew_item *it, int64_t t, struct pending_log *pl)
{
    struct cerb_engine_hold *h = (struct cerb_engine_hold *)it->lk;
    apply_result(rn->wd->c, h, it->st, &it->grant, t);
    if (atomic_load(&h->state) == CERB_LOCK_LOST || t >= h->valid_until_ns)
        hold_over(rn->wd, h, pl);
    h->wd_busy = false;
    h->wd_sending = false;
    it->lk = NULL;
}

/*
 * Send the chunk handed over; wd->mu held on entry and exit. A batching
 * engine gets it in one call (one exchange: one op timeout at most). An
 * engine without batches gets one call per hold, and a hold is "sending"
 * only during its own call: a release of a hold still queued withdraws it
 * (cerb__watchdog_remove) instead of waiting for the holds before it. The
 * first renewal nobody answered fails the rest unsent.
 */
/* Whether the engine's batch renews this hold (a queued primitive's are
 * renewed one by one, engine.h; so are all of an instance whose
 * configuration takes CERB_CAP_BATCH_RENEW away, e.g. redis redlock: its
 * renewal is a fan-out). An engine with renew_batch is batched whether or
 * not its table claims the cap (the cap says the batch is cheaper). */
static bool batches(const struct cerb_client_engine *ce)
{
    unsigned removed = ce->ops->caps & ~cerb__engine_caps(ce->ops, atomic_load(&ce->e));
    return ce->ops->renew_batch && !(removed & CERB_CAP_BATCH_RENEW);
}

/* Renewed one per call even where the engine batches (their members'
 * renewal is the queue method's). */
static bool alone(const cerb_engine_lock *lk)
{
    return lk->prim == CERB_PRIM_SEMAPHORE || lk->prim == CERB_PRIM_RWLOCK;
}

static bool batched(const struct cerb_client_engine *ce, const cerb_renew_item *it)
{
    return batches(ce) && !alone(it->lk);
}

static void renew_chunk(struct renewer *rn)
{
    struct cerb_watchdog *wd = rn->wd;
    cerb_client *c = wd->c;
    struct cerb_client_engine *ce = &c->engines[rn->idx];
    struct pending_log pl = {.nlost = 0};
    size_t answered = 0, failed = 0;
    cerb_status fail_st = CERB_OK;
    char why[CERB_ERROR_MAX] = "";

    /* The batched holds first, in one call (one exchange: one op timeout
     * at most), their results applied before the others are sent; then
     * the rest one by one. Withdrawn items (lk NULL) are dropped. */
    size_t n = 0, m = 0;
    for (size_t k = 0; k < rn->n; k++)
        if (rn->items[k].lk)
            rn->items[n++] = rn->items[k];
    rn->n = n;
    for (size_t k = 0; k < n; k++) {
        if (!batched(ce, &rn->items[k]))
            continue;
        cerb_renew_item it = rn->items[k]; /* stable: the batch keeps its order */
        memmove(&rn->items[m + 1], &rn->items[m], (k - m) * sizeof it);
        rn->items[m++] = it;
    }
    if (m > 0) {
        for (size_t k = 0; k < m; k++)
            ((struct cerb_engine_hold *)rn->items[k].lk)->wd_sending = true;
        cerb__mutex_unlock(&wd->mu);
        cerb__engine_renew_batch(ce->ops, ce->e, rn->items, m);
        for (size_t k = 0; k < m; k++) {
            cerb_status st = rn->items[k].st;
            if (st == CERB_OK || st == CERB_NOT_OWNER) {
                answered++;
            } else if (failed++ == 0) {
                fail_st = st;
                cerb__error_copy(why, sizeof why);
            }
        }
        cerb__mutex_lock(&wd->mu);
        int64_t t = cerb_monotime();
        for (size_t k = 0; k < m; k++)
            settle_item(rn, &rn->items[k], t, &pl);
        cerb__cond_broadcast(&wd->idle); /* releases waiting for these */
    }
    /* The rest go unsent only when the server answered nothing: a batch
     * with answers (a Cluster with one node down) says it is there. */
    cerb_status skip_st = answered == 0 ? fail_st : CERB_OK;
    for (size_t k = m; k < rn->n; k++) {
        cerb_renew_item *it = &rn->items[k];
        if (!it->lk)
            continue; /* withdrawn by a release */
        if (skip_st != CERB_OK) {
            it->st = skip_st; /* not sent: the server is not answering */
            failed++;
        } else {
            ((struct cerb_engine_hold *)it->lk)->wd_sending = true;
            cerb__mutex_unlock(&wd->mu);
            it->st = cerb__engine_renew(ce->ops, ce->e, it->lk, &it->grant);
            if (it->st == CERB_OK || it->st == CERB_NOT_OWNER) {
                answered++;
            } else {
                failed++;
                fail_st = skip_st = it->st;
                cerb__error_copy(why, sizeof why);
            }
            cerb__mutex_lock(&wd->mu);
        }
        settle_item(rn, it, cerb_monotime(), &pl);
        cerb__cond_broadcast(&wd->idle);
    }
    if (answered == 0 && failed > 0)
        fail_due(rn, cerb_monotime());
    rn->n = 0;
    cerb__cond_broadcast(&wd->idle);
    cerb__cond_signal(&wd->wake); /* more may be due on this engine */

    /* Outside the mutex: the breaker (which may switch engines) and the
     * log sink. */
    cerb__mutex_unlock(&wd->mu);
    if (answered)
        cerb__health_ok(c, rn->idx);
    if (failed) {
        /* One failure per chunk for the breaker: the server was asked once. */
        cerb__error_set(fail_st, "%s", why);
        cerb__health_fail(c, rn->idx, "renew");
        CERB_LOG_W("renewal of %zu lock(s) on %s failed (%s): %s", failed, ce->name,
                   cerb_status_name(fail_st), why);
    }
    write_log(&pl);
    cerb__mutex_lock(&wd->mu);
}

static void *renewer_main(void *arg)
{
    struct renewer *rn = arg;
    struct cerb_watchdog *wd = rn->wd;
    cerb__mutex_lock(&wd->mu);
    while (!wd->stop) {
        if (rn->n) {
            renew_chunk(rn);
            continue;
        }
        int64_t until = CERB_DEADLINE_NEVER;
        if (rn->orphans) {
            if (cerb_monotime() >= rn->next_orphan_ns) {
                release_orphans(rn);
                continue;
            }
            until = rn->next_orphan_ns;
        }
        cerb__cond_wait_until(&rn->cond, &wd->mu, until);
    }
    cerb__mutex_unlock(&wd->mu);
    return NULL;
}

/* Whether item a of rn's chunk goes after item b: a later deadline, or
 * the same one (none at all, on a session) and a later renewal time. */
static bool chunk_after(const struct renewer *rn, size_t a, size_t b)
{
    if (rn->until[a] != rn->until[b])
        return rn->until[a] > rn->until[b];
    return ((const struct cerb_engine_hold *)rn->items[a].lk)->next_renew_ns >
           ((const struct cerb_engine_hold *)rn->items[b].lk)->next_renew_ns;
}

static void chunk_swap(struct renewer *rn, size_t a, size_t b)
{
    cerb_renew_item it = rn->items[a];
    int64_t u = rn->until[a];
    rn->items[a] = rn->items[b], rn->until[a] = rn->until[b];
    rn->items[b] = it, rn->until[b] = u;
}

/*
 * Offer a due renewal to rn's next chunk, kept as a max-heap on deadlines:
 * when more are due than a chunk takes, those whose deadlines come first
 * go. Taken in list order instead (newest hold first), the same holds
 * were passed over round after round while a backlog lasted, and ran out
 * while the renewer kept up on average (integration_mysql's
 * test_renewals_keep_up: 146 of 10 000 lost with chunks of 1 024).
 */
static void chunk_offer(struct renewer *rn, size_t cap, struct cerb_engine_hold *h, int64_t until)
{
    size_t i;
    if (rn->n < cap) {
        i = rn->n++;
        rn->items[i].lk = &h->lk;
        rn->until[i] = until;
        for (; i > 0 && chunk_after(rn, i, (i - 1) / 2); i = (i - 1) / 2)
            chunk_swap(rn, i, (i - 1) / 2);
        return;
    }
    if (until > rn->until[0] ||
        (until == rn->until[0] &&
         h->next_renew_ns >= ((struct cerb_engine_hold *)rn->items[0].lk)->next_renew_ns))
        return; /* the next round takes it */
    rn->items[0].lk = &h->lk;
    rn->until[0] = until;
    for (i = 0;;) {
        size_t m = i, l = 2 * i + 1, r = l + 1;
        if (l < rn->n && chunk_after(rn, l, m))
            m = l;
        if (r < rn->n && chunk_after(rn, r, m))
            m = r;
        if (m == i)
            break;
        chunk_swap(rn, i, m);
        i = m;
    }
}

/*
 * The deadline thread's look at every hold, at `now`: losses marked and
 * queued, due renewals handed to their renewers. Returns false when losses
 * were logged (wd->mu was let go: the list may have changed, look again);
 * else *next_ns is when something is next due. wd->mu held on entry and
 * exit.
 */
static bool scan(struct cerb_watchdog *wd, int64_t now, int64_t *next_ns)
{
    int64_t next = now + 1000 * CERB_NS_PER_MS;
    struct pending_log pl = {.nlost = 0};
    bool handed[CERB_MAX_ENGINES] = {false}, open[CERB_MAX_ENGINES] = {false};
    bool bat[CERB_MAX_ENGINES] = {false};
    size_t cap[CERB_MAX_ENGINES] = {0}, singles[CERB_MAX_ENGINES] = {0};
    /* A renewer still busy with its last chunk takes a new one when it is
     * done (it wakes us). */
    for (size_t i = 0; i < wd->c->n_engines; i++) {
        open[i] = wd->rn[i].started && wd->rn[i].n == 0;
        bat[i] = batches(&wd->c->engines[i]);
        cap[i] = bat[i] ? CERB_RENEW_CHUNK : CERB_RENEW_CHUNK_ONE;
    }

    for (struct cerb_engine_hold *h = wd->head; h; h = h->wd_next) {
        if (h->lost_reported)
            continue;
        /* A hold that relies on closure records instead of claims is valid
         * no longer than they are being read (closure.c): a bound that moves
         * with every reading, so it is applied here, not stored. */
        int64_t until = cerb__hold_until(wd->c, h);
        if (atomic_load(&h->state) == CERB_LOCK_LOST || now >= until) {
            hold_over(wd, h, &pl);
            if (!h->lost_reported && now + 10 * CERB_NS_PER_MS < next)
                next = now + 10 * CERB_NS_PER_MS; /* no memory: retry soon */
            continue;
        }
        if (until < next)
            next = until;
        if (!renews(h) || h->wd_busy)
            continue;
        if (h->claim_of && atomic_load(&h->claim_of->state) == CERB_LOCK_LOST)
            continue; /* its hold is over: let the claim lapse */
        struct renewer *rn = &wd->rn[h->engine_idx];
        if (renewal_due(h, now)) {
            int i = h->engine_idx;
            bool single = !bat[i] || alone(&h->lk);
            /* Singles are counted as offered, not as kept: a chunk may
             * end with fewer than it could take, never with more. */
            if (open[i] && (!single || singles[i] < CERB_RENEW_CHUNK_ONE)) {
                chunk_offer(rn, cap[i], h, until);
                singles[i] += single;
                handed[i] = true;
            }
            continue;
        }
        if (h->next_renew_ns < next)
            next = h->next_renew_ns;
    }
    for (size_t i = 0; i < wd->c->n_engines; i++) {
        if (!handed[i])
            continue;
        struct renewer *rn = &wd->rn[i];
        for (size_t k = 0; k < rn->n; k++)
            ((struct cerb_engine_hold *)rn->items[k].lk)->wd_busy = true;
        cerb__cond_signal(&rn->cond);
    }
    *next_ns = next;
    if (pl.nlost) {
        cerb__mutex_unlock(&wd->mu);
        write_log(&pl);
        cerb__mutex_lock(&wd->mu);
        return false;
    }
    return true;
}

/* One round of the deadline thread; wd->mu held on entry and exit. */
static void cycle(struct cerb_watchdog *wd)
{
    int64_t next;
    if (!scan(wd, cerb_monotime(), &next))
        return; /* the list may have changed meanwhile: look again */
    wd->next_wake_ns = next;
    cerb__cond_wait_until(&wd->wake, &wd->mu, next);
    wd->next_wake_ns = 0;
}

/*
 * A manual client's deadline thread alone: the scan (losses marked and
 * queued, due renewals handed over, no I/O) at the current time. The
 * simulation runs it while the same client's renewals are on the wire, as
 * the threads overlap. Returns when it wants to look again.
 */
int64_t cerb__watchdog_deadlines(cerb_client *c)
{
    struct cerb_watchdog *wd = c->wd;
    if (!wd)
        return CERB_DEADLINE_NEVER;
    int64_t next = CERB_DEADLINE_NEVER;
    cerb__mutex_lock(&wd->mu);
    while (!scan(wd, cerb_monotime(), &next))
        ;
    cerb__mutex_unlock(&wd->mu);
    return next;
}

/*
 * A manual client's watchdog (no threads): what the deadline thread and the
 * renewers would do by now, done here on the caller's thread — losses,
 * renewals due (sent and applied), orphans due. Returns when it wants to
 * run next.
 */
int64_t cerb__watchdog_step(cerb_client *c)
{
    struct cerb_watchdog *wd = c->wd;
    if (!wd)
        return CERB_DEADLINE_NEVER;
    int64_t next = CERB_DEADLINE_NEVER;
    cerb__mutex_lock(&wd->mu);
    /* Bounded: each pass either sends a chunk per engine or finds nothing
     * due; answers may make more due (a failed chunk fails the rest). */
    for (int pass = 0; pass < 16; pass++) {
        while (!scan(wd, cerb_monotime(), &next))
            ;
        bool sent = false;
        for (size_t i = 0; i < c->n_engines; i++) {
            struct renewer *rn = &wd->rn[i];
            if (rn->n) {
                renew_chunk(rn);
                sent = true;
            }
            if (rn->orphans && cerb_monotime() >= rn->next_orphan_ns) {
                release_orphans(rn);
                sent = true;
            }
        }
        if (!sent)
            break;
    }
    for (size_t i = 0; i < c->n_engines; i++)
        if (wd->rn[i].orphans && wd->rn[i].next_orphan_ns < next)
            next = wd->rn[i].next_orphan_ns;
    cerb__mutex_unlock(&wd->mu);
    return next;
}

static void *wd_main(void *arg)
{
    struct cerb_watchdog *wd = arg;
    cerb__mutex_lock(&wd->mu);
    while (!wd->stop)
        cycle(wd);
    cerb__mutex_unlock(&wd->mu);
    return NULL;
}

static void free_orphans(struct renewer *rn)
{
    while (rn->orphans) { /* their leases will expire by themselves */
        struct cerb_engine_hold *h = rn->orphans;
        rn->orphans = h->wd_next;
        cerb__free((char *)h->lk.name);
        cerb__engine_hold_free(h);
    }
}

static void join_all(struct cerb_watchdog *wd, bool main_started)
{
    cerb__mutex_lock(&wd->mu);
    wd->stop = true;
    cerb__cond_signal(&wd->wake);
    for (size_t i = 0; i < CERB_MAX_ENGINES; i++)
        if (wd->rn[i].started)
            cerb__cond_signal(&wd->rn[i].cond);
    cerb__mutex_unlock(&wd->mu);
    if (main_started && !wd->manual)
        pthread_join(wd->thread, NULL);
    for (size_t i = 0; i < CERB_MAX_ENGINES; i++) {
        struct renewer *rn = &wd->rn[i];
        if (rn->started && !wd->manual)
            pthread_join(rn->thread, NULL);
        free_orphans(rn);
        cerb__free(rn->items);
        cerb__free(rn->until);
        cerb__cond_destroy(&rn->cond);
    }
    cerb__cond_destroy(&wd->wake);
    cerb__cond_destroy(&wd->idle);
    cerb__mutex_destroy(&wd->mu);
    cerb__free(wd);
}

cerb_status cerb__watchdog_start(cerb_client *c)
{
    struct cerb_watchdog *wd = cerb__calloc(1, sizeof *wd);
    if (!wd)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    wd->c = c;
    wd->manual = c->manual;
    cerb__mutex_init(&wd->mu);
    cerb__cond_init(&wd->wake);
    cerb__cond_init(&wd->idle);
    for (size_t i = 0; i < CERB_MAX_ENGINES; i++) {
        wd->rn[i].wd = wd;
        wd->rn[i].idx = (int)i;
        cerb__cond_init(&wd->rn[i].cond);
    }
    for (size_t i = 0; i < c->n_engines; i++) {
        wd->rn[i].items = cerb__calloc(CERB_RENEW_CHUNK, sizeof *wd->rn[i].items);
        wd->rn[i].until = cerb__calloc(CERB_RENEW_CHUNK, sizeof *wd->rn[i].until);
        if (!wd->rn[i].items || !wd->rn[i].until) {
            join_all(wd, false);
            return cerb__error_set(CERB_ENOMEM, "out of memory");
        }
        if (!c->manual &&
            pthread_create(&wd->rn[i].thread, NULL, renewer_main, &wd->rn[i]) != 0) {
            join_all(wd, false);
            return cerb__error_set(CERB_ENOMEM, "cannot start the renewal threads");
        }
        wd->rn[i].started = true;
    }
    if (!c->manual && pthread_create(&wd->thread, NULL, wd_main, wd) != 0) {
        join_all(wd, false);
        return cerb__error_set(CERB_ENOMEM, "cannot start the renewal thread");
    }
    c->wd = wd;
    return CERB_OK;
}

void cerb__watchdog_stop(cerb_client *c)
{
    struct cerb_watchdog *wd = c->wd;
    if (!wd)
        return;
    /* The renewers finish the chunk they are sending (one op timeout);
     * the deadline thread does no I/O. */
    cerb__mutex_lock(&wd->mu);
    for (struct cerb_engine_hold *h = wd->head; h; h = h->wd_next)
        h->wd_linked = false;
    cerb__mutex_unlock(&wd->mu);
    c->wd = NULL;
    join_all(wd, true);
}

void cerb__watchdog_add(cerb_client *c, struct cerb_engine_hold *h)
{
    struct cerb_watchdog *wd = c->wd;
    cerb__mutex_lock(&wd->mu);
    h->wd_prev = NULL;
    h->wd_next = wd->head;
    if (wd->head)
        wd->head->wd_prev = h;
    wd->head = h;
    wd->n++;
    h->wd_linked = true;
    /* Wake the thread only if this hold needs it before its planned wake:
     * no syscall on the common path. */
    int64_t until = cerb__hold_until(c, h);
    int64_t due = renews(h) ? h->next_renew_ns : until;
    if (until < due)
        due = until;
    if (wd->next_wake_ns == 0 || due < wd->next_wake_ns)
        cerb__cond_signal(&wd->wake);
    cerb__mutex_unlock(&wd->mu);
}

void cerb__watchdog_remove(cerb_client *c, struct cerb_engine_hold *h)
{
    struct cerb_watchdog *wd = c->wd;
    if (!wd)
        return;
    cerb__mutex_lock(&wd->mu);
    while (h->wd_busy) {
        if (h->wd_sending) { /* on the wire: bounded by the op timeout */
            cerb__cond_wait(&wd->idle, &wd->mu);
            continue;
        }
        /* Only queued: withdraw it, the renewer skips it. */
        struct renewer *rn = &wd->rn[h->engine_idx];
        for (size_t k = 0; k < rn->n; k++)
            if (rn->items[k].lk == &h->lk)
                rn->items[k].lk = NULL;
        h->wd_busy = false;
    }
    if (h->wd_linked) {
        if (h->wd_prev)
            h->wd_prev->wd_next = h->wd_next;
        else
            wd->head = h->wd_next;
        if (h->wd_next)
            h->wd_next->wd_prev = h->wd_prev;
        h->wd_linked = false;
        wd->n--;
    }
    cerb__mutex_unlock(&wd->mu);
}

void cerb__watchdog_event(void *ud, cerb_engine_event ev, const char *name, const char *token)
{
    struct cerb_client_engine *ce = ud;
    struct cerb_watchdog *wd = ce->client->wd;
    if (!wd)
        return;
    cerb__mutex_lock(&wd->mu);
    for (struct cerb_engine_hold *h = wd->head; h; h = h->wd_next) {
        if (h->engine_idx != ce->idx)
            continue;
        if (name && strcmp(name, h->lk.name) != 0)
            continue;
        if (token && strcmp(token, h->lk.token) != 0)
            continue;
        /* Compare-and-set, never a blind store: LOST is final, and a
         * renewal answering meanwhile must not turn it back. */
        int cur = ev == CERB_EV_SUSPECT ? CERB_LOCK_VALID : CERB_LOCK_SUSPECT;
        if (ev == CERB_EV_LOST)
            atomic_store(&h->state, CERB_LOCK_LOST);
        else if (ev == CERB_EV_SUSPECT)
            atomic_compare_exchange_strong(&h->state, &cur, CERB_LOCK_SUSPECT);
        else if (ev == CERB_EV_VALID)
            atomic_compare_exchange_strong(&h->state, &cur, CERB_LOCK_VALID);
    }
    if (ev == CERB_EV_LOST)
        cerb__cond_signal(&wd->wake);
    cerb__mutex_unlock(&wd->mu);
}

/* The conservative local end of a grant (the engine's TTL less drift,
 * from the send of the request that set it); NEVER when it has no TTL. */
int64_t cerb__grant_deadline(const cerb_grant *g)
{
    if (g->ttl_ms <= 0)
        return CERB_DEADLINE_NEVER;
    int64_t keep_ms = g->ttl_ms - g->ttl_ms * CERB_DRIFT_PERMILLE / 1000 - CERB_DRIFT_FIXED_MS;
    if (keep_ms < 0)
        keep_ms = 0;
    return g->sent_ns + keep_ms * CERB_NS_PER_MS;
}
