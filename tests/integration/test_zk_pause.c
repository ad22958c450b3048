/*
 * test_zk_pause.c — what a holder is told when its ZooKeeper stops
 * answering. The server is this suite's own (fixture zk_excl: the name
 * contains "_pause"), paused with SIGSTOP and resumed with SIGCONT.
 *  - A pause shorter than the session timeout: the holder sees SUSPECT
 *    while disconnected and VALID again after the reconnect; the session and
 *    its lock node survive, nobody else got the lock, the lost callback
 *    never ran.
 *  - A pause past the session timeout: the holder is told LOST (state and
 *    callback, exactly once) while the server is still stopped; after it
 *    resumes, another client gets the lock, and the first client works
 *    again on a new session.
 *  - A lease longer than the session: LOST when the session can have ended,
 *    not when the lease would.
 *  - trylock_for(600) on a stopped server returns after ~600 ms, and the
 *    node its unanswered create may have made does not stay behind.
 */
#define _POSIX_C_SOURCE 200809L
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
#include "zk_util.h"

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

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

struct state_is {
    cerb_lock *l;
    enum cerb_lock_state want;
};
static bool state_is(void *ud)
{
    struct state_is *s = ud;
    return cerb_lock_state(s->l) == s->want;
}

static int resume(void **state)
{
    (void)state;
    cerb_test_zk_resume(cerb_test_zk_port()); /* a failed test must not leave it stopped */
    return 0;
}

static void test_short_outage_suspect_then_valid(void **state)
{
    (void)state;
    /* 6 s sessions: the client drops the connection after 4 s of silence;
     * the engine would give the session up only ~5 s after its last
     * answered heartbeat (at most 1 s before the pause). */
    cerb_client *c1 = open_client("session_timeout_ms = 6000;");
    char *name = test_name("pause-short");
    cerb_lock *a = NULL;
    assert_int_equal(cerb_lock_new(c1, name, NULL, &a), CERB_OK);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    uint64_t fence = cerb_lock_fencing_token(a);

    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    struct state_is suspect = {a, CERB_LOCK_SUSPECT}, valid = {a, CERB_LOCK_VALID};
    assert_wait_until(state_is, &suspect, 4500);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);
    assert_true(took >= 1500); /* not before the client could tell */
    assert_wait_until(state_is, &valid, 5000);
    assert_int_equal(atomic_load(&lost_calls), 0);

    /* Still ours: nobody else gets it, the fence is the same. */
    cerb_client *c2 = open_client(NULL);
    cerb_lock *b = NULL;
    assert_int_equal(cerb_lock_new(c2, name, NULL, &b), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    assert_int_equal(cerb_lock_fencing_token(a), fence);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_true(cerb_lock_fencing_token(b) > fence);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    assert_int_equal(atomic_load(&lost_calls), 0);

    cerb_lock_free(a);
    cerb_lock_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

static void test_lost_past_session_timeout(void **state)
{
    (void)state;
    cerb_client *c1 = open_client("session_timeout_ms = 2000; connect_timeout_ms = 1000;");
    char *name = test_name("pause-lost");
    cerb_lock *a = NULL;
    assert_int_equal(cerb_lock_new(c1, name, NULL, &a), CERB_OK);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    uint64_t fence = cerb_lock_fencing_token(a);

    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    struct state_is lost = {a, CERB_LOCK_LOST};
    /* Told while the server is still stopped: within the session timeout
     * (measured from the last answered request, before the pause) plus
     * the watchdog's reaction. */
    assert_wait_until(state_is, &lost, 4000);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took < 3000);
    int64_t settle = cerb_test_now_ms() + 300;
    while (cerb_test_now_ms() < settle)
        assert_int_equal(cerb_lock_state(a), CERB_LOCK_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);

    /* Once the server has expired the old session, someone else gets it. */
    cerb_client *c2 = open_client(NULL);
    cerb_lock *b = NULL;
    assert_int_equal(cerb_lock_new(c2, name, NULL, &b), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(b, 10000), CERB_OK);
    uint64_t fb = cerb_lock_fencing_token(b);
    assert_true(fb > fence);
    assert_int_equal(cerb_lock_unlock(a), CERB_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);

    /* The first client carries on with a new session. */
    assert_int_equal(cerb_lock_trylock_for(a, 10000), CERB_OK);
    assert_true(cerb_lock_fencing_token(a) > fb);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(atomic_load(&lost_calls), 1);

    cerb_lock_free(a);
    cerb_lock_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

/* ---- lease longer than the session (issue 10 item 14) ---- */

/*
 * The server drops a silent session's nodes the negotiated timeout after it
 * last heard from the holder, whatever lease the lock asked for: with a
 * 20 s lease on a 2 s session, the holder must count as LOST no later than
 * 2 s after its last contact (at the latest the pause), not ~20 s after.
 */
static void test_long_lease_lost_with_session(void **state)
{
    (void)state;
    cerb_client *c1 = open_client("session_timeout_ms = 2000; connect_timeout_ms = 1000;");
    char *name = test_name("pause-lease");
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 20000;
    cerb_lock *a = NULL;
    assert_int_equal(cerb_lock_new(c1, name, &o, &a), CERB_OK);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);

    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    struct state_is lost = {a, CERB_LOCK_LOST};
    assert_wait_until(state_is, &lost, 6000);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);
    /* 2 s after the last contact at the latest, plus the polling step. */
    if (took > 2100)
        fail_msg("LOST %lld ms after the pause; the session timeout is 2000 ms",
                 (long long)took);
    assert_int_equal(cerb_lock_unlock(a), CERB_LOST);

    cerb_lock_free(a);
    cerb_client_close(c1);
    free(name);
}

/* ---- calls return by their deadline (issue 10 item 18) ---- */

struct no_nodes {
    zhandle_t *zh;
    const char *path;
};
static bool no_nodes(void *ud)
{
    struct no_nodes *n = ud;
    int rc = 0;
    int k = cerb_test_zk_children(n->zh, n->path, NULL, &rc);
    return k == 0 || (k < 0 && rc == ZNONODE);
}

/*
 * A create sent to a stopped server gets no answer until the client gives
 * the connection up (2/3 of the session timeout): trylock_for(600) must
 * still return after about 600 ms, with the create's outcome unknown — and
 * once the server runs again, the node it may have made must not stay
 * behind (the core re-checks or releases it in the background; the engine
 * deletes it by its uuid).
 */
static void test_trylock_for_on_time_while_paused(void **state)
{
    (void)state;
    cerb_client *c1 = open_client("session_timeout_ms = 6000;");
    char *name = test_name("pause-try");
    cerb_lock *a = NULL;
    assert_int_equal(cerb_lock_new(c1, name, NULL, &a), CERB_OK);
    /* The parents exist: the create is the only request of the attempt. */
    assert_int_equal(cerb_lock_trylock(a), CERB_OK);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);

    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock_for(a, 600);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_not_equal(st, CERB_OK);
    if (took > 1000)
        fail_msg("trylock_for(600) returned %s after %lld ms", cerb_status_name(st),
                 (long long)took);
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);

    /* Nothing of ours stays: the lock is free for another client. */
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *path = cerb_test_zk_lock_path(name);
    struct no_nodes nn = {zh, path};
    assert_wait_until(no_nodes, &nn, 15000);
    cerb_client *c2 = open_client(NULL);
    cerb_lock *b = NULL;
    assert_int_equal(cerb_lock_new(c2, name, NULL, &b), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    /* And the first client works again. */
    assert_int_equal(cerb_lock_trylock_for(a, 10000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_true(no_nodes(&nn));

    free(path);
    cerb_test_zk_close(zh);
    cerb_lock_free(a);
    cerb_lock_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

/*
 * The same below the lock API, for calls without a deadline: a trylock
 * (deadline 0) and check_owner return within the connect timeout, the
 * trylock with its outcome UNKNOWN (its create was sent); after the resume
 * check_owner settles it (adopts the node or says it is not there) and
 * nothing is left behind.
 */
static void test_engine_calls_bounded_while_paused(void **state)
{
    (void)state;
    cerb__engines_builtin();
    const struct cerb_engine_ops *ops = cerb__engine_find("zk");
    assert_non_null(ops);
    char *text = cerb_test_zk_config(NULL, "session_timeout_ms = 6000; connect_timeout_ms = 800;",
                                     NULL);
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_from_string(text, &cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = cfg};
    cerb_engine *e = NULL;
    assert_int_equal(cerb__engine_open(ops, &env, &e), CERB_OK);
    char *name = test_name("pause-eng");
    void *priv = calloc(1, ops->lock_priv_size);
    cerb_engine_lock lk = {.name = name, .lease_ms = 10000, .fair = 1, .priv = priv};
    snprintf(lk.token, sizeof lk.token, "%032x", 0xfeed);
    cerb_grant gr, gc;
    /* Parents made: the attempt below is one create (+ listing). */
    assert_int_equal(cerb__engine_acquire(ops, e, &lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, e, &lk), CERB_OK);
    memset(priv, 0, ops->lock_priv_size);

    assert_int_equal(cerb_test_zk_pause(cerb_test_zk_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb__engine_acquire(ops, e, &lk, 0, NULL, &gr);
    int64_t took = cerb_test_now_ms() - t0;
    if (st == CERB_OK || took > 1100)
        fail_msg("trylock on a stopped server: %s after %lld ms (connect timeout 800 ms)",
                 cerb_status_name(st), (long long)took);
    assert_int_equal(gr.outcome, CERB_OUTCOME_UNKNOWN);
    t0 = cerb_test_now_ms();
    st = cerb__engine_check_owner(ops, e, &lk, &gc);
    took = cerb_test_now_ms() - t0;
    if (st == CERB_OK || st == CERB_NOT_OWNER || took > 1100)
        fail_msg("check_owner on a stopped server: %s after %lld ms (connect timeout 800 ms)",
                 cerb_status_name(st), (long long)took);
    assert_int_equal(cerb_test_zk_resume(cerb_test_zk_port()), 0);

    /* Settled once the server answers: adopted (then released) or absent. */
    st = CERB_EIO;
    for (int i = 0; i < 20 && st != CERB_OK && st != CERB_NOT_OWNER; i++)
        st = cerb__engine_check_owner(ops, e, &lk, &gc);
    if (st == CERB_OK)
        assert_int_equal(cerb__engine_release(ops, e, &lk), CERB_OK);
    else
        assert_int_equal(st, CERB_NOT_OWNER);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    char *path = cerb_test_zk_lock_path(name);
    struct no_nodes nn = {zh, path};
    assert_wait_until(no_nodes, &nn, 10000);

    free(path);
    cerb_test_zk_close(zh);
    free(priv);
    free(name);
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
}

int main(void)
{
    cerb_test_debug_aids(); /* CERB_TEST_FILTER, CERB_TEST_DEBUG */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_short_outage_suspect_then_valid, resume),
        cmocka_unit_test_teardown(test_lost_past_session_timeout, resume),
        cmocka_unit_test_teardown(test_long_lease_lost_with_session, resume),
        cmocka_unit_test_teardown(test_trylock_for_on_time_while_paused, resume),
        cmocka_unit_test_teardown(test_engine_calls_bounded_while_paused, resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
