/*
 * breaker.h — the circuit breaker of one engine (DESIGN.md §5): a pure state
 * machine that is handed the time and never reads a clock, takes no lock and
 * allocates nothing, so every path is unit-testable with a fake clock.
 *
 *   CLOSED ──(consecutive_failures hard failures in a row, or failure rate
 *     │       ≥ failure_rate% over window_ms with ≥ min_calls calls)──► OPEN
 *   OPEN ──(open period elapsed)──► HALF_OPEN
 *   HALF_OPEN ──(half_open_successes good probes in a row)──► CLOSED
 *   HALF_OPEN ──(one failed probe)──► OPEN, with the open period doubled
 *
 * The open period is open_ms after a trip from CLOSED and doubles on each
 * re-open from HALF_OPEN, capped at open_max_ms, then moved by ±jitter_percent
 * (never above open_max_ms) from a small PRNG seeded at init, so a test that
 * fixes the seed sees the same periods every run while the breakers of many
 * clients, seeded differently, do not probe in step. Closing discards the
 * window and resets the period to open_ms.
 *
 * Forced states sit on top of the automatic machine: DISABLED routes as if
 * CLOSED and never trips (results are still counted in the window and the
 * failure run); FORCED_OPEN never allows a call. Forcing, including forcing
 * CLOSED (= "no force"), restarts the automatic machine CLOSED with a fresh
 * window, failure run and open period.
 *
 * Contract with the callers (the selector and the prober):
 *  - Locking: none here. The caller embeds the struct and holds its own mutex
 *    around every call.
 *  - Time: `now_ms` is monotonic milliseconds (cerb_monotime() / CERB_NS_PER_MS); it may
 *    be a little stale (read before the mutex) but is never wall time.
 *  - What to report: only HARD engine failures — connection refused or reset,
 *    I/O timeout, protocol or server error, no leader. Never CERB_BUSY, and
 *    never a timeout the caller asked for (trylock, wait_ms passed): those
 *    say the engine works. The caller filters; the breaker counts whatever it
 *    is given. A success is a call the engine answered; a BUSY answer may be
 *    reported as one, a caller's own timeout is best not reported at all.
 *  - Routing: cerb__breaker_allow() says whether a REAL call may go to the
 *    engine: yes in CLOSED and DISABLED, no in OPEN, HALF_OPEN and
 *    FORCED_OPEN. In HALF_OPEN only probes decide; the selector does not route
 *    real calls there, so results of kind CERB_CALL that arrive in HALF_OPEN
 *    (calls started before the trip, renewals of old holds) are ignored, as
 *    are all results that arrive in OPEN.
 *  - Time-driven transition: OPEN → HALF_OPEN happens inside whichever of
 *    cerb__breaker_poll/allow/on_success/on_failure is first called at or
 *    after the due time (cerb__breaker_due_ms()). The prober should poll each
 *    breaker before a probe round so the half-open phase starts on time. A
 *    probe result that itself performs that transition is not counted (it
 *    was sent while OPEN), which keeps the rule "one call, at most one
 *    transition" below.
 *  - Transitions: every function that can change the state returns true when
 *    the state reported by cerb__breaker_state() changed. A call makes at most
 *    one transition, and the struct then holds it in `from`, `to`, `reason`,
 *    `changed_ms`, with `transitions` (and `opens` for entries into OPEN)
 *    counting them all, so the caller can log and count every one.
 */
#ifndef CERB_BREAKER_H
#define CERB_BREAKER_H

#include <stdbool.h>
#include <stdint.h>

#include "cerberus.h"
#include "window.h"

struct cerb_failover_config;

/* Not config keys (DESIGN.md §5 fixes them): the cap of the doubling open
 * period, and the jitter on it. */
#define CERB_BREAKER_OPEN_MAX_MS 60000
#define CERB_BREAKER_JITTER_PERCENT 20

struct cerb_breaker_cfg {
    int consecutive_failures; /* trip after this many in a row; <= 0: off */
    int failure_rate;         /* trip at >= this percent; <= 0 or > 100: off */
    int64_t window_ms;        /* span of the failure-rate window */
    int min_calls;            /* calls in the window before the rate counts */
    int64_t open_ms;          /* first open period */
    int64_t open_max_ms;      /* cap of the doubling (raised to open_ms if lower) */
    int half_open_successes;  /* good probes in a row to close (>= 1) */
    int jitter_percent;       /* open period ± this percent, 0 .. 100 */
};

/* What a reported result came from. */
enum cerb_breaker_kind {
    CERB_CALL, /* a real lock operation routed to the engine */
    CERB_PROBE /* a health probe from the prober */
};

#define CERB_BREAKER_REASON_MAX 64

/*
 * One engine's breaker. Plain data embedded by the caller; read the fields
 * below "last transition" directly, change the struct only through the
 * functions.
 */
struct cerb_breaker {
    struct cerb_breaker_cfg cfg;   /* as given, with out-of-range values fixed */
    enum cerb_breaker_state state; /* automatic: CLOSED, OPEN or HALF_OPEN */
    enum cerb_breaker_state force; /* CLOSED (no force), DISABLED, FORCED_OPEN */
    int failures_in_row;           /* hard failures in a row (CLOSED/DISABLED) */
    int good_probes;               /* good probes in a row (HALF_OPEN) */
    int reopens;                   /* re-opens since the last close */
    int64_t open_period_ms;        /* length of the current/last open period */
    int64_t open_until_ms;         /* OPEN: when HALF_OPEN is due */
    struct cerb_window window;
    uint64_t rng;                  /* PRNG state for the jitter */

    /* Last transition, for the caller to log; valid once transitions > 0. */
    enum cerb_breaker_state from, to; /* as cerb__breaker_state() reports them */
    char reason[CERB_BREAKER_REASON_MAX]; /* "3 consecutive failures", ... */
    int64_t changed_ms;            /* when (init time before any transition) */
    uint64_t transitions;          /* all transitions since init */
    uint64_t opens;                /* transitions whose `to` is OPEN */
};

/*
 * Breaker settings from the failover section of the config: the keys as
 * they are, open_max_ms = max(CERB_BREAKER_OPEN_MAX_MS, open_ms) and
 * jitter_percent = CERB_BREAKER_JITTER_PERCENT.
 */
void cerb__breaker_cfg_from(const struct cerb_failover_config *fc,
                            struct cerb_breaker_cfg *out);

/*
 * Start CLOSED, not forced, with an empty window, at now_ms. `seed` drives
 * the jitter (any value; the same seed gives the same open periods). Values
 * out of range in `cfg` are fixed up: window_ms, open_ms, min_calls and
 * half_open_successes to at least 1, open_max_ms to at least open_ms,
 * jitter_percent into 0 .. 100, window_ms and the periods to at most 2^40 ms.
 * No allocation: a breaker is discarded by simply dropping the struct.
 */
void cerb__breaker_init(struct cerb_breaker *b, const struct cerb_breaker_cfg *cfg,
                        uint64_t seed, int64_t now_ms);

/* The state to report and route by: the forced state if any, else the
 * automatic one as of the last call (no time is applied here). */
enum cerb_breaker_state cerb__breaker_state(const struct cerb_breaker *b);

/*
 * Apply the passage of time: OPEN → HALF_OPEN once now_ms reaches the due
 * time. Returns true when the state changed.
 */
bool cerb__breaker_poll(struct cerb_breaker *b, int64_t now_ms);

/*
 * May a real call go to this engine now? Polls first (so it may move OPEN →
 * HALF_OPEN; compare `transitions` to notice). True in CLOSED and DISABLED.
 */
bool cerb__breaker_allow(struct cerb_breaker *b, int64_t now_ms);

/* A call or probe the engine answered. Returns true when the state changed
 * (HALF_OPEN → CLOSED, or the time-driven OPEN → HALF_OPEN). */
bool cerb__breaker_on_success(struct cerb_breaker *b, int64_t now_ms,
                              enum cerb_breaker_kind kind);

/* @n successful real calls at once (the client batches them between two
 * mutex holds): the same as n cerb__breaker_on_success(CERB_CALL) calls, in
 * O(1). Returns true when the state changed (only the time-driven OPEN →
 * HALF_OPEN can: calls never close a breaker). */
bool cerb__breaker_on_call_successes(struct cerb_breaker *b, int64_t now_ms, uint64_t n);

/* A hard failure of a call or probe (see the contract above for what counts).
 * Returns true when the state changed (CLOSED → OPEN, HALF_OPEN → OPEN, or the
 * time-driven OPEN → HALF_OPEN). */
bool cerb__breaker_on_failure(struct cerb_breaker *b, int64_t now_ms,
                              enum cerb_breaker_kind kind);

/*
 * Force a state: CERB_BREAKER_DISABLED, CERB_BREAKER_FORCED_OPEN, or
 * CERB_BREAKER_CLOSED to lift any force. Every force restarts the automatic
 * machine CLOSED with a fresh window. Returns true when the reported state
 * changed (reason "forced"); false as well for OPEN or HALF_OPEN, which cannot
 * be forced (nothing is done then).
 */
bool cerb__breaker_force(struct cerb_breaker *b, enum cerb_breaker_state to,
                         int64_t now_ms);

/* When the next time-driven transition is due (OPEN: the end of the open
 * period), or INT64_MAX when none is pending. For the prober's scheduling. */
int64_t cerb__breaker_due_ms(const struct cerb_breaker *b);

/* "closed", "open", "half_open", "disabled", "forced_open" (the config and
 * CLI spelling), or "unknown". Static strings. */
const char *cerb__breaker_state_name(enum cerb_breaker_state s);

#endif /* CERB_BREAKER_H */
