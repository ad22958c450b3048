/*
 * test_mysql_failover_fault.c — the mysql engine's failover check
 * (cerberus_meta, engine_mysql/my_sql.c META_BUMP), on the exclusive
 * MariaDB (it restarts it):
 *   missing_record  a database whose record is gone (a restore that lost
 *                   it, or a server never given `cerberus init`): the
 *                   first grant waits the quarantine (the longest lease)
 *                   and its fence is 2^32 above every fence of the table.
 *   other_server    the record names another server (what a promoted
 *                   replica or a restored server finds): a client whose
 *                   sessions passed their check long ago is refused at its
 *                   next grant (every grant requires the record to be of
 *                   the server it runs on), runs the check on that session
 *                   and waits the quarantine; the fence is above the base.
 *   restart         kill -9 and restart of the server: its boot epoch (a
 *                   MEMORY table) is drawn anew, so the identity changes
 *                   and the next grant waits the quarantine — what a
 *                   restore from a backup, or a crash that lost commits,
 *                   looks like to the engine.
 *   kill_restart    servers.sh restarts a killed server at once, every
 *                   time (a killed mariadbd's main process is gone 10–15
 *                   ms before its threads close the listening socket, and
 *                   start took the port for a foreign server's).
 *   quiet_open      a session whose record is of its server writes
 *                   nothing (no statement for the binary log).
 *   locking_read    the grant reads the record with a locking read (the
 *                   latest committed row, not its snapshot): a quarantine
 *                   committed while the grant waits for the record's lock
 *                   is seen, and nothing is granted.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "mysql_util.h"
#include "test_util.h"

#define LEASE_MS 1500
#define TWO32 4294967296ULL

static char *config(void)
{
    char extra[128];
    snprintf(extra, sizeof extra, "lock = { lease_ms = %d; };", LEASE_MS);
    return mysql_test_config("op_timeout_ms = 2000; connect_timeout_ms = 2000;", extra);
}

static int64_t scalar(MYSQL *my, const char *sql)
{
    int64_t v = -1;
    if (mysql_test_exec(my, sql, &v) != 0)
        fail_msg("%s failed", sql);
    return v;
}

static void q(MYSQL *my, const char *sql)
{
    if (mysql_query(my, sql) != 0)
        fail_msg("%s: %s", sql, mysql_error(my));
}

/* The record back to normal: of this server, no quarantine (the suites
 * that share the server after this one must not wait). */
static void settle(void)
{
    char *text = config();
    cerb_client *c = cerb_test_open(text); /* its sessions run the check */
    free(text);
    assert_non_null(c);
    cerb_client_close(c);
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    q(my, "UPDATE cerberus_meta SET quarantine_until = NULL WHERE k = 'mysql'");
    mysql_close(my);
}

/* The fence the row of name shows (the engine's, before the core adds
 * its own high bits to make the token). */
static uint64_t row_fence(const char *name)
{
    MYSQL *my = mysql_test_connect(NULL, NULL);
    int64_t f = -1;
    if (!my || mysql_test_exec1(my, "SELECT fence FROM cerberus_lock WHERE name = ?", name, &f))
        fail_msg("cannot read the fence of %s", name);
    mysql_close(my);
    return (uint64_t)f;
}

/* Acquire name on a fresh client, up to 10 s: how long it took. */
static int64_t timed_grant(cerb_client *c, const char *name, uint64_t *fence, cerb_lock **out)
{
    cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(l, 10000), CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    *fence = cerb_lock_fencing_token(l);
    *out = l;
    return took;
}

static void test_missing_record(void **state)
{
    (void)state;
    settle();
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    char *name = test_name("meta-missing");
    char *text = config();
    /* A fence somewhere in the table, well above the others. */
    cerb_client *a = cerb_test_open(text);
    assert_non_null(a);
    cerb_lock *la = cerb_test_handle(a, name);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    cerb_lock_free(la);
    cerb_client_close(a);
    int64_t max_fence = scalar(my, "SELECT MAX(fence) FROM cerberus_lock");

    q(my, "DELETE FROM cerberus_meta");
    cerb_client *b = cerb_test_open(text);
    assert_non_null(b);
    uint64_t fence = 0;
    cerb_lock *lb = NULL;
    int64_t took = timed_grant(b, name, &fence, &lb);
    fence = row_fence(name);
    print_message("missing record: granted after %lld ms, fence %llu (max before %lld)\n",
                  (long long)took, (unsigned long long)fence, (long long)max_fence);
    assert_true(took >= LEASE_MS - 100);
    assert_true(fence > (uint64_t)max_fence + TWO32);
    assert_int_equal(scalar(my, "SELECT COUNT(*) FROM cerberus_meta WHERE server IS NOT NULL"), 1);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(lb);
    cerb_client_close(b);
    free(text);
    free(name);
    mysql_close(my);
    settle();
}

static void test_other_server(void **state)
{
    (void)state;
    settle();
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    char *name = test_name("meta-other");
    char *text = config();
    cerb_client *a = cerb_test_open(text);
    assert_non_null(a);
    cerb_lock *la = cerb_test_handle(a, name);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    uint64_t before = row_fence(name);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    int64_t base0 = scalar(my, "SELECT base FROM cerberus_meta WHERE k = 'mysql'");

    /* What a promoted replica or a restored server finds: the record of
     * another server. a's sessions passed their check before. */
    q(my, "UPDATE cerberus_meta SET server = 'mariadb 99 elsewhere' WHERE k = 'mysql'");
    assert_int_equal(cerb_lock_trylock(la), CERB_BUSY);
    /* The refused grant ran the check on its session: the record is this
     * server's now, the base moved, a quarantine runs. */
    assert_int_equal(scalar(my, "SELECT COUNT(*) FROM cerberus_meta WHERE k = 'mysql' AND "
                                "server <> 'mariadb 99 elsewhere' AND quarantine_until > "
                                "UTC_TIMESTAMP(6)"),
                     1);
    int64_t base1 = scalar(my, "SELECT base FROM cerberus_meta WHERE k = 'mysql'");
    assert_true(base1 >= base0 + (int64_t)TWO32);
    uint64_t fence = 0;
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(la, 10000), CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    fence = row_fence(name);
    print_message("other server: granted after %lld ms more, fence %llu (before %llu, base %lld)\n",
                  (long long)took, (unsigned long long)fence, (unsigned long long)before,
                  (long long)base1);
    assert_true(took >= LEASE_MS / 2);
    assert_true(fence > (uint64_t)base1);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    cerb_lock_free(la);
    cerb_client_close(a);
    free(text);
    free(name);
    mysql_close(my);
    settle();
}

static void test_restart(void **state)
{
    (void)state;
    settle();
    char *name = test_name("meta-restart");
    char *text = config();
    cerb_client *a = cerb_test_open(text);
    assert_non_null(a);
    cerb_lock *la = cerb_test_handle(a, name);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    uint64_t before = row_fence(name);

    pid_t pid = cerb_test_server_pid("mysql", mysql_test_port());
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* Restarted at once on its data (servers.sh waits for the port). */
    assert_int_equal(cerb_test_servers_run("start", "mysql", mysql_test_port(), 60000), 0);
    int64_t t_up = cerb_test_now_ms();

    cerb_client *b = cerb_test_open(text);
    assert_non_null(b);
    uint64_t fence = 0;
    cerb_lock *lb = NULL;
    (void)timed_grant(b, name, &fence, &lb);
    fence = row_fence(name);
    int64_t took = cerb_test_now_ms() - t_up;
    print_message("restart: granted %lld ms after the server was up, fence %llu (before %llu)\n",
                  (long long)took, (unsigned long long)fence, (unsigned long long)before);
    assert_true(took >= LEASE_MS - 100);
    assert_true(fence > before + TWO32);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(lb);
    cerb_client_close(b);
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_client_close(a);
    free(text);
    free(name);
    settle();
}

static int64_t com_insert(MYSQL *my)
{
    int64_t v = -1;
    if (mysql_query(my, "SHOW GLOBAL STATUS LIKE 'Com_insert'") != 0)
        fail_msg("%s", mysql_error(my));
    MYSQL_RES *r = mysql_store_result(my);
    MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
    if (row && row[1])
        v = strtoll(row[1], NULL, 10);
    if (r)
        mysql_free_result(r);
    return v;
}

static void test_quiet_open(void **state)
{
    (void)state;
    settle();
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    char *text = config();
    int64_t before = com_insert(my);
    cerb_client *c = cerb_test_open(text);
    assert_non_null(c);
    cerb_client_close(c);
    int64_t after = com_insert(my);
    print_message("quiet open: %lld inserts\n", (long long)(after - before));
    assert_int_equal(after - before, 0);
    free(text);
    mysql_close(my);
}

static void test_kill_restart(void **state)
{
    (void)state;
    for (int i = 0; i < 12; i++) {
        pid_t pid = cerb_test_server_pid("mysql", mysql_test_port());
        assert_true(pid > 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(cerb_test_servers_run("start", "mysql", mysql_test_port(), 60000), 0);
    }
    settle();
}

struct tryer {
    cerb_client *c;
    const char *name;
    cerb_status st;
    int64_t took;
};

static void *try_thread(void *ud)
{
    struct tryer *t = ud;
    cerb_lock *l = cerb_test_handle(t->c, t->name);
    int64_t t0 = cerb_test_now_ms();
    t->st = l ? cerb_lock_trylock(l) : CERB_EIO;
    t->took = cerb_test_now_ms() - t0;
    if (t->st == CERB_OK)
        cerb_lock_unlock(l);
    if (l)
        cerb_lock_free(l);
    return NULL;
}

static void test_locking_read(void **state)
{
    (void)state;
    settle();
    char *name = test_name("meta-lockread");
    char *text = config();
    cerb_client *a = cerb_test_open(text);
    assert_non_null(a);
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    /* An uncommitted quarantine: the record's row is locked (X). */
    q(my, "BEGIN");
    q(my, "UPDATE cerberus_meta SET quarantine_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND "
          "WHERE k = 'mysql'");
    struct tryer t = {.c = a, .name = name};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, try_thread, &t), 0);
    usleep(400 * 1000);
    q(my, "COMMIT");
    pthread_join(th, NULL);
    print_message("locking read: trylock %d after %lld ms\n", (int)t.st, (long long)t.took);
    /* It waited for the commit, then saw the quarantine: a snapshot read
     * would have granted at once from the old row. */
    assert_int_equal(t.st, CERB_BUSY);
    assert_true(t.took >= 300);
    mysql_close(my);
    cerb_client_close(a);
    free(text);
    free(name);
    settle();
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_record),
        cmocka_unit_test(test_other_server),
        cmocka_unit_test(test_quiet_open),
        cmocka_unit_test(test_locking_read),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_kill_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
