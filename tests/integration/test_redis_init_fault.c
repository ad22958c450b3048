/*
 * test_redis_init_fault.c — `cerberus init` and the quarantine warning on a
 * stock redis-server (issue: the first lock on a fresh store waited a whole
 * lease, silently). Each test starts this suite's server afresh and empty,
 * as a new server is, without the preparation scripts/servers.sh gives it
 * (CERB_REDIS_UNMARKED=1), and drives the real command:
 *  - init, then `cerberus run`: the first grant comes at once (the time from
 *    the spawn to run's "holding" line is printed and bounded far below the
 *    lease the quarantine would take);
 *  - init twice: the second changes nothing and says so;
 *  - a marker without the replication id (the old README recipe), and a
 *    quarantine in force, are refused (65, nothing written), and --force
 *    prepares the server, ending a client's wait at once;
 *  - Cerberus keys left without their marker, and a FLUSHALL, are refused;
 *    so is a fresh prefix on a server another prefix uses (its keys may be
 *    all that came back after this one's loss); --force prepares it;
 *  - an unreachable server: init ends within its timeouts (69);
 *  - without init, `cerberus run -v` warns once, naming `cerberus init`,
 *    and a client that tries many names warns once, not per name;
 *  - init, then FLUSHALL: the loss is still noticed and quarantined
 *    (DESIGN.md §5a.1, §5a.3): the holder is told LOST before anyone else
 *    is granted its name, and the new token is above its.
 * It restarts and pauses its server: it owns it (the *_fault name puts it
 * on the exclusive server, tests/CMakeLists.txt), and leaves it prepared.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
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
#include "cli_capture.h"
#include "test_util.h"

#define LEASE_MS 1500        /* where a test waits a quarantine out */
#define LONG_LEASE_MS 10000  /* the default, where none should be waited */
#define MARKER "\x1f" "cerberus"
/* The bound on a first grant that must not wait: far below the quarantine
 * (LONG_LEASE_MS) and loose for a sanitized build on two busy cores; the
 * measured time is printed (the target is under 100 ms). */
#define FIRST_GRANT_MAX_MS 2500

/* ---- the server ---- */

/* Stopped and started again empty and unprepared: a new stock server. */
static int fresh_server(void **state)
{
    (void)state;
    if (cerb_test_servers("stop") != 0)
        return -1;
    setenv("CERB_REDIS_UNMARKED", "1", 1);
    int rc = cerb_test_servers("start");
    unsetenv("CERB_REDIS_UNMARKED");
    return rc == 0 ? 0 : -1;
}

/* Left as servers.sh starts it (prepared), for the suites after this one. */
static int restore_server(void **state)
{
    (void)state;
    cerb_test_redis_resume();
    if (cerb_test_servers("stop") != 0)
        return -1;
    return cerb_test_servers("start") == 0 ? 0 : -1;
}

static redisContext *raw(void)
{
    struct timeval tv = {5, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    assert_non_null(r);
    assert_int_equal(r->err, 0);
    redisSetTimeout(r, tv);
    return r;
}

/* The marker's value, or "" when there is none. */
static void marker(char *out, size_t len)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "GET %s", MARKER);
    assert_non_null(rep);
    snprintf(out, len, "%s", rep->type == REDIS_REPLY_STRING ? rep->str : "");
    freeReplyObject(rep);
    redisFree(r);
}

static void raw_ok(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisContext *r = raw();
    redisReply *rep = redisvCommand(r, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    assert_int_not_equal(rep->type, REDIS_REPLY_ERROR);
    freeReplyObject(rep);
    redisFree(r);
}

static void replid(char *out, size_t len)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "INFO replication");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    const char *p = strstr(rep->str, "master_replid:");
    assert_non_null(p);
    p += 14;
    size_t n = strcspn(p, "\r\n");
    assert_true(n < len);
    memcpy(out, p, n);
    out[n] = '\0';
    freeReplyObject(rep);
    redisFree(r);
}

/* ---- the command ---- */

static char *config_file(const char *redis_extra, int lease_ms)
{
    char extra[64];
    snprintf(extra, sizeof extra, "lock = { lease_ms = %d; };", lease_ms);
    char *text = cerb_test_redis_config(redis_extra, extra);
    assert_non_null(text);
    char *path = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(path);
    return path;
}

/* `cerberus -c cfg <args...>`, captured; mark: the stderr text to time. */
static void cerberus(struct cerb_test_capture *res, const char *cfg, const char *mark, ...)
{
    char bin[4096];
    char *argv[16];
    int n = 0;
    snprintf(bin, sizeof bin, "%s/cli/cerberus", cerb_test_build_dir());
    argv[n++] = bin;
    argv[n++] = "-c";
    argv[n++] = (char *)cfg;
    va_list ap;
    va_start(ap, mark);
    for (char *a; n < 15 && (a = va_arg(ap, char *)) != NULL;)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    assert_int_equal(cerb_test_capture_run(argv, mark, 30000, res), 0);
    print_message("cerberus %s → %d\n  stdout: %s  stderr: %s\n", argv[3], res->status, res->out,
                  res->err);
}

/* `cerberus run -v name -- true`: granted, and how long from the spawn. */
static int64_t run_once(const char *cfg, const char *name, struct cerb_test_capture *res)
{
    cerberus(res, cfg, "run: holding", "run", "-v", name, "--", "true", NULL);
    assert_int_equal(res->status, 0);
    assert_true(res->mark_ms >= 0);
    return res->mark_ms;
}

/* ---- tests ---- */

static void test_init_then_first_grant_at_once(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LONG_LEASE_MS);
    char *name = test_name("init-first");
    struct cerb_test_capture res;

    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, ": prepared: marker written, replication id "));
    cerb_test_capture_free(&res);

    int64_t ms = run_once(cfg, name, &res);
    print_message("first grant %lld ms after the start of `cerberus run` (lease %d ms)\n",
                  (long long)ms, LONG_LEASE_MS);
    assert_null(strstr(res.err, "quarantined"));
    cerb_test_capture_free(&res);
    assert_true(ms < FIRST_GRANT_MAX_MS);

    cerb_test_remove_file(cfg);
    free(name);
}

static void test_init_twice_changes_nothing(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LONG_LEASE_MS);
    char first[256], second[256], rid[64];
    struct cerb_test_capture res;

    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    cerb_test_capture_free(&res);
    marker(first, sizeof first);
    replid(rid, sizeof rid);
    /* "<id> 0 <replid>": no quarantine, this server's history. */
    char *sp = strchr(first, ' ');
    assert_non_null(sp);
    assert_int_equal(strncmp(sp, " 0 ", 3), 0);
    assert_string_equal(sp + 3, rid);

    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "already prepared"));
    assert_non_null(strstr(res.out, "nothing written"));
    cerb_test_capture_free(&res);
    marker(second, sizeof second);
    assert_string_equal(first, second);
    cerb_test_remove_file(cfg);
}

/* The old README recipe: a marker without the replication id. */
static void test_foreign_marker_refused_then_forced(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LONG_LEASE_MS);
    char *name = test_name("init-forced");
    char m[256], rid[64], want[256];
    struct cerb_test_capture res;

    raw_ok("SET %s %s", MARKER, "new-1764000000 0");
    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 65);
    assert_non_null(strstr(res.err, "refused, nothing written"));
    assert_non_null(strstr(res.err, "records no replication id"));
    assert_non_null(strstr(res.err, "--force"));
    cerb_test_capture_free(&res);
    marker(m, sizeof m);
    assert_string_equal(m, "new-1764000000 0");

    cerberus(&res, cfg, NULL, "init", "--force", NULL);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "rewritten with --force"));
    cerb_test_capture_free(&res);
    replid(rid, sizeof rid);
    snprintf(want, sizeof want, "new-1764000000 0 %s", rid);
    marker(m, sizeof m);
    assert_string_equal(m, want); /* its id kept */

    int64_t ms = run_once(cfg, name, &res);
    print_message("first grant after init --force: %lld ms\n", (long long)ms);
    cerb_test_capture_free(&res);
    assert_true(ms < FIRST_GRANT_MAX_MS);
    cerb_test_remove_file(cfg);
    free(name);
}

/* A client found the server unprepared and waits: init refuses (it cannot
 * know that the server is new), --force ends the client's wait at once. */
static void test_quarantine_in_force_refused_then_forced(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LONG_LEASE_MS);
    char *name = test_name("init-q");
    char extra[64];
    snprintf(extra, sizeof extra, "lock = { lease_ms = %d; };", 20000);
    char *text = cerb_test_redis_config(NULL, extra);
    cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY); /* quarantined for 20 s */

    struct cerb_test_capture res;
    char before[256], after[256];
    marker(before, sizeof before);
    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 65);
    assert_non_null(strstr(res.err, "a quarantine is in force until server time"));
    cerb_test_capture_free(&res);
    marker(after, sizeof after);
    assert_string_equal(before, after);

    cerberus(&res, cfg, NULL, "init", "--force", NULL);
    assert_int_equal(res.status, 0);
    cerb_test_capture_free(&res);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    int64_t waited = cerb_test_now_ms() - t0;
    print_message("the waiting client was granted %lld ms after init --force\n",
                  (long long)waited);
    assert_true(waited < FIRST_GRANT_MAX_MS);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    cerb_test_remove_file(cfg);
    free(name);
}

/* Signs of earlier use without a marker: a fence counter of a name used
 * before (the marker deleted alone), and a FLUSHALL since the start. */
static void test_leftovers_without_marker_refused(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LONG_LEASE_MS);
    char *name = test_name("init-left");
    struct cerb_test_capture res;

    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    cerb_test_capture_free(&res);
    run_once(cfg, name, &res);
    cerb_test_capture_free(&res);
    raw_ok("DEL %s", MARKER);
    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 65);
    assert_non_null(strstr(res.err, "no marker, but Cerberus keys"));
    assert_non_null(strstr(res.err, "fence"));
    cerb_test_capture_free(&res);

    raw_ok("FLUSHALL");
    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 65);
    assert_non_null(strstr(res.err, "FLUSHALL or FLUSHDB ran 1 times"));
    cerb_test_capture_free(&res);
    char m[256];
    marker(m, sizeof m);
    assert_string_equal(m, "");
    cerb_test_remove_file(cfg);
    free(name);
}

/* Another namespace's keys refuse a prefix that has none: they may be all
 * that came back after this one lost its data (a restart without
 * persistence or from an older snapshot, a failover to a replica without
 * it: the other namespace's clients re-create their keys at once, and the
 * server's eviction and flush counters start again at zero). A new prefix
 * on a server in use is prepared with --force, by whoever knows none of
 * its holders is alive. */
static void test_other_namespace_refuses_fresh_prefix(void **state)
{
    (void)state;
    char *cfg_q = config_file("prefix = \"ns-q:\";", LONG_LEASE_MS);
    char *cfg_p = config_file("prefix = \"ns-p:\";", LONG_LEASE_MS);
    char *name = test_name("init-ns");
    struct cerb_test_capture res;

    cerberus(&res, cfg_q, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    cerb_test_capture_free(&res);
    run_once(cfg_q, name, &res);
    cerb_test_capture_free(&res);

    cerberus(&res, cfg_p, NULL, "init", NULL);
    assert_int_equal(res.status, 65);
    assert_non_null(strstr(res.err, "no marker, but Cerberus keys"));
    assert_non_null(strstr(res.err, "ns-q:"));
    cerb_test_capture_free(&res);
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "EXISTS %s", "ns-p:" MARKER);
    assert_non_null(rep);
    assert_int_equal(rep->integer, 0);
    freeReplyObject(rep);
    redisFree(r);

    cerberus(&res, cfg_p, NULL, "init", "--force", NULL);
    assert_int_equal(res.status, 0);
    cerb_test_capture_free(&res);
    cerb_test_remove_file(cfg_q);
    cerb_test_remove_file(cfg_p);
    free(name);
}

/* A server that does not answer: init ends within its timeouts. */
static void test_silent_server_bounded(void **state)
{
    (void)state;
    char *cfg = config_file("connect_timeout_ms = 300; op_timeout_ms = 300;", LONG_LEASE_MS);
    struct cerb_test_capture res;
    assert_int_equal(cerb_test_redis_pause(), 0);
    int64_t t0 = cerb_test_now_ms();
    cerberus(&res, cfg, NULL, "init", NULL);
    int64_t took = cerb_test_now_ms() - t0;
    assert_int_equal(cerb_test_redis_resume(), 0);
    print_message("init against a paused server: %lld ms\n", (long long)took);
    assert_int_equal(res.status, 69);
    assert_non_null(strstr(res.err, "init: redis "));
    cerb_test_capture_free(&res);
    assert_true(took < 5000);
    cerb_test_remove_file(cfg);
}

/* ---- the warning ---- */

static atomic_int warned;
static char warn_line[2048];

static void count_warnings(cerb_log_level level, const char *line, void *ud)
{
    (void)ud;
    if (level == CERB_LOG_WARN && strstr(line, "quarantined") &&
        atomic_fetch_add(&warned, 1) == 0)
        snprintf(warn_line, sizeof warn_line, "%s", line);
}

static void test_warns_once_without_init(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LEASE_MS);
    char *name = test_name("init-warn");
    struct cerb_test_capture res;

    int64_t ms = run_once(cfg, name, &res);
    print_message("without init: granted %lld ms after the start (lease %d ms)\n",
                  (long long)ms, LEASE_MS);
    assert_int_equal(cerb_test_count(res.err, "warning: redis "), 1);
    assert_int_equal(cerb_test_count(res.err, "quarantined"), 1);
    assert_non_null(strstr(res.err, "no Cerberus marker"));
    assert_non_null(strstr(res.err, "from now"));
    assert_non_null(strstr(res.err, "`cerberus init`"));
    assert_true(ms >= LEASE_MS / 2);
    cerb_test_capture_free(&res);

    /* One client, many names, while the quarantine lasts: still once. */
    raw_ok("FLUSHALL");
    atomic_store(&warned, 0);
    cerb_log_set(count_warnings, NULL, CERB_LOG_WARN);
    char *text = cerb_test_redis_config(NULL, "lock = { lease_ms = 20000; };");
    cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    for (int i = 0; i < 20; i++) {
        char n[300];
        snprintf(n, sizeof n, "%s-%d", name, i);
        cerb_lock *l = cerb_test_handle(c, n);
        assert_non_null(l);
        assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
        cerb_lock_free(l);
    }
    cerb_client_close(c);
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
    print_message("library: %d warning(s): %s\n", atomic_load(&warned), warn_line);
    assert_int_equal(atomic_load(&warned), 1);
    assert_non_null(strstr(warn_line, "`cerberus init`"));
    cerb_test_remove_file(cfg);
    free(name);
}

/* ---- init does not weaken the loss detection ---- */

static atomic_llong lost_at_ms;

static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    long long zero = 0;
    atomic_compare_exchange_strong(&lost_at_ms, &zero, cerb_test_now_ms());
}

static void test_init_then_flushall_still_quarantines(void **state)
{
    (void)state;
    char *cfg = config_file(NULL, LONG_LEASE_MS);
    char *name = test_name("init-flush");
    struct cerb_test_capture res;
    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    cerb_test_capture_free(&res);

    char extra[64];
    snprintf(extra, sizeof extra, "lock = { lease_ms = %d; };", LEASE_MS);
    char *text = cerb_test_redis_config("op_timeout_ms = 200; connect_timeout_ms = 200;", extra);
    cerb_client *a = cerb_test_open(text);
    cerb_client *b = cerb_test_open(text);
    free(text);
    assert_non_null(a);
    assert_non_null(b);
    cerb_lock *la = cerb_test_handle(a, name);
    atomic_store(&lost_at_ms, 0);
    cerb_lock_on_lost(la, on_lost, NULL);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(la, 5000), CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < FIRST_GRANT_MAX_MS); /* prepared: no wait */
    uint64_t fa = cerb_lock_fencing_token(la);

    raw_ok("FLUSHALL");
    /* Until a client makes the marker again, init refuses: the flush is a
     * sign of earlier use. */
    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 65);
    cerb_test_capture_free(&res);

    cerb_lock *lb = cerb_test_handle(b, name);
    t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock_for(lb, 10000), CERB_OK);
    int64_t granted = cerb_test_now_ms();
    long long lost = atomic_load(&lost_at_ms);
    uint64_t fb = cerb_lock_fencing_token(lb);
    print_message("after FLUSHALL: B granted after %lld ms, A told LOST %s\n",
                  (long long)(granted - t0), lost ? "before" : "never");
    if (lost == 0 || lost > granted)
        fail_msg("B was granted \"%s\" before A was told LOST", name);
    assert_true(fb > fa);
    /* The quarantine held B back (about a lease), init or not. */
    assert_true(granted - t0 >= LEASE_MS / 2);
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_LOST);

    cerb_lock_unlock(lb);
    cerb_lock_free(lb);
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_test_remove_file(cfg);
    free(name);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_init_then_first_grant_at_once, fresh_server),
        cmocka_unit_test_setup(test_init_twice_changes_nothing, fresh_server),
        cmocka_unit_test_setup(test_foreign_marker_refused_then_forced, fresh_server),
        cmocka_unit_test_setup(test_quarantine_in_force_refused_then_forced, fresh_server),
        cmocka_unit_test_setup(test_leftovers_without_marker_refused, fresh_server),
        cmocka_unit_test_setup(test_other_namespace_refuses_fresh_prefix, fresh_server),
        cmocka_unit_test_setup(test_silent_server_bounded, fresh_server),
        cmocka_unit_test_setup(test_warns_once_without_init, fresh_server),
        cmocka_unit_test_setup(test_init_then_flushall_still_quarantines, fresh_server),
    };
    return cmocka_run_group_tests(tests, NULL, restore_server);
}
