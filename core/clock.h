/*
 * clock.h — monotonic time and deadlines. Every wait in the library is
 * bounded by a deadline on cerb_monotime() in nanoseconds, computed once at
 * entry; the wall clock appears only in log timestamps. That clock is
 * CLOCK_BOOTTIME (it counts time suspended, as the servers' leases do), so
 * lease deadlines, grants' sent_ns and lock state all stay true across a
 * suspend (clock.c).
 */
#ifndef CERB_CLOCK_H
#define CERB_CLOCK_H

#include <stdint.h>

#define CERB_NS_PER_MS INT64_C(1000000)
#define CERB_DEADLINE_NEVER INT64_MAX

/* Nanoseconds since boot, suspend included (CLOCK_BOOTTIME): never steps
 * back, never stops. Every deadline and grant time is on this clock. */
int64_t cerb_monotime(void);
/* Test hook: make the machine look suspended for `ms` — the clock that runs
 * during suspend (CLOCK_BOOTTIME) jumps ahead, CLOCK_MONOTONIC does not.
 * Process-wide; for tests only. */
void cerb__clock_test_suspend(int64_t ms);
/* CLOCK_BOOTTIME nanoseconds (plus the simulated suspends). */
int64_t cerb__boottime(void);
/* Test hooks for the deterministic simulation (tests/sim/): `now` replaces
 * the clock (every cerb_monotime() reads it), `nap` replaces cerb__nap_ms
 * (so a retry back-off or a gate's pause passes simulated time instead of
 * sleeping). NULL restores the real one. Process-wide: set them before any
 * client is opened and leave them while clients run. Not for production. */
void cerb__clock_set_hooks(int64_t (*now)(void), void (*nap)(int64_t ms));
/* Seed the calling thread's jitter generator (cerb__rand_below), so that a
 * simulation replays the same back-offs and jitter for the same seed. */
void cerb__rand_seed(uint64_t seed);
/* Deadline `ms` from now; a negative ms is CERB_DEADLINE_NEVER. */
int64_t cerb__deadline_in(int64_t ms);
/* Milliseconds left until deadline, rounded up, >= 0; INT64_MAX for never. */
int64_t cerb__ms_left(int64_t deadline_ns);
/* Random integer in [0, n) from a thread-local generator (for jitter). */
uint64_t cerb__rand_below(uint64_t n);
/* Full-jitter backoff for attempt k (0-based): rand[0, min(max, base*2^k)]. */
int64_t cerb__backoff_ms(int attempt, int64_t base_ms, int64_t max_ms);
/* Sleep for ms (retry backoff between attempts only; never to synchronise). */
void cerb__nap_ms(int64_t ms);

#endif
