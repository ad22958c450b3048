/*
 * test_redis_fault_failover.c — failover with a real primary (redis) and
 * the local engine as secondary: kill -9 and SIGSTOP of the primary while
 * clients lock in a loop (first grant on the secondary within a second with
 * grace 0; no call past its deadline), failback after failback_after_ms
 * (auto) or never (manual), a holder on the dead primary told LOST while
 * nobody else gets the name before its lease ran out (default grace), the
 * fast path after a manual switch (the live old engine confirms free), a
 * config file switch followed by three processes, and an invalid edit
 * that keeps the old configuration.
 * This suite owns its redis-server (it kills and pauses it).
 */
#define _POSIX_C_SOURCE 200809L
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

static char *cfg_text(const char *failover_extra)
{
    char *t = fmt(
                     "engines = (\"redis\", \"local\");\n"
                     "redis = { port = %d; op_timeout_ms = 200; connect_timeout_ms = 200; };\n"
                     "lock = { lease_ms = 1500; };\n"
                     "retry = { max = 1; backoff_ms = 5; backoff_max_ms = 20; };\n"
                     "failover = { probe_interval_ms = 100; probe_timeout_ms = 100;\n"
                     "  consecutive_failures = 2; open_ms = 500; half_open_successes = 2;\n"
                     "  %s };\n",
                     cerb_test_redis_port(), failover_extra);
    return t;
}

static cerb_client *open_text(const char *failover_extra)
{
    char *t = cfg_text(failover_extra);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, t);
    free(t);
    if (st != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    return c;
}

static int setup(void **state)
{
    (void)state;
    cerb_test_redis_resume();
    return cerb_test_servers("start") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    cerb_test_redis_resume();
    return cerb_test_servers("start") == 0 ? 0 : -1;
}

static bool on_local(void *ud) { return strcmp(cerb_engine_current(ud), "local") == 0; }
static bool on_redis(void *ud) { return strcmp(cerb_engine_current(ud), "redis") == 0; }

/* A client locking in a loop; records when the first grant on "local"
 * happened and the longest any single call took. */
struct looper {
    cerb_client *c;
    const char *name;
    atomic_bool stop;
    atomic_llong first_local_ms;
    atomic_llong longest_call_ms;
};

static void *loop_main(void *arg)
{
    struct looper *L = arg;
    cerb_lock *l = NULL;
    if (cerb_lock_new(L->c, L->name, NULL, &l) != CERB_OK)
        return NULL;
    while (!atomic_load(&L->stop)) {
        int64_t t0 = cerb_test_now_ms();
        cerb_status st = cerb_lock_trylock_for(l, 300);
        int64_t took = cerb_test_now_ms() - t0;
        if (took > atomic_load(&L->longest_call_ms))
            atomic_store(&L->longest_call_ms, took);
        if (st == CERB_OK) {
            struct cerb_engine_info info;
            cerb_engine_info(L->c, NULL, &info);
            if (strcmp(info.name, "local") == 0 && atomic_load(&L->first_local_ms) == 0)
                atomic_store(&L->first_local_ms, cerb_test_now_ms());
            cerb_lock_unlock(l);
        }
    }
    cerb_lock_free(l);
    return NULL;
}

static bool first_local(void *ud) { return atomic_load(&((struct looper *)ud)->first_local_ms) != 0; }

static void run_outage(bool kill_it)
{
    cerb_client *c = open_text("switch_grace_ms = 0; failback_after_ms = 800;");
    char *name = test_name(kill_it ? "killed" : "stopped");
    struct looper L = {.c = c, .name = name};
    pthread_t t;
    assert_string_equal(cerb_engine_current(c), "redis");
    pthread_create(&t, NULL, loop_main, &L);
    wait_until(first_local, &L, 300); /* let it run on redis a little */
    pid_t pid = cerb_test_redis_pid();
    assert_true(pid > 0);
    int64_t t_out = cerb_test_now_ms();
    if (kill_it)
        assert_int_equal(kill(pid, SIGKILL), 0);
    else
        assert_int_equal(cerb_test_redis_pause(), 0);
    assert_wait_until(first_local, &L, 3000);
    int64_t took = atomic_load(&L.first_local_ms) - t_out;
    print_message("%s primary: first grant on the secondary after %lld ms\n",
                  kill_it ? "killed" : "stopped", (long long)took);
    assert_true(took <= 1000);
    /* Bring it back: automatic failback after failback_after_ms. */
    if (kill_it)
        assert_int_equal(cerb_test_servers("start"), 0);
    else
        assert_int_equal(cerb_test_redis_resume(), 0);
    int64_t t_back = cerb_test_now_ms();
    assert_wait_until(on_redis, c, 5000);
    assert_true(cerb_test_now_ms() - t_back >= 700);
    atomic_store(&L.stop, true);
    pthread_join(t, NULL);
    /* No call ran far past its 300 ms wait (op and probe timeouts 200 ms). */
    print_message("longest call %lld ms\n", (long long)atomic_load(&L.longest_call_ms));
    assert_true(atomic_load(&L.longest_call_ms) < 1500);
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "redis", &info), CERB_OK);
    assert_true(info.breaker_transitions >= 2);
    assert_true(info.switches >= 2);
    free(name);
    cerb_client_close(c);
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
    cerb_client *c = open_text("switch_grace_ms = 0; failback = \"manual\"; failback_after_ms = 100;");
    pid_t pid = cerb_test_redis_pid();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_wait_until(on_local, c, 3000);
    assert_int_equal(cerb_test_servers("start"), 0);
    /* Well past failback_after_ms and several probe rounds: still local. */
    assert_false(wait_until(on_redis, c, 1500));
    assert_string_equal(cerb_engine_switch_to(c, "redis"), "redis");
    cerb_client_close(c);
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_seen(void *ud) { (void)ud; return atomic_load(&lost_calls) > 0; }

struct holder {
    cerb_client *c;
    const char *name;
    cerb_status st;
    atomic_bool held, release;
};

static bool holder_held(void *ud) { return atomic_load(&((struct holder *)ud)->held); }
static bool holder_release(void *ud) { return atomic_load(&((struct holder *)ud)->release); }

static void *holder_main(void *arg)
{
    struct holder *h = arg;
    cerb_lock *l = NULL;
    cerb_lock_new(h->c, h->name, NULL, &l);
    cerb_lock_on_lost(l, on_lost, NULL);
    h->st = cerb_lock_lock(l);
    atomic_store(&h->held, true);
    wait_until(holder_release, h, 20000);
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    return NULL;
}

static void test_holder_lost_and_grace_respected(void **state)
{
    (void)state;
    /* Default grace: the old engine's lease (1500 ms) plus drift. */
    cerb_client *a = open_text("failback = \"manual\";");
    cerb_client *b = open_text("failback = \"manual\";");
    char *name = test_name("grace");
    atomic_store(&lost_calls, 0);
    struct holder h = {.c = a, .name = name};
    pthread_t t;
    pthread_create(&t, NULL, holder_main, &h);
    assert_wait_until(holder_held, &h, 3000);
    assert_int_equal(h.st, CERB_OK);
    pid_t pid = cerb_test_redis_pid();
    int64_t t_kill = cerb_test_now_ms();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_wait_until(on_local, b, 3000);
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    int64_t granted_after = cerb_test_now_ms() - t_kill;
    print_message("other client granted after %lld ms (lease 1500)\n", (long long)granted_after);
    assert_true(granted_after >= 1500);
    assert_wait_until(lost_seen, NULL, 3000); /* the old holder was told */
    assert_int_equal(atomic_load(&lost_calls), 1);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(lb);
    atomic_store(&h.release, true);
    pthread_join(t, NULL);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

static void test_manual_switch_fast_path(void **state)
{
    (void)state;
    cerb_client *a = open_text("failback = \"manual\";");
    cerb_client *b = open_text("failback = \"manual\";");
    char *name = test_name("fastpath");
    struct holder h = {.c = a, .name = name};
    pthread_t t;
    pthread_create(&t, NULL, holder_main, &h);
    assert_wait_until(holder_held, &h, 3000);
    assert_string_equal(cerb_engine_switch_to(b, "local"), "local");
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    /* Held on the live old engine: not granted on the new one. */
    assert_int_equal(cerb_lock_trylock(lb), CERB_BUSY);
    atomic_store(&h.release, true);
    pthread_join(t, NULL);
    /* Confirmed free there: granted at once, long before the grace ends. */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 500);
    uint64_t f = cerb_lock_fencing_token(lb);
    assert_int_equal(f >> 52, 1);         /* the configuration's epoch */
    assert_int_equal((f >> 48) & 15, 1);  /* and one switch of this client */
    cerb_lock_unlock(lb);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
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
    cerb_client *a = open_text("failback = \"manual\";");
    cerb_client *b = open_text("failback = \"manual\";");
    char *name = test_name("outlast");
    struct holder h = {.c = a, .name = name};
    pthread_t t;
    pthread_create(&t, NULL, holder_main, &h);
    assert_wait_until(holder_held, &h, 3000);
    assert_string_equal(cerb_engine_switch_to(b, "local"), "local");
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    /* Twice the grace (lease 1500 ms + drift): still held on redis. */
    assert_int_equal(cerb_lock_trylock_for(lb, 3500), CERB_TIMEOUT);
    atomic_store(&h.release, true);
    pthread_join(t, NULL);
    assert_int_equal(cerb_lock_trylock_for(lb, 2000), CERB_OK);
    cerb_lock_unlock(lb);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* A waiter blocked on the old engine when its client switches. */
struct waiter {
    cerb_client *c;
    const char *name;
    cerb_status st;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    cerb_lock *l = NULL;
    cerb_lock_new(w->c, w->name, NULL, &l);
    w->st = cerb_lock_trylock_for(l, 10000);
    if (w->st == CERB_OK)
        cerb_lock_unlock(l);
    cerb_lock_free(l);
    atomic_store(&w->done, true);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

static bool waiting_on_redis(void *ud)
{
    struct cerb_engine_info info;
    return cerb_engine_info(ud, "redis", &info) == CERB_OK && info.acquire_calls >= 1;
}

/*
 * An acquisition waiting on the old engine moves to the new one when its
 * client switches, and is granted there once the old engine says the name
 * is free — never on the old engine after the switch.
 */
static void test_waiter_follows_switch(void **state)
{
    (void)state;
    cerb_client *a = open_text("failback = \"manual\";");
    cerb_client *b = open_text("failback = \"manual\";");
    char *name = test_name("follow");
    struct holder h = {.c = a, .name = name};
    pthread_t th, tw;
    pthread_create(&th, NULL, holder_main, &h);
    assert_wait_until(holder_held, &h, 3000);
    struct waiter w = {.c = b, .name = name};
    pthread_create(&tw, NULL, waiter_main, &w);
    assert_wait_until(waiting_on_redis, b, 3000);
    assert_string_equal(cerb_engine_switch_to(b, "local"), "local");
    atomic_store(&h.release, true);
    pthread_join(th, NULL);
    assert_wait_until(waiter_done, &w, 5000);
    pthread_join(tw, NULL);
    assert_int_equal(w.st, CERB_OK);
    struct cerb_engine_info ri, li;
    assert_int_equal(cerb_engine_info(b, "redis", &ri), CERB_OK);
    assert_int_equal(cerb_engine_info(b, "local", &li), CERB_OK);
    print_message("waiter: %llu grants on redis, %llu on local\n",
                  (unsigned long long)ri.acquires, (unsigned long long)li.acquires);
    assert_int_equal(ri.acquires, 0);
    assert_int_equal(li.acquires, 1);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/*
 * A client that opens on the secondary because the primary would not open
 * cannot know whether others hold names there: it waits the primary's
 * grace before granting (unless switch_grace_ms = 0).
 */
static void test_open_below_dead_engine_waits_grace(void **state)
{
    (void)state;
    static const char cfg[] =
        "engines = (\"redis\", \"local\");\n"
        "redis = { port = 1; op_timeout_ms = 200; connect_timeout_ms = 200; };\n"
        "lock = { lease_ms = 1500; };\n"
        "failover = { probe_interval_ms = 100; probe_timeout_ms = 100; %s };\n";
    char *name = test_name("opengate");
    for (int grace0 = 0; grace0 <= 1; grace0++) {
        char *text = fmt(cfg, grace0 ? "switch_grace_ms = 0;" : "");
        cerb_client *c = NULL;
        int64_t t0 = cerb_test_now_ms();
        assert_int_equal(cerb_client_open_string(&c, text), CERB_OK);
        free(text);
        assert_string_equal(cerb_engine_current(c), "local");
        cerb_lock *l = NULL;
        assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
        assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
        int64_t took = cerb_test_now_ms() - t0;
        print_message("grace %s: granted %lld ms after open\n", grace0 ? "0" : "default",
                      (long long)took);
        if (grace0)
            assert_true(took < 1000);
        else
            assert_true(took >= 1500);
        cerb_lock_unlock(l);
        cerb_lock_free(l);
        cerb_client_close(c);
    }
    free(name);
}

/*
 * A client that switched by itself three times has tokens of epoch field
 * 1<<4 | 3; a client opened after the epoch was bumped to 2 (what
 * `cerberus switch` does) has 2<<4 and ranks above it, as every grant after
 * a `cerberus switch` must rank above every grant before it.
 */
static void test_epoch_orders_config_bump_above_own_switches(void **state)
{
    (void)state;
    cerb_client *a = open_text("failback = \"manual\";");
    assert_string_equal(cerb_engine_switch_to(a, "local"), "local");
    assert_string_equal(cerb_engine_switch_to(a, "redis"), "redis");
    assert_string_equal(cerb_engine_switch_to(a, "local"), "local");
    char *name = test_name("epochbits");
    cerb_lock *la = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    uint64_t before = cerb_lock_fencing_token(la);
    assert_int_equal(before >> 48, (1 << 4) | 3);
    cerb_lock_unlock(la);
    cerb_lock_free(la);

    char *base = cfg_text("");
    char *text = fmt("epoch = 2;\nactive = \"local\";\n%s", base);
    free(base);
    cerb_client *b = NULL;
    assert_int_equal(cerb_client_open_string(&b, text), CERB_OK);
    free(text);
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    uint64_t after = cerb_lock_fencing_token(lb);
    print_message("before the bump %#llx, after %#llx\n", (unsigned long long)before,
                  (unsigned long long)after);
    assert_true(after > before);
    cerb_lock_unlock(lb);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/*
 * A client pinned by its configuration asks the other engine once per
 * name: with redis stopped afterwards, a name it confirmed free is granted
 * at once, while a name it never asked about waits out redis's grace.
 */
static void test_pinned_client_remembers_confirmed_names(void **state)
{
    (void)state;
    char *base = cfg_text("");
    char *text = fmt("active = \"local\";\n%s", base);
    free(base);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, text), CERB_OK);
    free(text);
    char *seen = test_name("seen"), *fresh = test_name("fresh");
    cerb_lock *ls = NULL, *lf = NULL;
    assert_int_equal(cerb_lock_new(c, seen, NULL, &ls), CERB_OK);
    assert_int_equal(cerb_lock_new(c, fresh, NULL, &lf), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(ls, 2000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);

    assert_int_equal(cerb_test_redis_pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(ls, 5000), CERB_OK);
    int64_t t_seen = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_lock_unlock(ls), CERB_OK);
    t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(lf, 5000), CERB_OK);
    int64_t t_fresh = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_lock_unlock(lf), CERB_OK);
    assert_int_equal(cerb_test_redis_resume(), 0);
    print_message("redis stopped: confirmed name %lld ms, new name %lld ms\n",
                  (long long)t_seen, (long long)t_fresh);
    assert_true(t_seen < 100);
    assert_true(t_fresh >= 1000);
    cerb_lock_free(ls);
    cerb_lock_free(lf);
    free(seen);
    free(fresh);
    cerb_client_close(c);
}

/* ---- config file switching ---- */

static char *write_cfg(const char *active, int epoch)
{
    char *body = fmt("# test config\n"
                     "engines = (\"redis\", \"local\");\n"
                     "active = \"%s\";\n"
                     "epoch = %d;\n"
                     "redis = { port = %d; };\n"
                     "failover = { probe_interval_ms = 100; probe_timeout_ms = 100; };\n",
                     active, epoch, cerb_test_redis_port());
    char *path = cerb_test_write_config("%s", body);
    free(body);
    return path;
}

static int child_follows(void *ud)
{
    const char *path = ud;
    cerb_client *c = NULL;
    if (cerb_client_open(&c, path) != CERB_OK)
        return 10;
    /* Tell the parent we are up by taking a lock name of our own. */
    int64_t end = cerb_test_now_ms() + 8000;
    int rc = 1;
    while (cerb_test_now_ms() < end) {
        if (strcmp(cerb_engine_current(c), "local") == 0) {
            rc = 0;
            break;
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    cerb_client_close(c);
    return rc;
}

static void test_config_switch_followed_by_processes(void **state)
{
    (void)state;
    char *path = write_cfg("auto", 1);
    pid_t kids[3];
    for (int i = 0; i < 3; i++)
        kids[i] = cerb_test_fork(child_follows, path);
    /* Our own client to see the children have had time to start. */
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    assert_string_equal(cerb_engine_current(c), "redis");
    wait_until(on_local, c, 500); /* give the children a moment to open */
    /* The operator's tool: `cerberus switch local` rewrites the file. */
    char cli[4096];
    snprintf(cli, sizeof cli, "%s/cli/cerberus", cerb_test_build_dir());
    char *argv[] = {cli, "-c", path, "switch", "local", NULL};
    assert_int_equal(cerb_test_run(argv, 20000), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_wait_until(on_local, c, 2000);
    assert_true(cerb_test_now_ms() - t0 < 1000);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cerb_test_wait(kids[i], 10000), 0);
    /* Grants after the switch carry the new epoch. */
    cerb_lock *l = NULL;
    char *name = test_name("epoch");
    assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    assert_int_equal(cerb_lock_fencing_token(l) >> 52, 2);
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    free(name);
    /* An invalid edit is refused and the old configuration stays. */
    FILE *f = fopen(path, "w");
    fputs("engines = (\"redis\", \"local\");\nactive = \"redsi\";\n", f);
    fclose(f);
    assert_int_equal(cerb_client_reload(c), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), ":2:"));
    assert_string_equal(cerb_engine_current(c), "local");
    cerb_client_close(c);
    cerb_test_remove_file(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill_primary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_primary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manual_failback_never, setup, teardown),
        cmocka_unit_test_setup_teardown(test_holder_lost_and_grace_respected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_manual_switch_fast_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_outlasts_grace_while_old_engine_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_waiter_follows_switch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_client_remembers_confirmed_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_epoch_orders_config_bump_above_own_switches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_below_dead_engine_waits_grace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_switch_followed_by_processes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
