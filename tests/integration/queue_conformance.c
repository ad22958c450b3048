/*
 * queue_conformance.c — the contract of semaphores and read-write locks
 * (DESIGN.md §16, engine.h's struct cerb_queue_methods) that every engine
 * keeps, written once and run once per engine (queue_conformance_local,
 * _redis, _zk, _etcd: tests/conformance.cmake). The engine is fixed at
 * compile time by CERB_CONFORMANCE_ENGINE.
 *
 * The cases, each with an oracle kept by the test itself:
 *  - at most N permits held at once, by threads of several clients and by
 *    processes (a shared counter of permits in use, never above N);
 *  - k permits at once, CERB_BUSY when they do not fit, the stored limit
 *    refusing another (CERB_ECONFIG);
 *  - first come, first served: a request for many permits is not passed by
 *    a later small one; a reader behind a waiting writer waits;
 *  - never a writer with anybody else (threads of several clients, readers
 *    and writers mixed), readers together;
 *  - fences strictly increasing per name, permits and holds alike;
 *  - a timed-out or cancelled wait leaves no member behind, and nothing is
 *    left once everybody released (read through cerb_inspect, which every
 *    engine answers from its own layout).
 * Layouts, interop with peers, lost holds and server faults stay in each
 * engine's own suites.
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
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#ifdef CERB_CONF_ZK
#include "zk_util.h"
#endif
#ifdef CERB_CONF_ETCD
#include "etcd_util.h"
#endif

#ifndef CERB_CONFORMANCE_ENGINE
#error "compile with -DCERB_CONFORMANCE_ENGINE=\"<engine>\" (tests/conformance.cmake does)"
#endif

struct engine {
    const char *name;
    char *(*config)(const char *engine_extra, const char *extra);
    bool cross_process; /* processes share its queues (not the local engine's) */
};

static char *local_text(const char *engine_extra, const char *extra)
{
    (void)engine_extra;
    const char *ex = extra ? extra : "";
    size_t n = strlen(ex) + 64;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "engines = (\"local\");\n%s\n", ex);
    return s;
}

#ifdef CERB_CONF_ZK
static char *zk_text(const char *zk_extra, const char *extra)
{
    return cerb_test_zk_config(NULL, zk_extra, extra);
}
#endif

static const struct engine engines[] = {
    {"local", local_text, false},
#ifdef CERB_CONF_REDIS
    {"redis", cerb_test_redis_config, true},
#endif
#ifdef CERB_CONF_ZK
    {"zk", zk_text, true},
#endif
#ifdef CERB_CONF_ETCD
    {"etcd", etcd_test_config, true},
#endif
};

static const struct engine *E;

static int group_setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++)
        if (strcmp(engines[i].name, CERB_CONFORMANCE_ENGINE) == 0)
            E = &engines[i];
    if (!E) {
        fprintf(stderr, "queue conformance: engine \"%s\" is not built into this suite\n",
                CERB_CONFORMANCE_ENGINE);
        return -1;
    }
    return 0;
}

static cerb_client *open_client(void)
{
    char *cfg = E->config(NULL, NULL);
    assert_non_null(cfg);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("%s: open: %s: %s", E->name, cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_semaphore *sem(cerb_client *c, const char *name, int64_t n)
{
    cerb_semaphore *s = NULL;
    if (cerb_semaphore_new(c, name, n, NULL, &s) != CERB_OK)
        fail_msg("semaphore_new(%s): %s", name, cerb_last_error());
    return s;
}

static cerb_rwlock *rwl(cerb_client *c, const char *name)
{
    cerb_rwlock *rw = NULL;
    if (cerb_rwlock_new(c, name, NULL, &rw) != CERB_OK)
        fail_msg("rwlock_new(%s): %s", name, cerb_last_error());
    return rw;
}

/* Members of @name as @kind lists them: holders and waiters. */
struct members {
    cerb_client *c;
    int kind;
    const char *name;
    size_t holders, waiters;
};

static bool count_members(struct members *m, size_t *h, size_t *w)
{
    cerb_holder_info *v = NULL;
    size_t n = 0;
    *h = *w = 0;
    if (cerb_inspect(m->c, m->kind, m->name, NULL, &v, &n) != CERB_OK)
        return false;
    for (size_t i = 0; i < n; i++)
        *(v[i].waiting ? w : h) += 1;
    cerb_holders_free(v, n);
    return true;
}

static bool members_are(void *ud)
{
    struct members *m = ud;
    size_t h, w;
    return count_members(m, &h, &w) && h == m->holders && w == m->waiters;
}

static void expect_members(cerb_client *c, int kind, const char *name, size_t holders,
                           size_t waiters)
{
    struct members m = {c, kind, name, holders, waiters};
    if (!wait_until(members_are, &m, 10000)) {
        size_t h = 0, w = 0;
        count_members(&m, &h, &w);
        fail_msg("%s: %zu holders and %zu waiters, expected %zu and %zu (%s)", name, h, w,
                 holders, waiters, cerb_last_error());
    }
}

/* ------------------------------------------------------------ semaphores */

#define SEM_THREADS 3
#define SEM_CLIENTS 2
#define SEM_ROUNDS 15

struct sem_oracle {
    atomic_int in_use, max_seen, over, errors;
    atomic_uint_fast64_t last_fence; /* not ordered across holders: only uniqueness */
};

struct sem_worker {
    cerb_semaphore *s;
    struct sem_oracle *o;
    int64_t limit;
    uint64_t fences[SEM_ROUNDS];
};

static void *sem_worker_main(void *arg)
{
    struct sem_worker *w = arg;
    for (int r = 0; r < SEM_ROUNDS; r++) {
        cerb_permit *p = NULL;
        cerb_status st = cerb_semaphore_acquire(w->s, 1, 20000, NULL, &p);
        if (st != CERB_OK) {
            fprintf(stderr, "acquire: %s: %s\n", cerb_status_name(st), cerb_last_error());
            atomic_fetch_add(&w->o->errors, 1);
            continue;
        }
        int now = atomic_fetch_add(&w->o->in_use, 1) + 1;
        if (now > w->limit)
            atomic_fetch_add(&w->o->over, 1);
        int m = atomic_load(&w->o->max_seen);
        while (now > m && !atomic_compare_exchange_weak(&w->o->max_seen, &m, now))
            ;
        w->fences[r] = cerb_permit_fencing_token(p);
        atomic_fetch_sub(&w->o->in_use, 1);
        if (cerb_permit_free(p) != CERB_OK)
            atomic_fetch_add(&w->o->errors, 1);
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_sem_at_most_limit_threads(void **state)
{
    (void)state;
    char *name = test_name("qsem-thr");
    cerb_client *c[SEM_CLIENTS];
    cerb_semaphore *s[SEM_CLIENTS];
    struct sem_oracle o = {0};
    struct sem_worker w[SEM_CLIENTS * SEM_THREADS];
    pthread_t t[SEM_CLIENTS * SEM_THREADS];
    for (int i = 0; i < SEM_CLIENTS; i++) {
        c[i] = open_client();
        s[i] = sem(c[i], name, 2);
    }
    for (int i = 0; i < SEM_CLIENTS * SEM_THREADS; i++) {
        w[i] = (struct sem_worker){.s = s[i % SEM_CLIENTS], .o = &o, .limit = 2};
        pthread_create(&t[i], NULL, sem_worker_main, &w[i]);
    }
    for (int i = 0; i < SEM_CLIENTS * SEM_THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&o.errors), 0);
    assert_int_equal(atomic_load(&o.over), 0);
    assert_true(atomic_load(&o.max_seen) >= 1);
    /* Every grant a fence of its own. */
    uint64_t all[SEM_CLIENTS * SEM_THREADS * SEM_ROUNDS];
    size_t n = 0;
    for (int i = 0; i < SEM_CLIENTS * SEM_THREADS; i++)
        for (int r = 0; r < SEM_ROUNDS; r++)
            all[n++] = w[i].fences[r];
    qsort(all, n, sizeof all[0], cmp_u64);
    for (size_t i = 1; i < n; i++)
        assert_true(all[i] > all[i - 1]);
    assert_true(all[0] > 0);
    expect_members(c[0], CERB_KIND_SEMAPHORE, name, 0, 0);
    for (int i = 0; i < SEM_CLIENTS; i++) {
        cerb_semaphore_free(s[i]);
        cerb_client_close(c[i]);
    }
    free(name);
}

struct proc_shared {
    atomic_int in_use, over, errors;
};

struct proc_arg {
    const char *name;
    struct proc_shared *sh;
};

static int sem_proc_main(void *ud)
{
    struct proc_arg *a = ud;
    cerb_client *c = open_client();
    cerb_semaphore *s = sem(c, a->name, 2);
    for (int r = 0; r < SEM_ROUNDS; r++) {
        cerb_permit *p = NULL;
        if (cerb_semaphore_acquire(s, 1, 20000, NULL, &p) != CERB_OK) {
            atomic_fetch_add(&a->sh->errors, 1);
            continue;
        }
        if (atomic_fetch_add(&a->sh->in_use, 1) + 1 > 2)
            atomic_fetch_add(&a->sh->over, 1);
        usleep(1000); /* hold a moment: overlaps, if the engine allowed them, show */
        atomic_fetch_sub(&a->sh->in_use, 1);
        cerb_permit_free(p);
    }
    cerb_semaphore_free(s);
    cerb_client_close(c);
    return 0;
}

static void test_sem_at_most_limit_processes(void **state)
{
    (void)state;
    if (!E->cross_process)
        skip(); /* the local engine's semaphores are in-process */
    char *name = test_name("qsem-proc");
    struct proc_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    struct proc_arg a = {name, sh};
    pid_t pids[3];
    for (int i = 0; i < 3; i++)
        assert_true((pids[i] = cerb_test_fork(sem_proc_main, &a)) > 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cerb_test_wait(pids[i], 120000), 0);
    assert_int_equal(atomic_load(&sh->errors), 0);
    assert_int_equal(atomic_load(&sh->over), 0);
    cerb_client *c = open_client();
    expect_members(c, CERB_KIND_SEMAPHORE, name, 0, 0);
    cerb_client_close(c);
    munmap(sh, sizeof *sh);
    free(name);
}

static void test_sem_counts_limit_and_mismatch(void **state)
{
    (void)state;
    char *name = test_name("qsem-k");
    cerb_client *c1 = open_client(), *c2 = open_client();
    cerb_semaphore *a = sem(c1, name, 5), *b = sem(c2, name, 5), *other = sem(c2, name, 4);
    cerb_permit *p = NULL, *q = NULL, *r = NULL;
    assert_int_equal(cerb_semaphore_acquire(a, 3, 0, NULL, &p), CERB_OK);
    assert_int_equal(cerb_permit_count(p), 3);
    assert_int_equal(cerb_semaphore_acquire(b, 3, 0, NULL, &q), CERB_BUSY);
    assert_null(q);
    assert_int_equal(cerb_semaphore_acquire(b, 2, 0, NULL, &q), CERB_OK);
    assert_true(cerb_permit_fencing_token(q) > cerb_permit_fencing_token(p));
    assert_int_equal(cerb_semaphore_acquire(b, 1, 0, NULL, &r), CERB_BUSY);
    assert_int_equal(cerb_semaphore_acquire(other, 1, 0, NULL, &r), CERB_ECONFIG);
    assert_null(r);
    expect_members(c2, CERB_KIND_SEMAPHORE, name, 2, 0);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 3, 0, NULL, &r), CERB_OK);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    assert_int_equal(cerb_permit_free(r), CERB_OK);
    expect_members(c2, CERB_KIND_SEMAPHORE, name, 0, 0);
    cerb_semaphore_free(a);
    cerb_semaphore_free(b);
    cerb_semaphore_free(other);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

struct taker {
    cerb_semaphore *s;
    unsigned k;
    cerb_permit *p;
    cerb_status st;
    atomic_int done;
};

static void *taker_main(void *arg)
{
    struct taker *t = arg;
    t->st = cerb_semaphore_acquire(t->s, t->k, 20000, NULL, &t->p);
    atomic_store(&t->done, 1);
    return NULL;
}

static bool taker_done(void *ud)
{
    return atomic_load(&((struct taker *)ud)->done) != 0;
}

static void test_sem_first_come_first_served(void **state)
{
    (void)state;
    char *name = test_name("qsem-fifo");
    cerb_client *c1 = open_client(), *c2 = open_client(), *c3 = open_client();
    cerb_semaphore *a = sem(c1, name, 2), *b = sem(c2, name, 2), *d = sem(c3, name, 2);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p), CERB_OK);
    struct taker big = {.s = b, .k = 2}, small = {.s = d, .k = 1};
    pthread_t tb, ts;
    pthread_create(&tb, NULL, taker_main, &big);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 1, 1);
    pthread_create(&ts, NULL, taker_main, &small);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 1, 2);
    /* One permit is free, and the small request still waits its turn. */
    assert_false(wait_until(taker_done, &small, 300));
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_true(wait_until(taker_done, &big, 10000));
    assert_int_equal(big.st, CERB_OK);
    assert_false(wait_until(taker_done, &small, 300));
    assert_int_equal(cerb_permit_free(big.p), CERB_OK);
    assert_true(wait_until(taker_done, &small, 10000));
    assert_int_equal(small.st, CERB_OK);
    pthread_join(tb, NULL);
    pthread_join(ts, NULL);
    assert_int_equal(cerb_permit_free(small.p), CERB_OK);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 0, 0);
    cerb_semaphore_free(a);
    cerb_semaphore_free(b);
    cerb_semaphore_free(d);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(c3);
    free(name);
}

struct cancel_taker {
    cerb_semaphore *s;
    cerb_cancel *k;
    cerb_status st;
    atomic_int done;
};

static void *cancel_taker_main(void *arg)
{
    struct cancel_taker *t = arg;
    cerb_permit *p = NULL;
    t->st = cerb_semaphore_acquire(t->s, 1, -1, t->k, &p);
    cerb_permit_free(p);
    atomic_store(&t->done, 1);
    return NULL;
}

static bool cancel_taker_done(void *ud)
{
    return atomic_load(&((struct cancel_taker *)ud)->done) != 0;
}

static void test_sem_failed_waits_leave_nothing(void **state)
{
    (void)state;
    char *name = test_name("qsem-gone");
    cerb_client *c1 = open_client(), *c2 = open_client();
    cerb_semaphore *a = sem(c1, name, 1), *b = sem(c2, name, 1);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 0, NULL, &q), CERB_BUSY);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 200, NULL, &q), CERB_TIMEOUT);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 1, 0);
    /* A waiter cancelled once it is queued. */
    struct cancel_taker t = {.s = b};
    assert_int_equal(cerb_cancel_new(&t.k), CERB_OK);
    pthread_t th;
    pthread_create(&th, NULL, cancel_taker_main, &t);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 1, 1);
    cerb_cancel_fire(t.k);
    assert_true(wait_until(cancel_taker_done, &t, 10000));
    pthread_join(th, NULL);
    assert_int_equal(t.st, CERB_INTERRUPTED);
    cerb_cancel_free(t.k);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 1, 0);
    /* The next one in is not held up by anything the others left. */
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 1, 0, NULL, &q), CERB_OK);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    expect_members(c1, CERB_KIND_SEMAPHORE, name, 0, 0);
    cerb_semaphore_free(a);
    cerb_semaphore_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

/* ------------------------------------------------------- read-write locks */

#define RW_CLIENTS 2
#define RW_READERS 3
#define RW_ROUNDS 10

struct rw_oracle {
    atomic_int readers, writers, bad, errors;
};

struct rw_worker {
    cerb_rwlock *rw;
    struct rw_oracle *o;
    bool writer;
    uint64_t fences[RW_ROUNDS];
};

static void *rw_worker_main(void *arg)
{
    struct rw_worker *w = arg;
    for (int r = 0; r < RW_ROUNDS; r++) {
        cerb_status st = w->writer ? cerb_rwlock_write_trylock_for(w->rw, 20000)
                                   : cerb_rwlock_read_trylock_for(w->rw, 20000);
        if (st != CERB_OK) {
            fprintf(stderr, "%s: %s: %s\n", w->writer ? "write" : "read", cerb_status_name(st),
                    cerb_last_error());
            atomic_fetch_add(&w->o->errors, 1);
            continue;
        }
        if (w->writer) {
            if (atomic_fetch_add(&w->o->writers, 1) != 0 || atomic_load(&w->o->readers) != 0)
                atomic_fetch_add(&w->o->bad, 1);
        } else {
            atomic_fetch_add(&w->o->readers, 1);
            if (atomic_load(&w->o->writers) != 0)
                atomic_fetch_add(&w->o->bad, 1);
        }
        w->fences[r] = cerb_rwlock_fencing_token(w->rw);
        usleep(500);
        if (w->writer)
            atomic_fetch_sub(&w->o->writers, 1);
        else
            atomic_fetch_sub(&w->o->readers, 1);
        st = w->writer ? cerb_rwlock_write_unlock(w->rw) : cerb_rwlock_read_unlock(w->rw);
        if (st != CERB_OK)
            atomic_fetch_add(&w->o->errors, 1);
    }
    return NULL;
}

static void test_rw_exclusion_threads(void **state)
{
    (void)state;
    char *name = test_name("qrw-thr");
    enum { PER = RW_READERS + 1, N = RW_CLIENTS * PER };
    cerb_client *c[RW_CLIENTS];
    cerb_rwlock *rw[RW_CLIENTS];
    struct rw_oracle o = {0};
    struct rw_worker w[N];
    pthread_t t[N];
    for (int i = 0; i < RW_CLIENTS; i++) {
        c[i] = open_client();
        rw[i] = rwl(c[i], name);
    }
    for (int i = 0; i < N; i++) {
        w[i] = (struct rw_worker){.rw = rw[i / PER], .o = &o, .writer = i % PER == 0};
        pthread_create(&t[i], NULL, rw_worker_main, &w[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&o.errors), 0);
    assert_int_equal(atomic_load(&o.bad), 0);
    /* Every hold a fence of its own; each thread's grow. */
    for (int i = 0; i < N; i++)
        for (int r = 1; r < RW_ROUNDS; r++)
            assert_true(w[i].fences[r] > w[i].fences[r - 1]);
    expect_members(c[0], CERB_KIND_RWLOCK, name, 0, 0);
    for (int i = 0; i < RW_CLIENTS; i++) {
        assert_int_equal(cerb_rwlock_free(rw[i]), CERB_OK);
        cerb_client_close(c[i]);
    }
    free(name);
}

struct rw_job {
    cerb_rwlock *rw;
    bool write;
    cerb_status st;
    uint64_t fence;
    atomic_int done, release;
};

static bool job_done(void *ud)
{
    return atomic_load(&((struct rw_job *)ud)->done) != 0;
}

static bool job_release(void *ud)
{
    return atomic_load(&((struct rw_job *)ud)->release) != 0;
}

static void *rw_job_main(void *arg)
{
    struct rw_job *j = arg;
    j->st = j->write ? cerb_rwlock_write_trylock_for(j->rw, 20000)
                     : cerb_rwlock_read_trylock_for(j->rw, 20000);
    j->fence = cerb_rwlock_fencing_token(j->rw);
    atomic_store(&j->done, 1);
    if (j->st == CERB_OK) {
        wait_until(job_release, j, 30000);
        if (j->write)
            cerb_rwlock_write_unlock(j->rw);
        else
            cerb_rwlock_read_unlock(j->rw);
    }
    return NULL;
}

static void test_rw_reader_behind_writer_waits(void **state)
{
    (void)state;
    char *name = test_name("qrw-fifo");
    cerb_client *c1 = open_client(), *c2 = open_client(), *c3 = open_client(),
                *c4 = open_client();
    struct rw_job r1 = {.rw = rwl(c1, name)}, w = {.rw = rwl(c2, name), .write = true},
                  r2 = {.rw = rwl(c3, name)}, r0 = {.rw = rwl(c4, name)};
    pthread_t t1, tw, t2, t0;
    pthread_create(&t1, NULL, rw_job_main, &r1);
    assert_true(wait_until(job_done, &r1, 10000));
    assert_int_equal(r1.st, CERB_OK);
    /* Readers share. */
    pthread_create(&t0, NULL, rw_job_main, &r0);
    assert_true(wait_until(job_done, &r0, 10000));
    assert_int_equal(r0.st, CERB_OK);
    pthread_create(&tw, NULL, rw_job_main, &w);
    expect_members(c1, CERB_KIND_RWLOCK, name, 2, 1);
    pthread_create(&t2, NULL, rw_job_main, &r2);
    expect_members(c1, CERB_KIND_RWLOCK, name, 2, 2);
    assert_false(wait_until(job_done, &r2, 300)); /* behind the waiting writer */
    atomic_store(&r1.release, 1);
    atomic_store(&r0.release, 1);
    assert_true(wait_until(job_done, &w, 10000));
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.fence > r1.fence && w.fence > r0.fence);
    assert_false(wait_until(job_done, &r2, 300));
    atomic_store(&w.release, 1);
    assert_true(wait_until(job_done, &r2, 10000));
    assert_int_equal(r2.st, CERB_OK);
    assert_true(r2.fence > w.fence);
    atomic_store(&r2.release, 1);
    pthread_join(t1, NULL);
    pthread_join(t0, NULL);
    pthread_join(tw, NULL);
    pthread_join(t2, NULL);
    expect_members(c1, CERB_KIND_RWLOCK, name, 0, 0);
    struct rw_job *all[] = {&r1, &w, &r2, &r0};
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(cerb_rwlock_free(all[i]->rw), CERB_OK);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(c3);
    cerb_client_close(c4);
    free(name);
}

static void test_rw_try_and_timeout_leave_nothing(void **state)
{
    (void)state;
    char *name = test_name("qrw-gone");
    cerb_client *c1 = open_client(), *c2 = open_client();
    cerb_rwlock *a = rwl(c1, name), *b = rwl(c2, name);
    assert_int_equal(cerb_rwlock_write_lock(a), CERB_OK);
    assert_int_equal(cerb_rwlock_read_trylock_for(b, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_trylock_for(b, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_read_trylock_for(b, 200), CERB_TIMEOUT);
    expect_members(c2, CERB_KIND_RWLOCK, name, 1, 0);
    assert_int_equal(cerb_rwlock_write_unlock(a), CERB_OK);
    assert_int_equal(cerb_rwlock_read_trylock_for(b, 0), CERB_OK);
    assert_int_equal(cerb_rwlock_read_trylock_for(a, 0), CERB_OK);
    expect_members(c2, CERB_KIND_RWLOCK, name, 2, 0);
    assert_int_equal(cerb_rwlock_read_unlock(a), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(b), CERB_OK);
    expect_members(c2, CERB_KIND_RWLOCK, name, 0, 0);
    cerb_rwlock_free(a);
    cerb_rwlock_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sem_counts_limit_and_mismatch),
        cmocka_unit_test(test_sem_first_come_first_served),
        cmocka_unit_test(test_sem_failed_waits_leave_nothing),
        cmocka_unit_test(test_sem_at_most_limit_processes),
        cmocka_unit_test(test_sem_at_most_limit_threads),
        cmocka_unit_test(test_rw_try_and_timeout_leave_nothing),
        cmocka_unit_test(test_rw_reader_behind_writer_waits),
        cmocka_unit_test(test_rw_exclusion_threads),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
