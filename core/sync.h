/*
 * sync.h — mutexes and condition variables that cannot fail silently and
 * wait on the monotonic clock. Impossible pthread errors abort: a corrupted
 * mutex is not a condition a lock library can report and carry on from.
 */
#ifndef CERB_SYNC_H
#define CERB_SYNC_H

#include <pthread.h>
#include <stdint.h>

typedef struct cerb_mutex { pthread_mutex_t m; } cerb_mutex;
typedef struct cerb_cond { pthread_cond_t c; } cerb_cond;

void cerb__mutex_init(cerb_mutex *m);
void cerb__mutex_destroy(cerb_mutex *m);
void cerb__mutex_lock(cerb_mutex *m);
void cerb__mutex_unlock(cerb_mutex *m);

/* Condition variable on CLOCK_MONOTONIC. */
void cerb__cond_init(cerb_cond *c);
void cerb__cond_destroy(cerb_cond *c);
void cerb__cond_signal(cerb_cond *c);
void cerb__cond_broadcast(cerb_cond *c);
void cerb__cond_wait(cerb_cond *c, cerb_mutex *m);
/* Wait until signalled or deadline (cerb_monotime ns — boot time, converted
 * to CLOCK_MONOTONIC for the wait —, CERB_DEADLINE_NEVER
 * waits without limit). Returns 0 when signalled (or spuriously), 1 when the
 * deadline has passed. */
int cerb__cond_wait_until(cerb_cond *c, cerb_mutex *m, int64_t deadline_ns);

/* Small numeric id of the calling thread, stable for its life, never 0. */
uint64_t cerb__thread_id(void);

#endif
