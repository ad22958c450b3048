/*
 * test_etcd_rwlock.c — read-write locks on the etcd engine (etcd_queue.c,
 * etcd_rwlock.c), against the suite's etcd:
 *  - the layout on the wire: <prefix>/rwlock/<name>/read/<token> and
 *    .../write/<token>, value "<offset>", fence = create revision + offset;
 *    a lock and a semaphore of the same name are other things;
 *  - first come, first served: readers share, a writer waits for them, a
 *    reader behind a waiting writer waits; inspect lists holders then
 *    waiters with "read" / "write";
 *  - a holder whose lease is revoked lets the next in; a waiter whose
 *    session is revoked while it waits queues again and is not granted
 *    while the holder holds (etcd#16221); a dead waiter's key blocks only
 *    until its lease ends;
 *  - timed-out attempts leave nothing behind.
 * No peer runs here (the Go recipe is not packaged as a tool).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "etcd_queue_util.h"
#include "etcd_util.h"
#include "test_util.h"

#define FENCE_LOW(f) ((f) & ((UINT64_C(1) << 48) - 1))

static cerb_client *open_client(void)
{
    char *cfg = etcd_test_config(NULL, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_rwlock *rwl(cerb_client *c, const char *name)
{
    cerb_rwlock *rw = NULL;
    if (cerb_rwlock_new(c, name, NULL, &rw) != CERB_OK)
        fail_msg("rwlock_new: %s", cerb_last_error());
    return rw;
}

static void qprefix(const char *name, char *p, size_t n)
{
    snprintf(p, n, "/rwlock/%s/", name);
}

static void expect_keys(const char *name, int n)
{
    char p[300];
    qprefix(name, p, sizeof p);
    struct qu_count c = {p, n};
    assert_wait_until(qu_count_is, &c, 5000);
}

static void expect_members(cerb_client *c, const char *name, size_t holders, size_t waiters)
{
    struct qu_members m = {c, CERB_KIND_RWLOCK, name, holders, waiters};
    assert_wait_until(qu_members_are, &m, 5000);
}

struct job {
    cerb_rwlock *rw;
    bool write;
    int64_t wait_ms;
    cerb_status st;
    uint64_t fence;
    int64_t at;
    atomic_int done;
    atomic_int release;
};

static bool job_done(void *ud) { return atomic_load(&((struct job *)ud)->done) != 0; }
static bool job_released(void *ud) { return atomic_load(&((struct job *)ud)->release) != 0; }

static void *job_main(void *arg)
{
    struct job *j = arg;
    j->st = j->write ? cerb_rwlock_write_trylock_for(j->rw, j->wait_ms)
                     : cerb_rwlock_read_trylock_for(j->rw, j->wait_ms);
    j->fence = cerb_rwlock_fencing_token(j->rw);
    j->at = cerb_test_now_ms();
    atomic_store(&j->done, 1);
    if (j->st == CERB_OK) {
        wait_until(job_released, j, 30000);
        if (j->write)
            cerb_rwlock_write_unlock(j->rw);
        else
            cerb_rwlock_read_unlock(j->rw);
    }
    return NULL;
}

static void test_layout_on_the_wire(void **state)
{
    (void)state;
    char *name = test_name("rw-wire");
    char p[300], want[400];
    qprefix(name, p, sizeof p);
    cerb_client *a = open_client(), *b = open_client();
    cerb_rwlock *ra = rwl(a, name), *rb = rwl(b, name);
    assert_int_equal(cerb_rwlock_read_lock(ra), CERB_OK);
    assert_int_equal(cerb_rwlock_read_lock(rb), CERB_OK);
    struct qu_kv kv[4];
    assert_int_equal(qu_keys(p, kv, 4), 2);
    int64_t off = etcd_test_fence_offset(etcd_test_port(), "");
    char o[32];
    snprintf(o, sizeof o, "%lld", (long long)off);
    for (int i = 0; i < 2; i++) {
        snprintf(want, sizeof want, "%sread/", p);
        assert_memory_equal(kv[i].key, want, strlen(want));
        assert_int_equal(strlen(kv[i].key + strlen(want)), 32); /* the owner token */
        assert_string_equal(kv[i].value, o);
        assert_true(kv[i].lease != 0);
    }
    assert_int_equal(FENCE_LOW(cerb_rwlock_fencing_token(ra)),
                     (uint64_t)(kv[0].create_revision + off));
    assert_int_equal(FENCE_LOW(cerb_rwlock_fencing_token(rb)),
                     (uint64_t)(kv[1].create_revision + off));
    /* A lock and a semaphore of the same name are not this lock. */
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    cerb_semaphore *s = NULL;
    cerb_permit *pm = NULL;
    assert_int_equal(cerb_semaphore_new(b, name, 2, NULL, &s), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &pm), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(ra), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(rb), CERB_OK);
    assert_int_equal(cerb_rwlock_write_trylock_for(rb, 0), CERB_OK);
    assert_int_equal(qu_keys(p, kv, 4), 1);
    snprintf(want, sizeof want, "%swrite/", p);
    assert_memory_equal(kv[0].key, want, strlen(want));
    assert_int_equal(cerb_rwlock_write_unlock(rb), CERB_OK);
    assert_int_equal(cerb_permit_free(pm), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_semaphore_free(s);
    char lim[300];
    snprintf(lim, sizeof lim, "%s.limit", name);
    etcd_test_delete(etcd_test_port(), lim);
    expect_keys(name, 0);
    cerb_rwlock_free(ra);
    cerb_rwlock_free(rb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

static void test_reader_behind_waiting_writer_waits(void **state)
{
    (void)state;
    char *name = test_name("rw-fifo");
    cerb_client *a = open_client(), *b = open_client(), *c = open_client(), *obs = open_client();
    struct job r1 = {.rw = rwl(a, name), .wait_ms = 10000};
    struct job w = {.rw = rwl(b, name), .write = true, .wait_ms = 10000};
    struct job r2 = {.rw = rwl(c, name), .wait_ms = 10000};
    pthread_t t1, tw, t2;
    pthread_create(&t1, NULL, job_main, &r1);
    assert_wait_until(job_done, &r1, 5000);
    assert_int_equal(r1.st, CERB_OK);
    pthread_create(&tw, NULL, job_main, &w);
    expect_members(obs, name, 1, 1);
    pthread_create(&t2, NULL, job_main, &r2);
    expect_members(obs, name, 1, 2);
    assert_int_equal(atomic_load(&w.done), 0);
    assert_int_equal(atomic_load(&r2.done), 0);
    cerb_holder_info *hv = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(obs, CERB_KIND_RWLOCK, name, NULL, &hv, &n), CERB_OK);
    assert_int_equal(n, 3);
    assert_string_equal(hv[0].detail, "read");
    assert_int_equal(hv[0].waiting, 0);
    assert_true(hv[0].fence > 0);
    assert_string_equal(hv[1].detail, "write");
    assert_int_equal(hv[1].waiting, 1);
    assert_string_equal(hv[2].detail, "read");
    assert_int_equal(hv[2].waiting, 1);
    assert_int_equal(strlen(hv[0].owner), 32);
    cerb_holders_free(hv, n);
    atomic_store(&r1.release, 1);
    pthread_join(t1, NULL);
    assert_wait_until(job_done, &w, 5000);
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.fence > r1.fence);
    expect_members(obs, name, 1, 1);
    assert_int_equal(atomic_load(&r2.done), 0);
    atomic_store(&w.release, 1);
    pthread_join(tw, NULL);
    assert_wait_until(job_done, &r2, 5000);
    assert_int_equal(r2.st, CERB_OK);
    assert_true(r2.fence > w.fence);
    atomic_store(&r2.release, 1);
    pthread_join(t2, NULL);
    expect_keys(name, 0);
    cerb_rwlock_free(r1.rw);
    cerb_rwlock_free(w.rw);
    cerb_rwlock_free(r2.rw);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(c);
    cerb_client_close(obs);
    free(name);
}

/* The holder's lease revoked: the waiting writer gets in. A waiter whose
 * own session is revoked while it waits queues again (it re-reads its key
 * after every wake-up) and is not granted while the holder still holds. */
static void test_revoked_sessions(void **state)
{
    (void)state;
    char *name = test_name("rw-revoke");
    char p[300];
    qprefix(name, p, sizeof p);
    cerb_client *a = open_client(), *b = open_client(), *c = open_client();
    struct job w1 = {.rw = rwl(a, name), .write = true, .wait_ms = 0};
    struct job w2 = {.rw = rwl(b, name), .write = true, .wait_ms = 20000};
    struct job r3 = {.rw = rwl(c, name), .wait_ms = 20000};
    pthread_t t1, t2, t3;
    pthread_create(&t1, NULL, job_main, &w1);
    assert_wait_until(job_done, &w1, 5000);
    assert_int_equal(w1.st, CERB_OK);
    pthread_create(&t2, NULL, job_main, &w2);
    expect_keys(name, 2);
    struct qu_kv kv[4];
    assert_int_equal(qu_keys(p, kv, 4), 2);
    /* w2's session goes while it waits: it must queue again, not hold. */
    assert_int_equal(etcd_test_revoke(etcd_test_port(), kv[1].lease), 0);
    struct qu_count back = {p, 2};
    assert_wait_until(qu_count_is, &back, 10000);
    assert_int_equal(qu_keys(p, kv, 4), 2);
    assert_true(kv[1].lease != 0);
    assert_int_equal(atomic_load(&w2.done), 0);
    pthread_create(&t3, NULL, job_main, &r3);
    expect_keys(name, 3);
    /* Now w1's session goes: w2 (first in line) gets in, r3 still waits. */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_revoke(etcd_test_port(), kv[0].lease), 0);
    assert_wait_until(job_done, &w2, 5000);
    assert_int_equal(w2.st, CERB_OK);
    assert_true(w2.at - t0 < 2000);
    assert_int_equal(atomic_load(&r3.done), 0);
    atomic_store(&w1.release, 1);
    pthread_join(t1, NULL); /* its unlock reports the loss; no key of it left */
    atomic_store(&w2.release, 1);
    pthread_join(t2, NULL);
    assert_wait_until(job_done, &r3, 5000);
    assert_int_equal(r3.st, CERB_OK);
    atomic_store(&r3.release, 1);
    pthread_join(t3, NULL);
    expect_keys(name, 0);
    cerb_rwlock_free(w1.rw);
    cerb_rwlock_free(w2.rw);
    cerb_rwlock_free(r3.rw);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(c);
    free(name);
}

/* A dead writer's key (its lease kept alive by nobody) ahead of a reader
 * blocks it until that lease ends; timeouts leave nothing behind. */
static void test_dead_waiter_and_timeouts(void **state)
{
    (void)state;
    char *name = test_name("rw-dead");
    char p[300], k[400];
    qprefix(name, p, sizeof p);
    cerb_client *a = open_client(), *b = open_client();
    cerb_rwlock *ra = rwl(a, name), *rb = rwl(b, name);
    int64_t dead = etcd_test_grant(etcd_test_port(), 2);
    assert_true(dead > 0);
    snprintf(k, sizeof k, "%swrite/dead-writer", p);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_put(etcd_test_port(), k, dead), 0);
    assert_int_equal(cerb_rwlock_read_trylock_for(ra, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_trylock_for(rb, 200), CERB_TIMEOUT);
    expect_keys(name, 1);
    assert_int_equal(cerb_rwlock_read_trylock_for(ra, 10000), CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took >= 1000 && took < 6000);
    assert_int_equal(cerb_rwlock_write_trylock_for(rb, 100), CERB_TIMEOUT);
    expect_keys(name, 1);
    assert_int_equal(cerb_rwlock_read_unlock(ra), CERB_OK);
    expect_keys(name, 0);
    cerb_rwlock_free(ra);
    cerb_rwlock_free(rb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_on_the_wire),
        cmocka_unit_test(test_reader_behind_waiting_writer_waits),
        cmocka_unit_test(test_revoked_sessions),
        cmocka_unit_test(test_dead_waiter_and_timeouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
