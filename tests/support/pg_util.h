/*
 * pg_util.h — helpers for suites that run against the test PostgreSQL
 * (scripts/servers.d/pg.sh): its port, a configuration naming it, and a
 * raw libpq session to look at (or tamper with) what the engine keeps.
 * The server has the role `cerb` (no superuser) owning database `cerb`.
 */
#ifndef CERB_TEST_PG_UTIL_H
#define CERB_TEST_PG_UTIL_H

#include <libpq-fe.h>
#include <sys/types.h>

/* $CERB_PG_PORT, else 25432. */
int pg_test_port(void);
/* `engines = ("pg"); pg = { conninfo = ...; <pg_extra> }; <extra>`,
 * malloc'd. */
char *pg_test_config(const char *pg_extra, const char *extra);
/* A session as `user` (NULL: cerb) to database cerb, or NULL. */
PGconn *pg_test_connect(const char *user);
/* Run sql with text parameters; the result or NULL (error printed). */
PGresult *pg_test_exec(PGconn *pg, const char *sql, int n, const char *const *vals);
/* What the server keeps for lock `name`: the session locks on its key
 * (holder and waiters) or, when there are none, 1 for a row that still
 * shows a live lease. -1 on error. */
int pg_test_records(const char *name);

/* SIGSTOP (SIGCONT) the server whose postmaster is `pid` as a whole: the
 * postmaster and every process it started (each session is a backend
 * process of its own, so stopping the postmaster alone stops nothing a
 * connected client talks to). 0, or -1. */
int pg_test_pause_server(pid_t pid);
int pg_test_resume_server(pid_t pid);

#endif
