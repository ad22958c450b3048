/*
 * redis_scripts.h — the lock's keys, its Lua scripts, and the engine
 * operations built on them (redis_scripts.c), plus the waiting acquire and
 * cancel (redis_wait.c). redis_engine.c puts these into the ops table.
 *
 * Keys of a lock, K = redis.prefix + name (the redis-py compatible key),
 * with ^_ the byte 0x1f (REDIS_SEP):
 *   K               string: owner token, PX lease
 *   {K}^_fence      counter: the fence of the last grant
 *   {K}^_q          list: waiter tokens, FIFO
 *   {K}^_d          hash: waiter token -> "deadline_ms lease_ms" (server time)
 *   {K}^_w:<token>  list: a waiter's wake-ups ("f<fence>" = handed the lock,
 *                   "w" = the lock was freed, try again)
 *   {K}^_value      string: "<token> <value>", the value an election term
 *                   proclaimed (redis_election.c), PX a day, refreshed by
 *                   the term's renewals
 * The {K} hash tag keeps them all in K's cluster slot (cluster mode: see
 * struct redis_keys for names with a '}', and every script there declares
 * D, W and the head's wake list too, redis_cluster.h). The helper keys
 * contain a control byte, which no lock name can (the core refuses bytes
 * below 0x20 and 0x7f), so no lock's K is ever another lock's helper key:
 * with "{K}:fence" a lock named "{x}:fence" was x's counter.
 */
#ifndef CERB_REDIS_SCRIPTS_H
#define CERB_REDIS_SCRIPTS_H

#include <stdbool.h>

#include "redis_conn.h"
#include "redis_marker.h"

/* Timing of the wait protocol, all in milliseconds. */
#define REDIS_HANDOFF_TTL_MS 2000 /* lease of a handed-over key until its
                                     new owner extends it */
#define REDIS_ALIVE_MS 1500       /* a waiter counts as alive this long
                                     after its last re-check */
#define REDIS_HEAD_POLL_MS 200    /* head waiter re-check (silent releases) */
#define REDIS_TAIL_POLL_MS 500    /* other waiters' re-check (liveness) */
#define REDIS_WAKE_TTL_MS 10000   /* lifetime of a wake list, and the slack
                                     of the queue keys over a deadline */
#define REDIS_PROBE_LEASE_MS 1000
#define REDIS_FENCE_TTL_MS 86400000 /* a fence counter lives a day past its
                                       name's last grant (redis_scripts.c) */
#define REDIS_FENCE_SEED 10000      /* a lost counter restarts this many
                                       100 us ticks (1 s) ahead of the
                                       server's clock */

/* The separator of a helper key's suffix ("\x1f", unit separator). */
#define REDIS_SEP "\x1f"

enum { REDIS_K, REDIS_F, REDIS_Q, REDIS_D, REDIS_W, REDIS_V, REDIS_NKEYS };

/*
 * The key names of one lock and token, built once per operation.
 *
 * In cluster mode (e->cl) the keys also carry the slot of K, the marker key
 * of that slot (redis_marker.h) and, once a script asked for it, the wake
 * list of the queue's head (wh): every script declares every key it
 * touches. A K with a '}' in it hashes by its own tag (or whole), which
 * "{K}" does not reproduce; its helper keys are then "{n}K\x1f…", n being
 * the slot's marker tag (a number whose text hashes to K's slot), so they
 * share K's slot and stay distinct from every other lock's (two '}' or
 * more, where "{K}\x1f…" of a brace-free K has one).
 */
struct redis_keys {
    const char *k[REDIS_NKEYS];
    size_t len[REDIS_NKEYS];
    int slot;         /* cluster: K's hash slot; -1 otherwise */
    const char *mk;   /* cluster: the slot's marker key; NULL otherwise */
    size_t mk_len;
    char *wh;         /* cluster: the head waiter's wake list, or NULL */
    size_t wh_len;
    bool renew_v;     /* the renew script also declares V (an election
                         term's renewal keeps its value key alive) */
    char *heap;       /* when the names do not fit in buf */
    char buf[1536];
};

cerb_status cerb__redis_keys_init(struct redis_keys *ks, cerb_engine *e, const char *name,
                                  const char *token);
/* The same from parts: prefix (NULL = ""), and the slot map's tags in
 * cluster mode (cl; NULL otherwise). */
struct redis_cluster;
cerb_status cerb__redis_keys_build(struct redis_keys *ks, const char *prefix, const char *name,
                                   const char *token, const struct redis_cluster *cl);
void cerb__redis_keys_free(struct redis_keys *ks);

/* SCRIPT LOAD every script on c and remember the SHAs (open()). */
cerb_status cerb__redis_scripts_load(cerb_engine *e, struct redis_conn *c);

/* What one run of the acquire script said. */
struct redis_acquire_result {
    bool granted;
    uint64_t fence;  /* granted */
    int64_t pttl;    /* not granted: the holder's remaining lease, -1 = none */
    bool head;       /* not granted, queued: we are the live head */
    bool handed;     /* not granted: this run handed the lock to the head */
    bool quarantine; /* not granted: no grants yet after a loss of data */
    int64_t closed_epoch; /* refused by the closure record: its epoch (the
                             run returned CERB_UNAVAILABLE), else 0 */
    char next[64];   /* cluster, queued: the waiter right behind us ("" =
                        none), whose wake list our release will name */
};

/*
 * Run the acquire script once on c. wait_ms > 0 joins (or refreshes) the
 * queue when the lock is busy. *sent_ns is the monotonic time before the
 * request left.
 */
cerb_status cerb__redis_run_acquire(cerb_engine *e, struct redis_conn *c,
                                    struct redis_keys *ks, const cerb_engine_lock *lk,
                                    int64_t wait_ms, struct redis_acquire_result *res,
                                    int64_t *sent_ns, cerb_outcome *outcome);

/* Release codes of the release script. */
enum {
    REDIS_REL_NOT_OWNER = 0,
    REDIS_REL_FREED = 1,
    REDIS_REL_HANDED = 2,  /* given to the head waiter (fair) */
    REDIS_REL_WOKE = 3     /* freed, head waiter told to try (not fair) */
};

/* Run the release script on c; leave = 1 also takes lk's token out of the
 * queue and drops its wake list first (a waiter giving up). */
cerb_status cerb__redis_run_release(cerb_engine *e, struct redis_conn *c,
                                    struct redis_keys *ks, const cerb_engine_lock *lk,
                                    int leave, int *code, cerb_outcome *outcome);

/* Leave the queue on a pool connection (best effort after a failure).
 * CERB_OK when the server confirmed. */
cerb_status cerb__redis_leave(cerb_engine *e, struct redis_keys *ks,
                              const cerb_engine_lock *lk);

/*
 * Run script id once on c with the keys and (binary) arguments given, the
 * marker key among the keys where the script wants it; reloads the script
 * after NOSCRIPT and runs it again, once. On success *out is a reply that
 * is not an error (the caller frees it); otherwise *oc says whether the
 * script may have run. At most 9 keys, and 16 keys and arguments together.
 */
cerb_status cerb__redis_eval_argv(cerb_engine *e, struct redis_conn *c, enum redis_script id,
                                  int nkeys, const char *const *keys, const size_t *klen,
                                  int nargs, const char *const *args, const size_t *alen,
                                  redisReply **out, cerb_outcome *oc);

/* ---- engine operations (see engine.h for their contracts) ---- */

cerb_status cerb__redis_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__redis_op_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n);
cerb_status cerb__redis_op_release(cerb_engine *e, cerb_engine_lock *lk);

/*
 * redis.min_replicas_ack = n > 0 (redis_wait.c): make lk's grant count only
 * once n replicas have it (an extending acquire run and WAIT on one
 * connection, bounded by the operation timeout and deadline_ns, 0 = none);
 * otherwise release it and answer an error with outcome NO.
 */
cerb_status cerb__redis_confirm_replicas(cerb_engine *e, struct redis_keys *ks,
                                         cerb_engine_lock *lk, cerb_grant *g, int64_t deadline_ns);
cerb_status cerb__redis_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__redis_op_held(cerb_engine *e, const char *name);
cerb_status cerb__redis_op_probe(cerb_engine *e, int64_t timeout_ms);
/* redis_inspect.c: who holds a name and who waits (one MULTI, read-only). */
cerb_status cerb__redis_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

/* redis_election.c: an election term's value and who leads (engine.h,
 * struct cerb_election_methods), and the table the ops table points to. */
cerb_status cerb__redis_op_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                    size_t n, cerb_outcome *outcome);
cerb_status cerb__redis_op_leader(cerb_engine *e, const char *name, int variant,
                                  cerb_leader_rec *out);
extern const struct cerb_election_methods cerb__redis_election;

/* redis_semaphore.c, redis_rwlock.c: the Lua texts (loaded with the rest
 * at open) and the tables the ops table points to (redis_queue.h). */
extern const char cerb__redis_lua_sem_acquire[], cerb__redis_lua_sem_release[],
    cerb__redis_lua_sem_renew[], cerb__redis_lua_sem_check[], cerb__redis_lua_sem_held[],
    cerb__redis_lua_sem_inspect[];
extern const char cerb__redis_lua_rw_acquire[], cerb__redis_lua_rw_release[],
    cerb__redis_lua_rw_renew[], cerb__redis_lua_rw_check[], cerb__redis_lua_rw_held[],
    cerb__redis_lua_rw_inspect[];
extern const struct cerb_queue_methods cerb__redis_semaphore, cerb__redis_rwlock;

/* redis_wait.c */
/* A waiter's blocking socket, registered in lk->priv so that cancel() can
 * shut it down; unregister answers whether cancel() hit it. */
void cerb__redis_wait_register(cerb_engine *e, cerb_engine_lock *lk, const struct redis_conn *bc);
bool cerb__redis_wait_unregister(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__redis_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                   const atomic_int *interrupted, cerb_grant *grant);
void cerb__redis_op_cancel(cerb_engine *e, cerb_engine_lock *lk);

#endif
