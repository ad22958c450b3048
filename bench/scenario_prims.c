/*
 * scenario_prims.c — the semaphore and read-write lock scenarios of
 * cerberus-bench (DESIGN.md §16 primitives, issue 28).
 *
 * semaphore: for a limit of N permits, 2N threads, each with a client of
 * its own as separate processes would have, loop "acquire 1 permit
 * (waiting without limit) -> release" on one semaphore of N permits, so
 * that about half of them wait at any moment. A cycle's count goes to
 * ops/s; the latency recorded is the acquire wait alone (call to return),
 * which is what a caller of a busy semaphore feels. The bench runs one row
 * per N (1, 4 and 16 by default; --permits gives others), each on a name of
 * its own because the engine stores the limit with the name and refuses a
 * caller with another one. The row's threads column is 2N; JSON "permits"
 * is N.
 *
 * rwlock: T threads (--threads, default 8), one client each, on one
 * read-write lock; each cycle is a write (lock, ~10 µs of busy work,
 * unlock) with probability 1/10 and a read otherwise, drawn from a
 * per-thread xorshift generator seeded by the thread's index so that every
 * run makes the same choices. The latency recorded is the cycle (lock to
 * after unlock); reads and writes are also kept apart for the detail line.
 * The lock is FIFO (a reader behind a waiting writer waits), so the writes
 * are what readers queue behind.
 *
 * Both rows have as ceiling one server round trip (the engine's PING on a
 * bare connection, measured in short phases alternating with the
 * library's, as handoff does), and ratio = latency p50 / RTT p50: the
 * number of round trips a cycle costs. DESIGN.md §10 sets no bound for
 * these primitives; the peers on the same server (--peers) are the
 * comparison: Curator's InterProcessSemaphoreV2 and InterProcessReadWriteLock
 * on ZooKeeper, the npm redis-semaphore package on Redis.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scenarios.h"

#define RW_HOLD_NS (10 * INT64_C(1000)) /* rwlock: work done while holding */
#define RW_WRITE_IN 10                  /* one cycle in ten writes */

/* ------------------------------------------------------------- semaphore */

struct sem_ctx {
    cerb_client *client;
    cerb_semaphore *sem;
};

static void *sem_body(void *p)
{
    struct bench_worker *w = p;
    struct sem_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t_end = bench_now_ns();

    for (;;) {
        cerb_permit *permit = NULL;
        int64_t t0 = bench_now_ns();
        cerb_status st = cerb_semaphore_acquire(c->sem, 1, -1, NULL, &permit);
        if (st != CERB_OK) {
            bench_worker_fail(w, "semaphore acquire: %s (%s)", cerb_last_error(),
                              cerb_status_name(st));
            break;
        }
        int64_t t1 = bench_now_ns();
        st = cerb_permit_free(permit); /* releases, then frees */
        t_end = bench_now_ns();
        if (st != CERB_OK) {
            bench_worker_fail(w, "permit release: %s (%s)", cerb_last_error(),
                              cerb_status_name(st));
            break;
        }
        if (bench_worker_done(w, t1))
            break;
        bench_hist_record(w->hist, t1 - t0);
        atomic_store_explicit(&w->ops, ++n, memory_order_relaxed);
    }
    w->end_ns = t_end;
    return NULL;
}

/* The round-trip ceiling's session, or NULL (no ceiling, or it failed:
 * printed, and *failed set). */
static void *rtt_open(const struct bench_engine *e, const struct bench_ceiling *ceil,
                      int *failed)
{
    char err[BENCH_ERR_MAX];
    void *s;
    *failed = 0;
    if (!ceil || !ceil->round_trip)
        return NULL;
    if (!(s = ceil->open(e, err, sizeof err))) {
        bench_errorf("raw round trip: %s", err);
        *failed = 1;
    }
    return s;
}

/* The shared pointer of the measured phases (NULL in the warm-up), for
 * bodies that keep figures of their own. */
static int measured;

/*
 * The rounds both scenarios share: a round-trip phase (when @rc has a
 * session) then the library's phase, @rounds times, each library phase
 * side_ns long. Fills @out's latency (from @lat) and ceiling.
 */
static int prim_rounds(const struct bench_engine *e, const struct bench_opts *o,
                       const char *what, int n, void *(*body)(void *), void **ctxp,
                       struct bench_hist *hists, struct bench_hist *lat,
                       struct bench_rtt_ctx *rc, struct bench_result *out,
                       int64_t *lib_ns)
{
    const int rounds = bench_rounds_for(o->duration_s);
    const int64_t side_ns = (int64_t)(o->duration_s * 1e9 / rounds);
    struct bench_hist *rtt = malloc(sizeof *rtt), *one = malloc(sizeof *one);
    void *rtt_ctxp[1] = {rc};
    char label[96];
    int rv = -1;

    if (!rtt || !one) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(rtt);
    snprintf(label, sizeof label, "%s %s x%d warm-up", what, e->name, n);
    if (rc->sess && bench_run_and_merge(label, 1, bench_warmup_ns(o->duration_s),
                                        bench_rtt_body, rtt_ctxp, NULL, hists, NULL,
                                        NULL, o->progress) != 0)
        goto done;
    if (bench_run_and_merge(label, n, bench_warmup_ns(o->duration_s), body, ctxp, NULL,
                            hists, NULL, NULL, o->progress) != 0)
        goto done;
    for (int round = 1; round <= rounds; round++) {
        if (rc->sess) {
            snprintf(label, sizeof label, "%s %s round trip %d/%d", what, e->name, round,
                     rounds);
            bench_hist_init(one);
            if (bench_run_and_merge(label, 1, side_ns / 2, bench_rtt_body, rtt_ctxp, NULL,
                                    hists, one, NULL, o->progress) != 0)
                goto done;
            bench_hist_merge(rtt, one);
            bench_note_round_p50(out, one);
        }
        snprintf(label, sizeof label, "%s %s x%d cerberus %d/%d", what, e->name, n, round,
                 rounds);
        if (bench_run_and_merge(label, n, side_ns, body, ctxp, &measured, hists, lat, lib_ns,
                                o->progress) != 0)
            goto done;
    }
    bench_fill_latency(out, lat);
    if (rc->sess && rtt->n) {
        out->ceiling_kind = "rtt";
        bench_fill_ceiling_latency(out, rtt);
        if (out->ceiling_p50_us > 0 && lat->n)
            out->ratio = out->p50_us / out->ceiling_p50_us;
    }
    rv = 0;
done:
    free(rtt);
    free(one);
    return rv;
}

int bench_semaphore(const struct bench_engine *e, const struct bench_opts *o, int permits,
                    struct bench_result *out)
{
    const int n = 2 * permits;
    const struct bench_ceiling *ceil = bench_ceiling_find(bench_engine_label(e));
    struct sem_ctx *ctxs = calloc((size_t)n, sizeof *ctxs);
    void **ctxp = calloc((size_t)n, sizeof *ctxp);
    struct bench_hist *hists = calloc((size_t)n, sizeof *hists);
    struct bench_hist *lat = malloc(sizeof *lat);
    struct bench_rtt_ctx rc = {ceil, NULL};
    int64_t lib_ns = 0;
    char name[64];
    int failed, rv = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "semaphore");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = n;
    out->permits = permits;
    out->ratio = out->ratio_paired_median = -1;
    if (!ctxs || !ctxp || !hists || !lat) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lat);
    rc.sess = rtt_open(e, ceil, &failed);
    if (failed)
        goto done;
    snprintf(name, sizeof name, "bench-s-%ld-%d", (long)getpid(), permits);
    for (int i = 0; i < n; i++) {
        cerb_status st;
        if (!(ctxs[i].client = bench_client_open(e)))
            goto done;
        st = cerb_semaphore_new(ctxs[i].client, name, permits, NULL, &ctxs[i].sem);
        if (st != CERB_OK) {
            bench_errorf("cerb_semaphore_new(\"%s\", %d): %s (%s)", name, permits,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        ctxp[i] = &ctxs[i];
    }
    if (prim_rounds(e, o, "semaphore", n, sem_body, ctxp, hists, lat, &rc, out, &lib_ns) != 0)
        goto done;
    out->elapsed_s = (double)lib_ns / 1e9;
    out->ops = lat->n;
    out->ops_per_s = lib_ns > 0 ? (double)lat->n / out->elapsed_s : 0;
    rv = 0;
done:
    if (rc.sess)
        ceil->close(rc.sess);
    for (int i = 0; ctxs && i < n; i++) {
        cerb_semaphore_free(ctxs[i].sem);
        cerb_client_close(ctxs[i].client);
    }
    free(ctxs);
    free(ctxp);
    free(hists);
    free(lat);
    return rv;
}

/* ---------------------------------------------------------------- rwlock */

struct rw_ctx {
    cerb_client *client;
    cerb_rwlock *rw;
    uint32_t rng;                 /* xorshift32 state, never 0 */
    struct bench_hist read_lat;   /* this worker's reads, all phases */
    struct bench_hist write_lat;
};

static uint32_t xorshift32(uint32_t *s)
{
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

static void *rw_body(void *p)
{
    struct bench_worker *w = p;
    struct rw_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        int write = xorshift32(&c->rng) % RW_WRITE_IN == 0;
        cerb_status st = write ? cerb_rwlock_write_lock(c->rw) : cerb_rwlock_read_lock(c->rw);
        if (st != CERB_OK) {
            bench_worker_fail(w, "rwlock %s lock: %s (%s)", write ? "write" : "read",
                              cerb_last_error(), cerb_status_name(st));
            break;
        }
        int64_t t_acq = bench_now_ns(), t;
        do /* the critical section: a little real work, not a sleep */
            t = bench_now_ns();
        while (t - t_acq < RW_HOLD_NS);
        st = write ? cerb_rwlock_write_unlock(c->rw) : cerb_rwlock_read_unlock(c->rw);
        if (st != CERB_OK) {
            bench_worker_fail(w, "rwlock %s unlock: %s (%s)", write ? "write" : "read",
                              cerb_last_error(), cerb_status_name(st));
            break;
        }
        int64_t t1 = bench_now_ns();
        if (bench_worker_done(w, t1)) {
            t0 = t1;
            break;
        }
        bench_hist_record(w->hist, t1 - t0);
        if (w->ph->shared) /* a measured phase, not the warm-up */
            bench_hist_record(write ? &c->write_lat : &c->read_lat, t1 - t0);
        atomic_store_explicit(&w->ops, ++n, memory_order_relaxed);
        t0 = t1;
    }
    w->end_ns = t0;
    return NULL;
}

int bench_rwlock(const struct bench_engine *e, const struct bench_opts *o, int threads,
                 struct bench_result *out)
{
    const int n = threads;
    const struct bench_ceiling *ceil = bench_ceiling_find(bench_engine_label(e));
    struct rw_ctx *ctxs = calloc((size_t)n, sizeof *ctxs);
    void **ctxp = calloc((size_t)n, sizeof *ctxp);
    struct bench_hist *hists = calloc((size_t)n, sizeof *hists);
    struct bench_hist *lat = malloc(sizeof *lat);
    struct bench_hist *rd = malloc(sizeof *rd), *wr = malloc(sizeof *wr);
    struct bench_rtt_ctx rc = {ceil, NULL};
    int64_t lib_ns = 0;
    char name[64];
    int failed, rv = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "rwlock");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = n;
    out->ratio = out->ratio_paired_median = -1;
    if (!ctxs || !ctxp || !hists || !lat || !rd || !wr) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lat);
    bench_hist_init(rd);
    bench_hist_init(wr);
    rc.sess = rtt_open(e, ceil, &failed);
    if (failed)
        goto done;
    snprintf(name, sizeof name, "bench-rw-%ld", (long)getpid());
    for (int i = 0; i < n; i++) {
        cerb_status st;
        if (!(ctxs[i].client = bench_client_open(e)))
            goto done;
        st = cerb_rwlock_new(ctxs[i].client, name, NULL, &ctxs[i].rw);
        if (st != CERB_OK) {
            bench_errorf("cerb_rwlock_new(\"%s\"): %s (%s)", name, cerb_last_error(),
                         cerb_status_name(st));
            goto done;
        }
        bench_hist_init(&ctxs[i].read_lat);
        bench_hist_init(&ctxs[i].write_lat);
        ctxs[i].rng = 0x9e3779b9u ^ (uint32_t)(i + 1) * 2654435761u;
        if (!ctxs[i].rng)
            ctxs[i].rng = 1;
        ctxp[i] = &ctxs[i];
    }
    if (prim_rounds(e, o, "rwlock", n, rw_body, ctxp, hists, lat, &rc, out, &lib_ns) != 0)
        goto done;
    /* The split of reads and writes, from the measured phases. */
    for (int i = 0; i < n; i++) {
        bench_hist_merge(rd, &ctxs[i].read_lat);
        bench_hist_merge(wr, &ctxs[i].write_lat);
    }
    out->rw_reads = rd->n;
    out->rw_writes = wr->n;
    out->read_p50_us = (double)bench_hist_quantile(rd, 0.5) / 1e3;
    out->read_p99_us = (double)bench_hist_quantile(rd, 0.99) / 1e3;
    out->write_p50_us = (double)bench_hist_quantile(wr, 0.5) / 1e3;
    out->write_p99_us = (double)bench_hist_quantile(wr, 0.99) / 1e3;
    out->elapsed_s = (double)lib_ns / 1e9;
    out->ops = lat->n;
    out->ops_per_s = lib_ns > 0 ? (double)lat->n / out->elapsed_s : 0;
    rv = 0;
done:
    if (rc.sess)
        ceil->close(rc.sess);
    for (int i = 0; ctxs && i < n; i++) {
        cerb_rwlock_free(ctxs[i].rw);
        cerb_client_close(ctxs[i].client);
    }
    free(ctxs);
    free(ctxp);
    free(hists);
    free(lat);
    free(rd);
    free(wr);
    return rv;
}
