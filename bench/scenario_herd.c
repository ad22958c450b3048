/*
 * scenario_herd.c — the `herd` scenario: does one release wake one waiter,
 * or all of them?
 *
 * W waiters, each with a client of its own as W processes would have, queue
 * on ONE name while a holder (one more client, driven by the main thread)
 * holds it. Then the holder releases; every waiter, once its lock returns,
 * releases at once; the round ends when all W have had the lock. A library
 * with a thundering herd wakes every waiter on every release and each of
 * them asks the server again, so a round costs about W²/2 wake-ups and
 * acquire calls; a queue with direct hand-off costs one wake-up and one
 * acquire call (the one that queued the waiter) per acquisition. DESIGN.md
 * §10 sets the target: one wake-up and at most 1.1 acquire calls per
 * acquisition with 100 waiters. The bench prints the figures, not a verdict.
 *
 * A round, driven by the main thread:
 *   1. the holder takes the lock;
 *   2. the waiters are released from a condition variable and call
 *      cerb_lock_trylock_for() (bounded: HERD_WAIT_MS);
 *   3. the main thread waits until every waiter is queued: when the engine
 *      reports protocol counters, until the waiters' acquire_calls have
 *      grown by W (each sent its first acquire), plus HERD_SETTLE_MS for the
 *      last of those requests to reach the server; an engine without
 *      counters gets HERD_BLIND_SETTLE_MS after the last waiter announced
 *      itself. This is the one timed pause in the bench and it is outside
 *      every measured interval: nothing the library offers says "queued on
 *      the server", and a few waiters arriving late would only make the
 *      figures worse, never better;
 *   4. the holder stamps the time and releases; each waiter records the
 *      hand-off latency (its lock's return minus the previous release's
 *      stamp), stamps its own release and unlocks;
 *   5. the round's drain time runs from the holder's release to the last
 *      waiter's release.
 * Round 0 is a warm-up (connections, scripts). Rounds repeat until
 * --duration has passed (at least one, at most HERD_MAX_ROUNDS). The
 * counters are the deltas of cerb_engine_info() summed over the W waiters'
 * clients from just before the first measured round's waiters start to the
 * end — so each waiter's queueing call is counted — divided by W × rounds.
 * The holder's own calls are not counted: it is not one of the W.
 *
 * ops/s is acquisitions ÷ total drain time; p50/p99/max are of the hand-off
 * latency. The ceiling is one server round trip (as in `handoff`), and the
 * ratio hand-off p50 ÷ RTT p50; "n/a" for an engine without a raw ceiling.
 * Where the server queues waiters itself (pg, mysql), W bare sessions also pass a
 * name of their own around in the server's queue (ceiling_handoff.c: wait
 * + claim, free + unlock, in a loop rather than rounds) before the
 * clients open, for half of --duration, and the row gives that raw
 * hand-off's p50 and p99.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "scenarios.h"

#define NS_PER_MS INT64_C(1000000)
#define HERD_WAIT_MS 30000          /* a waiter's longest wait for the lock */
#define HERD_SETTLE_MS 20           /* last queueing request reaches the server */
#define HERD_BLIND_SETTLE_MS 100    /* the same without counters to watch */
#define HERD_POLL_NS (1 * NS_PER_MS) /* counter polling while queueing */
#define HERD_MAX_ROUNDS 1000
/* Longest a phase of a round may take before the run is declared hung. */
#define HERD_PHASE_NS ((HERD_WAIT_MS + 5000) * NS_PER_MS)

struct herd {
    struct bench_sync s;
    int n;
    /* Under s.mu: */
    int round;          /* the round in progress; waiters run it once */
    int measure;        /* record latencies this round (not in warm-up) */
    int entered;        /* waiters of this round about to call lock */
    int done;           /* waiters of this round that locked and unlocked */
    int quit;
    int failed;
    char err[BENCH_ERR_MAX];
    int64_t last_done_ns; /* latest release of this round */
    /* Stamp of the latest release, read by the next holder. */
    _Atomic int64_t last_release_ns;
};

struct herd_waiter {
    struct herd *h;
    cerb_client *client;
    cerb_lock *lock;
    pthread_t tid;
    int started;
    struct bench_hist hist;
};

/* Keep the first failure (s.mu held). */
static void herd_fail_locked(struct herd *h, const char *what, cerb_lock *lk,
                             cerb_status st)
{
    if (h->failed)
        return;
    h->failed = 1;
    snprintf(h->err, sizeof h->err, "%s \"%s\": %s (%s)", what,
             cerb_lock_name(lk), cerb_last_error(), cerb_status_name(st));
}

static void *herd_waiter_main(void *p)
{
    struct herd_waiter *w = p;
    struct herd *h = w->h;
    int mine = 0;

    pthread_mutex_lock(&h->s.mu);
    for (;;) {
        /* The main thread bounds every round; a waiter idles here. */
        while (h->round == mine && !h->quit)
            pthread_cond_wait(&h->s.cond, &h->s.mu);
        if (h->quit)
            break;
        mine = h->round;
        int measure = h->measure;
        h->entered++;
        pthread_cond_broadcast(&h->s.cond);
        pthread_mutex_unlock(&h->s.mu);

        cerb_status st = cerb_lock_trylock_for(w->lock, HERD_WAIT_MS);
        int64_t t_acq = bench_now_ns();
        const char *what = "lock";
        if (st == CERB_OK) {
            int64_t prev = atomic_load(&h->last_release_ns);
            if (measure && prev != 0)
                bench_hist_record(&w->hist, t_acq - prev);
            /* Release at once: the stamp is taken just before unlock. */
            atomic_store(&h->last_release_ns, bench_now_ns());
            st = cerb_lock_unlock(w->lock);
            what = "unlock";
        }
        int64_t t_done = bench_now_ns();

        pthread_mutex_lock(&h->s.mu);
        if (st != CERB_OK)
            herd_fail_locked(h, what, w->lock, st);
        if (t_done > h->last_done_ns)
            h->last_done_ns = t_done;
        h->done++;
        pthread_cond_broadcast(&h->s.cond);
    }
    pthread_mutex_unlock(&h->s.mu);
    return NULL;
}

static void nap_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / INT64_C(1000000000)),
                          (long)(ns % INT64_C(1000000000))};
    nanosleep(&ts, NULL);
}

/* Wait (s.mu held) until *counter reaches @want, or end the run. */
static void herd_wait_count(struct herd *h, const int *counter, int want,
                            const char *what)
{
    int64_t deadline = bench_now_ns() + HERD_PHASE_NS;
    while (*counter < want)
        if (bench_sync_wait_until(&h->s, deadline)) {
            char msg[160];
            snprintf(msg, sizeof msg, "herd: %d of %d waiters %s after %.0f s",
                     *counter, want, what, (double)HERD_PHASE_NS / 1e9);
            bench_hung(msg);
        }
}

/*
 * Step 3 of a round: return once every waiter is (as far as can be seen)
 * queued on the server. @calls0 is the waiters' acquire_calls before the
 * round. Returns 0, or -1 after printing why.
 */
static int herd_wait_queued(struct herd *h, cerb_client **clients,
                            const char *engine, int counters, uint64_t calls0)
{
    pthread_mutex_lock(&h->s.mu);
    herd_wait_count(h, &h->entered, h->n, "started waiting");
    pthread_mutex_unlock(&h->s.mu);
    if (!counters) {
        nap_ns(HERD_BLIND_SETTLE_MS * NS_PER_MS);
        return 0;
    }
    /* Polled: the library has no event for "my request was sent". */
    int64_t deadline = bench_now_ns() + HERD_PHASE_NS;
    for (;;) {
        struct cerb_engine_info sum;
        if (bench_counters_sum(clients, h->n, engine, &sum) != 0)
            return -1;
        if (sum.acquire_calls >= calls0 + (uint64_t)h->n)
            break;
        if (bench_now_ns() >= deadline)
            bench_hung("herd: waiters never sent their acquire requests");
        nap_ns(HERD_POLL_NS);
    }
    nap_ns(HERD_SETTLE_MS * NS_PER_MS);
    return 0;
}

/* The raw hand-off among W bare sessions, closed again before the
 * library's clients open (the server's connections are not endless). */
static int herd_raw(const struct bench_engine *e, const struct bench_handoff_ceiling *hc,
                    const struct bench_opts *o, struct bench_result *out)
{
    struct bench_hist *raw = malloc(sizeof *raw);
    struct bench_raw_ho *ho = NULL;
    char label[96];
    int rc = -1;

    if (!raw) {
        bench_errorf("out of memory");
        return -1;
    }
    bench_hist_init(raw);
    bench_progress(o->progress, "herd %s: opening %d raw sessions", e->name, o->herd_waiters);
    if (!(ho = bench_raw_ho_open(e, hc, o->herd_waiters, "herd")))
        goto done;
    snprintf(label, sizeof label, "herd %s x%d raw", e->name, o->herd_waiters);
    if (bench_raw_ho_run(ho, label, bench_warmup_ns(o->duration_s), NULL, o->progress) != 0 ||
        bench_raw_ho_run(ho, label, (int64_t)(o->duration_s * 1e9 / 2), raw, o->progress) != 0)
        goto done;
    bench_raw_ho_fill(out, hc, raw);
    rc = 0;
done:
    bench_raw_ho_close(ho);
    free(raw);
    return rc;
}

int bench_herd(const struct bench_engine *e, const struct bench_opts *o,
               struct bench_result *out)
{
    const int n = o->herd_waiters;
    const struct bench_ceiling *ceil = bench_ceiling_find(bench_engine_label(e));
    const struct bench_handoff_ceiling *hc = bench_handoff_ceiling_find(bench_engine_label(e));
    struct herd h;
    struct herd_waiter *ws = calloc((size_t)n, sizeof *ws);
    cerb_client **clients = calloc((size_t)n, sizeof *clients);
    struct bench_hist *lat = malloc(sizeof *lat), *rtt = malloc(sizeof *rtt);
    struct bench_hist *rtt_hist = malloc(sizeof *rtt_hist);
    struct bench_rtt_ctx rc_ctx = {ceil, NULL};
    void *rtt_ctxp[1] = {&rc_ctx};
    cerb_client *holder_client = NULL;
    cerb_lock *holder = NULL;
    struct cerb_engine_info before = {0}, after, sum;
    int sync_ok = 0, counters = 0, rounds = 0;
    int64_t drain_ns = 0, measure_start = 0;
    char name[64], label[96];
    int rc = -1;

    memset(&h, 0, sizeof h);
    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "herd");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = n;
    out->ratio = out->ratio_paired_median = -1;
    out->fair = e->cfg ? e->cfg->lock.fair : 1;
    if (!ws || !clients || !lat || !rtt || !rtt_hist) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lat);
    bench_hist_init(rtt);
    if (bench_sync_init(&h.s) != 0)
        goto done;
    sync_ok = 1;
    h.n = n;
    atomic_init(&h.last_release_ns, 0);
    snprintf(name, sizeof name, "bench-herd-%ld", (long)getpid());

    /* The round trip first: a short phase on a bare connection. */
    if (ceil) {
        char err[BENCH_ERR_MAX];
        if (!(rc_ctx.sess = ceil->open(e, err, sizeof err))) {
            bench_errorf("raw ceiling: %s", err);
            goto done;
        }
        snprintf(label, sizeof label, "herd %s round trip", e->name);
        if (bench_run_and_merge(label, 1, bench_warmup_ns(o->duration_s),
                                bench_rtt_body, rtt_ctxp, NULL, rtt_hist, rtt,
                                NULL, o->progress) != 0)
            goto done;
    }
    if (hc && herd_raw(e, hc, o, out) != 0)
        goto done;

    if (!(holder_client = bench_client_open(e)))
        goto done;
    cerb_status st = cerb_lock_new(holder_client, name, NULL, &holder);
    if (st != CERB_OK) {
        bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", name, cerb_last_error(),
                     cerb_status_name(st));
        goto done;
    }
    for (int i = 0; i < n; i++) {
        bench_progress(o->progress, "herd %s: opening client %d/%d", e->name,
                       i + 1, n);
        ws[i].h = &h;
        bench_hist_init(&ws[i].hist);
        if (!(clients[i] = ws[i].client = bench_client_open(e)))
            goto done;
        st = cerb_lock_new(clients[i], name, NULL, &ws[i].lock);
        if (st != CERB_OK) {
            bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", name,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        int err = pthread_create(&ws[i].tid, NULL, herd_waiter_main, &ws[i]);
        if (err) {
            bench_errorf("herd: cannot start waiter %d of %d: %s", i + 1, n,
                         strerror(err));
            goto done;
        }
        ws[i].started = 1;
    }

    for (int round = 0;; round++) {
        st = cerb_lock_trylock_for(holder, HERD_WAIT_MS);
        if (st != CERB_OK) {
            bench_errorf("herd: holder lock \"%s\": %s (%s)", name,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        if (bench_counters_sum(clients, n, e->name, &sum) != 0)
            goto done;
        if (round == 1) {
            before = sum;
            measure_start = bench_now_ns();
        }
        pthread_mutex_lock(&h.s.mu);
        h.round++;
        h.measure = round > 0;
        h.entered = h.done = 0;
        h.last_done_ns = 0;
        pthread_cond_broadcast(&h.s.cond);
        pthread_mutex_unlock(&h.s.mu);

        if (round == 0) {
            /* Round 0 tells whether the engine counts its acquire calls;
             * until then, wait the blind settle time. */
            pthread_mutex_lock(&h.s.mu);
            herd_wait_count(&h, &h.entered, n, "started waiting");
            pthread_mutex_unlock(&h.s.mu);
            nap_ns(HERD_BLIND_SETTLE_MS * NS_PER_MS);
        } else if (herd_wait_queued(&h, clients, e->name, counters,
                                    sum.acquire_calls) != 0) {
            goto done;
        }
        if (round == 0) {
            struct cerb_engine_info now;
            if (bench_counters_sum(clients, n, e->name, &now) != 0)
                goto done;
            counters = now.acquire_calls > sum.acquire_calls;
        }

        bench_progress(o->progress, "herd %s x%d: round %d, releasing",
                       e->name, n, round);
        int64_t t_rel = bench_now_ns();
        atomic_store(&h.last_release_ns, t_rel);
        st = cerb_lock_unlock(holder);
        if (st != CERB_OK) {
            bench_errorf("herd: holder unlock \"%s\": %s (%s)", name,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        pthread_mutex_lock(&h.s.mu);
        herd_wait_count(&h, &h.done, n, "had the lock");
        int failed = h.failed;
        int64_t last = h.last_done_ns;
        pthread_mutex_unlock(&h.s.mu);
        if (failed) {
            bench_errorf("herd: %s", h.err);
            goto done;
        }
        if (round == 0)
            continue;
        drain_ns += last - t_rel;
        rounds++;
        if (bench_now_ns() - measure_start >= (int64_t)(o->duration_s * 1e9) ||
            rounds >= HERD_MAX_ROUNDS)
            break;
    }
    if (bench_counters_sum(clients, n, e->name, &after) != 0)
        goto done;

    for (int i = 0; i < n; i++)
        bench_hist_merge(lat, &ws[i].hist);
    out->rounds = rounds;
    out->acquisitions = (uint64_t)n * (uint64_t)rounds;
    out->ops = out->acquisitions;
    out->elapsed_s = (double)drain_ns / 1e9;
    out->ops_per_s = drain_ns > 0 ? (double)out->ops / out->elapsed_s : 0;
    out->drain_ms = rounds ? (double)drain_ns / 1e6 / rounds : 0;
    bench_fill_latency(out, lat);
    out->acquire_calls = after.acquire_calls - before.acquire_calls;
    out->wakeups = after.wakeups - before.wakeups;
    out->handoffs = after.handoffs - before.handoffs;
    out->has_counters = counters > 0;
    if (ceil && rtt->n) {
        out->ceiling_kind = "rtt";
        bench_fill_ceiling_latency(out, rtt);
        out->ceiling_round_p50_min_us = out->ceiling_round_p50_max_us =
            out->ceiling_p50_us;
        if (out->ceiling_p50_us > 0 && lat->n)
            out->ratio = out->p50_us / out->ceiling_p50_us;
    }
    rc = 0;

done:
    bench_progress_clear();
    if (sync_ok) {
        pthread_mutex_lock(&h.s.mu);
        h.quit = 1;
        pthread_cond_broadcast(&h.s.cond);
        pthread_mutex_unlock(&h.s.mu);
    }
    /* A waiter still in its lock call returns within HERD_WAIT_MS: the
     * holder is released below only after the joins, so release it first
     * when a round broke off with it held. */
    if (holder && cerb_lock_hold_count(holder))
        cerb_lock_unlock(holder);
    for (int i = 0; ws && i < n; i++)
        if (ws[i].started)
            pthread_join(ws[i].tid, NULL);
    for (int i = 0; ws && i < n; i++) {
        cerb_lock_free(ws[i].lock);
        cerb_client_close(ws[i].client);
    }
    cerb_lock_free(holder);
    cerb_client_close(holder_client);
    if (rc_ctx.sess)
        ceil->close(rc_ctx.sess);
    if (sync_ok)
        bench_sync_destroy(&h.s);
    free(ws);
    free(clients);
    free(lat);
    free(rtt);
    free(rtt_hist);
    return rc;
}
