/*
 * redis_init.h — preparing a Redis deployment for Cerberus' first use
 * (`cerberus init`, core/store_init.h): the data-loss markers written with
 * the server's replication id and no quarantine (redis_marker.h), so the
 * first client does not take a new server for one that lost its data.
 */
#ifndef CERB_REDIS_INIT_H
#define CERB_REDIS_INIT_H

#include <stdbool.h>
#include <stddef.h>

#include "redis_conn.h"
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
#define REDIS_INIT_SCAN_COUNT "1000" /* SCAN's COUNT hint per round trip */

/* What a marker is, as read in step 1. */
enum redis_mk_state { REDIS_MK_MISSING, REDIS_MK_PREPARED, REDIS_MK_USED };

struct redis_init_master {
    cerb_engine *e;          /* the instance whose connection c is */
    struct redis_conn *c;
    bool pooled;             /* c is e's pool connection (cluster) */
    char where[300];
    int *slots;              /* cluster: the slots it serves, ascending */
    size_t n;                /* its markers: slots, or 1 */
    unsigned char *st;       /* per marker: enum redis_mk_state */
    char replid[48];
    long long replicas, evicted, flushes, dbsize;
    long long now_ms;        /* server time at step 1 */
    char sha[41];
    size_t missing, prepared, used;
    char why[512];           /* the first sign of earlier use seen */
    size_t made, already, forced, late;
    long long acked;
};

struct redis_init_job {
    const struct cerb_config *cfg;
    const struct cerb_redis_config *rc;
    bool force;
    cerb_engine *top;        /* cluster: the routing instance */
    cerb_engine *bare;       /* single, sentinel: an instance to connect with */
    struct redis_init_master *m;
    size_t nm;
    char where[300];
};

/* Step 1 (redis_init_master.c): INFO, DBSIZE, TIME, the write script
 * loaded and every marker read and judged, in one round trip. */
cerb_status cerb__redis_init_read(struct redis_init_job *j, struct redis_init_master *m);
/* Step 2: where markers are missing, the other signs of earlier use. */
cerb_status cerb__redis_init_look(struct redis_init_job *j, struct redis_init_master *m);
/* Steps 3 and 4: write the markers not prepared (with force, the used ones
 * too) as marker id `id`, then WAIT for the replicas. */
cerb_status cerb__redis_init_write(struct redis_init_job *j, struct redis_init_master *m,
                                   const char *id);

#endif
