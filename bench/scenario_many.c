/*
 * scenario_many.c — the `many` scenario: what holding many locks costs one
 * client. DESIGN.md §10: 10 000 held locks renewed by one client take
 * < 5 % of one core and < 1 KiB each.
 *
 * One client; BENCH_MANY_THREADS threads acquire M locks between them
 * (names bench-many-<pid>-<i>, lock i on thread i mod T, since holds belong
 * to the thread that took them), each with renewal on and a short lease
 * (--lease, default 3000 ms) so the watchdog renews every lock every
 * lease/3 while the bench watches. Steps:
 *   1. every thread does one lock + unlock of a name of its own, so the
 *      connection pool, scripts and per-thread state exist before anything
 *      is measured; the lock-pointer arrays are allocated then too;
 *   2. RSS before (/proc/self/statm, resident pages × page size);
 *   3. the threads create their handles and acquire their locks; each
 *      acquire (cerb_lock_trylock_for, bounded) is timed into the latency
 *      histogram, and M ÷ the time to acquire all is the row's ops/s;
 *   4. RSS after: (after − before) ÷ M is the memory per lock, everything
 *      the library keeps for a held lock (handle, hold, engine state,
 *      watchdog entry) included;
 *   5. the hold period (--duration): process CPU time (getrusage
 *      RUSAGE_SELF, user + system, every thread) over wall time is the
 *      share of one core spent keeping the locks; the acquiring threads
 *      sleep on a condition variable meanwhile, so that CPU is the
 *      watchdog's renewals and whatever else the library does in the
 *      background;
 *   6. each thread checks that every one of its holds is still VALID
 *      (a renewal that fell behind would show here), then unlocks and
 *      frees its handles.
 * There is no raw ceiling for this ("n/a"): the figures are absolute.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "scenarios.h"

#define NS_PER_S INT64_C(1000000000)
#define MANY_WAIT_MS 30000 /* one acquire's bound */
/* Bound of the acquire and release stages as a whole. */
#define MANY_STAGE_NS (600 * NS_PER_S)
#define MANY_TICK_NS (250 * INT64_C(1000000))

enum many_stage { STAGE_WARM, STAGE_ACQUIRE, STAGE_RELEASE };

struct many {
    struct bench_sync s;
    cerb_client *client;
    cerb_lock_opts lopts;
    int locks, threads;
    /* Under s.mu: */
    enum many_stage stage;
    int ready, acquired, released; /* threads past each step */
    char err[BENCH_ERR_MAX];
    atomic_int failed; /* set under s.mu; read without it to stop early */
    /* Progress only. */
    _Atomic uint64_t taken;
};

struct many_thread {
    struct many *m;
    int idx;
    pthread_t tid;
    int started;
    cerb_lock **locks; /* this thread's share */
    int n, held;
    uint64_t not_valid;
    struct bench_hist hist;
};

static void many_fail(struct many *m, const char *fmt, const char *name,
                      cerb_status st)
{
    pthread_mutex_lock(&m->s.mu);
    if (!atomic_load(&m->failed)) {
        atomic_store(&m->failed, 1);
        snprintf(m->err, sizeof m->err, "%s \"%s\": %s (%s)", fmt, name,
                 cerb_last_error(), cerb_status_name(st));
    }
    pthread_mutex_unlock(&m->s.mu);
}

/* Advance a counter and wait for the main thread to open the next stage. */
static void many_step(struct many *m, int *counter, enum many_stage next)
{
    pthread_mutex_lock(&m->s.mu);
    (*counter)++;
    pthread_cond_broadcast(&m->s.cond);
    /* The main thread bounds every stage and always opens the next one. */
    while (m->stage < next)
        pthread_cond_wait(&m->s.cond, &m->s.mu);
    pthread_mutex_unlock(&m->s.mu);
}

static void *many_thread_main(void *p)
{
    struct many_thread *t = p;
    struct many *m = t->m;
    char name[96];
    cerb_lock *warm = NULL;
    cerb_status st;

    /* 1: warm up this thread's path to the server. */
    snprintf(name, sizeof name, "bench-many-%ld-w%d", (long)getpid(), t->idx);
    st = cerb_lock_new(m->client, name, &m->lopts, &warm);
    if (st == CERB_OK)
        st = cerb_lock_trylock_for(warm, MANY_WAIT_MS);
    if (st == CERB_OK)
        st = cerb_lock_unlock(warm);
    if (st != CERB_OK)
        many_fail(m, "warm-up lock", name, st);
    cerb_lock_free(warm);
    many_step(m, &m->ready, STAGE_ACQUIRE);

    /* 3: acquire this thread's share, unless a thread failed already. */
    for (int k = 0; k < t->n && !atomic_load(&m->failed); k++) {
        int i = t->idx + k * m->threads;
        snprintf(name, sizeof name, "bench-many-%ld-%d", (long)getpid(), i);
        st = cerb_lock_new(m->client, name, &m->lopts, &t->locks[k]);
        if (st != CERB_OK) {
            many_fail(m, "cerb_lock_new", name, st);
            break;
        }
        int64_t t0 = bench_now_ns();
        st = cerb_lock_trylock_for(t->locks[k], MANY_WAIT_MS);
        if (st != CERB_OK) {
            many_fail(m, "lock", name, st);
            break;
        }
        bench_hist_record(&t->hist, bench_now_ns() - t0);
        t->held = k + 1;
        atomic_fetch_add_explicit(&m->taken, 1, memory_order_relaxed);
    }
    many_step(m, &m->acquired, STAGE_RELEASE);

    /* 6: still valid after the hold period? Then release everything. */
    for (int k = 0; k < t->held; k++)
        if (cerb_lock_state(t->locks[k]) != CERB_LOCK_VALID)
            t->not_valid++;
    for (int k = 0; k < t->n; k++) {
        if (!t->locks[k])
            continue;
        if (k < t->held) {
            st = cerb_lock_unlock(t->locks[k]);
            /* LOST is a finding (counted above), not a failure to stop on. */
            if (st != CERB_OK && st != CERB_LOST)
                many_fail(m, "unlock", cerb_lock_name(t->locks[k]), st);
        }
        cerb_lock_free(t->locks[k]);
        t->locks[k] = NULL;
    }
    pthread_mutex_lock(&m->s.mu);
    m->released++;
    pthread_cond_broadcast(&m->s.cond);
    pthread_mutex_unlock(&m->s.mu);
    return NULL;
}

/* Resident set size in bytes, or -1. */
static int64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size, resident;
    int ok;
    if (!f)
        return -1;
    ok = fscanf(f, "%ld %ld", &size, &resident) == 2;
    fclose(f);
    return ok ? (int64_t)resident * sysconf(_SC_PAGESIZE) : -1;
}

/* Process CPU time (user + system, all threads) in nanoseconds. */
static int64_t cpu_ns(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * NS_PER_S +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

/* Wait (s.mu held) until *counter reaches @want; progress every tick. */
static void many_wait(struct many *m, const int *counter, int want,
                      const char *what, const char *engine, int progress)
{
    int64_t deadline = bench_now_ns() + MANY_STAGE_NS;
    while (*counter < want) {
        int64_t tick = bench_now_ns() + MANY_TICK_NS;
        if (bench_sync_wait_until(&m->s, tick < deadline ? tick : deadline) ||
            bench_now_ns() >= deadline) {
            char msg[160];
            snprintf(msg, sizeof msg, "many: %d of %d threads %s after %.0f s",
                     *counter, want, what, (double)MANY_STAGE_NS / 1e9);
            bench_hung(msg);
        }
        bench_progress(progress, "many %s: %s, %llu of %d locks held", engine,
                       what,
                       (unsigned long long)atomic_load_explicit(
                           &m->taken, memory_order_relaxed),
                       m->locks);
    }
}

int bench_many(const struct bench_engine *e, const struct bench_opts *o,
               struct bench_result *out)
{
    const int T = BENCH_MANY_THREADS;
    struct many m;
    struct many_thread *ts = calloc((size_t)T, sizeof *ts);
    struct bench_hist *lat = malloc(sizeof *lat);
    int sync_ok = 0, stage_open = 0;
    int64_t rss0 = -1, rss1 = -1, t0 = 0, t1 = 0, w0 = 0, w1 = 0, c0 = 0,
            c1 = 0;
    int rc = -1;

    memset(&m, 0, sizeof m);
    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "many");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = T;
    out->ratio = out->ratio_paired_median = -1;
    out->locks = (uint64_t)o->locks;
    out->lease_ms = o->many_lease_ms;
    if (!ts || !lat) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lat);
    if (e->cfg && strcmp(e->name, "redis") == 0 && e->cfg->redis.pool_max < T)
        fprintf(stderr,
                "cerberus-bench: note: redis.pool_max = %d is below the %d "
                "threads that acquire the many locks\n",
                e->cfg->redis.pool_max, T);
    if (bench_sync_init(&m.s) != 0)
        goto done;
    sync_ok = 1;
    m.locks = o->locks;
    m.threads = T;
    m.lopts = (cerb_lock_opts)CERB_LOCK_OPTS_INIT;
    m.lopts.lease_ms = o->many_lease_ms;
    m.lopts.renew = 1;
    atomic_init(&m.taken, 0);
    atomic_init(&m.failed, 0);
    if (!(m.client = bench_client_open(e)))
        goto done;

    for (int i = 0; i < T; i++) {
        ts[i].m = &m;
        ts[i].idx = i;
        ts[i].n = o->locks / T + (i < o->locks % T);
        bench_hist_init(&ts[i].hist);
        ts[i].locks = calloc((size_t)ts[i].n + 1, sizeof *ts[i].locks);
        if (!ts[i].locks) {
            bench_errorf("out of memory");
            goto done;
        }
    }
    for (int i = 0; i < T; i++) {
        int err = pthread_create(&ts[i].tid, NULL, many_thread_main, &ts[i]);
        if (err) {
            bench_errorf("many: cannot start thread %d of %d: %s", i + 1, T,
                         strerror(err));
            goto done;
        }
        ts[i].started = 1;
    }

    pthread_mutex_lock(&m.s.mu);
    many_wait(&m, &m.ready, T, "warming up", e->name, o->progress);
    rss0 = rss_bytes();
    t0 = bench_now_ns();
    m.stage = STAGE_ACQUIRE;
    pthread_cond_broadcast(&m.s.cond);
    many_wait(&m, &m.acquired, T, "acquiring", e->name, o->progress);
    t1 = bench_now_ns();
    rss1 = rss_bytes();
    int failed = atomic_load(&m.failed);
    pthread_mutex_unlock(&m.s.mu);

    if (!failed) {
        /* 5: the hold period, measured. */
        const int64_t hold_ns = (int64_t)(o->duration_s * 1e9);
        c0 = cpu_ns();
        w0 = bench_now_ns();
        pthread_mutex_lock(&m.s.mu);
        for (int64_t now = w0; now < w0 + hold_ns; now = bench_now_ns()) {
            int64_t tick = now + MANY_TICK_NS;
            bench_sync_wait_until(&m.s, tick < w0 + hold_ns ? tick : w0 + hold_ns);
            bench_progress(o->progress, "many %s: holding %d locks, %.1f/%.1f s",
                           e->name, o->locks,
                           (double)(bench_now_ns() - w0) / 1e9,
                           (double)hold_ns / 1e9);
        }
        pthread_mutex_unlock(&m.s.mu);
        w1 = bench_now_ns();
        c1 = cpu_ns();
    }

    pthread_mutex_lock(&m.s.mu);
    m.stage = STAGE_RELEASE;
    stage_open = 1;
    pthread_cond_broadcast(&m.s.cond);
    many_wait(&m, &m.released, T, "releasing", e->name, o->progress);
    failed = atomic_load(&m.failed);
    pthread_mutex_unlock(&m.s.mu);
    bench_progress_clear();
    if (failed) {
        bench_errorf("many: %s", m.err);
        goto done;
    }

    for (int i = 0; i < T; i++) {
        bench_hist_merge(lat, &ts[i].hist);
        out->not_valid += ts[i].not_valid;
    }
    out->ops = lat->n;
    out->elapsed_s = (double)(t1 - t0) / 1e9;
    out->ops_per_s = t1 > t0 ? (double)out->ops / out->elapsed_s : 0;
    bench_fill_latency(out, lat);
    out->hold_s = (double)(w1 - w0) / 1e9;
    out->cpu_percent = w1 > w0 ? 100.0 * (double)(c1 - c0) / (double)(w1 - w0)
                               : 0;
    out->rss_delta_bytes = rss0 >= 0 && rss1 >= 0 ? rss1 - rss0 : 0;
    out->bytes_per_lock =
        o->locks ? (double)out->rss_delta_bytes / (double)o->locks : 0;
    rc = 0;

done:
    /* Threads wait for the next stage: open every stage so they finish. */
    if (sync_ok && !stage_open) {
        pthread_mutex_lock(&m.s.mu);
        atomic_store(&m.failed, 1); /* stops acquiring early */
        m.stage = STAGE_RELEASE;
        pthread_cond_broadcast(&m.s.cond);
        pthread_mutex_unlock(&m.s.mu);
    }
    for (int i = 0; ts && i < T; i++)
        if (ts[i].started)
            pthread_join(ts[i].tid, NULL);
    for (int i = 0; ts && i < T; i++)
        free(ts[i].locks);
    cerb_client_close(m.client);
    if (sync_ok)
        bench_sync_destroy(&m.s);
    free(ts);
    free(lat);
    return rc;
}
