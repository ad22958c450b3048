/*
 * engine_local.h — what engine_local.c (locks, the ops table) and
 * engine_local_guard.c (the guard's records) share. Private to core/.
 */
#ifndef CERB_ENGINE_LOCAL_H
#define CERB_ENGINE_LOCAL_H

#include <stddef.h>

#include "engine.h"

/* The engine's local.dir, or NULL in in-process mode. */
const char *cerb__local_dir(const cerb_engine *e);

/* The guard methods of the local engine's table. */
cerb_status cerb__local_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                    void **result, size_t *len);
cerb_status cerb__local_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g);
cerb_status cerb__local_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                     const void *result, size_t len, int64_t keep_ms,
                                     cerb_outcome *outcome);
cerb_status cerb__local_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                    cerb_guard_found *found);
/* Semaphores and read-write locks (engine_local_queue.c), and the wake-up
 * of their waiters for a cancel. */
extern const struct cerb_queue_methods cerb__local_semaphore;
extern const struct cerb_queue_methods cerb__local_rwlock;
void cerb__local_queue_cancel(const cerb_engine_lock *lk);
/* Live in-process records (for tests that check nothing is left behind). */
size_t cerb__local_guard_count(void);
/* The in-process table's shape, for tests: records stored (expired ones not
 * yet freed included) and buckets, over the whole table. */
void cerb__local_guard_stats(size_t *stored, size_t *buckets);

#endif
