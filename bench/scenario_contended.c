/*
 * scenario_contended.c — the `contended` scenario: N threads, each with a
 * client of its own as N processes would have, lock and unlock ONE name
 * as fast as they can, and the raw contended ceiling on the same server.
 *
 * Library side. Every thread loops lock → unlock on the shared name with
 * the configured lock options (lock.fair decides FIFO hand-off or barging).
 * The figure per acquisition is the acquire wait: the time cerb_lock_lock()
 * took, from the call to its return. Every acquisition counts, also those
 * that complete after the deadline while the queue drains, and the phase's
 * measured length runs to the last worker's end, so ops/s is exact. The
 * engine's protocol counters (cerb_engine_info: acquire_calls, wakeups,
 * hand-offs) are summed over the N clients after the warm-up and after the
 * last round; their deltas divided by the acquisitions say what one
 * acquisition costs on the wire.
 *
 * Raw ceiling. The least a client without a library can do on the same
 * server with the same number of threads on one key: for Redis, each thread
 * on its own bare hiredis connection sends `SET key token NX PX 10000` and,
 * when that answers nil (someone else holds it), sends it again at once —
 * no wait, no queue, no notification — then releases with the
 * compare-and-delete script. Its ops/s is the ceiling and the ratio is
 * library ops/s ÷ ceiling ops/s. The spinning ceiling keeps the server busy
 * with failed tries, which is exactly what a lock library must avoid, so a
 * ratio near or above 1 means the library's waiting costs nothing. As in
 * `uncontended`, the two sides alternate in short rounds after a warm-up.
 *
 * For pg (ceiling_pg.c) the try is pg_try_advisory_lock with the lease row
 * claimed in the same statement, retried at once while another session
 * holds the lock, and the release frees the row and unlocks in one. For
 * mysql (ceiling_mysql.c) likewise: the grant UPDATE whose condition ends
 * in GET_LOCK(name, 0), and the UPDATE that frees the row and calls
 * RELEASE_LOCK. For memcached (ceiling_memcached.c): `ms` in add mode,
 * retried at once on NS, and `md` with the CAS of the grant.
 *
 * The contended ceiling has its own small table (struct
 * bench_contended_ceiling) rather than new members of struct bench_ceiling,
 * whose initialisers live in other files; its Redis side is ceiling.c's
 * bare session (bench_redis_*).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "scenarios.h"

/* ------------------------------------------------- redis contended ceiling */

/* The bare hiredis session of the uncontended ceiling (ceiling.c): SET NX PX
 * to try, the compare-and-delete script to release. */
static const struct bench_contended_ceiling redis_contended = {
    .engine = "redis",
    .open = bench_redis_open,
    .try_acquire = bench_redis_try,
    .release = bench_redis_release,
    .close = bench_redis_close,
};

static const struct bench_contended_ceiling *const contended_ceilings[] = {
    &redis_contended,
#ifdef CERB_WITH_PG
    &bench_contended_ceiling_pg, /* ceiling_pg.c */
#endif
#ifdef CERB_WITH_MYSQL
    &bench_contended_ceiling_mysql, /* ceiling_mysql.c */
#endif
#ifdef CERB_WITH_MEMCACHED
    &bench_contended_ceiling_memcached, /* ceiling_memcached.c */
#endif
};

const struct bench_contended_ceiling *
bench_contended_ceiling_find(const char *engine)
{
    for (size_t i = 0; i < sizeof contended_ceilings / sizeof contended_ceilings[0]; i++)
        if (strcmp(engine, contended_ceilings[i]->engine) == 0)
            return contended_ceilings[i];
    return NULL;
}

/* ------------------------------------------------------------- scenario */

struct ct_ctx {
    cerb_client *client;                        /* library side */
    cerb_lock *lock;
    uint64_t acquisitions;                      /* since the last reset */
    const struct bench_contended_ceiling *ceil; /* ceiling side */
    void *sess;
    const char *raw_name;
    char token[33];
};

static void *ct_library_body(void *p)
{
    struct bench_worker *w = p;
    struct ct_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t1 = bench_now_ns();

    for (;;) {
        int64_t t0 = bench_now_ns();
        cerb_status st = cerb_lock_lock(c->lock);
        t1 = bench_now_ns();
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "lock", c->lock, st);
            break;
        }
        bench_hist_record(w->hist, t1 - t0);
        c->acquisitions++;
        atomic_store_explicit(&w->ops, ++n, memory_order_relaxed);
        st = cerb_lock_unlock(c->lock);
        t1 = bench_now_ns();
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "unlock", c->lock, st);
            break;
        }
        if (bench_worker_done(w, t1))
            break;
    }
    w->end_ns = t1;
    return NULL;
}

static void *ct_ceiling_body(void *p)
{
    struct bench_worker *w = p;
    struct ct_ctx *c = w->ctx;
    char err[BENCH_ERR_MAX];
    uint64_t n = 0;
    int64_t t1 = bench_now_ns();

    for (;;) {
        int64_t t0 = bench_now_ns();
        int got;
        /* Retry at once: no wait, no queue. A failed phase stops the spin
         * (the holder may be gone without releasing). */
        while ((got = c->ceil->try_acquire(c->sess, c->raw_name, c->token, err,
                                           sizeof err)) == 0)
            if (atomic_load_explicit(&w->ph->stop, memory_order_relaxed))
                goto out;
        t1 = bench_now_ns();
        if (got < 0) {
            bench_worker_fail(w, "raw contended ceiling: %s", err);
            break;
        }
        bench_hist_record(w->hist, t1 - t0);
        atomic_store_explicit(&w->ops, ++n, memory_order_relaxed);
        if (c->ceil->release(c->sess, c->raw_name, c->token, err,
                             sizeof err) != 0) {
            bench_worker_fail(w, "raw contended ceiling: %s", err);
            break;
        }
        t1 = bench_now_ns();
        if (bench_worker_done(w, t1))
            break;
    }
out:
    w->end_ns = t1;
    return NULL;
}

int bench_contended(const struct bench_engine *e, const struct bench_opts *o,
                    int threads, struct bench_result *out)
{
    const struct bench_contended_ceiling *ceil =
        bench_contended_ceiling_find(bench_engine_label(e));
    struct ct_ctx *ctxs = calloc((size_t)threads, sizeof *ctxs);
    void **ctxp = calloc((size_t)threads, sizeof *ctxp);
    cerb_client **clients = calloc((size_t)threads, sizeof *clients);
    struct bench_hist *hists = calloc((size_t)threads, sizeof *hists);
    struct bench_hist *lib = malloc(sizeof *lib), *raw = malloc(sizeof *raw);
    struct bench_hist *one = malloc(sizeof *one); /* one ceiling round */
    struct cerb_engine_info before, after;
    int64_t lib_ns = 0, raw_ns = 0;
    const int rounds = bench_rounds_for(o->duration_s);
    const int64_t side_ns = (int64_t)(o->duration_s * 1e9 / rounds);
    double paired[BENCH_MAX_ROUNDS];
    int n_paired = 0;
    char name[64], raw_name[64], label[96];
    int rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "contended");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = threads;
    out->ratio = out->ratio_paired_median = -1;
    out->fair = e->cfg ? e->cfg->lock.fair : 1;
    if (!ctxs || !ctxp || !clients || !hists || !lib || !raw || !one) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lib);
    bench_hist_init(raw);
    snprintf(name, sizeof name, "bench-ct-%ld", (long)getpid());
    snprintf(raw_name, sizeof raw_name, "bench-ctr-%ld", (long)getpid());

    for (int i = 0; ceil && i < threads; i++) {
        char err[BENCH_ERR_MAX];
        if (!(ctxs[i].sess = ceil->open(e, err, sizeof err))) {
            bench_errorf("raw contended ceiling: %s", err);
            goto done;
        }
    }
    for (int i = 0; i < threads; i++) {
        if (!(clients[i] = bench_client_open(e)))
            goto done;
        ctxs[i].client = clients[i];
        cerb_status st = cerb_lock_new(clients[i], name, NULL, &ctxs[i].lock);
        if (st != CERB_OK) {
            bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", name,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        ctxs[i].ceil = ceil;
        ctxs[i].raw_name = raw_name;
        /* A distinct fixed owner value per thread, 32 hex like a token. */
        snprintf(ctxs[i].token, sizeof ctxs[i].token, "%08lx%08x%016x",
                 (unsigned long)getpid() & 0xffffffffUL, (unsigned)i, 0xc0e7u);
        ctxp[i] = &ctxs[i];
    }

    snprintf(label, sizeof label, "contended %s x%d warm-up", e->name,
             threads);
    if (ceil && bench_run_and_merge(label, threads,
                                    bench_warmup_ns(o->duration_s),
                                    ct_ceiling_body, ctxp, NULL, hists, NULL,
                                    NULL, o->progress) != 0)
        goto done;
    if (bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s),
                            ct_library_body, ctxp, NULL, hists, NULL, NULL,
                            o->progress) != 0)
        goto done;
    for (int i = 0; i < threads; i++)
        ctxs[i].acquisitions = 0;
    if (bench_counters_sum(clients, threads, e->name, &before) != 0)
        goto done;

    for (int round = 1; round <= rounds; round++) {
        int64_t raw_before_ns = raw_ns, lib_before_ns = lib_ns;
        uint64_t lib_before = lib->n;
        if (ceil) {
            snprintf(label, sizeof label, "contended %s x%d raw %d/%d",
                     e->name, threads, round, rounds);
            bench_hist_init(one);
            if (bench_run_and_merge(label, threads, side_ns, ct_ceiling_body,
                                    ctxp, NULL, hists, one, &raw_ns,
                                    o->progress) != 0)
                goto done;
            bench_hist_merge(raw, one);
            bench_note_round_p50(out, one);
        }
        snprintf(label, sizeof label, "contended %s x%d cerberus %d/%d",
                 e->name, threads, round, rounds);
        if (bench_run_and_merge(label, threads, side_ns, ct_library_body,
                                ctxp, NULL, hists, lib, &lib_ns,
                                o->progress) != 0)
            goto done;
        if (ceil && one->n && raw_ns > raw_before_ns &&
            lib_ns > lib_before_ns) {
            double lib_rate = (double)(lib->n - lib_before) /
                              (double)(lib_ns - lib_before_ns);
            double raw_rate = (double)one->n / (double)(raw_ns - raw_before_ns);
            paired[n_paired++] = lib_rate / raw_rate;
        }
    }
    out->ratio_paired_median = bench_median(paired, n_paired);
    if (bench_counters_sum(clients, threads, e->name, &after) != 0)
        goto done;

    out->elapsed_s = (double)lib_ns / 1e9;
    out->ops = lib->n;
    out->ops_per_s = lib_ns > 0 ? (double)lib->n / out->elapsed_s : 0;
    bench_fill_latency(out, lib);
    for (int i = 0; i < threads; i++)
        out->acquisitions += ctxs[i].acquisitions;
    out->acquire_calls = after.acquire_calls - before.acquire_calls;
    out->wakeups = after.wakeups - before.wakeups;
    out->handoffs = after.handoffs - before.handoffs;
    out->has_counters = out->acquire_calls || out->wakeups || out->handoffs;
    if (ceil && raw_ns > 0) {
        out->ceiling_kind = "ops";
        out->ceiling_ops_per_s = (double)raw->n / ((double)raw_ns / 1e9);
        bench_fill_ceiling_latency(out, raw);
        if (out->ceiling_ops_per_s > 0)
            out->ratio = out->ops_per_s / out->ceiling_ops_per_s;
    }
    rc = 0;

done:
    for (int i = 0; ctxs && i < threads; i++) {
        if (ctxs[i].sess)
            ceil->close(ctxs[i].sess);
        cerb_lock_free(ctxs[i].lock);
    }
    for (int i = 0; clients && i < threads; i++)
        cerb_client_close(clients[i]);
    free(ctxs);
    free(ctxp);
    free(clients);
    free(hists);
    free(lib);
    free(raw);
    free(one);
    return rc;
}
