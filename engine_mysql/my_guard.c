/*
 * my_guard.c — the mysql engine's idempotency-guard records (cerb_engine_ops
 * version 2, DESIGN.md §11).
 *
 * Layout. One row per record in <mysql.database>.cerberus_guard
 * (my_sql.c): id (the record id, 64 hex, the primary key), scope
 * (VARBINARY, byte for byte), token (the attempt that wrote it), state (1
 * running, 2 done), until (its expiry, UTC on the server's clock; NULL =
 * never, a success kept with keep_ms = -1) and result (LONGBLOB, done-records
 * only). Every time is UTC_TIMESTAMP(6), the server's, fixed for the whole
 * statement; never the client's clock. An expired row counts as absent
 * everywhere; it is taken over in place by the next begin, or swept.
 *
 * Each step is one prepared statement (prepared on a pooled session the
 * first time that session runs it, so a database without cerberus_guard
 * still takes locks), on a session that pins no hold when one is spare (a
 * statement that misses its deadline ends its session, and must not take
 * lock holds with it). Every value is bound; scope and result go as BLOB
 * (binary), and the result comes back whole (mysql_stmt_fetch_column).
 * Sessions run REPEATABLE READ with autocommit: each statement is its own
 * transaction. The writes below (INSERT … ON DUPLICATE KEY UPDATE, UPDATE
 * and DELETE by primary key) are locking reads: they judge the latest
 * committed row and lock it (a writer in flight is waited for, up to
 * innodb_lock_wait_timeout, set to the operation timeout), whatever
 * snapshot REPEATABLE READ would give a plain SELECT. Only the follow-up
 * SELECTs read a snapshot, taken when they start, after the write before
 * them committed.
 *
 * begin: INSERT … VALUES (running claim) ON DUPLICATE KEY UPDATE, each
 *   column set with IF(cond, new, old), cond = "the row has expired OR it
 *   is this token's running claim" (a re-sent begin: extended from now).
 *   The assignments run left to right and each sees the ones before, so
 *   they are ordered to keep cond's value: result and scope first (not in
 *   cond), then state (cond true stays true: expired, or ours with state
 *   1), token (ours already, or cond was true by expiry), until last. When
 *   cond is false the first assignment also calls LAST_INSERT_ID(1), which
 *   the OK packet carries (mysql_stmt_insert_id): insert id 1 means "a live
 *   record of another attempt, or a done-record, was there: nothing
 *   changed"; 0 means this statement inserted or took over the record (the
 *   table has no AUTO_INCREMENT, so nothing else sets it). The affected-rows
 *   count cannot tell: with CLIENT_FOUND_ROWS (set for the lock
 *   statements) an insert and an unchanged row both count 1. Only on the
 *   not-claimed path a SELECT follows (MYG_SEEN), which says why: an
 *   unexpired done-record is a DUPLICATE with its result; anything else is
 *   BUSY. The SELECT's snapshot is later than the INSERT, so it may show a
 *   row that changed in between (expired, deleted, taken over): BUSY then
 *   only makes the caller try again, and a done row it shows unexpired was
 *   done when it read it (a done row changes only once expired), so
 *   DUPLICATE is never wrong either.
 *   Two begins inserting the same missing id can deadlock in InnoDB (the
 *   duplicate-key check takes a shared next-key lock, then each wants the
 *   insert-intention lock the other blocks: symfony#57906). The server
 *   rolls the loser's statement back whole (error 1213): nothing of it
 *   stays, so it is sent again, at most GUARD_RETRIES times, and then
 *   reported with outcome NO.
 * renew: UPDATE … SET until WHERE id AND token AND state = 1 AND until >
 *   UTC_TIMESTAMP(6) (an expired claim is not renewed even when nobody took
 *   it over yet, as on redis, the reference).
 * finish(1): UPDATE … SET result = IF(state = 1, ?, result), until =
 *   IF(state = 1, expiry, until), state = 2 WHERE id AND token AND (this
 *   token's unexpired running claim OR its unexpired done-record): a
 *   re-sent finish whose first copy landed matches and changes nothing.
 *   CLIENT_FOUND_ROWS makes a matched row count 1 either way.
 * finish(0): DELETE WHERE id AND token AND state = 1 AND until >
 *   UTC_TIMESTAMP(6): OK when it deleted; otherwise a second DELETE removes
 *   this token's expired claim (nobody took it over, so the retry need not
 *   wait for the sweep) and the answer is CERB_NOT_OWNER.
 * check: the row's token match, state and liveness.
 * All of them find their row by primary key, and lock only it.
 *
 * Bounded state. Every GUARD_SWEEP_EVERY-th begin of this process (the
 * first included) is followed, on the same session, by a sweep: a SELECT
 * (a snapshot, no locks) of at most GUARD_SWEEP_BATCH ids whose until has
 * passed, oldest first (index cerberus_guard_until), then one DELETE of
 * those ids by primary key that re-checks until <= UTC_TIMESTAMP(6), so a
 * row taken over meanwhile is live again and stays. No range of the until
 * index is locked, so the sweep never blocks a begin that inserts; each
 * begin makes at most one row and a sweep removes up to twice as many as
 * the begins between two sweeps make. Its failure only delays the sweep.
 * Rows with until NULL (keep_ms = -1) are permanent, by request.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <mysqld_error.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "my_internal.h"

#define GUARD_SWEEP_EVERY 8
#define GUARD_SWEEP_BATCH 16
#define GUARD_RETRIES 3

static atomic_uint_fast64_t guard_begins;

#define NOW "UTC_TIMESTAMP(6)"
#define LATER NOW " + INTERVAL ? MICROSECOND"
#define TAKE "(until <= " NOW " OR (token = ? AND state = 1))"
#define IDS16 "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"

static const char *const gname[MYG_N] = {"guard begin",  "guard begin",  "guard renew",
                                         "guard finish", "guard delete", "guard delete",
                                         "guard check",  "guard sweep",  "guard sweep"};

static const char *const gtpl[MYG_N] = {
    /* id, scope, token, us; then token, scope, token, token, token, token, us */
    [MYG_BEGIN] = "INSERT INTO @D.cerberus_guard (id, scope, token, state, until) VALUES "
                  "(?, ?, ?, 1, " LATER ") ON DUPLICATE KEY UPDATE "
                  "result = IF(" TAKE ", NULL, IF(LAST_INSERT_ID(1), result, result)), "
                  "scope = IF(" TAKE ", ?, scope), state = IF(" TAKE ", 1, state), "
                  "token = IF(" TAKE ", ?, token), until = IF(" TAKE ", " LATER ", until)",
    /* id. Columns: state, unexpired, result (whole). */
    [MYG_SEEN] = "SELECT state, until IS NULL OR until > " NOW ", result FROM "
                 "@D.cerberus_guard WHERE id = ?",
    /* us, id, token */
    [MYG_RENEW] = "UPDATE @D.cerberus_guard SET until = " LATER " WHERE id = ? AND token = ? "
                  "AND state = 1 AND until > " NOW,
    /* result, keep (-1 = never), keep us, id, token */
    [MYG_DONE] = "UPDATE @D.cerberus_guard SET result = IF(state = 1, ?, result), "
                 "until = IF(state = 1, IF(? < 0, NULL, " LATER "), until), state = 2 "
                 "WHERE id = ? AND token = ? AND ((state = 1 AND until > " NOW ") OR "
                 "(state = 2 AND (until IS NULL OR until > " NOW ")))",
    /* id, token */
    [MYG_DELETE] = "DELETE FROM @D.cerberus_guard WHERE id = ? AND token = ? AND state = 1 "
                   "AND until > " NOW,
    [MYG_DROP] = "DELETE FROM @D.cerberus_guard WHERE id = ? AND token = ? AND state = 1",
    /* token, id */
    [MYG_CHECK] = "SELECT token = ?, state, until IS NULL OR until > " NOW " FROM "
                  "@D.cerberus_guard WHERE id = ?",
    /* batch */
    [MYG_SWEEP_LIST] = "SELECT id FROM @D.cerberus_guard WHERE until <= " NOW
                       " ORDER BY until LIMIT ?",
    [MYG_SWEEP] = "DELETE FROM @D.cerberus_guard WHERE id IN (" IDS16 ") AND until <= " NOW,
};

static struct my_val v_str(const char *s, size_t n)
{
    return (struct my_val){.t = MV_STR, .s = s, .len = (unsigned long)n};
}
static struct my_val v_bin(const void *s, size_t n)
{
    return (struct my_val){.t = MV_BIN, .s = s ? s : "", .len = (unsigned long)n};
}
static struct my_val v_i64(int64_t i) { return (struct my_val){.t = MV_I64, .i = i}; }
static struct my_val v_null(void) { return (struct my_val){.t = MV_NULL}; }

static int64_t col_i64(const struct my_res *r, int c)
{
    return r->nrows > 0 && !r->rows[0].null[c] ? strtoll(r->rows[0].v[c], NULL, 10) : 0;
}

/*
 * Guard statement g on the slot the caller has taken, bounded by its own
 * operation timeout from now. On an error *oc says whether it may have
 * run: UNKNOWN when the session broke (it is ended here and *slot set to
 * -1), NO for an SQL error (the statement's transaction is rolled back:
 * nothing of it stays); *en the server's error number. sent_ns, when given,
 * is taken just before sending. blob_col >= 0: that column of the first
 * row into *blob.
 */
static cerb_status run(cerb_engine *e, int *slot, enum my_gstmt g, const struct my_val *v, int n,
                       int64_t *sent_ns, struct my_res *res, cerb_outcome *oc, unsigned *en,
                       int blob_col, void **blob, size_t *blob_len)
{
    bool broken = false;
    cerb_status st;
    memset(res, 0, sizeof *res);
    *oc = CERB_OUTCOME_NO;
    MYSQL_STMT *ps = NULL;
    st = cerb__my_gstmt(e, *slot, g, gtpl[g], &ps, &broken, en);
    if (st == CERB_OK) {
        int64_t opd = cerb__deadline_in(e->mc->op_timeout_ms);
        if (sent_ns)
            *sent_ns = cerb_monotime();
        atomic_fetch_add_explicit(&e->stats.round_trips, 1, memory_order_relaxed);
        if (blob_col >= 0)
            st = cerb__my_exec_blob(ps, v, n, opd, res, &broken, en, blob_col, blob, blob_len);
        else
            st = cerb__my_exec(ps, v, n, opd, res, &broken, en);
        if (broken)
            *oc = CERB_OUTCOME_UNKNOWN;
    }
    if (broken) {
        cerb__my_give(e, *slot, true, NULL, NULL);
        *slot = -1;
    }
    if (st != CERB_OK && *en == ER_NO_SUCH_TABLE)
        return cerb__error_set(CERB_ECONFIG,
                               "mysql: the table %s.cerberus_guard is missing: run `cerberus "
                               "init` with this configuration (docs/engines.md shows its SQL)",
                               e->db_q);
    if (st != CERB_OK)
        cerb__error_prefix("%s", gname[g]);
    return st;
}

static cerb_status take(cerb_engine *e, int *slot)
{
    return cerb__my_take_any(e, NULL, true, cerb__deadline_in(e->mc->connect_timeout_ms), slot);
}

static void give(cerb_engine *e, int slot)
{
    if (slot >= 0)
        cerb__my_give(e, slot, false, NULL, NULL);
}

/* Delete a batch of expired records on the caller's slot (see the file
 * comment); a failure only delays it. */
static void sweep(cerb_engine *e, int *slot)
{
    struct my_res res, del;
    cerb_outcome oc;
    unsigned en = 0;
    struct my_val b[1] = {v_i64(GUARD_SWEEP_BATCH)};
    cerb_status st = run(e, slot, MYG_SWEEP_LIST, b, 1, NULL, &res, &oc, &en, -1, NULL, NULL);
    if (st == CERB_OK && res.nrows > 0 && *slot >= 0) {
        struct my_val ids[GUARD_SWEEP_BATCH];
        for (int i = 0; i < GUARD_SWEEP_BATCH; i++)
            ids[i] = i < res.nrows ? v_str(res.rows[i].v[0], strlen(res.rows[i].v[0])) : v_null();
        st = run(e, slot, MYG_SWEEP, ids, GUARD_SWEEP_BATCH, NULL, &del, &oc, &en, -1, NULL,
                 NULL);
        if (st == CERB_OK && del.affected > 0)
            CERB_LOG_D("mysql: swept %" PRIu64 " expired guard record(s)", del.affected);
        cerb__my_res_free(&del);
    }
    if (st != CERB_OK)
        CERB_LOG_D("mysql: guard sweep failed: %s", cerb_last_error());
    cerb__my_res_free(&res);
}

/* One begin; *retry when its answer is neither a claim, a duplicate nor
 * another attempt's live claim (the row changed between the INSERT and
 * the read that explains it: a done-record that just expired, a claim
 * deleted), so BUSY would be a guess. */
static cerb_status begin_once(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant,
                              void **result, size_t *result_len, bool *retry)
{
    int slot;
    struct my_res res;
    unsigned en = 0;
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    size_t sl = strlen(rec->scope);
    int64_t us = rec->running_ms * 1000;
    struct my_val id = v_str(rec->id, 64), scope = v_bin(rec->scope, sl),
                  tok = v_str(rec->token, 32), ms = v_i64(us);
    /* VALUES (id, scope, token, claim), then TAKE's token in each of the
     * five assignments, with the new scope, token and claim after theirs. */
    struct my_val vv[12] = {id, scope, tok, ms, tok, tok, scope, tok, tok, tok, tok, ms};
    for (int attempt = 0;; attempt++) {
        st = run(e, &slot, MYG_BEGIN, vv, 12, &grant->sent_ns, &res, &grant->outcome, &en, -1,
                 NULL, NULL);
        if (st == CERB_OK || en != ER_LOCK_DEADLOCK || slot < 0 || attempt + 1 >= GUARD_RETRIES)
            break;
        /* A deadlock rolled the statement back whole: send it again. */
        CERB_LOG_D("mysql: guard begin deadlocked, retrying");
        cerb__nap_ms(cerb__backoff_ms(attempt, 5, 50));
    }
    if (st != CERB_OK) {
        give(e, slot);
        return st;
    }
    bool claimed = res.insert_id == 0;
    cerb__my_res_free(&res);
    if (claimed && slot >= 0 &&
        atomic_fetch_add_explicit(&guard_begins, 1, memory_order_relaxed) % GUARD_SWEEP_EVERY == 0)
        sweep(e, &slot);
    if (claimed) {
        give(e, slot);
        grant->ttl_ms = rec->running_ms;
        return CERB_OK;
    }
    /* Not claimed: why (a snapshot taken after the INSERT). */
    void *blob = NULL;
    size_t blen = 0;
    cerb_outcome oc;
    struct my_val s[1] = {v_str(rec->id, 64)};
    st = slot >= 0 ? run(e, &slot, MYG_SEEN, s, 1, NULL, &res, &oc, &en, 2, &blob, &blen)
                   : cerb__error_set(CERB_EIO, "mysql: guard begin: the session ended");
    give(e, slot);
    if (st != CERB_OK)
        return st; /* outcome NO: the INSERT changed nothing */
    bool done = res.nrows == 1 && col_i64(&res, 0) == 2 && col_i64(&res, 1) == 1;
    bool running = res.nrows == 1 && col_i64(&res, 0) == 1 && col_i64(&res, 1) == 1;
    cerb__my_res_free(&res);
    *retry = !done && !running;
    if (done) {
        if (!blob) {
            blob = cerb__malloc(1);
            if (!blob)
                return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
            ((char *)blob)[0] = '\0';
            blen = 0;
        }
        *result = blob;
        *result_len = blen;
        return CERB_DUPLICATE;
    }
    cerb__free(blob);
    return cerb__error_set(CERB_BUSY, "mysql: guard record %s is claimed by another attempt",
                           rec->id);
}

cerb_status cerb__my_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant,
                                 void **result, size_t *result_len)
{
    for (int attempt = 0;; attempt++) {
        bool retry = false;
        cerb_status st = begin_once(e, rec, grant, result, result_len, &retry);
        if (st != CERB_BUSY || !retry || attempt >= 2)
            return st;
    }
}

cerb_status cerb__my_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant)
{
    int slot;
    struct my_res res;
    unsigned en = 0;
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    struct my_val v[3] = {v_i64(rec->running_ms * 1000), v_str(rec->id, 64),
                          v_str(rec->token, 32)};
    st = run(e, &slot, MYG_RENEW, v, 3, &grant->sent_ns, &res, &grant->outcome, &en, -1, NULL,
             NULL);
    give(e, slot);
    if (st != CERB_OK)
        return st;
    bool ok = res.affected == 1;
    cerb__my_res_free(&res);
    if (!ok)
        return cerb__error_set(CERB_NOT_OWNER,
                               "mysql: guard record %s is no longer this attempt's claim",
                               rec->id);
    grant->ttl_ms = rec->running_ms;
    return CERB_OK;
}

cerb_status cerb__my_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int succeeded,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *outcome)
{
    int slot;
    struct my_res res;
    unsigned en = 0;
    *outcome = CERB_OUTCOME_NO;
    if (len > 0xffffffffu) /* LONGBLOB's limit; the core's max_result is far below */
        return cerb__error_set(CERB_EINVAL, "mysql: a guard result of %zu bytes is too large",
                               len);
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    bool ok;
    if (succeeded) {
        int64_t keep = keep_ms < 0 ? -1 : keep_ms;
        struct my_val v[5] = {v_bin(result, len), v_i64(keep), v_i64(keep < 0 ? 0 : keep * 1000),
                              v_str(rec->id, 64), v_str(rec->token, 32)};
        st = run(e, &slot, MYG_DONE, v, 5, NULL, &res, outcome, &en, -1, NULL, NULL);
        ok = st == CERB_OK && res.affected == 1;
    } else {
        struct my_val v[2] = {v_str(rec->id, 64), v_str(rec->token, 32)};
        st = run(e, &slot, MYG_DELETE, v, 2, NULL, &res, outcome, &en, -1, NULL, NULL);
        ok = st == CERB_OK && res.affected == 1;
        if (st == CERB_OK && !ok && slot >= 0) {
            /* This token's expired claim, if it is there: nobody took it
             * over, so it goes now. The answer stays NOT_OWNER. */
            cerb_outcome oc2;
            cerb__my_res_free(&res);
            if (run(e, &slot, MYG_DROP, v, 2, NULL, &res, &oc2, &en, -1, NULL, NULL) != CERB_OK)
                CERB_LOG_D("mysql: guard delete of an expired claim failed: %s",
                           cerb_last_error());
        }
    }
    give(e, slot);
    cerb__my_res_free(&res);
    if (st != CERB_OK)
        return st;
    if (!ok)
        return cerb__error_set(CERB_NOT_OWNER,
                               "mysql: guard record %s is not this attempt's claim", rec->id);
    return CERB_OK;
}

cerb_status cerb__my_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                 cerb_guard_found *found)
{
    int slot;
    struct my_res res;
    unsigned en = 0;
    cerb_outcome oc;
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    struct my_val v[2] = {v_str(rec->token, 32), v_str(rec->id, 64)};
    st = run(e, &slot, MYG_CHECK, v, 2, NULL, &res, &oc, &en, -1, NULL, NULL);
    give(e, slot);
    if (st != CERB_OK)
        return st;
    if (res.nrows == 1 && col_i64(&res, 2) == 1) {
        int64_t state = col_i64(&res, 1);
        if (col_i64(&res, 0) != 1)
            *found = CERB_GUARD_FOUND_OTHER;
        else if (state == 1)
            *found = CERB_GUARD_FOUND_RUNNING;
        else if (state == 2)
            *found = CERB_GUARD_FOUND_DONE;
        else
            *found = CERB_GUARD_FOUND_OTHER; /* a state this version does not write */
    }
    cerb__my_res_free(&res);
    return CERB_OK;
}
