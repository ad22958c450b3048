/*
 * cmd_holders.c — `cerberus [-c FILE] holders NAME`: who holds lock NAME on
 * each configured engine, and who waits for it.
 *
 * No engine operation answers "who holds this" yet, so the command reads
 * the servers itself, engine by engine, through the wire layout of
 * DESIGN.md §4. On Redis (engine_redis/redis_scripts.h) the lock of NAME is
 * the string key K = redis.prefix + NAME holding the owner token with a PX
 * lease; `{K}:fence` counts grants, `{K}:q` lists waiter tokens in order and
 * `{K}:d` maps each waiter to "deadline_ms lease_ms" in server time, a
 * waiter whose deadline passed being dead. One MULTI/EXEC reads all of it
 * and the server's TIME at once, so the answer is a consistent snapshot and
 * the command never writes. A key without an expiry (a redis-py Lock with no
 * timeout) is shown as held with no expiry. Other engines print "not
 * supported yet" until they grow the same reader.
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

const char cerb__cli_holders_usage[] =
    "Usage: cerberus [-c FILE] holders NAME\n"
    "\n"
    "Show who holds lock NAME on every configured engine: the owner token,\n"
    "the lease left, the engine's grant counter (the low 48 bits of the\n"
    "fencing token), and the tokens of live waiters in queue order. Reads\n"
    "the servers directly and changes nothing.\n"
    "\n"
    "  redis: held by 3f9c...e1, 8412 ms left, fence 17\n"
    "  redis: waiting: 77ab...02, 01cd...9e\n"
    "  redis: free\n"
    "\n"
    "Supported today: redis. Other engines print \"not supported yet\".\n"
    "\n"
    "Exit status: 0 ok, 69 a server could not be asked, 78 configuration\n"
    "error, 64 usage.\n";

static struct timeval ms_to_tv(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

/* Prints @s with bytes that are not printable ASCII as \xNN. */
static void print_token(const char *s, size_t n)
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

    ctx = redis_connect(rc, err, sizeof err);
    if (!ctx) {
        printf("redis: unreachable\n");
        cerb__cli_error("redis: %s", err);
        return CLI_EXIT_UNAVAILABLE;
    }
    k = concat3("", prefix, name);
    f = k ? concat3("{", k, "}:fence") : NULL;
    q = k ? concat3("{", k, "}:q") : NULL;
    d = k ? concat3("{", k, "}:d") : NULL;
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
            cerb__cli_error("redis: %s:%d: %s", rc->host, rc->port, reply_error(ctx, NULL));
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
        print_token(x->str, x->len);
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
            print_token(tok->str, tok->len);
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

int cerb__cli_holders(const struct cerb__cli *cli, int argc, char **argv)
{
    const char *name = NULL;
    struct cerb_config *cfg = NULL;
    cerb_status st;
    int rc = CLI_EXIT_OK;

    for (int i = 1; i < argc; i++) {
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_holders_usage, stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--") == 0 && i + 1 < argc) {
            if (name || i + 2 != argc)
                return cerb__cli_usage_error("holders", "one NAME");
            name = argv[i + 1];
            break;
        }
        if (argv[i][0] == '-')
            return cerb__cli_usage_error("holders", "unknown option '%s'", argv[i]);
        if (name)
            return cerb__cli_usage_error("holders", "one NAME");
        name = argv[i];
    }
    if (!name)
        return cerb__cli_usage_error("holders", "NAME is missing");
    if (!cerb__cli_name_ok(name))
        return cerb__cli_usage_error("holders", "bad lock name (1-255 bytes, no "
                                                "control characters)");
    st = cli->config_path ? cerb__config_from_file(cli->config_path, &cfg)
                          : cerb__config_defaults(&cfg);
    if (st != CERB_OK) {
        cerb__cli_error("%s", cerb_last_error());
        return cerb__cli_exit_code(st);
    }
    for (size_t i = 0; i < cfg->n_engines; i++) {
        int r;
        if (strcmp(cfg->engines[i], "redis") == 0) {
            fflush(stdout);
            r = holders_redis(&cfg->redis, name);
        } else {
            printf("%s: not supported yet\n", cfg->engines[i]);
            r = CLI_EXIT_OK;
        }
        if (r != CLI_EXIT_OK && rc == CLI_EXIT_OK)
            rc = r;
    }
    cerb__config_free(cfg);
    return rc;
}
