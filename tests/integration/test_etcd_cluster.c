/*
 * test_etcd_cluster.c — the etcd engine against a 3-node cluster this suite
 * starts itself (client ports 22411, 22413, 22415; peers +1), with the
 * leader killed (SIGKILL) while one lock is held and another is contended:
 *  - clients know all three endpoints, stick to one, and rotate when it
 *    refuses connections or stops answering (no leader, timeouts);
 *  - the contended lock makes progress again within ~1.5 s of the kill
 *    (a new leader takes ~1 s), with no double grant (an overlap counter)
 *    and fencing tokens that only go up;
 *  - the held lock stays VALID throughout: leases get a full TTL on a
 *    leader change, and renewals are answered by the session;
 *  - nothing is left behind once everyone has unlocked.
 * And requests a paused member held, applied when it resumes: the deletes
 * of an unlock and of a stale hold's background release must not take the
 * key of the client's next hold of the name.
 * The killed member is started again on its data, and the cluster is
 * stopped by PID at the end. The file name puts it on the exclusive etcd
 * resource (RESOURCE_LOCK etcd_server), so no other suite runs meanwhile.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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

#define BASE 22411
#define NODES 3
#define CONTENDERS 4

static const int ports[NODES] = {BASE, BASE + 2, BASE + 4};

static cerb_client *open_client(void)
{
    char *cfg = etcd_test_config_ports(ports, NODES,
                                       "op_timeout_ms = 500; connect_timeout_ms = 200; "
                                       "session_ttl_s = 6;",
                                       "lock = { lease_ms = 3000; }; "
                                       "retry = { max = 3; backoff_ms = 20; backoff_max_ms = 100; };");
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

/* ---- the contended lock ---- */

#define MAX_GRANTS 100000

struct run {
    const char *name;
    atomic_bool stop;
    atomic_int inside, overlap, fence_regress, errors;
    pthread_mutex_t mu;
    uint64_t last_fence;
    int64_t grants[MAX_GRANTS]; /* monotonic ms of each grant, in order */
    int n;
};

static void *contender(void *arg)
{
    struct run *r = arg;
    cerb_client *c = open_client();
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, r->name, NULL, &l) != CERB_OK) {
        atomic_fetch_add(&r->errors, 1);
        cerb_client_close(c);
        return NULL;
    }
    while (!atomic_load(&r->stop)) {
        if (cerb_lock_trylock_for(l, 10000) != CERB_OK) {
            atomic_fetch_add(&r->errors, 1);
            continue;
        }
        if (atomic_fetch_add(&r->inside, 1) != 0)
            atomic_fetch_add(&r->overlap, 1);
        uint64_t f = cerb_lock_fencing_token(l);
        int64_t now = cerb_test_now_ms();
        pthread_mutex_lock(&r->mu);
        if (f <= r->last_fence)
            atomic_fetch_add(&r->fence_regress, 1);
        r->last_fence = f;
        if (r->n < MAX_GRANTS)
            r->grants[r->n++] = now;
        pthread_mutex_unlock(&r->mu);
        /* A little work inside, not a sleep to synchronise anything. */
        while (cerb_test_now_ms() - now < 2) {
        }
        atomic_fetch_sub(&r->inside, 1);
        cerb_status st = cerb_lock_unlock(l);
        if (st != CERB_OK && st != CERB_LOST)
            atomic_fetch_add(&r->errors, 1); /* unlock during the election */
    }
    cerb_lock_free(l);
    cerb_client_close(c);
    return NULL;
}

struct grants_after {
    struct run *r;
    int64_t t;
    int n;
};

static bool enough_grants(void *ud)
{
    struct grants_after *g = ud;
    pthread_mutex_lock(&g->r->mu);
    int k = 0;
    for (int i = g->r->n - 1; i >= 0 && g->r->grants[i] > g->t; i--)
        k++;
    pthread_mutex_unlock(&g->r->mu);
    return k >= g->n;
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

static bool held_valid(void *ud) { return cerb_lock_state(ud) == CERB_LOCK_VALID; }

struct keys_gone {
    const char *name;
};
static bool no_keys(void *ud)
{
    struct keys_gone *k = ud;
    char p[512];
    struct etcd_test_kv kv[8];
    snprintf(p, sizeof p, "%s/", k->name);
    for (int i = 0; i < NODES; i++) {
        int n = etcd_test_keys(ports[i], p, kv, 8);
        if (n >= 0)
            return n == 0;
    }
    return false;
}

/* Polls the surviving members until they have a leader again. */
struct leader_watch {
    int alive[NODES];
    int n;
    atomic_llong at; /* monotonic ms when a leader was seen, 0 = not yet */
    atomic_bool stop;
};

static void *leader_poll(void *arg)
{
    struct leader_watch *lw = arg;
    while (!atomic_load(&lw->stop)) {
        if (etcd_test_leader(lw->alive, (size_t)lw->n) >= 0) {
            atomic_store(&lw->at, cerb_test_now_ms());
            break;
        }
    }
    return NULL;
}

static void test_leader_killed(void **state)
{
    (void)state;
    static struct run r; /* large: grants[] */
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    char *name = test_name("cluster");
    char *held_name = test_name("held");
    r.name = name;

    /* A lock held across the election. */
    cerb_client *hc = open_client();
    cerb_lock *held = NULL;
    assert_int_equal(cerb_lock_new(hc, held_name, NULL, &held), CERB_OK);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(held, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(held), CERB_OK);

    pthread_t t[CONTENDERS];
    for (int i = 0; i < CONTENDERS; i++)
        pthread_create(&t[i], NULL, contender, &r);
    struct grants_after warm = {&r, 0, 30};
    assert_wait_until(enough_grants, &warm, 20000);

    int leader = etcd_test_leader(ports, NODES);
    assert_true(leader >= 0);
    pid_t lpid = etcd_test_pid(ports[leader]);
    assert_true(lpid > 0);
    struct leader_watch lw = {.n = 0};
    for (int i = 0; i < NODES; i++)
        if (i != leader)
            lw.alive[lw.n++] = ports[i];
    pthread_t lt;
    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(kill(lpid, SIGKILL), 0);
    pthread_create(&lt, NULL, leader_poll, &lw);
    struct grants_after after = {&r, t_kill, 30};
    bool recovered = wait_until(enough_grants, &after, 20000);
    atomic_store(&lw.stop, true);
    pthread_join(lt, NULL);
    atomic_store(&r.stop, true);
    for (int i = 0; i < CONTENDERS; i++)
        pthread_join(t[i], NULL);

    /* The longest stretch without a grant, around the kill. */
    int64_t first_after = 0, worst_gap = 0;
    for (int i = 1; i < r.n; i++) {
        if (r.grants[i] > t_kill && !first_after)
            first_after = r.grants[i];
        if (r.grants[i] >= t_kill - 2000) {
            int64_t gap = r.grants[i] - r.grants[i - 1];
            worst_gap = gap > worst_gap ? gap : worst_gap;
        }
    }
    int64_t elected = atomic_load(&lw.at) ? atomic_load(&lw.at) - t_kill : -1;
    print_message("leader :%d killed: new leader after %lld ms; first grant %lld ms after the "
                  "kill, longest gap %lld ms; %d grants, %d errors\n",
                  ports[leader], (long long)elected, (long long)(first_after - t_kill),
                  (long long)worst_gap, r.n, atomic_load(&r.errors));
    assert_true(recovered);
    assert_int_equal(atomic_load(&r.overlap), 0);
    assert_int_equal(atomic_load(&r.fence_regress), 0);
    /* A new leader takes ~1 s (more when a vote splits); the clients must
     * follow soon after: within ~1.5 s of the kill when the election is
     * quick, and never much later than the election itself. */
    assert_true(first_after > 0);
    assert_true(elected > 0);
    assert_true(worst_gap <= (elected > 1000 ? elected : 1000) + 1000);

    /* The held lock came through the election (SUSPECT while keepalives
     * failed, VALID again once one got through). */
    assert_wait_until(held_valid, held, 5000);
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_int_equal(cerb_lock_unlock(held), CERB_OK);
    cerb_lock_free(held);
    cerb_client_close(hc);

    /* Nothing left behind (orphaned deletes included). */
    struct keys_gone kg = {name};
    assert_wait_until(no_keys, &kg, 10000);
    struct keys_gone kh = {held_name};
    assert_wait_until(no_keys, &kh, 10000);

    /* The killed member comes back on its data. */
    assert_int_equal(etcd_test_servers("start", BASE, NODES), 0);
    free(name);
    free(held_name);
    pthread_mutex_destroy(&r.mu);
}

/*
 * A request that a paused member held while the client moved on, applied
 * when the member resumes (found by the chaos suite, etcd3 seed 7: 11
 * unsafe overlaps right after a SIGCONT). The holder's unlock goes to a
 * follower that is paused: it times out and is re-sent to the next member,
 * which deletes the key; the client locks the name again — the same key
 * (it names the session and the lock), a new create revision. When the
 * paused member resumes, it forwards the old delete to the leader. A delete
 * that does not compare the create revision takes the new hold's key, and
 * another client is granted the name while the first still holds it.
 */
static bool member_serves(void *ud)
{
    const int *port = ud;
    struct etcd_test_kv kv[1];
    return etcd_test_keys(*port, "/cerb-no-such-prefix/", kv, 1) >= 0;
}

static void test_stale_delete_from_paused_member(void **state)
{
    (void)state;
    int leader = etcd_test_leader(ports, NODES);
    assert_true(leader >= 0);
    int f = (leader + 1) % NODES, other = (leader + 2) % NODES;
    /* The holder talks to follower f first; the others to the leader. */
    int order_a[NODES] = {ports[f], ports[other], ports[leader]};
    int order_b[NODES] = {ports[leader], ports[other], ports[f]};
    const char *ex = "op_timeout_ms = 500; connect_timeout_ms = 200; session_ttl_s = 6;";
    const char *lk = "lock = { lease_ms = 3000; }; retry = { max = 3; backoff_ms = 20; "
                     "backoff_max_ms = 100; };";
    char *ca = etcd_test_config_ports(order_a, NODES, ex, lk);
    char *cb = etcd_test_config_ports(order_b, NODES, ex, lk);
    cerb_client *a = NULL, *b = NULL;
    assert_int_equal(cerb_client_open_string(&a, ca), CERB_OK);
    assert_int_equal(cerb_client_open_string(&b, cb), CERB_OK);
    free(ca);
    free(cb);
    char *name = test_name("staledel");
    cerb_lock *la = NULL, *lb = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);

    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    assert_int_equal(etcd_test_pause(ports[f]), 0);
    cerb_status st = cerb_lock_unlock(la); /* to f: no answer; re-sent to the next */
    print_message("unlock while :%d is paused: %s\n", ports[f], cerb_status_name(st));
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK); /* same key, again */
    assert_int_equal(etcd_test_resume(ports[f]), 0);
    int fport = ports[f];
    assert_wait_until(member_serves, &fport, 10000);
    /* The resumed member works through what it held within moments: give
     * a stale delete up to 3 s to land (the wait ends at once if it does;
     * without one it runs out, which is the good case). */
    struct keys_gone kg = {name};
    bool gone = wait_until(no_keys, &kg, 3000);
    print_message("A's key %s after the member resumed\n", gone ? "GONE" : "still there");
    cerb_status sb = cerb_lock_trylock(lb);
    print_message("while A holds: B's trylock %s; A's state %d\n", cerb_status_name(sb),
                  (int)cerb_lock_state(la));
    assert_false(gone);
    assert_int_equal(sb, CERB_BUSY);
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

/*
 * The same with the release of a hold whose acquire never learnt its key's
 * create revision: its answer was lost, and the core releases such a hold
 * in the background in case it landed. That delete must compare a create
 * revision too: held by a paused member and applied when it resumes, an
 * unconditional one took the key of the client's next hold of the name
 * (chaos etcd3 seeds 527909 and 527910: three and more unsafe overlaps
 * right after a paused leader resumed). Below the lock API, through the
 * engine table, to make that stale hold.
 */
/* One round: the stale hold's release while follower f is paused, the
 * next hold of the name, f resumed. True when the next hold's key is gone
 * after that (and released otherwise). */
static bool stale_release_round(const struct cerb_engine_ops *ops, cerb_engine *e, int f,
                                int other)
{
    struct etcd_session s;
    cerb__etcd_session_peek(e, &s);
    char *name = test_name("stalerel"), key[512];
    snprintf(key, sizeof key, "%s/%llx", name, (unsigned long long)s.id);
    struct etcd_lock_priv ps, pc;
    memset(&ps, 0, sizeof ps);
    memset(&pc, 0, sizeof pc);
    cerb_engine_lock stale = {.name = name, .lease_ms = 3000, .fair = 1, .priv = &ps};
    cerb_engine_lock cur = stale;
    cur.priv = &pc;
    snprintf(stale.token, sizeof stale.token, "%032x", 1);
    snprintf(cur.token, sizeof cur.token, "%032x", 2);
    /* The stale hold: its txn put the key, the answer never came. */
    ps.lease = s.id;
    ps.gen = s.gen;
    assert_int_equal(etcd_test_put_value(ports[other], key, "0", s.id), 0);

    assert_int_equal(etcd_test_pause(ports[f]), 0);
    cerb_status st = cerb__engine_release(ops, e, &stale); /* to f, then the next */
    print_message("stale release while :%d is paused: %s\n", ports[f], cerb_status_name(st));
    cerb_grant g;
    st = cerb__engine_acquire(ops, e, &cur, cerb__deadline_in(5000), NULL, &g);
    if (st != CERB_OK)
        fail_msg("the next hold: %s: %s", cerb_status_name(st), cerb_last_error());
    assert_int_equal(etcd_test_resume(ports[f]), 0);
    int fport = ports[f];
    assert_wait_until(member_serves, &fport, 10000);
    /* As above: up to 3 s for a stale delete to land. */
    struct keys_gone kg = {name};
    bool gone = wait_until(no_keys, &kg, 3000);
    print_message("the next hold's key %s after the member resumed\n",
                  gone ? "GONE" : "still there");
    cerb_status rs = cerb__engine_release(ops, e, &cur);
    if (!gone)
        assert_int_equal(rs, CERB_OK);
    free(name);
    return gone;
}

static void test_stale_release_from_paused_member(void **state)
{
    (void)state;
    int leader = etcd_test_leader(ports, NODES);
    assert_true(leader >= 0);
    int f = (leader + 1) % NODES, other = (leader + 2) % NODES;
    int order[NODES] = {ports[f], ports[other], ports[leader]};
    char *text = etcd_test_config_ports(order, NODES,
                                        "op_timeout_ms = 500; connect_timeout_ms = 200; "
                                        "session_ttl_s = 6;",
                                        NULL);
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_from_string(text, &cfg), CERB_OK);
    free(text);
    cerb__engines_builtin();
    const struct cerb_engine_ops *ops = cerb__engine_find("etcd");
    assert_non_null(ops);
    cerb_engine_env env = {.cfg = cfg};
    cerb_engine *e = NULL;
    assert_int_equal(cerb__engine_open(ops, &env, &e), CERB_OK);
    /* Whether the resumed member applies what it held is a race inside
     * etcd (about 1 round in 10 on the old code): a few rounds. */
    int gone = 0;
    for (int i = 0; i < 3; i++) {
        /* The engine moved to `other` when f timed out: back to f. */
        cerb__engine_close(ops, e);
        assert_int_equal(cerb__engine_open(ops, &env, &e), CERB_OK);
        gone += stale_release_round(ops, e, f, other);
    }
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
    assert_int_equal(gone, 0);
}

static int setup(void **state)
{
    (void)state;
    return etcd_test_servers("start", BASE, NODES) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    etcd_test_servers("stop", BASE, NODES);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_delete_from_paused_member),
        cmocka_unit_test(test_stale_release_from_paused_member),
        cmocka_unit_test(test_leader_killed),
    };
    if (getenv("CERB_TEST_DEBUG"))
        cerb_log_set(NULL, NULL, CERB_LOG_DEBUG);
    return cmocka_run_group_tests(tests, setup, teardown);
}
