/*
 * breaker.c — the per-engine circuit breaker (DESIGN.md §5; the contract and
 * the state diagram are in breaker.h).
 *
 * Algorithm. In CLOSED every result goes into the sliding window (window.c)
 * and a success resets the run of failures in a row. A failure checks, in
 * this order, the run (`consecutive_failures`) and then the rate over the
 * window (`failure_rate`%, but only once `min_calls` calls are in the window,
 * so that two failures out of three calls at startup do not trip). Tripping
 * sets the open period: open_ms × 2^reopens capped at open_max_ms, then moved
 * uniformly within ±jitter_percent by a splitmix64 generator seeded at init
 * (never past the cap, never below 1 ms). `reopens` counts HALF_OPEN → OPEN
 * transitions since the last close, which is what makes a flapping engine
 * stay out for longer and longer instead of bouncing every open_ms. The
 * OPEN → HALF_OPEN step is driven by time alone and is applied at the top of
 * every entry point; in HALF_OPEN only probe results count, a run of
 * half_open_successes good ones closes (window discarded, reopens reset) and
 * a single failed one re-opens. Forced states are a separate field laid over
 * the automatic machine, so lifting a force never resurrects a stale OPEN.
 *
 * Every transition goes through brk_record(), which compares the reported
 * state before and after and fills from/to/reason/changed_ms and the
 * counters; each entry point makes at most one transition so that the caller,
 * reading the struct after a `true` return, logs every one of them.
 */
#include "breaker.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config.h"

/* Open periods are clamped to about 35 years so that the jitter arithmetic
 * and now + period cannot overflow. */
#define BRK_PERIOD_LIMIT_MS (INT64_C(1) << 40)
/* Doubling past 2^40 is meaningless; stop counting re-opens there. */
#define BRK_REOPENS_LIMIT 64

void cerb__breaker_cfg_from(const struct cerb_failover_config *fc,
                            struct cerb_breaker_cfg *out)
{
    memset(out, 0, sizeof *out);
    out->consecutive_failures = fc->consecutive_failures;
    out->failure_rate = fc->failure_rate;
    out->window_ms = fc->window_ms;
    out->min_calls = fc->min_calls;
    out->open_ms = fc->open_ms;
    /* open_ms may be configured above the fixed 60 s cap; the cap then
     * simply means "no doubling". */
    out->open_max_ms = fc->open_ms > CERB_BREAKER_OPEN_MAX_MS ? fc->open_ms
                                                             : CERB_BREAKER_OPEN_MAX_MS;
    out->half_open_successes = fc->half_open_successes;
    out->jitter_percent = CERB_BREAKER_JITTER_PERCENT;
}

/* splitmix64: tiny, full-period, and good enough to spread open periods. */
static uint64_t brk_rand(struct cerb_breaker *b)
{
    uint64_t z = (b->rng += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static int64_t brk_clamp(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* open_ms doubled `reopens` times, capped at open_max_ms. */
static int64_t brk_base_period(const struct cerb_breaker *b)
{
    int64_t p = b->cfg.open_ms;
    for (int i = 0; i < b->reopens && p < b->cfg.open_max_ms; i++)
        p *= 2; /* p < open_max_ms <= 2^40 here: no overflow */
    return p < b->cfg.open_max_ms ? p : b->cfg.open_max_ms;
}

/* base ± jitter_percent, uniform, never above the cap nor below 1 ms. */
static int64_t brk_jittered(struct cerb_breaker *b, int64_t base)
{
    int64_t span = base * b->cfg.jitter_percent / 100; /* base <= 2^40 */
    int64_t p = base;
    if (span > 0)
        p = base - span + (int64_t)(brk_rand(b) % (uint64_t)(2 * span + 1));
    return brk_clamp(p, 1, b->cfg.open_max_ms);
}

__attribute__((format(printf, 4, 5)))
static bool brk_record(struct cerb_breaker *b, enum cerb_breaker_state from,
                       int64_t now_ms, const char *fmt, ...)
{
    enum cerb_breaker_state to = cerb__breaker_state(b);
    if (to == from)
        return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->reason, sizeof b->reason, fmt, ap);
    va_end(ap);
    b->from = from;
    b->to = to;
    b->changed_ms = now_ms;
    b->transitions++;
    if (to == CERB_BREAKER_OPEN)
        b->opens++;
    return true;
}

/* Enter OPEN; a re-open (from HALF_OPEN) doubles the period. */
static void brk_open(struct cerb_breaker *b, int64_t now_ms, bool reopen)
{
    if (reopen && b->reopens < BRK_REOPENS_LIMIT)
        b->reopens++;
    b->state = CERB_BREAKER_OPEN;
    b->failures_in_row = 0;
    b->good_probes = 0;
    b->open_period_ms = brk_jittered(b, brk_base_period(b));
    b->open_until_ms = now_ms + b->open_period_ms;
}

/* Enter CLOSED afresh: the results that tripped the breaker are history. */
static void brk_reset_closed(struct cerb_breaker *b, int64_t now_ms)
{
    b->state = CERB_BREAKER_CLOSED;
    b->failures_in_row = 0;
    b->good_probes = 0;
    b->reopens = 0;
    b->open_until_ms = 0;
    cerb__window_reset(&b->window, now_ms);
}

void cerb__breaker_init(struct cerb_breaker *b, const struct cerb_breaker_cfg *cfg,
                        uint64_t seed, int64_t now_ms)
{
    memset(b, 0, sizeof *b);
    b->cfg = *cfg;
    struct cerb_breaker_cfg *c = &b->cfg;
    c->window_ms = brk_clamp(c->window_ms, 1, BRK_PERIOD_LIMIT_MS);
    c->open_ms = brk_clamp(c->open_ms, 1, BRK_PERIOD_LIMIT_MS);
    c->open_max_ms = brk_clamp(c->open_max_ms, c->open_ms, BRK_PERIOD_LIMIT_MS);
    if (c->min_calls < 1)
        c->min_calls = 1;
    if (c->half_open_successes < 1)
        c->half_open_successes = 1;
    c->jitter_percent = (int)brk_clamp(c->jitter_percent, 0, 100);
    b->rng = seed;
    b->force = CERB_BREAKER_CLOSED;
    b->from = b->to = CERB_BREAKER_CLOSED;
    b->changed_ms = now_ms;
    cerb__window_init(&b->window, c->window_ms, now_ms);
    brk_reset_closed(b, now_ms);
}

enum cerb_breaker_state cerb__breaker_state(const struct cerb_breaker *b)
{
    return b->force != CERB_BREAKER_CLOSED ? b->force : b->state;
}

bool cerb__breaker_poll(struct cerb_breaker *b, int64_t now_ms)
{
    if (b->force != CERB_BREAKER_CLOSED || b->state != CERB_BREAKER_OPEN ||
        now_ms < b->open_until_ms)
        return false;
    b->state = CERB_BREAKER_HALF_OPEN;
    b->good_probes = 0;
    return brk_record(b, CERB_BREAKER_OPEN, now_ms, "open period elapsed");
}

bool cerb__breaker_allow(struct cerb_breaker *b, int64_t now_ms)
{
    cerb__breaker_poll(b, now_ms);
    enum cerb_breaker_state s = cerb__breaker_state(b);
    return s == CERB_BREAKER_CLOSED || s == CERB_BREAKER_DISABLED;
}

bool cerb__breaker_on_success(struct cerb_breaker *b, int64_t now_ms,
                              enum cerb_breaker_kind kind)
{
    if (cerb__breaker_poll(b, now_ms))
        return true; /* the result was sent while OPEN: not counted */
    if (b->force == CERB_BREAKER_FORCED_OPEN)
        return false;
    if (b->force == CERB_BREAKER_DISABLED || b->state == CERB_BREAKER_CLOSED) {
        cerb__window_add(&b->window, now_ms, false);
        b->failures_in_row = 0;
        return false;
    }
    if (b->state != CERB_BREAKER_HALF_OPEN || kind != CERB_PROBE)
        return false;
    if (++b->good_probes < b->cfg.half_open_successes)
        return false;
    int n = b->good_probes;
    brk_reset_closed(b, now_ms);
    return brk_record(b, CERB_BREAKER_HALF_OPEN, now_ms, "%d good probe%s", n,
                      n == 1 ? "" : "s");
}

bool cerb__breaker_on_call_successes(struct cerb_breaker *b, int64_t now_ms, uint64_t n)
{
    if (n == 0)
        return false;
    if (cerb__breaker_poll(b, now_ms))
        return true; /* sent while OPEN: not counted */
    if (b->force == CERB_BREAKER_FORCED_OPEN)
        return false;
    if (b->force == CERB_BREAKER_DISABLED || b->state == CERB_BREAKER_CLOSED) {
        cerb__window_add_n(&b->window, now_ms, n, 0);
        b->failures_in_row = 0;
    }
    return false;
}

bool cerb__breaker_on_failure(struct cerb_breaker *b, int64_t now_ms,
                              enum cerb_breaker_kind kind)
{
    if (cerb__breaker_poll(b, now_ms))
        return true; /* the result was sent while OPEN: not counted */
    if (b->force == CERB_BREAKER_FORCED_OPEN)
        return false;
    if (b->force == CERB_BREAKER_DISABLED || b->state == CERB_BREAKER_CLOSED) {
        cerb__window_add(&b->window, now_ms, true);
        if (b->failures_in_row < INT_MAX)
            b->failures_in_row++;
        if (b->force == CERB_BREAKER_DISABLED)
            return false; /* counted, never trips */
        int run = b->failures_in_row;
        if (b->cfg.consecutive_failures > 0 && run >= b->cfg.consecutive_failures) {
            brk_open(b, now_ms, false);
            return brk_record(b, CERB_BREAKER_CLOSED, now_ms,
                              "%d consecutive failure%s", run, run == 1 ? "" : "s");
        }
        uint64_t calls, fails;
        cerb__window_counts(&b->window, now_ms, &calls, &fails);
        if (b->cfg.failure_rate > 0 && b->cfg.failure_rate <= 100 &&
            calls >= (uint64_t)b->cfg.min_calls &&
            fails * 100 >= (uint64_t)b->cfg.failure_rate * calls) {
            brk_open(b, now_ms, false);
            return brk_record(b, CERB_BREAKER_CLOSED, now_ms,
                              "failure rate %d%% over %llu calls",
                              (int)(fails * 100 / calls), (unsigned long long)calls);
        }
        return false;
    }
    if (b->state != CERB_BREAKER_HALF_OPEN || kind != CERB_PROBE)
        return false;
    brk_open(b, now_ms, true);
    return brk_record(b, CERB_BREAKER_HALF_OPEN, now_ms, "probe failed");
}

bool cerb__breaker_force(struct cerb_breaker *b, enum cerb_breaker_state to,
                         int64_t now_ms)
{
    if (to != CERB_BREAKER_CLOSED && to != CERB_BREAKER_DISABLED &&
        to != CERB_BREAKER_FORCED_OPEN)
        return false;
    enum cerb_breaker_state from = cerb__breaker_state(b);
    b->force = to;
    brk_reset_closed(b, now_ms);
    return brk_record(b, from, now_ms, "forced");
}

int64_t cerb__breaker_due_ms(const struct cerb_breaker *b)
{
    if (b->force == CERB_BREAKER_CLOSED && b->state == CERB_BREAKER_OPEN)
        return b->open_until_ms;
    return INT64_MAX;
}

const char *cerb__breaker_state_name(enum cerb_breaker_state s)
{
    switch (s) {
    case CERB_BREAKER_CLOSED:
        return "closed";
    case CERB_BREAKER_OPEN:
        return "open";
    case CERB_BREAKER_HALF_OPEN:
        return "half_open";
    case CERB_BREAKER_DISABLED:
        return "disabled";
    case CERB_BREAKER_FORCED_OPEN:
        return "forced_open";
    }
    return "unknown";
}
