/*
 * mc_engine.c — the "memcached" engine table, and the glue that opens and
 * closes an instance, reports its counters and says what it cannot do.
 *
 * open() parses memcached.servers (one "host:port", resolved once to one
 * address), then opens the first pooled connection, which checks the
 * server and reads or makes its marker as every new connection does
 * (mc_marker.c: meta protocol, CAS on, evictions off unless
 * memcached.allow_evictions; a quarantine after a loss).
 *
 * No fencing (CERB_CAP_FENCING off): memcached keeps no counter across a
 * restart or an eviction, and the only monotonic number it has, the CAS,
 * is per process and starts again after a restart. No guard: records can
 * be evicted (core/guard_engine.c gives the reason). No semaphores, rwlocks
 * or elections: their tables stay NULL (the core answers "no such
 * primitive").
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "mc_internal.h"

static void mc_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__mc_pool_close(e);
    cerb__cond_destroy(&e->cv);
    cerb__mutex_destroy(&e->mu);
    cerb__mutex_destroy(&e->fp_mu);
    cerb__free(e);
}

/* "host:port" or "[v6]:port" (the config check made sure of the port). */
static cerb_status split_hostport(cerb_engine *e, const char *s)
{
    const char *colon = strrchr(s, ':');
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        h = s + 1;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof e->host || strlen(colon + 1) >= sizeof e->port)
        return cerb__error_set(CERB_ECONFIG, "memcached.servers: bad address \"%s\"", s);
    memcpy(e->host, h, hl);
    e->host[hl] = '\0';
    snprintf(e->port, sizeof e->port, "%s", colon + 1);
    return CERB_OK;
}

static cerb_status mc_open(const cerb_engine_env *env, cerb_engine **out)
{
    *out = NULL;
    if (!env || !env->cfg)
        return cerb__error_set(CERB_EINVAL, "memcached: no configuration");
    const struct cerb_memcached_config *mc = &env->cfg->memcached;
    if (mc->n_servers != 1)
        return cerb__error_set(CERB_ECONFIG, "memcached.servers: exactly one server");
    cerb_engine *e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "memcached: out of memory");
    e->cfg = env->cfg;
    e->mc = mc;
    e->env = *env;
    e->max = mc->pool;
    cerb__mutex_init(&e->mu);
    cerb__mutex_init(&e->fp_mu);
    cerb__cond_init(&e->cv);
    cerb_status st = split_hostport(e, mc->servers[0]);
    if (st == CERB_OK)
        st = cerb__mc_resolve(e);
    if (st == CERB_OK)
        st = cerb__mc_marker_init(e);
    /* The first connection checks the server and reads (or makes) its
     * marker, as every new one does (mc_marker.c). */
    struct mc_conn *c = NULL;
    if (st == CERB_OK)
        st = cerb__mc_take(e, cerb__deadline_in(mc->connect_timeout_ms + mc->op_timeout_ms), &c);
    if (st == CERB_OK)
        cerb__mc_give(e, c, false);
    if (st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        mc_close(e);
        return cerb__error_set(st, "%s", why);
    }
    CERB_LOG_D("memcached: engine open (%s:%s, prefix \"%s\", pool %d)", e->host, e->port,
               mc->prefix, e->max);
    *out = e;
    return CERB_OK;
}

static cerb_status mc_probe(cerb_engine *e, int64_t timeout_ms)
{
    return cerb__mc_op_probe(e, timeout_ms);
}

static void mc_stats(cerb_engine *e, struct cerb_engine_stats *out)
{
    out->acquire_calls = atomic_load_explicit(&e->stats.acquire_calls, memory_order_relaxed);
    out->wakeups = 0;  /* waiters poll: nothing wakes them */
    out->handoffs = 0; /* a release only deletes */
}

/* The longest expiry T this instance sent, or would send for the file's
 * lease (a fresh client has sent none yet), plus one second: an item can
 * outlive its holder's last contact by T, and by up to a second more when
 * memcached's clock tick is late (it then reads the item as younger). */
static int64_t mc_hold_bound(cerb_engine *e)
{
    int64_t ttl_s = 0, sent = atomic_load(&e->max_ttl_ms);
    if (cerb__mc_ttl_s(e->cfg->lock.lease_ms, &ttl_s) == CERB_OK && ttl_s * 1000 > sent)
        sent = ttl_s * 1000;
    return sent + 1000;
}

const struct cerb_engine_ops cerb__memcached_engine_ops = {
    .version = CERB_ENGINE_OPS_V5,
    .name = "memcached",
    .caps = CERB_CAP_WAIT | CERB_CAP_CROSS_PROCESS,
    .lock_priv_size = sizeof(struct mc_lock_priv),
    .open = mc_open,
    .close = mc_close,
    .acquire = cerb__mc_op_acquire,
    .renew = cerb__mc_op_renew,
    .release = cerb__mc_op_release,
    .check_owner = cerb__mc_op_check,
    .probe = mc_probe,
    .stats = mc_stats,
    .held = cerb__mc_op_held,
    .hold_bound_ms = mc_hold_bound,
    /* version 2: no guard (core/guard_engine.c says why) */
    /* version 3 */
    .inspect = cerb__mc_op_inspect,
    /* version 4: no closure records; version 5: no primitives beyond the
     * mutex */
};
