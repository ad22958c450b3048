/*
 * guard.c — the idempotency guard's public calls (DESIGN.md §11):
 * cerb_guard_begin/finish/result/degraded/free.
 *
 * An operation is named by its record id, the SHA-256 of guard.app, the
 * scope and the key, each prefixed with its length so that no two different
 * triples hash the same bytes ("ab"+"c" and "a"+"bc" differ). Each attempt
 * gets a fresh owner token. begin is one atomic step on the active engine:
 * claim the record if absent (OK), or report the claim of another attempt
 * (BUSY) or the done-record with its result (DUPLICATE). A running attempt's
 * claim is renewed by the client's guard renewer (guard_renew.c) while its
 * handle is open, so running_ms bounds only crashed processes. finish(1)
 * turns the claim into a done-record kept for keep_ms; finish(0) — and free
 * of an unfinished attempt — deletes it. Both compare the attempt's token on
 * the server, so a finish that arrives after the claim was lost and taken
 * over changes nothing and returns CERB_LOST: that is how the holder learns
 * its claim was lost.
 *
 * Ambiguity. begin is idempotent per token (the engine answers OK when the
 * record is already this token's claim), so after an answer that was lost
 * the core sends it once more, and that second request is the re-check. A
 * finish whose answer was lost is settled with guard_check first: our
 * done-record means it landed; our running claim means it did not (sent
 * again; the engine checks behind the finish it sent, on the same
 * connection: zk_guard_pool.h); no record after a failed attempt's delete
 * means the goal — no record of ours — holds either way; anything else
 * means the claim was lost.
 *
 * Failover. Records are written on the engine that is active at begin, and
 * finish goes to that same engine. Records written before a switch stay on
 * the engine switched from, and processes that have not switched go on
 * writing there; so, exactly where the lock path asks before granting (the
 * safe-switch gate of health.c: engines switched from, or every other one
 * when the configuration pins the active engine), begin claims the record
 * there too, with the same token, after its claim on the active engine:
 *  - a done-record there is a duplicate: its result is copied to the
 *    active engine (our claim there finished with it, so the answer
 *    survives the old engine) and answered;
 *  - another attempt's claim there makes this one BUSY (ours are deleted);
 *  - our claim there (a mirror) is renewed and finished with the attempt,
 *    so a process still on that engine finds it running, then done;
 *  - no answer: it may hold the record until keep_ms + running_ms after it
 *    was last heard (others wrote there until about then) — within that,
 *    on_unavailable decides: REFUSE gives CERB_UNAVAILABLE, ALLOW runs on
 *    the active engine's record alone, and cerb_guard_degraded() says so.
 * Two racing attempts, one on each engine, both claim on the old engine,
 * where one of them is refused. When the active engine itself cannot
 * answer, on_unavailable decides the same way (ALLOW: no record at all).
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "guard.h"
#include "internal.h"
#include "log.h"
#include "token.h"

#define SCOPE_MAX_LEN 255
/* Ranges of the per-call options (the config's, plus 0 = config). */
#define RUNNING_MIN_MS 100
#define RUNNING_MAX_MS INT64_C(86400000)
#define KEEP_MAX_MS INT64_C(31536000000)

/* The settings one call uses, copied under the client mutex. */
struct guard_call_cfg {
    int64_t running_ms, keep_ms, max_result;
    int64_t cfg_keep_ms; /* the configuration's, for records others wrote */
    int on_unavailable;
};

static bool guard_ok(const cerb_guard *g)
{
    return g && atomic_load(&((cerb_guard *)g)->magic) == CERB_GUARD_MAGIC &&
           cerb__client_ok(g->client);
}

static cerb_status check_scope(cerb_client *c, const char *scope)
{
    if (!scope)
        return cerb__error_set(CERB_EINVAL, "guard scope is NULL");
    size_t n = strnlen(scope, SCOPE_MAX_LEN + 1);
    if (n == 0)
        return cerb__error_set(CERB_EINVAL, "guard scope is empty");
    if (n > SCOPE_MAX_LEN)
        return cerb__error_set(CERB_EINVAL, "guard scope is longer than %d bytes", SCOPE_MAX_LEN);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)scope[i];
        if (ch < 0x20 || ch == 0x7f)
            return cerb__error_set(CERB_EINVAL,
                                   "guard scope has a control character (0x%02x) at byte %zu", ch,
                                   i);
    }
    /* Scopes follow lock-name rules on every engine (zk puts the scope in
     * a path), so a scope valid today stays valid after a switch. */
    for (size_t i = 0; i < c->n_engines; i++) {
        cerb_status st = cerb__engine_check_name(c->engines[i].ops, scope);
        if (st != CERB_OK) {
            cerb__error_prefix("guard scope not valid for engine %s", c->engines[i].name);
            return st;
        }
    }
    return CERB_OK;
}

static cerb_status check_opts(const cerb_guard_opts *o)
{
    if (o->running_ms < 0 || (o->running_ms > 0 && (o->running_ms < RUNNING_MIN_MS ||
                                                    o->running_ms > RUNNING_MAX_MS)))
        return cerb__error_set(CERB_EINVAL,
                               "guard running_ms %" PRId64 " is out of range (0 = config, %d..%" PRId64
                               ")", o->running_ms, RUNNING_MIN_MS, RUNNING_MAX_MS);
    if (o->keep_ms < -1 || o->keep_ms > KEEP_MAX_MS)
        return cerb__error_set(CERB_EINVAL,
                               "guard keep_ms %" PRId64 " is out of range (-1 = forever, 0 = config, "
                               "1..%" PRId64 ")", o->keep_ms, KEEP_MAX_MS);
    if (o->on_unavailable != -1 && o->on_unavailable != CERB_GUARD_REFUSE &&
        o->on_unavailable != CERB_GUARD_ALLOW)
        return cerb__error_set(CERB_EINVAL,
                               "guard on_unavailable %d is not CERB_GUARD_REFUSE, "
                               "CERB_GUARD_ALLOW or -1 (config)", o->on_unavailable);
    return CERB_OK;
}

static void call_cfg(cerb_client *c, const cerb_guard_opts *o, struct guard_call_cfg *out)
{
    cerb__mutex_lock(&c->mu);
    out->running_ms = c->cfg->guard.running_ms;
    out->keep_ms = c->cfg->guard.keep_ms;
    out->cfg_keep_ms = out->keep_ms;
    out->max_result = c->cfg->guard.max_result;
    out->on_unavailable = c->cfg->guard.on_unavailable;
    cerb__mutex_unlock(&c->mu);
    if (o->running_ms > 0)
        out->running_ms = o->running_ms;
    if (o->keep_ms != 0)
        out->keep_ms = o->keep_ms;
    if (o->on_unavailable >= 0)
        out->on_unavailable = o->on_unavailable;
}

static void put_len(EVP_MD_CTX *md, uint64_t n)
{
    unsigned char be[8];
    for (int i = 7; i >= 0; i--, n >>= 8)
        be[i] = (unsigned char)(n & 0xff);
    EVP_DigestUpdate(md, be, sizeof be);
}

/* id = hex(SHA-256("cerb-guard-1" · len·app · len·scope · len·key)), lengths
 * as 8 bytes big-endian. guard.app is immutable, so boot_cfg's is read. */
static cerb_status record_id(const char *app, const char *scope, const void *key, size_t key_len,
                             char out[65])
{
    static const char tag[] = "cerb-guard-1";
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dlen = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md)
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory (sha256)");
    int ok = EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
    if (ok) {
        EVP_DigestUpdate(md, tag, sizeof tag - 1);
        put_len(md, strlen(app));
        EVP_DigestUpdate(md, app, strlen(app));
        put_len(md, strlen(scope));
        EVP_DigestUpdate(md, scope, strlen(scope));
        put_len(md, key_len);
        if (key_len)
            EVP_DigestUpdate(md, key, key_len);
        ok = EVP_DigestFinal_ex(md, d, &dlen) == 1 && dlen == 32;
    }
    EVP_MD_CTX_free(md);
    if (!ok)
        return cerb__error_set(CERB_EIO, "guard: sha256 failed");
    for (unsigned i = 0; i < dlen; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    return CERB_OK;
}

/* Statuses that say the engine could not answer (as opposed to an answer,
 * or a mistake of the caller's). */
static bool engine_failed(cerb_status st)
{
    switch (st) {
    case CERB_OK:
    case CERB_BUSY:
    case CERB_DUPLICATE:
    case CERB_NOT_OWNER:
    case CERB_EINVAL:
    case CERB_ENOMEM:
    case CERB_ECONFIG:
    case CERB_INTERRUPTED:
        return false;
    case CERB_TIMEOUT:
    case CERB_LOST:
    case CERB_UNAVAILABLE:
    case CERB_EPROTO:
    case CERB_EIO:
    case CERB_STATUS_COUNT:
        return true;
    }
    return true;
}

/* Feed the engine's breaker, unless the client is closing (close ends the
 * attempts left open after the prober and the breakers' users stopped). */
static void health(cerb_client *c, int idx, bool ok, const char *what)
{
    if (!cerb__client_ok(c))
        return;
    if (ok)
        cerb__health_ok(c, idx);
    else
        cerb__health_fail(c, idx, what);
}

static void guard_free_mem(cerb_guard *g)
{
    /* Dead first: cerb_guard_state (a lost callback, say) reads the
     * mirrors only while the handle is alive, under the set's mutex. */
    atomic_store(&g->ended, true);
    atomic_store(&g->magic, CERB_DEAD_MAGIC);
    cerb_guard *mirrors = cerb__guard_take_mirrors(g);
    while (mirrors) {
        cerb_guard *m = mirrors;
        mirrors = m->mirror_next;
        cerb__guard_untrack(m);
        cerb__free(m);
    }
    cerb__free(g->result);
    g->result = NULL;
    cerb__free(g->scope);
    g->scope = NULL;
    g->rec.scope = "";
    /* Its lost callback may be running: then the notifier frees it. */
    if (!cerb__notify_forget(g->client, g))
        cerb__free(g);
}

/* The engine for this attempt, opened if it was not yet. */
static cerb_engine *engine_of(cerb_client *c, int idx)
{
    struct cerb_client_engine *ce = &c->engines[idx];
    cerb_engine *e = atomic_load(&ce->e);
    if (!e && cerb__client_open_engine(c, (size_t)idx) == CERB_OK)
        e = atomic_load(&ce->e);
    return e;
}

static cerb_status finish_attempt(cerb_guard *g, int succeeded, const void *result, size_t len);

/* Count a begin's answer against the active engine (cerb_engine_info). */
static void count(cerb_client *c, int idx, atomic_uint_fast64_t *(*which)(struct cerb_client_engine *))
{
    atomic_fetch_add_explicit(which(&c->engines[idx]), 1, memory_order_relaxed);
}
static atomic_uint_fast64_t *n_begins(struct cerb_client_engine *ce) { return &ce->guard_begins; }
static atomic_uint_fast64_t *n_dups(struct cerb_client_engine *ce) { return &ce->guard_dups; }
static atomic_uint_fast64_t *n_busy(struct cerb_client_engine *ce) { return &ce->guard_busy; }
static atomic_uint_fast64_t *n_degraded(struct cerb_client_engine *ce) { return &ce->guard_degraded; }

/* Our claim of g's record on engine i, switched from: g's token, renewed
 * and ended with g. */
static cerb_status mirror_add(cerb_guard *g, int i, const cerb_grant *grant)
{
    cerb_guard *m = cerb__calloc(1, sizeof *m);
    if (!m) {
        cerb__guard_orphan(g->client, &g->rec, i, grant->sent_ns);
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
    }
    atomic_init(&m->magic, 0); /* not a handle the caller sees */
    atomic_init(&m->cstate, CERB_LOCK_FREE);
    atomic_init(&m->ended, false);
    atomic_init(&m->valid_until_ns, 0);
    m->client = g->client;
    m->rec = g->rec; /* rec.scope: the parent's */
    m->engine_idx = i;
    m->keep_ms = g->keep_ms;
    m->max_result = g->max_result;
    m->kind = CERB_GUARD_RUNNING;
    m->parent = g;
    cerb_status st = cerb__guard_track(m, grant, true);
    if (st != CERB_OK) {
        cerb__guard_orphan(g->client, &g->rec, i, grant->sent_ns);
        cerb__free(m);
        return st;
    }
    m->mirror_next = g->mirrors;
    g->mirrors = m;
    return CERB_OK;
}

/*
 * Ask every engine switched from about g's record (see the file comment),
 * g's claim on the active engine taken. CERB_OK (mirror claims taken where
 * they answered; g->unconsulted when one that may hold the record did not
 * and the policy allows), CERB_DUPLICATE with the record's result in *dup,
 * CERB_BUSY, CERB_UNAVAILABLE (REFUSE), or a caller's error.
 */
static cerb_status consult(cerb_guard *g, const struct guard_call_cfg *cc, void **dup,
                           size_t *dup_len)
{
    cerb_client *c = g->client;
    for (size_t n = 0; n < c->n_engines; n++) {
        int i = (int)n;
        int64_t heard;
        if (i == g->engine_idx || !cerb__gate_heard(c, i, &heard))
            continue;
        struct cerb_client_engine *ce = &c->engines[i];
        if (!cerb__engine_has_guard(ce->ops))
            continue; /* it never held a record */
        cerb_engine *e = atomic_load(&ce->e);
        cerb_grant grant;
        memset(&grant, 0, sizeof grant);
        void *res = NULL;
        size_t res_len = 0;
        bool maybe_landed = false, asked = false;
        cerb_status st = CERB_UNAVAILABLE;
        char why[CERB_ERROR_MAX] = "a question to it went unanswered just now";
        if (e && cerb__gate_claimable(c, i)) {
            asked = true;
            st = cerb__engine_guard_begin(ce->ops, e, &g->rec, &grant, &res, &res_len);
            maybe_landed = grant.outcome == CERB_OUTCOME_UNKNOWN;
            if (engine_failed(st)) { /* the re-check, as on the active engine */
                st = cerb__engine_guard_begin(ce->ops, e, &g->rec, &grant, &res, &res_len);
                maybe_landed = maybe_landed || grant.outcome == CERB_OUTCOME_UNKNOWN;
            }
            if (engine_failed(st))
                cerb__error_copy(why, sizeof why);
        } else if (!e) {
            snprintf(why, sizeof why, "it is not open");
        }
        if (!engine_failed(st))
            cerb__health_ok(c, i);
        switch (st) {
        case CERB_OK:
            st = mirror_add(g, i, &grant);
            if (st != CERB_OK)
                return st;
            continue;
        case CERB_DUPLICATE:
            *dup = res;
            *dup_len = res_len;
            return CERB_DUPLICATE;
        case CERB_BUSY:
            return cerb__error_set(CERB_BUSY,
                                   "guard %s: another attempt is running on engine %s "
                                   "(switched from)", g->scope, ce->name);
        default:
            break;
        }
        if (!engine_failed(st))
            return st;
        if (asked) /* a back-off not asked through is not renewed by it */
            cerb__gate_no_answer(c, i);
        if (maybe_landed)
            cerb__guard_orphan(c, &g->rec, i, cerb_monotime());
        /* Records there, written until about when it was last heard, last
         * keep_ms after their attempt ended; past that it holds none. */
        int64_t keep = cc->keep_ms < 0 || cc->cfg_keep_ms < 0
                           ? -1
                           : (cc->keep_ms > cc->cfg_keep_ms ? cc->keep_ms : cc->cfg_keep_ms);
        if (keep >= 0 &&
            cerb_monotime() >= heard + (keep + g->rec.running_ms) * CERB_NS_PER_MS)
            continue;
        if (cc->on_unavailable != CERB_GUARD_ALLOW)
            return cerb__error_set(CERB_UNAVAILABLE,
                                   "guard %s: engine %s, switched from, may hold the record and "
                                   "cannot answer (%s)", g->scope, ce->name, why);
        CERB_LOG_W("guard %s: engine %s, switched from, may hold the record and cannot answer "
                   "(%s); running with the record on %s alone (on_unavailable = allow)",
                   g->scope, ce->name, why, c->engines[g->engine_idx].name);
        g->unconsulted = true;
    }
    return CERB_OK;
}

/* A claim no caller will finish: its renewal stopped, its end (a success
 * written, or a delete) left to the background while it lasts. */
static void end_in_background(cerb_guard *claim, int succeeded, const void *result, size_t len)
{
    cerb__guard_stop_renew(claim);
    claim->kind = CERB_GUARD_FINISHED;
    if (succeeded)
        cerb__guard_orphan_done(claim->client, &claim->rec, claim->engine_idx,
                                atomic_load(&claim->valid_until_ns), result, len,
                                claim->keep_ms);
    else
        cerb__guard_orphan(claim->client, &claim->rec, claim->engine_idx, cerb_monotime());
}

/* g's claim on the active engine is taken: consult the engines switched
 * from and give begin's answer. */
static cerb_status begun(cerb_guard *g, const struct guard_call_cfg *cc, cerb_guard **out)
{
    cerb_client *c = g->client;
    int idx = g->engine_idx;
    void *dup = NULL;
    size_t dup_len = 0;
    cerb_status st = consult(g, cc, &dup, &dup_len);
    if (st == CERB_OK) {
        count(c, idx, g->unconsulted ? n_degraded : n_begins);
        *out = g;
        return CERB_OK;
    }
    if (st == CERB_DUPLICATE) {
        /* Our claims become done-records with the answer found, so it
         * outlives the engine it was found on. */
        int keep = (int64_t)dup_len <= g->max_result;
        cerb_status fs = keep ? finish_attempt(g, 1, dup, dup_len) : finish_attempt(g, 0, NULL, 0);
        if (fs != CERB_OK)
            CERB_LOG_W("guard %s: a duplicate found on an engine switched from could not be "
                       "recorded on %s: %s", g->scope, c->engines[idx].name, cerb_last_error());
        if (g->kind == CERB_GUARD_RUNNING) {
            /* Not confirmed, so finish_claim kept the attempt open; but a
             * duplicate's handle is never finished: its claims are ended
             * in the background instead, while they last. */
            end_in_background(g, keep, dup, dup_len);
            for (cerb_guard *m = g->mirrors; m; m = m->mirror_next)
                if (m->kind == CERB_GUARD_RUNNING)
                    end_in_background(m, keep, dup, dup_len);
        }
        atomic_store(&g->ended, true); /* holds no claim: FREE */
        g->kind = CERB_GUARD_DUPLICATE;
        g->result = dup;
        g->result_len = dup_len;
        count(c, idx, n_dups);
        *out = g;
        return CERB_DUPLICATE;
    }
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    finish_attempt(g, 0, NULL, 0); /* our claims go */
    cerb__guard_untrack(g);
    guard_free_mem(g);
    if (st == CERB_BUSY)
        count(c, idx, n_busy);
    return cerb__error_set(st, "%s", why);
}

cerb_status cerb_guard_begin(cerb_client *c, const char *scope, const void *key, size_t key_len,
                             const cerb_guard_opts *opts, cerb_guard **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_guard_begin: out is NULL");
    *out = NULL;
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_guard_begin");
    cerb_status st = check_scope(c, scope);
    if (st != CERB_OK)
        return st;
    if (!key && key_len > 0)
        return cerb__error_set(CERB_EINVAL, "guard key is NULL but its length is %zu", key_len);
    if (key_len > CERB_GUARD_KEY_MAX)
        return cerb__error_set(CERB_EINVAL, "guard key is %zu bytes, more than %d (hash it first)",
                               key_len, CERB_GUARD_KEY_MAX);
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    if (opts)
        o = *opts;
    st = check_opts(&o);
    if (st != CERB_OK)
        return st;
    struct guard_call_cfg cc;
    call_cfg(c, &o, &cc);

    cerb_guard *g = cerb__calloc(1, sizeof *g);
    if (!g)
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
    atomic_init(&g->magic, CERB_GUARD_MAGIC);
    atomic_init(&g->cstate, CERB_LOCK_FREE);
    atomic_init(&g->ended, false);
    atomic_init(&g->valid_until_ns, 0);
    g->client = c;
    g->keep_ms = cc.keep_ms;
    g->max_result = cc.max_result;
    g->scope = cerb__strdup(scope);
    if (!g->scope) {
        guard_free_mem(g);
        return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
    }
    g->rec.scope = g->scope;
    g->rec.running_ms = cc.running_ms;
    st = record_id(c->boot_cfg->guard.app ? c->boot_cfg->guard.app : "", scope, key, key_len,
                   g->rec.id);
    if (st == CERB_OK)
        st = cerb__token_new(g->rec.token);
    if (st != CERB_OK) {
        guard_free_mem(g);
        return st;
    }

    int64_t epoch;
    int idx = cerb__route(c, &epoch);
    g->engine_idx = idx;
    struct cerb_client_engine *ce = &c->engines[idx];
    cerb_engine *e = engine_of(c, idx);
    cerb_grant grant;
    void *res = NULL;
    size_t res_len = 0;
    /* An engine without a guard (or not open) is not a failing engine:
     * the breaker is not told, and the policy decides below. */
    bool can = e && cerb__engine_has_guard(ce->ops);
    st = cerb__engine_guard_begin(ce->ops, e, &g->rec, &grant, &res, &res_len);
    bool maybe_landed = grant.outcome == CERB_OUTCOME_UNKNOWN;
    if (engine_failed(st) && can) {
        /* One more request: begin is idempotent per token, so if the first
         * landed and its answer was lost, this one answers OK (our claim);
         * it is the re-check of an unknown outcome. */
        health(c, idx, false, "guard begin");
        st = cerb__engine_guard_begin(ce->ops, e, &g->rec, &grant, &res, &res_len);
        maybe_landed = maybe_landed || grant.outcome == CERB_OUTCOME_UNKNOWN;
    }
    if (can)
        health(c, idx, !engine_failed(st), "guard begin");

    switch (st) {
    case CERB_OK:
        g->kind = CERB_GUARD_RUNNING;
        st = cerb__guard_track(g, &grant, true);
        if (st != CERB_OK) {
            cerb_outcome oc;
            cerb__engine_guard_finish(ce->ops, e, &g->rec, 0, NULL, 0, 0, &oc);
            guard_free_mem(g);
            return st;
        }
        return begun(g, &cc, out);
    case CERB_DUPLICATE:
        g->kind = CERB_GUARD_DUPLICATE;
        g->result = res;
        g->result_len = res_len;
        st = cerb__guard_track(g, NULL, false);
        if (st != CERB_OK) {
            guard_free_mem(g);
            return st;
        }
        count(c, idx, n_dups);
        *out = g;
        return CERB_DUPLICATE;
    case CERB_BUSY:
        guard_free_mem(g);
        count(c, idx, n_busy);
        return cerb__error_set(CERB_BUSY, "guard %s: another attempt is running", scope);
    default:
        break;
    }
    if (!engine_failed(st)) {
        guard_free_mem(g);
        return st;
    }
    /* The engine could not tell: the policy decides. A claim of ours that
     * may have landed (or land later, from a paused server) is deleted in
     * the background, so it does not keep retries out for running_ms. */
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    if (maybe_landed)
        cerb__guard_orphan(c, &g->rec, idx, cerb_monotime());
    if (cc.on_unavailable != CERB_GUARD_ALLOW) {
        guard_free_mem(g);
        return cerb__error_set(CERB_UNAVAILABLE, "guard %s: engine %s cannot answer (%s)", scope,
                               ce->name, why);
    }
    CERB_LOG_W("guard %s: engine %s cannot answer (%s); running unprotected "
               "(on_unavailable = allow)", scope, ce->name, why);
    g->kind = CERB_GUARD_RUNNING;
    g->degraded = true;
    st = cerb__guard_track(g, NULL, false);
    if (st != CERB_OK) {
        guard_free_mem(g);
        return st;
    }
    count(c, idx, n_degraded);
    *out = g;
    return CERB_OK;
}

/* One finish request, settled when its answer was lost. */
static cerb_status finish_once(cerb_guard *g, int succeeded, const void *result, size_t len,
                               bool *settled)
{
    cerb_client *c = g->client;
    struct cerb_client_engine *ce = &c->engines[g->engine_idx];
    cerb_engine *e = atomic_load(&ce->e);
    cerb_outcome oc;
    *settled = true;
    cerb_status st =
        cerb__engine_guard_finish(ce->ops, e, &g->rec, succeeded, result, len, g->keep_ms, &oc);
    if (st == CERB_NOT_OWNER && succeeded) {
        /* Ours already done (an earlier finish landed, its answer lost)
         * is a success; anything else is a lost claim. */
        health(c, g->engine_idx, true, NULL);
        cerb_guard_found found;
        if (cerb__engine_guard_check(ce->ops, e, &g->rec, &found) == CERB_OK &&
            found == CERB_GUARD_FOUND_DONE)
            return CERB_OK;
        return st;
    }
    if (st == CERB_OK || st == CERB_NOT_OWNER) {
        health(c, g->engine_idx, true, NULL);
        return st;
    }
    if (!engine_failed(st))
        return st;
    health(c, g->engine_idx, false, "guard finish");
    if (oc != CERB_OUTCOME_UNKNOWN) {
        *settled = false; /* certainly not applied: may be sent again */
        return st;
    }
    cerb_guard_found found;
    cerb_status cst = cerb__engine_guard_check(ce->ops, e, &g->rec, &found);
    if (cst != CERB_OK)
        return st; /* still unknown */
    switch (found) {
    case CERB_GUARD_FOUND_DONE:
        return succeeded ? CERB_OK : CERB_NOT_OWNER;
    case CERB_GUARD_FOUND_RUNNING:
        *settled = false; /* ours and still running: it did not land */
        return st;
    case CERB_GUARD_FOUND_NONE:
        /* Deleted by us, or expired: either way no record of ours, which
         * is what a failed attempt's finish wants. A success found none. */
        return succeeded ? CERB_NOT_OWNER : CERB_OK;
    case CERB_GUARD_FOUND_OTHER:
        return CERB_NOT_OWNER;
    }
    return st;
}

/*
 * Finish one claim: the attempt's, or (mirror) its claim on an engine
 * switched from. When the engine does not confirm: a delete goes to the
 * background (so a retry need not wait for running_ms); a success on the
 * attempt's own engine leaves the attempt open, its claim renewed again,
 * so the caller can finish again (a success is never dropped because one
 * request failed); a mirror's success is written in the background while
 * the claim there may still be in force.
 */
static cerb_status finish_claim(cerb_guard *g, int succeeded, const void *result, size_t len,
                                bool mirror)
{
    cerb__guard_stop_renew(g);
    g->kind = CERB_GUARD_FINISHED;
    bool settled;
    int64_t sent_ns = cerb_monotime();
    cerb_status st = finish_once(g, succeeded, result, len, &settled);
    if (!settled)
        st = finish_once(g, succeeded, result, len, &settled);
    if (st == CERB_NOT_OWNER)
        return cerb__error_set(CERB_LOST,
                               "guard %s: the attempt's claim was lost (it ran past running_ms "
                               "without a renewal, or was deleted); nothing was changed",
                               g->rec.scope);
    if (st == CERB_OK || !engine_failed(st))
        return st;
    if (!succeeded) {
        cerb__guard_orphan(g->client, &g->rec, g->engine_idx, cerb_monotime());
        return st;
    }
    if (mirror) {
        cerb__guard_orphan_done(g->client, &g->rec, g->engine_idx, g->valid_until_ns, result,
                                len, g->keep_ms);
        return st;
    }
    g->kind = CERB_GUARD_RUNNING;
    /* The success may have landed: the record would then be a done-record
     * gone keep_ms after the request, and the claim cannot outlast it
     * (found by the simulation, seed 99: keep 500 ms, running 1000 ms, the
     * attempt VALID with no record on the server). A renewal that finds
     * the claim still running moves the deadline on again. */
    if (g->keep_ms >= 0) {
        cerb_grant keep = {.sent_ns = sent_ns, .ttl_ms = g->keep_ms};
        int64_t cap = cerb__grant_deadline(&keep);
        if (cap < atomic_load(&g->valid_until_ns))
            atomic_store(&g->valid_until_ns, cap);
    }
    cerb__guard_resume_renew(g);
    cerb__error_prefix("guard %s: finish not confirmed; the attempt is still open (its claim "
                       "renewed): finish again", g->rec.scope);
    return st;
}

/* Finish the attempt's claim on its engine, then its mirror claims on the
 * engines switched from (a success there too, so that processes still on
 * them see the done-record). The attempt's answer is returned, except that
 * a success whose mirror claim was lost is CERB_LOST: another attempt may
 * have run the operation through that engine. */
static cerb_status finish_attempt(cerb_guard *g, int succeeded, const void *result, size_t len)
{
    /* Mirrors stay renewed until their own finish. */
    cerb_status st = finish_claim(g, succeeded, result, len, false);
    if (!g->mirrors || g->kind == CERB_GUARD_RUNNING) /* kept open: mirrors too */
        return st;
    char why[CERB_ERROR_MAX];
    cerb__error_copy(why, sizeof why);
    const char *lost_on = NULL;
    cerb_client *c = g->client;
    /* A lost attempt changes nothing anywhere: its mirror claims go. */
    int msucc = succeeded && st != CERB_LOST;
    for (cerb_guard *m = g->mirrors; m; m = m->mirror_next) {
        if (m->kind != CERB_GUARD_RUNNING)
            continue;
        int i = m->engine_idx;
        const char *name = c->engines[i].name;
        if (atomic_load(&c->engines[i].gated) && !cerb__gate_claimable(c, i)) {
            /* It left a request unanswered just now: no operation timeout
             * per mirror there (a close ending many attempts), the
             * background tries it. */
            cerb__guard_stop_renew(m);
            m->kind = CERB_GUARD_FINISHED;
            if (msucc)
                cerb__guard_orphan_done(c, &m->rec, i, m->valid_until_ns, result, len,
                                        m->keep_ms);
            else
                cerb__guard_orphan(c, &m->rec, i, cerb_monotime());
            continue;
        }
        cerb_status ms = finish_claim(m, msucc, result, len, true);
        if (engine_failed(ms))
            cerb__gate_no_answer(c, i);
        if (ms == CERB_LOST && msucc)
            lost_on = name;
        else if (ms != CERB_OK && ms != CERB_LOST)
            CERB_LOG_W("guard %s: finish on engine %s (switched from) not confirmed (%s); "
                       "retried in the background while the claim there lasts",
                       g->rec.scope, name, cerb_last_error());
    }
    if (st == CERB_OK && lost_on)
        return cerb__error_set(CERB_LOST,
                               "guard %s: the result is recorded on engine %s, but this "
                               "attempt's claim on engine %s (switched from) was lost: another "
                               "attempt may have run there", g->rec.scope,
                               c->engines[g->engine_idx].name, lost_on);
    if (st != CERB_OK)
        return cerb__error_set(st, "%s", why);
    return st;
}

cerb_status cerb_guard_finish(cerb_guard *g, int succeeded, const void *result, size_t result_len)
{
    if (!guard_ok(g))
        return cerb__error_set(CERB_EINVAL, "cerb_guard_finish: bad guard handle");
    if (g->kind != CERB_GUARD_RUNNING)
        return cerb__error_set(CERB_EINVAL, "cerb_guard_finish: %s",
                               g->kind == CERB_GUARD_DUPLICATE
                                   ? "the handle is a duplicate's answer, not an attempt"
                                   : "the attempt was already finished");
    if (!result && result_len > 0)
        return cerb__error_set(CERB_EINVAL, "guard result is NULL but its length is %zu",
                               result_len);
    if (succeeded && (int64_t)result_len > g->max_result)
        return cerb__error_set(CERB_EINVAL,
                               "guard result is %zu bytes, more than guard.max_result (%" PRId64
                               "); the attempt is still open", result_len, g->max_result);
    /* Keep a copy: cerb_guard_result() then answers as a duplicate would. */
    void *copy = NULL;
    if (succeeded) {
        copy = cerb__malloc(result_len + 1);
        if (!copy)
            return cerb__error_set(CERB_ENOMEM, "guard: out of memory");
        if (result_len)
            memcpy(copy, result, result_len);
        ((char *)copy)[result_len] = '\0';
    }
    cerb_status st = CERB_OK;
    if (g->degraded)
        g->kind = CERB_GUARD_FINISHED;
    else
        st = finish_attempt(g, succeeded, result, result_len);
    if (g->kind != CERB_GUARD_RUNNING) /* else kept open, its claims renewed */
        atomic_store(&g->ended, true);
    if (st == CERB_OK && succeeded) {
        g->result = copy;
        g->result_len = result_len;
    } else {
        cerb__free(copy);
    }
    return st;
}

const void *cerb_guard_result(const cerb_guard *g, size_t *len)
{
    if (len)
        *len = 0;
    if (!guard_ok(g) || !g->result)
        return NULL;
    if (len)
        *len = g->result_len;
    return g->result;
}

int cerb_guard_degraded(const cerb_guard *g)
{
    return guard_ok(g) && (g->degraded || g->unconsulted) ? 1 : 0;
}

enum cerb_lock_state cerb_guard_state(const cerb_guard *g)
{
    if (!guard_ok(g) || atomic_load(&((cerb_guard *)g)->ended))
        return CERB_LOCK_FREE;
    return cerb__guard_state(g);
}

cerb_status cerb_guard_on_lost(cerb_guard *g, void (*cb)(cerb_guard *g, void *ud), void *ud)
{
    if (!guard_ok(g))
        return cerb__error_set(CERB_EINVAL, "cerb_guard_on_lost: bad guard handle");
    cerb__guard_set_lost_cb(g, cb, ud);
    return CERB_OK;
}

cerb_status cerb__guard_end(cerb_guard *g, bool silent)
{
    cerb_status st = CERB_OK;
    if (g->kind == CERB_GUARD_RUNNING && !g->degraded && !silent) {
        st = finish_attempt(g, 0, NULL, 0);
        if (st == CERB_LOST)
            st = CERB_OK; /* nothing of ours to delete: nothing to report */
    }
    guard_free_mem(g);
    return st;
}

cerb_status cerb_guard_free(cerb_guard *g)
{
    if (!g)
        return CERB_OK;
    if (!guard_ok(g))
        return cerb__error_set(CERB_EINVAL, "cerb_guard_free: bad guard handle");
    cerb__guard_untrack(g);
    return cerb__guard_end(g, false);
}
