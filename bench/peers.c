/*
 * peers.c — `cerberus-bench --peers`: other lock libraries measured on the
 * same server in the same run, each row right under Cerberus's row of the
 * same scenario, with Cerberus's figure over the peer's (DESIGN.md §10).
 *
 * Peers (the table peer_defs below): redis-py's Lock on the redis engine's
 * server; npm redlock (node-redlock) on the masters of its Redlock mode
 * (rows "redlock", --nodes HOST:PORT,... instead of --host/--port); Apache Curator's InterProcessMutex and kazoo's Lock on ZooKeeper;
 * python-etcd3's Lock and `etcdctl lock` on etcd. The local engine has none.
 * Each is measured by a script in bench/peers/ (Python scripts run with
 * $CERB_PEER_PYTHON, default /usr/bin/python3, the interpreter Debian's
 * python3-* packages install for; shell scripts with bash), all speaking
 * one protocol (bench/peers/peerlib.py):
 *
 *   SCRIPT [--peer P] --check | --scenario uncontended|handoff --threads N
 *          --duration S  <server: --host/--port/--db | --hosts/--root |
 *          --endpoint>  --work DIR
 *   stdout: "ok <what>" | "skip <why>" (exit status 3) |
 *           "result peer=P scenario=S threads=N ops_per_s=X p50_us=..
 *            [p90_us=..] p99_us=.. max_us=.. [samples=K] # how"
 *
 * Uncontended (ops/s at each --threads value) and handoff (p50/p99 with
 * --waiters contenders) have peer rows, and so do the coordination
 * primitives (issue 28): semaphore (ops/s; the script gets --permits N
 * and --threads 2N) and rwlock (ops/s) with Curator's recipes on zk and
 * npm redis-semaphore on redis; elect-failover (median and longest
 * failover; the script gets --threads K candidates, --rounds R and
 * --lease-ms L, the bound Cerberus's candidates had) with Curator's
 * LeaderLatch, a redis-py Lock loop, `etcdctl elect` and etcd's election
 * API. Where an engine has no established peer for a primitive, the row
 * says so ("skipped: no peer: ..."). The other scenarios measure
 * Cerberus's own machinery (wake-ups, renewal) that peers do not expose.
 *
 * Algorithm. The first time a peer is needed, it is checked (--check: the
 * library is importable, the server answers; Curator's benchmark class is
 * compiled into the run's scratch directory there). A peer that cannot run
 * for a reason that is not an error (not installed, credentials the
 * scripts do not pass) gives one "skipped: <why>" row and is not tried
 * again. Otherwise each measurement runs the script as a child in a
 * process group of its own, its stdout and stderr on pipes, under a time
 * limit (PEER_BASE_LIMIT_S plus three times the measured time, or
 * $CERB_BENCH_PEER_LIMIT_S seconds when set, for tests): past it
 * the whole group gets SIGTERM, then SIGKILL, so a hung JVM or Python
 * worker never outlives the run. A Ctrl-C or SIGTERM to the bench while a
 * peer runs is passed to the group the same way before the bench dies.
 * The group is signalled only while its leader is unreaped (a zombie keeps
 * the id from being reused), so the bench never signals a stranger.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenarios.h"

extern char **environ;

#ifndef CERB_BENCH_PEERS_DIR_DEFAULT
#define CERB_BENCH_PEERS_DIR_DEFAULT "bench/peers"
#endif

#define NS_PER_S INT64_C(1000000000)
/* A check may compile Curator's class (javac is bounded at 120 s). */
#define PEER_CHECK_LIMIT_S 180
/* Start-up (a JVM, Python processes, sessions) on top of 3x the run. */
#define PEER_BASE_LIMIT_S 60
/* After SIGTERM, the group has this long before SIGKILL. */
#define PEER_KILL_GRACE_NS (2 * NS_PER_S)
/* After the script exits, its pipes may stay open this long (a straggler
 * holding them) before the group is killed. */
#define PEER_DRAIN_NS (2 * NS_PER_S)
#define PEER_OUT_MAX 4096
#define PEER_ERR_MAX 1024

struct peer_def {
    const char *engine;  /* the engine whose server it runs on */
    const char *name;    /* in the table */
    const char *script;  /* under the peers directory */
    const char *peer_arg; /* --peer for a script serving several, or NULL */
    /* DESIGN.md §10: cerberus/peer ops/s at least (uncontended; 0 none),
     * only at 1 thread when unc_1_only; hand-off p50 and p99 ratios at
     * most (0 none). */
    double unc_min;
    int unc_1_only;
    double ho_p50_max, ho_p99_max;
    /* The scenarios it measures, each between commas. */
    const char *scenarios;
};

static const struct peer_def peer_defs[] = {
    {"redis", "redis-py", "redispy_lock.py", NULL, 3.0, 1, 0, 0,
     ",uncontended,handoff,elect-failover,"},
    {"redis", "redis-semaphore", "redis_semaphore.sh", NULL, 0, 0, 0, 0, ",semaphore,"},
    /* The redis engine in Redlock mode ("redlock" rows): npm redlock 4.2.0
     * on the same masters. No DESIGN 10 target: the ratio is reported. */
    {"redlock", "node-redlock", "node_redlock.sh", NULL, 0, 0, 0, 0, ",uncontended,handoff,"},
    {"zk", "curator", "curator.sh", NULL, 1.6, 0, 0.7, 0.4,
     ",uncontended,handoff,semaphore,rwlock,elect-failover,"},
    {"zk", "kazoo", "kazoo_lock.py", NULL, 2.8, 0, 0, 0, ",uncontended,handoff,"},
    {"etcd", "python-etcd3", "etcd_peers.py", "python-etcd3", 1.0, 0, 0, 0,
     ",uncontended,handoff,"},
    {"etcd", "etcdctl", "etcd_peers.py", "etcdctl", 1.0, 0, 0, 0,
     ",uncontended,handoff,elect-failover,"},
    {"etcd", "etcd-election", "etcd_peers.py", "election-api", 0, 0, 0, 0,
     ",elect-failover,"},
};

/* Engines and primitives with no established peer to compare with: the
 * row says why. */
static const struct {
    const char *engine, *scenario, *why;
} no_peer[] = {
    {"etcd", "semaphore",
     "no peer: etcd ships no semaphore (neither etcdctl nor the Go client's "
     "concurrency package has one)"},
    {"redis", "rwlock",
     "no peer: neither redis-py nor npm redis-semaphore has a read-write lock"},
    {"etcd", "rwlock",
     "no peer: etcd's read-write lock is only the Go contrib/recipes example, "
     "with no command or client to run it"},
};
#define N_NO_PEER (sizeof no_peer / sizeof no_peer[0])

/* Whether peer @d measures @scenario. */
static int serves(const struct peer_def *d, const char *scenario)
{
    char key[BENCH_NAME_MAX + 3];
    snprintf(key, sizeof key, ",%s,", scenario);
    return strstr(d->scenarios, key) != NULL;
}
#define N_PEERS (sizeof peer_defs / sizeof peer_defs[0])

enum peer_state { PEER_UNKNOWN, PEER_READY, PEER_GONE };

struct bench_peers {
    char dir[1024];          /* the scripts */
    char python[1024];       /* interpreter of the .py scripts */
    char work[64];           /* scratch directory, "" until made */
    int progress;
    int limit_s;             /* $CERB_BENCH_PEER_LIMIT_S, 0 = the defaults */
    enum peer_state state[N_PEERS];
};

/* ------------------------------------------------------------ children */

/* The process group of the peer running now, for the signal handler. */
static volatile sig_atomic_t running_pgid;

static void on_fatal_signal(int sig)
{
    pid_t g = (pid_t)running_pgid;
    if (g > 0)
        kill(-g, SIGKILL); /* our child's group; async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Append @n bytes to @buf (capacity @cap, NUL-terminated), keeping the
 * head (@keep_tail 0) or the tail (1) when it overflows. */
static void buf_add(char *buf, size_t cap, const char *data, size_t n,
                    int keep_tail)
{
    size_t len = strlen(buf);
    if (!keep_tail) {
        if (len + 1 >= cap)
            return;
        if (n > cap - 1 - len)
            n = cap - 1 - len;
        memcpy(buf + len, data, n);
        buf[len + n] = '\0';
        return;
    }
    if (n > cap - 1) { /* only the last cap - 1 bytes can stay */
        data += n - (cap - 1);
        n = cap - 1;
    }
    if (len + n > cap - 1) {
        size_t drop = len + n - (cap - 1);
        memmove(buf, buf + drop, len - drop + 1);
        len -= drop;
    }
    memcpy(buf + len, data, n);
    buf[len + n] = '\0';
}

/* Read what @fd has; returns 0 at EOF or error (fd closed and set to -1),
 * else 1. */
static int drain_fd(int *fd, char *buf, size_t cap, int keep_tail)
{
    char tmp[512];
    ssize_t r = read(*fd, tmp, sizeof tmp);
    if (r > 0) {
        buf_add(buf, cap, tmp, (size_t)r, keep_tail);
        return 1;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
        return 1;
    close(*fd);
    *fd = -1;
    return 0;
}

/* Whether @pid has exited, without reaping it (the zombie keeps its id
 * and its group's id ours). */
static int exited(pid_t pid)
{
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return errno == ECHILD;
    return si.si_pid == pid;
}

/* Signal the group led by @pid and wait (bounded) for the leader. */
static void kill_group(pid_t pid)
{
    int64_t end = bench_now_ns() + PEER_KILL_GRACE_NS;
    kill(-pid, SIGTERM);
    while (!exited(pid) && bench_now_ns() < end) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(-pid, SIGKILL);
}

/*
 * Run @argv (argv[0] looked up on PATH) in a process group of its own with
 * stdin from /dev/null, collecting stdout into @out (its head) and stderr
 * into @err (its tail), for at most @limit_s seconds.
 * Returns: the exit status (0..255), -2 when it was killed at the limit,
 * -3 when it died of a signal, -1 when it could not be started (@err says
 * why).
 */
static int run_child(char *const argv[], int limit_s, const char *label,
                     int progress, char *out, size_t outlen, char *err,
                     size_t errlen)
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t def;
    pid_t pid;
    int rc;

    out[0] = err[0] = '\0';
    if (pipe(po) != 0 || pipe(pe) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (po[i] >= 0)
                close(po[i]);
            if (pe[i] >= 0)
                close(pe[i]);
        }
        return -1;
    }
    fcntl(po[0], F_SETFD, FD_CLOEXEC);
    fcntl(pe[0], F_SETFD, FD_CLOEXEC);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    posix_spawn_file_actions_addclose(&fa, po[1]);
    posix_spawn_file_actions_addclose(&fa, pe[1]);
    posix_spawnattr_init(&attr);
    /* Its own group, to be stopped whole; the bench ignores SIGPIPE, which
     * the peer must not inherit. */
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
                                        POSIX_SPAWN_SETSIGDEF);

    /* Until it is reaped, a Ctrl-C or SIGTERM to the bench reaches the
     * group too. */
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(po[1]);
    close(pe[1]);
    if (rc != 0) {
        snprintf(err, errlen, "cannot run %s: %s", argv[0], strerror(rc));
        close(po[0]);
        close(pe[0]);
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        return -1;
    }
    running_pgid = pid;

    const int64_t start = bench_now_ns();
    const int64_t deadline = start + (int64_t)limit_s * NS_PER_S;
    int64_t drain_end = 0;
    int fo = po[0], fe = pe[0], timed_out = 0;
    for (;;) {
        struct pollfd pf[2];
        int n = 0;
        if (fo >= 0)
            pf[n++] = (struct pollfd){.fd = fo, .events = POLLIN};
        if (fe >= 0)
            pf[n++] = (struct pollfd){.fd = fe, .events = POLLIN};
        int64_t now = bench_now_ns();
        if (now >= deadline) {
            timed_out = 1;
            break;
        }
        if (drain_end == 0 && exited(pid))
            drain_end = now + PEER_DRAIN_NS;
        if (n == 0 && drain_end)
            break; /* it exited and both pipes are closed */
        if (drain_end && now >= drain_end)
            break; /* a straggler holds the pipes: stopped below */
        bench_progress(progress, "%s: %.1f s (limit %d s)", label,
                       (double)(now - start) / 1e9, limit_s);
        if (n == 0) {
            /* Pipes closed, the leader still running: poll its exit. */
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        int r = poll(pf, (nfds_t)n, 250);
        if (r < 0 && errno != EINTR)
            break;
        for (int i = 0; r > 0 && i < n; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (pf[i].fd == fo)
                drain_fd(&fo, out, outlen, 0);
            else
                drain_fd(&fe, err, errlen, 1);
        }
    }
    if (timed_out || !exited(pid))
        kill_group(pid);
    else
        kill(-pid, SIGKILL); /* stragglers of an exited script, if any */
    if (fo >= 0)
        close(fo);
    if (fe >= 0)
        close(fe);
    /* The group is dead: from here on its id may be reused. */
    running_pgid = 0;
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    bench_progress_clear();
    if (timed_out)
        return -2;
    if (WIFEXITED(ws))
        return WEXITSTATUS(ws);
    return -3;
}

/* The last non-empty line of @text, trimmed, into @dst. */
static void last_line(const char *text, char *dst, size_t len)
{
    const char *end = text + strlen(text);
    while (end > text && (end[-1] == '\n' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > text && start[-1] != '\n')
        start--;
    snprintf(dst, len, "%.*s", (int)(end - start), start);
}

/* The first line of @text starting with @prefix, without it, into @dst.
 * Returns 1 when found. */
static int line_with(const char *text, const char *prefix, char *dst,
                     size_t len)
{
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        if (ll >= pl && strncmp(p, prefix, pl) == 0) {
            snprintf(dst, len, "%.*s", (int)(ll - pl), p + pl);
            return 1;
        }
        p = nl ? nl + 1 : NULL;
    }
    return 0;
}

/* ------------------------------------------------------------- scratch */

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

struct bench_peers *bench_peers_new(int progress)
{
    struct bench_peers *p = calloc(1, sizeof *p);
    if (!p) {
        bench_errorf("out of memory");
        return NULL;
    }
    const char *dir = getenv("CERB_BENCH_PEERS_DIR");
    const char *py = getenv("CERB_PEER_PYTHON");
    snprintf(p->dir, sizeof p->dir, "%s",
             dir && *dir ? dir : CERB_BENCH_PEERS_DIR_DEFAULT);
    snprintf(p->python, sizeof p->python, "%s",
             py && *py ? py : "/usr/bin/python3");
    p->progress = progress;
    /* A tighter bound for tests of the time limit itself. */
    const char *lim = getenv("CERB_BENCH_PEER_LIMIT_S");
    if (lim && *lim) {
        char *end;
        long v = strtol(lim, &end, 10);
        if (*end || v < 1 || v > 3600) {
            bench_errorf("CERB_BENCH_PEER_LIMIT_S=\"%s\" is not a number of "
                         "seconds in 1..3600", lim);
            free(p);
            return NULL;
        }
        p->limit_s = (int)v;
    }
    return p;
}

void bench_peers_free(struct bench_peers *p)
{
    if (!p)
        return;
    if (p->work[0])
        nftw(p->work, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(p);
}

void bench_peers_describe(const struct bench_peers *p, FILE *f,
                          const struct bench_engine *engines, int n)
{
    char list[512] = "";
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < N_PEERS; k++) {
            if (strcmp(peer_defs[k].engine, bench_engine_label(&engines[i])) != 0)
                continue;
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%s on %s",
                     len ? ", " : "", peer_defs[k].name, bench_engine_label(&engines[i]));
        }
    if (list[0])
        fprintf(f, "# peers: %s (scripts in %s)\n"
                   "# cerberus/peer: uncontended = Cerberus ops/s / the "
                   "peer's (higher is better); handoff = Cerberus hand-off "
                   "p50, p99 / the peer's (lower is better); targets from "
                   "DESIGN 10\n",
                list, p->dir);
    else
        fprintf(f, "# peers: none for these engines (peers run on redis, "
                   "zk and etcd servers)\n");
}

/* ----------------------------------------------------------- one peer */

/* Why this engine's server is out of the scripts' reach, or NULL: they
 * speak plain TCP/HTTP and pass no credentials. */
static const char *unreachable_why(const struct bench_engine *e)
{
    const struct cerb_config *c = e->cfg;
    if (strcmp(e->name, "redis") == 0 &&
        (e->redis.password[0] || e->redis.user[0]))
        return "the server needs a password, which the peer scripts do not "
               "pass";
    if (strcmp(e->name, "zk") == 0 && c->zk.user[0])
        return "the server needs digest auth, which the peer scripts do not "
               "pass";
    if (strcmp(e->name, "etcd") == 0 &&
        (c->etcd.user[0] || strncmp(c->etcd.endpoints[0], "https:", 6) == 0))
        return "the server needs credentials or TLS, which the peer scripts "
               "do not pass";
    return NULL;
}

/* The argv of one run of peer @d; @scenario NULL = --check. */
static void build_argv(const struct bench_peers *p, const struct peer_def *d,
                       const struct bench_engine *e, const struct bench_result *cerb,
                       double duration_s, char *bufs,
                       size_t bufsz, char **argv, size_t maxargs)
{
    size_t n = 0, used = 0;
    /* Copies @s into @bufs and adds it as the next argument. */
#define ARG(...)                                                          \
    do {                                                                  \
        int w_ = snprintf(bufs + used, bufsz - used, __VA_ARGS__);        \
        if (w_ < 0 || (size_t)w_ >= bufsz - used || n + 2 > maxargs)      \
            break;                                                        \
        argv[n++] = bufs + used;                                          \
        used += (size_t)w_ + 1;                                           \
    } while (0)
    size_t sl = strlen(d->script);
    int is_py = sl > 3 && strcmp(d->script + sl - 3, ".py") == 0;
    ARG("%s", is_py ? p->python : "bash");
    ARG("%s/%s", p->dir, d->script);
    if (d->peer_arg) {
        ARG("--peer");
        ARG("%s", d->peer_arg);
    }
    if (cerb) {
        ARG("--scenario");
        ARG("%s", cerb->scenario);
        ARG("--threads");
        ARG("%d", cerb->threads);
        ARG("--duration");
        ARG("%g", duration_s);
        if (strcmp(cerb->scenario, "semaphore") == 0) {
            ARG("--permits");
            ARG("%d", cerb->permits);
        }
        if (strcmp(cerb->scenario, "elect-failover") == 0) {
            ARG("--rounds");
            ARG("%d", cerb->rounds);
            ARG("--lease-ms");
            ARG("%lld", (long long)cerb->bound_ms);
        }
    } else {
        ARG("--check");
    }
    if (strcmp(bench_engine_label(e), "redlock") == 0) {
        char nodes[1024] = "";
        for (size_t i = 0; i < e->cfg->redis.n_nodes; i++) {
            size_t len = strlen(nodes);
            snprintf(nodes + len, sizeof nodes - len, "%s%s", i ? "," : "",
                     e->cfg->redis.nodes[i]);
        }
        ARG("--nodes");
        ARG("%s", nodes);
    } else if (strcmp(e->name, "redis") == 0) {
        ARG("--host");
        ARG("%s", e->redis.host);
        ARG("--port");
        ARG("%d", e->redis.port);
        ARG("--db");
        ARG("%d", e->redis.db);
    } else if (strcmp(e->name, "zk") == 0) {
        ARG("--hosts");
        ARG("%s", e->cfg->zk.hosts);
        ARG("--root");
        ARG("%s", e->cfg->zk.root);
    } else {
        ARG("--endpoint");
        ARG("%s", e->cfg->etcd.endpoints[0]);
    }
    if (p->work[0]) {
        ARG("--work");
        ARG("%s", p->work);
    }
#undef ARG
    argv[n] = NULL;
}

/* A row for peer @d under Cerberus's row @cerb, not yet counted. */
static struct bench_result *peer_row(struct bench_rows *rows,
                                     const struct peer_def *d,
                                     const struct bench_result *cerb)
{
    struct bench_result *r = bench_rows_slot(rows);
    if (!r)
        return NULL;
    snprintf(r->scenario, sizeof r->scenario, "%s", cerb->scenario);
    snprintf(r->engine, sizeof r->engine, "%s", cerb->engine);
    snprintf(r->peer, sizeof r->peer, "%s", d->name);
    r->threads = cerb->threads;
    r->ratio = r->ratio_paired_median = -1;
    r->cerb_over_peer = r->cerb_over_peer_p99 = -1;
    return r;
}

/* Fill @r from a "result ..." line. Returns 0, or -1 when a figure the
 * table needs is missing. */
static int parse_result(const char *line, struct bench_result *r)
{
    char buf[PEER_OUT_MAX];
    snprintf(buf, sizeof buf, "%s", line);
    char *how = strstr(buf, " # ");
    if (how) {
        *how = '\0';
        snprintf(r->peer_how, sizeof r->peer_how, "%s", how + 3);
    }
    r->ops_per_s = r->p50_us = r->p90_us = r->p99_us = r->max_us = -1;
    for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok;
         tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            continue;
        *eq = '\0';
        char *end;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(v) || v < 0)
            continue; /* text values (peer=, scenario=) */
        if (strcmp(tok, "ops_per_s") == 0)
            r->ops_per_s = v;
        else if (strcmp(tok, "p50_us") == 0)
            r->p50_us = v;
        else if (strcmp(tok, "p90_us") == 0)
            r->p90_us = v;
        else if (strcmp(tok, "p99_us") == 0)
            r->p99_us = v;
        else if (strcmp(tok, "max_us") == 0)
            r->max_us = v;
        else if (strcmp(tok, "samples") == 0)
            r->ops = (uint64_t)v;
    }
    if (r->ops_per_s < 0 || r->p50_us < 0 || r->p99_us < 0)
        return -1;
    if (r->max_us < 0)
        r->max_us = r->p99_us;
    return 0;
}

/* Make the scratch directory the scripts share (Curator's classes). */
static void ensure_work(struct bench_peers *p)
{
    if (p->work[0])
        return;
    char tmpl[] = "/tmp/cerb-peers-XXXXXX";
    if (mkdtemp(tmpl))
        snprintf(p->work, sizeof p->work, "%s", tmpl);
}

/* Mark @r skipped or failed with @why, print it, count it. */
static void gone(struct bench_peers *p, size_t k, struct bench_rows *rows,
                 struct bench_result *r, const char *status, const char *why)
{
    p->state[k] = PEER_GONE;
    r->peer_status = status;
    snprintf(r->peer_reason, sizeof r->peer_reason, "%.250s", why);
    rows->n++;
    bench_report_row(stdout, r);
}

/* Check peer @k once. Returns 1 when it can run; else its row is out. */
static int check_peer(struct bench_peers *p, size_t k,
                      const struct bench_engine *e,
                      const struct bench_result *cerb,
                      struct bench_rows *rows, int *oom)
{
    const struct peer_def *d = &peer_defs[k];
    char path[1200], why[512], out[PEER_OUT_MAX], err[PEER_ERR_MAX];
    char bufs[4096], *argv[32], label[96];
    const char *cant = unreachable_why(e);
    size_t sl = strlen(d->script);
    int is_py = sl > 3 && strcmp(d->script + sl - 3, ".py") == 0;

    if (p->state[k] == PEER_READY)
        return 1;
    if (p->state[k] == PEER_GONE)
        return 0;
    struct bench_result *r = peer_row(rows, d, cerb);
    if (!r) {
        *oom = 1;
        return 0;
    }
    snprintf(path, sizeof path, "%s/%s", p->dir, d->script);
    if (cant) {
        gone(p, k, rows, r, "skipped", cant);
        return 0;
    }
    if (access(path, R_OK) != 0) {
        snprintf(why, sizeof why, "%.400s not found (set "
                 "CERB_BENCH_PEERS_DIR to a checkout's bench/peers)", path);
        gone(p, k, rows, r, "skipped", why);
        return 0;
    }
    if (is_py && access(p->python, X_OK) != 0) {
        snprintf(why, sizeof why, "%.400s not found (Debian package "
                 "python3; or set CERB_PEER_PYTHON)", p->python);
        gone(p, k, rows, r, "skipped", why);
        return 0;
    }
    ensure_work(p);
    build_argv(p, d, e, NULL, 0, bufs, sizeof bufs, argv, 32);
    snprintf(label, sizeof label, "peer %s on %s: checking", d->name,
             e->name);
    int limit = p->limit_s ? p->limit_s : PEER_CHECK_LIMIT_S;
    int st = run_child(argv, limit, label, p->progress, out, sizeof out, err,
                       sizeof err);
    char line[512], tail[512];
    last_line(err, tail, sizeof tail);
    if (line_with(out, "skip ", line, sizeof line)) {
        gone(p, k, rows, r, "skipped", line);
        return 0;
    }
    if (st == 0 && line_with(out, "ok ", line, sizeof line)) {
        p->state[k] = PEER_READY;
        return 1;
    }
    if (st == -2)
        snprintf(why, sizeof why, "check killed after its %d s limit", limit);
    else if (st == -1)
        snprintf(why, sizeof why, "%.400s", err);
    else
        snprintf(why, sizeof why, "check %s %d: %.400s",
                 st == -3 ? "died, status" : "exit status", st,
                 tail[0] ? tail : "(no message)");
    gone(p, k, rows, r, "failed", why);
    return 0;
}

/* The DESIGN.md §10 bounds of peer @d for row @r. */
static void set_targets(const struct peer_def *d, struct bench_result *r)
{
    if (strcmp(r->scenario, "uncontended") == 0) {
        if (d->unc_min > 0 && (!d->unc_1_only || r->threads == 1))
            r->peer_target_min = d->unc_min;
    } else if (strcmp(r->scenario, "handoff") == 0) {
        r->peer_target_max = d->ho_p50_max;
        r->peer_target_p99_max = d->ho_p99_max;
    }
}

int bench_peers_after(struct bench_peers *p, const struct bench_engine *e,
                      const struct bench_opts *o,
                      const struct bench_result *cerb,
                      struct bench_rows *rows)
{
    /* Compared by ops/s (higher is better) or by latency (lower). */
    int unc = strcmp(cerb->scenario, "uncontended") == 0 ||
              strcmp(cerb->scenario, "semaphore") == 0 ||
              strcmp(cerb->scenario, "rwlock") == 0;
    int elect = strcmp(cerb->scenario, "elect-failover") == 0;
    if (cerb->note[0])
        return 0; /* no figures of Cerberus's to compare (local elections) */
    for (size_t i = 0; i < N_NO_PEER; i++)
        if (strcmp(no_peer[i].engine, bench_engine_label(e)) == 0 &&
            strcmp(no_peer[i].scenario, cerb->scenario) == 0) {
            struct bench_result *r = bench_rows_slot(rows);
            if (!r)
                return -1;
            snprintf(r->scenario, sizeof r->scenario, "%s", cerb->scenario);
            snprintf(r->engine, sizeof r->engine, "%s", cerb->engine);
            snprintf(r->peer, sizeof r->peer, "none");
            r->threads = cerb->threads;
            r->ratio = r->ratio_paired_median = -1;
            r->cerb_over_peer = r->cerb_over_peer_p99 = -1;
            r->peer_status = "skipped";
            snprintf(r->peer_reason, sizeof r->peer_reason, "%s", no_peer[i].why);
            rows->n++;
            bench_report_row(stdout, r);
        }
    for (size_t k = 0; k < N_PEERS; k++) {
        const struct peer_def *d = &peer_defs[k];
        char out[PEER_OUT_MAX], err[PEER_ERR_MAX], bufs[4096], *argv[32];
        char label[96], line[PEER_OUT_MAX], tail[512], why[700];
        int oom = 0;

        if (strcmp(d->engine, bench_engine_label(e)) != 0 || !serves(d, cerb->scenario))
            continue;
        if (!check_peer(p, k, e, cerb, rows, &oom)) {
            if (oom)
                return -1;
            continue;
        }
        struct bench_result *r = peer_row(rows, d, cerb);
        if (!r)
            return -1;
        build_argv(p, d, e, cerb, o->duration_s, bufs, sizeof bufs, argv, 32);
        /* elect-failover: each round waits out a lease (etcdctl's is its
         * own 60 s, one round). */
        int limit = p->limit_s ? p->limit_s
                    : elect ? PEER_BASE_LIMIT_S + 90 +
                                  cerb->rounds * (int)(2 * cerb->bound_ms / 1000 + 15)
                            : PEER_BASE_LIMIT_S + (int)(3 * o->duration_s);
        snprintf(label, sizeof label, "peer %s %s x%d on %s", d->name,
                 cerb->scenario, cerb->threads, e->name);
        int st = run_child(argv, limit, label, p->progress, out, sizeof out,
                           err, sizeof err);
        last_line(err, tail, sizeof tail);
        if (line_with(out, "skip ", line, sizeof line)) {
            gone(p, k, rows, r, "skipped", line);
            continue;
        }
        if (st == 0 && line_with(out, "result ", line, sizeof line) &&
            parse_result(line, r) == 0) {
            r->peer_status = "measured";
            r->elapsed_s = o->duration_s;
            if (unc && cerb->ops_per_s > 0 && r->ops_per_s > 0)
                r->cerb_over_peer = cerb->ops_per_s / r->ops_per_s;
            if (!unc && cerb->p50_us > 0 && r->p50_us > 0)
                r->cerb_over_peer = cerb->p50_us / r->p50_us;
            if (!unc && cerb->p99_us > 0 && r->p99_us > 0)
                r->cerb_over_peer_p99 = cerb->p99_us / r->p99_us;
            set_targets(d, r);
            rows->n++;
            bench_report_row(stdout, r);
            continue;
        }
        /* A failure of this measurement only: the next may work. */
        r->ops_per_s = r->p50_us = r->p90_us = r->p99_us = r->max_us = 0;
        if (st == -2)
            snprintf(why, sizeof why, "killed after its %d s limit", limit);
        else if (st == -1)
            snprintf(why, sizeof why, "%.400s", err);
        else if (st == 0)
            snprintf(why, sizeof why, "no result line (stdout: %.200s)", out);
        else
            snprintf(why, sizeof why, "%s %d: %s",
                     st == -3 ? "died, status" : "exit status", st,
                     tail[0] ? tail : "(no message)");
        r->peer_status = "failed";
        snprintf(r->peer_reason, sizeof r->peer_reason, "%.250s", why);
        rows->n++;
        bench_report_row(stdout, r);
        bench_errorf("peer %s (%s x%d on %s) failed: %s", d->name,
                     cerb->scenario, cerb->threads, e->name, why);
    }
    return 0;
}
