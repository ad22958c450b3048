/*
 * pg_engine.c — the "pg" engine table (PostgreSQL through libpq), and the
 * glue that opens and closes an instance, reports its counters and says
 * what it cannot do.
 *
 * open() reads the password file, connects the first pooled session
 * (which prepares every statement, so a missing table fails here with the
 * SQL to run, and a standby is refused), then checks that the session is
 * the same backend from one transaction to the next: a transaction-pooling
 * proxy (PgBouncer's pool_mode = transaction) hands each transaction to
 * whichever backend is free, and a session lock taken through it stays on
 * a backend we no longer talk to. Such a proxy is refused with the reason;
 * under-locking silently is never an option.
 */
#include "internal_posix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "pg_internal.h"

static void pg_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__pg_listener_stop(e);
    cerb__pg_pool_close(e);
    cerb__pg_sql_free(e);
    cerb__config_free_secret(e->password);
    cerb__cond_destroy(&e->cv);
    cerb__mutex_destroy(&e->mu);
    cerb__free(e);
}

/* Two transactions on one session must see one backend. */
static cerb_status check_pooler(cerb_engine *e, int slot)
{
    int pids[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        PGresult *res = NULL;
        bool broken = false;
        char ss[6];
        cerb_status st = cerb__pg_exec(e->slots[slot].pg, -1, "SELECT pg_backend_pid()", 0, NULL,
                                       NULL, NULL, cerb__deadline_in(e->pc->op_timeout_ms), &res,
                                       &broken, ss);
        if (st != CERB_OK) {
            cerb__pg_give(e, slot, broken, 0);
            return st;
        }
        pids[i] = PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : 0;
        PQclear(res);
    }
    int first = e->slots[slot].pid;
    cerb__pg_give(e, slot, false, 0);
    if (pids[0] != first || pids[1] != first)
        return cerb__error_set(
            CERB_ECONFIG,
            "pg: the server's backend changed between transactions (pids %d, %d, %d): a "
            "transaction-pooling proxy is in between, where a session lock stays on a backend "
            "this client no longer talks to; connect to PostgreSQL directly (or through "
            "session pooling), or set pg.mode = \"lease\"",
            first, pids[0], pids[1]);
    return CERB_OK;
}

static cerb_status pg_open(const cerb_engine_env *env, cerb_engine **out)
{
    *out = NULL;
    if (!env || !env->cfg)
        return cerb__error_set(CERB_EINVAL, "pg: no configuration");
    const struct cerb_pg_config *pc = &env->cfg->pg;
    if (pc->mode == CERB_SQL_ADVISORY)
        return cerb__error_set(CERB_ECONFIG,
                               "pg: pg.mode = \"advisory\" is not available yet; use "
                               "\"hybrid\" (or \"lease\" behind a transaction pooler)");
    cerb_engine *e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    e->cfg = env->cfg;
    e->pc = pc;
    e->env = *env;
    cerb__mutex_init(&e->mu);
    cerb__cond_init(&e->cv);
    snprintf(e->probe_name, sizeof e->probe_name, "__cerberus_probe__");
    cerb__pg_quote_ident(pc->schema, e->schema_q, sizeof e->schema_q);
    e->nslots = pc->pool;
    e->max_waiters = pc->pool - 1;
    e->slots = cerb__calloc((size_t)e->nslots, sizeof *e->slots);
    cerb_status st = e->slots ? CERB_OK : cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    if (st == CERB_OK && pc->password_file && pc->password_file[0])
        st = cerb__config_read_secret("pg", pc->password_file, &e->password);
    if (st == CERB_OK)
        st = cerb__pg_sql_build(e);
    int slot = -1;
    if (st == CERB_OK)
        st = cerb__pg_take_any(e, cerb__deadline_in(pc->connect_timeout_ms + pc->op_timeout_ms),
                               true, &slot);
    if (st == CERB_OK && pc->mode == CERB_SQL_HYBRID)
        st = check_pooler(e, slot);
    else if (st == CERB_OK)
        cerb__pg_give(e, slot, false, 0);
    if (st == CERB_OK)
        st = cerb__pg_listener_start(e);
    if (st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        pg_close(e);
        return cerb__error_set(st, "%s", why);
    }
    CERB_LOG_D("pg: engine open (schema %s, pool %d, key %s)", e->schema_q, e->nslots, pc->key);
    *out = e;
    return CERB_OK;
}

static cerb_status pg_probe(cerb_engine *e, int64_t timeout_ms)
{
    return cerb__pg_op_probe(e, timeout_ms);
}

static void pg_stats(cerb_engine *e, struct cerb_engine_stats *out)
{
    out->acquire_calls = atomic_load_explicit(&e->stats.acquire_calls, memory_order_relaxed);
    out->wakeups = atomic_load_explicit(&e->stats.wakeups, memory_order_relaxed);
    out->handoffs = 0; /* a release only unlocks; the server wakes the next waiter */
}

const struct cerb_engine_ops cerb__pg_engine_ops = {
    .version = CERB_ENGINE_OPS_V3,
    .name = "pg",
    .caps = CERB_CAP_FENCING | CERB_CAP_WAIT | CERB_CAP_CROSS_PROCESS | CERB_CAP_BATCH_RENEW |
            CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct pg_lock_priv),
    .open = pg_open,
    .close = pg_close,
    .acquire = cerb__pg_op_acquire,
    .renew = cerb__pg_op_renew,
    .release = cerb__pg_op_release,
    .check_owner = cerb__pg_op_check,
    .probe = pg_probe,
    .renew_batch = cerb__pg_op_renew_batch,
    .stats = pg_stats,
    .held = cerb__pg_op_held,
    /* version 2: the idempotency guard (pg_guard.c) */
    .guard_begin = cerb__pg_guard_begin,
    .guard_renew = cerb__pg_guard_renew,
    .guard_finish = cerb__pg_guard_finish,
    .guard_check = cerb__pg_guard_check,
    /* version 3: inspection (pg_lock.c) */
    .inspect = cerb__pg_op_inspect,
};
