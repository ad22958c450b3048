/*
 * test_redis_handoff_gate.c — a fair hand-off on Redis while another engine
 * is gated (the configuration pins redis, so every grant is confirmed with
 * the engine switched from: a question, then a claim there). Redis hands
 * the name to the head waiter under a short lease (PX 2000) which the new
 * holder extends; with the gated engine slow, the confirmation used to run
 * before that extension, past the 2 s: a laggard that does not consult
 * (a client on redis alone) was granted the name, and the waiter's
 * trylock_for still returned CERB_OK with the lower fence (issue 22,
 * finding 2; §5a.1 and §5a.2). The gated engine is "faultheld", the local
 * engine with its calls slowed on demand (tests/support/fault_engine.h).
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
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "fault_engine.h"
#include "test_util.h"

#define SLOW_MS 1500 /* each confirmation step: 3 s for both, past the 2 s */

static cerb_client *gated_client(void)
{
    char text[1024];
    snprintf(text, sizeof text,
             "engines = (\"redis\", \"faultheld\");\n"
             "active = \"redis\";\n"
             "lock = { lease_ms = 10000; fair = true; };\n"
             "failover = { watch_config = false; };\n"
             "redis = { host = \"127.0.0.1\"; port = %d; op_timeout_ms = 4000; };\n",
             cerb_test_redis_port());
    cerb_client *c = cerb_test_open(text);
    assert_non_null(c);
    assert_string_equal(cerb_engine_current(c), "redis");
    return c;
}

struct waiter {
    cerb_lock *l;
    int64_t wait_ms;
    cerb_status st, unlock_st;
    uint64_t fence;
    int state;
    int64_t took_ms;
    atomic_bool returned; /* trylock_for returned */
    atomic_bool release;  /* the main thread has looked: unlock now */
};

static bool may_release(void *ud) { return atomic_load(&((struct waiter *)ud)->release); }

/* A hold is its thread's: this thread takes it and gives it back. */
static void *wait_for_it(void *ud)
{
    struct waiter *w = ud;
    int64_t t0 = cerb_test_now_ms();
    w->st = cerb_lock_trylock_for(w->l, w->wait_ms);
    w->took_ms = cerb_test_now_ms() - t0;
    if (w->st == CERB_OK) {
        w->fence = cerb_lock_fencing_token(w->l);
        w->state = (int)cerb_lock_state(w->l);
    } else {
        w->state = (int)cerb_lock_state(w->l);
    }
    atomic_store(&w->returned, true);
    wait_until(may_release, w, 30000);
    w->unlock_st = w->st == CERB_OK ? cerb_lock_unlock(w->l) : CERB_OK;
    return NULL;
}

struct inspect_ud {
    cerb_client *c;
    const char *name;
};

static bool has_waiter(void *ud)
{
    struct inspect_ud *u = ud;
    cerb_holder_info *v = NULL;
    size_t n = 0;
    bool yes = false;
    if (cerb_lock_inspect(u->c, u->name, "redis", &v, &n) == CERB_OK)
        for (size_t i = 0; i < n; i++)
            yes = yes || v[i].waiting;
    cerb_holders_free(v, n);
    return yes;
}

/* The hand-off to a waiter whose grant needs a slow confirmation: no
 * laggard is granted the name while the waiter comes to hold it, and the
 * waiter either holds it (VALID, a fence above the holder's) or reports
 * that it does not — never OK over another holder. */
static void handoff_with_slow_gate(int64_t wait_ms, cerb_status want)
{
    fault_engine_register();
    fault_engine_reset();
    char *name = test_name("hgate");
    cerb_client *b = gated_client();
    char *lagcfg = cerb_test_redis_config(NULL, "lock = { lease_ms = 10000; fair = true; };");
    /* Clients on redis alone, which ask nobody: the holder (so that the
     * gated engine holds no claim and the waiter's question passes) and
     * the laggard, the process that did not switch. */
    cerb_client *a = cerb_test_open(lagcfg), *lag = cerb_test_open(lagcfg);
    free(lagcfg);
    assert_non_null(a);
    assert_non_null(lag);
    cerb_lock *la = cerb_test_handle(a, name), *lb = cerb_test_handle(b, name),
              *ll = cerb_test_handle(lag, name);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(la);

    struct waiter w = {.l = lb, .wait_ms = wait_ms};
    atomic_init(&w.returned, false);
    atomic_init(&w.release, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for_it, &w), 0);
    struct inspect_ud iu = {a, name};
    assert_wait_until(has_waiter, &iu, 5000);

    /* The gated engine turns slow, then the holder hands the name over. */
    fault_engine_delay(FAULT_CHECK, SLOW_MS, false);
    fault_engine_delay(FAULT_ACQUIRE, SLOW_MS, false);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    int64_t t0 = cerb_test_now_ms();

    /* The laggard tries all along (time itself is under test). */
    bool lag_holds = false;
    int64_t lag_at = 0;
    uint64_t fl = 0;
    while (!atomic_load(&w.returned) && cerb_test_now_ms() < t0 + wait_ms + 10000) {
        if (!lag_holds && cerb_lock_trylock(ll) == CERB_OK) {
            lag_holds = true;
            lag_at = cerb_test_now_ms() - t0;
            fl = cerb_lock_fencing_token(ll);
        }
        cerb_test_let_time_pass(20);
    }
    fault_engine_delay(FAULT_CHECK, 0, false);
    fault_engine_delay(FAULT_ACQUIRE, 0, false);
    atomic_store(&w.release, true);
    assert_int_equal(pthread_join(t, NULL), 0);
    print_message("waiter: %s after %lld ms (fence %llu, holder's %llu); laggard %s%s%lld ms\n",
                  cerb_status_name(w.st), (long long)w.took_ms, (unsigned long long)w.fence,
                  (unsigned long long)fa, lag_holds ? "granted" : "never granted",
                  lag_holds ? " at " : ", ", (long long)(cerb_test_now_ms() - t0));
    if (w.st == CERB_OK && lag_holds)
        fail_msg("two holders: the waiter returned OK (fence %llu, state %d) while the laggard "
                 "held the name since %lld ms (fence %llu)", (unsigned long long)w.fence,
                 w.state, (long long)lag_at, (unsigned long long)fl);
    if (w.st != want)
        fail_msg("the waiter got %s, expected %s", cerb_status_name(w.st), cerb_status_name(want));
    if (w.st == CERB_OK) {
        assert_int_equal(w.state, CERB_LOCK_VALID);
        assert_true(w.fence > fa);
        assert_int_equal(w.unlock_st, CERB_OK);
    } else {
        /* Not granted in time: it must say so, never hold on. */
        assert_int_equal(w.st, CERB_TIMEOUT);
        assert_int_equal(w.state, CERB_LOCK_FREE);
    }
    if (lag_holds)
        assert_int_equal(cerb_lock_unlock(ll), CERB_OK);
    /* The wait is kept: no confirmation step starts after it, so it ends
     * at most one step (an operation timeout) late. */
    assert_true(w.took_ms <= wait_ms + SLOW_MS + 1000);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_lock_free(ll);
    cerb_client_close(lag);
    cerb_client_close(b);
    cerb_client_close(a);
    free(name);
}

static void test_handoff_lease_outlives_slow_confirmation(void **state)
{
    (void)state;
    handoff_with_slow_gate(15000, CERB_OK);
}

/* A wait that runs out during the confirmation's second step (the claim,
 * begun before it ran out): the grant is returned, with its lease extended. */
static void test_slow_confirmation_keeps_the_wait(void **state)
{
    (void)state;
    handoff_with_slow_gate(2000, CERB_OK);
}

/* A wait that runs out during the first step (the question): no further
 * step starts, the grant is given back (released in the background) and
 * the waiter is told CERB_TIMEOUT, holding nothing. */
static void test_wait_ends_during_confirmation(void **state)
{
    (void)state;
    handoff_with_slow_gate(1000, CERB_TIMEOUT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handoff_lease_outlives_slow_confirmation),
        cmocka_unit_test(test_slow_confirmation_keeps_the_wait),
        cmocka_unit_test(test_wait_ends_during_confirmation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
