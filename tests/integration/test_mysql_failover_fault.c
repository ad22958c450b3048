/*
 * test_mysql_failover_fault.c — the exclusive MariaDB killed and restarted
 * (scripts/servers.d/mysql.sh):
 *   kill_restart    servers.sh restarts a killed server at once, every
 *                   time (a killed mariadbd's main process is gone 10–15
 *                   ms before its threads close the listening socket, and
 *                   start took the port for a foreign server's).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "mysql_util.h"
#include "test_util.h"

static void test_kill_restart(void **state)
{
    (void)state;
    for (int i = 0; i < 12; i++) {
        pid_t pid = cerb_test_server_pid("mysql", mysql_test_port());
        assert_true(pid > 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(cerb_test_servers_run("start", "mysql", mysql_test_port(), 60000), 0);
    }
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
