/*
 * test_etcd_guard_pause.c — the etcd guard while its server stops, pauses or
 * restarts (this suite owns its server: the exclusive fixture, see
 * tests/CMakeLists.txt):
 *  - etcd killed (SIGKILL) and restarted on its data mid-attempt: the
 *    claim survives (etcd restores leases with a fresh TTL), the renewer
 *    carries on, and the finish records the success;
 *  - etcd restarted without its data mid-attempt: the claim and the
 *    client's running lease are gone; the client's next begin meets "lease
 *    not found", gets a new lease and succeeds; the old attempt's finish is
 *    CERB_LOST;
 *  - a finish whose answer is lost: UNKNOWN, settled by guard_check;
 *  - a begin whose answer is lost (server paused, so the request waits in
 *    its socket and may be applied when it resumes): the shared running
 *    lease it named is retired — another attempt's renewal moves its claim
 *    to a new lease instead of keeping the old one alive, so the old lease
 *    (and a claim the lost begin may have left on it) ends within its TTL.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "cerberus.h"
#include "config.h"
#include "engine.h"
#include "etcd_util.h"
#include "test_util.h"

static char prefix[64];

static cerb_client *open_client(const char *guard)
{
    char ee[128], ex[256];
    snprintf(ee, sizeof ee, "prefix = \"%s\"; op_timeout_ms = 300;", prefix);
    snprintf(ex, sizeof ex, "guard = { keep_ms = 5000; %s };", guard ? guard : "");
    char *cfg = etcd_test_config(ee, ex);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    return c;
}

static int teardown(void **state)
{
    (void)state;
    etcd_test_resume(etcd_test_port()); /* in case an assertion skipped it */
    return 0;
}

/* An etcd engine of its own (below the client: the tests drive the guard's
 * engine operations directly), with this suite's prefix. */
static cerb_engine *open_engine(int op_timeout_ms, const struct cerb_engine_ops **ops,
                                struct cerb_config **cfg)
{
    cerb__engines_builtin();
    *ops = cerb__engine_find("etcd");
    char ee[128];
    snprintf(ee, sizeof ee, "prefix = \"%s\"; op_timeout_ms = %d;", prefix, op_timeout_ms);
    char *text = etcd_test_config(ee, NULL);
    assert_int_equal(cerb__config_from_string(text, cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = *cfg};
    cerb_engine *e = NULL;
    assert_int_equal(cerb__engine_open(*ops, &env, &e), CERB_OK);
    return e;
}

/* ---- the server's processes ---- */

static bool pid_gone(void *ud)
{
    pid_t pid = *(pid_t *)ud;
    return kill(pid, 0) != 0 && errno == ESRCH;
}

static bool server_up(void *ud)
{
    (void)ud;
    long st = 0;
    json_t *a = etcd_test_post(etcd_test_port(), "/v3/kv/range", "{\"key\":\"AA==\"}", NULL, &st);
    json_decref(a);
    return st == 200;
}

/* SIGKILL the server; with keep_data it comes back on its data dir,
 * without it as a new, empty server. */
static void restart_server(bool keep_data)
{
    int port = etcd_test_port();
    if (keep_data) {
        pid_t pid = etcd_test_pid(port);
        assert_true(pid > 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_wait_until(pid_gone, &pid, 10000);
    } else {
        assert_int_equal(etcd_test_servers("stop", port, 1), 0);
    }
    assert_int_equal(etcd_test_servers("start", port, 1), 0);
    assert_wait_until(server_up, NULL, 10000);
}

/* Fails when a restart on the same data loses the attempt (a renewer that
 * gives up on the first failed renewals, a lease not found afterwards). */
static void test_etcd_guard_restart_keeps_attempt(void **state)
{
    (void)state;
    cerb_client *a = open_client("running_ms = 4000;"), *b = open_client(NULL);
    char *key = test_name("rst");
    cerb_guard *g = NULL, *d = NULL;
    assert_int_equal(cerb_guard_begin(a, "rst", key, strlen(key), NULL, &g), CERB_OK);
    restart_server(true);
    /* The claim is there, still this attempt's: another client is told
     * BUSY (the engine's breaker may need its probes first: retried). */
    int64_t end = cerb_test_now_ms() + 5000;
    cerb_status st;
    while ((st = cerb_guard_begin(b, "rst", key, strlen(key), NULL, &d)) != CERB_BUSY &&
           cerb_test_now_ms() < end) {
        assert_true(st == CERB_UNAVAILABLE);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_BUSY);
    assert_int_equal(cerb_guard_finish(g, 1, "after restart", 13), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_begin(b, "rst", key, strlen(key), NULL, &d), CERB_DUPLICATE);
    size_t len = 0;
    assert_memory_equal(cerb_guard_result(d, &len), "after restart", 13);
    cerb_guard_free(d);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* Fails when the client keeps putting claims with the lease the server
 * forgot (its begins then fail "lease not found" for good), or when the
 * lost attempt's finish is not CERB_LOST. */
static void test_etcd_guard_restart_without_data(void **state)
{
    (void)state;
    cerb_client *a = open_client("running_ms = 4000;");
    char *key = test_name("empty"), *key2 = test_name("empty2");
    cerb_guard *g = NULL, *h = NULL;
    assert_int_equal(cerb_guard_begin(a, "emp", key, strlen(key), NULL, &g), CERB_OK);
    restart_server(false);
    int64_t end = cerb_test_now_ms() + 5000;
    cerb_status st;
    while ((st = cerb_guard_begin(a, "emp", key2, strlen(key2), NULL, &h)) != CERB_OK &&
           cerb_test_now_ms() < end) {
        assert_int_equal(st, CERB_UNAVAILABLE); /* the breaker, until it closes again */
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "old", 3), CERB_LOST);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_finish(h, 1, "new", 3), CERB_OK);
    cerb_guard_free(h);
    /* The record went with the data: the operation may run again. */
    assert_int_equal(cerb_guard_begin(a, "emp", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    free(key);
    free(key2);
    cerb_client_close(a);
}

/* ---- a lost begin retires the shared lease (engine level) ---- */

static void rec_make(cerb_guard_rec *rec, const char *what, int token)
{
    char *name = test_name(what);
    unsigned char d[32];
    unsigned dl = 0;
    EVP_Digest(name, strlen(name), d, &dl, EVP_sha256(), NULL);
    free(name);
    memset(rec, 0, sizeof *rec);
    rec->scope = "retire";
    rec->running_ms = 1000;
    for (int i = 0; i < 32; i++)
        snprintf(rec->id + 2 * i, 3, "%02x", d[i]);
    snprintf(rec->token, sizeof rec->token, "%032x", token);
}

static void record_key(const cerb_guard_rec *rec, char *out, size_t n)
{
    snprintf(out, n, "%scerb:guard:%s", prefix, rec->id);
}

/* The lease of key (0: no key). */
static int64_t lease_of(const char *key)
{
    struct etcd_test_kv kv[1];
    int n = etcd_test_keys(etcd_test_port(), key, kv, 1);
    assert_true(n >= 0);
    return n > 0 ? kv[0].lease : 0;
}

static bool lease_gone(void *ud)
{
    char body[128];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", (long long)*(int64_t *)ud);
    long st = 0;
    json_t *a = etcd_test_post(etcd_test_port(), "/v3/lease/timetolive", body, NULL, &st);
    const json_t *t = json_object_get(a, "TTL");
    bool gone = st == 200 && json_is_string(t) && strcmp(json_string_value(t), "-1") == 0;
    json_decref(a);
    return gone;
}

/*
 * Attempt A holds a claim on the client's running lease L; a begin of B
 * is sent while the server is paused (its answer never comes: UNKNOWN).
 * Afterwards A's renewals must not keep L alive: A's next renewal moves A
 * to a new lease, and L ends within its TTL while A is renewed. Without
 * the retirement, A's renewals keep L — and whatever B's lost put left on
 * it — alive for as long as A runs: the wait for L to end fails.
 */
static void test_etcd_guard_lost_begin_retires_lease(void **state)
{
    (void)state;
    const struct cerb_engine_ops *ops = NULL;
    struct cerb_config *cfg = NULL;
    cerb_engine *e = open_engine(300, &ops, &cfg);

    cerb_guard_rec a, b;
    cerb_grant gr;
    void *res = NULL;
    size_t rl = 0;
    char ka[256];
    rec_make(&a, "ra", 1);
    rec_make(&b, "rb", 2);
    record_key(&a, ka, sizeof ka);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &a, &gr, &res, &rl), CERB_OK);
    int64_t old = lease_of(ka);
    assert_true(old != 0);

    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    cerb_status st = cerb__engine_guard_begin(ops, e, &b, &gr, &res, &rl);
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_int_not_equal(st, CERB_OK);
    assert_int_equal(gr.outcome, CERB_OUTCOME_UNKNOWN);

    /* Renew A as the guard renewer would (a third of the 2 s TTL) until
     * the old lease is gone; A stays ours throughout, on a new lease. */
    int64_t end = cerb_test_now_ms() + 6000;
    bool gone = false;
    while (!gone && cerb_test_now_ms() < end) {
        assert_int_equal(cerb__engine_guard_renew(ops, e, &a, &gr), CERB_OK);
        int64_t now_lease = lease_of(ka);
        assert_true(now_lease != 0 && now_lease != old);
        gone = lease_gone(&old);
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_true(gone);
    cerb_outcome oc;
    assert_int_equal(cerb__engine_guard_finish(ops, e, &a, 0, NULL, 0, 0, &oc), CERB_OK);
    /* Whatever B's put did, nothing of it outlives the old lease. */
    char kb[256];
    record_key(&b, kb, sizeof kb);
    assert_int_equal(lease_of(kb), 0);
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
}

/*
 * A finish whose answer is lost (server paused): the engine says UNKNOWN,
 * never "not done" or "not ours", so the core settles it with guard_check;
 * after the resume the check finds what the request did (our done-record,
 * no record, or our claim still running when it was not applied), and a
 * finish sent again completes it. Fails when a timed-out finish is
 * reported as definite.
 */
static void test_etcd_guard_lost_finish_unknown(void **state)
{
    (void)state;
    const struct cerb_engine_ops *ops = NULL;
    struct cerb_config *cfg = NULL;
    cerb_engine *e = open_engine(300, &ops, &cfg);
    /* The done bucket's lease first (keep 60 s: a bucket of 7.5 s), so the
     * finish below is the txn alone: a grant that times out leaves the
     * finish unsent (outcome NO, rightly). */
    {
        cerb_guard_rec w;
        cerb_grant gr;
        void *res = NULL;
        size_t rl = 0;
        cerb_outcome oc;
        char k[256];
        rec_make(&w, "lfw", 4);
        assert_int_equal(cerb__engine_guard_begin(ops, e, &w, &gr, &res, &rl), CERB_OK);
        assert_int_equal(cerb__engine_guard_finish(ops, e, &w, 1, "w", 1, 60000, &oc), CERB_OK);
        record_key(&w, k, sizeof k);
        assert_int_equal(etcd_test_delete(etcd_test_port(), k), 1);
    }
    for (int ok = 0; ok <= 1; ok++) {
        cerb_guard_rec r;
        cerb_grant gr;
        void *res = NULL;
        size_t rl = 0;
        cerb_outcome oc;
        cerb_guard_found found;
        rec_make(&r, ok ? "lf1" : "lf0", 3);
        r.running_ms = 5000;
        assert_int_equal(cerb__engine_guard_begin(ops, e, &r, &gr, &res, &rl), CERB_OK);
        assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
        cerb_status st = cerb__engine_guard_finish(ops, e, &r, ok, "res", 3, 60000, &oc);
        assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
        if (oc != CERB_OUTCOME_UNKNOWN)
            fail_msg("finish(%d): %s, outcome %d: %s", ok, cerb_status_name(st), (int)oc,
                     cerb_last_error());
        assert_int_not_equal(st, CERB_OK);
        assert_int_not_equal(st, CERB_NOT_OWNER);
        /* Settled as the core does: check, and while our claim is still
         * running (the request was not applied), finish again. The server
         * just resumed and may answer late at first: retried until 5 s. */
        cerb_guard_found want = ok ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_NONE;
        int64_t end = cerb_test_now_ms() + 5000;
        for (;;) {
            st = cerb__engine_guard_check(ops, e, &r, &found);
            if (st == CERB_OK) {
                assert_true(found == CERB_GUARD_FOUND_RUNNING || found == want);
                if (found == want)
                    break;
                cerb__engine_guard_finish(ops, e, &r, ok, "res", 3, 60000, &oc);
            }
            assert_true(cerb_test_now_ms() < end);
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (ok) { /* a re-sent finish of a done-record is still OK */
            assert_int_equal(cerb__engine_guard_finish(ops, e, &r, 1, "res", 3, 60000, &oc),
                             CERB_OK);
            char k[256];
            record_key(&r, k, sizeof k);
            assert_int_equal(etcd_test_delete(etcd_test_port(), k), 1);
        }
    }
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
}

/* ---- a finish that lands late in its done lease's life ---- */

struct late_finish {
    const struct cerb_engine_ops *ops;
    cerb_engine *e;
    cerb_guard_rec *r;
    cerb_status st;
};

static void *late_finish_main(void *arg)
{
    struct late_finish *f = arg;
    cerb_outcome oc;
    f->st = cerb__engine_guard_finish(f->ops, f->e, f->r, 1, "res", 3, 2000, &oc);
    return NULL;
}

/*
 * A done-record is kept keep_ms from when it lands, even when its put is
 * applied late in the life of the shared done lease it names (the server
 * paused with the put in its socket, or the client paused after choosing
 * the lease). keep 2 s: a bucket of 1 s, leases of 3 s. The first finish
 * grants the lease; the second reuses it and is applied 2.2 s later, so the
 * lease alone would end its record about 0.8 s after it landed, and a
 * retry 1.5 s later ran the operation again (CERB_OK instead of
 * CERB_DUPLICATE) before the finish kept the lease alive when it saw it
 * land that late.
 */
static void test_etcd_guard_finish_late_in_its_lease(void **state)
{
    (void)state;
    const struct cerb_engine_ops *ops = NULL;
    struct cerb_config *cfg = NULL;
    cerb_engine *e = open_engine(6000, &ops, &cfg);
    cerb_guard_rec a, b;
    cerb_grant gr;
    void *res = NULL;
    size_t rl = 0;
    cerb_outcome oc;
    rec_make(&a, "late-a", 1);
    rec_make(&b, "late-b", 2);
    a.running_ms = b.running_ms = 10000;
    assert_int_equal(cerb__engine_guard_begin(ops, e, &a, &gr, &res, &rl), CERB_OK);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &b, &gr, &res, &rl), CERB_OK);
    /* a's finish grants the done lease (3 s); b's, within the next half
     * second, names it too, and waits in the paused server's socket. */
    assert_int_equal(cerb__engine_guard_finish(ops, e, &a, 1, "res", 3, 2000, &oc), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_pause(etcd_test_port()), 0);
    struct late_finish f = {ops, e, &b, CERB_EIO};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, late_finish_main, &f), 0);
    cerb_test_let_time_pass(2200);
    assert_int_equal(etcd_test_resume(etcd_test_port()), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(f.st, CERB_OK);
    int64_t landed = cerb_test_now_ms();
    /* Past the lease's own end (t0 + 3 s, and etcd's half-second expiry
     * tick), before b's record is 2 s old. */
    int64_t at = t0 + 3700 > landed ? t0 + 3700 : landed;
    cerb_test_let_time_pass(at - cerb_test_now_ms());
    assert_true(cerb_test_now_ms() < landed + 2000);
    cerb_guard_rec again = b;
    snprintf(again.token, sizeof again.token, "%032x", 3);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &again, &gr, &res, &rl), CERB_DUPLICATE);
    cerb__free(res);
    cerb__engine_close(ops, e);
    cerb__config_free(cfg);
}

int main(void)
{
    snprintf(prefix, sizeof prefix, "getcdp%ld-", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_etcd_guard_lost_begin_retires_lease, teardown),
        cmocka_unit_test_teardown(test_etcd_guard_lost_finish_unknown, teardown),
        cmocka_unit_test_teardown(test_etcd_guard_finish_late_in_its_lease, teardown),
        cmocka_unit_test_teardown(test_etcd_guard_restart_keeps_attempt, teardown),
        cmocka_unit_test_teardown(test_etcd_guard_restart_without_data, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
