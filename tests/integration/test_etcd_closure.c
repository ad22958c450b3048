/*
 * test_etcd_closure.c — the etcd engine's switch closure records (engine
 * table version 4, core/engine.h "closure records", DESIGN.md §5) on a real
 * etcd (shared fixture), driven through the core's checking shims below the
 * lock API, as test_etcd_engine.c does:
 *  - closure_put raises only and answers what is stored; closure_get reads
 *    it back, from another instance too; the value is "<epoch> closed|open"
 *    in <prefix>__cerberus_closure__ and anything else is an error, never
 *    "no record";
 *  - acquire at an epoch below the record, or equal to a closed one, is
 *    refused (UNAVAILABLE, outcome NO, closed_epoch, both epochs named) and
 *    leaves no key, trylock or waiting (at once, not at its deadline), also
 *    a key of ours left queued by an earlier attempt; equal-and-open and
 *    above are granted; epoch -1 never looks at the record;
 *  - an instance whose cached record is stale (another instance wrote it)
 *    learns it from the acquire txn's failure branch and decides right, in
 *    two txns and no separate read;
 *  - a put racing many acquisitions of another instance at the old epoch:
 *    none that started after the put returned is granted;
 *  - the probe answers on a closed engine; held() is BUSY while only a
 *    queue entry is left, including a waiter queued before the record that
 *    is granted after it.
 * Every case has a prefix of its own: a record is per prefix, and a closed
 * one would refuse the other suites sharing the server (their holds have
 * epoch 0). Each case deletes its record at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "alloc.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "etcd_util.h"
#include "test_util.h"

static const struct cerb_engine_ops *ops;

/* ---- engines, holds, keys ---- */

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void eng_open(struct eng *g, const char *prefix)
{
    char extra[256];
    snprintf(extra, sizeof extra, "prefix = \"%s\";", prefix);
    char *text = etcd_test_config(extra, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg};
    if (cerb__engine_open(ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

static int64_t lease_of(struct eng *g)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    return s.id;
}

static uint64_t gen_of(struct eng *g)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    return s.gen;
}

static uint64_t txns_of(struct eng *g)
{
    return atomic_load(&g->e->stats.acquire_calls);
}

/* A hold as the core would make it, at configuration epoch `epoch`. */
struct hold {
    cerb_engine_lock lk;
    struct etcd_lock_priv priv;
};

static void hold_init(struct hold *h, const char *name, int64_t epoch)
{
    memset(h, 0, sizeof *h);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", 7);
    h->lk.lease_ms = 10000;
    h->lk.fair = 1;
    h->lk.priv = &h->priv;
    h->lk.epoch = epoch;
}

/* A prefix of its own per case ("cl-<pid>-<n>-<hex>/"). */
static char *case_prefix(void)
{
    char *n = test_name("cl");
    assert_non_null(n);
    char *p = malloc(strlen(n) + 2);
    assert_non_null(p);
    sprintf(p, "%s/", n);
    free(n);
    return p;
}

static int nkeys(const char *prefix, const char *name)
{
    char p[512];
    struct etcd_test_kv kv[8];
    snprintf(p, sizeof p, "%s%s/", prefix, name);
    return etcd_test_keys(etcd_test_port(), p, kv, 8);
}

static void record_key(char *buf, size_t n, const char *prefix)
{
    snprintf(buf, n, "%s__cerberus_closure__", prefix);
}

/* The record key's value as the server has it ("" when absent). */
static void raw_value(const char *prefix, char *out, size_t n)
{
    char key[512], body[1024];
    record_key(key, sizeof key, prefix);
    char *k = cerb__etcd_b64_encode(key, strlen(key));
    assert_non_null(k);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
    cerb__free(k);
    long st = 0;
    json_t *a = etcd_test_post(etcd_test_port(), "/v3/kv/range", body, NULL, &st);
    assert_non_null(a);
    assert_int_equal(st, 200);
    out[0] = '\0';
    const json_t *kv = json_array_get(json_object_get(a, "kvs"), 0);
    const char *v = kv ? json_string_value(json_object_get(kv, "value")) : NULL;
    if (v) {
        char *d = NULL;
        size_t dn = 0;
        assert_int_equal(cerb__etcd_b64_decode(v, &d, &dn), CERB_OK);
        snprintf(out, n, "%.*s", (int)dn, d);
        cerb__free(d);
    }
    json_decref(a);
}

static void raw_put_record(const char *prefix, const char *value)
{
    char key[512];
    record_key(key, sizeof key, prefix);
    if (*value)
        assert_int_equal(etcd_test_put_value(etcd_test_port(), key, value, 0), 0);
    else
        assert_int_equal(etcd_test_put(etcd_test_port(), key, 0), 0);
}

static void raw_delete_record(const char *prefix)
{
    char key[512];
    record_key(key, sizeof key, prefix);
    assert_true(etcd_test_delete(etcd_test_port(), key) >= 0);
}

static void put_ok(struct eng *g, int64_t epoch, int closed, int64_t want_epoch, int want_closed)
{
    cerb_closure rec = {.epoch = epoch, .closed = closed}, now;
    assert_int_equal(cerb__engine_closure_put(ops, g->e, &rec, &now), CERB_OK);
    assert_int_equal(now.epoch, want_epoch);
    assert_int_equal(now.closed, want_closed);
}

static void get_is(struct eng *g, int64_t epoch, int closed)
{
    cerb_closure now;
    assert_int_equal(cerb__engine_closure_get(ops, g->e, &now), CERB_OK);
    assert_int_equal(now.epoch, epoch);
    assert_int_equal(now.closed, closed);
}

/* acquire at `epoch` (deadline 0: trylock) is refused by the record at
 * `rec_epoch`, leaving no key of its own; returns how long it took. */
static int64_t refused(struct eng *g, const char *prefix, const char *name, int64_t epoch,
                       int64_t deadline_ns, int64_t rec_epoch, int keys_before)
{
    struct hold h;
    cerb_grant gr;
    char want[64];
    hold_init(&h, name, epoch);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb__engine_acquire(ops, g->e, &h.lk, deadline_ns, NULL, &gr),
                     CERB_UNAVAILABLE);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
    assert_int_equal(gr.closed_epoch, rec_epoch);
    snprintf(want, sizeof want, "at epoch %lld;", (long long)rec_epoch);
    assert_non_null(strstr(cerb_last_error(), want));
    snprintf(want, sizeof want, "at epoch %lld:", (long long)epoch);
    assert_non_null(strstr(cerb_last_error(), want));
    assert_non_null(strstr(cerb_last_error(), "reload the configuration"));
    assert_int_equal(nkeys(prefix, name), keys_before);
    return took;
}

static void granted(struct eng *g, const char *prefix, const char *name, int64_t epoch,
                    int64_t deadline_ns)
{
    struct hold h;
    cerb_grant gr;
    hold_init(&h, name, epoch);
    if (cerb__engine_acquire(ops, g->e, &h.lk, deadline_ns, NULL, &gr) != CERB_OK)
        fail_msg("epoch %lld not granted: %s", (long long)epoch, cerb_last_error());
    assert_int_equal(gr.closed_epoch, 0);
    assert_int_equal(nkeys(prefix, name), 1);
    assert_int_equal(cerb__engine_release(ops, g->e, &h.lk), CERB_OK);
    assert_int_equal(nkeys(prefix, name), 0);
}

/* ---- the record ---- */

static void test_put_raise_only_get(void **state)
{
    (void)state;
    struct eng a, b;
    char *pfx = case_prefix(), v[64];
    eng_open(&a, pfx);
    eng_open(&b, pfx);

    get_is(&a, 0, 0);
    put_ok(&a, 3, 0, 3, 0);
    raw_value(pfx, v, sizeof v);
    assert_string_equal(v, "3 open");
    get_is(&a, 3, 0);
    get_is(&b, 3, 0);
    /* Lower and equal epochs leave it; the answer is what stayed. */
    put_ok(&a, 2, 1, 3, 0);
    put_ok(&a, 3, 1, 3, 0);
    put_ok(&b, 1, 0, 3, 0);
    /* b has only read epoch 3; it raises on the server's state. */
    put_ok(&b, 5, 1, 5, 1);
    raw_value(pfx, v, sizeof v);
    assert_string_equal(v, "5 closed");
    /* a's cache says 3: its put of 4 must not lower 5. */
    put_ok(&a, 4, 0, 5, 1);
    get_is(&a, 5, 1);
    put_ok(&a, 6, 0, 6, 0);
    get_is(&b, 6, 0);
    /* Re-sending the same put (what the core does after an error) is
     * harmless. */
    put_ok(&b, 6, 0, 6, 0);
    raw_value(pfx, v, sizeof v);
    assert_string_equal(v, "6 open");
    cerb_closure bad = {.epoch = 0, .closed = 1}, now;
    assert_int_equal(cerb__engine_closure_put(ops, a.e, &bad, &now), CERB_EINVAL);

    raw_delete_record(pfx);
    eng_close(&a);
    eng_close(&b);
    free(pfx);
}

/* A value that is not a record is an error for get, put and every acquire
 * that checks; epoch -1 does not look. */
static void test_malformed_record(void **state)
{
    (void)state;
    static const char *const bad[] = {"5 shut", "05 closed", "5 closed ", " 5 closed",
                                      "-5 closed", "+5 open", "5open", "0 closed",
                                      "99999999999999999999 closed", "5 Closed", "closed",
                                      ""};
    struct eng a;
    char *pfx = case_prefix(), *name = test_name("mal");
    cerb_closure now;
    struct hold h;
    cerb_grant gr;
    eng_open(&a, pfx);

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        raw_put_record(pfx, bad[i]);
        assert_int_equal(cerb__engine_closure_get(ops, a.e, &now), CERB_EPROTO);
        assert_non_null(strstr(cerb_last_error(), "__cerberus_closure__"));
        cerb_closure rec = {.epoch = 7, .closed = 1};
        assert_int_not_equal(cerb__engine_closure_put(ops, a.e, &rec, &now), CERB_OK);
        hold_init(&h, name, 100);
        cerb_status st = cerb__engine_acquire(ops, a.e, &h.lk, 0, NULL, &gr);
        assert_int_not_equal(st, CERB_OK);
        assert_int_not_equal(st, CERB_BUSY);
        assert_int_equal(nkeys(pfx, name), 0);
    }
    /* The probe's kind of acquisition never reads it. */
    granted(&a, pfx, name, -1, 0);
    /* Repaired by hand: read as it is. */
    raw_put_record(pfx, "8 open");
    get_is(&a, 8, 0);
    granted(&a, pfx, name, 8, 0);

    raw_delete_record(pfx);
    eng_close(&a);
    free(pfx);
    free(name);
}

/* ---- acquire against the record ---- */

static void test_acquire_refused_granted(void **state)
{
    (void)state;
    struct eng a, b;
    char *pfx = case_prefix(), *name = test_name("ref");
    eng_open(&a, pfx);
    eng_open(&b, pfx);

    /* No record: every epoch. */
    granted(&b, pfx, name, 0, 0);
    granted(&b, pfx, name, 1, cerb__deadline_in(2000));

    put_ok(&a, 5, 1, 5, 1);
    /* b has not seen the record (its cache says absent). */
    refused(&b, pfx, name, 4, 0, 5, 0);
    refused(&b, pfx, name, 4, cerb__deadline_in(2000), 5, 0);
    refused(&b, pfx, name, 0, 0, 5, 0);
    refused(&b, pfx, name, 5, 0, 5, 0);
    refused(&b, pfx, name, 5, cerb__deadline_in(2000), 5, 0);
    granted(&b, pfx, name, 6, 0);
    granted(&b, pfx, name, 6, cerb__deadline_in(2000));
    granted(&b, pfx, name, -1, 0);
    granted(&b, pfx, name, -1, cerb__deadline_in(2000));

    /* Open at 7: 7 and above in, below out. */
    put_ok(&a, 7, 0, 7, 0);
    granted(&b, pfx, name, 7, 0);
    granted(&b, pfx, name, 7, cerb__deadline_in(2000));
    granted(&b, pfx, name, 8, 0);
    refused(&b, pfx, name, 6, 0, 7, 0);
    refused(&b, pfx, name, 6, cerb__deadline_in(2000), 7, 0);
    granted(&a, pfx, name, -1, 0);

    raw_delete_record(pfx);
    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
}

/* A waiting acquisition is refused before it queues: at once, not at its
 * deadline, and the holder's key is the only one left. */
static void test_waiting_refused_at_once(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha;
    cerb_grant gr;
    char *pfx = case_prefix(), *name = test_name("wait");
    eng_open(&a, pfx);
    eng_open(&b, pfx);
    hold_init(&ha, name, -1);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);

    put_ok(&a, 3, 1, 3, 1);
    int64_t took = refused(&b, pfx, name, 2, cerb__deadline_in(10000), 3, 1);
    assert_true(took < 2000);
    /* Known to b now: refused after one read, before any txn. */
    took = refused(&b, pfx, name, 3, cerb__deadline_in(10000), 3, 1);
    assert_true(took < 2000);

    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    raw_delete_record(pfx);
    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
}

/* A key of ours left queued by an earlier attempt (same session) must go
 * too: a refusal leaves no queue entry, whether the cache knew the record
 * (refused before the txn) or not (refused from its failure branch). */
static void test_refusal_drops_leftover_key(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha, hb;
    cerb_grant gr;
    char *pfx = case_prefix(), *name = test_name("left"), key[600];
    eng_open(&a, pfx);
    eng_open(&b, pfx);
    hold_init(&ha, name, -1);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    snprintf(key, sizeof key, "%s%s/%llx", pfx, name, (unsigned long long)lease_of(&b));

    for (int cached = 0; cached < 2; cached++) {
        put_ok(&a, 4 + cached, 1, 4 + cached, 1);
        assert_int_equal(etcd_test_put_value(etcd_test_port(), key, "0", lease_of(&b)), 0);
        assert_int_equal(nkeys(pfx, name), 2);
        hold_init(&hb, name, 3);
        hb.priv.lease = lease_of(&b); /* as after an earlier attempt */
        hb.priv.gen = gen_of(&b);
        assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, cerb__deadline_in(5000), NULL, &gr),
                         CERB_UNAVAILABLE);
        assert_int_equal(gr.closed_epoch, 4 + cached);
        assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
        assert_int_equal(nkeys(pfx, name), 1);
    }

    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    raw_delete_record(pfx);
    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
}

/*
 * b caches a record, a moves it: b's next acquire fails its txn on the
 * record's mod revision, reads the new record in the same failure branch,
 * and decides from it — refused, or granted by a second txn — without a
 * separate read. A record deleted by hand (an operator's reset) is read
 * again before b refuses on what it cached.
 */
static void test_stale_cache(void **state)
{
    (void)state;
    struct eng a, b;
    char *pfx = case_prefix(), *name = test_name("stale");
    eng_open(&a, pfx);
    eng_open(&b, pfx);

    put_ok(&a, 1, 0, 1, 0);
    granted(&b, pfx, name, 1, 0); /* learns {1, open} (one failed txn) */
    uint64_t t0 = txns_of(&b);
    granted(&b, pfx, name, 1, 0);
    assert_int_equal(txns_of(&b) - t0, 1); /* the steady state: one txn */

    put_ok(&a, 2, 1, 2, 1);
    t0 = txns_of(&b);
    refused(&b, pfx, name, 1, cerb__deadline_in(2000), 2, 0);
    assert_int_equal(txns_of(&b) - t0, 1);

    put_ok(&a, 3, 0, 3, 0);
    t0 = txns_of(&b);
    granted(&b, pfx, name, 3, cerb__deadline_in(2000));
    assert_int_equal(txns_of(&b) - t0, 2);
    refused(&b, pfx, name, 2, 0, 3, 0);

    /* b knows {3, open}, which refuses 2; gone from the server, 2 is in. */
    raw_delete_record(pfx);
    granted(&b, pfx, name, 2, 0);
    get_is(&b, 0, 0);

    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
}

/* ---- a put racing acquisitions ---- */

#define RACERS 4
#define RACE_MS 800

struct race {
    struct eng *g;
    char *name;            /* racers 0 and 1 share one (they queue) */
    int id;
    _Atomic int64_t *put_done;
    atomic_int grants, refusals, late_grants, errors;
};

static void *racer(void *ud)
{
    struct race *r = ud;
    struct hold h;
    cerb_grant gr;
    for (int i = 0; i < 100000; i++) {
        int64_t done = atomic_load(r->put_done);
        if (done && cerb_monotime() - done > (int64_t)RACE_MS * CERB_NS_PER_MS)
            break;
        hold_init(&h, r->name, 1);
        /* Half wait (and queue behind each other), half try. */
        int64_t deadline = r->id < 2 ? cerb__deadline_in(300) : 0;
        cerb_status st = cerb__engine_acquire(ops, r->g->e, &h.lk, deadline, NULL, &gr);
        if (st == CERB_OK) {
            atomic_fetch_add(&r->grants, 1);
            /* Started after the put returned: must have been refused. */
            if (done)
                atomic_fetch_add(&r->late_grants, 1);
            if (cerb__engine_release(ops, r->g->e, &h.lk) != CERB_OK)
                atomic_fetch_add(&r->errors, 1);
        } else if (st == CERB_UNAVAILABLE) {
            if (gr.closed_epoch != 2 || gr.outcome != CERB_OUTCOME_NO)
                atomic_fetch_add(&r->errors, 1);
            atomic_fetch_add(&r->refusals, 1);
        } else if (st != CERB_BUSY && st != CERB_TIMEOUT) {
            print_message("racer %d: %s: %s\n", r->id, cerb_status_name(st), cerb_last_error());
            atomic_fetch_add(&r->errors, 1);
        }
    }
    return NULL;
}

static bool all_granted_twice(void *ud)
{
    struct race *r = ud;
    for (int i = 0; i < RACERS; i++)
        if (atomic_load(&r[i].grants) < 2)
            return false;
    return true;
}

/*
 * Two client instances (b, c) at epoch 1 acquire in a loop — racers 0 and
 * 1 wait on one name from either instance (so they queue behind each
 * other; one instance calls acquire for a name from one thread at a time,
 * as the core does), 2 and 3 trylock names of their own — while a stores
 * {2, closed}. Neither b nor c has seen that record: each learns it from a
 * failed txn.
 */
static void test_put_races_acquisitions(void **state)
{
    (void)state;
    struct eng a, b, c;
    struct race r[RACERS];
    pthread_t t[RACERS];
    _Atomic int64_t put_done = 0;
    char *pfx = case_prefix(), *shared = test_name("race");
    eng_open(&a, pfx);
    eng_open(&b, pfx);
    eng_open(&c, pfx);
    put_ok(&a, 1, 0, 1, 0);

    for (int i = 0; i < RACERS; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].g = i % 2 ? &c : &b;
        r[i].name = i < 2 ? shared : test_name("race");
        r[i].id = i;
        r[i].put_done = &put_done;
        assert_int_equal(pthread_create(&t[i], NULL, racer, &r[i]), 0);
    }
    /* Every racer in full swing before the put. */
    assert_wait_until(all_granted_twice, r, 20000);
    cerb_closure rec = {.epoch = 2, .closed = 1}, now;
    assert_int_equal(cerb__engine_closure_put(ops, a.e, &rec, &now), CERB_OK);
    atomic_store(&put_done, cerb_monotime());
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);

    int grants = 0, refusals = 0;
    for (int i = 0; i < RACERS; i++) {
        print_message("racer %d: %d grants, %d refused, %d granted after the put, %d errors\n",
                      i, atomic_load(&r[i].grants), atomic_load(&r[i].refusals),
                      atomic_load(&r[i].late_grants), atomic_load(&r[i].errors));
        assert_int_equal(atomic_load(&r[i].late_grants), 0);
        assert_int_equal(atomic_load(&r[i].errors), 0);
        assert_true(atomic_load(&r[i].refusals) > 0);
        assert_int_equal(nkeys(pfx, r[i].name), 0);
        grants += atomic_load(&r[i].grants);
        refusals += atomic_load(&r[i].refusals);
    }
    assert_true(grants >= 2 * RACERS);
    assert_true(refusals >= RACERS);

    for (int i = 2; i < RACERS; i++)
        free(r[i].name);
    raw_delete_record(pfx);
    eng_close(&a);
    eng_close(&b);
    eng_close(&c);
    free(pfx);
    free(shared);
}

/* ---- probe and held() on a closed engine ---- */

static void test_probe_closed(void **state)
{
    (void)state;
    struct eng a;
    char *pfx = case_prefix(), *name = test_name("probe");
    eng_open(&a, pfx);
    put_ok(&a, 9, 1, 9, 1);
    assert_int_equal(cerb__engine_probe(ops, a.e, 2000), CERB_OK);
    /* The canary's kind of acquisition (epoch -1) is never refused. */
    granted(&a, pfx, name, -1, 0);
    granted(&a, pfx, name, -1, cerb__deadline_in(2000));
    refused(&a, pfx, name, 9, 0, 9, 0);
    raw_delete_record(pfx);
    eng_close(&a);
    free(pfx);
    free(name);
}

struct waiter {
    struct eng *g;
    struct hold h;
    cerb_status st;
    cerb_grant gr;
};

static void *wait_acquire(void *ud)
{
    struct waiter *w = ud;
    w->st = cerb__engine_acquire(ops, w->g->e, &w->h.lk, cerb__deadline_in(15000), NULL, &w->gr);
    return NULL;
}

struct nk {
    const char *prefix, *name;
    int n;
};

static bool has_nkeys(void *ud)
{
    struct nk *q = ud;
    return nkeys(q->prefix, q->name) == q->n;
}

/*
 * held() counts queue entries, not only the holder: a waiter queued before
 * the record was stored may be granted after it (its key needs no further
 * write to become the holder), so "free" must wait for it. And a lone key
 * that nobody has been told it holds (a waiter whose turn came) is BUSY.
 */
static void test_held_sees_waiters(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha;
    struct waiter w;
    pthread_t t;
    cerb_grant gr;
    char *pfx = case_prefix(), *name = test_name("held"), key[600];
    eng_open(&a, pfx);
    eng_open(&b, pfx);

    hold_init(&ha, name, -1);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    memset(&w, 0, sizeof w);
    w.g = &b;
    hold_init(&w.h, name, 1);
    assert_int_equal(pthread_create(&t, NULL, wait_acquire, &w), 0);
    struct nk two = {pfx, name, 2};
    assert_wait_until(has_nkeys, &two, 10000);

    put_ok(&a, 2, 1, 2, 1);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    /* Queued before the record: granted after it. */
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(w.st, CERB_OK);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    assert_int_equal(cerb__engine_release(ops, b.e, &w.h.lk), CERB_OK);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_OK);

    /* Only a queue entry left behind a holder that went (an etcdctl
     * waiter, keys as concurrency.Mutex writes them). */
    int64_t l1 = etcd_test_grant(etcd_test_port(), 30), l2 = etcd_test_grant(etcd_test_port(), 30);
    assert_true(l1 > 0 && l2 > 0);
    snprintf(key, sizeof key, "%s%s/%llx", pfx, name, (unsigned long long)l1);
    assert_int_equal(etcd_test_put(etcd_test_port(), key, l1), 0);
    snprintf(key, sizeof key, "%s%s/%llx", pfx, name, (unsigned long long)l2);
    assert_int_equal(etcd_test_put(etcd_test_port(), key, l2), 0);
    assert_int_equal(etcd_test_revoke(etcd_test_port(), l1), 0);
    assert_int_equal(nkeys(pfx, name), 1);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    assert_int_equal(cerb__engine_held(ops, b.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    assert_int_equal(etcd_test_revoke(etcd_test_port(), l2), 0);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_OK);

    raw_delete_record(pfx);
    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
}

static int setup(void **state)
{
    (void)state;
    cerb__engines_builtin();
    ops = cerb__engine_find("etcd");
    return ops && cerb__engine_has_closure(ops) ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_raise_only_get),
        cmocka_unit_test(test_malformed_record),
        cmocka_unit_test(test_acquire_refused_granted),
        cmocka_unit_test(test_waiting_refused_at_once),
        cmocka_unit_test(test_refusal_drops_leftover_key),
        cmocka_unit_test(test_stale_cache),
        cmocka_unit_test(test_put_races_acquisitions),
        cmocka_unit_test(test_probe_closed),
        cmocka_unit_test(test_held_sees_waiters),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
