/*
 * test_zk_guard.c — the idempotency guard on the shared test ZooKeeper: the
 * engine-independent cases (guard_cases.h: races of threads and processes,
 * a SIGKILLed and a SIGSTOPped attempt, keep_ms, result limits, bad input,
 * no records left), and what only zk has: the layout of DESIGN §11
 * (<parent of root>/guard/<scope>/<sha256 hex>, a persistent node whose
 * data is state, token, life and result, with its token node), expiry
 * judged by the server's time (a record this client first sees when it is
 * already old), the sweeper (expired records and empty scopes removed,
 * live ones kept), a client whose ZooKeeper session expires in the middle
 * of an attempt (its claim is persistent: renewed again on the new
 * session), a token compare that a version compare alone would miss (a
 * record deleted and made again), and guard.max_result at ZooKeeper's
 * limit and over it.
 *
 * Every client of this run uses its own zk.root (/gz<pid>/locks), so the
 * records live under /gz<pid>/guard and counting them is exact on the shared
 * server; the sweeper tests that count passes open an engine on a root of
 * their own (/gzp<pid>, /gzb<pid>, /gzu<pid>), which the janitor never
 * sweeps. A janitor client, open for the whole suite, stands for the
 * long-running service whose sweeper removes records nobody asks for again
 * (records left by the suite must go, test_guard_no_records_left).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "cerberus.h"
#include "config.h"
#include "engine.h"
#include "zk_guard.h"
#include "zk_guard_impl.h"
#include "test_util.h"
#include "zk_util.h"

static char zroot[64]; /* "/gz<pid>/locks" — set in main */
static char gbase[64]; /* "/gz<pid>/guard" */

static char *guard_cfg(const char *guard_extra)
{
    char zx[128], ex[256];
    snprintf(zx, sizeof zx, "root = \"%s\";", zroot);
    snprintf(ex, sizeof ex, "guard = { keep_ms = 4000; %s };", guard_extra ? guard_extra : "");
    return cerb_test_zk_config(NULL, zx, ex);
}

static zhandle_t *raw(void)
{
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    return zh;
}

static size_t records_in(zhandle_t *zh, const char *scope_path)
{
    struct String_vector v;
    int rc;
    if (cerb_test_zk_children(zh, scope_path, &v, &rc) < 0)
        return 0;
    size_t n = (size_t)v.count;
    deallocate_String_vector(&v);
    return n;
}

static size_t guard_records(void)
{
    zhandle_t *zh = raw();
    struct String_vector scopes;
    int rc;
    size_t n = 0;
    if (cerb_test_zk_children(zh, gbase, &scopes, &rc) >= 0) {
        for (int i = 0; i < scopes.count; i++) {
            char p[512];
            snprintf(p, sizeof p, "%s/%s", gbase, scopes.data[i]);
            n += records_in(zh, p);
        }
        deallocate_String_vector(&scopes);
    }
    cerb_test_zk_close(zh);
    return n;
}

#include "guard_cases.h"

/* The record id the contract names: SHA-256 of app, scope and key, each
 * with an 8-byte big-endian length, after the tag "cerb-guard-1". */
static void record_path(const char *app, const char *scope, const void *key, size_t klen,
                        char *out, size_t n)
{
    char hex[65];
    gc_record_hex(app, scope, key, klen, hex);
    snprintf(out, n, "%s/%s/%s", gbase, scope, hex);
}

/* A node's data (malloc'd, NUL after it) and stat; NULL when missing. */
static char *get_data(zhandle_t *zh, const char *path, int *len, struct Stat *st)
{
    int cap = 2 * 1024 * 1024;
    char *buf = malloc((size_t)cap + 1);
    assert_non_null(buf);
    *len = cap;
    int rc = zoo_get(zh, path, 0, buf, len, st);
    if (rc != ZOK) {
        free(buf);
        return NULL;
    }
    if (*len < 0)
        *len = 0;
    buf[*len] = '\0';
    return buf;
}

static void test_zk_guard_layout(void **state)
{
    (void)state;
    cerb_client *c = gc_open("app = \"shop\"; running_ms = 5000;");
    char *key = gc_key("lay");
    char rp[512], tp[600];
    record_path("shop", "create-order", key, strlen(key), rp, sizeof rp);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, "create-order", key, strlen(key), NULL, &g), CERB_OK);
    zhandle_t *zh = raw();
    int len;
    struct Stat st, sst;
    char *d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    /* "R<32-char token> <running_ms>\n" */
    assert_int_equal(len, 1 + 32 + 1 + 4 + 1);
    assert_int_equal(d[0], 'R');
    assert_int_equal(d[33], ' ');
    assert_memory_equal(d + 34, "5000\n", 5);
    assert_int_equal(st.ephemeralOwner, 0); /* persistent */
    char token[33];
    memcpy(token, d + 1, 32);
    token[32] = '\0';
    free(d);
    /* Its token node, version 0 while running. */
    snprintf(tp, sizeof tp, "%s/%s", rp, token);
    assert_int_equal(zoo_exists(zh, tp, 0, &sst), ZOK);
    assert_int_equal(sst.version, 0);
    /* (The scope is a container; a Stat does not show it — the server
     * reports ephemeralOwner 0 — but the server removes it once empty:
     * test_zk_guard_sweep.) */

    const char res[] = "id=17\0\x01\x02\n";
    assert_int_equal(cerb_guard_finish(g, 1, res, sizeof res), CERB_OK);
    cerb_guard_free(g);
    d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    assert_int_equal(len, 1 + 32 + 1 + 4 + 1 + (int)sizeof res);
    assert_int_equal(d[0], 'D');
    assert_memory_equal(d + 1, token, 32);
    assert_memory_equal(d + 34, "4000\n", 5); /* keep_ms */
    assert_memory_equal(d + 39, res, sizeof res);
    free(d);
    assert_int_equal(zoo_exists(zh, tp, 0, &sst), ZOK);
    assert_int_equal(sst.version, 1); /* done */

    /* keep_ms = -1: life -1 (documented as permanent per key); the test
     * deletes it itself. */
    char *key2 = gc_key("forever");
    record_path("shop", "create-order", key2, strlen(key2), rp, sizeof rp);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = -1;
    assert_int_equal(cerb_guard_begin(c, "create-order", key2, strlen(key2), &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "f", 1), CERB_OK);
    cerb_guard_free(g);
    d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    assert_memory_equal(d + 34, "-1\nf", 4);
    memcpy(token, d + 1, 32);
    free(d);
    snprintf(tp, sizeof tp, "%s/%s", rp, token);
    assert_int_equal(zoo_delete(zh, tp, -1), ZOK);
    assert_int_equal(zoo_delete(zh, rp, -1), ZOK);

    /* A failed attempt leaves no node at all. */
    char *key3 = gc_key("fail");
    record_path("shop", "create-order", key3, strlen(key3), rp, sizeof rp);
    assert_int_equal(cerb_guard_begin(c, "create-order", key3, strlen(key3), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(zoo_exists(zh, rp, 0, &sst), ZNONODE);
    cerb_test_zk_close(zh);
    free(key);
    free(key2);
    free(key3);
    cerb_client_close(c);
}

/* Write a record as another attempt would have (state, token, life), with
 * its token node, behind the library's back. */
static void plant_node(zhandle_t *zh, const char *rp, char state, const char *token,
                       int64_t life, const char *res, bool token_node)
{
    char data[256], tp[600];
    int n = snprintf(data, sizeof data, "%c%s %lld\n%s", state, token, (long long)life,
                     res ? res : "");
    /* Its ancestors first, as containers like the engine makes them. */
    char anc[512];
    snprintf(anc, sizeof anc, "%s", rp);
    for (char *p = anc + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        zoo_create(zh, anc, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_CONTAINER, NULL, 0);
        *p = '/';
    }
    assert_int_equal(zoo_create(zh, rp, data, n, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0), ZOK);
    if (!token_node)
        return;
    snprintf(tp, sizeof tp, "%s/%s", rp, token);
    assert_int_equal(zoo_create(zh, tp, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0), ZOK);
    if (state == 'D')
        assert_int_equal(zoo_set(zh, tp, NULL, -1, 0), ZOK);
}

static void plant(zhandle_t *zh, const char *rp, char state, const char *token, int64_t life,
                  const char *res)
{
    plant_node(zh, rp, state, token, life, res, true);
}

/* The server's time: the mtime of a node made for the asking, a new one
 * each time (a delete that failed leaves no clash); -1 on any error. */
static int64_t server_ms(zhandle_t *zh)
{
    char p[96], made[128];
    struct Stat st;
    snprintf(p, sizeof p, "/cerb-test-now-%d-", (int)getpid()); /* not the guard's clock */
    if (zoo_create2(zh, p, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL, made,
                    sizeof made, &st) != ZOK)
        return -1;
    zoo_delete(zh, made, -1); /* ephemeral: gone with the session anyway */
    return st.mtime;
}

struct aged {
    zhandle_t *zh;
    int64_t mtime, life;
};

/* A record of that mtime and life has expired by the server's time, with
 * the skew the library allows: until then a sweeper that reads it rightly
 * keeps it. */
static bool aged_out(void *ud)
{
    const struct aged *a = ud;
    return cerb__zkg_expired_at(server_ms(a->zh), a->mtime, a->life);
}

/* n done-records that expired (a life of 1 ms), o0000.. in the scope at
 * sp: what a client that left behind looks like. Returns once the last one made
 * has expired by the server's time: the newest ones are otherwise still
 * live when a sweeper first reads them, and a sweeper that read a record
 * live does not read it again until it lists the scope again. */
static void plant_orphans(zhandle_t *zh, const char *sp, int n)
{
    char rp[600];
    for (int i = 0; i < n; i++) {
        snprintf(rp, sizeof rp, "%s/o%04d", sp, i);
        plant(zh, rp, 'D', "0123456789abcdef0123456789abcdef", 1, "r");
    }
    struct Stat st;
    assert_int_equal(zoo_exists(zh, rp, 0, &st), ZOK);
    struct aged a = {zh, st.mtime, 1};
    assert_wait_until(aged_out, &a, 10000);
}

/*
 * The age of a record is its mtime against the server's time. This client
 * sees the records only once they are already old: a client that counted a
 * record's life from when it first saw it (its own clock) would answer
 * BUSY / DUPLICATE here for seconds more.
 */
static void test_zk_guard_expiry_by_server_time(void **state)
{
    (void)state;
    zhandle_t *zh = raw();
    char *kr = gc_key("old-run"), *kd = gc_key("old-done"), *kl = gc_key("young");
    char *kb = gc_key("bare");
    char rr[512], rd[512], rl[512], rb[512];
    record_path("", "aged", kb, strlen(kb), rb, sizeof rb);
    record_path("", "aged", kr, strlen(kr), rr, sizeof rr);
    record_path("", "aged", kd, strlen(kd), rd, sizeof rd);
    record_path("", "aged", kl, strlen(kl), rl, sizeof rl);
    const char *t1 = "0123456789abcdef0123456789abcdef";
    const char *t2 = "fedcba9876543210fedcba9876543210";
    int64_t t0 = cerb_test_now_ms();
    plant(zh, rr, 'R', t1, 1000, NULL);  /* a crashed attempt's claim */
    plant(zh, rd, 'D', t2, 1000, "old"); /* a success kept 1 s */
    plant(zh, rl, 'R', t1, 60000, NULL); /* a claim with a minute left */
    /* A record without its token node (made by hand, or by a tool that
     * knows only the data): taken over by its version alone. */
    plant_node(zh, rb, 'R', t2, 1000, NULL, false);
    /* Let them age past their life (the server's clock runs meanwhile). */
    while (cerb_test_now_ms() < t0 + 1000 + 200 + 300)
        cerb_test_let_time_pass(50);
    cerb_client *c = gc_open(NULL); /* first sight of them: now */
    cerb_guard *g = NULL;
    int64_t t1ms = cerb_test_now_ms();
    assert_int_equal(cerb_guard_begin(c, "aged", kr, strlen(kr), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_begin(c, "aged", kd, strlen(kd), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "new", 3), CERB_OK);
    cerb_guard_free(g);
    assert_int_equal(cerb_guard_begin(c, "aged", kb, strlen(kb), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 0, NULL, 0), CERB_OK);
    cerb_guard_free(g);
    assert_true(cerb_test_now_ms() - t1ms < 1000); /* at once, not after their life */
    gc_expect_duplicate(c, "aged", kd, "new", 3);
    /* The taken-over record's old token node went with it. */
    char tp[600];
    snprintf(tp, sizeof tp, "%s/%s", rd, t2);
    assert_int_equal(zoo_exists(zh, tp, 0, NULL), ZNONODE);
    /* The young one is still running for the server. */
    assert_int_equal(gc_begin_status(c, "aged", kl, NULL), CERB_BUSY);
    snprintf(tp, sizeof tp, "%s/%s", rl, t1);
    assert_int_equal(zoo_delete(zh, tp, -1), ZOK);
    assert_int_equal(zoo_delete(zh, rl, -1), ZOK);
    cerb_test_zk_close(zh);
    cerb_client_close(c);
    free(kr);
    free(kd);
    free(kl);
    free(kb);
}

/*
 * A token compare, not a version compare: an attempt's record deleted
 * (here by hand; an expiry and a takeover do the same) and made again by
 * another attempt starts again at version 0, like the one the old attempt
 * read. The old attempt's renewals and finish must still see it is not its
 * record.
 */
static void test_zk_guard_record_made_again(void **state)
{
    (void)state;
    cerb_client *a = gc_open("running_ms = 3000;");
    char *key = gc_key("again");
    char rp[512], tp[600];
    record_path("", "again", key, strlen(key), rp, sizeof rp);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(a, "again", key, strlen(key), NULL, &g), CERB_OK);
    zhandle_t *zh = raw();
    int len;
    struct Stat st;
    char *d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    assert_int_equal(st.version, 0);
    char token[33];
    memcpy(token, d + 1, 32);
    token[32] = '\0';
    free(d);
    snprintf(tp, sizeof tp, "%s/%s", rp, token);
    assert_int_equal(zoo_delete(zh, tp, -1), ZOK);
    assert_int_equal(zoo_delete(zh, rp, -1), ZOK);
    const char *other = "00000000000000000000000000000000";
    plant(zh, rp, 'R', other, 60000, NULL); /* version 0 again */
    assert_int_equal(cerb_guard_finish(g, 1, "old", 3), CERB_LOST);
    cerb_guard_free(g);
    d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    assert_int_equal(d[0], 'R');
    assert_memory_equal(d + 1, other, 32); /* untouched */
    free(d);
    snprintf(tp, sizeof tp, "%s/%s", rp, other);
    assert_int_equal(zoo_delete(zh, tp, -1), ZOK);
    assert_int_equal(zoo_delete(zh, rp, -1), ZOK);
    cerb_test_zk_close(zh);
    free(key);
    cerb_client_close(a);
}

struct sweep_wait {
    const char *scope_path;
    size_t want;
};

static bool scope_has(void *ud)
{
    struct sweep_wait *w = ud;
    zhandle_t *zh = raw();
    size_t n = records_in(zh, w->scope_path);
    int rc = zoo_exists(zh, w->scope_path, 0, NULL);
    cerb_test_zk_close(zh);
    return w->want == 0 ? rc == ZNONODE : n == w->want;
}

#define KEEP_UP_THREADS 4
#define KEEP_UP_EACH 1250
#define KEEP_UP_LIVE 200

/* A worker making n records (begin + finish(1)), keys k<first>... */
struct keep_up {
    cerb_client *c;
    const char *scope;
    int first, n, failed;
    int64_t keep_ms;
};

static void *keep_up_worker(void *arg)
{
    struct keep_up *k = arg;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = k->keep_ms;
    for (int i = 0; i < k->n; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d", k->first + i);
        cerb_guard *g = NULL;
        if (cerb_guard_begin(k->c, k->scope, key, strlen(key), &o, &g) != CERB_OK ||
            cerb_guard_finish(g, 1, "r", 1) != CERB_OK)
            k->failed++;
        cerb_guard_free(g);
    }
    return NULL;
}

/* A node and everything under it (the guard's records are two deep). */
static void delete_tree(zhandle_t *zh, const char *path)
{
    struct String_vector v;
    int rc;
    if (cerb_test_zk_children(zh, path, &v, &rc) >= 0) {
        for (int i = 0; i < v.count; i++) {
            char child[700];
            if (snprintf(child, sizeof child, "%s/%s", path, v.data[i]) < (int)sizeof child)
                delete_tree(zh, child);
        }
        deallocate_String_vector(&v);
    }
    zoo_delete(zh, path, -1);
}

/* Records in a scope, strictly: a scope gone (swept once empty) has
 * none; any other failure to list is -1, never "none". */
static long records_strict(zhandle_t *zh, const char *scope_path)
{
    int rc;
    int n = cerb_test_zk_children(zh, scope_path, NULL, &rc);
    return rc == ZNONODE ? 0 : n;
}

/* A scope of this suite's records, and everything in it. */
static void drop_scope(const char *scope)
{
    char sp[512];
    snprintf(sp, sizeof sp, "%s/%s", gbase, scope);
    zhandle_t *zh = raw();
    delete_tree(zh, sp);
    cerb_test_zk_close(zh);
}

/*
 * The sweeper keeps up with its client's rate of begins: 5000 records that
 * expire together (a service doing 1000 begins a second leaves as many every
 * few seconds) are all gone within a pass or two, and the 200 live records
 * among them (more than a batch) all stay. It failed with a budget
 * of 256 records per pass every 5 s, about 50 a second per sweeper, fewer
 * than such a service makes: expired records piled up without bound (seen:
 * a 256 MiB ZooKeeper ran out of heap under the guard bench).
 */
static void test_zk_guard_sweep_keeps_up(void **state)
{
    (void)state;
    char *scope = gc_key("keepup");
    char sp[512];
    snprintf(sp, sizeof sp, "%s/%s", gbase, scope);
    cerb_client *a = gc_open(NULL);
    pthread_t th[KEEP_UP_THREADS + 1];
    struct keep_up ku[KEEP_UP_THREADS + 1];
    for (int i = 0; i <= KEEP_UP_THREADS; i++) {
        if (i < KEEP_UP_THREADS)
            ku[i] = (struct keep_up){a, scope, i * KEEP_UP_EACH, KEEP_UP_EACH, 0, 300};
        else /* live through the test */
            ku[i] = (struct keep_up){a, scope, i * KEEP_UP_EACH, KEEP_UP_LIVE, 0, 60000};
        assert_int_equal(pthread_create(&th[i], NULL, keep_up_worker, &ku[i]), 0);
    }
    for (int i = 0; i <= KEEP_UP_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(ku[i].failed, 0);
    }
    /* Its sweeper passes every 4 to 6 s, or sooner as records are made
     * (and the janitor's): two or three passes, and slack for a loaded
     * machine (ASan, other suites beside: 20 s was not always enough).
     * The old budget deleted at most 256 a pass per sweeper, passes at
     * least 4 s apart: at most 4096 of the 5000 in 30 s. */
    struct sweep_wait w = {sp, KEEP_UP_LIVE};
    assert_wait_until(scope_has, &w, 30000);
    /* Every live one is still there: a duplicate. */
    for (int i = 0; i < KEEP_UP_LIVE; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d", KEEP_UP_THREADS * KEEP_UP_EACH + i);
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(a, scope, key, strlen(key), NULL, &g), CERB_DUPLICATE);
        cerb_guard_free(g);
    }
    cerb_client_close(a);
    drop_scope(scope);
    free(scope);
}

/*
 * Records that expired and that nobody asks for again are deleted by the
 * sweeper of a client using the guard; a scope left empty goes too. Live
 * records (a running claim, a success kept forever) stay.
 */
static void test_zk_guard_sweep(void **state)
{
    (void)state;
    char *scope = gc_key("sweep"), *live = gc_key("sweep-live");
    char sp[512], lp[512];
    snprintf(sp, sizeof sp, "%s/%s", gbase, scope);
    snprintf(lp, sizeof lp, "%s/%s", gbase, live);
    cerb_client *a = gc_open(NULL);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.keep_ms = 300;
    for (int i = 0; i < 5; i++) {
        char k[32];
        snprintf(k, sizeof k, "k%d", i);
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(a, scope, k, strlen(k), &o, &g), CERB_OK);
        assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
        cerb_guard_free(g);
    }
    /* Live records in another scope: one running (held by a client that
     * stays open), one kept forever. */
    cerb_guard *run = NULL, *g = NULL;
    assert_int_equal(cerb_guard_begin(a, live, "run", 3, NULL, &run), CERB_OK);
    o.keep_ms = -1;
    assert_int_equal(cerb_guard_begin(a, live, "forever", 7, &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, "f", 1), CERB_OK);
    cerb_guard_free(g);
    zhandle_t *zh = raw();
    /* And one without its token node (made by hand): deleted by its
     * version alone. */
    char bp[512];
    record_path("", scope, "bare", 4, bp, sizeof bp);
    plant_node(zh, bp, 'D', "0123456789abcdef0123456789abcdef", 300, "b", false);
    assert_int_equal(records_in(zh, sp), 6);
    cerb_test_zk_close(zh);
    /* Nobody asks for them again; the sweepers (this client's, the
     * janitor's) delete them and the empty scope, in a pass or two. */
    struct sweep_wait w = {sp, 0};
    assert_wait_until(scope_has, &w, 15000);
    struct sweep_wait wl = {lp, 2};
    assert_true(scope_has(&wl));
    assert_int_equal(cerb_guard_finish(run, 0, NULL, 0), CERB_OK);
    cerb_guard_free(run);
    char rp[512], tp[33];
    record_path("", live, "forever", 7, rp, sizeof rp);
    zh = raw();
    int len;
    struct Stat st;
    char *d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    memcpy(tp, d + 1, 32);
    tp[32] = '\0';
    char tpp[700];
    snprintf(tpp, sizeof tpp, "%s/%s", rp, tp);
    free(d);
    assert_int_equal(zoo_delete(zh, tpp, -1), ZOK);
    assert_int_equal(zoo_delete(zh, rp, -1), ZOK);
    cerb_test_zk_close(zh);
    cerb_client_close(a);
    free(scope);
    free(live);
}

/*
 * Threads of several clients race to take over one expired record: the
 * takeover is conditioned on the version each of them read, so exactly one
 * claims it and the others find its new claim (BUSY).
 */
static void test_zk_guard_takeover_race(void **state)
{
    (void)state;
    zhandle_t *zh = raw();
    char *key = gc_key("takeover");
    char rp[512];
    record_path("", "race", key, strlen(key), rp, sizeof rp);
    int64_t t0 = cerb_test_now_ms();
    plant(zh, rp, 'R', "0123456789abcdef0123456789abcdef", 300, NULL);
    cerb_test_zk_close(zh);
    struct gc_race r;
    memset(&r, 0, sizeof r);
    r.key = key;
    pthread_mutex_init(&r.mu, NULL);
    pthread_barrier_init(&r.start, NULL, GC_THREADS);
    for (int i = 0; i < GC_THREADS; i++)
        r.c[i] = gc_open(NULL);
    while (cerb_test_now_ms() < t0 + 300 + 200 + 300) /* let it expire */
        cerb_test_let_time_pass(50);
    pthread_t t[GC_THREADS];
    for (int i = 0; i < GC_THREADS; i++)
        pthread_create(&t[i], NULL, gc_racer, &r);
    for (int i = 0; i < GC_THREADS; i++)
        pthread_join(t[i], NULL);
    int ok = -1;
    for (int i = 0; i < GC_THREADS; i++) {
        if (r.st[i] == CERB_OK) {
            assert_int_equal(ok, -1);
            ok = i;
        } else {
            assert_int_equal(r.st[i], CERB_BUSY);
        }
    }
    assert_true(ok >= 0);
    assert_int_equal(cerb_guard_finish(r.g[ok], 1, "taken", 5), CERB_OK);
    cerb_guard_free(r.g[ok]);
    gc_expect_duplicate(r.c[0], "race", key, "taken", 5);
    for (int i = 0; i < GC_THREADS; i++)
        cerb_client_close(r.c[i]);
    pthread_barrier_destroy(&r.start);
    pthread_mutex_destroy(&r.mu);
    free(key);
}

/* ---- a client's session expires in the middle of an attempt ---- */

/* The config text (malloc'd) of a client of this suite's root with
 * `zk_extra` in its zk section and guard.keep_ms = keep_ms. */
static char *zk_client_cfg(const char *zk_extra, int64_t keep_ms)
{
    char zx[200], ex[80];
    snprintf(zx, sizeof zx, "root = \"%s\"; %s", zroot, zk_extra);
    snprintf(ex, sizeof ex, "guard = { keep_ms = %lld; };", (long long)keep_ms);
    return cerb_test_zk_config(NULL, zx, ex);
}

/* Such a client; NULL when it cannot open. */
static cerb_client *zk_client(const char *zk_extra, int64_t keep_ms)
{
    char *cfg = zk_client_cfg(zk_extra, keep_ms);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        c = NULL;
    free(cfg);
    return c;
}

/*
 * The holder's process is stopped past its session timeout (2 s), not past
 * its claim (6 s): the server expires its session, but the record is
 * persistent, so after the process resumes its renewals go on over a new
 * session, well past the claim's first end, and its finish records the
 * success. Meanwhile every other begin is BUSY.
 */
static void test_zk_guard_session_expiry_mid_attempt(void **state)
{
    (void)state;
    const int64_t running = 6000;
    char *key = gc_key("sess");
    int go[2], rep[2];
    gc_pipe(go);
    gc_pipe(rep);
    struct gc_child k = {key, "sess", running, go[0], rep[1], 1};
    /* The child's client has a 2 s session (the suite's janitor runs
     * threads: the child is this binary again, see GC_ROLE). */
    char *cfg = zk_client_cfg("session_timeout_ms = 2000;", 4000);
    pid_t pid = gc_spawn_cfg(&k, cfg);
    free(cfg);
    assert_true(pid > 0);
    close(rep[1]);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(gc_answer(rep[0]), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    cerb_client *c = gc_open(NULL);
    assert_int_equal(cerb_test_pause_pid(pid), 0);
    while (cerb_test_now_ms() < t0 + 3500) { /* past the 2 s session */
        assert_int_equal(gc_begin_status(c, "sess", key, NULL), CERB_BUSY);
        cerb_test_let_time_pass(100);
    }
    assert_int_equal(cerb_test_resume_pid(pid), 0);
    /* Past the claim's first end and well beyond: still the child's. */
    while (cerb_test_now_ms() < t0 + running + 3000) {
        assert_int_equal(gc_begin_status(c, "sess", key, NULL), CERB_BUSY);
        cerb_test_let_time_pass(100);
    }
    assert_int_equal(write(go[1], "f", 1), 1);
    assert_int_equal(gc_answer(rep[0]), CERB_OK);
    assert_int_equal(cerb_test_wait(pid, 15000), 0);
    gc_expect_duplicate(c, "sess", key, "child", 5);
    cerb_client_close(c);
    close(go[0]);
    close(go[1]);
    close(rep[0]);
    free(key);
}

/* This process's established TCP connections to the test ZooKeeper. */
static int own_zk_connections(void)
{
    /* The inodes of our sockets, then /proc/net/tcp's rows for them. */
    unsigned long inodes[1024];
    int n_in = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n_in < 1024) {
        char p[300], t[64];
        snprintf(p, sizeof p, "/proc/self/fd/%s", de->d_name);
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k <= 0)
            continue;
        t[k] = '\0';
        unsigned long ino;
        if (sscanf(t, "socket:[%lu]", &ino) == 1)
            inodes[n_in++] = ino;
    }
    closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    assert_non_null(f);
    char line[512];
    int count = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned rport, st;
        unsigned long ino;
        if (sscanf(line, " %*d: %*x:%*x %*x:%x %x %*x:%*x %*x:%*x %*x %*u %*d %lu", &rport, &st,
                   &ino) != 3 || st != 1 || (int)rport != cerb_test_zk_port())
            continue;
        for (int i = 0; i < n_in; i++)
            count += inodes[i] == ino;
    }
    fclose(f);
    return count;
}

struct overlap_worker {
    cerb_client *c;
    const char *scope;
    int first, failed;
};

#define OVERLAP_THREADS 8
#define OVERLAP_EACH 60

static void *overlap_main(void *arg)
{
    struct overlap_worker *w = arg;
    for (int i = 0; i < OVERLAP_EACH; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d", w->first + i);
        cerb_guard *g = NULL;
        if (cerb_guard_begin(w->c, w->scope, key, strlen(key), NULL, &g) != CERB_OK ||
            cerb_guard_finish(g, 1, key, strlen(key)) != CERB_OK)
            w->failed++;
        cerb_guard_free(g);
    }
    return NULL;
}

/* Begin + finish from OVERLAP_THREADS threads of c at once; then every key
 * a duplicate with its own result (whichever session carried it). */
static void overlap_run(cerb_client *c, const char *scope)
{
    pthread_t th[OVERLAP_THREADS];
    struct overlap_worker w[OVERLAP_THREADS];
    for (int i = 0; i < OVERLAP_THREADS; i++) {
        w[i] = (struct overlap_worker){c, scope, i * OVERLAP_EACH, 0};
        assert_int_equal(pthread_create(&th[i], NULL, overlap_main, &w[i]), 0);
    }
    for (int i = 0; i < OVERLAP_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(w[i].failed, 0);
    }
    for (int i = 0; i < OVERLAP_THREADS * OVERLAP_EACH; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d", i);
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(c, scope, key, strlen(key), NULL, &g), CERB_DUPLICATE);
        size_t rl = 0;
        const void *r = cerb_guard_result(g, &rl);
        assert_int_equal(rl, strlen(key));
        assert_memory_equal(r, key, rl);
        cerb_guard_free(g);
    }
}

/* zk.guard_sessions' default: the sessions a client whose guard calls
 * overlap uses. */
#define POOL_SESSIONS 4

/*
 * The guard's extra sessions (zk.guard_sessions, default 4): a client that
 * uses the guard from one thread keeps its one connection; once its guard
 * calls overlap it opens the others and spreads them over all (8 threads:
 * one session served them at 0.80 of the raw ceiling, two at 0.75-0.83,
 * four at 0.88-1.00, in alternating runs). With
 * guard_sessions = 1 it never does. Every record is right either way.
 */
static void test_zk_guard_extra_session(void **state)
{
    (void)state;
    int base = own_zk_connections();
    cerb_client *c = gc_open(NULL);
    char *scope = gc_key("pool");
    assert_int_equal(own_zk_connections(), base + 1);
    for (int i = 0; i < 40; i++) {
        char key[32];
        snprintf(key, sizeof key, "s%d", i);
        cerb_guard *g = NULL;
        assert_int_equal(cerb_guard_begin(c, scope, key, strlen(key), NULL, &g), CERB_OK);
        assert_int_equal(cerb_guard_finish(g, 1, "r", 1), CERB_OK);
        cerb_guard_free(g);
    }
    assert_int_equal(own_zk_connections(), base + 1); /* one thread: no overlap */
    overlap_run(c, scope);
    assert_int_equal(own_zk_connections(), base + POOL_SESSIONS);
    cerb_client_close(c);
    assert_int_equal(own_zk_connections(), base);

    char *scope1 = gc_key("pool1");
    cerb_client *one = zk_client("guard_sessions = 1;", 4000);
    assert_non_null(one);
    overlap_run(one, scope1);
    assert_int_equal(own_zk_connections(), base + 1);
    cerb_client_close(one);
    assert_int_equal(own_zk_connections(), base);
    drop_scope(scope);
    drop_scope(scope1);
    free(scope);
    free(scope1);
}

/* A child's overlapping guard calls: `each` begin + finish per thread on
 * keys <prefix><n>; counts answers other than OK (UNAVAILABLE allowed
 * while sessions are replaced: *unavail) and wrong results. */
struct pool_round {
    cerb_client *c;
    const char *scope;
    int round, thread, each;
    int bad, unavail;
};

/* st is `want`; else counted as UNAVAILABLE (allowed) or as wrong. */
static bool pool_expect(struct pool_round *r, cerb_status st, cerb_status want)
{
    if (st == want)
        return true;
    if (st == CERB_UNAVAILABLE)
        r->unavail++;
    else
        r->bad++;
    return false;
}

static void *pool_round_main(void *arg)
{
    struct pool_round *r = arg;
    for (int i = 0; i < r->each; i++) {
        char key[48];
        size_t n = (size_t)snprintf(key, sizeof key, "r%d-t%d-%d", r->round, r->thread, i);
        cerb_guard *g = NULL;
        bool done = pool_expect(r, cerb_guard_begin(r->c, r->scope, key, n, NULL, &g), CERB_OK) &&
                    pool_expect(r, cerb_guard_finish(g, 1, key, n), CERB_OK);
        cerb_guard_free(g);
        if (!done)
            continue;
        /* Done: a duplicate with its own result, whichever session. */
        g = NULL;
        cerb_status st = cerb_guard_begin(r->c, r->scope, key, n, NULL, &g);
        size_t rl = 0;
        const void *res = st == CERB_DUPLICATE ? cerb_guard_result(g, &rl) : NULL;
        if (pool_expect(r, st, CERB_DUPLICATE) && (rl != n || memcmp(res, key, rl) != 0))
            r->bad++;
        cerb_guard_free(g);
    }
    return NULL;
}

/* One round of 8 threads; false when a thread could not start. */
static bool pool_round(cerb_client *c, const char *scope, int round, int each, int *bad,
                       int *unavail)
{
    pthread_t th[OVERLAP_THREADS];
    struct pool_round r[OVERLAP_THREADS];
    for (int i = 0; i < OVERLAP_THREADS; i++) {
        r[i] = (struct pool_round){c, scope, round, i, each, 0, 0};
        if (pthread_create(&th[i], NULL, pool_round_main, &r[i]) != 0)
            return false;
    }
    for (int i = 0; i < OVERLAP_THREADS; i++) {
        pthread_join(th[i], NULL);
        *bad += r[i].bad;
        *unavail += r[i].unavail;
    }
    return true;
}

/* The child of test_zk_guard_extra_session_expires, role "pool_expiry"
 * (config text, scope, go_fd, report_fd): reports its connections after
 * overlapping calls, is stopped past its sessions' timeout, then calls on
 * until new extra sessions are open (at most 40 s and 3000 rounds), and
 * reports its connections, wrong answers and UNAVAILABLEs. */
static int pool_expiry_role(int argc, char **argv)
{
    if (argc != 4)
        return 99;
    const char *scope = argv[1];
    int go_fd = atoi(argv[2]), report_fd = atoi(argv[3]);
    /* Connections held before the client's own (a role inherits none, but
     * counting them keeps the numbers the client's alone). */
    int base = own_zk_connections();
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, argv[0]) != CERB_OK)
        return 100;
    int bad = 0, unavail = 0, round = 0;
    while (own_zk_connections() < base + POOL_SESSIONS && round < 100)
        if (!pool_round(c, scope, round++, 5, &bad, &unavail))
            return 101;
    char rep[3] = {(char)(own_zk_connections() - base), (char)(bad > 127 ? 127 : bad), 0};
    if (write(report_fd, rep, 3) != 3)
        return 102;
    char b;
    if (read(go_fd, &b, 1) != 1) /* stopped and resumed meanwhile */
        return 103;
    bad = unavail = 0;
    int first = round;
    /* The old extra sessions are gone once the client's own is back and
     * only it is connected; then new ones are opened. */
    bool seen_one = false;
    int64_t end = cerb_test_now_ms() + 40000; /* tend within ~6 s, reopen 5 s later */
    while (round < first + 3000 && cerb_test_now_ms() < end) {
        if (!pool_round(c, scope, round++, 5, &bad, &unavail))
            return 104;
        int n = own_zk_connections() - base;
        seen_one = seen_one || n == 1;
        if (seen_one && n == POOL_SESSIONS)
            break;
    }
    rep[0] = (char)(own_zk_connections() - base);
    rep[1] = (char)(bad > 127 ? 127 : bad);
    rep[2] = (char)(seen_one ? 1 : 0);
    if (write(report_fd, rep, 3) != 3)
        return 105;
    cerb_client_close(c);
    return 0;
}

/*
 * The extra sessions expire (the process stopped well past its 2 s
 * timeout):
 * the client's calls go on over its own session, answered right, while the
 * sweeper closes the dead ones, and once calls overlap again new ones are
 * opened. Only UNAVAILABLE is allowed while the sessions come back.
 */
static void test_zk_guard_extra_session_expires(void **state)
{
    (void)state;
    char *scope = gc_key("pool-exp");
    int go[2], rep[2];
    gc_pipe(go);
    gc_pipe(rep);
    char *cfg = zk_client_cfg("session_timeout_ms = 2000;", 1000);
    char go_s[16], rep_s[16];
    snprintf(go_s, sizeof go_s, "%d", go[0]);
    snprintf(rep_s, sizeof rep_s, "%d", rep[1]);
    char *args[] = {cfg, scope, go_s, rep_s, NULL};
    int keep[] = {go[0], rep[1], -1};
    pid_t pid = cerb_test_spawn_self("pool_expiry", args, keep);
    free(cfg);
    assert_true(pid > 0);
    close(rep[1]);
    char r[3];
    assert_int_equal(cerb_test_read_within(rep[0], r, 3, GC_CHILD_MS), 3);
    print_message("before: %d connections, %d wrong answers\n", r[0], r[1]);
    assert_int_equal(r[0], POOL_SESSIONS);
    assert_int_equal(r[1], 0);
    assert_int_equal(cerb_test_pause_pid(pid), 0);
    /* Well past the 2 s session timeout: the server expires them all. */
    cerb_test_let_time_pass(8000);
    assert_int_equal(cerb_test_resume_pid(pid), 0);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(cerb_test_read_within(rep[0], r, 3, 60000), 3); /* its 40 s and more */
    print_message("after: %d connections, %d wrong answers, down to one first: %d\n", r[0], r[1],
                  r[2]);
    assert_int_equal(cerb_test_wait(pid, 60000), 0);
    close(go[0]);
    close(go[1]);
    close(rep[0]);
    drop_scope(scope);
    free(scope);
    assert_int_equal(r[1], 0);
    assert_int_equal(r[2], 1);
    assert_int_equal(r[0], POOL_SESSIONS);
}

/* ---- ZooKeeper's size limit ---- */

static void test_zk_guard_max_result(void **state)
{
    (void)state;
    char zx[128], ex[128];
    snprintf(zx, sizeof zx, "root = \"%s\";", zroot);
    /* Over what a node can hold: refused at open, saying why. */
    snprintf(ex, sizeof ex, "guard = { max_result = %d; };", 1024 * 1024);
    char *cfg = cerb_test_zk_config(NULL, zx, ex);
    cerb_client *c = NULL;
    assert_int_not_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    assert_null(c);
    assert_non_null(strstr(cerb_last_error(), "max_result"));
    assert_non_null(strstr(cerb_last_error(), "jute.maxbuffer"));
    free(cfg);
    /* The largest the engine accepts works, with a long scope (a long
     * path in the same request). */
    const int max = 1024 * 1024 - 16 * 1024;
    char gx[64];
    snprintf(gx, sizeof gx, "max_result = %d;", max);
    c = gc_open(gx);
    char scope[256];
    memset(scope, 's', 255);
    scope[255] = '\0';
    char *key = gc_key("max");
    unsigned char *big = malloc((size_t)max);
    assert_non_null(big);
    for (int i = 0; i < max; i++)
        big[i] = (unsigned char)(i * 13 + 7);
    cerb_guard *g = NULL;
    assert_int_equal(cerb_guard_begin(c, scope, key, strlen(key), NULL, &g), CERB_OK);
    assert_int_equal(cerb_guard_finish(g, 1, big, (size_t)max), CERB_OK);
    cerb_guard_free(g);
    gc_expect_duplicate(c, scope, key, big, (size_t)max);
    free(big);
    free(key);
    cerb_client_close(c);
}

/* A zk engine opened below the core, on the config `text` (freed). */
struct raw_engine {
    const struct cerb_engine_ops *ops;
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void engine_up(struct raw_engine *r, char *text)
{
    cerb__engines_builtin();
    r->ops = cerb__engine_find("zk");
    assert_non_null(r->ops);
    r->cfg = NULL;
    assert_int_equal(cerb__config_from_string(text, &r->cfg), CERB_OK);
    free(text);
    cerb_engine_env env = {.cfg = r->cfg};
    r->e = NULL;
    assert_int_equal(cerb__engine_open(r->ops, &env, &r->e), CERB_OK);
}

static void engine_down(struct raw_engine *r)
{
    cerb__engine_close(r->ops, r->e);
    cerb__config_free(r->cfg);
}

/* Record number i of rec's scope and token, begun and done (kept 60 s). */
static bool engine_make(struct raw_engine *r, cerb_guard_rec *rec, int i)
{
    char id[65];
    snprintf(id, sizeof id, "%064x", i);
    memcpy(rec->id, id, 64);
    cerb_grant g;
    void *res = NULL;
    size_t rl = 0;
    cerb_outcome oc;
    return cerb__engine_guard_begin(r->ops, r->e, rec, &g, &res, &rl) == CERB_OK &&
           cerb__engine_guard_finish(r->ops, r->e, rec, 1, "r", 1, 60000, &oc) == CERB_OK;
}

/*
 * The engine's methods below the core (the contract of core/engine.h),
 * with the answers that only re-sent requests see: a begin whose record is
 * already this token's claim renews it (OK, a new mtime), a finish whose
 * record is already this token's done-record is OK, and nothing of a
 * done-record is renewed or deleted by its own token.
 */
static void test_zk_guard_engine_methods(void **state)
{
    (void)state;
    struct raw_engine r;
    engine_up(&r, guard_cfg(NULL));
    const struct cerb_engine_ops *ops = r.ops;
    cerb_engine *e = r.e;

    char *scope = gc_key("eng");
    cerb_guard_rec rec = {.scope = scope, .running_ms = 5000};
    memset(rec.id, 'a', 64);
    memcpy(rec.token, "11111111111111111111111111111111", 33);
    cerb_guard_rec other = rec;
    memcpy(other.token, "22222222222222222222222222222222", 33);
    char rp[512];
    snprintf(rp, sizeof rp, "%s/%s/%s", gbase, scope, rec.id);
    zhandle_t *zh = raw();
    struct Stat st;
    int len;

    cerb_grant g;
    void *res = NULL;
    size_t rl = 0;
    cerb_guard_found found;
    assert_int_equal(cerb__engine_guard_begin(ops, e, &rec, &g, &res, &rl), CERB_OK);
    assert_int_equal(g.ttl_ms, 5000);
    free(get_data(zh, rp, &len, &st));
    int64_t m0 = st.mtime;
    int v0 = st.version;
    /* Sent again (its answer was lost): our claim, renewed. */
    cerb_test_let_time_pass(20);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &rec, &g, &res, &rl), CERB_OK);
    free(get_data(zh, rp, &len, &st));
    assert_true(st.version > v0);
    assert_true(st.mtime >= m0);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &other, &g, &res, &rl), CERB_BUSY);
    assert_int_equal(cerb__engine_guard_check(ops, e, &rec, &found), CERB_OK);
    assert_int_equal(found, CERB_GUARD_FOUND_RUNNING);
    assert_int_equal(cerb__engine_guard_check(ops, e, &other, &found), CERB_OK);
    assert_int_equal(found, CERB_GUARD_FOUND_OTHER);
    assert_int_equal(cerb__engine_guard_renew(ops, e, &rec, &g), CERB_OK);
    assert_int_equal(cerb__engine_guard_renew(ops, e, &other, &g), CERB_NOT_OWNER);
    cerb_outcome oc;
    assert_int_equal(cerb__engine_guard_finish(ops, e, &other, 1, "x", 1, 1000, &oc),
                     CERB_NOT_OWNER);
    assert_int_equal(oc, CERB_OUTCOME_NO);
    assert_int_equal(cerb__engine_guard_finish(ops, e, &other, 0, NULL, 0, 1000, &oc),
                     CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_guard_finish(ops, e, &rec, 1, "r\0s", 3, 60000, &oc), CERB_OK);
    /* Sent again: already done by this token. */
    assert_int_equal(cerb__engine_guard_finish(ops, e, &rec, 1, "r\0s", 3, 60000, &oc), CERB_OK);
    assert_int_equal(cerb__engine_guard_check(ops, e, &rec, &found), CERB_OK);
    assert_int_equal(found, CERB_GUARD_FOUND_DONE);
    /* A done-record is neither renewed nor deleted, even by its token. */
    assert_int_equal(cerb__engine_guard_renew(ops, e, &rec, &g), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_guard_finish(ops, e, &rec, 0, NULL, 0, 0, &oc), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_guard_begin(ops, e, &other, &g, &res, &rl), CERB_DUPLICATE);
    assert_int_equal(rl, 3);
    assert_memory_equal(res, "r\0s", 3);
    assert_int_equal(((char *)res)[3], '\0');
    cerb__free(res);
    char *d = get_data(zh, rp, &len, &st);
    assert_non_null(d);
    assert_int_equal(d[0], 'D');
    free(d);
    char tp[600];
    snprintf(tp, sizeof tp, "%s/%s", rp, rec.token);
    assert_int_equal(zoo_delete(zh, tp, -1), ZOK);
    assert_int_equal(zoo_delete(zh, rp, -1), ZOK);
    assert_int_equal(cerb__engine_guard_check(ops, e, &rec, &found), CERB_OK);
    assert_int_equal(found, CERB_GUARD_FOUND_NONE);
    cerb_test_zk_close(zh);
    engine_down(&r);
    free(scope);
}

/*
 * A pass reads on from the last listing while it is fresh, instead of
 * listing the scopes again: a client that makes records fast brings its
 * passes forward (one per 1 024 made), and each listed the whole scope,
 * live records and all (a second-long guard bench at 8 threads listed
 * some 50 000 names a pass, which cost its begins about 5 % of the
 * server's time). Here one client makes records kept a minute until its
 * sweeper has made three passes: the old sweeper listed on every one.
 * Nothing is deleted (all live).
 */
#define REUSE_MAX 8192

static void test_zk_guard_sweep_reuses_listing(void **state)
{
    (void)state;
    struct raw_engine r;
    engine_up(&r, guard_cfg(NULL));
    /* A listing serves a minute here, not 5 s: passes 5 s apart on a slow
     * machine (5 ms a record) would list again whatever the code. */
    cerb__zk_guard_sweep_tune(r.e, 60000, 0);
    char *scope = gc_key("reuse");
    cerb_guard_rec rec = {.scope = scope, .running_ms = 60000};
    memcpy(rec.token, "33333333333333333333333333333333", 33);
    uint64_t passes = 0, listings = 0, relists = 0;
    int made = 0;
    for (; made < REUSE_MAX && passes < 3; made++) {
        assert_true(engine_make(&r, &rec, made));
        cerb__zk_guard_sweep_counts(r.e, &passes, &listings, &relists);
    }
    print_message("%d records made: %" PRIu64 " passes, %" PRIu64 " listings\n", made, passes,
                  listings);
    char sp[512];
    snprintf(sp, sizeof sp, "%s/%s", gbase, scope);
    zhandle_t *zh = raw();
    size_t kept = records_in(zh, sp);
    cerb_test_zk_close(zh);
    engine_down(&r);
    drop_scope(scope); /* first: a failure here must not fail the suite's leak check */
    free(scope);
    assert_true(passes >= 3);
    assert_true(listings >= 1);
    assert_true(listings < passes);
    assert_int_equal(kept, made);
}

/* A root of the test's own, /gz<tag><pid> (the suite's janitor never
 * sweeps there), with n orphans planted in scope orph and an engine open
 * on it. Fills top (to delete at the end, after engine_down) and op (the
 * orphans' scope path); answers the raw handle. */
static zhandle_t *orphan_engine(struct raw_engine *r, const char *tag, const char *orph, int n,
                                char top[64], char op[512])
{
    char root[80], zx[128];
    snprintf(top, 64, "/gz%s%d", tag, (int)getpid());
    snprintf(root, sizeof root, "%s/locks", top);
    snprintf(op, 512, "%s/guard/%s", top, orph);
    zhandle_t *zh = raw();
    plant_orphans(zh, op, n);
    snprintf(zx, sizeof zx, "root = \"%s\";", root);
    engine_up(r, cerb_test_zk_config(NULL, zx, "guard = { keep_ms = 4000; };"));
    return zh;
}

/*
 * A client pays for its records while it makes them, not only every few
 * seconds: clients that live a few seconds each (a job per process, a
 * restart, `cerberus once`) otherwise made records and closed before their
 * sweeper's first pass, so each one left its records to the next, which
 * closed as early: a benchmark of 5-second processes left 280 000 nodes,
 * none ever deleted, until ZooKeeper ran out of heap. Here 1 500 expired
 * records (a client that left) must be gone once a new client has made
 * 4 096 of its own in another scope: every 1 024 it makes bring a pass
 * forward, which reads 256 plus twice as many as were made. The old
 * sweeper's passes came 4 to 6 s apart whatever the client made, reading
 * 256 each. The test waits for a pass after every 1 024 records, so it
 * checks what the passes read, not whether the sweeper thread kept pace
 * with the client's threads on a loaded machine: as a race between them it
 * failed in CI (736 left). Under a root of its own, where the suite's
 * janitor client never sweeps.
 */
#define PAY_ORPHANS 1500
#define PAY_CHUNK 1024
#define PAY_MAX 4096

struct pass_wait {
    cerb_engine *e;
    uint64_t after;
};

/* The passes e's sweeper finished. */
static uint64_t sweep_passes(cerb_engine *e)
{
    uint64_t passes, listings, relists;
    cerb__zk_guard_sweep_counts(e, &passes, &listings, &relists);
    return passes;
}

/* The sweeper finished a pass since it had done `after`. */
static bool pass_done(void *ud)
{
    const struct pass_wait *w = ud;
    return sweep_passes(w->e) > w->after;
}

static void test_zk_guard_short_lived_clients_pay_as_they_go(void **state)
{
    (void)state;
    char *orph = gc_key("orphans"), *fresh = gc_key("fresh");
    char top[64], op[512];
    struct raw_engine r;
    zhandle_t *zh = orphan_engine(&r, "p", orph, PAY_ORPHANS, top, op);
    cerb_guard_rec rec = {.scope = fresh, .running_ms = 60000};
    memcpy(rec.token, "55555555555555555555555555555555", 33);
    int made = 0, failed = 0;
    long left = records_strict(zh, op);
    bool passed = true;
    while (made < PAY_MAX && left != 0 && passed) {
        struct pass_wait w = {r.e, sweep_passes(r.e)};
        for (int i = 0; i < PAY_CHUNK; i++, made++)
            failed += !engine_make(&r, &rec, made);
        /* Bounded: a pass is due at once; 15 s only guards a hang. */
        passed = wait_until(pass_done, &w, 15000);
        left = records_strict(zh, op);
    }
    print_message("orphans left %ld after the new client made %d records\n", left, made);
    engine_down(&r);
    delete_tree(zh, top);
    cerb_test_zk_close(zh);
    free(orph);
    free(fresh);
    assert_true(passed);
    assert_int_equal(failed, 0);
    assert_int_equal(left, 0);
}

/*
 * A backlog of expired records bigger than the listing's window, beside a
 * scope of live records, is cleared as fast as when every pass listed:
 * a window that runs out while its records are expiring is listed again at
 * once. Found by review of the first listing cache: the live scope's
 * unread names kept the listing fresh, so the backlog went one window per
 * listing's age (16 000 orphans took twice as long). Here the window is
 * 512 names and a listing would serve a minute: 1 200 orphans must go
 * while this client makes at most 3 584 records (a pass every 1 024 made,
 * each reading 256 + twice as many as made). The first cache left 688
 * after 7 168. The records sit under a root of their own, where the
 * suite's janitor client (whose sweeper would clear them too, given time)
 * never looks.
 */
#define BACKLOG_ORPHANS 1200
#define BACKLOG_MAX 3584

static void test_zk_guard_sweep_backlog_beyond_window(void **state)
{
    (void)state;
    char *orph = gc_key("backlog"), *live = gc_key("backlog-live");
    char top[64], op[512];
    struct raw_engine r;
    zhandle_t *zh = orphan_engine(&r, "b", orph, BACKLOG_ORPHANS, top, op);
    cerb__zk_guard_sweep_tune(r.e, 60000, 512);
    cerb_guard_rec rec = {.scope = live, .running_ms = 60000};
    memcpy(rec.token, "44444444444444444444444444444444", 33);
    int made = 0, failed = 0;
    long left = -1;
    for (; made < BACKLOG_MAX * 2; made++) {
        if (made % 64 == 0 && (left = records_strict(zh, op)) == 0)
            break;
        failed += !engine_make(&r, &rec, made);
    }
    uint64_t passes, listings, relists;
    cerb__zk_guard_sweep_counts(r.e, &passes, &listings, &relists);
    print_message("backlog: %ld left after %d records made (%" PRIu64 " passes, %" PRIu64
                  " listings, %" PRIu64 " scope re-listings)\n", left, made, passes, listings,
                  relists);
    engine_down(&r);
    delete_tree(zh, top);
    cerb_test_zk_close(zh);
    free(orph);
    free(live);
    assert_int_equal(failed, 0);
    assert_int_equal(left, 0);
    assert_true(made <= BACKLOG_MAX);
    /* The backlog's scope alone was listed again, not every scope: a
     * listing of all of them on each drained window brought back the cost
     * of listing the live one (a8f18dd). */
    assert_true(relists >= 1);
    assert_true(listings <= 2);
}

/*
 * A batch the sweeper could not judge is read again by the next pass to
 * reach its scope. Found by rereading the listing cache after the
 * pay-as-they-go test failed in CI: the window's names were passed over as
 * the batch was made, so such a batch's names waited for the next listing
 * (5 s, or a minute here) while every pass in between read on past them.
 * The fault: the guard's clock node is made read-only, so the first pass
 * reads its first batch and then cannot read the server's time. 200
 * orphans and one live record share a scope, so that batch is theirs. They
 * must all go before the sweeper lists again: the old code read from name
 * 32 on and left the first 32 for the next listing. Passes are brought
 * forward by records made in another scope (not in the listing), and up to
 * three are allowed, so one slow request in the next pass does not fail it.
 */
#define UNANSWERED_ORPHANS 200

struct cleared_wait {
    zhandle_t *zh;
    const char *scope_path;
    struct pass_wait passes;
};

/* Only the live record is left, or three more passes came. */
static bool cleared_or_passes(void *ud)
{
    struct cleared_wait *w = ud;
    return records_strict(w->zh, w->scope_path) == 1 || pass_done(&w->passes);
}

static void test_zk_guard_sweep_rereads_unanswered_batch(void **state)
{
    (void)state;
    char *orph = gc_key("unanswered");
    char top[64], op[512], clock[96];
    struct raw_engine r;
    zhandle_t *zh = orphan_engine(&r, "u", orph, UNANSWERED_ORPHANS, top, op);
    /* Before the first begin: the engine makes its clock node when it
     * first reads the server's time. ADMIN lets this session make it
     * writable again below. */
    snprintf(clock, sizeof clock, "%s/%s", top, ZK_GUARD_CLOCK_NODE);
    struct ACL ro = {ZOO_PERM_READ | ZOO_PERM_ADMIN, ZOO_ANYONE_ID_UNSAFE};
    struct ACL_vector ro_acl = {1, &ro};
    assert_int_equal(zoo_create(zh, clock, NULL, -1, &ro_acl, 0, NULL, 0), ZOK);
    cerb__zk_guard_sweep_tune(r.e, 60000, 0); /* one listing serves the test */
    cerb_guard_rec rec = {.scope = orph, .running_ms = 60000};
    memcpy(rec.token, "66666666666666666666666666666666", 33);
    int made = 0, failed = !engine_make(&r, &rec, made++); /* starts the sweeper */
    struct pass_wait w = {r.e, 0};
    bool first = wait_until(pass_done, &w, 15000); /* the first pass: within 5 s */
    long after_fault = records_strict(zh, op);
    assert_int_equal(zoo_set_acl(zh, clock, -1, &ZOO_OPEN_ACL_UNSAFE), ZOK);
    cerb_guard_rec other = rec;
    other.scope = "unanswered-other";
    struct cleared_wait cw = {zh, op, {r.e, sweep_passes(r.e) + 2}};
    bool ended = false;
    for (int i = 0; i < 2 * PAY_MAX && !ended; i++) {
        failed += !engine_make(&r, &other, made++);
        ended = i % 32 == 31 && cleared_or_passes(&cw);
    }
    ended = ended || wait_until(cleared_or_passes, &cw, 15000);
    long left = records_strict(zh, op);
    uint64_t passes, listings, relists;
    cerb__zk_guard_sweep_counts(r.e, &passes, &listings, &relists);
    print_message("unanswered batch: %ld orphans after the fault, %ld left (%" PRIu64
                  " passes, %" PRIu64 " listings)\n", after_fault, left, passes, listings);
    engine_down(&r);
    delete_tree(zh, top);
    cerb_test_zk_close(zh);
    free(orph);
    assert_int_equal(failed, 0);
    assert_true(first && ended);
    assert_int_equal(after_fault, UNANSWERED_ORPHANS + 1); /* the fault did stop the pass */
    assert_int_equal(left, 1); /* the live record */
    assert_int_equal(listings, 1); /* gone before the sweeper listed again */
}

static cerb_client *janitor;

static int setup(void **state)
{
    (void)state;
    /* The long-running service: its begin starts its engine's sweeper. */
    janitor = gc_open(NULL);
    cerb_guard *g = NULL;
    if (cerb_guard_begin(janitor, "janitor", "start", 5, NULL, &g) != CERB_OK)
        return -1;
    cerb_guard_finish(g, 0, NULL, 0);
    cerb_guard_free(g);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cerb_client_close(janitor);
    return 0;
}

/* The children of this suite, started by cerb_test_spawn_self(). */
static const struct cerb_test_role roles[] = {
    GC_ROLE,
    {"pool_expiry", pool_expiry_role},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb_test_debug_aids(); /* CERB_TEST_FILTER, CERB_TEST_DEBUG */
    snprintf(zroot, sizeof zroot, "/gz%ld/locks", (long)getpid());
    snprintf(gbase, sizeof gbase, "/gz%ld/guard", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zk_guard_layout),
        cmocka_unit_test(test_zk_guard_engine_methods),
        cmocka_unit_test(test_zk_guard_expiry_by_server_time),
        cmocka_unit_test(test_zk_guard_record_made_again),
        cmocka_unit_test(test_zk_guard_sweep),
        cmocka_unit_test(test_zk_guard_sweep_keeps_up),
        cmocka_unit_test(test_zk_guard_short_lived_clients_pay_as_they_go),
        cmocka_unit_test(test_zk_guard_sweep_reuses_listing),
        cmocka_unit_test(test_zk_guard_sweep_backlog_beyond_window),
        cmocka_unit_test(test_zk_guard_sweep_rereads_unanswered_batch),
        cmocka_unit_test(test_zk_guard_takeover_race),
        cmocka_unit_test(test_zk_guard_session_expiry_mid_attempt),
        cmocka_unit_test(test_zk_guard_max_result),
        cmocka_unit_test(test_zk_guard_extra_session),
        cmocka_unit_test(test_zk_guard_extra_session_expires),
        GUARD_CASES,
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
