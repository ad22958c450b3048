/*
 * my_conn.c — connections to MySQL/MariaDB: opening one within a deadline,
 * running one statement within a deadline, and the pool of slots that holds
 * pin (my_internal.h says why holds are pinned).
 *
 * Every connection uses Connector/C's non-blocking API (MYSQL_OPT_NONBLOCK,
 * the _start/_cont calls) driven by poll(2) on mysql_get_socket() with the
 * caller's deadline: a paused server accepts bytes and never answers, and
 * the blocking calls would wait for it (MYSQL_OPT_READ_TIMEOUT is in whole
 * seconds and retried by the connector). A statement that gets no answer in
 * time may still run, so its session is ended at once (the socket shut,
 * then mysql_close): its GET_LOCKs die with the session, and no later
 * statement can be mistaken for its answer.
 */
#include "internal_posix.h"

#include <errno.h>
#include <errmsg.h>
#include <mysqld_error.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "my_internal.h"

/* Wait until the connector's wanted events (status) or the deadline.
 * The ready events for _cont, 0 at the deadline, -1 on a socket error. */
static int wait_io(MYSQL *my, int status, int64_t deadline_ns)
{
    int fd = (int)mysql_get_socket(my);
    int64_t lib_ms = -1;
    if (status & MYSQL_WAIT_TIMEOUT)
        lib_ms = (int64_t)mysql_get_timeout_value(my) * 1000;
    if (fd < 0)
        return -1;
    for (;;) {
        int64_t left = cerb__ms_left(deadline_ns);
        if (left <= 0)
            return 0;
        int64_t t = left > 1000 ? 1000 : left;
        if (lib_ms >= 0 && lib_ms < t)
            t = lib_ms;
        struct pollfd p = {.fd = fd, .events = 0};
        if (status & MYSQL_WAIT_READ)
            p.events |= POLLIN;
        if (status & MYSQL_WAIT_WRITE)
            p.events |= POLLOUT;
        if (status & MYSQL_WAIT_EXCEPT)
            p.events |= POLLPRI;
        int r = poll(&p, 1, (int)t);
        if (r > 0) {
            int out = 0;
            if (p.revents & (POLLIN | POLLHUP | POLLERR))
                out |= MYSQL_WAIT_READ;
            if (p.revents & POLLOUT)
                out |= MYSQL_WAIT_WRITE;
            if (p.revents & POLLPRI)
                out |= MYSQL_WAIT_EXCEPT;
            return out ? out : (status & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE));
        }
        if (r < 0 && errno != EINTR)
            return -1;
        if (r == 0 && lib_ms >= 0) {
            if (lib_ms <= t)
                return MYSQL_WAIT_TIMEOUT;
            lib_ms -= t;
        }
    }
}

/* Run a _start/_cont pair to its end or the deadline (then *late). */
#define NB_RUN(my, dl, late, start, cont)                                                         \
    do {                                                                                          \
        int s_ = (start);                                                                         \
        while (s_) {                                                                              \
            int ev = wait_io((my), s_, (dl));                                                     \
            if (ev <= 0) {                                                                        \
                *(late) = true;                                                                   \
                break;                                                                            \
            }                                                                                     \
            s_ = (cont);                                                                          \
        }                                                                                         \
    } while (0)

void cerb__my_hangup(MYSQL *my)
{
    if (!my)
        return;
    int fd = (int)mysql_get_socket(my);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR); /* nothing below can block on it now */
    mysql_close(my);
}

/* Errors after which the session cannot be trusted: the client's own
 * (2000..2999: wire, protocol, out of sync) and the server ending the
 * statement or the session (KILL). */
static bool fatal_errno(unsigned n)
{
    return (n >= 2000 && n < 3000) || n == ER_CONNECTION_KILLED || n == ER_QUERY_INTERRUPTED ||
           n == ER_SERVER_SHUTDOWN || n == ER_NEW_ABORTING_CONNECTION;
}

static cerb_status fail(unsigned n, const char *msg, bool late, bool *broken)
{
    if (late) {
        *broken = true;
        return cerb__error_set(CERB_EIO, "mysql: no answer from the server in time");
    }
    if (fatal_errno(n)) {
        *broken = true;
        return cerb__error_set(CERB_EIO, "mysql: session failed: %s (error %u)", msg, n);
    }
    return cerb__error_set(CERB_EPROTO, "mysql: %s (error %u)", msg, n);
}

void cerb__my_res_free(struct my_res *res)
{
    if (!res)
        return;
    cerb__free(res->rows);
    memset(res, 0, sizeof *res);
}

static cerb_status grow_rows(struct my_res *res, int *cap)
{
    if (res->nrows < *cap)
        return CERB_OK;
    int nc = *cap ? *cap * 2 : 4;
    struct my_row *r = cerb__realloc(res->rows, (size_t)nc * sizeof *r);
    if (!r)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    res->rows = r;
    *cap = nc;
    return CERB_OK;
}

cerb_status cerb__my_query(MYSQL *my, const char *sql, int64_t deadline_ns, struct my_res *res,
                           bool *broken, unsigned *errnum)
{
    int ret = 0;
    bool late = false;
    memset(res, 0, sizeof *res);
    *broken = false;
    *errnum = 0;
    NB_RUN(my, deadline_ns, &late, mysql_real_query_start(&ret, my, sql, strlen(sql)),
           mysql_real_query_cont(&ret, my, ev));
    if (late || ret != 0) {
        *errnum = late ? 0 : mysql_errno(my);
        return fail(*errnum, mysql_error(my), late, broken);
    }
    if (mysql_field_count(my) == 0) {
        res->affected = (uint64_t)mysql_affected_rows(my);
        res->insert_id = (uint64_t)mysql_insert_id(my);
        return CERB_OK;
    }
    MYSQL_RES *r = NULL;
    NB_RUN(my, deadline_ns, &late, mysql_store_result_start(&r, my),
           mysql_store_result_cont(&r, my, ev));
    if (late || !r) {
        *errnum = late ? 0 : mysql_errno(my);
        return fail(*errnum, mysql_error(my), late, broken);
    }
    unsigned nf = mysql_num_fields(r);
    int cap = 0;
    MYSQL_ROW row;
    cerb_status st = CERB_OK;
    while (st == CERB_OK && (row = mysql_fetch_row(r)) != NULL) {
        unsigned long *lens = mysql_fetch_lengths(r);
        st = grow_rows(res, &cap);
        if (st != CERB_OK)
            break;
        struct my_row *o = &res->rows[res->nrows++];
        memset(o, 0, sizeof *o);
        for (unsigned c = 0; c < nf && c < MY_COLS; c++) {
            o->null[c] = row[c] == NULL;
            size_t n = row[c] ? lens[c] : 0;
            if (n >= MY_COLW)
                n = MY_COLW - 1;
            if (n)
                memcpy(o->v[c], row[c], n);
            o->v[c][n] = '\0';
        }
    }
    mysql_free_result(r);
    if (st != CERB_OK)
        cerb__my_res_free(res);
    return st;
}

cerb_status cerb__my_exec(MYSQL_STMT *st, const struct my_val *vals, int n, int64_t deadline_ns,
                          struct my_res *res, bool *broken, unsigned *errnum)
{
    return cerb__my_exec_tick(st, vals, n, deadline_ns, res, broken, errnum, NULL);
}

/* mysql_stmt_execute to its answer or the deadline, calling the tick every
 * tick->every_ms while it waits; *gave_up when the tick said stop. */
static int execute_ticking(MYSQL *my, MYSQL_STMT *st, int64_t deadline_ns,
                           const struct my_tick *tick, bool *late, bool *gave_up)
{
    int ret = 0;
    int64_t next = tick ? cerb_monotime() + tick->every_ms * CERB_NS_PER_MS : 0;
    int s = mysql_stmt_execute_start(&ret, st);
    while (s) {
        int64_t until = tick && next < deadline_ns ? next : deadline_ns;
        int ev = wait_io(my, s, until);
        if (ev == 0 && tick && cerb__ms_left(deadline_ns) > 0) {
            next = cerb_monotime() + tick->every_ms * CERB_NS_PER_MS;
            if (tick->fn(tick->ud))
                continue;
            *gave_up = true;
            break;
        }
        if (ev <= 0) {
            *late = true;
            break;
        }
        s = mysql_stmt_execute_cont(&ret, st, ev);
    }
    return ret;
}

static cerb_status exec_core(MYSQL_STMT *st, const struct my_val *vals, int n,
                             int64_t deadline_ns, struct my_res *res, bool *broken,
                             unsigned *errnum, const struct my_tick *tick, int blob_col,
                             void **blob, size_t *blob_len);

cerb_status cerb__my_exec_tick(MYSQL_STMT *st, const struct my_val *vals, int n,
                               int64_t deadline_ns, struct my_res *res, bool *broken,
                               unsigned *errnum, const struct my_tick *tick)
{
    return exec_core(st, vals, n, deadline_ns, res, broken, errnum, tick, -1, NULL, NULL);
}

cerb_status cerb__my_exec_blob(MYSQL_STMT *st, const struct my_val *vals, int n,
                               int64_t deadline_ns, struct my_res *res, bool *broken,
                               unsigned *errnum, int blob_col, void **blob, size_t *blob_len)
{
    *blob = NULL;
    *blob_len = 0;
    return exec_core(st, vals, n, deadline_ns, res, broken, errnum, NULL, blob_col, blob,
                     blob_len);
}

cerb_status cerb__my_prepare(MYSQL *my, const char *sql, int64_t deadline_ns, MYSQL_STMT **out,
                             bool *broken, unsigned *errnum)
{
    int ret = 0;
    bool late = false;
    *out = NULL;
    *broken = false;
    *errnum = 0;
    MYSQL_STMT *st = mysql_stmt_init(my);
    if (!st)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    NB_RUN(my, deadline_ns, &late, mysql_stmt_prepare_start(&ret, st, sql, strlen(sql)),
           mysql_stmt_prepare_cont(&ret, st, ev));
    if (late || ret != 0) {
        *errnum = late ? 0 : mysql_stmt_errno(st);
        cerb_status rs = fail(*errnum, mysql_stmt_error(st), late, broken);
        mysql_stmt_close(st);
        return rs;
    }
    *out = st;
    return CERB_OK;
}

/* Column c of the row just fetched, whole (len bytes), cerb__malloc'd with
 * a NUL after it. The result is buffered: this reads memory. */
static cerb_status fetch_blob(MYSQL_STMT *st, unsigned c, unsigned long len, void **blob,
                              size_t *blob_len)
{
    unsigned char *b = cerb__malloc((size_t)len + 1);
    if (!b)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    if (len > 0) {
        unsigned long got = 0;
        MYSQL_BIND fb;
        memset(&fb, 0, sizeof fb);
        fb.buffer_type = MYSQL_TYPE_BLOB;
        fb.buffer = b;
        fb.buffer_length = len;
        fb.length = &got;
        if (mysql_stmt_fetch_column(st, &fb, c, 0) != 0 || got != len) {
            cerb__free(b);
            return cerb__error_set(CERB_EPROTO, "mysql: cannot read a result column: %s",
                                   mysql_stmt_error(st));
        }
    }
    b[len] = '\0';
    *blob = b;
    *blob_len = (size_t)len;
    return CERB_OK;
}

static cerb_status exec_core(MYSQL_STMT *st, const struct my_val *vals, int n,
                             int64_t deadline_ns, struct my_res *res, bool *broken,
                             unsigned *errnum, const struct my_tick *tick, int blob_col,
                             void **blob, size_t *blob_len)
{
    MYSQL_BIND pb[MY_MAX_VALUES];
    MYSQL *my = st->mysql;
    int ret = 0;
    bool late = false;
    memset(res, 0, sizeof *res);
    *broken = false;
    *errnum = 0;
    if (!my) {
        *broken = true;
        return cerb__error_set(CERB_EIO, "mysql: the session has ended");
    }
    if (n > (int)(sizeof pb / sizeof pb[0]))
        return cerb__error_set(CERB_EINVAL, "mysql: too many values");
    memset(pb, 0, (size_t)n * sizeof pb[0]);
    for (int i = 0; i < n; i++) {
        const struct my_val *v = &vals[i];
        switch (v->t) {
        case MV_STR:
        case MV_BIN:
            pb[i].buffer_type = v->t == MV_BIN ? MYSQL_TYPE_BLOB : MYSQL_TYPE_STRING;
            pb[i].buffer = (void *)(uintptr_t)v->s;
            pb[i].buffer_length = v->len;
            break;
        case MV_I64:
            pb[i].buffer_type = MYSQL_TYPE_LONGLONG;
            pb[i].buffer = (void *)(uintptr_t)&v->i;
            break;
        case MV_U64:
            pb[i].buffer_type = MYSQL_TYPE_LONGLONG;
            pb[i].buffer = (void *)(uintptr_t)&v->u;
            pb[i].is_unsigned = 1;
            break;
        case MV_DBL:
            pb[i].buffer_type = MYSQL_TYPE_DOUBLE;
            pb[i].buffer = (void *)(uintptr_t)&v->d;
            break;
        case MV_NULL:
        default:
            pb[i].buffer_type = MYSQL_TYPE_NULL;
            break;
        }
    }
    if (n > 0 && mysql_stmt_bind_param(st, pb) != 0)
        return cerb__error_set(CERB_EPROTO, "mysql: cannot bind: %s", mysql_stmt_error(st));
    bool gave_up = false;
    ret = execute_ticking(my, st, deadline_ns, tick, &late, &gave_up);
    if (gave_up) {
        *broken = true; /* the statement may still run: the caller ends the session */
        return cerb__error_set(CERB_INTERRUPTED, "mysql: the statement was given up");
    }
    if (late || ret != 0) {
        *errnum = late ? 0 : mysql_stmt_errno(st);
        return fail(*errnum, mysql_stmt_error(st), late, broken);
    }
    unsigned nf = mysql_stmt_field_count(st);
    if (nf == 0) {
        res->affected = (uint64_t)mysql_stmt_affected_rows(st);
        res->insert_id = (uint64_t)mysql_stmt_insert_id(st);
        return CERB_OK;
    }
    MYSQL_BIND rb[MY_COLS];
    struct my_row cur;
    unsigned long lens[MY_COLS];
    my_bool nulls[MY_COLS];
    if (nf > MY_COLS)
        return cerb__error_set(CERB_EPROTO, "mysql: a statement answered %u columns", nf);
    memset(rb, 0, sizeof rb);
    for (unsigned c = 0; c < nf; c++) {
        rb[c].buffer_type = MYSQL_TYPE_STRING;
        rb[c].buffer = cur.v[c];
        rb[c].buffer_length = MY_COLW - 1;
        rb[c].length = &lens[c];
        rb[c].is_null = &nulls[c];
        if ((int)c == blob_col) {
            /* Fetched whole below, with mysql_stmt_fetch_column. */
            rb[c].buffer_type = MYSQL_TYPE_BLOB;
            rb[c].buffer = NULL;
            rb[c].buffer_length = 0;
        }
    }
    if (mysql_stmt_bind_result(st, rb) != 0)
        return cerb__error_set(CERB_EPROTO, "mysql: cannot bind the result: %s",
                               mysql_stmt_error(st));
    NB_RUN(my, deadline_ns, &late, mysql_stmt_store_result_start(&ret, st),
           mysql_stmt_store_result_cont(&ret, st, ev));
    if (late || ret != 0) {
        *errnum = late ? 0 : mysql_stmt_errno(st);
        return fail(*errnum, mysql_stmt_error(st), late, broken);
    }
    int cap = 0, f;
    cerb_status rs = CERB_OK;
    /* Buffered by store_result: fetching reads memory, no I/O. */
    while (rs == CERB_OK && ((f = mysql_stmt_fetch(st)) == 0 || f == MYSQL_DATA_TRUNCATED)) {
        rs = grow_rows(res, &cap);
        if (rs != CERB_OK)
            break;
        struct my_row *o = &res->rows[res->nrows++];
        memset(o, 0, sizeof *o);
        for (unsigned c = 0; c < nf; c++) {
            o->null[c] = nulls[c] != 0;
            if ((int)c == blob_col) {
                if (res->nrows == 1 && !nulls[c])
                    rs = fetch_blob(st, c, lens[c], blob, blob_len);
                continue;
            }
            size_t l = nulls[c] ? 0 : lens[c];
            if (l >= MY_COLW)
                l = MY_COLW - 1;
            memcpy(o->v[c], cur.v[c], l);
            o->v[c][l] = '\0';
        }
    }
    mysql_stmt_free_result(st);
    if (rs != CERB_OK) {
        cerb__my_res_free(res);
        if (blob && *blob) {
            cerb__free(*blob);
            *blob = NULL;
            *blob_len = 0;
        }
    }
    return rs;
}

cerb_status cerb__my_exec_once(MYSQL *my, const char *sql, const struct my_val *vals, int n,
                               int64_t deadline_ns, struct my_res *res, bool *broken)
{
    int ret = 0;
    bool late = false;
    memset(res, 0, sizeof *res);
    *broken = false;
    MYSQL_STMT *st = mysql_stmt_init(my);
    if (!st)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    NB_RUN(my, deadline_ns, &late, mysql_stmt_prepare_start(&ret, st, sql, strlen(sql)),
           mysql_stmt_prepare_cont(&ret, st, ev));
    cerb_status rs;
    if (late || ret != 0) {
        rs = fail(late ? 0 : mysql_stmt_errno(st), mysql_stmt_error(st), late, broken);
    } else {
        unsigned en = 0;
        rs = cerb__my_exec(st, vals, n, deadline_ns, res, broken, &en);
    }
    /* Closing sends COM_STMT_CLOSE, which has no answer: it cannot wait. */
    mysql_stmt_close(st);
    return rs;
}

cerb_status cerb__my_connect_raw(const struct cerb_mysql_config *mc, const char *password,
                                 bool with_db, int64_t deadline_ns, MYSQL **out)
{
    *out = NULL;
    MYSQL *my = mysql_init(NULL);
    if (!my)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    char init1[96];
    int64_t wait_s = (mc->op_timeout_ms + 999) / 1000;
    snprintf(init1, sizeof init1, "SET SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = %lld",
             (long long)(wait_s < 1 ? 1 : wait_s));
    mysql_options(my, MYSQL_OPT_NONBLOCK, 0);
    mysql_options(my, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    /* REPEATABLE READ: no semi-consistent reads, so a WHERE clause that
     * calls GET_LOCK or RELEASE_LOCK is evaluated once per matching row. */
    mysql_options(my, MYSQL_INIT_COMMAND, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
    mysql_options(my, MYSQL_INIT_COMMAND, init1);
    bool sock = mc->socket && mc->socket[0];
    MYSQL *r = NULL;
    bool late = false;
    NB_RUN(my, deadline_ns, &late,
           mysql_real_connect_start(&r, my, sock ? "localhost" : mc->host, mc->user,
                                    password ? password : "", with_db ? mc->database : NULL,
                                    sock ? 0 : (unsigned)mc->port, sock ? mc->socket : NULL,
                                    CLIENT_FOUND_ROWS),
           mysql_real_connect_cont(&r, my, ev));
    if (late || !r) {
        unsigned n = late ? 0 : mysql_errno(my);
        cerb_status st;
        if (late)
            st = cerb__error_set(CERB_EIO, "mysql: cannot connect: no answer in time");
        else if (n == ER_BAD_DB_ERROR || n == ER_DBACCESS_DENIED_ERROR)
            st = cerb__error_set(CERB_ECONFIG,
                                 "mysql: database `%s` is missing or not accessible to %s (%s): "
                                 "create it, then run `cerberus init` with this configuration",
                                 mc->database, mc->user, mysql_error(my));
        else if (n == ER_ACCESS_DENIED_ERROR || n == ER_ACCESS_DENIED_NO_PASSWORD_ERROR)
            st = cerb__error_set(CERB_ECONFIG, "mysql: cannot log in as %s: %s", mc->user,
                                 mysql_error(my));
        else
            st = cerb__error_set(CERB_EIO, "mysql: cannot connect: %s (error %u)",
                                 mysql_error(my), n);
        cerb__my_hangup(my);
        return st;
    }
    *out = my;
    return CERB_OK;
}

/* ---- the pool ---- */

static void close_slot_locked(struct my_slot *s)
{
    MYSQL *my = s->my;
    s->my = NULL;
    if (my) {
        int fd = (int)mysql_get_socket(my);
        if (fd >= 0)
            shutdown(fd, SHUT_RDWR);
        mysql_close(my); /* detaches the statements: closing them is local */
    }
    for (int i = 0; i < MY_NSTMT; i++) {
        if (s->st[i])
            mysql_stmt_close(s->st[i]);
        s->st[i] = NULL;
    }
    for (int i = 0; i < MYG_N; i++) {
        if (s->gst[i])
            mysql_stmt_close(s->gst[i]);
        s->gst[i] = NULL;
    }
    s->conn_id = 0;
    s->nl = 0;
    s->pins_all = false;
}

/* Open slot i's session: connect, prepare every statement, read the
 * connection id. */
static cerb_status open_slot(cerb_engine *e, int i, int64_t deadline_ns)
{
    MYSQL *my = NULL;
    MYSQL_STMT *st[MY_NSTMT] = {0};
    struct my_res res;
    bool broken = false, late = false;
    unsigned en = 0;
    cerb_status s = cerb__my_connect_raw(e->mc, e->password, true, deadline_ns, &my);
    if (s != CERB_OK)
        return s;
    for (int k = 0; k < MY_NSTMT && s == CERB_OK; k++) {
        int ret = 0;
        st[k] = mysql_stmt_init(my);
        if (!st[k]) {
            s = cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
            break;
        }
        NB_RUN(my, deadline_ns, &late,
               mysql_stmt_prepare_start(&ret, st[k], e->sql[k], strlen(e->sql[k])),
               mysql_stmt_prepare_cont(&ret, st[k], ev));
        if (late || ret != 0) {
            en = late ? 0 : mysql_stmt_errno(st[k]);
            if (en == ER_NO_SUCH_TABLE)
                s = cerb__error_set(CERB_ECONFIG,
                                    "mysql: %s.cerberus_lock, %s.cerberus_meta or "
                                    "%s.cerberus_boot is missing (%s): run `cerberus init` with "
                                    "this configuration (it creates what is missing)",
                                    e->db_q, e->db_q, e->db_q, mysql_stmt_error(st[k]));
            else
                s = fail(en, mysql_stmt_error(st[k]), late, &broken);
        }
    }
    uint64_t id = 0;
    if (s == CERB_OK) {
        s = cerb__my_query(my, "SELECT CONNECTION_ID()", deadline_ns, &res, &broken, &en);
        if (s == CERB_OK) {
            if (res.nrows == 1)
                id = strtoull(res.rows[0].v[0], NULL, 10);
            cerb__my_res_free(&res);
        }
    }
    /* The failover check, before the session's first grant. */
    if (s == CERB_OK)
        s = cerb__my_check_meta(e, st, &broken, &en);
    cerb__mutex_lock(&e->mu);
    struct my_slot *sl = &e->slots[i];
    sl->my = my;
    memcpy(sl->st, st, sizeof st);
    if (s != CERB_OK) {
        close_slot_locked(sl);
    } else {
        sl->conn_id = id;
        sl->nl = 0;
    }
    cerb__mutex_unlock(&e->mu);
    if (s == CERB_OK)
        atomic_fetch_add_explicit(&e->stats.connects, 1, memory_order_relaxed);
    return s;
}

int64_t cerb__my_quarantine_ms(cerb_engine *e)
{
    int64_t q = e->cfg->lock.lease_ms;
    int64_t seen = atomic_load_explicit(&e->max_lease_ms, memory_order_relaxed);
    if (seen > q)
        q = seen;
    return q + q / 100 + 2;
}

/*
 * The failover check (my_sql.c, META_BUMP, says why it is right): when a
 * read finds the epoch and the record of this server, nothing more;
 * else the boot epoch made if missing, the record made (with no identity)
 * if missing, then moved to this server when it is of another; three
 * statements, each atomic on its own, and no grant passes between them (a grant needs the
 * record to carry this server's identity, which only the last one writes).
 */
cerb_status cerb__my_check_meta(cerb_engine *e, MYSQL_STMT *const *st, bool *broken,
                                unsigned *errnum)
{
    struct my_res res;
    int64_t qms = cerb__my_quarantine_ms(e);
    struct my_val q = {.t = MV_I64, .i = qms * 1000};
    bool made = false;
    /* The usual case, read only (no statement for the binary log): the
     * epoch is there and the record is of this server. A snapshot read
     * is enough to skip the rest: every grant checks the record again,
     * with a locking read, and runs this check when it changed. */
    cerb_status rs = cerb__my_exec(st[MY_META_FAST], NULL, 0,
                                   cerb__deadline_in(e->mc->op_timeout_ms), &res, broken, errnum);
    if (rs != CERB_OK)
        return rs;
    bool fine = res.nrows == 1 && strcmp(res.rows[0].v[0], "1") == 0;
    cerb__my_res_free(&res);
    if (fine)
        return CERB_OK;
    static const enum my_stmt steps[3] = {MY_META_BOOT, MY_META_ROW, MY_META_BUMP};
    for (int k = 0; k < 3 && rs == CERB_OK; k++) {
        rs = cerb__my_exec(st[steps[k]], k == 2 ? &q : NULL, k == 2 ? 1 : 0,
                           cerb__deadline_in(e->mc->op_timeout_ms), &res, broken, errnum);
        if (rs != CERB_OK)
            break;
        if (k == 1)
            made = res.affected == 1;
        if (k == 2 && res.affected == 1) {
            struct my_res seen;
            bool b2 = false;
            unsigned en2 = 0;
            char ident[MY_COLW] = "?", base[MY_COLW] = "?";
            if (cerb__my_exec(st[MY_META_SEEN], NULL, 0, cerb__deadline_in(e->mc->op_timeout_ms),
                              &seen, &b2, &en2) == CERB_OK) {
                if (seen.nrows == 1) {
                    snprintf(ident, sizeof ident, "%s", seen.rows[0].v[0]);
                    snprintf(base, sizeof base, "%s", seen.rows[0].v[1]);
                }
                cerb__my_res_free(&seen);
            }
            if (made)
                CERB_LOG_W("mysql: database %s had no record of its server (cerberus_meta): a "
                           "new one, or a restore that lost grants, cannot be told apart, so "
                           "nothing is granted for %lld ms and every fence starts above %s; "
                           "`cerberus init` makes the record on a new server",
                           e->db_q, (long long)qms, base);
            else
                CERB_LOG_W("mysql: the server (%s) is not the one database %s last saw: a "
                           "failover, a restart or a restore may have lost the last grants, so "
                           "nothing is granted for %lld ms and every fence starts above %s",
                           ident, e->db_q, (long long)qms, base);
        }
        cerb__my_res_free(&res);
    }
    return rs;
}

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

static bool pins(const struct my_slot *s, const char *lname)
{
    if (lname && s->pins_all)
        return true;
    for (int k = 0; lname && k < s->nl; k++)
        if (strcmp(s->lnames[k], lname) == 0)
            return true;
    return false;
}

cerb_status cerb__my_take_any(cerb_engine *e, const char *avoid, bool prefer_free,
                              int64_t deadline_ns, int *slot)
{
    char why[CERB_ERROR_MAX];
    cerb__mutex_lock(&e->mu);
    for (;;) {
        int idle = -1, free_idle = -1, empty = -1;
        for (int i = 0; i < e->nslots; i++) {
            struct my_slot *s = &e->slots[i];
            if (s->state == SLOT_IDLE && s->wanted == 0 && !pins(s, avoid)) {
                if (idle < 0)
                    idle = i;
                if (s->holds == 0 && free_idle < 0)
                    free_idle = i;
            } else if (s->state == SLOT_EMPTY && empty < 0) {
                empty = i;
            }
        }
        /* prefer_free: a statement that misses its deadline ends its
         * session and every hold pinned there, so reads that may go
         * slow (checks, probes) go where no hold is, connecting one if
         * need be. */
        int pick = prefer_free ? (free_idle >= 0 ? free_idle : empty >= 0 ? -1 : idle) : idle;
        if (pick >= 0) {
            e->slots[pick].state = SLOT_BUSY;
            cerb__mutex_unlock(&e->mu);
            *slot = pick;
            return CERB_OK;
        }
        if (empty >= 0) {
            cerb_status st = connect_locked(e, empty, deadline_ns);
            cerb__error_copy(why, sizeof why);
            cerb__mutex_unlock(&e->mu);
            *slot = empty;
            return st == CERB_OK ? st : cerb__error_set(st, "%s", why);
        }
        if (cerb__cond_wait_until(&e->cv, &e->mu, deadline_ns) != 0 &&
            cerb__ms_left(deadline_ns) <= 0) {
            cerb__mutex_unlock(&e->mu);
            return cerb__error_set(CERB_EIO, "mysql: all %d connections (mysql.pool) stayed busy",
                                   e->nslots);
        }
    }
}

int cerb__my_take_waiter(cerb_engine *e, int64_t deadline_ns, cerb_status *st)
{
    int pick = -1;
    *st = CERB_OK;
    cerb__mutex_lock(&e->mu);
    if (e->waiters < e->max_waiters) {
        int empty = -1;
        /* Counted before a connect (which drops the mutex), so that
         * max_waiters holds while it runs. */
        e->waiters++;
        for (int i = 0; i < e->nslots && pick < 0; i++) {
            if (e->slots[i].state == SLOT_IDLE && e->slots[i].wanted == 0 &&
                e->slots[i].holds == 0)
                pick = i;
            else if (e->slots[i].state == SLOT_EMPTY && empty < 0)
                empty = i;
        }
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

cerb_status cerb__my_take_slot(cerb_engine *e, int slot, uint64_t gen, int64_t deadline_ns)
{
    if (slot < 0 || slot >= e->nslots)
        return cerb__error_set(CERB_NOT_OWNER, "mysql: this hold has no session");
    cerb__mutex_lock(&e->mu);
    struct my_slot *s = &e->slots[slot];
    cerb_status st = CERB_OK;
    /* Wanted: calls that may take any slot leave this one to us once it
     * is idle (the holds pinned here need it; they could go elsewhere). */
    s->wanted++;
    for (;;) {
        if (s->gen != gen || s->state == SLOT_EMPTY || s->state == SLOT_CONNECTING) {
            st = cerb__error_set(CERB_NOT_OWNER, "mysql: the session that held the lock has ended");
            break;
        }
        if (s->state == SLOT_IDLE) {
            s->state = SLOT_BUSY;
            break;
        }
        if (cerb__cond_wait_until(&e->cv, &e->mu, deadline_ns) != 0 &&
            cerb__ms_left(deadline_ns) <= 0) {
            st = cerb__error_set(CERB_EIO, "mysql: the lock's connection stayed busy");
            break;
        }
    }
    if (--s->wanted == 0 && s->state == SLOT_IDLE)
        cerb__cond_broadcast(&e->cv); /* others may take it again */
    cerb__mutex_unlock(&e->mu);
    return st;
}

MYSQL_STMT *cerb__my_stmt(cerb_engine *e, int slot, enum my_stmt s)
{
    cerb__mutex_lock(&e->mu);
    MYSQL_STMT *st = e->slots[slot].st[s];
    cerb__mutex_unlock(&e->mu);
    return st;
}

cerb_status cerb__my_gstmt(cerb_engine *e, int slot, enum my_gstmt g, const char *tpl,
                          MYSQL_STMT **out, bool *broken, unsigned *errnum)
{
    cerb__mutex_lock(&e->mu);
    MYSQL_STMT *st = e->slots[slot].gst[g];
    MYSQL *my = e->slots[slot].my;
    cerb__mutex_unlock(&e->mu);
    *out = NULL;
    *broken = false;
    *errnum = 0;
    if (!st) {
        char *sql = cerb__my_splice(tpl, e->db_q);
        if (!sql)
            return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
        cerb_status rs = cerb__my_prepare(my, sql, cerb__deadline_in(e->mc->op_timeout_ms), &st,
                                          broken, errnum);
        cerb__free(sql);
        if (rs != CERB_OK)
            return rs;
        cerb__mutex_lock(&e->mu);
        e->slots[slot].gst[g] = st;
        cerb__mutex_unlock(&e->mu);
    }
    *out = st;
    return CERB_OK;
}

void cerb__my_give(cerb_engine *e, int slot, bool broken, const char *pin, const char *unpin)
{
    cerb__mutex_lock(&e->mu);
    struct my_slot *s = &e->slots[slot];
    if (s->waiter) {
        s->waiter = false;
        e->waiters--;
    }
    if (broken) {
        if (s->holds > 0)
            CERB_LOG_W("mysql: a connection pinning %d lock(s) failed; they are lost", s->holds);
        close_slot_locked(s);
        s->gen++;
        s->holds = 0;
        s->state = SLOT_EMPTY;
        atomic_fetch_add_explicit(&e->stats.broken, 1, memory_order_relaxed);
    } else {
        if (unpin) {
            for (int k = 0; k < s->nl; k++) {
                if (strcmp(s->lnames[k], unpin) == 0) {
                    memmove(s->lnames[k], s->lnames[s->nl - 1], sizeof s->lnames[k]);
                    s->nl--;
                    break;
                }
            }
            if (s->holds > 0)
                s->holds--;
        }
        if (pin) {
            if (s->nl == s->capl) {
                int nc = s->capl ? s->capl * 2 : 4;
                void *p = cerb__realloc(s->lnames, (size_t)nc * sizeof *s->lnames);
                if (p) {
                    s->lnames = p;
                    s->capl = nc;
                }
            }
            /* Out of memory: the name cannot be listed, so no try runs on
             * this session again (pins() says yes to every name). */
            if (s->nl < s->capl)
                snprintf(s->lnames[s->nl++], sizeof s->lnames[0], "%s", pin);
            else
                s->pins_all = true;
            s->holds++;
        }
        s->state = SLOT_IDLE;
    }
    cerb__cond_broadcast(&e->cv);
    cerb__mutex_unlock(&e->mu);
}

void cerb__my_pool_close(cerb_engine *e)
{
    for (int i = 0; e->slots && i < e->nslots; i++) {
        close_slot_locked(&e->slots[i]);
        cerb__free(e->slots[i].lnames);
    }
    cerb__free(e->slots);
    e->slots = NULL;
}
