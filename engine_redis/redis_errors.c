/*
 * redis_errors.c — hiredis failures to cerb_status, in exactly one function.
 *
 * hiredis reports trouble in two unrelated ways: a context error (`err` and
 * `errstr`, after which the context is dead) and an error reply (the
 * connection is fine, the server said no). The engine adds a third that
 * hiredis cannot see: a send() it did itself. The phase in which a failure
 * happened decides whether the request may have run on the server, which the
 * core needs to settle ambiguous acquisitions (engine.h): nothing that fails
 * before the last byte of a request is written can have run, since Redis
 * executes only complete commands; anything that fails while waiting for the
 * reply may have.
 */
#include "internal_posix.h"

#include "redis_errors.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Error-reply prefixes that mean "this server cannot serve now" (or not us),
 * rather than "your request is malformed": the breaker should count them as
 * an unavailable engine, like a refused connection. */
static const char *const unavailable_prefixes[] = {
    "LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN",
    "OOM", "NOAUTH", "WRONGPASS", "NOPERM", "MISCONF", "MOVED", "ASK",
};

static _Thread_local struct redis_redirect tl_redirect;

void cerb__redis_redirect_clear(void) { tl_redirect.kind = REDIS_REDIR_NONE; }

enum redis_redirect_kind cerb__redis_redirect_peek(void) { return tl_redirect.kind; }

void cerb__redis_redirect_take(struct redis_redirect *out)
{
    *out = tl_redirect;
    tl_redirect.kind = REDIS_REDIR_NONE;
}

/* "MOVED <slot> <host>:<port>" / "ASK ...": the slot and where it is. */
static void note_redirect(const char *s, size_t len)
{
    struct redis_redirect r = {.kind = REDIS_REDIR_NONE, .slot = -1};
    char buf[320];
    if (len >= sizeof buf)
        return;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (strncmp(buf, "TRYAGAIN", 8) == 0) {
        r.kind = REDIS_REDIR_TRYAGAIN;
    } else if (strncmp(buf, "CLUSTERDOWN", 11) == 0) {
        r.kind = REDIS_REDIR_DOWN;
    } else if (strncmp(buf, "MOVED ", 6) == 0 || strncmp(buf, "ASK ", 4) == 0) {
        char *p = strchr(buf, ' ') + 1, *sp = strchr(p, ' ');
        char *colon = sp ? strrchr(sp + 1, ':') : NULL;
        if (!sp || !colon || (size_t)(colon - sp - 1) >= sizeof r.host)
            return;
        r.kind = buf[0] == 'M' ? REDIS_REDIR_MOVED : REDIS_REDIR_ASK;
        r.slot = atoi(p);
        memcpy(r.host, sp + 1, (size_t)(colon - sp - 1));
        r.host[colon - sp - 1] = '\0';
        r.port = atoi(colon + 1);
        if (r.slot < 0 || r.slot > 16383 || r.port <= 0 || r.port > 65535)
            return;
    } else {
        return;
    }
    tl_redirect = r;
}

static int has_prefix(const char *s, size_t len, const char *p)
{
    size_t n = strlen(p);
    return len >= n && memcmp(s, p, n) == 0 && (len == n || s[n] == ' ');
}

int cerb__redis_is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           has_prefix(r->str, r->len, "NOSCRIPT");
}

/* Error replies with which the server refuses a request before running
 * it: a script that got one wrote nothing. */
static const char *const not_run_prefixes[] = {
    "NOSCRIPT", "LOADING", "BUSY", "NOAUTH", "WRONGPASS", "MASTERDOWN", "CLUSTERDOWN",
    "TRYAGAIN", "MOVED", "ASK",
};

int cerb__redis_script_may_have_run(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ERROR)
        return 0;
    const char *s = r->str ? r->str : "";
    size_t len = r->str ? r->len : 0;
    for (size_t i = 0; i < sizeof not_run_prefixes / sizeof *not_run_prefixes; i++)
        if (has_prefix(s, len, not_run_prefixes[i]))
            return 0;
    return 1;
}

static const char *reply_type_name(int type)
{
    switch (type) {
    case REDIS_REPLY_STRING: return "string";
    case REDIS_REPLY_ARRAY: return "array";
    case REDIS_REPLY_INTEGER: return "integer";
    case REDIS_REPLY_NIL: return "nil";
    case REDIS_REPLY_STATUS: return "status";
    case REDIS_REPLY_ERROR: return "error";
    }
    return "unknown";
}

cerb_status cerb__redis_fail(const char *where, const char *what,
                             const struct redis_failure *f,
                             cerb_outcome *outcome)
{
    cerb_outcome oc = f->phase == REDIS_PHASE_REPLY ? CERB_OUTCOME_UNKNOWN
                                                    : CERB_OUTCOME_NO;
    cerb_status st;

    if (f->reply && f->reply->type == REDIS_REPLY_ERROR) {
        /* The server answered: the connection is healthy and, for a
         * plain command, nothing happened. A script can fail after it
         * wrote (WRONGTYPE at its third call): the script layer makes
         * that UNKNOWN (cerb__redis_script_may_have_run). */
        const char *s = f->reply->str ? f->reply->str : "";
        size_t len = f->reply->str ? f->reply->len : 0;
        st = CERB_EPROTO;
        for (size_t i = 0; i < sizeof unavailable_prefixes / sizeof *unavailable_prefixes; i++)
            if (has_prefix(s, len, unavailable_prefixes[i]))
                st = CERB_EIO;
        oc = CERB_OUTCOME_NO;
        note_redirect(s, len);
        cerb__error_set(st, "redis %s: %s: %.*s", where, what, (int)(len > 300 ? 300 : len), s);
    } else if (f->reply) {
        /* An answer we cannot interpret: whatever it was, it ran. */
        st = CERB_EPROTO;
        oc = CERB_OUTCOME_UNKNOWN;
        cerb__error_set(st, "redis %s: %s: unexpected %s reply", where, what,
                        reply_type_name(f->reply->type));
    } else if (f->phase == REDIS_PHASE_SEND) {
        int e = f->sys_errno;
        st = CERB_EIO;
        if (e == EAGAIN || e == EWOULDBLOCK)
            cerb__error_set(st, "redis %s: %s: send timed out after %lld ms", where, what,
                            (long long)f->timeout_ms);
        else
            cerb__error_set(st, "redis %s: %s: send: %s", where, what, strerror(e));
    } else {
        const char *es = f->errstr && f->errstr[0] ? f->errstr : "connection failed";
        switch (f->err) {
        case REDIS_ERR_PROTOCOL:
            st = CERB_EPROTO;
            break;
        case REDIS_ERR_OOM:
            st = CERB_ENOMEM;
            break;
        case REDIS_ERR_EOF:
            es = "server closed the connection";
            st = CERB_EIO;
            break;
        case REDIS_ERR_IO:
            /* hiredis reports a socket timeout as the bare EAGAIN text. */
            if (strstr(es, "temporarily unavailable") || strstr(es, "timed out")) {
                st = cerb__error_set(CERB_EIO, "redis %s: %s: %s after %lld ms", where,
                                     what,
                                     f->phase == REDIS_PHASE_CONNECT ? "connect timed out"
                                                                     : "no reply",
                                     (long long)f->timeout_ms);
                goto done;
            }
            st = CERB_EIO;
            break;
        default: /* REDIS_ERR_OTHER (resolution, connect) and anything new */
            st = CERB_EIO;
            break;
        }
        cerb__error_set(st, "redis %s: %s: %s", where, what, es);
    }
done:
    if (outcome)
        *outcome = oc;
    return st;
}
