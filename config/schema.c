/*
 * schema.c — the table of every configuration key and the typed accessors
 * that read and write a key's field in struct cerb_config.
 *
 * The table follows Redis' standardConfig (src/config.c): one row per key
 * with its path, type, default, bounds, flags and an optional check, and
 * the field located by offsetof. Storage is generic: a row says how big its
 * field is and whether a string is a heap pointer or an inline buffer, so
 * the parser, the validator and the reload comparison never name a field.
 * Defaults and ranges are those documented in config.h. Keys under lock,
 * retry and failover, plus `active` and `epoch`, are RELOADABLE; the engine
 * list and every connection setting (redis, zk, etcd, pg, mysql, memcached, local) are
 * IMMUTABLE
 * because engines are opened once per client. The serve group belongs to
 * `cerberus serve` alone (the library opens no socket): its sockets are
 * immutable, its token file, limits and windows reloadable.
 */
#include "internal_posix.h"

#include "schema.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"

#define R CERB__CFG_RELOADABLE
#define I CERB__CFG_IMMUTABLE
#define FIELD(m) .offset = offsetof(struct cerb_config, m), \
                 .size = sizeof(((struct cerb_config *)0)->m)

#define KEY_INT(p, m, fl, d, lo, hi) \
    {.path = p, .type = CERB__CFG_INT, .flags = fl, FIELD(m), .min = lo, \
     .max = hi, .def = d}
#define KEY_I64(p, m, fl, d, lo, hi) \
    {.path = p, .type = CERB__CFG_INT64, .flags = fl, FIELD(m), .min = lo, \
     .max = hi, .def = d}
#define KEY_BOOL(p, m, fl, d) \
    {.path = p, .type = CERB__CFG_BOOL, .flags = fl, FIELD(m), .min = 0, \
     .max = 1, .def = d}
/* A heap string (char *). */
#define KEY_STR(p, m, fl, d, chk) \
    {.path = p, .type = CERB__CFG_STRING, .flags = fl, FIELD(m), \
     .def_str = d, .check = chk}
/* A string in a fixed char[] buffer. */
#define KEY_NAME(p, m, fl, d, chk) \
    {.path = p, .type = CERB__CFG_STRING, .flags = fl, FIELD(m), \
     .inline_len = sizeof(((struct cerb_config *)0)->m), .def_str = d, \
     .check = chk}
#define KEY_ENUM(p, m, fl, d, tbl) \
    {.path = p, .type = CERB__CFG_ENUM, .flags = fl, FIELD(m), .def = d, \
     .enums = tbl}

static const struct cerb__cfg_enum failback_enum[] = {
    {"auto", 1}, {"manual", 0}, {NULL, 0}};
static const struct cerb__cfg_enum redis_mode_enum[] = {
    {"single", CERB_REDIS_SINGLE}, {"sentinel", CERB_REDIS_SENTINEL},
    {"cluster", CERB_REDIS_CLUSTER}, {"redlock", CERB_REDIS_REDLOCK}, {NULL, 0}};
static const struct cerb__cfg_enum redlock_fence_enum[] = {
    {"quorum", CERB_REDLOCK_FENCE_QUORUM}, {"none", CERB_REDLOCK_FENCE_NONE}, {NULL, 0}};
static const struct cerb__cfg_enum sql_mode_enum[] = {
    {"hybrid", CERB_SQL_HYBRID}, {"lease", CERB_SQL_LEASE},
    {"advisory", CERB_SQL_ADVISORY}, {NULL, 0}};
static const struct cerb__cfg_enum guard_policy_enum[] = {
    {"refuse", CERB_GUARD_REFUSE}, {"allow", CERB_GUARD_ALLOW}, {NULL, 0}};

const struct cerb__cfg_key cerb__cfg_keys[] = {
    {.path = "engines", .type = CERB__CFG_STRLIST, .flags = I,
     .offset = offsetof(struct cerb_config, engines),
     .inline_len = CERB_ENGINE_NAME_MAX,
     .count_offset = offsetof(struct cerb_config, n_engines), .min = 1,
     .max = CERB_MAX_ENGINES, .def_str = "local",
     .check = cerb__cfg_check_engine},
    KEY_NAME("active", active, R, "auto", cerb__cfg_check_active),
    KEY_I64("epoch", epoch, R, 1, 0, 65535),

    KEY_I64("lock.lease_ms", lock.lease_ms, R, 10000, 100, 86400000),
    KEY_BOOL("lock.renew", lock.renew, R, 1),
    KEY_BOOL("lock.fair", lock.fair, R, 1),

    KEY_INT("retry.max", retry.max, R, 2, 0, 100),
    KEY_I64("retry.backoff_ms", retry.backoff_ms, R, 20, 0, 60000),
    KEY_I64("retry.backoff_max_ms", retry.backoff_max_ms, R, 200, 0, 600000),

    KEY_I64("failover.probe_interval_ms", failover.probe_interval_ms, R, 250,
            10, 600000),
    KEY_I64("failover.probe_timeout_ms", failover.probe_timeout_ms, R, 200, 1,
            600000),
    KEY_INT("failover.consecutive_failures", failover.consecutive_failures, R,
            3, 1, 1000),
    KEY_INT("failover.failure_rate", failover.failure_rate, R, 50, 1, 100),
    KEY_I64("failover.window_ms", failover.window_ms, R, 10000, 100, 3600000),
    KEY_INT("failover.min_calls", failover.min_calls, R, 10, 1, 1000000),
    KEY_I64("failover.open_ms", failover.open_ms, R, 5000, 10, 3600000),
    KEY_INT("failover.half_open_successes", failover.half_open_successes, R,
            3, 1, 1000),
    KEY_ENUM("failover.failback", failover.failback_auto, R, 1,
             failback_enum),
    KEY_I64("failover.failback_after_ms", failover.failback_after_ms, R,
            60000, 0, 86400000),
    KEY_I64("failover.switch_grace_ms", failover.switch_grace_ms, R, -1, -1,
            86400000),
    KEY_BOOL("failover.watch_config", failover.watch_config, R, 1),
    KEY_BOOL("failover.switch_claims", failover.switch_claims, R, 0),

    KEY_STR("redis.host", redis.host, I, "127.0.0.1",
            cerb__cfg_check_nonempty),
    KEY_INT("redis.port", redis.port, I, 6379, 1, 65535),
    KEY_STR("redis.user", redis.user, I, "", NULL),
    KEY_STR("redis.password", redis.password, I, "", NULL),
    KEY_INT("redis.db", redis.db, I, 0, 0, 15),
    KEY_STR("redis.prefix", redis.prefix, I, "", NULL),
    KEY_I64("redis.connect_timeout_ms", redis.connect_timeout_ms, I, 500, 1,
            600000),
    KEY_I64("redis.op_timeout_ms", redis.op_timeout_ms, I, 500, 1, 600000),
    KEY_INT("redis.pool_max", redis.pool_max, I, 64, 1, 1024),
    KEY_I64("redis.pool_idle_ms", redis.pool_idle_ms, I, 30000, 100, 86400000),
    KEY_ENUM("redis.mode", redis.mode, I, CERB_REDIS_SINGLE, redis_mode_enum),
    {.path = "redis.sentinels", .type = CERB__CFG_STRLIST, .flags = I,
     .offset = offsetof(struct cerb_config, redis.sentinels),
     .count_offset = offsetof(struct cerb_config, redis.n_sentinels),
     .min = 1, .max = CERB_MAX_ENDPOINTS, .def_str = "127.0.0.1:26379",
     .check = cerb__cfg_check_hostport},
    KEY_STR("redis.master_name", redis.master_name, I, "mymaster", cerb__cfg_check_nonempty),
    KEY_STR("redis.sentinel_password", redis.sentinel_password, I, "", NULL),
    {.path = "redis.nodes", .type = CERB__CFG_STRLIST, .flags = I,
     .offset = offsetof(struct cerb_config, redis.nodes),
     .count_offset = offsetof(struct cerb_config, redis.n_nodes),
     .min = 1, .max = CERB_MAX_ENDPOINTS, .def_str = "127.0.0.1:6379",
     .check = cerb__cfg_check_hostport},
    KEY_INT("redis.min_replicas_ack", redis.min_replicas_ack, I, 0, 0, 16),
    KEY_ENUM("redis.redlock_fence", redis.redlock_fence, I, CERB_REDLOCK_FENCE_QUORUM,
             redlock_fence_enum),

    KEY_STR("zk.hosts", zk.hosts, I, "127.0.0.1:2181",
            cerb__cfg_check_nonempty),
    KEY_STR("zk.root", zk.root, I, "/cerberus/locks", cerb__cfg_check_zk_root),
    KEY_I64("zk.session_timeout_ms", zk.session_timeout_ms, I, 10000, 1000,
            600000),
    KEY_I64("zk.connect_timeout_ms", zk.connect_timeout_ms, I, 2000, 1,
            600000),
    KEY_STR("zk.user", zk.user, I, "", NULL),
    KEY_STR("zk.password", zk.password, I, "", NULL),
    KEY_INT("zk.guard_sessions", zk.guard_sessions, I, 4, 1, 4),

    {.path = "etcd.endpoints", .type = CERB__CFG_STRLIST, .flags = I,
     .offset = offsetof(struct cerb_config, etcd.endpoints),
     .count_offset = offsetof(struct cerb_config, etcd.n_endpoints),
     .min = 1, .max = CERB_MAX_ENDPOINTS, .def_str = "http://127.0.0.1:2379",
     .check = cerb__cfg_check_endpoint},
    KEY_STR("etcd.prefix", etcd.prefix, I, "", NULL),
    KEY_I64("etcd.session_ttl_s", etcd.session_ttl_s, I, 10, 2, 3600),
    KEY_I64("etcd.op_timeout_ms", etcd.op_timeout_ms, I, 1000, 1, 600000),
    KEY_I64("etcd.connect_timeout_ms", etcd.connect_timeout_ms, I, 500, 1,
            600000),
    KEY_STR("etcd.user", etcd.user, I, "", NULL),
    KEY_STR("etcd.password", etcd.password, I, "", NULL),
    KEY_STR("etcd.ca_file", etcd.ca_file, I, "", NULL),
    KEY_STR("etcd.cert_file", etcd.cert_file, I, "", NULL),
    KEY_STR("etcd.key_file", etcd.key_file, I, "", NULL),

    KEY_STR("pg.conninfo", pg.conninfo, I, "host=127.0.0.1 port=5432", NULL),
    KEY_STR("pg.notify_conninfo", pg.notify_conninfo, I, "", NULL),
    KEY_STR("pg.password_file", pg.password_file, I, "", NULL),
    KEY_STR("pg.schema", pg.schema, I, "public", cerb__cfg_check_sql_ident),
    KEY_ENUM("pg.mode", pg.mode, I, CERB_SQL_HYBRID, sql_mode_enum),
    KEY_STR("pg.key", pg.key, I, "dl", cerb__cfg_check_pg_key),
    KEY_INT("pg.pool", pg.pool, I, 8, 2, 1024),
    KEY_I64("pg.connect_timeout_ms", pg.connect_timeout_ms, I, 2000, 1, 600000),
    KEY_I64("pg.op_timeout_ms", pg.op_timeout_ms, I, 1000, 1, 600000),

    KEY_STR("mysql.host", mysql.host, I, "127.0.0.1", cerb__cfg_check_nonempty),
    KEY_INT("mysql.port", mysql.port, I, 3306, 1, 65535),
    KEY_STR("mysql.socket", mysql.socket, I, "", NULL),
    KEY_STR("mysql.user", mysql.user, I, "cerberus", cerb__cfg_check_nonempty),
    KEY_STR("mysql.password_file", mysql.password_file, I, "", NULL),
    KEY_STR("mysql.database", mysql.database, I, "cerberus", cerb__cfg_check_sql_ident),
    KEY_ENUM("mysql.mode", mysql.mode, I, CERB_SQL_HYBRID, sql_mode_enum),
    KEY_STR("mysql.key", mysql.key, I, "dl", cerb__cfg_check_mysql_key),
    KEY_INT("mysql.pool", mysql.pool, I, 8, 2, 1024),
    KEY_I64("mysql.connect_timeout_ms", mysql.connect_timeout_ms, I, 2000, 1, 600000),
    KEY_I64("mysql.op_timeout_ms", mysql.op_timeout_ms, I, 1000, 1, 600000),

    /* A list for the quorum mode to come; one server for now
     * (check_memcached in validate.c). */
    {.path = "memcached.servers", .type = CERB__CFG_STRLIST, .flags = I,
     .offset = offsetof(struct cerb_config, memcached.servers),
     .count_offset = offsetof(struct cerb_config, memcached.n_servers),
     .min = 1, .max = CERB_MAX_ENDPOINTS, .def_str = "127.0.0.1:11211",
     .check = cerb__cfg_check_hostport},
    KEY_STR("memcached.prefix", memcached.prefix, I, "", cerb__cfg_check_mc_prefix),
    KEY_INT("memcached.pool", memcached.pool, I, 8, 1, 1024),
    KEY_I64("memcached.connect_timeout_ms", memcached.connect_timeout_ms, I, 500, 1, 600000),
    KEY_I64("memcached.op_timeout_ms", memcached.op_timeout_ms, I, 500, 1, 600000),
    KEY_BOOL("memcached.allow_evictions", memcached.allow_evictions, I, 0),

    KEY_STR("local.dir", local.dir, I, "", NULL),

    /* The guard: guard.app is part of every record id, so changing it
     * while clients run would let duplicates through (immutable); the
     * rest applies to attempts begun after a reload. keep_ms 0 would keep
     * no duplicate out: check_guard (validate.c) refuses it. */
    KEY_STR("guard.app", guard.app, I, "", NULL),
    KEY_I64("guard.running_ms", guard.running_ms, R, 30000, 100, 86400000),
    KEY_I64("guard.keep_ms", guard.keep_ms, R, 86400000, -1,
            INT64_C(31536000000)),
    KEY_ENUM("guard.on_unavailable", guard.on_unavailable, R,
             CERB_GUARD_REFUSE, guard_policy_enum),
    KEY_I64("guard.max_result", guard.max_result, R, 65536, 0, 268435456),

    /* `cerberus serve`: its sockets are made once (restart to change);
     * the token file is re-read and the limits and windows applied on
     * SIGHUP. */
    {.path = "serve.listen", .type = CERB__CFG_STRLIST, .flags = I,
     .offset = offsetof(struct cerb_config, serve.listen),
     .count_offset = offsetof(struct cerb_config, serve.n_listen),
     .min = 1, .max = CERB_SERVE_MAX_LISTEN_KEYS,
     .def_str = "unix:/run/cerberus/cerberus.sock",
     .check = cerb__cfg_check_listen},
    KEY_STR("serve.token_file", serve.token_file, R, "", NULL),
    KEY_BOOL("serve.allow_remote", serve.allow_remote, I, 0),
    KEY_STR("serve.socket_group", serve.socket_group, I, "", NULL),
    KEY_STR("serve.socket_mode", serve.socket_mode, I, "0660",
            cerb__cfg_check_socket_mode),
    KEY_INT("serve.max_connections", serve.max_connections, I, 512, 1, 65536),
    KEY_INT("serve.max_body", serve.max_body, I, 4096, 256, 1048576),
    KEY_INT("serve.rate_limit", serve.rate_limit, R, 0, 0, 1000000),
    KEY_INT("serve.rate_burst", serve.rate_burst, R, 0, 0, 1000000),
    KEY_INT("serve.idle_timeout_s", serve.idle_timeout_s, I, 60, 0, 86400),
    KEY_I64("serve.drain_ms", serve.drain_ms, R, 5000, 0, 600000),
    KEY_I64("serve.keepalive_ms", serve.keepalive_ms, R, 10000, 100, 86400000),
};

const size_t cerb__cfg_nkeys = sizeof cerb__cfg_keys / sizeof cerb__cfg_keys[0];

_Static_assert(sizeof cerb__cfg_keys / sizeof cerb__cfg_keys[0] <=
                   CERB__CFG_MAX_KEYS,
               "raise CERB__CFG_MAX_KEYS");

int cerb__cfg_key_index(const char *path)
{
    for (size_t i = 0; i < cerb__cfg_nkeys; i++)
        if (strcmp(cerb__cfg_keys[i].path, path) == 0)
            return (int)i;
    return -1;
}

bool cerb__cfg_is_group(const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        const char *p = cerb__cfg_keys[i].path;
        if (strncmp(p, name, n) == 0 && p[n] == '.')
            return true;
    }
    return false;
}

/* ---- field access ---- */

static void *field(const struct cerb__cfg_key *k, struct cerb_config *cfg)
{
    return (char *)cfg + k->offset;
}

static const void *cfield(const struct cerb__cfg_key *k,
                          const struct cerb_config *cfg)
{
    return (const char *)cfg + k->offset;
}

int64_t cerb__cfg_get_int(const struct cerb__cfg_key *k,
                          const struct cerb_config *cfg)
{
    const void *p = cfield(k, cfg);
    /* Enums are stored in whatever the field is; the size tells which. */
    if (k->type == CERB__CFG_BOOL || k->size == sizeof(bool))
        return *(const bool *)p;
    if (k->type == CERB__CFG_INT || k->size == sizeof(int))
        return *(const int *)p;
    return *(const int64_t *)p;
}

void cerb__cfg_set_int(const struct cerb__cfg_key *k, struct cerb_config *cfg,
                       int64_t v)
{
    void *p = field(k, cfg);
    if (k->type == CERB__CFG_BOOL || k->size == sizeof(bool))
        *(bool *)p = v != 0;
    else if (k->type == CERB__CFG_INT || k->size == sizeof(int))
        *(int *)p = (int)v; /* callers range-check first */
    else
        *(int64_t *)p = v;
}

const char *cerb__cfg_get_str(const struct cerb__cfg_key *k,
                              const struct cerb_config *cfg)
{
    if (k->inline_len)
        return (const char *)cfield(k, cfg);
    return *(char *const *)cfield(k, cfg);
}

cerb_status cerb__cfg_set_str(const struct cerb__cfg_key *k,
                              struct cerb_config *cfg, const char *s)
{
    char **pp;
    char *copy;

    if (k->inline_len) {
        snprintf((char *)field(k, cfg), k->inline_len, "%s", s);
        return CERB_OK;
    }
    copy = cerb__strdup(s);
    if (!copy)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    pp = field(k, cfg);
    cerb__free(*pp);
    *pp = copy;
    return CERB_OK;
}

static size_t *list_count(const struct cerb__cfg_key *k,
                          struct cerb_config *cfg)
{
    return (size_t *)(void *)((char *)cfg + k->count_offset);
}

size_t cerb__cfg_list_len(const struct cerb__cfg_key *k,
                          const struct cerb_config *cfg)
{
    return *(const size_t *)(const void *)((const char *)cfg +
                                           k->count_offset);
}

const char *cerb__cfg_list_get(const struct cerb__cfg_key *k,
                               const struct cerb_config *cfg, size_t i)
{
    if (k->inline_len)
        return (const char *)cfield(k, cfg) + i * k->inline_len;
    return ((char *const *)cfield(k, cfg))[i];
}

void cerb__cfg_list_clear(const struct cerb__cfg_key *k,
                          struct cerb_config *cfg)
{
    size_t *n = list_count(k, cfg);
    if (!k->inline_len) {
        char **arr = field(k, cfg);
        for (size_t i = 0; i < *n; i++) {
            cerb__free(arr[i]);
            arr[i] = NULL;
        }
    }
    *n = 0;
}

cerb_status cerb__cfg_list_push(const struct cerb__cfg_key *k,
                                struct cerb_config *cfg, const char *s)
{
    size_t *n = list_count(k, cfg);

    if (*n >= (size_t)k->max) /* callers check the count first */
        return cerb__error_set(CERB_ECONFIG, "%s: too many entries", k->path);
    if (k->inline_len) {
        snprintf((char *)field(k, cfg) + *n * k->inline_len, k->inline_len,
                 "%s", s);
    } else {
        char *copy = cerb__strdup(s);
        if (!copy)
            return cerb__error_set(CERB_ENOMEM, "out of memory");
        ((char **)field(k, cfg))[*n] = copy;
    }
    (*n)++;
    return CERB_OK;
}

/* ---- value checks ---- */

bool cerb__cfg_check_int(const struct cerb__cfg_key *k, int64_t v, char *why,
                         size_t len)
{
    if (k->type == CERB__CFG_ENUM) {
        for (const struct cerb__cfg_enum *e = k->enums; e->name; e++)
            if (e->value == v)
                return true;
        snprintf(why, len, "%s: invalid value %" PRId64, k->path, v);
        return false;
    }
    if (v < k->min || v > k->max) {
        snprintf(why, len, "%s: %" PRId64 " is out of range %" PRId64
                 "..%" PRId64, k->path, v, k->min, k->max);
        return false;
    }
    return true;
}

bool cerb__cfg_check_str(const struct cerb__cfg_key *k, const char *s,
                         char *why, size_t len)
{
    if (k->type == CERB__CFG_ENUM) {
        size_t off;
        for (const struct cerb__cfg_enum *e = k->enums; e->name; e++)
            if (strcmp(e->name, s) == 0)
                return true;
        off = (size_t)snprintf(why, len, "%s: expected one of", k->path);
        for (const struct cerb__cfg_enum *e = k->enums; e->name && off < len;
             e++)
            off += (size_t)snprintf(why + off, len - off, "%s \"%s\"",
                                    e == k->enums ? "" : ",", e->name);
        return false;
    }
    return k->check ? k->check(k, s, why, len) : true;
}

cerb_status cerb__cfg_error_at(const char *file, unsigned line,
                               const char *why)
{
    if (line)
        return cerb__error_set(CERB_ECONFIG, "%s:%u: %s", file, line, why);
    return cerb__error_set(CERB_ECONFIG, "%s: %s", file, why);
}
