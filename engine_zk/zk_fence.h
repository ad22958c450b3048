/*
 * zk_fence.h — the fence offset of the zk engine (zk_fence.c): a number
 * every grant adds to its lock node's czxid, kept in one persistent node per
 * ensemble and raised, never lowered, so that a client switching here from
 * another engine gets tokens above the ones it had there
 * (cerb_engine_lock.fence_floor, CERB_CAP_FENCE_FLOOR).
 */
#ifndef CERB_ZK_FENCE_H
#define CERB_ZK_FENCE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"

/* One reading of the offset node: the value a create checked against
 * `version` adds to its czxid; `mzxid` is no later than that czxid. */
struct zk_fence_snap {
    uint64_t value;
    int32_t version;
    int64_t mzxid;
};

/* The engine's view of the node (in struct cerb_engine; under its mu). */
struct zk_fence {
    char *path;               /* <parent of zk.root>/fence-offset */
    bool known;               /* cur is worth checking against */
    struct zk_fence_snap cur;
    uint64_t max_seen;        /* the highest value this instance has seen */
    int64_t max_zxid;         /* the highest zxid it has seen (cur's mzxid,
                                 its creates' czxids) */
};

/* The node's path for the configured root (at open). CERB_ENOMEM. */
cerb_status cerb__zk_fence_init(cerb_engine *e);
/* Free what init allocated (at close). */
void cerb__zk_fence_free(cerb_engine *e);

/*
 * The offset a lock node about to be created on session `gen` is checked
 * against: read when this instance does not know it (the node is created,
 * "0", when missing, and made again with the highest value seen if someone
 * deleted it), and first raised on the server when a grant made now could
 * be at or below `floor` (0: no floor). Every wait ends by `bound_ns`.
 * CERB_OK with *snap; or *restart (CERB_OK) when the session was lost; or
 * an error (no answer by the bound, a refusal, a node holding no number).
 */
cerb_status cerb__zk_fence_prepare(cerb_engine *e, uint64_t gen, uint64_t floor,
                                   int64_t bound_ns, const atomic_int *intr, bool *restart,
                                   struct zk_fence_snap *snap);

/* A create of ours landed with this zxid: any later write, a raise
 * included, gets a higher one (zk_fence.c: how far to raise). */
void cerb__zk_fence_seen(cerb_engine *e, int64_t zxid);

/* A create's check of `snap` failed (the offset was raised, or its node is
 * gone): read it again before the next create. */
void cerb__zk_fence_stale(cerb_engine *e, const struct zk_fence_snap *snap);

#endif
