/*
 * redis_guard.c — the redis engine's idempotency-guard records
 * (cerb_engine_ops version 2, DESIGN.md §11).
 *
 * One string key per record, `<redis.prefix>cerb:guard:{<hex id>}` and then
 * the byte 0x1f (REDIS_SEP). A lock's key is `<redis.prefix><name>` and
 * lock names may not hold a control byte, so no lock's key is a record's.
 * Without the 0x1f they met: a lock named `cerb:guard:{<id>}` held the
 * record's key, the guard took its token for a broken record (EPROTO, fed
 * to the breaker, which opened and switched the client away), and a
 * done-record kept that lock BUSY for keep_ms. The 0x1f goes last, behind
 * the hash tag, so the key hashes to the slot of the key without it (the
 * "legacy" key) whatever hash tag redis.prefix holds; only a prefix whose
 * first '{' is followed at once by '}' makes Redis hash whole keys, which
 * puts the two in different slots.
 *
 * The value is binary-safe and read by position: a state byte ('R' running,
 * 'D' done), the 32-char owner token (lowercase hex) of the attempt that
 * wrote it, then (done) the result bytes. The key's PX is the record's
 * life: running_ms for a claim, keep_ms for a done-record (none with
 * keep_ms = -1).
 *
 * Upgrade. Records of versions before the 0x1f sit at the legacy key and
 * stay in force for their life (keep_ms, or forever): every step declares
 * both keys and reads the legacy one too, but writes a new claim at the new
 * key only; renew and finish change whichever key holds this attempt's
 * record. A legacy value that is no guard record (a state byte, then 32
 * lowercase hex) is not ours: a lock's token there means the key is that
 * lock's, so it is ignored. In cluster mode with a prefix that puts the two
 * keys in different slots, no step can read both, and the legacy key is left
 * out.
 *
 * Each step is one atomic server command:
 *  - begin is a script around `SET key R<token> NX PX running_ms GET`
 *    (Redis >= 7.0) on the new key: its old value tells whose claim it is
 *    or carries the done-record's result, so a duplicate is answered in the
 *    same round trip. When it claimed, a record at the legacy key wins: the
 *    claim is deleted again and that record answered. A value that is our
 *    own claim (the begin was re-sent after its answer was lost) is a claim
 *    too; the claim is then renewed at once, since it was set earlier than
 *    this request.
 *  - renew, finish and delete (a finish that did not succeed) are scripts
 *    that compare state and token first.
 *  - check (settling an ambiguous finish) is one MGET of both keys on a pool
 *    connection, which is never one whose last request failed.
 * Scripts go by EVALSHA; after NOSCRIPT, EVAL with the text, which caches
 * it (the request never ran, so sending it again is safe). The SHA1s are
 * computed here, so these scripts need nothing at open and stay out of the
 * lock scripts' table.
 *
 * Something at the new key that is no guard record was put there by hand or
 * by a later version (nothing else writes there). It is an answer, not an
 * engine failure: begin answers BUSY and leaves it (taking it over could run
 * an operation a later version recorded as done), renew and finish find no
 * claim of this attempt (CERB_NOT_OWNER), check finds another's.
 *
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
#include "log.h"
#include "redis_cluster.h"
#include "redis_conn.h"
#include "redis_guard.h"
#include "redis_scripts.h"

#define GUARD_TAG "cerb:guard:"
#define VAL_HDR 33 /* state byte + token */

/* The keys a step declares: the record's, then its legacy key (n = 2), or
 * the record's alone where cluster mode puts the two in different slots. */
struct gkeys {
    char k[2][512];
    size_t len[2];
    int n;
};

enum { GS_BEGIN, GS_RENEW, GS_FINISH, GS_COUNT };

static const char *const gscript_text[GS_COUNT] = {
    /* begin: KEYS[1] record, KEYS[2] (if declared) legacy key; ARGV
     * 'R'..token, running_ms. nil = claimed; a string = the record key's
     * value (not claimed); 0 = the record key holds no string; {value} = a
     * guard record at the legacy key (the claim undone). Only WRONGTYPE is
     * an answer: any other refusal of the SET (OOM) is the server's error. */
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
    "return false\n",
    /* renew: KEYS the record (and its legacy key); ARGV token, running_ms.
     * 1 = renewed, 0 = no running claim of this token. */
    "for i = 1, #KEYS do\n"
    "  local v = redis.pcall('GET', KEYS[i])\n"
    "  if type(v) == 'string' and string.sub(v, 2, 33) == ARGV[1] then\n"
    "    if string.sub(v, 1, 1) ~= 'R' then return 0 end\n"
    "    redis.call('PEXPIRE', KEYS[i], ARGV[2])\n"
    "    return 1\n"
    "  end\n"
    "end\n"
    "return 0\n",
    /* finish: KEYS the record (and its legacy key); ARGV token, succeeded
     * ('1'/'0'), keep_ms ('-1' = forever), result. 1 = done (or already
     * done by us), 0 = not ours: nothing changed. */
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
    "return 0\n",
};
static const char *const gscript_name[GS_COUNT] = {"guard begin", "guard renew",
                                                   "guard finish"};
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

/* `<prefix>cerb:guard:{<id>}`, and 0x1f after it unless legacy. */
static cerb_status key_of(cerb_engine *e, const cerb_guard_rec *rec, bool legacy, char *buf,
                          size_t n, size_t *len)
{
    int k = snprintf(buf, n, "%s" GUARD_TAG "{%s}%s", e->rc->prefix ? e->rc->prefix : "",
                     rec->id, legacy ? "" : REDIS_SEP);
    if (k < 0 || (size_t)k >= n)
        return cerb__error_set(CERB_EINVAL, "redis: guard key too long (redis.prefix)");
    *len = (size_t)k;
    return CERB_OK;
}

cerb_status cerb__redis_guard_key(cerb_engine *e, const cerb_guard_rec *rec, char *buf, size_t n,
                                  size_t *len)
{
    return key_of(e, rec, false, buf, n, len);
}

static cerb_status gkeys_init(cerb_engine *e, const cerb_guard_rec *rec, struct gkeys *ks)
{
    cerb_status st = key_of(e, rec, false, ks->k[0], sizeof ks->k[0], &ks->len[0]);
    if (st == CERB_OK)
        st = key_of(e, rec, true, ks->k[1], sizeof ks->k[1], &ks->len[1]);
    if (st != CERB_OK)
        return st;
    /* A cluster node refuses a script whose keys are in two slots
     * (CROSSSLOT); the record's key is the one routed by (redis_cluster.c). */
    ks->n = e->cl && cerb__redis_key_slot(ks->k[0], ks->len[0]) !=
                         cerb__redis_key_slot(ks->k[1], ks->len[1])
                ? 1
                : 2;
    return CERB_OK;
}

/* A guard record's shape, as the begin script tests the legacy key's. */
static bool is_record(const char *s, size_t len)
{
    if (len < VAL_HDR || (s[0] != 'R' && s[0] != 'D'))
        return false;
    for (size_t i = 1; i < VAL_HDR; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static cerb_status reply_error(cerb_engine *e, const char *what, const redisReply *r,
                               cerb_outcome *oc)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(e->where, what, &f, oc);
}

/* One command on a pool connection; *out is a reply that is not an error. */
static cerb_status command(cerb_engine *e, const char *what, int argc, const char **argv,
                           const size_t *argl, redisReply **out, cerb_outcome *oc)
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

/* Run guard script `id` on ks's keys with nargs arguments. */
static cerb_status gscript(cerb_engine *e, int id, const struct gkeys *ks, int nargs,
                           const char **args, const size_t *argl, int64_t *sent_ns,
                           redisReply **out, cerb_outcome *oc)
{
    const char *argv[3 + 2 + 4];
    size_t alen[3 + 2 + 4];
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
        argv[n] = ks->n == 2 ? "2" : "1", alen[n++] = 1;
        for (int i = 0; i < ks->n; i++)
            argv[n] = ks->k[i], alen[n++] = ks->len[i];
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
                           gscript_name[id]);
}

cerb_status cerb__redis_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    struct gkeys ks;
    char ms[24];
    redisReply *r;
    cerb_status st = gkeys_init(e, rec, &ks);
    if (st != CERB_OK)
        return st;
    snprintf(ms, sizeof ms, "%" PRId64, rec->running_ms);
    const char *args[2] = {rec->token, ms};
    size_t argl[2] = {32, strlen(ms)};
    st = gscript(e, GS_RENEW, &ks, 2, args, argl, &g->sent_ns, &r, &g->outcome);
    if (st != CERB_OK)
        return st;
    if (r->type != REDIS_REPLY_INTEGER)
        st = cerb__error_set(CERB_EPROTO, "redis %s: guard renew: unexpected reply (type %d)",
                             e->where, r->type);
    else if (r->integer != 1)
        st = cerb__error_set(CERB_NOT_OWNER, "redis %s: guard record %s is no longer this "
                             "attempt's claim", e->where, rec->id);
    else
        g->ttl_ms = rec->running_ms;
    freeReplyObject(r);
    return st;
}

/* The record key holds something that is no guard record: see the file
 * comment. BUSY is an answer the core does not count against the engine. */
static cerb_status not_a_record(cerb_engine *e, const struct gkeys *ks, const char *what)
{
    CERB_LOG_W("redis %s: %s\\x1f holds %s, not a guard record; its begins answer BUSY "
               "until it is deleted", e->where, ks->k[1], what);
    return cerb__error_set(CERB_BUSY, "redis %s: %s\\x1f holds %s, not a guard record",
                           e->where, ks->k[1], what);
}

cerb_status cerb__redis_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                    void **result, size_t *result_len)
{
    struct gkeys ks;
    char ms[24], val[VAL_HDR];
    redisReply *r;
    cerb_status st = gkeys_init(e, rec, &ks);
    if (st != CERB_OK)
        return st;
    snprintf(ms, sizeof ms, "%" PRId64, rec->running_ms);
    val[0] = 'R';
    memcpy(val + 1, rec->token, 32);
    const char *args[2] = {val, ms};
    size_t argl[2] = {VAL_HDR, strlen(ms)};
    st = gscript(e, GS_BEGIN, &ks, 2, args, argl, &g->sent_ns, &r, &g->outcome);
    if (st != CERB_OK)
        return st;
    /* v: the record found, at the record's key or (an array of one) the
     * legacy key; the script sends only records from there. */
    const redisReply *v = r;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1)
        v = r->element[0];
    if (r->type == REDIS_REPLY_NIL) {
        g->ttl_ms = rec->running_ms; /* claimed */
    } else if (r->type == REDIS_REPLY_INTEGER) {
        st = not_a_record(e, &ks, "another type than a string");
    } else if (v->type != REDIS_REPLY_STRING || (v != r && !is_record(v->str, v->len))) {
        st = cerb__error_set(CERB_EPROTO, "redis %s: guard begin: unexpected reply (type %d)",
                             e->where, r->type);
    } else if (!is_record(v->str, v->len)) {
        st = not_a_record(e, &ks, "a string");
    } else if (v->str[0] == 'D') {
        char *copy = cerb__malloc(v->len - VAL_HDR + 1);
        if (!copy) {
            st = cerb__error_set(CERB_ENOMEM, "redis: out of memory");
        } else {
            memcpy(copy, v->str + VAL_HDR, v->len - VAL_HDR);
            copy[v->len - VAL_HDR] = '\0';
            *result = copy;
            *result_len = v->len - VAL_HDR;
            st = CERB_DUPLICATE;
        }
    } else if (memcmp(v->str + 1, rec->token, 32) == 0) {
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
    struct gkeys ks;
    char keep[24];
    redisReply *r;
    cerb_status st = gkeys_init(e, rec, &ks);
    if (st != CERB_OK)
        return st;
    snprintf(keep, sizeof keep, "%" PRId64, keep_ms < 0 ? (int64_t)-1 : keep_ms);
    const char *args[4] = {rec->token, ok ? "1" : "0", keep, len ? (const char *)result : ""};
    size_t argl[4] = {32, 1, strlen(keep), len};
    st = gscript(e, GS_FINISH, &ks, 4, args, argl, NULL, &r, oc);
    if (st != CERB_OK)
        return st;
    if (r->type != REDIS_REPLY_INTEGER)
        st = cerb__error_set(CERB_EPROTO, "redis %s: guard finish: unexpected reply (type %d)",
                             e->where, r->type);
    else if (r->integer != 1)
        st = cerb__error_set(CERB_NOT_OWNER, "redis %s: guard record %s is not this attempt's "
                             "claim", e->where, rec->id);
    freeReplyObject(r);
    return st;
}

cerb_status cerb__redis_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                    cerb_guard_found *found)
{
    struct gkeys ks;
    redisReply *r;
    cerb_outcome oc;
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = gkeys_init(e, rec, &ks);
    if (st != CERB_OK)
        return st;
    /* MGET answers nil for a key that holds no string. */
    const char *argv[3] = {"MGET", ks.k[0], ks.k[1]};
    size_t argl[3] = {4, ks.len[0], ks.len[1]};
    st = command(e, "guard check", 1 + ks.n, argv, argl, &r, &oc);
    if (st != CERB_OK)
        return st;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)ks.n) {
        st = cerb__error_set(CERB_EPROTO, "redis %s: guard check: unexpected reply (type %d)",
                             e->where, r->type);
        freeReplyObject(r);
        return st;
    }
    for (int i = 0; i < ks.n; i++) {
        const redisReply *v = r->element[i];
        if (v->type != REDIS_REPLY_STRING)
            continue;
        bool rec_shape = is_record(v->str, v->len);
        if (rec_shape && memcmp(v->str + 1, rec->token, 32) == 0) {
            *found = v->str[0] == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
            break;
        }
        /* Anything at the record's key is not ours; at the legacy key only
         * a record is (a lock's token there is the lock's). */
        if ((i == 0 || rec_shape) && *found == CERB_GUARD_FOUND_NONE)
            *found = CERB_GUARD_FOUND_OTHER;
    }
    freeReplyObject(r);
    return st;
}
