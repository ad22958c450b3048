/*
 * cmd_holders.c — `cerberus [-c FILE] holders NAME`: who holds lock NAME on
 * each configured engine, and who waits for it, in queue order.
 *
 * No engine operation answers "who holds this", so the command reads the
 * servers itself, engine by engine, through the wire layouts of DESIGN.md
 * §4, read-only and with the configuration's timeouts: Redis here, ZooKeeper
 * in holders_zk.c, etcd in holders_etcd.c. The name is first checked with
 * each engine's own rule (a '/' is fine on Redis, not on zk or etcd).
 *
 * On Redis (engine_redis/redis_scripts.h) the lock of NAME is the string
 * key K = redis.prefix + NAME holding the owner token with a PX lease;
 * the helper keys are K in braces, the byte 0x1f and a suffix (no lock name
 * can contain that byte): `{K}\x1ffence` holds the last grant's fence,
 * `{K}\x1fq` lists waiter tokens in order and `{K}\x1fd` maps each waiter
 * to "deadline_ms lease_ms" in server time, a waiter whose deadline passed
 * being dead. One MULTI/EXEC reads all of it and the server's TIME at
 * once, so the answer is a consistent snapshot and the command never
 * writes. A key without an expiry (a redis-py Lock with no
 * timeout) is shown as held with no expiry. The in-process "local" engine
 * cannot be seen from another process.
 */
#include "internal_posix.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "cli.h"
#include "config.h"
#include "engine.h"

const char cerb__cli_holders_usage[] =
    "Usage: cerberus [-c FILE] holders NAME\n"
    "\n"
    "Show who holds lock NAME on every configured engine, in configuration\n"
    "order: the owner, the time its lease has left where the engine has one,\n"
    "the engine's fencing counter (the low 48 bits of the holder's fencing\n"
    "token), and the waiters in queue order. Reads the servers directly,\n"
    "with the configured timeouts, and changes nothing.\n"
    "\n"
    "  redis: held by 3f9c...e1, 8412 ms left, fence 17\n"
    "  redis: waiting: 77ab...02, 01cd...9e\n"
    "  zk: held by _c_0b6e...-lock-0000000004 (session 0x1000a2f3c0001), fence 388\n"
    "  zk: waiting: _c_91d2...-lock-0000000005 (session 0x1000a2f3c0002)\n"
    "  etcd: held by 694d7a1b2c3d4e5f, 7 s left (TTL 10 s), fence 1207\n"
    "  etcd: waiting: 694d7a1b2c3d4e61\n"
    "  local: in-process, not visible from here\n"
    "\n"
    "redis: the owner token and the key's PTTL; the fence is {KEY}\\x1ffence.\n"
    "zk: the lock node (Curator's _c_<uuid>-lock-<seq> under zk.root/NAME)\n"
    "  and the session it lives with; the fence is the node's czxid plus\n"
    "  the fence offset in the node fence-offset next to zk.root.\n"
    "etcd: the key under etcd.prefix NAME/ (the contender's lease in hex),\n"
    "  the lease's time to live; the fence is the key's create revision\n"
    "  plus the fence offset the key holds.\n"
    "A server that cannot be reached prints \"ENGINE: unreachable\", with\n"
    "the reason on stderr; the other engines are still shown.\n"
    "\n"
    "Exit status: 0 ok, 69 a server could not be asked, 78 configuration\n"
    "error, 64 usage (or NAME is not a valid lock name on some engine).\n";

static struct timeval ms_to_tv(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

void cerb__cli_print_bytes(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            putchar(c);
        else
            printf("\\x%02x", c);
    }
}

/* A command error in @r (NULL or REDIS_REPLY_ERROR) as text for messages. */
static const char *reply_error(const redisContext *ctx, const redisReply *r)
{
    if (!r)
        return ctx->errstr[0] ? ctx->errstr : "no reply";
    if (r->type == REDIS_REPLY_ERROR)
        return r->str;
    return "unexpected reply";
}

static redisContext *redis_connect(const struct cerb_redis_config *rc, char *err,
                                   size_t len)
{
    redisContext *ctx = redisConnectWithTimeout(rc->host, rc->port,
                                                ms_to_tv(rc->connect_timeout_ms));
    redisReply *r;

    if (!ctx) {
        snprintf(err, len, "out of memory");
        return NULL;
    }
    if (ctx->err) {
        snprintf(err, len, "%s:%d: %s", rc->host, rc->port, ctx->errstr);
        redisFree(ctx);
        return NULL;
    }
    /* hiredis 0.14 bounds only the connect; bound every reply too. */
    redisSetTimeout(ctx, ms_to_tv(rc->op_timeout_ms));
    if (rc->password && rc->password[0]) {
        if (rc->user && rc->user[0])
            r = redisCommand(ctx, "AUTH %s %s", rc->user, rc->password);
        else
            r = redisCommand(ctx, "AUTH %s", rc->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, len, "%s:%d: AUTH: %s", rc->host, rc->port, reply_error(ctx, r));
            freeReplyObject(r);
            redisFree(ctx);
            return NULL;
        }
        freeReplyObject(r);
    }
    if (rc->db != 0) {
        r = redisCommand(ctx, "SELECT %d", rc->db);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, len, "%s:%d: SELECT %d: %s", rc->host, rc->port, rc->db,
                     reply_error(ctx, r));
            freeReplyObject(r);
            redisFree(ctx);
            return NULL;
        }
        freeReplyObject(r);
    }
    return ctx;
}

/* The deadline (server ms) a `{K}:d` entry gives a waiter; -1 if unreadable. */
static int64_t waiter_deadline(const redisReply *hash, const redisReply *tok)
{
    /* HGETALL answers field, value, field, value, ... */
    for (size_t i = 0; i + 1 < hash->elements; i += 2) {
        const redisReply *f = hash->element[i], *v = hash->element[i + 1];
        if (f->type == REDIS_REPLY_STRING && f->len == tok->len &&
            memcmp(f->str, tok->str, tok->len) == 0 && v->type == REDIS_REPLY_STRING)
            return strtoll(v->str, NULL, 10);
    }
    return -1;
}

/* a b c, in one malloc'd string (NULL when out of memory). */
static char *concat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(la + lb + lc + 1);

    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb);
        memcpy(s + la + lb, c, lc + 1);
    }
    return s;
}

enum { Q_GET, Q_PTTL, Q_FENCE, Q_QUEUE, Q_DATA, Q_TIME, Q_N };

/* Prints the Redis lines for @name; returns an exit code. */
static int holders_redis(const struct cerb_redis_config *rc, const char *name)
{
    char err[512], *k = NULL, *f = NULL, *q = NULL, *d = NULL;
    const char *prefix = rc->prefix ? rc->prefix : "";
    redisContext *ctx;
    redisReply *r = NULL, *x;
    int rc_exit = CLI_EXIT_OK;

    /* Cluster: read the master of K's slot (holders_cluster.c). */
    struct cerb_redis_config crc;
    char chost[256], *base = NULL;
    k = concat3("", prefix, name);
    if (k && rc->mode == CERB_REDIS_CLUSTER) {
        if (cerb__cli_redis_cluster_target(rc, k, &crc, chost, sizeof chost, &base, err,
                                           sizeof err) != 0) {
            printf("redis: unreachable\n");
            cerb__cli_error("redis: cluster: %s", err);
            free(k);
            return CLI_EXIT_UNAVAILABLE;
        }
        rc = &crc;
    } else if (k) {
        base = concat3("{", k, "}");
    }
    ctx = redis_connect(rc, err, sizeof err);
    if (!ctx) {
        printf("redis: unreachable\n");
        cerb__cli_error("redis: unreachable: %s", err);
        free(k);
        free(base);
        return CLI_EXIT_UNAVAILABLE;
    }
    /* "\x1f" apart from the letters, or C reads one longer hex escape. */
    f = base ? concat3(base, "\x1f" "fence", "") : NULL;
    q = base ? concat3(base, "\x1f" "q", "") : NULL;
    d = base ? concat3(base, "\x1f" "d", "") : NULL;
    free(base);
    if (!k || !f || !q || !d) {
        cerb__cli_error("out of memory");
        rc_exit = CLI_EXIT_OSERR;
        goto out;
    }
    /* One transaction: a consistent snapshot, and one round trip. */
    redisAppendCommand(ctx, "MULTI");
    redisAppendCommand(ctx, "GET %s", k);
    redisAppendCommand(ctx, "PTTL %s", k);
    redisAppendCommand(ctx, "GET %s", f);
    redisAppendCommand(ctx, "LRANGE %s 0 -1", q);
    redisAppendCommand(ctx, "HGETALL %s", d);
    redisAppendCommand(ctx, "TIME");
    redisAppendCommand(ctx, "EXEC");
    for (int i = 0; i < Q_N + 2; i++) {
        void *reply = NULL;
        freeReplyObject(r);
        r = NULL;
        if (redisGetReply(ctx, &reply) != REDIS_OK) {
            printf("redis: unreachable\n");
            cerb__cli_error("redis: unreachable: %s:%d: %s", rc->host, rc->port,
                            reply_error(ctx, NULL));
            rc_exit = CLI_EXIT_UNAVAILABLE;
            goto out;
        }
        r = reply;
        /* MULTI answers OK and each command QUEUED; EXEC answers them all. */
        if (i <= Q_N && r->type == REDIS_REPLY_ERROR) {
            printf("redis: error\n");
            cerb__cli_error("redis: %s", r->str);
            rc_exit = CLI_EXIT_UNAVAILABLE;
            goto out;
        }
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != Q_N) {
        printf("redis: error\n");
        cerb__cli_error("redis: EXEC: %s", reply_error(ctx, r));
        rc_exit = CLI_EXIT_UNAVAILABLE;
        goto out;
    }
    x = r->element[Q_GET];
    if (x->type == REDIS_REPLY_ERROR) {
        /* WRONGTYPE: the name is some other data, not a lock. */
        printf("redis: key \"%s\" is not a lock: %s\n", k, x->str);
        goto out;
    }
    if (x->type != REDIS_REPLY_STRING) {
        printf("redis: free\n");
    } else {
        const redisReply *ttl = r->element[Q_PTTL], *fence = r->element[Q_FENCE];
        printf("redis: held by ");
        cerb__cli_print_bytes(x->str, x->len);
        if (ttl->type == REDIS_REPLY_INTEGER && ttl->integer >= 0)
            printf(", %lld ms left", ttl->integer);
        else
            printf(", no expiry");
        if (fence->type == REDIS_REPLY_STRING)
            printf(", fence %s", fence->str);
        printf("\n");
    }
    /* Waiters: the queue in order, those whose deadline has not passed. */
    const redisReply *queue = r->element[Q_QUEUE], *data = r->element[Q_DATA],
                     *tm = r->element[Q_TIME];
    if (queue->type == REDIS_REPLY_ARRAY && queue->elements > 0 &&
        data->type == REDIS_REPLY_ARRAY && tm->type == REDIS_REPLY_ARRAY &&
        tm->elements == 2 && tm->element[0]->type == REDIS_REPLY_STRING &&
        tm->element[1]->type == REDIS_REPLY_STRING) {
        int64_t now = strtoll(tm->element[0]->str, NULL, 10) * 1000 +
                      strtoll(tm->element[1]->str, NULL, 10) / 1000;
        int shown = 0;
        for (size_t i = 0; i < queue->elements; i++) {
            const redisReply *tok = queue->element[i];
            if (tok->type != REDIS_REPLY_STRING || waiter_deadline(data, tok) < now)
                continue;
            printf(shown++ ? ", " : "redis: waiting: ");
            cerb__cli_print_bytes(tok->str, tok->len);
        }
        if (shown)
            printf("\n");
    }
out:
    freeReplyObject(r);
    free(k);
    free(f);
    free(q);
    free(d);
    redisFree(ctx);
    return rc_exit;
}

/* `holders [--] NAME`: -1 to go on with *name, or the exit code (printed). */
static int parse_args(int argc, char **argv, const char **name)
{
    for (int i = 1; i < argc; i++) {
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_holders_usage, stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--") == 0 && i + 1 < argc) {
            if (*name || i + 2 != argc)
                return cerb__cli_usage_error("holders", "one NAME");
            *name = argv[i + 1];
            break;
        }
        if (argv[i][0] == '-')
            return cerb__cli_usage_error("holders", "unknown option '%s'", argv[i]);
        if (*name)
            return cerb__cli_usage_error("holders", "one NAME");
        *name = argv[i];
    }
    if (!*name)
        return cerb__cli_usage_error("holders", "NAME is missing");
    if (!cerb__cli_name_ok(*name))
        return cerb__cli_usage_error("holders", "bad lock name (1-255 bytes, no "
                                                "control characters)");
    return -1;
}

int cerb__cli_holders_parse(int argc, char **argv)
{
    const char *name = NULL;
    return parse_args(argc, argv, &name);
}

int cerb__cli_holders(const struct cerb__cli *cli, int argc, char **argv)
{
    const char *name = NULL;
    struct cerb_config *cfg = NULL;
    cerb_status st;
    int rc = CLI_EXIT_OK;

    rc = parse_args(argc, argv, &name);
    if (rc >= 0)
        return rc;
    rc = CLI_EXIT_OK;
    st = cli->config_path ? cerb__config_from_file(cli->config_path, &cfg)
                          : cerb__config_defaults(&cfg);
    if (st != CERB_OK) {
        cerb__cli_error("%s", cerb_last_error());
        return cerb__cli_exit_code(st);
    }
    for (size_t i = 0; i < cfg->n_engines; i++) {
        const char *e = cfg->engines[i];
        const struct cerb_engine_ops *ops = cerb__engine_find(e);
        int r = CLI_EXIT_OK;
        fflush(stdout);
        if (ops && cerb__engine_check_name(ops, name) != CERB_OK) {
            /* Shown, not fatal: the name may still be fine elsewhere. */
            const char *why = cerb_last_error();
            bool named = strncmp(why, e, strlen(e)) == 0; /* "zk: ..." */
            printf("%s: not a valid lock name here\n", e);
            cerb__cli_error("%s%s%s", named ? "" : e, named ? "" : ": ", why);
            r = CLI_EXIT_USAGE;
        } else if (strcmp(e, "redis") == 0) {
            r = holders_redis(&cfg->redis, name);
#ifdef CERB_CLI_WITH_ZK
        } else if (strcmp(e, "zk") == 0) {
            r = cerb__cli_holders_zk(&cfg->zk, name, cli->verbose);
#endif
#ifdef CERB_CLI_WITH_ETCD
        } else if (strcmp(e, "etcd") == 0) {
            r = cerb__cli_holders_etcd(&cfg->etcd, name, cli->verbose);
#endif
        } else if (strcmp(e, "local") == 0) {
            printf("local: in-process, not visible from here\n");
        } else {
            printf("%s: not supported by this build\n", e);
        }
        fflush(stdout);
        if (r != CLI_EXIT_OK && rc == CLI_EXIT_OK)
            rc = r;
    }
    cerb__config_free(cfg);
    return rc;
}
