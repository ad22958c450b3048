/*
 * oracle_tool.c — the chaos driver's hands on an oracle file.
 *
 *   cerb_chaos_oracle init FILE
 *   cerb_chaos_oracle header
 *   cerb_chaos_oracle mark-switch FILE SETTLE_MS
 *   cerb_chaos_oracle report FILE SCENARIO [--allow-overlaps] [--min-acq N]
 *                            [--require unsafe|regressions|zero|reruns|overruns]
 *
 * report prints one table row (scenario, acquisitions and their split per
 * engine, overlaps explained/unsafe, token regressions, tokens of 0, guard
 * reruns, overruns, the worst lateness of any call past its bound in ms,
 * LOST) and then the anomaly notes the oracle kept. Its exit status
 * is the verdict: 1 when §5a or §11 was broken (unsafe overlaps — unless
 * --allow-overlaps, the switch_grace_ms = 0 scenario — token regressions,
 * tokens of 0, reruns, overruns) or when fewer than --min-acq grants were made (a
 * lock that grants nothing is dead, not safe). With --require X the verdict
 * is inverted for one check: 0 only when X was reported — how the broken
 * modes prove each check can fail.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"

/* One table row; `header` prints the matching header. */
#define ROW_FMT "| %-16s | %6llu | %-28s | %5llu | %6llu | %5llu | %4llu | %5llu | %5llu | %7llu | %5llu |"
#define HDR_FMT "| %-16s | %6s | %-28s | %5s | %6s | %5s | %4s | %5s | %5s | %7s | %5s |"

static void header(void)
{
    printf(HDR_FMT "\n", "scenario", "acq.", "acquisitions per engine", "expl.",
           "unsafe", "regr.", "tok0", "rerun", "overr", "late ms", "LOST");
    printf("|------------------|--------|------------------------------|-------|--------|"
           "-------|------|-------|-------|---------|-------|\n");
}

static int usage(void)
{
    fprintf(stderr, "usage: cerb_chaos_oracle init FILE\n"
                    "       cerb_chaos_oracle mark-switch FILE SETTLE_MS\n"
                    "       cerb_chaos_oracle report FILE SCENARIO [--allow-overlaps]"
                    " [--min-acq N] [--require unsafe|regressions|zero|reruns|overruns]\n");
    return 2;
}

static int report(oracle *o, int argc, char **argv)
{
    const char *scenario = argv[0];
    int allow = 0;
    long long min_acq = 1;
    const char *require = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--allow-overlaps") == 0)
            allow = 1;
        else if (strcmp(argv[i], "--min-acq") == 0 && i + 1 < argc)
            min_acq = atoll(argv[++i]);
        else if (strcmp(argv[i], "--require") == 0 && i + 1 < argc)
            require = argv[++i];
        else
            return usage();
    }
    oracle_report r;
    oracle_report_get(o, &r);
    char per[256] = "";
    size_t len = 0;
    for (int i = 0; i < ORACLE_MAX_ENGINES && len < sizeof(per) - 40; i++)
        if (r.engine_name[i][0] && r.acq_engine[i])
            len += (size_t)snprintf(per + len, sizeof(per) - len, "%s%s=%llu",
                                    len ? "," : "", r.engine_name[i],
                                    (unsigned long long)r.acq_engine[i]);
    printf(ROW_FMT "\n", scenario, (unsigned long long)r.acquisitions, per,
           (unsigned long long)r.overlaps_explained, (unsigned long long)r.overlaps_unsafe,
           (unsigned long long)r.token_regressions, (unsigned long long)r.zero_tokens,
           (unsigned long long)r.reruns, (unsigned long long)r.overruns, (unsigned long long)r.max_overrun_ms,
           (unsigned long long)r.lost);
    for (unsigned i = 0;; i++) {
        const char *n = oracle_note_get(o, i);
        if (!n)
            break;
        printf("    %s: %s\n", scenario, n);
    }
    if (require) {
        unsigned long long v = strcmp(require, "unsafe") == 0        ? r.overlaps_unsafe
                               : strcmp(require, "regressions") == 0 ? r.token_regressions
                               : strcmp(require, "zero") == 0        ? r.zero_tokens
                               : strcmp(require, "reruns") == 0      ? r.reruns
                               : strcmp(require, "overruns") == 0    ? r.overruns
                                                                     : 0;
        return v > 0 ? 0 : 1;
    }
    int bad = (!allow && r.overlaps_unsafe) || r.token_regressions || r.zero_tokens ||
              r.reruns || r.overruns || (long long)r.acquisitions < min_acq;
    if ((long long)r.acquisitions < min_acq)
        printf("    %s: no progress: %llu grants, %lld required\n", scenario,
               (unsigned long long)r.acquisitions, min_acq);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "header") == 0) {
        header();
        return 0;
    }
    if (argc < 3)
        return usage();
    const char *cmd = argv[1], *file = argv[2];
    if (strcmp(cmd, "init") == 0) {
        oracle *o = oracle_create(file);
        if (!o) {
            perror(file);
            return 1;
        }
        oracle_close(o);
        return 0;
    }
    oracle *o = oracle_open(file);
    if (!o) {
        perror(file);
        return 1;
    }
    int rc;
    if (strcmp(cmd, "mark-switch") == 0 && argc == 4) {
        oracle_mark_switch(o, oracle_now(), atoll(argv[3]));
        rc = 0;
    } else if (strcmp(cmd, "report") == 0 && argc >= 4) {
        rc = report(o, argc - 3, argv + 3);
    } else {
        rc = usage();
    }
    oracle_close(o);
    return rc;
}
