/*
 * test_redis_semaphore.c — semaphores on a real redis-server through the
 * public API, and what they leave on the wire (docs/semaphore.md, "##
 * redis"): the npm redis-semaphore sorted set "semaphore:<name>" (member =
 * token, or token_0..token_<k-1>; score = server time in ms; PEXPIRE), the
 * stored limit beside it, FIFO among Cerberus waiters (a request for two
 * permits is not passed by a later one for one), a waiter that dies in the
 * queue (a child killed) not blocking the line, a holder that dies freeing
 * its permit after its lease, fences growing, peers' members counting
 * against the limit, nothing left behind after release, inspection, and the
 * quarantine after a loss of data (no grant, then the holds told lost);
 * and, through the engine's table (engine.h), the switch gate's question
 * `fits` (permits of every member, waiting or holding, peers' included,
 * the asking token's own left out, against the limit) and a release by
 * token of a member still waiting (its process dead) removing it, and the
 * hand-off: a release grants the queue's head in its own script (the
 * waiter's entry turned into a hold of the short hand-off lease, its fence
 * above the floor it queued with, "f<fence>" on its wake list), so the
 * waiter holds without running acquire again.
 * The npm package itself is driven by tests/node/semaphore.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <pthread.h>
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
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "redis_stats.h"
#include "test_util.h"

#define FENCE_MASK ((UINT64_C(1) << 48) - 1)
#define SEP "\x1f"

static cerb_client *open_client(const char *redis_extra, const char *extra)
{
    char *cfg = cerb_test_redis_config(redis_extra, extra);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static cerb_semaphore *sem(cerb_client *c, const char *name, int64_t n, int64_t lease_ms)
{
    cerb_semaphore_opts o = CERB_SEMAPHORE_OPTS_INIT;
    o.lease_ms = lease_ms;
    cerb_semaphore *s = NULL;
    if (cerb_semaphore_new(c, name, n, &o, &s) != CERB_OK)
        fail_msg("semaphore_new: %s", cerb_last_error());
    return s;
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

/* The keys of semaphore `name` (no prefix): Z, and {Z}^_sem:<sfx>. */
static char *zkey(const char *name)
{
    size_t n = strlen(name) + 16;
    char *k = malloc(n);
    assert_non_null(k);
    snprintf(k, n, "semaphore:%s", name);
    return k;
}

static char *helper(const char *name, const char *sfx)
{
    size_t n = strlen(name) + strlen(sfx) + 24;
    char *k = malloc(n);
    assert_non_null(k);
    snprintf(k, n, "{semaphore:%s}" SEP "sem:%s", name, sfx);
    return k;
}

static long long raw_int(redisContext *r, const char *fmt, const char *key)
{
    redisReply *rep = redisCommand(r, fmt, key, strlen(key));
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

static long long server_ms(redisContext *r)
{
    redisReply *t = redisCommand(r, "TIME");
    assert_non_null(t);
    long long ms = atoll(t->element[0]->str) * 1000 + atoll(t->element[1]->str) / 1000;
    freeReplyObject(t);
    return ms;
}

/* Inspection of `name`: n entries, holders then waiters. */
static cerb_holder_info *inspect(cerb_client *c, const char *name, size_t *n)
{
    cerb_holder_info *v = NULL;
    cerb_status st = cerb_inspect(c, CERB_KIND_SEMAPHORE, name, "redis", &v, n);
    if (st != CERB_OK)
        fail_msg("inspect: %s: %s", cerb_status_name(st), cerb_last_error());
    return v;
}

struct members {
    cerb_client *c;
    const char *name;
    size_t holders, waiters;
};

static bool members_are(void *ud)
{
    struct members *m = ud;
    size_t n = 0, h = 0, w = 0;
    cerb_holder_info *v = NULL;
    if (cerb_inspect(m->c, CERB_KIND_SEMAPHORE, m->name, "redis", &v, &n) != CERB_OK)
        return false;
    for (size_t i = 0; i < n; i++)
        *(v[i].waiting ? &w : &h) += 1;
    cerb_holders_free(v, n);
    return h == m->holders && w == m->waiters;
}

static void expect_members(cerb_client *c, const char *name, size_t holders, size_t waiters)
{
    struct members m = {c, name, holders, waiters};
    if (!wait_until(members_are, &m, 8000))
        fail_msg("%s: expected %zu holders and %zu waiters", name, holders, waiters);
}

/* The layout: members, scores (server ms), the set's TTL, the stored limit,
 * the fence; inspection; nothing but the fence counter after release. */
static void test_layout_on_the_wire(void **state)
{
    (void)state;
    char *name = test_name("sem-layout");
    cerb_client *c = open_client(NULL, NULL);
    cerb_semaphore *s = sem(c, name, 3, 4000);
    cerb_permit *p1 = NULL, *p2 = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p1), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(s, 2, 0, NULL, &p2), CERB_OK);
    uint64_t f1 = cerb_permit_fencing_token(p1) & FENCE_MASK,
             f2 = cerb_permit_fencing_token(p2) & FENCE_MASK;
    assert_true(f1 > 0 && f2 > f1);

    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    assert_int_equal(n, 2);
    const char *tok1 = NULL, *tok2 = NULL;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(v[i].waiting, 0);
        assert_string_equal(v[i].engine, "redis");
        assert_int_equal(strlen(v[i].owner), 32);
        assert_true(v[i].ttl_ms > 0 && v[i].ttl_ms <= 4000);
        if (strcmp(v[i].detail, "permits 1 of 3") == 0) {
            tok1 = v[i].owner;
            assert_int_equal(v[i].fence, f1);
        } else {
            assert_string_equal(v[i].detail, "permits 2 of 3");
            tok2 = v[i].owner;
            assert_int_equal(v[i].fence, f2);
        }
    }
    assert_non_null(tok1);
    assert_non_null(tok2);

    redisContext *r = raw();
    char *z = zkey(name), *lim = helper(name, "limit"), *h = helper(name, "h"),
         *q = helper(name, "q"), *fk = helper(name, "fence");
    long long now = server_ms(r);
    redisReply *zr = redisCommand(r, "ZRANGE %b 0 -1 WITHSCORES", z, strlen(z));
    assert_non_null(zr);
    assert_int_equal(zr->elements, 6); /* three members: tok1, tok2_0, tok2_1 */
    char want[3][40];
    snprintf(want[0], sizeof want[0], "%s", tok1);
    snprintf(want[1], sizeof want[1], "%s_0", tok2);
    snprintf(want[2], sizeof want[2], "%s_1", tok2);
    for (int w = 0; w < 3; w++) {
        bool found = false;
        for (size_t i = 0; i + 1 < zr->elements; i += 2) {
            if (strcmp(zr->element[i]->str, want[w]) != 0)
                continue;
            found = true;
            long long score = atoll(zr->element[i + 1]->str);
            assert_true(score <= now && score > now - 5000); /* server ms */
        }
        if (!found)
            fail_msg("member %s missing", want[w]);
    }
    freeReplyObject(zr);
    long long pttl = raw_int(r, "PTTL %b", z);
    assert_true(pttl > 3000 && pttl <= 12000);
    redisReply *lr = redisCommand(r, "GET %b", lim, strlen(lim));
    assert_int_equal(lr->type, REDIS_REPLY_STRING);
    assert_string_equal(lr->str, "3");
    freeReplyObject(lr);
    assert_true(raw_int(r, "PTTL %b", lim) > 0);
    redisReply *fr = redisCommand(r, "GET %b", fk, strlen(fk));
    assert_int_equal(fr->type, REDIS_REPLY_STRING);
    assert_int_equal((uint64_t)atoll(fr->str), f2);
    freeReplyObject(fr);
    cerb_holders_free(v, n);

    assert_int_equal(cerb_permit_free(p1), CERB_OK);
    assert_int_equal(cerb_permit_free(p2), CERB_OK);
    /* Nothing left but the fence counter, with its expiry. */
    assert_int_equal(raw_int(r, "EXISTS %b", z), 0);
    assert_int_equal(raw_int(r, "EXISTS %b", lim), 0);
    assert_int_equal(raw_int(r, "EXISTS %b", h), 0);
    assert_int_equal(raw_int(r, "EXISTS %b", q), 0);
    long long fttl = raw_int(r, "PTTL %b", fk);
    assert_true(fttl > 0 && fttl <= 86400000);
    v = inspect(c, name, &n);
    assert_int_equal(n, 0);
    cerb_holders_free(v, n);

    /* The next grant's fence is above every earlier one. */
    assert_int_equal(cerb_semaphore_acquire(s, 3, 0, NULL, &p1), CERB_OK);
    assert_true((cerb_permit_fencing_token(p1) & FENCE_MASK) > f2);
    assert_int_equal(cerb_permit_free(p1), CERB_OK);

    redisFree(r);
    free(z), free(lim), free(h), free(q), free(fk);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(name);
}

static void test_limit_mismatch(void **state)
{
    (void)state;
    char *name = test_name("sem-limit");
    cerb_client *c1 = open_client(NULL, NULL), *c2 = open_client(NULL, NULL);
    cerb_semaphore *a = sem(c1, name, 2, 0), *b = sem(c2, name, 5, 0);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_semaphore_acquire(b, 1, 3000, NULL, &q), CERB_ECONFIG);
    assert_true(cerb_test_now_ms() - t0 < 2000); /* final: no waiting, no retry */
    assert_non_null(strstr(cerb_last_error(), "limit of 2"));
    assert_non_null(strstr(cerb_last_error(), "asks 5"));
    assert_null(q);
    /* Nothing of the refused caller's is left: one holder. */
    size_t n = 0;
    cerb_holder_info *v = inspect(c1, name, &n);
    assert_int_equal(n, 1);
    cerb_holders_free(v, n);
    /* Drained, the name takes the next caller's limit. */
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(b, 5, 0, NULL, &q), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(a, 1, 0, NULL, &p), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "limit of 5"));
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    cerb_semaphore_free(a);
    cerb_semaphore_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

struct taker {
    cerb_semaphore *s;
    unsigned k;
    int64_t wait_ms;
    atomic_int done;
    cerb_permit *p;
    cerb_status st;
    int64_t at_ms;
};

static void *take_main(void *arg)
{
    struct taker *t = arg;
    t->st = cerb_semaphore_acquire(t->s, t->k, t->wait_ms, NULL, &t->p);
    t->at_ms = cerb_test_now_ms();
    atomic_store(&t->done, 1);
    return NULL;
}

static bool taker_done(void *ud) { return atomic_load(&((struct taker *)ud)->done) != 0; }

/* FIFO: a request for two permits waits; a later one for one permit,
 * which would fit, waits behind it; inspection lists both in order. */
static void test_big_request_not_passed(void **state)
{
    (void)state;
    char *name = test_name("sem-fifo");
    cerb_client *c = open_client(NULL, NULL), *c2 = open_client(NULL, NULL),
                *c3 = open_client(NULL, NULL);
    cerb_semaphore *s = sem(c, name, 2, 0), *s2 = sem(c2, name, 2, 0), *s3 = sem(c3, name, 2, 0);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    struct taker big = {.s = s2, .k = 2, .wait_ms = 20000},
                 small = {.s = s3, .k = 1, .wait_ms = 20000};
    pthread_t tb, ts;
    pthread_create(&tb, NULL, take_main, &big);
    expect_members(c, name, 1, 1);
    pthread_create(&ts, NULL, take_main, &small);
    expect_members(c, name, 1, 2);
    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    assert_int_equal(n, 3);
    assert_string_equal(v[1].detail, "permits 2 of 2");
    assert_int_equal(v[1].waiting, 1);
    assert_string_equal(v[2].detail, "permits 1 of 2");
    assert_int_equal(v[2].waiting, 1);
    cerb_holders_free(v, n);
    /* Past several re-checks of both: the small one still waits. */
    cerb_test_let_time_pass(1200);
    assert_int_equal(atomic_load(&small.done), 0);
    assert_int_equal(atomic_load(&big.done), 0);
    uint64_t f0 = cerb_permit_fencing_token(p) & FENCE_MASK;
    int64_t rel = cerb_test_now_ms();
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_true(wait_until(taker_done, &big, 5000));
    assert_int_equal(big.st, CERB_OK);
    /* Woken, not polled: well before the head's 200 ms re-check would
     * have been due on average — bounded generously for a loaded box. */
    assert_true(big.at_ms - rel < 1000);
    assert_true((cerb_permit_fencing_token(big.p) & FENCE_MASK) > f0);
    assert_int_equal(atomic_load(&small.done), 0);
    expect_members(c, name, 1, 1);
    assert_int_equal(cerb_permit_free(big.p), CERB_OK);
    assert_true(wait_until(taker_done, &small, 5000));
    assert_int_equal(small.st, CERB_OK);
    assert_int_equal(cerb_permit_free(small.p), CERB_OK);
    pthread_join(tb, NULL);
    pthread_join(ts, NULL);
    cerb_semaphore_free(s);
    cerb_semaphore_free(s2);
    cerb_semaphore_free(s3);
    cerb_client_close(c);
    cerb_client_close(c2);
    cerb_client_close(c3);
    free(name);
}

/* ---- children ---- */

/* Role "sem": argv = config text, name, limit, count, lease_ms, action
 * ("hold": acquire at once, write 'g' to fd <wfd>, then wait to be killed;
 * "wait": write 'w', then acquire waiting a minute), wfd. */
static int sem_child(int argc, char **argv)
{
    if (argc < 7)
        return 2;
    int wfd = atoi(argv[6]);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, argv[0]) != CERB_OK)
        return 3;
    cerb_semaphore_opts o = CERB_SEMAPHORE_OPTS_INIT;
    o.lease_ms = atoll(argv[4]);
    cerb_semaphore *s = NULL;
    if (cerb_semaphore_new(c, argv[1], atoll(argv[2]), &o, &s) != CERB_OK)
        return 4;
    cerb_permit *p = NULL;
    if (strcmp(argv[5], "hold") == 0) {
        if (cerb_semaphore_acquire(s, (unsigned)atoi(argv[3]), 5000, NULL, &p) != CERB_OK)
            return 5;
        if (write(wfd, "g", 1) != 1)
            return 6;
    } else {
        if (write(wfd, "w", 1) != 1)
            return 6;
        cerb_semaphore_acquire(s, (unsigned)atoi(argv[3]), 60000, NULL, &p);
        if (write(wfd, "g", 1) != 1)
            return 6;
    }
    for (;;)
        pause();
}

/* Start role "sem" with the write end of a pipe; *rd its read end. */
static pid_t spawn_sem(const char *cfg, const char *name, const char *limit, const char *count,
                       const char *lease, const char *action, int *rd)
{
    int fds[2];
    char wfd[16];
    assert_int_equal(pipe(fds), 0);
    snprintf(wfd, sizeof wfd, "%d", fds[1]);
    char *args[] = {(char *)cfg, (char *)name, (char *)limit, (char *)count, (char *)lease,
                    (char *)action, wfd, NULL};
    int keep[] = {fds[1], -1};
    pid_t pid = cerb_test_spawn_self("sem", args, keep);
    close(fds[1]);
    assert_true(pid > 0);
    *rd = fds[0];
    return pid;
}

static void expect_byte(int fd, char want)
{
    char b = 0;
    assert_int_equal(cerb_test_read_within(fd, &b, 1, 10000), 1);
    assert_int_equal(b, want);
}

static void kill_child(pid_t pid)
{
    kill(pid, SIGKILL);
    assert_int_equal(cerb_test_wait(pid, 10000), 128 + SIGKILL);
}

/* A waiter that dies in the queue (its process killed, so it neither
 * leaves nor re-checks) does not block the line: the waiter behind it is
 * granted when the holder releases, once the dead one's alive deadline
 * (REDIS_ALIVE_MS, 1.5 s) has passed. */
static void test_dead_waiter_does_not_block(void **state)
{
    (void)state;
    char *name = test_name("sem-deadwaiter");
    char *cfg = cerb_test_redis_config(NULL, NULL);
    cerb_client *c = open_client(NULL, NULL), *c2 = open_client(NULL, NULL);
    cerb_semaphore *s = sem(c, name, 1, 0), *s2 = sem(c2, name, 1, 0);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    int rd;
    pid_t pid = spawn_sem(cfg, name, "1", "1", "10000", "wait", &rd);
    expect_byte(rd, 'w');
    expect_members(c, name, 1, 1);
    struct taker t = {.s = s2, .k = 1, .wait_ms = 20000};
    pthread_t th;
    pthread_create(&th, NULL, take_main, &t);
    expect_members(c, name, 1, 2);
    kill_child(pid);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_true(wait_until(taker_done, &t, 8000));
    assert_int_equal(t.st, CERB_OK);
    /* The dead entry is gone too. */
    expect_members(c, name, 1, 0);
    assert_int_equal(cerb_permit_free(t.p), CERB_OK);
    pthread_join(th, NULL);
    close(rd);
    cerb_semaphore_free(s);
    cerb_semaphore_free(s2);
    cerb_client_close(c);
    cerb_client_close(c2);
    free(cfg);
    free(name);
}

/* A holder that dies (killed with its permit) frees it when its lease
 * (1.5 s here) runs out on the server's clock, not before. */
static void test_dead_holder_frees_after_lease(void **state)
{
    (void)state;
    char *name = test_name("sem-deadholder");
    char *cfg = cerb_test_redis_config(NULL, NULL);
    cerb_client *c = open_client(NULL, NULL);
    cerb_semaphore *s = sem(c, name, 1, 0);
    int rd;
    pid_t pid = spawn_sem(cfg, name, "1", "1", "1500", "hold", &rd);
    expect_byte(rd, 'g');
    kill_child(pid);
    int64_t t0 = cerb_test_now_ms();
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_BUSY);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 8000, NULL, &p), CERB_OK);
    int64_t waited = cerb_test_now_ms() - t0;
    assert_true(waited < 5000);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    close(rd);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(cfg);
    free(name);
}

/* A peer's member (npm's layout, written raw) counts against our limit;
 * our holders count in ZCARD for the peer; removing it lets our waiter in
 * (after a re-check: peers do not notify). */
static void test_peer_members_count(void **state)
{
    (void)state;
    char *name = test_name("sem-peer");
    cerb_client *c = open_client(NULL, NULL);
    cerb_semaphore *s = sem(c, name, 2, 0);
    redisContext *r = raw();
    char *z = zkey(name);
    long long now = server_ms(r);
    redisReply *a = redisCommand(r, "ZADD %b %lld %s", z, strlen(z), now, "npm-peer-1");
    freeReplyObject(a);
    a = redisCommand(r, "PEXPIRE %b 10000", z, strlen(z));
    freeReplyObject(a);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &q), CERB_BUSY);
    assert_int_equal(raw_int(r, "ZCARD %b", z), 2); /* what npm's script counts */
    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    assert_int_equal(n, 2);
    bool peer = false;
    for (size_t i = 0; i < n; i++)
        peer = peer || (strcmp(v[i].owner, "npm-peer-1") == 0 && v[i].fence == 0);
    assert_true(peer);
    cerb_holders_free(v, n);
    struct taker t = {.s = s, .k = 1, .wait_ms = 10000};
    pthread_t th;
    pthread_create(&th, NULL, take_main, &t);
    expect_members(c, name, 2, 1);
    a = redisCommand(r, "ZREM %b %s", z, strlen(z), "npm-peer-1");
    freeReplyObject(a);
    assert_true(wait_until(taker_done, &t, 3000));
    assert_int_equal(t.st, CERB_OK);
    pthread_join(th, NULL);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_int_equal(cerb_permit_free(t.p), CERB_OK);
    assert_int_equal(raw_int(r, "EXISTS %b", z), 0);
    redisFree(r);
    free(z);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(name);
}

static void on_lost(cerb_permit *p, void *ud)
{
    (void)p;
    atomic_fetch_add((atomic_int *)ud, 1);
}

static bool flag_set(void *ud) { return atomic_load((atomic_int *)ud) > 0; }

/* A server that lost its data: a prefix of our own with no marker stands
 * for a server that restarted empty (the client makes the marker with a
 * quarantine of one lease): no grant before it ends. Then the marker
 * deleted under a held permit: the permit is told lost. */
static void test_quarantine_and_loss(void **state)
{
    (void)state;
    char *name = test_name("sem-quar");
    char extra[128];
    char *pfx = test_name("semq");
    snprintf(extra, sizeof extra, "prefix = \"%s:\";", pfx);
    cerb_client *c = open_client(extra, "lock = { lease_ms = 1500; };");
    cerb_semaphore *s = sem(c, name, 1, 1500);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_BUSY);
    /* (The core words a try's BUSY itself: an empty name, nobody else.) */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_semaphore_acquire(s, 1, 6000, NULL, &p), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 > 500);
    atomic_int lost = 0;
    assert_int_equal(cerb_permit_on_lost(p, on_lost, &lost), CERB_OK);
    redisContext *r = raw();
    char mk[128];
    snprintf(mk, sizeof mk, "%s:" SEP "cerberus", pfx);
    assert_int_equal(raw_int(r, "DEL %b", mk), 1);
    assert_true(wait_until(flag_set, &lost, 5000));
    assert_int_equal(cerb_permit_state(p), CERB_LOCK_LOST);
    cerb_permit_free(p);
    /* Clean up our prefix's keys. */
    redisReply *a = redisCommand(r, "DEL %b", mk, strlen(mk));
    freeReplyObject(a);
    redisFree(r);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(pfx);
    free(name);
}

/* ---- the engine's table, driven as the core drives it ---- */

static const struct cerb_engine_ops *ops;

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void eng_open(struct eng *g)
{
    cerb__engines_builtin();
    ops = cerb__engine_find("redis");
    assert_non_null(ops);
    char *text = cerb_test_redis_config(NULL, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = NULL, .ud = NULL};
    if (cerb__engine_open(ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

/* A member of semaphore `name` (limit 3) of token tok. */
struct hold {
    cerb_engine_lock lk;
    void *priv;
    cerb_grant gr;
};

static void hold_init(struct hold *h, const char *name, const char *tok, unsigned count)
{
    memset(h, 0, sizeof *h);
    h->priv = calloc(1, ops->lock_priv_size + 1);
    assert_non_null(h->priv);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%s", tok);
    h->lk.lease_ms = 10000;
    h->lk.priv = h->priv;
    h->lk.epoch = -1;
    h->lk.prim = CERB_PRIM_SEMAPHORE;
    h->lk.limit = 3;
    h->lk.count = count;
}

/* The switch gate's question for a member like h asking for k permits. */
static cerb_status fits(struct eng *g, struct hold *h, unsigned k)
{
    h->lk.count = k;
    return cerb__engine_gate_ask(ops, g->e, &h->lk, false);
}

static bool has_owner(cerb_client *c, const char *name, const char *tok)
{
    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found = found || strcmp(v[i].owner, tok) == 0;
    cerb_holders_free(v, n);
    return found;
}

/* fits: limit 3 with 1 held, 1 and 2 fit, 3 does not; the asking token's
 * own permits are left out; a released 2-permit member is gone whole; a
 * peer's member (npm) counts; a waiting member counts (a request for 2
 * queued behind 2 held: then not even 1 fits). That waiter's process is
 * killed (as one that gave up its wait, or whose acquire's outcome was
 * unknown): released by its token (read from inspect) it is gone at once,
 * while its alive deadline (on the server's clock) has not passed, and
 * the release says CERB_NOT_OWNER (it held nothing). */
static void test_fits_and_waiting_release(void **state)
{
    (void)state;
    char *name = test_name("sem-fits");
    char *cfg = cerb_test_redis_config(NULL, NULL);
    cerb_client *c = open_client(NULL, NULL);
    cerb_semaphore *s = sem(c, name, 3, 0);
    struct eng g;
    eng_open(&g);
    struct hold me, other;
    hold_init(&me, name, "0000000000000000000000000000f175", 1);
    hold_init(&other, name, "0000000000000000000000000000f176", 1);
    redisContext *r = raw();
    char *z = zkey(name), *hk = helper(name, "h"), *qk = helper(name, "q");

    assert_int_equal(fits(&g, &other, 3), CERB_OK); /* nothing there */
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    assert_int_equal(fits(&g, &other, 1), CERB_OK);
    assert_int_equal(fits(&g, &other, 2), CERB_OK);
    assert_int_equal(fits(&g, &other, 3), CERB_BUSY);

    /* Own token left out: me holds 2 (3 of 3 taken) and still fits for 2. */
    me.lk.count = 2;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &me.lk, 0, NULL, &me.gr), CERB_OK);
    assert_int_equal(fits(&g, &me, 2), CERB_OK);
    assert_int_equal(fits(&g, &other, 1), CERB_BUSY);
    me.lk.count = 2;
    assert_int_equal(cerb__engine_release(ops, g.e, &me.lk), CERB_OK);
    assert_int_equal(raw_int(r, "ZCARD %b", z), 1); /* both of its members gone */
    assert_int_equal(cerb__engine_release(ops, g.e, &me.lk), CERB_NOT_OWNER);

    /* A peer's member counts: 1 ours + 1 npm's. */
    redisReply *a = redisCommand(r, "ZADD %b %lld %s", z, strlen(z), server_ms(r), "npm-fits-1");
    freeReplyObject(a);
    assert_int_equal(fits(&g, &other, 2), CERB_BUSY);
    assert_int_equal(fits(&g, &other, 1), CERB_OK);

    /* A waiting member counts: a child asks for 2 (2 + 2 > 3: it waits). */
    int rd;
    pid_t pid = spawn_sem(cfg, name, "3", "2", "10000", "wait", &rd);
    expect_byte(rd, 'w');
    expect_members(c, name, 2, 1);
    assert_int_equal(fits(&g, &other, 1), CERB_BUSY);

    /* Its token, from inspect; then the child dies in the queue. */
    char wtok[33] = "";
    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    for (size_t i = 0; i < n; i++)
        if (v[i].waiting)
            snprintf(wtok, sizeof wtok, "%s", v[i].owner);
    cerb_holders_free(v, n);
    assert_int_equal(strlen(wtok), 32);
    kill_child(pid);
    redisReply *e = redisCommand(r, "HGET %b %s", hk, strlen(hk), wtok);
    assert_non_null(e);
    assert_int_equal(e->type, REDIS_REPLY_STRING);
    char st = 0;
    unsigned long k = 0;
    long long lease = 0, alive = 0;
    assert_int_equal(sscanf(e->str, "%c %lu %lld %lld", &st, &k, &lease, &alive), 4);
    freeReplyObject(e);
    assert_int_equal(st, 'w');
    assert_int_equal(k, 2);

    struct hold w;
    hold_init(&w, name, wtok, 2);
    assert_int_equal(cerb__engine_release(ops, g.e, &w.lk), CERB_NOT_OWNER);
    assert_false(has_owner(c, name, wtok));
    assert_int_equal(raw_int(r, "LLEN %b", qk), 0);
    e = redisCommand(r, "HEXISTS %b %s", hk, strlen(hk), wtok);
    assert_int_equal(e->integer, 0);
    freeReplyObject(e);
    /* Gone by the release, not by its own expiry (not due yet). */
    if (server_ms(r) > alive)
        fail_msg("inconclusive: the waiter's alive deadline passed before the check");
    assert_int_equal(fits(&g, &other, 1), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &w.lk), CERB_NOT_OWNER); /* idempotent */

    a = redisCommand(r, "ZREM %b %s", z, strlen(z), "npm-fits-1");
    freeReplyObject(a);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    close(rd);
    free(me.priv);
    free(other.priv);
    free(w.priv);
    free(z);
    free(hk);
    free(qk);
    redisFree(r);
    eng_close(&g);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(cfg);
    free(name);
}

struct eng_taker;
static bool taker_done_eng(void *ud);

struct eng_taker {
    struct eng *g;
    struct hold *h;
    int64_t wait_ms;
    cerb_status st;
    atomic_int done;
};

static void *eng_take_main(void *arg)
{
    struct eng_taker *t = arg;
    t->st = cerb__engine_acquire(ops, t->g->e, &t->h->lk, cerb__deadline_in(t->wait_ms), NULL,
                                 &t->h->gr);
    atomic_store(&t->done, 1);
    return NULL;
}

static bool taker_done_eng(void *ud)
{
    return atomic_load(&((struct eng_taker *)ud)->done) != 0;
}

struct hval {
    redisContext *r;
    const char *key, *field;
    char want; /* first byte of the value */
};

static bool hval_is(void *ud)
{
    struct hval *hv = ud;
    redisReply *e = redisCommand(hv->r, "HGET %s %s", hv->key, hv->field);
    bool ok = e && e->type == REDIS_REPLY_STRING && e->len > 0 && e->str[0] == hv->want;
    if (e)
        freeReplyObject(e);
    return ok;
}

static struct cerb_redis_stats stats_of(struct eng *g)
{
    struct cerb_redis_stats rs;
    cerb__redis_stats(g->e, &rs);
    return rs;
}

/* The hand-off (limit 1, lease 10 s): a waiter queued with a fence floor
 * above every fence so far; the holder's release grants it in the release
 * script. On the wire right after: its entry "g 1 2000 0 <fence>" (the
 * hand-off lease, min(10 s, 2 s): only a hand-off writes it, a waiter's
 * own acquire writes its full lease, and no core renews here), its member
 * in B, the queue empty. The waiter got the grant from its wake list
 * ("f<fence>": a hand-off received, the grant's ttl the short lease), with
 * the fence from the script, above its floor; its renewal then finds the
 * same fence and stores the full lease. */
static void test_handoff_on_the_wire(void **state)
{
    (void)state;
    char *name = test_name("sem-handoff");
    struct eng ga, gw;
    eng_open(&ga);
    eng_open(&gw);
    struct hold a, w;
    hold_init(&a, name, "0000000000000000000000000000a001", 1);
    hold_init(&w, name, "0000000000000000000000000000a002", 1);
    a.lk.limit = w.lk.limit = 1;
    redisContext *r = raw();
    char *z = zkey(name), *hk = helper(name, "h"), *qk = helper(name, "q");
    char *wk = helper(name, "w:0000000000000000000000000000a002");

    assert_int_equal(cerb__engine_acquire(ops, ga.e, &a.lk, 0, NULL, &a.gr), CERB_OK);
    uint64_t fa = a.gr.fence & FENCE_MASK;
    w.lk.fence_floor = fa + 5000000;
    struct eng_taker t = {.g = &gw, .h = &w, .wait_ms = 20000};
    pthread_t th;
    pthread_create(&th, NULL, eng_take_main, &t);
    struct hval queued = {r, hk, w.lk.token, 'w'};
    assert_true(wait_until(hval_is, &queued, 8000));
    assert_int_equal(atomic_load(&t.done), 0);
    uint64_t got0 = stats_of(&gw).handoffs_received;

    assert_int_equal(cerb__engine_release(ops, ga.e, &a.lk), CERB_OK);
    assert_true(wait_until(taker_done_eng, &t, 5000));
    pthread_join(th, NULL);
    assert_int_equal(t.st, CERB_OK);
    uint64_t fw = w.gr.fence & FENCE_MASK;
    assert_true(fw > w.lk.fence_floor);
    assert_int_equal(w.gr.ttl_ms, 2000);
    assert_int_equal(stats_of(&gw).handoffs_received, got0 + 1);

    char want[64];
    snprintf(want, sizeof want, "g 1 2000 0 %llu", (unsigned long long)fw);
    redisReply *e = redisCommand(r, "HGET %s %s", hk, w.lk.token);
    assert_non_null(e);
    assert_int_equal(e->type, REDIS_REPLY_STRING);
    assert_string_equal(e->str, want);
    freeReplyObject(e);
    e = redisCommand(r, "ZSCORE %s %s", z, w.lk.token);
    assert_int_equal(e->type, REDIS_REPLY_STRING);
    freeReplyObject(e);
    assert_int_equal(raw_int(r, "ZCARD %b", z), 1);
    assert_int_equal(raw_int(r, "LLEN %b", qk), 0);
    assert_int_equal(raw_int(r, "EXISTS %b", wk), 0); /* popped by the waiter */

    cerb_grant g2;
    memset(&g2, 0, sizeof g2);
    assert_int_equal(cerb__engine_renew(ops, gw.e, &w.lk, &g2), CERB_OK);
    assert_int_equal(g2.fence & FENCE_MASK, fw);
    snprintf(want, sizeof want, "g 1 10000 0 %llu", (unsigned long long)fw);
    e = redisCommand(r, "HGET %s %s", hk, w.lk.token);
    assert_string_equal(e->str, want);
    freeReplyObject(e);
    assert_int_equal(cerb__engine_release(ops, gw.e, &w.lk), CERB_OK);
    assert_int_equal(raw_int(r, "EXISTS %b", z), 0);

    free(a.priv);
    free(w.priv);
    free(z);
    free(hk);
    free(qk);
    free(wk);
    redisFree(r);
    eng_close(&ga);
    eng_close(&gw);
    free(name);
}

static const struct cerb_test_role roles[] = {{"sem", sem_child}, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb_test_debug_aids();
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_on_the_wire),
        cmocka_unit_test(test_limit_mismatch),
        cmocka_unit_test(test_big_request_not_passed),
        cmocka_unit_test(test_dead_waiter_does_not_block),
        cmocka_unit_test(test_dead_holder_frees_after_lease),
        cmocka_unit_test(test_peer_members_count),
        cmocka_unit_test(test_quarantine_and_loss),
        cmocka_unit_test(test_fits_and_waiting_release),
        cmocka_unit_test(test_handoff_on_the_wire),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
