/*
 * my_internal.h — the MySQL/MariaDB engine instance and what its files share.
 *
 * Layout (DESIGN.md §4, notes/stores.md §5.2): GET_LOCK(lname) excludes and
 * queues, and a row per name in <database>.cerberus_lock, never deleted,
 * carries the fence, the owner token, the holder's CONNECTION_ID() and a
 * lease on the server's clock (UTC_TIMESTAMP(6)). GET_LOCK makes waiting
 * cheap (the server wakes a waiter inside its own call) and frees a name the
 * moment its holder's session ends; the row makes the grant fenced and lets
 * a waiter that got the GET_LOCK of a holder whose session died (a
 * partition) wait out the lease that holder may still believe in.
 *
 * Connections (as engine_pg): a GET_LOCK belongs to the session that took
 * it, so every hold is pinned to one slot of a pool (mysql.pool
 * connections); its renewal and release run there. A slot is used by one
 * thread at a time, for one statement, except a waiter's: a blocking wait
 * (one GET_LOCK for the whole deadline, watched by a tick that cancels it
 * with KILL QUERY and evicts hung holders with KILL CONNECTION, both from a
 * spare session) runs only on a slot that pins no hold. A slot whose statement failed on
 * the wire or missed its deadline is closed at once (its session, and every
 * GET_LOCK of it, ends) and its generation bumped: the holds pinned to the
 * old generation learn at their next renewal that they are gone.
 *
 * GET_LOCK stacks per session (MariaDB >= 10.0, MySQL >= 5.7): a second
 * GET_LOCK of a name the session holds succeeds and needs a second
 * RELEASE_LOCK. So a try never runs on a slot that pins a hold of the same
 * GET_LOCK name (struct my_slot.lnames), and a waiter's slot drops whatever
 * it holds (RELEASE_ALL_LOCKS) before it waits.
 *
 * Files: my_conn.c (connect, one statement with a deadline, the pool),
 * my_key.c (name -> GET_LOCK name), my_sql.c (the statements), my_lock.c
 * (acquire, renew, release, check, held, probe), my_store.c (`cerberus
 * init`), my_engine.c (the table, open, close).
 */
#ifndef CERB_MY_INTERNAL_H
#define CERB_MY_INTERNAL_H

#include <mysql.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "sync.h"

/* A blocked waiter looks at its interrupt flag this often, and waits in
 * one GET_LOCK for at most MY_WAIT_MAX_MS (then queues again). */
#define MY_SLICE_MS 200
#define MY_WAIT_MAX_MS 60000
/* ... and at most this often whether the holder is hung (MY_EVICT). */
#define MY_EVICT_EVERY_MS 1000
/* Names a wait recently found held: a blocking acquire of one of them
 * queues at once instead of trying first (my_lock.c, queue_first). */
#define MY_RECENT 16
/* GET_LOCK names: at most 64 characters (MySQL >= 5.7, MariaDB). */
#define MY_LNAME_MAX 64
/* Renewals of one connection go in statements of this many holds. */
#define MY_RENEW_CHUNK 64
/* The most values a statement binds (a renewal: the lease, then pairs). */
#define MY_MAX_VALUES (1 + 2 * MY_RENEW_CHUNK)

/* Statements, prepared on every connection (my_sql.c). */
enum my_stmt {
    MY_TRY,        /* claim the row and GET_LOCK(lname, 0), one statement */
    MY_CLAIM,      /* claim the row only (the GET_LOCK is already ours) */
    MY_DIAG,       /* after a claim that matched nothing: why */
    MY_INSERT,     /* create the row of a name (INSERT IGNORE) */
    MY_WAIT,       /* RELEASE_ALL_LOCKS, then GET_LOCK(lname, t): the wait */
    MY_UNLOCK,     /* RELEASE_LOCK(lname) */
    MY_UNLOCK_ALL, /* RELEASE_ALL_LOCKS(): a waiter's slot */
    MY_RELEASE,    /* free the row, then RELEASE_LOCK, one statement */
    MY_RENEW_N,    /* extend up to MY_RENEW_CHUNK leases of this session */
    MY_RENEW_CHK,  /* which of them are still this session's */
    MY_CHECK,      /* the row of a token */
    MY_DROP,       /* free a row whose session is gone */
    MY_HELD,       /* is a name held */
    MY_PROBE,      /* the lock path answers, on a writable server */
    MY_EVICT,      /* the session of a hung holder, if there is one */
    MY_RENEW_NL,   /* lease mode: MY_RENEW_N by token alone */
    MY_RENEW_CHKL, /* lease mode: MY_RENEW_CHK by token alone */
    MY_META_FAST,  /* the failover check: epoch and record both as they should be */
    MY_META_BOOT,  /* ... the boot epoch, made if missing */
    MY_META_ROW,   /* ... the record, made (with no identity) if missing */
    MY_META_BUMP,  /* ... moved to this server when it is of another */
    MY_META_SEEN,  /* ... this server's identity and the record's base */
    MY_NSTMT
};

/* The guard's statements (my_guard.c), prepared on a slot the first time
 * it runs one: a database without cerberus_guard still takes locks. */
enum my_gstmt {
    MYG_BEGIN, MYG_SEEN, MYG_RENEW, MYG_DONE, MYG_DELETE, MYG_DROP, MYG_CHECK,
    MYG_SWEEP_LIST, MYG_SWEEP, MYG_N
};

/* What the server is, which decides its identity (cerb__my_ident_expr). */
enum my_kind {
    MY_KIND_MARIADB = 0,
    MY_KIND_MYSQL,
    MY_KIND_GALERA_MARIADB, /* lease mode only */
    MY_KIND_GALERA_MYSQL,   /* lease mode only (Percona XtraDB Cluster) */
    MY_KIND_GROUP           /* multi-primary Group Replication, lease mode only */
};

enum my_slot_state { SLOT_EMPTY = 0, SLOT_CONNECTING, SLOT_IDLE, SLOT_BUSY };

struct my_slot {
    MYSQL *my;
    MYSQL_STMT *st[MY_NSTMT];
    MYSQL_STMT *gst[MYG_N];  /* guard statements, prepared when first used */
    uint64_t conn_id;        /* CONNECTION_ID() of the session */
    uint64_t gen;            /* bumped every time the session ends */
    int holds;               /* holds pinned here */
    char (*lnames)[MY_LNAME_MAX * 4 + 1]; /* their GET_LOCK names */
    int nl, capl;
    bool pins_all;           /* a name could not be listed: avoid for tries */
    enum my_slot_state state;
    bool waiter;             /* busy in a blocking wait */
    int wanted;              /* calls waiting for this very slot */
};

struct cerb_engine {
    const struct cerb_config *cfg;
    const struct cerb_mysql_config *mc;
    cerb_engine_env env;
    char *password;          /* from mysql.password_file, or NULL */
    char db_q[140];          /* the database as a quoted identifier */
    char *sql[MY_NSTMT];     /* statement texts, database spliced in */
    cerb_mutex mu;           /* the pool */
    cerb_cond cv;            /* a slot became idle or empty */
    struct my_slot *slots;
    int nslots;
    int waiters;             /* slots busy in a blocking wait */
    int max_waiters;
    char probe_name[64];
    bool mariadb;            /* the server is MariaDB (@@version, at open) */
    enum my_kind kind;       /* decides the failover identity (open) */
    bool lease;              /* mysql.mode = "lease": the row alone */
    atomic_int_fast64_t max_lease_ms; /* longest lease granted (the quarantine) */
    struct {
        atomic_uint_fast64_t acquire_calls;
        atomic_uint_fast64_t wakeups;
        atomic_uint_fast64_t connects;
        atomic_uint_fast64_t broken;
        atomic_uint_fast64_t round_trips;
        atomic_uint_fast64_t evictions;
    } stats;
    atomic_bool evict_refused;  /* said once: no privilege to evict */
    /* Under mu; "" is an empty entry, recent_next the next to replace. */
    char recent[MY_RECENT][MY_LNAME_MAX * 4 + 1];
    int recent_next;
};

/* Per hold (lk->priv). */
struct my_lock_priv {
    int slot;                /* -1: none */
    bool row_only;           /* held by its row alone (lease mode) */
    uint64_t gen;
    uint64_t fence;
    char lname[MY_LNAME_MAX * 4 + 1];
};

/* One value bound to a statement. */
enum my_vtype { MV_NULL = 0, MV_STR, MV_BIN, MV_I64, MV_U64, MV_DBL };
struct my_val {
    enum my_vtype t;
    const char *s;           /* MV_STR, MV_BIN */
    unsigned long len;
    int64_t i;               /* MV_I64 */
    uint64_t u;              /* MV_U64 */
    double d;                /* MV_DBL */
};

/* What a statement answered: affected rows and insert id, or rows of up
 * to MY_COLS columns as text (NULL when null[c]). */
#define MY_COLS 5
#define MY_COLW 80
struct my_row {
    char v[MY_COLS][MY_COLW];
    bool null[MY_COLS];
};
struct my_res {
    uint64_t affected;
    uint64_t insert_id;
    struct my_row *rows;     /* cerb__malloc'd; my_res_free */
    int nrows;
};

/* ---- my_key.c ---- */
/* The GET_LOCK name of `name` in key mode `mode` (mysql.key) into out
 * (MY_LNAME_MAX * 4 + 1 bytes). CERB_EINVAL when the mode cannot map it. */
cerb_status cerb__my_lname(const char *mode, const char *name, char *out, size_t len);

/* ---- my_sql.c ---- */
cerb_status cerb__my_sql_build(cerb_engine *e);
void cerb__my_sql_free(cerb_engine *e);
char *cerb__my_sql_create(const char *db_q);
/* `cerberus init`'s statements making the boot epoch and the failover
 * record (";\n" separated), cerb__malloc'd. */
char *cerb__my_sql_meta_init(const char *db_q, enum my_kind kind);
/* The server's identity as an SQL expression ("@D" in it). */
const char *cerb__my_ident_expr(enum my_kind kind);
/* tpl with "@I" replaced by the identity of kind, then "@D" by db_q. */
char *cerb__my_splice_ident(const char *tpl, const char *db_q, enum my_kind kind);
void cerb__my_quote_ident(const char *id, char *out, size_t len);
/* tpl with every "@D" replaced by db_q, cerb__malloc'd (NULL: no memory). */
char *cerb__my_splice(const char *tpl, const char *db_q);

/* ---- my_conn.c ---- */
/* Open one session (non-blocking, found rows, utf8mb4, autocommit,
 * REPEATABLE READ, row-lock waits bounded by the op timeout) within the
 * deadline; nothing prepared. with_db: log into mysql.database. */
cerb_status cerb__my_connect_raw(const struct cerb_mysql_config *mc, const char *password,
                                 bool with_db, int64_t deadline_ns, MYSQL **out);
/* End a session now: the socket is shut first so nothing can block. */
void cerb__my_hangup(MYSQL *my);
/* A text statement without values; rows are returned as for a prepared
 * one. Errors as cerb__my_exec. */
cerb_status cerb__my_query(MYSQL *my, const char *sql, int64_t deadline_ns, struct my_res *res,
                           bool *broken, unsigned *errnum);
/* Prepared statement `st` with values; *broken when the session can no
 * longer be trusted (no answer in time, wire failure): the outcome is then
 * unknown. An SQL error leaves the session usable; *errnum says which. */
cerb_status cerb__my_exec(MYSQL_STMT *st, const struct my_val *vals, int n, int64_t deadline_ns,
                          struct my_res *res, bool *broken, unsigned *errnum);
/* Called every every_ms while a statement waits for its answer (a long
 * wait): false gives the statement up (CERB_INTERRUPTED with *broken set:
 * the caller ends the session, the statement may still run). */
struct my_tick {
    int64_t every_ms;
    bool (*fn)(void *ud);
    void *ud;
};
cerb_status cerb__my_exec_tick(MYSQL_STMT *st, const struct my_val *vals, int n,
                               int64_t deadline_ns, struct my_res *res, bool *broken,
                               unsigned *errnum, const struct my_tick *tick);
/* The same (no tick) with column blob_col of the first row read whole into
 * *blob (cerb__malloc'd, a NUL after its *blob_len bytes; NULL when NULL or
 * no row); res gets the other columns. */
cerb_status cerb__my_exec_blob(MYSQL_STMT *st, const struct my_val *vals, int n,
                               int64_t deadline_ns, struct my_res *res, bool *broken,
                               unsigned *errnum, int blob_col, void **blob, size_t *blob_len);
/* Prepare sql on a session within the deadline (errors as cerb__my_exec). */
cerb_status cerb__my_prepare(MYSQL *my, const char *sql, int64_t deadline_ns, MYSQL_STMT **out,
                             bool *broken, unsigned *errnum);
void cerb__my_res_free(struct my_res *res);
/* Prepare sql, run it once with vals, close it (`cerberus init`). */
cerb_status cerb__my_exec_once(MYSQL *my, const char *sql, const struct my_val *vals, int n,
                               int64_t deadline_ns, struct my_res *res, bool *broken);
/* Pool (under e->mu inside). take_any avoids slots that pin a hold of
 * GET_LOCK name `avoid` (NULL: any); prefer_free picks a slot that pins no
 * hold, connecting one rather than using a slot that pins some. */
cerb_status cerb__my_take_any(cerb_engine *e, const char *avoid, bool prefer_free,
                              int64_t deadline_ns, int *slot);
int cerb__my_take_waiter(cerb_engine *e, int64_t deadline_ns, cerb_status *st);
cerb_status cerb__my_take_slot(cerb_engine *e, int slot, uint64_t gen, int64_t deadline_ns);
/* Give a slot back; with broken, end its session first. pin: the
 * GET_LOCK name of a hold granted here (+1), unpin: of one released. */
void cerb__my_give(cerb_engine *e, int slot, bool broken, const char *pin, const char *unpin);
void cerb__my_pool_close(cerb_engine *e);
/* The slot's prepared statement (the slot is taken by the caller). */
MYSQL_STMT *cerb__my_stmt(cerb_engine *e, int slot, enum my_stmt s);

/* The failover check on slot's session (taken by the caller, or being
 * opened): record this server, raise the base and start a quarantine when
 * the record is of another server or missing. Errors as cerb__my_exec. */
cerb_status cerb__my_check_meta(cerb_engine *e, MYSQL_STMT *const *st, bool *broken,
                                unsigned *errnum);
/* How long grants wait after a failover: the longest lease a hold of
 * this client can have, plus the core's drift (1 % + 2 ms). */
int64_t cerb__my_quarantine_ms(cerb_engine *e);

/* ---- my_engine.c ---- */
/* What the server reached by my is (SHOW GLOBAL VARIABLES): refuse one
 * where GET_LOCK does not exclude unless lease, or one that is read-only;
 * set *kind and *mariadb. */
cerb_status cerb__my_server_kind(const struct cerb_mysql_config *mc, MYSQL *my, bool lease,
                                 enum my_kind *kind, bool *mariadb);

/* ---- my_lock.c ---- */
cerb_status cerb__my_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__my_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__my_op_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n);
cerb_status cerb__my_op_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__my_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__my_op_held(cerb_engine *e, const char *name);
cerb_status cerb__my_op_probe(cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__my_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

/* ---- my_guard.c: the idempotency guard's records (DESIGN.md §11) ---- */
cerb_status cerb__my_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant,
                                 void **result, size_t *result_len);
cerb_status cerb__my_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant);
cerb_status cerb__my_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int succeeded,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *outcome);
cerb_status cerb__my_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                 cerb_guard_found *found);
/* The slot's guard statement g (template tpl), prepared now if need be
 * (the slot is taken by the caller). Errors as cerb__my_exec. */
cerb_status cerb__my_gstmt(cerb_engine *e, int slot, enum my_gstmt g, const char *tpl,
                          MYSQL_STMT **out, bool *broken, unsigned *errnum);

/* ---- my_store.c ---- */
extern const struct cerb_store_ops cerb__my_store_ops;

#endif
