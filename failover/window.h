/*
 * window.h — a sliding failure-rate window: how many calls an engine got and
 * how many of them failed over the last `window_ms`, kept in a ring of fixed
 * buckets so that every update costs O(1) and the struct needs no allocation.
 *
 * The window is pure data: the caller passes the time in (monotonic
 * milliseconds) and holds whatever mutex protects the struct. Granularity is
 * one bucket (window_ms / CERB_WINDOW_BUCKETS): a result recorded at time t is
 * counted while now < t + window_ms − bucket_ms for sure, and never once
 * now ≥ t + window_ms. A time earlier than one already seen (a caller that
 * read the clock before taking its mutex) counts in the newest bucket.
 */
#ifndef CERB_WINDOW_H
#define CERB_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#define CERB_WINDOW_BUCKETS 10

struct cerb_window {
    int64_t bucket_ms;   /* width of one bucket, >= 1 */
    int nbuckets;        /* buckets in use, 1 .. CERB_WINDOW_BUCKETS */
    int64_t head;        /* number (now / bucket_ms, floored) of the newest bucket */
    uint64_t calls[CERB_WINDOW_BUCKETS];    /* per bucket, ring indexed by number */
    uint64_t failures[CERB_WINDOW_BUCKETS];
    uint64_t total_calls;                   /* sums over the live buckets */
    uint64_t total_failures;
};

/*
 * Set up an empty window of `window_ms` (values < 1 are taken as 1; a window
 * shorter than CERB_WINDOW_BUCKETS ms uses 1 ms buckets) starting at now_ms.
 */
void cerb__window_init(struct cerb_window *w, int64_t window_ms, int64_t now_ms);

/* Forget every result; the window restarts empty at now_ms. */
void cerb__window_reset(struct cerb_window *w, int64_t now_ms);

/* Record one call at now_ms, failed or not. O(1). */
void cerb__window_add(struct cerb_window *w, int64_t now_ms, bool failed);

/* Record @calls calls at now_ms, @failures of them failed (clamped to
 * @calls). O(1) however many: successes batched by a busy client are folded
 * in at once. */
void cerb__window_add_n(struct cerb_window *w, int64_t now_ms, uint64_t calls,
                        uint64_t failures);

/*
 * Calls and failures within the window as of now_ms (results that have aged
 * out are dropped first, which is why this takes a non-const window). Either
 * out pointer may be NULL. O(1).
 */
void cerb__window_counts(struct cerb_window *w, int64_t now_ms,
                         uint64_t *calls, uint64_t *failures);

#endif /* CERB_WINDOW_H */
