/*
 * mc_lock.c — the lock methods of the memcached engine: acquire (an
 * add-mode `ms`), renew (a CAS-checked `ms`), release (a CAS-checked `md`),
 * check_owner, held, inspect and the probe.
 *
 * Ownership on the server is the CAS of our item: it changes on every write,
 * so `C<cas>` matches only the item our own last grant or renewal wrote.
 * The CAS is learnt from the `c` flag of the reply. When that reply is lost
 * (a renewal that timed out may still have run), the next renew or release
 * meets EX; it then reads the item (`mg v c`) and, if the value is still our
 * token — which no other owner can write —, takes the CAS from there and
 * tries once more. A CAS is never sent as 0, which memcached reads as "no
 * check", and never to another server process than the one it came from:
 * the hold's generation must be the connection's (mc_internal.h).
 *
 * Waiting: memcached has no blocking primitive, so a waiter polls: after an
 * NS it reads the holder's remaining TTL (`mg t`) and naps a jittered,
 * growing interval (a few ms up to MC_POLL_MAX_MS) that never passes that
 * TTL, its own deadline, or MC_SLICE_MS between looks at its interrupt flag.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "mc_internal.h"

#define REQ_MAX 512

/* A pooled connection fit for a request: one to the current server
 * process (an older one talks to a process that is gone: closed, and
 * another taken) and, with need_gen, to that hold's process (a newer one:
 * CERB_NOT_OWNER, nothing sent). */
static cerb_status take_for(cerb_engine *e, const uint64_t *need_gen, int64_t deadline_ns,
                            struct mc_conn **out)
{
    for (int i = 0;; i++) {
        cerb_status st = cerb__mc_take(e, deadline_ns, out);
        if (st != CERB_OK)
            return st;
        struct mc_conn *c = *out;
        uint64_t cur = atomic_load(&e->gen);
        bool old = c->gen < cur || (need_gen && c->gen < *need_gen);
        if (!old)
            break;
        cerb__mc_give(e, c, true);
        *out = NULL;
        if (i > e->max + 1)
            return cerb__error_set(CERB_EIO, "memcached: no connection to the current server "
                                   "process");
    }
    if (need_gen && (*out)->gen > *need_gen) {
        cerb__mc_give(e, *out, false);
        *out = NULL;
        return cerb__error_set(CERB_NOT_OWNER,
                               "memcached: the server restarted (or lost its items) since the "
                               "grant: the lock is gone");
    }
    return CERB_OK;
}

/* The deadline of one call: the operation timeout (and the connect
 * timeout, for a fresh connection), or cap when that is sooner. */
static int64_t call_deadline(cerb_engine *e, int64_t timeout_ms, int64_t cap_ns)
{
    int64_t dl = cerb__deadline_in(timeout_ms > 0 ? timeout_ms
                                                  : e->mc->connect_timeout_ms +
                                                        e->mc->op_timeout_ms);
    return cap_ns > 0 && cap_ns < dl ? cap_ns : dl;
}

/* One request and its reply on a pooled connection (take_for), bounded by
 * call_deadline. *gen: the connection's generation (set before sending,
 * also when the call fails). */
static cerb_status call(cerb_engine *e, const char *req, size_t len, const uint64_t *need_gen,
                        int64_t timeout_ms, struct mc_reply *r, cerb_outcome *oc, uint64_t *gen)
{
    *oc = CERB_OUTCOME_NO;
    if (len == 0)
        return cerb__error_set(CERB_EINVAL, "memcached: request too long");
    int64_t dl = call_deadline(e, timeout_ms, 0);
    struct mc_conn *c = NULL;
    cerb_status st = take_for(e, need_gen, dl, &c);
    if (st != CERB_OK)
        return st;
    if (gen)
        *gen = c->gen;
    bool sent = false;
    st = cerb__mc_call(c, req, len, dl, r, &sent);
    cerb__mc_give(e, c, st != CERB_OK);
    if (st != CERB_OK) {
        /* A protocol error came with a whole reply: the request ran. */
        *oc = st == CERB_EPROTO ? CERB_OUTCOME_UNKNOWN : cerb__mc_outcome(sent);
        return st;
    }
    *oc = CERB_OUTCOME_YES;
    return CERB_OK;
}

static bool is(const struct mc_reply *r, const char *code) { return strcmp(r->code, code) == 0; }

/*
 * One add-mode `ms`, pipelined with a read of the marker on the same
 * connection: a grant counts only if the marker still has the nonce of the
 * connection's generation right after it. Had the server lost its items
 * (flush_all, a marker evicted) since this pooled connection was checked,
 * the grant could come during the quarantine another client began; it is
 * then deleted again (md C<cas>) and *again asks for a fresh look (the
 * pool is dropped, so the next connection meets the new marker). BUSY with
 * *q_left > 0 while the server is quarantined (nothing sent).
 */
static cerb_status try_grant(cerb_engine *e, const struct mc_key *k, const char *req, size_t len,
                             const char *mreq, size_t mlen, int64_t deadline_ns,
                             struct mc_reply *r, cerb_outcome *oc, uint64_t *gen,
                             int64_t *q_left, bool *again)
{
    *oc = CERB_OUTCOME_NO;
    if (atomic_load(&e->fatal))
        return cerb__error_set(CERB_EPROTO, "%s", e->fatal_why);
    char both[2 * REQ_MAX];
    if (len == 0 || mlen == 0 || len + mlen > sizeof both)
        return cerb__error_set(CERB_EINVAL, "memcached: request too long");
    memcpy(both, req, len);
    memcpy(both + len, mreq, mlen);
    (void)deadline_ns; /* a call cut at the caller's deadline would turn a
                        * TIMEOUT into an unknown outcome: the op timeout
                        * bounds it, and the caller looks before each try */
    int64_t dl = call_deadline(e, 0, 0);
    struct mc_conn *c = NULL;
    cerb_status st = take_for(e, NULL, dl, &c);
    if (st != CERB_OK)
        return st;
    *gen = c->gen;
    char nonce[33];
    *q_left = cerb__mc_quarantine_left(e, c->gen);
    if (*q_left > 0) {
        cerb__mc_give(e, c, false);
        return cerb__error_set(CERB_BUSY, "memcached: %s:%s is quarantined (it lost its items "
                               "or is new): no grant for %lld ms more", e->host, e->port,
                               (long long)*q_left);
    }
    if (!cerb__mc_gen_nonce(e, c->gen, nonce)) {
        cerb__mc_give(e, c, true);
        *again = true;
        return cerb__error_set(CERB_EIO, "memcached: a new generation began");
    }
    bool sent = false;
    struct mc_reply m;
    st = cerb__mc_call(c, both, len + mlen, dl, r, &sent);
    if (st == CERB_OK)
        st = cerb__mc_read_reply(c, dl, &m);
    if (st != CERB_OK) {
        cerb__mc_give(e, c, true);
        *oc = st == CERB_EPROTO ? CERB_OUTCOME_UNKNOWN : cerb__mc_outcome(sent);
        return st;
    }
    bool marker_ok = is(&m, "VA") && m.vlen >= 33 && memcmp(m.value, nonce, 32) == 0 &&
                     m.value[32] == ' ';
    if (is(r, "HD") && (!r->has_cas || r->cas == 0)) {
        /* Granted, but without the CAS we cannot renew or undo it: let
         * the core's check (mg v c) settle it. */
        cerb__mc_give(e, c, false);
        *oc = CERB_OUTCOME_UNKNOWN;
        return cerb__error_set(CERB_EPROTO, "memcached: a grant without its CAS");
    }
    if (is(r, "HD") && !marker_ok) {
        char md[REQ_MAX], flags[32];
        struct mc_reply d;
        snprintf(flags, sizeof flags, "C%" PRIu64, r->cas);
        size_t dlen = cerb__mc_fmt(md, sizeof md, "md", k, flags);
        st = cerb__mc_call(c, md, dlen, dl, &d, &sent);
        cerb__mc_give(e, c, true);
        cerb__mc_marker_suspect(e);
        CERB_LOG_W("memcached: %s:%s: the marker changed under a grant (the server lost its "
                   "items?): the grant is undone and the server looked at again",
                   e->host, e->port);
        if (st == CERB_OK && (is(&d, "HD") || is(&d, "NF"))) {
            *again = true;
            return cerb__error_set(CERB_EIO, "memcached: the marker changed under the grant");
        }
        *oc = CERB_OUTCOME_UNKNOWN;
        return st != CERB_OK ? st : cerb__mc_unexpected("md (undo)", &d);
    }
    cerb__mc_give(e, c, false);
    *oc = CERB_OUTCOME_YES;
    return CERB_OK;
}

static bool ours(const struct mc_reply *r, const char *token)
{
    return is(r, "VA") && r->vlen == 32 && memcmp(r->value, token, 32) == 0;
}

static void note_ttl(cerb_engine *e, int64_t ttl_s)
{
    int64_t ms = ttl_s * 1000, m = atomic_load(&e->max_ttl_ms);
    while (ms > m && !atomic_compare_exchange_weak(&e->max_ttl_ms, &m, ms))
        ;
}

/* Nap up to ms, in slices, until interrupted: false when interrupted. */
static bool nap(int64_t ms, const atomic_int *interrupted)
{
    while (ms > 0) {
        if (interrupted && atomic_load(interrupted))
            return false;
        int64_t s = ms < MC_SLICE_MS ? ms : MC_SLICE_MS;
        cerb__nap_ms(s);
        ms -= s;
    }
    return !(interrupted && atomic_load(interrupted));
}

cerb_status cerb__mc_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant)
{
    struct mc_lock_priv *p = lk->priv;
    struct mc_key k;
    int64_t ttl_s;
    cerb_status st = cerb__mc_key(e->mc->prefix, lk->name, &k);
    if (st == CERB_OK)
        st = cerb__mc_ttl_s(lk->lease_ms, &ttl_s);
    grant->outcome = CERB_OUTCOME_NO;
    if (st != CERB_OK)
        return st;
    char req[REQ_MAX], look[REQ_MAX];
    size_t len = cerb__mc_fmt_ms(req, sizeof req, &k, ttl_s, true, 0, lk->token);
    size_t llen = cerb__mc_fmt(look, sizeof look, "mg", &k, "t");
    char mreq[REQ_MAX];
    size_t mlen = cerb__mc_fmt(mreq, sizeof mreq, "mg", &e->mkey, "v");
    for (int attempt = 0;; attempt++) {
        if (interrupted && atomic_load(interrupted))
            return cerb__error_set(CERB_INTERRUPTED, "memcached: interrupted");
        struct mc_reply r;
        cerb_outcome oc;
        uint64_t gen = 0;
        int64_t sent_ns = cerb_monotime();
        note_ttl(e, ttl_s);
        atomic_fetch_add(&e->stats.acquire_calls, 1);
        if (deadline_ns != 0 && attempt > 0 && cerb__ms_left(deadline_ns) <= 0)
            return cerb__error_set(CERB_TIMEOUT, "memcached: \"%s\" stayed held", lk->name);
        int64_t q_left = 0;
        bool again = false;
        st = try_grant(e, &k, req, len, mreq, mlen, deadline_ns, &r, &oc, &gen, &q_left, &again);
        p->gen = gen; /* a background settle of an unknown outcome needs it */
        if (st == CERB_BUSY && q_left > 0) {
            /* Quarantined: no grant on this server for a while. */
            if (deadline_ns == 0)
                return st;
            int64_t left = cerb__ms_left(deadline_ns);
            if (left <= 0)
                return cerb__error_set(CERB_TIMEOUT, "memcached: \"%s\": the server is "
                                       "quarantined", lk->name);
            if (!nap(q_left < left ? q_left : left, interrupted))
                return cerb__error_set(CERB_INTERRUPTED, "memcached: interrupted");
            continue;
        }
        if (again)
            continue; /* the marker changed under the grant, undone: look again */
        if (st != CERB_OK) {
            grant->outcome = oc;
            return st;
        }
        if (is(&r, "HD")) {
            p->cas = r.cas;
            grant->fence = 0;
            grant->sent_ns = sent_ns;
            grant->ttl_ms = lk->lease_ms;
            return CERB_OK;
        }
        if (!is(&r, "NS"))
            return cerb__mc_unexpected("ms (add)", &r);
        if (deadline_ns == 0)
            return cerb__error_set(CERB_BUSY, "memcached: \"%s\" is held", lk->name);
        /* Held: how long may the holder keep it without renewing? */
        st = call(e, look, llen, NULL, 0, &r, &oc, NULL);
        if (st != CERB_OK)
            return st; /* a read: nothing of ours can have landed */
        int64_t cap = (int64_t)2 << (attempt < 6 ? attempt : 6);
        if (cap > MC_POLL_MAX_MS)
            cap = MC_POLL_MAX_MS;
        int64_t wait = cap / 2 + (int64_t)cerb__rand_below((uint64_t)(cap / 2 + 1));
        if (is(&r, "EN"))
            wait = 0; /* released meanwhile */
        else if (r.has_ttl && r.ttl_s >= 0 && r.ttl_s * 1000 < wait)
            wait = r.ttl_s * 1000;
        int64_t left = cerb__ms_left(deadline_ns);
        if (left <= 0)
            return cerb__error_set(CERB_TIMEOUT, "memcached: \"%s\" stayed held", lk->name);
        if (wait > left)
            wait = left;
        if (!nap(wait, interrupted))
            return cerb__error_set(CERB_INTERRUPTED, "memcached: interrupted");
    }
}

/* Read the item and, when it is still ours, take its CAS (after a reply
 * that carried it was lost). CERB_OK, CERB_NOT_OWNER, or an error. */
static cerb_status relearn(cerb_engine *e, cerb_engine_lock *lk, const struct mc_key *k)
{
    struct mc_lock_priv *p = lk->priv;
    char req[REQ_MAX];
    struct mc_reply r;
    cerb_outcome oc;
    cerb_status st = call(e, req, cerb__mc_fmt(req, sizeof req, "mg", k, "v c"), &p->gen, 0, &r,
                          &oc, NULL);
    if (st != CERB_OK)
        return st;
    if (!ours(&r, lk->token) || !r.has_cas || r.cas == 0)
        return cerb__error_set(CERB_NOT_OWNER, "memcached: \"%s\" is not held by this token",
                               lk->name);
    p->cas = r.cas;
    return CERB_OK;
}

cerb_status cerb__mc_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct mc_lock_priv *p = lk->priv;
    struct mc_key k;
    int64_t ttl_s;
    cerb_status st = cerb__mc_key(e->mc->prefix, lk->name, &k);
    if (st == CERB_OK)
        st = cerb__mc_ttl_s(lk->lease_ms, &ttl_s);
    grant->outcome = CERB_OUTCOME_NO;
    if (st != CERB_OK)
        return st;
    for (int round = 0; round < 2; round++) {
        if (p->cas == 0 && (st = relearn(e, lk, &k)) != CERB_OK)
            return st;
        char req[REQ_MAX];
        struct mc_reply r;
        cerb_outcome oc;
        size_t len = cerb__mc_fmt_ms(req, sizeof req, &k, ttl_s, false, p->cas, lk->token);
        int64_t sent_ns = cerb_monotime();
        note_ttl(e, ttl_s);
        st = call(e, req, len, &p->gen, 0, &r, &oc, NULL);
        if (st != CERB_OK) {
            grant->outcome = oc;
            return st;
        }
        if (is(&r, "HD")) {
            /* Without the new CAS the next renewal relearns it. */
            p->cas = r.has_cas ? r.cas : 0;
            grant->fence = 0;
            grant->sent_ns = sent_ns;
            grant->ttl_ms = lk->lease_ms;
            return CERB_OK;
        }
        if (is(&r, "NF"))
            break;
        if (!is(&r, "EX"))
            return cerb__mc_unexpected("ms (renew)", &r);
        p->cas = 0; /* someone wrote the item since: ours only if it holds our token */
    }
    return cerb__error_set(CERB_NOT_OWNER, "memcached: \"%s\" is not held by this token",
                           lk->name);
}

cerb_status cerb__mc_op_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct mc_lock_priv *p = lk->priv;
    struct mc_key k;
    cerb_status st = cerb__mc_key(e->mc->prefix, lk->name, &k);
    if (st != CERB_OK)
        return st;
    for (int round = 0; round < 2; round++) {
        if (p->cas == 0 && (st = relearn(e, lk, &k)) != CERB_OK)
            return st;
        char req[REQ_MAX], flags[32];
        struct mc_reply r;
        cerb_outcome oc;
        snprintf(flags, sizeof flags, "C%" PRIu64, p->cas);
        st = call(e, req, cerb__mc_fmt(req, sizeof req, "md", &k, flags), &p->gen, 0, &r, &oc,
                  NULL);
        if (st != CERB_OK)
            return st;
        if (is(&r, "HD")) {
            p->cas = 0;
            return CERB_OK;
        }
        if (is(&r, "NF"))
            break;
        if (!is(&r, "EX"))
            return cerb__mc_unexpected("md", &r);
        p->cas = 0;
    }
    return cerb__error_set(CERB_NOT_OWNER, "memcached: \"%s\" is not held by this token",
                           lk->name);
}

cerb_status cerb__mc_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct mc_lock_priv *p = lk->priv;
    struct mc_key k;
    cerb_status st = cerb__mc_key(e->mc->prefix, lk->name, &k);
    if (st != CERB_OK)
        return st;
    char req[REQ_MAX];
    struct mc_reply r;
    cerb_outcome oc;
    uint64_t gen = 0;
    st = call(e, req, cerb__mc_fmt(req, sizeof req, "mg", &k, "v c"), NULL, 0, &r, &oc, &gen);
    if (st != CERB_OK)
        return st;
    if (!ours(&r, lk->token) || !r.has_cas || r.cas == 0)
        return cerb__error_set(CERB_NOT_OWNER, "memcached: \"%s\" is not held by this token",
                               lk->name);
    if (cerb__mc_quarantine_left(e, gen) > 0) {
        /* Ours, but on a server in quarantine: the grant may have landed
         * after the loss, when a holder from before may still believe it
         * holds the name. Undo it (over-exclusion at worst if that fails). */
        char flags[32];
        snprintf(flags, sizeof flags, "C%" PRIu64, r.cas);
        (void)call(e, req, cerb__mc_fmt(req, sizeof req, "md", &k, flags), &gen, 0, &r, &oc,
                   NULL);
        return cerb__error_set(CERB_NOT_OWNER, "memcached: \"%s\": the server is quarantined: "
                               "a grant that landed there is undone", lk->name);
    }
    /* Ours on the process this connection talks to (a grant that landed
     * there, whatever came before). */
    p->cas = r.cas;
    p->gen = gen;
    grant->fence = 0;
    grant->ttl_ms = 0; /* the expiry is not extended here */
    return CERB_OK;
}

cerb_status cerb__mc_op_held(cerb_engine *e, const char *name)
{
    struct mc_key k;
    cerb_status st = cerb__mc_key(e->mc->prefix, name, &k);
    if (st != CERB_OK)
        return st;
    char req[REQ_MAX];
    struct mc_reply r;
    cerb_outcome oc;
    uint64_t gen = 0;
    st = call(e, req, cerb__mc_fmt(req, sizeof req, "mg", &k, "t"), NULL, 0, &r, &oc, &gen);
    if (st != CERB_OK)
        return st;
    if (cerb__mc_quarantine_left(e, gen) > 0)
        return cerb__error_set(CERB_BUSY, "memcached: \"%s\": the server is quarantined", name);
    if (is(&r, "EN"))
        return CERB_OK;
    if (is(&r, "HD"))
        return cerb__error_set(CERB_BUSY, "memcached: \"%s\" is held", name);
    return cerb__mc_unexpected("mg", &r);
}

cerb_status cerb__mc_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct mc_key k;
    cerb_status st = cerb__mc_key(e->mc->prefix, name, &k);
    if (st != CERB_OK)
        return st;
    char req[REQ_MAX], detail[MC_KEY_MAX + 32];
    struct mc_reply r;
    cerb_outcome oc;
    st = call(e, req, cerb__mc_fmt(req, sizeof req, "mg", &k, "v t"), NULL, 0, &r, &oc, NULL);
    if (st != CERB_OK)
        return st;
    if (is(&r, "EN"))
        return CERB_OK;
    if (!is(&r, "VA"))
        return cerb__mc_unexpected("mg", &r);
    snprintf(detail, sizeof detail, "key %s%s", k.k, k.b64 ? " (base64)" : "");
    return cerb__holders_add(out, r.value, strlen(r.value), 0, 0,
                             r.has_ttl && r.ttl_s >= 0 ? r.ttl_s * 1000 : -1, detail);
}

cerb_status cerb__mc_op_probe(cerb_engine *e, int64_t timeout_ms)
{
    /* A canary on the lock path: an add-mode set of a key of its own and
     * its CAS-checked delete, as a lock's grant and release. */
    char name[64], token[33];
    snprintf(name, sizeof name, "__cerberus_probe__%016" PRIx64, cerb__rand_below(UINT64_MAX));
    snprintf(token, sizeof token, "%016" PRIx64 "%016" PRIx64, cerb__rand_below(UINT64_MAX),
             cerb__rand_below(UINT64_MAX));
    struct mc_key k;
    cerb_status st = cerb__mc_key(e->mc->prefix, name, &k);
    if (st != CERB_OK)
        return st;
    int64_t deadline = cerb__deadline_in(timeout_ms);
    char req[REQ_MAX], flags[32];
    struct mc_reply r;
    cerb_outcome oc;
    st = call(e, req, cerb__mc_fmt_ms(req, sizeof req, &k, 2, true, 0, token), NULL, timeout_ms,
              &r, &oc, NULL);
    if (st != CERB_OK)
        return st;
    if (!is(&r, "HD") || !r.has_cas)
        return cerb__mc_unexpected("probe ms", &r);
    int64_t left = cerb__ms_left(deadline);
    if (left <= 0)
        return cerb__error_set(CERB_EIO, "memcached: the probe ran out of time");
    snprintf(flags, sizeof flags, "C%" PRIu64, r.cas);
    st = call(e, req, cerb__mc_fmt(req, sizeof req, "md", &k, flags), NULL, left, &r, &oc, NULL);
    if (st == CERB_OK && !is(&r, "HD"))
        return cerb__mc_unexpected("probe md", &r);
    return st;
}
