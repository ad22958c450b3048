/*
 * zk_closure.c — the switch closure record (DESIGN.md §5; the contract is
 * "version 4" in core/engine.h): how a client still on an old configuration
 * is refused here once an operator's switch left this ensemble.
 *
 * The record. One persistent node next to the root, <zk.root>.cerberus-closure
 * (for the default root /cerberus/locks: /cerberus/locks.cerberus-closure),
 * holding the text "<epoch> closed" or "<epoch> open". Lock names are
 * children of the root, so none reaches it, and Curator never looks there.
 * It is one per root, not per parent as the fence offset is (zk_fence.c):
 * roots of two deployments often share a parent, and each deployment's
 * file has epochs of its own. One node per root, a few bytes. A node that does not say a record in
 * exactly that form is an error wherever it is read, never "no record":
 * reading garbage as "open" would let every old client in.
 *
 * Writing (closure_put): sync + getData; a stored epoch at or above the new
 * one stays (raise only); otherwise setData conditional on the version just
 * read, or create when there is no node. A BADVERSION or NODEEXISTS means
 * another writer came in between: read again. So the stored epoch only
 * grows, and a put re-sent after an error finds its own record and stops.
 *
 * Checking it atomically with the grant. A lock node is created in one
 * transaction with a check of this node's version (zk_mutex.c,
 * cerb__zk_call_lock_multi), the version of the reading on which the
 * acquisition decided that the record lets its epoch in. A put in between
 * changes the version, the check fails (nothing is created), and the
 * acquisition reads the record again and decides again. So once a put
 * returned, no lock node created by a refused epoch exists after it: a
 * node made before it may still become the grant later (its predecessor
 * goes), which is why held() counts every child (zk_session.c). A release
 * hands nothing over here: a waiter's own node, created under the check,
 * becomes its grant.
 *
 * Cost. The reading is cached per instance under e->mu, like the fence
 * offset's: in steady state the check is one more operation inside the
 * create's transaction, no extra round trip. The cache is only ever too
 * permissive in a way the server corrects (a stale version fails the
 * check); a refusal from the cache is final, because records only rise:
 * a later record has a higher epoch and refuses every epoch the cached one
 * refused. Only an acquisition with an epoch (lk->epoch >= 0) reads or
 * checks the record; epoch -1 (no check) leaves it alone. The probe does
 * not acquire at all (an exists of the root, zk_session.c), so a closed
 * engine still probes healthy.
 *
 * The node is created "0 open" (its missing parents as containers) by the
 * first acquisition with an epoch that finds none, so that its check has
 * a version to compare. If someone deletes it, it is made again with the
 * highest record this instance has seen; an instance that never saw it
 * would make it "0 open" and let old clients in: the node must not be
 * deleted.
 */
#include "internal_posix.h"

#include "zk_closure.h"

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

/* Readings and writes per call: each retry follows another writer or a
 * connection loss. */
#define ZK_CLOSURE_TRIES 16
/* Our own result code: the node holds no record. */
#define ZK_CLOSURE_RC_BADDATA (-10300)

#define CLOSED_WORD "closed"
#define OPEN_WORD "open"

cerb_status cerb__zk_closure_init(cerb_engine *e)
{
    /* zk.root is validated (absolute, not "/", no trailing '/'). A root
     * named like the record would be the record's node itself. */
    size_t rl = strlen(e->zc->root), tl = sizeof ZK_CLOSURE_NODE - 1;
    if (rl > tl && strcmp(e->zc->root + rl - tl, ZK_CLOSURE_NODE) == 0)
        return cerb__error_set(CERB_ECONFIG, "zk: root \"%s\" ends in \"%s\": it would be "
                               "another root's switch closure record",
                               e->zc->root, ZK_CLOSURE_NODE);
    e->closure.path = cerb__malloc(rl + tl + 1);
    if (!e->closure.path)
        return cerb__error_set(CERB_ENOMEM, "zk: out of memory");
    memcpy(e->closure.path, e->zc->root, rl);
    memcpy(e->closure.path + rl, ZK_CLOSURE_NODE, tl + 1);
    return CERB_OK;
}

void cerb__zk_closure_free(cerb_engine *e)
{
    cerb__free(e->closure.path);
    e->closure.path = NULL;
}

bool cerb__zk_closure_parse(const char *data, int len, cerb_closure *out)
{
    if (!data || len < 3)
        return false;
    int i = 0;
    int64_t v = 0;
    while (i < len && data[i] >= '0' && data[i] <= '9') {
        int d = data[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
        i++;
    }
    /* At least one digit, no leading zero but "0" itself. */
    if (i == 0 || (data[0] == '0' && i > 1) || i >= len || data[i] != ' ')
        return false;
    const char *word = data + i + 1;
    size_t wl = (size_t)(len - i - 1);
    int closed;
    if (wl == strlen(CLOSED_WORD) && memcmp(word, CLOSED_WORD, wl) == 0)
        closed = 1;
    else if (wl == strlen(OPEN_WORD) && memcmp(word, OPEN_WORD, wl) == 0)
        closed = 0;
    else
        return false;
    /* Epoch 0 means "no record": only the "0 open" an acquisition writes. */
    if (v == 0 && closed)
        return false;
    out->epoch = v;
    out->closed = closed;
    return true;
}

bool cerb__zk_closure_format(const cerb_closure *rec, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%" PRId64 " %s", rec->epoch,
                     rec->closed ? CLOSED_WORD : OPEN_WORD);
    return n > 0 && (size_t)n < len;
}

bool cerb__zk_closure_refuses(const cerb_closure *rec, int64_t epoch)
{
    return rec->epoch > epoch || (rec->epoch == epoch && rec->closed);
}

/* Keep the newest reading (mzxid order: also across a re-creation), and
 * the highest record ever seen. */
static void learn(cerb_engine *e, const struct zk_closure_snap *s)
{
    cerb__mutex_lock(&e->mu);
    struct zk_closure *c = &e->closure;
    if (!c->known || s->mzxid >= c->cur.mzxid) {
        c->cur = *s;
        c->known = true;
    }
    if (s->rec.epoch > c->max_seen.epoch)
        c->max_seen = s->rec;
    cerb__mutex_unlock(&e->mu);
}

void cerb__zk_closure_stale(cerb_engine *e, const struct zk_closure_snap *snap)
{
    cerb__mutex_lock(&e->mu);
    struct zk_closure *c = &e->closure;
    if (c->known && c->cur.version == snap->version && c->cur.mzxid == snap->mzxid)
        c->known = false;
    cerb__mutex_unlock(&e->mu);
}


/*
 * sync + getData in one round trip: the sync makes the read current
 * (ZooKeeper orders only one session's requests, and the record is written
 * by other clients), so a put's conditional write does not fail again and
 * again on a lagging server's old version. On ZOK *snap holds the reading,
 * learnt.
 */
static int closure_read(cerb_engine *e, uint64_t gen, int64_t bound, struct zk_closure_snap *snap,
                        bool *sent)
{
    const char *path = e->closure.path;
    struct zk_call *c = cerb__zk_call_new(2);
    if (!c)
        return CERB_ZK_RC_NOMEM;
    struct zk_session *s = cerb__zk_session_begin(e);
    int ks = -1, k = -1;
    if (s && s->gen == gen) {
        ks = cerb__zk_call_sync(c, s, path);
        k = cerb__zk_call_getdata(c, s, path);
    }
    cerb__zk_session_end(e);
    int rc = cerb__zk_call_wait_rc(e, c, k, bound, sent);
    if ((rc == ZOK || rc == ZNONODE) && c->res[ks].rc != ZOK && c->res[ks].rc != ZNONODE)
        rc = c->res[ks].rc; /* a read without its sync may be stale */
    if (rc == ZOK) {
        const struct zk_res *r = &c->res[k];
        snap->version = r->stat.version;
        snap->mzxid = r->stat.mzxid;
        if (cerb__zk_closure_parse(r->buf, r->data_len, &snap->rec))
            learn(e, snap);
        else
            rc = ZK_CLOSURE_RC_BADDATA;
    }
    cerb__zk_call_put(c);
    return rc;
}

/* Create the node holding `text` (rec), its missing ancestors as
 * containers, in one round trip. ZNODEEXISTS when someone was first. */
static int closure_create(cerb_engine *e, uint64_t gen, int64_t bound, const cerb_closure *rec,
                          const char *text, bool *sent)
{
    const char *path = e->closure.path;
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
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = -1;
    if (s && s->gen == gen) {
        for (size_t i = 0; i < made; i++)
            cerb__zk_call_create(c, s, anc[i], NULL, &e->acl, ZOO_CONTAINER);
        k = cerb__zk_call_create(c, s, path, text, &e->acl, ZOO_PERSISTENT);
    }
    cerb__zk_session_end(e);
    rc = cerb__zk_call_wait_rc(e, c, k, bound, sent);
    if (rc == ZOK) {
        struct zk_closure_snap snap = {.rec = *rec, .version = c->res[k].stat.version,
                                       .mzxid = c->res[k].stat.mzxid};
        learn(e, &snap);
    }
out:
    for (size_t i = 0; i < made; i++)
        cerb__free(anc[i]);
    cerb__free(anc);
    cerb__zk_call_put(c);
    return rc;
}

/* setData of `text` (rec) conditional on the reading `from`. */
static int closure_set(cerb_engine *e, uint64_t gen, int64_t bound,
                       const struct zk_closure_snap *from, const cerb_closure *rec,
                       const char *text, bool *sent)
{
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return CERB_ZK_RC_NOMEM;
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s && s->gen == gen
                ? cerb__zk_call_set(c, s, e->closure.path, text, from->version, NULL, NULL, 0)
                : -1;
    cerb__zk_session_end(e);
    int rc = cerb__zk_call_wait_rc(e, c, k, bound, sent);
    if (rc == ZOK) {
        struct zk_closure_snap snap = {.rec = *rec, .version = c->res[k].stat.version,
                                       .mzxid = c->res[k].stat.mzxid};
        learn(e, &snap);
    }
    cerb__zk_call_put(c);
    return rc;
}

/*
 * After a request `what` failed with rc: CERB_OK to try again (connection
 * trouble, and this session, or with want_gen 0 any session, is connected
 * again within the bound), *lost when session want_gen is gone, or the
 * error to return.
 */
static cerb_status trouble(cerb_engine *e, int rc, const char *what, bool sent, uint64_t want_gen,
                           int64_t bound, const atomic_int *intr, bool *lost)
{
    *lost = false;
    if (rc == ZK_CLOSURE_RC_BADDATA)
        return cerb__error_set(CERB_EPROTO, "zk %s: %s holds no switch closure record "
                               "(\"<epoch> closed\" or \"<epoch> open\")",
                               e->hosts, e->closure.path);
    if (rc == CERB_ZK_RC_NOMEM)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    if (rc != ZINVALIDSTATE && rc != ZSESSIONEXPIRED && !cerb__zk_rc_ambiguous(rc))
        return cerb__zk_fail(e->hosts, what, e->closure.path, rc, sent, NULL);
    struct zk_state st;
    cerb_status ws = cerb__zk_wait_connected(e, bound, intr, want_gen, &st);
    if (ws == CERB_NOT_OWNER) {
        *lost = true;
        return CERB_OK;
    }
    if (ws == CERB_OK && cerb_monotime() >= bound)
        ws = cerb__error_set(CERB_EIO, "zk %s: %s %s: no answer in time", e->hosts, what,
                             e->closure.path);
    return ws;
}

cerb_status cerb__zk_closure_prepare(cerb_engine *e, uint64_t gen, int64_t bound_ns,
                                     const atomic_int *intr, bool *restart,
                                     struct zk_closure_snap *snap)
{
    *restart = false;
    for (int i = 0;; i++) {
        cerb__mutex_lock(&e->mu);
        bool known = e->closure.known;
        struct zk_closure_snap cur = e->closure.cur;
        cerb_closure again = e->closure.max_seen;
        cerb__mutex_unlock(&e->mu);
        if (known) {
            *snap = cur;
            return CERB_OK;
        }
        if (i >= ZK_CLOSURE_TRIES)
            return cerb__error_set(CERB_EIO, "zk %s: the switch closure record %s kept "
                                   "changing",
                                   e->hosts, e->closure.path);
        const char *what = "getData";
        bool sent = false;
        struct zk_closure_snap got;
        int rc = closure_read(e, gen, bound_ns, &got, &sent);
        if (rc == ZNONODE) {
            char text[48];
            what = "create";
            cerb__zk_closure_format(&again, text, sizeof text);
            rc = closure_create(e, gen, bound_ns, &again, text, &sent);
            if (rc == ZOK && again.epoch > 0)
                CERB_LOG_W("zk %s: the switch closure record %s had been deleted; made again "
                           "as \"%s\", the last this client saw",
                           e->hosts, e->closure.path, text);
            if (rc == ZNODEEXISTS)
                rc = ZOK; /* someone else made it: read it */
        }
        if (rc == ZOK)
            continue;
        bool lost;
        cerb_status st = trouble(e, rc, what, sent, gen, bound_ns, intr, &lost);
        if (st != CERB_OK)
            return st;
        if (lost) {
            *restart = true;
            return CERB_OK;
        }
    }
}

cerb_status cerb__zk_op_closure_get(cerb_engine *e, cerb_closure *out)
{
    int64_t bound = cerb__deadline_in(e->zc->connect_timeout_ms);
    out->epoch = 0;
    out->closed = 0;
    for (int i = 0; i < ZK_CLOSURE_TRIES; i++) {
        struct zk_state ss;
        cerb_status st = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
        if (st != CERB_OK)
            return st;
        bool sent = false, lost;
        struct zk_closure_snap got;
        int rc = closure_read(e, ss.gen, bound, &got, &sent);
        if (rc == ZOK) {
            *out = got.rec;
            return CERB_OK;
        }
        if (rc == ZNONODE)
            return CERB_OK; /* no record */
        st = trouble(e, rc, "getData", sent, 0, bound, NULL, &lost);
        if (st != CERB_OK)
            return st;
    }
    return cerb__error_set(CERB_EIO, "zk %s: reading the switch closure record %s: no answer "
                           "in %d tries",
                           e->hosts, e->closure.path, ZK_CLOSURE_TRIES);
}

cerb_status cerb__zk_op_closure_put(cerb_engine *e, const cerb_closure *rec, cerb_closure *now)
{
    char text[48];
    if (rec->epoch <= 0 || !cerb__zk_closure_format(rec, text, sizeof text))
        return cerb__error_set(CERB_EINVAL, "zk %s: closure record with epoch %" PRId64,
                               e->hosts, rec->epoch);
    int64_t bound = cerb__deadline_in(e->zc->connect_timeout_ms);
    for (int i = 0; i < ZK_CLOSURE_TRIES; i++) {
        struct zk_state ss;
        cerb_status st = cerb__zk_wait_connected(e, bound, NULL, 0, &ss);
        if (st != CERB_OK)
            return st;
        const char *what = "getData";
        bool sent = false, lost;
        struct zk_closure_snap cur;
        int rc = closure_read(e, ss.gen, bound, &cur, &sent);
        if (rc == ZOK) {
            if (cur.rec.epoch >= rec->epoch) {
                *now = cur.rec; /* raise only: it stays */
                return CERB_OK;
            }
            what = "setData";
            rc = closure_set(e, ss.gen, bound, &cur, rec, text, &sent);
            if (rc == ZBADVERSION || rc == ZNONODE)
                continue; /* another writer came in between: read again */
        } else if (rc == ZNONODE) {
            what = "create";
            rc = closure_create(e, ss.gen, bound, rec, text, &sent);
            if (rc == ZNODEEXISTS)
                continue;
        }
        if (rc == ZOK) {
            CERB_LOG_I("zk %s: switch closure record %s is now \"%s\"", e->hosts,
                       e->closure.path, text);
            *now = *rec;
            return CERB_OK;
        }
        st = trouble(e, rc, what, sent, 0, bound, NULL, &lost);
        if (st != CERB_OK)
            return st;
    }
    return cerb__error_set(CERB_EIO, "zk %s: the switch closure record %s kept changing",
                           e->hosts, e->closure.path);
}
