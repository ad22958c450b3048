/*
 * holders_zk.c — `cerberus holders NAME` on ZooKeeper: who holds lock NAME
 * and who waits for it, read from the server in Curator's InterProcessMutex
 * layout (DESIGN.md §4, engine_zk/zk_layout.h).
 *
 * The lock of NAME is the node <zk.root>/<NAME>; each contender is one
 * EPHEMERAL_SEQUENTIAL child `_c_<uuid>-lock-<seq>` of it. Ordered by the
 * text after the last "lock-" (cerb__zk_child_key, the engine's own
 * function, so this reader and the engine agree on who is first), the first
 * child holds the lock and the others wait in that order. For each child we
 * show its name (the uuid identifies one acquisition), the session it is an
 * ephemeral of (the lock lives as long as that session: ZooKeeper has no
 * per-lock lease, and a session's remaining time is not visible to other
 * clients), and for the holder its fence: the node's czxid plus the fence
 * offset (engine_zk/zk_fence.c) its create checked, the engine's fencing
 * counter (the low 48 bits of the token the holder was given). The offset
 * node is read with the children; when its mzxid is below the holder's
 * czxid the value read is the one the create checked (a create checks the
 * offset in its transaction, and the offset only changes by raises); when
 * it was raised after the grant, the value then is gone, and the fence is
 * shown as a bound.
 * Curator writes the holder's address as node data; it is shown when it is
 * not one of our own markers ("cerb:...").
 *
 * Reading takes two round trips on a session of our own: list the children,
 * then get every child (data and stat) and the offset node in one pipelined
 * batch; a child gone
 * between the two was released meanwhile and is left out. Nothing is
 * written and no watch is set. Every step is bounded: the session must
 * connect (and authenticate, with zk.user) within zk.connect_timeout_ms,
 * and the reads must answer within another zk.connect_timeout_ms, else the
 * engine is reported unreachable. zk.hosts is passed to the client as it
 * is, so a chroot suffix ("host:port/app") applies as it does for the
 * engine. The C client's own log goes to stderr only with -v.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zookeeper/zookeeper.h>

#include "alloc.h"
#include "cli.h"
#include "clock.h"
#include "config.h"
#include "sync.h"
#include "zk_layout.h"

/* Our lock nodes carry these data (engine_zk/zk_mutex.c); not shown. */
#define OUR_DATA_PREFIX "cerb:"
/* Foreign node data longer than this is cut in the output. */
#define MAX_SHOWN_DATA 64

struct zk_child {
    struct zk_read *rd;
    char *name;
    bool done;
    int rc;
    struct Stat stat;
    char data[MAX_SHOWN_DATA + 1];
    int data_len;  /* bytes stored in data, -1 = none */
    bool data_cut;
};

/* What the C client's threads report; everything under mu. */
struct zk_read {
    cerb_mutex mu;
    cerb_cond cond;
    bool connected, dead;   /* dead: expired or authentication failed */
    bool auth_done;
    int auth_rc;
    bool list_done;
    int list_rc;
    char **names;           /* the listing, copied */
    size_t n_names;
    size_t n_pending;       /* gets not yet answered */
};

/* The client logs with a callback that has no user data: one flag. */
static int zk_verbose;

static void log_line(const char *message)
{
    if (zk_verbose)
        fprintf(stderr, "cerberus: zk client: %s\n", message);
}

static void session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_read *rd = ctx;
    (void)zh, (void)path;

    if (type != ZOO_SESSION_EVENT)
        return;
    cerb__mutex_lock(&rd->mu);
    if (state == ZOO_CONNECTED_STATE)
        rd->connected = true;
    else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE)
        rd->dead = true;
    else
        rd->connected = false;
    cerb__cond_broadcast(&rd->cond);
    cerb__mutex_unlock(&rd->mu);
}

static void auth_done(int rc, const void *data)
{
    struct zk_read *rd = (struct zk_read *)data;
    cerb__mutex_lock(&rd->mu);
    rd->auth_done = true;
    rd->auth_rc = rc;
    cerb__cond_broadcast(&rd->cond);
    cerb__mutex_unlock(&rd->mu);
}

static void list_done(int rc, const struct String_vector *v, const void *data)
{
    struct zk_read *rd = (struct zk_read *)data;
    char **names = NULL;
    size_t n = 0;

    /* The vector is the client's: copy it before returning. */
    if (rc == ZOK && v && v->count > 0) {
        names = cerb__calloc((size_t)v->count, sizeof *names);
        if (!names)
            rc = ZSYSTEMERROR;
        for (int i = 0; names && i < v->count; i++) {
            names[n] = cerb__strdup(v->data[i]);
            if (!names[n]) {
                rc = ZSYSTEMERROR;
                break;
            }
            n++;
        }
    }
    cerb__mutex_lock(&rd->mu);
    rd->list_done = true;
    rd->list_rc = rc;
    rd->names = names;
    rd->n_names = n;
    cerb__cond_broadcast(&rd->cond);
    cerb__mutex_unlock(&rd->mu);
}

static void get_done(int rc, const char *value, int len, const struct Stat *stat,
                     const void *data)
{
    struct zk_child *c = (struct zk_child *)data;
    struct zk_read *rd = c->rd;

    cerb__mutex_lock(&rd->mu);
    c->done = true;
    c->rc = rc;
    if (rc == ZOK && stat)
        c->stat = *stat;
    c->data_len = -1;
    if (rc == ZOK && value && len >= 0) {
        int k = len > MAX_SHOWN_DATA ? MAX_SHOWN_DATA : len;
        memcpy(c->data, value, (size_t)k);
        c->data[k] = '\0';
        c->data_len = k;
        c->data_cut = len > MAX_SHOWN_DATA;
    }
    rd->n_pending--;
    cerb__cond_broadcast(&rd->cond);
    cerb__mutex_unlock(&rd->mu);
}

/* Child order of the engine: by ordering key, ties by the whole name. */
static int child_cmp(const void *a, const void *b)
{
    const struct zk_child *x = a, *y = b;
    int c = strcmp(cerb__zk_child_key(x->name), cerb__zk_child_key(y->name));
    return c ? c : strcmp(x->name, y->name);
}

/* Waits under rd->mu until *flag or the session died or the deadline. */
static bool wait_for(struct zk_read *rd, const bool *flag, int64_t deadline)
{
    while (!*flag && !rd->dead)
        if (cerb__cond_wait_until(&rd->cond, &rd->mu, deadline))
            break;
    return *flag;
}

/* "<node> (session 0x..., data "...")": one waiter or the holder. */
static void print_child_owner(const struct zk_child *c)
{
    cerb__cli_print_bytes(c->name, strlen(c->name));
    if (c->stat.ephemeralOwner)
        printf(" (session 0x%" PRIx64, (uint64_t)c->stat.ephemeralOwner);
    else
        printf(" (persistent, no session");
    if (c->data_len > 0 && strncmp(c->data, OUR_DATA_PREFIX, strlen(OUR_DATA_PREFIX)) != 0) {
        printf(", data \"");
        cerb__cli_print_bytes(c->data, (size_t)c->data_len);
        printf("%s\"", c->data_cut ? "..." : "");
    }
    printf(")");
}

/* ", fence N" of holder c, given the offset node's reading (rc ZNONODE:
 * never made, no offset yet). */
static void print_fence(const struct zk_child *c, const struct zk_child *off)
{
    uint64_t czxid = (uint64_t)c->stat.czxid, value = 0;
    if (off->rc == ZOK && !off->data_cut &&
        !cerb__zk_fence_parse(off->data, off->data_len, &value)) {
        printf(", fence unknown (the fence offset node holds no number)\n");
        return;
    }
    if (off->rc == ZOK && off->stat.mzxid > c->stat.czxid)
        printf(", fence at most %" PRIu64 " (the fence offset was raised since)\n",
               czxid + value);
    else
        printf(", fence %" PRIu64 "\n", czxid + value);
}

/* Prints the holder and the waiters of a listing that was read; `off` is
 * the offset node's reading. */
static void print_children(struct zk_child *kids, size_t n, const struct zk_child *off)
{
    size_t shown = 0;

    qsort(kids, n, sizeof *kids, child_cmp);
    for (size_t i = 0; i < n; i++) {
        const struct zk_child *c = &kids[i];
        if (c->rc != ZOK)
            continue; /* gone since the listing: released meanwhile */
        if (shown == 0) {
            printf("zk: held by ");
            print_child_owner(c);
            print_fence(c, off);
        } else {
            printf(shown == 1 ? "zk: waiting: " : ", ");
            print_child_owner(c);
        }
        shown++;
    }
    if (shown == 0)
        printf("zk: free\n");
    else if (shown > 1)
        printf("\n");
}

int cerb__cli_holders_zk(const struct cerb_zk_config *zc, const char *name, int verbose)
{
    struct zk_read rd;
    struct zk_child *kids = NULL;
    zhandle_t *zh;
    char *parent = NULL, *auth = NULL, *fence_path = NULL;
    int64_t deadline;
    int rc = CLI_EXIT_OK, zrc;
    size_t n = 0;

    memset(&rd, 0, sizeof rd);
    cerb__mutex_init(&rd.mu);
    cerb__cond_init(&rd.cond);
    parent = cerb__zk_parent_path(zc->root, name);
    if (!parent) {
        cerb__cli_error("zk: out of memory");
        rc = CLI_EXIT_OSERR;
        goto out_sync;
    }
    zk_verbose = verbose;
    zoo_set_debug_level(verbose >= 2 ? ZOO_LOG_LEVEL_INFO
                        : verbose    ? ZOO_LOG_LEVEL_WARN
                                     : ZOO_LOG_LEVEL_ERROR);
    deadline = cerb__deadline_in(zc->connect_timeout_ms);
    zh = zookeeper_init2(zc->hosts, session_watcher, (int)zc->session_timeout_ms, NULL, &rd, 0,
                         log_line);
    if (!zh) {
        printf("zk: unreachable\n");
        cerb__cli_error("zk: unreachable: %s: cannot start a client (bad host list?)",
                        zc->hosts);
        rc = CLI_EXIT_UNAVAILABLE;
        goto out_sync;
    }
    if (zc->user && zc->user[0]) {
        /* Queued now, sent first on connect, as the engine does. */
        size_t len = strlen(zc->user) + 1 + strlen(zc->password ? zc->password : "") + 1;
        auth = malloc(len);
        if (!auth) {
            cerb__cli_error("zk: out of memory");
            rc = CLI_EXIT_OSERR;
            goto out;
        }
        snprintf(auth, len, "%s:%s", zc->user, zc->password ? zc->password : "");
        zrc = zoo_add_auth(zh, "digest", auth, (int)strlen(auth), auth_done, &rd);
        memset(auth, 0, strlen(auth));
        if (zrc != ZOK) {
            printf("zk: error\n");
            cerb__cli_error("zk: %s: digest authentication: %s", zc->hosts, zerror(zrc));
            rc = CLI_EXIT_UNAVAILABLE;
            goto out;
        }
    }

    cerb__mutex_lock(&rd.mu);
    bool up = wait_for(&rd, &rd.connected, deadline);
    if (up && auth)
        up = wait_for(&rd, &rd.auth_done, deadline) && rd.auth_rc == ZOK;
    /* With credentials, a refusal shows as a failed auth or a dead session. */
    bool refused = auth && (rd.dead || rd.auth_done);
    cerb__mutex_unlock(&rd.mu);
    if (!up) {
        if (refused) {
            printf("zk: error\n");
            cerb__cli_error("zk: %s: digest authentication as \"%s\" failed", zc->hosts,
                            zc->user);
        } else {
            printf("zk: unreachable\n");
            cerb__cli_error("zk: unreachable: %s: no session within %" PRId64 " ms", zc->hosts,
                            zc->connect_timeout_ms);
        }
        rc = CLI_EXIT_UNAVAILABLE;
        goto out;
    }

    /* Round trip 1: the children of the lock node. */
    deadline = cerb__deadline_in(zc->connect_timeout_ms);
    zrc = zoo_aget_children(zh, parent, 0, list_done, &rd);
    cerb__mutex_lock(&rd.mu);
    bool listed = zrc == ZOK && wait_for(&rd, &rd.list_done, deadline);
    zrc = zrc == ZOK ? (listed ? rd.list_rc : ZOPERATIONTIMEOUT) : zrc;
    cerb__mutex_unlock(&rd.mu);
    if (zrc == ZNONODE) {
        printf("zk: free\n");
        goto out;
    }
    if (zrc != ZOK) {
        bool down = zrc == ZOPERATIONTIMEOUT || zrc == ZCONNECTIONLOSS ||
                    zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE;
        printf(down ? "zk: unreachable\n" : "zk: error\n");
        cerb__cli_error("zk: %s%s: list %s: %s", down ? "unreachable: " : "", zc->hosts, parent,
                        zrc == ZOPERATIONTIMEOUT ? "no answer in time" : zerror(zrc));
        rc = zrc == ZSYSTEMERROR ? CLI_EXIT_OSERR : CLI_EXIT_UNAVAILABLE;
        goto out;
    }

    /* Round trip 2: every child's data and stat, and the fence offset node
     * (the slot after them), pipelined. The children array outlives
     * zookeeper_close (which answers pending requests). */
    n = rd.n_names;
    if (n == 0) {
        printf("zk: free\n");
        goto out;
    }
    kids = cerb__calloc(n + 1, sizeof *kids);
    fence_path = cerb__zk_fence_path(zc->root);
    if (!kids || !fence_path) {
        cerb__cli_error("zk: out of memory");
        rc = CLI_EXIT_OSERR;
        goto out;
    }
    deadline = cerb__deadline_in(zc->connect_timeout_ms);
    zrc = ZOK;
    for (size_t i = 0; i <= n; i++) {
        char *path = i < n ? cerb__zk_join(parent, rd.names[i]) : cerb__strdup(fence_path);
        kids[i].rd = &rd;
        kids[i].name = i < n ? rd.names[i] : fence_path;
        kids[i].rc = ZSYSTEMERROR;
        if (!path) {
            zrc = ZSYSTEMERROR;
            break;
        }
        cerb__mutex_lock(&rd.mu);
        rd.n_pending++;
        cerb__mutex_unlock(&rd.mu);
        int r = zoo_aget(zh, path, 0, get_done, &kids[i]);
        cerb__free(path);
        if (r != ZOK) {
            cerb__mutex_lock(&rd.mu);
            rd.n_pending--;
            cerb__mutex_unlock(&rd.mu);
            zrc = r;
            break;
        }
    }
    cerb__mutex_lock(&rd.mu);
    while (rd.n_pending > 0 && !rd.dead)
        if (cerb__cond_wait_until(&rd.cond, &rd.mu, deadline))
            break;
    bool all = rd.n_pending == 0;
    for (size_t i = 0; all && zrc == ZOK && i <= n; i++)
        if (kids[i].rc != ZOK && kids[i].rc != ZNONODE)
            zrc = kids[i].rc;
    cerb__mutex_unlock(&rd.mu);
    if (!all && zrc == ZOK)
        zrc = ZOPERATIONTIMEOUT;
    if (zrc != ZOK) {
        bool down = zrc == ZOPERATIONTIMEOUT || zrc == ZCONNECTIONLOSS ||
                    zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE;
        printf(down ? "zk: unreachable\n" : "zk: error\n");
        cerb__cli_error("zk: %s%s: read the children of %s: %s", down ? "unreachable: " : "",
                        zc->hosts, parent,
                        zrc == ZOPERATIONTIMEOUT ? "no answer in time" : zerror(zrc));
        rc = zrc == ZSYSTEMERROR ? CLI_EXIT_OSERR : CLI_EXIT_UNAVAILABLE;
        goto out;
    }
    print_children(kids, n, &kids[n]);
out:
    /* Answers what is still pending (ZCLOSING) before it returns. */
    zookeeper_close(zh);
out_sync:
    cerb__free(kids);
    cerb__free(fence_path);
    for (size_t i = 0; i < rd.n_names; i++)
        cerb__free(rd.names[i]);
    cerb__free(rd.names);
    free(auth);
    cerb__free(parent);
    cerb__cond_destroy(&rd.cond);
    cerb__mutex_destroy(&rd.mu);
    return rc;
}
