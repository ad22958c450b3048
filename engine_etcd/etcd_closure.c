/*
 * etcd_closure.c — the switch closure record (engine table version 4,
 * DESIGN.md §5): what `cerberus switch`, and every client that follows the
 * file to a new epoch, writes on an engine it leaves ("closed from epoch E
 * on") or keeps ("open from epoch E on"), so that the grant step here
 * refuses a client still at an older epoch, which then reloads.
 *
 * Layout. One key per cluster and etcd.prefix, C = <prefix>__cerberus_closure__,
 * without a lease (permanent: one small key per prefix), whose value is the
 * text "<epoch> closed" or "<epoch> open" (epoch in decimal, > 0); absent
 * means no record (epoch 0). No lock can reach it, for the reason the fence
 * offset key gives (etcd_fence.c): a lock's range is everything under
 * <prefix><name>/ and names hold no '/', so a key with no '/' after the
 * prefix is in no lock's range; guard records are <prefix>cerb:guard:<hex>.
 * A value that is not exactly one of the two forms is an error wherever it
 * is read, never "no record": a record that cannot be read must not let a
 * client of a refused epoch in.
 *
 * Raise only. closure_put sends one txn:
 *     if mod_revision(C) == m then put C = rec else range C
 * where m is the mod revision of the record this instance last saw (0 while
 * absent: etcd compares a missing key as zero-valued). A lost race reads the
 * winner in the same round trip, and put decides again from what it read:
 * done when the stored epoch is already >= ours, else the txn once more on
 * the new m. A copy re-sent after a lost answer that had landed fails its
 * compare and reads our own record back, which ends the call as done: the
 * call is idempotent, as the core needs (it re-sends after an error).
 *
 * The check in acquire (etcd_mutex.c). In etcd's concurrency.Mutex a queued
 * key becomes the holder with no further write, so the check must guard the
 * put of the key: the acquire txn compares mod_revision(C) with the m cached
 * here and reads C in its failure branch. The key is put only if the record
 * is still the one that was judged to allow the client's epoch, and a record
 * written since is learnt without another round trip, after which the
 * acquire decides again. So once a record is stored, no key of an epoch it
 * refuses enters the queue; keys queued before it may still be granted, and
 * held() counts them. In steady state the compare costs no round trip: the
 * cache is right, and it is the same txn.
 *
 * A cached record that refuses is read again before a refusal: records only
 * rise, so it would still refuse, unless an operator deleted C by hand, and
 * a refusal is rare (a client about to reload) while a wrong one would keep
 * a client out until it is reopened.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

/* Rounds of write-and-learn before closure_put gives up on a record that
 * keeps changing under it (every round means another client wrote it). */
#define CLOSURE_TRIES 8

static const char closure_suffix[] = "__cerberus_closure__";

static const char *ep(cerb_engine *e) { return cerb__etcd_endpoint(&e->http); }

cerb_status cerb__etcd_closure_init(cerb_engine *e)
{
    struct etcd_closure *c = &e->closure;
    size_t pl = e->ec->prefix ? strlen(e->ec->prefix) : 0;
    memset(c, 0, sizeof *c);
    c->key = cerb__malloc(pl + sizeof closure_suffix);
    if (!c->key)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    if (pl)
        memcpy(c->key, e->ec->prefix, pl);
    memcpy(c->key + pl, closure_suffix, sizeof closure_suffix);
    c->key_len = pl + sizeof closure_suffix - 1;
    cerb__mutex_init(&c->mu);
    return CERB_OK;
}

void cerb__etcd_closure_destroy(cerb_engine *e)
{
    if (!e->closure.key)
        return;
    cerb__mutex_destroy(&e->closure.mu);
    cerb__free(e->closure.key);
    e->closure.key = NULL;
}

/*
 * "<epoch> closed" or "<epoch> open", nothing else: the epoch a decimal
 * without sign, blanks or leading zeros, > 0 and within int64.
 */
static bool parse_record(const char *s, size_t n, cerb_closure *out)
{
    size_t i = 0;
    int64_t v = 0;

    if (!s || n == 0 || s[0] < '1' || s[0] > '9')
        return false;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    const char *rest = s + i;
    size_t rn = n - i;
    if (rn == 7 && memcmp(rest, " closed", 7) == 0)
        out->closed = 1;
    else if (rn == 5 && memcmp(rest, " open", 5) == 0)
        out->closed = 0;
    else
        return false;
    out->epoch = v;
    return true;
}

/* Keep what was seen at revision `rev` unless the cache knows a later
 * state (two threads learning out of order). Under c->mu. */
static void take(struct etcd_closure *c, const struct etcd_closure_view *v, int64_t rev)
{
    if (rev < c->as_of)
        return;
    c->view = *v;
    c->as_of = rev;
}

void cerb__etcd_closure_view(cerb_engine *e, struct etcd_closure_view *v)
{
    struct etcd_closure *c = &e->closure;
    cerb__mutex_lock(&c->mu);
    *v = c->view;
    cerb__mutex_unlock(&c->mu);
}

bool cerb__etcd_closure_refuses(const cerb_closure *rec, int64_t epoch)
{
    return epoch >= 0 && (rec->epoch > epoch || (rec->epoch == epoch && rec->closed));
}

cerb_status cerb__etcd_closure_refuse(cerb_engine *e, const cerb_closure *rec, int64_t epoch)
{
    return cerb__error_set(CERB_UNAVAILABLE,
                           "etcd %s: closed by a switch at epoch %" PRId64
                           "; this client is at epoch %" PRId64 ": reload the configuration",
                           ep(e), rec->epoch, epoch);
}

json_t *cerb__etcd_closure_cmp(cerb_engine *e, const struct etcd_closure_view *v)
{
    const struct etcd_closure *c = &e->closure;
    return cerb__etcd_cmp_key(c->key, c->key_len, ETCD_TARGET_MOD, "EQUAL", v->mod);
}

json_t *cerb__etcd_closure_op_read(cerb_engine *e)
{
    struct etcd_range_req r = {.key = e->closure.key, .key_len = e->closure.key_len};
    return cerb__etcd_op_range(&r);
}

cerb_status cerb__etcd_closure_learn(cerb_engine *e, const json_t *range, int64_t rev,
                                     struct etcd_closure_view *v, bool *changed)
{
    struct etcd_closure *c = &e->closure;
    struct etcd_range_res rr = {0};
    struct etcd_closure_view got = {0};

    *changed = false;
    if (!range)
        return cerb__error_set(CERB_EPROTO, "etcd %s: the closure record read is not a range",
                               ep(e));
    cerb_status st = cerb__etcd_parse_range(range, &rr);
    if (st != CERB_OK)
        return st;
    if (rr.n_kvs > 0) {
        got.mod = rr.first.mod_revision;
        if (!parse_record(rr.first.value, rr.first.value_len, &got.rec))
            st = cerb__error_set(CERB_EPROTO,
                                 "etcd %s: the closure record %s holds \"%.40s\", not "
                                 "\"<epoch> closed\" or \"<epoch> open\"",
                                 ep(e), c->key, rr.first.value ? rr.first.value : "");
    }
    cerb__etcd_kv_clear(&rr.first);
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&c->mu);
    take(c, &got, rev);
    cerb__mutex_unlock(&c->mu);
    *changed = got.mod != v->mod;
    *v = got;
    return CERB_OK;
}

cerb_status cerb__etcd_closure_read(cerb_engine *e, int64_t deadline_ns,
                                    struct etcd_closure_view *v)
{
    /* A plain range is linearizable: it is ordered after every write
     * acknowledged before it, grants included. */
    json_t *resp;
    int64_t rev = 0;
    bool changed;
    cerb_status st = cerb__etcd_read_key(e, e->closure.key, e->closure.key_len,
                                         "closure record read", deadline_ns, &resp, &rev);
    if (st != CERB_OK)
        return st;
    st = cerb__etcd_closure_learn(e, resp, rev, v, &changed);
    json_decref(resp);
    return st;
}

cerb_status cerb__etcd_op_closure_get(cerb_engine *e, cerb_closure *out)
{
    struct etcd_closure_view v = {0};
    cerb_status st = cerb__etcd_closure_read(e, cerb__deadline_in(e->ec->op_timeout_ms), &v);
    if (st == CERB_OK)
        *out = v.rec;
    return st;
}

/*
 * One round of closure_put: store rec if C is still as v says. *done when
 * stored (*v then says so); else *v is what the failure branch read.
 */
static cerb_status put_round(cerb_engine *e, const cerb_closure *rec,
                             struct etcd_closure_view *v, int64_t deadline_ns, bool *done)
{
    struct etcd_closure *c = &e->closure;
    char val[40];
    int vn = snprintf(val, sizeof val, "%" PRId64 " %s", rec->epoch,
                      rec->closed ? "closed" : "open");
    *done = false;
    if (vn <= 0 || (size_t)vn >= sizeof val)
        return cerb__error_set(CERB_EINVAL, "etcd: closure record epoch %" PRId64, rec->epoch);
    json_t *cmp = cerb__etcd_closure_cmp(e, v);
    json_t *put = cerb__etcd_op_put(c->key, c->key_len, val, (size_t)vn, 0);
    json_t *read = cerb__etcd_closure_op_read(e);
    if (!cmp || !put || !read) {
        /* Never send a txn that lost its compare: it would put blindly. */
        json_decref(cmp);
        json_decref(put);
        json_decref(read);
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    }
    json_t *req = cerb__etcd_txn(cerb__etcd_list(cmp, NULL), cerb__etcd_list(put, NULL),
                                 cerb__etcd_list(read, NULL));
    json_t *answer;
    cerb_status st = cerb__etcd_post(e, "closure record put", "/v3/kv/txn", req, deadline_ns,
                                     NULL, &answer);
    if (st != CERB_OK)
        return st;
    bool ok = false, changed;
    int64_t rev = 0;
    const json_t *resp;
    st = cerb__etcd_parse_txn(answer, 1, &ok, &rev, &resp);
    if (st == CERB_OK && ok) {
        struct etcd_closure_view now = {.mod = rev, .rec = *rec};
        cerb__mutex_lock(&c->mu);
        take(c, &now, rev);
        cerb__mutex_unlock(&c->mu);
        CERB_LOG_I("etcd %s: closure record %s is now \"%s\" (was epoch %" PRId64 ")", ep(e),
                   c->key, val, v->rec.epoch);
        *v = now;
        *done = true;
    } else if (st == CERB_OK) {
        st = cerb__etcd_closure_learn(e, cerb__etcd_txn_range(resp, 0), rev, v, &changed);
    }
    json_decref(answer);
    return st;
}

cerb_status cerb__etcd_op_closure_put(cerb_engine *e, const cerb_closure *rec,
                                      cerb_closure *now)
{
    struct etcd_closure_view v;
    /* Two operation timeouts, as for a release: a round that lost a race
     * needs a second one. */
    int64_t deadline = cerb__deadline_in(2 * e->ec->op_timeout_ms);
    bool fresh = false; /* v was read from the server during this call */
    cerb_status st;

    if (rec->epoch <= 0)
        return cerb__error_set(CERB_EINVAL, "etcd: closure record with epoch %" PRId64,
                               rec->epoch);
    cerb__etcd_closure_view(e, &v);
    for (int round = 0; round < CLOSURE_TRIES; round++) {
        if (v.rec.epoch >= rec->epoch) {
            /* Nothing to raise, as far as the cache knows: say so only
             * from what the server has now. */
            if (fresh) {
                *now = v.rec;
                return CERB_OK;
            }
            st = cerb__etcd_closure_read(e, deadline, &v);
            if (st != CERB_OK)
                return st;
            fresh = true;
            continue;
        }
        bool done;
        st = put_round(e, rec, &v, deadline, &done);
        if (st != CERB_OK)
            return st;
        fresh = true;
        if (done) {
            *now = v.rec;
            return CERB_OK;
        }
    }
    return cerb__error_set(CERB_EIO, "etcd %s: the closure record %s kept changing", ep(e),
                           e->closure.key);
}
