/*
 * test_pg.c — the pg engine against the shared test PostgreSQL: its layout
 * and what conformance.c cannot see. DistributedLock's keys exclude raw
 * sessions holding pg_advisory_lock on them, both ways; a name made to
 * break SQL is just a name; fences only grow; a holder whose session is
 * killed is told LOST while the next holder waits out its lease on the
 * server's clock; a hung holder (paused with its connection up) is evicted
 * once its lease has run out; a missing table fails open with what to do.
 */
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
#include "pg_util.h"
#include "test_util.h"

static cerb_client *open_client(const char *pg_extra, const char *extra)
{
    char *cfg = pg_test_config(pg_extra, extra);
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
    if (cerb_lock_new(c, name, NULL, &l) != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

static PGconn *raw(void)
{
    PGconn *pg = pg_test_connect(NULL);
    assert_non_null(pg);
    return pg;
}

/* The first column of the first row of sql, as text ("" when none). */
static char *scalar(PGconn *pg, const char *sql, int n, const char *const *v)
{
    PGresult *r = pg_test_exec(pg, sql, n, v);
    assert_non_null(r);
    char *s = strdup(PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return s;
}

static bool scalar_true(PGconn *pg, const char *sql, int n, const char *const *v)
{
    char *s = scalar(pg, sql, n, v);
    bool t = s[0] == 't';
    free(s);
    return t;
}

/* ---- DistributedLock's keys ---- */

/*
 * The expected keys were computed apart from engine_pg/pg_key.c, by a
 * Python transliteration of DistributedLock's PostgresAdvisoryLockKey.cs
 * (ASCII packing; SHA-1, first 8 bytes little-endian). The hashed one is
 * also the note's value for pals without an application name.
 */
static const struct {
    const char *name;
    const char *lock_sql, *try_sql, *unlock_sql;
} dl_vectors[] = {
    {"job-9", "SELECT pg_advisory_lock(-3044694107646590977)",
     "SELECT pg_try_advisory_lock(-3044694107646590977)",
     "SELECT pg_advisory_unlock(-3044694107646590977)"},
    {"orders:nightly-rebuild", "SELECT pg_advisory_lock(3651610993899799804)",
     "SELECT pg_try_advisory_lock(3651610993899799804)",
     "SELECT pg_advisory_unlock(3651610993899799804)"},
    {"0123456789abcdef", "SELECT pg_advisory_lock(81985529216486895)",
     "SELECT pg_try_advisory_lock(81985529216486895)",
     "SELECT pg_advisory_unlock(81985529216486895)"},
    {"0000007b,fffffffe", "SELECT pg_advisory_lock(123, -2)",
     "SELECT pg_try_advisory_lock(123, -2)", "SELECT pg_advisory_unlock(123, -2)"},
};

static void test_dl_keys_exclude_raw_sessions(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL, NULL);
    PGconn *pg = raw();
    for (size_t i = 0; i < sizeof dl_vectors / sizeof dl_vectors[0]; i++) {
        cerb_lock *l = mk(c, dl_vectors[i].name);
        /* A raw session holds the key: Cerberus is kept out. */
        free(scalar(pg, dl_vectors[i].lock_sql, 0, NULL));
        assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
        assert_true(scalar_true(pg, dl_vectors[i].unlock_sql, 0, NULL));
        /* Cerberus holds it: the raw session is kept out. */
        assert_int_equal(cerb_lock_trylock(l), CERB_OK);
        assert_false(scalar_true(pg, dl_vectors[i].try_sql, 0, NULL));
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        assert_true(scalar_true(pg, dl_vectors[i].try_sql, 0, NULL));
        assert_true(scalar_true(pg, dl_vectors[i].unlock_sql, 0, NULL));
        cerb_lock_free(l);
    }
    PQfinish(pg);
    cerb_client_close(c);
}

/* ---- names are data ---- */

static void test_hostile_names_are_just_names(void **state)
{
    (void)state;
    static const char *names[] = {
        "x'); DROP TABLE cerberus_lock; --",
        "quote\" back\\slash ' $1 ::bytea %s",
        "caf\xc3\xa9 \xe2\x98\x83 \xff\xfe bytes",
    };
    cerb_client *c = open_client(NULL, NULL);
    PGconn *pg = raw();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *name = test_name(names[i]);
        cerb_lock *l = mk(c, name);
        assert_int_equal(cerb_lock_lock(l), CERB_OK);
        /* The row holds the name byte for byte. */
        char hex[1024] = "";
        for (const unsigned char *p = (const unsigned char *)name; *p; p++)
            snprintf(hex + strlen(hex), sizeof hex - strlen(hex), "%02x", *p);
        const char *v[1] = {hex};
        assert_true(scalar_true(pg,
                                "SELECT owner IS NOT NULL FROM cerberus_lock "
                                "WHERE name = decode($1, 'hex')",
                                1, v));
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        cerb_lock_free(l);
        free(name);
    }
    char *n = scalar(pg, "SELECT count(*) FROM cerberus_lock", 0, NULL);
    assert_true(atoi(n) > 0); /* still there */
    free(n);
    PQfinish(pg);
    cerb_client_close(c);
}

/* ---- fences ---- */

static void test_fences_only_grow(void **state)
{
    (void)state;
    cerb_client *a = open_client(NULL, NULL), *b = open_client(NULL, NULL);
    char *name = test_name("pg-fence");
    cerb_lock *la = mk(a, name), *lb = mk(b, name);
    uint64_t last = 0;
    for (int i = 0; i < 10; i++) {
        cerb_lock *l = i % 2 ? lb : la;
        assert_int_equal(cerb_lock_lock(l), CERB_OK);
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

/* ---- a killed session ---- */

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}

static bool lost_told(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_killed_session_is_lost_and_the_lease_waited_out(void **state)
{
    (void)state;
    /* lease 3 s; renewals every second or so. */
    cerb_client *a = open_client(NULL, "lock = { lease_ms = 3000; };");
    cerb_client *b = open_client(NULL, "lock = { lease_ms = 3000; };");
    char *name = test_name("pg-killed");
    cerb_lock *la = mk(a, name), *lb = mk(b, name);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);

    PGconn *pg = raw();
    char hex[512] = "";
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        snprintf(hex + strlen(hex), sizeof hex - strlen(hex), "%02x", *p);
    const char *v[1] = {hex};
    /* End the holder's session; read how long its lease had left. */
    char *left = scalar(pg,
                        "SELECT (extract(epoch FROM lease_until - clock_timestamp()) * 1000)::bigint "
                        "FROM cerberus_lock WHERE name = decode($1, 'hex') AND "
                        "pg_terminate_backend(owner_pid)",
                        1, v);
    int64_t t_kill = cerb_test_now_ms();
    int64_t left_ms = atoll(left);
    free(left);
    assert_true(left_ms > 500);

    /* The next holder gets it, but not before that lease ran out. */
    assert_int_equal(cerb_lock_trylock_for(lb, 10000), CERB_OK);
    int64_t waited = cerb_test_now_ms() - t_kill;
    assert_true(waited >= left_ms - 100);
    /* The first holder is told, by its next renewal. */
    assert_true(wait_until(lost_told, NULL, 5000));
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_LOST);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_unlock(la);
    PQfinish(pg);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* The name as hex, for decode($1, 'hex'). */
static void hexname(const char *name, char *hex, size_t len)
{
    hex[0] = '\0';
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        snprintf(hex + strlen(hex), len - strlen(hex), "%02x", *p);
}

/* An unlock after the holder's session was killed frees the row: the next
 * holder need not wait out the dead session's lease. */
static void test_unlock_after_kill_frees_the_row(void **state)
{
    (void)state;
    cerb_client *a = open_client(NULL, "lock = { lease_ms = 20000; };");
    cerb_client *b = open_client(NULL, "lock = { lease_ms = 20000; };");
    char *name = test_name("pg-killed-unlock");
    cerb_lock *la = mk(a, name), *lb = mk(b, name);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    PGconn *pg = raw();
    char hex[512];
    hexname(name, hex, sizeof hex);
    const char *v[1] = {hex};
    assert_true(scalar_true(pg,
                            "SELECT pg_terminate_backend(owner_pid) FROM cerberus_lock "
                            "WHERE name = decode($1, 'hex')",
                            1, v));
    cerb_lock_unlock(la); /* LOST or NOT_OWNER: the session is gone */
    assert_int_equal(cerb_lock_trylock_for(lb, 2000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    PQfinish(pg);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* Cancels the release statement of backend `pid` once it waits for a row
 * lock (pg_cancel_backend: the statement fails, the session lives on). */
struct canceller {
    char pid[16];
    bool done;
};

static void *cancel_main(void *arg)
{
    struct canceller *c = arg;
    PGconn *pg = pg_test_connect(NULL);
    const char *v[1] = {c->pid};
    for (int i = 0; pg && i < 500 && !c->done; i++) {
        c->done = scalar_true(pg,
                              "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE "
                              "pid = $1::int AND wait_event_type = 'Lock'",
                              1, v);
        if (!c->done)
            cerb_test_let_time_pass(10);
    }
    PQfinish(pg);
    return NULL;
}

/* A release the server refuses with an SQL error (cancelled while it waits
 * for a row lock) still gives the session lock back: session locks ignore
 * the rollback of the statement that failed. */
static void test_failed_release_leaves_no_session_lock(void **state)
{
    (void)state;
    cerb_client *a = open_client("op_timeout_ms = 5000;", NULL);
    char *name = test_name("pg-release-error");
    cerb_lock *la = mk(a, name);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    PGconn *pg = raw();
    char hex[512];
    hexname(name, hex, sizeof hex);
    const char *v[1] = {hex};
    struct canceller c = {.done = false};
    char *pid = scalar(pg, "SELECT owner_pid FROM cerberus_lock WHERE name = decode($1, 'hex')", 1,
                       v);
    snprintf(c.pid, sizeof c.pid, "%s", pid);
    free(pid);
    PQclear(pg_test_exec(pg, "BEGIN", 0, NULL));
    free(scalar(pg, "SELECT akey FROM cerberus_lock WHERE name = decode($1, 'hex') FOR UPDATE", 1,
                v));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, cancel_main, &c), 0);
    cerb_lock_unlock(la); /* whatever it says, nothing may stay behind */
    pthread_join(t, NULL);
    assert_true(c.done);
    PQclear(pg_test_exec(pg, "COMMIT", 0, NULL));
    assert_true(scalar_true(pg,
                            "SELECT pg_try_advisory_lock(akey) FROM cerberus_lock "
                            "WHERE name = decode($1, 'hex')",
                            1, v));
    PQfinish(pg);
    cerb_lock_free(la);
    free(name);
    cerb_client_close(a);
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
    char *cfg = pg_test_config(NULL, "lock = { lease_ms = 1000; };");
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        return 4;
    free(cfg);
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, argv[0], NULL, &l) != CERB_OK || cerb_lock_on_lost(l, on_lost, NULL) != CERB_OK ||
        cerb_lock_lock(l) != CERB_OK)
        return 5;
    if (write(fd, "h", 1) != 1)
        return 6;
    char b;
    if (read(fd, &b, 1) != 1) /* the parent writes once it resumed us */
        return 7;
    int rc = wait_until(lost_told, NULL, 5000) ? 0 : 3;
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    cerb_client_close(c);
    return rc;
}

static void test_hung_holder_is_evicted(void **state)
{
    (void)state;
    char *name = test_name("pg-hung");
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

    cerb_client *c = open_client(NULL, NULL);
    cerb_lock *l = mk(c, name);
    /* The child's lease (1 s) runs out; its session lives on, paused. */
    assert_int_equal(cerb_lock_trylock_for(l, 15000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 >= 900);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    assert_int_equal(cerb_test_resume_pid(child), 0);
    assert_int_equal(write(sv[0], "g", 1), 1);
    assert_int_equal(cerb_test_wait(child, 20000), 0);
    close(sv[0]);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* ---- set-up errors ---- */

static void test_missing_table_says_what_to_do(void **state)
{
    (void)state;
    char *cfg = pg_test_config("schema = \"cerb_no_such_schema\";", NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    assert_int_not_equal(st, CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "cerberus init"));
}

static const struct cerb_test_role roles[] = {{"hung_holder", role_hung_holder}, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dl_keys_exclude_raw_sessions),
        cmocka_unit_test(test_hostile_names_are_just_names),
        cmocka_unit_test(test_fences_only_grow),
        cmocka_unit_test(test_killed_session_is_lost_and_the_lease_waited_out),
        cmocka_unit_test(test_unlock_after_kill_frees_the_row),
        cmocka_unit_test(test_failed_release_leaves_no_session_lock),
        cmocka_unit_test(test_hung_holder_is_evicted),
        cmocka_unit_test(test_missing_table_says_what_to_do),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
