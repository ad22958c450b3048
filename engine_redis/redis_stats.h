/*
 * redis_stats.h — internal counters of one Redis engine instance, for the
 * bench (acquire calls and wake-ups per acquisition, round trips per cycle)
 * and the integration tests. Not API: the layout may change at any time.
 *
 * Counters are monotonic since open(), updated with relaxed atomics, and read
 * one at a time (a snapshot is not atomic as a whole).
 */
#ifndef CERB_REDIS_STATS_H
#define CERB_REDIS_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine.h"

struct cerb_redis_stats {
    uint64_t round_trips;       /* requests (or pipelines) sent and answered or failed */
    uint64_t connects;          /* connections opened (command, blocking, probe) */
    uint64_t acquire_calls;     /* runs of the acquire script, all reasons */
    uint64_t acquire_polls;     /* of which timer-driven re-checks while queued */
    uint64_t grants;            /* acquire() returned CERB_OK */
    uint64_t handoffs_received; /* of which the lock came by a direct hand-off */
    uint64_t handoffs_sent;     /* scripts that handed the lock to a waiter */
    uint64_t wakes_sent;        /* "try again" wake-ups pushed (non-fair release) */
    uint64_t wakeups;           /* messages a waiter popped from its wake list */
    uint64_t cancel_wakeups;    /* waits broken by cancel() */
    uint64_t leaves;            /* runs of the leave script (timeout, interrupt, error) */
    uint64_t noscript_reloads;  /* scripts reloaded after NOSCRIPT */
    uint64_t data_losses;       /* server data losses noticed (redis_marker.h) */
    uint64_t master_switches;   /* sentinel mode: the master address changed */
};

/* The engine's live counters (embedded in struct cerb_engine). */
struct redis_counters {
    atomic_uint_fast64_t round_trips, connects, acquire_calls, acquire_polls, grants,
        handoffs_received, handoffs_sent, wakes_sent, wakeups, cancel_wakeups, leaves,
        noscript_reloads, data_losses, master_switches;
};

/* Add every counter of `c` to `sum` (the routing instances of cluster and
 * Redlock mode sum their nodes'). */
void cerb__redis_counters_add(struct redis_counters *sum, struct redis_counters *c);

#define REDIS_COUNT(e, field) \
    atomic_fetch_add_explicit(&(e)->stats.field, 1, memory_order_relaxed)

/*
 * Copy the counters of `e`, which must be an instance of the "redis" engine
 * (cerb__redis_engine_ops). Thread-safety: any thread, while e is open.
 */
void cerb__redis_stats(cerb_engine *e, struct cerb_redis_stats *out);

#endif
