/*
 * zk_inspect.c — inspect(): who holds a lock name on ZooKeeper and who waits
 * for it (cerb_lock_inspect, DESIGN.md §13), read in Curator's
 * InterProcessMutex layout (zk_layout.h) on the engine's own session, so
 * with its digest auth and its chroot.
 *
 * The lock of NAME is the node <zk.root>/<NAME>; each contender is one
 * EPHEMERAL_SEQUENTIAL child `_c_<uuid>-lock-<seq>` of it. Ordered by the
 * text after the last "lock-" (cerb__zk_child_key, the order the engine and
 * Curator use), the first child holds the lock and the others wait in that
 * order. Each entry's owner is the child's name (the uuid identifies one
 * acquisition); its detail is the session it is an ephemeral of (the lock
 * lives as long as that session: ZooKeeper has no per-lock lease, and a
 * session's remaining time is not visible to other clients, so ttl_ms is
 * -1), plus the node's data when it is not one of our own markers ("cerb:",
 * zk_mutex.c) — Curator writes the holder's address there.
 *
 * The holder's fence is the node's czxid plus the fence offset (zk_fence.c)
 * its create checked: the engine's fencing counter, the low 48 bits of the
 * token the holder was given. The offset node is read with the children;
 * when its mzxid is above the holder's czxid it was raised after the grant
 * and the value the create checked is gone: the fence given is then the
 * sum with today's offset, an upper bound, and the detail ends with
 * "; fence at most: ..." to say so.
 *
 * Two round trips, each bounded by zk.connect_timeout_ms like the engine's
 * other questions (held()): list the children; then get every child (data
 * and stat) and the offset node in one pipelined batch. A child gone in
 * between was released meanwhile and is left out. Nothing is written and
 * no watch is set.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_mutex.h"
#include "zk_session.h"

/* Appended to the holder's detail when its fence is an upper bound. */
#define ZK_FENCE_AT_MOST "; fence at most: the fence offset was raised since the grant"

/* Our lock nodes carry data with this prefix (zk_mutex.c): not shown. */
#define OUR_DATA_PREFIX "cerb:"

struct kid {
    const char *name;
    const struct zk_res *res;
};

/* Child order of the engine: by ordering key, ties by the whole name. */
static int kid_cmp(const void *a, const void *b)
{
    const struct kid *x = a, *y = b;
    int c = strcmp(cerb__zk_child_key(x->name), cerb__zk_child_key(y->name));
    return c ? c : strcmp(x->name, y->name);
}

/* "session 0x..." or "persistent, no session", and foreign data. */
static void describe(const struct zk_res *r, char *buf, size_t len)
{
    int n;
    if (r->stat.ephemeralOwner)
        n = snprintf(buf, len, "session 0x%" PRIx64, (uint64_t)r->stat.ephemeralOwner);
    else
        n = snprintf(buf, len, "persistent, no session");
    size_t kept = r->data_len < 0 ? 0
                  : (size_t)r->data_len < sizeof r->data ? (size_t)r->data_len
                                                         : sizeof r->data;
    const char *nul = memchr(r->data, '\0', kept);
    if (nul)
        kept = (size_t)(nul - r->data);
    if (kept > 0 && (kept < strlen(OUR_DATA_PREFIX) ||
                     memcmp(r->data, OUR_DATA_PREFIX, strlen(OUR_DATA_PREFIX)) != 0))
        snprintf(buf + n, len - (size_t)n, ", data \"%.*s%s\"", (int)kept, r->data,
                 (size_t)r->data_len > kept ? "..." : "");
}

/* Fill `out` from the listing and the gets (kids[n] is the offset node). */
static cerb_status report(struct kid *kids, size_t n, const struct zk_res *off,
                          struct cerb_holders *out)
{
    uint64_t offset = 0;
    bool offset_ok = off->rc == ZNONODE; /* never raised: 0 */
    if (off->rc == ZOK) /* at most 20 digits: all of them were kept */
        offset_ok = off->data_len >= 0 && (size_t)off->data_len <= sizeof off->data &&
                    cerb__zk_fence_parse(off->data, off->data_len, &offset);
    qsort(kids, n, sizeof *kids, kid_cmp);
    bool holder = true;
    for (size_t i = 0; i < n; i++) {
        const struct zk_res *r = kids[i].res;
        if (r->rc != ZOK)
            continue; /* gone since the listing: released meanwhile */
        char detail[192];
        describe(r, detail, sizeof detail);
        uint64_t fence = 0;
        if (holder && offset_ok) {
            fence = (uint64_t)r->stat.czxid + offset;
            if (off->rc == ZOK && off->stat.mzxid > r->stat.czxid) {
                size_t k = strlen(detail);
                snprintf(detail + k, sizeof detail - k, "%s", ZK_FENCE_AT_MOST);
            }
        }
        cerb_status st =
            cerb__holders_add(out, kids[i].name, strlen(kids[i].name), !holder, fence, -1,
                              detail);
        if (st != CERB_OK)
            return st;
        holder = false;
    }
    return CERB_OK;
}

/* A failed wait or answer as the engine's error. */
static cerb_status failed(cerb_engine *e, const char *what, const char *path, bool answered,
                          const struct zk_res *r)
{
    if (!answered)
        return cerb__error_set(CERB_EIO, "zk %s: inspect: %s %s: no answer within %lld ms",
                               e->hosts, what, path, (long long)e->zc->connect_timeout_ms);
    return cerb__zk_fail(e->hosts, what, path, r->rc, r->sent, NULL);
}

cerb_status cerb__zk_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct zk_state zs;
    struct zk_call *c1 = NULL, *c2 = NULL;
    struct kid *kids = NULL;
    cerb_status st = CERB_OK;

    cerb__zk_state(e, &zs);
    if (!zs.connected)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    char *parent = cerb__zk_parent_path(e->zc->root, name);
    c1 = parent ? cerb__zk_call_new(1) : NULL;
    if (!c1) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }

    /* Round trip 1: the children of the lock node. */
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s ? cerb__zk_call_list(c1, s, parent) : -1;
    cerb__zk_session_end(e);
    if (k < 0) {
        st = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
        goto out;
    }
    bool answered = cerb__zk_call_wait(c1, cerb__deadline_in(e->zc->connect_timeout_ms));
    const struct zk_res *list = &c1->res[k];
    if (answered && list->rc == ZNONODE)
        goto out; /* never locked, or its container was reaped: free */
    if (!answered || list->rc != ZOK) {
        st = failed(e, "inspect: children", parent, answered, list);
        goto out;
    }
    size_t n = list->n_names > 0 ? (size_t)list->n_names : 0;
    if (n == 0)
        goto out;

    /* Round trip 2: every child's data and stat, and the fence offset node
     * (slot n), pipelined. */
    c2 = cerb__zk_call_new(n + 1);
    kids = cerb__calloc(n, sizeof *kids);
    if (!c2 || !kids) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    s = cerb__zk_session_begin(e);
    for (size_t i = 0; s && i <= n; i++) {
        char *path = i < n ? cerb__zk_join(parent, list->names[i]) : NULL;
        if (i < n && !path) {
            cerb__zk_session_end(e);
            st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
            goto out;
        }
        cerb__zk_call_get(c2, s, i < n ? path : e->fence.path);
        cerb__free(path);
    }
    cerb__zk_session_end(e);
    if (!s) {
        st = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
        goto out;
    }
    answered = cerb__zk_call_wait(c2, cerb__deadline_in(e->zc->connect_timeout_ms));
    for (size_t i = 0; i <= n; i++) {
        const struct zk_res *r = &c2->res[i];
        if (!answered || (r->rc != ZOK && r->rc != ZNONODE)) {
            st = failed(e, "inspect: get", i < n ? list->names[i] : e->fence.path, answered, r);
            goto out;
        }
        if (i < n)
            kids[i] = (struct kid){list->names[i], r};
    }
    st = report(kids, n, &c2->res[n], out);
out:
    cerb__free(kids);
    cerb__zk_call_put(c2);
    cerb__zk_call_put(c1);
    cerb__free(parent);
    return st;
}
