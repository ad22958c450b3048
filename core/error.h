/*
 * error.h — the thread-local "why" behind a failing status.
 *
 * A status drives control flow; the text in cerb_last_error() is for humans.
 * cerb__error_set() formats into a bounded thread-local buffer and returns
 * the status it is given, so a failure path reads
 * `return cerb__error_set(CERB_EINVAL, "name is empty");`.
 */
#ifndef CERB_ERROR_H
#define CERB_ERROR_H

#include "cerberus.h"

#define CERB_ERROR_MAX 512

#if defined(__GNUC__)
#define CERB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CERB_PRINTF(a, b)
#endif

/* Set the calling thread's last error; returns `st` unchanged. */
cerb_status cerb__error_set(cerb_status st, const char *fmt, ...)
    CERB_PRINTF(2, 3);
/* Prepend "prefix: " to the current last error (context on the way up). */
void cerb__error_prefix(const char *fmt, ...) CERB_PRINTF(1, 2);
/* Copy of the current last error into buf (for keeping it across calls). */
void cerb__error_copy(char *buf, size_t len);

/*
 * Copy `in` into buf (cut to len, always terminated) with the userinfo of
 * every URL in it redacted: the password of "scheme:" "//user:pass@host"
 * becomes "***", and userinfo without a ':' (a token) becomes "***" whole.
 * Every error (cerb__error_set, _prefix) and every log line goes through
 * it, so a password written into an endpoint never reaches either.
 * Returns buf.
 */
const char *cerb__redact_urls(const char *in, char *buf, size_t len);

#endif
