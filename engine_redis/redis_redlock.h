/*
 * redis_redlock.h — Redlock over N independent masters (redis.mode =
 * "redlock", redis.nodes = the masters, docs/engines.md "Redlock").
 *
 * The routing instance (rl_top) keeps one single-mode instance per master
 * (rl_node: its own pool; no data-loss marker; the run_id read at every
 * connect) and asks all of them at once from one thread: requests are
 * written to every node's connection, then the sockets are polled together
 * until each has answered or the per-node bound (a twentieth of the lease,
 * redsync's timeoutFactor) has passed (redis_redlock_io.c).
 *
 * Per node, the lock is redis-py's, redsync's and node-redlock's: K =
 * redis.prefix + name holds the owner token with a PX lease; release is
 * compare-and-DEL, renewal compare-and-PEXPIRE. A grant needs N/2+1 nodes
 * within the validity window; a failed attempt is released on every node.
 *
 * Fencing (redis.redlock_fence = "quorum", stores.md §3.7), per node:
 *   {K}^_rlfence              the name's counter, INCR with each grant
 *   <prefix>^_cerberus^_redlock^_hi    the largest counter this node has seen
 *   <prefix>^_cerberus^_redlock^_seed  present = the node kept its state (or
 *                              was re-seeded since it lost it); value: the
 *                              floor its counters start above
 * (^_ = the byte 0x1f, which no lock name can hold). The grant's fence is
 * T = c × 16 + i, c the largest counter of the quorum (seeded nodes only),
 * i its node index; it is written back (raise only, only where K is still
 * ours) to a majority of seeded nodes before the grant is reported.
 */
#ifndef CERB_REDIS_REDLOCK_H
#define CERB_REDIS_REDLOCK_H

#include <stdint.h>

#include "redis_cluster.h"
#include "redis_conn.h"

#define RL_MAX_NODES 16       /* the fence packs the node index in 4 bits */
#define RL_NODE_MIN_MS 20     /* per-node bound floor: a loaded host's RTT */
#define RL_SETUP_MAX_MS 200   /* a node's connect and set-up, at most */
#define RL_SKIP_MS 1000       /* a failed node is asked again after this */
#define RL_RETRY_BASE_MS 10   /* full jitter: [0, min(cap, base × 2^k)) */
#define RL_RETRY_CAP_MS 200
#define RL_FENCE_TTL_MS 86400000 /* a name's counter outlives its last grant
                                    by a day; then it restarts above hi */
/* The core's validity rule (core/internal.h CERB_DRIFT_*): a grant is good
 * until sent + lease − lease × 1% − 2 ms; a quorum later than that fails. */
#define RL_DRIFT_PERMILLE 10
#define RL_DRIFT_FIXED_MS 2

enum rl_script {
    RL_ACQUIRE,   /* SET NX PX (+ counter): {1, c, seeded} | {0, pttl} */
    RL_RENEW,     /* compare-and-PEXPIRE; SET NX PX when absent: 1 | 2 | 0 */
    RL_RELEASE,   /* compare-and-DEL: 1 | 0 */
    RL_CHECK,     /* {1, pttl} | {0} */
    RL_INSPECT,   /* {token, pttl} | {} */
    RL_WRITEBACK, /* raise the counter where K is ours: 1 seeded, 0 not, -1 lost */
    RL_READSEED,  /* {seeded, hi} */
    RL_RESEED,    /* raise seed and hi to s: 1 */
    RL_SCRIPT_COUNT
};

struct rl_node {
    struct redis_cluster_node cn;  /* host, port, its configuration, instance */
    int id;                        /* its rank in the nodes sorted by "host:port"
                                      (the fence's node index: the same in
                                      every client listing the same nodes) */
    _Atomic bool evict_said;       /* its eviction policy was logged */
    _Atomic int64_t skip_until_ns; /* failed: not asked until then (a node that
                                      accepts but does not answer would cost
                                      every call its connect set-up) */
};

struct redis_redlock {
    int n, quorum;
    struct rl_node nodes[RL_MAX_NODES];
    char sha[RL_SCRIPT_COUNT][41];
    bool fence;
    _Atomic int64_t max_lease_ms;  /* the longest lease asked */
    char *state_key;      /* the hash of hi and seed, per node */
};

/* One node's part of a fan-out. */
struct rl_reply {
    bool asked;           /* in the mask */
    cerb_status st;       /* CERB_OK: r is its answer (maybe an error reply) */
    cerb_outcome oc;      /* on failure: may it have run? */
    redisReply *r;
    bool out;             /* left out of quorums (its policy evicts) */
    bool lost;            /* answered 'L': lost its data, marker made again */
    char why[400];        /* on failure */
};

/* A request: a script (or, script < 0, the raw command in argv). */
struct rl_req {
    int script;
    int nkeys;
    int argc;             /* keys + args (script), or the raw command's */
    const char **argv;
    const size_t *argl;
};

cerb_status cerb__redis_rl_open(cerb_engine *top);
void cerb__redis_rl_close(cerb_engine *top);

/* Ask every node in mask (bit i = node i) at once, each bounded by
 * bound_ms; rep[i] filled for each. Free with cerb__redis_rl_free. */
void cerb__redis_rl_fanout(cerb_engine *top, unsigned mask, const struct rl_req *rq,
                           int64_t bound_ms, struct rl_reply *rep);
void cerb__redis_rl_free(struct rl_reply *rep, int n);
/* The per-node bound for a lease. */
int64_t cerb__redis_rl_bound_ms(const cerb_engine *top, int64_t lease_ms);
/* "a:1 (why); b:2 (why)" for the nodes that failed in rep. */
void cerb__redis_rl_failed(const cerb_engine *top, const struct rl_reply *rep, char *buf,
                           size_t len);
/* Seed what lost its state from a majority of nodes that kept theirs. */
cerb_status cerb__redis_rl_reseed(cerb_engine *top, int64_t bound_ms);

/* Sum of every node's counters. */
void cerb__redis_rl_stats(cerb_engine *top, struct redis_counters *sum);

/* The engine operations of the routing instance. */
cerb_status cerb__redis_rl_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                   const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__redis_rl_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__redis_rl_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n);
cerb_status cerb__redis_rl_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__redis_rl_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__redis_rl_held(cerb_engine *e, const char *name);
struct cerb_holders;
cerb_status cerb__redis_rl_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);
cerb_status cerb__redis_rl_probe(cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__redis_rl_closure_get(cerb_engine *e, cerb_closure *out);
cerb_status cerb__redis_rl_closure_put(cerb_engine *e, const cerb_closure *rec,
                                       cerb_closure *now);
/* A primitive redlock mode does not have: CERB_UNAVAILABLE, no_prim set. */
cerb_status cerb__redis_rl_no_prim(cerb_engine *e, const char *what, cerb_grant *grant);

#endif
