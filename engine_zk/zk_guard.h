/*
 * zk_guard.h — the zk engine's idempotency-guard records (cerb_engine_ops
 * version 2, DESIGN.md §11); the algorithm is described in zk_guard.c.
 */
#ifndef CERB_ZK_GUARD_H
#define CERB_ZK_GUARD_H

#include "engine.h"

/*
 * The largest guard.max_result this engine accepts. A record's data and
 * the transaction that writes it (paths, the record's header, the token
 * node's operation) must fit in one request of at most jute.maxbuffer
 * bytes, 1 MiB - 1 by default on server and client; 16 KiB of it is kept
 * for the rest of the request.
 */
#define ZK_GUARD_RESULT_MAX (1024 * 1024 - 16 * 1024)

/* Next to the root, like the fence offset (zk_fence.c): the records' base
 * "<parent of zk.root>/guard" and the clock node "<...>/guard-clock". */
#define ZK_GUARD_NODE "guard"
#define ZK_GUARD_CLOCK_NODE "guard-clock"

/* At open: the paths, and a guard.max_result the engine cannot store is
 * refused (CERB_ECONFIG with the limit in the message). */
cerb_status cerb__zk_guard_init(cerb_engine *e);
/* At close, before the session stops: stop the sweeper, free. */
void cerb__zk_guard_free(cerb_engine *e);

cerb_status cerb__zk_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                 void **result, size_t *result_len);
cerb_status cerb__zk_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g);
cerb_status cerb__zk_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int succeeded,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *oc);
cerb_status cerb__zk_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                 cerb_guard_found *found);

/* The sweeper's passes done so far, how many times it listed the scopes
 * (the other passes read on from an earlier listing), and how many times
 * it listed one scope again for the rest of a backlog. For tests. */
void cerb__zk_guard_sweep_counts(cerb_engine *e, uint64_t *passes, uint64_t *listings,
                                 uint64_t *relists);
/* For tests, before the first begin: how long a listing serves the passes
 * after it (ms), and how many names of a scope it keeps; 0 keeps one. */
void cerb__zk_guard_sweep_tune(cerb_engine *e, int64_t fresh_ms, size_t window);

#endif
