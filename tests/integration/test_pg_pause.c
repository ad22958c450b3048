/*
 * test_pg_pause.c — the pg engine when its server stops answering or dies,
 * on the exclusive test PostgreSQL (fixture pg_excl, $CERB_PG_PORT), which
 * this suite SIGSTOPs, SIGCONTs, kills and restarts on its own data:
 *  - paused: calls fail within their deadlines, a holder is told LOST by
 *    its own deadline, and after the resume the next holder gets the name
 *    with a higher fence;
 *  - paused, a call that may wait with no session to wait on fails after
 *    one connect timeout, not two attempts;
 *  - a session that passed its failover check grants nothing once the
 *    record names another server: its fences jump 2^32 above the old;
 *  - killed (kill -9 of the postmaster) and restarted on its data: holders
 *    are told LOST in time, the next grant waits out the lease the row kept
 *    across the restart, and fences keep growing (they are durable).
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "pg_util.h"
#include "test_util.h"

static cerb_client *open_client(const char *extra)
{
    char *cfg = pg_test_config("op_timeout_ms = 300; connect_timeout_ms = 300;", extra);
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

static pid_t server_pid(void)
{
    pid_t p = cerb_test_server_pid("pg", pg_test_port());
    assert_true(p > 0);
    return p;
}

static void test_paused_server(void **state)
{
    (void)state;
    cerb_client *a = open_client("lock = { lease_ms = 1500; };");
    cerb_client *b = open_client("lock = { lease_ms = 1500; };");
    char *name = test_name("pg-pause");
    cerb_lock *la = mk(a, name), *lb = mk(b, name);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(la);

    pid_t srv = server_pid();
    assert_int_equal(pg_test_pause_server(srv), 0);
    int64_t t0 = cerb_test_now_ms();
    /* A try fails within its deadlines, not never. */
    cerb_status st = cerb_lock_trylock(lb);
    assert_int_not_equal(st, CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 5000);
    /* The holder is told by its own deadline (1.5 s lease). */
    assert_true(wait_until(lost_told, NULL, 4000));
    assert_true(cerb_test_now_ms() - t0 < 4000);
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_LOST);
    cerb_lock_unlock(la);

    assert_int_equal(pg_test_resume_server(srv), 0);
    assert_int_equal(cerb_lock_trylock_for(lb, 10000), CERB_OK);
    assert_true(cerb_lock_fencing_token(lb) > fa);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

/* A call that may wait, on a paused server with no session to wait on:
 * the waiter's connect fails once, and the call says so, instead of trying
 * again on the holder's session (another op timeout, and an ambiguous
 * grant to settle). */
static void test_paused_connect_fails_once(void **state)
{
    (void)state;
    char *cfg = pg_test_config("op_timeout_ms = 1000; connect_timeout_ms = 300;",
                               "retry = { max = 0; };");
    cerb_client *a = NULL;
    assert_int_equal(cerb_client_open_string(&a, cfg), CERB_OK);
    free(cfg);
    char *n1 = test_name("pg-pause-held"), *n2 = test_name("pg-pause-wait");
    cerb_lock *l1 = mk(a, n1), *l2 = mk(a, n2);
    /* l1 pins the one session the client has made. */
    assert_int_equal(cerb_lock_lock(l1), CERB_OK);
    pid_t srv = server_pid();
    assert_int_equal(pg_test_pause_server(srv), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock_for(l2, 100);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(pg_test_resume_server(srv), 0);
    print_message("trylock_for(100) on a paused server: %s after %lld ms\n",
                  cerb_status_name(st), (long long)took);
    assert_int_not_equal(st, CERB_OK);
    /* One connect timeout (300 ms) and slack; a second attempt on the
     * holder's session took one more op timeout (1 s) besides. */
    assert_true(took < 900);
    cerb_lock_unlock(l1);
    cerb_lock_free(l1);
    cerb_lock_free(l2);
    free(n1);
    free(n2);
    cerb_client_close(a);
}

/* The first column of the first row of sql, as a number (-1 when none). */
static long long num(PGconn *pg, const char *sql)
{
    PGresult *r = pg_test_exec(pg, sql, 0, NULL);
    assert_non_null(r);
    long long v = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? atoll(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    return v;
}

/* A session that passed its failover check, when the record then names
 * another server (as after a failover its session outlived, behind a
 * pooler or a moved address): no grant is made on the old record. The
 * grant statement itself refuses, the session runs its check again, which
 * moves the record to this server, raises the base 2^32 above every fence
 * and starts the quarantine; the next grant comes after it, above the
 * base. */
static void test_grant_checks_the_record(void **state)
{
    (void)state;
    cerb_client *a = open_client("lock = { lease_ms = 1000; };");
    char *name = test_name("pg-record");
    cerb_lock *l = mk(a, name);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    uint64_t f0 = cerb_lock_fencing_token(l) & ((UINT64_C(1) << 48) - 1);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    PGconn *pg = pg_test_connect(NULL);
    assert_non_null(pg);
    long long base0 = num(pg, "SELECT base FROM cerberus_meta WHERE k = 'pg'");
    PQclear(pg_test_exec(pg, "UPDATE cerberus_meta SET tli = tli + 1000 WHERE k = 'pg'", 0, NULL));
    assert_int_equal(cerb_lock_trylock_for(l, 10000), CERB_OK);
    uint64_t f1 = cerb_lock_fencing_token(l) & ((UINT64_C(1) << 48) - 1);
    print_message("fence %llu, then %llu after the record named another server\n",
                  (unsigned long long)f0, (unsigned long long)f1);
    assert_true(f1 > (uint64_t)base0 + (UINT64_C(1) << 32));
    assert_true(f1 > f0 + (UINT64_C(1) << 32));
    /* The record names this server again. */
    assert_int_equal(num(pg, "SELECT count(*) FROM cerberus_meta WHERE k = 'pg' AND tli < 1000"),
                     1);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    PQfinish(pg);
    cerb_lock_free(l);
    free(name);
    cerb_client_close(a);
}

static void test_restarted_server(void **state)
{
    (void)state;
    cerb_client *a = open_client("lock = { lease_ms = 2000; };");
    char *name = test_name("pg-restart");
    cerb_lock *la = mk(a, name);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    uint64_t f1 = cerb_lock_fencing_token(la);

    pid_t srv = server_pid();
    assert_int_equal(kill(srv, SIGKILL), 0);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_test_servers_run("start", "pg", pg_test_port(), 60000), 0);
    /* The holder is told by its deadline, whatever the restart took. */
    assert_true(wait_until(lost_told, NULL, 6000));
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_LOST);
    cerb_lock_unlock(la);

    /* A new holder on the restarted server: the row kept its lease and its
     * fence, so it waits for the one and goes above the other. */
    cerb_client *b = open_client("lock = { lease_ms = 2000; };");
    cerb_lock *lb = mk(b, name);
    assert_int_equal(cerb_lock_trylock_for(lb, 10000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 >= 1500);
    uint64_t f2 = cerb_lock_fencing_token(lb);
    assert_true(f2 > f1);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    /* The first client carries on with new sessions. */
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    assert_true(cerb_lock_fencing_token(la) > f2);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paused_server),
        cmocka_unit_test(test_paused_connect_fails_once),
        cmocka_unit_test(test_grant_checks_the_record),
        cmocka_unit_test(test_restarted_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
