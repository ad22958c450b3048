/*
 * pg_guard.c — the pg engine's idempotency-guard records (cerb_engine_ops
 * version 2, DESIGN.md §11).
 *
 * Layout. One row per record in <pg.schema>.cerberus_guard (pg_store.c):
 * id (the record id, 64 hex), scope (bytea, byte for byte), token (the
 * attempt that wrote it), state (1 running, 2 done), until (its expiry on
 * the server's clock; NULL = never, a success kept with keep_ms = -1) and
 * result (bytea, done-records only). Every time is clock_timestamp() — the
 * server's time when the expression runs, never the transaction's start
 * (now()) and never the client's clock. An expired row counts as absent
 * everywhere; it is taken over in place by the next begin, or swept.
 *
 * Each step is one statement, sent with PQsendQueryParams (not prepared:
 * the guard is not on the lock path), on a pooled connection that pins no
 * hold when one is spare (a statement that misses its deadline ends its
 * session, and must not take lock holds with it). Every value is a bound
 * parameter; the scope and the result go binary (format 1, with their
 * length), so any byte is just a byte. The schema, the only name spliced
 * in, is quoted (e->schema_q).
 *
 * begin, under READ COMMITTED:
 *   ins   INSERT … ON CONFLICT (id) DO UPDATE … WHERE the row has expired
 *         OR it is this token's running claim (a re-sent begin: extended
 *         from now) RETURNING 1. ON CONFLICT judges the latest committed
 *         row (it waits for a writer in flight and locks the row), so a
 *         row comes back only when this statement really claimed it: OK
 *         is never answered for a claim that is not ours.
 *   o     the row as the statement's snapshot shows it (the CTE's own
 *         change is not visible there). When ins claimed nothing, o says
 *         why: an unexpired done-record is a DUPLICATE with its result; an
 *         unexpired claim of another attempt is BUSY. The snapshot can be
 *         older than the row ON CONFLICT judged (a writer committed between
 *         the two), so o may show a row that the statement should have
 *         been able to claim — none, an expired one, ours running: that
 *         answer is BUSY, which only makes the caller try again. A done
 *         row the snapshot shows unexpired was done at the moment o was
 *         read (a done row changes only after it expires: finish writes it
 *         once, takeover and sweep need it expired), so DUPLICATE is never
 *         a wrong answer either.
 * renew: UPDATE … SET until WHERE id, token, state = 1 AND until >
 *   clock_timestamp(). An expired claim is not renewed even when nobody
 *   has taken it over yet: on redis, the reference, its key is gone by
 *   then, and any begin may take it from that moment on; renewing it would
 *   make CERB_LOST depend on whether a begin or the sweep got there first.
 *   The core renews well within running_ms, so this only ends attempts
 *   that already ran past their claim (paused, starved).
 * finish(1): UPDATE … SET state = 2, result, until = now + keep_ms (NULL
 *   for -1) WHERE this token's unexpired running claim, plus whether the
 *   snapshot already shows this token's unexpired done-record (a re-sent
 *   finish whose first copy landed): OK for either, CERB_NOT_OWNER else.
 * finish(0): DELETE … WHERE this token's running claim RETURNING whether
 *   it was unexpired: OK when it was, CERB_NOT_OWNER when nothing of ours
 *   was there or it had expired (it is deleted anyway: it is ours and
 *   nobody took it over, so the retry need not wait for the sweep).
 * check: the row's token match, state and liveness.
 *
 * Bounded state. Every GUARD_SWEEP_EVERY-th begin of this process (the
 * first one included, so a short-lived process such as `cerberus once`
 * sweeps too) is followed, on the same connection, by a statement of its
 * own that deletes at most GUARD_SWEEP_BATCH expired rows, oldest first:
 *   DELETE … WHERE until <= clock_timestamp() AND id IN (SELECT id …
 *   WHERE until <= (SELECT clock_timestamp()) ORDER BY until LIMIT n
 *   FOR UPDATE SKIP LOCKED)
 * Each begin makes at most one row, and a sweep removes up to four times
 * as many as the begins between two sweeps make, so expired rows cannot
 * pile up. The sweep runs in a transaction of its own, never waits for a
 * row lock (SKIP LOCKED) and re-checks expiry on the row it deletes (a row
 * taken over meanwhile is live again and stays), so it never deadlocks
 * with a begin nor deletes a live record. The index cerberus_guard_until
 * (cerberus init) makes it an index range scan; the scalar sub-select
 * lets the volatile clock be an index bound. Its failure only delays the
 * sweep. Rows with until NULL (keep_ms = -1) are permanent, by request.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "pg_internal.h"

#define GUARD_SWEEP_EVERY 32
#define GUARD_SWEEP_BATCH 128

static atomic_uint_fast64_t guard_begins;

enum gstmt { G_BEGIN, G_RENEW, G_DONE, G_DELETE, G_CHECK, G_SWEEP };

static const char *const gstmt_name[] = {"guard begin",  "guard renew", "guard finish",
                                         "guard delete", "guard check", "guard sweep"};

#define MS(p) "clock_timestamp() + " p "::bigint * interval '1 millisecond'"

static const char *const gtemplates[] = {
    /* $1 id, $2 scope (binary), $3 token, $4 running_ms. Columns: claimed
     * (0/1), then the snapshot's row: state, token is ours, unexpired, and
     * a done-record's result (hex) when nothing was claimed. */
    [G_BEGIN] =
        "WITH ins AS (INSERT INTO @S.cerberus_guard AS g (id, scope, token, state, until) "
        "VALUES ($1::text, $2::bytea, $3::text, 1, " MS("$4") ") "
        "ON CONFLICT (id) DO UPDATE SET scope = EXCLUDED.scope, token = EXCLUDED.token, "
        "state = 1, until = " MS("$4") ", result = NULL "
        "WHERE g.until <= clock_timestamp() OR (g.token = EXCLUDED.token AND g.state = 1) "
        "RETURNING 1) "
        "SELECT c.n, o.state, o.ours, o.live, "
        "CASE WHEN c.n = 0 AND o.state = 2 AND o.live THEN encode(o.result, 'hex') END "
        "FROM (SELECT count(*) AS n FROM ins) c LEFT JOIN (SELECT state, token = $3::text AS ours, "
        "(until IS NULL OR until > clock_timestamp()) AS live, result FROM @S.cerberus_guard "
        "WHERE id = $1::text) o ON true",
    /* $1 id, $2 token, $3 running_ms. */
    [G_RENEW] = "UPDATE @S.cerberus_guard SET until = " MS("$3") " WHERE id = $1::text AND "
                "token = $2::text AND state = 1 AND until > clock_timestamp() RETURNING 1",
    /* $1 id, $2 token, $3 result (binary), $4 keep_ms (-1 = never). Columns:
     * made done now (0/1), already our unexpired done-record. */
    [G_DONE] = "WITH f AS (UPDATE @S.cerberus_guard SET state = 2, result = $3::bytea, "
               "until = CASE WHEN $4::bigint < 0 THEN NULL ELSE " MS("$4") " END "
               "WHERE id = $1::text AND token = $2::text AND state = 1 AND "
               "until > clock_timestamp() RETURNING 1) "
               "SELECT (SELECT count(*) FROM f), EXISTS (SELECT 1 FROM @S.cerberus_guard "
               "WHERE id = $1::text AND token = $2::text AND state = 2 AND "
               "(until IS NULL OR until > clock_timestamp()))",
    /* $1 id, $2 token. One row (was it unexpired) when deleted. */
    [G_DELETE] = "DELETE FROM @S.cerberus_guard WHERE id = $1::text AND token = $2::text AND "
                 "state = 1 RETURNING until > clock_timestamp()",
    /* $1 id, $2 token. */
    [G_CHECK] = "SELECT token = $2::text, state, until IS NULL OR until > clock_timestamp() "
                "FROM @S.cerberus_guard WHERE id = $1::text",
    /* $1 batch. */
    [G_SWEEP] = "DELETE FROM @S.cerberus_guard d WHERE d.until <= clock_timestamp() AND d.id IN "
                "(SELECT s.id FROM @S.cerberus_guard s WHERE s.until <= (SELECT clock_timestamp()) "
                "ORDER BY s.until LIMIT $1::int FOR UPDATE SKIP LOCKED)",
};

/* The statement text with the quoted schema spliced in for "@S",
 * cerb__malloc'd (NULL: out of memory). */
static char *gsql(const cerb_engine *e, enum gstmt s)
{
    const char *tpl = gtemplates[s];
    size_t n = 0, ql = strlen(e->schema_q);
    for (const char *p = tpl; *p; p++)
        n += (p[0] == '@' && p[1] == 'S') ? (p++, ql) : 1;
    char *out = cerb__malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tpl; *p; p++) {
        if (p[0] == '@' && p[1] == 'S') {
            memcpy(o, e->schema_q, ql);
            o += ql;
            p++;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

static PGconn *conn_of(cerb_engine *e, int slot)
{
    cerb__mutex_lock(&e->mu);
    PGconn *pg = e->slots[slot].pg;
    cerb__mutex_unlock(&e->mu);
    return pg;
}

/*
 * Statement s on the slot the caller has taken, bounded by its own
 * operation timeout from now. On an error *oc says whether it may have
 * run: UNKNOWN when the session broke (it is ended here and *slot set to
 * -1), NO for an SQL error (nothing of the statement stays). sent_ns, when
 * given, is taken just before sending.
 */
static cerb_status run(cerb_engine *e, int *slot, enum gstmt s, int n, const char *const *v,
                       const int *l, const int *f, int64_t *sent_ns, PGresult **res,
                       cerb_outcome *oc)
{
    char ss[6];
    bool broken = false;
    *res = NULL;
    *oc = CERB_OUTCOME_NO;
    char *sql = gsql(e, s);
    if (!sql)
        return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    int64_t opd = cerb__deadline_in(e->pc->op_timeout_ms);
    cerb_status st = CERB_OK;
    PGconn *pg = conn_of(e, *slot);
    /* Prepared once per session (parse and plan cost more than the
     * statement), the first time the session runs it: a schema without
     * the guard's table still takes locks. Behind a transaction pooler
     * (lease mode) the text goes each time. */
    bool prep = e->pc->mode != CERB_SQL_LEASE;
    char name[16];
    snprintf(name, sizeof name, "cerb_g%d", (int)s);
    unsigned *done = cerb__pg_slot_gprepared(e, *slot);
    if (prep && !(*done & (1u << s))) {
        size_t len = strlen(sql) + 32;
        char *ps = cerb__malloc(len);
        if (!ps) {
            cerb__free(sql);
            return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
        }
        snprintf(ps, len, "PREPARE %s AS %s", name, sql);
        st = cerb__pg_exec(pg, -1, ps, 0, NULL, NULL, NULL, opd, res, &broken, ss);
        cerb__free(ps);
        PQclear(*res);
        *res = NULL;
        if (st == CERB_OK)
            *done |= 1u << s;
    }
    if (sent_ns)
        *sent_ns = cerb_monotime();
    if (st == CERB_OK && !broken)
        st = prep ? cerb__pg_exec_prepared(pg, name, n, v, l, f, opd, res, &broken, ss)
                  : cerb__pg_exec(pg, -1, sql, n, v, l, f, opd, res, &broken, ss);
    cerb__free(sql);
    if (broken) {
        *oc = CERB_OUTCOME_UNKNOWN;
        cerb__pg_give(e, *slot, true, 0);
        *slot = -1;
    }
    if (st != CERB_OK && strcmp(ss, "42P01") == 0)
        return cerb__error_set(CERB_ECONFIG,
                               "pg: the table %s.cerberus_guard is missing: run `cerberus init` "
                               "with this configuration (docs/engines.md shows its SQL)",
                               e->schema_q);
    if (st != CERB_OK)
        cerb__error_prefix("%s", gstmt_name[s]);
    return st;
}

/* Take a spare slot (one that pins no hold, when it can) for a guard
 * statement; the statement's own deadline starts after. */
static cerb_status take(cerb_engine *e, int *slot)
{
    return cerb__pg_take_any(e, cerb__deadline_in(e->pc->op_timeout_ms), true, slot);
}

static void give(cerb_engine *e, int slot)
{
    if (slot >= 0)
        cerb__pg_give(e, slot, false, 0);
}

static bool is_null(const PGresult *r, int c) { return PQntuples(r) < 1 || PQgetisnull(r, 0, c); }
static bool is_true(const PGresult *r, int c) { return !is_null(r, c) && PQgetvalue(r, 0, c)[0] == 't'; }
static int64_t as_i64(const PGresult *r, int c)
{
    return is_null(r, c) ? 0 : strtoll(PQgetvalue(r, 0, c), NULL, 10);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A done-record's result from encode(result, 'hex'): cerb__malloc'd, NUL
 * after the bytes. */
static cerb_status unhex(const char *h, size_t hl, void **out, size_t *len)
{
    if (hl % 2)
        return cerb__error_set(CERB_EPROTO, "pg: guard begin: malformed result");
    unsigned char *b = cerb__malloc(hl / 2 + 1);
    if (!b)
        return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    for (size_t i = 0; i < hl / 2; i++) {
        int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            cerb__free(b);
            return cerb__error_set(CERB_EPROTO, "pg: guard begin: malformed result");
        }
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    b[hl / 2] = '\0';
    *out = b;
    *len = hl / 2;
    return CERB_OK;
}

/* Delete a batch of expired records on the caller's slot (see the file
 * comment); a failure only delays it. */
static void sweep(cerb_engine *e, int *slot)
{
    char batch[16];
    snprintf(batch, sizeof batch, "%d", GUARD_SWEEP_BATCH);
    const char *v[1] = {batch};
    PGresult *res = NULL;
    cerb_outcome oc;
    cerb_status st = run(e, slot, G_SWEEP, 1, v, NULL, NULL, NULL, &res, &oc);
    if (st == CERB_OK) {
        const char *n = PQcmdTuples(res);
        if (n[0] && strcmp(n, "0") != 0)
            CERB_LOG_D("pg: swept %s expired guard record(s)", n);
    } else {
        CERB_LOG_D("pg: guard sweep failed: %s", cerb_last_error());
    }
    PQclear(res);
}

cerb_status cerb__pg_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant,
                                 void **result, size_t *result_len)
{
    /* Up to three looks: an answer whose snapshot shows a claimable row
     * (expired, gone, or this attempt's own) means the row changed under
     * the statement (a done-record expiring between the ON CONFLICT's
     * judgement and the read): neither BUSY nor DUPLICATE is known then,
     * so the begin is sent again. */
    for (int attempt = 0;; attempt++) {
        int slot;
        PGresult *res = NULL;
        char ms[24];
        grant->outcome = CERB_OUTCOME_NO;
        cerb_status st = take(e, &slot);
        if (st != CERB_OK)
            return st;
        snprintf(ms, sizeof ms, "%" PRId64, rec->running_ms);
        const char *v[4] = {rec->id, rec->scope, rec->token, ms};
        int l[4] = {0, (int)strlen(rec->scope), 0, 0}, f[4] = {0, 1, 0, 0};
        st = run(e, &slot, G_BEGIN, 4, v, l, f, &grant->sent_ns, &res, &grant->outcome);
        if (st == CERB_OK &&
            atomic_fetch_add_explicit(&guard_begins, 1, memory_order_relaxed) %
                    GUARD_SWEEP_EVERY ==
                0 &&
            slot >= 0)
            sweep(e, &slot);
        give(e, slot);
        if (st != CERB_OK)
            return st;
        if (PQntuples(res) != 1 || PQnfields(res) != 5) {
            PQclear(res);
            return cerb__error_set(CERB_EPROTO, "pg: guard begin: unexpected answer");
        }
        if (as_i64(res, 0) > 0) {
            PQclear(res);
            grant->ttl_ms = rec->running_ms; /* claimed: by this statement */
            return CERB_OK;
        }
        int64_t state = is_null(res, 1) ? 0 : as_i64(res, 1);
        bool ours = is_true(res, 2), live = is_true(res, 3);
        if (state == 2 && live) {
            const char *h = is_null(res, 4) ? "" : PQgetvalue(res, 0, 4);
            size_t hl = is_null(res, 4) ? 0 : (size_t)PQgetlength(res, 0, 4);
            st = unhex(h, hl, result, result_len);
            PQclear(res);
            return st == CERB_OK ? CERB_DUPLICATE : st;
        }
        PQclear(res);
        if ((state == 1 && live && !ours) || attempt >= 2)
            return cerb__error_set(CERB_BUSY,
                                   "pg: guard record %s is claimed by another attempt", rec->id);
    }
}

cerb_status cerb__pg_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant)
{
    int slot;
    PGresult *res = NULL;
    char ms[24];
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    snprintf(ms, sizeof ms, "%" PRId64, rec->running_ms);
    const char *v[3] = {rec->id, rec->token, ms};
    st = run(e, &slot, G_RENEW, 3, v, NULL, NULL, &grant->sent_ns, &res, &grant->outcome);
    give(e, slot);
    if (st != CERB_OK)
        return st;
    bool ok = PQntuples(res) == 1;
    PQclear(res);
    if (!ok)
        return cerb__error_set(CERB_NOT_OWNER,
                               "pg: guard record %s is no longer this attempt's claim", rec->id);
    grant->ttl_ms = rec->running_ms;
    return CERB_OK;
}

cerb_status cerb__pg_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int succeeded,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *outcome)
{
    int slot;
    PGresult *res = NULL;
    char keep[24];
    *outcome = CERB_OUTCOME_NO;
    if (len > 0x3fffffff) /* bytea's limit; the core's max_result is far below */
        return cerb__error_set(CERB_EINVAL, "pg: a guard result of %zu bytes is too large", len);
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    bool ok;
    if (succeeded) {
        snprintf(keep, sizeof keep, "%" PRId64, keep_ms < 0 ? (int64_t)-1 : keep_ms);
        const char *v[4] = {rec->id, rec->token, len ? (const char *)result : "", keep};
        int l[4] = {0, 0, (int)len, 0}, f[4] = {0, 0, 1, 0};
        st = run(e, &slot, G_DONE, 4, v, l, f, NULL, &res, outcome);
        ok = st == CERB_OK && PQntuples(res) == 1 && (as_i64(res, 0) > 0 || is_true(res, 1));
    } else {
        const char *v[2] = {rec->id, rec->token};
        st = run(e, &slot, G_DELETE, 2, v, NULL, NULL, NULL, &res, outcome);
        ok = st == CERB_OK && PQntuples(res) == 1 && is_true(res, 0);
    }
    give(e, slot);
    PQclear(res);
    if (st != CERB_OK)
        return st;
    if (!ok)
        return cerb__error_set(CERB_NOT_OWNER, "pg: guard record %s is not this attempt's claim",
                               rec->id);
    return CERB_OK;
}

cerb_status cerb__pg_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                 cerb_guard_found *found)
{
    int slot;
    PGresult *res = NULL;
    cerb_outcome oc;
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = take(e, &slot);
    if (st != CERB_OK)
        return st;
    const char *v[2] = {rec->id, rec->token};
    st = run(e, &slot, G_CHECK, 2, v, NULL, NULL, NULL, &res, &oc);
    give(e, slot);
    if (st != CERB_OK)
        return st;
    if (PQntuples(res) == 1 && is_true(res, 2)) {
        int64_t state = as_i64(res, 1);
        if (!is_true(res, 0))
            *found = CERB_GUARD_FOUND_OTHER;
        else if (state == 1)
            *found = CERB_GUARD_FOUND_RUNNING;
        else if (state == 2)
            *found = CERB_GUARD_FOUND_DONE;
        else
            *found = CERB_GUARD_FOUND_OTHER; /* a state this version does not write */
    }
    PQclear(res);
    return CERB_OK;
}
