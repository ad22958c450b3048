/*
 * ceiling_guard.c — the raw ceilings of the guard scenario: for each
 * engine, the server commands the idempotency guard's layout (DESIGN.md
 * §11) sends for a begin + finish(1) and for a duplicate, on a bare client
 * connection with no library logic (no SHA-256 of the key, no fresh token,
 * no handle, no renewer, no breaker), so the bench can say what fraction
 * of the server's speed the guard keeps.
 *
 * Redis, as engine_redis/redis_guard.c does it: a record is the key
 * `<redis.prefix>cerb:guard:{<64 hex>}\x1f`; begin is EVALSHA of the guard's
 * begin script (SET key R<token> NX PX running_ms GET, and when that
 * claimed, a GET of the record's key of older versions, without the \x1f)
 * and finish(1) is EVALSHA of the guard's finish script, both the very
 * text of redis_guard.c (kept equal by hand; tests/bench/test_bench_guard.sh
 * compares them); finish compares the token and rewrites the value as
 * D<token><result> with PX keep_ms. A duplicate is the same begin on a done
 * record: one round trip (the script and its SET), whose answer carries the
 * result. The session is the plain Redis ceiling's connection (ceiling.c:
 * timeouts, AUTH, SELECT), plus the scripts loaded with SCRIPT LOAD (again
 * on NOSCRIPT). The id is 64 hex
 * characters made from the caller's counters, as long as a SHA-256 hex, and
 * the token is fixed per thread. The session also reads INFO commandstats,
 * so the scenario counts the commands the server ran during the library's
 * phases (every command but INFO itself).
 *
 * zk, etcd, pg and mysql: their raw steps are in ceiling_guard_zk.c,
 * ceiling_guard_etcd.c, ceiling_guard_pg.c and ceiling_guard_mysql.c
 * (listed at the HOOK below). local has no server, so no ceiling.
 */
#include <hiredis/hiredis.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scenarios.h"

/* engine_redis/redis_guard.c, gscript_text[GS_BEGIN] and [GS_FINISH], byte
 * for byte (compared by tests/bench/test_bench_guard.sh). */
static const char begin_script[] =
    "local v = redis.pcall('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')\n"
    "if type(v) == 'table' then\n"
    "  if string.sub(v.err, 1, 9) == 'WRONGTYPE' then return 0 end\n"
    "  return v\n"
    "end\n"
    "if v or not KEYS[2] then return v end\n"
    "local o = redis.pcall('GET', KEYS[2])\n"
    "if type(o) == 'string' and #o >= 33 and\n"
    "    string.find(string.sub(o, 1, 33), '^[RD][0-9a-f]+$') then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  return {o}\n"
    "end\n"
    "return false\n";
static const char finish_script[] =
    "for i = 1, #KEYS do\n"
    "  local k = KEYS[i]\n"
    "  local v = redis.pcall('GET', k)\n"
    "  if type(v) == 'string' and string.sub(v, 2, 33) == ARGV[1] then\n"
    "    local s = string.sub(v, 1, 1)\n"
    "    if s == 'D' then\n"
    "      if ARGV[2] == '1' then return 1 end\n"
    "      return 0\n"
    "    end\n"
    "    if s ~= 'R' then return 0 end\n"
    "    if ARGV[2] ~= '1' then\n"
    "      redis.call('DEL', k)\n"
    "      return 1\n"
    "    end\n"
    "    local val = 'D' .. ARGV[1] .. ARGV[4]\n"
    "    if ARGV[3] == '-1' then\n"
    "      redis.call('SET', k, val)\n"
    "    else\n"
    "      redis.call('SET', k, val, 'PX', ARGV[3])\n"
    "    end\n"
    "    return 1\n"
    "  end\n"
    "end\n"
    "return 0\n";

struct rg_sess {
    void *base;        /* bench_redis_open's session */
    redisContext *ctx; /* its connection */
    char sha[41];      /* finish */
    char bsha[41];     /* begin */
    char prefix[256];  /* redis.prefix */
};

static void rg_err(struct rg_sess *s, redisReply *r, const char *what, char *err,
                   size_t errlen)
{
    if (!r)
        snprintf(err, errlen, "redis %s: %s", what,
                 s->ctx->errstr[0] ? s->ctx->errstr : "connection failed");
    else if (r->type == REDIS_REPLY_ERROR)
        snprintf(err, errlen, "redis %s: %s", what, r->str);
    else
        snprintf(err, errlen, "redis %s: unexpected reply type %d", what, r->type);
}

static int rg_load1(struct rg_sess *s, const char *text, char *sha, const char *what, char *err,
                    size_t errlen)
{
    redisReply *r = redisCommand(s->ctx, "SCRIPT LOAD %s", text);
    int rc = -1;
    if (r && r->type == REDIS_REPLY_STRING && r->len == 40) {
        memcpy(sha, r->str, 40);
        sha[40] = '\0';
        rc = 0;
    } else {
        rg_err(s, r, what, err, errlen);
    }
    if (r)
        freeReplyObject(r);
    return rc;
}

static int rg_load(struct rg_sess *s, char *err, size_t errlen)
{
    if (rg_load1(s, finish_script, s->sha, "SCRIPT LOAD (guard finish)", err, errlen) != 0)
        return -1;
    return rg_load1(s, begin_script, s->bsha, "SCRIPT LOAD (guard begin)", err, errlen);
}

static void rg_close(void *p)
{
    struct rg_sess *s = p;
    if (!s)
        return;
    bench_redis_close(s->base);
    free(s);
}

static void *rg_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct rg_sess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(s->base = bench_redis_open(e, err, errlen))) {
        free(s);
        return NULL;
    }
    s->ctx = bench_redis_context(s->base);
    snprintf(s->prefix, sizeof s->prefix, "%s",
             e->cfg && e->cfg->redis.prefix ? e->cfg->redis.prefix : "");
    if (rg_load(s, err, errlen) != 0) {
        rg_close(s);
        return NULL;
    }
    return s;
}

static int rg_key(struct rg_sess *s, const char *id, char *buf, size_t n)
{
    return snprintf(buf, n, "%scerb:guard:{%s}\x1f", s->prefix, id);
}

/* SET key R<token> NX PX running_ms GET: 1 claimed (nil), 0 the old value
 * is a done-record (state 'D'), -1 anything else (in @err). */
static int rg_begin(struct rg_sess *s, const char *key, int klen, const char *token,
                    int64_t running_ms, char *err, size_t errlen)
{
    char val[33];
    int rc;
    val[0] = 'R';
    memcpy(val + 1, token, 32);
    redisReply *r = redisCommand(s->ctx, "EVALSHA %s 2 %b %b %b %" PRId64, s->bsha, key,
                                 (size_t)klen, key, (size_t)klen - 1, val, sizeof val, running_ms);
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(r);
        if (rg_load(s, err, errlen) != 0)
            return -1;
        r = redisCommand(s->ctx, "EVALSHA %s 2 %b %b %b %" PRId64, s->bsha, key, (size_t)klen,
                         key, (size_t)klen - 1, val, sizeof val, running_ms);
    }
    if (r && r->type == REDIS_REPLY_NIL)
        rc = 1;
    else if (r && r->type == REDIS_REPLY_STRING && r->len >= 33 && r->str[0] == 'D')
        rc = 0;
    else {
        if (r && r->type == REDIS_REPLY_STRING)
            snprintf(err, errlen, "redis guard begin on %s: a record in state '%c'", key,
                     r->len ? r->str[0] : '?');
        else
            rg_err(s, r, "EVALSHA (guard begin)", err, errlen);
        rc = -1;
    }
    if (r)
        freeReplyObject(r);
    return rc;
}

static int rg_cycle(void *p, const char *id, const char *token, const void *result,
                    size_t len, int64_t running_ms, int64_t keep_ms, char *err, size_t errlen)
{
    struct rg_sess *s = p;
    char key[400], keep[24];
    int klen = rg_key(s, id, key, sizeof key);
    int got = rg_begin(s, key, klen, token, running_ms, err, errlen);
    redisReply *r;

    if (got == 0)
        snprintf(err, errlen, "redis guard begin on %s: already done", key);
    if (got != 1)
        return -1;
    snprintf(keep, sizeof keep, "%" PRId64, keep_ms);
    for (int attempt = 0;; attempt++) {
        r = redisCommand(s->ctx, "EVALSHA %s 2 %b %b %b 1 %s %b", s->sha, key, (size_t)klen,
                         key, (size_t)klen - 1, token, (size_t)32, keep, result, len);
        /* The server lost its script cache (restart, SCRIPT FLUSH). */
        if (r && r->type == REDIS_REPLY_ERROR && attempt == 0 &&
            strncmp(r->str, "NOSCRIPT", 8) == 0) {
            freeReplyObject(r);
            if (rg_load(s, err, errlen) != 0)
                return -1;
            continue;
        }
        break;
    }
    int rc = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1 ? 0 : -1;
    if (rc != 0 && r && r->type == REDIS_REPLY_INTEGER)
        snprintf(err, errlen, "redis guard finish on %s: not our claim", key);
    else if (rc != 0)
        rg_err(s, r, "EVALSHA (guard finish)", err, errlen);
    if (r)
        freeReplyObject(r);
    return rc;
}

static int rg_duplicate(void *p, const char *id, const char *token, int64_t running_ms,
                        char *err, size_t errlen)
{
    struct rg_sess *s = p;
    char key[400];
    int klen = rg_key(s, id, key, sizeof key);
    int got = rg_begin(s, key, klen, token, running_ms, err, errlen);
    if (got == 1)
        snprintf(err, errlen, "redis guard begin on %s: claimed, not a duplicate (expired?)",
                 key);
    return got == 0 ? 0 : -1;
}

/* The calls of every command in INFO commandstats but INFO's own (the
 * snapshots themselves). */
static int rg_commands(void *p, uint64_t *out, char *err, size_t errlen)
{
    struct rg_sess *s = p;
    redisReply *r = redisCommand(s->ctx, "INFO commandstats");
    uint64_t sum = 0;

    if (!r || r->type != REDIS_REPLY_STRING) {
        rg_err(s, r, "INFO commandstats", err, errlen);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    /* Lines: cmdstat_<name>:calls=<n>,usec=...; the reply ends in NUL. */
    for (const char *line = r->str; line && *line;) {
        const char *eol = strchr(line, '\n');
        if (strncmp(line, "cmdstat_", 8) == 0 && strncmp(line, "cmdstat_info:", 13) != 0) {
            const char *c = strstr(line, ":calls=");
            if (c && (!eol || c < eol))
                sum += strtoull(c + 7, NULL, 10);
        }
        line = eol ? eol + 1 : NULL;
    }
    freeReplyObject(r);
    *out = sum;
    return 0;
}

static const struct bench_guard_ceiling redis_guard_ceiling = {
    "redis", rg_open, rg_cycle, rg_duplicate, rg_commands, rg_close,
};

/*
 * The engines the guard scenario knows. An entry with a NULL ceiling is
 * reported as "no ceiling for engine <name> (<why>)" with a null ratio.
 *
 * HOOK (zk, etcd): when the zk and etcd guards land (engine_zk/zk_guard.c,
 * engine_etcd/etcd_guard.c, being written apart from this file), put their
 * raw steps in a file of their own each (ceiling_guard_zk.c — done —,
 * ceiling_guard_etcd.c, built under CERB_WITH_ZK / CERB_WITH_ETCD like
 * ceiling_zk.c and ceiling_etcd.c), declare them in scenarios.h next to
 * bench_guard_ceiling_zk, and replace the NULL here: the scenario needs
 * nothing else. The commands must be those the engine's
 * layout sends (DESIGN.md §11: zk, the create multi with a getData, then
 * the finish multi, as engine_zk/zk_guard.c's file comment gives; etcd, the txn on create_revision == 0 with the
 * record's lease, then the token-comparing txn), with fixed ids and tokens
 * and nothing of the library. server_commands may be NULL where the server
 * cannot count its requests. etcd: done (ceiling_guard_etcd.c, its
 * requests counted from /metrics). pg and mysql (their SQL guards,
 * engine_pg/pg_guard.c and engine_mysql/my_guard.c): done the same way
 * (ceiling_guard_pg.c: the begin and finish statements prepared, writes
 * counted by transaction ids; ceiling_guard_mysql.c: the begin, the
 * finish and a duplicate's follow-up SELECT prepared, statements counted
 * by Questions).
 */
static const struct {
    const char *engine;
    const struct bench_guard_ceiling *ceil;
    const char *why;
} guard_ceilings[] = {
    {"redis", &redis_guard_ceiling, NULL},
#if CERB_WITH_ZK
    {"zk", &bench_guard_ceiling_zk, NULL},
#else
    {"zk", NULL, "built without zk"},
#endif
#ifdef CERB_WITH_ETCD
    {"etcd", &bench_guard_ceiling_etcd, NULL}, /* ceiling_guard_etcd.c */
#else
    {"etcd", NULL, "this build has no etcd engine"},
#endif
#ifdef CERB_WITH_PG
    {"pg", &bench_guard_ceiling_pg, NULL}, /* ceiling_guard_pg.c */
#else
    {"pg", NULL, "this build has no pg engine"},
#endif
#ifdef CERB_WITH_MYSQL
    {"mysql", &bench_guard_ceiling_mysql, NULL}, /* ceiling_guard_mysql.c */
#else
    {"mysql", NULL, "this build has no mysql engine"},
#endif
    {"local", NULL, "in-process: there is no server"},
};

const struct bench_guard_ceiling *bench_guard_ceiling_find(const char *engine, const char **why)
{
    for (size_t i = 0; i < sizeof guard_ceilings / sizeof guard_ceilings[0]; i++)
        if (strcmp(guard_ceilings[i].engine, engine) == 0) {
            *why = guard_ceilings[i].why;
            return guard_ceilings[i].ceil;
        }
    *why = "no raw guard steps for this engine";
    return NULL;
}
