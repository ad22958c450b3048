/*
 * zk_session.h — the ZooKeeper engine instance, its session, and the
 * per-hold state.
 *
 * One engine instance (one client) has one ZooKeeper session at a time,
 * shared by all its locks: every lock node is an ephemeral of that session,
 * so the session's life is every hold's life. A keeper thread per instance
 * watches over it (zk_session.c): it turns the C client's connection events
 * into SUSPECT / VALID / LOST events for the core, sends a cheap round trip
 * every sixth of the session timeout (the send time of the last answered
 * request is what renew() reports), re-checks held nodes after a reconnect,
 * replaces a session that expired or stayed disconnected past its timeout,
 * and finishes deletions that could not be done in time (zk_cleanup.c).
 *
 * Locking. `zh_lock` (a read-write lock) keeps the current handle open while
 * a thread submits requests on it (read side; zoo_a* calls never block on
 * the network); the keeper takes the write side only to unhook a session
 * before closing it. `mu` guards the session state, the lists of waiting
 * and held locks, and the keeper's work flags. Order: zh_lock before mu.
 * Completions and watchers run on the C client's threads and only ever take
 * `mu` or a call's own mutex, never zh_lock, and never block.
 */
#ifndef CERB_ZK_SESSION_H
#define CERB_ZK_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <zookeeper/zookeeper.h>

#include "config.h"
#include "engine.h"
#include "sync.h"
#include "zk_closure.h"
#include "zk_fence.h"
#include "zk_layout.h"

/* A blocked waiter looks at its interrupt flag at least this often. */
#define ZK_INTR_SLICE_MS 100

/*
 * Heartbeats per session timeout. The send time of the last answered
 * request bounds when the server may expire the session (never before it
 * plus the timeout), so it is what renew() reports and what the keeper
 * gives a disconnected session up by. A sixth rather than the client's own
 * third keeps that bound fresh enough that a disconnection noticed by the
 * client (after 2/3 of the timeout without data) still leaves time to
 * reconnect before we give up: a short outage is SUSPECT, then VALID, not
 * LOST. It costs one exists request per sixth of the timeout per client.
 * Held locks with a short lease shorten it to a sixth of the shortest
 * lease (not below ZK_HEARTBEAT_MIN_MS): the core schedules a hold's next
 * renewal a third of its lease after the send time renew() reports, and
 * that must lie in the future.
 */
#define ZK_HEARTBEATS 6
#define ZK_HEARTBEAT_MIN_MS 50

/* Fraction of the session timeout (per mille) after the last answered
 * request at which a session that has not reconnected counts as lost; the
 * same drift the core allows on leases (core/internal.h). */
#define ZK_DRIFT_PERMILLE 10

struct zk_session {
    zhandle_t *zh;
    /* Slots sent and not yet completed (zk_call.c): zookeeper_close() may
     * drop their completions (ZOOKEEPER-2894), so session_close finishes
     * what is left once the client's threads are gone. */
    cerb_mutex out_mu;
    struct zk_res *outstanding;
    cerb_engine *e;
    uint64_t gen;                 /* 1, 2, ... per engine instance */
    _Atomic int64_t last_ok_ns;   /* send time of the latest answered batch */
    int64_t created_ns;           /* when zookeeper_init was called */
    /* under e->mu */
    bool connected;
    bool ever_connected;
    bool dead;                    /* expired / auth failed / given up */
    int64_t id;                   /* session id once connected */
    int64_t timeout_ms;           /* negotiated session timeout */
};

enum zk_list { ZK_LIST_NONE, ZK_LIST_WAITING, ZK_LIST_HELD };

/* A waiter's state, allocated only while its acquire() runs (mu). */
struct zk_wait {
    cerb_cond cond;   /* the waiter sleeps here */
    char *watch;      /* the predecessor's path (watches set) */
    bool data_armed;  /* its data watch is set and has not fired */
    bool child_armed; /* its child watch is set and has not fired */
    bool pred_ours;   /* its data said ZK_DATA_WAITING: one of ours */
    bool pred_holds;  /* it said (or changed to) ZK_DATA_HOLDING */
    bool woken;       /* an event the waiter must look at */
    int pred_event;   /* its type */
    bool cancelled;   /* cancel() was called */
};

/*
 * Per-hold state (ops->lock_priv_size), zeroed by the core before each
 * acquisition; kept small, since a client may hold many locks. Heap memory
 * hangs off it only while an acquire() runs (w) or a hold is granted
 * (node); release(), a failed acquire() and a NOT_OWNER check_owner() free
 * it.
 */
struct zk_lock_priv {
    struct zk_lock_priv *next, *prev;  /* e->waiting or e->held (mu) */
    enum zk_list list;                 /* mu */
    bool gone;        /* the node is known gone (mu) */
    bool reaped;      /* its deletion was handed to the keeper */
    cerb_engine_lock *lk;
    char *node;       /* our node's full path, NULL when not known (written
                         under mu: the watch callbacks read it) */
    uint64_t gen;     /* session generation that owns `node` */
    uint64_t czxid;   /* our node's; the fence is czxid + offset */
    uint64_t offset;  /* the fence offset our create checked (zk_fence.h) */
    uint64_t acq_id;  /* this acquisition, for the callbacks */
    struct zk_wait *w;                 /* mu */
    bool mark_pending;  /* its ZK_DATA_HOLDING mark is to be sent again (mu) */
    unsigned char mark_tries;          /* marks sent again (mu) */
    char uuid[ZK_UUID_LEN + 1];        /* this acquisition's node uuid */
    /* A semaphore's acquisition (zk_semaphore.c): the hold of its locks/
     * mutex while it is being taken, so that cancel() wakes it (mu). */
    struct zk_lock_priv *inner;
};

/* A deletion the keeper finishes (zk_cleanup.c). */
struct zk_reap {
    struct zk_reap *next;
    int refusals;                 /* times the server refused it */
    char *parent;
    char *node;                   /* NULL: find it by uuid and session */
    char uuid[ZK_UUID_LEN + 1];
};

struct zk_counters {
    atomic_uint_fast64_t acquire_calls; /* create requests */
    atomic_uint_fast64_t wakeups;       /* predecessor deletions that woke a waiter */
    atomic_uint_fast64_t notices;       /* other watch events (grants told) */
    atomic_uint_fast64_t announces;     /* grants marked on our node */
    atomic_uint_fast64_t mark_failures; /* marks refused or not answered OK */
    atomic_uint_fast64_t mark_retries;  /* marks sent again by the keeper */
    atomic_uint_fast64_t quick_grants;  /* grants without listing again */
    atomic_uint_fast64_t acq_ids;
    atomic_uint_fast64_t relists;       /* getChildren after the first */
    atomic_uint_fast64_t grants;
    atomic_uint_fast64_t adoptions;     /* nodes found again after a lost reply */
    atomic_uint_fast64_t reaped;        /* deletions finished by the keeper */
    atomic_uint_fast64_t sessions;      /* sessions made */
};

#define ZK_COUNT(e, f) atomic_fetch_add_explicit(&(e)->stats.f, 1, memory_order_relaxed)

struct cerb_engine {
    const struct cerb_config *cfg;
    const struct cerb_zk_config *zc;
    cerb_engine_env env;
    const char *hosts;          /* zc->hosts, for messages */
    char *auth;                 /* "user:password", NULL without auth */
    /* ACLs: open, or (with auth) creator-all + world-read */
    struct ACL acl_entries[2];
    struct ACL_vector acl;

    pthread_rwlock_t zh_lock;
    struct zk_session *cur;     /* written under zh_lock (write) and mu */

    cerb_mutex mu;
    cerb_cond state_cond;       /* any session state change */
    uint64_t gen_counter;
    struct zk_lock_priv *waiting, *held;
    struct zk_reap *reap;

    /* keeper thread */
    pthread_t keeper;
    bool keeper_started, stop;
    cerb_cond keeper_cond;
    unsigned pend;              /* ZK_PEND_* work flags */
    bool suspect_told;          /* SUSPECT sent, VALID not yet (keeper only) */
    int64_t next_hb_ns;
    int64_t start_at_ns;        /* ZK_PEND_START: when to make a session */
    int64_t backoff_ms;         /* between sessions that did not connect */

    struct zk_counters stats;
    struct zk_fence fence;      /* the fence offset (zk_fence.c; under mu) */
    struct zk_closure closure;  /* the switch closure record (zk_closure.c;
                                   under mu) */
    struct zk_guard *guard;     /* the guard's records (zk_guard.c) */
    struct zk_guard_pool *gpool; /* the guard's sessions (zk_guard_pool.c) */
    /* The longest session timeout any of our sessions negotiated: how long
     * a node of ours can outlive our last contact (hold_bound_ms). */
    _Atomic int64_t max_timeout_ms;
};

/* Keeper work flags (e->pend). */
enum {
    ZK_PEND_DISCONNECTED = 1u << 0,
    ZK_PEND_CONNECTED = 1u << 1,
    ZK_PEND_REPLACE = 1u << 2,   /* the session is dead: end it, start anew */
    ZK_PEND_REAP = 1u << 3,      /* deletions are pending */
    ZK_PEND_START = 1u << 4,     /* no session: make one at start_at_ns */
    ZK_PEND_MARK = 1u << 5       /* holds whose mark must be sent again */
};

/* A session with `watcher` (its context: the session), connecting in the
 * background, authenticated when zk.user is set; gen is the caller's
 * (the keeper's generation; the guard's extra sessions: their slot).
 * Close with cerb__zk_session_close, never from its own threads. */
cerb_status cerb__zk_session_open(cerb_engine *e, uint64_t gen, watcher_fn watcher,
                                  struct zk_session **out);
/* Close the handle, then finish its requests still unanswered (ZCLOSING). */
void cerb__zk_session_close(struct zk_session *s);

/* Make the first session and the keeper; wait for the connection until
 * zk.connect_timeout_ms. CERB_EIO naming the hosts when none came. */
cerb_status cerb__zk_session_start(cerb_engine *e);
/* Stop the keeper, close the session (its ephemerals go at once). */
void cerb__zk_session_stop(cerb_engine *e);

/*
 * Submitting. begin() takes zh_lock for reading and returns the current
 * session (NULL while none); end() releases it. Between them, zoo_a* calls
 * on s->zh are safe. Do not wait for anything in between.
 */
struct zk_session *cerb__zk_session_begin(cerb_engine *e);
void cerb__zk_session_end(cerb_engine *e);

/* A snapshot of the session, taken under mu. */
struct zk_state {
    uint64_t gen;
    int64_t id;
    bool connected;
    bool dead;
    int64_t timeout_ms;
    int64_t last_ok_ns;
};
void cerb__zk_state_locked(cerb_engine *e, struct zk_state *out);
void cerb__zk_state(cerb_engine *e, struct zk_state *out);

/*
 * Wait until the current session is connected, the deadline passes
 * (CERB_EIO, "not connected"), or *intr becomes non-zero (CERB_INTERRUPTED;
 * intr may be NULL). With want_gen != 0, also stop when the session is no
 * longer generation want_gen (CERB_NOT_OWNER: it was lost). Fills *st.
 */
cerb_status cerb__zk_wait_connected(cerb_engine *e, int64_t deadline_ns, const atomic_int *intr,
                                    uint64_t want_gen, struct zk_state *st);

/* Wake every blocked waiter (mu held): the session changed. */
void cerb__zk_wake_waiters_locked(cerb_engine *e);

/* Ask the keeper to do work (mu held). */
void cerb__zk_keeper_poke_locked(cerb_engine *e, unsigned pend);

/*
 * How long to wait for a call's completions: until `bound_ns`, the bound of
 * the operation that sent it (the caller's deadline, or the connect timeout
 * for a call without one; 0 = none), capped by a guard. Completions come at
 * the latest when the C client gives the connection up (2/3 of the session
 * timeout) or when the keeper closes the handle — on a stopped server, far
 * later than a caller's deadline, which is why lock operations pass theirs;
 * the guard only protects against a bug.
 */
int64_t cerb__zk_call_deadline(cerb_engine *e, int64_t bound_ns);

/* ops->hold_bound_ms: the negotiated session timeout (the longest of
 * this instance's sessions), 0 before the first connection. */
int64_t cerb__zk_op_hold_bound(cerb_engine *e);

/* zk_log.c: route the C client's log lines into the library's log. */
void cerb__zk_log_setup(void);
void cerb__zk_log_line(const char *message);

#endif
