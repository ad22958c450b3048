/*
 * scenario_elect.c — the elect-failover scenario of cerberus-bench: a
 * leader is killed, how long until the next one knows it leads?
 *
 * Algorithm. K candidate processes (--candidates, default 3) campaign for
 * one election name. Each is this very program re-executed in a role
 * (`cerberus-bench --elect-candidate ...`, bench_elect_candidate_main): it
 * opens a client on the engine measured from the same configuration, says
 * "ready" on its stdout (a pipe to the bench), campaigns without limit and,
 * the moment cerb_election_campaign returns CERB_OK, stamps CLOCK_MONOTONIC
 * (one clock for every process on the machine) and writes "elected I T".
 * It then leads until its stdin (the other pipe) reaches EOF, and resigns.
 *
 * The bench waits for the first leader and every candidate's "ready",
 * lets the campaigns reach the server (SETTLE_NS), stamps the time and
 * sends the leader SIGKILL: its term is left on the server, as a crashed
 * leader's would be, and ends only when the engine lets it: the term's
 * lease on Redis, the session timeout on ZooKeeper (its ephemeral node goes
 * with the session), the session lease's TTL on etcd. The failover is the
 * next leader's stamp minus the kill's. The killed candidate is reaped and
 * a new one started in its place, so K candidates stand for every round,
 * R rounds (--rounds, default 5).
 *
 * The target (the row's ceiling, kind "bound"): the next leader within
 * that lease or session bound plus one round trip (a PING on a bare
 * connection, measured before the rounds); ratio = median / bound. The row
 * gives the median as p50, the longest as p99 and max, and ops/s as rounds
 * over the summed failover time.
 *
 * Processes. Candidates are children of the bench only: each is killed by
 * its PID (never by name), reaped with waitpid, and also dies with the
 * bench (PR_SET_PDEATHSIG) and on EOF of its stdin, so none outlives the
 * run. Every wait has a deadline (three bounds plus 10 s per round): a
 * candidate that never wins is a failure, not a hang.
 *
 * The local engine's elections live in one process (file mode has none),
 * so no candidate in another process can be elected: its row is a note.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenarios.h"

extern char **environ;

#define NS_PER_MS INT64_C(1000000)
#define NS_PER_S INT64_C(1000000000)
/* After the candidates are ready, before the kill: their campaigns have
 * reached the server (a few round trips). */
#define SETTLE_NS (300 * NS_PER_MS)
/* Set-up of one candidate (a process, a client) at most. */
#define START_LIMIT_NS (30 * NS_PER_S)
#define MAX_CANDIDATES 64
#define LINE_MAX_LEN 256

struct cand {
    pid_t pid;      /* 0 = no process */
    int idx;        /* its number, as it prints it */
    int in_fd;      /* its stdin (ours to close) */
    int out_fd;     /* its stdout */
    char buf[LINE_MAX_LEN];
    size_t len;
    int ready;
    int elected;
    int64_t elected_ns;
};

struct elect_run {
    struct cand c[MAX_CANDIDATES];
    int n;                    /* slots in use */
    int next_idx;
    char self[4096];          /* this program */
    const char *engine;
    char config[4200];        /* the file the candidates read */
    char name[64];            /* the election */
    int64_t lease_ms;         /* --lease, 0 = the configuration's */
};

/* ------------------------------------------------------- candidate role */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cond; /* default clock: only waited on without a deadline */
    int eof;
    cerb_cancel *cancel;
} role = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, NULL};

/* Reads stdin to EOF (the bench closed the pipe, or died): the campaign is
 * cancelled, and a leader resigns. */
static void *stdin_watch(void *arg)
{
    char b[64];
    (void)arg;
    for (;;) {
        ssize_t r = read(0, b, sizeof b);
        if (r > 0 || (r < 0 && errno == EINTR))
            continue;
        break;
    }
    pthread_mutex_lock(&role.mu);
    role.eof = 1;
    cerb_cancel_fire(role.cancel);
    pthread_cond_broadcast(&role.cond);
    pthread_mutex_unlock(&role.mu);
    return NULL;
}

int bench_elect_candidate_main(int argc, char **argv)
{
    /* cerberus-bench --elect-candidate ENGINE CONFIG NAME IDX LEASE_MS */
    if (argc != 7) {
        fprintf(stderr, "cerberus-bench --elect-candidate: ENGINE CONFIG NAME IDX LEASE_MS\n");
        return 2;
    }
    struct bench_engine e;
    cerb_election_opts eo = CERB_ELECTION_OPTS_INIT;
    cerb_election *el = NULL;
    cerb_client *c = NULL;
    pthread_t th;
    char value[64];
    int idx = atoi(argv[5]);
    int rc = 1;

    /* Never outlive the bench (its children only: no orphan candidate). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 1;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", argv[2]);
    e.config_path = argv[3];
    eo.lease_ms = atoll(argv[6]);
    if (!(c = bench_client_open(&e)))
        return 1;
    cerb_status st = cerb_election_new(c, argv[4], &eo, &el);
    if (st == CERB_OK)
        st = cerb_cancel_new(&role.cancel);
    if (st != CERB_OK) {
        fprintf(stderr, "candidate %d: %s (%s)\n", idx, cerb_last_error(), cerb_status_name(st));
        goto done;
    }
    if (pthread_create(&th, NULL, stdin_watch, NULL) != 0) {
        fprintf(stderr, "candidate %d: cannot start a thread\n", idx);
        goto done;
    }
    pthread_detach(th);
    printf("ready %d\n", idx);
    fflush(stdout);
    snprintf(value, sizeof value, "bench-candidate-%d-%ld", idx, (long)getpid());
    st = cerb_election_campaign(el, value, strlen(value), -1, role.cancel);
    if (st == CERB_OK) {
        int64_t t = bench_now_ns();
        printf("elected %d %lld\n", idx, (long long)t);
        fflush(stdout);
        pthread_mutex_lock(&role.mu);
        while (!role.eof)
            pthread_cond_wait(&role.cond, &role.mu);
        pthread_mutex_unlock(&role.mu);
        cerb_election_resign(el);
        rc = 0;
    } else if (st == CERB_INTERRUPTED) {
        rc = 0;
    } else {
        fprintf(stderr, "candidate %d: campaign: %s (%s)\n", idx, cerb_last_error(),
                cerb_status_name(st));
    }
done:
    /* The watcher may still be reading: cancel and election stay valid
     * until exit (freeing the cancel under it would race). */
    pthread_mutex_lock(&role.mu);
    int eof = role.eof;
    pthread_mutex_unlock(&role.mu);
    if (eof) {
        cerb_election_free(el);
        cerb_client_close(c);
        cerb_cancel_free(role.cancel);
    }
    fflush(stdout);
    _exit(rc);
}

/* --------------------------------------------------------------- driver */

static int spawn_candidate(struct elect_run *r, struct cand *cd, char *err, size_t errlen)
{
    int pin[2] = {-1, -1}, pout[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    char idx[16], lease[32];
    char *argv[] = {r->self, "--elect-candidate", (char *)r->engine, r->config, r->name,
                    idx, lease, NULL};
    pid_t pid;

    memset(cd, 0, sizeof *cd);
    cd->in_fd = cd->out_fd = -1;
    cd->idx = r->next_idx++;
    snprintf(idx, sizeof idx, "%d", cd->idx);
    snprintf(lease, sizeof lease, "%lld", (long long)r->lease_ms);
    /* Close-on-exec, so no other candidate inherits these ends (the bench
     * starts candidates from one thread). */
    if (pipe(pin) != 0 || pipe(pout) != 0 || fcntl(pin[0], F_SETFD, FD_CLOEXEC) ||
        fcntl(pin[1], F_SETFD, FD_CLOEXEC) || fcntl(pout[0], F_SETFD, FD_CLOEXEC) ||
        fcntl(pout[1], F_SETFD, FD_CLOEXEC)) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (pin[i] >= 0)
                close(pin[i]);
            if (pout[i] >= 0)
                close(pout[i]);
        }
        return -1;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    int e = posix_spawn(&pid, r->self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pin[0]);
    close(pout[1]);
    if (e != 0) {
        snprintf(err, errlen, "cannot run %.200s: %s", r->self, strerror(e));
        close(pin[1]);
        close(pout[0]);
        return -1;
    }
    cd->pid = pid;
    cd->in_fd = pin[1];
    cd->out_fd = pout[0];
    return 0;
}

/* Stop @cd: EOF on its stdin (it resigns and exits), then SIGKILL by PID
 * after @grace_ns; reaped either way. */
static void stop_candidate(struct cand *cd, int64_t grace_ns)
{
    if (cd->in_fd >= 0)
        close(cd->in_fd);
    cd->in_fd = -1;
    if (cd->pid > 0) {
        int64_t end = bench_now_ns() + grace_ns;
        int ws;
        while (waitpid(cd->pid, &ws, WNOHANG) == 0) {
            if (bench_now_ns() >= end) {
                kill(cd->pid, SIGKILL); /* our unreaped child: its PID is ours */
                waitpid(cd->pid, &ws, 0);
                break;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        cd->pid = 0;
    }
    if (cd->out_fd >= 0)
        close(cd->out_fd);
    cd->out_fd = -1;
}

/* One line of candidate @cd. Returns 0, or -1 when it makes no sense. */
static int on_line(struct cand *cd, const char *line)
{
    int i;
    long long t;
    if (sscanf(line, "ready %d", &i) == 1 && i == cd->idx) {
        cd->ready = 1;
        return 0;
    }
    if (sscanf(line, "elected %d %lld", &i, &t) == 2 && i == cd->idx) {
        cd->elected = 1;
        cd->elected_ns = t;
        return 0;
    }
    return -1;
}

/*
 * Read what the candidates say until @done(r, arg) holds or @deadline_ns.
 * Returns 0 when it holds; -1 on the deadline or when a candidate's pipe
 * closed (it died: a failure, message in @err) other than @killed.
 */
static int pump(struct elect_run *r, int64_t deadline_ns, int (*done)(struct elect_run *, void *),
                void *arg, const struct cand *killed, char *err, size_t errlen)
{
    for (;;) {
        if (done(r, arg))
            return 0;
        int64_t now = bench_now_ns();
        if (now >= deadline_ns) {
            snprintf(err, errlen, "timed out waiting for the candidates");
            return -1;
        }
        struct pollfd pf[MAX_CANDIDATES];
        struct cand *who[MAX_CANDIDATES];
        int n = 0;
        for (int i = 0; i < r->n; i++)
            if (r->c[i].out_fd >= 0 && &r->c[i] != killed) {
                pf[n] = (struct pollfd){.fd = r->c[i].out_fd, .events = POLLIN};
                who[n++] = &r->c[i];
            }
        int ms = (int)((deadline_ns - now) / NS_PER_MS) + 1;
        int p = poll(pf, (nfds_t)n, ms > 1000 ? 1000 : ms);
        if (p < 0 && errno != EINTR) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            return -1;
        }
        for (int k = 0; p > 0 && k < n; k++) {
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            struct cand *cd = who[k];
            ssize_t got = read(cd->out_fd, cd->buf + cd->len, sizeof cd->buf - 1 - cd->len);
            if (got <= 0) {
                snprintf(err, errlen, "candidate %d (pid %ld) exited unexpectedly", cd->idx,
                         (long)cd->pid);
                return -1;
            }
            cd->len += (size_t)got;
            cd->buf[cd->len] = '\0';
            char *nl;
            while ((nl = strchr(cd->buf, '\n')) != NULL) {
                *nl = '\0';
                if (on_line(cd, cd->buf) != 0) {
                    snprintf(err, errlen, "candidate %d said \"%.100s\"", cd->idx, cd->buf);
                    return -1;
                }
                size_t rest = cd->len - (size_t)(nl + 1 - cd->buf);
                memmove(cd->buf, nl + 1, rest + 1);
                cd->len = rest;
            }
            if (cd->len == sizeof cd->buf - 1) {
                snprintf(err, errlen, "candidate %d: line too long", cd->idx);
                return -1;
            }
        }
    }
}

static int all_ready_one_leader(struct elect_run *r, void *arg)
{
    int leaders = 0;
    (void)arg;
    for (int i = 0; i < r->n; i++) {
        if (r->c[i].pid && !r->c[i].ready)
            return 0;
        leaders += r->c[i].pid && r->c[i].elected;
    }
    return leaders >= 1;
}

static int all_ready(struct elect_run *r, void *arg)
{
    (void)arg;
    for (int i = 0; i < r->n; i++)
        if (r->c[i].pid && !r->c[i].ready)
            return 0;
    return 1;
}

/* A candidate other than *arg (the killed one) was elected. */
static int new_leader(struct elect_run *r, void *arg)
{
    const struct cand *killed = arg;
    for (int i = 0; i < r->n; i++)
        if (&r->c[i] != killed && r->c[i].pid && r->c[i].elected)
            return 1;
    return 0;
}

static struct cand *leader_of(struct elect_run *r)
{
    for (int i = 0; i < r->n; i++)
        if (r->c[i].pid && r->c[i].elected)
            return &r->c[i];
    return NULL;
}

/* The term's bound on engine @e: what ends a dead leader's term there. */
static int64_t bound_ms_of(const struct bench_engine *e, int64_t lease_ms, char *what,
                           size_t len)
{
    const struct cerb_config *cfg = e->cfg;
    if (strcmp(e->name, "zk") == 0) {
        snprintf(what, len, "zk.session_timeout_ms %lld", (long long)cfg->zk.session_timeout_ms);
        return cfg->zk.session_timeout_ms;
    }
    if (strcmp(e->name, "etcd") == 0) {
        snprintf(what, len, "etcd.session_ttl_s %lld (the session lease)",
                 (long long)cfg->etcd.session_ttl_s);
        return cfg->etcd.session_ttl_s * 1000;
    }
    if (lease_ms > 0) {
        snprintf(what, len, "lease %lld ms (--lease)", (long long)lease_ms);
        return lease_ms;
    }
    snprintf(what, len, "lock.lease_ms %lld", (long long)cfg->lock.lease_ms);
    return cfg->lock.lease_ms;
}

int64_t bench_elect_bound_ms(const struct bench_engine *e, int64_t lease_ms)
{
    char what[96];
    return bound_ms_of(e, lease_ms, what, sizeof what);
}

/* One RTT p50 in microseconds (a short PING phase), or -1 without a
 * ceiling. */
static double measure_rtt_us(const struct bench_engine *e, int progress)
{
    const struct bench_ceiling *ceil = bench_ceiling_find(bench_engine_label(e));
    struct bench_rtt_ctx rc = {ceil, NULL};
    void *ctxp[1] = {&rc};
    struct bench_hist hist, acc;
    char err[BENCH_ERR_MAX];
    double us = -1;

    if (!ceil || !ceil->round_trip || !(rc.sess = ceil->open(e, err, sizeof err)))
        return -1;
    bench_hist_init(&acc);
    if (bench_run_and_merge("elect-failover round trip", 1, 300 * NS_PER_MS, bench_rtt_body,
                            ctxp, NULL, &hist, &acc, NULL, progress) == 0 && acc.n)
        us = (double)bench_hist_quantile(&acc, 0.5) / 1e3;
    ceil->close(rc.sess);
    return us;
}

/* The bench's own path, for re-executing it. */
static int self_path(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

int bench_elect_failover(const struct bench_engine *e, const struct bench_opts *o,
                         struct bench_result *out)
{
    struct elect_run *r = calloc(1, sizeof *r);
    char tmpdir[64] = "", err[BENCH_ERR_MAX] = "";
    double fo_ms[BENCH_ELECT_MAX_ROUNDS], sorted[BENCH_ELECT_MAX_ROUNDS];
    const int k = o->candidates, rounds = o->elect_rounds;
    int rv = -1, done_rounds = 0;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "elect-failover");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = k;
    out->candidates = k;
    out->ratio = out->ratio_paired_median = -1;
    if (!r) {
        bench_errorf("out of memory");
        return -1;
    }
    if (strcmp(e->name, "local") == 0) {
        snprintf(out->note, sizeof out->note,
                 "skipped: the local engine's elections live in one process; no "
                 "candidate in another can be elected");
        free(r);
        return 0;
    }
    if (k < 2 || k > MAX_CANDIDATES / 2 || rounds < 1 || rounds > BENCH_ELECT_MAX_ROUNDS) {
        bench_errorf("elect-failover: --candidates 2..%d, --rounds 1..%d", MAX_CANDIDATES / 2,
                     BENCH_ELECT_MAX_ROUNDS);
        free(r);
        return -1;
    }
    r->engine = e->name;
    r->lease_ms = o->elect_lease_ms;
    out->bound_ms = bound_ms_of(e, r->lease_ms, out->bound_what, sizeof out->bound_what);
    out->lease_ms = out->bound_ms;
    out->rounds = rounds;
    snprintf(r->name, sizeof r->name, "bench-elect-%ld", (long)getpid());
    if (self_path(r->self, sizeof r->self) != 0) {
        bench_errorf("elect-failover: cannot find this program (/proc/self/exe)");
        goto done;
    }
    if (e->config_path) {
        snprintf(r->config, sizeof r->config, "%s", e->config_path);
    } else {
        /* The built-in configuration, in a file the candidates can read. */
        snprintf(tmpdir, sizeof tmpdir, "/tmp/cerb-bench-elect-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            bench_errorf("elect-failover: mkdtemp: %s", strerror(errno));
            tmpdir[0] = '\0';
            goto done;
        }
        snprintf(r->config, sizeof r->config, "%s/cerberus.cfg", tmpdir);
        FILE *f = fopen(r->config, "w");
        if (!f || fputs(e->config_text, f) < 0 || fclose(f) != 0) {
            bench_errorf("elect-failover: cannot write %s", r->config);
            goto done;
        }
    }
    out->rtt_us = measure_rtt_us(e, o->progress);
    const int64_t bound_ns = out->bound_ms * NS_PER_MS;
    const int64_t wait_ns = 3 * bound_ns + 10 * NS_PER_S;

    for (int i = 0; i < k; i++) {
        if (spawn_candidate(r, &r->c[r->n], err, sizeof err) != 0) {
            bench_errorf("elect-failover: %s", err);
            goto done;
        }
        r->n++;
    }
    bench_progress(o->progress, "elect-failover %s: %d candidates starting", e->name, k);
    if (pump(r, bench_now_ns() + START_LIMIT_NS + wait_ns, all_ready_one_leader, NULL, NULL, err,
             sizeof err) != 0) {
        bench_errorf("elect-failover %s: first leader: %s", e->name, err);
        goto done;
    }
    for (int round = 1; round <= rounds; round++) {
        struct cand *ld = leader_of(r);
        struct timespec ts = {0, SETTLE_NS};
        nanosleep(&ts, NULL);
        bench_progress(o->progress, "elect-failover %s: round %d/%d, killing the leader "
                                    "(candidate %d)", e->name, round, rounds, ld->idx);
        int64_t t_kill = bench_now_ns();
        kill(ld->pid, SIGKILL); /* our unreaped child */
        if (pump(r, t_kill + wait_ns, new_leader, ld, ld, err, sizeof err) != 0) {
            bench_errorf("elect-failover %s: round %d: no new leader within %.1f s: %s", e->name,
                         round, (double)wait_ns / 1e9, err);
            goto done;
        }
        struct cand *nl = NULL;
        for (int i = 0; i < r->n; i++)
            if (&r->c[i] != ld && r->c[i].pid && r->c[i].elected)
                nl = &r->c[i];
        fo_ms[done_rounds++] = (double)(nl->elected_ns - t_kill) / 1e6;
        stop_candidate(ld, 0); /* already dead: reaped */
        /* A new candidate in its slot, so K stand for the next round. */
        if (round < rounds) {
            if (spawn_candidate(r, ld, err, sizeof err) != 0) {
                bench_errorf("elect-failover: %s", err);
                goto done;
            }
            if (pump(r, bench_now_ns() + START_LIMIT_NS, all_ready, NULL, NULL, err,
                     sizeof err) != 0) {
                bench_errorf("elect-failover %s: a new candidate: %s", e->name, err);
                goto done;
            }
        }
    }
    bench_progress_clear();

    double sum = 0;
    for (int i = 0; i < done_rounds; i++) {
        sum += fo_ms[i];
        sorted[i] = fo_ms[i];
        out->failover_ms[i] = fo_ms[i];
    }
    double med = bench_median(sorted, done_rounds);
    double mx = sorted[done_rounds - 1];
    out->elapsed_s = sum / 1e3;
    out->ops = (uint64_t)done_rounds;
    out->ops_per_s = sum > 0 ? done_rounds / (sum / 1e3) : 0;
    out->p50_us = out->p90_us = med * 1e3;
    out->p99_us = out->max_us = mx * 1e3;
    out->mean_us = sum / done_rounds * 1e3;
    out->ceiling_kind = "bound";
    out->ceiling_p50_us = out->ceiling_p99_us = out->ceiling_max_us =
        (double)out->bound_ms * 1e3 + (out->rtt_us > 0 ? out->rtt_us : 0);
    out->ratio = med * 1e3 / out->ceiling_p50_us;
    rv = 0;
done:
    bench_progress_clear();
    for (int i = 0; i < r->n; i++)
        stop_candidate(&r->c[i], 3 * NS_PER_S);
    if (tmpdir[0]) {
        unlink(r->config);
        rmdir(tmpdir);
    }
    free(r);
    return rv;
}
