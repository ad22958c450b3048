/*
 * test_interop_redispy.c — a Cerberus lock and redis-py's Lock (Debian's
 * python3-redis) on the same name exclude each other, both ways: each sees
 * the other's hold, and a Cerberus waiter notices a redis-py release (which
 * never notifies) within its bounded re-check.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

/* Holds the lock until the release file appears (bounded), then releases. */
static const char *PY_HOLD =
    "import os, sys, time, redis\n"
    "port, name, held, release = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]\n"
    "r = redis.Redis(host='127.0.0.1', port=port)\n"
    "l = r.lock(name, timeout=10)\n"
    "if not l.acquire(blocking=True, blocking_timeout=5): sys.exit(2)\n"
    "open(held, 'w').close()\n"
    "end = time.monotonic() + 10\n"
    "while not os.path.exists(release) and time.monotonic() < end: time.sleep(0.01)\n"
    "l.release()\n"
    "sys.exit(0)\n";

/* Exit 0 when a non-blocking acquire gives `expect` (1/0); releases after. */
static const char *PY_TRY =
    "import sys, redis\n"
    "port, name, expect = int(sys.argv[1]), sys.argv[2], sys.argv[3] == '1'\n"
    "r = redis.Redis(host='127.0.0.1', port=port)\n"
    "l = r.lock(name, timeout=10)\n"
    "got = l.acquire(blocking=False)\n"
    "if got: l.release()\n"
    "sys.exit(0 if got == expect else 1)\n";

static int py_available(void)
{
    char *argv[] = {(char *)cerb_test_python(), "-c", "import redis", NULL};
    return cerb_test_run(argv, 20000) == 0;
}

static cerb_client *open_client(void)
{
    char *cfg = cerb_test_redis_config(NULL, NULL);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    free(cfg);
    return c;
}

static bool file_exists(void *ud)
{
    struct stat st;
    return stat(ud, &st) == 0;
}

static void test_redispy_holds_cerberus_waits(void **state)
{
    (void)state;
    if (!py_available())
        fail_msg("python3-redis is required (scripts/test.sh installs it)");
    char *name = test_name("py-holds");
    char held[64], release[64], port[16];
    snprintf(held, sizeof held, "/tmp/cerb-py-held-%d", (int)getpid());
    snprintf(release, sizeof release, "/tmp/cerb-py-release-%d", (int)getpid());
    snprintf(port, sizeof port, "%d", cerb_test_redis_port());
    unlink(held);
    unlink(release);
    char *argv[] = {(char *)cerb_test_python(), "-c", (char *)PY_HOLD, port, name, held, release, NULL};
    pid_t py = cerb_test_spawn(argv);
    assert_true(py > 0);
    assert_wait_until(file_exists, held, 10000);

    cerb_client *c = open_client();
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock_for(l, 300), CERB_TIMEOUT);
    /* redis-py releases without notifying; the waiter still sees it. */
    FILE *f = fopen(release, "w");
    fclose(f);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 2000);
    assert_int_equal(cerb_test_wait(py, 10000), 0);
    /* And while we hold it, redis-py cannot take it. */
    char *argv2[] = {(char *)cerb_test_python(), "-c", (char *)PY_TRY, port, name, "0", NULL};
    assert_int_equal(cerb_test_run(argv2, 20000), 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    char *argv3[] = {(char *)cerb_test_python(), "-c", (char *)PY_TRY, port, name, "1", NULL};
    assert_int_equal(cerb_test_run(argv3, 20000), 0);
    cerb_lock_free(l);
    cerb_client_close(c);
    unlink(held);
    unlink(release);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redispy_holds_cerberus_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
