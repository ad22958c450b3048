/*
 * test_rwlock_local.c — read-write locks (core/rwlock.c) on the in-process
 * local engine: readers together, a writer alone, first come first served
 * (a reader behind a waiting writer waits: no writer starves), reentrancy
 * per thread, reads inside the thread's write, the refused upgrade,
 * fences, inspection, the lost callback of a suspended holder, bad input.
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "test_util.h"

static cerb_client *open_local(void)
{
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"local\");\n"), CERB_OK);
    return c;
}

static cerb_rwlock *rwl(cerb_client *c, const char *name)
{
    cerb_rwlock *rw = NULL;
    assert_int_equal(cerb_rwlock_new(c, name, NULL, &rw), CERB_OK);
    return rw;
}

struct members {
    cerb_client *c;
    const char *name;
    size_t holders, waiters;
};

static bool members_are(void *ud)
{
    struct members *m = ud;
    cerb_holder_info *v = NULL;
    size_t n = 0, h = 0, w = 0;
    if (cerb_inspect(m->c, CERB_KIND_RWLOCK, m->name, NULL, &v, &n) != CERB_OK)
        return false;
    for (size_t i = 0; i < n; i++)
        *(v[i].waiting ? &w : &h) += 1;
    cerb_holders_free(v, n);
    return h == m->holders && w == m->waiters;
}

static void expect_members(cerb_client *c, const char *name, size_t holders, size_t waiters)
{
    struct members m = {c, name, holders, waiters};
    assert_true(wait_until(members_are, &m, 5000));
}

struct job {
    cerb_rwlock *rw;
    bool write;
    cerb_status st;
    atomic_int done;
    atomic_int release; /* set: unlock and leave */
    uint64_t fence;
};

static bool job_done(void *ud)
{
    return atomic_load(&((struct job *)ud)->done) != 0;
}

static bool job_released(void *ud)
{
    return atomic_load(&((struct job *)ud)->release) != 0;
}

static void *job_main(void *arg)
{
    struct job *j = arg;
    j->st = j->write ? cerb_rwlock_write_trylock_for(j->rw, 5000)
                     : cerb_rwlock_read_trylock_for(j->rw, 5000);
    j->fence = cerb_rwlock_fencing_token(j->rw);
    atomic_store(&j->done, 1);
    if (j->st == CERB_OK) {
        wait_until(job_released, j, 10000);
        if (j->write)
            cerb_rwlock_write_unlock(j->rw);
        else
            cerb_rwlock_read_unlock(j->rw);
    }
    return NULL;
}

static void test_readers_share_writer_waits_in_order(void **state)
{
    (void)state;
    cerb_client *c = open_local(), *obs = open_local();
    cerb_rwlock *rw = rwl(c, "rw-order");
    struct job r1 = {.rw = rw}, w = {.rw = rw, .write = true}, r2 = {.rw = rw};
    pthread_t t1, tw, t2;
    pthread_create(&t1, NULL, job_main, &r1);
    assert_true(wait_until(job_done, &r1, 5000));
    assert_int_equal(r1.st, CERB_OK);
    pthread_create(&tw, NULL, job_main, &w);
    expect_members(obs, "rw-order", 1, 1);
    /* A reader arriving after the waiting writer waits for it. */
    pthread_create(&t2, NULL, job_main, &r2);
    expect_members(obs, "rw-order", 1, 2);
    assert_int_equal(atomic_load(&w.done), 0);
    assert_int_equal(atomic_load(&r2.done), 0);
    atomic_store(&r1.release, 1);
    pthread_join(t1, NULL);
    assert_true(wait_until(job_done, &w, 5000));
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.fence > r1.fence);
    expect_members(obs, "rw-order", 1, 1);
    assert_int_equal(atomic_load(&r2.done), 0);
    atomic_store(&w.release, 1);
    pthread_join(tw, NULL);
    assert_true(wait_until(job_done, &r2, 5000));
    assert_int_equal(r2.st, CERB_OK);
    assert_true(r2.fence > w.fence);
    atomic_store(&r2.release, 1);
    pthread_join(t2, NULL);
    expect_members(obs, "rw-order", 0, 0);
    assert_int_equal(cerb_rwlock_free(rw), CERB_OK);
    cerb_client_close(c);
    cerb_client_close(obs);
}

static void test_reentrancy_and_nesting(void **state)
{
    (void)state;
    cerb_client *c = open_local(), *c2 = open_local();
    cerb_rwlock *rw = rwl(c, "rw-reent"), *other = rwl(c2, "rw-reent");
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_FREE);
    assert_int_equal(cerb_rwlock_read_lock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_read_lock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_VALID);
    /* Another process reads too; nobody writes. */
    assert_int_equal(cerb_rwlock_read_trylock_for(other, 0), CERB_OK);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 0), CERB_EINVAL); /* upgrade */
    assert_int_equal(cerb_rwlock_read_unlock(other), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_VALID);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_NOT_OWNER);
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_FREE);

    assert_int_equal(cerb_rwlock_write_lock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_write_lock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_read_trylock_for(other, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_trylock_for(other, 0), CERB_BUSY);
    uint64_t f = cerb_rwlock_fencing_token(rw);
    assert_true(f > 0);
    assert_int_equal(cerb_rwlock_read_lock(rw), CERB_OK); /* inside our write */
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_EINVAL); /* a read is inside */
    assert_int_equal(cerb_rwlock_free(rw), CERB_BUSY);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_NOT_OWNER);
    assert_int_equal(cerb_rwlock_write_trylock_for(other, 0), CERB_OK);
    assert_true(cerb_rwlock_fencing_token(other) > f);
    char *m = NULL;
    assert_int_equal(cerb_metrics_text(c, &m), CERB_OK);
    /* One read hold (taken twice), one write hold (twice, a read nested). */
    assert_non_null(strstr(m, "cerberus_rwlock_holds_total{engine=\"local\",mode=\"read\"} 1\n"));
    assert_non_null(strstr(m, "cerberus_rwlock_holds_total{engine=\"local\",mode=\"write\"} 1\n"));
    cerb_free(m);
    assert_int_equal(cerb_rwlock_write_unlock(other), CERB_OK);
    assert_int_equal(cerb_rwlock_free(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_free(other), CERB_OK);
    cerb_client_close(c);
    cerb_client_close(c2);
}

static void on_lost(cerb_rwlock *rw, void *ud)
{
    (void)rw;
    atomic_fetch_add((atomic_int *)ud, 1);
}

static bool told(void *ud)
{
    return atomic_load((atomic_int *)ud) > 0;
}

/* A read hold whose lease ran out while the machine slept is lost, and
 * the handle's callback told once; the unlock then says CERB_LOST. */
static void test_lost_is_told(void **state)
{
    (void)state;
    cerb_client *c = open_local(), *c2 = open_local();
    cerb_rwlock_opts o = CERB_RWLOCK_OPTS_INIT;
    o.lease_ms = 3000;
    cerb_rwlock *rw = NULL, *w = rwl(c2, "rw-lost");
    assert_int_equal(cerb_rwlock_new(c, "rw-lost", &o, &rw), CERB_OK);
    atomic_int n = 0;
    assert_int_equal(cerb_rwlock_on_lost(rw, on_lost, &n), CERB_OK);
    assert_int_equal(cerb_rwlock_read_lock(rw), CERB_OK);
    cerb_holder_info *v = NULL;
    size_t k = 0;
    assert_int_equal(cerb_inspect(c2, CERB_KIND_RWLOCK, "rw-lost", NULL, &v, &k), CERB_OK);
    assert_int_equal(k, 1);
    assert_string_equal(v[0].detail, "read");
    cerb_holders_free(v, k);
    assert_int_equal(cerb_rwlock_free(rw), CERB_BUSY);

    cerb__clock_test_suspend(5000); /* asleep longer than the lease */
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_LOST);
    assert_true(wait_until(told, &n, 2000));
    /* The writer of another client gets the name. */
    assert_int_equal(cerb_rwlock_write_trylock_for(w, 2000), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_LOST);
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_FREE);
    assert_int_equal(atomic_load(&n), 1);
    assert_int_equal(cerb_rwlock_write_unlock(w), CERB_OK);
    assert_int_equal(cerb_rwlock_free(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_free(w), CERB_OK);
    cerb_client_close(c);
    cerb_client_close(c2);
}

/* A read inside the thread's write that was lost is not a success. */
static void test_read_inside_lost_write(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_rwlock_opts o = CERB_RWLOCK_OPTS_INIT;
    o.lease_ms = 3000;
    cerb_rwlock *rw = NULL;
    assert_int_equal(cerb_rwlock_new(c, "rw-lostw", &o, &rw), CERB_OK);
    assert_int_equal(cerb_rwlock_write_lock(rw), CERB_OK);
    cerb__clock_test_suspend(5000);
    assert_int_equal(cerb_rwlock_state(rw), CERB_LOCK_LOST);
    assert_int_equal(cerb_rwlock_read_lock(rw), CERB_LOST);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_LOST);
    assert_int_equal(cerb_rwlock_free(rw), CERB_OK);
    cerb_client_close(c);
}

/* Writers of one process each queue on the server too (review finding:
 * a shared writer handle kept the second writer in the local line, and a
 * later reader of the process overtook it); the handle cannot be freed
 * while a thread waits in it. */
static void test_writers_of_one_process_queue_in_order(void **state)
{
    (void)state;
    cerb_client *c = open_local(), *obs = open_local();
    cerb_rwlock *rw = rwl(c, "rw-proc");
    struct job w1 = {.rw = rw, .write = true}, w2 = {.rw = rw, .write = true}, r = {.rw = rw};
    pthread_t t1, t2, tr;
    pthread_create(&t1, NULL, job_main, &w1);
    assert_true(wait_until(job_done, &w1, 5000));
    assert_int_equal(w1.st, CERB_OK);
    pthread_create(&t2, NULL, job_main, &w2);
    expect_members(obs, "rw-proc", 1, 1); /* the second writer is on the server */
    assert_int_equal(cerb_rwlock_free(rw), CERB_BUSY);
    pthread_create(&tr, NULL, job_main, &r);
    expect_members(obs, "rw-proc", 1, 2);
    atomic_store(&w1.release, 1);
    pthread_join(t1, NULL);
    assert_true(wait_until(job_done, &w2, 5000));
    assert_int_equal(w2.st, CERB_OK);
    assert_int_equal(atomic_load(&r.done), 0); /* behind the second writer */
    atomic_store(&w2.release, 1);
    pthread_join(t2, NULL);
    assert_true(wait_until(job_done, &r, 5000));
    assert_int_equal(r.st, CERB_OK);
    assert_true(r.fence > w2.fence && w2.fence > w1.fence);
    atomic_store(&r.release, 1);
    pthread_join(tr, NULL);
    assert_int_equal(cerb_rwlock_free(rw), CERB_OK);
    cerb_client_close(c);
    cerb_client_close(obs);
}

static void test_bad_input(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_rwlock *rw = NULL;
    assert_int_equal(cerb_rwlock_new(c, NULL, NULL, &rw), CERB_EINVAL);
    assert_int_equal(cerb_rwlock_new(c, "", NULL, &rw), CERB_EINVAL);
    assert_int_equal(cerb_rwlock_new(c, "x", NULL, NULL), CERB_EINVAL);
    assert_int_equal(cerb_rwlock_read_lock(NULL), CERB_EINVAL);
    assert_int_equal(cerb_rwlock_write_unlock(NULL), CERB_EINVAL);
    rw = rwl(c, "rw-bad");
    assert_int_equal(cerb_rwlock_read_trylock_for(rw, -1), CERB_EINVAL);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, -2), CERB_EINVAL);
    assert_int_equal(cerb_rwlock_free(rw), CERB_OK);
    assert_int_equal(cerb_rwlock_free(NULL), CERB_OK);
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readers_share_writer_waits_in_order),
        cmocka_unit_test(test_reentrancy_and_nesting),
        cmocka_unit_test(test_lost_is_told),
        cmocka_unit_test(test_read_inside_lost_write),
        cmocka_unit_test(test_writers_of_one_process_queue_in_order),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
