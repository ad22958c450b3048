/*
 * failover_guard.c — the idempotency guard across an engine switch
 * (DESIGN.md §11 "Failover"): the primary is this suite's exclusive
 * redis-server, which the cases kill -9 and restart; the secondary is the
 * in-process local engine, whose records every client of this process
 * shares as processes share a server's. The cases:
 *   - a switch with the old engine alive lets no duplicate through: a
 *     success recorded before the switch is answered as a duplicate after
 *     it (and copied to the new engine), an attempt running on the old
 *     engine by a client that did not switch makes a switched client's
 *     begin BUSY and the other way round, a switched client's success is
 *     seen by the client that did not switch, a failed attempt (and one
 *     left open at close) leaves no record on either engine;
 *   - a switched client's claim on the old engine lost (deleted there):
 *     its finish says CERB_LOST, since another attempt may have run there;
 *     an attempt lost on its own engine leaves no done-record on the old
 *     one; a success the old engine did not confirm (refusing writes) is
 *     written there in the background, so its processes see a duplicate;
 *   - the primary killed between two begins of one key: the breaker moves
 *     the client to the secondary, and with on_unavailable = refuse the
 *     second begin is refused (the dead primary may hold the record), with
 *     allow it runs, degraded, and is counted in cerb_engine_info; once the
 *     dead engine has been silent for keep_ms + running_ms it can hold no
 *     record, and begins pass again.
 * No records are left on the server after keep_ms (counted).
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#define KEEP_MS 3000
#define RUNNING_MS 2000

static char prefix[64]; /* "fg<pid>:" — this run's records */

static char *cfg_text(const char *guard_extra)
{
    char buf[1024];
    snprintf(buf, sizeof buf,
             "engines = (\"redis\", \"local\");\n"
             "lock = { lease_ms = 1500; };\n"
             "failover = { probe_interval_ms = 100; probe_timeout_ms = 100;\n"
             "  consecutive_failures = 2; open_ms = 500; half_open_successes = 2;\n"
             "  failback = \"manual\"; };\n"
             "redis = { port = %d; prefix = \"%s\"; op_timeout_ms = 200; "
             "connect_timeout_ms = 200; };\n"
             "guard = { keep_ms = %d; running_ms = %d; %s };\n",
             cerb_test_redis_port(), prefix, KEEP_MS, RUNNING_MS,
             guard_extra ? guard_extra : "");
    char *t = strdup(buf);
    assert_non_null(t);
    return t;
}

static cerb_client *client(const char *guard_extra)
{
    char *t = cfg_text(guard_extra);
    cerb_client *c = cerb_test_open(t);
    free(t);
    assert_non_null(c);
    assert_string_equal(cerb_engine_current(c), "redis");
    return c;
}

static redisContext *raw(void)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    assert_non_null(r);
    assert_int_equal(r->err, 0);
    redisSetTimeout(r, tv);
    return r;
}

/* This run's records on the server; with running_only, the claims. */
static size_t records(bool running_only, char *first, size_t n)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "KEYS %scerb:guard:*", prefix);
    assert_non_null(rep);
    size_t count = 0;
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        redisReply *v = redisCommand(r, "GET %b", rep->element[i]->str, rep->element[i]->len);
        assert_non_null(v);
        bool running = v->type == REDIS_REPLY_STRING && v->len > 0 && v->str[0] == 'R';
        if (!running_only || running) {
            if (first && count == 0)
                snprintf(first, n, "%.*s", (int)rep->element[i]->len, rep->element[i]->str);
            count++;
        }
        freeReplyObject(v);
    }
    freeReplyObject(rep);
    redisFree(r);
    return count;
}

static void expect(cerb_status got, cerb_status want, const char *what)
{
    if (got != want)
        fail_msg("%s: %s, expected %s (%s)", what, cerb_status_name(got), cerb_status_name(want),
                 cerb_last_error());
}

static cerb_guard *begin(cerb_client *c, const char *key, int policy, cerb_status want,
                         const char *what)
{
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.on_unavailable = policy;
    cerb_guard *g = NULL;
    expect(cerb_guard_begin(c, "orders", key, strlen(key), &o, &g), want, what);
    if (want == CERB_OK || want == CERB_DUPLICATE)
        assert_non_null(g);
    else
        assert_null(g);
    return g;
}

static void expect_dup(cerb_client *c, const char *key, const char *result, const char *what)
{
    cerb_guard *g = begin(c, key, -1, CERB_DUPLICATE, what);
    size_t len = 0;
    const char *r = cerb_guard_result(g, &len);
    assert_int_equal(len, strlen(result));
    assert_memory_equal(r, result, len);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
}

static void run_once(cerb_client *c, const char *key, const char *result, const char *what)
{
    cerb_guard *g = begin(c, key, -1, CERB_OK, what);
    expect(cerb_guard_finish(g, 1, result, strlen(result)), CERB_OK, what);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
}

static struct cerb_engine_info info_of(cerb_client *c, const char *engine)
{
    struct cerb_engine_info in;
    assert_int_equal(cerb_engine_info(c, engine, &in), CERB_OK);
    return in;
}

static void test_switch_with_old_engine_alive(void **state)
{
    (void)state;
    cerb_client *y = client(NULL), *x = client(NULL);
    char *k1 = test_name("k1"), *k2 = test_name("k2"), *k3 = test_name("k3"),
         *k4 = test_name("k4");

    /* Done before the switch: a duplicate after it. */
    run_once(y, k1, "r1", "y k1 on redis");
    assert_string_equal(cerb_engine_switch_to(y, "local"), "local");
    expect_dup(y, k1, "r1", "y k1 after the switch");
    assert_int_equal(info_of(y, "local").guard_duplicates, 1);

    /* Running on the old engine (x did not switch): BUSY here, then its
     * success is a duplicate. */
    cerb_guard *gx = begin(x, k2, -1, CERB_OK, "x k2 on redis");
    begin(y, k2, -1, CERB_BUSY, "y k2 while x runs it on redis");
    assert_int_equal(info_of(y, "local").guard_busy, 1);
    expect(cerb_guard_finish(gx, 1, "x2", 2), CERB_OK, "x finishes k2");
    assert_int_equal(cerb_guard_free(gx), CERB_OK);
    expect_dup(y, k2, "x2", "y k2 after x finished");

    /* Running here: the client that did not switch is told BUSY, then sees
     * the success. */
    cerb_guard *gy = begin(y, k3, -1, CERB_OK, "y k3 on local");
    assert_int_equal(cerb_guard_degraded(gy), 0);
    begin(x, k3, -1, CERB_BUSY, "x k3 on redis while y runs it on local");
    expect(cerb_guard_finish(gy, 1, "y3", 2), CERB_OK, "y finishes k3");
    assert_int_equal(cerb_guard_free(gy), CERB_OK);
    expect_dup(x, k3, "y3", "x k3 after y finished");

    /* A failed attempt leaves no record on either engine. */
    gy = begin(y, k4, -1, CERB_OK, "y k4");
    expect(cerb_guard_finish(gy, 0, NULL, 0), CERB_OK, "y fails k4");
    assert_int_equal(cerb_guard_free(gy), CERB_OK);
    gx = begin(x, k4, -1, CERB_OK, "x retries k4 at once");
    assert_int_equal(cerb_guard_free(gx), CERB_OK);
    assert_int_equal(records(true, NULL, 0), 0);
    assert_int_equal(info_of(y, "local").guard_begins, 2);
    assert_int_equal(info_of(y, "local").guard_degraded, 0);

    /* An attempt left open at close is deleted as failed on both. */
    char *k5 = test_name("k5");
    begin(y, k5, -1, CERB_OK, "y k5, left open");
    assert_int_equal(records(true, NULL, 0), 1);
    cerb_client_close(y);
    assert_int_equal(records(true, NULL, 0), 0);
    begin(x, k5, -1, CERB_OK, "x k5 after y closed");

    cerb_client_close(x); /* closes x's k5 attempt too */
    assert_int_equal(records(true, NULL, 0), 0);
    free(k1), free(k2), free(k3), free(k4), free(k5);
}

static void test_lost_claim_on_old_engine(void **state)
{
    (void)state;
    cerb_client *y = client(NULL);
    char *k = test_name("lost");
    assert_string_equal(cerb_engine_switch_to(y, "local"), "local");
    cerb_guard *g = begin(y, k, -1, CERB_OK, "y on local");
    char key[256] = "";
    assert_int_equal(records(true, key, sizeof key), 1); /* its claim on redis */
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "DEL %s", key);
    assert_non_null(rep);
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    redisFree(r);
    cerb_status st = cerb_guard_finish(g, 1, "v", 1);
    expect(st, CERB_LOST, "finish after the claim on redis was deleted");
    assert_non_null(strstr(cerb_last_error(), "switched from"));
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    /* The result is recorded where the attempt ran. */
    expect_dup(y, k, "v", "after the lost mirror");
    cerb_client_close(y);
    free(k);
}

/* A lost attempt leaves nothing on the engines switched from either: its
 * claim there is deleted, not finished as a success (the caller was told
 * CERB_LOST, "nothing was changed"). */
static void test_lost_attempt_leaves_no_mirror_record(void **state)
{
    (void)state;
    cerb_client *y = client(NULL);
    char *k = test_name("lostmirror");
    assert_string_equal(cerb_engine_switch_to(y, "local"), "local");
    assert_string_equal(cerb_engine_switch_to(y, "redis"), "redis"); /* local now gated */
    cerb_guard *g = begin(y, k, -1, CERB_OK, "y on redis, mirror on local");
    char key[256] = "";
    assert_int_equal(records(true, key, sizeof key), 1);
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "DEL %s", key);
    assert_non_null(rep);
    freeReplyObject(rep);
    redisFree(r);
    expect(cerb_guard_finish(g, 1, "v", 1), CERB_LOST, "finish after the redis claim went");
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    /* A client on local finds no done-record there. */
    cerb_client *z = client(NULL);
    assert_string_equal(cerb_engine_switch_to(z, "local"), "local");
    cerb_guard *h = begin(z, k, -1, CERB_OK, "z on local after the lost attempt");
    assert_int_equal(cerb_guard_free(h), CERB_OK);
    cerb_client_close(z);
    cerb_client_close(y);
    free(k);
}

struct dup_ud {
    cerb_client *c;
    const char *key;
};

static bool is_duplicate(void *ud)
{
    struct dup_ud *d = ud;
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(d->c, "orders", d->key, strlen(d->key), NULL, &g);
    cerb_guard_free(g);
    return st == CERB_DUPLICATE;
}

/* A success the engine switched from did not confirm (redis refusing
 * writes through both tries of the mirror's finish) is written there in
 * the background once it answers, so the client that never switched sees
 * a duplicate — not BUSY until the claim runs out and then a second run. */
static void test_mirror_success_retried(void **state)
{
    (void)state;
    cerb_client *y = client(NULL), *x = client(NULL);
    char *k = test_name("mirrorretry");
    assert_string_equal(cerb_engine_switch_to(y, "local"), "local");
    cerb_guard *g = begin(y, k, -1, CERB_OK, "y on local, mirror on redis");
    /* Writes refused (OOM), reads answered: the mirror's finish certainly
     * did not land, and its check finds the claim still ours. */
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "CONFIG SET maxmemory 1");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    expect(cerb_guard_finish(g, 1, "m", 1), CERB_OK, "finish: recorded on local");
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    rep = redisCommand(r, "CONFIG SET maxmemory 0");
    assert_non_null(rep);
    freeReplyObject(rep);
    redisFree(r);
    struct dup_ud d = {x, k};
    assert_wait_until(is_duplicate, &d, RUNNING_MS - 200);
    cerb_client_close(x);
    cerb_client_close(y);
    free(k);
}

/* Closing a client with attempts open whose engine switched from stopped
 * answering costs about one operation timeout there, not two per attempt
 * (their mirror claims are left to the background, then to expire). */
static void test_close_bounded_with_silent_mirrors(void **state)
{
    (void)state;
    enum { N = 10 };
    cerb_client *y = client(NULL);
    assert_string_equal(cerb_engine_switch_to(y, "local"), "local");
    char *k[N];
    for (int i = 0; i < N; i++) {
        k[i] = test_name("closebound");
        begin(y, k[i], -1, CERB_OK, "y on local, mirror on redis"); /* left open */
    }
    assert_int_equal(cerb_test_redis_pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_client_close(y);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_test_redis_resume(), 0);
    print_message("close with %d open attempts, redis stopped: %lld ms\n", N, (long long)took);
    assert_true(took < 1500); /* op timeout 200 ms; it was N x 2 x 200 ms and more */
    for (int i = 0; i < N; i++)
        free(k[i]);
}

struct lost_count {
    atomic_int n;
};

static void count_lost(cerb_guard *g, void *ud)
{
    (void)g;
    atomic_fetch_add(&((struct lost_count *)ud)->n, 1);
}

struct lost_all {
    cerb_guard **g;
    int n;
    struct lost_count *told;
};

static bool all_lost(void *ud)
{
    struct lost_all *a = ud;
    for (int i = 0; i < a->n; i++)
        if (cerb_guard_state(a->g[i]) != CERB_LOCK_LOST)
            return false;
    return atomic_load(&a->told->n) == a->n;
}

/* An engine switched from that falls silent (paused: every call there
 * costs an operation timeout) delays no renewal on the active engine:
 * attempts begun after the switch, each with a mirror claim there, keep
 * their claims on the active engine, so no other caller begins the
 * operation while they run. One renewer for every engine (the old
 * renewer) spent its time on the mirrors' renewals and let the claims on
 * local lapse: another client's begin got OK within RUNNING_MS. The
 * attempts themselves are told LOST (state and callback) once their
 * mirrors' deadline passes: processes still on redis may begin there. */
static void test_silent_engine_starves_no_claim(void **state)
{
    (void)state;
    enum { N = 8 };
    cerb_client *y = client(NULL);
    cerb_client *z = cerb_test_open("engines = (\"local\");"); /* the same local records */
    assert_non_null(z);
    assert_string_equal(cerb_engine_switch_to(y, "local"), "local");
    struct lost_count told = {0};
    cerb_guard *g[N];
    char *k[N];
    for (int i = 0; i < N; i++) {
        k[i] = test_name("starve");
        g[i] = begin(y, k[i], -1, CERB_OK, "y on local, mirror on redis");
        assert_int_equal(cerb_guard_state(g[i]), CERB_LOCK_VALID);
        assert_int_equal(cerb_guard_on_lost(g[i], count_lost, &told), CERB_OK);
    }
    assert_int_equal(cerb_test_redis_pause(), 0);
    /* Time itself is under test: sample for 2.5 x RUNNING_MS. */
    int64_t end = cerb_test_now_ms() + RUNNING_MS * 5 / 2;
    int rounds = 0;
    while (cerb_test_now_ms() < end) {
        for (int i = 0; i < N; i++) {
            cerb_guard *h = NULL;
            cerb_status st = cerb_guard_begin(z, "orders", k[i], strlen(k[i]), NULL, &h);
            if (st != CERB_BUSY) {
                cerb_test_redis_resume();
                fail_msg("round %d, key %d: another client's begin got %s while the attempt "
                         "runs: its claim on local lapsed", rounds, i, cerb_status_name(st));
            }
        }
        rounds++;
        cerb_test_let_time_pass(50);
    }
    struct lost_all la = {g, N, &told};
    bool lost = wait_until(all_lost, &la, 2000);
    assert_int_equal(cerb_test_redis_resume(), 0);
    assert_true(lost);
    print_message("%d rounds of %d begins, all BUSY; %d attempts told LOST\n", rounds, N,
                  atomic_load(&told.n));
    for (int i = 0; i < N; i++) {
        assert_int_equal(cerb_guard_state(g[i]), CERB_LOCK_LOST); /* final */
        cerb_guard_free(g[i]);
        free(k[i]);
    }
    cerb_client_close(z);
    cerb_client_close(y);
}

struct try_begin {
    cerb_client *c;
    const char *key;
};

static bool begin_passes(void *ud)
{
    struct try_begin *t = ud;
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(t->c, "orders", t->key, strlen(t->key), NULL, &g);
    if (st != CERB_OK)
        return false;
    assert_int_equal(cerb_guard_degraded(g), 0);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    return true;
}

static bool on_local(void *ud) { return strcmp(cerb_engine_current(ud), "local") == 0; }

static void test_primary_killed_between_begins(void **state)
{
    (void)state;
    cerb_client *y = client("on_unavailable = \"refuse\";");
    char *ka = test_name("ka"), *kb = test_name("kb");
    run_once(y, ka, "a", "ka on redis");

    pid_t pid = cerb_test_redis_pid();
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int64_t t_kill = cerb_test_now_ms();
    assert_wait_until(on_local, y, 5000);

    /* refuse: the dead primary may hold the record. */
    begin(y, ka, CERB_GUARD_REFUSE, CERB_UNAVAILABLE, "ka after the kill, refuse");
    assert_non_null(strstr(cerb_last_error(), "may hold the record"));
    /* allow: runs, degraded, counted. */
    cerb_guard *g = begin(y, ka, CERB_GUARD_ALLOW, CERB_OK, "ka after the kill, allow");
    assert_int_equal(cerb_guard_degraded(g), 1);
    expect(cerb_guard_finish(g, 1, "a2", 2), CERB_OK, "degraded ka finishes");
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    struct cerb_engine_info il = info_of(y, "local"), ir = info_of(y, "redis");
    print_message("local: begins %llu degraded %llu; redis: begins %llu degraded %llu\n",
                  (unsigned long long)il.guard_begins, (unsigned long long)il.guard_degraded,
                  (unsigned long long)ir.guard_begins, (unsigned long long)ir.guard_degraded);
    assert_int_equal(il.guard_degraded, 1);
    /* Recorded on the secondary: a duplicate from there, whatever the policy. */
    expect_dup(y, ka, "a2", "ka once more");

    /* A key never begun is refused too, but only until the dead engine
     * can hold no record: keep_ms + running_ms after it was last heard. */
    begin(y, kb, CERB_GUARD_REFUSE, CERB_UNAVAILABLE, "kb right after the kill");
    struct try_begin t = {y, kb};
    assert_wait_until(begin_passes, &t, KEEP_MS + RUNNING_MS + 3000);
    int64_t after = cerb_test_now_ms() - t_kill;
    print_message("begins refused for %lld ms after the kill (keep %d + running %d)\n",
                  (long long)after, KEEP_MS, RUNNING_MS);
    assert_true(after >= KEEP_MS + RUNNING_MS - 500);

    cerb_client_close(y);
    assert_int_equal(cerb_test_servers("start"), 0);
    free(ka), free(kb);
}

static bool no_records(void *ud)
{
    (void)ud;
    return records(false, NULL, 0) == 0;
}

static void test_no_records_left(void **state)
{
    (void)state;
    assert_wait_until(no_records, NULL, KEEP_MS + RUNNING_MS + 2000);
}

int main(void)
{
    snprintf(prefix, sizeof prefix, "fg%ld:", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switch_with_old_engine_alive),
        cmocka_unit_test(test_lost_claim_on_old_engine),
        cmocka_unit_test(test_lost_attempt_leaves_no_mirror_record),
        cmocka_unit_test(test_mirror_success_retried),
        cmocka_unit_test(test_close_bounded_with_silent_mirrors),
        cmocka_unit_test(test_silent_engine_starves_no_claim),
        cmocka_unit_test(test_primary_killed_between_begins),
        cmocka_unit_test(test_no_records_left),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
