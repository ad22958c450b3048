/*
 * test_mysql.c — the mysql engine on the test MariaDB (shared fixture):
 *
 *   mapping       mysql.key = "dl" on known vectors, derived from
 *                 DistributedLock's C# (MySqlDistributedLock.ComputeHash and
 *                 ToSafeName) by an independent Python transcription:
 *                 SHA-512, first 20 bytes read as a little-endian integer,
 *                 5-bit groups from bit 0 into "a-z2-7", prefixed by the first
 *                 32 characters of the lowercased name —
 *                   n = int.from_bytes(sha512(name).digest()[:20], 'little')
 *                   ''.join(A[(n >> 5*i) & 31] for i in range(32))
 *                 and "raw" (64 characters at most, UTF-8 only).
 *   eval_order    what the engine's statements rely on, asked of the server
 *                 directly: GET_LOCK last in the grant's WHERE is evaluated
 *                 once on a free row and not at all on a leased or missing
 *                 one; RELEASE_LOCK in the release's WHERE is not reached
 *                 for another owner's row.
 *   interop       a raw session's GET_LOCK on the mapped name makes trylock
 *                 BUSY, a Cerberus hold makes the raw GET_LOCK(name, 0)
 *                 return 0, and after the unlock nothing is left stacked.
 *   round_trips   an uncontended release and grant are 2 statements executed
 *                 by the engine's session (performance_schema, per thread),
 *                 fences honour a floor; check_owner, held, probe, a
 *                 batch renewal with one hold gone, the release of a hold
 *                 whose session was killed frees its row, and the same
 *                 token asking again after its session died is granted
 *                 without waiting out its own lease.
 *   injection     names with SQL, quotes, backslashes and bytes >= 0x80 lock
 *                 and unlock, exclude, and leave the table intact.
 *   fences        strictly increasing across two clients.
 *   inspect       waiters are listed in the order they came (not by
 *                 connection id), the first is the next holder under the
 *                 same owner string, and a raw GET_LOCK without a row is
 *                 listed as the holder.
 *   queue_first   the first contended acquisition of a name costs two
 *                 acquire calls (the try, then the wait), later ones one
 *                 (they queue at once) with one wake-up each; a wait that
 *                 finds the name free is no wake-up, and the next grant of
 *                 the free name is one statement again.
 *   renewals_keep_up  8 threads take 10 000 new names back to back (1 000
 *                 under ThreadSanitizer) with a 3 s lease on the default
 *                 pool: every hold is still valid a lease later (renewals
 *                 keep up with the grants beside them).
 *   killed_holder KILL CONNECTION of the holder's session: its next renewal
 *                 fails and its lost callback fires, while a waiter gets the
 *                 lock only once the row's lease has run out on the server.
 *   hung_holder   a holder process paused (SIGSTOP) with its session up and
 *                 a 1 s lease: a waiter ends the hung session (KILL
 *                 CONNECTION, the holder's lease having run out on the
 *                 server) and gets the lock after about a second; the
 *                 resumed holder's lost callback fires.
 *   open_errors   a missing database (names `cerberus init`), lease mode,
 *                 a long raw name, a password file (and a wrong password
 *                 never printed).
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
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "mysql_util.h"
#include "test_util.h"

/* engine_mysql/my_key.c (its header needs the engine's own includes). */
cerb_status cerb__my_lname(const char *mode, const char *name, char *out, size_t len);

static char *lname_of(const char *mode, const char *name)
{
    static char buf[300];
    if (cerb__my_lname(mode, name, buf, sizeof buf) != CERB_OK)
        return NULL;
    return buf;
}

static void test_mapping(void **state)
{
    (void)state;
    static const char *const v[][2] = {
        {"orders", "orders"},
        {"Orders", "orders7col6v7a2vpxbxbpw2bcg5rzsgfwgenc"},
        {"MyLock", "mylock6isuyjwnkexb4ujf4m7j37hstmoxe3vx"},
        {"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},
        {"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxgkd2zq6c6ey6mhs45clqg7vij6ycgo43"},
        {"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaazjtmtbxsbtseumikadwrqtd4unq6kauj"},
        {"job:Nightly-Report/2024", "job:nightly-report/20243mpkz3ry5cg4zh6a26jatfiypttkos5w"},
        {"cerberus.test.Name_With_Upper",
         "cerberus.test.name_with_uppernr7veb5znrsdc6uyfyd5sncgyewh46ru"},
        /* Not ASCII: always hashed here, the prefix stopping at the first
         * byte >= 0x80 (DistributedLock would keep "café" as is). */
        {"caf\xc3\xa9", "cafmihz27z4ti4cjyfppack23hxv73piwnp"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        const char *got = lname_of("dl", v[i][0]);
        assert_non_null(got);
        assert_string_equal(got, v[i][1]);
        assert_true(strlen(got) <= 64);
    }
    assert_string_equal(lname_of("raw", "Orders"), "Orders");
    assert_non_null(lname_of("raw", v[3][0]));          /* 64 characters */
    assert_null(lname_of("raw", v[4][0]));              /* 65 */
    assert_null(lname_of("raw", "bin\xff\xfe"));        /* not UTF-8 */
    /* 64 two-byte characters are 64 characters. */
    char wide[200] = "";
    for (int i = 0; i < 64; i++)
        strcat(wide, "\xc3\xa9");
    assert_non_null(lname_of("raw", wide));
}

/* ---- raw SQL ---- */

static MYSQL *raw(void)
{
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    return my;
}

static int64_t q1(MYSQL *my, const char *sql)
{
    int64_t v = -2;
    assert_int_equal(mysql_test_exec(my, sql, &v), 0);
    return v;
}

static int64_t q1s(MYSQL *my, const char *sql, const char *val)
{
    int64_t v = -2;
    assert_int_equal(mysql_test_exec1(my, sql, val, &v), 0);
    return v;
}

static void test_eval_order(void **state)
{
    (void)state;
    MYSQL *my = raw();
    char *name = test_name("evalorder");
    char sql[1024];
    /* A free row: GET_LOCK runs once (one RELEASE_LOCK frees it). */
    q1s(my, "INSERT IGNORE INTO cerberus_lock (name, lname) VALUES (?, ?)", name);
    snprintf(sql, sizeof sql,
             "UPDATE cerberus_lock SET fence = LAST_INSERT_ID(GREATEST(fence + 1, 1)), "
             "owner = 'x', owner_conn = CONNECTION_ID(), lease_until = UTC_TIMESTAMP(6) + "
             "INTERVAL 60000000 MICROSECOND WHERE name = ? AND (owner IS NULL OR lease_until <= "
             "UTC_TIMESTAMP(6)) AND GET_LOCK(?, 0) = 1");
    assert_int_equal(q1s(my, sql, name), 1);
    assert_int_equal(q1s(my, "SELECT RELEASE_LOCK(?)", name), 1);
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", name), 1);
    /* A leased row: GET_LOCK not evaluated. */
    assert_int_equal(q1s(my, sql, name), 0);
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", name), 1);
    /* A missing row: not evaluated either. */
    char *missing = test_name("evalorder-missing");
    assert_int_equal(q1s(my, sql, missing), 0);
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", missing), 1);
    /* The release's RELEASE_LOCK is not reached for another owner's row. */
    assert_int_equal(q1s(my, "SELECT GET_LOCK(?, 0)", name), 1);
    assert_int_equal(q1s(my,
                         "UPDATE cerberus_lock SET owner = NULL WHERE name = ? AND owner = "
                         "'not-x' AND IFNULL(RELEASE_LOCK(?), 0) >= 0",
                         name),
                     0);
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", name), 1);
    assert_int_equal(q1s(my,
                         "UPDATE cerberus_lock SET owner = NULL WHERE name = ? AND owner = "
                         "'x' AND IFNULL(RELEASE_LOCK(?), 0) >= 0",
                         name),
                     1);
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", name), 1);
    free(missing);
    free(name);
    mysql_close(my);
}

/* A waiting acquire on a thread of its own (holds are per thread: it
 * unlocks what it got before it ends). */
struct waiter {
    struct cerb_lock *l;
    cerb_status st, unlock_st;
    int64_t granted_ms;
    uint64_t fence;
};

static void *wait_thread(void *ud)
{
    struct waiter *w = ud;
    w->st = cerb_lock_trylock_for(w->l, 20000);
    w->granted_ms = cerb_test_now_ms();
    if (w->st == CERB_OK) {
        w->fence = cerb_lock_fencing_token(w->l);
        w->unlock_st = cerb_lock_unlock(w->l);
    }
    return NULL;
}

static struct cerb_client *open_client(const char *my_extra, const char *extra)
{
    char *text = mysql_test_config(my_extra, extra);
    struct cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    return c;
}

static void test_interop(void **state)
{
    (void)state;
    struct cerb_client *c = open_client(NULL, NULL);
    MYSQL *my = raw();
    char *name = test_name("Interop"); /* uppercase: hashed */
    const char *ln = lname_of("dl", name);
    assert_non_null(ln);
    char lname[300];
    snprintf(lname, sizeof lname, "%s", ln);
    struct cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);

    /* Someone else's GET_LOCK (DistributedLock's, say) keeps us out. */
    assert_int_equal(q1s(my, "SELECT GET_LOCK(?, 0)", lname), 1);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock_for(l, 300), CERB_TIMEOUT);
    assert_int_equal(q1s(my, "SELECT RELEASE_LOCK(?)", lname), 1);

    /* Ours keeps them out. */
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(q1s(my, "SELECT GET_LOCK(?, 0)", lname), 0);
    assert_int_equal(mysql_test_records(name), 1);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    /* Nothing left stacked: free at once, for anyone. */
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", lname), 1);
    assert_int_equal(q1s(my, "SELECT GET_LOCK(?, 0)", lname), 1);
    assert_int_equal(q1s(my, "SELECT RELEASE_LOCK(?)", lname), 1);
    assert_int_equal(mysql_test_records(name), 0);

    /* A raw holder's release wakes a waiting Cerberus acquire at once. */
    assert_int_equal(q1s(my, "SELECT GET_LOCK(?, 0)", lname), 1);
    struct waiter w = {.l = l, .st = CERB_EIO};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_thread, &w), 0);
    cerb_test_let_time_pass(500);
    int64_t released = cerb_test_now_ms();
    assert_int_equal(q1s(my, "SELECT RELEASE_LOCK(?)", lname), 1);
    pthread_join(th, NULL);
    assert_int_equal(w.st, CERB_OK);
    print_message("woken %lld ms after the release\n", (long long)(w.granted_ms - released));
    assert_true(w.granted_ms - released < 1000);
    assert_int_equal(w.unlock_st, CERB_OK);
    free(name);
    cerb_lock_free(l);
    mysql_close(my);
    cerb_client_close(c);
}

/* ---- the engine table itself ---- */

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
    const struct cerb_engine_ops *ops;
};

static void on_event(void *ud, cerb_engine_event ev, const char *name, const char *token)
{
    (void)ud, (void)ev, (void)name, (void)token;
}

static void eng_open(struct eng *g, const char *my_extra)
{
    memset(g, 0, sizeof *g);
    cerb__engines_builtin();
    g->ops = cerb__engine_find("mysql");
    assert_non_null(g->ops);
    char *text = mysql_test_config(my_extra, NULL);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = on_event, .ud = g};
    if (cerb__engine_open(g->ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(g->ops, g->e);
    cerb__config_free(g->cfg);
}

struct hold {
    cerb_engine_lock lk;
    char priv[1024];
};

static void hold_init(struct hold *h, const char *name, int tok)
{
    memset(h, 0, sizeof *h);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", tok);
    h->lk.lease_ms = 10000;
    h->lk.priv = h->priv;
    h->lk.epoch = -1;
}

/* Statements the session with connection id `conn` has executed
 * (COM_STMT_EXECUTE), from performance_schema: other clients of the shared
 * server do not count. */
static int64_t executes(MYSQL *my, int64_t conn)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT IFNULL(SUM(e.COUNT_STAR), 0) FROM "
             "performance_schema.events_statements_summary_by_thread_by_event_name e JOIN "
             "performance_schema.threads t USING (THREAD_ID) WHERE t.PROCESSLIST_ID = %lld AND "
             "e.EVENT_NAME = 'statement/com/Execute'",
             (long long)conn);
    int64_t v = q1(my, sql);
    assert_true(v >= 0);
    return v;
}

static void test_round_trips(void **state)
{
    (void)state;
    struct eng g;
    eng_open(&g, NULL);
    assert_true(g.ops->lock_priv_size <= sizeof(((struct hold *)0)->priv));
    MYSQL *my = raw();
    char *name = test_name("roundtrips");
    struct hold h;
    cerb_grant gr;
    hold_init(&h, name, 7);
    /* First grant of a name: its row is made. */
    memset(&gr, 0, sizeof gr);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(gr.fence, 1);
    assert_int_equal(cerb__engine_release(g.ops, g.e, &h.lk), CERB_OK);
    /* Then: one statement to release, one to grant, on the one session
     * the engine has (it opened one; nothing else runs here), every
     * round. */
    int64_t best = INT64_MAX;
    uint64_t last = gr.fence;
    for (int round = 0; round < 3; round++) {
        hold_init(&h, name, 8 + round);
        memset(&gr, 0, sizeof gr);
        assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
        int64_t c = q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name);
        int64_t a = executes(my, c);
        assert_int_equal(cerb__engine_release(g.ops, g.e, &h.lk), CERB_OK);
        hold_init(&h, name, 18 + round);
        assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
        assert_true(gr.fence > last);
        last = gr.fence;
        /* The same session granted again (one session in the pool). */
        assert_int_equal(q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name), c);
        int64_t d = executes(my, c) - a;
        assert_int_equal(cerb__engine_release(g.ops, g.e, &h.lk), CERB_OK);
        assert_int_equal(d, 2);
        if (d < best)
            best = d;
    }
    print_message("uncontended release + grant: %lld statements\n", (long long)best);
    assert_int_equal(best, 2);
    /* No GET_LOCK left behind by the engine's sessions. */
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", name), 1);

    /* A floor: the grant ranks above it, and so does the next one. */
    hold_init(&h, name, 20);
    h.lk.fence_floor = 5000;
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(gr.fence, 5001);
    /* check_owner sees it; a second holder is refused; renew keeps it. */
    cerb_grant cg;
    memset(&cg, 0, sizeof cg);
    assert_int_equal(cerb__engine_check_owner(g.ops, g.e, &h.lk, &cg), CERB_OK);
    assert_int_equal(cg.fence, 5001);
    struct hold h2;
    hold_init(&h2, name, 21);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h2.lk, 0, NULL, &gr), CERB_BUSY);
    assert_int_equal(cerb__engine_held(g.ops, g.e, name, CERB_PRIM_MUTEX), CERB_BUSY);
    assert_int_equal(cerb__engine_renew(g.ops, g.e, &h.lk, &cg), CERB_OK);
    assert_int_equal(cg.fence, 5001);
    /* A batch of three names on one engine, one of them gone. */
    char *n2 = test_name("roundtrips-b"), *n3 = test_name("roundtrips-c");
    struct hold hb, hc;
    hold_init(&hb, n2, 30);
    hold_init(&hc, n3, 31);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &hb.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &hc.lk, 0, NULL, &gr), CERB_OK);
    q1s(my, "UPDATE cerberus_lock SET owner = 'someone else' WHERE name = ?", n3);
    cerb_renew_item items[3] = {{.lk = &h.lk}, {.lk = &hb.lk}, {.lk = &hc.lk}};
    cerb__engine_renew_batch(g.ops, g.e, items, 3);
    assert_int_equal(items[0].st, CERB_OK);
    assert_int_equal(items[1].st, CERB_OK);
    assert_int_equal(items[2].st, CERB_NOT_OWNER);
    /* The lost one gave its GET_LOCK back. */
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", lname_of("dl", n3)), 1);
    assert_int_equal(cerb__engine_release(g.ops, g.e, &hb.lk), CERB_OK);
    assert_int_equal(cerb__engine_release(g.ops, g.e, &h.lk), CERB_OK);
    hold_init(&h2, name, 22);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h2.lk, 0, NULL, &gr), CERB_OK);
    assert_int_equal(gr.fence, 5002);
    assert_int_equal(cerb__engine_release(g.ops, g.e, &h2.lk), CERB_OK);
    assert_int_equal(cerb__engine_held(g.ops, g.e, name, CERB_PRIM_MUTEX), CERB_OK);
    assert_int_equal(cerb__engine_probe(g.ops, g.e, 1000), CERB_OK);

    /* A hold whose session was killed: renewals fail (the first on the
     * wire, the next knowing the session is gone), and its release frees
     * the row it can no longer use, so the next grant need not wait for
     * its 10 s lease. */
    hold_init(&h, name, 40);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
    uint64_t fk = gr.fence;
    char kill[64];
    snprintf(kill, sizeof kill, "KILL CONNECTION %lld",
             (long long)q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name));
    assert_int_equal(mysql_query(my, kill), 0);
    cerb_status rst = cerb__engine_renew(g.ops, g.e, &h.lk, &cg);
    assert_int_not_equal(rst, CERB_OK);
    if (rst != CERB_NOT_OWNER)
        assert_int_equal(cerb__engine_renew(g.ops, g.e, &h.lk, &cg), CERB_NOT_OWNER);
    assert_int_equal(q1s(my, "SELECT COUNT(*) FROM cerberus_lock WHERE name = ? AND owner IS "
                             "NOT NULL AND lease_until > UTC_TIMESTAMP(6)",
                         name),
                     1);
    assert_int_equal(cerb__engine_release(g.ops, g.e, &h.lk), CERB_NOT_OWNER);
    assert_int_equal(q1s(my, "SELECT COUNT(*) FROM cerberus_lock WHERE name = ? AND owner IS "
                             "NULL",
                         name),
                     1);
    hold_init(&h2, name, 41);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h2.lk, 0, NULL, &gr), CERB_OK);
    assert_true(gr.fence > fk);
    fk = gr.fence;
    /* Its session killed too, the row keeps token 41's lease; the same
     * token asking again (a retry after an answer lost with its session)
     * is granted at once instead of waiting out its own lease. */
    snprintf(kill, sizeof kill, "KILL CONNECTION %lld",
             (long long)q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name));
    assert_int_equal(mysql_query(my, kill), 0);
    assert_int_not_equal(cerb__engine_renew(g.ops, g.e, &h2.lk, &cg), CERB_OK);
    hold_init(&h, name, 41);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h.lk, 0, NULL, &gr), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 1000);
    assert_true(gr.fence > fk);
    /* Another token is still kept out meanwhile. */
    hold_init(&h2, name, 42);
    assert_int_equal(cerb__engine_acquire(g.ops, g.e, &h2.lk, 0, NULL, &gr), CERB_BUSY);
    assert_int_equal(cerb__engine_release(g.ops, g.e, &h.lk), CERB_OK);
    free(n2);
    free(n3);
    free(name);
    mysql_close(my);
    eng_close(&g);
}

static void test_injection(void **state)
{
    (void)state;
    struct cerb_client *a = open_client(NULL, NULL), *b = open_client(NULL, NULL);
    MYSQL *my = raw();
    char *uniq = test_name("inj");
    const char *shapes[] = {
        "x'); DROP TABLE cerberus_lock; -- ",
        "q\"d'o`b; SELECT 1",
        "back\\slash\\' OR '1'='1",
        "caf\xc3\xa9 \xe2\x98\x83",
        "bin \xff\xfe\xa0\xc0",
        "%s%n%x_%%",
    };
    int64_t rows_before = q1(my, "SELECT COUNT(*) FROM cerberus_lock");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s %s", shapes[i], uniq);
        struct cerb_lock *la = NULL, *lb = NULL;
        assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
        assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
        assert_int_equal(cerb_lock_trylock(la), CERB_OK);
        assert_true(cerb_lock_fencing_token(la) > 0);
        assert_int_equal(cerb_lock_trylock(lb), CERB_BUSY);
        /* The row is there under the exact bytes. */
        assert_int_equal(q1s(my, "SELECT COUNT(*) FROM cerberus_lock WHERE name = ? AND "
                                 "owner IS NOT NULL",
                             name),
                         1);
        assert_int_equal(cerb_lock_unlock(la), CERB_OK);
        assert_int_equal(cerb_lock_trylock(lb), CERB_OK);
        assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
        cerb_lock_free(la);
        cerb_lock_free(lb);
    }
    /* The table is intact, with one row per name added. */
    assert_true(q1(my, "SELECT COUNT(*) FROM cerberus_lock") >= rows_before + 6);
    assert_int_equal(q1(my, "SELECT COUNT(*) FROM information_schema.TABLES WHERE "
                            "TABLE_SCHEMA = 'cerb' AND TABLE_NAME IN ('cerberus_lock', "
                            "'cerberus_guard')"),
                     2);
    free(uniq);
    mysql_close(my);
    cerb_client_close(a);
    cerb_client_close(b);
}

static void test_fences(void **state)
{
    (void)state;
    struct cerb_client *a = open_client(NULL, NULL), *b = open_client(NULL, NULL);
    char *name = test_name("fences");
    struct cerb_lock *la = cerb_test_handle(a, name), *lb = cerb_test_handle(b, name);
    assert_non_null(la);
    assert_non_null(lb);
    uint64_t last = 0;
    for (int i = 0; i < 20; i++) {
        struct cerb_lock *l = i % 2 ? lb : la;
        assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
        uint64_t f = cerb_lock_fencing_token(l);
        assert_true(f > last);
        last = f;
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- inspection: arrival order, not connection order ---- */

struct insp_waiter {
    struct cerb_lock *l;
    pthread_t t;
    cerb_status st;
    atomic_int held, release;
};

static bool int_set(void *ud) { return atomic_load((atomic_int *)ud) != 0; }

static void *insp_main(void *ud)
{
    struct insp_waiter *w = ud;
    w->st = cerb_lock_trylock_for(w->l, 20000);
    if (w->st == CERB_OK) {
        atomic_store(&w->held, 1);
        wait_until(int_set, &w->release, 20000);
        cerb_lock_unlock(w->l);
    }
    return NULL;
}

/* The entries of `name`; n set. */
static cerb_holder_info *insp(struct cerb_client *c, const char *name, size_t *n)
{
    cerb_holder_info *v = NULL;
    if (cerb_lock_inspect(c, name, "mysql", &v, n) != CERB_OK)
        fail_msg("inspect: %s", cerb_last_error());
    return v;
}

struct insp_count {
    struct cerb_client *c;
    const char *name;
    size_t want;
};

static bool insp_shows(void *ud)
{
    struct insp_count *q = ud;
    size_t n = 0;
    cerb_holder_info *v = NULL;
    if (cerb_lock_inspect(q->c, q->name, "mysql", &v, &n) != CERB_OK)
        return false;
    cerb_holders_free(v, n);
    return n == q->want;
}

static void test_inspect_arrival_order(void **state)
{
    (void)state;
    /* b connects before a (a lower connection id) but waits after it. */
    struct cerb_client *h = open_client(NULL, NULL), *b = open_client(NULL, NULL),
                       *a = open_client(NULL, NULL);
    char *name = test_name("insp-order");
    struct cerb_lock *lh = cerb_test_handle(h, name);
    assert_int_equal(cerb_lock_trylock(lh), CERB_OK);
    struct insp_waiter wa = {.l = cerb_test_handle(a, name)}, wb = {.l = cerb_test_handle(b, name)};
    struct insp_count q = {h, name, 2};
    assert_int_equal(pthread_create(&wa.t, NULL, insp_main, &wa), 0);
    assert_true(wait_until(insp_shows, &q, 10000));
    cerb_test_let_time_pass(300);
    assert_int_equal(pthread_create(&wb.t, NULL, insp_main, &wb), 0);
    q.want = 3;
    assert_true(wait_until(insp_shows, &q, 10000));
    size_t n = 0;
    cerb_holder_info *v = insp(h, name, &n);
    assert_int_equal(n, 3);
    unsigned long long ca = 0, cb = 0;
    assert_int_equal(sscanf(v[1].owner, "connection %llu", &ca), 1);
    assert_int_equal(sscanf(v[2].owner, "connection %llu", &cb), 1);
    print_message("waiters: %s then %s\n", v[1].owner, v[2].owner);
    assert_true(ca > cb); /* listed by arrival, not by connection id */
    assert_string_equal(v[1].detail, "waiting");
    /* The first listed is the next holder, under the same name. */
    assert_int_equal(cerb_lock_unlock(lh), CERB_OK);
    assert_true(wait_until(int_set, &wa.held, 10000));
    assert_false(atomic_load(&wb.held));
    size_t n2 = 0;
    cerb_holder_info *v2 = insp(h, name, &n2);
    assert_int_equal(n2, 2);
    assert_string_equal(v2[0].owner, v[1].owner);
    assert_int_equal(v2[0].waiting, 0);
    assert_true(strncmp(v2[0].detail, "owner ", 6) == 0);
    assert_string_equal(v2[1].owner, v[2].owner);
    cerb_holders_free(v2, n2);
    cerb_holders_free(v, n);
    atomic_store(&wa.release, 1);
    pthread_join(wa.t, NULL);
    assert_true(wait_until(int_set, &wb.held, 10000));
    atomic_store(&wb.release, 1);
    pthread_join(wb.t, NULL);
    assert_int_equal(wa.st, CERB_OK);
    assert_int_equal(wb.st, CERB_OK);

    /* A raw session's GET_LOCK without a row: listed as the holder. */
    MYSQL *my = raw();
    int64_t raw_conn = q1(my, "SELECT CONNECTION_ID()");
    assert_int_equal(q1s(my, "SELECT GET_LOCK(?, 0)", name), 1);
    v = insp(h, name, &n);
    assert_int_equal(n, 1);
    char want[64];
    snprintf(want, sizeof want, "connection %lld", (long long)raw_conn);
    assert_string_equal(v[0].owner, want);
    assert_int_equal(v[0].waiting, 0);
    assert_string_equal(v[0].detail, "GET_LOCK, no row");
    cerb_holders_free(v, n);
    mysql_close(my);
    v = insp(h, name, &n);
    assert_int_equal(n, 0);

    cerb_lock_free(wa.l);
    cerb_lock_free(wb.l);
    cerb_lock_free(lh);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(h);
}

/* ---- a contended name queues at once ---- */

static uint64_t calls_of(struct cerb_client *c, uint64_t *wakeups)
{
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "mysql", &info), CERB_OK);
    if (wakeups)
        *wakeups = info.wakeups;
    return info.acquire_calls;
}

/* One contended acquisition by w's client while h holds: how many acquire
 * calls it took to be queued, and the wake-ups it counted. */
static uint64_t contended_once(struct cerb_client *hc, struct cerb_lock *lh, struct cerb_client *wc,
                               struct insp_waiter *w, const char *name, uint64_t *woke)
{
    uint64_t w0 = 0, w1 = 0, c0 = calls_of(wc, &w0);
    assert_int_equal(cerb_lock_trylock(lh), CERB_OK);
    atomic_store(&w->held, 0);
    atomic_store(&w->release, 0);
    assert_int_equal(pthread_create(&w->t, NULL, insp_main, w), 0);
    struct insp_count q = {hc, name, 2}; /* the holder and one waiter */
    assert_true(wait_until(insp_shows, &q, 10000));
    uint64_t calls = calls_of(wc, NULL) - c0;
    assert_int_equal(cerb_lock_unlock(lh), CERB_OK);
    assert_true(wait_until(int_set, &w->held, 10000));
    atomic_store(&w->release, 1);
    pthread_join(w->t, NULL);
    assert_int_equal(w->st, CERB_OK);
    calls_of(wc, &w1);
    *woke = w1 - w0;
    return calls;
}

static void test_queue_first(void **state)
{
    (void)state;
    struct cerb_client *h = open_client(NULL, NULL), *b = open_client(NULL, NULL);
    char *name = test_name("queue-first");
    struct cerb_lock *lh = cerb_test_handle(h, name);
    struct insp_waiter w = {.l = cerb_test_handle(b, name)};
    uint64_t woke = 0;
    /* The first wait on a name tries first (MY_TRY, then the wait) ... */
    assert_int_equal(contended_once(h, lh, b, &w, name, &woke), 2);
    assert_int_equal(woke, 1);
    /* ... the next ones queue at once: one acquire call, one wake-up. */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(contended_once(h, lh, b, &w, name, &woke), 1);
        assert_int_equal(woke, 1);
    }
    /* A wait that finds the name free is no wake-up, and takes it off the
     * list: the next acquisition of a free name is one statement again. */
    MYSQL *my = raw();
    uint64_t w0 = 0, w1 = 0, c0 = calls_of(b, &w0);
    assert_int_equal(cerb_lock_trylock_for(w.l, 10000), CERB_OK);
    int64_t conn = q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name);
    assert_int_equal(calls_of(b, &w1) - c0, 1);
    assert_int_equal(w1, w0);
    assert_int_equal(cerb_lock_unlock(w.l), CERB_OK);
    int64_t x0 = executes(my, conn);
    assert_int_equal(cerb_lock_trylock_for(w.l, 10000), CERB_OK);
    assert_int_equal(q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name), conn);
    assert_int_equal(executes(my, conn) - x0, 1);
    assert_int_equal(cerb_lock_unlock(w.l), CERB_OK);
    /* Nothing stacked on the server. */
    assert_int_equal(q1s(my, "SELECT IS_USED_LOCK(?) IS NULL", lname_of("dl", name)), 1);
    mysql_close(my);
    cerb_lock_free(w.l);
    cerb_lock_free(lh);
    free(name);
    cerb_client_close(b);
    cerb_client_close(h);
}

/* ---- renewals keep up while every connection is busy ---- */

/* Under ThreadSanitizer the client runs several times slower, so the
 * load is what its renewer can keep up with there: this case is about
 * the throughput of renewals, which a TSan build does not measure. */
#if defined(__SANITIZE_THREAD__)
#define CERB_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CERB_TEST_TSAN 1
#endif
#endif
#ifdef CERB_TEST_TSAN
enum { MANY_THREADS = 8, MANY_EACH = 125 };
#else
enum { MANY_THREADS = 8, MANY_EACH = 1250 };
#endif

struct taker {
    struct cerb_client *c;
    const char *base;
    int id;
    pthread_t t;
    atomic_int taken, check; /* it has taken its names; it may look now */
    int got, valid;
};

static atomic_int busy_lost;
static void on_busy_lost(struct cerb_lock *l, void *ud)
{
    (void)l, (void)ud;
    atomic_fetch_add(&busy_lost, 1);
}

/* Takes MANY_EACH new names back to back and keeps them until told to
 * look at them (holds are the taking thread's: only it sees their state),
 * then gives them back. */
static void *taker_main(void *ud)
{
    struct taker *tk = ud;
    struct cerb_lock **l = calloc(MANY_EACH, sizeof *l);
    for (int i = 0; l && i < MANY_EACH; i++) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s-%d-%d", tk->base, tk->id, i);
        if (!(l[i] = cerb_test_handle(tk->c, buf)))
            break;
        cerb_lock_on_lost(l[i], on_busy_lost, NULL);
        if (cerb_lock_trylock_for(l[i], 5000) == CERB_OK)
            tk->got++;
    }
    atomic_store(&tk->taken, 1);
    wait_until(int_set, &tk->check, 60000);
    for (int i = 0; l && i < MANY_EACH && l[i]; i++) {
        tk->valid += cerb_lock_state(l[i]) == CERB_LOCK_VALID;
        cerb_lock_unlock(l[i]);
        cerb_lock_free(l[i]);
    }
    free(l);
    return NULL;
}

/* Threads that take new names back to back (each a try, a row made, a
 * try again) keep every connection busy while the holds they took before
 * must be renewed on the connections they are pinned to: the design's
 * "many" load (DESIGN.md section 10: thousands of holds, a 3 s lease
 * renewed every second). Renewals must keep up. */
static void test_renewals_keep_up(void **state)
{
    (void)state;
    struct cerb_client *c = open_client(NULL, "lock = { lease_ms = 3000; };");
    char *base = test_name("keep-up");
    static struct taker tk[MANY_THREADS];
    atomic_store(&busy_lost, 0);
    int64_t t0 = cerb_test_now_ms();
    for (int i = 0; i < MANY_THREADS; i++) {
        memset(&tk[i], 0, sizeof tk[i]);
        tk[i].c = c, tk[i].base = base, tk[i].id = i;
        assert_int_equal(pthread_create(&tk[i].t, NULL, taker_main, &tk[i]), 0);
    }
    for (int i = 0; i < MANY_THREADS; i++)
        wait_until(int_set, &tk[i].taken, 60000);
    int64_t took = cerb_test_now_ms() - t0;
    /* A lease more held: every hold renewed three times at least. */
    cerb_test_let_time_pass(3000);
    int got = 0, valid = 0;
    for (int i = 0; i < MANY_THREADS; i++) {
        atomic_store(&tk[i].check, 1);
        pthread_join(tk[i].t, NULL);
        got += tk[i].got;
        valid += tk[i].valid;
    }
    print_message("%d holds taken in %lld ms by %d threads; %d valid 3 s later, %d lost\n", got,
                  (long long)took, MANY_THREADS, valid, atomic_load(&busy_lost));
    assert_int_equal(got, (int)MANY_THREADS * MANY_EACH);
    assert_int_equal(valid, got);
    assert_int_equal(atomic_load(&busy_lost), 0);
    free(base);
    cerb_client_close(c);
}

/* ---- a killed holder session ---- */

static atomic_int lost_fired;
static _Atomic int64_t lost_at_ms;

static void on_lost(struct cerb_lock *l, void *ud)
{
    (void)l, (void)ud;
    atomic_store(&lost_at_ms, cerb_test_now_ms());
    atomic_store(&lost_fired, 1);
}

static bool lost_pred(void *ud)
{
    (void)ud;
    return atomic_load(&lost_fired) != 0;
}

static void test_killed_holder(void **state)
{
    (void)state;
    const char *lease = "lock = { lease_ms = 3000; };";
    struct cerb_client *a = open_client(NULL, lease), *b = open_client(NULL, lease);
    MYSQL *my = raw();
    char *name = test_name("killed");
    struct cerb_lock *la = cerb_test_handle(a, name), *lb = cerb_test_handle(b, name);
    assert_non_null(la);
    assert_non_null(lb);
    atomic_store(&lost_fired, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(la);

    struct waiter w = {.l = lb, .st = CERB_EIO};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_thread, &w), 0);
    cerb_test_let_time_pass(300);

    /* Kill the holder's session, as the same user (no SUPER needed). */
    int64_t conn = q1s(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name);
    assert_true(conn > 0);
    char kill[64];
    snprintf(kill, sizeof kill, "KILL CONNECTION %lld", (long long)conn);
    assert_int_equal(mysql_query(my, kill), 0);
    int64_t killed_ms = cerb_test_now_ms();
    /* The lease the holder had when its session died (it cannot renew on
     * a dead session), as text to compare on the server later. */
    assert_int_equal(mysql_test_exec1(my,
                                      "CREATE TEMPORARY TABLE old_lease AS SELECT lease_until, "
                                      "owner FROM cerberus_lock WHERE name = ?",
                                      name, NULL),
                     0);
    int64_t left_us = q1(my, "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) "
                             "FROM old_lease");
    print_message("holder killed with %lld ms of lease left\n", (long long)(left_us / 1000));
    assert_true(left_us > 0);

    /* The holder is told, by its next renewal or its own deadline. */
    assert_true(wait_until(lost_pred, NULL, 6000));
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_LOST);
    pthread_join(th, NULL);
    assert_int_equal(w.st, CERB_OK);
    /* The waiter was granted after the loss was told, and only once the
     * old lease had run out on the server's clock (hand-off wait). */
    assert_true(atomic_load(&lost_at_ms) <= w.granted_ms);
    assert_true(w.granted_ms - killed_ms >= left_us / 1000 - 50);
    assert_int_equal(q1s(my,
                         "SELECT l.acquired_at >= o.lease_until FROM cerberus_lock l, old_lease o "
                         "WHERE l.name = ?",
                         name),
                     1);
    assert_true(w.fence > fa);
    assert_int_equal(w.unlock_st, CERB_OK);
    assert_int_equal(cerb_lock_unlock(la), CERB_LOST);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    mysql_close(my);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* ---- a hung holder ---- */

/* Role: take argv[0] with a 1 s lease, say so on fd argv[1], then wait
 * (the parent pauses us); once resumed, exit 0 when the lost callback
 * fired within 5 s, else 3. */
static int role_hung_holder(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int fd = atoi(argv[1]);
    cerb_client *c = NULL;
    char *cfg = mysql_test_config(NULL, "lock = { lease_ms = 1000; };");
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        return 4;
    free(cfg);
    atomic_store(&lost_fired, 0);
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, argv[0], NULL, &l) != CERB_OK ||
        cerb_lock_on_lost(l, on_lost, NULL) != CERB_OK || cerb_lock_lock(l) != CERB_OK)
        return 5;
    if (write(fd, "h", 1) != 1)
        return 6;
    char b;
    if (read(fd, &b, 1) != 1) /* the parent writes once it resumed us */
        return 7;
    int rc = wait_until(lost_pred, NULL, 5000) ? 0 : 3;
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    cerb_client_close(c);
    return rc;
}

static void test_hung_holder_is_evicted(void **state)
{
    (void)state;
    char *name = test_name("my-hung");
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
    char *args[] = {name, fdarg, NULL};
    int keep[] = {sv[1], -1};
    pid_t child = cerb_test_spawn_self("hung_holder", args, keep);
    assert_true(child > 0);
    close(sv[1]);
    char b;
    assert_int_equal(cerb_test_read_within(sv[0], &b, 1, 15000), 1);
    assert_int_equal(cerb_test_pause_pid(child), 0);
    int64_t t0 = cerb_test_now_ms();

    struct cerb_client *c = open_client(NULL, NULL);
    struct cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    /* The child's lease (1 s) runs out; its session lives on, paused, and
     * keeps the GET_LOCK: only its eviction lets the waiter in. */
    cerb_status st = cerb_lock_trylock_for(l, 10000);
    int64_t took = cerb_test_now_ms() - t0;
    print_message("waiter: %s after %lld ms\n", cerb_status_name(st), (long long)took);
    assert_int_equal(st, CERB_OK);
    assert_true(took >= 900);
    assert_true(took < 5000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    assert_int_equal(cerb_test_resume_pid(child), 0);
    assert_int_equal(write(sv[0], "g", 1), 1);
    assert_int_equal(cerb_test_wait(child, 20000), 0);
    close(sv[0]);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* Like mysql_test_config, with a user and database of the caller's. */
static char *config_for(const char *user, const char *db, const char *my_extra)
{
    char *t = malloc(1024);
    assert_non_null(t);
    snprintf(t, 1024,
             "engines = (\"mysql\");\nmysql = { host = \"127.0.0.1\"; port = %d; user = \"%s\"; "
             "database = \"%s\"; %s };\n",
             mysql_test_port(), user, db, my_extra ? my_extra : "");
    return t;
}

static void test_open_errors(void **state)
{
    (void)state;
    cerb_client *c = NULL;
    char *text = config_for("cerb", "cerb_no_such_db", NULL);
    cerb_status st = cerb_client_open_string(&c, text);
    free(text);
    if (st == CERB_OK) {
        /* Engines may open lazily: the first lock says it. */
        struct cerb_lock *l = cerb_test_handle(c, "x");
        assert_non_null(l);
        st = cerb_lock_trylock(l);
        cerb_lock_free(l);
        cerb_client_close(c);
        c = NULL;
    }
    print_message("missing database: %s\n", cerb_last_error());
    assert_int_not_equal(st, CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "cerberus init"));
    assert_non_null(strstr(cerb_last_error(), "cerb_no_such_db"));

    text = mysql_test_config("mode = \"advisory\";", NULL);
    st = cerb_client_open_string(&c, text);
    free(text);
    if (st == CERB_OK) {
        struct cerb_lock *l = cerb_test_handle(c, "x");
        st = l ? cerb_lock_trylock(l) : CERB_EIO;
        if (l)
            cerb_lock_free(l);
        cerb_client_close(c);
        c = NULL;
    }
    assert_int_not_equal(st, CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "not available"));

    /* raw: a name longer than GET_LOCK's 64 characters is refused. */
    struct cerb_client *r = open_client("key = \"raw\";", NULL);
    char longname[80];
    memset(longname, 'n', 65);
    longname[65] = '\0';
    struct cerb_lock *l = cerb_test_handle(r, longname);
    assert_non_null(l);
    assert_int_equal(cerb_lock_trylock(l), CERB_EINVAL);
    cerb_lock_free(l);
    cerb_client_close(r);

    /* A password from mysql.password_file (first line). */
    char *pw = cerb_test_write_config("cerb-secret\nsecond line\n");
    char extra[512];
    snprintf(extra, sizeof extra, "password_file = \"%s\";", pw);
    text = config_for("cerb_pw", "cerb", extra);
    struct cerb_client *p = cerb_test_open(text);
    free(text);
    assert_non_null(p);
    char *name = test_name("pw");
    l = cerb_test_handle(p, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(p);
    free(name);
    cerb_test_remove_file(pw);
    /* A wrong one is refused without being printed. */
    pw = cerb_test_write_config("not-the-Secret-42\n");
    snprintf(extra, sizeof extra, "password_file = \"%s\";", pw);
    text = config_for("cerb_pw", "cerb", extra);
    st = cerb_client_open_string(&c, text);
    free(text);
    if (st == CERB_OK) {
        l = cerb_test_handle(c, "x");
        st = l ? cerb_lock_trylock(l) : CERB_EIO;
        if (l)
            cerb_lock_free(l);
        cerb_client_close(c);
    }
    assert_int_not_equal(st, CERB_OK);
    assert_null(strstr(cerb_last_error(), "not-the-Secret-42"));
    cerb_test_remove_file(pw);
}

static const struct cerb_test_role roles[] = {{"hung_holder", role_hung_holder}, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapping),      cmocka_unit_test(test_eval_order),
        cmocka_unit_test(test_interop),      cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_queue_first),
        cmocka_unit_test(test_renewals_keep_up),
        cmocka_unit_test(test_injection),    cmocka_unit_test(test_fences),
        cmocka_unit_test(test_inspect_arrival_order),
        cmocka_unit_test(test_killed_holder), cmocka_unit_test(test_hung_holder_is_evicted),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
