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
 *   redis_errors.c   hiredis failures to cerb_status
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
#include "redis_guard.h"
#include "redis_marker.h"
#include "redis_scripts.h"
#include "redis_sentinel.h"
#include "redis_stats.h"

static void redis_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__redis_pool_destroy(e);
    cerb__redis_conn_free(e->probe_conn);
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
    if (e->rc->mode == CERB_REDIS_CLUSTER) {
        cerb__free(e);
        return cerb__error_set(CERB_ECONFIG, "redis.mode = \"cluster\" is not supported yet "
                               "(\"single\" and \"sentinel\" are)");
    }
    if (e->rc->mode == CERB_REDIS_SINGLE && (!e->rc->host || !e->rc->host[0])) {
        cerb__free(e);
        return cerb__error_set(CERB_ECONFIG, "redis: no host configured");
    }
    if (e->rc->mode == CERB_REDIS_SENTINEL)
        snprintf(e->where, sizeof e->where, "master \"%s\" (sentinels)", e->rc->master_name);
    else
        snprintf(e->where, sizeof e->where, "%s:%d", e->rc->host, e->rc->port);
    cerb__redis_addr_init(e);
    snprintf(e->probe_name, sizeof e->probe_name, "__cerberus_probe__:%016llx",
             (unsigned long long)cerb__rand_below(UINT64_MAX));
    cerb__mutex_init(&e->probe_mu);
    cerb__mutex_init(&e->wait_mu);
    st = cerb__redis_marker_init(e);
    if (st == CERB_OK)
        st = cerb__redis_pool_init(e);
    if (st != CERB_OK) {
        cerb__redis_marker_destroy(e);
        cerb__mutex_destroy(&e->probe_mu);
        cerb__mutex_destroy(&e->wait_mu);
        cerb__redis_addr_destroy(e);
        cerb__free(e);
        return st;
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
    CERB_LOG_D("redis %s: engine open (pool up to %d)", e->where, e->rc->pool_max);
    *out = e;
    return CERB_OK;
}

void cerb__redis_stats(cerb_engine *e, struct cerb_redis_stats *out)
{
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
#undef RS_LOAD
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

/* The probe canary lives under a reserved prefix no lock may use. */
static cerb_status redis_check_name(const char *name)
{
    static const char reserved[] = "__cerberus_probe__:";
    if (strncmp(name, reserved, sizeof reserved - 1) == 0)
        return cerb__error_set(CERB_EINVAL, "names starting with \"%s\" are reserved", reserved);
    return CERB_OK;
}

const struct cerb_engine_ops cerb__redis_engine_ops = {
    .version = CERB_ENGINE_OPS_V3,
    .name = "redis",
    .caps = CERB_CAP_FENCING | CERB_CAP_FAIR_QUEUE | CERB_CAP_WAIT | CERB_CAP_BATCH_RENEW |
            CERB_CAP_CROSS_PROCESS | CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct redis_lock_priv),
    .open = redis_open,
    .close = redis_close,
    .acquire = cerb__redis_op_acquire,
    .renew = cerb__redis_op_renew,
    .release = cerb__redis_op_release,
    .check_owner = cerb__redis_op_check,
    .cancel = cerb__redis_op_cancel,
    .probe = cerb__redis_op_probe,
    .renew_batch = cerb__redis_op_renew_batch,
    .stats = redis_op_stats,
    .held = cerb__redis_op_held,
    .check_name = redis_check_name,
    /* version 2: guard records (redis_guard.c) */
    .guard_begin = cerb__redis_guard_begin,
    .guard_renew = cerb__redis_guard_renew,
    .guard_finish = cerb__redis_guard_finish,
    .guard_check = cerb__redis_guard_check,
    /* version 3: inspection (redis_inspect.c) */
    .inspect = cerb__redis_op_inspect,
};
