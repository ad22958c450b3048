/*
 * bench.c — the `cerberus-bench` command: parse the command line, decide
 * which engines to measure and how to reach them, run the scenarios
 * (scenarios.c) and print the report (report.c).
 *
 *   cerberus-bench [-c FILE] [--engine E|all] [--scenario S[,S...]|all]
 *                  [--threads N[,N...]] [--duration S] [--waiters N]
 *                  [--locks M] [--lease MS] [--port P] [--redis-port P]
 *                  [--zk-port P] [--etcd-port P] [--pg-port P] [--mysql-port P]
 *                  [--memcached-port P] [--redlock-port P]
 *                  [--cli PATH] [--peers] [--permits N[,N...]]
 *                  [--candidates K] [--rounds R]
 *                  [--json FILE] [--plot FILE.png]
 *
 * Scenarios: uncontended, contended, handoff, herd, many, guard (the
 * idempotency guard: rows "guard" and "guard-dup") (scenarios.c and
 * scenario_<name>.c), and failover (failover.c), which needs commands to
 * kill and restore a server and so is not part of `all`; nor is switch
 * (scenario_switch.c: the steady state after `cerberus switch`), which
 * needs a server for every engine of its file; nor is serve
 * (scenario_serve.c: `cerberus serve`, in this process, against the
 * library in-process, and its blocking hand-off against Dapr's
 * try-lock-and-poll); nor are the coordination primitives' scenarios
 * (issue 28): semaphore and rwlock (scenario_prims.c) and elect-failover
 * (scenario_elect.c: leader processes killed, the time to the next
 * leader; its candidates are this program re-executed with
 * --elect-candidate), which need engines with those primitives. For each
 * engine the chosen
 * scenarios run in that order; each row goes to the table as soon as it is
 * measured.
 *
 * --peers (peers.c) runs other lock libraries on the same servers in the
 * same run — redis-py on redis, Curator and kazoo on ZooKeeper,
 * python-etcd3 and etcdctl on etcd — through the scripts in bench/peers/,
 * and puts a row for each right under Cerberus's uncontended and handoff
 * rows, with Cerberus's figure over the peer's; the primitives' rows have
 * theirs too (Curator's recipes, npm redis-semaphore, a redis-py election
 * loop, `etcdctl elect`, etcd's election API), or a "no peer" row. A peer that is not
 * installed is a "skipped" row, never a failure of the bench.
 *
 * Without -c the bench writes its own configuration: Redis on 127.0.0.1,
 * port --port (26379, the test server's), with the default pool (it opens
 * as many connections as threads call at once); `--engine local` gives
 * the in-process engine instead, `--engine zk`, `etcd`, `pg`, `mysql` or
 * `memcached` that server (22181, 22379, 25432, 23306, 21211; pg and mysql
 * as the test servers' user and database cerb, with the default pool).
 * memcached has no guard (its guard row says "skipped") and no fencing. The switch scenario needs every engine of the file it
 * switches, so with it the built-in configuration lists redis, zk and etcd
 * on 127.0.0.1, each on its own port option (--redis-port, --zk-port,
 * --etcd-port; --port still names the port of the --engine measured), and
 * `--engine all` means the three. With
 * -c the file names the engines (`--engine all` is every one of them, in
 * configuration order) and their servers. The file is read through the
 * library's own parser, so the bench and the library can never disagree on
 * where the server is: the raw ceiling needs the same host, port and
 * credentials as the engine.
 *
 * Exit status: 0 when every scenario ran; 1 when one failed (server not
 * reachable, lock error); 2 for a bad command line or configuration; 3 when a
 * phase hung past its grace period.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h" /* the library's configuration parser (see above) */
#include "scenarios.h"

#define MAX_THREAD_COUNTS 16
#define MAX_THREADS 1024
#define DEFAULT_PORT 26379

#define DEFAULT_HANDOFF_WAITERS 8
#define DEFAULT_HERD_WAITERS 100
#define DEFAULT_CONTENDED_THREADS 8
#define DEFAULT_LOCKS 10000
#define DEFAULT_MANY_LEASE_MS 3000
#define DEFAULT_RWLOCK_THREADS 8
#define DEFAULT_CANDIDATES 3
#define DEFAULT_ELECT_ROUNDS 5
#define MAX_PERMIT_COUNTS 8

/* Scenario bits, in the order they run. */
enum {
    SC_UNCONTENDED = 1 << 0,
    SC_CONTENDED = 1 << 1,
    SC_HANDOFF = 1 << 2,
    SC_HERD = 1 << 3,
    SC_MANY = 1 << 4,
    SC_FAILOVER = 1 << 5,
    SC_GUARD = 1 << 6,
    SC_SWITCH = 1 << 7,
    SC_SERVE = 1 << 8,
    SC_SEMAPHORE = 1 << 9,
    SC_RWLOCK = 1 << 10,
    SC_ELECT_FAILOVER = 1 << 11,
    SC_LAST = SC_ELECT_FAILOVER,
    SC_ALL = SC_UNCONTENDED | SC_CONTENDED | SC_HANDOFF | SC_HERD | SC_MANY |
             SC_GUARD,
};

/* Default ports of the built-in configuration: the test servers'. */
#define DEFAULT_ZK_PORT 22181
#define DEFAULT_ETCD_PORT 22379
#define DEFAULT_PG_PORT 25432
#define DEFAULT_MYSQL_PORT 23306
#define DEFAULT_MEMCACHED_PORT 21211
/* The first of the three test Redlock masters (DESIGN.md §9: 26411+). */
#define DEFAULT_REDLOCK_PORT 26411
#define REDLOCK_BUILTIN_NODES 3

/* The engines a built-in configuration can name, each with its port
 * option and default port (DESIGN.md §9). A new engine is a row here, a
 * case in builtin_one and its ceiling file. */
static const struct {
    const char *name;
    const char *opt;
    int port;
} builtin_ports[] = {
    {"redis", "--redis-port", DEFAULT_PORT},
    {"zk", "--zk-port", DEFAULT_ZK_PORT},
    {"etcd", "--etcd-port", DEFAULT_ETCD_PORT},
    {"pg", "--pg-port", DEFAULT_PG_PORT},
    {"mysql", "--mysql-port", DEFAULT_MYSQL_PORT},
    {"memcached", "--memcached-port", DEFAULT_MEMCACHED_PORT},
    /* The redis engine in Redlock mode over three masters, P to P+2. */
    {"redlock", "--redlock-port", DEFAULT_REDLOCK_PORT},
};
#define N_BUILTIN_PORTS (sizeof builtin_ports / sizeof builtin_ports[0])

static const struct {
    const char *name;
    int bit;
} scenario_names[] = {
    {"uncontended", SC_UNCONTENDED}, {"contended", SC_CONTENDED},
    {"handoff", SC_HANDOFF},         {"herd", SC_HERD},
    {"many", SC_MANY},               {"failover", SC_FAILOVER},
    {"guard", SC_GUARD},             {"switch", SC_SWITCH},
    {"serve", SC_SERVE},             {"semaphore", SC_SEMAPHORE},
    {"rwlock", SC_RWLOCK},           {"elect-failover", SC_ELECT_FAILOVER},
    {"all", SC_ALL},
};

/* The engines of the switch scenario's built-in configuration, in order. */
static const char *const builtin_switch_engines[] = {"redis", "zk", "etcd"};

struct cli {
    const char *config_path;
    const char *engine;        /* "all" or a name */
    int scenarios;             /* SC_* bits */
    int threads[MAX_THREAD_COUNTS];
    int n_threads;
    int threads_given;         /* --threads given: contended uses it too */
    int waiters;               /* 0 = the scenarios' defaults */
    int locks;
    int lease_ms;
    double duration_s;
    int port;
    int port_set; /* --port given: overrides the engine's default port */
    int eport[N_BUILTIN_PORTS]; /* --<e>-port (builtin_ports); 0 = not given */
    const char *cli;           /* --cli: the `cerberus` command (switch) */
    char *switch_text;         /* switch without -c: the built-in file, owned */
    const char *json_path;
    const char *plot_path;
    int peers;                 /* --peers */
    int permits[MAX_PERMIT_COUNTS]; /* semaphore: one row per limit */
    int n_permits;
    int candidates;            /* elect-failover */
    int rounds;                /* elect-failover */
    int lease_given;           /* --lease given: elect-failover's lease too */
    struct bench_fo_opts fo;
};

static void usage(FILE *f)
{
    fprintf(f,
        "usage: cerberus-bench [-c FILE] [--engine E|all] "
        "[--scenario S[,S...]|all]\n"
        "                      [--threads N[,N...]] [--duration S] "
        "[--waiters N] [--locks M]\n"
        "                      [--lease MS] [--port P] [--redis-port P] "
        "[--zk-port P]\n"
        "                      [--etcd-port P] [--pg-port P] [--mysql-port P]\n"
        "                      [--memcached-port P] [--redlock-port P]\n"
        "                      [--cli PATH] [--peers] [--permits N[,N...]]\n"
        "                      [--candidates K] [--rounds R]\n"
        "                      [--json FILE] [--plot FILE.png]\n"
        "\n"
        "  -c, --config FILE   engines and servers from a Cerberus config file;\n"
        "                      without it: redis on 127.0.0.1:PORT\n"
        "  --engine E|all      engine to measure (default all: every configured one);\n"
        "                      redlock: the redis engine in Redlock mode (rows\n"
        "                      \"redlock\"; with -c, its redis engine when\n"
        "                      redis.mode = \"redlock\")\n"
        "  --scenario S        uncontended, contended, handoff, herd, many, guard,\n"
        "                      switch, serve, semaphore, rwlock, elect-failover,\n"
        "                      failover, or all (default: every one but switch,\n"
        "                      serve, semaphore, rwlock, elect-failover and\n"
        "                      failover); a comma list runs several\n"
        "  --threads N[,N...]  uncontended, guard, switch and serve: worker threads,\n"
        "                      one run per value\n"
        "                      (default 1);\n"
        "                      contended: clients on one name, one run per value\n"
        "                      (default %d); rwlock: clients on one read-write\n"
        "                      lock, 90 %% reads, 10 %% writes (default %d)\n"
        "  --permits N[,N...]  semaphore: a row per limit N, 2N clients looping\n"
        "                      acquire 1 permit + release (default 1,4,16)\n"
        "  --candidates K      elect-failover: candidate processes (default %d)\n"
        "  --rounds R          elect-failover: leaders killed, 1..%d (default %d)\n"
        "  --waiters N         handoff, herd and serve: contending clients, one each\n"
        "                      (default %d for handoff, %d for herd)\n"
        "  --locks M           many: locks held by one client (default %d)\n"
        "  --lease MS          many: their lease, renewed every third (default %d);\n"
        "                      elect-failover: a term's lease (default lock.lease_ms;\n"
        "                      zk and etcd terms end with the session instead)\n"
        "  --duration S        seconds measured per side of each scenario; herd: rounds\n"
        "                      for that long; many: the hold period (default 5)\n"
        "  --port P            without -c: the port of the engine measured (default\n"
        "                      redis %d, zk %d, etcd %d, pg %d, mysql %d,\n"
        "                      memcached %d, redlock %d: its first master of three,\n"
        "                      P..P+2)\n"
        "  --redis-port P, --zk-port P, --etcd-port P, --pg-port P, --mysql-port P,\n"
        "  --memcached-port P, --redlock-port P\n"
        "                      without -c: that engine's port (the switch scenario's\n"
        "                      built-in file lists redis, zk and etcd); pg and mysql\n"
        "                      connect as user cerb to database cerb, as the test\n"
        "                      servers have them\n"
        "  --peers             also run the peers on the same servers, a row each\n"
        "                      under Cerberus's uncontended and handoff rows:\n"
        "                      redis-py (redis), node-redlock (redlock), Curator\n"
        "                      and kazoo (zk), python-etcd3 and etcdctl (etcd);\n"
        "                      semaphore: Curator's\n"
        "                      InterProcessSemaphoreV2 (zk), npm redis-semaphore\n"
        "                      (redis); rwlock: Curator's InterProcessReadWriteLock;\n"
        "                      elect-failover: Curator's LeaderLatch, a redis-py\n"
        "                      Lock loop, `etcdctl elect` and etcd's election API;\n"
        "                      one not installed is a \"skipped\" row, an engine\n"
        "                      with no peer a row \"skipped: no peer\".\n"
        "                      Scripts: $CERB_BENCH_PEERS_DIR\n"
        "                      (default: the source tree's bench/peers); Python\n"
        "                      ones run with $CERB_PEER_PYTHON (/usr/bin/python3)\n"
        "  --json FILE         also write the results as a JSON array\n"
        "  --plot FILE.png     also draw them with gnuplot: ops/s and p50/p99 per\n"
        "                      scenario, engines side by side\n"
        "\n"
        "failover scenario (-c FILE with two or more engines; the first is failed):\n"
        "  --fail-cmd CMD      shell command that kills the primary (e.g. kill -9 ...)\n"
        "  --restore-cmd CMD   shell command that brings it back\n"
        "  --grace0-config F   FILE with failover.switch_grace_ms = 0, measured first\n"
        "  --flap S            then fail/restore the primary for S seconds (default 0)\n"
        "  --flap-period MS    one outage + one recovery (default 2000)\n"
        "  --max-wait MS       longest wait for a grant elsewhere (default 30000)\n"
        "  bench/failover.sh runs it all against test servers.\n"
        "\n"
        "switch scenario (a server for every engine of the file; --engine E or all):\n"
        "  trylock + unlock cycles/s over 16 names per thread on engine E after\n"
        "  `cerberus switch E`, against E alone (a file with engines = (E) only) in\n"
        "  alternating rounds of the same run; the ratio's target (DESIGN 10) is\n"
        "  >= %.1f. The file switched is a copy, in a temporary directory, of -c\n"
        "  FILE (two or more engines; its own lease and timeouts) or of the built-in\n"
        "  one: redis, zk, etcd on the ports above, lock.lease_ms = 1000,\n"
        "  zk.session_timeout_ms = 1000, etcd.session_ttl_s = 2, probes every\n"
        "  100 ms (so the closure records are trusted; the row counts the gate's\n"
        "  questions to the engines left, none once each name was asked). It starts at\n"
        "  active = \"auto\"; its client follows the command's rewrite by reload and\n"
        "  settles for twice the longest a hold lives there (4 s built in) before\n"
        "  the rounds.\n"
        "  Every run on an engine (one per --threads value) and each of its two\n"
        "  clients works in namespaces of its own nested in the file's, with\n"
        "  T = cerb-bench-<pid>-<random>-<n>-sw\n"
        "  (-alone for the alone client): redis.prefix P becomes P + \"T:\", zk.root\n"
        "  /a/b becomes /a/T/b, etcd.prefix P becomes P + \"T/\" (a Redis Cluster\n"
        "  keeps P: it keeps no record). A switch leaves closure records there,\n"
        "  permanent and one per namespace, which would refuse the next engine's\n"
        "  run and later runs; so the namespaces of -c FILE itself are never\n"
        "  written. What a run wrote is removed after it (best effort); when that\n"
        "  fails (a note says so) or the bench is interrupted, it is left there.\n"
        "  --cli PATH          the `cerberus` command that switches (default\n"
        "                      $CERB_BENCH_CLI, else the one built with the bench,\n"
        "                      else cerberus on PATH)\n",
        DEFAULT_CONTENDED_THREADS, DEFAULT_RWLOCK_THREADS, DEFAULT_CANDIDATES,
        BENCH_ELECT_MAX_ROUNDS, DEFAULT_ELECT_ROUNDS, DEFAULT_HANDOFF_WAITERS,
        DEFAULT_HERD_WAITERS, DEFAULT_LOCKS, DEFAULT_MANY_LEASE_MS,
        DEFAULT_PORT, DEFAULT_ZK_PORT, DEFAULT_ETCD_PORT, DEFAULT_PG_PORT,
        DEFAULT_MYSQL_PORT, DEFAULT_MEMCACHED_PORT, DEFAULT_REDLOCK_PORT,
        BENCH_SWITCH_TARGET);
}

/* Parse an integer in [lo, hi]; -1 on error (message printed). */
static int parse_int(const char *opt, const char *s, long lo, long hi,
                     int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        bench_errorf("%s: \"%s\" is not an integer in %ld..%ld", opt, s, lo,
                     hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_threads(const char *s, struct cli *c)
{
    char buf[256];
    if (strlen(s) >= sizeof buf) {
        bench_errorf("--threads: list too long");
        return -1;
    }
    strcpy(buf, s);
    c->n_threads = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (c->n_threads == MAX_THREAD_COUNTS) {
            bench_errorf("--threads: at most %d values", MAX_THREAD_COUNTS);
            return -1;
        }
        if (parse_int("--threads", tok, 1, MAX_THREADS,
                      &c->threads[c->n_threads]) != 0)
            return -1;
        c->n_threads++;
    }
    if (c->n_threads == 0) {
        bench_errorf("--threads: no value");
        return -1;
    }
    return 0;
}

/* A comma list of scenario names into SC_* bits. Returns 0 or -1. */
static int parse_scenarios(const char *s, int *out)
{
    char buf[256];
    if (strlen(s) >= sizeof buf) {
        bench_errorf("--scenario: list too long");
        return -1;
    }
    strcpy(buf, s);
    *out = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t i, n = sizeof scenario_names / sizeof scenario_names[0];
        for (i = 0; i < n; i++)
            if (strcmp(tok, scenario_names[i].name) == 0)
                break;
        if (i == n) {
            bench_errorf("--scenario: unknown scenario \"%s\" (known: "
                         "uncontended, contended, handoff, herd, many, "
                         "guard, switch, serve, semaphore, rwlock, "
                         "elect-failover, failover, all)", tok);
            return -1;
        }
        *out |= scenario_names[i].bit;
    }
    if (*out == 0) {
        bench_errorf("--scenario: no value");
        return -1;
    }
    if ((*out & SC_FAILOVER) && *out != SC_FAILOVER) {
        bench_errorf("--scenario: failover runs on its own (it fails a "
                     "server); run the others separately");
        return -1;
    }
    return 0;
}

/* 0 = parsed, 1 = --help shown, -1 = error (printed). */
static int parse_cli(int argc, char **argv, struct cli *c)
{
    enum { O_ENGINE = 256, O_SCENARIO, O_THREADS, O_DURATION, O_WAITERS,
           O_PORT, O_JSON, O_FAIL, O_RESTORE, O_GRACE0, O_FLAP, O_FLAP_PERIOD, O_MAX_WAIT,
           O_LOCKS, O_LEASE, O_PLOT, O_PEERS, O_CLI, O_PERMITS, O_CANDIDATES, O_ROUNDS,
           O_ENGINE_PORT /* + index in builtin_ports */ };
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"engine", required_argument, NULL, O_ENGINE},
        {"scenario", required_argument, NULL, O_SCENARIO},
        {"threads", required_argument, NULL, O_THREADS},
        {"duration", required_argument, NULL, O_DURATION},
        {"waiters", required_argument, NULL, O_WAITERS},
        {"port", required_argument, NULL, O_PORT},
        {"redis-port", required_argument, NULL, O_ENGINE_PORT + 0},
        {"zk-port", required_argument, NULL, O_ENGINE_PORT + 1},
        {"etcd-port", required_argument, NULL, O_ENGINE_PORT + 2},
        {"pg-port", required_argument, NULL, O_ENGINE_PORT + 3},
        {"mysql-port", required_argument, NULL, O_ENGINE_PORT + 4},
        {"memcached-port", required_argument, NULL, O_ENGINE_PORT + 5},
        {"redlock-port", required_argument, NULL, O_ENGINE_PORT + 6},
        {"cli", required_argument, NULL, O_CLI},
        {"json", required_argument, NULL, O_JSON},
        {"plot", required_argument, NULL, O_PLOT},
        {"peers", no_argument, NULL, O_PEERS},
        {"permits", required_argument, NULL, O_PERMITS},
        {"candidates", required_argument, NULL, O_CANDIDATES},
        {"rounds", required_argument, NULL, O_ROUNDS},
        {"locks", required_argument, NULL, O_LOCKS},
        {"lease", required_argument, NULL, O_LEASE},
        {"fail-cmd", required_argument, NULL, O_FAIL},
        {"restore-cmd", required_argument, NULL, O_RESTORE},
        {"grace0-config", required_argument, NULL, O_GRACE0},
        {"flap", required_argument, NULL, O_FLAP},
        {"flap-period", required_argument, NULL, O_FLAP_PERIOD},
        {"max-wait", required_argument, NULL, O_MAX_WAIT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch, port_given = 0;

    memset(c, 0, sizeof *c);
    c->engine = "all";
    c->scenarios = SC_ALL;
    c->fo.flap_period_ms = 2000;
    c->fo.max_wait_ms = 30000;
    c->threads[0] = 1;
    c->n_threads = 1;
    c->locks = DEFAULT_LOCKS;
    c->lease_ms = DEFAULT_MANY_LEASE_MS;
    c->duration_s = 5.0;
    c->port = DEFAULT_PORT;
    c->permits[0] = 1;
    c->permits[1] = 4;
    c->permits[2] = 16;
    c->n_permits = 3;
    c->candidates = DEFAULT_CANDIDATES;
    c->rounds = DEFAULT_ELECT_ROUNDS;

    while ((ch = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            c->config_path = optarg;
            break;
        case O_ENGINE:
            c->engine = optarg;
            break;
        case O_SCENARIO:
            if (parse_scenarios(optarg, &c->scenarios) != 0)
                return -1;
            break;
        case O_THREADS:
            if (parse_threads(optarg, c) != 0)
                return -1;
            c->threads_given = 1;
            break;
        case O_LOCKS:
            if (parse_int("--locks", optarg, 1, 1000000, &c->locks))
                return -1;
            break;
        case O_LEASE:
            /* The configuration's range for lock.lease_ms. */
            if (parse_int("--lease", optarg, 100, 86400000, &c->lease_ms))
                return -1;
            c->lease_given = 1;
            break;
        case O_PERMITS: {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", optarg);
            c->n_permits = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save)) {
                if (c->n_permits == MAX_PERMIT_COUNTS) {
                    bench_errorf("--permits: at most %d values", MAX_PERMIT_COUNTS);
                    return -1;
                }
                /* 2N clients: N up to half the thread limit. */
                if (parse_int("--permits", tok, 1, MAX_THREADS / 2, &c->permits[c->n_permits]))
                    return -1;
                c->n_permits++;
            }
            if (c->n_permits == 0) {
                bench_errorf("--permits: no value");
                return -1;
            }
            break;
        }
        case O_CANDIDATES:
            if (parse_int("--candidates", optarg, 2, 32, &c->candidates))
                return -1;
            break;
        case O_ROUNDS:
            if (parse_int("--rounds", optarg, 1, BENCH_ELECT_MAX_ROUNDS, &c->rounds))
                return -1;
            break;
        case O_PLOT:
            c->plot_path = optarg;
            break;
        case O_PEERS:
            c->peers = 1;
            break;
        case O_DURATION: {
            char *end;
            errno = 0;
            c->duration_s = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(c->duration_s >= 0.1) ||
                c->duration_s > 86400) {
                bench_errorf("--duration: \"%s\" is not a number of seconds "
                             "in 0.1..86400", optarg);
                return -1;
            }
            break;
        }
        case O_WAITERS:
            if (parse_int("--waiters", optarg, 1, MAX_THREADS, &c->waiters))
                return -1;
            break;
        case O_PORT:
            c->port_set = 1;
            if (parse_int("--port", optarg, 1, 65535, &c->port))
                return -1;
            port_given = 1;
            break;
        case O_CLI:
            c->cli = optarg;
            break;
        case O_JSON:
            c->json_path = optarg;
            break;
        case O_FAIL:
            c->fo.fail_cmd = optarg;
            break;
        case O_RESTORE:
            c->fo.restore_cmd = optarg;
            break;
        case O_GRACE0:
            c->fo.grace0_config = optarg;
            break;
        case O_FLAP:
            if (parse_int("--flap", optarg, 0, 3600, &c->fo.flap_s))
                return -1;
            break;
        case O_FLAP_PERIOD:
            if (parse_int("--flap-period", optarg, 100, 600000, &c->fo.flap_period_ms))
                return -1;
            break;
        case O_MAX_WAIT: {
            int v;
            if (parse_int("--max-wait", optarg, 100, 600000, &v))
                return -1;
            c->fo.max_wait_ms = v;
            break;
        }
        case 'h':
            usage(stdout);
            return 1;
        default:
            if (ch >= O_ENGINE_PORT && ch < O_ENGINE_PORT + (int)N_BUILTIN_PORTS) {
                int k = ch - O_ENGINE_PORT;
                if (parse_int(builtin_ports[k].opt, optarg, 1, 65535, &c->eport[k]))
                    return -1;
                port_given = 1;
                break;
            }
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        bench_errorf("unexpected argument \"%s\"", argv[optind]);
        usage(stderr);
        return -1;
    }
    if (c->peers && c->scenarios == SC_FAILOVER) {
        bench_errorf("--peers: the failover scenario has no peer rows");
        return -1;
    }
    if (port_given && c->config_path) {
        bench_errorf("--port and --<engine>-port apply only without -c (the "
                     "file gives the servers)");
        return -1;
    }
    /* --port names the measured engine's port: with a --<engine>-port for
     * the same engine, one of the two is a mistake. */
    const char *measured = strcmp(c->engine, "all") ? c->engine : "redis";
    for (size_t k = 0; c->port_set && k < N_BUILTIN_PORTS; k++)
        if (c->eport[k] && strcmp(builtin_ports[k].name, measured) == 0) {
            bench_errorf("--port and %s both give the port of %s", builtin_ports[k].opt,
                         measured);
            return -1;
        }
    return 0;
}

static void engine_free(struct bench_engine *e)
{
    cerb__config_free(e->cfg);
    free(e->config_text);
    free(e->redis.host);
    free(e->redis.user);
    free(e->redis.password);
    memset(e, 0, sizeof *e);
}

static char *dup_or_die(const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d) {
        bench_errorf("out of memory");
        exit(1);
    }
    return d;
}

/* Threads one client runs at once: uncontended's, guard's and switch's,
 * and many's acquirers. */
static int max_threads(const struct cli *c)
{
    int m = 1;
    for (int i = 0;
         c->scenarios & (SC_UNCONTENDED | SC_GUARD | SC_SWITCH | SC_SERVE) && i < c->n_threads;
         i++)
        if (c->threads[i] > m)
            m = c->threads[i];
    if (c->scenarios & SC_MANY && m < BENCH_MANY_THREADS)
        m = BENCH_MANY_THREADS;
    return m;
}

/* The port of @engine in the built-in configuration: its own option, else
 * --port when @engine is the one measured (redis for `all`), else the
 * test server's. */
static int builtin_port(const struct cli *c, const char *engine)
{
    int measured = strcmp(c->engine, engine) == 0 ||
                   (strcmp(engine, "redis") == 0 && strcmp(c->engine, "all") == 0);
    for (size_t k = 0; k < N_BUILTIN_PORTS; k++) {
        if (strcmp(builtin_ports[k].name, engine) != 0)
            continue;
        if (c->eport[k])
            return c->eport[k];
        return c->port_set && measured ? c->port : builtin_ports[k].port;
    }
    return c->port; /* not reached: every caller names an engine of the table */
}

/*
 * Engine @want without a file: our own configuration text, with the
 * defaults a user who sets nothing gets (the pool grows to the thread
 * count, as the raw ceiling has one connection per thread). Returns 0, or
 * -1 (printed).
 */
static int builtin_one(const struct cli *c, const char *want, struct bench_engine *e)
{
    char text[512];

    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", want);
    if (strcmp(want, "redis") == 0) {
        /* The default pool: what a user who sets nothing gets. */
        snprintf(text, sizeof text,
                 "engines = (\"redis\");\n"
                 "redis = { host = \"127.0.0.1\"; port = %d; };\n",
                 builtin_port(c, "redis"));
        e->redis.host = dup_or_die("127.0.0.1");
        e->redis.port = builtin_port(c, "redis");
        e->redis.user = dup_or_die("");
        e->redis.password = dup_or_die("");
        e->redis.connect_timeout_ms = 500;
        e->redis.op_timeout_ms = 500;
    } else if (strcmp(want, "redlock") == 0 && !(c->scenarios & SC_SWITCH)) {
        /* The redis engine in Redlock mode over the three test masters,
         * with its defaults (quorum fencing). The engine is "redis"; the
         * rows say "redlock" (bench_engine_label). */
        int p = builtin_port(c, "redlock");
        snprintf(text, sizeof text,
                 "engines = (\"redis\");\n"
                 "redis = { mode = \"redlock\";\n"
                 "  nodes = (\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"); };\n",
                 p, p + 1, p + 2);
        snprintf(e->name, sizeof e->name, "redis");
        e->redis.host = dup_or_die("127.0.0.1");
        e->redis.port = p;
        e->redis.user = dup_or_die("");
        e->redis.password = dup_or_die("");
        e->redis.connect_timeout_ms = 500;
        e->redis.op_timeout_ms = 500;
    } else if (strcmp(want, "zk") == 0) {
        snprintf(text, sizeof text,
                 "engines = (\"zk\");\nzk = { hosts = \"127.0.0.1:%d\"; };\n",
                 builtin_port(c, "zk"));
    } else if (strcmp(want, "etcd") == 0) {
        snprintf(text, sizeof text,
                 "engines = (\"etcd\");\netcd = { endpoints = (\"http://127.0.0.1:%d\"); };\n",
                 builtin_port(c, "etcd"));
    } else if (strcmp(want, "pg") == 0 && !(c->scenarios & SC_SWITCH)) {
        /* The test server's role and database (scripts/servers.d/pg.sh);
         * the tables are `cerberus init`'s, in the default schema. */
        snprintf(text, sizeof text,
                 "engines = (\"pg\");\n"
                 "pg = { conninfo = \"host=127.0.0.1 port=%d dbname=cerb user=cerb\"; };\n",
                 builtin_port(c, "pg"));
    } else if (strcmp(want, "mysql") == 0 && !(c->scenarios & SC_SWITCH)) {
        /* The test server's user and database (scripts/servers.d/mysql.sh);
         * the tables are `cerberus init`'s. */
        snprintf(text, sizeof text,
                 "engines = (\"mysql\");\n"
                 "mysql = { host = \"127.0.0.1\"; port = %d; user = \"cerb\"; "
                 "database = \"cerb\"; };\n",
                 builtin_port(c, "mysql"));
    } else if (strcmp(want, "memcached") == 0 && !(c->scenarios & SC_SWITCH)) {
        /* The test server (scripts/servers.d/memcached.sh), no prefix. */
        snprintf(text, sizeof text,
                 "engines = (\"memcached\");\n"
                 "memcached = { servers = (\"127.0.0.1:%d\"); };\n",
                 builtin_port(c, "memcached"));
    } else if (strcmp(want, "local") == 0 && !(c->scenarios & SC_SWITCH)) {
        snprintf(text, sizeof text, "engines = (\"local\");\n");
    } else {
        bench_errorf("--engine %s needs a configuration file (-c); without "
                     "one the bench knows %s", want,
                     c->scenarios & SC_SWITCH ? "redis, zk and etcd (the switch scenario's "
                                                "built-in file)"
                                              : "redis, redlock, zk, etcd, pg, mysql, "
                                                "memcached and local");
        return -1;
    }
    e->config_text = dup_or_die(text);
    if (cerb__config_from_string(text, &e->cfg) != CERB_OK) {
        bench_errorf("%s", cerb_last_error());
        return -1;
    }
    return 0;
}

/*
 * Engines without a file: the one --engine names (redis for `all`); with
 * the switch scenario, redis, zk and etcd, which its built-in file lists
 * (`all` is the three). Returns the count, or -1 (printed, nothing left
 * allocated).
 */
static int engines_builtin(const struct cli *c, struct bench_engine *out)
{
    if (!(c->scenarios & SC_SWITCH)) {
        const char *want = strcmp(c->engine, "all") == 0 ? "redis" : c->engine;
        if (builtin_one(c, want, &out[0]) != 0) {
            engine_free(&out[0]);
            return -1;
        }
        return 1;
    }
    int n = 0;
    for (size_t i = 0; i < sizeof builtin_switch_engines / sizeof builtin_switch_engines[0]; i++) {
        const char *name = builtin_switch_engines[i];
        if (strcmp(c->engine, "all") != 0 && strcmp(c->engine, name) != 0)
            continue;
        if (builtin_one(c, name, &out[n]) != 0) {
            for (int k = 0; k <= n; k++)
                engine_free(&out[k]);
            return -1;
        }
        n++;
    }
    if (n == 0 && builtin_one(c, c->engine, &out[0]) != 0) /* prints why */
        engine_free(&out[0]);
    return n > 0 ? n : -1;
}

/*
 * The switch scenario's built-in file: the three engines on their ports
 * (builtin_port), active = "auto", and lifetimes as short as the schema
 * and the test servers allow (zk's tickTime of 500 ms permits 1 s
 * sessions; etcd's least TTL is 2 s), so that settling after the switch —
 * twice the longest of them — takes 4 s. malloc'd; exits when out of
 * memory.
 */
static char *builtin_switch_text(const struct cli *c)
{
    char text[1024];
    snprintf(text, sizeof text,
             "# cerberus-bench's switch scenario: the file `cerberus switch` rewrites.\n"
             "engines = (\"redis\", \"zk\", \"etcd\");\n"
             "active = \"auto\";\n"
             "epoch = 1;\n"
             "lock = { lease_ms = 1000; };\n"
             /* Probes often enough for the closure records to be trusted
              * with this short lease: half of it (500 ms) covers two
              * intervals and a timeout (300 ms). With the default 250 ms
              * probes the full gate would be measured instead. */
             "failover = { probe_interval_ms = 100; probe_timeout_ms = 100; };\n"
             "redis = { host = \"127.0.0.1\"; port = %d; };\n"
             "zk = { hosts = \"127.0.0.1:%d\"; session_timeout_ms = 1000; };\n"
             "etcd = { endpoints = (\"http://127.0.0.1:%d\"); session_ttl_s = 2; };\n",
             builtin_port(c, "redis"), builtin_port(c, "zk"), builtin_port(c, "etcd"));
    return dup_or_die(text);
}

/* The `cerberus` command the switch scenario runs: --cli, else
 * $CERB_BENCH_CLI, else the one built with the bench when it is there,
 * else `cerberus` on PATH. */
static const char *switch_cli(const struct cli *c)
{
    const char *env = getenv("CERB_BENCH_CLI");
    if (c->cli)
        return c->cli;
    if (env && *env)
        return env;
#ifdef CERB_BENCH_CLI_DEFAULT
    if (access(CERB_BENCH_CLI_DEFAULT, X_OK) == 0)
        return CERB_BENCH_CLI_DEFAULT;
#endif
    return "cerberus";
}

/* Engines from a configuration file, validated by the library's parser. */
static int engines_from_file(const struct cli *c, struct bench_engine *out)
{
    struct cerb_config *cfg = NULL;
    int n = 0;

    if (cerb__config_from_file(c->config_path, &cfg) != CERB_OK) {
        bench_errorf("%s", cerb_last_error());
        return -1;
    }
    for (size_t i = 0; i < cfg->n_engines; i++) {
        const char *name = cfg->engines[i];
        /* "redlock" names the redis engine when it is in Redlock mode. */
        int redlock = strcmp(name, "redis") == 0 && cfg->redis.mode == CERB_REDIS_REDLOCK;
        if (strcmp(c->engine, "all") && strcmp(c->engine, name) &&
            !(redlock && strcmp(c->engine, "redlock") == 0))
            continue;
        struct bench_engine *e = &out[n++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", name);
        e->config_path = c->config_path;
        if (cerb__config_from_file(c->config_path, &e->cfg) != CERB_OK) {
            bench_errorf("%s", cerb_last_error());
            cerb__config_free(cfg);
            return -1;
        }
        if (strcmp(name, "redis") == 0) {
            /* Sentinel: the ceiling talks to the master the sentinels name;
             * cluster: it starts at the first seed and follows MOVED to the
             * node of each name (ceiling.c). */
            if (bench_redis_addr_init(&e->redis, cfg) != 0) {
                bench_errorf("out of memory");
                exit(1);
            }
            if (cfg->redis.pool_max < max_threads(c))
                fprintf(stderr,
                        "cerberus-bench: note: redis.pool_max = %d in %s is "
                        "below %d threads of one client; they will share "
                        "connections (the raw ceiling has one each)\n",
                        cfg->redis.pool_max, c->config_path, max_threads(c));
        }
        /* pg: a waiting call needs a connection that pins no hold, and at
         * most pool - 1 wait at once. */
        if (strcmp(name, "pg") == 0 && cfg->pg.pool <= max_threads(c))
            fprintf(stderr,
                    "cerberus-bench: note: pg.pool = %d in %s is not above %d threads of "
                    "one client; some calls will wait for a connection (the raw ceiling "
                    "has one each)\n",
                    cfg->pg.pool, c->config_path, max_threads(c));
        /* mysql likewise (mysql.pool counts the waiting connections). */
        if (strcmp(name, "mysql") == 0 && cfg->mysql.pool <= max_threads(c))
            fprintf(stderr,
                    "cerberus-bench: note: mysql.pool = %d in %s is not above %d threads of "
                    "one client; some calls will wait for a connection (the raw ceiling "
                    "has one each)\n",
                    cfg->mysql.pool, c->config_path, max_threads(c));
    }
    if (n == 0) {
        char names[CERB_MAX_ENGINES * (CERB_ENGINE_NAME_MAX + 2)] = "";
        for (size_t i = 0; i < cfg->n_engines; i++) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                     cfg->engines[i]);
        }
        bench_errorf("engine \"%s\" is not configured in %s (configured: %s)",
                     c->engine, c->config_path, names);
        cerb__config_free(cfg);
        return -1;
    }
    cerb__config_free(cfg);
    return n;
}

/*
 * The library's log lines, minus two kinds that only the bench itself
 * causes: "engine switch ... (manual switch)" (it pins clients through
 * `active` at open), which would otherwise repeat once per client, and
 * "... (config: active engine changed)", the switch scenario's client
 * following the command it ran. Everything else goes to stderr as the
 * default sink would print it. Called from any thread.
 */
static void bench_log(cerb_log_level level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    if (strstr(line, "(manual switch)") || strstr(line, "(config: active engine changed)"))
        return;
    fprintf(stderr, "%s\n", line);
}

/* Run every chosen scenario on engine @e, appending rows as they come
 * (and the peers' rows after uncontended and handoff when @peers).
 * Returns 0, or -1 when one failed (printed). */
static int run_engine(const struct cli *cli, struct bench_opts *opts,
                      const struct bench_engine *e, struct bench_rows *rows,
                      struct bench_peers *peers)
{
    static const int default_contended[1] = {DEFAULT_CONTENDED_THREADS};
    const int *ct = cli->threads_given ? cli->threads : default_contended;
    int n_ct = cli->threads_given ? cli->n_threads : 1;

    for (int bit = SC_UNCONTENDED; bit <= SC_LAST; bit <<= 1) {
        if (!(cli->scenarios & bit) || bit == SC_FAILOVER)
            continue;
        if (bit == SC_SERVE) {
            /* A row per thread count, then the hand-off row. */
            for (int k = 0; k <= cli->n_threads; k++) {
                struct bench_result *r = bench_rows_slot(rows);
                if (!r)
                    return -1;
                if ((k < cli->n_threads ? bench_serve(e, opts, cli->threads[k], r)
                                        : bench_serve_handoff(e, opts, r)) != 0)
                    return -1;
                rows->n++;
                bench_report_row(stdout, r);
            }
            continue;
        }
        if (bit == SC_GUARD) {
            /* Two rows per run (guard, guard-dup); no peer has a guard. */
            for (int k = 0; k < cli->n_threads; k++) {
                struct bench_result gr[2];
                int n_gr = 0;
                opts->threads = cli->threads[k];
                if (bench_guard(e, opts, cli->threads[k], gr, &n_gr) != 0)
                    return -1;
                for (int j = 0; j < n_gr; j++) {
                    struct bench_result *r = bench_rows_slot(rows);
                    if (!r)
                        return -1;
                    *r = gr[j];
                    rows->n++;
                    bench_report_row(stdout, r);
                }
            }
            continue;
        }
        static const int default_rw[1] = {DEFAULT_RWLOCK_THREADS};
        const int *rwt = cli->threads_given ? cli->threads : default_rw;
        int runs = bit == SC_UNCONTENDED || bit == SC_SWITCH ? cli->n_threads
                 : bit == SC_CONTENDED                       ? n_ct
                 : bit == SC_RWLOCK                          ? n_ct
                 : bit == SC_SEMAPHORE                       ? cli->n_permits
                                                             : 1;
        for (int k = 0; k < runs; k++) {
            struct bench_result *r = bench_rows_slot(rows);
            int rc;
            if (!r)
                return -1;
            switch (bit) {
            case SC_UNCONTENDED:
                opts->threads = cli->threads[k];
                rc = bench_uncontended(e, opts, cli->threads[k], r);
                break;
            case SC_CONTENDED:
                rc = bench_contended(e, opts, ct[k], r);
                break;
            case SC_SWITCH:
                opts->threads = cli->threads[k];
                rc = bench_switch(e, opts, cli->threads[k], r);
                break;
            case SC_HANDOFF:
                rc = bench_handoff(e, opts, r);
                break;
            case SC_HERD:
                rc = bench_herd(e, opts, r);
                break;
            case SC_SEMAPHORE:
                rc = bench_semaphore(e, opts, cli->permits[k], r);
                break;
            case SC_RWLOCK:
                rc = bench_rwlock(e, opts, rwt[k], r);
                break;
            case SC_ELECT_FAILOVER:
                rc = bench_elect_failover(e, opts, r);
                break;
            default:
                rc = bench_many(e, opts, r);
                break;
            }
            if (rc != 0)
                return -1;
            rows->n++;
            bench_report_row(stdout, r);
            /* The row may move when the peers' rows are added. */
            if (peers) {
                struct bench_result cerb = rows->v[rows->n - 1];
                if (bench_peers_after(peers, e, opts, &cerb, rows) != 0)
                    return -1;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct cli cli;
    struct bench_engine engines[CERB_MAX_ENGINES];
    struct bench_rows rows = {NULL, 0, 0};
    struct bench_peers *peers = NULL;
    int n_engines, status = 0;

    /* elect-failover's candidates: this program in a role. */
    if (argc > 1 && strcmp(argv[1], "--elect-candidate") == 0)
        return bench_elect_candidate_main(argc, argv);

    int p = parse_cli(argc, argv, &cli);
    if (p != 0)
        return p > 0 ? 0 : 2;
    /* Before a long run, not after it. */
    if (cli.plot_path && bench_plot_check() != 0)
        return 2;

    /* A server that closes a connection must give an error, not kill us. */
    signal(SIGPIPE, SIG_IGN);

    n_engines = cli.config_path ? engines_from_file(&cli, engines)
                                : engines_builtin(&cli, engines);
    if (n_engines < 0)
        return 2;
    /* switch: what the command will switch, checked before any run. */
    if (cli.scenarios & SC_SWITCH) {
        if (cli.config_path && engines[0].cfg->n_engines < 2) {
            bench_errorf("--scenario switch: %s lists one engine; the scenario switches "
                         "between two or more", cli.config_path);
            for (int i = 0; i < n_engines; i++)
                engine_free(&engines[i]);
            return 2;
        }
        if (!cli.config_path)
            cli.switch_text = builtin_switch_text(&cli);
    }
    /* Its environment (CERB_BENCH_PEER_LIMIT_S) is input too: checked
     * before any run. */
    if (cli.peers && !(peers = bench_peers_new(isatty(STDERR_FILENO)))) {
        for (int i = 0; i < n_engines; i++)
            engine_free(&engines[i]);
        free(cli.switch_text);
        return 2;
    }

    struct bench_opts opts = {
        .threads = cli.threads[0],
        .waiters = cli.waiters ? cli.waiters : DEFAULT_HANDOFF_WAITERS,
        .herd_waiters = cli.waiters ? cli.waiters : DEFAULT_HERD_WAITERS,
        .locks = cli.locks,
        .many_lease_ms = cli.lease_ms,
        .duration_s = cli.duration_s,
        .progress = isatty(STDERR_FILENO),
        .candidates = cli.candidates,
        .elect_rounds = cli.rounds,
        .elect_lease_ms = cli.lease_given ? cli.lease_ms : 0,
        .sw = {cli.config_path, cli.switch_text, switch_cli(&cli)},
    };
    if (cli.scenarios == SC_FAILOVER) {
        /* One run over the whole configuration: the first engine fails. */
        struct bench_result fr[3];
        size_t nfr = 0;
        bench_report_header(stdout);
        status = bench_failover(&engines[0], &cli.fo, fr, &nfr) == 0 ? 0 : 1;
        for (size_t k = 0; k < nfr; k++)
            bench_report_row(stdout, &fr[k]);
        if (status == 0 && cli.json_path && bench_report_json(cli.json_path, fr, nfr) != 0)
            status = 1;
        if (status == 0 && cli.plot_path)
            fprintf(stderr, "cerberus-bench: note: failover rows are findings "
                            "in words; nothing to plot\n");
        for (int i = 0; i < n_engines; i++)
            engine_free(&engines[i]);
        free(cli.switch_text);
        return status;
    }

    cerb_log_set(bench_log, NULL, CERB_LOG_WARN);
    printf("# cerberus-bench %d.%d.%d: %.1f s measured per side; %s\n",
           CERB_VERSION_MAJOR, CERB_VERSION_MINOR, CERB_VERSION_PATCH,
           cli.duration_s,
           cli.config_path ? cli.config_path : "built-in configuration");
    for (int i = 0; cli.scenarios & ~SC_SWITCH && i < n_engines; i++)
        if (strcmp(bench_engine_label(&engines[i]), "redlock") == 0) {
            const struct cerb_redis_config *rc = &engines[i].cfg->redis;
            printf("# redlock: the redis engine in Redlock mode on");
            for (size_t k = 0; k < rc->n_nodes; k++)
                printf("%s %s", k ? "," : "", rc->nodes[k]);
            printf(" (fence %s; raw ceiling: SET NX PX, then compare-and-DEL, "
                   "each to every master at once)\n",
                   rc->redlock_fence == CERB_REDLOCK_FENCE_QUORUM ? "quorum" : "none");
        } else if (strcmp(engines[i].name, "redis") == 0) {
            printf("# redis at %s:%d (raw ceiling on the same server)\n",
                   engines[i].redis.host, engines[i].redis.port);
        }
#ifdef CERB_WITH_PG
    for (int i = 0; cli.scenarios & ~SC_SWITCH && i < n_engines; i++)
        if (strcmp(engines[i].name, "pg") == 0) {
            char where[512];
            bench_pg_describe(&engines[i], where, sizeof where);
            printf("# pg at %s (raw ceiling on the same server and table)\n", where);
        }
#endif
#ifdef CERB_WITH_MYSQL
    for (int i = 0; cli.scenarios & ~SC_SWITCH && i < n_engines; i++)
        if (strcmp(engines[i].name, "mysql") == 0) {
            char where[512];
            bench_mysql_describe(&engines[i], where, sizeof where);
            printf("# mysql at %s (raw ceiling on the same server and table)\n", where);
        }
#endif
    for (int i = 0; cli.scenarios & ~SC_SWITCH && i < n_engines; i++)
        if (strcmp(engines[i].name, "memcached") == 0)
            printf("# memcached at %s (raw ceiling on the same server: ms ... ME c + "
                   "md ... C<cas>; no fencing, no guard)\n",
                   engines[i].cfg->memcached.n_servers ? engines[i].cfg->memcached.servers[0]
                                                       : "?");
    if (cli.peers)
        bench_peers_describe(peers, stdout, engines, n_engines);
    if (cli.scenarios & SC_SWITCH)
        printf("# switch: a copy of %s switched with `%s switch E`; ceiling = E alone\n",
               cli.config_path ? cli.config_path
                               : "the built-in redis, zk, etcd file (lease 1000 ms)",
               opts.sw.cli);
    bench_report_header(stdout);

    for (int i = 0; i < n_engines && status == 0; i++)
        if (run_engine(&cli, &opts, &engines[i], &rows, peers) != 0)
            status = 1;

    if (status == 0 && cli.json_path &&
        bench_report_json(cli.json_path, rows.v, rows.n) != 0)
        status = 1;
    if (status == 0 && cli.plot_path &&
        bench_plot(cli.plot_path, rows.v, rows.n) != 0)
        status = 1;
    bench_peers_free(peers);
    for (int i = 0; i < n_engines; i++)
        engine_free(&engines[i]);
    free(cli.switch_text);
    free(rows.v);
    return status;
}
