/*
 * test_etcd.c — what only the etcd engine has, on a real etcd (the shared
 * `etcd` fixture): etcd's concurrency.Mutex layout (key, lease, fence =
 * create revision + the engine's fence offset) and the key prefix, a foreign key queued ahead
 * of us, the herd check (each release wakes one waiter, FIFO), loss when
 * the session lease is revoked behind the client, a close that revokes the
 * session, endpoint rotation past a dead endpoint, names with '/', and
 * unreachable or silent endpoints failing with clear errors within the
 * timeouts. The engine-independent contract (exclusion, try / timed /
 * interruptible waits with no key left behind, fences, holds past the lease
 * and the session TTL) is in conformance.c, run as conformance_etcd.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "etcd_util.h"
#include "test_util.h"

#define FENCE_LOW(f) ((f) & ((UINT64_C(1) << 48) - 1))

static cerb_client *open_client(const char *etcd_extra, const char *extra)
{
    char *cfg = etcd_test_config(etcd_extra, extra);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(c, name, NULL, &l);
    if (st != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

static int keys_of(const char *name, struct etcd_test_kv *kv, int max)
{
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/", name);
    return etcd_test_keys(etcd_test_port(), prefix, kv, max);
}

/* ---- layout ---- */

static void test_mutex_layout(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("layout");
    cerb_lock *l = mk(c, name);
    struct etcd_test_kv kv[4];

    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(keys_of(name, kv, 4), 1);
    /* <name>/<lease id in lowercase hex>, attached to that lease. */
    char want[600];
    snprintf(want, sizeof want, "%s/%llx", name, (unsigned long long)kv[0].lease);
    assert_string_equal(kv[0].key, want);
    assert_true(kv[0].lease > 0);
    assert_int_equal(etcd_test_key_lease(kv[0].key), kv[0].lease);
    /* The fencing token is the key's create revision plus the engine's
     * fence offset (0 unless a client's switch raised it on this server). */
    uint64_t f = cerb_lock_fencing_token(l);
    assert_int_equal(FENCE_LOW(f), (uint64_t)(kv[0].create_revision +
                                              etcd_test_fence_offset(etcd_test_port(), "")));
    /* Reentry is counted locally: same key, same revision. */
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    struct etcd_test_kv kv2[4];
    assert_int_equal(keys_of(name, kv2, 4), 1);
    assert_int_equal(kv2[0].create_revision, kv[0].create_revision);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(keys_of(name, kv, 4), 0);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

static void test_prefix(void **state)
{
    (void)state;
    cerb_client *c = open_client("prefix = \"cerb-test/\";", NULL);
    char *name = test_name("pfx");
    cerb_lock *l = mk(c, name);
    struct etcd_test_kv kv[2];
    char p[512];

    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    snprintf(p, sizeof p, "cerb-test/%s/", name);
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 2), 1);
    assert_int_equal(keys_of(name, kv, 2), 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 2), 0);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- a foreign holder ---- */

/* A thread waiting up to wait_ms for the lock (released again at once). */
struct waiter {
    cerb_lock *l;
    int64_t wait_ms;
    cerb_status st;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_lock_trylock_for(w->l, w->wait_ms);
    if (w->st == CERB_OK)
        cerb_lock_unlock(w->l);
    atomic_store(&w->done, true);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

struct queued {
    const char *name;
    int n;
};
static bool n_keys(void *ud)
{
    struct queued *q = ud;
    struct etcd_test_kv kv[8];
    return keys_of(q->name, kv, 8) == q->n;
}

/* A key queued ahead of everyone by a foreign client (no lease) holds the
 * lock until it is deleted; trylock never queues behind it. */
static void test_foreign_holder(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("foreign");
    char key[600];
    snprintf(key, sizeof key, "%s/deadbeef", name);
    assert_int_equal(etcd_test_put(etcd_test_port(), key, 0), 0);
    cerb_lock *l = mk(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    struct waiter ow = {.l = l, .wait_ms = 10000};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &ow);
    struct queued q2 = {name, 2};
    assert_wait_until(n_keys, &q2, 3000);
    assert_false(waiter_done(&ow));
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_delete(etcd_test_port(), key), 1);
    assert_wait_until(waiter_done, &ow, 3000);
    pthread_join(t, NULL);
    assert_int_equal(ow.st, CERB_OK);
    /* Woken by the watch, not by a timer. */
    assert_true(cerb_test_now_ms() - t0 < 1000);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- herd: each release wakes one waiter ---- */

#define HERD_N 6

struct herd_w {
    cerb_client *c;
    cerb_lock *l;
    atomic_int *order;
    int got;
};

static void *herd_main(void *arg)
{
    struct herd_w *w = arg;
    if (cerb_lock_lock(w->l) == CERB_OK) {
        w->got = atomic_fetch_add(w->order, 1) + 1;
        cerb_lock_unlock(w->l);
    }
    return NULL;
}

static void test_herd(void **state)
{
    (void)state;
    char *name = test_name("herd");
    cerb_client *holder = open_client(NULL, NULL);
    cerb_lock *hl = mk(holder, name);
    struct herd_w w[HERD_N];
    pthread_t t[HERD_N];
    atomic_int order = 0;
    struct cerb_engine_info before[HERD_N], after[HERD_N];

    assert_int_equal(cerb_lock_lock(hl), CERB_OK);
    for (int i = 0; i < HERD_N; i++) {
        w[i].c = open_client(NULL, NULL);
        w[i].l = mk(w[i].c, name);
        w[i].order = &order;
        w[i].got = 0;
        assert_int_equal(cerb_engine_info(w[i].c, "etcd", &before[i]), CERB_OK);
        pthread_create(&t[i], NULL, herd_main, &w[i]);
        /* Queue them one by one, so the order is known. */
        struct queued q = {name, i + 2};
        assert_wait_until(n_keys, &q, 3000);
    }
    assert_int_equal(cerb_lock_unlock(hl), CERB_OK);
    for (int i = 0; i < HERD_N; i++)
        pthread_join(t[i], NULL);
    uint64_t wakeups = 0, calls = 0;
    for (int i = 0; i < HERD_N; i++) {
        /* FIFO: waiters get it in the order they queued. */
        assert_int_equal(w[i].got, i + 1);
        assert_int_equal(cerb_engine_info(w[i].c, "etcd", &after[i]), CERB_OK);
        wakeups += after[i].wakeups - before[i].wakeups;
        calls += after[i].acquire_calls - before[i].acquire_calls;
    }
    /* One acquire txn per acquisition, and at most one wake-up: no herd
     * (a waiter that was not watching yet when its turn came needs none). */
    assert_int_equal(calls, HERD_N);
    assert_true(wakeups <= HERD_N);
    for (int i = 0; i < HERD_N; i++) {
        cerb_lock_free(w[i].l);
        cerb_client_close(w[i].c);
    }
    cerb_lock_free(hl);
    cerb_client_close(holder);
    free(name);
}

/* ---- session loss ---- */

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_seen(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_lost_when_lease_revoked(void **state)
{
    (void)state;
    cerb_client *c = open_client("session_ttl_s = 3;", NULL);
    cerb_client *c2 = open_client(NULL, NULL);
    char *name = test_name("revoked");
    cerb_lock *a = mk(c, name), *b = mk(c2, name);
    struct etcd_test_kv kv[2];

    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(keys_of(name, kv, 2), 1);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_revoke(etcd_test_port(), kv[0].lease), 0);
    /* The next keepalive (every TTL/3 = 1 s) finds the lease gone. */
    assert_wait_until(lost_seen, NULL, 3000);
    assert_true(cerb_test_now_ms() - t0 < 2500);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);
    /* Someone else can have it now. */
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_int_equal(cerb_lock_unlock(a), CERB_LOST);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    /* The client carries on with a new session. */
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(keys_of(name, kv, 2), 1);
    assert_true(kv[0].lease > 0);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(atomic_load(&lost_calls), 1);
    cerb_lock_free(a);
    cerb_lock_free(b);
    free(name);
    cerb_client_close(c);
    cerb_client_close(c2);
}

/* Closing a client revokes its session: its keys vanish at once. */
static void test_close_revokes(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("close");
    cerb_lock *l = mk(c, name);
    struct etcd_test_kv kv[2];
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_int_equal(keys_of(name, kv, 2), 1);
    int64_t lease = kv[0].lease;
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", (long long)lease);
    long st;
    json_t *r = etcd_test_post(etcd_test_port(), "/v3/lease/timetolive", body, NULL, &st);
    assert_non_null(r);
    const json_t *ttl = json_object_get(r, "TTL");
    /* -1 (as a string) for a lease that does not exist. */
    assert_true(json_is_string(ttl) && strcmp(json_string_value(ttl), "-1") == 0);
    json_decref(r);
    free(name);
}

/* ---- endpoints ---- */

static void test_rotation_past_dead_endpoint(void **state)
{
    (void)state;
    /* Port 9 on loopback: nothing listens (connection refused). */
    int ports[3] = {9, etcd_test_port(), 9};
    char *cfg = etcd_test_config_ports(ports, 3, NULL, NULL);
    cerb_client *c = NULL;
    for (int i = 0; i < 4; i++) { /* the start endpoint is random */
        assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
        char *name = test_name("rot");
        cerb_lock *l = mk(c, name);
        assert_int_equal(cerb_lock_lock(l), CERB_OK);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        cerb_lock_free(l);
        free(name);
        cerb_client_close(c);
    }
    free(cfg);
}

/* ---- bad input and unreachable servers ---- */

static void test_bad_names(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, "a/b", NULL, &l), CERB_EINVAL);
    assert_null(l);
    assert_non_null(strstr(cerb_last_error(), "'/'"));
    /* The limits every engine shares, and names that are fine everywhere
     * (such as "ok-name.with:chars"), are checked in conformance.c. */
    cerb_client_close(c);
}

static void test_unreachable(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    /* Refused everywhere: fails within the timeouts, naming an endpoint. */
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_client_open_string(
        &c, "engines = (\"etcd\"); etcd = { endpoints = (\"http://127.0.0.1:9\", "
            "\"http://localhost:9/\"); connect_timeout_ms = 200; op_timeout_ms = 300; };");
    assert_int_not_equal(st, CERB_OK);
    assert_null(c);
    assert_true(cerb_test_now_ms() - t0 < 1500);
    assert_non_null(strstr(cerb_last_error(), ":9"));
    /* An HTTP server that is not the gateway (etcd's peer port answers
     * 404 on /v3/...): a protocol error, not a hang. */
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "engines = (\"etcd\"); etcd = { endpoints = (\"http://127.0.0.1:%d\"); "
             "connect_timeout_ms = 200; op_timeout_ms = 300; };",
             etcd_test_port() + 1);
    t0 = cerb_test_now_ms();
    st = cerb_client_open_string(&c, cfg);
    assert_int_not_equal(st, CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 1500);
    assert_non_null(strstr(cerb_last_error(), "404"));
}

/* A listening socket that never answers: the request times out within
 * op_timeout_ms, with a message that says so. */
static void test_silent_server(void **state)
{
    (void)state;
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s >= 0);
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(s, 8), 0);
    assert_int_equal(getsockname(s, (struct sockaddr *)&sa, &len), 0);
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "engines = (\"etcd\"); etcd = { endpoints = (\"http://127.0.0.1:%d\"); "
             "connect_timeout_ms = 200; op_timeout_ms = 300; };",
             ntohs(sa.sin_port));
    cerb_client *c = NULL;
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_client_open_string(&c, cfg);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_not_equal(st, CERB_OK);
    assert_true(took >= 250 && took < 2000);
    assert_non_null(strstr(cerb_last_error(), "within"));
    close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutex_layout),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_foreign_holder),
        cmocka_unit_test(test_herd),
        cmocka_unit_test(test_lost_when_lease_revoked),
        cmocka_unit_test(test_close_revokes),
        cmocka_unit_test(test_rotation_past_dead_endpoint),
        cmocka_unit_test(test_bad_names),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_silent_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
