/*
 * redis_reply.c — reading the replies of the Redis engine's scripts and
 * commands (see redis_reply.h for each shape).
 *
 * Kept apart from the code that sends the requests so that each reading is
 * a pure function of the reply: the fuzz harness tests/fuzz/fuzz_redis_reply.c
 * feeds it every reply hiredis' parser can produce from arbitrary bytes.
 * The rule for anything unexpected is cerb__redis_fail's: an error reply
 * means the script did not write (outcome NO), any other reply of the wrong
 * shape means it ran and we cannot tell what it did (outcome UNKNOWN).
 */
#include "internal_posix.h"

#include "redis_reply.h"

#include <stdlib.h>

#include "redis_errors.h"

static cerb_status bad_reply(const char *where, const char *what, const redisReply *r,
                             cerb_outcome *oc)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(where, what, &f, oc);
}

static bool all_integers(const redisReply *r, size_t n)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    return true;
}

cerb_status cerb__redis_reply_acquire(const char *where, const redisReply *r,
                                      struct redis_acquire_result *res, cerb_outcome *oc)
{
    if (r->type == REDIS_REPLY_INTEGER) {
        res->granted = true;
        res->fence = (uint64_t)r->integer;
        return CERB_OK;
    }
    if (all_integers(r, 4) && r->element[0]->integer == 0) {
        res->pttl = r->element[1]->integer;
        res->head = r->element[2]->integer == 1;
        res->handed = r->element[3]->integer == 1;
        return CERB_OK;
    }
    return bad_reply(where, "acquire", r, oc);
}

cerb_status cerb__redis_reply_release(const char *where, const redisReply *r, int *code,
                                      cerb_outcome *oc)
{
    if (r->type != REDIS_REPLY_INTEGER || r->integer < 0 || r->integer > 3)
        return bad_reply(where, "release", r, oc);
    *code = (int)r->integer;
    return CERB_OK;
}

cerb_status cerb__redis_reply_renew(const char *where, const redisReply *r, uint64_t *fence,
                                    cerb_outcome *oc)
{
    if (r->type != REDIS_REPLY_INTEGER)
        return bad_reply(where, "renew", r, oc);
    if (r->integer < 0)
        return CERB_NOT_OWNER;
    *fence = (uint64_t)r->integer;
    return CERB_OK;
}

cerb_status cerb__redis_reply_check(const char *where, const redisReply *r, uint64_t *fence,
                                    int64_t *ttl_ms, cerb_outcome *oc)
{
    if (!all_integers(r, 2))
        return bad_reply(where, "check", r, oc);
    if (r->element[0]->integer < 0)
        return CERB_NOT_OWNER;
    *fence = (uint64_t)r->element[0]->integer;
    /* A key without expiry (PTTL -1) is held until deleted. */
    *ttl_ms = r->element[1]->integer > 0 ? r->element[1]->integer : 0;
    return CERB_OK;
}

cerb_status cerb__redis_reply_held(const char *where, const redisReply *r)
{
    if (r->type != REDIS_REPLY_INTEGER)
        return bad_reply(where, "EXISTS", r, NULL);
    return r->integer ? CERB_BUSY : CERB_OK;
}

cerb_status cerb__redis_reply_probe(const char *where, const redisReply *const r[3],
                                    cerb_outcome *oc)
{
    static const char *const what[3] = {"probe acquire", "probe release", "probe PEXPIRE"};

    for (int i = 0; i < 3; i++) {
        bool ok = r[i]->type == REDIS_REPLY_INTEGER || (i == 0 && all_integers(r[0], 4));
        if (!ok)
            return bad_reply(where, what[i], r[i], oc);
    }
    return CERB_OK;
}

enum redis_wake cerb__redis_reply_wake(const redisReply *r, uint64_t *fence)
{
    if (r->type == REDIS_REPLY_NIL)
        return REDIS_WAKE_TIMEOUT;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return REDIS_WAKE_BAD;
    const char *v = r->element[1]->str;
    if (v[0] != 'f')
        return REDIS_WAKE_AGAIN;
    *fence = strtoull(v + 1, NULL, 10);
    return REDIS_WAKE_HANDOFF;
}
