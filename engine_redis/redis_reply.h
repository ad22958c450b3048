/*
 * redis_reply.h — what each reply of the Redis engine's scripts and commands
 * means, as pure functions of the redisReply (redis_reply.c).
 *
 * The operations in redis_scripts.c and redis_wait.c send a request, read
 * the reply and hand it here; nothing here does I/O or reads the clock, so
 * every reading can be unit-tested and fuzzed on replies built from bytes
 * (hiredis' redisReader), without a server. `where` ("host:port") only
 * goes into messages. A reply of the wrong shape or an error reply goes
 * through cerb__redis_fail(), which sets *oc (when not NULL) and the last
 * error; a NOSCRIPT reply has been dealt with before (redis_scripts.c).
 * The reply is borrowed, never freed here.
 */
#ifndef CERB_REDIS_REPLY_H
#define CERB_REDIS_REPLY_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

/* What one run of the acquire script said. */
struct redis_acquire_result {
    bool granted;
    uint64_t fence;  /* granted */
    int64_t pttl;    /* not granted: the holder's remaining lease, -1 = none */
    bool head;       /* not granted, queued: we are the live head */
    bool handed;     /* not granted: this run handed the lock to the head */
};

/* acquire: a fence (integer) = granted; {0, PTTL, head, handed} = busy. */
cerb_status cerb__redis_reply_acquire(const char *where, const redisReply *r,
                                      struct redis_acquire_result *res, cerb_outcome *oc);
/* release: a REDIS_REL_* code (0..3) in *code. */
cerb_status cerb__redis_reply_release(const char *where, const redisReply *r, int *code,
                                      cerb_outcome *oc);
/* renew: the fence; CERB_NOT_OWNER (no message set: the caller names the
 * key) when the script answered -1. */
cerb_status cerb__redis_reply_renew(const char *where, const redisReply *r, uint64_t *fence,
                                    cerb_outcome *oc);
/* check: {fence, PTTL}; *ttl_ms 0 for a key without expiry. CERB_NOT_OWNER
 * (no message set) for {-1, 0}. */
cerb_status cerb__redis_reply_check(const char *where, const redisReply *r, uint64_t *fence,
                                    int64_t *ttl_ms, cerb_outcome *oc);
/* EXISTS of the lock key: CERB_BUSY (held by anyone), CERB_OK (free). */
cerb_status cerb__redis_reply_held(const char *where, const redisReply *r);
/* The probe's pipeline: acquire, release, PEXPIRE; any readable answer of
 * each is a healthy lock path. */
cerb_status cerb__redis_reply_probe(const char *where, const redisReply *const r[3],
                                    cerb_outcome *oc);

/* A BLPOP answer on a waiter's wake list. */
enum redis_wake {
    REDIS_WAKE_TIMEOUT, /* nil: BLPOP timed out */
    REDIS_WAKE_HANDOFF, /* "f<fence>": the lock was handed to us; *fence */
    REDIS_WAKE_AGAIN,   /* "w" or anything else: look again */
    REDIS_WAKE_BAD      /* not a BLPOP answer: cerb__redis_fail it */
};
enum redis_wake cerb__redis_reply_wake(const redisReply *r, uint64_t *fence);

#endif
