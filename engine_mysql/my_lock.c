/*
 * my_lock.c — acquire, renew, release, check, held and probe for the mysql
 * engine (my_sql.c has the statements and why their order is safe).
 *
 * Acquire tries first on any pooled connection that pins no hold of the
 * same GET_LOCK name (MY_TRY: the row and GET_LOCK(lname, 0) in one round
 * trip). A claim that matched nothing is explained by MY_DIAG: the row is
 * missing (it is created with INSERT IGNORE and the try repeated once), or
 * another owner's lease runs, or the GET_LOCK is someone else's; a GET_LOCK
 * this statement took without the row is given back at once. When the
 * caller may wait, it moves to a connection that pins no hold, drops what
 * that session holds (RELEASE_ALL_LOCKS), and waits there in one
 * GET_LOCK(lname, deadline) (at most MY_WAIT_MAX_MS at a time), keeping its
 * place in the server's queue; every MY_SLICE_MS a tick looks at the
 * interrupt flag (KILL QUERY from a spare session ends the wait) and, once
 * a second, ends the session of a hung holder (KILL CONNECTION, see
 * evict_hung). A GET_LOCK granted while the
 * row still shows another owner's lease (that owner's session ended, but it
 * may still be working) is kept, and the row claimed once the lease has run
 * out on the server (MY_CLAIM), asking the server how long is left each
 * time: no two clocks are ever compared.
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
#include "my_internal.h"
#include <mysqld_error.h>

static struct my_val v_str(const char *s) { return (struct my_val){.t = MV_STR, .s = s, .len = (unsigned long)strlen(s)}; }
static struct my_val v_bin(const char *s) { return (struct my_val){.t = MV_BIN, .s = s, .len = (unsigned long)strlen(s)}; }
static struct my_val v_i64(int64_t i) { return (struct my_val){.t = MV_I64, .i = i}; }
static struct my_val v_u64(uint64_t u) { return (struct my_val){.t = MV_U64, .u = u}; }
static struct my_val v_dbl(double d) { return (struct my_val){.t = MV_DBL, .d = d}; }
static struct my_val v_null(void) { return (struct my_val){.t = MV_NULL}; }

static int64_t col_i64(const struct my_res *r, int row, int c)
{
    return row < r->nrows && !r->rows[row].null[c] ? strtoll(r->rows[row].v[c], NULL, 10) : 0;
}
static bool col_null(const struct my_res *r, int row, int c)
{
    return row >= r->nrows || r->rows[row].null[c];
}

static uint64_t slot_gen(cerb_engine *e, int slot)
{
    cerb__mutex_lock(&e->mu);
    uint64_t g = e->slots[slot].gen;
    cerb__mutex_unlock(&e->mu);
    return g;
}

/* The connection id of a slot's session, when it is still generation gen
 * (0 otherwise). */
static uint64_t slot_conn(cerb_engine *e, int slot, uint64_t gen)
{
    if (slot < 0 || slot >= e->nslots)
        return 0;
    cerb__mutex_lock(&e->mu);
    uint64_t id = e->slots[slot].gen == gen && e->slots[slot].my ? e->slots[slot].conn_id : 0;
    cerb__mutex_unlock(&e->mu);
    return id;
}

/* The server's error number of this thread's last statement (run). */
static _Thread_local unsigned last_errnum;

/* An error that means "not done, try again": InnoDB's deadlock victim,
 * which is also how Galera and Group Replication report a certification
 * failure at commit (a grant that lost to another node's write). */
static bool retryable(cerb_status st)
{
    return st != CERB_OK && last_errnum == ER_LOCK_DEADLOCK;
}

/* One statement on a slot the caller has taken, by `deadline` (0: one
 * operation timeout from now); a broken session is given back (ended) here
 * and *slot set to -1. */
static cerb_status run(cerb_engine *e, int *slot, enum my_stmt s, const struct my_val *v, int n,
                       int64_t deadline, struct my_res *res, bool *broken)
{
    unsigned en = 0;
    last_errnum = 0;
    if (deadline == 0) /* one operation timeout, from now: the slot is ours */
        deadline = cerb__deadline_in(e->mc->op_timeout_ms);
    atomic_fetch_add_explicit(&e->stats.round_trips, 1, memory_order_relaxed);
    cerb_status st = cerb__my_exec(cerb__my_stmt(e, *slot, s), v, n, deadline, res, broken, &en);
    last_errnum = en;
    if (*broken) {
        cerb__my_give(e, *slot, true, NULL, NULL);
        *slot = -1;
    }
    return st;
}

/* RELEASE_LOCK(lname) on a slot the caller has taken; a failure ends the
 * session (the only other way to be sure the GET_LOCK is gone). */
static void unlock_name(cerb_engine *e, int *slot, const char *lname)
{
    struct my_res res;
    bool broken = false;
    struct my_val v[1] = {v_str(lname)};
    cerb_status st = run(e, slot, MY_UNLOCK, v, 1, 0, &res,
                         &broken);
    cerb__my_res_free(&res);
    if (st != CERB_OK && *slot >= 0) {
        cerb__my_give(e, *slot, true, NULL, NULL);
        *slot = -1;
    }
}

/* Give a waiter's slot back without any GET_LOCK (it pins no hold, so all
 * of them can go); the session is ended instead when that fails. */
static void drop_waiter(cerb_engine *e, int slot)
{
    struct my_res res;
    bool broken = false;
    cerb_status st = run(e, &slot, MY_UNLOCK_ALL, NULL, 0, 0,
                         &res, &broken);
    cerb__my_res_free(&res);
    if (slot >= 0)
        cerb__my_give(e, slot, st != CERB_OK, NULL, NULL);
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

/* A claim refused because the failover record is not of the server this
 * session now talks to (a session that outlived a failover, moved by a
 * proxy or an address): run the check on it now (cerb__my_check_meta:
 * record this server, raise the base, start the quarantine). */
static void recheck_identity(cerb_engine *e, int *slot)
{
    bool broken = false;
    unsigned en = 0;
    cerb__mutex_lock(&e->mu);
    MYSQL_STMT *const *st = e->slots[*slot].st;
    cerb__mutex_unlock(&e->mu);
    cerb_status rs = cerb__my_check_meta(e, st, &broken, &en);
    if (broken) {
        cerb__my_give(e, *slot, true, NULL, NULL);
        *slot = -1;
    }
    if (rs != CERB_OK)
        CERB_LOG_D("mysql: the failover check failed: %s", cerb_last_error());
}

static cerb_status granted(cerb_engine *e, cerb_engine_lock *lk, int slot, uint64_t gen,
                           uint64_t fence, cerb_grant *grant)
{
    struct my_lock_priv *p = lk->priv;
    note_lease(e, lk->lease_ms);
    if (fence == 0) {
        /* The OK packet carries LAST_INSERT_ID(expr) (checked by the tests);
         * should a server not send it, read the fence: a grant is never
         * reported without one. */
        struct my_res res;
        bool broken = false;
        struct my_val v[2] = {v_bin(lk->name), v_str(lk->token)};
        cerb_status st = run(e, &slot, MY_CHECK, v, 2, 0, &res, &broken);
        if (st == CERB_OK && res.nrows == 1)
            fence = (uint64_t)col_i64(&res, 0, 0);
        cerb__my_res_free(&res);
        if (fence == 0) {
            if (slot >= 0) /* ends the session: its GET_LOCK with it */
                cerb__my_give(e, slot, true, NULL, NULL);
            grant->outcome = CERB_OUTCOME_UNKNOWN;
            return cerb__error_set(CERB_EPROTO, "mysql: a grant of \"%s\" came without its fence",
                                   lk->name);
        }
    }
    p->fence = fence;
    if (e->lease) {
        /* The row alone: no session is pinned. */
        p->slot = -1;
        p->row_only = true;
        cerb__my_give(e, slot, false, NULL, NULL);
    } else {
        p->slot = slot;
        p->gen = gen;
        cerb__my_give(e, slot, false, p->lname, NULL);
    }
    grant->fence = fence;
    grant->ttl_ms = lk->lease_ms;
    grant->outcome = CERB_OUTCOME_YES;
    return CERB_OK;
}

/* The values of MY_TRY (7) and MY_CLAIM (the first 6). */
static void grant_vals(const cerb_engine_lock *lk, const struct my_lock_priv *p,
                       struct my_val v[7])
{
    v[0] = v_u64(lk->fence_floor);
    v[1] = v_str(lk->token);
    v[2] = v_i64(lk->lease_ms * 1000);
    v[3] = v_str(p->lname);
    v[4] = v_bin(lk->name);
    v[5] = v_str(lk->token);
    v[6] = v_str(p->lname);
}

/* What MY_DIAG said. */
struct diag {
    bool exists;      /* the row is there */
    bool mine;        /* this session holds the GET_LOCK */
    int64_t left_ms;  /* another owner's lease left (0: none) */
    bool same;        /* the failover record is of this server (else: check) */
    int64_t q_left_ms;/* the failover quarantine left (0: none) */
};

/* How long a claim refused with d can wait before trying again. */
static int64_t diag_wait_ms(const struct diag *d)
{
    return d->left_ms > d->q_left_ms ? d->left_ms : d->q_left_ms;
}

static cerb_status diagnose(cerb_engine *e, int *slot, const cerb_engine_lock *lk,
                            const struct my_lock_priv *p, struct diag *d)
{
    struct my_res res;
    bool broken = false;
    struct my_val v[3] = {v_bin(lk->name), v_str(p->lname), v_bin(lk->name)};
    cerb_status st = run(e, slot, MY_DIAG, v, 3, 0, &res, &broken);
    if (st != CERB_OK)
        return st;
    d->exists = col_i64(&res, 0, 0) > 0;
    d->mine = col_i64(&res, 0, 1) == 1;
    int64_t us = col_null(&res, 0, 2) ? 0 : col_i64(&res, 0, 2);
    d->left_ms = us > 0 ? (us + 999) / 1000 : 0;
    d->same = col_i64(&res, 0, 3) == 1;
    us = col_null(&res, 0, 4) ? 0 : col_i64(&res, 0, 4);
    d->q_left_ms = us > 0 ? (us + 999) / 1000 : 0;
    cerb__my_res_free(&res);
    return CERB_OK;
}

static cerb_status insert_row(cerb_engine *e, int *slot, const cerb_engine_lock *lk,
                              const struct my_lock_priv *p)
{
    struct my_res res;
    bool broken = false;
    struct my_val v[2] = {v_bin(lk->name), v_str(p->lname)};
    cerb_status st = run(e, slot, MY_INSERT, v, 2, 0, &res, &broken);
    cerb__my_res_free(&res);
    return st;
}

/* MY_TRY on any slot that pins no hold of lname. CERB_OK granted; CERB_BUSY
 * not (*left_ms: another owner's lease left); else an error with
 * grant->outcome. */
static cerb_status try_once(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant,
                            int64_t *left_ms)
{
    struct my_lock_priv *p = lk->priv;
    struct my_val v[7];
    int slot;

    *left_ms = 0;
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = cerb__my_take_any(e, p->lname, false,
                                       cerb__deadline_in(e->mc->connect_timeout_ms), &slot);
    if (st != CERB_OK)
        return st;
    uint64_t gen = slot_gen(e, slot);
    grant_vals(lk, p, v);
    for (int pass = 0;; pass++) {
        struct my_res res;
        bool broken = false;
        struct diag d;
        grant->sent_ns = cerb_monotime();
        atomic_fetch_add_explicit(&e->stats.acquire_calls, 1, memory_order_relaxed);
        st = run(e, &slot, MY_TRY, v, 7, 0, &res, &broken);
        if (st != CERB_OK) {
            /* An SQL error undid the row; a GET_LOCK it may have taken
             * stays (they ignore rollback): give it back. */
            bool again = retryable(st);
            if (slot >= 0) {
                unlock_name(e, &slot, p->lname);
                if (slot >= 0)
                    cerb__my_give(e, slot, false, NULL, NULL);
            }
            grant->outcome = broken ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
            if (again && !broken) {
                *left_ms = 1; /* a deadlock victim: not granted, try again */
                return CERB_BUSY;
            }
            return st;
        }
        if (res.affected == 1)
            return granted(e, lk, slot, gen, res.insert_id, grant);
        /* Nothing matched: nothing of the row changed. */
        st = diagnose(e, &slot, lk, p, &d);
        if (st != CERB_OK) {
            if (slot >= 0) /* whether the GET_LOCK is ours is unknown: end it */
                cerb__my_give(e, slot, true, NULL, NULL);
            return st;
        }
        if (d.mine) {
            unlock_name(e, &slot, p->lname);
            if (slot < 0)
                return cerb__error_set(CERB_EIO, "mysql: cannot give back GET_LOCK");
        }
        if (!d.exists && pass == 0) {
            st = insert_row(e, &slot, lk, p);
            if (st != CERB_OK) {
                if (slot >= 0)
                    cerb__my_give(e, slot, false, NULL, NULL);
                return st;
            }
            continue;
        }
        if (!d.same && pass < 2) {
            /* The record is of another server: check, then try again. */
            recheck_identity(e, &slot);
            if (slot < 0)
                return cerb__error_set(CERB_EIO, "mysql: the failover check failed");
            continue;
        }
        cerb__my_give(e, slot, false, NULL, NULL);
        *left_ms = diag_wait_ms(&d);
        return CERB_BUSY;
    }
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
        return cerb__error_set(CERB_INTERRUPTED, "mysql: waiting for \"%s\" was interrupted",
                               lk->name);
    return cerb__error_set(CERB_TIMEOUT, "mysql: \"%s\" stayed held until the deadline", lk->name);
}

/* The session of a slot the caller has taken. */
static MYSQL *slot_my(cerb_engine *e, int slot)
{
    cerb__mutex_lock(&e->mu);
    MYSQL *my = e->slots[slot].my;
    cerb__mutex_unlock(&e->mu);
    return my;
}

/* A text statement (KILL: it takes no value) on a slot the caller has
 * taken; a broken session is given back (ended) and *slot set to -1. */
static cerb_status run_text(cerb_engine *e, int *slot, const char *sql, unsigned *en)
{
    struct my_res res;
    bool broken = false;
    atomic_fetch_add_explicit(&e->stats.round_trips, 1, memory_order_relaxed);
    cerb_status st = cerb__my_query(slot_my(e, *slot), sql, cerb__deadline_in(e->mc->op_timeout_ms),
                                    &res, &broken, en);
    cerb__my_res_free(&res);
    if (broken) {
        cerb__my_give(e, *slot, true, NULL, NULL);
        *slot = -1;
    }
    return st;
}

/* A spare slot for a statement beside a wait: one that pins no hold when
 * there is one (a statement that misses its deadline ends its session). */
static cerb_status take_spare(cerb_engine *e, int *slot)
{
    return cerb__my_take_any(e, NULL, true, cerb__deadline_in(e->mc->op_timeout_ms), slot);
}

/*
 * End the session of a hung holder of lk's name, from a spare session
 * while the waiter's own GET_LOCK waits. MY_EVICT finds it: the row's lease
 * ran out on the server's clock while that session kept the GET_LOCK
 * (IS_USED_LOCK), and none of that session's rows has a live lease. It is
 * paused, or stuck, with its connection up, and would keep every waiter out
 * for as long as that lasts. Its own deadline passed before its lease did,
 * so it already counts the lock as lost; its next renewal fails for good
 * once its session is gone (renewals run only on the session that holds).
 *
 * The check and the KILL are two statements: the holder may renew in
 * between, and is ended all the same. That never makes two holders: its
 * row then shows a live lease again, and whoever gets the GET_LOCK next
 * claims the row only once that lease has run out on the server (the
 * hand-off wait: MY_CLAIM matches no row with another owner's live lease),
 * by which time the holder's own deadline has passed. Without the
 * privilege (another user, no CONNECTION ADMIN or SUPER) it says so once
 * and the waiter keeps waiting.
 */
static void evict_hung(cerb_engine *e, cerb_engine_lock *lk)
{
    struct my_lock_priv *p = lk->priv;
    struct my_res res;
    bool broken = false;
    int slot;
    if (take_spare(e, &slot) != CERB_OK)
        return;
    struct my_val v[2] = {v_bin(lk->name), v_str(p->lname)};
    cerb_status st = run(e, &slot, MY_EVICT, v, 2, 0, &res, &broken);
    uint64_t victim = st == CERB_OK && !col_null(&res, 0, 0) ? (uint64_t)col_i64(&res, 0, 0) : 0;
    cerb__my_res_free(&res);
    if (victim && slot >= 0) {
        char sql[64];
        unsigned en = 0;
        snprintf(sql, sizeof sql, "KILL CONNECTION %" PRIu64, victim);
        st = run_text(e, &slot, sql, &en);
        if (st == CERB_OK) {
            atomic_fetch_add_explicit(&e->stats.evictions, 1, memory_order_relaxed);
            CERB_LOG_W("mysql: ended the session (connection %" PRIu64 ") of a hung holder of "
                       "\"%s\": its lease had run out while it kept the lock",
                       victim, lk->name);
        } else if ((en == ER_KILL_DENIED_ERROR || en == ER_SPECIFIC_ACCESS_DENIED_ERROR) &&
                   !atomic_exchange(&e->evict_refused, true)) {
            CERB_LOG_W("mysql: \"%s\" is held by a session whose lease ran out, which this "
                       "client cannot end (%s; it needs the same user, or CONNECTION ADMIN or "
                       "SUPER); it waits until that session ends",
                       lk->name, cerb_last_error());
        }
    }
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
}

/* KILL QUERY for the waiting session conn, from a spare one. */
static bool cancel_wait(cerb_engine *e, uint64_t conn)
{
    int slot;
    char sql[64];
    unsigned en = 0;
    if (conn == 0 || take_spare(e, &slot) != CERB_OK)
        return false;
    snprintf(sql, sizeof sql, "KILL QUERY %" PRIu64, conn);
    cerb_status st = run_text(e, &slot, sql, &en);
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    return st == CERB_OK;
}

/* What a waiter's tick looks at while its GET_LOCK waits on the server. */
struct waiting {
    cerb_engine *e;
    cerb_engine_lock *lk;
    const atomic_int *intr;
    uint64_t conn;       /* the waiting session's CONNECTION_ID() */
    bool cancel_sent;
    int64_t cancel_by;   /* after a cancel, give the statement up then */
    int64_t next_evict;
};

/*
 * Every MY_SLICE_MS of a wait. An interrupt cancels the waiting GET_LOCK
 * from a spare session (KILL QUERY: GET_LOCK returns NULL, the session
 * stays; the server keeps the waiter's place in its queue until then, so
 * waiters are served in the order they came); when the cancel cannot be
 * sent, or is not answered in time, the statement is given up. Once a
 * second, it looks for a hung holder to evict.
 */
static bool wait_tick(void *ud)
{
    struct waiting *w = ud;
    int64_t now = cerb_monotime();
    if (!w->cancel_sent && w->intr && atomic_load(w->intr)) {
        w->cancel_sent = true;
        w->cancel_by = now + w->e->mc->op_timeout_ms * CERB_NS_PER_MS;
        return cancel_wait(w->e, w->conn);
    }
    if (w->cancel_sent)
        return now < w->cancel_by;
    if (now >= w->next_evict) {
        w->next_evict = now + MY_EVICT_EVERY_MS * CERB_NS_PER_MS;
        evict_hung(w->e, w->lk);
    }
    return true;
}

/*
 * Whether a blocking acquire of lname queues at once (MY_WAIT, which
 * grants a free name too, then MY_CLAIM: two round trips) rather than
 * trying first (MY_TRY: one round trip for a free name, and a second
 * acquire call, the wait, for a held one). A name goes on the list when a
 * wait found it held, and off when a wait found it free, so contended
 * names cost one acquire call each and free ones one round trip. It only
 * picks a path: both are the whole protocol.
 */
/* lname's entry in the list, or -1; e->mu held. */
static int recent_at(const cerb_engine *e, const char *lname)
{
    for (int i = 0; i < MY_RECENT; i++)
        if (strcmp(e->recent[i], lname) == 0)
            return i;
    return -1;
}

static bool queue_first(cerb_engine *e, const char *lname)
{
    cerb__mutex_lock(&e->mu);
    bool yes = recent_at(e, lname) >= 0;
    cerb__mutex_unlock(&e->mu);
    return yes;
}

static void note_held(cerb_engine *e, const char *lname, bool held)
{
    cerb__mutex_lock(&e->mu);
    int at = recent_at(e, lname);
    if (held && at < 0) {
        at = e->recent_next;
        e->recent_next = (at + 1) % MY_RECENT;
        snprintf(e->recent[at], sizeof e->recent[at], "%s", lname);
    } else if (!held && at >= 0) {
        e->recent[at][0] = '\0';
    }
    cerb__mutex_unlock(&e->mu);
}

/*
 * Wait on slot w (pins no hold) until granted, the deadline or the flag.
 * The wait is one GET_LOCK for the whole deadline (at most MY_WAIT_MAX_MS
 * at a time), so the waiter keeps its place in the server's queue (the
 * server grants a released GET_LOCK to its waiters in the order they
 * came); the tick above watches the flag and evicts hung holders. The
 * same statement first gives back leftovers of this session (it pins no
 * hold): stacked GET_LOCKs would outlive a release.
 */
static cerb_status wait_on(cerb_engine *e, cerb_engine_lock *lk, int w, int64_t deadline_ns,
                           const atomic_int *intr, cerb_grant *grant)
{
    struct my_lock_priv *p = lk->priv;
    struct my_val v[7];
    struct my_res res;
    bool broken = false, have = false; /* have: the GET_LOCK is ours, the row not yet */
    uint64_t gen = slot_gen(e, w);
    uint64_t conn = slot_conn(e, w, gen);
    cerb_status st;
    grant_vals(lk, p, v);
    for (;;) {
        if ((intr && atomic_load(intr)) || cerb__ms_left(deadline_ns) <= 0) {
            drop_waiter(e, w);
            return stop_status(lk, intr, grant);
        }
        if (!have) {
            int64_t lt = cerb__ms_left(deadline_ns);
            if (lt > MY_WAIT_MAX_MS)
                lt = MY_WAIT_MAX_MS;
            if (lt < 1)
                lt = 1;
            struct my_val gv[5] = {v_str(p->lname), v_str(p->lname), v_dbl((double)lt / 1000.0),
                                   v_str(p->lname), v_dbl((double)lt / 1000.0)};
            struct waiting wt = {.e = e, .lk = lk, .intr = intr, .conn = conn,
                                 .next_evict = cerb_monotime() +
                                               MY_EVICT_EVERY_MS * CERB_NS_PER_MS};
            struct my_tick tick = {.every_ms = MY_SLICE_MS, .fn = wait_tick, .ud = &wt};
            unsigned en = 0;
            atomic_fetch_add_explicit(&e->stats.acquire_calls, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&e->stats.round_trips, 1, memory_order_relaxed);
            st = cerb__my_exec_tick(cerb__my_stmt(e, w, MY_WAIT), gv, 5,
                                    cerb__deadline_in(lt + e->mc->op_timeout_ms), &res, &broken,
                                    &en, &tick);
            if (wt.cancel_sent) {
                /* Interrupted. Whatever the GET_LOCK answered (NULL for the
                 * kill, or 1 for a grant that raced it), the session ends:
                 * a raced grant goes with it, and a KILL QUERY that arrives
                 * late cannot hit a later statement of this session. No
                 * claim was sent: no row is ours. */
                cerb__my_res_free(&res);
                cerb__my_give(e, w, true, NULL, NULL);
                return stop_status(lk, intr, grant);
            }
            if (broken) {
                /* No claim was sent: nothing was granted. A GET_LOCK the
                 * server may have given ends with the session. */
                cerb__my_give(e, w, true, NULL, NULL);
                grant->outcome = CERB_OUTCOME_NO;
                return st;
            }
            if (st != CERB_OK) {
                drop_waiter(e, w);
                grant->outcome = CERB_OUTCOME_NO;
                return st;
            }
            bool null = col_null(&res, 0, 0);
            int64_t got = col_i64(&res, 0, 0);
            cerb__my_res_free(&res);
            if (null) {
                /* An error, or a KILL QUERY not of ours. */
                drop_waiter(e, w);
                grant->outcome = CERB_OUTCOME_NO;
                return cerb__error_set(CERB_EIO, "mysql: GET_LOCK for \"%s\" failed (NULL)",
                                       lk->name);
            }
            note_held(e, p->lname, got >= 2);
            if (got != 1 && got != 3)
                continue; /* timed out: the deadline, or MY_WAIT_MAX_MS */
            have = true;
            if (got == 3)
                atomic_fetch_add_explicit(&e->stats.wakeups, 1, memory_order_relaxed);
        }
        grant->sent_ns = cerb_monotime();
        st = run(e, &w, MY_CLAIM, v, 6, 0, &res, &broken);
        if (st != CERB_OK && !broken && retryable(st)) {
            /* A deadlock victim (beside a failover check): not granted;
             * the GET_LOCK is still ours, try again soon. */
            if (!nap(1, deadline_ns, intr)) {
                drop_waiter(e, w);
                return stop_status(lk, intr, grant);
            }
            continue;
        }
        if (st != CERB_OK) {
            if (broken) {
                grant->outcome = CERB_OUTCOME_UNKNOWN;
                return st;
            }
            drop_waiter(e, w);
            grant->outcome = CERB_OUTCOME_NO;
            return st;
        }
        if (res.affected == 1)
            return granted(e, lk, w, gen, res.insert_id, grant);
        struct diag d;
        st = diagnose(e, &w, lk, p, &d);
        if (st == CERB_OK && !d.exists)
            st = insert_row(e, &w, lk, p);
        if (st != CERB_OK) {
            if (w >= 0)
                drop_waiter(e, w);
            grant->outcome = CERB_OUTCOME_NO;
            return st;
        }
        if (!d.exists)
            continue;
        if (!d.same) {
            /* The record is of another server: check, then claim again. */
            recheck_identity(e, &w);
            if (w < 0) {
                grant->outcome = CERB_OUTCOME_NO;
                return cerb__error_set(CERB_EIO, "mysql: the failover check failed");
            }
            if (!nap(10, deadline_ns, intr)) {
                drop_waiter(e, w);
                return stop_status(lk, intr, grant);
            }
            continue;
        }
        /* The GET_LOCK is ours, but the row shows another owner's live
         * lease (its session ended, or was evicted, while it may still
         * believe it holds), or the failover quarantine runs: wait it out,
         * asking the server each time. */
        int64_t wait_ms = diag_wait_ms(&d);
        if (!nap(wait_ms > 0 ? wait_ms : 1, deadline_ns, intr)) {
            drop_waiter(e, w);
            return stop_status(lk, intr, grant);
        }
    }
}

/*
 * Lease mode (mysql.mode = "lease"): the row alone, no GET_LOCK, nothing
 * pinned. A claim (MY_CLAIM) runs on any connection; while another
 * owner's lease (or the failover quarantine) runs, the caller polls, each
 * nap the shorter of a jittered backoff (up to MY_SLICE_MS) and what the
 * server says is left. On Galera and Group Replication a claim that lost
 * to another node's write fails certification at commit (ER_LOCK_DEADLOCK):
 * nothing was granted, and it is tried again.
 */
static cerb_status lease_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                 const atomic_int *intr, cerb_grant *grant)
{
    struct my_lock_priv *p = lk->priv;
    struct my_val v[7];
    grant_vals(lk, p, v);
    for (int attempt = 0;; attempt++) {
        int slot;
        struct my_res res;
        bool broken = false;
        struct diag d = {.exists = true, .same = true};
        grant->outcome = CERB_OUTCOME_NO;
        cerb_status st = cerb__my_take_any(e, NULL, true,
                                           cerb__deadline_in(e->mc->connect_timeout_ms), &slot);
        if (st != CERB_OK)
            return st;
        uint64_t gen = slot_gen(e, slot);
        bool granted_now = false, again = false;
        for (int pass = 0; pass < 3; pass++) {
            grant->sent_ns = cerb_monotime();
            atomic_fetch_add_explicit(&e->stats.acquire_calls, 1, memory_order_relaxed);
            st = run(e, &slot, MY_CLAIM, v, 6, 0, &res, &broken);
            if (st != CERB_OK) {
                again = !broken && retryable(st);
                if (!again) {
                    if (slot >= 0)
                        cerb__my_give(e, slot, false, NULL, NULL);
                    grant->outcome = broken ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
                    return st;
                }
                break;
            }
            if (res.affected == 1) {
                granted_now = true;
                break;
            }
            st = diagnose(e, &slot, lk, p, &d);
            if (st == CERB_OK && !d.exists)
                st = insert_row(e, &slot, lk, p);
            else if (st == CERB_OK && !d.same)
                recheck_identity(e, &slot);
            if (st != CERB_OK || slot < 0) {
                if (slot >= 0)
                    cerb__my_give(e, slot, false, NULL, NULL);
                return st != CERB_OK ? st
                                     : cerb__error_set(CERB_EIO, "mysql: the failover check "
                                                                 "failed");
            }
            if (d.exists && d.same)
                break;
        }
        if (granted_now)
            return granted(e, lk, slot, gen, res.insert_id, grant);
        cerb__my_give(e, slot, false, NULL, NULL);
        if (deadline_ns == 0)
            return cerb__error_set(CERB_BUSY, "mysql: \"%s\" is held", lk->name);
        int64_t ms = cerb__backoff_ms(attempt, 10, MY_SLICE_MS);
        int64_t left = again ? 1 : diag_wait_ms(&d);
        if (left > 0 && left < ms)
            ms = left;
        if (!nap(ms > 0 ? ms : 1, deadline_ns, intr))
            return stop_status(lk, intr, grant);
    }
}

cerb_status cerb__my_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant)
{
    struct my_lock_priv *p = lk->priv;
    int64_t left_ms;

    p->slot = -1;
    p->row_only = false;
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = cerb__my_lname(e->mc->key, lk->name, p->lname, sizeof p->lname);
    if (st != CERB_OK)
        return st;
    if (e->lease)
        return lease_acquire(e, lk, deadline_ns, interrupted, grant);
    if (deadline_ns != 0 && queue_first(e, p->lname)) {
        int w = cerb__my_take_waiter(e, cerb__deadline_in(e->mc->connect_timeout_ms), &st);
        if (w >= 0)
            return wait_on(e, lk, w, deadline_ns, interrupted, grant);
        if (st != CERB_OK) /* a connect failed: never a second connect timeout */
            return st;
    }
    for (int attempt = 0;; attempt++) {
        st = try_once(e, lk, grant, &left_ms);
        if (st != CERB_BUSY || deadline_ns == 0)
            return st == CERB_BUSY ? cerb__error_set(CERB_BUSY, "mysql: \"%s\" is held", lk->name)
                                   : st;
        if ((interrupted && atomic_load(interrupted)) || cerb__ms_left(deadline_ns) <= 0)
            return stop_status(lk, interrupted, grant);
        int w = cerb__my_take_waiter(e, cerb__deadline_in(e->mc->connect_timeout_ms), &st);
        if (w >= 0)
            return wait_on(e, lk, w, deadline_ns, interrupted, grant);
        if (st != CERB_OK) {
            grant->outcome = CERB_OUTCOME_NO;
            return st;
        }
        /* No connection to wait on: poll, jittered, at most a slice. */
        int64_t ms = cerb__backoff_ms(attempt, 10, MY_SLICE_MS);
        if (!nap(ms > 0 ? ms : 1, deadline_ns, interrupted))
            return stop_status(lk, interrupted, grant);
    }
}

cerb_status cerb__my_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    cerb_renew_item it = {.lk = lk};
    cerb__my_op_renew_batch(e, &it, 1);
    *grant = it.grant;
    if (it.st != CERB_OK)
        return cerb__error_set(it.st, "%s", cerb_last_error());
    return CERB_OK;
}

/* A hold lost its row: unlist it from its slot. */
static void unpin(cerb_engine *e, struct my_lock_priv *p)
{
    cerb__mutex_lock(&e->mu);
    struct my_slot *s = &e->slots[p->slot];
    if (s->gen == p->gen) {
        for (int k = 0; k < s->nl; k++) {
            if (strcmp(s->lnames[k], p->lname) == 0) {
                memmove(s->lnames[k], s->lnames[s->nl - 1], sizeof s->lnames[k]);
                s->nl--;
                break;
            }
        }
        if (s->holds > 0)
            s->holds--;
    }
    cerb__mutex_unlock(&e->mu);
    p->slot = -1;
}

/* Renew up to MY_RENEW_CHUNK items (indexes idx) pinned to slot s, gen,
 * all with the same lease, in one statement (two when some are gone); with
 * s < 0, items held by their rows alone (lease mode), on any connection.
 * True when the statement went out and the server did not answer it (the
 * session broke on it): not a busy slot, nor a session ended by a KILL,
 * which say nothing of the other slots. */
static bool renew_chunk(cerb_engine *e, cerb_renew_item *items, const size_t *idx, int cnt, int s,
                        uint64_t gen)
{
    struct my_val v[1 + 2 * MY_RENEW_CHUNK];
    struct my_res res = {0}, chk = {0};
    bool broken = false, checked = false;
    bool row = s < 0;
    int64_t opd = cerb__deadline_in(e->mc->op_timeout_ms);
    int64_t sent = cerb_monotime();
    int slot = s;
    cerb_status st = row ? cerb__my_take_any(e, NULL, true, opd, &slot)
                         : cerb__my_take_slot(e, s, gen, opd);
    bool taken = st == CERB_OK;
    if (st == CERB_OK) {
        sent = cerb_monotime();
        v[0] = v_i64(items[idx[0]].lk->lease_ms * 1000);
        for (int k = 0; k < MY_RENEW_CHUNK; k++) {
            v[1 + 2 * k] = k < cnt ? v_bin(items[idx[k]].lk->name) : v_null();
            v[2 + 2 * k] = k < cnt ? v_str(items[idx[k]].lk->token) : v_null();
        }
        st = run(e, &slot, row ? MY_RENEW_NL : MY_RENEW_N, v, 1 + 2 * MY_RENEW_CHUNK, 0, &res,
                 &broken);
        if (st == CERB_OK && res.affected != (uint64_t)cnt) {
            st = run(e, &slot, row ? MY_RENEW_CHKL : MY_RENEW_CHK, v + 1, 2 * MY_RENEW_CHUNK, 0,
                     &chk, &broken);
            checked = st == CERB_OK;
        }
    }
    for (int k = 0; k < cnt; k++) {
        cerb_renew_item *it = &items[idx[k]];
        struct my_lock_priv *p = it->lk->priv;
        it->grant.sent_ns = sent;
        if (st != CERB_OK) {
            it->st = st;
            if (st == CERB_NOT_OWNER && !row)
                p->slot = -1; /* the session is gone: so is the hold */
            continue;
        }
        bool ok = !checked;
        for (int r = 0; checked && r < chk.nrows && !ok; r++)
            ok = strcmp(chk.rows[r].v[0], it->lk->token) == 0;
        if (ok) {
            it->st = CERB_OK;
            it->grant.fence = p->fence;
            it->grant.ttl_ms = it->lk->lease_ms;
            continue;
        }
        it->st = cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" is no longer held by this token",
                                 it->lk->name);
        if (row) {
            p->row_only = false;
            continue;
        }
        /* Its GET_LOCK goes back while the slot is ours. */
        if (slot >= 0)
            unlock_name(e, &slot, p->lname);
        if (slot >= 0)
            unpin(e, p);
        else
            p->slot = -1;
    }
    if (st != CERB_OK && st != CERB_NOT_OWNER)
        CERB_LOG_D("mysql: renewal failed: %s", cerb_last_error());
    if (taken && slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    cerb__my_res_free(&res);
    cerb__my_res_free(&chk);
    return taken && broken && st != CERB_OK && st != CERB_NOT_OWNER &&
           cerb_monotime() - sent >= e->mc->op_timeout_ms * CERB_NS_PER_MS;
}

void cerb__my_op_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n)
{
    bool stack_done[64];
    bool *done = n <= 64 ? stack_done : cerb__calloc(n, sizeof *done);
    if (!done) {
        for (size_t i = 0; i < n; i++)
            items[i].st = CERB_ENOMEM;
        return;
    }
    memset(done, 0, n * sizeof *done);
    for (size_t i = 0; i < n; i++) {
        struct my_lock_priv *p = items[i].lk->priv;
        memset(&items[i].grant, 0, sizeof items[i].grant);
        if (e->lease)
            p->row_only = true; /* also a grant settled by check_owner */
        if (p->slot < 0 && !p->row_only) {
            done[i] = true;
            items[i].st = cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" has no session",
                                          items[i].lk->name);
        }
    }
    cerb_status dead = CERB_OK;
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        if (dead != CERB_OK) {
            /* A statement the server left unanswered for the request
             * timeout (a frozen server) fails the rest unsent: the whole
             * batch then costs about one request timeout, not one per 64
             * holds. */
            done[i] = true;
            items[i].st = dead;
            continue;
        }
        struct my_lock_priv *p = items[i].lk->priv;
        bool row = p->row_only;
        int s = row ? -1 : p->slot;
        uint64_t gen = row ? 0 : p->gen;
        int64_t lease = items[i].lk->lease_ms;
        size_t idx[MY_RENEW_CHUNK] = {0};
        int cnt = 0;
        for (size_t j = i; j < n && cnt < MY_RENEW_CHUNK; j++) {
            struct my_lock_priv *q = items[j].lk->priv;
            bool same = row ? q->row_only : (!q->row_only && q->slot == s && q->gen == gen);
            if (!done[j] && same && items[j].lk->lease_ms == lease) {
                idx[cnt++] = j;
                done[j] = true;
            }
        }
        if (renew_chunk(e, items, idx, cnt, s, gen))
            dead = items[idx[0]].st;
    }
    if (done != stack_done)
        cerb__free(done);
}

/* Free the row of a hold whose session is gone (so a waiter holding the
 * GET_LOCK need not wait out the lease), on any connection: only while it
 * still names that token and (owner_conn > 0) that session. Nobody holds
 * through such a row: the token is this hold's alone, and the hold is
 * being released, or its acquire never returned a grant. */
static void drop_row(cerb_engine *e, cerb_engine_lock *lk, uint64_t owner_conn)
{
    int slot;
    struct my_res res;
    bool broken = false;
    if (cerb__my_take_any(e, NULL, true, cerb__deadline_in(e->mc->connect_timeout_ms), &slot) !=
        CERB_OK)
        return;
    struct my_val v[4] = {v_bin(lk->name), v_str(lk->token), v_u64(owner_conn),
                          v_u64(owner_conn)};
    run(e, &slot, MY_DROP, v, 4, 0, &res, &broken);
    cerb__my_res_free(&res);
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
}

/* Lease mode: free the row of this token, on any connection. */
static cerb_status release_row(cerb_engine *e, cerb_engine_lock *lk)
{
    struct my_lock_priv *p = lk->priv;
    int slot;
    struct my_res res;
    bool broken = false;
    cerb_status st =
        cerb__my_take_any(e, NULL, true, cerb__deadline_in(e->mc->connect_timeout_ms), &slot);
    if (st != CERB_OK)
        return st; /* the row's lease ends by itself; a retry is harmless */
    struct my_val v[4] = {v_bin(lk->name), v_str(lk->token), v_u64(0), v_u64(0)};
    st = run(e, &slot, MY_DROP, v, 4, 0, &res, &broken);
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    if (st != CERB_OK)
        return st;
    bool freed = res.affected == 1;
    cerb__my_res_free(&res);
    p->row_only = false;
    return freed ? CERB_OK
                 : cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" was no longer ours", lk->name);
}

cerb_status cerb__my_op_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct my_lock_priv *p = lk->priv;
    struct my_res res;
    bool broken = false;
    if (p->row_only || e->lease)
        return release_row(e, lk);
    if (p->slot < 0) {
        /* Its session is gone (or its acquire's answer was lost with it):
         * a row still naming this token is freed, not left to its lease. */
        drop_row(e, lk, 0);
        return cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" is not held", lk->name);
    }
    int slot = p->slot;
    int64_t opd = cerb__deadline_in(e->mc->op_timeout_ms);
    uint64_t old_conn = slot_conn(e, slot, p->gen);
    cerb_status st = cerb__my_take_slot(e, slot, p->gen, opd);
    if (st == CERB_NOT_OWNER) {
        p->slot = -1;
        drop_row(e, lk, old_conn);
        return st;
    }
    if (st != CERB_OK)
        return st;
    struct my_val v[3] = {v_bin(lk->name), v_str(lk->token), v_str(p->lname)};
    st = run(e, &slot, MY_RELEASE, v, 3, 0, &res, &broken);
    p->slot = -1;
    if (broken)
        return st; /* the session ended: the server gave the GET_LOCK back */
    bool freed = st == CERB_OK && res.affected == 1;
    cerb__my_res_free(&res);
    if (!freed) {
        /* Not ours (or an error): RELEASE_LOCK was not reached; give the
         * GET_LOCK back (a second RELEASE_LOCK is harmless: the session
         * holds it once at most). */
        unlock_name(e, &slot, p->lname);
    }
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, p->lname);
    if (st != CERB_OK)
        return st;
    return freed ? CERB_OK
                 : cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" was no longer ours", lk->name);
}

cerb_status cerb__my_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct my_lock_priv *p = lk->priv;
    int slot;
    struct my_res res;
    bool broken = false;
    cerb_status st =
        cerb__my_take_any(e, NULL, true, cerb__deadline_in(e->mc->connect_timeout_ms), &slot);
    if (st != CERB_OK)
        return st;
    struct my_val v[2] = {v_bin(lk->name), v_str(lk->token)};
    grant->sent_ns = cerb_monotime();
    st = run(e, &slot, MY_CHECK, v, 2, 0, &res, &broken);
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    if (st != CERB_OK)
        return st;
    if (res.nrows != 1) {
        cerb__my_res_free(&res);
        return cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" is not held by this token", lk->name);
    }
    uint64_t fence = (uint64_t)col_i64(&res, 0, 0);
    uint64_t owner_conn = col_null(&res, 0, 1) ? 0 : (uint64_t)col_i64(&res, 0, 1);
    bool valid = col_i64(&res, 0, 2) == 1;
    cerb__my_res_free(&res);
    uint64_t mine = p->slot >= 0 ? slot_conn(e, p->slot, p->gen) : 0;
    if (valid && e->lease) {
        /* The row alone: the token is the hold. */
        p->row_only = true;
        p->fence = fence;
        grant->fence = fence;
        grant->ttl_ms = 0;
        return CERB_OK;
    }
    if (valid && owner_conn != 0 && mine == owner_conn) {
        grant->fence = fence;
        grant->ttl_ms = 0; /* the lease is not extended here */
        return CERB_OK;
    }
    if (valid)
        drop_row(e, lk, owner_conn); /* written by a session of ours that ended */
    return cerb__error_set(CERB_NOT_OWNER, "mysql: \"%s\" is not held by this token", lk->name);
}

cerb_status cerb__my_op_held(cerb_engine *e, const char *name)
{
    char lname[MY_LNAME_MAX * 4 + 1];
    cerb_status st = cerb__my_lname(e->mc->key, name, lname, sizeof lname);
    if (st != CERB_OK)
        return st;
    int slot;
    struct my_res res;
    bool broken = false;
    st = cerb__my_take_any(e, NULL, true, cerb__deadline_in(e->mc->connect_timeout_ms), &slot);
    if (st != CERB_OK)
        return st;
    struct my_val v[2] = {v_bin(name), v_str(lname)};
    st = run(e, &slot, MY_HELD, v, 2, 0, &res, &broken);
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    if (st != CERB_OK)
        return st;
    bool held = col_i64(&res, 0, 0) == 1;
    cerb__my_res_free(&res);
    return held ? cerb__error_set(CERB_BUSY, "mysql: \"%s\" is held", name) : CERB_OK;
}

cerb_status cerb__my_op_probe(cerb_engine *e, int64_t timeout_ms)
{
    int slot;
    struct my_res res;
    bool broken = false;
    int64_t dl = cerb__deadline_in(timeout_ms);
    cerb_status st = cerb__my_take_any(e, NULL, true, dl, &slot);
    if (st != CERB_OK)
        return st;
    struct my_val v[1] = {v_bin(e->probe_name)};
    st = run(e, &slot, MY_PROBE, v, 1, dl, &res, &broken);
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    if (st != CERB_OK)
        return st;
    bool ro = col_i64(&res, 0, 0) == 1;
    cerb__my_res_free(&res);
    return ro ? cerb__error_set(CERB_UNAVAILABLE, "mysql: the server is read-only (a replica?)")
              : CERB_OK;
}

/*
 * Who holds a name and who waits, each as the session (connection id) that
 * does, so that a waiter's owner string stays the same once it holds: the
 * row's holder while its lease lives (with its token and fence); a session
 * holding the GET_LOCK without that row — another library's GET_LOCK, or a
 * waiter that has it and waits out a dead holder's lease — as holder or
 * first waiter accordingly; then the sessions whose GET_LOCK is pending,
 * longest waiting first. The server grants a released GET_LOCK to its
 * pending sessions in the order they asked (MDL queues waiters at the
 * back), and a waiter asks in one statement for its whole wait, so the time
 * its statement has run (information_schema.PROCESSLIST.TIME_MS on MariaDB,
 * performance_schema.threads.PROCESSLIST_TIME, whole seconds, on MySQL)
 * orders them. performance_schema.metadata_locks lists the sessions; when
 * it cannot be read (no SELECT on performance_schema, or it is off), the
 * answer is the row's holder and IS_USED_LOCK's session only. GET_LOCK
 * names compare byte for byte on MariaDB, case-insensitively on MySQL.
 */
#define INSP_ROW                                                                          \
    "SELECT 0 AS kind, 0 AS waited, r.owner_conn AS conn, r.fence AS fence, "             \
    "CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), r.lease_until) / 1000) AS ttl, "   \
    "r.owner AS owner FROM @D.cerberus_lock r WHERE r.name = ? AND r.owner IS NOT NULL "  \
    "AND r.lease_until > UTC_TIMESTAMP(6)"
#define INSP_MDL(waited, join, cmp)                                                       \
    "SELECT x.kind, x.conn, x.fence, x.ttl, x.owner FROM (" INSP_ROW " UNION ALL "        \
    "SELECT CASE WHEN m.LOCK_STATUS = 'GRANTED' THEN 1 ELSE 2 END, " waited ", "          \
    "t.PROCESSLIST_ID, 0, -1, NULL FROM performance_schema.metadata_locks m JOIN "        \
    "performance_schema.threads t ON t.THREAD_ID = m.OWNER_THREAD_ID " join " "           \
    "WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND " cmp " AND m.LOCK_STATUS IN "           \
    "('GRANTED', 'PENDING')) x ORDER BY x.kind, x.waited DESC, x.conn"

static const char insp_mariadb[] =
    INSP_MDL("IFNULL(p.TIME_MS, 0)",
             "LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.PROCESSLIST_ID",
             "CAST(m.OBJECT_NAME AS BINARY) = CAST(? AS BINARY)");
static const char insp_mysql[] =
    INSP_MDL("IFNULL(t.PROCESSLIST_TIME, 0) * 1000", "", "m.OBJECT_NAME = ?");
static const char insp_plain[] =
    "SELECT x.kind, x.conn, x.fence, x.ttl, x.owner FROM (" INSP_ROW " UNION ALL "
    "SELECT 1, 0, IS_USED_LOCK(?), 0, -1, NULL FROM DUAL WHERE IS_USED_LOCK(?) IS NOT NULL) x "
    "ORDER BY x.kind";

static cerb_status inspect_run(cerb_engine *e, int *slot, const char *tpl, const char *name,
                               const char *lname, struct my_res *res, unsigned *en)
{
    bool broken = false;
    char *sql = cerb__my_splice(tpl, e->db_q);
    if (!sql)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    struct my_val v[3] = {v_bin(name), v_str(lname), v_str(lname)};
    atomic_fetch_add_explicit(&e->stats.round_trips, 1, memory_order_relaxed);
    cerb_status st = cerb__my_exec_once(slot_my(e, *slot), sql, v, tpl == insp_plain ? 3 : 2,
                                        cerb__deadline_in(e->mc->op_timeout_ms), res, &broken);
    cerb__free(sql);
    *en = 0;
    if (broken) {
        cerb__my_give(e, *slot, true, NULL, NULL);
        *slot = -1;
    } else if (st != CERB_OK) {
        *en = 1; /* an SQL error: the session is fine */
    }
    return st;
}

cerb_status cerb__my_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    char lname[MY_LNAME_MAX * 4 + 1];
    cerb_status st = cerb__my_lname(e->mc->key, name, lname, sizeof lname);
    if (st != CERB_OK)
        return st;
    int slot;
    struct my_res res;
    unsigned sql_err = 0;
    st = take_spare(e, &slot);
    if (st != CERB_OK)
        return st;
    st = inspect_run(e, &slot, e->mariadb ? insp_mariadb : insp_mysql, name, lname, &res,
                     &sql_err);
    if (st != CERB_OK && sql_err && slot >= 0) {
        CERB_LOG_D("mysql: performance_schema cannot be read (%s): inspecting the row and "
                   "IS_USED_LOCK only",
                   cerb_last_error());
        st = inspect_run(e, &slot, insp_plain, name, lname, &res, &sql_err);
    }
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
    if (st != CERB_OK)
        return st;
    uint64_t row_conn = 0;
    bool have_row = false;
    char who[48], detail[96];
    for (int r = 0; st == CERB_OK && r < res.nrows; r++) {
        int kind = (int)col_i64(&res, r, 0);
        uint64_t conn = (uint64_t)col_i64(&res, r, 1);
        snprintf(who, sizeof who, "connection %" PRIu64, conn);
        if (kind == 0) {
            row_conn = conn;
            have_row = true;
            snprintf(detail, sizeof detail, "owner %s", res.rows[r].v[4]);
            st = cerb__holders_add(out, who, strlen(who), 0, (uint64_t)col_i64(&res, r, 2),
                                   col_i64(&res, r, 3), detail);
        } else if (kind == 1) {
            if (have_row && conn == row_conn)
                continue; /* the row's holder, listed */
            if (have_row)
                snprintf(detail, sizeof detail,
                         "GET_LOCK, waiting out the lease of connection %" PRIu64, row_conn);
            else
                snprintf(detail, sizeof detail, "GET_LOCK, no row");
            st = cerb__holders_add(out, who, strlen(who), have_row, 0, -1, detail);
        } else {
            st = cerb__holders_add(out, who, strlen(who), 1, 0, -1, "waiting");
        }
    }
    cerb__my_res_free(&res);
    return st;
}
