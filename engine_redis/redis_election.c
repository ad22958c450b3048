/*
 * redis_election.c — leader election on Redis (engine.h, struct
 * cerb_election_methods; docs/election.md, "## redis").
 *
 * A term is the lock's hold, unchanged: K = redis.prefix + name holds the
 * term's owner token with its PX lease, granted, renewed, handed over in
 * FIFO order and released by the lock's scripts (redis_scripts.c). The
 * token has to stay in K: every script compares it, the fair hand-off
 * writes the *waiter's* token into K inside the releaser's script (which
 * knows no waiter's value), and redis-py's Lock and tooz keep the same
 * shape (a token, uuid1().hex, in K), so a Cerberus candidate and theirs
 * exclude each other.
 *
 * The candidate's value goes beside K, in the helper key
 *   V = {K}^_value   "<token> <value bytes>", PX one day (the fence key's)
 * in K's hash slot (REDIS_V of struct redis_keys, so a K with a '}' gets the
 * cluster form "{n}K^_value" as the other helper keys do). A term's
 * renewals declare V too and push its expiry to a day past the renewal
 * (the renew script), so a term longer than a day keeps its value, and V
 * is gone a day after the name's last term. Two scripts:
 *   proclaim(K V M; token value marker): GET K ~= token -> -1, nothing
 *     written; else SET V. Atomic with "still leading" (the same compare
 *     as renew), idempotent (re-sent after an answer that did not say).
 *   leader(K V F M; marker), read-only: quarantine -> UNKNOWN; K missing
 *     -> NONE; else owner = K's token, ttl = PTTL K, counter = F (what
 *     the lock's grant, renew and check report: the fence of the last
 *     grant, a floor included), and the value only when V starts with K's
 *     token and a space. Any other V is a term that has not proclaimed yet
 *     (handed over, or just granted) or a holder that never proclaims
 *     (redis-py, tooz): value unknown, never the previous term's value.
 * The core proclaims right after every grant, before campaign returns
 * (no CERB_ELECT_VALUE_AT_GRANT), so a Cerberus leader's value is on the
 * server once it is told it leads.
 *
 * Both scripts check the data-loss marker (redis_marker.h) as every lock
 * script does: a proclaim that finds another marker is a lost term
 * (NOT_OWNER), a leader read learns the new marker and asks again under
 * it, and then the quarantine answers UNKNOWN, never "nobody".
 *
 * Cluster mode routes both through the slot's master like check and
 * inspect (redis_cluster.c); sentinel mode runs them on the master's pool
 * as every operation.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "redis_cluster.h"
#include "redis_marker.h"
#include "redis_redlock.h"
#include "redis_scripts.h"

static void marker_key(cerb_engine *e, const struct redis_keys *ks, const char **k, size_t *l)
{
    *k = ks->mk ? ks->mk : e->marker_key;
    *l = ks->mk ? ks->mk_len : e->marker_key_len;
}

static cerb_status bad(cerb_engine *e, const char *what, const redisReply *r, cerb_outcome *oc)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(e->where, what, &f, oc);
}

cerb_status cerb__redis_op_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                    size_t n, cerb_outcome *outcome)
{
    struct redis_keys ks;
    struct redis_conn *c = NULL;
    struct redis_marker_view mv;
    redisReply *r = NULL;

    *outcome = CERB_OUTCOME_NO;
    cerb_status st = cerb__redis_keys_init(&ks, e, lk->name, lk->token);
    if (st != CERB_OK)
        return st;
    const char *vk = ks.k[REDIS_V];
    size_t vl = ks.len[REDIS_V];
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK)
        st = cerb__redis_marker_for(e, c, &ks, &mv);
    if (st == CERB_OK) {
        const char *keys[3] = {ks.k[REDIS_K], vk, NULL};
        size_t klen[3] = {ks.len[REDIS_K], vl, 0};
        marker_key(e, &ks, &keys[2], &klen[2]);
        const char *args[3] = {lk->token, n ? value : "", mv.value};
        size_t alen[3] = {strlen(lk->token), n, strlen(mv.value)};
        st = cerb__redis_eval_argv(e, c, REDIS_SCRIPT_PROCLAIM, 3, keys, klen, 3, args, alen, &r,
                                   outcome);
    }
    if (st == CERB_OK) {
        if (cerb__redis_is_lost(r)) {
            /* Another marker: the data the term lived in is gone (every
             * hold of the instance is told LOST). Nothing was written. */
            cerb__redis_marker_lost(e, c, &ks, &mv);
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\": the server lost its data",
                                 e->where, ks.k[REDIS_K]);
        } else if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
            *outcome = CERB_OUTCOME_YES;
        } else if (r->type == REDIS_REPLY_INTEGER && r->integer == -1) {
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\" is not led by this term",
                                 e->where, ks.k[REDIS_K]);
        } else {
            st = bad(e, "proclaim", r, outcome);
        }
    }
    if (c)
        cerb__redis_put(e, c);
    if (r)
        freeReplyObject(r);
    cerb__redis_keys_free(&ks);
    return st;
}

static bool is_string(const redisReply *r) { return r->type == REDIS_REPLY_STRING; }

/* Fill out from the leader script's {1, K, PTTL, F, known, value}. */
static cerb_status read_leader(cerb_engine *e, const redisReply *r, cerb_leader_rec *out)
{
    const redisReply *k = r->element[1], *pttl = r->element[2], *f = r->element[3],
                     *known = r->element[4], *v = r->element[5];
    if (!is_string(k) || pttl->type != REDIS_REPLY_INTEGER || !is_string(f) ||
        known->type != REDIS_REPLY_INTEGER || !is_string(v))
        return bad(e, "leader", r, NULL);
    out->state = CERB_LEADER_SOME;
    snprintf(out->owner, sizeof out->owner, "%.*s", (int)k->len, k->str);
    /* No expiry (a redis-py Lock without a timeout): held until deleted. */
    out->ttl_ms = pttl->integer >= 0 ? pttl->integer : -1;
    /* A counter gone while the term stands (DEL of it alone, or its day
     * past the last grant) reads 0: check_owner makes it again. */
    out->counter = f->len ? strtoull(f->str, NULL, 10) : 0;
    if (known->integer == 1) {
        out->value = cerb__malloc(v->len + 1);
        if (!out->value)
            return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a leader's value");
        memcpy(out->value, v->str, v->len);
        ((char *)out->value)[v->len] = '\0';
        out->value_len = v->len;
        out->value_known = 1;
    }
    return CERB_OK;
}

cerb_status cerb__redis_op_leader(cerb_engine *e, const char *name, int variant,
                                  cerb_leader_rec *out)
{
    (void)variant; /* one layout */
    struct redis_keys ks;
    struct redis_conn *c = NULL;
    struct redis_marker_view mv;
    redisReply *r = NULL;
    cerb_outcome oc;

    /* The token only names the wake list, which is not read here. */
    cerb_status st = cerb__redis_keys_init(&ks, e, name, "");
    if (st != CERB_OK)
        return st;
    const char *vk = ks.k[REDIS_V];
    size_t vl = ks.len[REDIS_V];
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    for (int round = 0; st == CERB_OK; round++) {
        st = cerb__redis_marker_for(e, c, &ks, &mv);
        if (st != CERB_OK)
            break;
        const char *keys[4] = {ks.k[REDIS_K], vk, ks.k[REDIS_F], NULL};
        size_t klen[4] = {ks.len[REDIS_K], vl, ks.len[REDIS_F], 0};
        marker_key(e, &ks, &keys[3], &klen[3]);
        const char *args[1] = {mv.value};
        size_t alen[1] = {strlen(mv.value)};
        st = cerb__redis_eval_argv(e, c, REDIS_SCRIPT_LEADER, 4, keys, klen, 1, args, alen, &r,
                                   &oc);
        if (st != CERB_OK || !cerb__redis_is_lost(r))
            break;
        freeReplyObject(r);
        r = NULL;
        /* Learn the new marker (every hold here is told LOST), then ask
         * again under it: its quarantine answers UNKNOWN. */
        st = round == 0 ? cerb__redis_marker_lost(e, c, &ks, &mv)
                        : cerb__error_set(CERB_EIO, "redis %s: leader: the server keeps losing "
                                          "its data (marker changed twice)", e->where);
    }
    if (c)
        cerb__redis_put(e, c);
    if (st == CERB_OK) {
        long long code = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
                                 r->element[0]->type == REDIS_REPLY_INTEGER
                             ? r->element[0]->integer
                             : -1;
        if (code == 0 && r->elements == 1) {
            out->state = CERB_LEADER_NONE;
        } else if (code == 2 && r->elements == 1) {
            out->state = CERB_LEADER_UNKNOWN;
            snprintf(out->detail, sizeof out->detail,
                     "redis %.48s: quarantine after a loss of data: a term from before it "
                     "may still stand", e->where);
        } else if (code == 1 && r->elements == 6) {
            st = read_leader(e, r, out);
        } else {
            st = bad(e, "leader", r, NULL);
        }
    }
    if (r)
        freeReplyObject(r);
    cerb__redis_keys_free(&ks);
    return st;
}

static cerb_status redis_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                  size_t n, cerb_outcome *outcome)
{
    if (e->rl_top) {
        *outcome = CERB_OUTCOME_NO;
        return cerb__redis_rl_no_prim(e, "leader election", NULL);
    }
    return e->cl_top ? cerb__redis_cl_proclaim(e, lk, value, n, outcome)
                     : cerb__redis_op_proclaim(e, lk, value, n, outcome);
}

static cerb_status redis_leader(cerb_engine *e, const char *name, int variant,
                                cerb_leader_rec *out)
{
    if (e->rl_top)
        return cerb__redis_rl_no_prim(e, "leader election", NULL);
    return e->cl_top ? cerb__redis_cl_leader(e, name, variant, out)
                     : cerb__redis_op_leader(e, name, variant, out);
}

/* The term's grant and check are the lock's (same K): no acquire or
 * check_owner of its own. */
const struct cerb_election_methods cerb__redis_election = {
    .version = CERB_ELECTION_METHODS_V1,
    .flags = 0,
    .proclaim = redis_proclaim,
    .leader = redis_leader,
};
