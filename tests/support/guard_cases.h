/*
 * guard_cases.h — the engine-independent cases of the idempotency guard
 * (DESIGN.md §11), included by each engine's guard suite. The including
 * file defines, before including this:
 *   static char *guard_cfg(const char *guard_extra);   config text
 *     (malloc'd) for a client of the engine under test, whose guard group
 *     holds a short keep_ms (a few seconds) and `guard_extra` (may be NULL);
 *     every client it makes must share records across processes;
 *   static size_t guard_records(void);   this suite's records on the server
 * and lists GUARD_CASES in its cmocka group, and GC_ROLE among the roles its
 * main() hands over to first (cerb_test_roles in test_util.h): the
 * processes of the cases below are the suite's binary run again as role
 * "gc_child", single-threaded, whatever threads the suite runs when it
 * starts them. Header-only on purpose (static functions), like a
 * conformance suite.
 *
 * Faults are real: a child process holding an attempt is SIGKILLed (its
 * claim must block retries for running_ms and not longer) or SIGSTOPped
 * past its claim (its late finish must return CERB_LOST and leave the new
 * attempt's record alone).
 */
#ifndef CERB_GUARD_CASES_H
#define CERB_GUARD_CASES_H

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cerberus.h"
#include "test_util.h"

/* The record id the contract names (DESIGN.md §11), computed here apart
 * from the library: hex SHA-256 of the tag "cerb-guard-1", then app, scope
 * and key, each after its length as 8 bytes big-endian. */
static inline void gc_record_hex(const char *app, const char *scope, const void *key, size_t klen,
                                 char hex[65])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char d[32], be[8];
    unsigned dl = 0;
    const void *parts[3] = {app, scope, key};
    size_t lens[3] = {strlen(app), strlen(scope), klen};
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    EVP_DigestUpdate(md, "cerb-guard-1", 12);
    for (int i = 0; i < 3; i++) {
        uint64_t v = lens[i];
        for (int j = 7; j >= 0; j--, v >>= 8)
            be[j] = (unsigned char)v;
        EVP_DigestUpdate(md, be, 8);
        EVP_DigestUpdate(md, parts[i], lens[i]);
    }
    EVP_DigestFinal_ex(md, d, &dl);
    EVP_MD_CTX_free(md);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static cerb_client *gc_open(const char *extra)
{
    char *cfg = guard_cfg(extra);
    cerb_client *c = cerb_test_open(cfg);
    free(cfg);
    assert_non_null(c);
    return c;
}

static char *gc_key(const char *what)
{
    return test_name(what); /* unique per run: keys of earlier runs do not answer */
}

static void gc_expect_duplicate(cerb_client *c, const char *scope, const char *key,
                                const void *want, size_t want_len)
{
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(c, scope, key, strlen(key), NULL, &g);
    assert_int_equal(st, CERB_DUPLICATE);
    assert_non_null(g);
    size_t len = 99;
    const void *r = cerb_guard_result(g, &len);
    assert_int_equal(len, want_len);
    if (want_len)
        assert_memory_equal(r, want, want_len);
    assert_int_equal(cerb_guard_degraded(g), 0);
    /* A duplicate's handle is no attempt: it cannot finish. */
    assert_int_equal(cerb_guard_finish(g, 1, "x", 1), CERB_EINVAL);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
}

static cerb_status gc_begin_status(cerb_client *c, const char *scope, const char *key,
                                   const cerb_guard_opts *o)
{
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(c, scope, key, strlen(key), o, &g);
    if (g) {
        /* Keep nothing: a duplicate's handle is freed, an OK attempt is
         * ended as failed by free (deleted), which the callers expect. */
        cerb_guard_free(g);
    }
    return st;
}

/* ---- the basic cycle: OK, BUSY while running, DUPLICATE after ---- */

static void test_guard_once_then_duplicate(void **state)
{
    (void)state;
    cerb_client *a = gc_open(NULL), *b = gc_open(NULL);
    char *key = gc_key("order");
    const char result[] = "order 17\0binary\xff"; /* NUL and high bytes kept */
    cerb_guard *g = NULL;

    assert_int_equal(cerb_guard_begin(a, "create-order", key, strlen(key), NULL, &g), CERB_OK);
    assert_non_null(g);
    assert_int_equal(cerb_guard_degraded(g), 0);
    assert_null(cerb_guard_result(g, NULL));
    /* Same operation from another client (another process would do the
     * same): running, so BUSY; another scope or key is another operation. */
    assert_int_equal(gc_begin_status(b, "create-order", key, NULL), CERB_BUSY);
    assert_int_equal(gc_begin_status(b, "refund-order", key, NULL), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, result, sizeof result), CERB_OK);
    size_t len = 0;
    assert_memory_equal(cerb_guard_result(g, &len), result, sizeof result);
    assert_int_equal(len, sizeof result);
    assert_int_equal(cerb_guard_finish(g, 1, result, sizeof result), CERB_EINVAL); /* twice */
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    gc_expect_duplicate(b, "create-order", key, result, sizeof result);
    gc_expect_duplicate(a, "create-order", key, result, sizeof result);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- failure: the record goes at once, so a retry runs now ---- */

static void test_guard_failure_then_retry_at_once(void **state)
{
    (void)state;
    cerb_client *a = gc_open(NULL), *b = gc_open(NULL);
    char *key = gc_key("pay");
    cerb_guard *g = NULL, *g2 = NULL;

    assert_int_equal(cerb_guard_begin(a, "pay", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_guard_begin(b, "pay", key, strlen(key), NULL, &g2), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 1000); /* not after running_ms (30 s) */
    /* An attempt freed without finish counts as failed too. */
    assert_int_equal(cerb_guard_free(g2), CERB_OK);
    assert_int_equal(cerb_guard_begin(a, "pay", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "paid", 4), CERB_OK);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    gc_expect_duplicate(b, "pay", key, "paid", 4);
    free(key);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- threads racing begin on one key ---- */

#define GC_THREADS 8
struct gc_race {
    cerb_client *c[GC_THREADS];
    const char *key;
    pthread_barrier_t start;
    cerb_status st[GC_THREADS];
    cerb_guard *g[GC_THREADS];
    int i;
    pthread_mutex_t mu;
};

static void *gc_racer(void *arg)
{
    struct gc_race *r = arg;
    pthread_mutex_lock(&r->mu);
    int i = r->i++;
    pthread_mutex_unlock(&r->mu);
    pthread_barrier_wait(&r->start);
    r->st[i] = cerb_guard_begin(r->c[i], "race", r->key, strlen(r->key), NULL, &r->g[i]);
    return NULL;
}

static void test_guard_threads_race(void **state)
{
    (void)state;
    struct gc_race r;
    memset(&r, 0, sizeof r);
    char *key = gc_key("race");
    r.key = key;
    pthread_mutex_init(&r.mu, NULL);
    pthread_barrier_init(&r.start, NULL, GC_THREADS);
    /* Half the threads share a client, half have their own. */
    for (int i = 0; i < GC_THREADS; i++)
        r.c[i] = i < GC_THREADS / 2 ? (i == 0 ? gc_open(NULL) : r.c[0]) : gc_open(NULL);
    pthread_t t[GC_THREADS];
    for (int i = 0; i < GC_THREADS; i++)
        pthread_create(&t[i], NULL, gc_racer, &r);
    for (int i = 0; i < GC_THREADS; i++)
        pthread_join(t[i], NULL);
    int ok = -1, busy = 0;
    for (int i = 0; i < GC_THREADS; i++) {
        if (r.st[i] == CERB_OK) {
            assert_int_equal(ok, -1);
            ok = i;
        } else {
            assert_int_equal(r.st[i], CERB_BUSY);
            assert_null(r.g[i]);
            busy++;
        }
    }
    assert_true(ok >= 0);
    assert_int_equal(busy, GC_THREADS - 1);
    assert_int_equal(cerb_guard_finish(r.g[ok], 1, "won", 3), CERB_OK);
    cerb_guard_free(r.g[ok]);
    for (int i = 0; i < GC_THREADS; i++)
        gc_expect_duplicate(r.c[i], "race", key, "won", 3);
    for (int i = 0; i < GC_THREADS; i++)
        if (i == 0 || i >= GC_THREADS / 2)
            cerb_client_close(r.c[i]);
    pthread_barrier_destroy(&r.start);
    pthread_mutex_destroy(&r.mu);
    free(key);
}

/* ---- processes racing begin on one key ---- */

#define GC_PROCS 4
/* How long the parent waits for a child's answer: its client's open and one
 * begin or finish, slow under ThreadSanitizer. */
#define GC_CHILD_MS 30000

struct gc_child {
    const char *key;
    const char *scope;
    int64_t running_ms;
    int go_fd;       /* read one byte: start (and again: finish) */
    int report_fd;   /* write: one byte, the begin status, then finish's */
    int succeed;     /* finish with 1 ("child") or 0 */
};

/* Role "gc_child": config text, key, scope, running_ms, go_fd, report_fd,
 * succeed (gc_spawn). */
static int gc_child_role(int argc, char **argv)
{
    if (argc != 7)
        return 99;
    struct gc_child k = {argv[1], argv[2], strtoll(argv[3], NULL, 10), atoi(argv[4]),
                         atoi(argv[5]), atoi(argv[6])};
    char b;
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, argv[0]) != CERB_OK)
        return 100;
    if (read(k.go_fd, &b, 1) != 1)
        return 101;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = k.running_ms;
    cerb_guard *g = NULL;
    cerb_status st = cerb_guard_begin(c, k.scope, k.key, strlen(k.key), &o, &g);
    b = (char)st;
    if (write(k.report_fd, &b, 1) != 1)
        return 102;
    if (st == CERB_OK) {
        if (read(k.go_fd, &b, 1) != 1) /* hold the attempt until told */
            return 103;
        st = cerb_guard_finish(g, k.succeed, "child", 5);
        b = (char)st;
        if (write(k.report_fd, &b, 1) != 1)
            return 104;
    }
    cerb_guard_free(g);
    cerb_client_close(c);
    return 0;
}

#define GC_ROLE {"gc_child", gc_child_role}

/* Start the child @k on a client of config text @cfg (guard_cfg(NULL) when
 * NULL), as role "gc_child". The caller then closes its copy of
 * k->report_fd, so that its reads see end of file when the child dies, and
 * keeps k->go_fd open until the end: a write to a child that has exited
 * must fail no assertion, nor raise SIGPIPE (which the suites leave at its
 * default, to catch a library that would). */
static pid_t gc_spawn_cfg(const struct gc_child *k, const char *cfg)
{
    char *own = cfg ? NULL : guard_cfg(NULL);
    char run[24], go[16], rep[16], ok[4];
    snprintf(run, sizeof run, "%lld", (long long)k->running_ms);
    snprintf(go, sizeof go, "%d", k->go_fd);
    snprintf(rep, sizeof rep, "%d", k->report_fd);
    snprintf(ok, sizeof ok, "%d", k->succeed);
    char *args[] = {(char *)(cfg ? cfg : own), (char *)k->key, (char *)k->scope, run, go, rep, ok,
                    NULL};
    int keep[] = {k->go_fd, k->report_fd, -1};
    pid_t pid = cerb_test_spawn_self("gc_child", args, keep);
    free(own);
    return pid;
}

static pid_t gc_spawn(const struct gc_child *k)
{
    return gc_spawn_cfg(k, NULL);
}

static void gc_pipe(int fds[2])
{
    assert_int_equal(pipe(fds), 0);
}

/* One byte from a child, within GC_CHILD_MS. */
static char gc_answer(int fd)
{
    char b;
    assert_int_equal(cerb_test_read_within(fd, &b, 1, GC_CHILD_MS), 1);
    return b;
}

static void test_guard_processes_race(void **state)
{
    (void)state;
    char *key = gc_key("proc");
    int go[GC_PROCS][2], rep[2];
    pid_t pid[GC_PROCS];
    gc_pipe(rep);
    for (int i = 0; i < GC_PROCS; i++) {
        gc_pipe(go[i]);
        struct gc_child k = {key, "proc-race", 0, go[i][0], rep[1], 1};
        pid[i] = gc_spawn(&k);
        assert_true(pid[i] > 0);
    }
    close(rep[1]);
    for (int i = 0; i < GC_PROCS; i++) /* all at once */
        assert_int_equal(write(go[i][1], "g", 1), 1);
    int ok = 0, busy = 0;
    for (int i = 0; i < GC_PROCS; i++) {
        char b = gc_answer(rep[0]);
        ok += b == CERB_OK;
        busy += b == CERB_BUSY;
    }
    assert_int_equal(ok, 1);
    assert_int_equal(busy, GC_PROCS - 1);
    for (int i = 0; i < GC_PROCS; i++) /* the winner finishes; others exited */
        (void)!write(go[i][1], "f", 1);
    assert_int_equal(gc_answer(rep[0]), CERB_OK);
    for (int i = 0; i < GC_PROCS; i++) {
        assert_int_equal(cerb_test_wait(pid[i], 10000), 0);
        close(go[i][0]);
        close(go[i][1]);
    }
    close(rep[0]);
    cerb_client *c = gc_open(NULL);
    gc_expect_duplicate(c, "proc-race", key, "child", 5);
    cerb_client_close(c);
    free(key);
}

/* ---- a crashed process: its claim blocks retries for running_ms ---- */

static void test_guard_crashed_process(void **state)
{
    (void)state;
    const int64_t running = 1500;
    char *key = gc_key("crash");
    int go[2], rep[2];
    gc_pipe(go);
    gc_pipe(rep);
    struct gc_child k = {key, "crash", running, go[0], rep[1], 1};
    int64_t t0 = cerb_test_now_ms(); /* before the child's begin: its claim ends later */
    pid_t pid = gc_spawn(&k);
    assert_true(pid > 0);
    close(rep[1]);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(gc_answer(rep[0]), CERB_OK);
    kill(pid, SIGKILL); /* mid-operation: no finish, no free */
    assert_int_equal(cerb_test_wait(pid, 10000), 128 + SIGKILL);

    cerb_client *c = gc_open(NULL);
    /* Not before running_ms: BUSY while t < t0 + running (less a margin
     * for the server's clock). */
    int tries = 0;
    while (cerb_test_now_ms() < t0 + running - 200) {
        assert_int_equal(gc_begin_status(c, "crash", key, NULL), CERB_BUSY);
        tries++;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL); /* pacing the checks, not synchronising */
    }
    assert_true(tries > 3);
    /* After it: the retry runs. */
    cerb_guard *g = NULL;
    int64_t end = cerb_test_now_ms() + running + 3000;
    cerb_status st;
    while ((st = cerb_guard_begin(c, "crash", key, strlen(key), NULL, &g)) == CERB_BUSY &&
           cerb_test_now_ms() < end) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_OK);
    assert_true(cerb_test_now_ms() >= t0 + running - 200);
    assert_int_equal(cerb_guard_finish(g, 1, "retried", 7), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "crash", key, "retried", 7);
    cerb_client_close(c);
    close(go[0]);
    close(go[1]);
    close(rep[0]);
    free(key);
}

/* ---- a paused attempt past its claim: its finish is refused ---- */

static void test_guard_paused_attempt_loses(void **state)
{
    (void)state;
    const int64_t running = 600;
    char *key = gc_key("pause");
    int go[2], rep[2];
    gc_pipe(go);
    gc_pipe(rep);
    struct gc_child k = {key, "pause", running, go[0], rep[1], 1};
    pid_t pid = gc_spawn(&k);
    assert_true(pid > 0);
    close(rep[1]);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(gc_answer(rep[0]), CERB_OK);
    cerb_client *c = gc_open(NULL);
    /* While the child runs, its claim is renewed past running_ms. */
    int64_t t_renewed = cerb_test_now_ms() + 2 * running;
    while (cerb_test_now_ms() < t_renewed) {
        assert_int_equal(gc_begin_status(c, "pause", key, NULL), CERB_BUSY);
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(cerb_test_pause_pid(pid), 0); /* SIGSTOP: renewer too */
    cerb_guard *g = NULL;
    int64_t end = cerb_test_now_ms() + running + 3000;
    cerb_status st;
    while ((st = cerb_guard_begin(c, "pause", key, strlen(key), NULL, &g)) == CERB_BUSY &&
           cerb_test_now_ms() < end) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_OK); /* the new attempt took over */
    assert_int_equal(cerb_test_resume_pid(pid), 0);
    assert_int_equal(write(go[1], "f", 1), 1); /* the old attempt finishes late */
    assert_int_equal(gc_answer(rep[0]), CERB_LOST);
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    /* The new attempt's record is untouched: still running, then its own. */
    assert_int_equal(gc_begin_status(c, "pause", key, NULL), CERB_BUSY);
    assert_int_equal(cerb_guard_finish(g, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "pause", key, "new", 3);
    cerb_client_close(c);
    close(go[0]);
    close(go[1]);
    close(rep[0]);
    free(key);
}

/* ---- keep_ms: a success keeps duplicates out that long, then not ---- */

static void test_guard_keep_expiry(void **state)
{
    (void)state;
    cerb_client *c = gc_open(NULL);
    char *key = gc_key("keep");
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = 400;
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "keep", key, strlen(key), &o, &g), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_guard_finish(g, 1, "k", 1), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "keep", key, "k", 1);
    cerb_status st;
    while ((st = gc_begin_status(c, "keep", key, NULL)) == CERB_DUPLICATE &&
           cerb_test_now_ms() < t0 + 5000) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st, CERB_OK);
    assert_true(cerb_test_now_ms() - t0 >= 350);
    cerb_client_close(c);
    free(key);
}

/* ---- results at the size limit and over it ---- */

static void test_guard_result_limit(void **state)
{
    (void)state;
    cerb_client *c = gc_open("max_result = 4096;");
    char *key = gc_key("big"), *key2 = gc_key("big2");
    unsigned char *big = malloc(4097);
    assert_non_null(big);
    for (int i = 0; i < 4097; i++)
        big[i] = (unsigned char)(i * 7);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "big", key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, big, 4097), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "max_result"));
    /* Still open: the attempt can finish within the limit. */
    assert_int_equal(cerb_guard_finish(g, 1, big, 4096), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "big", key, big, 4096);
    /* An empty result is a result too. */
    assert_int_equal(cerb_guard_begin(c, "big", key2, strlen(key2), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, "big", key2, "", 0);
    free(big);
    free(key);
    free(key2);
    cerb_client_close(c);
}

/* ---- bad input ---- */

static void test_guard_bad_input(void **state)
{
    (void)state;
    cerb_client *c = gc_open(NULL);
    cerb_guard *g = (cerb_guard *)1;
    assert_int_equal(cerb_guard_begin(c, "", "k", 1, NULL, &g), CERB_EINVAL);
    assert_null(g);
    assert_non_null(strstr(cerb_last_error(), "empty"));
    assert_int_equal(cerb_guard_begin(c, NULL, "k", 1, NULL, &g), CERB_EINVAL);
    assert_int_equal(cerb_guard_begin(c, "a\nb", "k", 1, NULL, &g), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "control"));
    char longscope[300];
    memset(longscope, 's', sizeof longscope - 1);
    longscope[sizeof longscope - 1] = '\0';
    assert_int_equal(cerb_guard_begin(c, longscope, "k", 1, NULL, &g), CERB_EINVAL);
    assert_int_equal(cerb_guard_begin(c, "s", NULL, 5, NULL, &g), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "NULL"));
    assert_int_equal(cerb_guard_begin(c, "s", "k", (size_t)CERB_GUARD_KEY_MAX + 1, NULL, &g),
                     CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "more than"));
    assert_int_equal(cerb_guard_begin(NULL, "s", "k", 1, NULL, &g), CERB_EINVAL);
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, NULL, NULL), CERB_EINVAL);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = 5;
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, &o, &g), CERB_EINVAL);
    o = (cerb_guard_opts)CERB_GUARD_OPTS_INIT;
    o.keep_ms = -2;
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, &o, &g), CERB_EINVAL);
    o = (cerb_guard_opts)CERB_GUARD_OPTS_INIT;
    o.on_unavailable = 7;
    assert_int_equal(cerb_guard_begin(c, "s", "k", 1, &o, &g), CERB_EINVAL);
    /* An empty key is a key; NULL with length 0 is that key. */
    char *scope = gc_key("emptykey");
    assert_int_equal(cerb_guard_begin(c, scope, NULL, 0, NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    free(scope);
    assert_int_equal(cerb_guard_finish(NULL, 1, NULL, 0), CERB_EINVAL);
    assert_int_equal(cerb_guard_free(NULL), CERB_OK);
    assert_null(cerb_guard_result(NULL, NULL));
    assert_int_equal(cerb_guard_degraded(NULL), 0);
    assert_string_equal(cerb_status_name(CERB_DUPLICATE), "DUPLICATE");
    cerb_client_close(c);
}

/* ---- close ends attempts left open ---- */

static void test_guard_close_ends_open_attempts(void **state)
{
    (void)state;
    cerb_client *a = gc_open(NULL), *b = gc_open(NULL);
    char *key = gc_key("close");
    cerb_guard *g = NULL, *d = NULL;
    assert_int_equal(cerb_guard_begin(a, "close", key, strlen(key), NULL, &g), CERB_OK);
    cerb_client_close(a); /* g is freed and its record deleted */
    assert_int_equal(cerb_guard_begin(b, "close", key, strlen(key), NULL, &d), CERB_OK);
    assert_int_equal(cerb_guard_finish(d, 0, NULL, 0), CERB_OK);
    cerb_guard_free(d);
    free(key);
    cerb_client_close(b);
}

/* Runs last: failed, freed and crashed attempts left nothing but claims
 * bounded by running_ms, and successes are bounded by keep_ms: once both
 * have passed, the suite has no record left on the server. */
static bool gc_no_records(void *ud)
{
    (void)ud;
    return guard_records() == 0;
}

static void test_guard_no_records_left(void **state)
{
    (void)state;
    assert_wait_until(gc_no_records, NULL, 10000);
}

#define GUARD_CASES                                                                    \
    cmocka_unit_test(test_guard_once_then_duplicate),                                  \
        cmocka_unit_test(test_guard_failure_then_retry_at_once),                       \
        cmocka_unit_test(test_guard_threads_race),                                     \
        cmocka_unit_test(test_guard_processes_race),                                   \
        cmocka_unit_test(test_guard_crashed_process),                                  \
        cmocka_unit_test(test_guard_paused_attempt_loses),                             \
        cmocka_unit_test(test_guard_keep_expiry),                                      \
        cmocka_unit_test(test_guard_result_limit),                                     \
        cmocka_unit_test(test_guard_bad_input),                                        \
        cmocka_unit_test(test_guard_close_ends_open_attempts),                         \
        cmocka_unit_test(test_guard_no_records_left)

#endif
