/*
 * test_redis_switch_fits.c — the switch gate over a Redis semaphore and
 * read-write lock (engine.h's cerb_queue_methods.fits): two clients on
 * engines ("redis", "local"), failback manual; one holds on redis, the
 * other switches to local and asks there. The gate asks redis, the engine
 * switched from, whether a member like the new one would be granted at
 * its tail now: a semaphore with a permit to spare admits one more at once
 * (no grace wait) and refuses a request the limit cannot take; a reader
 * standing on redis admits another reader at once and refuses a writer.
 * (failover_pair.c's test_switch_gates_* cover the refusals and the
 * release; this covers the admissions, which held() alone refused.)
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
#include "test_util.h"

#define LEASE_MS 1500

static cerb_client *open_pair(void)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "engines = (\"redis\", \"local\");\n"
             "lock = { lease_ms = %d; };\n"
             "failover = { failback = \"manual\"; };\n"
             "redis = { host = \"127.0.0.1\"; port = %d; };\n",
             LEASE_MS, cerb_test_redis_port());
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    assert_string_equal(cerb_engine_current(c), "redis");
    return c;
}

static void expect_status(cerb_status got, cerb_status want, const char *what)
{
    if (got != want)
        fail_msg("%s: %s, expected %s (%s)", what, cerb_status_name(got),
                 cerb_status_name(want), cerb_last_error());
}

/* Limit 2, one permit held on redis: after the switch one more is granted
 * on local at once; a request for two is refused "after a switch". */
static void test_semaphore_spare_permit_admitted(void **state)
{
    (void)state;
    cerb_client *a = open_pair(), *b = open_pair();
    char *name = test_name("swfits-sem");
    cerb_semaphore *sa = NULL, *sb = NULL, *sb2 = NULL;
    assert_int_equal(cerb_semaphore_new(a, name, 2, NULL, &sa), CERB_OK);
    assert_int_equal(cerb_semaphore_new(b, name, 2, NULL, &sb), CERB_OK);
    assert_int_equal(cerb_semaphore_new(b, name, 2, NULL, &sb2), CERB_OK);
    cerb_permit *pa = NULL, *pb = NULL, *pb2 = NULL;
    expect_status(cerb_semaphore_acquire(sa, 1, 5000, NULL, &pa), CERB_OK, "a permit on redis");
    assert_string_equal(cerb_engine_switch_to(b, "local"), "local");
    expect_status(cerb_semaphore_acquire(sb2, 2, 0, NULL, &pb2), CERB_BUSY,
                  "two permits with one of two held on the old engine");
    if (!strstr(cerb_last_error(), "after a switch"))
        fail_msg("refusal says \"%s\"", cerb_last_error());
    expect_status(cerb_semaphore_acquire(sb, 1, 0, NULL, &pb), CERB_OK,
                  "the spare permit, one of two held on the old engine");
    assert_int_equal(cerb_permit_free(pb), CERB_OK);
    assert_int_equal(cerb_permit_free(pa), CERB_OK);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    cerb_semaphore_free(sb2);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

/* A reader on redis: after the switch another reader is granted on local
 * at once, a writer is refused. */
static void test_rwlock_reader_admitted(void **state)
{
    (void)state;
    cerb_client *a = open_pair(), *b = open_pair();
    char *name = test_name("swfits-rw");
    cerb_rwlock *ra = NULL, *rb = NULL, *wb = NULL;
    assert_int_equal(cerb_rwlock_new(a, name, NULL, &ra), CERB_OK);
    assert_int_equal(cerb_rwlock_new(b, name, NULL, &rb), CERB_OK);
    assert_int_equal(cerb_rwlock_new(b, name, NULL, &wb), CERB_OK);
    expect_status(cerb_rwlock_read_trylock_for(ra, 5000), CERB_OK, "a reader on redis");
    assert_string_equal(cerb_engine_switch_to(b, "local"), "local");
    expect_status(cerb_rwlock_write_trylock_for(wb, 0), CERB_BUSY,
                  "a writer while a reader holds on the old engine");
    expect_status(cerb_rwlock_read_trylock_for(rb, 0), CERB_OK,
                  "a reader beside a reader on the old engine");
    assert_int_equal(cerb_rwlock_read_unlock(rb), CERB_OK);
    assert_int_equal(cerb_rwlock_read_unlock(ra), CERB_OK);
    assert_int_equal(cerb_rwlock_free(ra), CERB_OK);
    assert_int_equal(cerb_rwlock_free(rb), CERB_OK);
    assert_int_equal(cerb_rwlock_free(wb), CERB_OK);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_semaphore_spare_permit_admitted),
        cmocka_unit_test(test_rwlock_reader_admitted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
