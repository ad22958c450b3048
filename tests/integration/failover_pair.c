/*
 * failover_pair.c — failover between two real servers, one source built
 * once per pair of engines (tests/CMakeLists.txt defines CERB_FO_PAIR_REDIS_ZK
 * or CERB_FO_PAIR_ETCD_REDIS). The first engine is the primary and runs on
 * this suite's exclusive server, which the tests kill -9, SIGSTOP and
 * restart; the second is the shared server of its engine, where every lock
 * name is unique to this run (test_name()). The cases (the table in main):
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
 *     a name it confirms free is granted at once (no grace wait);
 *   - `cerberus switch <secondary>` on a file watched by three processes
 *     moves all three, and an invalid edit afterwards keeps the old
 *     configuration in every one of them, which each says why (file:line).
 * The second engine is only ever a secondary here, so it needs no way to be
 * disrupted. Timings are printed (print_message) for the record.
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
#include "test_util.h"

#if defined(CERB_FO_PAIR_REDIS_ZK)
#include "zk_util.h"
#elif defined(CERB_FO_PAIR_ETCD_REDIS)
#include "etcd_util.h"
#else
#error "define CERB_FO_PAIR_REDIS_ZK or CERB_FO_PAIR_ETCD_REDIS (tests/CMakeLists.txt)"
#endif

/* Small numbers keep the suite short; the model is test_redis_fault_failover.c. */
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
    /* Its configuration section on this suite's server (malloc'd). */
    char *(*section)(void);
    /* How long a hold can outlive the client's last contact with the server
     * (the lease, or a longer session): what the default grace covers. */
    int64_t hold_ms;
    pid_t (*pid)(void);  /* the server's PID, -1 when not running */
    int (*pause)(void);  /* SIGSTOP, then wait until stopped; 0 or -1 */
    int (*resume)(void); /* SIGCONT; 0 or -1 */
    int (*start)(void);  /* start it (again); servers.sh's exit status */
};

static char *redis_section(void)
{
    return fmt("redis = { port = %d; op_timeout_ms = %d; connect_timeout_ms = %d; };\n",
               cerb_test_redis_port(), OP_TIMEOUT_MS, OP_TIMEOUT_MS);
}
static int redis_start(void) { return cerb_test_servers("start"); }
static const struct fo_engine fo_redis = {"redis", redis_section, LEASE_MS, cerb_test_redis_pid,
                                          cerb_test_redis_pause, cerb_test_redis_resume,
                                          redis_start};

#if defined(CERB_FO_PAIR_REDIS_ZK)
#define ZK_SESSION_MS 4000
static char *zk_section(void)
{
    return fmt("zk = { hosts = \"127.0.0.1:%d\"; session_timeout_ms = %d; };\n",
               cerb_test_zk_port(), ZK_SESSION_MS);
}
static const struct fo_engine fo_zk = {"zk", zk_section, ZK_SESSION_MS, NULL, NULL, NULL, NULL};
#define PRIMARY fo_redis
#define SECONDARY fo_zk
#else
#define ETCD_TTL_S 2 /* the smallest session TTL etcd.session_ttl_s allows */
static char *etcd_section(void)
{
    return fmt("etcd = { endpoints = (\"http://127.0.0.1:%d\"); session_ttl_s = %d;\n"
               "  op_timeout_ms = %d; connect_timeout_ms = %d; };\n",
               etcd_test_port(), ETCD_TTL_S, OP_TIMEOUT_MS, OP_TIMEOUT_MS);
}
static pid_t etcd_pid(void) { return etcd_test_pid(etcd_test_port()); }
static int etcd_pause(void) { return etcd_test_pause(etcd_test_port()); }
static int etcd_resume(void) { return etcd_test_resume(etcd_test_port()); }
static int etcd_start(void) { return etcd_test_servers("start", etcd_test_port(), 1); }
/* A hold lasts as long as its session's lease (the lock's lease_ms is
 * shorter here). */
static const struct fo_engine fo_etcd = {"etcd",       etcd_section, ETCD_TTL_S * 1000,
                                         etcd_pid,     etcd_pause,   etcd_resume,
                                         etcd_start};
_Static_assert(ETCD_TTL_S * 1000 >= LEASE_MS, "the hold time above assumes it");
#define PRIMARY fo_etcd
#define SECONDARY fo_redis
#endif

/* ---- configuration ---- */

/*
 * The configuration of every client here: both engines in order, fast
 * probes and a breaker that opens after two failures. `active` is on line
 * 2, which the invalid-edit check relies on.
 */
static char *cfg_text(const char *active, int epoch, const char *failover_extra)
{
    char *p = PRIMARY.section(), *s = SECONDARY.section();
    char *t = fmt("engines = (\"%s\", \"%s\");\n"
                  "active = \"%s\";\n"
                  "epoch = %d;\n"
                  "lock = { lease_ms = %d; };\n"
                  "retry = { max = 1; backoff_ms = 5; backoff_max_ms = 20; };\n"
                  "failover = { probe_interval_ms = 100; probe_timeout_ms = 100;\n"
                  "  consecutive_failures = 2; open_ms = 500; half_open_successes = 2;\n"
                  "  %s };\n"
                  "%s%s",
                  PRIMARY.name, SECONDARY.name, active, epoch, LEASE_MS, failover_extra, p, s);
    free(p);
    free(s);
    return t;
}
#define ACTIVE_LINE 2

/*
 * Every client a case opens is closed by the teardown, after its threads
 * have stopped, so a failed case leaves no client probing (and failing
 * over) behind it.
 */
static cerb_client *opened[8];

static cerb_client *track(cerb_client *c)
{
    for (size_t i = 0; i < sizeof opened / sizeof opened[0]; i++)
        if (!opened[i])
            return opened[i] = c;
    fail_msg("more than %zu clients in one case", sizeof opened / sizeof opened[0]);
    return NULL;
}

static void close_clients(void)
{
    for (size_t i = 0; i < sizeof opened / sizeof opened[0]; i++) {
        cerb_client_close(opened[i]);
        opened[i] = NULL;
    }
}

static cerb_client *open_cfg(const char *failover_extra)
{
    char *t = cfg_text("auto", 1, failover_extra);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, t);
    free(t);
    if (st != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    track(c);
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
        st = cerb_lock_trylock_for(l, 5000); /* bounded: the teardown joins us */
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
    assert_wait_until(holder_held, &H, 5000);
    assert_int_equal(atomic_load(&H.st), CERB_OK);
}

/* The holder lets go (and its thread ends). */
static void holder_release(void)
{
    atomic_store(&H.w.stop, true);
    pthread_join(H.w.t, NULL);
    H.w.running = false;
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
    close_clients();
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
    assert_wait_until(looped_a_little, NULL, 5000);

    pid_t pid = PRIMARY.pid();
    assert_true(pid > 0);
    int64_t t_out = cerb_test_now_ms();
    if (kill_it)
        assert_int_equal(kill(pid, SIGKILL), 0);
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
    assert_int_equal(kill_it ? PRIMARY.start() : PRIMARY.resume(), 0);
    assert_true(on_secondary(c[0]));
    assert_wait_until(primary_closed, c[0], 15000);
    int64_t t_closed = cerb_test_now_ms();
    assert_wait_until(on_primary, c[0], 5000);
    int64_t back = cerb_test_now_ms() - t_closed;
    print_message("failback %lld ms after the breaker closed (failback_after_ms %d)\n",
                  (long long)back, FAILBACK_MS);
    /* t_closed was noticed up to one poll (20 ms) late. */
    assert_true(back >= FAILBACK_MS - 25);

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
    assert_int_equal(kill(PRIMARY.pid(), SIGKILL), 0);
    assert_wait_until(on_secondary, c, 3000);
    assert_int_equal(PRIMARY.start(), 0);
    /* Healthy again, then well past failback_after_ms and several probe
     * rounds: still on the secondary. */
    assert_wait_until(primary_closed, c, 10000);
    assert_false(wait_until(on_primary, c, 600));
    assert_string_equal(cerb_engine_switch_to(c, PRIMARY.name), PRIMARY.name);
}

/* ---- holders ---- */

static void test_holder_lost_and_grace_respected(void **state)
{
    (void)state;
    /* Default grace: the old engine's lease or session plus drift. */
    cerb_client *a = open_cfg("failback = \"manual\";");
    cerb_client *b = open_cfg("failback = \"manual\";");
    holder_start(a, "grace");

    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(kill(PRIMARY.pid(), SIGKILL), 0);
    assert_wait_until(on_secondary, b, 3000);
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, H.w.name, NULL, &lb), CERB_OK);
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
    cerb_lock_free(lb);
    holder_release();
}

static void test_manual_switch_fast_path(void **state)
{
    (void)state;
    cerb_client *a = open_cfg("failback = \"manual\";");
    cerb_client *b = open_cfg("failback = \"manual\";");
    holder_start(a, "fastpath");
    assert_string_equal(cerb_engine_switch_to(b, SECONDARY.name), SECONDARY.name);

    /* A name nobody holds: the old engine says so in one round trip, so
     * even a single attempt (no wait at all) is granted. */
    char *other = test_name("never-held");
    cerb_lock *lo = NULL;
    assert_int_equal(cerb_lock_new(b, other, NULL, &lo), CERB_OK);
    free(other);
    expect_status(cerb_lock_trylock(lo), CERB_OK, "a free name after the switch");
    cerb_lock_free(lo);

    /* Held on the live old engine: refused on the new one. */
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, H.w.name, NULL, &lb), CERB_OK);
    expect_status(cerb_lock_trylock(lb), CERB_BUSY, "a name held on the old engine");
    holder_release();
    /* Confirmed free there: granted at once, long before the grace ends. */
    int64_t t0 = cerb_test_now_ms();
    expect_status(cerb_lock_trylock_for(lb, 10000), CERB_OK, "a name released on the old engine");
    int64_t took = cerb_test_now_ms() - t0;
    print_message("granted %lld ms after the release on %s (grace %lld ms)\n", (long long)took,
                  PRIMARY.name, (long long)PRIMARY.hold_ms);
    assert_true(took < 500);
    assert_true((cerb_lock_fencing_token(lb) >> 48) >= 2); /* the switch raised the epoch */
    assert_int_equal(acquires_on(b, &SECONDARY), 2);
    cerb_lock_unlock(lb);
    cerb_lock_free(lb);
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

static void test_cli_switch_followed_by_processes(void **state)
{
    (void)state;
    char *text = cfg_text("auto", 1, "");
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
    cerb_lock *l = NULL;
    char *name = test_name("epoch");
    assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
    expect_status(cerb_lock_trylock_for(l, 5000), CERB_OK, "a grant after the switch");
    assert_true((cerb_lock_fencing_token(l) >> 48) >= 2);
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    free(name);

    /* An engine name with a typo: refused everywhere, the old
     * configuration stays, and the reason names the file and line. */
    char *bad_active = fmt("%sx", SECONDARY.name);
    char *bad = cfg_text(bad_active, 3, "");
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

int main(void)
{
    const struct CMUnitTest cases[] = {
        cmocka_unit_test_setup_teardown(test_kill_primary, primary_up, cleanup),
        cmocka_unit_test_setup_teardown(test_stop_primary, primary_up, cleanup),
        cmocka_unit_test_setup_teardown(test_manual_failback_never, primary_up, cleanup),
        cmocka_unit_test_setup_teardown(test_holder_lost_and_grace_respected, primary_up,
                                        cleanup),
        cmocka_unit_test_setup_teardown(test_manual_switch_fast_path, primary_up, cleanup),
        cmocka_unit_test_setup_teardown(test_cli_switch_followed_by_processes, primary_up,
                                        cleanup),
    };
    char group[64];
    snprintf(group, sizeof group, "failover %s -> %s", PRIMARY.name, SECONDARY.name);
    return cmocka_run_group_tests_name(group, cases, NULL, NULL);
}
