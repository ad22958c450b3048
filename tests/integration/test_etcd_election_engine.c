/*
 * test_etcd_election_engine.c — the etcd engine's election table
 * (engine_etcd/etcd_election.c) on a real etcd (shared fixture), driven
 * through the core's shims below the election API, for what the API
 * cannot reach on purpose: the fence offset of the election layout, which
 * lives in the offset key and not in the candidate's key (its value is the
 * candidate's):
 *  - check_owner (the core's settling of an acquire whose answer was lost)
 *    reports the fence the grant got — the key's create revision plus the
 *    offset in force then — also after the offset was raised (read as of
 *    the key's revision), and no grant at all once that revision was
 *    compacted away (never a guessed fence), while leader() still names
 *    the leader with term 0;
 *  - a key of ours left by an earlier attempt is adopted with the offset
 *    in force when it was put, and not adopted under a floor it does not
 *    clear (queued again, above the floor);
 *  - a key of ours holding another attempt's value gets ours (as Go's
 *    Campaign proclaims then), by acquire and by check_owner;
 *  - proclaim by a hold without the key's claim, or on an ended session,
 *    is NOT_OWNER and changes nothing.
 * Each case uses a prefix of its own: the offset key is per prefix.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc.h"
#include "cerberus.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "etcd_util.h"
#include "test_util.h"

static const struct cerb_engine_ops *ops;

struct eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void on_event(void *ud, cerb_engine_event ev, const char *name, const char *token)
{
    (void)ud;
    (void)ev;
    (void)name;
    (void)token;
}

static char *case_prefix(void)
{
    char *n = test_name("elx");
    char *p = malloc(strlen(n) + 2);
    assert_non_null(p);
    sprintf(p, "%s/", n);
    free(n);
    return p;
}

static void eng_open(struct eng *g, const char *prefix)
{
    char extra[256];
    snprintf(extra, sizeof extra, "prefix = \"%s\";", prefix);
    char *text = etcd_test_config(extra, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = on_event, .ud = g};
    if (cerb__engine_open(ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void eng_close(struct eng *g)
{
    cerb__engine_close(ops, g->e);
    cerb__config_free(g->cfg);
}

/* A term as the core would make it. */
struct hold {
    cerb_engine_lock lk;
    struct etcd_lock_priv priv;
};

static void hold_init(struct hold *h, const char *name, const char *value)
{
    memset(h, 0, sizeof *h);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", 7);
    h->lk.lease_ms = 10000;
    h->lk.fair = 1;
    h->lk.priv = &h->priv;
    h->lk.epoch = -1;
    h->lk.prim = CERB_PRIM_ELECTION;
    h->lk.value = value;
    h->lk.value_len = strlen(value);
}

static int64_t lease_of(struct eng *g)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    return s.id;
}

static uint64_t gen_of(struct eng *g)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    return s.gen;
}

static int64_t only_key_rev(const char *prefix, const char *name)
{
    char p[512];
    struct etcd_test_kv kv[2];
    snprintf(p, sizeof p, "%s%s/", prefix, name);
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 2), 1);
    return kv[0].create_revision;
}

/* Set the offset key of `prefix` to off; returns the revision it took. */
static int64_t set_offset(const char *prefix, int64_t off)
{
    char key[256], val[32];
    snprintf(key, sizeof key, "%s__cerberus_fence__", prefix);
    snprintf(val, sizeof val, "%" PRId64, off);
    assert_int_equal(etcd_test_put_value(etcd_test_port(), key, val, 0), 0);
    char *b64 = cerb__etcd_b64_encode(key, strlen(key));
    assert_non_null(b64);
    char body[512];
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", b64);
    cerb__free(b64);
    json_t *r = etcd_test_post(etcd_test_port(), "/v3/kv/range", body, NULL, NULL);
    assert_non_null(r);
    int64_t mod = 0;
    assert_int_equal(cerb__etcd_get_i64(json_array_get(json_object_get(r, "kvs"), 0),
                                        "mod_revision", &mod),
                     CERB_OK);
    json_decref(r);
    assert_true(mod > 0);
    return mod;
}

static void compact_at(int64_t rev)
{
    char body[128];
    snprintf(body, sizeof body, "{\"revision\":\"%" PRId64 "\",\"physical\":true}", rev);
    long status = 0;
    json_t *r = etcd_test_post(etcd_test_port(), "/v3/kv/compaction", body, NULL, &status);
    assert_non_null(r);
    json_decref(r);
    assert_int_equal(status, 200);
}

static void test_check_owner_offset_at_revision(void **state)
{
    (void)state;
    struct eng a, obs;
    struct hold h;
    cerb_grant gr, gk;
    char *pfx = case_prefix(), *name = test_name("chk");

    eng_open(&a, pfx);
    eng_open(&obs, pfx);
    int64_t off0 = 4000;
    set_offset(pfx, off0);
    hold_init(&h, name, "node-a");
    assert_int_equal(cerb__engine_acquire(ops, a.e, &h.lk, 0, NULL, &gr), CERB_OK);
    int64_t r = only_key_rev(pfx, name);
    assert_int_equal(gr.fence, (uint64_t)(r + off0));
    /* The offset key has not changed since: settled from its value now. */
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &h.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, gr.fence);

    /* Raised after our key: the offset as of our revision, not now's. */
    int64_t raised = set_offset(pfx, off0 + 1000000);
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &h.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, gr.fence);
    cerb_leader_rec lr;
    memset(&lr, 0, sizeof lr);
    assert_int_equal(cerb__engine_leader(ops, obs.e, name, 0, &lr), CERB_OK);
    assert_int_equal(lr.state, CERB_LEADER_SOME);
    assert_int_equal(lr.counter, gr.fence);
    assert_int_equal(lr.value_len, 6);
    assert_memory_equal(lr.value, "node-a", 6);
    cerb__leader_rec_clear(&lr);

    /* That revision compacted away: no answer, never a guess — and the
     * key stays (the term is not given up on an unknown). */
    compact_at(raised);
    cerb_status st = cerb__engine_check_owner(ops, a.e, &h.lk, &gk);
    print_message("check after compaction: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_int_not_equal(st, CERB_OK);
    assert_int_not_equal(st, CERB_NOT_OWNER);
    assert_int_equal(only_key_rev(pfx, name), r);
    memset(&lr, 0, sizeof lr);
    assert_int_equal(cerb__engine_leader(ops, obs.e, name, 0, &lr), CERB_OK);
    assert_int_equal(lr.state, CERB_LEADER_SOME); /* who leads is known */
    assert_int_equal(lr.counter, 0);              /* its rank is not */
    assert_non_null(strstr(lr.detail, "fence unknown"));
    cerb__leader_rec_clear(&lr);

    assert_int_equal(cerb__engine_release(ops, a.e, &h.lk), CERB_OK);
    memset(&lr, 0, sizeof lr);
    assert_int_equal(cerb__engine_leader(ops, obs.e, name, 0, &lr), CERB_OK);
    assert_int_equal(lr.state, CERB_LEADER_NONE);
    cerb__leader_rec_clear(&lr);
    eng_close(&a);
    eng_close(&obs);
    free(pfx);
    free(name);
}

#define FLOOR 1000000000000ull /* far above any revision of the test server */

static void test_leftover_key(void **state)
{
    (void)state;
    struct eng a;
    struct hold h;
    cerb_grant gr;
    char *pfx = case_prefix(), *name = test_name("left");
    char key[600];
    const int port = etcd_test_port();

    eng_open(&a, pfx);
    int64_t off0 = 500;
    set_offset(pfx, off0);
    /* Our key from an earlier attempt of this hold (its answer lost), put
     * as the election txn puts it, then the offset raised. */
    snprintf(key, sizeof key, "%s%s/%llx", pfx, name, (unsigned long long)lease_of(&a));
    assert_int_equal(etcd_test_put_value(port, key, "v", lease_of(&a)), 0);
    int64_t r = only_key_rev(pfx, name);
    set_offset(pfx, off0 + 1000000);
    hold_init(&h, name, "v");
    h.priv.lease = lease_of(&a);
    h.priv.gen = gen_of(&a);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &h.lk, cerb__deadline_in(3000), NULL, &gr),
                     CERB_OK);
    /* Adopted (same key, same revision), ranked as it was put. */
    assert_int_equal(only_key_rev(pfx, name), r);
    assert_int_equal(gr.fence, (uint64_t)(r + off0));
    assert_int_equal(cerb__engine_release(ops, a.e, &h.lk), CERB_OK);

    /* Under a floor it does not clear: not adopted, queued again above. */
    assert_int_equal(etcd_test_put_value(port, key, "v", lease_of(&a)), 0);
    r = only_key_rev(pfx, name);
    hold_init(&h, name, "v");
    h.priv.lease = lease_of(&a);
    h.priv.gen = gen_of(&a);
    h.lk.fence_floor = FLOOR;
    assert_int_equal(cerb__engine_acquire(ops, a.e, &h.lk, cerb__deadline_in(3000), NULL, &gr),
                     CERB_OK);
    assert_true(gr.fence > FLOOR);
    assert_true(only_key_rev(pfx, name) > r);
    cerb_grant gk;
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &h.lk, &gk), CERB_OK);
    assert_int_equal(gk.fence, gr.fence);
    assert_int_equal(cerb__engine_release(ops, a.e, &h.lk), CERB_OK);
    eng_close(&a);
    free(pfx);
    free(name);
}

/* The value of the leader of `name`, as a string (malloc'd). */
static char *leader_value(struct eng *g, const char *name)
{
    cerb_leader_rec lr;
    memset(&lr, 0, sizeof lr);
    assert_int_equal(cerb__engine_leader(ops, g->e, name, 0, &lr), CERB_OK);
    assert_int_equal(lr.state, CERB_LEADER_SOME);
    char *v = strndup(lr.value, lr.value_len);
    cerb__leader_rec_clear(&lr);
    return v;
}

/*
 * A key of ours with another attempt's value (Go's Campaign proclaims its
 * own then): adopted by acquire, and by check_owner settling a lost
 * answer, each with our value in the key before the term is reported.
 */
static void test_leftover_other_value(void **state)
{
    (void)state;
    struct eng a;
    struct hold h;
    cerb_grant gr;
    char *pfx = case_prefix(), *name = test_name("lval");
    char key[600];
    const int port = etcd_test_port();

    eng_open(&a, pfx);
    snprintf(key, sizeof key, "%s%s/%llx", pfx, name, (unsigned long long)lease_of(&a));
    assert_int_equal(etcd_test_put_value(port, key, "stale", lease_of(&a)), 0);
    int64_t r = only_key_rev(pfx, name);
    hold_init(&h, name, "fresh");
    h.priv.lease = lease_of(&a);
    h.priv.gen = gen_of(&a);
    assert_int_equal(cerb__engine_acquire(ops, a.e, &h.lk, cerb__deadline_in(3000), NULL, &gr),
                     CERB_OK);
    assert_int_equal(only_key_rev(pfx, name), r);
    char *v = leader_value(&a, name);
    assert_string_equal(v, "fresh");
    free(v);
    assert_int_equal(cerb__engine_release(ops, a.e, &h.lk), CERB_OK);

    /* Settling: the hold never heard its grant, and the key is there with
     * another value. */
    assert_int_equal(etcd_test_put_value(port, key, "stale", lease_of(&a)), 0);
    r = only_key_rev(pfx, name);
    hold_init(&h, name, "settled");
    h.priv.lease = lease_of(&a);
    h.priv.gen = gen_of(&a);
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &h.lk, &gr), CERB_OK);
    assert_int_equal(only_key_rev(pfx, name), r);
    v = leader_value(&a, name);
    assert_string_equal(v, "settled");
    free(v);
    assert_int_equal(cerb__engine_release(ops, a.e, &h.lk), CERB_OK);
    eng_close(&a);
    free(pfx);
    free(name);
}

static void test_proclaim_needs_the_claim(void **state)
{
    (void)state;
    struct eng a;
    struct hold h, stale;
    cerb_grant gr;
    cerb_outcome oc;
    char *pfx = case_prefix(), *name = test_name("claim");

    eng_open(&a, pfx);
    hold_init(&h, name, "cur");
    assert_int_equal(cerb__engine_acquire(ops, a.e, &h.lk, 0, NULL, &gr), CERB_OK);
    /* A stale hold of the same client names the same key. */
    hold_init(&stale, name, "old");
    stale.priv = h.priv;
    memset(&stale.priv.reg, 0, sizeof stale.priv.reg);
    assert_int_equal(cerb__engine_proclaim(ops, a.e, &stale.lk, "old", 3, &oc), CERB_NOT_OWNER);
    assert_int_equal(cerb__engine_proclaim(ops, a.e, &h.lk, "cur-2", 5, &oc), CERB_OK);
    assert_int_equal(oc, CERB_OUTCOME_YES);
    cerb_leader_rec lr;
    memset(&lr, 0, sizeof lr);
    assert_int_equal(cerb__engine_leader(ops, a.e, name, 0, &lr), CERB_OK);
    assert_int_equal(lr.value_len, 5);
    assert_memory_equal(lr.value, "cur-2", 5);
    cerb__leader_rec_clear(&lr);
    /* check_owner on the term (it has the claim) leaves the proclaimed
     * value alone, though lk's is the campaign's. */
    assert_int_equal(cerb__engine_check_owner(ops, a.e, &h.lk, &gr), CERB_OK);
    char *v = leader_value(&a, name);
    assert_string_equal(v, "cur-2");
    free(v);
    assert_int_equal(cerb__engine_release(ops, a.e, &h.lk), CERB_OK);
    /* Released: its key is gone, proclaim puts nothing back. */
    assert_int_equal(cerb__engine_proclaim(ops, a.e, &h.lk, "late", 4, &oc), CERB_NOT_OWNER);
    char p[512];
    struct etcd_test_kv kv[2];
    snprintf(p, sizeof p, "%s%s/", pfx, name);
    assert_int_equal(etcd_test_keys(etcd_test_port(), p, kv, 2), 0);
    eng_close(&a);
    free(pfx);
    free(name);
}

static int setup(void **state)
{
    (void)state;
    cerb__engines_builtin();
    ops = cerb__engine_find("etcd");
    return ops ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_owner_offset_at_revision),
        cmocka_unit_test(test_leftover_key),
        cmocka_unit_test(test_leftover_other_value),
        cmocka_unit_test(test_proclaim_needs_the_claim),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
