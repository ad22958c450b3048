/*
 * orders.c — the idempotency guard in an order service: several processes
 * receive the same stream of "create order" requests, some of them twice,
 * some whose creation fails once, and one process dies in the middle of
 * creating an order; exactly one order is created per request id.
 *
 *   orders [-c CFG] [-n PROCS] [-r REQUESTS] [-R RUNNING_MS] [-w WAIT_MS] [-U]
 *
 * The parent makes the stream: REQUESTS request ids, unique to this run,
 * every fourth delivered twice (a redelivery). It forks PROCS workers. Each
 * opens its own client (a client is per process: never share one across
 * fork) and works through the whole stream, starting at its own offset so
 * the workers meet on the same requests at different moments, as consumers
 * of one redelivering queue would. For each request:
 *
 *   cerb_guard_begin("create-order", id)
 *     CERB_OK         ours to run: create the order (append a line to the
 *                     orders file, after ~20 ms of "work"), then
 *                     cerb_guard_finish(g, 1, order, len) stores the order
 *                     number as the result. Every fifth request fails the
 *                     first time anyone tries it (a marker file says who was
 *                     first): that attempt ends with finish(g, 0) — nothing
 *                     is kept — and the request goes back to the end of the
 *                     queue, to be tried again at once, by anyone.
 *     CERB_DUPLICATE  already created: the stored result is the order
 *                     number, which a service would send back as the answer.
 *     CERB_BUSY       someone else is creating it now: back to the end of
 *                     the queue, tried again a little later (their attempt
 *                     may yet fail, or they may crash).
 *
 * Worker 0 kills itself with SIGKILL while it holds its third attempt,
 * before creating that order: its claim is no longer renewed and expires
 * after RUNNING_MS, and then another worker, which kept getting CERB_BUSY
 * for that request, gets CERB_OK and creates the order. It prints how long
 * after the crash that was (a file marks the crash time on the monotonic
 * clock, which the processes of a host share), and fails the run had it
 * been sooner than RUNNING_MS allows.
 *
 * The guard covers what happens before the order exists and after finish.
 * A process that dies after creating the order but before finish leaves a
 * claim that expires, and a retry would create a second order: where that
 * matters the order store itself must reject the id a second time (a
 * unique key); the guard then still gives every retry the first answer.
 *
 * -U runs the same stream without the guard, to show what it prevents: every
 * worker creates every order it receives, and the count finds duplicates.
 *
 * At the end the parent counts the lines of the orders file and prints
 * "N requests, N orders, 0 duplicates"; the exit status is 0 only when each
 * request has exactly one order and every worker but the crashed one
 * succeeded (1 otherwise, 2 for bad usage).
 *
 * Configuration: -c FILE, else $CERBERUS_CONFIG, else ./cerberus.cfg, else
 * /etc/cerberus/cerberus.cfg; with none, the local engine with its records
 * under a temporary directory (shared by the processes of this host).
 * Uses only include/cerberus.h.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

#include <cerberus.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SCOPE "create-order"
#define ID_MAX 64
#define WORK_MS 20      /* the "work" of creating one order */
#define BUSY_BACKOFF_MS 25
#define CRASH_AT 3      /* worker 0 dies holding its third attempt */

struct opts {
    const char *cfg_path;  /* NULL: use cfg_text */
    char *cfg_text;        /* local-engine fallback config, or NULL */
    int procs;
    int requests;
    int64_t running_ms;
    int64_t wait_ms;       /* each worker's whole run, at most */
    int unguarded;         /* -U: no guard at all */
    char run[32];          /* makes the request ids unique to this run */
    char dir[4096];        /* orders file and fail-once markers */
};

static void usage(FILE *to)
{
    fprintf(to,
            "usage: orders [-c CFG] [-n PROCS] [-r REQUESTS] [-R RUNNING_MS] [-w WAIT_MS] [-U]\n"
            "  -c CFG         config file (default: $CERBERUS_CONFIG, ./cerberus.cfg,\n"
            "                 /etc/cerberus/cerberus.cfg, else the local engine)\n"
            "  -n PROCS       worker processes, 2 or more (default 4)\n"
            "  -r REQUESTS    distinct order requests (default 20)\n"
            "  -R RUNNING_MS  an attempt's claim; a crashed one blocks its request\n"
            "                 this long (default 2000)\n"
            "  -w WAIT_MS     longest run of one worker (default 60000)\n"
            "  -U             without the guard, to see the duplicates it prevents\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void request_id(const struct opts *o, int i, char out[ID_MAX])
{
    snprintf(out, ID_MAX, "req-%s-%03d", o->run, i);
}

/* 1 for the first caller for request @i when it is one that fails once:
 * O_EXCL makes "first" exact across processes. */
static int fails_this_time(const struct opts *o, int i)
{
    char path[4200];
    if (i % 5 != 2)
        return 0;
    snprintf(path, sizeof path, "%s/failed-once-%03d", o->dir, i);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

/* Worker 0's crash while it holds request @i: the time, for the taker. */
static void mark_crash(const struct opts *o, int i)
{
    char path[4200], t[32];
    snprintf(path, sizeof path, "%s/crashed-%03d", o->dir, i);
    int n = snprintf(t, sizeof t, "%" PRId64 "\n", now_ms());
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd >= 0) {
        if (write(fd, t, (size_t)n) != n)
            perror("orders: crash mark");
        close(fd);
    }
}

/* After creating request @i: if it is the one worker 0 crashed on, say
 * how long after the crash it was taken over. Returns 1 when that was
 * sooner than the claim allows (the guard let it through early), else 0. */
static int report_takeover(const struct opts *o, int w, int i, const char *id)
{
    char path[4200];
    int64_t t = 0;
    snprintf(path, sizeof path, "%s/crashed-%03d", o->dir, i);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int got = fscanf(f, "%" SCNd64, &t);
    fclose(f);
    if (got != 1)
        return 0;
    /* The claim was set just before the mark; the work took WORK_MS. */
    int64_t after = now_ms() - t;
    int early = after + 100 < o->running_ms;
    printf("worker %d: %s: taken over %" PRId64 " ms after worker 0 crashed holding it "
           "(running_ms %" PRId64 ")%s\n", w, id, after, o->running_ms,
           early ? ": TOO EARLY" : "");
    return early;
}

/* Create the order: one line appended (O_APPEND writes of a short line land
 * whole). Returns 0 or -1. */
static int create_order(const struct opts *o, const char *id, char *order, size_t len)
{
    char path[4200], line[160];
    snprintf(path, sizeof path, "%s/orders", o->dir);
    sleep_ms(WORK_MS);
    snprintf(order, len, "order of %s by pid %ld", id, (long)getpid());
    int n = snprintf(line, sizeof line, "%s %ld\n", id, (long)getpid());
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd < 0)
        return -1;
    int rc = write(fd, line, (size_t)n) == n ? 0 : -1;
    close(fd);
    return rc;
}

static int fail(int w, cerb_status st, const char *what)
{
    fprintf(stderr, "orders[worker %d, pid %ld]: %s: %s (%s)\n", w, (long)getpid(), what,
            cerb_strerror(st), cerb_last_error());
    return 1;
}

/* One worker's queue: request numbers, a ring with room for the requeues. */
struct queue {
    int *v;
    size_t head, n, cap;
};

static void push(struct queue *q, int r)
{
    q->v[(q->head + q->n++) % q->cap] = r;
}

static int pop(struct queue *q)
{
    int r = q->v[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    return r;
}

/* One worker. Returns its exit status (worker 0 does not return). */
static int worker(const struct opts *o, int w)
{
    cerb_client *client = NULL;
    cerb_guard_opts gopts = CERB_GUARD_OPTS_INIT;
    struct queue q = {NULL, 0, 0, 0};
    int created = 0, dups = 0, busy = 0, failed = 0, attempts = 0, rc = 0;
    int64_t deadline = now_ms() + o->wait_ms;
    cerb_status st;

    /* The stream: every request, every fourth twice, from this worker's
     * own offset. A request is in the queue at most twice, plus once more
     * for each requeue (which replaces the entry it came from). */
    q.cap = (size_t)o->requests * 2;
    if (!(q.v = malloc(q.cap * sizeof *q.v)))
        return 1;
    int off = w * o->requests / o->procs;
    for (int k = 0; k < o->requests; k++)
        push(&q, (off + k) % o->requests);
    for (int k = 0; k < o->requests; k += 4)
        push(&q, (off + k) % o->requests);

    st = o->cfg_path ? cerb_client_open(&client, o->cfg_path)
                     : cerb_client_open_string(&client, o->cfg_text);
    if (st != CERB_OK) {
        free(q.v);
        return fail(w, st, "cerb_client_open");
    }
    gopts.running_ms = o->running_ms;
    /* A demo's records need not keep duplicates out for the default day. */
    gopts.keep_ms = 600000;

    while (q.n > 0 && rc == 0) {
        if (now_ms() > deadline) {
            fprintf(stderr, "orders[worker %d]: gave up after %" PRId64 " ms with %zu "
                    "requests left\n", w, o->wait_ms, q.n);
            rc = 1;
            break;
        }
        int r = pop(&q);
        char id[ID_MAX];
        cerb_guard *g = NULL;
        request_id(o, r, id);
        st = o->unguarded ? CERB_OK
                          : cerb_guard_begin(client, SCOPE, id, strlen(id), &gopts, &g);
        if (st == CERB_DUPLICATE) {
            size_t len = 0;
            const char *order = cerb_guard_result(g, &len);
            if (!order || len == 0) {
                fprintf(stderr, "orders[worker %d]: %s: a duplicate without its order\n", w, id);
                rc = 1;
            }
            dups++;
            cerb_guard_free(g);
            continue;
        }
        if (st == CERB_BUSY) {
            /* Someone is creating it; their attempt may still fail or
             * crash, so it stays ours to see through. */
            busy++;
            push(&q, r);
            sleep_ms(BUSY_BACKOFF_MS);
            continue;
        }
        if (st != CERB_OK) {
            rc = fail(w, st, "cerb_guard_begin");
            break;
        }
        if (g && cerb_guard_degraded(g))
            printf("worker %d: %s: no engine can tell; running unprotected\n", w, id);
        if (w == 0 && ++attempts == CRASH_AT) {
            if (g)
                printf("worker %d (pid %ld): crashing (SIGKILL) while creating %s; its claim "
                       "expires in %" PRId64 " ms\n", w, (long)getpid(), id, o->running_ms);
            else
                printf("worker %d (pid %ld): crashing (SIGKILL) while creating %s\n", w,
                       (long)getpid(), id);
            fflush(stdout);
            mark_crash(o, r);
            kill(getpid(), SIGKILL);
        }
        if (fails_this_time(o, r)) {
            printf("worker %d: %s: creation failed; forgotten, to be retried\n", w, id);
            failed++;
            st = g ? cerb_guard_finish(g, 0, NULL, 0) : CERB_OK;
            cerb_guard_free(g);
            if (st != CERB_OK) {
                rc = fail(w, st, "cerb_guard_finish(failed)");
                break;
            }
            push(&q, r);
            continue;
        }
        char order[128];
        if (create_order(o, id, order, sizeof order) != 0) {
            perror("orders: append the order");
            cerb_guard_free(g); /* counts as failed: a retry may run */
            rc = 1;
            break;
        }
        st = g ? cerb_guard_finish(g, 1, order, strlen(order)) : CERB_OK;
        cerb_guard_free(g);
        if (st != CERB_OK) {
            rc = fail(w, st, "cerb_guard_finish");
            break;
        }
        printf("worker %d: %s: created\n", w, id);
        created++;
        if (g && report_takeover(o, w, r, id))
            rc = 1;
    }
    printf("worker %d (pid %ld): %d created, %d answered as duplicates, %d busy (retried), "
           "%d failed (retried)\n", w, (long)getpid(), created, dups, busy, failed);
    cerb_client_close(client);
    free(q.v);
    return rc;
}

/* Config lookup of the cerberus tools; NULL when no file is found. */
static const char *find_config(const char *given)
{
    static const char *const fallbacks[] = {"./cerberus.cfg", "/etc/cerberus/cerberus.cfg"};
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

/* Remove @dir and what is in it, two levels deep (the local engine keeps
 * its records in a subdirectory). */
static void remove_tree(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4200];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            struct stat sb;
            if (depth > 0 && lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
                remove_tree(path, depth - 1);
            else
                unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Count the orders file: each request's orders. Returns 0 when every
 * request has exactly one, printing the summary line either way. */
static int count_orders(const struct opts *o)
{
    char path[4200], line[160];
    int *per = calloc((size_t)o->requests, sizeof *per);
    int orders = 0, dup = 0, missing = 0, strange = 0;
    snprintf(path, sizeof path, "%s/orders", o->dir);
    FILE *f = fopen(path, "r");
    if (!per)
        return 1;
    while (f && fgets(line, sizeof line, f)) {
        char prefix[ID_MAX];
        int i;
        orders++;
        snprintf(prefix, sizeof prefix, "req-%s-", o->run);
        if (strncmp(line, prefix, strlen(prefix)) != 0 ||
            sscanf(line + strlen(prefix), "%d", &i) != 1 || i < 0 || i >= o->requests) {
            strange++;
            continue;
        }
        if (++per[i] > 1) {
            dup++;
            printf("orders: DUPLICATE order for %.*s\n", (int)strcspn(line, " "), line);
        }
    }
    if (f)
        fclose(f);
    for (int i = 0; i < o->requests; i++)
        if (per[i] == 0) {
            char id[ID_MAX];
            request_id(o, i, id);
            printf("orders: no order for %s\n", id);
            missing++;
        }
    free(per);
    printf("%d requests, %d orders, %d duplicates", o->requests, orders, dup);
    if (missing || strange)
        printf(", %d missing, %d unexpected lines", missing, strange);
    printf("\n");
    return dup || missing || strange || orders != o->requests;
}

int main(int argc, char **argv)
{
    struct opts o = {.procs = 4, .requests = 20, .running_ms = 2000, .wait_ms = 60000};
    const char *given = NULL;
    long v;
    int c;

    while ((c = getopt(argc, argv, "c:n:r:R:w:Uh")) != -1) {
        switch (c) {
        case 'c': given = optarg; break;
        case 'n': if (parse_long(optarg, 2, 64, &v)) goto bad; o.procs = (int)v; break;
        case 'r': if (parse_long(optarg, 1, 1000, &v)) goto bad; o.requests = (int)v; break;
        case 'R': if (parse_long(optarg, 100, 600000, &v)) goto bad; o.running_ms = v; break;
        case 'w': if (parse_long(optarg, 1000, 3600000, &v)) goto bad; o.wait_ms = v; break;
        case 'U': o.unguarded = 1; break;
        case 'h': usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (optind != argc)
        goto bad;
    /* Line-buffered, so workers' lines interleave whole even into a pipe. */
    setvbuf(stdout, NULL, _IOLBF, 0);

    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    snprintf(o.dir, sizeof o.dir, "%s/cerb-orders-XXXXXX", tmp);
    if (!mkdtemp(o.dir)) {
        perror("orders: mkdtemp");
        return 1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(o.run, sizeof o.run, "%ld-%lx", (long)getpid(), (unsigned long)ts.tv_sec);

    o.cfg_path = find_config(given);
    if (o.cfg_path) {
        printf("orders: config %s\n", o.cfg_path);
    } else {
        size_t n = strlen(o.dir) + 64;
        if (!(o.cfg_text = malloc(n)))
            return 1;
        snprintf(o.cfg_text, n, "engines = (\"local\");\nlocal = { dir = \"%s\"; };\n", o.dir);
        printf("orders: no config file; local engine with its records in %s\n", o.dir);
    }
    if (o.unguarded)
        printf("orders: WITHOUT the guard (-U)\n");
    printf("orders: %d workers, %d requests (every fourth delivered twice, every fifth "
           "failing once), worker 0 crashes mid-way; running_ms %" PRId64 "\n",
           o.procs, o.requests, o.running_ms);

    pid_t *pids = calloc((size_t)o.procs, sizeof *pids);
    if (!pids)
        return 1;
    int failed = 0, crashed = 0;
    for (int i = 0; i < o.procs; i++) {
        fflush(stdout);
        pids[i] = fork();
        if (pids[i] == 0) {
            int rc = worker(&o, i);
            fflush(NULL);
            _exit(rc);
        }
        if (pids[i] < 0) {
            perror("orders: fork");
            failed++;
        }
    }
    /* Every worker bounds its own run (WAIT_MS), so a blocking wait here
     * cannot hang forever. */
    for (int i = 0; i < o.procs; i++) {
        int st;
        if (pids[i] <= 0)
            continue;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
        if (i == 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
            crashed = 1;
            continue;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "orders: worker %d failed (%s %d)\n", i,
                    WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed++;
        }
    }
    if (!crashed)
        printf("orders: note: worker 0 finished before its third attempt (no crash)\n");

    int bad_count = count_orders(&o);
    int ok = !bad_count && failed == 0;
    printf("orders: %s\n", ok ? "OK: exactly one order per request" : "FAILED");
    remove_tree(o.dir, 2);
    free(o.cfg_text);
    free(pids);
    return ok ? 0 : 1;

bad:
    usage(stderr);
    return 2;
}
