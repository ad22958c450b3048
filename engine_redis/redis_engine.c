/*
 * redis_engine.c — the "redis" engine table, and the glue that opens and
 * closes an instance.
 *
 * The engine speaks the lock protocol that redis-py's Lock, redlock and
 * redsync share (a string key holding the owner token, with a PX lease), so
 * a Cerberus lock and theirs exclude each other; fencing, the fair queue and
 * wake-ups live in extra keys in the same hash slot (redis_scripts.h).
 * Where the work is done:
 *   redis_conn.c     connections, pool, timeouts, AUTH/SELECT, the exchange
 *   redis_scripts.c  the Lua scripts; renew, release, check, batch, probe
 *   redis_wait.c     acquire with waiting; cancel
 *   redis_errors.c   hiredis failures to cerb_status (and cluster redirects)
 *   redis_sentinel.c where the master is (sentinel mode), +switch-master
 *   redis_cluster.c  cluster mode: the slot map, one instance per master,
 *                    routing with MOVED/ASK/TRYAGAIN followed
 *   redis_election.c leader election: a term's value beside the lock key
 *   redis_queue.c    semaphores and read-write locks: keys, scripts run,
 *                    the wait (redis_semaphore.c, redis_rwlock.c: layouts)
 * open() connects one pool connection within the connect timeout, loads
 * the scripts on it and reads (or makes) the data-loss marker
 * (redis_marker.c), so an unreachable or unusable server fails open() with
 * CERB_EIO naming host:port, and the first acquire costs one round trip.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_cluster.h"
#include "redis_guard.h"
#include "redis_closure.h"
#include "redis_marker.h"
#include "redis_redlock.h"
#include "redis_scripts.h"
#include "redis_sentinel.h"
#include "redis_stats.h"

static void redis_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__redis_watch_stop(e);
    if (e->rl_top)
        cerb__redis_rl_close(e); /* its nodes first */
    if (e->cl_top)
        cerb__redis_cluster_close(e); /* its nodes first */
    cerb__redis_pool_destroy(e);
    cerb__redis_conn_free(e->probe_conn);
    cerb__redis_closure_destroy(e);
    cerb__redis_marker_destroy(e);
    cerb__mutex_destroy(&e->probe_mu);
    cerb__mutex_destroy(&e->wait_mu);
    cerb__redis_addr_destroy(e);
    cerb__free(e);
}

static cerb_status redis_open(const cerb_engine_env *env, cerb_engine **out)
{
    cerb_engine *e;
    struct redis_conn *c;
    cerb_status st;

    *out = NULL;
    if (!env || !env->cfg)
        return cerb__error_set(CERB_EINVAL, "redis: no configuration");
    e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    e->cfg = env->cfg;
    e->rc = &env->cfg->redis;
    e->env = *env;
    if (e->rc->mode == CERB_REDIS_SINGLE && (!e->rc->host || !e->rc->host[0])) {
        cerb__free(e);
        return cerb__error_set(CERB_ECONFIG, "redis: no host configured");
    }
    if (e->rc->mode == CERB_REDIS_SENTINEL)
        snprintf(e->where, sizeof e->where, "master \"%s\" (sentinels)", e->rc->master_name);
    else if (e->rc->mode == CERB_REDIS_CLUSTER)
        snprintf(e->where, sizeof e->where, "cluster (%s%s)", e->rc->nodes[0],
                 e->rc->n_nodes > 1 ? ", …" : "");
    else if (e->rc->mode == CERB_REDIS_REDLOCK)
        snprintf(e->where, sizeof e->where, "redlock (%s%s)", e->rc->nodes[0],
                 e->rc->n_nodes > 1 ? ", …" : "");
    else
        snprintf(e->where, sizeof e->where, "%s:%d", e->rc->host, e->rc->port);
    cerb__redis_addr_init(e);
    snprintf(e->probe_name, sizeof e->probe_name, "__cerberus_probe__:%016llx",
             (unsigned long long)cerb__rand_below(UINT64_MAX));
    cerb__mutex_init(&e->probe_mu);
    cerb__mutex_init(&e->wait_mu);
    e->wmu = &e->wait_mu;
    st = cerb__redis_marker_init(e);
    if (st == CERB_OK)
        st = cerb__redis_closure_init(e);
    if (st == CERB_OK)
        st = cerb__redis_pool_init(e);
    if (st != CERB_OK) {
        cerb__redis_closure_destroy(e);
        cerb__redis_marker_destroy(e);
        cerb__mutex_destroy(&e->probe_mu);
        cerb__mutex_destroy(&e->wait_mu);
        cerb__redis_addr_destroy(e);
        cerb__free(e);
        return st;
    }
    if (e->rc->mode == CERB_REDIS_REDLOCK) {
        /* The routing instance: one instance per independent master. */
        e->rl_top = true;
        st = cerb__redis_rl_open(e);
        if (st != CERB_OK) {
            redis_close(e);
            return st;
        }
        CERB_LOG_D("redis %s: engine open (redlock, %zu nodes)", e->where, e->rc->n_nodes);
        *out = e;
        return CERB_OK;
    }
    if (e->rc->mode == CERB_REDIS_CLUSTER) {
        /* The routing instance: a map and one instance per master. */
        e->cl_top = true;
        st = cerb__redis_cluster_open(e);
        if (st != CERB_OK) {
            redis_close(e);
            return st;
        }
        CERB_LOG_D("redis %s: engine open (cluster)", e->where);
        *out = e;
        return CERB_OK;
    }
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->connect_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_scripts_load(e, c);
        if (st == CERB_OK)
            st = cerb__redis_marker_fetch(e, c);
        cerb__redis_put(e, c);
    }
    if (st != CERB_OK) {
        redis_close(e);
        return st;
    }
    st = cerb__redis_watch_start(e);
    if (st != CERB_OK) {
        redis_close(e);
        return st;
    }
    CERB_LOG_D("redis %s: engine open (pool up to %d)", e->where, e->rc->pool_max);
    *out = e;
    return CERB_OK;
}

/*
 * A master of a cluster (redis_cluster.h): an instance of its own in single
 * mode on n->host:n->port, sharing the routing instance's configuration,
 * events, waiter mutex, script SHAs and slot markers. No I/O here: its pool
 * connects on first use.
 */
cerb_status cerb__redis_node_new(cerb_engine *top, struct redis_cluster_node *n)
{
    cerb_engine *e = cerb__calloc(1, sizeof *e);
    cerb_status st;

    if (!e)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    n->rc = *top->rc;
    n->rc.mode = CERB_REDIS_SINGLE;
    n->rc.host = n->host;
    n->rc.port = n->port;
    e->cfg = top->cfg;
    e->rc = &n->rc;
    e->env = top->env;
    e->cl = top->cl;
    e->wmu = top->wmu;
    snprintf(e->where, sizeof e->where, "%s:%d", n->host, n->port);
    memcpy(e->sha, top->sha, sizeof e->sha);
    memcpy(e->probe_name, top->probe_name, sizeof e->probe_name);
    cerb__redis_addr_init(e);
    cerb__mutex_init(&e->probe_mu);
    cerb__mutex_init(&e->wait_mu);
    st = cerb__redis_marker_init(e);
    if (st == CERB_OK) {
        atomic_store(&e->quarantine_ms, atomic_load(&top->quarantine_ms));
        st = cerb__redis_pool_init(e);
    }
    if (st != CERB_OK) {
        cerb__redis_marker_destroy(e);
        cerb__mutex_destroy(&e->probe_mu);
        cerb__mutex_destroy(&e->wait_mu);
        cerb__redis_addr_destroy(e);
        cerb__free(e);
        return st;
    }
    n->e = e;
    return CERB_OK;
}

void cerb__redis_node_close(cerb_engine *e) { redis_close(e); }

void cerb__redis_stats(cerb_engine *e, struct cerb_redis_stats *out)
{
    if (e->cl_top || e->rl_top) {
        struct redis_counters sum;
        if (e->cl_top)
            cerb__redis_cl_stats(e, &sum);
        else
            cerb__redis_rl_stats(e, &sum);
#define RS_SUM(f) out->f = atomic_load_explicit(&sum.f, memory_order_relaxed)
        RS_SUM(round_trips);
        RS_SUM(connects);
        RS_SUM(acquire_calls);
        RS_SUM(acquire_polls);
        RS_SUM(grants);
        RS_SUM(handoffs_received);
        RS_SUM(handoffs_sent);
        RS_SUM(wakes_sent);
        RS_SUM(wakeups);
        RS_SUM(cancel_wakeups);
        RS_SUM(leaves);
        RS_SUM(noscript_reloads);
        RS_SUM(data_losses);
        RS_SUM(master_switches);
#undef RS_SUM
        return;
    }
#define RS_LOAD(f) out->f = atomic_load_explicit(&e->stats.f, memory_order_relaxed)
    RS_LOAD(round_trips);
    RS_LOAD(connects);
    RS_LOAD(acquire_calls);
    RS_LOAD(acquire_polls);
    RS_LOAD(grants);
    RS_LOAD(handoffs_received);
    RS_LOAD(handoffs_sent);
    RS_LOAD(wakes_sent);
    RS_LOAD(wakeups);
    RS_LOAD(cancel_wakeups);
    RS_LOAD(leaves);
    RS_LOAD(noscript_reloads);
    RS_LOAD(data_losses);
    RS_LOAD(master_switches);
#undef RS_LOAD
}

void cerb__redis_counters_add(struct redis_counters *sum, struct redis_counters *c)
{
#define ADD(f) atomic_fetch_add_explicit(&sum->f, atomic_load_explicit(&c->f, memory_order_relaxed), \
                                         memory_order_relaxed)
    ADD(round_trips);
    ADD(connects);
    ADD(acquire_calls);
    ADD(acquire_polls);
    ADD(grants);
    ADD(handoffs_received);
    ADD(handoffs_sent);
    ADD(wakes_sent);
    ADD(wakeups);
    ADD(cancel_wakeups);
    ADD(leaves);
    ADD(noscript_reloads);
    ADD(data_losses);
    ADD(master_switches);
#undef ADD
}

/* The generic counters for cerb_engine_info(): every run of the acquire
 * script counts (timer re-checks of queued waiters included), so "acquire
 * calls per acquisition" in the bench is the honest server-side cost. */
static void redis_op_stats(cerb_engine *e, struct cerb_engine_stats *out)
{
    struct cerb_redis_stats rs;
    cerb__redis_stats(e, &rs);
    out->acquire_calls = rs.acquire_calls;
    out->wakeups = rs.wakeups;
    out->handoffs = rs.handoffs_sent;
}

/* The operations: the routing instance of a cluster routes, every other
 * instance runs them itself (redis_cluster.h). */
static cerb_status redis_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                 const atomic_int *interrupted, cerb_grant *g)
{
    if (e->rl_top)
        return cerb__redis_rl_acquire(e, lk, deadline_ns, interrupted, g);
    return e->cl_top ? cerb__redis_cl_acquire(e, lk, deadline_ns, interrupted, g)
                     : cerb__redis_op_acquire(e, lk, deadline_ns, interrupted, g);
}

static cerb_status redis_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    if (e->rl_top)
        return cerb__redis_rl_renew(e, lk, g);
    return e->cl_top ? cerb__redis_cl_renew(e, lk, g) : cerb__redis_op_renew(e, lk, g);
}

static cerb_status redis_release(cerb_engine *e, cerb_engine_lock *lk)
{
    if (e->rl_top)
        return cerb__redis_rl_release(e, lk);
    return e->cl_top ? cerb__redis_cl_release(e, lk) : cerb__redis_op_release(e, lk);
}

static cerb_status redis_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    if (e->rl_top)
        return cerb__redis_rl_check(e, lk, g);
    return e->cl_top ? cerb__redis_cl_check(e, lk, g) : cerb__redis_op_check(e, lk, g);
}

static cerb_status redis_probe(cerb_engine *e, int64_t timeout_ms)
{
    if (e->rl_top)
        return cerb__redis_rl_probe(e, timeout_ms);
    return e->cl_top ? cerb__redis_cl_probe(e, timeout_ms) : cerb__redis_op_probe(e, timeout_ms);
}

static void redis_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n)
{
    if (e->rl_top)
        cerb__redis_rl_renew_batch(e, items, n);
    else if (e->cl_top)
        cerb__redis_cl_renew_batch(e, items, n);
    else
        cerb__redis_op_renew_batch(e, items, n);
}

static cerb_status redis_held(cerb_engine *e, const char *name)
{
    if (e->rl_top)
        return cerb__redis_rl_held(e, name);
    return e->cl_top ? cerb__redis_cl_held(e, name) : cerb__redis_op_held(e, name);
}

/* The guard in redlock mode: a done-record read from one node could miss
 * the majority that wrote it. */
static cerb_status rl_no_guard(void)
{
    return cerb__error_set(CERB_UNAVAILABLE, "redis: the idempotency guard is not available in "
                           "redlock mode (a done-record would need a quorum read and write-back)");
}

static cerb_status redis_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                     void **result, size_t *result_len)
{
    if (e->rl_top)
        return rl_no_guard();
    return e->cl_top ? cerb__redis_cl_guard_begin(e, rec, g, result, result_len)
                     : cerb__redis_guard_begin(e, rec, g, result, result_len);
}

static cerb_status redis_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    if (e->rl_top)
        return rl_no_guard();
    return e->cl_top ? cerb__redis_cl_guard_renew(e, rec, g) : cerb__redis_guard_renew(e, rec, g);
}

static cerb_status redis_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                      const void *result, size_t len, int64_t keep_ms,
                                      cerb_outcome *oc)
{
    if (e->rl_top)
        return rl_no_guard();
    return e->cl_top ? cerb__redis_cl_guard_finish(e, rec, ok, result, len, keep_ms, oc)
                     : cerb__redis_guard_finish(e, rec, ok, result, len, keep_ms, oc);
}

static cerb_status redis_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                     cerb_guard_found *found)
{
    if (e->rl_top)
        return rl_no_guard();
    return e->cl_top ? cerb__redis_cl_guard_check(e, rec, found)
                     : cerb__redis_guard_check(e, rec, found);
}

static cerb_status redis_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    if (e->rl_top)
        return cerb__redis_rl_inspect(e, name, out);
    return e->cl_top ? cerb__redis_cl_inspect(e, name, out) : cerb__redis_op_inspect(e, name, out);
}

static cerb_status redis_closure_get(cerb_engine *e, cerb_closure *out)
{
    return e->rl_top ? cerb__redis_rl_closure_get(e, out) : cerb__redis_op_closure_get(e, out);
}

static cerb_status redis_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now)
{
    return e->rl_top ? cerb__redis_rl_closure_put(e, rec, now)
                     : cerb__redis_op_closure_put(e, rec, now);
}

static void redis_cancel(cerb_engine *e, cerb_engine_lock *lk)
{
    if (!e->rl_top) /* redlock waits in slices that look at the flag */
        cerb__redis_op_cancel(e, lk);
}

/* Redlock: the longest lease this instance asked (a hold lasts at most
 * that past its last renewal on any node). Other modes: unknown. */
static int64_t redis_hold_bound_ms(cerb_engine *e)
{
    return e->rl_top ? atomic_load(&e->rl->max_lease_ms) : 0;
}

/* Redlock renews one hold per fan-out (no batch: a batch would be a loop
 * of fan-outs with every hold of the chunk marked sending, and an unlock
 * waiting for all of them); with redlock_fence = "none" it grants no fence
 * (token 0) and cannot honour a fence floor. */
static unsigned redis_instance_caps(cerb_engine *e)
{
    unsigned all = ~0u;
    if (e->rl_top)
        all &= ~(unsigned)CERB_CAP_BATCH_RENEW;
    if (e->rl_top && !e->rl->fence)
        all &= ~(unsigned)(CERB_CAP_FENCING | CERB_CAP_FENCE_FLOOR);
    return all;
}

/* The probe canary lives under a reserved prefix no lock may use. */
static cerb_status redis_check_name(const char *name)
{
    static const char reserved[] = "__cerberus_probe__:";
    if (strncmp(name, reserved, sizeof reserved - 1) == 0)
        return cerb__error_set(CERB_EINVAL, "names starting with \"%s\" are reserved", reserved);
    return CERB_OK;
}

const struct cerb_engine_ops cerb__redis_engine_ops = {
    .version = CERB_ENGINE_OPS_V5,
    .name = "redis",
    .caps = CERB_CAP_FENCING | CERB_CAP_FAIR_QUEUE | CERB_CAP_WAIT | CERB_CAP_BATCH_RENEW |
            CERB_CAP_CROSS_PROCESS | CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct redis_lock_priv),
    .instance_caps = redis_instance_caps,
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .renew = redis_renew,
    .release = redis_release,
    .check_owner = redis_check,
    .cancel = redis_cancel,
    .probe = redis_probe,
    .renew_batch = redis_renew_batch,
    .stats = redis_op_stats,
    .held = redis_held,
    .check_name = redis_check_name,
    .hold_bound_ms = redis_hold_bound_ms,
    /* version 2: guard records (redis_guard.c) */
    .guard_begin = redis_guard_begin,
    .guard_renew = redis_guard_renew,
    .guard_finish = redis_guard_finish,
    .guard_check = redis_guard_check,
    /* version 3: inspection (redis_inspect.c) */
    .inspect = redis_inspect,
    /* version 4: closure records (redis_closure.c) */
    .closure_get = redis_closure_get,
    .closure_put = redis_closure_put,
    /* version 5: leader election (redis_election.c) */
    .election = &cerb__redis_election,
    /* semaphores and read-write locks (redis_queue.c) */
    .semaphore = &cerb__redis_semaphore,
    .rwlock = &cerb__redis_rwlock,
};
