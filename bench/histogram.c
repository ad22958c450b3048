/*
 * histogram.c — log-bucketed latency histogram (the HdrHistogram idea that
 * redis-benchmark uses, cut down to what the bench needs).
 *
 * Algorithm. A value v (ns) below 2^(SUB_BITS + 1) = 64 has its own bucket.
 * Above that, let e = floor(log2 v) (e >= 6): the top SUB_BITS + 1 bits of v,
 * m = v >> (e - SUB_BITS), lie in [32, 64), and the bucket is
 * (e - SUB_BITS) * 32 + m. Every power of two is thus split into 32 equal
 * buckets, so the bucket width is at most 1/32 of the value wherever the
 * value is. The same formula also holds for 32 <= v < 64 (e = 5, shift 0),
 * which makes the inverse simple: for an index i >= 32, e = i / 32 + 4 and
 * the bucket starts at (i % 32 + 32) << (e - 5) and is 1 << (e - 5) wide.
 *
 * Recording is an index computation and an increment into the caller's own
 * histogram: no lock, no atomic, no allocation. Threads merge theirs once
 * they have joined, by adding the count arrays.
 */
#include "histogram.h"

#include <string.h>

#define SUB_COUNT (1 << BENCH_HIST_SUB_BITS)

_Static_assert((62 - BENCH_HIST_SUB_BITS) * SUB_COUNT + 2 * SUB_COUNT - 1 ==
                   BENCH_HIST_BUCKETS - 1,
               "BENCH_HIST_BUCKETS must cover every positive int64");

static unsigned bucket_of(uint64_t v)
{
    if (v < 2 * SUB_COUNT)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = e - BENCH_HIST_SUB_BITS;
    return shift * SUB_COUNT + (unsigned)(v >> shift);
}

/* Lowest value of bucket i and its width. */
static void bucket_range(unsigned i, uint64_t *lo, uint64_t *width)
{
    if (i < SUB_COUNT) {
        *lo = i;
        *width = 1;
        return;
    }
    unsigned shift = i / SUB_COUNT - 1; /* = e - SUB_BITS */
    *lo = (uint64_t)(i % SUB_COUNT + SUB_COUNT) << shift;
    *width = UINT64_C(1) << shift;
}

void bench_hist_init(struct bench_hist *h)
{
    memset(h, 0, sizeof *h);
    h->min_ns = INT64_MAX;
}

void bench_hist_record(struct bench_hist *h, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    h->count[bucket_of((uint64_t)ns)]++;
    h->n++;
    h->sum_ns += (double)ns;
    if (ns < h->min_ns)
        h->min_ns = ns;
    if (ns > h->max_ns)
        h->max_ns = ns;
}

void bench_hist_merge(struct bench_hist *into, const struct bench_hist *from)
{
    for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++)
        into->count[i] += from->count[i];
    into->n += from->n;
    into->sum_ns += from->sum_ns;
    if (from->min_ns < into->min_ns)
        into->min_ns = from->min_ns;
    if (from->max_ns > into->max_ns)
        into->max_ns = from->max_ns;
}

int64_t bench_hist_quantile(const struct bench_hist *h, double q)
{
    if (h->n == 0)
        return 0;
    if (q >= 1.0)
        return h->max_ns;
    /* rank = ceil(q * n), at least 1: the rank-th smallest sample. */
    double want = q * (double)h->n;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want)
        rank++;
    if (rank == 0)
        rank = 1;

    uint64_t seen = 0;
    for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) {
        seen += h->count[i];
        if (seen >= rank) {
            uint64_t lo, width;
            bucket_range(i, &lo, &width);
            int64_t mid = (int64_t)(lo + (width - 1) / 2);
            if (mid < h->min_ns)
                mid = h->min_ns;
            if (mid > h->max_ns)
                mid = h->max_ns;
            return mid;
        }
    }
    return h->max_ns; /* not reached: the counts add up to n */
}

double bench_hist_mean(const struct bench_hist *h)
{
    return h->n ? h->sum_ns / (double)h->n : 0.0;
}
