/*
 * pg_lock.c — acquire, renew, release, check and held for the pg engine.
 *
 * A try (no waiting) runs on any pooled connection (PG_TRY: the session
 * lock and the row in one round trip). A call that may wait goes straight
 * to a connection that pins no hold, when one is spare, and waits there in
 * slices of at most PG_SLICE_MS (PG_WAIT: lock_timeout set for the one
 * statement), so the server's own queue wakes it inside the call that
 * waits, and the interrupt flag and the deadline are looked at between
 * slices. When the pool has no connection to spare for a wait, it tries
 * again after a short jittered nap: the core lets only one thread per
 * client and name get here, so that is one try per slice per name.
 *
 * A grant of the session lock whose row still shows another owner's lease
 * (that owner's session ended, but it may be working on: a partition, a
 * crash the server only just noticed) keeps the session lock and claims
 * the row once the lease has run out on the server (PG_CLAIM), asking the
 * server how long is left each time: no two clocks are ever compared.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "pg_internal.h"

static void drop_row(cerb_engine *e, cerb_engine_lock *lk, int owner_pid);
static PGconn *slot_conn(cerb_engine *e, int slot, uint64_t *gen);

/* The parameters of a grant statement, as text (but the name, binary). */
struct grant_params {
    char key[24], lease[24], floor[24], k1[16], k2[16], slice[24];
    const char *vals[8];
    int lens[8], fmts[8];
};

static void grant_params_init(struct grant_params *gp, const cerb_engine_lock *lk,
                              const struct pg_key *key)
{
    memset(gp, 0, sizeof *gp);
    snprintf(gp->key, sizeof gp->key, "%" PRId64, key->k);
    snprintf(gp->lease, sizeof gp->lease, "%" PRId64, lk->lease_ms);
    snprintf(gp->floor, sizeof gp->floor, "%" PRIu64, lk->fence_floor);
    snprintf(gp->k1, sizeof gp->k1, "%" PRId32, key->k1);
    snprintf(gp->k2, sizeof gp->k2, "%" PRId32, key->k2);
    gp->vals[0] = lk->name;
    gp->lens[0] = (int)strlen(lk->name);
    gp->fmts[0] = 1;
    gp->vals[1] = gp->key;
    gp->vals[2] = lk->token;
    gp->vals[3] = gp->lease;
    gp->vals[4] = gp->floor;
    gp->vals[5] = key->pair ? gp->k1 : NULL;
    gp->vals[6] = key->pair ? gp->k2 : NULL;
    gp->vals[7] = gp->slice;
}

static bool col_null(const PGresult *r, int c) { return PQntuples(r) < 1 || PQgetisnull(r, 0, c); }
static int64_t col_i64(const PGresult *r, int c) { return strtoll(PQgetvalue(r, 0, c), NULL, 10); }
static bool col_true(const PGresult *r, int c) { return !col_null(r, c) && PQgetvalue(r, 0, c)[0] == 't'; }

/* What a grant statement said. */
struct grant_answer {
    bool got;          /* the session lock is ours */
    bool granted;      /* and the row too: fence */
    uint64_t fence;
    int64_t left_ms;   /* the row's lease left, when another's (else <= 0) */
    bool same;         /* cerberus_meta is of this server (else: check it) */
};

static void parse_grant(const PGresult *r, struct grant_answer *a)
{
    memset(a, 0, sizeof *a);
    a->got = col_true(r, 0);
    a->granted = !col_null(r, 1);
    a->fence = a->granted ? (uint64_t)col_i64(r, 1) : 0;
    a->left_ms = col_null(r, 2) ? 0 : col_i64(r, 2);
    a->same = PQnfields(r) < 4 || col_true(r, 3);
}

/* A grant refused because the failover record is not of the server the
 * session now talks to (a session that outlived a failover): run the
 * check on it now (cerb__pg_check_meta: record the new server, raise the
 * base, start the quarantine), then retry soon. */
static void recheck_identity(cerb_engine *e, int *slot, struct grant_answer *a)
{
    if (a->granted || a->same || *slot < 0)
        return;
    bool broken = false;
    cerb_status st = cerb__pg_check_meta(e, slot_conn(e, *slot, NULL),
                                         cerb__deadline_in(e->pc->op_timeout_ms), &broken);
    if (broken) {
        cerb__pg_give(e, *slot, true, 0);
        *slot = -1;
    }
    if (st != CERB_OK)
        CERB_LOG_D("pg: the failover check failed: %s", cerb_last_error());
    if (a->left_ms <= 0)
        a->left_ms = 1;
}

static PGconn *slot_conn(cerb_engine *e, int slot, uint64_t *gen)
{
    cerb__mutex_lock(&e->mu);
    PGconn *pg = e->slots[slot].pg;
    if (gen)
        *gen = e->slots[slot].gen;
    cerb__mutex_unlock(&e->mu);
    return pg;
}

static int slot_pid(cerb_engine *e, int slot, uint64_t gen)
{
    cerb__mutex_lock(&e->mu);
    int pid = e->slots[slot].gen == gen ? e->slots[slot].pid : -1;
    cerb__mutex_unlock(&e->mu);
    return pid;
}

/* A key as pg_locks shows it: classid, objid, objsubid. */
struct key_oids {
    char c[16], o[16];
    const char *sub;
};

static void key_oids(const struct pg_key *key, struct key_oids *out)
{
    uint32_t hi = key->pair ? (uint32_t)key->k1 : (uint32_t)((uint64_t)key->k >> 32);
    uint32_t lo = key->pair ? (uint32_t)key->k2 : (uint32_t)((uint64_t)key->k & 0xffffffffu);
    snprintf(out->c, sizeof out->c, "%" PRIu32, hi);
    snprintf(out->o, sizeof out->o, "%" PRIu32, lo);
    out->sub = key->pair ? "2" : "1";
}

static bool sql_lock_timeout(const char *ss) { return strcmp(ss, "55P03") == 0; }

/* A statement on a slot the caller has taken; a broken session is given
 * back (ended) here and *slot set to -1. */
static cerb_status run(cerb_engine *e, int *slot, enum pg_stmt stmt, int n, const char *const *v,
                       const int *l, const int *f, int64_t deadline, PGresult **res, char ss[6],
                       bool *broken)
{
    PGconn *pg = slot_conn(e, *slot, NULL);
    /* Behind a transaction pooler a prepared statement lives on whichever
     * backend it was prepared on: lease mode sends the text each time. */
    bool text = e->pc->mode == CERB_SQL_LEASE;
    cerb_status st = cerb__pg_exec(pg, text ? -1 : (int)stmt, text ? e->sql[stmt] : NULL, n, v, l,
                                   f, deadline, res, broken, ss);
    if (*broken) {
        cerb__pg_give(e, *slot, true, 0);
        *slot = -1;
    }
    return st;
}

/* Give a waiter's slot back without any session lock (it pins no hold, so
 * all of them can go): the session is ended instead when that fails. */
static void drop_waiter(cerb_engine *e, int slot)
{
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    PGconn *pg = slot_conn(e, slot, NULL);
    cerb_status st = cerb__pg_exec(pg, -1, "SELECT pg_advisory_unlock_all()", 0, NULL, NULL, NULL,
                                   cerb__deadline_in(e->pc->op_timeout_ms), &res, &broken, ss);
    PQclear(res);
    cerb__pg_give(e, slot, st != CERB_OK, 0);
}

/* Remember the longest lease granted (the failover quarantine covers it). */
static void note_lease(cerb_engine *e, int64_t lease_ms)
{
    int_fast64_t cur = atomic_load_explicit(&e->max_lease_ms, memory_order_relaxed);
    while (lease_ms > cur &&
           !atomic_compare_exchange_weak_explicit(&e->max_lease_ms, &cur, lease_ms,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

static cerb_status granted(cerb_engine *e, cerb_engine_lock *lk, int slot, uint64_t gen,
                           const struct grant_answer *a, cerb_grant *grant)
{
    note_lease(e, lk->lease_ms);
    struct pg_lock_priv *p = lk->priv;
    p->slot = slot;
    p->gen = gen;
    p->fence = a->fence;
    cerb__pg_give(e, slot, false, +1);
    grant->fence = a->fence;
    grant->ttl_ms = lk->lease_ms;
    grant->outcome = CERB_OUTCOME_YES;
    return CERB_OK;
}

/* PG_TRY on any slot. CERB_OK granted; CERB_BUSY not (also when the
 * session lock was free but the row's lease is not: *left_ms says how
 * long); else an error with grant->outcome. */
static cerb_status try_once(cerb_engine *e, cerb_engine_lock *lk, struct grant_params *gp,
                            cerb_grant *grant, int64_t *left_ms)
{
    int slot;
    uint64_t gen;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    struct grant_answer a;
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);

    *left_ms = 0;
    cerb_status st = cerb__pg_take_any(e, opd, false, &slot);
    if (st != CERB_OK) {
        grant->outcome = CERB_OUTCOME_NO;
        return st;
    }
    opd = cerb__deadline_in(e->pc->op_timeout_ms); /* the statement's own */
    slot_conn(e, slot, &gen);
    grant->sent_ns = cerb_monotime();
    atomic_fetch_add_explicit(&e->stats.acquire_calls, 1, memory_order_relaxed);
    st = run(e, &slot, PG_TRY, 7, gp->vals, gp->lens, gp->fmts, opd, &res, ss, &broken);
    if (st != CERB_OK) {
        /* An SQL error aborted the statement, the row included; a session
         * lock it took stays (they ignore rollback), so give it back. */
        if (slot >= 0) {
            PGresult *r2 = NULL;
            bool b2 = false;
            char s2[6];
            const char *uv[3] = {gp->vals[1], gp->vals[5], gp->vals[6]};
            cerb_status st2 = cerb__pg_exec(slot_conn(e, slot, NULL), PG_UNLOCK, NULL, 3, uv, NULL,
                                            NULL, cerb__deadline_in(e->pc->op_timeout_ms), &r2,
                                            &b2, s2);
            PQclear(r2);
            /* When even that fails, end the session: a session lock must
             * never stay behind on a connection that goes on. */
            cerb__pg_give(e, slot, b2 || st2 != CERB_OK, 0);
        }
        grant->outcome = broken ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
        return st;
    }
    parse_grant(res, &a);
    PQclear(res);
    if (a.granted)
        return granted(e, lk, slot, gen, &a, grant);
    recheck_identity(e, &slot, &a);
    if (a.got && slot >= 0) {
        /* Ours, but the row is another's lease: give the session lock
         * back here (this connection may pin holds, and must not sleep);
         * a waiter takes it again on a connection of its own. */
        const char *uv[3] = {gp->vals[1], gp->vals[5], gp->vals[6]};
        st = run(e, &slot, PG_UNLOCK, 3, uv, NULL, NULL, opd, &res, ss, &broken);
        PQclear(res);
        if (st != CERB_OK && slot >= 0) {
            cerb__pg_give(e, slot, true, 0);
            slot = -1;
        }
        *left_ms = a.left_ms > 0 ? a.left_ms : 1;
    }
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
    grant->outcome = CERB_OUTCOME_NO;
    return CERB_BUSY;
}

/* Sleep up to ms, waking early for the interrupt flag or the deadline. */
static bool nap(int64_t ms, int64_t deadline_ns, const atomic_int *intr)
{
    while (ms > 0) {
        if (intr && atomic_load(intr))
            return false;
        int64_t left = cerb__ms_left(deadline_ns);
        if (left <= 0)
            return false;
        int64_t step = ms < 50 ? ms : 50;
        if (step > left)
            step = left;
        cerb__nap_ms(step);
        ms -= step;
    }
    return true;
}

static cerb_status stop_status(const cerb_engine_lock *lk, const atomic_int *intr,
                               cerb_grant *grant)
{
    grant->outcome = CERB_OUTCOME_NO;
    if (intr && atomic_load(intr))
        return cerb__error_set(CERB_INTERRUPTED, "pg: waiting for \"%s\" was interrupted",
                               lk->name);
    return cerb__error_set(CERB_TIMEOUT, "pg: \"%s\" stayed held until the deadline", lk->name);
}

/* One statement on a spare session (one that pins no hold if it can),
 * bounded by the operation timeout from when the session is had. strict
 * (a waiter's tick, which must not be held up nor put holds at risk): a
 * session that pins no hold, had within a slice, or none (CERB_BUSY). */
static cerb_status side_stmt_on(cerb_engine *e, enum pg_stmt stmt, int n, const char *const *v,
                                const int *l, const int *f, PGresult **res, bool strict)
{
    int slot;
    bool broken = false;
    char ss[6];
    *res = NULL;
    cerb_status st = cerb__pg_take_any(
        e, cerb__deadline_in(strict ? PG_SLICE_MS : e->pc->op_timeout_ms), true, &slot);
    if (st != CERB_OK)
        return st;
    if (strict && cerb__pg_slot_holds(e, slot) > 0) {
        cerb__pg_give(e, slot, false, 0);
        return cerb__error_set(CERB_BUSY, "pg: no spare connection now");
    }
    st = run(e, &slot, stmt, n, v, l, f, cerb__deadline_in(e->pc->op_timeout_ms), res, ss,
             &broken);
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
    return st;
}

static cerb_status side_stmt(cerb_engine *e, enum pg_stmt stmt, int n, const char *const *v,
                             const int *l, const int *f, PGresult **res)
{
    return side_stmt_on(e, stmt, n, v, l, f, res, false);
}

/*
 * End the session of a hung holder of lk's name (PG_EVICT), on a spare
 * session while the waiter's own statement waits. The holder's lease ran
 * out on the server while its session kept the session lock: it is paused,
 * or stuck, with its connection up, and would keep every waiter out for as
 * long as that lasts. Its own deadline passed before its lease did, so it
 * already counts the lock as lost; its next renewal fails for good once its
 * session is gone. Without the privilege (another role, no
 * pg_signal_backend) it says so once and the waiter keeps waiting.
 */
static void evict_hung(cerb_engine *e, cerb_engine_lock *lk, const struct pg_key *key)
{
    struct key_oids ko;
    key_oids(key, &ko);
    const char *v[4] = {lk->name, ko.c, ko.o, ko.sub};
    int l[4] = {(int)strlen(lk->name), 0, 0, 0}, f[4] = {1, 0, 0, 0};
    PGresult *res = NULL;
    cerb_status st = side_stmt_on(e, PG_EVICT, 4, v, l, f, &res, true);
    if (st != CERB_OK) {
        if (st == CERB_EPROTO && !atomic_exchange(&e->evict_refused, true))
            CERB_LOG_W("pg: \"%s\" is held by a session whose lease ran out, which this client "
                       "cannot end (%s); it waits until that session ends",
                       lk->name, cerb_last_error());
        return;
    }
    for (int r = 0; r < PQntuples(res); r++) {
        if (PQgetvalue(res, r, 1)[0] == 't') {
            atomic_fetch_add_explicit(&e->stats.evictions, 1, memory_order_relaxed);
            CERB_LOG_W("pg: ended the session (pid %s) of a hung holder of \"%s\": its lease had "
                       "run out while it kept the lock",
                       PQgetvalue(res, r, 0), lk->name);
        }
    }
    PQclear(res);
}

/* What a waiter's tick looks at while its statement waits on the server. */
struct waiting {
    cerb_engine *e;
    cerb_engine_lock *lk;
    const atomic_int *intr;
    int pid;             /* the waiting session's backend */
    bool cancel_sent;
    int64_t cancel_by;   /* after a cancel, give the statement up then */
    int64_t next_evict;
};

/*
 * Every PG_SLICE_MS of a wait. An interrupt cancels the waiting statement
 * from a spare session (pg_cancel_backend: the statement fails, the session
 * stays; the server keeps the waiter's place in its queue until then, so
 * waiters are served in the order they came); when the cancel cannot be
 * sent, or is not answered in time, the statement is given up and its
 * session ended. Once a second, it looks for a hung holder to evict.
 */
static bool wait_tick(void *ud)
{
    struct waiting *w = ud;
    int64_t now = cerb_monotime();
    if (!w->cancel_sent && w->intr && atomic_load(w->intr)) {
        char pid[16];
        snprintf(pid, sizeof pid, "%d", w->pid);
        const char *v[1] = {pid};
        PGresult *res = NULL;
        w->cancel_sent = true;
        bool sent = side_stmt_on(w->e, PG_CANCEL, 1, v, NULL, NULL, &res, true) == CERB_OK &&
                    col_true(res, 0);
        PQclear(res);
        /* The answer's time counts from when the cancel was sent. */
        w->cancel_by = cerb_monotime() + w->e->pc->op_timeout_ms * CERB_NS_PER_MS;
        return sent;
    }
    if (w->cancel_sent)
        return now < w->cancel_by;
    if (now >= w->next_evict) {
        w->next_evict = now + PG_EVICT_EVERY_MS * CERB_NS_PER_MS;
        evict_hung(w->e, w->lk, &((struct pg_lock_priv *)w->lk->priv)->key);
    }
    return true;
}

/*
 * Wait on slot w (pins no hold) until granted, the deadline or the flag.
 * The wait is one statement for the whole deadline (at most PG_WAIT_MAX_MS
 * at a time), so the waiter keeps its place in the server's queue; the
 * server's lock_timeout ends it at the deadline.
 */
static cerb_status wait_on(cerb_engine *e, cerb_engine_lock *lk, struct grant_params *gp, int w,
                           int64_t deadline_ns, const atomic_int *intr, cerb_grant *grant)
{
    uint64_t gen;
    bool have_session = false; /* the session lock is ours; the row is not yet */
    bool rewait = false;
    slot_conn(e, w, &gen);
    for (;;) {
        if ((intr && atomic_load(intr)) || cerb__ms_left(deadline_ns) <= 0) {
            drop_waiter(e, w);
            return stop_status(lk, intr, grant);
        }
        PGresult *res = NULL;
        bool broken = false;
        char ss[6];
        cerb_status st;
        struct waiting wt = {.e = e, .lk = lk, .intr = intr,
                             .pid = slot_pid(e, w, gen),
                             .next_evict = cerb_monotime() + PG_EVICT_EVERY_MS * CERB_NS_PER_MS};
        grant->sent_ns = cerb_monotime();
        atomic_fetch_add_explicit(&e->stats.acquire_calls, 1, memory_order_relaxed);
        if (have_session) {
            st = run(e, &w, PG_CLAIM, 5, gp->vals, gp->lens, gp->fmts,
                     cerb__deadline_in(e->pc->op_timeout_ms), &res, ss, &broken);
        } else {
            int64_t lt = cerb__ms_left(deadline_ns);
            if (lt > PG_WAIT_MAX_MS)
                lt = PG_WAIT_MAX_MS;
            snprintf(gp->slice, sizeof gp->slice, "%lld", (long long)(lt > 0 ? lt : 1));
            struct pg_tick tick = {.every_ms = PG_SLICE_MS, .fn = wait_tick, .ud = &wt};
            st = cerb__pg_exec_tick(slot_conn(e, w, NULL), rewait ? PG_REWAIT : PG_WAIT, NULL, 8,
                                    gp->vals, gp->lens,
                                    gp->fmts, cerb__deadline_in(lt + e->pc->op_timeout_ms), &res,
                                    &broken, ss, &tick);
            if (broken) {
                cerb__pg_give(e, w, true, 0);
                w = -1;
            }
        }
        if (broken) {
            if (wt.cancel_sent) {
                /* Given up after an interrupt: whatever the statement did
                 * ended with its session, but for a row it may have
                 * claimed. */
                drop_row(e, lk, 0);
                return stop_status(lk, intr, grant);
            }
            grant->outcome = CERB_OUTCOME_UNKNOWN;
            return st;
        }
        if (st != CERB_OK) {
            if (!have_session && sql_lock_timeout(ss)) {
                rewait = true; /* a late grant may have stayed */
                continue;      /* the deadline, or PG_WAIT_MAX_MS: look again */
            }
            drop_waiter(e, w);
            if (wt.cancel_sent)
                return stop_status(lk, intr, grant);
            grant->outcome = CERB_OUTCOME_NO;
            return st;
        }
        struct grant_answer a;
        parse_grant(res, &a);
        PQclear(res);
        if (wt.cancel_sent) {
            /* Granted as the cancel went out: the cancel may still land on
             * this session's next statement, so the session ends here (and
             * its session lock with it); the row is freed. */
            cerb__pg_give(e, w, true, 0);
            drop_row(e, lk, 0);
            return stop_status(lk, intr, grant);
        }
        if (a.granted) {
            if (!have_session)
                atomic_fetch_add_explicit(&e->stats.wakeups, 1, memory_order_relaxed);
            return granted(e, lk, w, gen, &a, grant);
        }
        /* The session lock is ours, the row another's lease (or the
         * failover quarantine, or a record to check first). */
        recheck_identity(e, &w, &a);
        if (w < 0) {
            grant->outcome = CERB_OUTCOME_NO;
            return cerb__error_set(CERB_EIO, "pg: the waiting session failed");
        }
        have_session = true;
        if (!nap(a.left_ms > 0 ? a.left_ms : 1, deadline_ns, intr)) {
            drop_waiter(e, w);
            return stop_status(lk, intr, grant);
        }
    }
}

/*
 * Lease mode: claim the row (PG_CLAIM) on any connection; while another
 * owner's lease runs, poll, each nap the shorter of a jittered backoff and
 * what the server says is left of that lease.
 */
static cerb_status lease_acquire_as(cerb_engine *e, cerb_engine_lock *lk,
                                    struct grant_params *gp, int64_t deadline_ns,
                                    const atomic_int *intr, cerb_grant *grant,
                                    struct pg_waiter *pw);

static cerb_status lease_acquire(cerb_engine *e, cerb_engine_lock *lk, struct grant_params *gp,
                                 int64_t deadline_ns, const atomic_int *intr, cerb_grant *grant)
{
    char hex[2 * 256 + 1];
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)lk->name; *c && o + 2 < sizeof hex; c++)
        o += (size_t)snprintf(hex + o, sizeof hex - o, "%02x", *c);
    hex[o] = '\0';
    /* Registered before the first look at the row (LISTEN(7)'s order). */
    struct pg_waiter pw = {.hex = hex};
    if (deadline_ns != 0)
        cerb__pg_waiter_add(e, &pw);
    cerb_status st = lease_acquire_as(e, lk, gp, deadline_ns, intr, grant, &pw);
    if (deadline_ns != 0)
        cerb__pg_waiter_remove(e, &pw);
    return st;
}

static cerb_status lease_acquire_as(cerb_engine *e, cerb_engine_lock *lk,
                                    struct grant_params *gp, int64_t deadline_ns,
                                    const atomic_int *intr, cerb_grant *grant,
                                    struct pg_waiter *pw)
{
    struct pg_lock_priv *p = lk->priv;
    for (int attempt = 0;; attempt++) {
        int slot;
        PGresult *res = NULL;
        bool broken = false;
        char ss[6];
        cerb_status st = cerb__pg_take_any(e, cerb__deadline_in(e->pc->op_timeout_ms), true, &slot);
        if (st != CERB_OK) {
            grant->outcome = CERB_OUTCOME_NO;
            return st;
        }
        grant->sent_ns = cerb_monotime();
        atomic_fetch_add_explicit(&e->stats.acquire_calls, 1, memory_order_relaxed);
        st = run(e, &slot, PG_CLAIM, 5, gp->vals, gp->lens, gp->fmts,
                 cerb__deadline_in(e->pc->op_timeout_ms), &res, ss, &broken);
        if (st != CERB_OK) {
            if (slot >= 0)
                cerb__pg_give(e, slot, false, 0);
            grant->outcome = broken ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
            return st;
        }
        struct grant_answer a;
        parse_grant(res, &a);
        PQclear(res);
        recheck_identity(e, &slot, &a);
        if (slot >= 0)
            cerb__pg_give(e, slot, false, 0);
        if (a.granted) {
            note_lease(e, lk->lease_ms);
            p->row_only = true;
            p->fence = a.fence;
            grant->fence = a.fence;
            grant->ttl_ms = lk->lease_ms;
            grant->outcome = CERB_OUTCOME_YES;
            return CERB_OK;
        }
        grant->outcome = CERB_OUTCOME_NO;
        if (deadline_ns == 0)
            return cerb__error_set(CERB_BUSY, "pg: \"%s\" is held", lk->name);
        /* With a listener, a release wakes us: nap until the lease the
         * server says is left runs out (5 s at most, should a notification
         * be missed); else poll, jittered. */
        int64_t ms;
        if (cerb__pg_listener_live(e)) {
            ms = a.left_ms > 0 && a.left_ms < 5000 ? a.left_ms : 5000;
        } else {
            ms = cerb__backoff_ms(attempt, 10, PG_SLICE_MS);
            if (a.left_ms > 0 && a.left_ms < ms)
                ms = a.left_ms;
        }
        int64_t until = cerb__deadline_in(ms > 0 ? ms : 1);
        while (cerb__ms_left(until) > 0) {
            if ((intr && atomic_load(intr)) || cerb__ms_left(deadline_ns) <= 0)
                return stop_status(lk, intr, grant);
            int64_t step = cerb__ms_left(until);
            if (step > PG_SLICE_MS)
                step = PG_SLICE_MS;
            if (step > cerb__ms_left(deadline_ns))
                step = cerb__ms_left(deadline_ns);
            if (cerb__pg_waiter_wait(e, pw, step > 0 ? step : 1))
                break;
        }
        if ((intr && atomic_load(intr)) || cerb__ms_left(deadline_ns) <= 0)
            return stop_status(lk, intr, grant);
    }
}

cerb_status cerb__pg_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant)
{
    struct pg_lock_priv *p = lk->priv;
    struct grant_params gp;
    int64_t left_ms;

    p->slot = -1;
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = cerb__pg_key(e->pc->key, lk->name, &p->key);
    if (st != CERB_OK)
        return st;
    grant_params_init(&gp, lk, &p->key);
    p->row_only = false;
    if (e->pc->mode == CERB_SQL_LEASE)
        return lease_acquire(e, lk, &gp, deadline_ns, interrupted, grant);
    /* A call that may wait starts as a waiter when a connection is spare:
     * PG_WAIT on a free name grants at once, so one statement serves both
     * (a waiter woken by a release then needs no second try). */
    if (deadline_ns != 0) {
        int w = cerb__pg_take_waiter(e, cerb__deadline_in(e->pc->connect_timeout_ms), &st);
        if (w >= 0)
            return wait_on(e, lk, &gp, w, deadline_ns, interrupted, grant);
        if (st != CERB_OK) /* a connect failed: never a second connect timeout */
            return st;
    }
    for (int attempt = 0;; attempt++) {
        st = try_once(e, lk, &gp, grant, &left_ms);
        if (st != CERB_BUSY || deadline_ns == 0)
            return st == CERB_BUSY
                       ? cerb__error_set(CERB_BUSY, "pg: \"%s\" is held", lk->name)
                       : st;
        if ((interrupted && atomic_load(interrupted)) || cerb__ms_left(deadline_ns) <= 0)
            return stop_status(lk, interrupted, grant);
        int w = cerb__pg_take_waiter(e, cerb__deadline_in(e->pc->connect_timeout_ms), &st);
        if (w >= 0)
            return wait_on(e, lk, &gp, w, deadline_ns, interrupted, grant);
        if (st != CERB_OK) {
            grant->outcome = CERB_OUTCOME_NO;
            return st;
        }
        /* No connection to wait on: poll, jittered, at most a slice. */
        int64_t ms = cerb__backoff_ms(attempt, 10, PG_SLICE_MS);
        if (!nap(ms > 0 ? ms : 1, deadline_ns, interrupted))
            return stop_status(lk, interrupted, grant);
    }
}

cerb_status cerb__pg_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    cerb_renew_item it = {.lk = lk};
    cerb__pg_op_renew_batch(e, &it, 1);
    *grant = it.grant;
    if (it.st != CERB_OK)
        return cerb__error_set(it.st, "%s", cerb_last_error());
    return CERB_OK;
}

/* Give back the session lock of a hold that lost its row (the slot is
 * taken by the caller). */
static void unlock_lost(cerb_engine *e, int *slot, const struct pg_key *key)
{
    char k[24], k1[16], k2[16];
    snprintf(k, sizeof k, "%" PRId64, key->k);
    snprintf(k1, sizeof k1, "%" PRId32, key->k1);
    snprintf(k2, sizeof k2, "%" PRId32, key->k2);
    const char *v[3] = {k, key->pair ? k1 : NULL, key->pair ? k2 : NULL};
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    cerb_status st = run(e, slot, PG_UNLOCK, 3, v, NULL, NULL,
                         cerb__deadline_in(e->pc->op_timeout_ms), &res, ss, &broken);
    PQclear(res);
    if (st != CERB_OK && *slot >= 0) {
        cerb__pg_give(e, *slot, true, 0); /* never leave it behind */
        *slot = -1;
    }
}

/* Renew the items whose holds are pinned to slot s (generation gen) in
 * one statement; each item's st and grant are set. */
/* Item i is in the group being renewed: pinned to slot s of generation
 * gen, or (s < 0) held by its row alone. */
static bool in_group(const cerb_renew_item *it, const bool *done, size_t i, int s, uint64_t gen)
{
    const struct pg_lock_priv *p = it[i].lk->priv;
    if (done[i])
        return false;
    return s < 0 ? p->row_only : (!p->row_only && p->slot == s && p->gen == gen);
}

static void renew_slot(cerb_engine *e, cerb_renew_item *items, size_t n, int s, uint64_t gen,
                       bool *done)
{
    size_t cnt = 0, cap = 64;
    for (size_t i = 0; i < n; i++) {
        if (in_group(items, done, i, s, gen)) {
            cnt++;
            cap += strlen(items[i].lk->name) * 2 + 64;
        }
    }
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);
    int slot = s;
    cerb_status st = s >= 0 ? cerb__pg_take_slot(e, s, gen, opd)
                            : cerb__pg_take_any(e, opd, true, &slot);
    opd = cerb__deadline_in(e->pc->op_timeout_ms);
    char *names = st == CERB_OK ? cerb__malloc(cap) : NULL;
    char *toks = names ? cerb__malloc(cnt * 34 + 4) : NULL;
    char *ms = toks ? cerb__malloc(cnt * 24 + 4) : NULL;
    if (st == CERB_OK && !ms) {
        cerb__pg_give(e, slot, false, 0);
        st = cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    }
    PGresult *res = NULL;
    bool broken = false;
    int64_t sent = cerb_monotime();
    if (st == CERB_OK) {
        size_t on = 0, ot = 0, om = 0;
        names[on++] = '{', toks[ot++] = '{', ms[om++] = '{';
        for (size_t i = 0; i < n; i++) {
            if (!in_group(items, done, i, s, gen))
                continue;
            if (names[on - 1] != '{')
                names[on++] = ',', toks[ot++] = ',', ms[om++] = ',';
            for (const unsigned char *c = (const unsigned char *)items[i].lk->name; *c; c++)
                on += (size_t)sprintf(names + on, "%02x", *c);
            ot += (size_t)sprintf(toks + ot, "%s", items[i].lk->token);
            om += (size_t)sprintf(ms + om, "%" PRId64, items[i].lk->lease_ms);
        }
        names[on++] = '}', toks[ot++] = '}', ms[om++] = '}';
        names[on] = toks[ot] = ms[om] = '\0';
        const char *v[4] = {names, toks, ms, e->pc->mode == CERB_SQL_LEASE ? "t" : "f"};
        char ss[6];
        st = run(e, &slot, PG_RENEW_N, 4, v, NULL, NULL, opd, &res, ss, &broken);
        if (!broken) {
            /* Holds the server no longer lists: give their session locks
             * back while the slot is ours. */
            for (size_t i = 0; st == CERB_OK && s >= 0 && i < n; i++) {
                struct pg_lock_priv *p = items[i].lk->priv;
                if (!in_group(items, done, i, s, gen))
                    continue;
                bool found = false;
                for (int r = 0; r < PQntuples(res) && !found; r++)
                    found = strcmp(PQgetvalue(res, r, 0), items[i].lk->token) == 0;
                if (!found) {
                    unlock_lost(e, &slot, &p->key);
                    if (slot < 0)
                        break;
                }
            }
            if (slot >= 0)
                cerb__pg_give(e, slot, false, 0);
        }
    }
    cerb__free(names);
    cerb__free(toks);
    cerb__free(ms);
    for (size_t i = 0; i < n; i++) {
        struct pg_lock_priv *p = items[i].lk->priv;
        if (!in_group(items, done, i, s, gen))
            continue;
        done[i] = true;
        items[i].grant.sent_ns = sent;
        if (st != CERB_OK) {
            items[i].st = st;
            if (st == CERB_NOT_OWNER && s >= 0)
                p->slot = -1;
            continue;
        }
        items[i].st = CERB_NOT_OWNER;
        for (int r = 0; r < PQntuples(res); r++) {
            if (strcmp(PQgetvalue(res, r, 0), items[i].lk->token) == 0) {
                items[i].st = CERB_OK;
                items[i].grant.fence = strtoull(PQgetvalue(res, r, 1), NULL, 10);
                items[i].grant.ttl_ms = items[i].lk->lease_ms;
            }
        }
        if (items[i].st == CERB_NOT_OWNER && p->row_only) {
            cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" is no longer held by this token",
                            items[i].lk->name);
            p->row_only = false;
        } else if (items[i].st == CERB_NOT_OWNER) {
            cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" is no longer held by this token",
                            items[i].lk->name);
            cerb__mutex_lock(&e->mu);
            if (e->slots[s].gen == gen && e->slots[s].holds > 0)
                e->slots[s].holds--;
            cerb__mutex_unlock(&e->mu);
            p->slot = -1;
        }
    }
    PQclear(res);
    if (st != CERB_OK && st != CERB_NOT_OWNER)
        CERB_LOG_D("pg: renewal failed: %s", cerb_last_error());
}

void cerb__pg_op_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n)
{
    bool stack_done[64];
    bool *done = n <= 64 ? stack_done : cerb__calloc(n, sizeof *done);
    if (!done) {
        for (size_t i = 0; i < n; i++)
            items[i].st = CERB_ENOMEM;
        return;
    }
    memset(done, 0, n * sizeof *done);
    bool any_row_only = false;
    for (size_t i = 0; i < n; i++) {
        struct pg_lock_priv *p = items[i].lk->priv;
        memset(&items[i].grant, 0, sizeof items[i].grant);
        if (e->pc->mode == CERB_SQL_LEASE)
            p->row_only = true; /* also a grant settled by check_owner */
        any_row_only = any_row_only || p->row_only;
        if (p->slot < 0 && !p->row_only) {
            done[i] = true;
            items[i].st = cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" has no session",
                                          items[i].lk->name);
        }
    }
    if (any_row_only)
        renew_slot(e, items, n, -1, 0, done);
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        struct pg_lock_priv *p = items[i].lk->priv;
        renew_slot(e, items, n, p->slot, p->gen, done);
    }
    if (done != stack_done)
        cerb__free(done);
}

/* Free the row of a hold whose session is gone (so a waiter holding the
 * session lock need not wait out the lease), on any connection; with
 * owner_pid <= 0 by the token alone (it is unique, and whoever holds the
 * session lock now is waiting for this very row). */
static void drop_row(cerb_engine *e, cerb_engine_lock *lk, int owner_pid)
{
    int slot;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6], pid[16];
    if (cerb__pg_take_any(e, cerb__deadline_in(e->pc->op_timeout_ms), true, &slot) != CERB_OK)
        return;
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);
    snprintf(pid, sizeof pid, "%d", owner_pid);
    const char *v[3] = {lk->name, lk->token, owner_pid > 0 ? pid : NULL};
    int l[3] = {(int)strlen(lk->name), 0, 0}, f[3] = {1, 0, 0};
    run(e, &slot, PG_DROP, 3, v, l, f, opd, &res, ss, &broken);
    PQclear(res);
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
}

/* Lease mode: free the row of this token, on any connection. */
static cerb_status release_row(cerb_engine *e, cerb_engine_lock *lk)
{
    struct pg_lock_priv *p = lk->priv;
    const char *v[2] = {lk->name, lk->token};
    int l[2] = {(int)strlen(lk->name), 0}, f[2] = {1, 0};
    PGresult *res = NULL;
    cerb_status st = side_stmt(e, PG_RELEASE_N, 2, v, l, f, &res);
    if (st != CERB_OK)
        return st; /* the row's lease ends by itself; a retry is harmless */
    bool freed = PQntuples(res) == 1 && col_i64(res, 0) > 0;
    PQclear(res);
    p->row_only = false;
    return freed ? CERB_OK
                 : cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" was no longer ours", lk->name);
}

cerb_status cerb__pg_op_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct pg_lock_priv *p = lk->priv;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    if (p->row_only || e->pc->mode == CERB_SQL_LEASE)
        return release_row(e, lk);
    if (p->slot < 0)
        return cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" is not held", lk->name);
    int slot = p->slot;
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);
    cerb_status st = cerb__pg_take_slot(e, slot, p->gen, opd);
    if (st == CERB_NOT_OWNER) {
        p->slot = -1;
        drop_row(e, lk, 0);
        return st;
    }
    if (st != CERB_OK) {
        /* The connection stayed busy: its session must not keep our lock
         * once it is given back, and the row must not make the next
         * holder wait out our lease. */
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        cerb__pg_doom(e, slot, p->gen);
        p->slot = -1;
        drop_row(e, lk, 0);
        return cerb__error_set(st, "%s", why);
    }
    opd = cerb__deadline_in(e->pc->op_timeout_ms);
    char k[24], k1[16], k2[16];
    snprintf(k, sizeof k, "%" PRId64, p->key.k);
    snprintf(k1, sizeof k1, "%" PRId32, p->key.k1);
    snprintf(k2, sizeof k2, "%" PRId32, p->key.k2);
    bool adv = e->pc->mode != CERB_SQL_LEASE;
    const char *v[5] = {lk->name, lk->token, adv ? k : NULL, adv && p->key.pair ? k1 : NULL,
                        adv && p->key.pair ? k2 : NULL};
    int l[5] = {(int)strlen(lk->name), 0, 0, 0, 0}, f[5] = {1, 0, 0, 0, 0};
    st = run(e, &slot, PG_RELEASE, 5, v, l, f, opd, &res, ss, &broken);
    p->slot = -1;
    if (broken) {
        /* The session ended: the server gave the session lock back; the
         * row (if the release did not land) need not hold the next holder
         * for a lease. */
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        drop_row(e, lk, 0);
        return cerb__error_set(st, "%s", why);
    }
    bool freed = st == CERB_OK && PQntuples(res) == 1 && col_i64(res, 0) > 0;
    PQclear(res);
    if (st != CERB_OK) {
        /* An SQL error (a cancel, a row lock timing out) undid the row's
         * update and skipped the unlock; session locks ignore rollback. */
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        unlock_lost(e, &slot, &p->key);
        if (slot >= 0)
            cerb__pg_give(e, slot, false, -1);
        drop_row(e, lk, 0);
        return cerb__error_set(st, "%s", why);
    }
    cerb__pg_give(e, slot, false, -1);
    return freed ? CERB_OK
                 : cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" was no longer ours", lk->name);
}

cerb_status cerb__pg_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct pg_lock_priv *p = lk->priv;
    int slot;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    /* One request timeout for the connection and the statement together:
     * this re-checks an acquire whose answer did not come, which may have
     * run one request timeout past its caller's deadline already. A
     * connect to a paused server and then a statement on it made that
     * three, past the two the failover pairs allow. But a statement on a
     * session that pins holds gets a whole one: cut short, it would end
     * that session, and those holds with it. */
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);
    cerb_status st = cerb__pg_take_any(e, opd, true, &slot);
    if (st != CERB_OK)
        return st;
    if (cerb__pg_slot_holds(e, slot) > 0)
        opd = cerb__deadline_in(e->pc->op_timeout_ms);
    const char *v[2] = {lk->name, lk->token};
    int l[2] = {(int)strlen(lk->name), 0}, f[2] = {1, 0};
    grant->sent_ns = cerb_monotime();
    st = run(e, &slot, PG_CHECK, 2, v, l, f, opd, &res, ss, &broken);
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
    if (st != CERB_OK)
        return st;
    if (PQntuples(res) != 1) {
        PQclear(res);
        return cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" is not held by this token", lk->name);
    }
    uint64_t fence = (uint64_t)col_i64(res, 0);
    int owner_pid = col_null(res, 1) ? 0 : (int)col_i64(res, 1);
    bool valid = col_true(res, 2);
    PQclear(res);
    bool ours = e->pc->mode == CERB_SQL_LEASE ||
                (p->slot >= 0 && owner_pid > 0 && slot_pid(e, p->slot, p->gen) == owner_pid);
    if (valid && ours) {
        if (e->pc->mode == CERB_SQL_LEASE) {
            p->row_only = true;
            p->fence = fence;
        }
        grant->fence = fence;
        grant->ttl_ms = 0; /* the lease is not extended here */
        return CERB_OK;
    }
    if (valid)
        drop_row(e, lk, owner_pid); /* written by a session of ours that ended */
    return cerb__error_set(CERB_NOT_OWNER, "pg: \"%s\" is not held by this token", lk->name);
}

cerb_status cerb__pg_op_held(cerb_engine *e, const char *name)
{
    struct pg_key key;
    cerb_status st = cerb__pg_key(e->pc->key, name, &key);
    if (st != CERB_OK)
        return st;
    struct key_oids ko;
    key_oids(&key, &ko);
    bool adv = e->pc->mode != CERB_SQL_LEASE;
    const char *v[4] = {name, adv ? ko.c : NULL, adv ? ko.o : NULL, ko.sub};
    int l[4] = {(int)strlen(name), 0, 0, 0}, f[4] = {1, 0, 0, 0};
    int slot;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    st = cerb__pg_take_any(e, cerb__deadline_in(e->pc->op_timeout_ms), true, &slot);
    if (st != CERB_OK)
        return st;
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);
    st = run(e, &slot, PG_HELD, 4, v, l, f, opd, &res, ss, &broken);
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
    if (st != CERB_OK)
        return st;
    bool held = col_true(res, 0);
    PQclear(res);
    return held ? cerb__error_set(CERB_BUSY, "pg: \"%s\" is held", name) : CERB_OK;
}

cerb_status cerb__pg_op_probe(cerb_engine *e, int64_t timeout_ms)
{
    int slot;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    int64_t dl = cerb__deadline_in(timeout_ms);
    cerb_status st = cerb__pg_take_any(e, dl, true, &slot);
    if (st != CERB_OK)
        return st;
    const char *v[1] = {e->probe_name};
    int l[1] = {(int)strlen(e->probe_name)}, f[1] = {1};
    st = run(e, &slot, PG_PROBE, 1, v, l, f, dl, &res, ss, &broken);
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
    if (st != CERB_OK)
        return st;
    bool standby = col_true(res, 0);
    PQclear(res);
    return standby ? cerb__error_set(CERB_UNAVAILABLE, "pg: the server is now a standby") : CERB_OK;
}

cerb_status cerb__pg_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct pg_key key;
    cerb_status st = cerb__pg_key(e->pc->key, name, &key);
    if (st != CERB_OK)
        return st;
    struct key_oids ko;
    key_oids(&key, &ko);
    const char *v[4] = {name, ko.c, ko.o, ko.sub};
    int l[4] = {(int)strlen(name), 0, 0, 0}, f[4] = {1, 0, 0, 0};
    PGresult *res = NULL;
    st = side_stmt(e, PG_INSPECT, 4, v, l, f, &res);
    for (int r = 0; st == CERB_OK && r < PQntuples(res); r++) {
        const char *who = PQgetvalue(res, r, 1);
        st = cerb__holders_add(out, who, strlen(who), atoi(PQgetvalue(res, r, 0)),
                               strtoull(PQgetvalue(res, r, 2), NULL, 10),
                               strtoll(PQgetvalue(res, r, 3), NULL, 10), PQgetvalue(res, r, 4));
    }
    PQclear(res);
    return st;
}
