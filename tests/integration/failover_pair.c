/*
 * failover_pair.c — failover from a real primary server to a secondary
 * engine, one source built once per pair (tests/CMakeLists.txt defines
 * CERB_FO_PAIR_REDIS_ZK, CERB_FO_PAIR_ETCD_REDIS, CERB_FO_PAIR_PG_REDIS,
 * CERB_FO_PAIR_MEMCACHED_REDIS, CERB_FO_PAIR_REDIS_MEMCACHED,
 * CERB_FO_PAIR_REDLOCK_PG or CERB_FO_PAIR_REDIS_LOCAL).
 * The first engine is the primary and runs on this suite's exclusive
 * server, which the tests kill -9, SIGSTOP and restart (a Redlock primary:
 * all its masters at once); the second is the
 * shared server of its engine, where every lock name is unique to this run
 * (test_name()), or the local engine, which needs no server. The cases (the
 * table in main), each for every pair:
 *   - the primary killed, or stopped (a blackhole that accepts and never
 *     answers), while two clients lock one name in a loop: with
 *     switch_grace_ms = 0 the first grant on the secondary comes within a
 *     second of the outage, no call runs far past its own deadline, and
 *     once the primary is back the clients fail back only after
 *     failback_after_ms of health;
 *   - failback = "manual": never back by itself, however healthy;
 *   - a holder on the primary when it dies is told LOST, and with the
 *     default grace nobody else is granted the name before the hold could
 *     have expired on the dead server;
 *   - after a manual switch, a name the live old engine holds is refused and
 *     a name it confirms free is granted at once (no grace wait), and while
 *     the old engine answers it is asked however long after the switch (the
 *     hold there is renewed past any grace);
 *   - an acquisition waiting on the primary when its client switches is
 *     granted on the secondary, never on the primary;
 *   - a client pinned to the secondary by its configuration trusts no
 *     earlier "free" from the primary: with the primary stopped, a name it
 *     confirmed free before waits the primary's grace like any other;
 *   - fencing: a client's own tokens grow across its own switches, both
 *     ways (the engine it moves to raises its counter above the client's
 *     highest token elsewhere), and a bumped epoch (the high 16 bits)
 *     outranks them;
 *   - (etcd pairs) the same over five switches, and another client's
 *     later grant on etcd ranks above them;
 *   - a client that opens on the secondary because the primary's port is
 *     closed waits the primary's grace before granting (none with grace 0);
 *   - semaphores and read-write locks (DESIGN.md §16) switch by the same
 *     rules: after a manual switch, the gate asks the old engine whether a
 *     member would fit there (a spare permit is granted at once, and taken
 *     there too; a permit beyond the limit across both engines is refused;
 *     no writer while a reader stands there), and a release there lets
 *     the next one in at once (skipped where the primary has neither);
 *   - `cerberus switch <secondary>` on a file watched by three processes
 *     moves all three, and an invalid edit afterwards keeps the old
 *     configuration in every one of them, which each says why (file:line).
 * The secondary is never disrupted, so it needs no way to be. Timings are
 * printed (print_message) for the record.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "engine.h"
#include "test_util.h"

#if defined(CERB_FO_PAIR_REDIS_ZK)
#include "zk_util.h"
#elif defined(CERB_FO_PAIR_ETCD_REDIS)
#include "etcd_util.h"
#elif defined(CERB_FO_PAIR_PG_REDIS)
#include "pg_util.h"
#elif defined(CERB_FO_PAIR_MEMCACHED_REDIS) || defined(CERB_FO_PAIR_REDIS_MEMCACHED)
#include "mc_util.h"
#elif defined(CERB_FO_PAIR_REDLOCK_PG)
#include "pg_util.h"
#include "redlock_util.h"
#elif !defined(CERB_FO_PAIR_REDIS_LOCAL)
#error "define CERB_FO_PAIR_<PRIMARY>_<SECONDARY> (tests/CMakeLists.txt)"
#endif

/* Small numbers keep the suite short. */
#define LEASE_MS 1500
#define WAIT_MS 300        /* the looping client's trylock_for */
#define OP_TIMEOUT_MS 200  /* the primary's request timeout */
#define FAILBACK_MS 800
#define SLACK_MS 150       /* scheduling on a loaded two-core CI machine */

/* printf into a fresh malloc'd string. */
static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    va_start(ap, f);
    vsnprintf(s, (size_t)n + 1, f, ap);
    va_end(ap);
    return s;
}

/* ---- the engines ---- */

/* What the tests need to know about an engine and, for the primary, how to
 * disrupt its server. */
struct fo_engine {
    const char *name;
    /* Its configuration section (malloc'd): on this suite's server, or with
     * @dead on a closed port (only asked of a primary); with @ns, under a
     * key prefix or root of that name (ns_get). */
    char *(*section)(bool dead, const char *ns);
    /* How long a hold can outlive the client's last contact with the server
     * (the lease, or a longer session): what the default grace covers. Only
     * a primary's is used (n/a for the local engine, never a primary). */
    int64_t hold_ms;
    pid_t (*pid)(void);  /* the server's PID, -1 when not running */
    int (*pause)(void);  /* SIGSTOP, then wait until stopped; 0 or -1 */
    int (*resume)(void); /* SIGCONT; 0 or -1 */
    int (*start)(void);  /* start it (again); servers.sh's exit status */
    /* kill -9 (NULL: of pid()); 0 or -1. A Redlock set is killed whole. */
    int (*kill9)(void);
};

/* kill -9 the primary's server. */
#define PRIMARY_KILL9() (PRIMARY.kill9 ? PRIMARY.kill9() : kill(PRIMARY.pid(), SIGKILL))

/* Does @e issue fencing tokens? memcached grants none (its locks' token
 * is 0, not a bare epoch). */
static bool fenced(const struct fo_engine *e) { return strcmp(e->name, "memcached") != 0; }

#if !defined(CERB_FO_PAIR_REDLOCK_PG)
static char *redis_section(bool dead, const char *ns)
{
    return fmt("redis = { port = %d; op_timeout_ms = %d; connect_timeout_ms = %d;%s%s%s };\n",
               dead ? 1 : cerb_test_redis_port(), OP_TIMEOUT_MS, OP_TIMEOUT_MS,
               ns ? " prefix = \"" : "", ns ? ns : "", ns ? ":\";" : "");
}
static int redis_start(void) { return cerb_test_servers("start"); }
static const struct fo_engine fo_redis = {"redis", redis_section, LEASE_MS, cerb_test_redis_pid,
                                          cerb_test_redis_pause, cerb_test_redis_resume,
                                          redis_start, NULL};
#endif

#if defined(CERB_FO_PAIR_REDLOCK_PG)
/* The Redlock mode of the redis engine on its three masters of this suite
 * (CERB_REDLOCK_PORT: the exclusive set), all killed, stopped and started
 * together: the primary's outage is the loss of every master (a minority's
 * is test_redlock_fault.c's). It keeps no closure record, so it needs no
 * namespace of its own. Dead: three closed ports. */
static char *redlock_section(bool dead, const char *ns)
{
    (void)ns;
    char nodes[256] = "";
    size_t off = 0;
    for (int i = 0; i < rl_nodes(); i++)
        off += (size_t)snprintf(nodes + off, sizeof nodes - off, "%s\"127.0.0.1:%d\"",
                                i ? ", " : "", dead ? 1 + i : rl_base_port() + i);
    return fmt("redis = { mode = \"redlock\"; nodes = (%s);\n"
               "  op_timeout_ms = %d; connect_timeout_ms = %d; };\n",
               nodes, OP_TIMEOUT_MS, OP_TIMEOUT_MS);
}
static pid_t redlock_pid(void) { return rl_pid(0); }
static int redlock_each(int (*fn)(pid_t))
{
    int rc = 0;
    for (int i = 0; i < rl_nodes(); i++)
        if (fn(rl_pid(i)) != 0)
            rc = -1;
    return rc;
}
static int kill9_pid(pid_t pid) { return pid > 0 ? kill(pid, SIGKILL) : -1; }
static int redlock_pause(void) { return redlock_each(cerb_test_pause_pid); }
static int redlock_resume(void) { return redlock_each(cerb_test_resume_pid); }
static int redlock_kill9(void) { return redlock_each(kill9_pid); }
static int redlock_start(void)
{
    int rc = 0;
    for (int i = 0; i < rl_nodes(); i++)
        if (rl_servers("start", i) != 0)
            rc = -1;
    return rc;
}
/* A key lives its PX, the lease (what the engine states as its bound). */
static const struct fo_engine fo_redlock = {"redis",        redlock_section, LEASE_MS,
                                            redlock_pid,    redlock_pause,   redlock_resume,
                                            redlock_start,  redlock_kill9};
#endif

#if defined(CERB_FO_PAIR_REDIS_ZK)
#define ZK_SESSION_MS 4000
static char *zk_section(bool dead, const char *ns)
{
    (void)dead;
    return fmt("zk = { hosts = \"127.0.0.1:%d\"; session_timeout_ms = %d;%s%s%s };\n",
               cerb_test_zk_port(), ZK_SESSION_MS, ns ? " root = \"/" : "", ns ? ns : "",
               ns ? "/locks\";" : "");
}
static const struct fo_engine fo_zk = {"zk", zk_section, ZK_SESSION_MS, NULL, NULL, NULL, NULL, NULL};
#define PRIMARY fo_redis
#define SECONDARY fo_zk
#elif defined(CERB_FO_PAIR_ETCD_REDIS)
#define ETCD_TTL_S 2 /* the smallest session TTL etcd.session_ttl_s allows */
static char *etcd_section(bool dead, const char *ns)
{
    return fmt("etcd = { endpoints = (\"http://127.0.0.1:%d\"); session_ttl_s = %d;\n"
               "  op_timeout_ms = %d; connect_timeout_ms = %d;%s%s%s };\n",
               dead ? 1 : etcd_test_port(), ETCD_TTL_S, OP_TIMEOUT_MS, OP_TIMEOUT_MS,
               ns ? " prefix = \"" : "", ns ? ns : "", ns ? "/\";" : "");
}
static pid_t etcd_pid(void) { return etcd_test_pid(etcd_test_port()); }
static int etcd_pause(void) { return etcd_test_pause(etcd_test_port()); }
static int etcd_resume(void) { return etcd_test_resume(etcd_test_port()); }
static int etcd_start(void) { return etcd_test_servers("start", etcd_test_port(), 1); }
/* A hold lasts as long as its session's lease (the lock's lease_ms is
 * shorter here). */
static const struct fo_engine fo_etcd = {"etcd",       etcd_section, ETCD_TTL_S * 1000,
                                         etcd_pid,     etcd_pause,   etcd_resume,
                                         etcd_start,   NULL};
_Static_assert(ETCD_TTL_S * 1000 >= LEASE_MS, "the hold time above assumes it");
#define PRIMARY fo_etcd
#define SECONDARY fo_redis
#elif defined(CERB_FO_PAIR_PG_REDIS) || defined(CERB_FO_PAIR_REDLOCK_PG)
/* pg keeps no closure record, so it needs no namespace of its own: every
 * name here is unique to the run anyway. */
static char *pg_section(bool dead, const char *ns)
{
    (void)ns;
    return fmt("pg = { conninfo = \"host=127.0.0.1 port=%d dbname=cerb user=cerb\";\n"
               "  op_timeout_ms = %d; connect_timeout_ms = %d; };\n",
               dead ? 1 : pg_test_port(), OP_TIMEOUT_MS, OP_TIMEOUT_MS);
}
static pid_t pg_pid(void) { return cerb_test_server_pid("pg", pg_test_port()); }
static int pg_pause(void) { return pg_test_pause_server(pg_pid()); }
static int pg_resume(void) { return pg_test_resume_server(pg_pid()); }
static int pg_start(void) { return cerb_test_servers_run("start", "pg", pg_test_port(), 60000); }
/* A hold lives as long as its lease row (the engine states no bound). */
static const struct fo_engine fo_pg = {"pg", pg_section, LEASE_MS, pg_pid,
                                       pg_pause, pg_resume, pg_start, NULL};
#if defined(CERB_FO_PAIR_REDLOCK_PG)
#define PRIMARY fo_redlock
#define SECONDARY fo_pg
#else
#define PRIMARY fo_pg
#define SECONDARY fo_redis
#endif
#elif defined(CERB_FO_PAIR_MEMCACHED_REDIS) || defined(CERB_FO_PAIR_REDIS_MEMCACHED)
/* memcached keeps no closure record: a prefix of the case's own keeps the
 * names apart all the same. As the secondary it runs on the shared server,
 * whose port the suite's environment names, as the primary's does. */
static char *mc_section(bool dead, const char *ns)
{
    return fmt("memcached = { servers = (\"127.0.0.1:%d\"); op_timeout_ms = %d;\n"
               "  connect_timeout_ms = %d;%s%s%s };\n",
               dead ? 1 : mc_test_port(), OP_TIMEOUT_MS, OP_TIMEOUT_MS,
               ns ? " prefix = \"" : "", ns ? ns : "", ns ? ":\";" : "");
}
static pid_t mc_pid(void) { return cerb_test_server_pid("memcached", mc_test_port()); }
static int mc_pause(void) { return cerb_test_pause_pid(mc_pid()); }
static int mc_resume(void) { return cerb_test_resume_pid(mc_pid()); }
static int mc_start(void)
{
    return cerb_test_servers_run("start", "memcached", mc_test_port(), 20000);
}
/* The item lives T = ceil(lease)+2 s (what the engine sends, mc_proto.c),
 * and up to a second more on a late clock tick: the engine's hold bound. */
static const struct fo_engine fo_mc = {"memcached", mc_section, (LEASE_MS + 999) / 1000 * 1000 + 3000,
                                       mc_pid, mc_pause, mc_resume, mc_start, NULL};
#if defined(CERB_FO_PAIR_MEMCACHED_REDIS)
#define PRIMARY fo_mc
#define SECONDARY fo_redis
#else
#define PRIMARY fo_redis
#define SECONDARY fo_mc
#endif
#else
/* In-process: no server, no section, nothing to disrupt. */
static char *local_section(bool dead, const char *ns)
{
    (void)dead;
    (void)ns;
    return fmt("%s", "");
}
static const struct fo_engine fo_local = {"local", local_section, 0, NULL, NULL, NULL, NULL, NULL};
#define PRIMARY fo_redis
#define SECONDARY fo_local
#endif

/* ---- configuration ---- */

/* What differs between the configurations of the cases; a field left zero
 * is the default: active "auto", epoch 1, the primary on its server. */
struct cfg {
    const char *active;
    int epoch;
    const char *failover; /* more keys of the failover section */
    bool dead_primary;    /* the primary on a closed port */
    bool ns;              /* both engines under the case's own namespace */
};

/*
 * A case that raises the epoch (itself, or by `cerberus switch`) writes
 * closure records (core/closure.c), one per store and namespace, which
 * refuse every client at a lower epoch there: other cases here, and other
 * suites on the shared servers. Such a case keeps its engines under a
 * namespace of its own, made on first use and dropped by the teardown.
 */
static char *case_ns;

static const char *ns_get(void)
{
    if (!case_ns) {
#if defined(CERB_FO_PAIR_REDLOCK_PG)
        /* No plain redis here, and neither engine keeps closure records. */
        char *p = test_name("fo");
        assert_non_null(p);
#else
        char *p = cerb_test_redis_namespace("fo", 0);
        assert_non_null(p);
        p[strlen(p) - 1] = '\0'; /* the ':' comes back in the redis prefix */
#endif
        case_ns = p;
    }
    return case_ns;
}
#define CFG(...) ((struct cfg){__VA_ARGS__})

/*
 * The configuration of every client here: both engines in order, fast
 * probes and a breaker that opens after two failures. `active` is on line
 * 2, which the invalid-edit check relies on.
 */
static char *cfg_text(struct cfg k)
{
    const char *ns = k.ns ? ns_get() : NULL;
    char *p = PRIMARY.section(k.dead_primary, ns), *s = SECONDARY.section(false, ns);
    char *t = fmt("engines = (\"%s\", \"%s\");\n"
                  "active = \"%s\";\n"
                  "epoch = %d;\n"
                  "lock = { lease_ms = %d; };\n"
                  "retry = { max = 1; backoff_ms = 5; backoff_max_ms = 20; };\n"
                  "failover = { probe_interval_ms = 100; probe_timeout_ms = 100;\n"
                  "  consecutive_failures = 2; open_ms = 500; half_open_successes = 2;\n"
                  "  %s };\n"
                  "%s%s",
                  PRIMARY.name, SECONDARY.name, k.active ? k.active : "auto",
                  k.epoch ? k.epoch : 1, LEASE_MS, k.failover ? k.failover : "", p, s);
    free(p);
    free(s);
    return t;
}
#define ACTIVE_LINE 2

/*
 * Every client and lock handle a case opens in its own thread is freed by
 * the teardown, after the case's threads have stopped: a failed case leaves
 * no client probing (and failing over) behind it, and no hold (a handle is
 * freed, which releases its hold, before the clients close).
 */
static struct owned {
    cerb_client *c;
    cerb_lock *l;
} owned[16];

static struct owned *own(void)
{
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        if (!owned[i].c && !owned[i].l)
            return &owned[i];
    fail_msg("more than %zu clients and handles in one case", sizeof owned / sizeof owned[0]);
    return NULL;
}

static cerb_client *track(cerb_client *c) { return own()->c = c; }

/* A handle on @name for client @c. */
static cerb_lock *handle(cerb_client *c, const char *name)
{
    struct owned *o = own();
    assert_int_equal(cerb_lock_new(c, name, NULL, &o->l), CERB_OK);
    return o->l;
}

static void free_owned(void)
{
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        cerb_lock_free(owned[i].l);
        owned[i].l = NULL;
    }
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        cerb_client_close(owned[i].c);
        owned[i].c = NULL;
    }
}

/* A client on configuration @k, closed by the teardown. */
static cerb_client *open_with(struct cfg k)
{
    char *t = cfg_text(k);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, t);
    free(t);
    if (st != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    return track(c);
}

/* A client in auto mode, on the primary. */
static cerb_client *open_cfg(const char *failover_extra)
{
    cerb_client *c = open_with(CFG(.failover = failover_extra));
    assert_string_equal(cerb_engine_current(c), PRIMARY.name);
    return c;
}

/* A lock call's status, or a failure that says why. */
static void expect_status(cerb_status got, cerb_status want, const char *what)
{
    if (got != want)
        fail_msg("%s: %s, expected %s (%s)", what, cerb_status_name(got), cerb_status_name(want),
                 cerb_last_error());
}

static bool on_primary(void *ud) { return strcmp(cerb_engine_current(ud), PRIMARY.name) == 0; }
static bool on_secondary(void *ud) { return strcmp(cerb_engine_current(ud), SECONDARY.name) == 0; }

/* Grants made by engine @e for client @c; 0 when it cannot tell. */
static uint64_t acquires_on(cerb_client *c, const struct fo_engine *e)
{
    struct cerb_engine_info info;
    return cerb_engine_info(c, e->name, &info) == CERB_OK ? info.acquires : 0;
}

static bool primary_closed(void *ud)
{
    struct cerb_engine_info info;
    return cerb_engine_info(ud, PRIMARY.name, &info) == CERB_OK &&
           info.breaker == CERB_BREAKER_CLOSED;
}

/* When a look last found the primary's breaker not closed, taken before
 * the look: its closing came later, however late the looking thread ran. */
static int64_t seen_not_closed_ms;

static bool primary_closed_noting(void *ud)
{
    int64_t before = cerb_test_now_ms();
    if (primary_closed(ud))
        return true;
    seen_not_closed_ms = before;
    return false;
}

/* Looks while the test thread is busy restarting the primary (the breaker
 * may close before the restart script returns). Joined before anything
 * can fail, so it never outlives its client. */
static void *close_watch(void *ud)
{
    return wait_until(primary_closed_noting, ud, 15000) ? ud : NULL;
}

/* ---- background threads ---- */

/*
 * A case runs at most one set of loopers and one holder. They live here,
 * not on a case's stack, so that a failed assertion (a longjmp out of the
 * case) leaves nothing pointing into a dead frame: the teardown stops and
 * joins whatever is still running. Threads never call cmocka's assertions.
 */
struct worker {
    pthread_t t;
    bool running;
    atomic_bool stop;
    cerb_client *c;
    char *name;
};

static void worker_start(struct worker *w, void *(*fn)(void *), void *arg, cerb_client *c,
                         const char *name)
{
    w->c = c;
    w->name = strdup(name);
    assert_non_null(w->name);
    atomic_store(&w->stop, false);
    assert_int_equal(pthread_create(&w->t, NULL, fn, arg), 0);
    w->running = true;
}

static void worker_stop(struct worker *w)
{
    if (w->running) {
        atomic_store(&w->stop, true);
        pthread_join(w->t, NULL);
        w->running = false;
    }
    free(w->name);
    w->name = NULL;
}

/*
 * Clients locking one name in a loop as fast as they can, each with a
 * client of its own, so that they contend on the server: at any moment one
 * may hold the name while the other waits in the server's queue.
 */
#define LOOPERS 2
static struct looper {
    struct worker w;
    atomic_llong grants;
    atomic_llong first_secondary_ms; /* when the secondary first granted it */
    atomic_llong worst_overrun_ms;   /* the most a trylock_for ran past its wait */
    atomic_llong worst_unlock_ms;
    char worst_why[512];             /* the slowest trylock_for's status and error */
} L[LOOPERS];

static void *loop_main(void *arg)
{
    struct looper *lp = arg;
    cerb_lock *l = NULL;
    if (cerb_lock_new(lp->w.c, lp->w.name, NULL, &l) != CERB_OK)
        return NULL;
    while (!atomic_load(&lp->w.stop)) {
        int64_t t0 = cerb_test_now_ms();
        cerb_status st = cerb_lock_trylock_for(l, WAIT_MS);
        long long over = cerb_test_now_ms() - t0 - WAIT_MS;
        if (over > atomic_load(&lp->worst_overrun_ms)) {
            atomic_store(&lp->worst_overrun_ms, over);
            snprintf(lp->worst_why, sizeof lp->worst_why, "%s: %s", cerb_status_name(st),
                     st == CERB_OK ? "" : cerb_last_error());
        }
        if (st != CERB_OK)
            continue;
        atomic_fetch_add(&lp->grants, 1);
        /* The per-engine grant counter says where this grant came from,
         * whatever the current engine is by now. */
        if (atomic_load(&lp->first_secondary_ms) == 0 && acquires_on(lp->w.c, &SECONDARY) > 0)
            atomic_store(&lp->first_secondary_ms, cerb_test_now_ms());
        t0 = cerb_test_now_ms();
        cerb_lock_unlock(l);
        long long took = cerb_test_now_ms() - t0;
        if (took > atomic_load(&lp->worst_unlock_ms))
            atomic_store(&lp->worst_unlock_ms, took);
    }
    cerb_lock_free(l);
    return NULL;
}

/* Start the loopers, client i on clients[i], all on one fresh name. */
static void loopers_start(cerb_client *const *clients, const char *prefix)
{
    char *name = test_name(prefix);
    for (int i = 0; i < LOOPERS; i++) {
        struct looper *lp = &L[i];
        worker_stop(&lp->w);
        atomic_store(&lp->grants, 0);
        atomic_store(&lp->first_secondary_ms, 0);
        atomic_store(&lp->worst_overrun_ms, 0);
        atomic_store(&lp->worst_unlock_ms, 0);
        lp->worst_why[0] = '\0';
        worker_start(&lp->w, loop_main, lp, clients[i], name);
    }
    free(name);
}

static void loopers_stop(void)
{
    for (int i = 0; i < LOOPERS; i++)
        worker_stop(&L[i].w);
}

/* Every looper has been granted a few times. */
static bool looped_a_little(void *ud)
{
    (void)ud;
    for (int i = 0; i < LOOPERS; i++)
        if (atomic_load(&L[i].grants) < 3)
            return false;
    return true;
}

/* When the secondary first granted the name to any looper; 0: not yet. */
static int64_t first_secondary_ms(void)
{
    int64_t first = 0;
    for (int i = 0; i < LOOPERS; i++) {
        int64_t t = atomic_load(&L[i].first_secondary_ms);
        if (t && (!first || t < first))
            first = t;
    }
    return first;
}
static bool first_secondary(void *ud)
{
    (void)ud;
    return first_secondary_ms() != 0;
}

/* A thread that takes one name and holds it until stopped; told when the
 * hold is lost. */
static struct holder {
    struct worker w;
    _Atomic cerb_status st;
    atomic_bool held;
    atomic_int lost_calls;
    atomic_llong lost_at_ms;
} H;

static void on_lost(cerb_lock *l, void *ud)
{
    struct holder *h = ud;
    (void)l;
    if (atomic_fetch_add(&h->lost_calls, 1) == 0)
        atomic_store(&h->lost_at_ms, cerb_test_now_ms());
}

static bool holder_held(void *ud) { return atomic_load(&((struct holder *)ud)->held); }
static bool holder_lost(void *ud) { return atomic_load(&((struct holder *)ud)->lost_calls) > 0; }
static bool holder_stopping(void *ud) { return atomic_load(&((struct holder *)ud)->w.stop); }

static void *holder_main(void *arg)
{
    struct holder *h = arg;
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(h->w.c, h->w.name, NULL, &l);
    if (st == CERB_OK) {
        cerb_lock_on_lost(l, on_lost, h);
        /* Bounded (the teardown joins us), past a quarantine of a primary
         * restarted by the case before (memcached: its hold bound). */
        st = cerb_lock_trylock_for(l, 5000 + PRIMARY.hold_ms);
    }
    atomic_store(&h->st, st);
    atomic_store(&h->held, true);
    wait_until(holder_stopping, h, 60000);
    if (st == CERB_OK)
        cerb_lock_unlock(l);
    cerb_lock_free(l);
    return NULL;
}

/* Start the holder on @c and wait until it holds. */
static void holder_start(cerb_client *c, const char *prefix)
{
    worker_stop(&H.w);
    atomic_store(&H.st, CERB_OK);
    atomic_store(&H.held, false);
    atomic_store(&H.lost_calls, 0);
    atomic_store(&H.lost_at_ms, 0);
    char *name = test_name(prefix);
    worker_start(&H.w, holder_main, &H, c, name);
    free(name);
    /* A primary restarted by the case before may still be quarantined
     * (memcached: a new process grants nothing for its hold bound). */
    assert_wait_until(holder_held, &H, 5000 + (int)PRIMARY.hold_ms);
    assert_int_equal(atomic_load(&H.st), CERB_OK);
}

/* The holder lets go (and its thread ends). */
static void holder_release(void)
{
    atomic_store(&H.w.stop, true);
    pthread_join(H.w.t, NULL);
    H.w.running = false;
}

/* A thread that waits for one name (10 s at most) and says how it ended. */
static struct waiter {
    struct worker w;
    _Atomic cerb_status st;
    atomic_bool done;
} W;

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(w->w.c, w->w.name, NULL, &l);
    if (st == CERB_OK)
        st = cerb_lock_trylock_for(l, 10000);
    if (st == CERB_OK)
        cerb_lock_unlock(l);
    cerb_lock_free(l);
    atomic_store(&w->st, st);
    atomic_store(&w->done, true);
    return NULL;
}

static void waiter_start(cerb_client *c, const char *name)
{
    worker_stop(&W.w);
    atomic_store(&W.st, CERB_OK);
    atomic_store(&W.done, false);
    worker_start(&W.w, waiter_main, &W, c, name);
}

/* ---- the safe-switch set-up ---- */

/*
 * Two clients on the primary that stay where the case puts them (failback
 * manual): the holder takes a fresh name on the first; returns the second.
 */
static cerb_client *hold_on_primary(const char *prefix)
{
    cerb_client *a = open_cfg("failback = \"manual\";");
    cerb_client *b = open_cfg("failback = \"manual\";");
    holder_start(a, prefix);
    /* Each client ends a quarantine of a primary restarted by the case
     * before (memcached) on its own clock, from its own first answer: the
     * holder's being over said nothing of b's, which ended 10 ms after b
     * asked the primary about a free name, and was refused (TSan pass).
     * So b takes a name of its own there first. */
    char *own = test_name("ready");
    cerb_lock *l = handle(b, own);
    free(own);
    expect_status(cerb_lock_trylock_for(l, 5000 + PRIMARY.hold_ms), CERB_OK, "a first grant");
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    return b;
}

/* Client @c switches to the secondary by itself (the API, no new epoch);
 * returns its handle on the holder's name. */
static cerb_lock *switch_to_secondary(cerb_client *c)
{
    assert_string_equal(cerb_engine_switch_to(c, SECONDARY.name), SECONDARY.name);
    return handle(c, H.w.name);
}

/* ---- set-up and tear-down ---- */

/* Every case starts with the primary running and answering. */
static int primary_up(void **state)
{
    (void)state;
    PRIMARY.resume();
    return PRIMARY.start() == 0 ? 0 : -1;
}

/* ... and ends with no thread of its own left and the primary up. */
static int cleanup(void **state)
{
    loopers_stop();
    worker_stop(&H.w);
    worker_stop(&W.w);
    free_owned();
    free(case_ns);
    case_ns = NULL;
    return primary_up(state);
}

/* ---- kill -9 and SIGSTOP while a client locks in a loop ---- */

static void run_outage(bool kill_it)
{
    const char *what = kill_it ? "killed" : "stopped";
    char *extra = fmt("switch_grace_ms = 0; failback_after_ms = %d;", FAILBACK_MS);
    cerb_client *c[LOOPERS];
    for (int i = 0; i < LOOPERS; i++)
        c[i] = open_cfg(extra);
    free(extra);
    loopers_start(c, what);
    /* Past a quarantine of a primary restarted by the case before. */
    assert_wait_until(looped_a_little, NULL, 5000 + (int)PRIMARY.hold_ms);

    assert_true(PRIMARY.pid() > 0);
    int64_t t_out = cerb_test_now_ms();
    if (kill_it)
        assert_int_equal(PRIMARY_KILL9(), 0);
    else
        assert_int_equal(PRIMARY.pause(), 0);
    assert_wait_until(first_secondary, NULL, 5000);
    int64_t took = first_secondary_ms() - t_out;
    print_message("%s %s: first grant on %s after %lld ms\n", what, PRIMARY.name,
                  SECONDARY.name, (long long)took);
    assert_true(took <= 1000);
    for (int i = 0; i < LOOPERS; i++)
        assert_wait_until(on_secondary, c[i], 3000);

    /* Back up: failback once the primary has been healthy for
     * failback_after_ms, counted from its breaker closing. */
    assert_false(primary_closed(c[0]));
    seen_not_closed_ms = cerb_test_now_ms();
    pthread_t watch;
    assert_int_equal(pthread_create(&watch, NULL, close_watch, c[0]), 0);
    int up = kill_it ? PRIMARY.start() : PRIMARY.resume();
    void *closed = NULL;
    pthread_join(watch, &closed);
    assert_int_equal(up, 0);
    assert_non_null(closed);
    assert_wait_until(on_primary, c[0], 5000);
    /* The breaker closed after seen_not_closed_ms and the switch came
     * before now, so this is never less than the real delay: a thread
     * that ran late cannot make a correct failback look early. */
    int64_t back = cerb_test_now_ms() - seen_not_closed_ms;
    print_message("failback at most %lld ms after the breaker closed (failback_after_ms %d)\n",
                  (long long)back, FAILBACK_MS);
    assert_true(back >= FAILBACK_MS);

    loopers_stop();
    for (int i = 0; i < LOOPERS; i++) {
        long long over = atomic_load(&L[i].worst_overrun_ms);
        long long unl = atomic_load(&L[i].worst_unlock_ms);
        print_message("looper %d: %lld grants, worst trylock_for(%d) overrun %lld ms (%s), "
                      "worst unlock %lld ms\n",
                      i, (long long)atomic_load(&L[i].grants), WAIT_MS, over, L[i].worst_why, unl);
        /* Past its deadline a call may finish the request in flight and
         * then clear its place in the server's queue: two request
         * timeouts, never more. An unlock has no deadline of its own: two
         * attempts (retry.max = 1) of one request timeout each bound it. */
        assert_true(over <= 2 * OP_TIMEOUT_MS + SLACK_MS);
        assert_true(unl <= 2 * OP_TIMEOUT_MS + SLACK_MS);
    }
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c[0], PRIMARY.name, &info), CERB_OK);
    assert_true(info.breaker_transitions >= 2);
    assert_true(info.switches >= 2);
}

static void test_kill_primary(void **state)
{
    (void)state;
    run_outage(true);
}

static void test_stop_primary(void **state)
{
    (void)state;
    run_outage(false);
}

static void test_manual_failback_never(void **state)
{
    (void)state;
    cerb_client *c =
        open_cfg("switch_grace_ms = 0; failback = \"manual\"; failback_after_ms = 100;");
    assert_int_equal(PRIMARY_KILL9(), 0);
    assert_wait_until(on_secondary, c, 3000);
    assert_int_equal(PRIMARY.start(), 0);
    /* Healthy again, then well past failback_after_ms and several probe
     * rounds: still on the secondary. */
    assert_wait_until(primary_closed, c, 10000);
    assert_false(wait_until(on_primary, c, 600));
    assert_string_equal(cerb_engine_switch_to(c, PRIMARY.name), PRIMARY.name);
}

/* ---- holders and the safe-switch gate ---- */

static void test_holder_lost_and_grace_respected(void **state)
{
    (void)state;
    /* Default grace: the old engine's lease or session plus drift. */
    cerb_client *b = hold_on_primary("grace");
    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(PRIMARY_KILL9(), 0);
    assert_wait_until(on_secondary, b, 3000);
    cerb_lock *lb = handle(b, H.w.name);
    expect_status(cerb_lock_trylock_for(lb, 10000), CERB_OK, "the other client");
    int64_t granted = cerb_test_now_ms();
    assert_wait_until(holder_lost, &H, 5000);
    int64_t lost = atomic_load(&H.lost_at_ms);
    print_message("other client granted %lld ms after the kill (hold %lld ms); holder told "
                  "LOST after %lld ms\n",
                  (long long)(granted - t_kill), (long long)PRIMARY.hold_ms,
                  (long long)(lost - t_kill));
    assert_true(granted - t_kill >= PRIMARY.hold_ms);
    /* The holder learnt it first: no moment with two believing holders. */
    assert_true(lost <= granted);
    assert_int_equal(atomic_load(&H.lost_calls), 1);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    holder_release();
}

static void test_manual_switch_fast_path(void **state)
{
    (void)state;
    cerb_client *b = hold_on_primary("fastpath");
    cerb_lock *lb = switch_to_secondary(b);

    /* A name nobody holds: the old engine says so in one round trip, so
     * even a single attempt (no wait at all) is granted. */
    char *other = test_name("never-held");
    cerb_lock *lo = handle(b, other);
    free(other);
    expect_status(cerb_lock_trylock(lo), CERB_OK, "a free name after the switch");
    assert_int_equal(cerb_lock_unlock(lo), CERB_OK);

    /* Held on the live old engine: refused on the new one. */
    expect_status(cerb_lock_trylock(lb), CERB_BUSY, "a name held on the old engine");
    /* The gate's reason, not "held by another owner": nobody holds it here. */
    if (!strstr(cerb_last_error(), "after a switch"))
        fail_msg("refusal says \"%s\"", cerb_last_error());
    holder_release();
    /* Confirmed free there: granted at once, long before the grace ends. */
    int64_t t0 = cerb_test_now_ms();
    expect_status(cerb_lock_trylock_for(lb, 10000), CERB_OK, "a name released on the old engine");
    int64_t took = cerb_test_now_ms() - t0;
    print_message("granted %lld ms after the release on %s (grace %lld ms)\n", (long long)took,
                  PRIMARY.name, (long long)PRIMARY.hold_ms);
    assert_true(took < 500);
    uint64_t f = cerb_lock_fencing_token(lb);
    if (fenced(&SECONDARY))
        assert_int_equal(f >> 48, 1); /* the configuration's epoch: a switch leaves it */
    else
        assert_int_equal(f, 0); /* no token at all, not a bare epoch */
    assert_int_equal(acquires_on(b, &SECONDARY), 2);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
}

/*
 * While the old engine answers, the gate keeps asking it, however long
 * after the switch: a hold taken there before the switch is renewed there
 * past any grace, so the new engine must not grant the name until it is
 * released.
 */
static void test_gate_outlasts_grace_while_old_engine_answers(void **state)
{
    (void)state;
    cerb_client *b = hold_on_primary("outlast");
    cerb_lock *lb = switch_to_secondary(b);
    /* Twice the grace (the primary's hold plus drift), and then some: still
     * held on the primary. */
    int64_t wait = 2 * PRIMARY.hold_ms + 500;
    expect_status(cerb_lock_trylock_for(lb, wait), CERB_TIMEOUT, "a name held on the old engine");
    holder_release();
    int64_t t0 = cerb_test_now_ms();
    expect_status(cerb_lock_trylock_for(lb, 2000), CERB_OK, "a name released on the old engine");
    print_message("refused for %lld ms while held on %s, then granted %lld ms after the "
                  "release\n",
                  (long long)wait, PRIMARY.name, (long long)(cerb_test_now_ms() - t0));
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
}

static bool waiting_on_primary(void *ud)
{
    struct cerb_engine_info info;
    return cerb_engine_info(ud, PRIMARY.name, &info) == CERB_OK && info.acquire_calls >= 1;
}

/*
 * An acquisition waiting on the old engine moves to the new one when its
 * client switches, and is granted there once the old engine says the name
 * is free — never on the old engine after the switch.
 */
static void test_waiter_follows_switch(void **state)
{
    (void)state;
    cerb_client *b = hold_on_primary("follow");
    uint64_t on_p0 = acquires_on(b, &PRIMARY), on_s0 = acquires_on(b, &SECONDARY);
    waiter_start(b, H.w.name);
    assert_wait_until(waiting_on_primary, b, 3000);
    assert_string_equal(cerb_engine_switch_to(b, SECONDARY.name), SECONDARY.name);
    holder_release();
    assert_wait_until(waiter_done, &W, 5000);
    expect_status(atomic_load(&W.st), CERB_OK, "the waiter");
    uint64_t on_p = acquires_on(b, &PRIMARY) - on_p0, on_s = acquires_on(b, &SECONDARY) - on_s0;
    print_message("waiter: %llu grants on %s, %llu on %s\n", (unsigned long long)on_p,
                  PRIMARY.name, (unsigned long long)on_s, SECONDARY.name);
    assert_int_equal(on_p, 0);
    assert_int_equal(on_s, 1);
}

/*
 * A client pinned to the secondary by its configuration asks the primary
 * on every acquisition while it answers, and does not trust an earlier
 * "free" once it stops answering: a process that has not read the file yet
 * may still be granting there (issue 10, item 4 — the per-name cache this
 * replaces assumed every process follows within 2 s). With the primary
 * stopped, a name it confirmed free before waits out the grace like any.
 */
static void test_pinned_client_trusts_no_old_answer(void **state)
{
    (void)state;
    cerb_client *c = open_with(CFG(.active = SECONDARY.name));
    assert_true(on_secondary(c));
    char *seen = test_name("seen");
    cerb_lock *ls = handle(c, seen);
    free(seen);
    expect_status(cerb_lock_trylock_for(ls, 2000), CERB_OK, "a name the primary confirms free");
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);

    assert_int_equal(PRIMARY.pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    expect_status(cerb_lock_trylock_for(ls, PRIMARY.hold_ms + 3000), CERB_OK, "the name confirmed before");
    int64_t t_seen = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);
    assert_int_equal(PRIMARY.resume(), 0);
    print_message("%s stopped: a name confirmed free before waited %lld ms (hold %lld ms)\n",
                  PRIMARY.name, (long long)t_seen, (long long)PRIMARY.hold_ms);
    /* The grace counts from the primary's last answer, a little before
     * the stop. */
    assert_true(t_seen >= PRIMARY.hold_ms - 500);
}

/*
 * After `cerberus switch` (epoch 2), the primary keeps a closure record
 * (core/closure.c) that refuses every process still on the old file, so a
 * name it said was free stays free without asking again — but only while
 * the record was seen recently (half a lease): with the primary stopped
 * longer, nothing it said is trusted and a name it confirmed free before
 * waits out the grace like any other. An engine without records is asked
 * as in the case above.
 */
static bool record_untrusted(void *ud)
{
    struct cerb_engine_info in;
    return cerb_engine_info(ud, PRIMARY.name, &in) == CERB_OK && in.closed_epoch == 0;
}

static void test_closed_primary_trusted_only_while_seen(void **state)
{
    (void)state;
    cerb_client *c = open_with(CFG(.active = SECONDARY.name, .epoch = 2, .ns = true));
    assert_true(on_secondary(c));
    struct cerb_engine_info in;
    assert_int_equal(cerb_engine_info(c, PRIMARY.name, &in), CERB_OK);
    print_message("%s: closure record seen at epoch %lld\n", PRIMARY.name,
                  (long long)in.closed_epoch);
    char *seen = test_name("seen");
    cerb_lock *ls = handle(c, seen);
    free(seen);
    expect_status(cerb_lock_trylock_for(ls, 2000), CERB_OK, "a name the primary confirms free");
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);
    uint64_t asked = (cerb_engine_info(c, PRIMARY.name, &in), in.gate_questions);
    expect_status(cerb_lock_trylock_for(ls, 2000), CERB_OK, "the same name again");
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);
    assert_int_equal(cerb_engine_info(c, PRIMARY.name, &in), CERB_OK);
    print_message("questions to %s for the name's second grant: %llu\n", PRIMARY.name,
                  (unsigned long long)(in.gate_questions - asked));
    if (in.closed_epoch == 2)
        assert_true(in.gate_questions - asked <= 1); /* 0, or 1 after a lapse */

    assert_int_equal(PRIMARY.pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_wait_until(record_untrusted, c, 5000);
    expect_status(cerb_lock_trylock_for(ls, PRIMARY.hold_ms + 3000), CERB_OK, "the name confirmed before");
    int64_t t_seen = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);
    assert_int_equal(PRIMARY.resume(), 0);
    print_message("%s stopped: a name confirmed free before waited %lld ms (hold %lld ms)\n",
                  PRIMARY.name, (long long)t_seen, (long long)PRIMARY.hold_ms);
    assert_true(t_seen >= PRIMARY.hold_ms - 500);
}

/*
 * A hold granted on the secondary after `cerberus switch` relies on the
 * primary's closure record rather than a claim there. While the record is
 * read every probe round the hold lives on; once the primary cannot be read
 * (stopped here; a partition or a loss of its data in production, after
 * which processes still on the old file may be granted there when nobody
 * writes the record back), the hold is told LOST within a lease of the
 * last reading, as it was when a claim there could not be renewed.
 */
static bool hold_lost(void *ud) { return cerb_lock_state(ud) == CERB_LOCK_LOST; }

static void test_hold_relying_on_record_lost_when_unreadable(void **state)
{
    (void)state;
    cerb_client *c = open_with(CFG(.active = SECONDARY.name, .epoch = 2, .ns = true));
    struct cerb_engine_info in;
    assert_int_equal(cerb_engine_info(c, PRIMARY.name, &in), CERB_OK);
    if (in.closed_epoch != 2) {
        print_message("%s keeps no closure record: nothing to check\n", PRIMARY.name);
        return;
    }
    char *name = test_name("relies");
    cerb_lock *l = handle(c, name);
    free(name);
    expect_status(cerb_lock_trylock_for(l, 2000), CERB_OK, "granted on the secondary");
    cerb_test_let_time_pass(2 * LEASE_MS);
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    assert_int_equal(PRIMARY.pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    bool lost = wait_until(hold_lost, l, 3 * LEASE_MS);
    int64_t t = cerb_test_now_ms() - t0;
    assert_int_equal(PRIMARY.resume(), 0);
    print_message("%s stopped: the hold relying on its record was told LOST after %lld ms "
                  "(lease %d ms)\n", PRIMARY.name, (long long)t, LEASE_MS);
    assert_true(lost);
    assert_true(t <= LEASE_MS + SLACK_MS);
}

/*
 * A client that switched by itself three times still has tokens of epoch 1;
 * a client opened after the epoch was bumped to 2 (what `cerberus switch`
 * does) has epoch 2 and ranks above it, as every grant after
 * a `cerberus switch` must rank above every grant before it.
 */
static void test_epoch_orders_config_bump_above_own_switches(void **state)
{
    (void)state;
    /* Both in the case's namespace: b's switch closes the primary there. */
    cerb_client *a = open_with(CFG(.failover = "failback = \"manual\";", .ns = true));
    assert_string_equal(cerb_engine_current(a), PRIMARY.name);
    assert_string_equal(cerb_engine_switch_to(a, SECONDARY.name), SECONDARY.name);
    assert_string_equal(cerb_engine_switch_to(a, PRIMARY.name), PRIMARY.name);
    assert_string_equal(cerb_engine_switch_to(a, SECONDARY.name), SECONDARY.name);
    char *name = test_name("epochbits");
    cerb_lock *la = handle(a, name);
    expect_status(cerb_lock_trylock_for(la, 5000), CERB_OK, "after three switches");
    uint64_t before = cerb_lock_fencing_token(la);
    if (fenced(&SECONDARY))
        assert_int_equal(before >> 48, 1); /* own switches leave the epoch */
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);

    cerb_client *b = open_with(CFG(.active = SECONDARY.name, .epoch = 2, .ns = true));
    cerb_lock *lb = handle(b, name);
    free(name);
    expect_status(cerb_lock_trylock_for(lb, 5000), CERB_OK, "after the bump");
    uint64_t after = cerb_lock_fencing_token(lb);
    print_message("on %s: before the bump %#llx, after %#llx\n", SECONDARY.name,
                  (unsigned long long)before, (unsigned long long)after);
    if (fenced(&SECONDARY)) {
        assert_int_equal(after >> 48, 2);
        assert_true(after > before);
    } else {
        assert_int_equal(after, 0);
    }
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
}

#if defined(CERB_FO_PAIR_ETCD_REDIS)
/*
 * One client's own tokens for a name grow across its own switches, both
 * ways (issue 10, §5a.3), and another client's later grant on etcd ranks
 * above them too: etcd's counter (create revisions, small) starts far below
 * redis' (server time in 100 µs ticks), so etcd raises its fence offset
 * above the client's redis token on the server when the client comes back.
 */
static void test_own_tokens_grow_across_switches_etcd(void **state)
{
    (void)state;
    static const struct fo_engine *const path[] = {&PRIMARY, &SECONDARY, &PRIMARY, &SECONDARY,
                                                   &PRIMARY};
    cerb_client *a = open_cfg("failback = \"manual\";");
    char name[256], *n = test_name("owngrow");
    snprintf(name, sizeof name, "%s", n);
    free(n);
    cerb_lock *l = handle(a, name);
    uint64_t last = 0;
    for (size_t i = 0; i < sizeof path / sizeof path[0]; i++) {
        if (i > 0)
            assert_string_equal(cerb_engine_switch_to(a, path[i]->name), path[i]->name);
        expect_status(cerb_lock_trylock_for(l, 5000), CERB_OK, path[i]->name);
        uint64_t f = cerb_lock_fencing_token(l);
        print_message("grant %zu on %s: token %#llx\n", i + 1, path[i]->name,
                      (unsigned long long)f);
        assert_int_equal(f >> 48, 1);
        assert_true(f > last);
        last = f;
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    assert_int_equal(acquires_on(a, &PRIMARY), 3);
    assert_int_equal(acquires_on(a, &SECONDARY), 2);

    cerb_client *b = open_cfg(NULL);
    cerb_lock *lb = handle(b, name);
    expect_status(cerb_lock_trylock_for(lb, 5000), CERB_OK, "another client on etcd");
    print_message("then another client on %s: token %#llx\n", PRIMARY.name,
                  (unsigned long long)cerb_lock_fencing_token(lb));
    assert_true(cerb_lock_fencing_token(lb) > last);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
}
#endif

/*
 * §5a.3: one client's tokens for a name never go backwards across its own
 * switches, whichever way, although the engines' counters are unrelated
 * (redis: server time in 100 µs ticks; zk: czxid plus an offset; etcd:
 * create revision; local: a count). The engine a client moves to raises its
 * counter above the highest token the client had on the other one. Each
 * engine promises that by CERB_CAP_FENCE_FLOOR: a move onto an engine
 * without it yet is printed, not asserted (issue 10 adds it engine by
 * engine), and a pair with neither is reported skipped.
 */
static bool honours_floor(const struct fo_engine *e)
{
    cerb__engines_builtin();
    const struct cerb_engine_ops *ops = cerb__engine_find(e->name);
    assert_non_null(ops);
    return (ops->caps & CERB_CAP_FENCE_FLOOR) != 0;
}

static void test_own_tokens_grow_across_switches(void **state)
{
    (void)state;
    cerb_client *a = open_cfg("failback = \"manual\";");
    char *name = test_name("owngrow");
    cerb_lock *la = handle(a, name);
    free(name);
    const struct fo_engine *on[] = {&PRIMARY, &SECONDARY, &PRIMARY, &SECONDARY};
    uint64_t t[4];
    for (int i = 0; i < 4; i++) {
        if (i > 0)
            assert_string_equal(cerb_engine_switch_to(a, on[i]->name), on[i]->name);
        expect_status(cerb_lock_trylock_for(la, 5000), CERB_OK, on[i]->name);
        t[i] = cerb_lock_fencing_token(la);
        assert_int_equal(cerb_lock_unlock(la), CERB_OK);
        print_message("on %s: token %#llx\n", on[i]->name, (unsigned long long)t[i]);
    }
    int asserted = 0;
    for (int i = 1; i < 4; i++) {
        bool ok = t[i] > t[i - 1];
        print_message("%s -> %s: %s%s\n", on[i - 1]->name, on[i]->name,
                      ok ? "grew" : "went backwards",
                      honours_floor(on[i]) ? "" : " (not asserted: no CERB_CAP_FENCE_FLOOR yet)");
        if (!honours_floor(on[i]))
            continue;
        asserted++;
        if (!ok)
            fail_msg("%s -> %s: token %#llx after %#llx", on[i - 1]->name, on[i]->name,
                     (unsigned long long)t[i], (unsigned long long)t[i - 1]);
    }
    if (asserted == 0)
        skip(); /* neither engine promises it yet: say so, do not pass */
}

/*
 * A client that opens on the secondary because the primary would not open
 * (its port is closed) cannot know whether others hold names there: it
 * waits the primary's grace before granting, unless switch_grace_ms = 0.
 */
static void test_open_below_dead_engine_waits_grace(void **state)
{
    (void)state;
    char *name = test_name("opengate");
    for (int grace0 = 0; grace0 <= 1; grace0++) {
        int64_t t0 = cerb_test_now_ms();
        cerb_client *c = open_with(
            CFG(.failover = grace0 ? "switch_grace_ms = 0;" : NULL, .dead_primary = true));
        assert_true(on_secondary(c));
        cerb_lock *l = handle(c, name);
        expect_status(cerb_lock_trylock_for(l, PRIMARY.hold_ms + 3000), CERB_OK, "below the dead primary");
        int64_t took = cerb_test_now_ms() - t0;
        print_message("grace %s: granted %lld ms after open (hold %lld ms)\n",
                      grace0 ? "0" : "default", (long long)took, (long long)PRIMARY.hold_ms);
        if (grace0)
            assert_true(took < 1000);
        else
            assert_true(took >= PRIMARY.hold_ms);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    free(name);
}

/* ---- `cerberus switch` on a watched file ---- */

#define WATCHERS 3

/* A watching child's side: the file, the pipe it reports on, and what its
 * log said about the file (set by the library's threads). */
struct watcher {
    const char *path;
    int fd;
    char expect[4200];  /* "<path>:<line>:" — an error naming the bad line */
    atomic_bool rejected;
};

static void watcher_log(cerb_log_level lv, const char *line, void *ud)
{
    struct watcher *w = ud;
    if (lv >= CERB_LOG_ERROR && strstr(line, w->expect))
        atomic_store(&w->rejected, true);
}

static bool watcher_rejected(void *ud) { return atomic_load(&((struct watcher *)ud)->rejected); }

static void say(int fd, const char *line)
{
    size_t n = strlen(line);
    while (n > 0) {
        ssize_t k = write(fd, line, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        line += k;
        n -= (size_t)k;
    }
}

/*
 * In a forked child: open the file on the primary and say "ready"; say
 * "switched" once the file moved us; then say "kept" once an invalid edit
 * was refused, with our log naming the bad line, and we stayed put.
 */
static int watcher_main(void *ud)
{
    struct watcher *w = ud;
    cerb_client *c = NULL;
    int rc = 0;
    cerb_log_set(watcher_log, w, CERB_LOG_ERROR);
    if (cerb_client_open(&c, w->path) != CERB_OK) {
        say(w->fd, "open failed\n");
        return 10;
    }
    if (!on_primary(c))
        rc = 11;
    if (rc == 0) {
        say(w->fd, "ready\n");
        if (!wait_until(on_secondary, c, 8000))
            rc = 12;
    }
    if (rc == 0) {
        say(w->fd, "switched\n");
        if (!wait_until(watcher_rejected, w, 15000))
            rc = 13;
        else if (!on_secondary(c))
            rc = 14;
    }
    if (rc == 0)
        say(w->fd, "kept\n");
    cerb_client_close(c);
    return rc;
}

/* The next line from a child's pipe within @timeout_ms, into @out without
 * its newline; false on timeout or end of file. One byte per read: a few
 * short lines, and nothing is read past the newline. */
static bool read_line(int fd, char *out, size_t len, int64_t timeout_ms)
{
    int64_t end = cerb_test_now_ms() + timeout_ms;
    size_t n = 0;
    for (;;) {
        int64_t left = end - cerb_test_now_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return false;
        char ch;
        ssize_t k = read(fd, &ch, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        if (ch == '\n') {
            out[n] = '\0';
            return true;
        }
        if (n + 1 < len)
            out[n++] = ch;
    }
}

/* Every watcher says @word next, within @timeout_ms. */
static void expect_all(const int *fds, const char *word, int64_t timeout_ms)
{
    for (int i = 0; i < WATCHERS; i++) {
        char line[256];
        if (!read_line(fds[i], line, sizeof line, timeout_ms))
            fail_msg("watcher %d: no \"%s\" within %lld ms", i, word, (long long)timeout_ms);
        if (strcmp(line, word) != 0)
            fail_msg("watcher %d: \"%s\" instead of \"%s\"", i, line, word);
    }
}

/* Replace the file as an editor would, in one rename, so no watcher can
 * read a half-written file. */
static void replace_file(const char *path, const char *text)
{
    char *tmp = cerb_test_write_config("%s", text);
    assert_non_null(tmp);
    assert_int_equal(rename(tmp, path), 0);
    free(tmp);
}

/* Reloads in a loop on one thread (each frees the configuration it
 * replaces) while another switches engines and locks, which read the
 * failover settings. A reader left pointing into a replaced configuration
 * is a use-after-free under ASan — a narrow window, so this is a stress
 * check; the TSan build (-DCERB_TSAN=ON) reports such a read every time,
 * as the unguarded read of c->cfg it used to be. */
struct reloader {
    cerb_client *c;
    atomic_bool stop;
    int reloads;
};

static void *reloader_main(void *arg)
{
    struct reloader *r = arg;
    while (!atomic_load(&r->stop) && r->reloads < 400)
        if (cerb_client_reload(r->c) == CERB_OK)
            r->reloads++;
    return NULL;
}

static void test_reload_while_switching(void **state)
{
    (void)state;
    char *text = cfg_text(CFG(.epoch = 1, .ns = true));
    char *path = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(path);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    track(c);
    struct reloader r = {.c = c};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reloader_main, &r), 0);
    char *name = test_name("reload-race");
    cerb_lock *l = handle(c, name);
    free(name);
    for (int i = 0; i < 100; i++) {
        assert_non_null(cerb_engine_switch_to(c, i % 2 ? PRIMARY.name : SECONDARY.name));
        if (cerb_lock_trylock_for(l, 200) == CERB_OK)
            assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    atomic_store(&r.stop, true);
    pthread_join(t, NULL);
    print_message("%d reloads during 100 switches\n", r.reloads);
    assert_true(r.reloads > 0);
    cerb_test_remove_file(path);
}

static void test_cli_switch_followed_by_processes(void **state)
{
    (void)state;
    char *text = cfg_text(CFG(.epoch = 1, .ns = true));
    char *path = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(path);

    struct watcher w = {.path = path};
    snprintf(w.expect, sizeof w.expect, "%s:%d:", path, ACTIVE_LINE);
    pid_t kids[WATCHERS];
    int fds[WATCHERS];
    for (int i = 0; i < WATCHERS; i++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        w.fd = p[1];
        kids[i] = cerb_test_fork(watcher_main, &w);
        assert_true(kids[i] > 0);
        close(p[1]);
        fds[i] = p[0];
    }
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    track(c);
    assert_true(on_primary(c));
    expect_all(fds, "ready", 15000);

    /* The operator's tool rewrites `active` (and bumps `epoch`). */
    char cli[4096];
    snprintf(cli, sizeof cli, "%s/cli/cerberus", cerb_test_build_dir());
    char *argv[] = {cli, "-c", path, "switch", (char *)SECONDARY.name, NULL};
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_test_run(argv, 20000), 0);
    int64_t ran = cerb_test_now_ms() - t0;
    expect_all(fds, "switched", 5000);
    int64_t took = cerb_test_now_ms() - t0;
    print_message("%d watching processes on %s %lld ms after `cerberus switch` started "
                  "(the command ran %lld ms)\n",
                  WATCHERS, SECONDARY.name, (long long)took, (long long)ran);
    assert_true(took - ran < 1000);
    assert_wait_until(on_secondary, c, 1000);

    /* Grants after the switch carry the new epoch. */
    char *name = test_name("epoch");
    cerb_lock *l = handle(c, name);
    free(name);
    expect_status(cerb_lock_trylock_for(l, 5000), CERB_OK, "a grant after the switch");
    if (fenced(&SECONDARY))
        assert_int_equal(cerb_lock_fencing_token(l) >> 48, 2); /* the bumped epoch */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    /* An engine name with a typo: refused everywhere, the old
     * configuration stays, and the reason names the file and line. */
    char *bad_active = fmt("%sx", SECONDARY.name);
    char *bad = cfg_text(CFG(.active = bad_active, .epoch = 3, .ns = true));
    replace_file(path, bad);
    free(bad);
    free(bad_active);
    expect_all(fds, "kept", 15000);
    for (int i = 0; i < WATCHERS; i++) {
        assert_int_equal(cerb_test_wait(kids[i], 10000), 0);
        close(fds[i]);
    }
    assert_int_equal(cerb_client_reload(c), CERB_ECONFIG);
    print_message("invalid edit: %s\n", cerb_last_error());
    assert_non_null(strstr(cerb_last_error(), w.expect));
    assert_true(on_secondary(c));
    cerb_test_remove_file(path);
}

/* ---- semaphores and read-write locks across a switch ---- */

/* The status of a primitive the primary may not have: skip the case then. */
static void skip_unless_primary_has(cerb_status st, const char *what)
{
    if (st == CERB_UNAVAILABLE && strstr(cerb_last_error(), "has no")) {
        print_message("%s has no %s: %s\n", PRIMARY.name, what, cerb_last_error());
        skip();
    }
}

/* A primitive the secondary has not (memcached): nothing to switch to. */
static void skip_unless_secondary_has(int prim)
{
    cerb__engines_builtin();
    const struct cerb_engine_ops *ops = cerb__engine_find(SECONDARY.name);
    assert_non_null(ops);
    if (!cerb__engine_has_prim(ops, prim)) {
        print_message("%s has no %s\n", SECONDARY.name, cerb__prim_name(prim));
        skip();
    }
}

static void test_switch_gates_semaphore(void **state)
{
    (void)state;
    skip_unless_secondary_has(CERB_PRIM_SEMAPHORE);
    cerb_client *a = open_cfg("failback = \"manual\";");
    cerb_client *b = open_cfg("failback = \"manual\";");
    char *name = test_name("fo-sem");
    cerb_semaphore *sa = NULL, *sb = NULL;
    assert_int_equal(cerb_semaphore_new(a, name, 2, NULL, &sa), CERB_OK);
    assert_int_equal(cerb_semaphore_new(b, name, 2, NULL, &sb), CERB_OK);
    cerb_permit *pa = NULL, *pb = NULL, *pb2 = NULL;
    cerb_status st = cerb_semaphore_acquire(sa, 1, 5000, NULL, &pa);
    if (st != CERB_OK) {
        cerb_semaphore_free(sa);
        cerb_semaphore_free(sb);
        free(name);
        skip_unless_primary_has(st, "semaphores");
        fail_msg("permit on %s: %s (%s)", PRIMARY.name, cerb_status_name(st), cerb_last_error());
    }
    assert_string_equal(cerb_engine_switch_to(b, SECONDARY.name), SECONDARY.name);
    /* One permit of two stands on the live old engine: the other is
     * granted on the new one at once (it fits there too), and taken on the
     * old one as well (a claim), so the old engine's count stays whole. */
    expect_status(cerb_semaphore_acquire(sb, 1, 0, NULL, &pb), CERB_OK,
                  "the spare permit after the switch");
    /* Both permits are taken now, one on each side: a third is refused. */
    st = cerb_semaphore_acquire(sb, 1, 0, NULL, &pb2);
    expect_status(st, CERB_BUSY, "a third permit of two across the switch");
    expect_status(cerb_semaphore_acquire(sb, 1, 2 * PRIMARY.hold_ms + 500, NULL, &pb2),
                  CERB_TIMEOUT, "a third permit of two, past the grace");
    assert_int_equal(cerb_permit_free(pa), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    expect_status(cerb_semaphore_acquire(sb, 1, 5000, NULL, &pb2), CERB_OK,
                  "the permit released on the old engine");
    print_message("semaphore: granted on %s %lld ms after the release on %s\n", SECONDARY.name,
                  (long long)(cerb_test_now_ms() - t0), PRIMARY.name);
    assert_int_equal(cerb_permit_free(pb), CERB_OK);
    assert_int_equal(cerb_permit_free(pb2), CERB_OK);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    free(name);
}

static void test_switch_gates_rwlock(void **state)
{
    (void)state;
    skip_unless_secondary_has(CERB_PRIM_RWLOCK);
    cerb_client *a = open_cfg("failback = \"manual\";");
    cerb_client *b = open_cfg("failback = \"manual\";");
    char *name = test_name("fo-rw");
    cerb_rwlock *ra = NULL, *rb = NULL;
    assert_int_equal(cerb_rwlock_new(a, name, NULL, &ra), CERB_OK);
    assert_int_equal(cerb_rwlock_new(b, name, NULL, &rb), CERB_OK);
    cerb_status st = cerb_rwlock_read_trylock_for(ra, 5000);
    if (st != CERB_OK) {
        cerb_rwlock_free(ra);
        cerb_rwlock_free(rb);
        free(name);
        skip_unless_primary_has(st, "read-write locks");
        fail_msg("read lock on %s: %s (%s)", PRIMARY.name, cerb_status_name(st),
                 cerb_last_error());
    }
    assert_string_equal(cerb_engine_switch_to(b, SECONDARY.name), SECONDARY.name);
    /* A reader stands on the old engine: no writer on the new one. */
    expect_status(cerb_rwlock_write_trylock_for(rb, 0), CERB_BUSY,
                  "a writer while a reader holds on the old engine");
    assert_int_equal(cerb_rwlock_read_unlock(ra), CERB_OK);
    expect_status(cerb_rwlock_write_trylock_for(rb, 5000), CERB_OK,
                  "a writer once the old engine's reader left");
    assert_int_equal(cerb_rwlock_write_unlock(rb), CERB_OK);
    assert_int_equal(cerb_rwlock_free(ra), CERB_OK);
    assert_int_equal(cerb_rwlock_free(rb), CERB_OK);
    free(name);
}

/* Every case starts with the primary up and ends with nothing of its own
 * left running (primary_up, cleanup). */
#define CASE(f) cmocka_unit_test_setup_teardown(f, primary_up, cleanup)

int main(void)
{
    const struct CMUnitTest cases[] = {
        CASE(test_kill_primary),
        CASE(test_stop_primary),
        CASE(test_manual_failback_never),
        CASE(test_holder_lost_and_grace_respected),
        CASE(test_manual_switch_fast_path),
        CASE(test_gate_outlasts_grace_while_old_engine_answers),
        CASE(test_waiter_follows_switch),
        CASE(test_pinned_client_trusts_no_old_answer),
        CASE(test_closed_primary_trusted_only_while_seen),
        CASE(test_hold_relying_on_record_lost_when_unreadable),
        CASE(test_epoch_orders_config_bump_above_own_switches),
        CASE(test_own_tokens_grow_across_switches),
#if defined(CERB_FO_PAIR_ETCD_REDIS)
        CASE(test_own_tokens_grow_across_switches_etcd),
#endif
        CASE(test_open_below_dead_engine_waits_grace),
        CASE(test_switch_gates_semaphore),
        CASE(test_switch_gates_rwlock),
        CASE(test_reload_while_switching),
        CASE(test_cli_switch_followed_by_processes),
    };
    char group[64];
    snprintf(group, sizeof group, "failover %s -> %s", PRIMARY.name, SECONDARY.name);
    return cmocka_run_group_tests_name(group, cases, NULL, NULL);
}
