/*
 * conformance.c — the engine conformance suite: the public lock contract
 * that every engine must keep, written once and run once per engine
 * (conformance_local, conformance_redis, conformance_zk, conformance_etcd,
 * registered by tests/conformance.cmake). The engine is fixed at compile time
 * by CERB_CONFORMANCE_ENGINE ("local", "redis", "zk" or "etcd").
 *
 * The cases: reentrancy and hold counts, exclusion between threads of
 * separate clients, between threads sharing one handle and between processes
 * (no overlap, no lost update, fencing tokens strictly increasing per name),
 * trylock / trylock_for / interruptible waits with their timing, unlock by a
 * non-owner (another client, another thread), holds that outlive many leases
 * (and the engine's session timeout, where it has one), lock name and option
 * edge cases, an unknown engine in the config, and the health prober.
 *
 * What differs per engine is kept in one table, `engines`: how to write the
 * config (the existing helpers of test_util.h, zk_util.h, etcd_util.h), how
 * to count what the server keeps for a lock name (holder plus queued
 * waiters: the key and its queue on redis, the lock nodes on zk, the keys
 * under "<name>/" on etcd) so that every case can also check that nothing is
 * left behind, and what an engine needs to exclude across processes (the
 * local engine does so only through flock files in `local.dir`). Wire
 * layouts, interop, tampering with the server and engine-specific error
 * paths stay in test_redis.c, test_zk.c and test_etcd.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#ifdef CERB_CONF_REDIS
#include <hiredis/hiredis.h>

#include "redlock_util.h"
#endif
#ifdef CERB_CONF_ZK
#include "zk_util.h"
#endif
#ifdef CERB_CONF_ETCD
#include "etcd_util.h"
#endif
#ifdef CERB_CONF_PG
#include "pg_util.h"
#endif
#ifdef CERB_CONF_MYSQL
#include "mysql_util.h"
#endif
#ifdef CERB_CONF_MEMCACHED
#include "mc_util.h"
#endif

#ifndef CERB_CONFORMANCE_ENGINE
#error "compile with -DCERB_CONFORMANCE_ENGINE=\"<engine>\" (tests/conformance.cmake does)"
#endif

/* ------------------------------------------------------------ engines */

struct engine {
    const char *name;
    /* Config text with this engine alone: `engines = ("<name>");
     * <name> = { <engine_extra> }; <extra>` (malloc'd). */
    char *(*config)(const char *engine_extra, const char *extra);
    /* engine_extra that makes the client's session shorter than the holds
     * of test_hold_past_lease, NULL when the engine has no session. */
    const char *short_session;
    /* What the server keeps for lock @name: the holder plus each queued
     * waiter; NULL when the engine keeps nothing a test can look at. */
    int (*records)(const char *name);
    /* Drop raw connections opened by records() (before fork, at the end). */
    void (*raw_close)(void);
    /* Processes exclude each other only through files in `local.dir`. */
    bool needs_dir;
    /* Rounds per thread / per process in the exclusion cases (the four
     * threads and four processes are the same for every engine). */
    int thread_rounds, proc_rounds;
    /* The suite's name when it differs from the engine's (a mode of it). */
    const char *suite;
    /* No CERB_CAP_FENCING: tokens carry the epoch alone, so the cases do
     * not ask successive grants for larger ones (memcached). */
    bool no_fence;
};

static char *local_config(const char *engine_extra, const char *extra)
{
    static const char fmt[] = "engines = (\"local\");\nlocal = { %s };\n%s\n";
    const char *ee = engine_extra ? engine_extra : "", *ex = extra ? extra : "";
    int len = snprintf(NULL, 0, fmt, ee, ex);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, fmt, ee, ex);
    return s;
}

#ifdef CERB_CONF_REDIS
/* The lock's key plus its wait queue `{name}\x1fq` (redis_scripts.h). The
 * fence counter `{name}\x1ffence` stays by design and is not counted. */
static int redis_records(const char *name)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    if (!r || r->err)
        fail_msg("redis: cannot connect to port %d", cerb_test_redis_port());
    redisSetTimeout(r, tv);
    redisReply *k = redisCommand(r, "EXISTS %s", name);
    redisReply *q = redisCommand(r, "LLEN {%s}\x1fq", name);
    if (!k || !q || k->type != REDIS_REPLY_INTEGER || q->type != REDIS_REPLY_INTEGER)
        fail_msg("redis: EXISTS/LLEN of %s failed", name);
    int n = (int)(k->integer + q->integer);
    freeReplyObject(k);
    freeReplyObject(q);
    redisFree(r);
    return n;
}
#endif

#ifdef CERB_CONF_REDIS
#endif

#ifdef CERB_CONF_ZK
static zhandle_t *zk_raw;

static char *zk_config(const char *zk_extra, const char *extra)
{
    return cerb_test_zk_config(NULL, zk_extra, extra);
}

/* The children of <root>/<name>: one lock node per holder or waiter. */
static int zk_records(const char *name)
{
    if (!zk_raw && !(zk_raw = cerb_test_zk_connect(NULL, NULL)))
        fail_msg("zk: cannot connect to port %d", cerb_test_zk_port());
    char *path = cerb_test_zk_lock_path(name);
    int rc, n = cerb_test_zk_children(zk_raw, path, NULL, &rc);
    free(path);
    if (n < 0 && rc != ZNONODE)
        fail_msg("zk: getChildren: %s", zerror(rc));
    return n < 0 ? 0 : n;
}

/* libzookeeper_mt runs threads: none may be alive when the suite forks. */
static void zk_raw_close(void)
{
    if (zk_raw)
        cerb_test_zk_close(zk_raw);
    zk_raw = NULL;
}
#endif

#ifdef CERB_CONF_ETCD
/* The keys "<name>/<lease hex>": one per holder or waiter. */
static int etcd_records(const char *name)
{
    char prefix[512];
    struct etcd_test_kv kv[8];
    snprintf(prefix, sizeof prefix, "%s/", name);
    int n = etcd_test_keys(etcd_test_port(), prefix, kv, 8);
    if (n < 0)
        fail_msg("etcd: cannot list the keys of %s", name);
    return n;
}
#endif

#ifdef CERB_CONF_PG
/* pg.mode = "lease": the row alone, as behind a transaction pooler. */
static char *pg_lease_config(const char *pg_extra, const char *extra)
{
    char buf[512];
    snprintf(buf, sizeof buf, "mode = \"lease\"; %s", pg_extra ? pg_extra : "");
    return pg_test_config(buf, extra);
}

static int pg_records(const char *name)
{
    int n = pg_test_records(name);
    if (n < 0)
        fail_msg("pg: cannot count the records of %s", name);
    return n;
}
#endif

#ifdef CERB_CONF_MYSQL
/* mysql.mode = "lease": the row alone, as on Galera. */
static char *mysql_lease_config(const char *my_extra, const char *extra)
{
    char buf[512];
    snprintf(buf, sizeof buf, "mode = \"lease\"; %s", my_extra ? my_extra : "");
    return mysql_test_config(buf, extra);
}

static int mysql_records(const char *name)
{
    int n = mysql_test_records(name);
    if (n < 0)
        fail_msg("mysql: cannot count the records of %s", name);
    return n;
}
#endif

/* The counts of rounds are those each engine's own suite used before the
 * cases moved here. */
static const struct engine engines[] = {
    {"local", local_config, NULL, NULL, NULL, true, 100, 25, NULL, false},
#ifdef CERB_CONF_REDIS
    {"redis", cerb_test_redis_config, NULL, redis_records, NULL, false, 100, 50, NULL, false},
    /* Redlock mode: a waiter polls and keeps nothing on the server (as
     * pg_lease), so no record counts; test_redlock.c checks the masters. */
    {"redis", rl_config, NULL, NULL, NULL, false, 40, 20, "redis_redlock", false},
#endif
#ifdef CERB_CONF_ZK
    {"zk", zk_config, "session_timeout_ms = 2000;", zk_records, zk_raw_close, false, 40, 25, NULL,
     false},
#endif
#ifdef CERB_CONF_ETCD
    {"etcd", etcd_test_config, "session_ttl_s = 2;", etcd_records, NULL, false, 25, 20, NULL,
     false},
#endif
#ifdef CERB_CONF_PG
    {"pg", pg_test_config, NULL, pg_records, NULL, false, 50, 25, NULL, false},
    /* A waiter in lease mode polls and keeps nothing on the server. */
    {"pg", pg_lease_config, NULL, NULL, NULL, false, 25, 15, "pg_lease", false},
#endif
#ifdef CERB_CONF_MYSQL
    {"mysql", mysql_test_config, NULL, mysql_records, NULL, false, 50, 25, NULL, false},
    /* A waiter in lease mode polls and keeps nothing on the server. */
    {"mysql", mysql_lease_config, NULL, NULL, NULL, false, 25, 15, "mysql_lease", false},
#endif
#ifdef CERB_CONF_MEMCACHED
    /* A waiter polls and keeps nothing on the server; no fence. */
    {"memcached", mc_test_config, NULL, NULL, NULL, false, 50, 25, NULL, true},
#endif
};

static const struct engine *E; /* the engine under test */

/* A later grant's token is above an earlier one's, where the engine
 * fences. */
#define assert_fence_above(later, earlier) assert_true(E->no_fence || (later) > (earlier))

static int group_setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++)
        if (strcmp(engines[i].suite ? engines[i].suite : engines[i].name,
                   CERB_CONFORMANCE_ENGINE) == 0)
            E = &engines[i];
    if (!E) {
        fprintf(stderr, "conformance: engine \"%s\" is not built into this suite\n",
                CERB_CONFORMANCE_ENGINE);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (E && E->raw_close)
        E->raw_close();
    return 0;
}

/* ------------------------------------------------------------ helpers */

static cerb_client *open_client(const char *engine_extra, const char *extra)
{
    char *cfg = E->config(engine_extra, extra);
    assert_non_null(cfg);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("%s: open: %s: %s", E->name, cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name, int64_t lease_ms)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = lease_ms;
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(c, name, &o, &l);
    if (st != CERB_OK)
        fail_msg("lock_new(%s): %s", name, cerb_last_error());
    return l;
}

/* Two clients with a handle each on one fresh lock name: the holder and
 * the other owner most cases need. */
struct pair {
    cerb_client *c1, *c2;
    char *name;
    cerb_lock *a, *b;
};

static void pair_open(struct pair *p, const char *prefix, int64_t lease_ms)
{
    p->c1 = open_client(NULL, NULL);
    p->c2 = open_client(NULL, NULL);
    p->name = test_name(prefix);
    p->a = mk(p->c1, p->name, lease_ms);
    p->b = mk(p->c2, p->name, lease_ms);
}

static void pair_close(struct pair *p)
{
    cerb_lock_free(p->a);
    cerb_lock_free(p->b);
    free(p->name);
    cerb_client_close(p->c1);
    cerb_client_close(p->c2);
}

struct records_arg {
    const char *name;
    int want;
};

static bool records_are(void *ud)
{
    struct records_arg *r = ud;
    return E->records(r->name) == r->want;
}

/* The server keeps exactly @want records for @name (skipped where the
 * engine keeps none a test can see). */
static void expect_records(const char *name, int want)
{
    if (E->records)
        assert_int_equal(E->records(name), want);
}

static void expect_records_soon(const char *name, int want, int64_t timeout_ms)
{
    struct records_arg r = {name, want};
    if (E->records)
        assert_wait_until(records_are, &r, timeout_ms);
}

/* Another thread acting on a lock handle. */
enum other_op { OP_TRYLOCK, OP_TRYLOCK_FOR, OP_INTERRUPTIBLY, OP_UNLOCK };

struct other {
    cerb_lock *l;
    enum other_op op;
    int64_t wait_ms;
    cerb_status st;
    uint64_t fence; /* while it held the lock */
    atomic_bool done;
};

static void *other_main(void *arg)
{
    struct other *o = arg;
    switch (o->op) {
    case OP_TRYLOCK: o->st = cerb_lock_trylock(o->l); break;
    case OP_TRYLOCK_FOR: o->st = cerb_lock_trylock_for(o->l, o->wait_ms); break;
    case OP_INTERRUPTIBLY: o->st = cerb_lock_lock_interruptibly(o->l); break;
    case OP_UNLOCK: o->st = cerb_lock_unlock(o->l); break;
    }
    if (o->st == CERB_OK && o->op != OP_UNLOCK) {
        o->fence = cerb_lock_fencing_token(o->l);
        cerb_lock_unlock(o->l);
    }
    atomic_store(&o->done, true);
    return NULL;
}

static bool other_done(void *ud) { return atomic_load(&((struct other *)ud)->done); }

/* Wait until @o's wait is queued behind the holder of @name: on the server
 * where the engine shows its queue (holder + waiter = 2 records), else by
 * its still waiting after 300 ms. */
static void wait_queued(struct other *o, const char *name)
{
    if (E->records)
        expect_records_soon(name, 2, 3000);
    else
        assert_false(wait_until(other_done, o, 300));
    assert_false(other_done(o));
}

/* ------------------------------------------------ reentrancy and fences */

static void test_reentrancy_and_hold_count(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, "reent", 0);
    cerb_lock *a = p.a, *b = p.b;
    const char *name = p.name;

    assert_int_equal(cerb_lock_state(a), CERB_LOCK_FREE);
    assert_int_equal(cerb_lock_hold_count(a), 0);
    assert_int_equal(cerb_lock_fencing_token(a), 0);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    uint64_t f = cerb_lock_fencing_token(a);
    assert_true(E->no_fence ? f == 0 : f > 0); /* no token, not a bare epoch */
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_VALID);
    /* Every kind of acquisition re-enters: counted locally, same grant,
     * nothing more on the server. */
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(cerb_lock_trylock(a), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(a, 10), CERB_OK);
    assert_int_equal(cerb_lock_lock_interruptibly(a), CERB_OK);
    assert_int_equal(cerb_lock_hold_count(a), 5);
    assert_int_equal(cerb_lock_fencing_token(a), f);
    expect_records(name, 1);
    /* Every hold but the last keeps it. */
    for (unsigned left = 4; left >= 1; left--) {
        assert_int_equal(cerb_lock_unlock(a), CERB_OK);
        assert_int_equal(cerb_lock_hold_count(a), left);
        assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    }
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(cerb_lock_hold_count(a), 0);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_FREE);
    assert_int_equal(cerb_lock_fencing_token(a), 0);
    assert_int_equal(cerb_lock_unlock(a), CERB_NOT_OWNER);
    expect_records(name, 0);
    /* Successive grants, by another client and by the same handle, get
     * strictly larger fences. */
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    uint64_t fb = cerb_lock_fencing_token(b);
    assert_fence_above(fb, f);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_fence_above(cerb_lock_fencing_token(a), fb);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    expect_records(name, 0);
    pair_close(&p);
}

/* ------------------------------- exclusion across threads, own clients */

struct mx {
    const char *name;
    int rounds;
    atomic_int inside;
    atomic_int overlap, errors, counter, fence_regress;
    pthread_mutex_t fmu;
    uint64_t last_fence;
};

static void *mx_main(void *arg)
{
    struct mx *m = arg;
    cerb_client *c = open_client(NULL, NULL);
    cerb_lock *l = mk(c, m->name, 5000);
    for (int i = 0; i < m->rounds; i++) {
        if (cerb_lock_lock(l) != CERB_OK) {
            atomic_fetch_add(&m->errors, 1);
            continue;
        }
        if (atomic_fetch_add(&m->inside, 1) != 0)
            atomic_fetch_add(&m->overlap, 1);
        uint64_t f = cerb_lock_fencing_token(l);
        pthread_mutex_lock(&m->fmu);
        if (!E->no_fence && f <= m->last_fence)
            atomic_fetch_add(&m->fence_regress, 1);
        m->last_fence = f;
        pthread_mutex_unlock(&m->fmu);
        atomic_fetch_add(&m->counter, 1);
        atomic_fetch_sub(&m->inside, 1);
        if (cerb_lock_unlock(l) != CERB_OK)
            atomic_fetch_add(&m->errors, 1);
    }
    cerb_lock_free(l);
    cerb_client_close(c);
    return NULL;
}

static void test_exclusion_threads(void **state)
{
    (void)state;
    char *name = test_name("mx");
    struct mx m = {.name = name, .rounds = E->thread_rounds,
                   .fmu = PTHREAD_MUTEX_INITIALIZER};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, mx_main, &m), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&m.errors), 0);
    assert_int_equal(atomic_load(&m.overlap), 0);
    assert_int_equal(atomic_load(&m.fence_regress), 0);
    assert_int_equal(atomic_load(&m.counter), 4 * E->thread_rounds);
    expect_records(name, 0);
    free(name);
}

/* -------------------- exclusion across threads sharing one handle */

/* Threads of one client share its connection or session: the local queue
 * serialises them, and they exclude each other too. */
struct same {
    cerb_lock *l;
    atomic_int inside, overlap, errors;
};

static void *same_main(void *arg)
{
    struct same *s = arg;
    for (int i = 0; i < 20; i++) {
        if (cerb_lock_lock(s->l) != CERB_OK) {
            atomic_fetch_add(&s->errors, 1);
            continue;
        }
        if (atomic_fetch_add(&s->inside, 1) != 0)
            atomic_fetch_add(&s->overlap, 1);
        atomic_fetch_sub(&s->inside, 1);
        if (cerb_lock_unlock(s->l) != CERB_OK)
            atomic_fetch_add(&s->errors, 1);
    }
    return NULL;
}

static void test_exclusion_one_handle(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("one");
    struct same s = {.l = mk(c, name, 0)};
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, same_main, &s), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&s.errors), 0);
    assert_int_equal(atomic_load(&s.overlap), 0);
    expect_records(name, 0);
    cerb_lock_free(s.l);
    free(name);
    cerb_client_close(c);
}

/* ---------------------------------------- exclusion across processes */

/* Shared by the forked children: the counter is a plain read-modify-write
 * under the lock, so a lost update shows as a short count. */
struct shared {
    atomic_int inside, overlap, fence_regress;
    atomic_ullong last_fence;
    long counter;
};

struct proc_arg {
    const char *name;
    const char *dir; /* local.dir, or NULL */
    struct shared *sh;
    int rounds;
};

static int proc_main(void *ud)
{
    struct proc_arg *a = ud;
    char extra[512] = "";
    if (a->dir)
        snprintf(extra, sizeof extra, "dir = \"%s\";", a->dir);
    char *cfg = E->config(extra, NULL);
    cerb_client *c = NULL;
    if (!cfg || cerb_client_open_string(&c, cfg) != CERB_OK)
        return 10;
    free(cfg);
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, a->name, NULL, &l) != CERB_OK)
        return 11;
    for (int i = 0; i < a->rounds; i++) {
        if (cerb_lock_lock(l) != CERB_OK)
            return 12;
        if (atomic_fetch_add(&a->sh->inside, 1) != 0)
            atomic_fetch_add(&a->sh->overlap, 1);
        uint64_t f = cerb_lock_fencing_token(l);
        if (!E->no_fence && f <= atomic_load(&a->sh->last_fence))
            atomic_fetch_add(&a->sh->fence_regress, 1);
        atomic_store(&a->sh->last_fence, f);
        long v = a->sh->counter;
        a->sh->counter = v + 1;
        atomic_fetch_sub(&a->sh->inside, 1);
        if (cerb_lock_unlock(l) != CERB_OK)
            return 13;
    }
    cerb_lock_free(l);
    cerb_client_close(c);
    return 0;
}

/* rm -r of a flat directory of lock files. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static void test_exclusion_processes(void **state)
{
    (void)state;
    char *name = test_name("procs");
    char dir[] = "/tmp/cerb-conf-XXXXXX";
    if (E->needs_dir)
        assert_non_null(mkdtemp(dir));
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                             -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    struct proc_arg a = {name, E->needs_dir ? dir : NULL, sh, E->proc_rounds};
    if (E->raw_close)
        E->raw_close(); /* fork with no helper threads running */
    pid_t pids[4];
    for (int i = 0; i < 4; i++)
        assert_true((pids[i] = cerb_test_fork(proc_main, &a)) > 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cerb_test_wait(pids[i], 120000), 0);
    assert_int_equal(sh->counter, 4 * E->proc_rounds); /* no lost update */
    assert_int_equal(atomic_load(&sh->overlap), 0);
    assert_int_equal(atomic_load(&sh->fence_regress), 0);
    expect_records(name, 0);
    munmap(sh, sizeof *sh);
    if (E->needs_dir)
        remove_dir(dir);
    free(name);
}

/* -------------------- try / timed / interruptible / non-owner unlock */

static void test_try_timed_interruptible(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, "sem", 5000);
    cerb_lock *a = p.a, *b = p.b;
    const char *name = p.name;
    pthread_t t;

    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    /* trylock: BUSY, and it leaves nothing of its own on the server. */
    assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    expect_records(name, 1);
    /* trylock_for: TIMEOUT on time, and it leaves its queue entry nowhere. */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(b, 300), CERB_TIMEOUT);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took >= 290 && took < 2000);
    expect_records(name, 1);

    /* Unlock by a non-owner: another client, and another thread of the
     * holder's client. Neither releases the holder's lock. */
    assert_int_equal(cerb_lock_unlock(b), CERB_NOT_OWNER);
    struct other ou = {.l = a, .op = OP_UNLOCK};
    assert_int_equal(pthread_create(&t, NULL, other_main, &ou), 0);
    pthread_join(t, NULL);
    assert_int_equal(ou.st, CERB_NOT_OWNER);
    assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_VALID);

    /* Interruptible: queued, woken by the interrupt, which itself never
     * waits for the network; its queue entry goes. */
    struct other oi = {.l = b, .op = OP_INTERRUPTIBLY};
    assert_int_equal(pthread_create(&t, NULL, other_main, &oi), 0);
    wait_queued(&oi, name);
    t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_interrupt(b), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 100);
    assert_wait_until(other_done, &oi, 2000);
    pthread_join(t, NULL);
    assert_int_equal(oi.st, CERB_INTERRUPTED);
    assert_true(cerb_test_now_ms() - t0 < 1000);
    expect_records_soon(name, 1, 2000);

    /* A waiter gets it once released, with a larger fence; the next grant
     * after it a larger one still. */
    struct other ow = {.l = b, .op = OP_TRYLOCK_FOR, .wait_ms = 5000};
    assert_int_equal(pthread_create(&t, NULL, other_main, &ow), 0);
    wait_queued(&ow, name);
    uint64_t fa = cerb_lock_fencing_token(a);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_wait_until(other_done, &ow, 3000);
    pthread_join(t, NULL);
    assert_int_equal(ow.st, CERB_OK);
    assert_fence_above(ow.fence, fa);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_fence_above(cerb_lock_fencing_token(b), ow.fence);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    /* Nothing of the holders or the queue is left behind. */
    expect_records(name, 0);
    pair_close(&p);
}

/* ------------------------------------------------- holds owned by objects */

/* A thread acquiring a hold object (and leaving it to the caller). */
struct acquirer {
    cerb_lock *l;
    int64_t wait_ms;
    cerb_cancel *cancel;
    cerb_hold *hold;
    cerb_status st;
    char err[512];          /* cerb_last_error() on its own thread */
    atomic_bool done;
};

static void *acquirer_main(void *arg)
{
    struct acquirer *q = arg;
    q->st = cerb_lock_acquire(q->l, q->wait_ms, q->cancel, &q->hold);
    snprintf(q->err, sizeof q->err, "%s", q->st == CERB_OK ? "" : cerb_last_error());
    atomic_store(&q->done, true);
    return NULL;
}

static bool acquirer_done(void *ud) { return atomic_load(&((struct acquirer *)ud)->done); }

/* Wait until @q waits behind the holder of @name (as wait_queued). */
static void acquirer_queued(struct acquirer *q, const char *name, int want)
{
    if (E->records)
        expect_records_soon(name, want, 3000);
    else
        assert_false(wait_until(acquirer_done, q, 300));
    assert_false(acquirer_done(q));
}

static void test_hold_from_any_thread(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, "hold", 5000);
    pthread_t t;

    /* Acquired on a thread that then ends; used and released on another. */
    struct acquirer q = {.l = p.a, .wait_ms = 0};
    assert_int_equal(pthread_create(&t, NULL, acquirer_main, &q), 0);
    pthread_join(t, NULL);
    assert_int_equal(q.st, CERB_OK);
    cerb_hold *h = q.hold;
    assert_int_equal(cerb_hold_state(h), CERB_LOCK_VALID);
    /* Counted valid for a while (an engine whose lease is its session's,
     * zk and etcd, counts that instead of the lock's 5 s). */
    int64_t valid = cerb_hold_valid_ms(h);
    if (valid <= 0 || valid > 60000)
        fail_msg("cerb_hold_valid_ms: %lld", (long long)valid);
    assert_string_equal(cerb_hold_name(h), p.name);
    uint64_t fence = cerb_hold_fencing_token(h);
    assert_true(E->no_fence ? fence == 0 : fence > 0);
    expect_records(p.name, 1);
    /* Not reentrant: another hold of the same client, from this thread,
     * is refused (one try) or waits (a timed wait runs out). */
    cerb_hold *h2 = NULL;
    assert_int_equal(cerb_lock_acquire(p.a, 0, NULL, &h2), CERB_BUSY);
    assert_null(h2);
    assert_int_equal(cerb_lock_acquire(p.a, 200, NULL, &h2), CERB_TIMEOUT);
    /* Another client too. */
    assert_int_equal(cerb_lock_acquire(p.b, 0, NULL, &h2), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock(p.b), CERB_BUSY);
    /* The handle it came from may go first. */
    assert_int_equal(cerb_lock_free(p.a), CERB_OK);
    p.a = NULL;
    assert_int_equal(cerb_hold_state(h), CERB_LOCK_VALID);
    /* Released from this thread, once; the second release is refused and
     * says why, readable here and from any thread. */
    assert_int_equal(cerb_hold_release(h), CERB_OK);
    assert_string_equal(cerb_hold_error(h), "");
    assert_int_equal(cerb_hold_release(h), CERB_NOT_OWNER);
    assert_non_null(strstr(cerb_hold_error(h), "already released"));
    assert_int_equal(cerb_hold_state(h), CERB_LOCK_FREE);
    assert_int_equal(cerb_hold_valid_ms(h), 0);
    assert_int_equal(cerb_hold_fencing_token(h), fence);
    expect_records(p.name, 0);
    assert_int_equal(cerb_lock_acquire(p.b, 0, NULL, &h2), CERB_OK);
    assert_fence_above(cerb_hold_fencing_token(h2), fence);
    assert_int_equal(cerb_hold_free(h), CERB_OK);
    /* Free releases a hold still held. */
    assert_int_equal(cerb_hold_free(h2), CERB_OK);
    expect_records(p.name, 0);
    assert_int_equal(cerb_hold_free(NULL), CERB_OK);
    /* Bad arguments. */
    assert_int_equal(cerb_lock_acquire(p.b, -2, NULL, &h2), CERB_EINVAL);
    assert_int_equal(cerb_lock_acquire(p.b, 0, NULL, NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_acquire(NULL, 0, NULL, &h2), CERB_EINVAL);
    assert_int_equal(cerb_hold_release(NULL), CERB_EINVAL);
    assert_int_equal(cerb_hold_state(NULL), CERB_LOCK_FREE);
    assert_int_equal(cerb_hold_valid_ms(NULL), 0);
    pair_close(&p);
}

static void test_hold_and_thread_exclude(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, "holdthr", 5000);
    cerb_hold *h = NULL;
    /* A thread hold keeps holds out, its own thread's included. */
    assert_int_equal(cerb_lock_lock(p.a), CERB_OK);
    assert_int_equal(cerb_lock_acquire(p.a, 0, NULL, &h), CERB_BUSY);
    assert_int_equal(cerb_lock_acquire(p.a, 150, NULL, &h), CERB_TIMEOUT);
    assert_int_equal(cerb_lock_unlock(p.a), CERB_OK);
    /* A hold keeps thread holds out, the acquiring thread's included. */
    assert_int_equal(cerb_lock_acquire(p.a, 0, NULL, &h), CERB_OK);
    assert_int_equal(cerb_lock_trylock(p.a), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock_for(p.a, 150), CERB_TIMEOUT);
    assert_int_equal(cerb_lock_state(p.a), CERB_LOCK_FREE);
    assert_int_equal(cerb_lock_unlock(p.a), CERB_NOT_OWNER);
    assert_int_equal(cerb_lock_trylock(p.b), CERB_BUSY);
    /* A thread waiting through the handle gets it when the hold goes. */
    struct other ow = {.l = p.a, .op = OP_TRYLOCK_FOR, .wait_ms = 5000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_main, &ow), 0);
    assert_false(wait_until(other_done, &ow, 200));
    uint64_t fh = cerb_hold_fencing_token(h);
    assert_int_equal(cerb_hold_free(h), CERB_OK);
    assert_wait_until(other_done, &ow, 3000);
    pthread_join(t, NULL);
    assert_int_equal(ow.st, CERB_OK);
    assert_fence_above(ow.fence, fh);
    expect_records(p.name, 0);
    pair_close(&p);
}

static void test_cancel_ends_one_call(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, "cancel", 5000);
    cerb_hold *h0 = NULL;
    assert_int_equal(cerb_lock_acquire(p.a, 0, NULL, &h0), CERB_OK);
    cerb_cancel *k1 = NULL, *k2 = NULL;
    assert_int_equal(cerb_cancel_new(&k1), CERB_OK);
    assert_int_equal(cerb_cancel_new(&k2), CERB_OK);
    /* Two calls wait for the name through one handle (the other client's),
     * and one is cancelled: the head of that process's local line waits
     * on the server, the other behind it in the process. q2, the one
     * cancelled, goes first: once a waiter is on the server it is the one
     * using k2 (started together, q1 could be that waiter while q2 had not
     * taken k2 yet, and the call below took it: BUSY, not EINVAL). */
    struct acquirer q1 = {.l = p.b, .wait_ms = -1, .cancel = k1};
    struct acquirer q2 = {.l = p.b, .wait_ms = -1, .cancel = k2};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t2, NULL, acquirer_main, &q2), 0);
    acquirer_queued(&q2, p.name, 2);
    assert_int_equal(pthread_create(&t1, NULL, acquirer_main, &q1), 0);
    assert_false(acquirer_done(&q1));
    /* A cancel serves one call at a time. */
    cerb_hold *hx = NULL;
    assert_int_equal(cerb_lock_acquire(p.b, 0, k2, &hx), CERB_EINVAL);
    int64_t t0 = cerb_test_now_ms();
    cerb_cancel_fire(k2);
    assert_true(cerb_test_now_ms() - t0 < 100); /* never waits on the network */
    assert_wait_until(acquirer_done, &q2, 2000);
    pthread_join(t2, NULL);
    assert_int_equal(q2.st, CERB_INTERRUPTED);
    assert_null(q2.hold);
    /* Its text, on its thread and kept in the cancel for this one. */
    assert_non_null(strstr(q2.err, "interrupted"));
    assert_string_equal(cerb_cancel_error(k2), q2.err);
    assert_int_equal(cerb_cancel_fired(k2), 1);
    /* The holder and one waiter on the server: q1, at the head now. */
    expect_records_soon(p.name, 2, 2000);
    /* The other call still waits, and gets the name. */
    assert_false(acquirer_done(&q1));
    cerb_cancel_fire(NULL);
    assert_int_equal(cerb_hold_free(h0), CERB_OK);
    assert_wait_until(acquirer_done, &q1, 3000);
    pthread_join(t1, NULL);
    assert_int_equal(q1.st, CERB_OK);
    assert_string_equal(cerb_cancel_error(k1), "");
    /* A fired cancel ends the next call at once. */
    assert_int_equal(cerb_lock_acquire(p.b, -1, k2, &hx), CERB_INTERRUPTED);
    assert_non_null(strstr(cerb_cancel_error(k2), "cancelled"));
    assert_int_equal(cerb_hold_free(q1.hold), CERB_OK);
    expect_records(p.name, 0);
    cerb_cancel_free(k1);
    cerb_cancel_free(k2);
    cerb_cancel_free(NULL);
    pair_close(&p);
}

/* Fire the cancel while the holder releases, so that the grant races the
 * cancel: whichever wins, nothing stays on the server. */
struct racer {
    cerb_hold *release;
    cerb_cancel *fire;
    int delay_us;
};

static void *racer_main(void *arg)
{
    struct racer *r = arg;
    struct timespec ts = {0, (long)r->delay_us * 1000};
    nanosleep(&ts, NULL); /* the race's offset, not a synchronisation */
    if (r->release)
        cerb_hold_free(r->release);
    else
        cerb_cancel_fire(r->fire);
    return NULL;
}

static void test_cancel_races_grant(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p, "cancelrace", 5000);
    int granted = 0, cancelled = 0;
    for (int round = 0; round < 12; round++) {
        cerb_hold *h0 = NULL;
        assert_int_equal(cerb_lock_acquire(p.a, 0, NULL, &h0), CERB_OK);
        cerb_cancel *k = NULL;
        assert_int_equal(cerb_cancel_new(&k), CERB_OK);
        struct acquirer q = {.l = p.b, .wait_ms = 10000, .cancel = k};
        pthread_t tq, tr, tf;
        assert_int_equal(pthread_create(&tq, NULL, acquirer_main, &q), 0);
        acquirer_queued(&q, p.name, 2);
        /* Offsets on both sides, so that either may come first. */
        struct racer rel = {.release = h0, .delay_us = (round % 3) * 400};
        struct racer fire = {.fire = k, .delay_us = (round % 4) * 300};
        assert_int_equal(pthread_create(&tr, NULL, racer_main, &rel), 0);
        assert_int_equal(pthread_create(&tf, NULL, racer_main, &fire), 0);
        pthread_join(tr, NULL);
        pthread_join(tf, NULL);
        assert_wait_until(acquirer_done, &q, 5000);
        pthread_join(tq, NULL);
        if (q.st == CERB_OK) {
            granted++;
            assert_int_equal(cerb_hold_state(q.hold), CERB_LOCK_VALID);
            assert_int_equal(cerb_hold_free(q.hold), CERB_OK);
        } else {
            assert_int_equal(q.st, CERB_INTERRUPTED);
            assert_null(q.hold);
            cancelled++;
        }
        /* No orphan: the name is free on the server at once (well inside
         * a hand-off's 2 s lease). */
        expect_records_soon(p.name, 0, 1000);
        cerb_hold *h1 = NULL;
        assert_int_equal(cerb_lock_acquire(p.a, 0, NULL, &h1), CERB_OK);
        assert_int_equal(cerb_hold_free(h1), CERB_OK);
        cerb_cancel_free(k);
    }
    print_message("%s: cancel raced a grant 12 times: %d granted, %d cancelled\n", E->name,
                  granted, cancelled);
    assert_true(cancelled > 0);
    pair_close(&p);
}

/* ---------------------- holds outlive many leases (and the session) */

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

static void test_hold_past_lease(void **state)
{
    (void)state;
    /* A lease much shorter than the hold (renewed, or kept by the session)
     * and the default one, longer than the short session where the engine
     * has one: either way the hold lives on and nobody else gets in. */
    cerb_client *c1 = open_client(E->short_session, NULL);
    cerb_client *c2 = open_client(NULL, NULL);
    char *name = test_name("long"), *name2 = test_name("long2");
    cerb_lock *a = mk(c1, name, 300), *a2 = mk(c1, name2, 0), *b = mk(c2, name, 0);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    cerb_lock_on_lost(a2, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(cerb_lock_lock(a2), CERB_OK);
    int64_t end = cerb_test_now_ms() + 3000; /* ten leases, past the session */
    while (cerb_test_now_ms() < end) {
        assert_int_equal(cerb_lock_trylock_for(b, 100), CERB_TIMEOUT);
        assert_int_equal(cerb_lock_state(a), CERB_LOCK_VALID);
        assert_int_equal(cerb_lock_state(a2), CERB_LOCK_VALID);
    }
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(cerb_lock_unlock(a2), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    expect_records(name, 0);
    expect_records(name2, 0);
    cerb_lock_free(a);
    cerb_lock_free(a2);
    cerb_lock_free(b);
    free(name);
    free(name2);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

/* ------------------------------------------- names and options */

static void expect_bad_name(cerb_client *c, const char *name, const char *why)
{
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(c, name, NULL, &l);
    if (st != CERB_EINVAL)
        fail_msg("name \"%s\": %s, want CERB_EINVAL", name ? name : "(null)",
                 cerb_status_name(st));
    assert_null(l);
    if (!strstr(cerb_last_error(), why))
        fail_msg("name \"%s\": reason \"%s\" lacks \"%s\"", name ? name : "(null)",
                 cerb_last_error(), why);
}

static void expect_good_name(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, name, NULL, &l) != CERB_OK)
        fail_msg("name \"%s\": %s", name, cerb_last_error());
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_string_equal(cerb_lock_name(l), name);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    expect_records(name, 0);
    cerb_lock_free(l);
}

static void test_names(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    /* 255 bytes is the most a name may have, on every engine. */
    char max[257];
    char *n = test_name("max");
    memset(max, 'x', sizeof max - 1);
    max[sizeof max - 1] = '\0';
    memcpy(max, n, strlen(n));
    free(n);
    max[256] = '\0';
    expect_bad_name(c, max, "longer than 255");
    max[255] = '\0';
    expect_good_name(c, max);

    expect_bad_name(c, NULL, "NULL");
    expect_bad_name(c, "", "empty");
    expect_bad_name(c, "tab\there", "control");
    expect_bad_name(c, "nl\n", "control");
    expect_bad_name(c, "del\x7f", "control");
    /* Fine everywhere: dots, spaces, ':', "zookeeper" (the lock root is
     * elsewhere), non-ASCII letters. */
    const char *good[] = {"a.b", "...", "with space", "ok-name.with:chars", "zookeeper",
                          "caf\xc3\xa9"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        n = test_name(good[i]);
        expect_good_name(c, n);
        free(n);
    }
    cerb_client_close(c);
}

static void test_bad_options(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("opts");
    cerb_lock *l = NULL;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 50; /* below the 100 ms minimum */
    assert_int_equal(cerb_lock_new(c, name, &o, &l), CERB_EINVAL);
    assert_null(l);
    assert_non_null(strstr(cerb_last_error(), "lease_ms"));
    assert_int_equal(cerb_lock_new(c, name, NULL, NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_new(NULL, name, NULL, &l), CERB_EINVAL);
    assert_null(l);
    /* A NULL handle is an error, never a crash. */
    assert_int_equal(cerb_lock_lock(NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_unlock(NULL), CERB_EINVAL);
    assert_int_equal(cerb_lock_free(NULL), CERB_OK);
    free(name);
    cerb_client_close(c);
}

/* ----------------------------------------------------------- config */

static void test_unknown_engine_in_config(void **state)
{
    (void)state;
    /* A misspelt engine name: the error points at the line and lists the
     * engines that are available, this one among them. */
    char cfg[128], bad[64];
    snprintf(bad, sizeof bad, "%sx", E->name);
    snprintf(cfg, sizeof cfg, "engines = (\"%s\");", bad);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_ECONFIG);
    assert_null(c);
    const char *err = cerb_last_error();
    assert_non_null(strstr(err, "config:1:"));
    assert_non_null(strstr(err, bad));
    const char *avail = strstr(err, "available");
    assert_non_null(avail);
    assert_non_null(strstr(avail, E->name));
    assert_int_equal(cerb_client_open(&c, "/nonexistent/cerberus.cfg"), CERB_ECONFIG);
    assert_null(c);
}

/* ------------------------------------------------------------ prober */

struct probe_arg {
    cerb_client *c;
    struct cerb_engine_info info;
};

static bool probed(void *ud)
{
    struct probe_arg *p = ud;
    return cerb_engine_info(p->c, E->name, &p->info) == CERB_OK && p->info.last_probe_us >= 0;
}

static void test_probe_and_info(void **state)
{
    (void)state;
    if (strcmp(E->name, "local") == 0)
        skip(); /* the prober needs a second engine to fail over to */
    /* The prober runs when there is a second engine: add "local" behind
     * this one in the helper's `engines = ("<name>");`. */
    char *one = E->config(NULL, "failover = { probe_interval_ms = 50; probe_timeout_ms = 50; };");
    assert_non_null(one);
    char *close_paren = strstr(one, "\");");
    assert_non_null(close_paren);
    size_t head = (size_t)(close_paren - one) + 1;
    char *cfg = malloc(strlen(one) + 16);
    assert_non_null(cfg);
    snprintf(cfg, strlen(one) + 16, "%.*s, \"local\"%s", (int)head, one, one + head);
    free(one);

    struct probe_arg p = {0};
    cerb_status st = cerb_client_open_string(&p.c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    assert_string_equal(cerb_engine_current(p.c), E->name);
    assert_wait_until(probed, &p, 3000);
    assert_int_equal(p.info.breaker, CERB_BREAKER_CLOSED);
    assert_true(p.info.last_probe_us < 1000000);
    cerb_client_close(p.c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reentrancy_and_hold_count),
        cmocka_unit_test(test_exclusion_threads),
        cmocka_unit_test(test_exclusion_one_handle),
        cmocka_unit_test(test_exclusion_processes),
        cmocka_unit_test(test_try_timed_interruptible),
        cmocka_unit_test(test_hold_from_any_thread),
        cmocka_unit_test(test_hold_and_thread_exclude),
        cmocka_unit_test(test_cancel_ends_one_call),
        cmocka_unit_test(test_cancel_races_grant),
        cmocka_unit_test(test_hold_past_lease),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_unknown_engine_in_config),
        cmocka_unit_test(test_probe_and_info),
    };
    return cmocka_run_group_tests_name("conformance_" CERB_CONFORMANCE_ENGINE, tests, group_setup,
                                       group_teardown);
}
