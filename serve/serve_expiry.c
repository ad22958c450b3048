/*
 * serve_expiry.c — the thread that releases the holds of callers gone
 * silent: a hold nobody kept alive (POST /v1/holds/{hold}/keepalive) within
 * its window (its lease_ms) is taken out of the table and released, so a
 * caller that died never keeps a name (DESIGN.md §15).
 *
 * The library renews the hold's lease on the server for as long as the
 * service holds it, so the window is the service's own promise to its
 * callers, not the server's lease. The thread looks every TICK_MS (a
 * monotonic timed wait that the stop cuts short), takes the expired holds
 * out under the table's mutex and releases them without it; a release
 * that fails leaves the server lease to expire by itself, as
 * cerb_hold_free() does. The same tick cancels the acquisitions whose
 * callers hung up while they waited (serve_waits.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "serve_internal.h"

#define TICK_MS 100
#define BATCH 64

struct args {
    struct cerb__serve_expiry *e;
    struct cerb__serve_holds *holds;
    struct cerb__serve_waits *waits;
};

static void *run(void *ud)
{
    struct cerb__serve_expiry *e = ((struct args *)ud)->e;
    struct cerb__serve_holds *holds = ((struct args *)ud)->holds;
    struct cerb__serve_waits *waits = ((struct args *)ud)->waits;
    cerb_hold *batch[BATCH];

    free(ud);
    for (;;) {
        struct timespec dl;
        bool stop;
        size_t n;

        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_nsec += TICK_MS * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        if (pthread_mutex_lock(&e->mu) != 0)
            abort();
        while (!e->stop && pthread_cond_timedwait(&e->wake, &e->mu, &dl) == 0)
            ;
        stop = e->stop;
        if (pthread_mutex_unlock(&e->mu) != 0)
            abort();
        if (stop)
            return NULL;
        cerb__serve_waits_watch(waits);
        do {
            n = cerb__serve_holds_take_expired(holds, batch, BATCH);
            for (size_t i = 0; i < n; i++)
                cerb_hold_free(batch[i]); /* releases it first */
        } while (n == BATCH);
    }
}

cerb_status cerb__serve_expiry_start(struct cerb__serve_expiry *e,
                                     struct cerb__serve_holds *holds,
                                     struct cerb__serve_waits *waits)
{
    pthread_condattr_t ca;
    struct args *a = malloc(sizeof *a);

    if (pthread_mutex_init(&e->mu, NULL) != 0 || pthread_condattr_init(&ca) != 0 ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&e->wake, &ca) != 0)
        abort();
    pthread_condattr_destroy(&ca);
    e->stop = false;
    e->started = false;
    if (!a)
        return CERB_ENOMEM;
    a->e = e;
    a->holds = holds;
    a->waits = waits;
    if (pthread_create(&e->thread, NULL, run, a) != 0) {
        free(a);
        return CERB_ENOMEM;
    }
    e->started = true;
    return CERB_OK;
}

void cerb__serve_expiry_stop(struct cerb__serve_expiry *e)
{
    if (e->started) {
        if (pthread_mutex_lock(&e->mu) != 0)
            abort();
        e->stop = true;
        pthread_cond_signal(&e->wake);
        if (pthread_mutex_unlock(&e->mu) != 0)
            abort();
        if (pthread_join(e->thread, NULL) != 0)
            abort();
        e->started = false;
    }
    if (pthread_cond_destroy(&e->wake) != 0 || pthread_mutex_destroy(&e->mu) != 0)
        abort();
}
