/*
 * serve_log.c — the one-line log records of `cerberus serve`, on stderr:
 *
 *   2025-06-01T12:00:00.123Z info listen addr=127.0.0.1:0 port=40123 auth=bearer
 *
 * the wall-clock time (UTC, milliseconds), the level, the event, then
 * key=value fields. A value with a space, a quote, a backslash or a byte
 * that is not printable ASCII is written in double quotes, with `"` and `\`
 * escaped and other such bytes as \xNN, so that one record is always one
 * line and a field can be split off by a program. Callers never pass a
 * token or a password: the server's token lives in serve.c alone and is
 * never given to a log call.
 *
 * A record is formatted whole into a buffer and written with one fputs
 * under stdio's own lock (flockfile), so records of concurrent threads do
 * not interleave. Records about limits (a rate-limited request, a refused
 * connection) could come thousands a second: cerb__serve_log_limited keeps
 * for each reason the time of its last record and writes at most one a
 * second, saying how many it held back since.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "serve_internal.h"

static const char *const level_names[] = {"debug", "info", "warning", "error"};

/* The time of the last record of each reason (CLOCK_MONOTONIC, ns) and the
 * records held back since. */
static _Atomic int64_t limited_last_ns[CERB_SERVE_LOG_REASONS];
static _Atomic unsigned long limited_dropped[CERB_SERVE_LOG_REASONS];

/* Appends @s to @buf (at *@n of @cap), quoted when it needs to be. */
static void put_value(char *buf, size_t cap, size_t *n, const char *s)
{
    bool quote = !s[0];

    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p <= ' ' || *p >= 0x7f || *p == '"' || *p == '\\' || *p == '=')
            quote = true;
    if (!quote) {
        int w = snprintf(buf + *n, cap - *n, "%s", s);
        *n += w > 0 ? (size_t)w : 0;
        if (*n >= cap)
            *n = cap - 1;
        return;
    }
    if (*n + 1 < cap)
        buf[(*n)++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && *n + 5 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            buf[(*n)++] = '\\';
            buf[(*n)++] = (char)*p;
        } else if (*p < ' ' || *p >= 0x7f) {
            *n += (size_t)snprintf(buf + *n, cap - *n, "\\x%02x", *p);
        } else {
            buf[(*n)++] = (char)*p;
        }
    }
    if (*n + 1 < cap)
        buf[(*n)++] = '"';
    buf[*n] = '\0';
}

/* Formats and writes one record: @fields is a NULL-terminated list of
 * key, value pairs (values NULL are skipped). */
static void emit(cerb_log_level level, const char *event, const char *const *fields)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    size_t n;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(buf + n, sizeof buf - n, ".%03ldZ %s %s", ts.tv_nsec / 1000000,
                          level_names[level < CERB_LOG_OFF ? level : CERB_LOG_ERROR],
                          event);
    for (size_t i = 0; fields[i] && n + 4 < sizeof buf; i += 2) {
        if (!fields[i + 1])
            continue;
        n += (size_t)snprintf(buf + n, sizeof buf - n, " %s=", fields[i]);
        if (n >= sizeof buf)
            n = sizeof buf - 1;
        put_value(buf, sizeof buf, &n, fields[i + 1]);
    }
    flockfile(stderr);
    fputs(buf, stderr);
    fputc('\n', stderr);
    fflush(stderr);
    funlockfile(stderr);
}

void cerb__serve_logv(cerb_log_level level, const char *event, const char *const *fields)
{
    emit(level, event, fields);
}

void cerb__serve_log_limited(enum cerb__serve_log_reason reason, const char *event,
                             const char *const *fields)
{
    int64_t now = cerb__serve_now_ns(), last = atomic_load(&limited_last_ns[reason]);
    unsigned long dropped;
    char held[32];
    const char *f[32];
    size_t i = 0;

    if (last != 0 && now - last < 1000000000) {
        atomic_fetch_add(&limited_dropped[reason], 1);
        return;
    }
    /* One thread wins the second; the others count themselves held back. */
    if (!atomic_compare_exchange_strong(&limited_last_ns[reason], &last, now)) {
        atomic_fetch_add(&limited_dropped[reason], 1);
        return;
    }
    dropped = atomic_exchange(&limited_dropped[reason], 0);
    for (; fields[i] && i + 4 < sizeof f / sizeof f[0]; i += 2) {
        f[i] = fields[i];
        f[i + 1] = fields[i + 1];
    }
    snprintf(held, sizeof held, "%lu", dropped);
    f[i++] = "held_back";
    f[i++] = dropped ? held : NULL;
    f[i] = NULL;
    emit(CERB_LOG_WARN, event, f);
}

/* The library's own lines (cerb_log_set), as records of event `library`. */
void cerb__serve_log_library(cerb_log_level level, const char *line, void *ud)
{
    (void)ud;
    emit(level, "library", (const char *const[]){"msg", line, NULL});
}
