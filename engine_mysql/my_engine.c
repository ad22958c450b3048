/*
 * my_engine.c — the "mysql" engine table (MySQL and MariaDB through MariaDB
 * Connector/C), and the glue that opens and closes an instance, reports its
 * counters and says what it cannot do.
 *
 * open() reads the password file, connects the first pooled session (which
 * prepares every statement, so a missing table fails here naming `cerberus
 * init`), then looks at the server: a read-only server (a replica) is
 * refused, and so, in hybrid mode, is one where GET_LOCK does not
 * exclude: Galera (@@wsrep_on) and multi-primary Group Replication keep
 * GET_LOCK on the node that took it (notes/stores.md §2.10), so two clients
 * on two nodes would both be granted. mysql.mode = "lease" (the row alone,
 * my_lock.c) is the mode for those. What the server is decides the
 * identity the failover check records (my_sql.c, cerb__my_ident_expr).
 */
#include "internal_posix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "my_internal.h"

static void my_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__my_pool_close(e);
    cerb__my_sql_free(e);
    cerb__config_free_secret(e->password);
    cerb__cond_destroy(&e->cv);
    cerb__mutex_destroy(&e->mu);
    cerb__free(e);
}

/* What the server is: refuse one where GET_LOCK does not exclude (unless
 * in lease mode), or that is read-only; its kind decides its identity. */
cerb_status cerb__my_server_kind(const struct cerb_mysql_config *mc, MYSQL *my, bool lease,
                                 enum my_kind *kind, bool *mariadb)
{
    struct my_res res;
    bool broken = false;
    unsigned en = 0;
    int64_t opd = cerb__deadline_in(mc->op_timeout_ms);
    cerb_status st = cerb__my_query(
        my,
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('wsrep_on', "
        "'group_replication_single_primary_mode', 'group_replication_group_name', "
        "'version', 'read_only')",
        opd, &res, &broken, &en);
    if (st != CERB_OK)
        return st;
    char version[80] = "", gr_group[80] = "";
    bool wsrep = false, gr_multi = false, ro = false;
    for (int r = 0; r < res.nrows; r++) {
        const char *k = res.rows[r].v[0], *v = res.rows[r].v[1];
        bool on = strcasecmp(v, "ON") == 0 || strcmp(v, "1") == 0;
        if (strcasecmp(k, "wsrep_on") == 0)
            wsrep = on;
        else if (strcasecmp(k, "group_replication_single_primary_mode") == 0)
            gr_multi = !on;
        else if (strcasecmp(k, "group_replication_group_name") == 0)
            snprintf(gr_group, sizeof gr_group, "%s", v);
        else if (strcasecmp(k, "version") == 0)
            snprintf(version, sizeof version, "%s", v);
        else if (strcasecmp(k, "read_only") == 0)
            ro = on;
    }
    cerb__my_res_free(&res);
    if (gr_multi && gr_group[0]) {
        /* Multi-primary mode configured: refuse when the group runs. */
        st = cerb__my_query(my,
                            "SELECT COUNT(*) FROM performance_schema.replication_group_members "
                            "WHERE MEMBER_STATE = 'ONLINE'",
                            opd, &res, &broken, &en);
        if (st != CERB_OK && broken)
            return st;
        gr_multi = st == CERB_OK && res.nrows == 1 && atoi(res.rows[0].v[0]) > 0;
        cerb__my_res_free(&res);
    } else {
        gr_multi = false;
    }
    *mariadb = strstr(version, "MariaDB") != NULL;
    if ((wsrep || gr_multi) && !lease)
        return cerb__error_set(
            CERB_ECONFIG,
            "mysql: the server is %s, where GET_LOCK is held on one node only and does not "
            "exclude clients of the other nodes; mysql.mode = \"hybrid\" cannot be safe there. "
            "Use mysql.mode = \"lease\" (the row alone)",
            wsrep ? "a Galera node (@@wsrep_on = ON)" : "in multi-primary Group Replication");
    if (ro)
        return cerb__error_set(CERB_UNAVAILABLE,
                               "mysql: the server is read-only (@@read_only): locks need the "
                               "primary");
    *kind = wsrep ? (*mariadb ? MY_KIND_GALERA_MARIADB : MY_KIND_GALERA_MYSQL)
            : gr_multi ? MY_KIND_GROUP
            : *mariadb ? MY_KIND_MARIADB
                       : MY_KIND_MYSQL;
    CERB_LOG_D("mysql: server version %s", version);
    return CERB_OK;
}

static cerb_status my_open(const cerb_engine_env *env, cerb_engine **out)
{
    *out = NULL;
    if (!env || !env->cfg)
        return cerb__error_set(CERB_EINVAL, "mysql: no configuration");
    const struct cerb_mysql_config *mc = &env->cfg->mysql;
    if (mc->mode == CERB_SQL_ADVISORY)
        return cerb__error_set(CERB_ECONFIG,
                               "mysql: mysql.mode = \"advisory\" is not available; use "
                               "\"hybrid\" or \"lease\"");
    cerb_engine *e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    e->cfg = env->cfg;
    e->mc = mc;
    e->env = *env;
    e->lease = mc->mode == CERB_SQL_LEASE;
    cerb__mutex_init(&e->mu);
    cerb__cond_init(&e->cv);
    snprintf(e->probe_name, sizeof e->probe_name, "__cerberus_probe__");
    cerb__my_quote_ident(mc->database, e->db_q, sizeof e->db_q);
    e->nslots = mc->pool;
    e->max_waiters = e->lease ? 0 : mc->pool - 1;
    e->slots = cerb__calloc((size_t)e->nslots, sizeof *e->slots);
    cerb_status st = e->slots ? CERB_OK : cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    if (st == CERB_OK && mc->password_file && mc->password_file[0])
        st = cerb__config_read_secret("mysql", mc->password_file, &e->password);
    /* What the server is decides the statements (its identity), so it is
     * asked on a session of its own first. */
    MYSQL *my = NULL;
    if (st == CERB_OK)
        st = cerb__my_connect_raw(mc, e->password, true,
                                  cerb__deadline_in(mc->connect_timeout_ms), &my);
    if (st == CERB_OK)
        st = cerb__my_server_kind(mc, my, e->lease, &e->kind, &e->mariadb);
    cerb__my_hangup(my);
    if (st == CERB_OK)
        st = cerb__my_sql_build(e);
    int slot = -1;
    /* The first pooled session prepares every statement (a missing table
     * fails here, naming `cerberus init`) and runs the failover check. */
    if (st == CERB_OK)
        st = cerb__my_take_any(e, NULL, false,
                               cerb__deadline_in(mc->connect_timeout_ms + mc->op_timeout_ms),
                               &slot);
    if (st == CERB_OK)
        cerb__my_give(e, slot, false, NULL, NULL);
    if (st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        my_close(e);
        return cerb__error_set(st, "%s", why);
    }
    CERB_LOG_D("mysql: engine open (database %s, pool %d, key %s, mode %s)", e->db_q, e->nslots,
               mc->key, e->lease ? "lease" : "hybrid");
    *out = e;
    return CERB_OK;
}

static cerb_status my_probe(cerb_engine *e, int64_t timeout_ms)
{
    return cerb__my_op_probe(e, timeout_ms);
}

static void my_stats(cerb_engine *e, struct cerb_engine_stats *out)
{
    out->acquire_calls = atomic_load_explicit(&e->stats.acquire_calls, memory_order_relaxed);
    out->wakeups = atomic_load_explicit(&e->stats.wakeups, memory_order_relaxed);
    out->handoffs = 0; /* a release only unlocks; the server wakes the next waiter */
}

static cerb_status my_check_name(const char *name)
{
    /* Every name maps with "dl"; "raw" is checked per name at acquire
     * (this has no instance, so no mysql.key). */
    (void)name;
    return CERB_OK;
}

const struct cerb_engine_ops cerb__my_engine_ops = {
    .version = CERB_ENGINE_OPS_V3,
    .name = "mysql",
    .caps = CERB_CAP_FENCING | CERB_CAP_WAIT | CERB_CAP_CROSS_PROCESS | CERB_CAP_BATCH_RENEW |
            CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct my_lock_priv),
    .open = my_open,
    .close = my_close,
    .acquire = cerb__my_op_acquire,
    .renew = cerb__my_op_renew,
    .release = cerb__my_op_release,
    .check_owner = cerb__my_op_check,
    .probe = my_probe,
    .renew_batch = cerb__my_op_renew_batch,
    .stats = my_stats,
    .held = cerb__my_op_held,
    .check_name = my_check_name,
    /* version 2: the idempotency guard (my_guard.c) */
    .guard_begin = cerb__my_guard_begin,
    .guard_renew = cerb__my_guard_renew,
    .guard_finish = cerb__my_guard_finish,
    .guard_check = cerb__my_guard_check,
    /* version 3 */
    .inspect = cerb__my_op_inspect,
};
