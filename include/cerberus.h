/*
 * cerberus.h — the one public header of Cerberus, distributed locks that keep
 * working when their backing store fails.
 *
 * Everything declared here is API; anything not declared here is not. Every
 * public type is opaque except the small option and information structs, which
 * are plain data the caller owns.
 *
 * Conventions that hold for every function below unless its comment says
 * otherwise:
 *  - It returns a cerb_status; CERB_OK (0) is success. On failure,
 *    cerb_last_error() gives a detailed message for the calling thread.
 *  - A NULL handle gives CERB_EINVAL, never a crash. A freed handle must not
 *    be used again: its memory is gone, so no check can be promised (a
 *    magic word catches most such uses with CERB_EINVAL, not all).
 *  - In a child made by fork(), a client (and its locks) opened in the
 *    parent is refused with CERB_EINVAL: its threads, connections and holds
 *    stayed in the parent. cerb_client_close() in the child does nothing.
 *  - Every call that can block returns by a deadline: its own wait argument,
 *    or the configured connect/operation timeouts.
 *  - Callbacks registered here run on a thread of the client (one per
 *    client, one callback at a time), never with a library lock held, and
 *    nothing in the library waits for them: a callback may take the
 *    application's own mutexes, even one held around a library call. None
 *    starts after the handle it was registered on has been freed or its
 *    client closed; one already running may still be running when
 *    cerb_lock_free() or cerb_client_close() returns (see those).
 */
#ifndef CERBERUS_H
#define CERBERUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks what libcerberus exports: the library is built with hidden
 * visibility, so nothing else in it can be linked against (DESIGN.md §3). */
#if defined(__GNUC__) && __GNUC__ >= 4
#define CERB_API __attribute__((visibility("default")))
#else
#define CERB_API
#endif

#define CERB_VERSION_MAJOR 0
#define CERB_VERSION_MINOR 1
#define CERB_VERSION_PATCH 0

/*
 * Status codes. The list is append-only: codes are never renumbered or
 * removed, so a value stays meaningful across versions. X(NAME, text).
 */
#define CERB_STATUS_MAP(X)                                                     \
    X(OK, "success")                                                           \
    X(BUSY, "lock is held by another owner")                                   \
    X(TIMEOUT, "wait deadline passed")                                         \
    X(INTERRUPTED, "wait was interrupted")                                     \
    X(NOT_OWNER, "caller does not hold the lock")                              \
    X(LOST, "lock lease or session ended while held")                          \
    X(UNAVAILABLE, "no engine could serve the request")                        \
    X(EINVAL, "invalid argument")                                              \
    X(ECONFIG, "invalid configuration")                                        \
    X(ENOMEM, "out of memory")                                                 \
    X(EPROTO, "unexpected server reply")                                       \
    X(EIO, "connection or I/O failure")                                        \
    X(DUPLICATE, "operation already succeeded")

typedef enum cerb_status {
#define CERB__STATUS_ENUM(name, text) CERB_##name,
    CERB_STATUS_MAP(CERB__STATUS_ENUM)
#undef CERB__STATUS_ENUM
    CERB_STATUS_COUNT /* not a status: the number of codes */
} cerb_status;

/**
 * cerb_strerror — a short description of a status code.
 * Returns: a static string; "unknown status" for a value outside the list.
 * Thread-safety: safe from any thread.
 */
CERB_API const char *cerb_strerror(cerb_status status);

/**
 * cerb_status_name — the code's name without prefix, e.g. "BUSY".
 * Returns: a static string; "UNKNOWN" for a value outside the list.
 * Thread-safety: safe from any thread.
 */
CERB_API const char *cerb_status_name(cerb_status status);

/**
 * cerb_version — the version of the library loaded at run time, as
 * "MAJOR.MINOR.PATCH", which may differ from the CERB_VERSION_* macros a
 * program was compiled with. The soname's number (libcerberus.so.0) changes
 * only when the ABI breaks; functions are only ever added within it.
 * Returns: a static string. Thread-safety: safe from any thread.
 */
CERB_API const char *cerb_version(void);

/**
 * cerb_last_error — detailed text of the last failure on this thread, such as
 * `config:12: unknown engine "redsi"`.
 * Returns: a thread-local string, valid until the next Cerberus call on this
 * thread; "" when no call on this thread has failed yet. Successful calls do
 * not clear it.
 */
CERB_API const char *cerb_last_error(void);

/* ---------------------------------------------------------------- logging */

typedef enum cerb_log_level {
    CERB_LOG_DEBUG,
    CERB_LOG_INFO,
    CERB_LOG_WARN,
    CERB_LOG_ERROR,
    CERB_LOG_OFF
} cerb_log_level;

/**
 * cerb_log_set — route the library's log lines (breaker transitions, engine
 * switches, lost locks, server client-library messages) to a callback.
 * @cb: called with a NUL-terminated line without newline; NULL restores the
 *      default sink (stderr).
 * @min_level: lines below this level are dropped before formatting.
 * Returns: CERB_OK, or CERB_EINVAL for a level out of range.
 * Thread-safety: safe from any thread; @cb may be called from any thread,
 * including the library's background threads, never with a library lock
 * held (it may call the library), and must not block for long. A line being
 * written while cerb_log_set() replaces @cb may still reach the previous one.
 */
CERB_API cerb_status cerb_log_set(void (*cb)(cerb_log_level level, const char *line,
                                    void *ud),
                         void *ud, cerb_log_level min_level);

/* ----------------------------------------------------------------- client */

typedef struct cerb_client cerb_client;

/**
 * cerb_client_open — create a client from a configuration file.
 * @out: receives the client; set to NULL on failure.
 * @config_path: a libconfig file (schema in DESIGN.md §6); NULL means no file:
 *      defaults with the in-process "local" engine.
 * Returns: CERB_OK; CERB_ECONFIG with `file:line: message` in
 * cerb_last_error() for a bad file; CERB_UNAVAILABLE when no configured engine
 * could be opened; CERB_ENOMEM; CERB_EINVAL for a NULL @out.
 * Blocking: connects the configured engines, each bounded by its connect
 * timeout.
 * Ownership: the caller closes the client with cerb_client_close().
 */
CERB_API cerb_status cerb_client_open(cerb_client **out, const char *config_path);

/**
 * cerb_client_open_string — like cerb_client_open(), configuration given as
 * text. Error positions read `config:LINE: message`. The client has no file
 * to reload from: cerb_client_reload() then gives CERB_EINVAL.
 */
CERB_API cerb_status cerb_client_open_string(cerb_client **out, const char *config_text);

/**
 * cerb_client_close — release every lock this client holds, stop its
 * background threads and free it. Lock handles made from it must be freed
 * first; handles still alive are freed here and must not be used afterwards.
 * cerb_client_close(NULL) does nothing.
 * Bound: about two operation timeouts per engine plus the engines' own
 * close — a renewal being sent is finished, each hold is released once, and
 * once an engine has not answered a release its other holds are left to
 * expire with their lease. Queued callbacks are dropped and none starts
 * after close begins; close does not wait for a callback already running
 * (it may return before that callback does; the client's and the handle's
 * memory stay readable until it returns, and calls on them give
 * CERB_EINVAL).
 * Thread-safety: no other call on this client or its locks may be running.
 */
CERB_API void cerb_client_close(cerb_client *client);

/**
 * cerb_client_reload — re-read the client's configuration file. The new file
 * is parsed and validated whole before it replaces the old configuration; on
 * any error the old configuration stays in force and the error is returned
 * (CERB_ECONFIG, `file:line: message`). Keys that cannot change at run time
 * (the engine list and connection settings) are reported as errors too.
 * When the new file names an `active` engine that will not open, the new
 * configuration stays in force, the pin is kept and applied as soon as the
 * engine opens (the prober retries every round), and CERB_UNAVAILABLE says
 * so; cerb_engine_info() shows it as `wanted`.
 * Thread-safety: safe from any thread; locks already held keep the settings
 * they were acquired with.
 */
CERB_API cerb_status cerb_client_reload(cerb_client *client);

/**
 * cerb_engine_current — name of the engine new acquisitions go to.
 * Returns: a string owned by the client, valid until cerb_client_close();
 * NULL for a NULL client.
 */
CERB_API const char *cerb_engine_current(cerb_client *client);

/**
 * cerb_engine_switch — move new acquisitions to the next engine in
 * configuration order that opens, wrapping around at the end, and pin it
 * (no automatic failback until cerb_engine_switch_to(client, "auto")).
 * Returns: the new current engine's name (owned by the client), or NULL for
 * a NULL client. With one engine, or when no other engine opens, this is
 * the current engine.
 */
CERB_API const char *cerb_engine_switch(cerb_client *client);

/**
 * cerb_engine_switch_to — move new acquisitions to the named engine and pin
 * it; "auto" returns to automatic selection.
 * Returns: the engine's name (owned by the client), or NULL with
 * cerb_last_error() set when no configured engine has that name or it will
 * not open.
 */
CERB_API const char *cerb_engine_switch_to(cerb_client *client, const char *name);

/**
 * cerb_client_on_switch — register a callback for engine switches.
 * @cb: called once per switch with the old and new engine names and a reason
 *      (e.g. "manual", "breaker open"); NULL removes the callback. The strings
 *      are valid only during the call.
 * Thread-safety: @cb runs on the client's callback thread, after the switch
 * (the call or background event that switched does not wait for it), in
 * switch order, with no library lock held.
 */
CERB_API cerb_status cerb_client_on_switch(cerb_client *client,
                                  void (*cb)(const char *from, const char *to,
                                             const char *why, void *ud),
                                  void *ud);

typedef enum cerb_breaker_state {
    CERB_BREAKER_CLOSED,
    CERB_BREAKER_OPEN,
    CERB_BREAKER_HALF_OPEN,
    CERB_BREAKER_DISABLED,
    CERB_BREAKER_FORCED_OPEN
} cerb_breaker_state;

/*
 * Health and counters of one configured engine (plain data). The type is
 * spelled `struct cerb_engine_info` because cerb_engine_info() is the function
 * that fills it.
 */
struct cerb_engine_info {
    const char *name;           /* owned by the client */
    int active;                 /* 1 when new acquisitions go here */
    cerb_breaker_state breaker; /* CLOSED until failover is configured */
    int64_t last_probe_us;      /* latency of the last probe; -1 if none */
    uint64_t acquires;          /* acquisitions granted by this engine */
    uint64_t failures;          /* hard failures (I/O, protocol) seen */
    uint64_t lost;              /* holds reported LOST */
    /* Protocol counters, where the engine reports them (else 0): */
    uint64_t acquire_calls;     /* acquire requests sent to the server */
    uint64_t wakeups;           /* blocked waiters woken by a release */
    uint64_t handoffs;          /* grants handed over by a release */
    uint64_t breaker_transitions; /* state changes of this engine's breaker */
    uint64_t switches;          /* engine switches of the whole client */
    int64_t epoch;              /* the client's fencing epoch (the high 16
                                   bits of its tokens: the config's epoch) */
    int wanted;                 /* 1 when `active` (or a switch) pins this
                                   engine but it is not active yet: it would
                                   not open; retried every probe round */
    /* cerb_guard_begin() answers while this engine was active: */
    uint64_t guard_begins;      /* CERB_OK with a record (an attempt) */
    uint64_t guard_duplicates;  /* CERB_DUPLICATE */
    uint64_t guard_busy;        /* CERB_BUSY */
    uint64_t guard_degraded;    /* CERB_OK unprotected (cerb_guard_degraded) */
    /* After a switch away from this engine: */
    uint64_t gate_questions;    /* "is this name free here?" asked before a
                                   grant elsewhere */
    int64_t closed_epoch;       /* a closure record seen here recently closes
                                   it from this epoch on (no claims, one
                                   question per name); 0 when none */
};

/**
 * cerb_engine_info — fill @out with the state of engine @name (NULL = the
 * current engine).
 * Returns: CERB_OK, or CERB_EINVAL for an unknown name.
 */
CERB_API cerb_status cerb_engine_info(cerb_client *client, const char *name,
                             struct cerb_engine_info *out);

/**
 * cerb_metrics_text — the client's state in the Prometheus text exposition
 * format 0.0.4 (DESIGN.md §13), for a /metrics endpoint or node_exporter's
 * textfile collector. Per engine (label `engine`): cerberus_engine_active,
 * cerberus_engine_breaker_state (label `state`: 1 for the current one),
 * cerberus_engine_breaker_transitions_total,
 * cerberus_engine_probe_latency_seconds, cerberus_acquisitions_total,
 * cerberus_engine_failures_total, cerberus_lost_holds_total,
 * cerberus_guard_begins_total (label `result`: ok, duplicate, busy,
 * degraded), cerberus_election_terms_total,
 * cerberus_election_proclaims_total, cerberus_semaphore_acquisitions_total,
 * cerberus_rwlock_holds_total (label `mode`: read, write), and the histograms
 * cerberus_acquire_wait_seconds (call to
 * grant, granted acquisitions) and cerberus_hold_duration_seconds (grant
 * to release). Per client: cerberus_engine_switches_total, cerberus_holds
 * (locks held now) and cerberus_fencing_epoch.
 * @out: receives a NUL-terminated string; free it with cerb_free().
 * Returns: CERB_OK; CERB_EINVAL for a bad client or NULL @out; CERB_ENOMEM.
 * Thread-safety: safe from any thread; counters are read one by one, so a
 * snapshot taken while locks are granted may be off by those in flight.
 */
CERB_API cerb_status cerb_metrics_text(cerb_client *client, char **out);

/**
 * cerb_free — free memory the library returned for the caller to free
 * (cerb_metrics_text()). NULL does nothing.
 */
CERB_API void cerb_free(void *p);

/* ------------------------------------------------------------------ locks */

typedef struct cerb_lock cerb_lock;

/**
 * Per-lock options. lease_ms 0, renew -1 and fair -1 take the configured
 * defaults (CERB_LOCK_OPTS_INIT sets them all); any other value outside the
 * ranges below is refused by cerb_lock_new() with CERB_EINVAL.
 */
typedef struct cerb_lock_opts {
    int64_t lease_ms; /* server-side lease, 100 to 86400000; 0 = config lock.lease_ms */
    int renew;        /* 1 renew while held, 0 never, -1 = config lock.renew */
    int fair;         /* 1 FIFO hand-off, 0 barging, -1 = config lock.fair */
} cerb_lock_opts;

#define CERB_LOCK_OPTS_INIT {0, -1, -1}

/*
 * Spelled `enum cerb_lock_state` because cerb_lock_state() is the function
 * that reports it.
 */
enum cerb_lock_state {
    CERB_LOCK_FREE,    /* the calling thread does not hold it */
    CERB_LOCK_VALID,   /* held and the lease is known to be in force */
    CERB_LOCK_SUSPECT, /* held, but a renewal failed or the session is down */
    CERB_LOCK_LOST     /* held no more: lease passed, session expired, key gone */
};

/**
 * cerb_lock_new — make a handle for the lock called @name on @client.
 * @name: 1–255 bytes, no control characters; engines may refuse more (a
 *        ZooKeeper path component cannot be "." or contain '/').
 * @opts: NULL for the configured defaults. opts->lease_ms may not exceed
 *        lock.lease_ms when redis is among the engines (its data-loss
 *        quarantine lasts lock.lease_ms, and must outlast every hold), nor
 *        with more than one engine and failover.switch_grace_ms = -1 (the
 *        safe default: the switch grace every process derives from the file
 *        must cover every hold); CERB_EINVAL says which.
 * Returns: CERB_OK; CERB_EINVAL with the reason for a bad name or option;
 * CERB_ENOMEM. Does not contact a server.
 * Ownership: free with cerb_lock_free() before closing the client.
 * Thread-safety: a handle may be used from any number of threads; holds are
 * per thread and reentrant. Handles with the same name on one client share
 * their holds (a thread holding "x" through one handle holds it through all).
 */
CERB_API cerb_status cerb_lock_new(cerb_client *client, const char *name,
                          const cerb_lock_opts *opts, cerb_lock **out);

/**
 * cerb_lock_lock — acquire, waiting as long as it takes. Reentrant: a thread
 * that holds the lock only increments its hold count (no round trip).
 * Returns: CERB_OK; CERB_UNAVAILABLE/CERB_EIO when no engine can serve after
 * bounded retries. Blocking: until acquired or the engines fail.
 */
CERB_API cerb_status cerb_lock_lock(cerb_lock *lock);

/**
 * cerb_lock_trylock — one attempt without waiting.
 * Returns: CERB_OK or CERB_BUSY (held by another thread or process), or an
 * engine error. Blocking: one acquire request, plus one re-check when its
 * answer was lost, plus — after a switch, while an engine switched from
 * still answers — one question to each such engine before and one after
 * the grant, and where the full gate applies (an automatic switch, a Redis
 * Cluster, failover.switch_claims) a claim of the name there (and a release
 * when it says the name is held there); each is bounded by its engine's
 * operation timeout.
 */
CERB_API cerb_status cerb_lock_trylock(cerb_lock *lock);

/**
 * cerb_lock_trylock_for — acquire, waiting at most @wait_ms milliseconds.
 * Returns: CERB_OK, CERB_TIMEOUT when the wait passed, CERB_INTERRUPTED after
 * cerb_lock_interrupt(), or an engine error. A negative @wait_ms waits
 * forever; 0 behaves as cerb_lock_trylock() but returns CERB_TIMEOUT.
 * Blocking: @wait_ms, plus — after a switch, while an engine switched from
 * still answers — at most one step of the grant's confirmation there (a
 * question or a claim, bounded by that engine's operation timeout) begun
 * before the wait ran out. A grant whose lease ran out during that
 * confirmation is given back and never returned as CERB_OK.
 */
CERB_API cerb_status cerb_lock_trylock_for(cerb_lock *lock, int64_t wait_ms);

/**
 * cerb_lock_lock_interruptibly — like cerb_lock_lock(), but returns
 * CERB_INTERRUPTED once another thread calls cerb_lock_interrupt(), or if an
 * interrupt is already pending on the handle (one made while nobody waited,
 * consumed by the next interruptible wait on it, from any thread).
 */
CERB_API cerb_status cerb_lock_lock_interruptibly(cerb_lock *lock);

/**
 * cerb_lock_interrupt — wake every thread waiting on this handle in
 * cerb_lock_lock_interruptibly() or cerb_lock_trylock_for(); they return
 * CERB_INTERRUPTED. When nobody waits, the next such wait on this handle
 * returns CERB_INTERRUPTED at once (the interrupt is consumed once).
 * Thread-safety: safe from any thread; it takes the handle's mutex, so not
 * from a signal handler. It never blocks on the network.
 * It does not reach cerb_lock_acquire() calls made through the handle: end
 * one of those with its cerb_cancel.
 */
CERB_API cerb_status cerb_lock_interrupt(cerb_lock *lock);

/**
 * cerb_lock_unlock — drop one hold of the calling thread; at zero the lock is
 * released on the server (renewal is stopped before the release is sent).
 * Returns: CERB_OK; CERB_NOT_OWNER when the calling thread does not hold it;
 * CERB_LOST when the hold had been lost (the local hold is dropped anyway);
 * an engine error when the release could not be confirmed (the local hold is
 * dropped and the server lease will expire by itself).
 * Blocking: the release is tried 1 + retry.max times (once, after a switch
 * away from its engine), each bounded by that engine's release bound — its
 * connect and operation timeouts; on etcd twice the operation timeout (a
 * timed-out request is sent once more) — plus, after a switch, one release
 * of the claim on each engine switched from, and a renewal of this hold
 * already on the wire (one operation timeout).
 */
CERB_API cerb_status cerb_lock_unlock(cerb_lock *lock);

/**
 * cerb_lock_fencing_token — the token of the calling thread's current hold:
 * strictly increasing per lock name across successive grants on one engine.
 * Bits 63..48: the configuration's epoch (`cerberus switch` bumps it, so
 * every grant after ranks above every grant before); 47..0: the engine's
 * counter. When this client switches engines by itself, the engine it goes
 * to first raises its counter for the name above the highest this client
 * had on the engine it left, on the server, so this client's tokens never
 * go backwards across its own switches and every client's later grants on
 * that engine rank above it.
 * Returns: the token, or 0 when the calling thread does not hold the lock
 * or its engine issues no tokens (memcached; redis in Redlock mode with
 * redis.redlock_fence = "none"): never a bare epoch a resource could take
 * for one.
 */
CERB_API uint64_t cerb_lock_fencing_token(const cerb_lock *lock);

/**
 * cerb_lock_hold_count — how many times the calling thread holds the lock.
 * Returns: 0 when it does not hold it or for a bad handle.
 */
CERB_API unsigned cerb_lock_hold_count(const cerb_lock *lock);

/**
 * cerb_lock_name — the lock's name. Returns: a string owned by the handle,
 * valid until cerb_lock_free(); NULL for a bad handle.
 */
CERB_API const char *cerb_lock_name(const cerb_lock *lock);

/**
 * cerb_lock_on_lost — set the callback told when a held lock is lost
 * (renewal failed past the lease, session expired, key deleted or taken by
 * someone else). Called exactly once per lost hold, on the client's callback
 * thread, with the callback set when the loss was found; nothing in the
 * library waits for it, so it may take a mutex the application holds around
 * cerb_lock_unlock(). It may run after the hold was unlocked (the unlock
 * then returned CERB_LOST). Not called once the handle has been freed or the
 * client closed; when cerb_lock_free() runs while the callback is running,
 * the handle's memory stays valid until the callback returns, but calls on
 * it give CERB_EINVAL — a callback must not use a handle the application
 * may be freeing at the same time. NULL removes it.
 */
CERB_API cerb_status cerb_lock_on_lost(cerb_lock *lock,
                              void (*cb)(cerb_lock *lock, void *ud), void *ud);

/**
 * cerb_lock_state — state of the calling thread's hold.
 * Returns: CERB_LOCK_FREE when it holds nothing (or for a bad handle).
 */
CERB_API enum cerb_lock_state cerb_lock_state(const cerb_lock *lock);

/**
 * cerb_lock_free — free a handle. A hold of the calling thread through this
 * handle is released first. A handle through which another thread still
 * holds the lock is not freed: CERB_BUSY. cerb_lock_free(NULL) does nothing
 * and returns CERB_OK.
 */
CERB_API cerb_status cerb_lock_free(cerb_lock *lock);

/**
 * cerb_multilock_lock — acquire all @n locks or none. Locks are acquired in
 * name order (so two callers never deadlock) and, on failure, the ones
 * already taken are released in reverse order.
 * @wait_ms: total wait for all of them; negative waits forever, 0 tries once.
 * Returns: CERB_OK; CERB_BUSY (@wait_ms == 0) or CERB_TIMEOUT; an engine
 * error; CERB_EINVAL for a NULL array or a NULL element.
 */
CERB_API cerb_status cerb_multilock_lock(cerb_lock **locks, size_t n, int64_t wait_ms);

/**
 * cerb_multilock_unlock — release locks taken by cerb_multilock_lock(), in
 * reverse name order. Every lock is released even when one fails; the first
 * failure is returned.
 */
CERB_API cerb_status cerb_multilock_unlock(cerb_lock **locks, size_t n);

/* ------------------------------------------------------ holds as objects */

/*
 * A hold owned by an object rather than a thread, for worker pools, async
 * runtimes, language bindings and daemons: any thread may release it, ask
 * its state or free it. Holds are not reentrant: a second acquisition of a
 * name through holds waits like any other owner, within this process too.
 * Holds and the thread holds of cerb_lock_lock() exclude each other.
 */
typedef struct cerb_hold cerb_hold;

/*
 * Cancels one blocking call: made by cerb_cancel_new(), passed to one call
 * at a time, fired from any thread.
 */
typedef struct cerb_cancel cerb_cancel;

/**
 * cerb_cancel_new — make a cancel for one blocking call
 * (cerb_lock_acquire(), cerb_guard_begin_ex()).
 * Returns: CERB_OK; CERB_EINVAL for a NULL @out; CERB_ENOMEM.
 * Ownership: free with cerb_cancel_free() once no call uses it.
 */
CERB_API cerb_status cerb_cancel_new(cerb_cancel **out);

/**
 * cerb_cancel_fire — end the call this cancel was passed to with
 * CERB_INTERRUPTED: its wait in the local line or on the server stops, and a
 * grant that landed meanwhile is released before the call returns (no
 * orphan stays on the server). Other calls, on the same name too, go on.
 * Firing is final: a call given a fired cancel returns CERB_INTERRUPTED at
 * once. A fire that comes after the call returned — or in the instant
 * before, after its last look — does nothing to its result: a caller that
 * fires and still gets a hold back releases it.
 * Thread-safety: any thread; it takes two short mutexes and never waits on
 * the network (not from a signal handler). A NULL @cancel does nothing.
 */
CERB_API void cerb_cancel_fire(cerb_cancel *cancel);

/**
 * cerb_cancel_fired — 1 when cerb_cancel_fire() was called, else 0.
 */
CERB_API int cerb_cancel_fired(const cerb_cancel *cancel);

/**
 * cerb_cancel_error — the error text of the last call this cancel was passed
 * to ("" when it succeeded or none ran): unlike cerb_last_error() it is
 * readable from any thread after the call returned.
 * Returns: a string owned by the cancel, valid until its next call or
 * cerb_cancel_free(); "" for NULL.
 */
CERB_API const char *cerb_cancel_error(const cerb_cancel *cancel);

/**
 * cerb_cancel_free — free a cancel no call is using. NULL does nothing.
 */
CERB_API void cerb_cancel_free(cerb_cancel *cancel);

/**
 * cerb_lock_acquire — acquire the lock's name for a hold object.
 * @wait_ms: 0 tries once; -1 waits without limit; otherwise the longest wait.
 * @cancel: NULL, or a cancel that no other call is using; firing it ends
 *        this call with CERB_INTERRUPTED.
 * @out: receives the hold for CERB_OK, NULL otherwise.
 * Returns: CERB_OK; CERB_BUSY (@wait_ms 0 and the name is held, in this
 * process too); CERB_TIMEOUT; CERB_INTERRUPTED (the cancel fired); an engine
 * error (CERB_UNAVAILABLE, CERB_EIO...); CERB_EINVAL for a bad handle, a
 * bad @wait_ms or a cancel in use by another call. Once @cancel fired, any
 * failure is CERB_INTERRUPTED (with the other reason in the text). The
 * error text is in cerb_last_error() on this thread and, when @cancel was
 * given, in cerb_cancel_error() for any thread (give a cancel to a call
 * whose failure is read on another thread).
 * Blocking: as cerb_lock_trylock() (@wait_ms 0) or cerb_lock_trylock_for().
 * Not reentrant: a second acquisition of the name, through any handle and
 * from any thread, waits for this hold's release.
 * Ownership: the hold belongs to the caller, not to a thread; release and
 * free it with cerb_hold_free() (from any thread) before closing the
 * client. The lock handle may be freed once this call has returned, before
 * its holds.
 */
CERB_API cerb_status cerb_lock_acquire(cerb_lock *lock, int64_t wait_ms,
                              cerb_cancel *cancel, cerb_hold **out);

/**
 * cerb_hold_release — release the hold on the server (renewal stops first).
 * Returns: CERB_OK; CERB_NOT_OWNER when it was already released; CERB_LOST
 * when it had been lost; an engine error when the release could not be
 * confirmed (the lease then expires by itself). The hold stays allocated:
 * free it with cerb_hold_free(). The error text is also kept in
 * cerb_hold_error().
 * Blocking: as cerb_lock_unlock().
 * Thread-safety: any thread; of two concurrent releases one releases and the
 * other returns CERB_NOT_OWNER.
 */
CERB_API cerb_status cerb_hold_release(cerb_hold *hold);

/**
 * cerb_hold_fencing_token — the fencing token of this hold's grant (as
 * cerb_lock_fencing_token()); it stays readable after the release.
 * Returns: 0 for NULL, or when the hold's engine issues no tokens.
 */
CERB_API uint64_t cerb_hold_fencing_token(const cerb_hold *hold);

/**
 * cerb_hold_state — CERB_LOCK_VALID, CERB_LOCK_SUSPECT or CERB_LOCK_LOST
 * while held (as cerb_lock_state()), CERB_LOCK_FREE once released (or for
 * NULL). Never blocks.
 */
CERB_API enum cerb_lock_state cerb_hold_state(const cerb_hold *hold);

/**
 * cerb_hold_valid_ms — how long, from now, this process still counts the
 * hold valid without another renewal reaching the server: the local
 * deadline the hold turns CERB_LOCK_LOST at (the send time of its last good
 * renewal plus the lease, less the clock-drift margin), which is never
 * later than the moment another owner could take the name. For a process
 * that holds names on behalf of others (a daemon): tell them this, and
 * they can count down from when they asked.
 * Returns: milliseconds, rounded down; 0 for a hold that is lost or
 * released, and for NULL or a bad handle. Never blocks.
 */
CERB_API int64_t cerb_hold_valid_ms(const cerb_hold *hold);

/**
 * cerb_hold_name — the lock name this hold is for, owned by the hold.
 */
CERB_API const char *cerb_hold_name(const cerb_hold *hold);

/**
 * cerb_hold_on_lost — set the callback told once when the hold is lost,
 * with the same promises as cerb_lock_on_lost(): on the client's callback
 * thread, nothing waits for it, not called once the hold has been freed.
 * Set while the hold is already lost and nobody was told, it is called at
 * once (queued). NULL removes it.
 * Returns: CERB_OK; CERB_EINVAL for a NULL hold.
 */
CERB_API cerb_status cerb_hold_on_lost(cerb_hold *hold,
                              void (*cb)(cerb_hold *hold, void *ud), void *ud);

/**
 * cerb_hold_error — the error text of the last call on this hold that
 * failed (its release), "" when none did; readable from any thread.
 * Returns: a string owned by the hold, valid until cerb_hold_free().
 */
CERB_API const char *cerb_hold_error(const cerb_hold *hold);

/**
 * cerb_hold_free — release the hold if it is still held (as
 * cerb_hold_release(), whose status this returns — CERB_LOST included) and
 * free it. NULL does nothing and returns CERB_OK. A lost callback running
 * at that moment keeps the memory alive until it returns.
 */
CERB_API cerb_status cerb_hold_free(cerb_hold *hold);


/* -------------------------------------------------------- leader election */

/*
 * A leader election (DESIGN.md §16): candidates campaign for a name, one at
 * a time leads, with a value it proclaims (its identity, an address) that
 * anyone can read. A term is held like a lock: leased, renewed in the
 * background, fenced, told LOST (the lost callback) before any other
 * candidate can be elected, and it follows the engine failover rules of
 * locks. On the wire each engine uses the layout of the election its own
 * peers use (docs/election.md): `etcdctl elect`, Curator's LeaderLatch or
 * LeaderSelector, a redis-py lock.
 */
typedef struct cerb_election cerb_election;

/** The layout of an election's candidates on ZooKeeper (other engines have one). */
enum cerb_election_layout_opt {
    CERB_ELECTION_LAYOUT_DEFAULT = 0,  /* the engine's own: the latch on ZooKeeper */
    CERB_ELECTION_LAYOUT_LATCH = 1,    /* Curator LeaderLatch (_c_<id>-latch-<seq>) */
    CERB_ELECTION_LAYOUT_SELECTOR = 2  /* Curator LeaderSelector (the mutex's nodes) */
};

/**
 * Per-election options; CERB_ELECTION_OPTS_INIT takes the defaults.
 */
typedef struct cerb_election_opts {
    int64_t lease_ms; /* a term's lease, as cerb_lock_opts.lease_ms; 0 = lock.lease_ms */
    int layout;       /* enum cerb_election_layout_opt */
} cerb_election_opts;

#define CERB_ELECTION_OPTS_INIT {0, 0}

/** The longest value a candidate may proclaim, in bytes. */
#define CERB_ELECTION_VALUE_MAX (64 * 1024)

/**
 * cerb_election_new — make a candidate for the election called @name.
 * @name: as a lock name (cerb_lock_new()); an election and a lock should not
 *        share a name (they would exclude each other).
 * @opts: NULL for the defaults.
 * Returns: CERB_OK; CERB_EINVAL with the reason for a bad name or option;
 * CERB_ENOMEM. Does not contact a server.
 * Ownership: free with cerb_election_free() before closing the client.
 * Thread-safety: any thread; calls on one election are serialised.
 */
CERB_API cerb_status cerb_election_new(cerb_client *client, const char *name,
                              const cerb_election_opts *opts, cerb_election **out);

/**
 * cerb_election_campaign — wait until elected, then lead with @value
 * (@len bytes, at most CERB_ELECTION_VALUE_MAX; NULL with 0 for none).
 * @wait_ms: 0 tries once; -1 waits without limit; otherwise the longest wait.
 * @cancel: NULL, or a cancel that no other call is using; firing it ends
 *        the campaign with CERB_INTERRUPTED.
 * Candidates are elected in the order they came (one wake-up per
 * election). Elected, the value is on the server before this returns, and
 * the term is renewed until cerb_election_resign() or its loss.
 * Returns: CERB_OK (leading); CERB_BUSY (@wait_ms 0 and somebody leads);
 * CERB_TIMEOUT; CERB_INTERRUPTED; CERB_UNAVAILABLE (also when the engine in
 * use has no elections, naming it) or another engine error; CERB_EINVAL for
 * a bad argument, a value the engine cannot carry, or a candidate that
 * leads or campaigns already.
 * Blocking: up to @wait_ms, plus the engines' operation timeouts.
 */
CERB_API cerb_status cerb_election_campaign(cerb_election *e, const void *value, size_t len,
                                   int64_t wait_ms, cerb_cancel *cancel);

/**
 * cerb_election_proclaim — while leading, replace the value (atomically
 * with still leading, on the server).
 * Returns: CERB_OK; CERB_NOT_OWNER when not leading; CERB_LOST when the term
 * was lost (its lost callback is queued); CERB_BUSY, nothing changed, when
 * the engine cannot change it now without stranding a peer (ZooKeeper's
 * latch layout with a Curator candidate right behind: docs/election.md);
 * an engine error when the change could not be confirmed (the old or the
 * new value may stand); CERB_EINVAL for a bad value.
 * Blocking: the engine's operation timeout, with bounded retries.
 */
CERB_API cerb_status cerb_election_proclaim(cerb_election *e, const void *value, size_t len);

/**
 * cerb_election_resign — end the term: the next candidate is elected.
 * Returns: CERB_OK; CERB_NOT_OWNER when not leading; CERB_LOST when the term
 * had been lost; an engine error when the release could not be confirmed
 * (the lease then ends the term). The candidate may campaign again.
 */
CERB_API cerb_status cerb_election_resign(cerb_election *e);

/**
 * cerb_election_state — the term's state as a lock's (CERB_LOCK_VALID,
 * _SUSPECT, _LOST), or CERB_LOCK_FREE when not leading. Never blocks.
 */
CERB_API enum cerb_lock_state cerb_election_state(const cerb_election *e);

/**
 * cerb_election_fencing_token — the fencing token of the current (or last)
 * term, strictly greater than every earlier term's on this name, across
 * engines and switches as a lock's; 0 before the first term.
 */
CERB_API uint64_t cerb_election_fencing_token(const cerb_election *e);

/**
 * cerb_election_valid_ms — as cerb_hold_valid_ms() for the current term;
 * 0 when not leading.
 */
CERB_API int64_t cerb_election_valid_ms(const cerb_election *e);

/**
 * cerb_election_on_lost — set the callback told once per term when the
 * term is lost, with the promises of cerb_lock_on_lost(): on the client's
 * callback thread, before another candidate can be elected (the lease's
 * drift margin), nothing waits for it; none starts once
 * cerb_election_free() has returned (one already running may still run).
 * Set after a loss nobody was told of, it is queued at once. NULL removes
 * it.
 * Returns: CERB_OK; CERB_EINVAL for a bad election.
 */
CERB_API cerb_status cerb_election_on_lost(cerb_election *e,
                                  void (*cb)(cerb_election *e, void *ud), void *ud);

/**
 * cerb_election_free — resign if leading (whose status this returns) and
 * free. NULL does nothing. A lost callback running at that moment keeps
 * the memory alive until it returns. CERB_BUSY, freeing nothing, while a
 * campaign of this candidate runs on another thread (fire its cancel
 * first); a proclaim or resign in flight is waited for.
 */
CERB_API cerb_status cerb_election_free(cerb_election *e);

/**
 * Who leads an election, from cerb_election_leader().
 */
typedef struct cerb_leader_info {
    int has_leader;          /* 0: nobody leads (the other fields are empty) */
    char engine[32];         /* the engine asked */
    void *value;             /* the leader's value (malloc'd), NULL when unknown */
    size_t value_len;
    int value_known;         /* 0: a leader whose value cannot be read (another
                                library's lock, a term not yet proclaimed) */
    uint64_t term;           /* the engine's counter of that term (the low 48 bits
                                of its fencing token; 0 when the engine has none) */
    int64_t ttl_ms;          /* time left on its lease, -1 when unknown */
    char owner[96];          /* the engine's name for the term (a token, a node, a key) */
} cerb_leader_info;

/**
 * cerb_election_leader — who leads @name now, asked of the engine in use
 * (and of an engine switched away from whose terms may still stand).
 * Returns: CERB_OK with @out filled (has_leader 0 for nobody);
 * CERB_UNAVAILABLE when it cannot be known (an engine that does not
 * answer, has no elections, or a Redis server restarted empty whose
 * leases have not yet run out), never "nobody" then; CERB_EINVAL.
 * With failover.switch_grace_ms = 0 (which lets two holders overlap
 * across a switch) a term standing on the engine switched from is not
 * looked for.
 * Ownership: free out->value with cerb_leader_info_clear().
 * Blocking: the engines' operation timeouts.
 */
CERB_API cerb_status cerb_election_leader(cerb_client *client, const char *name,
                                 int layout, cerb_leader_info *out);

/** cerb_leader_info_clear — free what cerb_election_leader() gave, and zero it. */
CERB_API void cerb_leader_info_clear(cerb_leader_info *info);

/* ------------------------------------------------------------- semaphores */

/*
 * A semaphore (DESIGN.md §16): at most `permits` permits of a name are held
 * at once, across every process and engine. Callers line up in arrival
 * order (a request for many permits is not passed by smaller ones behind
 * it); each permit is a lease renewed in the background, lost on a crash,
 * fenced, and told when lost, as a hold (cerb_lock_acquire()). The limit is
 * stored on the server by the first caller: a caller with another limit is
 * refused (CERB_ECONFIG), never given a second, silent limit. On the wire
 * each engine uses its peers' layout (docs/semaphore.md): Curator's
 * InterProcessSemaphoreV2, the npm redis-semaphore sorted set, and ranked
 * lease keys on etcd.
 */
typedef struct cerb_semaphore cerb_semaphore;
/** One acquisition of one or more permits, owned by the caller. */
typedef struct cerb_permit cerb_permit;

/** The largest limit a semaphore may have. */
#define CERB_SEMAPHORE_MAX 65536

/** Per-semaphore options; CERB_SEMAPHORE_OPTS_INIT takes the defaults. */
typedef struct cerb_semaphore_opts {
    int64_t lease_ms; /* a permit's lease, as cerb_lock_opts.lease_ms; 0 = lock.lease_ms */
} cerb_semaphore_opts;

#define CERB_SEMAPHORE_OPTS_INIT {0}

/**
 * cerb_semaphore_new — a handle on the semaphore @name with @permits
 * permits (1..CERB_SEMAPHORE_MAX).
 * @name: as a lock name (cerb_lock_new()); a semaphore should not share a
 *        name with a lock or another primitive.
 * @opts: NULL for the defaults.
 * Returns: CERB_OK; CERB_EINVAL with the reason; CERB_ENOMEM. Does not
 * contact a server (the limit is checked at the first acquisition).
 * Ownership: free with cerb_semaphore_free(); its permits may outlive it.
 * Thread-safety: any thread; a handle is shared by threads freely.
 */
CERB_API cerb_status cerb_semaphore_new(cerb_client *client, const char *name, int64_t permits,
                               const cerb_semaphore_opts *opts, cerb_semaphore **out);

/**
 * cerb_semaphore_acquire — take @count permits (1..the limit) at once.
 * @wait_ms: 0 tries once; -1 waits without limit; otherwise the longest wait.
 * @cancel: NULL, or a cancel no other call is using (cerb_lock_acquire()).
 * @out: receives the permit for CERB_OK, NULL otherwise.
 * Returns: CERB_OK; CERB_BUSY (@wait_ms 0 and not enough permits free, or
 * others already waiting for them); CERB_TIMEOUT; CERB_INTERRUPTED;
 * CERB_ECONFIG when the engine stores another limit for the name (both are
 * named in cerb_last_error()); CERB_UNAVAILABLE when the engine in use has
 * no semaphores (naming it) or none answers; CERB_EINVAL for a bad handle
 * or @count; another engine error. Errors as cerb_lock_acquire().
 * Blocking: up to @wait_ms, plus the engines' operation timeouts.
 * Ownership: release and free the permit with cerb_permit_free().
 */
CERB_API cerb_status cerb_semaphore_acquire(cerb_semaphore *sem, unsigned count, int64_t wait_ms,
                                   cerb_cancel *cancel, cerb_permit **out);

/** cerb_semaphore_limit — the limit the handle was made with (0 for a bad handle). */
CERB_API int64_t cerb_semaphore_limit(const cerb_semaphore *sem);

/**
 * cerb_semaphore_free — free the handle. Its permits are not released:
 * each stays the caller's until cerb_permit_free().
 * Returns: CERB_OK; CERB_BUSY (nothing freed) while an acquisition through
 * it is in progress; CERB_EINVAL for a bad handle. NULL does nothing. As
 * for every handle, a call that may still start on another thread must
 * not race the free (BUSY covers the calls already under way; one racing
 * it may fail with CERB_EINVAL).
 */
CERB_API cerb_status cerb_semaphore_free(cerb_semaphore *sem);

/**
 * cerb_permit_release — give the permits back (renewal stops first).
 * Returns: as cerb_hold_release() (CERB_LOST when it had been lost).
 * The permit stays allocated until cerb_permit_free().
 */
CERB_API cerb_status cerb_permit_release(cerb_permit *permit);

/** cerb_permit_fencing_token — the permit's fencing token (as a hold's); 0 for NULL. */
CERB_API uint64_t cerb_permit_fencing_token(const cerb_permit *permit);

/** cerb_permit_state — as cerb_hold_state(). */
CERB_API enum cerb_lock_state cerb_permit_state(const cerb_permit *permit);

/** cerb_permit_valid_ms — as cerb_hold_valid_ms(). */
CERB_API int64_t cerb_permit_valid_ms(const cerb_permit *permit);

/** cerb_permit_count — how many permits this acquisition holds (0 for a bad one). */
CERB_API unsigned cerb_permit_count(const cerb_permit *permit);

/**
 * cerb_permit_on_lost — set the callback told once when the permit is
 * lost, with the promises of cerb_hold_on_lost(). NULL removes it.
 * Returns: CERB_OK; CERB_EINVAL for a bad permit.
 */
CERB_API cerb_status cerb_permit_on_lost(cerb_permit *permit,
                                void (*cb)(cerb_permit *permit, void *ud), void *ud);

/**
 * cerb_permit_free — release the permit if still held (whose status this
 * returns, as cerb_hold_free()) and free it. NULL does nothing.
 */
CERB_API cerb_status cerb_permit_free(cerb_permit *permit);

/* ------------------------------------------------------- read-write locks */

/*
 * A read-write lock (DESIGN.md §16): many readers or one writer, first come
 * first served — a reader that arrives after a waiting writer waits for it,
 * so no writer starves. Reentrant per thread like a lock: a thread may take
 * its read (or write) lock again and unlocks as often. A thread that holds
 * the write lock may also read (counted in its write hold, no server call);
 * it must read_unlock those before write_unlock. A thread that holds a read
 * lock cannot take the write lock (CERB_EINVAL: it would wait for itself).
 * Each hold is fenced, renewed and watched as a lock's. On ZooKeeper the
 * nodes are Curator's InterProcessReadWriteLock's; on Redis and etcd the
 * FIFO layout of docs/rwlock.md.
 */
typedef struct cerb_rwlock cerb_rwlock;

/** Per-rwlock options; CERB_RWLOCK_OPTS_INIT takes the defaults. */
typedef struct cerb_rwlock_opts {
    int64_t lease_ms; /* as cerb_lock_opts.lease_ms; 0 = lock.lease_ms */
} cerb_rwlock_opts;

#define CERB_RWLOCK_OPTS_INIT {0}

/**
 * cerb_rwlock_new — a handle on the read-write lock @name.
 * @name: as a lock name; it should not be shared with another primitive.
 * Returns: CERB_OK; CERB_EINVAL with the reason; CERB_ENOMEM. No I/O.
 * Ownership: free with cerb_rwlock_free() before closing the client.
 * Thread-safety: any thread; holds belong to the thread that took them.
 */
CERB_API cerb_status cerb_rwlock_new(cerb_client *client, const char *name,
                            const cerb_rwlock_opts *opts, cerb_rwlock **out);

/**
 * cerb_rwlock_read_lock — take a read lock for the calling thread, waiting
 * as long as it takes (cerb_lock_lock()).
 * Returns: CERB_OK; CERB_UNAVAILABLE (no engine answers, or the engine in
 * use has no read-write locks); another engine error; CERB_EINVAL.
 */
CERB_API cerb_status cerb_rwlock_read_lock(cerb_rwlock *rw);

/**
 * cerb_rwlock_read_trylock_for — as read_lock, waiting at most @wait_ms
 * (0: one try, CERB_BUSY when a writer holds or waits ahead).
 * Returns: as read_lock, and CERB_BUSY, CERB_TIMEOUT.
 */
CERB_API cerb_status cerb_rwlock_read_trylock_for(cerb_rwlock *rw, int64_t wait_ms);

/**
 * cerb_rwlock_read_unlock — give back one read lock of the calling thread.
 * Returns: CERB_OK; CERB_NOT_OWNER when the thread holds none; CERB_LOST
 * when its hold had been lost; an engine error as cerb_lock_unlock().
 */
CERB_API cerb_status cerb_rwlock_read_unlock(cerb_rwlock *rw);

/**
 * cerb_rwlock_write_lock — take the write lock for the calling thread,
 * waiting as long as it takes.
 * Returns: as read_lock; CERB_EINVAL when the thread holds a read lock.
 */
CERB_API cerb_status cerb_rwlock_write_lock(cerb_rwlock *rw);

/** cerb_rwlock_write_trylock_for — as write_lock, waiting at most @wait_ms. */
CERB_API cerb_status cerb_rwlock_write_trylock_for(cerb_rwlock *rw, int64_t wait_ms);

/**
 * cerb_rwlock_write_unlock — give back one write lock of the calling thread.
 * Returns: as read_unlock; CERB_EINVAL when the last write lock would be
 * given back while reads taken inside it are still held.
 */
CERB_API cerb_status cerb_rwlock_write_unlock(cerb_rwlock *rw);

/**
 * cerb_rwlock_state — the state of the calling thread's hold (its write
 * hold when it has one, else its read hold): as cerb_lock_state();
 * CERB_LOCK_FREE when it holds neither.
 */
CERB_API enum cerb_lock_state cerb_rwlock_state(const cerb_rwlock *rw);

/**
 * cerb_rwlock_fencing_token — the fencing token of the calling thread's
 * hold (write first, then read), 0 when it holds neither.
 */
CERB_API uint64_t cerb_rwlock_fencing_token(const cerb_rwlock *rw);

/**
 * cerb_rwlock_on_lost — set the callback told once for each of this
 * handle's holds (any thread's, read or write) that is lost, with the
 * promises of cerb_lock_on_lost(). NULL removes it.
 * Returns: CERB_OK; CERB_EINVAL for a bad handle.
 */
CERB_API cerb_status cerb_rwlock_on_lost(cerb_rwlock *rw, void (*cb)(cerb_rwlock *rw, void *ud),
                                void *ud);

/**
 * cerb_rwlock_free — free the handle. Returns CERB_BUSY (and frees
 * nothing) while any thread holds or waits for it. NULL does nothing.
 */
CERB_API cerb_status cerb_rwlock_free(cerb_rwlock *rw);

/* ------------------------------------------------------------- inspection */

/**
 * One entry of cerb_lock_inspect(): the holder of a name on one engine, or
 * one of its waiters. Every pointer is owned by the array (freed by
 * cerb_holders_free); `engine` is the engine's static name.
 */
typedef struct cerb_holder_info {
    const char *engine;  /* engine name ("redis", "zk", "etcd", "local") */
    const char *owner;   /* token, node name or key, as the engine stores it */
    int waiting;         /* 0 the holder, 1 a waiter (listed in queue order) */
    uint64_t fence;      /* the engine's counter for this hold; 0 unknown */
    int64_t ttl_ms;      /* lease left; -1 unknown or session-bound */
    const char *detail;  /* session id, lease id, ...; "" when none */
} cerb_holder_info;

/**
 * cerb_lock_inspect — who holds lock @name and who waits for it, read from
 * the servers through each engine's own connections, credentials and wire
 * layout, without changing anything there. Holds of other processes and
 * other client libraries speaking the same layout (redis-py, Curator,
 * etcdctl) are seen as well as ours.
 *
 * @engine: the configured engine to ask; NULL asks every configured engine
 *   that is open, in configuration order (an engine that has not opened —
 *   it did not answer when the client opened and has not since — is left
 *   out; ask it by name to get its error). A named engine that is not open
 *   yet is opened first.
 * @out, @n: set to a malloc'd array of *n entries, per engine the holder
 *   (waiting = 0) first, then the waiters in queue order (waiting = 1);
 *   *out = NULL and *n = 0 when nobody holds the name. `fence` is the
 *   engine's counter (the low 48 bits of the holder's fencing token; 0 for
 *   waiters and when unknown, e.g. a redis-py lock); `ttl_ms` what its lease
 *   has left on the server (-1: no lease, or bound to a session, as on
 *   ZooKeeper); `detail` what else the engine keeps (zk: the session, etcd:
 *   the lease's granted TTL). The answer is one consistent read where the
 *   server allows it (one MULTI on Redis, one range read on etcd).
 * Returns: CERB_OK; CERB_EINVAL for a bad client, a NULL or invalid @name
 *   (on the engine asked, e.g. a '/' on zk and etcd), an @engine that is not
 *   configured, or NULL @out / @n; CERB_UNAVAILABLE when the engine cannot be
 *   inspected ("engine X cannot be inspected") or is not open; or the
 *   engine's error (CERB_EIO, CERB_TIMEOUT, CERB_EPROTO ...), with the reason
 *   in cerb_last_error() prefixed by the engine's name.
 *   Partial results: with @engine NULL every open engine is asked even when
 *   one fails; *out then holds the entries of the engines that answered and
 *   the status is the first failing engine's error. Free *out with
 *   cerb_holders_free() whatever the status.
 * Blocking: each engine's read is bounded by its operation timeout (ZooKeeper:
 *   its connect timeout per round trip; two round trips).
 * Thread-safety: any thread; concurrent with every lock call.
 */
CERB_API cerb_status cerb_lock_inspect(cerb_client *c, const char *name, const char *engine,
                              cerb_holder_info **out, size_t *n);

/** What cerb_inspect() looks at (the values are fixed). */
enum cerb_kind { CERB_KIND_LOCK = 0, CERB_KIND_SEMAPHORE = 2, CERB_KIND_RWLOCK = 3 };

/**
 * cerb_inspect — as cerb_lock_inspect() for a name of @kind: a semaphore's
 * permit holders (detail "permits K of N") and waiters, or a read-write
 * lock's readers and writers (detail "read" / "write"), in queue order.
 * Returns: as cerb_lock_inspect(); CERB_EINVAL for an unknown @kind;
 * CERB_UNAVAILABLE for an engine that has no such primitive.
 */
CERB_API cerb_status cerb_inspect(cerb_client *c, int kind, const char *name, const char *engine,
                         cerb_holder_info **out, size_t *n);

/**
 * cerb_holders_free — free what cerb_lock_inspect() returned (@v and the
 * strings of its @n entries). cerb_holders_free(NULL, 0) does nothing.
 */
CERB_API void cerb_holders_free(cerb_holder_info *v, size_t n);

/* ------------------------------------------------------ idempotency guard */

/*
 * The guard makes an operation that arrives twice (a double click, a
 * redelivered message, a retried RPC) take effect once. Each operation has a
 * record on the active engine, named by the SHA-256 of guard.app, the scope
 * and the key: the first caller claims it and runs the operation; later
 * callers are told it is running (CERB_BUSY) or already done
 * (CERB_DUPLICATE, with the stored result). DESIGN.md §11.
 */
typedef struct cerb_guard cerb_guard;

/** Per-attempt options; zero fields take the configured defaults. */
typedef struct cerb_guard_opts {
    int64_t running_ms; /* an attempt's claim; renewed while the attempt is open,
                           so it only bounds crashed attempts. 0 = config */
    int64_t keep_ms;    /* how long a success keeps duplicates out; 0 = config,
                           -1 = forever */
    int on_unavailable; /* CERB_GUARD_REFUSE or CERB_GUARD_ALLOW; -1 = config */
} cerb_guard_opts;

#define CERB_GUARD_OPTS_INIT {0, 0, -1}

/* What cerb_guard_begin() does when no engine can tell whether the
 * operation ran (guard.on_unavailable, or cerb_guard_opts.on_unavailable). */
enum { CERB_GUARD_REFUSE = 0, CERB_GUARD_ALLOW = 1 };

/* Longest key cerb_guard_begin() accepts, in bytes. The key is hashed, so
 * this bounds only the work done per call. */
#define CERB_GUARD_KEY_MAX (1024 * 1024)

/**
 * cerb_guard_begin — start an attempt at the operation (@scope, @key).
 * @scope: names the kind of operation ("create-order"); lock-name rules
 *        (1–255 bytes, no control characters).
 * @key: any bytes naming this operation (an order id, a message id, a
 *        request body), up to CERB_GUARD_KEY_MAX; may be NULL only when
 *        @key_len is 0.
 * @opts: NULL for the configured defaults.
 * @out: receives a handle for CERB_OK and CERB_DUPLICATE (and a degraded
 *        CERB_OK); NULL otherwise.
 * Returns:
 *  - CERB_OK: run the operation; the attempt's claim on the server is
 *    renewed in the background until cerb_guard_finish() or
 *    cerb_guard_free(). With cerb_guard_degraded(*out) = 1 an engine that
 *    may hold the record could not answer and the policy was
 *    CERB_GUARD_ALLOW: this run is not (or not fully) protected.
 *  - CERB_DUPLICATE: the operation already succeeded within keep_ms; read
 *    the stored result with cerb_guard_result(*out).
 *  - CERB_BUSY: another attempt is running and has not run past its claim.
 *  - CERB_UNAVAILABLE: the engine cannot answer (or has no guard) and the
 *    policy is CERB_GUARD_REFUSE.
 *  - CERB_EINVAL: bad scope, key or options (the reason in
 *    cerb_last_error()); CERB_ENOMEM.
 * Failover: the record is written on the active engine. Every engine this
 * client switched away from (or, when the configuration pins the active
 * engine, every other one; none with failover.switch_grace_ms = 0) may hold
 * records written before the switch, or by processes that have not switched:
 * while it answers it is asked too, with the same claim (a duplicate found
 * there is answered, and its result copied to the active engine; an attempt
 * running there makes this one BUSY; otherwise the claim there is kept,
 * renewed and finished with the attempt, so processes still on that engine
 * see it). One that does not answer may hold the record until keep_ms
 * (this call's or the configuration's, the longer) plus running_ms after it
 * last answered: until then on_unavailable decides.
 * Blocking: one request to the active engine and one to each engine
 * switched from, plus one re-check and retry when an answer was lost, each
 * bounded by the engine's operation timeout.
 * Ownership: free the handle with cerb_guard_free() before closing the
 * client; cerb_client_close() frees handles still open (an unfinished
 * attempt counts as failed).
 * Thread-safety: begin is safe from any thread; one handle is used by one
 * thread at a time (finish, result, free).
 */
CERB_API cerb_status cerb_guard_begin(cerb_client *c, const char *scope,
                             const void *key, size_t key_len,
                             const cerb_guard_opts *opts, cerb_guard **out);

/**
 * cerb_guard_begin_ex — cerb_guard_begin() with a cancel (may be NULL).
 * A cancel fired before the call returns ends it with CERB_INTERRUPTED: no
 * handle is returned and a claim it took is given up on the server (as
 * cerb_guard_finish() with succeeded = 0), so a retry may begin at once.
 * The error text is also kept in cerb_cancel_error().
 */
CERB_API cerb_status cerb_guard_begin_ex(cerb_client *c, const char *scope,
                                const void *key, size_t key_len,
                                const cerb_guard_opts *opts, cerb_cancel *cancel,
                                cerb_guard **out);

/**
 * cerb_guard_finish — end an attempt begun with CERB_OK. @succeeded = 1
 * stores @result (@result_len bytes, at most guard.max_result; @result may
 * be NULL when @result_len is 0) in the record, which keeps duplicates out
 * for keep_ms (or forever); @succeeded = 0 deletes the record at once so a
 * retry may run now. Both compare the attempt's own token on the server.
 * Returns: CERB_OK; CERB_LOST when the attempt's claim was lost (it ran past
 * running_ms without a renewal reaching the server and another attempt took
 * over, or the record was deleted): nothing was changed on the server;
 * CERB_EINVAL for a handle that is not a running attempt (a duplicate's, or
 * one already finished) or a result over guard.max_result (the attempt stays
 * open: finish again or free it); an engine error when the engine did not
 * confirm: after a success the attempt stays open, its claim renewed
 * again, so finish again (a repeated finish of a success that did land
 * answers CERB_OK); after a failure the delete is retried in the
 * background. A degraded attempt finishes with CERB_OK and touches no
 * server. After a switch, the claims on the engines switched from are
 * finished the same way (a success there not confirmed is retried in the
 * background while the claim there lasts); a lost attempt leaves nothing
 * on any of them.
 * Blocking: one request, plus one re-check and retry when its answer was
 * lost, each bounded by the engine's operation timeout — per claim: after
 * a switch, the same again for each engine switched from that the attempt
 * claimed on (one that left a request unanswered just now is left to the
 * background instead).
 * The handle stays valid until cerb_guard_free().
 */
CERB_API cerb_status cerb_guard_finish(cerb_guard *g, int succeeded,
                              const void *result, size_t result_len);

/**
 * cerb_guard_result — the stored result of a CERB_DUPLICATE answer (or, after
 * a successful cerb_guard_finish(), the result this attempt stored).
 * @len: receives the length (0 when there is none); may be NULL.
 * Returns: a pointer owned by the handle, valid until cerb_guard_free();
 * NULL when there is no result or for a bad handle. The bytes are exactly
 * those given to cerb_guard_finish(); a NUL follows them (not counted).
 */
CERB_API const void *cerb_guard_result(const cerb_guard *g, size_t *len);

/**
 * cerb_guard_degraded — 1 when cerb_guard_begin() returned CERB_OK only
 * because the policy was CERB_GUARD_ALLOW: the active engine could not
 * answer (no record protects the run), or an engine switched from that may
 * hold the record could not (the record on the active engine protects
 * against callers there, not against processes still on that engine).
 * 0 otherwise (and for a bad handle).
 */
CERB_API int cerb_guard_degraded(const cerb_guard *g);

/**
 * cerb_guard_state — how a running attempt's claim stands, as a lock's hold
 * does: CERB_LOCK_VALID (its claim, and its claims on engines switched
 * from, are known to be in force), CERB_LOCK_SUSPECT (a renewal failed; the
 * claim still lasts until its conservative local deadline), CERB_LOCK_LOST
 * (a claim passed that deadline unrenewed, or the server said it is gone:
 * another attempt may begin and run the operation — stop if you can; the
 * finish will tell, on the server, whether this attempt's record was taken).
 * LOST is final. The deadline is the send time of the claim's last good
 * renewal + running_ms × (1 − drift) on the boot-time clock, so LOST comes
 * before another attempt can begin, whatever delays the renewals.
 * Returns: CERB_LOCK_FREE for a handle that holds no claim (a duplicate's
 * answer, a degraded attempt, a finished one) and for a bad handle.
 * Never blocks; any thread may call it.
 */
CERB_API enum cerb_lock_state cerb_guard_state(const cerb_guard *g);

/**
 * cerb_guard_on_lost — set the callback told when a running attempt's claim
 * is lost (cerb_guard_state() turns CERB_LOCK_LOST), with the lock
 * callback's rules (cerb_lock_on_lost): called at most once per attempt, on
 * the client's callback thread, with the callback set when the loss was
 * found, no library mutex held and nothing in the library waiting for it;
 * not called once the handle has been freed or the client closed (when
 * cerb_guard_free() runs while it is running, the handle's memory stays
 * valid until it returns, but calls on it give CERB_EINVAL). A claim that
 * passes its deadline unrenewed is also logged at WARN, whatever the cause.
 * NULL removes it.
 * Returns: CERB_OK; CERB_EINVAL for a bad handle.
 */
CERB_API cerb_status cerb_guard_on_lost(cerb_guard *g, void (*cb)(cerb_guard *g, void *ud), void *ud);

/**
 * cerb_guard_free — free a handle. An attempt never finished counts as
 * failed: its record is deleted (compared with its token), so a retry may
 * run at once; if that delete cannot be confirmed, the claim expires after
 * running_ms. cerb_guard_free(NULL) does nothing and returns CERB_OK.
 * Returns: CERB_OK, or the delete's error (the handle is freed anyway).
 * Blocking: the renewal on the wire (one operation timeout) and one delete,
 * with its re-check and retry as for cerb_guard_finish(), per claim.
 */
CERB_API cerb_status cerb_guard_free(cerb_guard *g);

/* ------------------------------------------------------ preparing stores */

/*
 * What cerb_store_init() found or did on one configured engine's store.
 * Spelled as an enum of its own: it is no status (a refusal is not a
 * failure of the call, and "nothing to do" is no success of one).
 */
typedef enum cerb_store_result {
    CERB_STORE_PREPARED, /* prepared by this call */
    CERB_STORE_ALREADY,  /* already prepared: nothing was changed */
    CERB_STORE_NOTHING,  /* the engine needs nothing before its first use */
    CERB_STORE_REFUSED,  /* it shows signs of earlier use: nothing was changed */
    CERB_STORE_FAILED    /* not reached, or an error (see `status`) */
} cerb_store_result;

/** One engine's answer in cerb_store_init() (plain data owned by the array). */
typedef struct cerb_store_report {
    const char *engine;       /* the engine's static name ("redis", ...) */
    cerb_store_result result;
    cerb_status status;       /* CERB_OK; CERB_BUSY when REFUSED; else the error */
    const char *text;         /* one line for a human: the engine's name, what
                                 was found, what was done or why not */
} cerb_store_report;

/* cerb_store_init() flags. */
#define CERB_STORE_INIT_FORCE 0x1u /* prepare even a store that shows signs
                                      of earlier use (see below) */

/**
 * cerb_store_init — prepare the stores of the configured engines for their
 * first use, so that the first grant on a new store does not wait
 * (DESIGN.md §5). Opens no client. Redis: writes the data-loss marker with
 * the server's replication id and no quarantine (single server, the
 * Sentinel master, or each of the 16384 slots of a Cluster on the master
 * serving it), so the first client does not take the new server for one
 * that restarted without its data and grant nothing for a lease. ZooKeeper,
 * etcd and local need nothing (CERB_STORE_NOTHING).
 *
 * Danger: this asserts that the store is new. A Redis server that
 * restarted without its data looks new; preparing it cancels the
 * quarantine that protects the holders from before the loss, and a name
 * one of them still believes it holds may be granted again at once. So a
 * store that shows any sign of earlier use is refused (REFUSED, nothing
 * changed): a marker with another replication id or none, a quarantine in
 * force, a malformed marker, Cerberus keys (any key holding the byte 0x1f)
 * without a marker, keys evicted or a FLUSHALL/FLUSHDB since the server
 * started. Plain keys (a redis-py lock's key, the application's data) are
 * no sign: they cannot be told apart. CERB_STORE_INIT_FORCE prepares such a
 * store anyway: the caller knows that no hold from before is alive. A store
 * already prepared (a marker with the server's replication id and no
 * quarantine in force) is left as it is (CERB_STORE_ALREADY), so calling
 * this twice is harmless.
 *
 * @config_path: as for cerb_client_open(); NULL = defaults (local engine).
 * @flags: 0 or CERB_STORE_INIT_FORCE.
 * @out, @n: set to a malloc'd array of one report per configured engine,
 *   in configuration order (NULL and 0 when the configuration is bad). Free
 *   it with cerb_store_reports_free() whatever the status.
 * Returns: CERB_OK when every store is prepared, already prepared or needs
 *   nothing; otherwise the status of the first store that is not (CERB_BUSY
 *   for a refusal, or its error: CERB_EIO, CERB_TIMEOUT, ...), with its
 *   report's text in cerb_last_error(). Every store is tried either way.
 *   CERB_ECONFIG for a bad file; CERB_EINVAL for NULL @out or @n or an
 *   unknown flag; CERB_ENOMEM.
 * Blocking: per engine, bounded by its connect and operation timeouts
 *   (Redis: a connect and at most eight round trips per master, plus at
 *   most four operation timeouts looking for Cerberus keys when a marker
 *   is missing on a server that holds keys).
 * Thread-safety: any thread; no client needs to exist.
 */
CERB_API cerb_status cerb_store_init(const char *config_path, unsigned flags,
                            cerb_store_report **out, size_t *n);

/**
 * cerb_store_reports_free — free what cerb_store_init() returned.
 * cerb_store_reports_free(NULL, 0) does nothing.
 */
CERB_API void cerb_store_reports_free(cerb_store_report *v, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* CERBERUS_H */
