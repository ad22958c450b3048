/*
 * redis_cluster.h — Redis Cluster mode (redis.mode = "cluster").
 *
 * The routing instance keeps the slot map (CLUSTER SLOTS through any node
 * it knows, the configured seeds first) and one instance per master node:
 * a single-mode instance of this engine with its own command pool, blocking
 * connections and probe connection. Every operation on a lock goes to the
 * master of its slot. Redirections are followed (redis_errors.h): MOVED
 * refreshes the map and retries on the named node; ASK retries once on the
 * target with ASKING first; TRYAGAIN (a migration has moved some of the
 * keys) and CLUSTERDOWN retry after a short pause; a refused connection or
 * a timeout refreshes the map (the master may have failed over) and
 * retries when the slot's master changed. Only a request the server did
 * not run is sent again, or one whose outcome the operation settles itself.
 *
 * Keys. Every key of a lock is in the slot of K (redis_scripts.h), and every
 * script declares all of them: K F Q M D W and, when a release or a
 * hand-off must wake the head of the queue, that waiter's wake list (the
 * script answers {'H', head} when the caller did not name it, and the caller
 * runs it again naming it: nothing was handed or woken, so the second run
 * decides afresh).
 *
 * Data-loss marker. A script can only read keys of its own slot, so the
 * marker is per slot: M = "{<tag>}" prefix "\x1fcerberus", <tag> the
 * smallest decimal number whose text hashes to the slot (the same for
 * every client; `cerberus init` marks a new cluster with it). The
 * instance learns each slot's marker on first use, and checks it against the
 * history of the node that serves the slot now (its replication id): after
 * a failover, or after the slot moved to another master, the first use
 * raises the slot's quarantine (redis_marker.h), so grants of names in that
 * slot wait one lease while holds renew as usual. A marker found gone tells
 * every hold of the instance LOST, as in single mode.
 */
#ifndef CERB_REDIS_CLUSTER_H
#define CERB_REDIS_CLUSTER_H

#include <stdint.h>

#include "redis_conn.h"
#include "redis_marker.h"

#define REDIS_SLOTS 16384
#define REDIS_CLUSTER_MAX_NODES 64
#define REDIS_MAX_REDIRECTS 5       /* MOVED/ASK hops per operation */
#define REDIS_CLUSTER_RETRY_MS 20   /* pause before a TRYAGAIN/CLUSTERDOWN retry */

/* What one instance knows of a slot's marker. */
struct redis_slot_marker {
    struct redis_marker_view v;
    char replid[48]; /* the node history it was checked against */
};

struct redis_cluster_node {
    char host[256];
    int port;
    struct cerb_redis_config rc; /* the configuration, single mode, host:port */
    cerb_engine *e;              /* its own instance */
};

struct redis_cluster {
    cerb_mutex mu;               /* nodes, n_nodes, slot_node */
    struct redis_cluster_node *nodes[REDIS_CLUSTER_MAX_NODES];
    int n_nodes;
    int16_t slot_node[REDIS_SLOTS]; /* index in nodes, -1 = unknown */
    cerb_mutex refresh_mu;       /* one CLUSTER SLOTS at a time */
    int64_t last_refresh_ns;     /* refresh_mu */
    int refresh_next;            /* refresh_mu: the node that answered last */
    cerb_mutex mk_mu;            /* mk */
    struct redis_slot_marker *mk[REDIS_SLOTS];
    uint32_t tag[REDIS_SLOTS];   /* the slot's marker tag */
};

/* The hash slot of a key, as Redis computes it (CRC16 of its hash tag). */
unsigned cerb__redis_key_slot(const char *key, size_t len);
/* The smallest number whose decimal text hashes to slot (the slot's marker
 * tag; computed by search, for tools: the engine keeps a table). */
unsigned cerb__redis_slot_tag(unsigned slot);
/* Where Redis' hash tag of key lies: *start, *len (the whole key if none). */
void cerb__redis_hash_tag(const char *key, size_t len, size_t *start, size_t *tlen);

/* Open and close the routing instance's part (the map, the first node). */
cerb_status cerb__redis_cluster_open(cerb_engine *top);
void cerb__redis_cluster_close(cerb_engine *top);

/* A node instance (redis_engine.c): set up without connecting. */
cerb_status cerb__redis_node_new(cerb_engine *top, struct redis_cluster_node *n);
void cerb__redis_node_close(cerb_engine *e);

/* The engine operations of the routing instance. */
cerb_status cerb__redis_cl_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                   const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__redis_cl_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__redis_cl_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n);
cerb_status cerb__redis_cl_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__redis_cl_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__redis_cl_held(cerb_engine *e, const char *name);
struct cerb_holders;
cerb_status cerb__redis_cl_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);
cerb_status cerb__redis_cl_probe(cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__redis_cl_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                    size_t n, cerb_outcome *outcome);
cerb_status cerb__redis_cl_leader(cerb_engine *e, const char *name, int variant,
                                  cerb_leader_rec *out);
cerb_status cerb__redis_cl_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                       void **result, size_t *result_len);
cerb_status cerb__redis_cl_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g);
cerb_status cerb__redis_cl_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                        const void *result, size_t len, int64_t keep_ms,
                                        cerb_outcome *oc);
cerb_status cerb__redis_cl_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                       cerb_guard_found *found);
/* Run op(node instance, arg, &outcome) on the master of key's slot,
 * following redirects as every routed operation (the semaphore and
 * read-write lock tables, redis_queue.c). */
cerb_status cerb__redis_cl_route(cerb_engine *top, const char *key, size_t len,
                                 int64_t deadline_ns,
                                 cerb_status (*op)(cerb_engine *, void *, cerb_outcome *),
                                 void *arg);
/* Sum of every node's counters. */
void cerb__redis_cl_stats(cerb_engine *e, struct redis_counters *sum);

#endif
