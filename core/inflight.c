/*
 * inflight.c — the client's list of acquisitions that are inside an engine
 * call (waiting there), and what a switch does to them: each one on an
 * engine other than the new one is stopped and cancelled there, so that it
 * carries on on the new engine (lock.c, follow_switch) instead of being
 * granted on the engine new acquisitions left. It sits below both lock.c,
 * which adds and removes its acquisitions, and health.c, which switches,
 * so neither calls the other for it.
 */
#include "internal_posix.h"

#include "internal.h"

void cerb__inflight_add(cerb_client *c, struct cerb_waiter *w)
{
    cerb__mutex_lock(&c->inflight_mu);
    w->cprev = NULL;
    w->cnext = c->inflight;
    if (c->inflight)
        c->inflight->cprev = w;
    c->inflight = w;
    cerb__mutex_unlock(&c->inflight_mu);
}

void cerb__inflight_del(cerb_client *c, struct cerb_waiter *w)
{
    cerb__mutex_lock(&c->inflight_mu);
    if (w->cprev)
        w->cprev->cnext = w->cnext;
    else
        c->inflight = w->cnext;
    if (w->cnext)
        w->cnext->cprev = w->cprev;
    cerb__mutex_unlock(&c->inflight_mu);
}

/*
 * A switch to engine `to`: every acquisition waiting on another engine is
 * stopped there (its flag, and the engine's cancel() to wake it) and carries
 * on on `to` behind the safe-switch gate. Left where it was, a wait that
 * began before the switch could be granted on the old engine long after the
 * gate stopped asking it — a second holder.
 */
void cerb__inflight_follow_switch(cerb_client *c, int to)
{
    cerb__mutex_lock(&c->inflight_mu);
    for (struct cerb_waiter *w = c->inflight; w; w = w->cnext) {
        struct cerb_slot *s = w->handle->slot;
        cerb__mutex_lock(&s->mu);
        struct cerb_engine_hold *h = w->engine_hold;
        if (h && h->engine_idx != to) {
            atomic_store(&w->moved, 1);
            atomic_store(&w->stop, 1);
            struct cerb_client_engine *ce = &c->engines[h->engine_idx];
            cerb__engine_cancel(ce->ops, ce->e, &h->lk);
        }
        cerb__mutex_unlock(&s->mu);
    }
    cerb__mutex_unlock(&c->inflight_mu);
}
