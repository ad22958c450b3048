/*
 * hold.c — holds owned by an object (cerb_lock_acquire), for callers whose
 * work moves between threads: executors, event loops, bindings, a daemon.
 *
 * A hold is the thread-reentrant machinery of lock.c with another owner:
 * each acquisition gets a private handle (embedded first in the hold) with
 * the options of the handle it came from, and takes the name's slot for
 * CERB_HOLDER_OBJECT instead of a thread. So it waits in the same local
 * line, excludes thread holds and other holds alike (no thread's id ever
 * equals CERB_HOLDER_OBJECT, so nothing re-enters it), is renewed and
 * watched by the same watchdog, and is released by the same path — from
 * whichever thread asks, once (`released`). The private handle also makes
 * cancelling one acquisition exact: interrupting it wakes no other waiter.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"

#include <stddef.h>

/* The callback thread frees a handle's memory when its callback returns,
 * and cerb__lock_retire frees the handle: both free the hold. */
_Static_assert(offsetof(struct cerb_hold, l) == 0, "a hold's private handle comes first");

static bool hold_ok(const cerb_hold *h)
{
    return h && atomic_load(&((cerb_hold *)h)->magic) == CERB_HOLD_MAGIC &&
           cerb__lock_alive(&h->l);
}

static cerb_status hold_refused(const cerb_hold *h, const char *what)
{
    if (h && atomic_load(&((cerb_hold *)h)->magic) == CERB_HOLD_MAGIC)
        return cerb__lock_refused(&h->l, what);
    return cerb__error_set(CERB_EINVAL, "%s: bad hold", what);
}

/* Keep the calling thread's error text in the hold (st != CERB_OK). */
static cerb_status hold_keep_error(cerb_hold *h, cerb_status st)
{
    if (st == CERB_OK)
        return st;
    cerb__mutex_lock(&h->l.slot->mu);
    cerb__error_copy(h->err, sizeof h->err);
    cerb__mutex_unlock(&h->l.slot->mu);
    return st;
}

/* The private handle of a new hold: the options of @from, its name. */
static cerb_status hold_new(cerb_lock *from, cerb_hold **out)
{
    cerb_hold *h = cerb__calloc(1, sizeof *h);
    if (!h)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    h->l.lease_ms = from->lease_ms;
    h->l.renew = from->renew;
    h->l.fair = from->fair;
    h->l.renew_set = from->renew_set;
    h->l.fair_set = from->fair_set;
    h->l.prim = from->prim;
    h->l.variant = from->variant;
    h->l.value = from->value; /* the caller's while it acquires; copied at the grant */
    h->l.value_len = from->value_len;
    h->l.election = from->election;
    h->l.limit = from->limit;
    h->l.count = from->count;
    h->l.as_hold = h;
    if (from->slot->unlisted) {
        /* A primitive's private line: the hold shares it with its handle. */
        cerb__slot_ref(from->client, from->slot);
        cerb__lock_enlist_slot(from->client, from->slot, &h->l);
    } else {
        cerb_status st = cerb__lock_enlist(from->client, from->slot->name, &h->l);
        if (st != CERB_OK) {
            cerb__free(h);
            return st;
        }
    }
    cerb__mutex_init(&h->release_mu);
    atomic_store(&h->magic, CERB_HOLD_MAGIC);
    *out = h;
    return CERB_OK;
}

static void hold_retire(cerb_hold *h)
{
    atomic_store(&h->magic, CERB_DEAD_MAGIC);
    cerb__mutex_destroy(&h->release_mu);
    cerb__lock_retire(&h->l); /* frees h, or leaves it to a running callback */
}

cerb_status cerb_lock_acquire(cerb_lock *l, int64_t wait_ms, cerb_cancel *cancel, cerb_hold **out)
{
    if (!out)
        return cerb__cancel_note(cancel, cerb__error_set(CERB_EINVAL,
                                                         "cerb_lock_acquire: out is NULL"));
    *out = NULL;
    if (!cerb__lock_ok(l))
        return cerb__cancel_note(cancel, cerb__lock_refused(l, "cerb_lock_acquire: bad lock handle"));
    if (wait_ms < -1)
        return cerb__cancel_note(
            cancel, cerb__error_set(CERB_EINVAL,
                                    "cerb_lock_acquire: wait_ms %lld (0: one try, -1: no limit)",
                                    (long long)wait_ms));
    cerb_hold *h = NULL;
    cerb_status st = hold_new(l, &h);
    if (st != CERB_OK)
        return cerb__cancel_note(cancel, st);
    if (cancel) {
        st = cerb__cancel_attach(cancel, &h->l);
        if (st != CERB_OK) {
            hold_retire(h);
            return st;
        }
    }
    /* Interruptible either way: only the cancel can interrupt the private
     * handle. A try answers CERB_BUSY, as cerb_lock_trylock(). */
    if (wait_ms == 0)
        st = cerb__lock_acquire_as(&h->l, 0, true, true, CERB_HOLDER_OBJECT);
    else
        st = cerb__lock_acquire_as(&h->l, cerb__deadline_in(wait_ms), true, false,
                                   CERB_HOLDER_OBJECT);
    const char *name = h->l.slot->name;
    if (st == CERB_OK && cancel && cerb_cancel_fired(cancel)) {
        /* Granted as the cancel fired: nobody will use it, so it must not
         * stay on the server until its lease runs out. */
        cerb_status rs = cerb__lock_release_object(&h->l);
        st = cerb__error_set(CERB_INTERRUPTED,
                             "lock \"%s\": cancelled; the grant that landed meanwhile was %s", name,
                             rs == CERB_OK || rs == CERB_LOST
                                 ? "released"
                                 : "not confirmed released (its lease ends it)");
    } else if (st != CERB_OK && st != CERB_INTERRUPTED && cancel && cerb_cancel_fired(cancel)) {
        /* Fired while the call was failing for another reason: the caller
         * asked to stop, and that is what it is told (with the reason). */
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        st = cerb__error_set(CERB_INTERRUPTED, "lock \"%s\": cancelled (%s: %s)", name,
                             cerb_status_name(st), why);
    }
    if (st == CERB_OK) {
        struct cerb_slot *s = h->l.slot;
        cerb__mutex_lock(&s->mu);
        h->fence = s->hold->fence;
        cerb__mutex_unlock(&s->mu);
    }
    if (cancel)
        cerb__cancel_detach(cancel, st);
    if (st != CERB_OK) {
        hold_retire(h);
        return st;
    }
    *out = h;
    return CERB_OK;
}

cerb_status cerb_hold_release(cerb_hold *h)
{
    if (!hold_ok(h))
        return hold_refused(h, "cerb_hold_release");
    cerb__mutex_lock(&h->release_mu);
    cerb_status st;
    if (h->released) {
        st = cerb__error_set(CERB_NOT_OWNER, "lock \"%s\": this hold was already released",
                             h->l.slot->name);
    } else {
        h->released = true;
        st = cerb__lock_release_object(&h->l);
    }
    hold_keep_error(h, st);
    cerb__mutex_unlock(&h->release_mu);
    return st;
}

uint64_t cerb_hold_fencing_token(const cerb_hold *h)
{
    return hold_ok(h) ? h->fence : 0;
}

const char *cerb_hold_name(const cerb_hold *h)
{
    return hold_ok(h) ? h->l.slot->name : NULL;
}

enum cerb_lock_state cerb_hold_state(const cerb_hold *h)
{
    if (!hold_ok(h))
        return CERB_LOCK_FREE;
    struct cerb_slot *s = h->l.slot;
    enum cerb_lock_state st = CERB_LOCK_FREE;
    cerb__mutex_lock(&s->mu);
    struct cerb_engine_hold *eh = CERB__OBJECT_HOLD(s, &h->l);
    if (eh)
        st = cerb__hold_state(h->l.client, eh);
    cerb__mutex_unlock(&s->mu);
    return st;
}

int64_t cerb_hold_valid_ms(const cerb_hold *h)
{
    if (!hold_ok(h))
        return 0;
    struct cerb_slot *s = h->l.slot;
    int64_t left = 0;
    cerb__mutex_lock(&s->mu);
    struct cerb_engine_hold *eh = CERB__OBJECT_HOLD(s, &h->l);
    if (eh && cerb__hold_state(h->l.client, eh) != CERB_LOCK_LOST) {
        left = cerb__hold_until(h->l.client, eh) - cerb_monotime();
        left = left > 0 ? left / 1000000 : 0;
    }
    cerb__mutex_unlock(&s->mu);
    return left;
}

bool cerb__hold_tell_locked(cerb_client *c, struct cerb_hold *o)
{
    if (o->told)
        return true;
    if (o->permit_cb)
        o->told = cerb__notify_permit_lost(c, (cerb_permit *)(void *)o, o->permit_cb, o->cb_ud);
    else if (o->cb)
        o->told = cerb__notify_hold_lost(c, o, o->cb, o->cb_ud);
    else
        return true; /* nobody to tell (yet: a callback set later is told then) */
    return o->told;
}

cerb_status cerb_hold_on_lost(cerb_hold *h, void (*cb)(cerb_hold *, void *), void *ud)
{
    if (!hold_ok(h))
        return hold_refused(h, "cerb_hold_on_lost");
    struct cerb_slot *s = h->l.slot;
    cerb__mutex_lock(&s->mu);
    h->cb = cb;
    h->permit_cb = NULL;
    h->cb_ud = ud;
    /* Lost before anyone listened: the watchdog told nobody, so tell now. */
    cerb_status st = CERB_OK;
    struct cerb_engine_hold *eh = CERB__OBJECT_HOLD(s, &h->l);
    if (cb && !h->told && eh && atomic_load(&eh->state) == CERB_LOCK_LOST) {
        cerb__hold_tell_locked(h->l.client, h);
        if (!h->told) /* the watchdog told nobody and will not look again */
            st = cerb__error_set(CERB_ENOMEM, "cerb_hold_on_lost: out of memory to queue the "
                                              "callback of a hold already lost; set it again");
    }
    cerb__mutex_unlock(&s->mu);
    return st;
}

const char *cerb_hold_error(const cerb_hold *h)
{
    return h && atomic_load(&((cerb_hold *)h)->magic) == CERB_HOLD_MAGIC ? h->err : "";
}

cerb_status cerb_hold_free(cerb_hold *h)
{
    if (!h)
        return CERB_OK;
    if (!hold_ok(h))
        return hold_refused(h, "cerb_hold_free");
    /* Waits for a release in flight on another thread: it still uses the
     * hold and its slot. */
    cerb__mutex_lock(&h->release_mu);
    cerb_status st = CERB_OK;
    if (!h->released) {
        h->released = true;
        st = cerb__lock_release_object(&h->l);
    }
    cerb__mutex_unlock(&h->release_mu);
    hold_retire(h);
    return st;
}
