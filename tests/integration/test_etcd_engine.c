/*
 * test_etcd_engine.c — the "etcd" engine table on a real etcd (shared
 * fixture), driven through the core's checking shims (cerb__engine_*),
 * below the lock API: grant, check_owner, renew without a round trip,
 * release and its not-owner answer; trylock leaving nothing behind; a key
 * of ours left queued by an earlier failure (removed by trylock and by
 * check_owner, adopted by a waiting acquire when it carries the fence
 * offset our txn writes, replaced when it does not); cancel() that returns at once
 * and wakes the waiter; the counters; the probe; the session: LOST event
 * when the lease is revoked, and an acquire that meets "lease not found"
 * moving to the new session; thousands of orphan deletes that do not keep
 * the session thread from its keepalives. The fence floor (issue 10,
 * §5a.3): a grant asked to rank above a floor far beyond the server's
 * revision does, every later grant of any name by any client ranks above
 * it, a deleted offset key is recreated no lower than this client saw it,
 * a key of ours left queued below the floor is not adopted, and a waiter
 * queued before a raise keeps its place and its lower token.
 *
 * Each engine instance here is what one client would own; waiters are
 * threads with instances of their own. Internals (the session's lease) are
 * read from etcd_internal.h to name keys the way the engine does.
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
#include "etcd_internal.h"
#include "etcd_util.h"
#include "test_util.h"

static const struct cerb_engine_ops *ops;

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
    atomic_int lost_events, suspect_events, valid_events;
};

static void on_event(void *ud, cerb_engine_event ev, const char *name, const char *token)
{
    struct eng *g = ud;
    assert_null(name);
    assert_null(token);
    if (ev == CERB_EV_LOST)
        atomic_fetch_add(&g->lost_events, 1);
    else if (ev == CERB_EV_SUSPECT)
        atomic_fetch_add(&g->suspect_events, 1);
    else
        atomic_fetch_add(&g->valid_events, 1);
}

static void eng_open(struct eng *g, const char *etcd_extra)
{
    char *text = etcd_test_config(etcd_extra, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = on_event, .ud = g};
    if (cerb__engine_open(ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

/* A hold as the core would make it. */
struct hold {
    cerb_engine_lock lk;
    struct etcd_lock_priv priv;
};

static uint64_t gen_of(struct eng *g)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    return s.gen;
}

static void hold_init(struct hold *h, const char *name)
{
    memset(h, 0, sizeof *h);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", 1);
    h->lk.lease_ms = 10000;
    h->lk.fair = 1;
    h->lk.priv = &h->priv;
}

static int64_t lease_of(struct eng *g)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    return s.id;
}

static int nkeys(const char *name, struct etcd_test_kv *kv, int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s/", name);
    return etcd_test_keys(etcd_test_port(), p, kv, max);
}

static void our_key(char *buf, size_t n, const char *name, int64_t lease)
{
    snprintf(buf, n, "%s/%llx", name, (unsigned long long)lease);
}

/* ---- basics ---- */

static void test_grant_check_renew_release(void **state)
{
    (void)state;
    struct eng g;
    struct hold h;
    cerb_grant gr, gc, gn;
    struct etcd_test_kv kv[2];
    char *name = test_name("basic");

    eng_open(&g, "session_ttl_s = 6;");
    hold_init(&h, name);
    int64_t t0 = cerb_monotime();
    assert_int_equal(cerb__engine_acquire(ops, g.e, &h.lk, CERB_DEADLINE_NEVER, NULL, &gr), CERB_OK);
    assert_int_equal(gr.outcome, CERB_OUTCOME_YES);
    /* Valid for what is left of the session's lease (TTL 6 s, less 2 %,
     * counted from its last keepalive), stated from now. */
    assert_true(gr.sent_ns >= t0);
    assert_true(gr.ttl_ms > 3000 && gr.ttl_ms <= 5880);
    assert_int_equal(nkeys(name, kv, 2), 1);
    /* The fence: the key's create revision plus the engine's fence offset
     * (etcd_fence.c; 0 unless a floor raised it on this server). */
    assert_int_equal(gr.fence, (uint64_t)(kv[0].create_revision +
                                          etcd_test_fence_offset(etcd_test_port(), "")));
    assert_int_equal(kv[0].lease, lease_of(&g));

    assert_int_equal(cerb__engine_check_owner(ops, g.e, &h.lk, &gc), CERB_OK);
    assert_int_equal(gc.fence, gr.fence);
    /* renew is answered from the session, without a request. */
    uint64_t before = atomic_load(&g.e->stats.requests);
    assert_int_equal(cerb__engine_renew(ops, g.e, &h.lk, &gn), CERB_OK);
    assert_int_equal(atomic_load(&g.e->stats.requests), before);
    assert_int_equal(gn.fence, gr.fence);
    assert_true(gn.ttl_ms > 3000 && gn.ttl_ms <= 5880);

    assert_int_equal(cerb__engine_release(ops, g.e, &h.lk), CERB_OK);
    assert_int_equal(nkeys(name, kv, 2), 0);
    assert_int_equal(cerb__engine_release(ops, g.e, &h.lk), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &h.lk, &gc), CERB_NOT_OWNER);
    eng_close(&g);
    free(name);
}

static void test_trylock(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha, hb;
    cerb_grant gr;
    struct etcd_test_kv kv[4];
    char *name = test_name("try");

    eng_open(&a, NULL);
    eng_open(&b, NULL);
    hold_init(&ha, name);
    hold_init(&hb, name);
    uint64_t calls = atomic_load(&b.e->stats.acquire_calls);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, 0, NULL, &gr), CERB_BUSY);
    assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
    /* One txn, no key of b's. */
    assert_int_equal(atomic_load(&b.e->stats.acquire_calls), calls + 1);
    assert_int_equal(nkeys(name, kv, 4), 1);
    assert_int_equal(kv[0].lease, lease_of(&a));
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    hold_init(&hb, name);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, b.e, &hb.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    free(name);
}

/* ---- leftovers: a queued key of ours that nobody waits on ---- */

static void test_leftover_key(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha, hb;
    cerb_grant gr;
    struct etcd_test_kv kv[4];
    char key[600];
    char *name = test_name("left");

    eng_open(&a, NULL);
    eng_open(&b, NULL);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    our_key(key, sizeof key, name, lease_of(&b));

    /* trylock removes it and says busy. */
    assert_int_equal(etcd_test_put(etcd_test_port(), key, lease_of(&b)), 0);
    assert_int_equal(nkeys(name, kv, 4), 2);
    hold_init(&hb, name);
    hb.priv.lease = lease_of(&b); /* as after an earlier attempt */
    hb.priv.gen = gen_of(&b);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, 0, NULL, &gr), CERB_BUSY);
    assert_int_equal(nkeys(name, kv, 4), 1);

    /* check_owner (settling an ambiguous acquire) removes it too. */
    assert_int_equal(etcd_test_put(etcd_test_port(), key, lease_of(&b)), 0);
    hold_init(&hb, name);
    hb.priv.lease = lease_of(&b);
    hb.priv.gen = gen_of(&b);
    assert_int_equal(cerb__engine_check_owner(ops, b.e, &hb.lk, &gr), CERB_NOT_OWNER);
    assert_int_equal(nkeys(name, kv, 4), 1);

    /* A waiting acquire adopts it: its place in the queue, its revision
     * and the fence offset it was put with (its value, as our acquire txn
     * writes it). */
    assert_int_equal(etcd_test_put_value(etcd_test_port(), key, "0", lease_of(&b)), 0);
    assert_int_equal(nkeys(name, kv, 4), 2);
    int64_t rev = kv[1].create_revision;
    hold_init(&hb, name);
    hb.priv.lease = lease_of(&b);
    hb.priv.gen = gen_of(&b);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, cerb__deadline_in(200), NULL, &gr),
                     CERB_TIMEOUT);
    /* It timed out: a waiter that gives up deletes its key. */
    assert_int_equal(nkeys(name, kv, 4), 1);
    assert_int_equal(etcd_test_put_value(etcd_test_port(), key, "0", lease_of(&b)), 0);
    assert_int_equal(nkeys(name, kv, 4), 2);
    rev = kv[1].create_revision;
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    hold_init(&hb, name);
    hb.priv.lease = lease_of(&b);
    hb.priv.gen = gen_of(&b);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, cerb__deadline_in(3000), NULL, &gr),
                     CERB_OK);
    assert_int_equal(gr.fence, (uint64_t)rev);
    assert_int_equal(nkeys(name, kv, 4), 1);
    assert_int_equal(cerb__engine_release(ops, b.e, &hb.lk), CERB_OK);

    /* A key without an offset was not put by our txn: its fence is not
     * known, so it is not adopted but replaced by a fresh one. */
    assert_int_equal(etcd_test_put(etcd_test_port(), key, lease_of(&b)), 0);
    assert_int_equal(nkeys(name, kv, 4), 1);
    rev = kv[0].create_revision;
    hold_init(&hb, name);
    hb.priv.lease = lease_of(&b);
    hb.priv.gen = gen_of(&b);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, cerb__deadline_in(3000), NULL, &gr),
                     CERB_OK);
    assert_int_equal(nkeys(name, kv, 4), 1);
    assert_true(kv[0].create_revision > rev);
    assert_int_equal(gr.fence, (uint64_t)(kv[0].create_revision +
                                          etcd_test_fence_offset(etcd_test_port(), "")));
    assert_int_equal(cerb__engine_release(ops, b.e, &hb.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    free(name);
}

/* A hold whose acquire failed with an unknown outcome is released later by
 * the core, in the background; by then the client may hold the same name
 * again, under the same key (it names the session, not the acquisition).
 * The stale release and check must leave the current hold's key alone. */
static void test_stale_hold(void **state)
{
    (void)state;
    struct eng g;
    struct hold cur, stale;
    cerb_grant gr;
    struct etcd_test_kv kv[2];
    char *name = test_name("stale");

    eng_open(&g, NULL);
    hold_init(&stale, name);
    stale.priv.lease = lease_of(&g); /* as if its acquire had sent the txn */
    stale.priv.gen = gen_of(&g);
    hold_init(&cur, name);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &cur.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &stale.lk), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &stale.lk, &gr), CERB_NOT_OWNER);
    assert_int_equal(nkeys(name, kv, 2), 1);
    assert_int_equal(cerb__engine_renew(ops, g.e, &cur.lk, &gr), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &cur.lk), CERB_OK);
    assert_int_equal(nkeys(name, kv, 2), 0);
    /* With nobody using the key, the stale release deletes what its
     * acquire may have left. */
    char key[600];
    our_key(key, sizeof key, name, lease_of(&g));
    assert_int_equal(etcd_test_put(etcd_test_port(), key, lease_of(&g)), 0);
    assert_int_equal(cerb__engine_release(ops, g.e, &stale.lk), CERB_OK);
    assert_int_equal(etcd_test_delete(etcd_test_port(), key), 0);
    eng_close(&g);
    free(name);
}

/* ---- waiting, cancel ---- */

struct waiter {
    struct eng *g;
    struct hold h;
    atomic_int intr;
    int64_t deadline;
    cerb_status st;
    cerb_grant gr;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb__engine_acquire(ops, w->g->e, &w->h.lk, w->deadline, &w->intr, &w->gr);
    atomic_store(&w->done, true);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

struct nk {
    const char *name;
    int n;
};
static bool has_n_keys(void *ud)
{
    struct nk *q = ud;
    struct etcd_test_kv kv[8];
    return nkeys(q->name, kv, 8) == q->n;
}
/* The same, with q->name the full key prefix "<prefix><name>/". */
static bool has_n_keys_at(void *ud)
{
    struct nk *q = ud;
    struct etcd_test_kv kv[8];
    return etcd_test_keys(etcd_test_port(), q->name, kv, 8) == q->n;
}

struct count_ge {
    atomic_uint_fast64_t *c;
    uint64_t n;
};
static bool count_ge(void *ud)
{
    struct count_ge *q = ud;
    return atomic_load(q->c) >= q->n;
}

static void test_cancel_and_wake(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha;
    cerb_grant gr;
    char *name = test_name("cancel");
    pthread_t t;

    eng_open(&a, NULL);
    eng_open(&b, NULL);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);

    /* Interrupt + cancel: cancel returns at once, the waiter follows. */
    struct waiter w = {.g = &b, .deadline = CERB_DEADLINE_NEVER};
    hold_init(&w.h, name);
    uint64_t w0 = atomic_load(&b.e->stats.watches);
    pthread_create(&t, NULL, waiter_main, &w);
    struct nk q1 = {name, 1};
    struct count_ge qw0 = {&b.e->stats.watches, w0 + 1};
    assert_wait_until(count_ge, &qw0, 3000); /* blocked in its watch */
    int64_t t0 = cerb_test_now_ms();
    atomic_store(&w.intr, 1);
    cerb__engine_cancel(ops, b.e, &w.h.lk);
    assert_true(cerb_test_now_ms() - t0 < 20);
    assert_wait_until(waiter_done, &w, 1000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_INTERRUPTED);
    assert_int_equal(w.gr.outcome, CERB_OUTCOME_NO);
    assert_true(has_n_keys(&q1));
    /* cancel() on a hold that is not waiting is harmless. */
    cerb__engine_cancel(ops, b.e, &w.h.lk);

    /* A release wakes the waiter through its watch: one wake-up. */
    struct waiter w2 = {.g = &b, .deadline = CERB_DEADLINE_NEVER};
    hold_init(&w2.h, name);
    uint64_t wk = atomic_load(&b.e->stats.wakeups);
    uint64_t wt = atomic_load(&b.e->stats.watches);
    pthread_create(&t, NULL, waiter_main, &w2);
    struct count_ge qw = {&b.e->stats.watches, wt + 1};
    assert_wait_until(count_ge, &qw, 3000); /* queued and watching */
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    assert_wait_until(waiter_done, &w2, 3000);
    pthread_join(t, NULL);
    assert_int_equal(w2.st, CERB_OK);
    assert_int_equal(atomic_load(&b.e->stats.wakeups), wk + 1);
    assert_int_equal(cerb__engine_release(ops, b.e, &w2.h.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    free(name);
}

/* ---- probe, stats, names ---- */

static void test_probe_stats_names(void **state)
{
    (void)state;
    struct eng g;
    eng_open(&g, NULL);
    assert_int_equal(cerb__engine_probe(ops, g.e, 500), CERB_OK);
    struct cerb_engine_stats st;
    cerb__engine_stats(ops, g.e, &st);
    assert_int_equal(st.handoffs, 0);
    assert_int_equal(cerb__engine_check_name(ops, "a/b"), CERB_EINVAL);
    assert_int_equal(cerb__engine_check_name(ops, "a.b:c"), CERB_OK);
    eng_close(&g);
}

/* ---- the session ---- */

static bool lost_event(void *ud) { return atomic_load(&((struct eng *)ud)->lost_events) > 0; }

static void test_session_revoked(void **state)
{
    (void)state;
    struct eng g;
    struct hold h, h2;
    cerb_grant gr;
    struct etcd_test_kv kv[2];
    char *name = test_name("sess");

    eng_open(&g, "session_ttl_s = 3;");
    hold_init(&h, name);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
    int64_t old = lease_of(&g);
    assert_int_equal(etcd_test_revoke(etcd_test_port(), old), 0);
    assert_int_equal(nkeys(name, kv, 2), 0); /* the revoke deleted the key */
    /* Before the keepalive notices: an acquire (of another name: this
     * client still has a hold of `name`) meets "lease not found", kicks
     * the session thread and goes on with the new lease. */
    char *name2 = test_name("sess2");
    hold_init(&h2, name2);
    cerb_status st = cerb__engine_acquire(ops, g.e, &h2.lk, cerb__deadline_in(5000), NULL, &gr);
    if (st != CERB_OK)
        fail_msg("acquire after revoke: %s: %s", cerb_status_name(st), cerb_last_error());
    assert_true(lease_of(&g) != old);
    assert_int_equal(nkeys(name2, kv, 2), 1);
    assert_int_equal(kv[0].lease, lease_of(&g));
    assert_wait_until(lost_event, &g, 3000);
    assert_int_equal(atomic_load(&g.lost_events), 1);
    /* The old hold is gone for good; the new one is fine. */
    assert_int_equal(cerb__engine_renew(ops, g.e, &h.lk, &gr), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_release(ops, g.e, &h.lk), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_renew(ops, g.e, &h2.lk, &gr), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &h2.lk), CERB_OK);
    eng_close(&g);
    free(name);
    free(name2);
}

/* ---- the fence floor (issue 10, §5a.3) ---- */

/* A prefix of its own per case: the offset is engine-wide per prefix, and
 * the other cases compare fences with create revisions. */
static char *fence_prefix(void)
{
    char *n = test_name("ff");
    char *p = malloc(strlen(n) + 2);
    assert_non_null(p);
    sprintf(p, "%s/", n);
    free(n);
    return p;
}

static void eng_open_prefix(struct eng *g, const char *prefix)
{
    char extra[256];
    snprintf(extra, sizeof extra, "prefix = \"%s\";", prefix);
    eng_open(g, extra);
}

/* The create revision of the only key under <prefix><name>/. */
static int64_t only_key_rev(const char *prefix, const char *name)
{
    char p[512];
    struct etcd_test_kv kv[2];
    snprintf(p, sizeof p, "%s%s/", prefix, name);
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 2), 1);
    return kv[0].create_revision;
}

#define FLOOR 1000000000000ull /* far above any revision of the test server */

static void test_fence_floor(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha, hb, hc;
    cerb_grant ga, gb, gc, gk;
    char *pfx = fence_prefix(), *name = test_name("floor"), *name2 = test_name("floor2");
    const int port = etcd_test_port();

    eng_open_prefix(&a, pfx);
    eng_open_prefix(&b, pfx);
    assert_int_equal(etcd_test_fence_offset(port, pfx), 0); /* none yet */

    /* Client a comes from another engine where it had FLOOR. */
    hold_init(&ha, name);
    ha.lk.fence_floor = FLOOR;
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &ga), CERB_OK);
    print_message("floor %llu: fence %llu\n", (unsigned long long)FLOOR,
                  (unsigned long long)ga.fence);
    assert_true(ga.fence > FLOOR);
    /* Raised by what it takes, not more: 48 bits must last. */
    assert_true(ga.fence < FLOOR + 1000);
    /* The fence is the key's create revision plus the offset on the server. */
    int64_t off = etcd_test_fence_offset(port, pfx);
    assert_true(off > 0);
    assert_int_equal(ga.fence, (uint64_t)(only_key_rev(pfx, name) + off));
    /* check_owner (settling) and renew report the same fence. */
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &ha.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, ga.fence);
    assert_int_equal(cerb__engine_renew(ops, a.e, &ha.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, ga.fence);
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);

    /* Another client, no floor, same name: above it. */
    hold_init(&hb, name);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, cerb__deadline_in(3000), NULL, &gb),
                     CERB_OK);
    print_message("then client b: fence %llu\n", (unsigned long long)gb.fence);
    assert_true(gb.fence > ga.fence);
    assert_int_equal(cerb__engine_check_owner(ops, b.e, &hb.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, gb.fence);
    assert_int_equal(cerb__engine_release(ops, b.e, &hb.lk), CERB_OK);

    /* Another name after the raise: above the floor too. */
    hold_init(&hc, name2);
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hc.lk, 0, NULL, &gc), CERB_OK);
    assert_true(gc.fence > gb.fence);
    assert_int_equal(cerb__engine_release(ops, b.e, &hc.lk), CERB_OK);

    /* Someone deletes the offset key: a client that saw it never goes
     * below what it saw, and puts it back. */
    char key[600];
    snprintf(key, sizeof key, "%s__cerberus_fence__", pfx);
    assert_int_equal(etcd_test_delete(port, key), 1);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &ga), CERB_OK);
    print_message("after the offset key was deleted: fence %llu\n",
                  (unsigned long long)ga.fence);
    assert_true(ga.fence > gc.fence);
    assert_true(etcd_test_fence_offset(port, pfx) >= off);
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);

    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
    free(name2);
}

/*
 * A key of ours left queued by an earlier failure, put before a raise,
 * has a fence below the floor: an acquire with that floor must not adopt
 * it (its token would go backwards) but queue again, above the floor.
 */
static void test_fence_floor_leftover(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha, hb;
    cerb_grant gr;
    char *pfx = fence_prefix(), *name = test_name("fleft");
    const int port = etcd_test_port();
    char key[600];

    eng_open_prefix(&a, pfx);
    eng_open_prefix(&b, pfx);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    /* b's key from an earlier attempt, put as b's txn puts it (offset 0). */
    snprintf(key, sizeof key, "%s%s/%llx", pfx, name, (unsigned long long)lease_of(&b));
    assert_int_equal(etcd_test_put_value(port, key, "0", lease_of(&b)), 0);
    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    hold_init(&hb, name);
    hb.priv.lease = lease_of(&b);
    hb.priv.gen = gen_of(&b);
    hb.lk.fence_floor = FLOOR;
    assert_int_equal(cerb__engine_acquire(ops, b.e, &hb.lk, cerb__deadline_in(3000), NULL, &gr),
                     CERB_OK);
    assert_true(gr.fence > FLOOR);
    assert_int_equal(cerb__engine_check_owner(ops, b.e, &hb.lk, &gr), CERB_OK);
    assert_true(gr.fence > FLOOR);
    assert_int_equal(cerb__engine_release(ops, b.e, &hb.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    free(pfx);
    free(name);
}

/*
 * A waiter queued before a raise keeps its place and the offset its key
 * was put with: tokens stay in grant order (holder < waiter < the raiser,
 * which queued behind it), and the raiser's is above its floor.
 */
static void test_fence_floor_waiter_order(void **state)
{
    (void)state;
    struct eng a, b, c;
    struct hold ha;
    cerb_grant ga, gk;
    pthread_t tw, tx;
    char *pfx = fence_prefix(), *name = test_name("forder");
    char p[512];
    snprintf(p, sizeof p, "%s%s/", pfx, name);

    eng_open_prefix(&a, pfx);
    eng_open_prefix(&b, pfx);
    eng_open_prefix(&c, pfx);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &ga), CERB_OK);

    struct waiter w = {.g = &b, .deadline = cerb__deadline_in(20000)};
    hold_init(&w.h, name);
    pthread_create(&tw, NULL, waiter_main, &w);
    struct nk q2 = {p, 2};
    assert_wait_until(has_n_keys_at, &q2, 3000);

    struct waiter x = {.g = &c, .deadline = cerb__deadline_in(20000)};
    hold_init(&x.h, name);
    x.h.lk.fence_floor = FLOOR;
    pthread_create(&tx, NULL, waiter_main, &x);
    struct nk q3 = {p, 3};
    assert_wait_until(has_n_keys_at, &q3, 3000);
    assert_true(etcd_test_fence_offset(etcd_test_port(), pfx) > 0); /* raised */

    assert_int_equal(cerb__engine_release(ops, a.e, &ha.lk), CERB_OK);
    assert_wait_until(waiter_done, &w, 3000);
    pthread_join(tw, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_int_equal(cerb__engine_check_owner(ops, b.e, &w.h.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, w.gr.fence);
    assert_int_equal(cerb__engine_release(ops, b.e, &w.h.lk), CERB_OK);
    assert_wait_until(waiter_done, &x, 3000);
    pthread_join(tx, NULL);
    assert_int_equal(x.st, CERB_OK);
    print_message("holder %llu, waiter %llu, raiser %llu\n", (unsigned long long)ga.fence,
                  (unsigned long long)w.gr.fence, (unsigned long long)x.gr.fence);
    assert_true(ga.fence < w.gr.fence);
    assert_true(w.gr.fence < FLOOR); /* queued before the raise */
    assert_true(w.gr.fence < x.gr.fence);
    assert_true(x.gr.fence > FLOOR);
    assert_int_equal(cerb__engine_release(ops, c.e, &x.h.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    eng_close(&c);
    free(pfx);
    free(name);
}

/* ---- orphan deletes do not starve the keepalive (issue 10 item 11) ---- */

static size_t orphans_left(struct eng *g)
{
    size_t n = 0;
    cerb__mutex_lock(&g->e->sess_mu);
    for (struct etcd_orphan *o = g->e->orphans; o; o = o->next)
        n++;
    cerb__mutex_unlock(&g->e->sess_mu);
    return n;
}

struct ka_seen {
    struct eng *g;
    uint64_t want;
};
static bool keepalives_reach(void *ud)
{
    struct ka_seen *k = ud;
    return atomic_load(&k->g->e->stats.keepalives) >= k->want ||
           atomic_load(&k->g->lost_events) > 0;
}

/*
 * The session thread owes thousands of deletes (keys that failed requests
 * could not delete). Each takes a round trip, so together they last longer
 * than the session's TTL: the thread must keep the lease alive first and
 * delete in the time left between keepalives, not delete them all and
 * find the session lost afterwards.
 */
#define SWEEP_ORPHANS 12000

static void test_orphan_sweep_keeps_session(void **state)
{
    (void)state;
    struct eng g;
    char *name = test_name("sweep");
    char key[512];

    eng_open(&g, "session_ttl_s = 2;");
    /* Keys that do not exist, with a create revision to compare: each
     * delete is a real txn that deletes nothing. One warning per key
     * otherwise. */
    cerb_log_set(NULL, NULL, CERB_LOG_ERROR);
    int64_t t_add = cerb_monotime();
    for (int i = 0; i < SWEEP_ORPHANS; i++) {
        int n = snprintf(key, sizeof key, "%s/%x", name, i);
        cerb__etcd_orphan_add(g.e, key, (size_t)n, 1);
    }
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
    print_message("queued %d orphans in %lld ms\n", SWEEP_ORPHANS,
                  (long long)((cerb_monotime() - t_add) / CERB_NS_PER_MS));

    /* Two TTLs: four keepalives or more (one per TTL/3), no LOST. */
    int64_t t0 = cerb_monotime();
    struct ka_seen k = {&g, atomic_load(&g.e->stats.keepalives) + 4};
    bool kept = wait_until(keepalives_reach, &k, 4000);
    size_t left = orphans_left(&g);
    print_message("after %lld ms: %llu keepalives, %zu orphans left\n",
                  (long long)((cerb_monotime() - t0) / CERB_NS_PER_MS),
                  (unsigned long long)atomic_load(&g.e->stats.keepalives), left);
    assert_int_equal(atomic_load(&g.lost_events), 0);
    assert_true(kept);
    /* The sweep went on meanwhile. */
    assert_true(left < SWEEP_ORPHANS);
    struct etcd_session s;
    cerb__etcd_session_peek(g.e, &s);
    assert_true(s.live);
    assert_int_equal(s.gen, 1);
    eng_close(&g);
    free(name);
}

static int setup(void **state)
{
    (void)state;
    cerb__engines_builtin();
    ops = cerb__engine_find("etcd");
    return ops ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grant_check_renew_release),
        cmocka_unit_test(test_trylock),
        cmocka_unit_test(test_leftover_key),
        cmocka_unit_test(test_stale_hold),
        cmocka_unit_test(test_cancel_and_wake),
        cmocka_unit_test(test_probe_stats_names),
        cmocka_unit_test(test_session_revoked),
        cmocka_unit_test(test_orphan_sweep_keeps_session),
        cmocka_unit_test(test_fence_floor),
        cmocka_unit_test(test_fence_floor_leftover),
        cmocka_unit_test(test_fence_floor_waiter_order),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
