/*
 * test_pg_guard.c — the idempotency guard on a real PostgreSQL (shared
 * fixture): the engine-independent cases (guard_cases.h: races of threads
 * and processes, a SIGKILLed and a SIGSTOPped attempt, keep_ms, result
 * limits, bad input, no live records left), and what only pg has:
 *  - the layout: one row of <schema>.cerberus_guard per record (id, scope
 *    byte for byte, token, state 1/2, until on the server's clock — NULL
 *    with keep_ms = -1 — and the result), none after a failure;
 *  - a done-record outlives the client that wrote it: a new client gets
 *    DUPLICATE with the exact bytes (64 KiB with NULs included);
 *  - expiry on the server's clock: a 300 ms claim ends 300 ms after the
 *    server's clock_timestamp() at the begin, is BUSY until then and taken
 *    over after; the old attempt's renew and finish are then refused;
 *  - the engine's contract directly: re-sent begin and finish, check's four
 *    answers, an expired claim not renewed, an expired-record takeover raced
 *    by threads (exactly one wins), begins racing a finish (never OK);
 *  - hostile scope and key strings are data;
 *  - expired records are swept, live and permanent ones are not;
 *  - SQL errors (a row locked by another session past lock_timeout) change
 *    nothing and say outcome NO; the API's begin then answers
 *    CERB_UNAVAILABLE; a schema without the guard table says to run
 *    `cerberus init`;
 *  - `cerberus once` on pg.
 * The suite works in a schema of its own (cerb_g<pid>, made here with the
 * engine's `cerberus init` and dropped at the end), so counting records is
 * exact on a shared server.
 */
#include <pthread.h>
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
#include "cli_capture.h"
#include "config.h"
#include "engine.h"
#include "pg_util.h"
#include "store_init.h"
#include "test_util.h"

static char schema[64]; /* "cerb_g<pid>" — set in main */

static char *guard_cfg(const char *guard_extra)
{
    char pe[128], ex[256];
    snprintf(pe, sizeof pe, "schema = \"%s\";", schema);
    snprintf(ex, sizeof ex, "guard = { keep_ms = 4000; %s };", guard_extra ? guard_extra : "");
    return pg_test_config(pe, ex);
}

/* A session whose search_path is the suite's schema. */
static PGconn *raw(void)
{
    PGconn *pg = pg_test_connect(NULL);
    assert_non_null(pg);
    const char *v[1] = {schema};
    PGresult *r = pg_test_exec(pg, "SELECT set_config('search_path', $1, false)", 1, v);
    assert_non_null(r);
    PQclear(r);
    return pg;
}

/* The first column of the first row of sql, as text; "" when none or
 * NULL. */
static char *scalar(PGconn *pg, const char *sql, int n, const char *const *v)
{
    PGresult *r = pg_test_exec(pg, sql, n, v);
    assert_non_null(r);
    char *s = strdup(PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return s;
}

static long long scalar_ll(PGconn *pg, const char *sql, int n, const char *const *v)
{
    char *s = scalar(pg, sql, n, v);
    long long x = strtoll(s, NULL, 10);
    free(s);
    return x;
}

/* Live records of this suite (expired ones count as absent everywhere). */
static size_t guard_records(void)
{
    PGconn *pg = raw();
    long long n = scalar_ll(pg,
                            "SELECT count(*) FROM cerberus_guard WHERE until IS NULL OR "
                            "until > clock_timestamp()",
                            0, NULL);
    PQfinish(pg);
    return (size_t)n;
}

#include "guard_cases.h"

/* ---- the engine, directly ---- */

struct eng {
    const struct cerb_engine_ops *ops;
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void eng_open(struct eng *x)
{
    x->ops = cerb__engine_find("pg");
    assert_non_null(x->ops);
    assert_true(cerb__engine_has_guard(x->ops));
    char *text = guard_cfg(NULL);
    assert_int_equal(cerb__config_from_string(text, &x->cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = x->cfg};
    x->e = NULL;
    assert_int_equal(cerb__engine_open(x->ops, &env, &x->e), CERB_OK);
}

static void eng_close(struct eng *x)
{
    cerb__engine_close(x->ops, x->e);
    cerb__config_free(x->cfg);
}

/* A record of a fresh id, with token number tok and running_ms. */
static void rec_init(cerb_guard_rec *r, const char *scope, unsigned tok, int64_t running_ms)
{
    char *name = test_name("rec");
    memset(r, 0, sizeof *r);
    r->scope = scope;
    gc_record_hex("pgt", scope, name, strlen(name), r->id);
    free(name);
    snprintf(r->token, sizeof r->token, "%032x", tok);
    r->running_ms = running_ms;
}

static cerb_status ebegin(struct eng *x, const cerb_guard_rec *r, void **res, size_t *len)
{
    cerb_grant g;
    void *dummy = NULL;
    size_t dl = 0;
    cerb_status st = cerb__engine_guard_begin(x->ops, x->e, r, &g, res ? res : &dummy,
                                              len ? len : &dl);
    if (!res)
        cerb__free(dummy);
    if (st == CERB_OK)
        assert_int_equal(g.ttl_ms, r->running_ms);
    return st;
}

static cerb_status efinish(struct eng *x, const cerb_guard_rec *r, int ok, const void *res,
                           size_t len, int64_t keep)
{
    cerb_outcome oc;
    return cerb__engine_guard_finish(x->ops, x->e, r, ok, res, len, keep, &oc);
}

static cerb_guard_found echeck(struct eng *x, const cerb_guard_rec *r)
{
    cerb_guard_found f;
    assert_int_equal(cerb__engine_guard_check(x->ops, x->e, r, &f), CERB_OK);
    return f;
}

static cerb_status erenew(struct eng *x, const cerb_guard_rec *r)
{
    cerb_grant g;
    return cerb__engine_guard_renew(x->ops, x->e, r, &g);
}

/* ---- layout ---- */

static void test_pg_guard_layout(void **state)
{
    (void)state;
    cerb_client *c = gc_open("app = \"shop\"; running_ms = 5000;");
    PGconn *pg = raw();
    char *key = gc_key("lay");
    char hex[65];
    gc_record_hex("shop", "create-order", key, strlen(key), hex);
    const char *v[1] = {hex};
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "create-order", key, strlen(key), NULL, &g), CERB_OK);
    char *s = scalar(pg,
                     "SELECT state || ' ' || length(token) || ' ' || (token ~ '^[0-9a-f]{32}$') "
                     "|| ' ' || convert_from(scope, 'UTF8') || ' ' || (result IS NULL) || ' ' || "
                     "(until - clock_timestamp() BETWEEN interval '4 s' AND interval '5 s') "
                     "FROM cerberus_guard WHERE id = $1",
                     1, v);
    assert_string_equal(s, "1 32 true create-order true true");
    free(s);
    const char res[] = "id=17\0\x01\x02\xff";
    assert_int_equal(cerb_guard_finish(g, 1, res, sizeof res), CERB_OK);
    cerb_guard_free(g);
    /* keep_ms 4000 (guard_cfg), on the server's clock. */
    s = scalar(pg,
               "SELECT state || ' ' || encode(result, 'hex') || ' ' || "
               "(until - clock_timestamp() BETWEEN interval '3 s' AND interval '4 s') "
               "FROM cerberus_guard WHERE id = $1",
               1, v);
    assert_string_equal(s, "2 69643d3137000102ff00 true");
    free(s);

    /* keep_ms = -1: until NULL, permanent (the test deletes it). */
    char *key2 = gc_key("forever");
    gc_record_hex("shop", "create-order", key2, strlen(key2), hex);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = -1;
    assert_int_equal(cerb_guard_begin(c, "create-order", key2, strlen(key2), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "f", 1), CERB_OK);
    cerb_guard_free(g);
    s = scalar(pg, "SELECT state || ' ' || (until IS NULL) FROM cerberus_guard WHERE id = $1",
               1, v);
    assert_string_equal(s, "2 true");
    free(s);
    gc_expect_duplicate(c, "create-order", key2, "f", 1);
    free(scalar(pg, "DELETE FROM cerberus_guard WHERE id = $1", 1, v));

    /* A failed attempt leaves no row. */
    char *key3 = gc_key("fail");
    gc_record_hex("shop", "create-order", key3, strlen(key3), hex);
    assert_int_equal(cerb_guard_begin(c, "create-order", key3, strlen(key3), NULL, &g), CERB_OK);
    assert_int_equal(scalar_ll(pg, "SELECT count(*) FROM cerberus_guard WHERE id = $1", 1, v), 1);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(scalar_ll(pg, "SELECT count(*) FROM cerberus_guard WHERE id = $1", 1, v), 0);
    /* The sweep's index is there (cerberus init made it). */
    char idx[128];
    snprintf(idx, sizeof idx, "%s.cerberus_guard_until", schema);
    const char *iv[1] = {idx};
    assert_int_equal(scalar_ll(pg, "SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)", 1,
                               iv),
                     1);
    free(key);
    free(key2);
    free(key3);
    PQfinish(pg);
    cerb_client_close(c);
}

/* ---- a done-record outlives its client; 64 KiB of binary ---- */

static void test_pg_guard_done_survives_client(void **state)
{
    (void)state;
    const size_t n = 64 * 1024; /* guard.max_result's default */
    unsigned char *big = malloc(n);
    assert_non_null(big);
    for (size_t i = 0; i < n; i++)
        big[i] = (unsigned char)(i % 3 == 0 ? 0 : i * 131 + 7); /* a NUL every third byte */
    char *key = gc_key("survive");
    cerb_client *a = gc_open(NULL);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(a, "ship", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, big, n), CERB_OK);
    cerb_guard_free(g);
    cerb_client_close(a); /* the writer is gone */
    cerb_client *b = gc_open(NULL);
    gc_expect_duplicate(b, "ship", key, big, n);
    cerb_client_close(b);
    PGconn *pg = raw();
    char hex[65];
    gc_record_hex("", "ship", key, strlen(key), hex);
    const char *v[1] = {hex};
    assert_int_equal(scalar_ll(pg, "SELECT length(result) FROM cerberus_guard WHERE id = $1", 1,
                               v),
                     (long long)n);
    PQfinish(pg);
    free(key);
    free(big);
}

/* ---- expiry on the server's clock, and the takeover ---- */

static void test_pg_guard_expiry_server_clock(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    PGconn *pg = raw();
    cerb_guard_rec a, b;
    rec_init(&a, "exp", 1, 300);
    b = a;
    snprintf(b.token, sizeof b.token, "%032x", 2);
    b.running_ms = 20000;
    const char *v[1] = {a.id};

    char *before = scalar(pg, "SELECT clock_timestamp()::text", 0, NULL);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(ebegin(&x, &a, NULL, NULL), CERB_OK);
    char *after = scalar(pg, "SELECT clock_timestamp()::text", 0, NULL);
    /* until = the server's clock at the begin + 300 ms. */
    const char *bv[3] = {a.id, before, after};
    assert_int_equal(scalar_ll(pg,
                               "SELECT count(*) FROM cerberus_guard WHERE id = $1 AND "
                               "until BETWEEN $2::timestamptz + interval '300 ms' AND "
                               "$3::timestamptz + interval '300 ms'",
                               3, bv),
                     1);
    free(before);
    free(after);
    /* Busy at once, and for as long as the claim lasts. */
    int busy = 0;
    while (cerb_test_now_ms() < t0 + 200) {
        assert_int_equal(ebegin(&x, &b, NULL, NULL), CERB_BUSY);
        assert_int_equal(echeck(&x, &b), CERB_GUARD_FOUND_OTHER);
        busy++;
        cerb_test_let_time_pass(20);
    }
    assert_true(busy >= 3);
    /* Then claimable, by the server's judgement alone. */
    cerb_status st;
    int64_t end = t0 + 3000;
    while ((st = ebegin(&x, &b, NULL, NULL)) == CERB_BUSY && cerb_test_now_ms() < end)
        cerb_test_let_time_pass(10);
    assert_int_equal(st, CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took >= 250);
    assert_true(took < 1500);
    /* The old attempt lost: renew, finish and delete are refused; the new
     * one's row is untouched. */
    assert_int_equal(echeck(&x, &a), CERB_GUARD_FOUND_OTHER);
    assert_int_equal(erenew(&x, &a), CERB_NOT_OWNER);
    assert_int_equal(efinish(&x, &a, 1, "old", 3, 4000), CERB_NOT_OWNER);
    assert_int_equal(efinish(&x, &a, 0, NULL, 0, 4000), CERB_NOT_OWNER);
    assert_int_equal(echeck(&x, &b), CERB_GUARD_FOUND_RUNNING);
    char *s = scalar(pg, "SELECT token FROM cerberus_guard WHERE id = $1", 1, v);
    assert_string_equal(s, b.token);
    free(s);

    /* An expired claim that nobody took over is gone too, as on redis:
     * not renewed, not finished; its delete removes it (NOT_OWNER). */
    cerb_guard_rec c;
    rec_init(&c, "exp", 3, 200);
    assert_int_equal(ebegin(&x, &c, NULL, NULL), CERB_OK);
    assert_int_equal(erenew(&x, &c), CERB_OK);
    cerb_test_let_time_pass(350);
    assert_int_equal(echeck(&x, &c), CERB_GUARD_FOUND_NONE);
    assert_int_equal(erenew(&x, &c), CERB_NOT_OWNER);
    assert_int_equal(efinish(&x, &c, 1, "late", 4, 4000), CERB_NOT_OWNER);
    assert_int_equal(efinish(&x, &c, 0, NULL, 0, 0), CERB_NOT_OWNER);
    const char *cv[1] = {c.id};
    assert_int_equal(scalar_ll(pg, "SELECT count(*) FROM cerberus_guard WHERE id = $1", 1, cv),
                     0);
    assert_int_equal(efinish(&x, &b, 0, NULL, 0, 0), CERB_OK);
    PQfinish(pg);
    eng_close(&x);
}

/* ---- the contract: re-sent steps, check, DUPLICATE's bytes ---- */

static void test_pg_guard_contract(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    cerb_guard_rec r, o;
    rec_init(&r, "contract", 11, 20000);
    o = r;
    snprintf(o.token, sizeof o.token, "%032x", 12);
    assert_int_equal(echeck(&x, &r), CERB_GUARD_FOUND_NONE);
    assert_int_equal(ebegin(&x, &r, NULL, NULL), CERB_OK);
    assert_int_equal(ebegin(&x, &r, NULL, NULL), CERB_OK); /* re-sent: still ours */
    assert_int_equal(echeck(&x, &r), CERB_GUARD_FOUND_RUNNING);
    assert_int_equal(ebegin(&x, &o, NULL, NULL), CERB_BUSY);
    assert_int_equal(erenew(&x, &o), CERB_NOT_OWNER);
    assert_int_equal(efinish(&x, &o, 1, "x", 1, 4000), CERB_NOT_OWNER);
    assert_int_equal(efinish(&x, &o, 0, NULL, 0, 0), CERB_NOT_OWNER);
    assert_int_equal(erenew(&x, &r), CERB_OK);
    assert_int_equal(efinish(&x, &r, 1, "r\0b", 3, 4000), CERB_OK);
    assert_int_equal(efinish(&x, &r, 1, "r\0b", 3, 4000), CERB_OK); /* re-sent */
    assert_int_equal(efinish(&x, &r, 0, NULL, 0, 0), CERB_NOT_OWNER); /* done stays */
    assert_int_equal(erenew(&x, &r), CERB_NOT_OWNER);                 /* not running */
    assert_int_equal(echeck(&x, &r), CERB_GUARD_FOUND_DONE);
    assert_int_equal(echeck(&x, &o), CERB_GUARD_FOUND_OTHER);
    void *res = NULL;
    size_t len = 0;
    assert_int_equal(ebegin(&x, &o, &res, &len), CERB_DUPLICATE);
    assert_int_equal(len, 3);
    assert_memory_equal(res, "r\0b", 4); /* and the NUL after them */
    cerb__free(res);
    res = NULL;
    assert_int_equal(ebegin(&x, &r, &res, &len), CERB_DUPLICATE); /* ours, done */
    cerb__free(res);
    /* An empty result is DUPLICATE with 0 bytes (and a NUL). */
    cerb_guard_rec e;
    rec_init(&e, "contract", 13, 20000);
    assert_int_equal(ebegin(&x, &e, NULL, NULL), CERB_OK);
    assert_int_equal(efinish(&x, &e, 1, NULL, 0, 4000), CERB_OK);
    e.token[0] = 'f';
    res = NULL;
    len = 9;
    assert_int_equal(ebegin(&x, &e, &res, &len), CERB_DUPLICATE);
    assert_int_equal(len, 0);
    assert_non_null(res);
    assert_int_equal(((char *)res)[0], '\0');
    cerb__free(res);
    eng_close(&x);
}

/* ---- races on one expired record, at the engine ---- */

#define RACERS 8
struct race {
    struct eng *x;
    cerb_guard_rec rec[RACERS];
    pthread_barrier_t go;
    atomic_int next;
    cerb_status st[RACERS];
    atomic_int oks_during_finish;
    atomic_bool finishing;
};

static void *racer(void *arg)
{
    struct race *r = arg;
    int i = atomic_fetch_add(&r->next, 1);
    pthread_barrier_wait(&r->go);
    r->st[i] = ebegin(r->x, &r->rec[i], NULL, NULL);
    return NULL;
}

/* Expired running claims and expired done-records are taken over by
 * exactly one of several racing begins (ON CONFLICT judges the latest
 * row); the rest are BUSY. Each racer has a connection of its own. */
static void test_pg_guard_takeover_race(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    for (int round = 0; round < 6; round++) {
        struct race r;
        memset(&r, 0, sizeof r);
        r.x = &x;
        cerb_guard_rec old;
        rec_init(&old, "takeover", 100, 150);
        assert_int_equal(ebegin(&x, &old, NULL, NULL), CERB_OK);
        if (round % 2) /* a done-record expiring, or a crashed claim */
            assert_int_equal(efinish(&x, &old, 1, "d", 1, 150), CERB_OK);
        for (int i = 0; i < RACERS; i++) {
            r.rec[i] = old;
            r.rec[i].running_ms = 20000;
            snprintf(r.rec[i].token, sizeof r.rec[i].token, "%032x", 200 + i);
        }
        cerb_test_let_time_pass(250); /* expired on the server */
        pthread_barrier_init(&r.go, NULL, RACERS);
        pthread_t t[RACERS];
        for (int i = 0; i < RACERS; i++)
            pthread_create(&t[i], NULL, racer, &r);
        for (int i = 0; i < RACERS; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&r.go);
        int ok = -1;
        for (int i = 0; i < RACERS; i++) {
            if (r.st[i] == CERB_OK) {
                assert_int_equal(ok, -1);
                ok = i;
            } else {
                assert_int_equal(r.st[i], CERB_BUSY);
            }
        }
        assert_true(ok >= 0);
        for (int i = 0; i < RACERS; i++)
            assert_int_equal(echeck(&x, &r.rec[i]),
                             i == ok ? CERB_GUARD_FOUND_RUNNING : CERB_GUARD_FOUND_OTHER);
        assert_int_equal(efinish(&x, &r.rec[ok], 0, NULL, 0, 0), CERB_OK);
    }
    eng_close(&x);
}

struct hammer {
    struct eng *x;
    cerb_guard_rec rec;
    atomic_bool stop;
    atomic_int ok, busy, dup, other;
};

static void *hammer_fn(void *arg)
{
    struct hammer *h = arg;
    while (!atomic_load(&h->stop)) {
        cerb_status st = ebegin(h->x, &h->rec, NULL, NULL);
        atomic_fetch_add(st == CERB_OK          ? &h->ok
                         : st == CERB_BUSY      ? &h->busy
                         : st == CERB_DUPLICATE ? &h->dup
                                                : &h->other,
                         1);
    }
    return NULL;
}

/* Begins of other attempts that race the owner's renewals and its finish
 * are never OK: BUSY while it runs, DUPLICATE once it is done. */
static void test_pg_guard_begin_races_finish(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    for (int round = 0; round < 4; round++) {
        cerb_guard_rec own;
        rec_init(&own, "hammer", 300, 20000);
        assert_int_equal(ebegin(&x, &own, NULL, NULL), CERB_OK);
        struct hammer h[3];
        pthread_t t[3];
        for (int i = 0; i < 3; i++) {
            memset(&h[i], 0, sizeof h[i]);
            h[i].x = &x;
            h[i].rec = own;
            snprintf(h[i].rec.token, sizeof h[i].rec.token, "%032x", 400 + i);
            pthread_create(&t[i], NULL, hammer_fn, &h[i]);
        }
        for (int i = 0; i < 5; i++)
            assert_int_equal(erenew(&x, &own), CERB_OK);
        assert_int_equal(efinish(&x, &own, 1, "one", 3, 4000), CERB_OK);
        cerb_test_let_time_pass(30);
        for (int i = 0; i < 3; i++)
            atomic_store(&h[i].stop, true);
        int dup = 0;
        for (int i = 0; i < 3; i++) {
            pthread_join(t[i], NULL);
            assert_int_equal(atomic_load(&h[i].ok), 0);
            assert_int_equal(atomic_load(&h[i].other), 0);
            dup += atomic_load(&h[i].dup);
        }
        assert_true(dup > 0);
    }
    eng_close(&x);
}

/* ---- hostile strings are data ---- */

static void test_pg_guard_hostile_strings(void **state)
{
    (void)state;
    static const char *const scopes[] = {
        "'); DROP TABLE cerberus_guard; --",
        "x\\'; DELETE FROM cerberus_guard; --",
        "\"quoted\" $1 $$dollar$$ %s \xc3\xa9\xff",
    };
    cerb_client *c = gc_open(NULL);
    PGconn *pg = raw();
    for (size_t i = 0; i < sizeof scopes / sizeof scopes[0]; i++) {
        char *k = gc_key("hostile");
        /* key: k, a quote, a NUL (keys are bytes), then SQL. */
        char key[256], tail[128];
        snprintf(tail, sizeof tail, "\\x00'; DROP SCHEMA %s CASCADE; --", schema);
        size_t kl = strlen(k);
        memcpy(key, k, kl);
        key[kl++] = '\'';
        key[kl++] = '\0';
        memcpy(key + kl, tail, strlen(tail) + 1);
        kl += strlen(tail);
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(c, scopes[i], key, kl, NULL, &g), CERB_OK);
        assert_int_equal(cerb_guard_finish(g, 1, scopes[i], strlen(scopes[i])), CERB_OK);
        cerb_guard_free(g);
        /* Another operation only differs in the key. */
        assert_int_equal(cerb_guard_begin(c, scopes[i], key, strlen(key), NULL, &g), CERB_OK);
        assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
        cerb_guard_free(g);
        cerb_guard *d = NULL;
        assert_int_equal(cerb_guard_begin(c, scopes[i], key, kl, NULL, &d),
                         CERB_DUPLICATE);
        size_t len = 0;
        const void *r = cerb_guard_result(d, &len);
        assert_int_equal(len, strlen(scopes[i]));
        assert_memory_equal(r, scopes[i], len);
        cerb_guard_free(d);
        /* The row holds the scope's exact bytes. */
        char hex[65], shex[600];
        gc_record_hex("", scopes[i], key, kl, hex);
        for (size_t j = 0; scopes[i][j]; j++)
            snprintf(shex + 2 * j, 3, "%02x", (unsigned char)scopes[i][j]);
        const char *v[2] = {hex, shex};
        assert_int_equal(scalar_ll(pg,
                                   "SELECT count(*) FROM cerberus_guard WHERE id = $1 AND "
                                   "scope = decode($2, 'hex') AND state = 2",
                                   2, v),
                         1);
        free(k);
    }
    /* Everything is still there. */
    assert_true(scalar_ll(pg, "SELECT count(*) FROM cerberus_guard", 0, NULL) >= 3);
    PQfinish(pg);
    cerb_client_close(c);
}

/* ---- expired records are swept ---- */

static long long expired_rows(PGconn *pg)
{
    return scalar_ll(pg, "SELECT count(*) FROM cerberus_guard WHERE until <= clock_timestamp()",
                     0, NULL);
}

/*
 * Records left behind (done ones past keep_ms, claims of crashed attempts
 * past running_ms) are deleted by the sweep that every 32nd begin of a
 * process runs; live and permanent (keep_ms = -1) records stay. Fails
 * with the sweep disabled: expired rows stay until their id is begun again.
 */
static void test_pg_guard_sweep(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    PGconn *pg = raw();
    cerb_guard_rec live, forever;
    rec_init(&live, "sweep", 500, 60000);
    rec_init(&forever, "sweep", 501, 60000);
    assert_int_equal(ebegin(&x, &live, NULL, NULL), CERB_OK);
    assert_int_equal(ebegin(&x, &forever, NULL, NULL), CERB_OK);
    assert_int_equal(efinish(&x, &forever, 1, "p", 1, -1), CERB_OK);
    for (int i = 0; i < 40; i++) {
        cerb_guard_rec r;
        rec_init(&r, "sweep", 600 + (unsigned)i, 200);
        assert_int_equal(ebegin(&x, &r, NULL, NULL), CERB_OK);
        if (i % 2)
            assert_int_equal(efinish(&x, &r, 1, "gone", 4, 200), CERB_OK);
        /* even ones: a crashed attempt, its claim left to run out */
    }
    cerb_test_let_time_pass(300);
    assert_true(expired_rows(pg) >= 40);
    /* Begins on other records, each deleted again by its own finish(0):
     * a sweep runs within 32 of them. */
    int begins = 0;
    while (expired_rows(pg) > 0 && begins < 70) {
        cerb_guard_rec r;
        rec_init(&r, "sweep-trigger", 700, 60000);
        assert_int_equal(ebegin(&x, &r, NULL, NULL), CERB_OK);
        assert_int_equal(efinish(&x, &r, 0, NULL, 0, 0), CERB_OK);
        begins++;
    }
    assert_int_equal(expired_rows(pg), 0);
    assert_true(begins <= 33);
    assert_int_equal(echeck(&x, &live), CERB_GUARD_FOUND_RUNNING);
    assert_int_equal(echeck(&x, &forever), CERB_GUARD_FOUND_DONE);
    const char *v[1] = {forever.id};
    free(scalar(pg, "DELETE FROM cerberus_guard WHERE id = $1", 1, v));
    assert_int_equal(efinish(&x, &live, 0, NULL, 0, 0), CERB_OK);
    PQfinish(pg);
    eng_close(&x);
}

/* ---- SQL errors: nothing changes, and the outcome is NO ---- */

/*
 * A row locked by another session (an operator's open transaction) makes
 * the guard's statements end with lock_timeout (half of op_timeout_ms): a
 * clean SQL error, outcome NO, the session kept, nothing written; once the
 * lock is gone every step works. Through the API, begin answers
 * CERB_UNAVAILABLE (on_unavailable = refuse) within its bound.
 */
static void test_pg_guard_row_locked(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    cerb_guard_rec r, o;
    rec_init(&r, "locked", 800, 20000);
    o = r;
    snprintf(o.token, sizeof o.token, "%032x", 801);
    assert_int_equal(ebegin(&x, &r, NULL, NULL), CERB_OK);
    PGconn *pg = raw();
    const char *v[1] = {r.id};
    PQclear(pg_test_exec(pg, "BEGIN", 0, NULL));
    free(scalar(pg, "SELECT id FROM cerberus_guard WHERE id = $1 FOR UPDATE", 1, v));
    cerb_grant g;
    void *res = NULL;
    size_t len = 0;
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb__engine_guard_begin(x.ops, x.e, &o, &g, &res, &len);
    assert_true(st != CERB_OK && st != CERB_BUSY && st != CERB_DUPLICATE);
    assert_int_equal(g.outcome, CERB_OUTCOME_NO);
    assert_non_null(strstr(cerb_last_error(), "lock"));
    cerb_outcome oc = CERB_OUTCOME_YES;
    st = cerb__engine_guard_finish(x.ops, x.e, &r, 1, "x", 1, 4000, &oc);
    assert_true(st != CERB_OK && st != CERB_NOT_OWNER);
    assert_int_equal(oc, CERB_OUTCOME_NO);
    st = cerb__engine_guard_renew(x.ops, x.e, &r, &g);
    assert_true(st != CERB_OK && st != CERB_NOT_OWNER);
    assert_true(cerb_test_now_ms() - t0 < 6000); /* op_timeout_ms (1 s) bounds each */
    PQclear(pg_test_exec(pg, "COMMIT", 0, NULL));
    /* Nothing changed: still r's running claim. */
    assert_int_equal(echeck(&x, &r), CERB_GUARD_FOUND_RUNNING);
    assert_int_equal(ebegin(&x, &o, NULL, NULL), CERB_BUSY);
    assert_int_equal(efinish(&x, &r, 1, "y", 1, 4000), CERB_OK);
    res = NULL;
    assert_int_equal(ebegin(&x, &o, &res, &len), CERB_DUPLICATE);
    assert_int_equal(len, 1);
    assert_memory_equal(res, "y", 1);
    cerb__free(res);

    /* Through the API: the engine could not answer, the policy refuses,
     * within the bound; then the row is free and the attempt finishes. */
    cerb_client *a = gc_open(NULL);
    char pe[160];
    snprintf(pe, sizeof pe, "schema = \"%s\"; op_timeout_ms = 400;", schema);
    char *cfg = pg_test_config(pe, "guard = { keep_ms = 4000; };");
    cerb_client *b = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(b);
    char *key = gc_key("locked");
    char hex[65];
    gc_record_hex("", "locked-api", key, strlen(key), hex);
    const char *hv[1] = {hex};
    cerb_guard *ga = NULL, *gb = NULL;
    assert_int_equal(cerb_guard_begin(a, "locked-api", key, strlen(key), NULL, &ga), CERB_OK);
    PQclear(pg_test_exec(pg, "BEGIN", 0, NULL));
    free(scalar(pg, "SELECT id FROM cerberus_guard WHERE id = $1 FOR UPDATE", 1, hv));
    t0 = cerb_test_now_ms();
    assert_int_equal(cerb_guard_begin(b, "locked-api", key, strlen(key), NULL, &gb),
                     CERB_UNAVAILABLE);
    assert_null(gb);
    assert_true(cerb_test_now_ms() - t0 < 3000);
    PQclear(pg_test_exec(pg, "COMMIT", 0, NULL));
    assert_int_equal(cerb_guard_finish(ga, 1, "api", 3), CERB_OK);
    cerb_guard_free(ga);
    cerb_client_close(b); /* its breaker saw the failures: a new client */
    b = gc_open(NULL);
    gc_expect_duplicate(b, "locked-api", key, "api", 3);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
    PQfinish(pg);
    eng_close(&x);
}

/* A schema with the lock tables but no guard table: guard calls say to run
 * `cerberus init` (CERB_ECONFIG), locks work. */
static void test_pg_guard_missing_table(void **state)
{
    (void)state;
    char other[96], sql[1024];
    snprintf(other, sizeof other, "%s_nog", schema);
    PGconn *pg = raw();
    snprintf(sql, sizeof sql,
             "DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s; CREATE TABLE "
             "%s.cerberus_lock (LIKE %s.cerberus_lock INCLUDING ALL); CREATE TABLE "
             "%s.cerberus_meta (LIKE %s.cerberus_meta INCLUDING ALL); INSERT INTO "
             "%s.cerberus_meta SELECT * FROM %s.cerberus_meta",
             other, other, other, schema, other, schema, other, schema);
    PGresult *r = PQexec(pg, sql);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    char pe[160];
    snprintf(pe, sizeof pe, "schema = \"%s\";", other);
    char *cfg = pg_test_config(pe, NULL);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, NULL, &g), CERB_ECONFIG);
    assert_null(g);
    assert_non_null(strstr(cerb_last_error(), "cerberus_guard"));
    assert_non_null(strstr(cerb_last_error(), "cerberus init"));
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, "nog", NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    snprintf(sql, sizeof sql, "DROP SCHEMA %s CASCADE", other);
    PQclear(PQexec(pg, sql));
    PQfinish(pg);
}

/* ---- `cerberus once` on pg ---- */

static void test_pg_guard_cli_once(void **state)
{
    (void)state;
    char bin[1024], mark[512];
    snprintf(bin, sizeof bin, "%s/cli/cerberus", cerb_test_build_dir());
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "cli_once: %s not built; skipped\n", bin);
        return;
    }
    char *text = guard_cfg(NULL);
    char *cfg = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(cfg);
    char *key = gc_key("cli");
    snprintf(mark, sizeof mark, "%s/cerb-pg-once-%d.txt", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    unlink(mark);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "echo ran >> %s", mark);
    char *ok_argv[] = {bin, "-c", cfg, "once", "pg-once", key, "--", "sh", "-c", cmd, NULL};
    char *fail_argv[] = {bin, "-c", cfg, "once", "pg-once", key, "--", "sh", "-c", "exit 3", NULL};
    struct cerb_test_capture r;
    /* A failure is passed on and forgotten. */
    assert_int_equal(cerb_test_capture_run(fail_argv, NULL, 30000, &r), 0);
    assert_int_equal(r.status, 3);
    cerb_test_capture_free(&r);
    /* A success runs once; the second exits 0 without running. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cerb_test_capture_run(ok_argv, NULL, 30000, &r), 0);
        if (r.status != 0)
            fail_msg("once: status %d, stderr: %s", r.status, r.err);
        if (i == 1)
            assert_true(r.err[0] != '\0'); /* says it was done already */
        cerb_test_capture_free(&r);
    }
    FILE *f = fopen(mark, "r");
    assert_non_null(f);
    char line[64];
    int lines = 0;
    while (fgets(line, sizeof line, f))
        lines++;
    fclose(f);
    assert_int_equal(lines, 1);
    unlink(mark);
    free(key);
    cerb_test_remove_file(cfg);
}

/* ---- the suite's schema ---- */

static int setup(void **state)
{
    (void)state;
    PGconn *pg = pg_test_connect(NULL);
    if (!pg)
        return -1;
    char sql[256];
    snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s", schema,
             schema);
    PGresult *r = PQexec(pg, sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "setup: %s", PQerrorMessage(pg));
    PQclear(r);
    PQfinish(pg);
    if (!ok)
        return -1;
    /* The tables and the index, as `cerberus init` makes them. */
    char *text = guard_cfg(NULL);
    struct cerb_config *cfg = NULL;
    if (cerb__config_from_string(text, &cfg) != CERB_OK) {
        free(text);
        return -1;
    }
    free(text);
    const struct cerb_store_ops *so = cerb__store_ops_find("pg");
    cerb_store_result res = CERB_STORE_FAILED;
    char line[512];
    cerb_status st = so ? so->init(cfg, 0, &res, line, sizeof line) : CERB_EINVAL;
    cerb__config_free(cfg);
    if (st != CERB_OK || res != CERB_STORE_PREPARED) {
        fprintf(stderr, "setup: init: %s (%s)\n", cerb_status_name(st), line);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    PGconn *pg = pg_test_connect(NULL);
    if (!pg)
        return -1;
    char sql[128];
    snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS %s CASCADE", schema);
    PQclear(PQexec(pg, sql));
    PQfinish(pg);
    return 0;
}

/* The processes of GUARD_CASES, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {GC_ROLE, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    snprintf(schema, sizeof schema, "cerb_g%ld", (long)getpid());
    cerb__engines_builtin();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pg_guard_layout),
        cmocka_unit_test(test_pg_guard_done_survives_client),
        cmocka_unit_test(test_pg_guard_expiry_server_clock),
        cmocka_unit_test(test_pg_guard_contract),
        cmocka_unit_test(test_pg_guard_takeover_race),
        cmocka_unit_test(test_pg_guard_begin_races_finish),
        cmocka_unit_test(test_pg_guard_hostile_strings),
        cmocka_unit_test(test_pg_guard_sweep),
        cmocka_unit_test(test_pg_guard_row_locked),
        cmocka_unit_test(test_pg_guard_missing_table),
        cmocka_unit_test(test_pg_guard_cli_once),
        GUARD_CASES,
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
