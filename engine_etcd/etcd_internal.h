/*
 * etcd_internal.h — the etcd engine instance and what its files share.
 *
 * One instance (one per client) has:
 *  - the gateway client (etcd_http.c): endpoints, pooled curl handles, token;
 *  - one session (etcd_lease.c): a lease with a client-chosen ID, kept alive
 *    by a background thread every TTL/3, replaced by a new one when it is
 *    lost; every lock key of the instance is attached to it;
 *  - orphans: keys of ours that a failed request could not delete, which
 *    the session thread deletes later, so that a key never outlives its
 *    purpose while the session keeps it alive (etcd_mutex.c);
 *  - counters for the bench and the tests.
 *  - the fence offset every grant adds to its key's create revision
 *    (etcd_fence.c), cached;
 *  - the switch closure record the acquire txn compares (etcd_closure.c),
 *    cached;
 * Per hold, lk->priv is a struct etcd_lock_priv: which lease the key was put
 * with, its create revision and the fence offset it was put with (their
 * sum is the fencing token). The key itself is
 * rebuilt from the prefix, the name and the lease when needed, so a hold
 * costs a few dozen bytes.
 */
#ifndef CERB_ETCD_INTERNAL_H
#define CERB_ETCD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "error.h"
#include "etcd_http.h"
#include "sync.h"

/* How often a blocked waiter looks at its flags (interrupt, deadline,
 * session) when nothing arrives; cancel() wakes it at once anyway. */
#define ETCD_SLICE_MS 100
/* A waiter re-reads its queue position this often even without events,
 * in case its watch went quiet on a server that stopped answering. */
#define ETCD_RECHECK_MS 5000
/* A waiter tolerates failures (an election, an endpoint going away) this
 * long in a row before it gives up, at least. */
#define ETCD_ERR_BUDGET_MS 2000

struct etcd_counters {
    atomic_uint_fast64_t acquire_calls; /* txns that put (or re-put) a key */
    atomic_uint_fast64_t wakeups;       /* watch DELETE events that woke a waiter */
    atomic_uint_fast64_t requests;      /* HTTP attempts */
    atomic_uint_fast64_t rotations;     /* endpoint changes */
    atomic_uint_fast64_t reauths;       /* tokens fetched */
    atomic_uint_fast64_t keepalives;    /* keepalive requests that succeeded */
    atomic_uint_fast64_t sessions;      /* leases granted */
    atomic_uint_fast64_t watches;       /* watch streams opened */
    atomic_uint_fast64_t watch_checks;  /* reads after a watch came up late */
    atomic_uint_fast64_t orphans;       /* keys handed to the session thread */
};

#define ETCD_COUNT(e, f) atomic_fetch_add_explicit(&(e)->stats.f, 1, memory_order_relaxed)

/* The session as the rest of the engine sees it (a copy, under sess_mu). */
struct etcd_session {
    int64_t id;          /* lease ID; 0 = none */
    uint64_t gen;        /* bumped for every new lease */
    bool live;           /* granted and not known lost */
    bool suspect;        /* the last keepalive failed */
    int64_t ok_sent_ns;  /* send time of the last grant/keepalive that succeeded */
};

/* A key to delete that an operation could not delete itself. */
struct etcd_orphan {
    struct etcd_orphan *next;
    char *key;
    size_t key_len;
    int64_t rev;   /* delete only while create_revision == rev; 0 = the one
                      it has when the delete is sent (read first) */
    bool busy;     /* the session thread is deleting it right now */
};

/*
 * Which lock keys of this instance are in use, and by which hold. A key
 * names the session and the lock, not the acquisition, so two holds of the
 * same name in one client (a current one, and an old one whose acquire
 * failed and which the core releases later in the background) would share
 * it: before touching a key, an operation claims it here. A permanent claim
 * is a hold or an acquire in progress; a temporary one a release, check or
 * clean-up of a hold that is not (or no longer) the key's user, which others
 * wait for. The node lives in the hold's priv: no allocation.
 */
struct etcd_reg {
    struct etcd_reg *next;
    const cerb_engine_lock *lk;
    int64_t lease;
    uint64_t hash;
    bool temp;
    bool linked;
};

#define ETCD_REG_BUCKETS 1024

/*
 * The fence offset (etcd_fence.c): the key that holds it and what this
 * instance knows of it, under mu.
 */
struct etcd_fence {
    cerb_mutex mu;
    char *key;         /* <prefix>__cerberus_fence__ */
    size_t key_len;
    bool known;        /* read (or written) at least once */
    int64_t offset;    /* its value as last seen; 0 = absent */
    int64_t mod;       /* its mod_revision; 0 = absent */
    int64_t as_of;     /* the revision at which that was so */
    int64_t max_seen;  /* the highest offset ever seen: never use less */
};

/* An offset and the mod_revision of the key that held it (0 = absent), as
 * one txn compares and uses them. */
struct etcd_fence_view {
    int64_t offset;
    int64_t mod;
};

/* A closure record and the mod_revision of its key (0 = absent: epoch 0),
 * as one txn compares and judges them (etcd_closure.c). */
struct etcd_closure_view {
    int64_t mod;
    cerb_closure rec;
};

/* The closure record's key and what this instance last saw of it, under
 * mu; never read yet = absent, which the first compare corrects. */
struct etcd_closure {
    cerb_mutex mu;
    char *key;         /* <prefix>__cerberus_closure__ */
    size_t key_len;
    struct etcd_closure_view view;
    int64_t as_of;     /* the revision at which view was so */
};

struct cerb_engine {
    const struct cerb_config *cfg;
    const struct cerb_etcd_config *ec;
    cerb_engine_env env;
    struct etcd_http http;

    /* session (etcd_lease.c), under sess_mu */
    cerb_mutex sess_mu;
    cerb_cond sess_cond;      /* session changed; a claim or orphan freed */
    cerb_cond ka_cond;        /* the thread: kicked, orphans, stop */
    int claim_waiters;        /* threads waiting in cerb__etcd_claim */
    struct etcd_session sess;
    int64_t ttl_s;            /* asked for; what the keepalive paces by */
    _Atomic int64_t granted_ttl_s; /* the longest TTL the server granted or
                                      renewed a lease of ours to */
    bool ka_stop, ka_kick, ka_started;
    pthread_t ka_thread;
    atomic_int ka_abort;      /* stops the thread's request in flight */
    int64_t revoke_id;        /* a lost lease to revoke when possible */
    char grant_err[CERB_ERROR_MAX]; /* why the last grant failed */
    struct etcd_orphan *orphans;
    struct etcd_reg *reg[ETCD_REG_BUCKETS]; /* claimed keys, under sess_mu */

    struct etcd_fence fence;  /* the fence offset (etcd_fence.c) */
    struct etcd_closure closure; /* the switch closure record (etcd_closure.c) */
    struct etcd_guard *guard; /* the guard's shared leases (etcd_guard.c) */
    cerb_mutex wait_mu;       /* etcd_lock_priv waiting fields (cancel) */
    struct etcd_counters stats;
};

/* Per hold (ops->lock_priv_size), zeroed by the core before acquire. */
struct etcd_lock_priv {
    int64_t lease;   /* lease the key was put with; 0 = none yet */
    uint64_t gen;    /* session generation of that lease */
    int64_t rev;     /* our key's create revision; 0 = unknown */
    int64_t off;     /* the fence offset it was put with: fence = rev + off */
    /* under e->wait_mu: */
    void *multi;     /* the CURLM of the watch we block in, or NULL */
    bool cancelled;  /* cancel() came: look at the flags */
    /* under e->sess_mu: */
    struct etcd_reg reg;
    /* queued primitives (etcd_queue.c): the member key is the token-named
     * one, not <name>/<lease hex> (a semaphore member whose session has
     * another member of the name already; every read-write lock member) */
    bool alt;
};

/* A lock key: <prefix><name>/<lease hex>, and its name prefix's range. */
struct etcd_key {
    char *k;         /* the key */
    size_t len;
    size_t pfx_len;  /* <prefix><name>/ is k[0 .. pfx_len) */
    char *end;       /* range end of that prefix (same length) */
    char buf[384];
    char *heap;
};
cerb_status cerb__etcd_key_init(struct etcd_key *k, const char *prefix, const char *name,
                                int64_t lease);
void cerb__etcd_key_free(struct etcd_key *k);

/* ---- etcd_lease.c ---- */

/* Set up the session's lock and state (no network). */
void cerb__etcd_session_init(cerb_engine *e);
/* Grant the first lease by deadline_ns and start the keepalive thread. */
cerb_status cerb__etcd_session_start(cerb_engine *e, int64_t deadline_ns);
/* Stop the thread, revoke the lease (bounded by the operation timeout). */
void cerb__etcd_session_stop(cerb_engine *e);
/* A copy of a live session, waiting for one until deadline_ns. */
cerb_status cerb__etcd_session_get(cerb_engine *e, int64_t deadline_ns, struct etcd_session *out);
/* A copy of the session as it is (live or not). */
void cerb__etcd_session_peek(cerb_engine *e, struct etcd_session *out);
/* ops->hold_bound_ms: the longest TTL granted to a lease of ours, in ms. */
int64_t cerb__etcd_hold_bound(cerb_engine *e);
/* The server said the lease of generation `gen` is not found: check now. */
void cerb__etcd_session_doubt(cerb_engine *e, uint64_t gen);
/* Hand a key to the thread for deletion (orphan). */
void cerb__etcd_orphan_add(cerb_engine *e, const char *key, size_t len, int64_t rev);
/*
 * Claim key k (of lk, put with `lease`) for lk: wait (until deadline) while
 * another temporary claim or the thread's deletion of it is in progress,
 * drop its orphan entry (*orphaned says there was one: the key may exist),
 * and register lk. CERB_BUSY when another hold of this instance has it
 * (permanent claim): then lk is a stale hold and must leave the key alone.
 */
cerb_status cerb__etcd_claim(cerb_engine *e, cerb_engine_lock *lk, const struct etcd_key *k,
                             int64_t lease, bool temp, int64_t deadline_ns, bool *orphaned);
/* Make lk's temporary claim permanent (it turned out to be the holder). */
void cerb__etcd_claim_keep(cerb_engine *e, cerb_engine_lock *lk);
/* Give lk's claim up (no-op when it has none). */
void cerb__etcd_unclaim(cerb_engine *e, cerb_engine_lock *lk);
/* Does lk hold a permanent claim on its key? */
bool cerb__etcd_claimed(cerb_engine *e, cerb_engine_lock *lk);

/* ---- etcd_mutex.c ---- */

cerb_status cerb__etcd_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                  const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__etcd_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__etcd_op_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__etcd_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
void cerb__etcd_op_cancel(cerb_engine *e, cerb_engine_lock *lk);
/* The same acquire and check_owner in the election layout (etcd_election.c):
 * the key's value is lk->value, and the fence offset comes from the offset
 * key as of the key's create revision (cerb__etcd_fence_at). */
cerb_status cerb__etcd_elect_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                     const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__etcd_elect_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);

/* Pieces of the mutex that the queued primitives share (etcd_queue.c):
 * one txn, run and parsed (as etcd_mutex.c's run_txn, no abort flag);
 * delete a key of ours at create revision rev (0: read it first) within
 * an operation timeout, else hand it to the session thread (keeps the
 * caller's last error); a grant as the session vouches for it (false when
 * the session is about to be given up); wait a little for a new session;
 * nap in slices that look at the interrupt flag and the deadline. */
cerb_status cerb__etcd_run_txn(cerb_engine *e, const char *what, json_t *req, size_t want,
                               int64_t deadline_ns, struct etcd_call *call, bool *succeeded,
                               int64_t *rev, const json_t **responses);
void cerb__etcd_drop_key(cerb_engine *e, const char *key, size_t len, int64_t rev);
bool cerb__etcd_grant_fill(cerb_engine *e, const struct etcd_session *s, int64_t fence,
                           cerb_grant *g);
void cerb__etcd_await_session(cerb_engine *e, uint64_t gen, int64_t deadline_ns);
void cerb__etcd_nap(int64_t ms, int64_t deadline_ns, const atomic_int *intr);

/* ---- etcd_queue.c, etcd_semaphore.c, etcd_rwlock.c ---- */

/* ops->semaphore: ranked lease keys under <prefix><name>/ (etcdctl lock's
 * layout for one permit), the limit in <prefix><name>.limit. */
extern const struct cerb_queue_methods cerb__etcd_semaphore;
/* ops->rwlock: the etcd recipe's read/ and write/ keys under
 * <prefix>/rwlock/<name>/. */
extern const struct cerb_queue_methods cerb__etcd_rwlock;

/* ---- etcd_election.c ---- */

/* Put key = value (n bytes) with `lease` if its create revision is still
 * rev (one txn, idempotent, re-sent until definite or deadline_ns): *put
 * says whether it was. An error with *outcome otherwise. */
cerb_status cerb__etcd_put_at_rev(cerb_engine *e, const char *key, size_t len, int64_t rev,
                                  int64_t lease, const void *value, size_t n,
                                  int64_t deadline_ns, bool *put, cerb_outcome *outcome);
/* ops->election: etcd's concurrency.Election layout (`etcdctl elect`). */
extern const struct cerb_election_methods cerb__etcd_election;
/* Delete key if its create revision is rev (rev 0: the one it has now, read
 * first; never unconditionally, etcd_mutex.c says why), re-sent until
 * definite or deadline. CERB_OK (gone, or not ours to delete; *deleted,
 * which may be NULL, says whether this call deleted it) or the error. */
cerb_status cerb__etcd_delete_key(cerb_engine *e, const char *key, size_t len, int64_t rev,
                                  int64_t deadline_ns, const atomic_int *abort, bool *deleted);

/* ---- etcd_fence.c ---- */

/* Build the offset key's name (no network); destroy frees it (no-op when
 * init was never called). */
cerb_status cerb__etcd_fence_init(cerb_engine *e);
void cerb__etcd_fence_destroy(cerb_engine *e);
/*
 * The offset an acquire txn is to compare and use, in *v: never below the
 * highest this instance has seen, and with floor > 0 large enough that a
 * key put after this call gets a fence above floor — raised on the server
 * (a read and a txn) when needed. Bounded by deadline_ns.
 */
cerb_status cerb__etcd_fence_prepare(cerb_engine *e, uint64_t floor, int64_t deadline_ns,
                                     struct etcd_fence_view *v);
/* The Compare that holds while the offset key is still as v says. */
json_t *cerb__etcd_fence_cmp(cerb_engine *e, const struct etcd_fence_view *v);
/* A txn op reading the offset key (for a failure branch). */
json_t *cerb__etcd_fence_op_read(cerb_engine *e);
/* Learn the offset key from `range` (a RangeResponse read at revision rev;
 * NULL is a protocol error); *changed when it is not as v says. */
cerb_status cerb__etcd_fence_learn(cerb_engine *e, const json_t *range, int64_t rev,
                                   const struct etcd_fence_view *v, bool *changed);
/*
 * The offset in force at revision `rev` (a key put at rev by an acquire
 * txn, which compared the offset key's mod revision: that key's value then
 * was the offset used), for keys whose value is not the offset (the
 * election layout). `range` is a read of the offset key at a revision
 * >= rev (NULL: read it now): when the key was last changed before rev,
 * its value then is its value now; else (or when it is absent now but this
 * instance saw an offset once: someone deleted it) it is read as of rev.
 * An error (a compacted revision, the server) when that cannot be known:
 * never a guess, so never a wrong fence. Bounded by deadline_ns.
 */
cerb_status cerb__etcd_fence_at(cerb_engine *e, int64_t rev, const json_t *range,
                                int64_t deadline_ns, int64_t *off);
/* The decimal text of off into buf (n bytes); its length, 0 if too small. */
size_t cerb__etcd_fence_format(int64_t off, char *buf, size_t n);

/* ---- etcd_closure.c: the switch closure record (ops version 4) ---- */

/* Build the record key's name (no network); destroy frees it (no-op when
 * init was never called). */
cerb_status cerb__etcd_closure_init(cerb_engine *e);
void cerb__etcd_closure_destroy(cerb_engine *e);
/* ops->closure_get and ops->closure_put (core/engine.h, version 4). */
cerb_status cerb__etcd_op_closure_get(cerb_engine *e, cerb_closure *out);
cerb_status cerb__etcd_op_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now);
/* The cached record and its mod revision (no I/O). */
void cerb__etcd_closure_view(cerb_engine *e, struct etcd_closure_view *v);
/* A linearizable read of the record into the cache and *v, by deadline_ns.
 * CERB_EPROTO when the key holds no record. */
cerb_status cerb__etcd_closure_read(cerb_engine *e, int64_t deadline_ns,
                                    struct etcd_closure_view *v);
/* Does rec refuse a client at `epoch` (-1: never)? */
bool cerb__etcd_closure_refuses(const cerb_closure *rec, int64_t epoch);
/* CERB_UNAVAILABLE with the message naming both epochs. */
cerb_status cerb__etcd_closure_refuse(cerb_engine *e, const cerb_closure *rec, int64_t epoch);
/* The Compare that holds while the record key is still as v says. */
json_t *cerb__etcd_closure_cmp(cerb_engine *e, const struct etcd_closure_view *v);
/* A txn op reading the record key (for a failure branch). */
json_t *cerb__etcd_closure_op_read(cerb_engine *e);
/* Learn the record from `range` (a RangeResponse read at revision rev;
 * NULL is a protocol error) into the cache and *v; *changed when its mod
 * revision is not the one v had. CERB_EPROTO for a value that is no
 * record. */
cerb_status cerb__etcd_closure_learn(cerb_engine *e, const json_t *range, int64_t rev,
                                     struct etcd_closure_view *v, bool *changed);

/* ---- etcd_guard.c: the idempotency guard's records (ops version 2) ---- */

struct etcd_guard;
/* Set up the guard's lease table (no network); destroy revokes the running
 * leases (bounded, best effort) and frees it (no-op when never set up). */
cerb_status cerb__etcd_guard_init(cerb_engine *e);
void cerb__etcd_guard_destroy(cerb_engine *e);
cerb_status cerb__etcd_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                   void **result, size_t *result_len);
cerb_status cerb__etcd_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g);
cerb_status cerb__etcd_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int succeeded,
                                    const void *result, size_t len, int64_t keep_ms,
                                    cerb_outcome *oc);
cerb_status cerb__etcd_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                   cerb_guard_found *found);

/* ---- etcd_engine.c ---- */

/* A linearizable read of one key under the prefix, by deadline_ns: the
 * server is up, has a leader and a quorum, and lets us read. */
cerb_status cerb__etcd_probe_read(cerb_engine *e, int64_t deadline_ns);

/* ---- etcd_watch.c ---- */


enum etcd_watch_end {
    ETCD_WATCH_DELETED,  /* the key was deleted */
    ETCD_WATCH_EXPIRED,  /* `until` came: look again */
    ETCD_WATCH_WAKE,     /* cancel(), the interrupt flag or a new session */
    ETCD_WATCH_RESTART   /* the server ended the watch (compaction, cancel):
                            read again */
};

/*
 * Block until `key` (seen with create revision key_rev in a read at
 * revision read_rev) is deleted, or `until_ns`, or a reason to look at the
 * flags (*interrupted, cancel() on lk, the session generation moving past
 * `gen`). One HTTP connection for the watch, driven by a curl multi handle
 * that cancel() can wake.
 * Returns: CERB_OK with *end, or an error (stream failed; rotate done).
 */
cerb_status cerb__etcd_watch_delete(cerb_engine *e, cerb_engine_lock *lk, const char *key,
                                    size_t len, int64_t key_rev, int64_t read_rev,
                                    int64_t until_ns, const atomic_int *interrupted,
                                    uint64_t gen, enum etcd_watch_end *end);

/*
 * A watch on a range (etcd_queue.c's semaphore waiter): the DELETEs of
 * any key in [key, end) are passed to deleted(), which says whether the
 * waiter's turn may have come (then the watch ends with
 * ETCD_WATCH_DELETED); gap() is called once when the watch came up after
 * the waiter's read (events between are not streamed): 1 the turn may
 * have come, 0 keep watching, -1 unknown (look again).
 */
struct etcd_watch_range {
    const char *end;
    size_t end_len;
    bool (*deleted)(void *ud, const char *key, size_t len);
    int (*gap)(void *ud);
    void *ud;
};
cerb_status cerb__etcd_watch_range(cerb_engine *e, cerb_engine_lock *lk, const char *key,
                                   size_t len, const struct etcd_watch_range *wr,
                                   int64_t read_rev, int64_t until_ns,
                                   const atomic_int *interrupted, uint64_t gen,
                                   enum etcd_watch_end *end);

/* ---- etcd_inspect.c ---- */

/* ops->inspect: who holds a name and who waits (a range read and the
 * holder's lease time to live). */
cerb_status cerb__etcd_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

#endif
