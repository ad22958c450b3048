/*
 * test_mysql_init_fault.c — the mysql engine on a database without its
 * tables (the exclusive MariaDB fixture: the tables are moved aside, then
 * put back): open fails with ECONFIG naming `cerberus init`; cerb_store_init
 * (what `cerberus init` runs) creates them (PREPARED), a second run finds
 * them (ALREADY), and locking works again.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "mysql_util.h"
#include "test_util.h"

static void q(MYSQL *my, const char *sql)
{
    if (mysql_query(my, sql) != 0)
        fail_msg("%s: %s", sql, mysql_error(my));
}

static void test_missing_tables(void **state)
{
    (void)state;
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    q(my, "DROP TABLE IF EXISTS cerberus_lock_saved, cerberus_guard_saved");
    q(my, "RENAME TABLE cerberus_lock TO cerberus_lock_saved, "
          "cerberus_guard TO cerberus_guard_saved");

    char *text = mysql_test_config(NULL, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, text);
    print_message("no tables: %s\n", cerb_last_error());
    assert_int_not_equal(st, CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "cerberus init"));
    assert_non_null(strstr(cerb_last_error(), "`cerb`.cerberus_lock"));

    char *path = cerb_test_write_config("%s", text);
    cerb_store_report *rep = NULL;
    size_t n = 0;
    assert_int_equal(cerb_store_init(path, 0, &rep, &n), CERB_OK);
    assert_int_equal(n, 1);
    print_message("init: %s\n", rep[0].text);
    assert_int_equal(rep[0].result, CERB_STORE_PREPARED);
    cerb_store_reports_free(rep, n);
    assert_int_equal(cerb_store_init(path, 0, &rep, &n), CERB_OK);
    assert_int_equal(rep[0].result, CERB_STORE_ALREADY);
    cerb_store_reports_free(rep, n);

    c = cerb_test_open(text);
    assert_non_null(c);
    char *name = test_name("after-init");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_true(cerb_lock_fencing_token(l) > 0);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);

    q(my, "DROP TABLE cerberus_lock, cerberus_guard");
    q(my, "RENAME TABLE cerberus_lock_saved TO cerberus_lock, "
          "cerberus_guard_saved TO cerberus_guard");
    free(name);
    free(text);
    cerb_test_remove_file(path);
    mysql_close(my);
}

/* Tables made before the failover record existed: open names `cerberus
 * init`, which adds what is missing (cerberus_meta with this server's
 * record, cerberus_boot), so the first client then need not wait. */
static void test_missing_meta(void **state)
{
    (void)state;
    MYSQL *my = mysql_test_connect(NULL, NULL);
    assert_non_null(my);
    q(my, "DROP TABLE cerberus_meta, cerberus_boot");
    char *text = mysql_test_config(NULL, "lock = { lease_ms = 5000; };");
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, text);
    print_message("no cerberus_meta: %s\n", cerb_last_error());
    assert_int_not_equal(st, CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "cerberus init"));
    assert_non_null(strstr(cerb_last_error(), "cerberus_meta"));

    char *path = cerb_test_write_config("%s", text);
    cerb_store_report *rep = NULL;
    size_t n = 0;
    assert_int_equal(cerb_store_init(path, 0, &rep, &n), CERB_OK);
    assert_int_equal(n, 1);
    print_message("init: %s\n", rep[0].text);
    assert_int_equal(rep[0].result, CERB_STORE_PREPARED);
    assert_non_null(strstr(rep[0].text, "what was missing"));
    cerb_store_reports_free(rep, n);

    c = cerb_test_open(text);
    assert_non_null(c);
    char *name = test_name("after-meta");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK); /* no quarantine */
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
    free(text);
    cerb_test_remove_file(path);
    mysql_close(my);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_tables),
        cmocka_unit_test(test_missing_meta),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
