/*
 * report.c — cerberus-bench output: a fixed-width table on stdout, one row
 * per scenario and engine (plus an indented detail line), and with --json an
 * array of result objects built with jansson (never hand-written JSON).
 *
 * Columns: scenario, engine, threads, ops/s, p50/p99/max in microseconds,
 * the ceiling (raw cycles/s for uncontended, one server round trip for
 * handoff) and the ratio: library ops/s ÷ raw ops/s for uncontended (higher
 * is better, target >= 0.9), hand-off p50 ÷ round trip for handoff (lower is
 * better, target <= 3). "n/a" where the engine has no raw ceiling.
 */
#include <jansson.h>

#include <stdio.h>
#include <string.h>

#include "scenarios.h"

void bench_report_header(FILE *f)
{
    fprintf(f, "%-12s %-8s %7s %11s %9s %9s %10s  %-18s %7s\n", "scenario",
            "engine", "threads", "ops/s", "p50(us)", "p99(us)", "max(us)",
            "ceiling", "ratio");
    fflush(f);
}

static double per_acq(uint64_t v, uint64_t acq)
{
    return acq ? (double)v / (double)acq : 0.0;
}

void bench_report_row(FILE *f, const struct bench_result *r)
{
    char ceiling[32] = "n/a", ratio[16] = "n/a";

    if (r->note[0]) { /* failover rows: one finding in words */
        fprintf(f, "%-12s %-8s %7d  %s\n", r->scenario, r->engine, r->threads, r->note);
        return;
    }

    if (r->ceiling_kind && strcmp(r->ceiling_kind, "ops") == 0)
        snprintf(ceiling, sizeof ceiling, "%.0f ops/s", r->ceiling_ops_per_s);
    else if (r->ceiling_kind)
        snprintf(ceiling, sizeof ceiling, "RTT %.1f us", r->ceiling_p50_us);
    if (r->ratio >= 0)
        snprintf(ratio, sizeof ratio, "%.2f", r->ratio);

    fprintf(f, "%-12s %-8s %7d %11.0f %9.1f %9.1f %10.1f  %-18s %7s\n",
            r->scenario, r->engine, r->threads, r->ops_per_s, r->p50_us,
            r->p99_us, r->max_us, ceiling, ratio);

    if (strcmp(r->scenario, "handoff") == 0) {
        fprintf(f, "%-12s hand-off p90 %.1f us, mean %.1f us; %llu acquisitions",
                "", r->p90_us, r->mean_us, (unsigned long long)r->acquisitions);
        if (r->has_counters)
            fprintf(f, "; per acquisition: %.2f wake-ups, %.2f acquire calls, "
                       "%.2f hand-offs",
                    per_acq(r->wakeups, r->acquisitions),
                    per_acq(r->acquire_calls, r->acquisitions),
                    per_acq(r->handoffs, r->acquisitions));
        else
            fputs("; engine reports no protocol counters", f);
        fputc('\n', f);
        if (r->ceiling_kind)
            fprintf(f, "%-12s ratio = hand-off p50 / RTT p50; RTT p50 per "
                       "round %.1f..%.1f us; per-round ratio, median %.2f\n",
                    "", r->ceiling_round_p50_min_us,
                    r->ceiling_round_p50_max_us, r->ratio_paired_median);
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

static json_t *result_json(const struct bench_result *r)
{
    json_t *o = json_object();
    int ok = o != NULL;
    int rtt = r->ceiling_kind && strcmp(r->ceiling_kind, "rtt") == 0;
    int ops = r->ceiling_kind && !rtt;

    if (!ok)
        return NULL;
    put(o, "scenario", json_string(r->scenario), &ok);
    if (r->note[0])
        put(o, "note", json_string(r->note), &ok);
    put(o, "engine", json_string(r->engine), &ok);
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
