/*
 * ceiling_pg.c — the raw ceiling of the pg engine: what a hand-written
 * libpq client sends for the engine's layout (DESIGN.md §4: a session
 * advisory lock and a fenced lease row) with the same guarantees and no
 * library logic, so the bench can say what fraction of the server's speed
 * the pg engine keeps.
 *
 * A session is one blocking libpq connection, made from the configuration's
 * pg.conninfo (and pg.password_file, read as the engine reads it: its first
 * line), with synchronous_commit = on as the engine's sessions have it (a
 * grant is acknowledged only once durable), and these statements prepared
 * once on it, on the very table the engine uses (<pg.schema>.cerberus_lock)
 * under names of the bench's own ("bench-c-<pid>-<i>", "bench-hr-<pid>"):
 *   try    WITH a AS (SELECT pg_try_advisory_lock(key) AS got),
 *          ins AS (INSERT ... SELECT name, key, 1, token, pg_backend_pid(),
 *          clock_timestamp() + 10 s, clock_timestamp() FROM a WHERE a.got
 *          ON CONFLICT (name) DO UPDATE SET fence = l.fence + 1, owner, ...
 *          WHERE l.owner IS NULL OR l.lease_until <= clock_timestamp()
 *          RETURNING fence) SELECT a.got, (SELECT fence FROM ins) FROM a
 *   wait   the same with pg_advisory_lock(key) (blocks in the server's
 *          queue; the hand-off ceilings)
 *   free   WITH u AS (UPDATE ... SET owner = NULL, owner_pid = NULL,
 *          lease_until = clock_timestamp() WHERE name AND owner = token
 *          RETURNING fence) SELECT c.n, pg_advisory_unlock(key)
 *          FROM (SELECT count(*) AS n FROM u) c
 *   ping   SELECT 1 (the round trip of the hand-off and herd rows)
 * An uncontended cycle is try + free: two round trips, as the engine's
 * lock + unlock. The name is bytea sent binary, the token text, the key a
 * 64-bit FNV-1a of the name (a hand-written client maps its names somehow;
 * the engine's DistributedLock mapping is library work). Left out on
 * purpose, as library logic: the fence floor of a failover, the lease time
 * left that the engine's grant also returns, the wait in slices with
 * lock_timeout and the drop of a late grant, the pool. The rows stay (the
 * engine never deletes rows either); one per name, so a run adds threads
 * + 1 rows.
 */
#include <libpq-fe.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

enum { S_TRY, S_WAIT, S_FREE, S_PING, S_N };

static const char *const stmt_names[S_N] = {"bench_try", "bench_wait", "bench_free",
                                            "bench_ping"};

/* The claim of the row, after `a` (the advisory lock) said got. */
#define CLAIM                                                                              \
    "ins AS (INSERT INTO @S.cerberus_lock AS l (name, akey, fence, owner, owner_pid, "     \
    "lease_until, acquired_at) SELECT $1::bytea, $2::bigint, 1, $3::text, pg_backend_pid(), " \
    "clock_timestamp() + interval '10 seconds', clock_timestamp() FROM a WHERE a.got "     \
    "ON CONFLICT (name) DO UPDATE SET fence = l.fence + 1, owner = EXCLUDED.owner, "        \
    "owner_pid = EXCLUDED.owner_pid, lease_until = EXCLUDED.lease_until, "                 \
    "acquired_at = EXCLUDED.acquired_at WHERE l.owner IS NULL OR "                         \
    "l.lease_until <= clock_timestamp() RETURNING fence) "                                 \
    "SELECT a.got, (SELECT fence FROM ins) FROM a"

/* @S: the schema, quoted. */
static const char *const stmt_tpl[S_N] = {
    [S_TRY] = "WITH a AS (SELECT pg_try_advisory_lock($2::bigint) AS got), " CLAIM,
    [S_WAIT] = "WITH a AS (SELECT pg_advisory_lock($2::bigint)::text AS w, true AS got), " CLAIM,
    [S_FREE] = "WITH u AS (UPDATE @S.cerberus_lock SET owner = NULL, owner_pid = NULL, "
               "lease_until = clock_timestamp() WHERE name = $1::bytea AND owner = $2::text "
               "RETURNING fence) SELECT c.n, pg_advisory_unlock($3::bigint) "
               "FROM (SELECT count(*) AS n FROM u) c",
    [S_PING] = "SELECT 1",
};

static const int stmt_nparams[S_N] = {3, 3, 3, 0};

struct pg_sess {
    PGconn *c;
};

/* "pg <what>: <first line of libpq's message>" into @err. */
static void pg_err(PGconn *c, const PGresult *r, const char *what, char *err, size_t errlen)
{
    const char *m = r ? PQresultErrorMessage(r) : "";
    if (!m[0])
        m = c ? PQerrorMessage(c) : "out of memory";
    snprintf(err, errlen, "pg %s: %.*s", what, (int)strcspn(m, "\n"), m);
}

void bench_pg_close(void *p)
{
    struct pg_sess *s = p;
    if (!s)
        return;
    PQfinish(s->c);
    free(s);
}

/* Run @sql (no result wanted) on @c. */
static int exec_simple(PGconn *c, const char *sql, const char *what, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        pg_err(c, r, what, err, errlen);
    PQclear(r);
    return ok ? 0 : -1;
}

/* @tpl with "@S" replaced by @q into @out (room enough: the schema is
 * at most a quoted identifier, the templates under 1 KiB). */
static void splice(const char *tpl, const char *q, char *out, size_t len)
{
    size_t o = 0, ql = strlen(q);
    for (const char *p = tpl; *p && o + ql + 1 < len; p++) {
        if (p[0] == '@' && p[1] == 'S') {
            memcpy(out + o, q, ql);
            o += ql;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

/* Prepare the statements with the schema, quoted, spliced in. */
static int prepare_all(PGconn *c, const char *schema, char *err, size_t errlen)
{
    char q[160], sql[1400];
    size_t o = 0;
    q[o++] = '"';
    for (const char *p = schema; *p && o + 3 < sizeof q; p++) {
        if (*p == '"')
            q[o++] = '"';
        q[o++] = *p;
    }
    q[o++] = '"';
    q[o] = '\0';
    for (int i = 0; i < S_N; i++) {
        splice(stmt_tpl[i], q, sql, sizeof sql);
        PGresult *r = PQprepare(c, stmt_names[i], sql, stmt_nparams[i], NULL);
        int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
        if (!ok)
            pg_err(c, r, "PREPARE", err, errlen);
        PQclear(r);
        if (!ok)
            return -1;
    }
    return 0;
}

void *bench_pg_open(const struct bench_engine *e, char *err, size_t errlen)
{
    const struct cerb_pg_config *pc = &e->cfg->pg;
    char *pw = NULL, timeout[24];
    const char *keys[5], *vals[5];
    int k = 0;
    struct pg_sess *s = calloc(1, sizeof *s);

    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* pg.password_file's first line, read as the engine reads it. */
    if (cerb__config_read_secret("pg", pc->password_file, &pw) != CERB_OK) {
        snprintf(err, errlen, "%s", cerb_last_error());
        free(s);
        return NULL;
    }
    /* conninfo first (expanded), then what the engine adds on top of it. */
    snprintf(timeout, sizeof timeout, "%lld", (long long)((pc->connect_timeout_ms + 999) / 1000));
    keys[k] = "dbname", vals[k++] = pc->conninfo;
    if (pw)
        keys[k] = "password", vals[k++] = pw;
    keys[k] = "connect_timeout", vals[k++] = timeout;
    keys[k] = "fallback_application_name", vals[k++] = "cerberus-bench-ceiling";
    keys[k] = NULL, vals[k] = NULL;
    s->c = PQconnectdbParams(keys, vals, 1);
    cerb__config_free_secret(pw);
    if (!s->c || PQstatus(s->c) != CONNECTION_OK) {
        pg_err(s->c, NULL, "connect", err, errlen);
        bench_pg_close(s);
        return NULL;
    }
    if (exec_simple(s->c, "SET synchronous_commit = on", "SET", err, errlen) != 0 ||
        prepare_all(s->c, pc->schema ? pc->schema : "public", err, errlen) != 0) {
        bench_pg_close(s);
        return NULL;
    }
    return s;
}

/* The ceiling's advisory key of @name: 64-bit FNV-1a. */
static void name_key(const char *name, char out[24])
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * UINT64_C(1099511628211);
    snprintf(out, 24, "%" PRId64, (int64_t)h);
}

/* Run a prepared lock statement: name (binary), then two text values. */
static PGresult *run3(struct pg_sess *s, int stmt, const char *name, const char *a,
                      const char *b)
{
    const char *v[3] = {name, a, b};
    const int l[3] = {(int)strlen(name), 0, 0}, f[3] = {1, 0, 0};
    return PQexecPrepared(s->c, stmt_names[stmt], 3, v, l, f, 0);
}

/* try or wait: 1 = the advisory lock and the row are ours, 0 = the
 * advisory lock is another session's, -1 = error (also when the lock was
 * had but the row shows another's live lease: never the case between the
 * bench's own sessions, which free the row before they unlock). */
static int grant(struct pg_sess *s, int stmt, const char *name, const char *token, char *err,
                 size_t errlen)
{
    char key[24];
    name_key(name, key);
    PGresult *r = run3(s, stmt, name, key, token);
    int got = -1;
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        pg_err(s->c, r, stmt == S_TRY ? "try + claim" : "wait + claim", err, errlen);
    else if (PQgetvalue(r, 0, 0)[0] != 't')
        got = 0;
    else if (PQgetisnull(r, 0, 1))
        snprintf(err, errlen, "pg claim of \"%s\": the row shows another owner's lease", name);
    else
        got = 1;
    PQclear(r);
    return got;
}

int bench_pg_try(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    return grant(p, S_TRY, name, token, err, errlen);
}

int bench_pg_wait(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    return grant(p, S_WAIT, name, token, err, errlen) == 1 ? 0 : -1;
}

int bench_pg_release(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct pg_sess *s = p;
    char key[24];
    name_key(name, key);
    PGresult *r = run3(s, S_FREE, name, token, key);
    int rc = -1;
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        pg_err(s->c, r, "free + unlock", err, errlen);
    else if (strcmp(PQgetvalue(r, 0, 0), "1") != 0 || PQgetvalue(r, 0, 1)[0] != 't')
        snprintf(err, errlen, "pg free + unlock of \"%s\": row freed %s, unlocked %s", name,
                 PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
    else
        rc = 0;
    PQclear(r);
    return rc;
}

/* One uncontended cycle: the name is ours alone, so busy is an error. */
static int pg_cycle(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    int got = bench_pg_try(p, name, token, err, errlen);
    if (got == 0)
        snprintf(err, errlen, "pg try of \"%s\": the advisory lock is held", name);
    return got == 1 ? bench_pg_release(p, name, token, err, errlen) : -1;
}

static int pg_round_trip(void *p, char *err, size_t errlen)
{
    struct pg_sess *s = p;
    PGresult *r = PQexecPrepared(s->c, stmt_names[S_PING], 0, NULL, NULL, NULL, 0);
    int ok = r && PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        pg_err(s->c, r, "SELECT 1", err, errlen);
    PQclear(r);
    return ok ? 0 : -1;
}

PGconn *bench_pg_conn(void *p) { return ((struct pg_sess *)p)->c; }

const struct bench_ceiling bench_ceiling_pg = {
    "pg", bench_pg_open, pg_cycle, pg_round_trip, bench_pg_close,
};

const struct bench_contended_ceiling bench_contended_ceiling_pg = {
    .engine = "pg",
    .open = bench_pg_open,
    .try_acquire = bench_pg_try,
    .release = bench_pg_release,
    .close = bench_pg_close,
};

const struct bench_handoff_ceiling bench_handoff_ceiling_pg = {
    .engine = "pg",
    .what = "pg_advisory_lock + claim by the waiter, free + unlock by the holder",
    .open = bench_pg_open,
    .wait = bench_pg_wait,
    .release = bench_pg_release,
    .close = bench_pg_close,
};

void bench_pg_describe(const struct bench_engine *e, char *buf, size_t len)
{
    const char *host = "", *port = "", *db = "", *user = "";
    PQconninfoOption *opts = PQconninfoParse(e->cfg->pg.conninfo, NULL);
    for (PQconninfoOption *o = opts; o && o->keyword; o++) {
        const char *v = o->val ? o->val : "";
        if (strcmp(o->keyword, "host") == 0 || (strcmp(o->keyword, "hostaddr") == 0 && !host[0]))
            host = v;
        else if (strcmp(o->keyword, "port") == 0)
            port = v;
        else if (strcmp(o->keyword, "dbname") == 0)
            db = v;
        else if (strcmp(o->keyword, "user") == 0)
            user = v;
    }
    /* The password, if the conninfo has one, is left out. */
    snprintf(buf, len, "host=%s port=%s dbname=%s user=%s, table %s.cerberus_lock",
             host[0] ? host : "(default)", port[0] ? port : "(default)", db[0] ? db : "(default)",
             user[0] ? user : "(default)", e->cfg->pg.schema ? e->cfg->pg.schema : "public");
    PQconninfoFree(opts);
}
