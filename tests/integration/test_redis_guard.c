/*
 * test_redis_guard.c — the idempotency guard on a real redis-server: the
 * engine-independent cases (guard_cases.h: races of threads and processes,
 * a SIGKILLed and a SIGSTOPped attempt, keep_ms, result limits, bad input,
 * no records left), and what only redis has: the layout of DESIGN §11
 * (`<prefix>cerb:guard:{<sha256 hex>}`, state and token in the value, PX
 * the record's life, none when kept forever) and the scripts' NOSCRIPT
 * reload. Every client of this run uses its own redis.prefix, so counting
 * the suite's records is exact on a shared server.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <openssl/evp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

static char prefix[64]; /* "gtest<pid>:" — set in main */

static char *guard_cfg(const char *guard_extra)
{
    char re[128], ex[256];
    snprintf(re, sizeof re, "prefix = \"%s\";", prefix);
    snprintf(ex, sizeof ex, "guard = { keep_ms = 4000; %s };", guard_extra ? guard_extra : "");
    return cerb_test_redis_config(re, ex);
}

static redisContext *raw(void)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    assert_non_null(r);
    assert_int_equal(r->err, 0);
    redisSetTimeout(r, tv);
    return r;
}

static size_t guard_records(void)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "KEYS %scerb:guard:*", prefix);
    assert_non_null(rep);
    size_t n = rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
    freeReplyObject(rep);
    redisFree(r);
    return n;
}

#include "guard_cases.h"

/* The record key the contract names: SHA-256 of app, scope and key, each
 * with an 8-byte big-endian length, after the tag "cerb-guard-1". */
static void expected_key(const char *app, const char *scope, const void *key, size_t klen,
                         char *out, size_t n)
{
    char hex[65];
    gc_record_hex(app, scope, key, klen, hex);
    snprintf(out, n, "%scerb:guard:{%s}", prefix, hex);
}

static void test_redis_guard_layout(void **state)
{
    (void)state;
    cerb_client *c = gc_open("app = \"shop\"; running_ms = 5000;");
    char *key = gc_key("lay");
    char rk[256];
    expected_key("shop", "create-order", key, strlen(key), rk, sizeof rk);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "create-order", key, strlen(key), NULL, &g), CERB_OK);
    redisContext *r = raw();
    redisReply *v = redisCommand(r, "GET %s", rk);
    assert_int_equal(v->type, REDIS_REPLY_STRING);
    assert_int_equal(v->len, 33); /* 'R' + token */
    assert_int_equal(v->str[0], 'R');
    freeReplyObject(v);
    v = redisCommand(r, "PTTL %s", rk);
    assert_true(v->integer > 0 && v->integer <= 5000);
    freeReplyObject(v);
    const char res[] = "id=17\0\x01\x02";
    assert_int_equal(cerb_guard_finish(g, 1, res, sizeof res), CERB_OK);
    cerb_guard_free(g);
    v = redisCommand(r, "GET %s", rk);
    assert_int_equal(v->type, REDIS_REPLY_STRING);
    assert_int_equal(v->len, 33 + sizeof res);
    assert_int_equal(v->str[0], 'D');
    assert_memory_equal(v->str + 33, res, sizeof res);
    freeReplyObject(v);
    v = redisCommand(r, "PTTL %s", rk);
    assert_true(v->integer > 3000 && v->integer <= 4000); /* keep_ms */
    freeReplyObject(v);

    /* keep_ms = -1: the done-record has no expiry (documented as permanent
     * per key), so the test deletes it itself. */
    char *key2 = gc_key("forever");
    expected_key("shop", "create-order", key2, strlen(key2), rk, sizeof rk);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = -1;
    assert_int_equal(cerb_guard_begin(c, "create-order", key2, strlen(key2), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "f", 1), CERB_OK);
    cerb_guard_free(g);
    v = redisCommand(r, "PTTL %s", rk);
    assert_int_equal(v->integer, -1);
    freeReplyObject(v);
    freeReplyObject(redisCommand(r, "DEL %s", rk));

    /* A failed attempt leaves no key at all. */
    char *key3 = gc_key("fail");
    expected_key("shop", "create-order", key3, strlen(key3), rk, sizeof rk);
    assert_int_equal(cerb_guard_begin(c, "create-order", key3, strlen(key3), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    v = redisCommand(r, "EXISTS %s", rk);
    assert_int_equal(v->integer, 0);
    freeReplyObject(v);
    redisFree(r);
    free(key);
    free(key2);
    free(key3);
    cerb_client_close(c);
}

/* The server forgot the scripts (SCRIPT FLUSH, a restart): renew and
 * finish still work (EVAL after NOSCRIPT), and a stale finish is still
 * refused by the reloaded script. */
static void test_redis_guard_noscript(void **state)
{
    (void)state;
    cerb_client *c = gc_open(NULL);
    char *key = gc_key("noscript");
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "ns", key, strlen(key), NULL, &g), CERB_OK);
    redisContext *r = raw();
    freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
    assert_int_equal(cerb_guard_finish(g, 1, "ok", 2), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "ns", key, "ok", 2);
    redisFree(r);
    free(key);
    cerb_client_close(c);
}

/* A record deleted behind a running attempt (an operator's DEL, an
 * eviction): the attempt's finish is refused with LOST, and a new attempt
 * that began meanwhile keeps its record. */
static void test_redis_guard_deleted_behind(void **state)
{
    (void)state;
    cerb_client *a = gc_open(NULL), *b = gc_open(NULL);
    char *key = gc_key("del");
    char rk[256];
    expected_key("", "del", key, strlen(key), rk, sizeof rk);
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(cerb_guard_begin(a, "del", key, strlen(key), NULL, &g), CERB_OK);
    redisContext *r = raw();
    freeReplyObject(redisCommand(r, "DEL %s", rk));
    redisFree(r);
    assert_int_equal(cerb_guard_begin(b, "del", key, strlen(key), NULL, &h), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "old", 3), CERB_LOST);
    assert_non_null(strstr(cerb_last_error(), "lost"));
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    cerb_guard_free(h);
    gc_expect_duplicate(a, "del", key, "new", 3);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* The processes of GUARD_CASES, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {GC_ROLE, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    snprintf(prefix, sizeof prefix, "gtest%ld:", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis_guard_layout),
        cmocka_unit_test(test_redis_guard_noscript),
        cmocka_unit_test(test_redis_guard_deleted_behind),
        GUARD_CASES,
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
