/*
 * plot.c — `--plot FILE.png`: the results drawn by gnuplot (Debian package
 * gnuplot-nox), engines side by side.
 *
 * The bench does not link a plotting library: it writes a data file and a
 * gnuplot script into a fresh temporary directory (mkdtemp) and runs
 * gnuplot on the script as a child process (posix_spawnp, so PATH decides
 * which gnuplot), bounded by PLOT_TIMEOUT_NS; then it removes both files.
 * On failure the directory is kept and named, so the script can be rerun by
 * hand.
 *
 * Layout of the picture: two panels, one above the other. Each x position
 * is one measured case ("uncontended x1", "contended x8", "herd x100",
 * "many 10000 locks", ...). Top: ops/s, log scale, one bar per engine, and
 * next to it a hatched bar with the engine's raw ceiling where the case has
 * one in ops/s. Bottom: latency in microseconds, log scale, a solid p50 bar
 * and a hatched p99 bar per engine. Missing values (an engine without that
 * case, a ceiling that is n/a) are "?" in the data file, which gnuplot
 * skips. Failover rows (findings in words) are not drawn.
 *
 * With --peers, each measured peer (redis-py, curator, ...) is a series of
 * its own next to the engines, titled "<peer> (peer, <engine>)", with the
 * engines titled "cerberus <engine>"; peers that were skipped or failed are
 * not drawn. A series' column with no value at all (a peer has no raw
 * ceiling) gets no plot term: gnuplot rejects a term with no points.
 *
 * Data file columns: 1 = case label, then per series four columns: ops/s,
 * raw ceiling ops/s, p50 µs, p99 µs.
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scenarios.h"

extern char **environ;

#define PLOT_TIMEOUT_NS (60 * INT64_C(1000000000))
#define PLOT_POLL_NS (10 * INT64_C(1000000))
#define PLOT_MAX_CASES 64
#define PLOT_LABEL_MAX 48
/* Engines, plus the peers of --peers. */
#define PLOT_MAX_SERIES (CERB_MAX_ENGINES + 16)

/* Whether row @r is drawn: failover findings and peers that did not run
 * are not. */
static int drawn(const struct bench_result *r)
{
    if (r->note[0])
        return 0;
    return !r->peer[0] || strcmp(r->peer_status, "measured") == 0;
}

/* The series of a row: its peer, or its engine. */
static const char *series_of(const struct bench_result *r)
{
    return r->peer[0] ? r->peer : r->engine;
}

int bench_plot_check(void)
{
    const char *path = getenv("PATH");
    char buf[4096];

    if (!path || !*path)
        path = "/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len && len < sizeof buf - 16) {
            snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)len, p);
            if (access(buf, X_OK) == 0)
                return 0;
        }
        if (!end)
            break;
        p = end + 1;
    }
    bench_errorf("--plot needs gnuplot, which is not on PATH; install it "
                 "(Debian: apt-get install gnuplot-nox)");
    return -1;
}

/* The x label of a row: what was measured and with how many. */
static void case_label(const struct bench_result *r, char *out, size_t len)
{
    if (strcmp(r->scenario, "many") == 0)
        snprintf(out, len, "many %llu locks", (unsigned long long)r->locks);
    else
        snprintf(out, len, "%s x%d", r->scenario, r->threads);
}

/* Index of @s in @list[0..*n), appended when absent; -1 when full. */
static int intern(char (*list)[PLOT_LABEL_MAX], int *n, int max,
                  const char *s)
{
    for (int i = 0; i < *n; i++)
        if (strcmp(list[i], s) == 0)
            return i;
    if (*n == max)
        return -1;
    snprintf(list[*n], PLOT_LABEL_MAX, "%s", s);
    return (*n)++;
}

/* A value for the data file: "?" (missing) unless positive. */
static void put_value(FILE *f, double v)
{
    if (v > 0)
        fprintf(f, " %.6g", v);
    else
        fputs(" ?", f);
}

/* @s as a gnuplot single-quoted string (a quote is doubled). */
static void put_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static int write_data(const char *file, const struct bench_result *r,
                      size_t n, char (*cases)[PLOT_LABEL_MAX], int n_cases,
                      char (*engines)[PLOT_LABEL_MAX], int n_engines)
{
    FILE *f = fopen(file, "w");
    if (!f) {
        bench_errorf("--plot: cannot write %s: %s", file, strerror(errno));
        return -1;
    }
    fputs("# case, then per engine: ops/s, raw ops/s, p50 us, p99 us\n", f);
    for (int c = 0; c < n_cases; c++) {
        fprintf(f, "\"%s\"", cases[c]);
        for (int e = 0; e < n_engines; e++) {
            const struct bench_result *row = NULL;
            for (size_t i = 0; i < n; i++) {
                char label[PLOT_LABEL_MAX];
                if (!drawn(&r[i]) || strcmp(series_of(&r[i]), engines[e]) != 0)
                    continue;
                case_label(&r[i], label, sizeof label);
                if (strcmp(label, cases[c]) == 0)
                    row = &r[i];
            }
            if (!row) {
                fputs(" ? ? ? ?", f);
                continue;
            }
            put_value(f, row->ops_per_s);
            put_value(f, row->ceiling_kind &&
                                 strcmp(row->ceiling_kind, "ops") == 0
                             ? row->ceiling_ops_per_s
                             : 0);
            put_value(f, row->p50_us);
            put_value(f, row->p99_us);
        }
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        bench_errorf("--plot: cannot write %s: %s", file, strerror(errno));
        return -1;
    }
    return 0;
}

/* Whether series @s has a positive value in column @col (0 ops/s, 1 raw
 * ceiling, 2 p50, 3 p99) of any drawn row. */
static int has_value(const struct bench_result *r, size_t n, const char *s,
                     int col)
{
    for (size_t i = 0; i < n; i++) {
        if (!drawn(&r[i]) || strcmp(series_of(&r[i]), s) != 0)
            continue;
        double v = col == 0 ? r[i].ops_per_s
                 : col == 1 ? (r[i].ceiling_kind &&
                               strcmp(r[i].ceiling_kind, "ops") == 0
                                   ? r[i].ceiling_ops_per_s : 0)
                 : col == 2 ? r[i].p50_us
                            : r[i].p99_us;
        if (v > 0)
            return 1;
    }
    return 0;
}

/* A log axis' lower bound: the power of ten one decade below the smallest
 * value drawn in columns @c0..@c1 (see has_value), so that the shortest
 * bar still shows; "*" (autoscale) when nothing is drawn. */
static void put_ymin(FILE *f, const struct bench_result *r, size_t n, int c0,
                     int c1)
{
    double min = 0;
    for (size_t i = 0; i < n; i++) {
        if (!drawn(&r[i]))
            continue;
        for (int col = c0; col <= c1; col++) {
            double v = col == 0 ? r[i].ops_per_s
                     : col == 1 ? (r[i].ceiling_kind &&
                                   strcmp(r[i].ceiling_kind, "ops") == 0
                                       ? r[i].ceiling_ops_per_s : 0)
                     : col == 2 ? r[i].p50_us
                                : r[i].p99_us;
            if (v > 0 && (min == 0 || v < min))
                min = v;
        }
    }
    if (min <= 0) {
        fputs("set yrange [*:*]\n", f);
        return;
    }
    double d = 1e-3;
    while (d * 10 <= min)
        d *= 10;
    fprintf(f, "set yrange [%g:*]\n", d / 10);
}

/* The legend name of series @s: "cerberus redis" or "curator (peer, zk)"
 * when peers are drawn, else the engine's name. */
static void series_title(const struct bench_result *r, size_t n,
                         const char *s, char *buf, size_t len)
{
    int peers = 0;
    const char *engine = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!drawn(&r[i]))
            continue;
        peers |= r[i].peer[0] != 0;
        if (r[i].peer[0] && strcmp(r[i].peer, s) == 0)
            engine = r[i].engine;
    }
    if (engine)
        snprintf(buf, len, "%s (peer, %s)", s, engine);
    else if (peers)
        snprintf(buf, len, "cerberus %s", s);
    else
        snprintf(buf, len, "%s", s);
}

static int write_script(const char *file, const char *png, const char *data,
                        const struct bench_result *r, size_t n,
                        char (*engines)[PLOT_LABEL_MAX], int n_engines)
{
    FILE *f = fopen(file, "w");
    if (!f) {
        bench_errorf("--plot: cannot write %s: %s", file, strerror(errno));
        return -1;
    }
    fputs("set terminal pngcairo size 1400,1000 noenhanced font ',10'\n"
          "set output ", f);
    put_quoted(f, png);
    fputs("\nset datafile missing '?'\n"
          "set style data histograms\n"
          "set style histogram clustered gap 1\n"
          "set style fill solid 0.85 border -1\n"
          "set boxwidth 0.9\n"
          "set logscale y\n"
          "set grid ytics mytics\n"
          "set key outside right top vertical\n"
          "set xtics nomirror\n",
          f);
    int any_peer = 0;
    for (size_t i = 0; i < n; i++)
        any_peer |= drawn(&r[i]) && r[i].peer[0];
    fprintf(f, "set multiplot layout 2,1 title 'cerberus-bench: engines%s "
               "side by side (log scales)'\n",
            any_peer ? " and their peers on the same servers" : "");

    /* Top: ops/s and the raw ceiling. Colours: one per series; the first
     * term carries the x labels. */
    fputs("set title 'throughput'\nset ylabel 'ops/s'\n", f);
    put_ymin(f, r, n, 0, 1);
    fputs("plot ", f);
    int terms = 0;
    for (int e = 0; e < n_engines; e++) {
        char title[2 * PLOT_LABEL_MAX];
        series_title(r, n, engines[e], title, sizeof title);
        for (int col = 0; col < 2; col++) {
            if (!has_value(r, n, engines[e], col))
                continue;
            fputs(terms++ ? ", \\\n     " : "", f);
            put_quoted(f, data);
            char t[3 * PLOT_LABEL_MAX];
            snprintf(t, sizeof t, "%s%s", title, col ? " raw ceiling" : "");
            fprintf(f, " using %d%s title ", 2 + col + 4 * e,
                    terms == 1 ? ":xtic(1)" : "");
            put_quoted(f, t);
            fprintf(f, " linecolor %d%s", e + 1, col ? " fill pattern 4" : "");
        }
    }
    /* Bottom: latency percentiles. */
    fputs("\nset title 'latency (uncontended: cycle; contended: acquire "
          "wait; handoff, herd: release to next holder; many: acquire)'\n"
          "set ylabel 'microseconds'\n",
          f);
    put_ymin(f, r, n, 2, 3);
    fputs("plot ", f);
    terms = 0;
    for (int e = 0; e < n_engines; e++) {
        char title[2 * PLOT_LABEL_MAX];
        series_title(r, n, engines[e], title, sizeof title);
        for (int col = 2; col < 4; col++) {
            if (!has_value(r, n, engines[e], col))
                continue;
            fputs(terms++ ? ", \\\n     " : "", f);
            put_quoted(f, data);
            char t[3 * PLOT_LABEL_MAX];
            snprintf(t, sizeof t, "%s %s", title, col == 2 ? "p50" : "p99");
            fprintf(f, " using %d%s title ", 2 + col + 4 * e,
                    terms == 1 ? ":xtic(1)" : "");
            put_quoted(f, t);
            fprintf(f, " linecolor %d%s", e + 1, col == 3 ? " fill pattern 5" : "");
        }
    }
    fputs("\nunset multiplot\n", f);
    if (fclose(f) != 0) {
        bench_errorf("--plot: cannot write %s: %s", file, strerror(errno));
        return -1;
    }
    return 0;
}

/* Run gnuplot on @script, bounded. Returns 0 or -1 (printed). */
static int run_gnuplot(const char *script)
{
    char *argv[] = {"gnuplot", (char *)script, NULL};
    pid_t pid;
    int err = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    if (err) {
        bench_errorf("--plot: cannot run gnuplot: %s%s", strerror(err),
                     err == ENOENT ? " (Debian: apt-get install gnuplot-nox)"
                                   : "");
        return -1;
    }
    int64_t deadline = bench_now_ns() + PLOT_TIMEOUT_NS;
    for (;;) {
        int ws;
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid) {
            if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
                return 0;
            bench_errorf("--plot: gnuplot failed (%s %d)",
                         WIFEXITED(ws) ? "exit status" : "signal",
                         WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
            return -1;
        }
        if (w < 0 && errno != EINTR) {
            bench_errorf("--plot: waitpid: %s", strerror(errno));
            return -1;
        }
        if (bench_now_ns() >= deadline) {
            kill(pid, SIGKILL); /* our own child, by its PID */
            waitpid(pid, &ws, 0);
            bench_errorf("--plot: gnuplot still running after %.0f s; killed",
                         (double)PLOT_TIMEOUT_NS / 1e9);
            return -1;
        }
        /* No event tells us a child exited without a signal handler; a
         * short poll keeps this self-contained. */
        struct timespec ts = {0, (long)PLOT_POLL_NS};
        nanosleep(&ts, NULL);
    }
}

int bench_plot(const char *path, const struct bench_result *r, size_t n)
{
    char cases[PLOT_MAX_CASES][PLOT_LABEL_MAX];
    char engines[PLOT_MAX_SERIES][PLOT_LABEL_MAX];
    int n_cases = 0, n_engines = 0;
    char dir[] = "/tmp/cerb-plot-XXXXXX";
    char data[sizeof dir + 16], script[sizeof dir + 16], png[4096];
    int rc = -1;

    for (size_t i = 0; i < n; i++) {
        char label[PLOT_LABEL_MAX];
        if (!drawn(&r[i]))
            continue;
        case_label(&r[i], label, sizeof label);
        if (intern(cases, &n_cases, PLOT_MAX_CASES, label) < 0 ||
            intern(engines, &n_engines, PLOT_MAX_SERIES, series_of(&r[i])) < 0) {
            bench_errorf("--plot: too many cases to draw");
            return -1;
        }
    }
    if (n_cases == 0) {
        bench_errorf("--plot: no results to draw");
        return -1;
    }
    /* gnuplot runs in no particular directory: give it an absolute path. */
    if (path[0] == '/') {
        snprintf(png, sizeof png, "%s", path);
    } else {
        char cwd[3072];
        if (!getcwd(cwd, sizeof cwd)) {
            bench_errorf("--plot: getcwd: %s", strerror(errno));
            return -1;
        }
        snprintf(png, sizeof png, "%s/%s", cwd, path);
    }
    if (!mkdtemp(dir)) {
        bench_errorf("--plot: cannot make a temporary directory: %s",
                     strerror(errno));
        return -1;
    }
    snprintf(data, sizeof data, "%s/data.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    if (write_data(data, r, n, cases, n_cases, engines, n_engines) != 0 ||
        write_script(script, png, data, r, n, engines, n_engines) != 0 ||
        run_gnuplot(script) != 0) {
        bench_errorf("--plot: the script and data are kept in %s", dir);
        return -1;
    }
    rc = 0;
    unlink(data);
    unlink(script);
    rmdir(dir);
    printf("# plot: %s\n", png);
    return rc;
}
