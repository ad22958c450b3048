/*
 * holders_cluster.c — `cerberus holders` against a Redis Cluster
 * (redis.mode = "cluster"): which master serves the lock's slot, and the
 * names of its helper keys there.
 *
 * The slot and its master come from the servers (CLUSTER KEYSLOT and CLUSTER
 * SLOTS through the configured seeds, in turn), so the reader needs no slot
 * arithmetic of its own; cmd_holders.c then reads that master as it reads a
 * single server. Helper keys are "{K}\x1f…", or "{n}K\x1f…" when K contains a
 * '}' (engine_redis/redis_scripts.h), n being the slot's marker tag, which
 * only the engine's code computes: a CLI built without the redis engine
 * shows such names as an error.
 */
#include "internal_posix.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "cli.h"
#include "config.h"
#ifdef CERB_CLI_WITH_REDIS
#include "redis_cluster.h"
#endif

static struct timeval tv(int64_t ms)
{
    struct timeval t = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return t;
}

/* Ask one seed: K's slot and the master that serves it. */
static int ask_seed(const struct cerb_redis_config *rc, const char *seed, const char *k,
                    long long *slot, char *host, size_t hl, int *port, char *err, size_t len)
{
    char sh[256];
    const char *colon = strrchr(seed, ':');
    if (!colon || (size_t)(colon - seed) >= sizeof sh) {
        snprintf(err, len, "seed \"%s\" is not host:port", seed);
        return -1;
    }
    memcpy(sh, seed, (size_t)(colon - seed));
    sh[colon - seed] = '\0';
    redisContext *c = redisConnectWithTimeout(sh, atoi(colon + 1), tv(rc->connect_timeout_ms));
    if (!c || c->err) {
        snprintf(err, len, "%s: %s", seed, c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return -1;
    }
    redisSetTimeout(c, tv(rc->op_timeout_ms));
    redisReply *r = NULL;
    int ok = -1;
    if (rc->password && rc->password[0]) {
        r = rc->user && rc->user[0] ? redisCommand(c, "AUTH %s %s", rc->user, rc->password)
                                    : redisCommand(c, "AUTH %s", rc->password);
        if (r)
            freeReplyObject(r);
    }
    r = redisCommand(c, "CLUSTER KEYSLOT %s", k);
    if (r && r->type == REDIS_REPLY_INTEGER) {
        *slot = r->integer;
        freeReplyObject(r);
        r = redisCommand(c, "CLUSTER SLOTS");
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
            redisReply *e = r->element[i];
            if (e->type == REDIS_REPLY_ARRAY && e->elements >= 3 &&
                e->element[0]->integer <= *slot && *slot <= e->element[1]->integer &&
                e->element[2]->elements >= 2) {
                snprintf(host, hl, "%s", e->element[2]->element[0]->str[0]
                                             ? e->element[2]->element[0]->str
                                             : sh);
                *port = (int)e->element[2]->element[1]->integer;
                ok = 0;
            }
        }
        if (ok != 0)
            snprintf(err, len, "%s: no master serves slot %lld", seed, *slot);
    } else {
        snprintf(err, len, "%s: CLUSTER KEYSLOT: %s", seed,
                 r && r->type == REDIS_REPLY_ERROR ? r->str : c->errstr);
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

int cerb__cli_redis_cluster_target(const struct cerb_redis_config *rc, const char *k,
                                   struct cerb_redis_config *out, char *host, size_t hl,
                                   char **base, char *err, size_t len)
{
    long long slot = -1;
    int port = 0, ok = -1;
    for (size_t i = 0; i < rc->n_nodes && ok != 0; i++)
        ok = ask_seed(rc, rc->nodes[i], k, &slot, host, hl, &port, err, len);
    if (ok != 0)
        return -1;
    *out = *rc;
    out->host = host;
    out->port = port;
    char tag[16];
    size_t kl = strlen(k);
    if (!strchr(k, '}')) {
        snprintf(tag, sizeof tag, "%s", "");
        *base = malloc(kl + 3);
        if (*base)
            snprintf(*base, kl + 3, "{%s}", k);
    } else {
#ifdef CERB_CLI_WITH_REDIS
        snprintf(tag, sizeof tag, "%u", cerb__redis_slot_tag((unsigned)slot));
        *base = malloc(kl + sizeof tag + 3);
        if (*base)
            snprintf(*base, kl + sizeof tag + 3, "{%s}%s", tag, k);
#else
        snprintf(err, len, "a name with '}' needs the redis engine built in");
        return -1;
#endif
    }
    if (!*base) {
        snprintf(err, len, "out of memory");
        return -1;
    }
    return 0;
}
