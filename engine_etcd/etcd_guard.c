/*
 * etcd_guard.c — the etcd engine's idempotency-guard records
 * (cerb_engine_ops version 2, DESIGN.md §11).
 *
 * Layout. One key per record, `<etcd.prefix>cerb:guard:<hex id>`. DESIGN §11
 * says `<prefix>cerb/guard/<hex id>`, but that key lies in the range of the
 * lock "cerb" (a lock NAME is every key under `<prefix>NAME/`, etcdctl's
 * layout), whose holder it would be, or whose queue it would join, for as
 * long as the record lives. A key with no '/' after the prefix is in no
 * lock's range (lock names hold no '/', etcd_check_name), as the fence key
 * `<prefix>__cerberus_fence__` is; `cerberus holders` and every range the
 * engine reads are lock ranges, so they never see a record either. The
 * value is binary-safe and read by position, as on redis: a state byte
 * ('R' running, 'D' done), the 32-char owner token of the attempt that
 * wrote it, then (done) the result bytes.
 *
 * Each decision is one txn:
 *  - begin:  if create_revision(key) == 0 then put R<token> (running lease)
 *            else range key
 *    so a duplicate (or a running claim) is answered in the begin's round
 *    trip. Finding our own claim (a re-sent begin whose first copy landed)
 *    puts it again onto the current running lease, compared with its
 *    value, so its life is counted from now.
 *  - finish(1): if value(key) == R<token> then put D<token><result> (a done
 *            lease, none when kept forever) else range key
 *    (the range tells a re-sent finish — our done-record — from a lost
 *    claim: CERB_NOT_OWNER, nothing changed).
 *  - finish(0): if value(key) == R<token> then delete key; sent once (not
 *    re-sent after a lost answer: a second copy would find nothing and say
 *    "not ours"), so an unknown outcome goes to the core's guard_check.
 *  - renew:  range key (is it still our running claim, on which lease?),
 *    then a keepalive of that lease, unless one was sent lately.
 *  - check:  range key.
 *
 * Leases. A lease per record would cost a LeaseGrant (a raft write, an
 * fsync) on every begin and every finish. Instead the records share leases:
 *  - running claims, one lease per client and claim length class:
 *    TTL = running_ms + slack (slack = max(1 s, running_ms / 4)) in whole
 *    seconds, kept alive by the guard renewer (one keepalive serves every
 *    open attempt of the class: a renewal whose lease was kept alive within
 *    the last sixth of its TTL reuses that keepalive). A begin uses the
 *    lease while it still has running_ms to live by our count (else it
 *    keeps it alive first, one more round trip), so a crashed attempt's
 *    claim lasts at least running_ms and at most TTL.
 *  - done-records, time-bucketed: a lease of TTL keep_ms + bucket (bucket
 *    = keep_ms / 8, between 1 s and 1 h, in whole seconds) is used for new
 *    done-records during the first bucket - margin after its grant was sent
 *    (margin = min(op_timeout, bucket / 2), for the put's travel), so every
 *    record lives at least keep_ms and at most keep_ms + bucket + 1 s; one
 *    LeaseGrant per bucket. These are not revoked: they end by themselves,
 *    and with them their records. They are kept alive only when a finish
 *    sees its put land later in the lease's life than that allows (a pause
 *    between choosing the lease and the put being applied), so that record
 *    too lives keep_ms from when it landed. keep_ms = -1 puts without
 *    a lease (permanent, documented).
 * etcd raises a TTL below its minimum (3/2 of the election timeout) and
 * refreshes every lease on a leader change: both only make records live
 * longer. A lease can vanish under us (revoked, expired while no attempt
 * ran, the server restarted without its data): a put naming it fails with
 * "lease not found" and changes nothing, so a new lease is granted and the
 * txn sent once more — its compare makes that harmless. A running claim on
 * a lease that vanished is gone with it: its renewal (the keepalive finds
 * no lease) or its finish (the compare fails) says CERB_NOT_OWNER, and the
 * core tells the holder (CERB_LOST). A shared lease must not keep alive a
 * claim nobody renews: a begin whose put may still land (its answer was
 * lost; a paused server applies it when it resumes, perhaps after the core
 * stopped deleting it) or a delete never confirmed retires the class's
 * lease — new begins get another, and each claim still on the old one is
 * moved to the current lease by its next renewal (a txn comparing its
 * value) instead of keeping the old one alive, which then ends within its
 * TTL with whatever was left on it. Closing the engine revokes its running
 * leases (the core has ended every attempt by then), not its done leases.
 *
 * Round trips: begin 1 (a duplicate or a busy answer too), plus one
 * keepalive or grant when the class's lease is missing or old; finish 1,
 * plus one grant per done bucket; renew 1 (a keepalive sent lately
 * serves) or 2 (a keepalive, or the move off a retired lease).
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

#define GUARD_TAG "cerb:guard:"
#define VAL_HDR 33    /* state byte + token */
#define LEASE_SLOTS 8 /* classes remembered per kind; the oldest is forgotten */
#define BEGIN_ROUNDS 3

/* One shared lease: a running class (cls = its TTL in s) or a done bucket
 * (cls = keep_ms). */
struct guard_lease {
    int64_t cls;
    int64_t id;       /* 0 = empty slot */
    int64_t ttl_s;    /* asked for */
    int64_t alive_ns; /* send time of the last grant or keepalive confirmed */
};

struct etcd_guard {
    cerb_mutex mu;
    struct guard_lease run[LEASE_SLOTS];
    struct guard_lease done[LEASE_SLOTS];
};

static const char *ep(cerb_engine *e) { return cerb__etcd_endpoint(&e->http); }

static int64_t ceil_s(int64_t ms) { return (ms + 999) / 1000; }

static int64_t run_ttl_s(int64_t running_ms)
{
    int64_t slack = running_ms / 4 > 1000 ? running_ms / 4 : 1000;
    return ceil_s(running_ms + slack);
}

static int64_t bucket_ms(int64_t keep_ms)
{
    int64_t b = keep_ms / 8;
    return b < 1000 ? 1000 : b > 3600000 ? 3600000 : b;
}

cerb_status cerb__etcd_guard_init(cerb_engine *e)
{
    e->guard = cerb__calloc(1, sizeof *e->guard);
    if (!e->guard)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    cerb__mutex_init(&e->guard->mu);
    return CERB_OK;
}

/* `<prefix>cerb:guard:<id>` into buf. */
static cerb_status record_key(cerb_engine *e, const cerb_guard_rec *rec, char *buf, size_t n,
                              size_t *len)
{
    int k = snprintf(buf, n, "%s" GUARD_TAG "%s", e->ec->prefix ? e->ec->prefix : "", rec->id);
    if (k < 0 || (size_t)k >= n)
        return cerb__error_set(CERB_EINVAL, "etcd: guard key too long (etcd.prefix)");
    *len = (size_t)k;
    return CERB_OK;
}

/* ---- leases ---- */

static cerb_status lease_call(cerb_engine *e, const char *what, const char *path, json_t *req,
                              struct etcd_call *call)
{
    memset(call, 0, sizeof *call);
    call->grpc_code = -1;
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    call->what = what;
    call->path = path;
    call->body = req;
    call->deadline_ns = cerb__deadline_in(e->ec->op_timeout_ms);
    call->idempotent = true;
    cerb_status st = cerb__etcd_call(e, call);
    json_decref(req);
    return st;
}

/* Grant a lease of ttl_s with a client-chosen ID (so a re-sent grant whose
 * first copy landed is recognised: "already exists" after an unknown
 * outcome is ours). *sent_ns: before the first send. */
static cerb_status lease_grant(cerb_engine *e, int64_t ttl_s, int64_t *id, int64_t *sent_ns)
{
    cerb_status st = CERB_BUSY;
    for (int i = 0; i < 3 && st == CERB_BUSY; i++) {
        uint64_t v = 0;
        if (RAND_bytes((unsigned char *)&v, sizeof v) != 1)
            v = cerb__rand_below(UINT64_MAX) ^ ((uint64_t)cerb_monotime() << 17);
        v &= INT64_MAX;
        *id = v ? (int64_t)v : 1;
        struct etcd_call call;
        *sent_ns = cerb_monotime();
        st = lease_call(e, "guard lease grant", "/v3/lease/grant",
                        json_pack("{s:o, s:o}", "TTL", cerb__etcd_json_i64(ttl_s), "ID",
                                  cerb__etcd_json_i64(*id)),
                        &call);
        if (st == CERB_OK) {
            json_decref(call.resp);
        } else if (call.grpc_code == ETCD_GRPC_FAILED_PRECONDITION) {
            st = call.outcome == CERB_OUTCOME_UNKNOWN ? CERB_OK : CERB_BUSY;
        }
    }
    return st;
}

/* Keep lease id alive: *ttl_s from the answer, 0 when the lease is gone. */
static cerb_status lease_keepalive(cerb_engine *e, int64_t id, int64_t *ttl_s, int64_t *sent_ns)
{
    struct etcd_call call;
    int64_t got = 0;
    *sent_ns = cerb_monotime();
    cerb_status st = lease_call(e, "guard lease keepalive", "/v3/lease/keepalive",
                                json_pack("{s:o}", "ID", cerb__etcd_json_i64(id)), &call);
    if (st != CERB_OK)
        return st;
    /* The send that was answered: the lease runs from after it. */
    if (call.sent_ns > *sent_ns)
        *sent_ns = call.sent_ns;
    st = cerb__etcd_parse_keepalive(call.resp, &got, ttl_s);
    json_decref(call.resp);
    return st;
}

/* The slot of class cls in tab, or an empty one, or the oldest; mu held. */
static struct guard_lease *slot_for(struct guard_lease *tab, int64_t cls)
{
    struct guard_lease *free_s = NULL, *old = &tab[0];
    for (int i = 0; i < LEASE_SLOTS; i++) {
        if (tab[i].id && tab[i].cls == cls)
            return &tab[i];
        if (!tab[i].id && !free_s)
            free_s = &tab[i];
        if (tab[i].alive_ns < old->alive_ns)
            old = &tab[i];
    }
    return free_s ? free_s : old;
}

/* Forget lease id wherever it is remembered (it is gone). */
static void forget(cerb_engine *e, int64_t id)
{
    struct etcd_guard *g = e->guard;
    cerb__mutex_lock(&g->mu);
    for (int i = 0; i < LEASE_SLOTS; i++) {
        if (g->run[i].id == id)
            memset(&g->run[i], 0, sizeof g->run[i]);
        if (g->done[i].id == id)
            memset(&g->done[i], 0, sizeof g->done[i]);
    }
    cerb__mutex_unlock(&g->mu);
}

/*
 * Stop using the running lease of claims of running_ms: a write whose
 * outcome is unknown (a begin whose put may land later, when a paused
 * server resumes; a delete never confirmed) may leave a claim on it that
 * nobody renews, and the lease, kept alive for the other attempts of the
 * class, would keep that claim too. New begins get a new lease; the
 * claims still on the old one move to the current lease at their next
 * renewal (guard_renew), after which nobody keeps the old lease alive and
 * it ends within its TTL, with whatever was left on it.
 */
static void retire(cerb_engine *e, int64_t running_ms)
{
    struct etcd_guard *g = e->guard;
    int64_t cls = run_ttl_s(running_ms);
    cerb__mutex_lock(&g->mu);
    for (int i = 0; i < LEASE_SLOTS; i++)
        if (g->run[i].id && g->run[i].cls == cls)
            memset(&g->run[i], 0, sizeof g->run[i]);
    cerb__mutex_unlock(&g->mu);
}

/* A keepalive of running lease id sent at alive_ns was confirmed: moved on
 * only where id is still remembered (a lease retired meanwhile stays so). */
static void refresh(cerb_engine *e, int64_t id, int64_t alive_ns)
{
    struct etcd_guard *g = e->guard;
    cerb__mutex_lock(&g->mu);
    for (int i = 0; i < LEASE_SLOTS; i++)
        if (g->run[i].id == id && g->run[i].alive_ns < alive_ns)
            g->run[i].alive_ns = alive_ns;
    cerb__mutex_unlock(&g->mu);
}

/* Remember a newly granted lease l in its class's slot of tab. */
static void publish(cerb_engine *e, struct guard_lease *tab, const struct guard_lease *l)
{
    struct etcd_guard *g = e->guard;
    cerb__mutex_lock(&g->mu);
    struct guard_lease *s = slot_for(tab, l->cls);
    if (!s->id || s->cls != l->cls || s->alive_ns <= l->alive_ns)
        *s = *l;
    cerb__mutex_unlock(&g->mu);
}

/*
 * The running lease for a claim of running_ms, in *out: one that has at
 * least running_ms to live by our count. Kept alive first when it is older
 * than that, granted when there is none (or `fresh`: the last put found the
 * lease gone).
 */
static cerb_status run_lease(cerb_engine *e, int64_t running_ms, bool fresh,
                             struct guard_lease *out)
{
    struct etcd_guard *g = e->guard;
    int64_t ttl_s = run_ttl_s(running_ms);
    struct guard_lease cur = {0};
    cerb__mutex_lock(&g->mu);
    struct guard_lease *s = slot_for(g->run, ttl_s);
    if (s->id && s->cls == ttl_s)
        cur = *s;
    cerb__mutex_unlock(&g->mu);
    int64_t now = cerb_monotime();
    if (cur.id && !fresh) {
        if (now + running_ms * CERB_NS_PER_MS <= cur.alive_ns + ttl_s * 1000 * CERB_NS_PER_MS) {
            *out = cur;
            return CERB_OK;
        }
        int64_t left = 0, sent = 0;
        cerb_status st = lease_keepalive(e, cur.id, &left, &sent);
        if (st != CERB_OK)
            return st;
        if (left > 0) {
            cur.alive_ns = sent;
            refresh(e, cur.id, sent);
            *out = cur;
            return CERB_OK;
        }
        forget(e, cur.id); /* gone: a new one below */
    } else if (cur.id) {
        forget(e, cur.id);
    }
    struct guard_lease l = {.cls = ttl_s, .ttl_s = ttl_s};
    cerb_status st = lease_grant(e, ttl_s, &l.id, &l.alive_ns);
    if (st != CERB_OK)
        return st;
    publish(e, g->run, &l);
    *out = l;
    return CERB_OK;
}

/* The done lease for a record kept keep_ms from now (0: keep forever), with
 * the send time of its grant and its TTL. */
static cerb_status done_lease(cerb_engine *e, int64_t keep_ms, bool fresh, int64_t *id,
                              int64_t *alive_ns, int64_t *ttl_s)
{
    struct etcd_guard *g = e->guard;
    *id = 0;
    if (keep_ms < 0)
        return CERB_OK;
    int64_t b = bucket_ms(keep_ms);
    int64_t margin = e->ec->op_timeout_ms < b / 2 ? e->ec->op_timeout_ms : b / 2;
    struct guard_lease cur = {0};
    cerb__mutex_lock(&g->mu);
    struct guard_lease *s = slot_for(g->done, keep_ms);
    if (s->id && s->cls == keep_ms)
        cur = *s;
    cerb__mutex_unlock(&g->mu);
    if (cur.id && fresh)
        forget(e, cur.id);
    else if (cur.id && cerb_monotime() <= cur.alive_ns + (b - margin) * CERB_NS_PER_MS) {
        *id = cur.id;
        *alive_ns = cur.alive_ns;
        *ttl_s = cur.ttl_s;
        return CERB_OK;
    }
    struct guard_lease l = {.cls = keep_ms, .ttl_s = ceil_s(keep_ms + b)};
    cerb_status st = lease_grant(e, l.ttl_s, &l.id, &l.alive_ns);
    if (st != CERB_OK)
        return st;
    publish(e, g->done, &l);
    *id = l.id;
    *alive_ns = l.alive_ns;
    *ttl_s = l.ttl_s;
    return CERB_OK;
}

void cerb__etcd_guard_destroy(cerb_engine *e)
{
    struct etcd_guard *g = e->guard;
    if (!g)
        return;
    /* Running claims end with the client: the core has ended every attempt
     * already, so what is left on these leases is claims whose delete was
     * never confirmed. Bounded like the session's revoke; best effort. */
    int64_t budget = e->ec->op_timeout_ms < 1000 ? e->ec->op_timeout_ms : 1000;
    int64_t until = cerb__deadline_in(budget);
    for (int i = 0; i < LEASE_SLOTS; i++) {
        if (!g->run[i].id || cerb_monotime() >= until)
            continue;
        struct etcd_call call;
        memset(&call, 0, sizeof call);
        json_t *req = json_pack("{s:o}", "ID", cerb__etcd_json_i64(g->run[i].id));
        if (!req)
            continue;
        call.what = "guard lease revoke";
        call.path = "/v3/lease/revoke";
        call.body = req;
        call.deadline_ns = until;
        call.idempotent = true;
        call.grpc_code = -1;
        if (cerb__etcd_call(e, &call) == CERB_OK)
            json_decref(call.resp);
        json_decref(req);
    }
    cerb__mutex_destroy(&g->mu);
    cerb__free(g);
    e->guard = NULL;
}

/* ---- requests ---- */

/* A Compare: value(key) == val. */
static json_t *cmp_value(const char *key, size_t klen, const char *val, size_t vlen)
{
    return json_pack("{s:o, s:s, s:s, s:o}", "key", cerb__etcd_json_bytes(key, klen), "target",
                     "VALUE", "result", "EQUAL", "value", cerb__etcd_json_bytes(val, vlen));
}

static json_t *op_get(const char *key, size_t klen)
{
    struct etcd_range_req r = {.key = key, .key_len = klen};
    return cerb__etcd_op_range(&r);
}

/* Send txn `req` (stolen). On CERB_OK: *ok, and call->resp (json_decref it)
 * whose *responses are borrowed from it. */
static cerb_status run_txn(cerb_engine *e, const char *what, json_t *req, bool idempotent,
                           struct etcd_call *call, bool *ok, const json_t **responses)
{
    memset(call, 0, sizeof *call);
    call->grpc_code = -1;
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    call->what = what;
    call->path = "/v3/kv/txn";
    call->body = req;
    call->deadline_ns = cerb__deadline_in(e->ec->op_timeout_ms);
    call->idempotent = idempotent;
    cerb_status st = cerb__etcd_call(e, call);
    json_decref(req);
    if (st != CERB_OK)
        return st;
    int64_t rev = 0;
    st = cerb__etcd_parse_txn(call->resp, 0, ok, &rev, responses);
    if (st != CERB_OK) {
        cerb__error_prefix("etcd %s: %s", ep(e), what);
        call->outcome = CERB_OUTCOME_UNKNOWN;
        json_decref(call->resp);
        call->resp = NULL;
    }
    return st;
}

/* A put that named a lease the server no longer has (nothing changed). */
static bool lease_missing(const struct etcd_call *call)
{
    return call->grpc_code == ETCD_GRPC_NOT_FOUND;
}

/* What a record value says, judged by rec's token. */
struct rec_view {
    bool exists;
    char state;          /* 'R' or 'D' */
    bool mine;
    int64_t lease;
    struct etcd_kv kv;   /* clear it */
};

static cerb_status parse_record(cerb_engine *e, const json_t *range, const cerb_guard_rec *rec,
                                struct rec_view *v)
{
    struct etcd_range_res rr = {0};
    memset(v, 0, sizeof *v);
    if (!range)
        return cerb__error_set(CERB_EPROTO, "etcd %s: guard txn: no range in the answer", ep(e));
    cerb_status st = cerb__etcd_parse_range(range, &rr);
    if (st != CERB_OK)
        return st;
    if (rr.n_kvs == 0)
        return CERB_OK;
    v->kv = rr.first;
    v->exists = true;
    v->lease = rr.first.lease;
    const char *s = v->kv.value;
    if (!s || v->kv.value_len < VAL_HDR || (s[0] != 'R' && s[0] != 'D')) {
        cerb__etcd_kv_clear(&v->kv);
        return cerb__error_set(CERB_EPROTO, "etcd %s: guard key %s holds no guard record",
                               ep(e), rec->id);
    }
    v->state = s[0];
    v->mine = memcmp(s + 1, rec->token, 32) == 0;
    return CERB_OK;
}

/* A linearizable read of rec's key. */
static cerb_status read_record(cerb_engine *e, const cerb_guard_rec *rec, struct rec_view *v)
{
    char key[1200];
    size_t klen = 0;
    memset(v, 0, sizeof *v);
    cerb_status st = record_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    struct etcd_range_req r = {.key = key, .key_len = klen};
    struct etcd_call call;
    memset(&call, 0, sizeof call);
    call.grpc_code = -1;
    json_t *req = cerb__etcd_range_json(&r);
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
    call.what = "guard read";
    call.path = "/v3/kv/range";
    call.body = req;
    call.deadline_ns = cerb__deadline_in(e->ec->op_timeout_ms);
    call.idempotent = true;
    st = cerb__etcd_call(e, &call);
    json_decref(req);
    if (st != CERB_OK)
        return st;
    st = parse_record(e, call.resp, rec, v);
    json_decref(call.resp);
    return st;
}

/* ---- the ops ---- */

/*
 * rec's claim is on a lease that is no longer the class's current one
 * (retired, or forgotten for another class): put it onto the current lease,
 * compared with its value, so the old lease is no longer kept alive for it.
 */
static cerb_status move_claim(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    char key[1200], val[VAL_HDR];
    size_t klen = 0;
    cerb_status st = record_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    val[0] = 'R';
    memcpy(val + 1, rec->token, 32);
    bool fresh = false;
    for (int round = 0; round < 2; round++) {
        struct guard_lease l;
        st = run_lease(e, rec->running_ms, fresh, &l);
        if (st != CERB_OK)
            return st;
        struct etcd_call call;
        bool ok = false;
        const json_t *resp = NULL;
        st = run_txn(e, "guard renew (new lease)",
                     cerb__etcd_txn(cerb__etcd_list(cmp_value(key, klen, val, VAL_HDR), NULL),
                                    cerb__etcd_list(cerb__etcd_op_put(key, klen, val, VAL_HDR,
                                                                      l.id),
                                                    NULL),
                                    NULL),
                     true, &call, &ok, &resp);
        if (st != CERB_OK) {
            if (lease_missing(&call) && call.outcome == CERB_OUTCOME_NO) {
                fresh = true;
                continue;
            }
            return st;
        }
        json_decref(call.resp);
        if (!ok)
            return cerb__error_set(CERB_NOT_OWNER, "etcd %s: guard record %s is no longer this "
                                   "attempt's claim", ep(e), rec->id);
        g->sent_ns = l.alive_ns;
        g->ttl_ms = l.ttl_s * 1000;
        return CERB_OK;
    }
    return st;
}

cerb_status cerb__etcd_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    struct rec_view v;
    g->outcome = CERB_OUTCOME_NO;
    cerb_status st = read_record(e, rec, &v);
    if (st != CERB_OK)
        return st;
    bool ours = v.exists && v.state == 'R' && v.mine && v.lease != 0;
    int64_t lease = v.lease;
    cerb__etcd_kv_clear(&v.kv);
    if (!ours)
        return cerb__error_set(CERB_NOT_OWNER, "etcd %s: guard record %s is no longer this "
                               "attempt's claim", ep(e), rec->id);
    /* A keepalive of this lease sent lately (for another attempt) counts
     * for this claim too: the key is on the lease, so it lives as long. */
    struct etcd_guard *gd = e->guard;
    struct guard_lease cur = {0};
    cerb__mutex_lock(&gd->mu);
    for (int i = 0; i < LEASE_SLOTS; i++)
        if (gd->run[i].id == lease)
            cur = gd->run[i];
    cerb__mutex_unlock(&gd->mu);
    if (!cur.id)
        return move_claim(e, rec, g);
    int64_t now = cerb_monotime();
    if (now < cur.alive_ns + cur.ttl_s * 1000 * CERB_NS_PER_MS / 6) {
        g->sent_ns = cur.alive_ns;
        g->ttl_ms = cur.ttl_s * 1000;
        return CERB_OK;
    }
    int64_t left = 0, sent = 0;
    st = lease_keepalive(e, lease, &left, &sent);
    if (st != CERB_OK)
        return st;
    if (left <= 0) {
        forget(e, lease);
        return cerb__error_set(CERB_NOT_OWNER, "etcd %s: the lease of guard record %s is gone "
                               "(revoked or expired): the claim is lost", ep(e), rec->id);
    }
    g->sent_ns = sent;
    g->ttl_ms = cur.ttl_s * 1000;
    refresh(e, lease, sent);
    return CERB_OK;
}

cerb_status cerb__etcd_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                   void **result, size_t *result_len)
{
    char key[1200], val[VAL_HDR];
    size_t klen = 0;
    cerb_status st = record_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    val[0] = 'R';
    memcpy(val + 1, rec->token, 32);
    bool fresh = false, landed = false, take_over = false;
    g->outcome = CERB_OUTCOME_NO;
    for (int round = 0; round < BEGIN_ROUNDS; round++) {
        struct guard_lease l;
        st = run_lease(e, rec->running_ms, fresh, &l);
        if (st != CERB_OK)
            break;
        fresh = false;
        /* Claim it when absent; or, when the record is our own claim (a
         * begin re-sent after its answer was lost), put it again onto
         * this lease, so its life counts from now. */
        json_t *cmp = take_over ? cmp_value(key, klen, val, VAL_HDR)
                                : cerb__etcd_cmp_create(key, klen, NULL, 0, "EQUAL", 0);
        struct etcd_call call;
        bool ok = false;
        const json_t *resp = NULL;
        st = run_txn(e, "guard begin",
                     cerb__etcd_txn(cerb__etcd_list(cmp, NULL),
                                    cerb__etcd_list(cerb__etcd_op_put(key, klen, val, VAL_HDR,
                                                                      l.id),
                                                    NULL),
                                    cerb__etcd_list(op_get(key, klen), NULL)),
                     true, &call, &ok, &resp);
        if (st != CERB_OK) {
            landed = landed || call.outcome == CERB_OUTCOME_UNKNOWN;
            if (lease_missing(&call) && call.outcome == CERB_OUTCOME_NO) {
                fresh = true; /* nothing changed: a new lease, once more */
                forget(e, l.id);
                continue;
            }
            break;
        }
        landed = landed || call.resent;
        if (ok) {
            json_decref(call.resp);
            g->sent_ns = l.alive_ns;
            g->ttl_ms = l.ttl_s * 1000;
            return CERB_OK;
        }
        struct rec_view v;
        st = parse_record(e, cerb__etcd_txn_range(resp, 0), rec, &v);
        json_decref(call.resp);
        if (st != CERB_OK)
            break;
        if (!v.exists) {
            take_over = false; /* gone meanwhile: claim it afresh */
            continue;
        }
        if (v.state == 'D') {
            char *copy = cerb__malloc(v.kv.value_len - VAL_HDR + 1);
            if (!copy) {
                st = cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
            } else {
                memcpy(copy, v.kv.value + VAL_HDR, v.kv.value_len - VAL_HDR);
                copy[v.kv.value_len - VAL_HDR] = '\0';
                *result = copy;
                *result_len = v.kv.value_len - VAL_HDR;
                st = CERB_DUPLICATE;
            }
            cerb__etcd_kv_clear(&v.kv);
            return st;
        }
        cerb__etcd_kv_clear(&v.kv);
        if (!v.mine)
            return cerb__error_set(CERB_BUSY, "etcd %s: guard record %s is another attempt's "
                                   "claim", ep(e), rec->id);
        take_over = true;
    }
    if (st == CERB_OK)
        st = cerb__error_set(CERB_EIO, "etcd %s: guard record %s kept changing under begin",
                             ep(e), rec->id);
    if (landed) {
        g->outcome = CERB_OUTCOME_UNKNOWN;
        retire(e, rec->running_ms);
    }
    return st;
}

cerb_status cerb__etcd_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok_,
                                    const void *result, size_t len, int64_t keep_ms,
                                    cerb_outcome *oc)
{
    char key[1200], run_val[VAL_HDR];
    size_t klen = 0;
    *oc = CERB_OUTCOME_NO;
    cerb_status st = record_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    run_val[0] = 'R';
    memcpy(run_val + 1, rec->token, 32);
    struct etcd_call call;
    bool ok = false;
    const json_t *resp = NULL;

    if (!ok_) {
        st = run_txn(e, "guard delete",
                     cerb__etcd_txn(cerb__etcd_list(cmp_value(key, klen, run_val, VAL_HDR), NULL),
                                    cerb__etcd_list(cerb__etcd_op_delete(key, klen), NULL), NULL),
                     false, &call, &ok, &resp);
        if (st != CERB_OK) {
            *oc = call.outcome;
            /* Even a delete that certainly did not land leaves a claim on
             * a lease other attempts keep alive: retire it, so the claim
             * ends within its TTL if nobody deletes it. */
            retire(e, rec->running_ms);
            return st;
        }
        json_decref(call.resp);
        if (!ok)
            return cerb__error_set(CERB_NOT_OWNER, "etcd %s: guard record %s is not this "
                                   "attempt's claim", ep(e), rec->id);
        return CERB_OK;
    }

    char *done = cerb__malloc(VAL_HDR + len + 1);
    if (!done)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    done[0] = 'D';
    memcpy(done + 1, rec->token, 32);
    if (len)
        memcpy(done + VAL_HDR, result, len);
    bool fresh = false, landed = false;
    int64_t lease = 0, l_alive = 0, l_ttl_s = 0;
    for (int round = 0; round < 2; round++) {
        lease = 0;
        st = done_lease(e, keep_ms, fresh, &lease, &l_alive, &l_ttl_s);
        if (st != CERB_OK)
            break;
        st = run_txn(e, "guard finish",
                     cerb__etcd_txn(cerb__etcd_list(cmp_value(key, klen, run_val, VAL_HDR), NULL),
                                    cerb__etcd_list(cerb__etcd_op_put(key, klen, done,
                                                                      VAL_HDR + len, lease),
                                                    NULL),
                                    cerb__etcd_list(op_get(key, klen), NULL)),
                     true, &call, &ok, &resp);
        if (st != CERB_OK) {
            landed = landed || call.outcome == CERB_OUTCOME_UNKNOWN;
            if (lease_missing(&call) && call.outcome == CERB_OUTCOME_NO && lease) {
                fresh = true;
                continue;
            }
            break;
        }
        if (ok) {
            json_decref(call.resp);
            break;
        }
        struct rec_view v;
        st = parse_record(e, cerb__etcd_txn_range(resp, 0), rec, &v);
        json_decref(call.resp);
        if (st == CERB_OK) {
            /* Our done-record: a copy of this finish landed already. */
            bool done_ours = v.exists && v.state == 'D' && v.mine;
            cerb__etcd_kv_clear(&v.kv);
            if (!done_ours)
                st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: guard record %s is not this "
                                     "attempt's claim", ep(e), rec->id);
        }
        break;
    }
    cerb__free(done);
    if (st == CERB_OK && lease && keep_ms > 0 &&
        cerb_monotime() > l_alive + (l_ttl_s * 1000 - keep_ms) * CERB_NS_PER_MS) {
        /* The put landed (before now) later in the shared lease's life than
         * choosing it allowed for (a pause between the choice and the put
         * being applied): alone, the lease would end the record less than
         * keep_ms after it landed, and a retry then would run again. Kept
         * alive, the lease lasts its TTL (more than keep_ms) from now. */
        int64_t left = 0, sent = 0;
        cerb_status ks = lease_keepalive(e, lease, &left, &sent);
        if (ks != CERB_OK || left * 1000 < keep_ms)
            CERB_LOG_E("etcd %s: guard %s: the success landed late in its lease, which could "
                       "not be kept alive (%s): the record may end before keep_ms, and a "
                       "retry after that run the operation again", ep(e), rec->id,
                       ks != CERB_OK ? cerb_last_error() : "the lease had ended");
    }
    if (st != CERB_OK && st != CERB_NOT_OWNER) {
        if (landed)
            *oc = CERB_OUTCOME_UNKNOWN;
        retire(e, rec->running_ms); /* as for a delete, above */
    }
    return st;
}

cerb_status cerb__etcd_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                   cerb_guard_found *found)
{
    struct rec_view v;
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = read_record(e, rec, &v);
    if (st != CERB_OK)
        return st;
    if (!v.exists)
        *found = CERB_GUARD_FOUND_NONE;
    else if (!v.mine)
        *found = CERB_GUARD_FOUND_OTHER;
    else
        *found = v.state == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
    cerb__etcd_kv_clear(&v.kv);
    return CERB_OK;
}
