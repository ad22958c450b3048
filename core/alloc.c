/*
 * alloc.c — allocation wrappers with a fail-after-N hook for OOM tests.
 *
 * The counter is process-wide and atomic: an OOM loop in a test sets "fail
 * the Nth allocation", runs an operation, checks it failed cleanly (no leak,
 * CERB_ENOMEM or a retry), and steps N until the operation succeeds.
 */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown; /* 0 = off */
static atomic_int fail_persistent;
static atomic_long fail_count;

static int should_fail(void)
{
    long c = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (c == 0)
        return 0;
    c = atomic_fetch_sub(&fail_countdown, 1);
    if (c == 1) {
        if (atomic_load(&fail_persistent))
            atomic_store(&fail_countdown, 1); /* every later call too */
        atomic_fetch_add(&fail_count, 1);
        return 1;
    }
    if (c <= 0) { /* raced past zero: keep it off */
        atomic_store(&fail_countdown, 0);
        return 0;
    }
    return 0;
}

long cerb__alloc_fail_after(long n, int persistent)
{
    atomic_store(&fail_persistent, persistent);
    atomic_store(&fail_countdown, n);
    return atomic_exchange(&fail_count, 0);
}

void *cerb__malloc(size_t n) { return should_fail() ? NULL : malloc(n ? n : 1); }

void *cerb__calloc(size_t count, size_t n)
{
    return should_fail() ? NULL : calloc(count ? count : 1, n ? n : 1);
}

void *cerb__realloc(void *p, size_t n)
{
    return should_fail() ? NULL : realloc(p, n ? n : 1);
}

char *cerb__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = cerb__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void *cerb__memdup0(const void *p, size_t n)
{
    char *d = cerb__malloc(n + 1);
    if (d) {
        if (n)
            memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

void cerb__free(void *p) { free(p); }
