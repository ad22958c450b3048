/*
 * scenario_switch.c — the `switch` scenario: what an operator's switch
 * costs once it is done (DESIGN.md §5; §10: in steady state at least 0.9 ×
 * the same engine alone).
 *
 * Two clients run side by side on engine X.
 *
 * The switched client is opened on a copy of the configuration, in a fresh
 * temporary directory ($TMPDIR, else /tmp), that lists every engine (the -c file's text, or the
 * built-in redis, zk, etcd file) and says active = "auto" (the copy is put
 * there with `cerberus switch auto` first when it says otherwise). It
 * follows the file as any running client does: its watcher reloads it, or,
 * when the file turns failover.watch_config off, the bench calls
 * cerb_client_reload() after the command, as such a process's operator
 * would have to. The bench then runs `cerberus -c COPY switch X` — the
 * operator's command itself, so the rewrite, the epoch bump and the atomic
 * rename are the command's and never an imitation that could drift from it
 * — and waits until the client reports X as current at the file's new
 * epoch. It then lets the switch settle for twice the longest a hold taken
 * before it may live on any listed engine (lock.lease_ms, the zk session
 * timeout, the etcd session TTL, or a longer positive switch_grace_ms), from
 * the moment the command returned: whatever the library still owes to
 * holds older than the switch is over by then, and what is measured is the
 * cost that stays. The built-in file has a lease of 1000 ms, zk sessions of
 * 1000 ms and etcd's least TTL, 2 s, so it settles in 4 s.
 *
 * The alone client parses the same configuration and keeps only X in its
 * engine list (and no file to follow): the same servers and settings with
 * nothing else configured.
 *
 * Each round (each engine, each run) and each of its two clients works in
 * namespaces of its own (switch_ns.c): redis.prefix, zk.root and
 * etcd.prefix nested in the file's under a name no one else uses. The
 * switched client leaves permanent closure records at the copy's new epoch
 * there, which would refuse the next round (another engine active at the
 * same epoch) and every later run on shared namespaces; the alone client's
 * are clean, so it measures the engine with no switch in its history, as a
 * file with that one engine has. What the round wrote there is removed
 * once its clients are closed (best effort).
 *
 * Each thread loops trylock + unlock over 16 names of its own, different on
 * the two sides, so that the unlock of a name has long finished (on every
 * engine it touched) before the same thread tries it again. A cycle is
 * timed from before the try to after the unlock; a try answered BUSY is
 * counted, not timed. The sides alternate in rounds of about half a second,
 * alone first, after an unmeasured warm-up of each, as uncontended does
 * with its raw ceiling: machine noise, which comes in regimes lasting
 * seconds here, is then as likely to hit either side. The row gives the
 * switched rate, the alone rate in the ceiling column (kind "alone"), and
 * their ratio, whole and per round. The switched client must still be on X
 * when the rounds end, or the run failed (a breaker moved it).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h" /* the copy's epoch, the alone client's engine list */
#include "scenarios.h"

extern char **environ;

#define SW_NAMES 16
#define NS_PER_MS INT64_C(1000000)
/* `cerberus switch` edits one small file; far longer means it hung. */
#define SW_CLI_TIMEOUT_NS (30 * INT64_C(1000000000))
/* From the command's return until the client reports the new epoch: a
 * watcher reacts at once (inotify) or within 250 ms (polling). */
#define SW_FOLLOW_NS (10 * INT64_C(1000000000))
/* A switch to the engine already current changes the epoch only, and no
 * callback tells of that: the wait looks again this often. */
#define SW_RECHECK_NS (20 * NS_PER_MS)
#define SW_MAX_CONFIG_BYTES (1024 * 1024)

struct sw_ctx {
    cerb_lock *locks[SW_NAMES];
    int next;
    uint64_t busy; /* tries answered BUSY, this phase and all before */
};

static void *sw_body(void *p)
{
    struct bench_worker *w = p;
    struct sw_ctx *c = w->ctx;
    uint64_t n = 0;
    int64_t t0 = bench_now_ns();

    for (;;) {
        cerb_lock *l = c->locks[c->next];
        c->next = (c->next + 1) % SW_NAMES;
        cerb_status st = cerb_lock_trylock(l);
        if (st == CERB_BUSY) {
            c->busy++;
            t0 = bench_now_ns();
            if (bench_worker_done(w, t0))
                break;
            continue;
        }
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "trylock", l, st);
            break;
        }
        st = cerb_lock_unlock(l);
        if (st != CERB_OK) {
            bench_worker_fail_lock(w, "unlock", l, st);
            break;
        }
        if (bench_worker_lap(w, &t0, &n))
            break;
    }
    w->end_ns = t0;
    return NULL;
}

/* The switch callback's news, for the wait after the command. */
struct sw_news {
    struct bench_sync sync;
    unsigned switches;
};

static void sw_on_switch(const char *from, const char *to, const char *why, void *ud)
{
    struct sw_news *nw = ud;
    (void)from;
    (void)to;
    (void)why;
    pthread_mutex_lock(&nw->sync.mu);
    nw->switches++;
    pthread_cond_broadcast(&nw->sync.cond);
    pthread_mutex_unlock(&nw->sync.mu);
}

/* Run `CLI -c PATH switch TARGET` with its stdout discarded (its errors
 * stay on stderr), bounded by SW_CLI_TIMEOUT_NS. Returns 0 when it exited
 * with status 0, else -1 (printed). */
static int run_switch(const char *cli, const char *path, const char *target)
{
    char *argv[] = {(char *)cli, "-c", (char *)path, "switch", (char *)target, NULL};
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int ws = 0;

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    int err = posix_spawnp(&pid, cli, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err) {
        bench_errorf("switch: cannot run %s: %s (--cli PATH or $CERB_BENCH_CLI names the "
                     "`cerberus` command)", cli, strerror(err));
        return -1;
    }
    /* A pidfd turns readable when the child ends: its exit is an event
     * with a deadline, not something looked for in a loop. Without one
     * (kernels before 5.3) the wait is unbounded, but the command only
     * edits a file. */
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        int64_t deadline = bench_now_ns() + SW_CLI_TIMEOUT_NS;
        struct pollfd pf = {pfd, POLLIN, 0};
        int r;
        do {
            int64_t left_ms = (deadline - bench_now_ns()) / NS_PER_MS;
            r = poll(&pf, 1, left_ms > 0 ? (int)left_ms : 0);
        } while (r < 0 && errno == EINTR);
        close(pfd);
        if (r == 0) {
            kill(pid, SIGKILL); /* our own child, by its PID */
            waitpid(pid, &ws, 0);
            bench_errorf("switch: `%s -c %s switch %s` still running after %.0f s; killed",
                         cli, path, target, (double)SW_CLI_TIMEOUT_NS / 1e9);
            return -1;
        }
    }
    while (waitpid(pid, &ws, 0) < 0) {
        if (errno != EINTR) {
            bench_errorf("switch: waitpid: %s", strerror(errno));
            return -1;
        }
    }
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        bench_errorf("switch: `%s -c %s switch %s` failed (%s %d)", cli, path, target,
                     WIFEXITED(ws) ? "exit status" : "signal",
                     WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
        return -1;
    }
    return 0;
}

/* The text of the configuration to switch: the -c file's bytes or the
 * built-in text (malloc'd), or NULL (printed). */
static char *source_text(const struct bench_switch_opts *so)
{
    if (!so->config_path) {
        char *t = strdup(so->config_text);
        if (!t)
            bench_errorf("out of memory");
        return t;
    }
    FILE *f = fopen(so->config_path, "r");
    if (!f) {
        bench_errorf("switch: %s: %s", so->config_path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(SW_MAX_CONFIG_BYTES + 1);
    size_t n = buf ? fread(buf, 1, SW_MAX_CONFIG_BYTES + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad || n > SW_MAX_CONFIG_BYTES) {
        bench_errorf("switch: %s: %s", so->config_path,
                     !buf ? "out of memory" : bad ? "read error" : "larger than 1 MiB");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) == EOF) {
        bench_errorf("switch: cannot write %s: %s", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    if (fclose(f) != 0) {
        bench_errorf("switch: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Remove the scratch directory made by mkdtemp and what is in it (the
 * copy, and any temporary file a failed switch left). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[sizeof ((struct dirent *)0)->d_name + 260];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        fprintf(stderr, "cerberus-bench: note: could not remove %s: %s\n", dir, strerror(errno));
}

/* The longest a hold granted before the switch can live on any engine of
 * @cfg: what the library's default grace is built from, or a longer
 * positive switch_grace_ms. */
static int64_t hold_life_ms(const struct cerb_config *cfg)
{
    int64_t m = cfg->lock.lease_ms;
    for (size_t i = 0; i < cfg->n_engines; i++) {
        if (strcmp(cfg->engines[i], "zk") == 0 && cfg->zk.session_timeout_ms > m)
            m = cfg->zk.session_timeout_ms;
        if (strcmp(cfg->engines[i], "etcd") == 0 && cfg->etcd.session_ttl_s * 1000 > m)
            m = cfg->etcd.session_ttl_s * 1000;
    }
    if (cfg->failover.switch_grace_ms > m)
        m = cfg->failover.switch_grace_ms;
    return m;
}

/* The engine alone: the source configuration in the alone namespaces
 * @ns with only @engine listed, following no file. Returns the client, or
 * NULL (printed). */
static cerb_client *open_alone(const struct bench_ns *ns, const char *engine)
{
    struct cerb_config *cfg = NULL;
    cerb_client *c = NULL;
    cerb_status st = cerb__config_from_string(ns->text, &cfg);
    if (st == CERB_OK) {
        cerb__config_forget_path(cfg);
        snprintf(cfg->engines[0], sizeof cfg->engines[0], "%s", engine);
        cfg->n_engines = 1;
        snprintf(cfg->active, sizeof cfg->active, "auto");
        st = cerb__client_open_config(&c, cfg);
    }
    if (st != CERB_OK) {
        bench_errorf("switch: cannot open a client with engines = (\"%s\") only: %s (%s)",
                     engine, cerb_last_error(), cerb_status_name(st));
        return NULL;
    }
    if (strcmp(cerb_engine_current(c), engine) != 0) {
        bench_errorf("switch: engine %s did not open alone (the client is on %s)", engine,
                     cerb_engine_current(c));
        cerb_client_close(c);
        return NULL;
    }
    return c;
}

/* Whether @c sends new acquisitions to @engine at @epoch. */
static int follows(cerb_client *c, const char *engine, int64_t epoch)
{
    struct cerb_engine_info info;
    const char *cur = cerb_engine_current(c);
    return cur && strcmp(cur, engine) == 0 &&
           cerb_engine_info(c, engine, &info) == CERB_OK && info.epoch == epoch;
}

/* The gate's questions @c asked so far of every engine in @list (a comma
 * list) but @engine: "is this name free there?" before a grant on @engine. */
static uint64_t questions_elsewhere(cerb_client *c, const char *list, const char *engine)
{
    char copy[64];
    uint64_t n = 0;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        struct cerb_engine_info info;
        if (strcmp(tok, engine) != 0 && cerb_engine_info(c, tok, &info) == CERB_OK)
            n += info.gate_questions;
    }
    return n;
}

/* @threads contexts of 16 locks each on @c, named "bench-<tag>-<pid>-<t>-<i>".
 * Returns 0, or -1 (printed). */
static int make_locks(cerb_client *c, const char *tag, struct sw_ctx *ctxs, int threads)
{
    for (int t = 0; t < threads; t++)
        for (int i = 0; i < SW_NAMES; i++) {
            char name[64];
            snprintf(name, sizeof name, "bench-%s-%ld-%d-%d", tag, (long)getpid(), t, i);
            cerb_status st = cerb_lock_new(c, name, NULL, &ctxs[t].locks[i]);
            if (st != CERB_OK) {
                bench_errorf("cerb_lock_new(\"%s\"): %s (%s)", name, cerb_last_error(),
                             cerb_status_name(st));
                return -1;
            }
        }
    return 0;
}

static void free_locks(struct sw_ctx *ctxs, int threads)
{
    for (int t = 0; ctxs && t < threads; t++)
        for (int i = 0; i < SW_NAMES; i++)
            cerb_lock_free(ctxs[t].locks[i]);
}

/*
 * Switch the copy at @path to @e->name and wait until @c follows: the
 * command, the client at the file's new epoch, then the settling time.
 * Fills the switch fields of @out. Returns 0, or -1 (printed).
 */
static int switch_and_settle(const struct bench_engine *e, const struct bench_opts *o,
                             const char *path, cerb_client *c, struct sw_news *nw,
                             struct bench_result *out)
{
    struct cerb_engine_info info;
    struct cerb_config *cfg = NULL;

    snprintf(out->sw_from, sizeof out->sw_from, "%s", cerb_engine_current(c));
    if (cerb_engine_info(c, NULL, &info) == CERB_OK)
        out->sw_epoch_before = info.epoch;
    if (run_switch(o->sw.cli, path, e->name) != 0)
        return -1;
    int64_t changed_ns = bench_now_ns();
    if (cerb__config_from_file(path, &cfg) != CERB_OK) {
        bench_errorf("switch: %s after the switch: %s", path, cerb_last_error());
        return -1;
    }
    out->sw_epoch_after = cfg->epoch;
    out->sw_hold_ms = hold_life_ms(cfg);
    out->sw_settle_ms = 2 * out->sw_hold_ms;
    out->lease_ms = cfg->lock.lease_ms;
    int watching = cfg->failover.watch_config;
    cerb__config_free(cfg);
    if (!watching) {
        cerb_status st = cerb_client_reload(c);
        if (st != CERB_OK) {
            bench_errorf("switch: cerb_client_reload: %s (%s)", cerb_last_error(),
                         cerb_status_name(st));
            return -1;
        }
    }

    /* The client reports the engine and the epoch the file now says. */
    int64_t deadline = changed_ns + SW_FOLLOW_NS;
    unsigned seen = 0;
    while (!follows(c, e->name, out->sw_epoch_after)) {
        int64_t now = bench_now_ns();
        if (now >= deadline) {
            const char *cur = cerb_engine_current(c);
            bench_errorf("switch: the client is on %s at epoch %lld %.0f s after `cerberus "
                         "switch %s` (epoch %lld); is the server of %s up?",
                         cur ? cur : "?",
                         cerb_engine_info(c, NULL, &info) == CERB_OK ? (long long)info.epoch : -1LL,
                         (double)SW_FOLLOW_NS / 1e9, e->name, (long long)out->sw_epoch_after,
                         e->name);
            return -1;
        }
        pthread_mutex_lock(&nw->sync.mu);
        if (nw->switches == seen)
            bench_sync_wait_until(&nw->sync, now + SW_RECHECK_NS < deadline
                                                 ? now + SW_RECHECK_NS : deadline);
        seen = nw->switches;
        pthread_mutex_unlock(&nw->sync.mu);
    }

    /* Settling is a span of time by definition (holds older than the
     * switch run out), not a state to wait for. */
    int64_t settled = changed_ns + out->sw_settle_ms * NS_PER_MS;
    pthread_mutex_lock(&nw->sync.mu);
    for (;;) {
        int64_t now = bench_now_ns();
        if (now >= settled)
            break;
        bench_progress(o->progress, "switch %s: settling, %.1f s left", e->name,
                       (double)(settled - now) / 1e9);
        int64_t tick = now + 250 * NS_PER_MS;
        bench_sync_wait_until(&nw->sync, tick < settled ? tick : settled);
    }
    pthread_mutex_unlock(&nw->sync.mu);
    bench_progress_clear();
    return 0;
}

int bench_switch(const struct bench_engine *e, const struct bench_opts *o, int threads,
                 struct bench_result *out)
{
    struct sw_ctx *sw = calloc((size_t)threads, sizeof *sw);
    struct sw_ctx *al = calloc((size_t)threads, sizeof *al);
    void **swp = calloc((size_t)threads, sizeof *swp), **alp = calloc((size_t)threads, sizeof *alp);
    struct bench_hist *hists = calloc((size_t)threads, sizeof *hists);
    struct bench_hist *lib = malloc(sizeof *lib), *alone = malloc(sizeof *alone);
    struct bench_hist *one = malloc(sizeof *one); /* one alone round */
    cerb_client *sc = NULL, *ac = NULL;
    struct bench_ns nss = {.cfg = NULL}, nsa = {.cfg = NULL}; /* switched, alone */
    struct sw_news nw = {.switches = 0};
    int have_sync = 0;
    char dir[256], path[sizeof dir + 16], label[96];
    int have_dir = 0;
    char *text = NULL;
    int64_t sw_ns = 0, al_ns = 0;
    const int rounds = bench_rounds_for(o->duration_s);
    const int64_t side_ns = (int64_t)(o->duration_s * 1e9 / rounds);
    double paired[BENCH_MAX_ROUNDS];
    int n_paired = 0, rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(out->scenario, sizeof out->scenario, "switch");
    snprintf(out->engine, sizeof out->engine, "%s", bench_engine_label(e));
    out->threads = threads;
    out->ratio = out->ratio_paired_median = -1;
    if (!sw || !al || !swp || !alp || !hists || !lib || !alone || !one) {
        bench_errorf("out of memory");
        goto done;
    }
    bench_hist_init(lib);
    bench_hist_init(alone);
    if (bench_sync_init(&nw.sync) != 0)
        goto done;
    have_sync = 1;

    /* The copy the command switches: this run's own, so the file given
     * with -c is never rewritten. */
    if (!(text = source_text(&o->sw)))
        goto done;
    /* Namespaces of the round's own, ready before anything opens there:
     * `cerberus switch` itself writes records. */
    {
        unsigned round = bench_ns_round();
        const char *what = o->sw.config_path ? o->sw.config_path : "the built-in file";
        if (bench_ns_make(&nss, text, round, "sw", what) != 0 ||
            bench_ns_make(&nsa, text, round, "alone", what) != 0 ||
            bench_ns_prepare(&nss, NULL) != 0 || bench_ns_prepare(&nsa, e->name) != 0)
            goto done;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/cerb-bench-switch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        bench_errorf("switch: mkdtemp: %s", strerror(errno));
        goto done;
    }
    have_dir = 1;
    snprintf(path, sizeof path, "%s/cerberus.cfg", dir);
    if (write_file(path, nss.text) != 0 || run_switch(o->sw.cli, path, "auto") != 0)
        goto done;
    {
        struct cerb_config *cfg = NULL;
        if (cerb__config_from_file(path, &cfg) != CERB_OK) {
            bench_errorf("switch: %s", cerb_last_error());
            goto done;
        }
        size_t k = 0;
        out->sw_engines[0] = '\0';
        for (size_t i = 0; i < cfg->n_engines; i++) {
            size_t len = strlen(out->sw_engines);
            snprintf(out->sw_engines + len, sizeof out->sw_engines - len, "%s%s",
                     i ? "," : "", cfg->engines[i]);
            k += strcmp(cfg->engines[i], e->name) == 0;
        }
        size_t n_engines = cfg->n_engines;
        cerb__config_free(cfg);
        if (k == 0 || n_engines < 2) {
            bench_errorf("switch: the configuration must list %s and at least one other "
                         "engine (it lists %s)", e->name, out->sw_engines);
            goto done;
        }
    }

    cerb_status st = cerb_client_open(&sc, path);
    if (st != CERB_OK) {
        bench_errorf("switch: cannot open a client on %s: %s (%s)", path, cerb_last_error(),
                     cerb_status_name(st));
        goto done;
    }
    if (cerb_client_on_switch(sc, sw_on_switch, &nw) != CERB_OK ||
        !(ac = open_alone(&nsa, e->name)))
        goto done;
    if (make_locks(sc, "sw", sw, threads) != 0 || make_locks(ac, "sa", al, threads) != 0)
        goto done;
    for (int i = 0; i < threads; i++) {
        swp[i] = &sw[i];
        alp[i] = &al[i];
    }
    if (switch_and_settle(e, o, path, sc, &nw, out) != 0)
        goto done;

    snprintf(label, sizeof label, "switch %s x%d warm-up", e->name, threads);
    if (bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s), sw_body, alp, NULL,
                            hists, NULL, NULL, o->progress) != 0 ||
        bench_run_and_merge(label, threads, bench_warmup_ns(o->duration_s), sw_body, swp, NULL,
                            hists, NULL, NULL, o->progress) != 0)
        goto done;
    for (int i = 0; i < threads; i++)
        sw[i].busy = al[i].busy = 0;
    /* The warm-up asked each name once; in steady state no more questions
     * are due (the full gate would ask twice per engine per acquisition). */
    uint64_t q_before = questions_elsewhere(sc, out->sw_engines, e->name);

    for (int round = 1; round <= rounds; round++) {
        int64_t al_before = al_ns, sw_before = sw_ns;
        uint64_t lib_before = lib->n;
        snprintf(label, sizeof label, "switch %s x%d alone %d/%d", e->name, threads, round,
                 rounds);
        bench_hist_init(one);
        if (bench_run_and_merge(label, threads, side_ns, sw_body, alp, NULL, hists, one, &al_ns,
                                o->progress) != 0)
            goto done;
        bench_hist_merge(alone, one);
        bench_note_round_p50(out, one);
        snprintf(label, sizeof label, "switch %s x%d switched %d/%d", e->name, threads, round,
                 rounds);
        if (bench_run_and_merge(label, threads, side_ns, sw_body, swp, NULL, hists, lib, &sw_ns,
                                o->progress) != 0)
            goto done;
        if (one->n && al_ns > al_before && sw_ns > sw_before && lib->n > lib_before)
            paired[n_paired++] = ((double)(lib->n - lib_before) / (double)(sw_ns - sw_before)) /
                                 ((double)one->n / (double)(al_ns - al_before));
    }
    if (!follows(sc, e->name, out->sw_epoch_after)) {
        bench_errorf("switch: the switched client left %s during the rounds (now on %s)",
                     e->name, cerb_engine_current(sc));
        goto done;
    }
    out->ratio_paired_median = bench_median(paired, n_paired);
    out->sw_questions = questions_elsewhere(sc, out->sw_engines, e->name) - q_before;
    for (int i = 0; i < threads; i++) {
        out->sw_busy += sw[i].busy;
        out->sw_busy_alone += al[i].busy;
    }
    out->elapsed_s = (double)sw_ns / 1e9;
    out->ops = lib->n;
    out->ops_per_s = sw_ns > 0 ? (double)lib->n / out->elapsed_s : 0;
    bench_fill_latency(out, lib);
    if (al_ns > 0) {
        out->ceiling_kind = "alone";
        out->ceiling_ops_per_s = (double)alone->n / ((double)al_ns / 1e9);
        bench_fill_ceiling_latency(out, alone);
        if (out->ceiling_ops_per_s > 0)
            out->ratio = out->ops_per_s / out->ceiling_ops_per_s;
    }
    rc = 0;

done:
    free_locks(sw, threads);
    free_locks(al, threads);
    cerb_client_close(sc);
    cerb_client_close(ac);
    /* Nothing of the round's is open any more: no record is written back. */
    bench_ns_remove(&nss, NULL);
    bench_ns_remove(&nsa, e->name);
    bench_ns_free(&nss);
    bench_ns_free(&nsa);
    if (have_dir)
        remove_dir(dir);
    if (have_sync)
        bench_sync_destroy(&nw.sync);
    free(text);
    free(sw);
    free(al);
    free(swp);
    free(alp);
    free(hists);
    free(lib);
    free(alone);
    free(one);
    return rc;
}
