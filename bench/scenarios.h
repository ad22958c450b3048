/*
 * scenarios.h — the inside of cerberus-bench: what one benchmarked engine
 * is, the options, one result row, the timed phase runner the scenarios and
 * the raw ceilings share, the ceilings (ceiling.c) and the report
 * (report.c). Not installed; nothing outside bench/ includes it.
 */
#ifndef CERB_BENCH_SCENARIOS_H
#define CERB_BENCH_SCENARIOS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "cerberus.h"
#include "config.h"
#include "histogram.h"

#define BENCH_NAME_MAX 16
#define BENCH_ERR_MAX 512
/* How long workers may overrun the end of a phase before the bench gives up
 * (a hung server or library call must not hang the run). */
#define BENCH_GRACE_NS (5 * INT64_C(1000000000))

/* Connection settings of a Redis server, for the raw ceiling. */
struct bench_redis_addr {
    char *host;
    int port;
    char *user;     /* "" = no ACL user */
    char *password; /* "" = no AUTH */
    int db;
    int64_t connect_timeout_ms;
    int64_t op_timeout_ms;
};

/* One engine to benchmark and how to open a client on it. */
struct bench_engine {
    char name[BENCH_NAME_MAX];
    struct cerb_config *cfg; /* the parsed configuration, owned: the
                                ceilings of zk and etcd read their servers
                                from it */
    const char *config_path; /* -c FILE; NULL when config_text is used */
    char *config_text;       /* generated configuration (no -c), owned */
    struct bench_redis_addr redis; /* strings owned; valid for "redis" */
};

struct bench_opts {
    int threads;        /* uncontended: worker threads */
    int waiters;        /* handoff: contenders, one client each */
    double duration_s;  /* measured time per side of each scenario */
    int progress;       /* draw a progress line on stderr */
};

/* One row of the report (and one object of the JSON array). */
struct bench_result {
    char scenario[BENCH_NAME_MAX];
    char engine[BENCH_NAME_MAX];
    int threads;
    double elapsed_s;     /* measured time, summed over the phases */
    uint64_t ops;         /* cycles (uncontended) or acquisitions (handoff) */
    double ops_per_s;
    double p50_us, p90_us, p99_us, max_us, mean_us;

    /* Ceiling: "ops" (raw cycles/s), "rtt" (one round trip) or NULL (n/a). */
    const char *ceiling_kind;
    double ceiling_ops_per_s;   /* kind "ops" */
    double ceiling_p50_us, ceiling_p99_us, ceiling_max_us; /* both kinds */
    /* Smallest and largest ceiling p50 of a single round: a wide spread
     * means the machine's speed changed during the run. */
    double ceiling_round_p50_min_us, ceiling_round_p50_max_us;
    double ratio;               /* ops/s ÷ ceiling, or p50 ÷ RTT; <0 = n/a */
    /* The same ratio taken per round (each library phase against the
     * ceiling phase just before it), median over the rounds: robust when
     * the machine changes speed during the run. <0 = n/a. */
    double ratio_paired_median;

    /* failover / flapping: the finding in words (empty otherwise). */
    char note[160];

    /* handoff: engine counters (deltas summed over the clients). */
    int has_counters;
    uint64_t acquisitions;      /* every grant, including the drain */
    uint64_t acquire_calls, wakeups, handoffs;
};

/* ---- utilities (scenarios.c) ---- */

/* Monotonic nanoseconds. */
int64_t bench_now_ns(void);

/* Print "cerberus-bench: <message>" to stderr (with the progress line
 * cleared first). */
void bench_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * A timed phase: n worker threads start together behind a barrier, each
 * runs body(worker) until the shared deadline, then the main thread joins
 * them. Workers count their operations in their own slot (a relaxed atomic
 * store, read only by the progress line) and record latencies in their own
 * histogram, so nothing on the hot path is shared.
 */
struct bench_worker {
    struct bench_phase *ph;
    int idx;
    void *ctx;                  /* the scenario's per-worker data */
    struct bench_hist *hist;    /* owned by the runner, merged by the caller */
    _Atomic uint64_t ops;       /* progress only */
    int64_t end_ns;             /* when this worker stopped measuring */
    char pad[64];               /* keep neighbours' counters apart */
};

struct bench_phase {
    const char *label;          /* for the progress line and errors */
    int n;
    int64_t start_ns;           /* set just before the workers start */
    int64_t deadline_ns;
    atomic_int stop;            /* a worker failed: everyone stops */
    struct bench_worker *w;     /* n workers */
    /* Set by the first worker that fails (under the runner's mutex). */
    char err[BENCH_ERR_MAX];
    int failed;
    void *shared;               /* scenario data common to all workers */
};

/*
 * Run one phase of @duration_ns with @n workers; ctx[i] is worker i's
 * context (may be NULL). On return every histogram is filled and ph->failed
 * says whether a worker reported an error (text in ph->err). A phase whose
 * workers do not return within BENCH_GRACE_NS of the deadline ends the
 * process with status 3 and a message: every run is bounded.
 * Returns: 0, or -1 when threads could not be started (message printed).
 */
int bench_phase_run(struct bench_phase *ph, const char *label, int n,
                    int64_t duration_ns, void *(*body)(void *), void **ctx,
                    void *shared, struct bench_hist *hists, int progress);

/* Called by a worker that cannot go on: keeps the first message, stops the
 * phase. */
void bench_worker_fail(struct bench_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* 1 once the phase should end for this worker at time @now. */
static inline int bench_worker_done(const struct bench_worker *w, int64_t now)
{
    return now >= w->ph->deadline_ns ||
           atomic_load_explicit(&w->ph->stop, memory_order_relaxed);
}

/* The failover scenario's knobs (failover.c). */
struct bench_fo_opts {
    const char *fail_cmd;       /* shell command that kills the primary */
    const char *restore_cmd;    /* and one that brings it back */
    const char *grace0_config;  /* the same config with switch_grace_ms = 0 */
    int64_t max_wait_ms;        /* give up waiting for a grant elsewhere */
    int flap_s;                 /* flapping run length; 0 = skip */
    int flap_period_ms;         /* one outage + one recovery */
};

/* Returns 0 and fills out[0..*n_out) (at most 3 rows), or -1. */
int bench_failover(const struct bench_engine *e, const struct bench_fo_opts *fo,
                   struct bench_result *out, size_t *n_out);

/* ---- scenarios (scenarios.c) ---- */

/* Each returns 0 and fills @out, or -1 after printing why. */
int bench_uncontended(const struct bench_engine *e,
                      const struct bench_opts *o, int threads,
                      struct bench_result *out);
int bench_handoff(const struct bench_engine *e, const struct bench_opts *o,
                  struct bench_result *out);

/* Open a client on engine @e with new acquisitions pinned to it.
 * Returns: the client, or NULL after printing why. */
cerb_client *bench_client_open(const struct bench_engine *e);

/* ---- raw ceilings (ceiling.c) ---- */

/*
 * The minimal server work a lock needs, with no library logic, per engine.
 * A session is one raw connection, used by one thread only.
 */
struct bench_ceiling {
    const char *engine;
    /* Connect and prepare (e.g. load scripts). NULL with @err on failure. */
    void *(*open)(const struct bench_engine *e, char *err, size_t errlen);
    /* One uncontended acquire + release of @name with owner value @token. */
    int (*cycle)(void *sess, const char *name, const char *token, char *err,
                 size_t errlen);
    /* One server round trip doing no work (PING). */
    int (*round_trip)(void *sess, char *err, size_t errlen);
    void (*close)(void *sess);
};

/* Ceilings of the other engines, each in its own file (ceiling_<e>.c). */
extern const struct bench_ceiling bench_ceiling_zk;
extern const struct bench_ceiling bench_ceiling_etcd;

/* The ceiling for @engine, or NULL when none is implemented ("n/a"). */
const struct bench_ceiling *bench_ceiling_find(const char *engine);

/* ---- report (report.c) ---- */

void bench_report_header(FILE *f);
void bench_report_row(FILE *f, const struct bench_result *r);
/* Write @n results as a JSON array to @path. Returns 0 or -1 (printed). */
int bench_report_json(const char *path, const struct bench_result *r,
                      size_t n);

#endif
