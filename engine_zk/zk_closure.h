/*
 * zk_closure.h — the switch closure record of the zk engine (zk_closure.c,
 * DESIGN.md §5, core/engine.h "version 4"): one persistent node next to the
 * root saying from which configuration epoch on this ensemble is closed to
 * new acquisitions, checked by every lock node's create in the same
 * transaction.
 */
#ifndef CERB_ZK_CLOSURE_H
#define CERB_ZK_CLOSURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* The record is the root's path with this appended, "<zk.root>.cerberus-
 * closure": a sibling of the root, one per root. No lock name reaches it
 * (names are children of the root), and it differs from the fence offset's
 * and the guard's siblings. */
#define ZK_CLOSURE_NODE ".cerberus-closure"

/* One reading of the node: the record, and the version a create's check
 * compares with. `mzxid` orders readings (also across a re-creation). */
struct zk_closure_snap {
    cerb_closure rec;
    int32_t version;
    int64_t mzxid;
};

/* The engine's view of the node (in struct cerb_engine; under its mu). */
struct zk_closure {
    char *path;
    bool known;               /* cur is worth checking against */
    struct zk_closure_snap cur;
    cerb_closure max_seen;    /* the highest record this instance has seen */
};

/* The node's path for the configured root (at open). CERB_ENOMEM, or
 * CERB_ECONFIG for a root that is itself named like the node. */
cerb_status cerb__zk_closure_init(cerb_engine *e);
/* Free what init allocated (at close). */
void cerb__zk_closure_free(cerb_engine *e);

/* The node's data, strictly: "<epoch> closed" or "<epoch> open", epoch in
 * decimal without sign or leading zeros; epoch 0 only as "0 open" (what
 * an acquisition writes where there is no record). `len` bytes, no NUL
 * needed. False for anything else. */
bool cerb__zk_closure_parse(const char *data, int len, cerb_closure *out);
/* The text for rec (parse's inverse), NUL-terminated; false when it does
 * not fit in `len`. */
bool cerb__zk_closure_format(const cerb_closure *rec, char *buf, size_t len);

/* Does rec refuse an acquisition at `epoch` (>= 0)? core/engine.h:
 * rec.epoch > epoch, or equal and closed. */
bool cerb__zk_closure_refuses(const cerb_closure *rec, int64_t epoch);

/*
 * The reading a lock node about to be created on session `gen` is checked
 * against: cached, else read (the node is created as "0 open" when
 * missing, and made again with the highest record seen if someone deleted
 * it). Every wait ends by `bound_ns`. CERB_OK with *snap; or *restart
 * (CERB_OK) when the session was lost; or an error (no answer by the
 * bound, a refusal, CERB_EPROTO for a node holding no record).
 */
cerb_status cerb__zk_closure_prepare(cerb_engine *e, uint64_t gen, int64_t bound_ns,
                                     const atomic_int *intr, bool *restart,
                                     struct zk_closure_snap *snap);

/* A create's check of `snap` failed (the record changed, or its node is
 * gone): read it again before the next create. */
void cerb__zk_closure_stale(cerb_engine *e, const struct zk_closure_snap *snap);

/* The engine operations (contracts in core/engine.h, version 4). */
cerb_status cerb__zk_op_closure_get(cerb_engine *e, cerb_closure *out);
cerb_status cerb__zk_op_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now);

#endif
