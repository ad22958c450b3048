/*
 * test_etcd_pause.c — the etcd engine when its server stops answering, on
 * the exclusive test server (fixture etcd_excl, $CERB_ETCD_PORT), which this
 * suite SIGSTOPs and SIGCONTs:
 *  - a pause shorter than the session TTL: holds go SUSPECT, then VALID;
 *  - a pause longer than the TTL: holds are LOST (callback once), others
 *    get the lock after the resume, the client carries on with a new session;
 *  - an acquire whose request timed out while the server was stopped (and
 *    which the server then ran): re-sent until definite, one key, granted;
 *  - an unlock that could not be confirmed: the key is handed to the
 *    session thread, which deletes it when the server is back, and a
 *    waiter gets the lock;
 *  - calls on a stopped server fail with clear errors within the timeouts.
 * And authentication, on a private server this suite starts with auth
 * enabled (port 22431, stopped by PID): missing and wrong credentials,
 * locking with a token, and a token the server no longer knows (401, or a
 * watch cancelled in-band as "Unauthenticated") being fetched again by lock
 * calls, by a waiter after its wake-up, and by a watch.
 * And on a private server with a slow raft clock (port 22441), whose minimum
 * lease TTL is above what the client asks: the engine's hold bound is the
 * TTL the server granted.
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

#define AUTH_PORT 22431
/* A private single-node server with a slow raft clock (see slow_setup). */
#define SLOW_PORT 22441

static const struct cerb_engine_ops *ops;

/* Short timeouts so that failures show quickly. */
#define FAST "connect_timeout_ms = 200; op_timeout_ms = 300;"

static cerb_client *open_client(const char *etcd_extra, const char *extra)
{
    char *cfg = etcd_test_config(etcd_extra, extra);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, name, NULL, &l) != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

static int nkeys(int port, const char *name, struct etcd_test_kv *kv, int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s/", name);
    return etcd_test_keys(port, p, kv, max);
}

/* ---- engine-level helpers ---- */

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

static cerb_status eng_try_open(struct eng *g, int port, const char *etcd_extra)
{
    int ports[1] = {port};
    char *text = etcd_test_config_ports(ports, 1, etcd_extra, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg};
    cerb_status st = cerb__engine_open(ops, &env, &g->e);
    if (st != CERB_OK) {
        cerb__config_free(g->cfg);
        g->cfg = NULL;
    }
    return st;
}

static void eng_open(struct eng *g, int port, const char *etcd_extra)
{
    if (eng_try_open(g, port, etcd_extra) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

struct hold {
    cerb_engine_lock lk;
    struct etcd_lock_priv priv;
};

static void hold_init(struct hold *h, const char *name)
{
    memset(h, 0, sizeof *h);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", 7);
    h->lk.lease_ms = 10000;
    h->lk.priv = &h->priv;
}

struct waiter {
    struct eng *g;
    struct hold h;
    int64_t deadline;
    cerb_status st;
    cerb_grant gr;
    int64_t done_at;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb__engine_acquire(ops, w->g->e, &w->h.lk, w->deadline, NULL, &w->gr);
    w->done_at = cerb_test_now_ms();
    atomic_store(&w->done, true);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

struct count_at_least {
    atomic_uint_fast64_t *c;
    uint64_t n;
};
static bool count_reached(void *ud)
{
    struct count_at_least *q = ud;
    return atomic_load(q->c) >= q->n;
}

/* ---- SUSPECT and back ---- */

struct state_is {
    cerb_lock *l;
    enum cerb_lock_state want;
};
static bool state_is(void *ud)
{
    struct state_is *s = ud;
    return cerb_lock_state(s->l) == s->want;
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_seen(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_suspect_then_valid(void **state)
{
    (void)state;
    /* TTL 4 s: a keepalive every 1.3 s. lease_ms below the TTL, so the
     * core asks the engine often (renew costs no round trip). */
    cerb_client *c = open_client("session_ttl_s = 4; " FAST, "lock = { lease_ms = 1500; };");
    char *name = test_name("suspect");
    cerb_lock *l = mk(c, name);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(l, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    struct state_is sus = {l, CERB_LOCK_SUSPECT};
    bool seen = wait_until(state_is, &sus, 2500);
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_true(seen);
    struct state_is ok = {l, CERB_LOCK_VALID};
    assert_wait_until(state_is, &ok, 3000);
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- LOST after the TTL ---- */

static void test_lost_after_ttl(void **state)
{
    (void)state;
    cerb_client *a = open_client("session_ttl_s = 2; " FAST, "lock = { lease_ms = 1000; };");
    cerb_client *b = open_client(NULL, NULL);
    char *name = test_name("ttl");
    cerb_lock *la = mk(a, name), *lb = mk(b, name);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(la, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    bool lost = wait_until(lost_seen, NULL, 5000);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_true(lost);
    assert_true(took >= 1000 && took < 3500);
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_LOST);
    /* The old lease is gone (expired on the server, or revoked by the
     * client once the server answered): b gets the lock. */
    assert_int_equal(cerb_lock_trylock_for(lb, 8000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(la), CERB_LOST);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    /* a carries on with a new session. */
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    assert_int_equal(atomic_load(&lost_calls), 1);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- an acquire that timed out, and ran later ---- */

static void test_ambiguous_acquire(void **state)
{
    (void)state;
    struct eng g;
    struct etcd_test_kv kv[4];
    char *name = test_name("ambig");
    pthread_t t;

    eng_open(&g, etcd_test_port(), FAST);
    struct waiter w = {.g = &g, .deadline = cerb__deadline_in(10000)};
    hold_init(&w.h, name);
    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    uint64_t req0 = atomic_load(&g.e->stats.requests);
    pthread_create(&t, NULL, waiter_main, &w);
    /* Wait for a re-send: the first attempt has timed out unanswered, and
     * the stopped server holds it in its socket to run it on resume. */
    struct count_at_least q = {&g.e->stats.requests, req0 + 2};
    bool resent = wait_until(count_reached, &q, 3000);
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_true(resent);
    assert_wait_until(waiter_done, &w, 5000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    /* Both copies ran: one key, and the grant is that key. */
    assert_int_equal(nkeys(etcd_test_port(), name, kv, 4), 1);
    assert_int_equal(w.gr.fence, (uint64_t)(kv[0].create_revision +
                                            etcd_test_fence_offset(etcd_test_port(), "")));
    assert_int_equal(cerb__engine_release(ops, g.e, &w.h.lk), CERB_OK);
    assert_int_equal(nkeys(etcd_test_port(), name, kv, 4), 0);
    eng_close(&g);
    free(name);
}

/* ---- an unlock that could not be confirmed ---- */

static void test_unlock_orphan(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha;
    cerb_grant gr;
    struct etcd_test_kv kv[4];
    char *name = test_name("orphan");
    pthread_t t;

    eng_open(&a, etcd_test_port(), FAST);
    eng_open(&b, etcd_test_port(), FAST);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    struct waiter w = {.g = &b, .deadline = cerb__deadline_in(20000)};
    hold_init(&w.h, name);
    pthread_create(&t, NULL, waiter_main, &w);
    struct count_at_least qw = {&b.e->stats.watches, 1};
    assert_wait_until(count_reached, &qw, 3000);

    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb__engine_release(ops, a.e, &ha.lk);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_int_equal(st, CERB_EIO);
    assert_true(took < 1500); /* two operation timeouts, then hand over */
    assert_int_equal(atomic_load(&a.e->stats.orphans), 1);
    /* The session thread deletes the key; the waiter gets the lock. */
    assert_wait_until(waiter_done, &w, 8000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_int_equal(nkeys(etcd_test_port(), name, kv, 4), 1);
    assert_int_equal(kv[0].lease, b.e->sess.id);
    assert_int_equal(cerb__engine_release(ops, b.e, &w.h.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    free(name);
}

/* ---- errors within the timeouts ---- */

static void test_stopped_server_errors(void **state)
{
    (void)state;
    cerb_client *c = open_client(FAST, "retry = { max = 1; backoff_ms = 10; };");
    char *name = test_name("stopped");
    cerb_lock *l = mk(c, name);
    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock(l);
    int64_t took = cerb_test_now_ms() - t0;
    char why[512];
    snprintf(why, sizeof why, "%s", cerb_last_error());
    t0 = cerb_test_now_ms();
    cerb_status st2 = cerb_lock_trylock_for(l, 500);
    int64_t took2 = cerb_test_now_ms() - t0;
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_true(st == CERB_EIO || st == CERB_UNAVAILABLE);
    assert_non_null(strstr(why, "etcd http://127.0.0.1:"));
    assert_true(took < 4000);
    assert_true(st2 != CERB_OK);
    assert_true(took2 < 4000);
    /* Back to normal, nothing left behind. */
    assert_int_equal(cerb_lock_trylock_for(l, 3000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    struct etcd_test_kv kv[2];
    assert_int_equal(nkeys(etcd_test_port(), name, kv, 2), 0);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- authentication (private server) ---- */

static int ctl(const char *const *args)
{
    pid_t pid = etcd_test_etcdctl(AUTH_PORT, args);
    return pid > 0 ? cerb_test_wait(pid, 15000) : -1;
}

static int auth_setup(void **state)
{
    (void)state;
    int rc = etcd_test_servers("start", AUTH_PORT, 1);
    if (rc != 0)
        return -1;
    const char *const steps[][8] = {
        {"user", "add", "root:rootpw", NULL},
        {"user", "add", "alice:alicepw", NULL},
        {"role", "add", "locker", NULL},
        {"role", "grant-permission", "locker", "--prefix=true", "readwrite", "", NULL},
        {"user", "grant-role", "alice", "locker", NULL},
        {"auth", "enable", NULL},
    };
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        if (ctl(steps[i]) != 0)
            return -1;
    return 0;
}

static int auth_teardown(void **state)
{
    (void)state;
    etcd_test_servers("stop", AUTH_PORT, 1);
    return 0;
}

static void test_auth_credentials(void **state)
{
    (void)state;
    struct eng g;
    assert_int_equal(eng_try_open(&g, AUTH_PORT, FAST), CERB_EIO);
    assert_non_null(strstr(cerb_last_error(), "etcd.user"));
    assert_int_equal(eng_try_open(&g, AUTH_PORT, "user = \"alice\"; password = \"nope\"; " FAST),
                     CERB_EIO);
    assert_non_null(strstr(cerb_last_error(), "authentication failed"));

    /* Through the public API, with a token. */
    char *cfg = NULL;
    int ports[1] = {AUTH_PORT};
    cfg = etcd_test_config_ports(ports, 1, "user = \"alice\"; password = \"alicepw\";", NULL);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    free(cfg);
    char *name = test_name("auth");
    cerb_lock *l = mk(c, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(l, 0), CERB_OK); /* reentrant */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/*
 * Make the server forget alice's tokens: deleting a user drops its tokens,
 * and adding it back with the same password and role lets a client that
 * authenticates again carry on. Deterministic, unlike waiting out
 * --auth-token-ttl (every use of a token renews it).
 */
static void forget_tokens(void)
{
    const char *const steps[][8] = {
        {"--user=root:rootpw", "user", "delete", "alice", NULL},
        {"--user=root:rootpw", "user", "add", "alice:alicepw", NULL},
        {"--user=root:rootpw", "user", "grant-role", "alice", "locker", NULL},
    };
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        assert_int_equal(ctl(steps[i]), 0);
}

static void test_auth_token_refresh(void **state)
{
    (void)state;
    struct eng a, b;
    struct hold ha, hb;
    cerb_grant gr;
    char *name = test_name("token");
    const char *creds = "user = \"alice\"; password = \"alicepw\"; " FAST;
    pthread_t t;

    eng_open(&a, AUTH_PORT, creds);
    eng_open(&b, AUTH_PORT, creds);
    assert_int_equal(atomic_load(&a.e->stats.reauths), 1);
    hold_init(&ha, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &ha.lk, 0, NULL, &gr), CERB_OK);
    struct waiter w = {.g = &b, .deadline = cerb__deadline_in(30000)};
    hold_init(&w.h, name);
    pthread_create(&t, NULL, waiter_main, &w);
    struct count_at_least qw = {&b.e->stats.watches, 1};
    assert_wait_until(count_reached, &qw, 3000);
    forget_tokens();
    /* The release meets a 401, fetches a token and goes on; the waiter's
     * watch fires, and its read after the wake-up does the same. */
    cerb_status st = cerb__engine_release(ops, a.e, &ha.lk);
    if (st != CERB_OK)
        fail_msg("release after the token was dropped: %s", cerb_last_error());
    assert_int_equal(atomic_load(&a.e->stats.reauths), 2);
    assert_wait_until(waiter_done, &w, 5000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_int_equal(atomic_load(&b.e->stats.reauths), 2);

    /* A watch created with a token the server no longer knows is
     * cancelled in-band ("Unauthenticated"): the engine fetches a token
     * and tells the waiter to read again. */
    forget_tokens();
    char key[600];
    snprintf(key, sizeof key, "%s/%llx", name, (unsigned long long)b.e->sess.id);
    enum etcd_watch_end end;
    struct hold hw;
    hold_init(&hw, name);
    assert_int_equal(cerb__etcd_watch_delete(b.e, &hw.lk, key, strlen(key), 1, 1,
                                             cerb__deadline_in(3000), NULL, b.e->sess.gen, &end),
                     CERB_OK);
    assert_int_equal(end, ETCD_WATCH_RESTART);
    assert_int_equal(atomic_load(&b.e->stats.reauths), 3);
    assert_int_equal(cerb__engine_release(ops, b.e, &w.h.lk), CERB_OK);

    /* Keepalives need no token; a fresh acquire after the token is gone. */
    forget_tokens();
    hold_init(&hb, name);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &hb.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(atomic_load(&a.e->stats.reauths), 3);
    assert_int_equal(cerb__engine_release(ops, a.e, &hb.lk), CERB_OK);
    eng_close(&a);
    eng_close(&b);
    free(name);
}

static int setup(void **state)
{
    (void)state;
    cerb__engines_builtin();
    ops = cerb__engine_find("etcd");
    return ops ? 0 : -1;
}

/* ---- a server whose minimum lease TTL is above what we ask (private) ---- */

/*
 * etcd raises a lease TTL to its minimum, 3/2 of the election timeout
 * (rounded up to seconds): with a 500 ms heartbeat and a 5 s election
 * timeout, 8 s. A client asking for 2 s then holds its keys for 8 s after
 * its last keepalive.
 */
static int slow_setup(void **state)
{
    (void)state;
    setenv("CERB_ETCD_EXTRA_ARGS", "--heartbeat-interval=500 --election-timeout=5000", 1);
    int rc = etcd_test_servers("start", SLOW_PORT, 1);
    unsetenv("CERB_ETCD_EXTRA_ARGS");
    return rc == 0 ? 0 : -1;
}

static int slow_teardown(void **state)
{
    (void)state;
    etcd_test_servers("stop", SLOW_PORT, 1);
    return 0;
}

/* The TTL the server granted lease `id`, from /v3/lease/timetolive. */
static int64_t granted_ttl(int port, int64_t id)
{
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", (long long)id);
    json_t *r = etcd_test_post(port, "/v3/lease/timetolive", body, NULL, NULL);
    assert_non_null(r);
    json_t *g = json_object_get(r, "grantedTTL");
    int64_t ttl = json_is_string(g) ? strtoll(json_string_value(g), NULL, 10)
                  : json_is_integer(g) ? (int64_t)json_integer_value(g)
                                       : -1;
    json_decref(r);
    return ttl;
}

/* The hold bound is the TTL the server granted, not the one configured. */
static void test_hold_bound_granted_ttl(void **state)
{
    (void)state;
    struct eng g;
    assert_int_equal(cerb__engine_hold_bound_ms(ops, NULL), 0);
    eng_open(&g, SLOW_PORT, "session_ttl_s = 2;");
    struct etcd_session s;
    cerb__etcd_session_peek(g.e, &s);
    int64_t ttl = granted_ttl(SLOW_PORT, s.id);
    assert_true(ttl > 2);
    assert_int_equal(cerb__engine_hold_bound_ms(ops, g.e), ttl * 1000);
    eng_close(&g);
}

int main(void)
{
    const struct CMUnitTest pause_tests[] = {
        cmocka_unit_test(test_suspect_then_valid),
        cmocka_unit_test(test_lost_after_ttl),
        cmocka_unit_test(test_ambiguous_acquire),
        cmocka_unit_test(test_unlock_orphan),
        cmocka_unit_test(test_stopped_server_errors),
    };
    const struct CMUnitTest auth_tests[] = {
        cmocka_unit_test(test_auth_credentials),
        cmocka_unit_test(test_auth_token_refresh),
    };
    const struct CMUnitTest slow_tests[] = {
        cmocka_unit_test(test_hold_bound_granted_ttl),
    };
    int rc = 0;
    if (setup(NULL) != 0)
        return 1;
    cerb_test_debug_aids(); /* CERB_TEST_FILTER, CERB_TEST_DEBUG */
    rc |= cmocka_run_group_tests_name("pause", pause_tests, NULL, NULL);
    rc |= cmocka_run_group_tests_name("auth", auth_tests, auth_setup, auth_teardown);
    rc |= cmocka_run_group_tests_name("slow raft", slow_tests, slow_setup, slow_teardown);
    return rc;
}
