/*
 * cmd_once.c — `cerberus once [-n | -w MS] [--on-lost kill|ignore]
 * [--keep DURATION] [--running MS] SCOPE KEY -- CMD [ARG...]`: run CMD only if the operation KEY of SCOPE has
 * not already succeeded (DESIGN.md §11), the "do this once per KEY" of
 * scripts and cron jobs.
 *
 * Sequence: set up signals and the child handling of `run` (before the
 * client starts threads), open the client, then cerb_guard_begin:
 *  - DUPLICATE: a line on stderr, exit 0, CMD not run;
 *  - BUSY: another attempt is running. By default wait like `run` (begin
 *    again with a growing back-off, 50 ms up to 1 s, until it succeeded —
 *    DUPLICATE — or failed — OK, we run); -n exits 75 at once, -w MS after
 *    MS. INT, TERM, HUP or QUIT during the wait exit 75. The guard has no
 *    server-side wait, so this is a bounded poll; the first answer after the
 *    other attempt ends is at most one back-off late.
 *  - OK: run CMD as `run` does (its own process group, signals forwarded),
 *    the claim renewed meanwhile by the library; then finish — success when
 *    CMD exits 0 (kept for --keep, default guard.keep_ms), failure (record
 *    deleted, a retry may run at once) otherwise — and exit with CMD's
 *    status. A finish that finds the claim lost (CMD ran past it without a
 *    renewal reaching the server and another attempt took over) is reported
 *    and gives 76 when CMD had succeeded, as its success was not recorded.
 *    A claim lost while CMD runs (cerb_guard_on_lost: its deadline passed
 *    unrenewed, or the server said it is gone, so another host may begin
 *    and run CMD too) is acted on at once as `run` acts on a lost lock:
 *    --on-lost kill (default) stops CMD and exits 76 (the loss comes at the
 *    claim's conservative deadline, before the server lets the record go:
 *    a CMD that stops on SIGTERM is gone before a second host can begin;
 *    one that ignores it overlaps for up to the SIGKILL grace); a claim
 *    already lost when begin returns starts no CMD; --on-lost ignore
 *    reports it and lets CMD go on. 76 is kept back when CMD succeeded and
 *    its success was recorded all the same.
 *  - UNAVAILABLE (guard.on_unavailable = "refuse"): 69. With "allow" the
 *    library answers OK degraded: a warning, and CMD runs unprotected.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

const char cerb__cli_once_usage[] =
    "Usage: cerberus [-c FILE] once [-n | -w MS] [--on-lost kill|ignore]\n"
    "                [--keep DURATION] [--running MS] [-v] SCOPE KEY -- CMD [ARG...]\n"
    "\n"
    "Run CMD only if operation KEY of SCOPE has not already succeeded within\n"
    "the keep time, across every host that shares the configuration's\n"
    "engines (the idempotency guard). A success (CMD exits 0) is recorded;\n"
    "a failure is forgotten at once, so the next `once` runs CMD again.\n"
    "\n"
    "Options:\n"
    "  -n, --no-wait         exit 75 at once if another attempt is running\n"
    "  -w, --wait MS         wait at most MS milliseconds for a running\n"
    "                        attempt to end, then exit 75 (default: wait)\n"
    "  --on-lost kill        if the attempt's claim is lost while CMD runs\n"
    "                        (another host may then run CMD too), send CMD's\n"
    "                        process group SIGTERM (SIGKILL 5 s later) and\n"
    "                        exit 76 (default)\n"
    "  --on-lost ignore      report the loss on stderr and let CMD finish\n"
    "  --keep DURATION       how long a success keeps CMD from running again:\n"
    "                        N (ms), Nms, Ns, Nm, Nh, Nd, or \"forever\"\n"
    "                        (default: guard.keep_ms of the configuration)\n"
    "  --running MS          the attempt's claim, renewed while CMD runs; it\n"
    "                        bounds only a crashed cerberus (default:\n"
    "                        guard.running_ms)\n"
    "  -v, --verbose         report the attempt and its outcome on stderr\n"
    "\n"
    "SCOPE follows lock-name rules (1-255 bytes, no control characters);\n"
    "KEY is any text. CMD runs as with `cerberus run`: its own process\n"
    "group, signals forwarded. Without a configuration file records live in\n"
    "this process only (the \"local\" engine), which remembers nothing\n"
    "between runs unless local.dir is set.\n"
    "\n"
    "Exit status: 0 when KEY already succeeded (a line on stderr, CMD not\n"
    "run); else CMD's exit status, or 128+N if it died of signal N;\n"
    "75 another attempt was running (-n, -w expired, wait interrupted);\n"
    "76 the attempt's claim was lost while CMD ran (--on-lost kill), or CMD\n"
    "succeeded but its claim had been lost (not recorded);\n"
    "69 no engine could tell; 78 configuration error; 126/127 CMD could\n"
    "not be run; 64 usage.\n";

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000

struct once_opts {
    const char *scope, *key;
    char **cmd;
    bool try_only;
    int64_t wait_ms;    /* -1: until the other attempt ends */
    int64_t keep_ms;    /* 0: config; -1 forever */
    int64_t running_ms; /* 0: config */
    bool ignore_lost;   /* --on-lost ignore */
    int verbose;
};

/* DURATION: digits with an optional unit (ms, s, m, h, d; none = ms), or
 * "forever" (-1). At least 1 ms, at most a year. */
static bool parse_duration(const char *s, int64_t *out)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000},
                 {"d", 86400000}};
    char *end;
    if (strcmp(s, "forever") == 0) {
        *out = -1;
        return true;
    }
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno)
        return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) != 0)
            continue;
        if (v < 1 || v > INT64_C(31536000000) / units[i].ms)
            return false;
        *out = (int64_t)v * units[i].ms;
        return true;
    }
    return false;
}

static int parse_args(int argc, char **argv, struct once_opts *o, bool *help)
{
    const char *v;
    bool wait_set = false;
    int i, m;

    o->wait_ms = -1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (cerb__cli_is_help(a)) {
            *help = true;
            return 0;
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--no-wait") == 0) {
            o->try_only = true;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->verbose++;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--wait", "-w", &v)) != 0) {
            if (m < 0 || !cerb__cli_parse_ms(v, 0, INT64_MAX / 2, &o->wait_ms))
                return cerb__cli_usage_error("once", "-w needs a number of milliseconds");
            wait_set = true;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--on-lost", NULL, &v)) != 0) {
            if (m > 0 && strcmp(v, "kill") == 0)
                o->ignore_lost = false;
            else if (m > 0 && strcmp(v, "ignore") == 0)
                o->ignore_lost = true;
            else
                return cerb__cli_usage_error("once", "--on-lost takes kill or ignore");
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--keep", NULL, &v)) != 0) {
            if (m < 0 || !parse_duration(v, &o->keep_ms))
                return cerb__cli_usage_error("once", "--keep takes a duration (e.g. 500, 30s, "
                                                     "12h, 7d) up to a year, or \"forever\"");
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--running", NULL, &v)) != 0) {
            if (m < 0 || !cerb__cli_parse_ms(v, 100, 86400000, &o->running_ms))
                return cerb__cli_usage_error("once", "--running takes 100..86400000 milliseconds");
        } else if (a[0] == '-' && a[1] != '\0') {
            return cerb__cli_usage_error("once", "unknown option '%s'", a);
        } else {
            break;
        }
    }
    if (o->try_only && wait_set)
        return cerb__cli_usage_error("once", "-n and -w exclude each other");
    if (i >= argc)
        return cerb__cli_usage_error("once", "SCOPE is missing");
    o->scope = argv[i++];
    if (!cerb__cli_name_ok(o->scope))
        return cerb__cli_usage_error("once", "bad scope (1-255 bytes, no control characters)");
    if (i >= argc || strcmp(argv[i], "--") == 0)
        return cerb__cli_usage_error("once", "KEY is missing (SCOPE KEY -- CMD [ARG...])");
    o->key = argv[i++];
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    if (i >= argc)
        return cerb__cli_usage_error("once", "CMD is missing (SCOPE KEY -- CMD [ARG...])");
    o->cmd = argv + i;
    return 0;
}

int cerb__cli_once_parse(int argc, char **argv)
{
    struct once_opts o;
    bool help = false;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_once_usage, stdout);
        return CLI_EXIT_OK;
    }
    return rc ? rc : -1;
}

/* The guard's lost callback: a library thread; the child code's flag and
 * byte, nothing more. */
static void on_lost(cerb_guard *g, void *ud)
{
    (void)g;
    cerb__cli_child_lost(ud);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* begin, waiting while another attempt runs (as -n/-w say). Returns the
 * status, or CERB_INTERRUPTED when a signal abandoned the wait. */
static cerb_status begin(cerb_client *c, struct cerb__cli_child *ch, const struct once_opts *o,
                         cerb_guard **g)
{
    cerb_guard_opts go = CERB_GUARD_OPTS_INIT;
    go.keep_ms = o->keep_ms;
    go.running_ms = o->running_ms;
    int64_t end = o->wait_ms >= 0 ? now_ms() + o->wait_ms : INT64_MAX;
    int64_t backoff = BACKOFF_MIN_MS;
    for (;;) {
        cerb_status st = cerb_guard_begin(c, o->scope, o->key, strlen(o->key), &go, g);
        if (st != CERB_BUSY || o->try_only)
            return st;
        int64_t left = end - now_ms();
        if (left <= 0)
            return CERB_BUSY;
        if (o->verbose && backoff == BACKOFF_MIN_MS)
            cerb__cli_error("once: %s: another attempt is running; waiting", o->scope);
        int sig = cerb__cli_child_wait_signal(ch, backoff < left ? backoff : left);
        if (sig) {
            if (o->verbose)
                cerb__cli_error("once: %s: signal %d while waiting; CMD not run", o->scope, sig);
            return CERB_INTERRUPTED;
        }
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
}

int cerb__cli_once(const struct cerb__cli *cli, int argc, char **argv)
{
    struct once_opts o;
    struct cerb__cli_child *ch = NULL;
    cerb_client *client = NULL;
    cerb_guard *g = NULL;
    bool help = false;
    int rc;

    memset(&o, 0, sizeof o);
    rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_once_usage, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    o.verbose += cli->verbose;
    /* Before any thread or descriptor of the library exists. */
    rc = cerb__cli_child_prepare("once", &ch);
    if (rc)
        return rc;
    rc = cerb__cli_open_client(cli, &client);
    if (rc)
        goto out;

    cerb_status st = begin(client, ch, &o, &g);
    switch (st) {
    case CERB_DUPLICATE:
        cerb__cli_error("once: %s %s already succeeded; CMD not run", o.scope, o.key);
        rc = CLI_EXIT_OK;
        goto out;
    case CERB_OK:
        break;
    case CERB_BUSY:
    case CERB_INTERRUPTED:
        if (o.verbose)
            cerb__cli_error("once: %s %s: another attempt is running; CMD not run", o.scope,
                            o.key);
        rc = CLI_EXIT_NOT_OBTAINED;
        goto out;
    default:
        cerb__cli_error("once: %s: %s", o.scope, cerb_last_error());
        rc = cerb__cli_exit_code(st);
        goto out;
    }
    if (cerb_guard_degraded(g))
        cerb__cli_error("once: %s %s: no engine could tell whether it already ran; running "
                        "CMD unprotected (guard.on_unavailable = \"allow\")", o.scope, o.key);
    else if (o.verbose)
        cerb__cli_error("once: %s %s: running CMD", o.scope, o.key);

    char what[600];
    snprintf(what, sizeof what, "%s %s", o.scope, o.key);
    cerb__cli_child_on_lost(ch, what, !o.ignore_lost);
    cerb_guard_on_lost(g, on_lost, ch);
    if (cerb_guard_state(g) == CERB_LOCK_LOST && !o.ignore_lost) {
        /* Lost already (a claim lapsed during begin): another host may be
         * running CMD; do not start it. */
        cerb__cli_error("once: %s %s: the attempt's claim was lost before CMD started; CMD not "
                        "run", o.scope, o.key);
        rc = CLI_EXIT_LOST;
        goto out;
    }
    rc = cerb__cli_child_run(ch, o.cmd, o.verbose);
    bool lost = cerb__cli_child_was_lost(ch);
    st = cerb_guard_finish(g, rc == 0, NULL, 0);
    /* A success the engine did not confirm leaves the attempt open (its
     * claim renewed): try again, a few times, over about two seconds. */
    for (int tries = 0; rc == 0 && st != CERB_OK && st != CERB_LOST && st != CERB_EINVAL &&
                        tries < 4;
         tries++) {
        struct timespec nap = {0, (long)(250 + 250 * tries) * 1000000L};
        nanosleep(&nap, NULL);
        st = cerb_guard_finish(g, 1, NULL, 0);
    }
    if (st == CERB_LOST) {
        cerb__cli_error("once: %s %s: the attempt's claim was lost while CMD ran (%s)%s",
                        o.scope, o.key, cerb_last_error(),
                        rc == 0 ? "; its success was not recorded" : "");
        if (rc == 0)
            rc = CLI_EXIT_LOST;
    } else if (lost && rc == 0) {
        /* Told LOST, yet nobody took the record over: the success landed. */
        cerb__cli_error("once: %s %s: the claim had passed its deadline, but the success was "
                        "recorded (no other attempt took it over)", o.scope, o.key);
    } else if (st != CERB_OK) {
        cerb__cli_error("once: %s %s: the outcome was not recorded (%s)", o.scope, o.key,
                        cerb_last_error());
    } else if (o.verbose) {
        cerb__cli_error("once: %s %s: %s", o.scope, o.key,
                        rc == 0 ? "succeeded (recorded)" : "failed (forgotten: a retry may run)");
    }

    /* Killed for a loss, or ended while told of one: 76, unless CMD
     * succeeded and its success was recorded (nobody took the record). */
    if (lost && !o.ignore_lost && !(rc == 0 && st == CERB_OK))
        rc = CLI_EXIT_LOST;

out:
    cerb_guard_free(g);
    cerb_client_close(client);
    cerb__cli_child_free(ch);
    return rc;
}
