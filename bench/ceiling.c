/*
 * ceiling.c — the raw ceilings: for each engine, the fewest server commands
 * a lock needs, sent over a bare client connection with no library logic,
 * so the bench can say what fraction of the server's speed Cerberus keeps.
 *
 * Redis: one hiredis context per thread (contexts are not thread-safe),
 * connected with redisConnectWithTimeout and given redisSetTimeout at once
 * (hiredis 0.14 bounds only the connect otherwise), then AUTH and SELECT as
 * configured. A cycle is the redis-py-compatible protocol reduced to its two
 * round trips: `SET name token NX PX 10000` and EVALSHA of the
 * compare-and-delete script, which is loaded once per connection with SCRIPT
 * LOAD (and again on NOSCRIPT, should the server lose its script cache).
 * The owner token is fixed per thread: generating a fresh random one is
 * library work, which the ceiling leaves out on purpose. Against a Redis
 * Cluster a session follows MOVED to the node that owns its name's slot. The round trip for
 * the hand-off scenario is PING on such a context.
 *
 * The other engines' ceilings are in files of their own (ceiling_zk.c,
 * ceiling_etcd.c, ceiling_pg.c; Redlock's over N masters in
 * ceiling_redlock.c), listed in the table below. Engines without
 * a ceiling (local: there is no server) are reported as "n/a".
 */
#include <hiredis/hiredis.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "scenarios.h"

/* The release half of the protocol: delete only while the value is ours. */
static const char release_script[] =
    "if redis.call('get',KEYS[1]) == ARGV[1] then "
    "return redis.call('del',KEYS[1]) else return 0 end";

struct redis_sess {
    redisContext *ctx;
    char sha[41];
    const struct bench_redis_addr *a;
};

/* Describe a NULL reply (I/O or protocol failure) or an error reply. */
static void redis_err(struct redis_sess *s, redisReply *r, const char *what,
                      char *err, size_t errlen)
{
    if (!r)
        snprintf(err, errlen, "redis %s: %s", what,
                 s->ctx->errstr[0] ? s->ctx->errstr : "connection failed");
    else if (r->type == REDIS_REPLY_ERROR)
        snprintf(err, errlen, "redis %s: %s", what, r->str);
    else
        snprintf(err, errlen, "redis %s: unexpected reply type %d", what,
                 r->type);
}

static int redis_load(struct redis_sess *s, char *err, size_t errlen)
{
    redisReply *r = redisCommand(s->ctx, "SCRIPT LOAD %s", release_script);
    if (!r || r->type != REDIS_REPLY_STRING || r->len != 40) {
        redis_err(s, r, "SCRIPT LOAD", err, errlen);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    memcpy(s->sha, r->str, 40);
    s->sha[40] = '\0';
    freeReplyObject(r);
    return 0;
}

void bench_redis_close(void *p)
{
    struct redis_sess *s = p;
    if (!s)
        return;
    if (s->ctx)
        redisFree(s->ctx);
    free(s);
}

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* Connect s to host:port (timeouts, AUTH, SELECT, the release script). */
static int sess_connect(struct redis_sess *s, const char *host, int port, char *err,
                        size_t errlen)
{
    const struct bench_redis_addr *a = s->a;
    redisReply *r = NULL;

    s->ctx = redisConnectWithTimeout(host, port, tv_ms(a->connect_timeout_ms));
    if (!s->ctx || s->ctx->err) {
        snprintf(err, errlen, "redis at %s:%d: %s", host, port,
                 s->ctx ? s->ctx->errstr : "cannot allocate a context");
        goto fail;
    }
    if (redisSetTimeout(s->ctx, tv_ms(a->op_timeout_ms)) != REDIS_OK) {
        snprintf(err, errlen, "redis at %s:%d: cannot set the timeout: %s",
                 host, port, s->ctx->errstr);
        goto fail;
    }
    if (a->password && a->password[0]) {
        if (a->user && a->user[0])
            r = redisCommand(s->ctx, "AUTH %s %s", a->user, a->password);
        else
            r = redisCommand(s->ctx, "AUTH %s", a->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            redis_err(s, r, "AUTH", err, errlen);
            goto fail;
        }
        freeReplyObject(r);
        r = NULL;
    }
    if (a->db != 0) {
        r = redisCommand(s->ctx, "SELECT %d", a->db);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            redis_err(s, r, "SELECT", err, errlen);
            goto fail;
        }
        freeReplyObject(r);
        r = NULL;
    }
    return redis_load(s, err, errlen);

fail:
    if (r)
        freeReplyObject(r);
    return -1;
}

/*
 * Redis Cluster: the key lives on another node ("MOVED slot host:port").
 * The ceiling talks to the node that owns the slot, as the library does:
 * reconnect there (a thread's name is fixed, so once per thread). True when
 * r was a MOVED answer and s is now connected to its node.
 */
static bool follow_moved(struct redis_sess *s, const redisReply *r, char *err, size_t errlen)
{
    char host[256];
    int port;
    if (!r || r->type != REDIS_REPLY_ERROR || strncmp(r->str, "MOVED ", 6) != 0)
        return false;
    const char *sp = strchr(r->str + 6, ' ');
    const char *colon = sp ? strrchr(sp, ':') : NULL;
    if (!colon || (size_t)(colon - sp - 1) >= sizeof host)
        return false;
    memcpy(host, sp + 1, (size_t)(colon - sp - 1));
    host[colon - sp - 1] = '\0';
    port = atoi(colon + 1);
    redisFree(s->ctx);
    s->ctx = NULL;
    return sess_connect(s, host, port, err, errlen) == 0;
}

void *bench_redis_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct redis_sess *s = calloc(1, sizeof *s);

    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->a = &e->redis;
    if (sess_connect(s, e->redis.host, e->redis.port, err, errlen) != 0) {
        bench_redis_close(s);
        return NULL;
    }
    return s;
}

redisContext *bench_redis_context(void *p)
{
    return ((struct redis_sess *)p)->ctx;
}

int bench_redis_try(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct redis_sess *s = p;
    redisReply *r = redisCommand(s->ctx, "SET %s %s NX PX 10000", name, token);
    int got;

    if (follow_moved(s, r, err, errlen)) {
        freeReplyObject(r);
        r = redisCommand(s->ctx, "SET %s %s NX PX 10000", name, token);
    }

    if (r && r->type == REDIS_REPLY_STATUS)
        got = 1;
    else if (r && r->type == REDIS_REPLY_NIL)
        got = 0;
    else {
        redis_err(s, r, "SET NX PX", err, errlen);
        got = -1;
    }
    if (r)
        freeReplyObject(r);
    return got;
}

int bench_redis_release(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct redis_sess *s = p;
    redisReply *r;

    for (int attempt = 0;; attempt++) {
        r = redisCommand(s->ctx, "EVALSHA %s 1 %s %s", s->sha, name, token);
        /* The server lost its script cache (restart, SCRIPT FLUSH). */
        if (r && r->type == REDIS_REPLY_ERROR && attempt == 0 &&
            strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            if (redis_load(s, err, errlen) != 0)
                return -1;
            continue;
        }
        if (attempt == 0 && follow_moved(s, r, err, errlen)) {
            freeReplyObject(r);
            continue;
        }
        break;
    }
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1) {
        if (r && r->type == REDIS_REPLY_INTEGER)
            snprintf(err, errlen, "redis release of \"%s\": value was not ours",
                     name);
        else
            redis_err(s, r, "EVALSHA release", err, errlen);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    return 0;
}

/* One uncontended cycle: the name is ours alone, so busy is an error. */
static int redis_cycle(void *p, const char *name, const char *token,
                       char *err, size_t errlen)
{
    int got = bench_redis_try(p, name, token, err, errlen);
    if (got == 0)
        snprintf(err, errlen, "redis SET NX: key \"%s\" already exists", name);
    return got == 1 ? bench_redis_release(p, name, token, err, errlen) : -1;
}

static int redis_round_trip(void *p, char *err, size_t errlen)
{
    struct redis_sess *s = p;
    redisReply *r = redisCommand(s->ctx, "PING");
    if (!r || r->type != REDIS_REPLY_STATUS) {
        redis_err(s, r, "PING", err, errlen);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    freeReplyObject(r);
    return 0;
}

static const struct bench_ceiling redis_ceiling = {
    "redis", bench_redis_open, redis_cycle, redis_round_trip, bench_redis_close,
};

static const struct bench_ceiling *const ceilings[] = {
    &redis_ceiling,
    &bench_ceiling_redlock,
#ifdef CERB_WITH_ZK
    &bench_ceiling_zk,
#endif
#ifdef CERB_WITH_ETCD
    &bench_ceiling_etcd,
#endif
#ifdef CERB_WITH_PG
    &bench_ceiling_pg,
#endif
#ifdef CERB_WITH_MYSQL
    &bench_ceiling_mysql,
#endif
#ifdef CERB_WITH_MEMCACHED
    &bench_ceiling_memcached, /* ms ... ME c + md ... C<cas> */
#endif
};

const char *bench_engine_label(const struct bench_engine *e)
{
    if (strcmp(e->name, "redis") == 0 && e->cfg && e->cfg->redis.mode == CERB_REDIS_REDLOCK)
        return "redlock";
    return e->name;
}

const struct bench_ceiling *bench_ceiling_find(const char *engine)
{
    for (size_t i = 0; i < sizeof ceilings / sizeof ceilings[0]; i++)
        if (strcmp(ceilings[i]->engine, engine) == 0)
            return ceilings[i];
    return NULL;
}

int bench_redis_sentinel_master(char *const *sentinels, size_t n, const char *master,
                                const char *password, int64_t timeout_ms, char **host,
                                int *port)
{
    for (size_t i = 0; i < n; i++) {
        char sh[256];
        const char *colon = strrchr(sentinels[i], ':');
        if (!colon || (size_t)(colon - sentinels[i]) >= sizeof sh)
            continue;
        memcpy(sh, sentinels[i], (size_t)(colon - sentinels[i]));
        sh[colon - sentinels[i]] = '\0';
        redisContext *c = redisConnectWithTimeout(sh, atoi(colon + 1), tv_ms(timeout_ms));
        if (!c || c->err) {
            if (c)
                redisFree(c);
            continue;
        }
        redisSetTimeout(c, tv_ms(timeout_ms));
        redisReply *r = NULL;
        if (password && password[0]) {
            r = redisCommand(c, "AUTH %s", password);
            if (r)
                freeReplyObject(r);
        }
        r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", master);
        int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                 r->element[0]->type == REDIS_REPLY_STRING &&
                 r->element[1]->type == REDIS_REPLY_STRING;
        if (ok) {
            *host = strdup(r->element[0]->str);
            *port = atoi(r->element[1]->str);
            ok = *host != NULL;
        }
        if (r)
            freeReplyObject(r);
        redisFree(c);
        if (ok)
            return 0;
    }
    return -1;
}

void bench_redis_addr_free(struct bench_redis_addr *a)
{
    free(a->host);
    free(a->user);
    free(a->password);
    memset(a, 0, sizeof *a);
}

int bench_redis_addr_init(struct bench_redis_addr *a, const struct cerb_config *cfg)
{
    const struct cerb_redis_config *rc = &cfg->redis;

    memset(a, 0, sizeof *a);
    a->host = strdup(rc->host ? rc->host : "");
    a->port = rc->port;
    /* Sentinel: the master the first sentinel that answers names. When none
     * answers, the configured host stays and the connection fails with a
     * message naming it. */
    if (rc->mode == CERB_REDIS_SENTINEL) {
        char *h = NULL;
        int p = 0;
        if (bench_redis_sentinel_master(rc->sentinels, rc->n_sentinels, rc->master_name,
                                        rc->sentinel_password, rc->connect_timeout_ms, &h,
                                        &p) == 0) {
            free(a->host);
            a->host = h;
            a->port = p;
        }
    }
    /* Cluster: the first seed; sessions follow MOVED from there. */
    if (rc->mode == CERB_REDIS_CLUSTER && rc->n_nodes > 0) {
        const char *seed = rc->nodes[0], *colon = strrchr(seed, ':');
        if (colon && colon > seed) {
            free(a->host);
            a->host = strndup(seed, (size_t)(colon - seed));
            a->port = atoi(colon + 1);
        }
    }
    a->user = strdup(rc->user ? rc->user : "");
    a->password = strdup(rc->password ? rc->password : "");
    a->db = rc->db;
    a->connect_timeout_ms = rc->connect_timeout_ms;
    a->op_timeout_ms = rc->op_timeout_ms;
    if (!a->host || !a->user || !a->password) {
        bench_redis_addr_free(a);
        return -1;
    }
    return 0;
}
