/*
 * my_sql.c — the statements of the mysql engine, with the database spliced
 * in.
 *
 * The database is the only text that is not a bound value: an identifier
 * cannot be one. It was held to [A-Za-z_][A-Za-z0-9_]* by the configuration
 * and is backtick-quoted here besides. Every value — names (sent as BLOB, so
 * the server takes them as binary: any byte is just a byte), GET_LOCK names,
 * tokens, durations — is a parameter of a statement prepared once per
 * connection.
 *
 * The grant (MY_TRY) is one round trip, one UPDATE by primary key:
 *   WHERE name = ? AND (owner IS NULL OR owner = ? OR
 *         lease_until <= UTC_TIMESTAMP(6)) AND GET_LOCK(?, 0) = 1
 * (owner = ?: this hold's own token, a claim whose answer was lost with its
 * session; a retry need not wait out its own lease.)
 * InnoDB locks the row (X) when it reads it, then the server evaluates the
 * rest of the condition on it, left to right, stopping at the first false
 * term. Checked on MariaDB 10.11 (tests/integration/test_mysql.c,
 * mysql_eval_order): GET_LOCK is evaluated exactly once when the row is
 * free, not at all when the row is missing or shows another owner's live
 * lease. GET_LOCK and RELEASE_LOCK are non-constant (RAND_TABLE_BIT), so the
 * optimizer never folds them, and REPEATABLE READ (set on every session)
 * rules out semi-consistent reads, the one path where InnoDB hands a row to
 * the condition twice. Whatever the order, a claim that matched nothing is
 * followed by MY_DIAG, which says whether this session holds the GET_LOCK
 * now (a try runs only on a session that pins no hold of that GET_LOCK
 * name, so "holds" means "this statement took it"), and the engine gives it
 * back. The fence: LAST_INSERT_ID(expr) puts the new fence in the OK
 * packet (mysql_stmt_insert_id), the same round trip. Every grant changes
 * the row (the fence grows), and sessions set CLIENT_FOUND_ROWS anyway, so
 * one matched row is one affected row.
 *
 * The release (MY_RELEASE) is one round trip too: the UPDATE freeing the
 * row calls RELEASE_LOCK in its condition, after the row is X-locked and
 * only if the row is ours. A waiter woken by that RELEASE_LOCK claims the
 * row with an UPDATE, a locking read: it waits for our row lock, that is,
 * for our commit, and then reads the freed row — never the old lease.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "my_internal.h"

#define GRANT_SET                                                                          \
    "UPDATE @D.cerberus_lock SET fence = LAST_INSERT_ID(GREATEST(fence + 1, ? + 1)), "    \
    "owner = ?, owner_conn = CONNECTION_ID(), lease_until = UTC_TIMESTAMP(6) + INTERVAL ? " \
    "MICROSECOND, acquired_at = UTC_TIMESTAMP(6), lname = ? WHERE name = ? AND "           \
    "(owner IS NULL OR owner = ? OR lease_until <= UTC_TIMESTAMP(6))"

#define PAIRS4 "(?, ?), (?, ?), (?, ?), (?, ?)"
#define PAIRS16 "(" PAIRS4 ", " PAIRS4 ", " PAIRS4 ", " PAIRS4 ")"

static const char *const templates[MY_NSTMT] = {
    [MY_TRY] = GRANT_SET " AND GET_LOCK(?, 0) = 1",
    [MY_CLAIM] = GRANT_SET,
    [MY_DIAG] = "SELECT (SELECT COUNT(*) FROM @D.cerberus_lock WHERE name = ?), "
                "IFNULL(IS_USED_LOCK(?) = CONNECTION_ID(), 0), "
                "(SELECT GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until)) "
                "FROM @D.cerberus_lock WHERE name = ? AND owner IS NOT NULL)",
    [MY_INSERT] = "INSERT IGNORE INTO @D.cerberus_lock (name, lname) VALUES (?, ?)",
    [MY_GETLOCK] = "SELECT GET_LOCK(?, ?)",
    [MY_UNLOCK] = "SELECT RELEASE_LOCK(?)",
    [MY_UNLOCK_ALL] = "SELECT RELEASE_ALL_LOCKS()",
    [MY_RELEASE] = "UPDATE @D.cerberus_lock SET owner = NULL, owner_conn = NULL, "
                   "lease_until = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ? AND "
                   "IFNULL(RELEASE_LOCK(?), 0) >= 0",
    [MY_RENEW_N] = "UPDATE @D.cerberus_lock SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? "
                   "MICROSECOND WHERE owner_conn = CONNECTION_ID() AND (name, owner) IN " PAIRS16,
    [MY_RENEW_CHK] = "SELECT owner, fence FROM @D.cerberus_lock WHERE owner_conn = "
                     "CONNECTION_ID() AND (name, owner) IN " PAIRS16,
    [MY_CHECK] = "SELECT fence, owner_conn, lease_until > UTC_TIMESTAMP(6) "
                 "FROM @D.cerberus_lock WHERE name = ? AND owner = ?",
    [MY_DROP] = "UPDATE @D.cerberus_lock SET owner = NULL, owner_conn = NULL, "
                "lease_until = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ? AND "
                "(? = 0 OR owner_conn = ?)",
    [MY_HELD] = "SELECT EXISTS (SELECT 1 FROM @D.cerberus_lock WHERE name = ? AND owner IS NOT "
                "NULL AND lease_until > UTC_TIMESTAMP(6)) OR IS_USED_LOCK(?) IS NOT NULL",
    [MY_PROBE] = "SELECT @@global.read_only, (SELECT COUNT(*) FROM @D.cerberus_lock "
                 "WHERE name = ?)",
    /* A hung holder (values: name, lname): its lease ran out on the
     * server's clock, yet its session still holds the name's GET_LOCK, and
     * no row of that session has a live lease (so a session that renews
     * other locks is never ended). The caller ends the session it names
     * (KILL CONNECTION: there is no function for it). */
    [MY_EVICT] = "SELECT l.owner_conn FROM @D.cerberus_lock l WHERE l.name = ? AND "
                 "l.owner IS NOT NULL AND l.owner_conn IS NOT NULL AND "
                 "l.owner_conn <> CONNECTION_ID() AND l.lease_until <= UTC_TIMESTAMP(6) AND "
                 "IS_USED_LOCK(?) = l.owner_conn AND NOT EXISTS (SELECT 1 FROM "
                 "@D.cerberus_lock o WHERE o.owner_conn = l.owner_conn AND o.owner IS NOT NULL "
                 "AND o.lease_until > UTC_TIMESTAMP(6))",
};

void cerb__my_quote_ident(const char *id, char *out, size_t len)
{
    /* The pattern admits no '`', but double any anyway. */
    size_t o = 0;
    if (len < 3)
        return;
    out[o++] = '`';
    for (const char *p = id; *p && o + 3 < len; p++) {
        if (*p == '`')
            out[o++] = '`';
        out[o++] = *p;
    }
    out[o++] = '`';
    out[o] = '\0';
}

char *cerb__my_splice(const char *tpl, const char *db_q)
{
    size_t n = 0, ql = strlen(db_q);
    for (const char *p = tpl; *p; p++)
        n += (p[0] == '@' && p[1] == 'D') ? (p++, ql) : 1;
    char *out = cerb__malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tpl; *p; p++) {
        if (p[0] == '@' && p[1] == 'D') {
            memcpy(o, db_q, ql);
            o += ql;
            p++;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

cerb_status cerb__my_sql_build(cerb_engine *e)
{
    for (int i = 0; i < MY_NSTMT; i++) {
        e->sql[i] = cerb__my_splice(templates[i], e->db_q);
        if (!e->sql[i])
            return cerb__error_set(CERB_ENOMEM, "mysql: out of memory");
    }
    return CERB_OK;
}

void cerb__my_sql_free(cerb_engine *e)
{
    for (int i = 0; i < MY_NSTMT; i++) {
        cerb__free(e->sql[i]);
        e->sql[i] = NULL;
    }
}

/* Two statements separated by ";\n" (my_store.c runs them one by one). */
static const char create_tpl[] =
    "CREATE TABLE IF NOT EXISTS @D.cerberus_lock (\n"
    "  name        VARBINARY(255) NOT NULL PRIMARY KEY, -- the lock name, byte for byte\n"
    "  lname       VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n"
    "                                    -- its GET_LOCK name (mysql.key)\n"
    "  fence       BIGINT UNSIGNED NOT NULL DEFAULT 0, -- last fence granted; only raised\n"
    "  owner       CHAR(32) NULL,        -- owner token of the holder; NULL when free\n"
    "  owner_conn  BIGINT UNSIGNED NULL, -- the holder's CONNECTION_ID()\n"
    "  lease_until DATETIME(6) NULL,     -- end of the lease, UTC, the server's clock\n"
    "  acquired_at DATETIME(6) NULL\n"
    ") ENGINE=InnoDB;\n"
    "CREATE TABLE IF NOT EXISTS @D.cerberus_guard (\n"
    "  id     CHAR(64) NOT NULL PRIMARY KEY, -- SHA-256 of app, scope and key (hex)\n"
    "  scope  VARBINARY(255) NOT NULL,\n"
    "  token  CHAR(32) NOT NULL,         -- the attempt that wrote it\n"
    "  state  TINYINT NOT NULL,          -- 1 running, 2 done\n"
    "  until  DATETIME(6) NULL,          -- expiry, UTC, the server's clock; NULL: never\n"
    "  result LONGBLOB NULL,\n"
    "  KEY cerberus_guard_until (until)  -- the sweep of expired records\n"
    ") ENGINE=InnoDB;\n";

char *cerb__my_sql_create(const char *db_q) { return cerb__my_splice(create_tpl, db_q); }
