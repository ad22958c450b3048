/*
 * redis_marker.h — noticing that the server lost its data (a restart
 * without persistence, FLUSHALL, eviction), and the quarantine after it.
 *
 * The engine keeps one key on the server, the marker
 *   M = redis.prefix + "\x1f" + "cerberus"   string "<id> <qend_ms>", no TTL
 * which no lock name can reach (REDIS_SEP, see redis_scripts.h). Every
 * instance learns M's value at open and sends it with every script; a
 * script that finds M different (gone, or re-made after a loss) changes
 * nothing and answers "L". The instance then reads (or makes) the new
 * marker, tells every hold it has LOST at once (env->event), and goes on
 * under the new value. A missing marker is made with a quarantine end
 * `qend` in server time: no grant before it, so a holder elsewhere that
 * has not talked to the server since the loss is past its own lease (and
 * told LOST by its deadline) before anyone is granted its name.
 * redis_marker.c says how long the quarantine is.
 */
#ifndef CERB_REDIS_MARKER_H
#define CERB_REDIS_MARKER_H

#include <stdbool.h>

#include "redis_conn.h"

/* The marker value an operation sends, copied at its start. */
struct redis_marker_view {
    char value[REDIS_MARKER_MAX];
    char qend[24]; /* the quarantine's end, server ms, decimal */
};

/* A hold of lease_ms is being acquired: the quarantine covers it from now
 * on (a per-lock lease, or lock.lease_ms raised by a reload). Lock-free. */
void cerb__redis_marker_note_lease(cerb_engine *e, int64_t lease_ms);

/* Build the marker key and the quarantine length (open; no I/O). */
cerb_status cerb__redis_marker_init(cerb_engine *e);
void cerb__redis_marker_destroy(cerb_engine *e);

/* Read or make the marker on c and remember it (open). */
cerb_status cerb__redis_marker_fetch(cerb_engine *e, struct redis_conn *c);

/* Copy the marker value to send with a script. */
void cerb__redis_marker_get(cerb_engine *e, struct redis_marker_view *v);

/* Is r a script's "the marker is not what you sent" answer? */
bool cerb__redis_is_lost(const redisReply *r);

/*
 * A script sent with `sent` answered "L": learn the new marker (on c when
 * it is usable, else on a pool connection) and, the first time for this
 * value, report CERB_EV_LOST for every hold of the instance. CERB_OK when
 * the marker is known again.
 */
cerb_status cerb__redis_marker_lost(cerb_engine *e, struct redis_conn *c,
                                    const struct redis_marker_view *sent);

#endif
