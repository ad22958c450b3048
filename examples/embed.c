/*
 * embed.c — Cerberus embedded in a program: several processes contend for one
 * lock and prove they never overlap.
 *
 *   embed [-c CFG] [-n PROCS] [-i ITER] [-t HOLD_MS] [-w WAIT_MS] NAME
 *
 * The parent forks PROCS children. Each opens its own client (a client is
 * per process: never share one across fork), makes a handle for NAME, and
 * ITER times: acquires it (waiting at most WAIT_MS), prints
 * "pid P holds NAME token T", reads a shared counter from a temporary file,
 * keeps the lock HOLD_MS (standing in for real work, and widening the window
 * in which an overlapping holder would be caught), writes counter + 1 back and
 * releases. The counter is a plain read-modify-write with a gap in the middle,
 * so any two holders at once would lose an update: the final value equals
 * PROCS × ITER only if the lock excluded them. Alongside the counter the file
 * keeps the last fencing token, and each holder checks that its token is
 * larger (fencing tokens strictly increase per name across grants).
 *
 * Configuration: -c FILE, else $CERBERUS_CONFIG, else ./cerberus.cfg, else
 * /etc/cerberus/cerberus.cfg (the lookup order of the cerberus tools); with
 * none, the "local" engine over flock files in a temporary directory, which
 * excludes processes on this host.
 *
 * Exit status: 0 when every child succeeded and the count is right, 1
 * otherwise, 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

#include <cerberus.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct opts {
    const char *cfg_path;  /* NULL: use cfg_text */
    char *cfg_text;        /* local-engine fallback config, or NULL */
    int procs;
    int iters;
    int hold_ms;
    int64_t wait_ms;
    const char *name;
    const char *counter_path;
};

/* What the shared file holds: the counter and the last fencing token. */
struct shared {
    long count;
    uint64_t last_token;
};

static void usage(FILE *to)
{
    fprintf(to,
            "usage: embed [-c CFG] [-n PROCS] [-i ITER] [-t HOLD_MS] [-w WAIT_MS] NAME\n"
            "  -c CFG      config file (default: $CERBERUS_CONFIG, ./cerberus.cfg,\n"
            "              /etc/cerberus/cerberus.cfg, else the local engine)\n"
            "  -n PROCS    contending processes (default 4)\n"
            "  -i ITER     acquisitions per process (default 5)\n"
            "  -t HOLD_MS  time each holder keeps the lock (default 50)\n"
            "  -w WAIT_MS  longest wait for one acquisition (default 30000)\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* The holder's "work": time spent with the lock held. A real program would do
 * its critical section here. */
static void hold_for(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int read_shared(int fd, struct shared *sh)
{
    char buf[64];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "%ld %" SCNu64, &sh->count, &sh->last_token) != 2)
        return -1;
    return 0;
}

static int write_shared(int fd, const struct shared *sh)
{
    char buf[64];
    /* Fixed width, so a shorter rewrite never leaves old digits behind. */
    int n = snprintf(buf, sizeof buf, "%20ld %20" PRIu64 "\n", sh->count,
                     sh->last_token);
    return pwrite(fd, buf, (size_t)n, 0) == n ? 0 : -1;
}

static int fail(cerb_status st, const char *what)
{
    fprintf(stderr, "embed[%ld]: %s: %s (%s)\n", (long)getpid(), what,
            cerb_strerror(st), cerb_last_error());
    return 1;
}

/* One contending process. Returns its exit status. */
static int child(const struct opts *o)
{
    cerb_client *client = NULL;
    cerb_lock *lock = NULL;
    cerb_status st;
    int rc = 0;

    int fd = open(o->counter_path, O_RDWR);
    if (fd < 0) {
        perror("embed: open counter");
        return 1;
    }
    st = o->cfg_path ? cerb_client_open(&client, o->cfg_path)
                     : cerb_client_open_string(&client, o->cfg_text);
    if (st != CERB_OK) {
        close(fd);
        return fail(st, "cerb_client_open");
    }
    st = cerb_lock_new(client, o->name, NULL, &lock);
    if (st != CERB_OK) {
        rc = fail(st, "cerb_lock_new");
        goto out;
    }
    for (int i = 0; i < o->iters && rc == 0; i++) {
        st = cerb_lock_trylock_for(lock, o->wait_ms);
        if (st != CERB_OK) {
            rc = fail(st, "cerb_lock_trylock_for");
            break;
        }
        uint64_t token = cerb_lock_fencing_token(lock);
        /* The token is the switch epoch (high 16 bits) and the engine's
         * counter (low 48): printed whole, then split for the reader. */
        printf("pid %ld holds %s token %" PRIu64 " (epoch %" PRIu64
               ", grant %" PRIu64 ") on %s\n",
               (long)getpid(), o->name, token, token >> 48,
               token & ((UINT64_C(1) << 48) - 1), cerb_engine_current(client));

        struct shared sh;
        if (read_shared(fd, &sh) != 0) {
            fprintf(stderr, "embed[%ld]: bad counter file\n", (long)getpid());
            rc = 1;
        } else {
            if (token != 0 && token <= sh.last_token) {
                fprintf(stderr, "embed[%ld]: fencing token %" PRIu64
                        " not above the previous holder's %" PRIu64 "\n",
                        (long)getpid(), token, sh.last_token);
                rc = 1;
            }
            hold_for(o->hold_ms);
            sh.count++;
            if (token != 0)
                sh.last_token = token;
            if (write_shared(fd, &sh) != 0) {
                perror("embed: write counter");
                rc = 1;
            }
        }
        st = cerb_lock_unlock(lock);
        if (st != CERB_OK)
            rc = fail(st, "cerb_lock_unlock");
    }
out:
    cerb_lock_free(lock);
    cerb_client_close(client);
    close(fd);
    return rc;
}

/* Config lookup of the cerberus tools; NULL when no file is found. */
static const char *find_config(const char *given)
{
    static const char *const fallbacks[] = {"./cerberus.cfg",
                                            "/etc/cerberus/cerberus.cfg"};
    if (given)
        return given;
    const char *env = getenv("CERBERUS_CONFIG");
    if (env && *env)
        return env;
    for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++)
        if (access(fallbacks[i], R_OK) == 0)
            return fallbacks[i];
    return NULL;
}

/* Remove the flock directory of the local-engine fallback (one level). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4096];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

int main(int argc, char **argv)
{
    struct opts o = {.procs = 4, .iters = 5, .hold_ms = 50, .wait_ms = 30000};
    const char *given = NULL;
    long v;
    int c;

    while ((c = getopt(argc, argv, "c:n:i:t:w:h")) != -1) {
        switch (c) {
        case 'c': given = optarg; break;
        case 'n': if (parse_int(optarg, 1, 256, &v)) goto bad; o.procs = (int)v; break;
        case 'i': if (parse_int(optarg, 1, 1000000, &v)) goto bad; o.iters = (int)v; break;
        case 't': if (parse_int(optarg, 0, 60000, &v)) goto bad; o.hold_ms = (int)v; break;
        case 'w': if (parse_int(optarg, -1, 86400000, &v)) goto bad; o.wait_ms = v; break;
        case 'h': usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (optind != argc - 1)
        goto bad;
    o.name = argv[optind];
    /* Line-buffered, so holders' lines from different processes interleave
     * whole and in order even when stdout is a pipe. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    char lockdir[4096] = "";
    o.cfg_path = find_config(given);
    if (o.cfg_path) {
        printf("embed: config %s\n", o.cfg_path);
    } else {
        snprintf(lockdir, sizeof lockdir, "%s/cerb-embed-XXXXXX", tmp);
        if (!mkdtemp(lockdir)) {
            perror("embed: mkdtemp");
            return 1;
        }
        size_t n = strlen(lockdir) + 64;
        o.cfg_text = malloc(n);
        if (!o.cfg_text)
            return 1;
        snprintf(o.cfg_text, n, "engines = (\"local\");\nlocal = { dir = \"%s\"; };\n",
                 lockdir);
        printf("embed: no config file; local engine with lock files in %s\n", lockdir);
    }

    char counter[4096];
    snprintf(counter, sizeof counter, "%s/cerb-embed-counter-XXXXXX", tmp);
    int fd = mkstemp(counter);
    struct shared zero = {0, 0};
    if (fd < 0 || write_shared(fd, &zero) != 0) {
        perror("embed: counter file");
        return 1;
    }
    o.counter_path = counter;
    printf("embed: %d processes x %d acquisitions of \"%s\", holding %d ms each\n",
           o.procs, o.iters, o.name, o.hold_ms);

    pid_t *pids = calloc((size_t)o.procs, sizeof *pids);
    if (!pids)
        return 1;
    int failed = 0;
    for (int i = 0; i < o.procs; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(fd);
            int rc = child(&o);
            fflush(NULL);
            _exit(rc);
        }
        if (pids[i] < 0) {
            perror("embed: fork");
            failed++;
        }
    }
    /* Every child bounds its own run (each wait is at most WAIT_MS), so a
     * plain blocking wait here cannot hang forever. */
    for (int i = 0; i < o.procs; i++) {
        int st;
        if (pids[i] <= 0)
            continue;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "embed: child %ld failed (%s %d)\n", (long)pids[i],
                    WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed++;
        }
    }

    struct shared fin = {-1, 0};
    read_shared(fd, &fin);
    long want = (long)o.procs * o.iters;
    printf("embed: counter = %ld (expected %ld), last fencing token %" PRIu64
           ", %d failed process(es)\n", fin.count, want, fin.last_token, failed);
    int ok = failed == 0 && fin.count == want;
    printf("embed: %s\n", ok ? "OK: no overlapping holders" : "FAILED");

    close(fd);
    unlink(counter);
    if (lockdir[0])
        remove_dir(lockdir);
    free(o.cfg_text);
    free(pids);
    return ok ? 0 : 1;

bad:
    usage(stderr);
    return 2;
}
