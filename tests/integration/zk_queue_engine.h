/*
 * zk_queue_engine.h — driving the zk engine's semaphore and read-write lock
 * tables directly (core/engine.h), for test_zk_semaphore.c and
 * test_zk_rwlock.c: engine instances on the suite's server, holds with a
 * token of the test's choosing, the switch gate's question
 * (cerb__engine_gate_ask: the table's fits), and the state an acquisition
 * whose outcome was unknown leaves in its private part (the uuid of its
 * nodes kept for check_owner or release, no node path).
 */
#ifndef CERB_TEST_ZK_QUEUE_ENGINE_H
#define CERB_TEST_ZK_QUEUE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "engine.h"
#include "zk_session.h"
#include "zk_util.h"

static const struct cerb_engine_ops *qe_ops;

struct qe_eng {
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void qe_setup(void)
{
    if (!qe_ops) {
        cerb__engines_builtin();
        qe_ops = cerb__engine_find("zk");
    }
    assert_non_null(qe_ops);
}

static void qe_open(struct qe_eng *g)
{
    qe_setup();
    char *text = cerb_test_zk_config(NULL, NULL, NULL);
    memset(g, 0, sizeof *g);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg, .event = NULL, .ud = NULL};
    if (cerb__engine_open(qe_ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void qe_close(struct qe_eng *g)
{
    cerb__engine_close(qe_ops, g->e);
    cerb__config_free(g->cfg);
}

/* A member: a semaphore's (limit, count) or a read-write lock's (mode). */
struct qe_hold {
    cerb_engine_lock lk;
    void *priv;
    cerb_grant gr;
    struct qe_eng *g;
    int64_t wait_ms;
    cerb_status st;
    atomic_bool done;
};

static void qe_hold_init(struct qe_hold *h, struct qe_eng *g, const char *name, unsigned tok,
                         int prim, int variant, int64_t limit, unsigned count)
{
    memset(h, 0, sizeof *h);
    h->g = g;
    h->priv = calloc(1, qe_ops->lock_priv_size);
    assert_non_null(h->priv);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", tok);
    h->lk.lease_ms = 10000;
    h->lk.priv = h->priv;
    h->lk.epoch = -1;
    h->lk.prim = prim;
    h->lk.variant = variant;
    h->lk.limit = limit;
    h->lk.count = count;
}

static void qe_hold_free(struct qe_hold *h) { free(h->priv); }

static cerb_status qe_acquire(struct qe_hold *h, int64_t wait_ms)
{
    memset(h->priv, 0, qe_ops->lock_priv_size);
    memset(&h->gr, 0, sizeof h->gr);
    int64_t dl = wait_ms > 0 ? cerb__deadline_in(wait_ms) : 0;
    return cerb__engine_acquire(qe_ops, h->g->e, &h->lk, dl, NULL, &h->gr);
}

static cerb_status qe_release(struct qe_hold *h)
{
    return cerb__engine_release(qe_ops, h->g->e, &h->lk);
}

static void *qe_wait_main(void *arg)
{
    struct qe_hold *h = arg;
    h->st = qe_acquire(h, h->wait_ms);
    atomic_store(&h->done, true);
    return NULL;
}

static bool qe_done(void *ud) { return atomic_load(&((struct qe_hold *)ud)->done); }

/* The gate's question on g: would a member like (token tok, ...) fit? */
static cerb_status qe_fits(struct qe_eng *g, const char *name, unsigned tok, int prim,
                           int variant, int64_t limit, unsigned count)
{
    cerb_engine_lock lk;
    memset(&lk, 0, sizeof lk);
    lk.name = name;
    snprintf(lk.token, sizeof lk.token, "%032x", tok);
    lk.lease_ms = 10000;
    lk.epoch = -1;
    lk.prim = prim;
    lk.variant = variant;
    lk.limit = limit;
    lk.count = count;
    return cerb__engine_gate_ask(qe_ops, g->e, &lk, false);
}

#define assert_fits(want, g, name, tok, prim, variant, limit, count)                        \
    do {                                                                                    \
        cerb_status fits_st_ = qe_fits(g, name, tok, prim, variant, limit, count);          \
        if (fits_st_ != (want))                                                             \
            fail_msg("fits(token %x, variant %d, limit %lld, count %u): %s (%s), want %s", \
                     (unsigned)(tok), (int)(variant), (long long)(limit), (unsigned)(count), \
                     cerb_status_name(fits_st_), cerb_last_error(), cerb_status_name(want)); \
    } while (0)

/* A hold whose acquisition ended with an unknown outcome, as zk_mutex.c
 * leaves it: the uuid of its nodes kept (for check_owner or release by
 * it), no node path, no session generation. */
static void qe_hold_unknown(struct qe_hold *h, const char *uuid)
{
    memset(h->priv, 0, qe_ops->lock_priv_size);
    struct zk_lock_priv *p = h->priv;
    snprintf(p->uuid, sizeof p->uuid, "%s", uuid);
}

/* Create `path` and its missing ancestors (persistent, empty). */
static void qe_mkdirs(zhandle_t *zh, const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            int rc = zoo_create(zh, buf, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
            assert_true(rc == ZOK || rc == ZNODEEXISTS);
            *s = c;
            if (c == '\0')
                break;
        }
    }
}

/* How many holders and waiters cerb_inspect lists for `name` whose owner
 * carries `uuid` (and how many in all, in *all). */
static size_t qe_inspect_with(cerb_client *c, int kind, const char *name,
                              const char *uuid, size_t *all)
{
    cerb_holder_info *v = NULL;
    size_t n = 0, k = 0;
    cerb_status st = cerb_inspect(c, kind, name, NULL, &v, &n);
    if (st != CERB_OK)
        fail_msg("inspect: %s (%s)", cerb_status_name(st), cerb_last_error());
    for (size_t i = 0; i < n; i++)
        if (strstr(v[i].owner, uuid))
            k++;
    cerb_holders_free(v, n);
    if (all)
        *all = n;
    return k;
}

#endif
