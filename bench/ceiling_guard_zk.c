/*
 * ceiling_guard_zk.c — the raw ceiling of the guard scenario on ZooKeeper:
 * the requests engine_zk/zk_guard.c sends for a begin + finish(1) and for a
 * duplicate, on a bare libzookeeper_mt session (ceiling_zk.c's: the same
 * connect, digest auth and ACL) with no library logic: no SHA-256 of the
 * key, no fresh token, no handle, no clock, no renewer, no sweeper.
 *
 * The layout is zk_guard.c's: a record is the persistent node
 * <base>/<scope>/<id>, base "<parent of zk.root>/guard", scope the guard
 * scenario's ("bench-guard"); its data is "<state><token> <life>\n<result>";
 * it has one child, the token node <record>/<token>. So:
 *   begin:     multi [create(record, "R<token> <running_ms>\n"),
 *                     create(token node)] and getData(record), sent back to
 *              back and awaited together (one round trip);
 *   finish(1): multi [setData(token node, version 0),
 *                     setData(record, "D<token> <keep_ms>\n<result>")];
 *   duplicate: the begin's two requests on a done record: the multi fails
 *              NODEEXISTS and the getData carries the result (one round
 *              trip, as the library answers a duplicate once it has read
 *              the server's clock, which it does once for the whole run).
 * The base and the scope are CONTAINER nodes, created once per session (and
 * again should the multi find them gone), as the engine does on NONODE.
 * The records are left for keep_ms, as the library's: any client's guard
 * sweeper removes them once expired.
 *
 * The server counts the requests it receives: mntr's zk_packets_received,
 * summed over the hosts of zk.hosts (so the four-letter word mntr must be
 * allowed: 4lw.commands.whitelist). Each mntr is itself one packet on its
 * host; the session counts those it sent and leaves them out.
 */
#include <zookeeper/zookeeper.h>

#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "scenarios.h"

/* scenario_guard.c's GUARD_SCOPE: the raw records sit beside the
 * library's (their ids differ). */
#define ZKG_SCOPE "bench-guard"
/* "R" + token + " " + life + "\n", as zk_guard.c's HDR_MAX */
#define ZKG_HDR_MAX (1 + 32 + 1 + 20 + 1)
#define ZKG_PATH_MAX 1024
#define ZKG_REC_MAX (ZKG_PATH_MAX + 1 + 64)  /* scope/<64 hex> */
#define ZKG_TOK_MAX (ZKG_REC_MAX + 1 + 32)   /* record/<token> */

struct zg_sess {
    void *base;                     /* bench_zk_open's session */
    zhandle_t *zh;
    const struct ACL_vector *acl;
    const struct cerb_zk_config *zc;
    char scope[ZKG_PATH_MAX];       /* <parent of root>/guard/bench-guard */
    int scope_made;
    uint64_t mntr_sent;             /* our own mntr packets */
    /* The begin's two answers (mu). */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int pending;
    int multi_rc, get_rc;
    zoo_op_result_t res[2];
    char data[ZKG_HDR_MAX + 64];    /* the record read: header + result */
    int data_len;
};

static void multi_done(int rc, const void *p)
{
    struct zg_sess *s = (struct zg_sess *)p;
    pthread_mutex_lock(&s->mu);
    s->multi_rc = rc;
    if (--s->pending == 0)
        pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void get_done(int rc, const char *value, int len, const struct Stat *stat, const void *p)
{
    struct zg_sess *s = (struct zg_sess *)p;
    (void)stat;
    pthread_mutex_lock(&s->mu);
    s->get_rc = rc;
    s->data_len = 0;
    if (rc == ZOK && value && len > 0) {
        s->data_len = len < (int)sizeof s->data ? len : (int)sizeof s->data;
        memcpy(s->data, value, (size_t)s->data_len);
    }
    if (--s->pending == 0)
        pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void zg_close(void *p)
{
    struct zg_sess *s = p;
    if (!s)
        return;
    bench_zk_close(s->base); /* waits for the completions still due */
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void *zg_open(const struct bench_engine *e, char *err, size_t errlen)
{
    struct zg_sess *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (!(s->base = bench_zk_open(e, err, errlen))) {
        zg_close(s);
        return NULL;
    }
    s->zh = bench_zk_handle(s->base);
    s->acl = bench_zk_acl(s->base);
    s->zc = &e->cfg->zk;
    /* cerb__zk_sibling_path(root, "guard"), then the scope. */
    const char *root = s->zc->root;
    int dir = (int)(strrchr(root, '/') - root);
    snprintf(s->scope, sizeof s->scope, "%.*s/guard/%s", dir, root, ZKG_SCOPE);
    return s;
}

/* Create the scope and its ancestors as CONTAINER nodes. */
static int zg_make_scope(struct zg_sess *s, char *err, size_t errlen)
{
    char path[ZKG_PATH_MAX];
    size_t len = strlen(s->scope);
    for (size_t i = 1; i <= len; i++) {
        if (s->scope[i] != '/' && s->scope[i] != '\0')
            continue;
        memcpy(path, s->scope, i);
        path[i] = '\0';
        int rc = zoo_create(s->zh, path, NULL, -1, s->acl, ZOO_CONTAINER, NULL, 0);
        if (rc != ZOK && rc != ZNODEEXISTS) {
            snprintf(err, errlen, "zk %s: create %s: %s", s->zc->hosts, path, zerror(rc));
            return -1;
        }
    }
    s->scope_made = 1;
    return 0;
}

/* The begin's requests on record @rec: multi [create(rec), create(tok)]
 * and getData(rec), back to back, both answers awaited. Returns 0 with the
 * multi's code in *mrc (the read in s->get_rc, s->data), or -1 when the
 * requests could not be submitted (@err). */
static int zg_begin(struct zg_sess *s, const char *rec, const char *tok, const char *token,
                    int64_t running_ms, int *mrc, char *err, size_t errlen)
{
    char hdr[ZKG_HDR_MAX + 1];
    int hl = snprintf(hdr, sizeof hdr, "R%.32s %" PRId64 "\n", token, running_ms);
    zoo_op_t ops[2];
    zoo_create_op_init(&ops[0], rec, hdr, hl, s->acl, ZOO_PERSISTENT, NULL, 0);
    zoo_create_op_init(&ops[1], tok, NULL, -1, s->acl, ZOO_PERSISTENT, NULL, 0);

    pthread_mutex_lock(&s->mu);
    s->pending = 2;
    pthread_mutex_unlock(&s->mu);
    int r1 = zoo_amulti(s->zh, 2, ops, s->res, multi_done, s);
    int r2 = r1 == ZOK ? zoo_aget(s->zh, rec, 0, get_done, s) : r1;
    if (r1 != ZOK || r2 != ZOK) {
        /* A refused request: the session is unusable anyway (and one
         * completion may still come: close waits for it). */
        snprintf(err, errlen, "zk %s: submit: %s", s->zc->hosts, zerror(r1 ? r1 : r2));
        return -1;
    }
    /* Completions always come (ZCONNECTIONLOSS at worst); the bench's
     * grace period bounds a hung server. */
    pthread_mutex_lock(&s->mu);
    while (s->pending > 0)
        pthread_cond_wait(&s->cond, &s->mu);
    *mrc = s->multi_rc;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void zg_paths(struct zg_sess *s, const char *id, const char *token, char *rec, char *tok)
{
    snprintf(rec, ZKG_REC_MAX, "%.1023s/%.64s", s->scope, id);
    snprintf(tok, ZKG_TOK_MAX, "%.1088s/%.32s", rec, token);
}

static int zg_cycle(void *p, const char *id, const char *token, const void *result, size_t len,
                    int64_t running_ms, int64_t keep_ms, char *err, size_t errlen)
{
    struct zg_sess *s = p;
    char rec[ZKG_REC_MAX], tok[ZKG_TOK_MAX];
    int rc;

    zg_paths(s, id, token, rec, tok);
    if (!s->scope_made && zg_make_scope(s, err, errlen) != 0)
        return -1;
    for (int attempt = 0;; attempt++) {
        if (zg_begin(s, rec, tok, token, running_ms, &rc, err, errlen) != 0)
            return -1;
        /* The server removed the empty container scope: again. */
        if (rc == ZNONODE && attempt == 0 && s->res[0].err == ZNONODE) {
            if (zg_make_scope(s, err, errlen) != 0)
                return -1;
            continue;
        }
        break;
    }
    if (rc != ZOK) {
        snprintf(err, errlen, "zk %s: guard begin on %s: multi: %s", s->zc->hosts, rec,
                 zerror(rc));
        return -1;
    }

    char data[ZKG_HDR_MAX + 64];
    int hl = snprintf(data, ZKG_HDR_MAX + 1, "D%.32s %" PRId64 "\n", token,
                      keep_ms < 0 ? -1 : keep_ms);
    if (len > sizeof data - (size_t)hl) {
        snprintf(err, errlen, "zk guard ceiling: a result of %zu bytes is too long", len);
        return -1;
    }
    memcpy(data + hl, result, len);
    zoo_op_t ops[2];
    zoo_op_result_t res[2];
    zoo_set_op_init(&ops[0], tok, NULL, -1, 0, NULL);
    zoo_set_op_init(&ops[1], rec, data, hl + (int)len, -1, NULL);
    rc = zoo_multi(s->zh, 2, ops, res);
    if (rc != ZOK) {
        snprintf(err, errlen, "zk %s: guard finish on %s: multi: %s", s->zc->hosts, rec,
                 zerror(rc));
        return -1;
    }
    return 0;
}

static int zg_duplicate(void *p, const char *id, const char *token, int64_t running_ms,
                        char *err, size_t errlen)
{
    struct zg_sess *s = p;
    char rec[ZKG_REC_MAX], tok[ZKG_TOK_MAX];

    zg_paths(s, id, token, rec, tok);
    int rc;
    if (zg_begin(s, rec, tok, token, running_ms, &rc, err, errlen) != 0)
        return -1;
    if (rc == ZOK) {
        snprintf(err, errlen, "zk guard begin on %s: claimed, not a duplicate (expired?)", rec);
        return -1;
    }
    if (rc != ZNODEEXISTS || s->get_rc != ZOK) {
        snprintf(err, errlen, "zk %s: guard begin on %s: multi %s, getData %s", s->zc->hosts,
                 rec, zerror(rc), zerror(s->get_rc));
        return -1;
    }
    /* A done record: 'D', the token, its life, the result after '\n'. */
    if (s->data_len < 1 + 32 + 1 || s->data[0] != 'D' ||
        !memchr(s->data, '\n', (size_t)s->data_len)) {
        snprintf(err, errlen, "zk guard begin on %s: not a done record", rec);
        return -1;
    }
    return 0;
}

/* mntr on host:port; its zk_packets_received into *out. */
static int zg_mntr(struct zg_sess *s, const char *host, const char *port, uint64_t *out,
                   char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "zk %s:%s: %s", host, port, gai_strerror(gai));
        return -1;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    /* SO_SNDTIMEO bounds connect() too (Linux). */
    int64_t ms = s->zc->connect_timeout_ms;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};
    int rc = -1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 || write(fd, "mntr", 4) != 4) {
        snprintf(err, errlen, "zk %s:%s: mntr: cannot send", host, port);
        goto done;
    }
    s->mntr_sent++; /* it reached the server: one packet */
    char buf[16384];
    size_t n = 0;
    ssize_t got;
    while (n < sizeof buf - 1 && (got = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)got;
    buf[n] = '\0';
    const char *v = strstr(buf, "zk_packets_received\t");
    if (!v) {
        /* e.g. "mntr is not executed because it is not in the whitelist." */
        snprintf(err, errlen, "zk %s:%s: mntr: %.*s", host, port,
                 (int)strcspn(buf, "\n"), n ? buf : "no answer");
        goto done;
    }
    *out = strtoull(v + strlen("zk_packets_received\t"), NULL, 10);
    rc = 0;
done:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

/* Packets received by every host of zk.hosts ("h:p,h:p[/chroot]"), less
 * our own mntr requests. */
static int zg_commands(void *p, uint64_t *out, char *err, size_t errlen)
{
    struct zg_sess *s = p;
    char hosts[1024];
    uint64_t sum = 0;

    snprintf(hosts, sizeof hosts, "%s", s->zc->hosts);
    hosts[strcspn(hosts, "/")] = '\0';
    char *save = NULL;
    for (char *h = strtok_r(hosts, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(h, ':');
        const char *port = colon ? colon + 1 : "2181";
        if (colon)
            *colon = '\0';
        if (h[0] == '[' && h[strlen(h) - 1] == ']') { /* [v6]:port */
            h[strlen(h) - 1] = '\0';
            h++;
        }
        uint64_t one;
        if (zg_mntr(s, h, port, &one, err, errlen) != 0)
            return -1;
        sum += one;
    }
    *out = sum - s->mntr_sent;
    return 0;
}

const struct bench_guard_ceiling bench_guard_ceiling_zk = {
    "zk", zg_open, zg_cycle, zg_duplicate, zg_commands, zg_close,
};
