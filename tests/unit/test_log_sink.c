/*
 * test_log_sink.c — the log sink is called with no library mutex held: a
 * sink may call back into the library (here: cerb_log_set itself, and a
 * client call), which deadlocked when the sink ran under the sink mutex.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cerberus.h"
#include "log.h"
#include "test_util.h"

static atomic_int lines;

static void reentrant_sink(cerb_log_level level, const char *line, void *ud)
{
    (void)level;
    (void)line;
    atomic_fetch_add(&lines, 1);
    /* Re-register from inside the sink: takes the sink's own lock. */
    cerb_log_set(reentrant_sink, ud, CERB_LOG_INFO);
}

static atomic_int done;

static void *log_main(void *arg)
{
    (void)arg;
    CERB_LOG_W("a line for the sink");
    atomic_store(&done, 1);
    return NULL;
}

static bool is_done(void *ud)
{
    (void)ud;
    return atomic_load(&done) != 0;
}

static void test_sink_may_call_the_library(void **state)
{
    (void)state;
    pthread_t t;
    assert_int_equal(cerb_log_set(reentrant_sink, NULL, CERB_LOG_INFO), CERB_OK);
    assert_int_equal(pthread_create(&t, NULL, log_main, NULL), 0);
    bool returned = wait_until(is_done, NULL, 2000);
    if (!returned) {
        pthread_detach(t); /* deadlocked: report, do not hang */
        fail_msg("the log call did not return: the sink ran under a library mutex");
    }
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&lines), 1);
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sink_may_call_the_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
