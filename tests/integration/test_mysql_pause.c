/*
 * test_mysql_pause.c — the mysql engine against a paused MariaDB (SIGSTOP,
 * the exclusive fixture): the server accepts bytes and never answers, so
 * every call must end by its own deadline (DESIGN.md §5a.4), and the
 * sessions that missed one are closed. A trylock and an unlock return
 * within a few operation timeouts; the holder is told LOST by its own
 * deadline; once the server runs again, a waiter gets the name only after
 * the holder's lease has run out on the server (its row), and the fence
 * grows.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "mysql_util.h"
#include "test_util.h"

static atomic_int lost;

static void on_lost(cerb_lock *l, void *ud)
{
    (void)l, (void)ud;
    atomic_store(&lost, 1);
}

static bool lost_pred(void *ud)
{
    (void)ud;
    return atomic_load(&lost) != 0;
}

static void test_paused_server(void **state)
{
    (void)state;
    char *text = mysql_test_config("op_timeout_ms = 300; connect_timeout_ms = 500;",
                                   "lock = { lease_ms = 2000; };");
    cerb_client *a = cerb_test_open(text), *b = cerb_test_open(text);
    free(text);
    assert_non_null(a);
    assert_non_null(b);
    char *name = test_name("paused");
    cerb_lock *la = cerb_test_handle(a, name), *lb = cerb_test_handle(b, name);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    uint64_t fa = cerb_lock_fencing_token(la);

    pid_t pid = cerb_test_server_pid("mysql", mysql_test_port());
    assert_true(pid > 0);
    assert_int_equal(cerb_test_pause_pid(pid), 0);
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_lock_trylock(lb);
    int64_t took = cerb_test_now_ms() - t0;
    print_message("trylock on a paused server: %s in %lld ms\n", cerb_status_name(st),
                  (long long)took);
    assert_int_not_equal(st, CERB_OK);
    assert_true(took < 4000);
    /* The holder cannot renew: it is told by its own deadline. */
    assert_true(wait_until(lost_pred, NULL, 4000));
    t0 = cerb_test_now_ms();
    st = cerb_lock_unlock(la);
    took = cerb_test_now_ms() - t0;
    print_message("unlock on a paused server: %s in %lld ms\n", cerb_status_name(st),
                  (long long)took);
    assert_true(took < 4000);
    assert_int_equal(cerb_test_resume_pid(pid), 0);

    /* Running again: the waiter gets it, after the old lease, with a
     * higher fence. */
    assert_int_equal(cerb_lock_trylock_for(lb, 15000), CERB_OK);
    assert_true(cerb_lock_fencing_token(lb) > fa);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paused_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
