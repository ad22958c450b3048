/*
 * redis_closure.c — reading and raising the closure record
 * (redis_closure.h). Both are rare (the core reads once per probe round
 * while it has left this engine, and writes after a switch), so they use
 * EVAL and a plain GET rather than cached scripts.
 */
#include "internal_posix.h"

#include "redis_closure.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "redis_errors.h"

/* KEYS C, ARGV epoch value: store value unless the record's epoch is at
 * least epoch; answer the record stored afterwards. A damaged record is
 * replaced: it refuses every acquisition until then. */
static const char lua_put[] =
    "local cv = redis.call('GET', KEYS[1])\n"
    "local ce = cv and tonumber(string.match(cv, '^(%d+) [a-z]+$'))\n"
    "if ce and ce >= tonumber(ARGV[1]) then return cv end\n"
    "redis.call('SET', KEYS[1], ARGV[2])\n"
    "return ARGV[2]\n";

cerb_status cerb__redis_closure_init(cerb_engine *e)
{
    static const char tail[] = "\x1f" "closure";
    if (e->rc->mode == CERB_REDIS_CLUSTER || !e->marker_key)
        return CERB_OK;
    e->closure_key = cerb__malloc(e->marker_key_len + sizeof tail);
    if (!e->closure_key)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    memcpy(e->closure_key, e->marker_key, e->marker_key_len);
    memcpy(e->closure_key + e->marker_key_len, tail, sizeof tail);
    e->closure_key_len = e->marker_key_len + sizeof tail - 1;
    return CERB_OK;
}

void cerb__redis_closure_destroy(cerb_engine *e)
{
    cerb__free(e->closure_key);
    e->closure_key = NULL;
}

bool cerb__redis_closure_parse(const char *s, size_t n, cerb_closure *out)
{
    char buf[40];
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *sp = strchr(buf, ' ');
    if (!sp || sp == buf)
        return false;
    for (char *p = buf; p < sp; p++)
        if (*p < '0' || *p > '9')
            return false;
    char *end;
    long long ep = strtoll(buf, &end, 10);
    if (end != sp || ep <= 0 || ep > 65535)
        return false;
    if (strcmp(sp + 1, "closed") == 0)
        out->closed = 1;
    else if (strcmp(sp + 1, "open") == 0)
        out->closed = 0;
    else
        return false;
    out->epoch = ep;
    return true;
}

static cerb_status no_record_here(cerb_engine *e)
{
    return cerb__error_set(CERB_UNAVAILABLE, "redis %s: a cluster keeps no closure records", e->where);
}

/* One command on a pool connection, its reply in *r (caller frees). */
static cerb_status one(cerb_engine *e, const char *what, int argc, const char **argv,
                       const size_t *argl, redisReply **r)
{
    struct redis_conn *c;
    size_t got = 0;
    cerb_outcome oc;
    *r = NULL;
    cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st != CERB_OK)
        return st;
    st = cerb__redis_append(c, argc, argv, argl);
    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, what, r, &got, &oc);
    cerb__redis_put(e, c);
    return st;
}

/* A record answered by GET or the put script: nil is "none". */
static cerb_status read_record(cerb_engine *e, const char *what, const redisReply *r,
                               cerb_closure *out)
{
    memset(out, 0, sizeof *out);
    if (r->type == REDIS_REPLY_NIL)
        return CERB_OK;
    if (r->type == REDIS_REPLY_STRING) {
        if (cerb__redis_closure_parse(r->str, r->len, out))
            return CERB_OK;
        return cerb__error_set(CERB_EPROTO, "redis %s: %s: the closure record \"%.*s\" is not "
                               "\"<epoch> closed|open\"",
                               e->where, what, (int)(r->len > 40 ? 40 : r->len), r->str);
    }
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(e->where, what, &f, NULL);
}

cerb_status cerb__redis_op_closure_get(cerb_engine *e, cerb_closure *out)
{
    memset(out, 0, sizeof *out);
    if (!e->closure_key)
        return no_record_here(e);
    const char *argv[2] = {"GET", e->closure_key};
    size_t argl[2] = {3, e->closure_key_len};
    redisReply *r;
    cerb_status st = one(e, "closure GET", 2, argv, argl, &r);
    if (st == CERB_OK)
        st = read_record(e, "closure GET", r, out);
    if (r)
        freeReplyObject(r);
    return st;
}

cerb_status cerb__redis_op_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now)
{
    memset(now, 0, sizeof *now);
    if (!e->closure_key)
        return no_record_here(e);
    char ep[24], val[40];
    snprintf(ep, sizeof ep, "%" PRId64, rec->epoch);
    snprintf(val, sizeof val, "%" PRId64 " %s", rec->epoch, rec->closed ? "closed" : "open");
    const char *argv[6] = {"EVAL", lua_put, "1", e->closure_key, ep, val};
    size_t argl[6] = {4, sizeof lua_put - 1, 1, e->closure_key_len, strlen(ep), strlen(val)};
    redisReply *r;
    cerb_status st = one(e, "closure put", 6, argv, argl, &r);
    if (st == CERB_OK)
        st = read_record(e, "closure put", r, now);
    if (r)
        freeReplyObject(r);
    return st;
}
