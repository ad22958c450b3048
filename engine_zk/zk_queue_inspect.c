/*
 * zk_queue_inspect.c — inspect() for the zk engine's semaphores and
 * read-write locks (cerb_inspect with CERB_KIND_SEMAPHORE / _RWLOCK,
 * DESIGN.md §13), read in Curator's layouts (zk_semaphore.c, zk_rwlock.c)
 * on the engine's own session. Read-only, no watch, each round trip
 * bounded by zk.connect_timeout_ms as zk_inspect.c's.
 *
 * Semaphore: list leases/ and locks/ and read count (one round trip), then
 * the stat of every child and the fence offset node (a second). Lease nodes
 * are grouped by their protection uuid ("_c_<uuid>-"): ours share one per
 * acquisition, Curator's have one each. In sequence order, groups are
 * holders while the permits so far fit the stored limit (all of them when
 * no count is stored); the rest are the leases the holder of locks/ made
 * and waits with. Then the nodes queued on locks/ that made no lease yet,
 * in their order, as waiters. Details: "permits K of N" (N "?" without a
 * count), the session, and a foreign node's data.
 *
 * Read-write lock: the children of <root>/<name> in Curator's order; the
 * first writer alone holds when it is first, else the readers before the
 * first writer hold; the rest wait. Details "read" / "write", the session.
 *
 * A holder's fence is its (first) node's czxid plus the offset read now,
 * marked "fence at most" when the offset changed after the node was made,
 * as zk_inspect.c does.
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

#define OUR_DATA_PREFIX "cerb:"
#define FENCE_AT_MOST "; fence at most: the fence offset was raised since the grant"

struct kid {
    const char *name;
    const struct zk_res *res;
    const char *key;
};

static int kid_cmp(const void *a, const void *b)
{
    const struct kid *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : strcmp(x->name, y->name);
}

/* ", session 0x..." and a foreign node's data, appended to buf. */
static void describe(const struct zk_res *r, char *buf, size_t len)
{
    size_t n = strlen(buf);
    if (r->stat.ephemeralOwner)
        n += (size_t)snprintf(buf + n, len - n, ", session 0x%" PRIx64,
                              (uint64_t)r->stat.ephemeralOwner);
    if (n >= len)
        return;
    size_t kept = r->data_len < 0 ? 0
                  : (size_t)r->data_len < sizeof r->data ? (size_t)r->data_len
                                                         : sizeof r->data;
    const char *nul = memchr(r->data, '\0', kept);
    if (nul)
        kept = (size_t)(nul - r->data);
    if (kept > 0 && (kept < strlen(OUR_DATA_PREFIX) ||
                     memcmp(r->data, OUR_DATA_PREFIX, strlen(OUR_DATA_PREFIX)) != 0))
        snprintf(buf + n, len - n, ", data \"%.*s%s\"", (int)kept, r->data,
                 (size_t)r->data_len > kept ? "..." : "");
}

static cerb_status failed(cerb_engine *e, const char *what, const char *path, bool answered,
                          const struct zk_res *r)
{
    if (!answered)
        return cerb__error_set(CERB_EIO, "zk %s: inspect: %s %s: no answer within %lld ms",
                               e->hosts, what, path, (long long)e->zc->connect_timeout_ms);
    return cerb__zk_fail(e->hosts, what, path, r->rc, r->sent, NULL);
}

/*
 * List each of dirs[0..nd) (a missing one is empty), optionally getting
 * `extra` (a node's data) in the same round trip; then get every child of
 * every dir and the fence offset node in a second. *c1, *c2 are the calls
 * (the caller puts them); lists[i] is the slot of dirs[i] in c1, the
 * extra's slot is nd; in c2 the children follow in listing order and the
 * offset node is last.
 */
static cerb_status read_dirs(cerb_engine *e, const char *const *dirs, int nd, const char *extra,
                             struct zk_call **c1, struct zk_call **c2)
{
    struct zk_state zs;
    cerb__zk_state(e, &zs);
    *c1 = *c2 = NULL;
    if (!zs.connected)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    *c1 = cerb__zk_call_new((size_t)nd + 1);
    if (!*c1)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    struct zk_session *s = cerb__zk_session_begin(e);
    for (int i = 0; s && i < nd; i++)
        cerb__zk_call_list(*c1, s, dirs[i]);
    if (s && extra)
        cerb__zk_call_getdata(*c1, s, extra);
    cerb__zk_session_end(e);
    if (!s)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    bool answered = cerb__zk_call_wait(*c1, cerb__deadline_in(e->zc->connect_timeout_ms));
    size_t total = 0;
    for (int i = 0; i < nd; i++) {
        const struct zk_res *r = &(*c1)->res[i];
        if (!answered || (r->rc != ZOK && r->rc != ZNONODE))
            return failed(e, "inspect: children", dirs[i], answered, r);
        total += r->rc == ZOK ? (size_t)r->n_names : 0;
    }
    if (extra) {
        const struct zk_res *r = &(*c1)->res[nd];
        if (r->rc != ZOK && r->rc != ZNONODE)
            return failed(e, "inspect: get", extra, true, r);
    }
    *c2 = cerb__zk_call_new(total + 1);
    if (!*c2)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    s = cerb__zk_session_begin(e);
    for (int i = 0; s && i < nd; i++) {
        const struct zk_res *r = &(*c1)->res[i];
        for (int j = 0; r->rc == ZOK && j < r->n_names; j++) {
            char *path = cerb__zk_join(dirs[i], r->names[j]);
            if (!path) {
                cerb__zk_session_end(e);
                return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
            }
            cerb__zk_call_get(*c2, s, path);
            cerb__free(path);
        }
    }
    if (s)
        cerb__zk_call_get(*c2, s, e->fence.path);
    cerb__zk_session_end(e);
    if (!s)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    answered = cerb__zk_call_wait(*c2, cerb__deadline_in(e->zc->connect_timeout_ms));
    for (size_t i = 0; i <= total; i++) {
        const struct zk_res *r = &(*c2)->res[i];
        if (!answered || (r->rc != ZOK && r->rc != ZNONODE))
            return failed(e, "inspect: get", i < total ? "a child" : e->fence.path, answered, r);
    }
    return CERB_OK;
}

/* The fence of a holder whose first node is r; detail gets the caveat. */
static uint64_t holder_fence(const struct zk_res *off, const struct zk_res *r, char *detail,
                             size_t len)
{
    uint64_t offset = 0;
    bool ok = off->rc == ZNONODE;
    if (off->rc == ZOK)
        ok = off->data_len >= 0 && (size_t)off->data_len <= sizeof off->data &&
             cerb__zk_fence_parse(off->data, off->data_len, &offset);
    if (!ok)
        return 0;
    if (off->rc == ZOK && off->stat.mzxid > r->stat.czxid) {
        size_t k = strlen(detail);
        snprintf(detail + k, len - k, "%s", FENCE_AT_MOST);
    }
    return (uint64_t)r->stat.czxid + offset;
}

/* Fill kids from listing slot `list` of c1 and the gets from `at` in c2;
 * returns how many (a child gone meanwhile is left out). */
static size_t gather(const struct zk_res *list, const struct zk_call *c2, size_t at,
                     struct kid *kids, const char *mark)
{
    size_t n = 0;
    for (int j = 0; list->rc == ZOK && j < list->n_names; j++) {
        const struct zk_res *r = &c2->res[at + (size_t)j];
        if (r->rc != ZOK)
            continue;
        const char *nm = list->names[j];
        kids[n].name = nm;
        kids[n].res = r;
        kids[n].key = mark == ZK_RW_ORDER ? cerb__zk_child_key_rw(nm)
                                          : cerb__zk_child_key_mark(nm, mark);
        n++;
    }
    qsort(kids, n, sizeof *kids, kid_cmp);
    return n;
}

/* Length of name's protection group ("_c_<uuid>-"), or 0 for none. */
static size_t group_len(const char *name)
{
    size_t pl = strlen(ZK_PROTECT_PREFIX);
    if (strncmp(name, ZK_PROTECT_PREFIX, pl) != 0 || strlen(name) <= pl + ZK_UUID_LEN ||
        name[pl + ZK_UUID_LEN] != '-')
        return 0;
    return pl + ZK_UUID_LEN + 1;
}

cerb_status cerb__zk_sem_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    char *base = cerb__zk_parent_path(e->zc->root, name);
    char *leases = base ? cerb__zk_join(base, "leases") : NULL;
    char *locks = base ? cerb__zk_join(base, "locks") : NULL;
    char *count = base ? cerb__zk_join(base, "count") : NULL;
    struct zk_call *c1 = NULL, *c2 = NULL;
    struct kid *kl = NULL, *kk = NULL;
    cerb_status st = CERB_OK;

    if (!leases || !locks || !count) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    const char *dirs[2] = {leases, locks};
    st = read_dirs(e, dirs, 2, count, &c1, &c2);
    if (st != CERB_OK)
        goto out;
    const struct zk_res *l0 = &c1->res[0], *l1 = &c1->res[1], *cnt = &c1->res[2];
    size_t n0 = l0->rc == ZOK ? (size_t)l0->n_names : 0;
    size_t n1 = l1->rc == ZOK ? (size_t)l1->n_names : 0;
    const struct zk_res *off = &c2->res[n0 + n1];
    char limit[24] = "?";
    int64_t lim = -1;
    if (cnt->rc == ZOK && cnt->data_len == 4) {
        const unsigned char *u = (const unsigned char *)cnt->buf;
        lim = (int64_t)((uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3]);
        snprintf(limit, sizeof limit, "%" PRId64, lim);
    }
    kl = cerb__calloc(n0 + 1, sizeof *kl);
    kk = cerb__calloc(n1 + 1, sizeof *kk);
    if (!kl || !kk) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    size_t m0 = gather(l0, c2, 0, kl, ZK_LEASE_MARK);
    size_t m1 = gather(l1, c2, n0, kk, ZK_LOCK_MARK);
    int64_t sum = 0;
    for (size_t i = 0; i < m0 && st == CERB_OK;) {
        size_t gl = group_len(kl[i].name), j = i + 1;
        /* Our leases of one acquisition are consecutive (made by the
         * holder of locks/); a Curator lease is a group of its own. */
        while (gl && j < m0 && strncmp(kl[j].name, kl[i].name, gl) == 0)
            j++;
        unsigned k = (unsigned)(j - i);
        sum += k;
        bool holder = lim < 0 || sum <= lim;
        char detail[224];
        snprintf(detail, sizeof detail, "permits %u of %s", k, limit);
        describe(kl[i].res, detail, sizeof detail);
        uint64_t fence = holder ? holder_fence(off, kl[i].res, detail, sizeof detail) : 0;
        st = cerb__holders_add(out, kl[i].name, strlen(kl[i].name), !holder, fence, -1, detail);
        i = j;
    }
    /* Queued on locks/ without a lease yet (the holder of locks/ that made
     * leases is listed above by them). */
    for (size_t i = 0; i < m1 && st == CERB_OK; i++) {
        size_t gl = group_len(kk[i].name);
        bool leased = false;
        for (size_t j = 0; gl && j < m0 && !leased; j++)
            leased = strncmp(kl[j].name, kk[i].name, gl) == 0;
        if (leased)
            continue;
        char detail[224];
        snprintf(detail, sizeof detail, "permits ? of %s, queued on locks/", limit);
        describe(kk[i].res, detail, sizeof detail);
        st = cerb__holders_add(out, kk[i].name, strlen(kk[i].name), 1, 0, -1, detail);
    }
out:
    cerb__free(kl);
    cerb__free(kk);
    cerb__zk_call_put(c2);
    cerb__zk_call_put(c1);
    cerb__free(count);
    cerb__free(locks);
    cerb__free(leases);
    cerb__free(base);
    return st;
}

cerb_status cerb__zk_rw_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    char *base = cerb__zk_parent_path(e->zc->root, name);
    struct zk_call *c1 = NULL, *c2 = NULL;
    struct kid *kids = NULL;
    cerb_status st;

    if (!base)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    const char *dirs[1] = {base};
    st = read_dirs(e, dirs, 1, NULL, &c1, &c2);
    if (st != CERB_OK)
        goto out;
    size_t n = c1->res[0].rc == ZOK ? (size_t)c1->res[0].n_names : 0;
    const struct zk_res *off = &c2->res[n];
    kids = cerb__calloc(n + 1, sizeof *kids);
    if (!kids) {
        st = cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
        goto out;
    }
    size_t m = gather(&c1->res[0], c2, 0, kids, ZK_RW_ORDER);
    bool blocked = false; /* a writer (holding or not) came before */
    for (size_t i = 0; i < m && st == CERB_OK; i++) {
        bool writer = cerb__zk_child_is_writer(kids[i].name);
        bool reader = !writer && strstr(kids[i].name, ZK_READ_MARK) != NULL;
        bool holder = !blocked && (reader || (writer && i == 0));
        if (writer || !reader)
            blocked = true;
        char detail[224];
        snprintf(detail, sizeof detail, "%s", writer ? "write" : reader ? "read" : "other");
        describe(kids[i].res, detail, sizeof detail);
        uint64_t fence = holder ? holder_fence(off, kids[i].res, detail, sizeof detail) : 0;
        st = cerb__holders_add(out, kids[i].name, strlen(kids[i].name), !holder, fence, -1,
                               detail);
    }
out:
    cerb__free(kids);
    cerb__zk_call_put(c2);
    cerb__zk_call_put(c1);
    cerb__free(base);
    return st;
}
