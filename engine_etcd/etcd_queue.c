/*
 * etcd_queue.c — the members of a semaphore or a read-write lock on etcd:
 * one key per member, attached to the session lease, queued in create
 * revision order, each granted by a rule on the members ahead of it
 * (engine.h, struct cerb_queue_methods). The layouts (docs/semaphore.md and
 * docs/rwlock.md, "## etcd"):
 *
 *   semaphore NAME   members under Q = <prefix>NAME/ (etcdctl lock's prefix):
 *                      Q<lease hex>            the session's first member
 *                      Q<lease hex>.<token>    a further member of the session
 *                    value "<offset>" (one permit: the Cerberus mutex's value)
 *                    or "<offset>,<k>" (k permits); a value that is neither
 *                    (etcdctl's empty one) is one permit;
 *                    the limit in <prefix>NAME.limit (etcd_semaphore.c)
 *                    rule: the permits of the members ahead plus k <= limit
 *   read-write NAME  members under Q = <prefix>/rwlock/NAME/ (the empty first
 *                    segment is no lock name, so no lock's range holds them):
 *                      Qread/<token>, Qwrite/<token>   value "<offset>"
 *                    rule: a reader when no key of Qwrite/ is ahead, a
 *                    writer when no key of Q is ahead (the etcd recipe's)
 *
 * The key that blocks a member lies in its "blocking range" B: Q for a
 * semaphore member and a writer, Qwrite/ for a reader. Everything below is
 * the same for both primitives.
 *
 * Acquire. One txn puts our key K if it is absent (create_revision == 0),
 * comparing the fence offset key (etcd_fence.c), the closure record for a
 * client at an epoch (etcd_closure.c) and, for a semaphore, the stored
 * limit (etcd_semaphore.c), and reads B sorted by create revision in the
 * same txn: the members with a create revision below ours (the txn's
 * revision) are those ahead, and the rule decides at once. A failed
 * compare reads what failed (in the failure branch) and the txn goes again,
 * or the acquire is refused (a closure record, another limit); a txn that
 * failed on our own key only (a re-sent txn whose first copy landed, or a
 * key of this hold's earlier attempt) reads our key and B instead. The txn
 * is idempotent, so a lost answer is settled by sending it again.
 *
 * Waiting. The waiter reads, in one txn, its own key (gone: the session
 * ended, start over) and the members of B ahead of it (max create revision
 * = ours − 1). When the rule still refuses, it watches B for DELETEs
 * (etcd_watch.c, cerb__etcd_watch_range) and keeps its own arithmetic: a
 * delete of a member it counted frees that member's permits (a writer or
 * reader ahead counts one), and only when enough are freed for the rule —
 * its turn may have come — does it read again. So a release makes one read
 * per member it lets in, whoever else waits: no herd, one wake-up per
 * member. A watch that came up after the read re-reads B (keys only) once
 * to learn what it missed; every 5 s without news it reads anyway.
 *
 * Keys and claims. A member key that names the session
 * (Q<lease hex>) is shared by the session's successive members of the
 * name, so it is claimed first as the mutex's is (etcd_lease.c): a stale
 * hold (a failed acquire the core releases in the background) never
 * deletes the key of the current one, and a key with a delete pending is
 * deleted and put afresh. A session that already has a member of the name
 * (a second permit of the process, or the process's lock of the same
 * name) uses the token-named key; token-named keys belong to one
 * acquisition and need no claim. Every delete compares the key's create
 * revision (cerb__etcd_delete_key). Giving up deletes our key, re-sent
 * until definite, else hands it to the session thread (an orphan).
 *
 * Fences. A grant's fence is its key's create revision plus the offset it
 * was put with, as the mutex's; members are granted in create revision
 * order (a member ahead is granted whenever one behind it is), so fences
 * grow in grant order. A key of ours that carries no offset, or one below
 * lk->fence_floor, is deleted and put again.
 */
#include "internal_posix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "etcd_queue.h"
#include "log.h"

/* Restarts (key gone, session replaced) before an acquire gives up. */
#define MAX_RESTARTS 8

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static const char *ep(cerb_engine *e) { return cerb__etcd_endpoint(&e->http); }

static bool is_sem(const cerb_engine_lock *lk) { return lk->prim == CERB_PRIM_SEMAPHORE; }

/* ---- keys ---- */

cerb_status cerb__etcd_qkeys_init(struct etcd_qkeys *qk, const char *prefix, int prim,
                                  const char *name, int variant, int64_t lease,
                                  const char *token, bool alt)
{
    char hex[24];
    const char *pfx = prefix ? prefix : "";
    size_t pl = strlen(pfx), nl = strlen(name), tl = token ? strlen(token) : 0;
    int hl = snprintf(hex, sizeof hex, "%llx", (unsigned long long)lease);
    const bool sem = prim == CERB_PRIM_SEMAPHORE;
    const char *rw = sem ? "" : "/rwlock/";
    size_t rl = strlen(rw);
    const char *mode = variant == CERB_RW_WRITE ? "write/" : "read/";
    size_t ml = sem ? 0 : strlen(mode);

    memset(qk, 0, sizeof *qk);
    size_t ql = pl + rl + nl + 1;
    /* k, q, q_end, b, b_end, lim, each NUL-terminated */
    size_t need = (ql + ml + (size_t)hl + 1 + tl + 1) + 2 * (ql + 1) + 2 * (ql + 7) +
                  (pl + nl + 7);
    char *at = qk->mem = cerb__malloc(need);
    if (!at)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a key");
    char *q = at;
    memcpy(q, pfx, pl);
    memcpy(q + pl, rw, rl);
    memcpy(q + pl + rl, name, nl);
    q[ql - 1] = '/';
    q[ql] = '\0';
    at += ql + 1;
    qk->q = q;
    qk->q_len = ql;
    size_t en;
    qk->q_end = at;
    cerb__etcd_prefix_end(q, ql, qk->q_end, &en);
    qk->q_end[en] = '\0';
    qk->q_end_len = en;
    at += ql + 1;
    /* the member key */
    char *k = at;
    memcpy(k, q, ql);
    size_t kl = ql;
    if (sem) {
        memcpy(k + kl, hex, (size_t)hl);
        kl += (size_t)hl;
        if (alt) {
            k[kl++] = '.';
            memcpy(k + kl, token, tl);
            kl += tl;
        }
    } else {
        memcpy(k + kl, mode, ml);
        kl += ml;
        memcpy(k + kl, token, tl);
        kl += tl;
    }
    k[kl] = '\0';
    qk->k = k;
    qk->len = kl;
    at += kl + 1;
    /* the blocking range */
    if (sem || variant == CERB_RW_WRITE) {
        qk->b = qk->q;
        qk->b_len = qk->q_len;
        qk->b_end = qk->q_end;
        qk->b_end_len = qk->q_end_len;
    } else {
        qk->b = at;
        qk->b_len = ql + 6;
        memcpy(qk->b, q, ql);
        memcpy(qk->b + ql, "write/", 6);
        qk->b[qk->b_len] = '\0';
        at += qk->b_len + 1;
        qk->b_end = at;
        cerb__etcd_prefix_end(qk->b, qk->b_len, qk->b_end, &en);
        qk->b_end[en] = '\0';
        qk->b_end_len = en;
        at += qk->b_len + 1;
    }
    if (sem) {
        qk->lim = at;
        memcpy(qk->lim, pfx, pl);
        memcpy(qk->lim + pl, name, nl);
        memcpy(qk->lim + pl + nl, ".limit", 7);
        qk->lim_len = pl + nl + 6;
    }
    return CERB_OK;
}

void cerb__etcd_qkeys_free(struct etcd_qkeys *qk)
{
    cerb__free(qk->mem);
    memset(qk, 0, sizeof *qk);
}

static cerb_status keys_of(cerb_engine *e, const cerb_engine_lock *lk, int64_t lease, bool alt,
                           struct etcd_qkeys *qk)
{
    return cerb__etcd_qkeys_init(qk, e->ec->prefix, lk->prim, lk->name, lk->variant, lease,
                                 lk->token, alt);
}

/* ---- values ---- */

size_t cerb__etcd_qvalue_format(int64_t off, unsigned count, char *buf, size_t n)
{
    int k = count > 1 ? snprintf(buf, n, "%lld,%u", (long long)off, count)
                      : snprintf(buf, n, "%lld", (long long)off);
    return k > 0 && (size_t)k < n ? (size_t)k : 0;
}

void cerb__etcd_qvalue_parse(const char *v, size_t n, int64_t *off, unsigned *count)
{
    *off = -1;
    *count = 1;
    if (!v || n == 0)
        return;
    const char *comma = memchr(v, ',', n);
    size_t ol = comma ? (size_t)(comma - v) : n;
    int64_t o;
    if (!cerb__etcd_fence_parse(v, ol, &o))
        return;
    if (comma) {
        char buf[16];
        size_t cl = n - ol - 1;
        if (cl == 0 || cl >= sizeof buf)
            return;
        memcpy(buf, comma + 1, cl);
        buf[cl] = '\0';
        char *end;
        errno = 0;
        unsigned long c = strtoul(buf, &end, 10);
        if (*end || errno || c < 1 || c > CERB_SEMAPHORE_MAX || buf[0] < '0' || buf[0] > '9')
            return;
        *count = (unsigned)c;
    }
    *off = o;
}

/* ---- what a read finds ---- */

struct q_member {
    char *key;
    size_t len;
    int64_t rev;
    unsigned count; /* permits (semaphore); 1 for a read-write lock member */
    bool gone;      /* seen deleted while waiting */
};

struct q_view {
    bool own;            /* our key exists */
    int64_t mine;        /* its create revision */
    int64_t off;         /* the offset it was put with (-1: none) */
    unsigned own_count;  /* the permits its value says */
    int64_t header;      /* revision of the read */
    /* the members of the blocking range ahead of ours, in create order */
    struct q_member *ahead;
    size_t n, cap;
    int64_t sum;         /* their permits (or count) */
    int64_t below;       /* collect only members below this revision (0: all) */
    bool sem;
};

static void view_clear(struct q_view *v)
{
    for (size_t i = 0; i < v->n; i++)
        cerb__free(v->ahead[i].key);
    cerb__free(v->ahead);
    memset(v, 0, sizeof *v);
}

static bool view_add(void *ud, const struct etcd_kv *kv)
{
    struct q_view *v = ud;
    if (v->below > 0 && kv->create_revision >= v->below)
        return true;
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 8;
        struct q_member *nv = cerb__realloc(v->ahead, cap * sizeof *nv);
        if (!nv)
            return false;
        v->ahead = nv;
        v->cap = cap;
    }
    struct q_member *m = &v->ahead[v->n];
    memset(m, 0, sizeof *m);
    m->key = cerb__malloc(kv->key_len + 1);
    if (!m->key)
        return false;
    memcpy(m->key, kv->key, kv->key_len + 1);
    m->len = kv->key_len;
    m->rev = kv->create_revision;
    m->count = 1;
    if (v->sem) {
        int64_t off;
        cerb__etcd_qvalue_parse(kv->value, kv->value_len, &off, &m->count);
    }
    v->sum += m->count;
    v->n++;
    return true;
}

/* Our key from range response `own` (with its value) into v. */
static cerb_status view_own(const json_t *own, struct q_view *v)
{
    struct etcd_range_res r = {0};
    cerb_status st = cerb__etcd_parse_range(own, &r);
    if (st != CERB_OK)
        return st;
    v->own = r.n_kvs > 0;
    v->mine = v->own ? r.first.create_revision : 0;
    v->off = -1;
    v->own_count = 1;
    if (v->own)
        cerb__etcd_qvalue_parse(r.first.value, r.first.value_len, &v->off, &v->own_count);
    cerb__etcd_kv_clear(&r.first);
    return CERB_OK;
}

/* The members of `range` below v->below into v. */
static cerb_status view_ahead(cerb_engine *e, const json_t *range, struct q_view *v)
{
    if (!range)
        return cerb__error_set(CERB_EPROTO, "etcd %s: a txn response is not a range", ep(e));
    return cerb__etcd_range_each(range, view_add, v);
}

/* The rule (engine.h): may lk's member be granted, given those ahead? */
static bool rule_grants(const cerb_engine_lock *lk, const struct q_view *v)
{
    if (is_sem(lk))
        return v->sum + (int64_t)lk->count <= lk->limit;
    return v->n == 0;
}

/* range B sorted by create revision (ascending), below `below` when > 0. */
static json_t *op_blockers(const cerb_engine_lock *lk, const struct etcd_qkeys *qk, int64_t below,
                           bool keys_only)
{
    struct etcd_range_req r = {.key = qk->b,
                               .key_len = qk->b_len,
                               .end = qk->b_end,
                               .end_len = qk->b_end_len,
                               .sort_order = ETCD_SORT_ASCEND,
                               .sort_target = ETCD_TARGET_CREATE,
                               .max_create_revision = below > 0 ? below - 1 : 0,
                               .keys_only = keys_only || !is_sem(lk)};
    return cerb__etcd_op_range(&r);
}

static json_t *op_own(const struct etcd_qkeys *qk)
{
    struct etcd_range_req r = {.key = qk->k, .key_len = qk->len};
    return cerb__etcd_op_range(&r);
}

/*
 * Read our key and the members of B ahead of it (below `hint` when known,
 * then filtered by our key's actual revision) in one read-only txn.
 */
static cerb_status read_view(cerb_engine *e, const cerb_engine_lock *lk,
                             const struct etcd_qkeys *qk, int64_t hint, int64_t deadline_ns,
                             struct q_view *v)
{
    struct etcd_call call;
    bool ok;
    const json_t *resp;

    view_clear(v);
    v->sem = is_sem(lk);
    json_t *req = cerb__etcd_txn(NULL, cerb__etcd_list(op_own(qk), op_blockers(lk, qk, hint, false)),
                                 NULL);
    cerb_status st = cerb__etcd_run_txn(e, "queue read", req, 2, deadline_ns, &call, &ok,
                                        &v->header, &resp);
    if (st != CERB_OK)
        return st;
    st = view_own(cerb__etcd_txn_range(resp, 0), v);
    if (st == CERB_OK && v->own) {
        v->below = v->mine;
        st = view_ahead(e, cerb__etcd_txn_range(resp, 1), v);
    }
    json_decref(call.resp);
    if (st != CERB_OK)
        view_clear(v);
    return st;
}

/* ---- the acquire txn ---- */

/*
 * Put our key (value `val`) unless it exists, with the compares that make
 * the grant safe, and read B in the same txn. On success *v holds our key
 * and the members ahead. !v->own with CERB_OK: the txn failed on our key
 * only (it exists: read it, read_view). Refusals: CERB_UNAVAILABLE (a
 * closure record: *closed_epoch), CERB_ECONFIG (another limit: *no_prim).
 */
static cerb_status put_txn(cerb_engine *e, const cerb_engine_lock *lk, const struct etcd_qkeys *qk,
                           int64_t lease, bool maybe_exists, int64_t deadline_ns,
                           struct q_view *v, struct etcd_call *call, int64_t *closed_epoch,
                           int *no_prim)
{
    const int64_t epoch = lk->epoch;
    const bool check = epoch >= 0;
    struct etcd_fence_view fv;
    struct etcd_closure_view cv;
    struct etcd_qlimit lim;
    bool landed = false;
    cerb_status st;

    *closed_epoch = 0;
    *no_prim = 0;
    cerb__etcd_qlimit_start(&lim);
    for (int round = 0;; round++) {
        bool ok = false;
        int64_t rev = 0;
        const json_t *resp;

        view_clear(v);
        v->sem = is_sem(lk);
        memset(call, 0, sizeof *call);
        call->grpc_code = -1;
        call->outcome = landed ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
        if (round > MAX_RESTARTS)
            return cerb__error_set(CERB_EIO,
                                   "etcd %s: the fence offset, closure record or limit of "
                                   "\"%s\" kept changing",
                                   ep(e), lk->name);
        st = cerb__etcd_fence_prepare(e, lk->fence_floor, deadline_ns, &fv);
        if (st != CERB_OK)
            return st;
        if (check) {
            cerb__etcd_closure_view(e, &cv);
            if (cerb__etcd_closure_refuses(&cv.rec, epoch)) {
                st = cerb__etcd_closure_read(e, deadline_ns, &cv);
                if (st != CERB_OK)
                    return st;
                if (cerb__etcd_closure_refuses(&cv.rec, epoch)) {
                    if (maybe_exists || landed)
                        cerb__etcd_drop_key(e, qk->k, qk->len, 0);
                    call->outcome = CERB_OUTCOME_NO;
                    *closed_epoch = cv.rec.epoch;
                    return cerb__etcd_closure_refuse(e, &cv.rec, epoch);
                }
            }
        }
        char val[40];
        size_t vn = cerb__etcd_qvalue_format(fv.offset, is_sem(lk) ? lk->count : 1, val,
                                             sizeof val);
        json_t *cmp = json_array(), *succ = json_array(), *fail = json_array();
        bool bad = !cmp || !succ || !fail;
        bad = bad || json_array_append_new(cmp, cerb__etcd_cmp_create(qk->k, qk->len, NULL, 0,
                                                                      "EQUAL", 0));
        bad = bad || json_array_append_new(cmp, cerb__etcd_fence_cmp(e, &fv));
        bad = bad || (check && json_array_append_new(cmp, cerb__etcd_closure_cmp(e, &cv)));
        bad = bad || (is_sem(lk) && cerb__etcd_qlimit_cmp(e, lk, qk, &lim, cmp));
        bad = bad || json_array_append_new(succ, cerb__etcd_op_put(qk->k, qk->len, val, vn, lease));
        bad = bad || (is_sem(lk) && cerb__etcd_qlimit_put(lk, qk, &lim, succ));
        bad = bad || json_array_append_new(succ, op_blockers(lk, qk, 0, false));
        bad = bad || json_array_append_new(fail, cerb__etcd_fence_op_read(e));
        bad = bad || (check && json_array_append_new(fail, cerb__etcd_closure_op_read(e)));
        bad = bad || (is_sem(lk) && cerb__etcd_qlimit_reads(qk, fail));
        if (bad || vn == 0) {
            json_decref(cmp);
            json_decref(succ);
            json_decref(fail);
            return cerb__error_set(CERB_ENOMEM, "etcd: out of memory for a request");
        }
        size_t n_succ = json_array_size(succ);
        ETCD_COUNT(e, acquire_calls);
        st = cerb__etcd_run_txn(e, "queue txn", cerb__etcd_txn(cmp, succ, fail), 0, deadline_ns,
                                call, &ok, &rev, &resp);
        if (st != CERB_OK) {
            if (landed)
                call->outcome = CERB_OUTCOME_UNKNOWN;
            return st;
        }
        if (ok) {
            /* Put at the txn's revision; the last response is B. */
            if (json_array_size(resp) != n_succ) {
                json_decref(call->resp);
                call->resp = NULL;
                call->outcome = CERB_OUTCOME_UNKNOWN;
                return cerb__error_set(CERB_EPROTO, "etcd %s: queue txn: %zu responses", ep(e),
                                       json_array_size(resp));
            }
            v->own = true;
            v->mine = v->below = v->header = rev;
            v->off = fv.offset;
            v->own_count = is_sem(lk) ? lk->count : 1;
            st = view_ahead(e, cerb__etcd_txn_range(resp, n_succ - 1), v);
            json_decref(call->resp);
            call->resp = NULL;
            if (st != CERB_OK) {
                call->outcome = CERB_OUTCOME_UNKNOWN;
                view_clear(v);
            }
            return st;
        }
        bool changed = false, closure_changed = false, limit_changed = false;
        size_t at = 0;
        st = cerb__etcd_fence_learn(e, cerb__etcd_txn_range(resp, at++), rev, &fv, &changed);
        if (st == CERB_OK && check)
            st = cerb__etcd_closure_learn(e, cerb__etcd_txn_range(resp, at++), rev, &cv,
                                          &closure_changed);
        if (st == CERB_OK && is_sem(lk))
            st = cerb__etcd_qlimit_learn(e, lk, resp, at, &lim, &limit_changed);
        maybe_exists = maybe_exists || call->resent;
        landed = landed || call->resent;
        json_decref(call->resp);
        call->resp = NULL;
        if (st != CERB_OK && st != CERB_ECONFIG) {
            call->outcome = CERB_OUTCOME_UNKNOWN;
            return st;
        }
        if (st == CERB_ECONFIG || (check && cerb__etcd_closure_refuses(&cv.rec, epoch))) {
            /* Refused: nothing of ours may stay queued. */
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            if (maybe_exists)
                cerb__etcd_drop_key(e, qk->k, qk->len, 0);
            call->outcome = CERB_OUTCOME_NO;
            if (st == CERB_ECONFIG) {
                *no_prim = 1;
                return cerb__error_set(CERB_ECONFIG, "%s", why);
            }
            *closed_epoch = cv.rec.epoch;
            return cerb__etcd_closure_refuse(e, &cv.rec, epoch);
        }
        if (!changed && !closure_changed && !limit_changed)
            return CERB_OK; /* our key is what failed it: it exists */
    }
}

/* ---- waiting ---- */

struct q_wait {
    cerb_engine *e;
    const cerb_engine_lock *lk;
    const struct etcd_qkeys *qk;
    struct q_view *v;
    int64_t freed, need;
};

/* A DELETE in B: a member we counted left (or our own key went: its
 * session ended, or someone deleted it; read again and start over). */
static bool on_deleted(void *ud, const char *key, size_t len)
{
    struct q_wait *w = ud;
    if (len == w->qk->len && memcmp(key, w->qk->k, len) == 0)
        return true;
    for (size_t i = 0; i < w->v->n; i++) {
        struct q_member *m = &w->v->ahead[i];
        if (!m->gone && m->len == len && memcmp(m->key, key, len) == 0) {
            m->gone = true;
            w->freed += m->count;
            break;
        }
    }
    return w->freed >= w->need;
}

struct q_present {
    struct q_view *v;
    bool *seen;
};

static bool mark_present(void *ud, const struct etcd_kv *kv)
{
    struct q_present *p = ud;
    for (size_t i = 0; i < p->v->n; i++)
        if (p->v->ahead[i].rev == kv->create_revision && p->v->ahead[i].len == kv->key_len &&
            memcmp(p->v->ahead[i].key, kv->key, kv->key_len) == 0)
            p->seen[i] = true;
    return true;
}

/* The watch came up after our read: which members ahead left meanwhile? */
static int on_gap(void *ud)
{
    struct q_wait *w = ud;
    bool *seen = cerb__calloc(w->v->n ? w->v->n : 1, sizeof *seen);
    if (!seen)
        return -1;
    json_t *answer = NULL;
    json_t *req = op_blockers(w->lk, w->qk, w->v->mine, true);
    json_t *rr = req ? json_incref(json_object_get(req, "request_range")) : NULL;
    json_decref(req);
    cerb_status st = rr ? cerb__etcd_post(w->e, "queue gap read", "/v3/kv/range", rr,
                                          cerb__deadline_in(w->e->ec->op_timeout_ms), NULL,
                                          &answer)
                        : CERB_ENOMEM;
    struct q_present p = {w->v, seen};
    if (st == CERB_OK)
        st = cerb__etcd_range_each(answer, mark_present, &p);
    json_decref(answer);
    int r = -1;
    if (st == CERB_OK) {
        for (size_t i = 0; i < w->v->n; i++)
            if (!seen[i] && !w->v->ahead[i].gone) {
                w->v->ahead[i].gone = true;
                w->freed += w->v->ahead[i].count;
            }
        r = w->freed >= w->need ? 1 : 0;
    }
    cerb__free(seen);
    return r;
}

enum turn { TURN_OWNER, TURN_RESTART, TURN_STOP };

/*
 * Wait until the rule grants our key (the view *v, read when it was
 * refused). TURN_OWNER (with *v our key's latest read), TURN_RESTART (our
 * key or session is gone), TURN_STOP with *st (TIMEOUT, INTERRUPTED, or an
 * error that lasted longer than the error budget).
 */
static enum turn wait_turn(cerb_engine *e, cerb_engine_lock *lk, const struct etcd_qkeys *qk,
                           int64_t deadline_ns, const atomic_int *intr, struct q_view *v,
                           cerb_status *st)
{
    struct etcd_lock_priv *p = lk->priv;
    int64_t err_since = 0;
    int64_t budget_ns = max64(3 * e->ec->op_timeout_ms, ETCD_ERR_BUDGET_MS) * CERB_NS_PER_MS;
    bool fresh = true; /* *v is a read made just now */

    for (;;) {
        struct etcd_session s;
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
        cerb_status rs = CERB_OK;
        if (!fresh)
            rs = read_view(e, lk, qk, v->mine, min64(deadline_ns,
                                                     cerb__deadline_in(e->ec->op_timeout_ms)),
                           v);
        fresh = false;
        if (rs == CERB_OK) {
            err_since = 0;
            if (!v->own) {
                CERB_LOG_I("etcd %s: key %s vanished while waiting; queuing again", ep(e), qk->k);
                return TURN_RESTART;
            }
            if (rule_grants(lk, v))
                return TURN_OWNER;
            struct q_wait w = {.e = e, .lk = lk, .qk = qk, .v = v, .freed = 0,
                               .need = is_sem(lk) ? v->sum + lk->count - lk->limit : v->sum};
            struct etcd_watch_range wr = {.end = qk->b_end, .end_len = qk->b_end_len,
                                          .deleted = on_deleted, .gap = on_gap, .ud = &w};
            enum etcd_watch_end end;
            int64_t until = min64(deadline_ns, cerb__deadline_in(ETCD_RECHECK_MS));
            rs = cerb__etcd_watch_range(e, lk, qk->b, qk->b_len, &wr, v->header, until, intr,
                                        p->gen, &end);
            if (rs == CERB_OK) {
                if (end == ETCD_WATCH_DELETED)
                    ETCD_COUNT(e, wakeups);
                continue;
            }
        }
        int64_t now = cerb_monotime();
        if (err_since == 0)
            err_since = now;
        if (now - err_since >= budget_ns) {
            *st = rs;
            return TURN_STOP;
        }
        cerb__etcd_nap(20 + (int64_t)cerb__rand_below(60), deadline_ns, intr);
    }
}

/* ---- acquire ---- */

/* Give up on our key: delete it (or hand it over), drop the claim. */
static void give_up(cerb_engine *e, cerb_engine_lock *lk, struct etcd_qkeys *qk, int64_t rev)
{
    cerb__etcd_drop_key(e, qk->k, qk->len, rev);
    cerb__etcd_unclaim(e, lk);
    cerb__etcd_qkeys_free(qk);
}

/*
 * Choose our key for this attempt and claim it when it names the session:
 * the session's key unless another hold of this client has it (then the
 * token-named one), or the key of this hold's earlier attempt.
 */
static cerb_status choose_key(cerb_engine *e, cerb_engine_lock *lk, const struct etcd_session *s,
                              bool *maybe_exists, int64_t deadline_ns, struct etcd_qkeys *qk)
{
    struct etcd_lock_priv *p = lk->priv;
    bool orphaned = false;
    cerb_status st;

    if (!is_sem(lk) || (*maybe_exists && p->alt)) {
        p->alt = true;
        return keys_of(e, lk, s->id, true, qk);
    }
    p->alt = false;
    st = keys_of(e, lk, s->id, false, qk);
    if (st != CERB_OK)
        return st;
    /* The claim compares the mutex's key shape, which is ours. */
    struct etcd_key mk;
    st = cerb__etcd_key_init(&mk, e->ec->prefix, lk->name, s->id);
    if (st == CERB_OK) {
        st = cerb__etcd_claim(e, lk, &mk, s->id, false, deadline_ns, &orphaned);
        cerb__etcd_key_free(&mk);
    }
    if (st == CERB_BUSY) {
        /* Another member (or the lock) of this session has it. */
        cerb__etcd_qkeys_free(qk);
        p->alt = true;
        *maybe_exists = false;
        return keys_of(e, lk, s->id, true, qk);
    }
    if (st != CERB_OK) {
        cerb__etcd_qkeys_free(qk);
        return st;
    }
    if (orphaned) {
        /* A delete of it is pending somewhere (etcd_mutex.c): never adopt
         * such a key; delete it at its own revision and put a new one. */
        cerb_status ds = cerb__etcd_delete_key(e, qk->k, qk->len, 0, deadline_ns, NULL, NULL);
        if (ds != CERB_OK) {
            cerb__etcd_orphan_add(e, qk->k, qk->len, 0);
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_qkeys_free(qk);
            return ds;
        }
    }
    return CERB_OK;
}

cerb_status cerb__etcd_queue_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                     const atomic_int *interrupted, cerb_grant *grant)
{
    struct etcd_lock_priv *p = lk->priv;
    const bool try_only = deadline_ns == 0;
    const int64_t op_ns = e->ec->op_timeout_ms * CERB_NS_PER_MS;
    struct q_view v = {0};
    cerb_status st = CERB_OK;

    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    for (int restarts = 0;; restarts++) {
        struct etcd_session s;
        struct etcd_qkeys qk;
        struct etcd_call call;
        int64_t now = cerb_monotime();

        view_clear(&v);
        if (restarts > MAX_RESTARTS)
            return cerb__error_set(CERB_EIO, "etcd %s: \"%s\": our key kept vanishing", ep(e),
                                   lk->name);
        if (!try_only && restarts > 0 && now >= deadline_ns)
            return cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out", lk->name);
        st = cerb__etcd_session_get(e, now + op_ns, &s);
        if (st != CERB_OK)
            return st;
        bool maybe_exists = restarts == 0 && p->lease == s.id && p->gen == s.gen;
        p->lease = s.id;
        p->gen = s.gen;
        p->rev = 0;
        st = choose_key(e, lk, &s, &maybe_exists, now + op_ns, &qk);
        if (st != CERB_OK)
            return st == CERB_BUSY ? CERB_EIO : st;

        int64_t req_deadline = now + op_ns;
        if (!try_only && deadline_ns - now > op_ns)
            req_deadline = min64(deadline_ns,
                                 now + max64(op_ns, ETCD_ERR_BUDGET_MS * CERB_NS_PER_MS));
        int64_t closed_epoch = 0;
        int no_prim = 0;
        st = put_txn(e, lk, &qk, s.id, maybe_exists, req_deadline, &v, &call, &closed_epoch,
                     &no_prim);
        if (st == CERB_OK && !v.own) {
            /* Our key was there already: where is it? */
            st = read_view(e, lk, &qk, 0, req_deadline, &v);
            if (st != CERB_OK)
                call.outcome = CERB_OUTCOME_UNKNOWN;
            else if (!v.own) {
                /* Gone meanwhile (its session, a delete): queue again. */
                cerb__etcd_unclaim(e, lk);
                cerb__etcd_qkeys_free(&qk);
                continue;
            }
        }
        if (st != CERB_OK) {
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_qkeys_free(&qk);
            view_clear(&v);
            grant->outcome = call.outcome;
            grant->closed_epoch = closed_epoch;
            grant->no_prim = no_prim;
            if (call.grpc_code == ETCD_GRPC_NOT_FOUND && call.outcome == CERB_OUTCOME_NO &&
                !no_prim && !closed_epoch) {
                /* "requested lease not found": our session is gone. */
                cerb__etcd_await_session(e, s.gen, try_only ? now + op_ns : deadline_ns);
                grant->outcome = CERB_OUTCOME_NO;
                continue;
            }
            return st;
        }
        int64_t mine = v.mine;
        if (v.off < 0 || v.own_count != (is_sem(lk) ? lk->count : 1) ||
            (lk->fence_floor > 0 && (uint64_t)(mine + v.off) <= lk->fence_floor)) {
            /* A key of ours this acquire did not put (another attempt's,
             * another count, no offset) or put below the floor: its fence
             * would not rank where this grant must. Queue again. */
            CERB_LOG_I("etcd %s: key %s (revision %lld, offset %lld) is no key to grant "
                       "above fence floor %llu with %u permits; queuing again",
                       ep(e), qk.k, (long long)mine, (long long)v.off,
                       (unsigned long long)lk->fence_floor, lk->count);
            give_up(e, lk, &qk, mine);
            continue;
        }
        enum turn t = TURN_OWNER;
        if (!rule_grants(lk, &v)) {
            if (try_only) {
                give_up(e, lk, &qk, mine);
                view_clear(&v);
                return cerb__error_set(CERB_BUSY, "etcd %s: \"%s\" is taken (%s)", ep(e),
                                       lk->name,
                                       is_sem(lk) ? "not enough permits free" : "held");
            }
            t = wait_turn(e, lk, &qk, deadline_ns, interrupted, &v, &st);
            mine = v.own ? v.mine : mine;
        }
        if (t == TURN_STOP) {
            give_up(e, lk, &qk, mine);
            view_clear(&v);
            return st;
        }
        if (t == TURN_RESTART) {
            cerb__etcd_unclaim(e, lk);
            cerb__etcd_qkeys_free(&qk);
            continue;
        }
        struct etcd_session now_s;
        cerb__etcd_session_peek(e, &now_s);
        if (now_s.gen != s.gen || !now_s.live) {
            give_up(e, lk, &qk, mine);
            continue;
        }
        p->rev = mine;
        p->off = v.off;
        if (!cerb__etcd_grant_fill(e, &now_s, mine + v.off, grant)) {
            give_up(e, lk, &qk, mine);
            cerb__etcd_await_session(e, now_s.gen,
                                     try_only ? cerb__deadline_in(e->ec->op_timeout_ms)
                                              : deadline_ns);
            continue;
        }
        cerb__etcd_qkeys_free(&qk);
        view_clear(&v);
        return CERB_OK; /* a claim (session key) stays until release */
    }
}

/* ---- release, check ---- */

cerb_status cerb__etcd_queue_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct etcd_lock_priv *p = lk->priv;
    struct etcd_session s;
    struct etcd_qkeys qk;
    cerb_status st;

    if (!p->lease)
        return cerb__error_set(CERB_NOT_OWNER, "etcd: \"%s\" was never put", lk->name);
    cerb__etcd_session_peek(e, &s);
    bool holder = cerb__etcd_claimed(e, lk);
    if (p->gen != s.gen) {
        cerb__etcd_unclaim(e, lk);
        return cerb__error_set(CERB_NOT_OWNER,
                               "etcd %s: \"%s\": the session (lease %llx) holding it has ended",
                               ep(e), lk->name, (unsigned long long)p->lease);
    }
    st = keys_of(e, lk, p->lease, p->alt, &qk);
    if (st != CERB_OK)
        return st;
    int64_t d = cerb__deadline_in(2 * e->ec->op_timeout_ms);
    bool temp = false;
    if (!p->alt && !holder) {
        /* The session's key, without the claim: a hold whose acquire
         * failed; the key may be another (current) hold's now. */
        struct etcd_key mk;
        st = cerb__etcd_key_init(&mk, e->ec->prefix, lk->name, p->lease);
        if (st == CERB_OK) {
            st = cerb__etcd_claim(e, lk, &mk, p->lease, true, d, NULL);
            cerb__etcd_key_free(&mk);
        }
        if (st == CERB_BUSY)
            st = cerb__error_set(CERB_NOT_OWNER, "etcd: \"%s\": the key is another hold's now",
                                 lk->name);
        if (st != CERB_OK) {
            cerb__etcd_qkeys_free(&qk);
            return st;
        }
        temp = true;
    }
    bool deleted = false;
    st = cerb__etcd_delete_key(e, qk.k, qk.len, p->rev, d, NULL, &deleted);
    if (st == CERB_OK && !deleted)
        st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\" is not held by this session (key %s "
                                             "is gone)",
                             ep(e), lk->name, qk.k);
    else if (st != CERB_OK)
        cerb__etcd_orphan_add(e, qk.k, qk.len, p->rev);
    (void)temp;
    cerb__etcd_unclaim(e, lk);
    cerb__etcd_qkeys_free(&qk);
    return st;
}

/*
 * Is lk's member granted? Read our key and B in one txn; a member of ours
 * that is still waiting (an acquire whose answer was lost) is nobody's: it
 * goes, and the answer is NOT_OWNER.
 */
cerb_status cerb__etcd_queue_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct etcd_lock_priv *p = lk->priv;
    struct etcd_session s;
    struct etcd_qkeys qk;
    struct q_view v = {0};

    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    if (!p->lease)
        return cerb__error_set(CERB_NOT_OWNER, "etcd: \"%s\" was never put", lk->name);
    cerb__etcd_session_peek(e, &s);
    if (p->gen != s.gen || !s.live)
        return cerb__error_set(CERB_NOT_OWNER,
                               "etcd %s: \"%s\": the session (lease %llx) of this hold has ended",
                               ep(e), lk->name, (unsigned long long)p->lease);
    cerb_status st = keys_of(e, lk, p->lease, p->alt, &qk);
    if (st != CERB_OK)
        return st;
    int64_t d = cerb__deadline_in(e->ec->op_timeout_ms);
    bool temp = !p->alt && !cerb__etcd_claimed(e, lk);
    if (temp) {
        struct etcd_key mk;
        st = cerb__etcd_key_init(&mk, e->ec->prefix, lk->name, p->lease);
        if (st == CERB_OK) {
            st = cerb__etcd_claim(e, lk, &mk, p->lease, true, d, NULL);
            cerb__etcd_key_free(&mk);
        }
        if (st != CERB_OK) {
            cerb__etcd_qkeys_free(&qk);
            if (st == CERB_BUSY)
                return cerb__error_set(CERB_NOT_OWNER,
                                       "etcd: \"%s\": the key is another hold's now", lk->name);
            return st;
        }
    }
    st = read_view(e, lk, &qk, 0, d, &v);
    bool keep = false;
    if (st == CERB_OK) {
        bool fence_ok = v.off >= 0 && v.own_count == (is_sem(lk) ? lk->count : 1) &&
                        (lk->fence_floor == 0 || (uint64_t)(v.mine + v.off) > lk->fence_floor);
        cerb__etcd_session_peek(e, &s);
        if (!v.own) {
            st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\": no key of this hold", ep(e),
                                 lk->name);
        } else if (rule_grants(lk, &v) && fence_ok && s.gen == p->gen && s.live &&
                   cerb__etcd_grant_fill(e, &s, v.mine + v.off, grant)) {
            p->rev = v.mine;
            p->off = v.off;
            keep = true;
        } else {
            cerb__etcd_drop_key(e, qk.k, qk.len, v.mine);
            st = cerb__error_set(CERB_NOT_OWNER, "etcd %s: \"%s\" is not held by this hold", ep(e),
                                 lk->name);
        }
    }
    if (temp && keep)
        cerb__etcd_claim_keep(e, lk);
    else if (temp)
        cerb__etcd_unclaim(e, lk);
    view_clear(&v);
    cerb__etcd_qkeys_free(&qk);
    return st;
}

/* ---- held, inspect ---- */

cerb_status cerb__etcd_queue_held(cerb_engine *e, int prim, const char *name)
{
    struct etcd_qkeys qk;
    cerb_status st = cerb__etcd_qkeys_init(&qk, e->ec->prefix, prim, name, CERB_RW_WRITE, 0, "",
                                           false);
    if (st != CERB_OK)
        return st;
    struct etcd_range_req rq = {.key = qk.q, .key_len = qk.q_len, .end = qk.q_end,
                                .end_len = qk.q_end_len, .count_only = true};
    json_t *answer;
    st = cerb__etcd_post(e, "held", "/v3/kv/range", cerb__etcd_range_json(&rq),
                         cerb__deadline_in(e->ec->op_timeout_ms), NULL, &answer);
    cerb__etcd_qkeys_free(&qk);
    if (st != CERB_OK)
        return st;
    struct etcd_range_res rr;
    st = cerb__etcd_parse_range(answer, &rr);
    json_decref(answer);
    if (st != CERB_OK)
        return st;
    cerb__etcd_kv_clear(&rr.first);
    if (rr.count > 0)
        return cerb__error_set(CERB_BUSY, "etcd: %s \"%s\" has members (%lld keys)",
                               cerb__prim_name(prim), name, (long long)rr.count);
    return CERB_OK;
}

/* The lease's seconds left (-1: gone or unknown). */
static int64_t lease_left(cerb_engine *e, int64_t lease, int64_t deadline)
{
    json_t *answer;
    int64_t ttl = -1;
    if (cerb__etcd_post(e, "inspect: lease time to live", "/v3/lease/timetolive",
                        json_pack("{s:o}", "ID", cerb__etcd_json_i64(lease)), deadline, NULL,
                        &answer) != CERB_OK)
        return -1;
    if (cerb__etcd_get_i64(answer, "TTL", &ttl) != CERB_OK)
        ttl = -1;
    json_decref(answer);
    return ttl;
}

struct q_inspect {
    cerb_engine *e;
    int prim;
    const struct etcd_qkeys *qk;
    int64_t limit;
    struct cerb_holders *out;
    int64_t deadline;
    int64_t sum;         /* semaphore: permits of the members so far */
    bool writer_seen;    /* read-write: a writer so far */
    bool any_seen;
    bool waiting;        /* a member so far waits: all after it do */
    cerb_status st;
};

static bool inspect_one(void *ud, const struct etcd_kv *kv)
{
    struct q_inspect *in = ud;
    if (in->st != CERB_OK)
        return true;
    int64_t off;
    unsigned count;
    cerb__etcd_qvalue_parse(kv->value, kv->value_len, &off, &count);
    const char *owner = kv->key + in->qk->q_len;
    size_t owner_len = kv->key_len > in->qk->q_len ? kv->key_len - in->qk->q_len : 0;
    char detail[64];
    bool granted;
    if (in->prim == CERB_PRIM_SEMAPHORE) {
        if (in->sum + (int64_t)count > in->limit)
            in->waiting = true;
        granted = !in->waiting;
        in->sum += count;
        snprintf(detail, sizeof detail, "permits %u of %lld", count, (long long)in->limit);
    } else {
        bool write = owner_len >= 6 && memcmp(owner, "write/", 6) == 0;
        if (write ? in->any_seen : in->writer_seen)
            in->waiting = true;
        granted = !in->waiting;
        in->any_seen = true;
        in->writer_seen = in->writer_seen || write;
        snprintf(detail, sizeof detail, "%s", write ? "write" : "read");
        /* The owner is the token after read/ or write/. */
        size_t cut = write ? 6 : (owner_len >= 5 && memcmp(owner, "read/", 5) == 0 ? 5 : 0);
        owner += cut;
        owner_len -= cut;
    }
    int64_t ttl = -1;
    if (granted && kv->lease) {
        ttl = lease_left(in->e, kv->lease, in->deadline);
        ttl = ttl >= 0 ? ttl * 1000 : -1;
    }
    in->st = cerb__holders_add(in->out, owner, owner_len, !granted,
                               granted ? (uint64_t)(kv->create_revision + (off > 0 ? off : 0)) : 0,
                               ttl, detail);
    return true;
}

/*
 * inspect: one linearizable read of the queue (and, for a semaphore, its
 * limit), sorted by create revision; the rule applied in order gives the
 * holders (a prefix) and the waiters; each holder's lease time to live is
 * one more request. A semaphore without a stored limit (only etcdctl's
 * keys) is read with a limit of 1, etcdctl lock's.
 */
cerb_status cerb__etcd_queue_inspect(cerb_engine *e, int prim, const char *name,
                                     struct cerb_holders *out)
{
    struct etcd_qkeys qk;
    cerb_status st = cerb__etcd_qkeys_init(&qk, e->ec->prefix, prim, name, CERB_RW_WRITE, 0, "",
                                           false);
    if (st != CERB_OK)
        return st;
    struct etcd_range_req rq = {.key = qk.q,
                                .key_len = qk.q_len,
                                .end = qk.q_end,
                                .end_len = qk.q_end_len,
                                .sort_order = ETCD_SORT_ASCEND,
                                .sort_target = ETCD_TARGET_CREATE};
    json_t *reads = cerb__etcd_list(cerb__etcd_op_range(&rq), NULL);
    if (reads && prim == CERB_PRIM_SEMAPHORE) {
        struct etcd_range_req lr = {.key = qk.lim, .key_len = qk.lim_len};
        if (json_array_append_new(reads, cerb__etcd_op_range(&lr))) {
            json_decref(reads);
            reads = NULL;
        }
    }
    struct etcd_call call;
    bool ok;
    int64_t rev;
    const json_t *resp;
    int64_t deadline = cerb__deadline_in(e->ec->op_timeout_ms);
    st = cerb__etcd_run_txn(e, "inspect", reads ? cerb__etcd_txn(NULL, reads, NULL) : NULL,
                            prim == CERB_PRIM_SEMAPHORE ? 2 : 1, deadline, &call, &ok, &rev,
                            &resp);
    if (st != CERB_OK) {
        cerb__etcd_qkeys_free(&qk);
        return st;
    }
    struct q_inspect in = {.e = e, .prim = prim, .qk = &qk, .limit = 1, .out = out,
                           .deadline = deadline, .st = CERB_OK};
    if (prim == CERB_PRIM_SEMAPHORE)
        st = cerb__etcd_qlimit_parse(cerb__etcd_txn_range(resp, 1), &in.limit);
    if (st == CERB_OK) {
        const json_t *rr = cerb__etcd_txn_range(resp, 0);
        st = rr ? cerb__etcd_range_each(rr, inspect_one, &in)
                : cerb__error_set(CERB_EPROTO, "etcd %s: inspect: not a range", ep(e));
    }
    if (st == CERB_OK)
        st = in.st;
    json_decref(call.resp);
    cerb__etcd_qkeys_free(&qk);
    return st;
}
