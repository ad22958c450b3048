/*
 * etcd_mutex.c — etcd's concurrency.Mutex, so that `etcdctl lock NAME`, Go's
 * Mutex and a Cerberus lock on the same name exclude each other.
 *
 * Layout. The lock NAME is the key prefix P = <etcd.prefix><NAME>/; a
 * contender's key is K = P + <its session lease ID in lowercase hex>, with
 * the fence offset as its value (etcd_fence.c; Go's Mutex leaves it empty
 * and ignores it), attached to the lease. The key with the lowest create
 * revision under P holds the lock; the others queue behind it in create
 * revision order. The fencing token is K's create revision plus the offset
 * it was put with, which strictly increases across the grants of a name: a
 * holder's key was created before every key that can hold after it, and
 * the offset never decreases.
 *
 * Acquire, in Go:    if create_revision(K) == 0
 *                    then put K (lease), range P (sort by create, limit 1)
 *                    else range K,       range P (sort by create, limit 1)
 * and K holds the lock when its create revision is the owner's. We take the
 * same decision more cheaply for the server (put_txn): then put K, count P
 * (a count of 1 is us alone: we hold it; more, and the first read of the
 * wait loop tells whether anyone is ahead); else nothing, followed by a read
 * of K and the owner in the rare case our key was there already. The txn
 * also compares the fence offset key with our cached copy (else: read it,
 * and send again; etcd_fence.c) and, for a client at an epoch (lk->epoch
 * >= 0), the closure record's mod revision with ours (else: read it in the
 * same failure branch; refuse, leaving no key, when it refuses that epoch,
 * or send again; etcd_closure.c). Because a queued key becomes the holder
 * without another write, this compare on the put is what makes the refusal
 * atomic with the grant. The txn is idempotent — K names the
 * session, so a re-sent txn finds the key its first copy put, with the
 * offset that copy used — which is how an ambiguous outcome (a timeout after
 * sending) is settled: send it again until the answer is definite.
 *
 * Waiting. A waiter reads, in one read-only txn, the key just ahead of it
 * (range P with max_create_revision = ours − 1, sorted by create revision
 * descending, limit 1) and its own key; it watches only that predecessor for
 * DELETE, for every revision after the read's (etcd_watch.c: watching from
 * the read's header revision itself is served by etcd's 100 ms "unsynced"
 * loop and costs ~90 ms per hand-off; so is header + 1 once anyone else has
 * written meanwhile, so the watch starts "now" and one read covers the gap
 * when there is one). On the DELETE it reads again: no predecessor means it
 * holds the lock; a new one (a waiter ahead gave up) is watched next. So a
 * release wakes one waiter, not the herd. Our own key missing means our
 * session ended (or someone deleted it): we start over with the current
 * session.
 *
 * Claims (etcd_lease.c). The key names the session and the lock, not the
 * acquisition, so a hold of this client that is not the key's current user
 * (the core releases failed acquisitions in the background, in case they
 * landed) must not delete it: every operation claims the key first, and a
 * stale hold finds it claimed by the current one and leaves it alone.
 *
 * Trylock is one non-queuing txn:
 *                    if create_revision of every key in [P, end(P)) == 0
 *                       (and the fence offset key is as cached)
 *                    then put K
 *                    else range the fence offset key
 * etcd compares a range key by key and an empty range as one zero-valued
 * key, so the put happens exactly when nobody holds or waits; a busy lock
 * leaves no key behind (Go's TryLock puts a key and deletes it again, which
 * under contention loses to the queue most of the time).
 *
 * Giving up (deadline, interrupt, error) deletes our key, re-sent until
 * definite; a delete that cannot be confirmed goes to the session thread as
 * an orphan (etcd_lease.c), because a queued key of a live session would
 * otherwise become the owner one day with nobody using it. Release is a
 * plain deleterange by the claim holder (cheaper for the server than a
 * txn), re-sent until definite, else an orphan too.
 *
 * The election layout (etcd_election.c, `etcdctl elect`) is this one with
 * the candidate's value in K instead of the offset: acquire_as and
 * check_as take the layout, put lk->value, and find the offset a key was
 * put with from the offset key as of the key's create revision
 * (cerb__etcd_fence_at) instead of from its value.
 */
#include "internal_posix.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

/* Restarts (key gone, session replaced) before an acquire gives up. */
#define MAX_RESTARTS 8

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static const char *ep(cerb_engine *e) { return cerb__etcd_endpoint(&e->http); }

/* ---- keys ---- */

cerb_status cerb__etcd_key_init(struct etcd_key *k, const char *prefix, const char *name,
                                int64_t lease)
{
    char hex[24];
    size_t pl = prefix ? strlen(prefix) : 0, nl = strlen(name);
    int hl = snprintf(hex, sizeof hex, "%llx", (unsigned long long)lease);
    size_t need;

    k->heap = NULL;
    k->pfx_len = pl + nl + 1;
    k->len = k->pfx_len + (size_t)hl;
    need = k->len + 1 + k->pfx_len + 1;
    char *p = k->buf;
    if (need > sizeof k->buf) {
        p = k->heap = cerb__malloc(need);
        if (!p)
            return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a key");
    }
    k->k = p;
    memcpy(p, prefix, pl);
    memcpy(p + pl, name, nl);
    p[pl + nl] = '/';
    memcpy(p + k->pfx_len, hex, (size_t)hl);
    p[k->len] = '\0';
    k->end = p + k->len + 1;
    size_t en;
    cerb__etcd_prefix_end(k->k, k->pfx_len, k->end, &en);
    k->end[en] = '\0';
    return CERB_OK;
}

void cerb__etcd_key_free(struct etcd_key *k)
{
    cerb__free(k->heap);
    k->heap = NULL;
}

static size_t end_len(const struct etcd_key *k)
{
    /* The prefix ends in '/', so its range end has the same length. */
    return k->pfx_len;
}

/* range P sorted by create revision ascending, limit 1: the owner. */
static json_t *op_owner(const struct etcd_key *k)
{
    struct etcd_range_req r = {.key = k->k,
                               .key_len = k->pfx_len,
                               .end = k->end,
                               .end_len = end_len(k),
                               .limit = 1,
                               .sort_order = ETCD_SORT_ASCEND,
                               .sort_target = ETCD_TARGET_CREATE,
                               .keys_only = true};
    return cerb__etcd_op_range(&r);
}

/* range P, count only: how many contenders, ourselves included. */
static json_t *op_count(const struct etcd_key *k)
{
    struct etcd_range_req r = {.key = k->k,
                               .key_len = k->pfx_len,
                               .end = k->end,
                               .end_len = end_len(k),
                               .count_only = true};
    return cerb__etcd_op_range(&r);
}

/* range K; with its value (the fence offset it was put with) or keys only. */
static json_t *op_own(const struct etcd_key *k, bool value)
{
    struct etcd_range_req r = {.key = k->k, .key_len = k->len, .keys_only = !value};
    return cerb__etcd_op_range(&r);
}

/* The fence offset a key of ours was put with, from its value; -1 when it
 * holds none (not put by our acquire txn). */
static int64_t own_offset(const struct etcd_kv *kv)
{
    int64_t off;
    return cerb__etcd_fence_parse(kv->value, kv->value_len, &off) ? off : -1;
}

/* ---- one txn ---- */

/*
 * Run txn `req` (stolen) and parse it: succeeded, header revision and the
 * responses, kept alive in *resp (json_decref it).
 */
static cerb_status run_txn(cerb_engine *e, const char *what, json_t *req, size_t want,
                           int64_t deadline_ns, const atomic_int *abort, struct etcd_call *call,
                           bool *succeeded, int64_t *rev, const json_t **responses)
{
    memset(call, 0, sizeof *call);
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    call->what = what;
    call->path = "/v3/kv/txn";
    call->body = req;
    call->deadline_ns = deadline_ns;
    call->idempotent = true;
    call->abort = abort;
    cerb_status st = cerb__etcd_call(e, call);
    json_decref(req);
    if (st != CERB_OK)
        return st;
    st = cerb__etcd_parse_txn(call->resp, want, succeeded, rev, responses);
    if (st != CERB_OK) {
        cerb__error_prefix("etcd %s: %s", ep(e), what);
        call->outcome = CERB_OUTCOME_UNKNOWN;
        json_decref(call->resp);
        call->resp = NULL;
    }
    return st;
}

/* The first kv of responses[i] (a range), into *out; n_kvs tells. */
static cerb_status range_at(cerb_engine *e, const json_t *responses, size_t i,
                            struct etcd_range_res *out)
{
    const json_t *rr = cerb__etcd_txn_range(responses, i);
    if (!rr) {
        memset(out, 0, sizeof *out);
        return cerb__error_set(CERB_EPROTO, "etcd %s: txn response %zu is not a range", ep(e), i);
    }
    return cerb__etcd_parse_range(rr, out);
}

/* ---- delete ---- */

/*
 * The create revision `key` has now (0: absent), by a linearizable read.
 * A delete that does not compare one must never be sent: a paused member
 * holds a request while the client re-sends it elsewhere and moves on, and
 * applies it when it resumes — an unconditional delete of K then takes the
 * key of this client's next hold of the name (K names the session and the
 * lock, not the hold; chaos etcd3 seeds 527909 and 527910).
 */
static cerb_status key_rev(cerb_engine *e, const char *key, size_t len, int64_t deadline_ns,
                           const atomic_int *abort, int64_t *rev)
{
    struct etcd_range_req r = {.key = key, .key_len = len, .keys_only = true};
    struct etcd_range_res rr = {0};
    *rev = 0;
    json_t *answer;
    cerb_status st = cerb__etcd_post(e, "key read", "/v3/kv/range", cerb__etcd_range_json(&r),
                                     deadline_ns, abort, &answer);
    if (st != CERB_OK)
        return st;
    st = cerb__etcd_parse_range(answer, &rr);
    if (st == CERB_OK && rr.n_kvs > 0)
        *rev = rr.first.create_revision;
    cerb__etcd_kv_clear(&rr.first);
    json_decref(answer);
    return st;
}

cerb_status cerb__etcd_delete_key(cerb_engine *e, const char *key, size_t len, int64_t rev,
                                  int64_t deadline_ns, const atomic_int *abort, bool *deleted)
{
    struct etcd_call call;
    bool ok = false;
    int64_t hrev, n = 0;
    const json_t *resp;

    if (deleted)
        *deleted = false;
    if (rev <= 0) {
        cerb_status st = key_rev(e, key, len, deadline_ns, abort, &rev);
        if (st != CERB_OK || rev == 0)
            return st; /* an error, or nothing to delete */
    }
    json_t *cmp = cerb__etcd_list(cerb__etcd_cmp_create(key, len, NULL, 0, "EQUAL", rev), NULL);
    if (!cmp)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    struct etcd_range_req look = {.key = key, .key_len = len, .keys_only = true};
    json_t *req = cerb__etcd_txn(cmp, cerb__etcd_list(cerb__etcd_op_delete(key, len), NULL),
                                 cerb__etcd_list(cerb__etcd_op_range(&look), NULL));
    cerb_status st = run_txn(e, "delete", req, 0, deadline_ns, abort, &call, &ok, &hrev, &resp);
    if (st != CERB_OK)
        return st;
    /* Not succeeded = the key is absent or another create revision. A
     * re-send after a lost answer that finds it absent: our first copy
     * deleted it. Present with another revision: not ours to delete. */
    bool gone = false;
    if (ok) {
        const json_t *dr = json_object_get(json_array_get(resp, 0), "response_delete_range");
        st = cerb__etcd_get_i64(dr, "deleted", &n);
    } else {
        const json_t *rr = cerb__etcd_txn_range(resp, 0);
        gone = rr && json_array_size(json_object_get(rr, "kvs")) == 0;
    }
    if (deleted)
        *deleted = ok ? (n > 0 || call.resent) : (call.resent && gone);
    json_decref(call.resp);
    return st;
}

/* Delete our key after a failed or abandoned acquire, or hand it over to
 * the session thread. Keeps the caller's last error. */
static void drop_key(cerb_engine *e, const struct etcd_key *k, int64_t rev)
{
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    /* One operation timeout: the caller's own deadline has often passed
     * (a wait gave up); a delete that cannot be confirmed by then is the
     * session thread's to finish. */
    int64_t d = cerb__deadline_in(e->ec->op_timeout_ms);
    if (cerb__etcd_delete_key(e, k->k, k->len, rev, d, NULL, NULL) != CERB_OK)
        cerb__etcd_orphan_add(e, k->k, k->len, rev);
    cerb__error_set(CERB_OK, "%s", why);
}

/* ---- acquire ---- */

struct put_result {
    bool own_exists;   /* our key exists (put now, or found) */
    int64_t mine;      /* its create revision */
    int64_t off;       /* the fence offset it was put with; -1 = none */
    int64_t owner;     /* the owner's create revision (0 = not known) */
    bool other_value;  /* election layout: our key holds another value */
};

/* Election layout: does our key `own` hold a value other than lk's? */
static bool other_value(const struct etcd_kv *own, const cerb_engine_lock *lk)
{
    size_t n = own->value ? own->value_len : 0;
    return n != lk->value_len || (n > 0 && memcmp(own->value, lk->value, n) != 0);
}

/*
 * The fence offset our key `own` (read in a txn whose responses are
 * `resp`) was put with: its value in the mutex layout (-1: none); in the
 * election layout, where the value is the candidate's, the offset key's
 * value at the key's create revision (cerb__etcd_fence_at), from the
 * offset key read as response `o_at` of the same txn. An error when that
 * cannot be known (the caller must not guess a fence).
 */
static cerb_status own_fence_offset(cerb_engine *e, bool elect, const struct etcd_kv *own,
                                    const json_t *resp, size_t o_at, int64_t deadline_ns,
                                    int64_t *off)
{
    if (!elect) {
        *off = own_offset(own);
        return CERB_OK;
    }
    const json_t *o = cerb__etcd_txn_range(resp, o_at);
    if (!o)
        return cerb__error_set(CERB_EPROTO, "etcd %s: txn response %zu is not a range", ep(e),
                               o_at);
    return cerb__etcd_fence_at(e, own->create_revision, o, deadline_ns, off);
}

/* Read our key and the owner (one read-only txn; with the fence offset key
 * in the election layout) into *pr. */
static cerb_status read_own_owner(cerb_engine *e, const struct etcd_key *k,
                                  const cerb_engine_lock *lk, bool elect, int64_t deadline_ns,
                                  struct put_result *pr, struct etcd_call *call)
{
    struct etcd_range_res own = {0}, owner = {0};
    bool ok;
    int64_t rev;
    const json_t *resp;

    memset(pr, 0, sizeof *pr);
    json_t *reads = cerb__etcd_list(op_own(k, true), op_owner(k));
    if (reads && elect && json_array_append_new(reads, cerb__etcd_fence_op_read(e))) {
        json_decref(reads);
        reads = NULL;
    }
    json_t *req = reads ? cerb__etcd_txn(NULL, reads, NULL) : NULL;
    cerb_status st = run_txn(e, "lock read", req, elect ? 3 : 2, deadline_ns, NULL, call, &ok,
                             &rev, &resp);
    if (st != CERB_OK)
        return st;
    st = range_at(e, resp, 0, &own);
    if (st == CERB_OK)
        st = range_at(e, resp, 1, &owner);
    if (st == CERB_OK) {
        pr->own_exists = own.n_kvs > 0;
        pr->mine = own.n_kvs ? own.first.create_revision : 0;
        pr->off = -1;
        if (own.n_kvs)
            st = own_fence_offset(e, elect, &own.first, resp, 2, deadline_ns, &pr->off);
        pr->other_value = elect && own.n_kvs && other_value(&own.first, lk);
        pr->owner = owner.n_kvs ? owner.first.create_revision : 0;
    }
    cerb__etcd_kv_clear(&own.first);
    cerb__etcd_kv_clear(&owner.first);
    json_decref(call->resp);
    call->resp = NULL;
    return st;
}

/*
 * The txn's compares: our key (or, trylock, the whole prefix) absent, the
 * fence offset key as cached and, when `cv` is not NULL, the closure record
 * as cached. NULL when out of memory: a txn must never go out with fewer
 * compares than it was meant to have, it would put blindly.
 */
static json_t *put_compares(cerb_engine *e, const struct etcd_key *k, bool try_only,
                            const struct etcd_fence_view *fv,
                            const struct etcd_closure_view *cv)
{
    json_t *own = try_only ? cerb__etcd_cmp_create(k->k, k->pfx_len, k->end, end_len(k),
                                                   "EQUAL", 0)
                           : cerb__etcd_cmp_create(k->k, k->len, NULL, 0, "EQUAL", 0);
    json_t *fence = cerb__etcd_fence_cmp(e, fv);
    json_t *closure = cv ? cerb__etcd_closure_cmp(e, cv) : NULL;
    json_t *list = json_array();
    bool bad = !own || !fence || (cv && !closure) || !list;
    if (!bad)
        bad = json_array_append(list, own) || json_array_append(list, fence) ||
              (closure && json_array_append(list, closure));
    json_decref(own);
    json_decref(fence);
    json_decref(closure);
    if (bad) {
        json_decref(list);
        return NULL;
    }
    return list;
}

/*
 * A refusal by the closure record `rec`: leave no key of ours behind (one
 * may exist when `maybe_put`: a lost answer's copy, or an earlier attempt's
 * key), then say why with grant outcome NO.
 */
static cerb_status refused(cerb_engine *e, const struct etcd_key *k, bool maybe_put,
                           const cerb_closure *rec, int64_t epoch, struct etcd_call *call,
                           int64_t *closed_epoch)
{
    if (maybe_put)
        drop_key(e, k, 0);
    call->outcome = CERB_OUTCOME_NO;
    call->grpc_code = -1;
    *closed_epoch = rec->epoch;
    return cerb__etcd_closure_refuse(e, rec, epoch);
}

/*
 * The acquire txn, queuing or trylock's non-queuing form. Two economies on
 * the server's side, each worth a few per cent of uncontended throughput
 * (measured against the bare put-if-absent): the `then` branch counts the
 * keys under P instead of fetching the owner (count 1 = only ours: we hold
 * it; more, and the wait loop's read finds out whether anyone is ahead),
 * and the `else` branch reads only the fence offset key (and the closure
 * record): our key exists already only after a re-send or a leftover of an
 * earlier failure (`maybe_exists`), when a separate read finds out where it
 * stands.
 *
 * The fence offset (etcd_fence.c) is compared too, and the put writes it as
 * our key's value: a compare that failed on it (the offset key changed since
 * we cached it) is learnt from the `else` branch and the txn sent again.
 * Each copy stays idempotent: a copy that landed makes every later one fail
 * on our key, and our key's value tells the offset it was put with.
 *
 * So is the closure record, for a client at an epoch (etcd_closure.c): a
 * record that changed since we cached it is read in the same `else` branch
 * and judged at that txn's revision. If it refuses our epoch we refuse,
 * after deleting any key of ours that may be there (whatever else failed
 * the txn: our key may be why); if not, the txn goes again with the new
 * mod revision. A cached record that refuses is read afresh first, and no
 * txn is sent. In steady state this is one compare more in the same txn
 * (measured: the same 2 requests per acquire + release, a few per cent
 * more latency on a loaded 2-core machine).
 */
static cerb_status put_txn(cerb_engine *e, const struct etcd_key *k, int64_t lease, bool try_only,
                           bool maybe_exists, const cerb_engine_lock *lk, bool elect,
                           int64_t deadline_ns, struct put_result *pr, struct etcd_call *call,
                           int64_t *closed_epoch)
{
    const uint64_t floor = lk->fence_floor;
    const int64_t epoch = lk->epoch;
    bool ok = false;
    int64_t rev = 0;
    const json_t *resp;
    struct etcd_fence_view fv;
    struct etcd_closure_view cv;
    /* A client at epoch -1 (the probe, a client with one engine) is never
     * refused: its txn leaves the record out altogether. */
    const bool check = epoch >= 0;
    cerb_status st;
    /* An earlier round's txn may have put our key (its answer was lost and
     * its re-send failed on the offset): a failure now is no "not put". */
    bool landed = false;

    *closed_epoch = 0;
    for (int round = 0;; round++) {
        memset(pr, 0, sizeof *pr);
        memset(call, 0, sizeof *call);
        call->grpc_code = -1;
        call->outcome = landed ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
        if (round > MAX_RESTARTS)
            return cerb__error_set(CERB_EIO,
                                   "etcd %s: the fence offset key %s or the closure record %s "
                                   "kept changing",
                                   ep(e), e->fence.key, e->closure.key);
        st = cerb__etcd_fence_prepare(e, floor, deadline_ns, &fv);
        if (st != CERB_OK)
            return st;
        if (check) {
            cerb__etcd_closure_view(e, &cv);
            if (cerb__etcd_closure_refuses(&cv.rec, epoch)) {
                /* Refuse only on what the server has now (etcd_closure.c). */
                st = cerb__etcd_closure_read(e, deadline_ns, &cv);
                if (st != CERB_OK)
                    return st;
                if (cerb__etcd_closure_refuses(&cv.rec, epoch))
                    return refused(e, k, maybe_exists || landed || !try_only, &cv.rec, epoch,
                                   call, closed_epoch);
            }
        }
        /* The key's value: the offset (mutex layout) or the candidate's
         * value (election layout, etcdctl elect's: the offset is then
         * found from the offset key itself, cerb__etcd_fence_at). */
        char off_text[24];
        const char *val = off_text;
        size_t vn = cerb__etcd_fence_format(fv.offset, off_text, sizeof off_text);
        if (elect) {
            val = lk->value;
            vn = lk->value_len;
        }
        json_t *cmp = put_compares(e, k, try_only, &fv, check ? &cv : NULL), *succ, *fail;
        if (try_only)
            succ = cerb__etcd_list(cerb__etcd_op_put(k->k, k->len, val, vn, lease), NULL);
        else
            succ = cerb__etcd_list(cerb__etcd_op_put(k->k, k->len, val, vn, lease), op_count(k));
        fail = cerb__etcd_list(cerb__etcd_fence_op_read(e),
                               check ? cerb__etcd_closure_op_read(e) : NULL);
        if (!cmp || !succ || !fail || (check && json_array_size(fail) != 2)) {
            json_decref(cmp);
            json_decref(succ);
            json_decref(fail);
            return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
        }
        ETCD_COUNT(e, acquire_calls);
        st = run_txn(e, try_only ? "trylock txn" : "lock txn", cerb__etcd_txn(cmp, succ, fail), 0,
                     deadline_ns, NULL, call, &ok, &rev, &resp);
        if (st != CERB_OK) {
            if (landed)
                call->outcome = CERB_OUTCOME_UNKNOWN;
            return st;
        }
        if (ok)
            break;
        bool changed = false, closure_changed = false;
        st = cerb__etcd_fence_learn(e, cerb__etcd_txn_range(resp, 0), rev, &fv, &changed);
        if (st == CERB_OK && check)
            st = cerb__etcd_closure_learn(e, cerb__etcd_txn_range(resp, 1), rev, &cv,
                                          &closure_changed);
        /* A copy of this txn may have put our key before the answer was
         * lost: the next round must look for it. */
        maybe_exists = maybe_exists || call->resent;
        landed = landed || call->resent;
        json_decref(call->resp);
        call->resp = NULL;
        if (st != CERB_OK) {
            call->outcome = CERB_OUTCOME_UNKNOWN;
            return st;
        }
        /* The record as of this txn's revision refuses us: whatever else
         * failed the txn (our key there already, when queuing), nothing of
         * ours may stay queued. */
        if (check && cerb__etcd_closure_refuses(&cv.rec, epoch))
            return refused(e, k, maybe_exists || !try_only, &cv.rec, epoch, call, closed_epoch);
        if (!changed && !closure_changed)
            break; /* our key, or (trylock) anyone's, is what failed it */
    }
    size_t n = json_array_size(resp);
    if (ok && try_only && n == 1) {
        /* Nobody was there: ours is the only key, the put's revision. */
        pr->own_exists = true;
        pr->mine = pr->owner = rev;
        pr->off = fv.offset;
    } else if (ok && !try_only && n == 2) {
        struct etcd_range_res count = {0};
        st = range_at(e, resp, 1, &count);
        pr->own_exists = true;
        pr->mine = rev;
        pr->off = fv.offset;
        pr->owner = count.count == 1 ? rev : 0;
        cerb__etcd_kv_clear(&count.first);
    } else if (ok) {
        st = cerb__error_set(CERB_EPROTO, "etcd %s: lock txn: %zu responses", ep(e), n);
    }
    bool resent = call->resent;
    json_decref(call->resp);
    call->resp = NULL;
    if (st != CERB_OK) {
        call->outcome = CERB_OUTCOME_UNKNOWN;
        return st;
    }
    if (!ok && (!try_only || resent || maybe_exists)) {
        /* Our key was there already: a copy of this txn landed before, or
         * a key of an earlier attempt survived. Where is it? */
        st = read_own_owner(e, k, lk, elect, deadline_ns, pr, call);
        if (st != CERB_OK)
            call->outcome = CERB_OUTCOME_UNKNOWN;
    }
    return st;
}

/* What the wait loop's read found. */
struct wait_read {
    bool own_exists;
    int64_t mine;
    int64_t header;      /* revision of the read */
    bool has_pred;
    struct etcd_kv pred; /* the key just ahead (clear it) */
};

static cerb_status wait_read(cerb_engine *e, const struct etcd_key *k, int64_t mine,
                             int64_t deadline_ns, struct wait_read *wr)
{
    struct etcd_range_req pred = {.key = k->k,
                                  .key_len = k->pfx_len,
                                  .end = k->end,
                                  .end_len = end_len(k),
                                  .limit = 1,
                                  .sort_order = ETCD_SORT_DESCEND,
                                  .sort_target = ETCD_TARGET_CREATE,
                                  .max_create_revision = mine - 1,
                                  .keys_only = true};
    struct etcd_call call;
    struct etcd_range_res rp = {0}, ro = {0};
    bool ok;
    const json_t *resp;

    memset(wr, 0, sizeof *wr);
    json_t *req = cerb__etcd_txn(
        NULL, cerb__etcd_list(cerb__etcd_op_range(&pred), op_own(k, false)), NULL);
    /* Not past the waiter's deadline: a read that cannot finish by then
     * is of no use to it. */
    int64_t d = min64(deadline_ns, cerb__deadline_in(e->ec->op_timeout_ms));
    cerb_status st = run_txn(e, "wait read", req, 2, d, NULL, &call, &ok, &wr->header, &resp);
    if (st != CERB_OK)
        return st;
    st = range_at(e, resp, 0, &rp);
    if (st == CERB_OK)
        st = range_at(e, resp, 1, &ro);
    if (st == CERB_OK) {
        wr->own_exists = ro.n_kvs > 0;
        wr->mine = ro.n_kvs ? ro.first.create_revision : 0;
        cerb__etcd_kv_clear(&ro.first);
        wr->has_pred = rp.n_kvs > 0;
        wr->pred = rp.first; /* moved */
    } else {
        cerb__etcd_kv_clear(&rp.first);
        cerb__etcd_kv_clear(&ro.first);
    }
    json_decref(call.resp);
    return st;
}

enum turn { TURN_OWNER, TURN_RESTART, TURN_STOP };

/* Nap up to ms, in slices, returning early on an interrupt or deadline. */
static void nap_watching(int64_t ms, int64_t deadline_ns, const atomic_int *intr)
{
    int64_t until = min64(cerb__deadline_in(ms), deadline_ns);
    while (cerb_monotime() < until && !(intr && atomic_load(intr))) {
        int64_t left = cerb__ms_left(until);
        cerb__nap_ms(min64(left, ETCD_SLICE_MS));
    }
}

/*
 * Wait until our key (create revision *mine) is the first under the
 * prefix. TURN_OWNER; TURN_RESTART (our key or session is gone); TURN_STOP
 * with the status in *st (TIMEOUT, INTERRUPTED, or an error that lasted
 * longer than the error budget).
 */
static enum turn wait_turn(cerb_engine *e, cerb_engine_lock *lk, const struct etcd_key *k,
                           int64_t deadline_ns, const atomic_int *intr, int64_t *mine,
                           cerb_status *st)
{
    struct etcd_lock_priv *p = lk->priv;
    int64_t err_since = 0;
    int64_t budget_ns = max64(3 * e->ec->op_timeout_ms, ETCD_ERR_BUDGET_MS) * CERB_NS_PER_MS;

    for (;;) {
        struct etcd_session s;
        struct wait_read wr;

        if (intr && atomic_load(intr)) {
            *st = cerb__error_set(CERB_INTERRUPTED, "wait for \"%s\" interrupted", lk->name);
            return TURN_STOP;
        }
        if (cerb_monotime() >= deadline_ns) {
            *st = cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out", lk->name);
            return TURN_STOP;
        }
        cerb__etcd_session_peek(e, &s);
        if (s.gen != p->gen || !s.live)
            return TURN_RESTART;

        cerb_status rs = wait_read(e, k, *mine, deadline_ns, &wr);
        if (rs == CERB_OK) {
            err_since = 0;
            if (!wr.own_exists) {
                cerb__etcd_kv_clear(&wr.pred);
                CERB_LOG_I("etcd %s: key %s vanished while waiting; queuing again", ep(e), k->k);
                return TURN_RESTART;
            }
            *mine = wr.mine;
            if (!wr.has_pred)
                return TURN_OWNER;
            enum etcd_watch_end end;
            int64_t until = min64(deadline_ns, cerb__deadline_in(ETCD_RECHECK_MS));
            rs = cerb__etcd_watch_delete(e, lk, wr.pred.key, wr.pred.key_len,
                                         wr.pred.create_revision, wr.header, until, intr, p->gen,
                                         &end);
            cerb__etcd_kv_clear(&wr.pred);
            if (rs == CERB_OK) {
                if (end == ETCD_WATCH_DELETED)
                    ETCD_COUNT(e, wakeups);
                continue;
            }
        }
        /* A failure: members come and go (an election takes ~1 s), so
         * keep our place in the queue for a while before giving up. */
        int64_t now = cerb_monotime();
        if (err_since == 0)
            err_since = now;
        if (now - err_since >= budget_ns) {
            *st = rs;
            return TURN_STOP;
        }
        nap_watching(20 + (int64_t)cerb__rand_below(60), deadline_ns, intr);
    }
}

/*
 * A grant as the session vouches for it: good until the send time of the
 * last good keepalive + the TTL. It is given from now — sent_ns = now and
 * ttl_ms = what is left of that, less 2 % — rather than as (keepalive send
 * time, TTL): the core schedules the next renewal at sent_ns + lease/3, and
 * a keepalive time up to TTL/3 old put that in the past, so the watchdog
 * renewed in a busy loop (measured: 79 % of a core for 10 000 holds; 4 %
 * this way). The core's deadline, sent + ttl less its drift, stays before
 * the lease's earliest end: now + (k + TTL − TTL/50 − now) × (1 − drift)
 * <= k + 0.98 TTL. False when (almost) nothing is left: the session is
 * about to be declared lost.
 */
static bool grant_fill(cerb_engine *e, const struct etcd_session *s, int64_t fence, cerb_grant *g)
{
    int64_t now = cerb_monotime();
    int64_t ttl = e->ttl_s * 1000 * CERB_NS_PER_MS;
    int64_t left_ms = (s->ok_sent_ns + ttl - ttl / 50 - now) / CERB_NS_PER_MS;
    if (left_ms < 1)
        return false;
    g->fence = (uint64_t)fence;
    g->sent_ns = now;
    g->ttl_ms = left_ms;
    g->outcome = CERB_OUTCOME_YES;
    return true;
}

/* Wait (bounded) until the session moves past generation `gen`. */
static void await_new_session(cerb_engine *e, uint64_t gen, int64_t deadline_ns)
{
    struct etcd_session s;
    cerb__etcd_session_doubt(e, gen);
    int64_t until = min64(deadline_ns, cerb__deadline_in(e->ec->op_timeout_ms));
    do {
        cerb__etcd_session_peek(e, &s);
        if (s.gen != gen)
            return;
        cerb__nap_ms(10);
    } while (cerb_monotime() < until);
}

static cerb_status acquire_as(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                              const atomic_int *interrupted, cerb_grant *grant, bool elect)
{
    struct etcd_lock_priv *p = lk->priv;
    const bool try_only = deadline_ns == 0;
    const int64_t op_ns = e->ec->op_timeout_ms * CERB_NS_PER_MS;
    cerb_status st = CERB_OK;

    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    for (int restarts = 0;; restarts++) {
        struct etcd_session s;
        struct etcd_key k;
        struct etcd_call call;
        struct put_result pr;
        int64_t now = cerb_monotime();

        if (restarts > MAX_RESTARTS)
            return cerb__error_set(CERB_EIO, "etcd %s: \"%s\": our key kept vanishing", ep(e),
                                   lk->name);
        if (!try_only && restarts > 0 && now >= deadline_ns)
            return cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out", lk->name);
        st = cerb__etcd_session_get(e, now + op_ns, &s);
        if (st != CERB_OK)
            return st;
        st = cerb__etcd_key_init(&k, e->ec->prefix, lk->name, s.id);
        if (st != CERB_OK)
            return st;
        /* A key of this hold's earlier attempt (same lease) may exist. */
        bool maybe_exists = restarts == 0 && p->lease == s.id && p->gen == s.gen;
        p->lease = s.id;
        p->gen = s.gen;
        p->rev = 0;
        bool orphaned = false;
        st = cerb__etcd_claim(e, lk, &k, s.id, false, now + op_ns, &orphaned);
        if (st != CERB_OK) {
            cerb__etcd_key_free(&k);
            return st == CERB_BUSY ? CERB_EIO : st;
        }
        if (orphaned) {
            /* The key had a delete pending (an unlock or give-up whose
             * answer never came): that request may still be held by a
             * paused member, and would take the key the moment it is
             * applied. Never adopt such a key: delete it (at its own
             * create revision) and put a new one, whose revision the old
             * request does not name. */
            cerb_status ds = cerb__etcd_delete_key(e, k.k, k.len, 0, now + op_ns, NULL, NULL);
            if (ds != CERB_OK) {
                cerb__etcd_orphan_add(e, k.k, k.len, 0);
                cerb__etcd_unclaim(e, lk);
                cerb__etcd_key_free(&k);
                return ds;
            }
        }

        /* The txn is idempotent: re-sent until definite, for one operation
         * timeout when the caller may not wait longer, else within its
         * deadline and the error budget. */
        int64_t req_deadline = now + op_ns;
        if (!try_only && deadline_ns - now > op_ns)
            req_deadline = min64(deadline_ns,
                                 now + max64(op_ns, ETCD_ERR_BUDGET_MS * CERB_NS_PER_MS));
        int64_t closed_epoch = 0;
        st = put_txn(e, &k, s.id, try_only, maybe_exists, lk, elect, req_deadline, &pr, &call,
                     &closed_epoch);
        if (st != CERB_OK) {
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            if (closed_epoch > 0) {
                grant->outcome = CERB_OUTCOME_NO;
                grant->closed_epoch = closed_epoch;
                return st;
            }
            if (call.grpc_code == ETCD_GRPC_NOT_FOUND && call.outcome == CERB_OUTCOME_NO) {
                /* "requested lease not found": our session is gone. */
                await_new_session(e, s.gen, try_only ? now + op_ns : deadline_ns);
                continue;
            }
            grant->outcome = call.outcome;
            return st;
        }
        if (!pr.own_exists) {
            /* trylock found it busy and put nothing. */
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            return cerb__error_set(CERB_BUSY, "etcd %s: \"%s\" is held by another owner", ep(e),
                                   lk->name);
        }
        int64_t mine = pr.mine;
        enum turn t = TURN_OWNER;
        if (pr.owner != mine && try_only) {
            /* A key of ours left queued by an earlier failure: remove
             * it, trylock never queues. */
            drop_key(e, &k, mine);
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            return cerb__error_set(CERB_BUSY, "etcd %s: \"%s\" is held by another owner",
                                   ep(e), lk->name);
        }
        if (pr.off < 0 || (lk->fence_floor > 0 && (uint64_t)(mine + pr.off) <= lk->fence_floor)) {
            /* A key of ours from an earlier attempt that this engine's txn
             * did not put (no offset in it), or put before the offset was
             * raised for this floor: its fence would not rank where this
             * grant must. Queue again with a fresh key. */
            CERB_LOG_I("etcd %s: key %s (revision %lld, offset %lld) is no key to grant "
                       "above fence floor %llu; queuing again",
                       ep(e), k.k, (long long)mine, (long long)pr.off,
                       (unsigned long long)lk->fence_floor);
            drop_key(e, &k, mine);
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            continue;
        }
        if (pr.other_value) {
            /* Election layout: a key of ours put by another attempt with
             * another value (Go's Campaign proclaims then too). Ours goes
             * in before we queue or lead: a leader's value is never an
             * earlier campaign's. */
            bool put = false;
            cerb_outcome oc;
            st = cerb__etcd_put_at_rev(e, k.k, k.len, mine, s.id, lk->value, lk->value_len,
                                       req_deadline, &put, &oc);
            if (st != CERB_OK || !put) {
                drop_key(e, &k, mine);
                cerb__etcd_unclaim(e, lk);
                cerb__etcd_key_free(&k);
                if (st != CERB_OK)
                    return st;
                continue; /* the key went meanwhile: queue again */
            }
        }
        if (pr.owner != mine)
            t = wait_turn(e, lk, &k, deadline_ns, interrupted, &mine, &st);
        if (t == TURN_STOP) {
            drop_key(e, &k, mine);
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            return st;
        }
        if (t == TURN_RESTART) {
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            continue;
        }
        /* Ours. Make sure it is on the session still in force: a grant on
         * a lease the session thread has just given up would be reported
         * LOST by nobody. */
        struct etcd_session now_s;
        cerb__etcd_session_peek(e, &now_s);
        if (now_s.gen != s.gen || !now_s.live) {
            drop_key(e, &k, mine);
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            continue;
        }
        p->rev = mine;
        p->off = pr.off;
        if (!grant_fill(e, &now_s, mine + pr.off, grant)) {
            /* The session is about to be given up: so is this grant. */
            drop_key(e, &k, mine);
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_key_free(&k);
            await_new_session(e, now_s.gen, try_only ? cerb__deadline_in(e->ec->op_timeout_ms)
                                                      : deadline_ns);
            continue;
        }
        cerb__etcd_key_free(&k);
        return CERB_OK; /* the claim stays until release */
    }
}

cerb_status cerb__etcd_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                  const atomic_int *interrupted, cerb_grant *grant)
{
    return acquire_as(e, lk, deadline_ns, interrupted, grant, false);
}

cerb_status cerb__etcd_elect_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                     const atomic_int *interrupted, cerb_grant *grant)
{
    return acquire_as(e, lk, deadline_ns, interrupted, grant, true);
}

/* ---- renew, release, check ---- */

/*
 * No round trip: the session thread keeps the lease alive, and a hold is as
 * good as its session. OK with the last good keepalive's send time; EIO
 * while keepalives fail (SUSPECT); NOT_OWNER once the session is gone.
 */
cerb_status cerb__etcd_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct etcd_lock_priv *p = lk->priv;
    struct etcd_session s;

    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    cerb__etcd_session_peek(e, &s);
    if (!p->lease || p->gen != s.gen || !s.live)
        return cerb__error_set(CERB_NOT_OWNER,
                               "etcd %s: \"%s\": the session (lease %llx) holding it has ended",
                               ep(e), lk->name, (unsigned long long)p->lease);
    if (s.suspect || !grant_fill(e, &s, p->rev + p->off, grant)) {
        grant->outcome = CERB_OUTCOME_NO;
        return cerb__error_set(CERB_EIO,
                               "etcd %s: \"%s\": session keepalives are failing (lease %llx)",
                               ep(e), lk->name, (unsigned long long)p->lease);
    }
    return CERB_OK;
}

/*
 * Release. The holder (the hold with the claim on the key) deletes it only
 * if its create revision is still this hold's. A plain deleterange costs the
 * server less, but K names the session and the lock, not the hold: this
 * client puts the same K for its next hold of the name, and a delete that
 * a paused member kept while the request was re-sent elsewhere is applied
 * when that member resumes — it would take the next hold's key while that
 * holder is VALID (chaos etcd3, test_etcd_cluster). A hold without the claim
 * is one whose acquire failed and which the core releases in the background
 * in case the acquire landed after all: it deletes the key only when no
 * current hold of this client uses it (same key!), by a temporary claim.
 */
cerb_status cerb__etcd_op_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct etcd_lock_priv *p = lk->priv;
    struct etcd_session s;
    struct etcd_key k;
    cerb_status st;

    if (!p->lease)
        return cerb__error_set(CERB_NOT_OWNER, "etcd: \"%s\" was never put", lk->name);
    cerb__etcd_session_peek(e, &s);
    bool holder = cerb__etcd_claimed(e, lk);
    if (p->gen != s.gen) {
        /* Its lease ended (or is being revoked): the key went with it. */
        cerb__etcd_unclaim(e, lk);
        return cerb__error_set(CERB_NOT_OWNER,
                               "etcd %s: \"%s\": the session (lease %llx) holding it has ended",
                               ep(e), lk->name, (unsigned long long)p->lease);
    }
    st = cerb__etcd_key_init(&k, e->ec->prefix, lk->name, p->lease);
    if (st != CERB_OK)
        return st;
    /* Re-sent until definite for two operation timeouts; after that the
     * session thread keeps trying (an orphan), so unlock stays bounded. */
    int64_t d = cerb__deadline_in(2 * e->ec->op_timeout_ms);
    if (holder) {
        bool deleted = false;
        st = cerb__etcd_delete_key(e, k.k, k.len, p->rev, d, NULL, &deleted);
        if (st == CERB_OK && !deleted)
            st = cerb__error_set(CERB_NOT_OWNER,
                                 "etcd %s: \"%s\" is no longer held by this session (key %s "
                                 "is gone)",
                                 ep(e), lk->name, k.k);
        if (st != CERB_OK && st != CERB_NOT_OWNER)
            cerb__etcd_orphan_add(e, k.k, k.len, p->rev);
        cerb__etcd_unclaim(e, lk);
    } else {
        st = cerb__etcd_claim(e, lk, &k, p->lease, true, d, NULL);
        if (st == CERB_BUSY) {
            st = cerb__error_set(CERB_NOT_OWNER, "etcd: \"%s\": the key is another hold's now",
                                 lk->name);
        } else if (st == CERB_OK) {
            bool deleted = false;
            st = cerb__etcd_delete_key(e, k.k, k.len, p->rev, d, NULL, &deleted);
            if (st == CERB_OK && !deleted)
                st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\" is not held (key %s)",
                                     ep(e), lk->name, k.k);
            else if (st != CERB_OK)
                cerb__etcd_orphan_add(e, k.k, k.len, p->rev);
            cerb__etcd_unclaim(e, lk);
        }
    }
    cerb__etcd_key_free(&k);
    return st;
}

/*
 * Is lk the holder? Used by the core to settle an acquire whose answer was
 * lost, so the hold usually has no claim: take a temporary one (unless the
 * key is another hold's), read our key and the owner, and keep the claim
 * only if we hold the lock. A key of ours that is queued is nobody's: it
 * goes.
 */
static cerb_status check_as(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant, bool elect)
{
    struct etcd_lock_priv *p = lk->priv;
    struct etcd_session s;
    struct etcd_key k;
    struct etcd_call call;
    struct etcd_range_res own = {0}, owner = {0};
    bool ok;
    int64_t rev;
    const json_t *resp;

    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    if (!p->lease)
        return cerb__error_set(CERB_NOT_OWNER, "etcd: \"%s\" was never put", lk->name);
    cerb__etcd_session_peek(e, &s);
    if (p->gen != s.gen || !s.live)
        return cerb__error_set(CERB_NOT_OWNER,
                               "etcd %s: \"%s\": the session (lease %llx) of this hold has ended",
                               ep(e), lk->name, (unsigned long long)p->lease);
    cerb_status st = cerb__etcd_key_init(&k, e->ec->prefix, lk->name, p->lease);
    if (st != CERB_OK)
        return st;
    int64_t d = cerb__deadline_in(e->ec->op_timeout_ms);
    bool temp = !cerb__etcd_claimed(e, lk);
    if (temp) {
        st = cerb__etcd_claim(e, lk, &k, p->lease, true, d, NULL);
        if (st != CERB_OK) {
            cerb__etcd_key_free(&k);
            if (st == CERB_BUSY)
                return cerb__error_set(CERB_NOT_OWNER,
                                       "etcd: \"%s\": the key is another hold's now", lk->name);
            return st;
        }
    }
    json_t *reads = cerb__etcd_list(op_own(&k, true), op_owner(&k));
    if (reads && elect && json_array_append_new(reads, cerb__etcd_fence_op_read(e))) {
        json_decref(reads);
        reads = NULL;
    }
    json_t *req = reads ? cerb__etcd_txn(NULL, reads, NULL) : NULL;
    st = run_txn(e, "check txn", req, elect ? 3 : 2, d, NULL, &call, &ok, &rev, &resp);
    int64_t off = -1;
    if (st == CERB_OK) {
        st = range_at(e, resp, 0, &own);
        if (st == CERB_OK)
            st = range_at(e, resp, 1, &owner);
        /* The election layout's offset may take a read at our revision:
         * when it cannot be known the check is no answer (the hold stays
         * unsettled), never a grant with a guessed fence. */
        if (st == CERB_OK && own.n_kvs)
            st = own_fence_offset(e, elect, &own.first, resp, 2, d, &off);
        json_decref(call.resp);
    }
    bool keep = false;
    if (st == CERB_OK) {
        int64_t mine = own.n_kvs ? own.first.create_revision : 0;
        int64_t first = owner.n_kvs ? owner.first.create_revision : 0;
        /* A key our acquire txn put carries its offset, and is above the
         * floor that acquire was asked for. */
        bool fence_ok = off >= 0 && (lk->fence_floor == 0 ||
                                     (uint64_t)(mine + off) > lk->fence_floor);
        cerb__etcd_session_peek(e, &s);
        if (!mine) {
            st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\": no key of this session", ep(e),
                                 lk->name);
        } else if (mine == first && fence_ok && s.gen == p->gen && s.live &&
                   grant_fill(e, &s, mine + off, grant)) {
            p->rev = mine;
            p->off = off;
            keep = true;
            if (elect && temp && other_value(&own.first, lk)) {
                /* Election layout, settling an acquire that never heard
                 * its answer (no claim yet): the key holds another
                 * attempt's value, and the term leads with ours, as
                 * acquire makes it. A term that has the claim may have
                 * proclaimed since: its value is left alone. */
                bool put = false;
                cerb_outcome oc;
                st = cerb__etcd_put_at_rev(e, k.k, k.len, mine, p->lease, lk->value,
                                           lk->value_len, d, &put, &oc);
                if (st == CERB_OK && !put)
                    st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\": key %s is gone",
                                         ep(e), lk->name, k.k);
                if (st != CERB_OK) {
                    keep = false;
                    grant->outcome = CERB_OUTCOME_NO;
                }
            }
        } else {
            /* Queued (an acquire whose answer was lost), on a session we
             * have given up, or not a key our acquire put (no offset, or
             * below its floor): nobody will use it, so it must go. */
            drop_key(e, &k, mine);
            st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\" is not held by this session",
                                 ep(e), lk->name);
        }
    }
    if (temp && keep)
        cerb__etcd_claim_keep(e, lk);
    else if (temp)
        cerb__etcd_unclaim(e, lk);
    cerb__etcd_kv_clear(&own.first);
    cerb__etcd_kv_clear(&owner.first);
    cerb__etcd_key_free(&k);
    return st;
}

cerb_status cerb__etcd_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    return check_as(e, lk, grant, false);
}

cerb_status cerb__etcd_elect_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    return check_as(e, lk, grant, true);
}

void cerb__etcd_op_cancel(cerb_engine *e, cerb_engine_lock *lk)
{
    struct etcd_lock_priv *p = lk->priv;
    if (!p)
        return;
    cerb__mutex_lock(&e->wait_mu);
    p->cancelled = true;
    /* Thread-safe and non-blocking: the waiter's curl_multi_poll returns. */
    if (p->multi)
        curl_multi_wakeup((CURLM *)p->multi);
    cerb__mutex_unlock(&e->wait_mu);
}

/* ---- for the queued primitives (etcd_queue.c) ---- */

cerb_status cerb__etcd_run_txn(cerb_engine *e, const char *what, json_t *req, size_t want,
                               int64_t deadline_ns, struct etcd_call *call, bool *succeeded,
                               int64_t *rev, const json_t **responses)
{
    return run_txn(e, what, req, want, deadline_ns, NULL, call, succeeded, rev, responses);
}

void cerb__etcd_drop_key(cerb_engine *e, const char *key, size_t len, int64_t rev)
{
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    int64_t d = cerb__deadline_in(e->ec->op_timeout_ms);
    if (cerb__etcd_delete_key(e, key, len, rev, d, NULL, NULL) != CERB_OK)
        cerb__etcd_orphan_add(e, key, len, rev);
    cerb__error_set(CERB_OK, "%s", why);
}

bool cerb__etcd_grant_fill(cerb_engine *e, const struct etcd_session *s, int64_t fence,
                           cerb_grant *g)
{
    return grant_fill(e, s, fence, g);
}

void cerb__etcd_await_session(cerb_engine *e, uint64_t gen, int64_t deadline_ns)
{
    await_new_session(e, gen, deadline_ns);
}

void cerb__etcd_nap(int64_t ms, int64_t deadline_ns, const atomic_int *intr)
{
    nap_watching(ms, deadline_ns, intr);
}
