/*
 * clock.h — monotonic time and deadlines. Every wait in the library is
 * bounded by a deadline on CLOCK_MONOTONIC in nanoseconds, computed once at
 * entry; the wall clock appears only in log timestamps.
 */
#ifndef CERB_CLOCK_H
#define CERB_CLOCK_H

#include <stdint.h>

#define CERB_NS_PER_MS INT64_C(1000000)
#define CERB_DEADLINE_NEVER INT64_MAX

/* Monotonic nanoseconds since an arbitrary epoch. */
int64_t cerb_monotime(void);
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
