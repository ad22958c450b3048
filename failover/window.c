/*
 * window.c — sliding failure-rate window in fixed buckets.
 *
 * Time is cut into buckets of bucket_ms; bucket number n = floor(t / bucket_ms)
 * lives in ring slot n mod nbuckets. `head` is the number of the newest bucket
 * seen. Moving to a later time clears the slots of the buckets that were
 * skipped over (at most nbuckets of them, so an update is O(1) however long
 * the window sat idle) and subtracts their counts from the running totals, so
 * that reading the rate never has to sum the ring. A bucket number is never
 * moved backwards: a late time counts in the head bucket, which keeps the
 * totals consistent when callers race to the mutex with slightly stale
 * timestamps.
 */
#include "window.h"

#include <string.h>

/* Floor division for a possibly negative time (a fake clock may start < 0). */
static int64_t win_bucket_of(const struct cerb_window *w, int64_t now_ms)
{
    int64_t q = now_ms / w->bucket_ms;
    if (now_ms % w->bucket_ms != 0 && now_ms < 0)
        q--;
    return q;
}

static int win_slot(const struct cerb_window *w, int64_t bucket)
{
    int64_t s = bucket % w->nbuckets;
    return (int)(s < 0 ? s + w->nbuckets : s);
}

/* Drop the buckets that fall out of the window at now_ms. */
static void win_advance(struct cerb_window *w, int64_t now_ms)
{
    int64_t n = win_bucket_of(w, now_ms);
    if (n <= w->head)
        return;
    /* Unsigned difference: exact as long as the true gap fits, and it is
     * only compared against nbuckets. */
    uint64_t gap = (uint64_t)n - (uint64_t)w->head;
    if (gap >= (uint64_t)w->nbuckets) {
        memset(w->calls, 0, sizeof w->calls);
        memset(w->failures, 0, sizeof w->failures);
        w->total_calls = 0;
        w->total_failures = 0;
    } else {
        for (uint64_t i = 1; i <= gap; i++) {
            int s = win_slot(w, w->head + (int64_t)i);
            w->total_calls -= w->calls[s];
            w->total_failures -= w->failures[s];
            w->calls[s] = 0;
            w->failures[s] = 0;
        }
    }
    w->head = n;
}

void cerb__window_init(struct cerb_window *w, int64_t window_ms, int64_t now_ms)
{
    if (window_ms < 1)
        window_ms = 1;
    w->nbuckets = window_ms < CERB_WINDOW_BUCKETS ? (int)window_ms : CERB_WINDOW_BUCKETS;
    w->bucket_ms = window_ms / w->nbuckets;
    cerb__window_reset(w, now_ms);
}

void cerb__window_reset(struct cerb_window *w, int64_t now_ms)
{
    memset(w->calls, 0, sizeof w->calls);
    memset(w->failures, 0, sizeof w->failures);
    w->total_calls = 0;
    w->total_failures = 0;
    w->head = win_bucket_of(w, now_ms);
}

void cerb__window_add(struct cerb_window *w, int64_t now_ms, bool failed)
{
    cerb__window_add_n(w, now_ms, 1, failed ? 1 : 0);
}

void cerb__window_add_n(struct cerb_window *w, int64_t now_ms, uint64_t calls,
                        uint64_t failures)
{
    if (failures > calls)
        failures = calls;
    win_advance(w, now_ms);
    int s = win_slot(w, w->head);
    w->calls[s] += calls;
    w->total_calls += calls;
    w->failures[s] += failures;
    w->total_failures += failures;
}

void cerb__window_counts(struct cerb_window *w, int64_t now_ms,
                         uint64_t *calls, uint64_t *failures)
{
    win_advance(w, now_ms);
    if (calls)
        *calls = w->total_calls;
    if (failures)
        *failures = w->total_failures;
}
