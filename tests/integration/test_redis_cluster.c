/*
 * test_redis_cluster.c — the redis engine against a real Redis Cluster
 * (issue 13 item 3): three masters and three replicas that this suite starts
 * itself (scripts/servers.sh start cluster: nodes on $CERB_CLUSTER_PORT,
 * default 27100, .. +5) and stops by PID.
 *
 *  - spread: names whose slots lie on all three masters (names with braces
 *    among them: every key of a lock must share the slot of its redis-py
 *    key), locked by threads of two clients racing; a shared counter per
 *    name detects two holders at once, and every name's fences increase;
 *  - migration: the slot of a name moved to another master under load
 *    (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE KEYS, SETSLOT NODE) while
 *    holders and waiters use it: no double grant, no hold lost;
 *  - a waiter through a migration: a holder, a waiter blocked in
 *    trylock_for and a contender on one name while its slot moves; the
 *    waiter gets the name after the release, and no call of any of them
 *    fails (a redirect is followed, never reported); and a waiter with no
 *    deadline in a slot left half moved still ends on an interrupt;
 *  - failover: a master killed (kill -9); its replica takes over; the holder
 *    is kept or told LOST, never silently both, and fences keep increasing;
 *  - redis-py interop: RedisCluster(...).lock(name) and a Cerberus lock on
 *    the same name exclude each other, both ways, and a Cerberus waiter sees
 *    redis-py's silent release.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#define LEASE_MS 3000
#define KILL_LEASE_MS 8000
#define N_NODES 6

static int base_port(void) { return cerb_test_env_port("CERB_CLUSTER_PORT", 27100); }

static int servers(const char *cmd)
{
    return cerb_test_servers_run(cmd, "cluster", base_port(), 120000);
}

static cerb_client *open_client_lease(const char *extra, int lease_ms)
{
    int b = base_port();
    char text[1024];
    /* Two seeds only: the rest is learnt from CLUSTER SLOTS. */
    snprintf(text, sizeof text,
             "engines = (\"redis\");\n"
             "redis = { mode = \"cluster\"; nodes = (\"127.0.0.1:%d\", \"127.0.0.1:%d\");\n"
             "  connect_timeout_ms = 300; op_timeout_ms = 500; %s };\n"
             "lock = { lease_ms = %d; renew = true; };\n"
             "retry = { max = 3; backoff_ms = 20; backoff_max_ms = 200; };\n",
             b, b + 1, extra, lease_ms);
    return cerb_test_open(text);
}

static cerb_client *open_client(void) { return open_client_lease("", LEASE_MS); }

/* ---- raw access to the cluster (hiredis, one node at a time) ---- */

static redisContext *node(int port)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && !c->err) {
        redisSetTimeout(c, tv);
        return c;
    }
    if (c)
        redisFree(c);
    return NULL;
}

static long long slot_of(const char *key)
{
    redisContext *c = node(base_port());
    long long s = -1;
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", key);
    if (r && r->type == REDIS_REPLY_INTEGER)
        s = r->integer;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return s;
}

/* The port of the master serving slot s, as node `via` sees it, or -1. */
static int owner_via(int via, long long s)
{
    redisContext *c = node(via);
    int port = -1;
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "CLUSTER SLOTS");
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->elements >= 3 && e->element[0]->integer <= s && s <= e->element[1]->integer)
            port = (int)e->element[2]->element[1]->integer;
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return port;
}

static int owner(long long s) { return owner_via(base_port(), s); }

static int pid_of(int port)
{
    char pidf[1024];
    snprintf(pidf, sizeof pidf, "%s/redis-%d.pid", cerb_test_state_dir(), port);
    FILE *f = fopen(pidf, "r");
    int pid = 0;
    if (f) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = 0;
        fclose(f);
    }
    return pid;
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

static int setup(void **state)
{
    (void)state;
    return servers("start") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    servers("stop");
    return 0;
}

/* ---- mutual exclusion over names on every master ---- */

#define N_NAMES 9
#define N_CLIENTS 2
#define N_THREADS 3 /* per client */
#define ROUNDS 40   /* per thread */

struct spread {
    char *names[N_NAMES];
    atomic_int inside[N_NAMES];
    atomic_ullong last_fence[N_NAMES];
    long counter[N_NAMES];
    atomic_int overlap, fence_regress, errors;
    cerb_client *clients[N_CLIENTS];
};

struct worker {
    struct spread *sp;
    cerb_client *c;
    unsigned seed;
    int rounds;
};

/* One critical section on name i: a read-modify-write of its counter,
 * with the overlap and fence checks of the conformance suite. */
static void critical(struct spread *sp, int i, cerb_lock *l)
{
    if (atomic_fetch_add(&sp->inside[i], 1) != 0)
        atomic_fetch_add(&sp->overlap, 1);
    uint64_t f = cerb_lock_fencing_token(l);
    if (f <= atomic_load(&sp->last_fence[i]))
        atomic_fetch_add(&sp->fence_regress, 1);
    atomic_store(&sp->last_fence[i], f);
    long v = sp->counter[i];
    sp->counter[i] = v + 1;
    atomic_fetch_sub(&sp->inside[i], 1);
}

static void *worker_main(void *ud)
{
    struct worker *w = ud;
    struct spread *sp = w->sp;
    cerb_lock *locks[N_NAMES];
    for (int i = 0; i < N_NAMES; i++)
        locks[i] = cerb_test_handle(w->c, sp->names[i]);
    for (int r = 0; r < w->rounds; r++) {
        int i = (int)(rand_r(&w->seed) % N_NAMES);
        cerb_status st = cerb_lock_trylock_for(locks[i], 10000);
        if (st != CERB_OK) {
            print_message("lock %s: %s: %s\n", sp->names[i], cerb_status_name(st),
                          cerb_last_error());
            atomic_fetch_add(&sp->errors, 1);
            continue;
        }
        critical(sp, i, locks[i]);
        if (cerb_lock_unlock(locks[i]) != CERB_OK)
            atomic_fetch_add(&sp->errors, 1);
    }
    for (int i = 0; i < N_NAMES; i++)
        cerb_lock_free(locks[i]);
    return NULL;
}

/* Names whose slots cover all three masters, some with braces (a hash tag,
 * an empty tag, a closing brace alone). */
static void spread_names(struct spread *sp)
{
    int masters[3] = {0}, n_masters = 0, n = 0;
    for (int k = 0; n < N_NAMES && k < 200; k++) {
        char base[64], name[128];
        snprintf(base, sizeof base, "spread%d", k);
        char *uniq = test_name(base);
        switch (k % 6) {
        case 0: snprintf(name, sizeof name, "%s-a", uniq); break;
        case 1: snprintf(name, sizeof name, "{%s}-tag", uniq); break;
        case 2: snprintf(name, sizeof name, "%s}-close", uniq); break;
        case 3: snprintf(name, sizeof name, "%s-{}-empty", uniq); break;
        case 4: snprintf(name, sizeof name, "{%s-b}", uniq); break;
        default: snprintf(name, sizeof name, "x{%s}y{z}", uniq); break;
        }
        free(uniq);
        int m = owner(slot_of(name));
        assert_true(m > 0);
        int seen = 0;
        for (int j = 0; j < n_masters; j++)
            seen += masters[j] == m;
        /* Take a name for a master not seen yet first, then any. */
        if (!seen && n_masters < 3)
            masters[n_masters++] = m;
        else if (n_masters < 3 && n >= N_NAMES - 3)
            continue;
        sp->names[n++] = strdup(name);
    }
    assert_int_equal(n, N_NAMES);
    assert_int_equal(n_masters, 3);
}

static void run_workers(struct spread *sp, int rounds)
{
    pthread_t th[N_CLIENTS * N_THREADS];
    struct worker w[N_CLIENTS * N_THREADS];
    for (int i = 0; i < N_CLIENTS * N_THREADS; i++) {
        w[i] = (struct worker){sp, sp->clients[i % N_CLIENTS], (unsigned)(i * 7919 + 1), rounds};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < N_CLIENTS * N_THREADS; i++)
        pthread_join(th[i], NULL);
}

static void test_spread_exclusion(void **state)
{
    (void)state;
    struct spread *sp = calloc(1, sizeof *sp);
    assert_non_null(sp);
    spread_names(sp);
    for (int i = 0; i < N_CLIENTS; i++)
        assert_non_null(sp->clients[i] = open_client());
    run_workers(sp, ROUNDS);
    long total = 0;
    for (int i = 0; i < N_NAMES; i++) {
        print_message("%-40s slot %5lld on :%d: %ld sections, last fence %llu\n", sp->names[i],
                      slot_of(sp->names[i]), owner(slot_of(sp->names[i])), sp->counter[i],
                      (unsigned long long)atomic_load(&sp->last_fence[i]));
        total += sp->counter[i];
    }
    assert_int_equal(atomic_load(&sp->overlap), 0);
    assert_int_equal(atomic_load(&sp->fence_regress), 0);
    assert_int_equal(atomic_load(&sp->errors), 0);
    assert_int_equal(total, (long)N_CLIENTS * N_THREADS * ROUNDS);
    for (int i = 0; i < N_CLIENTS; i++)
        cerb_client_close(sp->clients[i]);
    for (int i = 0; i < N_NAMES; i++)
        free(sp->names[i]);
    free(sp);
}

/* ---- a slot migrated under load ---- */

static char *cmd_str(int port, const char *fmt, ...) CERB_TEST_PRINTF(2, 3);
static char *cmd_str(int port, const char *fmt, ...)
{
    redisContext *c = node(port);
    char *out = NULL;
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS))
        out = strdup(r->str);
    else if (r && r->type == REDIS_REPLY_ERROR)
        print_message(":%d: %s\n", port, r->str);
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return out;
}

static bool cmd_ok(int port, const char *what, const char *a1, long long slot, const char *a2,
                   const char *id)
{
    redisContext *c = node(port);
    bool ok = false;
    if (!c)
        return false;
    redisReply *r = id ? redisCommand(c, "%s %s %lld %s %s", what, a1, slot, a2, id)
                       : redisCommand(c, "%s %s %lld %s", what, a1, slot, a2);
    ok = r && r->type == REDIS_REPLY_STATUS;
    if (r && !ok)
        print_message(":%d %s %s %lld %s: %s\n", port, what, a1, slot, a2,
                      r->type == REDIS_REPLY_ERROR ? r->str : "?");
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* A fault window: the slot stays half-moved this long while the load runs
 * (not a synchronisation: nothing waits for anything to happen in it). */
static void fault_window(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Move every key of slot s from src to dst (MIGRATE KEYS, two at a time
 * with a window after each, so that a lock's keys are split between the
 * two for a while: TRYAGAIN, then ASK once all of an operation's keys
 * moved). */
static int migrate_keys(int src, int dst, long long s)
{
    redisContext *c = node(src);
    int moved = 0;
    if (!c)
        return -1;
    for (;;) {
        redisReply *r = redisCommand(c, "CLUSTER GETKEYSINSLOT %lld 2", s);
        if (!r || r->type != REDIS_REPLY_ARRAY) {
            if (r)
                freeReplyObject(r);
            moved = -1;
            break;
        }
        if (r->elements == 0) {
            freeReplyObject(r);
            break;
        }
        const char *argv[32];
        size_t argl[32];
        char port[16];
        int n = 0;
        snprintf(port, sizeof port, "%d", dst);
        argv[n] = "MIGRATE", argl[n++] = 7;
        argv[n] = "127.0.0.1", argl[n++] = 9;
        argv[n] = port, argl[n++] = strlen(port);
        argv[n] = "", argl[n++] = 0;
        argv[n] = "0", argl[n++] = 1;
        argv[n] = "5000", argl[n++] = 4;
        argv[n] = "KEYS", argl[n++] = 4;
        for (size_t i = 0; i < r->elements && n < 32; i++)
            argv[n] = r->element[i]->str, argl[n++] = r->element[i]->len;
        redisReply *m = redisCommandArgv(c, n, argv, argl);
        if (!m || m->type == REDIS_REPLY_ERROR) {
            print_message("MIGRATE: %s\n", m ? m->str : "no reply");
            moved = -1;
        } else {
            moved += (int)r->elements;
        }
        if (m)
            freeReplyObject(m);
        freeReplyObject(r);
        if (moved < 0)
            break;
        fault_window(100);
    }
    redisFree(c);
    return moved;
}

/* Another master than `port`: one that serves some other slot. */
static int other_master(int port)
{
    int other = -1;
    for (long long t = 0; t < 16384 && other < 0; t += 1000)
        if (owner(t) != port)
            other = owner(t);
    return other;
}

/*
 * Move slot s from src to dst the way redis-cli --cluster reshard does:
 * SETSLOT IMPORTING on dst, MIGRATING on src, the keys moved a few at a time
 * (migrate_keys): move_slot_keys, which returns the keys moved or -1; then
 * SETSLOT NODE on every node: move_slot_end. In between, src answers ASK
 * for every key of the slot.
 */
static int move_slot_keys(long long s, int src, int dst, const char *src_id, const char *dst_id)
{
    if (!cmd_ok(dst, "CLUSTER", "SETSLOT", s, "IMPORTING", src_id) ||
        !cmd_ok(src, "CLUSTER", "SETSLOT", s, "MIGRATING", dst_id))
        return -1;
    fault_window(300);
    return migrate_keys(src, dst, s);
}

static void move_slot_end(long long s, const char *dst_id)
{
    for (int i = 0; i < N_NODES; i++)
        cmd_ok(base_port() + i, "CLUSTER", "SETSLOT", s, "NODE", dst_id);
}

static int move_slot(long long s, int src, int dst, const char *src_id, const char *dst_id)
{
    int moved = move_slot_keys(s, src, dst, src_id, dst_id);
    move_slot_end(s, dst_id);
    return moved;
}

struct churn {
    char *name;
    cerb_client *c;
    atomic_int *inside, *overlap, *fence_regress, *errors, *sections;
    atomic_ullong *last_fence;
    atomic_bool *stop;
};

static void *churn_main(void *ud)
{
    struct churn *w = ud;
    cerb_lock *l = cerb_test_handle(w->c, w->name);
    while (!atomic_load(w->stop)) {
        cerb_status st = cerb_lock_trylock_for(l, 15000);
        if (st != CERB_OK) {
            print_message("churn lock: %s: %s\n", cerb_status_name(st), cerb_last_error());
            atomic_fetch_add(w->errors, 1);
            continue;
        }
        if (atomic_fetch_add(w->inside, 1) != 0)
            atomic_fetch_add(w->overlap, 1);
        uint64_t f = cerb_lock_fencing_token(l);
        if (f <= atomic_load(w->last_fence))
            atomic_fetch_add(w->fence_regress, 1);
        atomic_store(w->last_fence, f);
        atomic_fetch_sub(w->inside, 1);
        atomic_fetch_add(w->sections, 1);
        if (cerb_lock_unlock(l) != CERB_OK) {
            print_message("churn unlock: %s\n", cerb_last_error());
            atomic_fetch_add(w->errors, 1);
        }
    }
    cerb_lock_free(l);
    return NULL;
}

struct count_at_least {
    atomic_int *n;
    int want;
};

static bool count_reached(void *ud)
{
    struct count_at_least *c = ud;
    return atomic_load(c->n) >= c->want;
}

static void test_slot_migration(void **state)
{
    (void)state;
    char *u = test_name("mig"), held[128], busy[128];
    /* Two names in one slot (one hash tag): one held for the whole test,
     * one churned by waiters. */
    snprintf(held, sizeof held, "{%s}held", u);
    snprintf(busy, sizeof busy, "{%s}busy", u);
    free(u);
    long long s = slot_of(held);
    assert_int_equal(s, slot_of(busy));
    int src = owner(s), dst = other_master(src);
    assert_true(src > 0 && dst > 0);
    char *src_id = cmd_str(src, "CLUSTER MYID"), *dst_id = cmd_str(dst, "CLUSTER MYID");
    assert_non_null(src_id);
    assert_non_null(dst_id);

    cerb_client *a = open_client(), *b = open_client(), *c = open_client();
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    cerb_lock *lh = cerb_test_handle(a, held), *other = cerb_test_handle(c, held);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(lh, on_lost, NULL);
    assert_int_equal(cerb_lock_trylock_for(lh, 5000), CERB_OK);
    uint64_t f_held = cerb_lock_fencing_token(lh);

    atomic_int inside = 0, overlap = 0, regress = 0, errors = 0, sections = 0;
    atomic_ullong last = 0;
    atomic_bool stop = false;
    struct churn w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct churn){busy, i % 2 ? b : c, &inside, &overlap, &regress, &errors,
                              &sections, &last, &stop};
        assert_int_equal(pthread_create(&th[i], NULL, churn_main, &w[i]), 0);
    }
    struct count_at_least before = {&sections, 20};
    assert_wait_until(count_reached, &before, 20000);

    int64_t t0 = cerb_test_now_ms();
    int moved = move_slot(s, src, dst, src_id, dst_id);
    assert_true(moved > 0);
    int64_t took = cerb_test_now_ms() - t0;
    int during = atomic_load(&sections);
    assert_int_equal(owner(s), dst);

    /* Keep churning on the new master, then stop. */
    struct count_at_least after = {&sections, during + 20};
    assert_wait_until(count_reached, &after, 30000);
    atomic_store(&stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);

    /* The holder kept its hold through the move: VALID, renewed on the new
     * master, and nobody else can take the name. */
    enum cerb_lock_state hs = cerb_lock_state(lh);
    cerb_status so = cerb_lock_trylock(other);
    print_message("slot %lld moved :%d -> :%d (%d keys) in %lld ms under load; %d sections "
                  "(%d before the move ended); holder %s, lost callbacks %d, another trylock "
                  "%s; last fence %llu (held %llu)\n",
                  s, src, dst, moved, (long long)took, atomic_load(&sections), during,
                  hs == CERB_LOCK_VALID ? "VALID" : "not valid", atomic_load(&lost_calls),
                  cerb_status_name(so), (unsigned long long)atomic_load(&last),
                  (unsigned long long)f_held);
    assert_int_equal(atomic_load(&overlap), 0);
    assert_int_equal(atomic_load(&regress), 0);
    assert_int_equal(atomic_load(&errors), 0);
    assert_int_equal(hs, CERB_LOCK_VALID);
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_int_not_equal(so, CERB_OK);
    assert_int_equal(cerb_lock_unlock(lh), CERB_OK);
    assert_int_equal(cerb_lock_trylock(other), CERB_OK);
    assert_true(cerb_lock_fencing_token(other) > f_held);
    assert_int_equal(cerb_lock_unlock(other), CERB_OK);
    cerb_lock_free(lh);
    cerb_lock_free(other);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(c);
    free(src_id);
    free(dst_id);
}

/* ---- a waiter blocked while its name's slot moves (issue 22 item 5) ---- */

/* What the holder, the waiter and the contender share. */
struct mig_name {
    const char *name;
    atomic_int inside, overlap;
    atomic_bool released; /* the holder is releasing: a grant before is early */
};

/*
 * The first failed calls of the waiter and of the contender, as the core
 * logs them (core/health.c: every failed engine call, at debug level, in
 * the calling thread): a failure the core retried away is still one the
 * breaker counted. Lines at WARN and above (all with CERB_TEST_DEBUG) still
 * go to stderr.
 */
#define FAILS_KEPT 3
static _Thread_local const char *mig_role;
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char fail_lines[2][FAILS_KEPT * 400]; /* waiter, contender: " | "-joined */
static int n_fail[2];

static void fail_sink(cerb_log_level level, const char *line, void *ud)
{
    (void)ud;
    int i = !mig_role ? -1 : strcmp(mig_role, "waiter") == 0 ? 0 : 1;
    if (i >= 0 && strstr(line, "engine redis: ") && strstr(line, " failed: ")) {
        pthread_mutex_lock(&fail_mu);
        size_t used = strlen(fail_lines[i]);
        if (n_fail[i]++ < FAILS_KEPT)
            snprintf(fail_lines[i] + used, sizeof fail_lines[i] - used, "%s%.390s",
                     used ? " | " : "", line);
        pthread_mutex_unlock(&fail_mu);
    }
    if (level >= CERB_LOG_WARN || getenv("CERB_TEST_DEBUG"))
        fprintf(stderr, "%s\n", line);
}

static uint64_t engine_failures(cerb_client *c)
{
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "redis", &info), CERB_OK);
    return info.failures;
}

struct mig_waiter {
    struct mig_name *m;
    cerb_client *c;
    cerb_status st;
    uint64_t fence;
    bool early;
    char why[512];
    atomic_bool done;
};

static void *mig_waiter_main(void *ud)
{
    struct mig_waiter *w = ud;
    mig_role = "waiter";
    cerb_lock *l = cerb_test_handle(w->c, w->m->name);
    /* A generous wait: the holder keeps the name through the whole move. */
    w->st = cerb_lock_trylock_for(l, 30000);
    if (w->st == CERB_OK) {
        w->early = !atomic_load(&w->m->released);
        if (atomic_fetch_add(&w->m->inside, 1) != 0)
            atomic_fetch_add(&w->m->overlap, 1);
        w->fence = cerb_lock_fencing_token(l);
        atomic_fetch_sub(&w->m->inside, 1);
        w->st = cerb_lock_unlock(l);
    }
    if (w->st != CERB_OK)
        snprintf(w->why, sizeof w->why, "%s", cerb_last_error());
    cerb_lock_free(l);
    atomic_store(&w->done, true);
    return NULL;
}

struct mig_contender {
    struct mig_name *m;
    cerb_client *c;
    atomic_bool stop;
    atomic_int tries, errors, early;
    char why[512]; /* the first error */
};

/* Short timed tries, as another user of the name would: each joins the
 * queue behind the waiter and leaves it again when its wait runs out; and
 * a look at who holds it (one MULTI ... EXEC) before each. */
static void *mig_contender_main(void *ud)
{
    struct mig_contender *k = ud;
    mig_role = "contender";
    cerb_lock *l = cerb_test_handle(k->c, k->m->name);
    while (!atomic_load(&k->stop)) {
        cerb_holder_info *v = NULL;
        size_t n = 0;
        cerb_status si = cerb_lock_inspect(k->c, k->m->name, "redis", &v, &n);
        cerb_holders_free(v, n);
        if (si != CERB_OK) {
            if (atomic_fetch_add(&k->errors, 1) == 0)
                snprintf(k->why, sizeof k->why, "inspect: %s: %s", cerb_status_name(si),
                         cerb_last_error());
            print_message("contender inspect: %s: %s\n", cerb_status_name(si),
                          cerb_last_error());
        }
        cerb_status st = cerb_lock_trylock_for(l, 250);
        if (st == CERB_OK) {
            if (!atomic_load(&k->m->released))
                atomic_fetch_add(&k->early, 1);
            if (atomic_fetch_add(&k->m->inside, 1) != 0)
                atomic_fetch_add(&k->m->overlap, 1);
            atomic_fetch_sub(&k->m->inside, 1);
            st = cerb_lock_unlock(l);
        }
        if (st != CERB_OK && st != CERB_TIMEOUT && st != CERB_BUSY) {
            if (atomic_fetch_add(&k->errors, 1) == 0)
                snprintf(k->why, sizeof k->why, "%s: %s", cerb_status_name(st),
                         cerb_last_error());
            print_message("contender: %s: %s\n", cerb_status_name(st), cerb_last_error());
        }
        atomic_fetch_add(&k->tries, 1);
    }
    cerb_lock_free(l);
    return NULL;
}

struct queued {
    cerb_client *c;
    const char *name;
};

/* Someone waits for the name (cerb_lock_inspect lists a live waiter). */
static bool has_waiter(void *ud)
{
    struct queued *q = ud;
    cerb_holder_info *v = NULL;
    size_t n = 0;
    bool found = false;
    if (cerb_lock_inspect(q->c, q->name, "redis", &v, &n) == CERB_OK)
        for (size_t i = 0; i < n; i++)
            found = found || v[i].waiting;
    cerb_holders_free(v, n);
    return found;
}

/* How many of a holder and a live waiter cerb_lock_inspect lists for the
 * name (2 when both), or -1 when it fails (printed). */
static int holder_and_waiter(cerb_client *c, const char *name)
{
    cerb_holder_info *v = NULL;
    size_t n = 0;
    bool holder = false, waiter = false;
    cerb_status st = cerb_lock_inspect(c, name, "redis", &v, &n);
    if (st != CERB_OK)
        print_message("inspect: %s: %s\n", cerb_status_name(st), cerb_last_error());
    for (size_t i = 0; i < n; i++) {
        holder = holder || !v[i].waiting;
        waiter = waiter || v[i].waiting;
    }
    cerb_holders_free(v, n);
    return st != CERB_OK ? -1 : (int)holder + (int)waiter;
}

/*
 * A holder, a waiter blocked in trylock_for and a contender on one name
 * while its slot moves to another master: the waiter's re-checks and BLPOP,
 * the marker reads and the contender's leaves from the queue meet TRYAGAIN,
 * ASK and MOVED on the way, and follow them. The waiter gets the name once
 * the holder releases it after the move, with a fence above the holder's;
 * no call fails, not even one that the core's retry would hide.
 */
static void test_waiter_through_migration(void **state)
{
    (void)state;
    char *name = test_name("migwait");
    long long s = slot_of(name);
    int src = owner(s), dst = other_master(src);
    assert_true(src > 0 && dst > 0);
    char *src_id = cmd_str(src, "CLUSTER MYID"), *dst_id = cmd_str(dst, "CLUSTER MYID");
    assert_non_null(src_id);
    assert_non_null(dst_id);
    cerb_client *a = open_client(), *b = open_client(), *c = open_client();
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);

    memset(fail_lines, 0, sizeof fail_lines);
    memset(n_fail, 0, sizeof n_fail);
    cerb_log_set(fail_sink, NULL, CERB_LOG_DEBUG);
    struct mig_name m = {.name = name};
    cerb_lock *lh = cerb_test_handle(a, name);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(lh, on_lost, NULL);
    assert_int_equal(cerb_lock_trylock_for(lh, 5000), CERB_OK);
    uint64_t f_held = cerb_lock_fencing_token(lh);
    atomic_fetch_add(&m.inside, 1);

    /* From here until the threads are joined nothing asserts: a failure
     * must not leave them running on this frame. */
    struct mig_waiter w = {.m = &m, .c = b};
    struct mig_contender k = {.m = &m, .c = c};
    pthread_t tw, tk;
    assert_int_equal(pthread_create(&tw, NULL, mig_waiter_main, &w), 0);
    struct queued q = {a, name};
    bool in_queue = wait_until(has_waiter, &q, 10000);
    bool k_started = pthread_create(&tk, NULL, mig_contender_main, &k) == 0;
    struct count_at_least some = {&k.tries, 2};
    bool contending = k_started && wait_until(count_reached, &some, 10000);

    int64_t t0 = cerb_test_now_ms();
    int moved = in_queue && contending ? move_slot_keys(s, src, dst, src_id, dst_id) : -1;
    /* Every key on dst, src answering ASK: inspect's MULTI ... EXEC goes
     * to dst after one ASKING and sees the holder and the waiter. */
    int listed = moved > 0 ? holder_and_waiter(a, name) : -1;
    move_slot_end(s, dst_id);
    int64_t took = cerb_test_now_ms() - t0;
    int now_at = owner(s);
    /* A few more tries on the new master before the holder lets go. */
    struct count_at_least more = {&k.tries, atomic_load(&k.tries) + 2};
    bool tried_after = contending && wait_until(count_reached, &more, 10000);

    enum cerb_lock_state hs = cerb_lock_state(lh);
    bool waiting = !atomic_load(&w.done);
    atomic_store(&m.released, true);
    atomic_fetch_sub(&m.inside, 1);
    int64_t t_rel = cerb_test_now_ms();
    cerb_status sr = cerb_lock_unlock(lh);
    /* The waiter's own wait (30 s) bounds this. */
    pthread_join(tw, NULL);
    int64_t t_got = cerb_test_now_ms();
    atomic_store(&k.stop, true);
    if (k_started)
        pthread_join(tk, NULL);
    uint64_t fails[3] = {engine_failures(a), engine_failures(b), engine_failures(c)};
    cerb_log_set(NULL, NULL, getenv("CERB_TEST_DEBUG") ? CERB_LOG_DEBUG : CERB_LOG_WARN);

    print_message("slot %lld moved :%d -> :%d (%d keys) in %lld ms; holder %s (fence %llu), "
                  "unlock %s; waiter %s after the move: %s%s%s, fence %llu, %lld ms after the "
                  "release; contender %d tries, %d errors, %d early; call failures: holder "
                  "%llu, waiter %llu, contender %llu; inspect halfway listed %d of 2\n",
                  s, src, dst, moved, (long long)took,
                  hs == CERB_LOCK_VALID ? "VALID" : "not valid", (unsigned long long)f_held,
                  cerb_status_name(sr), waiting ? "still waiting" : "gone",
                  cerb_status_name(w.st), w.why[0] ? ": " : "", w.why,
                  (unsigned long long)w.fence, (long long)(t_got - t_rel),
                  atomic_load(&k.tries), atomic_load(&k.errors), atomic_load(&k.early),
                  (unsigned long long)fails[0], (unsigned long long)fails[1],
                  (unsigned long long)fails[2], listed);
    assert_true(in_queue);
    assert_true(contending);
    assert_true(moved > 0);
    assert_int_equal(listed, 2);
    assert_int_equal(now_at, dst);
    assert_true(tried_after);
    if (!waiting)
        fail_msg("the waiter did not wait through the move: %s: %s", cerb_status_name(w.st),
                 w.why);
    if (w.st != CERB_OK)
        fail_msg("waiter: %s: %s", cerb_status_name(w.st), w.why);
    /* A redirect is not a failure of the engine: none may reach the
     * breaker, even one the core's retry hid from the caller. */
    if (fails[1] != 0)
        fail_msg("the waiter's calls failed %llu times: %s",
                 (unsigned long long)fails[1], fail_lines[0]);
    if (atomic_load(&k.errors) != 0)
        fail_msg("contender: %s", k.why);
    if (fails[2] != 0)
        fail_msg("the contender's calls failed %llu times: %s",
                 (unsigned long long)fails[2], fail_lines[1]);
    assert_int_equal(fails[0], 0);
    assert_int_equal(hs, CERB_LOCK_VALID);
    assert_int_equal(sr, CERB_OK);
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_false(w.early);
    assert_true(w.fence > f_held);
    assert_int_equal(atomic_load(&k.early), 0);
    assert_int_equal(atomic_load(&m.overlap), 0);
    cerb_lock_free(lh);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(c);
    free(src_id);
    free(dst_id);
    free(name);
}

/* A waiter in lock_interruptibly (no deadline) on a handle of its own. */
struct intr_waiter {
    cerb_lock *l;
    cerb_status st;
    char why[512];
    atomic_bool done;
};

static void *intr_waiter_main(void *ud)
{
    struct intr_waiter *w = ud;
    w->st = cerb_lock_lock_interruptibly(w->l);
    snprintf(w->why, sizeof w->why, "%s", w->st == CERB_OK ? "" : cerb_last_error());
    if (w->st == CERB_OK)
        cerb_lock_unlock(w->l);
    atomic_store(&w->done, true);
    return NULL;
}

static bool intr_done(void *ud) { return atomic_load(&((struct intr_waiter *)ud)->done); }

/*
 * A slot left half moved (every key on the target, SETSLOT NODE not yet
 * sent): a waiter's every try is sent on, ASK then TRYAGAIN, for as long as
 * the operator leaves it so. A waiter without a deadline must still end on
 * cerb_lock_interrupt(), promptly, and with no I/O error.
 */
static void test_interrupt_in_half_moved_slot(void **state)
{
    (void)state;
    char *name = test_name("mighalf");
    long long s = slot_of(name);
    int src = owner(s), dst = other_master(src);
    assert_true(src > 0 && dst > 0);
    char *src_id = cmd_str(src, "CLUSTER MYID"), *dst_id = cmd_str(dst, "CLUSTER MYID");
    assert_non_null(src_id);
    assert_non_null(dst_id);
    cerb_client *a = open_client(), *b = open_client();
    assert_non_null(a);
    assert_non_null(b);
    cerb_lock *lh = cerb_test_handle(a, name);
    assert_int_equal(cerb_lock_trylock_for(lh, 5000), CERB_OK);

    /* Nothing asserts until the waiter is joined. */
    struct intr_waiter w = {.l = cerb_test_handle(b, name)};
    pthread_t tw;
    assert_int_equal(pthread_create(&tw, NULL, intr_waiter_main, &w), 0);
    struct queued q = {a, name};
    bool in_queue = wait_until(has_waiter, &q, 10000);
    int moved = in_queue ? move_slot_keys(s, src, dst, src_id, dst_id) : -1;
    /* The slot stays half moved while the waiter's tries go round. */
    fault_window(500);
    bool waiting = !atomic_load(&w.done);
    int64_t t0 = cerb_test_now_ms();
    cerb_lock_interrupt(w.l);
    bool ended = wait_until(intr_done, &w, 5000);
    int64_t took = cerb_test_now_ms() - t0;
    move_slot_end(s, dst_id); /* lets a waiter that missed the interrupt on */
    pthread_join(tw, NULL);
    uint64_t fails = engine_failures(b);

    print_message("slot %lld half moved :%d -> :%d (%d keys); waiter %s, then %s%s%s %lld ms "
                  "after the interrupt; its calls failed %llu times\n",
                  s, src, dst, moved, waiting ? "still waiting" : "gone",
                  cerb_status_name(w.st), w.why[0] ? ": " : "", w.why, (long long)took,
                  (unsigned long long)fails);
    assert_true(in_queue);
    assert_true(moved > 0);
    if (!waiting)
        fail_msg("the waiter did not wait in the half-moved slot: %s: %s",
                 cerb_status_name(w.st), w.why);
    assert_true(ended);
    assert_int_equal(w.st, CERB_INTERRUPTED);
    assert_true(took < 2000);
    assert_int_equal(fails, 0);
    assert_int_equal(cerb_lock_unlock(lh), CERB_OK);
    cerb_lock_free(w.l);
    cerb_lock_free(lh);
    cerb_client_close(a);
    cerb_client_close(b);
    free(src_id);
    free(dst_id);
    free(name);
}

/* ---- a master killed, its replica promoted ---- */

static bool settled(void *ud)
{
    enum cerb_lock_state st = cerb_lock_state(ud);
    return st == CERB_LOCK_VALID || st == CERB_LOCK_LOST;
}

struct slot_owner {
    long long slot;
    int old, via;
};

static bool slot_moved(void *ud)
{
    struct slot_owner *o = ud;
    int now = owner_via(o->via, o->slot);
    return now > 0 && now != o->old;
}

static void test_master_killed(void **state)
{
    (void)state;
    char *u = test_name("kill"), held[128], fresh[128];
    snprintf(held, sizeof held, "{%s}held", u);
    snprintf(fresh, sizeof fresh, "{%s}fresh", u);
    free(u);
    long long s = slot_of(held);
    /* A lease longer than the promotion (about 5 s here): the holder can
     * be kept, its key renewed on the promoted replica; LOST is allowed
     * too (the assertions below hold either way). */
    cerb_client *a = open_client_lease("", KILL_LEASE_MS), *b = open_client_lease("", KILL_LEASE_MS);
    assert_non_null(a);
    assert_non_null(b);
    cerb_lock *la = cerb_test_handle(a, held), *lb = cerb_test_handle(b, fresh);
    cerb_lock *lbh = cerb_test_handle(b, held);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(la, on_lost, NULL);
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(la);
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    uint64_t fb1 = cerb_lock_fencing_token(lb);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);

    struct slot_owner o = {s, owner(s), -1};
    assert_true(o.old > 0);
    /* Ask a node that stays up. */
    o.via = o.old == base_port() ? base_port() + 1 : base_port();
    /* The replica has every write so far (WAIT on the master). */
    char *w = cmd_str(o.old, "PING");
    free(w);
    redisContext *mc = node(o.old);
    assert_non_null(mc);
    redisReply *wr = redisCommand(mc, "WAIT 1 5000");
    assert_non_null(wr);
    freeReplyObject(wr);
    redisFree(mc);

    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(kill(pid_of(o.old), SIGKILL), 0);
    assert_wait_until(slot_moved, &o, 30000);
    int64_t t_moved = cerb_test_now_ms();

    cerb_status st = cerb_lock_trylock_for(lb, KILL_LEASE_MS + 15000);
    int64_t t_grant = cerb_test_now_ms();
    if (st != CERB_OK)
        fail_msg("fresh name after the failover: %s: %s", cerb_status_name(st), cerb_last_error());
    uint64_t fb2 = cerb_lock_fencing_token(lb);
    print_message("master :%d killed; :%d serves slot %lld after %lld ms; a fresh name in it "
                  "granted %lld ms after the kill; fences %llu then %llu (holder's %llu)\n",
                  o.old, owner_via(o.via, s), s, (long long)(t_moved - t_kill),
                  (long long)(t_grant - t_kill), (unsigned long long)fb1,
                  (unsigned long long)fb2, (unsigned long long)fa);
    assert_true(fb2 > fb1);
    assert_true(fb2 > fa);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);

    /* The holder: kept (renewed on the promoted replica) or told LOST,
     * never silently both. */
    assert_wait_until(settled, la, 3 * KILL_LEASE_MS);
    cerb_status sb = cerb_lock_trylock(lbh);
    enum cerb_lock_state sa = cerb_lock_state(la);
    print_message("holder %s (lost callbacks %d); another client's trylock: %s\n",
                  sa == CERB_LOCK_VALID ? "kept" : "LOST", atomic_load(&lost_calls),
                  cerb_status_name(sb));
    if (sa == CERB_LOCK_VALID)
        assert_int_not_equal(sb, CERB_OK);
    else
        assert_int_equal(atomic_load(&lost_calls), 1);
    if (sb == CERB_OK) {
        assert_true(cerb_lock_fencing_token(lbh) > fa);
        assert_int_equal(cerb_lock_unlock(lbh), CERB_OK);
    }
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_lock_free(lbh);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- redis-py's RedisCluster.lock on the same names, both ways ---- */

/* Holds the lock until the release file appears (bounded), then releases. */
static const char *PY_HOLD =
    "import os, sys, time\n"
    "from redis.cluster import RedisCluster\n"
    "port, name, held, release = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]\n"
    "r = RedisCluster(host='127.0.0.1', port=port)\n"
    "l = r.lock(name, timeout=10)\n"
    "if not l.acquire(blocking=True, blocking_timeout=5): sys.exit(2)\n"
    "open(held, 'w').close()\n"
    "end = time.monotonic() + 10\n"
    "while not os.path.exists(release) and time.monotonic() < end: time.sleep(0.01)\n"
    "l.release()\n"
    "sys.exit(0)\n";

/* Exit 0 when a non-blocking acquire gives `expect` (1/0); releases after. */
static const char *PY_TRY =
    "import sys\n"
    "from redis.cluster import RedisCluster\n"
    "port, name, expect = int(sys.argv[1]), sys.argv[2], sys.argv[3] == '1'\n"
    "r = RedisCluster(host='127.0.0.1', port=port)\n"
    "l = r.lock(name, timeout=10)\n"
    "got = l.acquire(blocking=False)\n"
    "if got: l.release()\n"
    "sys.exit(0 if got == expect else 1)\n";

static bool file_exists(void *ud)
{
    FILE *f = fopen(ud, "r");
    if (f)
        fclose(f);
    return f != NULL;
}

static void test_redispy_cluster_interop(void **state)
{
    (void)state;
    char *argv0[] = {(char *)cerb_test_python(), "-c", "from redis.cluster import RedisCluster",
                     NULL};
    if (cerb_test_run(argv0, 20000) != 0)
        fail_msg("python3-redis with redis.cluster (4.1 or later) is required");
    char held[64], release[64], port[16];
    snprintf(held, sizeof held, "/tmp/cerb-pyc-held-%d", (int)getpid());
    snprintf(release, sizeof release, "/tmp/cerb-pyc-release-%d", (int)getpid());
    /* A seed that is not the master of the name's slot: redis-py follows
     * MOVED as we do. */
    snprintf(port, sizeof port, "%d", base_port() + 1);
    cerb_client *c = open_client();
    assert_non_null(c);
    for (int k = 0; k < 2; k++) {
        char *name = test_name(k ? "py{tag}c" : "pyc");
        unlink(held);
        unlink(release);
        char *argv[] = {(char *)cerb_test_python(), "-c", (char *)PY_HOLD, port, name, held,
                        release, NULL};
        pid_t py = cerb_test_spawn(argv);
        assert_true(py > 0);
        assert_wait_until(file_exists, held, 15000);
        cerb_lock *l = cerb_test_handle(c, name);
        assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
        assert_int_equal(cerb_lock_trylock_for(l, 300), CERB_TIMEOUT);
        /* redis-py releases without notifying; the waiter still sees it. */
        FILE *f = fopen(release, "w");
        assert_non_null(f);
        fclose(f);
        int64_t t0 = cerb_test_now_ms();
        assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
        assert_true(cerb_test_now_ms() - t0 < 2000);
        assert_int_equal(cerb_test_wait(py, 15000), 0);
        /* While we hold it, redis-py cannot take it; after, it can. */
        char *argv2[] = {(char *)cerb_test_python(), "-c", (char *)PY_TRY, port, name, "0", NULL};
        assert_int_equal(cerb_test_run(argv2, 20000), 0);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        char *argv3[] = {(char *)cerb_test_python(), "-c", (char *)PY_TRY, port, name, "1", NULL};
        assert_int_equal(cerb_test_run(argv3, 20000), 0);
        cerb_lock_free(l);
        free(name);
    }
    cerb_client_close(c);
    unlink(held);
    unlink(release);
}

/* ---- `cerberus holders` in cluster mode ---- */

/* The first "redis: " line `cerberus -c cfg holders name` prints (malloc'd).
 * The command is bounded by the configuration's timeouts. */
static char *holders_line(const char *cfg, const char *name)
{
    char cmd[4096], line[1024];
    snprintf(cmd, sizeof cmd, "timeout 20 '%s/cli/cerberus' -c '%s' holders '%s' 2>&1",
             cerb_test_build_dir(), cfg, name);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *found = NULL;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        print_message("holders: %s\n", line);
        if (!found && strncmp(line, "redis: ", 7) == 0)
            found = strdup(line);
    }
    assert_int_equal(pclose(p), 0);
    assert_non_null(found);
    return found;
}

static void test_cli_holders(void **state)
{
    (void)state;
    char *cfg = cerb_test_write_config(
        "engines = (\"redis\");\n"
        "redis = { mode = \"cluster\"; nodes = (\"127.0.0.1:%d\"); };\n", base_port());
    cerb_client *c = open_client();
    assert_non_null(c);
    for (int k = 0; k < 2; k++) {
        char *u = test_name("cli"), name[128], want[64];
        /* A plain name, and one with a '}' (helper keys "{n}K..."). */
        snprintf(name, sizeof name, k ? "%s}x" : "%s", u);
        free(u);
        cerb_lock *l = cerb_test_handle(c, name);
        assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
        snprintf(want, sizeof want, ", fence %llu",
                 (unsigned long long)(cerb_lock_fencing_token(l) & ((UINT64_C(1) << 48) - 1)));
        char *line = holders_line(cfg, name);
        assert_true(strncmp(line, "redis: held by ", 15) == 0);
        assert_non_null(strstr(line, want));
        free(line);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        line = holders_line(cfg, name);
        assert_string_equal(line, "redis: free");
        free(line);
        cerb_lock_free(l);
    }
    cerb_client_close(c);
    cerb_test_remove_file(cfg);
}

/* ---- guard records, one slot each, on every master ---- */

static void test_guard_records(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    assert_non_null(c);
    for (int i = 0; i < 12; i++) {
        char base[32];
        snprintf(base, sizeof base, "guard%d", i);
        char *key = test_name(base);
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(c, "op", key, strlen(key), NULL, &g), CERB_OK);
        assert_int_equal(cerb_guard_degraded(g), 0);
        assert_int_equal(cerb_guard_finish(g, 1, key, strlen(key)), CERB_OK);
        cerb_guard_free(g);
        g = NULL;
        assert_int_equal(cerb_guard_begin(c, "op", key, strlen(key), NULL, &g), CERB_DUPLICATE);
        size_t len = 0;
        const void *res = cerb_guard_result(g, &len);
        assert_int_equal(len, strlen(key));
        assert_memory_equal(res, key, len);
        cerb_guard_free(g);
        free(key);
    }
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spread_exclusion),
        cmocka_unit_test(test_redispy_cluster_interop),
        cmocka_unit_test(test_cli_holders),
        cmocka_unit_test(test_guard_records),
        cmocka_unit_test(test_slot_migration),
        cmocka_unit_test(test_waiter_through_migration),
        cmocka_unit_test(test_interrupt_in_half_moved_slot),
        cmocka_unit_test(test_master_killed),
    };
    cerb_test_debug_aids();
    return cmocka_run_group_tests(tests, setup, teardown);
}
