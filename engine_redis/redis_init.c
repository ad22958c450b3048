/*
 * redis_init.c — `cerberus init` for the redis engine (redis_init.h): write
 * the data-loss markers (redis_marker.h) with the server's replication id
 * and no quarantine, on a deployment no client has used, so that the first
 * grant does not wait a lease.
 *
 * Why it must refuse. A server restarted without its data looks new: no
 * marker. A client that finds it so quarantines it for a lease, because
 * holders from before the loss may not know yet. Writing the marker by
 * hand ends that protection, so init looks for every sign of earlier use it
 * can see cheaply and refuses (writing nothing) unless forced:
 *   - a marker that records another replication id, or none (it may have
 *     come back with a snapshot), or that is malformed;
 *   - a quarantine in force (a client found the marker missing);
 *   - no marker, but the server evicted keys or ran FLUSHALL/FLUSHDB since
 *     it started (INFO stats, INFO commandstats), or holds Cerberus keys
 *     (any key with the byte 0x1f: fence counters, queues, wake lists,
 *     guard records) in a slot whose marker is missing, looked for with
 *     SCAN for at most REDIS_INIT_SCAN_OPS operation timeouts (not done
 *     within them: refused, it could not be checked).
 * A restart without data that nothing else betrays (no key left, a new
 * process with fresh counters) cannot be told from a new server: that is
 * the documented danger of the command, and why it is an operator's.
 *
 * Algorithm. This file finds the masters (single: the server; sentinel:
 * the master the sentinels name; cluster: each master serving slots, its
 * markers "{tag}<prefix>\x1fcerberus" for each of its slots) and gives the
 * verdict; redis_init_master.c runs the steps on each master:
 *   1. one pipelined round trip: INFO replication, stats and commandstats,
 *      DBSIZE, TIME, SCRIPT LOAD of the write script, and GET of every
 *      marker; each marker is judged: missing, prepared (this history, no
 *      quarantine in force), or a sign of earlier use;
 *   2. where markers are missing: the other signs above;
 * then, when no master showed a sign (or with --force), for every master:
 *   3. one pipelined round trip: the write script for each marker that is
 *      not prepared. It decides again atomically on the server, so a client
 *      that made a marker in between is not overwritten (counted as
 *      refused), and with --force it keeps a marker's id: clients that know
 *      it go on, and the quarantine they wait for ends at once;
 *   4. WAIT for the master's connected replicas (half an operation
 *      timeout), so a failover right after init does not lose the markers.
 * So a refusal writes nothing anywhere, and a store that is already
 * prepared gets no write at all (init twice is harmless).
 */
#include "internal_posix.h"

#include "redis_init.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "config.h"
#include "error.h"
#include "redis_cluster.h"
#include "redis_conn.h"
#include "redis_sentinel.h"

extern const struct cerb_engine_ops cerb__redis_engine_ops;

/* ---- the deployment: which masters, connected ---- */

static cerb_status master_alloc(struct redis_init_master *m, size_t n)
{
    m->n = n;
    m->st = cerb__calloc(n, 1);
    return m->st ? CERB_OK : cerb__error_set(CERB_ENOMEM, "redis: out of memory");
}

/* Single or sentinel: a bare instance (no marker key, so connecting runs
 * no history script: nothing is written before the verdict). */
static cerb_status setup_one(struct redis_init_job *j)
{
    cerb_engine *e = j->bare = cerb__calloc(1, sizeof *e);
    j->m = cerb__calloc(1, sizeof *j->m);
    if (!e || !j->m)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    e->cfg = j->cfg;
    e->rc = j->rc;
    e->env.cfg = j->cfg;
    if (j->rc->mode == CERB_REDIS_SENTINEL)
        snprintf(e->where, sizeof e->where, "master \"%s\" (sentinels)", j->rc->master_name);
    else
        snprintf(e->where, sizeof e->where, "%s:%d", j->rc->host, j->rc->port);
    snprintf(j->where, sizeof j->where, "%s", e->where);
    cerb__redis_addr_init(e);
    j->nm = 1;
    struct redis_init_master *m = &j->m[0];
    m->e = e;
    cerb_status st = master_alloc(m, 1);
    if (st == CERB_OK)
        st = cerb__redis_conn_open(e, j->rc->connect_timeout_ms, j->rc->op_timeout_ms, &m->c);
    if (st != CERB_OK)
        return st;
    if (j->rc->mode == CERB_REDIS_SENTINEL) {
        cerb__mutex_lock(&e->addr_mu);
        snprintf(m->where, sizeof m->where, "master \"%s\" at %s:%d", j->rc->master_name,
                 e->addr_host, e->addr_port);
        cerb__mutex_unlock(&e->addr_mu);
        snprintf(j->where, sizeof j->where, "%s", m->where);
    } else {
        snprintf(m->where, sizeof m->where, "%s", e->where);
    }
    return CERB_OK;
}

/* Cluster: the engine's own routing instance reads the slot map (opening
 * it makes no marker: slots are marked on first use), then one master per
 * node that serves slots, on its pool connection. */
static cerb_status setup_cluster(struct redis_init_job *j)
{
    cerb_engine_env env = {.cfg = j->cfg};
    cerb_status st = cerb__redis_engine_ops.open(&env, &j->top);
    if (st != CERB_OK)
        return st;
    struct redis_cluster *cl = j->top->cl;
    size_t count[REDIS_CLUSTER_MAX_NODES] = {0};
    int16_t owner[REDIS_SLOTS];
    cerb__mutex_lock(&cl->mu);
    int nn = cl->n_nodes;
    memcpy(owner, cl->slot_node, sizeof owner);
    cerb_engine *node_e[REDIS_CLUSTER_MAX_NODES];
    for (int i = 0; i < nn; i++)
        node_e[i] = cl->nodes[i]->e;
    cerb__mutex_unlock(&cl->mu);
    for (int s = 0; s < REDIS_SLOTS; s++) {
        if (owner[s] < 0)
            return cerb__error_set(CERB_EIO, "redis %s: no master serves slot %d: init needs "
                                   "the whole cluster up", j->top->where, s);
        count[owner[s]]++;
    }
    j->m = cerb__calloc((size_t)nn, sizeof *j->m);
    if (!j->m)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    size_t idx[REDIS_CLUSTER_MAX_NODES] = {0};
    int map[REDIS_CLUSTER_MAX_NODES];
    for (int i = 0; i < nn; i++) {
        map[i] = -1;
        if (count[i] == 0)
            continue;
        struct redis_init_master *m = &j->m[j->nm];
        map[i] = (int)j->nm++;
        m->e = node_e[i];
        snprintf(m->where, sizeof m->where, "%s", m->e->where);
        m->slots = cerb__calloc(count[i], sizeof *m->slots);
        if (!m->slots || master_alloc(m, count[i]) != CERB_OK)
            return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    }
    for (int s = 0; s < REDIS_SLOTS; s++) {
        struct redis_init_master *m = &j->m[map[owner[s]]];
        m->slots[idx[owner[s]]++] = s;
    }
    snprintf(j->where, sizeof j->where, "%s", j->top->where);
    for (size_t k = 0; k < j->nm; k++) {
        struct redis_init_master *m = &j->m[k];
        st = cerb__redis_get(m->e, cerb__deadline_in(j->rc->connect_timeout_ms), &m->c);
        if (st != CERB_OK)
            return st;
        m->pooled = true;
    }
    return CERB_OK;
}

static void teardown(struct redis_init_job *j)
{
    for (size_t k = 0; j->m && k < j->nm; k++) {
        struct redis_init_master *m = &j->m[k];
        if (m->c && m->pooled)
            cerb__redis_put(m->e, m->c);
        else
            cerb__redis_conn_free(m->c);
        cerb__free(m->slots);
        cerb__free(m->st);
    }
    cerb__free(j->m);
    if (j->top)
        cerb__redis_engine_ops.close(j->top);
    if (j->bare) {
        cerb__redis_addr_destroy(j->bare);
        cerb__free(j->bare);
    }
}

/* ---- the verdict ---- */

static const char hint[] =
    "the server may have lost its data, and preparing it would end the quarantine that "
    "protects holders from before the loss; if it is new, or no client of it from before is "
    "alive, run `cerberus init --force`";

static cerb_status init_redis(const struct cerb_config *cfg, unsigned flags,
                              cerb_store_result *result, char *line, size_t len)
{
    struct redis_init_job j = {.cfg = cfg, .rc = &cfg->redis, .force = (flags & CERB_STORE_INIT_FORCE) != 0};
    size_t total = 0, used = 0, missing = 0, made = 0, forced = 0, late = 0;
    long long acked = 0, replicas = 0;
    const char *why = "";
    char id[32];
    cerb_status st;

    *result = CERB_STORE_FAILED;
    st = cfg->redis.mode == CERB_REDIS_CLUSTER ? setup_cluster(&j) : setup_one(&j);
    for (size_t k = 0; st == CERB_OK && k < j.nm; k++)
        st = cerb__redis_init_read(&j, &j.m[k]);
    for (size_t k = 0; st == CERB_OK && !j.force && k < j.nm; k++)
        st = cerb__redis_init_look(&j, &j.m[k]);
    if (st != CERB_OK) {
        snprintf(line, len, "%s: %s", j.where[0] ? j.where : "?", cerb_last_error());
        teardown(&j);
        return st;
    }
    for (size_t k = 0; k < j.nm; k++) {
        total += j.m[k].n;
        used += j.m[k].used;
        missing += j.m[k].missing;
        if (!why[0] && j.m[k].why[0])
            why = j.m[k].why;
    }
    bool cluster = j.top != NULL;
    char count[96] = "";
    if (cluster)
        snprintf(count, sizeof count, " (%zu slot markers on %zu masters)", total, j.nm);
    if (used > 0 && !j.force) {
        *result = CERB_STORE_REFUSED;
        if (cluster)
            snprintf(line, len, "%s: refused, nothing written: %zu of %zu slots show earlier use, "
                     "e.g. %s; %s", j.where, used, total, why, hint);
        else
            snprintf(line, len, "%s: refused, nothing written: %s; %s", j.where,
                     strstr(why, ": ") ? strstr(why, ": ") + 2 : why, hint);
        teardown(&j);
        return CERB_BUSY;
    }
    if (used == 0 && missing == 0) {
        *result = CERB_STORE_ALREADY;
        snprintf(line, len, "%s: already prepared%s: %s with the server's replication id, no "
                 "quarantine in force; nothing written", j.where, count,
                 cluster ? "every slot has its marker" : "its marker is there");
        teardown(&j);
        return CERB_OK;
    }
    snprintf(id, sizeof id, "init-%016llx", (unsigned long long)cerb__rand_below(UINT64_MAX));
    for (size_t k = 0; st == CERB_OK && k < j.nm; k++) {
        st = cerb__redis_init_write(&j, &j.m[k], id);
        made += j.m[k].made;
        forced += j.m[k].forced;
        late += j.m[k].late;
        acked += j.m[k].acked;
        replicas += j.m[k].replicas;
    }
    char rep[96] = "";
    if (replicas > 0)
        snprintf(rep, sizeof rep, "; %lld of %lld replicas confirmed", acked, replicas);
    if (st != CERB_OK) {
        snprintf(line, len, "%s: %s (%zu markers written before it: run init again)", j.where,
                 cerb_last_error(), made + forced);
    } else if (late > 0) {
        *result = CERB_STORE_REFUSED;
        st = CERB_BUSY;
        snprintf(line, len, "%s: refused in part: %zu markers were made by a client meanwhile "
                 "(it quarantines those); %zu written%s", j.where, late, made + forced, rep);
    } else if (!cluster) {
        *result = CERB_STORE_PREPARED;
        const char *was = strstr(why, ": ") ? strstr(why, ": ") + 2 : why;
        snprintf(line, len, "%s: prepared: marker %s, replication id %s, no quarantine%s%s%s",
                 j.where, forced ? "rewritten with --force (its id kept)" : "written",
                 j.m[0].replid[0] ? j.m[0].replid : "unknown (INFO denied)",
                 forced ? " (it showed: " : "", forced ? was : "", forced ? ")" : "");
        if (rep[0])
            snprintf(line + strlen(line), len - strlen(line), "%s", rep);
    } else {
        char more[96] = "";
        size_t had = total - made - forced;
        *result = CERB_STORE_PREPARED;
        if (forced)
            snprintf(more, sizeof more, ", %zu rewritten with --force", forced);
        if (had)
            snprintf(more + strlen(more), sizeof more - strlen(more), ", %zu already prepared",
                     had);
        snprintf(line, len, "%s: prepared%s: %zu written%s, no quarantine%s", j.where, count,
                 made, more, rep);
    }
    teardown(&j);
    return st;
}

const struct cerb_store_ops cerb__redis_store_ops = {
    .version = CERB_STORE_OPS_V1,
    .name = "redis",
    .init = init_redis,
};
