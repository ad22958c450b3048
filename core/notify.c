/*
 * notify.c — the client's callback thread: lost and switch callbacks are
 * queued here and called one at a time, in order, from a thread of their
 * own, with no library mutex held and nothing in the library waiting for
 * them.
 *
 * Why a thread: a callback is application code, and application code takes
 * application mutexes. Called from the renewal thread, a lost callback that
 * waits for a mutex held around cerb_lock_unlock() deadlocked the unlock
 * (which waited for the callback) and stopped every renewal of the client;
 * a switch callback on the prober or the caller's thread had the same
 * exposure. Here the renewal and prober threads only append to a queue (a
 * leaf mutex, no callback under it), and the unlock path never looks at it.
 *
 * Guard attempts' lost callbacks (guard_renew.c) go the same way, with the
 * same promises, their handle in place of the lock's.
 *
 * Promises and lifetimes:
 *  - A lost callback is queued once per lost hold (the watchdog decides
 *    that) with the callback and user data set when the loss was found, and
 *    called once, unless its handle is freed or the client closed before it
 *    starts: a freed handle's queued callbacks are dropped, so after
 *    cerb_lock_free() returns none starts for it.
 *  - Nothing waits for a running callback: cerb_lock_free() and
 *    cerb_client_close() drop what has not started and return. A running
 *    callback may return after them; the memory of its cerb_lock (and of
 *    the client) stays allocated until it returns, the handle marked dead,
 *    so a call on it then gives CERB_EINVAL instead of reading freed
 *    memory. The thread frees them when the callback returns.
 *  - After close has returned, no callback starts.
 * A manual client (the simulation's, internal.h) has no thread: its queue
 * runs when cerb__notify_run is called, on the caller's thread, by the same
 * code (run_one).
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"

enum { EV_LOST, EV_GUARD_LOST, EV_HOLD_LOST, EV_ELECTION_LOST, EV_PERMIT_LOST, EV_RWLOCK_LOST, EV_SWITCH };

/* A lost callback, typed by the handle it is for. */
union lost_cb {
    void (*lock)(cerb_lock *, void *);
    void (*guard)(cerb_guard *, void *);
    void (*hold)(cerb_hold *, void *);
    void (*election)(cerb_election *, void *);
    void (*permit)(cerb_permit *, void *);
    void (*rwlock)(cerb_rwlock *, void *);
};

struct notify_ev {
    struct notify_ev *next;
    int kind;
    void *obj;                            /* EV_LOST: a cerb_lock, EV_GUARD_LOST: a cerb_guard,
                                             EV_HOLD_LOST: a cerb_hold (its handle's address),
                                             EV_ELECTION_LOST: a cerb_election,
                                             EV_PERMIT_LOST: a cerb_permit (its hold's
                                             address), EV_RWLOCK_LOST: a cerb_rwlock */
    union lost_cb cb;                     /* by kind */
    void *lost_ud;
    char from[CERB_ENGINE_NAME_MAX];      /* EV_SWITCH */
    char to[CERB_ENGINE_NAME_MAX];
    char why[160];
};

struct cerb_notify {
    pthread_t thread;
    cerb_mutex mu;                        /* a leaf: nothing is called under it */
    cerb_cond cond;
    struct notify_ev *head, *tail;
    bool stop;                            /* close began: start nothing more */
    bool detached;                        /* close left: the thread frees all */
    void *running;                        /* handle of the lost callback running */
    bool free_running;                    /* it was freed meanwhile */
    bool in_callback;
    bool threaded;                        /* false: a manual client (client.c)
                                             runs the queue by cerb__notify_run */
    void *free_client;                    /* client memory left to the thread */
    void (*switch_cb)(const char *, const char *, const char *, void *);
    void *switch_ud;
};

/* Call the first queued callback; nt->mu held on entry and exit, released
 * around the call. */
static void run_one(struct cerb_notify *nt)
{
    struct notify_ev *ev = nt->head;
    nt->head = ev->next;
    if (!nt->head)
        nt->tail = NULL;
    void (*scb)(const char *, const char *, const char *, void *) = nt->switch_cb;
    void *sud = nt->switch_ud;
    if (ev->kind != EV_SWITCH)
        nt->running = ev->obj;
    nt->in_callback = true;
    cerb__mutex_unlock(&nt->mu);

    if (ev->kind == EV_LOST)
        ev->cb.lock(ev->obj, ev->lost_ud);
    else if (ev->kind == EV_GUARD_LOST)
        ev->cb.guard(ev->obj, ev->lost_ud);
    else if (ev->kind == EV_HOLD_LOST)
        ev->cb.hold(ev->obj, ev->lost_ud);
    else if (ev->kind == EV_ELECTION_LOST)
        ev->cb.election(ev->obj, ev->lost_ud);
    else if (ev->kind == EV_PERMIT_LOST)
        ev->cb.permit(ev->obj, ev->lost_ud);
    else if (ev->kind == EV_RWLOCK_LOST)
        ev->cb.rwlock(ev->obj, ev->lost_ud);
    else if (scb)
        scb(ev->from, ev->to, ev->why, sud);

    cerb__mutex_lock(&nt->mu);
    nt->in_callback = false;
    if (nt->running && nt->free_running)
        cerb__free(nt->running);
    nt->running = NULL;
    nt->free_running = false;
    cerb__free(ev);
}

static void *notify_main(void *arg)
{
    struct cerb_notify *nt = arg;
    cerb__mutex_lock(&nt->mu);
    for (;;) {
        while (!nt->stop && !nt->head)
            cerb__cond_wait(&nt->cond, &nt->mu);
        if (nt->stop)
            break;
        run_one(nt);
    }
    bool detached = nt->detached;
    cerb__mutex_unlock(&nt->mu);
    if (detached) {
        /* cerb_client_close() returned while a callback ran: what it left
         * for that callback to read is ours to free now. */
        cerb__free(nt->free_client);
        cerb__cond_destroy(&nt->cond);
        cerb__mutex_destroy(&nt->mu);
        cerb__free(nt);
    }
    return NULL;
}

void cerb__notify_run(cerb_client *c)
{
    struct cerb_notify *nt = c->nt;
    if (!nt)
        return;
    cerb__mutex_lock(&nt->mu);
    while (!nt->stop && nt->head)
        run_one(nt);
    cerb__mutex_unlock(&nt->mu);
}

cerb_status cerb__notify_start(cerb_client *c)
{
    struct cerb_notify *nt = cerb__calloc(1, sizeof *nt);
    if (!nt)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    cerb__mutex_init(&nt->mu);
    cerb__cond_init(&nt->cond);
    nt->threaded = !c->manual;
    if (nt->threaded && pthread_create(&nt->thread, NULL, notify_main, nt) != 0) {
        cerb__cond_destroy(&nt->cond);
        cerb__mutex_destroy(&nt->mu);
        cerb__free(nt);
        return cerb__error_set(CERB_ENOMEM, "cannot start the callback thread");
    }
    c->nt = nt;
    return CERB_OK;
}

static void push(struct cerb_notify *nt, struct notify_ev *ev)
{
    if (nt->tail)
        nt->tail->next = ev;
    else
        nt->head = ev;
    nt->tail = ev;
    cerb__cond_signal(&nt->cond);
}

/* Queue ev, or drop it once close began. */
static void push_unless_stopped(struct cerb_notify *nt, struct notify_ev *ev)
{
    cerb__mutex_lock(&nt->mu);
    if (nt->stop)
        cerb__free(ev);
    else
        push(nt, ev);
    cerb__mutex_unlock(&nt->mu);
}

/* Queue a lost callback of kind EV_*_LOST for obj; a missing callback or
 * object (or no callback thread) is nobody to tell: told. False only when
 * out of memory (the caller tries again later). */
static bool queue_lost(cerb_client *c, int kind, void *obj, union lost_cb cb, bool has_cb,
                       void *ud)
{
    struct cerb_notify *nt = c->nt;
    if (!nt || !has_cb || !obj)
        return true;
    struct notify_ev *ev = cerb__calloc(1, sizeof *ev);
    if (!ev)
        return false;
    ev->kind = kind;
    ev->obj = obj;
    ev->cb = cb;
    ev->lost_ud = ud;
    push_unless_stopped(nt, ev);
    return true;
}

bool cerb__notify_lost(cerb_client *c, cerb_lock *l, void (*cb)(cerb_lock *, void *), void *ud)
{
    return queue_lost(c, EV_LOST, l, (union lost_cb){.lock = cb}, cb != NULL, ud);
}

bool cerb__notify_guard_lost(cerb_client *c, cerb_guard *g, void (*cb)(cerb_guard *, void *),
                             void *ud)
{
    return queue_lost(c, EV_GUARD_LOST, g, (union lost_cb){.guard = cb}, cb != NULL, ud);
}

bool cerb__notify_hold_lost(cerb_client *c, struct cerb_hold *h, void (*cb)(cerb_hold *, void *),
                            void *ud)
{
    return queue_lost(c, EV_HOLD_LOST, h, (union lost_cb){.hold = cb}, cb != NULL, ud);
}

bool cerb__notify_election_lost(cerb_client *c, cerb_election *e,
                                void (*cb)(cerb_election *, void *), void *ud)
{
    return queue_lost(c, EV_ELECTION_LOST, e, (union lost_cb){.election = cb}, cb != NULL, ud);
}

bool cerb__notify_permit_lost(cerb_client *c, cerb_permit *p, void (*cb)(cerb_permit *, void *),
                              void *ud)
{
    return queue_lost(c, EV_PERMIT_LOST, p, (union lost_cb){.permit = cb}, cb != NULL, ud);
}

bool cerb__notify_rwlock_lost(cerb_client *c, cerb_rwlock *rw, void (*cb)(cerb_rwlock *, void *),
                              void *ud)
{
    return queue_lost(c, EV_RWLOCK_LOST, rw, (union lost_cb){.rwlock = cb}, cb != NULL, ud);
}

void cerb__notify_switch(cerb_client *c, const char *from, const char *to, const char *why)
{
    struct cerb_notify *nt = c->nt;
    if (!nt)
        return;
    cerb__mutex_lock(&nt->mu);
    bool wanted = nt->switch_cb && !nt->stop;
    cerb__mutex_unlock(&nt->mu);
    if (!wanted)
        return;
    struct notify_ev *ev = cerb__calloc(1, sizeof *ev);
    if (!ev)
        return; /* the switch itself is logged; the callback is best effort under OOM */
    ev->kind = EV_SWITCH;
    snprintf(ev->from, sizeof ev->from, "%s", from);
    snprintf(ev->to, sizeof ev->to, "%s", to);
    snprintf(ev->why, sizeof ev->why, "%s", why ? why : "");
    push_unless_stopped(nt, ev);
}

void cerb__notify_set_switch_cb(cerb_client *c,
                                void (*cb)(const char *, const char *, const char *, void *),
                                void *ud)
{
    struct cerb_notify *nt = c->nt;
    cerb__mutex_lock(&nt->mu);
    nt->switch_cb = cb;
    nt->switch_ud = ud;
    cerb__mutex_unlock(&nt->mu);
}

bool cerb__notify_forget(cerb_client *c, const void *obj)
{
    struct cerb_notify *nt = c->nt;
    bool keep = false;
    if (!nt)
        return false;
    cerb__mutex_lock(&nt->mu);
    struct notify_ev **pp = &nt->head, *prev = NULL;
    while (*pp) {
        struct notify_ev *ev = *pp;
        if (ev->kind != EV_SWITCH && ev->obj == obj) {
            *pp = ev->next;
            cerb__free(ev);
        } else {
            prev = ev;
            pp = &ev->next;
        }
    }
    nt->tail = prev;
    if (nt->running == obj) {
        nt->free_running = true;
        keep = true;
    }
    cerb__mutex_unlock(&nt->mu);
    return keep;
}

void cerb__notify_stop(cerb_client *c)
{
    struct cerb_notify *nt = c->nt;
    if (!nt)
        return;
    cerb__mutex_lock(&nt->mu);
    nt->stop = true;
    while (nt->head) {
        struct notify_ev *ev = nt->head;
        nt->head = ev->next;
        cerb__free(ev);
    }
    nt->tail = NULL;
    cerb__cond_signal(&nt->cond);
    cerb__mutex_unlock(&nt->mu);
}

bool cerb__notify_finish(cerb_client *c)
{
    struct cerb_notify *nt = c->nt;
    if (!nt)
        return false;
    c->nt = NULL;
    cerb__mutex_lock(&nt->mu);
    bool busy = nt->in_callback;
    if (busy) {
        nt->detached = true;
        nt->free_client = c;
    }
    cerb__mutex_unlock(&nt->mu);
    if (busy) {
        /* Only a thread runs a callback while close runs: a manual
         * client's queue runs on the caller's thread, never during close. */
        pthread_detach(nt->thread);
        return true;
    }
    if (nt->threaded)
        pthread_join(nt->thread, NULL);
    cerb__cond_destroy(&nt->cond);
    cerb__mutex_destroy(&nt->mu);
    cerb__free(nt);
    return false;
}
