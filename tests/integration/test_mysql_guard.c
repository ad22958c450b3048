/*
 * test_mysql_guard.c — the idempotency guard on the test MariaDB (shared
 * fixture): the engine-independent cases (guard_cases.h: races of threads
 * and processes, a SIGKILLed and a SIGSTOPped attempt, keep_ms, result
 * limits, bad input, no live records left), and what only mysql has:
 *  - the layout: one row of cerberus_guard per record (id, scope byte for
 *    byte, token, state 1/2, until on the server's clock — NULL with
 *    keep_ms = -1 — and the result, binary), none after a failure, and the
 *    sweep's index;
 *  - a begin on a session whose last statement set LAST_INSERT_ID (a lock
 *    grant's fence) still claims: the claim is told by the statement's own
 *    insert id;
 *  - a done-record outlives its client: 64 KiB with NULs comes back whole;
 *  - expiry on the server's clock and the takeover, the old attempt's steps
 *    then refused;
 *  - the engine's contract directly: re-sent begin and finish, check's four
 *    answers, an expired-record takeover raced by threads (exactly one
 *    wins), begins racing a finish (never OK);
 *  - expired records are swept, live and permanent ones are not;
 *  - a database without cerberus_guard says to run `cerberus init`, while
 *    locks there still work.
 * The guard table of the test server is this suite's alone: setup and
 * teardown empty it, so counting records is exact.
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
#include "config.h"
#include "engine.h"
#include "mysql_util.h"
#include "test_util.h"

static char *guard_cfg(const char *guard_extra)
{
    char ex[256];
    snprintf(ex, sizeof ex, "guard = { keep_ms = 4000; %s };", guard_extra ? guard_extra : "");
    return mysql_test_config("pool = 12;", ex);
}

static MYSQL *raw(void)
{
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    return my;
}

/* The first column of the first row of sql with `val` bound to every ?,
 * as an integer (-1 for NULL or no row). */
static long long q(MYSQL *my, const char *sql, const char *val)
{
    int64_t v = -2;
    assert_int_equal(mysql_test_exec1(my, sql, val, &v), 0);
    return (long long)v;
}

/* Live records (expired ones count as absent everywhere). */
static size_t guard_records(void)
{
    MYSQL *my = raw();
    long long n = q(my,
                    "SELECT COUNT(*) FROM cerberus_guard WHERE until IS NULL OR "
                    "until > UTC_TIMESTAMP(6)",
                    NULL);
    mysql_close(my);
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
    x->ops = cerb__engine_find("mysql");
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
    gc_record_hex("myt", scope, name, strlen(name), r->id);
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

static void test_my_guard_layout(void **state)
{
    (void)state;
    cerb_client *c = gc_open("app = \"shop\"; running_ms = 5000;");
    MYSQL *my = raw();
    char *key = gc_key("lay");
    char hex[65];
    gc_record_hex("shop", "create-order", key, strlen(key), hex);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "create-order", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(q(my,
                       "SELECT state = 1 AND token REGEXP '^[0-9a-f]{32}$' AND scope = "
                       "'create-order' AND result IS NULL AND TIMESTAMPDIFF(MICROSECOND, "
                       "UTC_TIMESTAMP(6), until) BETWEEN 4000000 AND 5000000 FROM "
                       "cerberus_guard WHERE id = ?",
                       hex),
                     1);
    const char res[] = "id=17\0\x01\x02\xff";
    assert_int_equal(cerb_guard_finish(g, 1, res, sizeof res), CERB_OK);
    cerb_guard_free(g);
    /* keep_ms 4000 (guard_cfg), on the server's clock; the bytes as sent. */
    assert_int_equal(q(my,
                       "SELECT state = 2 AND HEX(result) = '69643D3137000102FF00' AND "
                       "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), until) BETWEEN 3000000 AND "
                       "4000000 FROM cerberus_guard WHERE id = ?",
                       hex),
                     1);

    /* keep_ms = -1: until NULL, permanent (the test deletes it). */
    char *key2 = gc_key("forever");
    gc_record_hex("shop", "create-order", key2, strlen(key2), hex);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = -1;
    assert_int_equal(cerb_guard_begin(c, "create-order", key2, strlen(key2), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "f", 1), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(q(my, "SELECT state = 2 AND until IS NULL FROM cerberus_guard WHERE id = ?",
                       hex),
                     1);
    gc_expect_duplicate(c, "create-order", key2, "f", 1);
    assert_int_equal(q(my, "DELETE FROM cerberus_guard WHERE id = ?", hex), 1);

    /* A failed attempt leaves no row. */
    char *key3 = gc_key("fail");
    gc_record_hex("shop", "create-order", key3, strlen(key3), hex);
    assert_int_equal(cerb_guard_begin(c, "create-order", key3, strlen(key3), NULL, &g), CERB_OK);
    assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ?", hex), 1);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ?", hex), 0);
    /* The sweep's index is there (cerberus init made it). */
    assert_int_equal(q(my,
                       "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = "
                       "'cerb' AND TABLE_NAME = 'cerberus_guard' AND INDEX_NAME = "
                       "'cerberus_guard_until'",
                       NULL),
                     1);
    free(key);
    free(key2);
    free(key3);
    mysql_close(my);
    cerb_client_close(c);
}

/* ---- a begin after a lock grant on the same session ---- */

static void test_my_guard_after_last_insert_id(void **state)
{
    (void)state;
    /* Two connections: the lock's grant (LAST_INSERT_ID(fence)) runs on
     * the first; once it is released, that session pins no hold and is the
     * one the guard picks. */
    char *cfg = mysql_test_config("pool = 2;", "guard = { keep_ms = 4000; };");
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    char *name = test_name("guard-lii");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cerb_lock_trylock(l), CERB_OK);
        assert_true(cerb_lock_fencing_token(l) > 0);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        char *key = gc_key("lii");
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(c, "lii", key, strlen(key), NULL, &g), CERB_OK);
        assert_int_equal(cerb_guard_finish(g, 1, "ok", 2), CERB_OK);
        cerb_guard_free(g);
        gc_expect_duplicate(c, "lii", key, "ok", 2);
        free(key);
    }
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- a done-record outlives its client; 64 KiB of binary ---- */

static void test_my_guard_done_survives_client(void **state)
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
    MYSQL *my = raw();
    char hex[65];
    gc_record_hex("", "ship", key, strlen(key), hex);
    assert_int_equal(q(my, "SELECT LENGTH(result) FROM cerberus_guard WHERE id = ?", hex),
                     (long long)n);
    mysql_close(my);
    free(key);
    free(big);
}

/* ---- expiry on the server's clock, and the takeover ---- */

static void test_my_guard_expiry_server_clock(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    MYSQL *my = raw();
    cerb_guard_rec a, b;
    rec_init(&a, "exp", 1, 300);
    b = a;
    snprintf(b.token, sizeof b.token, "%032x", 2);
    b.running_ms = 20000;

    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(ebegin(&x, &a, NULL, NULL), CERB_OK);
    /* until = the server's clock at the begin + 300 ms. */
    long long left = q(my,
                       "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), until) FROM "
                       "cerberus_guard WHERE id = ?",
                       a.id);
    assert_true(left > 0 && left <= 300000);
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
    assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ? AND token = "
                           "'00000000000000000000000000000002' AND state = 1", a.id),
                     1);

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
    assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ?", c.id), 0);
    assert_int_equal(efinish(&x, &b, 0, NULL, 0, 0), CERB_OK);
    mysql_close(my);
    eng_close(&x);
}

/* ---- the contract: re-sent steps, check, DUPLICATE's bytes ---- */

static void test_my_guard_contract(void **state)
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
 * exactly one of several racing begins (ON DUPLICATE KEY UPDATE judges the
 * latest row); the rest are BUSY. Each racer has a connection of its own. */
static void test_my_guard_takeover_race(void **state)
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
static void test_my_guard_begin_races_finish(void **state)
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

/* ---- the sweep ---- */

static void test_my_guard_sweep(void **state)
{
    (void)state;
    struct eng x;
    eng_open(&x);
    MYSQL *my = raw();
    /* Expired rows of every kind, a live one and a permanent one. */
    cerb_guard_rec dead[6], live, perm;
    for (int i = 0; i < 6; i++) {
        rec_init(&dead[i], "sweep", 500 + (unsigned)i, 100);
        assert_int_equal(ebegin(&x, &dead[i], NULL, NULL), CERB_OK);
        if (i % 2)
            assert_int_equal(efinish(&x, &dead[i], 1, "d", 1, 100), CERB_OK);
    }
    rec_init(&live, "sweep", 600, 60000);
    assert_int_equal(ebegin(&x, &live, NULL, NULL), CERB_OK);
    rec_init(&perm, "sweep", 601, 60000);
    assert_int_equal(ebegin(&x, &perm, NULL, NULL), CERB_OK);
    assert_int_equal(efinish(&x, &perm, 1, "p", 1, -1), CERB_OK);
    cerb_test_let_time_pass(250);
    long long expired =
        q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE until <= UTC_TIMESTAMP(6)", NULL);
    assert_true(expired >= 6);
    /* Begins sweep (the first of every GUARD_SWEEP_EVERY); 16 begins make
     * at least two sweeps of up to 16 rows. */
    for (int i = 0; i < 16; i++) {
        cerb_guard_rec r;
        rec_init(&r, "sweep", 700 + (unsigned)i, 20000);
        assert_int_equal(ebegin(&x, &r, NULL, NULL), CERB_OK);
        assert_int_equal(efinish(&x, &r, 0, NULL, 0, 0), CERB_OK);
    }
    for (int i = 0; i < 6; i++)
        assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ?", dead[i].id),
                         0);
    assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ?", live.id), 1);
    assert_int_equal(q(my, "SELECT COUNT(*) FROM cerberus_guard WHERE id = ?", perm.id), 1);
    assert_int_equal(efinish(&x, &live, 0, NULL, 0, 0), CERB_OK);
    assert_int_equal(q(my, "DELETE FROM cerberus_guard WHERE id = ?", perm.id), 1);
    mysql_close(my);
    eng_close(&x);
}

/* ---- no guard table ---- */

static void test_my_guard_missing_table(void **state)
{
    (void)state;
    MYSQL *my = raw();
    assert_int_equal(mysql_query(my, "RENAME TABLE cerberus_guard TO cerberus_guard_away"), 0);
    cerb_client *c = gc_open(NULL);
    char *key = gc_key("missing");
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(c, "m", key, strlen(key), NULL, &g);
    char err[512];
    snprintf(err, sizeof err, "%s", cerb_last_error());
    /* Locks still work there. */
    char *name = test_name("guardless");
    cerb_lock *l = cerb_test_handle(c, name);
    cerb_status lst = l ? cerb_lock_trylock(l) : CERB_EIO;
    if (lst == CERB_OK)
        cerb_lock_unlock(l);
    if (l)
        cerb_lock_free(l);
    cerb_client_close(c);
    assert_int_equal(mysql_query(my, "RENAME TABLE cerberus_guard_away TO cerberus_guard"), 0);
    mysql_close(my);
    print_message("begin: %s: %s\n", cerb_status_name(st), err);
    assert_int_equal(st, CERB_ECONFIG);
    assert_non_null(strstr(err, "cerberus_guard"));
    assert_non_null(strstr(err, "cerberus init"));
    assert_int_equal(lst, CERB_OK);
    free(name);
    free(key);
}

static int empty_table(void **state)
{
    (void)state;
    MYSQL *my = mysql_test_connect(NULL, NULL);
    if (!my)
        return -1;
    int rc = mysql_query(my, "DELETE FROM cerberus_guard");
    if (rc)
        fprintf(stderr, "setup: %s\n", mysql_error(my));
    mysql_close(my);
    return rc ? -1 : 0;
}

/* The processes of GUARD_CASES, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {GC_ROLE, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb__engines_builtin();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_my_guard_layout),
        cmocka_unit_test(test_my_guard_after_last_insert_id),
        cmocka_unit_test(test_my_guard_done_survives_client),
        cmocka_unit_test(test_my_guard_expiry_server_clock),
        cmocka_unit_test(test_my_guard_contract),
        cmocka_unit_test(test_my_guard_takeover_race),
        cmocka_unit_test(test_my_guard_begin_races_finish),
        cmocka_unit_test(test_my_guard_sweep),
        cmocka_unit_test(test_my_guard_missing_table),
        GUARD_CASES,
    };
    return cmocka_run_group_tests(tests, empty_table, empty_table);
}
