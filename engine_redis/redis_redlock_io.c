/*
 * redis_redlock_io.c — Redlock's nodes: opening them, the per-node scripts,
 * the parallel fan-out, the delayed restart and the counters' re-seed
 * (redis_redlock.h).
 */
#include "internal_posix.h"

#include <errno.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_redlock.h"
#include "redis_scripts.h"

/*
 * Every script that counts on a node's state starts with this: the node's
 * marker M (redis_marker.h, the last key) must be there, else 'L' (the node
 * lost its data: the client makes M again, with a quarantine, and the node
 * does not vote this time); while the server's time is before M's
 * quarantine end, {'Q', ms left} (a restart, a history change or a loss
 * less than a lease ago: no vote, no write). `inc` is the node's
 * incarnation, M's id and the replication id it records: the seed S (the
 * field 'seed' of the state hash H, "<inc> <floor>") counts only when it
 * was written in this incarnation, so a node that came back from an older
 * snapshot (its seed and counters restored, stale) or lost its data is
 * unseeded until re-seeded from a majority. `s` is the floor (nil when
 * unseeded), `hi` the largest counter it has seen. hi and seed are fields
 * of one hash, so an eviction or a loss takes both.
 */
#define RL_STATE(M, H, Q)                                                        \
    "local mk = redis.call('GET', KEYS[" #M "])\n"                              \
    "if not mk then return 'L' end\n"                                            \
    "local mid, mq, mr = string.match(mk, '^(%S+) (%d+) ?(%x*)$')\n"            \
    "if not mid then return 'L' end\n"                                           \
    "local t = redis.call('TIME')\n"                                             \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"   \
    "local qleft = tonumber(mq) - now\n"                                         \
    Q                                                                            \
    "local inc = mid .. ' ' .. mr\n"                                             \
    "local sv = redis.call('HGET', KEYS[" #H "], 'seed')\n"                     \
    "local s = nil\n"                                                            \
    "if sv then\n"                                                               \
    "  local si, sf = string.match(sv, '^(.*) (%d+)$')\n"                       \
    "  if si == inc then s = tonumber(sf) end\n"                                 \
    "end\n"                                                                      \
    "local hi = tonumber(redis.call('HGET', KEYS[" #H "], 'hi') or '0')\n"
#define RL_NO_VOTE_IN_Q "if qleft > 0 then return {'Q', qleft} end\n"

/* KEYS K F H M; ARGV value lease fence(0|1) fence_ttl. A re-sent grant
 * (K already ours) answers as the first did (a counter gone since answers
 * hi, never 0). A missing counter restarts above hi, so a name's counter
 * never goes back when it expires; one at or below the seed (the node lost
 * it) starts above the seed. */
static const char rl_acquire_lua[] =
    RL_STATE(4, 3, RL_NO_VOTE_IN_Q)
    "local v = redis.call('GET', KEYS[1])\n"
    "if v == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  if ARGV[3] == '0' then return {1, 0, 0} end\n"
    "  return {1, tonumber(redis.call('GET', KEYS[2]) or '') or hi, s and 1 or 0}\n"
    "end\n"
    "if v then return {0, redis.call('PTTL', KEYS[1])} end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "if ARGV[3] == '0' then return {1, 0, 0} end\n"
    "local c = tonumber(redis.call('GET', KEYS[2]) or '')\n"
    "if c then c = c + 1 else c = hi + 1 end\n"
    "if s and c <= s then c = s + 1 end\n"
    "redis.call('SET', KEYS[2], string.format('%d', c), 'PX', ARGV[4])\n"
    "if c > hi then redis.call('HSET', KEYS[3], 'hi', string.format('%d', c)) end\n"
    "return {1, c, s and 1 or 0}\n";

/* KEYS K M; ARGV value lease topup(0|1). 1 extended, 2: K was absent and is
 * ours now (topped up), 0 not ours, 3 quarantined (nothing done). */
static const char rl_renew_lua[] =
    "local mk = redis.call('GET', KEYS[2])\n"
    "if not mk then return 'L' end\n"
    "local mq = tonumber(string.match(mk, '^%S+ (%d+)') or '')\n"
    "if not mq then return 'L' end\n"
    "local t = redis.call('TIME')\n"
    "if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) < mq then return 3 end\n"
    "local v = redis.call('GET', KEYS[1])\n"
    "if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end\n"
    "if not v and ARGV[3] == '1' then\n"
    "  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2\n"
    "end\n"
    "return 0\n";

static const char rl_release_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end\n"
    "return 0\n";

static const char rl_check_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return {1, redis.call('PTTL', KEYS[1])} end\n"
    "return {0}\n";

static const char rl_inspect_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v then return {} end\n"
    "return {v, redis.call('PTTL', KEYS[1])}\n";

/* KEYS K F H M; ARGV value c fence_ttl. Raise only, and only while K is
 * ours: the write-back is ordered before any later grant on this node.
 * 1 seeded, 0 not (or quarantined), -1 K not ours. */
static const char rl_writeback_lua[] =
    RL_STATE(4, 3, "if qleft > 0 then return 0 end\n")
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"
    "local c = tonumber(ARGV[2])\n"
    "if c > tonumber(redis.call('GET', KEYS[2]) or '0') then\n"
    "  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])\n"
    "end\n"
    "if c > hi then redis.call('HSET', KEYS[3], 'hi', ARGV[2]) end\n"
    "return s and 1 or 0\n";

/* KEYS H M: {seeded in this incarnation, hi} (also in quarantine). */
static const char rl_readseed_lua[] =
    RL_STATE(2, 1, "")
    "return {s and 1 or 0, hi}\n";

/* KEYS H M; ARGV s. The seed of this incarnation, raised only. */
static const char rl_reseed_lua[] =
    RL_STATE(2, 1, "")
    "local n = tonumber(ARGV[1])\n"
    "if not s or n > s then redis.call('HSET', KEYS[1], 'seed', inc .. ' ' .. ARGV[1]) end\n"
    "if n > hi then redis.call('HSET', KEYS[1], 'hi', ARGV[1]) end\n"
    "return 1\n";

static const char *const rl_lua[RL_SCRIPT_COUNT] = {
    rl_acquire_lua, rl_renew_lua,     rl_release_lua,  rl_check_lua,
    rl_inspect_lua, rl_writeback_lua, rl_readseed_lua, rl_reseed_lua,
};

static cerb_status sha1_hex(const char *s, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(s, strlen(s), md, &len, EVP_sha1(), NULL) != 1 || len != 20)
        return cerb__error_set(CERB_EIO, "redis redlock: SHA-1 of a script failed");
    for (unsigned i = 0; i < 20; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return CERB_OK;
}

int64_t cerb__redis_rl_bound_ms(const cerb_engine *top, int64_t lease_ms)
{
    int64_t b = lease_ms / 20;
    if (b < RL_NODE_MIN_MS)
        b = RL_NODE_MIN_MS;
    if (b > top->rc->op_timeout_ms)
        b = top->rc->op_timeout_ms;
    return b;
}

static bool parse_node(const char *s, char *host, size_t hl, int *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= hl || colon == s)
        return false;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535)
        return false;
    *port = (int)p;
    return true;
}

cerb_status cerb__redis_rl_open(cerb_engine *top)
{
    const struct cerb_redis_config *rc = top->rc;
    struct redis_redlock *rl;
    cerb_status st = CERB_OK;

    if (rc->n_nodes < 1 || rc->n_nodes > RL_MAX_NODES)
        return cerb__error_set(CERB_ECONFIG, "redis: redlock mode needs 1 to %d redis.nodes",
                               RL_MAX_NODES);
    rl = cerb__calloc(1, sizeof *rl);
    if (!rl)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    top->rl = rl;
    rl->n = (int)rc->n_nodes;
    rl->quorum = rl->n / 2 + 1;
    rl->fence = rc->redlock_fence == CERB_REDLOCK_FENCE_QUORUM;
    atomic_store(&rl->max_lease_ms, top->cfg->lock.lease_ms);
    const char *prefix = rc->prefix ? rc->prefix : "";
    size_t need = strlen(prefix) + sizeof REDIS_SEP "cerberus" REDIS_SEP "redlock";
    rl->state_key = cerb__malloc(need);
    if (!rl->state_key) {
        cerb__free(rl);
        top->rl = NULL;
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    }
    snprintf(rl->state_key, need, "%s" REDIS_SEP "cerberus" REDIS_SEP "redlock", prefix);
    for (int s = 0; s < RL_SCRIPT_COUNT && st == CERB_OK; s++)
        st = sha1_hex(rl_lua[s], rl->sha[s]);
    if (rl->n < 3 || rl->n % 2 == 0)
        CERB_LOG_W("redis redlock: %d nodes; an odd number of 3 or more is what tolerates a "
                   "failure (%d must answer)", rl->n, rl->quorum);
    int64_t nb = cerb__redis_rl_bound_ms(top, top->cfg->lock.lease_ms);
    for (int i = 0; i < rl->n && st == CERB_OK; i++) {
        struct rl_node *nd = &rl->nodes[i];
        if (!parse_node(rc->nodes[i], nd->cn.host, sizeof nd->cn.host, &nd->cn.port)) {
            st = cerb__error_set(CERB_ECONFIG, "redis: redlock node \"%s\" is not host:port",
                                 rc->nodes[i]);
            break;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(rl->nodes[j].cn.host, nd->cn.host) == 0 &&
                rl->nodes[j].cn.port == nd->cn.port)
                st = cerb__error_set(CERB_ECONFIG, "redis: redlock node %s:%d is listed twice "
                                     "(it would vote twice)", nd->cn.host, nd->cn.port);
        if (st != CERB_OK)
            break;
        st = cerb__redis_node_new(top, &nd->cn);
        if (st != CERB_OK)
            break;
        /* Connecting (and its set-up round trip) happens before the
         * fan-out: keep a node that accepts but does not answer within the
         * per-node bound of the configured lease. */
        nd->cn.rc.mode = CERB_REDIS_SINGLE;
        int64_t setup = nb < RL_SETUP_MAX_MS ? nb : RL_SETUP_MAX_MS;
        if (nd->cn.rc.connect_timeout_ms > setup)
            nd->cn.rc.connect_timeout_ms = setup;
        if (nd->cn.rc.op_timeout_ms > setup)
            nd->cn.rc.op_timeout_ms = setup;
        nd->cn.e->rl_node = true;
    }
    if (st != CERB_OK) {
        cerb__redis_rl_close(top);
        return st;
    }
    /* The fence's node index: the rank of the node's "host:port" among
     * all, so that clients listing the nodes in another order agree. */
    for (int i = 0; i < rl->n; i++)
        for (int j = 0; j < rl->n; j++)
            rl->nodes[i].id += strcmp(rc->nodes[j], rc->nodes[i]) < 0;
    /* A quorum must answer now. With fencing, every node found without its
     * marker gets one (its quarantine starts) and every node that lost its
     * fencing state is re-seeded from a majority before it votes. */
    if (rl->fence) {
        st = cerb__redis_rl_reseed(top, nb);
    } else {
        const char *ping = "PING";
        size_t pingl = 4;
        struct rl_req rq = {.script = -1, .argc = 1, .argv = &ping, .argl = &pingl};
        struct rl_reply rep[RL_MAX_NODES];
        cerb__redis_rl_fanout(top, (1u << rl->n) - 1, &rq, nb, rep);
        int ok = 0;
        for (int i = 0; i < rl->n; i++)
            ok += rep[i].st == CERB_OK && rep[i].r->type != REDIS_REPLY_ERROR;
        if (ok < rl->quorum) {
            char why[1024];
            cerb__redis_rl_failed(top, rep, why, sizeof why);
            st = cerb__error_set(CERB_EIO, "redis redlock: %d of %d nodes answered, %d needed: "
                                 "%s", ok, rl->n, rl->quorum, why);
        }
        cerb__redis_rl_free(rep, rl->n);
    }
    if (st != CERB_OK)
        cerb__redis_rl_close(top);
    return st;
}

void cerb__redis_rl_close(cerb_engine *top)
{
    struct redis_redlock *rl = top->rl;
    if (!rl)
        return;
    for (int i = 0; i < rl->n; i++)
        if (rl->nodes[i].cn.e)
            cerb__redis_node_close(rl->nodes[i].cn.e);
    cerb__free(rl->state_key);
    cerb__free(rl);
    top->rl = NULL;
}

static cerb_status append_req(struct redis_redlock *rl, struct redis_conn *c,
                              const struct rl_req *rq, bool eval)
{
    const char *argv[16];
    size_t argl[16];
    char nk[16];
    int n = 0;

    if (rq->script < 0)
        return cerb__redis_append(c, rq->argc, rq->argv, rq->argl);
    if (rq->argc + 3 > 16)
        return cerb__error_set(CERB_EINVAL, "redis redlock: too many script arguments");
    snprintf(nk, sizeof nk, "%d", rq->nkeys);
    argv[n] = eval ? "EVAL" : "EVALSHA", argl[n] = strlen(argv[n]), n++;
    argv[n] = eval ? rl_lua[rq->script] : rl->sha[rq->script], argl[n] = strlen(argv[n]), n++;
    argv[n] = nk, argl[n] = strlen(nk), n++;
    for (int i = 0; i < rq->argc; i++)
        argv[n] = rq->argv[i], argl[n] = rq->argl[i], n++;
    return cerb__redis_append(c, n, argv, argl);
}

static void fail(struct rl_reply *p, cerb_status st, cerb_outcome oc, const char *why)
{
    p->st = st;
    p->oc = oc;
    snprintf(p->why, sizeof p->why, "%s", why);
}

/*
 * A node whose maxmemory-policy may evict keys can drop a lock key, a
 * counter or its marker alone (a key with a TTL under volatile-*, any key
 * under allkeys-*), and nothing on the node would show it: it votes in no
 * quorum, and says so once.
 */
static bool evicts(cerb_engine *top, int i, const struct redis_conn *c)
{
    struct rl_node *nd = &top->rl->nodes[i];
    if (strcmp(c->policy, "noeviction") == 0)
        return false;
    if (!atomic_exchange(&nd->evict_said, true))
        CERB_LOG_E("redis redlock: %s has maxmemory-policy %s: it may evict lock keys, so it "
                   "votes in no quorum; set maxmemory-policy noeviction on it",
                   nd->cn.e->where, c->policy);
    return true;
}

/* A failed node is skipped for RL_SKIP_MS, jittered by up to a quarter so
 * that clients do not all come back to it at once. */
static int64_t skip_ns(void)
{
    int64_t ms = RL_SKIP_MS + (int64_t)cerb__rand_below(RL_SKIP_MS / 4 + 1);
    return ms * CERB_NS_PER_MS;
}

void cerb__redis_rl_fanout(cerb_engine *top, unsigned mask, const struct rl_req *rq,
                           int64_t bound_ms, struct rl_reply *rep)
{
    struct redis_redlock *rl = top->rl;
    struct redis_conn *c[RL_MAX_NODES] = {0};
    bool waiting[RL_MAX_NODES] = {0}, late[RL_MAX_NODES] = {0};
    int64_t dl[RL_MAX_NODES] = {0};
    int64_t start = cerb_monotime();

    for (int i = 0; i < rl->n; i++) {
        memset(&rep[i], 0, sizeof rep[i]);
        rep[i].st = CERB_EIO;
    }
    /*
     * Warm connections first, then the nodes that need a connect: a node
     * that accepts but does not answer (its set-up bounded by
     * min(bound, RL_SETUP_MAX_MS)) delays no request to the others. Each
     * node's bound runs from its own send; the callers' validity window
     * runs from before the first, so a late quorum still fails there.
     */
    for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < rl->n; i++) {
        struct rl_reply *p = &rep[i];
        if (!(mask & (1u << i)) || p->asked)
            continue;
        cerb_engine *ne = rl->nodes[i].cn.e;
        if (pass == 0 && !cerb__redis_has_warm(ne))
            continue;
        p->asked = true;
        if (start < atomic_load(&rl->nodes[i].skip_until_ns)) {
            char why[400];
            snprintf(why, sizeof why, "redis %.200s: failed less than %d ms ago", ne->where,
                     RL_SKIP_MS);
            fail(p, CERB_EIO, CERB_OUTCOME_NO, why);
            continue;
        }
        cerb_status st = cerb__redis_get(ne, cerb_monotime() + bound_ms * CERB_NS_PER_MS, &c[i]);
        if (st != CERB_OK) {
            atomic_store(&rl->nodes[i].skip_until_ns, cerb_monotime() + skip_ns());
            fail(p, st, CERB_OUTCOME_NO, cerb_last_error());
            continue;
        }
        p->out = evicts(top, i, c[i]);
        st = append_req(rl, c[i], rq, false);
        cerb_outcome oc = CERB_OUTCOME_NO;
        if (st == CERB_OK)
            st = cerb__redis_send(ne, c[i], "redlock request", &oc);
        if (st != CERB_OK) {
            fail(p, st, oc, cerb_last_error());
            continue;
        }
        waiting[i] = true;
        dl[i] = cerb_monotime() + bound_ms * CERB_NS_PER_MS;
        if (rq->script == RL_ACQUIRE)
            REDIS_COUNT(ne, acquire_calls);
    }
    for (;;) {
        struct pollfd pfd[RL_MAX_NODES];
        int idx[RL_MAX_NODES], np = 0;
        for (int i = 0; i < rl->n; i++)
            if (waiting[i]) {
                pfd[np].fd = c[i]->ctx->fd;
                pfd[np].events = POLLIN;
                pfd[np].revents = 0;
                idx[np++] = i;
            }
        if (np == 0)
            break;
        /* Until the nearest node's bound; past it, one last poll(0) and
         * read (an answer already here is not thrown away), then the
         * nodes past their bound are given up. */
        int64_t next = INT64_MAX;
        for (int j = 0; j < np; j++)
            if (dl[idx[j]] < next)
                next = dl[idx[j]];
        int64_t left = cerb__ms_left(next);
        int k = poll(pfd, (nfds_t)np, (int)(left <= 0 ? 0 : left > 1000 ? 1000 : left));
        if (k < 0 && errno != EINTR)
            k = 0, left = 0;
        for (int j = 0; k > 0 && j < np; j++) {
            if (!pfd[j].revents)
                continue;
            int i = idx[j];
            struct rl_reply *p = &rep[i];
            redisContext *ctx = c[i]->ctx;
            void *r = NULL;
            if (redisBufferRead(ctx) != REDIS_OK || redisReaderGetReply(ctx->reader, &r) != REDIS_OK) {
                c[i]->broken = true;
                waiting[i] = false;
                char why[400];
                snprintf(why, sizeof why, "redis %.200s: %.150s", rl->nodes[i].cn.e->where,
                         ctx->errstr[0] ? ctx->errstr : "connection lost");
                fail(p, CERB_EIO, CERB_OUTCOME_UNKNOWN, why);
                continue;
            }
            if (!r)
                continue; /* part of a reply */
            redisReply *rr = r;
            if (rq->script >= 0 && rr->type == REDIS_REPLY_ERROR &&
                strncmp(rr->str, "NOSCRIPT", 8) == 0) {
                /* Not run: send the body once on the same connection. */
                freeReplyObject(rr);
                cerb_outcome oc = CERB_OUTCOME_NO;
                cerb_status st = append_req(rl, c[i], rq, true);
                if (st == CERB_OK)
                    st = cerb__redis_send(rl->nodes[i].cn.e, c[i], "redlock EVAL", &oc);
                if (st != CERB_OK) {
                    waiting[i] = false;
                    fail(p, st, oc, cerb_last_error());
                }
                continue;
            }
            waiting[i] = false;
            p->st = CERB_OK;
            p->r = rr;
        }
        if (left <= 0) {
            int64_t now = cerb_monotime();
            for (int j = 0; j < np; j++)
                if (waiting[idx[j]] && now >= dl[idx[j]])
                    waiting[idx[j]] = false, late[idx[j]] = true;
        }
    }
    for (int i = 0; i < rl->n; i++) {
        if (!waiting[i] && cerb__redis_is_lost(rep[i].r)) {
            /* The node lost its data (no marker: a restart without it, a
             * FLUSHALL, an eviction): make the marker again, which starts
             * its quarantine; the script changed nothing. */
            char why[400];
            cerb_engine *ne = rl->nodes[i].cn.e;
            cerb_status st = cerb__redis_marker_fetch(ne, c[i]);
            snprintf(why, sizeof why, "redis %.200s: lost its data (%s)", ne->where,
                     st == CERB_OK ? "marker made again, quarantined" : cerb_last_error());
            freeReplyObject(rep[i].r);
            rep[i].r = NULL;
            rep[i].lost = true;
            fail(&rep[i], CERB_EIO, CERB_OUTCOME_NO, why);
        }
        if (late[i] || waiting[i]) {
            char why[400];
            c[i]->broken = true; /* a late answer must not meet the next request */
            /* Closed with a reset, not a FIN: bytes still queued (a
             * compare-and-DEL whose segment was lost) die with it instead
             * of being retransmitted into a later attempt's grant. */
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            (void)setsockopt(c[i]->ctx->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            atomic_store(&rl->nodes[i].skip_until_ns, cerb_monotime() + skip_ns());
            snprintf(why, sizeof why, "redis %.200s: no answer within %lld ms",
                     rl->nodes[i].cn.e->where, (long long)bound_ms);
            fail(&rep[i], CERB_EIO, CERB_OUTCOME_UNKNOWN, why);
        }
        if (c[i])
            cerb__redis_put(rl->nodes[i].cn.e, c[i]);
    }
}

void cerb__redis_rl_free(struct rl_reply *rep, int n)
{
    for (int i = 0; i < n; i++)
        if (rep[i].r) {
            freeReplyObject(rep[i].r);
            rep[i].r = NULL;
        }
}

void cerb__redis_rl_failed(const cerb_engine *top, const struct rl_reply *rep, char *buf,
                           size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < top->rl->n && off < len; i++) {
        if (!rep[i].asked || rep[i].st == CERB_OK)
            continue;
        int k = snprintf(buf + off, len - off, "%s%s", off ? "; " : "", rep[i].why);
        if (k < 0)
            break;
        off += (size_t)k;
    }
    if (!buf[0])
        snprintf(buf, len, "none failed");
}

/*
 * Re-seed (stores.md §3.7): a node without the seed key lost its counters
 * (or is new). Every grant reported since was written back to a majority
 * of seeded nodes, and any majority of nodes that kept their state meets
 * it, so the largest hi of such a majority is at least every fence handed
 * out: the node's counters start above it. When no node is seeded at all
 * (a new set of masters, or a majority lost: outside the guarantee) the
 * answering majority seeds itself from the largest hi it has.
 */
cerb_status cerb__redis_rl_reseed(cerb_engine *top, int64_t bound_ms)
{
    struct redis_redlock *rl = top->rl;
    cerb_engine *n0 = rl->nodes[0].cn.e;
    const char *keys[2] = {rl->state_key, n0->marker_key};
    size_t kl[2] = {strlen(rl->state_key), n0->marker_key_len};
    struct rl_req rq = {.script = RL_READSEED, .nkeys = 2, .argc = 2, .argv = keys, .argl = kl};
    struct rl_reply rep[RL_MAX_NODES];
    int answered = 0, seeded = 0;
    long long hi_seeded = 0, hi_all = 0;
    unsigned unseeded = 0, all = 0;

    /* A node that answered 'L' has its marker made again now: read once
     * more, so it is re-seeded in this call. */
    bool again = true;
    for (int round = 0; round < 2 && again; round++) {
        again = false;
        answered = seeded = 0;
        hi_seeded = hi_all = 0;
        unseeded = all = 0;
        cerb__redis_rl_fanout(top, (1u << rl->n) - 1, &rq, bound_ms, rep);
        for (int i = 0; i < rl->n; i++) {
            redisReply *r = rep[i].r;
            again |= rep[i].lost;
            if (rep[i].st != CERB_OK || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_INTEGER ||
                r->element[1]->type != REDIS_REPLY_INTEGER)
                continue;
            answered++;
            all |= 1u << i;
            long long hi = r->element[1]->integer;
            if (hi > hi_all)
                hi_all = hi;
            /* A node that may evict keys may have lost its counters. */
            if (r->element[0]->integer == 1 && !rep[i].out) {
                seeded++;
                if (hi > hi_seeded)
                    hi_seeded = hi;
            } else {
                unseeded |= 1u << i;
            }
        }
        cerb__redis_rl_free(rep, rl->n);
    }
    long long s;
    unsigned to;
    if (seeded >= rl->quorum) {
        s = hi_seeded, to = unseeded;
    } else if (answered >= rl->quorum) {
        /* New masters, or a majority lost its state: the guarantee is gone
         * (a fence handed out before may come again); the largest counter
         * left is the best start there is, and refusing forever is worse. */
        s = hi_all, to = unseeded;
        if (seeded == 0)
            CERB_LOG_W("redis redlock: no node holds fencing state (new masters, or every node "
                       "lost its data): fences restart above %lld on the %d nodes that answered",
                       s, answered);
        else
            CERB_LOG_E("redis redlock: only %d of %d nodes kept their fencing state (%d "
                       "needed): a fence handed out before may be handed out again; the others "
                       "start above %lld", seeded, rl->n, rl->quorum, s);
    } else {
        return cerb__error_set(CERB_UNAVAILABLE, "redis redlock: %d of %d nodes answered, %d "
                               "needed to re-seed fencing state", answered, rl->n, rl->quorum);
    }
    (void)all;
    if (!to)
        return CERB_OK;
    char sv[24];
    snprintf(sv, sizeof sv, "%lld", s);
    const char *argv[3] = {keys[0], keys[1], sv};
    size_t argl[3] = {kl[0], kl[1], strlen(sv)};
    struct rl_req wq = {.script = RL_RESEED, .nkeys = 2, .argc = 3, .argv = argv, .argl = argl};
    cerb__redis_rl_fanout(top, to, &wq, bound_ms, rep);
    for (int i = 0; i < rl->n; i++)
        if (rep[i].asked && rep[i].st == CERB_OK)
            CERB_LOG_I("redis redlock: %s re-seeded: its counters start above %lld",
                       rl->nodes[i].cn.e->where, s);
    cerb__redis_rl_free(rep, rl->n);
    return CERB_OK;
}

void cerb__redis_rl_stats(cerb_engine *top, struct redis_counters *sum)
{
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < top->rl->n; i++) {
        struct redis_counters *c = &top->rl->nodes[i].cn.e->stats;
        cerb__redis_counters_add(sum, c);
    }
}
