/*
 * zk_guard.c — the zk engine's idempotency-guard records (cerb_engine_ops
 * version 2, DESIGN.md §11).
 *
 * Layout. A record is a persistent node <base>/<scope>/<hex id>, base being
 * "<parent of zk.root>/guard" (next to the root, like the fence offset: no
 * lock name reaches it, and Curator never looks there). Its scope and the
 * base are CONTAINER nodes, made when a create finds them missing, so the
 * server removes them once empty. The record's data is
 *     <state><token> <life>\n<result bytes>
 * state 'R' (running) or 'D' (done), the 32-char owner token of the attempt
 * that wrote it, its life in ms (running_ms for a claim, keep_ms once done,
 * -1 for forever) in decimal, then the result, binary. The record has one
 * child, <record>/<token>, the token node, created with it in one
 * transaction. Roots sharing a parent share the records (applications keep
 * apart by guard.app, which is in every id). The clock node below is, with
 * the fence offset, one of the engine's permanent nodes: a few bytes per
 * ensemble.
 *
 * Why a token node. Every write of an attempt (renew, finish, delete) must
 * compare the token on the server, atomically with the write. A version
 * CAS alone cannot: a record deleted (it expired) and made again by a new
 * attempt starts again at version 0, so an old attempt's write conditioned
 * on the version it read could land on the new record. ZooKeeper's
 * transactions can check a node's existence, so the attempt's writes check
 * its token node: it exists only while the record is that attempt's. The
 * token node's version says the state: 0 while running, 1 once done. So:
 *  - renew:     multi [check(token node, 0), setData(record, R..., any)]
 *  - finish(1): multi [setData(token node, 0), setData(record, D...+result)]
 *               (BADVERSION on the token node: already done by us, a
 *               re-sent finish: OK)
 *  - finish(0): multi [delete(token node, 0), delete(record, any)]
 * NONODE or BADVERSION otherwise means "not ours": nothing changed. A
 * claim that ran past its life but that nobody took over is still the
 * attempt's, and a late renewal or finish of it succeeds: no other attempt
 * can have begun meanwhile, as beginning would have taken it over first.
 *
 * Expiry by server time. A record's age is judged from its Stat's mtime —
 * the leader's clock when the last write was prepared — and never from a
 * client clock. "Now" on the server is learnt by writing: setData on the
 * clock node "<parent of zk.root>/guard-clock" and reading its mtime (a
 * write sent after the record was read, so its mtime is later than the
 * read). A record counts as live until that proves it expired, with
 * ZK_GUARD_SKEW_MS allowed for the leader's clock having changed (an
 * election). The clock is written only when the record might have expired:
 * each clock reading (server time S, monotonic send time t0) bounds the
 * server's time later, at t, by S + (t - t0) × (1 + drift); a record whose
 * end lies beyond that bound is certainly live, without asking.
 *
 * begin, one round trip on the common paths: the transaction
 * [create(record), create(token node)] and a getData of the record, sent
 * back to back (a session's requests are answered in order, so the read
 * sees the outcome of the create). Created: claimed. NODEEXISTS: the read
 * tells whose claim it is, or carries the done-record's result (a
 * duplicate answered in the same round trip). NONODE on the create: the
 * scope (or the base) is missing; they are created in the next batch with
 * the transaction. A record that has expired is taken over with
 * [delete(its token node), delete(record, version read), create(record),
 * create(token node)]: the version makes sure it is the record judged
 * expired, unchanged since (a renewal in between fails the transaction). A
 * record of our own token (a begin re-sent after its answer was lost) is a
 * claim: it is renewed at once. A record without a token node (made by
 * hand) is taken over, and swept, by its version alone.
 *
 * Cost in round trips: begin 1 (2 requests), plus 1 for the first begin in
 * a scope that does not exist yet, plus 1 (the clock) when a record found
 * may have expired and 1 more to take it over; a duplicate 1; renew 1;
 * finish 1; check 1.
 *
 * Sweeping. Records that expire and nobody asks for again are deleted by
 * the sweeper (zk_guard_sweep.c): there is no expiry on the server.
 *
 * Ambiguity. A transaction whose answer did not come (connection loss,
 * the deadline) has an unknown outcome, reported so; the core settles it
 * (begin sent again finds our claim; finish is checked with guard_check,
 * a getData).
 */
#include "internal_posix.h"

#include "zk_guard.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_guard_impl.h"
#include "zk_guard_pool.h"
#include "zk_guard_sweep.h"
#include "zk_session.h"

/* Requests per begin before giving up (each retry follows a concurrent
 * change: a record deleted, expired or taken over meanwhile). */
#define ZK_GUARD_TRIES 8
/* "R" + token + " " + life (at most 20 characters) + "\n" */
#define HDR_MAX (1 + 32 + 1 + 20 + 1)

/* ---- paths and data ---- */

char *cerb__zkg_path(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + 1 + strlen(b) + (c ? 1 + strlen(c) : 0) + 1;
    char *p = cerb__malloc(n);
    if (p)
        snprintf(p, n, c ? "%s/%s/%s" : "%s/%s", a, b, c ? c : "");
    return p;
}

struct rec_paths {
    char *scope, *rec, *tok;
};

static void paths_free(struct rec_paths *p)
{
    cerb__free(p->scope);
    cerb__free(p->rec);
    cerb__free(p->tok);
}

static cerb_status paths_make(cerb_engine *e, const cerb_guard_rec *rec, struct rec_paths *p)
{
    memset(p, 0, sizeof *p);
    p->scope = cerb__zkg_path(e->guard->base, rec->scope, NULL);
    p->rec = cerb__zkg_path(e->guard->base, rec->scope, rec->id);
    p->tok = p->rec ? cerb__zkg_path(p->rec, rec->token, NULL) : NULL;
    if (!p->scope || !p->rec || !p->tok) {
        paths_free(p);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }
    return CERB_OK;
}

static int rec_header(char *out, char state, const char *token, int64_t life)
{
    return snprintf(out, HDR_MAX + 1, "%c%.32s %" PRId64 "\n", state, token, life);
}

bool cerb__zkg_rec_parse(const char *buf, int len, struct rec_view *v)
{
    if (!buf || len < 1 + 32 + 1 + 1 + 1 || (buf[0] != 'R' && buf[0] != 'D') || buf[33] != ' ')
        return false;
    for (int i = 1; i <= 32; i++)
        if (!((buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f')))
            return false;
    int i = 34;
    bool neg = false;
    int64_t life = 0;
    if (buf[i] == '-') {
        neg = true;
        i++;
    }
    int digits = 0;
    for (; i < len && buf[i] >= '0' && buf[i] <= '9' && digits < 19; i++, digits++)
        life = life * 10 + (buf[i] - '0');
    if (digits == 0 || i >= len || buf[i] != '\n' || (neg && life != 1))
        return false;
    v->state = buf[0];
    memcpy(v->token, buf + 1, 32);
    v->token[32] = '\0';
    v->life = neg ? -1 : life;
    v->res = buf + i + 1;
    v->res_len = (size_t)(len - i - 1);
    return true;
}

/* ---- requests ---- */

/* Create every ancestor of `path` (its parent, ...) as a container, and
 * `path` itself too when `self`. Answers are not looked at: NODEEXISTS is
 * the common one, and the request that needed them tells. */
static void submit_parents(cerb_engine *e, struct zk_call *c, struct zk_session *s,
                           const char *path, bool self)
{
    char buf[1024];
    size_t n = strlen(path);
    if (n >= sizeof buf)
        return; /* the request itself will say what is wrong */
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && !(self && i == n))
            continue;
        char keep = buf[i];
        buf[i] = '\0';
        cerb__zk_call_create(c, s, buf, NULL, &e->acl, ZOO_CONTAINER);
        buf[i] = keep;
    }
}

static size_t count_parents(const char *path)
{
    size_t n = 1;
    for (const char *p = path + 1; *p; p++)
        n += *p == '/';
    return n;
}

int cerb__zkg_failed_op(const struct zk_res *r)
{
    if (!r->gm)
        return -1;
    for (int i = 0; i < r->gm->n; i++) {
        int err = r->gm->res[i].err;
        if (err != ZOK && err != ZRUNTIMEINCONSISTENCY)
            return i;
    }
    return -1;
}

int64_t cerb__zkg_bound(cerb_engine *e)
{
    return cerb__deadline_in(e->zc->connect_timeout_ms);
}

/* In slices with `stop`, so that close does not wait for a slow server. */
bool cerb__zkg_call_wait(struct zk_call *c, int64_t deadline, const atomic_bool *stop)
{
    if (!stop)
        return cerb__zk_call_wait(c, deadline);
    while (!atomic_load(stop)) {
        int64_t now = cerb_monotime();
        if (now >= deadline)
            return false;
        int64_t slice = now + ZK_INTR_SLICE_MS * CERB_NS_PER_MS;
        if (cerb__zk_call_wait(c, slice < deadline ? slice : deadline))
            return true;
    }
    return false;
}

/* Wait for a call; its slot k's code, or ABANDONED when the answers did
 * not all come by the bound (k < 0: the request could not be submitted). */
static int call_rc(cerb_engine *e, struct zk_call *c, int k, int64_t bound, bool *sent,
                   const atomic_bool *stop)
{
    *sent = k >= 0 && c->res[k].sent;
    if (k < 0)
        return ZINVALIDSTATE;
    if (!cerb__zkg_call_wait(c, cerb__zk_call_deadline(e, bound), stop))
        return CERB_ZK_RC_ABANDONED;
    return c->res[k].rc;
}

/* ---- the server's clock ---- */

static void clock_learn(struct zk_guard *gd, int64_t mtime, int64_t sent_ns)
{
    cerb__mutex_lock(&gd->mu);
    gd->clk_known = true;
    gd->clk_ms = mtime;
    gd->clk_sent_ns = sent_ns;
    cerb__mutex_unlock(&gd->mu);
}

/* Is a record with this mtime and life live for certain, by the last
 * clock reading (no request)? */
static bool surely_live(struct zk_guard *gd, int64_t mtime, int64_t life)
{
    if (life < 0)
        return true;
    cerb__mutex_lock(&gd->mu);
    bool known = gd->clk_known;
    int64_t ms = gd->clk_ms, sent = gd->clk_sent_ns;
    cerb__mutex_unlock(&gd->mu);
    if (!known)
        return false;
    int64_t el = (cerb_monotime() - sent) / CERB_NS_PER_MS + 1;
    int64_t upper = ms + el + el * ZK_DRIFT_PERMILLE / 1000 + 1;
    return upper <= mtime + life + ZK_GUARD_SKEW_MS;
}

/* The server's time now: setData on the clock node (made when missing),
 * its mtime. With `stop` (the sweeper): no wait for a connection, and the
 * answer awaited only while stop is not set. */
cerb_status cerb__zkg_server_now(cerb_engine *e, int64_t *now_ms, const atomic_bool *stop)
{
    struct zk_guard *gd = e->guard;
    bool make = false;
    for (int attempt = 0;; attempt++) {
        int64_t bound = cerb__zkg_bound(e);
        struct zk_state ss;
        cerb_status st = cerb__zk_wait_connected(e, stop ? cerb_monotime() : bound, NULL, 0, &ss);
        if (st != CERB_OK)
            return st;
        struct zk_call *c = cerb__zk_call_new(make ? count_parents(gd->clock) + 1 : 1);
        if (!c)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        struct zk_session *s = cerb__zk_session_begin(e);
        int k = -1;
        if (s) {
            if (make) {
                submit_parents(e, c, s, gd->clock, false);
                cerb__zk_call_create(c, s, gd->clock, NULL, &e->acl, ZOO_PERSISTENT);
            }
            k = cerb__zk_call_set(c, s, gd->clock, "", -1, NULL, NULL, 0);
        }
        cerb__zk_session_end(e);
        bool sent;
        int rc = call_rc(e, c, k, bound, &sent, stop);
        if (rc == ZOK && c->res[k].has_stat) {
            *now_ms = c->res[k].stat.mtime;
            clock_learn(gd, *now_ms, c->sent_ns);
            cerb__zk_call_put(c);
            return CERB_OK;
        }
        cerb__zk_call_put(c);
        if (rc == ZNONODE && attempt == 0) {
            make = true;
            continue;
        }
        /* A clock write changes nothing that matters: outcome NO. */
        return cerb__zk_fail(e->hosts, "guard clock: setData", gd->clock, rc, false, NULL);
    }
}

/* ---- the four methods ---- */

cerb_status cerb__zk_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    struct rec_paths p;
    cerb_status st = paths_make(e, rec, &p);
    if (st != CERB_OK)
        return st;
    char hdr[HDR_MAX + 1];
    int hl = rec_header(hdr, 'R', rec->token, rec->running_ms);
    int64_t bound = cerb__zkg_bound(e);
    struct zk_state ss;
    st = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
    struct zk_call *c = st == CERB_OK ? cerb__zk_call_new(1) : NULL;
    if (st == CERB_OK && !c)
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (st != CERB_OK) {
        paths_free(&p);
        return st;
    }
    zoo_op_t ops[2];
    zoo_check_op_init(&ops[0], p.tok, 0);
    zoo_set_op_init(&ops[1], p.rec, hdr, hl, -1, NULL);
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s ? cerb__zk_call_multi(c, s, ops, 2) : -1;
    cerb__zk_session_end(e);
    bool sent;
    int rc = call_rc(e, c, k, bound, &sent, NULL);
    g->sent_ns = c->sent_ns;
    if (rc == ZOK)
        g->ttl_ms = rec->running_ms;
    else if (rc == ZNONODE || rc == ZBADVERSION)
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: guard record %s is no longer this "
                             "attempt's claim", e->hosts, p.rec);
    else
        st = cerb__zk_fail(e->hosts, "guard renew: multi", p.rec, rc, sent, &g->outcome);
    cerb__zk_call_put(c);
    paths_free(&p);
    return st;
}

/* A done-record's result, copied for the core (NUL after it). */
static cerb_status copy_result(cerb_engine *e, const struct rec_view *v, void **result,
                               size_t *result_len)
{
    char *copy = cerb__malloc(v->res_len + 1);
    if (!copy)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (v->res_len)
        memcpy(copy, v->res, v->res_len);
    copy[v->res_len] = '\0';
    *result = copy;
    *result_len = v->res_len;
    return CERB_DUPLICATE;
}

/* What an existing record (read as `r`) means for a begin: a final status,
 * or CERB_OK with *take set when it expired and may be taken over. */
static cerb_status judge(cerb_engine *e, const cerb_guard_rec *rec, const char *path,
                         const struct zk_res *r, bool *take, char *take_tok, int *take_ver,
                         void **result, size_t *result_len, bool *mine_running)
{
    struct rec_view v;
    *take = false;
    *mine_running = false;
    if (!cerb__zkg_rec_parse(r->buf, r->data_len, &v))
        return cerb__error_set(CERB_EPROTO, "zk %s: %s holds no guard record", e->hosts, path);
    if (strcmp(v.token, rec->token) == 0 && v.state == 'R') {
        *mine_running = true;
        return CERB_OK;
    }
    int64_t mtime = r->stat.mtime;
    bool live = surely_live(e->guard, mtime, v.life);
    if (!live) {
        int64_t now;
        cerb_status st = cerb__zkg_server_now(e, &now, NULL);
        if (st != CERB_OK)
            return st;
        live = !cerb__zkg_expired_at(now, mtime, v.life);
    }
    if (live) {
        if (v.state == 'D')
            return copy_result(e, &v, result, result_len);
        return CERB_BUSY;
    }
    *take = true;
    memcpy(take_tok, v.token, 33);
    *take_ver = r->stat.version;
    return CERB_OK;
}

static cerb_status guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                               void **result, size_t *result_len)
{
    struct zk_guard *gd = e->guard;
    if (gd->collides)
        return cerb__error_set(CERB_ECONFIG, "zk %s: zk.root %s is the guard's own base node; "
                               "choose another root to use the guard", e->hosts, e->zc->root);
    cerb__zk_sweeper_begin(e);
    struct rec_paths p;
    cerb_status st = paths_make(e, rec, &p);
    if (st != CERB_OK)
        return st;
    char hdr[HDR_MAX + 1];
    int hl = rec_header(hdr, 'R', rec->token, rec->running_ms);
    bool parents = false, take = false;
    char take_tok[33] = "";
    int take_ver = -1, tok_gone_ver = -1;
    char *old_tok = NULL;
    int i;
    for (i = 0; i < ZK_GUARD_TRIES; i++) {
        int64_t bound = cerb__zkg_bound(e);
        struct zk_state ss;
        cerb_status ws = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
        if (ws != CERB_OK) {
            st = ws;
            break;
        }
        cerb__free(old_tok);
        old_tok = take ? cerb__zkg_path(p.rec, take_tok, NULL) : NULL;
        struct zk_call *c = cerb__zk_call_new((parents ? count_parents(p.scope) : 0) + 2);
        if (!c || (take && !old_tok)) {
            cerb__zk_call_put(c);
            st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
            break;
        }
        zoo_op_t ops[4];
        int n = 0;
        bool with_tok = take && take_ver != tok_gone_ver;
        if (take) {
            if (with_tok)
                zoo_delete_op_init(&ops[n++], old_tok, -1);
            zoo_delete_op_init(&ops[n++], p.rec, take_ver);
        }
        int create_at = n;
        zoo_create_op_init(&ops[n++], p.rec, hdr, hl, &e->acl, ZOO_PERSISTENT, NULL, 0);
        zoo_create_op_init(&ops[n++], p.tok, NULL, -1, &e->acl, ZOO_PERSISTENT, NULL, 0);
        int slot;
        struct zk_session *s = cerb__zk_guard_pool_begin(e->gpool, rec->id, &slot);
        int km = -1, kg = -1;
        if (s) {
            if (parents)
                submit_parents(e, c, s, p.scope, true);
            km = cerb__zk_call_multi(c, s, ops, n);
            kg = cerb__zk_call_getdata(c, s, p.rec);
        }
        cerb__zk_guard_pool_end(e->gpool, slot);
        bool sent;
        int rc = call_rc(e, c, km, bound, &sent, NULL);
        g->sent_ns = c->sent_ns;
        if (rc == ZOK) {
            g->ttl_ms = rec->running_ms; /* claimed */
            cerb__zk_sweeper_made(gd->sweeper);
            cerb__zk_call_put(c);
            st = CERB_OK;
            break;
        }
        if (rc != ZNODEEXISTS && rc != ZNONODE && rc != ZBADVERSION) {
            st = cerb__zk_fail(e->hosts, "guard begin: multi", p.rec, rc, sent, &g->outcome);
            cerb__zk_call_put(c);
            break;
        }
        if (with_tok && rc == ZNONODE && cerb__zkg_failed_op(&c->res[km]) == 0)
            tok_gone_ver = take_ver; /* that record has no token node (hand-made?) */
        take = false;
        if (rc == ZNONODE && cerb__zkg_failed_op(&c->res[km]) == create_at) {
            /* The scope (or the base) is missing: made with the next try. */
            parents = true;
            cerb__zk_call_put(c);
            continue;
        }
        /* The record exists (or existed): the read says what it is. */
        const struct zk_res *r = &c->res[kg];
        if (r->rc == ZNONODE) {
            cerb__zk_call_put(c); /* deleted meanwhile: try again */
            continue;
        }
        if (r->rc != ZOK) {
            st = cerb__zk_fail(e->hosts, "guard begin: getData", p.rec, r->rc, false, NULL);
            cerb__zk_call_put(c);
            break;
        }
        bool mine;
        st = judge(e, rec, p.rec, r, &take, take_tok, &take_ver, result, result_len, &mine);
        cerb__zk_call_put(c);
        if (mine) {
            /* Our own claim, made by a begin whose answer was lost: renew
             * it, so that its life counts from now. */
            st = cerb__zk_guard_renew(e, rec, g);
            break;
        }
        if (st != CERB_OK || !take)
            break;
    }
    if (i == ZK_GUARD_TRIES) /* every try found the record changed meanwhile */
        st = cerb__error_set(CERB_EIO, "zk %s: guard record %s kept changing", e->hosts, p.rec);
    cerb__free(old_tok);
    paths_free(&p);
    return st;
}

static cerb_status guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                const void *result, size_t len, int64_t keep_ms,
                                cerb_outcome *oc)
{
    if (ok && len > ZK_GUARD_RESULT_MAX)
        return cerb__error_set(CERB_EINVAL, "zk %s: a result of %zu bytes is more than a "
                               "ZooKeeper node can hold (%d; guard.max_result is too large "
                               "for this engine)", e->hosts, len, ZK_GUARD_RESULT_MAX);
    struct rec_paths p;
    cerb_status st = paths_make(e, rec, &p);
    if (st != CERB_OK)
        return st;
    char *data = NULL;
    int dl = 0;
    if (ok) {
        data = cerb__malloc(HDR_MAX + 1 + len);
        if (!data) {
            paths_free(&p);
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        }
        dl = rec_header(data, 'D', rec->token, keep_ms < 0 ? -1 : keep_ms);
        if (len)
            memcpy(data + dl, result, len);
        dl += (int)len;
    }
    int64_t bound = cerb__zkg_bound(e);
    struct zk_state ss;
    st = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
    struct zk_call *c = st == CERB_OK ? cerb__zk_call_new(1) : NULL;
    if (st == CERB_OK && !c)
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (st != CERB_OK) {
        cerb__free(data);
        paths_free(&p);
        return st;
    }
    zoo_op_t ops[2];
    if (ok) {
        zoo_set_op_init(&ops[0], p.tok, NULL, -1, 0, NULL);
        zoo_set_op_init(&ops[1], p.rec, data, dl, -1, NULL);
    } else {
        zoo_delete_op_init(&ops[0], p.tok, 0);
        zoo_delete_op_init(&ops[1], p.rec, -1);
    }
    int slot;
    struct zk_session *s = cerb__zk_guard_pool_begin(e->gpool, rec->id, &slot);
    int k = s ? cerb__zk_call_multi(c, s, ops, 2) : -1;
    cerb__zk_guard_pool_end(e->gpool, slot);
    cerb__free(data); /* serialized by the submit */
    bool sent;
    int rc = call_rc(e, c, k, bound, &sent, NULL);
    if (rc == ZOK || (ok && rc == ZBADVERSION && cerb__zkg_failed_op(&c->res[k]) == 0))
        st = CERB_OK; /* BADVERSION on the token node: already done by us */
    else if (rc == ZNONODE || rc == ZBADVERSION)
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: guard record %s is not this attempt's "
                             "claim", e->hosts, p.rec);
    else
        st = cerb__zk_fail(e->hosts, ok ? "guard finish: multi" : "guard delete: multi", p.rec,
                           rc, sent, oc);
    cerb__zk_call_put(c);
    paths_free(&p);
    return st;
}

/* begin and finish, counted for the guard's extra sessions. */
cerb_status cerb__zk_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                 void **result, size_t *result_len)
{
    cerb__zk_guard_pool_enter(e->gpool);
    cerb_status st = guard_begin(e, rec, g, result, result_len);
    cerb__zk_guard_pool_leave(e->gpool);
    return st;
}

cerb_status cerb__zk_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *oc)
{
    cerb__zk_guard_pool_enter(e->gpool);
    cerb_status st = guard_finish(e, rec, ok, result, len, keep_ms, oc);
    cerb__zk_guard_pool_leave(e->gpool);
    return st;
}

cerb_status cerb__zk_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                 cerb_guard_found *found)
{
    *found = CERB_GUARD_FOUND_NONE;
    struct rec_paths p;
    cerb_status st = paths_make(e, rec, &p);
    if (st != CERB_OK)
        return st;
    int64_t bound = cerb__zkg_bound(e);
    struct zk_state ss;
    st = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
    struct zk_call *c = st == CERB_OK ? cerb__zk_call_new(2) : NULL;
    if (st == CERB_OK && !c)
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (st != CERB_OK) {
        paths_free(&p);
        return st;
    }
    /* On the session the record's writes went out on, after them; and a
     * sync first, in case they went out on another (zk_guard_pool.h). */
    int slot;
    struct zk_session *s = cerb__zk_guard_pool_begin(e->gpool, rec->id, &slot);
    int k = -1, ks = -1;
    if (s) {
        ks = cerb__zk_call_sync(c, s, p.rec);
        k = cerb__zk_call_getdata(c, s, p.rec);
    }
    cerb__zk_guard_pool_end(e->gpool, slot);
    bool sent;
    int rc = call_rc(e, c, k, bound, &sent, NULL);
    const char *what = "guard check: getData";
    if (rc == ZOK || rc == ZNONODE) {
        /* A read without its sync may be stale: no answer then. */
        int rs = c->res[ks].rc;
        if (rs != ZOK && rs != ZNONODE) {
            rc = rs;
            what = "guard check: sync";
        }
    }
    struct rec_view v;
    if (rc == ZNONODE)
        *found = CERB_GUARD_FOUND_NONE;
    else if (rc != ZOK)
        st = cerb__zk_fail(e->hosts, what, p.rec, rc, false, NULL);
    else if (!cerb__zkg_rec_parse(c->res[k].buf, c->res[k].data_len, &v))
        st = cerb__error_set(CERB_EPROTO, "zk %s: %s holds no guard record", e->hosts, p.rec);
    else if (strcmp(v.token, rec->token) != 0)
        *found = CERB_GUARD_FOUND_OTHER;
    else
        *found = v.state == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
    cerb__zk_call_put(c);
    paths_free(&p);
    return st;
}

/* ---- open / close ---- */

cerb_status cerb__zk_guard_init(cerb_engine *e)
{
    int64_t max = e->cfg->guard.max_result;
    if (max > ZK_GUARD_RESULT_MAX)
        return cerb__error_set(CERB_ECONFIG, "zk: guard.max_result %" PRId64 " is more than a "
                               "ZooKeeper node can hold with its record (%d bytes: the server's "
                               "jute.maxbuffer, 1 MiB by default, less room for the record's "
                               "header and paths); lower guard.max_result",
                               max, ZK_GUARD_RESULT_MAX);
    struct zk_guard *gd = cerb__calloc(1, sizeof *gd);
    if (!gd)
        return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
    gd->base = cerb__zk_sibling_path(e->zc->root, ZK_GUARD_NODE);
    gd->clock = cerb__zk_sibling_path(e->zc->root, ZK_GUARD_CLOCK_NODE);
    gd->sweeper = cerb__zk_sweeper_new();
    e->gpool = gd->base && gd->clock && gd->sweeper ? cerb__zk_guard_pool_new(e) : NULL;
    if (!e->gpool) {
        cerb__zk_sweeper_free(gd->sweeper);
        cerb__free(gd->base);
        cerb__free(gd->clock);
        cerb__free(gd);
        return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
    }
    gd->collides = strcmp(gd->base, e->zc->root) == 0;
    cerb__mutex_init(&gd->mu);
    e->guard = gd;
    return CERB_OK;
}

void cerb__zk_guard_free(cerb_engine *e)
{
    struct zk_guard *gd = e->guard;
    if (!gd)
        return;
    cerb__zk_sweeper_free(gd->sweeper); /* first: it uses the pool */
    cerb__zk_guard_pool_free(e->gpool);
    e->gpool = NULL;
    cerb__mutex_destroy(&gd->mu);
    cerb__free(gd->base);
    cerb__free(gd->clock);
    cerb__free(gd);
    e->guard = NULL;
}
