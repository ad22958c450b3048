/*
 * worker.c — one chaos client process: T threads lock a few names through
 * the public API only (include/cerberus.h) and record every critical section
 * in the shared-memory oracle (oracle.h).
 *
 *   cerb_chaos_worker -c CONFIG -o ORACLE [--client ID] [--threads T]
 *       [--names N] [--prefix P] [--seconds S] [--max-ops M] [--seed X]
 *       [--bound-ms B] [--lease-ms L] [--broken skip-lock|fake-token|overrun]
 *
 * Each thread, seeded from --seed, --client and its index (the seed is
 * printed so a run can be replayed), loops until --seconds or --max-ops:
 *  - 65 %: cerb_lock_trylock_for on one name with a random wait (0–400 ms);
 *    1 in 20 of these holds past the lease (renewal must carry it), 1 in 5
 *    re-enters (trylock again on the held handle, unlocked twice);
 *  - 20 %: cerb_multilock_lock of two or three names;
 *  - the rest: a short pause outside any lock.
 * Inside: oracle_enter with the token and the engine the client reports as
 * current before and after the call ("?" when they differ), a hold that
 * polls cerb_lock_state (LOST ends it early and is recorded), then
 * oracle_leave *before* the unlock, so the next holder cannot enter before
 * this one is recorded out. The lost callback records LOST as it fires.
 * Every call's duration goes to oracle_call with its bound: the wait given
 * plus --bound-ms (the configured connect + operation timeouts times the
 * retries, computed by the driver).
 *
 * --broken modes exist to show the oracle can fail (tests/chaos chaos_broken):
 * skip-lock records holds without locking (a lock that grants twice),
 * fake-token records tokens that repeat and are sometimes 0, overrun makes
 * one timed call per thread last its bound plus two seconds.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cerberus.h"
#include "oracle.h"

#define MAX_NAMES 8
#define MAX_THREADS 32

enum broken { BROKEN_NONE, BROKEN_SKIP_LOCK, BROKEN_FAKE_TOKEN, BROKEN_OVERRUN };

struct opts {
    const char *config, *oracle_path, *prefix;
    int client, threads, names;
    int64_t seconds, max_ops, bound_ms, lease_ms;
    uint64_t seed;
    enum broken broken;
};

/* One thread's view of one name: its handle and, while held, its oracle id
 * (read by the lost callback on a library thread). */
struct tlock {
    cerb_lock *l;
    oracle *o;
    _Atomic int holder;
    char name[96];
};

struct thread {
    pthread_t tid;
    int idx;
    uint64_t rng;
    cerb_client *c;
    oracle *o;
    const struct opts *op;
    struct tlock tl[MAX_NAMES];
    uint64_t ops, ok, timeout, errors, lost, long_holds, reentrant, multi;
};

static _Atomic uint64_t fake_token = 1;

/* splitmix64: small, seedable, good enough to pick operations. */
static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int64_t rnd_range(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd(s) % (uint64_t)(hi - lo + 1));
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void on_lost(cerb_lock *l, void *ud)
{
    struct tlock *tl = ud;
    (void)l;
    oracle_told_lost(tl->o, atomic_load(&tl->holder), oracle_now());
}

static void engine_now(cerb_client *c, char *buf, size_t n)
{
    const char *e = cerb_engine_current(c);
    snprintf(buf, n, "%s", e ? e : "?");
}

/* Record entry into @tl's critical section; @e0 is the engine current
 * before the lock call. */
static void enter(struct thread *t, struct tlock *tl, const char *e0)
{
    char e1[32];
    engine_now(t->c, e1, sizeof(e1));
    const char *engine = strcmp(e0, e1) == 0 ? e1 : "?";
    uint64_t token;
    switch (t->op->broken) {
    case BROKEN_SKIP_LOCK:
        token = atomic_fetch_add(&fake_token, 1);
        engine = "fake";
        break;
    case BROKEN_FAKE_TOKEN:
        token = t->ops % 3;
        break;
    default:
        token = cerb_lock_fencing_token(tl->l);
        break;
    }
    atomic_store(&tl->holder, oracle_enter(t->o, tl->name, t->op->client, token,
                                           engine, oracle_now()));
}

/* Still inside: true while the hold is not LOST (recorded when it is). */
static bool still_held(struct thread *t, struct tlock *tl)
{
    if (t->op->broken == BROKEN_SKIP_LOCK)
        return true;
    if (cerb_lock_state(tl->l) == CERB_LOCK_LOST) {
        oracle_told_lost(t->o, atomic_load(&tl->holder), oracle_now());
        return false;
    }
    return true;
}

static void hold(struct thread *t, struct tlock **tls, int n, int64_t ms)
{
    int64_t end = oracle_now() + ms * 1000000;
    for (;;) {
        for (int i = 0; i < n; i++)
            if (!still_held(t, tls[i])) {
                t->lost++;
                return;
            }
        int64_t left = (end - oracle_now()) / 1000000;
        if (left <= 0)
            return;
        sleep_ms(left < 50 ? left : 50);
    }
}

static void leave(struct thread *t, struct tlock *tl)
{
    still_held(t, tl);
    oracle_leave(t->o, atomic_exchange(&tl->holder, -1), oracle_now());
}

static int64_t hold_ms(struct thread *t)
{
    if (rnd(&t->rng) % 20 == 0) {
        t->long_holds++;
        return rnd_range(&t->rng, t->op->lease_ms, t->op->lease_ms * 3 / 2);
    }
    return rnd_range(&t->rng, 0, 30);
}

/* A timed public call; the overrun mode stretches one per thread. */
static cerb_status timed(struct thread *t, const char *what, int64_t bound_ms,
                         cerb_status (*fn)(void *), void *arg)
{
    int64_t t0 = oracle_now();
    cerb_status st = fn(arg);
    if (t->op->broken == BROKEN_OVERRUN && t->ops == 1)
        sleep_ms(bound_ms + 2000);
    oracle_call(t->o, what, t0, oracle_now(), bound_ms);
    return st;
}

struct call_args {
    cerb_lock *l;
    cerb_lock **ls;
    size_t n;
    int64_t wait_ms;
};

static cerb_status call_trylock_for(void *a)
{
    struct call_args *c = a;
    return cerb_lock_trylock_for(c->l, c->wait_ms);
}

static cerb_status call_unlock(void *a)
{
    return cerb_lock_unlock(((struct call_args *)a)->l);
}

static cerb_status call_multilock(void *a)
{
    struct call_args *c = a;
    return cerb_multilock_lock(c->ls, c->n, c->wait_ms);
}

static cerb_status call_multiunlock(void *a)
{
    struct call_args *c = a;
    return cerb_multilock_unlock(c->ls, c->n);
}

static void count(struct thread *t, cerb_status st)
{
    if (st == CERB_OK)
        t->ok++;
    else if (st == CERB_TIMEOUT || st == CERB_BUSY)
        t->timeout++;
    else
        t->errors++;
}

static void one_lock(struct thread *t)
{
    const struct opts *op = t->op;
    struct tlock *tl = &t->tl[rnd(&t->rng) % (uint64_t)op->names];
    struct call_args a = {.l = tl->l, .wait_ms = rnd_range(&t->rng, 0, 400)};
    char e0[32];
    engine_now(t->c, e0, sizeof(e0));
    cerb_status st = CERB_OK;
    if (op->broken != BROKEN_SKIP_LOCK)
        st = timed(t, "trylock_for", a.wait_ms + op->bound_ms, call_trylock_for, &a);
    count(t, st);
    if (st != CERB_OK)
        return;
    enter(t, tl, e0);
    bool re = op->broken != BROKEN_SKIP_LOCK && rnd(&t->rng) % 5 == 0;
    if (re) {
        /* Reentrant: counted locally, no round trip, must succeed at once. */
        a.wait_ms = 0;
        cerb_status st2 = timed(t, "trylock_for(reentrant)", op->bound_ms,
                                call_trylock_for, &a);
        if (st2 == CERB_OK)
            t->reentrant++;
        else
            re = false;
    }
    hold(t, &tl, 1, hold_ms(t));
    leave(t, tl);
    if (op->broken == BROKEN_SKIP_LOCK)
        return;
    if (re)
        timed(t, "unlock(reentrant)", op->bound_ms, call_unlock, &a);
    timed(t, "unlock", op->bound_ms, call_unlock, &a);
}

static void multi_lock(struct thread *t)
{
    const struct opts *op = t->op;
    if (op->names < 2 || op->broken == BROKEN_SKIP_LOCK)
        return;
    size_t n = op->names >= 3 && rnd(&t->rng) % 2 ? 3 : 2;
    int first = (int)(rnd(&t->rng) % (uint64_t)op->names);
    cerb_lock *ls[3];
    struct tlock *tls[3];
    for (size_t i = 0; i < n; i++) {
        tls[i] = &t->tl[(first + (int)i) % op->names];
        ls[i] = tls[i]->l;
    }
    struct call_args a = {.ls = ls, .n = n, .wait_ms = rnd_range(&t->rng, 0, 400)};
    char e0[32];
    engine_now(t->c, e0, sizeof(e0));
    cerb_status st = timed(t, "multilock_lock", a.wait_ms + (int64_t)n * op->bound_ms,
                           call_multilock, &a);
    count(t, st);
    if (st != CERB_OK)
        return;
    t->multi++;
    for (size_t i = 0; i < n; i++)
        enter(t, tls[i], e0);
    hold(t, tls, (int)n, rnd_range(&t->rng, 0, 30));
    for (size_t i = 0; i < n; i++)
        leave(t, tls[i]);
    timed(t, "multilock_unlock", (int64_t)n * op->bound_ms, call_multiunlock, &a);
}

static void *thread_main(void *arg)
{
    struct thread *t = arg;
    const struct opts *op = t->op;
    int64_t end = oracle_now() + op->seconds * 1000000000;
    for (int i = 0; i < op->names; i++) {
        struct tlock *tl = &t->tl[i];
        snprintf(tl->name, sizeof(tl->name), "%s%d", op->prefix, i);
        tl->o = t->o;
        atomic_init(&tl->holder, -1);
        if (cerb_lock_new(t->c, tl->name, NULL, &tl->l) != CERB_OK) {
            fprintf(stderr, "worker %d: cerb_lock_new %s: %s\n", op->client,
                    tl->name, cerb_last_error());
            exit(1);
        }
        cerb_lock_on_lost(tl->l, on_lost, tl);
    }
    while (oracle_now() < end && (op->max_ops <= 0 || (int64_t)t->ops < op->max_ops)) {
        t->ops++;
        uint64_t r = rnd(&t->rng) % 100;
        if (r < 65)
            one_lock(t);
        else if (r < 85)
            multi_lock(t);
        else
            sleep_ms(rnd_range(&t->rng, 0, 20));
    }
    for (int i = 0; i < op->names; i++) {
        cerb_lock_on_lost(t->tl[i].l, NULL, NULL);
        cerb_lock_free(t->tl[i].l);
    }
    return NULL;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cerb_chaos_worker -c CONFIG -o ORACLE [--client ID] [--threads T]\n"
            "  [--names N] [--prefix P] [--seconds S] [--max-ops M] [--seed X]\n"
            "  [--bound-ms B] [--lease-ms L] [--broken skip-lock|fake-token|overrun]\n");
    exit(2);
}

static void parse(int argc, char **argv, struct opts *op)
{
    static const struct option lo[] = {
        {"client", 1, 0, 'i'}, {"threads", 1, 0, 't'}, {"names", 1, 0, 'n'},
        {"prefix", 1, 0, 'p'}, {"seconds", 1, 0, 's'}, {"max-ops", 1, 0, 'm'},
        {"seed", 1, 0, 'S'},   {"bound-ms", 1, 0, 'b'}, {"lease-ms", 1, 0, 'l'},
        {"broken", 1, 0, 'B'}, {0, 0, 0, 0}};
    *op = (struct opts){.prefix = "chaos-", .threads = 4, .names = 3,
                        .seconds = 10, .bound_ms = 5000, .lease_ms = 2000};
    op->seed = (uint64_t)time(NULL);
    int c;
    while ((c = getopt_long(argc, argv, "c:o:", lo, NULL)) != -1) {
        switch (c) {
        case 'c': op->config = optarg; break;
        case 'o': op->oracle_path = optarg; break;
        case 'i': op->client = atoi(optarg); break;
        case 't': op->threads = atoi(optarg); break;
        case 'n': op->names = atoi(optarg); break;
        case 'p': op->prefix = optarg; break;
        case 's': op->seconds = atoll(optarg); break;
        case 'm': op->max_ops = atoll(optarg); break;
        case 'S': op->seed = strtoull(optarg, NULL, 0); break;
        case 'b': op->bound_ms = atoll(optarg); break;
        case 'l': op->lease_ms = atoll(optarg); break;
        case 'B':
            if (strcmp(optarg, "skip-lock") == 0)
                op->broken = BROKEN_SKIP_LOCK;
            else if (strcmp(optarg, "fake-token") == 0)
                op->broken = BROKEN_FAKE_TOKEN;
            else if (strcmp(optarg, "overrun") == 0)
                op->broken = BROKEN_OVERRUN;
            else
                usage();
            break;
        default: usage();
        }
    }
    if (!op->config || !op->oracle_path || op->threads < 1 ||
        op->threads > MAX_THREADS || op->names < 1 || op->names > MAX_NAMES ||
        op->seconds < 1 || op->client < 0 || op->client >= ORACLE_MAX_CLIENTS)
        usage();
}

int main(int argc, char **argv)
{
    struct opts op;
    parse(argc, argv, &op);
    static const char *const broken_name[] = {"", " broken skip-lock",
                                              " broken fake-token", " broken overrun"};
    printf("worker %d: seed %" PRIu64 " threads %d names %d seconds %" PRId64 "%s\n",
           op.client, op.seed, op.threads, op.names, op.seconds, broken_name[op.broken]);
    fflush(stdout);

    /* CERB_CHAOS_DEBUG=1: the library's debug log in the worker's log, for
     * a post-mortem of a failed seed (timing changes: replay without it
     * first). */
    if (getenv("CERB_CHAOS_DEBUG"))
        cerb_log_set(NULL, NULL, CERB_LOG_DEBUG);
    oracle *o = oracle_open(op.oracle_path);
    if (!o) {
        fprintf(stderr, "worker %d: oracle %s: %s\n", op.client, op.oracle_path,
                strerror(errno));
        return 1;
    }
    cerb_client *c = NULL;
    int64_t t0 = oracle_now();
    cerb_status st = cerb_client_open(&c, op.config);
    oracle_call(o, "client_open", t0, oracle_now(), op.bound_ms);
    if (st != CERB_OK) {
        fprintf(stderr, "worker %d: cerb_client_open: %s\n", op.client, cerb_last_error());
        oracle_close(o);
        return 1;
    }

    struct thread *th = calloc((size_t)op.threads, sizeof(*th));
    if (!th)
        return 1;
    for (int i = 0; i < op.threads; i++) {
        th[i].idx = i;
        th[i].rng = op.seed ^ ((uint64_t)op.client << 32) ^ ((uint64_t)i * 0x1000193u);
        th[i].c = c;
        th[i].o = o;
        th[i].op = &op;
        if (pthread_create(&th[i].tid, NULL, thread_main, &th[i]) != 0) {
            fprintf(stderr, "worker %d: pthread_create failed\n", op.client);
            return 1;
        }
    }
    uint64_t ops = 0, ok = 0, to = 0, err = 0, lost = 0, lh = 0, re = 0, mu = 0;
    for (int i = 0; i < op.threads; i++) {
        pthread_join(th[i].tid, NULL);
        ops += th[i].ops;
        ok += th[i].ok;
        to += th[i].timeout;
        err += th[i].errors;
        lost += th[i].lost;
        lh += th[i].long_holds;
        re += th[i].reentrant;
        mu += th[i].multi;
    }
    t0 = oracle_now();
    cerb_client_close(c);
    oracle_call(o, "client_close", t0, oracle_now(), op.bound_ms);
    printf("worker %d: ops %" PRIu64 " granted %" PRIu64 " timeout %" PRIu64
           " errors %" PRIu64 " lost %" PRIu64 " long %" PRIu64 " reentrant %" PRIu64
           " multi %" PRIu64 "\n", op.client, ops, ok, to, err, lost, lh, re, mu);
    free(th);
    oracle_close(o);
    return 0;
}
