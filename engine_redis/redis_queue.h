/*
 * redis_queue.h — what the semaphore (redis_semaphore.c) and the
 * read-write lock (redis_rwlock.c) share: the description of a layout's
 * keys, and the generic operations of engine.h's cerb_queue_methods over
 * it (redis_queue.c), which run one Lua script per step and wait on a
 * wake list of their own as the mutex's waiters do (redis_wait.c).
 *
 * Keys. Every key of a name is in one cluster slot: a base key B (the
 * semaphore's npm sorted set "<prefix>semaphore:<name>", or the lock key
 * "<prefix><name>" of a read-write lock, which that primitive never writes)
 * and helpers "{B}^_<suffix>" (^_ the byte 0x1f), built as the mutex's
 * (cerb__redis_keys_build: "{n}B^_<suffix>" in cluster mode when B has a
 * '}'). Suffixes start with "sem:" or "rw:", which no mutex helper does, so
 * the helpers of a lock, a semaphore and a read-write lock never meet.
 */
#ifndef CERB_REDIS_QUEUE_H
#define CERB_REDIS_QUEUE_H

#include "redis_scripts.h"

/* A key a script of the primitive gets, in KEYS order. */
enum redis_qkey_what {
    REDIS_QK_BASE,   /* B itself */
    REDIS_QK_HELPER, /* {B}^_<sfx> */
    REDIS_QK_MARK,   /* the data-loss marker of B's slot (redis_marker.h) */
    REDIS_QK_WAKE    /* {B}^_<sfx><token>: the caller's wake list */
};
struct redis_qkey {
    enum redis_qkey_what what;
    const char *sfx;
};

#define REDIS_QK_MAX 8

struct cerb_holders;

/* One primitive's layout and scripts. */
struct redis_qkind {
    int prim;                     /* CERB_PRIM_SEMAPHORE or CERB_PRIM_RWLOCK */
    const char *infix;            /* B = prefix + infix + name */
    int nkeys;
    struct redis_qkey keys[REDIS_QK_MAX];
    enum redis_script acquire, release, renew, check, held, inspect;
    /* The inspect script's answer into out (holders, then waiters). */
    cerb_status (*read_inspect)(cerb_engine *e, const char *name, const redisReply *r,
                                struct cerb_holders *out);
};

extern const struct redis_qkind cerb__redis_qkind_sem, cerb__redis_qkind_rw;

/* Acquire/release/renew/check/held/inspect of a kind (engine.h). */
cerb_status cerb__redis_q_acquire(const struct redis_qkind *k, cerb_engine *e,
                                  cerb_engine_lock *lk, int64_t deadline_ns,
                                  const atomic_int *interrupted, cerb_grant *g);
cerb_status cerb__redis_q_release(const struct redis_qkind *k, cerb_engine *e,
                                  cerb_engine_lock *lk);
cerb_status cerb__redis_q_renew(const struct redis_qkind *k, cerb_engine *e,
                                cerb_engine_lock *lk, cerb_grant *g);
cerb_status cerb__redis_q_check(const struct redis_qkind *k, cerb_engine *e,
                                cerb_engine_lock *lk, cerb_grant *g);
cerb_status cerb__redis_q_held(const struct redis_qkind *k, cerb_engine *e, const char *name);
cerb_status cerb__redis_q_inspect(const struct redis_qkind *k, cerb_engine *e, const char *name,
                                  struct cerb_holders *out);

/* Lua pieces both layouts use (the text of redis_queue.c's comments). */
#define REDIS_Q_STR_(x) #x
#define REDIS_Q_STR(x) REDIS_Q_STR_(x)

/* now (server ms), tick (100 us) and QEND, the quarantine's end read from
 * the marker value mk (LUA_MARKER_CHECK) sent as ARGV[A]. */
#define LUA_Q_CLOCK(A)                                                           \
    "local t = redis.call('TIME')\n"                                             \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"    \
    "local tick = tonumber(t[1]) * 10000 + math.floor(tonumber(t[2]) / 100)\n"   \
    "local q0 = #ARGV[" #A "] + 2\n"                                             \
    "local qe = string.find(mk, ' ', q0, true)\n"                                \
    "local QEND = tonumber(string.sub(mk, q0, qe and qe - 1 or -1)) or 0\n"

/* The mutex's fence rule (redis_scripts.c): the counter + 1 or the clock in
 * ticks, a lost counter REDIS_FENCE_SEED ticks ahead, above the floor FL. */
#define LUA_Q_FENCE                                                              \
    "local function next_fence(tick, FL)\n"                                      \
    "  local c = tonumber(redis.call('GET', F) or '')\n"                         \
    "  local f = c and math.max(c + 1, tick) or tick + " REDIS_Q_STR(REDIS_FENCE_SEED) "\n" \
    "  if f <= FL then f = FL + 1 end\n"                                         \
    "  redis.call('SET', F, string.format('%d', f), 'PX', " REDIS_Q_STR(REDIS_FENCE_TTL_MS) ")\n" \
    "  return f\n"                                                               \
    "end\n"                                                                      \
    "local function wake(tk)\n"                                                  \
    "  local w = WB .. tk\n"                                                     \
    "  if redis.call('LLEN', w) == 0 then\n"                                     \
    "    redis.call('RPUSH', w, 'w')\n"                                          \
    "    redis.call('PEXPIRE', w, WTTL)\n"                                       \
    "  end\n"                                                                    \
    "end\n"

/* The closure record (redis_closure.h) in single and Sentinel mode: M ..
 * "\x1fclosure", read when ARGV[8] (the epoch) is sent. LEAVE is Lua that
 * takes our member out. */
#define LUA_Q_CLOSURE(M, LEAVE)                                                  \
    "if ARGV[8] then\n"                                                          \
    "  local cv = redis.call('GET', KEYS[" #M "] .. '\\31closure')\n"            \
    "  if cv then\n"                                                             \
    "    local ce, cs = string.match(cv, '^(%d+) ([a-z]+)$')\n"                  \
    "    ce = tonumber(ce)\n"                                                    \
    "    local ep = tonumber(ARGV[8])\n"                                         \
    "    local CL = cs == 'closed'\n"                                            \
    "    if not ce or (not CL and cs ~= 'open') or\n"                            \
    "       (ep >= 0 and (ce > ep or (ce == ep and CL))) then\n"                 \
    LEAVE                                                                        \
    "      return {'C', cv}\n"                                                   \
    "    end\n"                                                                  \
    "  end\n"                                                                    \
    "end\n"

#endif
