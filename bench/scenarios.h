/*
 * scenarios.h — the inside of cerberus-bench: what one benchmarked engine
 * is, the options, one result row, the timed phase runner the scenarios and
 * the raw ceilings share, the ceilings (ceiling.c) and the report
 * (report.c). Not installed; nothing outside bench/ includes it.
 */
#ifndef CERB_BENCH_SCENARIOS_H
#define CERB_BENCH_SCENARIOS_H

#include <pthread.h>
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

/* Sentinel mode: the master's address as the first sentinel that answers
 * names it (*host malloc'd). 0, or -1 when none does. */
int bench_redis_sentinel_master(char *const *sentinels, size_t n, const char *master,
                                const char *password, int64_t timeout_ms, char **host,
                                int *port);

/* The Redis server @cfg reaches (ceiling.c): redis.host/port, or the master
 * the sentinels name, or the first cluster seed; credentials, db and
 * timeouts as configured. Returns 0, or -1 when out of memory (@a then
 * holds nothing). bench_redis_addr_free frees the strings. */
int bench_redis_addr_init(struct bench_redis_addr *a, const struct cerb_config *cfg);
void bench_redis_addr_free(struct bench_redis_addr *a);

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

/* The switch scenario's inputs (scenario_switch.c): the configuration that
 * is copied and switched, which lists every engine (the -c file, else the
 * built-in text), and the `cerberus` command that switches it. */
struct bench_switch_opts {
    const char *config_path; /* -c FILE; NULL when config_text is used */
    const char *config_text; /* the built-in redis, zk, etcd file */
    const char *cli;         /* path, or a name looked up on PATH */
};

struct bench_opts {
    int threads;        /* uncontended: worker threads */
    int waiters;        /* handoff: contenders, one client each */
    int herd_waiters;   /* herd: clients queued on one name */
    int locks;          /* many: locks held by one client */
    int64_t many_lease_ms; /* many: the lease of each of those locks */
    double duration_s;  /* measured time per side of each scenario */
    int progress;       /* draw a progress line on stderr */
    int candidates;     /* elect-failover: candidate processes */
    int elect_rounds;   /* elect-failover: leaders killed */
    int64_t elect_lease_ms; /* elect-failover: a term's lease (0 = the configuration's) */
    struct bench_switch_opts sw; /* switch */
};

/* many: threads that acquire (and later release) the locks. */
#define BENCH_MANY_THREADS 8

/* elect-failover: most rounds (leaders killed) of one run. */
#define BENCH_ELECT_MAX_ROUNDS 20

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

    /* handoff, herd: the raw hand-off with as many bare sessions
     * (ceiling_handoff.c), for engines whose server queues waiters: what
     * it does (NULL = not measured), its hand-off p50 and p99. */
    const char *raw_ho_what;
    double raw_ho_p50_us, raw_ho_p99_us;

    /* handoff, contended, herd: engine counters (deltas summed over the
     * clients). */
    int has_counters;
    uint64_t acquisitions;      /* every grant, including the drain */
    uint64_t acquire_calls, wakeups, handoffs;
    int fair;                   /* the locks' mode (lock.fair): 1 FIFO */

    /* herd: rounds run and the mean time from the holder's release to the
     * last waiter's release. */
    int rounds;
    double drain_ms;

    /* many: locks held, their lease, how long they were held, the process
     * CPU over that time (% of one core), memory per lock (RSS delta ÷
     * locks) and holds not VALID at the end of the hold period. */
    uint64_t locks;
    int64_t lease_ms;
    double hold_s;
    double cpu_percent;
    double bytes_per_lock;
    int64_t rss_delta_bytes;
    uint64_t not_valid;

    /* switch: the engines of the switched file, the engine its client was
     * on before `cerberus switch` (from active = "auto"), the epoch before
     * and after, the settling time and the longest hold life it is twice
     * (lease_ms above is lock.lease_ms), and the tries answered BUSY on
     * each side. The same engine alone is the ceiling (kind "alone"). */
    char sw_engines[64];
    char sw_from[BENCH_NAME_MAX];
    int64_t sw_epoch_before, sw_epoch_after;
    int64_t sw_settle_ms, sw_hold_ms;
    uint64_t sw_busy, sw_busy_alone;
    uint64_t sw_questions; /* the gate's questions elsewhere during the rounds */

    /* guard, guard-dup: server commands per operation, counted on the
     * server, for the library and for the raw ceiling (<0 = n/a), and why
     * there is no raw ceiling ("" when there is one). */
    double cmds_per_op, ceiling_cmds_per_op;
    double cmds_per_op_least, ceiling_cmds_per_op_least; /* the least round's */
    char ceiling_missing[128];

    /* serve: one HTTP round trip to the daemon (GET /healthz) with the
     * same callers, in the same run: two of them are a cycle's floor. */
    double http_rtt_p50_us, http_rtt_p99_us;
    /* serve: the same cycle and round trip through the lean client (a
     * hand-written keep-alive HTTP/1.1 client instead of libcurl). */
    double lean_p50_us, lean_p99_us, lean_ops_per_s;
    double lean_rtt_p50_us, lean_rtt_p99_us;
    /* serve-handoff: the hand-off of a 100 ms poll (the ceiling is the
     * 10 ms one's). */
    double poll_slow_p50_us, poll_slow_p99_us;

    /* semaphore: the limit (threads = 2 x permits). */
    int permits;
    /* rwlock: cycles of each kind measured, and their latencies. */
    uint64_t rw_reads, rw_writes;
    double read_p50_us, read_p99_us, write_p50_us, write_p99_us;
    /* elect-failover: candidates standing, the bound (the lease or session
     * that ends a dead leader's term, in ms, and what it is), one round trip
     * (-1 = not measured), each round's failover (rounds of them). The
     * ceiling (kind "bound") is bound_ms + the round trip. */
    int candidates;
    int64_t bound_ms;
    char bound_what[96];
    double rtt_us;
    double failover_ms[BENCH_ELECT_MAX_ROUNDS];

    /* --peers (peers.c): a row measured by another lock library on the
     * engine's server, right after Cerberus's row of the same scenario and
     * threads. peer[0] is 0 on Cerberus's own rows. */
    char peer[BENCH_NAME_MAX];      /* "redis-py", "curator", ... */
    const char *peer_status;        /* "measured", "skipped" or "failed" */
    char peer_reason[256];          /* skipped/failed: why */
    char peer_how[200];             /* measured: how, in the script's words */
    /* Cerberus's figure over the peer's: ops/s (uncontended, higher is
     * better for Cerberus) or hand-off p50 and p99 (handoff, lower is
     * better); <0 = n/a. */
    double cerb_over_peer, cerb_over_peer_p99;
    /* DESIGN.md §10's bound on those ratios: at least peer_target_min
     * (uncontended) or at most peer_target_max / peer_target_p99_max
     * (handoff); 0 = no target for this peer and case. */
    double peer_target_min, peer_target_max, peer_target_p99_max;
};

/* A growing array of result rows. */
struct bench_rows {
    struct bench_result *v;
    size_t n, cap;
};

/* Room for one more row, zeroed (the caller fills it and then counts it
 * with rows->n++). Returns NULL after printing "out of memory". */
struct bench_result *bench_rows_slot(struct bench_rows *rows);

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

/* bench_worker_fail for a lock call @what ("lock", "unlock") on @lock that
 * returned @st: `what "name": last error (STATUS)`. */
void bench_worker_fail_lock(struct bench_worker *w, const char *what,
                            const cerb_lock *lock, cerb_status st);

/* 1 once the phase should end for this worker at time @now. */
static inline int bench_worker_done(const struct bench_worker *w, int64_t now)
{
    return now >= w->ph->deadline_ns ||
           atomic_load_explicit(&w->ph->stop, memory_order_relaxed);
}

/* One operation done at the end of a lap begun at *t0: its time recorded,
 * the worker's count (*n) published, *t0 moved on to now. 1 once the phase
 * should end. */
static inline int bench_worker_lap(struct bench_worker *w, int64_t *t0, uint64_t *n)
{
    int64_t t1 = bench_now_ns();
    bench_hist_record(w->hist, t1 - *t0);
    atomic_store_explicit(&w->ops, ++*n, memory_order_relaxed);
    *t0 = t1;
    return bench_worker_done(w, t1);
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

/* ---- scenarios (scenarios.c, scenario_<name>.c) ---- */

/* Each returns 0 and fills @out, or -1 after printing why. */
int bench_uncontended(const struct bench_engine *e,
                      const struct bench_opts *o, int threads,
                      struct bench_result *out);
int bench_handoff(const struct bench_engine *e, const struct bench_opts *o,
                  struct bench_result *out);
/* @threads clients, one thread each, on one name (scenario_contended.c). */
int bench_contended(const struct bench_engine *e, const struct bench_opts *o,
                    int threads, struct bench_result *out);
/* o->herd_waiters clients queued behind one holder (scenario_herd.c). */
int bench_herd(const struct bench_engine *e, const struct bench_opts *o,
               struct bench_result *out);
/* One client holding o->locks renewed locks (scenario_many.c). */
int bench_many(const struct bench_engine *e, const struct bench_opts *o,
               struct bench_result *out);

/*
 * Coordination primitives (scenario_prims.c): a semaphore of @permits
 * permits with 2 x @permits clients looping acquire 1 + release (latency =
 * the acquire wait); a read-write lock with @threads clients, 90 % reads
 * and 10 % writes (latency = the cycle).
 */
int bench_semaphore(const struct bench_engine *e, const struct bench_opts *o, int permits,
                    struct bench_result *out);
int bench_rwlock(const struct bench_engine *e, const struct bench_opts *o, int threads,
                 struct bench_result *out);

/*
 * Leader failover (scenario_elect.c): o->candidates candidate processes,
 * the leader killed o->elect_rounds times; the time to the next leader's
 * CERB_OK. On the local engine, a row with a note (no cross-process
 * elections). bench_elect_candidate_main is the candidates' role
 * (`cerberus-bench --elect-candidate ...`); it never returns. The bound
 * (lease or session) of a dead leader's term on @e, in ms.
 */
int bench_elect_failover(const struct bench_engine *e, const struct bench_opts *o,
                         struct bench_result *out);
int bench_elect_candidate_main(int argc, char **argv);
int64_t bench_elect_bound_ms(const struct bench_engine *e, int64_t lease_ms);

/* The idempotency guard with @threads threads sharing one client
 * (scenario_guard.c): out[0] is the "guard" row (begin + finish on
 * distinct keys), out[1] the "guard-dup" row (begin on keys already done);
 * *n_out = 2. An engine without a guard in this build gives one row with
 * a note instead (*n_out = 1). */
int bench_guard(const struct bench_engine *e, const struct bench_opts *o,
                int threads, struct bench_result out[2], int *n_out);

/*
 * `cerberus serve` (scenario_serve.c), with the daemon in this process on
 * a unix socket: acquire + release over HTTP with @threads callers on
 * names of their own, against the same cycle in-process ("serve" row,
 * ceiling kind "in-process", with libcurl and again with a lean
 * hand-written HTTP/1.1 client: lean_*); and o->waiters callers on one name, a
 * blocking acquire against Dapr's try-lock-and-poll ("serve-handoff" row,
 * ceiling kind "poll": ratio = polling p50 / blocking p50).
 */
int bench_serve(const struct bench_engine *e, const struct bench_opts *o, int threads,
                struct bench_result *out);
int bench_serve_handoff(const struct bench_engine *e, const struct bench_opts *o,
                        struct bench_result *out);

/*
 * The steady state after an operator's switch to engine @e (scenario_switch.c):
 * trylock + unlock with @threads threads on a client that followed
 * `cerberus switch` in a copy of o->sw's configuration, against the same
 * engine alone (engines = (E) only) in alternating rounds.
 */
int bench_switch(const struct bench_engine *e, const struct bench_opts *o,
                 int threads, struct bench_result *out);
/* The target of DESIGN.md §10 for that ratio. */
#define BENCH_SWITCH_TARGET 0.9

/*
 * The namespaces of one client of a switch round (switch_ns.c): redis.prefix,
 * zk.root and etcd.prefix of a configuration's listed engines, moved into
 * names of the round's own nested in the file's (NULL where the engine is
 * not listed, and for a Redis Cluster, whose prefix stays). Owned strings.
 */
struct bench_ns {
    char tag[80];       /* "cerb-bench-<pid>-<random>-<round>-<side>" */
    char *text;         /* the configuration's text with those namespaces */
    struct cerb_config *cfg; /* text parsed */
    char *redis_prefix; /* <prefix><tag>: */
    char *zk_root;      /* <parent of root>/<tag>/<last part of root> */
    char *zk_top;       /* <parent of root>/<tag>: the round's own node */
    char *etcd_prefix;  /* <prefix><tag>/ */
};
/* The next round of this process (1, 2, ...), for bench_ns_make. */
unsigned bench_ns_round(void);
/* Fill @ns from the configuration @text for @side ("sw", "alone") of
 * @round; @what names the text in messages. Returns 0, or -1 (printed,
 * nothing left to free). */
int bench_ns_make(struct bench_ns *ns, const char *text, unsigned round, const char *side,
                  const char *what);
/* Make the namespaces ready on their servers before a client opens there:
 * the Redis marker (engine @only, or every listed one when NULL). Returns
 * 0, or -1 (printed). */
int bench_ns_prepare(const struct bench_ns *ns, const char *only);
/* Delete what the round left under its namespaces (engine @only, or every
 * listed one), once its clients are closed. Best effort: returns 0, or -1
 * after a note on stderr. */
int bench_ns_remove(const struct bench_ns *ns, const char *only);
/* Free @ns's strings; an @ns zeroed or already freed is fine. */
void bench_ns_free(struct bench_ns *ns);

/* Open a client on engine @e with new acquisitions pinned to it.
 * Returns: the client, or NULL after printing why. */
cerb_client *bench_client_open(const struct bench_engine *e);

/* ---- helpers the scenario files share (scenarios.c) ---- */

/* Most alternating rounds a scenario runs (see bench_rounds_for). */
#define BENCH_MAX_ROUNDS 50

/* p50/p90/p99/max/mean of @h into @r (microseconds). */
void bench_fill_latency(struct bench_result *r, const struct bench_hist *h);
/* The ceiling's p50/p99/max of @h into @r. */
void bench_fill_ceiling_latency(struct bench_result *r,
                                const struct bench_hist *h);
/* Unmeasured warm-up for a side of @duration_s: 50..500 ms. */
int64_t bench_warmup_ns(double duration_s);
/* Alternating rounds for @duration_s: about half a second each side. */
int bench_rounds_for(double duration_s);
/* Keep the smallest and largest per-round ceiling p50 in @r. */
void bench_note_round_p50(struct bench_result *r, const struct bench_hist *h);
/* Median of @n values (sorts them in place); -1 when n is 0. */
double bench_median(double *v, int n);

/*
 * Run a phase (bench_phase_run) and fold its histograms into @acc (may be
 * NULL); add its measured length (start to the last worker's end) to
 * *elapsed_ns (may be NULL).
 * Returns: 0, or -1 after printing the failure.
 */
int bench_run_and_merge(const char *label, int n, int64_t dur_ns,
                        void *(*body)(void *), void **ctx, void *shared,
                        struct bench_hist *hists, struct bench_hist *acc,
                        int64_t *elapsed_ns, int progress);

/* The round-trip ceiling's worker: one bare connection, round_trip() in a
 * loop. Its context is a struct bench_rtt_ctx. */
struct bench_rtt_ctx {
    const struct bench_ceiling *ceil;
    void *sess;
};
void *bench_rtt_body(void *worker);

/* Sum the protocol counters of @n clients' engine @engine into @sum.
 * Returns: 0, or -1 after printing why. */
int bench_counters_sum(cerb_client **clients, int n, const char *engine,
                       struct cerb_engine_info *sum);

/* Draw "text" as the progress line on stderr (a terminal only: callers pass
 * o->progress). It is erased before the next report or error line. */
void bench_progress(int enabled, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Erase the progress line, if one is shown. */
void bench_progress_clear(void);

/*
 * A mutex and a condition variable on CLOCK_MONOTONIC, for scenarios that
 * coordinate their own threads (herd, many). Every wait has a deadline.
 */
struct bench_sync {
    pthread_mutex_t mu;
    pthread_cond_t cond;
};
/* Returns 0, or -1 after printing why. */
int bench_sync_init(struct bench_sync *s);
void bench_sync_destroy(struct bench_sync *s);
/* With s->mu held: wait for a broadcast or until @deadline_ns (monotonic).
 * Returns: 1 when the deadline has passed, else 0 (re-check the state). */
int bench_sync_wait_until(struct bench_sync *s, int64_t deadline_ns);
/* End the process with status 3 after printing @what: a wait with a
 * deadline found its server or the library hung. Every run is bounded. */
_Noreturn void bench_hung(const char *what);

/* ---- contended raw ceiling (scenario_contended.c) ---- */

/*
 * The raw contended cycle: a try that may fail because another session holds
 * the key, retried at once, then the release. Kept apart from struct
 * bench_ceiling so that table, which other files initialise, does not change.
 */
struct bench_contended_ceiling {
    const char *engine;
    void *(*open)(const struct bench_engine *e, char *err, size_t errlen);
    /* Returns 1 when @name was taken with value @token, 0 when someone else
     * holds it, -1 with @err on failure. */
    int (*try_acquire)(void *sess, const char *name, const char *token,
                       char *err, size_t errlen);
    /* Compare-and-delete. Returns 0 or -1 with @err. */
    int (*release)(void *sess, const char *name, const char *token, char *err,
                   size_t errlen);
    void (*close)(void *sess);
};

/* The contended ceiling for @engine, or NULL ("n/a"). */
const struct bench_contended_ceiling *
bench_contended_ceiling_find(const char *engine);
/* pg's (ceiling_pg.c): try + claim, retried at once; free + unlock.
 * mysql's (ceiling_mysql.c): the grant UPDATE with GET_LOCK(?, 0), retried
 * at once; free + RELEASE_LOCK. */
extern const struct bench_contended_ceiling bench_contended_ceiling_pg;
extern const struct bench_contended_ceiling bench_contended_ceiling_mysql;
/* memcached's (ceiling_memcached.c): `ms ... ME` (add), retried at once;
 * `md ... C<cas>`. */
extern const struct bench_contended_ceiling bench_contended_ceiling_memcached;

/* ---- raw hand-off (ceiling_handoff.c) ---- */

/*
 * For an engine whose server queues waiters itself (pg_advisory_lock,
 * GET_LOCK): the least a bare client does to pass a lock on, measured
 * beside the handoff and herd rows. A session is one connection, used by
 * one thread only.
 */
struct bench_handoff_ceiling {
    const char *engine;
    const char *what;   /* the commands, in words, for the report */
    void *(*open)(const struct bench_engine *e, char *err, size_t errlen);
    /* Block in the server's queue until @name is ours, row claimed with
     * @token. Returns 0, or -1 with @err. */
    int (*wait)(void *sess, const char *name, const char *token, char *err,
                size_t errlen);
    /* Free the row and give the lock back. Returns 0, or -1 with @err. */
    int (*release)(void *sess, const char *name, const char *token, char *err,
                   size_t errlen);
    void (*close)(void *sess);
};
/* Each in its engine's ceiling file (ceiling_<e>.c), listed in the table
 * of ceiling_handoff.c: pg's (pg_advisory_lock + claim in one statement;
 * free + unlock), mysql's (GET_LOCK, then the claim; free + RELEASE_LOCK). */
extern const struct bench_handoff_ceiling bench_handoff_ceiling_pg;
extern const struct bench_handoff_ceiling bench_handoff_ceiling_mysql;
/* The raw hand-off of @engine, or NULL when it has none. */
const struct bench_handoff_ceiling *bench_handoff_ceiling_find(const char *engine);

/* @n bare sessions of @hc contending for one name of their own
 * ("bench-<tag>-raw-<pid>"). Returns NULL after printing why. */
struct bench_raw_ho;
struct bench_raw_ho *bench_raw_ho_open(const struct bench_engine *e,
                                       const struct bench_handoff_ceiling *hc, int n,
                                       const char *tag);
/* One timed phase of hand-offs among them; latencies merged into @acc.
 * Returns 0, or -1 after printing the failure. */
int bench_raw_ho_run(struct bench_raw_ho *ho, const char *label, int64_t duration_ns,
                     struct bench_hist *acc, int progress);
void bench_raw_ho_close(struct bench_raw_ho *ho);
/* raw_ho_* of @r from the raw hand-offs @h (nothing when @hc is NULL or @h
 * is empty). */
void bench_raw_ho_fill(struct bench_result *r, const struct bench_handoff_ceiling *hc,
                       const struct bench_hist *h);

/* ---- peers (peers.c) ---- */

/* --peers: which peer libraries run on which engine's server, the scripts
 * that measure them, and the state of one bench run (opaque). */
struct bench_peers;

/* Returns the state, or NULL after printing why (out of memory, or a bad
 * $CERB_BENCH_PEER_LIMIT_S). The scripts are looked up in
 * $CERB_BENCH_PEERS_DIR, else in the source tree's bench/peers. */
struct bench_peers *bench_peers_new(int progress);
/* Removes the scratch directory and frees. NULL does nothing. */
void bench_peers_free(struct bench_peers *p);
/* One header line for the table: the peers of these engines, or that
 * there are none. */
void bench_peers_describe(const struct bench_peers *p, FILE *f,
                          const struct bench_engine *engines, int n);
/*
 * After Cerberus's row @cerb on engine @e (uncontended or handoff; other
 * scenarios have no peer rows): run each peer of @e with the same scenario,
 * threads and duration, bounded in time, and append one row per peer to
 * @rows, printed to stdout as it comes. A peer that is not installed gives
 * one "skipped: <why>" row (the first time only), one that fails a
 * "failed: <why>" row; neither is an error of the bench.
 * Returns: 0, or -1 when out of memory (printed).
 */
int bench_peers_after(struct bench_peers *p, const struct bench_engine *e,
                      const struct bench_opts *o,
                      const struct bench_result *cerb,
                      struct bench_rows *rows);

/* ---- plot (plot.c) ---- */

/* Returns 0 when gnuplot can be run, else -1 after printing how to get it. */
int bench_plot_check(void);
/* Draw @n results into the PNG @path with gnuplot. Returns 0 or -1
 * (printed). */
int bench_plot(const char *path, const struct bench_result *r, size_t n);

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

/* Ceilings of the other engines, each in its own file (ceiling_<e>.c,
 * built with its engine), listed in ceiling.c's table. */
extern const struct bench_ceiling bench_ceiling_zk;
extern const struct bench_ceiling bench_ceiling_etcd;
extern const struct bench_ceiling bench_ceiling_pg;
extern const struct bench_ceiling bench_ceiling_mysql;
extern const struct bench_ceiling bench_ceiling_memcached;
/* Redlock (ceiling_redlock.c): the bare commands over the N masters of a
 * redis engine in Redlock mode, each step sent to all of them at once. */
extern const struct bench_ceiling bench_ceiling_redlock;

/* What the rows call engine @e: its name, except "redlock" for the redis
 * engine in Redlock mode (its ceiling and peers are not those of one
 * Redis server). The string is static or @e's own. */
const char *bench_engine_label(const struct bench_engine *e);

/* The ceiling for @engine, or NULL when none is implemented ("n/a"). */
const struct bench_ceiling *bench_ceiling_find(const char *engine);

/* The bare etcd session behind the etcd ceilings (ceiling_etcd.c), shared
 * with the guard's (ceiling_guard_etcd.c): one curl handle, kept alive, to
 * the first of e->etcd's endpoints, with the engine's headers and, with
 * etcd.user, its token. post: @req (a json_t, stolen) to @path, the answer
 * parsed into *out (may be NULL); 0, or -1 with @err (HTTP status not 200
 * included). get: the body of GET @path (the session's buffer, valid until
 * its next request), or NULL with @err. b64/i64: JSON fields as the gateway
 * reads them (base64 bytes, a 64-bit integer as a string). Built with
 * CERB_WITH_ETCD only. */
struct json_t;
void *bench_etcd_open(const struct bench_engine *e, char *err, size_t errlen);
int bench_etcd_post(void *sess, const char *path, struct json_t *req, struct json_t **out,
                    char *err, size_t errlen);
const char *bench_etcd_get(void *sess, const char *path, size_t *len, char *err,
                           size_t errlen);
struct json_t *bench_etcd_b64(const char *p, size_t n);
struct json_t *bench_etcd_i64(long long v);
void bench_etcd_close(void *sess);

/* The bare Redis session behind the Redis ceilings (ceiling.c), shared
 * with the contended ceiling: one hiredis connection to e->redis (AUTH,
 * SELECT, the compare-and-delete script loaded). try: `SET name token NX PX
 * 10000`, 1 = set, 0 = held by someone, -1 = error (in @err). release: the
 * script, reloaded once on NOSCRIPT; 0, or -1 when the value was not ours
 * or on error. */
void *bench_redis_open(const struct bench_engine *e, char *err, size_t errlen);
int bench_redis_try(void *sess, const char *name, const char *token, char *err, size_t errlen);
int bench_redis_release(void *sess, const char *name, const char *token, char *err,
                        size_t errlen);
void bench_redis_close(void *sess);
/* The hiredis connection (a redisContext *) of such a session, for the
 * guard's ceiling (ceiling_guard.c), which adds its own script. */
struct redisContext *bench_redis_context(void *sess);

/* The bare PostgreSQL session behind the pg ceilings (ceiling_pg.c): one
 * blocking libpq connection from e->cfg->pg (conninfo, password_file),
 * synchronous_commit = on, the statements prepared on
 * <pg.schema>.cerberus_lock. try: pg_try_advisory_lock + the row claimed
 * in one statement, 1 = ours, 0 = the lock is another session's, -1 =
 * error; wait: the same with pg_advisory_lock, 0 or -1; release: the row
 * freed and the lock given back in one statement, 0 or -1. Built with
 * CERB_WITH_PG only. */
void *bench_pg_open(const struct bench_engine *e, char *err, size_t errlen);
int bench_pg_try(void *sess, const char *name, const char *token, char *err, size_t errlen);
int bench_pg_wait(void *sess, const char *name, const char *token, char *err, size_t errlen);
int bench_pg_release(void *sess, const char *name, const char *token, char *err,
                     size_t errlen);
void bench_pg_close(void *sess);
/* "host=H port=P dbname=D user=U, table S.cerberus_lock" of e->cfg->pg
 * (never the password), for the report's header. */
void bench_pg_describe(const struct bench_engine *e, char *buf, size_t len);
/* The libpq connection of such a session, for the guard's ceiling
 * (ceiling_guard_pg.c), which prepares its own statements on it. */
struct pg_conn;
struct pg_conn *bench_pg_conn(void *sess);

/* The bare MySQL/MariaDB session behind the mysql ceilings
 * (ceiling_mysql.c): one blocking libmariadb connection from
 * e->cfg->mysql (host and port or socket, user, password_file, database),
 * set up as the engine's sessions are (CLIENT_FOUND_ROWS, REPEATABLE READ,
 * autocommit), the statements prepared on <mysql.database>.cerberus_lock.
 * try: the grant UPDATE with GET_LOCK(name, 0), 1 = ours, 0 = busy, -1 =
 * error; wait: GET_LOCK(name, 30) then the claim, 0 or -1; release: the
 * row freed and RELEASE_LOCK in one UPDATE, 0 or -1. Built with
 * CERB_WITH_MYSQL only. */
void *bench_mysql_open(const struct bench_engine *e, char *err, size_t errlen);
int bench_mysql_try(void *sess, const char *name, const char *token, char *err, size_t errlen);
int bench_mysql_wait(void *sess, const char *name, const char *token, char *err,
                     size_t errlen);
int bench_mysql_release(void *sess, const char *name, const char *token, char *err,
                        size_t errlen);
void bench_mysql_close(void *sess);
/* "H:P user U, table D.cerberus_lock" of e->cfg->mysql (never the
 * password), for the report's header. */
void bench_mysql_describe(const struct bench_engine *e, char *buf, size_t len);
/* For the guard's ceiling (ceiling_guard_mysql.c): a connection set up as
 * above (the backtick-quoted database into @db_q), NULL with @err; a
 * statement @tpl ("@D" for the database) prepared on it, NULL with @err;
 * an input bind of @len bytes at @v (len 0 for fixed-size types). */
struct st_mysql;
struct st_mysql_stmt;
struct st_mysql_bind;
struct st_mysql *bench_mysql_connect(const struct bench_engine *e, char *db_q, size_t qlen,
                                     char *err, size_t errlen);
struct st_mysql_stmt *bench_mysql_prepare(struct st_mysql *my, const char *db_q,
                                          const char *tpl, char *err, size_t errlen);
void bench_mysql_bind(struct st_mysql_bind *b, int type, const void *v, unsigned long len);

/* The bare ZooKeeper session behind the zk ceiling (ceiling_zk.c), shared
 * with the guard's (ceiling_guard_zk.c): one zhandle, connected, with the
 * engine's digest auth and ACL when zk.user is set. The handle and the ACL
 * to create with, for that session's owner. */
struct _zhandle;
struct ACL_vector;
void *bench_zk_open(const struct bench_engine *e, char *err, size_t errlen);
void bench_zk_close(void *sess);
struct _zhandle *bench_zk_handle(void *sess);
const struct ACL_vector *bench_zk_acl(void *sess);

/* ---- guard raw ceilings (ceiling_guard.c) ---- */

/*
 * The server commands of the idempotency guard's layout on one engine,
 * with no library logic. A session is one raw connection, used by one
 * thread only. @id is 64 lowercase hex characters (as a SHA-256 record id),
 * @token 32: both fixed or counted by the caller.
 */
struct bench_guard_ceiling {
    const char *engine;
    /* Connect and prepare. NULL with @err on failure. */
    void *(*open)(const struct bench_engine *e, char *err, size_t errlen);
    /* begin on a fresh record (must claim it) then finish(1) storing
     * @result for @keep_ms. Returns 0, or -1 with @err. */
    int (*cycle)(void *sess, const char *id, const char *token, const void *result,
                 size_t len, int64_t running_ms, int64_t keep_ms, char *err,
                 size_t errlen);
    /* begin on a done record: must be answered "done" (a duplicate).
     * Returns 0, or -1 with @err. */
    int (*duplicate)(void *sess, const char *id, const char *token, int64_t running_ms,
                     char *err, size_t errlen);
    /* Commands the server has run so far, from every client (NULL when the
     * server cannot say). Returns 0, or -1 with @err. */
    int (*server_commands)(void *sess, uint64_t *out, char *err, size_t errlen);
    void (*close)(void *sess);
};

/* The guard ceilings of the other engines, each in its own file
 * (ceiling_guard_<e>.c, built with its engine). */
extern const struct bench_guard_ceiling bench_guard_ceiling_zk;
extern const struct bench_guard_ceiling bench_guard_ceiling_etcd;
extern const struct bench_guard_ceiling bench_guard_ceiling_pg;
extern const struct bench_guard_ceiling bench_guard_ceiling_mysql;

/* The guard ceiling for @engine, or NULL with *why saying why there is
 * none (static text). */
const struct bench_guard_ceiling *bench_guard_ceiling_find(const char *engine,
                                                           const char **why);

/* ---- report (report.c) ---- */

void bench_report_header(FILE *f);
void bench_report_row(FILE *f, const struct bench_result *r);
/* Write @n results as a JSON array to @path. Returns 0 or -1 (printed). */
int bench_report_json(const char *path, const struct bench_result *r,
                      size_t n);

#endif
