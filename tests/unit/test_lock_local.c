/*
 * test_lock_local.c — the lock core on the in-process "local" engine:
 * reentrancy, exclusion, try/timed/interruptible acquisition, fencing,
 * renewal and loss, handle lifetime, multi-lock, bad input.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cerberus.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll pred until true or timeout_ms: a bounded wait, not a sleep. */
static int wait_for(int (*pred)(void *), void *ud, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        if (pred(ud))
            return 1;
        nap(2);
    }
    return pred(ud);
}

static int setup(void **state)
{
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, NULL), CERB_OK);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    cerb_client_close(*state);
    return 0;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
    return l;
}

static void test_reentrant(void **state)
{
    cerb_lock *l = mk(*state, "reentrant");
    assert_string_equal(cerb_engine_current(*state), "local");
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_FREE);
    assert_int_equal(cerb_lock_fencing_token(l), 0);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    uint64_t f = cerb_lock_fencing_token(l);
    assert_true(f > 0);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(l, 10), CERB_OK);
    assert_int_equal(cerb_lock_hold_count(l), 3);
    assert_int_equal(cerb_lock_fencing_token(l), f); /* same grant */
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_hold_count(l), 1);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_hold_count(l), 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_NOT_OWNER);
    assert_int_equal(cerb_lock_free(l), CERB_OK);
}

static void test_fence_increases(void **state)
{
    cerb_lock *l = mk(*state, "fence");
    uint64_t last = 0;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(cerb_lock_lock(l), CERB_OK);
        uint64_t f = cerb_lock_fencing_token(l);
        assert_true(f > last);
        assert_int_equal(f >> 48, 1); /* default epoch */
        last = f;
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    cerb_lock_free(l);
}

struct other {
    cerb_lock *l;
    cerb_status st;
    int64_t wait_ms;
    int mode; /* 0 trylock, 1 trylock_for, 2 interruptibly, 3 unlock, 4 lock+hold */
    atomic_int started, done, release;
};

static void *other_main(void *arg)
{
    struct other *o = arg;
    atomic_store(&o->started, 1);
    switch (o->mode) {
    case 0: o->st = cerb_lock_trylock(o->l); break;
    case 1: o->st = cerb_lock_trylock_for(o->l, o->wait_ms); break;
    case 2: o->st = cerb_lock_lock_interruptibly(o->l); break;
    case 3: o->st = cerb_lock_unlock(o->l); break;
    case 4:
        o->st = cerb_lock_lock(o->l);
        atomic_store(&o->done, 1);
        while (!atomic_load(&o->release))
            nap(1);
        cerb_lock_unlock(o->l);
        return NULL;
    }
    if (o->st == CERB_OK && o->mode != 3)
        cerb_lock_unlock(o->l);
    atomic_store(&o->done, 1);
    return NULL;
}

static cerb_status in_other(cerb_lock *l, int mode, int64_t wait_ms)
{
    struct other o = {.l = l, .mode = mode, .wait_ms = wait_ms};
    pthread_t t;
    pthread_create(&t, NULL, other_main, &o);
    pthread_join(t, NULL);
    return o.st;
}

static void test_exclusion_semantics(void **state)
{
    cerb_lock *l = mk(*state, "excl");
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(in_other(l, 0, 0), CERB_BUSY);
    int64_t t0 = now_ms();
    assert_int_equal(in_other(l, 1, 80), CERB_TIMEOUT);
    assert_true(now_ms() - t0 >= 75);
    assert_int_equal(in_other(l, 1, 0), CERB_TIMEOUT);
    assert_int_equal(in_other(l, 3, 0), CERB_NOT_OWNER);
    /* A second handle on the same name in another thread is excluded too. */
    cerb_lock *l2 = mk(*state, "excl");
    assert_int_equal(in_other(l2, 0, 0), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(in_other(l2, 0, 0), CERB_OK);
    cerb_lock_free(l2);
    cerb_lock_free(l);
}

static int is_done(void *ud) { return atomic_load(&((struct other *)ud)->done); }

static void test_interrupt(void **state)
{
    cerb_lock *l = mk(*state, "intr");
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    struct other o = {.l = l, .mode = 2};
    pthread_t t;
    pthread_create(&t, NULL, other_main, &o);
    /* It must still be waiting after a while, then wake on interrupt. */
    assert_false(wait_for(is_done, &o, 100));
    assert_int_equal(cerb_lock_interrupt(l), CERB_OK);
    assert_true(wait_for(is_done, &o, 2000));
    pthread_join(t, NULL);
    assert_int_equal(o.st, CERB_INTERRUPTED);
    /* Pending interrupt with nobody waiting: the next wait returns at once. */
    assert_int_equal(cerb_lock_interrupt(l), CERB_OK);
    assert_int_equal(in_other(l, 1, 5000), CERB_INTERRUPTED);
    assert_int_equal(in_other(l, 1, 20), CERB_TIMEOUT); /* consumed once */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
}

/* Counter incremented under the lock by several threads: no lost update,
 * never two inside at once. */
struct mx {
    cerb_client *c;
    atomic_int inside;
    int counter;
    int overlap;
};

static void *mx_main(void *arg)
{
    struct mx *m = arg;
    cerb_lock *l = NULL;
    if (cerb_lock_new(m->c, "mutex", NULL, &l) != CERB_OK)
        return NULL;
    for (int i = 0; i < 300; i++) {
        if (cerb_lock_lock(l) != CERB_OK)
            continue;
        if (atomic_fetch_add(&m->inside, 1) != 0)
            m->overlap++;
        int v = m->counter;
        m->counter = v + 1;
        atomic_fetch_sub(&m->inside, 1);
        cerb_lock_unlock(l);
    }
    cerb_lock_free(l);
    return NULL;
}

static void test_mutual_exclusion_threads(void **state)
{
    struct mx m = {.c = *state};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, mx_main, &m);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(m.counter, 1200);
    assert_int_equal(m.overlap, 0);
}

/* Two clients in one process exclude each other as two processes would. */
static void test_two_clients(void **state)
{
    cerb_client *c2 = NULL;
    assert_int_equal(cerb_client_open(&c2, NULL), CERB_OK);
    cerb_lock *a = mk(*state, "two-clients"), *b = mk(c2, "two-clients");
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(a);
    assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_true(cerb_lock_fencing_token(b) > fa);
    cerb_lock_free(b); /* releases the calling thread's hold */
    assert_int_equal(cerb_lock_trylock(a), CERB_OK);
    cerb_lock_free(a);
    cerb_client_close(c2);
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    atomic_fetch_add(&lost_calls, 1);
    atomic_store((atomic_int *)ud, 1); /* read by the test's thread */
}
static int int_set(void *ud) { return atomic_load((atomic_int *)ud) != 0; }

static void test_lease_expires_without_renewal(void **state)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 150;
    o.renew = 0;
    cerb_lock *l = NULL;
    atomic_int flag = 0;
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_new(*state, "lease", &o, &l), CERB_OK);
    assert_int_equal(cerb_lock_on_lost(l, on_lost, &flag), CERB_OK);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_true(wait_for(int_set, &flag, 3000));
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_LOST);
    assert_int_equal(cerb_lock_trylock(l), CERB_LOST); /* reentry refused */
    assert_int_equal(cerb_lock_unlock(l), CERB_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1); /* exactly once */
    cerb_lock_free(l);
}

static void test_renewal_keeps_lock(void **state)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 150;
    o.renew = 1;
    cerb_lock *l = NULL;
    int flag = 0;
    assert_int_equal(cerb_lock_new(*state, "renewed", &o, &l), CERB_OK);
    assert_int_equal(cerb_lock_on_lost(l, on_lost, &flag), CERB_OK);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    /* Four leases long, another thread keeps finding it busy. */
    int64_t end = now_ms() + 600;
    while (now_ms() < end) {
        assert_int_equal(in_other(l, 0, 0), CERB_BUSY);
        nap(20);
    }
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    assert_int_equal(flag, 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
}

static void test_free_busy_when_other_thread_holds(void **state)
{
    cerb_lock *l = mk(*state, "free-busy");
    struct other o = {.l = l, .mode = 4};
    pthread_t t;
    pthread_create(&t, NULL, other_main, &o);
    assert_true(wait_for(is_done, &o, 2000));
    assert_int_equal(cerb_lock_free(l), CERB_BUSY);
    atomic_store(&o.release, 1);
    pthread_join(t, NULL);
    assert_int_equal(cerb_lock_free(l), CERB_OK);
    assert_int_equal(cerb_lock_free(NULL), CERB_OK);
}

static void test_bad_input(void **state)
{
    cerb_client *c = *state;
    cerb_lock *l = (cerb_lock *)0x1;
    char big[300];
    memset(big, 'a', sizeof big);
    big[256] = '\0';
    assert_int_equal(cerb_lock_new(c, NULL, NULL, &l), CERB_EINVAL);
    assert_null(l);
    assert_int_equal(cerb_lock_new(c, "", NULL, &l), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "empty"));
    assert_int_equal(cerb_lock_new(c, big, NULL, &l), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "255"));
    big[255] = '\0';
    assert_int_equal(cerb_lock_new(c, big, NULL, &l), CERB_OK); /* 255 is fine */
    cerb_lock_free(l);
    assert_int_equal(cerb_lock_new(c, "a\nb", NULL, &l), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "control"));
    assert_int_equal(cerb_lock_new(NULL, "x", NULL, &l), CERB_EINVAL);
    assert_int_equal(cerb_lock_new(c, "x", NULL, NULL), CERB_EINVAL);
    cerb_lock_opts o = {50, -1, -1};
    assert_int_equal(cerb_lock_new(c, "x", &o, &l), CERB_EINVAL);
    o = (cerb_lock_opts){0, 2, -1};
    assert_int_equal(cerb_lock_new(c, "x", &o, &l), CERB_EINVAL);
    assert_int_equal(cerb_lock_lock(NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_trylock(NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_unlock(NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_interrupt(NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_fencing_token(NULL), 0);
    assert_int_equal(cerb_lock_state(NULL), CERB_LOCK_FREE);
    assert_null(cerb_engine_current(NULL));
    assert_null(cerb_engine_switch_to(c, "nope"));
    assert_non_null(strstr(cerb_last_error(), "not configured"));
    assert_string_equal(cerb_engine_switch(c), "local");
    assert_int_equal(cerb_client_open(NULL, NULL), CERB_EINVAL);
    assert_int_equal(cerb_multilock_lock(NULL, 2, 0), CERB_EINVAL);
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, NULL, &info), CERB_OK);
    assert_string_equal(info.name, "local");
    assert_int_equal(cerb_engine_info(c, "zz", &info), CERB_EINVAL);
}

static void test_multilock(void **state)
{
    cerb_client *c = *state;
    cerb_lock *a = mk(c, "m-a"), *b = mk(c, "m-b"), *cc = mk(c, "m-c");
    cerb_lock *set[] = {cc, a, b};
    assert_int_equal(cerb_multilock_lock(set, 3, 100), CERB_OK);
    assert_int_equal(cerb_lock_hold_count(a), 1);
    assert_int_equal(cerb_lock_hold_count(cc), 1);
    assert_int_equal(cerb_multilock_unlock(set, 3), CERB_OK);
    /* One of them busy elsewhere: none is kept. */
    struct other o = {.l = b, .mode = 4};
    pthread_t t;
    pthread_create(&t, NULL, other_main, &o);
    assert_true(wait_for(is_done, &o, 2000));
    assert_int_equal(cerb_multilock_lock(set, 3, 0), CERB_BUSY);
    assert_int_equal(cerb_multilock_lock(set, 3, 50), CERB_TIMEOUT);
    assert_int_equal(cerb_lock_hold_count(a), 0);
    assert_int_equal(cerb_lock_hold_count(cc), 0);
    atomic_store(&o.release, 1);
    pthread_join(t, NULL);
    cerb_lock_free(a);
    cerb_lock_free(b);
    cerb_lock_free(cc);
}

static void test_close_releases(void **state)
{
    cerb_client *c2 = NULL;
    assert_int_equal(cerb_client_open(&c2, NULL), CERB_OK);
    cerb_lock *b = mk(c2, "close-releases");
    assert_int_equal(cerb_lock_lock(b), CERB_OK);
    cerb_client_close(c2); /* frees b and releases its hold */
    cerb_lock *a = mk(*state, "close-releases");
    assert_int_equal(cerb_lock_trylock(a), CERB_OK);
    cerb_lock_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reentrant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fence_increases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exclusion_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mutual_exclusion_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease_expires_without_renewal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_renewal_keeps_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_busy_when_other_thread_holds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multilock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_releases, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
