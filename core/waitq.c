/*
 * waitq.c — the in-process wait queue of one lock name.
 *
 * Threads of one client that want the same name line up here, FIFO, so that
 * only the head of the line talks to the server: eight local threads on one
 * name cost the server one waiter, not eight. Each waiter sleeps on its own
 * condition variable and only the head is signalled when the slot frees up,
 * so a release wakes one thread, not the whole line. The slot's mutex guards
 * everything here.
 */
#include "internal_posix.h"

#include "internal.h"

void cerb__waitq_push(struct cerb_slot *s, struct cerb_waiter *w)
{
    w->next = NULL;
    w->prev = s->qtail;
    if (s->qtail)
        s->qtail->next = w;
    else
        s->qhead = w;
    s->qtail = w;
}

void cerb__waitq_remove(struct cerb_slot *s, struct cerb_waiter *w)
{
    int was_head = s->qhead == w;
    if (w->prev)
        w->prev->next = w->next;
    else
        s->qhead = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        s->qtail = w->prev;
    w->next = w->prev = NULL;
    if (was_head)
        cerb__waitq_wake(s);
}

void cerb__waitq_wake(struct cerb_slot *s)
{
    if (s->qhead && !s->occupied)
        cerb__cond_signal(&s->qhead->cond);
}

cerb_status cerb__waitq_wait(struct cerb_slot *s, struct cerb_waiter *w,
                             int64_t deadline_ns)
{
    for (;;) {
        if (s->qhead == w && !s->occupied)
            return CERB_OK;
        if (w->interruptible && atomic_load(&w->interrupted)) {
            cerb__waitq_remove(s, w);
            return CERB_INTERRUPTED;
        }
        if (cerb__cond_wait_until(&w->cond, &s->mu, deadline_ns) &&
            !(s->qhead == w && !s->occupied)) {
            cerb__waitq_remove(s, w);
            return CERB_TIMEOUT;
        }
    }
}
