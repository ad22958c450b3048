/*
 * worker.c — one chaos client process: T threads lock a few names through
 * the public API only (include/cerberus.h) and record every critical section
 * in the shared-memory oracle (oracle.h).
 *
 *   cerb_chaos_worker -c CONFIG -o ORACLE [--client ID] [--threads T]
 *       [--names N] [--prefix P] [--seconds S] [--max-ops M] [--seed X]
 *       [--bound-ms B] [--lease-ms L] [--guard | --elect | --semaphore N | --rwlock]
 *       [--count-conns PORT] [--unfenced ENGINE]
 *       [--broken skip-lock|fake-token|overrun|skip-guard|ignore-busy|ignore-duplicate|
 *                 skip-elect|skip-share]
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
 * retries, computed by the driver). A call that fails (not a timeout or
 * BUSY) is counted by its status, printed at the end, and followed by a
 * pause of 0–20 ms, as a caller would make before trying again.
 *
 * --guard: the threads make idempotency-guard attempts instead (DESIGN.md
 * §11). --names keys g0.. in one scope (the prefix); each loop picks a key
 * and calls cerb_guard_begin. CERB_OK is recorded as a claim of the key
 * (oracle_enter_claim: overlaps judged as for locks, no token), held like
 * a lock (1 in 40 past guard.running_ms, so the renewer carries it; the
 * lost callback and cerb_guard_state report LOST), left, then finished:
 * mostly failed (succeeded = 0, the record deleted so the key can run
 * again), 1 in 8 succeeded with a short keep_ms (200–800 ms), recorded with
 * oracle_done so a rerun inside the keep window is caught; CERB_DUPLICATE
 * and CERB_BUSY are counted. --count-conns PORT samples this process's
 * established connections to PORT (how many ZooKeeper sessions the guard's
 * pool opened) and prints the most seen.
 *
 * --elect: the threads are candidates in leader elections instead (DESIGN.md
 * §16), one candidate per thread and name. Each loop picks a name and
 * campaigns with a random wait (0-400 ms); elected, the term is recorded
 * like a lock's hold (its fencing token, the engine), held (1 in 20 past
 * the lease; 1 in 4 proclaims a new value midway), left before the
 * resign. The lost callback records LOST as it fires, so the oracle's
 * rules read: at most one leader per name at a time, each deposed leader
 * told LOST before the next is elected, terms' tokens growing.
 *
 * --semaphore N: the threads take permits of semaphores of limit N instead
 * (one handle per thread and name): 1 permit, or 2 one time in four, with
 * a random wait (0-400 ms); --rwlock: the threads take read locks, or write
 * locks one time in five, the same way. Each grant is recorded as a shared
 * hold (oracle_enter_shared: at most N permits inside, never a writer with
 * anybody), held as a lock's (1 in 20 past the lease), left before the
 * release; the lost callbacks record LOST as they fire.
 *
 * --unfenced ENGINE: ENGINE has no fencing (memcached): a lock it grants,
 * whose token carries no counter (its low 48 bits are 0: the epoch alone),
 * is recorded by oracle_enter_unfenced (the overlap rule alone), as is such
 * a grant whose engine the client could not tell ("?": a switch under
 * way). Any other engine's is still judged as a token.
 *
 * --broken modes exist to show the oracle can fail (tests/chaos chaos_broken):
 * skip-lock records holds without locking (a lock that grants twice),
 * fake-token records tokens that repeat and are sometimes 0, overrun makes
 * one timed call per thread last its bound plus two seconds; with --guard,
 * skip-guard runs every attempt without beginning it, ignore-busy runs on
 * CERB_BUSY and ignore-duplicate runs on CERB_DUPLICATE; with --elect,
 * skip-elect records terms without campaigning; with --semaphore or
 * --rwlock, skip-share records holds without taking them.
 */
#include <dirent.h>
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
#include <unistd.h>

#include "cerberus.h"
#include "oracle.h"

#define MAX_NAMES 8
#define MAX_THREADS 32
#define ERR_KINDS 32 /* cerb_status values counted apart (append-only codes) */

enum broken {
    BROKEN_NONE,
    BROKEN_SKIP_LOCK,
    BROKEN_FAKE_TOKEN,
    BROKEN_OVERRUN,
    BROKEN_SKIP_GUARD,
    BROKEN_IGNORE_BUSY,
    BROKEN_IGNORE_DUPLICATE,
    BROKEN_SKIP_ELECT,
    BROKEN_SKIP_SHARE,
};

static const char *const broken_name[] = {"",
                                          "skip-lock",
                                          "fake-token",
                                          "overrun",
                                          "skip-guard",
                                          "ignore-busy",
                                          "ignore-duplicate",
                                          "skip-elect",
                                          "skip-share"};

struct opts {
    const char *config, *oracle_path, *prefix;
    int client, threads, names, guard, elect, rwlock, count_port;
    const char *unfenced; /* --unfenced ENGINE, or NULL */
    int64_t semaphore; /* --semaphore N: the limit; 0 = not that mode */
    int64_t seconds, max_ops, bound_ms, lease_ms;
    uint64_t seed;
    enum broken broken;
};

/* One thread's guard attempt in force, for the lost callback (a library
 * thread): its oracle id, -1 between attempts. */
struct tguard {
    oracle *o;
    _Atomic int holder;
};

/* One thread's view of one name: its handle (or its candidate, --elect)
 * and, while held, its oracle id (read by the lost callback on a library
 * thread). */
struct tlock {
    cerb_lock *l;
    cerb_election *e;
    cerb_semaphore *s;
    cerb_rwlock *rw;
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
    struct tguard tg;
    uint64_t ops, ok, timeout, errors, lost, long_holds, reentrant, multi;
    uint64_t dup, done, finish_lost; /* guard: duplicates, successes, CERB_LOST finishes */
    uint64_t by_status[ERR_KINDS];   /* errors by cerb_status, for the summary */
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
    const char *uf = t->op->unfenced;
    /* Its counter, the low 48 bits, is 0; the epoch stays above. */
    bool no_fence = (token & ((UINT64_C(1) << 48) - 1)) == 0;
    if (uf && no_fence && (strcmp(engine, uf) == 0 || strcmp(engine, "?") == 0)) {
        atomic_store(&tl->holder,
                     oracle_enter_unfenced(t->o, tl->name, t->op->client, engine, oracle_now()));
        return;
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

/* A hold's length: 1 in @one_in past the lease (the renewer must carry it),
 * else 0–30 ms. */
static int64_t hold_ms(struct thread *t, unsigned one_in)
{
    if (rnd(&t->rng) % one_in == 0) {
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

static void count_error(struct thread *t, cerb_status st)
{
    t->errors++;
    t->by_status[(unsigned)st < ERR_KINDS ? (unsigned)st : ERR_KINDS - 1]++;
    /* A refused connection fails at once: without a pause the threads
     * spin (hundreds of calls a second each) while a server is down. */
    sleep_ms(rnd_range(&t->rng, 0, 20));
}

static void count(struct thread *t, cerb_status st)
{
    if (st == CERB_OK)
        t->ok++;
    else if (st == CERB_TIMEOUT || st == CERB_BUSY)
        t->timeout++;
    else
        count_error(t, st);
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
    hold(t, &tl, 1, hold_ms(t, 20));
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

static void on_guard_lost(cerb_guard *g, void *ud)
{
    struct tguard *tg = ud;
    (void)g;
    oracle_told_lost(tg->o, atomic_load(&tg->holder), oracle_now());
}

/* Still running: true while the attempt's claim is not LOST (recorded when
 * it is). */
static bool guard_held(struct thread *t, cerb_guard *g)
{
    if (!g || cerb_guard_state(g) != CERB_LOCK_LOST)
        return true;
    oracle_told_lost(t->o, atomic_load(&t->tg.holder), oracle_now());
    return false;
}

struct guard_args {
    cerb_client *c;
    const char *scope, *key;
    cerb_guard_opts opts;
    cerb_guard *g;
    int succeeded;
};

static cerb_status call_guard_begin(void *a)
{
    struct guard_args *ga = a;
    return cerb_guard_begin(ga->c, ga->scope, ga->key, strlen(ga->key), &ga->opts, &ga->g);
}

static cerb_status call_guard_finish(void *a)
{
    struct guard_args *ga = a;
    return cerb_guard_finish(ga->g, ga->succeeded, "done", 4);
}

static cerb_status call_guard_free(void *a)
{
    return cerb_guard_free(((struct guard_args *)a)->g);
}

/* One guard attempt at a random key (see the file comment). */
static void guard_attempt(struct thread *t, const char *scope)
{
    const struct opts *op = t->op;
    int k = (int)(rnd(&t->rng) % (uint64_t)op->names);
    char key[16], name[ORACLE_NAME_MAX];
    snprintf(key, sizeof(key), "g%d", k);
    snprintf(name, sizeof(name), "%s%s", op->prefix, key);
    struct guard_args a = {.c = t->c, .scope = scope, .key = key,
                           .opts = (cerb_guard_opts)CERB_GUARD_OPTS_INIT};
    a.succeeded = rnd(&t->rng) % 8 == 0;
    if (a.succeeded)
        a.opts.keep_ms = rnd_range(&t->rng, 200, 800);
    char e0[32];
    engine_now(t->c, e0, sizeof(e0));
    int64_t t0 = oracle_now();
    cerb_status st = CERB_OK;
    if (op->broken != BROKEN_SKIP_GUARD)
        st = timed(t, "guard_begin", op->bound_ms, call_guard_begin, &a);
    bool run = st == CERB_OK || (st == CERB_BUSY && op->broken == BROKEN_IGNORE_BUSY) ||
               (st == CERB_DUPLICATE && op->broken == BROKEN_IGNORE_DUPLICATE);
    if (st == CERB_DUPLICATE)
        t->dup++;
    else
        count(t, st);
    if (!run) {
        if (a.g)
            cerb_guard_free(a.g);
        /* A caller told BUSY or DUPLICATE would not ask again at once;
         * without a pause the threads spin on the server between faults. */
        sleep_ms(rnd_range(&t->rng, 0, 10));
        return;
    }
    if (st != CERB_OK) {
        /* A broken mode runs what the guard refused: nothing to finish. */
        if (a.g)
            cerb_guard_free(a.g);
        a.g = NULL;
    }
    if (a.g && cerb_guard_degraded(a.g)) {
        /* guard.on_unavailable is "refuse" here: a degraded attempt would be
         * a library fault of its own, not a claim to judge. */
        fprintf(stderr, "worker %d: degraded guard attempt at %s (policy refuse)\n",
                op->client, name);
        t->errors++;
        cerb_guard_free(a.g);
        return;
    }
    char e1[32];
    engine_now(t->c, e1, sizeof(e1));
    if (a.g)
        cerb_guard_on_lost(a.g, on_guard_lost, &t->tg);
    atomic_store(&t->tg.holder, oracle_enter_claim(t->o, name, op->client,
                                                   strcmp(e0, e1) == 0 ? e1 : "?", t0,
                                                   oracle_now()));
    /* Fewer long holds than locks: a key held past running_ms keeps the
     * other attempts at it out for as long. */
    int64_t ms = hold_ms(t, 40);
    int64_t end = oracle_now() + ms * 1000000;
    for (;;) {
        if (!guard_held(t, a.g)) {
            t->lost++;
            break;
        }
        int64_t left = (end - oracle_now()) / 1000000;
        if (left <= 0)
            break;
        sleep_ms(left < 50 ? left : 50);
    }
    guard_held(t, a.g);
    oracle_leave(t->o, atomic_exchange(&t->tg.holder, -1), oracle_now());
    if (!a.g)
        return;
    int64_t f0 = oracle_now();
    cerb_status fs = timed(t, "guard_finish", op->bound_ms, call_guard_finish, &a);
    if (fs == CERB_OK && a.succeeded) {
        oracle_done(t->o, name, f0, oracle_now(), a.opts.keep_ms);
        t->done++;
    } else if (fs == CERB_LOST) {
        t->finish_lost++;
    } else if (fs != CERB_OK) {
        count_error(t, fs);
    }
    timed(t, "guard_free", op->bound_ms, call_guard_free, &a);
}

static void *guard_main(struct thread *t)
{
    const struct opts *op = t->op;
    int64_t end = oracle_now() + op->seconds * 1000000000;
    /* The scope: the prefix without its trailing '-'. */
    char scope[ORACLE_NAME_MAX];
    snprintf(scope, sizeof(scope), "%s", op->prefix);
    size_t n = strlen(scope);
    if (n > 1 && scope[n - 1] == '-')
        scope[n - 1] = '\0';
    t->tg.o = t->o;
    atomic_init(&t->tg.holder, -1);
    while (oracle_now() < end && (op->max_ops <= 0 || (int64_t)t->ops < op->max_ops)) {
        t->ops++;
        if (rnd(&t->rng) % 100 < 85)
            guard_attempt(t, scope);
        else
            sleep_ms(rnd_range(&t->rng, 0, 20));
    }
    return NULL;
}

/* ---- --elect ---- */

static void on_term_lost(cerb_election *e, void *ud)
{
    struct tlock *tl = ud;
    (void)e;
    oracle_told_lost(tl->o, atomic_load(&tl->holder), oracle_now());
}

struct elect_args {
    cerb_election *e;
    int64_t wait_ms;
    char value[32];
};

static cerb_status call_campaign(void *a)
{
    struct elect_args *ea = a;
    return cerb_election_campaign(ea->e, ea->value, strlen(ea->value), ea->wait_ms, NULL);
}

static cerb_status call_proclaim(void *a)
{
    struct elect_args *ea = a;
    return cerb_election_proclaim(ea->e, ea->value, strlen(ea->value));
}

static cerb_status call_resign(void *a)
{
    return cerb_election_resign(((struct elect_args *)a)->e);
}

/* One campaign on a random name (see the file comment). */
static void one_term(struct thread *t)
{
    const struct opts *op = t->op;
    struct tlock *tl = &t->tl[rnd(&t->rng) % (uint64_t)op->names];
    struct elect_args a = {.e = tl->e, .wait_ms = rnd_range(&t->rng, 0, 400)};
    snprintf(a.value, sizeof a.value, "c%d-t%d", op->client, t->idx);
    char e0[32], e1[32];
    engine_now(t->c, e0, sizeof(e0));
    cerb_status st = CERB_OK;
    if (op->broken != BROKEN_SKIP_ELECT)
        st = timed(t, "campaign", a.wait_ms + op->bound_ms, call_campaign, &a);
    count(t, st);
    if (st != CERB_OK)
        return;
    engine_now(t->c, e1, sizeof(e1));
    uint64_t token = op->broken == BROKEN_SKIP_ELECT ? atomic_fetch_add(&fake_token, 1)
                                                       : cerb_election_fencing_token(tl->e);
    atomic_store(&tl->holder, oracle_enter(t->o, tl->name, op->client, token,
                                           op->broken == BROKEN_SKIP_ELECT ? "fake"
                                           : strcmp(e0, e1) == 0           ? e1
                                                                           : "?",
                                           oracle_now()));
    int64_t ms = hold_ms(t, 20);
    int64_t end = oracle_now() + ms * 1000000;
    bool proclaim = rnd(&t->rng) % 4 == 0;
    for (;;) {
        if (op->broken != BROKEN_SKIP_ELECT && cerb_election_state(tl->e) == CERB_LOCK_LOST) {
            oracle_told_lost(t->o, atomic_load(&tl->holder), oracle_now());
            t->lost++;
            break;
        }
        int64_t left = (end - oracle_now()) / 1000000;
        if (proclaim && op->broken != BROKEN_SKIP_ELECT && left <= ms / 2) {
            proclaim = false;
            snprintf(a.value, sizeof a.value, "c%d-t%d-%" PRIu64, op->client, t->idx, t->ops);
            cerb_status ps = timed(t, "proclaim", op->bound_ms, call_proclaim, &a);
            if (ps == CERB_LOST) {
                oracle_told_lost(t->o, atomic_load(&tl->holder), oracle_now());
                t->lost++;
                break;
            }
            if (ps != CERB_OK)
                count_error(t, ps);
        }
        if (left <= 0)
            break;
        sleep_ms(left < 50 ? left : 50);
    }
    if (op->broken != BROKEN_SKIP_ELECT && cerb_election_state(tl->e) == CERB_LOCK_LOST)
        oracle_told_lost(t->o, atomic_load(&tl->holder), oracle_now());
    oracle_leave(t->o, atomic_exchange(&tl->holder, -1), oracle_now());
    if (op->broken != BROKEN_SKIP_ELECT)
        timed(t, "resign", op->bound_ms, call_resign, &a);
}

static void *elect_main(struct thread *t)
{
    const struct opts *op = t->op;
    int64_t end = oracle_now() + op->seconds * 1000000000;
    for (int i = 0; i < op->names; i++) {
        struct tlock *tl = &t->tl[i];
        snprintf(tl->name, sizeof(tl->name), "%s%d", op->prefix, i);
        tl->o = t->o;
        atomic_init(&tl->holder, -1);
        cerb_election_opts eo = CERB_ELECTION_OPTS_INIT;
        if (cerb_election_new(t->c, tl->name, &eo, &tl->e) != CERB_OK) {
            fprintf(stderr, "worker %d: cerb_election_new %s: %s\n", op->client, tl->name,
                    cerb_last_error());
            exit(1);
        }
        cerb_election_on_lost(tl->e, on_term_lost, tl);
    }
    while (oracle_now() < end && (op->max_ops <= 0 || (int64_t)t->ops < op->max_ops)) {
        t->ops++;
        if (rnd(&t->rng) % 100 < 85)
            one_term(t);
        else
            sleep_ms(rnd_range(&t->rng, 0, 20));
    }
    for (int i = 0; i < op->names; i++) {
        cerb_election_on_lost(t->tl[i].e, NULL, NULL);
        cerb_election_free(t->tl[i].e);
    }
    return NULL;
}

/* ---- --semaphore / --rwlock ---- */

/* A lost permit or read-write hold: its thread holds one hold at a time,
 * whose oracle id is in tl->holder. */
static void on_permit_lost(cerb_permit *p, void *ud)
{
    struct tlock *tl = ud;
    (void)p;
    oracle_told_lost(tl->o, atomic_load(&tl->holder), oracle_now());
}

static void on_rw_lost(cerb_rwlock *rw, void *ud)
{
    struct tlock *tl = ud;
    (void)rw;
    oracle_told_lost(tl->o, atomic_load(&tl->holder), oracle_now());
}

struct share_args {
    struct tlock *tl;
    unsigned k;
    bool write;
    int64_t wait_ms;
    cerb_permit *p;
};

static cerb_status call_share(void *a)
{
    struct share_args *sa = a;
    if (sa->tl->s)
        return cerb_semaphore_acquire(sa->tl->s, sa->k, sa->wait_ms, NULL, &sa->p);
    return sa->write ? cerb_rwlock_write_trylock_for(sa->tl->rw, sa->wait_ms)
                     : cerb_rwlock_read_trylock_for(sa->tl->rw, sa->wait_ms);
}

static cerb_status call_unshare(void *a)
{
    struct share_args *sa = a;
    if (sa->tl->s)
        return cerb_permit_free(sa->p);
    return sa->write ? cerb_rwlock_write_unlock(sa->tl->rw) : cerb_rwlock_read_unlock(sa->tl->rw);
}

static enum cerb_lock_state share_state(struct share_args *sa)
{
    return sa->tl->s ? cerb_permit_state(sa->p) : cerb_rwlock_state(sa->tl->rw);
}

/* One permit (or read / write hold) of a random name. */
static void one_share(struct thread *t)
{
    const struct opts *op = t->op;
    bool skip = op->broken == BROKEN_SKIP_SHARE;
    struct tlock *tl = &t->tl[rnd(&t->rng) % (uint64_t)op->names];
    struct share_args a = {.tl = tl, .wait_ms = rnd_range(&t->rng, 0, 400)};
    a.k = op->semaphore > 1 && rnd(&t->rng) % 4 == 0 ? 2 : 1;
    a.write = op->rwlock && rnd(&t->rng) % 5 == 0;
    char e0[32], e1[32];
    engine_now(t->c, e0, sizeof(e0));
    cerb_status st = skip ? CERB_OK : timed(t, "acquire", a.wait_ms + op->bound_ms, call_share, &a);
    count(t, st);
    if (st != CERB_OK)
        return;
    engine_now(t->c, e1, sizeof(e1));
    uint64_t token = skip        ? atomic_fetch_add(&fake_token, 1)
                     : tl->s     ? cerb_permit_fencing_token(a.p)
                                 : cerb_rwlock_fencing_token(tl->rw);
    enum oracle_share sh = tl->s ? ORACLE_PERMITS : a.write ? ORACLE_WRITE : ORACLE_READ;
    atomic_store(&tl->holder,
                 oracle_enter_shared(t->o, tl->name, op->client, token,
                                     skip ? "fake" : strcmp(e0, e1) == 0 ? e1 : "?",
                                     oracle_now(), sh, a.k, (unsigned)op->semaphore));
    if (a.p)
        cerb_permit_on_lost(a.p, on_permit_lost, tl);
    int64_t end = oracle_now() + hold_ms(t, 20) * 1000000;
    for (;;) {
        if (!skip && share_state(&a) == CERB_LOCK_LOST) {
            oracle_told_lost(t->o, atomic_load(&tl->holder), oracle_now());
            t->lost++;
            break;
        }
        int64_t left = (end - oracle_now()) / 1000000;
        if (left <= 0)
            break;
        sleep_ms(left < 50 ? left : 50);
    }
    if (!skip && share_state(&a) == CERB_LOCK_LOST)
        oracle_told_lost(t->o, atomic_load(&tl->holder), oracle_now());
    oracle_leave(t->o, atomic_exchange(&tl->holder, -1), oracle_now());
    if (!skip) {
        cerb_status us = timed(t, "release", op->bound_ms, call_unshare, &a);
        if (us != CERB_OK && us != CERB_LOST)
            count_error(t, us);
    }
}

static void *share_main(struct thread *t)
{
    const struct opts *op = t->op;
    int64_t end = oracle_now() + op->seconds * 1000000000;
    for (int i = 0; i < op->names; i++) {
        struct tlock *tl = &t->tl[i];
        snprintf(tl->name, sizeof(tl->name), "%s%d", op->prefix, i);
        tl->o = t->o;
        atomic_init(&tl->holder, -1);
        cerb_status st = op->semaphore
                             ? cerb_semaphore_new(t->c, tl->name, op->semaphore, NULL, &tl->s)
                             : cerb_rwlock_new(t->c, tl->name, NULL, &tl->rw);
        if (st != CERB_OK) {
            fprintf(stderr, "worker %d: new %s: %s\n", op->client, tl->name, cerb_last_error());
            exit(1);
        }
        if (tl->rw)
            cerb_rwlock_on_lost(tl->rw, on_rw_lost, tl);
    }
    while (oracle_now() < end && (op->max_ops <= 0 || (int64_t)t->ops < op->max_ops)) {
        t->ops++;
        if (rnd(&t->rng) % 100 < 85)
            one_share(t);
        else
            sleep_ms(rnd_range(&t->rng, 0, 20));
    }
    for (int i = 0; i < op->names; i++) {
        cerb_semaphore_free(t->tl[i].s);
        if (t->tl[i].rw)
            cerb_rwlock_on_lost(t->tl[i].rw, NULL, NULL);
        cerb_rwlock_free(t->tl[i].rw);
    }
    return NULL;
}

static void *thread_main(void *arg)
{
    struct thread *t = arg;
    const struct opts *op = t->op;
    if (op->guard)
        return guard_main(t);
    if (op->elect)
        return elect_main(t);
    if (op->semaphore || op->rwlock)
        return share_main(t);
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

/* This process's established TCP connections to 127.0.0.1:@port: the socket
 * inodes of its descriptors, matched against /proc/self/net/tcp. */
static int count_conns(int port)
{
    unsigned long inodes[1024];
    size_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < sizeof(inodes) / sizeof(inodes[0])) {
        char link[64];
        ssize_t len = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
        if (len <= 0)
            continue;
        link[len] = '\0';
        unsigned long ino;
        if (sscanf(link, "socket:[%lu]", &ino) == 1)
            inodes[n++] = ino;
    }
    closedir(d);
    FILE *f = fopen("/proc/self/net/tcp", "r");
    if (!f)
        return -1;
    char line[512];
    int count = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned rport, st;
        unsigned long ino;
        /* sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*d: %*x:%*x %*x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &rport,
                   &st, &ino) != 3)
            continue;
        if (rport != (unsigned)port || st != 1 /* TCP_ESTABLISHED */)
            continue;
        for (size_t i = 0; i < n; i++)
            if (inodes[i] == ino) {
                count++;
                break;
            }
    }
    fclose(f);
    return count;
}

struct sampler {
    pthread_t tid;
    int port;
    atomic_bool stop;
    int max;
};

/* Samples count_conns every 100 ms until stopped (a measurement, not a
 * synchronisation: nothing waits on it). */
static void *sampler_main(void *arg)
{
    struct sampler *sm = arg;
    while (!atomic_load(&sm->stop)) {
        int c = count_conns(sm->port);
        if (c > sm->max)
            sm->max = c;
        sleep_ms(100);
    }
    return NULL;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cerb_chaos_worker -c CONFIG -o ORACLE [--client ID] [--threads T]\n"
            "  [--names N] [--prefix P] [--seconds S] [--max-ops M] [--seed X]\n"
            "  [--bound-ms B] [--lease-ms L] [--guard | --elect | --semaphore N | --rwlock]\n"
            "  [--count-conns PORT] [--unfenced ENGINE]\n"
            "  [--broken skip-lock|fake-token|overrun|skip-guard|ignore-busy|ignore-duplicate|\n"
            "            skip-elect|skip-share]\n");
    exit(2);
}

static void parse(int argc, char **argv, struct opts *op)
{
    static const struct option lo[] = {
        {"client", 1, 0, 'i'}, {"threads", 1, 0, 't'}, {"names", 1, 0, 'n'},
        {"prefix", 1, 0, 'p'}, {"seconds", 1, 0, 's'}, {"max-ops", 1, 0, 'm'},
        {"seed", 1, 0, 'S'},   {"bound-ms", 1, 0, 'b'}, {"lease-ms", 1, 0, 'l'},
        {"broken", 1, 0, 'B'}, {"guard", 0, 0, 'g'},   {"count-conns", 1, 0, 'C'},
        {"elect", 0, 0, 'E'},  {"semaphore", 1, 0, 'N'}, {"rwlock", 0, 0, 'R'},
        {"unfenced", 1, 0, 'U'}, {0, 0, 0, 0}};
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
        case 'g': op->guard = 1; break;
        case 'E': op->elect = 1; break;
        case 'N': op->semaphore = atoll(optarg); if (op->semaphore < 1) usage(); break;
        case 'R': op->rwlock = 1; break;
        case 'C': op->count_port = atoi(optarg); break;
        case 'U': op->unfenced = optarg; break;
        case 'B':
            op->broken = BROKEN_NONE;
            for (size_t i = 1; i < sizeof(broken_name) / sizeof(broken_name[0]); i++)
                if (strcmp(optarg, broken_name[i]) == 0)
                    op->broken = (enum broken)i;
            if (op->broken == BROKEN_NONE)
                usage();
            break;
        default: usage();
        }
    }
    if (!op->config || !op->oracle_path || op->threads < 1 ||
        op->threads > MAX_THREADS || op->names < 1 || op->names > MAX_NAMES ||
        op->seconds < 1 || op->client < 0 || op->client >= ORACLE_MAX_CLIENTS ||
        op->count_port < 0 || op->count_port > 65535)
        usage();
    /* The guard's broken modes break the guard path, skip-elect the
     * election's, the others the lock's. */
    if (op->guard + op->elect + (op->semaphore > 0) + op->rwlock > 1)
        usage();
    bool guard_mode = op->broken >= BROKEN_SKIP_GUARD && op->broken <= BROKEN_IGNORE_DUPLICATE;
    bool elect_mode = op->broken == BROKEN_SKIP_ELECT;
    bool share_mode = op->broken == BROKEN_SKIP_SHARE;
    bool sharing = op->semaphore > 0 || op->rwlock;
    if (op->broken != BROKEN_NONE && op->broken != BROKEN_OVERRUN &&
        (guard_mode != (op->guard != 0) || elect_mode != (op->elect != 0) ||
         share_mode != sharing))
        usage();
}

int main(int argc, char **argv)
{
    struct opts op;
    parse(argc, argv, &op);
    printf("worker %d: seed %" PRIu64 " threads %d %s %d seconds %" PRId64 "%s%s\n",
           op.client, op.seed, op.threads,
           op.guard       ? "guard keys"
           : op.elect     ? "elections"
           : op.semaphore ? "semaphores"
           : op.rwlock    ? "read-write locks"
                          : "names",
           op.names,
           op.seconds, op.broken ? " broken " : "", broken_name[op.broken]);
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
    struct sampler sm = {.port = op.count_port};
    atomic_init(&sm.stop, false);
    if (op.count_port && pthread_create(&sm.tid, NULL, sampler_main, &sm) != 0) {
        fprintf(stderr, "worker %d: pthread_create failed\n", op.client);
        return 1;
    }
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
    uint64_t dup = 0, done = 0, flost = 0, by_status[ERR_KINDS] = {0};
    for (int i = 0; i < op.threads; i++) {
        pthread_join(th[i].tid, NULL);
        for (int k = 0; k < ERR_KINDS; k++)
            by_status[k] += th[i].by_status[k];
        dup += th[i].dup;
        done += th[i].done;
        flost += th[i].finish_lost;
        ops += th[i].ops;
        ok += th[i].ok;
        to += th[i].timeout;
        err += th[i].errors;
        lost += th[i].lost;
        lh += th[i].long_holds;
        re += th[i].reentrant;
        mu += th[i].multi;
    }
    if (op.count_port) {
        atomic_store(&sm.stop, true);
        pthread_join(sm.tid, NULL);
    }
    t0 = oracle_now();
    cerb_client_close(c);
    oracle_call(o, "client_close", t0, oracle_now(), op.bound_ms);
    if (op.guard)
        printf("worker %d: ops %" PRIu64 " begun %" PRIu64 " busy %" PRIu64
               " duplicate %" PRIu64 " errors %" PRIu64 " lost %" PRIu64 " finish-lost %" PRIu64
               " long %" PRIu64 " succeeded %" PRIu64 "\n",
               op.client, ops, ok, to, dup, err, lost, flost, lh, done);
    else
        printf("worker %d: ops %" PRIu64 " granted %" PRIu64 " timeout %" PRIu64
               " errors %" PRIu64 " lost %" PRIu64 " long %" PRIu64 " reentrant %" PRIu64
               " multi %" PRIu64 "\n", op.client, ops, ok, to, err, lost, lh, re, mu);
    if (err) {
        /* What the errors were: a post-mortem's first question. */
        printf("worker %d: errors by status:", op.client);
        for (int k = 0; k < ERR_KINDS; k++)
            if (by_status[k])
                printf(" %s %" PRIu64, cerb_status_name((cerb_status)k), by_status[k]);
        printf("\n");
    }
    if (op.count_port)
        printf("worker %d: at most %d connections to :%d\n", op.client, sm.max,
               op.count_port);
    free(th);
    oracle_close(o);
    return 0;
}
