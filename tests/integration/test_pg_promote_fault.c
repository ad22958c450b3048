/*
 * test_pg_promote_fault.c — a promoted standby that lost the last grants.
 * The suite starts a primary and a streaming standby of its own (ports
 * $CERB_PG_PORT + 20 and + 21, scripts/servers.d/pg.sh --nodes 2; it holds
 * the pg_server resource lock with the exclusive fixture), stops the
 * primary's WAL sender so that one grant never reaches the standby, kills
 * the primary and promotes the standby. A client that reaches the promoted
 * server (a libpq host list with target_session_attrs=read-write) must see
 * the new timeline: it grants nothing until the longest lease has passed
 * (the holder of the lost grant believed in it until then) and its fence is
 * above the lost one — without the check it would be granted at once, with
 * a fence the lost grant already had.
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "pg_util.h"
#include "test_util.h"

#define LEASE_MS 3000

static int base_port(void) { return pg_test_port() + 20; }

static int servers(const char *cmd)
{
    char script[1024], p[16];
    snprintf(script, sizeof script, "%s/scripts/servers.sh", cerb_test_source_dir());
    snprintf(p, sizeof p, "%d", base_port());
    char *argv[] = {"bash", script, (char *)cmd, "pg", "--port", p, "--nodes", "2", NULL};
    return cerb_test_run(argv, 120000);
}

static PGconn *connect_to(int port, const char *user)
{
    char ci[256];
    snprintf(ci, sizeof ci, "host=127.0.0.1 port=%d dbname=cerb user=%s connect_timeout=5", port,
             user);
    PGconn *pg = PQconnectdb(ci);
    if (PQstatus(pg) != CONNECTION_OK) {
        PQfinish(pg);
        return NULL;
    }
    return pg;
}

static bool scalar_is(int port, const char *sql, const char *want)
{
    PGconn *pg = connect_to(port, "postgres");
    if (!pg)
        return false;
    PGresult *r = PQexec(pg, sql);
    bool ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
              strcmp(PQgetvalue(r, 0, 0), want) == 0;
    PQclear(r);
    PQfinish(pg);
    return ok;
}

static bool standby_has_meta(void *ud)
{
    (void)ud;
    return scalar_is(base_port() + 1, "SELECT count(*) FROM cerberus_meta", "1");
}

static bool promoted(void *ud)
{
    (void)ud;
    return scalar_is(base_port() + 1, "SELECT pg_is_in_recovery()", "f");
}

/* A child of the postmaster on `port` whose title has `what`. */
static pid_t child_named(int port, const char *what)
{
    pid_t pm = cerb_test_server_pid("pg", port);
    DIR *d = opendir("/proc");
    pid_t found = -1;
    struct dirent *de;
    while (pm > 0 && d && (de = readdir(d)) && found < 0) {
        long pid = atol(de->d_name);
        char path[300], buf[512];
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        const char *rp = strrchr(buf, ')');
        long ppid = 0;
        char st;
        if (!rp || sscanf(rp + 1, " %c %ld", &st, &ppid) != 2 || ppid != (long)pm)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        f = fopen(path, "r");
        if (!f)
            continue;
        k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        if (strstr(buf, what))
            found = (pid_t)pid;
    }
    if (d)
        closedir(d);
    return found;
}

static cerb_client *open_client(void)
{
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "engines = (\"pg\");\nlock = { lease_ms = %d; };\n"
             "pg = { conninfo = \"host=127.0.0.1,127.0.0.1 port=%d,%d dbname=cerb user=cerb "
             "target_session_attrs=read-write\"; op_timeout_ms = 500; connect_timeout_ms = 1000; };\n",
             LEASE_MS, base_port(), base_port() + 1);
    cerb_client *c = NULL;
    if (cerb_client_open_string(&c, cfg) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    return c;
}

static atomic_int lost_calls;
static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_told(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_promoted_standby_quarantines_and_raises_fences(void **state)
{
    (void)state;
    assert_int_equal(servers("start"), 0);
    cerb_client *a = open_client();
    /* The record of the server reached the standby. */
    assert_true(wait_until(standby_has_meta, NULL, 20000));

    /* The primary's WAL sender stops: what the primary commits from now
     * on never reaches the standby (stopping the standby's receiver would
     * not do: the bytes would wait in its socket and land on resume). */
    pid_t ws = child_named(base_port(), "walsender");
    assert_true(ws > 0);
    assert_int_equal(cerb_test_pause_pid(ws), 0);
    char *name = test_name("pg-promote");
    cerb_lock *la = NULL;
    assert_int_equal(cerb_lock_new(a, name, NULL, &la), CERB_OK);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_lock_lock(la), CERB_OK); /* never reaches the standby */
    uint64_t lost_fence = cerb_lock_fencing_token(la);

    pid_t primary = cerb_test_server_pid("pg", base_port());
    assert_true(primary > 0);
    assert_int_equal(kill(primary, SIGKILL), 0);
    int64_t t_kill = cerb_test_now_ms();
    PGconn *sb = connect_to(base_port() + 1, "postgres");
    assert_non_null(sb);
    PQclear(PQexec(sb, "SELECT pg_promote()"));
    PQfinish(sb);
    assert_true(wait_until(promoted, NULL, 20000));
    /* The orphaned sender may go now: the standby no longer listens. */
    assert_int_equal(cerb_test_resume_pid(ws), 0);

    cerb_client *b = open_client();
    cerb_lock *lb = NULL;
    assert_int_equal(cerb_lock_new(b, name, NULL, &lb), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(lb, 15000), CERB_OK);
    int64_t waited = cerb_test_now_ms() - t_kill;
    uint64_t fence = cerb_lock_fencing_token(lb);
    print_message("promoted standby: granted %lld ms after the kill, fence %llu (lost %llu)\n",
                  (long long)waited, (unsigned long long)fence, (unsigned long long)lost_fence);
    assert_true(waited >= LEASE_MS - 200);
    assert_true(fence > lost_fence);
    /* The holder of the lost grant was told before that. */
    assert_true(wait_until(lost_told, NULL, 1000));
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    free(name);
    cerb_client_close(a);
    cerb_client_close(b);
}

static int teardown(void **state)
{
    (void)state;
    servers("stop");
    return 0;
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_promoted_standby_quarantines_and_raises_fences),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
