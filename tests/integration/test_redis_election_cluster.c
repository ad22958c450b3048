/*
 * test_redis_election_cluster.c — leader election on a real Redis Cluster
 * (three masters, three replicas, started by this suite as
 * test_redis_cluster.c does: scripts/servers.sh start cluster on
 * $CERB_CLUSTER_PORT .. +5, stopped at the end). For names whose slots lie
 * on every master, names with braces among them (their helper keys take the
 * "{n}K\x1f…" form), a campaign, the leader read from another client,
 * proclaim, BUSY for a second candidate and its election after the resign
 * with a higher fence; a term renewed a few times stays valid with its
 * value. proclaim, leader and the renewals (which declare the value key)
 * are routed to the slot's master, and the value key shares K's slot (a
 * script naming keys of two slots would fail with CROSSSLOT).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#define FENCE_MASK ((UINT64_C(1) << 48) - 1)

static int base_port(void) { return cerb_test_env_port("CERB_CLUSTER_PORT", 27100); }

static int servers(const char *cmd)
{
    return cerb_test_servers_run(cmd, "cluster", base_port(), 120000);
}

static cerb_client *open_client(void)
{
    int b = base_port();
    char text[1024];
    snprintf(text, sizeof text,
             "engines = (\"redis\");\n"
             "redis = { mode = \"cluster\"; nodes = (\"127.0.0.1:%d\", \"127.0.0.1:%d\");\n"
             "  connect_timeout_ms = 300; op_timeout_ms = 500; };\n"
             "lock = { lease_ms = 3000; renew = true; };\n",
             b, b + 1);
    cerb_client *c = cerb_test_open(text);
    assert_non_null(c);
    return c;
}

static int setup(void **state)
{
    (void)state;
    return servers("start") == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    servers("stop");
    return 0;
}

static void assert_leader(cerb_client *obs, const char *name, cerb_election *e,
                          const char *value)
{
    cerb_leader_info li;
    cerb_status st = cerb_election_leader(obs, name, 0, &li);
    if (st != CERB_OK)
        fail_msg("leader \"%s\": %s: %s", name, cerb_status_name(st), cerb_last_error());
    assert_int_equal(li.has_leader, 1);
    assert_int_equal(li.value_known, 1);
    assert_int_equal(li.value_len, strlen(value));
    assert_memory_equal(li.value, value, li.value_len);
    assert_int_equal(li.term, cerb_election_fencing_token(e) & FENCE_MASK);
    assert_true(li.ttl_ms > 0);
    cerb_leader_info_clear(&li);
}

static void test_election_on_every_master(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(), *c2 = open_client();
    for (int i = 0; i < 12; i++) {
        char base[32];
        /* A third of the names carry a hash tag of their own. */
        snprintf(base, sizeof base, i % 3 == 0 ? "el{t%d}x" : "el%d", i);
        char *name = test_name(base);
        cerb_election *a = NULL, *b = NULL;
        /* Short terms: renewals (which declare the value key too) run
         * while the names with a tag of their own are held below. */
        cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
        o.lease_ms = 900;
        assert_int_equal(cerb_election_new(c1, name, &o, &a), CERB_OK);
        assert_int_equal(cerb_election_new(c2, name, NULL, &b), CERB_OK);
        cerb_leader_info li;
        assert_int_equal(cerb_election_leader(c2, name, 0, &li), CERB_OK);
        assert_int_equal(li.has_leader, 0);
        cerb_leader_info_clear(&li);

        assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_OK);
        assert_leader(c2, name, a, "va");
        assert_int_equal(cerb_election_campaign(b, "vb", 2, 0, NULL), CERB_BUSY);
        assert_int_equal(cerb_election_proclaim(a, "va2", 3), CERB_OK);
        assert_leader(c2, name, a, "va2");
        if (i % 3 == 0) {
            cerb_test_let_time_pass(1000); /* about three renewals */
            assert_int_equal(cerb_election_state(a), CERB_LOCK_VALID);
            assert_leader(c2, name, a, "va2");
        }
        uint64_t fa = cerb_election_fencing_token(a);
        assert_int_equal(cerb_election_resign(a), CERB_OK);
        assert_int_equal(cerb_election_campaign(b, "vb", 2, 2000, NULL), CERB_OK);
        assert_true(cerb_election_fencing_token(b) > fa);
        assert_leader(c1, name, b, "vb");
        assert_int_equal(cerb_election_proclaim(a, "x", 1), CERB_NOT_OWNER);
        assert_int_equal(cerb_election_resign(b), CERB_OK);
        cerb_election_free(a);
        cerb_election_free(b);
        free(name);
    }
    cerb_client_close(c1);
    cerb_client_close(c2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_election_on_every_master),
    };
    cerb_test_debug_aids();
    return cmocka_run_group_tests(tests, setup, teardown);
}
