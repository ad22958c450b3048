/*
 * test_memcached_fault.c — the memcached engine against its exclusive test
 * server (fixture `memcached_excl`), which the cases stop and start again:
 *
 *   - a restart is detected (a new pid and start time in `stats`, read on
 *     every new connection before any command): every holder is told LOST,
 *     a new grant works at once, and no CAS of an old hold ever reaches
 *     the new process (its cas_misses, cas_badval and delete_misses stay 0);
 *   - the eviction warning follows the server: none with -M
 *     (CERB_MEMCACHED_NO_EVICT=1 to servers.sh), one without.
 * The server is left running as the fixture started it (evictions on).
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
#include "mc_util.h"
#include "test_util.h"

#define HOLDS 3

static cerb_client *open_client(void)
{
    /* A fast prober: the restart is seen by the first probe after it. */
    char *cfg = mc_test_config("op_timeout_ms = 300; connect_timeout_ms = 300;",
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

static void restart(const char *no_evict)
{
    if (no_evict)
        setenv("CERB_MEMCACHED_NO_EVICT", no_evict, 1);
    else
        unsetenv("CERB_MEMCACHED_NO_EVICT");
    assert_int_equal(cerb_test_servers_run("stop", "memcached", mc_test_port(), 20000), 0);
    assert_int_equal(cerb_test_servers_run("start", "memcached", mc_test_port(), 20000), 0);
    unsetenv("CERB_MEMCACHED_NO_EVICT");
}

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
        held[i] = mk(i == 0 ? c1 : c2, names[i], 3000);
        cerb_lock_on_lost(held[i], on_lost, NULL);
        assert_int_equal(cerb_lock_lock(held[i]), CERB_OK);
    }
    int64_t t0 = cerb_test_now_ms();
    restart(NULL);
    int want = HOLDS;
    assert_wait_until(all_lost, &want, 5000);
    print_message("every holder told LOST %lld ms after the restart began\n",
                  (long long)(cerb_test_now_ms() - t0));
    for (int i = 0; i < HOLDS; i++)
        assert_int_equal(cerb_lock_state(held[i]), CERB_LOCK_LOST);
    /* A new grant on the new process, by another client, at once. */
    cerb_lock *again = mk(c1, names[1], 5000);
    assert_int_equal(cerb_lock_trylock_for(again, 2000), CERB_OK);
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
}

static atomic_int warnings;
static void sink(cerb_log_level level, const char *line, void *ud)
{
    (void)ud;
    if (level >= CERB_LOG_WARN && strstr(line, "evicts items"))
        atomic_fetch_add(&warnings, 1);
}

static int warnings_at_open(void)
{
    atomic_store(&warnings, 0);
    cerb_log_set(sink, NULL, CERB_LOG_WARN);
    cerb_client *c = open_client();
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
    cerb_client_close(c);
    return atomic_load(&warnings);
}

static void test_eviction_warning_follows_server(void **state)
{
    (void)state;
    restart("1"); /* -M */
    assert_int_equal(warnings_at_open(), 0);
    restart(NULL);
    assert_int_equal(warnings_at_open(), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_tells_holders_lost),
        cmocka_unit_test(test_eviction_warning_follows_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
