/*
 * alloc.h — every allocation of the library goes through here, so tests can
 * fail the Nth allocation and check that each failure path cleans up (the
 * SQLite anomaly-testing idea). Outside tests the hook costs one relaxed load.
 */
#ifndef CERB_ALLOC_H
#define CERB_ALLOC_H

#include <stddef.h>

void *cerb__malloc(size_t n);
void *cerb__calloc(size_t count, size_t n);
void *cerb__realloc(void *p, size_t n);
char *cerb__strdup(const char *s);
/* A copy of n bytes with a NUL after them (never NULL for n = 0); NULL when
 * out of memory. */
void *cerb__memdup0(const void *p, size_t n);
void cerb__free(void *p);

/*
 * Test hook: the `n`th allocation from now (1-based) and, when `persistent`,
 * every later one fails. n = 0 disables. Returns how many allocations failed
 * since the last call.
 */
long cerb__alloc_fail_after(long n, int persistent);

#endif
