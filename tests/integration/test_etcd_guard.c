/*
 * test_etcd_guard.c — the idempotency guard on a real etcd (shared
 * fixture): the engine-independent cases (guard_cases.h: races of threads
 * and processes, a SIGKILLed and a SIGSTOPped attempt, keep_ms, result
 * limits, bad input, no records left), and what only etcd has:
 *  - the layout: `<prefix>cerb:guard:<sha256 hex>` (not DESIGN §11's
 *    `<prefix>cerb/guard/…`, which is inside the lock "cerb"'s range), state
 *    and token in the value, running claims on a lease of about running_ms,
 *    done-records on a lease of keep_ms and a little more, none with
 *    keep_ms = -1;
 *  - the lock "cerb" is not disturbed by guard records (and "cerb/guard"
 *    cannot be a lock name on etcd);
 *  - a lease revoked under running attempts: their finish is CERB_LOST, the
 *    next begin of the same client gets a new lease, and a new attempt that
 *    began meanwhile keeps its record;
 *  - round trips, counted at the engine: begin, duplicate and finish are
 *    one request each once the client's leases exist.
 * Every client of this run uses its own etcd.prefix, so counting the
 * suite's records is exact on a shared server.
 */
#define _GNU_SOURCE
#include <jansson.h>
#include <openssl/evp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "cerberus.h"
#include "config.h"
#include "engine.h"
#include "etcd_internal.h"
#include "etcd_util.h"
#include "test_util.h"

static char prefix[64]; /* "getcd<pid>-" — set in main */

static char *guard_cfg(const char *guard_extra)
{
    char ee[128], ex[256];
    snprintf(ee, sizeof ee, "prefix = \"%s\";", prefix);
    snprintf(ex, sizeof ex, "guard = { keep_ms = 4000; %s };", guard_extra ? guard_extra : "");
    return etcd_test_config(ee, ex);
}

static size_t guard_records(void)
{
    char p[128];
    snprintf(p, sizeof p, "%scerb:guard:", prefix);
    int n = etcd_test_keys(etcd_test_port(), p, NULL, 0);
    assert_true(n >= 0);
    return (size_t)n;
}

#include "guard_cases.h"

/* ---- raw access to one record ---- */

static void b64(const void *p, size_t n, char *out)
{
    EVP_EncodeBlock((unsigned char *)out, p, (int)n);
}

struct raw_rec {
    bool exists;
    unsigned char value[8192];
    size_t len;
    int64_t lease;
};

static int64_t i64_of(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10) : json_integer_value(v);
}

static void raw_get(const char *key, struct raw_rec *r)
{
    char k[512], body[1024];
    memset(r, 0, sizeof *r);
    b64(key, strlen(key), k);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
    long st = 0;
    json_t *a = etcd_test_post(etcd_test_port(), "/v3/kv/range", body, NULL, &st);
    assert_non_null(a);
    assert_int_equal(st, 200);
    const json_t *kv = json_array_get(json_object_get(a, "kvs"), 0);
    if (kv) {
        r->exists = true;
        r->lease = i64_of(kv, "lease");
        const char *v = json_string_value(json_object_get(kv, "value"));
        assert_non_null(v);
        size_t vl = strlen(v);
        assert_true(vl / 4 * 3 <= sizeof r->value);
        int n = EVP_DecodeBlock(r->value, (const unsigned char *)v, (int)vl);
        assert_true(n >= 0);
        size_t pad = vl >= 2 && v[vl - 1] == '=' ? (v[vl - 2] == '=' ? 2 : 1) : 0;
        r->len = (size_t)n - pad;
    }
    json_decref(a);
}

/* The lease's granted TTL in s (-1 when the lease is gone). */
static int64_t lease_granted_ttl(int64_t lease)
{
    char body[128];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", (long long)lease);
    long st = 0;
    json_t *a = etcd_test_post(etcd_test_port(), "/v3/lease/timetolive", body, NULL, &st);
    assert_non_null(a);
    int64_t ttl = i64_of(a, "TTL"), granted = i64_of(a, "grantedTTL");
    json_decref(a);
    return ttl < 0 ? -1 : granted;
}

/* The record key the contract names (the SHA-256 of guard_cases' redis
 * twin), in the etcd layout `<prefix>cerb:guard:<hex>`. */
static void expected_key(const char *app, const char *scope, const void *key, size_t klen,
                         char *out, size_t n)
{
    char hex[65];
    gc_record_hex(app, scope, key, klen, hex);
    snprintf(out, n, "%scerb:guard:%s", prefix, hex);
}

/* Fails on the layout of DESIGN §11 or a lease that does not fit the
 * record's life (e.g. a done-record left on the running lease). */
static void test_etcd_guard_layout(void **state)
{
    (void)state;
    cerb_client *c = gc_open("app = \"shop\"; running_ms = 5000;");
    char *key = gc_key("lay");
    char rk[256];
    struct raw_rec r;
    expected_key("shop", "create-order", key, strlen(key), rk, sizeof rk);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "create-order", key, strlen(key), NULL, &g), CERB_OK);
    raw_get(rk, &r);
    assert_true(r.exists);
    assert_int_equal(r.len, 33); /* 'R' + token */
    assert_int_equal(r.value[0], 'R');
    assert_true(r.lease != 0);
    /* running_ms 5000 plus max(1 s, a quarter), in whole seconds. */
    int64_t ttl = lease_granted_ttl(r.lease);
    assert_true(ttl >= 5 && ttl <= 7);
    int64_t run_lease = r.lease;
    unsigned char token[32];
    memcpy(token, r.value + 1, 32);

    const char res[] = "id=17\0\x01\x02\xff";
    assert_int_equal(cerb_guard_finish(g, 1, res, sizeof res), CERB_OK);
    cerb_guard_free(g);
    raw_get(rk, &r);
    assert_true(r.exists);
    assert_int_equal(r.len, 33 + sizeof res);
    assert_int_equal(r.value[0], 'D');
    assert_memory_equal(r.value + 1, token, 32);
    assert_memory_equal(r.value + 33, res, sizeof res);
    /* keep_ms 4000 plus a bucket of 1 s: kept at least keep_ms. */
    assert_true(r.lease != 0 && r.lease != run_lease);
    ttl = lease_granted_ttl(r.lease);
    assert_true(ttl >= 4 && ttl <= 6);

    /* keep_ms = -1: no lease at all (documented as permanent per key), so
     * the test deletes it itself. */
    char *key2 = gc_key("forever");
    expected_key("shop", "create-order", key2, strlen(key2), rk, sizeof rk);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = -1;
    assert_int_equal(cerb_guard_begin(c, "create-order", key2, strlen(key2), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "f", 1), CERB_OK);
    cerb_guard_free(g);
    raw_get(rk, &r);
    assert_true(r.exists);
    assert_int_equal(r.value[0], 'D');
    assert_int_equal(r.lease, 0);
    gc_expect_duplicate(c, "create-order", key2, "f", 1);
    assert_int_equal(etcd_test_delete(etcd_test_port(), rk), 1);

    /* A failed attempt leaves no key at all. */
    char *key3 = gc_key("fail");
    expected_key("shop", "create-order", key3, strlen(key3), rk, sizeof rk);
    assert_int_equal(cerb_guard_begin(c, "create-order", key3, strlen(key3), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    raw_get(rk, &r);
    assert_false(r.exists);
    free(key);
    free(key2);
    free(key3);
    cerb_client_close(c);
}

/*
 * A lock named "cerb" next to guard records: with DESIGN §11's layout
 * (`<prefix>cerb/guard/<id>`) the record is the oldest key in the lock's
 * range, so the lock's trylock answers BUSY and `cerberus holders cerb`
 * would show the record as the holder — this test fails that way.
 */
static void test_etcd_guard_lock_named_cerb(void **state)
{
    (void)state;
    char *cfg = guard_cfg(NULL);
    char *text = malloc(strlen(cfg) + 64);
    assert_non_null(text);
    sprintf(text, "%slock = { fair = false; };", cfg);
    free(cfg);
    cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    char *key = gc_key("cerb");
    cerb_guard *g = NULL, *d = NULL;
    assert_int_equal(cerb_guard_begin(c, "s", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_begin(c, "t", key, strlen(key), NULL, &d), CERB_OK);
    assert_int_equal(cerb_guard_finish(d, 1, "done", 4), CERB_OK);

    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, "cerb", NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    char p[128];
    snprintf(p, sizeof p, "%scerb/", prefix);
    struct etcd_test_kv kv[4];
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 4), 1); /* the lock's own key */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 4), 0);
    cerb_lock_free(l);
    /* "cerb/guard" is no lock name on etcd: it would share a range. */
    cerb_lock *l2 = NULL;
    cerb_status st = cerb_lock_new(c, "cerb/guard", NULL, &l2);
    if (st == CERB_OK) {
        st = cerb_lock_trylock(l2);
        cerb_lock_free(l2);
    }
    assert_int_equal(st, CERB_EINVAL);
    /* The records are untouched by the lock. */
    assert_int_equal(cerb_guard_finish(g, 1, "ok", 2), CERB_OK);
    cerb_guard_free(g);
    cerb_guard_free(d);
    gc_expect_duplicate(c, "s", key, "ok", 2);
    gc_expect_duplicate(c, "t", key, "done", 4);
    free(key);
    cerb_client_close(c);
}

/*
 * The running lease revoked under two attempts (an operator, or the server
 * losing it): both claims vanish with it; a new attempt of another client
 * begins at once; the old attempts' finishes are CERB_LOST and change
 * nothing; and the next begin of the same client, whose cached lease is
 * gone, gets a new one (the put fails "lease not found", which a client
 * that did not re-grant would report as an error: this test fails then).
 */
static void test_etcd_guard_lease_revoked(void **state)
{
    (void)state;
    cerb_client *a = gc_open(NULL), *b = gc_open(NULL);
    char *key = gc_key("revoke"), *key2 = gc_key("revoke2"), *key3 = gc_key("revoke3");
    char rk[256];
    struct raw_rec r;
    cerb_guard *g = NULL, *g2 = NULL, *h = NULL, *n = NULL;
    assert_int_equal(cerb_guard_begin(a, "rv", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_begin(a, "rv", key2, strlen(key2), NULL, &g2), CERB_OK);
    expected_key("", "rv", key, strlen(key), rk, sizeof rk);
    raw_get(rk, &r);
    assert_true(r.exists && r.lease != 0);
    int64_t lease = r.lease;
    expected_key("", "rv", key2, strlen(key2), rk, sizeof rk);
    raw_get(rk, &r);
    assert_int_equal(r.lease, lease); /* one shared lease per client and class */
    assert_int_equal(etcd_test_revoke(etcd_test_port(), lease), 0);
    raw_get(rk, &r);
    assert_false(r.exists);

    assert_int_equal(cerb_guard_begin(b, "rv", key, strlen(key), NULL, &h), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "old", 3), CERB_LOST);
    assert_int_equal(cerb_guard_finish(g2, 0, NULL, 0), CERB_LOST);
    assert_int_equal(cerb_guard_begin(a, "rv", key3, strlen(key3), NULL, &n), CERB_OK);
    expected_key("", "rv", key3, strlen(key3), rk, sizeof rk);
    raw_get(rk, &r);
    assert_true(r.exists && r.lease != 0 && r.lease != lease);
    assert_int_equal(cerb_guard_finish(n, 1, "n", 1), CERB_OK);
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    cerb_guard_free(g2);
    cerb_guard_free(h);
    cerb_guard_free(n);
    gc_expect_duplicate(a, "rv", key, "new", 3);
    free(key);
    free(key2);
    free(key3);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- round trips, counted at the engine ---- */

/* A record id as the core makes it: 64 hex chars (here of a fresh name). */
static void rec_id(const char *what, char out[65])
{
    char *name = test_name(what);
    unsigned char d[32];
    unsigned dl = 0;
    EVP_Digest(name, strlen(name), d, &dl, EVP_sha256(), NULL);
    free(name);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static uint64_t requests(cerb_engine *e)
{
    return atomic_load(&e->stats.requests);
}

/*
 * Once the client's leases exist, begin, a duplicate's begin, finish and a
 * busy answer each take one request; a renewal at most two. Fails when a
 * begin grants a lease of its own or a duplicate needs a second read.
 */
static void test_etcd_guard_round_trips(void **state)
{
    (void)state;
    const struct cerb_engine_ops *ops = cerb__engine_find("etcd");
    assert_non_null(ops);
    char *text = guard_cfg(NULL);
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_from_string(text, &cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = cfg};
    cerb_engine *e = NULL;
    assert_int_equal(cerb__engine_open(ops, &env, &e), CERB_OK);

    cerb_guard_rec rec = {.scope = "rt", .running_ms = 20000};
    cerb_grant gr;
    void *res = NULL;
    size_t res_len = 0;
    cerb_outcome oc;
    /* Warm up: the first begin grants the running lease, the first finish
     * the done bucket's. */
    rec_id("rtw", rec.id);
    snprintf(rec.token, sizeof rec.token, "%032x", 1);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &rec, &gr, &res, &res_len), CERB_OK);
    assert_int_equal(cerb__engine_guard_finish(ops, e, &rec, 1, "w", 1, 4000, &oc), CERB_OK);

    rec_id("rt", rec.id); /* another record */
    uint64_t n0 = requests(e);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &rec, &gr, &res, &res_len), CERB_OK);
    assert_int_equal(requests(e) - n0, 1);
    cerb_guard_rec other = rec;
    snprintf(other.token, sizeof other.token, "%032x", 2);
    n0 = requests(e);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &other, &gr, &res, &res_len), CERB_BUSY);
    assert_int_equal(requests(e) - n0, 1);
    n0 = requests(e);
    assert_int_equal(cerb__engine_guard_renew(ops, e, &rec, &gr), CERB_OK);
    assert_true(requests(e) - n0 <= 2);
    n0 = requests(e);
    assert_int_equal(cerb__engine_guard_finish(ops, e, &rec, 1, "r\0b", 3, 4000, &oc), CERB_OK);
    assert_int_equal(requests(e) - n0, 1);
    n0 = requests(e);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &other, &gr, &res, &res_len),
                     CERB_DUPLICATE);
    assert_int_equal(requests(e) - n0, 1);
    assert_int_equal(res_len, 3);
    assert_memory_equal(res, "r\0b", 3);
    cerb__free(res);
    /* A re-sent finish (its first copy landed) is still OK; another
     * token's finish is not. */
    assert_int_equal(cerb__engine_guard_finish(ops, e, &rec, 1, "r\0b", 3, 4000, &oc), CERB_OK);
    assert_int_equal(cerb__engine_guard_finish(ops, e, &other, 1, "x", 1, 4000, &oc),
                     CERB_NOT_OWNER);
    cerb_guard_found found;
    assert_int_equal(cerb__engine_guard_check(ops, e, &rec, &found), CERB_OK);
    assert_int_equal(found, CERB_GUARD_FOUND_DONE);
    assert_int_equal(cerb__engine_guard_check(ops, e, &other, &found), CERB_OK);
    assert_int_equal(found, CERB_GUARD_FOUND_OTHER);
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
}

/* The processes of GUARD_CASES, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {GC_ROLE, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    snprintf(prefix, sizeof prefix, "getcd%ld-", (long)getpid());
    cerb__engines_builtin();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_etcd_guard_layout),
        cmocka_unit_test(test_etcd_guard_lock_named_cerb),
        cmocka_unit_test(test_etcd_guard_lease_revoked),
        cmocka_unit_test(test_etcd_guard_round_trips),
        GUARD_CASES,
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
