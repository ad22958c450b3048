/* pg_util.c — see pg_util.h. */
#include "pg_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>

#include "test_util.h"

int pg_test_port(void)
{
    const char *s = getenv("CERB_PG_PORT");
    int p = s ? atoi(s) : 0;
    return p > 0 ? p : 25432;
}

char *pg_test_config(const char *pg_extra, const char *extra)
{
    static const char fmt[] = "engines = (\"pg\");\npg = { conninfo = \"host=127.0.0.1 port=%d "
                              "dbname=cerb user=cerb\"; %s };\n%s\n";
    const char *pe = pg_extra ? pg_extra : "", *ex = extra ? extra : "";
    int len = snprintf(NULL, 0, fmt, pg_test_port(), pe, ex);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, fmt, pg_test_port(), pe, ex);
    return s;
}

PGconn *pg_test_connect(const char *user)
{
    char ci[256];
    snprintf(ci, sizeof ci, "host=127.0.0.1 port=%d dbname=cerb user=%s connect_timeout=5",
             pg_test_port(), user ? user : "cerb");
    PGconn *pg = PQconnectdb(ci);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "pg_test_connect: %s", PQerrorMessage(pg));
        PQfinish(pg);
        return NULL;
    }
    return pg;
}

PGresult *pg_test_exec(PGconn *pg, const char *sql, int n, const char *const *vals)
{
    PGresult *r = PQexecParams(pg, sql, n, NULL, vals, NULL, NULL, 0);
    ExecStatusType t = PQresultStatus(r);
    if (t != PGRES_TUPLES_OK && t != PGRES_COMMAND_OK) {
        fprintf(stderr, "pg_test_exec: %s: %s", sql, PQresultErrorMessage(r));
        PQclear(r);
        return NULL;
    }
    return r;
}

int pg_test_records(const char *name)
{
    PGconn *pg = pg_test_connect(NULL);
    if (!pg)
        return -1;
    const char *v[1] = {name};
    PGresult *r = pg_test_exec(
        pg,
        "SELECT (SELECT count(*) FROM pg_locks k WHERE k.locktype = 'advisory' AND "
        "k.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND "
        "k.objsubid = 1 AND k.classid = ((l.akey >> 32) & 4294967295)::oid AND "
        "k.objid = (l.akey & 4294967295)::oid), "
        "(l.owner IS NOT NULL AND l.lease_until > clock_timestamp()) "
        "FROM cerberus_lock l WHERE l.name = convert_to($1, 'UTF8')",
        1, v);
    int n = -1;
    if (r) {
        n = 0;
        if (PQntuples(r) == 1) {
            n = atoi(PQgetvalue(r, 0, 0));
            if (n == 0 && PQgetvalue(r, 0, 1)[0] == 't')
                n = 1;
        }
        PQclear(r);
    }
    PQfinish(pg);
    return n;
}

/* The processes whose parent is pid, into out (at most max). */
static int children(pid_t pid, pid_t *out, int max)
{
    int n = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max) {
        char path[300], buf[512];
        long child = atol(de->d_name);
        if (child <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", child);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        const char *rp = strrchr(buf, ')');
        long ppid = 0;
        char st;
        if (rp && sscanf(rp + 1, " %c %ld", &st, &ppid) == 2 && ppid == (long)pid)
            out[n++] = (pid_t)child;
    }
    closedir(d);
    return n;
}

int pg_test_pause_server(pid_t pid)
{
    /* The postmaster first: once it is stopped it forks no new backend,
     * so the list of its children read after that is complete. */
    if (cerb_test_pause_pid(pid) != 0)
        return -1;
    pid_t kids[48];
    int n = children(pid, kids, 48);
    for (int i = 0; i < n; i++)
        cerb_test_pause_pid(kids[i]); /* one that just exited is no matter */
    return 0;
}

int pg_test_resume_server(pid_t pid)
{
    pid_t kids[48];
    int n = children(pid, kids, 48);
    for (int i = 0; i < n; i++)
        cerb_test_resume_pid(kids[i]);
    return cerb_test_resume_pid(pid);
}
