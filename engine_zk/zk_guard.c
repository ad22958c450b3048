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
 * Sweeping. Records that expire and are never asked for again are removed
 * by a sweeper thread per engine instance, started by the first begin:
 * first at a random point of the first ZK_GUARD_SWEEP_MS, then every
 * ZK_GUARD_SWEEP_MS (± 20 %), and earlier once this client made enough
 * records to pay for (a client that lives a few seconds must still delete
 * about as many as it makes, or records pile up when clients come and
 * go), it lists the scopes, takes up to
 * ZK_GUARD_SWEEP_SCOPES of them (rotating), lists them, and keeps a window
 * of each one's names that the passes of the next ZK_GUARD_SWEEP_MS read
 * on from (a listing of a big scope of live records cost more than the
 * pass's reads); it reads their records in
 * batches of ZK_GUARD_SWEEP_RECS: each batch read, the server's time read
 * (once a pass), and the expired ones deleted by version (with their token
 * nodes); a probe of ZK_GUARD_SWEEP_PROBE per scope, batches while a
 * quarter of the last had expired, up to a budget that grows with the
 * records this client made; then scopes found empty. So expired records do not pile up, whatever the rate
 * of begins: a pass costs two round trips plus three or four per batch,
 * rests half as long as each batch took (sweep_pace), is skipped
 * while disconnected, and close stops it between and during its waits.
 *
 * Ambiguity. A transaction whose answer did not come (connection loss,
 * the deadline) has an unknown outcome, reported so; the core settles it
 * (begin sent again finds our claim; finish is checked with guard_check,
 * a getData).
 */
#include "internal_posix.h"

#include "zk_guard.h"

#include <inttypes.h>
#include <pthread.h>
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
#include "zk_guard_pool.h"
#include "zk_session.h"

/* Allowance for the leader's clock: a record's mtime and the clock's may
 * come from different leaders. */
#define ZK_GUARD_SKEW_MS 200
/* Requests per begin before giving up (each retry follows a concurrent
 * change: a record deleted, expired or taken over meanwhile). */
#define ZK_GUARD_TRIES 8
#define ZK_GUARD_SWEEP_MS 5000
#define ZK_GUARD_SWEEP_SCOPES 64
#define ZK_GUARD_SWEEP_RECS 128
/* A scope's first batch in a pass: a probe, since in a scope of live
 * records it finds nothing to delete (that read costs the client's begins
 * time; early passes come every ZK_GUARD_SWEEP_EARLY records made or
 * more). */
#define ZK_GUARD_SWEEP_PROBE 32
/* Records a pass may read at least (the budget); twice as many more as
 * this client made records since the last pass. A scope's reads stop
 * sooner when a batch finds few expired. */
#define ZK_GUARD_SWEEP_FLOOR 256
/* The first pass comes at a random point of the first ZK_GUARD_SWEEP_MS
 * after the first begin (clients started together, like cron jobs, do not
 * list together; a client that lives a second sweeps with a chance of one
 * in five, which over many such clients deletes far more than they make).
 * A pass comes early once this client made ZK_GUARD_SWEEP_EARLY records
 * since the last, or an eighth of the records the last pass listed when
 * that is more, up to ZK_GUARD_SWEEP_EARLY_MAX: listing the scopes costs
 * at most 8 names per record made until the scopes hold 32 768 records,
 * and past that a pass still comes every 4 096 records made, since a
 * backlog that large is what needs clearing. A client that makes records
 * faster than the timer's passes pay for them, and lives a few seconds,
 * so still deletes about twice as many as it makes. */
#define ZK_GUARD_SWEEP_EARLY 1024
#define ZK_GUARD_SWEEP_EARLY_MAX 4096
#define ZK_GUARD_SWEEP_CREDIT_MAX ((size_t)1 << 22)
/* Names a listing keeps for the passes after it: at most
 * ZK_GUARD_SWEEP_WINDOW of a scope, and ZK_GUARD_SWEEP_CACHE in all (some
 * 6 MiB; a bigger scope is read a window at a time, one per listing). */
#define ZK_GUARD_SWEEP_WINDOW 8192
#define ZK_GUARD_SWEEP_CACHE 65536
/* "R" + token + " " + life (at most 20 characters) + "\n" */
#define HDR_MAX (1 + 32 + 1 + 20 + 1)

/* A scope as the sweeper last listed it: a window of its records' names
 * from a random place, and how far the passes read. */
struct sweep_scope {
    char *path;
    char **names;
    size_t n, next;
};

struct zk_guard {
    char *base;        /* <parent of root>/guard */
    char *clock;       /* <parent of root>/guard-clock */
    bool collides;     /* zk.root is the base itself */
    cerb_mutex mu;
    cerb_cond cond;    /* the sweeper's sleep; stop */
    /* The newest clock reading (mu). */
    bool clk_known;
    int64_t clk_ms;       /* server time: the clock write's mtime */
    int64_t clk_sent_ns;  /* monotonic, before that write was sent */
    /* The sweeper (mu). */
    bool started;
    atomic_bool stop;
    pthread_t thread;
    size_t cursor;
    uint64_t rnd;
    atomic_uint_fast64_t swept; /* records deleted by the sweeper */
    atomic_uint_fast64_t made;  /* records this client made since the last pass */
    atomic_uint_fast64_t early; /* made this many: the next pass now */
    size_t credit;              /* reads owed for them (the sweeper's own) */
    /* The last listing (the sweeper's own), read from by the passes that
     * follow while it is fresh (cache_fresh). */
    struct sweep_scope *cache;
    size_t n_cache;
    int64_t cache_ns;           /* monotonic, when it was listed */
    atomic_uint_fast64_t passes, listings; /* for tests */
};

/* A record made: counted for the sweeper's budget, which is woken (once)
 * when the count reaches the early mark. */
static void note_made(struct zk_guard *gd)
{
    uint64_t n = atomic_fetch_add_explicit(&gd->made, 1, memory_order_relaxed) + 1;
    if (n == atomic_load_explicit(&gd->early, memory_order_relaxed)) {
        cerb__mutex_lock(&gd->mu);
        cerb__cond_signal(&gd->cond);
        cerb__mutex_unlock(&gd->mu);
    }
}

/* ---- paths and data ---- */

static char *path_join3(const char *a, const char *b, const char *c)
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
    p->scope = path_join3(e->guard->base, rec->scope, NULL);
    p->rec = path_join3(e->guard->base, rec->scope, rec->id);
    p->tok = p->rec ? path_join3(p->rec, rec->token, NULL) : NULL;
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

struct rec_view {
    char state;
    char token[33];
    int64_t life;
    const char *res;
    size_t res_len;
};

/* Read a record's data; false when it is not one (a node of someone
 * else's under our base). */
static bool rec_parse(const char *buf, int len, struct rec_view *v)
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

/* The first operation of a failed transaction that says why. */
static int failed_op(const struct zk_res *r)
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

static int64_t guard_bound(cerb_engine *e)
{
    return cerb__deadline_in(e->zc->connect_timeout_ms);
}

/* Wait for every answer of c until the deadline; with `stop` (the
 * sweeper's), in slices, giving up once it is set, so that close does not
 * wait for a slow server. */
static bool call_wait(struct zk_call *c, int64_t deadline, const atomic_bool *stop)
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
    if (!call_wait(c, cerb__zk_call_deadline(e, bound), stop))
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

static bool expired_at(int64_t now_ms, int64_t mtime, int64_t life)
{
    return life >= 0 && now_ms > mtime + life + ZK_GUARD_SKEW_MS;
}

/* The server's time now: setData on the clock node (made when missing),
 * its mtime. With `stop` (the sweeper): no wait for a connection, and the
 * answer awaited only while stop is not set. */
static cerb_status server_now(cerb_engine *e, int64_t *now_ms, const atomic_bool *stop)
{
    struct zk_guard *gd = e->guard;
    bool make = false;
    for (int attempt = 0;; attempt++) {
        int64_t bound = guard_bound(e);
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
    int64_t bound = guard_bound(e);
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

static void sweeper_ensure(cerb_engine *e);

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
    if (!rec_parse(r->buf, r->data_len, &v))
        return cerb__error_set(CERB_EPROTO, "zk %s: %s holds no guard record", e->hosts, path);
    if (strcmp(v.token, rec->token) == 0 && v.state == 'R') {
        *mine_running = true;
        return CERB_OK;
    }
    int64_t mtime = r->stat.mtime;
    bool live = surely_live(e->guard, mtime, v.life);
    if (!live) {
        int64_t now;
        cerb_status st = server_now(e, &now, NULL);
        if (st != CERB_OK)
            return st;
        live = !expired_at(now, mtime, v.life);
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
    sweeper_ensure(e);
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
        int64_t bound = guard_bound(e);
        struct zk_state ss;
        cerb_status ws = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
        if (ws != CERB_OK) {
            st = ws;
            break;
        }
        cerb__free(old_tok);
        old_tok = take ? path_join3(p.rec, take_tok, NULL) : NULL;
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
            note_made(gd);
            cerb__zk_call_put(c);
            st = CERB_OK;
            break;
        }
        if (rc != ZNODEEXISTS && rc != ZNONODE && rc != ZBADVERSION) {
            st = cerb__zk_fail(e->hosts, "guard begin: multi", p.rec, rc, sent, &g->outcome);
            cerb__zk_call_put(c);
            break;
        }
        if (with_tok && rc == ZNONODE && failed_op(&c->res[km]) == 0)
            tok_gone_ver = take_ver; /* that record has no token node (hand-made?) */
        take = false;
        if (rc == ZNONODE && failed_op(&c->res[km]) == create_at) {
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
    int64_t bound = guard_bound(e);
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
    if (rc == ZOK || (ok && rc == ZBADVERSION && failed_op(&c->res[k]) == 0))
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
    int64_t bound = guard_bound(e);
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
    else if (!rec_parse(c->res[k].buf, c->res[k].data_len, &v))
        st = cerb__error_set(CERB_EPROTO, "zk %s: %s holds no guard record", e->hosts, p.rec);
    else if (strcmp(v.token, rec->token) != 0)
        *found = CERB_GUARD_FOUND_OTHER;
    else
        *found = v.state == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
    cerb__zk_call_put(c);
    paths_free(&p);
    return st;
}

/* ---- the sweeper ---- */

/* A call of n requests made by `submit`, waited for; NULL when it could
 * not be sent or answered in time. */
static struct zk_call *sweep_call(cerb_engine *e, size_t n,
                                  void (*submit)(struct zk_call *, struct zk_session *, void *),
                                  void *ud)
{
    struct zk_call *c = cerb__zk_call_new(n ? n : 1);
    if (!c)
        return NULL;
    struct zk_session *s = cerb__zk_session_begin(e);
    if (s)
        submit(c, s, ud);
    cerb__zk_session_end(e);
    if (!s || !call_wait(c, cerb__zk_call_deadline(e, guard_bound(e)), &e->guard->stop)) {
        cerb__zk_call_put(c);
        return NULL;
    }
    return c;
}

struct sweep {
    cerb_engine *e;
    char **paths;  /* scopes, then records */
    size_t n;
    const bool *del;
    char **toks;   /* token node paths of expired records */
    const int *vers;
};

static void submit_list(struct zk_call *c, struct zk_session *s, void *ud)
{
    struct sweep *w = ud;
    for (size_t i = 0; i < w->n; i++)
        cerb__zk_call_list(c, s, w->paths[i]);
}

static void submit_get(struct zk_call *c, struct zk_session *s, void *ud)
{
    struct sweep *w = ud;
    for (size_t i = 0; i < w->n; i++)
        cerb__zk_call_getdata(c, s, w->paths[i]);
}

static void submit_delete(struct zk_call *c, struct zk_session *s, void *ud)
{
    struct sweep *w = ud;
    for (size_t i = 0; i < w->n; i++) {
        if (!w->del[i])
            continue;
        zoo_op_t ops[2];
        if (!w->toks && !w->vers) {
            cerb__zk_call_delete(c, s, w->paths[i]); /* an empty scope */
            continue;
        }
        if (!w->toks) {
            zoo_delete_op_init(&ops[0], w->paths[i], w->vers[i]);
            cerb__zk_call_multi(c, s, ops, 1);
            continue;
        }
        zoo_delete_op_init(&ops[0], w->toks[i], -1);
        zoo_delete_op_init(&ops[1], w->paths[i], w->vers[i]);
        cerb__zk_call_multi(c, s, ops, 2);
    }
}

static void free_strs(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        cerb__free(v[i]);
    cerb__free(v);
}

static uint64_t next_rnd(struct zk_guard *gd)
{
    gd->rnd = gd->rnd * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
    return gd->rnd >> 33;
}

/* One batch of records (paths): read, then the expired ones deleted by
 * version with their token nodes. The server's time is read after the
 * first batch's reads, once a pass (*now_ms 0 until then): an earlier
 * reading is a lower bound for later batches, so it judges fewer records
 * expired, never more; one clock write a pass, not one a batch. Answers
 * how many went; *failed when a request was not answered. */
static size_t sweep_records(cerb_engine *e, char **recs, size_t n_rec, int64_t *now_ms,
                            bool *failed)
{
    struct zk_guard *gd = e->guard;
    size_t n_gone = 0;
    *failed = true;
    if (n_rec && !atomic_load(&gd->stop)) {
        struct sweep w = {.e = e, .paths = recs, .n = n_rec};
        struct zk_call *c = sweep_call(e, n_rec, submit_get, &w);
        if (c && *now_ms == 0 && server_now(e, now_ms, &gd->stop) != CERB_OK)
            *now_ms = 0;
        int64_t now = *now_ms;
        if (c && now != 0) {
            *failed = false;
            bool *del = cerb__calloc(n_rec, sizeof *del);
            char **toks = cerb__calloc(n_rec, sizeof *toks);
            int *vers = cerb__calloc(n_rec, sizeof *vers);
            size_t n_del = 0;
            for (size_t i = 0; i < n_rec && del && toks && vers; i++) {
                const struct zk_res *r = &c->res[i];
                struct rec_view v;
                if (r->rc != ZOK || !rec_parse(r->buf, r->data_len, &v) ||
                    !expired_at(now, r->stat.mtime, v.life))
                    continue;
                toks[i] = path_join3(recs[i], v.token, NULL);
                if (!toks[i])
                    continue;
                del[i] = true;
                vers[i] = r->stat.version;
                n_del++;
            }
            if (n_del) {
                w = (struct sweep){.e = e, .paths = recs, .n = n_rec, .del = del, .toks = toks,
                                   .vers = vers};
                struct zk_call *d = sweep_call(e, n_del, submit_delete, &w);
                /* A record without its token node (made by hand?) is
                 * deleted by its version alone. */
                size_t n_again = 0, j = 0;
                for (size_t i = 0; d && i < n_rec; i++) {
                    if (!del[i])
                        continue;
                    const struct zk_res *r = &d->res[j++];
                    n_gone += r->rc == ZOK;
                    del[i] = r->rc == ZNONODE && failed_op(r) == 0;
                    n_again += del[i];
                }
                bool answered = d != NULL;
                *failed = !answered;
                cerb__zk_call_put(d);
                if (answered && n_again && !atomic_load(&gd->stop)) {
                    w.toks = NULL;
                    struct zk_call *d2 = sweep_call(e, n_again, submit_delete, &w);
                    for (size_t i = 0; d2 && i < d2->used; i++)
                        n_gone += d2->res[i].rc == ZOK;
                    cerb__zk_call_put(d2);
                }
            }
            cerb__free(del);
            free_strs(toks, n_rec);
            cerb__free(vers);
        }
        cerb__zk_call_put(c);
    }
    return n_gone;
}

/* After a batch that took `took_ns`, rest half as long (at most a second;
 * close ends the rest): the sweeper's requests share the session, in order, with
 * every begin and finish of this client, so a sweeper that ran batch after
 * batch held them up (the guard bench's duplicates at 8 threads went from
 * 0.86 to 0.13 of the raw ceiling while a backlog was swept, before the
 * budget of sweep_once bounded a pass to what this client made). Two
 * thirds of the session's time deletes thousands of records a second. */
static void sweep_pace(struct zk_guard *gd, int64_t took_ns)
{
    int64_t rest = took_ns / 2;
    if (rest > 1000 * CERB_NS_PER_MS)
        rest = 1000 * CERB_NS_PER_MS;
    int64_t until = cerb_monotime() + rest;
    cerb__mutex_lock(&gd->mu);
    while (!atomic_load(&gd->stop) && cerb_monotime() < until)
        cerb__cond_wait_until(&gd->cond, &gd->mu, until);
    cerb__mutex_unlock(&gd->mu);
}

/* Free the listing the passes read from. */
static void cache_drop(struct zk_guard *gd)
{
    for (size_t i = 0; i < gd->n_cache; i++) {
        free_strs(gd->cache[i].names, gd->cache[i].n);
        cerb__free(gd->cache[i].path);
    }
    cerb__free(gd->cache);
    gd->cache = NULL;
    gd->n_cache = 0;
}

/* The last listing still has names to read, and is recent enough that
 * records made since are a small part of what the scopes hold. */
static bool cache_fresh(const struct zk_guard *gd)
{
    if (!gd->n_cache || cerb_monotime() - gd->cache_ns >= ZK_GUARD_SWEEP_MS * CERB_NS_PER_MS)
        return false;
    for (size_t i = 0; i < gd->n_cache; i++)
        if (gd->cache[i].next < gd->cache[i].n)
            return true;
    return false;
}

/* List the base, take up to ZK_GUARD_SWEEP_SCOPES scopes (rotating), list
 * them, and keep a window of each one's names, from a random place
 * (sweepers of other clients start elsewhere), for this pass and the next
 * ones; scopes found empty are deleted. Sets the early mark from the
 * records listed. False when a list went unanswered (or out of memory). */
static bool sweep_list(cerb_engine *e)
{
    struct zk_guard *gd = e->guard;
    cache_drop(gd);
    char *base = gd->base;
    struct sweep w = {.e = e, .paths = &base, .n = 1};
    struct zk_call *c = sweep_call(e, 1, submit_list, &w);
    if (!c)
        return false;
    size_t n_sc = c->res[0].rc == ZOK ? (size_t)c->res[0].n_names : 0;
    size_t take_sc = n_sc < ZK_GUARD_SWEEP_SCOPES ? n_sc : ZK_GUARD_SWEEP_SCOPES;
    char **scopes = take_sc ? cerb__calloc(take_sc, sizeof *scopes) : NULL;
    size_t first = 0;
    cerb__mutex_lock(&gd->mu);
    first = n_sc ? gd->cursor % n_sc : 0;
    gd->cursor += take_sc;
    cerb__mutex_unlock(&gd->mu);
    bool oom = take_sc && !scopes;
    for (size_t i = 0; i < take_sc && !oom; i++) {
        scopes[i] = path_join3(base, c->res[0].names[(first + i) % n_sc], NULL);
        oom = !scopes[i];
    }
    cerb__zk_call_put(c);
    if (oom || take_sc == 0 || atomic_load(&gd->stop)) {
        free_strs(scopes, take_sc);
        return false;
    }
    w = (struct sweep){.e = e, .paths = scopes, .n = take_sc};
    c = sweep_call(e, take_sc, submit_list, &w);
    gd->cache = c ? cerb__calloc(take_sc, sizeof *gd->cache) : NULL;
    if (!gd->cache) {
        cerb__zk_call_put(c);
        free_strs(scopes, take_sc);
        return false;
    }
    atomic_fetch_add(&gd->listings, 1);
    gd->cache_ns = cerb_monotime();
    size_t window = ZK_GUARD_SWEEP_CACHE / take_sc, n_listed = 0, n_empty = 0;
    window = window > ZK_GUARD_SWEEP_WINDOW ? ZK_GUARD_SWEEP_WINDOW : window;
    bool *empty = cerb__calloc(take_sc, sizeof *empty);
    for (size_t i = 0; i < take_sc; i++) {
        const struct zk_res *r = &c->res[i];
        if (r->rc != ZOK)
            continue;
        size_t n = (size_t)r->n_names;
        n_listed += n;
        if (n == 0 && empty) {
            empty[i] = true;
            n_empty++;
            continue;
        }
        struct sweep_scope *sc = &gd->cache[gd->n_cache];
        size_t take = n < window ? n : window, off = (size_t)next_rnd(gd) % n;
        sc->names = cerb__calloc(take, sizeof *sc->names);
        if (!sc->names)
            break;
        sc->path = scopes[i];
        scopes[i] = NULL;
        gd->n_cache++;
        for (size_t j = 0; j < take; j++) {
            if (!(sc->names[j] = cerb__strdup(r->names[(off + j) % n])))
                break;
            sc->n++;
        }
    }
    cerb__zk_call_put(c);
    /* The next pass comes early after this client made an eighth as many
     * records as were listed (see ZK_GUARD_SWEEP_EARLY). */
    size_t early = n_listed / 8;
    early = early < ZK_GUARD_SWEEP_EARLY       ? ZK_GUARD_SWEEP_EARLY
            : early > ZK_GUARD_SWEEP_EARLY_MAX ? ZK_GUARD_SWEEP_EARLY_MAX
                                               : early;
    atomic_store(&gd->early, early);
    if (n_empty && !atomic_load(&gd->stop)) {
        /* Scopes found empty: the server removes empty containers too, but
         * only every few seconds or minutes (znode.container.checkIntervalMs).
         * A begin that creates a record meanwhile makes the delete fail
         * (NOTEMPTY), or finds the scope gone and makes it again. */
        w = (struct sweep){.e = e, .paths = scopes, .n = take_sc, .del = empty};
        cerb__zk_call_put(sweep_call(e, n_empty, submit_delete, &w));
    }
    cerb__free(empty);
    free_strs(scopes, take_sc);
    return true;
}

/* One pass: see the file comment. False when it did not get as far as
 * taking this client's count of records made (disconnected, a list
 * unanswered): the next pass waits for its time then. */
static bool sweep_once(cerb_engine *e)
{
    struct zk_guard *gd = e->guard;
    struct zk_state ss;
    cerb__zk_state(e, &ss);
    if (!ss.connected)
        return false;
    /* A pass reads on from the last listing while it is fresh: listing a
     * scope of live records costs the server (and this client's begins,
     * which share the session) more than the few reads a pass then makes,
     * and a client that makes records fast brings passes forward. */
    if (!cache_fresh(gd) && !sweep_list(e))
        return false;

    /* The scopes' records in batches of ZK_GUARD_SWEEP_RECS: a probe of
     * ZK_GUARD_SWEEP_PROBE per scope, and batches while a quarter or more
     * of the last one had expired, up to a budget of ZK_GUARD_SWEEP_FLOOR
     * reads plus twice the records this client made and not yet paid for.
     * So each client sweeps at least as fast as it makes records, and
     * expired ones stay below about as many as the live ones whatever the
     * rate of begins (a fixed budget fell behind any steady rate above it,
     * and they piled up on the server); the floor clears what clients that
     * left behind. A scope of long-kept records is not read whole every
     * pass. Reads owed for records made carry over until they expire: a
     * pass that runs while they are still live finds too few expired to go
     * on. */
    uint64_t made = atomic_exchange(&gd->made, 0);
    gd->credit += made > ZK_GUARD_SWEEP_CREDIT_MAX ? ZK_GUARD_SWEEP_CREDIT_MAX : (size_t)made * 2;
    if (gd->credit > ZK_GUARD_SWEEP_CREDIT_MAX)
        gd->credit = ZK_GUARD_SWEEP_CREDIT_MAX;
    size_t budget = ZK_GUARD_SWEEP_FLOOR + gd->credit, n_gone = 0;
    size_t n_sc = gd->n_cache;
    size_t s0 = n_sc ? (size_t)next_rnd(gd) % n_sc : 0; /* the budget may not reach them all */
    char **recs = cerb__calloc(ZK_GUARD_SWEEP_RECS, sizeof *recs);
    int64_t now = 0; /* the server's time, read once */
    bool stop = !recs;
    for (size_t t = 0; t < n_sc && !stop; t++) {
        struct sweep_scope *sc = &gd->cache[(s0 + t) % n_sc];
        for (bool probe = true; sc->next < sc->n && !stop && budget > 0; probe = false) {
            size_t n_rec = 0, cap = probe ? ZK_GUARD_SWEEP_PROBE : ZK_GUARD_SWEEP_RECS;
            for (; sc->next < sc->n && n_rec < cap && n_rec < budget; sc->next++) {
                char *path = path_join3(sc->path, sc->names[sc->next], NULL);
                if (!path) {
                    stop = true; /* out of memory: the next pass */
                    break;
                }
                recs[n_rec++] = path;
            }
            int64_t t0 = cerb_monotime();
            bool failed;
            size_t gone = sweep_records(e, recs, n_rec, &now, &failed);
            n_gone += gone;
            if (failed) {
                stop = true; /* the next pass; credit kept for it */
            } else {
                budget -= n_rec;
                if (budget < gd->credit)
                    gd->credit = budget; /* the floor goes first */
            }
            sweep_pace(gd, cerb_monotime() - t0);
            for (size_t k = 0; k < n_rec; k++) {
                cerb__free(recs[k]);
                recs[k] = NULL;
            }
            stop = stop || atomic_load(&gd->stop);
            if (gone < (n_rec + 3) / 4)
                break;
        }
    }
    if (n_gone) {
        atomic_fetch_add(&gd->swept, n_gone);
        CERB_LOG_D("zk %s: guard sweep deleted %zu expired record(s)", e->hosts, n_gone);
    }
    cerb__free(recs);
    atomic_fetch_add(&gd->passes, 1);
    return true;
}

/* Made enough records since the last pass to bring the next forward. */
static bool sweep_due(struct zk_guard *gd)
{
    return atomic_load_explicit(&gd->made, memory_order_relaxed) >=
           atomic_load_explicit(&gd->early, memory_order_relaxed);
}

static void *sweeper_main(void *arg)
{
    cerb_engine *e = arg;
    struct zk_guard *gd = e->guard;
    cerb__mutex_lock(&gd->mu);
    /* The first pass at a random point of the first interval. */
    int64_t ms = (int64_t)(next_rnd(gd) % ZK_GUARD_SWEEP_MS);
    bool ran = true;
    while (!atomic_load(&gd->stop)) {
        int64_t next = cerb_monotime() + ms * CERB_NS_PER_MS;
        while (!atomic_load(&gd->stop) && cerb_monotime() < next && !(ran && sweep_due(gd)))
            cerb__cond_wait_until(&gd->cond, &gd->mu, next);
        if (atomic_load(&gd->stop))
            break;
        cerb__mutex_unlock(&gd->mu);
        cerb__zk_guard_pool_tend(e->gpool);
        ran = sweep_once(e);
        cerb__mutex_lock(&gd->mu);
        int64_t span = ZK_GUARD_SWEEP_MS * 2 / 5; /* ± 20 % */
        ms = ZK_GUARD_SWEEP_MS - span / 2 + (int64_t)(next_rnd(gd) % (uint64_t)span);
    }
    cerb__mutex_unlock(&gd->mu);
    return NULL;
}

void cerb__zk_guard_sweep_counts(cerb_engine *e, uint64_t *passes, uint64_t *listings)
{
    *passes = atomic_load(&e->guard->passes);
    *listings = atomic_load(&e->guard->listings);
}

static void sweeper_ensure(cerb_engine *e)
{
    struct zk_guard *gd = e->guard;
    cerb__mutex_lock(&gd->mu);
    if (!gd->started && !atomic_load(&gd->stop)) {
        if (pthread_create(&gd->thread, NULL, sweeper_main, e) == 0)
            gd->started = true;
        else
            CERB_LOG_W("zk %s: cannot start the guard sweeper; expired records are removed "
                       "only when asked for", e->hosts);
    }
    cerb__mutex_unlock(&gd->mu);
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
    e->gpool = gd->base && gd->clock ? cerb__zk_guard_pool_new(e) : NULL;
    if (!e->gpool) {
        cerb__free(gd->base);
        cerb__free(gd->clock);
        cerb__free(gd);
        return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
    }
    gd->collides = strcmp(gd->base, e->zc->root) == 0;
    cerb__mutex_init(&gd->mu);
    cerb__cond_init(&gd->cond);
    atomic_init(&gd->stop, false);
    atomic_init(&gd->swept, 0);
    atomic_init(&gd->passes, 0);
    atomic_init(&gd->listings, 0);
    atomic_init(&gd->made, 0);
    atomic_init(&gd->early, ZK_GUARD_SWEEP_EARLY);
    gd->rnd = (uint64_t)cerb_monotime() ^ (uint64_t)(uintptr_t)gd;
    e->guard = gd;
    return CERB_OK;
}

void cerb__zk_guard_free(cerb_engine *e)
{
    struct zk_guard *gd = e->guard;
    if (!gd)
        return;
    cerb__mutex_lock(&gd->mu);
    atomic_store(&gd->stop, true);
    cerb__cond_signal(&gd->cond);
    bool started = gd->started;
    cerb__mutex_unlock(&gd->mu);
    if (started)
        pthread_join(gd->thread, NULL);
    cerb__zk_guard_pool_free(e->gpool);
    e->gpool = NULL;
    cache_drop(gd);
    cerb__cond_destroy(&gd->cond);
    cerb__mutex_destroy(&gd->mu);
    cerb__free(gd->base);
    cerb__free(gd->clock);
    cerb__free(gd);
    e->guard = NULL;
}
