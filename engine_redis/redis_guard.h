/*
 * redis_guard.h — the redis engine's idempotency-guard methods
 * (redis_guard.c; contracts in engine.h, version 2).
 */
#ifndef CERB_REDIS_GUARD_H
#define CERB_REDIS_GUARD_H

#include <stddef.h>

#include "engine.h"

cerb_status cerb__redis_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                    void **result, size_t *result_len);
cerb_status cerb__redis_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g);
cerb_status cerb__redis_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                     const void *result, size_t len, int64_t keep_ms,
                                     cerb_outcome *oc);
cerb_status cerb__redis_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                    cerb_guard_found *found);
/* The record's key, `<prefix>cerb:guard:{<id>}` and the byte 0x1f, into buf
 * (cluster routing: every step's keys are in its slot, redis_guard.c). */
cerb_status cerb__redis_guard_key(cerb_engine *e, const cerb_guard_rec *rec, char *buf, size_t n,
                                  size_t *len);

#endif
