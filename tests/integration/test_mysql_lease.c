/*
 * test_mysql_lease.c — mysql.mode = "lease" (the row alone: no GET_LOCK,
 * nothing pinned; engine_mysql/my_lock.c lease_acquire), the mode for
 * Galera and multi-primary Group Replication:
 *   row_alone          a hold is its row: no GET_LOCK on the server, and
 *                      it survives the end of the session that claimed it
 *                      (renewed and released by its token on any other).
 *   deadlock_retried   a claim chosen as a deadlock victim (error 1213, as
 *                      a certification failure is reported on Galera and
 *                      Group Replication) is "not acquired" (CERB_BUSY for
 *                      a try, tried again by a wait), not an error.
 */
#include <pthread.h>
#include <setjmp.h>
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

static char *config(void)
{
    return mysql_test_config("mode = \"lease\"; op_timeout_ms = 3000;",
                             "lock = { lease_ms = 1200; };");
}

static int64_t q1(MYSQL *my, const char *sql, const char *val)
{
    int64_t v = -1;
    if (mysql_test_exec1(my, sql, val, &v) != 0)
        fail_msg("%s failed", sql);
    return v;
}

static void q(MYSQL *my, const char *sql)
{
    if (mysql_query(my, sql) != 0)
        fail_msg("%s: %s", sql, mysql_error(my));
}

static void test_row_alone(void **state)
{
    (void)state;
    char *text = config();
    cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    char *name = test_name("lease-row");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    /* No GET_LOCK: the row alone. */
    assert_int_equal(q1(my, "SELECT COUNT(*) FROM performance_schema.metadata_locks m JOIN "
                            "cerberus_lock l ON m.OBJECT_NAME = l.lname WHERE l.name = ? AND "
                            "m.OBJECT_TYPE = 'USER LEVEL LOCK'",
                        name),
                     0);
    /* The session that claimed it ends: the hold does not. */
    int64_t conn = q1(my, "SELECT owner_conn FROM cerberus_lock WHERE name = ?", name);
    assert_true(conn > 0);
    char kill[64];
    snprintf(kill, sizeof kill, "KILL CONNECTION %lld", (long long)conn);
    q(my, kill);
    cerb_test_let_time_pass(2500); /* two leases: renewed on another session */
    assert_int_equal(cerb_lock_state(l), CERB_LOCK_VALID);
    assert_int_equal(q1(my, "SELECT COUNT(*) FROM cerberus_lock WHERE name = ? AND owner IS NOT "
                            "NULL AND lease_until > UTC_TIMESTAMP(6)",
                        name),
                     1);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(q1(my, "SELECT COUNT(*) FROM cerberus_lock WHERE name = ? AND owner IS NULL",
                        name),
                     1);
    cerb_lock_free(l);
    cerb_client_close(c);
    mysql_close(my);
    free(name);
}

struct tryer {
    cerb_client *c;
    const char *name;
    bool wait;
    cerb_status st;
    char err[256];
};

static void *try_thread(void *ud)
{
    struct tryer *t = ud;
    cerb_lock *l = cerb_test_handle(t->c, t->name);
    t->st = !l ? CERB_EIO : t->wait ? cerb_lock_trylock_for(l, 8000) : cerb_lock_trylock(l);
    snprintf(t->err, sizeof t->err, "%s", cerb_last_error());
    if (t->st == CERB_OK)
        cerb_lock_unlock(l);
    if (l)
        cerb_lock_free(l);
    return NULL;
}

static void test_deadlock_retried(void **state)
{
    (void)state;
    char *text = config();
    cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    char *name = test_name("lease-deadlock");
    /* The row exists. */
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);

    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    /* A transaction holds the row (X); the claim reads the failover
     * record (a shared lock) and waits for the row; the transaction then
     * wants the record (X): a deadlock, whose victim is the claim (it
     * changed nothing). */
    q(my, "BEGIN");
    assert_int_equal(mysql_test_exec1(my, "UPDATE cerberus_lock SET acquired_at = "
                                          "UTC_TIMESTAMP(6) WHERE name = ?",
                                      name, NULL),
                     0);
    struct tryer t = {.c = c, .name = name};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, try_thread, &t), 0);
    usleep(300 * 1000);
    int rc = mysql_query(my, "UPDATE cerberus_meta SET base = base WHERE k = 'mysql'");
    print_message("the transaction's update of the record: %d (%s)\n", rc, mysql_error(my));
    q(my, "COMMIT");
    pthread_join(th, NULL);
    print_message("claim: %d (%s)\n", (int)t.st, t.err);
    assert_int_equal(t.st, CERB_BUSY);
    /* A wait through the same deadlock is granted. */
    q(my, "BEGIN");
    assert_int_equal(mysql_test_exec1(my, "UPDATE cerberus_lock SET acquired_at = "
                                          "UTC_TIMESTAMP(6) WHERE name = ?",
                                      name, NULL),
                     0);
    t.wait = true;
    assert_int_equal(pthread_create(&th, NULL, try_thread, &t), 0);
    usleep(300 * 1000);
    rc = mysql_query(my, "UPDATE cerberus_meta SET base = base WHERE k = 'mysql'");
    q(my, "COMMIT");
    pthread_join(th, NULL);
    print_message("wait: %d (%s)\n", (int)t.st, t.err);
    assert_int_equal(t.st, CERB_OK);
    mysql_close(my);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_alone),
        cmocka_unit_test(test_deadlock_retried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
