/*
 * test_zk_engine.c — the "zk" engine below the lock API, on the shared test
 * ZooKeeper: the order of a lock's children (Curator's key, foreign names,
 * the predecessor), grants through the core's shims
 * with check_owner and release, what renew() reports (no I/O: the session's
 * last answered send time and timeout), deletion by uuid, and the settling
 * of a lost create reply: the child carrying our uuid is adopted only when
 * it is an ephemeral of our current session, and one of another session is
 * deleted instead (Curator's CURATOR-604). The hold bound and every ttl are
 * the negotiated session timeout (not the configured one, not the lease),
 * and a holder's "cerb:holding" mark that did not land is sent again. A
 * waiter that gives up while its listing is still unanswered is not hurt by
 * the late answer (it is analysed against the call's own copy of our name).
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "cerberus.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "test_util.h"
#include "zk_call.h"
#include "zk_layout.h"
#include "zk_mutex.h"
#include "zk_util.h"

static const struct cerb_engine_ops *ops;

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void eng_open(struct eng *g, const char *zk_extra)
{
    char *text = cerb_test_zk_config(NULL, zk_extra, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = NULL, .ud = NULL};
    cerb_status st = cerb__engine_open(ops, &env, &g->e);
    if (st != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

static int setup(void **state)
{
    (void)state;
    cerb__engines_builtin();
    ops = cerb__engine_find("zk");
    return ops ? 0 : -1;
}

/* ---- the order of children (pure) ---- */

static void test_children_order(void **state)
{
    (void)state;
    char *names[] = {
        "_c_bbbbbbbb-0000-4000-8000-000000000000-lock-0000000007",
        "foo",                                  /* no "lock-": key "foo", sorts last */
        "_c_aaaaaaaa-0000-4000-8000-000000000000-lock-0000000003",
        "x-lock-0000000005",                    /* a foreign prefix: key only counts */
        "_c_cccccccc-0000-4000-8000-000000000000-lock-0000000011",
        "lock-0000000001-lock-0000000009",      /* the last "lock-" counts: 9 */
    };
    struct String_vector v = {(int32_t)(sizeof names / sizeof names[0]), names};
    struct zk_children k;

    cerb__zk_children_analyze(&v, names[0], "cccccccc-0000-4000-8000-000000000000", &k);
    assert_false(k.oom);
    assert_int_equal(k.n_children, 6);
    assert_true(k.found_self);
    assert_int_equal(k.n_lower, 2); /* 3 and 5 come before 7 */
    assert_string_equal(k.pred, "x-lock-0000000005");
    assert_int_equal(k.n_mine, 1);
    assert_string_equal(k.mine[0], names[4]);
    cerb__zk_children_clear(&k);

    cerb__zk_children_analyze(&v, names[2], NULL, &k);
    assert_int_equal(k.n_lower, 0); /* 3 is first */
    assert_null(k.pred);
    cerb__zk_children_clear(&k);

    cerb__zk_children_analyze(&v, "_c_dddddddd-0000-4000-8000-000000000000-lock-0000000099",
                              NULL, &k);
    assert_false(k.found_self); /* not in the listing */
    assert_int_equal(k.n_lower, 5);
    assert_string_equal(k.pred, names[4]);
    cerb__zk_children_clear(&k);

    assert_string_equal(cerb__zk_child_key("a-lock-0000000001"), "0000000001");
    assert_string_equal(cerb__zk_child_key("plain"), "plain");
    assert_true(cerb__zk_child_has_uuid(names[0], "bbbbbbbb-0000-4000-8000-000000000000"));
    assert_false(cerb__zk_child_has_uuid(names[0], "aaaaaaaa-0000-4000-8000-000000000000"));
    assert_false(cerb__zk_child_has_uuid("foo", "aaaaaaaa-0000-4000-8000-000000000000"));
}

/* The fence offset node's place and data (pure). */
static void test_fence_path_and_parse(void **state)
{
    (void)state;
    char *path = cerb__zk_fence_path("/cerberus/locks");
    assert_string_equal(path, "/cerberus/fence-offset");
    cerb__free(path);
    path = cerb__zk_fence_path("/locks");
    assert_string_equal(path, "/fence-offset");
    cerb__free(path);

    uint64_t v = 7;
    assert_true(cerb__zk_fence_parse("0", 1, &v) && v == 0);
    assert_true(cerb__zk_fence_parse("281474976710655", 15, &v) && v == (UINT64_C(1) << 48) - 1);
    assert_false(cerb__zk_fence_parse("281474976710656", 15, &v)); /* 2^48 */
    assert_false(cerb__zk_fence_parse("", 0, &v));
    assert_false(cerb__zk_fence_parse(NULL, -1, &v));
    assert_false(cerb__zk_fence_parse("12a", 3, &v));
    assert_false(cerb__zk_fence_parse("-1", 2, &v));
    assert_false(cerb__zk_fence_parse("000000000000000000001", 21, &v));
}

/* ---- grants through the shims ---- */

static void fill_lock(cerb_engine_lock *lk, void *priv, const char *name, int64_t lease)
{
    memset(lk, 0, sizeof *lk);
    memset(priv, 0, ops->lock_priv_size);
    lk->name = name;
    snprintf(lk->token, sizeof lk->token, "%032x", 0x5eed);
    lk->lease_ms = lease;
    lk->fair = 1;
    lk->priv = priv;
}

static void test_grant_check_renew_release(void **state)
{
    (void)state;
    struct eng g;
    eng_open(&g, "session_timeout_ms = 3000;");
    char *name = test_name("eng");
    void *priv = calloc(1, ops->lock_priv_size), *priv2 = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lk, lk2;
    cerb_grant gr;

    fill_lock(&lk, priv, name, 1000);
    int64_t t0 = cerb_monotime();
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > 0);
    assert_true(gr.sent_ns >= t0 && gr.sent_ns <= cerb_monotime());
    assert_int_equal(gr.ttl_ms, 3000); /* the session's, longer than the lease */
    uint64_t fence = gr.fence;

    cerb_grant gc;
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gc), CERB_OK);
    assert_int_equal(gc.fence, fence);

    /* renew: no round trip, the session's word. */
    cerb_grant rn;
    assert_int_equal(cerb__engine_renew(ops, g.e, &lk, &rn), CERB_OK);
    assert_int_equal(rn.fence, fence);
    assert_true(rn.sent_ns >= gr.sent_ns);
    assert_true(cerb_monotime() - rn.sent_ns < 3000 * CERB_NS_PER_MS);

    /* Another owner: busy, and its node gone again. */
    fill_lock(&lk2, priv2, name, 1000);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk2, 0, NULL, &gr), CERB_BUSY);
    assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *path = cerb_test_zk_lock_path(name);
    assert_int_equal(cerb_test_zk_children(zh, path, NULL, NULL), 1);

    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    assert_int_equal(cerb_test_zk_children(zh, path, NULL, NULL), 0);
    /* Released: check_owner says no, a second release says not owner. */
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gc), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_NOT_OWNER);

    struct cerb_engine_stats es;
    cerb__engine_stats(ops, g.e, &es);
    assert_true(es.acquire_calls >= 2);
    assert_int_equal(cerb__engine_probe(ops, g.e, 1000), CERB_OK);

    free(path);
    cerb_test_zk_close(zh);
    free(priv);
    free(priv2);
    free(name);
    eng_close(&g);
}

/* ---- the hold bound and the ttl: the negotiated session timeout ---- */

/* The negotiated timeout of the engine's current session, from the C
 * client itself. */
static int64_t recv_timeout(cerb_engine *e)
{
    struct zk_session *s = cerb__zk_session_begin(e);
    assert_non_null(s);
    int64_t ms = zoo_recv_timeout(s->zh);
    cerb__zk_session_end(e);
    return ms;
}

/*
 * The test server allows sessions of 1–60 s (scripts/servers.d/zk.sh): a
 * 90 s session is granted 60 s. What the engine reports as the hold bound
 * is what the server granted, not the configuration, and a shim without an
 * instance or an op says "unknown".
 */
static void test_hold_bound_negotiated(void **state)
{
    (void)state;
    struct eng g;
    assert_int_equal(cerb__engine_hold_bound_ms(ops, NULL), 0);
    assert_non_null(ops->hold_bound_ms);

    eng_open(&g, "session_timeout_ms = 90000;");
    assert_int_equal(recv_timeout(g.e), 60000);
    assert_int_equal(cerb__engine_hold_bound_ms(ops, g.e), 60000);
    eng_close(&g);

    eng_open(&g, "session_timeout_ms = 3000;");
    assert_int_equal(cerb__engine_hold_bound_ms(ops, g.e), recv_timeout(g.e));
    assert_int_equal(cerb__engine_hold_bound_ms(ops, g.e), 3000);
    eng_close(&g);
}

/*
 * A hold lasts as long as the session, which the server ends the
 * negotiated timeout after our last contact: a lease longer than that must
 * not stretch the ttl a grant, a renewal or a check reports (the core puts
 * the local deadline at sent_ns + ttl), or the holder would still count as
 * VALID after the server dropped its node and someone else got the lock.
 */
static void test_ttl_bounded_by_session(void **state)
{
    (void)state;
    struct eng g;
    eng_open(&g, "session_timeout_ms = 3000;");
    char *name = test_name("ttl");
    void *priv = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lk;
    cerb_grant gr, rn, gc;

    fill_lock(&lk, priv, name, 20000);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    assert_true(gr.ttl_ms > 0 && gr.ttl_ms <= 3000);
    assert_int_equal(cerb__engine_renew(ops, g.e, &lk, &rn), CERB_OK);
    assert_true(rn.ttl_ms > 0 && rn.ttl_ms <= 3000);
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gc), CERB_OK);
    assert_true(gc.ttl_ms > 0 && gc.ttl_ms <= 3000);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    eng_close(&g);

    /* Negotiated down (90 s asked, 60 s granted): the granted one counts. */
    eng_open(&g, "session_timeout_ms = 90000;");
    fill_lock(&lk, priv, name, 100000);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    assert_true(gr.ttl_ms > 0 && gr.ttl_ms <= 60000);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    eng_close(&g);

    free(priv);
    free(name);
}

/* ---- deletion by uuid; adoption only of our current session's node ---- */

static char *make_node(zhandle_t *zh, const char *parent, const char *uuid)
{
    char prefix[1024], made[1024];
    snprintf(prefix, sizeof prefix, "%s/_c_%s-lock-", parent, uuid);
    int rc = zoo_create(zh, prefix, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
                        made, sizeof made);
    if (rc != ZOK)
        fail_msg("create %s: %s", prefix, zerror(rc));
    return strdup(made);
}

/* A node made on the engine's own session (as a lost create would be). */
static char *make_own_node(cerb_engine *e, const char *parent, const char *uuid)
{
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/_c_%s-lock-", parent, uuid);
    struct zk_call *c = cerb__zk_call_new(1);
    assert_non_null(c);
    struct zk_session *s = cerb__zk_session_begin(e);
    assert_non_null(s);
    int k = cerb__zk_call_create(c, s, prefix, NULL, &ZOO_OPEN_ACL_UNSAFE,
                                 ZOO_EPHEMERAL_SEQUENTIAL);
    cerb__zk_session_end(e);
    assert_true(cerb__zk_call_wait(c, cerb__deadline_in(5000)));
    assert_int_equal(c->res[k].rc, ZOK);
    char *path = strdup(c->res[k].path);
    cerb__zk_call_put(c);
    return path;
}

static void test_adopt_only_current_session(void **state)
{
    (void)state;
    struct eng g;
    eng_open(&g, NULL);
    zhandle_t *other = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(other);
    char *name = test_name("adopt");
    char *parent = cerb_test_zk_lock_path(name);
    const char *uuid = "0badc0de-0000-4000-8000-00000000cafe";
    zoo_create(other, "/cerberus", NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
    zoo_create(other, CERB_TEST_ZK_ROOT, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
    assert_int_equal(zoo_create(other, parent, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER,
                                NULL, 0),
                     ZOK);

    struct zk_state st;
    cerb__zk_state(g.e, &st);
    assert_true(st.connected);

    /* Only a stale node (another session) carries the uuid: not ours. */
    char *stale = make_node(other, parent, uuid);
    char *node = NULL;
    uint64_t czxid = 0;
    assert_int_equal(cerb__zk_find_mine(g.e, st.gen, st.id, parent, uuid,
                                        cerb__deadline_in(5000), &node, &czxid),
                     CERB_OK);
    assert_null(node);
    struct Stat sx;
    assert_int_equal(zoo_exists(other, stale, 0, &sx), ZNONODE); /* and deleted */

    /* Ours and a stale one: ours is adopted, the other deleted. */
    free(stale);
    stale = make_node(other, parent, uuid);
    char *mine = make_own_node(g.e, parent, uuid);
    assert_int_equal(cerb__zk_find_mine(g.e, st.gen, st.id, parent, uuid,
                                        cerb__deadline_in(5000), &node, &czxid),
                     CERB_OK);
    assert_non_null(node);
    assert_string_equal(node, mine);
    assert_int_equal(zoo_exists(other, mine, 0, &sx), ZOK);
    assert_int_equal((uint64_t)sx.czxid, czxid);
    assert_int_equal(sx.ephemeralOwner, st.id);
    assert_int_equal(zoo_exists(other, stale, 0, &sx), ZNONODE);
    free(node);

    /* Deletion by uuid takes every node carrying it, nothing else. */
    char *m2 = make_own_node(g.e, parent, uuid);
    char *keep = make_node(other, parent, "11111111-0000-4000-8000-000000000000");
    assert_int_equal(cerb__zk_remove(g.e, parent, NULL, uuid, cerb__deadline_in(5000)),
                     ZK_REMOVED);
    assert_int_equal(zoo_exists(other, mine, 0, &sx), ZNONODE);
    assert_int_equal(zoo_exists(other, m2, 0, &sx), ZNONODE);
    assert_int_equal(zoo_exists(other, keep, 0, &sx), ZOK);
    /* And by path: gone already is NONODE. */
    assert_int_equal(cerb__zk_remove(g.e, parent, m2, NULL, cerb__deadline_in(5000)),
                     ZK_REMOVED_NONODE);

    zoo_delete(other, keep, -1);
    free(keep);
    free(m2);
    free(mine);
    free(stale);
    free(parent);
    free(name);
    cerb_test_zk_close(other);
    eng_close(&g);
}

/* ---- a holder's mark that did not land is sent again ---- */

struct waiter {
    struct eng *g;
    cerb_engine_lock *lk;
    int64_t wait_ms; /* 0: 10 s */
    cerb_status st;
    uint64_t fence; /* the grant's, when st is CERB_OK */
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    cerb_grant gr;
    w->st = cerb__engine_acquire(ops, w->g->e, w->lk,
                                 cerb__deadline_in(w->wait_ms ? w->wait_ms : 10000), NULL, &gr);
    w->fence = gr.fence;
    atomic_store(&w->done, true);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

struct kids_n {
    zhandle_t *zh;
    const char *path;
    int want;
};
static bool kids_n(void *ud)
{
    struct kids_n *k = ud;
    return cerb_test_zk_children(k->zh, k->path, NULL, NULL) == k->want;
}

static bool mark_failed(void *ud)
{
    return atomic_load(&((cerb_engine *)ud)->stats.mark_failures) > 0;
}

struct data_is {
    zhandle_t *zh;
    const char *node;
    const char *want;
};
static bool data_is(void *ud)
{
    struct data_is *d = ud;
    char buf[64];
    int len = sizeof buf - 1;
    if (zoo_get(d->zh, d->node, 0, buf, &len, NULL) != ZOK)
        return false;
    buf[len < 0 ? 0 : len] = '\0';
    return strcmp(buf, d->want) == 0;
}

/*
 * A holder that waited marks its node "cerb:holding" for its successor
 * with one asynchronous write. When that write does not land (here: the
 * node's ACL briefly forbids writing it; in the field a connection loss
 * while it is in flight), the keeper sends it again.
 */
static void test_mark_sent_again(void **state)
{
    (void)state;
    struct eng g1, g2;
    eng_open(&g1, NULL);
    eng_open(&g2, NULL);
    char *name = test_name("remark");
    char *parent = cerb_test_zk_lock_path(name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    void *p1 = calloc(1, ops->lock_priv_size), *p2 = calloc(1, ops->lock_priv_size);
    cerb_engine_lock l1, l2;
    cerb_grant gr;

    fill_lock(&l1, p1, name, 10000);
    fill_lock(&l2, p2, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g1.e, &l1, 0, NULL, &gr), CERB_OK);
    struct waiter w = {.g = &g2, .lk = &l2};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    struct kids_n two = {zh, parent, 2};
    assert_wait_until(kids_n, &two, 5000);

    /* The waiter's node: everything but WRITE, for everyone. */
    struct String_vector v;
    assert_int_equal(cerb_test_zk_children(zh, parent, &v, NULL), 2);
    char node[1024] = "";
    for (int i = 0; i < v.count; i++) {
        snprintf(node, sizeof node, "%s/%s", parent, v.data[i]);
        if (strcmp(node, ((struct zk_lock_priv *)p1)->node) != 0)
            break;
    }
    deallocate_String_vector(&v);
    struct ACL no_write_acl = {ZOO_PERM_ALL & ~ZOO_PERM_WRITE, ZOO_ANYONE_ID_UNSAFE};
    struct ACL_vector no_write = {1, &no_write_acl};
    assert_int_equal(zoo_set_acl(zh, node, -1, &no_write), ZOK);

    /* The release grants it to the waiter, whose mark is refused... */
    assert_int_equal(cerb__engine_release(ops, g1.e, &l1), CERB_OK);
    assert_wait_until(waiter_done, &w, 5000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_wait_until(mark_failed, g2.e, 3000);
    struct data_is waiting = {zh, node, "cerb:waiting"};
    assert_true(data_is(&waiting));

    /* ...and lands once it can. */
    assert_int_equal(zoo_set_acl(zh, node, -1, &ZOO_OPEN_ACL_UNSAFE), ZOK);
    struct data_is holding = {zh, node, "cerb:holding"};
    assert_wait_until(data_is, &holding, 3000);
    assert_true(atomic_load(&g2.e->stats.mark_retries) > 0);
    assert_int_equal(cerb__engine_release(ops, g2.e, &l2), CERB_OK);

    free(p1);
    free(p2);
    cerb_test_zk_close(zh);
    free(parent);
    free(name);
    eng_close(&g1);
    eng_close(&g2);
}

/* ---- the fence floor (issue 10, §5a.3) ---- */

/* Far above any czxid of the test server, far below 2^48. */
#define FLOOR_STEP UINT64_C(1000000000000)

/* The czxid of our node (the hold's path in its priv), read by a raw client. */
static uint64_t node_czxid(zhandle_t *zh, const void *priv)
{
    struct Stat st;
    const char *node = ((const struct zk_lock_priv *)priv)->node;
    assert_non_null(node);
    assert_int_equal(zoo_exists(zh, node, 0, &st), ZOK);
    return (uint64_t)st.czxid;
}

/*
 * A client that had fence F on another engine switches here: the core
 * passes F as the floor. Its grant must rank above F, and so must every
 * later grant here, by any client, of that name or another one (the offset
 * is engine-wide). check_owner and renew report the fence the grant got:
 * the node's czxid plus the offset its create checked.
 */
static void test_fence_floor_raises_offset(void **state)
{
    (void)state;
    struct eng g1, g2, g3;
    eng_open(&g1, NULL);
    eng_open(&g2, NULL);
    eng_open(&g3, NULL);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *name = test_name("floor"), *other = test_name("floor-other");
    void *p1 = calloc(1, ops->lock_priv_size), *p2 = calloc(1, ops->lock_priv_size),
         *p3 = calloc(1, ops->lock_priv_size);
    cerb_engine_lock l1, l2, l3;
    cerb_grant gr, gc, rn;

    fill_lock(&l1, p1, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g1.e, &l1, 0, NULL, &gr), CERB_OK);
    uint64_t f0 = gr.fence;
    assert_int_equal(cerb__engine_release(ops, g1.e, &l1), CERB_OK);

    const uint64_t floor = f0 + FLOOR_STEP;
    fill_lock(&l1, p1, name, 10000);
    l1.fence_floor = floor;
    assert_int_equal(cerb__engine_acquire(ops, g1.e, &l1, 0, NULL, &gr), CERB_OK);
    uint64_t f1 = gr.fence;
    print_message("floor %llu: fence %llu (before: %llu), offset now %llu\n",
                  (unsigned long long)floor, (unsigned long long)f1, (unsigned long long)f0,
                  (unsigned long long)cerb_test_zk_fence_offset(zh, NULL));
    assert_true(f1 > floor);
    assert_int_equal(f1, node_czxid(zh, p1) + cerb_test_zk_fence_offset(zh, NULL));
    assert_int_equal(cerb__engine_check_owner(ops, g1.e, &l1, &gc), CERB_OK);
    assert_int_equal(gc.fence, f1);
    assert_int_equal(cerb__engine_renew(ops, g1.e, &l1, &rn), CERB_OK);
    assert_int_equal(rn.fence, f1);

    /* Another client, no floor: queued behind, granted above. */
    fill_lock(&l2, p2, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g2.e, &l2, 0, NULL, &gr), CERB_BUSY);
    assert_int_equal(cerb__engine_release(ops, g1.e, &l1), CERB_OK);
    fill_lock(&l2, p2, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g2.e, &l2, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > f1);

    /* A third client, another name, no floor: above the floor too. */
    fill_lock(&l3, p3, other, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g3.e, &l3, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > floor);
    assert_int_equal(cerb__engine_release(ops, g3.e, &l3), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g2.e, &l2), CERB_OK);

    /* A floor already below the offset raises nothing. */
    int64_t m0, m1;
    uint64_t off0 = cerb_test_zk_fence_offset(zh, &m0);
    fill_lock(&l3, p3, other, 10000);
    l3.fence_floor = floor;
    assert_int_equal(cerb__engine_acquire(ops, g3.e, &l3, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > floor);
    assert_int_equal(cerb_test_zk_fence_offset(zh, &m1), off0);
    assert_int_equal(m1, m0);
    assert_int_equal(cerb__engine_release(ops, g3.e, &l3), CERB_OK);

    free(p1);
    free(p2);
    free(p3);
    free(name);
    free(other);
    cerb_test_zk_close(zh);
    eng_close(&g1);
    eng_close(&g2);
    eng_close(&g3);
}

/*
 * The offset node is permanent, but if someone deletes it, the next create
 * (whose check now fails) makes it again with the highest offset the
 * instance has seen, never lower, so the tokens of the name keep growing.
 * On a root of its own: another suite's instance, which never saw the
 * raised offset, would make it again with 0.
 */
static void test_deleted_offset_node_made_again(void **state)
{
    (void)state;
    char *top = test_name("/fence-del");
    char extra[600], fence_path[512];
    snprintf(extra, sizeof extra, "root = \"%s/locks\";", top);
    snprintf(fence_path, sizeof fence_path, "%s/fence-offset", top);
    struct eng g;
    eng_open(&g, extra);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    void *p = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lk;
    cerb_grant gr;

    fill_lock(&lk, p, "n", 10000);
    lk.fence_floor = FLOOR_STEP;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    uint64_t f1 = gr.fence;
    assert_true(f1 > FLOOR_STEP);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    char buf[32];
    int len = sizeof buf - 1;
    assert_int_equal(zoo_get(zh, fence_path, 0, buf, &len, NULL), ZOK);
    buf[len] = '\0';
    uint64_t raised = strtoull(buf, NULL, 10);
    assert_true(raised > 0);

    assert_int_equal(zoo_delete(zh, fence_path, -1), ZOK);
    fill_lock(&lk, p, "n", 10000); /* no floor */
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    len = sizeof buf - 1;
    assert_int_equal(zoo_get(zh, fence_path, 0, buf, &len, NULL), ZOK);
    buf[len] = '\0';
    print_message("raised to %llu, made again with %s; fences %llu then %llu\n",
                  (unsigned long long)raised, buf, (unsigned long long)f1,
                  (unsigned long long)gr.fence);
    assert_int_equal(strtoull(buf, NULL, 10), raised);
    assert_true(gr.fence > f1);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);

    /* Leave nothing behind: the node is permanent only on real roots. */
    assert_int_equal(zoo_delete(zh, fence_path, -1), ZOK);
    free(p);
    free(top);
    cerb_test_zk_close(zh);
    eng_close(&g);
}

/* `cerberus -c cfg holders name` prints a holder line ending in `want`. */
static void holders_says(const char *cfg, const char *name, const char *want)
{
    char cli[4096];
    snprintf(cli, sizeof cli, "%s/cli/cerberus", cerb_test_build_dir());
    char *argv[] = {cli, "-c", (char *)cfg, "holders", (char *)name, NULL};
    struct cerb_test_proc proc;
    assert_int_equal(cerb_test_proc_start(&proc, argv), 0);
    char *line;
    bool found = false;
    while (!found && (line = cerb_test_proc_line(&proc, 10000)) != NULL) {
        print_message("holders: %s\n", line);
        if (strncmp(line, "zk: held by ", 12) == 0) {
            const char *f = strstr(line, ", fence ");
            found = true;
            if (!f || strcmp(f, want) != 0)
                fail_msg("holders says \"%s\", want \"%s\"", line, want);
        }
        free(line);
    }
    assert_int_equal(cerb_test_proc_end(&proc, 10000), 0);
    assert_true(found);
}

/* The czxid of a hold's node, and the offset now, by a raw client. */
static uint64_t node_czxid_of(const void *priv)
{
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    uint64_t c = node_czxid(zh, priv);
    cerb_test_zk_close(zh);
    return c;
}

static uint64_t fence_offset_now(void)
{
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    uint64_t v = cerb_test_zk_fence_offset(zh, NULL);
    cerb_test_zk_close(zh);
    return v;
}

/*
 * `cerberus holders NAME` shows the holder's fence, the low 48 bits of its
 * token: with a raised offset that is the czxid plus the offset, not the
 * czxid alone; once the offset was raised after the grant, a bound, said
 * as such. (The command is built with the library: cerberus_cli.)
 */
static void test_holders_shows_fence_with_offset(void **state)
{
    (void)state;
    struct eng g;
    eng_open(&g, NULL);
    char *name = test_name("floor-holders");
    void *p = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lk;
    cerb_grant gr;

    fill_lock(&lk, p, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    const uint64_t floor = gr.fence + FLOOR_STEP;
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    fill_lock(&lk, p, name, 10000);
    lk.fence_floor = floor;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > floor);

    char *text = cerb_test_zk_config(NULL, NULL, NULL);
    char *cfg = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(cfg);
    char want[128];
    snprintf(want, sizeof want, ", fence %llu", (unsigned long long)gr.fence);
    holders_says(cfg, name, want);

    /* Raised by another grant while held: the value this grant checked is
     * gone, and the fence is shown as a bound. */
    void *p2 = calloc(1, ops->lock_priv_size);
    char *other = test_name("floor-holders-other");
    cerb_engine_lock l2;
    cerb_grant g2;
    fill_lock(&l2, p2, other, 10000);
    l2.fence_floor = gr.fence + FLOOR_STEP;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &l2, 0, NULL, &g2), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &l2), CERB_OK);
    snprintf(want, sizeof want, ", fence at most %llu (the fence offset was raised since)",
             (unsigned long long)(node_czxid_of(p) + fence_offset_now()));
    holders_says(cfg, name, want);
    cerb_test_remove_file(cfg);
    free(p2);
    free(other);

    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    free(p);
    free(name);
    eng_close(&g);
}

static bool waiting_n(void *ud)
{
    struct eng *g = ud;
    cerb__mutex_lock(&g->e->mu);
    bool w = g->e->waiting != NULL;
    cerb__mutex_unlock(&g->e->mu);
    return w;
}

/*
 * A raise in the middle of a queue: H holds, W queues, then R (with a
 * floor far above) raises the offset and queues behind W. W was created
 * before the raise, so its token stays below the floor — and below R's,
 * which is granted after it: tokens grow in grant order (czxid order)
 * whoever raised what.
 */
static void test_raise_mid_queue(void **state)
{
    (void)state;
    struct eng gh, gw, gr_;
    eng_open(&gh, NULL);
    eng_open(&gw, NULL);
    eng_open(&gr_, NULL);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *name = test_name("midq");
    char *parent = cerb_test_zk_lock_path(name);
    void *ph = calloc(1, ops->lock_priv_size), *pw = calloc(1, ops->lock_priv_size),
         *pr = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lh, lw, lr;
    cerb_grant g;

    fill_lock(&lh, ph, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, gh.e, &lh, 0, NULL, &g), CERB_OK);
    uint64_t fh = g.fence;
    fill_lock(&lw, pw, name, 10000);
    struct waiter w = {.g = &gw, .lk = &lw, .wait_ms = 20000};
    pthread_t tw, tr;
    assert_int_equal(pthread_create(&tw, NULL, waiter_main, &w), 0);
    struct kids_n two = {zh, parent, 2};
    assert_wait_until(kids_n, &two, 5000);
    assert_wait_until(waiting_n, &gw, 5000);

    const uint64_t floor = fh + FLOOR_STEP;
    fill_lock(&lr, pr, name, 10000);
    lr.fence_floor = floor;
    struct waiter r = {.g = &gr_, .lk = &lr, .wait_ms = 20000};
    assert_int_equal(pthread_create(&tr, NULL, waiter_main, &r), 0);
    struct kids_n three = {zh, parent, 3};
    assert_wait_until(kids_n, &three, 5000);
    assert_wait_until(waiting_n, &gr_, 5000);
    int64_t m;
    uint64_t off = cerb_test_zk_fence_offset(zh, &m);
    assert_true(off + (uint64_t)m >= floor); /* raised before R's node was made */

    assert_int_equal(cerb__engine_release(ops, gh.e, &lh), CERB_OK);
    assert_wait_until(waiter_done, &w, 5000);
    pthread_join(tw, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_false(atomic_load(&r.done));
    assert_int_equal(cerb__engine_release(ops, gw.e, &lw), CERB_OK);
    assert_wait_until(waiter_done, &r, 5000);
    pthread_join(tr, NULL);
    assert_int_equal(r.st, CERB_OK);
    print_message("H %llu, W %llu, R %llu (floor %llu)\n", (unsigned long long)fh,
                  (unsigned long long)w.fence, (unsigned long long)r.fence,
                  (unsigned long long)floor);
    assert_true(w.fence > fh);
    assert_true(w.fence < floor); /* created before the raise */
    assert_true(r.fence > floor);
    assert_true(r.fence > w.fence);
    assert_int_equal(cerb__engine_release(ops, gr_.e, &lr), CERB_OK);

    free(ph);
    free(pw);
    free(pr);
    free(parent);
    free(name);
    cerb_test_zk_close(zh);
    eng_close(&gh);
    eng_close(&gw);
    eng_close(&gr_);
}

/* ---- a listing answered after its waiter gave up ---- */

/*
 * A TCP relay between an engine and the test server that can hold the
 * engine's requests: held bytes stay unread in the relay's socket, so the
 * server sees them only once the hold is lifted, while its answers and
 * watch events still reach the engine (a one-way network delay). One
 * connection at a time; the next is accepted when it closes.
 */
struct relay {
    int lfd, port;
    int wake[2];          /* a byte: look at hold and stop again */
    atomic_bool hold, stop;
    atomic_bool holding;  /* the relay has stopped reading the engine */
    pthread_t t;
};

static void relay_wake(struct relay *r)
{
    char b = 0;
    if (write(r->wake[1], &b, 1) != 1)
        abort();
}

/* Copy what `from` has to `to`; false when either side is done. */
static bool pump(int from, int to)
{
    char buf[65536];
    ssize_t n = read(from, buf, sizeof buf);
    if (n <= 0)
        return false;
    for (ssize_t off = 0; off < n;) {
        ssize_t w = write(to, buf + off, (size_t)(n - off));
        if (w <= 0)
            return false;
        off += w;
    }
    return true;
}

static int connect_local(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    int cfd = -1, sfd = -1;
    while (!atomic_load(&r->stop)) {
        bool held = atomic_load(&r->hold);
        struct pollfd pf[3] = {{r->wake[0], POLLIN, 0}, {r->lfd, POLLIN, 0}, {-1, 0, 0}};
        if (cfd >= 0) {
            pf[1].fd = cfd;
            pf[1].events = held ? 0 : POLLIN;
            pf[2].fd = sfd;
            pf[2].events = POLLIN;
        }
        atomic_store(&r->holding, held);
        if (poll(pf, 3, -1) < 0)
            continue;
        if (pf[0].revents) {
            char b[64];
            if (read(r->wake[0], b, sizeof b) <= 0)
                break;
        }
        if (cfd < 0) {
            if (pf[1].revents & POLLIN) {
                cfd = accept(r->lfd, NULL, NULL);
                sfd = cfd >= 0 ? connect_local(cerb_test_zk_port()) : -1;
                if (cfd >= 0 && sfd < 0) {
                    close(cfd);
                    cfd = -1;
                }
            }
            continue;
        }
        bool ok = true;
        if (pf[1].revents)
            ok = !held && pump(cfd, sfd); /* held: only a hangup or error wakes it */
        if (ok && pf[2].revents)
            ok = pump(sfd, cfd);
        if (!ok) {
            close(cfd);
            close(sfd);
            cfd = sfd = -1;
        }
    }
    if (cfd >= 0) {
        close(cfd);
        close(sfd);
    }
    return NULL;
}

static void relay_start(struct relay *r)
{
    memset(r, 0, sizeof *r);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    r->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(r->lfd >= 0);
    assert_int_equal(bind(r->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(r->lfd, 4), 0);
    assert_int_equal(getsockname(r->lfd, (struct sockaddr *)&a, &len), 0);
    r->port = ntohs(a.sin_port);
    assert_int_equal(pipe(r->wake), 0);
    assert_int_equal(pthread_create(&r->t, NULL, relay_main, r), 0);
}

static bool relay_holding(void *ud) { return atomic_load(&((struct relay *)ud)->holding); }

/* Hold (or let go of) the engine's requests; returns once the relay does. */
static void relay_hold(struct relay *r, bool hold)
{
    atomic_store(&r->hold, hold);
    relay_wake(r);
    if (hold)
        assert_wait_until(relay_holding, r, 5000);
}

static void relay_stop(struct relay *r)
{
    atomic_store(&r->stop, true);
    relay_wake(r);
    pthread_join(r->t, NULL);
    close(r->lfd);
    close(r->wake[0]);
    close(r->wake[1]);
}

/* The waiter's node is made and its first listing answered. */
static bool waiter_has_node(void *ud)
{
    struct waiter *w = ud;
    cerb__mutex_lock(&w->g->e->mu);
    bool set = ((struct zk_lock_priv *)w->lk->priv)->node != NULL;
    cerb__mutex_unlock(&w->g->e->mu);
    return set;
}

/*
 * Found by the chaos suite (zk, seed 424243): a waiter whose deadline
 * passes while its getChildren is unanswered gives up and frees its node's
 * name; the answer, arriving later, was analysed against that freed name
 * (heap-use-after-free under ASan). Here the queue is H (holds) and M
 * (waits), foreign nodes of a raw client, then our waiter A. With the
 * engine's requests held by the relay, M is deleted: A is woken (or its
 * watch is never answered), lists again, and that listing stays unanswered
 * until A has given up by its deadline. Then the requests go through; a
 * trylock on the same session is answered after the late listing, so the
 * listing's completion has run by the time it returns.
 */
static void test_late_listing_after_give_up(void **state)
{
    (void)state;
    struct relay r;
    relay_start(&r);
    char hosts[64];
    snprintf(hosts, sizeof hosts, "127.0.0.1:%d", r.port);
    struct eng g;
    char *text = cerb_test_zk_config(hosts, "session_timeout_ms = 10000;", NULL);
    memset(&g, 0, sizeof g);
    assert_int_equal(cerb__config_from_string(text, &g.cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = g.cfg};
    assert_int_equal(cerb__engine_open(ops, &env, &g.e), CERB_OK);

    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *name = test_name("late-list");
    char *parent = cerb_test_zk_lock_path(name);
    zoo_create(zh, "/cerberus", NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
    zoo_create(zh, CERB_TEST_ZK_ROOT, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
    assert_int_equal(zoo_create(zh, parent, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER,
                                NULL, 0),
                     ZOK);
    char *h = make_node(zh, parent, "aaaaaaaa-0000-4000-8000-000000000001");
    char *m = make_node(zh, parent, "aaaaaaaa-0000-4000-8000-000000000002");

    void *pa = calloc(1, ops->lock_priv_size), *pb = calloc(1, ops->lock_priv_size);
    cerb_engine_lock la, lb;
    fill_lock(&la, pa, name, 10000);
    fill_lock(&lb, pb, name, 10000);
    /* Well inside the client's 2/3 of the session (6.7 s) of silence. */
    struct waiter w = {.g = &g, .lk = &la, .wait_ms = 2000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
    assert_wait_until(waiter_has_node, &w, 5000);
    uint64_t relists = atomic_load(&g.e->stats.relists);

    relay_hold(&r, true);
    assert_int_equal(zoo_delete(zh, m, -1), ZOK);
    assert_wait_until(waiter_done, &w, 10000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_TIMEOUT);
    /* It did list again, and that listing cannot have been answered. */
    assert_true(atomic_load(&g.e->stats.relists) > relists);

    relay_hold(&r, false);
    cerb_grant gr;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lb, 0, NULL, &gr), CERB_BUSY);
    /* Nothing of ours stays behind: only H is left. */
    struct kids_n one = {zh, parent, 1};
    assert_wait_until(kids_n, &one, 10000);

    zoo_delete(zh, h, -1);
    free(h);
    free(m);
    free(pa);
    free(pb);
    free(parent);
    free(name);
    cerb_test_zk_close(zh);
    eng_close(&g);
    relay_stop(&r);
}

/*
 * A grant with a floor whose create answer is lost (the relay holds the
 * engine's requests past the trylock's bound): the outcome is unknown, the
 * node lands once the requests go through, and check_owner adopts it with
 * the fence the create got, czxid plus the offset it checked — above the
 * floor, as the grant would have been. A raise left unanswered ends by the
 * call's bound, with nothing created.
 */
static void test_settled_grant_keeps_floor(void **state)
{
    (void)state;
    struct relay r;
    relay_start(&r);
    char hosts[64];
    snprintf(hosts, sizeof hosts, "127.0.0.1:%d", r.port);
    struct eng g;
    char *text = cerb_test_zk_config(hosts, "session_timeout_ms = 10000; "
                                     "connect_timeout_ms = 1000;", NULL);
    memset(&g, 0, sizeof g);
    assert_int_equal(cerb__config_from_string(text, &g.cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = g.cfg};
    assert_int_equal(cerb__engine_open(ops, &env, &g.e), CERB_OK);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *name = test_name("floor-settle");
    char *parent = cerb_test_zk_lock_path(name);
    void *p = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lk;
    cerb_grant gr, gc;

    fill_lock(&lk, p, name, 10000);
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    const uint64_t floor = gr.fence + FLOOR_STEP;
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    /* The raise, answered. */
    fill_lock(&lk, p, name, 10000);
    lk.fence_floor = floor;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > floor);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);

    /* The same floor again, its create unanswered. */
    relay_hold(&r, true);
    fill_lock(&lk, p, name, 10000);
    lk.fence_floor = floor;
    assert_int_not_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(gr.outcome, CERB_OUTCOME_UNKNOWN);
    relay_hold(&r, false);
    struct kids_n one = {zh, parent, 1};
    /* The held create usually lands once the relay lets it go; on a loaded
     * machine the client may have dropped the connection first, and the
     * request with it. Then nothing landed, and settling must say so. */
    if (!wait_until(kids_n, &one, 10000)) {
        print_message("the held create never landed (connection dropped first)\n");
        assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gc), CERB_NOT_OWNER);
        goto done;
    }

    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gc), CERB_OK);
    uint64_t want = node_czxid(zh, p) + cerb_test_zk_fence_offset(zh, NULL);
    print_message("settled: fence %llu, czxid + offset %llu, floor %llu\n",
                  (unsigned long long)gc.fence, (unsigned long long)want,
                  (unsigned long long)floor);
    assert_int_equal(gc.fence, want);
    assert_true(gc.fence > floor);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);

    /* A raise that is not answered: the trylock ends by its bound (the
     * connect timeout, 1 s), and nothing was created: the outcome is NO. */
    relay_hold(&r, true);
    fill_lock(&lk, p, name, 10000);
    lk.fence_floor = gc.fence + FLOOR_STEP;
    int64_t t0 = cerb_monotime();
    assert_int_not_equal(cerb__engine_acquire(ops, g.e, &lk, 0, NULL, &gr), CERB_OK);
    int64_t took_ms = (cerb_monotime() - t0) / CERB_NS_PER_MS;
    print_message("unanswered raise: %s after %lld ms\n", cerb_last_error(), (long long)took_ms);
    assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
    assert_true(took_ms < 1000 + 500);
    relay_hold(&r, false);
    /* Once answered again, the floor is met. */
    fill_lock(&lk, p, name, 10000);
    lk.fence_floor = gc.fence + FLOOR_STEP;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &lk, cerb__deadline_in(5000), NULL, &gr),
                     CERB_OK);
    assert_true(gr.fence > lk.fence_floor);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);

done:
    free(p);
    free(parent);
    free(name);
    cerb_test_zk_close(zh);
    eng_close(&g);
    relay_stop(&r);
}

/* ---- requests on a session the server has ended ---- */

static void quiet_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh;
    (void)type;
    (void)state;
    (void)path;
    (void)ctx;
}

struct state_is {
    zhandle_t *zh;
    int state;
};

static bool zh_state_is(void *ud)
{
    struct state_is *w = ud;
    return zoo_state(w->zh) == w->state;
}

/*
 * The child of test_multi_on_expired_session, role "expired_multi"
 * (ready_fd, go_fd): opens a session, reports ready, is stopped past the
 * session's timeout, then waits until the handle knows it has expired and
 * sends a multi of three ops on it. 0 when the multi was refused with
 * ZINVALIDSTATE and the caller's paths are still the caller's; ASan ends
 * the child otherwise.
 */
static int expired_multi_role(int argc, char **argv)
{
    if (argc != 2)
        return 99;
    int ready_fd = atoi(argv[0]), go_fd = atoi(argv[1]);
    cerb__engines_builtin();
    ops = cerb__engine_find("zk");
    struct eng g;
    eng_open(&g, "session_timeout_ms = 1500;");
    struct zk_session *s = NULL;
    if (cerb__zk_session_open(g.e, 0, quiet_watcher, &s) != CERB_OK)
        return 100;
    struct state_is w = {s->zh, ZOO_CONNECTED_STATE};
    if (!wait_until(zh_state_is, &w, 10000))
        return 101;
    char b = 'r';
    if (write(ready_fd, &b, 1) != 1 || read(go_fd, &b, 1) != 1) /* stopped meanwhile */
        return 102;
    w.state = ZOO_EXPIRED_SESSION_STATE;
    if (!wait_until(zh_state_is, &w, 20000))
        return 103;

    char *paths[3];
    for (int i = 0; i < 3; i++) {
        paths[i] = malloc(64);
        if (!paths[i])
            return 104;
        snprintf(paths[i], 64, "/expired-multi-%ld-%d", (long)getpid(), i);
    }
    zoo_op_t mops[3];
    zoo_check_op_init(&mops[0], paths[0], 0);
    zoo_delete_op_init(&mops[1], paths[1], -1);
    zoo_create_op_init(&mops[2], paths[2], "x", 1, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT, NULL, 0);
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return 105;
    int k = cerb__zk_call_multi(c, s, mops, 3);
    if (!cerb__zk_call_wait(c, cerb__deadline_in(5000)))
        return 106;
    int rc = c->res[k].rc;
    cerb__zk_call_put(c);
    for (int i = 0; i < 3; i++)
        free(paths[i]); /* ours still: ASan says so if the multi freed one */
    cerb__zk_session_close(s);
    eng_close(&g);
    return rc == ZINVALIDSTATE ? 0 : 107;
}

/*
 * A multi sent on a session that has expired. libzookeeper_mt 3.8's
 * zoo_amulti stops preparing ops once one fails (the handle is
 * unrecoverable) but still frees every later op's path from a request it
 * never filled in: a stale pointer, in practice an earlier op's path,
 * which is the caller's. The engine must answer ZINVALIDSTATE without
 * handing the library such a multi.
 */
static void test_multi_on_expired_session(void **state)
{
    (void)state;
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    char ready_s[16], go_s[16];
    snprintf(ready_s, sizeof ready_s, "%d", ready[1]);
    snprintf(go_s, sizeof go_s, "%d", go[0]);
    char *args[] = {ready_s, go_s, NULL};
    int keep[] = {ready[1], go[0], -1};
    pid_t pid = cerb_test_spawn_self("expired_multi", args, keep);
    assert_true(pid > 0);
    close(ready[1]);
    close(go[0]);
    char b;
    assert_int_equal(cerb_test_read_within(ready[0], &b, 1, 20000), 1);
    assert_int_equal(cerb_test_pause_pid(pid), 0);
    /* Well past the 1.5 s session timeout: the server expires it. */
    cerb_test_let_time_pass(5000);
    assert_int_equal(cerb_test_resume_pid(pid), 0);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(cerb_test_wait(pid, 60000), 0);
    close(ready[0]);
    close(go[1]);
}

/* The children of this suite, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {
    {"expired_multi", expired_multi_role},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_children_order),
        cmocka_unit_test(test_fence_path_and_parse),
        cmocka_unit_test(test_grant_check_renew_release),
        cmocka_unit_test(test_adopt_only_current_session),
        cmocka_unit_test(test_hold_bound_negotiated),
        cmocka_unit_test(test_ttl_bounded_by_session),
        cmocka_unit_test(test_mark_sent_again),
        cmocka_unit_test(test_late_listing_after_give_up),
        cmocka_unit_test(test_fence_floor_raises_offset),
        cmocka_unit_test(test_raise_mid_queue),
        cmocka_unit_test(test_deleted_offset_node_made_again),
        cmocka_unit_test(test_holders_shows_fence_with_offset),
        cmocka_unit_test(test_settled_grant_keeps_floor),
        cmocka_unit_test(test_multi_on_expired_session),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
