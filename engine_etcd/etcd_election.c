/*
 * etcd_election.c — leader election in the layout of etcd's
 * concurrency.Election, the one `etcdctl elect NAME PROPOSAL` and Go's
 * Campaign/Proclaim/Leader use, so that they and Cerberus candidates take
 * turns on one name (docs/election.md).
 *
 * Layout. Exactly the mutex's (etcd_mutex.c): a candidate's key is
 * K = <etcd.prefix><NAME>/<its session lease ID in hex>, attached to that
 * lease; the key with the lowest create revision under <prefix><NAME>/
 * leads, the others wait in create-revision order, each watching the key
 * just ahead. What differs is K's value: the candidate's proclamation (Go
 * puts it with the key in Campaign), not the fence offset. So a term's
 * acquire puts lk->value with the key (CERB_ELECT_VALUE_AT_GRANT: the value
 * is where peers read it before campaign returns), and where the mutex
 * reads the offset back from K, the election layout reads the offset key O
 * instead (cerb__etcd_fence_at): the acquire txn compared O's mod revision,
 * so the offset in force at K's create revision R is O's value then — its
 * value now if O last changed before R, else a read of O as of R; a
 * compacted R leaves the term unsettled, never with a guessed fence.
 * Renewal, release, waiting, the switch closure record and held() are the
 * mutex's unchanged.
 *
 * Proclaim (Go's Election.Proclaim):
 *     if create_revision(K) == R then put K = value (same lease)
 * else NOT_OWNER: K went with the session, or was deleted. Only the hold
 * with the claim on K sends it (a stale hold of this client would put the
 * current hold's key). Re-sending after a lost answer puts the same value
 * again: idempotent.
 *
 * Leader (Go's Election.Leader): one read-only txn, the range of the name
 * sorted by create revision, limit 1, with its value, and O (for the
 * leader's fence counter); a read of O as of the leader's revision only
 * when O changed since. No key: nobody leads (the read is linearizable).
 * A leader that is not ours (etcdctl) gets the same counter: its create
 * revision plus the offset in force then, the rank a Cerberus term there
 * would have had.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"

static const char *ep(cerb_engine *e) { return cerb__etcd_endpoint(&e->http); }

cerb_status cerb__etcd_put_at_rev(cerb_engine *e, const char *key, size_t len, int64_t rev,
                                  int64_t lease, const void *value, size_t n,
                                  int64_t deadline_ns, bool *put, cerb_outcome *outcome)
{
    *put = false;
    *outcome = CERB_OUTCOME_NO;
    json_t *req = cerb__etcd_txn(
        cerb__etcd_list(cerb__etcd_cmp_create(key, len, NULL, 0, "EQUAL", rev), NULL),
        cerb__etcd_list(cerb__etcd_op_put(key, len, value, n, lease), NULL), NULL);
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    struct etcd_call call;
    memset(&call, 0, sizeof call);
    call.what = "proclaim txn";
    call.path = "/v3/kv/txn";
    call.body = req;
    call.deadline_ns = deadline_ns;
    call.idempotent = true;
    cerb_status st = cerb__etcd_call(e, &call);
    json_decref(req);
    if (st != CERB_OK) {
        *outcome = call.outcome;
        return st;
    }
    int64_t hrev;
    const json_t *resp;
    st = cerb__etcd_parse_txn(call.resp, 0, put, &hrev, &resp);
    json_decref(call.resp);
    if (st != CERB_OK)
        *outcome = CERB_OUTCOME_UNKNOWN;
    else
        *outcome = *put ? CERB_OUTCOME_YES : CERB_OUTCOME_NO;
    return st;
}

static cerb_status elect_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                  size_t n, cerb_outcome *outcome)
{
    struct etcd_lock_priv *p = lk->priv;
    struct etcd_session s;
    struct etcd_key k;

    *outcome = CERB_OUTCOME_NO;
    cerb__etcd_session_peek(e, &s);
    if (!p->lease || p->rev <= 0 || p->gen != s.gen || !s.live)
        return cerb__error_set(CERB_NOT_OWNER,
                               "etcd %s: election \"%s\": the session (lease %llx) of this term "
                               "has ended",
                               ep(e), lk->name, (unsigned long long)p->lease);
    if (!cerb__etcd_claimed(e, lk))
        return cerb__error_set(CERB_NOT_OWNER, "etcd: election \"%s\": the key is no term's now",
                               lk->name);
    cerb_status st = cerb__etcd_key_init(&k, e->ec->prefix, lk->name, p->lease);
    if (st != CERB_OK)
        return st;
    bool put = false;
    st = cerb__etcd_put_at_rev(e, k.k, k.len, p->rev, p->lease, value, n,
                               cerb__deadline_in(e->ec->op_timeout_ms), &put, outcome);
    if (st == CERB_OK && !put)
        st = cerb__error_set(CERB_NOT_OWNER,
                             "etcd %s: election \"%s\": key %s (revision %lld) is gone: the "
                             "term has ended",
                             ep(e), lk->name, k.k, (long long)p->rev);
    cerb__etcd_key_free(&k);
    return st;
}

static cerb_status elect_leader(cerb_engine *e, const char *name, int variant,
                                cerb_leader_rec *out)
{
    (void)variant;
    struct etcd_key k;
    cerb_status st = cerb__etcd_key_init(&k, e->ec->prefix, name, 0);
    if (st != CERB_OK)
        return st;
    struct etcd_range_req first = {.key = k.k,
                                   .key_len = k.pfx_len,
                                   .end = k.end,
                                   .end_len = strlen(k.end),
                                   .limit = 1,
                                   .sort_order = ETCD_SORT_ASCEND,
                                   .sort_target = ETCD_TARGET_CREATE};
    json_t *req = cerb__etcd_txn(
        NULL, cerb__etcd_list(cerb__etcd_op_range(&first), cerb__etcd_fence_op_read(e)), NULL);
    int64_t d = cerb__deadline_in(e->ec->op_timeout_ms);
    json_t *answer = NULL;
    st = req ? cerb__etcd_post(e, "leader read", "/v3/kv/txn", req, d, NULL, &answer)
             : cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    struct etcd_range_res rr = {0};
    const json_t *resp = NULL;
    if (st == CERB_OK) {
        bool ok;
        int64_t rev;
        st = cerb__etcd_parse_txn(answer, 2, &ok, &rev, &resp);
    }
    if (st == CERB_OK) {
        const json_t *r0 = cerb__etcd_txn_range(resp, 0);
        st = r0 ? cerb__etcd_parse_range(r0, &rr)
                : cerb__error_set(CERB_EPROTO, "etcd %s: leader read: no range", ep(e));
    }
    if (st == CERB_OK && rr.n_kvs > 0) {
        struct etcd_kv *kv = &rr.first;
        out->state = CERB_LEADER_SOME;
        size_t ol = kv->key_len > k.pfx_len ? kv->key_len - k.pfx_len : 0;
        snprintf(out->owner, sizeof out->owner, "%.*s", (int)ol, kv->key + k.pfx_len);
        out->ttl_ms = -1;
        /* The value as the leader put it (an empty one too). */
        out->value = kv->value;
        out->value_len = kv->value_len;
        kv->value = NULL;
        if (!out->value)
            out->value = cerb__calloc(1, 1);
        if (!out->value) {
            st = cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
        } else {
            out->value_known = 1;
            int64_t off = 0;
            if (cerb__etcd_fence_at(e, kv->create_revision, cerb__etcd_txn_range(resp, 1), d,
                                    &off) == CERB_OK) {
                out->counter = (uint64_t)(kv->create_revision + off);
            } else {
                /* Who leads is known; only its rank is not (the offset
                 * then was compacted away): say so, never guess. */
                out->counter = 0;
                snprintf(out->detail, sizeof out->detail,
                         "fence unknown: the offset at revision %lld cannot be read",
                         (long long)kv->create_revision);
            }
            if (kv->lease == 0 && !out->detail[0])
                snprintf(out->detail, sizeof out->detail, "no lease");
        }
    }
    cerb__etcd_kv_clear(&rr.first);
    json_decref(answer);
    cerb__etcd_key_free(&k);
    return st;
}

const struct cerb_election_methods cerb__etcd_election = {
    .version = CERB_ELECTION_METHODS_V1,
    .flags = CERB_ELECT_VALUE_AT_GRANT,
    .acquire = cerb__etcd_elect_acquire,
    .check_owner = cerb__etcd_elect_check,
    .proclaim = elect_proclaim,
    .leader = elect_leader,
};
