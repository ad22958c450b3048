/*
 * test_redis_engine.c — the "redis" engine table on a real redis-server,
 * driven through the core's checking shims (cerb__engine_*), below the lock
 * API: grants and fences, busy and not-owner answers, the fair hand-off
 * waking exactly one waiter, the non-fair wake, timeouts and interrupts that
 * leave no queue entry, a waiter handed the lock while it times out passing
 * it on, an ambiguous acquire settled by check_owner, the redis-py key
 * layout, batched renewal, the probe, round trips per uncontended cycle, an
 * unreachable or silent server, AUTH/ACL/SELECT, NOSCRIPT after SCRIPT
 * FLUSH, and connections the server closed while idle.
 *
 * Servers. Most tests use the suite's shared server ($CERB_REDIS_PORT) with
 * unique lock names. Tests that stall the whole server (a long Lua script to
 * force an ordering, SCRIPT FLUSH) run on a private redis-server this suite
 * starts on 127.0.0.1:26390 with a password, and stops by PID; when that
 * port is taken they are skipped.
 *
 * Waiters are threads, each with its own engine instance (as separate
 * processes would be). Nothing sleeps to synchronise: the test waits for
 * server-side state (queue length) or a waiter's progress with a deadline.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
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
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "redis_conn.h"
#include "redis_stats.h"
#include "test_util.h"

#define PRIV_PORT 26390
#define PRIV_PASS "cerb-secret"

static const struct cerb_engine_ops *ops;
static pid_t priv_pid = -1; /* the private server, or -1 */

/* ------------------------------------------------------------ helpers */

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

/* Events the engine reported (env->event), for the data-loss test. */
static atomic_int events_lost, events_other;

static void on_event(void *ud, cerb_engine_event ev, const char *name, const char *token)
{
    (void)ud;
    /* A loss of data concerns every hold of the instance: no name, no token. */
    if (ev == CERB_EV_LOST && !name && !token)
        atomic_fetch_add(&events_lost, 1);
    else
        atomic_fetch_add(&events_other, 1);
}

static cerb_status eng_open_port(struct eng *g, int port, const char *redis_extra)
{
    char text[1024];
    snprintf(text, sizeof text,
             "engines = (\"redis\");\nredis = { host = \"127.0.0.1\"; port = %d; %s };\n", port,
             redis_extra ? redis_extra : "");
    memset(g, 0, sizeof *g);
    cerb_status st = cerb__config_from_string(text, &g->cfg);
    if (st != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    cerb_engine_env env = {.cfg = g->cfg, .event = on_event, .ud = NULL};
    st = cerb__engine_open(ops, &env, &g->e);
    if (st != CERB_OK) {
        cerb__config_free(g->cfg);
        g->cfg = NULL;
    }
    return st;
}

static void eng_open(struct eng *g, const char *redis_extra)
{
    cerb_status st = eng_open_port(g, cerb_test_redis_port(), redis_extra);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
}

static void eng_open_priv(struct eng *g, const char *redis_extra)
{
    char extra[512];
    snprintf(extra, sizeof extra, "password = \"%s\"; %s", PRIV_PASS,
             redis_extra ? redis_extra : "");
    cerb_status st = eng_open_port(g, PRIV_PORT, extra);
    if (st != CERB_OK)
        fail_msg("open private: %s: %s", cerb_status_name(st), cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
    memset(g, 0, sizeof *g);
}

static struct cerb_redis_stats stats(const struct eng *g)
{
    struct cerb_redis_stats s;
    cerb__redis_stats(g->e, &s);
    return s;
}

/* A hold as the core would make it: fresh random token, zeroed priv. */
static void lk_init(cerb_engine_lock *lk, const char *name, int64_t lease_ms, int fair)
{
    unsigned char b[16];
    int fd = open("/dev/urandom", O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(read(fd, b, sizeof b), (ssize_t)sizeof b);
    close(fd);
    memset(lk, 0, sizeof *lk);
    for (int i = 0; i < 16; i++)
        snprintf(lk->token + 2 * i, 3, "%02x", b[i]);
    lk->name = name;
    lk->lease_ms = lease_ms;
    lk->fair = fair;
    lk->priv = ops->lock_priv_size ? calloc(1, ops->lock_priv_size) : NULL;
}

static void lk_free(cerb_engine_lock *lk)
{
    free(lk->priv);
    lk->priv = NULL;
}

static cerb_status acq(struct eng *g, cerb_engine_lock *lk, int64_t wait_ms, cerb_grant *gr)
{
    static const atomic_int never = 0;
    cerb_grant tmp;
    return cerb__engine_acquire(ops, g->e, lk, wait_ms == 0 ? 0 : cerb__deadline_in(wait_ms),
                                &never, gr ? gr : &tmp);
}

static void must_acquire(struct eng *g, cerb_engine_lock *lk, cerb_grant *gr)
{
    cerb_status st = acq(g, lk, 0, gr);
    if (st != CERB_OK)
        fail_msg("acquire %s: %s: %s", lk->name, cerb_status_name(st), cerb_last_error());
}

/* ---- raw server access (hiredis, no engine) ---- */

static redisContext *raw_port(int port, const char *password)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", port, tv);
    assert_non_null(r);
    if (r->err)
        fail_msg("raw connect %d: %s", port, r->errstr);
    redisSetTimeout(r, tv);
    if (password) {
        redisReply *a = redisCommand(r, "AUTH %s", password);
        assert_non_null(a);
        freeReplyObject(a);
    }
    return r;
}

static redisContext *raw(void) { return raw_port(cerb_test_redis_port(), NULL); }

static char *raw_str(redisContext *r, const char *fmt, const char *key)
{
    redisReply *rep = redisCommand(r, fmt, key);
    assert_non_null(rep);
    char *v = rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS
                  ? strdup(rep->str)
                  : NULL;
    freeReplyObject(rep);
    return v;
}

static long long raw_int(redisContext *r, const char *fmt, const char *key)
{
    redisReply *rep = redisCommand(r, fmt, key);
    assert_non_null(rep);
    long long v = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -999;
    freeReplyObject(rep);
    return v;
}

/* The names of a lock's side keys ({K}\x1fq ...), K = name (no prefix). */
static void side_key(char *buf, size_t len, const char *name, const char *suffix)
{
    snprintf(buf, len, "{%s}\x1f%s", name, suffix);
}

/* A waiter's wake list. */
static void wake_key(char *buf, size_t len, const char *name, const char *token)
{
    snprintf(buf, len, "{%s}\x1fw:%s", name, token);
}

static void assert_no_queue(redisContext *r, const char *name, const char *token)
{
    char q[512], d[512], w[512];
    side_key(q, sizeof q, name, "q");
    side_key(d, sizeof d, name, "d");
    wake_key(w, sizeof w, name, token);
    assert_int_equal(raw_int(r, "EXISTS %s", q), 0);
    assert_int_equal(raw_int(r, "EXISTS %s", d), 0);
    assert_int_equal(raw_int(r, "EXISTS %s", w), 0);
}

struct qlen_pred {
    int port;
    const char *password;
    char key[512];
    long long want;
};

static bool qlen_is(void *ud)
{
    struct qlen_pred *p = ud;
    redisContext *r = raw_port(p->port, p->password);
    long long n = raw_int(r, "LLEN %s", p->key);
    redisFree(r);
    return n == p->want;
}

static void wait_queue(int port, const char *password, const char *name, long long n)
{
    struct qlen_pred p = {.port = port, .password = password, .want = n};
    side_key(p.key, sizeof p.key, name, "q");
    assert_wait_until(qlen_is, &p, 5000);
}

/* ---- waiter threads ---- */

struct waiter {
    struct eng g;            /* its own engine instance */
    cerb_engine_lock lk;
    int64_t wait_ms;         /* < 0: forever */
    atomic_int intr;
    atomic_int done;         /* acquire returned */
    atomic_int may_release;  /* main lets it release */
    atomic_int released;
    bool hold_then_release;
    cerb_status st;
    cerb_grant gr;
    int64_t elapsed_ms;
    int order;               /* rank among grants, from 0 */
    pthread_t th;
};

static atomic_int grant_rank;

static bool flag_set(void *ud) { return atomic_load((atomic_int *)ud) != 0; }

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    int64_t t0 = cerb_test_now_ms();
    int64_t dl = w->wait_ms < 0 ? CERB_DEADLINE_NEVER : cerb__deadline_in(w->wait_ms);
    w->st = cerb__engine_acquire(ops, w->g.e, &w->lk, dl, &w->intr, &w->gr);
    w->elapsed_ms = cerb_test_now_ms() - t0;
    if (w->st == CERB_OK)
        w->order = atomic_fetch_add(&grant_rank, 1);
    atomic_store(&w->done, 1);
    if (w->st == CERB_OK && w->hold_then_release) {
        if (wait_until(flag_set, &w->may_release, 20000))
            cerb__engine_release(ops, w->g.e, &w->lk);
        atomic_store(&w->released, 1);
    }
    return NULL;
}

static void waiter_start(struct waiter *w, int port_priv, const char *name, int64_t lease,
                         int fair, int64_t wait_ms, bool hold)
{
    memset(w, 0, sizeof *w);
    if (port_priv)
        eng_open_priv(&w->g, "op_timeout_ms = 3000;");
    else
        eng_open(&w->g, NULL);
    lk_init(&w->lk, name, lease, fair);
    w->wait_ms = wait_ms;
    w->hold_then_release = hold;
    assert_int_equal(pthread_create(&w->th, NULL, waiter_main, w), 0);
}

static void waiter_join(struct waiter *w)
{
    atomic_store(&w->may_release, 1);
    pthread_join(w->th, NULL);
    eng_close(&w->g);
    lk_free(&w->lk);
}

/* ------------------------------------------------------------- tests */

static void test_acquire_release(void **state)
{
    struct eng g;
    cerb_engine_lock lk;
    cerb_grant gr;
    char *name = test_name("eng-basic");
    redisContext *r = raw();

    eng_open(&g, NULL);
    lk_init(&lk, name, 5000, 1);
    int64_t before = cerb_monotime();
    must_acquire(&g, &lk, &gr);
    assert_true(gr.fence > 0);
    assert_int_equal(gr.ttl_ms, 5000);
    assert_true(gr.sent_ns >= before && gr.sent_ns <= cerb_monotime());
    assert_int_equal(gr.outcome, CERB_OUTCOME_YES);

    /* redis-py layout: K is a plain string holding exactly the token. */
    char *type = raw_str(r, "TYPE %s", name);
    assert_string_equal(type, "string");
    free(type);
    char *v = raw_str(r, "GET %s", name);
    assert_string_equal(v, lk.token);
    assert_int_equal(strlen(v), 32);
    free(v);
    long long pttl = raw_int(r, "PTTL %s", name);
    assert_true(pttl > 0 && pttl <= 5000);

    /* check_owner agrees and reports the same fence. */
    cerb_grant chk;
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &chk), CERB_OK);
    assert_int_equal(chk.fence, gr.fence);

    /* Renew is idempotent and extends. */
    lk.lease_ms = 60000;
    cerb_grant rg;
    assert_int_equal(cerb__engine_renew(ops, g.e, &lk, &rg), CERB_OK);
    assert_int_equal(rg.ttl_ms, 60000);
    assert_int_equal(rg.fence, gr.fence);
    assert_true(raw_int(r, "PTTL %s", name) > 30000);

    /* A retried acquire with the same token is idempotent (no new fence). */
    cerb_grant again;
    must_acquire(&g, &lk, &again);
    assert_int_equal(again.fence, gr.fence);

    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    assert_int_equal(raw_int(r, "EXISTS %s", name), 0);
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &chk), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_renew(ops, g.e, &lk, &rg), CERB_NOT_OWNER);
    assert_no_queue(r, name, lk.token);

    lk_free(&lk);
    eng_close(&g);
    redisFree(r);
    free(name);
}

/*
 * check_owner reports what the server promises: the key's PTTL (not the
 * lease asked for) from a send time taken before the request, so a hold
 * settled after an ambiguous acquire gets the deadline the server keeps
 * (a hand-off key has only PX 2000).
 */
static void test_check_owner_reports_pttl(void **state)
{
    struct eng g;
    cerb_engine_lock lk;
    cerb_grant chk;
    char *name = test_name("eng-checkttl");
    redisContext *r = raw();

    eng_open(&g, NULL);
    lk_init(&lk, name, 30000, 1);
    must_acquire(&g, &lk, NULL);
    assert_int_equal(raw_int(r, "PEXPIRE %s 1500", name), 1);
    int64_t before = cerb_monotime();
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &chk), CERB_OK);
    int64_t after = cerb_monotime();
    long long left = raw_int(r, "PTTL %s", name);
    assert_true(chk.ttl_ms > 0);
    assert_true(chk.ttl_ms <= 1500);
    assert_true(chk.ttl_ms >= left); /* read before our PTTL, not after */
    assert_true(chk.sent_ns >= before && chk.sent_ns <= after);
    assert_true(chk.fence > 0);

    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    lk_free(&lk);
    eng_close(&g);
    redisFree(r);
    free(name);
}

/* Uncontended acquire + release: exactly two round trips, one script each. */
static void test_two_round_trips(void **state)
{
    struct eng g;
    char *name = test_name("eng-rtt");

    eng_open(&g, NULL);
    for (int i = 0; i < 5; i++) {
        cerb_engine_lock lk;
        lk_init(&lk, name, 5000, i % 2);
        struct cerb_redis_stats a = stats(&g);
        must_acquire(&g, &lk, NULL);
        assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
        struct cerb_redis_stats b = stats(&g);
        assert_int_equal(b.round_trips - a.round_trips, 2);
        assert_int_equal(b.acquire_calls - a.acquire_calls, 1);
        assert_int_equal(b.connects - a.connects, 0);
        lk_free(&lk);
    }
    eng_close(&g);
    free(name);
}

static void test_busy_and_not_owner(void **state)
{
    struct eng a, b;
    cerb_engine_lock la, lb;
    cerb_grant gr;
    char *name = test_name("eng-busy");
    redisContext *r = raw();

    eng_open(&a, NULL);
    eng_open(&b, NULL);
    lk_init(&la, name, 10000, 1);
    lk_init(&lb, name, 10000, 1);
    must_acquire(&a, &la, NULL);

    assert_int_equal(acq(&b, &lb, 0, &gr), CERB_BUSY);
    assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
    assert_non_null(strstr(cerb_last_error(), name));

    /* Not the owner: release and renew are refused, the key is untouched. */
    assert_int_equal(cerb__engine_release(ops, b.e, &lb), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_renew(ops, b.e, &lb, &gr), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_check_owner(ops, b.e, &lb, &gr), CERB_NOT_OWNER);
    char *v = raw_str(r, "GET %s", name);
    assert_string_equal(v, la.token);
    free(v);

    /* A short wait times out on time and leaves nothing behind. */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(acq(&b, &lb, 300, &gr), CERB_TIMEOUT);
    int64_t took = cerb_test_now_ms() - t0;
    assert_true(took >= 290);
    assert_true(took < 300 + 250);
    assert_int_equal(gr.outcome, CERB_OUTCOME_NO);
    assert_no_queue(r, name, lb.token);

    assert_int_equal(cerb__engine_release(ops, a.e, &la), CERB_OK);
    lk_free(&la);
    lk_free(&lb);
    eng_close(&a);
    eng_close(&b);
    redisFree(r);
    free(name);
}

static void test_fences_increase(void **state)
{
    struct eng a, b;
    char *name = test_name("eng-fence");
    uint64_t last = 0;

    eng_open(&a, NULL);
    eng_open(&b, NULL);
    for (int i = 0; i < 20; i++) {
        struct eng *g = i % 2 ? &a : &b;
        cerb_engine_lock lk;
        cerb_grant gr;
        lk_init(&lk, name, 5000, i % 3 != 0);
        must_acquire(g, &lk, &gr);
        assert_true(gr.fence > last);
        last = gr.fence;
        assert_int_equal(cerb__engine_release(ops, g->e, &lk), CERB_OK);
        lk_free(&lk);
    }
    eng_close(&a);
    eng_close(&b);
    free(name);
}

/*
 * Issue 13, item 1: with the default configuration the pool opens as many
 * connections as threads call at once (the old fixed pool of 4 made the
 * fifth caller wait: 8 threads got half the server's speed), and closes
 * the ones a burst opened once they idle past redis.pool_idle_ms.
 */
static int pool_open(cerb_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->pool.size; i++)
        n += e->pool.slots[i].ctx != NULL;
    return n;
}

static bool pool_shrunk(void *ud)
{
    cerb_engine *e = ud;
    struct redis_conn *c;
    if (cerb__redis_get(e, cerb__deadline_in(1000), &c) != CERB_OK)
        return false;
    cerb__redis_put(e, c); /* a put closes the coldest idle connection */
    return pool_open(e) <= 1;
}

static void test_pool_grows_and_shrinks(void **state)
{
    enum { N = 12 };
    struct eng g;
    struct redis_conn *c[N];

    eng_open(&g, "pool_idle_ms = 100;");
    assert_true(g.cfg->redis.pool_max >= 64);
    for (int i = 0; i < N; i++) {
        cerb_status st = cerb__redis_get(g.e, cerb__deadline_in(200), &c[i]);
        if (st != CERB_OK)
            fail_msg("connection %d of %d at once: %s (%s)", i + 1, N, cerb_status_name(st),
                     cerb_last_error());
    }
    assert_int_equal(pool_open(g.e), N);
    for (int i = 0; i < N; i++)
        cerb__redis_put(g.e, c[i]);
    assert_wait_until(pool_shrunk, g.e, 5000);
    print_message("%d connections at once; %llu closed after idling\n", N,
                  (unsigned long long)g.e->pool.closed_idle);
    assert_true(g.e->pool.closed_idle >= N - 1);
    eng_close(&g);
}

/* The old key is refused with the new one named, not silently ignored. */
static void test_pool_key_retired(void **state)
{
    struct cerb_config *cfg = NULL;
    assert_int_not_equal(cerb__config_from_string("engines = (\"redis\");\n"
                                                  "redis = { pool = 4; };\n",
                                                  &cfg),
                         CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "redis.pool_max"));
}

/*
 * §5a.3 across a client's own switches: the core asks, in fence_floor, for
 * a grant above the client's highest fence on another engine. The grant
 * must exceed it — uncontended, and handed over to a queued waiter — and
 * every later grant of the name, by a client that asked nothing, must rank
 * above it (the floor is raised on the server, not added by the client).
 */
static void test_fence_floor(void **state)
{
    struct eng a, b, h;
    char *name = test_name("eng-floor");
    cerb_engine_lock lk;
    cerb_grant gr;

    eng_open(&a, NULL);
    eng_open(&b, NULL);
    lk_init(&lk, name, 5000, 1);
    must_acquire(&a, &lk, &gr);
    assert_int_equal(cerb__engine_release(ops, a.e, &lk), CERB_OK);
    lk_free(&lk);

    uint64_t floor = gr.fence + UINT64_C(1000000000000);
    lk_init(&lk, name, 5000, 1);
    lk.fence_floor = floor;
    must_acquire(&a, &lk, &gr);
    print_message("floor %llu: granted %llu\n", (unsigned long long)floor,
                  (unsigned long long)gr.fence);
    assert_true(gr.fence > floor);
    cerb_grant chk;
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &lk, &chk), CERB_OK);
    assert_int_equal(chk.fence, gr.fence);
    assert_int_equal(cerb__engine_release(ops, a.e, &lk), CERB_OK);
    lk_free(&lk);
    uint64_t last = gr.fence;

    lk_init(&lk, name, 5000, 1); /* another client, no floor; its release hands over */
    must_acquire(&b, &lk, &gr);
    assert_true(gr.fence > last);
    last = gr.fence;

    /* Queued with a floor, handed the lock by the holder's release. */
    struct waiter w;
    memset(&w, 0, sizeof w);
    eng_open(&w.g, NULL);
    lk_init(&w.lk, name, 7000, 1);
    w.lk.fence_floor = last + UINT64_C(1000000000000);
    w.wait_ms = 20000;
    w.hold_then_release = true;
    assert_int_equal(pthread_create(&w.th, NULL, waiter_main, &w), 0);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);
    assert_int_equal(cerb__engine_release(ops, b.e, &lk), CERB_OK);
    lk_free(&lk);
    assert_wait_until(flag_set, &w.done, 5000);
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.gr.fence > w.lk.fence_floor);
    last = w.gr.fence;
    waiter_join(&w);

    eng_open(&h, NULL);
    lk_init(&lk, name, 5000, 1);
    must_acquire(&h, &lk, &gr);
    assert_true(gr.fence > last);
    assert_int_equal(cerb__engine_release(ops, h.e, &lk), CERB_OK);
    lk_free(&lk);
    eng_close(&h);
    eng_close(&a);
    eng_close(&b);
    free(name);
}

/*
 * Fair hand-off: three waiters (own engines) queue in a known order behind a
 * holder; each release hands the lock to exactly the head, which wakes once
 * holding it. Grants follow queue order with increasing fences.
 */
static void test_fair_handoff_wakes_one(void **state)
{
    enum { N = 3 };
    struct eng h;
    cerb_engine_lock lh;
    cerb_grant gh;
    struct waiter w[N];
    char *name = test_name("eng-fair");
    redisContext *r = raw();

    atomic_store(&grant_rank, 0);
    eng_open(&h, NULL);
    lk_init(&lh, name, 10000, 1);
    must_acquire(&h, &lh, &gh);
    for (int i = 0; i < N; i++) {
        waiter_start(&w[i], 0, name, 7000, 1, 20000, true);
        wait_queue(cerb_test_redis_port(), NULL, name, i + 1);
    }
    struct cerb_redis_stats hs0 = stats(&h);
    assert_int_equal(cerb__engine_release(ops, h.e, &lh), CERB_OK);
    assert_int_equal(stats(&h).handoffs_sent - hs0.handoffs_sent, 1);

    uint64_t last = gh.fence;
    for (int k = 0; k < N; k++) {
        assert_wait_until(flag_set, &w[k].done, 5000);
        assert_int_equal(w[k].st, CERB_OK);
        assert_int_equal(w[k].order, k);
        assert_true(w[k].gr.fence > last);
        last = w[k].gr.fence;
        /* Handed over with the short lease; the holder's core extends it. */
        assert_int_equal(w[k].gr.ttl_ms, 2000);
        char *v = raw_str(r, "GET %s", name);
        assert_string_equal(v, w[k].lk.token);
        free(v);
        assert_true(raw_int(r, "PTTL %s", name) <= 2000);
        /* Exactly one waiter woke: the later ones are still blocked and
         * have popped nothing. */
        for (int j = k + 1; j < N; j++) {
            assert_int_equal(atomic_load(&w[j].done), 0);
            assert_int_equal(stats(&w[j].g).wakeups, 0);
        }
        struct cerb_redis_stats s = stats(&w[k].g);
        assert_int_equal(s.wakeups, 1);
        assert_int_equal(s.handoffs_received, 1);
        /* One acquire run to queue; any others were timer re-checks. */
        assert_int_equal(s.acquire_calls - s.acquire_polls, 1);
        atomic_store(&w[k].may_release, 1);
        assert_wait_until(flag_set, &w[k].released, 5000);
    }
    for (int i = 0; i < N; i++) {
        assert_no_queue(r, name, w[i].lk.token);
        waiter_join(&w[i]);
    }
    assert_int_equal(raw_int(r, "EXISTS %s", name), 0);
    lk_free(&lh);
    eng_close(&h);
    redisFree(r);
    free(name);
}

/* Non-fair: the release frees the key and tells only the head to try. */
static void test_nonfair_wake(void **state)
{
    struct eng h;
    cerb_engine_lock lh;
    struct waiter w[2];
    char *name = test_name("eng-nonfair");
    redisContext *r = raw();

    atomic_store(&grant_rank, 0);
    eng_open(&h, NULL);
    lk_init(&lh, name, 10000, 0);
    must_acquire(&h, &lh, NULL);
    for (int i = 0; i < 2; i++) {
        waiter_start(&w[i], 0, name, 5000, 0, 20000, true);
        wait_queue(cerb_test_redis_port(), NULL, name, i + 1);
    }
    struct cerb_redis_stats hs0 = stats(&h);
    assert_int_equal(cerb__engine_release(ops, h.e, &lh), CERB_OK);
    struct cerb_redis_stats hs1 = stats(&h);
    assert_int_equal(hs1.wakes_sent - hs0.wakes_sent, 1);
    assert_int_equal(hs1.handoffs_sent - hs0.handoffs_sent, 0);

    assert_wait_until(flag_set, &w[0].done, 5000);
    assert_int_equal(w[0].st, CERB_OK);
    assert_int_equal(w[0].gr.ttl_ms, 5000); /* took it itself: full lease */
    assert_int_equal(atomic_load(&w[1].done), 0);
    assert_int_equal(stats(&w[0].g).wakeups, 1);
    assert_int_equal(stats(&w[0].g).handoffs_received, 0);
    assert_int_equal(stats(&w[1].g).wakeups, 0);

    atomic_store(&w[0].may_release, 1);
    assert_wait_until(flag_set, &w[1].done, 5000);
    assert_int_equal(w[1].st, CERB_OK);
    assert_true(w[1].gr.fence > w[0].gr.fence);
    atomic_store(&w[1].may_release, 1);
    assert_wait_until(flag_set, &w[1].released, 5000);
    for (int i = 0; i < 2; i++) {
        assert_no_queue(r, name, w[i].lk.token);
        waiter_join(&w[i]);
    }
    lk_free(&lh);
    eng_close(&h);
    redisFree(r);
    free(name);
}

/* A waiter that times out leaves the queue; the others keep their place. */
static void test_timeout_leaves_no_entry(void **state)
{
    struct eng h;
    cerb_engine_lock lh;
    struct waiter stay, leave;
    char *name = test_name("eng-timeout");
    redisContext *r = raw();
    char q[512];

    side_key(q, sizeof q, name, "q");
    eng_open(&h, NULL);
    lk_init(&lh, name, 10000, 1);
    must_acquire(&h, &lh, NULL);
    waiter_start(&stay, 0, name, 5000, 1, 20000, false);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);
    waiter_start(&leave, 0, name, 5000, 1, 400, false);
    assert_wait_until(flag_set, &leave.done, 5000);
    assert_int_equal(leave.st, CERB_TIMEOUT);
    assert_int_equal(leave.gr.outcome, CERB_OUTCOME_NO);
    assert_true(leave.elapsed_ms >= 390 && leave.elapsed_ms < 400 + 250);
    assert_int_equal(stats(&leave.g).leaves, 1);
    char w[512];
    wake_key(w, sizeof w, name, leave.lk.token);
    assert_int_equal(raw_int(r, "EXISTS %s", w), 0);
    assert_int_equal(raw_int(r, "LLEN %s", q), 1);
    char *head = raw_str(r, "LINDEX %s 0", q);
    assert_string_equal(head, stay.lk.token);
    free(head);

    /* The one that stayed gets the lock by hand-off. */
    assert_int_equal(cerb__engine_release(ops, h.e, &lh), CERB_OK);
    assert_wait_until(flag_set, &stay.done, 5000);
    assert_int_equal(stay.st, CERB_OK);
    assert_int_equal(cerb__engine_release(ops, stay.g.e, &stay.lk), CERB_OK);
    assert_no_queue(r, name, stay.lk.token);
    waiter_join(&stay);
    waiter_join(&leave);
    lk_free(&lh);
    eng_close(&h);
    redisFree(r);
    free(name);
}

/* The interrupt flag alone ends a wait within the engine's slice. */
static void test_interrupt_flag(void **state)
{
    struct eng h;
    cerb_engine_lock lh;
    struct waiter w;
    char *name = test_name("eng-intr");
    redisContext *r = raw();

    eng_open(&h, NULL);
    lk_init(&lh, name, 10000, 1);
    must_acquire(&h, &lh, NULL);
    waiter_start(&w, 0, name, 5000, 1, -1, false);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);
    int64_t t0 = cerb_test_now_ms();
    atomic_store(&w.intr, 1);
    assert_wait_until(flag_set, &w.done, 5000);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(w.st, CERB_INTERRUPTED);
    assert_int_equal(w.gr.outcome, CERB_OUTCOME_NO);
    assert_true(took < 200 + 150); /* contract: the flag is seen every 200 ms */
    assert_no_queue(r, name, w.lk.token);
    char *v = raw_str(r, "GET %s", name);
    assert_string_equal(v, lh.token);
    free(v);

    assert_int_equal(cerb__engine_release(ops, h.e, &lh), CERB_OK);
    waiter_join(&w);
    lk_free(&lh);
    eng_close(&h);
    redisFree(r);
    free(name);
}

static bool cancelled_once(void *ud) { return stats(ud).cancel_wakeups > 0; }

/*
 * cancel() wakes a blocked waiter at once, without a round trip: alone it is
 * only a wake-up (the waiter goes on waiting, still queued); with the flag
 * set the wait ends INTERRUPTED.
 */
static void test_interrupt_cancel(void **state)
{
    struct eng h;
    cerb_engine_lock lh;
    struct waiter w;
    char *name = test_name("eng-cancel");
    redisContext *r = raw();

    eng_open(&h, NULL);
    lk_init(&lh, name, 10000, 1);
    must_acquire(&h, &lh, NULL);
    waiter_start(&w, 0, name, 5000, 1, -1, true);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);

    /* The waiter registers its socket just before it blocks: cancel until
     * one lands (a call is a no-op while it is not blocked). */
    for (int i = 0; i < 200 && !cancelled_once(&w.g); i++) {
        cerb__engine_cancel(ops, w.g.e, &w.lk);
        wait_until(cancelled_once, &w.g, 50);
    }
    assert_true(stats(&w.g).cancel_wakeups >= 1);
    assert_int_equal(atomic_load(&w.done), 0);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);

    /* Flag + cancel: returns well before the 100 ms flag slice would. */
    int64_t t0 = cerb_test_now_ms();
    atomic_store(&w.intr, 1);
    cerb__engine_cancel(ops, w.g.e, &w.lk);
    assert_wait_until(flag_set, &w.done, 5000);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(w.st, CERB_INTERRUPTED);
    assert_true(took < 100);
    assert_no_queue(r, name, w.lk.token);

    /* cancel() on a hold that is not waiting is a harmless no-op. */
    cerb__engine_cancel(ops, h.e, &lh);
    assert_int_equal(cerb__engine_release(ops, h.e, &lh), CERB_OK);
    waiter_join(&w);
    lk_free(&lh);
    eng_close(&h);
    redisFree(r);
    free(name);
}

/*
 * redis-py compatibility: a foreign holder (SET NX PX, no fence, no
 * notification) makes us BUSY, and a waiter notices its silent DEL by its
 * head re-check; a key without TTL is held until deleted.
 */
static void test_redispy_layout(void **state)
{
    struct eng g;
    cerb_engine_lock lk;
    cerb_grant gr;
    char *name = test_name("eng-redispy");
    redisContext *r = raw();

    eng_open(&g, NULL);
    lk_init(&lk, name, 5000, 1);
    redisReply *rep = redisCommand(r, "SET %s %s NX PX 10000", name,
                                   "0123456789abcdef0123456789abcdef");
    assert_non_null(rep);
    freeReplyObject(rep);
    assert_int_equal(acq(&g, &lk, 0, &gr), CERB_BUSY);
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gr), CERB_NOT_OWNER);

    struct waiter w;
    waiter_start(&w, 0, name, 5000, 1, 10000, false);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(raw_int(r, "DEL %s", name), 1); /* redis-py release */
    assert_wait_until(flag_set, &w.done, 5000);
    assert_int_equal(w.st, CERB_OK);
    /* Seen by the head's re-check (200 ms, plus the server's 100 ms tick). */
    assert_true(cerb_test_now_ms() - t0 < 200 + 100 + 300);
    assert_int_equal(cerb__engine_release(ops, w.g.e, &w.lk), CERB_OK);
    assert_no_queue(r, name, w.lk.token);
    waiter_join(&w);

    /* A key without TTL (redis-py timeout=None). */
    rep = redisCommand(r, "SET %s %s", name, "fedcba9876543210fedcba9876543210");
    freeReplyObject(rep);
    assert_int_equal(acq(&g, &lk, 0, &gr), CERB_BUSY);
    assert_int_equal(raw_int(r, "DEL %s", name), 1);
    must_acquire(&g, &lk, &gr);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);

    lk_free(&lk);
    eng_close(&g);
    redisFree(r);
    free(name);
}

/*
 * Lock names that spell another lock's helper keys in the old layout
 * ("{x}:fence", "{x}:q", "{x}:d", "{x}:w:<token>") are locks of their own:
 * each works while "x" is used, in both orders, and neither disturbs the
 * other's fences or queue.
 */
static void test_names_like_helper_keys(void **state)
{
    enum { NH = 4 };
    struct eng g;
    cerb_engine_lock lx, lh[NH];
    cerb_grant gx, g2;
    char hn[NH][512];
    char *name = test_name("eng-helpername");
    redisContext *r = raw();

    eng_open(&g, NULL);
    lk_init(&lx, name, 10000, 1);
    snprintf(hn[0], sizeof hn[0], "{%s}:fence", name);
    snprintf(hn[1], sizeof hn[1], "{%s}:q", name);
    snprintf(hn[2], sizeof hn[2], "{%s}:d", name);
    snprintf(hn[3], sizeof hn[3], "{%s}:w:%s", name, lx.token);

    /* "x" first (it leaves its fence counter), then the others. */
    must_acquire(&g, &lx, &gx);
    for (int i = 0; i < NH; i++) {
        lk_init(&lh[i], hn[i], 10000, 1);
        cerb_status st = acq(&g, &lh[i], 0, NULL);
        if (st != CERB_OK)
            fail_msg("lock \"%s\" while \"%s\" is held: %s: %s", hn[i], name,
                     cerb_status_name(st), cerb_last_error());
    }
    assert_int_equal(cerb__engine_release(ops, g.e, &lx), CERB_OK);

    /* The others held, "x" again: granted, a newer fence; a waiter on "x"
     * is handed it by the fair release. */
    must_acquire(&g, &lx, &g2);
    assert_true(g2.fence > gx.fence);
    struct waiter w;
    waiter_start(&w, 0, name, 5000, 1, 10000, false);
    wait_queue(cerb_test_redis_port(), NULL, name, 1);
    assert_int_equal(cerb__engine_release(ops, g.e, &lx), CERB_OK);
    assert_wait_until(flag_set, &w.done, 5000);
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.gr.fence > g2.fence);
    assert_int_equal(cerb__engine_release(ops, w.g.e, &w.lk), CERB_OK);
    waiter_join(&w);

    for (int i = 0; i < NH; i++) {
        char *v = raw_str(r, "GET %s", hn[i]);
        assert_non_null(v);
        assert_string_equal(v, lh[i].token);
        free(v);
        cerb_grant chk;
        assert_int_equal(cerb__engine_check_owner(ops, g.e, &lh[i], &chk), CERB_OK);
        assert_int_equal(cerb__engine_release(ops, g.e, &lh[i]), CERB_OK);
        lk_free(&lh[i]);
    }
    lk_free(&lx);
    eng_close(&g);
    redisFree(r);
    free(name);
}

/*
 * A script that fails after it may have written (here WRONGTYPE: someone
 * put a list at the lock's key) is an UNKNOWN outcome, for the core to
 * re-check, never "nothing happened".
 */
static void test_script_error_is_unknown(void **state)
{
    struct eng g;
    cerb_engine_lock lk;
    cerb_grant gr;
    char *name = test_name("eng-wrongtype");
    redisContext *r = raw();

    eng_open(&g, NULL);
    lk_init(&lk, name, 5000, 1);
    assert_int_equal(raw_int(r, "RPUSH %s x", name), 1);
    cerb_status st = acq(&g, &lk, 0, &gr);
    assert_int_not_equal(st, CERB_OK);
    assert_int_not_equal(st, CERB_BUSY);
    if (!strstr(cerb_last_error(), "WRONGTYPE"))
        fail_msg("unexpected error: %s", cerb_last_error());
    assert_int_equal(gr.outcome, CERB_OUTCOME_UNKNOWN);
    assert_int_equal(raw_int(r, "DEL %s", name), 1);
    lk_free(&lk);
    eng_close(&g);
    redisFree(r);
    free(name);
}

static void test_renew_batch(void **state)
{
    enum { N = 1500 }; /* more than one pipeline (1 024, redis_scripts.c) */
    struct eng g;
    char *name = test_name("eng-batch");
    cerb_engine_lock *lk = calloc(N, sizeof *lk);
    cerb_renew_item *it = calloc(N, sizeof *it);
    char (*names)[300] = calloc(N, sizeof *names);
    redisContext *r = raw();

    assert_non_null(lk);
    assert_non_null(it);
    assert_non_null(names);
    eng_open(&g, NULL);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "%s-%d", name, i);
        lk_init(&lk[i], names[i], 3000, 1);
        must_acquire(&g, &lk[i], NULL);
        lk[i].lease_ms = 60000;
        it[i].lk = &lk[i];
    }
    /* One of them is lost behind our back. */
    assert_int_equal(raw_int(r, "DEL %s", names[7]), 1);

    struct cerb_redis_stats a = stats(&g);
    int64_t before = cerb_monotime();
    cerb__engine_renew_batch(ops, g.e, it, N);
    struct cerb_redis_stats b = stats(&g);
    assert_int_equal(b.round_trips - a.round_trips, (N + 1023) / 1024);
    for (int i = 0; i < N; i++) {
        if (i == 7) {
            assert_int_equal(it[i].st, CERB_NOT_OWNER);
            continue;
        }
        assert_int_equal(it[i].st, CERB_OK);
        assert_int_equal(it[i].grant.ttl_ms, 60000);
        assert_true(it[i].grant.sent_ns >= before);
        assert_true(it[i].grant.fence > 0);
    }
    assert_true(raw_int(r, "PTTL %s", names[0]) > 30000);
    assert_true(raw_int(r, "PTTL %s", names[N - 1]) > 30000);
    for (int i = 0; i < N; i++) {
        cerb_status st = cerb__engine_release(ops, g.e, &lk[i]);
        assert_int_equal(st, i == 7 ? CERB_NOT_OWNER : CERB_OK);
        char f[400];
        side_key(f, sizeof f, names[i], "fence");
        raw_int(r, "DEL %s", f);
        lk_free(&lk[i]);
    }
    eng_close(&g);
    redisFree(r);
    free(lk);
    free(it);
    free(names);
    free(name);
}

/* Every probe key lives only briefly. */
static void test_probe(void **state)
{
    struct eng g;
    redisContext *r = raw();

    eng_open(&g, NULL);
    for (int i = 0; i < 5; i++)
        assert_int_equal(cerb__engine_probe(ops, g.e, 200), CERB_OK);
    redisReply *rep = redisCommand(r, "KEYS %s", "*__cerberus_probe__*");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < rep->elements; i++) {
        long long pttl = raw_int(r, "PTTL %s", rep->element[i]->str);
        assert_true(pttl > 0 || pttl == -2);
    }
    freeReplyObject(rep);
    eng_close(&g);
    redisFree(r);
}

/* A port nobody listens on (bound, then closed). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(s >= 0);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &len), 0);
    close(s);
    return ntohs(a.sin_port);
}

static void test_unreachable(void **state)
{
    struct eng g;
    char where[64];
    int port = free_port();

    int64_t t0 = cerb_test_now_ms();
    cerb_status st = eng_open_port(&g, port, "connect_timeout_ms = 300;");
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(st, CERB_EIO);
    assert_null(g.e);
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    assert_non_null(strstr(cerb_last_error(), where));
    assert_true(took < 300 + 200);
}

/*
 * A server that accepts no connection (a listening socket whose backlog is
 * full): open() gives up after the connect timeout, not later.
 */
static void test_connect_timeout(void **state)
{
    struct eng g;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int fill[8];
    int nfill = 0;

    assert_true(s >= 0);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s, 0), 0);
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &len), 0);
    /* Fill the accept queue: with backlog 0 Linux queues one connection
     * and then drops further SYNs, so later connects hang. */
    for (int i = 0; i < 8; i++) {
        fill[nfill] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(fill[nfill], (struct sockaddr *)&a, sizeof a);
        nfill++;
    }
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = eng_open_port(&g, ntohs(a.sin_port), "connect_timeout_ms = 250;");
    int64_t took = cerb_test_now_ms() - t0;
    for (int i = 0; i < nfill; i++)
        close(fill[i]);
    close(s);
    if (st == CERB_OK) {
        eng_close(&g);
        fail_msg("open succeeded against a server that accepts nothing");
    }
    assert_int_equal(st, CERB_EIO);
    if (!strstr(cerb_last_error(), "connect timed out after 250 ms"))
        fail_msg("unexpected error: %s", cerb_last_error());
    assert_true(took >= 240 && took < 250 + 250);
}

/* ---- tests on the private server ---- */

static bool priv_up(void *ud)
{
    struct timeval tv = {0, 200000};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", PRIV_PORT, tv);
    bool ok = false;
    if (r && !r->err) {
        redisSetTimeout(r, tv);
        redisReply *a = redisCommand(r, "AUTH %s", PRIV_PASS);
        redisReply *p = a ? redisCommand(r, "INFO server") : NULL;
        /* Ours, not another suite's on the same port. */
        char want[64];
        snprintf(want, sizeof want, "process_id:%ld\r\n", (long)priv_pid);
        ok = p && p->type == REDIS_REPLY_STRING && strstr(p->str, want);
        freeReplyObject(a);
        freeReplyObject(p);
    }
    redisFree(r);
    return ok;
}

static bool port_taken(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    /* As redis-server does: connections in TIME_WAIT do not count. */
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = bind(s, (struct sockaddr *)&a, sizeof a);
    close(s);
    return rc != 0;
}

/* The marker key of the engine (redis_marker.h), prefix "". */
#define MARKER_KEY "\x1f" "cerberus"

/* A server this suite just started holds nothing: say so, as servers.sh
 * does, or the engine waits one lease before its first grant. */
static void priv_mark_fresh(void)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", PRIV_PORT, tv);
    if (r && !r->err) {
        freeReplyObject(redisCommand(r, "AUTH %s", PRIV_PASS));
        /* With the server's replication id, as servers.sh writes it: a
         * marker without one is quarantined by its first client. */
        char replid[48] = "";
        redisReply *info = redisCommand(r, "INFO replication");
        const char *p = info && info->type == REDIS_REPLY_STRING ? strstr(info->str, "master_replid:")
                                                                   : NULL;
        if (p)
            sscanf(p + 14, "%40[0-9a-f]", replid);
        freeReplyObject(info);
        for (int db = 0; db < 16; db++) { /* the marker is per database */
            freeReplyObject(redisCommand(r, "SELECT %d", db));
            /* A new value each time: engines that knew the last one see
             * it change, as after a real loss. */
            char v[128];
            snprintf(v, sizeof v, "test-%lld 0%s%s", (long long)cerb_test_now_ms(),
                     replid[0] ? " " : "", replid);
            freeReplyObject(redisCommand(r, "SET %s %s", MARKER_KEY, v));
        }
    }
    redisFree(r);
}

static int priv_start(void **state)
{
    char port[16];
    snprintf(port, sizeof port, "%d", PRIV_PORT);
    if (port_taken(PRIV_PORT)) {
        fprintf(stderr, "# port %d taken: private-server tests skipped\n", PRIV_PORT);
        return 0;
    }
    char *argv[] = {"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--requirepass", PRIV_PASS, "--logfile", "/dev/null",
                    "--daemonize", "no", NULL};
    priv_pid = cerb_test_spawn(argv);
    if (priv_pid < 0 || !wait_until(priv_up, NULL, 10000)) {
        fprintf(stderr, "# private redis-server did not start: tests skipped\n");
        if (priv_pid > 0) {
            kill(priv_pid, SIGTERM);
            cerb_test_wait(priv_pid, 5000);
        }
        priv_pid = -1;
        return 0;
    }
    priv_mark_fresh();
    return 0;
}

static int priv_stop(void **state)
{
    if (priv_pid > 0) {
        kill(priv_pid, SIGTERM);
        cerb_test_wait(priv_pid, 10000);
        priv_pid = -1;
    }
    return 0;
}

static void test_auth_acl_select(void **state)
{
    struct eng g;
    cerb_engine_lock lk;

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-auth");
    /* No password, a wrong one: open fails, naming the server. */
    assert_int_equal(eng_open_port(&g, PRIV_PORT, NULL), CERB_EIO);
    assert_non_null(strstr(cerb_last_error(), "NOAUTH"));
    assert_int_equal(eng_open_port(&g, PRIV_PORT, "password = \"nope\";"), CERB_EIO);
    assert_non_null(strstr(cerb_last_error(), "WRONGPASS"));

    /* Password and db 3: the key lands in db 3. */
    eng_open_priv(&g, "db = 3;");
    lk_init(&lk, name, 5000, 1);
    must_acquire(&g, &lk, NULL);
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    assert_int_equal(raw_int(r, "EXISTS %s", name), 0);
    redisReply *rep = redisCommand(r, "SELECT 3");
    freeReplyObject(rep);
    char *v = raw_str(r, "GET %s", name);
    assert_string_equal(v, lk.token);
    free(v);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    lk_free(&lk);
    eng_close(&g);

    /* ACL user: AUTH user pass. */
    rep = redisCommand(r, "ACL SETUSER cerb on >cerbpw ~* &* +@all");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    assert_int_equal(eng_open_port(&g, PRIV_PORT, "user = \"cerb\"; password = \"cerbpw\";"),
                     CERB_OK);
    lk_init(&lk, name, 5000, 1);
    must_acquire(&g, &lk, NULL);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    lk_free(&lk);
    eng_close(&g);
    assert_int_equal(eng_open_port(&g, PRIV_PORT, "user = \"cerb\"; password = \"bad\";"),
                     CERB_EIO);
    redisFree(r);
    free(name);
}

/* SCRIPT FLUSH under a running engine: every path reloads and retries. */
static void test_noscript_reload(void **state)
{
    struct eng g;
    cerb_engine_lock lk;
    cerb_renew_item it;

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-noscript");
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    eng_open_priv(&g, NULL);
    lk_init(&lk, name, 5000, 1);

    freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
    must_acquire(&g, &lk, NULL);
    freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
    it.lk = &lk;
    cerb__engine_renew_batch(ops, g.e, &it, 1);
    assert_int_equal(it.st, CERB_OK);
    freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
    cerb_grant gr;
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gr), CERB_OK);
    freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    freeReplyObject(redisCommand(r, "SCRIPT FLUSH"));
    assert_int_equal(cerb__engine_probe(ops, g.e, 500), CERB_OK);
    assert_true(stats(&g).noscript_reloads >= 5);

    lk_free(&lk);
    eng_close(&g);
    redisFree(r);
    free(name);
}

static bool time_reached(void *ud) { return cerb_test_now_ms() >= *(const int64_t *)ud; }

/*
 * The server closes the engine's idle connections (a restart, its idle
 * `timeout`): the next request notices before sending and reconnects,
 * instead of failing with a false "outcome unknown".
 */
static void test_server_closed_idle_connection(void **state)
{
    struct eng g;
    cerb_engine_lock lk;

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-idleclose");
    eng_open_priv(&g, NULL);
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    redisReply *rep = redisCommand(r, "CLIENT KILL TYPE normal SKIPME yes");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    assert_true(rep->integer >= 1);
    freeReplyObject(rep);
    /* The engine checks connections idle for more than a second. */
    int64_t until = cerb_test_now_ms() + 1100;
    assert_wait_until(time_reached, &until, 5000);

    struct cerb_redis_stats a = stats(&g);
    lk_init(&lk, name, 5000, 1);
    must_acquire(&g, &lk, NULL);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    struct cerb_redis_stats b = stats(&g);
    assert_int_equal(b.connects - a.connects, 1);
    assert_int_equal(b.round_trips - a.round_trips, 3); /* AUTH, acquire, release */

    lk_free(&lk);
    eng_close(&g);
    redisFree(r);
    free(name);
}

/*
 * Run `script` (EVAL) on the private server from another thread: it keeps
 * the server busy, which orders everything sent meanwhile after it.
 */
struct busy {
    char script[2048];
    const char *keys[6];
    int nkeys;
    const char *args[4];
    int nargs;
    long long result;
    atomic_int done;
    pthread_t th;
};

static void *busy_main(void *arg)
{
    struct busy *b = arg;
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    struct timeval tv = {10, 0};
    redisSetTimeout(r, tv);
    const char *argv[16];
    char nk[8];
    int n = 0;
    snprintf(nk, sizeof nk, "%d", b->nkeys);
    argv[n++] = "EVAL";
    argv[n++] = b->script;
    argv[n++] = nk;
    for (int i = 0; i < b->nkeys; i++)
        argv[n++] = b->keys[i];
    for (int i = 0; i < b->nargs; i++)
        argv[n++] = b->args[i];
    redisReply *rep = redisCommandArgv(r, n, argv, NULL);
    b->result = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    freeReplyObject(rep);
    redisFree(r);
    atomic_store(&b->done, 1);
    return NULL;
}

#define LUA_BUSY_WAIT                                                            \
    "local t = redis.call('TIME')\n"                                             \
    "local s = t[1] * 1000 + t[2] / 1000\n"                                      \
    "repeat t = redis.call('TIME') until t[1] * 1000 + t[2] / 1000 - s > tonumber(ARGV[2])\n"

/*
 * The head waiter is handed the lock (by a script that mimics the release
 * script's hand-off) at a moment it cannot see it: the server stays busy
 * past the waiter's deadline. The waiter times out and its leave must pass
 * the lock on to the next waiter instead of keeping it.
 */
static void test_handed_while_timing_out(void **state)
{
    struct waiter first, second;
    struct busy b;
    char f[512], q[512], d[512], w1[512];

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-handtimeout");
    atomic_store(&grant_rank, 0);
    struct eng h;
    cerb_engine_lock lh;
    eng_open_priv(&h, NULL);
    lk_init(&lh, name, 10000, 1);
    must_acquire(&h, &lh, NULL);
    waiter_start(&first, 1, name, 5000, 1, 600, false);
    wait_queue(PRIV_PORT, PRIV_PASS, name, 1);
    waiter_start(&second, 1, name, 5000, 1, 20000, false);
    wait_queue(PRIV_PORT, PRIV_PASS, name, 2);

    side_key(f, sizeof f, name, "fence");
    side_key(q, sizeof q, name, "q");
    side_key(d, sizeof d, name, "d");
    wake_key(w1, sizeof w1, name, first.lk.token);
    memset(&b, 0, sizeof b);
    snprintf(b.script, sizeof b.script,
             "if redis.call('LINDEX', KEYS[3], 0) ~= ARGV[1] then return -1 end\n"
             "redis.call('LPOP', KEYS[3])\n"
             "redis.call('HDEL', KEYS[4], ARGV[1])\n"
             "redis.call('SET', KEYS[1], ARGV[1], 'PX', 3000)\n"
             "local fence = redis.call('INCR', KEYS[2])\n"
             "redis.call('RPUSH', KEYS[5], string.format('f%%d', fence))\n"
             "redis.call('PEXPIRE', KEYS[5], 10000)\n" LUA_BUSY_WAIT "return fence\n");
    b.keys[0] = name, b.keys[1] = f, b.keys[2] = q, b.keys[3] = d, b.keys[4] = w1;
    b.nkeys = 5;
    b.args[0] = first.lk.token, b.args[1] = "1000";
    b.nargs = 2;
    assert_int_equal(pthread_create(&b.th, NULL, busy_main, &b), 0);

    assert_wait_until(flag_set, &first.done, 10000);
    assert_int_equal(first.st, CERB_TIMEOUT);
    assert_int_equal(first.gr.outcome, CERB_OUTCOME_NO);
    pthread_join(b.th, NULL);
    assert_true(b.result > 0); /* the hand-off to `first` did happen */

    /* `first` passed it on: `second` holds it, by hand-off. */
    assert_wait_until(flag_set, &second.done, 10000);
    assert_int_equal(second.st, CERB_OK);
    assert_true(second.gr.fence > (uint64_t)b.result);
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    char *v = raw_str(r, "GET %s", name);
    assert_string_equal(v, second.lk.token);
    free(v);
    assert_int_equal(cerb__engine_release(ops, second.g.e, &second.lk), CERB_OK);
    assert_no_queue(r, name, first.lk.token);
    assert_no_queue(r, name, second.lk.token);
    redisFree(r);
    waiter_join(&first);
    waiter_join(&second);
    lk_free(&lh);
    eng_close(&h);
    free(name);
}

/*
 * A reply that never comes (the server is busy past the operation timeout)
 * is an UNKNOWN outcome; check_owner on a fresh connection then finds that
 * the acquire did land.
 */
static void test_ambiguous_acquire(void **state)
{
    struct eng g;
    cerb_engine_lock lk;
    cerb_grant gr;
    struct busy b;

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-ambig");
    eng_open_priv(&g, "op_timeout_ms = 150;");
    lk_init(&lk, name, 10000, 1);
    /* Warm one pool connection so the acquire goes out at once. */
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &gr), CERB_NOT_OWNER);

    memset(&b, 0, sizeof b);
    snprintf(b.script, sizeof b.script, "%s", LUA_BUSY_WAIT "return 1\n");
    b.args[0] = "x", b.args[1] = "600";
    b.nargs = 2;
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    assert_int_equal(pthread_create(&b.th, NULL, busy_main, &b), 0);
    /* Wait until the server is inside the script: a PING it leaves
     * unanswered for 30 ms (it answers BUSY only after 5 s). */
    for (;;) {
        assert_int_equal(redisAppendCommand(r, "PING"), REDIS_OK);
        int done = 0;
        while (!done)
            assert_int_equal(redisBufferWrite(r, &done), REDIS_OK);
        struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
        if (poll(&pfd, 1, 30) == 0)
            break;
        void *rep;
        assert_int_equal(redisGetReply(r, &rep), REDIS_OK);
        freeReplyObject(rep);
        if (atomic_load(&b.done)) {
            pthread_join(b.th, NULL);
            redisFree(r);
            fail_msg("the busy script ended before the acquire was sent");
        }
    }
    assert_int_equal(acq(&g, &lk, 0, &gr), CERB_EIO);
    assert_int_equal(gr.outcome, CERB_OUTCOME_UNKNOWN);
    pthread_join(b.th, NULL);
    cerb_grant chk;
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &chk), CERB_OK);
    assert_true(chk.fence > 0);
    assert_int_equal(cerb__engine_release(ops, g.e, &lk), CERB_OK);
    redisFree(r);
    lk_free(&lk);
    eng_close(&g);
    free(name);
}

/* ---- a waiter in another process, stopped and continued (item 5) ---- */

struct proc_waiter {
    const char *name;
    int fd;           /* write end of the result pipe */
};

/* What the child reports: its status, fence, and whether the key held its
 * token right after acquire returned. */
struct proc_result {
    int st;
    uint64_t fence;
    int owned;
};

static int proc_waiter_main(void *ud)
{
    struct proc_waiter *pw = ud;
    struct eng g;
    cerb_engine_lock lk;
    cerb_grant gr;
    struct proc_result res = {.st = -1};
    static const atomic_int never = 0;

    if (eng_open_port(&g, PRIV_PORT, "password = \"" PRIV_PASS "\"; op_timeout_ms = 3000;") !=
        CERB_OK)
        return 2;
    lk_init(&lk, pw->name, 5000, 1);
    res.st = cerb__engine_acquire(ops, g.e, &lk, cerb__deadline_in(20000), &never, &gr);
    res.fence = gr.fence;
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", PRIV_PORT, tv);
    if (r && !r->err) {
        freeReplyObject(redisCommand(r, "AUTH %s", PRIV_PASS));
        redisReply *v = redisCommand(r, "GET %s", pw->name);
        res.owned = v && v->type == REDIS_REPLY_STRING && strcmp(v->str, lk.token) == 0;
        freeReplyObject(v);
    }
    redisFree(r);
    if (res.st == CERB_OK)
        cerb__engine_release(ops, g.e, &lk);
    if (write(pw->fd, &res, sizeof res) != (ssize_t)sizeof res)
        return 3;
    lk_free(&lk);
    eng_close(&g);
    return 0;
}

static bool fd_readable(void *ud)
{
    struct pollfd pfd = {.fd = *(int *)ud, .events = POLLIN};
    return poll(&pfd, 1, 0) == 1;
}

static bool no_blocked_client(void *ud)
{
    (void)ud;
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    char *info = raw_str(r, "INFO %s", "clients");
    bool none = info && strstr(info, "blocked_clients:0\r\n");
    free(info);
    redisFree(r);
    return none;
}

struct key_gone {
    const char *key;
};

static bool key_gone(void *ud)
{
    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    long long n = raw_int(r, "EXISTS %s", ((struct key_gone *)ud)->key);
    redisFree(r);
    return n == 0;
}

/*
 * A stale hand-off message. The head waiter (another process) is stopped
 * while it is between two waits; the lock is handed to it (as the release
 * script does: K = its token PX 2000, "f<fence>" on its wake list); the
 * short lease runs out and X takes the lock. When the waiter continues, its
 * re-check finds X holding and queues it again; it must not then read the
 * old message as a grant: it keeps waiting, and gets the lock, with a fence
 * above X's, only when X lets go.
 */
static void test_stale_handoff_message(void **state)
{
    struct eng h, x;
    cerb_engine_lock lh, lx;
    cerb_grant gx;
    char f[512], q[512], d[512], w[512];
    struct proc_result res;
    int fds[2];

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-stalehand");
    eng_open_priv(&h, NULL);
    eng_open_priv(&x, NULL);
    lk_init(&lh, name, 10000, 1);
    lk_init(&lx, name, 10000, 1);
    must_acquire(&h, &lh, NULL);

    assert_int_equal(pipe(fds), 0);
    struct proc_waiter pw = {.name = name, .fd = fds[1]};
    pid_t pid = cerb_test_fork(proc_waiter_main, &pw);
    assert_true(pid > 0);
    close(fds[1]);
    wait_queue(PRIV_PORT, PRIV_PASS, name, 1);

    /* Stop the waiter; once its BLPOP has timed out on the server nothing
     * of it is blocked there, and a message pushed now stays in its list. */
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_wait_until(no_blocked_client, NULL, 5000);

    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    char *wtok = raw_str(r, "LINDEX %s 0", (side_key(q, sizeof q, name, "q"), q));
    assert_non_null(wtok);
    side_key(f, sizeof f, name, "fence");
    side_key(d, sizeof d, name, "d");
    wake_key(w, sizeof w, name, wtok);
    redisReply *rep = redisCommand(
        r,
        "EVAL %s 5 %s %s %s %s %s %s",
        "redis.call('LPOP', KEYS[3])\n"
        "redis.call('HDEL', KEYS[4], ARGV[1])\n"
        "redis.call('SET', KEYS[1], ARGV[1], 'PX', 2000)\n"
        "local fence = redis.call('INCR', KEYS[2])\n"
        "redis.call('RPUSH', KEYS[5], string.format('f%d', fence))\n"
        "redis.call('PEXPIRE', KEYS[5], 10000)\n"
        "return fence\n",
        name, f, q, d, w, wtok);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long handed = rep->integer;
    freeReplyObject(rep);
    free(wtok);

    /* The short lease runs out; X takes the lock. */
    struct key_gone kg = {.key = name};
    assert_wait_until(key_gone, &kg, 5000);
    must_acquire(&x, &lx, &gx);
    assert_true(gx.fence > (uint64_t)handed);

    /* The waiter goes on: it queues again behind X ... */
    assert_int_equal(kill(pid, SIGCONT), 0);
    wait_queue(PRIV_PORT, PRIV_PASS, name, 1);
    /* ... and must not return while X holds the lock. */
    bool early = wait_until(fd_readable, &fds[0], 1500);
    if (early) {
        assert_int_equal(read(fds[0], &res, sizeof res), (ssize_t)sizeof res);
        fail_msg("the waiter returned %s with fence %llu (owned %d) while X holds fence %llu",
                 cerb_status_name(res.st), (unsigned long long)res.fence, res.owned,
                 (unsigned long long)gx.fence);
    }
    char *v = raw_str(r, "GET %s", name);
    assert_string_equal(v, lx.token);
    free(v);

    /* X lets go: the waiter gets it now, with a newer fence. */
    assert_int_equal(cerb__engine_release(ops, x.e, &lx), CERB_OK);
    assert_wait_until(fd_readable, &fds[0], 5000);
    assert_int_equal(read(fds[0], &res, sizeof res), (ssize_t)sizeof res);
    assert_int_equal(res.st, CERB_OK);
    assert_true(res.owned);
    assert_true(res.fence > gx.fence);
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    close(fds[0]);
    redisFree(r);
    lk_free(&lh);
    lk_free(&lx);
    eng_close(&h);
    eng_close(&x);
    free(name);
}

/*
 * FLUSHALL under an engine that holds a lock (engine level; the public API
 * and a restart are in test_redis_dataloss_fault.c): the next request finds
 * the marker gone, reports CERB_EV_LOST for every hold once, renewals and
 * checks answer NOT_OWNER, and nothing is granted during the quarantine.
 */
static void test_data_loss_event(void **state)
{
    struct eng g;
    cerb_engine_lock lk, l2;
    cerb_grant gr, chk;
    cerb_renew_item it;

    if (priv_pid < 0)
        skip();
    char *name = test_name("eng-dataloss");
    char *other = test_name("eng-dataloss2");
    eng_open_priv(&g, NULL);
    lk_init(&lk, name, 10000, 1);
    lk_init(&l2, other, 10000, 1);
    must_acquire(&g, &lk, &gr);
    atomic_store(&events_lost, 0);
    atomic_store(&events_other, 0);

    redisContext *r = raw_port(PRIV_PORT, PRIV_PASS);
    freeReplyObject(redisCommand(r, "FLUSHALL"));
    it.lk = &lk;
    cerb__engine_renew_batch(ops, g.e, &it, 1);
    assert_int_equal(it.st, CERB_NOT_OWNER);
    assert_int_equal(atomic_load(&events_lost), 1);
    assert_int_equal(stats(&g).data_losses, 1);
    assert_int_equal(cerb__engine_check_owner(ops, g.e, &lk, &chk), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_renew(ops, g.e, &lk, &chk), CERB_NOT_OWNER);

    /* The quarantine: a free name is not granted, and says why. */
    assert_int_equal(acq(&g, &l2, 0, &gr), CERB_BUSY);
    if (!strstr(cerb_last_error(), "lost its data"))
        fail_msg("unexpected refusal: %s", cerb_last_error());
    assert_int_equal(atomic_load(&events_lost), 1); /* once per loss */
    assert_int_equal(atomic_load(&events_other), 0);

    /* The test ends the quarantine by hand (the next tests need grants). */
    priv_mark_fresh();
    must_acquire(&g, &l2, &gr);
    assert_int_equal(atomic_load(&events_lost), 2); /* the marker changed again */
    assert_int_equal(cerb__engine_release(ops, g.e, &l2), CERB_OK);

    redisFree(r);
    lk_free(&lk);
    lk_free(&l2);
    eng_close(&g);
    free(name);
    free(other);
}

static int suite_setup(void **state)
{
    cerb__engines_builtin();
    ops = cerb__engine_find("redis");
    if (!ops) {
        fprintf(stderr, "redis engine not built: %s\n", cerb_last_error());
        return -1;
    }
    signal(SIGPIPE, SIG_DFL); /* the engine must not need SIGPIPE ignored */
    return priv_start(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_release),
        cmocka_unit_test(test_check_owner_reports_pttl),
        cmocka_unit_test(test_two_round_trips),
        cmocka_unit_test(test_busy_and_not_owner),
        cmocka_unit_test(test_fences_increase),
        cmocka_unit_test(test_fence_floor),
        cmocka_unit_test(test_pool_grows_and_shrinks),
        cmocka_unit_test(test_pool_key_retired),
        cmocka_unit_test(test_fair_handoff_wakes_one),
        cmocka_unit_test(test_nonfair_wake),
        cmocka_unit_test(test_timeout_leaves_no_entry),
        cmocka_unit_test(test_interrupt_flag),
        cmocka_unit_test(test_interrupt_cancel),
        cmocka_unit_test(test_redispy_layout),
        cmocka_unit_test(test_names_like_helper_keys),
        cmocka_unit_test(test_script_error_is_unknown),
        cmocka_unit_test(test_renew_batch),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_connect_timeout),
        cmocka_unit_test(test_auth_acl_select),
        cmocka_unit_test(test_noscript_reload),
        cmocka_unit_test(test_server_closed_idle_connection),
        cmocka_unit_test(test_handed_while_timing_out),
        cmocka_unit_test(test_ambiguous_acquire),
        cmocka_unit_test(test_stale_handoff_message),
        cmocka_unit_test(test_data_loss_event),
    };
    return cmocka_run_group_tests(tests, suite_setup, priv_stop);
}
