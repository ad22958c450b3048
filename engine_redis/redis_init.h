/*
 * redis_init.h — preparing a Redis deployment for Cerberus' first use
 * (`cerberus init`, core/store_init.h): the data-loss markers written with
 * the server's replication id and no quarantine (redis_marker.h), so the
 * first client does not take a new server for one that lost its data.
 */
#ifndef CERB_REDIS_INIT_H
#define CERB_REDIS_INIT_H

#include <stddef.h>

#include "store_init.h"

/* The store table (builtin.c lists it). */
extern const struct cerb_store_ops cerb__redis_store_ops;

/*
 * How long init may take per master, in operation timeouts: its round
 * trips (one to read, one to write, one WAIT) and the look for Cerberus
 * keys (REDIS_INIT_SCAN_OPS) when a marker is missing on a server with
 * keys. Each connect adds the connect timeout.
 */
#define REDIS_INIT_SCAN_OPS 4
#define REDIS_INIT_SCAN_COUNT 1000 /* SCAN's COUNT hint per round trip */

#endif
