/*
 * redis_errors.h — the one place where a hiredis failure becomes a
 * cerb_status, an outcome and the text of cerb_last_error().
 */
#ifndef CERB_REDIS_ERRORS_H
#define CERB_REDIS_ERRORS_H

#include <hiredis/hiredis.h>

#include "engine.h"

/* How far a request got before it failed; decides the outcome. */
enum redis_phase {
    REDIS_PHASE_CONNECT, /* connecting, or the connection set-up commands */
    REDIS_PHASE_SEND,    /* writing the request: the server ran nothing */
    REDIS_PHASE_REPLY    /* the request left: it may have run */
};

/*
 * One failure, described by whichever of its parts are known:
 *  - `err`/`errstr`: a hiredis context error (REDIS_ERR_IO, _EOF, _PROTOCOL,
 *    _OOM, _OTHER), or 0 when there is none;
 *  - `sys_errno`: errno of a failed send() (phase SEND), or 0;
 *  - `reply`: a reply the server did send but that is an error
 *    (REDIS_REPLY_ERROR) or not of the shape the request expects.
 */
struct redis_failure {
    enum redis_phase phase;
    int err;
    const char *errstr;
    int sys_errno;
    const redisReply *reply;
    int64_t timeout_ms; /* the socket timeout in force, for the message */
};

/*
 * Map a failure to a status; set *outcome (when non-NULL) and the thread's
 * last error to "redis HOST:PORT: WHAT: reason".
 *   connect or send failure      -> CERB_EIO,    outcome NO
 *   no reply (I/O error, timeout) -> CERB_EIO,    outcome UNKNOWN
 *   unreadable reply stream       -> CERB_EPROTO, outcome UNKNOWN
 *   error reply, server-side unavailability (LOADING, BUSY, READONLY,
 *     MASTERDOWN, TRYAGAIN, CLUSTERDOWN, OOM) or authentication (NOAUTH,
 *     WRONGPASS, NOPERM)          -> CERB_EIO,    outcome NO
 *   any other error reply         -> CERB_EPROTO, outcome NO
 *   a reply of the wrong shape    -> CERB_EPROTO, outcome UNKNOWN
 *   hiredis out of memory         -> CERB_ENOMEM (outcome by phase)
 * A NOSCRIPT reply is not a failure: the script layer reloads and retries
 * before it would get here.
 */
cerb_status cerb__redis_fail(const char *where, const char *what,
                             const struct redis_failure *f,
                             cerb_outcome *outcome);

/* Is this reply the server's NOSCRIPT error (script cache flushed)? */
int cerb__redis_is_noscript(const redisReply *r);

/* Is this error reply to EVALSHA one the script may have written before
 * (any error but the server's refusals to start it: NOSCRIPT, LOADING,
 * BUSY, NOAUTH, MASTERDOWN, ...)? Redis does not roll a script back. */
int cerb__redis_script_may_have_run(const redisReply *r);

#endif
