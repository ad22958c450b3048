/*
 * ceiling_guard_mysql.c — the raw ceiling of the guard scenario on mysql:
 * the statements engine_mysql/my_guard.c sends for a begin + finish(1) and
 * for a duplicate, prepared once on a bare session of the mysql ceiling
 * (ceiling_mysql.c: one blocking connection, set up as the engine's
 * sessions are), with no library logic (no SHA-256 of the key, no fresh
 * token, no handle, no renewer, no breaker, no pool, no deadlock retry, no
 * sweep), so the bench can say what fraction of the server's speed the
 * mysql guard keeps.
 *
 * The layout is my_guard.c's: a row of <mysql.database>.cerberus_guard per
 * record. The statements are its MYG_BEGIN, MYG_DONE and MYG_SEEN, byte for
 * byte (kept equal by hand), with the same values bound:
 *   begin:     INSERT ... VALUES (id, scope, token, 1, now + running_ms)
 *              ON DUPLICATE KEY UPDATE each column IF(expired OR our
 *              running claim, new, old), the first also calling
 *              LAST_INSERT_ID(1) when not: insert id 0 = claimed
 *   finish(1): UPDATE ... SET result, until = now + keep_ms, state = 2
 *              WHERE id AND token AND (our unexpired claim OR our
 *              unexpired done-record): one matched row
 *   duplicate: the begin on a done record (insert id 1: nothing changed),
 *              then SELECT state, unexpired, result WHERE id (the engine's
 *              answer to "why not claimed"): two round trips, as the
 *              engine's, the result fetched whole.
 * The id is 64 hex characters made from the caller's counters, the token
 * fixed per thread, the scope "bench-guard" (scenario_guard.c). The server
 * counts the statements: server_commands reads Questions (SHOW GLOBAL
 * STATUS: every statement a client sent, COM_STMT_EXECUTE included,
 * COM_STMT_PREPARE not) less this session's own SHOWs.
 */
#include <mysql.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

#define SCOPE "bench-guard"

/* engine_mysql/my_guard.c's gtpl, byte for byte. */
#define NOW "UTC_TIMESTAMP(6)"
#define LATER NOW " + INTERVAL ? MICROSECOND"
#define TAKE "(until <= " NOW " OR (token = ? AND state = 1))"

enum { G_BEGIN, G_SEEN, G_DONE, G_STATUS, G_N };

static const char *const gtpl[G_N] = {
    [G_BEGIN] = "INSERT INTO @D.cerberus_guard (id, scope, token, state, until) VALUES "
                "(?, ?, ?, 1, " LATER ") ON DUPLICATE KEY UPDATE "
                "result = IF(" TAKE ", NULL, IF(LAST_INSERT_ID(1), result, result)), "
                "scope = IF(" TAKE ", ?, scope), state = IF(" TAKE ", 1, state), "
                "token = IF(" TAKE ", ?, token), until = IF(" TAKE ", " LATER ", until)",
    [G_SEEN] = "SELECT state, until IS NULL OR until > " NOW ", result FROM "
               "@D.cerberus_guard WHERE id = ?",
    [G_DONE] = "UPDATE @D.cerberus_guard SET result = IF(state = 1, ?, result), "
               "until = IF(state = 1, IF(? < 0, NULL, " LATER "), until), state = 2 "
               "WHERE id = ? AND token = ? AND ((state = 1 AND until > " NOW ") OR "
               "(state = 2 AND (until IS NULL OR until > " NOW ")))",
    [G_STATUS] = "SHOW GLOBAL STATUS LIKE 'Questions'",
};

struct mg_sess {
    MYSQL *my;
    MYSQL_STMT *st[G_N];
    char db_q[160];
    uint64_t shows; /* G_STATUS run so far */
};

static void mg_close(void *p)
{
    struct mg_sess *s = p;
    if (!s)
        return;
    for (int i = 0; i < G_N; i++)
        if (s->st[i])
            mysql_stmt_close(s->st[i]);
    if (s->my)
        mysql_close(s->my);
    free(s);
}

static void *mg_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct mg_sess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(s->my = bench_mysql_connect(e, s->db_q, sizeof s->db_q, err, errlen))) {
        free(s);
        return NULL;
    }
    for (int i = 0; i < G_N; i++)
        if (!(s->st[i] = bench_mysql_prepare(s->my, s->db_q, gtpl[i], err, errlen))) {
            mg_close(s);
            return NULL;
        }
    return s;
}

static int mg_fail(struct mg_sess *s, int k, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "mysql %s: %s", what, mysql_stmt_error(s->st[k]));
    return -1;
}

/* The begin: 1 claimed (insert id 0), 0 not (insert id 1), -1 error. */
static int mg_begin(struct mg_sess *s, const char *id, const char *token, int64_t running_ms,
                    char *err, size_t errlen)
{
    MYSQL_BIND b[12];
    long long us = running_ms * 1000;
    /* id, scope, token, us; then TAKE's token in each of the five
     * assignments, with the new scope, token and claim after theirs. */
    bench_mysql_bind(&b[0], MYSQL_TYPE_STRING, id, 64);
    bench_mysql_bind(&b[1], MYSQL_TYPE_BLOB, SCOPE, sizeof SCOPE - 1);
    bench_mysql_bind(&b[2], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[3], MYSQL_TYPE_LONGLONG, &us, 0);
    bench_mysql_bind(&b[4], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[5], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[6], MYSQL_TYPE_BLOB, SCOPE, sizeof SCOPE - 1);
    bench_mysql_bind(&b[7], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[8], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[9], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[10], MYSQL_TYPE_STRING, token, 32);
    bench_mysql_bind(&b[11], MYSQL_TYPE_LONGLONG, &us, 0);
    if (mysql_stmt_bind_param(s->st[G_BEGIN], b) != 0 || mysql_stmt_execute(s->st[G_BEGIN]) != 0)
        return mg_fail(s, G_BEGIN, "guard begin", err, errlen);
    return mysql_stmt_insert_id(s->st[G_BEGIN]) == 0 ? 1 : 0;
}

static int mg_cycle(void *p, const char *id, const char *token, const void *result, size_t len,
                    int64_t running_ms, int64_t keep_ms, char *err, size_t errlen)
{
    struct mg_sess *s = p;
    int got = mg_begin(s, id, token, running_ms, err, errlen);
    if (got == 0)
        snprintf(err, errlen, "mysql guard begin on %s: not claimed", id);
    if (got != 1)
        return -1;
    MYSQL_BIND b[5];
    long long keep = keep_ms < 0 ? -1 : keep_ms, keep_us = keep < 0 ? 0 : keep * 1000;
    bench_mysql_bind(&b[0], MYSQL_TYPE_BLOB, result, (unsigned long)len);
    bench_mysql_bind(&b[1], MYSQL_TYPE_LONGLONG, &keep, 0);
    bench_mysql_bind(&b[2], MYSQL_TYPE_LONGLONG, &keep_us, 0);
    bench_mysql_bind(&b[3], MYSQL_TYPE_STRING, id, 64);
    bench_mysql_bind(&b[4], MYSQL_TYPE_STRING, token, 32);
    if (mysql_stmt_bind_param(s->st[G_DONE], b) != 0 || mysql_stmt_execute(s->st[G_DONE]) != 0)
        return mg_fail(s, G_DONE, "guard finish", err, errlen);
    if (mysql_stmt_affected_rows(s->st[G_DONE]) != 1) {
        snprintf(err, errlen, "mysql guard finish on %s: not our claim", id);
        return -1;
    }
    return 0;
}

static int mg_duplicate(void *p, const char *id, const char *token, int64_t running_ms,
                        char *err, size_t errlen)
{
    struct mg_sess *s = p;
    MYSQL_STMT *st = s->st[G_SEEN];
    int got = mg_begin(s, id, token, running_ms, err, errlen);
    if (got == 1)
        snprintf(err, errlen, "mysql guard begin on %s: claimed, not a duplicate (expired?)", id);
    if (got != 0)
        return -1;
    MYSQL_BIND b[1], out[3];
    long long state = 0, live = 0;
    my_bool n0 = 0, n1 = 0, n2 = 0;
    char res[256];
    unsigned long rlen = 0;
    bench_mysql_bind(&b[0], MYSQL_TYPE_STRING, id, 64);
    memset(out, 0, sizeof out);
    out[0].buffer_type = out[1].buffer_type = MYSQL_TYPE_LONGLONG;
    out[0].buffer = &state;
    out[0].is_null = &n0;
    out[1].buffer = &live;
    out[1].is_null = &n1;
    out[2].buffer_type = MYSQL_TYPE_BLOB;
    out[2].buffer = res;
    out[2].buffer_length = sizeof res;
    out[2].length = &rlen;
    out[2].is_null = &n2;
    if (mysql_stmt_bind_param(st, b) != 0 || mysql_stmt_execute(st) != 0 ||
        mysql_stmt_bind_result(st, out) != 0)
        return mg_fail(s, G_SEEN, "guard begin (why not claimed)", err, errlen);
    int f = mysql_stmt_fetch(st);
    mysql_stmt_free_result(st);
    if (f != 0 && f != MYSQL_DATA_TRUNCATED) {
        snprintf(err, errlen, "mysql guard begin on %s: %s", id,
                 f == MYSQL_NO_DATA ? "no record" : mysql_stmt_error(st));
        return -1;
    }
    if (n0 || state != 2 || n1 || live != 1 || n2) {
        snprintf(err, errlen, "mysql guard begin on %s: not a done record with a result", id);
        return -1;
    }
    return 0;
}

/* Questions, less this session's SHOWs (each counts itself). */
static int mg_commands(void *p, uint64_t *out, char *err, size_t errlen)
{
    struct mg_sess *s = p;
    MYSQL_STMT *st = s->st[G_STATUS];
    MYSQL_BIND r[2];
    char name[64], val[32];
    unsigned long nl = 0, vl = 0;
    memset(r, 0, sizeof r);
    r[0].buffer_type = r[1].buffer_type = MYSQL_TYPE_STRING;
    r[0].buffer = name;
    r[0].buffer_length = sizeof name;
    r[0].length = &nl;
    r[1].buffer = val;
    r[1].buffer_length = sizeof val - 1;
    r[1].length = &vl;
    if (mysql_stmt_execute(st) != 0 || mysql_stmt_bind_result(st, r) != 0)
        return mg_fail(s, G_STATUS, "SHOW GLOBAL STATUS", err, errlen);
    int f = mysql_stmt_fetch(st);
    mysql_stmt_free_result(st);
    if (f != 0) {
        snprintf(err, errlen, "mysql SHOW GLOBAL STATUS: no Questions");
        return -1;
    }
    val[vl < sizeof val ? vl : sizeof val - 1] = '\0';
    s->shows++;
    *out = strtoull(val, NULL, 10) - s->shows;
    return 0;
}

const struct bench_guard_ceiling bench_guard_ceiling_mysql = {
    "mysql", mg_open, mg_cycle, mg_duplicate, mg_commands, mg_close,
};
