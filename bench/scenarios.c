/*
 * scenarios.c — the timed phase runner and the scenarios of cerberus-bench.
 *
 * Phase runner. A phase starts n worker threads, which wait at a start gate
 * until all exist; the main thread then stamps the start time and the
 * deadline and opens the gate. Each worker loops its operation until the
 * deadline, timing each one into its own histogram and publishing its count
 * in its own padded slot (a relaxed store read only by the progress line), so
 * the hot path shares nothing. The main thread waits on a monotonic condition
 * variable for the workers to finish, waking every 250 ms to redraw the
 * progress line when stderr is a terminal. A phase whose workers have not
 * all returned BENCH_GRACE_NS after the deadline ends the process: every run
 * is bounded even if a server or a library call hangs.
 *
 * uncontended: N threads share one client (its pool sized to N) and loop
 * lock + unlock on a name of their own; a cycle's latency is from before
 * lock to after unlock. In the same run, the raw ceiling (ceiling.c) does
 * the same with one bare connection per thread. The two sides alternate in
 * rounds of about half a second each — ceiling, library, ceiling, library,
 * ... — after a short unmeasured warm-up of each, and their rounds are
 * summed, so machine noise (which on a shared virtual machine comes in
 * regimes lasting seconds) is as likely to hit either side.
 *
 * handoff: W waiters, each with its own client as separate processes would
 * have, contend for one name in fair mode. A holder does ~20 µs of busy work,
 * stamps a shared "last release" time just before unlock, and unlocks; the
 * next holder, right after its lock returns, takes its own time minus that
 * stamp as the hand-off latency. Only one thread holds the lock at a time, so
 * the stamp it reads is its predecessor's. Acquisitions after the deadline
 * (the queue draining) are not timed but are counted for the per-acquisition
 * protocol counters, which are deltas of cerb_engine_info() summed over the
 * clients. The ceiling is one server round trip (PING p50 on a bare
 * connection), measured in phases half as long as, and alternating with,
 * the hand-off rounds. Where the server queues waiters itself (pg, mysql), a raw
 * hand-off among W bare sessions (ceiling_handoff.c) runs in phases of the
 * same length in the same rounds, and the row gives its p50 and p99 too.
 *
 * The helpers the other scenario files share (bench_run_and_merge, the
 * latency fillers, bench_sync for scenarios with threads of their own, the
 * progress line) live here too; contended, herd and many are each in a
 * scenario_<name>.c of their own.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h" /* cerb__client_open_config: pinned clients */
#include "scenarios.h"

#define NS_PER_S INT64_C(1000000000)
#define PROGRESS_TICK_NS (250 * INT64_C(1000000))
#define HOLD_NS (20 * INT64_C(1000)) /* handoff: work done while holding */

/* ------------------------------------------------------------- utilities */

int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* 1 while a progress line is on the screen and must be erased before other
 * output. Only the main thread draws it. */
static int progress_shown;

void bench_progress_clear(void)
{
    if (progress_shown) {
        fputs("\r\033[K", stderr);
        progress_shown = 0;
    }
}

void bench_errorf(const char *fmt, ...)
{
    va_list ap;
    bench_progress_clear();
    fputs("cerberus-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void bench_progress(int enabled, const char *fmt, ...)
{
    va_list ap;
    if (!enabled)
        return;
    fputs("\r\033[K", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
    progress_shown = 1;
}

struct bench_result *bench_rows_slot(struct bench_rows *rows)
{
    if (rows->n == rows->cap) {
        size_t ncap = rows->cap ? 2 * rows->cap : 8;
        struct bench_result *nv = realloc(rows->v, ncap * sizeof *nv);
        if (!nv) {
            bench_errorf("out of memory");
            return NULL;
        }
        rows->v = nv;
        rows->cap = ncap;
    }
    memset(&rows->v[rows->n], 0, sizeof rows->v[rows->n]);
    return &rows->v[rows->n];
}

_Noreturn void bench_hung(const char *what)
{
    bench_errorf("%s (server or library hung?); giving up", what);
    fflush(stdout);
    exit(3);
}

/* ------------------------------------------------------ scenario threads */

int bench_sync_init(struct bench_sync *s)
{
    pthread_condattr_t a;
    int err = pthread_mutex_init(&s->mu, NULL);
    if (err) {
        bench_errorf("pthread_mutex_init: %s", strerror(err));
        return -1;
    }
    if ((err = pthread_condattr_init(&a)) != 0 ||
        (err = pthread_condattr_setclock(&a, CLOCK_MONOTONIC)) != 0 ||
        (err = pthread_cond_init(&s->cond, &a)) != 0) {
        bench_errorf("pthread_cond_init: %s", strerror(err));
        pthread_mutex_destroy(&s->mu);
        return -1;
    }
    pthread_condattr_destroy(&a);
    return 0;
}

void bench_sync_destroy(struct bench_sync *s)
{
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
}

int bench_sync_wait_until(struct bench_sync *s, int64_t deadline_ns)
{
    if (bench_now_ns() >= deadline_ns)
        return 1;
    struct timespec ts = {(time_t)(deadline_ns / NS_PER_S),
                          (long)(deadline_ns % NS_PER_S)};
    pthread_cond_timedwait(&s->cond, &s->mu, &ts);
    return 0;
}

/* ---------------------------------------------------------- phase runner */

/* Phases run one at a time, so the runner's synchronisation is static. */
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t run_cond; /* CLOCK_MONOTONIC, made once */
static pthread_once_t run_once = PTHREAD_ONCE_INIT;
static int run_gate_open; /* the workers may start */
static int run_done;      /* workers that returned */

struct run_arg {
    struct bench_worker *w;
    void *(*body)(void *);
};

static void run_init(void)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) ||
        pthread_condattr_setclock(&a, CLOCK_MONOTONIC) ||
        pthread_cond_init(&run_cond, &a))
        abort(); /* cannot fail on Linux with valid arguments */
    pthread_condattr_destroy(&a);
}

/* Wait on run_cond until @deadline_ns (run_mu held). */
static void run_wait_until(int64_t deadline_ns)
{
    struct timespec ts = {(time_t)(deadline_ns / NS_PER_S),
                          (long)(deadline_ns % NS_PER_S)};
    pthread_cond_timedwait(&run_cond, &run_mu, &ts);
}

static void *run_trampoline(void *p)
{
    struct run_arg *a = p;
    struct bench_worker *w = a->w;

    pthread_mutex_lock(&run_mu);
    while (!run_gate_open)
        pthread_cond_wait(&run_cond, &run_mu);
    pthread_mutex_unlock(&run_mu);

    w->end_ns = w->ph->start_ns;
    if (!atomic_load(&w->ph->stop))
        a->body(w);

    pthread_mutex_lock(&run_mu);
    run_done++;
    pthread_cond_broadcast(&run_cond);
    pthread_mutex_unlock(&run_mu);
    return NULL;
}

void bench_worker_fail(struct bench_worker *w, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&run_mu);
    if (!w->ph->failed) {
        w->ph->failed = 1;
        va_start(ap, fmt);
        vsnprintf(w->ph->err, sizeof w->ph->err, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&run_mu);
    atomic_store(&w->ph->stop, 1);
}

void bench_worker_fail_lock(struct bench_worker *w, const char *what,
                            const cerb_lock *lock, cerb_status st)
{
    bench_worker_fail(w, "%s \"%s\": %s (%s)", what, cerb_lock_name(lock),
                      cerb_last_error(), cerb_status_name(st));
}

static void progress_draw(const struct bench_phase *ph, int64_t now)
{
    uint64_t ops = 0;
    for (int i = 0; i < ph->n; i++)
        ops += atomic_load_explicit(&ph->w[i].ops, memory_order_relaxed);
    double t = (double)(now - ph->start_ns) / 1e9;
    double total = (double)(ph->deadline_ns - ph->start_ns) / 1e9;
    if (t > total)
        t = total;
    fprintf(stderr, "\r\033[K%s: %.1f/%.1f s, %llu ops (%.0f/s)", ph->label, t,
            total, (unsigned long long)ops, t > 0 ? (double)ops / t : 0.0);
    fflush(stderr);
    progress_shown = 1;
}

int bench_phase_run(struct bench_phase *ph, const char *label, int n,
                    int64_t duration_ns, void *(*body)(void *), void **ctx,
                    void *shared, struct bench_hist *hists, int progress)
{
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    struct run_arg *args = calloc((size_t)n, sizeof *args);
    struct bench_worker *w = calloc((size_t)n, sizeof *w);
    int started = 0, rc = 0;

    pthread_once(&run_once, run_init);
    memset(ph, 0, sizeof *ph);
    ph->label = label;
    ph->n = n;
    ph->w = w;
    ph->shared = shared;
    if (!tids || !args || !w) {
        bench_errorf("%s: out of memory", label);
        free(tids);
        free(args);
        free(w);
        ph->w = NULL;
        return -1;
    }
    run_gate_open = 0;
    run_done = 0;
    for (int i = 0; i < n; i++) {
        bench_hist_init(&hists[i]);
        w[i].ph = ph;
        w[i].idx = i;
        w[i].ctx = ctx ? ctx[i] : NULL;
        w[i].hist = &hists[i];
        args[i].w = &w[i];
        args[i].body = body;
        int err = pthread_create(&tids[i], NULL, run_trampoline, &args[i]);
        if (err) {
            bench_errorf("%s: cannot start thread %d of %d: %s", label, i + 1,
                         n, strerror(err));
            atomic_store(&ph->stop, 1);
            rc = -1;
            break;
        }
        started++;
    }

    /* Open the gate: the deadline is known before any worker reads it. */
    pthread_mutex_lock(&run_mu);
    ph->start_ns = bench_now_ns();
    ph->deadline_ns = ph->start_ns + duration_ns;
    run_gate_open = 1;
    pthread_cond_broadcast(&run_cond);
    int64_t give_up = ph->deadline_ns + BENCH_GRACE_NS;
    int64_t tick = ph->start_ns + PROGRESS_TICK_NS;
    while (run_done < started) {
        int64_t now = bench_now_ns();
        if (now >= give_up) {
            pthread_mutex_unlock(&run_mu);
            bench_errorf("%s: %d of %d workers still busy %.0f s after the "
                         "end of the phase (server or library hung?); giving "
                         "up",
                         label, started - run_done, started,
                         (double)BENCH_GRACE_NS / 1e9);
            fflush(stdout);
            exit(3);
        }
        if (progress && now >= tick) {
            progress_draw(ph, now);
            tick = now + PROGRESS_TICK_NS;
        }
        run_wait_until(progress && tick < give_up ? tick : give_up);
    }
    pthread_mutex_unlock(&run_mu);

    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    bench_progress_clear();
    free(tids);
    free(args);
    /* ph->w stays for the caller (end times, counts); freed by phase_end. */
    return rc;
}

/* Free what bench_phase_run() left in @ph. */
static void phase_end(struct bench_phase *ph)
{
    free(ph->w);
    ph->w = NULL;
}

/* Measured length of a finished phase: start to the last worker's end. */
static int64_t phase_elapsed(const struct bench_phase *ph)
{
    int64_t end = ph->start_ns;
    for (int i = 0; i < ph->n; i++)
        if (ph->w[i].end_ns > end)
            end = ph->w[i].end_ns;
    return end - ph->start_ns;
}

/* ---------------------------------------------------------------- client */

cerb_client *bench_client_open(const struct bench_engine *e)
{
    /* Pinned with `active` from the start rather than switched to after
     * opening, and without a switch grace: a gate on the other engines
     * (every acquisition would first ask them whether the name is free) is
     * not what is measured. */
    struct cerb_config *cfg = NULL;
    cerb_client *c = NULL;
    cerb_status st = e->config_path ? cerb__config_from_file(e->config_path, &cfg)
                                    : cerb__config_from_string(e->config_text, &cfg);
    if (st == CERB_OK) {
        /* Not a client following the file: a fresh mtime would otherwise
         * make it ask the other engines for the first seconds (settling). */
        cerb__config_forget_path(cfg);
        snprintf(cfg->active, sizeof cfg->active, "%s", e->name);
        /* One engine is measured: a pinned client gates every other
         * configured engine (each acquisition would ask them first while
         * they answer), which belongs to the failover scenario, not here. */
        cfg->failover.switch_grace_ms = 0;
        st = cerb__client_open_config(&c, cfg);
    }
    if (st != CERB_OK) {
        bench_errorf("cannot open a client for engine %s: %s (%s)", e->name,
                     cerb_last_error(), cerb_status_name(st));
        return NULL;
    }
    if (strcmp(cerb_engine_current(c), e->name) != 0) {
        bench_errorf("engine %s did not open (the client is on %s)", e->name,
                     cerb_engine_current(c));
        cerb_client_close(c);
        return NULL;
    }
    return c;
}

void bench_fill_latency(struct bench_result *r, const struct bench_hist *h)
{
    r->p50_us = (double)bench_hist_quantile(h, 0.50) / 1e3;
    r->p90_us = (double)bench_hist_quantile(h, 0.90) / 1e3;
    r->p99_us = (double)bench_hist_quantile(h, 0.99) / 1e3;
    r->max_us = (double)h->max_ns / 1e3;
    r->mean_us = bench_hist_mean(h) / 1e3;
}

void bench_fill_ceiling_latency(struct bench_result *r,
                                const struct bench_hist *h)
{
    r->ceiling_p50_us = (double)bench_hist_quantile(h, 0.50) / 1e3;
    r->ceiling_p99_us = (double)bench_hist_quantile(h, 0.99) / 1e3;
    r->ceiling_max_us = (double)h->max_ns / 1e3;
}

/* Warm-up length: a tenth of a side's time, 50..500 ms. Connections are
 * made, scripts loaded and caches filled before anything is measured. */
int64_t bench_warmup_ns(double duration_s)
{
    int64_t w = (int64_t)(duration_s * 1e8);
    if (w < 50 * INT64_C(1000000))
        w = 50 * INT64_C(1000000);
    if (w > 500 * INT64_C(1000000))
        w = 500 * INT64_C(1000000);
    return w;
}

/*
 * Number of alternating rounds: each side gets about ROUND_TARGET_NS per
 * round, at least 2 rounds. On a shared or virtual machine the round-trip
 * time switches between regimes that last seconds (measured here: PING p50
 * 20 µs for a few seconds, then 70 µs), so short alternating rounds are what
 * lets both sides see the same mix of regimes.
 */
#define ROUND_TARGET_NS (500 * INT64_C(1000000))
#define MAX_ROUNDS BENCH_MAX_ROUNDS

int bench_rounds_for(double duration_s)
{
    int r = (int)(duration_s * 1e9 / (double)ROUND_TARGET_NS + 0.5);
    return r < 2 ? 2 : r > MAX_ROUNDS ? MAX_ROUNDS : r;
}

/* Remember the smallest and largest per-round p50 of the ceiling side. */
void bench_note_round_p50(struct bench_result *r, const struct bench_hist *h)
{
    double p50 = (double)bench_hist_quantile(h, 0.50) / 1e3;
    if (r->ceiling_round_p50_min_us == 0 || p50 < r->ceiling_round_p50_min_us)
        r->ceiling_round_p50_min_us = p50;
    if (p50 > r->ceiling_round_p50_max_us)
        r->ceiling_round_p50_max_us = p50;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    if (n == 0)
        return -1;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int bench_run_and_merge(const char *label, int n, int64_t dur_ns,
                        void *(*body)(void *), void **ctx, void *shared,
                        struct bench_hist *hists, struct bench_hist *acc,
                        int64_t *elapsed_ns, int progress)
{
    struct bench_phase ph;
    if (bench_phase_run(&ph, label, n, dur_ns, body, ctx, shared, hists,
                        progress) != 0) {
        phase_end(&ph);
        return -1;
    }
    if (ph.failed) {
        bench_errorf("%s: %s", label, ph.err);
        phase_end(&ph);
        return -1;
    }
    if (acc)
        for (int i = 0; i < n; i++)
            bench_hist_merge(acc, &hists[i]);
    if (elapsed_ns)
        *elapsed_ns += phase_elapsed(&ph);
    phase_end(&ph);
    return 0;
}

/* ----------------------------------------------------------- uncontended */

struct unc_ctx {
    cerb_lock *lock;                    /* library side */
    void *sess;                         /* ceiling side */
    const struct bench_ceiling *ceil;
    char name[64];                      /* ceiling key */
    char token[33];                     /* ceiling owner value */
};

static void *unc_library_body(void *p)
{
    struct bench_worker *w = p;
    struct unc_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        cerb_status st = cerb_lock_lock(c->lock);
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "lock", c->lock, st);
            break;
        }
        st = cerb_lock_unlock(c->lock);
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "unlock", c->lock, st);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

static void *unc_ceiling_body(void *p)
{
    struct bench_worker *w = p;
    struct unc_ctx *c = w->ctx;
    char err[BENCH_ERR_MAX];
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        if (c->ceil->cycle(c->sess, c->name, c->token, err, sizeof err) != 0) {
            bench_worker_fail(w, "raw ceiling: %s", err);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

int bench_uncontended(const struct bench_engine *e, const struct bench_opts *o,
                      int threads, struct bench_result *out)
{
    const struct bench_ceiling *ceil = bench_ceiling_find(bench_engine_label(e));
    struct unc_ctx *ctxs = calloc((size_t)threads, sizeof *ctxs);
    void **ctxp = calloc((size_t)threads, sizeof *ctxp);
    struct bench_hist *hists = calloc((size_t)threads, sizeof *hists);
    struct bench_hist *lib = malloc(sizeof *lib), *raw = malloc(sizeof *raw);
    struct bench_hist *one = malloc(sizeof *one); /* one ceiling round */
    cerb_client *client = NULL;
    int64_t lib_ns = 0, raw_ns = 0;
    const int rounds = bench_rounds_for(o->duration_s);
    const int64_t side_ns = (int64_t)(o->duration_s * 1e9 / rounds);
    double paired[MAX_ROUNDS];
    int n_paired = 0;
    char label[96];
    int rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "uncontended");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = threads;
    out->ratio = out->ratio_paired_median = -1;
    if (!ctxs || !ctxp || !hists || !lib || !raw || !one) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lib);
    bench_hist_init(raw);

    /* The raw sessions first: an unreachable server is then reported as
     * plainly as the ceiling's own connect error puts it. */
    if (ceil) {
        for (int i = 0; i < threads; i++) {
            char err[BENCH_ERR_MAX];
            if (!(ctxs[i].sess = ceil->open(e, err, sizeof err))) {
                bench_errorf("raw ceiling: %s", err);
                goto done;
            }
        }
    }
    if (!(client = bench_client_open(e)))
        goto done;
    for (int i = 0; i < threads; i++) {
        char name[64];
        snprintf(name, sizeof name, "bench-u-%ld-%d", (long)getpid(), i);
        cerb_status st = cerb_lock_new(client, name, NULL, &ctxs[i].lock);
        if (st != CERB_OK) {
            bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", name,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        ctxs[i].ceil = ceil;
        snprintf(ctxs[i].name, sizeof ctxs[i].name, "bench-c-%ld-%d",
                 (long)getpid(), i);
        /* Fixed per thread and 32 hex characters like a real token. */
        snprintf(ctxs[i].token, sizeof ctxs[i].token, "%08lx%08x%016x",
                 (unsigned long)getpid() & 0xffffffffUL, (unsigned)i, 0xbe4cu);
        ctxp[i] = &ctxs[i];
    }

    /* Warm-up, not measured. */
    snprintf(label, sizeof label, "uncontended %s x%d warm-up", e->name,
             threads);
    if (ceil && bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s),
                              unc_ceiling_body, ctxp, NULL, hists, NULL, NULL,
                              o->progress) != 0)
        goto done;
    if (bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s),
                      unc_library_body, ctxp, NULL, hists, NULL, NULL,
                      o->progress) != 0)
        goto done;

    for (int round = 1; round <= rounds; round++) {
        int64_t raw_before_ns = raw_ns, lib_before_ns = lib_ns;
        uint64_t lib_before = lib->n;
        if (ceil) {
            snprintf(label, sizeof label, "uncontended %s x%d raw %d/%d",
                     e->name, threads, round, rounds);
            bench_hist_init(one);
            if (bench_run_and_merge(label, threads, side_ns, unc_ceiling_body, ctxp,
                              NULL, hists, one, &raw_ns, o->progress) != 0)
                goto done;
            bench_hist_merge(raw, one);
            bench_note_round_p50(out, one);
        }
        snprintf(label, sizeof label, "uncontended %s x%d cerberus %d/%d",
                 e->name, threads, round, rounds);
        if (bench_run_and_merge(label, threads, side_ns, unc_library_body, ctxp,
                          NULL, hists, lib, &lib_ns, o->progress) != 0)
            goto done;
        /* This round's ratio, from two phases a moment apart. */
        if (ceil && one->n && raw_ns > raw_before_ns &&
            lib_ns > lib_before_ns) {
            double lib_rate = (double)(lib->n - lib_before) /
                              (double)(lib_ns - lib_before_ns);
            double raw_rate = (double)one->n / (double)(raw_ns - raw_before_ns);
            paired[n_paired++] = lib_rate / raw_rate;
        }
    }
    out->ratio_paired_median = bench_median(paired, n_paired);

    out->elapsed_s = (double)lib_ns / 1e9;
    out->ops = lib->n;
    out->ops_per_s = lib_ns > 0 ? (double)lib->n / out->elapsed_s : 0;
    bench_fill_latency(out, lib);
    if (ceil && raw_ns > 0) {
        out->ceiling_kind = "ops";
        out->ceiling_ops_per_s = (double)raw->n / ((double)raw_ns / 1e9);
        bench_fill_ceiling_latency(out, raw);
        if (out->ceiling_ops_per_s > 0)
            out->ratio = out->ops_per_s / out->ceiling_ops_per_s;
    }
    rc = 0;

done:
    if (ctxs)
        for (int i = 0; i < threads; i++) {
            if (ctxs[i].sess)
                ceil->close(ctxs[i].sess);
            cerb_lock_free(ctxs[i].lock);
        }
    cerb_client_close(client);
    free(ctxs);
    free(ctxp);
    free(hists);
    free(lib);
    free(raw);
    free(one);
    return rc;
}

/* --------------------------------------------------------------- handoff */

struct ho_shared {
    _Atomic int64_t last_release_ns; /* 0 = nobody released yet this phase */
};

struct ho_ctx {
    cerb_lock *lock;
    uint64_t timed;    /* acquisitions before the deadline */
    uint64_t total;    /* every acquisition, the drain included */
};

static void *ho_body(void *p)
{
    struct bench_worker *w = p;
    struct ho_ctx *c = w->ctx;
    struct ho_shared *sh = w->ph->shared;
    int64_t t_rel = bench_now_ns();
    uint64_t n = 0; /* this phase's timed acquisitions, for the progress */

    for (;;) {
        cerb_status st = cerb_lock_lock(c->lock);
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "lock", c->lock, st);
            break;
        }
        int64_t t_acq = bench_now_ns();
        c->total++;
        if (!bench_worker_done(w, t_acq)) {
            int64_t prev = atomic_load(&sh->last_release_ns);
            if (prev != 0)
                bench_hist_record(w->hist, t_acq - prev);
            c->timed++;
            atomic_store_explicit(&w->ops, ++n, memory_order_relaxed);
        }
        /* The critical section: a little real work, not a sleep. */
        do
            t_rel = bench_now_ns();
        while (t_rel - t_acq < HOLD_NS);
        atomic_store(&sh->last_release_ns, t_rel);
        st = cerb_lock_unlock(c->lock);
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "unlock", c->lock, st);
            break;
        }
        if (bench_worker_done(w, t_rel))
            break;
    }
    w->end_ns = t_rel;
    return NULL;
}

/* The round-trip ceiling: one thread, one bare connection, PING. */
void *bench_rtt_body(void *p)
{
    struct bench_worker *w = p;
    struct bench_rtt_ctx *c = w->ctx;
    char err[BENCH_ERR_MAX];
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        if (c->ceil->round_trip(c->sess, err, sizeof err) != 0) {
            bench_worker_fail(w, "raw round trip: %s", err);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

int bench_counters_sum(cerb_client **clients, int n, const char *engine,
                       struct cerb_engine_info *sum)
{
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < n; i++) {
        struct cerb_engine_info info;
        cerb_status st = cerb_engine_info(clients[i], engine, &info);
        if (st != CERB_OK) {
            bench_errorf("cerb_engine_info(%s): %s (%s)", engine,
                         cerb_last_error(), cerb_status_name(st));
            return -1;
        }
        sum->acquires += info.acquires;
        sum->acquire_calls += info.acquire_calls;
        sum->wakeups += info.wakeups;
        sum->handoffs += info.handoffs;
    }
    return 0;
}

int bench_handoff(const struct bench_engine *e, const struct bench_opts *o,
                  struct bench_result *out)
{
    const int n = o->waiters;
    const struct bench_ceiling *ceil = bench_ceiling_find(bench_engine_label(e));
    const struct bench_handoff_ceiling *hc = bench_handoff_ceiling_find(bench_engine_label(e));
    struct bench_raw_ho *raw_ho = NULL;
    struct bench_hist *raw_lat = malloc(sizeof *raw_lat); /* raw hand-offs */
    cerb_client **clients = calloc((size_t)n, sizeof *clients);
    struct ho_ctx *ctxs = calloc((size_t)n, sizeof *ctxs);
    void **ctxp = calloc((size_t)n, sizeof *ctxp);
    struct bench_hist *hists = calloc((size_t)n, sizeof *hists);
    struct bench_hist *lat = malloc(sizeof *lat), *rtt = malloc(sizeof *rtt);
    struct bench_hist *one = malloc(sizeof *one); /* one round-trip round */
    struct bench_hist *one_ho = malloc(sizeof *one_ho); /* one hand-off round */
    double paired[MAX_ROUNDS];
    int n_paired = 0;
    struct bench_rtt_ctx rc_ctx = {ceil, NULL};
    void *rtt_ctxp[1] = {&rc_ctx};
    struct ho_shared sh;
    struct cerb_engine_info before, after;
    cerb_lock_opts lopts = CERB_LOCK_OPTS_INIT;
    int64_t ho_ns = 0;
    const int rounds = bench_rounds_for(o->duration_s);
    const int64_t side_ns = (int64_t)(o->duration_s * 1e9 / rounds);
    char name[64], label[96];
    int rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "handoff");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = n;
    out->ratio = out->ratio_paired_median = -1;
    if (!clients || !ctxs || !ctxp || !hists || !lat || !rtt || !one ||
        !one_ho || !raw_lat) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lat);
    bench_hist_init(rtt);
    bench_hist_init(raw_lat);
    lopts.fair = 1;
    out->fair = 1;
    snprintf(name, sizeof name, "bench-h-%ld", (long)getpid());

    if (ceil) {
        char err[BENCH_ERR_MAX];
        if (!(rc_ctx.sess = ceil->open(e, err, sizeof err))) {
            bench_errorf("raw ceiling: %s", err);
            goto done;
        }
    }
    if (hc && !(raw_ho = bench_raw_ho_open(e, hc, n, "h")))
        goto done;
    for (int i = 0; i < n; i++) {
        if (!(clients[i] = bench_client_open(e)))
            goto done;
        cerb_status st = cerb_lock_new(clients[i], name, &lopts, &ctxs[i].lock);
        if (st != CERB_OK) {
            bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", name,
                         cerb_last_error(), cerb_status_name(st));
            goto done;
        }
        ctxp[i] = &ctxs[i];
    }

    snprintf(label, sizeof label, "handoff %s x%d warm-up", e->name, n);
    atomic_init(&sh.last_release_ns, 0);
    if (ceil && bench_run_and_merge(label, 1, bench_warmup_ns(o->duration_s), bench_rtt_body,
                              rtt_ctxp, NULL, hists, NULL, NULL,
                              o->progress) != 0)
        goto done;
    if (raw_ho && bench_raw_ho_run(raw_ho, label, bench_warmup_ns(o->duration_s), NULL,
                                   o->progress) != 0)
        goto done;
    if (bench_run_and_merge(label, n, bench_warmup_ns(o->duration_s), ho_body, ctxp, &sh,
                      hists, NULL, NULL, o->progress) != 0)
        goto done;
    for (int i = 0; i < n; i++)
        ctxs[i].timed = ctxs[i].total = 0;
    if (bench_counters_sum(clients, n, e->name, &before) != 0)
        goto done;

    for (int round = 1; round <= rounds; round++) {
        if (ceil) {
            snprintf(label, sizeof label, "handoff %s round trip %d/%d",
                     e->name, round, rounds);
            bench_hist_init(one);
            if (bench_run_and_merge(label, 1, side_ns / 2, bench_rtt_body, rtt_ctxp, NULL,
                              hists, one, NULL, o->progress) != 0)
                goto done;
            bench_hist_merge(rtt, one);
            bench_note_round_p50(out, one);
        }
        if (raw_ho) {
            snprintf(label, sizeof label, "handoff %s x%d raw %d/%d", e->name, n, round,
                     rounds);
            if (bench_raw_ho_run(raw_ho, label, side_ns / 2, raw_lat, o->progress) != 0)
                goto done;
        }
        snprintf(label, sizeof label, "handoff %s x%d cerberus %d/%d",
                 e->name, n, round, rounds);
        atomic_store(&sh.last_release_ns, 0);
        bench_hist_init(one_ho);
        if (bench_run_and_merge(label, n, side_ns, ho_body, ctxp, &sh, hists, one_ho,
                          NULL, o->progress) != 0)
            goto done;
        bench_hist_merge(lat, one_ho);
        ho_ns += side_ns; /* acquisitions are timed up to the deadline */
        /* This round's ratio, from two phases a moment apart. */
        if (ceil && one->n && one_ho->n)
            paired[n_paired++] = (double)bench_hist_quantile(one_ho, 0.5) /
                                 (double)bench_hist_quantile(one, 0.5);
    }
    out->ratio_paired_median = bench_median(paired, n_paired);
    if (bench_counters_sum(clients, n, e->name, &after) != 0)
        goto done;

    uint64_t timed = 0, total = 0;
    for (int i = 0; i < n; i++) {
        timed += ctxs[i].timed;
        total += ctxs[i].total;
    }
    out->elapsed_s = (double)ho_ns / 1e9;
    out->ops = timed;
    out->ops_per_s = ho_ns > 0 ? (double)timed / out->elapsed_s : 0;
    bench_fill_latency(out, lat);
    out->acquisitions = total;
    out->acquire_calls = after.acquire_calls - before.acquire_calls;
    out->wakeups = after.wakeups - before.wakeups;
    out->handoffs = after.handoffs - before.handoffs;
    /* An engine that reports no protocol counters leaves them all at 0. */
    out->has_counters = out->acquire_calls || out->wakeups || out->handoffs;
    if (ceil && rtt->n) {
        out->ceiling_kind = "rtt";
        bench_fill_ceiling_latency(out, rtt);
        if (out->ceiling_p50_us > 0 && lat->n)
            out->ratio = out->p50_us / out->ceiling_p50_us;
    }
    bench_raw_ho_fill(out, hc, raw_lat);
    rc = 0;

done:
    if (rc_ctx.sess)
        ceil->close(rc_ctx.sess);
    bench_raw_ho_close(raw_ho);
    free(raw_lat);
    for (int i = 0; ctxs && clients && i < n; i++) {
        cerb_lock_free(ctxs[i].lock);
        cerb_client_close(clients[i]);
    }
    free(clients);
    free(ctxs);
    free(ctxp);
    free(hists);
    free(lat);
    free(rtt);
    free(one);
    free(one_ho);
    return rc;
}
