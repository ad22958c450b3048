/*
 * metrics.h — latency histograms the core fills on the lock path and
 * cerb_metrics_text() exports (core/metrics.c). Lock-free: one atomic add
 * per bucket, count and sum, so observing costs a few relaxed atomics.
 */
#ifndef CERB_METRICS_H
#define CERB_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

/* Upper bounds (le) of the buckets, in ns; the last bucket is +Inf. */
#define CERB_HISTO_BUCKETS 16

struct cerb_histo {
    atomic_uint_fast64_t bucket[CERB_HISTO_BUCKETS + 1]; /* not cumulative */
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t sum_ns;
};

enum cerb_histo_kind { CERB_HISTO_WAIT, CERB_HISTO_HOLD };

/* Count one observation of `ns` (negative counts as 0). */
void cerb__histo_observe(struct cerb_histo *h, enum cerb_histo_kind kind, int64_t ns);

#endif
