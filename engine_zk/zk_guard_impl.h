/*
 * zk_guard_impl.h — what the zk guard's two files share: the methods
 * (zk_guard.c) and the sweeper (zk_guard_sweep.c). The record's data and
 * its expiry, the requests' waits and the server's clock; zk_guard.c says
 * what they are.
 */
#ifndef CERB_ZK_GUARD_IMPL_H
#define CERB_ZK_GUARD_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "sync.h"
#include "zk_call.h"

/* Allowance for the leader's clock: a record's mtime and the clock's may
 * come from different leaders. */
#define ZK_GUARD_SKEW_MS 200

struct zk_guard {
    char *base;        /* <parent of root>/guard */
    char *clock;       /* <parent of root>/guard-clock */
    bool collides;     /* zk.root is the base itself */
    cerb_mutex mu;     /* the clock reading */
    bool clk_known;
    int64_t clk_ms;       /* server time: the clock write's mtime */
    int64_t clk_sent_ns;  /* monotonic, before that write was sent */
    struct zk_sweeper *sweeper;
};

/* A record's data, parsed (pointing into the buffer read). */
struct rec_view {
    char state;
    char token[33];
    int64_t life;
    const char *res;
    size_t res_len;
};

/* "a/b" or "a/b/c" (c NULL), allocated; NULL when out of memory. */
char *cerb__zkg_path(const char *a, const char *b, const char *c);
/* Read a record's data; false when it is not one (a node of someone
 * else's under our base). */
bool cerb__zkg_rec_parse(const char *buf, int len, struct rec_view *v);
/* The first operation of a failed transaction that says why (-1: none). */
int cerb__zkg_failed_op(const struct zk_res *r);
/* The deadline of a guard request sent now: zk.connect_timeout_ms. */
int64_t cerb__zkg_bound(cerb_engine *e);
/* Wait for every answer of c until the deadline; with `stop` (the
 * sweeper's), in slices, giving up once it is set. */
bool cerb__zkg_call_wait(struct zk_call *c, int64_t deadline, const atomic_bool *stop);
/* The server's time now (a write to the clock node, its mtime); with
 * `stop` (the sweeper): no wait for a connection. */
cerb_status cerb__zkg_server_now(cerb_engine *e, int64_t *now_ms, const atomic_bool *stop);

/* Expired, by the server's time now_ms, with the skew allowed. */
static inline bool cerb__zkg_expired_at(int64_t now_ms, int64_t mtime, int64_t life)
{
    return life >= 0 && now_ms > mtime + life + ZK_GUARD_SKEW_MS;
}

#endif
