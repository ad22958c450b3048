/*
 * multilock.c — all-or-nothing acquisition of several locks.
 *
 * Locks are taken in name order (bytewise), so two callers asking for
 * overlapping sets in different orders cannot deadlock; one shared deadline
 * bounds the whole call. On any failure the locks already taken are released
 * in reverse order and the failure is returned. Release runs in reverse name
 * order and releases every lock even when one fails.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"

/* EINVAL for element @i, which is not a valid lock (or its client is the
 * parent's, in a forked child: then the text says so). */
static cerb_status element_refused(const cerb_lock *l, size_t i)
{
    char what[64];
    snprintf(what, sizeof what, "multilock: element %zu is not a valid lock", i);
    return cerb__lock_refused(l, what);
}

static int by_name(const void *a, const void *b)
{
    const cerb_lock *la = *(cerb_lock *const *)a, *lb = *(cerb_lock *const *)b;
    return strcmp(la->slot->name, lb->slot->name);
}

static cerb_status sorted_copy(cerb_lock **locks, size_t n, cerb_lock ***out)
{
    if (!locks && n > 0)
        return cerb__error_set(CERB_EINVAL, "multilock: locks is NULL");
    for (size_t i = 0; i < n; i++)
        if (!cerb__lock_ok(locks[i]))
            return element_refused(locks[i], i);
    cerb_lock **v = cerb__malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    if (n)
        memcpy(v, locks, n * sizeof *v);
    qsort(v, n, sizeof *v, by_name);
    *out = v;
    return CERB_OK;
}

cerb_status cerb_multilock_lock(cerb_lock **locks, size_t n, int64_t wait_ms)
{
    cerb_lock **v = NULL;
    cerb_status st = sorted_copy(locks, n, &v);
    if (st != CERB_OK)
        return st;
    int64_t deadline = cerb__deadline_in(wait_ms);
    size_t got = 0;
    for (; got < n; got++) {
        if (wait_ms == 0)
            st = cerb__lock_acquire(v[got], 0, false, true);
        else
            st = cerb__lock_acquire(v[got], deadline, true, false);
        if (st != CERB_OK)
            break;
    }
    if (st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        while (got-- > 0)
            cerb_lock_unlock(v[got]);
        cerb__error_set(st, "%s", why);
    }
    cerb__free(v);
    return st;
}

/* Order by (name, position) so equal names still have a strict order. */
static int before(cerb_lock **v, size_t i, size_t j)
{
    int c = strcmp(v[i]->slot->name, v[j]->slot->name);
    return c < 0 || (c == 0 && i < j);
}

cerb_status cerb_multilock_unlock(cerb_lock **locks, size_t n)
{
    cerb_status st, first = CERB_OK;

    if (!locks && n > 0)
        return cerb__error_set(CERB_EINVAL, "multilock: locks is NULL");
    for (size_t i = 0; i < n; i++)
        if (!cerb__lock_ok(locks[i]))
            return element_refused(locks[i], i);
    /* Reverse name order by selection, without allocating: a release path
     * must not be able to fail for want of memory. n is small. */
    size_t prev = n;
    for (size_t done = 0; done < n; done++) {
        size_t pick = n;
        for (size_t i = 0; i < n; i++) {
            if (prev < n && !before(locks, i, prev))
                continue; /* already released */
            if (pick == n || before(locks, pick, i))
                pick = i;
        }
        st = cerb_lock_unlock(locks[pick]);
        if (st != CERB_OK && first == CERB_OK)
            first = st;
        prev = pick;
    }
    return first;
}
