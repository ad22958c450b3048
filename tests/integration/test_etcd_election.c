/*
 * test_etcd_election.c — leader election on etcd (engine_etcd/
 * etcd_election.c), in the layout of etcd's concurrency.Election: one key
 * per candidate, <prefix><name>/<lease hex>, whose value is the candidate's
 * proclamation; the lowest create revision leads. Shown here against the
 * real server:
 *  - campaign, BUSY, a timed wait, leader() (value, owner = the lease hex,
 *    term = the key's create revision + the fence offset), proclaim (the
 *    key's value changes; NOT_OWNER for a candidate that does not lead),
 *    resign (nobody leads), the key's value = ours before campaign returns;
 *  - waiting candidates elected one at a time in arrival order, fences
 *    strictly increasing term after term, also across a raise of the fence
 *    offset; leader() reports a term's counter with the offset in force
 *    when its key was put, not the raised one (the election layout's
 *    offset comes from the offset key as of the key's revision);
 *  - a term whose key is deleted behind its back: proclaim finds it gone
 *    (CERB_LOST) and puts nothing back.
 * Every client uses its own etcd.prefix, so the fence offset key is this
 * suite's to raise.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
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
#include "etcd_util.h"
#include "test_util.h"

#define FENCE_LOW(f) ((f) & ((UINT64_C(1) << 48) - 1))

static char prefix[64];

static cerb_client *open_client(void)
{
    char extra[128];
    snprintf(extra, sizeof extra, "prefix = \"%s\";", prefix);
    char *cfg = etcd_test_config(extra, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_election *candidate(cerb_client *c, const char *name)
{
    cerb_election *e = NULL;
    if (cerb_election_new(c, name, NULL, &e) != CERB_OK)
        fail_msg("election_new: %s", cerb_last_error());
    return e;
}

/* The keys of election `name` (sorted by create revision) into kv. */
static int keys_of(const char *name, struct etcd_test_kv *kv, int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s%s/", prefix, name);
    return etcd_test_keys(etcd_test_port(), p, kv, max);
}

/* The value of `key` on the server (malloc'd), or NULL when absent, as
 * `etcdctl get --print-value-only` shows it (its own client, not ours). */
static char *server_value(const char *key)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ETCDCTL_API=3 etcdctl --endpoints=http://127.0.0.1:%d get --print-value-only '%s'",
             etcd_test_port(), key);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    pclose(f);
    if (n == 0)
        return NULL;
    if (buf[n - 1] == '\n')
        buf[n - 1] = '\0';
    return strdup(buf);
}

struct lead {
    int has;
    char value[256];
    char owner[96];
    uint64_t term;
};

static struct lead leader_of(cerb_client *c, const char *name)
{
    cerb_leader_info li;
    struct lead l = {0};
    cerb_status st = cerb_election_leader(c, name, 0, &li);
    if (st != CERB_OK)
        fail_msg("leader: %s: %s", cerb_status_name(st), cerb_last_error());
    l.has = li.has_leader;
    if (li.has_leader) {
        assert_string_equal(li.engine, "etcd");
        assert_true(li.value_known);
        assert_true(li.value_len < sizeof l.value);
        memcpy(l.value, li.value, li.value_len);
        snprintf(l.owner, sizeof l.owner, "%s", li.owner);
        l.term = li.term;
    }
    cerb_leader_info_clear(&li);
    return l;
}

static void test_campaign_proclaim_resign(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(), *c2 = open_client(), *obs = open_client();
    char *name = test_name("el");
    cerb_election *a = candidate(c1, name), *b = candidate(c2, name);
    struct etcd_test_kv kv[4];

    assert_false(leader_of(obs, name).has);
    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_OK);
    /* One key, <name>/<lease hex>, whose value is ours already. */
    assert_int_equal(keys_of(name, kv, 4), 1);
    char want[600];
    snprintf(want, sizeof want, "%s%s/%llx", prefix, name, (unsigned long long)kv[0].lease);
    assert_string_equal(kv[0].key, want);
    char *v = server_value(kv[0].key);
    assert_non_null(v);
    assert_string_equal(v, "node-a");
    free(v);
    uint64_t fa = cerb_election_fencing_token(a);
    int64_t off = etcd_test_fence_offset(etcd_test_port(), prefix);
    assert_true(off >= 0);
    assert_int_equal(FENCE_LOW(fa), (uint64_t)(kv[0].create_revision + off));

    struct lead l = leader_of(obs, name);
    assert_true(l.has);
    assert_string_equal(l.value, "node-a");
    char hex[32];
    snprintf(hex, sizeof hex, "%llx", (unsigned long long)kv[0].lease);
    assert_string_equal(l.owner, hex);
    assert_int_equal(l.term, FENCE_LOW(fa));

    /* Another candidate: BUSY at once, a timed wait times out, and it
     * leaves no key behind. */
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_BUSY);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 200, NULL), CERB_TIMEOUT);
    assert_int_equal(keys_of(name, kv, 4), 1);
    assert_int_equal(cerb_election_proclaim(b, "x", 1), CERB_NOT_OWNER);

    /* Proclaim: the key's value changes, the key (its revision) stays. */
    assert_int_equal(cerb_election_proclaim(a, "node-a:2", 8), CERB_OK);
    assert_int_equal(cerb_election_proclaim(a, "node-a:2", 8), CERB_OK); /* idempotent */
    struct etcd_test_kv kv2[4];
    assert_int_equal(keys_of(name, kv2, 4), 1);
    assert_int_equal(kv2[0].create_revision, kv[0].create_revision);
    v = server_value(kv[0].key);
    assert_string_equal(v, "node-a:2");
    free(v);
    l = leader_of(obs, name);
    assert_string_equal(l.value, "node-a:2");
    assert_int_equal(l.term, FENCE_LOW(fa));
    assert_int_equal(cerb_election_state(a), CERB_LOCK_VALID);

    /* Resign: nobody leads, and the next candidate's fence is higher. */
    assert_int_equal(cerb_election_resign(a), CERB_OK);
    assert_int_equal(keys_of(name, kv, 4), 0);
    assert_false(leader_of(obs, name).has);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_OK);
    assert_true(cerb_election_fencing_token(b) > fa);
    l = leader_of(obs, name);
    assert_string_equal(l.value, "node-b");

    /* An empty value is a value. */
    assert_int_equal(cerb_election_proclaim(b, "", 0), CERB_OK);
    l = leader_of(obs, name);
    assert_true(l.has);
    assert_string_equal(l.value, "");
    assert_int_equal(cerb_election_free(b), CERB_OK);
    assert_false(leader_of(obs, name).has);
    assert_int_equal(cerb_election_free(a), CERB_OK);
    free(name);
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
    w->st = cerb_election_campaign(w->e, w->value, strlen(w->value), 20000, NULL);
    atomic_store(&w->done, 1);
    return NULL;
}

static bool w_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done) != 0; }

struct nkeys {
    const char *name;
    int n;
};

static bool has_nkeys(void *ud)
{
    struct nkeys *q = ud;
    struct etcd_test_kv kv[8];
    return keys_of(q->name, kv, 8) == q->n;
}

/*
 * Three candidates in three clients: elected in the order they queued, one
 * at a time, each with a higher fence, and across a raise of the fence
 * offset (as a client switching to etcd from another engine makes): the
 * term after the raise ranks above it, while leader() still gives the term
 * before it the counter it was granted.
 */
static void test_order_and_fences(void **state)
{
    (void)state;
    cerb_client *c0 = open_client(), *c1 = open_client(), *c2 = open_client();
    char *name = test_name("el-order");
    cerb_election *lead = candidate(c0, name);
    assert_int_equal(cerb_election_campaign(lead, "first", 5, 0, NULL), CERB_OK);
    uint64_t f0 = cerb_election_fencing_token(lead);
    struct waiter w1 = {candidate(c1, name), "second", 0, CERB_OK};
    struct waiter w2 = {candidate(c2, name), "third", 0, CERB_OK};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, campaign_thread, &w1), 0);
    struct nkeys q2 = {name, 2}, q3 = {name, 3};
    assert_wait_until(has_nkeys, &q2, 5000); /* w1 queued first */
    assert_int_equal(pthread_create(&t2, NULL, campaign_thread, &w2), 0);
    assert_wait_until(has_nkeys, &q3, 5000);

    /* Raise the offset while `first` leads: its counter stays the one it
     * was granted (its key's revision + the offset then). */
    int64_t off = etcd_test_fence_offset(etcd_test_port(), prefix);
    assert_true(off >= 0);
    char fk[128], big[32];
    snprintf(fk, sizeof fk, "%s__cerberus_fence__", prefix);
    snprintf(big, sizeof big, "%" PRId64, off + 1000000);
    assert_int_equal(etcd_test_put_value(etcd_test_port(), fk, big, 0), 0);
    struct lead l = leader_of(c0, name);
    assert_string_equal(l.value, "first");
    assert_int_equal(l.term, FENCE_LOW(f0));

    assert_int_equal(cerb_election_resign(lead), CERB_OK);
    assert_wait_until(w_done, &w1, 5000);
    assert_int_equal(w1.st, CERB_OK);
    assert_false(atomic_load(&w2.done)); /* one leader at a time */
    l = leader_of(c0, name);
    assert_string_equal(l.value, "second");
    uint64_t f1 = cerb_election_fencing_token(w1.e);
    assert_true(f1 > f0);
    /* Its key was put before the raise: the offset then, not now. */
    assert_int_equal(l.term, FENCE_LOW(f1));
    assert_true(FENCE_LOW(f1) < (uint64_t)(off + 1000000));

    assert_int_equal(cerb_election_resign(w1.e), CERB_OK);
    assert_wait_until(w_done, &w2, 5000);
    assert_int_equal(w2.st, CERB_OK);
    uint64_t f2 = cerb_election_fencing_token(w2.e);
    assert_true(f2 > f1);
    l = leader_of(c0, name);
    assert_string_equal(l.value, "third");
    assert_int_equal(l.term, FENCE_LOW(f2));

    /* A term after the raise ranks above it. */
    assert_int_equal(cerb_election_resign(w2.e), CERB_OK);
    assert_int_equal(cerb_election_campaign(lead, "again", 5, 0, NULL), CERB_OK);
    uint64_t f3 = cerb_election_fencing_token(lead);
    assert_true(f3 > f2);
    assert_true(FENCE_LOW(f3) > (uint64_t)(off + 1000000));
    l = leader_of(c0, name);
    assert_int_equal(l.term, FENCE_LOW(f3));

    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(cerb_election_free(lead), CERB_OK);
    assert_int_equal(cerb_election_free(w1.e), CERB_OK);
    assert_int_equal(cerb_election_free(w2.e), CERB_OK);
    free(name);
    cerb_client_close(c0);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

/* A term whose key someone deleted: proclaim puts nothing back. */
static void test_proclaim_after_key_deleted(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    char *name = test_name("el-gone");
    cerb_election *a = candidate(c, name);
    struct etcd_test_kv kv[4];
    assert_int_equal(cerb_election_campaign(a, "mine", 4, 0, NULL), CERB_OK);
    assert_int_equal(keys_of(name, kv, 4), 1);
    assert_int_equal(etcd_test_delete(etcd_test_port(), kv[0].key), 1);
    assert_int_equal(cerb_election_proclaim(a, "mine:2", 6), CERB_LOST);
    assert_int_equal(keys_of(name, kv, 4), 0);
    assert_int_equal(cerb_election_state(a), CERB_LOCK_LOST);
    cerb_election_free(a);
    free(name);
    cerb_client_close(c);
}

int main(void)
{
    snprintf(prefix, sizeof prefix, "cerb-el-%ld/", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_campaign_proclaim_resign),
        cmocka_unit_test(test_order_and_fences),
        cmocka_unit_test(test_proclaim_after_key_deleted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
