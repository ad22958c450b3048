/*
 * serve_waits.c — the requests `cerberus serve` is answering and the
 * acquisitions among them that wait, so that a stop ends the waits at once
 * instead of after their wait_ms (up to an hour) and still answers them.
 *
 * Each acquisition runs with a cerb_cancel of its own, registered here for
 * the length of the call. cerb__serve_waits_stop() marks the set stopped
 * (no acquisition starts after it: the route answers 503) and fires every
 * registered cancel; each call then returns CERB_INTERRUPTED, and a grant
 * that landed in the same instant is still returned and kept in the hold
 * table, which the stop releases afterwards. The set is a small array under
 * one mutex; firing takes only the library's short mutexes, never the
 * network, so it is done with this mutex held.
 *
 * A caller that hangs up while its acquisition waits would otherwise get
 * the name once it comes free, for nobody, until the hold's window passed:
 * each registered cancel goes with its caller's socket, and the expiry
 * thread (serve_expiry.c) polls them every tick and fires the cancel of a
 * hung-up one. Polling a socket (POLLRDHUP) reads nothing from it, so it
 * does not disturb MHD, whose connection thread is blocked in the call.
 *
 * A request counts from its first call into the access handler to MHD's
 * completion callback, which comes once its answer was sent (or its
 * connection dropped). The stop waits, on a monotonic deadline, until none
 * is left before it stops MHD, which would otherwise close the connections
 * of answers not yet sent.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <poll.h>
#include <stdlib.h>
#include <time.h>

#include "serve_internal.h"

void cerb__serve_waits_init(struct cerb__serve_waits *w)
{
    pthread_condattr_t ca;

    if (pthread_mutex_init(&w->mu, NULL) != 0 || pthread_condattr_init(&ca) != 0 ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&w->idle, &ca) != 0)
        abort();
    pthread_condattr_destroy(&ca);
    w->requests = 0;
    w->v = NULL;
    w->fds = NULL;
    w->n = w->cap = 0;
    w->stopped = false;
}

bool cerb__serve_hung_up(int fd)
{
    struct pollfd p = {fd, POLLRDHUP, 0};

    return fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

cerb_status cerb__serve_waits_add(struct cerb__serve_waits *w, cerb_cancel *c, int fd)
{
    cerb_status st = CERB_OK;

    cerb__serve_lock(&w->mu);
    if (w->stopped) {
        st = CERB_UNAVAILABLE;
    } else if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        cerb_cancel **v = realloc(w->v, cap * sizeof *v);
        int *fds = v ? realloc(w->fds, cap * sizeof *fds) : NULL;
        if (v)
            w->v = v;
        if (fds)
            w->fds = fds;
        if (!v || !fds)
            st = CERB_ENOMEM;
        else
            w->cap = cap;
    }
    if (st == CERB_OK) {
        w->fds[w->n] = fd;
        w->v[w->n++] = c;
    }
    cerb__serve_unlock(&w->mu);
    return st;
}

void cerb__serve_waits_remove(struct cerb__serve_waits *w, cerb_cancel *c)
{
    cerb__serve_lock(&w->mu);
    for (size_t i = 0; i < w->n; i++) {
        if (w->v[i] == c) {
            w->n--;
            w->v[i] = w->v[w->n];
            w->fds[i] = w->fds[w->n];
            break;
        }
    }
    cerb__serve_unlock(&w->mu);
}

void cerb__serve_waits_stop(struct cerb__serve_waits *w)
{
    cerb__serve_lock(&w->mu);
    w->stopped = true;
    for (size_t i = 0; i < w->n; i++)
        cerb_cancel_fire(w->v[i]);
    cerb__serve_unlock(&w->mu);
}

void cerb__serve_waits_watch(struct cerb__serve_waits *w)
{
    cerb__serve_lock(&w->mu);
    for (size_t i = 0; i < w->n; i++)
        if (!cerb_cancel_fired(w->v[i]) && cerb__serve_hung_up(w->fds[i]))
            cerb_cancel_fire(w->v[i]);
    cerb__serve_unlock(&w->mu);
}

void cerb__serve_waits_enter(struct cerb__serve_waits *w)
{
    cerb__serve_lock(&w->mu);
    w->requests++;
    cerb__serve_unlock(&w->mu);
}

void cerb__serve_waits_leave(struct cerb__serve_waits *w)
{
    cerb__serve_lock(&w->mu);
    if (--w->requests == 0)
        pthread_cond_broadcast(&w->idle);
    cerb__serve_unlock(&w->mu);
}

bool cerb__serve_waits_drain(struct cerb__serve_waits *w, int64_t timeout_ms)
{
    struct timespec dl;
    bool idle;

    clock_gettime(CLOCK_MONOTONIC, &dl); /* the deadline, computed once */
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    cerb__serve_lock(&w->mu);
    while (w->requests > 0 && pthread_cond_timedwait(&w->idle, &w->mu, &dl) == 0)
        ;
    idle = w->requests == 0;
    cerb__serve_unlock(&w->mu);
    return idle;
}

void cerb__serve_waits_destroy(struct cerb__serve_waits *w)
{
    free(w->v);
    free(w->fds);
    if (pthread_cond_destroy(&w->idle) != 0 || pthread_mutex_destroy(&w->mu) != 0)
        abort();
}
