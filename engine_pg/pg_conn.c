/*
 * pg_conn.c — connections to PostgreSQL: opening one within a deadline,
 * running one statement within a deadline, and the pool of slots that
 * holds pin (pg_internal.h says why holds are pinned).
 *
 * Every connection is non-blocking and driven by poll(2) with the caller's
 * deadline: a paused server (SIGSTOP, a stalled disk) accepts bytes and
 * never answers, and libpq's own blocking calls would wait forever. A
 * statement that gets no answer in time may still run, so its session is
 * ended at once (PQfinish): whatever it was doing — a grant, a release —
 * is then undone or finished by the server alone, and no later statement
 * can be mistaken for its answer. PQcancel is not used: in libpq 15 it
 * waits for the server without a bound.
 */
#include "internal_posix.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "pg_internal.h"

/* Wait for the socket (readable, or writable while out_pending) until the
 * deadline. 1 ready, 0 deadline, -1 error. */
static int wait_sock(PGconn *pg, bool want_write, int64_t deadline_ns)
{
    int fd = PQsocket(pg);
    if (fd < 0)
        return -1;
    for (;;) {
        int64_t left = cerb__ms_left(deadline_ns);
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = (short)(POLLIN | (want_write ? POLLOUT : 0))};
        int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (r > 0)
            return 1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* First line of the error text, without its newline. */
static const char *first_line(const char *s, char *buf, size_t len)
{
    size_t n = strcspn(s ? s : "", "\n");
    if (n >= len)
        n = len - 1;
    memcpy(buf, s ? s : "", n);
    buf[n] = '\0';
    return buf;
}

/*
 * Collect the results of what was sent, until libpq has none left. The
 * first error result wins (the rest of a multi-statement string was not
 * run); otherwise the last result is returned.
 */
static cerb_status collect(PGconn *pg, int64_t deadline_ns, PGresult **res, bool *broken,
                           char sqlstate[6], const struct pg_tick *tick)
{
    char line[256];
    PGresult *keep = NULL;
    int64_t next_tick = tick ? cerb_monotime() + tick->every_ms * CERB_NS_PER_MS : 0;
    for (;;) {
        int fl = PQflush(pg);
        if (fl < 0)
            goto wire;
        if (fl == 0 && !PQisBusy(pg)) {
            PGresult *r = PQgetResult(pg);
            if (!r)
                break;
            if (keep && PQresultStatus(keep) == PGRES_FATAL_ERROR) {
                PQclear(r); /* the first error says why */
            } else {
                if (keep)
                    PQclear(keep);
                keep = r;
            }
            continue;
        }
        int64_t until = deadline_ns;
        if (tick && next_tick < until)
            until = next_tick;
        int w = wait_sock(pg, fl == 1, until);
        if (w == 0 && tick && cerb_monotime() >= next_tick && cerb__ms_left(deadline_ns) > 0) {
            next_tick = cerb_monotime() + tick->every_ms * CERB_NS_PER_MS;
            if (tick->fn(tick->ud))
                continue;
            if (keep)
                PQclear(keep);
            *broken = true; /* the caller gave up on this statement */
            return cerb__error_set(CERB_INTERRUPTED, "pg: the statement was given up");
        }
        if (w == 0) {
            if (keep)
                PQclear(keep);
            *broken = true;
            return cerb__error_set(CERB_EIO, "pg: no answer from the server in time");
        }
        if (w < 0 || PQconsumeInput(pg) == 0)
            goto wire;
    }
    if (!keep)
        goto wire;
    ExecStatusType t = PQresultStatus(keep);
    if (t == PGRES_TUPLES_OK || t == PGRES_COMMAND_OK) {
        *res = keep;
        return CERB_OK;
    }
    const char *ss = PQresultErrorField(keep, PG_DIAG_SQLSTATE);
    snprintf(sqlstate, 6, "%s", ss ? ss : "");
    first_line(PQresultErrorField(keep, PG_DIAG_MESSAGE_PRIMARY), line, sizeof line);
    PQclear(keep);
    if (PQstatus(pg) == CONNECTION_BAD || strncmp(sqlstate, "08", 2) == 0 ||
        strncmp(sqlstate, "57P", 3) == 0) {
        *broken = true;
        return cerb__error_set(CERB_EIO, "pg: session ended: %s (SQLSTATE %s)", line, sqlstate);
    }
    return cerb__error_set(CERB_EPROTO, "pg: %s (SQLSTATE %s)", line, sqlstate);
wire:
    if (keep)
        PQclear(keep);
    *broken = true;
    return cerb__error_set(CERB_EIO, "pg: connection failed: %s",
                           first_line(PQerrorMessage(pg), line, sizeof line));
}

cerb_status cerb__pg_exec(PGconn *pg, int stmt, const char *sql, int n, const char *const *vals,
                          const int *lens, const int *fmts, int64_t deadline_ns, PGresult **res,
                          bool *broken, char sqlstate[6])
{
    return cerb__pg_exec_tick(pg, stmt, sql, n, vals, lens, fmts, deadline_ns, res, broken,
                              sqlstate, NULL);
}

cerb_status cerb__pg_exec_prepared(PGconn *pg, const char *name, int n, const char *const *vals,
                                   const int *lens, const int *fmts, int64_t deadline_ns,
                                   PGresult **res, bool *broken, char sqlstate[6])
{
    char line[256];
    *res = NULL;
    *broken = false;
    sqlstate[0] = '\0';
    if (!PQsendQueryPrepared(pg, name, n, vals, lens, fmts, 0)) {
        *broken = true;
        return cerb__error_set(CERB_EIO, "pg: cannot send: %s",
                               first_line(PQerrorMessage(pg), line, sizeof line));
    }
    return collect(pg, deadline_ns, res, broken, sqlstate, NULL);
}

cerb_status cerb__pg_exec_tick(PGconn *pg, int stmt, const char *sql, int n,
                               const char *const *vals, const int *lens, const int *fmts,
                               int64_t deadline_ns, PGresult **res, bool *broken, char sqlstate[6],
                               const struct pg_tick *tick)
{
    char line[256];
    *res = NULL;
    *broken = false;
    sqlstate[0] = '\0';
    int ok = stmt >= 0 ? PQsendQueryPrepared(pg, cerb__pg_stmt_names[stmt], n, vals, lens, fmts, 0)
         : n > 0       ? PQsendQueryParams(pg, sql, n, NULL, vals, lens, fmts, 0)
                       : PQsendQuery(pg, sql);
    if (!ok) {
        *broken = true;
        return cerb__error_set(CERB_EIO, "pg: cannot send: %s",
                               first_line(PQerrorMessage(pg), line, sizeof line));
    }
    return collect(pg, deadline_ns, res, broken, sqlstate, tick);
}

/* Server notices (CREATE TABLE IF NOT EXISTS "skipping") are not ours to
 * print: libpq's default writes them to stderr. */
static void quiet(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

cerb_status cerb__pg_connect_raw(const struct cerb_pg_config *pc, const char *password,
                                 int64_t deadline_ns, PGconn **out)
{
    return cerb__pg_connect_to(pc->conninfo, password, deadline_ns, out);
}

cerb_status cerb__pg_connect_to(const char *conninfo, const char *password, int64_t deadline_ns,
                                PGconn **out)
{
    char line[256];
    const char *keys[5], *vals[5];
    int k = 0;
    /* conninfo first (expanded), then what we add on top of it. */
    keys[k] = "dbname", vals[k++] = conninfo;
    if (password)
        keys[k] = "password", vals[k++] = password;
    keys[k] = "fallback_application_name", vals[k++] = "cerberus";
    keys[k] = NULL, vals[k] = NULL;
    *out = NULL;
    PGconn *pg = PQconnectStartParams(keys, vals, 1);
    if (!pg)
        return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    if (PQstatus(pg) == CONNECTION_BAD) {
        cerb_status st = cerb__error_set(CERB_ECONFIG, "pg: %s",
                                         first_line(PQerrorMessage(pg), line, sizeof line));
        PQfinish(pg);
        return st;
    }
    PostgresPollingStatusType ps = PGRES_POLLING_WRITING;
    while (ps != PGRES_POLLING_OK) {
        if (ps == PGRES_POLLING_FAILED) {
            cerb_status st = cerb__error_set(CERB_EIO, "pg: cannot connect: %s",
                                             first_line(PQerrorMessage(pg), line, sizeof line));
            PQfinish(pg);
            return st;
        }
        int w = wait_sock(pg, ps == PGRES_POLLING_WRITING, deadline_ns);
        if (w <= 0) {
            PQfinish(pg);
            return cerb__error_set(CERB_EIO, "pg: cannot connect: %s",
                                   w == 0 ? "no answer in time" : "socket error");
        }
        ps = PQconnectPoll(pg);
    }
    PQsetNoticeProcessor(pg, quiet, NULL);
    if (PQsetnonblocking(pg, 1) != 0) {
        PQfinish(pg);
        return cerb__error_set(CERB_EIO, "pg: cannot make the connection non-blocking");
    }
    *out = pg;
    return CERB_OK;
}

/* ---- the pool ---- */

/*
 * Lease mode: nothing can be set for the session (a transaction pooler
 * hands each transaction to any backend), so the server's own settings
 * must already be what the statements need: a primary, synchronous_commit
 * not off (an acknowledged grant must survive a crash, or a fence could go
 * back), READ COMMITTED, and the table.
 */
static cerb_status check_lease_session(cerb_engine *e, PGconn *pg, int64_t deadline_ns)
{
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    const char *v[1] = {e->pc->schema};
    cerb_status st = cerb__pg_exec(
        pg, -1,
        "SELECT pg_is_in_recovery(), current_setting('synchronous_commit'), "
        "current_setting('default_transaction_isolation'), "
        "to_regclass(quote_ident($1) || '.cerberus_lock') IS NOT NULL",
        1, v, NULL, NULL, deadline_ns, &res, &broken, ss);
    if (st != CERB_OK)
        return st;
    bool standby = PQgetvalue(res, 0, 0)[0] == 't';
    char sync[32], iso[32];
    snprintf(sync, sizeof sync, "%s", PQgetvalue(res, 0, 1));
    snprintf(iso, sizeof iso, "%s", PQgetvalue(res, 0, 2));
    bool table = PQgetvalue(res, 0, 3)[0] == 't';
    PQclear(res);
    if (standby)
        return cerb__error_set(CERB_UNAVAILABLE,
                               "pg: the server is a standby (pg_is_in_recovery()): locks need "
                               "the primary");
    if (strcmp(sync, "off") == 0)
        return cerb__error_set(CERB_ECONFIG,
                               "pg: synchronous_commit is off for this database, and pg.mode = "
                               "\"lease\" cannot set it per session: a grant acknowledged "
                               "but lost in a crash would let a fence go back; set it on for "
                               "the role or database (ALTER ROLE ... SET synchronous_commit = on)");
    if (strcmp(iso, "read committed") != 0)
        return cerb__error_set(CERB_ECONFIG,
                               "pg: default_transaction_isolation is \"%s\"; pg.mode = \"lease\" "
                               "needs read committed (ALTER ROLE ... SET "
                               "default_transaction_isolation = 'read committed')",
                               iso);
    if (!table)
        return cerb__error_set(CERB_ECONFIG,
                               "pg: the table %s.cerberus_lock is missing: run `cerberus init` "
                               "with this configuration (docs/engines.md shows its SQL)",
                               e->schema_q);
    return CERB_OK;
}

/* How long grants wait after a failover: the longest lease a hold of
 * this client can have, plus the core's drift (1 % + 2 ms). */
static int64_t quarantine_ms(cerb_engine *e)
{
    int64_t q = e->cfg->lock.lease_ms;
    int64_t seen = atomic_load_explicit(&e->max_lease_ms, memory_order_relaxed);
    if (seen > q)
        q = seen;
    return q + q / 100 + 2;
}

static cerb_status check_meta(cerb_engine *e, PGconn *pg, int64_t deadline_ns)
{
    bool broken = false;
    return cerb__pg_check_meta(e, pg, deadline_ns, &broken);
}

cerb_status cerb__pg_check_meta(cerb_engine *e, PGconn *pg, int64_t deadline_ns, bool *broken_out)
{
    PGresult *res = NULL;
    bool broken = false;
    char ss[6], q[24];
    int64_t qms = quarantine_ms(e);
    snprintf(q, sizeof q, "%lld", (long long)qms);
    const char *v[1] = {q};
    cerb_status st =
        cerb__pg_exec(pg, -1, e->meta_sql, 1, v, NULL, NULL, deadline_ns, &res, &broken, ss);
    *broken_out = broken;
    if (st != CERB_OK) {
        if (strcmp(ss, "42P01") == 0)
            return cerb__error_set(CERB_ECONFIG,
                                   "pg: the table %s.cerberus_meta is missing: run `cerberus "
                                   "init` with this configuration (docs/engines.md shows its SQL)",
                                   e->schema_q);
        return st;
    }
    if (PQntuples(res) == 1 && atoi(PQgetvalue(res, 0, 0)) > 0)
        CERB_LOG_W("pg: the server (system %s, timeline %s) is not the one schema %s last saw: a "
                   "failover or a restore may have lost the last grants, so nothing is granted "
                   "for %lld ms and every fence starts above %s",
                   PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3), e->schema_q, (long long)qms,
                   PQgetvalue(res, 0, 4));
    else if (PQntuples(res) == 1 && atoi(PQgetvalue(res, 0, 1)) > 0)
        CERB_LOG_W("pg: schema %s had no record of its server (cerberus_meta): a new one, or a "
                   "restore that lost grants, cannot be told apart, so nothing is granted for "
                   "%lld ms; `cerberus init` makes the record on a new server",
                   e->schema_q, (long long)qms);
    PQclear(res);
    return CERB_OK;
}

/* Open slot i's session: settings, then every statement prepared, in one
 * round trip; the backend pid; refuse a standby. */
static cerb_status open_slot(cerb_engine *e, int i, int64_t deadline_ns)
{
    PGconn *pg = NULL;
    PGresult *res = NULL;
    bool broken;
    char ss[6];
    cerb_status st = cerb__pg_connect_raw(e->pc, e->password, deadline_ns, &pg);
    if (st != CERB_OK)
        return st;
    if (e->pc->mode == CERB_SQL_LEASE) {
        st = check_lease_session(e, pg, deadline_ns);
        if (st == CERB_OK)
            st = check_meta(e, pg, deadline_ns);
        if (st != CERB_OK) {
            PQfinish(pg);
            return st;
        }
        cerb__mutex_lock(&e->mu);
        e->slots[i].pg = pg;
        e->slots[i].pid = 0; /* behind a pooler, no backend is ours */
        cerb__mutex_unlock(&e->mu);
        atomic_fetch_add_explicit(&e->stats.connects, 1, memory_order_relaxed);
        return CERB_OK;
    }
    /* One string: settings, the PREPAREs (named statements share the
     * protocol's namespace, so PQsendQueryPrepared finds them), and the
     * facts we need, last so its result is the one kept. lock_timeout
     * bounds row-lock waits on the server, at half the client's deadline,
     * so a wait on a row ends with a clean error (the session lives on)
     * rather than a missed deadline (the session ends). synchronous_commit
     * on: a grant is acknowledged only once its commit is in the WAL the
     * server flushes, whatever the server's default (a fence must never
     * go back after a crash). The statements are written for READ
     * COMMITTED (ON CONFLICT judging the latest committed row), whatever
     * the server's default isolation. client_connection_check_interval
     * (PostgreSQL 14 and later): a wait whose client gave it up (its
     * session ended, the cancel could not be sent) leaves the server's
     * queue within a second, instead of being granted later and claiming
     * the row for nobody. */
    size_t len = 256;
    for (int s = 0; s < PG_NSTMT; s++)
        len += strlen(e->sql[s]) + 64;
    char *sql = cerb__malloc(len);
    if (!sql) {
        PQfinish(pg);
        return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    }
    size_t o = (size_t)snprintf(sql, len,
                                "SET lock_timeout = %lld; SET statement_timeout = 0; "
                                "SET idle_in_transaction_session_timeout = 0; "
                                "SET synchronous_commit = on; "
                                "SET default_transaction_isolation = 'read committed'; "
                                "SELECT set_config('client_connection_check_interval', '1000', "
                                "false) WHERE current_setting('server_version_num')::int >= "
                                "140000; ",
                                (long long)(e->pc->op_timeout_ms > 1 ? e->pc->op_timeout_ms / 2 : 1));
    for (int s = 0; s < PG_NSTMT; s++)
        o += (size_t)snprintf(sql + o, len - o, "PREPARE %s AS %s; ", cerb__pg_stmt_names[s],
                              e->sql[s]);
    snprintf(sql + o, len - o, "SELECT pg_backend_pid(), pg_is_in_recovery()");
    st = cerb__pg_exec(pg, -1, sql, 0, NULL, NULL, NULL, deadline_ns, &res, &broken, ss);
    cerb__free(sql);
    if (st != CERB_OK) {
        if (strcmp(ss, "42P01") == 0)
            st = cerb__error_set(CERB_ECONFIG,
                                 "pg: a table of schema %s is missing (cerberus_lock, "
                                 "cerberus_meta): run `cerberus init` with this configuration "
                                 "(docs/engines.md shows its SQL)",
                                 e->schema_q);
        else if (strcmp(ss, "3F000") == 0)
            st = cerb__error_set(CERB_ECONFIG,
                                 "pg: the schema %s (pg.schema) does not exist: create it, then "
                                 "run `cerberus init` with this configuration",
                                 e->schema_q);
        PQfinish(pg);
        return st;
    }
    int pid = PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : 0;
    bool standby = PQntuples(res) == 1 && PQgetvalue(res, 0, 1)[0] == 't';
    PQclear(res);
    if (standby) {
        PQfinish(pg);
        return cerb__error_set(CERB_UNAVAILABLE,
                               "pg: the server is a standby (pg_is_in_recovery()): locks need "
                               "the primary");
    }
    st = check_meta(e, pg, deadline_ns);
    if (st != CERB_OK) {
        PQfinish(pg);
        return st;
    }
    cerb__mutex_lock(&e->mu);
    e->slots[i].pg = pg;
    e->slots[i].pid = pid;
    e->slots[i].gprepared = 0;
    cerb__mutex_unlock(&e->mu);
    atomic_fetch_add_explicit(&e->stats.connects, 1, memory_order_relaxed);
    return CERB_OK;
}

/* Under e->mu: connect empty slot i for the caller (mu is dropped while
 * connecting); on success the slot is BUSY for the caller. */
static cerb_status connect_locked(cerb_engine *e, int i, int64_t deadline_ns)
{
    e->slots[i].state = SLOT_CONNECTING;
    cerb__mutex_unlock(&e->mu);
    cerb_status st = open_slot(e, i, deadline_ns);
    cerb__mutex_lock(&e->mu);
    e->slots[i].state = st == CERB_OK ? SLOT_BUSY : SLOT_EMPTY;
    if (st != CERB_OK)
        cerb__cond_broadcast(&e->cv);
    return st;
}

cerb_status cerb__pg_take_any(cerb_engine *e, int64_t deadline_ns, bool spare, int *slot)
{
    cerb__mutex_lock(&e->mu);
    for (;;) {
        int idle = -1, free_idle = -1, empty = -1;
        for (int i = 0; i < e->nslots; i++) {
            bool open = e->slots[i].state == SLOT_IDLE && e->slots[i].wanted == 0;
            if (open && e->slots[i].holds == 0 && free_idle < 0)
                free_idle = i;
            if (open && idle < 0)
                idle = i;
            else if (e->slots[i].state == SLOT_EMPTY && empty < 0)
                empty = i;
        }
        if (spare && free_idle >= 0)
            idle = free_idle;
        else if (spare && empty >= 0)
            idle = -1; /* connect a spare one rather than risk a pinning one */
        if (idle >= 0) {
            e->slots[idle].state = SLOT_BUSY;
            cerb__mutex_unlock(&e->mu);
            *slot = idle;
            return CERB_OK;
        }
        if (empty >= 0) {
            cerb_status st = connect_locked(e, empty, deadline_ns);
            cerb__mutex_unlock(&e->mu);
            *slot = empty;
            return st;
        }
        if (cerb__cond_wait_until(&e->cv, &e->mu, deadline_ns) != 0 &&
            cerb__ms_left(deadline_ns) <= 0) {
            cerb__mutex_unlock(&e->mu);
            return cerb__error_set(CERB_EIO, "pg: all %d connections (pg.pool) stayed busy",
                                   e->nslots);
        }
    }
}

int cerb__pg_take_waiter(cerb_engine *e, int64_t deadline_ns, cerb_status *st)
{
    int pick = -1;
    *st = CERB_OK;
    cerb__mutex_lock(&e->mu);
    if (e->waiters < e->max_waiters) {
        int empty = -1;
        for (int i = 0; i < e->nslots && pick < 0; i++) {
            if (e->slots[i].state == SLOT_IDLE && e->slots[i].wanted == 0 &&
                e->slots[i].holds == 0)
                pick = i;
            else if (e->slots[i].state == SLOT_EMPTY && empty < 0)
                empty = i;
        }
        /* Counted before connecting (the mutex is dropped meanwhile), so
         * that concurrent waiters never exceed max_waiters. */
        e->waiters++;
        if (pick >= 0) {
            e->slots[pick].state = SLOT_BUSY;
        } else if (empty >= 0) {
            *st = connect_locked(e, empty, deadline_ns);
            pick = *st == CERB_OK ? empty : -1;
        }
        if (pick >= 0)
            e->slots[pick].waiter = true;
        else
            e->waiters--;
    }
    cerb__mutex_unlock(&e->mu);
    return pick;
}

cerb_status cerb__pg_take_slot(cerb_engine *e, int slot, uint64_t gen, int64_t deadline_ns)
{
    if (slot < 0 || slot >= e->nslots)
        return cerb__error_set(CERB_NOT_OWNER, "pg: this hold has no session");
    cerb__mutex_lock(&e->mu);
    struct pg_slot *s = &e->slots[slot];
    cerb_status st = CERB_OK;
    /* Wanted: calls that may take any slot leave this one to us once it
     * is idle (the holds pinned here need it; they could go elsewhere). */
    s->wanted++;
    for (;;) {
        if (s->gen != gen || s->state == SLOT_EMPTY || s->state == SLOT_CONNECTING) {
            st = cerb__error_set(CERB_NOT_OWNER, "pg: the session that held the lock has ended");
            break;
        }
        if (s->state == SLOT_IDLE) {
            s->state = SLOT_BUSY;
            break;
        }
        if (cerb__cond_wait_until(&e->cv, &e->mu, deadline_ns) != 0 &&
            cerb__ms_left(deadline_ns) <= 0) {
            st = cerb__error_set(CERB_EIO, "pg: the lock's connection stayed busy");
            break;
        }
    }
    if (--s->wanted == 0 && s->state == SLOT_IDLE)
        cerb__cond_broadcast(&e->cv); /* others may take it again */
    cerb__mutex_unlock(&e->mu);
    return st;
}

void cerb__pg_give(cerb_engine *e, int slot, bool broken, int hold_delta)
{
    cerb__mutex_lock(&e->mu);
    struct pg_slot *s = &e->slots[slot];
    if (s->waiter) {
        s->waiter = false;
        e->waiters--;
    }
    if (s->doomed && !broken) {
        broken = true;
        CERB_LOG_W("pg: ending a session that may keep a lock nobody holds");
    }
    if (broken) {
        s->doomed = false;
        if (s->holds > 0)
            CERB_LOG_W("pg: a connection pinning %d lock(s) failed; they are lost", s->holds);
        PQfinish(s->pg);
        s->pg = NULL;
        s->pid = 0;
        s->gen++;
        s->holds = 0;
        s->state = SLOT_EMPTY;
        atomic_fetch_add_explicit(&e->stats.broken, 1, memory_order_relaxed);
    } else {
        s->holds += hold_delta;
        if (s->holds < 0)
            s->holds = 0;
        s->state = SLOT_IDLE;
    }
    cerb__cond_broadcast(&e->cv);
    cerb__mutex_unlock(&e->mu);
}

unsigned *cerb__pg_slot_gprepared(cerb_engine *e, int slot) { return &e->slots[slot].gprepared; }

int cerb__pg_slot_holds(cerb_engine *e, int slot)
{
    cerb__mutex_lock(&e->mu);
    int n = e->slots[slot].holds;
    cerb__mutex_unlock(&e->mu);
    return n;
}

void cerb__pg_doom(cerb_engine *e, int slot, uint64_t gen)
{
    cerb__mutex_lock(&e->mu);
    struct pg_slot *s = &e->slots[slot];
    if (s->gen == gen && s->state != SLOT_EMPTY && s->state != SLOT_CONNECTING) {
        if (s->state == SLOT_IDLE) {
            s->state = SLOT_BUSY;
            cerb__mutex_unlock(&e->mu);
            cerb__pg_give(e, slot, true, 0);
            return;
        }
        s->doomed = true;
    }
    cerb__mutex_unlock(&e->mu);
}

void cerb__pg_pool_close(cerb_engine *e)
{
    for (int i = 0; e->slots && i < e->nslots; i++)
        if (e->slots[i].pg)
            PQfinish(e->slots[i].pg);
    cerb__free(e->slots);
    e->slots = NULL;
}
