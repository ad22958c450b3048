/*
 * ceiling_redlock.c — the raw ceiling of the redis engine in Redlock mode
 * (redis.mode = "redlock"): the bare commands a Redlock needs over the N
 * masters of redis.nodes, with no library logic, on the same masters in
 * the same run.
 *
 * A cycle is what a tight Redlock client sends: `SET name token NX PX
 * 10000` to every master at once, a quorum (N/2+1) of OK replies
 * required, then EVALSHA of the compare-and-delete script to every master
 * at once. "At once" is one hiredis context per master (per thread: they
 * are not thread-safe), each command appended to every context and every
 * output buffer written before the first reply is read, so the masters
 * work in parallel and a step costs one round trip of the slowest of them,
 * as a client issuing in parallel (redsync's goroutines, node-redlock's
 * promises) pays. Cerberus's fenced grant adds one more step (the fence's
 * write-back to a majority), which the ceiling leaves out: it is the
 * price of the tokens, and the ratio shows it. The round trip (handoff's
 * "rtt" ceiling) is PING to every master at once.
 */
#include <hiredis/hiredis.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "scenarios.h"

static const char release_script[] =
    "if redis.call('get',KEYS[1]) == ARGV[1] then "
    "return redis.call('del',KEYS[1]) else return 0 end";

struct rl_sess {
    size_t n;
    redisContext *ctx[CERB_MAX_ENDPOINTS];
    char node[CERB_MAX_ENDPOINTS][128];
    char sha[41];
};

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

static void rl_close(void *p)
{
    struct rl_sess *s = p;
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        if (s->ctx[i])
            redisFree(s->ctx[i]);
    free(s);
}

/* Describe a failed reply @r (NULL: I/O) of master @i to @what. */
static void rl_err(struct rl_sess *s, size_t i, redisReply *r, const char *what, char *err,
                   size_t errlen)
{
    if (!r)
        snprintf(err, errlen, "redlock master %s %s: %s", s->node[i], what,
                 s->ctx[i]->errstr[0] ? s->ctx[i]->errstr : "connection failed");
    else if (r->type == REDIS_REPLY_ERROR)
        snprintf(err, errlen, "redlock master %s %s: %s", s->node[i], what, r->str);
    else
        snprintf(err, errlen, "redlock master %s %s: unexpected reply type %d", s->node[i],
                 what, r->type);
}

/* One blocking command on master @i (setup only). */
static redisReply *rl_cmd1(struct rl_sess *s, size_t i, const char *fmt, const char *arg)
{
    return arg ? redisCommand(s->ctx[i], fmt, arg) : redisCommand(s->ctx[i], fmt);
}

static void *rl_open(const struct bench_engine *e, char *err, size_t errlen)
{
    const struct cerb_redis_config *rc = &e->cfg->redis;
    struct rl_sess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (rc->mode != CERB_REDIS_REDLOCK || rc->n_nodes == 0) {
        snprintf(err, errlen, "the redlock ceiling needs redis.mode = \"redlock\" and its nodes");
        free(s);
        return NULL;
    }
    for (size_t i = 0; i < rc->n_nodes; i++) {
        const char *hp = rc->nodes[i], *colon = strrchr(hp, ':');
        char host[128];
        snprintf(s->node[i], sizeof s->node[i], "%s", hp);
        if (!colon || (size_t)(colon - hp) >= sizeof host) {
            snprintf(err, errlen, "redlock node \"%s\" is not host:port", hp);
            goto fail;
        }
        memcpy(host, hp, (size_t)(colon - hp));
        host[colon - hp] = '\0';
        s->ctx[i] = redisConnectWithTimeout(host, atoi(colon + 1), tv_ms(rc->connect_timeout_ms));
        s->n = i + 1;
        if (!s->ctx[i] || s->ctx[i]->err) {
            snprintf(err, errlen, "redlock master %s: %s", hp,
                     s->ctx[i] ? s->ctx[i]->errstr : "cannot allocate a context");
            goto fail;
        }
        if (redisSetTimeout(s->ctx[i], tv_ms(rc->op_timeout_ms)) != REDIS_OK) {
            snprintf(err, errlen, "redlock master %s: cannot set the timeout", hp);
            goto fail;
        }
        redisReply *r = NULL;
        if (rc->password && rc->password[0]) {
            r = rc->user && rc->user[0]
                    ? redisCommand(s->ctx[i], "AUTH %s %s", rc->user, rc->password)
                    : rl_cmd1(s, i, "AUTH %s", rc->password);
            if (!r || r->type == REDIS_REPLY_ERROR) {
                rl_err(s, i, r, "AUTH", err, errlen);
                if (r)
                    freeReplyObject(r);
                goto fail;
            }
            freeReplyObject(r);
        }
        if (rc->db != 0) {
            r = redisCommand(s->ctx[i], "SELECT %d", rc->db);
            if (!r || r->type == REDIS_REPLY_ERROR) {
                rl_err(s, i, r, "SELECT", err, errlen);
                if (r)
                    freeReplyObject(r);
                goto fail;
            }
            freeReplyObject(r);
        }
        r = rl_cmd1(s, i, "SCRIPT LOAD %s", release_script);
        if (!r || r->type != REDIS_REPLY_STRING || r->len != 40) {
            rl_err(s, i, r, "SCRIPT LOAD", err, errlen);
            if (r)
                freeReplyObject(r);
            goto fail;
        }
        memcpy(s->sha, r->str, 40); /* the same text: the same SHA on every master */
        s->sha[40] = '\0';
        freeReplyObject(r);
    }
    return s;
fail:
    rl_close(s);
    return NULL;
}

/* Write every master's output buffer, then read one reply from each into
 * @rep. Returns 0, or -1 with @err (replies read so far are in @rep, the
 * rest NULL; the caller frees them). */
static int rl_round(struct rl_sess *s, redisReply **rep, const char *what, char *err,
                    size_t errlen)
{
    for (size_t i = 0; i < s->n; i++)
        rep[i] = NULL;
    for (size_t i = 0; i < s->n; i++) {
        int done = 0;
        while (!done)
            if (redisBufferWrite(s->ctx[i], &done) != REDIS_OK) {
                rl_err(s, i, NULL, what, err, errlen);
                return -1;
            }
    }
    for (size_t i = 0; i < s->n; i++) {
        void *r = NULL;
        if (redisGetReply(s->ctx[i], &r) != REDIS_OK) {
            rl_err(s, i, NULL, what, err, errlen);
            return -1;
        }
        rep[i] = r;
    }
    return 0;
}

static void rl_free_replies(struct rl_sess *s, redisReply **rep)
{
    for (size_t i = 0; i < s->n; i++)
        if (rep[i])
            freeReplyObject(rep[i]);
}

static int rl_cycle(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct rl_sess *s = p;
    redisReply *rep[CERB_MAX_ENDPOINTS];
    size_t ok = 0;
    for (size_t i = 0; i < s->n; i++)
        redisAppendCommand(s->ctx[i], "SET %s %s NX PX 10000", name, token);
    if (rl_round(s, rep, "SET NX PX", err, errlen) != 0) {
        rl_free_replies(s, rep);
        return -1;
    }
    for (size_t i = 0; i < s->n; i++)
        if (rep[i]->type == REDIS_REPLY_STATUS)
            ok++;
    rl_free_replies(s, rep);
    if (ok < s->n / 2 + 1) {
        snprintf(err, errlen, "redlock: an uncontended SET NX was granted by %zu of %zu masters",
                 ok, s->n);
        return -1;
    }
    for (size_t i = 0; i < s->n; i++)
        redisAppendCommand(s->ctx[i], "EVALSHA %s 1 %s %s", s->sha, name, token);
    if (rl_round(s, rep, "EVALSHA (release)", err, errlen) != 0) {
        rl_free_replies(s, rep);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < s->n && rc == 0; i++)
        if (rep[i]->type != REDIS_REPLY_INTEGER) {
            /* NOSCRIPT after a server restart: the bench fails loudly
             * rather than measure a reload. */
            rl_err(s, i, rep[i], "EVALSHA (release)", err, errlen);
            rc = -1;
        }
    rl_free_replies(s, rep);
    return rc;
}

static int rl_round_trip(void *p, char *err, size_t errlen)
{
    struct rl_sess *s = p;
    redisReply *rep[CERB_MAX_ENDPOINTS];
    for (size_t i = 0; i < s->n; i++)
        redisAppendCommand(s->ctx[i], "PING");
    int rc = rl_round(s, rep, "PING", err, errlen);
    for (size_t i = 0; i < s->n && rc == 0; i++)
        if (rep[i]->type != REDIS_REPLY_STATUS) {
            rl_err(s, i, rep[i], "PING", err, errlen);
            rc = -1;
        }
    rl_free_replies(s, rep);
    return rc;
}

const struct bench_ceiling bench_ceiling_redlock = {
    "redlock", rl_open, rl_cycle, rl_round_trip, rl_close,
};
