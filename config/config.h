/*
 * config.h — the parsed, validated, immutable configuration (DESIGN.md §6).
 *
 * Nothing but config/ parses configuration. A `struct cerb_config` is built
 * whole, validated whole, and never changed afterwards; a reload builds a new
 * one and the client swaps pointers, so a reader holding a snapshot never sees
 * a half-applied file. Strings are owned by the struct and freed with it.
 */
#ifndef CERB_CONFIG_H
#define CERB_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

#define CERB_MAX_ENGINES 8
#define CERB_ENGINE_NAME_MAX 16
#define CERB_MAX_ENDPOINTS 16

struct cerb_lock_config {
    int64_t lease_ms;   /* default 10000, 100 .. 86400000 */
    bool renew;         /* default true */
    bool fair;          /* default true */
};

struct cerb_retry_config {
    int max;                /* default 2, 0 .. 100: retries after the first try */
    int64_t backoff_ms;     /* default 20, 0 .. 60000 */
    int64_t backoff_max_ms; /* default 200, >= backoff_ms, .. 600000 */
};

struct cerb_failover_config {
    int64_t probe_interval_ms;   /* 250, 10 .. 600000 */
    int64_t probe_timeout_ms;    /* 200, 1 .. 600000 */
    int consecutive_failures;    /* 3, 1 .. 1000 */
    int failure_rate;            /* 50 (percent), 1 .. 100 */
    int64_t window_ms;           /* 10000, 100 .. 3600000 */
    int min_calls;               /* 10, 1 .. 1000000 */
    int64_t open_ms;             /* 5000, 10 .. 3600000 */
    int half_open_successes;     /* 3, 1 .. 1000 */
    bool failback_auto;          /* "auto" (true) | "manual" (false) */
    int64_t failback_after_ms;   /* 60000, 0 .. 86400000 */
    int64_t switch_grace_ms;     /* -1 (= old lease + drift), -1 .. 86400000 */
    bool watch_config;           /* true */
    bool switch_claims;          /* false: after `cerberus switch`, claims
                                    on the engines left too (closure.c) */
};

struct cerb_redis_config {
    char *host;                  /* "127.0.0.1" */
    int port;                    /* 6379, 1 .. 65535 */
    char *user;                  /* "" = no ACL user */
    char *password;              /* "" = no AUTH */
    int db;                      /* 0, 0 .. 15 */
    char *prefix;                /* "" */
    int64_t connect_timeout_ms;  /* 500, 1 .. 600000 */
    int64_t op_timeout_ms;       /* 500, 1 .. 600000 */
    int pool_max;                /* 64, 1 .. 1024: connections open on demand */
    int64_t pool_idle_ms;        /* 30000, 100 .. 86400000: idle ones close */
    int mode;                    /* CERB_REDIS_SINGLE (default), _SENTINEL, _CLUSTER,
                                    _REDLOCK */
    size_t n_sentinels;          /* sentinel mode: >= 1 */
    char *sentinels[CERB_MAX_ENDPOINTS]; /* ("127.0.0.1:26379"), "host:port" */
    char *master_name;           /* "mymaster" */
    char *sentinel_password;     /* "" = no AUTH to the sentinels */
    size_t n_nodes;              /* cluster mode (seeds), redlock (masters): >= 1 */
    char *nodes[CERB_MAX_ENDPOINTS]; /* ("127.0.0.1:6379"), "host:port" seeds */
    int min_replicas_ack;        /* 0, 0 .. 16: WAIT for this many replicas */
    int redlock_fence;           /* redlock mode: CERB_REDLOCK_FENCE_QUORUM
                                    (default) or _NONE */
};

enum { CERB_REDIS_SINGLE = 0, CERB_REDIS_SENTINEL = 1, CERB_REDIS_CLUSTER = 2,
       CERB_REDIS_REDLOCK = 3 };
enum { CERB_REDLOCK_FENCE_NONE = 0, CERB_REDLOCK_FENCE_QUORUM = 1 };

struct cerb_zk_config {
    char *hosts;                 /* "127.0.0.1:2181" */
    char *root;                  /* "/cerberus/locks": absolute, no trailing '/' */
    int64_t session_timeout_ms;  /* 10000, 1000 .. 600000 */
    int64_t connect_timeout_ms;  /* 2000, 1 .. 600000 */
    char *user;                  /* "" = no digest auth */
    char *password;              /* "" */
    int guard_sessions;          /* 4, 1 .. 4: sessions the guard may use */
};

struct cerb_etcd_config {
    size_t n_endpoints;                   /* >= 1 */
    char *endpoints[CERB_MAX_ENDPOINTS];  /* ("http://127.0.0.1:2379") */
    char *prefix;                         /* "" */
    int64_t session_ttl_s;                /* 10, 2 .. 3600 */
    int64_t op_timeout_ms;                /* 1000, 1 .. 600000 */
    int64_t connect_timeout_ms;           /* 500, 1 .. 600000 */
    char *user;                           /* "" = no auth */
    char *password;                       /* "" */
    char *ca_file;                        /* "" = system CA store (https) */
    char *cert_file;                      /* "" = no client certificate */
    char *key_file;                       /* "" = no client key */
};

/* The SQL engines (DESIGN.md §4): a session lock and a lease row. */
enum { CERB_SQL_HYBRID = 0, CERB_SQL_LEASE = 1, CERB_SQL_ADVISORY = 2 };

struct cerb_pg_config {
    char *conninfo;              /* "host=127.0.0.1 port=5432": libpq keywords */
    char *notify_conninfo;       /* "" = none; lease mode: a direct session that
                                    LISTENs for releases (waiters wake at once) */
    char *password_file;         /* "" = none (libpq's own: PGPASSFILE, ~/.pgpass) */
    char *schema;                /* "public": where cerberus_lock/_guard live */
    int mode;                    /* CERB_SQL_HYBRID (default), _LEASE, _ADVISORY */
    char *key;                   /* "dl" | "int" | "tooz" | "pals:<app>" */
    int pool;                    /* 8, 2 .. 1024: connections, waiters included */
    int64_t connect_timeout_ms;  /* 2000, 1 .. 600000 */
    int64_t op_timeout_ms;       /* 1000, 1 .. 600000 */
};

struct cerb_mysql_config {
    char *host;                  /* "127.0.0.1" */
    int port;                    /* 3306, 1 .. 65535 */
    char *socket;                /* "" = TCP to host:port */
    char *user;                  /* "cerberus" */
    char *password_file;         /* "" = no password */
    char *database;              /* "cerberus": where cerberus_lock/_guard live */
    int mode;                    /* CERB_SQL_HYBRID (default), _LEASE, _ADVISORY */
    char *key;                   /* "dl" | "raw" */
    int pool;                    /* 8, 2 .. 1024: connections, waiters included */
    int64_t connect_timeout_ms;  /* 2000, 1 .. 600000 */
    int64_t op_timeout_ms;       /* 1000, 1 .. 600000 */
};

/* The memcached engine (DESIGN.md §4): one server, the meta protocol. */
struct cerb_memcached_config {
    size_t n_servers;                     /* 1: one server, no client-side hashing */
    char *servers[CERB_MAX_ENDPOINTS];    /* ("127.0.0.1:11211"), "host:port" */
    char *prefix;                         /* "": before every lock name in its key */
    int pool;                             /* 8, 1 .. 1024: connections open on demand */
    int64_t connect_timeout_ms;           /* 500, 1 .. 600000 */
    int64_t op_timeout_ms;                /* 500, 1 .. 600000 */
    bool allow_evictions;                 /* false: a server with evictions on is refused */
};

struct cerb_local_config {
    char *dir;   /* "" = in-process only; else flock files under dir */
};

/* The idempotency guard (DESIGN.md §11). */
struct cerb_guard_config {
    char *app;              /* "" — hashed into every record id (immutable) */
    int64_t running_ms;     /* 30000, 100 .. 86400000: an attempt's claim */
    int64_t keep_ms;        /* 86400000, -1 (forever) or 1 .. 31536000000 */
    int on_unavailable;     /* CERB_GUARD_REFUSE (0, "refuse") | ALLOW (1) */
    int64_t max_result;     /* 65536, 0 .. 268435456 bytes */
};

/* `cerberus serve` (DESIGN.md §15). The library opens no socket: these
 * keys are read by the serve command, and are in the table so that one
 * file configures both and its errors read `file:line: message`. */
#define CERB_SERVE_MAX_LISTEN_KEYS 8
struct cerb_serve_config {
    size_t n_listen;                          /* >= 1 */
    char *listen[CERB_SERVE_MAX_LISTEN_KEYS]; /* ("unix:/run/cerberus/cerberus.sock") */
    char *token_file;       /* "" = none: no TCP */
    bool allow_remote;      /* false: TCP on loopback addresses only */
    char *socket_group;     /* "" = the server's own group */
    char *socket_mode;      /* "0660": octal, owner read and write */
    int max_connections;    /* 512, 1 .. 65536: per listening socket */
    int max_body;           /* 4096, 256 .. 1048576 bytes */
    int rate_limit;         /* 0 (off), 0 .. 1000000 requests/s per socket */
    int rate_burst;         /* 0 (= rate_limit), 0 .. 1000000 */
    int idle_timeout_s;     /* 60, 0 (never) .. 86400 */
    int64_t drain_ms;       /* 5000, 0 .. 600000 */
    int64_t keepalive_ms;   /* 10000, 100 .. 86400000 */
};

struct cerb_config {
    char *path;                 /* file it came from; NULL for text/defaults */
    size_t n_engines;           /* >= 1 */
    char engines[CERB_MAX_ENGINES][CERB_ENGINE_NAME_MAX]; /* config order */
    char active[CERB_ENGINE_NAME_MAX];  /* "auto" or one of engines[] */
    int64_t epoch;              /* 1, 0 .. 65535 (high 16 bits of fences) */
    struct cerb_lock_config lock;
    struct cerb_retry_config retry;
    struct cerb_failover_config failover;
    struct cerb_redis_config redis;
    struct cerb_zk_config zk;
    struct cerb_etcd_config etcd;
    struct cerb_pg_config pg;
    struct cerb_mysql_config mysql;
    struct cerb_memcached_config memcached;
    struct cerb_local_config local;
    struct cerb_guard_config guard;
    struct cerb_serve_config serve;
};

/*
 * Parse and validate. On failure *out is NULL, the status is CERB_ECONFIG
 * (or CERB_ENOMEM) and cerb_last_error() reads `file:line: message`, where
 * file is the path, or "config" for text. An unknown engine name lists the
 * engines this library was built with.
 */
cerb_status cerb__config_from_file(const char *path, struct cerb_config **out);
cerb_status cerb__config_from_string(const char *text,
                                     struct cerb_config **out);
/* All defaults, with engines = ("local"). */
cerb_status cerb__config_defaults(struct cerb_config **out);
/* NULL is a no-op. */
void cerb__config_free(struct cerb_config *cfg);

/*
 * Open a client on an already parsed configuration (core/client.c), which
 * the client then owns (freed on failure too). For in-tree tools that
 * adjust a file's settings before opening — cerberus-bench pins each
 * client to the engine under test with `active` this way: a client pinned
 * from the start has switched from nothing, so no engine is gated.
 */
cerb_status cerb__client_open_config(cerb_client **out, struct cerb_config *cfg);

/* Detach a parsed configuration from its file: the client opened on it
 * neither watches nor reloads the file, and counts it as settled (no
 * `cerberus switch` to wait for). cerberus-bench's pinned clients. */
void cerb__config_forget_path(struct cerb_config *cfg);

/*
 * Reload check: CERB_OK when `next` differs from `cur` only in keys marked
 * reloadable (lock, retry, failover, active, epoch,
 * guard except guard.app); otherwise CERB_ECONFIG
 * naming the first immutable key that changed.
 */
cerb_status cerb__config_reloadable(const struct cerb_config *cur,
                                    const struct cerb_config *next);

/* Index of engine `name` in cfg->engines, or -1. */
int cerb__config_engine_index(const struct cerb_config *cfg, const char *name);

/*
 * A password kept in a file (pg.password_file, mysql.password_file): its
 * first line, cerb__malloc'd into *out; NULL and CERB_OK for an empty or
 * NULL path. CERB_ECONFIG naming `what` and the file when it cannot be
 * read. Free it with cerb__config_free_secret, which wipes it first.
 */
cerb_status cerb__config_read_secret(const char *what, const char *path, char **out);
void cerb__config_free_secret(char *s);

#endif /* CERB_CONFIG_H */
