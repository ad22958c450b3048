/*
 * redis_inspect.c — inspect(): who holds a lock name on Redis and who waits
 * for it (cerb_lock_inspect, DESIGN.md §13).
 *
 * The keys of a lock are those of redis_scripts.h (cerb__redis_keys_init,
 * the scripts' own layout): K holds the owner token with a PX lease,
 * {K}^_fence the fence of the last grant, {K}^_q the waiter tokens in queue
 * order and {K}^_d each waiter's "deadline_ms lease_ms" in server time (a
 * waiter whose deadline passed is dead and skipped, as the scripts skip
 * it). One MULTI/EXEC reads all of it and the server's TIME together, so
 * the answer is one consistent snapshot, in one round trip, and nothing is
 * written. A key without an expiry (a redis-py Lock with no timeout) is
 * held with ttl_ms -1; a key of another type (WRONGTYPE) is not a lock and
 * is reported as CERB_EPROTO. The fence counter is kept for a day after
 * the last grant, so it is the holder's fence whenever there is a holder
 * that we granted; a redis-py holder shows the last fence we granted, or 0.
 *
 * The connection is a pool connection of the engine, taken the way every
 * lock operation takes its own, so it has the engine's AUTH, SELECT and
 * (sentinel mode) master discovery, and a broken one is never reused.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "redis_scripts.h"

enum { Q_MULTI, Q_GET, Q_PTTL, Q_FENCE, Q_QUEUE, Q_DATA, Q_TIME, Q_EXEC, Q_N };
enum { X_GET, X_PTTL, X_FENCE, X_QUEUE, X_DATA, X_TIME, X_N };

/* The deadline (server ms) a {K}^_d entry gives waiter `tok`; -1 if none. */
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

/* Fill `out` from EXEC's answer x (X_N replies). */
static cerb_status read_snapshot(cerb_engine *e, const char *key, const redisReply *x,
                                 struct cerb_holders *out)
{
    const redisReply *get = x->element[X_GET], *pttl = x->element[X_PTTL],
                     *fence = x->element[X_FENCE], *queue = x->element[X_QUEUE],
                     *data = x->element[X_DATA], *tm = x->element[X_TIME];
    cerb_status st;

    if (get->type == REDIS_REPLY_ERROR) /* WRONGTYPE: some other data */
        return cerb__error_set(CERB_EPROTO, "redis %s: key \"%s\" is not a lock: %s", e->where,
                               key, get->str);
    if (get->type == REDIS_REPLY_STRING) {
        uint64_t f = fence->type == REDIS_REPLY_STRING ? strtoull(fence->str, NULL, 10) : 0;
        int64_t ttl = pttl->type == REDIS_REPLY_INTEGER && pttl->integer >= 0 ? pttl->integer
                                                                               : -1;
        st = cerb__holders_add(out, get->str, get->len, 0, f, ttl, "");
        if (st != CERB_OK)
            return st;
    }
    /* Waiters: the queue in order, those whose deadline has not passed. */
    if (queue->type != REDIS_REPLY_ARRAY || queue->elements == 0 ||
        data->type != REDIS_REPLY_ARRAY || tm->type != REDIS_REPLY_ARRAY || tm->elements != 2 ||
        tm->element[0]->type != REDIS_REPLY_STRING || tm->element[1]->type != REDIS_REPLY_STRING)
        return CERB_OK;
    int64_t now = strtoll(tm->element[0]->str, NULL, 10) * 1000 +
                  strtoll(tm->element[1]->str, NULL, 10) / 1000;
    for (size_t i = 0; i < queue->elements; i++) {
        const redisReply *tok = queue->element[i];
        if (tok->type != REDIS_REPLY_STRING || waiter_deadline(data, tok) < now)
            continue;
        st = cerb__holders_add(out, tok->str, tok->len, 1, 0, -1, "");
        if (st != CERB_OK)
            return st;
    }
    return CERB_OK;
}

cerb_status cerb__redis_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct redis_keys ks;
    struct redis_conn *c = NULL;
    redisReply *r[Q_N] = {NULL};
    size_t got = 0;
    cerb_outcome oc;

    /* The token only names the wake list, which is not read here. */
    cerb_status st = cerb__redis_keys_init(&ks, e, name, "");
    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st != CERB_OK)
        goto out;
    const char *k = ks.k[REDIS_K], *f = ks.k[REDIS_F], *q = ks.k[REDIS_Q], *d = ks.k[REDIS_D];
    size_t kl = ks.len[REDIS_K], fl = ks.len[REDIS_F], ql = ks.len[REDIS_Q],
           dl = ks.len[REDIS_D];
    struct {
        int argc;
        const char *argv[4];
        size_t len[4];
    } cmd[Q_N] = {
        {1, {"MULTI"}, {5}},
        {2, {"GET", k}, {3, kl}},
        {2, {"PTTL", k}, {4, kl}},
        {2, {"GET", f}, {3, fl}},
        {4, {"LRANGE", q, "0", "-1"}, {6, ql, 1, 2}},
        {2, {"HGETALL", d}, {7, dl}},
        {1, {"TIME"}, {4}},
        {1, {"EXEC"}, {4}},
    };
    for (int i = 0; st == CERB_OK && i < Q_N; i++)
        st = cerb__redis_append(c, cmd[i].argc, cmd[i].argv, cmd[i].len);
    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, "inspect", r, &got, &oc);
    if (st != CERB_OK)
        goto out;
    /* MULTI answers OK and each command QUEUED; EXEC answers them all. */
    for (int i = 0; i < Q_EXEC; i++) {
        if (r[i]->type == REDIS_REPLY_ERROR) {
            struct redis_failure fl_ = {.phase = REDIS_PHASE_REPLY, .reply = r[i]};
            st = cerb__redis_fail(e->where, "inspect", &fl_, NULL);
            goto out;
        }
    }
    if (r[Q_EXEC]->type != REDIS_REPLY_ARRAY || r[Q_EXEC]->elements != X_N) {
        struct redis_failure fl_ = {.phase = REDIS_PHASE_REPLY, .reply = r[Q_EXEC]};
        st = cerb__redis_fail(e->where, "inspect: EXEC", &fl_, NULL);
        goto out;
    }
    st = read_snapshot(e, k, r[Q_EXEC], out);
out:
    if (c)
        cerb__redis_put(e, c);
    for (size_t i = 0; i < got; i++)
        freeReplyObject(r[i]);
    cerb__redis_keys_free(&ks);
    return st;
}
