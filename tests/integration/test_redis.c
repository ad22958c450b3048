/*
 * test_redis.c — what only the redis engine has, on a real redis-server: the
 * redis-py wire layout (key = name, 32 hex chars of token, PX lease), loss
 * when the key is deleted, stolen or expires behind the holder (and an
 * unlock that must not touch the new owner's key), the full lease after a
 * fair hand-off, the reserved probe prefix, an unreachable server, and a
 * reload seen in the key's PTTL, and the default pool under 8 and 64
 * threads (exclusion and fences). The engine-independent contract
 * (exclusion, try / timed / interruptible waits, non-owner unlock, fences,
 * holds past the lease, names) is in conformance.c, run as
 * conformance_redis.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <sched.h>
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
#include "test_util.h"

static cerb_client *open_client(const char *redis_extra, const char *extra)
{
    char *cfg = cerb_test_redis_config(redis_extra, extra);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static redisContext *raw(void)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    assert_non_null(r);
    assert_int_equal(r->err, 0);
    redisSetTimeout(r, tv);
    return r;
}

static char *raw_get(const char *key)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "GET %s", key);
    char *v = rep && rep->type == REDIS_REPLY_STRING ? strdup(rep->str) : NULL;
    freeReplyObject(rep);
    redisFree(r);
    return v;
}

static long long raw_int(const char *fmt, const char *key)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, fmt, key);
    long long v = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -999;
    freeReplyObject(rep);
    redisFree(r);
    return v;
}

static cerb_lock *mk(cerb_client *c, const char *name, int64_t lease, int renew)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = lease;
    o.renew = renew;
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(c, name, &o, &l);
    if (st != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

/* ---- wire layout ---- */

static void test_redispy_layout(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("layout");
    cerb_lock *l = mk(c, name, 5000, 0);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    char *v = raw_get(name);
    assert_non_null(v);
    assert_int_equal(strlen(v), 32); /* 32 lowercase hex chars, like redis-py */
    for (const char *p = v; *p; p++)
        assert_true((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
    long long pttl = raw_int("PTTL %s", name);
    assert_true(pttl > 0 && pttl <= 5000);
    /* Reentry changes nothing on the server. */
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    char *v2 = raw_get(name);
    assert_string_equal(v, v2);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_null(raw_get(name));
    /* A fresh acquisition gets a fresh token. */
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    char *v3 = raw_get(name);
    assert_string_not_equal(v, v3);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    free(v);
    free(v2);
    free(v3);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- loss behind the holder ---- */

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_seen(void *ud) { (void)ud; return atomic_load(&lost_calls) > 0; }

static bool is_lost(void *ud) { return cerb_lock_state(ud) == CERB_LOCK_LOST; }

static void test_lost_when_key_deleted(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("deleted");
    cerb_lock *a = mk(c, name, 600, 1);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(raw_int("DEL %s", name), 1);
    assert_wait_until(lost_seen, NULL, 3000);
    assert_wait_until(is_lost, a, 1000);
    assert_int_equal(atomic_load(&lost_calls), 1);
    assert_int_equal(cerb_lock_unlock(a), CERB_LOST);
    cerb_lock_free(a);
    free(name);
    cerb_client_close(c);
}

/* A hold object is told of its loss like a handle, with itself as the
 * argument; a callback set after the loss is told at once (it was not
 * told before), and once only. */
static atomic_int hold_lost_calls;
static cerb_hold *hold_lost_arg;
static void on_hold_lost(cerb_hold *h, void *ud)
{
    assert_ptr_equal(ud, &hold_lost_calls);
    hold_lost_arg = h;
    atomic_fetch_add(&hold_lost_calls, 1);
}
static bool hold_lost_seen(void *ud) { return atomic_load(&hold_lost_calls) >= *(int *)ud; }
static bool hold_is_lost(void *ud) { return cerb_hold_state(ud) == CERB_LOCK_LOST; }

static void test_hold_lost_when_key_deleted(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("hdeleted");
    cerb_lock *a = mk(c, name, 600, 1);
    cerb_hold *h = NULL, *h2 = NULL;
    atomic_store(&hold_lost_calls, 0);
    assert_int_equal(cerb_lock_acquire(a, 0, NULL, &h), CERB_OK);
    assert_int_equal(cerb_hold_on_lost(h, on_hold_lost, &hold_lost_calls), CERB_OK);
    assert_int_equal(raw_int("DEL %s", name), 1);
    int one = 1, two = 2;
    assert_wait_until(hold_lost_seen, &one, 3000);
    assert_ptr_equal(hold_lost_arg, h);
    assert_wait_until(hold_is_lost, h, 1000);
    assert_int_equal(cerb_hold_release(h), CERB_LOST);
    assert_true(strstr(cerb_hold_error(h), "lost") != NULL);
    assert_int_equal(cerb_hold_state(h), CERB_LOCK_FREE);

    /* Lost with no callback set: setting one afterwards tells it. */
    assert_int_equal(cerb_lock_acquire(a, 0, NULL, &h2), CERB_OK);
    assert_int_equal(raw_int("DEL %s", name), 1);
    assert_wait_until(hold_is_lost, h2, 3000);
    assert_int_equal(cerb_hold_on_lost(h2, on_hold_lost, &hold_lost_calls), CERB_OK);
    assert_wait_until(hold_lost_seen, &two, 3000);
    assert_ptr_equal(hold_lost_arg, h2);
    assert_int_equal(cerb_hold_on_lost(h2, on_hold_lost, &hold_lost_calls), CERB_OK);
    /* Told once each: a second telling would come within the watchdog's
     * next rounds (its cadence is a third of the 600 ms lease). */
    int three = 3;
    assert_false(wait_until(hold_lost_seen, &three, 600));
    assert_int_equal(cerb_hold_free(h2), CERB_LOST);
    assert_int_equal(atomic_load(&hold_lost_calls), 2);
    assert_int_equal(cerb_hold_free(h), CERB_OK);
    cerb_lock_free(a);
    free(name);
    cerb_client_close(c);
}

static void test_lost_when_key_stolen(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("stolen");
    cerb_lock *a = mk(c, name, 600, 1);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    redisContext *r = raw();
    freeReplyObject(redisCommand(r, "SET %s someone-else PX 10000", name));
    assert_wait_until(lost_seen, NULL, 3000);
    /* The holder's unlock must not delete the thief's key. */
    assert_int_equal(cerb_lock_unlock(a), CERB_LOST);
    char *v = raw_get(name);
    assert_non_null(v);
    assert_string_equal(v, "someone-else");
    free(v);
    freeReplyObject(redisCommand(r, "DEL %s", name));
    redisFree(r);
    cerb_lock_free(a);
    free(name);
    cerb_client_close(c);
}

static void test_no_renew_expires(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(NULL, NULL), *c2 = open_client(NULL, NULL);
    char *name = test_name("expire");
    cerb_lock *a = mk(c1, name, 200, 0), *b = mk(c2, name, 5000, -1);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    /* b waits and gets it when the server expires a's key. */
    assert_int_equal(cerb_lock_trylock_for(b, 3000), CERB_OK);
    assert_wait_until(lost_seen, NULL, 2000);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_LOST);
    assert_int_equal(cerb_lock_unlock(a), CERB_LOST);
    char *v = raw_get(name); /* b's key untouched by a's unlock */
    assert_non_null(v);
    free(v);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    cerb_lock_free(a);
    cerb_lock_free(b);
    free(name);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

/* ---- a fair hand-off without renewal still gets its full lease ---- */

struct handed {
    cerb_lock *l;
    const char *name;
    cerb_status st, unlock_st;
    enum cerb_lock_state later;
    long long pttl_later;
    atomic_bool waiting;
};

static void *handed_main(void *arg)
{
    struct handed *h = arg;
    atomic_store(&h->waiting, true);
    h->st = cerb_lock_trylock_for(h->l, 5000);
    if (h->st == CERB_OK) {
        /* Past the engine's 2 s hand-off lease. */
        cerb_test_let_time_pass(2500);
        h->later = cerb_lock_state(h->l);
        h->pttl_later = raw_int("PTTL %s", h->name);
        h->unlock_st = cerb_lock_unlock(h->l);
    }
    return NULL;
}

static bool is_waiting(void *ud) { return atomic_load(&((struct handed *)ud)->waiting); }

static void test_handoff_without_renewal_gets_full_lease(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(NULL, NULL), *c2 = open_client(NULL, NULL);
    char *name = test_name("handoff-norenew");
    cerb_lock_opts o = {6000, 0, 1};
    cerb_lock *a = NULL, *b = NULL;
    assert_int_equal(cerb_lock_new(c1, name, &o, &a), CERB_OK);
    assert_int_equal(cerb_lock_new(c2, name, &o, &b), CERB_OK);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    struct handed h = {.l = b, .name = name};
    pthread_t t;
    pthread_create(&t, NULL, handed_main, &h);
    assert_wait_until(is_waiting, &h, 2000);
    cerb_test_let_time_pass(100); /* let it queue on the server */
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    pthread_join(t, NULL);
    assert_int_equal(h.st, CERB_OK);
    assert_int_equal(h.later, CERB_LOCK_VALID);
    assert_true(h.pttl_later > 2000); /* extended beyond the hand-off lease */
    assert_int_equal(h.unlock_st, CERB_OK);
    cerb_lock_free(a);
    cerb_lock_free(b);
    free(name);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

static void test_reserved_name(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, "__cerberus_probe__:x", NULL, &l), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "reserved"));
    cerb_client_close(c);
}

/* ---- unreachable server ---- */

static void test_unreachable_server(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    /* A port nobody listens on: refused at once; and a bounded connect. */
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_client_open_string(&c,
        "engines = (\"redis\"); redis = { port = 1; connect_timeout_ms = 300; };");
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_not_equal(st, CERB_OK);
    assert_null(c);
    assert_true(st == CERB_UNAVAILABLE || st == CERB_EIO);
    assert_non_null(strstr(cerb_last_error(), "127.0.0.1"));
    assert_true(took < 2000);
}

static void test_reload(void **state)
{
    (void)state;
    char *path = cerb_test_write_config(
        "engines = (\"redis\"); redis = { port = %d; }; lock = { lease_ms = 4000; };",
        cerb_test_redis_port());
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    char *name = test_name("reload");
    cerb_lock *l = mk(c, name, 0, 0);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    long long pttl = raw_int("PTTL %s", name);
    assert_true(pttl > 3000 && pttl <= 4000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    /* A valid new lease applies to the next acquisition. */
    FILE *f = fopen(path, "w");
    fprintf(f, "engines = (\"redis\"); redis = { port = %d; }; lock = { lease_ms = 8000; };",
            cerb_test_redis_port());
    fclose(f);
    assert_int_equal(cerb_client_reload(c), CERB_OK);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    pttl = raw_int("PTTL %s", name);
    assert_true(pttl > 7000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    /* An invalid file is rejected and the old config stays. */
    f = fopen(path, "w");
    fprintf(f, "engines = (\"redis\");\nlock = { lease_ms = -5; };\n");
    fclose(f);
    assert_int_equal(cerb_client_reload(c), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), ":2:"));
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    pttl = raw_int("PTTL %s", name);
    assert_true(pttl > 7000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
    cerb_test_remove_file(path);
}

/*
 * Issue 13, item 1: the default configuration (the pool grows to
 * redis.pool_max = 64) with 8 and with 64 threads of one client racing for
 * 4 names: mutual exclusion (a flag per name set and cleared inside the
 * critical section, and a plain counter whose lost updates would show two
 * holders) and fences strictly increasing per name, every acquisition
 * granted within its wait.
 */
#define POOL_NAMES 4
#define POOL_ITER 15

struct pool_run {
    cerb_client *c;
    char *names[POOL_NAMES];
    atomic_int busy[POOL_NAMES];
    long counter[POOL_NAMES];
    uint64_t last_fence[POOL_NAMES];
    atomic_int overlaps, regressions, failures;
};

struct pool_thread {
    struct pool_run *run;
    int id;
};

static void *pool_worker(void *arg)
{
    struct pool_thread *t = arg;
    struct pool_run *r = t->run;
    cerb_lock *l[POOL_NAMES];
    for (int n = 0; n < POOL_NAMES; n++)
        if (cerb_lock_new(r->c, r->names[n], NULL, &l[n]) != CERB_OK)
            l[n] = NULL;
    for (int i = 0; i < POOL_ITER; i++) {
        int n = (t->id + i) % POOL_NAMES;
        if (!l[n] || cerb_lock_trylock_for(l[n], 20000) != CERB_OK) {
            atomic_fetch_add(&r->failures, 1);
            continue;
        }
        if (atomic_exchange(&r->busy[n], 1) != 0)
            atomic_fetch_add(&r->overlaps, 1);
        uint64_t f = cerb_lock_fencing_token(l[n]);
        if (f <= r->last_fence[n])
            atomic_fetch_add(&r->regressions, 1);
        r->last_fence[n] = f;
        long v = r->counter[n];
        sched_yield();
        r->counter[n] = v + 1;
        atomic_store(&r->busy[n], 0);
        if (cerb_lock_unlock(l[n]) != CERB_OK)
            atomic_fetch_add(&r->failures, 1);
    }
    for (int n = 0; n < POOL_NAMES; n++)
        cerb_lock_free(l[n]);
    return NULL;
}

static void pool_race(int threads)
{
    struct pool_run r;
    memset(&r, 0, sizeof r);
    r.c = open_client(NULL, NULL); /* the default pool */
    for (int n = 0; n < POOL_NAMES; n++)
        r.names[n] = test_name("pool");
    pthread_t tid[64];
    struct pool_thread t[64];
    assert_true(threads <= 64);
    int64_t t0 = cerb_test_now_ms();
    for (int i = 0; i < threads; i++) {
        t[i] = (struct pool_thread){&r, i};
        assert_int_equal(pthread_create(&tid[i], NULL, pool_worker, &t[i]), 0);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    long total = 0;
    for (int n = 0; n < POOL_NAMES; n++)
        total += r.counter[n];
    print_message("%d threads: %ld critical sections in %lld ms, %d overlaps, %d fence "
                  "regressions, %d failures\n", threads, total,
                  (long long)(cerb_test_now_ms() - t0), atomic_load(&r.overlaps),
                  atomic_load(&r.regressions), atomic_load(&r.failures));
    assert_int_equal(atomic_load(&r.overlaps), 0);
    assert_int_equal(atomic_load(&r.regressions), 0);
    assert_int_equal(atomic_load(&r.failures), 0);
    assert_int_equal(total, (long)threads * POOL_ITER);
    for (int n = 0; n < POOL_NAMES; n++)
        free(r.names[n]);
    cerb_client_close(r.c);
}

static void test_default_pool_8_threads(void **state)
{
    (void)state;
    pool_race(8);
}

static void test_default_pool_64_threads(void **state)
{
    (void)state;
    pool_race(64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redispy_layout),
        cmocka_unit_test(test_lost_when_key_deleted),
        cmocka_unit_test(test_hold_lost_when_key_deleted),
        cmocka_unit_test(test_lost_when_key_stolen),
        cmocka_unit_test(test_no_renew_expires),
        cmocka_unit_test(test_handoff_without_renewal_gets_full_lease),
        cmocka_unit_test(test_reserved_name),
        cmocka_unit_test(test_unreachable_server),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_default_pool_8_threads),
        cmocka_unit_test(test_default_pool_64_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
