/*
 * test_etcd.c — the public lock API on a real etcd (the shared `etcd`
 * fixture): etcd's concurrency.Mutex layout (key, empty value, lease, fence
 * = create revision), exclusion across threads and processes with strictly
 * increasing fencing tokens, try / timed / interruptible semantics with no
 * key left behind, the herd check (each release wakes one waiter), loss
 * when the session lease is revoked behind the client, endpoint rotation
 * past a dead endpoint, and bad input / unreachable endpoints failing with
 * clear errors within the timeouts.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
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
#include <sys/mman.h>
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
    /* The fencing token is the key's create revision. */
    uint64_t f = cerb_lock_fencing_token(l);
    assert_int_equal(FENCE_LOW(f), (uint64_t)kv[0].create_revision);
    /* Reentry is counted locally: same key, same revision. */
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    struct etcd_test_kv kv2[4];
    assert_int_equal(keys_of(name, kv2, 4), 1);
    assert_int_equal(kv2[0].create_revision, kv[0].create_revision);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(keys_of(name, kv, 4), 0);
    /* Next grant: a new key revision, a larger fence. */
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    assert_true(cerb_lock_fencing_token(l) > f);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
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

/* ---- exclusion across threads, each with its own client ---- */

struct mx {
    const char *name;
    int iters;
    atomic_int inside;
    atomic_int overlap, fence_regress, errors, counter;
    pthread_mutex_t mu;
    uint64_t last_fence;
};

static void *mx_main(void *arg)
{
    struct mx *m = arg;
    cerb_client *c = open_client(NULL, NULL);
    cerb_lock *l = mk(c, m->name);
    for (int i = 0; i < m->iters; i++) {
        if (cerb_lock_lock(l) != CERB_OK) {
            atomic_fetch_add(&m->errors, 1);
            continue;
        }
        if (atomic_fetch_add(&m->inside, 1) != 0)
            atomic_fetch_add(&m->overlap, 1);
        uint64_t f = cerb_lock_fencing_token(l);
        pthread_mutex_lock(&m->mu);
        if (f <= m->last_fence)
            atomic_fetch_add(&m->fence_regress, 1);
        m->last_fence = f;
        pthread_mutex_unlock(&m->mu);
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
    struct mx m = {.name = name, .iters = 25, .mu = PTHREAD_MUTEX_INITIALIZER};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, mx_main, &m);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&m.errors), 0);
    assert_int_equal(atomic_load(&m.overlap), 0);
    assert_int_equal(atomic_load(&m.fence_regress), 0);
    assert_int_equal(atomic_load(&m.counter), 100);
    struct etcd_test_kv kv[2];
    assert_int_equal(keys_of(name, kv, 2), 0);
    free(name);
}

/* Threads of one client share its session: the local queue serialises
 * them, and they exclude each other too. */
struct same {
    cerb_lock *l;
    atomic_int *inside, *overlap, *errors;
};

static void *same_main(void *arg)
{
    struct same *s = arg;
    for (int i = 0; i < 20; i++) {
        if (cerb_lock_lock(s->l) != CERB_OK) {
            atomic_fetch_add(s->errors, 1);
            continue;
        }
        if (atomic_fetch_add(s->inside, 1) != 0)
            atomic_fetch_add(s->overlap, 1);
        atomic_fetch_sub(s->inside, 1);
        cerb_lock_unlock(s->l);
    }
    return NULL;
}

static void test_exclusion_one_client(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    char *name = test_name("one");
    cerb_lock *l = mk(c, name);
    atomic_int inside = 0, overlap = 0, errors = 0;
    struct same s = {l, &inside, &overlap, &errors};
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, same_main, &s);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&errors), 0);
    assert_int_equal(atomic_load(&overlap), 0);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- exclusion across processes ---- */

struct shared {
    atomic_int inside;
    atomic_int overlap;
    atomic_int fence_regress;
    atomic_ullong last_fence;
    long counter; /* plain read-modify-write under the lock */
};

struct proc_arg {
    const char *name;
    struct shared *sh;
    int iters;
};

static int proc_main(void *ud)
{
    struct proc_arg *a = ud;
    cerb_client *c = NULL;
    char *cfg = etcd_test_config(NULL, NULL);
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        return 10;
    free(cfg);
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, a->name, NULL, &l) != CERB_OK)
        return 11;
    for (int i = 0; i < a->iters; i++) {
        if (cerb_lock_lock(l) != CERB_OK)
            return 12;
        if (atomic_fetch_add(&a->sh->inside, 1) != 0)
            atomic_fetch_add(&a->sh->overlap, 1);
        uint64_t f = cerb_lock_fencing_token(l);
        if (f <= atomic_load(&a->sh->last_fence))
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

static void test_exclusion_processes(void **state)
{
    (void)state;
    char *name = test_name("procs");
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                             -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    struct proc_arg a = {name, sh, 20};
    pid_t pids[4];
    for (int i = 0; i < 4; i++)
        pids[i] = cerb_test_fork(proc_main, &a);
    for (int i = 0; i < 4; i++)
        assert_int_equal(cerb_test_wait(pids[i], 120000), 0);
    assert_int_equal(sh->counter, 80); /* no lost update */
    assert_int_equal(atomic_load(&sh->overlap), 0);
    assert_int_equal(atomic_load(&sh->fence_regress), 0);
    munmap(sh, sizeof *sh);
    free(name);
}

/* ---- try / timed / interruptible ---- */

struct other {
    cerb_lock *l;
    int mode; /* 0 trylock, 1 trylock_for, 2 interruptibly, 3 unlock */
    int64_t wait_ms;
    cerb_status st;
    atomic_bool done;
};

static void *other_main(void *arg)
{
    struct other *o = arg;
    switch (o->mode) {
    case 0: o->st = cerb_lock_trylock(o->l); break;
    case 1: o->st = cerb_lock_trylock_for(o->l, o->wait_ms); break;
    case 2: o->st = cerb_lock_lock_interruptibly(o->l); break;
    default: o->st = cerb_lock_unlock(o->l); break;
    }
    if (o->st == CERB_OK && o->mode != 3)
        cerb_lock_unlock(o->l);
    atomic_store(&o->done, true);
    return NULL;
}

static bool other_done(void *ud) { return atomic_load(&((struct other *)ud)->done); }

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

static void test_semantics(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(NULL, NULL), *c2 = open_client(NULL, NULL);
    char *name = test_name("sem");
    cerb_lock *a = mk(c1, name), *b = mk(c2, name);
    struct etcd_test_kv kv[4];
    pthread_t t;

    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    /* trylock: busy, and no key of b's left on the server. */
    assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    assert_int_equal(keys_of(name, kv, 4), 1);
    /* trylock_for: times out on time, and leaves its queued key behind
     * nowhere. */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(b, 300), CERB_TIMEOUT);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took >= 290 && took < 2000);
    assert_int_equal(keys_of(name, kv, 4), 1);
    assert_int_equal(cerb_lock_unlock(b), CERB_NOT_OWNER);
    /* Interruptible wait: queued on the server, back at once on interrupt
     * (cancel() wakes the watch), key removed. */
    struct other oi = {.l = b, .mode = 2};
    pthread_create(&t, NULL, other_main, &oi);
    struct queued q2 = {name, 2};
    assert_wait_until(n_keys, &q2, 3000);
    t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_interrupt(b), CERB_OK);
    int64_t intr_took = cerb_test_now_ms() - t0;
    assert_true(intr_took < 100); /* interrupt never waits for the network */
    assert_wait_until(other_done, &oi, 2000);
    pthread_join(t, NULL);
    assert_int_equal(oi.st, CERB_INTERRUPTED);
    assert_true(cerb_test_now_ms() - t0 < 1000);
    struct queued q1 = {name, 1};
    assert_wait_until(n_keys, &q1, 2000);
    /* A waiter gets it once released, with a larger fence. */
    struct other ow = {.l = b, .mode = 1, .wait_ms = 5000};
    pthread_create(&t, NULL, other_main, &ow);
    assert_wait_until(n_keys, &q2, 3000);
    uint64_t fa = cerb_lock_fencing_token(a);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_wait_until(other_done, &ow, 3000);
    pthread_join(t, NULL);
    assert_int_equal(ow.st, CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_true(cerb_lock_fencing_token(b) > fa);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    assert_int_equal(keys_of(name, kv, 4), 0);
    cerb_lock_free(a);
    cerb_lock_free(b);
    free(name);
    cerb_client_close(c1);
    cerb_client_close(c2);
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
    struct other ow = {.l = l, .mode = 1, .wait_ms = 10000};
    pthread_t t;
    pthread_create(&t, NULL, other_main, &ow);
    struct queued q2 = {name, 2};
    assert_wait_until(n_keys, &q2, 3000);
    assert_false(other_done(&ow));
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_delete(etcd_test_port(), key), 1);
    assert_wait_until(other_done, &ow, 3000);
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

/* Renewal past the lease: the session keeps holds alive without a round
 * trip per lock. */
static void test_hold_past_lease(void **state)
{
    (void)state;
    cerb_client *c1 = open_client("session_ttl_s = 2;", "lock = { lease_ms = 600; };");
    cerb_client *c2 = open_client(NULL, NULL);
    char *name = test_name("long");
    cerb_lock *a = mk(c1, name), *b = mk(c2, name);
    atomic_store(&lost_calls, 0);
    cerb_lock_on_lost(a, on_lost, NULL);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    int64_t end = cerb_test_now_ms() + 3000; /* past the TTL */
    while (cerb_test_now_ms() < end)
        assert_int_equal(cerb_lock_trylock_for(b, 100), CERB_TIMEOUT);
    assert_int_equal(cerb_lock_state(a), CERB_LOCK_VALID);
    assert_int_equal(atomic_load(&lost_calls), 0);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    cerb_lock_unlock(b);
    cerb_lock_free(a);
    cerb_lock_free(b);
    free(name);
    cerb_client_close(c1);
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
    assert_int_equal(cerb_lock_new(c, "", NULL, &l), CERB_EINVAL);
    assert_int_equal(cerb_lock_new(c, "ok-name.with:chars", NULL, &l), CERB_OK);
    cerb_lock_free(l);
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
        cmocka_unit_test(test_exclusion_threads),
        cmocka_unit_test(test_exclusion_one_client),
        cmocka_unit_test(test_exclusion_processes),
        cmocka_unit_test(test_semantics),
        cmocka_unit_test(test_foreign_holder),
        cmocka_unit_test(test_herd),
        cmocka_unit_test(test_lost_when_lease_revoked),
        cmocka_unit_test(test_hold_past_lease),
        cmocka_unit_test(test_close_revokes),
        cmocka_unit_test(test_rotation_past_dead_endpoint),
        cmocka_unit_test(test_bad_names),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_silent_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
