/*
 * log.c — formatted log lines to a user callback or stderr. The sink and
 * level are read atomically so cerb_log_set() is safe while background
 * threads log; the sink itself is called with no mutex held. Wall-clock
 * timestamps appear here and nowhere else.
 */
#include "internal_posix.h"

#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "sync.h"

static cerb_mutex sink_mu = {PTHREAD_MUTEX_INITIALIZER};
static void (*sink_cb)(cerb_log_level, const char *, void *);
static void *sink_ud;
static atomic_int min_level = CERB_LOG_WARN;

cerb_status cerb_log_set(void (*cb)(cerb_log_level, const char *, void *),
                         void *ud, cerb_log_level level)
{
    if ((int)level < CERB_LOG_DEBUG || level > CERB_LOG_OFF)
        return cerb__error_set(CERB_EINVAL, "log level %d out of range", (int)level);
    cerb__mutex_lock(&sink_mu);
    sink_cb = cb;
    sink_ud = ud;
    atomic_store(&min_level, (int)level);
    cerb__mutex_unlock(&sink_mu);
    return CERB_OK;
}

int cerb__log_enabled(cerb_log_level level)
{
    return (int)level >= atomic_load_explicit(&min_level, memory_order_relaxed) &&
           level < CERB_LOG_OFF;
}

void cerb__log(cerb_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    char line[1024];
    va_list ap;

    if (!cerb__log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* An endpoint in the line may carry a password (URL userinfo). */
    char clean[sizeof line];
    const char *out = strstr(line, "://") ? cerb__redact_urls(line, clean, sizeof clean) : line;

    /* The sink is application code: call it with no mutex held (it may
     * log through us, or call the library). A line formatted just as
     * cerb_log_set() swaps the sink may still reach the previous one. */
    cerb__mutex_lock(&sink_mu);
    void (*cb)(cerb_log_level, const char *, void *) = sink_cb;
    void *ud = sink_ud;
    cerb__mutex_unlock(&sink_mu);
    if (cb) {
        cb(level, out, ud);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ cerberus %s: %s\n",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, names[level], out);
    }
}
