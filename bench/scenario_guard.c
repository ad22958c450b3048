/*
 * scenario_guard.c — the guard scenario of cerberus-bench (DESIGN.md §8,
 * §10): what the idempotency guard costs over the server commands it sends.
 *
 * N threads share one client (as uncontended does) and each works on keys
 * of its own, so nothing is contended. Two measurements, each a row:
 *
 *   guard      begin + finish(1) + free on a fresh key: the first caller of
 *              an operation, which runs it and stores a 16-byte result;
 *   guard-dup  begin + free on a key done before: the retry, answered
 *              CERB_DUPLICATE with the stored result (checked).
 *
 * Each is measured in the same run as its raw ceiling (ceiling_guard.c):
 * the same server commands over a bare connection per thread, without the
 * library — on redis EVALSHA of the begin script (SET NX PX GET, then a GET
 * of the older versions' key) then of the finish script, and the begin
 * script alone on a done record; on zk the create multi and a getData
 * sent with it, then the finish multi, and those first two alone on a done
 * record (ceiling_guard_zk.c). As in uncontended, the two sides
 * alternate in rounds of about half a second (ceiling, library, ...) after
 * an unmeasured warm-up of each, the rounds are summed, and the ratio is
 * ops/s over raw ops/s, with the median of the per-round ratios beside it.
 * The duplicate rounds come after the begin + finish rounds, on the keys
 * those made: each thread walks its own done keys, newest first.
 *
 * "A duplicate is answered in one round trip" is measured, not assumed:
 * where the ceiling can count the server's commands (redis: INFO
 * commandstats, INFO itself left out), the scenario takes the count before
 * and after every round, library's and raw, and divides by the operations
 * of those rounds. Redis counts the commands a script runs as well as the
 * script itself, so a begin + finish is 6 (EVALSHA, its SET and GET;
 * EVALSHA, its GET and SET) on both sides, and a duplicate is 2: the
 * script and its SET, one round trip. On etcd (ceiling_guard_etcd.c: grpc_server_started_total in
 * /metrics) a begin + finish is 2 txns and a duplicate 1. The library's
 * count beside the raw one shows it sends nothing the
 * layout does not need (the client's prober adds a few commands a second).
 * zk counts requests (mntr's zk_packets_received, mntr itself left out): 3
 * per begin + finish, 2 per duplicate sent together (one round trip); there
 * the library's guard sweeper adds its reads (a pass soon after the first
 * begin, then every 5 s or every 1 024 records made), to the raw rounds as
 * well as the library's, since the client stays open. The JSON also gives
 * the least count of any round (background requests only add), which is
 * what an operation itself sends. On pg (ceiling_guard_pg.c) the count is
 * of transaction ids handed out, the statements that wrote or locked a
 * row: 2 per begin + finish, 1 per duplicate; on mysql
 * (ceiling_guard_mysql.c) of statements (Questions): 2 per begin + finish,
 * and 2 per duplicate (the begin, then the SELECT of the stored result),
 * with the library's guard sweep adding to its side.
 * The row also shows the duplicate's p50 over the raw command's p50.
 *
 * An engine without a guard ceiling (local: no server; or one built
 * without its raw steps, see the HOOK in ceiling_guard.c) is measured on
 * the library side alone, and its rows say "no ceiling for engine X (why)"
 * with a null ratio. An engine with no guard at all in this
 * build (a first begin answers so) gives one row noting it, not a failed
 * run. Records are kept for 20 s plus
 * four times the measured duration: long enough for the duplicate rounds,
 * short enough that a run leaves nothing for long on a shared server (kept
 * 2 minutes, 8 threads on zk held some 700 000 records at once, and a
 * 256 MiB ZooKeeper spent its time collecting garbage).
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scenarios.h"

#define GUARD_SCOPE "bench-guard"
#define RESULT_LEN 16 /* "order-" + 10 digits */

/* Runs in this process: a run's keys never meet an earlier run's records. */
static atomic_int run_seq;

struct guard_ctx {
    /* library side */
    cerb_client *client;
    const cerb_guard_opts *opts;
    uint64_t lib_done;     /* keys 0..lib_done-1 succeeded */
    uint64_t lib_dup;      /* duplicate cursor */
    /* raw side */
    const struct bench_guard_ceiling *ceil;
    void *sess;
    uint64_t raw_done, raw_dup;
    char token[33];        /* fixed per thread, like the other ceilings' */
    int64_t running_ms, keep_ms;
    /* who */
    long pid;
    int run, idx;
};

static int lib_key(const struct guard_ctx *c, uint64_t n, char *buf, size_t len)
{
    return snprintf(buf, len, "%ld-%d-%d-%" PRIu64, c->pid, c->run, c->idx, n);
}

/* 64 hex characters, as long as a SHA-256 record id. */
static void raw_id(const struct guard_ctx *c, uint64_t n, char out[65])
{
    snprintf(out, 65, "%016lx%08x%08x%032" PRIx64, (unsigned long)c->pid, (unsigned)c->run,
             (unsigned)c->idx, n);
}

static void result_of(uint64_t n, char out[RESULT_LEN + 1])
{
    snprintf(out, RESULT_LEN + 1, "order-%010" PRIu64, n % UINT64_C(10000000000));
}

/* The n-th key back from the newest done one, cycling. */
static uint64_t dup_pick(uint64_t done, uint64_t *cursor)
{
    return done - 1 - (*cursor)++ % done;
}

static void fail_guard(struct bench_worker *w, const char *what, const char *key,
                       cerb_status st)
{
    bench_worker_fail(w, "%s \"%s\": %s (%s)", what, key, cerb_last_error(),
                      cerb_status_name(st));
}

static void *lib_cycle_body(void *p)
{
    struct bench_worker *w = p;
    struct guard_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        char key[96], res[RESULT_LEN + 1];
        int klen = lib_key(c, c->lib_done, key, sizeof key);
        cerb_guard *g = NULL;
        result_of(c->lib_done, res);
        cerb_status st = cerb_guard_begin(c->client, GUARD_SCOPE, key, (size_t)klen, c->opts, &g);
        if (st != CERB_OK) {
            fail_guard(w, "cerb_guard_begin", key, st);
            cerb_guard_free(g);
            break;
        }
        st = cerb_guard_finish(g, 1, res, RESULT_LEN);
        if (st != CERB_OK) {
            fail_guard(w, "cerb_guard_finish", key, st);
            cerb_guard_free(g);
            break;
        }
        if ((st = cerb_guard_free(g)) != CERB_OK) {
            fail_guard(w, "cerb_guard_free", key, st);
            break;
        }
        c->lib_done++;
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

static void *lib_dup_body(void *p)
{
    struct bench_worker *w = p;
    struct guard_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        char key[96], want[RESULT_LEN + 1];
        if (c->lib_done == 0) {
            bench_worker_fail(w, "no key done to send again");
            break;
        }
        uint64_t k = dup_pick(c->lib_done, &c->lib_dup);
        int klen = lib_key(c, k, key, sizeof key);
        cerb_guard *g = NULL;
        cerb_status st = cerb_guard_begin(c->client, GUARD_SCOPE, key, (size_t)klen, c->opts, &g);
        if (st != CERB_DUPLICATE) {
            bench_worker_fail(w, "cerb_guard_begin \"%s\" (done before): %s, expected "
                              "CERB_DUPLICATE (%s)", key, cerb_status_name(st),
                              st == CERB_OK ? "the record is gone" : cerb_last_error());
            cerb_guard_free(g); /* an attempt: freed as failed */
            break;
        }
        size_t len = 0;
        const void *res = cerb_guard_result(g, &len);
        result_of(k, want);
        if (!res || len != RESULT_LEN || memcmp(res, want, RESULT_LEN) != 0) {
            bench_worker_fail(w, "duplicate of \"%s\": stored result is not \"%s\"", key, want);
            cerb_guard_free(g);
            break;
        }
        if ((st = cerb_guard_free(g)) != CERB_OK) {
            fail_guard(w, "cerb_guard_free", key, st);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

static void *raw_cycle_body(void *p)
{
    struct bench_worker *w = p;
    struct guard_ctx *c = w->ctx;
    char err[BENCH_ERR_MAX];
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        char id[65], res[RESULT_LEN + 1];
        raw_id(c, c->raw_done, id);
        result_of(c->raw_done, res);
        if (c->ceil->cycle(c->sess, id, c->token, res, RESULT_LEN, c->running_ms, c->keep_ms,
                           err, sizeof err) != 0) {
            bench_worker_fail(w, "raw ceiling: %s", err);
            break;
        }
        c->raw_done++;
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

static void *raw_dup_body(void *p)
{
    struct bench_worker *w = p;
    struct guard_ctx *c = w->ctx;
    char err[BENCH_ERR_MAX];
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        char id[65];
        if (c->raw_done == 0) {
            bench_worker_fail(w, "raw ceiling: no record done to send again");
            break;
        }
        raw_id(c, dup_pick(c->raw_done, &c->raw_dup), id);
        if (c->ceil->duplicate(c->sess, id, c->token, c->running_ms, err, sizeof err) != 0) {
            bench_worker_fail(w, "raw ceiling: %s", err);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

/* What one kind of operation (cycle or duplicate) needs to be measured. */
struct guard_run {
    const struct bench_engine *e;
    const struct bench_opts *o;
    int threads, rounds;
    int64_t side_ns;
    void **ctxp;
    struct guard_ctx *c0;          /* its session counts the commands */
    const struct bench_guard_ceiling *ceil;
    const char *why;               /* no ceiling: why */
    struct bench_hist *hists;      /* one per thread, for the runner */
};

/* The server's command count into *out, or -1 when it cannot say (the
 * reason printed once). */
static int count_commands(const struct guard_run *gr, uint64_t *out)
{
    char err[BENCH_ERR_MAX];
    if (!gr->ceil || !gr->ceil->server_commands)
        return -1;
    if (gr->ceil->server_commands(gr->c0->sess, out, err, sizeof err) != 0) {
        bench_errorf("note: cannot count the server's commands: %s", err);
        return -1;
    }
    return 0;
}

/* The lesser of `least` (<0: none yet) and a round's commands per op.
 * Background requests (the zk guard's sweeper, the prober) only ever add
 * to a round, so the least round is the operations' own count. */
static double least_per_op(double least, uint64_t cmds, uint64_t ops)
{
    if (ops == 0)
        return least;
    double v = (double)cmds / (double)ops;
    return least < 0 || v < least ? v : least;
}

/*
 * Warm up and measure the rounds of one kind into @out: @scenario names
 * the row. Returns 0, or -1 after printing the failure.
 */
static int measure(const struct guard_run *gr, const char *scenario, void *(*lib_body)(void *),
                   void *(*raw_body)(void *), struct bench_result *out)
{
    struct bench_hist *lib = malloc(sizeof *lib), *raw = malloc(sizeof *raw);
    struct bench_hist *one = malloc(sizeof *one);
    const struct bench_engine *e = gr->e;
    int64_t lib_ns = 0, raw_ns = 0;
    double paired[BENCH_MAX_ROUNDS];
    int n_paired = 0, counting = gr->ceil && gr->ceil->server_commands;
    uint64_t cmds = 0, cmd_ops = 0, raw_cmds = 0, raw_cmd_ops = 0;
    double least = -1, raw_least = -1; /* the rounds' least commands per op */
    char label[96];
    int rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "%s", scenario);
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = gr->threads;
    out->ratio = out->ratio_paired_median = -1;
    out->cmds_per_op = out->ceiling_cmds_per_op = -1;
    out->cmds_per_op_least = out->ceiling_cmds_per_op_least = -1;
    if (!gr->ceil)
        snprintf(out->ceiling_missing, sizeof out->ceiling_missing,
                 "no ceiling for engine %s (%s)", e->name, gr->why);
    if (!lib || !raw || !one) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lib);
    bench_hist_init(raw);

    snprintf(label, sizeof label, "%s %s x%d warm-up", scenario, e->name, gr->threads);
    if (gr->ceil && bench_run_and_merge(label, gr->threads, bench_warmup_ns(gr->o->duration_s),
                                        raw_body, gr->ctxp, NULL, gr->hists, NULL, NULL,
                                        gr->o->progress) != 0)
        goto done;
    if (bench_run_and_merge(label, gr->threads, bench_warmup_ns(gr->o->duration_s), lib_body,
                            gr->ctxp, NULL, gr->hists, NULL, NULL, gr->o->progress) != 0)
        goto done;

    for (int round = 1; round <= gr->rounds; round++) {
        int64_t raw_before_ns = raw_ns, lib_before_ns = lib_ns;
        uint64_t lib_before = lib->n, c0 = 0, c1 = 0;
        if (gr->ceil) {
            if (counting && count_commands(gr, &c0) != 0)
                counting = 0;
            snprintf(label, sizeof label, "%s %s x%d raw %d/%d", scenario, e->name, gr->threads,
                     round, gr->rounds);
            bench_hist_init(one);
            if (bench_run_and_merge(label, gr->threads, gr->side_ns, raw_body, gr->ctxp, NULL,
                                    gr->hists, one, &raw_ns, gr->o->progress) != 0)
                goto done;
            bench_hist_merge(raw, one);
            bench_note_round_p50(out, one);
            if (counting && count_commands(gr, &c1) != 0)
                counting = 0;
            if (counting && c1 >= c0) {
                raw_cmds += c1 - c0;
                raw_cmd_ops += one->n;
                raw_least = least_per_op(raw_least, c1 - c0, one->n);
            }
        }
        if (counting && count_commands(gr, &c0) != 0)
            counting = 0;
        snprintf(label, sizeof label, "%s %s x%d cerberus %d/%d", scenario, e->name, gr->threads,
                 round, gr->rounds);
        if (bench_run_and_merge(label, gr->threads, gr->side_ns, lib_body, gr->ctxp, NULL,
                                gr->hists, lib, &lib_ns, gr->o->progress) != 0)
            goto done;
        if (counting && count_commands(gr, &c1) != 0)
            counting = 0;
        if (counting && c1 >= c0) {
            cmds += c1 - c0;
            cmd_ops += lib->n - lib_before;
            least = least_per_op(least, c1 - c0, lib->n - lib_before);
        }
        /* This round's ratio, from two phases a moment apart. */
        if (gr->ceil && one->n && raw_ns > raw_before_ns && lib_ns > lib_before_ns) {
            double lib_rate = (double)(lib->n - lib_before) / (double)(lib_ns - lib_before_ns);
            double raw_rate = (double)one->n / (double)(raw_ns - raw_before_ns);
            paired[n_paired++] = lib_rate / raw_rate;
        }
    }
    out->ratio_paired_median = bench_median(paired, n_paired);
    if (counting && cmd_ops && raw_cmd_ops) {
        out->cmds_per_op = (double)cmds / (double)cmd_ops;
        out->ceiling_cmds_per_op = (double)raw_cmds / (double)raw_cmd_ops;
        out->cmds_per_op_least = least;
        out->ceiling_cmds_per_op_least = raw_least;
    }

    out->elapsed_s = (double)lib_ns / 1e9;
    out->ops = lib->n;
    out->ops_per_s = lib_ns > 0 ? (double)lib->n / out->elapsed_s : 0;
    bench_fill_latency(out, lib);
    if (gr->ceil && raw_ns > 0) {
        out->ceiling_kind = "ops";
        out->ceiling_ops_per_s = (double)raw->n / ((double)raw_ns / 1e9);
        bench_fill_ceiling_latency(out, raw);
        if (out->ceiling_ops_per_s > 0)
            out->ratio = out->ops_per_s / out->ceiling_ops_per_s;
    }
    rc = 0;

done:
    free(lib);
    free(raw);
    free(one);
    return rc;
}

/*
 * One begin on a key of its own, finished as failed (nothing is left).
 * Returns 1 when it ran, 0 when the engine has no guard in this build (the
 * core's words, core/guard_engine.c, through guard.c's message), -1 on any
 * other failure (printed).
 */
static int probe(cerb_client *client, const struct guard_ctx *c)
{
    char key[96];
    cerb_guard *g = NULL;
    int klen = snprintf(key, sizeof key, "probe-%ld-%d", c->pid, c->run);
    cerb_status st = cerb_guard_begin(client, GUARD_SCOPE, key, (size_t)klen, c->opts, &g);
    if (st == CERB_OK && !cerb_guard_degraded(g)) {
        st = cerb_guard_finish(g, 0, NULL, 0);
        cerb_guard_free(g);
        if (st == CERB_OK)
            return 1;
    } else if (st == CERB_UNAVAILABLE &&
               (strstr(cerb_last_error(), "has no idempotency guard") ||
                strstr(cerb_last_error(), "idempotency guard is refused") ||
                strstr(cerb_last_error(), "guard is not available in redlock mode"))) {
        /* No guard in this build, none in this mode (Redlock: a done-record
         * would need a quorum read and write-back), or refused for good
         * (memcached: records can be evicted, core/guard_engine.c). */
        return 0;
    } else {
        cerb_guard_free(g);
    }
    bench_errorf("cerb_guard_begin \"%s\" (probe): %s (%s)", key, cerb_last_error(),
                 cerb_status_name(st));
    return -1;
}

int bench_guard(const struct bench_engine *e, const struct bench_opts *o, int threads,
                struct bench_result out[2], int *n_out)
{
    const char *why = NULL;
    const struct bench_guard_ceiling *ceil = bench_guard_ceiling_find(e->name, &why);
    struct guard_ctx *ctxs = calloc((size_t)threads, sizeof *ctxs);
    void **ctxp = calloc((size_t)threads, sizeof *ctxp);
    struct bench_hist *hists = calloc((size_t)threads, sizeof *hists);
    cerb_client *client = NULL;
    cerb_guard_opts gopts = CERB_GUARD_OPTS_INIT;
    const int run = atomic_fetch_add(&run_seq, 1);
    const int rounds = bench_rounds_for(o->duration_s);
    int rc = -1;

    memset(out, 0, 2 * sizeof *out);
    *n_out = 0;
    if (!ctxs || !ctxp || !hists) {
        bench_errorf("out of memory");
        goto done;
    }
    /* Kept through the duplicate rounds, then gone (see the file comment). */
    gopts.keep_ms = 20000 + (int64_t)(o->duration_s * 4000);

    /* The raw sessions first: an unreachable server is then reported as
     * plainly as the ceiling's own connect error puts it. */
    for (int i = 0; ceil && i < threads; i++) {
        char err[BENCH_ERR_MAX];
        if (!(ctxs[i].sess = ceil->open(e, err, sizeof err))) {
            bench_errorf("raw ceiling: %s", err);
            goto done;
        }
    }
    if (!(client = bench_client_open(e)))
        goto done;
    for (int i = 0; i < threads; i++) {
        struct guard_ctx *c = &ctxs[i];
        c->client = client;
        c->opts = &gopts;
        c->ceil = ceil;
        c->running_ms = e->cfg->guard.running_ms;
        c->keep_ms = gopts.keep_ms;
        c->pid = (long)getpid();
        c->run = run;
        c->idx = i;
        snprintf(c->token, sizeof c->token, "%08lx%08x%016x",
                 (unsigned long)getpid() & 0xffffffffUL, (unsigned)i, 0x6a4du);
        ctxp[i] = c;
    }

    int p = probe(client, &ctxs[0]);
    if (p < 0)
        goto done;
    if (p == 0) {
        snprintf(out[0].scenario, sizeof out[0].scenario, "guard");
        snprintf(out[0].engine, sizeof out[0].engine, "%s", bench_engine_label(e));
        out[0].threads = threads;
        out[0].ratio = out[0].ratio_paired_median = -1;
        out[0].cmds_per_op = out[0].ceiling_cmds_per_op = -1;
        snprintf(out[0].note, sizeof out[0].note,
                 "skipped: engine %s has no idempotency guard %s", bench_engine_label(e),
                 strcmp(e->name, "memcached") == 0 ? "(refused: records can be evicted)"
                 : strcmp(bench_engine_label(e), "redlock") == 0 ? "in Redlock mode"
                                                                 : "in this build");
        *n_out = 1;
        rc = 0;
        goto done;
    }

    struct guard_run gr = {
        .e = e, .o = o, .threads = threads, .rounds = rounds,
        .side_ns = (int64_t)(o->duration_s * 1e9 / rounds), .ctxp = ctxp, .c0 = &ctxs[0],
        .ceil = ceil, .why = why, .hists = hists,
    };
    if (measure(&gr, "guard", lib_cycle_body, raw_cycle_body, &out[0]) != 0 ||
        measure(&gr, "guard-dup", lib_dup_body, raw_dup_body, &out[1]) != 0)
        goto done;
    *n_out = 2;
    rc = 0;

done:
    for (int i = 0; ctxs && i < threads; i++)
        if (ctxs[i].sess)
            ceil->close(ctxs[i].sess);
    cerb_client_close(client);
    free(ctxs);
    free(ctxp);
    free(hists);
    return rc;
}
