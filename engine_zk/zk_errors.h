/*
 * zk_errors.h — the one place where a ZooKeeper result code becomes a
 * cerb_status, an outcome and the text of cerb_last_error().
 */
#ifndef CERB_ZK_ERRORS_H
#define CERB_ZK_ERRORS_H

#include <stdbool.h>

#include "engine.h"

/*
 * Map result code `rc` of request `what` on `path` (may be NULL) to a
 * status; set *outcome (when non-NULL) and the thread's last error to
 * "zk HOSTS: WHAT PATH: reason". `sent` says whether the request left the
 * client (a completion was called) or was refused by the API before
 * queueing; only a sent write can have an unknown outcome.
 *   connection loss, operation timeout, closing  -> CERB_EIO, UNKNOWN if sent
 *   session expired or moved, invalid state,
 *     throttled, not read-only                   -> CERB_EIO, NO
 *   no auth, auth failed, invalid ACL            -> CERB_EIO, NO (the engine
 *                                                   cannot serve this client)
 *   bad arguments (a path the client refuses)    -> CERB_EINVAL, NO
 *   marshalling error (out of memory)            -> CERB_ENOMEM, NO
 *   any other server answer                      -> CERB_EPROTO, NO
 */
cerb_status cerb__zk_fail(const char *hosts, const char *what, const char *path, int rc,
                          bool sent, cerb_outcome *outcome);

/* Did the request perhaps take effect? (rc of a completion) */
bool cerb__zk_rc_ambiguous(int rc);

/* Is rc an answer from the server (the session was alive when it was
 * sent), as opposed to a client-side failure? */
bool cerb__zk_rc_is_answer(int rc);

/* Our own result code for a completion that could not allocate. */
#define CERB_ZK_RC_NOMEM (-10000)
/* Our own result code for a request abandoned by its waiter. */
#define CERB_ZK_RC_ABANDONED (-10001)

#endif
