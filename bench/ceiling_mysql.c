/*
 * ceiling_mysql.c — the raw ceiling of the mysql engine: what a
 * hand-written MariaDB Connector/C client sends for the engine's layout
 * (DESIGN.md §4: a GET_LOCK session lock and a fenced lease row) with the
 * same guarantees and no library logic, so the bench can say what fraction
 * of the server's speed the mysql engine keeps.
 *
 * A session is one blocking libmariadb connection made from the
 * configuration's mysql section (host and port, or socket; user;
 * password_file, its first line, as the engine reads it; database;
 * connect_timeout_ms), set up as the engine's sessions are, since the
 * guarantees of the statements below rest on it (engine_mysql/my_conn.c,
 * my_sql.c): CLIENT_FOUND_ROWS, utf8mb4, REPEATABLE READ (no
 * semi-consistent reads, so a condition that calls GET_LOCK or
 * RELEASE_LOCK is evaluated once per row), autocommit and
 * innodb_lock_wait_timeout of the operation timeout. These statements are
 * prepared once on it, on the very table the engine uses
 * (<mysql.database>.cerberus_lock), under names of the bench's own
 * ("bench-c-<pid>-<i>", "bench-<tag>-raw-<pid>"):
 *   try    UPDATE ... SET fence = LAST_INSERT_ID(fence + 1), owner = ?,
 *          owner_conn = CONNECTION_ID(), lease_until = UTC_TIMESTAMP(6) +
 *          10 s, acquired_at = UTC_TIMESTAMP(6) WHERE name = ? AND (owner
 *          IS NULL OR lease_until <= UTC_TIMESTAMP(6)) AND GET_LOCK(?, 0) = 1
 *          (engine_mysql/my_sql.c's MY_TRY: the row X-locked, then the
 *          condition left to right, GET_LOCK last; one affected row is a
 *          grant, the fence comes in the OK packet, mysql_stmt_insert_id)
 *   wait   SELECT GET_LOCK(?, 30) (blocks in the server's queue), then
 *          claim: the try's UPDATE without GET_LOCK (MY_CLAIM). Two round
 *          trips, as the engine's wait: one statement cannot wait for the
 *          GET_LOCK after it has X-locked the row, which the holder's
 *          release needs (a deadlock InnoDB cannot see)
 *   free   UPDATE ... SET owner = NULL, owner_conn = NULL, lease_until =
 *          UTC_TIMESTAMP(6) WHERE name = ? AND owner = ? AND
 *          IFNULL(RELEASE_LOCK(?), 0) >= 0 (MY_RELEASE, byte for byte: the
 *          GET_LOCK given back after the row is X-locked and only if it
 *          is ours; a waiter's claim waits for this commit)
 *   row    INSERT IGNORE INTO ... (name, lname) VALUES (?, ?): once per
 *          session and name, before its first try or wait (the grant
 *          updates an existing row; the engine inserts on a miss too)
 *   ping   SELECT 1 (the round trip of the hand-off and herd rows)
 * An uncontended cycle is try + free: two round trips, as the engine's
 * lock + unlock. The name is bound as binary (BLOB), the token and the
 * GET_LOCK name as strings; the GET_LOCK name is the lock name itself (a
 * hand-written client maps its names somehow; the engine's mysql.key
 * mapping is library work). A try that matches no row is busy: the row
 * shows another's live lease or the GET_LOCK is another session's, and
 * with GET_LOCK evaluated last (tests/integration/test_mysql.c,
 * mysql_eval_order) it took nothing. Left out on purpose, as library
 * logic: the fence floor of a failover (GREATEST(fence + 1, ? + 1)), the
 * lname and lease duration bound per grant, the engine's MY_DIAG after a
 * try that matched nothing, RELEASE_ALL_LOCKS before a wait, the wait's
 * tick (KILL QUERY on interrupt, eviction of hung holders), the pool. The
 * rows stay (the engine never deletes rows either); one per name.
 */
#include <mysql.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

#define WAIT_S 30 /* a hand-off wait's GET_LOCK timeout */

enum { S_TRY, S_CLAIM, S_GETLOCK, S_FREE, S_ROW, S_PING, S_N };

/* The claim of the row; @D: the database, backtick-quoted. */
#define GRANT_SET                                                                          \
    "UPDATE @D.cerberus_lock SET fence = LAST_INSERT_ID(fence + 1), owner = ?, "          \
    "owner_conn = CONNECTION_ID(), lease_until = UTC_TIMESTAMP(6) + INTERVAL 10 SECOND, " \
    "acquired_at = UTC_TIMESTAMP(6) WHERE name = ? AND (owner IS NULL OR "                 \
    "lease_until <= UTC_TIMESTAMP(6))"

static const char *const stmt_tpl[S_N] = {
    [S_TRY] = GRANT_SET " AND GET_LOCK(?, 0) = 1",
    [S_CLAIM] = GRANT_SET,
    [S_GETLOCK] = "SELECT GET_LOCK(?, 30)",
    [S_FREE] = "UPDATE @D.cerberus_lock SET owner = NULL, owner_conn = NULL, "
               "lease_until = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ? AND "
               "IFNULL(RELEASE_LOCK(?), 0) >= 0",
    [S_ROW] = "INSERT IGNORE INTO @D.cerberus_lock (name, lname) VALUES (?, ?)",
    [S_PING] = "SELECT 1",
};

struct my_sess {
    MYSQL *my;
    MYSQL_STMT *st[S_N];
    char row[128]; /* the last name whose row this session made sure of */
    char db_q[160];
};

/* "mysql <what>: <message>" into @err. */
static void my_err(struct my_sess *s, MYSQL_STMT *st, const char *what, char *err,
                   size_t errlen)
{
    const char *m = st ? mysql_stmt_error(st) : s->my ? mysql_error(s->my) : "out of memory";
    snprintf(err, errlen, "mysql %s: %s", what, m && m[0] ? m : "unknown error");
}

void bench_mysql_close(void *p)
{
    struct my_sess *s = p;
    if (!s)
        return;
    for (int i = 0; i < S_N; i++)
        if (s->st[i])
            mysql_stmt_close(s->st[i]);
    if (s->my)
        mysql_close(s->my);
    free(s);
}

/* @tpl with "@D" replaced by @q into @out. */
static void splice(const char *tpl, const char *q, char *out, size_t len)
{
    size_t o = 0, ql = strlen(q);
    for (const char *p = tpl; *p && o + ql + 1 < len; p++) {
        if (p[0] == '@' && p[1] == 'D') {
            memcpy(out + o, q, ql);
            o += ql;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

MYSQL_STMT *bench_mysql_prepare(MYSQL *my, const char *db_q, const char *tpl, char *err,
                                size_t errlen)
{
    char sql[2048];
    MYSQL_STMT *st = mysql_stmt_init(my);
    if (!st) {
        snprintf(err, errlen, "mysql: out of memory");
        return NULL;
    }
    splice(tpl, db_q, sql, sizeof sql);
    if (mysql_stmt_prepare(st, sql, strlen(sql)) != 0) {
        snprintf(err, errlen, "mysql PREPARE: %s", mysql_stmt_error(st));
        mysql_stmt_close(st);
        return NULL;
    }
    return st;
}

MYSQL *bench_mysql_connect(const struct bench_engine *e, char *db_q, size_t qlen, char *err,
                           size_t errlen)
{
    const struct cerb_mysql_config *mc = &e->cfg->mysql;
    char *pw = NULL, init[128];
    unsigned conn_s = (unsigned)((mc->connect_timeout_ms + 999) / 1000);
    /* Statements end within the operation timeout; a hand-off wait within
     * WAIT_S more. */
    unsigned rw_s = (unsigned)((mc->op_timeout_ms + 999) / 1000) + WAIT_S;
    long long lock_wait_s = (mc->op_timeout_ms + 999) / 1000;
    int sock = mc->socket && mc->socket[0];
    size_t o = 0;

    /* mysql.password_file's first line, read as the engine reads it. */
    if (cerb__config_read_secret("mysql", mc->password_file, &pw) != CERB_OK) {
        snprintf(err, errlen, "%s", cerb_last_error());
        return NULL;
    }
    /* The database, backtick-quoted (the configuration allows no '`'). */
    db_q[o++] = '`';
    for (const char *p = mc->database; *p && o + 3 < qlen; p++) {
        if (*p == '`')
            db_q[o++] = '`';
        db_q[o++] = *p;
    }
    db_q[o++] = '`';
    db_q[o] = '\0';

    MYSQL *my = mysql_init(NULL);
    if (!my) {
        cerb__config_free_secret(pw);
        snprintf(err, errlen, "mysql: out of memory");
        return NULL;
    }
    snprintf(init, sizeof init,
             "SET SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = %lld",
             lock_wait_s < 1 ? 1 : lock_wait_s);
    mysql_options(my, MYSQL_OPT_CONNECT_TIMEOUT, &conn_s);
    mysql_options(my, MYSQL_OPT_READ_TIMEOUT, &rw_s);
    mysql_options(my, MYSQL_OPT_WRITE_TIMEOUT, &rw_s);
    mysql_options(my, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    mysql_options(my, MYSQL_INIT_COMMAND, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    mysql_options(my, MYSQL_INIT_COMMAND, init);
    if (!mysql_real_connect(my, sock ? "localhost" : mc->host, mc->user, pw, mc->database,
                            sock ? 0 : (unsigned)mc->port, sock ? mc->socket : NULL,
                            CLIENT_FOUND_ROWS)) {
        snprintf(err, errlen, "mysql connect to %s:%d as %s: %s", sock ? mc->socket : mc->host,
                 sock ? 0 : mc->port, mc->user, mysql_error(my));
        cerb__config_free_secret(pw);
        mysql_close(my);
        return NULL;
    }
    cerb__config_free_secret(pw);
    return my;
}

void *bench_mysql_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct my_sess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(s->my = bench_mysql_connect(e, s->db_q, sizeof s->db_q, err, errlen))) {
        free(s);
        return NULL;
    }
    for (int i = 0; i < S_N; i++)
        if (!(s->st[i] = bench_mysql_prepare(s->my, s->db_q, stmt_tpl[i], err, errlen))) {
            bench_mysql_close(s);
            return NULL;
        }
    return s;
}

void bench_mysql_bind(MYSQL_BIND *b, int type, const void *v, unsigned long len)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = (enum enum_field_types)type;
    b->buffer = (void *)(uintptr_t)v;
    b->buffer_length = len;
    b->length_value = len;
    /* Connector/C takes the length from length_value when length is NULL. */
}

/* Execute statement @k with @n string/blob values (blob where @is_blob
 * has bit i). Returns 0, or -1 with @err. */
static int exec(struct my_sess *s, int k, const char *what, int n, const char *const *v,
                unsigned is_blob, char *err, size_t errlen)
{
    MYSQL_BIND b[4];
    for (int i = 0; i < n; i++)
        bench_mysql_bind(&b[i], is_blob >> i & 1 ? MYSQL_TYPE_BLOB : MYSQL_TYPE_STRING, v[i],
                         (unsigned long)strlen(v[i]));
    if ((n && mysql_stmt_bind_param(s->st[k], b) != 0) || mysql_stmt_execute(s->st[k]) != 0) {
        my_err(s, s->st[k], what, err, errlen);
        return -1;
    }
    return 0;
}

/* The row of @name exists (once per session and name). */
static int ensure_row(struct my_sess *s, const char *name, char *err, size_t errlen)
{
    if (strcmp(s->row, name) == 0)
        return 0;
    if (strlen(name) > 64) { /* GET_LOCK's limit, and the bench's names are short */
        snprintf(err, errlen, "mysql: the name \"%s\" is longer than a GET_LOCK name may be",
                 name);
        return -1;
    }
    const char *v[2] = {name, name};
    if (exec(s, S_ROW, "INSERT IGNORE (the row)", 2, v, 1u, err, errlen) != 0)
        return -1;
    snprintf(s->row, sizeof s->row, "%s", name);
    return 0;
}

/* S_TRY or S_CLAIM: 1 = the row is ours (and, for try, the GET_LOCK), 0 =
 * it matched nothing, -1 = error. */
static int grant(struct my_sess *s, int k, const char *name, const char *token, char *err,
                 size_t errlen)
{
    const char *v[3] = {token, name, name};
    if (ensure_row(s, name, err, errlen) != 0 ||
        exec(s, k, k == S_TRY ? "try + claim" : "claim", k == S_TRY ? 3 : 2, v, 2u, err,
             errlen) != 0)
        return -1;
    if (mysql_stmt_affected_rows(s->st[k]) != 1)
        return 0;
    if (mysql_stmt_insert_id(s->st[k]) == 0) { /* LAST_INSERT_ID(fence) */
        snprintf(err, errlen, "mysql grant of \"%s\": no fence in the OK packet", name);
        return -1;
    }
    return 1;
}

int bench_mysql_try(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    return grant(p, S_TRY, name, token, err, errlen);
}

int bench_mysql_wait(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct my_sess *s = p;
    MYSQL_STMT *st = s->st[S_GETLOCK];
    MYSQL_BIND out;
    long long got = 0;
    my_bool isnull = 0;
    const char *v[1] = {name};

    if (ensure_row(s, name, err, errlen) != 0 ||
        exec(s, S_GETLOCK, "GET_LOCK", 1, v, 0u, err, errlen) != 0)
        return -1;
    memset(&out, 0, sizeof out);
    out.buffer_type = MYSQL_TYPE_LONGLONG;
    out.buffer = &got;
    out.is_null = &isnull;
    int f = mysql_stmt_bind_result(st, &out) != 0 ? 1 : mysql_stmt_fetch(st);
    mysql_stmt_free_result(st);
    if (f != 0 || isnull || got != 1) {
        if (f != 0)
            my_err(s, st, "GET_LOCK (fetch)", err, errlen);
        else
            snprintf(err, errlen, "mysql GET_LOCK of \"%s\": %s after %d s", name,
                     isnull ? "NULL" : "not granted", WAIT_S);
        return -1;
    }
    int g = grant(s, S_CLAIM, name, token, err, errlen);
    if (g == 0)
        snprintf(err, errlen, "mysql claim of \"%s\": the row shows another owner's lease", name);
    return g == 1 ? 0 : -1;
}

int bench_mysql_release(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct my_sess *s = p;
    const char *v[3] = {name, token, name};
    if (exec(s, S_FREE, "free + RELEASE_LOCK", 3, v, 1u, err, errlen) != 0)
        return -1;
    if (mysql_stmt_affected_rows(s->st[S_FREE]) != 1) {
        snprintf(err, errlen, "mysql free + RELEASE_LOCK of \"%s\": the row was not ours", name);
        return -1;
    }
    return 0;
}

/* One uncontended cycle: the name is ours alone, so busy is an error. */
static int mysql_cycle(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    int got = bench_mysql_try(p, name, token, err, errlen);
    if (got == 0)
        snprintf(err, errlen, "mysql try of \"%s\": busy", name);
    return got == 1 ? bench_mysql_release(p, name, token, err, errlen) : -1;
}

static int mysql_round_trip(void *p, char *err, size_t errlen)
{
    struct my_sess *s = p;
    MYSQL_STMT *st = s->st[S_PING];
    if (mysql_stmt_execute(st) != 0 || mysql_stmt_store_result(st) != 0) {
        my_err(s, st, "SELECT 1", err, errlen);
        return -1;
    }
    mysql_stmt_free_result(st);
    return 0;
}

const struct bench_ceiling bench_ceiling_mysql = {
    "mysql", bench_mysql_open, mysql_cycle, mysql_round_trip, bench_mysql_close,
};

const struct bench_contended_ceiling bench_contended_ceiling_mysql = {
    .engine = "mysql",
    .open = bench_mysql_open,
    .try_acquire = bench_mysql_try,
    .release = bench_mysql_release,
    .close = bench_mysql_close,
};

const struct bench_handoff_ceiling bench_handoff_ceiling_mysql = {
    .engine = "mysql",
    .what = "GET_LOCK, then the claim, by the waiter; free + RELEASE_LOCK by the holder",
    .open = bench_mysql_open,
    .wait = bench_mysql_wait,
    .release = bench_mysql_release,
    .close = bench_mysql_close,
};

void bench_mysql_describe(const struct bench_engine *e, char *buf, size_t len)
{
    const struct cerb_mysql_config *mc = &e->cfg->mysql;
    if (mc->socket && mc->socket[0])
        snprintf(buf, len, "socket %s user %s, table %s.cerberus_lock", mc->socket, mc->user,
                 mc->database);
    else
        snprintf(buf, len, "%s:%d user %s, table %s.cerberus_lock", mc->host, mc->port,
                 mc->user, mc->database);
}
