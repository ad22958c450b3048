/*
 * error.c — thread-local last-error text, bounded, set only on failure.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[CERB_ERROR_MAX];

const char *cerb_last_error(void) { return last_error; }

cerb_status cerb__error_set(cerb_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

void cerb__error_prefix(const char *fmt, ...)
{
    char old[CERB_ERROR_MAX];
    char pre[CERB_ERROR_MAX];
    va_list ap;

    memcpy(old, last_error, sizeof old);
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* Join in a buffer large enough for both, then cut to size. */
    char joined[2 * CERB_ERROR_MAX + 2];
    snprintf(joined, sizeof joined, "%s: %s", pre, old);
    snprintf(last_error, sizeof last_error, "%.*s", CERB_ERROR_MAX - 1, joined);
}

void cerb__error_copy(char *buf, size_t len)
{
    if (len == 0)
        return;
    snprintf(buf, len, "%s", last_error);
}
