/*
 * test_redis_init_cluster.c — `cerberus init` on a Redis Cluster that no
 * client has used (three masters, three replicas: scripts/servers.sh start
 * cluster, here with CERB_REDIS_UNMARKED=1 so the script does not prepare
 * it). Without init each of the 16384 slots waits a lease at its first
 * grant, and nobody can write a marker per slot by hand:
 *  - init writes every slot's marker on the master serving it, and
 *    `cerberus run` on names in slots of every master is granted at once
 *    (time from the spawn to run's "holding" line, printed); init again
 *    changes nothing;
 *  - without init, `cerberus run -v` warns once, and a client that tries
 *    names in many slots warns once per master, not once per slot.
 * The suite restarts the cluster (the *_cluster name puts it under the
 * exclusive redis lock, tests/CMakeLists.txt) and leaves it prepared.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
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
#include "cli_capture.h"
#include "test_util.h"

#define FIRST_GRANT_MAX_MS 2500 /* far below the 10 s quarantine; see the single suite */
#define MASTERS 3
#define NAMES_PER_MASTER 2

static int base_port(void) { return cerb_test_env_port("CERB_CLUSTER_PORT", 27100); }

static int servers(const char *cmd)
{
    return cerb_test_servers_run(cmd, "cluster", base_port(), 120000);
}

static int fresh_cluster(void **state)
{
    (void)state;
    if (servers("stop") != 0)
        return -1;
    setenv("CERB_REDIS_UNMARKED", "1", 1);
    int rc = servers("start");
    unsetenv("CERB_REDIS_UNMARKED");
    return rc == 0 ? 0 : -1;
}

static int restore_cluster(void **state)
{
    (void)state;
    if (servers("stop") != 0)
        return -1;
    return servers("start") == 0 ? 0 : -1;
}

static char *config_text(int lease_ms)
{
    int b = base_port();
    char text[512];
    snprintf(text, sizeof text,
             "engines = (\"redis\");\n"
             "redis = { mode = \"cluster\"; nodes = (\"127.0.0.1:%d\", \"127.0.0.1:%d\"); };\n"
             "lock = { lease_ms = %d; };\n",
             b, b + 1, lease_ms);
    return strdup(text);
}

/* The port of the master serving key's slot, by CLUSTER KEYSLOT and SLOTS. */
static int owner_of(const char *key, long long *slot)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", base_port(), tv);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %s", key);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    *slot = r->integer;
    freeReplyObject(r);
    int port = -1;
    r = redisCommand(c, "CLUSTER SLOTS");
    assert_non_null(r);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->elements >= 3 && e->element[0]->integer <= *slot &&
            *slot <= e->element[1]->integer)
            port = (int)e->element[2]->element[1]->integer;
    }
    freeReplyObject(r);
    redisFree(c);
    assert_true(port > 0);
    return port;
}

/* Names whose slots are all different, `per` of them on each master. */
struct picked {
    char name[MASTERS * NAMES_PER_MASTER][64];
    int port[MASTERS * NAMES_PER_MASTER];
    int n;
};

static void pick_names(struct picked *p, const char *tag, int per)
{
    int ports[MASTERS] = {0}, count[MASTERS] = {0};
    long long slots[MASTERS * NAMES_PER_MASTER];
    p->n = 0;
    for (int i = 0; p->n < MASTERS * per && i < 10000; i++) {
        char name[64];
        long long s;
        snprintf(name, sizeof name, "%s-%d-%d", tag, (int)getpid(), i);
        int port = owner_of(name, &s);
        int m = 0;
        while (m < MASTERS && ports[m] && ports[m] != port)
            m++;
        assert_true(m < MASTERS);
        ports[m] = port;
        bool dup = false;
        for (int k = 0; k < p->n; k++)
            dup = dup || slots[k] == s;
        if (dup || count[m] >= per)
            continue;
        count[m]++;
        slots[p->n] = s;
        p->port[p->n] = port;
        snprintf(p->name[p->n++], sizeof p->name[0], "%s", name);
    }
    assert_int_equal(p->n, MASTERS * per);
}

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
    assert_int_equal(cerb_test_capture_run(argv, mark, 60000, res), 0);
    print_message("cerberus %s → %d\n  stdout: %s  stderr: %s\n", argv[3], res->status, res->out,
                  res->err);
}

static void test_cluster_init_then_first_grants_at_once(void **state)
{
    (void)state;
    char *text = config_text(10000);
    char *cfg = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(cfg);
    struct cerb_test_capture res;

    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "prepared (16384 slot markers on 3 masters): 16384 written"));
    cerb_test_capture_free(&res);

    struct picked p;
    pick_names(&p, "init-cl", NAMES_PER_MASTER);
    int64_t worst = 0;
    for (int i = 0; i < p.n; i++) {
        cerberus(&res, cfg, "run: holding", "run", "-v", p.name[i], "--", "true", NULL);
        assert_int_equal(res.status, 0);
        assert_null(strstr(res.err, "quarantined"));
        print_message("%s (master :%d): granted %lld ms after the start of `cerberus run`\n",
                      p.name[i], p.port[i], (long long)res.mark_ms);
        assert_true(res.mark_ms >= 0);
        if (res.mark_ms > worst)
            worst = res.mark_ms;
        cerb_test_capture_free(&res);
    }
    print_message("slowest first grant: %lld ms\n", (long long)worst);
    assert_true(worst < FIRST_GRANT_MAX_MS);

    cerberus(&res, cfg, NULL, "init", NULL);
    assert_int_equal(res.status, 0);
    assert_non_null(strstr(res.out, "already prepared"));
    cerb_test_capture_free(&res);
    cerb_test_remove_file(cfg);
}

static atomic_int warned;

static void count_warnings(cerb_log_level level, const char *line, void *ud)
{
    (void)ud;
    if (level == CERB_LOG_WARN && strstr(line, "quarantined") && strstr(line, "cerberus init"))
        atomic_fetch_add(&warned, 1);
}

static void test_cluster_warns_once_per_master_without_init(void **state)
{
    (void)state;
    char *text = config_text(1500);
    char *cfg = cerb_test_write_config("%s", text);
    free(text);
    assert_non_null(cfg);
    struct cerb_test_capture res;
    cerberus(&res, cfg, "run: holding", "run", "-v", "init-cl-warn", "--", "true", NULL);
    assert_int_equal(res.status, 0);
    assert_int_equal(cerb_test_count(res.err, "quarantined"), 1);
    assert_non_null(strstr(res.err, "in slot "));
    assert_non_null(strstr(res.err, "`cerberus init`"));
    assert_true(res.mark_ms >= 1000); /* it did wait the quarantine */
    cerb_test_capture_free(&res);

    /* Many slots on every master: one warning per master. */
    struct picked p;
    pick_names(&p, "init-cl-many", NAMES_PER_MASTER);
    atomic_store(&warned, 0);
    cerb_log_set(count_warnings, NULL, CERB_LOG_WARN);
    text = config_text(20000);
    cerb_client *c = cerb_test_open(text);
    free(text);
    assert_non_null(c);
    for (int i = 0; i < p.n; i++) {
        cerb_lock *l = cerb_test_handle(c, p.name[i]);
        assert_non_null(l);
        assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
        cerb_lock_free(l);
    }
    cerb_client_close(c);
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
    print_message("%d names in %d slots on %d masters: %d warning(s)\n", p.n, p.n, MASTERS,
                  atomic_load(&warned));
    assert_int_equal(atomic_load(&warned), MASTERS);
    cerb_test_remove_file(cfg);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_cluster_init_then_first_grants_at_once, fresh_cluster),
        cmocka_unit_test_setup(test_cluster_warns_once_per_master_without_init, fresh_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, restore_cluster);
}
