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
 * callers hung up while they waited (serve_waits.c). The holds of one tick
 * are released by up to 8 threads at once: a release may wait for the
 * engine's timeout, and one after another they would delay the rest. The guard's open
 * attempts (serve_guard.c) are expired in the same round: one nobody
 * finished nor kept alive within its window is freed, which counts it as
 * failed.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "serve_internal.h"

#define TICK_MS 100
#define BATCH 64
#define FREE_THREADS 8

struct args {
    struct cerb__serve_expiry *e;
    struct cerb__serve_holds *holds;
    struct cerb__serve_waits *waits;
};

/* A batch of holds to free by several threads: each release may wait for
 * the engine's timeout (an engine down), and one after another a batch
 * would keep the next expiries and the hang-up watch waiting N times. */
struct frees {
    cerb_hold **v;
    size_t n;
    atomic_size_t next;
};

static void *free_some(void *ud)
{
    struct frees *f = ud;
    size_t i;

    while ((i = atomic_fetch_add(&f->next, 1)) < f->n)
        cerb_hold_free(f->v[i]); /* releases it first */
    return NULL;
}

/* Frees @n holds with up to FREE_THREADS threads (this one when no thread
 * can be made), and returns once all are freed. */
static void free_batch(cerb_hold **v, size_t n)
{
    struct frees f = {v, n, 0};
    pthread_t th[FREE_THREADS];
    size_t started = 0;

    while (n > 1 && started < FREE_THREADS && started < n &&
           pthread_create(&th[started], NULL, free_some, &f) == 0)
        started++;
    free_some(&f); /* this thread helps (or does it all) */
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

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
            free_batch(batch, n);
        } while (n == BATCH);
        /* The guard's attempts nobody finished nor kept alive: freed, so
         * counted as failed (serve_guard.c). */
        cerb__serve_attempts_expire(&holds->attempts);
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
