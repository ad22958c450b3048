/*
 * cmd_elect.c — `cerberus elect [-n | -w MS] [--value V] [--lease MS]
 * [--layout latch|selector] [--on-lost kill|ignore] [-v] NAME -- CMD
 * [ARG...]`: campaign in leader election NAME (DESIGN.md §16) and run CMD
 * while leading, the way `run` runs it under a lock.
 *
 * Sequence: set up signals and the child handling of `run` (before the
 * client starts threads), open the client, then campaign with a cancel
 * that a watcher thread fires on INT, TERM, HUP or QUIT (the campaign
 * keeps its place in line while it waits, so it is one call, not a poll).
 * Elected, CMD runs with CERBERUS_ELECTION_NAME, CERBERUS_LEADER_VALUE and
 * CERBERUS_FENCING_TOKEN in its environment; a term lost meanwhile (the
 * election's lost callback, before another candidate can be elected) stops
 * CMD as `run --on-lost kill` does (SIGTERM, SIGKILL after the grace) and
 * exits 76. When CMD ends the candidate resigns, and the next is elected.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char cerb__cli_elect_usage[] =
    "Usage: cerberus [-c FILE] elect [-n | -w MS] [--value V] [--lease MS]\n"
    "                [--layout latch|selector] [--on-lost kill|ignore] [-v]\n"
    "                NAME -- CMD [ARG...]\n"
    "\n"
    "Campaign in leader election NAME and run CMD while leading; when CMD\n"
    "ends, resign, so the next candidate is elected. Candidates are elected\n"
    "in the order they came, one at a time, across every host that shares\n"
    "the configuration's engines.\n"
    "\n"
    "Options:\n"
    "  -n, --no-wait         exit 75 at once if another candidate leads\n"
    "  -w, --wait MS         campaign at most MS milliseconds, then exit 75\n"
    "                        (default: until elected)\n"
    "  --value V             what this candidate proclaims while leading\n"
    "                        (default: HOSTNAME:PID); `cerberus leader NAME`\n"
    "                        prints it\n"
    "  --lease MS            the term's lease, 100 to 86400000 (default:\n"
    "                        lock.lease_ms); renewed while CMD runs\n"
    "  --layout latch|selector\n"
    "                        ZooKeeper: Curator's LeaderLatch (default) or\n"
    "                        LeaderSelector nodes; other engines have one\n"
    "  --on-lost kill        if the term is lost while CMD runs (another\n"
    "                        candidate may then be elected), send CMD's process\n"
    "                        group SIGTERM (SIGKILL 5 s later) and exit 76\n"
    "                        (default)\n"
    "  --on-lost ignore      report the loss on stderr and let CMD finish\n"
    "  -v, --verbose         report the campaign and the term on stderr\n"
    "\n"
    "CMD runs as with `cerberus run`: its own process group, signals\n"
    "forwarded, with CERBERUS_ELECTION_NAME, CERBERUS_LEADER_VALUE and\n"
    "CERBERUS_FENCING_TOKEN (the term's, strictly greater than any earlier\n"
    "term's) in its environment.\n"
    "\n"
    "Exit status: CMD's exit status, or 128+N if it died of signal N;\n"
    "75 not elected (-n, -w expired, campaign interrupted by a signal);\n"
    "76 the term was lost while CMD ran (--on-lost kill); 69 no engine could\n"
    "be reached, or the engine in use has no leader election; 78\n"
    "configuration error; 126/127 CMD could not be run; 64 usage.\n";

struct elect_opts {
    const char *name, *value;
    char **cmd;
    bool try_only, ignore_lost;
    int64_t wait_ms; /* -1: until elected */
    int64_t lease_ms;
    int layout;
    int verbose;
};

static int parse_args(int argc, char **argv, struct elect_opts *o, bool *help)
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
                return cerb__cli_usage_error("elect", "-w needs a number of milliseconds");
            wait_set = true;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--value", NULL, &v)) != 0) {
            if (m < 0)
                return cerb__cli_usage_error("elect", "--value needs a value");
            if (strlen(v) > CERB_ELECTION_VALUE_MAX)
                return cerb__cli_usage_error("elect", "--value is longer than %d bytes",
                                             CERB_ELECTION_VALUE_MAX);
            o->value = v;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--lease", NULL, &v)) != 0) {
            if (m < 0 || !cerb__cli_parse_ms(v, 100, 86400000, &o->lease_ms))
                return cerb__cli_usage_error("elect", "--lease takes 100..86400000 milliseconds");
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--layout", NULL, &v)) != 0) {
            if (m > 0 && strcmp(v, "latch") == 0)
                o->layout = CERB_ELECTION_LAYOUT_LATCH;
            else if (m > 0 && strcmp(v, "selector") == 0)
                o->layout = CERB_ELECTION_LAYOUT_SELECTOR;
            else
                return cerb__cli_usage_error("elect", "--layout takes latch or selector");
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--on-lost", NULL, &v)) != 0) {
            if (m > 0 && strcmp(v, "kill") == 0)
                o->ignore_lost = false;
            else if (m > 0 && strcmp(v, "ignore") == 0)
                o->ignore_lost = true;
            else
                return cerb__cli_usage_error("elect", "--on-lost takes kill or ignore");
        } else if (a[0] == '-' && a[1] != '\0') {
            return cerb__cli_usage_error("elect", "unknown option '%s'", a);
        } else {
            break;
        }
    }
    if (o->try_only && wait_set)
        return cerb__cli_usage_error("elect", "-n and -w exclude each other");
    if (i >= argc)
        return cerb__cli_usage_error("elect", "NAME is missing");
    o->name = argv[i++];
    if (!cerb__cli_name_ok(o->name))
        return cerb__cli_usage_error("elect", "bad election name (1-255 bytes, no control "
                                              "characters)");
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    if (i >= argc)
        return cerb__cli_usage_error("elect", "CMD is missing (NAME -- CMD [ARG...])");
    o->cmd = argv + i;
    return 0;
}

int cerb__cli_elect_parse(int argc, char **argv)
{
    struct elect_opts o;
    bool help = false;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_elect_usage, stdout);
        return CLI_EXIT_OK;
    }
    return rc ? rc : -1;
}

/* The election's lost callback: a library thread; the child code's flag
 * and byte, nothing more. */
static void on_lost(cerb_election *e, void *ud)
{
    (void)e;
    cerb__cli_child_lost(ud);
}

/* Fires the campaign's cancel on a signal that abandons a wait. */
struct watcher {
    struct cerb__cli_child *ch;
    cerb_cancel *cancel;
    atomic_int stop, sig;
};

static void *watch(void *p)
{
    struct watcher *w = p;
    while (!atomic_load(&w->stop)) {
        int sig = cerb__cli_child_wait_signal(w->ch, 100); /* looks at stop between */
        if (sig) {
            atomic_store(&w->sig, sig);
            cerb_cancel_fire(w->cancel);
            break;
        }
    }
    return NULL;
}

static cerb_status campaign(cerb_election *e, struct cerb__cli_child *ch,
                            const struct elect_opts *o, const char *value, int *sig)
{
    cerb_cancel *k = NULL;
    cerb_status st = cerb_cancel_new(&k);
    if (st != CERB_OK)
        return st;
    struct watcher w = {ch, k, 0, 0};
    pthread_t t;
    bool watching = !o->try_only && pthread_create(&t, NULL, watch, &w) == 0;
    st = cerb_election_campaign(e, value, strlen(value), o->try_only ? 0 : o->wait_ms, k);
    if (watching) {
        atomic_store(&w.stop, 1);
        pthread_join(t, NULL);
    }
    *sig = atomic_load(&w.sig);
    cerb_cancel_free(k);
    return st;
}

int cerb__cli_elect(const struct cerb__cli *cli, int argc, char **argv)
{
    struct elect_opts o;
    struct cerb__cli_child *ch = NULL;
    cerb_client *client = NULL;
    cerb_election *e = NULL;
    char host[256], dflt[300];
    bool help = false;
    int rc;

    memset(&o, 0, sizeof o);
    rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_elect_usage, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    o.verbose += cli->verbose;
    if (!o.value) {
        if (gethostname(host, sizeof host) != 0)
            snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        snprintf(dflt, sizeof dflt, "%s:%ld", host, (long)getpid());
        o.value = dflt;
    }
    /* Before any thread or descriptor of the library exists. */
    rc = cerb__cli_child_prepare("elect", &ch);
    if (rc)
        return rc;
    rc = cerb__cli_open_client(cli, &client);
    if (rc)
        goto out;
    cerb_election_opts eo = CERB_ELECTION_OPTS_INIT;
    eo.lease_ms = o.lease_ms;
    eo.layout = o.layout;
    cerb_status st = cerb_election_new(client, o.name, &eo, &e);
    if (st != CERB_OK) {
        cerb__cli_error("elect: %s", cerb_last_error());
        rc = cerb__cli_exit_code(st);
        goto out;
    }
    cerb__cli_child_on_lost(ch, o.name, !o.ignore_lost);
    cerb_election_on_lost(e, on_lost, ch);
    if (o.verbose)
        cerb__cli_error("elect: %s: campaigning as \"%s\"", o.name, o.value);
    int sig = 0;
    st = campaign(e, ch, &o, o.value, &sig);
    switch (st) {
    case CERB_OK:
        break;
    case CERB_BUSY:
    case CERB_TIMEOUT:
    case CERB_INTERRUPTED:
        if (o.verbose || sig)
            cerb__cli_error("elect: %s: not elected (%s)", o.name,
                            sig ? "interrupted by a signal" : cerb_status_name(st));
        rc = CLI_EXIT_NOT_OBTAINED;
        goto out;
    default:
        cerb__cli_error("elect: %s: %s", o.name, cerb_last_error());
        rc = cerb__cli_exit_code(st);
        goto out;
    }
    uint64_t fence = cerb_election_fencing_token(e);
    if (o.verbose)
        cerb__cli_error("elect: %s: elected (fencing token %" PRIu64 "); running CMD", o.name,
                        fence);
    if (cerb_election_state(e) == CERB_LOCK_LOST && !o.ignore_lost) {
        cerb__cli_error("elect: %s: the term was lost before CMD started; CMD not run", o.name);
        rc = CLI_EXIT_LOST;
        goto out;
    }
    char *env[3];
    size_t nenv = 0;
    bool oom = false;
    size_t n1 = strlen(o.name) + 32, n2 = strlen(o.value) + 32;
    if ((env[nenv] = malloc(n1)) != NULL)
        snprintf(env[nenv++], n1, "CERBERUS_ELECTION_NAME=%s", o.name);
    else
        oom = true;
    if ((env[nenv] = malloc(n2)) != NULL)
        snprintf(env[nenv++], n2, "CERBERUS_LEADER_VALUE=%s", o.value);
    else
        oom = true;
    if ((env[nenv] = malloc(48)) != NULL)
        snprintf(env[nenv++], 48, "CERBERUS_FENCING_TOKEN=%" PRIu64, fence);
    else
        oom = true;
    if (oom) {
        cerb__cli_error("elect: out of memory");
        rc = CLI_EXIT_OSERR;
    } else {
        rc = cerb__cli_child_run_env(ch, o.cmd, env, nenv, o.verbose);
    }
    for (size_t i = 0; i < nenv; i++)
        free(env[i]);
    bool lost = cerb__cli_child_was_lost(ch);
    st = cerb_election_resign(e);
    if (st == CERB_LOST || lost) {
        cerb__cli_error("elect: %s: the term was lost while CMD ran", o.name);
        if (!o.ignore_lost)
            rc = CLI_EXIT_LOST;
    } else if (st != CERB_OK && st != CERB_NOT_OWNER) {
        cerb__cli_error("elect: %s: resign not confirmed (%s); the lease ends the term", o.name,
                        cerb_last_error());
    } else if (o.verbose) {
        cerb__cli_error("elect: %s: resigned", o.name);
    }
out:
    cerb_election_free(e);
    cerb_client_close(client);
    cerb__cli_child_free(ch);
    return rc;
}
