/*
 * semaphore.c — semaphores (DESIGN.md §16): a permit is a hold.
 *
 * Each acquisition makes a private lock handle on a slot of its own (no
 * other handle shares its line: a process may hold many permits of one
 * name, and its threads queue on the server only) whose holds carry prim
 * CERB_PRIM_SEMAPHORE with the limit and the permits taken, and acquires it
 * as a hold object (hold.c). So the deadline and the cancel, the switch
 * gate, claims, the settling of ambiguous answers, the fence (epoch + the
 * engine's counter + the client's floor), renewal by the watchdog and the
 * loss at the drift-shortened deadline are the lock's own; what a
 * semaphore adds — the queue and its rule, the stored limit — is the
 * engine's semaphore table (engine.h, struct cerb_queue_methods).
 *
 * A permit is that hold: the cerb_permit the caller gets is the hold's
 * address, so its memory, its release and the keeping alive of a running
 * lost callback are the hold's. Its callback is the permit's type
 * (cerb_hold.permit_cb), queued as EV_PERMIT_LOST.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"

#define CERB_SEMAPHORE_MAGIC 0x53454d41u /* "SEMA" */

struct cerb_semaphore {
    atomic_uint magic;
    cerb_client *c;
    char *name;
    int64_t limit;
    cerb_lock_opts lo;
    atomic_uint calls;   /* acquisitions inside: the free refuses while any */
};

static bool sem_ok(const cerb_semaphore *s)
{
    return s && atomic_load(&((cerb_semaphore *)s)->magic) == CERB_SEMAPHORE_MAGIC;
}

/* The hold a permit is, or NULL when p is not a live permit. */
static cerb_hold *permit_hold(const cerb_permit *p)
{
    cerb_hold *h = (cerb_hold *)(void *)p;
    /* Every handle starts with its magic: another object (a semaphore) is
     * refused before anything past it is read. */
    if (!h || atomic_load(&h->l.magic) != CERB_LOCK_MAGIC ||
        atomic_load(&h->magic) != CERB_HOLD_MAGIC || h->l.prim != CERB_PRIM_SEMAPHORE)
        return NULL;
    return h;
}

static cerb_status bad_permit(const char *what)
{
    return cerb__error_set(CERB_EINVAL, "%s: bad permit", what);
}

cerb_status cerb_semaphore_new(cerb_client *c, const char *name, int64_t permits,
                               const cerb_semaphore_opts *opts, cerb_semaphore **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_semaphore_new: out is NULL");
    *out = NULL;
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_semaphore_new");
    if (permits < 1 || permits > CERB_SEMAPHORE_MAX)
        return cerb__error_set(CERB_EINVAL, "cerb_semaphore_new: %lld permits (1..%d)",
                               (long long)permits, CERB_SEMAPHORE_MAX);
    cerb_semaphore_opts o = CERB_SEMAPHORE_OPTS_INIT;
    if (opts)
        o = *opts;
    /* A permit renews as a lock does; the server's queue is FIFO. */
    cerb_lock_opts lo = CERB_LOCK_OPTS_INIT;
    lo.lease_ms = o.lease_ms;
    lo.renew = 1;
    lo.fair = 1;
    /* The name and options are checked as a lock's, once, here. */
    cerb_lock *probe = NULL;
    cerb_status st = cerb__lock_new_private(c, name, &lo, CERB_PRIM_SEMAPHORE, &probe);
    if (st != CERB_OK)
        return st;
    cerb_lock_free(probe);
    cerb_semaphore *s = cerb__calloc(1, sizeof *s);
    if (!s || !(s->name = cerb__strdup(name))) {
        cerb__free(s);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    s->c = c;
    s->limit = permits;
    s->lo = lo;
    atomic_store(&s->magic, CERB_SEMAPHORE_MAGIC);
    *out = s;
    return CERB_OK;
}

static cerb_status acquire(cerb_semaphore *s, unsigned count, int64_t wait_ms,
                           cerb_cancel *cancel, cerb_permit **out);

cerb_status cerb_semaphore_acquire(cerb_semaphore *s, unsigned count, int64_t wait_ms,
                                   cerb_cancel *cancel, cerb_permit **out)
{
    if (!out)
        return cerb__cancel_note(cancel, cerb__error_set(CERB_EINVAL,
                                                         "cerb_semaphore_acquire: out is NULL"));
    *out = NULL;
    if (!sem_ok(s))
        return cerb__cancel_note(cancel, cerb__error_set(CERB_EINVAL, "cerb_semaphore_acquire: "
                                                                      "bad semaphore"));
    atomic_fetch_add(&s->calls, 1);
    /* A free racing this call is refused (calls) or came first (magic). */
    if (!sem_ok(s)) {
        atomic_fetch_sub(&s->calls, 1);
        return cerb__cancel_note(cancel, cerb__error_set(CERB_EINVAL, "cerb_semaphore_acquire: "
                                                                      "bad semaphore"));
    }
    cerb_status st = acquire(s, count, wait_ms, cancel, out);
    atomic_fetch_sub(&s->calls, 1);
    return st;
}

static cerb_status acquire(cerb_semaphore *s, unsigned count, int64_t wait_ms,
                           cerb_cancel *cancel, cerb_permit **out)
{
    if (count < 1 || (int64_t)count > s->limit)
        return cerb__cancel_note(
            cancel, cerb__error_set(CERB_EINVAL,
                                    "semaphore \"%s\": %u permits asked of a limit of %lld",
                                    s->name, count, (long long)s->limit));
    cerb_lock *t = NULL;
    cerb_client *c = s->c;
    cerb_status st = cerb__lock_new_private(c, s->name, &s->lo, CERB_PRIM_SEMAPHORE, &t);
    if (st != CERB_OK)
        return cerb__cancel_note(cancel, st);
    t->limit = s->limit;
    t->count = count;
    cerb_hold *h = NULL;
    st = cerb_lock_acquire(t, wait_ms, cancel, &h);
    /* The hold keeps the private slot; the handle is no longer needed. */
    char why[CERB_ERROR_MAX];
    if (st != CERB_OK)
        cerb__error_copy(why, sizeof why);
    cerb_lock_free(t);
    if (st != CERB_OK) {
        cerb__error_set(st, "%s", why);
        return st;
    }
    int idx = cerb__lock_engine_idx(&h->l);
    if (idx >= 0)
        atomic_fetch_add(&c->engines[idx].sem_grants, 1);
    *out = (cerb_permit *)(void *)h;
    return CERB_OK;
}

int64_t cerb_semaphore_limit(const cerb_semaphore *s)
{
    return sem_ok(s) ? s->limit : 0;
}

cerb_status cerb_semaphore_free(cerb_semaphore *s)
{
    if (!s)
        return CERB_OK;
    if (!sem_ok(s))
        return cerb__error_set(CERB_EINVAL, "cerb_semaphore_free: bad semaphore");
    unsigned magic = CERB_SEMAPHORE_MAGIC;
    if (atomic_load(&s->calls) > 0 ||
        !atomic_compare_exchange_strong(&s->magic, &magic, CERB_DEAD_MAGIC))
        return cerb__error_set(CERB_BUSY, "semaphore \"%s\": an acquisition is in progress",
                               s->name);
    if (atomic_load(&s->calls) > 0) {
        /* One came in between the two looks: it saw the magic alive. */
        atomic_store(&s->magic, CERB_SEMAPHORE_MAGIC);
        return cerb__error_set(CERB_BUSY, "semaphore \"%s\": an acquisition is in progress",
                               s->name);
    }
    cerb__free(s->name);
    cerb__free(s);
    return CERB_OK;
}

cerb_status cerb_permit_release(cerb_permit *p)
{
    cerb_hold *h = permit_hold(p);
    return h ? cerb_hold_release(h) : bad_permit("cerb_permit_release");
}

uint64_t cerb_permit_fencing_token(const cerb_permit *p)
{
    cerb_hold *h = permit_hold(p);
    return h ? cerb_hold_fencing_token(h) : 0;
}

enum cerb_lock_state cerb_permit_state(const cerb_permit *p)
{
    cerb_hold *h = permit_hold(p);
    return h ? cerb_hold_state(h) : CERB_LOCK_FREE;
}

int64_t cerb_permit_valid_ms(const cerb_permit *p)
{
    cerb_hold *h = permit_hold(p);
    return h ? cerb_hold_valid_ms(h) : 0;
}

unsigned cerb_permit_count(const cerb_permit *p)
{
    cerb_hold *h = permit_hold(p);
    return h ? h->l.count : 0;
}

cerb_status cerb_permit_on_lost(cerb_permit *p, void (*cb)(cerb_permit *, void *), void *ud)
{
    cerb_hold *h = permit_hold(p);
    if (!h || !cerb__lock_alive(&h->l))
        return bad_permit("cerb_permit_on_lost");
    struct cerb_slot *s = h->l.slot;
    cerb__mutex_lock(&s->mu);
    h->cb = NULL;
    h->permit_cb = cb;
    h->cb_ud = ud;
    /* Lost before anyone listened: the watchdog told nobody, so tell now. */
    cerb_status st = CERB_OK;
    struct cerb_engine_hold *eh = CERB__OBJECT_HOLD(s, &h->l);
    if (cb && !h->told && eh && atomic_load(&eh->state) == CERB_LOCK_LOST &&
        !cerb__hold_tell_locked(h->l.client, h))
        st = cerb__error_set(CERB_ENOMEM, "cerb_permit_on_lost: out of memory to queue the "
                                          "callback of a permit already lost; set it again");
    cerb__mutex_unlock(&s->mu);
    return st;
}

cerb_status cerb_permit_free(cerb_permit *p)
{
    if (!p)
        return CERB_OK;
    cerb_hold *h = permit_hold(p);
    return h ? cerb_hold_free(h) : bad_permit("cerb_permit_free");
}
