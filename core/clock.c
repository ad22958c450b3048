/*
 * clock.c — the library's clock, deadline arithmetic and jitter.
 *
 * cerb_monotime() reads CLOCK_BOOTTIME, not CLOCK_MONOTONIC: a lease on a
 * server keeps running while this machine is suspended, and CLOCK_MONOTONIC
 * stops then, so a deadline measured on it would let a hold look VALID for
 * up to a lease after the machine wakes, while the server has given the name
 * to someone else. CLOCK_BOOTTIME is monotonic too (never stepped) and
 * counts the suspend. Condition variables cannot wait on it; sync.c turns a
 * deadline on this clock into one on CLOCK_MONOTONIC at each wait, so a
 * wait that spans a suspend ends at most one wake-up late.
 *
 * The simulation (tests/sim/) replaces the clock and the nap with its own
 * (cerb__clock_set_hooks): every time the library reads goes through
 * cerb_monotime(), and every pause between attempts through cerb__nap_ms(),
 * so simulated time passes exactly as the schedule says.
 */
#include "internal_posix.h"

#include "clock.h"

#include <stdatomic.h>
#include <time.h>

static atomic_int_fast64_t suspended_ns;

/* The simulation's clock and nap (cerb__clock_set_hooks); NULL = real. */
static int64_t (*_Atomic now_hook)(void);
static void (*_Atomic nap_hook)(int64_t ms);

void cerb__clock_set_hooks(int64_t (*now)(void), void (*nap)(int64_t ms))
{
    atomic_store(&now_hook, now);
    atomic_store(&nap_hook, nap);
}

void cerb__clock_test_suspend(int64_t ms)
{
    atomic_fetch_add(&suspended_ns, ms * CERB_NS_PER_MS);
}

int64_t cerb__boottime(void)
{
    struct timespec ts;
#ifdef CLOCK_BOOTTIME
    clock_gettime(CLOCK_BOOTTIME, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts); /* no boot-time clock: best we have */
#endif
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + atomic_load(&suspended_ns);
}

int64_t cerb_monotime(void)
{
    int64_t (*hook)(void) = atomic_load_explicit(&now_hook, memory_order_relaxed);
    if (hook)
        return hook();
    return cerb__boottime();
}

int64_t cerb__deadline_in(int64_t ms)
{
    if (ms < 0 || ms > INT64_MAX / CERB_NS_PER_MS / 2)
        return CERB_DEADLINE_NEVER;
    return cerb_monotime() + ms * CERB_NS_PER_MS;
}

int64_t cerb__ms_left(int64_t deadline_ns)
{
    if (deadline_ns == CERB_DEADLINE_NEVER)
        return INT64_MAX;
    int64_t left = deadline_ns - cerb_monotime();
    if (left <= 0)
        return 0;
    return (left + CERB_NS_PER_MS - 1) / CERB_NS_PER_MS;
}

/* xorshift64*, seeded per thread from the clock and the thread's address. */
static _Thread_local uint64_t rng_state;

void cerb__rand_seed(uint64_t seed)
{
    rng_state = seed | 1;
}

uint64_t cerb__rand_below(uint64_t n)
{
    if (n == 0)
        return 0;
    if (rng_state == 0) {
        rng_state = (uint64_t)cerb_monotime() ^ (uint64_t)(uintptr_t)&rng_state;
        rng_state |= 1;
    }
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (rng_state * UINT64_C(2685821657736338717)) % n;
}

int64_t cerb__backoff_ms(int attempt, int64_t base_ms, int64_t max_ms)
{
    int64_t cap = base_ms;
    for (int i = 0; i < attempt && cap < max_ms; i++)
        cap *= 2;
    if (cap > max_ms)
        cap = max_ms;
    if (cap <= 0)
        return 0;
    return (int64_t)cerb__rand_below((uint64_t)cap + 1);
}

void cerb__nap_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    void (*hook)(int64_t) = atomic_load_explicit(&nap_hook, memory_order_relaxed);
    if (hook) {
        hook(ms);
        return;
    }
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0)
        ;
}
