/*
 * test_config.c — the configuration module (config/): defaults, the
 * DESIGN.md §6 example, every class of error with its exact `file:line:
 * message`, files, reload rules, and allocation failure at every step.
 *
 * Engine names are checked against the library's registry. The §6 example
 * lists zk and etcd, which a build may not include; the test registers
 * placeholder tables under those names when they are missing (they are never
 * opened), and builds every "available: …" list from the registry itself so
 * the expectations hold whatever engines are compiled in. Leaks are found by
 * LeakSanitizer in the ASan build, the OOM loop included.
 */
#include "internal_posix.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "config.h"
#include "engine.h"
#include "error.h"
#include "schema.h"

static const char design_example[] =
    "engines = (\"redis\", \"zk\", \"etcd\");\n"
    "active = \"auto\";\n"
    "lock = { lease_ms = 10000; renew = true; fair = true; };\n"
    "retry = { max = 2; backoff_ms = 20; backoff_max_ms = 200; };\n"
    "epoch = 1;                      # bumped by `cerberus switch`\n"
    "failover = { probe_interval_ms = 250; probe_timeout_ms = 200;\n"
    "  consecutive_failures = 3; failure_rate = 50; window_ms = 10000; "
    "min_calls = 10;\n"
    "  open_ms = 5000; half_open_successes = 3; failback = \"auto\";\n"
    "  failback_after_ms = 60000; switch_grace_ms = -1; watch_config = true; "
    "};\n"
    "redis = { host = \"127.0.0.1\"; port = 6379; user = \"\"; password = \"\"; "
    "db = 0;\n"
    "  prefix = \"\"; connect_timeout_ms = 500; op_timeout_ms = 500; pool_max = 64; "
    "};\n"
    "zk = { hosts = \"127.0.0.1:2181\"; root = \"/cerberus/locks\"; "
    "session_timeout_ms = 10000; };\n"
    "etcd = { endpoints = (\"http://127.0.0.1:2379\"); prefix = \"\";\n"
    "  session_ttl_s = 10; op_timeout_ms = 1000; };\n";

/* ---- placeholder engines for names a build may lack ---- */

static cerb_status ph_open(const cerb_engine_env *env, cerb_engine **out)
{
    *out = NULL;
    return cerb__error_set(CERB_UNAVAILABLE, "placeholder engine");
}
static void ph_close(cerb_engine *e) {}
static cerb_status ph_acquire(cerb_engine *e, cerb_engine_lock *lk,
                              int64_t deadline_ns,
                              const atomic_int *interrupted, cerb_grant *g)
{
    return CERB_UNAVAILABLE;
}
static cerb_status ph_renew(cerb_engine *e, cerb_engine_lock *lk,
                            cerb_grant *g)
{
    return CERB_UNAVAILABLE;
}
static cerb_status ph_release(cerb_engine *e, cerb_engine_lock *lk)
{
    return CERB_UNAVAILABLE;
}
static cerb_status ph_probe(cerb_engine *e, int64_t timeout_ms)
{
    return CERB_UNAVAILABLE;
}

static const struct cerb_engine_ops ph_zk = {
    .version = CERB_ENGINE_OPS_VERSION, .name = "zk", .open = ph_open,
    .close = ph_close, .acquire = ph_acquire, .renew = ph_renew,
    .release = ph_release, .check_owner = ph_renew, .probe = ph_probe};
static const struct cerb_engine_ops ph_etcd = {
    .version = CERB_ENGINE_OPS_VERSION, .name = "etcd", .open = ph_open,
    .close = ph_close, .acquire = ph_acquire, .renew = ph_renew,
    .release = ph_release, .check_owner = ph_renew, .probe = ph_probe};

static int setup_engines(void **state)
{
    cerb__engines_builtin();
    if (!cerb__engine_find("zk") && cerb__engine_register(&ph_zk) != CERB_OK)
        return -1;
    if (!cerb__engine_find("etcd") &&
        cerb__engine_register(&ph_etcd) != CERB_OK)
        return -1;
    return 0;
}

/* ---- helpers ---- */

/* printf into a static buffer (expectations built at run time). */
static const char *fmt(const char *f, ...) CERB_PRINTF(1, 2);
static const char *fmt(const char *f, ...)
{
    static char buf[CERB_ERROR_MAX];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

static const char *available(void)
{
    static char names[256];
    cerb__engines_builtin();
    cerb__engine_names(names, sizeof names);
    return names;
}

static struct cerb_config *parse_ok(const char *text)
{
    struct cerb_config *cfg = NULL;
    cerb_status st = cerb__config_from_string(text, &cfg);
    if (st != CERB_OK)
        fail_msg("unexpected error %d: %s", (int)st, cerb_last_error());
    assert_non_null(cfg);
    return cfg;
}

static void expect_error(const char *text, const char *msg)
{
    struct cerb_config *cfg = (struct cerb_config *)&cfg; /* not NULL */
    assert_int_equal(cerb__config_from_string(text, &cfg), CERB_ECONFIG);
    assert_null(cfg);
    assert_string_equal(cerb_last_error(), msg);
}

/* ---- defaults ---- */

static void test_schema_rows(void **state)
{
    assert_true(cerb__cfg_nkeys <= CERB__CFG_MAX_KEYS);
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        const struct cerb__cfg_key *k = &cerb__cfg_keys[i];
        unsigned mut = k->flags & (CERB__CFG_RELOADABLE | CERB__CFG_IMMUTABLE);
        /* Exactly one of the two flags, and the field matches the type. */
        assert_true(mut == CERB__CFG_RELOADABLE || mut == CERB__CFG_IMMUTABLE);
        assert_int_equal(cerb__cfg_key_index(k->path), (int)i);
        if (k->type == CERB__CFG_INT)
            assert_int_equal(k->size, sizeof(int));
        if (k->type == CERB__CFG_INT64)
            assert_int_equal(k->size, sizeof(int64_t));
        if (k->type == CERB__CFG_BOOL)
            assert_int_equal(k->size, sizeof(bool));
        /* Connection settings and the engine list cannot change live; nor
         * guard.app, part of every guard record's id; nor serve's sockets
         * and their limits (its token file, rate, drain and window can). */
        bool serve_live = strcmp(k->path, "serve.token_file") == 0 ||
                          strcmp(k->path, "serve.rate_limit") == 0 ||
                          strcmp(k->path, "serve.rate_burst") == 0 ||
                          strcmp(k->path, "serve.drain_ms") == 0 ||
                          strcmp(k->path, "serve.keepalive_ms") == 0;
        if (strchr(k->path, '.') == NULL
                ? strcmp(k->path, "engines") == 0
                : (strncmp(k->path, "lock.", 5) != 0 &&
                   strncmp(k->path, "retry.", 6) != 0 &&
                   strncmp(k->path, "failover.", 9) != 0 &&
                   strncmp(k->path, "guard.", 6) != 0 && !serve_live) ||
                      strcmp(k->path, "guard.app") == 0)
            assert_int_equal(mut, CERB__CFG_IMMUTABLE);
        else
            assert_int_equal(mut, CERB__CFG_RELOADABLE);
    }
    assert_int_equal(cerb__cfg_key_index("redis.prot"), -1);
    assert_true(cerb__cfg_is_group("failover"));
    assert_false(cerb__cfg_is_group("fail"));
    assert_false(cerb__cfg_is_group("engines"));
}

static void check_defaults(const struct cerb_config *c)
{
    assert_int_equal(c->n_engines, 1);
    assert_string_equal(c->engines[0], "local");
    assert_string_equal(c->active, "auto");
    assert_int_equal(c->epoch, 1);
    assert_int_equal(c->lock.lease_ms, 10000);
    assert_true(c->lock.renew);
    assert_true(c->lock.fair);
    assert_int_equal(c->retry.max, 2);
    assert_int_equal(c->retry.backoff_ms, 20);
    assert_int_equal(c->retry.backoff_max_ms, 200);
    assert_int_equal(c->failover.probe_interval_ms, 250);
    assert_int_equal(c->failover.probe_timeout_ms, 200);
    assert_int_equal(c->failover.consecutive_failures, 3);
    assert_int_equal(c->failover.failure_rate, 50);
    assert_int_equal(c->failover.window_ms, 10000);
    assert_int_equal(c->failover.min_calls, 10);
    assert_int_equal(c->failover.open_ms, 5000);
    assert_int_equal(c->failover.half_open_successes, 3);
    assert_true(c->failover.failback_auto);
    assert_int_equal(c->failover.failback_after_ms, 60000);
    assert_int_equal(c->failover.switch_grace_ms, -1);
    assert_true(c->failover.watch_config);
    assert_string_equal(c->redis.host, "127.0.0.1");
    assert_int_equal(c->redis.port, 6379);
    assert_string_equal(c->redis.user, "");
    assert_string_equal(c->redis.password, "");
    assert_int_equal(c->redis.db, 0);
    assert_string_equal(c->redis.prefix, "");
    assert_int_equal(c->redis.connect_timeout_ms, 500);
    assert_int_equal(c->redis.op_timeout_ms, 500);
    assert_int_equal(c->redis.pool_max, 64);
    assert_string_equal(c->zk.hosts, "127.0.0.1:2181");
    assert_string_equal(c->zk.root, "/cerberus/locks");
    assert_int_equal(c->zk.session_timeout_ms, 10000);
    assert_int_equal(c->zk.connect_timeout_ms, 2000);
    assert_string_equal(c->zk.user, "");
    assert_string_equal(c->zk.password, "");
    assert_int_equal(c->etcd.n_endpoints, 1);
    assert_string_equal(c->etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(c->etcd.prefix, "");
    assert_int_equal(c->etcd.session_ttl_s, 10);
    assert_int_equal(c->etcd.op_timeout_ms, 1000);
    assert_int_equal(c->etcd.connect_timeout_ms, 500);
    assert_string_equal(c->etcd.user, "");
    assert_string_equal(c->etcd.password, "");
    assert_string_equal(c->local.dir, "");
}

static void test_defaults(void **state)
{
    struct cerb_config *c = NULL;
    assert_int_equal(cerb__config_defaults(&c), CERB_OK);
    assert_null(c->path);
    check_defaults(c);
    assert_int_equal(cerb__config_validate(c, NULL, NULL), CERB_OK);
    cerb__config_free(c);
    cerb__config_free(NULL);
    assert_int_equal(cerb__config_defaults(NULL), CERB_EINVAL);
}

static void test_empty_text_is_defaults(void **state)
{
    struct cerb_config *c = parse_ok("# nothing here\n");
    check_defaults(c);
    cerb__config_free(c);
}

/* ---- valid input ---- */

static void test_design_example(void **state)
{
    struct cerb_config *c = parse_ok(design_example);
    assert_null(c->path);
    assert_int_equal(c->n_engines, 3);
    assert_string_equal(c->engines[0], "redis");
    assert_string_equal(c->engines[1], "zk");
    assert_string_equal(c->engines[2], "etcd");
    /* Every other value in the example is the default. */
    c->n_engines = 1;
    snprintf(c->engines[0], sizeof c->engines[0], "local");
    check_defaults(c);
    cerb__config_free(c);
}

static void test_values_and_int_forms(void **state)
{
    struct cerb_config *c = parse_ok(
        "engines = [\"local\", \"redis\"];\n"  /* array form too */
        "active = \"redis\";\n"
        "epoch = 4095L;\n"
        "lock = { lease_ms = 86400000L; renew = false; fair = false; };\n"
        "retry = { max = 0; backoff_ms = 0; backoff_max_ms = 0; };\n"
        "failover = { failback = \"manual\"; switch_grace_ms = 0;"
        " probe_interval_ms = 0x64; probe_timeout_ms = 100; };\n"
        "redis = { host = \"::1\"; port = 65535; db = 15; pool_max = 1024;"
        " prefix = \"app:\"; password = \"s3cret\"; };\n"
        "zk = { root = \"/a\"; user = \"u\"; password = \"p\"; };\n"
        "etcd = { endpoints = (\"https://127.0.0.1:1\","
        " \"http://127.0.0.1:2\"); };\n"
        "local = { dir = \"/tmp/cerb\"; };\n");
    assert_int_equal(c->n_engines, 2);
    assert_string_equal(c->engines[1], "redis");
    assert_string_equal(c->active, "redis");
    assert_int_equal(c->epoch, 4095);
    assert_int_equal(c->lock.lease_ms, 86400000);
    assert_false(c->lock.renew);
    assert_false(c->lock.fair);
    assert_int_equal(c->retry.max, 0);
    assert_false(c->failover.failback_auto);
    assert_int_equal(c->failover.switch_grace_ms, 0);
    assert_int_equal(c->failover.probe_interval_ms, 100);
    assert_string_equal(c->redis.host, "::1");
    assert_int_equal(c->redis.port, 65535);
    assert_int_equal(c->redis.db, 15);
    assert_int_equal(c->redis.pool_max, 1024);
    assert_string_equal(c->redis.prefix, "app:");
    assert_string_equal(c->redis.password, "s3cret");
    assert_string_equal(c->zk.root, "/a");
    assert_string_equal(c->zk.user, "u");
    assert_int_equal(c->etcd.n_endpoints, 2);
    assert_string_equal(c->etcd.endpoints[0], "https://127.0.0.1:1");
    assert_string_equal(c->etcd.endpoints[1], "http://127.0.0.1:2");
    assert_string_equal(c->local.dir, "/tmp/cerb");
    cerb__config_free(c);

    c = parse_ok("lock = { lease_ms = 10000L; };\nactive = \"local\";\n");
    assert_int_equal(c->lock.lease_ms, 10000);
    assert_string_equal(c->engines[0], "local"); /* engines absent */
    cerb__config_free(c);
}

/* ---- errors, each with its line ---- */

static void test_syntax_error(void **state)
{
    expect_error("engines = (\"local\");\n\nlock = { lease_ms = ; };\n",
                 "config:3: syntax error");
    /* (Not a string where a name belongs: libconfig 1.5 leaks that token.) */
    expect_error("epoch = 1;\nengines = (\"local\", ;\n",
                 "config:2: syntax error");
    expect_error("lock = { renew = true; };\nlock = { fair = true; };\n",
                 "config:2: duplicate setting name");
}

static void test_etcd_tls_keys(void **state)
{
    (void)state;
    struct cerb_config *cfg = NULL;
    assert_int_equal(cerb__config_from_string(
                         "etcd = { endpoints = (\"https://127.0.0.1:2379\");\n"
                         "  ca_file = \"/etc/ca.pem\"; cert_file = \"c.pem\"; key_file = \"k.pem\"; };\n",
                         &cfg),
                     CERB_OK);
    assert_string_equal(cfg->etcd.ca_file, "/etc/ca.pem");
    assert_string_equal(cfg->etcd.cert_file, "c.pem");
    assert_string_equal(cfg->etcd.key_file, "k.pem");
    cerb__config_free(cfg);
    assert_int_equal(cerb__config_from_string("etcd = { ca_file = 3; };\n", &cfg), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "config:1:"));
}

static void test_unknown_keys(void **state)
{
    expect_error("engines = (\"local\");\n"
                 "active = \"auto\";\n"
                 "lock = { lease_ms = 10000; };\n"
                 "redis = {\n"
                 "  host = \"127.0.0.1\";\n"
                 "  # a typo follows\n"
                 "  prot = 6379;\n"
                 "};\n",
                 "config:7: unknown key \"redis.prot\"");
    expect_error("epoch = 1;\nredsi = { port = 1; };\n",
                 "config:2: unknown key \"redsi\"");
    expect_error("\n\nengine = (\"local\");\n",
                 "config:3: unknown key \"engine\"");
    expect_error("redis = {\n tls = { verify = true; };\n};\n",
                 "config:2: unknown key \"redis.tls\"");
    expect_error("lock = 5;\n", "config:1: lock: expected a group { ... }");
    expect_error("lock = (1);\n", "config:1: lock: expected a group { ... }");
    /* The first error in file order is the one reported. */
    expect_error("a = 1;\nlock = { lease_ms = 1; };\n",
                 "config:1: unknown key \"a\"");
}

static void test_wrong_types(void **state)
{
    expect_error("engines = (\"local\");\n\nlock = {\n lease_ms = \"10s\"; };",
                 "config:4: lock.lease_ms: expected an integer");
    expect_error("\n\nlock = { lease_ms = 1.5; };\n",
                 "config:3: lock.lease_ms: expected an integer");
    expect_error("redis = { port = true; };\n",
                 "config:1: redis.port: expected an integer");
    expect_error("lock = { renew = 1; };\n",
                 "config:1: lock.renew: expected true or false");
    expect_error("\nredis = { host = 5; };\n",
                 "config:2: redis.host: expected a string");
    expect_error("active = (\"auto\");\n",
                 "config:1: active: expected a string");
    expect_error("failover = { failback = true; };\n",
                 "config:1: failover.failback: expected a string");
    expect_error("engines = \"local\";\n",
                 "config:1: engines: expected a list of strings");
    expect_error("engines = (\"local\",\n  5);\n",
                 "config:2: engines: expected a list of strings");
    expect_error("etcd = { endpoints = \"http://x:1\"; };\n",
                 "config:1: etcd.endpoints: expected a list of strings");
    expect_error("lock = { lease_ms = { v = 1; }; };\n",
                 "config:1: lock.lease_ms: expected an integer");
}

static void test_out_of_range(void **state)
{
    expect_error("\n\nlock = { lease_ms = 5; };\n",
                 "config:3: lock.lease_ms: 5 is out of range 100..86400000");
    expect_error("lock = { lease_ms = 86400001L; };\n",
                 "config:1: lock.lease_ms: 86400001 is out of range "
                 "100..86400000");
    expect_error("redis = { port = 0; };\n",
                 "config:1: redis.port: 0 is out of range 1..65535");
    /* An int64 literal is range-checked before it is narrowed to int. */
    expect_error("redis = { port = 4294973831L; };\n",
                 "config:1: redis.port: 4294973831 is out of range 1..65535");
    expect_error("redis = { db = 16; };\n",
                 "config:1: redis.db: 16 is out of range 0..15");
    expect_error("failover = { switch_grace_ms = -2; };\n",
                 "config:1: failover.switch_grace_ms: -2 is out of range "
                 "-1..86400000");
    expect_error("failover = { failure_rate = 101; };\n",
                 "config:1: failover.failure_rate: 101 is out of range 1..100");
    expect_error("epoch = 65536;\n",
                 "config:1: epoch: 65536 is out of range 0..65535");
    expect_error("etcd = { session_ttl_s = 1; };\n",
                 "config:1: etcd.session_ttl_s: 1 is out of range 2..3600");
    expect_error("zk = { session_timeout_ms = 999; };\n",
                 "config:1: zk.session_timeout_ms: 999 is out of range "
                 "1000..600000");
    expect_error("failover = {\n failback = \"sometimes\"; };\n",
                 "config:2: failover.failback: expected one of \"auto\", "
                 "\"manual\"");
}

static void test_engines(void **state)
{
    expect_error("engines = (\"redsi\");\n",
                 fmt("config:1: unknown engine \"redsi\" (available: %s)",
                     available()));
    expect_error("engines = (\"local\",\n\n \"redsi\");\n",
                 fmt("config:3: unknown engine \"redsi\" (available: %s)",
                     available()));
    expect_error("engines = (\"a-name-much-too-long-for-an-engine\");\n",
                 fmt("config:1: unknown engine "
                     "\"a-name-much-too-long-for-an-engine\" (available: %s)",
                     available()));
    expect_error("engines = (\"\");\n",
                 fmt("config:1: unknown engine \"\" (available: %s)",
                     available()));
    expect_error("engines = (\"local\");\nactive = \"redsi\";\n",
                 fmt("config:2: unknown engine \"redsi\" (available: %s)",
                     available()));
    expect_error("engines = (\"local\");\nactive = \"redis\";\n",
                 "config:2: active engine \"redis\" is not listed in engines");
    expect_error("active = \"redis\";\n",
                 "config:1: active engine \"redis\" is not listed in engines");
    expect_error("epoch = 2;\nengines = (\"local\", \"redis\", \"local\");\n",
                 "config:2: engine \"local\" is listed twice");
    expect_error("engines = ();\n",
                 "config:1: engines: expected 1..8 entries, got 0");
    expect_error("engines = (\"local\", \"local\", \"local\", \"local\", "
                 "\"local\", \"local\", \"local\", \"local\", \"local\");\n",
                 "config:1: engines: expected 1..8 entries, got 9");
}

static void test_cross_field(void **state)
{
    expect_error("retry = {\n backoff_ms = 100;\n backoff_max_ms = 50; };\n",
                 "config:3: retry.backoff_max_ms (50) must be >= "
                 "retry.backoff_ms (100)");
    /* Only the base set: the line is the base's. */
    expect_error("\nretry = { backoff_ms = 300; };\n",
                 "config:2: retry.backoff_max_ms (200) must be >= "
                 "retry.backoff_ms (300)");
    expect_error("failover = { probe_interval_ms = 100;\n"
                 "  probe_timeout_ms = 150; };\n",
                 "config:2: failover.probe_timeout_ms (150) must be <= "
                 "failover.probe_interval_ms (100)");
    expect_error("failover = { probe_interval_ms = 100; };\n",
                 "config:1: failover.probe_timeout_ms (200) must be <= "
                 "failover.probe_interval_ms (100)");
    expect_error("zk = { root = \"cerberus\"; };\n",
                 "config:1: zk.root: \"cerberus\" must be an absolute path "
                 "without a trailing '/'");
    expect_error("zk = { root = \"/cerberus/\"; };\n",
                 "config:1: zk.root: \"/cerberus/\" must be an absolute path "
                 "without a trailing '/'");
    expect_error("zk = { root = \"/\"; };\n",
                 "config:1: zk.root: \"/\" must be an absolute path without "
                 "a trailing '/'");
    expect_error("zk = { root = \"/a//b\"; };\n",
                 "config:1: zk.root: \"/a//b\" must be an absolute path "
                 "without a trailing '/'");
    expect_error("etcd = { endpoints = (\"http://127.0.0.1:2379\",\n"
                 "  \"127.0.0.1:2379\"); };\n",
                 "config:2: etcd.endpoints: \"127.0.0.1:2379\" must start "
                 "with http:// or https://");
    expect_error("etcd = { endpoints = (\"https://\"); };\n",
                 "config:1: etcd.endpoints: \"https://\" must start with "
                 "http:// or https://");
    expect_error("redis = { host = \"\"; };\n",
                 "config:1: redis.host: must not be empty");
}

static void test_validate_struct(void **state)
{
    /* The validator is complete on a struct built by hand (no lines). */
    struct cerb_config *c = NULL;
    assert_int_equal(cerb__config_defaults(&c), CERB_OK);
    c->redis.port = 0;
    assert_int_equal(cerb__config_validate(c, "x.cfg", NULL), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(),
                        "x.cfg: redis.port: 0 is out of range 1..65535");
    c->redis.port = 6379;
    c->n_engines = 0;
    assert_int_equal(cerb__config_validate(c, NULL, NULL), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(),
                        "config: engines: expected 1..8 entries, got 0");
    c->n_engines = 1;
    snprintf(c->engines[0], sizeof c->engines[0], "nope");
    assert_int_equal(cerb__config_validate(c, NULL, NULL), CERB_ECONFIG);
    assert_string_equal(
        cerb_last_error(),
        fmt("config: unknown engine \"nope\" (available: %s)", available()));
    snprintf(c->engines[0], sizeof c->engines[0], "local");
    c->failover.failback_auto = false;
    assert_int_equal(cerb__config_validate(c, NULL, NULL), CERB_OK);
    assert_int_equal(cerb__config_validate(NULL, NULL, NULL), CERB_EINVAL);
    cerb__config_free(c);
}

static void test_bad_arguments(void **state)
{
    struct cerb_config *c = (struct cerb_config *)&c;
    assert_int_equal(cerb__config_from_string(NULL, &c), CERB_EINVAL);
    assert_null(c);
    assert_int_equal(cerb__config_from_string("", NULL), CERB_EINVAL);
    c = (struct cerb_config *)&c;
    assert_int_equal(cerb__config_from_file(NULL, &c), CERB_EINVAL);
    assert_null(c);
    assert_int_equal(cerb__config_from_file("x", NULL), CERB_EINVAL);
}

/* ---- files ---- */

/* Write text to a fresh temporary file; the caller unlinks it. */
static void write_temp(char *path, size_t len, const char *text)
{
    const char *dir = getenv("TMPDIR");
    FILE *fp;
    int fd;

    snprintf(path, len, "%s/cerb_test_cfg_XXXXXX", dir && *dir ? dir : "/tmp");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    fp = fdopen(fd, "w");
    assert_non_null(fp);
    assert_true(fputs(text, fp) >= 0);
    assert_int_equal(fclose(fp), 0);
}

static void test_file(void **state)
{
    char path[512];
    struct cerb_config *c = NULL;

    write_temp(path, sizeof path, design_example);
    assert_int_equal(cerb__config_from_file(path, &c), CERB_OK);
    assert_string_equal(c->path, path);
    assert_int_equal(c->n_engines, 3);
    cerb__config_free(c);
    unlink(path);

    write_temp(path, sizeof path,
               "engines = (\"local\");\n\n\nlock = { lease_ms = 5; };\n");
    c = (struct cerb_config *)&c;
    assert_int_equal(cerb__config_from_file(path, &c), CERB_ECONFIG);
    assert_null(c);
    assert_string_equal(
        cerb_last_error(),
        fmt("%s:4: lock.lease_ms: 5 is out of range 100..86400000", path));
    unlink(path);

    write_temp(path, sizeof path, "a = 1;\nb = ;\n");
    assert_int_equal(cerb__config_from_file(path, &c), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(), fmt("%s:2: syntax error", path));
    unlink(path);

    write_temp(path, sizeof path, "retry = { max = 1; };\nredis = { prot = 1; };\n");
    assert_int_equal(cerb__config_from_file(path, &c), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(),
                        fmt("%s:2: unknown key \"redis.prot\"", path));
    unlink(path);
}

static void test_file_not_found(void **state)
{
    struct cerb_config *c = (struct cerb_config *)&c;
    const char *dir = getenv("TMPDIR");

    assert_int_equal(
        cerb__config_from_file("/nonexistent-cerberus/cerberus.cfg", &c),
        CERB_ECONFIG);
    assert_null(c);
    assert_string_equal(cerb_last_error(),
                        "/nonexistent-cerberus/cerberus.cfg: cannot read: No "
                        "such file or directory");
    /* A directory would read as an empty, valid file: refused. */
    dir = dir && *dir ? dir : "/tmp";
    assert_int_equal(cerb__config_from_file(dir, &c), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(),
                        fmt("%s: cannot read: Is a directory", dir));
}

/* ---- reload ---- */

static void test_reload_rules(void **state)
{
    struct cerb_config *cur = parse_ok(design_example);
    struct cerb_config *next = parse_ok(
        "engines = (\"redis\", \"zk\", \"etcd\");\n"
        "active = \"zk\";\nepoch = 2;\n"
        "lock = { lease_ms = 30000; renew = false; };\n"
        "retry = { max = 5; };\n"
        "failover = { failback = \"manual\"; watch_config = false; };\n");
    assert_int_equal(cerb__config_reloadable(cur, next), CERB_OK);
    cerb__config_free(next);

    next = parse_ok("engines = (\"zk\", \"redis\", \"etcd\");\n");
    assert_int_equal(cerb__config_reloadable(cur, next), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(),
                        "config: key \"engines\" cannot change while running "
                        "(restart to apply)");
    cerb__config_free(next);

    next = parse_ok("engines = (\"redis\", \"zk\", \"etcd\");\n"
                    "redis = { port = 6380; };\n");
    assert_int_equal(cerb__config_reloadable(cur, next), CERB_ECONFIG);
    assert_string_equal(cerb_last_error(),
                        "config: key \"redis.port\" cannot change while "
                        "running (restart to apply)");
    cerb__config_free(next);
    cerb__config_free(cur);

    assert_int_equal(cerb__config_reloadable(NULL, NULL), CERB_EINVAL);
}

/* Every row: changing it is accepted exactly when it is RELOADABLE. */
static void test_reload_every_row(void **state)
{
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        const struct cerb__cfg_key *k = &cerb__cfg_keys[i];
        struct cerb_config *a = NULL, *b = NULL;
        cerb_status st;

        assert_int_equal(cerb__config_defaults(&a), CERB_OK);
        assert_int_equal(cerb__config_defaults(&b), CERB_OK);
        switch (k->type) {
        case CERB__CFG_INT:
        case CERB__CFG_INT64:
        case CERB__CFG_BOOL:
        case CERB__CFG_ENUM:
            cerb__cfg_set_int(k, b, !cerb__cfg_get_int(k, a));
            break;
        case CERB__CFG_STRING:
            assert_int_equal(cerb__cfg_set_str(k, b, "x"), CERB_OK);
            break;
        case CERB__CFG_STRLIST:
            assert_int_equal(cerb__cfg_list_push(k, b, "x"), CERB_OK);
            break;
        }
        b->path = cerb__strdup("new.cfg");
        assert_non_null(b->path);
        st = cerb__config_reloadable(a, b);
        if (k->flags & CERB__CFG_RELOADABLE) {
            assert_int_equal(st, CERB_OK);
        } else {
            assert_int_equal(st, CERB_ECONFIG);
            assert_string_equal(cerb_last_error(),
                                fmt("new.cfg: key \"%s\" cannot change while "
                                    "running (restart to apply)",
                                    k->path));
        }
        cerb__config_free(a);
        cerb__config_free(b);
    }
}

static void test_engine_index(void **state)
{
    struct cerb_config *c = parse_ok(design_example);
    assert_int_equal(cerb__config_engine_index(c, "redis"), 0);
    assert_int_equal(cerb__config_engine_index(c, "etcd"), 2);
    assert_int_equal(cerb__config_engine_index(c, "local"), -1);
    assert_int_equal(cerb__config_engine_index(c, "auto"), -1);
    assert_int_equal(cerb__config_engine_index(c, NULL), -1);
    assert_int_equal(cerb__config_engine_index(NULL, "redis"), -1);
    cerb__config_free(c);
}

/* ---- allocation failure ---- */

/*
 * Fail the Nth allocation for N = 1, 2, … until parsing succeeds: each
 * failure must be a clean CERB_ENOMEM with no output and nothing leaked
 * (LeakSanitizer checks at exit). Error paths that fail later (validation)
 * are stepped the same way.
 */
static void oom_loop(const char *text, cerb_status final)
{
    long n;
    for (n = 1; n < 10000; n++) {
        struct cerb_config *c = (struct cerb_config *)&c;
        cerb_status st;
        cerb__alloc_fail_after(n, 0);
        st = cerb__config_from_string(text, &c);
        if (cerb__alloc_fail_after(0, 0) == 0) { /* nothing failed: done */
            assert_int_equal(st, final);
            cerb__config_free(c);
            break;
        }
        assert_int_equal(st, CERB_ENOMEM);
        assert_null(c);
        assert_string_equal(cerb_last_error(), "out of memory");
    }
    assert_true(n > 1 && n < 10000);
}

static void test_oom(void **state)
{
    struct cerb_config *c = NULL;
    oom_loop(design_example, CERB_OK);
    oom_loop("etcd = { endpoints = (\"http://a:1\", \"http://b:2\"); };\n"
             "redis = { host = \"h\"; port = 70000; };\n",
             CERB_ECONFIG);
    /* Persistent failure from the first allocation on. */
    cerb__alloc_fail_after(1, 1);
    assert_int_equal(cerb__config_defaults(&c), CERB_ENOMEM);
    cerb__alloc_fail_after(0, 0);
    assert_null(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_rows),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_empty_text_is_defaults),
        cmocka_unit_test(test_design_example),
        cmocka_unit_test(test_values_and_int_forms),
        cmocka_unit_test(test_syntax_error),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_etcd_tls_keys),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_engines),
        cmocka_unit_test(test_cross_field),
        cmocka_unit_test(test_validate_struct),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_file_not_found),
        cmocka_unit_test(test_reload_rules),
        cmocka_unit_test(test_reload_every_row),
        cmocka_unit_test(test_engine_index),
        cmocka_unit_test(test_oom),
    };
    return cmocka_run_group_tests(tests, setup_engines, NULL);
}
