/*
 * zk_fence.c — the fence offset: how the zk engine keeps a client's tokens
 * from going backwards when it switches here from another engine, while the
 * grants of every client here stay in order.
 *
 * A grant's fence is its lock node's czxid plus an offset O, one number for
 * the whole ensemble kept as decimal text in a persistent node next to the
 * root, <parent of zk.root>/fence-offset (for the default root
 * /cerberus/locks: /cerberus/fence-offset). Lock names are children of the
 * root, so no name reaches it, and Curator never looks there; the
 * idempotency guard's records sit next to the root the same way (DESIGN
 * §11). Roots sharing a parent share the offset, which only makes a raise
 * lift both. It is the engine's one permanent node: a few bytes per
 * ensemble.
 *
 * Reading O atomically with the grant. The lock node is created in one
 * transaction with a check of the offset node's version (zk_mutex.c,
 * cerb__zk_call_lock_multi): the create lands only while the node still
 * holds the value this instance last read, and the fence is czxid + that
 * value. A raise in between fails the check (BADVERSION); the offset is read
 * again and the create sent again.
 *
 * Why tokens stay ordered. O only grows, and the multi has one zxid, so a
 * create after a raise sees the raised value: czxid + O grows with czxid.
 * The children of a name are granted in sequence order, which is czxid
 * order, so the grants of a name get strictly growing fences, whoever made
 * them and whatever was raised in between.
 *
 * Raising. With a floor F (the highest counter this client had on another
 * engine; core/engine.h), let z be the highest zxid this instance has seen:
 * the reading's mzxid, or the czxid of one of its own creates since. Any
 * write we send now lands with a higher zxid, so a create checked against
 * the reading (O, version) gets czxid > z, and its fence exceeds F when
 * z + O >= F; later grants of the name come from later creates and rank
 * higher still. When not, O is first set to F - z by a setData conditional
 * on that version; its mzxid m' > z, so every create checked against it
 * gets a fence above m' + F - z > F — this client's grant and every later
 * one, by anyone. The raise sets O to what F needs, never adds to it, and
 * z is as recent as we know, so a fence lands just above F (by the writes
 * since z), not a whole czxid above it: 48 bits must last through many
 * switches back and forth.
 *
 * The node is created ("0", persistent, its missing parents as containers)
 * when missing. If someone deletes it, it is made again with the highest
 * value this instance has seen; an instance that never saw it would make it
 * "0", and tokens could then go backwards: the node must not be deleted.
 *
 * The reading is cached per instance under e->mu: a create costs no extra
 * round trip unless a floor needs a raise or another client raised meanwhile.
 */
#include "internal_posix.h"

#include "zk_fence.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_session.h"

/* Readings and raises per prepare(): each retry follows another client's
 * raise or a connection loss. */
#define ZK_FENCE_TRIES 16
/* Our own result code: the node holds no offset. */
#define ZK_FENCE_RC_BADDATA (-10100)

cerb_status cerb__zk_fence_init(cerb_engine *e)
{
    /* zk.root is validated (absolute, not "/", no trailing '/'). */
    e->fence.path = cerb__zk_fence_path(e->zc->root);
    if (!e->fence.path)
        return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
    return CERB_OK;
}

void cerb__zk_fence_free(cerb_engine *e)
{
    cerb__free(e->fence.path);
    e->fence.path = NULL;
}

/* Keep the newest reading (mzxid order: also across a re-creation). */
static void learn(cerb_engine *e, const struct zk_fence_snap *s)
{
    cerb__mutex_lock(&e->mu);
    struct zk_fence *f = &e->fence;
    if (!f->known || s->mzxid >= f->cur.mzxid) {
        f->cur = *s;
        f->known = true;
    }
    if (s->value > f->max_seen)
        f->max_seen = s->value;
    if (s->mzxid > f->max_zxid)
        f->max_zxid = s->mzxid;
    cerb__mutex_unlock(&e->mu);
}

void cerb__zk_fence_seen(cerb_engine *e, int64_t zxid)
{
    cerb__mutex_lock(&e->mu);
    if (zxid > e->fence.max_zxid)
        e->fence.max_zxid = zxid;
    cerb__mutex_unlock(&e->mu);
}

void cerb__zk_fence_stale(cerb_engine *e, const struct zk_fence_snap *snap)
{
    cerb__mutex_lock(&e->mu);
    struct zk_fence *f = &e->fence;
    if (f->known && f->cur.version == snap->version && f->cur.mzxid == snap->mzxid)
        f->known = false;
    cerb__mutex_unlock(&e->mu);
}


/* getData: the reading, learnt. */
static int fence_read(cerb_engine *e, uint64_t gen, int64_t bound, bool *sent)
{
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return CERB_ZK_RC_NOMEM;
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s && s->gen == gen ? cerb__zk_call_get(c, s, e->fence.path) : -1;
    cerb__zk_session_end(e);
    int rc = cerb__zk_call_wait_rc(e, c, k, bound, sent);
    if (rc == ZOK) {
        struct zk_fence_snap snap = {.version = c->res[k].stat.version,
                                     .mzxid = c->res[k].stat.mzxid};
        const struct zk_res *r = &c->res[k];
        if (r->data_len <= (int)sizeof r->data &&
            cerb__zk_fence_parse(r->data, r->data_len, &snap.value))
            learn(e, &snap);
        else
            rc = ZK_FENCE_RC_BADDATA;
    }
    cerb__zk_call_put(c);
    return rc;
}

/* Create the missing node (its missing ancestors as containers) with the
 * highest value we have seen; one made meanwhile by someone else is as
 * good. */
static int fence_create(cerb_engine *e, uint64_t gen, int64_t bound, bool *sent)
{
    const char *path = e->fence.path;
    size_t n_anc = 0;
    for (const char *p = path + 1; *p; p++)
        n_anc += *p == '/';
    char **anc = cerb__calloc(n_anc + 1, sizeof *anc);
    struct zk_call *c = anc ? cerb__zk_call_new(n_anc + 1) : NULL;
    int rc = CERB_ZK_RC_NOMEM;
    size_t made = 0;
    *sent = false;
    if (!c)
        goto out;
    for (const char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        size_t len = (size_t)(p - path);
        anc[made] = cerb__malloc(len + 1);
        if (!anc[made])
            goto out;
        memcpy(anc[made], path, len);
        anc[made][len] = '\0';
        made++;
    }
    char value[24];
    cerb__mutex_lock(&e->mu);
    snprintf(value, sizeof value, "%" PRIu64, e->fence.max_seen);
    cerb__mutex_unlock(&e->mu);

    struct zk_session *s = cerb__zk_session_begin(e);
    int k = -1;
    if (s && s->gen == gen) {
        for (size_t i = 0; i < made; i++)
            cerb__zk_call_create(c, s, anc[i], NULL, &e->acl, ZOO_CONTAINER);
        k = cerb__zk_call_create(c, s, path, value, &e->acl, ZOO_PERSISTENT);
    }
    cerb__zk_session_end(e);
    rc = cerb__zk_call_wait_rc(e, c, k, bound, sent);
    if (rc == ZNODEEXISTS)
        rc = ZOK;
    if (rc == ZOK)
        CERB_LOG_I("zk %s: fence offset node %s made, offset %s", e->hosts, path, value);
out:
    for (size_t i = 0; i < made; i++)
        cerb__free(anc[i]);
    cerb__free(anc);
    cerb__zk_call_put(c);
    return rc;
}

/* setData conditional on the reading `from`: the offset becomes `value`. */
static int fence_raise(cerb_engine *e, uint64_t gen, const struct zk_fence_snap *from,
                       uint64_t value, uint64_t floor, int64_t bound, bool *sent)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, value);
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return CERB_ZK_RC_NOMEM;
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s && s->gen == gen
                ? cerb__zk_call_set(c, s, e->fence.path, text, from->version, NULL, NULL, 0)
                : -1;
    cerb__zk_session_end(e);
    int rc = cerb__zk_call_wait_rc(e, c, k, bound, sent);
    if (rc == ZOK) {
        struct zk_fence_snap snap = {.value = value, .version = c->res[k].stat.version,
                                     .mzxid = c->res[k].stat.mzxid};
        learn(e, &snap);
        CERB_LOG_I("zk %s: fence offset raised from %" PRIu64 " to %" PRIu64
                   " (a client's fence %" PRIu64 " on another engine)",
                   e->hosts, from->value, value, floor);
    }
    cerb__zk_call_put(c);
    return rc;
}

cerb_status cerb__zk_fence_prepare(cerb_engine *e, uint64_t gen, uint64_t floor,
                                   int64_t bound_ns, const atomic_int *intr, bool *restart,
                                   struct zk_fence_snap *snap)
{
    *restart = false;
    for (int i = 0;; i++) {
        cerb__mutex_lock(&e->mu);
        bool known = e->fence.known;
        struct zk_fence_snap cur = e->fence.cur;
        /* No older than the reading, whose mzxid learn() counted. */
        uint64_t z = (uint64_t)e->fence.max_zxid;
        cerb__mutex_unlock(&e->mu);
        if (known && (floor == 0 || z + cur.value >= floor)) {
            *snap = cur;
            return CERB_OK;
        }
        if (i >= ZK_FENCE_TRIES)
            return cerb__error_set(CERB_EIO, "zk %s: the fence offset in %s kept changing",
                                   e->hosts, e->fence.path);
        const char *what;
        bool sent = false;
        int rc;
        if (!known) {
            what = "getData";
            rc = fence_read(e, gen, bound_ns, &sent);
            if (rc == ZNONODE) {
                what = "create";
                rc = fence_create(e, gen, bound_ns, &sent);
            }
        } else {
            /* z + O < F, so F - z > O: a raise, never a lowering. */
            what = "setData";
            rc = fence_raise(e, gen, &cur, floor - z, floor, bound_ns, &sent);
            if (rc == ZBADVERSION || rc == ZNONODE) {
                cerb__zk_fence_stale(e, &cur); /* raised or deleted meanwhile */
                continue;
            }
        }
        if (rc == ZOK)
            continue;
        if (rc == ZK_FENCE_RC_BADDATA)
            return cerb__error_set(CERB_EPROTO, "zk %s: %s holds no fence offset (a decimal "
                                   "number below 2^48)",
                                   e->hosts, e->fence.path);
        if (rc == CERB_ZK_RC_NOMEM)
            return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        if (rc != ZINVALIDSTATE && rc != ZSESSIONEXPIRED && !cerb__zk_rc_ambiguous(rc))
            return cerb__zk_fail(e->hosts, what, e->fence.path, rc, sent, NULL);
        /* Connection trouble: a raise may have landed, read again once
         * this session is back, within the bound. */
        if (known)
            cerb__zk_fence_stale(e, &cur);
        struct zk_state st;
        cerb_status ws = cerb__zk_wait_connected(e, bound_ns, intr, gen, &st);
        if (ws == CERB_NOT_OWNER) {
            *restart = true;
            return CERB_OK;
        }
        if (ws == CERB_OK && cerb_monotime() >= bound_ns)
            ws = cerb__error_set(CERB_EIO, "zk %s: %s %s: no answer in time", e->hosts, what,
                                 e->fence.path);
        if (ws != CERB_OK)
            return ws;
    }
}
