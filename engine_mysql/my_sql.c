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

/* The failover record (cerberus_meta, meta_tpl below): every fence is
 * above its base, and nothing is granted while its quarantine runs. "@I"
 * is the server's identity, an SQL expression (cerb__my_ident_expr). */
#define META_BASE "IFNULL((SELECT base FROM @D.cerberus_meta WHERE k = 'mysql'), 0)"
/* Grants are open: the record is of the very server the statement runs on
 * (a session that outlived a failover, behind a proxy or a moved address,
 * must not grant before its check ran) and no quarantine runs. Read inside
 * an UPDATE under REPEATABLE READ, InnoDB reads cerberus_meta with a shared
 * lock (a locking read: the latest committed row, never the snapshot), so
 * a grant and the check that moves the record are serialised. */
#define META_OPEN                                                                         \
    "EXISTS (SELECT 1 FROM @D.cerberus_meta WHERE k = 'mysql' AND server = @I AND "       \
    "(quarantine_until IS NULL OR quarantine_until <= UTC_TIMESTAMP(6)))"

#define GRANT_SET                                                                          \
    "UPDATE @D.cerberus_lock SET fence = LAST_INSERT_ID(GREATEST(fence + 1, ? + 1, "      \
    META_BASE " + 1)), "                                                                   \
    "owner = ?, owner_conn = CONNECTION_ID(), lease_until = UTC_TIMESTAMP(6) + INTERVAL ? " \
    "MICROSECOND, acquired_at = UTC_TIMESTAMP(6), lname = ? WHERE name = ? AND "           \
    "(owner IS NULL OR owner = ? OR lease_until <= UTC_TIMESTAMP(6)) AND " META_OPEN

/*
 * The failover check (cerb__my_check_meta), run by every new session
 * before its first grant, after MY_META_BOOT (the server's boot epoch,
 * see cerb__my_ident_expr) and MY_META_ROW (a record that is missing is
 * made with no identity, which no server has: nothing is granted through
 * it until this statement judged it). When the record is not of this
 * server, the first client to notice records this one, raises the base
 * 2^32 above every fence the table shows (the lost grants' included, as
 * long as fewer than 2^32 grants of one name were lost) and starts a
 * quarantine of ? microseconds (the longest lease, cerb__my_check_meta):
 * every fence is then above the base, and nothing is granted before every
 * holder of a lost grant has seen its own deadline pass.
 *
 * Why it is right under concurrency and REPEATABLE READ: an UPDATE judges
 * its WHERE on the latest committed row, which it locks (X) — a current
 * read, never the transaction's snapshot; of clients noticing at once, one
 * moves the record, the others wait for its commit, then find it of this
 * server and change nothing. The MAX(fence) subquery, read inside an
 * UPDATE under REPEATABLE READ, is a locking read too (shared locks on
 * cerberus_lock's rows: the latest committed fences, waiting for a grant
 * in flight); it runs only for the row that matched (MySQL evaluates SET
 * expressions per updated row), so a session that finds its record costs
 * no scan. The assignments run left to right, server last, so base and
 * quarantine_until see the old record. A grant takes the record's shared
 * lock (META_OPEN), so it commits either before this statement reads the
 * fences (its fence is below the new base) or after this one commits (it
 * sees the quarantine and the new identity).
 */
#define META_BUMP                                                                          \
    "UPDATE @D.cerberus_meta SET base = GREATEST(base, (SELECT IFNULL(MAX(fence), 0) FROM " \
    "@D.cerberus_lock)) + 4294967296, quarantine_until = GREATEST(IFNULL(quarantine_until, " \
    "UTC_TIMESTAMP(6)), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), server = @I "           \
    "WHERE k = 'mysql' AND NOT (server <=> @I)"

/* "@P" in a template: MY_RENEW_CHUNK pairs of values, (?, ?), in
 * parentheses (cerb__my_splice). */
#define PAIRS "@P"

static const char *const templates[MY_NSTMT] = {
    [MY_TRY] = GRANT_SET " AND GET_LOCK(?, 0) = 1",
    [MY_CLAIM] = GRANT_SET,
    [MY_DIAG] = "SELECT (SELECT COUNT(*) FROM @D.cerberus_lock WHERE name = ?), "
                "IFNULL(IS_USED_LOCK(?) = CONNECTION_ID(), 0), "
                "(SELECT GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until)) "
                "FROM @D.cerberus_lock WHERE name = ? AND owner IS NOT NULL), "
                "EXISTS (SELECT 1 FROM @D.cerberus_meta WHERE k = 'mysql' AND server = @I), "
                "(SELECT GREATEST(0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), "
                "quarantine_until)) FROM @D.cerberus_meta WHERE k = 'mysql')",
    [MY_INSERT] = "INSERT IGNORE INTO @D.cerberus_lock (name, lname) VALUES (?, ?)",
    /* IF() evaluates its condition first and then one branch: leftover
     * GET_LOCKs of the session go before the wait, and the answer says
     * whether the name was held when the wait began (2 added: 3 granted
     * after a wait, 2 timed out; NULL an error or a KILL QUERY). */
    [MY_WAIT] = "SELECT IF(RELEASE_ALL_LOCKS() >= 0, IF(IS_FREE_LOCK(?) = 1, GET_LOCK(?, ?), "
                "GET_LOCK(?, ?) + 2), NULL)",
    [MY_UNLOCK] = "SELECT RELEASE_LOCK(?)",
    [MY_UNLOCK_ALL] = "SELECT RELEASE_ALL_LOCKS()",
    [MY_RELEASE] = "UPDATE @D.cerberus_lock SET owner = NULL, owner_conn = NULL, "
                   "lease_until = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ? AND "
                   "IFNULL(RELEASE_LOCK(?), 0) >= 0",
    [MY_RENEW_N] = "UPDATE @D.cerberus_lock SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? "
                   "MICROSECOND WHERE owner_conn = CONNECTION_ID() AND (name, owner) IN " PAIRS,
    /* Lease mode: by token alone, on any connection. */
    [MY_RENEW_NL] = "UPDATE @D.cerberus_lock SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? "
                    "MICROSECOND WHERE (name, owner) IN " PAIRS,
    [MY_RENEW_CHKL] = "SELECT owner, fence FROM @D.cerberus_lock WHERE (name, owner) IN " PAIRS,
    /* The failover check (cerb__my_check_meta, meta_tpl). */
    [MY_META_FAST] = "SELECT EXISTS (SELECT 1 FROM @D.cerberus_boot WHERE k = 'b') AND EXISTS "
                     "(SELECT 1 FROM @D.cerberus_meta WHERE k = 'mysql' AND server = @I)",
    [MY_META_BOOT] = "INSERT IGNORE INTO @D.cerberus_boot (k, epoch) VALUES ('b', UUID())",
    [MY_META_ROW] = "INSERT IGNORE INTO @D.cerberus_meta (k) VALUES ('mysql')",
    [MY_META_BUMP] = META_BUMP,
    [MY_META_SEEN] = "SELECT @I, (SELECT base FROM @D.cerberus_meta WHERE k = 'mysql')",
    [MY_RENEW_CHK] = "SELECT owner, fence FROM @D.cerberus_lock WHERE owner_conn = "
                     "CONNECTION_ID() AND (name, owner) IN " PAIRS,
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

/* The text of "@P": "((?, ?), (?, ?), ...)". */
#define PAIR_TEXT "(?, ?)"
#define PAIRS_LEN (2 + MY_RENEW_CHUNK * (sizeof PAIR_TEXT - 1) + (MY_RENEW_CHUNK - 1) * 2)

static void pairs_text(char *out)
{
    char *o = out;
    *o++ = '(';
    for (int i = 0; i < MY_RENEW_CHUNK; i++) {
        if (i) {
            memcpy(o, ", ", 2);
            o += 2;
        }
        memcpy(o, PAIR_TEXT, sizeof PAIR_TEXT - 1);
        o += sizeof PAIR_TEXT - 1;
    }
    *o++ = ')';
    *o = '\0';
}

char *cerb__my_splice(const char *tpl, const char *db_q)
{
    char pairs[PAIRS_LEN + 1];
    const char *with[2] = {db_q, pairs};
    size_t wl[2] = {strlen(db_q), PAIRS_LEN};
    size_t n = 0;
    pairs_text(pairs);
    for (const char *p = tpl; *p; p++) {
        int k = p[0] != '@' ? -1 : p[1] == 'D' ? 0 : p[1] == 'P' ? 1 : -1;
        n += k >= 0 ? (p++, wl[k]) : 1;
    }
    char *out = cerb__malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tpl; *p; p++) {
        int k = p[0] != '@' ? -1 : p[1] == 'D' ? 0 : p[1] == 'P' ? 1 : -1;
        if (k >= 0) {
            memcpy(o, with[k], wl[k]);
            o += wl[k];
            p++;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

/*
 * The server's identity, as an SQL expression the server evaluates in
 * every statement that needs it (so a session that was moved to another
 * server, by a proxy or an address, is judged by where it runs now):
 *   MySQL     its @@server_uuid (made at its first start, in auto.cnf);
 *   MariaDB   it has no server_uuid: its @@server_id (every server of a
 *             replication topology has its own, or replication would drop
 *             the other's events) and @@hostname;
 * each followed by its boot epoch: a random UUID() kept in the MEMORY
 * table cerberus_boot, which the server empties whenever it starts (a
 * MEMORY table's rows are never written to disk, nor copied by a physical
 * backup), so the identity changes when the server restarts — after a
 * restore from a backup, or a crash that lost acknowledged commits
 * (innodb_flush_log_at_trx_commit other than 1). Replication copies the
 * epoch to replicas, which is harmless: a replica's server_id (or uuid)
 * differs.
 *   Galera    (lease mode only) the cluster's state UUID, shared by every
 *             node and kept across node restarts; it changes when the
 *             cluster is bootstrapped anew (a restore). Nodes restart on
 *             their own, and MEMORY tables are not replicated, so no epoch.
 *   Group Replication, multi-primary (lease mode only): the group's name.
 * LEFT(..., 255): the column's width; the hostname goes last.
 */
const char *cerb__my_ident_expr(enum my_kind kind)
{
#define EPOCH "IFNULL((SELECT epoch FROM @D.cerberus_boot WHERE k = 'b'), '-')"
    switch (kind) {
    case MY_KIND_MYSQL:
        return "LEFT(CONCAT('mysql ', @@server_uuid, ' ', " EPOCH "), 255)";
    case MY_KIND_GALERA_MARIADB:
        return "LEFT(CONCAT('galera ', IFNULL((SELECT VARIABLE_VALUE FROM "
               "information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = "
               "'WSREP_CLUSTER_STATE_UUID'), '-')), 255)";
    case MY_KIND_GALERA_MYSQL:
        return "LEFT(CONCAT('galera ', IFNULL((SELECT VARIABLE_VALUE FROM "
               "performance_schema.global_status WHERE VARIABLE_NAME = "
               "'wsrep_cluster_state_uuid'), '-')), 255)";
    case MY_KIND_GROUP:
        return "LEFT(CONCAT('group ', @@group_replication_group_name), 255)";
    case MY_KIND_MARIADB:
    default:
        return "LEFT(CONCAT('mariadb ', @@server_id, ' ', " EPOCH ", ' ', @@hostname), 255)";
    }
#undef EPOCH
}

/* tpl with "@I" replaced by the identity of kind, then "@D" by db_q. */
char *cerb__my_splice_ident(const char *tpl, const char *db_q, enum my_kind kind)
{
    const char *id = cerb__my_ident_expr(kind);
    size_t n = 0, il = strlen(id);
    for (const char *p = tpl; *p; p++)
        n += (p[0] == '@' && p[1] == 'I') ? (p++, il) : 1;
    char *mid = cerb__malloc(n + 1), *o = mid;
    if (!mid)
        return NULL;
    for (const char *p = tpl; *p; p++) {
        if (p[0] == '@' && p[1] == 'I') {
            memcpy(o, id, il);
            o += il;
            p++;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    char *out = cerb__my_splice(mid, db_q);
    cerb__free(mid);
    return out;
}

cerb_status cerb__my_sql_build(cerb_engine *e)
{
    for (int i = 0; i < MY_NSTMT; i++) {
        e->sql[i] = cerb__my_splice_ident(templates[i], e->db_q, e->kind);
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

/* Statements separated by ";\n" (my_store.c runs them one by one). */
static const char create_tpl[] =
    "CREATE TABLE IF NOT EXISTS @D.cerberus_lock (\n"
    "  name        VARBINARY(255) NOT NULL PRIMARY KEY, -- the lock name, byte for byte\n"
    "  lname       VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n"
    "                                    -- its GET_LOCK name (mysql.key)\n"
    "  fence       BIGINT UNSIGNED NOT NULL DEFAULT 0 -- last fence granted; only raised\n"
    "              CHECK (fence < 281474976710656), -- 2^48: the core's counter bits\n"
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
    ") ENGINE=InnoDB;\n"
    "CREATE TABLE IF NOT EXISTS @D.cerberus_meta (\n"
    "  k                VARCHAR(16) NOT NULL PRIMARY KEY, -- 'mysql'\n"
    "  server           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,\n"
    "                                    -- the identity of the server it was last seen on\n"
    "  base             BIGINT UNSIGNED NOT NULL DEFAULT 0, -- every fence is above it\n"
    "  quarantine_until DATETIME(6) NULL -- after a failover, no grant before this (UTC)\n"
    ") ENGINE=InnoDB;\n"
    "CREATE TABLE IF NOT EXISTS @D.cerberus_boot (\n"
    "  k     CHAR(1) NOT NULL PRIMARY KEY, -- 'b'\n"
    "  epoch CHAR(36) NOT NULL           -- UUID(), drawn after each start of the server\n"
    ") ENGINE=MEMORY;\n";

char *cerb__my_sql_create(const char *db_q) { return cerb__my_splice(create_tpl, db_q); }

/* `cerberus init`: the boot epoch and the record, with the server's
 * identity and no quarantine (nothing was granted in it before). */
static const char meta_init_tpl[] =
    "INSERT IGNORE INTO @D.cerberus_boot (k, epoch) VALUES ('b', UUID());\n"
    "INSERT IGNORE INTO @D.cerberus_meta (k, server) VALUES ('mysql', @I);\n";

char *cerb__my_sql_meta_init(const char *db_q, enum my_kind kind)
{
    return cerb__my_splice_ident(meta_init_tpl, db_q, kind);
}
