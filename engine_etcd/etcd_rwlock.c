/*
 * etcd_rwlock.c — the etcd engine's read-write locks (ops->rwlock): the
 * table. The members are etcd_queue.c's.
 *
 * Layout (docs/rwlock.md, "## etcd"): the etcd recipe's
 * (contrib/recipes/rwmutex.go) with the prefix P = <prefix>/rwlock/NAME:
 * a reader's key P/read/<token>, a writer's P/write/<token>, attached to
 * the session lease, value "<fence offset>"; ordered by create revision; a
 * reader holds when no key under P/write/ is older than its own, a writer
 * when no key under P/ is. The first segment after the prefix is empty,
 * which no lock name is (names are 1–255 bytes), so no lock, semaphore or
 * election range <prefix>NAME/ can hold these keys, whatever the names.
 * Unlike the recipe, a waiter re-reads its own key after every wake-up
 * (etcd#16221: a member whose session ended while it waited must not
 * believe it holds), and it wakes only when every member ahead that
 * blocks it is gone, not once per departure. Fences as the mutex's.
 */
#include "internal_posix.h"

#include "etcd_internal.h"
#include "etcd_queue.h"

static cerb_status rw_held(cerb_engine *e, const char *name)
{
    return cerb__etcd_queue_held(e, CERB_PRIM_RWLOCK, name);
}

static cerb_status rw_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    return cerb__etcd_queue_inspect(e, CERB_PRIM_RWLOCK, name, out);
}

const struct cerb_queue_methods cerb__etcd_rwlock = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = cerb__etcd_queue_acquire,
    .renew = cerb__etcd_op_renew,
    .release = cerb__etcd_queue_release,
    .check_owner = cerb__etcd_queue_check,
    .held = rw_held,
    .inspect = rw_inspect,
};
