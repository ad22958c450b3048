/*
 * ceiling_zk.c — the raw ZooKeeper ceiling: the fewest requests a lock in
 * Curator's layout needs, on a bare libzookeeper_mt session with no library
 * logic, so the bench can say what fraction of the server's speed the zk
 * engine keeps.
 *
 * A session is one zhandle (one TCP connection and the client's two
 * threads), made by zookeeper_init2 and awaited until connected within
 * zk.connect_timeout_ms; with zk.user/zk.password it adds the same digest
 * auth the engine does and creates with the same ACL, and it turns off
 * the client's re-resolution of the host list on every socket check, as
 * the engine does. A cycle is:
 *   create2 <root>/<name>/_c_<uuid>-lock- (EPHEMERAL_SEQUENTIAL) and
 *   getChildren <root>/<name>, sent back to back and awaited together
 *   (one round trip: the server answers a session's requests in order);
 *   then delete of the node created (a second round trip).
 * That is the minimum for an uncontended acquire + release that knows it
 * holds (the listing shows no earlier child) and gets a fence (the czxid
 * in create2's stat). The uuid is the owner token in 8-4-4-4-12 form, fixed
 * per thread. The parent is created once, as a CONTAINER node like the
 * engine's, and again should the server have removed it while empty.
 * The round trip for the hand-off scenario is a synchronous exists on "/".
 * The guard's ceiling (ceiling_guard_zk.c) opens its sessions here too.
 * The C client's log is dropped: the ceiling reports its own errors.
 */
#include <zookeeper/zookeeper.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scenarios.h"

#define NS_PER_MS INT64_C(1000000)

struct zk_sess {
    zhandle_t *zh;
    const struct cerb_zk_config *zc;
    struct ACL_vector acl;
    struct ACL acl_entries[2];
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    int connected;
    int pending;
    int create_rc, children_rc;
    int n_children;
    char created[1024];
    char parent[1024];     /* the parent known to exist */
};

static void quiet(const char *message) { (void)message; }

static void watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_sess *s = ctx;
    (void)zh;
    (void)path;
    if (type != ZOO_SESSION_EVENT)
        return;
    pthread_mutex_lock(&s->mu);
    s->connected = state == ZOO_CONNECTED_STATE;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void done_one(struct zk_sess *s)
{
    if (--s->pending == 0)
        pthread_cond_broadcast(&s->cond);
}

static void create_done(int rc, const char *path, const struct Stat *stat, const void *data)
{
    struct zk_sess *s = (struct zk_sess *)data;
    (void)stat;
    pthread_mutex_lock(&s->mu);
    s->create_rc = rc;
    if (rc == ZOK)
        snprintf(s->created, sizeof s->created, "%s", path);
    done_one(s);
    pthread_mutex_unlock(&s->mu);
}

static void children_done(int rc, const struct String_vector *v, const void *data)
{
    struct zk_sess *s = (struct zk_sess *)data;
    pthread_mutex_lock(&s->mu);
    s->children_rc = rc;
    s->n_children = rc == ZOK && v ? v->count : 0;
    done_one(s);
    pthread_mutex_unlock(&s->mu);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait (s->mu held) until *flag == want or the deadline; 0 = it does. */
static int wait_for(struct zk_sess *s, int *flag, int want, int64_t deadline)
{
    while (*flag != want) {
        if (now_ns() >= deadline)
            return -1;
        struct timespec ts = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
        pthread_cond_timedwait(&s->cond, &s->mu, &ts);
    }
    return 0;
}

static void zk_close_sess(void *p)
{
    struct zk_sess *s = p;
    if (!s)
        return;
    if (s->zh)
        zookeeper_close(s->zh);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void *zk_open_sess(const struct bench_engine *e, char *err, size_t errlen)
{
    const struct cerb_zk_config *zc = &e->cfg->zk;
    struct zk_sess *s = calloc(1, sizeof *s);
    pthread_condattr_t ca;

    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->zc = zc;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    s->acl = ZOO_OPEN_ACL_UNSAFE;

    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    s->zh = zookeeper_init2(zc->hosts, watcher, (int)zc->session_timeout_ms, NULL, s, 0, quiet);
    if (!s->zh) {
        snprintf(err, errlen, "zk %s: zookeeper_init: %s", zc->hosts, strerror(errno));
        zk_close_sess(s);
        return NULL;
    }
    /* As the engine does: resolve the hosts only when (re)connecting, not
     * on every socket check (the client's default). */
    zoo_set_servers_resolution_delay(s->zh, -1);
    if (zc->user && zc->user[0]) {
        char auth[512];
        snprintf(auth, sizeof auth, "%s:%s", zc->user, zc->password ? zc->password : "");
        zoo_add_auth(s->zh, "digest", auth, (int)strlen(auth), NULL, NULL);
        s->acl_entries[0].perms = ZOO_PERM_ALL;
        s->acl_entries[0].id = ZOO_AUTH_IDS;
        s->acl_entries[1].perms = ZOO_PERM_READ;
        s->acl_entries[1].id = ZOO_ANYONE_ID_UNSAFE;
        s->acl.count = 2;
        s->acl.data = s->acl_entries;
    }
    pthread_mutex_lock(&s->mu);
    int rc = wait_for(s, &s->connected, 1, now_ns() + zc->connect_timeout_ms * NS_PER_MS);
    pthread_mutex_unlock(&s->mu);
    if (rc != 0) {
        snprintf(err, errlen, "zk %s: no session within %lld ms", zc->hosts,
                 (long long)zc->connect_timeout_ms);
        zk_close_sess(s);
        return NULL;
    }
    return s;
}

/* Create the parent and its ancestors as CONTAINER nodes. */
static int ensure_parent(struct zk_sess *s, const char *parent, char *err, size_t errlen)
{
    char path[1024];
    size_t len = strlen(parent);
    if (len >= sizeof path) {
        snprintf(err, errlen, "zk: path too long");
        return -1;
    }
    for (size_t i = 1; i <= len; i++) {
        if (parent[i] != '/' && parent[i] != '\0')
            continue;
        memcpy(path, parent, i);
        path[i] = '\0';
        int rc = zoo_create(s->zh, path, NULL, -1, &s->acl, ZOO_CONTAINER, NULL, 0);
        if (rc != ZOK && rc != ZNODEEXISTS) {
            snprintf(err, errlen, "zk %s: create %s: %s", s->zc->hosts, path, zerror(rc));
            return -1;
        }
    }
    snprintf(s->parent, sizeof s->parent, "%s", parent);
    return 0;
}

static int zk_cycle(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct zk_sess *s = p;
    char parent[1024], prefix[1200];
    int rc;

    snprintf(parent, sizeof parent, "%s%s%s", s->zc->root,
             strcmp(s->zc->root, "/") == 0 ? "" : "/", name);
    snprintf(prefix, sizeof prefix, "%s/_c_%.8s-%.4s-%.4s-%.4s-%.12s-lock-", parent, token,
             token + 8, token + 12, token + 16, token + 20);
    if (strcmp(s->parent, parent) != 0 && ensure_parent(s, parent, err, errlen) != 0)
        return -1;

    for (int attempt = 0;; attempt++) {
        pthread_mutex_lock(&s->mu);
        s->pending = 2;
        pthread_mutex_unlock(&s->mu);
        int r1 = zoo_acreate2(s->zh, prefix, NULL, -1, &s->acl, ZOO_EPHEMERAL_SEQUENTIAL,
                              create_done, s);
        int r2 = r1 == ZOK ? zoo_aget_children(s->zh, parent, 0, children_done, s) : r1;
        if (r1 != ZOK || r2 != ZOK) {
            snprintf(err, errlen, "zk %s: submit: %s", s->zc->hosts, zerror(r1 ? r1 : r2));
            return -1; /* a refused request: the session is unusable anyway */
        }
        /* Completions always come (ZCONNECTIONLOSS at worst); the bench's
         * grace period bounds a hung server. */
        pthread_mutex_lock(&s->mu);
        while (s->pending > 0)
            pthread_cond_wait(&s->cond, &s->mu);
        int crc = s->create_rc, lrc = s->children_rc, n = s->n_children;
        pthread_mutex_unlock(&s->mu);
        if (crc == ZNONODE && attempt == 0) {
            /* The server removed the empty container parent: again. */
            s->parent[0] = '\0';
            if (ensure_parent(s, parent, err, errlen) != 0)
                return -1;
            continue;
        }
        if (crc != ZOK || lrc != ZOK) {
            snprintf(err, errlen, "zk %s: create %s / getChildren: %s", s->zc->hosts, prefix,
                     zerror(crc != ZOK ? crc : lrc));
            return -1;
        }
        if (n != 1) {
            snprintf(err, errlen, "zk: %s has %d children: not uncontended", parent, n);
            zoo_delete(s->zh, s->created, -1);
            return -1;
        }
        break;
    }
    rc = zoo_delete(s->zh, s->created, -1);
    if (rc != ZOK) {
        snprintf(err, errlen, "zk %s: delete %s: %s", s->zc->hosts, s->created, zerror(rc));
        return -1;
    }
    return 0;
}

static int zk_round_trip(void *p, char *err, size_t errlen)
{
    struct zk_sess *s = p;
    struct Stat st;
    int rc = zoo_exists(s->zh, "/", 0, &st);
    if (rc != ZOK) {
        snprintf(err, errlen, "zk %s: exists /: %s", s->zc->hosts, zerror(rc));
        return -1;
    }
    return 0;
}

/* The session, shared with the guard's ceiling (ceiling_guard_zk.c). */
void *bench_zk_open(const struct bench_engine *e, char *err, size_t errlen)
{
    return zk_open_sess(e, err, errlen);
}

void bench_zk_close(void *sess) { zk_close_sess(sess); }

zhandle_t *bench_zk_handle(void *sess) { return ((struct zk_sess *)sess)->zh; }

const struct ACL_vector *bench_zk_acl(void *sess) { return &((struct zk_sess *)sess)->acl; }

const struct bench_ceiling bench_ceiling_zk = {
    "zk", zk_open_sess, zk_cycle, zk_round_trip, zk_close_sess,
};
