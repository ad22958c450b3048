/*
 * error.c — thread-local last-error text, bounded, set only on failure.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[CERB_ERROR_MAX];

const char *cerb_last_error(void) { return last_error; }

/* Every message is stored through cerb__redact_urls: an endpoint quoted in
 * it may carry a password. */
static void store(const char *msg)
{
    if (strstr(msg, "://"))
        cerb__redact_urls(msg, last_error, sizeof last_error);
    else
        snprintf(last_error, sizeof last_error, "%.*s", CERB_ERROR_MAX - 1, msg);
}

cerb_status cerb__error_set(cerb_status st, const char *fmt, ...)
{
    char msg[CERB_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    store(msg);
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
    joined[CERB_ERROR_MAX - 1] = '\0';
    store(joined);
}

void cerb__error_copy(char *buf, size_t len)
{
    if (len == 0)
        return;
    snprintf(buf, len, "%s", last_error);
}

/* Where a URL's authority ends: at its path, query, fragment, or at a
 * character that cannot be in it (a quote, a space, the end). */
static size_t authority_len(const char *a)
{
    return strcspn(a, "/?#\"' \t\n,;()<>[]{}");
}

const char *cerb__redact_urls(const char *in, char *buf, size_t len)
{
    size_t o = 0;
    const char *p = in;

    if (len == 0)
        return buf;
    /* Appends n bytes of s, cut to the buffer. */
#define PUT(s, n)                                         \
    do {                                                  \
        size_t k_ = (n);                                  \
        if (k_ > len - 1 - o)                             \
            k_ = len - 1 - o;                             \
        memcpy(buf + o, (s), k_);                         \
        o += k_;                                          \
    } while (0)
    for (;;) {
        const char *u = strstr(p, "://");
        if (!u) {
            PUT(p, strlen(p));
            break;
        }
        const char *a = u + 3; /* the authority */
        size_t al = authority_len(a);
        const char *at = NULL;
        for (size_t i = 0; i < al; i++)
            if (a[i] == '@')
                at = a + i; /* the last '@': a password may hold one */
        PUT(p, (size_t)(a - p));
        if (at) {
            const char *colon = memchr(a, ':', (size_t)(at - a));
            if (colon)
                PUT(a, (size_t)(colon - a) + 1); /* "user:" */
            PUT("***", 3);
        }
        p = at ? at : a;
    }
#undef PUT
    buf[o] = '\0';
    return buf;
}
