/*
 * test_callbacks.c — lost and switch callbacks run on their own thread, with
 * nothing in the library waiting for them. Each case has the callback take a
 * mutex that the test thread holds around a library call (the application
 * pattern that used to deadlock) and checks that the call returns, that the
 * client's other holds keep being renewed, and that close returns with the
 * callback still blocked and calls no callback afterwards.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "cerberus.h"
#include "fault_engine.h"
#include "test_util.h"

static pthread_mutex_t app_mu = PTHREAD_MUTEX_INITIALIZER; /* the application's */
static atomic_int entered, returned, other_lost;

static void blocking_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&entered, 1);
    pthread_mutex_lock(&app_mu);
    pthread_mutex_unlock(&app_mu);
    atomic_fetch_add(&returned, 1);
}

static void blocking_switch(const char *from, const char *to, const char *why, void *ud)
{
    (void)from;
    (void)to;
    (void)why;
    (void)ud;
    atomic_fetch_add(&entered, 1);
    pthread_mutex_lock(&app_mu);
    pthread_mutex_unlock(&app_mu);
    atomic_fetch_add(&returned, 1);
}

static void count_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&other_lost, 1);
}

static bool entered_pred(void *ud) { return atomic_load(&entered) >= *(int *)ud; }
static bool returned_pred(void *ud) { return atomic_load(&returned) >= *(int *)ud; }

static cerb_lock *mk(cerb_client *c, const char *name, int64_t lease, int renew)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = lease;
    o.renew = renew;
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, &o, &l), CERB_OK);
    return l;
}

/* A library call on a helper thread, so that the test can bound it. */
struct call {
    pthread_t t;
    cerb_lock *l;
    cerb_client *c;
    const char *engine;
    atomic_int done;
    cerb_status st;
};

static void *switch_main(void *arg)
{
    struct call *k = arg;
    k->st = cerb_engine_switch_to(k->c, k->engine) ? CERB_OK : CERB_EINVAL;
    atomic_store(&k->done, 1);
    return NULL;
}

static void *close_main(void *arg)
{
    struct call *k = arg;
    cerb_client_close(k->c);
    atomic_store(&k->done, 1);
    return NULL;
}

static bool call_done(void *ud) { return atomic_load(&((struct call *)ud)->done) != 0; }

/* The hold stays VALID for ms (checked every poll): it is being renewed. */
static bool stays_valid(cerb_lock *l, int64_t ms)
{
    int64_t end = cerb_test_now_ms() + ms;
    while (cerb_test_now_ms() < end) {
        if (cerb_lock_state(l) != CERB_LOCK_VALID)
            return false;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    return cerb_lock_state(l) == CERB_LOCK_VALID;
}

static bool is_lost(void *ud) { return cerb_lock_state(ud) == CERB_LOCK_LOST; }

static void reset(void)
{
    atomic_store(&entered, 0);
    atomic_store(&returned, 0);
    atomic_store(&other_lost, 0);
}

/* The holder of `a`: lock, wait until a's lost callback has started (and
 * is blocked on app_mu), then unlock. */
static void *holder_main(void *arg)
{
    struct call *k = arg;
    int one = 1;
    if (cerb_lock_lock(k->l) != CERB_OK || !wait_until(entered_pred, &one, 3000)) {
        k->st = CERB_EIO;
    } else {
        int64_t t0 = cerb_test_now_ms();
        k->st = cerb_lock_unlock(k->l); /* used to wait for the callback */
        if (cerb_test_now_ms() - t0 > 1000)
            k->st = CERB_TIMEOUT;
    }
    atomic_store(&k->done, 1);
    return NULL;
}

/* unlock() of a lost hold while its lost callback waits for a mutex the
 * application holds around the unlock: unlock returns, and another hold of
 * the client goes on being renewed meanwhile. */
static void test_unlock_while_lost_callback_blocks(void **state)
{
    (void)state;
    reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, NULL), CERB_OK);
    cerb_lock *a = mk(c, "cb-lost-a", 150, 0); /* not renewed: LOST at its deadline */
    cerb_lock *b = mk(c, "cb-lost-b", 300, 1); /* renewed every 100 ms */
    assert_int_equal(cerb_lock_on_lost(a, blocking_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(b), CERB_OK);

    pthread_mutex_lock(&app_mu);
    struct call k = {.l = a};
    assert_int_equal(pthread_create(&k.t, NULL, holder_main, &k), 0);
    bool unlocked = wait_until(call_done, &k, 4000);
    bool b_valid = stays_valid(b, 1000);
    pthread_mutex_unlock(&app_mu);
    pthread_join(k.t, NULL);

    assert_true(unlocked);
    assert_int_equal(k.st, CERB_LOST);
    assert_true(b_valid);
    int one = 1;
    assert_true(wait_until(returned_pred, &one, 3000));
    assert_int_equal(atomic_load(&entered), 1); /* exactly once */
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    cerb_lock_free(a);
    cerb_lock_free(b);
    cerb_client_close(c);
}

static const char *TWO = "engines = (\"local\", \"fault\");\n"
                         "failover = { switch_grace_ms = 0; };\n";

/* A switch callback that blocks: the switch returns, locks and renewals go
 * on, close returns with the callback still blocked, and a lost callback
 * queued behind it is never called once close has returned. */
static void test_switch_callback_blocks(void **state)
{
    (void)state;
    reset();
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, TWO), CERB_OK);
    assert_string_equal(cerb_engine_current(c), "local");
    assert_int_equal(cerb_client_on_switch(c, blocking_switch, NULL), CERB_OK);
    cerb_lock *b = mk(c, "cb-sw-b", 300, 1);
    cerb_lock *d = mk(c, "cb-sw-d", 150, 0);
    cerb_lock *e = mk(c, "cb-sw-e", 0, -1);
    assert_int_equal(cerb_lock_on_lost(d, count_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(b), CERB_OK);

    pthread_mutex_lock(&app_mu);
    struct call sw = {.c = c, .engine = "fault"};
    assert_int_equal(pthread_create(&sw.t, NULL, switch_main, &sw), 0);
    bool switched = wait_until(call_done, &sw, 1000);
    int one = 1;
    bool cb_started = wait_until(entered_pred, &one, 3000);
    /* The client keeps working while the callback is blocked. */
    bool lock_ok = cerb_lock_trylock(e) == CERB_OK;
    bool unlock_ok = lock_ok && cerb_lock_unlock(e) == CERB_OK;
    bool b_valid = stays_valid(b, 1000);
    /* A loss while the callback thread is busy is queued behind it... */
    bool d_locked = cerb_lock_lock(d) == CERB_OK;
    bool d_lost = d_locked && wait_until(is_lost, d, 2000);
    /* ...and close returns without waiting for the blocked callback. */
    struct call cl = {.c = c};
    bool closed = false;
    if (switched) {
        assert_int_equal(pthread_create(&cl.t, NULL, close_main, &cl), 0);
        closed = wait_until(call_done, &cl, 2000);
    }
    pthread_mutex_unlock(&app_mu);
    pthread_join(sw.t, NULL);

    assert_true(switched);
    assert_true(cb_started);
    assert_true(lock_ok && unlock_ok);
    assert_true(b_valid);
    assert_true(d_locked && d_lost);
    assert_true(closed);
    pthread_join(cl.t, NULL);
    assert_true(wait_until(returned_pred, &one, 3000));
    /* The queued lost callback was dropped by close: give the callback
     * thread time to (wrongly) run it. */
    int64_t end = cerb_test_now_ms() + 300;
    while (cerb_test_now_ms() < end)
        assert_int_equal(atomic_load(&other_lost), 0);
    assert_int_equal(atomic_load(&entered), 1);
}

/* Freeing a handle whose lost callback is queued: the callback is skipped;
 * the application may free what the callback would have used. */
static void test_free_skips_queued_lost_callback(void **state)
{
    (void)state;
    reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, NULL), CERB_OK);
    cerb_lock *a = mk(c, "cb-free-a", 150, 0);
    cerb_lock *d = mk(c, "cb-free-d", 150, 0);
    assert_int_equal(cerb_lock_on_lost(a, blocking_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_on_lost(d, count_lost, NULL), CERB_OK);
    pthread_mutex_lock(&app_mu);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    int one = 1;
    bool started = wait_until(entered_pred, &one, 3000);
    bool d_locked = cerb_lock_lock(d) == CERB_OK;
    bool d_lost = d_locked && wait_until(is_lost, d, 2000);
    cerb_status fd = cerb_lock_free(d); /* its callback is still queued */
    cerb_status fa = cerb_lock_free(a); /* its callback is running */
    pthread_mutex_unlock(&app_mu);
    assert_true(started && d_locked && d_lost);
    assert_int_equal(fd, CERB_OK);
    assert_int_equal(fa, CERB_OK);
    assert_true(wait_until(returned_pred, &one, 3000));
    int64_t end = cerb_test_now_ms() + 200;
    while (cerb_test_now_ms() < end)
        assert_int_equal(atomic_load(&other_lost), 0);
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unlock_while_lost_callback_blocks),
        cmocka_unit_test(test_switch_callback_blocks),
        cmocka_unit_test(test_free_skips_queued_lost_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
