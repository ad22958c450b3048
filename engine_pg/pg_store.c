/*
 * pg_store.c — `cerberus init` for the pg engine: create the tables
 * (cerberus_lock, cerberus_guard) and the index of the guard's sweep
 * (cerberus_guard_until) in the configured schema when missing. IF NOT
 * EXISTS makes it idempotent; what was there before decides the answer
 * (PREPARED when something was created, ALREADY when all three existed). A standby is refused: tables are created on the primary.
 * Bounded by the connect timeout and one operation timeout.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "pg_internal.h"
#include "store_init.h"

static cerb_status pg_init(const struct cerb_config *cfg, unsigned flags,
                           cerb_store_result *result, char *line, size_t len)
{
    const struct cerb_pg_config *pc = &cfg->pg;
    char schema_q[140], *password = NULL, ss[6];
    PGconn *pg = NULL;
    PGresult *res = NULL;
    bool broken = false;
    (void)flags;
    *result = CERB_STORE_FAILED;
    cerb__pg_quote_ident(pc->schema, schema_q, sizeof schema_q);
    cerb_status st = cerb__config_read_secret("pg", pc->password_file, &password);
    if (st == CERB_OK)
        st = cerb__pg_connect_raw(pc, password, cerb__deadline_in(pc->connect_timeout_ms), &pg);
    cerb__config_free_secret(password);
    if (st != CERB_OK) {
        snprintf(line, len, "%s", cerb_last_error());
        return st;
    }
    int64_t opd = cerb__deadline_in(pc->op_timeout_ms);
    const char *v[1] = {pc->schema};
    st = cerb__pg_exec(pg, -1,
                       "SELECT pg_is_in_recovery(), "
                       "to_regclass(quote_ident($1) || '.cerberus_lock') IS NOT NULL, "
                       "to_regclass(quote_ident($1) || '.cerberus_guard') IS NOT NULL, "
                       "to_regclass(quote_ident($1) || '.cerberus_guard_until') IS NOT NULL "
                       "AND to_regclass(quote_ident($1) || '.cerberus_meta') IS NOT NULL",
                       1, v, NULL, NULL, opd, &res, &broken, ss);
    if (st == CERB_OK) {
        bool standby = PQgetvalue(res, 0, 0)[0] == 't';
        bool tables = PQgetvalue(res, 0, 1)[0] == 't' && PQgetvalue(res, 0, 2)[0] == 't';
        bool had = tables && PQgetvalue(res, 0, 3)[0] == 't';
        PQclear(res);
        res = NULL;
        if (standby) {
            st = cerb__error_set(CERB_UNAVAILABLE, "the server is a standby");
        } else if (had) {
            *result = CERB_STORE_ALREADY;
            snprintf(line, len, "tables %s.cerberus_lock and %s.cerberus_guard already exist",
                     schema_q, schema_q);
        } else {
            char *sql = cerb__pg_sql_create(schema_q);
            st = sql ? cerb__pg_exec(pg, -1, sql, 0, NULL, NULL, NULL, opd, &res, &broken, ss)
                     : cerb__error_set(CERB_ENOMEM, "out of memory");
            cerb__free(sql);
            PQclear(res);
            res = NULL;
            /* The guard's sweep deletes expired records oldest first
             * (pg_guard.c): an index range scan with this, a scan of the
             * whole table without. */
            char idx[512];
            snprintf(idx, sizeof idx,
                     "CREATE INDEX IF NOT EXISTS cerberus_guard_until ON %s.cerberus_guard (until)",
                     schema_q);
            if (st == CERB_OK)
                st = cerb__pg_exec(pg, -1, idx, 0, NULL, NULL, NULL, opd, &res, &broken, ss);
            PQclear(res);
            res = NULL;
            /* The failover record, made here so that a new server's first
             * client need not wait (a missing record means a quarantine). */
            char *meta = st == CERB_OK ? cerb__pg_sql_meta_init(schema_q) : NULL;
            if (meta)
                st = cerb__pg_exec(pg, -1, meta, 0, NULL, NULL, NULL, opd, &res, &broken, ss);
            else if (st == CERB_OK)
                st = cerb__error_set(CERB_ENOMEM, "out of memory");
            cerb__free(meta);
            PQclear(res);
            if (st == CERB_OK) {
                *result = CERB_STORE_PREPARED;
                if (tables)
                    snprintf(line, len, "created what was missing in %s (cerberus_meta, "
                             "cerberus_guard_until)", schema_q);
                else
                    snprintf(line, len, "created %s.cerberus_lock and %s.cerberus_guard", schema_q,
                             schema_q);
            }
        }
    }
    PQfinish(pg);
    if (st != CERB_OK)
        snprintf(line, len, "%s", cerb_last_error());
    return st;
}

const struct cerb_store_ops cerb__pg_store_ops = {
    .version = CERB_STORE_OPS_V1,
    .name = "pg",
    .init = pg_init,
};
