/*
 * test_redis_reply.c — how the Redis engine reads each reply
 * (engine_redis/redis_reply.c), one case per shape, on replies built from
 * RESP bytes with hiredis' own reader: the scripts' answers (acquire grant
 * and busy, release codes, renew and check with "not owner"), EXISTS, a
 * waiter's BLPOP (timeout, hand-off with its fence, wake-up), the probe's
 * pipeline, and the two ways a reply is refused — an error reply (outcome
 * NO: the script did not write; EIO for a server that cannot serve now,
 * EPROTO otherwise) and a reply of the wrong shape (EPROTO, outcome
 * UNKNOWN). tests/fuzz/fuzz_redis_reply.c checks the same rules on every
 * reply a fuzzer can build. No server is used (it sits with the redis
 * suites because it needs the engine built).
 */
#include "internal_posix.h"

#include <hiredis/hiredis.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "redis_reply.h"

#define WHERE "127.0.0.1:6379"

/* One reply from RESP text (freed by the caller with freeReplyObject). */
static redisReply *reply(const char *resp)
{
    redisReader *rd = redisReaderCreate();
    void *r = NULL;
    assert_non_null(rd);
    assert_int_equal(redisReaderFeed(rd, resp, strlen(resp)), REDIS_OK);
    assert_int_equal(redisReaderGetReply(rd, &r), REDIS_OK);
    assert_non_null(r);
    redisReaderFree(rd);
    return r;
}

static void test_acquire(void **state)
{
    (void)state;
    struct redis_acquire_result res;
    cerb_outcome oc = CERB_OUTCOME_NO;

    redisReply *r = reply(":281474976710655\r\n");
    memset(&res, 0, sizeof res);
    assert_int_equal(cerb__redis_reply_acquire(WHERE, r, &res, &oc), CERB_OK);
    assert_true(res.granted);
    assert_true(res.fence == UINT64_C(281474976710655));
    freeReplyObject(r);

    r = reply("*4\r\n:0\r\n:1800\r\n:1\r\n:0\r\n");
    memset(&res, 0, sizeof res);
    assert_int_equal(cerb__redis_reply_acquire(WHERE, r, &res, &oc), CERB_OK);
    assert_false(res.granted);
    assert_int_equal(res.pttl, 1800);
    assert_true(res.head);
    assert_false(res.handed);
    freeReplyObject(r);

    /* {1, ...} is not the busy answer. */
    r = reply("*4\r\n:1\r\n:1800\r\n:1\r\n:0\r\n");
    assert_int_equal(cerb__redis_reply_acquire(WHERE, r, &res, &oc), CERB_EPROTO);
    assert_int_equal(oc, CERB_OUTCOME_UNKNOWN);
    assert_non_null(strstr(cerb_last_error(), "acquire: unexpected array reply"));
    freeReplyObject(r);
}

static void test_error_replies(void **state)
{
    (void)state;
    struct redis_acquire_result res;
    cerb_outcome oc = CERB_OUTCOME_UNKNOWN;

    redisReply *r = reply("-BUSY Redis is busy running a script.\r\n");
    assert_int_equal(cerb__redis_reply_acquire(WHERE, r, &res, &oc), CERB_EIO);
    assert_int_equal(oc, CERB_OUTCOME_NO);
    assert_non_null(strstr(cerb_last_error(), "redis " WHERE ": acquire: BUSY"));
    freeReplyObject(r);

    oc = CERB_OUTCOME_UNKNOWN;
    r = reply("-ERR Error running script: WRONGTYPE\r\n");
    assert_int_equal(cerb__redis_reply_renew(WHERE, r, &(uint64_t){0}, &oc), CERB_EPROTO);
    assert_int_equal(oc, CERB_OUTCOME_NO);
    freeReplyObject(r);
}

static void test_release(void **state)
{
    (void)state;
    cerb_outcome oc = CERB_OUTCOME_NO;
    char buf[16];

    for (int code = 0; code <= 3; code++) {
        int got = -1;
        snprintf(buf, sizeof buf, ":%d\r\n", code);
        redisReply *r = reply(buf);
        assert_int_equal(cerb__redis_reply_release(WHERE, r, &got, &oc), CERB_OK);
        assert_int_equal(got, code);
        freeReplyObject(r);
    }
    redisReply *r = reply(":4\r\n");
    int got = -1;
    assert_int_equal(cerb__redis_reply_release(WHERE, r, &got, &oc), CERB_EPROTO);
    assert_int_equal(oc, CERB_OUTCOME_UNKNOWN);
    assert_int_equal(got, -1);
    freeReplyObject(r);
}

static void test_renew_and_check(void **state)
{
    (void)state;
    cerb_outcome oc = CERB_OUTCOME_NO;
    uint64_t fence = 0;
    int64_t ttl = -5;

    redisReply *r = reply(":17\r\n");
    assert_int_equal(cerb__redis_reply_renew(WHERE, r, &fence, &oc), CERB_OK);
    assert_true(fence == 17);
    freeReplyObject(r);
    r = reply(":-1\r\n");
    assert_int_equal(cerb__redis_reply_renew(WHERE, r, &fence, &oc), CERB_NOT_OWNER);
    freeReplyObject(r);

    r = reply("*2\r\n:9\r\n:900\r\n");
    assert_int_equal(cerb__redis_reply_check(WHERE, r, &fence, &ttl, &oc), CERB_OK);
    assert_true(fence == 9);
    assert_int_equal(ttl, 900);
    freeReplyObject(r);
    r = reply("*2\r\n:9\r\n:-1\r\n"); /* no expiry: held until deleted */
    assert_int_equal(cerb__redis_reply_check(WHERE, r, &fence, &ttl, &oc), CERB_OK);
    assert_int_equal(ttl, 0);
    freeReplyObject(r);
    r = reply("*2\r\n:-1\r\n:0\r\n");
    assert_int_equal(cerb__redis_reply_check(WHERE, r, &fence, &ttl, &oc), CERB_NOT_OWNER);
    freeReplyObject(r);
    r = reply("$-1\r\n");
    assert_int_equal(cerb__redis_reply_check(WHERE, r, &fence, &ttl, &oc), CERB_EPROTO);
    assert_int_equal(oc, CERB_OUTCOME_UNKNOWN);
    freeReplyObject(r);
}

static void test_held(void **state)
{
    (void)state;
    redisReply *r = reply(":1\r\n");
    assert_int_equal(cerb__redis_reply_held(WHERE, r), CERB_BUSY);
    freeReplyObject(r);
    r = reply(":0\r\n");
    assert_int_equal(cerb__redis_reply_held(WHERE, r), CERB_OK);
    freeReplyObject(r);
    r = reply("-LOADING Redis is loading the dataset in memory\r\n");
    assert_int_equal(cerb__redis_reply_held(WHERE, r), CERB_EIO);
    freeReplyObject(r);
}

static void test_wake(void **state)
{
    (void)state;
    uint64_t fence = 0;

    redisReply *r = reply("*-1\r\n");
    assert_int_equal(cerb__redis_reply_wake(r, &fence), REDIS_WAKE_TIMEOUT);
    freeReplyObject(r);
    r = reply("*2\r\n$8\r\n{n}:w:t1\r\n$3\r\nf42\r\n");
    assert_int_equal(cerb__redis_reply_wake(r, &fence), REDIS_WAKE_HANDOFF);
    assert_true(fence == 42);
    freeReplyObject(r);
    r = reply("*2\r\n$8\r\n{n}:w:t1\r\n$1\r\nw\r\n");
    assert_int_equal(cerb__redis_reply_wake(r, &fence), REDIS_WAKE_AGAIN);
    freeReplyObject(r);
    r = reply(":1\r\n");
    assert_int_equal(cerb__redis_reply_wake(r, &fence), REDIS_WAKE_BAD);
    freeReplyObject(r);
}

static void test_probe(void **state)
{
    (void)state;
    cerb_outcome oc = CERB_OUTCOME_NO;
    redisReply *r[3] = {reply("*4\r\n:0\r\n:800\r\n:0\r\n:0\r\n"), reply(":0\r\n"), reply(":1\r\n")};

    assert_int_equal(cerb__redis_reply_probe(WHERE, (const redisReply *const *)r, &oc), CERB_OK);
    freeReplyObject(r[1]);
    r[1] = reply("+OK\r\n");
    assert_int_equal(cerb__redis_reply_probe(WHERE, (const redisReply *const *)r, &oc),
                     CERB_EPROTO);
    assert_non_null(strstr(cerb_last_error(), "probe release"));
    for (int i = 0; i < 3; i++)
        freeReplyObject(r[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire),     cmocka_unit_test(test_error_replies),
        cmocka_unit_test(test_release),     cmocka_unit_test(test_renew_and_check),
        cmocka_unit_test(test_held),        cmocka_unit_test(test_wake),
        cmocka_unit_test(test_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
