/*
 * test_mysql_promote_fault.c — a promoted replica that lost the last
 * grants. The suite starts a MariaDB primary and an asynchronous GTID
 * replica of its own (ports $CERB_MYSQL_PORT + 20 and + 21,
 * scripts/servers.d/mysql.sh --nodes 2; it holds the mysql_server resource
 * lock with the exclusive fixture), stops the replica's IO thread so that
 * one grant never reaches it, kills the primary and promotes the replica
 * (STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0). A client of the
 * promoted server must see another server's record in cerberus_meta: it
 * grants nothing until the longest lease has passed (the holder of the
 * lost grant believed in it until then) and its fence is above the lost
 * one — without the check it would be granted at once, with a fence the
 * lost grant already had.
 */
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
#include "mysql_util.h"
#include "test_util.h"

#define LEASE_MS 3000

static int base_port(void) { return mysql_test_port() + 20; }

static int servers(const char *cmd)
{
    char script[1024], p[16];
    snprintf(script, sizeof script, "%s/scripts/servers.sh", cerb_test_source_dir());
    snprintf(p, sizeof p, "%d", base_port());
    char *argv[] = {"bash", script, (char *)cmd, "mysql", "--port", p, "--nodes", "2", NULL};
    return cerb_test_run(argv, 120000);
}

/* The admin session of the server on port (root through the unix socket
 * in its data directory, as servers.d/mysql.sh makes it). */
static MYSQL *admin(int port)
{
    char path[512], data[400] = "", sock[480];
    snprintf(path, sizeof path, "%s/mysql-%d.dir", cerb_test_state_dir(), port);
    FILE *f = fopen(path, "r");
    if (!f || !fgets(data, sizeof data, f)) {
        if (f)
            fclose(f);
        return NULL;
    }
    fclose(f);
    data[strcspn(data, "\n")] = '\0';
    snprintf(sock, sizeof sock, "%s/mysqld.sock", data);
    const char *user = getuid() == 0 ? "root" : getenv("USER");
    MYSQL *my = mysql_init(NULL);
    unsigned timeout = 5;
    mysql_options(my, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    if (!mysql_real_connect(my, "localhost", user ? user : "root", "", NULL, 0, sock, 0)) {
        fprintf(stderr, "admin :%d: %s\n", port, mysql_error(my));
        mysql_close(my);
        return NULL;
    }
    return my;
}

static void q(MYSQL *my, const char *sql)
{
    if (mysql_query(my, sql) != 0)
        fail_msg("%s: %s", sql, mysql_error(my));
}

static int64_t scalar(MYSQL *my, const char *sql)
{
    int64_t v = -1;
    if (mysql_query(my, sql) != 0)
        fail_msg("%s: %s", sql, mysql_error(my));
    MYSQL_RES *r = mysql_store_result(my);
    MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
    if (row && row[0])
        v = strtoll(row[0], NULL, 10);
    if (r)
        mysql_free_result(r);
    return v;
}

static cerb_client *open_client(int port)
{
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "engines = (\"mysql\");\nlock = { lease_ms = %d; };\n"
             "mysql = { host = \"127.0.0.1\"; port = %d; user = \"cerb\"; database = \"cerb\"; "
             "op_timeout_ms = 500; connect_timeout_ms = 1000; };\n",
             LEASE_MS, port);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    return c;
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

static void test_promoted_replica_quarantines_and_raises_fences(void **state)
{
    (void)state;
    assert_int_equal(servers("start"), 0);
    MYSQL *pa = admin(base_port()), *ra = admin(base_port() + 1);
    assert_non_null(pa);
    assert_non_null(ra);
    cerb_client *a = open_client(base_port());
    char *name = test_name("my-promote");
    char sql[512];
    /* The name's row exists on both (a first grant, replicated). */
    cerb_lock *la = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    {
        /* The replica has applied everything the primary wrote so far. */
        char pos[256] = "";
        q(pa, "SELECT @@gtid_binlog_pos");
        MYSQL_RES *r = mysql_store_result(pa);
        MYSQL_ROW row = r ? mysql_fetch_row(r) : NULL;
        if (row && row[0])
            snprintf(pos, sizeof pos, "%s", row[0]);
        if (r)
            mysql_free_result(r);
        snprintf(sql, sizeof sql, "SELECT MASTER_GTID_WAIT('%s', 10)", pos);
        assert_int_equal(scalar(ra, sql), 0);
    }

    /* The replica stops receiving: what the primary commits from now on
     * never reaches it. */
    q(ra, "STOP SLAVE IO_THREAD");
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK); /* never reaches the replica */
    int64_t lost_fence = scalar(pa, "SELECT MAX(fence) FROM cerb.cerberus_lock");
    int64_t replica_fence = scalar(ra, "SELECT MAX(fence) FROM cerb.cerberus_lock");
    assert_true(replica_fence < lost_fence);

    pid_t primary = cerb_test_server_pid("mysql", base_port());
    assert_true(primary > 0);
    assert_int_equal(kill(primary, SIGKILL), 0);
    int64_t t_kill = cerb_test_now_ms();
    mysql_close(pa);
    q(ra, "STOP SLAVE");
    q(ra, "RESET SLAVE ALL");
    q(ra, "SET GLOBAL read_only = 0");

    cerb_client *b = open_client(base_port() + 1);
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(lb, 15000), CERB_OK);
    int64_t waited = cerb_test_now_ms() - t_kill;
    int64_t fence = scalar(ra, "SELECT MAX(fence) FROM cerb.cerberus_lock");
    print_message("promoted replica: granted %lld ms after the kill, fence %lld (lost %lld, "
                  "the replica had %lld)\n",
                  (long long)waited, (long long)fence, (long long)lost_fence,
                  (long long)replica_fence);
    assert_true(waited >= LEASE_MS - 200);
    assert_true(fence > lost_fence);
    /* The holder of the lost grant was told before that. */
    assert_true(wait_until(lost_told, NULL, 1000));
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    mysql_close(ra);
    cerb_client_close(a);
    cerb_client_close(b);
}

static int teardown(void **state)
{
    (void)state;
    servers("stop");
    return 0;
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_promoted_replica_quarantines_and_raises_fences),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
