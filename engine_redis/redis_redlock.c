/*
 * redis_redlock.c — the lock operations of Redlock mode (redis_redlock.h):
 * quorum, validity, release everywhere after a failed attempt, top-up at
 * renewal, the quorum fence, and what the mode does not have.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_redlock.h"
#include "redis_scripts.h"
#include "token.h"

/* The keys of a name: K and its counter F. */
struct rl_keys {
    char k[600], f[620];
    size_t kl, fl;
};

static cerb_status rl_keys(const cerb_engine *e, const char *name, struct rl_keys *ks)
{
    const char *prefix = e->rc->prefix ? e->rc->prefix : "";
    int n = snprintf(ks->k, sizeof ks->k, "%s%s", prefix, name);
    int m = snprintf(ks->f, sizeof ks->f, "{%s%s}" REDIS_SEP "rlfence", prefix, name);
    if (n < 0 || (size_t)n >= sizeof ks->k || m < 0 || (size_t)m >= sizeof ks->f)
        return cerb__error_set(CERB_EINVAL, "redis redlock: lock name too long");
    ks->kl = (size_t)n, ks->fl = (size_t)m;
    return CERB_OK;
}

static int64_t valid_end(int64_t sent_ns, int64_t lease_ms)
{
    return sent_ns +
           (lease_ms - lease_ms * RL_DRIFT_PERMILLE / 1000 - RL_DRIFT_FIXED_MS) * CERB_NS_PER_MS;
}

static bool is_arr(const redisReply *r, size_t min)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= min;
}

static long long int_at(const redisReply *r, size_t i)
{
    return r->element[i]->type == REDIS_REPLY_INTEGER ? r->element[i]->integer : -1;
}

static void all_mask(const cerb_engine *e, unsigned *m) { *m = (1u << e->rl->n) - 1; }

/* The value this hold has on the nodes (its last attempt's). */
static const char *rl_value(const cerb_engine_lock *lk)
{
    const struct redis_lock_priv *pv = lk->priv;
    return pv->rl_value[0] ? pv->rl_value : lk->token;
}

/*
 * The value of a new attempt. The core retries a hold with the same token
 * (after a NO, or an UNKNOWN settled as not ours), and the compare-and-DEL
 * that released a failed attempt may still be in flight (a retransmission
 * of a dropped connection's last segment): were the next attempt to write
 * the same value, that DEL could take a node from under its grant. So
 * attempt 0 writes the token (what other libraries and inspection expect)
 * and every later one the token's first half and 16 fresh random hex.
 */
static cerb_status next_value(cerb_engine_lock *lk)
{
    struct redis_lock_priv *pv = lk->priv;
    if (pv->rl_attempts++ == 0) {
        memcpy(pv->rl_value, lk->token, sizeof pv->rl_value);
    } else {
        char fresh[CERB_TOKEN_LEN + 1];
        cerb_status st = cerb__token_new(fresh);
        if (st != CERB_OK)
            return st;
        memcpy(pv->rl_value, lk->token, 16);
        memcpy(pv->rl_value + 16, fresh + 16, 16);
        pv->rl_value[32] = '\0';
    }
    pv->rl_abandoned = false;
    return CERB_OK;
}

/* Compare-and-DEL of lk on the nodes of mask; the nodes where it may still
 * be (no answer) are returned. */
static unsigned release_on(cerb_engine *e, const struct rl_keys *ks, const char *token,
                           unsigned mask, int64_t bound_ms, int *deleted)
{
    const char *argv[2] = {ks->k, token};
    size_t argl[2] = {ks->kl, strlen(token)};
    struct rl_req rq = {.script = RL_RELEASE, .nkeys = 1, .argc = 2, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    unsigned left = 0;

    *deleted = 0;
    if (!mask)
        return 0;
    cerb__redis_rl_fanout(e, mask, &rq, bound_ms, rep);
    for (int i = 0; i < e->rl->n; i++) {
        if (!rep[i].asked)
            continue;
        if (rep[i].st != CERB_OK || rep[i].r->type != REDIS_REPLY_INTEGER)
            left |= 1u << i;
        else
            *deleted += rep[i].r->integer == 1;
    }
    cerb__redis_rl_free(rep, e->rl->n);
    return left;
}

/* Write T's counter back to the nodes of mask; how many seeded nodes took
 * it while lk was still theirs. */
static int write_back(cerb_engine *e, const struct rl_keys *ks, const char *token, long long c,
                      unsigned mask, int64_t bound_ms)
{
    struct redis_redlock *rl = e->rl;
    char cv[24], ttl[24];
    snprintf(cv, sizeof cv, "%lld", c);
    snprintf(ttl, sizeof ttl, "%d", RL_FENCE_TTL_MS);
    cerb_engine *n0 = rl->nodes[0].cn.e;
    const char *argv[7] = {ks->k, ks->f, rl->state_key, n0->marker_key, token, cv, ttl};
    size_t argl[7] = {ks->kl, ks->fl, strlen(rl->state_key), n0->marker_key_len, strlen(token),
                      strlen(cv), strlen(ttl)};
    struct rl_req rq = {.script = RL_WRITEBACK, .nkeys = 4, .argc = 7, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    int w = 0;

    cerb__redis_rl_fanout(e, mask, &rq, bound_ms, rep);
    for (int i = 0; i < rl->n; i++)
        w += rep[i].asked && rep[i].st == CERB_OK && rep[i].r->type == REDIS_REPLY_INTEGER &&
             rep[i].r->integer == 1;
    cerb__redis_rl_free(rep, rl->n);
    return w;
}

/* Test hook (tests/integration/test_redlock_fence.c shows the write-back is
 * what keeps fences increasing): CERB_TEST_REDLOCK_NO_WRITEBACK=1 skips it. */
static bool no_writeback(void)
{
    const char *s = getenv("CERB_TEST_REDLOCK_NO_WRITEBACK");
    return s && s[0] == '1';
}

enum attempt_result { AT_GRANTED, AT_BUSY, AT_UNREACHABLE, AT_ERROR };

struct attempt {
    int64_t min_pttl;   /* the shortest lease left of another holder, -1 none */
    bool reseeded;      /* failed only for counters just re-seeded: again now */
    cerb_outcome oc;    /* after a failure: may a majority still hold it? */
    char why[1024];
};

/* One attempt: ask every node, count, fence, or release everywhere. */
static enum attempt_result attempt(cerb_engine *e, cerb_engine_lock *lk, const struct rl_keys *ks,
                                   cerb_grant *g, struct attempt *a)
{
    struct redis_redlock *rl = e->rl;
    int64_t nb = cerb__redis_rl_bound_ms(e, lk->lease_ms);
    char lease[24], ttl[24];
    snprintf(lease, sizeof lease, "%lld", (long long)lk->lease_ms);
    snprintf(ttl, sizeof ttl, "%d", RL_FENCE_TTL_MS);
    if (next_value(lk) != CERB_OK) {
        snprintf(a->why, sizeof a->why, "%s", cerb_last_error());
        a->min_pttl = -1, a->reseeded = false, a->oc = CERB_OUTCOME_NO;
        return AT_ERROR;
    }
    const char *val = rl_value(lk);
    cerb_engine *n0 = rl->nodes[0].cn.e;
    const char *argv[8] = {ks->k, ks->f, rl->state_key, n0->marker_key, val, lease,
                           rl->fence ? "1" : "0", ttl};
    size_t argl[8];
    for (int i = 0; i < 8; i++)
        argl[i] = i == 0 ? ks->kl : i == 1 ? ks->fl : i == 3 ? n0->marker_key_len : strlen(argv[i]);
    struct rl_req rq = {.script = RL_ACQUIRE, .nkeys = 4, .argc = 8, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    unsigned granted = 0, unknown = 0;
    int votes = 0, answered = 0, seeded_votes = 0, best = -1;
    bool unseeded_vote = false;
    long long cmax = -1;

    a->min_pttl = -1;
    a->reseeded = false;
    a->oc = CERB_OUTCOME_NO;
    a->why[0] = '\0';
    int64_t sent = cerb_monotime();
    cerb__redis_rl_fanout(e, (1u << rl->n) - 1, &rq, nb, rep);
    for (int i = 0; i < rl->n; i++) {
        redisReply *r = rep[i].r;
        if (rep[i].st != CERB_OK || !is_arr(r, 1)) {
            /* An error reply may come after the script's SET: released. */
            if (rep[i].st == CERB_OK) {
                snprintf(rep[i].why, sizeof rep[i].why, "redis %.200s: %.150s", rl->nodes[i].cn.e->where,
                         r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
                unknown |= 1u << i;
            } else if (rep[i].oc != CERB_OUTCOME_NO) {
                unknown |= 1u << i;
            }
            rep[i].st = rep[i].st == CERB_OK ? CERB_EIO : rep[i].st;
            continue;
        }
        answered++;
        if (int_at(r, 0) == 1 && r->elements >= 3) {
            granted |= 1u << i;
            if (rep[i].out)
                continue;
            votes++;
            if (int_at(r, 2) != 1)
                unseeded_vote = true;
            if (int_at(r, 2) == 1) {
                seeded_votes++;
                if (int_at(r, 1) > cmax)
                    cmax = int_at(r, 1), best = i;
            }
        } else if (r->elements >= 2) {
            long long p = int_at(r, 1);
            if (p >= 0 && (a->min_pttl < 0 || p < a->min_pttl))
                a->min_pttl = p;
        }
    }
    cerb__redis_rl_failed(e, rep, a->why, sizeof a->why);
    cerb__redis_rl_free(rep, rl->n);

    bool ok = votes >= rl->quorum && cerb_monotime() < valid_end(sent, lk->lease_ms);
    uint64_t fence = 0;
    if (ok && rl->fence && seeded_votes < rl->quorum) {
        /* Counters of nodes that lost them do not count: seed them for the
         * next attempt (at once, not after a pause). */
        ok = false;
        if (cerb__redis_rl_reseed(e, nb) != CERB_OK)
            snprintf(a->why, sizeof a->why, "%s", cerb_last_error());
        else
            a->reseeded = true;
    } else if (rl->fence && unseeded_vote) {
        /* A node lost its state (a restart, a rolling one across the set):
         * re-seed it now from the majority that kept theirs, before the
         * others restart too. This grant does not count its counter. */
        (void)cerb__redis_rl_reseed(e, nb);
    }
    if (ok && rl->fence) {
        {
            uint64_t floor = lk->fence_floor & ((UINT64_C(1) << 48) - 1);
            if ((uint64_t)cmax * 16 + (uint64_t)rl->nodes[best].id <= floor)
                cmax = (long long)(floor >> 4) + 1;
            int w = no_writeback() ? rl->quorum : write_back(e, ks, val, cmax, granted, nb);
            ok = w >= rl->quorum && cerb_monotime() < valid_end(sent, lk->lease_ms);
            fence = (uint64_t)cmax * 16 + (uint64_t)rl->nodes[best].id;
            if (!ok)
                snprintf(a->why, sizeof a->why, "the fence reached %d of %d nodes in time, %d "
                         "needed", w, rl->n, rl->quorum);
        }
    }
    if (ok) {
        struct redis_lock_priv *pv = lk->priv;
        pv->rl_fence = fence;
        g->fence = fence;
        g->sent_ns = sent;
        g->ttl_ms = lk->lease_ms;
        g->outcome = CERB_OUTCOME_YES;
        return AT_GRANTED;
    }
    /* Release everywhere it may be (redsync does; node-redlock does not,
     * and blocks its own retries on those nodes until they expire). */
    int deleted;
    struct redis_lock_priv *pv = lk->priv;
    pv->rl_abandoned = true; /* whatever its release reaches */
    unsigned left = release_on(e, ks, val, granted | unknown, nb, &deleted);
    int maybe = __builtin_popcount(left);
    a->oc = maybe >= rl->quorum ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
    if (answered < rl->quorum)
        return AT_UNREACHABLE;
    return AT_BUSY;
}

static void note_lease(cerb_engine *e, int64_t lease_ms)
{
    for (int i = 0; i < e->rl->n; i++) /* the nodes' quarantines cover it */
        cerb__redis_marker_note_lease(e->rl->nodes[i].cn.e, lease_ms);
    int64_t cur = atomic_load(&e->rl->max_lease_ms);
    while (lease_ms > cur && !atomic_compare_exchange_weak(&e->rl->max_lease_ms, &cur, lease_ms))
        ;
}

cerb_status cerb__redis_rl_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                   const atomic_int *interrupted, cerb_grant *g)
{
    struct rl_keys ks;
    struct attempt a;
    cerb_status st;

    g->outcome = CERB_OUTCOME_NO;
    if (lk->prim != CERB_PRIM_MUTEX)
        return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), g);
    if ((st = rl_keys(e, lk->name, &ks)) != CERB_OK)
        return st;
    note_lease(e, lk->lease_ms);
    bool again = false;
    for (unsigned k = 0;; k++) {
        enum attempt_result ar = attempt(e, lk, &ks, g, &a);
        if (ar == AT_GRANTED)
            return CERB_OK;
        g->outcome = a.oc;
        if (ar == AT_ERROR)
            return cerb__error_set(CERB_EIO, "redis redlock: %s", a.why);
        if (ar == AT_BUSY && a.reseeded && a.oc == CERB_OUTCOME_NO && !again) {
            again = true; /* once: the quorum was there, its counters were not */
            continue;
        }
        /* Unreachable: asked again until the deadline (a node that failed
         * is skipped for a second), then the nodes are named. */
        if (ar == AT_UNREACHABLE &&
            (deadline_ns == 0 || cerb_monotime() + RL_RETRY_CAP_MS * CERB_NS_PER_MS >= deadline_ns))
            return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: fewer than %d of %d nodes "
                                   "answered: %s", e->rl->quorum, e->rl->n, a.why);
        if (a.oc == CERB_OUTCOME_UNKNOWN)
            return cerb__error_set(CERB_EIO, "redis redlock: a failed attempt could not be "
                                   "released on a majority: %s", a.why);
        if (deadline_ns == 0 && ar == AT_BUSY)
            return cerb__error_set(CERB_BUSY, "redis redlock: \"%s\" is held (no quorum)",
                                   lk->name);
        /* Full jitter, bounded by the holder's lease left: nobody wakes us
         * (polling, as every Redlock client does). */
        int64_t cap = RL_RETRY_BASE_MS << (k < 5 ? k : 5);
        if (cap > RL_RETRY_CAP_MS)
            cap = RL_RETRY_CAP_MS;
        int64_t nap = (int64_t)cerb__rand_below((uint64_t)cap) + 1;
        if (a.min_pttl >= 0 && nap > a.min_pttl + 1)
            nap = a.min_pttl + 1;
        int64_t until = cerb_monotime() + nap * CERB_NS_PER_MS;
        if (until > deadline_ns)
            until = deadline_ns;
        for (;;) {
            if (interrupted && atomic_load(interrupted))
                return cerb__error_set(CERB_INTERRUPTED, "redis redlock: interrupted");
            int64_t left = cerb__ms_left(until);
            if (left <= 0)
                break;
            cerb__nap_ms(left < REDIS_INTR_SLICE_MS ? left : REDIS_INTR_SLICE_MS);
        }
        if (cerb_monotime() >= deadline_ns)
            return cerb__error_set(CERB_TIMEOUT, "redis redlock: \"%s\" stayed held", lk->name);
    }
}

cerb_status cerb__redis_rl_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    struct redis_redlock *rl = e->rl;
    struct rl_keys ks;
    cerb_status st;

    g->outcome = CERB_OUTCOME_NO;
    if (lk->prim != CERB_PRIM_MUTEX)
        return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), g);
    if ((st = rl_keys(e, lk->name, &ks)) != CERB_OK)
        return st;
    int64_t nb = cerb__redis_rl_bound_ms(e, lk->lease_ms);
    char lease[24];
    snprintf(lease, sizeof lease, "%lld", (long long)lk->lease_ms);
    const char *val = rl_value(lk);
    cerb_engine *n0 = rl->nodes[0].cn.e;
    const char *argv[5] = {ks.k, n0->marker_key, val, lease, "1"};
    size_t argl[5] = {ks.kl, n0->marker_key_len, strlen(val), strlen(lease), 1};
    struct rl_req rq = {.script = RL_RENEW, .nkeys = 2, .argc = 5, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    int ext = 0, no = 0;
    unsigned topped = 0;
    char why[1024];

    int64_t sent = cerb_monotime();
    cerb__redis_rl_fanout(e, (1u << rl->n) - 1, &rq, nb, rep);
    for (int i = 0; i < rl->n; i++) {
        redisReply *r = rep[i].r;
        if (rep[i].st != CERB_OK || r->type != REDIS_REPLY_INTEGER)
            continue;
        /* A compare-and-extend counts, and so does a top-up (the key was
         * gone there and SET NX made it ours: as safe as a grant) on a node
         * out of quarantine (3: nothing done) that may not evict it. */
        if ((r->integer == 1 || r->integer == 2) && !rep[i].out)
            ext++;
        else if (r->integer == 0 || r->integer == 3)
            no++;
        if (r->integer == 2)
            topped |= 1u << i;
    }
    cerb__redis_rl_failed(e, rep, why, sizeof why);
    cerb__redis_rl_free(rep, rl->n);
    if (ext >= rl->quorum && cerb_monotime() < valid_end(sent, lk->lease_ms)) {
        struct redis_lock_priv *pv = lk->priv;
        g->fence = pv->rl_fence;
        g->sent_ns = sent;
        g->ttl_ms = lk->lease_ms;
        g->outcome = CERB_OUTCOME_YES;
        return CERB_OK;
    }
    if (rl->n - no < rl->quorum) {
        int deleted;
        release_on(e, &ks, val, topped, nb, &deleted);
        return cerb__error_set(CERB_NOT_OWNER, "redis redlock: \"%s\" is ours on %d of %d "
                               "nodes, %d needed", lk->name, ext, rl->n, rl->quorum);
    }
    g->outcome = CERB_OUTCOME_UNKNOWN;
    return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: renewal of \"%s\" reached %d of %d "
                           "nodes, %d needed: %s", lk->name, ext, rl->n, rl->quorum, why);
}

void cerb__redis_rl_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++)
        items[i].st = cerb__redis_rl_renew(e, items[i].lk, &items[i].grant);
}

cerb_status cerb__redis_rl_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct rl_keys ks;
    cerb_status st;
    unsigned m;

    if (lk->prim != CERB_PRIM_MUTEX)
        return cerb__error_set(CERB_UNAVAILABLE, "redis: no %s in redlock mode",
                               cerb__prim_name(lk->prim));
    if ((st = rl_keys(e, lk->name, &ks)) != CERB_OK)
        return st;
    all_mask(e, &m);
    int deleted;
    unsigned left = release_on(e, &ks, rl_value(lk), m, cerb__redis_rl_bound_ms(e, lk->lease_ms),
                               &deleted);
    if (deleted > 0)
        return CERB_OK;
    if (left)
        return cerb__error_set(CERB_EIO, "redis redlock: release of \"%s\" reached %d of %d "
                               "nodes", lk->name, e->rl->n - __builtin_popcount(left), e->rl->n);
    return cerb__error_set(CERB_NOT_OWNER, "redis redlock: \"%s\" was not ours on any node",
                           lk->name);
}

cerb_status cerb__redis_rl_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    struct redis_redlock *rl = e->rl;
    struct rl_keys ks;
    cerb_status st;

    g->outcome = CERB_OUTCOME_NO;
    if (lk->prim != CERB_PRIM_MUTEX)
        return cerb__redis_rl_no_prim(e, cerb__prim_name(lk->prim), g);
    if ((st = rl_keys(e, lk->name, &ks)) != CERB_OK)
        return st;
    int64_t nb = cerb__redis_rl_bound_ms(e, lk->lease_ms);
    struct redis_lock_priv *pv = lk->priv;
    const char *val = rl_value(lk);
    if (pv->rl_abandoned) {
        /* The attempt failed and its release is on its way: our keys may
         * still be there, but the DELs in flight will take them. Send the
         * release again (it also settles the nodes that missed it). */
        int deleted;
        unsigned every;
        all_mask(e, &every);
        release_on(e, &ks, val, every, cerb__redis_rl_bound_ms(e, lk->lease_ms), &deleted);
        return cerb__error_set(CERB_NOT_OWNER, "redis redlock: \"%s\": the attempt failed and "
                               "was released", lk->name);
    }
    const char *argv[2] = {ks.k, val};
    size_t argl[2] = {ks.kl, strlen(val)};
    struct rl_req rq = {.script = RL_CHECK, .nkeys = 1, .argc = 2, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    int ours = 0, no = 0;
    long long pttl[RL_MAX_NODES];
    unsigned m;
    char why[1024];

    int64_t sent = cerb_monotime();
    cerb__redis_rl_fanout(e, (1u << rl->n) - 1, &rq, nb, rep);
    for (int i = 0; i < rl->n; i++) {
        if (rep[i].st != CERB_OK || !is_arr(rep[i].r, 1))
            continue;
        if (int_at(rep[i].r, 0) == 1 && !rep[i].out && rep[i].r->elements >= 2) {
            /* insertion, longest first */
            long long p = int_at(rep[i].r, 1);
            int j = ours++;
            while (j > 0 && pttl[j - 1] < p)
                pttl[j] = pttl[j - 1], j--;
            pttl[j] = p < 0 ? 0 : p;
        } else if (int_at(rep[i].r, 0) != 1) {
            no++;
        }
    }
    cerb__redis_rl_failed(e, rep, why, sizeof why);
    cerb__redis_rl_free(rep, rl->n);
    if (ours >= rl->quorum && rl->fence && pv->rl_fence == 0) {
        /* A majority has our key but no fence was written back for it (an
         * acquire whose outcome was unknown): not a grant we can report.
         * Release it; until that lands, nobody believes they hold it. */
        int deleted;
        all_mask(e, &m);
        release_on(e, &ks, val, m, nb, &deleted);
        return cerb__error_set(CERB_NOT_OWNER, "redis redlock: \"%s\" was ours without a fence; "
                               "released", lk->name);
    }
    if (ours >= rl->quorum) {
        /* Held by a majority until the quorum-th longest lease left runs
         * out, counted from before we asked. */
        g->fence = pv->rl_fence;
        g->sent_ns = sent;
        g->ttl_ms = pttl[rl->quorum - 1];
        return CERB_OK;
    }
    if (rl->n - no < rl->quorum)
        return cerb__error_set(CERB_NOT_OWNER, "redis redlock: \"%s\" is ours on %d of %d nodes",
                               lk->name, ours, rl->n);
    return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: %d of %d nodes hold \"%s\" for us, "
                           "the others did not answer: %s", ours, rl->n, lk->name, why);
}

cerb_status cerb__redis_rl_held(cerb_engine *e, const char *name)
{
    struct redis_redlock *rl = e->rl;
    struct rl_keys ks;
    cerb_status st;

    if ((st = rl_keys(e, name, &ks)) != CERB_OK)
        return st;
    const char *argv[2] = {"EXISTS", ks.k};
    size_t argl[2] = {6, ks.kl};
    struct rl_req rq = {.script = -1, .argc = 2, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    int answered = 0, held = 0;
    char why[1024];

    cerb__redis_rl_fanout(e, (1u << rl->n) - 1, &rq,
                          cerb__redis_rl_bound_ms(e, e->cfg->lock.lease_ms), rep);
    for (int i = 0; i < rl->n; i++)
        if (rep[i].st == CERB_OK && rep[i].r->type == REDIS_REPLY_INTEGER) {
            answered++;
            held += rep[i].r->integer > 0;
        }
    cerb__redis_rl_failed(e, rep, why, sizeof why);
    cerb__redis_rl_free(rep, rl->n);
    /* Held on any node: a holder (ours or another library's) may be
     * completing its quorum there. */
    if (held)
        return CERB_BUSY;
    if (answered < rl->quorum)
        return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: %d of %d nodes answered: %s",
                               answered, rl->n, why);
    return CERB_OK;
}

cerb_status cerb__redis_rl_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct redis_redlock *rl = e->rl;
    struct rl_keys ks;
    cerb_status st;

    if ((st = rl_keys(e, name, &ks)) != CERB_OK)
        return st;
    const char *argv[1] = {ks.k};
    size_t argl[1] = {ks.kl};
    struct rl_req rq = {.script = RL_INSPECT, .nkeys = 1, .argc = 1, .argv = argv, .argl = argl};
    struct rl_reply rep[RL_MAX_NODES];
    int answered = 0;
    bool done[RL_MAX_NODES] = {0};
    char why[1024];

    cerb__redis_rl_fanout(e, (1u << rl->n) - 1, &rq,
                          cerb__redis_rl_bound_ms(e, e->cfg->lock.lease_ms), rep);
    for (int i = 0; i < rl->n; i++)
        if (rep[i].st == CERB_OK && rep[i].r->type == REDIS_REPLY_ARRAY)
            answered++;
        else
            done[i] = true;
    cerb__redis_rl_failed(e, rep, why, sizeof why);
    /* One entry per token: on how many nodes, the shortest lease left. */
    for (int i = 0; i < rl->n && answered >= rl->quorum; i++) {
        redisReply *r = rep[i].r;
        if (done[i] || r->elements < 2 || r->element[0]->type != REDIS_REPLY_STRING)
            continue;
        int count = 0;
        long long ttl = -1;
        char detail[160];
        size_t off = 0;
        for (int j = i; j < rl->n; j++) {
            redisReply *q = rep[j].r;
            if (done[j] || q->elements < 2 || q->element[0]->type != REDIS_REPLY_STRING ||
                q->element[0]->len != r->element[0]->len ||
                memcmp(q->element[0]->str, r->element[0]->str, r->element[0]->len) != 0)
                continue;
            done[j] = true;
            count++;
            long long p = int_at(q, 1);
            if (p >= 0 && (ttl < 0 || p < ttl))
                ttl = p;
            if (off < sizeof detail) {
                int k = snprintf(detail + off, sizeof detail - off, "%s%s:%d",
                                 off ? " " : "on ", rl->nodes[j].cn.host, rl->nodes[j].cn.port);
                off += k > 0 ? (size_t)k : 0;
            }
        }
        if (off < sizeof detail)
            snprintf(detail + off, sizeof detail - off, " (%d of %d%s)", count, rl->n,
                     count >= rl->quorum ? "" : ", no quorum");
        st = cerb__holders_add(out, r->element[0]->str, r->element[0]->len, 0, 0, ttl, detail);
        if (st != CERB_OK)
            break;
    }
    cerb__redis_rl_free(rep, rl->n);
    if (st == CERB_OK && answered < rl->quorum)
        return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: %d of %d nodes answered: %s",
                               answered, rl->n, why);
    return st;
}

cerb_status cerb__redis_rl_probe(cerb_engine *e, int64_t timeout_ms)
{
    struct redis_redlock *rl = e->rl;
    const char *ping = "PING";
    size_t pingl = 4;
    struct rl_req rq = {.script = -1, .argc = 1, .argv = &ping, .argl = &pingl};
    struct rl_reply rep[RL_MAX_NODES];
    int ok = 0;
    char why[1024];

    cerb__redis_rl_fanout(e, (1u << rl->n) - 1, &rq, timeout_ms, rep);
    for (int i = 0; i < rl->n; i++)
        ok += rep[i].st == CERB_OK && rep[i].r->type != REDIS_REPLY_ERROR && !rep[i].out;
    cerb__redis_rl_failed(e, rep, why, sizeof why);
    cerb__redis_rl_free(rep, rl->n);
    if (ok >= rl->quorum)
        return CERB_OK;
    return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: %d of %d nodes can vote, %d needed: "
                           "%s", ok, rl->n, rl->quorum, why);
}

cerb_status cerb__redis_rl_no_prim(cerb_engine *e, const char *what, cerb_grant *grant)
{
    (void)e;
    if (grant) {
        grant->no_prim = 1;
        grant->outcome = CERB_OUTCOME_NO;
    }
    return cerb__error_set(CERB_UNAVAILABLE, "redis: no %s in redlock mode (only the lock: "
                           "a queue over independent masters would need a quorum of its own)",
                           what);
}

/* Closure records are not kept in redlock mode yet: a record would need the
 * acquire script's check on every node and a majority read (docs). */
cerb_status cerb__redis_rl_closure_get(cerb_engine *e, cerb_closure *out)
{
    (void)e;
    out->epoch = 0;
    out->closed = 0;
    return cerb__error_set(CERB_UNAVAILABLE, "redis: no closure records in redlock mode");
}

cerb_status cerb__redis_rl_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now)
{
    (void)e;
    (void)rec;
    if (now)
        now->epoch = 0, now->closed = 0;
    return cerb__error_set(CERB_UNAVAILABLE, "redis: no closure records in redlock mode");
}
