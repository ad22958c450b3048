/*
 * fuzz_redis_reply.c — libFuzzer harness of the Redis engine's reply
 * handling: hiredis' reader (the parser of the engine's connections) on
 * arbitrary bytes, and the engine's one mapping of a refused reply to a
 * status and an outcome (engine_redis/redis_errors.c: cerb__redis_fail,
 * cerb__redis_is_noscript), applied to every reply under the name of each
 * script and command that can receive it.
 *
 * The input is a byte stream as a server would send it (RESP2); up to 64
 * replies are read from it. Properties, for every reply:
 *  - no crash, undefined behaviour or leak;
 *  - NOSCRIPT is recognised exactly for error replies whose text is the
 *    word NOSCRIPT (alone or followed by a space);
 *  - a refused reply is never success: an error reply gives EIO or EPROTO,
 *    any other reply EPROTO with outcome UNKNOWN (it ran; the core must
 *    settle it); the last error names the server and what was asked.
 *  - the reading of each script's answer (engine_redis/redis_replies.c:
 *    acquire, release, renew, check, and a wake list's message as BLPOP
 *    returns it) says "lost" exactly for the marker's "L"; a grant, a
 *    renewal or a check that it accepts carries a fence in [1, 2^48) (never
 *    a token of 0, never a carry into the epoch bits) and a TTL ≥ 0; a
 *    release code is one the script has; a hand-off read from a wake
 *    message is exactly "f" and the decimal digits of that fence.
 */
#include "internal_posix.h"

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "redis_errors.h"
#include "redis_marker.h"
#include "redis_replies.h"

#define WHERE "127.0.0.1:6379"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/*
 * Does the input declare an array or bulk string of a million entries or
 * more? hiredis 0.14 allocates what the header says before it reads the
 * rest (an array of 4e10 elements asks for 320 GB), which libFuzzer
 * reports as out-of-memory; that is hiredis' business with a server we
 * trust, not a reading of ours, so such inputs are skipped.
 */
static bool huge_header(const uint8_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (d[i] != '*' && d[i] != '$')
            continue;
        size_t j = i + 1, digits = 0;
        if (j < n && d[j] == '-')
            j++;
        while (j < n && d[j] >= '0' && d[j] <= '9')
            j++, digits++;
        if (digits >= 7)
            return true;
    }
    return false;
}

#define FENCE_LIMIT (UINT64_C(1) << 48)

static void readers(const redisReply *r)
{
    bool lost = cerb__redis_is_lost(r);
    struct redis_acquire_result ar;
    enum redis_read v = cerb__redis_read_acquire(r, &ar);
    FUZZ_CHECK((v == REDIS_READ_LOST) == lost, "acquire: \"lost\" misread");
    FUZZ_CHECK(ar.granted == (v == REDIS_READ_YES), "acquire: granted without a YES");
    if (v == REDIS_READ_YES)
        FUZZ_CHECK(ar.fence > 0 && ar.fence < FENCE_LIMIT, "acquire: fence %llu",
                   (unsigned long long)ar.fence);

    int code = -1;
    v = cerb__redis_read_release(r, &code);
    FUZZ_CHECK((v == REDIS_READ_LOST) == lost, "release: \"lost\" misread");
    FUZZ_CHECK(v != REDIS_READ_NO, "release: answers a code, never NO");
    if (v == REDIS_READ_YES)
        FUZZ_CHECK(code >= REDIS_REL_NOT_OWNER && code <= REDIS_REL_WOKE, "release: code %d", code);

    uint64_t fence = 1;
    v = cerb__redis_read_renew(r, &fence);
    FUZZ_CHECK((v == REDIS_READ_LOST) == lost, "renew: \"lost\" misread");
    FUZZ_CHECK(fence < FENCE_LIMIT && (v == REDIS_READ_YES || fence == 0),
               "renew: fence %llu", (unsigned long long)fence);

    int64_t ttl = -5;
    v = cerb__redis_read_check(r, &fence, &ttl);
    FUZZ_CHECK((v == REDIS_READ_LOST) == lost, "check: \"lost\" misread");
    if (v == REDIS_READ_YES)
        FUZZ_CHECK(fence > 0 && fence < FENCE_LIMIT && ttl >= 0, "check: fence %llu ttl %lld",
                   (unsigned long long)fence, (long long)ttl);

    if (r->type == REDIS_REPLY_STRING) {
        v = cerb__redis_read_wake(r->str, r->len, &fence);
        if (v == REDIS_READ_YES) {
            char want[32];
            int n = snprintf(want, sizeof want, "f%llu", (unsigned long long)fence);
            FUZZ_CHECK(fence > 0 && fence < FENCE_LIMIT && (size_t)n == r->len &&
                           memcmp(want, r->str, r->len) == 0,
                       "wake: \"%.*s\" read as hand-off %llu", (int)r->len, r->str,
                       (unsigned long long)fence);
        } else {
            FUZZ_CHECK(fence == 0, "wake: a fence without a hand-off");
        }
    }
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        if (r->element[i])
            readers(r->element[i]);
}

static void one(const redisReply *r)
{
    readers(r);
    static const char *const what[] = {"acquire", "release", "renew", "check",
                                       "EXISTS",  "BLPOP",   "probe acquire"};
    bool is_err = r->type == REDIS_REPLY_ERROR;
    bool noscript = is_err && r->len >= 8 && memcmp(r->str, "NOSCRIPT", 8) == 0 &&
                    (r->len == 8 || r->str[8] == ' ');

    FUZZ_CHECK(!!cerb__redis_is_noscript(r) == noscript, "NOSCRIPT recognised wrongly");
    for (size_t i = 0; i < sizeof what / sizeof *what; i++) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        cerb_outcome oc = CERB_OUTCOME_NO;
        cerb_status st = cerb__redis_fail(WHERE, what[i], &f, &oc);
        FUZZ_CHECK(st != CERB_OK, "%s: a refused reply became success", what[i]);
        if (is_err) {
            FUZZ_CHECK(st == CERB_EIO || st == CERB_EPROTO, "%s: error reply gave %s", what[i],
                       cerb_status_name(st));
        } else {
            FUZZ_CHECK(st == CERB_EPROTO, "%s: bad shape gave %s", what[i], cerb_status_name(st));
            FUZZ_CHECK(oc == CERB_OUTCOME_UNKNOWN, "%s: a bad shape must be outcome UNKNOWN",
                       what[i]);
        }
        const char *msg = cerb_last_error();
        FUZZ_CHECK(strstr(msg, WHERE) && strstr(msg, what[i]),
                   "%s: the message names neither server nor request: %s", what[i], msg);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (huge_header(data, size))
        return 0;
    redisReader *rd = redisReaderCreate();
    if (!rd)
        abort();
    if (redisReaderFeed(rd, (const char *)data, size) == REDIS_OK) {
        for (int i = 0; i < 64; i++) {
            void *reply = NULL;
            if (redisReaderGetReply(rd, &reply) != REDIS_OK || !reply)
                break;
            one(reply);
            freeReplyObject(reply);
        }
    }
    redisReaderFree(rd);
    return 0;
}
