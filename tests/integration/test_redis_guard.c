/*
 * test_redis_guard.c — the idempotency guard on a real redis-server: the
 * engine-independent cases (guard_cases.h: races of threads and processes,
 * a SIGKILLed and a SIGSTOPped attempt, keep_ms, result limits, bad input,
 * no records left), and what only redis has: the layout of DESIGN §11
 * (`<prefix>cerb:guard:{<sha256 hex>}` and the byte 0x1f, state and token
 * in the value, PX the record's life, none when kept forever), the scripts'
 * NOSCRIPT reload, and the key's place among lock names: no lock name
 * reaches a record, a lock named like a record of the older layout (the key
 * without 0x1f) is left alone, and records that layout holds still answer.
 * Every client of this run uses its own redis.prefix, so counting the
 * suite's records is exact on a shared server.
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
#include "redis_cluster.h" /* cerb__redis_key_slot: where cluster mode routes a key */
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

/* Group setup: mark this run's prefix as never used
 * (engine_redis/redis_marker.h), as scripts/servers.sh marks the empty one
 * on a new server. Nothing can be held under a prefix no one used, and
 * without the marker the first client would grant no lock for a lease (the
 * tests here take locks under it). */
static int mark_prefix(void **state)
{
    (void)state;
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    if (!r || r->err) {
        fprintf(stderr, "mark_prefix: redis on port %d: %s\n", cerb_test_redis_port(),
                r ? r->errstr : "out of memory");
        redisFree(r);
        return -1;
    }
    redisSetTimeout(r, tv);
    redisReply *v = redisCommand(r, "INFO replication");
    const char *id = v && v->type == REDIS_REPLY_STRING ? strstr(v->str, "master_replid:") : NULL;
    int ok = 0;
    if (id) {
        id += strlen("master_replid:");
        char mk[128], val[160];
        snprintf(mk, sizeof mk, "%s\x1f" "cerberus", prefix);
        snprintf(val, sizeof val, "%s-%ld 0 %.*s", prefix, (long)getpid(),
                 (int)strcspn(id, "\r\n"), id);
        redisReply *w = redisCommand(r, "SET %s %s NX", mk, val);
        ok = w && w->type == REDIS_REPLY_STATUS;
        if (w)
            freeReplyObject(w);
    }
    if (!ok)
        fprintf(stderr, "mark_prefix: could not write the marker of %s\n", prefix);
    if (v)
        freeReplyObject(v);
    redisFree(r);
    return ok ? 0 : -1;
}

/* The record key the contract names: SHA-256 of app, scope and key, each
 * with an 8-byte big-endian length, after the tag "cerb-guard-1"; then
 * `<pfx>cerb:guard:{<hex>}`, and the byte 0x1f after it unless `legacy`
 * (the layout before 0x1f was added, where a lock name could reach it).
 * Returns the key's length. */
static size_t layout_key(const char *pfx, const char *app, const char *scope, const void *key,
                         size_t klen, bool legacy, char *out, size_t n)
{
    char hex[65];
    gc_record_hex(app, scope, key, klen, hex);
    int k = snprintf(out, n, "%scerb:guard:{%s}%s", pfx, hex, legacy ? "" : "\x1f");
    assert_true(k > 0 && (size_t)k < n);
    return (size_t)k;
}

static size_t expected_key(const char *app, const char *scope, const void *key, size_t klen,
                           char *out, size_t n)
{
    return layout_key(prefix, app, scope, key, klen, false, out, n);
}

static size_t legacy_key(const char *app, const char *scope, const void *key, size_t klen,
                         char *out, size_t n)
{
    return layout_key(prefix, app, scope, key, klen, true, out, n);
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
    /* Nothing at the older layout's key: new records are written only
     * where no lock name reaches. */
    legacy_key("shop", "create-order", key, strlen(key), rk, sizeof rk);
    v = redisCommand(r, "EXISTS %s", rk);
    assert_int_equal(v->integer, 0);
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

/* ---- the key among lock names, and the older layout ---- */

/* A client whose breaker can open and fail over to local, as in the
 * report of issue 22: a record's failures there would show as a switch.
 * Probes are slow and patient, so a loaded machine's late canaries do not
 * open the breaker; the guard's own failures still count. */
static cerb_client *failover_client(void)
{
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "engines = (\"redis\", \"local\");\n"
             "failover = { failback = \"manual\"; probe_interval_ms = 2000;\n"
             "  probe_timeout_ms = 2000; };\n"
             "redis = { host = \"127.0.0.1\"; port = %d; prefix = \"%s\"; };\n"
             "guard = { keep_ms = 4000; };\n",
             cerb_test_redis_port(), prefix);
    cerb_client *c = cerb_test_open(cfg);
    assert_non_null(c);
    assert_string_equal(cerb_engine_current(c), "redis");
    return c;
}

/* Redis answered every guard call: no failure counted, breaker closed,
 * still the active engine. */
static void redis_healthy(cerb_client *c)
{
    struct cerb_engine_info in;
    assert_int_equal(cerb_engine_info(c, "redis", &in), CERB_OK);
    if (in.failures != 0 || in.breaker != CERB_BREAKER_CLOSED || !in.active)
        fail_msg("redis: %llu failures, breaker %d, active %d (want 0, closed, 1)",
                 (unsigned long long)in.failures, (int)in.breaker, in.active);
}

/* begin on a key, expecting `want`; an attempt is returned open. */
static cerb_guard *begin_expect(cerb_client *c, const char *scope, const char *key,
                                cerb_status want)
{
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(c, scope, key, strlen(key), NULL, &g);
    if (st != want)
        fail_msg("begin %s/%s: %s (want %s): %s", scope, key, cerb_status_name(st),
                 cerb_status_name(want), cerb_last_error());
    return g;
}

/* The lock's key holds a lock token (32 lowercase hex), as the lock wrote
 * it: the guard did not touch it. */
static void holds_lock_token(redisContext *r, const char *rk)
{
    redisReply *v = redisCommand(r, "GET %s", rk);
    assert_int_equal(v->type, REDIS_REPLY_STRING);
    assert_int_equal(v->len, 32);
    assert_int_equal(strspn(v->str, "0123456789abcdef"), 32);
    freeReplyObject(v);
}

/* Issue 22, finding 4: the lock named like the older layout's key of
 * scope "pay", key "order-42" is held while that record runs, fails,
 * runs again and is done. The guard answers every begin (before: three
 * begins failed with EPROTO, counted against the breaker, which opened and
 * moved the client to another engine), and the lock is neither broken nor
 * kept: it unlocks and locks again at once. */
static void test_redis_guard_lock_named_like_old_key(void **state)
{
    (void)state;
    cerb_client *c = failover_client();
    char rk[256];
    legacy_key("", "pay", "order-42", 8, rk, sizeof rk);
    const char *name = rk + strlen(prefix); /* the lock's key is prefix + name */
    cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    redisContext *r = raw();
    holds_lock_token(r, rk);

    cerb_guard *g = begin_expect(c, "pay", "order-42", CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK); /* failed: run again */
    cerb_guard_free(g);
    g = begin_expect(c, "pay", "order-42", CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "paid", 4), CERB_OK);
    cerb_guard_free(g);
    for (int i = 0; i < 3; i++)
        gc_expect_duplicate(c, "pay", "order-42", "paid", 4);
    redis_healthy(c);
    assert_string_equal(cerb_engine_current(c), "redis");

    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    holds_lock_token(r, rk);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK); /* not BUSY for keep_ms */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    redis_healthy(c);
    redisFree(r);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/* The other order: a record done first, then a lock named like the older
 * layout's key of it is free at once (before: BUSY for keep_ms, a day by
 * default, as the done-record sat at that key). */
static void test_redis_guard_done_record_leaves_lock_name_free(void **state)
{
    (void)state;
    cerb_client *c = failover_client();
    cerb_guard *g = begin_expect(c, "pay", "order-43", CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "paid", 4), CERB_OK);
    cerb_guard_free(g);
    char rk[256];
    legacy_key("", "pay", "order-43", 8, rk, sizeof rk);
    cerb_lock *l = cerb_test_handle(c, rk + strlen(prefix));
    assert_non_null(l);
    cerb_status st = cerb_lock_trylock(l);
    if (st != CERB_OK)
        fail_msg("lock %s: %s: %s", rk + strlen(prefix), cerb_status_name(st), cerb_last_error());
    gc_expect_duplicate(c, "pay", "order-43", "paid", 4);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    redis_healthy(c);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/* Records written by a version of the older layout (the key without 0x1f,
 * the same value format) survive the upgrade: a done-record answers
 * DUPLICATE with its result (kept for its keep_ms, or forever), a running
 * claim answers BUSY, and neither makes a record at the new key. Once the
 * old claim is gone, a new attempt claims at the new key only. */
static void test_redis_guard_reads_older_layout(void **state)
{
    (void)state;
    static const char tok_a[] = "0123456789abcdef0123456789abcdef";
    static const char tok_b[] = "fedcba9876543210fedcba9876543210";
    cerb_client *c = gc_open(NULL);
    char *kd = gc_key("upg-done"), *kf = gc_key("upg-forever"), *kr = gc_key("upg-run");
    char od[256], of[256], orun[256], nk[256];
    legacy_key("", "upg", kd, strlen(kd), od, sizeof od);
    legacy_key("", "upg", kf, strlen(kf), of, sizeof of);
    legacy_key("", "upg", kr, strlen(kr), orun, sizeof orun);
    redisContext *r = raw();
    /* As the older version wrote them: 'D' token result with PX keep_ms,
     * 'D' token result with no expiry (keep_ms = -1), 'R' token with PX
     * running_ms. */
    const char res[] = "order=7\0\x01";
    char val[64];
    val[0] = 'D';
    memcpy(val + 1, tok_a, 32);
    memcpy(val + 33, res, sizeof res);
    freeReplyObject(redisCommand(r, "SET %s %b PX 4000", od, val, (size_t)33 + sizeof res));
    freeReplyObject(redisCommand(r, "SET %s %b", of, val, (size_t)33 + sizeof res));
    val[0] = 'R';
    memcpy(val + 1, tok_b, 32);
    freeReplyObject(redisCommand(r, "SET %s %b PX 4000", orun, val, (size_t)33));

    gc_expect_duplicate(c, "upg", kd, res, sizeof res);
    gc_expect_duplicate(c, "upg", kf, res, sizeof res);
    assert_null(begin_expect(c, "upg", kr, CERB_BUSY));
    const char *keys[3] = {kd, kf, kr};
    for (int i = 0; i < 3; i++) {
        expected_key("", "upg", keys[i], strlen(keys[i]), nk, sizeof nk);
        redisReply *v = redisCommand(r, "EXISTS %s", nk);
        assert_int_equal(v->integer, 0);
        freeReplyObject(v);
    }
    redisReply *v = redisCommand(r, "GET %s", od);
    assert_int_equal(v->type, REDIS_REPLY_STRING);
    assert_int_equal(v->len, 33 + sizeof res);
    assert_int_equal(v->str[0], 'D');
    freeReplyObject(v);

    /* The old claim ends (its attempt failed): a new attempt runs, and its
     * record is at the new key alone. */
    freeReplyObject(redisCommand(r, "DEL %s", orun));
    cerb_guard *g = begin_expect(c, "upg", kr, CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "upg", kr, "new", 3);
    v = redisCommand(r, "EXISTS %s", orun);
    assert_int_equal(v->integer, 0);
    freeReplyObject(v);
    expected_key("", "upg", kr, strlen(kr), nk, sizeof nk);
    v = redisCommand(r, "GET %s", nk);
    assert_int_equal(v->type, REDIS_REPLY_STRING);
    assert_int_equal(v->str[0], 'D');
    freeReplyObject(v);

    freeReplyObject(redisCommand(r, "DEL %s", of)); /* kept forever: ours to delete */
    redisFree(r);
    free(kd);
    free(kf);
    free(kr);
    cerb_client_close(c);
}

/* Something other than a guard record at the guard's keys is an answer,
 * not an engine failure. At the older layout's key it is ignored (a lock's
 * token: the key is that lock's; a hash: someone else's): the attempt runs
 * and its record is at the new key, the value left as it was. At the new
 * key only the guard writes; what else is found there is never taken over
 * (it might be a later version's record), so begin answers BUSY, and an
 * attempt whose claim was replaced by it is LOST at finish. */
static void test_redis_guard_other_values_at_its_keys(void **state)
{
    (void)state;
    cerb_client *c = failover_client();
    char *kt = gc_key("tok"), *kh = gc_key("hash"), *ks = gc_key("str"), *kn = gc_key("nhash"),
         *kl = gc_key("lost");
    char ok[256], nk[256];
    redisContext *r = raw();

    legacy_key("", "odd", kt, strlen(kt), ok, sizeof ok);
    freeReplyObject(redisCommand(r, "SET %s 0123456789abcdef0123456789abcdef PX 4000", ok));
    cerb_guard *g = begin_expect(c, "odd", kt, CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "t", 1), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "odd", kt, "t", 1);
    holds_lock_token(r, ok);

    legacy_key("", "odd", kh, strlen(kh), ok, sizeof ok);
    freeReplyObject(redisCommand(r, "HSET %s f v", ok));
    freeReplyObject(redisCommand(r, "PEXPIRE %s 4000", ok));
    g = begin_expect(c, "odd", kh, CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "h", 1), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "odd", kh, "h", 1);
    redisReply *v = redisCommand(r, "TYPE %s", ok);
    assert_string_equal(v->str, "hash");
    freeReplyObject(v);

    expected_key("", "odd", ks, strlen(ks), nk, sizeof nk);
    freeReplyObject(redisCommand(r, "SET %s not-a-record PX 4000", nk));
    assert_null(begin_expect(c, "odd", ks, CERB_BUSY));
    v = redisCommand(r, "GET %s", nk);
    assert_string_equal(v->str, "not-a-record");
    freeReplyObject(v);

    expected_key("", "odd", kn, strlen(kn), nk, sizeof nk);
    freeReplyObject(redisCommand(r, "HSET %s f v", nk));
    freeReplyObject(redisCommand(r, "PEXPIRE %s 4000", nk));
    assert_null(begin_expect(c, "odd", kn, CERB_BUSY));

    expected_key("", "odd", kl, strlen(kl), nk, sizeof nk);
    g = begin_expect(c, "odd", kl, CERB_OK);
    freeReplyObject(redisCommand(r, "SET %s not-a-record XX KEEPTTL", nk));
    assert_int_equal(cerb_guard_finish(g, 1, "l", 1), CERB_LOST);
    cerb_guard_free(g);
    v = redisCommand(r, "GET %s", nk);
    assert_string_equal(v->str, "not-a-record");
    freeReplyObject(v);
    freeReplyObject(redisCommand(r, "DEL %s", nk));

    redis_healthy(c);
    redisFree(r);
    free(kt);
    free(kh);
    free(ks);
    free(kn);
    free(kl);
    cerb_client_close(c);
}

/* No lock name reaches a record: its key is prefix + something with a
 * control byte, and lock names may not hold one, while the older layout's
 * key was a valid name. Both keys of a record hash to one cluster slot, so
 * a script may declare both, whatever hash tag redis.prefix holds (only a
 * prefix whose first '{' is followed at once by '}' hashes whole keys; the
 * engine then reads the new key alone in cluster mode). */
static void test_redis_guard_key_beyond_lock_names(void **state)
{
    (void)state;
    cerb_client *c = gc_open("app = \"beyond\";");
    char nk[256], ok[256];
    size_t nl = layout_key(prefix, "beyond", "pay", "order-42", 8, false, nk, sizeof nk);
    layout_key(prefix, "beyond", "pay", "order-42", 8, true, ok, sizeof ok);
    assert_non_null(memchr(nk, 0x1f, nl));
    /* The engine's record is there, and nothing at the older key. */
    cerb_guard *g = begin_expect(c, "pay", "order-42", CERB_OK);
    redisContext *r = raw();
    redisReply *v = redisCommand(r, "GET %b", nk, nl);
    assert_int_equal(v->type, REDIS_REPLY_STRING);
    assert_int_equal(v->str[0], 'R');
    freeReplyObject(v);
    v = redisCommand(r, "EXISTS %s", ok);
    assert_int_equal(v->integer, 0);
    freeReplyObject(v);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    redisFree(r);

    /* The name that would be that key is refused; the older key's was not. */
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, nk + strlen(prefix), NULL, &l), CERB_EINVAL);
    assert_null(l);
    assert_non_null(strstr(cerb_last_error(), "control character"));
    assert_int_equal(cerb_lock_new(c, ok + strlen(prefix), NULL, &l), CERB_OK);
    cerb_lock_free(l);

    static const char *const prefixes[] = {"", "app:", "{app}:", "a{b", "x}{y}z", "{a}{b}"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t n1 = layout_key(prefixes[i], "", "pay", "order-42", 8, false, nk, sizeof nk);
        size_t n2 = layout_key(prefixes[i], "", "pay", "order-42", 8, true, ok, sizeof ok);
        if (cerb__redis_key_slot(nk, n1) != cerb__redis_key_slot(ok, n2))
            fail_msg("prefix \"%s\": the record's keys are in slots %u and %u", prefixes[i],
                     cerb__redis_key_slot(nk, n1), cerb__redis_key_slot(ok, n2));
    }
    cerb_client_close(c);
}

/* The processes of GUARD_CASES, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {GC_ROLE, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    snprintf(prefix, sizeof prefix, "gtest%ld:", (long)getpid());
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis_guard_layout),
        cmocka_unit_test(test_redis_guard_noscript),
        cmocka_unit_test(test_redis_guard_deleted_behind),
        cmocka_unit_test(test_redis_guard_lock_named_like_old_key),
        cmocka_unit_test(test_redis_guard_done_record_leaves_lock_name_free),
        cmocka_unit_test(test_redis_guard_reads_older_layout),
        cmocka_unit_test(test_redis_guard_other_values_at_its_keys),
        cmocka_unit_test(test_redis_guard_key_beyond_lock_names),
        GUARD_CASES,
    };
    return cmocka_run_group_tests(tests, mark_prefix, NULL);
}
