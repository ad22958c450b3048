/*
 * test_redis_sentinel.c — the redis engine under Sentinel (issue 13 item 2):
 * a master, two replicas and three sentinels that this suite starts itself
 * (scripts/servers.sh start sentinel: master on $CERB_SENTINEL_PORT, default
 * 26500, replicas +1 and +2, sentinels +10..+12) and stops by PID.
 *
 *  - discovery: a client configured with the sentinels only finds the
 *    master, locks and unlocks; a master name no sentinel knows is a clear
 *    error at open;
 *  - failover: with a lock held and fences recorded, the master is killed
 *    (kill -9); the sentinels promote a replica. The holder is kept (its key
 *    was replicated: renewed on the new master) or told LOST — never both
 *    silently: another client cannot take the held name while the holder is
 *    VALID. A new client is granted a fresh name within the failover time,
 *    the quarantine the new history imposes (one lease) and 2 s, and every
 *    fence after the failover ranks above every fence before it;
 *  - replica acknowledgement (item 4): with redis.min_replicas_ack = 2 a
 *    grant is reported once both replicas have it; with the replicas paused
 *    the grant is an error within the timeout, and no hold is left behind.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
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
#include "redis_stats.h"
#include "test_util.h"

#define LEASE_MS 3000

static int base_port(void) { return cerb_test_env_port("CERB_SENTINEL_PORT", 26500); }

static int servers(const char *cmd)
{
    return cerb_test_servers_run(cmd, "sentinel", base_port(), 90000);
}

static cerb_client *open_client_with(const char *master, const char *extra)
{
    int b = base_port();
    char text[1024];
    snprintf(text, sizeof text,
             "engines = (\"redis\");\n"
             "redis = { mode = \"sentinel\"; master_name = \"%s\";\n"
             "  sentinels = (\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\");\n"
             "  connect_timeout_ms = 300; op_timeout_ms = 300; %s };\n"
             "lock = { lease_ms = %d; renew = true; };\n"
             "retry = { max = 3; backoff_ms = 20; backoff_max_ms = 200; };\n",
             master, b + 10, b + 11, b + 12, extra, LEASE_MS);
    return cerb_test_open(text);
}

static cerb_client *open_client(const char *master) { return open_client_with(master, ""); }

/* The master's port as sentinel +10 names it, or -1. */
static int named_master(void)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", base_port() + 10, tv);
    int port = -1;
    if (c && !c->err) {
        redisSetTimeout(c, tv);
        redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name cerbmaster");
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
            port = atoi(r->element[1]->str);
        if (r)
            freeReplyObject(r);
    }
    if (c)
        redisFree(c);
    return port;
}

static bool master_moved(void *ud)
{
    int old = *(int *)ud, now = named_master();
    return now > 0 && now != old;
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

static bool settled(void *ud)
{
    enum cerb_lock_state s = cerb_lock_state(ud);
    return s == CERB_LOCK_VALID || s == CERB_LOCK_LOST;
}

static int setup(void **state)
{
    (void)state;
    return servers("start") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    servers("stop");
    return 0;
}

static void test_discovery_and_unknown_master(void **state)
{
    (void)state;
    cerb_client *c = open_client("cerbmaster");
    assert_non_null(c);
    char *name = test_name("sent");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    assert_true(cerb_lock_fencing_token(l) > 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);

    cerb_client *bad = open_client("no-such-master");
    if (bad) {
        /* Opened on no engine: the first call must say why. */
        cerb_lock *lb = cerb_test_handle(bad, "x");
        assert_int_not_equal(cerb_lock_trylock(lb), CERB_OK);
        cerb_lock_free(lb);
        cerb_client_close(bad);
    }
    print_message("unknown master: %s\n", cerb_last_error());
    assert_non_null(strstr(cerb_last_error(), "no-such-master"));
}

static long long raw_exists(int port, const char *key)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    long long n = -1;
    if (c && !c->err) {
        redisSetTimeout(c, tv);
        redisReply *r = redisCommand(c, "EXISTS %s", key);
        if (r && r->type == REDIS_REPLY_INTEGER)
            n = r->integer;
        if (r)
            freeReplyObject(r);
    }
    if (c)
        redisFree(c);
    return n;
}

static int pid_of(int port)
{
    char pidf[1024];
    snprintf(pidf, sizeof pidf, "%s/redis-%d.pid", cerb_test_state_dir(), port);
    FILE *f = fopen(pidf, "r");
    int pid = 0;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid;
}

static void test_replica_ack(void **state)
{
    (void)state;
    int m = named_master();
    assert_true(m > 0);
    int rep[2], k = 0;
    for (int i = 0; i < 3; i++)
        if (base_port() + i != m)
            rep[k++] = base_port() + i;
    cerb_client *c = open_client_with("cerbmaster", "min_replicas_ack = 2;");
    assert_non_null(c);
    char *name = test_name("ack");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    for (int i = 0; i < 2; i++)
        assert_int_equal(kill(pid_of(rep[i]), SIGSTOP), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock(l);
    int64_t took = cerb_test_now_ms() - t0;
    long long left = raw_exists(m, name);
    for (int i = 0; i < 2; i++)
        kill(pid_of(rep[i]), SIGCONT);
    print_message("replicas paused: trylock %s after %lld ms (%s); key left: %lld\n",
                  cerb_status_name(st), (long long)took, cerb_last_error(), left);
    assert_int_not_equal(st, CERB_OK);
    assert_int_equal(cerb_lock_hold_count(l), 0);
    assert_int_equal(left, 0);
    assert_true(took < 3000);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/*
 * Review D4: a grant whose answer was lost is settled by check_owner. With
 * replica acknowledgement that settled grant must be confirmed too, or a
 * stale master's unreplicated grant would count as held. The settle is
 * made here as the core makes it: an instance without acknowledgement
 * takes the key with a token (the "lost" acquire), an instance with
 * min_replicas_ack = 2 checks that token while both replicas are paused.
 */
static cerb_engine *engine_open(const char *extra, struct cerb_config **cfg)
{
    int b = base_port();
    char text[1024];
    snprintf(text, sizeof text,
             "engines = (\"redis\");\n"
             "redis = { mode = \"sentinel\"; master_name = \"cerbmaster\";\n"
             "  sentinels = (\"127.0.0.1:%d\");\n"
             "  connect_timeout_ms = 300; op_timeout_ms = 300; %s };\n",
             b + 10, extra);
    assert_int_equal(cerb__config_from_string(text, cfg), CERB_OK);
    cerb_engine_env env = {.cfg = *cfg};
    cerb_engine *e = NULL;
    cerb__engines_builtin();
    const struct cerb_engine_ops *ops = cerb__engine_find("redis");
    assert_non_null(ops);
    assert_int_equal(cerb__engine_open(ops, &env, &e), CERB_OK);
    return e;
}

static void test_settled_grant_needs_replicas(void **state)
{
    (void)state;
    const struct cerb_engine_ops *ops = cerb__engine_find("redis");
    struct cerb_config *c0 = NULL, *c2 = NULL;
    cerb_engine *e0 = engine_open("", &c0), *e2 = engine_open("min_replicas_ack = 2;", &c2);
    char *name = test_name("settle");
    cerb_engine_lock lk;
    memset(&lk, 0, sizeof lk);
    snprintf(lk.token, sizeof lk.token, "%s", "0123456789abcdef0123456789abcdef");
    lk.name = name;
    lk.lease_ms = LEASE_MS;
    lk.priv = ops->lock_priv_size ? calloc(1, ops->lock_priv_size) : NULL;
    static const atomic_int never = 0;
    cerb_grant g;
    int m = named_master();
    int rep[2], k = 0;
    for (int i = 0; i < 3; i++)
        if (base_port() + i != m)
            rep[k++] = base_port() + i;
    for (int i = 0; i < 2; i++)
        assert_int_equal(kill(pid_of(rep[i]), SIGSTOP), 0);
    cerb_status sa = cerb__engine_acquire(ops, e0, &lk, 0, &never, &g); /* the "lost" grant */
    cerb_status sc = cerb__engine_check_owner(ops, e2, &lk, &g);
    long long left = raw_exists(m, name);
    for (int i = 0; i < 2; i++)
        kill(pid_of(rep[i]), SIGCONT);
    print_message("replicas paused: acquire %s; the settling check %s (%s); key left %lld\n",
                  cerb_status_name(sa), cerb_status_name(sc), cerb_last_error(), left);
    assert_int_equal(sa, CERB_OK);
    assert_int_not_equal(sc, CERB_OK);
    assert_int_equal(left, 0);
    free(lk.priv);
    cerb__engine_close(ops, e0);
    cerb__engine_close(ops, e2);
    cerb__config_free(c0);
    cerb__config_free(c2);
    free(name);
}

static void test_master_killed(void **state)
{
    (void)state;
    char *held = test_name("held"), *fresh = test_name("fresh");
    cerb_client *a = open_client("cerbmaster"), *b = open_client("cerbmaster");
    assert_non_null(a);
    assert_non_null(b);
    cerb_lock *la = cerb_test_handle(a, held), *lb = cerb_test_handle(b, fresh);
    cerb_lock *lbh = cerb_test_handle(b, held);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(la, on_lost, NULL);
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(la);
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    uint64_t fb1 = cerb_lock_fencing_token(lb);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);

    int old = named_master();
    assert_true(old > 0);
    char pidf[1024];
    snprintf(pidf, sizeof pidf, "%s/redis-%d.pid", cerb_test_state_dir(), old);
    FILE *f = fopen(pidf, "r");
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_wait_until(master_moved, &old, 30000);
    int64_t t_moved = cerb_test_now_ms();
    int first_new = named_master();

    /* The fresh name: granted on the new master once its history's
     * quarantine is over. */
    cerb_status st = cerb_lock_trylock_for(lb, LEASE_MS + 10000);
    int64_t t_grant = cerb_test_now_ms();
    if (st != CERB_OK)
        fail_msg("fresh name after the failover: %s: %s", cerb_status_name(st), cerb_last_error());
    uint64_t fb2 = cerb_lock_fencing_token(lb);
    print_message("master :%d killed; sentinels named :%d after %lld ms; a fresh name granted "
                  "%lld ms after the kill; fences %llu then %llu\n",
                  old, named_master(), (long long)(t_moved - t_kill),
                  (long long)(t_grant - t_kill), (unsigned long long)fb1,
                  (unsigned long long)fb2);
    assert_true(fb2 > fb1);
    assert_true(fb2 > fa);
    assert_true(t_grant - t_moved <= LEASE_MS + 2000);
    cerb_status su = cerb_lock_unlock(lb);
    if (su == CERB_LOST && named_master() != first_new) {
        /* Seen once in CI on a loaded machine: the sentinels failed over
         * twice (:26501, then :26502 two seconds later), and the fresh
         * name's hold, granted around the second, was told LOST when the
         * history changed under it. That is the contract; the test's
         * question (fences, the holder) still stands. */
        print_message("a second failover (:%d, then :%d): the fresh hold was told LOST\n",
                      first_new, named_master());
    } else {
        assert_int_equal(su, CERB_OK);
    }

    /* The holder: kept (renewed on the new master) or told LOST. While it
     * is VALID nobody else may have the name. */
    assert_wait_until(settled, la, 3 * LEASE_MS);
    cerb_status sb = cerb_lock_trylock(lbh);
    enum cerb_lock_state sa = cerb_lock_state(la);
    print_message("holder %s (lost callbacks %d); another client's trylock: %s\n",
                  sa == CERB_LOCK_VALID ? "kept" : "LOST", atomic_load(&lost_calls),
                  cerb_status_name(sb));
    if (sa == CERB_LOCK_VALID)
        assert_int_not_equal(sb, CERB_OK);
    else
        assert_int_equal(atomic_load(&lost_calls), 1);
    if (sb == CERB_OK)
        assert_int_equal(cerb_lock_unlock(lbh), CERB_OK);
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_lock_free(lbh);
    cerb_client_close(a);
    cerb_client_close(b);
    free(held);
    free(fresh);
}

/*
 * Issue 13 item 2: the engine follows a failover through the sentinels'
 * +switch-master announcement, before any call of its own fails. An
 * instance that makes no call at all is watched while the master is killed:
 * it must name the new master within the sentinels' own failover time (when
 * sentinel +10 first names it) + 1 s.
 */
struct follow {
    cerb_engine *e;
    int old;
    int64_t t_named, t_followed;
};

static bool followed(void *ud)
{
    struct follow *f = ud;
    int64_t now = cerb_test_now_ms();
    if (!f->t_named) {
        int m = named_master();
        if (m > 0 && m != f->old)
            f->t_named = now;
    }
    if (!f->t_followed) {
        struct cerb_redis_stats rs;
        cerb__redis_stats(f->e, &rs);
        if (rs.master_switches > 0)
            f->t_followed = now;
    }
    return f->t_named && f->t_followed;
}

static void test_follows_switch_master(void **state)
{
    (void)state;
    const struct cerb_engine_ops *ops = cerb__engine_find("redis");
    struct cerb_config *cfg = NULL;
    cerb_engine *e = engine_open("", &cfg);
    struct follow f = {e, named_master(), 0, 0};
    assert_true(f.old > 0);
    struct cerb_redis_stats rs;
    cerb__redis_stats(e, &rs);
    assert_int_equal(rs.master_switches, 0);
    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(kill(pid_of(f.old), SIGKILL), 0);
    bool ok = wait_until(followed, &f, 60000);
    print_message("master :%d killed: sentinels named :%d after %lld ms; the engine (no call "
                  "made) followed after %lld ms\n",
                  f.old, named_master(), f.t_named ? (long long)(f.t_named - t_kill) : -1LL,
                  f.t_followed ? (long long)(f.t_followed - t_kill) : -1LL);
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
    assert_true(ok);
    assert_true(f.t_followed - t_kill <= f.t_named - t_kill + 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discovery_and_unknown_master),
        cmocka_unit_test(test_replica_ack),
        cmocka_unit_test(test_settled_grant_needs_replicas),
        cmocka_unit_test(test_master_killed),
        cmocka_unit_test(test_follows_switch_master),
    };
    if (getenv("CERB_TEST_DEBUG"))
        cerb_log_set(NULL, NULL, CERB_LOG_DEBUG);
    return cmocka_run_group_tests(tests, setup, teardown);
}
