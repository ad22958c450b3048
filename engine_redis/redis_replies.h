/*
 * redis_replies.h — what each of the engine's scripts answered, read from
 * the reply alone: pure functions of a hiredis reply (or a wake message),
 * no connection, no engine, no I/O, so the fuzz harness can hand them any
 * reply a server might send (tests/fuzz/fuzz_redis_reply.c).
 *
 * Each returns one verdict. YES and NO are the script's own answers; LOST
 * is its "L" (the data-loss marker moved: nothing changed); BAD is anything
 * the script never answers, which the caller reports as a protocol error
 * with an UNKNOWN outcome (the script ran; what it did must be re-checked).
 * A fence read as YES is always in [1, 2^48): a reply that would make a
 * token of 0, or spill into the epoch bits, is BAD, not a grant.
 */
#ifndef CERB_REDIS_REPLIES_H
#define CERB_REDIS_REPLIES_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "redis_scripts.h"

enum redis_read {
    REDIS_READ_YES,  /* granted, released (code), renewed, held by us */
    REDIS_READ_NO,   /* busy (acquire), not the owner (renew, check) */
    REDIS_READ_LOST, /* "L" */
    REDIS_READ_BAD   /* not an answer of this script */
};

/* acquire: YES = granted (res->fence); NO = not granted (res->pttl, head,
 * handed, quarantine). */
enum redis_read cerb__redis_read_acquire(const redisReply *r, struct redis_acquire_result *res);
/* release: YES with *code one of REDIS_REL_*. */
enum redis_read cerb__redis_read_release(const redisReply *r, int *code);
/* renew: YES (*fence, 0 when the counter had expired), NO = not the owner. */
enum redis_read cerb__redis_read_renew(const redisReply *r, uint64_t *fence);
/* check: YES (*fence; *ttl_ms: PTTL > 0 as is, 0 → 1 ms, -1 → 0 = no
 * expiry), NO = not the owner. */
enum redis_read cerb__redis_read_check(const redisReply *r, uint64_t *fence, int64_t *ttl_ms);
/* A wake list's message: "f<fence>" is a hand-off (YES, *fence); "w" a
 * nudge to look again (NO); anything else BAD (the caller looks again, as
 * for a nudge: a wake message grants nothing by itself unless it is a
 * well-formed hand-off). */
enum redis_read cerb__redis_read_wake(const char *v, size_t len, uint64_t *fence);

#endif
