/*
 * test_redis_pause.c — the holder's view when the server stops answering
 * (SIGSTOP): the hold turns SUSPECT then LOST with one callback once the
 * conservative deadline passes; and an acquire whose reply is lost while the
 * server is paused ends with exactly one consistent outcome: either we hold
 * it (and the key carries our grant), or we do not and no orphan key is left.
 * This suite owns its server (it pauses it), see tests/CMakeLists.txt.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
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

static char *raw_get(const char *key)
{
    struct timeval tv = {5, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    assert_non_null(r);
    redisSetTimeout(r, tv);
    redisReply *rep = redisCommand(r, "GET %s", key);
    char *v = rep && rep->type == REDIS_REPLY_STRING ? strdup(rep->str) : NULL;
    freeReplyObject(rep);
    redisFree(r);
    return v;
}

static int teardown(void **state)
{
    (void)state;
    cerb_test_redis_resume();
    return 0;
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_seen(void *ud) { (void)ud; return atomic_load(&lost_calls) > 0; }
static bool is_suspect_or_lost(void *ud)
{
    enum cerb_lock_state s = cerb_lock_state(ud);
    return s == CERB_LOCK_SUSPECT || s == CERB_LOCK_LOST;
}

static void test_lost_when_server_stopped_past_lease(void **state)
{
    (void)state;
    cerb_client *c = open_client("op_timeout_ms = 100; connect_timeout_ms = 100;", NULL);
    char *name = test_name("paused");
    cerb_lock_opts o = {600, 1, -1};
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, &o, &l), CERB_OK);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(l, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_test_redis_pause(), 0);
    assert_wait_until(is_suspect_or_lost, l, 2000);
    assert_wait_until(lost_seen, NULL, 3000);
    /* Not before the lease could have run out on the server. */
    assert_true(cerb_test_now_ms() - t0 >= 300);
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_LOST);
    assert_int_equal(cerb_test_redis_resume(), 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);
    /* The server expired the key: another client gets it. */
    cerb_client *c2 = open_client(NULL, NULL);
    cerb_lock *l2 = NULL;
    assert_int_equal(cerb_lock_new(c2, name, NULL, &l2), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(l2, 3000), CERB_OK);
    cerb_lock_unlock(l2);
    cerb_lock_free(l2);
    cerb_client_close(c2);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

struct acq {
    cerb_lock *l;
    cerb_status st, unlock_st;
    char err[512];
    atomic_bool done, release;
};

static bool release_set(void *ud) { return atomic_load(&((struct acq *)ud)->release); }

/* Holds are per thread: the thread that acquired also unlocks, when told. */
static void *acq_main(void *arg)
{
    struct acq *a = arg;
    /* A waiting acquisition settles a lost answer with retry.max re-checks
     * (a trylock re-checks once, then leaves it to the background). */
    a->st = cerb_lock_trylock_for(a->l, 5000);
    snprintf(a->err, sizeof a->err, "%s", cerb_last_error());
    atomic_store(&a->done, true);
    if (a->st == CERB_OK) {
        wait_until(release_set, a, 20000);
        a->unlock_st = cerb_lock_unlock(a->l);
    }
    return NULL;
}

static bool acq_done(void *ud) { return atomic_load(&((struct acq *)ud)->done); }

static void test_lost_reply_no_orphan_no_double_grant(void **state)
{
    (void)state;
    /* Short op timeout, generous settling retries. */
    cerb_client *c = open_client("op_timeout_ms = 150; connect_timeout_ms = 150;",
                                 "retry = { max = 8; backoff_ms = 50; backoff_max_ms = 200; };");
    char *name = test_name("ambiguous");
    cerb_lock_opts o = {5000, 1, 0};
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, &o, &l), CERB_OK);
    /* Warm the pool so the request really is sent before the pause bites. */
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    assert_int_equal(cerb_test_redis_pause(), 0);
    struct acq a = {.l = l};
    pthread_t t;
    pthread_create(&t, NULL, acq_main, &a);
    /* Let the request time out at least once, then bring the server back
     * while the core is still settling. */
    assert_false(wait_until(acq_done, &a, 400));
    assert_int_equal(cerb_test_redis_resume(), 0);
    assert_wait_until(acq_done, &a, 10000);

    char *v = raw_get(name);
    if (a.st == CERB_OK) {
        /* We hold it: the key is there, and nobody else can take it. */
        assert_non_null(v);
        cerb_client *c2 = open_client(NULL, NULL);
        cerb_lock *l2 = NULL;
        assert_int_equal(cerb_lock_new(c2, name, NULL, &l2), CERB_OK);
        assert_int_equal(cerb_lock_trylock(l2), CERB_BUSY);
        atomic_store(&a.release, true);
        pthread_join(t, NULL);
        assert_int_equal(a.unlock_st, CERB_OK);
        assert_int_equal(cerb_lock_trylock(l2), CERB_OK);
        cerb_lock_unlock(l2);
        cerb_lock_free(l2);
        cerb_client_close(c2);
    } else {
        /* Not acquired: no key may be left behind holding the name. */
        print_message("acquire ended with %s: %s\n", cerb_status_name(a.st), a.err);
        pthread_join(t, NULL);
        assert_null(v);
        assert_int_equal(cerb_lock_hold_count(l), 0);
    }
    free(v);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lost_when_server_stopped_past_lease, teardown),
        cmocka_unit_test_teardown(test_lost_reply_no_orphan_no_double_grant, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
