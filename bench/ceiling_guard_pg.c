/*
 * ceiling_guard_pg.c — the raw ceiling of the guard scenario on pg: the
 * statements engine_pg/pg_guard.c sends for a begin + finish(1) and for a
 * duplicate, on a bare session of the pg ceiling (ceiling_pg.c: one
 * blocking libpq connection from pg.conninfo and pg.password_file,
 * synchronous_commit = on), with no library logic (no SHA-256 of the key,
 * no fresh token, no handle, no renewer, no breaker, no pool, no sweep),
 * so the bench can say what fraction of the server's speed the pg guard
 * keeps.
 *
 * The layout is pg_guard.c's: a row of <pg.schema>.cerberus_guard per
 * record. The statements are its G_BEGIN and G_DONE, byte for byte (kept
 * equal by hand), with the same values (the scope and the result binary),
 * prepared once per session as a hand-written client would (the engine
 * sends them unprepared, PQsendQueryParams, parsed and planned each time):
 *   begin:     WITH ins AS (INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE
 *              expired OR our running claim RETURNING 1) SELECT claimed,
 *              and the snapshot's row (state, ours, live, a done-record's
 *              result as hex when nothing was claimed)
 *   finish(1): WITH f AS (UPDATE ... SET state = 2, result, until WHERE our
 *              unexpired claim RETURNING 1) SELECT made done, already our
 *              done-record
 *   duplicate: the begin alone on a done record: one round trip, whose
 *              answer carries the result.
 * The id is 64 hex characters made from the caller's counters, the token
 * fixed per thread, the scope "bench-guard" (scenario_guard.c).
 *
 * What the server counts: PostgreSQL keeps no per-statement counter it
 * publishes at once (pg_stat_database's xact counts reach the shared
 * statistics up to a second late, longer than a round), so server_commands
 * reads the next transaction id (pg_snapshot_xmax(pg_current_snapshot()),
 * which assigns none itself): the statements that wrote or locked a row,
 * cluster-wide. Each guard step writes (a duplicate's begin locks the
 * conflicting row, which takes an id), so it is 2 per begin + finish and 1
 * per duplicate; a read-only statement (SELECT 1, a sweep that found
 * nothing) is not counted.
 */
#include <libpq-fe.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

#define SCOPE "bench-guard"

/* engine_pg/pg_guard.c's gtemplates, byte for byte. */
#define MS(p) "clock_timestamp() + " p "::bigint * interval '1 millisecond'"

enum { G_BEGIN, G_DONE, G_XMAX, G_N };

static const char *const gnames[G_N] = {"bench_g_begin", "bench_g_done", "bench_g_xmax"};
static const int gnparams[G_N] = {4, 4, 0};

static const char *const gtpl[G_N] = {
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
    [G_DONE] = "WITH f AS (UPDATE @S.cerberus_guard SET state = 2, result = $3::bytea, "
               "until = CASE WHEN $4::bigint < 0 THEN NULL ELSE " MS("$4") " END "
               "WHERE id = $1::text AND token = $2::text AND state = 1 AND "
               "until > clock_timestamp() RETURNING 1) "
               "SELECT (SELECT count(*) FROM f), EXISTS (SELECT 1 FROM @S.cerberus_guard "
               "WHERE id = $1::text AND token = $2::text AND state = 2 AND "
               "(until IS NULL OR until > clock_timestamp()))",
    [G_XMAX] = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text",
};

static void pgg_close(void *p) { bench_pg_close(p); }

static int pgg_fail(PGconn *c, const PGresult *r, const char *what, char *err, size_t errlen)
{
    const char *m = r ? PQresultErrorMessage(r) : "";
    if (!m[0])
        m = PQerrorMessage(c);
    snprintf(err, errlen, "pg %s: %.*s", what, (int)strcspn(m, "\n"), m);
    return -1;
}

static void *pgg_open(const struct bench_engine *e, char *err, size_t errlen)
{
    void *s = bench_pg_open(e, err, errlen);
    if (!s)
        return NULL;
    PGconn *c = bench_pg_conn(s);
    const char *schema = e->cfg->pg.schema ? e->cfg->pg.schema : "public";
    char q[160], sql[2048];
    size_t o = 0;
    q[o++] = '"';
    for (const char *p = schema; *p && o + 3 < sizeof q; p++) {
        if (*p == '"')
            q[o++] = '"';
        q[o++] = *p;
    }
    q[o++] = '"';
    q[o] = '\0';
    for (int i = 0; i < G_N; i++) {
        size_t k = 0, ql = strlen(q);
        for (const char *p = gtpl[i]; *p && k + ql + 1 < sizeof sql; p++) {
            if (p[0] == '@' && p[1] == 'S') {
                memcpy(sql + k, q, ql);
                k += ql;
                p++;
            } else {
                sql[k++] = *p;
            }
        }
        sql[k] = '\0';
        PGresult *r = PQprepare(c, gnames[i], sql, gnparams[i], NULL);
        int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
        if (!ok)
            pgg_fail(c, r, "PREPARE (guard)", err, errlen);
        PQclear(r);
        if (!ok) {
            bench_pg_close(s);
            return NULL;
        }
    }
    return s;
}

/* The begin: its answer (one row, five columns), or NULL with @err. */
static PGresult *pgg_begin(PGconn *c, const char *id, const char *token, int64_t running_ms,
                           char *err, size_t errlen)
{
    char ms[24];
    snprintf(ms, sizeof ms, "%" PRId64, running_ms);
    const char *v[4] = {id, SCOPE, token, ms};
    const int l[4] = {0, (int)sizeof SCOPE - 1, 0, 0}, f[4] = {0, 1, 0, 0};
    PGresult *r = PQexecPrepared(c, gnames[G_BEGIN], 4, v, l, f, 0);
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQnfields(r) != 5) {
        pgg_fail(c, r, "guard begin", err, errlen);
        PQclear(r);
        return NULL;
    }
    return r;
}

static int pgg_cycle(void *p, const char *id, const char *token, const void *result, size_t len,
                     int64_t running_ms, int64_t keep_ms, char *err, size_t errlen)
{
    PGconn *c = bench_pg_conn(p);
    PGresult *r = pgg_begin(c, id, token, running_ms, err, errlen);
    if (!r)
        return -1;
    int claimed = strcmp(PQgetvalue(r, 0, 0), "0") != 0;
    PQclear(r);
    if (!claimed) {
        snprintf(err, errlen, "pg guard begin on %s: not claimed", id);
        return -1;
    }
    char keep[24];
    snprintf(keep, sizeof keep, "%" PRId64, keep_ms < 0 ? (int64_t)-1 : keep_ms);
    const char *v[4] = {id, token, len ? (const char *)result : "", keep};
    const int l[4] = {0, 0, (int)len, 0}, f[4] = {0, 0, 1, 0};
    r = PQexecPrepared(c, gnames[G_DONE], 4, v, l, f, 0);
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        pgg_fail(c, r, "guard finish", err, errlen);
        PQclear(r);
        return -1;
    }
    int ok = strcmp(PQgetvalue(r, 0, 0), "0") != 0 || PQgetvalue(r, 0, 1)[0] == 't';
    PQclear(r);
    if (!ok) {
        snprintf(err, errlen, "pg guard finish on %s: not our claim", id);
        return -1;
    }
    return 0;
}

static int pgg_duplicate(void *p, const char *id, const char *token, int64_t running_ms,
                         char *err, size_t errlen)
{
    PGresult *r = pgg_begin(bench_pg_conn(p), id, token, running_ms, err, errlen);
    if (!r)
        return -1;
    int rc = 0;
    if (strcmp(PQgetvalue(r, 0, 0), "0") != 0) {
        snprintf(err, errlen, "pg guard begin on %s: claimed, not a duplicate (expired?)", id);
        rc = -1;
    } else if (strcmp(PQgetvalue(r, 0, 1), "2") != 0 || PQgetvalue(r, 0, 3)[0] != 't' ||
               PQgetisnull(r, 0, 4)) {
        snprintf(err, errlen, "pg guard begin on %s: not a done record with a result", id);
        rc = -1;
    }
    PQclear(r);
    return rc;
}

/* The next transaction id (see the file comment). */
static int pgg_commands(void *p, uint64_t *out, char *err, size_t errlen)
{
    PGconn *c = bench_pg_conn(p);
    PGresult *r = PQexecPrepared(c, gnames[G_XMAX], 0, NULL, NULL, NULL, 0);
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        pgg_fail(c, r, "pg_current_snapshot", err, errlen);
        PQclear(r);
        return -1;
    }
    *out = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return 0;
}

const struct bench_guard_ceiling bench_guard_ceiling_pg = {
    "pg", pgg_open, pgg_cycle, pgg_duplicate, pgg_commands, pgg_close,
};
