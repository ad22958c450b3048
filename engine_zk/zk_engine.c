/*
 * zk_engine.c — the "zk" engine table, and the glue that opens and closes
 * an instance.
 *
 * The engine speaks Curator's InterProcessMutex layout on libzookeeper_mt,
 * so a Curator (Java) service and a Cerberus lock on the same path exclude
 * each other: <zk.root>/<name>/_c_<uuid>-lock-<seq>, EPHEMERAL_SEQUENTIAL,
 * parents as CONTAINER nodes, the first child holds, each waiter watches
 * only its predecessor. Our nodes carry the data "cerb:waiting", rewritten
 * to "cerb:holding" by a holder that may have a successor, which lets that
 * successor take over on the release without listing again (zk_mutex.c);
 * Curator ignores node data. Each create also rewrites the (empty) data of
 * <zk.root>/<name> in its transaction, only to learn the transaction's zxid,
 * and checks the fence offset node next to the root (zk_fence.c) and, for a
 * client with a configuration epoch, the switch closure record next to it
 * (zk_closure.c). Where the work is done:
 *   zk_session.c  the session, its events, the keeper thread, the probe
 *   zk_mutex.c    acquire / release / renew / check_owner / cancel
 *   zk_cleanup.c  deletions retried through connection loss; adoption of a
 *                 node whose create reply was lost
 *   zk_fence.c    the fence offset added to every czxid, raised for a client
 *                 switching here with a fence floor (CERB_CAP_FENCE_FLOOR)
 *   zk_closure.c  the switch closure record: read, raised, checked by
 *                 every create of a client with an epoch (DESIGN.md §5)
 *   zk_guard.c    the idempotency guard's records (DESIGN.md §11)
 *   zk_election.c leader election in Curator's LeaderLatch and
 *                 LeaderSelector layouts (proclaim, leader)
 *   zk_semaphore.c semaphores in Curator's InterProcessSemaphoreV2 layout
 *   zk_rwlock.c   read-write locks in Curator's InterProcessReadWriteLock
 *                 layout (the acquisition is zk_mutex.c's)
 *   zk_queue_inspect.c  who holds and waits for those two
 *   zk_call.c     batches of asynchronous requests
 *   zk_layout.c   names, paths, the order of children
 *   zk_errors.c   ZooKeeper codes to cerb_status
 *   zk_log.c      the C client's log into ours
 * open() makes the session and waits for it to connect within
 * zk.connect_timeout_ms, so an unreachable ensemble fails open() with
 * CERB_EIO naming the hosts, quickly.
 *
 * ACLs. Without credentials every node is open (world:anyone, all), as
 * Curator's defaults. With zk.user/zk.password the session adds digest
 * auth, and the lock nodes and the parents we create carry
 * creator-all + world-read: ZooKeeper checks a delete against the *parent's*
 * ACL, so it is the parent's creator-only DELETE (and CREATE) that keeps
 * another identity from deleting our lock nodes or queueing on the name;
 * the node's own ACL keeps its data and ACL ours. Parents that already exist
 * keep whatever ACL their creator gave them.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "log.h"
#include "zk_closure.h"
#include "zk_guard.h"
#include "zk_layout.h"
#include "zk_mutex.h"

static void zk_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__zk_guard_free(e); /* its sweeper uses the session */
    cerb__zk_session_stop(e);
    cerb__zk_fence_free(e);
    cerb__zk_closure_free(e);
    if (e->auth) {
        memset(e->auth, 0, strlen(e->auth));
        cerb__free(e->auth);
    }
    cerb__free(e);
}

static cerb_status zk_open(const cerb_engine_env *env, cerb_engine **out)
{
    cerb_engine *e;
    cerb_status st;

    *out = NULL;
    if (!env || !env->cfg)
        return cerb__error_set(CERB_EINVAL, "zk: no configuration");
    const struct cerb_zk_config *zc = &env->cfg->zk;
    if (!zc->hosts || !zc->hosts[0])
        return cerb__error_set(CERB_ECONFIG, "zk: no hosts configured");
    if (!zc->root || zc->root[0] != '/')
        return cerb__error_set(CERB_ECONFIG, "zk: root \"%s\" is not an absolute path",
                               zc->root ? zc->root : "");
    e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
    e->cfg = env->cfg;
    e->zc = zc;
    e->env = *env;
    e->hosts = zc->hosts;

    e->acl = ZOO_OPEN_ACL_UNSAFE;
    if (zc->user && zc->user[0]) {
        size_t n = strlen(zc->user) + 1 + strlen(zc->password ? zc->password : "") + 1;
        e->auth = cerb__malloc(n);
        if (!e->auth) {
            cerb__free(e);
            return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
        }
        snprintf(e->auth, n, "%s:%s", zc->user, zc->password ? zc->password : "");
        e->acl_entries[0].perms = ZOO_PERM_ALL;
        e->acl_entries[0].id = ZOO_AUTH_IDS;
        e->acl_entries[1].perms = ZOO_PERM_READ;
        e->acl_entries[1].id = ZOO_ANYONE_ID_UNSAFE;
        e->acl.count = 2;
        e->acl.data = e->acl_entries;
    }

    st = cerb__zk_guard_init(e);
    if (st == CERB_OK) {
        st = cerb__zk_fence_init(e);
        if (st == CERB_OK) {
            st = cerb__zk_closure_init(e);
            if (st == CERB_OK) {
                st = cerb__zk_session_start(e);
                if (st != CERB_OK)
                    cerb__zk_closure_free(e);
            }
            if (st != CERB_OK)
                cerb__zk_fence_free(e);
        }
        if (st != CERB_OK)
            cerb__zk_guard_free(e);
    }
    if (st != CERB_OK) {
        if (e->auth)
            cerb__free(e->auth);
        cerb__free(e);
        return st;
    }
    CERB_LOG_D("zk %s: engine open (root %s%s)", e->hosts, zc->root,
               e->auth ? ", digest auth" : "");
    *out = e;
    return CERB_OK;
}

static void zk_stats(cerb_engine *e, struct cerb_engine_stats *out)
{
    out->acquire_calls = atomic_load_explicit(&e->stats.acquire_calls, memory_order_relaxed);
    out->wakeups = atomic_load_explicit(&e->stats.wakeups, memory_order_relaxed);
    out->handoffs = 0; /* a release never grants: the next waiter takes it */
}

static cerb_status zk_check_name(const char *name)
{
    return cerb__zk_check_name(name);
}

const struct cerb_engine_ops cerb__zk_engine_ops = {
    .version = CERB_ENGINE_OPS_V5,
    .name = "zk",
    .caps = CERB_CAP_FENCING | CERB_CAP_FAIR_QUEUE | CERB_CAP_WAIT | CERB_CAP_CROSS_PROCESS |
            CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct zk_lock_priv),
    .open = zk_open,
    .close = zk_close,
    .acquire = cerb__zk_op_acquire,
    .renew = cerb__zk_op_renew,
    .release = cerb__zk_op_release,
    .check_owner = cerb__zk_op_check,
    .cancel = cerb__zk_op_cancel,
    .probe = cerb__zk_op_probe,
    .held = cerb__zk_op_held,
    .renew_batch = NULL,
    .stats = zk_stats,
    .check_name = zk_check_name,
    .hold_bound_ms = cerb__zk_op_hold_bound,
    .guard_begin = cerb__zk_guard_begin,
    .guard_renew = cerb__zk_guard_renew,
    .guard_finish = cerb__zk_guard_finish,
    .guard_check = cerb__zk_guard_check,
    /* version 3: inspection (zk_inspect.c) */
    .inspect = cerb__zk_op_inspect,
    /* version 4: switch closure records (zk_closure.c) */
    .closure_get = cerb__zk_op_closure_get,
    .closure_put = cerb__zk_op_closure_put,
    /* version 5: leader election (zk_election.c) */
    .election = &cerb__zk_election,
    /* semaphores (zk_semaphore.c) and read-write locks (zk_rwlock.c) */
    .semaphore = &cerb__zk_semaphore,
    .rwlock = &cerb__zk_rwlock,
};
