/*
 * test_zk_election.c — leader election on the zk engine (engine_zk/
 * zk_election.c), against a real ZooKeeper: one leader at a time, BUSY for a
 * try, the value on the leader's node (Curator's participant id) from the
 * campaign on and changed by proclaim, cerb_election_leader reading it with
 * the term's fence counter, fences growing term after term in arrival
 * order, node names in the LeaderLatch layout (-latch-) by default and the
 * LeaderSelector one (-lock-) when asked, data never the mutex's
 * "cerb:holding" mark, values with the marks' prefix refused, and a term
 * lost when its session expires told once.
 */
#define _POSIX_C_SOURCE 200809L
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
#include "test_util.h"
#include "zk_layout.h"
#include "zk_util.h"

#define LOW48(x) ((x) & ((UINT64_C(1) << 48) - 1))

static cerb_client *open_client(const char *zk_extra)
{
    char *cfg = cerb_test_zk_config(NULL, zk_extra, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static cerb_election *candidate(cerb_client *c, const char *name, int layout)
{
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.layout = layout;
    cerb_election *e = NULL;
    assert_int_equal(cerb_election_new(c, name, &o, &e), CERB_OK);
    return e;
}

/* The leader's value ("" when unknown), NULL for nobody; *term and *owner
 * (may be NULL) get its counter and node name. */
static char *leader_value(cerb_client *c, const char *name, int layout, uint64_t *term,
                          char *owner)
{
    cerb_leader_info li;
    cerb_status st = cerb_election_leader(c, name, layout, &li);
    if (st != CERB_OK)
        fail_msg("leader: %s: %s", cerb_status_name(st), cerb_last_error());
    char *v = NULL;
    if (li.has_leader) {
        v = strndup(li.value_known ? (const char *)li.value : "", li.value_len);
        assert_string_equal(li.engine, "zk");
        if (term)
            *term = li.term;
        if (owner)
            snprintf(owner, 96, "%s", li.owner);
    }
    cerb_leader_info_clear(&li);
    return v;
}

/* The children of name's node (sorted), and the data of child i. */
static int children(zhandle_t *zh, const char *name, struct String_vector *v)
{
    char *path = cerb_test_zk_lock_path(name);
    int n = cerb_test_zk_children(zh, path, v, NULL);
    free(path);
    return n;
}

static char *child_data(zhandle_t *zh, const char *name, const char *child)
{
    char *parent = cerb_test_zk_lock_path(name);
    char path[512], buf[256];
    snprintf(path, sizeof path, "%s/%s", parent, child);
    free(parent);
    int len = sizeof buf - 1;
    struct Stat stat;
    int rc = zoo_get(zh, path, 0, buf, &len, &stat);
    if (rc != ZOK)
        return NULL;
    buf[len < 0 ? 0 : len] = '\0';
    return strdup(buf);
}

/* The only child's name and data; fails unless there is exactly one. */
static void only_child(zhandle_t *zh, const char *name, char *child, size_t n, char **data)
{
    struct String_vector v;
    assert_int_equal(children(zh, name, &v), 1);
    snprintf(child, n, "%s", v.data[0]);
    deallocate_String_vector(&v);
    *data = child_data(zh, name, child);
    assert_non_null(*data);
}

/* ---- the latch layout's names and order (pure) ---- */

static void test_latch_names_and_order(void **state)
{
    (void)state;
    char *names[] = {
        "_c_bbbbbbbb-0000-4000-8000-000000000000-latch-0000000007",
        "_c_aaaaaaaa-0000-4000-8000-000000000000-lock-0000000002", /* no "latch-": last */
        "_c_cccccccc-0000-4000-8000-000000000000-latch-0000000003",
    };
    struct String_vector v = {3, names};
    struct zk_children k;
    cerb__zk_children_analyze_mark(&v, names[0], NULL, ZK_LATCH_MARK, &k);
    assert_true(k.found_self);
    assert_int_equal(k.n_lower, 1); /* 3 before 7; the lock node sorts after */
    assert_string_equal(k.pred, names[2]);
    cerb__zk_children_clear(&k);
    /* By "lock-", the lock node (2) is first and the latch nodes last. */
    cerb__zk_children_analyze_mark(&v, names[1], NULL, ZK_LOCK_MARK, &k);
    assert_int_equal(k.n_lower, 0);
    cerb__zk_children_clear(&k);
    assert_string_equal(cerb__zk_child_key_mark(names[0], ZK_LATCH_MARK), "0000000007");
    assert_string_equal(cerb__zk_child_key_mark(names[0], ZK_LOCK_MARK), names[0]);
    assert_false(cerb__zk_child_is_ours(names[0])); /* version 4: Curator's */
    assert_true(cerb__zk_child_is_ours("_c_bbbbbbbb-0000-8000-8000-000000000000-latch-0000000001"));
    assert_false(cerb__zk_child_is_ours("_c_bbbbbbbb-0000-8000-8000-00000000000-latch-01"));
    assert_false(cerb__zk_child_is_ours("latch-0000000001"));
    char *p = cerb__zk_node_prefix_mark("/r/n", "bbbbbbbb-0000-4000-8000-000000000000",
                                        ZK_LATCH_MARK);
    assert_string_equal(p, "/r/n/_c_bbbbbbbb-0000-4000-8000-000000000000-latch-");
    cerb__free(p);
}

/* ---- campaign, BUSY, leader, proclaim, resign (the latch layout) ---- */

static void test_latch_campaign_leader_proclaim(void **state)
{
    (void)state;
    char *name = test_name("el-latch");
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c1 = open_client(NULL), *c2 = open_client(NULL), *obs = open_client(NULL);
    cerb_election *a = candidate(c1, name, CERB_ELECTION_LAYOUT_DEFAULT);
    cerb_election *b = candidate(c2, name, CERB_ELECTION_LAYOUT_LATCH);

    char *v = leader_value(obs, name, 0, NULL, NULL);
    assert_null(v); /* nobody, not even the parent */
    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_OK);
    uint64_t fa = cerb_election_fencing_token(a);
    assert_true(fa > 0);

    /* Curator's LeaderLatch layout, the value as the node's data. */
    char child[128], *data = NULL;
    only_child(zh, name, child, sizeof child, &data);
    assert_true(strncmp(child, "_c_", 3) == 0);
    assert_non_null(strstr(child, "-latch-0"));
    assert_int_equal(child[3 + 14], '8'); /* a term's uuid: version 8 */
    assert_true(cerb__zk_child_is_ours(child));
    assert_string_equal(data, "node-a");
    free(data);

    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_BUSY);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 300, NULL), CERB_TIMEOUT);
    struct String_vector kv;
    assert_int_equal(children(zh, name, &kv), 1); /* b left nothing behind */
    deallocate_String_vector(&kv);

    uint64_t term = 0;
    char owner[96];
    v = leader_value(obs, name, 0, &term, owner);
    assert_string_equal(v, "node-a");
    free(v);
    assert_int_equal(term, LOW48(fa)); /* the term's fence counter */
    assert_string_equal(owner, child);
    /* The selector layout has nobody: latch nodes are not its candidates. */
    v = leader_value(obs, name, CERB_ELECTION_LAYOUT_SELECTOR, NULL, NULL);
    assert_null(v);

    assert_int_equal(cerb_election_proclaim(a, "node-a:2", 8), CERB_OK);
    assert_int_equal(cerb_election_proclaim(a, "node-a:2", 8), CERB_OK); /* idempotent */
    v = leader_value(obs, name, CERB_ELECTION_LAYOUT_LATCH, &term, NULL);
    assert_string_equal(v, "node-a:2");
    free(v);
    assert_int_equal(term, LOW48(fa)); /* the same term */
    data = child_data(zh, name, child);
    assert_string_equal(data, "node-a:2");
    free(data);
    assert_int_equal(cerb_election_proclaim(b, "node-b", 6), CERB_NOT_OWNER);

    assert_int_equal(cerb_election_resign(a), CERB_OK);
    assert_int_equal(cerb_election_proclaim(a, "late", 4), CERB_NOT_OWNER);
    v = leader_value(obs, name, 0, NULL, NULL);
    assert_null(v);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_OK);
    assert_true(cerb_election_fencing_token(b) > fa);
    v = leader_value(obs, name, 0, &term, NULL);
    assert_string_equal(v, "node-b");
    free(v);
    assert_int_equal(term, LOW48(cerb_election_fencing_token(b)));
    /* An empty value is a value, known. */
    assert_int_equal(cerb_election_proclaim(b, NULL, 0), CERB_OK);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(obs, name, 0, &li), CERB_OK);
    assert_true(li.has_leader);
    assert_true(li.value_known);
    assert_int_equal(li.value_len, 0);
    cerb_leader_info_clear(&li);

    assert_int_equal(cerb_election_free(b), CERB_OK);
    assert_int_equal(cerb_election_free(a), CERB_OK);
    cerb_client_close(obs);
    cerb_client_close(c2);
    cerb_client_close(c1);
    cerb_test_zk_close(zh);
    free(name);
}

/* ---- waiting candidates: arrival order, one node each, never marked ---- */

struct waiter {
    cerb_election *e;
    const char *value;
    cerb_status st;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_election_campaign(w->e, w->value, strlen(w->value), 20000, NULL);
    atomic_store(&w->done, true);
    return NULL;
}

static bool w_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

struct kids {
    zhandle_t *zh;
    const char *name;
    int want;
};
static bool kids_are(void *ud)
{
    struct kids *k = ud;
    return children(k->zh, k->name, NULL) == k->want;
}

/* Every child's data is a candidate's value, never a mark. */
static void no_marks(zhandle_t *zh, const char *name, const char *mark)
{
    struct String_vector v;
    int n = children(zh, name, &v);
    assert_true(n > 0);
    for (int i = 0; i < v.count; i++) {
        assert_non_null(strstr(v.data[i], mark));
        char *d = child_data(zh, name, v.data[i]);
        assert_non_null(d);
        assert_true(strncmp(d, "cerb:", 5) != 0);
        assert_true(strncmp(d, "node-", 5) == 0);
        free(d);
    }
    deallocate_String_vector(&v);
}

static void elected_in_order(int layout, const char *mark)
{
    char *name = test_name("el-order");
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c1 = open_client(NULL), *c2 = open_client(NULL), *c3 = open_client(NULL);
    cerb_election *a = candidate(c1, name, layout), *b = candidate(c2, name, layout),
                  *c = candidate(c3, name, layout);

    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_OK);
    struct waiter wb = {.e = b, .value = "node-b"}, wc = {.e = c, .value = "node-c"};
    pthread_t tb, tc;
    pthread_create(&tb, NULL, waiter_main, &wb);
    struct kids two = {zh, name, 2}, three = {zh, name, 3};
    assert_wait_until(kids_are, &two, 10000);
    pthread_create(&tc, NULL, waiter_main, &wc);
    assert_wait_until(kids_are, &three, 10000);
    /* The leader with two successors: its data is still its value. */
    no_marks(zh, name, mark);
    char *v = leader_value(c3, name, layout, NULL, NULL);
    assert_string_equal(v, "node-a");
    free(v);
    /* Cerberus candidates behind: a proclaim is fine in both layouts. */
    assert_int_equal(cerb_election_proclaim(a, "node-a2", 7), CERB_OK);
    v = leader_value(c3, name, layout, NULL, NULL);
    assert_string_equal(v, "node-a2");
    free(v);

    uint64_t fa = cerb_election_fencing_token(a);
    assert_int_equal(cerb_election_resign(a), CERB_OK);
    assert_wait_until(w_done, &wb, 10000);
    assert_int_equal(wb.st, CERB_OK);
    assert_false(atomic_load(&wc.done)); /* one wake-up: c still waits */
    uint64_t fb = cerb_election_fencing_token(b);
    assert_true(fb > fa);
    no_marks(zh, name, mark);
    v = leader_value(c1, name, layout, NULL, NULL);
    assert_string_equal(v, "node-b");
    free(v);

    assert_int_equal(cerb_election_resign(b), CERB_OK);
    assert_wait_until(w_done, &wc, 10000);
    assert_int_equal(wc.st, CERB_OK);
    assert_true(cerb_election_fencing_token(c) > fb);
    v = leader_value(c1, name, layout, NULL, NULL);
    assert_string_equal(v, "node-c");
    free(v);
    pthread_join(tb, NULL);
    pthread_join(tc, NULL);

    cerb_election_free(c);
    cerb_election_free(b);
    cerb_election_free(a);
    cerb_client_close(c3);
    cerb_client_close(c2);
    cerb_client_close(c1);
    cerb_test_zk_close(zh);
    free(name);
}

static void test_latch_elected_in_order(void **state)
{
    (void)state;
    elected_in_order(CERB_ELECTION_LAYOUT_LATCH, "-latch-");
}

static void test_selector_elected_in_order(void **state)
{
    (void)state;
    elected_in_order(CERB_ELECTION_LAYOUT_SELECTOR, "-lock-");
}

/* ---- the selector layout is the mutex's: a lock and a term exclude ---- */

static void test_selector_excludes_lock(void **state)
{
    (void)state;
    char *name = test_name("el-sel");
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c1 = open_client(NULL), *c2 = open_client(NULL);
    cerb_election *a = candidate(c1, name, CERB_ELECTION_LAYOUT_SELECTOR);
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c2, name, NULL, &l), CERB_OK);

    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_OK);
    char child[128], *data = NULL;
    only_child(zh, name, child, sizeof child, &data);
    assert_non_null(strstr(child, "-lock-0"));
    assert_string_equal(data, "node-a");
    free(data);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(cerb_election_resign(a), CERB_OK);

    /* A lock holder is the selector layout's leader, whose value is not
     * known (its node carries the mutex's mark). */
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c1, name, CERB_ELECTION_LAYOUT_SELECTOR, &li),
                     CERB_OK);
    assert_true(li.has_leader);
    assert_false(li.value_known);
    cerb_leader_info_clear(&li);
    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    cerb_lock_free(l);
    cerb_election_free(a);
    cerb_client_close(c2);
    cerb_client_close(c1);
    cerb_test_zk_close(zh);
    free(name);
}

/* ---- a waiter reads no marks in a peer's data ---- */

struct bg {
    cerb_election *e;
    cerb_status st;
    atomic_bool done;
};

static void *bg_campaign(void *arg)
{
    struct bg *b = arg;
    b->st = cerb_election_campaign(b->e, "node-w", 6, 20000, NULL);
    atomic_store(&b->done, true);
    return NULL;
}

static bool bg_done(void *ud) { return atomic_load(&((struct bg *)ud)->done); }

/* A peer's node: "<path>/_c_<uuid>-lock-<seq>" with `data`; its name. */
static char *peer_node(zhandle_t *zh, const char *path, const char *uuid, const char *data)
{
    char prefix[256], out[256];
    snprintf(prefix, sizeof prefix, "%s/_c_%s-lock-", path, uuid);
    int rc = zoo_create(zh, prefix, data, (int)strlen(data), &ZOO_OPEN_ACL_UNSAFE,
                        ZOO_EPHEMERAL_SEQUENTIAL, out, sizeof out);
    assert_int_equal(rc, ZOK);
    return strdup(out);
}

/*
 * In the selector layout a Curator LeaderSelector's node carries whatever
 * id its user chose, "cerb:holding" too. Such a node waiting between the
 * leader and our candidate, then giving up, must not elect ours: the
 * leader still leads. Only the leader's going does.
 */
static void test_waiter_ignores_peer_marks(void **state)
{
    (void)state;
    char *name = test_name("el-marks");
    char *path = cerb_test_zk_lock_path(name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c = open_client(NULL);
    cerb_election *e = candidate(c, name, CERB_ELECTION_LAYOUT_SELECTOR);

    /* The parents, then the leader and a waiter of a peer. */
    assert_int_equal(cerb_election_campaign(e, "node-w", 6, 0, NULL), CERB_OK);
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    char *leader = peer_node(zh, path, "11111111-0000-4000-8000-000000000000", "peer-leader");
    char *waiter = peer_node(zh, path, "22222222-0000-4000-8000-000000000000", "cerb:holding");
    struct bg b = {.e = e};
    pthread_t t;
    pthread_create(&t, NULL, bg_campaign, &b);
    struct kids three = {zh, name, 3};
    assert_wait_until(kids_are, &three, 10000);

    assert_int_equal(zoo_delete(zh, waiter, -1), ZOK); /* the peer's waiter gives up */
    cerb_test_let_time_pass(500); /* a wrong take-over would come by now */
    assert_false(atomic_load(&b.done));
    char *v = leader_value(c, name, CERB_ELECTION_LAYOUT_SELECTOR, NULL, NULL);
    assert_string_equal(v, "peer-leader");
    free(v);
    assert_int_equal(zoo_delete(zh, leader, -1), ZOK);
    assert_wait_until(bg_done, &b, 10000);
    pthread_join(t, NULL);
    assert_int_equal(b.st, CERB_OK);

    cerb_election_free(e);
    cerb_client_close(c);
    cerb_test_zk_close(zh);
    free(leader);
    free(waiter);
    free(path);
    free(name);
}

struct bg_lock {
    cerb_lock *l;
    cerb_hold *h;
    cerb_status st;
    atomic_bool done;
};

static void *bg_lock_wait(void *arg)
{
    struct bg_lock *b = arg;
    b->st = cerb_lock_acquire(b->l, 20000, NULL, &b->h);
    atomic_store(&b->done, true);
    return NULL;
}

static bool bg_lock_done(void *ud) { return atomic_load(&((struct bg_lock *)ud)->done); }

/*
 * The same for a plain lock on a name a LeaderSelector also uses (the
 * mutex's layout): a peer's waiter whose participant id reads
 * "cerb:holding" is no Cerberus holder announcing itself, and a Cerberus
 * lock waiter behind it must not take the name when it gives up while the
 * peer's leader still leads (two holders). Cerberus nodes carry their
 * uuid's version 8; only their data is read as a mark.
 */
static void test_lock_waiter_ignores_peer_marks(void **state)
{
    (void)state;
    char *name = test_name("lk-marks");
    char *path = cerb_test_zk_lock_path(name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c = open_client(NULL);
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK); /* the parents */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    char *leader = peer_node(zh, path, "33333333-0000-4000-8000-000000000000", "peer-leader");
    char *waiter = peer_node(zh, path, "44444444-0000-4000-8000-000000000000", "cerb:holding");
    struct bg_lock b = {.l = l};
    pthread_t t;
    pthread_create(&t, NULL, bg_lock_wait, &b);
    struct kids three = {zh, name, 3};
    assert_wait_until(kids_are, &three, 10000);

    assert_int_equal(zoo_delete(zh, waiter, -1), ZOK); /* the peer's waiter gives up */
    cerb_test_let_time_pass(500); /* a wrong take-over would come by now */
    assert_false(atomic_load(&b.done));
    assert_int_equal(zoo_delete(zh, leader, -1), ZOK);
    assert_wait_until(bg_lock_done, &b, 10000);
    pthread_join(t, NULL);
    assert_int_equal(b.st, CERB_OK);
    assert_int_equal(cerb_hold_free(b.h), CERB_OK);

    cerb_lock_free(l);
    cerb_client_close(c);
    cerb_test_zk_close(zh);
    free(leader);
    free(waiter);
    free(path);
    free(name);
}

/* ---- values the layout cannot carry ---- */

static void test_mark_values_refused(void **state)
{
    (void)state;
    char *name = test_name("el-bad");
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c = open_client(NULL);
    cerb_election *a = candidate(c, name, CERB_ELECTION_LAYOUT_SELECTOR);
    assert_int_equal(cerb_election_campaign(a, "cerb:holding", 12, 0, NULL), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "cerb:"));
    assert_int_equal(children(zh, name, NULL), -1); /* nothing was sent */
    assert_int_equal(cerb_election_campaign(a, "cerb", 4, 0, NULL), CERB_OK);
    assert_int_equal(cerb_election_proclaim(a, "cerb:waiting", 12), CERB_EINVAL);
    char *v = leader_value(c, name, CERB_ELECTION_LAYOUT_SELECTOR, NULL, NULL);
    assert_string_equal(v, "cerb");
    free(v);
    cerb_election_free(a);
    cerb_client_close(c);
    cerb_test_zk_close(zh);
    free(name);
}

/* ---- a term lost with its session: told once ---- */

static atomic_int lost_count;

static void on_lost(cerb_election *e, void *ud)
{
    (void)e;
    (void)ud;
    atomic_fetch_add(&lost_count, 1);
}

static bool lost_told(void *ud)
{
    (void)ud;
    return atomic_load(&lost_count) > 0;
}

/*
 * The child of test_term_lost_on_expiry, role "leader" (name, ready_fd,
 * go_fd): leads `name` with the value "child" on a 1.5 s session, reports
 * ready, is stopped past the session, and once resumed expects its term
 * lost, told once. Exit 0, or the step that failed.
 */
static int leader_role(int argc, char **argv)
{
    if (argc != 3)
        return 99;
    const char *name = argv[0];
    int ready_fd = atoi(argv[1]), go_fd = atoi(argv[2]);
    char *cfg = cerb_test_zk_config(NULL, "session_timeout_ms = 1500;", NULL);
    cerb_client *c = NULL;
    if (!cfg || cerb_client_open_string(&c, cfg) != CERB_OK)
        return 100;
    free(cfg);
    cerb_election *e = NULL;
    if (cerb_election_new(c, name, NULL, &e) != CERB_OK ||
        cerb_election_on_lost(e, on_lost, NULL) != CERB_OK)
        return 101;
    if (cerb_election_campaign(e, "child", 5, 10000, NULL) != CERB_OK)
        return 102;
    char b = 'r';
    if (write(ready_fd, &b, 1) != 1 || read(go_fd, &b, 1) != 1) /* stopped meanwhile */
        return 103;
    if (!wait_until(lost_told, NULL, 20000))
        return 104;
    if (cerb_election_state(e) != CERB_LOCK_LOST)
        return 105;
    if (cerb_election_proclaim(e, "again", 5) != CERB_LOST)
        return 106;
    cerb_test_let_time_pass(1000); /* a second callback would come by now */
    if (atomic_load(&lost_count) != 1)
        return 107;
    cerb_election_free(e);
    cerb_client_close(c);
    return 0;
}

static void test_term_lost_on_expiry(void **state)
{
    (void)state;
    char *name = test_name("el-expire");
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    char ready_s[16], go_s[16];
    snprintf(ready_s, sizeof ready_s, "%d", ready[1]);
    snprintf(go_s, sizeof go_s, "%d", go[0]);
    char *args[] = {name, ready_s, go_s, NULL};
    int keep[] = {ready[1], go[0], -1};
    pid_t pid = cerb_test_spawn_self("leader", args, keep);
    assert_true(pid > 0);
    close(ready[1]);
    close(go[0]);
    char b;
    assert_int_equal(cerb_test_read_within(ready[0], &b, 1, 20000), 1);

    cerb_client *c = open_client(NULL);
    char *v = leader_value(c, name, 0, NULL, NULL);
    assert_string_equal(v, "child");
    free(v);
    cerb_election *e = candidate(c, name, 0);
    assert_int_equal(cerb_election_campaign(e, "parent", 6, 0, NULL), CERB_BUSY);
    /* Stopped, the child's session expires and its node with it. */
    assert_int_equal(cerb_test_pause_pid(pid), 0);
    assert_int_equal(cerb_election_campaign(e, "parent", 6, 20000, NULL), CERB_OK);
    v = leader_value(c, name, 0, NULL, NULL);
    assert_string_equal(v, "parent");
    free(v);
    assert_int_equal(cerb_test_resume_pid(pid), 0);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(cerb_test_wait(pid, 60000), 0);
    assert_int_equal(cerb_election_state(e), CERB_LOCK_VALID);
    close(ready[0]);
    close(go[1]);
    cerb_election_free(e);
    cerb_client_close(c);
    free(name);
}

static const struct cerb_test_role roles[] = {
    {"leader", leader_role},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_latch_names_and_order),
        cmocka_unit_test(test_latch_campaign_leader_proclaim),
        cmocka_unit_test(test_latch_elected_in_order),
        cmocka_unit_test(test_selector_elected_in_order),
        cmocka_unit_test(test_selector_excludes_lock),
        cmocka_unit_test(test_waiter_ignores_peer_marks),
        cmocka_unit_test(test_lock_waiter_ignores_peer_marks),
        cmocka_unit_test(test_mark_values_refused),
        cmocka_unit_test(test_term_lost_on_expiry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
