/*
 * sync.c — pthread wrappers: monotonic condvars, abort on impossible errors.
 * Deadlines are on cerb_monotime() (CLOCK_BOOTTIME, clock.c); a condvar
 * cannot wait on that clock, so each timed wait converts what is left of the
 * deadline to an absolute CLOCK_MONOTONIC time.
 */
#include "internal_posix.h"

#include "sync.h"

#include "clock.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "cerberus: %s failed: %d\n", what, rc);
        abort();
    }
}

void cerb__mutex_init(cerb_mutex *m) { check(pthread_mutex_init(&m->m, NULL), "mutex_init"); }
void cerb__mutex_destroy(cerb_mutex *m) { check(pthread_mutex_destroy(&m->m), "mutex_destroy"); }
void cerb__mutex_lock(cerb_mutex *m) { check(pthread_mutex_lock(&m->m), "mutex_lock"); }
void cerb__mutex_unlock(cerb_mutex *m) { check(pthread_mutex_unlock(&m->m), "mutex_unlock"); }

void cerb__cond_init(cerb_cond *c)
{
    pthread_condattr_t a;
    check(pthread_condattr_init(&a), "condattr_init");
    check(pthread_condattr_setclock(&a, CLOCK_MONOTONIC), "condattr_setclock");
    check(pthread_cond_init(&c->c, &a), "cond_init");
    pthread_condattr_destroy(&a);
}

void cerb__cond_destroy(cerb_cond *c) { check(pthread_cond_destroy(&c->c), "cond_destroy"); }
void cerb__cond_signal(cerb_cond *c) { check(pthread_cond_signal(&c->c), "cond_signal"); }
void cerb__cond_broadcast(cerb_cond *c) { check(pthread_cond_broadcast(&c->c), "cond_broadcast"); }
void cerb__cond_wait(cerb_cond *c, cerb_mutex *m) { check(pthread_cond_wait(&c->c, &m->m), "cond_wait"); }

int cerb__cond_wait_until(cerb_cond *c, cerb_mutex *m, int64_t deadline_ns)
{
    if (deadline_ns == CERB_DEADLINE_NEVER) {
        cerb__cond_wait(c, m);
        return 0;
    }
    /* The deadline is on cerb_monotime() (boot time), the condvar on
     * CLOCK_MONOTONIC: wait for what is left, measured now. A suspend
     * during the wait ends it at most this one wait late; the caller
     * re-reads the clock. */
    int64_t left = deadline_ns - cerb_monotime();
    if (left <= 0)
        return 1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t mono = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    int64_t until = mono > INT64_MAX - left ? INT64_MAX : mono + left;
    struct timespec ts = {until / 1000000000, until % 1000000000};
    int rc = pthread_cond_timedwait(&c->c, &m->m, &ts);
    if (rc == ETIMEDOUT)
        return 1;
    check(rc, "cond_timedwait");
    return 0;
}

static atomic_uint_fast64_t next_thread_id = 1;
static _Thread_local uint64_t my_thread_id;

uint64_t cerb__thread_id(void)
{
    if (my_thread_id == 0)
        my_thread_id = atomic_fetch_add(&next_thread_id, 1);
    return my_thread_id;
}
