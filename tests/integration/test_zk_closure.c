/*
 * test_zk_closure.c — the zk engine's switch closure record (version 4 of
 * the engine table, core/engine.h; engine_zk/zk_closure.c), through the
 * core's shims on the shared test ZooKeeper.
 *
 * What is pinned: the node's text is parsed strictly and a malformed node
 * is an error, not "no record"; put only raises and get reads it back, also
 * from another instance; an acquisition whose epoch the record refuses
 * (below it, or equal and closed) is refused with CERB_UNAVAILABLE, outcome
 * NO and closed_epoch set, at once even with time left to wait, and leaves
 * no node; equal-and-open and above are granted, epoch -1 always; a put
 * racing acquisitions of another instance at the old epoch leaves none of
 * them granted from a create after it (the check is in the create's
 * transaction, not only in the instance's cache); a node queued before the
 * record may still be granted, and held() reports any child, a bare queue
 * entry included; the probe still answers on a closed engine.
 *
 * Records are permanent nodes next to the root, shared by every root under
 * the same parent: each test uses a root of its own
 * (<unique top>/locks) and removes its top at the end, so the suites that
 * share the server (root /cerberus/locks) never see a record.
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
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "test_util.h"
#include "zk_closure.h"
#include "zk_util.h"

static const struct cerb_engine_ops *ops;

/* An engine instance on a root of the test's own. */
struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

/* A test's place on the server: <top>/locks, and the record next to it. */
struct place {
    char *top;
    char root[512];
    char record[600];
};

static void place_make(struct place *p, const char *prefix)
{
    p->top = test_name(prefix);
    assert_non_null(p->top);
    snprintf(p->root, sizeof p->root, "%s/locks", p->top);
    snprintf(p->record, sizeof p->record, "%s%s", p->root, ZK_CLOSURE_NODE);
}

/* Delete path and everything below it (the test's own nodes only). */
static void remove_tree(zhandle_t *zh, const char *path)
{
    struct String_vector v = {0, NULL};
    if (zoo_get_children(zh, path, 0, &v) == ZOK) {
        for (int i = 0; i < v.count; i++) {
            char child[1024];
            snprintf(child, sizeof child, "%s/%s", path, v.data[i]);
            remove_tree(zh, child);
        }
        deallocate_String_vector(&v);
    }
    zoo_delete(zh, path, -1);
}

static void place_clear(struct place *p)
{
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    remove_tree(zh, p->top);
    cerb_test_zk_close(zh);
    free(p->top);
}

static void eng_open(struct eng *g, const struct place *p)
{
    char extra[700];
    snprintf(extra, sizeof extra, "root = \"%s\"; session_timeout_ms = 4000;", p->root);
    char *text = cerb_test_zk_config(NULL, extra, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = NULL, .ud = NULL};
    if (cerb__engine_open(ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

/* One acquisition's state: the lock and its private part. */
struct hold {
    cerb_engine_lock lk;
    void *priv;
    cerb_grant gr;
};

static void hold_init(struct hold *h, const char *name, int64_t epoch)
{
    memset(h, 0, sizeof *h);
    h->priv = calloc(1, ops->lock_priv_size);
    assert_non_null(h->priv);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", 0xc105e);
    h->lk.lease_ms = 4000;
    h->lk.priv = h->priv;
    h->lk.epoch = epoch;
}

static void hold_free(struct hold *h) { free(h->priv); }

/* Acquire with `wait_ms` to wait (0: trylock). */
static cerb_status acquire(struct eng *g, struct hold *h, int64_t wait_ms)
{
    memset(h->priv, 0, ops->lock_priv_size);
    int64_t dl = wait_ms > 0 ? cerb__deadline_in(wait_ms) : 0;
    return cerb__engine_acquire(ops, g->e, &h->lk, dl, NULL, &h->gr);
}

static cerb_closure put(struct eng *g, int64_t epoch, int closed)
{
    cerb_closure rec = {epoch, closed}, now = {-1, -1};
    if (cerb__engine_closure_put(ops, g->e, &rec, &now) != CERB_OK)
        fail_msg("put %lld: %s", (long long)epoch, cerb_last_error());
    return now;
}

static cerb_closure get(struct eng *g)
{
    cerb_closure now = {-1, -1};
    if (cerb__engine_closure_get(ops, g->e, &now) != CERB_OK)
        fail_msg("get: %s", cerb_last_error());
    return now;
}

/* Children of <root>/<name> (0 when the node is missing). */
static int children(const struct place *p, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", p->root, name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    int rc = ZOK;
    int n = cerb_test_zk_children(zh, path, NULL, &rc);
    cerb_test_zk_close(zh);
    if (n < 0 && rc == ZNONODE)
        return 0;
    assert_true(n >= 0);
    return n;
}

/* A refusal by the record `epoch` of a client at `mine`. */
static void assert_refused(const struct place *p, struct hold *h, cerb_status st, int64_t epoch,
                           int64_t mine)
{
    if (st != CERB_UNAVAILABLE)
        fail_msg("epoch %lld against record %lld: %s (%s), want UNAVAILABLE", (long long)mine,
                 (long long)epoch, cerb_status_name(st), cerb_last_error());
    assert_int_equal(h->gr.outcome, CERB_OUTCOME_NO);
    assert_int_equal(h->gr.closed_epoch, epoch);
    char want[64];
    snprintf(want, sizeof want, "epoch %lld", (long long)epoch);
    assert_non_null(strstr(cerb_last_error(), want));
    snprintf(want, sizeof want, "epoch %lld", (long long)mine);
    assert_non_null(strstr(cerb_last_error(), want));
    assert_int_equal(children(p, h->lk.name), 0);
}

static void assert_granted(struct eng *g, struct hold *h, cerb_status st)
{
    if (st != CERB_OK)
        fail_msg("epoch %lld: %s (%s), want a grant", (long long)h->lk.epoch,
                 cerb_status_name(st), cerb_last_error());
    assert_int_equal(h->gr.closed_epoch, 0);
    assert_int_equal(cerb__engine_release(ops, g->e, &h->lk), CERB_OK);
}

static int setup(void **state)
{
    (void)state;
    cerb__engines_builtin();
    ops = cerb__engine_find("zk");
    return ops && cerb__engine_has_closure(ops) ? 0 : -1;
}

/* ---- the node's text (pure) ---- */

static void test_parse_strictly(void **state)
{
    (void)state;
    cerb_closure r = {-1, -1};
    char buf[48];
    assert_true(cerb__zk_closure_parse("7 closed", 8, &r) && r.epoch == 7 && r.closed == 1);
    assert_true(cerb__zk_closure_parse("12 open", 7, &r) && r.epoch == 12 && r.closed == 0);
    assert_true(cerb__zk_closure_parse("0 open", 6, &r) && r.epoch == 0 && r.closed == 0);
    assert_true(cerb__zk_closure_parse("9223372036854775807 open", 24, &r) &&
                r.epoch == INT64_MAX);
    const char *bad[] = {"",          "7",         "7 ",        " 7 open",  "7  open",
                         "7 Open",    "7 closed\n", "07 open",  "-7 open",  "+7 open",
                         "0 closed",  "7 opened",  "7open",     "x open",   "7 open x",
                         "9223372036854775808 open"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (cerb__zk_closure_parse(bad[i], (int)strlen(bad[i]), &r))
            fail_msg("\"%s\" parsed", bad[i]);
    assert_false(cerb__zk_closure_parse(NULL, -1, &r));
    /* Only len bytes count: what follows is not read. */
    assert_true(cerb__zk_closure_parse("3 openXYZ", 6, &r) && r.epoch == 3);

    cerb_closure w = {42, 1};
    assert_true(cerb__zk_closure_format(&w, buf, sizeof buf));
    assert_string_equal(buf, "42 closed");
    assert_true(cerb__zk_closure_parse(buf, (int)strlen(buf), &r) && r.epoch == 42 && r.closed);
    assert_false(cerb__zk_closure_format(&w, buf, 5));

    cerb_closure c4 = {4, 1}, o4 = {4, 0};
    assert_true(cerb__zk_closure_refuses(&c4, 3) && cerb__zk_closure_refuses(&c4, 4));
    assert_false(cerb__zk_closure_refuses(&c4, 5));
    assert_true(cerb__zk_closure_refuses(&o4, 3));
    assert_false(cerb__zk_closure_refuses(&o4, 4));
}

/* ---- get and put ---- */

static void test_put_raises_only_and_get_reads_it(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-put");
    struct eng a, b;
    eng_open(&a, &p);
    eng_open(&b, &p);

    cerb_closure r = get(&a);
    assert_true(r.epoch == 0 && r.closed == 0); /* no record */

    r = put(&a, 3, 1);
    assert_true(r.epoch == 3 && r.closed == 1);
    r = get(&a);
    assert_true(r.epoch == 3 && r.closed == 1);
    r = get(&b);
    assert_true(r.epoch == 3 && r.closed == 1);

    /* Lower or equal epochs leave it, whatever they say. */
    r = put(&b, 2, 0);
    assert_true(r.epoch == 3 && r.closed == 1);
    r = put(&b, 3, 0);
    assert_true(r.epoch == 3 && r.closed == 1);
    /* Re-sent: the same answer. */
    r = put(&a, 3, 1);
    assert_true(r.epoch == 3 && r.closed == 1);

    r = put(&b, 5, 0);
    assert_true(r.epoch == 5 && r.closed == 0);
    r = get(&a);
    assert_true(r.epoch == 5 && r.closed == 0);

    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char buf[64];
    int len = sizeof buf - 1;
    assert_int_equal(zoo_get(zh, p.record, 0, buf, &len, NULL), ZOK);
    buf[len] = '\0';
    assert_string_equal(buf, "5 open");

    /* Epoch 0 or below is no record to store (the shim says so). */
    cerb_closure zero = {0, 1}, now;
    assert_int_equal(cerb__engine_closure_put(ops, a.e, &zero, &now), CERB_EINVAL);

    cerb_test_zk_close(zh);
    eng_close(&a);
    eng_close(&b);
    place_clear(&p);
}

/* A node that does not hold a record is an error for get, put and an
 * acquisition with an epoch — never "no record" — and no concern of one
 * without an epoch. */
static void test_malformed_record_is_an_error(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-bad");
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    assert_int_equal(zoo_create(zh, p.top, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0), ZOK);
    const char *junk = "closed since 7";
    assert_int_equal(zoo_create(zh, p.record, junk, (int)strlen(junk), &ZOO_OPEN_ACL_UNSAFE, 0,
                                NULL, 0),
                     ZOK);
    struct eng a;
    eng_open(&a, &p);
    cerb_closure r, now, rec = {8, 1};
    assert_int_equal(cerb__engine_closure_get(ops, a.e, &r), CERB_EPROTO);
    assert_non_null(strstr(cerb_last_error(), ZK_CLOSURE_NODE));
    assert_int_equal(cerb__engine_closure_put(ops, a.e, &rec, &now), CERB_EPROTO);

    char *name = test_name("bad");
    struct hold h;
    hold_init(&h, name, 1);
    assert_int_equal(acquire(&a, &h, 0), CERB_EPROTO);
    assert_int_equal(h.gr.outcome, CERB_OUTCOME_NO);
    assert_int_equal(children(&p, name), 0);
    h.lk.epoch = -1;
    assert_granted(&a, &h, acquire(&a, &h, 0));

    /* Left as it was: nothing overwrote it. */
    char buf[64];
    int len = sizeof buf - 1;
    assert_int_equal(zoo_get(zh, p.record, 0, buf, &len, NULL), ZOK);
    buf[len] = '\0';
    assert_string_equal(buf, junk);

    hold_free(&h);
    free(name);
    cerb_test_zk_close(zh);
    eng_close(&a);
    place_clear(&p);
}

/* ---- acquisitions against the record ---- */

static void test_acquire_judged_by_the_record(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-acq");
    struct eng a, b;
    eng_open(&a, &p);
    eng_open(&b, &p);
    char *name = test_name("acq");
    struct hold h;
    hold_init(&h, name, 3);

    /* No record yet: every epoch is in. */
    assert_granted(&a, &h, acquire(&a, &h, 0));
    put(&a, 4, 1);

    /* a's cache learnt the record from its own put; b has none yet. */
    struct eng *both[] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        struct eng *g = both[i];
        h.lk.epoch = 3;
        assert_refused(&p, &h, acquire(g, &h, 0), 4, 3);
        h.lk.epoch = 4;
        assert_refused(&p, &h, acquire(g, &h, 0), 4, 4); /* equal and closed */
        h.lk.epoch = 5;
        assert_granted(g, &h, acquire(g, &h, 0));
        h.lk.epoch = 0;
        assert_refused(&p, &h, acquire(g, &h, 0), 4, 0);
        h.lk.epoch = -1;
        assert_granted(g, &h, acquire(g, &h, 0));
    }

    /* Open at 6: 6 is in, 5 no longer. b learns it only from a failed
     * check of its create. */
    put(&a, 6, 0);
    for (int i = 1; i >= 0; i--) {
        struct eng *g = both[i];
        h.lk.epoch = 6;
        assert_granted(g, &h, acquire(g, &h, 0));
        h.lk.epoch = 5;
        assert_refused(&p, &h, acquire(g, &h, 0), 6, 5);
        h.lk.epoch = 7;
        assert_granted(g, &h, acquire(g, &h, 0));
        h.lk.epoch = -1;
        assert_granted(g, &h, acquire(g, &h, 0));
    }

    hold_free(&h);
    free(name);
    eng_close(&a);
    eng_close(&b);
    place_clear(&p);
}

/* A wait with time left is refused at once, also by an instance whose
 * cached reading predates the record, and its queue entry is never made. */
static void test_waiting_acquisition_refused_at_once(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-wait");
    struct eng a, b;
    eng_open(&a, &p);
    eng_open(&b, &p);
    char *name = test_name("wait");
    struct hold holder, w;
    hold_init(&holder, name, -1);
    hold_init(&w, name, 2);

    /* b reads the record (none) with a grant of its own. */
    assert_granted(&b, &w, acquire(&b, &w, 0));
    assert_int_equal(acquire(&a, &holder, 0), CERB_OK);
    put(&a, 2, 1);

    struct eng *both[] = {&b, &a};
    for (int i = 0; i < 2; i++) {
        int64_t t0 = cerb_test_now_ms();
        cerb_status st = acquire(both[i], &w, 10000);
        int64_t took = cerb_test_now_ms() - t0;
        print_message("refused after %lld ms\n", (long long)took);
        if (st != CERB_UNAVAILABLE)
            fail_msg("%s (%s), want UNAVAILABLE", cerb_status_name(st), cerb_last_error());
        assert_int_equal(w.gr.closed_epoch, 2);
        assert_int_equal(w.gr.outcome, CERB_OUTCOME_NO);
        assert_true(took < 2000);
        assert_int_equal(children(&p, name), 1); /* the holder only */
    }
    assert_int_equal(cerb__engine_release(ops, a.e, &holder.lk), CERB_OK);

    hold_free(&holder);
    hold_free(&w);
    free(name);
    eng_close(&a);
    eng_close(&b);
    place_clear(&p);
}

/* ---- a put racing acquisitions ---- */

#define RACERS 4
#define RACE_MAX_MS 20000

struct racer {
    struct eng *g;
    char *name;
    _Atomic int64_t *put_done_ns; /* 0 until the put returned */
    atomic_int *grants;
    /* results, read after the join */
    int64_t late_grants;      /* grants of calls that began after the put */
    uint64_t max_fence;       /* the highest fence granted */
    cerb_status last;         /* how the loop ended */
    int64_t closed_epoch;
    int64_t refused_after_ms; /* from the put's return to the refusal */
};

static void *race_main(void *arg)
{
    struct racer *r = arg;
    struct hold h;
    memset(&h, 0, sizeof h);
    h.priv = calloc(1, ops->lock_priv_size);
    h.lk.name = r->name;
    snprintf(h.lk.token, sizeof h.lk.token, "%032x", 0x7ace);
    h.lk.lease_ms = 4000;
    h.lk.priv = h.priv;
    h.lk.epoch = 1;
    int64_t end = cerb_monotime() + RACE_MAX_MS * CERB_NS_PER_MS;
    r->last = CERB_TIMEOUT;
    while (h.priv && cerb_monotime() < end) {
        int64_t began = cerb_monotime();
        memset(h.priv, 0, ops->lock_priv_size);
        cerb_status st = cerb__engine_acquire(ops, r->g->e, &h.lk, 0, NULL, &h.gr);
        if (st == CERB_OK) {
            int64_t put_at = atomic_load(r->put_done_ns);
            if (put_at != 0 && began > put_at)
                r->late_grants++;
            if (h.gr.fence > r->max_fence)
                r->max_fence = h.gr.fence;
            atomic_fetch_add(r->grants, 1);
            cerb__engine_release(ops, r->g->e, &h.lk);
            continue;
        }
        r->last = st;
        if (st == CERB_UNAVAILABLE) {
            r->closed_epoch = h.gr.closed_epoch;
            int64_t put_at = atomic_load(r->put_done_ns);
            r->refused_after_ms = put_at ? (cerb_monotime() - put_at) / CERB_NS_PER_MS : -1;
            break;
        }
        if (st != CERB_BUSY)
            break;
    }
    free(h.priv);
    return NULL;
}

static bool enough_grants(void *ud) { return atomic_load((atomic_int *)ud) >= 40; }

/*
 * Instance b acquires and releases at epoch 1 in RACERS threads while a
 * puts "2 closed". After the put returned, no call that began then is
 * granted, and no grant at all has a lock node younger than the record
 * (its fence is its czxid here: the offset is 0 on this fresh root).
 * Every racer is refused within the bound, by record 2.
 */
static void test_put_racing_acquisitions(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-race");
    struct eng a, b;
    eng_open(&a, &p);
    eng_open(&b, &p);
    _Atomic int64_t put_done = 0;
    atomic_int grants = 0;
    struct racer r[RACERS];
    pthread_t th[RACERS];
    for (int i = 0; i < RACERS; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].g = &b;
        r[i].name = test_name("race");
        r[i].put_done_ns = &put_done;
        r[i].grants = &grants;
        assert_int_equal(pthread_create(&th[i], NULL, race_main, &r[i]), 0);
    }
    assert_wait_until(enough_grants, &grants, 10000);
    cerb_closure now = put(&a, 2, 1);
    atomic_store(&put_done, cerb_monotime());
    assert_true(now.epoch == 2 && now.closed == 1);
    int at_put = atomic_load(&grants);
    for (int i = 0; i < RACERS; i++)
        pthread_join(th[i], NULL);

    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    struct Stat st;
    char buf[64];
    int len = sizeof buf;
    assert_int_equal(zoo_get(zh, p.record, 0, buf, &len, &st), ZOK);
    char fence_path[600];
    snprintf(fence_path, sizeof fence_path, "%s/fence-offset", p.top);
    len = sizeof buf - 1;
    assert_int_equal(zoo_get(zh, fence_path, 0, buf, &len, NULL), ZOK);
    buf[len] = '\0';
    assert_string_equal(buf, "0");
    print_message("%d grants before the put, %d in all; record mzxid %lld\n", at_put,
                  atomic_load(&grants), (long long)st.mzxid);
    for (int i = 0; i < RACERS; i++) {
        print_message("racer %d: %s %lld ms after the put, %lld late grants, max fence %llu\n",
                      i, cerb_status_name(r[i].last), (long long)r[i].refused_after_ms,
                      (long long)r[i].late_grants, (unsigned long long)r[i].max_fence);
        assert_int_equal(r[i].last, CERB_UNAVAILABLE);
        assert_int_equal(r[i].closed_epoch, 2);
        assert_int_equal(r[i].late_grants, 0);
        assert_true(r[i].max_fence < (uint64_t)st.mzxid);
        assert_true(r[i].refused_after_ms >= 0 && r[i].refused_after_ms < 5000);
        assert_int_equal(children(&p, r[i].name), 0);
        free(r[i].name);
    }
    cerb_test_zk_close(zh);
    eng_close(&a);
    eng_close(&b);
    place_clear(&p);
}

/* ---- queue entries and held() ---- */

struct waiter {
    struct eng *g;
    struct hold *h;
    cerb_status st;
};

static void *wait_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb__engine_acquire(ops, w->g->e, &w->h->lk, cerb__deadline_in(15000), NULL,
                                 &w->h->gr);
    return NULL;
}

struct kids_at_least {
    const struct place *p;
    const char *name;
    int n;
};

static bool has_kids(void *ud)
{
    struct kids_at_least *k = ud;
    return children(k->p, k->name) >= k->n;
}

/*
 * held() is BUSY for any child: a bare queue entry (a node with the data
 * our waiters carry, and no holder), and a holder with a waiter. A waiter
 * queued at epoch 1 before "2 closed" was stored is still granted when the
 * holder goes — its node predates the record — and held() saw it all along.
 */
static void test_held_counts_queue_entries(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-held");
    struct eng a, b;
    eng_open(&a, &p);
    eng_open(&b, &p);
    char *name = test_name("held");
    char parent[1024], prefix[1100];
    snprintf(parent, sizeof parent, "%s/%s", p.root, name);
    snprintf(prefix, sizeof prefix, "%s/_c_00000000-0000-4000-8000-000000000000-lock-", parent);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);

    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_OK);
    /* A queue entry alone: what a waiter's create leaves before anyone
     * told it anything. */
    assert_int_equal(zoo_create(zh, p.top, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0), ZOK);
    assert_int_equal(zoo_create(zh, p.root, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0), ZOK);
    assert_int_equal(zoo_create(zh, parent, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0), ZOK);
    char made[1200];
    assert_int_equal(zoo_create(zh, prefix, "cerb:waiting", 12, &ZOO_OPEN_ACL_UNSAFE,
                                ZOO_EPHEMERAL_SEQUENTIAL, made, sizeof made),
                     ZOK);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    assert_int_equal(zoo_delete(zh, made, -1), ZOK);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_OK);

    /* A holder and a waiter queued behind it at epoch 1. */
    struct hold holder, w;
    hold_init(&holder, name, -1);
    hold_init(&w, name, 1);
    assert_int_equal(acquire(&a, &holder, 0), CERB_OK);
    struct waiter wt = {.g = &b, .h = &w, .st = CERB_EIO};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_main, &wt), 0);
    struct kids_at_least k = {&p, name, 2};
    assert_wait_until(has_kids, &k, 10000);
    put(&a, 2, 1);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_BUSY);

    assert_int_equal(cerb__engine_release(ops, a.e, &holder.lk), CERB_OK);
    pthread_join(th, NULL);
    if (wt.st != CERB_OK)
        fail_msg("the queued waiter: %s (%s)", cerb_status_name(wt.st), cerb_last_error());
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    assert_int_equal(cerb__engine_release(ops, b.e, &w.lk), CERB_OK);
    assert_int_equal(cerb__engine_held(ops, a.e, name, CERB_PRIM_MUTEX), CERB_OK);
    /* Its next try is refused. */
    assert_refused(&p, &w, acquire(&b, &w, 0), 2, 1);

    hold_free(&holder);
    hold_free(&w);
    free(name);
    cerb_test_zk_close(zh);
    eng_close(&a);
    eng_close(&b);
    place_clear(&p);
}

/* The probe answers on a closed engine (it acquires nothing a record could
 * refuse). */
static void test_probe_on_a_closed_engine(void **state)
{
    (void)state;
    struct place p;
    place_make(&p, "/closure-probe");
    struct eng a;
    eng_open(&a, &p);
    put(&a, 9, 1);
    char *name = test_name("probe");
    struct hold h;
    hold_init(&h, name, 9);
    assert_refused(&p, &h, acquire(&a, &h, 0), 9, 9);
    for (int i = 0; i < 3; i++)
        if (cerb__engine_probe(ops, a.e, 2000) != CERB_OK)
            fail_msg("probe: %s", cerb_last_error());
    hold_free(&h);
    free(name);
    eng_close(&a);
    place_clear(&p);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_strictly),
        cmocka_unit_test(test_put_raises_only_and_get_reads_it),
        cmocka_unit_test(test_malformed_record_is_an_error),
        cmocka_unit_test(test_acquire_judged_by_the_record),
        cmocka_unit_test(test_waiting_acquisition_refused_at_once),
        cmocka_unit_test(test_put_racing_acquisitions),
        cmocka_unit_test(test_held_counts_queue_entries),
        cmocka_unit_test(test_probe_on_a_closed_engine),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
