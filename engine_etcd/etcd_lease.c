/*
 * etcd_lease.c — the session: one lease per engine instance, kept alive by
 * a background thread, replaced when lost; and the orphan keys that thread
 * deletes on behalf of operations that could not.
 *
 * The lease ID is chosen by the client (63 random bits from libcrypto's
 * RAND_bytes), so a grant whose answer was lost can be sent again: the
 * server answers 412 "lease already exists" when the first one landed, and
 * that is our lease. Every lock key of the instance is put with it.
 *
 * The thread's state machine, under sess_mu:
 *   no live session  -> grant a new lease (new ID); on success publish it
 *                       (gen + 1, waiters in session_get wake up); on
 *                       failure wait a little and try again.
 *   live             -> every TTL/3 after the last good keepalive send, POST
 *                       /v3/lease/keepalive (one POST per keepalive: the
 *                       gateway cannot carry a stream of requests over
 *                       HTTP/1.1):
 *       TTL > 0          good: VALID if we were in doubt;
 *       TTL absent (0)   the lease is gone (revoked, expired): LOST;
 *       failure          SUSPECT (once), retried every ~150 ms; LOST when
 *                        the TTL (less 2 %) has passed since the last good
 *                        send — also when a keepalive sent after that point
 *                        still gets through — and the old lease is revoked
 *                        when the server is back (a leader change resets
 *                        lease TTLs, so a lease we gave up on may still be
 *                        alive and hold keys).
 *   LOST means: the session is marked not live *before* the event is sent
 *   and before a new lease exists, so the event (token NULL: every hold of
 *   this instance) can only hit holds of the old lease. A hold granted on
 *   the old lease after that is caught by renew(), which compares session
 *   generations.
 * Events go to env->event outside every engine lock.
 *
 * The same mutex guards the orphans (keys to delete in the background) and
 * the claims on keys (who uses which key; see etcd_internal.h): an orphan
 * whose key is claimed is left to the claimer, and a claim waits while the
 * thread is deleting the key.
 */
#include "internal_posix.h"

#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

/* Pause between keepalive attempts once one failed, and between grants. */
#define KA_RETRY_MS 150

static uint64_t key_hash(const char *k, size_t n);
static struct etcd_reg *reg_find(cerb_engine *e, const char *key, size_t len, uint64_t h,
                                 const struct etcd_reg *self);

static int64_t random_lease_id(void)
{
    uint64_t v = 0;
    if (RAND_bytes((unsigned char *)&v, sizeof v) != 1)
        v = cerb__rand_below(UINT64_MAX) ^ ((uint64_t)cerb_monotime() << 17);
    v &= INT64_MAX; /* positive: Go formats the key with %x of an int64 */
    return v ? (int64_t)v : 1;
}

static int64_t period_ns(const cerb_engine *e)
{
    return e->ttl_s * 1000 * CERB_NS_PER_MS / 3;
}

/*
 * The session is lost this long after the send of its last good keepalive:
 * a little less than the TTL (2 % + 5 ms), so the engine says so before the
 * core's own conservative deadline for the holds (TTL less 1 % + 2 ms) and a
 * keepalive that gets through after that does not revive a session whose
 * holds the core may already have reported LOST.
 */
static int64_t lose_after_ns(const cerb_engine *e)
{
    int64_t ttl = e->ttl_s * 1000 * CERB_NS_PER_MS;
    return ttl - ttl / 50 - 5 * CERB_NS_PER_MS;
}

/* Remember a TTL the server gave one of our leases: a server with a long
 * election timeout raises a short TTL to its minimum (3/2 of the election
 * timeout), so the lease — and every key on it — can outlive our last
 * keepalive by more than we asked for. */
static void note_ttl(cerb_engine *e, int64_t ttl_s)
{
    int64_t cur = atomic_load(&e->granted_ttl_s);
    while (cur < ttl_s && !atomic_compare_exchange_weak(&e->granted_ttl_s, &cur, ttl_s))
        ;
}

int64_t cerb__etcd_hold_bound(cerb_engine *e)
{
    return atomic_load(&e->granted_ttl_s) * 1000;
}

/* ---- requests ---- */

static cerb_status lease_req(cerb_engine *e, const char *what, const char *path, json_t *req,
                             int64_t deadline_ns, const atomic_int *abort,
                             struct etcd_call *call)
{
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    memset(call, 0, sizeof *call);
    call->what = what;
    call->path = path;
    call->body = req;
    call->deadline_ns = deadline_ns;
    call->idempotent = true;
    call->abort = abort;
    cerb_status st = cerb__etcd_call(e, call);
    json_decref(req);
    return st;
}

/*
 * Grant lease `id`. *sent_ns: before the first send (the lease cannot have
 * started earlier). An "already exists" answer after an attempt whose
 * outcome is unknown is our own grant having landed.
 */
static cerb_status grant(cerb_engine *e, int64_t id, int64_t deadline_ns, const atomic_int *abort,
                         int64_t *sent_ns)
{
    struct etcd_call call;
    json_t *req = json_pack("{s:o, s:o}", "TTL", cerb__etcd_json_i64(e->ttl_s), "ID",
                            cerb__etcd_json_i64(id));
    *sent_ns = cerb_monotime();
    cerb_status st = lease_req(e, "lease grant", "/v3/lease/grant", req, deadline_ns, abort, &call);
    if (st != CERB_OK) {
        if (call.grpc_code == ETCD_GRPC_FAILED_PRECONDITION &&
            call.outcome == CERB_OUTCOME_UNKNOWN) {
            /* Our first attempt landed; its TTL is not in this answer.
             * At least what we asked; the next keepalive's answer tells
             * the truth if the server's minimum raised it. */
            note_ttl(e, e->ttl_s);
            return CERB_OK;
        }
        if (call.grpc_code == ETCD_GRPC_FAILED_PRECONDITION)
            return cerb__error_set(CERB_BUSY, "etcd: lease id %llx is taken", (long long)id);
        return st;
    }
    int64_t got_id = 0, ttl = 0;
    st = cerb__etcd_get_i64(call.resp, "ID", &got_id);
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(call.resp, "TTL", &ttl);
    json_decref(call.resp);
    if (st == CERB_OK && (got_id != id || ttl <= 0))
        st = cerb__error_set(CERB_EPROTO, "etcd %s: lease grant answered ID %lld TTL %lld",
                             cerb__etcd_endpoint(&e->http), (long long)got_id, (long long)ttl);
    if (st == CERB_OK)
        note_ttl(e, ttl > e->ttl_s ? ttl : e->ttl_s);
    return st;
}

/* Grant a fresh lease; retried with a new ID on the (unlikely) clash. */
static cerb_status grant_new(cerb_engine *e, int64_t deadline_ns, const atomic_int *abort,
                             int64_t *id, int64_t *sent_ns)
{
    cerb_status st = CERB_BUSY;
    for (int i = 0; i < 3 && st == CERB_BUSY; i++) {
        *id = random_lease_id();
        st = grant(e, *id, deadline_ns, abort, sent_ns);
    }
    if (st == CERB_OK)
        ETCD_COUNT(e, sessions);
    return st;
}

/* One keepalive, by deadline_ns: *ttl from the answer (0 = lease gone). */
static cerb_status keepalive(cerb_engine *e, int64_t id, int64_t deadline_ns, int64_t *ttl,
                             int64_t *sent_ns)
{
    struct etcd_call call;
    int64_t got_id = 0;
    json_t *req = json_pack("{s:o}", "ID", cerb__etcd_json_i64(id));
    cerb_status st = lease_req(e, "lease keepalive", "/v3/lease/keepalive", req, deadline_ns,
                               &e->ka_abort, &call);
    *sent_ns = call.sent_ns;
    if (st != CERB_OK)
        return st;
    st = cerb__etcd_parse_keepalive(call.resp, &got_id, ttl);
    json_decref(call.resp);
    if (st == CERB_OK)
        ETCD_COUNT(e, keepalives);
    if (st == CERB_OK && *ttl > 0)
        note_ttl(e, *ttl);
    return st;
}

/* Revoke: CERB_OK when the lease is gone (also when it was already). */
static cerb_status revoke(cerb_engine *e, int64_t id, int64_t deadline_ns, const atomic_int *abort)
{
    struct etcd_call call;
    json_t *req = json_pack("{s:o}", "ID", cerb__etcd_json_i64(id));
    cerb_status st = lease_req(e, "lease revoke", "/v3/lease/revoke", req, deadline_ns, abort,
                               &call);
    if (st == CERB_OK)
        json_decref(call.resp);
    else if (call.grpc_code == ETCD_GRPC_NOT_FOUND)
        st = CERB_OK;
    return st;
}

/* ---- the thread ---- */

static void emit(cerb_engine *e, cerb_engine_event ev)
{
    /* sess_mu is held by the caller: let go around the callback. */
    cerb__mutex_unlock(&e->sess_mu);
    if (e->env.event)
        e->env.event(e->env.ud, ev, NULL, NULL);
    cerb__mutex_lock(&e->sess_mu);
}

static void lose(cerb_engine *e, const char *why, bool revoke_later)
{
    struct etcd_session *s = &e->sess;
    CERB_LOG_W("etcd %s: session lease %llx lost: %s", cerb__etcd_endpoint(&e->http),
               (unsigned long long)s->id, why);
    s->live = false;
    s->suspect = false;
    if (revoke_later)
        e->revoke_id = s->id;
    cerb__cond_broadcast(&e->sess_cond);
    emit(e, CERB_EV_LOST);
}

/* A delete started with less time than this before the next keepalive is
 * due waits for the keepalive instead. */
#define SWEEP_MIN_MS 20

/*
 * Delete orphans until `until_ns`, when the next keepalive is due (sess_mu
 * held on entry and exit). Each delete is bounded by the time left, so the
 * keepalive is never late for the sweep: thousands of orphans take longer
 * than a TTL, and a session lost to its own housekeeping would lose every
 * hold. What is left waits for the time between the next keepalives.
 */
static void sweep_orphans(cerb_engine *e, int64_t until_ns)
{
    for (;;) {
        if (cerb_monotime() + SWEEP_MIN_MS * CERB_NS_PER_MS > until_ns)
            return;
        struct etcd_orphan *o = e->orphans;
        /* Skip keys in use: an acquire that claimed one adopts the key. */
        while (o && (o->busy || reg_find(e, o->key, o->key_len, key_hash(o->key, o->key_len), NULL)))
            o = o->next;
        /* A deleted entry leaves the list; the first failure ends the
         * pass (the server is not answering) and the rest wait for the
         * next one. */
        if (!o || e->ka_stop)
            return;
        o->busy = true;
        cerb__mutex_unlock(&e->sess_mu);
        int64_t dl = cerb__deadline_in(e->ec->op_timeout_ms);
        cerb_status st = cerb__etcd_delete_key(e, o->key, o->key_len, o->rev,
                                               dl < until_ns ? dl : until_ns, &e->ka_abort, NULL);
        cerb__mutex_lock(&e->sess_mu);
        o->busy = false;
        cerb__cond_broadcast(&e->sess_cond);
        if (st != CERB_OK)
            return; /* the server is not answering: next pass */
        for (struct etcd_orphan **pp = &e->orphans; *pp; pp = &(*pp)->next)
            if (*pp == o) {
                *pp = o->next;
                break;
            }
        CERB_LOG_D("etcd: orphan key %.*s deleted", (int)o->key_len, o->key);
        cerb__free(o->key);
        cerb__free(o);
    }
}

static void *ka_main(void *arg)
{
    cerb_engine *e = arg;
    struct etcd_session *s = &e->sess;
    int64_t next = s->ok_sent_ns + period_ns(e);

    cerb__mutex_lock(&e->sess_mu);
    while (!e->ka_stop) {
        if (!s->live) {
            int64_t id = 0, sent = 0;
            cerb__mutex_unlock(&e->sess_mu);
            cerb_status st = grant_new(e, cerb__deadline_in(e->ec->op_timeout_ms), &e->ka_abort,
                                       &id, &sent);
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            cerb__mutex_lock(&e->sess_mu);
            if (st == CERB_OK) {
                s->id = id;
                s->gen++;
                s->live = true;
                s->suspect = false;
                s->ok_sent_ns = sent;
                next = sent + period_ns(e);
                CERB_LOG_I("etcd %s: new session lease %llx", cerb__etcd_endpoint(&e->http),
                           (unsigned long long)id);
                cerb__cond_broadcast(&e->sess_cond);
            } else if (!e->ka_stop) {
                snprintf(e->grant_err, sizeof e->grant_err, "%s", why);
                cerb__cond_broadcast(&e->sess_cond);
                cerb__cond_wait_until(&e->ka_cond, &e->sess_mu, cerb__deadline_in(KA_RETRY_MS));
            }
            continue;
        }
        /* The keepalive first; housekeeping only in the time left before
         * it is due again. */
        int64_t now = cerb_monotime();
        if (!e->ka_kick && now < next && e->revoke_id) {
            int64_t id = e->revoke_id;
            int64_t dl = cerb__deadline_in(e->ec->op_timeout_ms);
            cerb__mutex_unlock(&e->sess_mu);
            cerb_status st = revoke(e, id, dl < next ? dl : next, &e->ka_abort);
            cerb__mutex_lock(&e->sess_mu);
            if (st == CERB_OK && e->revoke_id == id)
                e->revoke_id = 0;
            now = cerb_monotime();
        }
        if (!e->ka_kick && now < next && e->orphans && !e->ka_stop) {
            sweep_orphans(e, next);
            now = cerb_monotime();
        }
        if (!e->ka_kick && now < next) {
            int64_t until = next;
            if (e->orphans || e->revoke_id) {
                int64_t soon = now + KA_RETRY_MS * CERB_NS_PER_MS;
                until = soon < until ? soon : until;
            }
            cerb__cond_wait_until(&e->ka_cond, &e->sess_mu, until);
            continue;
        }
        e->ka_kick = false;
        int64_t id = s->id, ttl = 0, sent = 0;
        int64_t lose_at = s->ok_sent_ns + lose_after_ns(e);
        if (now >= lose_at) {
            lose(e, "no keepalive succeeded within the TTL", true);
            continue;
        }
        int64_t deadline = cerb__deadline_in(e->ec->op_timeout_ms);
        cerb__mutex_unlock(&e->sess_mu);
        cerb_status st = keepalive(e, id, deadline < lose_at ? deadline : lose_at, &ttl, &sent);
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        cerb__mutex_lock(&e->sess_mu);
        if (e->ka_stop)
            break;
        now = cerb_monotime();
        if (st == CERB_OK && ttl > 0 && sent >= lose_at) {
            lose(e, "a keepalive got through only after the TTL had run out", true);
        } else if (st == CERB_OK && ttl > 0) {
            s->ok_sent_ns = sent;
            next = sent + period_ns(e);
            if (s->suspect) {
                s->suspect = false;
                CERB_LOG_I("etcd %s: session lease %llx confirmed again",
                           cerb__etcd_endpoint(&e->http), (unsigned long long)id);
                emit(e, CERB_EV_VALID);
            }
        } else if (st == CERB_OK) {
            lose(e, "the server no longer knows the lease (revoked or expired)", false);
        } else if (now >= lose_at) {
            char msg[CERB_ERROR_MAX + 64];
            snprintf(msg, sizeof msg, "no keepalive succeeded within the TTL (%s)", why);
            lose(e, msg, true);
        } else {
            next = now + KA_RETRY_MS * CERB_NS_PER_MS;
            if (next > lose_at)
                next = lose_at;
            if (!s->suspect) {
                s->suspect = true;
                CERB_LOG_W("etcd: keepalive of lease %llx failed: %s", (unsigned long long)id,
                           why);
                emit(e, CERB_EV_SUSPECT);
            }
        }
    }
    cerb__mutex_unlock(&e->sess_mu);
    return NULL;
}

/* ---- the engine's side ---- */

void cerb__etcd_session_init(cerb_engine *e)
{
    e->ttl_s = e->ec->session_ttl_s;
    atomic_init(&e->granted_ttl_s, 0);
    cerb__mutex_init(&e->sess_mu);
    cerb__cond_init(&e->sess_cond);
    cerb__cond_init(&e->ka_cond);
    atomic_init(&e->ka_abort, 0);
}

cerb_status cerb__etcd_session_start(cerb_engine *e, int64_t deadline)
{
    int64_t id = 0, sent = 0;
    cerb_status st = grant_new(e, deadline, NULL, &id, &sent);
    if (st != CERB_OK) {
        if (st == CERB_BUSY)
            st = CERB_EPROTO;
        return st;
    }
    e->sess.id = id;
    e->sess.gen = 1;
    e->sess.live = true;
    e->sess.ok_sent_ns = sent;
    if (pthread_create(&e->ka_thread, NULL, ka_main, e) != 0) {
        revoke(e, id, cerb__deadline_in(e->ec->op_timeout_ms), NULL);
        return cerb__error_set(CERB_ENOMEM, "etcd: cannot start the keepalive thread");
    }
    e->ka_started = true;
    return CERB_OK;
}

void cerb__etcd_session_stop(cerb_engine *e)
{
    if (e->ka_started) {
        cerb__mutex_lock(&e->sess_mu);
        e->ka_stop = true;
        atomic_store(&e->ka_abort, 1);
        cerb__cond_broadcast(&e->sess_cond);
        cerb__cond_signal(&e->ka_cond);
        cerb__mutex_unlock(&e->sess_mu);
        pthread_join(e->ka_thread, NULL);
        e->ka_started = false;
    }
    /* Revoking deletes every key of the session at once, which is what
     * Go's session.Close does; bounded, and best effort. */
    int64_t budget = e->ec->op_timeout_ms < 1000 ? e->ec->op_timeout_ms : 1000;
    if (e->sess.live && e->sess.id)
        revoke(e, e->sess.id, cerb__deadline_in(budget), NULL);
    if (e->revoke_id)
        revoke(e, e->revoke_id, cerb__deadline_in(budget), NULL);
    e->sess.live = false;
    while (e->orphans) {
        struct etcd_orphan *o = e->orphans;
        e->orphans = o->next;
        cerb__free(o->key);
        cerb__free(o);
    }
    cerb__cond_destroy(&e->sess_cond);
    cerb__cond_destroy(&e->ka_cond);
    cerb__mutex_destroy(&e->sess_mu);
}

cerb_status cerb__etcd_session_get(cerb_engine *e, int64_t deadline_ns, struct etcd_session *out)
{
    cerb__mutex_lock(&e->sess_mu);
    while (!e->sess.live && !e->ka_stop) {
        if (cerb__cond_wait_until(&e->sess_cond, &e->sess_mu, deadline_ns) && !e->sess.live) {
            cerb_status st = cerb__error_set(
                CERB_EIO, "etcd %s: no session (lease) to put lock keys with%s%s",
                cerb__etcd_endpoint(&e->http), e->grant_err[0] ? ": " : "", e->grant_err);
            cerb__mutex_unlock(&e->sess_mu);
            return st;
        }
    }
    *out = e->sess;
    bool live = e->sess.live;
    cerb__mutex_unlock(&e->sess_mu);
    if (!live)
        return cerb__error_set(CERB_EIO, "etcd: engine is closing");
    return CERB_OK;
}

void cerb__etcd_session_peek(cerb_engine *e, struct etcd_session *out)
{
    cerb__mutex_lock(&e->sess_mu);
    *out = e->sess;
    cerb__mutex_unlock(&e->sess_mu);
}

void cerb__etcd_session_doubt(cerb_engine *e, uint64_t gen)
{
    cerb__mutex_lock(&e->sess_mu);
    if (e->sess.live && e->sess.gen == gen) {
        e->ka_kick = true;
        cerb__cond_signal(&e->ka_cond);
    }
    cerb__mutex_unlock(&e->sess_mu);
}

void cerb__etcd_orphan_add(cerb_engine *e, const char *key, size_t len, int64_t rev)
{
    struct etcd_orphan *o = cerb__calloc(1, sizeof *o);
    char *k = cerb__malloc(len + 1);
    if (!o || !k) {
        cerb__free(o);
        cerb__free(k);
        CERB_LOG_E("etcd: out of memory: key %.*s stays until the session ends", (int)len, key);
        return;
    }
    memcpy(k, key, len);
    k[len] = '\0';
    o->key = k;
    o->key_len = len;
    o->rev = rev;
    ETCD_COUNT(e, orphans);
    CERB_LOG_W("etcd: key %.*s could not be deleted now; the session thread will", (int)len, key);
    cerb__mutex_lock(&e->sess_mu);
    /* One entry per key: a newer entry replaces an older one. */
    for (struct etcd_orphan **pp = &e->orphans; *pp; pp = &(*pp)->next)
        if ((*pp)->key_len == len && memcmp((*pp)->key, key, len) == 0 && !(*pp)->busy) {
            struct etcd_orphan *old = *pp;
            *pp = old->next;
            cerb__free(old->key);
            cerb__free(old);
            break;
        }
    o->next = e->orphans;
    e->orphans = o;
    cerb__cond_signal(&e->ka_cond);
    cerb__mutex_unlock(&e->sess_mu);
}

/* ---- claims ---- */

/* FNV-1a: a bucket index for the claim table, nothing more. */
static uint64_t key_hash(const char *k, size_t n)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)k[i];
        h *= UINT64_C(1099511628211);
    }
    return h;
}

/* Is claim node r for key[0..len)? (prefix + name + "/" + lease hex) */
static bool reg_is(const cerb_engine *e, const struct etcd_reg *r, const char *key, size_t len,
                   uint64_t h)
{
    if (r->hash != h)
        return false;
    char hex[24];
    const char *pfx = e->ec->prefix ? e->ec->prefix : "";
    size_t pl = strlen(pfx), nl = strlen(r->lk->name);
    int hl = snprintf(hex, sizeof hex, "%llx", (unsigned long long)r->lease);
    return len == pl + nl + 1 + (size_t)hl && memcmp(key, pfx, pl) == 0 &&
           memcmp(key + pl, r->lk->name, nl) == 0 && key[pl + nl] == '/' &&
           memcmp(key + pl + nl + 1, hex, (size_t)hl) == 0;
}

/* The claim on key other than `self`, or NULL. sess_mu held. */
static struct etcd_reg *reg_find(cerb_engine *e, const char *key, size_t len, uint64_t h,
                                 const struct etcd_reg *self)
{
    for (struct etcd_reg *r = e->reg[h % ETCD_REG_BUCKETS]; r; r = r->next)
        if (r != self && reg_is(e, r, key, len, h))
            return r;
    return NULL;
}

static void reg_unlink(cerb_engine *e, struct etcd_reg *r)
{
    if (!r->linked)
        return;
    for (struct etcd_reg **pp = &e->reg[r->hash % ETCD_REG_BUCKETS]; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    r->linked = false;
    r->next = NULL;
}

static struct etcd_orphan **orphan_find(cerb_engine *e, const char *key, size_t len)
{
    struct etcd_orphan **pp = &e->orphans;
    while (*pp && !((*pp)->key_len == len && memcmp((*pp)->key, key, len) == 0))
        pp = &(*pp)->next;
    return pp;
}

cerb_status cerb__etcd_claim(cerb_engine *e, cerb_engine_lock *lk, const struct etcd_key *k,
                             int64_t lease, bool temp, int64_t deadline_ns, bool *orphaned)
{
    struct etcd_lock_priv *p = lk->priv;
    uint64_t h = key_hash(k->k, k->len);
    cerb_status st = CERB_OK;

    if (orphaned)
        *orphaned = false;
    cerb__mutex_lock(&e->sess_mu);
    reg_unlink(e, &p->reg);
    for (;;) {
        struct etcd_reg *other = reg_find(e, k->k, k->len, h, &p->reg);
        if (other && !other->temp) {
            st = cerb__error_set(CERB_BUSY, "etcd: key %s belongs to another hold of this client",
                                 k->k);
            break;
        }
        struct etcd_orphan **op = orphan_find(e, k->k, k->len);
        if (!other && !(*op && (*op)->busy)) {
            /* Ours now: an orphan entry of the key is moot. */
            if (*op) {
                struct etcd_orphan *o = *op;
                *op = o->next;
                cerb__free(o->key);
                cerb__free(o);
                if (orphaned)
                    *orphaned = true;
            }
            p->reg.lk = lk;
            p->reg.lease = lease;
            p->reg.hash = h;
            p->reg.temp = temp;
            p->reg.linked = true;
            p->reg.next = e->reg[h % ETCD_REG_BUCKETS];
            e->reg[h % ETCD_REG_BUCKETS] = &p->reg;
            break;
        }
        /* A release of a stale hold or the thread's delete is under way:
         * let it finish first. */
        e->claim_waiters++;
        int late = cerb__cond_wait_until(&e->sess_cond, &e->sess_mu, deadline_ns);
        e->claim_waiters--;
        if (late) {
            st = cerb__error_set(CERB_EIO, "etcd: key %s is being cleaned up", k->k);
            break;
        }
    }
    cerb__mutex_unlock(&e->sess_mu);
    return st;
}

void cerb__etcd_claim_keep(cerb_engine *e, cerb_engine_lock *lk)
{
    struct etcd_lock_priv *p = lk->priv;
    cerb__mutex_lock(&e->sess_mu);
    p->reg.temp = false;
    cerb__mutex_unlock(&e->sess_mu);
}

void cerb__etcd_unclaim(cerb_engine *e, cerb_engine_lock *lk)
{
    struct etcd_lock_priv *p = lk->priv;
    cerb__mutex_lock(&e->sess_mu);
    if (p->reg.linked) {
        reg_unlink(e, &p->reg);
        /* Only a claim waits for this; the common case wakes nobody. */
        if (e->claim_waiters > 0)
            cerb__cond_broadcast(&e->sess_cond);
    }
    cerb__mutex_unlock(&e->sess_mu);
}

bool cerb__etcd_key_of_token(cerb_engine *e, const char *key, size_t len, const char *token)
{
    uint64_t h = key_hash(key, len);
    bool mine = false;
    cerb__mutex_lock(&e->sess_mu);
    for (struct etcd_reg *r = e->reg[h % ETCD_REG_BUCKETS]; r && !mine; r = r->next)
        mine = reg_is(e, r, key, len, h) &&
               strncmp(r->lk->token, token, sizeof r->lk->token) == 0;
    cerb__mutex_unlock(&e->sess_mu);
    return mine;
}

bool cerb__etcd_claimed(cerb_engine *e, cerb_engine_lock *lk)
{
    struct etcd_lock_priv *p = lk->priv;
    cerb__mutex_lock(&e->sess_mu);
    bool c = p->reg.linked && !p->reg.temp;
    cerb__mutex_unlock(&e->sess_mu);
    return c;
}
