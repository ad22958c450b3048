/*
 * pg_internal.h — the PostgreSQL engine instance and what its files share.
 *
 * Layout (DESIGN.md §4): a session advisory lock excludes and queues, and a
 * row per name in <schema>.cerberus_lock, never deleted, carries the fence,
 * the owner token, the holder's backend pid and a lease on the server's
 * clock. The advisory lock makes waiting cheap (the server wakes the next
 * waiter inside its own call) and frees a name the moment its holder's
 * session ends; the row makes the grant fenced and lets a waiter that got
 * the advisory lock of a holder whose session died (a partition) wait out
 * the lease that holder may still believe in.
 *
 * Connections. A session lock belongs to the connection that took it, so
 * every hold is pinned to one slot of a small pool (pg.pool connections);
 * its renewal and release run there. A slot is used by one thread at a
 * time, for one statement (short), except a waiter's: a blocking wait runs
 * only on a slot that pins no hold, so no renewal ever queues behind a wait.
 * A slot whose statement failed on the wire or timed out is closed at once
 * (its session, and every session lock of it, ends) and its generation
 * bumped: the holds pinned to the old generation learn at their next
 * renewal that they are gone (CERB_NOT_OWNER), which their lease rows make
 * safe — nobody can claim a row before its lease runs out on the server.
 *
 * Lease mode (pg.mode = "lease", for a transaction-pooling proxy, where a
 * session is no longer ours from one transaction to the next): the row
 * alone, claimed and renewed by its owner token on any connection, no
 * session lock, no pinning, no prepared statement and no session setting
 * (each statement is sent with its text and its parameters); a waiter
 * polls, bounded by what the server says is left of the holder's lease.
 *
 * Files: pg_conn.c (connect, one statement with a deadline, the pool),
 * pg_key.c (name → advisory key), pg_sql.c (the statements), pg_lock.c
 * (acquire, renew, release, check, held), pg_store.c (`cerberus init`: the
 * tables), pg_engine.c (the table, open, close, probe).
 */
#ifndef CERB_PG_INTERNAL_H
#define CERB_PG_INTERNAL_H

#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "sync.h"

/* A blocked waiter looks at its interrupt flag this often, and waits in
 * one statement for at most PG_WAIT_MAX_MS (then queues again). */
#define PG_SLICE_MS 200
#define PG_WAIT_MAX_MS 60000
/* ... and at most this often whether the holder is hung (PG_EVICT). */
#define PG_EVICT_EVERY_MS 1000

/* The advisory key of a name: one bigint, or two ints (a separate key
 * space on the server, DistributedLock's "XXXXXXXX,XXXXXXXX" and tooz). */
struct pg_key {
    int64_t k;     /* the bigint; for a pair, k1 << 32 | (uint32)k2 */
    bool pair;
    int32_t k1, k2;
};

/* Statements, prepared on every connection (pg_sql.c). */
enum pg_stmt {
    PG_TRY,       /* try the session lock, claim the row */
    PG_WAIT,      /* wait for the session lock, claim the row */
    PG_REWAIT,    /* the same after a wait that timed out */
    PG_CLAIM,     /* claim the row only (lease mode, after a hand-off wait) */
    PG_UNLOCK,    /* give a session lock back without a row */
    PG_RELEASE,   /* free the row and the session lock */
    PG_RENEW,     /* extend one lease of this session */
    PG_RENEW_N,   /* extend many leases of this session */
    PG_CHECK,     /* the row of a token */
    PG_DROP,      /* free a row whose session is gone */
    PG_HELD,      /* is a name held or waited for */
    PG_PROBE,     /* the lock path answers, on a primary */
    PG_EVICT,     /* end a hung holder's session */
    PG_CANCEL,    /* cancel a waiter's statement (another session of ours) */
    PG_INSPECT,   /* the holder and the waiters of a name */
    PG_RELEASE_N, /* lease mode: free the row and NOTIFY its waiters */
    PG_NSTMT
};

enum pg_slot_state { SLOT_EMPTY = 0, SLOT_CONNECTING, SLOT_IDLE, SLOT_BUSY };

struct pg_slot {
    PGconn *pg;
    int pid;                 /* pg_backend_pid() of the session */
    uint64_t gen;            /* bumped every time the session ends */
    int holds;               /* holds pinned here */
    enum pg_slot_state state;
    bool waiter;             /* busy in a blocking wait */
    int wanted;              /* calls waiting for this very slot */
    bool doomed;             /* a session lock may be left behind here: end
                                the session when the slot is next given back */
    unsigned gprepared;      /* guard statements prepared on this session
                                (bit per statement; pg_guard.c), its owner's */
};

struct cerb_engine {
    const struct cerb_config *cfg;
    const struct cerb_pg_config *pc;
    cerb_engine_env env;
    char *password;          /* from pg.password_file, or NULL */
    char schema_q[140];      /* the schema as a quoted identifier */
    char *sql[PG_NSTMT];     /* statement texts, schema spliced in */
    cerb_mutex mu;           /* the pool */
    cerb_cond cv;            /* a slot became idle or empty */
    struct pg_slot *slots;
    int nslots;
    int waiters;             /* slots busy in a blocking wait */
    int max_waiters;
    char probe_name[64];
    struct {
        atomic_uint_fast64_t acquire_calls;
        atomic_uint_fast64_t wakeups;
        atomic_uint_fast64_t connects;
        atomic_uint_fast64_t broken;
        atomic_uint_fast64_t evictions;
    } stats;
    atomic_bool evict_refused;  /* said once: no privilege to evict */
    char *meta_sql;             /* cerb__pg_sql_meta */
    struct pg_listener *lis;    /* lease mode with pg.notify_conninfo */
    atomic_int_fast64_t max_lease_ms; /* the longest lease granted here */
};

/* Per hold (lk->priv): the slot (and its generation) holding the session
 * lock, the key, and the fence granted. */
struct pg_lock_priv {
    int slot;                /* -1: none */
    uint64_t gen;
    struct pg_key key;
    uint64_t fence;
    bool row_only;           /* lease mode: held by the row alone, no slot */
};

/* ---- pg_key.c ---- */
/* The advisory key of `name` in key mode `mode` (pg.key). CERB_EINVAL when
 * the mode cannot map the name ("int" and a name that is no integer). */
cerb_status cerb__pg_key(const char *mode, const char *name, struct pg_key *out);

/* ---- pg_sql.c ---- */
cerb_status cerb__pg_sql_build(cerb_engine *e);
void cerb__pg_sql_free(cerb_engine *e);
/* The CREATE statements for the schema (quoted), cerb__malloc'd. */
char *cerb__pg_sql_create(const char *schema_q);
/* The failover check of a new session (pg_sql.c says how), cerb__malloc'd. */
char *cerb__pg_sql_meta(const char *schema_q);
char *cerb__pg_sql_meta_init(const char *schema_q);
/* Quote `schema` (already checked against the identifier pattern). */
void cerb__pg_quote_ident(const char *id, char *out, size_t len);
extern const char *const cerb__pg_stmt_names[PG_NSTMT];

/* ---- pg_conn.c ---- */
/* Open one session with the configured settings (no statements prepared). */
cerb_status cerb__pg_connect_raw(const struct cerb_pg_config *pc, const char *password,
                                 int64_t deadline_ns, PGconn **out);
/* The same to another connection string (pg.notify_conninfo). */
cerb_status cerb__pg_connect_to(const char *conninfo, const char *password, int64_t deadline_ns,
                                PGconn **out);
/* One statement (prepared `stmt`, or the text `sql` when stmt < 0) on a
 * connection, bounded by deadline_ns. Parameters are text except those
 * whose format is 1 (binary). On success *res holds the result (the caller
 * PQclear()s it). Errors: CERB_EIO with *broken = true when the session
 * can no longer be trusted (no answer in time, wire failure, server gone),
 * outcome UNKNOWN when the request may have run; an SQL error (the session
 * stays usable) gives its status with the SQLSTATE in *sqlstate. */
cerb_status cerb__pg_exec(PGconn *pg, int stmt, const char *sql, int n, const char *const *vals,
                          const int *lens, const int *fmts, int64_t deadline_ns, PGresult **res,
                          bool *broken, char sqlstate[6]);
/* Called every every_ms while a statement waits for its answer (a long
 * wait): false gives the statement up (its session is then ended and the
 * call returns CERB_INTERRUPTED with *broken set). */
struct pg_tick {
    int64_t every_ms;
    bool (*fn)(void *ud);
    void *ud;
};
cerb_status cerb__pg_exec_tick(PGconn *pg, int stmt, const char *sql, int n,
                               const char *const *vals, const int *lens, const int *fmts,
                               int64_t deadline_ns, PGresult **res, bool *broken, char sqlstate[6],
                               const struct pg_tick *tick);
/* One statement prepared on the session under `name` (PREPARE). */
cerb_status cerb__pg_exec_prepared(PGconn *pg, const char *name, int n, const char *const *vals,
                                   const int *lens, const int *fmts, int64_t deadline_ns,
                                   PGresult **res, bool *broken, char sqlstate[6]);
/* The guard-statement bits of a slot the caller has taken. */
unsigned *cerb__pg_slot_gprepared(cerb_engine *e, int slot);
/* Pool (all under e->mu inside). A slot for one statement; with spare,
 * rather one that pins no hold (probes, checks: a statement that times out
 * ends its session, and should not take holds with it). */
cerb_status cerb__pg_take_any(cerb_engine *e, int64_t deadline_ns, bool spare, int *slot);
/* Mark a slot whose session may keep a session lock nobody owns: it is
 * ended when next given back (or at once when idle). */
void cerb__pg_doom(cerb_engine *e, int slot, uint64_t gen);
/* How many holds slot pins now. */
int cerb__pg_slot_holds(cerb_engine *e, int slot);
/* The failover check (cerb__pg_sql_meta) on a session; *broken when the
 * session failed on the wire. */
cerb_status cerb__pg_check_meta(cerb_engine *e, PGconn *pg, int64_t deadline_ns, bool *broken);
/* A slot for a blocking wait: pins no hold. -1 when none may be had now. */
int cerb__pg_take_waiter(cerb_engine *e, int64_t deadline_ns, cerb_status *st);
/* The slot of a hold, when its session is still the one it was. */
cerb_status cerb__pg_take_slot(cerb_engine *e, int slot, uint64_t gen, int64_t deadline_ns);
/* Give a slot back; with broken, end its session first. hold_delta
 * changes its pin count (+1 a grant, -1 a release). */
void cerb__pg_give(cerb_engine *e, int slot, bool broken, int hold_delta);
void cerb__pg_pool_close(cerb_engine *e);

/* ---- pg_lock.c ---- */
cerb_status cerb__pg_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__pg_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__pg_op_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n);
cerb_status cerb__pg_op_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__pg_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__pg_op_held(cerb_engine *e, const char *name);
cerb_status cerb__pg_op_probe(cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__pg_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

/* ---- pg_notify.c: lease mode's waiters woken by NOTIFY ---- */
/* The NOTIFY channel of releases in lease mode; payload: the name, hex. */
#define PG_NOTIFY_CHANNEL "cerberus_release"
struct pg_waiter {
    struct pg_waiter *next;
    const char *hex;   /* the name waited for, hex */
    bool woken;
};
/* Start the listener when lease mode has pg.notify_conninfo (else none). */
cerb_status cerb__pg_listener_start(cerb_engine *e);
void cerb__pg_listener_stop(cerb_engine *e);
/* Is a listener connected now (so a waiter may nap long)? */
bool cerb__pg_listener_live(cerb_engine *e);
/* Register w before looking at the row (LISTEN, then look, then wait),
 * wait until a release of its name (true), the listener's loss (true) or
 * ms (false); remove. Without a listener the wait is a nap. */
void cerb__pg_waiter_add(cerb_engine *e, struct pg_waiter *w);
bool cerb__pg_waiter_wait(cerb_engine *e, struct pg_waiter *w, int64_t ms);
void cerb__pg_waiter_remove(cerb_engine *e, struct pg_waiter *w);

/* ---- pg_store.c ---- */
extern const struct cerb_store_ops cerb__pg_store_ops;

/* ---- pg_guard.c: the idempotency guard's records (DESIGN.md §11) ---- */
cerb_status cerb__pg_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant,
                                 void **result, size_t *result_len);
cerb_status cerb__pg_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *grant);
cerb_status cerb__pg_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int succeeded,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *outcome);
cerb_status cerb__pg_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                 cerb_guard_found *found);

#endif
