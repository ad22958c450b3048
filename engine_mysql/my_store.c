/*
 * my_store.c — `cerberus init` for the mysql engine: create the tables
 * (cerberus_lock, cerberus_guard) in mysql.database when missing. CREATE
 * TABLE IF NOT EXISTS makes it idempotent; what was there before decides the
 * answer (PREPARED when something was created, ALREADY when both existed).
 * The database itself is not created (that needs rights a lock user should
 * not have). Bounded by the connect timeout and one operation timeout per
 * statement.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "my_internal.h"
#include "store_init.h"

/* Run a script of statements that end in ";\n", one at a time (no
 * multi-statements on the wire); the script is cut up in place. */
static cerb_status run_script(MYSQL *my, char *script, const struct cerb_mysql_config *mc)
{
    cerb_status st = CERB_OK;
    for (char *p = script; st == CERB_OK && p && *p;) {
        struct my_res res;
        bool broken = false;
        unsigned en = 0;
        char *end = strstr(p, ";\n");
        if (end)
            *end = '\0';
        st = cerb__my_query(my, p, cerb__deadline_in(mc->op_timeout_ms), &res, &broken, &en);
        cerb__my_res_free(&res);
        p = end ? end + 2 : NULL;
    }
    return st;
}

static cerb_status my_init(const struct cerb_config *cfg, unsigned flags,
                           cerb_store_result *result, char *line, size_t len)
{
    const struct cerb_mysql_config *mc = &cfg->mysql;
    char db_q[140], *password = NULL;
    MYSQL *my = NULL;
    struct my_res res;
    bool broken = false;
    (void)flags;
    *result = CERB_STORE_FAILED;
    cerb__my_quote_ident(mc->database, db_q, sizeof db_q);
    cerb_status st = cerb__config_read_secret("mysql", mc->password_file, &password);
    if (st == CERB_OK)
        st = cerb__my_connect_raw(mc, password, false, cerb__deadline_in(mc->connect_timeout_ms),
                                  &my);
    cerb__config_free_secret(password);
    if (st != CERB_OK) {
        snprintf(line, len, "%s", cerb_last_error());
        return st;
    }
    /* Which tables exist (the database name bound as a value). */
    struct my_val v[2] = {{.t = MV_STR, .s = mc->database, .len = (unsigned long)strlen(mc->database)},
                          {.t = MV_STR, .s = mc->database, .len = (unsigned long)strlen(mc->database)}};
    st = cerb__my_exec_once(my,
                            "SELECT (SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE "
                            "SCHEMA_NAME = ?), (SELECT COUNT(*) FROM information_schema.TABLES "
                            "WHERE TABLE_SCHEMA = ? AND TABLE_NAME IN ('cerberus_lock', "
                            "'cerberus_guard', 'cerberus_meta', 'cerberus_boot'))",
                            v, 2, cerb__deadline_in(mc->op_timeout_ms), &res, &broken);
    if (st == CERB_OK) {
        bool db = res.nrows == 1 && atoi(res.rows[0].v[0]) > 0;
        bool had = res.nrows == 1 && atoi(res.rows[0].v[1]) == 4;
        bool some = res.nrows == 1 && atoi(res.rows[0].v[1]) > 0;
        cerb__my_res_free(&res);
        enum my_kind kind = MY_KIND_MARIADB;
        bool mariadb = false;
        if (db && !had)
            st = cerb__my_server_kind(mc, my, mc->mode == CERB_SQL_LEASE, &kind, &mariadb);
        if (st != CERB_OK) {
            /* said by cerb__my_server_kind */
        } else if (!db) {
            st = cerb__error_set(CERB_ECONFIG,
                                 "database %s does not exist (or %s cannot see it): create it "
                                 "first (CREATE DATABASE %s) and give %s its rights",
                                 db_q, mc->user, db_q, mc->user);
        } else if (had) {
            *result = CERB_STORE_ALREADY;
            snprintf(line, len, "tables %s.cerberus_lock and %s.cerberus_guard already exist",
                     db_q, db_q);
        } else {
            char *sql = cerb__my_sql_create(db_q);
            char *meta = sql ? cerb__my_sql_meta_init(db_q, kind) : NULL;
            if (!meta)
                st = cerb__error_set(CERB_ENOMEM, "out of memory");
            if (st == CERB_OK)
                st = run_script(my, sql, mc);
            if (st == CERB_OK)
                st = run_script(my, meta, mc);
            cerb__free(sql);
            cerb__free(meta);
            if (st == CERB_OK) {
                *result = CERB_STORE_PREPARED;
                if (some)
                    snprintf(line, len, "created what was missing in %s (of cerberus_lock, "
                             "cerberus_guard, cerberus_meta, cerberus_boot)", db_q);
                else
                    snprintf(line, len, "created %s.cerberus_lock and %s.cerberus_guard", db_q,
                             db_q);
            }
        }
    }
    cerb__my_hangup(my);
    if (st != CERB_OK)
        snprintf(line, len, "%s", cerb_last_error());
    return st;
}

const struct cerb_store_ops cerb__my_store_ops = {
    .version = CERB_STORE_OPS_V1,
    .name = "mysql",
    .init = my_init,
};
