/*
 * watchdog.c — one background thread per client that keeps held locks alive
 * and tells their holders when they are not.
 *
 * Every hold carries a conservative local deadline, valid_until = the send
 * time of the last request that set its lease + lease × (1 − drift) on the
 * monotonic clock: the server's lease cannot have started before we sent
 * the request, so until then nobody else can hold the name. The thread
 * sleeps until the earliest renewal or deadline, then:
 *   - renews every hold due within the next few percent of its period, in
 *     one batch per engine (one pipelined round trip on Redis), each at
 *     lease/3 after its last good renewal;
 *   - a renewal answered "not owner" is a definitive loss: LOST at once;
 *   - a renewal that failed (I/O, timeout) makes the hold SUSPECT and is
 *     retried with jitter until it succeeds (VALID again) or the deadline
 *     passes (LOST);
 *   - a hold without renewal simply becomes LOST at its deadline.
 * The lost callback is called exactly once per hold, outside every lock.
 * A hold being renewed or reported is marked wd_busy; cerb__watchdog_remove
 * waits for that flag to clear, which is how a release is guaranteed never
 * to be overtaken by a renewal of the same hold.
 */
#include "internal_posix.h"

#include <stddef.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"

struct cerb_watchdog {
    cerb_client *c;
    pthread_t thread;
    cerb_mutex mu;
    cerb_cond wake;  /* work may be due earlier than planned, or stop */
    cerb_cond idle;  /* a wd_busy flag was cleared */
    bool stop;
    int64_t next_wake_ns;
    struct cerb_hold *head;
    size_t n;
    struct cerb_hold *orphans;  /* wd_next chain; only this thread releases */
    int64_t next_orphan_ns;
    cerb_renew_item *items; /* scratch for one cycle */
    struct cerb_hold **lost; /* scratch: holds to report */
    size_t cap;
};

/* Renewal items carry &hold->lk; the hold is found from it by this. */
_Static_assert(offsetof(struct cerb_hold, lk) == 0, "lk must be the first field of cerb_hold");

static int64_t period_ns(const struct cerb_hold *h)
{
    return h->lk.lease_ms * CERB_NS_PER_MS / 3;
}

static void report_lost(cerb_client *c, struct cerb_hold *h)
{
    struct cerb_slot *s = h->slot;
    void (*cb)(cerb_lock *, void *) = NULL;
    void *ud = NULL;
    cerb_lock *l = h->owner_handle;

    atomic_fetch_add(&c->engines[h->engine_idx].lost, 1);
    CERB_LOG_W("lock \"%s\" lost on engine %s", s->name, c->engines[h->engine_idx].name);
    cerb__mutex_lock(&s->mu);
    if (l) {
        cb = l->lost_cb;
        ud = l->lost_ud;
    }
    cerb__mutex_unlock(&s->mu);
    if (cb)
        cb(l, ud);
}

static bool grow(struct cerb_watchdog *wd, size_t need)
{
    if (need <= wd->cap)
        return true;
    size_t cap = wd->cap ? wd->cap : 64;
    while (cap < need)
        cap *= 2;
    cerb_renew_item *it = cerb__realloc(wd->items, cap * sizeof *it);
    if (!it)
        return false;
    wd->items = it;
    struct cerb_hold **lo = cerb__realloc(wd->lost, cap * sizeof *lo);
    if (!lo)
        return false;
    wd->lost = lo;
    wd->cap = cap;
    return true;
}

static void apply_result(struct cerb_hold *h, cerb_status st, const cerb_grant *g, int64_t now)
{
    if (st == CERB_OK) {
        int64_t until = g->sent_ns ? cerb__grant_deadline(g) : h->valid_until_ns;
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
        atomic_store(&h->state, CERB_LOCK_VALID);
        return;
    }
    if (st == CERB_NOT_OWNER) {
        atomic_store(&h->state, CERB_LOCK_LOST);
        return;
    }
    /* Transient: suspect, and try again soon with jitter. */
    h->renew_failures++;
    atomic_store(&h->state, CERB_LOCK_SUSPECT);
    int64_t base = h->lk.lease_ms / 10;
    if (base > 1000)
        base = 1000;
    if (base < 10)
        base = 10;
    h->next_renew_ns = now + (base / 2 + (int64_t)cerb__rand_below((uint64_t)base)) * CERB_NS_PER_MS;
    CERB_LOG_W("renewal of \"%s\" failed (%s): %s", h->lk.name, cerb_status_name(st),
               cerb_last_error());
}

/*
 * Try to release every queued orphan once, outside the mutex; keep those
 * whose engine did not answer, until their lease must have run out. Their
 * token is unique to them, so the server-side compare makes this safe
 * whatever happened meanwhile. wd->mu held on entry and exit.
 */
static void release_orphans(struct cerb_watchdog *wd)
{
    struct cerb_hold *list = wd->orphans, *keep = NULL;
    wd->orphans = NULL;
    cerb__mutex_unlock(&wd->mu);
    while (list) {
        struct cerb_hold *h = list;
        list = h->wd_next;
        struct cerb_client_engine *ce = &wd->c->engines[h->engine_idx];
        cerb_status st = cerb__engine_release(ce->ops, ce->e, &h->lk);
        if (st == CERB_OK || st == CERB_NOT_OWNER || cerb_monotime() >= h->orphan_until_ns) {
            if (st == CERB_OK)
                CERB_LOG_I("released \"%s\" on %s: an acquire had landed after its reply was lost",
                           h->lk.name, ce->name);
            cerb__free((char *)h->lk.name);
            cerb__free(h->lk.priv);
            cerb__free(h);
        } else {
            h->wd_next = keep;
            keep = h;
        }
    }
    cerb__mutex_lock(&wd->mu);
    while (keep) {
        struct cerb_hold *h = keep;
        keep = h->wd_next;
        h->wd_next = wd->orphans;
        wd->orphans = h;
    }
    wd->next_orphan_ns = cerb_monotime() + 200 * CERB_NS_PER_MS;
}

void cerb__watchdog_orphan(cerb_client *c, struct cerb_hold *h)
{
    struct cerb_watchdog *wd = c->wd;
    int64_t lease = h->lk.lease_ms;
    h->orphan_until_ns = cerb_monotime() + (lease + lease * CERB_DRIFT_PERMILLE / 1000 + 1000) *
                                               CERB_NS_PER_MS;
    /* lk.name points into the slot, which may go away: own a copy. */
    char *name = cerb__strdup(h->lk.name);
    if (!name) {
        cerb__free(h->lk.priv);
        cerb__free(h);
        return;
    }
    h->lk.name = name;
    h->slot = NULL;
    cerb__mutex_lock(&wd->mu);
    h->wd_next = wd->orphans;
    wd->orphans = h;
    if (wd->next_orphan_ns == 0 || wd->next_orphan_ns > cerb_monotime())
        wd->next_orphan_ns = cerb_monotime();
    cerb__cond_signal(&wd->wake);
    cerb__mutex_unlock(&wd->mu);
}

/* One cycle; wd->mu held on entry and exit. */
static void cycle(struct cerb_watchdog *wd)
{
    cerb_client *c = wd->c;
    int64_t now = cerb_monotime();
    int64_t next = now + 1000 * CERB_NS_PER_MS;
    size_t nrenew = 0, nlost = 0;

    if (wd->orphans && now >= wd->next_orphan_ns) {
        release_orphans(wd);
        return;
    }
    if (!grow(wd, wd->n)) {
        cerb__cond_wait_until(&wd->wake, &wd->mu, now + 10 * CERB_NS_PER_MS);
        return;
    }
    for (struct cerb_hold *h = wd->head; h; h = h->wd_next) {
        if (h->lost_reported)
            continue;
        int st = atomic_load(&h->state);
        if (st == CERB_LOCK_LOST || now >= h->valid_until_ns) {
            atomic_store(&h->state, CERB_LOCK_LOST);
            h->lost_reported = true;
            h->wd_busy = true;
            wd->lost[nlost++] = h;
            continue;
        }
        /* Renew a little early so neighbours share a batch. */
        bool renews = h->renew || h->renew_once;
        if (renews && h->next_renew_ns <= now + period_ns(h) / 20) {
            h->wd_busy = true;
            wd->items[nrenew].lk = &h->lk;
            nrenew++;
            continue;
        }
        if (renews && h->next_renew_ns < next)
            next = h->next_renew_ns;
        if (h->valid_until_ns < next)
            next = h->valid_until_ns;
    }
    if (wd->orphans && wd->next_orphan_ns < next)
        next = wd->next_orphan_ns;
    if (nrenew == 0 && nlost == 0) {
        wd->next_wake_ns = next;
        cerb__cond_wait_until(&wd->wake, &wd->mu, next);
        wd->next_wake_ns = 0;
        return;
    }
    cerb__mutex_unlock(&wd->mu);

    /* Batch per engine: items are grouped by a stable partition. */
    for (size_t i = 0; i < nrenew;) {
        struct cerb_hold *hi = (struct cerb_hold *)wd->items[i].lk;
        int idx = hi->engine_idx;
        size_t j = i + 1;
        for (size_t k = i + 1; k < nrenew; k++) {
            struct cerb_hold *hk = (struct cerb_hold *)wd->items[k].lk;
            if (hk->engine_idx == idx) {
                cerb_renew_item t = wd->items[j];
                wd->items[j] = wd->items[k];
                wd->items[k] = t;
                j++;
            }
        }
        struct cerb_client_engine *ce = &c->engines[idx];
        cerb__engine_renew_batch(ce->ops, ce->e, wd->items + i, j - i);
        int64_t t = cerb_monotime();
        for (size_t k = i; k < j; k++) {
            struct cerb_hold *h = (struct cerb_hold *)wd->items[k].lk;
            if (wd->items[k].st == CERB_OK)
                cerb__health_ok(c, idx);
            else if (wd->items[k].st != CERB_NOT_OWNER)
                cerb__health_fail(c, idx, "renew");
            apply_result(h, wd->items[k].st, &wd->items[k].grant, t);
            if (atomic_load(&h->state) == CERB_LOCK_LOST ||
                cerb_monotime() >= h->valid_until_ns) {
                atomic_store(&h->state, CERB_LOCK_LOST);
                h->lost_reported = true;
                wd->lost[nlost++] = h;
            }
        }
        i = j;
    }
    for (size_t k = 0; k < nlost; k++)
        report_lost(c, wd->lost[k]);

    cerb__mutex_lock(&wd->mu);
    for (size_t k = 0; k < nrenew; k++)
        ((struct cerb_hold *)wd->items[k].lk)->wd_busy = false;
    for (size_t k = 0; k < nlost; k++)
        wd->lost[k]->wd_busy = false;
    cerb__cond_broadcast(&wd->idle);
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

cerb_status cerb__watchdog_start(cerb_client *c)
{
    struct cerb_watchdog *wd = cerb__calloc(1, sizeof *wd);
    if (!wd)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    wd->c = c;
    cerb__mutex_init(&wd->mu);
    cerb__cond_init(&wd->wake);
    cerb__cond_init(&wd->idle);
    if (pthread_create(&wd->thread, NULL, wd_main, wd) != 0) {
        cerb__cond_destroy(&wd->wake);
        cerb__cond_destroy(&wd->idle);
        cerb__mutex_destroy(&wd->mu);
        cerb__free(wd);
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
    cerb__mutex_lock(&wd->mu);
    wd->stop = true;
    cerb__cond_signal(&wd->wake);
    cerb__mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    for (struct cerb_hold *h = wd->head; h; h = h->wd_next)
        h->wd_linked = false;
    while (wd->orphans) { /* their leases will expire by themselves */
        struct cerb_hold *h = wd->orphans;
        wd->orphans = h->wd_next;
        cerb__free((char *)h->lk.name);
        cerb__free(h->lk.priv);
        cerb__free(h);
    }
    cerb__cond_destroy(&wd->wake);
    cerb__cond_destroy(&wd->idle);
    cerb__mutex_destroy(&wd->mu);
    cerb__free(wd->items);
    cerb__free(wd->lost);
    cerb__free(wd);
    c->wd = NULL;
}

void cerb__watchdog_add(cerb_client *c, struct cerb_hold *h)
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
    int64_t due = h->renew || h->renew_once ? h->next_renew_ns : h->valid_until_ns;
    if (h->valid_until_ns < due)
        due = h->valid_until_ns;
    if (wd->next_wake_ns == 0 || due < wd->next_wake_ns)
        cerb__cond_signal(&wd->wake);
    cerb__mutex_unlock(&wd->mu);
}

void cerb__watchdog_remove(cerb_client *c, struct cerb_hold *h)
{
    struct cerb_watchdog *wd = c->wd;
    if (!wd)
        return;
    cerb__mutex_lock(&wd->mu);
    while (h->wd_busy)
        cerb__cond_wait(&wd->idle, &wd->mu);
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
    for (struct cerb_hold *h = wd->head; h; h = h->wd_next) {
        if (h->engine_idx != ce->idx)
            continue;
        if (name && strcmp(name, h->lk.name) != 0)
            continue;
        if (token && strcmp(token, h->lk.token) != 0)
            continue;
        int cur = atomic_load(&h->state);
        if (ev == CERB_EV_LOST)
            atomic_store(&h->state, CERB_LOCK_LOST);
        else if (ev == CERB_EV_SUSPECT && cur == CERB_LOCK_VALID)
            atomic_store(&h->state, CERB_LOCK_SUSPECT);
        else if (ev == CERB_EV_VALID && cur == CERB_LOCK_SUSPECT)
            atomic_store(&h->state, CERB_LOCK_VALID);
    }
    if (ev == CERB_EV_LOST)
        cerb__cond_signal(&wd->wake);
    cerb__mutex_unlock(&wd->mu);
}
