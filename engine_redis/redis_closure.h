/*
 * redis_closure.h — the closure record (DESIGN.md §5, core/engine.h
 * version 4) of a single or Sentinel server:
 *   C = redis.prefix + "\x1fcerberus\x1fclosure"   "<epoch> closed|open", no TTL
 * next to the marker, where no lock name reaches. The acquire script reads
 * it when the client sends its epoch (redis_scripts.c) and refuses the
 * grant it closes; the release script hands nothing over while it says
 * closed. One key per server, permanent (§5a.6).
 *
 * A Cluster keeps no record: a script reads only keys of its own slot, so
 * the record would be 16 384 keys; the core keeps asking a cluster it left
 * instead (closure_get answers CERB_UNAVAILABLE).
 */
#ifndef CERB_REDIS_CLOSURE_H
#define CERB_REDIS_CLOSURE_H

#include <stdbool.h>
#include <stddef.h>

#include "redis_conn.h"

/* Build C from the marker key (after cerb__redis_marker_init; no I/O). A
 * cluster's routing instance gets none. */
cerb_status cerb__redis_closure_init(cerb_engine *e);
void cerb__redis_closure_destroy(cerb_engine *e);

/* Parse a stored record; false when it is not "<epoch> closed|open". */
bool cerb__redis_closure_parse(const char *s, size_t n, cerb_closure *out);

cerb_status cerb__redis_op_closure_get(cerb_engine *e, cerb_closure *out);
cerb_status cerb__redis_op_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now);

#endif
