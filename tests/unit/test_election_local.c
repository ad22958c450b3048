/*
 * test_election_local.c — leader election (core/election.c) on the
 * in-process local engine: one leader at a time, elected in the order the
 * candidates came, the value readable by anyone and changed by proclaim,
 * fences growing term after term, the lost callback once per term (a
 * suspended machine), freeing while leading, bad input, and the clear
 * refusal of an engine without elections (the local engine in file mode).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "fault_engine.h"
#include "test_util.h"

static cerb_client *open_local(void)
{
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"local\");\n"), CERB_OK);
    return c;
}

static cerb_election *candidate(cerb_client *c, const char *name)
{
    cerb_election *e = NULL;
    assert_int_equal(cerb_election_new(c, name, NULL, &e), CERB_OK);
    return e;
}

/* The leader's value as a string ("" when unknown), or NULL for nobody. */
static char *leader_value(cerb_client *c, const char *name)
{
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_OK);
    char *v = NULL;
    if (li.has_leader) {
        v = strdup(li.value_known ? (const char *)li.value : "");
        assert_string_equal(li.engine, "local");
        assert_true(li.term > 0);
    }
    cerb_leader_info_clear(&li);
    return v;
}

static void test_one_leader_and_its_value(void **state)
{
    (void)state;
    cerb_client *c1 = open_local(), *c2 = open_local(), *obs = open_local();
    cerb_election *a = candidate(c1, "el-one"), *b = candidate(c2, "el-one");

    char *v = leader_value(obs, "el-one");
    assert_null(v); /* nobody yet */
    assert_int_equal(cerb_election_state(a), CERB_LOCK_FREE);
    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_OK);
    assert_int_equal(cerb_election_state(a), CERB_LOCK_VALID);
    assert_true(cerb_election_valid_ms(a) > 0);
    uint64_t fa = cerb_election_fencing_token(a);
    assert_true(fa > 0);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_BUSY);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 100, NULL), CERB_TIMEOUT);
    v = leader_value(obs, "el-one");
    assert_string_equal(v, "node-a");
    free(v);

    assert_int_equal(cerb_election_proclaim(a, "node-a:2", 8), CERB_OK);
    v = leader_value(obs, "el-one");
    assert_string_equal(v, "node-a:2");
    free(v);
    assert_int_equal(cerb_election_proclaim(b, "x", 1), CERB_NOT_OWNER);

    assert_int_equal(cerb_election_resign(a), CERB_OK);
    assert_int_equal(cerb_election_state(a), CERB_LOCK_FREE);
    assert_int_equal(cerb_election_fencing_token(a), fa); /* still readable */
    assert_null(leader_value(obs, "el-one"));
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_OK);
    assert_true(cerb_election_fencing_token(b) > fa);
    v = leader_value(obs, "el-one");
    assert_string_equal(v, "node-b");
    free(v);

    /* The metrics count the terms won and the proclaims on this client. */
    char *m = NULL;
    assert_int_equal(cerb_metrics_text(c1, &m), CERB_OK);
    assert_non_null(strstr(m, "cerberus_election_terms_total{engine=\"local\"} 1\n"));
    assert_non_null(strstr(m, "cerberus_election_proclaims_total{engine=\"local\"} 1\n"));
    cerb_free(m);

    /* Freed while leading: the term ends with it. */
    assert_int_equal(cerb_election_free(b), CERB_OK);
    assert_null(leader_value(obs, "el-one"));
    assert_int_equal(cerb_election_campaign(a, NULL, 0, 0, NULL), CERB_OK);
    v = leader_value(obs, "el-one");
    assert_string_equal(v, ""); /* an empty value is a value */
    free(v);
    assert_int_equal(cerb_election_free(a), CERB_OK);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(obs);
}

struct waiter {
    cerb_election *e;
    const char *value;
    atomic_int done;
    cerb_status st;
};

static void *campaign_thread(void *p)
{
    struct waiter *w = p;
    w->st = cerb_election_campaign(w->e, w->value, strlen(w->value), 5000, NULL);
    atomic_store(&w->done, 1);
    return NULL;
}

static bool w_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done) != 0; }

/* Waiting candidates are elected one at a time, in the order they came. */
static void test_elected_in_order(void **state)
{
    (void)state;
    cerb_client *c0 = open_local(), *c1 = open_local(), *c2 = open_local();
    cerb_election *lead = candidate(c0, "el-order");
    assert_int_equal(cerb_election_campaign(lead, "first", 5, 0, NULL), CERB_OK);
    struct waiter w1 = {candidate(c1, "el-order"), "second", 0, CERB_OK};
    struct waiter w2 = {candidate(c2, "el-order"), "third", 0, CERB_OK};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, campaign_thread, &w1), 0);
    /* w1 waits before w2 starts: its place in line is taken. */
    cerb_test_let_time_pass(100);
    assert_int_equal(pthread_create(&t2, NULL, campaign_thread, &w2), 0);
    cerb_test_let_time_pass(100);
    assert_false(atomic_load(&w1.done) || atomic_load(&w2.done));

    assert_int_equal(cerb_election_resign(lead), CERB_OK);
    assert_true(wait_until(w_done, &w1, 3000));
    assert_int_equal(w1.st, CERB_OK);
    assert_false(atomic_load(&w2.done)); /* one leader at a time */
    char *v = leader_value(c0, "el-order");
    assert_string_equal(v, "second");
    free(v);
    uint64_t f1 = cerb_election_fencing_token(w1.e);
    assert_true(f1 > cerb_election_fencing_token(lead));

    assert_int_equal(cerb_election_resign(w1.e), CERB_OK);
    assert_true(wait_until(w_done, &w2, 3000));
    assert_int_equal(w2.st, CERB_OK);
    assert_true(cerb_election_fencing_token(w2.e) > f1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    cerb_election_free(w2.e);
    cerb_election_free(w1.e);
    cerb_election_free(lead);
    cerb_client_close(c0);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

static atomic_int lost_calls;
static cerb_election *lost_who;

static void on_lost(cerb_election *e, void *ud)
{
    lost_who = e;
    atomic_fetch_add(&lost_calls, 1);
    atomic_store((atomic_int *)ud, 1);
}

static bool flag_set(void *ud) { return atomic_load((atomic_int *)ud) != 0; }

/* A term whose lease ran out while the machine slept is lost at once, and
 * its candidate told once; what leading needs then says CERB_LOST. */
static void test_lost_term_told_once(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.lease_ms = 3000;
    cerb_election *e = NULL;
    assert_int_equal(cerb_election_new(c, "el-lost", &o, &e), CERB_OK);
    atomic_int flag = 0;
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_election_on_lost(e, on_lost, &flag), CERB_OK);
    assert_int_equal(cerb_election_campaign(e, "v", 1, 0, NULL), CERB_OK);

    cerb__clock_test_suspend(5000); /* asleep longer than the lease */
    assert_int_equal(cerb_election_state(e), CERB_LOCK_LOST);
    assert_true(wait_until(flag_set, &flag, 2000));
    assert_ptr_equal(lost_who, e);
    assert_int_equal(cerb_election_proclaim(e, "w", 1), CERB_LOST);
    assert_int_equal(cerb_election_resign(e), CERB_LOST);
    assert_int_equal(atomic_load(&lost_calls), 1);
    assert_int_equal(cerb_election_state(e), CERB_LOCK_FREE);

    /* A new term, lost in turn: told again (once per term). A callback set
     * after the loss is queued at once. */
    assert_int_equal(cerb_election_on_lost(e, NULL, NULL), CERB_OK);
    assert_int_equal(cerb_election_campaign(e, "v", 1, 0, NULL), CERB_OK);
    cerb__clock_test_suspend(5000);
    assert_int_equal(cerb_election_state(e), CERB_LOCK_LOST);
    atomic_store(&flag, 0);
    assert_int_equal(cerb_election_on_lost(e, on_lost, &flag), CERB_OK);
    assert_true(wait_until(flag_set, &flag, 2000));
    assert_int_equal(atomic_load(&lost_calls), 2);
    assert_int_equal(cerb_election_free(e), CERB_LOST);
    cerb_client_close(c);
}

static void test_bad_input(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_election *e = NULL;
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.layout = 7;
    assert_int_equal(cerb_election_new(c, "el-bad", &o, &e), CERB_EINVAL);
    assert_null(e);
    assert_int_equal(cerb_election_new(c, "", NULL, &e), CERB_EINVAL);
    assert_int_equal(cerb_election_new(c, "el-bad", NULL, NULL), CERB_EINVAL);
    e = candidate(c, "el-bad");
    assert_int_equal(cerb_election_campaign(e, NULL, 3, 0, NULL), CERB_EINVAL);
    char *big = calloc(1, CERB_ELECTION_VALUE_MAX + 1);
    assert_non_null(big);
    assert_int_equal(cerb_election_campaign(e, big, CERB_ELECTION_VALUE_MAX + 1, 0, NULL),
                     CERB_EINVAL);
    assert_int_equal(cerb_election_campaign(e, "v", 1, -2, NULL), CERB_EINVAL);
    assert_int_equal(cerb_election_resign(e), CERB_NOT_OWNER);
    assert_int_equal(cerb_election_proclaim(e, "v", 1), CERB_NOT_OWNER);
    assert_int_equal(cerb_election_campaign(e, big, CERB_ELECTION_VALUE_MAX, 0, NULL), CERB_OK);
    assert_int_equal(cerb_election_campaign(e, "v", 1, 0, NULL), CERB_EINVAL); /* leads already */
    assert_int_equal(cerb_election_proclaim(e, big, CERB_ELECTION_VALUE_MAX + 1), CERB_EINVAL);
    free(big);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, "el-bad", 9, &li), CERB_EINVAL);
    assert_int_equal(cerb_election_leader(c, NULL, 0, &li), CERB_EINVAL);
    assert_int_equal(cerb_election_leader(NULL, "el-bad", 0, &li), CERB_EINVAL);
    assert_int_equal(cerb_election_leader(c, "el-bad", 0, NULL), CERB_EINVAL);
    assert_int_equal(cerb_election_free(e), CERB_OK);
    assert_int_equal(cerb_election_free(NULL), CERB_OK);
    assert_int_equal(cerb_election_state(NULL), CERB_LOCK_FREE);
    assert_int_equal(cerb_election_fencing_token(NULL), 0);
    cerb_client_close(c);
}

/* An engine without elections says so, naming itself, and nothing is held. */
static void test_engine_without_elections(void **state)
{
    (void)state;
    char dir[] = "/tmp/cerb-elect-XXXXXX", cfg[256];
    assert_non_null(mkdtemp(dir));
    snprintf(cfg, sizeof cfg, "engines = (\"local\");\nlocal = { dir = \"%s\"; };\n", dir);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_OK);
    cerb_election *e = candidate(c, "el-file");
    assert_int_equal(cerb_election_campaign(e, "v", 1, 0, NULL), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "no leader election"));
    assert_int_equal(cerb_election_state(e), CERB_LOCK_FREE);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, "el-file", 0, &li), CERB_UNAVAILABLE);
    /* A final answer about the engine, not a failure of it: tried once,
     * no breaker count. */
    struct cerb_engine_info ei;
    assert_int_equal(cerb_engine_info(c, "local", &ei), CERB_OK);
    assert_int_equal(ei.failures, 0);
    assert_int_equal(ei.breaker, CERB_BREAKER_CLOSED);
    /* The name is not left taken: a lock of the same name is free. */
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, "el-file", NULL, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_election_free(e);
    cerb_client_close(c);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
}

struct camp {
    cerb_election *e;
    cerb_cancel *k;
    atomic_int started, done;
    cerb_status st;
};

static void *camp_thread(void *p)
{
    struct camp *c = p;
    atomic_store(&c->started, 1);
    c->st = cerb_election_campaign(c->e, "w", 1, -1, c->k);
    atomic_store(&c->done, 1);
    return NULL;
}

static bool camp_done(void *ud) { return atomic_load(&((struct camp *)ud)->done) != 0; }
static bool camp_started(void *ud) { return atomic_load(&((struct camp *)ud)->started) != 0; }

/* A candidate is not freed under a campaign running on another thread:
 * BUSY until the campaign ends (its cancel), then freed. */
static void test_free_during_campaign(void **state)
{
    (void)state;
    cerb_client *c1 = open_local(), *c2 = open_local();
    cerb_election *lead = candidate(c1, "el-free");
    assert_int_equal(cerb_election_campaign(lead, "l", 1, 0, NULL), CERB_OK);
    struct camp cp = {candidate(c2, "el-free"), NULL, 0, 0, CERB_OK};
    assert_int_equal(cerb_cancel_new(&cp.k), CERB_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, camp_thread, &cp), 0);
    assert_true(wait_until(camp_started, &cp, 3000));
    cerb_test_let_time_pass(50); /* inside its wait */
    assert_int_equal(cerb_election_free(cp.e), CERB_BUSY);
    assert_int_equal(cerb_election_state(cp.e), CERB_LOCK_FREE); /* still usable */
    cerb_cancel_fire(cp.k);
    assert_true(wait_until(camp_done, &cp, 3000));
    pthread_join(t, NULL);
    assert_int_equal(cp.st, CERB_INTERRUPTED);
    assert_int_equal(cerb_election_free(cp.e), CERB_OK);
    cerb_cancel_free(cp.k);
    char *v = leader_value(c1, "el-free");
    assert_string_equal(v, "l"); /* the leader was never disturbed */
    free(v);
    cerb_election_free(lead);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

/* Each term's loss is told, with the callback set once: the second term
 * is not taken for the first (whose hold memory it may reuse). */
static void test_each_term_told(void **state)
{
    (void)state;
    cerb_client *c = open_local();
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.lease_ms = 3000;
    cerb_election *e = NULL;
    assert_int_equal(cerb_election_new(c, "el-terms", &o, &e), CERB_OK);
    atomic_int flag = 0;
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_election_on_lost(e, on_lost, &flag), CERB_OK);
    for (int term = 1; term <= 3; term++) {
        atomic_store(&flag, 0);
        assert_int_equal(cerb_election_campaign(e, "v", 1, 0, NULL), CERB_OK);
        cerb__clock_test_suspend(5000);
        assert_true(wait_until(flag_set, &flag, 2000));
        assert_int_equal(atomic_load(&lost_calls), term);
        assert_int_equal(cerb_election_resign(e), CERB_LOST);
    }
    cerb_election_free(e);
    cerb_client_close(c);
}

/* A term whose deadline passes during its post-grant proclaim (an engine
 * whose value is proclaimed after the grant, as redis; here a client
 * deadline well before the server's, renewals failing, a slow proclaim
 * that still lands): the campaign answers CERB_LOST, not a term the caller
 * would lead with after its loss, and no lost callback is queued for a
 * term it never got. */
static void test_term_lost_during_proclaim(void **state)
{
    (void)state;
    fault_engine_register();
    fault_engine_reset();
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, "engines = (\"fault\");\n"), CERB_OK);
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.lease_ms = 1000;
    cerb_election *e = NULL;
    assert_int_equal(cerb_election_new(c, "el-slow", &o, &e), CERB_OK);
    atomic_int flag = 0;
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_election_on_lost(e, on_lost, &flag), CERB_OK);
    fault_engine_ttl_div(4);                           /* ours ends at ~250 ms */
    fault_engine_set(FAULT_RENEW, 1, true, FAULT_BEFORE); /* no renewal lands */
    fault_engine_delay(FAULT_PROCLAIM, 500, false);    /* lands at ~500 ms */
    assert_int_equal(cerb_election_campaign(e, "v", 1, 0, NULL), CERB_LOST);
    assert_int_equal(cerb_election_state(e), CERB_LOCK_FREE);
    assert_true(fault_engine_calls(FAULT_PROCLAIM) >= 1);
    cerb_test_let_time_pass(300); /* a wrong callback would be queued by now */
    assert_int_equal(atomic_load(&lost_calls), 0);
    fault_engine_reset();
    cerb_election_free(e);
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_leader_and_its_value),
        cmocka_unit_test(test_elected_in_order),
        cmocka_unit_test(test_lost_term_told_once),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_engine_without_elections),
        cmocka_unit_test(test_free_during_campaign),
        cmocka_unit_test(test_each_term_told),
        cmocka_unit_test(test_term_lost_during_proclaim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
