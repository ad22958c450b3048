/*
 * test_redis_election_pause.c — a leader whose server stops answering
 * (SIGSTOP) past its lease: the term turns LOST with one call of the
 * election's lost callback, no later than the lease allows and not before;
 * proclaim and resign then say CERB_LOST; once the server runs again the
 * key has expired there and the next candidate is elected with a higher
 * fence and its own value. This suite owns its server (it pauses it), see
 * tests/CMakeLists.txt.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

static cerb_client *open_client(const char *redis_extra)
{
    char *cfg = cerb_test_redis_config(redis_extra, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static int teardown(void **state)
{
    (void)state;
    cerb_test_redis_resume();
    return 0;
}

static atomic_int lost_calls;
static cerb_election *lost_who;

static void on_lost(cerb_election *e, void *ud)
{
    (void)ud;
    lost_who = e;
    atomic_fetch_add(&lost_calls, 1);
}

static bool lost_seen(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_term_lost_when_server_paused(void **state)
{
    (void)state;
    cerb_client *c = open_client("op_timeout_ms = 100; connect_timeout_ms = 100;");
    char *name = test_name("el-paused");
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.lease_ms = 600;
    cerb_election *a = NULL;
    assert_int_equal(cerb_election_new(c, name, &o, &a), CERB_OK);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_election_on_lost(a, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_OK);
    uint64_t fa = cerb_election_fencing_token(a);

    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_test_redis_pause(), 0);
    assert_wait_until(lost_seen, NULL, 3000);
    /* Not before the lease could have run out on the server. */
    assert_true(cerb_test_now_ms() - t0 >= 300);
    assert_ptr_equal(lost_who, a);
    assert_int_equal(cerb_election_state(a), CERB_LOCK_LOST);
    assert_int_equal(cerb_election_valid_ms(a), 0);
    /* Known lost here: nothing is sent to the paused server. */
    int64_t t1 = cerb_test_now_ms();
    assert_int_equal(cerb_election_proclaim(a, "vz", 2), CERB_LOST);
    assert_true(cerb_test_now_ms() - t1 < 100);
    assert_int_equal(cerb_test_redis_resume(), 0);
    assert_int_equal(cerb_election_resign(a), CERB_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);

    /* The server expired the key: the next candidate leads, above A. */
    cerb_client *c2 = open_client(NULL);
    cerb_election *b = NULL;
    assert_int_equal(cerb_election_new(c2, name, NULL, &b), CERB_OK);
    assert_int_equal(cerb_election_campaign(b, "vb", 2, 3000, NULL), CERB_OK);
    assert_true(cerb_election_fencing_token(b) > fa);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_OK);
    assert_int_equal(li.has_leader, 1);
    assert_int_equal(li.value_known, 1);
    assert_int_equal(li.value_len, 2);
    assert_memory_equal(li.value, "vb", 2);
    cerb_leader_info_clear(&li);
    /* A's old term can no longer speak for the name. */
    assert_int_equal(cerb_election_proclaim(a, "va", 2), CERB_NOT_OWNER);
    cerb_election_free(b);
    cerb_election_free(a);
    cerb_client_close(c2);
    cerb_client_close(c);
    free(name);
}

/* While the server is paused nobody can be read as leading or not:
 * leader() fails (an error), it never answers "nobody". */
static void test_leader_unreachable_is_an_error(void **state)
{
    (void)state;
    cerb_client *c = open_client("op_timeout_ms = 100; connect_timeout_ms = 100;");
    char *name = test_name("el-unreach");
    assert_int_equal(cerb_test_redis_pause(), 0);
    cerb_leader_info li;
    cerb_status st = cerb_election_leader(c, name, 0, &li);
    assert_int_not_equal(st, CERB_OK);
    assert_int_equal(li.has_leader, 0);
    cerb_leader_info_clear(&li);
    assert_int_equal(cerb_test_redis_resume(), 0);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_term_lost_when_server_paused, teardown),
        cmocka_unit_test_teardown(test_leader_unreachable_is_an_error, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
