/*
 * zk_rwlock.c — read-write locks on ZooKeeper in Apache Curator's
 * InterProcessReadWriteLock layout (DESIGN.md §16, docs/rwlock.md), so a
 * Curator service and a Cerberus one share readers and exclude writers:
 *
 *   <root>/<name>/_c_<uuid>-__READ__<seq>   a reader
 *   <root>/<name>/_c_<uuid>-__WRIT__<seq>   a writer
 *
 * EPHEMERAL_SEQUENTIAL, both in one directory, ordered as Curator orders
 * them (fixForSorting with both marks: the 10-digit sequence after the
 * mark; zk_layout.c, ZK_RW_ORDER). A writer holds when it is first; a
 * reader when no writer sorts before it (Curator's readLockPredicate). A
 * reader behind a writer waits, so no writer starves.
 *
 * The acquisition is the mutex's (zk_mutex.c, with lk->prim
 * CERB_PRIM_RWLOCK: the mark from the mode, the order and the grant rule
 * above): one create in a transaction with the fence offset's check and,
 * with an epoch, the closure record's; a lost reply settled by uuid; a
 * writer watches its predecessor; a reader watches the last writer before
 * it (Curator watches the first: the last one normally leaves after all
 * those before it, so one wake-up suffices), and takes the lock without
 * listing again when that was the only writer before it. No "cerb:holding"
 * mark is written (a reader that holds is not first, so the mark would say
 * nothing to its successor), and the data of our nodes is the mutex's
 * "cerb:waiting". Fence: the node's czxid plus the offset its create
 * checked, as for a lock. Renew, release and check_owner are the mutex's.
 *
 * A downgrade (write then read in one thread) is counted by the core
 * inside the write hold, with no node of its own, so the CURATOR-621 race
 * (a new read node behind a queued writer) cannot happen here.
 */
#include "internal_posix.h"

#include "zk_mutex.h"

const struct cerb_queue_methods cerb__zk_rwlock = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = cerb__zk_op_acquire,
    .renew = cerb__zk_op_renew,
    .release = cerb__zk_op_release,
    .check_owner = cerb__zk_op_check,
    /* Any child, holding or queued, answers BUSY (zk_session.c). */
    .held = cerb__zk_op_held,
    .inspect = cerb__zk_rw_inspect,
};
