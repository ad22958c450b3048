/*
 * redlock_interop_redispy.c — Cerberus' Redlock mode and redis-py (Debian's
 * python3-redis) on the same three masters. redis-py has no Redlock class;
 * a Python program that wants one does what this suite's script does: one
 * redis-py `Lock` per master on the same name, all acquired with the same
 * token (`Lock.acquire(token=...)`, a SET NX PX per node), held when a
 * majority said yes. That is the per-node protocol of the Redlock mode
 * (key = the name, value = the owner token, compare-and-DEL,
 * compare-and-PEXPIRE), so each side must see the other's hold on every
 * node, and redis-py's release and extend, which compare the token on the
 * server, must fail on ours with LockNotOwnedError.
 *
 * The Python side is one short process per step (PY below); its exit
 * status is a bit mask of the nodes where the step succeeded, so the suite
 * asserts node by node without parsing output.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "cerberus.h"
#include "test_util.h"

#define NODES 3

/* python3 -c PY OP NAME TOKEN TTL_MS PORT... : for each port i, OP on a
 * redis-py Lock of NAME there; exit status = the sum of 1 << i over the
 * nodes where it succeeded (acquire: got it; release/extend: no
 * LockNotOwnedError), 100 on any other error. */
static const char *PY =
    "import sys, redis\n"
    "from redis.exceptions import LockNotOwnedError\n"
    "op, name, token, ttl = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])\n"
    "mask = 0\n"
    "try:\n"
    "    for i, port in enumerate(sys.argv[5:]):\n"
    "        r = redis.Redis(host='127.0.0.1', port=int(port), socket_timeout=2)\n"
    "        l = r.lock(name, timeout=ttl / 1000.0)\n"
    "        if op == 'acquire':\n"
    "            ok = l.acquire(blocking=False, token=token)\n"
    "        else:\n"
    "            l.local.token = token.encode()\n"
    "            try:\n"
    "                if op == 'release': l.release()\n"
    "                else: l.extend(ttl / 1000.0)\n"
    "                ok = True\n"
    "            except LockNotOwnedError:\n"
    "                ok = False\n"
    "        if ok: mask |= 1 << i\n"
    "except Exception as e:\n"
    "    print('redlock_interop_redispy:', repr(e), file=sys.stderr)\n"
    "    sys.exit(100)\n"
    "sys.exit(mask)\n";

/* A token as redis-py makes them (uuid4 hex), fixed for the suite. */
#define PY_TOKEN "7f0c6c3e2b9d4e51a8a1c0ffee5eed01"

static int base_port(void)
{
    return cerb_test_env_port("CERB_REDLOCK_PORT", 26411);
}

/* Run PY with @op on the nodes whose bit is set in @nodes. */
static int py(const char *op, const char *name, const char *token, int ttl_ms, unsigned nodes)
{
    char ttl[16], ports[NODES][16];
    char *argv[8 + NODES] = {(char *)cerb_test_python(), "-c", (char *)PY, (char *)op,
                             (char *)name, (char *)token, ttl};
    int n = 7;
    snprintf(ttl, sizeof ttl, "%d", ttl_ms);
    for (int i = 0; i < NODES; i++)
        if (nodes & (1u << i)) {
            snprintf(ports[i], sizeof ports[i], "%d", base_port() + i);
            argv[n++] = ports[i];
        }
    argv[n] = NULL;
    int st = cerb_test_run(argv, 20000);
    if (st == 100 || st < 0)
        fail_msg("python %s failed (status %d)", op, st);
    /* The mask counts the ports given, in order: map it back to nodes. */
    unsigned out = 0;
    for (int i = 0, k = 0; i < NODES; i++)
        if (nodes & (1u << i))
            out |= ((unsigned)st >> k++ & 1u) << i;
    return (int)out;
}

/* GET @name on node @i into @buf ("" when there is no key). */
static void node_get(int i, const char *name, char *buf, size_t len)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", base_port() + i, tv);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "GET %s", name);
    assert_non_null(r);
    snprintf(buf, len, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    redisFree(c);
}

/* The bit mask of nodes whose value of @name is @value. */
static unsigned holding(const char *name, const char *value)
{
    unsigned m = 0;
    char v[128];
    for (int i = 0; i < NODES; i++) {
        node_get(i, name, v, sizeof v);
        if (strcmp(v, value) == 0)
            m |= 1u << i;
    }
    return m;
}

static int majority(unsigned m)
{
    return __builtin_popcount(m) >= NODES / 2 + 1;
}

static cerb_client *open_client(int64_t lease_ms)
{
    char cfg[1024];
    int b = base_port();
    snprintf(cfg, sizeof cfg,
                 "engines = (\"redis\");\n"
                 "lock = { lease_ms = %lld; renew = true; fair = false; };\n"
                 "redis = { mode = \"redlock\"; redlock_fence = \"quorum\";\n"
                 "  nodes = (\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\");\n"
                 "  connect_timeout_ms = 500; op_timeout_ms = 500; };\n",
                 (long long)lease_ms, b, b + 1, b + 2);
    cerb_client *c = cerb_test_open(cfg);
    assert_non_null(c);
    return c;
}

/* Our owner token: the value on node @i, checked to be 32 hex chars. */
static void our_token(const char *name, char *tok, size_t len)
{
    for (int i = 0; i < NODES; i++) {
        node_get(i, name, tok, len);
        if (strlen(tok) == 32 && strcmp(tok, PY_TOKEN) != 0)
            return;
    }
    fail_msg("no Cerberus token on any node for %s", name);
}

static void setup_python(void)
{
    char *argv[] = {(char *)cerb_test_python(), "-c", "import redis", NULL};
    if (cerb_test_run(argv, 20000) != 0)
        fail_msg("python3-redis is required (scripts/deps.sh installs it)");
}

/* redis-py holding a majority refuses us; our refused attempt leaves no
 * key on the node it did not hold; after its release we get it. */
static void test_python_majority_refuses_us(void **state)
{
    (void)state;
    setup_python();
    char *name = test_name("rl-py-maj");
    assert_int_equal(py("acquire", name, PY_TOKEN, 10000, 0x3), 0x3);
    cerb_client *c = open_client(10000);
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(holding(name, PY_TOKEN), 0x3);
    assert_int_equal(holding(name, ""), 0x4); /* released everywhere */
    /* Python releases; we get it long before its 10 s PX would run out.
     * Not one trylock: on masters whose fence counters nobody has seeded
     * yet (fresh fixture servers, when this case runs first) the engine's
     * first granting attempt seeds them and gives the grant back, so the
     * grant is the next attempt's (engine_redis/redis_redlock.c). */
    assert_int_equal(py("release", name, PY_TOKEN, 10000, 0x3), 0x3);
    assert_int_equal(cerb_lock_trylock_for(l, 2000), CERB_OK);
    assert_true(cerb_lock_fencing_token(l) > 0);
    char tok[128];
    our_token(name, tok, sizeof tok);
    assert_true(majority(holding(name, tok)));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(holding(name, ""), 0x7);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* A redis-py waiter's counterpart: our timed lock sees a Python release
 * (which notifies nobody) well before its 10 s PX would have. */
static void test_our_waiter_sees_python_release(void **state)
{
    (void)state;
    setup_python();
    char *name = test_name("rl-py-wait");
    assert_int_equal(py("acquire", name, PY_TOKEN, 10000, 0x7), 0x7);
    cerb_client *c = open_client(10000);
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    char ttl[] = "10000", p0[16], p1[16], p2[16];
    snprintf(p0, sizeof p0, "%d", base_port());
    snprintf(p1, sizeof p1, "%d", base_port() + 1);
    snprintf(p2, sizeof p2, "%d", base_port() + 2);
    char *argv[] = {(char *)cerb_test_python(), "-c", (char *)PY, "release", name,
                    PY_TOKEN, ttl, p0, p1, p2, NULL};
    int64_t t0 = cerb_test_now_ms();
    pid_t pid = cerb_test_spawn(argv);
    assert_true(pid > 0);
    assert_int_equal(cerb_lock_trylock_for(l, 8000), CERB_OK);
    int64_t took_ms = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_test_wait(pid, 20000), 0x7);
    assert_true(took_ms < 5000);
    /* The name itself, on a majority, is ours now. */
    char tok[128];
    our_token(name, tok, sizeof tok);
    assert_true(majority(holding(name, tok)));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* We hold: redis-py's non-blocking acquire fails on every node, and its
 * release and extend with its own token raise LockNotOwnedError there
 * without touching our key. */
static void test_we_hold_python_cannot_touch(void **state)
{
    (void)state;
    setup_python();
    char *name = test_name("rl-py-out");
    cerb_client *c = open_client(10000);
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    char tok[128];
    our_token(name, tok, sizeof tok);
    unsigned ours = holding(name, tok);
    assert_true(majority(ours));
    assert_int_equal(py("acquire", name, PY_TOKEN, 10000, ours), 0);
    assert_int_equal(py("release", name, PY_TOKEN, 10000, 0x7), 0);
    assert_int_equal(py("extend", name, PY_TOKEN, 10000, 0x7), 0);
    assert_int_equal(holding(name, tok), ours);
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(holding(name, ""), 0x7);
    /* Free again: redis-py takes every node. */
    assert_int_equal(py("acquire", name, PY_TOKEN, 10000, 0x7), 0x7);
    assert_int_equal(py("release", name, PY_TOKEN, 10000, 0x7), 0x7);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* A Python Redlock that died after one node (a minority): we still get a
 * majority, and our release leaves its key alone. */
static void test_python_minority_left_behind(void **state)
{
    (void)state;
    setup_python();
    char *name = test_name("rl-py-min");
    assert_int_equal(py("acquire", name, PY_TOKEN, 10000, 0x1), 0x1);
    cerb_client *c = open_client(10000);
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(holding(name, PY_TOKEN), 0x1);
    char tok[128];
    our_token(name, tok, sizeof tok);
    assert_int_equal(holding(name, tok), 0x6);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(holding(name, PY_TOKEN), 0x1);
    assert_int_equal(holding(name, ""), 0x6);
    assert_int_equal(py("release", name, PY_TOKEN, 10000, 0x1), 0x1);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_majority_refuses_us),
        cmocka_unit_test(test_our_waiter_sees_python_release),
        cmocka_unit_test(test_we_hold_python_cannot_touch),
        cmocka_unit_test(test_python_minority_left_behind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
