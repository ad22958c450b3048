/*
 * redis_guard.c — the redis engine's idempotency-guard records
 * (cerb_engine_ops version 2, DESIGN.md §11).
 *
 * One string key per record, `<redis.prefix>cerb:guard:{<hex id>}` (the id
 * in a hash tag, so a record is one cluster slot of its own). Its value is
 * binary-safe and read by position: a state byte ('R' running, 'D' done),
 * the 32-char owner token of the attempt that wrote it, then (done) the
 * result bytes. The key's PX is the record's life: running_ms for a claim,
 * keep_ms for a done-record (none with keep_ms = -1).
 *
 * Each step is one atomic server command:
 *  - begin is `SET key R<token> NX PX running_ms GET` (Redis ≥ 7.0): nil
 *    means we claimed it; an old value tells whose claim it is or carries
 *    the done-record's result, so a duplicate is answered in the same round
 *    trip. A value that is our own claim (the begin was re-sent after its
 *    answer was lost) is a claim too; the claim is then renewed at once,
 *    since it was set earlier than this request.
 *  - renew, finish and delete are Lua scripts that compare state and token
 *    first (EVALSHA; after NOSCRIPT, EVAL with the text, which caches it:
 *    the request never ran, so sending it again is safe). The SHA1s are
 *    computed here, so these scripts need nothing at open and stay out of
 *    the lock scripts' table.
 *  - check (settling an ambiguous finish) is a plain GET on a pool
 *    connection, which is never one whose last request failed.
 * The data-loss marker of the lock scripts (redis_marker.h) is not used: a
 * claim lost with the data makes renew and finish answer "not owner"
 * already, and a done-record lost with the data cannot be told from one
 * never written — detecting that (and refusing begins while it matters)
 * is left for the failover work of issue 12.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "redis_conn.h"
#include "redis_guard.h"

#define GUARD_TAG "cerb:guard:"
#define VAL_HDR 33 /* state byte + token */

enum { GS_RENEW, GS_FINISH, GS_COUNT };

static const char *const gscript_text[GS_COUNT] = {
    /* renew: KEYS[1] record; ARGV token, running_ms */
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and string.sub(v, 1, 1) == 'R' and string.sub(v, 2, 33) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return 1\n"
    "end\n"
    "return 0\n",
    /* finish: KEYS[1] record; ARGV token, succeeded ('1'/'0'), keep_ms
     * ('-1' = forever), result. 1 = done (or already done by us), 0 = not
     * ours: nothing changed. */
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v or string.sub(v, 2, 33) ~= ARGV[1] then return 0 end\n"
    "if string.sub(v, 1, 1) == 'D' then\n"
    "  if ARGV[2] == '1' then return 1 end\n"
    "  return 0\n"
    "end\n"
    "if ARGV[2] ~= '1' then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  return 1\n"
    "end\n"
    "local val = 'D' .. ARGV[1] .. ARGV[4]\n"
    "if ARGV[3] == '-1' then\n"
    "  redis.call('SET', KEYS[1], val)\n"
    "else\n"
    "  redis.call('SET', KEYS[1], val, 'PX', ARGV[3])\n"
    "end\n"
    "return 1\n",
};
static const char *const gscript_name[GS_COUNT] = {"guard renew", "guard finish"};
static char gscript_sha[GS_COUNT][41];
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

static void compute_shas(void)
{
    for (int i = 0; i < GS_COUNT; i++) {
        unsigned char d[EVP_MAX_MD_SIZE];
        unsigned n = 0;
        if (EVP_Digest(gscript_text[i], strlen(gscript_text[i]), d, &n, EVP_sha1(), NULL) != 1)
            n = 0; /* an empty SHA: every EVALSHA is NOSCRIPT, EVAL follows */
        for (unsigned j = 0; j < n && j < 20; j++)
            snprintf(gscript_sha[i] + 2 * j, 3, "%02x", d[j]);
    }
}

/* `<prefix>cerb:guard:{<id>}` into buf. */
cerb_status cerb__redis_guard_key(cerb_engine *e, const cerb_guard_rec *rec, char *buf, size_t n,
                                  size_t *len)
{
    int k = snprintf(buf, n, "%s" GUARD_TAG "{%s}", e->rc->prefix ? e->rc->prefix : "", rec->id);
    if (k < 0 || (size_t)k >= n)
        return cerb__error_set(CERB_EINVAL, "redis: guard key too long (redis.prefix)");
    *len = (size_t)k;
    return CERB_OK;
}

static cerb_status reply_error(cerb_engine *e, const char *what, const redisReply *r,
                               cerb_outcome *oc)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(e->where, what, &f, oc);
}

/* One command on a pool connection; *out is a reply that is not an error. */
static cerb_status command(cerb_engine *e, const char *what, int argc, const char **argv,
                           const size_t *argl, int64_t *sent_ns, redisReply **out,
                           cerb_outcome *oc)
{
    struct redis_conn *c;
    redisReply *r = NULL;
    size_t got = 0;
    *out = NULL;
    *oc = CERB_OUTCOME_NO;
    cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st != CERB_OK)
        return st;
    st = cerb__redis_append(c, argc, argv, argl);
    if (sent_ns)
        *sent_ns = cerb_monotime();
    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, what, &r, &got, oc);
    cerb__redis_put(e, c);
    if (st != CERB_OK)
        return st;
    if (r->type == REDIS_REPLY_ERROR) {
        st = reply_error(e, what, r, oc);
        freeReplyObject(r);
        return st;
    }
    *out = r;
    return CERB_OK;
}

/* Run guard script `id` with one key and nargs arguments. */
static cerb_status gscript(cerb_engine *e, int id, const char *key, size_t keylen, int nargs,
                           const char **args, const size_t *argl, int64_t *sent_ns,
                           redisReply **out, cerb_outcome *oc)
{
    const char *argv[4 + 4];
    size_t alen[4 + 4];
    pthread_once(&sha_once, compute_shas);
    for (int attempt = 0; attempt < 2; attempt++) {
        struct redis_conn *c;
        redisReply *r = NULL;
        size_t got = 0;
        int n = 0;
        if (attempt == 0)
            argv[n] = "EVALSHA", alen[n++] = 7, argv[n] = gscript_sha[id], alen[n++] = 40;
        else
            argv[n] = "EVAL", alen[n++] = 4, argv[n] = gscript_text[id],
            alen[n++] = strlen(gscript_text[id]);
        argv[n] = "1", alen[n++] = 1;
        argv[n] = key, alen[n++] = keylen;
        for (int i = 0; i < nargs && i < 4; i++)
            argv[n] = args[i], alen[n++] = argl[i];
        *oc = CERB_OUTCOME_NO;
        cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
        if (st != CERB_OK)
            return st;
        st = cerb__redis_append(c, n, argv, alen);
        if (attempt == 0 && sent_ns)
            *sent_ns = cerb_monotime();
        if (st == CERB_OK)
            st = cerb__redis_exchange(e, c, gscript_name[id], &r, &got, oc);
        cerb__redis_put(e, c);
        if (st != CERB_OK)
            return st;
        if (attempt == 0 && cerb__redis_is_noscript(r)) {
            freeReplyObject(r); /* it did not run: EVAL loads and runs it */
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            st = reply_error(e, gscript_name[id], r, oc);
            if (cerb__redis_script_may_have_run(r))
                *oc = CERB_OUTCOME_UNKNOWN;
            freeReplyObject(r);
            return st;
        }
        *out = r;
        return CERB_OK;
    }
    return cerb__error_set(CERB_EPROTO, "redis %s: %s: NOSCRIPT after EVAL", e->where,
                           gscript_name[0]);
}

/* Parse a record value: state and whether the token is ours. */
static bool parse_value(const redisReply *r, const cerb_guard_rec *rec, char *state, bool *mine)
{
    if (r->type != REDIS_REPLY_STRING || r->len < VAL_HDR || (r->str[0] != 'R' && r->str[0] != 'D'))
        return false;
    *state = r->str[0];
    *mine = memcmp(r->str + 1, rec->token, 32) == 0;
    return true;
}

cerb_status cerb__redis_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    char key[512], ms[24];
    size_t klen = 0;
    redisReply *r;
    cerb_status st = cerb__redis_guard_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    snprintf(ms, sizeof ms, "%" PRId64, rec->running_ms);
    const char *args[2] = {rec->token, ms};
    size_t argl[2] = {32, strlen(ms)};
    st = gscript(e, GS_RENEW, key, klen, 2, args, argl, &g->sent_ns, &r, &g->outcome);
    if (st != CERB_OK)
        return st;
    if (r->type != REDIS_REPLY_INTEGER)
        st = reply_error(e, "guard renew", r, &g->outcome);
    else if (r->integer != 1)
        st = cerb__error_set(CERB_NOT_OWNER, "redis %s: guard record %s is no longer this "
                             "attempt's claim", e->where, rec->id);
    else
        g->ttl_ms = rec->running_ms;
    freeReplyObject(r);
    return st;
}

cerb_status cerb__redis_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                    void **result, size_t *result_len)
{
    char key[512], ms[24], val[VAL_HDR];
    size_t klen = 0;
    redisReply *r;
    cerb_status st = cerb__redis_guard_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    snprintf(ms, sizeof ms, "%" PRId64, rec->running_ms);
    val[0] = 'R';
    memcpy(val + 1, rec->token, 32);
    const char *argv[8] = {"SET", key, val, "NX", "PX", ms, "GET"};
    size_t argl[8] = {3, klen, VAL_HDR, 2, 2, strlen(ms), 3};
    st = command(e, "guard begin", 7, argv, argl, &g->sent_ns, &r, &g->outcome);
    if (st != CERB_OK)
        return st;
    char state;
    bool mine;
    if (r->type == REDIS_REPLY_NIL) {
        g->ttl_ms = rec->running_ms; /* claimed */
    } else if (!parse_value(r, rec, &state, &mine)) {
        st = cerb__error_set(CERB_EPROTO, "redis %s: %s holds no guard record (type %d)",
                             e->where, key, r->type);
    } else if (state == 'D') {
        char *copy = cerb__malloc(r->len - VAL_HDR + 1);
        if (!copy) {
            st = cerb__error_set(CERB_ENOMEM, "redis: out of memory");
        } else {
            memcpy(copy, r->str + VAL_HDR, r->len - VAL_HDR);
            copy[r->len - VAL_HDR] = '\0';
            *result = copy;
            *result_len = r->len - VAL_HDR;
            st = CERB_DUPLICATE;
        }
    } else if (mine) {
        /* Our own claim, set by an earlier request whose answer was lost:
         * renew it now, so its life is counted from this request. */
        freeReplyObject(r);
        return cerb__redis_guard_renew(e, rec, g);
    } else {
        st = CERB_BUSY;
    }
    freeReplyObject(r);
    return st;
}

cerb_status cerb__redis_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                     const void *result, size_t len, int64_t keep_ms,
                                     cerb_outcome *oc)
{
    char key[512], keep[24];
    size_t klen = 0;
    redisReply *r;
    cerb_status st = cerb__redis_guard_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    snprintf(keep, sizeof keep, "%" PRId64, keep_ms < 0 ? (int64_t)-1 : keep_ms);
    const char *args[4] = {rec->token, ok ? "1" : "0", keep, len ? (const char *)result : ""};
    size_t argl[4] = {32, 1, strlen(keep), len};
    st = gscript(e, GS_FINISH, key, klen, 4, args, argl, NULL, &r, oc);
    if (st != CERB_OK)
        return st;
    if (r->type != REDIS_REPLY_INTEGER)
        st = reply_error(e, "guard finish", r, oc);
    else if (r->integer != 1)
        st = cerb__error_set(CERB_NOT_OWNER, "redis %s: guard record %s is not this attempt's "
                             "claim", e->where, rec->id);
    freeReplyObject(r);
    return st;
}

cerb_status cerb__redis_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                    cerb_guard_found *found)
{
    char key[512];
    size_t klen = 0;
    redisReply *r;
    cerb_outcome oc;
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = cerb__redis_guard_key(e, rec, key, sizeof key, &klen);
    if (st != CERB_OK)
        return st;
    const char *argv[2] = {"GET", key};
    size_t argl[2] = {3, klen};
    st = command(e, "guard check", 2, argv, argl, NULL, &r, &oc);
    if (st != CERB_OK)
        return st;
    char state;
    bool mine;
    if (r->type == REDIS_REPLY_NIL)
        *found = CERB_GUARD_FOUND_NONE;
    else if (!parse_value(r, rec, &state, &mine))
        st = cerb__error_set(CERB_EPROTO, "redis %s: %s holds no guard record", e->where, key);
    else if (!mine)
        *found = CERB_GUARD_FOUND_OTHER;
    else
        *found = state == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
    freeReplyObject(r);
    return st;
}
