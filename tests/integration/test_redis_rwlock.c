/*
 * test_redis_rwlock.c — read-write locks on a real redis-server through the
 * public API, and the FIFO layout they leave on the wire (docs/rwlock.md,
 * "## redis"): the queue {K}^_rw:q (member "r:"/"w:" + token, score a
 * ticket), the members' data {K}^_rw:d ("g|w mode lease deadline fence",
 * server ms), readers together, a writer alone, a reader behind a waiting
 * writer waiting (no writer starves), a waiter that dies in the queue (a
 * child killed) not blocking the line, a holder that dies freeing the lock
 * after its lease, fences growing, nothing left behind, inspection
 * ("read"/"write", holders then waiters), and the quarantine after a loss
 * of data; and, through the engine's table (engine.h), the switch gate's
 * question `fits` (a reader fits beside readers, not with a writer there,
 * waiting or holding; a writer only with nobody there; the asking token's
 * own member left out) and a release by token of a writer still waiting
 * (its process dead) removing it.
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "config.h"
#include "engine.h"
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

static cerb_rwlock *rwl(cerb_client *c, const char *name, int64_t lease_ms)
{
    cerb_rwlock_opts o = CERB_RWLOCK_OPTS_INIT;
    o.lease_ms = lease_ms;
    cerb_rwlock *rw = NULL;
    if (cerb_rwlock_new(c, name, &o, &rw) != CERB_OK)
        fail_msg("rwlock_new: %s", cerb_last_error());
    return rw;
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

static char *helper(const char *name, const char *sfx)
{
    size_t n = strlen(name) + strlen(sfx) + 16;
    char *k = malloc(n);
    assert_non_null(k);
    snprintf(k, n, "{%s}" SEP "rw:%s", name, sfx);
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
    long long ms = atoll(t->element[0]->str) * 1000 + atoll(t->element[1]->str) / 1000;
    freeReplyObject(t);
    return ms;
}

static cerb_holder_info *inspect(cerb_client *c, const char *name, size_t *n)
{
    cerb_holder_info *v = NULL;
    cerb_status st = cerb_inspect(c, CERB_KIND_RWLOCK, name, "redis", &v, n);
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
    if (cerb_inspect(m->c, CERB_KIND_RWLOCK, m->name, "redis", &v, &n) != CERB_OK)
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

/* A thread that takes the lock (read or write), reports, and holds it
 * until told to let go. */
struct job {
    cerb_client *c; /* a client of its own: one client's threads queue locally */
    cerb_rwlock *rw;
    bool write;
    int64_t wait_ms;
    cerb_status st;
    uint64_t fence;
    int64_t at_ms; /* when the call returned */
    atomic_int done, release;
};

static bool job_done(void *ud) { return atomic_load(&((struct job *)ud)->done) != 0; }
static bool job_gone(void *ud) { return atomic_load(&((struct job *)ud)->done) == 2; }
static bool job_released(void *ud) { return atomic_load(&((struct job *)ud)->release) != 0; }

static void *job_main(void *arg)
{
    struct job *j = arg;
    j->st = j->write ? cerb_rwlock_write_trylock_for(j->rw, j->wait_ms)
                     : cerb_rwlock_read_trylock_for(j->rw, j->wait_ms);
    j->at_ms = cerb_test_now_ms();
    if (j->st == CERB_OK)
        j->fence = cerb_rwlock_fencing_token(j->rw) & FENCE_MASK;
    atomic_store(&j->done, 1);
    if (j->st == CERB_OK) {
        wait_until(job_released, j, 60000);
        if (j->write)
            cerb_rwlock_write_unlock(j->rw);
        else
            cerb_rwlock_read_unlock(j->rw);
    }
    atomic_store(&j->done, 2);
    return NULL;
}

static void let_go(struct job *j, pthread_t th)
{
    atomic_store(&j->release, 1);
    pthread_join(th, NULL);
}

static void job_init(struct job *j, const char *name, bool write, int64_t wait_ms)
{
    memset(j, 0, sizeof *j);
    j->c = open_client(NULL, NULL);
    j->rw = rwl(j->c, name, 0);
    j->write = write;
    j->wait_ms = wait_ms;
}

static void job_free(struct job *j)
{
    cerb_rwlock_free(j->rw);
    cerb_client_close(j->c);
}

/* The layout: a reader's and a writer's member and data, readers together,
 * inspection, nothing but the fence counter after release. */
static void test_layout_on_the_wire(void **state)
{
    (void)state;
    char *name = test_name("rw-layout");
    cerb_client *c = open_client(NULL, NULL), *c2 = open_client(NULL, NULL);
    cerb_rwlock *a = rwl(c, name, 4000), *b = rwl(c2, name, 4000);
    assert_int_equal(cerb_rwlock_read_trylock_for(a, 0), CERB_OK);
    assert_int_equal(cerb_rwlock_read_trylock_for(b, 0), CERB_OK); /* readers together */
    uint64_t f1 = cerb_rwlock_fencing_token(a) & FENCE_MASK,
             f2 = cerb_rwlock_fencing_token(b) & FENCE_MASK;
    assert_true(f1 > 0 && f2 > f1);
    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].detail, "read");
    assert_string_equal(v[1].detail, "read");
    assert_int_equal(v[0].fence, f1);
    assert_int_equal(v[1].fence, f2);
    assert_true(v[0].ttl_ms > 0 && v[0].ttl_ms <= 4000);

    redisContext *r = raw();
    char *q = helper(name, "q"), *d = helper(name, "d"), *fk = helper(name, "fence");
    long long now = server_ms(r);
    redisReply *zr = redisCommand(r, "ZRANGE %b 0 -1 WITHSCORES", q, strlen(q));
    assert_int_equal(zr->elements, 4);
    char m0[40];
    snprintf(m0, sizeof m0, "r:%s", v[0].owner);
    assert_string_equal(zr->element[0]->str, m0);
    assert_string_equal(zr->element[1]->str, "1"); /* tickets */
    assert_string_equal(zr->element[3]->str, "2");
    freeReplyObject(zr);
    redisReply *dr = redisCommand(r, "HGET %b %s", d, strlen(d), v[0].owner);
    assert_int_equal(dr->type, REDIS_REPLY_STRING);
    char st, md;
    long long lease, dl;
    unsigned long long fence;
    assert_int_equal(sscanf(dr->str, "%c %c %lld %lld %llu", &st, &md, &lease, &dl, &fence), 5);
    assert_int_equal(st, 'g');
    assert_int_equal(md, 'r');
    assert_int_equal(lease, 4000);
    assert_true(dl > now && dl <= now + 4000); /* server ms */
    assert_int_equal(fence, f1);
    freeReplyObject(dr);
    assert_true(raw_int(r, "PTTL %b", q) > 4000);
    cerb_holders_free(v, n);

    /* A writer waits for both readers. */
    assert_int_equal(cerb_rwlock_write_trylock_for(b, 0), CERB_EINVAL); /* b's thread reads */
    cerb_client *c3 = open_client(NULL, NULL);
    cerb_rwlock *w = rwl(c3, name, 4000);
    assert_int_equal(cerb_rwlock_write_trylock_for(w, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_read_unlock(a), CERB_OK);
    assert_int_equal(cerb_rwlock_write_trylock_for(w, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_read_unlock(b), CERB_OK);
    assert_int_equal(cerb_rwlock_write_trylock_for(w, 0), CERB_OK);
    uint64_t fw = cerb_rwlock_fencing_token(w) & FENCE_MASK;
    assert_true(fw > f2);
    v = inspect(c, name, &n);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].detail, "write");
    cerb_holders_free(v, n);
    assert_int_equal(cerb_rwlock_read_trylock_for(a, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_unlock(w), CERB_OK);

    /* Nothing left but the fence counter, with its expiry. */
    assert_int_equal(raw_int(r, "EXISTS %b", q), 0);
    assert_int_equal(raw_int(r, "EXISTS %b", d), 0);
    long long fttl = raw_int(r, "PTTL %b", fk);
    assert_true(fttl > 0 && fttl <= 86400000);
    /* ... and the lock key of the name is never written. */
    assert_int_equal(raw_int(r, "EXISTS %b", name), 0);
    redisFree(r);
    free(q), free(d), free(fk);
    cerb_rwlock_free(a);
    cerb_rwlock_free(b);
    cerb_rwlock_free(w);
    cerb_client_close(c);
    cerb_client_close(c2);
    cerb_client_close(c3);
    free(name);
}

/* FIFO: reader r1 holds, writer w waits, reader r2 arrives: r2 waits
 * behind w (no writer starves); r1 leaves: w, then r2. */
static void test_reader_behind_waiting_writer_waits(void **state)
{
    (void)state;
    char *name = test_name("rw-fifo");
    cerb_client *c = open_client(NULL, NULL);
    struct job r1, w, r2;
    job_init(&r1, name, false, 0);
    job_init(&w, name, true, 20000);
    job_init(&r2, name, false, 20000);
    pthread_t t1, tw, t2;
    pthread_create(&t1, NULL, job_main, &r1);
    assert_true(wait_until(job_done, &r1, 5000));
    assert_int_equal(r1.st, CERB_OK);
    pthread_create(&tw, NULL, job_main, &w);
    expect_members(c, name, 1, 1);
    pthread_create(&t2, NULL, job_main, &r2);
    expect_members(c, name, 1, 2);
    size_t n = 0;
    cerb_holder_info *v = inspect(c, name, &n);
    assert_int_equal(n, 3);
    assert_string_equal(v[0].detail, "read");
    assert_int_equal(v[0].waiting, 0);
    assert_string_equal(v[1].detail, "write");
    assert_int_equal(v[1].waiting, 1);
    assert_string_equal(v[2].detail, "read");
    assert_int_equal(v[2].waiting, 1);
    cerb_holders_free(v, n);
    /* Past several re-checks: the reader still waits behind the writer. */
    cerb_test_let_time_pass(1200);
    assert_int_equal(atomic_load(&r2.done), 0);
    let_go(&r1, t1);
    assert_true(wait_until(job_done, &w, 5000));
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.fence > r1.fence);
    assert_int_equal(atomic_load(&r2.done), 0);
    let_go(&w, tw);
    assert_true(wait_until(job_done, &r2, 5000));
    assert_int_equal(r2.st, CERB_OK);
    assert_true(r2.fence > w.fence);
    let_go(&r2, t2);
    assert_true(job_gone(&r2));
    job_free(&r1);
    job_free(&w);
    job_free(&r2);
    cerb_client_close(c);
    free(name);
}

/* ---- children ---- */

/* Role "rw": argv = config text, name, mode (r|w), lease_ms, action (hold:
 * take it at once, write 'g' to fd <wfd>, wait to be killed; wait: write
 * 'w', then wait up to a minute for it), wfd. */
static int rw_child(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    int wfd = atoi(argv[5]);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, argv[0]) != CERB_OK)
        return 3;
    cerb_rwlock_opts o = CERB_RWLOCK_OPTS_INIT;
    o.lease_ms = atoll(argv[3]);
    cerb_rwlock *rw = NULL;
    if (cerb_rwlock_new(c, argv[1], &o, &rw) != CERB_OK)
        return 4;
    bool write_mode = argv[2][0] == 'w';
    bool hold = strcmp(argv[4], "hold") == 0;
    if (!hold && write(wfd, "w", 1) != 1)
        return 6;
    cerb_status st = write_mode ? cerb_rwlock_write_trylock_for(rw, hold ? 5000 : 60000)
                                : cerb_rwlock_read_trylock_for(rw, hold ? 5000 : 60000);
    if (st != CERB_OK)
        return 5;
    if (write(wfd, "g", 1) != 1)
        return 6;
    for (;;)
        pause();
}

static pid_t spawn_rw(const char *cfg, const char *name, const char *mode, const char *lease,
                      const char *action, int *rd)
{
    int fds[2];
    char wfd[16];
    assert_int_equal(pipe(fds), 0);
    snprintf(wfd, sizeof wfd, "%d", fds[1]);
    char *args[] = {(char *)cfg, (char *)name, (char *)mode, (char *)lease, (char *)action, wfd,
                    NULL};
    int keep[] = {fds[1], -1};
    pid_t pid = cerb_test_spawn_self("rw", args, keep);
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

/* A writer that dies in the queue does not block the line: the writer
 * behind it gets the lock when the reader holding it leaves. */
static void test_dead_waiter_does_not_block(void **state)
{
    (void)state;
    char *name = test_name("rw-deadwaiter");
    char *cfg = cerb_test_redis_config(NULL, NULL);
    cerb_client *c = open_client(NULL, NULL);
    struct job r, w;
    job_init(&r, name, false, 0);
    job_init(&w, name, true, 20000);
    pthread_t tr, tw;
    pthread_create(&tr, NULL, job_main, &r);
    assert_true(wait_until(job_done, &r, 5000));
    assert_int_equal(r.st, CERB_OK);
    int rd;
    pid_t pid = spawn_rw(cfg, name, "w", "10000", "wait", &rd);
    expect_byte(rd, 'w');
    expect_members(c, name, 1, 1);
    pthread_create(&tw, NULL, job_main, &w);
    expect_members(c, name, 1, 2);
    kill_child(pid);
    let_go(&r, tr);
    assert_true(wait_until(job_done, &w, 8000));
    assert_int_equal(w.st, CERB_OK);
    expect_members(c, name, 1, 0);
    let_go(&w, tw);
    close(rd);
    job_free(&r);
    job_free(&w);
    cerb_client_close(c);
    free(cfg);
    free(name);
}

/* A writer that dies holding the lock frees it when its lease (1.5 s)
 * runs out on the server, not before. */
static void test_dead_holder_frees_after_lease(void **state)
{
    (void)state;
    char *name = test_name("rw-deadholder");
    char *cfg = cerb_test_redis_config(NULL, NULL);
    cerb_client *c = open_client(NULL, NULL);
    cerb_rwlock *rw = rwl(c, name, 0);
    int rd;
    pid_t pid = spawn_rw(cfg, name, "w", "1500", "hold", &rd);
    expect_byte(rd, 'g');
    kill_child(pid);
    assert_int_equal(cerb_rwlock_read_trylock_for(rw, 0), CERB_BUSY);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_rwlock_read_trylock_for(rw, 8000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 5000);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_OK);
    close(rd);
    cerb_rwlock_free(rw);
    cerb_client_close(c);
    free(cfg);
    free(name);
}

/* A released writer wakes every reader queued behind it, each once: they
 * are all granted at once, well within the waiters' re-check period
 * (REDIS_TAIL_POLL_MS, 500 ms), which alone would spread them over it. */
static void test_writer_release_wakes_readers(void **state)
{
    (void)state;
    char *name = test_name("rw-wake");
    cerb_client *c = open_client(NULL, NULL);
    struct job w;
    job_init(&w, name, true, 0);
    struct job rs[4];
    pthread_t tw, tr[4];
    pthread_create(&tw, NULL, job_main, &w);
    assert_true(wait_until(job_done, &w, 5000));
    assert_int_equal(w.st, CERB_OK);
    for (int i = 0; i < 4; i++) {
        job_init(&rs[i], name, false, 20000);
        pthread_create(&tr[i], NULL, job_main, &rs[i]);
    }
    expect_members(c, name, 1, 4);
    int64_t t0 = cerb_test_now_ms();
    let_go(&w, tw);
    for (int i = 0; i < 4; i++) {
        assert_true(wait_until(job_done, &rs[i], 5000));
        assert_int_equal(rs[i].st, CERB_OK);
        assert_true(rs[i].fence > w.fence);
        if (rs[i].at_ms - t0 > 200)
            fail_msg("reader %d granted %lld ms after the release: not woken", i,
                     (long long)(rs[i].at_ms - t0));
    }
    /* All four read together. */
    expect_members(c, name, 4, 0);
    for (int i = 0; i < 4; i++) {
        let_go(&rs[i], tr[i]);
        job_free(&rs[i]);
    }
    job_free(&w);
    cerb_client_close(c);
    free(name);
}

/* The quarantine after a loss of data holds back a read-write lock's
 * grants too (a prefix of our own whose marker the client makes). */
static void test_quarantine(void **state)
{
    (void)state;
    char *name = test_name("rw-quar");
    char extra[128];
    char *pfx = test_name("rwq");
    snprintf(extra, sizeof extra, "prefix = \"%s:\";", pfx);
    cerb_client *c = open_client(extra, "lock = { lease_ms = 1500; };");
    cerb_rwlock *rw = rwl(c, name, 1500);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 0), CERB_BUSY);
    /* (The core words a try's BUSY itself: an empty name, nobody else.) */
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 6000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 > 500);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_OK);
    redisContext *r = raw();
    char mk[128];
    snprintf(mk, sizeof mk, "%s:" SEP "cerberus", pfx);
    redisReply *a = redisCommand(r, "DEL %b", mk, strlen(mk));
    freeReplyObject(a);
    redisFree(r);
    cerb_rwlock_free(rw);
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

struct hold {
    cerb_engine_lock lk;
    void *priv;
    cerb_grant gr;
};

static void hold_init(struct hold *h, const char *name, const char *tok, int mode)
{
    memset(h, 0, sizeof *h);
    h->priv = calloc(1, ops->lock_priv_size + 1);
    assert_non_null(h->priv);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%s", tok);
    h->lk.lease_ms = 10000;
    h->lk.priv = h->priv;
    h->lk.epoch = -1;
    h->lk.prim = CERB_PRIM_RWLOCK;
    h->lk.variant = mode;
}

/* The switch gate's question for a member like h in mode `mode`. */
static cerb_status fits(struct eng *g, struct hold *h, int mode)
{
    h->lk.variant = mode;
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

/* fits: on an empty name both fit; with a reader holding a reader fits, a
 * writer does not; with a writer of the asking token's own holding both
 * fit for it, neither for another token; with a writer waiting (behind a
 * reader) a reader does not fit. That writer's process is killed (as one
 * that gave up its wait, or whose acquire's outcome was unknown): released
 * by its token (read from inspect) it is gone at once, while its alive
 * deadline (server clock) has not passed, and the release says
 * CERB_NOT_OWNER (it held nothing). */
static void test_fits_and_waiting_release(void **state)
{
    (void)state;
    char *name = test_name("rw-fits");
    char *cfg = cerb_test_redis_config(NULL, NULL);
    struct eng g;
    eng_open(&g);
    struct hold me, other;
    hold_init(&me, name, "0000000000000000000000000000f1a5", CERB_RW_WRITE);
    hold_init(&other, name, "0000000000000000000000000000f1a6", CERB_RW_READ);
    redisContext *r = raw();
    char *qk = helper(name, "q"), *dk = helper(name, "d");

    assert_int_equal(fits(&g, &other, CERB_RW_WRITE), CERB_OK);
    assert_int_equal(fits(&g, &other, CERB_RW_READ), CERB_OK);

    struct job rd1;
    job_init(&rd1, name, false, 0);
    pthread_t t1;
    pthread_create(&t1, NULL, job_main, &rd1);
    assert_true(wait_until(job_done, &rd1, 5000));
    assert_int_equal(rd1.st, CERB_OK);
    assert_int_equal(fits(&g, &other, CERB_RW_READ), CERB_OK);
    assert_int_equal(fits(&g, &other, CERB_RW_WRITE), CERB_BUSY);
    let_go(&rd1, t1);

    /* The asking token's own writer is left out. */
    me.lk.variant = CERB_RW_WRITE;
    assert_int_equal(cerb__engine_acquire(ops, g.e, &me.lk, 0, NULL, &me.gr), CERB_OK);
    assert_int_equal(fits(&g, &me, CERB_RW_WRITE), CERB_OK);
    assert_int_equal(fits(&g, &me, CERB_RW_READ), CERB_OK);
    assert_int_equal(fits(&g, &other, CERB_RW_READ), CERB_BUSY);
    assert_int_equal(fits(&g, &other, CERB_RW_WRITE), CERB_BUSY);
    me.lk.variant = CERB_RW_WRITE;
    assert_int_equal(cerb__engine_release(ops, g.e, &me.lk), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &me.lk), CERB_NOT_OWNER);

    /* A reader holds, a writer waits behind it (a child). */
    struct job rd2;
    job_init(&rd2, name, false, 0);
    pthread_t t2;
    pthread_create(&t2, NULL, job_main, &rd2);
    assert_true(wait_until(job_done, &rd2, 5000));
    assert_int_equal(rd2.st, CERB_OK);
    int pfd;
    pid_t pid = spawn_rw(cfg, name, "w", "10000", "wait", &pfd);
    expect_byte(pfd, 'w');
    expect_members(rd2.c, name, 1, 1);
    assert_int_equal(fits(&g, &other, CERB_RW_READ), CERB_BUSY);

    char wtok[33] = "";
    size_t n = 0;
    cerb_holder_info *v = inspect(rd2.c, name, &n);
    for (size_t i = 0; i < n; i++)
        if (v[i].waiting)
            snprintf(wtok, sizeof wtok, "%s", v[i].owner);
    cerb_holders_free(v, n);
    assert_int_equal(strlen(wtok), 32);
    kill_child(pid);
    redisReply *e = redisCommand(r, "HGET %b %s", dk, strlen(dk), wtok);
    assert_non_null(e);
    assert_int_equal(e->type, REDIS_REPLY_STRING);
    char st = 0, md = 0;
    long long lease = 0, alive = 0;
    assert_int_equal(sscanf(e->str, "%c %c %lld %lld", &st, &md, &lease, &alive), 4);
    freeReplyObject(e);
    assert_int_equal(st, 'w');
    assert_int_equal(md, 'w');

    struct hold w;
    hold_init(&w, name, wtok, CERB_RW_WRITE);
    assert_int_equal(cerb__engine_release(ops, g.e, &w.lk), CERB_NOT_OWNER);
    assert_false(has_owner(rd2.c, name, wtok));
    assert_int_equal(raw_int(r, "ZCARD %b", qk), 1); /* the reader only */
    e = redisCommand(r, "HEXISTS %b %s", dk, strlen(dk), wtok);
    assert_int_equal(e->integer, 0);
    freeReplyObject(e);
    /* Gone by the release, not by its own expiry (not due yet). */
    if (server_ms(r) > alive)
        fail_msg("inconclusive: the waiter's alive deadline passed before the check");
    assert_int_equal(fits(&g, &other, CERB_RW_READ), CERB_OK);
    assert_int_equal(cerb__engine_release(ops, g.e, &w.lk), CERB_NOT_OWNER); /* idempotent */

    let_go(&rd2, t2);
    close(pfd);
    job_free(&rd1);
    job_free(&rd2);
    free(me.priv);
    free(other.priv);
    free(w.priv);
    free(qk);
    free(dk);
    redisFree(r);
    eng_close(&g);
    free(cfg);
    free(name);
}

static const struct cerb_test_role roles[] = {{"rw", rw_child}, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb_test_debug_aids();
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_on_the_wire),
        cmocka_unit_test(test_reader_behind_waiting_writer_waits),
        cmocka_unit_test(test_dead_waiter_does_not_block),
        cmocka_unit_test(test_dead_holder_frees_after_lease),
        cmocka_unit_test(test_writer_release_wakes_readers),
        cmocka_unit_test(test_quarantine),
        cmocka_unit_test(test_fits_and_waiting_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
