/*
 * test_memcached.c — the memcached engine on the shared test server (fixture
 * `memcached`, -M): what the
 * conformance suite cannot see because it is memcached's own.
 *
 *   - the wire layout: the item under the name holds the owner token, with
 *     an expiry of ceil(lease s) + 2 (a lease of 1500 ms → T4, 100 ms → T3:
 *     never 0, which memcached reads as "never expires"; the 2 s margin
 *     because memcached's 1 s clock tick drifts and an item can die almost
 *     2 s before its T);
 *   - names memcached cannot carry as keys (longer than 250 bytes, or with
 *     a space) are hashed into a `b` key and still exclude;
 *   - a release when the item holds another owner's token (what a holder
 *     whose lease ran out meets) leaves that item alone;
 *   - the guard is refused with its reason, and ALLOW runs degraded;
 *   - inspect: the holder's token and the time left.
 * Every lock name is unique to the run (test_name()).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
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
#include "mc_util.h"
#include "test_util.h"

static cerb_client *open_client(void)
{
    char *cfg = mc_test_config(NULL, NULL);
    assert_non_null(cfg);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    free(cfg);
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name, int64_t lease_ms)
{
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = lease_ms;
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, name, &o, &l) != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

/* The holder's token as the engine reports it (inspect). */
static void holder_of(cerb_client *c, const char *name, char *out, size_t len, int64_t *ttl_ms)
{
    cerb_holder_info *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_lock_inspect(c, name, "memcached", &v, &n), CERB_OK);
    assert_int_equal(n, 1);
    snprintf(out, len, "%s", v[0].owner);
    if (ttl_ms)
        *ttl_ms = v[0].ttl_ms;
    cerb_holders_free(v, n);
}

/* The expiry the engine sent for a lease: read right after the grant
 * (memcached's clock ticks once a second, so a read may see one less;
 * a few tries see the exact value). */
static void expect_ttl(cerb_client *c, int64_t lease_ms, int64_t want_s)
{
    char *name = test_name("ttl");
    cerb_lock *l = mk(c, name, lease_ms);
    int64_t seen = -2;
    for (int i = 0; i < 5 && seen != want_s; i++) {
        assert_int_equal(cerb_lock_lock(l), CERB_OK);
        char v[65];
        assert_int_equal(mc_test_item(mc_test_port(), name, v, &seen), 1);
        assert_int_equal(strlen(v), 32);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
        assert_true(seen == want_s || seen == want_s - 1);
    }
    print_message("lease %lld ms: T%lld\n", (long long)lease_ms, (long long)seen);
    assert_int_equal(seen, want_s);
    assert_int_equal(mc_test_item(mc_test_port(), name, NULL, NULL), 0);
    cerb_lock_free(l);
    free(name);
}

static void test_layout_and_ttl(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    char *name = test_name("layout");
    cerb_lock *l = mk(c, name, 5000);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    char owner[64], value[65];
    int64_t ttl_ms = 0, ttl_s = 0;
    holder_of(c, name, owner, sizeof owner, &ttl_ms);
    assert_int_equal(mc_test_item(mc_test_port(), name, value, &ttl_s), 1);
    assert_string_equal(owner, value); /* the plain key holds the token */
    assert_int_equal(strlen(value), 32);
    assert_true(ttl_ms > 0 && ttl_ms <= 7000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(mc_test_item(mc_test_port(), name, NULL, NULL), 0);
    cerb_lock_free(l);
    free(name);

    expect_ttl(c, 1500, 4);
    expect_ttl(c, 100, 3);
    expect_ttl(c, 2000, 4);
    cerb_client_close(c);
}

static void hashed_name_excludes(cerb_client *c1, cerb_client *c2, const char *name)
{
    char key[600];
    int b64 = 0;
    mc_test_key(NULL, name, key, sizeof key, &b64);
    assert_int_equal(b64, 1);
    cerb_lock *a = mk(c1, name, 5000), *b = mk(c2, name, 5000);
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(cerb_lock_trylock(b), CERB_BUSY);
    char owner[64], value[65];
    holder_of(c1, name, owner, sizeof owner, NULL);
    assert_int_equal(mc_test_item(mc_test_port(), name, value, NULL), 1);
    assert_string_equal(owner, value);
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    assert_int_equal(mc_test_item(mc_test_port(), name, NULL, NULL), 0);
    assert_int_equal(cerb_lock_trylock(b), CERB_OK);
    assert_int_equal(cerb_lock_unlock(b), CERB_OK);
    cerb_lock_free(a);
    cerb_lock_free(b);
}

static void test_names_hashed(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(), *c2 = open_client();
    char *base = test_name("long");
    char longname[256];
    memset(longname, 'x', 255);
    longname[255] = '\0';
    memcpy(longname, base, strlen(base)); /* unique to the run */
    hashed_name_excludes(c1, c2, longname);
    char spaced[128];
    snprintf(spaced, sizeof spaced, "%s with spaces", base);
    hashed_name_excludes(c1, c2, spaced);
    /* 250 bytes exactly is still a plain key. */
    char edge[251];
    memset(edge, 'y', 250);
    edge[250] = '\0';
    memcpy(edge, base, strlen(base));
    cerb_lock *l = mk(c1, edge, 5000);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    char req[300];
    snprintf(req, sizeof req, "mg %s t", edge);
    char *r = mc_test_cmd(mc_test_port(), req);
    assert_non_null(r);
    assert_true(strncmp(r, "HD", 2) == 0);
    free(r);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    free(base);
    cerb_client_close(c1);
    cerb_client_close(c2);
}

static void test_release_leaves_anothers_item(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    char *name = test_name("other");
    cerb_lock *l = mk(c, name, 10000);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    /* Another owner's item where ours was (our lease ran out and someone
     * took the name): a plain set, as any client could write. */
    static const char other[] = "0123456789abcdef0123456789abcdef";
    char req[512];
    snprintf(req, sizeof req, "ms %s 32 T30\r\n%s", name, other);
    char *r = mc_test_cmd(mc_test_port(), req);
    assert_non_null(r);
    assert_true(strncmp(r, "HD", 2) == 0);
    free(r);
    cerb_status st = cerb_lock_unlock(l);
    print_message("unlock after the takeover: %s (%s)\n", cerb_status_name(st),
                  st == CERB_OK ? "" : cerb_last_error());
    char value[65];
    assert_int_equal(mc_test_item(mc_test_port(), name, value, NULL), 1);
    assert_string_equal(value, other); /* left alone */
    snprintf(req, sizeof req, "md %s", name);
    free(mc_test_cmd(mc_test_port(), req));
    cerb_lock_free(l);
    free(name);
    cerb_client_close(c);
}

/* ---- the guard ---- */

static void test_guard_refused(void **state)
{
    (void)state;
    cerb_client *c = open_client();
    cerb_guard *g = NULL;
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.on_unavailable = CERB_GUARD_REFUSE;
    assert_int_equal(cerb_guard_begin(c, "mc-scope", "k", 1, &o, &g), CERB_UNAVAILABLE);
    print_message("%s\n", cerb_last_error());
    assert_non_null(strstr(cerb_last_error(), "could be evicted"));
    assert_null(g);
    o.on_unavailable = CERB_GUARD_ALLOW;
    assert_int_equal(cerb_guard_begin(c, "mc-scope", "k", 1, &o, &g), CERB_OK);
    assert_int_equal(cerb_guard_degraded(g), 1);
    assert_int_equal(cerb_guard_free(g), CERB_OK);
    /* The engine stays healthy: a refusal is no failure. */
    assert_string_equal(cerb_engine_current(c), "memcached");
    cerb_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_ttl),
        cmocka_unit_test(test_names_hashed),
        cmocka_unit_test(test_release_leaves_anothers_item),
        cmocka_unit_test(test_guard_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
