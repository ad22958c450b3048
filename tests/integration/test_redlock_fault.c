/*
 * test_redlock_fault.c — Redlock mode when masters fail (fixture
 * redlock_excl: three masters of its own, stopped and restarted through
 * scripts/servers.sh). One node stopped or paused: still granted, within
 * the per-node bound; two stopped: no grant, an error naming them; a node
 * restarted without its data: left out of quorums for one lease; fences
 * increasing through a restart without data, which the write-back is what
 * keeps (CERB_TEST_REDLOCK_NO_WRITEBACK=1 makes test_fence_through_restart
 * fail); renewal with one node gone keeps the hold, with two it is LOST.
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
#include "redlock_util.h"
#include "test_util.h"

static const char FOREIGN[] = "ffffffffffffffffffffffffffffffff";

/* One engine: its breaker would only turn a short loss of a quorum (what
 * these cases make) into a longer refusal. */
static cerb_client *open_rl(const char *extra)
{
    char buf[512];
    snprintf(buf, sizeof buf, "failover = { consecutive_failures = 1000; min_calls = 1000000; };\n%s",
             extra ? extra : "");
    char *cfg = rl_config(NULL, buf);
    assert_non_null(cfg);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    return c;
}

static void del_key(int i, const char *name)
{
    redisContext *r = rl_raw(i);
    assert_non_null(r);
    redisReply *k = redisCommand(r, "DEL %s", name);
    assert_non_null(k);
    freeReplyObject(k);
    redisFree(r);
}

/* Every node up again (a failed case must not break the next). */
static int all_up(void **state)
{
    (void)state;
    for (int i = 0; i < rl_nodes(); i++) {
        if (rl_pid(i) > 0)
            rl_resume(i);
        if (rl_servers("start", i) != 0)
            return -1;
    }
    return 0;
}

static void test_one_stopped_or_paused(void **state)
{
    (void)state;
    /* A short lease: the paused node runs our SET when it resumes, and that
     * stray key (a minority) blocks the name there until it expires. */
    cerb_client *c = open_rl("lock = { lease_ms = 1000; };");
    char *name = test_name("rlf-one");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(rl_pause(1), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock(l); /* 0 and 2 */
    if (st != CERB_OK)
        fprintf(stderr, "paused: %s\n", cerb_last_error());
    assert_int_equal(st, CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 2000);     /* the per-node bound, not a hang */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(rl_resume(1), 0);

    assert_int_equal(rl_servers("stop", 2), 0);
    /* 0 and 1 (node 1 is asked again a second after its timeout, and its
     * stray key has expired) */
    cerb_status st2 = cerb_lock_trylock_for(l, 3000);
    if (st2 != CERB_OK)
        fprintf(stderr, "stopped: %s\n", cerb_last_error());
    assert_int_equal(st2, CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

static void test_two_stopped(void **state)
{
    (void)state;
    cerb_client *c = open_rl("retry = { max = 0; };");
    char *name = test_name("rlf-two");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(rl_servers("stop", 1), 0);
    assert_int_equal(rl_servers("stop", 2), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock_for(l, 1000);
    assert_true(st == CERB_UNAVAILABLE || st == CERB_EIO);
    assert_true(cerb_test_now_ms() - t0 < 5000);
    char port[16];
    snprintf(port, sizeof port, "%d", rl_base_port() + 1);
    assert_non_null(strstr(cerb_last_error(), port));
    assert_int_equal(rl_has_key(0, name), 0); /* nothing left on the one alive */
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
    assert_int_equal(all_up(NULL), 0);
}

/* A holder had nodes 0 and 2; node 2 restarts empty. A client that knew
 * node 2 before must not count it for one lease: else 1 and 2 would grant
 * a second holder. */
static void test_restart_left_out(void **state)
{
    (void)state;
    cerb_client *c = open_rl("lock = { lease_ms = 2000; };");
    char *name = test_name("rlf-restart"), *other = test_name("rlf-scratch");
    cerb_lock *l = cerb_test_handle(c, name), *s = cerb_test_handle(c, other);
    assert_int_equal(cerb_lock_trylock(s), CERB_OK); /* connections (run_ids) known */
    assert_int_equal(cerb_lock_unlock(s), CERB_OK);
    assert_int_equal(rl_set(0, name, FOREIGN, 60000), 0);
    assert_int_equal(rl_set(2, name, FOREIGN, 60000), 0);
    assert_int_equal(rl_restart_empty(2), 0);
    /* The broken connection to node 2 is replaced (the new run_id seen). */
    for (int k = 0; k < 2; k++) {
        cerb_status st = cerb_lock_trylock(s);
        if (st == CERB_OK)
            assert_int_equal(cerb_lock_unlock(s), CERB_OK);
    }
    assert_int_equal(rl_has_key(2, name), 0);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY); /* 1 and 2 would be a quorum */
    assert_int_equal(rl_has_key(1, name), 0);
    /* After the lease, node 2 votes again. */
    assert_int_equal(cerb_lock_trylock_for(l, 6000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    del_key(0, name);
    cerb_lock_free(l);
    cerb_lock_free(s);
    cerb_client_close(c);
    free(name);
    free(other);
}

/* Node 0's counter runs ahead, a grant on {0, 1} takes it; node 0
 * restarts empty; a new client's grant (on 1 and 2, node 0 unseeded) must
 * still be above: only the write-back to node 1 carries it. */
static void test_fence_through_restart(void **state)
{
    (void)state;
    cerb_client *x = open_rl(NULL);
    char *name = test_name("rlf-fence");
    cerb_lock *lx = cerb_test_handle(x, name);
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK); /* every node seeded */
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    /* Node 0's counter far ahead (grants only there, as by attempts that
     * failed elsewhere); node 2 held by another. */
    redisContext *r = rl_raw(0);
    assert_non_null(r);
    redisReply *k = redisCommand(r, "SET {%s}\x1frlfence 100000", name);
    assert_non_null(k);
    freeReplyObject(k);
    redisFree(r);
    assert_int_equal(rl_set(2, name, FOREIGN, 60000), 0);
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK); /* {0, 1}: T from node 0 */
    uint64_t t1 = cerb_lock_fencing_token(lx);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    del_key(2, name);
    assert_int_equal(rl_restart_empty(0), 0);
    cerb_client *y = open_rl(NULL);
    cerb_lock *ly = cerb_test_handle(y, name);
    assert_int_equal(cerb_lock_trylock_for(ly, 3000), CERB_OK);
    uint64_t t2 = cerb_lock_fencing_token(ly);
    fprintf(stderr, "fence before the restart %llu, after %llu\n", (unsigned long long)t1,
            (unsigned long long)t2);
    assert_true(t2 > t1);
    assert_int_equal(cerb_lock_unlock(ly), CERB_OK);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
    free(name);
    /* node 0 is quarantined for a lease: a new one (init) for the next case */
    assert_int_equal(rl_servers("stop", 0), 0);
    assert_int_equal(rl_servers("start", 0), 0);
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool was_lost(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_renew_one_then_two_gone(void **state)
{
    (void)state;
    cerb_client *c = open_rl("lock = { lease_ms = 1000; };");
    char *name = test_name("rlf-renew");
    cerb_lock *l = cerb_test_handle(c, name);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_on_lost(l, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(rl_servers("stop", 2), 0);
    cerb_test_let_time_pass(2500); /* two and a half leases, renewed by 0 and 1 */
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    assert_int_equal(rl_servers("stop", 1), 0);
    assert_wait_until(was_lost, NULL, 3000);
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
    assert_int_equal(all_up(NULL), 0);
}

/* Review finding 2 (a): a holder has nodes 0 and 2 (node 1 lost its key);
 * node 0 restarts empty. A client that never saw node 0 before must not
 * count it for one lease: with 1 they would make a second holder. */
static void test_fresh_client_after_restart(void **state)
{
    (void)state;
    cerb_client *a = open_rl("lock = { lease_ms = 6000; };");
    char *name = test_name("rlf-fresh");
    cerb_lock *la = cerb_test_handle(a, name);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    del_key(1, name);
    assert_int_equal(rl_restart_empty(0), 0);
    cerb_client *b = open_rl("lock = { lease_ms = 6000; };");
    cerb_lock *lb = cerb_test_handle(b, name);
    assert_int_equal(cerb_lock_trylock(lb), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
    /* a new node 0 (prepared by init: no quarantine) for the next case */
    assert_int_equal(rl_servers("stop", 0), 0);
    assert_int_equal(rl_servers("start", 0), 0);
}

/* DUMP of key (len kl) on node i into *out (malloc'd), its length. */
static size_t dump_key(int i, const char *key, size_t kl, char **out)
{
    redisContext *r = rl_raw(i);
    assert_non_null(r);
    redisReply *k = redisCommand(r, "DUMP %b", key, kl);
    assert_non_null(k);
    assert_int_equal(k->type, REDIS_REPLY_STRING);
    *out = malloc(k->len);
    assert_non_null(*out);
    memcpy(*out, k->str, k->len);
    size_t n = k->len;
    freeReplyObject(k);
    redisFree(r);
    return n;
}

static void restore_key(int i, const char *key, size_t kl, const char *v, size_t vl)
{
    redisContext *r = rl_raw(i);
    assert_non_null(r);
    redisReply *k = redisCommand(r, "RESTORE %b 0 %b REPLACE", key, kl, v, vl);
    assert_non_null(k);
    assert_int_equal(k->type, REDIS_REPLY_STATUS);
    freeReplyObject(k);
    redisFree(r);
}

/* Review finding 2 (b): node 0 comes back from a snapshot taken before a
 * grant on {0, 1} (its marker, seed and counter restored, stale). A grant
 * on {0, 2} after it must still have a larger fence: node 0's restored
 * seed must not count (its history changed), so it is quarantined and
 * re-seeded from {1, 2}. */
static void test_fence_through_old_snapshot(void **state)
{
    (void)state;
    cerb_client *x = open_rl("lock = { lease_ms = 1000; };");
    char *name = test_name("rlf-snap");
    cerb_lock *lx = cerb_test_handle(x, name);
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    char f[256];
    int fl = snprintf(f, sizeof f, "{%s}\x1frlfence", name);
    const char *keys[3] = {"\x1f" "cerberus", "\x1f" "cerberus\x1fredlock", f};
    size_t kl[3] = {9, 17, (size_t)fl};
    char *snap[3];
    size_t sl[3];
    for (int k = 0; k < 3; k++)
        sl[k] = dump_key(0, keys[k], kl[k], &snap[k]);
    assert_int_equal(rl_set(2, name, FOREIGN, 60000), 0);
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK); /* on {0, 1} */
    uint64_t t1 = cerb_lock_fencing_token(lx);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    del_key(2, name);
    assert_int_equal(rl_restart_empty(0), 0);
    for (int k = 0; k < 3; k++) {
        restore_key(0, keys[k], kl[k], snap[k], sl[k]);
        free(snap[k]);
    }
    assert_int_equal(rl_set(1, name, FOREIGN, 60000), 0);
    cerb_client *y = open_rl("lock = { lease_ms = 1000; };");
    cerb_lock *ly = cerb_test_handle(y, name);
    assert_int_equal(cerb_lock_trylock_for(ly, 5000), CERB_OK); /* on {0, 2} */
    uint64_t t2 = cerb_lock_fencing_token(ly);
    fprintf(stderr, "fence before the snapshot's return %llu, after %llu\n",
            (unsigned long long)t1, (unsigned long long)t2);
    assert_true(t2 > t1);
    assert_int_equal(cerb_lock_unlock(ly), CERB_OK);
    del_key(1, name);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
    free(name);
    assert_int_equal(rl_servers("stop", 0), 0);
    assert_int_equal(rl_servers("start", 0), 0);
}

/* Review finding 5: node 0 paused (the kernel still accepts connections:
 * every connect to it hangs in its set-up), then a port where nothing
 * listens. Lease 2000 ms: a per-node bound of 100 ms. A client opened
 * after the pause, and each operation a second later (node 0's skip over,
 * so it is connected to again): all go through on nodes 1 and 2, each
 * within a few bounds, not failing for the dead node. */
static void blackholed_ops(void)
{
    cerb_client *c = open_rl("lock = { lease_ms = 2000; };");
    char *name = test_name("rlf-hole");
    cerb_lock *l = cerb_test_handle(c, name);
    for (int k = 0; k < 3; k++) {
        int64_t t0 = cerb_test_now_ms();
        assert_int_equal(cerb_lock_trylock(l), CERB_OK);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        assert_true(cerb_test_now_ms() - t0 < 1000);
        cerb_test_let_time_pass(1300); /* past node 0's skip (1 s + jitter) */
    }
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

static void test_blackholed_node(void **state)
{
    (void)state;
    assert_int_equal(rl_pause(0), 0);
    blackholed_ops();
    assert_int_equal(rl_resume(0), 0);
    assert_int_equal(rl_servers("stop", 0), 0); /* nothing listens there now */
    blackholed_ops();
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_one_stopped_or_paused, all_up),
        cmocka_unit_test_teardown(test_two_stopped, all_up),
        cmocka_unit_test_teardown(test_restart_left_out, all_up),
        cmocka_unit_test_teardown(test_fence_through_restart, all_up),
        cmocka_unit_test_teardown(test_renew_one_then_two_gone, all_up),
        cmocka_unit_test_teardown(test_fresh_client_after_restart, all_up),
        cmocka_unit_test_teardown(test_fence_through_old_snapshot, all_up),
        cmocka_unit_test_teardown(test_blackholed_node, all_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
