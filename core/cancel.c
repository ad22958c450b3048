/*
 * cancel.c — ending one blocking call from another thread.
 *
 * cerb_lock_interrupt() wakes every interruptible waiter of a handle; a
 * binding needs to end one call (an asyncio task's, a request's). A cancel
 * is given to one call at a time. The call attaches it with the handle it
 * waits through — for a hold object a private handle, so interrupting that
 * handle ends exactly this call — and detaches it before returning; firing
 * marks it and interrupts the attached handle, if any.
 *
 * Lock order: cancel->mu, then the slot's mutex (inside
 * cerb__lock_interrupt). A call never takes cancel->mu while it holds a slot
 * mutex.
 *
 * The call's error text is copied into the cancel when it detaches, so a
 * caller on another thread (an event loop, after an executor ran the call)
 * still reads why.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"

cerb_status cerb_cancel_new(cerb_cancel **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_cancel_new: out is NULL");
    cerb_cancel *k = cerb__calloc(1, sizeof *k);
    if (!k) {
        *out = NULL;
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    cerb__mutex_init(&k->mu);
    *out = k;
    return CERB_OK;
}

void cerb_cancel_fire(cerb_cancel *k)
{
    if (!k)
        return;
    cerb__mutex_lock(&k->mu);
    atomic_store(&k->fired, 1);
    if (k->waiting)
        cerb__lock_interrupt(k->waiting);
    cerb__mutex_unlock(&k->mu);
}

int cerb_cancel_fired(const cerb_cancel *k)
{
    return k && atomic_load(&((cerb_cancel *)k)->fired) ? 1 : 0;
}

const char *cerb_cancel_error(const cerb_cancel *k)
{
    return k ? k->err : "";
}

void cerb_cancel_free(cerb_cancel *k)
{
    if (!k)
        return;
    cerb__mutex_destroy(&k->mu);
    cerb__free(k);
}

cerb_status cerb__cancel_attach(cerb_cancel *k, cerb_lock *l)
{
    cerb__mutex_lock(&k->mu);
    if (k->in_use) {
        cerb__mutex_unlock(&k->mu);
        /* Not the other call's text to overwrite: only this thread's. */
        return cerb__error_set(CERB_EINVAL, "the cancel is in use by another call (one call at a time)");
    }
    k->in_use = true;
    k->err[0] = '\0';
    cerb_status st = CERB_OK;
    if (atomic_load(&k->fired))
        st = cerb__error_set(CERB_INTERRUPTED, "cancelled before the call began");
    else
        k->waiting = l;
    cerb__mutex_unlock(&k->mu);
    if (st != CERB_OK)
        cerb__cancel_detach(k, st);
    return st;
}

cerb_status cerb__cancel_note(cerb_cancel *k, cerb_status st)
{
    if (!k)
        return st;
    cerb__mutex_lock(&k->mu);
    if (!k->in_use)
        cerb__error_copy(k->err, sizeof k->err);
    cerb__mutex_unlock(&k->mu);
    return st;
}

void cerb__cancel_detach(cerb_cancel *k, cerb_status st)
{
    cerb__mutex_lock(&k->mu);
    k->waiting = NULL;
    k->in_use = false;
    if (st == CERB_OK)
        k->err[0] = '\0';
    else
        cerb__error_copy(k->err, sizeof k->err);
    cerb__mutex_unlock(&k->mu);
}
