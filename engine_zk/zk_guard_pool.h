/*
 * zk_guard_pool.h — the sessions the guard's requests go out on: the
 * client's own, and up to zk.guard_sessions - 1 more, opened only once
 * guard calls of this client overlap; each record's requests go to the
 * one its id picks.
 *
 * Why. ZooKeeper serves one session's requests one after another, and the
 * C client gives a session one I/O thread and one completion thread: 8
 * threads of one client beginning and finishing guard records shared all
 * that, and ran at 0.80-0.90 of 8 threads with a session each (the guard
 * bench's raw ceiling). Guard records are persistent nodes, owned by no
 * session, so any session can carry any guard request.
 *
 * What that changes. ZooKeeper orders one session's requests, not two
 * sessions': a re-sent begin or finish, or the check that settles a lost
 * answer, must not overtake the request it follows up. So a record's
 * begin, finish and check all go to the session its id picks, as long as
 * that one is connected (else the client's own), and the check also syncs
 * first (zk_call.h, cerb__zk_call_sync) for the case where the pick
 * changed between them. Every guard write is a transaction checked on the
 * leader (versions, the token node), whichever session carries it.
 *
 * Locking. `lock` (read-write) keeps a slot's session open while a thread
 * submits on it (read side), like zk_session.h's zh_lock; a slot is
 * emptied under the write side, and closed after it is released. Opening
 * and closing take `mu`; on the request path only the thread that wins
 * `opening` does (the others use the client's session meanwhile).
 * Watchers only store atomics. Neither lock is held while taking the
 * engine's.
 */
#ifndef CERB_ZK_GUARD_POOL_H
#define CERB_ZK_GUARD_POOL_H

#include <stdbool.h>

#include "zk_session.h"

struct zk_guard_pool;

/* The pool for e (nothing opened yet); NULL on out of memory. */
struct zk_guard_pool *cerb__zk_guard_pool_new(cerb_engine *e);
/* Close every extra session (their requests still out finish with
 * ZCLOSING) and free the pool. NULL: no-op. */
void cerb__zk_guard_pool_free(struct zk_guard_pool *p);

/* Around each guard begin and finish: a call that starts while another is
 * under way is an overlap, and enough of them open the extra sessions. */
void cerb__zk_guard_pool_enter(struct zk_guard_pool *p);
void cerb__zk_guard_pool_leave(struct zk_guard_pool *p);

/*
 * The session for requests about record `id` (its hex id), held open until
 * cerb__zk_guard_pool_end with the same *slot: the extra session the id
 * picks when it is open and connected, else the client's own
 * (cerb__zk_session_begin). NULL when there is no session. Do not wait for
 * anything in between.
 */
struct zk_session *cerb__zk_guard_pool_begin(struct zk_guard_pool *p, const char *id,
                                             int *slot);
void cerb__zk_guard_pool_end(struct zk_guard_pool *p, int slot);

/* Housekeeping for a thread that may block (the sweeper): close extra
 * sessions that expired, failed authentication or stayed disconnected for
 * a session timeout, so that later overlaps open them again. */
void cerb__zk_guard_pool_tend(struct zk_guard_pool *p);

#endif
