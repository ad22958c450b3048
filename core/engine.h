/*
 * engine.h — the contract between the core and the lock engines.
 *
 * An engine is a `const struct cerb_engine_ops` table, in the manner of
 * SQLite's VFS: `version` first, methods appended only, each new group behind
 * a version comment. The core never calls a method directly; it goes through
 * the shims in engine.c, which check the version and NULL slots and fall back
 * (no renew_batch → renew one by one; no cancel → the engine's own bounded
 * wake-ups notice the interrupt flag).
 *
 * Division of labour. The core owns everything that is the same for every
 * engine: name validation, per-thread reentrancy, the in-process wait queue
 * (only one thread per client and name calls acquire at a time), owner
 * tokens, renewal scheduling, lost detection and callbacks, ambiguity
 * re-checks, retries with jitter, fencing epochs. The engine owns the server
 * protocol: how a grant is made, how a waiter queues and is woken, how a
 * release hands over.
 *
 * Outcomes are three-valued. A method that returns an error also says in
 * `outcome` whether the request may have taken effect on the server
 * (CERB_OUTCOME_UNKNOWN: a timeout or connection loss after the request was
 * sent). The core then asks check_owner() — on a fresh connection — before
 * it retries or reports failure, so an acquire whose reply was lost is never
 * mistaken for "not acquired".
 *
 * Engines include this header and otherwise only error.h, alloc.h, clock.h,
 * sync.h and log.h from core, and config/config.h for their settings.
 */
#ifndef CERB_ENGINE_H
#define CERB_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

struct cerb_config;
struct cerb_holders;
struct cerb_election_methods;
struct cerb_queue_methods;

/* What a hold is for (cerb_engine_lock.prim): the mutex, or a primitive
 * whose engine methods are in a table of its own (§16). */
enum cerb_prim {
    CERB_PRIM_MUTEX = 0,
    CERB_PRIM_ELECTION = 1,
    CERB_PRIM_SEMAPHORE = 2, /* count permits of limit (ops->semaphore) */
    CERB_PRIM_RWLOCK = 3     /* variant enum cerb_rw_mode (ops->rwlock) */
};
#define CERB_PRIM_COUNT 4

/* A read-write lock hold's mode (cerb_engine_lock.variant). */
enum cerb_rw_mode { CERB_RW_READ = 1, CERB_RW_WRITE = 2 };

#define CERB_ENGINE_OPS_V1 1
#define CERB_ENGINE_OPS_V2 2 /* + the idempotency guard's records (§11) */
#define CERB_ENGINE_OPS_V3 3 /* + inspect: who holds a name (§13) */
#define CERB_ENGINE_OPS_V4 4 /* + switch closure records (§5) */
#define CERB_ENGINE_OPS_V5 5 /* + primitives: one method table pointer each (§16) */
#define CERB_ENGINE_OPS_VERSION CERB_ENGINE_OPS_V5

/* Capability bits in cerb_engine_ops.caps. */
enum {
    CERB_CAP_FENCING = 1u << 0,      /* grants carry a server-made counter */
    CERB_CAP_FAIR_QUEUE = 1u << 1,   /* server-side FIFO hand-off */
    CERB_CAP_WAIT = 1u << 2,         /* acquire can block for a release */
    CERB_CAP_BATCH_RENEW = 1u << 3,  /* renew_batch is cheaper than a loop */
    CERB_CAP_CROSS_PROCESS = 1u << 4, /* excludes other processes */
    CERB_CAP_FENCE_FLOOR = 1u << 5   /* honours cerb_engine_lock.fence_floor */
};

/* An engine instance; each engine defines the struct privately. */
typedef struct cerb_engine cerb_engine;

typedef enum cerb_outcome {
    CERB_OUTCOME_NO = 0,  /* the request certainly had no effect */
    CERB_OUTCOME_YES,     /* it took effect */
    CERB_OUTCOME_UNKNOWN  /* sent, no answer: may or may not have */
} cerb_outcome;

/*
 * One hold as the engine sees it. The core fills the first fields and keeps
 * the struct (and `priv`) alive from acquire until release returns, so an
 * engine can remember per-hold state there (a ZooKeeper node path, an etcd
 * key, a Redis waiter registration).
 */
typedef struct cerb_engine_lock {
    const char *name;   /* validated lock name, NUL-terminated */
    char token[33];     /* owner token: 32 lowercase hex chars */
    int64_t lease_ms;   /* requested lease (> 0) */
    int fair;           /* 1 = FIFO hand-off asked */
    void *priv;         /* ops->lock_priv_size bytes, zeroed before acquire */
    /*
     * With CERB_CAP_FENCE_FLOOR: the grant's fence must exceed this (< 2^48).
     * The engine raises its counter for the name (or an offset it adds to
     * it) on the server, atomically with respect to grants, so that the
     * grants after this one stay above it for every client. The core passes
     * the highest fence this client had on another engine, so that its
     * tokens do not go backwards when it switches, while the grants of one
     * engine stay ordered whoever made them. 0 (most calls): no floor.
     * check_owner reports the fence the grant got, floor included.
     */
    uint64_t fence_floor;
    /*
     * Version 4 (engines with closure records): the configuration epoch of
     * the client asking, or -1 for no check (probes, a client with one
     * engine). See "closure records" below for what acquire does with it.
     */
    int64_t epoch;
    /*
     * Version 5: what the hold is for (enum cerb_prim; 0, the mutex, for
     * every lock). CERB_PRIM_ELECTION: a term of a leader election, laid
     * out as `variant` says (enum cerb_election_layout) with `value` (the
     * candidate's proclamation, value_len bytes, owned by the core, alive
     * as long as the struct) where the layout keeps it; the shims send it
     * to the election table's acquire and check_owner when it has them.
     */
    int prim;
    int variant;
    const void *value;
    size_t value_len;
    /* CERB_PRIM_SEMAPHORE: the semaphore's limit (1..CERB_SEMAPHORE_MAX,
     * the caller's; the engine stores the first and refuses another) and
     * the permits this hold takes (1..limit). Else 0. */
    int64_t limit;
    unsigned count;
} cerb_engine_lock;

/*
 * What a grant or renewal established. The core derives the conservative
 * local deadline as sent_ns + ttl_ms × (1 − drift): `sent_ns` must be a
 * monotonic time taken *before* the request that set the lease was sent, so
 * that the server's lease cannot have started earlier.
 */
typedef struct cerb_grant {
    uint64_t fence;        /* engine counter (< 2^48) when CERB_CAP_FENCING */
    int64_t sent_ns;       /* cerb_monotime() before sending */
    int64_t ttl_ms;        /* validity from sent_ns; 0 = until session loss */
    cerb_outcome outcome;  /* on a failed call: NO or UNKNOWN */
    /* Version 4: acquire refused by the engine's closure record: that
     * record's epoch (> 0), else 0. */
    int64_t closed_epoch;
    /* The engine has no such primitive (a term on an engine without
     * elections: set by the shims; or in the mode it runs in: set by the
     * engine, with CERB_UNAVAILABLE), or refuses this hold for good (a
     * semaphore whose stored limit differs from the caller's: CERB_ECONFIG).
     * A final answer about the engine, not a failure of it: no breaker
     * counts it, no acquisition moves to another engine for it. */
    int no_prim;
} cerb_grant;

/*
 * A closure record (version 4, DESIGN.md §5): what `cerberus switch` (and
 * every client that follows the file to epoch `epoch`) wrote on an engine.
 * closed = 1: new acquisitions left it at that epoch; closed = 0: it is open
 * (active, or one of the candidates of active = "auto") from that epoch on.
 * epoch 0: no record.
 */
typedef struct cerb_closure {
    int64_t epoch;
    int closed;
} cerb_closure;

/* Events an engine reports asynchronously (session loss, expiry). */
typedef enum cerb_engine_event {
    CERB_EV_SUSPECT,   /* holds may be in doubt (disconnected) */
    CERB_EV_VALID,     /* doubt resolved in our favour (reconnected) */
    CERB_EV_LOST       /* holds are gone (session expired) */
} cerb_engine_event;

/*
 * Given to open(): the configuration (valid for the engine's whole life) and
 * a sink for asynchronous events. `token` NULL in an event means every hold
 * of this engine instance.
 */
typedef struct cerb_engine_env {
    const struct cerb_config *cfg;
    void (*event)(void *ud, cerb_engine_event ev, const char *name,
                  const char *token);
    void *ud;
} cerb_engine_env;

/* One item of a batched renewal: in lk/lease, out st/grant. */
typedef struct cerb_renew_item {
    cerb_engine_lock *lk;
    cerb_status st;     /* CERB_OK, CERB_NOT_OWNER (definitive), or error */
    cerb_grant grant;
} cerb_renew_item;

/* Protocol counters an engine may report (all since open). */
struct cerb_engine_stats {
    uint64_t acquire_calls; /* acquire requests sent to the server */
    uint64_t wakeups;       /* times a blocked waiter was woken */
    uint64_t handoffs;      /* grants made by a release to a waiter */
};

/*
 * One idempotency-guard record as the engine sees it (DESIGN.md §11). The
 * core fills it before begin and keeps it unchanged until the attempt is
 * freed. The record holds a state (running or done), the owner token of the
 * attempt that wrote it and, once done, the result bytes.
 */
typedef struct cerb_guard_rec {
    const char *scope;   /* validated scope (lock-name rules) */
    char id[65];         /* SHA-256 of app, scope and key: 64 lowercase hex */
    char token[33];      /* this attempt's owner token */
    int64_t running_ms;  /* the claim's length (> 0) */
} cerb_guard_rec;

/* What guard_check found (ambiguity re-checks). */
typedef enum cerb_guard_found {
    CERB_GUARD_FOUND_NONE = 0,   /* no record */
    CERB_GUARD_FOUND_RUNNING,    /* a claim of this token */
    CERB_GUARD_FOUND_DONE,       /* a done-record written by this token */
    CERB_GUARD_FOUND_OTHER       /* a record of another attempt */
} cerb_guard_found;

struct cerb_engine_ops {
    int version;       /* CERB_ENGINE_OPS_Vn this table was written for */
    const char *name;  /* "redis", "zk", "etcd", "local" */
    unsigned caps;     /* CERB_CAP_* */
    size_t lock_priv_size;

    /* ---- version 1 ---- */

    /* Connect within the configured connect timeout. */
    cerb_status (*open)(const cerb_engine_env *env, cerb_engine **out);
    /* Free everything; holds still on the server are left to expire. */
    void (*close)(cerb_engine *e);

    /*
     * Acquire lk. `deadline_ns` (monotonic) bounds the whole call; 0 means
     * one attempt without queuing (trylock). Until the deadline the engine
     * may queue on the server and block for a release. It returns:
     *   CERB_OK (grant filled), CERB_BUSY (deadline 0 and held elsewhere),
     *   CERB_TIMEOUT, CERB_INTERRUPTED (*interrupted became non-zero),
     *   or an error with grant->outcome saying whether it may have landed.
     * Before returning anything but CERB_OK it must leave no queue entry of
     * lk on the server (and pass on a lock that was handed to it meanwhile).
     * It must look at *interrupted at least every 200 ms while blocked.
     */
    cerb_status (*acquire)(cerb_engine *e, cerb_engine_lock *lk,
                           int64_t deadline_ns, const atomic_int *interrupted,
                           cerb_grant *grant);

    /* Extend lk to lk->lease_ms. CERB_NOT_OWNER when the server says it is
     * held by someone else or by nobody: definitive loss. */
    cerb_status (*renew)(cerb_engine *e, cerb_engine_lock *lk,
                         cerb_grant *grant);

    /* Release lk if and only if it is still ours (atomic compare on the
     * server). CERB_OK, CERB_NOT_OWNER, or an error (grant-less; the core
     * treats an error as "the lease will expire by itself"). */
    cerb_status (*release)(cerb_engine *e, cerb_engine_lock *lk);

    /* Is lk held by its token right now? CERB_OK (and fence in grant),
     * CERB_NOT_OWNER, or an error. Used to settle ambiguous outcomes, so
     * it must not reuse a connection whose last request timed out. */
    cerb_status (*check_owner)(cerb_engine *e, cerb_engine_lock *lk,
                               cerb_grant *grant);

    /* Optional: wake a thread blocked in acquire() for lk so that it looks
     * at its interrupt flag now. Must not block on the network for long. */
    void (*cancel)(cerb_engine *e, cerb_engine_lock *lk);

    /* Health probe on the lock path, bounded by timeout_ms. */
    cerb_status (*probe)(cerb_engine *e, int64_t timeout_ms);

    /* Optional: renew many holds in one round trip. */
    void (*renew_batch)(cerb_engine *e, cerb_renew_item *items, size_t n);

    /* Optional: protocol counters since open (for cerb_engine_info and the
     * bench). Must be cheap and safe from any thread. */
    void (*stats)(cerb_engine *e, struct cerb_engine_stats *out);

    /* Optional: is `name` held by anyone right now? CERB_OK when free,
     * CERB_BUSY when held (by anyone, us included), or an error. The safe
     * switch asks the engine it left before the new one grants a name. */
    cerb_status (*held)(cerb_engine *e, const char *name);

    /* Optional: refuse names this engine cannot represent (beyond the
     * core's 1–255 bytes without control characters), with the reason in
     * cerb_last_error(). Called without an engine instance. */
    cerb_status (*check_name)(const char *name);

    /* Optional (NULL: unknown): the longest a hold made by this instance
     * can stay on the server after the holder's last successful contact,
     * in ms; 0 when unknown. The safe-switch grace must cover it. For a
     * session-based engine it is what the server granted (ZooKeeper's
     * negotiated session timeout, etcd's lease TTL), not what was asked.
     * Not included: a leader change on a replicated server restarts its
     * count (ZooKeeper resets session expiry, etcd refreshes leases to TTL
     * plus an election timeout), so a hold whose holder went silent just
     * before an election can last up to about twice this plus the
     * election. Cheap, no I/O, safe from any thread. */
    int64_t (*hold_bound_ms)(cerb_engine *e);

    /* Optional (NULL: `caps`): this instance's capabilities, when its
     * configuration takes some away (redis redlock with redlock_fence =
     * "none" grants no fence: no CERB_CAP_FENCING, no FENCE_FLOOR). A
     * subset of `caps`. No I/O, safe from any thread. Added to the
     * version 5 table without a version bump (a NULL entry keeps the old
     * meaning). */
    unsigned (*instance_caps)(cerb_engine *e);

    /* ---- version 2: the idempotency guard (core/guard_engine.c) ----
     *
     * All optional as a group: an engine that leaves guard_begin NULL has
     * no guard, and the core answers CERB_UNAVAILABLE (then on_unavailable
     * decides). Each method is one atomic step on the server, and every
     * step but begin compares rec->token there first. Outcomes are
     * three-valued as for locks: an error says in `outcome` (or
     * grant->outcome) whether the request may have landed, and the core
     * settles an unknown one with guard_check before it retries.
     */

    /* Claim rec: create it as running with rec->token, expiring after
     * rec->running_ms, if no record exists. Returns CERB_OK (claimed — also
     * when the record is already this token's running claim, so a re-sent
     * begin is harmless; grant->sent_ns taken before sending, ttl_ms the
     * claim), CERB_BUSY (another attempt's claim), CERB_DUPLICATE (a
     * done-record: *result gets its bytes in cerb__malloc'd memory with a
     * NUL after them, *result_len their count; the core frees it), or an
     * error with grant->outcome. */
    cerb_status (*guard_begin)(cerb_engine *e, const cerb_guard_rec *rec,
                               cerb_grant *grant, void **result,
                               size_t *result_len);
    /* Extend rec's running claim to rec->running_ms if it is still this
     * token's and still running. CERB_OK, CERB_NOT_OWNER (gone, done or
     * another's: definitive), or an error. */
    cerb_status (*guard_renew)(cerb_engine *e, const cerb_guard_rec *rec,
                               cerb_grant *grant);
    /* If rec is this token's running claim: succeeded = 1 makes it a
     * done-record holding result (len bytes, binary) that expires after
     * keep_ms (-1: never); succeeded = 0 deletes it. CERB_OK (also when it
     * is already this token's done-record: a re-sent finish), CERB_NOT_OWNER
     * (no record, or another's: nothing changed), or an error with
     * *outcome. */
    cerb_status (*guard_finish)(cerb_engine *e, const cerb_guard_rec *rec,
                                int succeeded, const void *result, size_t len,
                                int64_t keep_ms, cerb_outcome *outcome);
    /* What is stored for rec now, judged by rec->token. CERB_OK with *found
     * set, or an error. Must not reuse a connection whose last request
     * timed out (like check_owner). */
    cerb_status (*guard_check)(cerb_engine *e, const cerb_guard_rec *rec,
                               cerb_guard_found *found);

    /* ---- version 3: inspection (core/inspect.c, DESIGN.md §13) ---- */

    /* Optional (NULL: the core answers CERB_UNAVAILABLE "engine X cannot be
     * inspected"): who holds `name` (already checked by check_name) and
     * who waits for it, read-only, bounded by the engine's operation
     * timeout. Add the holder first, then the waiters in queue order, with
     * cerb__holders_add(); add nothing when the name is free. On an error
     * the core drops whatever was added. */
    cerb_status (*inspect)(cerb_engine *e, const char *name, struct cerb_holders *out);

    /* ---- version 4: switch closure records (core/closure.c, DESIGN.md §5) ----
     *
     * Optional as a pair (NULL: the core keeps asking such an engine before
     * and after every grant, and claims names there, as long as it answers
     * after a switch). An engine that has them also checks its record in
     * acquire, whenever lk->epoch >= 0: it grants nothing — and leaves no
     * queue entry — when the record says so for that epoch:
     *     record.epoch > lk->epoch, or record.epoch == lk->epoch && closed.
     * It then returns CERB_UNAVAILABLE with grant->outcome NO and
     * grant->closed_epoch = record.epoch (a message naming both epochs).
     * The check is atomic with the grant, or with the creation of the queue
     * entry that becomes the grant (a ZooKeeper or etcd key), on the server:
     * once the record is stored, no acquisition refused by it can be
     * granted. A hand-off by a release to a waiter that did not re-check is
     * a grant too: an engine stores none while its record is closed. And
     * held() reports BUSY for a name with any queue entry that can become a
     * grant without a check of the record of its own (a ZooKeeper or etcd
     * key created before the record; a Redis waiter checks at its next run),
     * so that "free" after the record was stored stays true for every
     * client whose epoch the record refuses.
     */

    /* Read the record (epoch 0 when none). CERB_OK or an error. A read that
     * sees a record is ordered after every grant made before it was
     * written, also for later calls of this instance (held() above all). */
    cerb_status (*closure_get)(cerb_engine *e, cerb_closure *out);
    /* Store rec unless the stored record's epoch is >= rec->epoch (raise
     * only, atomic on the server); *now = the record stored after the call
     * (rec, or the one that stayed). Idempotent: the core re-sends it after
     * an error. */
    cerb_status (*closure_put)(cerb_engine *e, const cerb_closure *rec, cerb_closure *now);

    /* ---- version 5: primitives beyond the mutex (DESIGN.md §16) ----
     *
     * One table per primitive, kept apart from the mutex methods above as
     * SQLite keeps sqlite3_io_methods apart from sqlite3_vfs; NULL: the
     * engine has no such primitive, and the core answers CERB_UNAVAILABLE
     * naming it. */
    const struct cerb_election_methods *election;
    const struct cerb_queue_methods *semaphore;
    const struct cerb_queue_methods *rwlock;
};

/* ---- leader election (core/election.c) ---- */

#define CERB_ELECTION_METHODS_V1 1

/* The layouts of an election's candidates (cerb_engine_lock.variant). */
enum cerb_election_layout {
    CERB_ELECT_LAYOUT_DEFAULT = 0,  /* the engine's usual one */
    CERB_ELECT_LAYOUT_LATCH = 1,    /* ZooKeeper: Curator LeaderLatch */
    CERB_ELECT_LAYOUT_SELECTOR = 2  /* ZooKeeper: Curator LeaderSelector (the mutex) */
};

/* cerb_election_methods.flags */
enum {
    /* acquire stores lk->value with the grant; otherwise the core
     * proclaims the value right after every grant, before reporting it. */
    CERB_ELECT_VALUE_AT_GRANT = 1u << 0
};

/* Who leads a name on one engine (cerb_election_methods.leader). */
enum cerb_leader_state { CERB_LEADER_NONE = 0, CERB_LEADER_SOME, CERB_LEADER_UNKNOWN };

typedef struct cerb_leader_rec {
    enum cerb_leader_state state;
    char owner[96];       /* the engine's name for the term: token, node, lease key */
    void *value;          /* cerb__malloc'd by the engine, freed by the core */
    size_t value_len;
    int value_known;      /* 0: a holder whose value this engine cannot read
                             (a peer's lock, a term not yet proclaimed) */
    uint64_t counter;     /* the term's fence counter on the engine (< 2^48) */
    int64_t ttl_ms;       /* time left on the server, -1 unknown */
    char detail[160];     /* for `cerberus leader` (why UNKNOWN, a session) */
} cerb_leader_rec;

/*
 * An engine's leader election. A term is a hold like a lock's (acquire,
 * renew, release, check_owner, held: the mutex methods, which must accept
 * a cerb_engine_lock with prim CERB_PRIM_ELECTION), with the value and the
 * layout the methods here add.
 */
struct cerb_election_methods {
    int version;   /* CERB_ELECTION_METHODS_V1 */
    unsigned flags;
    /* Optional (NULL: the mutex's): a grant and its check in the election
     * layout, with the contracts of ops->acquire and ops->check_owner. */
    cerb_status (*acquire)(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                           const atomic_int *interrupted, cerb_grant *grant);
    cerb_status (*check_owner)(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
    /* Required: store value (n bytes) as lk's proclamation if and only if
     * lk still leads, in one atomic step on the server. CERB_OK;
     * CERB_NOT_OWNER when it leads no more (definitive); an error with
     * *outcome (YES/NO/UNKNOWN) otherwise. Idempotent: re-sent after an
     * UNKNOWN. */
    cerb_status (*proclaim)(cerb_engine *e, cerb_engine_lock *lk, const void *value, size_t n,
                            cerb_outcome *outcome);
    /* Required: who leads `name` (checked by check_name) in `variant`'s
     * layout: one consistent read, no write, bounded by the operation
     * timeout. CERB_OK with out filled (state NONE when nobody leads;
     * UNKNOWN when the engine cannot tell, with the reason in detail), or
     * an error. */
    cerb_status (*leader)(cerb_engine *e, const char *name, int variant, cerb_leader_rec *out);
    /* Optional: refuse a value or layout this engine cannot carry
     * (CERB_EINVAL with the reason). */
    cerb_status (*check_value)(int variant, const void *value, size_t n);
};

/* ---- queued primitives: semaphores and read-write locks ---- */

#define CERB_QUEUE_METHODS_V1 1

/*
 * A primitive whose holders line up in one queue per name, in arrival
 * order, each member granted by a rule on the members ahead of it (DESIGN
 * §16): a semaphore's member when the permits of all members ahead plus
 * its own fit the limit; a read-write lock's reader when no writer is
 * ahead, its writer when it is first. A member ahead that is only waiting
 * counts too: nobody overtakes (no writer starves, a big request is not
 * passed by small ones), and a grant, once made, lasts until the member
 * leaves (those ahead only leave).
 *
 * The hold is a cerb_engine_lock with prim CERB_PRIM_SEMAPHORE (limit,
 * count) or CERB_PRIM_RWLOCK (variant); its token, lease, fence floor,
 * epoch and priv are as a lock's, and so are the contracts of the methods
 * below (the mutex's of the same name in cerb_engine_ops): acquire waits
 * with one wake-up per member when its turn may have come (no herd),
 * answers CERB_BUSY at deadline 0 when not granted at once, and leaves no
 * member behind when it fails; renew and check_owner report the fence the
 * grant got; release is by token, atomically on the server.
 */
struct cerb_queue_methods {
    int version;  /* CERB_QUEUE_METHODS_V1 */
    unsigned flags;
    /* Required. A semaphore whose stored limit differs from lk->limit:
     * CERB_ECONFIG naming both, with grant->no_prim set. */
    cerb_status (*acquire)(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                           const atomic_int *interrupted, cerb_grant *grant);
    /* Optional (NULL: holds last until the session ends, as ops->renew). */
    cerb_status (*renew)(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
    /* Required. By token, atomically: removes lk's member whether it is
     * granted or still waiting (the core releases a member whose acquire
     * had an unknown outcome, which check_owner cannot tell from a waiting
     * one). CERB_OK when a granted member was removed, CERB_NOT_OWNER when
     * none was (absent, or only waiting). Idempotent. */
    cerb_status (*release)(cerb_engine *e, cerb_engine_lock *lk);
    /* Required: is lk's member granted (CERB_OK, fence filled) or not
     * (CERB_NOT_OWNER: absent, or present but still waiting)? */
    cerb_status (*check_owner)(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
    /* Required: CERB_OK when no member of `name` holds, CERB_BUSY when one
     * does (the safe switch asks it, as ops->held). */
    cerb_status (*held)(cerb_engine *e, const char *name);
    /* Required: the members of `name`, holders (waiting 0) then waiters,
     * in queue order, as ops->inspect; detail says "read", "write" or
     * "permits K of N". */
    cerb_status (*inspect)(cerb_engine *e, const char *name, struct cerb_holders *out);
    /* Optional (NULL: the gate asks held, so it refuses while any member
     * holds — a semaphore with permits to spare, or readers, included):
     * would a new member like lk (its prim, variant, limit and count) be
     * granted at the tail of lk->name's queue now? CERB_OK when it would;
     * CERB_BUSY when the rule refuses it — the permits of every member
     * there, waiting or holding, plus lk->count exceed the limit (the
     * stored one when there is one, else lk->limit); a writer, with any
     * member there; a reader, with a writer there — or an error. Members
     * of lk's own token are not counted. One consistent read, no write.
     * The safe switch asks it of the engine switched from (health.c). */
    cerb_status (*fits)(cerb_engine *e, const cerb_engine_lock *lk);
};

/* ---- registry and checking shims (engine.c) ---- */

/* Register a table; refuses a duplicate name or a version we do not know.
 * Tables are immutable once registered. */
cerb_status cerb__engine_register(const struct cerb_engine_ops *ops);
/* Find by name; NULL name = the default ("local"). NULL when unknown, with
 * the available names listed in cerb_last_error(). */
const struct cerb_engine_ops *cerb__engine_find(const char *name);
/* "local, redis, zk" — names registered, for error messages. */
void cerb__engine_names(char *buf, size_t len);
/* Register the engines compiled into this library (idempotent). */
void cerb__engines_builtin(void);

cerb_status cerb__engine_open(const struct cerb_engine_ops *ops,
                              const cerb_engine_env *env, cerb_engine **out);
void cerb__engine_close(const struct cerb_engine_ops *ops, cerb_engine *e);
cerb_status cerb__engine_acquire(const struct cerb_engine_ops *ops,
                                 cerb_engine *e, cerb_engine_lock *lk,
                                 int64_t deadline_ns,
                                 const atomic_int *interrupted,
                                 cerb_grant *grant);
cerb_status cerb__engine_renew(const struct cerb_engine_ops *ops,
                               cerb_engine *e, cerb_engine_lock *lk,
                               cerb_grant *grant);
void cerb__engine_renew_batch(const struct cerb_engine_ops *ops,
                              cerb_engine *e, cerb_renew_item *items,
                              size_t n);
cerb_status cerb__engine_release(const struct cerb_engine_ops *ops,
                                 cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__engine_check_owner(const struct cerb_engine_ops *ops,
                                     cerb_engine *e, cerb_engine_lock *lk,
                                     cerb_grant *grant);
void cerb__engine_cancel(const struct cerb_engine_ops *ops, cerb_engine *e,
                         cerb_engine_lock *lk);
cerb_status cerb__engine_probe(const struct cerb_engine_ops *ops,
                               cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__engine_check_name(const struct cerb_engine_ops *ops,
                                    const char *name);
void cerb__engine_stats(const struct cerb_engine_ops *ops, cerb_engine *e,
                        struct cerb_engine_stats *out);
/* ops->hold_bound_ms, or 0 (unknown) when the engine has none or e is
 * NULL. */
int64_t cerb__engine_hold_bound_ms(const struct cerb_engine_ops *ops, cerb_engine *e);
/* ops->instance_caps(e) & ops->caps, or ops->caps (none, or e NULL). */
unsigned cerb__engine_caps(const struct cerb_engine_ops *ops, cerb_engine *e);
/* CERB_OK free, CERB_BUSY held; CERB_UNAVAILABLE when the engine cannot
 * tell (no `held` method), or its error. */
cerb_status cerb__engine_held(const struct cerb_engine_ops *ops, cerb_engine *e,
                              const char *name, int prim);
/* The switch gate's question for the hold lk is about to get on another
 * engine: is its name free enough on engine e? The mutex's and an
 * election's: ops->held(name). A queued primitive's: its table's fits (or
 * held without it); with `whole`, a semaphore's asks whether its whole
 * limit would fit (nobody else has a member there). CERB_OK on an engine
 * without the primitive (nobody can hold it there). */
cerb_status cerb__engine_gate_ask(const struct cerb_engine_ops *ops, cerb_engine *e,
                                  const cerb_engine_lock *lk, bool whole);
/* Does the engine have primitive `prim` (the mutex always)? The shims of
 * acquire, renew, release, check_owner and inspect route a hold or a name
 * by its prim; a missing table answers CERB_UNAVAILABLE naming it (with
 * grant->no_prim set by acquire). */
bool cerb__engine_has_prim(const struct cerb_engine_ops *ops, int prim);
/* "leader election", "semaphore", "read-write lock", "lock". */
const char *cerb__prim_name(int prim);

/*
 * What inspect() builds (core/inspect.c): a growing array of entries whose
 * strings are copies made here, so an engine passes its own buffers.
 */
struct cerb_holders {
    cerb_holder_info *v;
    size_t n, cap;
};
/* Append one entry: owner (owner_len bytes; a NUL inside ends it), detail
 * (NULL = ""). `engine` is filled by the shim. CERB_ENOMEM on failure. */
cerb_status cerb__holders_add(struct cerb_holders *h, const char *owner, size_t owner_len,
                              int waiting, uint64_t fence, int64_t ttl_ms, const char *detail);
/* Free what was added and zero it. */
void cerb__holders_clear(struct cerb_holders *h);
/* The inspect shim: CERB_UNAVAILABLE when the table is older than version
 * 3, has no inspect, or the engine is not open; the name is checked with
 * the engine's check_name first. Entries are appended to `out` (engine
 * field set); on an error nothing is appended. */
bool cerb__engine_has_inspect(const struct cerb_engine_ops *ops);
cerb_status cerb__engine_inspect(const struct cerb_engine_ops *ops, cerb_engine *e,
                                 const char *name, int prim, struct cerb_holders *out);

/* Election shims (engine.c): CERB_UNAVAILABLE naming the engine when its
 * table has no election (older than version 5, or no table) or it is not
 * open. The acquire, check_owner and other mutex shims route a hold with
 * prim CERB_PRIM_ELECTION themselves. */
bool cerb__engine_has_election(const struct cerb_engine_ops *ops);
cerb_status cerb__engine_proclaim(const struct cerb_engine_ops *ops, cerb_engine *e,
                                  cerb_engine_lock *lk, const void *value, size_t n,
                                  cerb_outcome *outcome);
cerb_status cerb__engine_leader(const struct cerb_engine_ops *ops, cerb_engine *e,
                                const char *name, int variant, cerb_leader_rec *out);
cerb_status cerb__engine_check_value(const struct cerb_engine_ops *ops, int variant,
                                     const void *value, size_t n);
/* Free out->value and zero the record. */
void cerb__leader_rec_clear(cerb_leader_rec *out);

/* Closure shims (engine.c): CERB_UNAVAILABLE when the table is older than
 * version 4, lacks the methods, or the engine is not open. */
bool cerb__engine_has_closure(const struct cerb_engine_ops *ops);
cerb_status cerb__engine_closure_get(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     cerb_closure *out);
cerb_status cerb__engine_closure_put(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_closure *rec, cerb_closure *now);

/* Guard shims (core/guard_engine.c). Each gives CERB_UNAVAILABLE, with the
 * reason in cerb_last_error(), when the engine has no guard (a table older
 * than version 2, or guard_begin NULL) or is not open. */
bool cerb__engine_has_guard(const struct cerb_engine_ops *ops);
cerb_status cerb__engine_guard_begin(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_guard_rec *rec, cerb_grant *grant,
                                     void **result, size_t *result_len);
cerb_status cerb__engine_guard_renew(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_guard_rec *rec, cerb_grant *grant);
cerb_status cerb__engine_guard_finish(const struct cerb_engine_ops *ops, cerb_engine *e,
                                      const cerb_guard_rec *rec, int succeeded,
                                      const void *result, size_t len, int64_t keep_ms,
                                      cerb_outcome *outcome);
cerb_status cerb__engine_guard_check(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_guard_rec *rec, cerb_guard_found *found);

#endif /* CERB_ENGINE_H */
