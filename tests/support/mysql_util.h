/*
 * mysql_util.h — helpers for suites that run against the test MariaDB
 * (scripts/servers.d/mysql.sh): its port, a configuration naming it, and a
 * raw libmariadb session to look at (or tamper with) what the engine keeps.
 * The server has the user `cerb` (no password, ALL on database cerb,
 * PROCESS, SELECT on performance_schema; not SUPER) and `cerb_pw`
 * (password cerb-secret).
 */
#ifndef CERB_TEST_MYSQL_UTIL_H
#define CERB_TEST_MYSQL_UTIL_H

#include <mysql.h>
#include <stdint.h>

/* $CERB_MYSQL_PORT, else 23306. */
int mysql_test_port(void);
/* `engines = ("mysql"); mysql = { host, port, user = "cerb", database =
 * "cerb"; <my_extra> }; <extra>`, malloc'd. */
char *mysql_test_config(const char *my_extra, const char *extra);
/* A blocking session as `user` (NULL: cerb, no password) to database cerb
 * over TCP, or NULL (error printed). */
MYSQL *mysql_test_connect(const char *user, const char *password);
/* Run sql; the first column of the first row as an integer in *out (when
 * out is not NULL; -1 for NULL or no row). 0 on success, -1 on error
 * (printed). */
int mysql_test_exec(MYSQL *my, const char *sql, int64_t *out);
/* Same with one string value bound as a BLOB (binary) for each `?`
 * (all get the same value). */
int mysql_test_exec1(MYSQL *my, const char *sql, const char *val, int64_t *out);
/* What the server keeps for lock `name`: the sessions holding or waiting
 * for its GET_LOCK (performance_schema.metadata_locks, GRANTED and PENDING)
 * or, when there are none, 1 for a row that still shows a live lease. -1 on
 * error. */
int mysql_test_records(const char *name);

#endif
