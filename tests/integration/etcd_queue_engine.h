/*
 * etcd_queue_engine.h — for test_etcd_semaphore.c and test_etcd_rwlock.c:
 * the etcd engine driven directly, as the core drives it (engine.h), for
 * what the public API does not reach: the switch gate's question
 * (cerb__engine_gate_ask, which asks the table's fits) and the release of
 * a member whose acquire had an unknown outcome. Such a member is put here
 * by hand, exactly as the acquire's txn puts it (key, value, the engine's
 * session lease), with the hold's state as that acquire leaves it when
 * the answer to its put is lost (lease, generation, key shape known; no
 * revision, never granted).
 */
#ifndef CERB_ETCD_QUEUE_ENGINE_H
#define CERB_ETCD_QUEUE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "engine.h"
#include "etcd_internal.h"
#include "etcd_queue.h"
#include "etcd_util.h"

struct qe {
    const struct cerb_engine_ops *ops;
    struct cerb_config *cfg;
    cerb_engine *e;
};

static void qe_open(struct qe *g)
{
    memset(g, 0, sizeof *g);
    g->ops = cerb__engine_find("etcd");
    if (!g->ops)
        fail_msg("no etcd engine: %s", cerb_last_error());
    char *text = etcd_test_config(NULL, NULL);
    if (cerb__config_from_string(text, &g->cfg) != CERB_OK)
        fail_msg("config: %s", cerb_last_error());
    free(text);
    cerb_engine_env env = {.cfg = g->cfg};
    if (cerb__engine_open(g->ops, &env, &g->e) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
}

static void qe_close(struct qe *g)
{
    cerb__engine_close(g->ops, g->e);
    cerb__config_free(g->cfg);
}

/* A hold as the core makes it: token "%032x" of `tok`. */
struct qh {
    cerb_engine_lock lk;
    struct etcd_lock_priv priv;
};

static void qh_init(struct qh *h, const char *name, int prim, int variant, int64_t limit,
                    unsigned count, unsigned tok)
{
    memset(h, 0, sizeof *h);
    h->lk.name = name;
    snprintf(h->lk.token, sizeof h->lk.token, "%032x", tok);
    h->lk.lease_ms = 10000;
    h->lk.fair = 1;
    h->lk.priv = &h->priv;
    h->lk.epoch = -1;
    h->lk.prim = prim;
    h->lk.variant = variant;
    h->lk.limit = limit;
    h->lk.count = count;
}

static cerb_status qh_acquire(struct qe *g, struct qh *h, int64_t wait_ms)
{
    cerb_grant gr;
    return cerb__engine_acquire(g->ops, g->e, &h->lk, wait_ms ? cerb__deadline_in(wait_ms) : 0,
                                NULL, &gr);
}

static cerb_status qh_release(struct qe *g, struct qh *h)
{
    return cerb__engine_release(g->ops, g->e, &h->lk);
}

/* The gate's question on engine g for a member like this one. */
static cerb_status qe_fits(struct qe *g, const char *name, int prim, int variant, int64_t limit,
                           unsigned count, unsigned tok)
{
    struct qh h;
    qh_init(&h, name, prim, variant, limit, count, tok);
    h.lk.priv = NULL; /* fits never reads it: lk may be another engine's */
    return cerb__engine_gate_ask(g->ops, g->e, &h.lk, false);
}

/*
 * Leave h's member in the queue as an acquire on g whose put landed and
 * whose answer was lost leaves it: the session's key (a semaphore member
 * whose session has none of the name yet) unless alt, the token-named one
 * (a further member; every read-write lock member). Its key into key.
 */
static void qh_lost_reply(struct qe *g, struct qh *h, bool alt, char *key, size_t n)
{
    struct etcd_session s;
    cerb__etcd_session_peek(g->e, &s);
    assert_true(s.live && s.id > 0);
    alt = alt || h->lk.prim == CERB_PRIM_RWLOCK;
    struct etcd_qkeys qk;
    assert_int_equal(cerb__etcd_qkeys_init(&qk, g->e->ec->prefix, h->lk.prim, h->lk.name,
                                           h->lk.variant, s.id, h->lk.token, alt),
                     CERB_OK);
    char val[40];
    size_t vn = cerb__etcd_qvalue_format(
        0, h->lk.prim == CERB_PRIM_SEMAPHORE ? h->lk.count : 1, val, sizeof val);
    assert_true(vn > 0);
    assert_int_equal(etcd_test_put_value(etcd_test_port(), qk.k, val, s.id), 0);
    snprintf(key, n, "%s", qk.k);
    cerb__etcd_qkeys_free(&qk);
    h->priv.lease = s.id;
    h->priv.gen = s.gen;
    h->priv.alt = alt;
    h->priv.rev = 0;
}

/* What the engine's inspect lists for name: holders, waiters, and whether
 * an entry's owner is `owner` (NULL: not asked). */
struct qe_seen {
    size_t holders, waiters;
    bool owner_seen, owner_waiting;
};

static struct qe_seen qe_inspect(struct qe *g, const char *name, int prim, const char *owner)
{
    struct cerb_holders out = {0};
    struct qe_seen r = {0};
    if (cerb__engine_inspect(g->ops, g->e, name, prim, &out) != CERB_OK)
        fail_msg("inspect: %s", cerb_last_error());
    for (size_t i = 0; i < out.n; i++) {
        *(out.v[i].waiting ? &r.waiters : &r.holders) += 1;
        if (owner && out.v[i].owner && strcmp(out.v[i].owner, owner) == 0) {
            r.owner_seen = true;
            r.owner_waiting = out.v[i].waiting != 0;
        }
    }
    cerb__holders_clear(&out);
    return r;
}

#endif
