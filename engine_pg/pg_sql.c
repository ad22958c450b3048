/*
 * pg_sql.c — the statements of the pg engine, with the schema spliced in.
 *
 * The schema is the only text that is not a bound parameter: an identifier
 * cannot be one. It was held to [A-Za-z_][A-Za-z0-9_]* by the configuration
 * and is quoted here besides. Every value — names (bytea, sent binary, so
 * any byte is just a byte), tokens, durations, keys — is a parameter of a
 * statement prepared once per connection.
 *
 * How a grant works, in one round trip (PG_TRY, PG_WAIT):
 *   a    takes the session lock (try; or a wait, a try first and then
 *        with lock_timeout set for this statement only). A wait that
 *        follows one that timed out (PG_REWAIT) first drops whatever
 *        session lock its connection has: a waiter's connection pins no
 *        hold, and a wait that timed out can still have been granted the
 *        lock at the last moment (the server says so itself,
 *        LockErrorCleanup), which would otherwise stack under the next
 *        grant. Every other way out of a wait gives the connection back
 *        without session locks, so the first wait need not.
 *   ins  when a got it, raises the row's fence and writes the owner, the
 *        backend pid and a lease from clock_timestamp() — the time now, not
 *        the transaction's start — unless the row still shows another
 *        owner's lease (a holder whose session ended while it may still be
 *        working: the hand-off wait). A row of this very token is ours
 *        already (a grant whose answer was lost, then retried). ON CONFLICT DO UPDATE judges the
 *        latest committed row, waiting for a release in flight to commit.
 *   and returns whether a got it, the fence, and how long the row's lease
 *   has left (so the client never compares its clock with the server's).
 * A release frees the row before it gives the session lock back (the
 * count(*) in FROM forces that order), so a waiter woken by the unlock
 * finds the row locked by the release and sees it freed once it commits.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "pg_internal.h"

const char *const cerb__pg_stmt_names[PG_NSTMT] = {
    "cerb_try", "cerb_wait", "cerb_rewait", "cerb_claim", "cerb_unlock", "cerb_release", "cerb_renew",
    "cerb_renew_n", "cerb_check", "cerb_drop", "cerb_held", "cerb_probe", "cerb_evict", "cerb_cancel",
    "cerb_inspect", "cerb_release_n"};

#define LOCK_FN(fn)                                                                       \
    "CASE WHEN $6::int IS NULL THEN " fn "($2::bigint) ELSE " fn "($6::int, $7::int) END"

/* The failover record (cerberus_meta, pg_meta below). A grant joins its
 * row (the primary key k = 'pg') only when it is of this very server — a
 * session that outlived a failover (behind a pooler, or a moved address)
 * must not grant on a promoted standby before its check ran — and no
 * quarantine runs; the new fence is above its base. Nothing else is read
 * on the way to a grant: what a refusal needs (the lease and quarantine
 * left, whether the record is of this server: `same` tells the session to
 * run its check) is asked by subqueries under CASE, which the server runs
 * only when no fence came back. The timeline is the WAL insert position's
 * (no control file read). */
#define CUR_TLI "('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint"
#define META_JOIN                                                                         \
    "@S.cerberus_meta mb WHERE mb.k = 'pg' AND mb.tli = " CUR_TLI " AND "                  \
    "(mb.quarantine_until IS NULL OR mb.quarantine_until <= clock_timestamp())"

/* The claim of the row, from the record's row joined with `from` and
 * held to `cond`: after the session lock said got (`a, ` and
 * ` AND a.got`), or with nothing more (PG_CLAIM).
 * The update's new fence is GREATEST(l.fence + 1, floor + 1, base + 1):
 * EXCLUDED.fence holds the last two. */
#define CLAIM_INSERT(from, cond)                                                          \
    "INSERT INTO @S.cerberus_lock AS l (name, akey, fence, owner, owner_pid, lease_until, " \
    "acquired_at) SELECT $1::bytea, $2::bigint, GREATEST(1, $5::bigint + 1, mb.base + 1), " \
    "$3::text, pg_backend_pid(), clock_timestamp() + $4::bigint * "                        \
    "interval '1 millisecond', clock_timestamp() FROM " from META_JOIN cond                \
    " ON CONFLICT (name) DO UPDATE "                                                       \
    "SET fence = GREATEST(l.fence + 1, EXCLUDED.fence), "                                  \
    "akey = EXCLUDED.akey, owner = EXCLUDED.owner, "                                       \
    "owner_pid = EXCLUDED.owner_pid, lease_until = EXCLUDED.lease_until, "                 \
    "acquired_at = EXCLUDED.acquired_at WHERE l.owner IS NULL OR l.owner = $3::text OR "   \
    "l.lease_until <= clock_timestamp() RETURNING fence"

/* The answer: got, the fence, and when no fence came back, how long to
 * wait (the row's lease and the quarantine left) and whether the record
 * is of this server. */
#define ANSWER(got)                                                                       \
    "SELECT " got ", (SELECT fence FROM ins), CASE WHEN (SELECT fence FROM ins) IS NULL "  \
    "THEN GREATEST((SELECT ceil(extract(epoch FROM (lease_until - clock_timestamp())) * "  \
    "1000)::bigint FROM @S.cerberus_lock WHERE name = $1::bytea AND owner IS NOT NULL), "  \
    "(SELECT ceil(extract(epoch FROM (quarantine_until - clock_timestamp())) * "           \
    "1000)::bigint FROM @S.cerberus_meta WHERE k = 'pg')) END, "                           \
    "CASE WHEN (SELECT fence FROM ins) IS NULL THEN coalesce((SELECT tli = " CUR_TLI       \
    " FROM @S.cerberus_meta WHERE k = 'pg'), false) ELSE true END"

/* Wait for the session lock: a try first (no settings touched when the
 * name is free), then the wait bounded by lock_timeout for this statement.
 * CASE decides the order; AND would not. */
#define WAIT_LOCK                                                                         \
    "CASE WHEN " LOCK_FN("pg_try_advisory_lock") " THEN true "                            \
    "WHEN set_config('lock_timeout', $8::text, true) IS NULL THEN false "                 \
    "ELSE (" LOCK_FN("pg_advisory_lock") ")::text IS NOT NULL END"

static const char *const templates[PG_NSTMT] = {
    [PG_TRY] = "WITH a AS (SELECT " LOCK_FN("pg_try_advisory_lock") " AS got), "
               "ins AS (" CLAIM_INSERT("a, ", " AND a.got") ") " ANSWER("a.got") " FROM a",
    [PG_WAIT] = "WITH a AS (SELECT " WAIT_LOCK " AS got), "
                "ins AS (" CLAIM_INSERT("a, ", " AND a.got") ") " ANSWER("a.got") " FROM a",
    [PG_REWAIT] = "WITH s AS (SELECT pg_advisory_unlock_all()::text AS u), "
                  "a AS (SELECT " WAIT_LOCK " AS got FROM s), "
                  "ins AS (" CLAIM_INSERT("a, ", " AND a.got") ") " ANSWER("a.got") " FROM a",
    [PG_CLAIM] = "WITH ins AS (" CLAIM_INSERT("", "") ") " ANSWER("true"),
    [PG_UNLOCK] = "SELECT CASE WHEN $2::int IS NOT NULL THEN pg_advisory_unlock($2::int, $3::int) "
                  "ELSE pg_advisory_unlock($1::bigint) END",
    [PG_RELEASE] = "WITH u AS (UPDATE @S.cerberus_lock SET owner = NULL, owner_pid = NULL, "
                   "lease_until = clock_timestamp() WHERE name = $1::bytea AND owner = $2::text "
                   "RETURNING fence) SELECT c.n, CASE "
                   "WHEN $4::int IS NOT NULL THEN pg_advisory_unlock($4::int, $5::int) "
                   "WHEN $3::bigint IS NOT NULL THEN pg_advisory_unlock($3::bigint) END "
                   "FROM (SELECT count(*) AS n FROM u) c",
    /* Lease mode: free the row, and when it was ours tell the listeners
     * (delivered at commit, in commit order). */
    [PG_RELEASE_N] = "WITH u AS (UPDATE @S.cerberus_lock SET owner = NULL, owner_pid = NULL, "
                     "lease_until = clock_timestamp() WHERE name = $1::bytea AND "
                     "owner = $2::text RETURNING fence) SELECT c.n, CASE WHEN c.n > 0 THEN "
                     "pg_notify('" PG_NOTIFY_CHANNEL "', encode($1::bytea, 'hex')) END "
                     "FROM (SELECT count(*) AS n FROM u) c",
    [PG_RENEW] = "UPDATE @S.cerberus_lock SET lease_until = clock_timestamp() + "
                 "$3::bigint * interval '1 millisecond' WHERE name = $1::bytea AND "
                 "owner = $2::text AND (owner_pid = pg_backend_pid() OR $4::boolean) "
                 "RETURNING fence",
    [PG_RENEW_N] = "UPDATE @S.cerberus_lock l SET lease_until = clock_timestamp() + "
                   "r.ms * interval '1 millisecond' FROM unnest($1::text[], $2::text[], "
                   "$3::bigint[]) AS r(hname, owner, ms) WHERE l.name = decode(r.hname, 'hex') "
                   "AND l.owner = r.owner AND (l.owner_pid = pg_backend_pid() OR $4::boolean) "
                   "RETURNING l.owner, l.fence",
    [PG_CHECK] = "SELECT fence, owner_pid, lease_until > clock_timestamp() "
                 "FROM @S.cerberus_lock WHERE name = $1::bytea AND owner = $2::text",
    [PG_DROP] = "UPDATE @S.cerberus_lock SET owner = NULL, owner_pid = NULL, "
                "lease_until = clock_timestamp() WHERE name = $1::bytea AND owner = $2::text "
                "AND ($3::int IS NULL OR owner_pid = $3::int)",
    [PG_HELD] = "SELECT EXISTS (SELECT 1 FROM @S.cerberus_lock WHERE name = $1::bytea AND "
                "owner IS NOT NULL AND lease_until > clock_timestamp()) OR EXISTS (SELECT 1 "
                "FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM "
                "pg_database WHERE datname = current_database()) AND classid = $2::oid AND "
                "objid = $3::oid AND objsubid = $4::int2)",
    [PG_PROBE] = "SELECT pg_is_in_recovery(), (SELECT count(*) FROM @S.cerberus_lock "
                 "WHERE name = $1::bytea)",
    /* A hung holder: its lease ran out on the server's clock, yet its
     * session still holds the name's session lock, and no row of that
     * session has a live lease (so a session that renews other locks is
     * never ended). pg_terminate_backend runs only for a row that passed. */
    [PG_EVICT] = "SELECT l.owner_pid, pg_terminate_backend(l.owner_pid) FROM @S.cerberus_lock l "
                 "WHERE l.name = $1::bytea AND l.owner IS NOT NULL AND l.owner_pid IS NOT NULL "
                 "AND l.owner_pid <> pg_backend_pid() AND l.lease_until <= clock_timestamp() "
                 "AND EXISTS (SELECT 1 FROM pg_locks k WHERE k.pid = l.owner_pid AND "
                 "k.locktype = 'advisory' AND k.granted AND k.database = (SELECT oid FROM "
                 "pg_database WHERE datname = current_database()) AND k.classid = $2::oid AND "
                 "k.objid = $3::oid AND k.objsubid = $4::int2) AND NOT EXISTS (SELECT 1 FROM "
                 "@S.cerberus_lock o WHERE o.owner_pid = l.owner_pid AND o.owner IS NOT NULL AND "
                 "o.lease_until > clock_timestamp())",
    [PG_CANCEL] = "SELECT pg_cancel_backend($1::int)",
    /* Who holds a name and who waits, each as the backend (session) that
     * does: the row's holder while its lease lives (with its token and
     * fence); a session holding the key without that row — another
     * library's session lock, or a waiter that has the lock and waits out
     * a dead holder's lease — as holder or waiter accordingly; then the
     * sessions queued for the key, in the order they began to wait. */
    [PG_INSPECT] =
        "WITH r AS (SELECT owner, owner_pid, fence, ceil(extract(epoch FROM (lease_until - "
        "clock_timestamp())) * 1000)::bigint AS ttl FROM @S.cerberus_lock WHERE name = $1::bytea "
        "AND owner IS NOT NULL AND lease_until > clock_timestamp()), "
        "k AS (SELECT pid, granted, waitstart FROM pg_locks WHERE locktype = 'advisory' AND "
        "database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND "
        "classid = $2::oid AND objid = $3::oid AND objsubid = $4::int2) "
        "SELECT waiting, who, fence, ttl, detail FROM ("
        "SELECT 0 AS waiting, 0 AS ord, NULL::timestamptz AS ws, 'backend ' || r.owner_pid AS who, "
        "r.fence AS fence, r.ttl AS ttl, 'owner ' || r.owner AS detail FROM r "
        "UNION ALL SELECT CASE WHEN k.granted AND NOT EXISTS (SELECT 1 FROM r) THEN 0 ELSE 1 END, "
        "CASE WHEN k.granted THEN 1 ELSE 2 END, k.waitstart, 'backend ' || k.pid, 0, -1, "
        "CASE WHEN k.granted THEN 'session lock, no row' ELSE 'waiting' END FROM k "
        "WHERE NOT (k.granted AND k.pid IS NOT DISTINCT FROM (SELECT owner_pid FROM r))"
        ") x ORDER BY ord, ws NULLS FIRST",
};

void cerb__pg_quote_ident(const char *id, char *out, size_t len)
{
    /* The pattern admits no '"', but double any anyway: a quoted
     * identifier is only ended by a lone '"'. */
    size_t o = 0;
    if (len < 3)
        return;
    out[o++] = '"';
    for (const char *p = id; *p && o + 3 < len; p++) {
        if (*p == '"')
            out[o++] = '"';
        out[o++] = *p;
    }
    out[o++] = '"';
    out[o] = '\0';
}

/* `tpl` with every "@S" replaced by schema_q, cerb__malloc'd. */
static char *splice(const char *tpl, const char *schema_q)
{
    size_t n = 0, ql = strlen(schema_q);
    for (const char *p = tpl; *p; p++)
        n += (p[0] == '@' && p[1] == 'S') ? (p++, ql) : 1;
    char *out = cerb__malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p = tpl; *p; p++) {
        if (p[0] == '@' && p[1] == 'S') {
            memcpy(o, schema_q, ql);
            o += ql;
            p++;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return out;
}

cerb_status cerb__pg_sql_build(cerb_engine *e)
{
    for (int i = 0; i < PG_NSTMT; i++) {
        e->sql[i] = splice(templates[i], e->schema_q);
        if (!e->sql[i])
            return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    }
    e->meta_sql = cerb__pg_sql_meta(e->schema_q);
    return e->meta_sql ? CERB_OK : cerb__error_set(CERB_ENOMEM, "pg: out of memory");
}

void cerb__pg_sql_free(cerb_engine *e)
{
    cerb__free(e->meta_sql);
    e->meta_sql = NULL;
    for (int i = 0; i < PG_NSTMT; i++) {
        cerb__free(e->sql[i]);
        e->sql[i] = NULL;
    }
}

static const char create_tpl[] =
    "CREATE TABLE IF NOT EXISTS @S.cerberus_lock (\n"
    "  name        bytea PRIMARY KEY,   -- the lock name, byte for byte\n"
    "  akey        bigint NOT NULL,     -- its advisory key (pg.key)\n"
    "  fence       bigint NOT NULL DEFAULT 0  -- last fence granted; only raised\n"
    "              CHECK (fence < 281474976710656), -- 2^48: the core's counter bits\n"
    "  owner       text,                -- owner token of the holder; NULL when free\n"
    "  owner_pid   integer,             -- the holder's pg_backend_pid()\n"
    "  lease_until timestamptz,         -- end of the lease, on the server's clock\n"
    "  acquired_at timestamptz\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS @S.cerberus_guard (\n"
    "  id     text PRIMARY KEY,         -- SHA-256 of app, scope and key (hex)\n"
    "  scope  bytea NOT NULL,\n"
    "  token  text NOT NULL,            -- the attempt that wrote it\n"
    "  state  smallint NOT NULL,        -- 1 running, 2 done\n"
    "  until  timestamptz,              -- expiry on the server's clock; NULL: never\n"
    "  result bytea\n"
    ");\n"
    "CREATE TABLE IF NOT EXISTS @S.cerberus_meta (\n"
    "  k                text PRIMARY KEY, -- 'pg': the server this schema was last seen on\n"
    "  sysid            text,             -- its system identifier (pg_control_system())\n"
    "  tli              bigint,           -- its WAL timeline\n"
    "  base             bigint NOT NULL DEFAULT 0, -- every fence is above it\n"
    "  quarantine_until timestamptz       -- after a failover, no grant before this\n"
    ");\n";

char *cerb__pg_sql_create(const char *schema_q) { return splice(create_tpl, schema_q); }

/*
 * The failover check, once per new session, before its first grant: the
 * server's identity (system identifier, WAL timeline) against the one the
 * schema's record saw last. A promoted standby starts a new timeline, and
 * asynchronous replication may have lost the last grants, renewals and
 * releases: so when they differ, the record takes the new identity, its
 * base jumps 2^32 above every fence the table still shows (lost ones
 * included, as long as fewer than 2^32 grants of one name were lost), and
 * a quarantine of $1 ms (the longest lease) starts, during which nothing
 * is granted, so every holder of the lost grants has seen its deadline
 * pass. The UPDATE judges the latest row (READ COMMITTED), so of clients
 * noticing at once one moves it and the others find it moved. A session
 * grants only after this statement saw the record match, so its grants'
 * statements see the new base and the quarantine. Answers whether this
 * statement moved it, and the identity seen. A record that is missing is
 * made the same way, quarantine included: a server cannot tell a first
 * start from a restore that lost its data (so `cerberus init` makes the
 * record, with the server's identity and no quarantine).
 */
static const char meta_tpl[] =
    "WITH cur AS (SELECT (SELECT system_identifier::text FROM pg_control_system()) AS sysid, "
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint AS tli), "
    "ins AS (INSERT INTO @S.cerberus_meta (k, sysid, tli, base, quarantine_until) SELECT 'pg', "
    "sysid, tli, (SELECT coalesce(max(fence), 0) FROM @S.cerberus_lock) + 4294967296, "
    "clock_timestamp() + $1::bigint * interval '1 millisecond' FROM cur WHERE NOT EXISTS "
    "(SELECT 1 FROM @S.cerberus_meta WHERE k = 'pg') ON CONFLICT (k) DO NOTHING RETURNING base), "
    "bump AS (UPDATE @S.cerberus_meta m SET sysid = cur.sysid, tli = cur.tli, "
    "base = GREATEST(m.base, (SELECT coalesce(max(fence), 0) FROM @S.cerberus_lock)) + "
    "4294967296, quarantine_until = GREATEST(coalesce(m.quarantine_until, clock_timestamp()), "
    "clock_timestamp() + $1::bigint * interval '1 millisecond') FROM cur WHERE m.k = 'pg' AND "
    "(m.sysid IS DISTINCT FROM cur.sysid OR m.tli IS DISTINCT FROM cur.tli) RETURNING m.base) "
    "SELECT (SELECT count(*) FROM bump), (SELECT count(*) FROM ins), cur.sysid, cur.tli, "
    "coalesce((SELECT base FROM bump), (SELECT base FROM ins)) FROM cur";

char *cerb__pg_sql_meta(const char *schema_q) { return splice(meta_tpl, schema_q); }

/* `cerberus init`: the record of a schema just prepared, with the server's
 * identity and no quarantine (nothing was granted in it before). */
static const char meta_init_tpl[] =
    "INSERT INTO @S.cerberus_meta (k, sysid, tli) SELECT 'pg', "
    "(SELECT system_identifier::text FROM pg_control_system()), "
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint "
    "ON CONFLICT (k) DO NOTHING";

char *cerb__pg_sql_meta_init(const char *schema_q) { return splice(meta_init_tpl, schema_q); }
