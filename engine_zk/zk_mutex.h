/*
 * zk_mutex.h — the engine operations of the ZooKeeper engine (zk_mutex.c:
 * Curator's InterProcessMutex protocol; zk_session.c: the probe) and the
 * node clean-up they share with the keeper thread (zk_cleanup.c).
 */
#ifndef CERB_ZK_MUTEX_H
#define CERB_ZK_MUTEX_H

#include <stdbool.h>
#include <stdint.h>

#include "zk_session.h"

/* ---- engine operations (contracts in core/engine.h) ---- */

cerb_status cerb__zk_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__zk_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__zk_op_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__zk_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__zk_op_cancel(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__zk_op_probe(cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__zk_op_held(cerb_engine *e, const char *name);
/* zk_inspect.c: who holds a name and who waits (two reads, no watch). */
cerb_status cerb__zk_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

/* The mark of lk's node names: ZK_LOCK_MARK for a lock, and for an
 * election term its layout's (cerb__zk_variant_mark: ZK_LATCH_MARK for
 * CERB_ELECT_LAYOUT_DEFAULT and _LATCH, ZK_LOCK_MARK for _SELECTOR). A
 * string constant. */
const char *cerb__zk_lock_mark(const cerb_engine_lock *lk);
const char *cerb__zk_variant_mark(int variant);

/* The lists of waiting and held holds (e->mu held): link p to `which`
 * (a held one may need the heartbeat sooner for its lease), unlink it. The
 * keeper checks the node of every held hold after a reconnect and reports
 * LOST (name, token) for one that is gone. */
void cerb__zk_list_link_locked(cerb_engine *e, struct zk_lock_priv *p, enum zk_list which);
void cerb__zk_list_unlink_locked(cerb_engine *e, struct zk_lock_priv *p);
/* A grant's ttl on session state st: the negotiated session timeout. */
int64_t cerb__zk_grant_ttl(const struct zk_state *st, const cerb_engine_lock *lk);

/* ---- semaphores and read-write locks (zk_semaphore.c, zk_rwlock.c) ---- */
extern const struct cerb_queue_methods cerb__zk_semaphore;
extern const struct cerb_queue_methods cerb__zk_rwlock;
/* zk_queue_inspect.c: their holders and waiters (two reads, no watch). */
cerb_status cerb__zk_sem_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);
cerb_status cerb__zk_rw_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

/* ---- leader election (zk_election.c) ---- */
extern const struct cerb_election_methods cerb__zk_election;

/* Keeper: send again the marks of held nodes that did not land
 * (zk_mutex.c, announce). */
void cerb__zk_marks_retry(cerb_engine *e);

/* ---- clean-up (zk_cleanup.c) ---- */

/* What cerb__zk_remove() achieved. */
enum zk_removed {
    ZK_REMOVED,        /* deleted by us */
    ZK_REMOVED_NONODE, /* it was not there (and no earlier try of ours was
                          in doubt) */
    ZK_REMOVED_LATER,  /* not reachable in time: the keeper finishes it */
    ZK_REMOVE_FAILED   /* the server refused (last error set); the keeper
                          keeps trying too */
};

/*
 * Delete our node `node` under `parent` — or, when node is NULL, every
 * child of `parent` carrying `uuid` (an acquisition whose create reply was
 * lost). Retried through connection loss, on whatever session is current
 * (an old session's ephemeral may outlive our giving up on it), until done
 * or `deadline_ns`; then handed to the keeper. Blocks only while the
 * session is disconnected.
 */
enum zk_removed cerb__zk_remove(cerb_engine *e, const char *parent, const char *node,
                                const char *uuid, int64_t deadline_ns);

/*
 * After a lost create reply: list `parent` and look at the children
 * carrying `uuid`. One that is an ephemeral of session `sid` is ours:
 * *node (malloc'd) and *czxid are set. Any other carrying the uuid belongs
 * to an old session and is deleted, never adopted (CURATOR-604). *node is
 * NULL when the create did not land. An error when the session could not
 * be asked (connection lost again, or no answer by deadline_ns).
 */
cerb_status cerb__zk_find_mine(cerb_engine *e, uint64_t gen, int64_t sid, const char *parent,
                               const char *uuid, int64_t deadline_ns, char **node,
                               uint64_t *czxid);

/* Hand a deletion to the keeper (copies the strings). */
void cerb__zk_reap_add(cerb_engine *e, const char *parent, const char *node, const char *uuid);
/* Keeper: one pass over the pending deletions; true when some are left. */
bool cerb__zk_reap_run(cerb_engine *e);
/* Free the list (engine close). */
void cerb__zk_reap_free(cerb_engine *e);

#endif
