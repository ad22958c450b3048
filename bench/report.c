/*
 * report.c — cerberus-bench output: a fixed-width table on stdout, one row
 * per scenario and engine (plus an indented detail line), and with --json an
 * array of result objects built with jansson (never hand-written JSON).
 *
 * Columns: scenario, engine, threads, ops/s, p50/p99/max in microseconds,
 * the ceiling and the ratio. Per scenario:
 *   uncontended  cycles/s; ceiling raw cycles/s; ratio ops/s ÷ raw ops/s
 *                (higher is better, target >= 0.9);
 *   contended    acquisitions/s, latency = acquire wait; ceiling the raw
 *                spin-and-retry cycle on one key; ratio as uncontended;
 *   handoff      latency = release → next holder; ceiling one round trip;
 *                ratio hand-off p50 ÷ RTT (lower is better, target <= 3);
 *   herd         as handoff, with W waiters queued behind one holder;
 *                where the server queues waiters (pg, mysql) both also give the
 *                raw hand-off among W bare sessions (ceiling_handoff.c):
 *                its p50 in microseconds and in RTTs, its p99, and the
 *                hand-off p50 over it (JSON: raw_handoff,
 *                raw_handoff_p50_us, raw_handoff_p99_us,
 *                ratio_to_raw_handoff, only on those rows);
 *   many         acquisitions/s and acquire latency of the M locks; no
 *                ceiling; the detail line has CPU % and bytes per lock;
 *   guard        begin + finish(1) per second on distinct keys; ceiling the
 *                same server commands without the library; ratio as
 *                uncontended; the detail line has the server commands per
 *                cycle, the library's and the raw ceiling's (6 on redis,
 *                which counts a script's own commands; 3 requests on zk,
 *                2 txns on etcd);
 *   guard-dup    duplicates (begin on a done key) per second; ceiling the
 *                raw begin on a done record; the detail line has the
 *                server commands per duplicate (2 on redis: the script
 *                and its SET, one round trip; 2 requests
 *                sent together on zk: one round trip) and the
 *                p50 over the raw command's;
 *   switch       trylock + unlock cycles/s on engine E after `cerberus
 *                switch E`, settled; ceiling "alone": the same cycles on
 *                E with engines = (E) only, in the same run; ratio
 *                switched ops/s ÷ alone ops/s (target >= 0.9); the detail
 *                lines say what was switched (engines, epochs, from which
 *                engine), how long it settled, the alone latencies and
 *                the tries answered BUSY.
 *   semaphore    acquire 1 + release cycles/s with 2N clients on N permits
 *                (threads = 2N), latency = the acquire wait; ceiling one
 *                round trip, ratio acquire-wait p50 / RTT (no target in
 *                DESIGN 10: the peers are the comparison); JSON permits;
 *   rwlock       lock + ~10 us + unlock cycles/s, 90 % reads, 10 %
 *                writes, latency = the cycle; ceiling and ratio as
 *                semaphore; the detail line splits reads and writes (JSON
 *                reads, writes, read_p50_us, read_p99_us, write_p50_us,
 *                write_p99_us);
 *   elect-failover  the leader process killed -> the next one elected:
 *                p50 = the median over the rounds, p99 = max = the
 *                longest, ops/s = rounds / summed failover time; ceiling
 *                kind "bound": the lease or session that ends a dead
 *                leader's term + one RTT, ratio = median / bound (target
 *                <= 1, every round within it); JSON candidates, rounds,
 *                bound_ms, bound_what, rtt_us, failover_ms (a list),
 *                target_met. On the local engine a note.
 * "n/a" where the engine has no raw ceiling (guard rows say why: "no
 * ceiling for engine X (...)"). The detail line under a row
 * gives the per-acquisition protocol counters (wake-ups, acquire calls)
 * where the engine reports them.
 *
 * Peer rows (--peers, peers.c) follow Cerberus's row of the same scenario
 * and threads: the peer's name in the engine column, its ops/s and
 * latencies, and in place of ceiling and ratio "cerberus/peer = 2.10x"
 * (uncontended: Cerberus's ops/s over the peer's, higher is better) or
 * "cerberus/peer p50 0.45x, p99 0.30x" (handoff: Cerberus's hand-off
 * latency over the peer's, lower is better), with DESIGN.md §10's target
 * where there is one; the detail line says how the peer was measured. A
 * peer that could not run is a row "skipped: <why>" or "failed: <why>".
 *
 * JSON: one object per row. Every object has the same core keys (scenario,
 * engine, threads, ops_per_s, p50_us, p99_us, max_us, ratio, ... — ratio
 * and the ceiling keys null when n/a) and the four per-scenario figures
 * wakeups_per_acq, calls_per_acq, cpu_percent and bytes_per_lock, null
 * where they do not apply; scenario-specific keys follow (guard rows:
 * server_cmds_per_op, ceiling_server_cmds_per_op, the least of any
 * round's (server_cmds_per_op_least, ceiling_server_cmds_per_op_least) and
 * ceiling_missing, each null when n/a; switch rows: ceiling_kind "alone"
 * with alone_ops_per_s (= ceiling_ops_per_s), engines (array), from,
 * epoch_before, epoch_after, lease_ms, hold_ms, settle_ms, busy,
 * busy_alone, target_min and target_met). Every object has
 * "peer": null on Cerberus's rows, the peer's name on a peer's row, which
 * also has peer_status ("measured", "skipped", "failed"), peer_reason
 * (null when measured), peer_how, cerberus_over_peer and
 * cerberus_over_peer_p99 (null where n/a), compared ("ops_per_s" or
 * "p50_us"), target (text, or null) and target_met (boolean, or null); the
 * figures of a peer that did not run are null.
 */
#include <jansson.h>

#include <stdio.h>
#include <string.h>

#include "scenarios.h"

void bench_report_header(FILE *f)
{
    fprintf(f, "%-12s %-12s %7s %11s %9s %9s %10s  %-18s %7s\n", "scenario",
            "engine", "threads", "ops/s", "p50(us)", "p99(us)", "max(us)",
            "ceiling", "ratio");
    fflush(f);
}

static double per_acq(uint64_t v, uint64_t acq)
{
    return acq ? (double)v / (double)acq : 0.0;
}

/* Scenarios whose rows count acquisitions on one contended name. */
static int is_queue(const struct bench_result *r)
{
    return strcmp(r->scenario, "handoff") == 0 ||
           strcmp(r->scenario, "contended") == 0 ||
           strcmp(r->scenario, "herd") == 0;
}

static int is_guard(const struct bench_result *r)
{
    return strcmp(r->scenario, "guard") == 0 || strcmp(r->scenario, "guard-dup") == 0;
}

static int is_switch(const struct bench_result *r)
{
    return strcmp(r->scenario, "switch") == 0;
}

/* Peer rows compared by ops/s (higher is better for Cerberus) rather than
 * by latency p50 and p99 (lower is better). */
static int by_ops(const char *scenario)
{
    return strcmp(scenario, "uncontended") == 0 || strcmp(scenario, "semaphore") == 0 ||
           strcmp(scenario, "rwlock") == 0;
}

static int is_elect(const struct bench_result *r)
{
    return strcmp(r->scenario, "elect-failover") == 0;
}

/* Whether peer row @r meets its DESIGN.md §10 target: 1, 0, or -1 when
 * it has none (or no ratio to judge). */
/* How the guard rows' server commands were counted, for the detail line. */
static int target_met(const struct bench_result *r)
{
    if (r->peer_target_min > 0)
        return r->cerb_over_peer < 0 ? -1
                                     : r->cerb_over_peer >= r->peer_target_min;
    if (r->peer_target_max > 0 || r->peer_target_p99_max > 0) {
        if (r->cerb_over_peer < 0 ||
            (r->peer_target_p99_max > 0 && r->cerb_over_peer_p99 < 0))
            return -1;
        return (r->peer_target_max <= 0 ||
                r->cerb_over_peer <= r->peer_target_max) &&
               (r->peer_target_p99_max <= 0 ||
                r->cerb_over_peer_p99 <= r->peer_target_p99_max);
    }
    return -1;
}

/* The target of peer row @r in words ("" when none). */
static void target_text(const struct bench_result *r, char *buf, size_t len)
{
    buf[0] = '\0';
    if (r->peer_target_min > 0)
        snprintf(buf, len, ">= %.1fx", r->peer_target_min);
    else if (r->peer_target_max > 0 && r->peer_target_p99_max > 0)
        snprintf(buf, len, "p50 <= %.1fx, p99 <= %.1fx", r->peer_target_max,
                 r->peer_target_p99_max);
    else if (r->peer_target_max > 0)
        snprintf(buf, len, "p50 <= %.1fx", r->peer_target_max);
}

/* How the guard rows' server commands were counted, per engine. */
static const char *counted_by(const char *engine)
{
    if (strcmp(engine, "zk") == 0)
        return "mntr zk_packets_received: requests, a multi counts one";
    if (strcmp(engine, "redis") == 0)
        return "INFO commandstats, a script's own commands included";
    if (strcmp(engine, "etcd") == 0)
        return "gRPC requests started, from /metrics";
    if (strcmp(engine, "pg") == 0)
        return "transaction ids handed out: statements that wrote or locked a row";
    if (strcmp(engine, "mysql") == 0)
        return "SHOW GLOBAL STATUS Questions: statements sent";
    return "counted by the server";
}

static void peer_row(FILE *f, const struct bench_result *r)
{
    char cmp[96] = "cerberus/peer n/a", tgt[64];
    int unc = by_ops(r->scenario);

    if (strcmp(r->peer_status, "measured") != 0) {
        fprintf(f, "%-12s %-12s %7d %11s %9s %9s %10s  %s: %s\n", r->scenario,
                r->peer, r->threads, "-", "-", "-", "-", r->peer_status,
                r->peer_reason);
        fflush(f);
        return;
    }
    if (unc && r->cerb_over_peer >= 0)
        snprintf(cmp, sizeof cmp, "cerberus/peer = %.2fx", r->cerb_over_peer);
    else if (!unc && r->cerb_over_peer >= 0)
        snprintf(cmp, sizeof cmp, "cerberus/peer p50 %.2fx, p99 %.2fx",
                 r->cerb_over_peer, r->cerb_over_peer_p99);
    target_text(r, tgt, sizeof tgt);
    int met = target_met(r);
    fprintf(f, "%-12s %-12s %7d %11.0f %9.1f %9.1f %10.1f  %s", r->scenario,
            r->peer, r->threads, r->ops_per_s, r->p50_us, r->p99_us,
            r->max_us, cmp);
    if (tgt[0])
        fprintf(f, " (target %s: %s)", tgt,
                met < 0 ? "n/a" : met ? "met" : "MISSED");
    fputc('\n', f);
    fprintf(f, "%-12s %s peer: %s\n", "", r->engine,
            r->peer_how[0] ? r->peer_how : "(no description)");
    fflush(f);
}

void bench_report_row(FILE *f, const struct bench_result *r)
{
    char ceiling[32] = "n/a", ratio[16] = "n/a";

    if (r->peer[0]) {
        peer_row(f, r);
        return;
    }
    if (r->note[0]) { /* failover rows: one finding in words */
        fprintf(f, "%-12s %-12s %7d  %s\n", r->scenario, r->engine, r->threads, r->note);
        return;
    }

    if (r->ceiling_kind && strcmp(r->ceiling_kind, "ops") == 0)
        snprintf(ceiling, sizeof ceiling, "%.0f ops/s", r->ceiling_ops_per_s);
    else if (r->ceiling_kind && strcmp(r->ceiling_kind, "alone") == 0)
        snprintf(ceiling, sizeof ceiling, "alone %.0f ops/s", r->ceiling_ops_per_s);
    else if (r->ceiling_kind && strcmp(r->ceiling_kind, "in-process") == 0)
        snprintf(ceiling, sizeof ceiling, "in-proc %.0f ops/s", r->ceiling_ops_per_s);
    else if (r->ceiling_kind && strcmp(r->ceiling_kind, "bound") == 0)
        snprintf(ceiling, sizeof ceiling, "bound %.0f ms", r->ceiling_p50_us / 1e3);
    else if (r->ceiling_kind && strcmp(r->ceiling_kind, "poll") == 0)
        snprintf(ceiling, sizeof ceiling, "poll p50 %.0f us", r->ceiling_p50_us);
    else if (r->ceiling_kind)
        snprintf(ceiling, sizeof ceiling, "RTT %.1f us", r->ceiling_p50_us);
    if (r->ratio >= 0)
        snprintf(ratio, sizeof ratio, "%.2f", r->ratio);

    fprintf(f, "%-12s %-12s %7d %11.0f %9.1f %9.1f %10.1f  %-18s %7s\n",
            r->scenario, r->engine, r->threads, r->ops_per_s, r->p50_us,
            r->p99_us, r->max_us, ceiling, ratio);

    if (strcmp(r->scenario, "semaphore") == 0) {
        fprintf(f, "%-12s permits %d, %d clients (one thread each) looping acquire 1 "
                   "(no wait limit) + release; latency = the acquire wait, p90 %.1f us, "
                   "mean %.1f us\n",
                "", r->permits, r->threads, r->p90_us, r->mean_us);
        if (r->ceiling_kind)
            fprintf(f, "%-12s ratio = acquire-wait p50 / RTT p50 (round trips per wait; "
                       "RTT p50 per round %.1f..%.1f us); no target in DESIGN 10\n",
                    "", r->ceiling_round_p50_min_us, r->ceiling_round_p50_max_us);
    } else if (strcmp(r->scenario, "rwlock") == 0) {
        fprintf(f, "%-12s %d clients, 90 %% reads / 10 %% writes, ~10 us held; reads: "
                   "%llu, p50 %.1f us, p99 %.1f us; writes: %llu, p50 %.1f us, p99 %.1f us\n",
                "", r->threads, (unsigned long long)r->rw_reads, r->read_p50_us,
                r->read_p99_us, (unsigned long long)r->rw_writes, r->write_p50_us,
                r->write_p99_us);
        if (r->ceiling_kind)
            fprintf(f, "%-12s ratio = cycle p50 / RTT p50 (RTT p50 per round "
                       "%.1f..%.1f us); no target in DESIGN 10\n",
                    "", r->ceiling_round_p50_min_us, r->ceiling_round_p50_max_us);
    } else if (is_elect(r) && r->ceiling_kind) {
        char list[BENCH_ELECT_MAX_ROUNDS * 12] = "";
        for (int i = 0; i < r->rounds && i < BENCH_ELECT_MAX_ROUNDS; i++) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%.0f", i ? ", " : "", r->failover_ms[i]);
        }
        fprintf(f, "%-12s %d candidate processes, the leader killed (SIGKILL) %d times: "
                   "next leader after median %.0f ms, max %.0f ms (%s ms)\n",
                "", r->candidates, r->rounds, r->p50_us / 1e3, r->max_us / 1e3, list);
        fprintf(f, "%-12s bound = %s + 1 RTT (%.1f us); target (DESIGN 16): next leader "
                   "within it, every round: %s\n",
                "", r->bound_what, r->rtt_us > 0 ? r->rtt_us : 0.0,
                r->max_us <= r->ceiling_p50_us ? "met" : "MISSED");
    } else if (strcmp(r->scenario, "serve") == 0 && r->ceiling_kind) {
        fprintf(f, "%-12s in-process cycle p50 %.1f us, p99 %.1f us (p50 per round "
                   "%.1f..%.1f us); overhead of the daemon per cycle: p50 %+.1f us, "
                   "p99 %+.1f us (target: p50 <= 100 us)\n",
                "", r->ceiling_p50_us, r->ceiling_p99_us, r->ceiling_round_p50_min_us,
                r->ceiling_round_p50_max_us, r->p50_us - r->ceiling_p50_us,
                r->p99_us - r->ceiling_p99_us);
        fprintf(f, "%-12s ratio = ops/s over HTTP / ops/s in-process; per-round ratio, "
                   "median %.2f; a bare GET /healthz round trip: p50 %.1f us, p99 %.1f "
                   "us (a cycle is two requests)\n",
                "", r->ratio_paired_median, r->http_rtt_p50_us, r->http_rtt_p99_us);
        if (r->lean_p50_us > 0)
            fprintf(f, "%-12s lean client (keep-alive HTTP/1.1 written by hand, no libcurl): "
                       "%.0f cycles/s, p50 %.1f us, p99 %.1f us; overhead per cycle: p50 "
                       "%+.1f us; a bare round trip: p50 %.1f us, p99 %.1f us\n",
                    "", r->lean_ops_per_s, r->lean_p50_us, r->lean_p99_us,
                    r->lean_p50_us - r->ceiling_p50_us, r->lean_rtt_p50_us,
                    r->lean_rtt_p99_us);
    } else if (strcmp(r->scenario, "serve-handoff") == 0) {
        fprintf(f, "%-12s blocking acquire through the daemon: hand-off p50 %.1f us, p99 "
                   "%.1f us, %llu hand-offs\n",
                "", r->p50_us, r->p99_us, (unsigned long long)r->acquisitions);
        if (r->ceiling_kind)
            fprintf(f, "%-12s Dapr's try-lock-and-poll (/v1.0-alpha1, jittered): every 10 "
                       "ms, hand-off p50 %.1f us, p99 %.1f us; every 100 ms, p50 %.1f us "
                       "(%.1f x), p99 %.1f us; ratio = 10 ms poll p50 / blocking p50 "
                       "(target: >= 10)\n",
                    "", r->ceiling_p50_us, r->ceiling_p99_us, r->poll_slow_p50_us,
                    r->p50_us > 0 ? r->poll_slow_p50_us / r->p50_us : 0.0,
                    r->poll_slow_p99_us);
    } else if (is_queue(r)) {
        const char *what = strcmp(r->scenario, "contended") == 0
                               ? "acquire wait" : "hand-off";
        fprintf(f, "%-12s %s p90 %.1f us, mean %.1f us; %llu acquisitions",
                "", what, r->p90_us, r->mean_us,
                (unsigned long long)r->acquisitions);
        if (strcmp(r->scenario, "herd") == 0)
            fprintf(f, " in %d rounds, drain %.2f ms per round", r->rounds,
                    r->drain_ms);
        fprintf(f, "; %s", r->fair ? "fair" : "barging");
        if (r->has_counters)
            fprintf(f, "; per acquisition: %.2f wake-ups, %.2f acquire calls, "
                       "%.2f hand-offs",
                    per_acq(r->wakeups, r->acquisitions),
                    per_acq(r->acquire_calls, r->acquisitions),
                    per_acq(r->handoffs, r->acquisitions));
        else
            fputs("; engine reports no protocol counters", f);
        fputc('\n', f);
        if (r->ceiling_kind && strcmp(r->ceiling_kind, "rtt") == 0 &&
            r->ratio_paired_median >= 0)
            fprintf(f, "%-12s ratio = hand-off p50 / RTT p50; RTT p50 per "
                       "round %.1f..%.1f us; per-round ratio, median %.2f\n",
                    "", r->ceiling_round_p50_min_us,
                    r->ceiling_round_p50_max_us, r->ratio_paired_median);
        else if (r->ceiling_kind && strcmp(r->ceiling_kind, "rtt") == 0)
            fprintf(f, "%-12s ratio = hand-off p50 / RTT p50 (RTT p50 %.1f "
                       "us, p99 %.1f us, measured before the rounds)\n",
                    "", r->ceiling_p50_us, r->ceiling_p99_us);
        else if (r->ceiling_kind)
            fprintf(f, "%-12s raw spin-and-retry: acquire wait p50 %.1f us, "
                       "p99 %.1f us, max %.1f us; ratio = ops/s / raw ops/s; "
                       "per-round ratio, median %.2f\n",
                    "", r->ceiling_p50_us, r->ceiling_p99_us,
                    r->ceiling_max_us, r->ratio_paired_median);
        if (r->raw_ho_what && r->ceiling_p50_us > 0)
            fprintf(f, "%-12s raw hand-off (%s): p50 %.1f us (%.2f RTT), p99 %.1f us; "
                       "hand-off p50 / raw p50 %.2f\n",
                    "", r->raw_ho_what, r->raw_ho_p50_us,
                    r->raw_ho_p50_us / r->ceiling_p50_us, r->raw_ho_p99_us,
                    r->raw_ho_p50_us > 0 ? r->p50_us / r->raw_ho_p50_us : 0.0);
        if (strcmp(r->scenario, "herd") == 0 && r->has_counters)
            fprintf(f, "%-12s target (DESIGN 10): 1 wake-up and <= 1.1 "
                       "acquire calls per acquisition\n", "");
    } else if (strcmp(r->scenario, "many") == 0) {
        fprintf(f, "%-12s %llu locks held %.1f s (lease %lld ms, renewed): "
                   "CPU %.2f %% of one core, %.0f B per lock (RSS %+.1f MiB); "
                   "%llu not valid at the end\n",
                "", (unsigned long long)r->locks, r->hold_s,
                (long long)r->lease_ms, r->cpu_percent, r->bytes_per_lock,
                (double)r->rss_delta_bytes / (1024.0 * 1024.0),
                (unsigned long long)r->not_valid);
        fprintf(f, "%-12s ops/s and latency: acquiring them with %d threads; "
                   "target (DESIGN 10): < 5 %% of one core, < 1 KiB per lock\n",
                "", r->threads);
    } else if (is_guard(r)) {
        int dup = strcmp(r->scenario, "guard-dup") == 0;
        const char *what = dup ? "duplicate" : "begin+finish";
        if (r->ceiling_kind)
            fprintf(f, "%-12s raw %s p50 %.1f us, p99 %.1f us (p50 per round "
                       "%.1f..%.1f us); ratio = ops/s / raw ops/s; per-round "
                       "ratio, median %.2f%s",
                    "", what, r->ceiling_p50_us, r->ceiling_p99_us,
                    r->ceiling_round_p50_min_us, r->ceiling_round_p50_max_us,
                    r->ratio_paired_median, dup ? "" : "\n");
        else
            fprintf(f, "%-12s %s%s", "", r->ceiling_missing, dup ? "" : "\n");
        if (dup && r->ceiling_kind && r->ceiling_p50_us > 0)
            fprintf(f, "; p50 / raw p50 %.2f\n", r->p50_us / r->ceiling_p50_us);
        else if (dup)
            fputc('\n', f);
        if (r->cmds_per_op >= 0)
            fprintf(f, "%-12s server commands per %s: %.2f, raw %.2f (%s)%s\n", "",
                    what, r->cmds_per_op, r->ceiling_cmds_per_op, counted_by(r->engine),
                    dup ? "; target (DESIGN 10): one round trip" : "");
        else
            fprintf(f, "%-12s server commands per %s: n/a (the server cannot be "
                       "asked)\n", "", what);
    } else if (is_switch(r)) {
        fprintf(f, "%-12s after `cerberus switch %s` from active = \"auto\" (on %s), "
                   "engines (%s), epoch %lld -> %lld; settled %lld ms (2 x %lld ms, the "
                   "longest hold life; lease %lld ms)\n",
                "", r->engine, r->sw_from, r->sw_engines, (long long)r->sw_epoch_before,
                (long long)r->sw_epoch_after, (long long)r->sw_settle_ms,
                (long long)r->sw_hold_ms, (long long)r->lease_ms);
        if (r->ceiling_kind)
            fprintf(f, "%-12s alone (engines = (%s)): p50 %.1f us, p99 %.1f us, max %.1f us "
                       "(p50 per round %.1f..%.1f us); tries answered BUSY: %llu switched, "
                       "%llu alone\n",
                    "", r->engine, r->ceiling_p50_us, r->ceiling_p99_us, r->ceiling_max_us,
                    r->ceiling_round_p50_min_us, r->ceiling_round_p50_max_us,
                    (unsigned long long)r->sw_busy, (unsigned long long)r->sw_busy_alone);
        fprintf(f, "%-12s gate questions to the engines left during the rounds: %llu "
                   "(%.3f per acquisition; %s)\n",
                "", (unsigned long long)r->sw_questions,
                r->ops ? (double)r->sw_questions / (double)r->ops : 0.0,
                r->ops && r->sw_questions >= r->ops
                    ? "the full gate: closure records not trusted, see the lease and "
                      "failover.probe_interval_ms"
                    : "closure records trusted");
        fprintf(f, "%-12s ratio = switched ops/s / alone ops/s; per-round ratio, median "
                   "%.2f; target (DESIGN 10): >= %.1f (%s)\n",
                "", r->ratio_paired_median, BENCH_SWITCH_TARGET,
                r->ratio < 0 ? "n/a" : r->ratio >= BENCH_SWITCH_TARGET ? "met" : "MISSED");
    } else if (r->ceiling_kind) {
        fprintf(f, "%-12s raw cycle p50 %.1f us, p99 %.1f us, max %.1f us "
                   "(p50 per round %.1f..%.1f us)\n",
                "", r->ceiling_p50_us, r->ceiling_p99_us, r->ceiling_max_us,
                r->ceiling_round_p50_min_us, r->ceiling_round_p50_max_us);
        fprintf(f, "%-12s ratio = ops/s / raw ops/s; per-round ratio, median "
                   "%.2f\n",
                "", r->ratio_paired_median);
    }
    fflush(f);
}

/* json_object_set_new, but a NULL value (allocation failure) marks @ok 0. */
static void put(json_t *o, const char *key, json_t *v, int *ok)
{
    if (!v || json_object_set_new(o, key, v) != 0)
        *ok = 0;
}

/* A number, or null when @v < 0 (n/a). */
static json_t *real_or_null(double v)
{
    return v >= 0 ? json_real(v) : json_null();
}

/* A peer's row: the core keys (its figures null unless measured), then the
 * peer_* keys. */
static json_t *peer_json(const struct bench_result *r)
{
    json_t *o = json_object();
    int ok = o != NULL;
    int m = strcmp(r->peer_status, "measured") == 0;
    int unc = by_ops(r->scenario);
    char tgt[64];
    int met = target_met(r);

    if (!ok)
        return NULL;
    target_text(r, tgt, sizeof tgt);
    put(o, "scenario", json_string(r->scenario), &ok);
    put(o, "engine", json_string(r->engine), &ok);
    put(o, "peer", json_string(r->peer), &ok);
    put(o, "threads", json_integer(r->threads), &ok);
    put(o, "elapsed_s", m ? json_real(r->elapsed_s) : json_null(), &ok);
    put(o, "ops", m && r->ops ? json_integer((json_int_t)r->ops) : json_null(),
        &ok);
    put(o, "ops_per_s", m ? json_real(r->ops_per_s) : json_null(), &ok);
    put(o, "p50_us", m ? json_real(r->p50_us) : json_null(), &ok);
    put(o, "p90_us", m ? real_or_null(r->p90_us) : json_null(), &ok);
    put(o, "p99_us", m ? json_real(r->p99_us) : json_null(), &ok);
    put(o, "max_us", m ? json_real(r->max_us) : json_null(), &ok);
    put(o, "mean_us", json_null(), &ok);
    put(o, "ceiling_kind", json_null(), &ok);
    put(o, "ratio", json_null(), &ok);
    put(o, "ratio_paired_median", json_null(), &ok);
    put(o, "wakeups_per_acq", json_null(), &ok);
    put(o, "calls_per_acq", json_null(), &ok);
    put(o, "cpu_percent", json_null(), &ok);
    put(o, "bytes_per_lock", json_null(), &ok);
    put(o, "peer_status", json_string(r->peer_status), &ok);
    put(o, "peer_reason", m ? json_null() : json_string(r->peer_reason), &ok);
    put(o, "peer_how", m && r->peer_how[0] ? json_string(r->peer_how)
                                           : json_null(), &ok);
    put(o, "compared", json_string(unc ? "ops_per_s" : "p50_us"), &ok);
    put(o, "cerberus_over_peer", m ? real_or_null(r->cerb_over_peer)
                                   : json_null(), &ok);
    put(o, "cerberus_over_peer_p99",
        m && !unc ? real_or_null(r->cerb_over_peer_p99) : json_null(), &ok);
    put(o, "target", tgt[0] ? json_string(tgt) : json_null(), &ok);
    put(o, "target_met", m && met >= 0 ? json_boolean(met) : json_null(), &ok);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *result_json(const struct bench_result *r)
{
    json_t *o = json_object();
    int ok = o != NULL;
    int rtt = r->ceiling_kind && strcmp(r->ceiling_kind, "rtt") == 0;
    int ops = r->ceiling_kind && !rtt;

    if (!ok)
        return NULL;
    if (r->peer[0]) {
        json_decref(o);
        return peer_json(r);
    }
    put(o, "scenario", json_string(r->scenario), &ok);
    if (r->note[0])
        put(o, "note", json_string(r->note), &ok);
    put(o, "engine", json_string(r->engine), &ok);
    put(o, "peer", json_null(), &ok);
    put(o, "threads", json_integer(r->threads), &ok);
    put(o, "elapsed_s", json_real(r->elapsed_s), &ok);
    put(o, "ops", json_integer((json_int_t)r->ops), &ok);
    put(o, "ops_per_s", json_real(r->ops_per_s), &ok);
    put(o, "p50_us", json_real(r->p50_us), &ok);
    put(o, "p90_us", json_real(r->p90_us), &ok);
    put(o, "p99_us", json_real(r->p99_us), &ok);
    put(o, "max_us", json_real(r->max_us), &ok);
    put(o, "mean_us", json_real(r->mean_us), &ok);
    put(o, "ceiling_kind",
        r->ceiling_kind ? json_string(r->ceiling_kind) : json_null(), &ok);
    put(o, "ceiling_ops_per_s", ops ? json_real(r->ceiling_ops_per_s)
                                    : json_null(), &ok);
    put(o, "ceiling_rtt_us", rtt ? json_real(r->ceiling_p50_us) : json_null(),
        &ok);
    put(o, "ceiling_p50_us",
        r->ceiling_kind ? json_real(r->ceiling_p50_us) : json_null(), &ok);
    put(o, "ceiling_p99_us",
        r->ceiling_kind ? json_real(r->ceiling_p99_us) : json_null(), &ok);
    put(o, "ceiling_max_us",
        r->ceiling_kind ? json_real(r->ceiling_max_us) : json_null(), &ok);
    put(o, "ceiling_round_p50_min_us",
        r->ceiling_kind ? json_real(r->ceiling_round_p50_min_us) : json_null(),
        &ok);
    put(o, "ceiling_round_p50_max_us",
        r->ceiling_kind ? json_real(r->ceiling_round_p50_max_us) : json_null(),
        &ok);
    put(o, "ratio", r->ratio >= 0 ? json_real(r->ratio) : json_null(), &ok);
    put(o, "ratio_paired_median",
        r->ratio_paired_median >= 0 ? json_real(r->ratio_paired_median)
                                    : json_null(), &ok);
    /* The per-scenario figures, on every object (null where n/a). */
    int counted = is_queue(r) && r->has_counters && r->acquisitions;
    int many = strcmp(r->scenario, "many") == 0 && !r->note[0];
    put(o, "wakeups_per_acq",
        counted ? json_real(per_acq(r->wakeups, r->acquisitions))
                : json_null(), &ok);
    put(o, "calls_per_acq",
        counted ? json_real(per_acq(r->acquire_calls, r->acquisitions))
                : json_null(), &ok);
    put(o, "cpu_percent", many ? json_real(r->cpu_percent) : json_null(),
        &ok);
    put(o, "bytes_per_lock", many ? json_real(r->bytes_per_lock)
                                  : json_null(), &ok);
    if (strcmp(r->scenario, "contended") == 0 ||
        strcmp(r->scenario, "herd") == 0) {
        put(o, "fair", json_boolean(r->fair), &ok);
        put(o, "acquisitions", json_integer((json_int_t)r->acquisitions),
            &ok);
        put(o, "acquire_calls", r->has_counters
                ? json_integer((json_int_t)r->acquire_calls) : json_null(),
            &ok);
        put(o, "wakeups", r->has_counters
                ? json_integer((json_int_t)r->wakeups) : json_null(), &ok);
        put(o, "handoffs", r->has_counters
                ? json_integer((json_int_t)r->handoffs) : json_null(), &ok);
    }
    if (strcmp(r->scenario, "herd") == 0) {
        put(o, "waiters", json_integer(r->threads), &ok);
        put(o, "rounds", json_integer(r->rounds), &ok);
        put(o, "drain_ms", json_real(r->drain_ms), &ok);
    }
    if (is_guard(r)) {
        put(o, "server_cmds_per_op", real_or_null(r->cmds_per_op), &ok);
        put(o, "ceiling_server_cmds_per_op", real_or_null(r->ceiling_cmds_per_op), &ok);
        put(o, "server_cmds_per_op_least", real_or_null(r->cmds_per_op_least), &ok);
        put(o, "ceiling_server_cmds_per_op_least", real_or_null(r->ceiling_cmds_per_op_least),
            &ok);
        put(o, "ceiling_missing", r->ceiling_missing[0]
                ? json_string(r->ceiling_missing) : json_null(), &ok);
    }
    if (is_switch(r)) {
        json_t *engines = json_array();
        char list[sizeof r->sw_engines];
        snprintf(list, sizeof list, "%s", r->sw_engines);
        for (char *save = NULL, *tok = strtok_r(list, ",", &save); engines && tok;
             tok = strtok_r(NULL, ",", &save))
            if (json_array_append_new(engines, json_string(tok)) != 0)
                ok = 0;
        put(o, "alone_ops_per_s", ops ? json_real(r->ceiling_ops_per_s) : json_null(), &ok);
        put(o, "engines", engines, &ok);
        put(o, "from", json_string(r->sw_from), &ok);
        put(o, "epoch_before", json_integer((json_int_t)r->sw_epoch_before), &ok);
        put(o, "epoch_after", json_integer((json_int_t)r->sw_epoch_after), &ok);
        put(o, "lease_ms", json_integer((json_int_t)r->lease_ms), &ok);
        put(o, "hold_ms", json_integer((json_int_t)r->sw_hold_ms), &ok);
        put(o, "settle_ms", json_integer((json_int_t)r->sw_settle_ms), &ok);
        put(o, "busy", json_integer((json_int_t)r->sw_busy), &ok);
        put(o, "busy_alone", json_integer((json_int_t)r->sw_busy_alone), &ok);
        put(o, "gate_questions", json_integer((json_int_t)r->sw_questions), &ok);
        put(o, "target_min", json_real(BENCH_SWITCH_TARGET), &ok);
        put(o, "target_met", r->ratio >= 0 ? json_boolean(r->ratio >= BENCH_SWITCH_TARGET)
                                           : json_null(), &ok);
    }
    if (many) {
        put(o, "locks", json_integer((json_int_t)r->locks), &ok);
        put(o, "lease_ms", json_integer((json_int_t)r->lease_ms), &ok);
        put(o, "hold_s", json_real(r->hold_s), &ok);
        put(o, "rss_delta_bytes", json_integer((json_int_t)r->rss_delta_bytes),
            &ok);
        put(o, "not_valid", json_integer((json_int_t)r->not_valid), &ok);
    }
    if (strcmp(r->scenario, "handoff") == 0) {
        uint64_t a = r->acquisitions;
        put(o, "acquisitions", json_integer((json_int_t)a), &ok);
        if (r->has_counters) {
            put(o, "acquire_calls", json_integer((json_int_t)r->acquire_calls),
                &ok);
            put(o, "wakeups", json_integer((json_int_t)r->wakeups), &ok);
            put(o, "handoffs", json_integer((json_int_t)r->handoffs), &ok);
            put(o, "wakeups_per_acquisition",
                json_real(per_acq(r->wakeups, a)), &ok);
            put(o, "acquire_calls_per_acquisition",
                json_real(per_acq(r->acquire_calls, a)), &ok);
            put(o, "handoffs_per_acquisition",
                json_real(per_acq(r->handoffs, a)), &ok);
        } else {
            put(o, "acquire_calls", json_null(), &ok);
            put(o, "wakeups", json_null(), &ok);
            put(o, "handoffs", json_null(), &ok);
        }
    }
    /* handoff and herd on an engine with a raw hand-off (pg, mysql). */
    if (r->raw_ho_what) {
        put(o, "raw_handoff", json_string(r->raw_ho_what), &ok);
        put(o, "raw_handoff_p50_us", json_real(r->raw_ho_p50_us), &ok);
        put(o, "raw_handoff_p99_us", json_real(r->raw_ho_p99_us), &ok);
        put(o, "ratio_to_raw_handoff",
            r->raw_ho_p50_us > 0 ? json_real(r->p50_us / r->raw_ho_p50_us) : json_null(), &ok);
    }
    if (strcmp(r->scenario, "semaphore") == 0)
        put(o, "permits", json_integer(r->permits), &ok);
    if (strcmp(r->scenario, "rwlock") == 0) {
        put(o, "reads", json_integer((json_int_t)r->rw_reads), &ok);
        put(o, "writes", json_integer((json_int_t)r->rw_writes), &ok);
        put(o, "read_p50_us", json_real(r->read_p50_us), &ok);
        put(o, "read_p99_us", json_real(r->read_p99_us), &ok);
        put(o, "write_p50_us", json_real(r->write_p50_us), &ok);
        put(o, "write_p99_us", json_real(r->write_p99_us), &ok);
    }
    if (is_elect(r) && !r->note[0]) {
        json_t *fo = json_array();
        for (int i = 0; fo && i < r->rounds && i < BENCH_ELECT_MAX_ROUNDS; i++)
            if (json_array_append_new(fo, json_real(r->failover_ms[i])) != 0)
                ok = 0;
        put(o, "candidates", json_integer(r->candidates), &ok);
        put(o, "rounds", json_integer(r->rounds), &ok);
        put(o, "bound_ms", json_integer((json_int_t)r->bound_ms), &ok);
        put(o, "bound_what", json_string(r->bound_what), &ok);
        put(o, "rtt_us", real_or_null(r->rtt_us), &ok);
        put(o, "failover_ms", fo, &ok);
        put(o, "target_met", json_boolean(r->max_us <= r->ceiling_p50_us), &ok);
    }
    if (strcmp(r->scenario, "serve-handoff") == 0 && r->poll_slow_p50_us > 0) {
        put(o, "poll_100ms_p50_us", json_real(r->poll_slow_p50_us), &ok);
        put(o, "poll_100ms_p99_us", json_real(r->poll_slow_p99_us), &ok);
    }
    /* serve: a bare HTTP round trip to the daemon. */
    if (strcmp(r->scenario, "serve") == 0 && r->http_rtt_p50_us > 0) {
        put(o, "http_rtt_p50_us", json_real(r->http_rtt_p50_us), &ok);
        put(o, "http_rtt_p99_us", json_real(r->http_rtt_p99_us), &ok);
    }
    if (strcmp(r->scenario, "serve") == 0 && r->lean_p50_us > 0) {
        put(o, "lean_ops_per_s", json_real(r->lean_ops_per_s), &ok);
        put(o, "lean_p50_us", json_real(r->lean_p50_us), &ok);
        put(o, "lean_p99_us", json_real(r->lean_p99_us), &ok);
        put(o, "lean_rtt_p50_us", json_real(r->lean_rtt_p50_us), &ok);
        put(o, "lean_rtt_p99_us", json_real(r->lean_rtt_p99_us), &ok);
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int bench_report_json(const char *path, const struct bench_result *r,
                      size_t n)
{
    json_t *arr = json_array();
    if (!arr) {
        bench_errorf("--json: out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *o = result_json(&r[i]);
        if (!o || json_array_append_new(arr, o) != 0) {
            bench_errorf("--json: out of memory");
            json_decref(arr);
            return -1;
        }
    }
    if (json_dump_file(arr, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                    JSON_REAL_PRECISION(10)) != 0) {
        bench_errorf("--json: cannot write %s", path);
        json_decref(arr);
        return -1;
    }
    json_decref(arr);
    return 0;
}
