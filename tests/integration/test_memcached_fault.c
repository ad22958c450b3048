/*
 * test_memcached_fault.c — the memcached engine against its exclusive test
 * server (fixture `memcached_excl`), which the cases stop and start again:
 *
 *   - a restart is detected (a new pid and start time in `stats`, read on
 *     every new connection before any command): every holder is told LOST,
 *     the new process grants nothing during its quarantine and then does,
 *     and no CAS of an old hold ever reaches it (its cas_misses, cas_badval
 *     and delete_misses stay 0); a flush_all quarantines the same way;
 *   - a server that evicts (started with CERB_MEMCACHED_EVICT=1 to
 *     servers.sh) is refused, and one with -M is not.
 * The server is left running as the fixture started it (-M, marked).
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
#include "mc_util.h"
#include "test_util.h"

#define HOLDS 3

static cerb_client *open_client_with(const char *mc_extra);
static cerb_client *open_client(void)
{
    /* A fast prober: the restart is seen by the first probe after it. */
    return open_client_with(NULL);
}

static cerb_client *open_client_with(const char *mc_extra)
{
    /* lock.lease_ms 1000: the quarantine after a loss is then 5 s. */
    char mce[256];
    snprintf(mce, sizeof mce, "op_timeout_ms = 300; connect_timeout_ms = 300; %s",
             mc_extra ? mc_extra : "");
    char *cfg = mc_test_config(mce, "lock = { lease_ms = 1000; };\n"
                                    "failover = { probe_interval_ms = 100; probe_timeout_ms = 100; };");
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

/* Stop and start the server: unmarked (as after a crash: its first client
 * quarantines it), and with evictions on when asked. */
static void restart(bool evict)
{
    if (evict)
        setenv("CERB_MEMCACHED_EVICT", "1", 1);
    setenv("CERB_MEMCACHED_UNMARKED", "1", 1);
    assert_int_equal(cerb_test_servers_run("stop", "memcached", mc_test_port(), 20000), 0);
    assert_int_equal(cerb_test_servers_run("start", "memcached", mc_test_port(), 20000), 0);
    unsetenv("CERB_MEMCACHED_EVICT");
    unsetenv("CERB_MEMCACHED_UNMARKED");
}

/* The quarantine of lock.lease_ms 1000: ceil(1000 + 1 % + 2 ms + 3 s). */
#define Q_MS 5000

/* `STAT <name> <n>` of the server's stats, or -1. */
static long long stat_of(const char *name)
{
    char *r = mc_test_cmd(mc_test_port(), "stats");
    assert_non_null(r);
    char pat[64];
    snprintf(pat, sizeof pat, "STAT %s ", name);
    const char *p = strstr(r, pat);
    long long v = p ? strtoll(p + strlen(pat), NULL, 10) : -1;
    free(r);
    return v;
}

static atomic_int lost;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost, 1);
}

static bool all_lost(void *ud)
{
    return atomic_load(&lost) == *(int *)ud;
}

static void test_restart_tells_holders_lost(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(), *c2 = open_client();
    char *names[HOLDS];
    cerb_lock *held[HOLDS];
    atomic_store(&lost, 0);
    for (int i = 0; i < HOLDS; i++) {
        names[i] = test_name("restart");
        /* With one engine there is no prober: the first renewal after
         * the restart (at a third of the lease) meets it. */
        held[i] = mk(i == 0 ? c1 : c2, names[i], 1000);
        cerb_lock_on_lost(held[i], on_lost, NULL);
        assert_int_equal(cerb_lock_lock(held[i]), CERB_OK);
    }
    int64_t t0 = cerb_test_now_ms();
    restart(false);
    /* A client that never held anything, opened on the new process: no
     * grant during the quarantine (a holder elsewhere may not know yet). */
    cerb_client *c3 = open_client();
    cerb_lock *again = mk(c3, names[1], 1000);
    assert_int_equal(cerb_lock_trylock(again), CERB_BUSY);
    int want = HOLDS;
    assert_wait_until(all_lost, &want, 5000);
    print_message("every holder told LOST %lld ms after the restart began\n",
                  (long long)(cerb_test_now_ms() - t0));
    for (int i = 0; i < HOLDS; i++)
        assert_int_equal(cerb_lock_state(held[i]), CERB_LOCK_LOST);
    /* Granted once the quarantine is over. */
    int64_t t1 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(again, Q_MS + 4000), CERB_OK);
    print_message("granted %lld ms after the restart (quarantine %d ms)\n",
                  (long long)(cerb_test_now_ms() - t0), Q_MS);
    assert_true(cerb_test_now_ms() - t1 >= 1000);
    for (int i = 0; i < HOLDS; i++)
        assert_int_equal(cerb_lock_unlock(held[i]), CERB_LOST);
    assert_int_equal(cerb_lock_unlock(again), CERB_OK);
    /* No renew or release of the old holds reached the new process: every
     * CAS it was sent was one it made (the probe's, the new grant's). */
    long long misses = stat_of("cas_misses"), badval = stat_of("cas_badval"),
              dmiss = stat_of("delete_misses");
    print_message("new process: cas_misses %lld, cas_badval %lld, delete_misses %lld\n", misses,
                  badval, dmiss);
    assert_int_equal(misses, 0);
    assert_int_equal(badval, 0);
    assert_int_equal(dmiss, 0);
    for (int i = 0; i < HOLDS; i++) {
        cerb_lock_free(held[i]);
        free(names[i]);
    }
    cerb_lock_free(again);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(c3);
}

/* flush_all drops every item, the marker with them: a client that holds
 * a name keeps believing it until its renewal, so another client (new, or
 * with connections from before) is not granted it during the quarantine. */
static void test_flush_all_quarantines(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(), *c2 = open_client();
    char *name = test_name("flush"), *other = test_name("flush2");
    cerb_lock *h = mk(c1, name, 1000), *w = mk(c2, other, 1000);
    assert_int_equal(cerb_lock_lock(h), CERB_OK);
    assert_int_equal(cerb_lock_lock(w), CERB_OK); /* c2 has a pooled connection */
    assert_int_equal(cerb_lock_unlock(w), CERB_OK);
    char *r = mc_test_cmd(mc_test_port(), "flush_all");
    assert_non_null(r);
    free(r);
    cerb_client *c3 = open_client();
    cerb_lock *b3 = mk(c3, name, 1000), *b2 = mk(c2, name, 1000);
    assert_int_equal(cerb_lock_trylock(b3), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock(b2), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock_for(b3, Q_MS + 4000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(b3), CERB_OK);
    (void)cerb_lock_unlock(h);
    cerb_lock_free(h);
    cerb_lock_free(w);
    cerb_lock_free(b2);
    cerb_lock_free(b3);
    free(name);
    free(other);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(c3);
}

static atomic_int warnings;
static void sink(cerb_log_level level, const char *line, void *ud)
{
    (void)ud;
    if (level >= CERB_LOG_WARN && strstr(line, "slab_automove"))
        atomic_fetch_add(&warnings, 1);
}

/* Evictions on: refused at open, with the fix named, unless allowed (then
 * the slab page mover is warned about). The server is started again as the
 * fixture does (-M) at the end. */
static void test_evictions_refused(void **state)
{
    (void)state;
    restart(true);
    char *cfg = mc_test_config("op_timeout_ms = 300;", "lock = { lease_ms = 1000; };");
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open_string(&c, cfg), CERB_ECONFIG);
    free(cfg);
    print_message("%s\n", cerb_last_error());
    assert_non_null(strstr(cerb_last_error(), "evictions on"));
    assert_non_null(strstr(cerb_last_error(), "-M"));
    assert_non_null(strstr(cerb_last_error(), "memcached.allow_evictions"));
    atomic_store(&warnings, 0);
    cerb_log_set(sink, NULL, CERB_LOG_WARN);
    c = open_client_with("allow_evictions = true;");
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
    assert_int_equal(atomic_load(&warnings), 1);
    cerb_client_close(c);
    assert_int_equal(cerb_test_servers_run("stop", "memcached", mc_test_port(), 20000), 0);
    assert_int_equal(cerb_test_servers_run("start", "memcached", mc_test_port(), 20000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_tells_holders_lost),
        cmocka_unit_test(test_flush_all_quarantines),
        cmocka_unit_test(test_evictions_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
