/*
 * log.h — the library's log: levels, one sink (callback or stderr). Engines
 * route their client libraries' logging here too.
 */
#ifndef CERB_LOG_H
#define CERB_LOG_H

#include "cerberus.h"
#include "error.h"

void cerb__log(cerb_log_level level, const char *fmt, ...) CERB_PRINTF(2, 3);
/* Cheap check before formatting something expensive. */
int cerb__log_enabled(cerb_log_level level);

#define CERB_LOG_D(...) cerb__log(CERB_LOG_DEBUG, __VA_ARGS__)
#define CERB_LOG_I(...) cerb__log(CERB_LOG_INFO, __VA_ARGS__)
#define CERB_LOG_W(...) cerb__log(CERB_LOG_WARN, __VA_ARGS__)
#define CERB_LOG_E(...) cerb__log(CERB_LOG_ERROR, __VA_ARGS__)

#endif
