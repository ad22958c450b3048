/* mysql_util.c — see mysql_util.h. */
#include "mysql_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mysql_test_port(void)
{
    const char *s = getenv("CERB_MYSQL_PORT");
    int p = s ? atoi(s) : 0;
    return p > 0 ? p : 23306;
}

char *mysql_test_config(const char *my_extra, const char *extra)
{
    static const char fmt[] = "engines = (\"mysql\");\nmysql = { host = \"127.0.0.1\"; port = %d; "
                              "user = \"cerb\"; database = \"cerb\"; %s };\n%s\n";
    const char *me = my_extra ? my_extra : "", *ex = extra ? extra : "";
    int len = snprintf(NULL, 0, fmt, mysql_test_port(), me, ex);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, fmt, mysql_test_port(), me, ex);
    return s;
}

MYSQL *mysql_test_connect(const char *user, const char *password)
{
    MYSQL *my = mysql_init(NULL);
    unsigned timeout = 5;
    if (!my)
        return NULL;
    mysql_options(my, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(my, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (!mysql_real_connect(my, "127.0.0.1", user ? user : "cerb", password ? password : "",
                            "cerb", (unsigned)mysql_test_port(), NULL, 0)) {
        fprintf(stderr, "mysql_test_connect: %s\n", mysql_error(my));
        mysql_close(my);
        return NULL;
    }
    return my;
}

static int first_int(MYSQL_STMT *st, int64_t *out)
{
    char buf[64];
    unsigned long len = 0;
    my_bool null = 0;
    MYSQL_BIND rb;
    memset(&rb, 0, sizeof rb);
    rb.buffer_type = MYSQL_TYPE_STRING;
    rb.buffer = buf;
    rb.buffer_length = sizeof buf - 1;
    rb.length = &len;
    rb.is_null = &null;
    *out = -1;
    unsigned nf = mysql_stmt_field_count(st);
    if (nf == 0) {
        *out = (int64_t)mysql_stmt_affected_rows(st);
        return 0;
    }
    MYSQL_BIND all[8];
    memset(all, 0, sizeof all);
    all[0] = rb;
    for (unsigned i = 1; i < nf && i < 8; i++)
        all[i].buffer_type = MYSQL_TYPE_NULL;
    if (mysql_stmt_bind_result(st, all) || mysql_stmt_store_result(st))
        return -1;
    int f = mysql_stmt_fetch(st);
    if ((f == 0 || f == MYSQL_DATA_TRUNCATED) && !null) {
        buf[len < sizeof buf ? len : sizeof buf - 1] = '\0';
        *out = strtoll(buf, NULL, 10);
    }
    mysql_stmt_free_result(st);
    return 0;
}

int mysql_test_exec1(MYSQL *my, const char *sql, const char *val, int64_t *out)
{
    int64_t dummy;
    MYSQL_STMT *st = mysql_stmt_init(my);
    MYSQL_BIND pb[8];
    if (!st)
        return -1;
    if (mysql_stmt_prepare(st, sql, strlen(sql)) != 0) {
        fprintf(stderr, "mysql_test_exec: %s: %s\n", sql, mysql_stmt_error(st));
        mysql_stmt_close(st);
        return -1;
    }
    unsigned np = mysql_stmt_param_count(st);
    memset(pb, 0, sizeof pb);
    for (unsigned i = 0; i < np && i < 8; i++) {
        pb[i].buffer_type = MYSQL_TYPE_BLOB;
        pb[i].buffer = (void *)(uintptr_t)val;
        pb[i].buffer_length = val ? strlen(val) : 0;
    }
    if ((np > 0 && mysql_stmt_bind_param(st, pb) != 0) || mysql_stmt_execute(st) != 0 ||
        first_int(st, out ? out : &dummy) != 0) {
        fprintf(stderr, "mysql_test_exec: %s: %s\n", sql, mysql_stmt_error(st));
        mysql_stmt_close(st);
        return -1;
    }
    mysql_stmt_close(st);
    return 0;
}

int mysql_test_exec(MYSQL *my, const char *sql, int64_t *out)
{
    return mysql_test_exec1(my, sql, NULL, out);
}

int mysql_test_records(const char *name)
{
    MYSQL *my = mysql_test_connect(NULL, NULL);
    if (!my)
        return -1;
    int64_t locks = -1, live = -1;
    int rc = mysql_test_exec1(my,
                              "SELECT COUNT(*) FROM performance_schema.metadata_locks m JOIN "
                              "cerberus_lock l ON m.OBJECT_NAME = l.lname WHERE l.name = ? AND "
                              "m.OBJECT_TYPE = 'USER LEVEL LOCK' AND m.LOCK_STATUS IN "
                              "('GRANTED', 'PENDING')",
                              name, &locks);
    if (rc == 0)
        rc = mysql_test_exec1(my,
                              "SELECT COUNT(*) FROM cerberus_lock WHERE name = ? AND owner IS "
                              "NOT NULL AND lease_until > UTC_TIMESTAMP(6)",
                              name, &live);
    mysql_close(my);
    if (rc != 0)
        return -1;
    return locks > 0 ? (int)locks : live > 0 ? 1 : 0;
}
