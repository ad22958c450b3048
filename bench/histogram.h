/*
 * histogram.h — the bench's latency histogram: log-bucketed, fixed size,
 * one per thread (recording takes no lock), merged after the threads join.
 */
#ifndef CERB_BENCH_HISTOGRAM_H
#define CERB_BENCH_HISTOGRAM_H

#include <stdint.h>

/*
 * 2^BENCH_HIST_SUB_BITS buckets per power of two: 32 buckets give a relative
 * bucket width of at most 1/32 (about 3 %), reported at the bucket midpoint,
 * so a percentile is within ~1.6 % of the true sample. Values 0..63 ns are
 * exact. The index of the largest int64 is (62 - 5) * 32 + 63 = 1887.
 */
#define BENCH_HIST_SUB_BITS 5
#define BENCH_HIST_BUCKETS 1888

struct bench_hist {
    uint64_t n;        /* samples recorded */
    int64_t min_ns;    /* INT64_MAX while empty */
    int64_t max_ns;    /* 0 while empty */
    double sum_ns;     /* for the mean */
    uint64_t count[BENCH_HIST_BUCKETS];
};

/* Empty the histogram. */
void bench_hist_init(struct bench_hist *h);

/*
 * Record one latency in nanoseconds (negative values count as 0).
 * Thread-safety: none; each thread records into its own histogram.
 */
void bench_hist_record(struct bench_hist *h, int64_t ns);

/* Add every sample of @from to @into (after the recording threads joined). */
void bench_hist_merge(struct bench_hist *into, const struct bench_hist *from);

/*
 * The value at quantile @q (0 < q <= 1), e.g. 0.99 for p99: the midpoint of
 * the bucket holding the ceil(q * n)-th smallest sample, clamped to the
 * recorded min and max so p100 is exactly the max.
 * Returns: nanoseconds; 0 for an empty histogram.
 */
int64_t bench_hist_quantile(const struct bench_hist *h, double q);

/* Mean in nanoseconds; 0 for an empty histogram. */
double bench_hist_mean(const struct bench_hist *h);

#endif
