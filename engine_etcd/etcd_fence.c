/*
 * etcd_fence.c — the fence offset: what every grant adds to its key's
 * create revision, so that a client switching to etcd from another engine
 * gets a token above the one it had there (cerb_engine_lock.fence_floor),
 * and every later grant of any name, by any client, ranks above it too
 * (DESIGN §5a.3).
 *
 * Layout. One key per cluster and etcd.prefix, O = <prefix>__cerberus_fence__,
 * without a lease (permanent: one small key), whose value is the offset in
 * decimal; absent means 0. No lock can reach it: a lock key is
 * <prefix><name>/<lease hex> and a lock's range is everything under
 * <prefix><name>/, while names hold no '/' (etcd_check_name), so the part of
 * O after the prefix would have to start with "<name>/". (DESIGN §11 puts
 * guard records under <prefix>cerb/guard/, but that is inside the range of
 * the lock "cerb", whose owner a permanent key there would be forever.)
 *
 * A grant's fence is create_revision(K) + the offset in force when K was
 * put. The acquire txn (etcd_mutex.c) compares O's mod_revision with the
 * one cached here (version == 0 while O is absent: etcd compares a missing
 * key as zero-valued), writes that offset as K's value, and reads O in its
 * failure branch: a stale cache costs one more round trip, never a put with
 * an offset no longer in force. K's value keeps the offset readable later
 * (check_owner after a lost answer, a key of ours adopted from an earlier
 * attempt). Queue order is create-revision order and the offset never
 * decreases, so fences grow in grant order whoever the clients are.
 *
 * Raising. A put after revision r gets a create revision above r, so its
 * fence exceeds a floor F when r + offset >= F. When that does not hold, O
 * is set to F - r, r being the header revision of a fresh read of O, by a
 * txn comparing O's mod_revision (a concurrent change fails it: read again
 * and decide again), before the acquire txn: the raise is what F needs and
 * no more, because 48 bits must last.
 *
 * Deletion. Someone may delete O (or write a lower value): this instance
 * never uses an offset below the highest it has seen, it puts that back
 * first. An instance that never saw O cannot know; O is documented as
 * permanent (README).
 */
#include "internal_posix.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

/* Rounds of read-and-decide before giving up on an offset key that keeps
 * changing under us (every round means another client changed it). */
#define FENCE_TRIES 8

static const char fence_suffix[] = "__cerberus_fence__";

cerb_status cerb__etcd_fence_init(cerb_engine *e)
{
    struct etcd_fence *f = &e->fence;
    size_t pl = e->ec->prefix ? strlen(e->ec->prefix) : 0;
    memset(f, 0, sizeof *f);
    f->key = cerb__malloc(pl + sizeof fence_suffix);
    if (!f->key)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    memcpy(f->key, e->ec->prefix, pl);
    memcpy(f->key + pl, fence_suffix, sizeof fence_suffix);
    f->key_len = pl + sizeof fence_suffix - 1;
    cerb__mutex_init(&f->mu);
    return CERB_OK;
}

void cerb__etcd_fence_destroy(cerb_engine *e)
{
    if (!e->fence.key)
        return;
    cerb__mutex_destroy(&e->fence.mu);
    cerb__free(e->fence.key);
    e->fence.key = NULL;
}

bool cerb__etcd_fence_parse(const char *s, size_t n, int64_t *out)
{
    char buf[24];
    *out = 0;
    if (!s || n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    /* An offset fits the 48 bits of a fence (and sums of it with a
     * revision cannot overflow). */
    if (*end != '\0' || errno != 0 || v < 0 || v >= (1LL << 48) || buf[0] < '0' ||
        buf[0] > '9')
        return false;
    *out = (int64_t)v;
    return true;
}

size_t cerb__etcd_fence_format(int64_t off, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%" PRId64, off);
    return k > 0 && (size_t)k < n ? (size_t)k : 0;
}

json_t *cerb__etcd_fence_cmp(cerb_engine *e, const struct etcd_fence_view *v)
{
    const struct etcd_fence *f = &e->fence;
    return v->mod > 0 ? cerb__etcd_cmp_key(f->key, f->key_len, ETCD_TARGET_MOD, "EQUAL", v->mod)
                      : cerb__etcd_cmp_key(f->key, f->key_len, ETCD_TARGET_VERSION, "EQUAL", 0);
}

json_t *cerb__etcd_fence_op_read(cerb_engine *e)
{
    struct etcd_range_req r = {.key = e->fence.key, .key_len = e->fence.key_len};
    return cerb__etcd_op_range(&r);
}

/* Take (offset, mod) seen at revision `rev` into the cache, unless the cache
 * already knows a later state. Under f->mu. */
static void take(struct etcd_fence *f, int64_t offset, int64_t mod, int64_t rev)
{
    if (offset > f->max_seen)
        f->max_seen = offset;
    if (f->known && rev < f->as_of)
        return;
    f->known = true;
    f->offset = offset;
    f->mod = mod;
    f->as_of = rev;
}

cerb_status cerb__etcd_fence_learn(cerb_engine *e, const json_t *range, int64_t rev,
                                   const struct etcd_fence_view *v, bool *changed)
{
    struct etcd_fence *f = &e->fence;
    struct etcd_range_res rr = {0};
    *changed = false;
    if (!range)
        return cerb__error_set(CERB_EPROTO, "etcd %s: the fence offset read is not a range",
                               cerb__etcd_endpoint(&e->http));
    cerb_status st = cerb__etcd_parse_range(range, &rr);
    if (st != CERB_OK)
        return st;
    int64_t offset = 0, mod = 0;
    if (rr.n_kvs > 0) {
        mod = rr.first.mod_revision;
        if (!cerb__etcd_fence_parse(rr.first.value, rr.first.value_len, &offset))
            CERB_LOG_W("etcd %s: the fence offset key %s holds no offset (\"%.20s\"): taken as 0",
                       cerb__etcd_endpoint(&e->http), f->key,
                       rr.first.value ? rr.first.value : "");
    }
    cerb__etcd_kv_clear(&rr.first);
    cerb__mutex_lock(&f->mu);
    take(f, offset, mod, rev);
    cerb__mutex_unlock(&f->mu);
    *changed = mod != v->mod || offset != v->offset;
    return CERB_OK;
}

/* A linearizable read of O into the cache. */
static cerb_status read_offset(cerb_engine *e, int64_t deadline_ns)
{
    json_t *resp;
    int64_t rev = 0;
    bool changed;
    struct etcd_fence_view none = {0, 0};
    cerb_status st = cerb__etcd_read_key(e, e->fence.key, e->fence.key_len, "fence offset read",
                                         deadline_ns, &resp, &rev);
    if (st != CERB_OK)
        return st;
    st = cerb__etcd_fence_learn(e, resp, rev, &none, &changed);
    json_decref(resp);
    return st;
}

/*
 * Set O to `want` if it is still as v says (the txn compares its mod
 * revision), learning what it is otherwise. *done tells which; when done,
 * *v is the new state. A re-send after a lost answer that landed fails the
 * compare and reads `want` back, which the next round finds good enough.
 */
static cerb_status raise_offset(cerb_engine *e, struct etcd_fence_view *v, int64_t want,
                                int64_t deadline_ns, bool *done)
{
    struct etcd_fence *f = &e->fence;
    char val[24];
    size_t vn = cerb__etcd_fence_format(want, val, sizeof val);
    *done = false;
    json_t *req = cerb__etcd_txn(cerb__etcd_list(cerb__etcd_fence_cmp(e, v), NULL),
                                 cerb__etcd_list(cerb__etcd_op_put(f->key, f->key_len, val, vn, 0),
                                                 NULL),
                                 cerb__etcd_list(cerb__etcd_fence_op_read(e), NULL));
    json_t *answer;
    cerb_status st = cerb__etcd_post(e, "fence offset raise", "/v3/kv/txn", req, deadline_ns,
                                     NULL, &answer);
    if (st != CERB_OK)
        return st;
    bool ok = false, changed;
    int64_t rev = 0;
    const json_t *resp;
    st = cerb__etcd_parse_txn(answer, 0, &ok, &rev, &resp);
    if (st == CERB_OK && ok) {
        cerb__mutex_lock(&f->mu);
        take(f, want, rev, rev);
        cerb__mutex_unlock(&f->mu);
        *done = true;
        CERB_LOG_I("etcd %s: fence offset %s raised to %" PRId64 " (was %" PRId64 ")",
                   cerb__etcd_endpoint(&e->http), f->key, want, v->offset);
        v->offset = want;
        v->mod = rev;
    } else if (st == CERB_OK) {
        st = cerb__etcd_fence_learn(e, cerb__etcd_txn_range(resp, 0), rev, v, &changed);
    }
    json_decref(answer);
    return st;
}

cerb_status cerb__etcd_fence_prepare(cerb_engine *e, uint64_t floor, int64_t deadline_ns,
                                     struct etcd_fence_view *v)
{
    struct etcd_fence *f = &e->fence;
    bool fresh = false;
    cerb_status st;

    for (int round = 0; round < FENCE_TRIES; round++) {
        cerb__mutex_lock(&f->mu);
        bool known = f->known;
        int64_t as_of = f->as_of, max_seen = f->max_seen;
        v->offset = f->offset;
        v->mod = f->mod;
        cerb__mutex_unlock(&f->mu);

        /* Not read yet and no floor: try "absent" (the usual case); the
         * acquire txn's compare says otherwise in the same round trip. */
        int64_t want = max_seen;
        if (floor > 0) {
            if (!known || (as_of + v->offset < (int64_t)floor && !fresh)) {
                /* The revision now, so that the raise is no larger than
                 * it must be (and perhaps none is needed). */
                st = read_offset(e, deadline_ns);
                if (st != CERB_OK)
                    return st;
                fresh = true;
                continue;
            }
            if (as_of + v->offset < (int64_t)floor && (int64_t)floor - as_of > want)
                want = (int64_t)floor - as_of;
        }
        if (want <= v->offset)
            return CERB_OK;
        bool done;
        st = raise_offset(e, v, want, deadline_ns, &done);
        if (st != CERB_OK)
            return st;
        if (done)
            return CERB_OK;
    }
    return cerb__error_set(CERB_EIO, "etcd %s: the fence offset key %s kept changing",
                           cerb__etcd_endpoint(&e->http), f->key);
}

/* The offset `rr` (a range of O) holds; false when O holds no offset. */
static cerb_status range_offset(cerb_engine *e, const struct etcd_range_res *rr, int64_t *off)
{
    *off = 0;
    if (rr->n_kvs == 0 || cerb__etcd_fence_parse(rr->first.value, rr->first.value_len, off))
        return CERB_OK;
    return cerb__error_set(CERB_EPROTO, "etcd %s: the fence offset key %s holds no offset",
                           cerb__etcd_endpoint(&e->http), e->fence.key);
}

cerb_status cerb__etcd_fence_at(cerb_engine *e, int64_t rev, const json_t *range,
                                int64_t deadline_ns, int64_t *off)
{
    struct etcd_fence *f = &e->fence;
    struct etcd_range_res rr = {0};
    json_t *answer = NULL;
    cerb_status st;

    *off = 0;
    if (rev <= 0)
        return cerb__error_set(CERB_EPROTO, "etcd: no create revision to read the fence offset at");
    if (!range) {
        int64_t hrev;
        st = cerb__etcd_read_key(e, f->key, f->key_len, "fence offset read", deadline_ns, &answer,
                                 &hrev);
        if (st != CERB_OK)
            return st;
        range = answer;
    }
    st = cerb__etcd_parse_range(range, &rr);
    json_decref(answer);
    answer = NULL;
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&f->mu);
    int64_t max_seen = f->max_seen;
    cerb__mutex_unlock(&f->mu);
    /* Unchanged since before rev: what it holds now is what it held then.
     * Absent now and never seen by this instance: absent then (O is
     * permanent; the mutex layout makes the same assumption). */
    bool now_is_then = rr.n_kvs > 0 ? rr.first.mod_revision < rev : max_seen == 0;
    if (now_is_then) {
        st = range_offset(e, &rr, off);
        cerb__etcd_kv_clear(&rr.first);
        return st;
    }
    cerb__etcd_kv_clear(&rr.first);
    /* Changed at or after rev: read it as of rev. A compacted revision
     * fails the read: the offset is unknown, and the caller must not
     * guess (a settle stays unsettled). */
    struct etcd_range_req r = {.key = f->key, .key_len = f->key_len, .revision = rev};
    st = cerb__etcd_post(e, "fence offset read at a revision", "/v3/kv/range",
                         cerb__etcd_range_json(&r), deadline_ns, NULL, &answer);
    if (st != CERB_OK) {
        cerb__error_prefix("etcd %s: the fence offset in force at revision %lld is unknown",
                           cerb__etcd_endpoint(&e->http), (long long)rev);
        return st;
    }
    memset(&rr, 0, sizeof rr);
    st = cerb__etcd_parse_range(answer, &rr);
    json_decref(answer);
    if (st == CERB_OK)
        st = range_offset(e, &rr, off);
    cerb__etcd_kv_clear(&rr.first);
    return st;
}
