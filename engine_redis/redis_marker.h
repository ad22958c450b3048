/*
 * redis_marker.h — noticing that the server lost its data (a restart
 * without persistence, FLUSHALL, eviction), and the quarantine after it.
 *
 * The engine keeps one key on the server, the marker
 *   M = redis.prefix + "\x1f" + "cerberus"   "<id> <qend_ms>[ <replid>]", no TTL
 * which no lock name can reach (REDIS_SEP, see redis_scripts.h). Every
 * instance learns M's id at open and sends it with every script; a
 * script that finds another id (gone, or re-made after a loss) changes
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
#include <stddef.h>

#include "redis_conn.h"

/* The marker an operation sends (its id), copied at its start. */
struct redis_marker_view {
    char value[REDIS_MARKER_MAX]; /* the id: what scripts compare */
    char qend[24];                /* the quarantine's end, server ms, decimal */
};

/*
 * The Lua lines every script starts with: M (KEYS[K]) must hold the id the
 * instance sent (ARGV[A]) followed by a space, else "L". The quarantine end
 * is read from M on the server, not sent: a change of history (below) raises
 * it without changing the id, so every client respects it at once.
 */
#define LUA_MARKER_CHECK(K, A)                                                   \
    "local mk = redis.call('GET', KEYS[" #K "])\n"                              \
    "if not mk or string.find(mk, ARGV[" #A "], 1, true) ~= 1 or "               \
    "string.byte(mk, #ARGV[" #A "] + 1) ~= 32 then return 'L' end\n"

/*
 * A connection learnt the server's replication id (INFO replication,
 * master_replid). It changes when the server's history is replaced — a
 * restart (from a snapshot or log that may miss the last writes), or a
 * replica promoted in a failover (which may miss them too) — while the
 * marker, restored or replicated with the data, stays: holds written after
 * the snapshot, or not yet replicated, are gone without a trace. The first
 * instance to see a new replid records it in M and raises M's quarantine to
 * its longest lease + drift from now — also when the marker recorded no
 * replid yet: it may have come back from a snapshot older than the grants
 * made since (`cerberus init` writes the replid with the marker of a new
 * server, redis_init.h). Holds that survived renew as usual; those that
 * did not are told LOST by their renewal or their deadline, before anyone
 * is granted their names. No-op when replid is "" or already seen.
 */
cerb_status cerb__redis_marker_history(cerb_engine *e, struct redis_conn *c, const char *replid);

/* A hold of lease_ms is being acquired: the quarantine covers it from now
 * on (a per-lock lease, or lock.lease_ms raised by a reload). Lock-free. */
void cerb__redis_marker_note_lease(cerb_engine *e, int64_t lease_ms);

/*
 * The marker key into buf (NUL-terminated): prefix "\x1fcerberus" with
 * tag < 0, else "{tag}" prefix "\x1fcerberus", a cluster slot's marker
 * (redis_cluster.h). Its length, or 0 when it does not fit in len.
 */
size_t cerb__redis_marker_key(char *buf, size_t len, const char *prefix, long tag);

/* "<id> <qend>[ <replid>]" in r: the id, the quarantine end and the replid
 * recorded (into replid, "" when none). False for anything else. */
bool cerb__redis_marker_parse(const redisReply *r, struct redis_marker_view *v, char *replid,
                              size_t rlen);

/* Build the marker key and the quarantine length (open; no I/O). */
cerb_status cerb__redis_marker_init(cerb_engine *e);
void cerb__redis_marker_destroy(cerb_engine *e);

/* Read or make the marker on c and remember it (open). */
cerb_status cerb__redis_marker_fetch(cerb_engine *e, struct redis_conn *c);

/* Copy the marker value to send with a script. */
void cerb__redis_marker_get(cerb_engine *e, struct redis_marker_view *v);

struct redis_keys;
/*
 * The marker to send with a script on the keys ks, run on c. Single and
 * sentinel mode: the instance's (no I/O; ks may be NULL). Cluster mode
 * (redis_cluster.h): the marker of ks's slot, read (or made) on c the first
 * time, and again when the node serving the slot has another history than
 * the one it was checked against (then the slot's quarantine is raised, and
 * a marker found replaced reports every hold LOST). On the target of an
 * ASK (cerb__redis_set_asking) a missing marker is not made but answered
 * as TRYAGAIN: the ASK was about another key, and the marker may not have
 * moved yet. Nothing may be appended on c and not yet sent when this is
 * called.
 */
cerb_status cerb__redis_marker_for(cerb_engine *e, struct redis_conn *c,
                                   const struct redis_keys *ks, struct redis_marker_view *v);

/* Is r a script's "the marker is not what you sent" answer? */
bool cerb__redis_is_lost(const redisReply *r);

/*
 * A script on ks sent with `sent` answered "L": learn the new marker (of
 * ks's slot in cluster mode; ks may be NULL otherwise) (on c when
 * it is usable, else on a pool connection) and, the first time for this
 * value, report CERB_EV_LOST for every hold of the instance. CERB_OK when
 * the marker is known again.
 */
cerb_status cerb__redis_marker_lost(cerb_engine *e, struct redis_conn *c,
                                    const struct redis_keys *ks,
                                    const struct redis_marker_view *sent);

#endif
