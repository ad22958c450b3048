/*
 * zk_cleanup.c — making sure no lock node of ours is left behind, and
 * finding one again after a lost reply.
 *
 * A lock node left on the server by a client that stopped caring about it
 * blocks everyone behind it for as long as the session lives, which for a
 * healthy client is forever. Two things produce such orphans, and both are
 * handled here:
 *  - a delete that meets a connection loss (a leader election, a restart):
 *    its outcome is unknown, so it is sent again once reconnected, until the
 *    server says OK or NONODE. Measured on a 3-node ensemble with the leader
 *    killed: without the retry 1–8 orphans per run, with it none;
 *  - a create whose reply was lost: the node may exist. Its name carries
 *    the acquisition's uuid ("_c_<uuid>-lock-…"), so the parent is listed
 *    and the children carrying the uuid are examined: the one that is an
 *    ephemeral of our *current* session is ours and adopted; any other is
 *    an old session's and deleted, never adopted (adopting it is Curator's
 *    CURATOR-604: a lock "held" by a node that dies with a session already
 *    gone).
 * A caller waits for this at most until its operation's bound (zk_mutex.c:
 * the caller's deadline, or the connect timeout); what is not done by then
 * goes on the keeper's list of pending deletions, retried whenever the
 * session is connected. A create not settled by its bound is the core's to
 * settle (check_owner) or release (by uuid): the engine never deletes by
 * uuid a node that check_owner may still adopt. Deletions
 * run on whatever session is current: if we gave a session up before the
 * server expired it, its nodes still exist and any session may delete them
 * (the ACLs we set allow our own identity to).
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_mutex.h"

/* A refused deletion (no permission, say) is retried by the keeper this
 * many times before it is dropped with a warning. */
#define ZK_REAP_MAX_REFUSALS 50

/* Worth another try on a later (or new) session? */
static bool retryable(int rc)
{
    return cerb__zk_rc_ambiguous(rc) || rc == ZINVALIDSTATE || rc == ZSESSIONEXPIRED ||
           rc == ZSESSIONMOVED || rc == ZTHROTTLEDOP;
}

/* Delete one path and wait for the answer until deadline_ns; *rc is its
 * result. Returns the call for the caller to put (NULL when out of
 * memory). */
static struct zk_call *one_call_delete(cerb_engine *e, const char *path, int64_t deadline_ns,
                                       int *rc)
{
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c) {
        *rc = CERB_ZK_RC_NOMEM;
        return NULL;
    }
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s ? cerb__zk_call_delete(c, s, path) : -1;
    cerb__zk_session_end(e);
    if (k < 0) {
        *rc = ZCONNECTIONLOSS;
    } else if (!cerb__zk_call_wait(c, cerb__zk_call_deadline(e, deadline_ns))) {
        *rc = CERB_ZK_RC_ABANDONED;
    } else {
        *rc = c->res[k].rc;
    }
    return c;
}

/*
 * One attempt, each answer awaited until deadline_ns: delete `node`, or
 * every child of `parent` carrying `uuid`. Returns ZOK when nothing of it
 * is left, else the first failure (CERB_ZK_RC_ABANDONED: no answer in
 * time). *deleted is set when a delete succeeded.
 */
static int remove_once(cerb_engine *e, const char *parent, const char *node, const char *uuid,
                       int64_t deadline_ns, bool *deleted)
{
    int rc;

    if (node) {
        cerb__zk_call_put(one_call_delete(e, node, deadline_ns, &rc));
        if (rc == ZOK)
            *deleted = true;
        return rc == ZOK || rc == ZNONODE ? ZOK : rc;
    }

    /* By uuid: list, then delete what carries it, until none is left (a
     * listing keeps at most ZK_MAX_MINE of them). */
    for (;;) {
        struct zk_call *c = cerb__zk_call_new(1);
        if (!c)
            return CERB_ZK_RC_NOMEM;
        struct zk_session *s = cerb__zk_session_begin(e);
        int k = s ? cerb__zk_call_children(c, s, parent, -1, NULL, uuid) : -1;
        cerb__zk_session_end(e);
        if (k < 0)
            rc = ZCONNECTIONLOSS;
        else if (!cerb__zk_call_wait(c, cerb__zk_call_deadline(e, deadline_ns)))
            rc = CERB_ZK_RC_ABANDONED;
        else
            rc = c->res[k].rc;
        if (rc != ZOK) {
            cerb__zk_call_put(c);
            return rc == ZNONODE ? ZOK : rc; /* no parent: nothing of ours */
        }
        struct zk_children *kids = &c->res[k].kids;
        size_t n = kids->n_mine;
        bool more = n == ZK_MAX_MINE;
        int first_fail = ZOK;
        for (size_t i = 0; i < n && first_fail == ZOK; i++) {
            char *path = cerb__zk_join(parent, kids->mine[i]);
            if (!path) {
                first_fail = CERB_ZK_RC_NOMEM;
                break;
            }
            cerb__zk_call_put(one_call_delete(e, path, deadline_ns, &rc));
            cerb__free(path);
            if (rc == ZOK)
                *deleted = true;
            else if (rc != ZNONODE)
                first_fail = rc;
        }
        cerb__zk_call_put(c);
        if (first_fail != ZOK || !more)
            return first_fail;
    }
}

void cerb__zk_reap_add(cerb_engine *e, const char *parent, const char *node, const char *uuid)
{
    struct zk_reap *r = cerb__calloc(1, sizeof *r);
    if (r) {
        r->parent = cerb__strdup(parent);
        r->node = node ? cerb__strdup(node) : NULL;
        snprintf(r->uuid, sizeof r->uuid, "%s", uuid ? uuid : "");
    }
    if (!r || !r->parent || (node && !r->node)) {
        CERB_LOG_E("zk %s: out of memory: lock node %s (uuid %s) may stay until the session "
                   "ends",
                   e->hosts, node ? node : parent, uuid ? uuid : "?");
        if (r) {
            cerb__free(r->parent);
            cerb__free(r->node);
            cerb__free(r);
        }
        return;
    }
    CERB_LOG_I("zk %s: deletion of %s%s%s left to the session thread", e->hosts,
               node ? node : parent, node ? "" : " children of uuid ", node ? "" : r->uuid);
    cerb__mutex_lock(&e->mu);
    r->next = e->reap;
    e->reap = r;
    cerb__zk_keeper_poke_locked(e, ZK_PEND_REAP);
    cerb__mutex_unlock(&e->mu);
}

static void reap_entry_free(struct zk_reap *r)
{
    cerb__free(r->parent);
    cerb__free(r->node);
    cerb__free(r);
}

bool cerb__zk_reap_run(cerb_engine *e)
{
    struct zk_reap *list, *keep = NULL;
    bool left, stalled = false;

    cerb__mutex_lock(&e->mu);
    list = e->reap;
    e->reap = NULL;
    cerb__mutex_unlock(&e->mu);

    while (list) {
        struct zk_reap *r = list;
        bool deleted = false;
        list = r->next;
        if (stalled) {
            r->next = keep;
            keep = r;
            continue;
        }
        int rc = remove_once(e, r->parent, r->node, r->node ? NULL : r->uuid,
                             cerb__deadline_in(e->zc->connect_timeout_ms), &deleted);
        if (rc == ZOK) {
            ZK_COUNT(e, reaped);
            CERB_LOG_I("zk %s: pending deletion of %s done", e->hosts,
                       r->node ? r->node : r->parent);
            reap_entry_free(r);
            continue;
        }
        /* The server is not answering: the rest waits for the next pass
         * rather than each costing the keeper a connect timeout. */
        if (retryable(rc))
            stalled = true;
        if (!retryable(rc) && ++r->refusals >= ZK_REAP_MAX_REFUSALS) {
            CERB_LOG_E("zk %s: giving up deleting %s: %s", e->hosts,
                       r->node ? r->node : r->parent, zerror(rc));
            reap_entry_free(r);
            continue;
        }
        r->next = keep;
        keep = r;
    }

    cerb__mutex_lock(&e->mu);
    while (keep) {
        struct zk_reap *r = keep;
        keep = r->next;
        r->next = e->reap;
        e->reap = r;
    }
    left = e->reap != NULL;
    cerb__mutex_unlock(&e->mu);
    return left;
}

void cerb__zk_reap_free(cerb_engine *e)
{
    while (e->reap) {
        struct zk_reap *r = e->reap;
        e->reap = r->next;
        reap_entry_free(r);
    }
}

enum zk_removed cerb__zk_remove(cerb_engine *e, const char *parent, const char *node,
                                const char *uuid, int64_t deadline_ns)
{
    bool doubt = false, deleted = false;

    for (;;) {
        struct zk_state st;
        if (cerb__zk_wait_connected(e, deadline_ns, NULL, 0, &st) != CERB_OK)
            break;
        int rc = remove_once(e, parent, node, uuid, deadline_ns, &deleted);
        if (rc == ZOK)
            return deleted || doubt ? ZK_REMOVED : ZK_REMOVED_NONODE;
        if (!retryable(rc)) {
            cerb__zk_fail(e->hosts, "delete", node ? node : parent, rc, true, NULL);
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            cerb__zk_reap_add(e, parent, node, uuid);
            cerb__error_set(CERB_EIO, "%s", why);
            return ZK_REMOVE_FAILED;
        }
        doubt = true;
        if (cerb_monotime() >= deadline_ns)
            break;
        /* The connection loss may not have reached the session state yet:
         * do not spin on a socket that is going away. */
        cerb__nap_ms(10);
    }
    cerb__zk_reap_add(e, parent, node, uuid);
    return ZK_REMOVED_LATER;
}

cerb_status cerb__zk_find_mine(cerb_engine *e, uint64_t gen, int64_t sid, const char *parent,
                               const char *uuid, int64_t deadline_ns, char **node,
                               uint64_t *czxid)
{
    struct zk_call *c = NULL, *c2 = NULL;
    cerb_status st = CERB_OK;
    int rc, k;

    *node = NULL;
    c = cerb__zk_call_new(1);
    if (!c)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    struct zk_session *s = cerb__zk_session_begin(e);
    k = s && s->gen == gen ? cerb__zk_call_children(c, s, parent, -1, NULL, uuid) : -1;
    cerb__zk_session_end(e);
    if (k < 0) {
        st = cerb__error_set(CERB_EIO, "zk %s: the session changed", e->hosts);
        goto out;
    }
    if (!cerb__zk_call_wait(c, cerb__zk_call_deadline(e, deadline_ns))) {
        st = cerb__zk_fail(e->hosts, "getChildren", parent, CERB_ZK_RC_ABANDONED, true, NULL);
        goto out;
    }
    rc = c->res[k].rc;
    if (rc == ZNONODE)
        goto out; /* no parent: the create did not land */
    if (rc != ZOK) {
        st = cerb__zk_fail(e->hosts, "getChildren", parent, rc, c->res[k].sent, NULL);
        goto out;
    }
    struct zk_children *kids = &c->res[k].kids;
    if (kids->n_mine == 0)
        goto out;

    /* Whose ephemeral is each? */
    char *paths[ZK_MAX_MINE] = {0};
    int slots[ZK_MAX_MINE];
    size_t n = kids->n_mine;
    c2 = cerb__zk_call_new(n);
    for (size_t i = 0; c2 && i < n; i++)
        if (!(paths[i] = cerb__zk_join(parent, kids->mine[i])))
            st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (!c2)
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (st == CERB_OK) {
        s = cerb__zk_session_begin(e);
        if (s && s->gen == gen)
            for (size_t i = 0; i < n; i++)
                slots[i] = cerb__zk_call_exists(c2, s, paths[i]);
        else
            st = cerb__error_set(CERB_EIO, "zk %s: the session changed", e->hosts);
        cerb__zk_session_end(e);
    }
    if (st == CERB_OK && !cerb__zk_call_wait(c2, cerb__zk_call_deadline(e, deadline_ns)))
        st = cerb__zk_fail(e->hosts, "exists", parent, CERB_ZK_RC_ABANDONED, true, NULL);
    for (size_t i = 0; st == CERB_OK && i < n; i++) {
        const struct zk_res *r = &c2->res[slots[i]];
        if (r->rc == ZNONODE)
            continue;
        if (r->rc != ZOK) {
            st = cerb__zk_fail(e->hosts, "exists", paths[i], r->rc, r->sent, NULL);
            break;
        }
        if (r->stat.ephemeralOwner == sid && !*node) {
            *node = paths[i];
            *czxid = (uint64_t)r->stat.czxid;
            paths[i] = NULL;
            ZK_COUNT(e, adoptions);
            CERB_LOG_I("zk %s: adopted %s after a lost reply", e->hosts, *node);
        } else {
            CERB_LOG_W("zk %s: deleting %s: carries our uuid but belongs to session 0x%llx",
                       e->hosts, paths[i], (unsigned long long)r->stat.ephemeralOwner);
            int drc;
            cerb__zk_call_put(one_call_delete(e, paths[i], deadline_ns, &drc));
            if (drc != ZOK && drc != ZNONODE)
                cerb__zk_reap_add(e, parent, paths[i], uuid);
        }
    }
    for (size_t i = 0; i < n; i++)
        cerb__free(paths[i]);
    if (st != CERB_OK && *node) {
        cerb__free(*node);
        *node = NULL;
    }
out:
    cerb__zk_call_put(c2);
    cerb__zk_call_put(c);
    return st;
}
