/*
 * test_redlock.c — the redis engine's Redlock mode on three shared masters
 * (fixture redlock): the per-node layout (redis-py's key and token on every
 * node), a partial grant left by another client (a client killed
 * mid-acquire: its key on some nodes), a refused attempt leaving nothing
 * behind, fences increasing across clients, inspection per node, and the
 * primitives the mode refuses with a clear error. Killing, pausing and
 * restarting nodes is test_redlock_fault.c (its own masters).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "redlock_util.h"
#include "test_util.h"

static cerb_client *open_rl(const char *redis_extra, const char *extra)
{
    char *cfg = rl_config(redis_extra, extra);
    assert_non_null(cfg);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    return c;
}

/* The value of key name on node i (malloc'd), NULL when absent. */
static char *node_get(int i, const char *name)
{
    redisContext *r = rl_raw(i);
    assert_non_null(r);
    redisReply *k = redisCommand(r, "GET %s", name);
    assert_non_null(k);
    char *v = k->type == REDIS_REPLY_STRING ? strdup(k->str) : NULL;
    freeReplyObject(k);
    redisFree(r);
    return v;
}

/* Held: the same 32-hex token under the plain name on every master (what
 * redis-py, redsync and node-redlock read); released: gone everywhere. */
static void test_layout_every_node(void **state)
{
    (void)state;
    cerb_client *c = open_rl(NULL, NULL);
    char *name = test_name("rl-layout");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    char *v0 = node_get(0, name);
    assert_non_null(v0);
    assert_int_equal(strlen(v0), 32);
    for (int i = 1; i < rl_nodes(); i++) {
        char *v = node_get(i, name);
        assert_non_null(v);
        assert_string_equal(v, v0);
        free(v);
    }
    assert_true(cerb_lock_fencing_token(l) > 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(rl_key_count(name), 0);
    free(v0);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* Another client died after SET on one node: we still get the other two;
 * on two nodes: refused, and our attempts leave no key on the third. */
static void test_partial_grant(void **state)
{
    (void)state;
    cerb_client *c = open_rl(NULL, NULL);
    char *name = test_name("rl-partial");
    cerb_lock *l = cerb_test_handle(c, name);

    assert_int_equal(rl_set(0, name, "0123456789abcdef0123456789abcdef", 30000), 0);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(rl_has_key(1, name), 1);
    assert_int_equal(rl_has_key(2, name), 1);
    char *v = node_get(0, name);
    assert_string_equal(v, "0123456789abcdef0123456789abcdef"); /* theirs untouched */
    free(v);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(rl_has_key(1, name), 0);
    assert_int_equal(rl_has_key(2, name), 0);

    assert_int_equal(rl_set(1, name, "0123456789abcdef0123456789abcdef", 30000), 0);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(rl_has_key(2, name), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(l, 300), CERB_TIMEOUT);
    assert_true(cerb_test_now_ms() - t0 < 3000);
    assert_int_equal(rl_has_key(2, name), 0); /* released after every attempt */
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* A waiter gets the lock once the holder's partial grant expires. */
static void test_wait_for_expiry(void **state)
{
    (void)state;
    cerb_client *c = open_rl(NULL, NULL);
    char *name = test_name("rl-expiry");
    cerb_lock *l = cerb_test_handle(c, name);
    for (int i = 0; i < 2; i++)
        assert_int_equal(rl_set(i, name, "0123456789abcdef0123456789abcdef", 400), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took >= 300 && took < 2000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* Grants by two clients alternating: every fence above the one before. */
static void test_fences_increase(void **state)
{
    (void)state;
    cerb_client *a = open_rl(NULL, NULL), *b = open_rl(NULL, NULL);
    char *name = test_name("rl-fence");
    cerb_lock *la = cerb_test_handle(a, name), *lb = cerb_test_handle(b, name);
    uint64_t last = 0;
    for (int k = 0; k < 20; k++) {
        cerb_lock *l = k % 2 ? lb : la;
        assert_int_equal(cerb_lock_trylock_for(l, 2000), CERB_OK);
        uint64_t f = cerb_lock_fencing_token(l);
        assert_true(f > last);
        last = f;
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

/* redlock_fence = "none": fence 0, grants still exclusive. */
static void test_fence_none(void **state)
{
    (void)state;
    cerb_client *a = open_rl("redlock_fence = \"none\";", "epoch = 3;");
    cerb_client *b = open_rl("redlock_fence = \"none\";", NULL);
    char *name = test_name("rl-nofence");
    cerb_lock *la = cerb_test_handle(a, name), *lb = cerb_test_handle(b, name);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    /* no token, not a constant epoch << 48 (review finding 7) */
    assert_int_equal(cerb_lock_fencing_token(la), 0);
    assert_int_equal(cerb_lock_trylock(lb), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    assert_int_equal(cerb_lock_trylock(lb), CERB_OK);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

/* What the mode does not have says so. */
static void test_refused_primitives(void **state)
{
    (void)state;
    cerb_client *c = open_rl(NULL, NULL);
    char *name = test_name("rl-sem");
    cerb_semaphore *s = NULL;
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_new(c, name, 2, NULL, &s), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "redlock"));
    assert_null(p);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(name);
}

/* Inspection: one holder, on every node. */
static void test_inspect(void **state)
{
    (void)state;
    cerb_client *c = open_rl(NULL, NULL);
    char *name = test_name("rl-inspect");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    cerb_holder_info *h = NULL;
    size_t n = 0;
    assert_int_equal(cerb_lock_inspect(c, name, NULL, &h, &n), CERB_OK);
    assert_int_equal(n, 1);
    assert_non_null(strstr(h[0].detail, "(3 of 3)"));
    cerb_holders_free(h, n);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* The values our acquire scripts carried on node 0 (MONITOR, from before
 * the lock until an ECHO of `end`) on name: each distinct 32-hex argument, into
 * vals (up to max); how many. */
static int monitor_values(redisContext *mon, const char *name, const char *end, char vals[][33],
                          int max)
{
    char quoted[300];
    snprintf(quoted, sizeof quoted, "\"%s\"", name);
    int n = 0;
    for (;;) {
        redisReply *r = NULL;
        assert_int_equal(redisGetReply(mon, (void **)&r), REDIS_OK);
        assert_non_null(r);
        bool done = r->type == REDIS_REPLY_STATUS && strstr(r->str, end) != NULL;
        if (r->type == REDIS_REPLY_STATUS && strstr(r->str, "\"EVALSHA\"") &&
            strstr(r->str, quoted)) {
            for (const char *q = strchr(r->str, '"'); q; q = strchr(q + 1, '"')) {
                size_t k = strspn(q + 1, "0123456789abcdef");
                if (k != 32 || q[33] != '"')
                    continue;
                bool seen = false;
                for (int i = 0; i < n; i++)
                    seen |= memcmp(vals[i], q + 1, 32) == 0;
                if (!seen && n < max) {
                    memcpy(vals[n], q + 1, 32);
                    vals[n++][32] = '\0';
                }
                q += 33;
            }
        }
        freeReplyObject(r);
        if (done)
            return n;
    }
}

/* Review finding 1: an attempt that failed (node 0 granted, 1 and 2 held
 * by another client) is released by a compare-and-DEL that may arrive
 * late; the attempt that then wins writes a value of its own, so that DEL
 * (replayed here on node 0) cannot take the winner's key. */
static void test_attempt_values(void **state)
{
    (void)state;
    cerb_client *c = open_rl(NULL, NULL);
    char *name = test_name("rl-attempt");
    cerb_lock *l = cerb_test_handle(c, name);
    redisContext *mon = rl_raw(0);
    assert_non_null(mon);
    redisReply *ok = redisCommand(mon, "MONITOR");
    assert_non_null(ok);
    freeReplyObject(ok);
    for (int i = 1; i < 3; i++)
        assert_int_equal(rl_set(i, name, "0123456789abcdef0123456789abcdef", 300), 0);
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    char end[128];
    snprintf(end, sizeof end, "monitor-end-%s", name);
    redisContext *r0 = rl_raw(0);
    assert_non_null(r0);
    freeReplyObject(redisCommand(r0, "ECHO %s", end));
    char vals[64][33];
    int n = monitor_values(mon, name, end, vals, 64);
    redisFree(mon);
    char *won = node_get(0, name);
    assert_non_null(won);
    int others = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(vals[i], won) == 0 || strcmp(vals[i], "0123456789abcdef0123456789abcdef") == 0)
            continue;
        others++;
        /* the late compare-and-DEL of that attempt */
        redisReply *d = redisCommand(r0, "EVAL %s 1 %s %s",
                                     "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                     "return redis.call('DEL', KEYS[1]) end return 0",
                                     name, vals[i]);
        assert_non_null(d);
        assert_int_equal(d->integer, 0);
        freeReplyObject(d);
    }
    assert_true(others >= 1); /* attempt 0 failed, and wrote another value */
    assert_int_equal(rl_has_key(0, name), 1);
    assert_int_equal(strncmp(won, vals[0], 16), 0); /* the token's first half */
    redisFree(r0);
    free(won);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(rl_key_count(name), 0);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_every_node), cmocka_unit_test(test_partial_grant),
        cmocka_unit_test(test_wait_for_expiry),   cmocka_unit_test(test_fences_increase),
        cmocka_unit_test(test_fence_none),        cmocka_unit_test(test_refused_primitives),
        cmocka_unit_test(test_inspect),           cmocka_unit_test(test_attempt_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
