/*
 * zk_election.c — leader election on ZooKeeper (DESIGN.md §16,
 * docs/election.md), in the layouts of Apache Curator's two recipes, so a
 * Curator service and a Cerberus one can stand in the same election:
 *
 *   latch (CERB_ELECT_LAYOUT_LATCH, and the default): LeaderLatch,
 *       <zk.root>/<name>/_c_<uuid>-latch-<seq>
 *   selector (CERB_ELECT_LAYOUT_SELECTOR): LeaderSelector, whose nodes are
 *       its InterProcessMutex's, <zk.root>/<name>/_c_<uuid>-lock-<seq>
 *
 * EPHEMERAL_SEQUENTIAL both, with the candidate's value as the node's data
 * (Curator's participant id) from its creation: the first child by the text
 * after the layout's mark leads. A term is acquired, checked, renewed and
 * released by the mutex code (zk_mutex.c), which takes the mark and the
 * data from the hold (cerb__zk_lock_mark, lk->prim) and leaves out the
 * mutex's "cerb:holding" mark for terms: it would overwrite the value
 * (Curator's getLeader() would report it), so a successor behind a term
 * lists again when it goes, as Curator's do. The fence is the node's czxid
 * plus the fence offset its create checked, as for a lock.
 *
 * proclaim: setData on our own node, sent only on the session generation
 * that created it (setData does not check the ephemeral owner; the node
 * lives only with that session, and the first child stays first while it
 * lives, so the write is atomic with still leading). NONODE, or the
 * session gone, is NOT_OWNER.
 *
 * leader: one listing (after a sync, so a follower has caught up with the
 * leader of the ensemble), the first child carrying the layout's mark by
 * its ordering key, then its data and stat with the fence offset node in
 * one batch; the fence as zk_inspect.c computes it. A first child gone
 * between the two reads was released meanwhile: list again, a bounded
 * number of times. Children without the mark (the other layout's) are not
 * candidates of this layout: they sort after ours.
 *
 * Values starting with "cerb:" are refused (check_value): in the selector
 * layout a Cerberus mutex waiter behind our node would read such data as a
 * holder's mark and take the lock without listing (zk_mutex.c).
 *
 * Curator 5.4's LeaderLatch watches its predecessor with a getData watch
 * and acts only on NodeDeleted, so a proclaim (a NodeDataChanged) while a
 * Curator LeaderLatch waits directly behind our node would use up its
 * watch: it would never be told of the term's end, and the election would
 * stall behind it. So in the latch layout a proclaim lists the candidates
 * first and is refused (CERB_BUSY, nothing written) when the one right
 * behind ours is not a Cerberus term: our terms' node uuids have version 8
 * (zk_mutex.c), Curator's version 4. A Curator latch that queues between
 * that listing and the setData (a window of one round trip) is not seen:
 * docs/election.md. In the selector layout Curator's waiters list again on
 * any event, and ours never depend on a predecessor's data.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_mutex.h"

/* Values with this prefix are the mutex's marks (zk_mutex.c). */
#define ZK_OUR_PREFIX "cerb:"
/* Listings of leader() when the first child goes between two reads. */
#define ZK_LEADER_ROUNDS 8

/*
 * The latch layout's guard before a proclaim (see the header): list the
 * candidates and refuse (CERB_BUSY, nothing written) when the one right
 * after our node `node` is not a Cerberus term (cerb__zk_child_is_ours):
 * a Curator LeaderLatch there watches our node and would never learn of
 * its end after a data change. CERB_NOT_OWNER when our node is not
 * listed. Sent on session `gen` only.
 */
static cerb_status latch_guard(cerb_engine *e, cerb_engine_lock *lk, uint64_t gen,
                               const char *node, int64_t bound)
{
    char *parent = cerb__zk_parent_path(e->zc->root, lk->name);
    struct zk_call *c = parent ? cerb__zk_call_new(1) : NULL;
    if (!c) {
        cerb__free(parent);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s && s->gen == gen ? cerb__zk_call_list(c, s, parent) : -1;
    cerb__zk_session_end(e);
    bool sent;
    int rc = cerb__zk_call_wait_rc(e, c, k, bound, &sent);
    cerb_status st = CERB_OK;
    const char *self = cerb__zk_basename(node);
    if (rc == ZNONODE || rc == ZSESSIONEXPIRED || (rc == ZINVALIDSTATE && !sent)) {
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: \"%s\" is not led by this term any more "
                                             "(%s)",
                             e->hosts, lk->name, zerror(rc));
    } else if (rc != ZOK) {
        st = cerb__zk_fail(e->hosts, "getChildren", parent, rc, sent, NULL);
    } else {
        const char *self_key = cerb__zk_child_key_mark(self, ZK_LATCH_MARK);
        const char *next = NULL, *next_key = NULL;
        bool found = false;
        for (int i = 0; i < c->res[k].n_names; i++) {
            const char *nm = c->res[k].names[i];
            if (strcmp(nm, self) == 0) {
                found = true;
                continue;
            }
            if (!strstr(nm, ZK_LATCH_MARK))
                continue;
            const char *key = cerb__zk_child_key_mark(nm, ZK_LATCH_MARK);
            int after = strcmp(key, self_key);
            if (after < 0 || (after == 0 && strcmp(nm, self) < 0))
                continue;
            int cmp = next ? strcmp(key, next_key) : -1;
            if (cmp < 0 || (cmp == 0 && strcmp(nm, next) < 0)) {
                next = nm;
                next_key = key;
            }
        }
        if (!found)
            st = cerb__error_set(CERB_NOT_OWNER, "zk %s: the node of \"%s\" is gone", e->hosts,
                                 lk->name);
        else if (next && !cerb__zk_child_is_ours(next))
            st = cerb__error_set(CERB_BUSY, "zk %s: \"%s\": not proclaimed: the candidate "
                                            "right behind this term, %s, is not a Cerberus one "
                                            "(a Curator LeaderLatch, which would miss the "
                                            "term's end after its data changed); set the value "
                                            "when campaigning, or use the selector layout",
                                 e->hosts, lk->name, next);
    }
    cerb__zk_call_put(c);
    cerb__free(parent);
    return st;
}

static cerb_status zk_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                               size_t n, cerb_outcome *outcome)
{
    struct zk_lock_priv *p = lk->priv;
    *outcome = CERB_OUTCOME_NO;
    if (n > INT32_MAX)
        return cerb__error_set(CERB_EINVAL, "zk: the value is too long");
    cerb__mutex_lock(&e->mu);
    uint64_t gen = p->gen;
    bool gone = p->gone || !p->node;
    char *node = gone ? NULL : cerb__strdup(p->node);
    cerb__mutex_unlock(&e->mu);
    if (gone)
        return cerb__error_set(CERB_NOT_OWNER, "zk %s: the node of \"%s\" is gone", e->hosts,
                               lk->name);
    if (!node)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);

    int64_t bound = cerb__deadline_in(e->zc->connect_timeout_ms);
    struct zk_state zs;
    cerb_status st = cerb__zk_wait_connected(e, bound, NULL, gen, &zs);
    if (st == CERB_NOT_OWNER) {
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: the session of \"%s\"'s term was lost",
                             e->hosts, lk->name);
        goto out;
    }
    if (st != CERB_OK)
        goto out; /* nothing sent */
    if (lk->variant != CERB_ELECT_LAYOUT_SELECTOR &&
        (st = latch_guard(e, lk, gen, node, bound)) != CERB_OK)
        goto out; /* nothing written */
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    struct zk_session *s = cerb__zk_session_begin(e);
    /* Only on the node's own session: another session's setData would
     * write a node it does not own as long as the node exists. */
    int k = s && s->gen == gen
                ? cerb__zk_call_set_bytes(c, s, node, value, (int)n, -1, NULL, NULL, 0)
                : -1;
    cerb__zk_session_end(e);
    bool sent;
    int rc = cerb__zk_call_wait_rc(e, c, k, bound, &sent);
    cerb__zk_call_put(c);
    if (rc == ZOK) {
        *outcome = CERB_OUTCOME_YES;
        st = CERB_OK;
    } else if (rc == ZNONODE || rc == ZSESSIONEXPIRED || (rc == ZINVALIDSTATE && !sent)) {
        /* The node is gone, or with its session (a handle refusing with
         * ZINVALIDSTATE has expired; k < 0: the session changed). */
        st = cerb__error_set(CERB_NOT_OWNER, "zk %s: \"%s\" is not led by this term any more "
                                             "(%s)",
                             e->hosts, lk->name, zerror(rc));
    } else {
        st = cerb__zk_fail(e->hosts, "setData", node, rc, sent, outcome);
    }
out:
    cerb__free(node);
    return st;
}

/* A failed wait or answer as the engine's error. */
static cerb_status failed(cerb_engine *e, const char *what, const char *path, bool answered,
                          const struct zk_res *r)
{
    if (!answered)
        return cerb__error_set(CERB_EIO, "zk %s: leader: %s %s: no answer within %lld ms",
                               e->hosts, what, path, (long long)e->zc->connect_timeout_ms);
    return cerb__zk_fail(e->hosts, what, path, r->rc, r->sent, NULL);
}

/* The first of `names` carrying `mark`, by its key (ties by name), or NULL. */
static const char *first_child(char *const *names, int n, const char *mark)
{
    const char *best = NULL, *best_key = NULL;
    for (int i = 0; i < n; i++) {
        if (!strstr(names[i], mark))
            continue;
        const char *k = cerb__zk_child_key_mark(names[i], mark);
        int c = best ? strcmp(k, best_key) : -1;
        if (c < 0 || (c == 0 && strcmp(names[i], best) < 0)) {
            best = names[i];
            best_key = k;
        }
    }
    return best;
}

/* Fill out from the leader's node (r: GETDATA) and the offset node (off). */
static void fill(cerb_leader_rec *out, const char *child, struct zk_res *r,
                 const struct zk_res *off)
{
    out->state = CERB_LEADER_SOME;
    snprintf(out->owner, sizeof out->owner, "%s", child);
    /* A lock's node in the selector layout (the mutex's marks) has no
     * value; a term's data is its value. */
    bool ours = r->buf && r->data_len >= (int)strlen(ZK_OUR_PREFIX) &&
                memcmp(r->buf, ZK_OUR_PREFIX, strlen(ZK_OUR_PREFIX)) == 0;
    if (!ours) {
        /* No data at all (the client does not tell it from empty data)
         * is an empty value. */
        if (r->buf && r->data_len > 0) {
            out->value = r->buf; /* handed over */
            out->value_len = (size_t)r->data_len;
            r->buf = NULL;
        } else {
            out->value = cerb__calloc(1, 1);
        }
        out->value_known = out->value != NULL;
    }
    uint64_t offset = 0;
    bool offset_ok = off->rc == ZNONODE; /* never raised: 0 */
    if (off->rc == ZOK) /* at most 20 digits: all of them were kept */
        offset_ok = off->data_len >= 0 && (size_t)off->data_len <= sizeof off->data &&
                    cerb__zk_fence_parse(off->data, off->data_len, &offset);
    int len = snprintf(out->detail, sizeof out->detail, "session 0x%" PRIx64,
                       (uint64_t)r->stat.ephemeralOwner);
    if (offset_ok) {
        out->counter = (uint64_t)r->stat.czxid + offset;
        if (off->rc == ZOK && off->stat.mzxid > r->stat.czxid)
            snprintf(out->detail + len, sizeof out->detail - (size_t)len,
                     "; fence at most: the fence offset was raised since the election");
    } else {
        snprintf(out->detail + len, sizeof out->detail - (size_t)len,
                 "; fence unknown: the fence offset node is unreadable");
    }
}

static cerb_status zk_leader(cerb_engine *e, const char *name, int variant,
                             cerb_leader_rec *out)
{
    const char *mark = cerb__zk_variant_mark(variant);
    struct zk_state zs;
    cerb__zk_state(e, &zs);
    if (!zs.connected)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    char *parent = cerb__zk_parent_path(e->zc->root, name);
    if (!parent)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    cerb_status st = CERB_OK;
    for (int round = 0;; round++) {
        if (round == ZK_LEADER_ROUNDS) {
            st = cerb__error_set(CERB_EIO, "zk %s: leader: \"%s\"'s first candidate kept "
                                           "changing (%d listings)",
                                 e->hosts, name, round);
            break;
        }
        /* A sync (the first time), then the children. */
        struct zk_call *c1 = cerb__zk_call_new(2), *c2 = NULL;
        if (!c1) {
            st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
            break;
        }
        struct zk_session *s = cerb__zk_session_begin(e);
        int ks = s && round == 0 ? cerb__zk_call_sync(c1, s, parent) : -1;
        int k = s ? cerb__zk_call_list(c1, s, parent) : -1;
        cerb__zk_session_end(e);
        if (k < 0) {
            cerb__zk_call_put(c1);
            st = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
            break;
        }
        bool answered = cerb__zk_call_wait(c1, cerb__deadline_in(e->zc->connect_timeout_ms));
        if (answered && ks >= 0 && c1->res[ks].rc != ZOK) {
            /* Not caught up: the listing may be stale, and "nobody" from
             * it could be false. */
            st = failed(e, "sync", parent, true, &c1->res[ks]);
            cerb__zk_call_put(c1);
            break;
        }
        struct zk_res *list = &c1->res[k];
        if (answered && list->rc == ZNONODE) {
            cerb__zk_call_put(c1);
            break; /* never used, or its container was reaped: nobody */
        }
        if (!answered || list->rc != ZOK) {
            st = failed(e, "getChildren", parent, answered, list);
            cerb__zk_call_put(c1);
            break;
        }
        const char *first = first_child(list->names, list->n_names, mark);
        if (!first) {
            cerb__zk_call_put(c1);
            break; /* nobody campaigns in this layout */
        }
        char *path = cerb__zk_join(parent, first);
        c2 = path ? cerb__zk_call_new(2) : NULL;
        if (!c2) {
            cerb__free(path);
            cerb__zk_call_put(c1);
            st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
            break;
        }
        s = cerb__zk_session_begin(e);
        int kd = s ? cerb__zk_call_getdata(c2, s, path) : -1;
        int ko = s ? cerb__zk_call_get(c2, s, e->fence.path) : -1;
        cerb__zk_session_end(e);
        answered = kd >= 0 && ko >= 0 &&
                   cerb__zk_call_wait(c2, cerb__deadline_in(e->zc->connect_timeout_ms));
        bool again = false;
        if (kd < 0 || ko < 0) {
            st = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
        } else if (!answered || (c2->res[kd].rc != ZOK && c2->res[kd].rc != ZNONODE)) {
            st = failed(e, "getData", path, answered, &c2->res[kd]);
        } else if (c2->res[ko].rc != ZOK && c2->res[ko].rc != ZNONODE) {
            st = failed(e, "getData", e->fence.path, true, &c2->res[ko]);
        } else if (c2->res[kd].rc == ZNONODE) {
            again = true; /* released since the listing */
        } else {
            fill(out, first, &c2->res[kd], &c2->res[ko]);
        }
        cerb__free(path);
        cerb__zk_call_put(c2);
        cerb__zk_call_put(c1);
        if (!again)
            break;
    }
    cerb__free(parent);
    return st;
}

static cerb_status zk_check_value(int variant, const void *value, size_t n)
{
    (void)variant;
    size_t pl = strlen(ZK_OUR_PREFIX);
    if (n >= pl && memcmp(value, ZK_OUR_PREFIX, pl) == 0)
        return cerb__error_set(CERB_EINVAL, "zk: an election value may not start with \"%s\" "
                                            "(the prefix of the lock nodes' own marks)",
                               ZK_OUR_PREFIX);
    return CERB_OK;
}

const struct cerb_election_methods cerb__zk_election = {
    .version = CERB_ELECTION_METHODS_V1,
    .flags = CERB_ELECT_VALUE_AT_GRANT,
    /* acquire and check_owner: the mutex's, which lay a term out by its
     * layout (zk_mutex.c, cerb__zk_lock_mark). */
    .acquire = NULL,
    .check_owner = NULL,
    .proclaim = zk_proclaim,
    .leader = zk_leader,
    .check_value = zk_check_value,
};
