/*
 * zk_queue_fits.c — fits() for the zk engine's semaphores and read-write
 * locks (engine.h, struct cerb_queue_methods): would a new member like lk
 * be granted at the tail of lk->name's queue now? The safe switch asks it
 * of the engine switched from (core/health.c), so that a semaphore with
 * permits to spare, or a reader among readers, is not refused there the
 * way held() refuses it.
 *
 * One round trip of reads on the engine's session, no watch, no write,
 * bounded by zk.connect_timeout_ms (as held and inspect).
 *
 * Members of lk's own token are not counted. The token is not on the wire
 * (our nodes carry a random uuid per acquisition), but only this process
 * can have members of it, and only through this engine instance: the
 * holds and waits of this instance carry the uuid of their nodes (tag,
 * copied under mu whenever a hold joins a list, zk_mutex.c), so the nodes
 * whose uuid is the tag of a hold of lk's token, name and primitive are
 * left out. A semaphore acquisition is found by its locks/ mutex hold
 * (name "<name>/locks", same token, the uuid its leases get): it holds
 * that from its turn on locks/ until it leaves, so while it waits for
 * room too; once granted, by its own hold.
 *
 * Semaphore (zk_semaphore.c's layout): list leases/ and locks/ and read
 * count in one round trip. Every lease node is one permit (ours: k per
 * acquisition; Curator's: one per lease), waiting or holding. A node
 * queued on locks/ that has made no lease yet counts one permit (how many
 * it wants is not on the wire; Curator takes locks/ once per lease, so for
 * Curator it is exact, for ours the least it can take). The limit is the
 * stored count while the semaphore is in use by others (a lease or a
 * locks/ node not of lk's token), else lk->limit (an idle semaphore takes
 * the caller's, as acquire does). A count that is not 4 bytes while in use
 * is CERB_BUSY: no acquisition of ours could be granted there.
 *
 * Read-write lock (zk_rwlock.c, Curator's layout): list <root>/<name>. A
 * writer fits when no child is left once ours are taken out; a reader when
 * no writer is among them (a child that is neither a reader nor a writer
 * counts as a writer, as inspect reads it).
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_mutex.h"

/* At most this many own uuids are looked for (a token has one member of a
 * name per engine, two while a semaphore acquisition is under way). */
#define OWN_MAX 8

struct own {
    char uuid[OWN_MAX][ZK_UUID_LEN + 1];
    size_t n;
};

static void own_add(struct own *o, const char *uuid)
{
    if (!uuid[0] || o->n >= OWN_MAX)
        return;
    for (size_t i = 0; i < o->n; i++)
        if (strcmp(o->uuid[i], uuid) == 0)
            return;
    memcpy(o->uuid[o->n++], uuid, ZK_UUID_LEN + 1);
}

/* Is `name` "<lk->name>/locks" (a semaphore's locks/ mutex)? */
static bool is_locks_of(const char *name, const char *sem)
{
    size_t n = strlen(sem);
    return strncmp(name, sem, n) == 0 && strcmp(name + n, "/locks") == 0;
}

static void own_scan(struct zk_lock_priv *list, const cerb_engine_lock *lk, struct own *o)
{
    for (struct zk_lock_priv *p = list; p; p = p->next) {
        const cerb_engine_lock *m = p->lk;
        if (!m || strcmp(m->token, lk->token) != 0)
            continue;
        bool same = m->prim == lk->prim && strcmp(m->name, lk->name) == 0;
        bool locks = lk->prim == CERB_PRIM_SEMAPHORE && m->prim == CERB_PRIM_MUTEX &&
                     is_locks_of(m->name, lk->name);
        if (same || locks)
            own_add(o, p->tag);
    }
}

/* The uuids of this instance's members of lk's token (mu). */
static void own_collect(cerb_engine *e, const cerb_engine_lock *lk, struct own *o)
{
    o->n = 0;
    cerb__mutex_lock(&e->mu);
    own_scan(e->held, lk, o);
    own_scan(e->waiting, lk, o);
    cerb__mutex_unlock(&e->mu);
}

static bool own_has(const struct own *o, const char *child)
{
    for (size_t i = 0; i < o->n; i++)
        if (cerb__zk_child_has_uuid(child, o->uuid[i]))
            return true;
    return false;
}

/* Length of child's protection group ("_c_<uuid>-"), 0 for none. */
static size_t group_len(const char *name)
{
    size_t pl = strlen(ZK_PROTECT_PREFIX);
    if (strncmp(name, ZK_PROTECT_PREFIX, pl) != 0 || strlen(name) <= pl + ZK_UUID_LEN ||
        name[pl + ZK_UUID_LEN] != '-')
        return 0;
    return pl + ZK_UUID_LEN + 1;
}

static cerb_status not_connected(cerb_engine *e)
{
    return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
}

cerb_status cerb__zk_sem_fits(cerb_engine *e, const cerb_engine_lock *lk)
{
    struct zk_state zs;
    cerb__zk_state(e, &zs);
    if (!zs.connected)
        return not_connected(e);
    char *base = cerb__zk_parent_path(e->zc->root, lk->name);
    char *leases = base ? cerb__zk_join(base, "leases") : NULL;
    char *locks = base ? cerb__zk_join(base, "locks") : NULL;
    char *count = base ? cerb__zk_join(base, "count") : NULL;
    struct zk_call *c = leases && locks && count ? cerb__zk_call_new(3) : NULL;
    cerb_status st = CERB_OK;
    if (!c) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    struct own own;
    own_collect(e, lk, &own);
    struct zk_session *s = cerb__zk_session_begin(e);
    int kl = s ? cerb__zk_call_list(c, s, leases) : -1;
    int kk = s ? cerb__zk_call_list(c, s, locks) : -1;
    int kd = s ? cerb__zk_call_getdata(c, s, count) : -1;
    cerb__zk_session_end(e);
    if (kd < 0) {
        st = not_connected(e);
        goto out;
    }
    bool sent;
    int rc = cerb__zk_call_wait_rc(e, c, kl, cerb__deadline_in(e->zc->connect_timeout_ms), &sent);
    const struct zk_res *rl = &c->res[kl], *rk = &c->res[kk], *rd = &c->res[kd];
    const char *what = leases;
    if (rc == ZOK || rc == ZNONODE) {
        rc = rk->rc, what = locks;
        if (rc == ZOK || rc == ZNONODE)
            rc = rd->rc, what = count;
    }
    if (rc != ZOK && rc != ZNONODE) {
        st = cerb__zk_fail(e->hosts, "fits: read", what, rc, sent, NULL);
        goto out;
    }
    /* Others' permits: their leases, and one per locks/ node of theirs
     * that made no lease yet. */
    int64_t permits = 0;
    int nl = rl->rc == ZOK ? rl->n_names : 0;
    int nk = rk->rc == ZOK ? rk->n_names : 0;
    for (int i = 0; i < nl; i++)
        if (!own_has(&own, rl->names[i]))
            permits++;
    for (int i = 0; i < nk; i++) {
        const char *q = rk->names[i];
        if (own_has(&own, q))
            continue;
        size_t gl = group_len(q);
        bool leased = false;
        for (int j = 0; gl && j < nl && !leased; j++)
            leased = strncmp(rl->names[j], q, gl) == 0;
        if (!leased)
            permits++;
    }
    int64_t limit = lk->limit;
    if (permits > 0 && rd->rc == ZOK) {
        if (rd->data_len != 4) {
            st = cerb__error_set(CERB_BUSY, "zk %s: semaphore \"%s\" is in use and its count "
                                            "%s holds %d bytes, not 4",
                                 e->hosts, lk->name, count, rd->data_len);
            goto out;
        }
        const unsigned char *u = (const unsigned char *)rd->buf;
        limit = (int64_t)((uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 |
                          u[3]);
    }
    if (permits + (int64_t)lk->count > limit)
        st = cerb__error_set(CERB_BUSY, "zk %s: semaphore \"%s\": %lld permits taken or asked "
                                        "of %lld, %u more do not fit",
                             e->hosts, lk->name, (long long)permits, (long long)limit, lk->count);
out:
    cerb__zk_call_put(c);
    cerb__free(count);
    cerb__free(locks);
    cerb__free(leases);
    cerb__free(base);
    return st;
}

cerb_status cerb__zk_rw_fits(cerb_engine *e, const cerb_engine_lock *lk)
{
    struct zk_state zs;
    cerb__zk_state(e, &zs);
    if (!zs.connected)
        return not_connected(e);
    char *base = cerb__zk_parent_path(e->zc->root, lk->name);
    struct zk_call *c = base ? cerb__zk_call_new(1) : NULL;
    cerb_status st = CERB_OK;
    if (!c) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    struct own own;
    own_collect(e, lk, &own);
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s ? cerb__zk_call_list(c, s, base) : -1;
    cerb__zk_session_end(e);
    if (k < 0) {
        st = not_connected(e);
        goto out;
    }
    bool sent;
    int rc = cerb__zk_call_wait_rc(e, c, k, cerb__deadline_in(e->zc->connect_timeout_ms), &sent);
    if (rc != ZOK && rc != ZNONODE) {
        st = cerb__zk_fail(e->hosts, "fits: children", base, rc, sent, NULL);
        goto out;
    }
    const struct zk_res *r = &c->res[k];
    int others = 0, writers = 0;
    for (int i = 0; rc == ZOK && i < r->n_names; i++) {
        const char *nm = r->names[i];
        if (own_has(&own, nm))
            continue;
        others++;
        if (cerb__zk_child_is_writer(nm) || !strstr(nm, ZK_READ_MARK))
            writers++;
    }
    bool writer = lk->variant == CERB_RW_WRITE;
    if (writer ? others > 0 : writers > 0)
        st = cerb__error_set(CERB_BUSY, "zk %s: read-write lock \"%s\": a %s does not fit "
                                        "(%d other member%s, %d writing)",
                             e->hosts, lk->name, writer ? "writer" : "reader", others,
                             others == 1 ? "" : "s", writers);
out:
    cerb__zk_call_put(c);
    cerb__free(base);
    return st;
}
