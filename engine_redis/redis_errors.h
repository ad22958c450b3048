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
 *     MASTERDOWN, TRYAGAIN, CLUSTERDOWN, MOVED, ASK, OOM) or authentication (NOAUTH,
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

/*
 * Redis Cluster's answers that name another node or ask for a retry
 * (redis_cluster.c follows them). cerb__redis_fail records the last one it
 * maps in a thread-local slot; the cluster layer clears it before a routed
 * operation and takes it after one that failed. MOVED and ASK map to
 * CERB_EIO like TRYAGAIN and CLUSTERDOWN (this server cannot serve it).
 */
enum redis_redirect_kind {
    REDIS_REDIR_NONE,
    REDIS_REDIR_MOVED,    /* the slot lives on host:port now */
    REDIS_REDIR_ASK,      /* being migrated: ASKING, then this once there */
    REDIS_REDIR_TRYAGAIN, /* keys split between the two ends of a migration */
    REDIS_REDIR_DOWN      /* CLUSTERDOWN: no node serves the slot right now */
};
struct redis_redirect {
    enum redis_redirect_kind kind;
    int slot;
    char host[256];
    int port;
};
void cerb__redis_redirect_clear(void);
/* The redirect recorded since the last clear (kind NONE if none); clears it. */
void cerb__redis_redirect_take(struct redis_redirect *out);
/* The kind of the redirect recorded (kept). */
enum redis_redirect_kind cerb__redis_redirect_peek(void);

/* Is this reply the server's NOSCRIPT error (script cache flushed)? */
int cerb__redis_is_noscript(const redisReply *r);

/* Is this error reply to EVALSHA one the script may have written before
 * (any error but the server's refusals to start it: NOSCRIPT, LOADING,
 * BUSY, NOAUTH, MASTERDOWN, ...)? Redis does not roll a script back. */
int cerb__redis_script_may_have_run(const redisReply *r);

#endif
