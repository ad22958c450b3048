/*
 * redis_replies.c — the reading of each script's answer (redis_replies.h).
 *
 * Kept apart from the code that sends the scripts so that every shape a
 * server can send reaches these functions in the fuzz harness, and so that
 * one rule holds everywhere: a number becomes a fence only when it is one
 * (1 ≤ f < 2^48). The scripts make fences from the server's clock or a
 * counter above it, so a 0, a negative or a 49-bit number is not a fence
 * but a foreign or damaged answer.
 */
#include "redis_replies.h"

#include <stdbool.h>
#include <string.h>

#include "redis_marker.h"

#define FENCE_LIMIT (UINT64_C(1) << 48)

static bool is_fence(long long v) { return v > 0 && (uint64_t)v < FENCE_LIMIT; }

static bool all_integers(const redisReply *r, size_t n)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!r->element[i] || r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    return true;
}

enum redis_read cerb__redis_read_acquire(const redisReply *r, struct redis_acquire_result *res)
{
    memset(res, 0, sizeof *res);
    if (cerb__redis_is_lost(r))
        return REDIS_READ_LOST;
    if (r->type == REDIS_REPLY_INTEGER) {
        if (!is_fence(r->integer))
            return REDIS_READ_BAD;
        res->granted = true;
        res->fence = (uint64_t)r->integer;
        return REDIS_READ_YES;
    }
    /* Cluster mode adds the waiter behind the head, to the head. */
    const redisReply *next = NULL;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 6 && r->element[5] &&
        r->element[5]->type == REDIS_REPLY_STRING && r->element[5]->len < sizeof res->next) {
        next = r->element[5];
        for (size_t i = 0; i < 5; i++)
            if (!r->element[i] || r->element[i]->type != REDIS_REPLY_INTEGER)
                return REDIS_READ_BAD;
        if (r->element[0]->integer != 0)
            return REDIS_READ_BAD;
    } else if (!all_integers(r, 5) || r->element[0]->integer != 0) {
        return REDIS_READ_BAD;
    }
    for (size_t i = 2; i < 5; i++)
        if (r->element[i]->integer != 0 && r->element[i]->integer != 1)
            return REDIS_READ_BAD;
    res->pttl = r->element[1]->integer;
    res->head = r->element[2]->integer == 1;
    res->handed = r->element[3]->integer == 1;
    res->quarantine = r->element[4]->integer == 1;
    if (next) {
        memcpy(res->next, next->str, next->len);
        res->next[next->len] = '\0';
    }
    return REDIS_READ_NO;
}

enum redis_read cerb__redis_read_release(const redisReply *r, int *code)
{
    *code = REDIS_REL_NOT_OWNER;
    if (cerb__redis_is_lost(r))
        return REDIS_READ_LOST;
    if (r->type != REDIS_REPLY_INTEGER || r->integer < REDIS_REL_NOT_OWNER ||
        r->integer > REDIS_REL_WOKE)
        return REDIS_READ_BAD;
    *code = (int)r->integer;
    return REDIS_READ_YES;
}

enum redis_read cerb__redis_read_renew(const redisReply *r, uint64_t *fence)
{
    *fence = 0;
    if (cerb__redis_is_lost(r))
        return REDIS_READ_LOST;
    if (r->type != REDIS_REPLY_INTEGER)
        return REDIS_READ_BAD;
    if (r->integer == -1)
        return REDIS_READ_NO;
    if (r->integer != 0 && !is_fence(r->integer))
        return REDIS_READ_BAD;
    *fence = (uint64_t)r->integer;
    return REDIS_READ_YES;
}

enum redis_read cerb__redis_read_check(const redisReply *r, uint64_t *fence, int64_t *ttl_ms)
{
    *fence = 0;
    *ttl_ms = 0;
    if (cerb__redis_is_lost(r))
        return REDIS_READ_LOST;
    if (!all_integers(r, 2))
        return REDIS_READ_BAD;
    long long f = r->element[0]->integer, pttl = r->element[1]->integer;
    if (f == -1)
        return REDIS_READ_NO;
    if (!is_fence(f) || pttl < -1)
        return REDIS_READ_BAD;
    *fence = (uint64_t)f;
    /* PTTL 0 is a key in its last millisecond, not "no expiry". */
    *ttl_ms = pttl > 0 ? pttl : pttl == 0 ? 1 : 0;
    return REDIS_READ_YES;
}

enum redis_read cerb__redis_read_wake(const char *v, size_t len, uint64_t *fence)
{
    *fence = 0;
    if (len == 1 && v[0] == 'w')
        return REDIS_READ_NO;
    /* Canonical only, as the scripts write it ("f%d"): no sign, no
     * leading zero — "f081" is not the hand-off of fence 81. */
    if (len < 2 || len > 20 || v[0] != 'f' || v[1] == '0')
        return REDIS_READ_BAD;
    uint64_t f = 0;
    for (size_t i = 1; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return REDIS_READ_BAD;
        f = f * 10 + (uint64_t)(v[i] - '0');
        if (f >= FENCE_LIMIT)
            return REDIS_READ_BAD;
    }
    if (f == 0)
        return REDIS_READ_BAD;
    *fence = f;
    return REDIS_READ_YES;
}
