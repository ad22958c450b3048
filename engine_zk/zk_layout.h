/*
 * zk_layout.h — Curator InterProcessMutex's node layout, as pure functions:
 * names, paths, the order of a lock's children, which of them are ours.
 *
 *   <zk.root>/<name>/_c_<uuid>-lock-<10-digit sequence>
 *
 * `_c_<uuid>-` is Curator's "protection" prefix (the uuid is 36 characters,
 * 8-4-4-4-12 lowercase hex); the sequence is appended by the server
 * (EPHEMERAL_SEQUENTIAL). Children are ordered by the text after the last
 * "lock-" (the whole name when there is none), exactly as Curator's
 * StandardLockInternalsDriver.fixForSorting does, so both sides agree on
 * who is first. Leader elections in Curator's LeaderLatch layout use the
 * mark "latch-" in place of "lock-" (the _mark functions; zk_election.c).
 */
#ifndef CERB_ZK_LAYOUT_H
#define CERB_ZK_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

#define ZK_UUID_LEN 36
#define ZK_PROTECT_PREFIX "_c_"
#define ZK_LOCK_MARK "lock-"
/* Curator LeaderLatch's mark (<root>/<name>/_c_<uuid>-latch-<seq>): the
 * zk engine's leader election in its default layout (zk_election.c). */
#define ZK_LATCH_MARK "latch-"
/* Curator InterProcessReadWriteLock's marks (zk_rwlock.c): its nodes are
 * <root>/<name>/_c_<uuid>-__READ__<seq> and ..._c_<uuid>-__WRIT__<seq>. */
#define ZK_READ_MARK "__READ__"
#define ZK_WRITE_MARK "__WRIT__"
/* Not a mark in any name: the ordering of a read-write lock's children,
 * Curator's fixForSorting with both marks (the text after the last
 * __READ__, then after the last __WRIT__ of that), given as `mark` to the
 * analysis, which then also counts the writers before self. */
extern const char ZK_RW_ORDER[];
/* Curator InterProcessSemaphoreV2's lease nodes (zk_semaphore.c). */
#define ZK_LEASE_MARK "lease-"
/* At most this many children carrying our uuid are remembered by one
 * listing (there is one, or none; more only after repeated ambiguity). */
#define ZK_MAX_MINE 8

struct String_vector;

/* The ordering key of child `name` (a suffix of it): the text after the
 * last ZK_LOCK_MARK; _mark: after the last `mark` (ZK_LOCK_MARK or
 * ZK_LATCH_MARK), as Curator's fixForSorting with that lock name. */
const char *cerb__zk_child_key(const char *name);
const char *cerb__zk_child_key_mark(const char *name, const char *mark);
/* A read-write lock child's ordering key (ZK_RW_ORDER), and whether it is
 * a writer's (its name contains ZK_WRITE_MARK, as Curator tests). */
const char *cerb__zk_child_key_rw(const char *name);
bool cerb__zk_child_is_writer(const char *name);

/*
 * The nodes Cerberus makes (locks and election terms) carry a uuid of
 * version 8 (RFC 9562 "custom": the random uuid with its version nibble
 * set to 8), Curator's a random one (version 4). So a waiter reads marks
 * (ZK_DATA_*) only in the data of a node of ours, never in a peer's, whose
 * data is its user's (a LeaderSelector's participant id may read
 * "cerb:holding"); and a proclaim tells our candidates from Curator's
 * (zk_election.c). Is child `name` "_c_<uuid>-..." with such a uuid?
 */
#define ZK_OUR_UUID_VERSION 8
bool cerb__zk_child_is_ours(const char *name);

/* Does child `name` carry uuid `uuid` (prefix "_c_<uuid>-")? */
bool cerb__zk_child_has_uuid(const char *name, const char *uuid);

/* The last component of a path (after the last '/'). */
const char *cerb__zk_basename(const char *path);

/*
 * "<root>/<name>" (root "/" gives "/<name>"), and "<parent>/_c_<uuid>-lock-"
 * (the create path; the server appends the sequence), malloc'd with
 * cerb__malloc. NULL on out of memory.
 */
char *cerb__zk_parent_path(const char *root, const char *name);
char *cerb__zk_node_prefix(const char *parent, const char *uuid);
/* The same with `mark` in place of "lock-" ("<parent>/_c_<uuid>-<mark>"). */
char *cerb__zk_node_prefix_mark(const char *parent, const char *uuid, const char *mark);
/* "<dir>/<child>", malloc'd; NULL on out of memory. */
char *cerb__zk_join(const char *dir, const char *child);

/*
 * The fence offset node (zk_fence.c): "<parent of root>/fence-offset", next
 * to the root, where no lock name reaches ("/locks" gives "/fence-offset").
 * `root` is a valid zk.root (absolute, not "/", no trailing '/'). Malloc'd
 * with cerb__malloc; NULL on out of memory.
 */
#define ZK_FENCE_NODE "fence-offset"
char *cerb__zk_fence_path(const char *root);
/* "<parent of root>/<node>" in general (the guard's nodes, zk_guard.c);
 * same rules and ownership. */
char *cerb__zk_sibling_path(const char *root, const char *node);

/* The offset that node's data says: 1–20 decimal digits, below 2^48.
 * False for anything else. */
bool cerb__zk_fence_parse(const char *data, int len, uint64_t *out);

/*
 * What one listing of a lock's children says about us.
 * In: `self` (our node's name, or NULL when we do not know it) and `uuid`
 * (collect children carrying it, or NULL).
 */
struct zk_children {
    size_t n_children;
    bool found_self;    /* self is among them */
    size_t n_lower;     /* children ordered before self */
    char *pred;         /* the child just before self (owned), NULL if none */
    size_t n_wlower;    /* ZK_RW_ORDER: writers ordered before self */
    char *wpred;        /* ZK_RW_ORDER: the last of them (owned), or NULL */
    size_t n_mine;      /* children carrying uuid */
    char *mine[ZK_MAX_MINE];  /* their names (owned) */
    bool oom;           /* an allocation failed: the result is incomplete */
};

/* Fill `out` from a listing. Allocations go through cerb__malloc. */
void cerb__zk_children_analyze(const struct String_vector *v, const char *self,
                               const char *uuid, struct zk_children *out);
/* The same, ordered by the keys after `mark` (cerb__zk_child_key_mark). */
void cerb__zk_children_analyze_mark(const struct String_vector *v, const char *self,
                                    const char *uuid, const char *mark,
                                    struct zk_children *out);
/* Free what an analysis allocated, and zero it. */
void cerb__zk_children_clear(struct zk_children *c);

/*
 * Refuse a lock name that is not one valid ZooKeeper path component:
 * empty, "." or "..", a '/', invalid UTF-8, or a code point the server
 * rejects in paths (U+0000–U+001F, U+007F–U+009F, U+D800–U+F8FF,
 * U+FFF0 and above: Java sees those as surrogates or specials).
 * CERB_EINVAL with the reason in cerb_last_error().
 */
cerb_status cerb__zk_check_name(const char *name);

#endif
