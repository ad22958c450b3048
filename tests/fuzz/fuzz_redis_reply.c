/*
 * fuzz_redis_reply.c — libFuzzer harness of how the Redis engine reads its
 * replies (engine_redis/redis_reply.c).
 *
 * The input is a byte stream as a server would send it (RESP2). hiredis'
 * own reader (redisReaderCreate/Feed/GetReply, the parser the engine's
 * connections use) turns it into replies, and every reply goes through the
 * reading of every script and command: acquire, release, renew, check,
 * EXISTS (held), the BLPOP of a waiter, and — three replies at a time — the
 * probe's pipeline.
 *
 * Properties, for every reply:
 *  - no crash, undefined behaviour or leak;
 *  - an error reply is never success, and its outcome is NO (a script that
 *    raised an error did not write: DESIGN.md, engine.h);
 *  - any other reply a reading refuses is CERB_EPROTO with outcome UNKNOWN
 *    (it ran; the core must settle it), and has a message;
 *  - a success has the documented shape: release codes 0..3, a check's
 *    ttl >= 0, a grant only from an integer, held only BUSY or OK.
 */
#include "internal_posix.h"

#include <hiredis/hiredis.h>

#include "fuzz.h"
#include "redis_errors.h"
#include "redis_reply.h"

#define WHERE "127.0.0.1:6379"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/* {0|n, PTTL, head, handed}: the acquire script's "busy" answer shape. */
static bool busy_shape(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4)
        return false;
    for (size_t i = 0; i < 4; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    return true;
}

/* The rule for a refused reply r (status st, outcome oc). */
static void refused(const redisReply *r, cerb_status st, cerb_outcome oc, const char *what)
{
    FUZZ_CHECK(st != CERB_OK, "%s", what);
    FUZZ_CHECK(cerb_last_error()[0] != '\0', "%s: refused without a message", what);
    if (r->type == REDIS_REPLY_ERROR) {
        FUZZ_CHECK(st == CERB_EPROTO || st == CERB_EIO, "%s: error reply gave %s", what,
                   cerb_status_name(st));
        FUZZ_CHECK(oc == CERB_OUTCOME_NO, "%s: an error reply must be outcome NO", what);
    } else {
        FUZZ_CHECK(st == CERB_EPROTO, "%s: bad shape gave %s", what, cerb_status_name(st));
        FUZZ_CHECK(oc == CERB_OUTCOME_UNKNOWN, "%s: a bad shape must be outcome UNKNOWN", what);
    }
}

static void one(const redisReply *r)
{
    cerb_outcome oc;
    cerb_status st;

    struct redis_acquire_result res;
    memset(&res, 0, sizeof res);
    oc = CERB_OUTCOME_NO;
    st = cerb__redis_reply_acquire(WHERE, r, &res, &oc);
    if (st == CERB_OK)
        FUZZ_CHECK(res.granted == (r->type == REDIS_REPLY_INTEGER),
                   "acquire: granted from a non-integer, or busy from an integer");
    else
        refused(r, st, oc, "acquire");

    int code = -1;
    oc = CERB_OUTCOME_NO;
    st = cerb__redis_reply_release(WHERE, r, &code, &oc);
    if (st == CERB_OK)
        FUZZ_CHECK(code >= 0 && code <= 3, "release: code %d", code);
    else
        refused(r, st, oc, "release");

    uint64_t fence = 0;
    oc = CERB_OUTCOME_NO;
    st = cerb__redis_reply_renew(WHERE, r, &fence, &oc);
    if (st == CERB_NOT_OWNER)
        FUZZ_CHECK(r->type == REDIS_REPLY_INTEGER && r->integer < 0, "renew: NOT_OWNER");
    else if (st != CERB_OK)
        refused(r, st, oc, "renew");

    int64_t ttl = -1;
    oc = CERB_OUTCOME_NO;
    st = cerb__redis_reply_check(WHERE, r, &fence, &ttl, &oc);
    if (st == CERB_OK)
        FUZZ_CHECK(ttl >= 0, "check: ttl %lld", (long long)ttl);
    else if (st != CERB_NOT_OWNER)
        refused(r, st, oc, "check");

    st = cerb__redis_reply_held(WHERE, r);
    if (r->type == REDIS_REPLY_INTEGER)
        FUZZ_CHECK(st == CERB_OK || st == CERB_BUSY, "held: %s", cerb_status_name(st));
    else
        FUZZ_CHECK(st == CERB_EPROTO || st == CERB_EIO, "held: %s", cerb_status_name(st));

    enum redis_wake w = cerb__redis_reply_wake(r, &fence);
    FUZZ_CHECK(w == REDIS_WAKE_TIMEOUT || w == REDIS_WAKE_HANDOFF || w == REDIS_WAKE_AGAIN ||
                   w == REDIS_WAKE_BAD,
               "wake: %d", (int)w);
    if (w == REDIS_WAKE_BAD) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        st = cerb__redis_fail(WHERE, "BLPOP", &f, &oc);
        refused(r, st, oc, "BLPOP");
    }
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (huge_header(data, size))
        return 0;
    redisReader *rd = redisReaderCreate();
    redisReply *win[3] = {NULL, NULL, NULL};
    size_t got = 0;

    if (!rd)
        abort();
    if (redisReaderFeed(rd, (const char *)data, size) != REDIS_OK) {
        redisReaderFree(rd);
        return 0;
    }
    /* At most 64 replies per input keeps one input fast. */
    for (int i = 0; i < 64; i++) {
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) != REDIS_OK || !reply)
            break;
        redisReply *r = reply;
        one(r);
        /* The probe reads three replies of one pipeline. */
        if (got == 3) {
            freeReplyObject(win[0]);
            win[0] = win[1];
            win[1] = win[2];
            got = 2;
        }
        win[got++] = r;
        if (got == 3) {
            cerb_outcome oc = CERB_OUTCOME_NO;
            cerb_status st = cerb__redis_reply_probe(WHERE, (const redisReply *const *)win, &oc);
            if (st != CERB_OK) {
                const redisReply *bad = win[0];
                for (int k = 0; k < 3; k++) {
                    bool ok = win[k]->type == REDIS_REPLY_INTEGER || (k == 0 && busy_shape(win[0]));
                    if (!ok) {
                        bad = win[k];
                        break;
                    }
                }
                refused(bad, st, oc, "probe");
            }
        }
    }
    for (size_t k = 0; k < got; k++)
        freeReplyObject(win[k]);
    redisReaderFree(rd);
    return 0;
}
