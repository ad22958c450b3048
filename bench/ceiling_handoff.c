/*
 * ceiling_handoff.c — the raw hand-off: for an engine whose server queues
 * waiters itself (pg's pg_advisory_lock, mysql's GET_LOCK),
 * the least a hand-written client can do to pass a lock from a holder to
 * the next waiter, measured like the `handoff` and `herd` rows measure the
 * library, so those rows can say how far the library is from it besides
 * how many round trips it takes.
 *
 * W bare sessions (one thread each, one connection each) loop: wait (a
 * blocking grant in the server's queue, with the engine's row claimed in
 * the same statement), then the holder's ~20 µs of work, a stamp of the
 * release time, and release (row freed and lock given back in one
 * statement). The next holder takes its return time minus that stamp as
 * the hand-off latency, as ho_body does (scenarios.c). The engine's
 * statements are in its ceiling file (ceiling_<engine>.c), which defines a
 * struct bench_handoff_ceiling; the table below lists them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scenarios.h"

#define HOLD_NS (20 * INT64_C(1000)) /* as the library side's hand-off */

static const struct bench_handoff_ceiling *const handoff_ceilings[] = {
#ifdef CERB_WITH_PG
    &bench_handoff_ceiling_pg,
#endif
#ifdef CERB_WITH_MYSQL
    &bench_handoff_ceiling_mysql, /* GET_LOCK, then the claim; free + RELEASE_LOCK */
#endif
    NULL,
};

const struct bench_handoff_ceiling *bench_handoff_ceiling_find(const char *engine)
{
    for (size_t i = 0; handoff_ceilings[i]; i++)
        if (strcmp(handoff_ceilings[i]->engine, engine) == 0)
            return handoff_ceilings[i];
    return NULL;
}

struct raw_ho_worker {
    struct bench_raw_ho *ho;
    void *sess;
    char token[33];
};

struct bench_raw_ho {
    const struct bench_handoff_ceiling *hc;
    int n;
    char name[64];
    _Atomic int64_t last_release_ns; /* 0 = nobody released yet this phase */
    struct raw_ho_worker *w;
    void **ctxp;
    struct bench_hist *hists;
};

void bench_raw_ho_close(struct bench_raw_ho *ho)
{
    if (!ho)
        return;
    for (int i = 0; ho->w && i < ho->n; i++)
        if (ho->w[i].sess)
            ho->hc->close(ho->w[i].sess);
    free(ho->w);
    free(ho->ctxp);
    free(ho->hists);
    free(ho);
}

struct bench_raw_ho *bench_raw_ho_open(const struct bench_engine *e,
                                       const struct bench_handoff_ceiling *hc, int n,
                                       const char *tag)
{
    struct bench_raw_ho *ho = calloc(1, sizeof *ho);
    if (!ho || !(ho->w = calloc((size_t)n, sizeof *ho->w)) ||
        !(ho->ctxp = calloc((size_t)n, sizeof *ho->ctxp)) ||
        !(ho->hists = calloc((size_t)n, sizeof *ho->hists))) {
        bench_errorf("out of memory");
        if (ho)
            bench_raw_ho_close(ho);
        return NULL;
    }
    ho->hc = hc;
    ho->n = n;
    snprintf(ho->name, sizeof ho->name, "bench-%s-raw-%ld", tag, (long)getpid());
    atomic_init(&ho->last_release_ns, 0);
    for (int i = 0; i < n; i++) {
        char err[BENCH_ERR_MAX];
        ho->w[i].ho = ho;
        snprintf(ho->w[i].token, sizeof ho->w[i].token, "%08lx%08x%016x",
                 (unsigned long)getpid() & 0xffffffffUL, (unsigned)i, 0x4a0du);
        if (!(ho->w[i].sess = hc->open(e, err, sizeof err))) {
            bench_errorf("raw hand-off: %s", err);
            bench_raw_ho_close(ho);
            return NULL;
        }
        ho->ctxp[i] = &ho->w[i];
    }
    return ho;
}

static void *raw_ho_body(void *p)
{
    struct bench_worker *w = p;
    struct raw_ho_worker *c = w->ctx;
    struct bench_raw_ho *ho = c->ho;
    char err[BENCH_ERR_MAX];
    int64_t t_rel = bench_now_ns();
    uint64_t n = 0;

    for (;;) {
        if (ho->hc->wait(c->sess, ho->name, c->token, err, sizeof err) != 0) {
            bench_worker_fail(w, "raw hand-off: %s", err);
            break;
        }
        int64_t t_acq = bench_now_ns();
        if (!bench_worker_done(w, t_acq)) {
            int64_t prev = atomic_load(&ho->last_release_ns);
            if (prev != 0)
                bench_hist_record(w->hist, t_acq - prev);
            atomic_store_explicit(&w->ops, ++n, memory_order_relaxed);
        }
        do
            t_rel = bench_now_ns();
        while (t_rel - t_acq < HOLD_NS);
        atomic_store(&ho->last_release_ns, t_rel);
        if (ho->hc->release(c->sess, ho->name, c->token, err, sizeof err) != 0) {
            bench_worker_fail(w, "raw hand-off: %s", err);
            break;
        }
        if (bench_worker_done(w, t_rel))
            break;
    }
    w->end_ns = t_rel;
    return NULL;
}

int bench_raw_ho_run(struct bench_raw_ho *ho, const char *label, int64_t duration_ns,
                     struct bench_hist *acc, int progress)
{
    atomic_store(&ho->last_release_ns, 0);
    return bench_run_and_merge(label, ho->n, duration_ns, raw_ho_body, ho->ctxp, NULL,
                               ho->hists, acc, NULL, progress);
}

void bench_raw_ho_fill(struct bench_result *r, const struct bench_handoff_ceiling *hc,
                       const struct bench_hist *h)
{
    if (!hc || !h->n)
        return;
    r->raw_ho_what = hc->what;
    r->raw_ho_p50_us = (double)bench_hist_quantile(h, 0.50) / 1e3;
    r->raw_ho_p99_us = (double)bench_hist_quantile(h, 0.99) / 1e3;
}
