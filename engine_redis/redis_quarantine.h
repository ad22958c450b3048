/*
 * redis_quarantine.h — saying that a server is quarantined (redis_marker.h):
 * a wait of up to a lease before any grant there must never be silent.
 *
 * Once per quarantine, not per name or per slot: an instance (a single
 * server, the Sentinel master, one node of a Cluster) warns when a
 * quarantine begins there that no earlier warning covers, and keeps quiet
 * (a debug line, counted) about those that begin while the one it warned
 * about is still in force — in a Cluster, each slot's marker is made or
 * checked at the slot's first use, one after another.
 */
#ifndef CERB_REDIS_QUARANTINE_H
#define CERB_REDIS_QUARANTINE_H

#include "redis_conn.h"

/* Why the instance waits. */
enum redis_q_why {
    REDIS_Q_MISSING,   /* it found no marker and made one */
    REDIS_Q_FOUND,     /* it found one in force (another client's) */
    REDIS_Q_HISTORY,   /* the replication id changed: it raised it */
    REDIS_Q_NO_REPLID, /* the marker recorded no replication id: raised */
    REDIS_Q_LOSS       /* the marker it knew is gone: holds told LOST */
};

/*
 * A quarantine until server time qend_ms was found or begun, server time
 * now_ms (both from the same server); slot is the cluster slot or -1;
 * detail adds to the reason (the replication ids, the marker gone; may be
 * NULL). Warns or keeps quiet as above; nothing when it is already over.
 * Takes e->marker_mu.
 */
void cerb__redis_quarantine_say(cerb_engine *e, enum redis_q_why why, int slot,
                                long long qend_ms, long long now_ms, const char *detail);

#endif
