/*
 * redis_scripts.c — the Lua scripts of the Redis engine and the operations
 * that are one script run: renew, release, check_owner, renew_batch, probe.
 *
 * Every decision about a lock is taken inside one script, atomically on the
 * server, and every script compares the owner token before it changes K:
 * a release or renewal by a client that no longer holds the lock is a
 * no-op that answers "not owner". Scripts read the time with TIME, never a
 * client's clock (Redis >= 5 replicates scripts by effects, so TIME in a
 * writing script is allowed; BLPOP's fractional timeout needs Redis >= 6).
 *
 * Every script first compares the data-loss marker M's id with the one the
 * instance knows (redis_marker.h) and answers "L", changing nothing, when
 * they differ; the quarantine end is read from M. A fence is
 * max(F + 1, server time in ms), stored back in F
 * with a one-day expiry ("next fence" below).
 *
 * acquire(K F Q D W M; token lease wait fair marker floor)
 *   floor > 0         -> F is first raised to floor (if lower), so this
 *                        grant and every later one of the name, by anyone,
 *                        ranks above it: a client that switched engines
 *                        by itself asks for it (engine.h, fence_floor).
 *   quarantine        -> (server time before M's qend: after a loss of data
 *                        or a change of history)
 *                        nothing is granted or handed over: "busy", with
 *                        at least the quarantine's rest as PTTL.
 *   K free, no queue  -> SET K PX lease, next fence: granted. This
 *                        uncontended path comes first in the script and
 *                        touches nothing else (measured on Redis 7.0: the
 *                        helper closures and a table reply cost more than
 *                        the commands). Without a queue our wake list can
 *                        hold at most a stale "w", which expires unread.
 *   K == token        -> ours already (a retried request, or handed to us
 *                        and not yet noticed): extend, leave the queue,
 *                        granted. This makes acquire idempotent per token.
 *   K free, a queue   -> drop waiters at the head of Q whose deadline has
 *                        passed. Fair and a live head other than us: hand
 *                        the lock to the head and go on as "busy" (no
 *                        barging past the queue). Otherwise take it and
 *                        leave the queue.
 *   busy              -> drop our wake list: whatever it holds was pushed
 *                        before this run, which looked at K itself (a
 *                        hand-off whose short lease ran out while we were
 *                        stalled must not be read later as a grant).
 *                        wait > 0: join Q once (HSET D returns 1 only for
 *                        a new waiter) and refresh our deadline in D to
 *                        now + min(wait, alive); answer the holder's PTTL
 *                        and whether we are the live head.
 * release(K F Q D W M; token fair leave marker)
 *   leave             -> first take token out of Q/D and drop its wake list.
 *   K ~= token        -> 0, not owner.
 *   no live waiter    -> DEL K, 1.
 *   fair              -> hand-off: K = head's token PX min(head lease, cap),
 *                        next fence, push "f<fence>" to the head's wake list, 2.
 *   not fair          -> DEL K, push "w" to the head's wake list (once), 3.
 * renew(K F M [V]; token lease marker) -> -1, or PEXPIRE K (and V, an
 *                                   election term's value key) and the fence.
 * check(K F M; token marker)       -> {-1, 0}, or {fence, PTTL K}.
 * proclaim(K V M; token value marker), leader(K V F M; marker): leader
 *                                   election (redis_election.c).
 *
 * Cluster mode declares D, W and the head's wake list Wh as KEYS too; a
 * script that must hand the lock to (or wake) a head other than the one in
 * Wh answers {'H', head} before it changes K, and is run again naming it.
 *
 * The hand-off gives the new owner a short lease (cap), which its core
 * extends at once: a waiter that died just after its last re-check then
 * blocks the lock for `cap`, not for a whole lease. Q and D change only
 * together (a token is in Q iff it is in D) and get the same expiry, later
 * than any live deadline; wake lists expire by themselves.
 *
 * SHAs come from the server (SCRIPT LOAD at open), and a NOSCRIPT answer
 * (SCRIPT FLUSH, a restarted server) loads the script on that connection and
 * retries once: a NOSCRIPT request never ran, so the retry is safe.
 */
#include "internal_posix.h"

#include "redis_scripts.h"
#include "redis_closure.h"
#include "redis_cluster.h"
#include "redis_replies.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"

/* ---- the scripts ---- */

#define STR_(x) #x
#define STR(x) STR_(x)

/* Helpers of the queue paths. They come after the uncontended path in each
 * script, so that path does not pay for creating their closures. A fence is
 * the counter + 1, or the server's time in ticks of 100 us when that is
 * larger, so the counter never lags the clock; a missing counter (restart
 * without persistence, eviction, DEL, or its expiry REDIS_FENCE_TTL_MS
 * after the name's last grant) starts REDIS_FENCE_SEED ticks (1 s) ahead
 * of the clock. The next fence then ranks above every earlier one unless
 * the name was granted so often (more than 10 000 times a second, for long)
 * that the counter ran that far ahead of the clock, the last grant before
 * the loss fell in the same tick as the first after it, or the server's
 * clock stepped back. 48 bits of ticks last until the year 2861. */
#define LUA_HELPERS                                                              \
    "local F, Q = KEYS[2], KEYS[3]\n"                                           \
    "local QB = string.sub(Q, 1, #Q - 1)\n"                                     \
    "local D, W = KEYS[5] or QB .. 'd', KEYS[6] or QB .. 'w:' .. tok\n"         \
    "local CAP, WTTL = " STR(REDIS_HANDOFF_TTL_MS) ", " STR(REDIS_WAKE_TTL_MS) "\n" \
    "local function clock()\n"                                                   \
    "  local t = redis.call('TIME')\n"                                           \
    "  local s, us = tonumber(t[1]), tonumber(t[2])\n"                           \
    "  return s * 1000 + math.floor(us / 1000), s * 10000 + math.floor(us / 100)\n" \
    "end\n"                                                                      \
    "local function next_fence(tick)\n"                                          \
    "  local c = tonumber(redis.call('GET', F) or '')\n"                         \
    "  local f = c and math.max(c + 1, tick) or tick + " STR(REDIS_FENCE_SEED) "\n" \
    "  redis.call('SET', F, string.format('%d', f), 'PX', " STR(REDIS_FENCE_TTL_MS) ")\n" \
    "  return f\n"                                                               \
    "end\n"                                                                      \
    "local function live_head(now)\n"                                            \
    "  while true do\n"                                                          \
    "    local h = redis.call('LINDEX', Q, 0)\n"                                 \
    "    if not h then return nil end\n"                                         \
    "    local v = redis.call('HGET', D, h)\n"                                   \
    "    if v then\n"                                                            \
    "      local dl, ls = string.match(v, '^(%d+) (%d+)$')\n"                    \
    "      if dl and tonumber(dl) >= now then return h, tonumber(ls) end\n"      \
    "      redis.call('HDEL', D, h)\n"                                           \
    "    end\n"                                                                  \
    "    redis.call('LPOP', Q)\n"                                                \
    "  end\n"                                                                    \
    "end\n"                                                                      \
    "local function wake_key(h)\n"                                              \
    "  local w = QB .. 'w:' .. h\n"                                              \
    "  if not KEYS[5] or KEYS[7] == w then return w end\n"                       \
    "  return nil\n"                                                             \
    "end\n"                                                                      \
    "local function hand_to(h, hl, tick, w)\n"                                    \
    "  redis.call('LPOP', Q)\n"                                                  \
    "  redis.call('HDEL', D, h)\n"                                               \
    "  redis.call('SET', K, h, 'PX', math.min(hl, CAP))\n"                       \
    "  local fence = next_fence(tick)\n"                                         \
    "  local msg = string.format('f%d', fence)\n"                                 \
    "  local nx = KEYS[5] and redis.call('LINDEX', Q, 0)\n"                      \
    "  if nx then msg = msg .. ' ' .. nx end\n"                                   \
    "  redis.call('DEL', w)\n"                                                   \
    "  redis.call('RPUSH', w, msg)\n"                                            \
    "  redis.call('PEXPIRE', w, WTTL)\n"                                         \
    "end\n"                                                                      \
    "local function leave_queue()\n"                                             \
    "  if redis.call('HDEL', D, tok) == 1 then redis.call('LREM', Q, 1, tok) end\n" \
    "end\n"

/* KEYS K F Q M, ARGV token lease wait fair marker floor [epoch]. A grant
 * answers its fence (an integer); "busy" answers {0, PTTL, head, handed,
 * quarantine}; a marker other than ours answers "L" and changes nothing.
 * During the quarantine (server time before qend) nothing is granted and
 * the PTTL answered is at least the quarantine's rest. With an epoch (single
 * and Sentinel mode, where the closure record C is M .. "\x1fclosure", read
 * undeclared like D and W), a record that
 * closes this epoch (redis_closure.h) answers {'C', record} and takes our
 * token out of the queue (and the name, when a hand-off gave it to us);
 * a closed record also stops hand-offs to the queue's head. */
static const char lua_acquire[] =
    "local K, tok = KEYS[1], ARGV[1]\n"
    LUA_MARKER_CHECK(4, 5)
    "local CL = false\n"
    "if ARGV[7] then\n"
    "  local cv = redis.call('GET', KEYS[4] .. '\\31closure')\n"
    "  if cv then\n"
    "    local ce, cs = string.match(cv, '^(%d+) ([a-z]+)$')\n"
    "    ce = tonumber(ce)\n"
    "    local ep = tonumber(ARGV[7])\n"
    "    CL = cs == 'closed'\n"
    "    if not ce or (not CL and cs ~= 'open') or\n"
    "       (ep >= 0 and (ce > ep or (ce == ep and CL))) then\n"
    "      local QB = string.sub(KEYS[3], 1, #KEYS[3] - 1)\n"
    "      if redis.call('HDEL', QB .. 'd', tok) == 1 then redis.call('LREM', KEYS[3], 1, tok) end\n"
    "      redis.call('DEL', QB .. 'w:' .. tok)\n"
    "      if redis.call('GET', K) == tok then redis.call('DEL', K) end\n"
    "      return {'C', cv}\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local tick = tonumber(t[1]) * 10000 + math.floor(tonumber(t[2]) / 100)\n"
    "local q0 = #ARGV[5] + 2\n"
    "local qe = string.find(mk, ' ', q0, true)\n"
    "local QEND, FL = tonumber(string.sub(mk, q0, qe and qe - 1 or -1)) or 0, tonumber(ARGV[6]) or 0\n"
    "if now >= QEND and redis.call('EXISTS', KEYS[3]) == 0 and\n"
    "   redis.call('SET', K, tok, 'NX', 'PX', ARGV[2]) then\n"
    "  local c = tonumber(redis.call('GET', KEYS[2]) or '')\n"
    "  local f = c and math.max(c + 1, tick) or tick + " STR(REDIS_FENCE_SEED) "\n"
    "  if f <= FL then f = FL + 1 end\n"
    "  redis.call('SET', KEYS[2], string.format('%d', f), 'PX', " STR(REDIS_FENCE_TTL_MS) ")\n"
    "  return f\n"
    "end\n"
    "local cur = redis.call('GET', K)\n"
    LUA_HELPERS
    "if FL > 0 then\n"
    "  local c = tonumber(redis.call('GET', F) or '') or tick + " STR(REDIS_FENCE_SEED) " - 1\n"
    "  if c < FL then c = FL end\n"
    "  redis.call('SET', F, string.format('%d', c), 'PX', " STR(REDIS_FENCE_TTL_MS) ")\n"
    "end\n"
    "local lease, wait, fair = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1' and not CL\n"
    "local ALIVE = " STR(REDIS_ALIVE_MS) "\n"
    "if cur == tok then\n"
    "  redis.call('PEXPIRE', K, lease)\n"
    "  leave_queue()\n"
    "  redis.call('DEL', W)\n"
    "  return tonumber(redis.call('GET', F) or '') or next_fence(tick)\n"
    "end\n"
    "local handed = 0\n"
    "if not cur and now >= QEND then\n"
    "  local h, hl = live_head(now)\n"
    "  local hw = fair and h and h ~= tok and wake_key(h)\n"
    "  if fair and h and h ~= tok and not hw then return {'H', h} end\n"
    "  if hw then\n"
    "    hand_to(h, hl, tick, hw)\n"
    "    handed = 1\n"
    "  else\n"
    "    redis.call('SET', K, tok, 'PX', lease)\n"
    "    local fence = next_fence(tick)\n"
    "    leave_queue()\n"
    "    redis.call('DEL', W)\n"
    "    return fence\n"
    "  end\n"
    "end\n"
    "redis.call('DEL', W)\n"
    "local head = 0\n"
    "if wait > 0 then\n"
    "  local v = string.format('%d %d', now + math.min(wait, ALIVE), lease)\n"
    "  if redis.call('HSET', D, tok, v) == 1 then redis.call('RPUSH', Q, tok) end\n"
    "  redis.call('PEXPIRE', Q, ALIVE + WTTL)\n"
    "  redis.call('PEXPIRE', D, ALIVE + WTTL)\n"
    "  if live_head(now) == tok then head = 1 end\n"
    "end\n"
    "local p, quar = redis.call('PTTL', K), 0\n"
    "if now < QEND then\n"
    "  quar = 1\n"
    "  if p < QEND - now then p = QEND - now end\n"
    "end\n"
    "if KEYS[5] and wait > 0 then\n"
    "  local pos = redis.call('LPOS', Q, tok)\n"
    "  return {0, p, head, handed, quar, pos and redis.call('LINDEX', Q, pos + 1) or ''}\n"
    "end\n"
    "return {0, p, head, handed, quar}\n";

/* KEYS K F Q M, ARGV token fair leave marker [closure]. Answers a
 * REDIS_REL_* code, or "L" (another marker: nothing changed). With closure
 * "1" (single and Sentinel mode: C as in acquire), nothing is handed over while C says closed: the
 * head waiter is woken and its own acquire checks the record. */
static const char lua_release[] =
    "local K, tok = KEYS[1], ARGV[1]\n"
    LUA_MARKER_CHECK(4, 4)
    "if ARGV[3] ~= '1' then\n"
    "  if redis.call('GET', K) ~= tok then return 0 end\n"
    "  if redis.call('EXISTS', KEYS[3]) == 0 then\n"
    "    redis.call('DEL', K)\n"
    "    return 1\n"
    "  end\n"
    "end\n"
    LUA_HELPERS
    "if ARGV[3] == '1' then\n"
    "  leave_queue()\n"
    "  redis.call('DEL', W)\n"
    "  if redis.call('GET', K) ~= tok then return 0 end\n"
    "end\n"
    "local now, tick = clock()\n"
    "local h, hl = live_head(now)\n"
    "if not h then\n"
    "  redis.call('DEL', K)\n"
    "  return 1\n"
    "end\n"
    "local w = wake_key(h)\n"
    "if not w then return {'H', h} end\n"
    "if ARGV[2] == '1' and not (ARGV[5] == '1' and\n"
    "    string.find(redis.call('GET', KEYS[4] .. '\\31closure') or '', ' closed', 1, true)) then\n"
    "  hand_to(h, hl, tick, w)\n"
    "  return 2\n"
    "end\n"
    "redis.call('DEL', K)\n"
    "if redis.call('LLEN', w) == 0 then\n"
    "  redis.call('RPUSH', w, 'w')\n"
    "  redis.call('PEXPIRE', w, WTTL)\n"
    "end\n"
    "return 3\n";

/* KEYS K F M [V], ARGV token lease marker. V (an election term's value
 * key, declared by its renewals only) lives a day past the last renewal,
 * so a term longer than the day keeps its value. */
static const char lua_renew[] =
    LUA_MARKER_CHECK(3, 3)
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "if KEYS[4] then redis.call('PEXPIRE', KEYS[4], " STR(REDIS_FENCE_TTL_MS) ") end\n"
    "return tonumber(redis.call('GET', KEYS[2]) or '') or 0\n";

/* KEYS K F M, ARGV token marker. A counter gone while the hold stayed (DEL
 * of it alone) is made again from the server's time, above every fence
 * given before. */
static const char lua_check[] =
    LUA_MARKER_CHECK(3, 2)
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1, 0} end\n"
    "local f = tonumber(redis.call('GET', KEYS[2]) or '')\n"
    "if not f then\n"
    "  local t = redis.call('TIME')\n"
    "  f = tonumber(t[1]) * 10000 + math.floor(tonumber(t[2]) / 100) + " STR(REDIS_FENCE_SEED) "\n"
    "  redis.call('SET', KEYS[2], string.format('%d', f), 'PX', " STR(REDIS_FENCE_TTL_MS) ")\n"
    "end\n"
    "return {f, redis.call('PTTL', KEYS[1])}\n";

/* KEYS K M, ARGV marker. 1 when K exists, 0 when not; 2 during the
 * quarantine after a loss of data (a hold from before the loss may still
 * stand elsewhere in its holder's eyes: "free" would be a guess); "L" when
 * the marker is not the one sent (the data it spoke of is gone). */
static const char lua_held[] =
    LUA_MARKER_CHECK(2, 1)
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local q0 = #ARGV[1] + 2\n"
    "local qe = string.find(mk, ' ', q0, true)\n"
    "if now < (tonumber(string.sub(mk, q0, qe and qe - 1 or -1)) or 0) then return 2 end\n"
    "return redis.call('EXISTS', KEYS[1])\n";

/* Leader election (redis_election.c). V = {K}^_value holds "<token>
 * <value>" of the term that last proclaimed; it is trusted only when its
 * token is K's (a term handed over by a releaser's script, or a redis-py
 * holder, leaves another token there). */

/* KEYS K V M, ARGV token value marker. -1 when K is not token's (nothing
 * written), else 1 with V set to "<token> <value>" for a day (the fence
 * counter's life; the term's renewals push it on, see renew): bounded per
 * name, gone a day after the name's last term. */
static const char lua_proclaim[] =
    LUA_MARKER_CHECK(3, 3)
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"
    "redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2], 'PX', " STR(REDIS_FENCE_TTL_MS) ")\n"
    "return 1\n";

/* KEYS K V F M, ARGV marker. Read-only. {2} during the quarantine after a
 * loss of data (a term from before it may stand in its holder's eyes);
 * {0} when K is missing; else {1, K, PTTL K, F or '', known, value}, known
 * 1 and value the bytes after "<K's token> " when V starts so, else 0 and
 * ''. "L" when the marker is not the one sent. */
static const char lua_leader[] =
    LUA_MARKER_CHECK(4, 1)
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local q0 = #ARGV[1] + 2\n"
    "local qe = string.find(mk, ' ', q0, true)\n"
    "if now < (tonumber(string.sub(mk, q0, qe and qe - 1 or -1)) or 0) then return {2} end\n"
    "local k = redis.call('GET', KEYS[1])\n"
    "if not k then return {0} end\n"
    "local v = redis.call('GET', KEYS[2]) or ''\n"
    "local known, val = 0, ''\n"
    "if #v > #k and string.sub(v, 1, #k + 1) == k .. ' ' then\n"
    "  known, val = 1, string.sub(v, #k + 2)\n"
    "end\n"
    "return {1, k, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[3]) or '', known, val}\n";

static const struct {
    const char *name;
    const char *text;
    size_t len;
} scripts[REDIS_SCRIPT_COUNT] = {
    [REDIS_SCRIPT_ACQUIRE] = {"acquire", lua_acquire, sizeof lua_acquire - 1},
    [REDIS_SCRIPT_RELEASE] = {"release", lua_release, sizeof lua_release - 1},
    [REDIS_SCRIPT_RENEW] = {"renew", lua_renew, sizeof lua_renew - 1},
    [REDIS_SCRIPT_CHECK] = {"check", lua_check, sizeof lua_check - 1},
    [REDIS_SCRIPT_HELD] = {"held", lua_held, sizeof lua_held - 1},
    [REDIS_SCRIPT_PROCLAIM] = {"proclaim", lua_proclaim, sizeof lua_proclaim - 1},
    [REDIS_SCRIPT_LEADER] = {"leader", lua_leader, sizeof lua_leader - 1},
    /* redis_semaphore.c, redis_rwlock.c (len 0: strlen at load) */
    [REDIS_SCRIPT_SEM_ACQUIRE] = {"semaphore acquire", cerb__redis_lua_sem_acquire, 0},
    [REDIS_SCRIPT_SEM_RELEASE] = {"semaphore release", cerb__redis_lua_sem_release, 0},
    [REDIS_SCRIPT_SEM_RENEW] = {"semaphore renew", cerb__redis_lua_sem_renew, 0},
    [REDIS_SCRIPT_SEM_CHECK] = {"semaphore check", cerb__redis_lua_sem_check, 0},
    [REDIS_SCRIPT_SEM_HELD] = {"semaphore held", cerb__redis_lua_sem_held, 0},
    [REDIS_SCRIPT_SEM_INSPECT] = {"semaphore inspect", cerb__redis_lua_sem_inspect, 0},
    [REDIS_SCRIPT_SEM_FITS] = {"semaphore fits", cerb__redis_lua_sem_fits, 0},
    [REDIS_SCRIPT_RW_ACQUIRE] = {"rwlock acquire", cerb__redis_lua_rw_acquire, 0},
    [REDIS_SCRIPT_RW_RELEASE] = {"rwlock release", cerb__redis_lua_rw_release, 0},
    [REDIS_SCRIPT_RW_RENEW] = {"rwlock renew", cerb__redis_lua_rw_renew, 0},
    [REDIS_SCRIPT_RW_CHECK] = {"rwlock check", cerb__redis_lua_rw_check, 0},
    [REDIS_SCRIPT_RW_HELD] = {"rwlock held", cerb__redis_lua_rw_held, 0},
    [REDIS_SCRIPT_RW_INSPECT] = {"rwlock inspect", cerb__redis_lua_rw_inspect, 0},
    [REDIS_SCRIPT_RW_FITS] = {"rwlock fits", cerb__redis_lua_rw_fits, 0},
};

/* ---- key names ---- */

/* Appends for building key names into a buffer sized beforehand. */
static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

cerb_status cerb__redis_keys_init(struct redis_keys *ks, cerb_engine *e, const char *name,
                                  const char *token)
{
    return cerb__redis_keys_build(ks, e->rc->prefix, name, token, e->cl);
}

cerb_status cerb__redis_keys_build(struct redis_keys *ks, const char *prefix_or_null,
                                   const char *name, const char *token,
                                   const struct redis_cluster *cl)
{
    /* "\x1f" is split from the letters that follow, or C reads one hex
     * escape: see REDIS_SEP in redis_scripts.h. */
    static const char *const suffix[REDIS_NKEYS] = {"", "}" REDIS_SEP "fence", "}" REDIS_SEP "q",
                                                    "}" REDIS_SEP "d", "}" REDIS_SEP "w:",
                                                    "}" REDIS_SEP "value"};
    static const char mk_tail[] = REDIS_SEP "cerberus";
    const char *prefix = prefix_or_null ? prefix_or_null : "";
    size_t pl = strlen(prefix), nl = strlen(name);
    size_t kl = pl + nl;
    size_t tl = strlen(token);
    size_t need = 0;
    bool cluster = cl != NULL, alt = false;
    char tagbuf[16] = "";
    char *p;

    ks->slot = -1;
    ks->mk = NULL;
    ks->mk_len = 0;
    ks->wh = NULL;
    ks->wh_len = 0;
    ks->renew_v = false;
    ks->heap = NULL;
    for (int i = 0; i < REDIS_NKEYS; i++)
        need += kl + (i ? 1 + strlen(suffix[i]) : 0) + 1;
    need += tl;
    if (cluster) {
        /* K's slot is hashed from its own text before any name is built:
         * K is prefix + name, so hash a copy in the buffer once it is there. */
        alt = memchr(prefix, '}', pl) != NULL || memchr(name, '}', nl) != NULL;
        need += REDIS_NKEYS * (kl + 2) + sizeof tagbuf + pl + sizeof mk_tail + 2;
    }
    p = ks->buf;
    if (need > sizeof ks->buf) {
        p = ks->heap = cerb__malloc(need);
        if (!p)
            return cerb__error_set(CERB_ENOMEM, "redis: out of memory for key names");
    }
    /* K first: the redis-py key. */
    ks->k[REDIS_K] = p;
    p = put(p, prefix, pl);
    p = put(p, name, nl);
    ks->len[REDIS_K] = kl;
    *p++ = '\0';
    if (cluster) {
        ks->slot = (int)cerb__redis_key_slot(ks->k[REDIS_K], kl);
        snprintf(tagbuf, sizeof tagbuf, "%u", (unsigned)cl->tag[ks->slot]);
    }
    for (int i = 1; i < REDIS_NKEYS; i++) {
        char *start = p;
        *p++ = '{';
        if (alt) {
            /* "{n}K\x1f…": n, the slot's marker tag, hashes to K's slot. */
            p = put(p, tagbuf, strlen(tagbuf));
            *p++ = '}';
            p = put(p, ks->k[REDIS_K], kl);
            p = put(p, suffix[i] + 1, strlen(suffix[i]) - 1);
        } else {
            p = put(p, ks->k[REDIS_K], kl);
            p = put(p, suffix[i], strlen(suffix[i]));
        }
        if (i == REDIS_W)
            p = put(p, token, tl);
        ks->len[i] = (size_t)(p - start);
        *p++ = '\0';
        ks->k[i] = start;
    }
    if (cluster) {
        char *start = p;
        *p++ = '{';
        p = put(p, tagbuf, strlen(tagbuf));
        *p++ = '}';
        p = put(p, prefix, pl);
        p = put(p, mk_tail, sizeof mk_tail - 1);
        ks->mk = start;
        ks->mk_len = (size_t)(p - start);
        *p++ = '\0';
    }
    return CERB_OK;
}

/* The wake list of waiter `head` of ks's queue: Q's name up to its last
 * byte, then "w:" head (the scripts build it so: QB .. 'w:' .. h). */
static cerb_status keys_set_head(struct redis_keys *ks, const char *head, size_t hl)
{
    size_t qb = ks->len[REDIS_Q] - 1;
    char *w = cerb__malloc(qb + 2 + hl + 1);
    if (!w)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for key names");
    memcpy(w, ks->k[REDIS_Q], qb);
    memcpy(w + qb, "w:", 2);
    memcpy(w + qb + 2, head, hl);
    w[qb + 2 + hl] = '\0';
    cerb__free(ks->wh);
    ks->wh = w;
    ks->wh_len = qb + 2 + hl;
    return CERB_OK;
}

void cerb__redis_keys_free(struct redis_keys *ks)
{
    cerb__free(ks->heap);
    ks->heap = NULL;
    cerb__free(ks->wh);
    ks->wh = NULL;
}

/* ---- running scripts ---- */

/*
 * Acquire and release declare K, F and Q only: the data hash and the wake
 * lists are named from Q inside the script, in the same hash slot
 * ({K}\x1fd, {K}\x1fw:<token>). Every declared key is a string the server
 * parses and hands to Lua on each call, and on the uncontended path only
 * these three are touched; trimming the request cut the server's cost per
 * cycle. Every script also gets the marker key M last (redis_marker.h).
 */
#define REDIS_SCRIPT_KEYS 3

static cerb_status append_eval(cerb_engine *e, struct redis_conn *c, const char *sha, int nkeys,
                               const struct redis_keys *ks, int nargs, const char *const *args)
{
    const char *argv[4 + REDIS_NKEYS + 3 + 8];
    size_t argl[4 + REDIS_NKEYS + 3 + 8];
    char nk[2];
    int n = 0, declared = nkeys + 1;

    /* Cluster: the queue scripts also name D, W and the head's wake list. */
    bool more = ks->mk && nkeys == REDIS_SCRIPT_KEYS;
    if (more)
        declared += 2 + (ks->wh ? 1 : 0);
    if (ks->renew_v)
        declared++;

    _Static_assert(REDIS_SCRIPT_KEYS + 4 < 10, "numkeys is one digit");
    nk[0] = (char)('0' + declared);
    nk[1] = '\0';
    argv[n] = "EVALSHA", argl[n++] = 7;
    argv[n] = sha, argl[n++] = 40;
    argv[n] = nk, argl[n++] = 1;
    for (int i = 0; i < nkeys; i++)
        argv[n] = ks->k[i], argl[n++] = ks->len[i];
    if (ks->mk)
        argv[n] = ks->mk, argl[n++] = ks->mk_len;
    else
        argv[n] = e->marker_key, argl[n++] = e->marker_key_len;
    if (ks->renew_v)
        argv[n] = ks->k[REDIS_V], argl[n++] = ks->len[REDIS_V];
    if (more) {
        argv[n] = ks->k[REDIS_D], argl[n++] = ks->len[REDIS_D];
        argv[n] = ks->k[REDIS_W], argl[n++] = ks->len[REDIS_W];
        if (ks->wh)
            argv[n] = ks->wh, argl[n++] = ks->wh_len;
    }
    for (int i = 0; i < nargs && i < 8; i++)
        argv[n] = args[i], argl[n++] = strlen(args[i]);
    return cerb__redis_append(c, n, argv, argl);
}

static cerb_status append_load(struct redis_conn *c, enum redis_script id)
{
    const char *argv[3] = {"SCRIPT", "LOAD", scripts[id].text};
    size_t argl[3] = {6, 4, scripts[id].len ? scripts[id].len : strlen(scripts[id].text)};
    return cerb__redis_append(c, 3, argv, argl);
}

/* Check a SCRIPT LOAD reply; at open (`store`) remember the SHA. */
static cerb_status take_sha(cerb_engine *e, enum redis_script id, const redisReply *r,
                            bool store)
{
    if (r->type != REDIS_REPLY_STRING || r->len != 40) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        cerb_status st = cerb__redis_fail(e->where, "SCRIPT LOAD", &f, NULL);
        cerb__error_prefix("%s script", scripts[id].name);
        return st;
    }
    if (store) {
        memcpy(e->sha[id], r->str, 40);
        e->sha[id][40] = '\0';
    } else if (memcmp(e->sha[id], r->str, 40) != 0) {
        return cerb__error_set(CERB_EPROTO, "redis %s: %s script reloaded under another SHA",
                               e->where, scripts[id].name);
    }
    return CERB_OK;
}

cerb_status cerb__redis_scripts_load(cerb_engine *e, struct redis_conn *c)
{
    redisReply *r[REDIS_SCRIPT_COUNT];
    size_t got = 0;
    cerb_status st = CERB_OK;

    for (int i = 0; i < REDIS_SCRIPT_COUNT && st == CERB_OK; i++)
        st = append_load(c, (enum redis_script)i);
    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, "SCRIPT LOAD", r, &got, NULL);
    for (size_t i = 0; st == CERB_OK && i < got; i++)
        st = take_sha(e, (enum redis_script)i, r[i], true);
    for (size_t i = 0; i < got; i++)
        freeReplyObject(r[i]);
    return st;
}

/* Load one script again after NOSCRIPT. */
static cerb_status reload(cerb_engine *e, struct redis_conn *c, enum redis_script id)
{
    redisReply *r;
    size_t got;
    cerb_status st = append_load(c, id);

    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, "SCRIPT LOAD", &r, &got, NULL);
    if (st == CERB_OK) {
        st = take_sha(e, id, r, false);
        freeReplyObject(r);
    }
    if (st == CERB_OK) {
        REDIS_COUNT(e, noscript_reloads);
        CERB_LOG_I("redis %s: %s script reloaded (NOSCRIPT)", e->where, scripts[id].name);
    }
    return st;
}

/*
 * Run script `id` once on c, reloading it after NOSCRIPT. On success *out is
 * a reply that is not an error (the caller frees it). *sent_ns: before the
 * first send (the earliest moment the script can have run).
 */
static cerb_status eval(cerb_engine *e, struct redis_conn *c, enum redis_script id, int nkeys,
                        const struct redis_keys *ks, int nargs, const char *const *args,
                        int64_t *sent_ns, redisReply **out, cerb_outcome *oc)
{
    *out = NULL;
    *oc = CERB_OUTCOME_NO;
    for (int attempt = 0;; attempt++) {
        redisReply *r;
        size_t got;
        cerb_status st = append_eval(e, c, e->sha[id], nkeys, ks, nargs, args);
        if (st != CERB_OK)
            return st;
        if (attempt == 0 && sent_ns)
            *sent_ns = cerb_monotime();
        st = cerb__redis_exchange(e, c, scripts[id].name, &r, &got, oc);
        if (st != CERB_OK)
            return st;
        if (attempt == 0 && cerb__redis_is_noscript(r)) {
            freeReplyObject(r);
            st = reload(e, c, id);
            *oc = CERB_OUTCOME_NO;
            if (st != CERB_OK)
                return st;
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
            st = cerb__redis_fail(e->where, scripts[id].name, &f, oc);
            /* Redis keeps what a failing script wrote before the error. */
            if (cerb__redis_script_may_have_run(r))
                *oc = CERB_OUTCOME_UNKNOWN;
            freeReplyObject(r);
            return st;
        }
        *out = r;
        return CERB_OK;
    }
}

cerb_status cerb__redis_eval_argv(cerb_engine *e, struct redis_conn *c, enum redis_script id,
                                  int nkeys, const char *const *keys, const size_t *klen,
                                  int nargs, const char *const *args, const size_t *alen,
                                  redisReply **out, cerb_outcome *oc)
{
    const char *argv[3 + 16];
    size_t argl[3 + 16];
    char nk[2] = {(char)('0' + nkeys), '\0'};
    int n = 0;

    *out = NULL;
    *oc = CERB_OUTCOME_NO;
    if (nkeys < 1 || nkeys > 9 || nargs < 0 || nkeys + nargs > 16)
        return cerb__error_set(CERB_EINVAL, "redis: %s: %d keys and %d arguments",
                               scripts[id].name, nkeys, nargs);
    argv[n] = "EVALSHA", argl[n++] = 7;
    argv[n] = NULL, argl[n++] = 40; /* the SHA, set below (a reload may change it) */
    argv[n] = nk, argl[n++] = 1;
    for (int i = 0; i < nkeys; i++)
        argv[n] = keys[i], argl[n++] = klen[i];
    for (int i = 0; i < nargs; i++)
        argv[n] = args[i], argl[n++] = alen[i];
    for (int attempt = 0;; attempt++) {
        redisReply *r;
        size_t got;
        argv[1] = e->sha[id];
        cerb_status st = cerb__redis_append(c, n, argv, argl);
        if (st == CERB_OK)
            st = cerb__redis_exchange(e, c, scripts[id].name, &r, &got, oc);
        if (st != CERB_OK)
            return st;
        if (attempt == 0 && cerb__redis_is_noscript(r)) {
            freeReplyObject(r);
            st = reload(e, c, id);
            *oc = CERB_OUTCOME_NO;
            if (st != CERB_OK)
                return st;
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
            st = cerb__redis_fail(e->where, scripts[id].name, &f, oc);
            if (cerb__redis_script_may_have_run(r))
                *oc = CERB_OUTCOME_UNKNOWN;
            freeReplyObject(r);
            return st;
        }
        *out = r;
        return CERB_OK;
    }
}

static cerb_status bad_reply(cerb_engine *e, enum redis_script id, const redisReply *r,
                             cerb_outcome *oc)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(e->where, scripts[id].name, &f, oc);
}

#define NUM_BUF 24

/* Decimal text of v (hot path: no printf machinery). */
static void fmt_i64(char *buf, int64_t v)
{
    char tmp[NUM_BUF];
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int n = 0;

    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *buf++ = '-';
    while (n)
        *buf++ = tmp[--n];
    *buf = '\0';
}

/*
 * A script found another marker (it changed nothing): learn the new one,
 * which reports every hold LOST, so the caller can act under it. The
 * outcome is NO whatever happens here.
 */
static cerb_status marker_moved(cerb_engine *e, struct redis_conn *c,
                                const struct redis_keys *ks,
                                const struct redis_marker_view *mv, cerb_outcome *oc)
{
    cerb_status st = cerb__redis_marker_lost(e, c, ks, mv);
    if (oc)
        *oc = CERB_OUTCOME_NO;
    return st;
}

/*
 * Cluster: a script that must wake or hand the lock to the queue's head
 * answers {'H', head} when the caller did not declare that waiter's wake
 * list (it changed nothing that a second run would not redo). Name it in ks
 * for the next run; false when r is not such an answer.
 */
static bool head_wanted(struct redis_keys *ks, const redisReply *r, cerb_status *st)
{
    if (!ks->mk || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len != 1 ||
        r->element[0]->str[0] != 'H' || r->element[1]->type != REDIS_REPLY_STRING)
        return false;
    *st = keys_set_head(ks, r->element[1]->str, r->element[1]->len);
    return true;
}

/*
 * The acquire script's {'C', record}: the closure record refuses this
 * client's epoch (or is damaged). Nothing was granted or left queued.
 */
static bool closure_refused(cerb_engine *e, const struct redis_keys *ks,
                            const cerb_engine_lock *lk, const redisReply *r,
                            struct redis_acquire_result *res, cerb_outcome *oc, cerb_status *st)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len != 1 ||
        r->element[0]->str[0] != 'C' || r->element[1]->type != REDIS_REPLY_STRING)
        return false;
    cerb_closure cl = {0, 0};
    if (oc)
        *oc = CERB_OUTCOME_NO;
    if (!cerb__redis_closure_parse(r->element[1]->str, r->element[1]->len, &cl)) {
        *st = cerb__error_set(CERB_EPROTO, "redis %s: the closure record \"%.*s\" is not "
                              "\"<epoch> closed|open\": nothing is granted until a switch "
                              "writes it again",
                              e->where, (int)(r->element[1]->len > 40 ? 40 : r->element[1]->len),
                              r->element[1]->str);
        return true;
    }
    res->closed_epoch = cl.epoch;
    *st = cerb__error_set(CERB_UNAVAILABLE, "redis %s: \"%s\": %s by a switch at epoch %lld; "
                          "this client is at epoch %lld: reload the configuration",
                          e->where, ks->k[REDIS_K], cl.closed ? "closed" : "opened",
                          (long long)cl.epoch, (long long)lk->epoch);
    return true;
}

/* Runs of a queue script per operation: the head may change between them. */
#define REDIS_HEAD_TRIES 4

cerb_status cerb__redis_run_acquire(cerb_engine *e, struct redis_conn *c,
                                    struct redis_keys *ks, const cerb_engine_lock *lk,
                                    int64_t wait_ms, struct redis_acquire_result *res,
                                    int64_t *sent_ns, cerb_outcome *outcome)
{
    char lease[NUM_BUF], wait[NUM_BUF], floor[NUM_BUF], epoch[NUM_BUF];
    struct redis_marker_view mv;
    const char *args[7] = {lk->token, lease, wait, lk->fair ? "1" : "0", mv.value, floor, epoch};
    /* The closure record is read where there is one (single, Sentinel). */
    int nargs = ks->mk || !e->closure_key ? 6 : 7;
    redisReply *r;
    cerb_status st;
    enum redis_read v = REDIS_READ_BAD;

    /* A wait longer than a few years is "forever" and keeps the text short. */
    if (wait_ms > INT64_C(100000000000))
        wait_ms = INT64_C(100000000000);
    fmt_i64(lease, lk->lease_ms);
    fmt_i64(wait, wait_ms);
    fmt_i64(floor, (int64_t)(lk->fence_floor & ((UINT64_C(1) << 48) - 1)));
    fmt_i64(epoch, lk->epoch >= 0 ? lk->epoch : -1);
    memset(res, 0, sizeof *res);
    for (int round = 0, heads = 0;; round++) {
        st = cerb__redis_marker_for(e, c, ks, &mv);
        if (st != CERB_OK)
            return st;
        REDIS_COUNT(e, acquire_calls);
        st = eval(e, c, REDIS_SCRIPT_ACQUIRE, REDIS_SCRIPT_KEYS, ks, nargs, args, sent_ns, &r,
                  outcome);
        if (st != CERB_OK)
            return st;
        if (closure_refused(e, ks, lk, r, res, outcome, &st)) {
            freeReplyObject(r);
            return st;
        }
        if (head_wanted(ks, r, &st)) {
            freeReplyObject(r);
            if (st != CERB_OK || ++heads >= REDIS_HEAD_TRIES)
                return st != CERB_OK ? st
                                     : cerb__error_set(CERB_EIO, "redis %s: acquire: the queue's "
                                                       "head keeps changing", e->where);
            round--;
            continue;
        }
        if ((v = cerb__redis_read_acquire(r, res)) != REDIS_READ_LOST)
            break;
        freeReplyObject(r);
        /* Once under the new marker; a second "L" means it is changing
         * under us (flushed again): a failure, nothing was written. */
        if (round > 0)
            return cerb__error_set(CERB_EIO, "redis %s: acquire: the server keeps losing its "
                                   "data (marker changed twice)", e->where);
        st = marker_moved(e, c, ks, &mv, outcome);
        if (st != CERB_OK)
            return st;
    }
    if (v == REDIS_READ_BAD) {
        memset(res, 0, sizeof *res);
        st = bad_reply(e, REDIS_SCRIPT_ACQUIRE, r, outcome);
    } else if (res->handed) {
        REDIS_COUNT(e, handoffs_sent);
    }
    freeReplyObject(r);
    return st;
}

cerb_status cerb__redis_run_release(cerb_engine *e, struct redis_conn *c,
                                    struct redis_keys *ks, const cerb_engine_lock *lk,
                                    int leave, int *code, cerb_outcome *outcome)
{
    struct redis_marker_view mv;
    const char *args[5] = {lk->token, lk->fair ? "1" : "0", leave ? "1" : "0", mv.value, "1"};
    int nargs = ks->mk || !e->closure_key ? 4 : 5;
    redisReply *r;
    cerb_status st;

    /* Cluster: the waiter that was behind us when we were the head is
     * likely the head now; name its wake list (the script checks). */
    struct redis_lock_priv *lp = lk->priv;
    if (ks->mk && !ks->wh && lp) {
        char next[sizeof lp->next];
        cerb__mutex_lock(e->wmu);
        memcpy(next, lp->next, sizeof next);
        cerb__mutex_unlock(e->wmu);
        if (next[0] && (st = keys_set_head(ks, next, strlen(next))) != CERB_OK)
            return st;
    }
    for (int heads = 0;; heads++) {
        st = cerb__redis_marker_for(e, c, ks, &mv);
        if (st != CERB_OK)
            return st;
        st = eval(e, c, REDIS_SCRIPT_RELEASE, REDIS_SCRIPT_KEYS, ks, nargs, args, NULL, &r,
                  outcome);
        if (st != CERB_OK)
            return st;
        if (!head_wanted(ks, r, &st))
            break;
        freeReplyObject(r);
        if (st != CERB_OK)
            return st;
        if (heads + 1 >= REDIS_HEAD_TRIES)
            return cerb__error_set(CERB_EIO, "redis %s: release: the queue's head keeps "
                                   "changing", e->where);
    }
    enum redis_read v = cerb__redis_read_release(r, code);
    if (v == REDIS_READ_LOST) {
        /* The data this hold (or queue entry) lived in is gone: nothing
         * to release or leave. */
        freeReplyObject(r);
        marker_moved(e, c, ks, &mv, outcome);
        return CERB_OK;
    }
    if (v == REDIS_READ_BAD) {
        st = bad_reply(e, REDIS_SCRIPT_RELEASE, r, outcome);
        freeReplyObject(r);
        return st;
    }
    freeReplyObject(r);
    if (*code == REDIS_REL_HANDED)
        REDIS_COUNT(e, handoffs_sent);
    else if (*code == REDIS_REL_WOKE)
        REDIS_COUNT(e, wakes_sent);
    return CERB_OK;
}

cerb_status cerb__redis_leave(cerb_engine *e, struct redis_keys *ks,
                              const cerb_engine_lock *lk)
{
    struct redis_conn *c;
    cerb_outcome oc;
    int code;
    cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);

    if (st != CERB_OK)
        return st;
    REDIS_COUNT(e, leaves);
    st = cerb__redis_run_release(e, c, ks, lk, 1, &code, &oc);
    cerb__redis_put(e, c);
    return st;
}

/* ---- engine operations ---- */

static cerb_status keys_for(cerb_engine *e, const cerb_engine_lock *lk, struct redis_keys *ks)
{
    return cerb__redis_keys_init(ks, e, lk->name, lk->token);
}

cerb_status cerb__redis_op_release(cerb_engine *e, cerb_engine_lock *lk)
{
    struct redis_keys ks;
    struct redis_conn *c;
    cerb_outcome oc;
    int code = 0;
    cerb_status st = keys_for(e, lk, &ks);

    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_run_release(e, c, &ks, lk, 0, &code, &oc);
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK && code == REDIS_REL_NOT_OWNER)
        st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\" is not held by this owner",
                             e->where, ks.k[REDIS_K]);
    cerb__redis_keys_free(&ks);
    return st;
}

cerb_status cerb__redis_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct redis_keys ks;
    struct redis_conn *c;
    redisReply *r = NULL;
    char lease[NUM_BUF];
    struct redis_marker_view mv;
    const char *args[3] = {lk->token, lease, mv.value};
    cerb_status st = keys_for(e, lk, &ks);

    if (st != CERB_OK)
        return st;
    ks.renew_v = lk->prim == CERB_PRIM_ELECTION;
    fmt_i64(lease, lk->lease_ms);
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_marker_for(e, c, &ks, &mv);
        if (st == CERB_OK)
            st = eval(e, c, REDIS_SCRIPT_RENEW, 2, &ks, 3, args, &grant->sent_ns, &r,
                      &grant->outcome);
        if (st == CERB_OK && cerb__redis_is_lost(r))
            marker_moved(e, c, &ks, &mv, &grant->outcome);
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK) {
        uint64_t fence;
        switch (cerb__redis_read_renew(r, &fence)) {
        case REDIS_READ_LOST:
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\": the server lost its data",
                                 e->where, ks.k[REDIS_K]);
            break;
        case REDIS_READ_BAD:
            st = bad_reply(e, REDIS_SCRIPT_RENEW, r, &grant->outcome);
            break;
        case REDIS_READ_NO:
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\" is no longer held by this owner",
                                 e->where, ks.k[REDIS_K]);
            break;
        case REDIS_READ_YES:
            grant->fence = fence;
            grant->ttl_ms = lk->lease_ms;
            break;
        }
        freeReplyObject(r);
    }
    cerb__redis_keys_free(&ks);
    return st;
}

cerb_status cerb__redis_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct redis_keys ks;
    struct redis_conn *c;
    redisReply *r = NULL;
    struct redis_marker_view mv;
    const char *args[2] = {lk->token, mv.value};
    cerb_status st = keys_for(e, lk, &ks);

    if (st != CERB_OK)
        return st;
    /* The pool never hands out a connection whose last request failed. */
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_marker_for(e, c, &ks, &mv);
        if (st == CERB_OK)
            st = eval(e, c, REDIS_SCRIPT_CHECK, 2, &ks, 2, args, &grant->sent_ns, &r,
                      &grant->outcome);
        if (st == CERB_OK && cerb__redis_is_lost(r))
            marker_moved(e, c, &ks, &mv, &grant->outcome);
        cerb__redis_put(e, c);
    }
    if (st == CERB_OK) {
        uint64_t fence;
        int64_t ttl;
        switch (cerb__redis_read_check(r, &fence, &ttl)) {
        case REDIS_READ_LOST:
            /* A grant is made only under the marker it was sent with: one
             * that landed before the loss went with the data. */
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\": the server lost its data",
                                 e->where, ks.k[REDIS_K]);
            break;
        case REDIS_READ_BAD:
            st = bad_reply(e, REDIS_SCRIPT_CHECK, r, &grant->outcome);
            break;
        case REDIS_READ_NO:
            st = cerb__error_set(CERB_NOT_OWNER, "redis %s: \"%s\" is not held by this owner",
                                 e->where, ks.k[REDIS_K]);
            break;
        case REDIS_READ_YES:
            /* What the server promises, not the lease asked for (a
             * hand-off key has PX 2000 until its owner extends it); the
             * core counts it from sent_ns, taken before the request left.
             * A key without expiry is held until deleted (ttl 0). */
            grant->fence = fence;
            grant->ttl_ms = ttl;
            /* Settling a grant whose answer was lost: with replica
             * acknowledgement it counts only once confirmed, as a grant
             * answered in time does (else released, an error). */
            if (e->rc->min_replicas_ack > 0) {
                freeReplyObject(r);
                r = NULL;
                st = cerb__redis_confirm_replicas(e, &ks, lk, grant, 0);
                if (st == CERB_OK)
                    grant->fence = fence;
            }
            break;
        }
        if (r)
            freeReplyObject(r);
    }
    cerb__redis_keys_free(&ks);
    return st;
}

/*
 * Is the lock key there at all (held by anyone, redis-py included)? Asked
 * by the safe switch before a grant elsewhere, which then trusts a "free":
 * so the answer goes through the marker like every script (a server that
 * lost its data answers for data it no longer has) and is BUSY during the
 * quarantine after a loss, when a holder from before it may still think it
 * holds the name.
 */
cerb_status cerb__redis_op_held(cerb_engine *e, const char *name)
{
    static const char no_token[] = "00000000000000000000000000000000";
    struct redis_keys ks;
    struct redis_conn *c = NULL;
    struct redis_marker_view mv;
    const char *args[1] = {mv.value};
    redisReply *r = NULL;
    cerb_outcome oc;
    cerb_status st = cerb__redis_keys_init(&ks, e, name, no_token);
    if (st != CERB_OK)
        return st;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    for (int round = 0; st == CERB_OK; round++) {
        st = cerb__redis_marker_for(e, c, &ks, &mv);
        if (st == CERB_OK)
            st = eval(e, c, REDIS_SCRIPT_HELD, 1, &ks, 1, args, NULL, &r, &oc);
        if (st != CERB_OK || !cerb__redis_is_lost(r))
            break;
        freeReplyObject(r);
        r = NULL;
        /* Learn the new marker (every hold here is told LOST), then ask
         * again under it: the quarantine it carries answers. */
        st = round == 0 ? marker_moved(e, c, &ks, &mv, NULL)
                        : cerb__error_set(CERB_EIO, "redis %s: held: the server keeps losing its "
                                          "data (marker changed twice)", e->where);
    }
    if (c)
        cerb__redis_put(e, c);
    if (st == CERB_OK) {
        if (r->type == REDIS_REPLY_INTEGER && r->integer >= 0 && r->integer <= 2) {
            st = r->integer == 0 ? CERB_OK
                 : r->integer == 1
                     ? cerb__error_set(CERB_BUSY, "redis %s: \"%s\" is held", e->where,
                                       ks.k[REDIS_K])
                     : cerb__error_set(CERB_BUSY, "redis %s: no answer for \"%s\" before the "
                                       "quarantine after a loss of data ends",
                                       e->where, ks.k[REDIS_K]);
        } else {
            struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
            st = cerb__redis_fail(e->where, "held", &f, NULL);
        }
    }
    if (r)
        freeReplyObject(r);
    cerb__redis_keys_free(&ks);
    return st;
}

/* Renewals per pipeline: bounds the request buffer. As many as the
 * watchdog hands over at once (core/watchdog.c, CERB_RENEW_CHUNK), so a
 * batch is one pipeline: one request timeout on a frozen server, which a
 * release waiting for the renewal on the wire relies on. */
#define RENEW_CHUNK 1024

static void renew_item_fail(cerb_renew_item *it, cerb_status st, cerb_outcome oc)
{
    it->st = st;
    it->grant.outcome = oc;
}

/* One pipeline over items[0..n): append, exchange, read per item. ns[i]
 * says whether item i found no script (NOSCRIPT: it did not run). */
static void renew_pipeline(cerb_engine *e, struct redis_conn *c, cerb_renew_item *items,
                           size_t n, redisReply **r, bool *ns)
{
    char lease[NUM_BUF];
    struct redis_marker_view one, *mvs = NULL;
    cerb_status st = CERB_OK;
    cerb_outcome oc = CERB_OUTCOME_NO;
    size_t got = 0;
    int64_t sent;

    for (size_t i = 0; i < n; i++)
        ns[i] = false;
    /* Every marker first (in cluster mode one per slot, which may take a
     * round trip on c the first time): nothing may be appended meanwhile. */
    if (e->cl) {
        mvs = cerb__malloc(n * sizeof *mvs);
        if (!mvs)
            st = cerb__error_set(CERB_ENOMEM, "redis: out of memory for a renewal batch");
        for (size_t i = 0; i < n && st == CERB_OK; i++) {
            struct redis_keys ks;
            st = keys_for(e, items[i].lk, &ks);
            if (st == CERB_OK) {
                st = cerb__redis_marker_for(e, c, &ks, &mvs[i]);
                cerb__redis_keys_free(&ks);
            }
        }
    } else {
        st = cerb__redis_marker_for(e, c, NULL, &one);
    }
    for (size_t i = 0; i < n && st == CERB_OK; i++) {
        struct redis_keys ks;
        cerb_engine_lock *lk = items[i].lk;
        const char *args[3] = {lk->token, lease, mvs ? mvs[i].value : one.value};
        fmt_i64(lease, lk->lease_ms);
        st = keys_for(e, lk, &ks);
        if (st == CERB_OK) {
            ks.renew_v = lk->prim == CERB_PRIM_ELECTION;
            st = append_eval(e, c, e->sha[REDIS_SCRIPT_RENEW], 2, &ks, 3, args);
            cerb__redis_keys_free(&ks);
        }
    }
    if (st != CERB_OK) {
        c->out_len = 0;
        c->pending = 0;
        for (size_t i = 0; i < n; i++)
            renew_item_fail(&items[i], st, CERB_OUTCOME_NO);
        cerb__free(mvs);
        return;
    }
    sent = cerb_monotime();
    st = cerb__redis_exchange(e, c, "renew", r, &got, &oc);
    bool lost_one = false;
    size_t lost_at = 0;
    for (size_t i = 0; i < n; i++) {
        cerb_renew_item *it = &items[i];
        it->grant.sent_ns = sent;
        if (i >= got) {
            renew_item_fail(it, st, oc);
            continue;
        }
        if (cerb__redis_is_noscript(r[i])) {
            ns[i] = true;
            renew_item_fail(it, CERB_EPROTO, CERB_OUTCOME_NO);
        } else {
            uint64_t fence;
            cerb_outcome o;
            switch (cerb__redis_read_renew(r[i], &fence)) {
            case REDIS_READ_LOST:
                if (!lost_one)
                    lost_at = i;
                lost_one = true;
                renew_item_fail(it, CERB_NOT_OWNER, CERB_OUTCOME_NO);
                break;
            case REDIS_READ_BAD:
                it->st = bad_reply(e, REDIS_SCRIPT_RENEW, r[i], &o);
                it->grant.outcome = o;
                break;
            case REDIS_READ_NO:
                it->st = CERB_NOT_OWNER;
                break;
            case REDIS_READ_YES:
                it->st = CERB_OK;
                it->grant.fence = fence;
                it->grant.ttl_ms = it->lk->lease_ms;
                break;
            }
        }
        freeReplyObject(r[i]);
        r[i] = NULL;
    }
    if (lost_one) {
        /* Learn the new marker (every hold of the instance is told LOST:
         * once is enough). */
        struct redis_keys ks;
        if (keys_for(e, items[lost_at].lk, &ks) == CERB_OK) {
            marker_moved(e, c, &ks, mvs ? &mvs[lost_at] : &one, NULL);
            cerb__redis_keys_free(&ks);
        }
    }
    cerb__free(mvs);
}

void cerb__redis_op_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n)
{
    redisReply *r[RENEW_CHUNK];
    bool ns[RENEW_CHUNK], ns2[RENEW_CHUNK];

    for (size_t base = 0; base < n; base += RENEW_CHUNK) {
        size_t m = n - base < RENEW_CHUNK ? n - base : RENEW_CHUNK;
        cerb_renew_item *chunk = items + base;
        struct redis_conn *c;

        for (size_t i = 0; i < m; i++) {
            memset(&chunk[i].grant, 0, sizeof chunk[i].grant);
            chunk[i].grant.outcome = CERB_OUTCOME_NO;
        }
        cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
        if (st != CERB_OK) {
            for (size_t i = 0; i < m; i++)
                renew_item_fail(&chunk[i], st, CERB_OUTCOME_NO);
            continue;
        }
        renew_pipeline(e, c, chunk, m, r, ns);
        bool any = false;
        for (size_t i = 0; i < m; i++)
            any = any || ns[i];
        if (any && !c->broken && reload(e, c, REDIS_SCRIPT_RENEW) == CERB_OK) {
            /* Run again, once, the runs of items that found no script. */
            for (size_t i = 0; i < m; i++) {
                if (!ns[i])
                    continue;
                size_t j = i;
                while (j < m && ns[j])
                    j++;
                renew_pipeline(e, c, chunk + i, j - i, r, ns2);
                i = j - 1;
            }
        }
        cerb__redis_put(e, c);
    }
}

/*
 * The probe walks the lock path on a connection of its own: acquire and
 * release a reserved name of this engine instance with a fresh token and a
 * short lease, pipelined (one round trip). The pipeline also keeps the
 * name's fence counter from living forever. A BUSY answer (a previous
 * probe's hold not yet expired) is still a healthy lock path.
 */
cerb_status cerb__redis_op_probe(cerb_engine *e, int64_t timeout_ms)
{
    int64_t deadline = cerb__deadline_in(timeout_ms);
    char token[33], lease[NUM_BUF], fttl[NUM_BUF];
    struct redis_keys ks;
    cerb_status st;

    snprintf(token, sizeof token, "%016llx%016llx",
             (unsigned long long)cerb__rand_below(UINT64_MAX),
             (unsigned long long)cerb__rand_below(UINT64_MAX));
    fmt_i64(lease, REDIS_PROBE_LEASE_MS);
    fmt_i64(fttl, 60000);
    st = cerb__redis_keys_init(&ks, e, e->probe_name, token);
    if (st != CERB_OK)
        return st;

    cerb__mutex_lock(&e->probe_mu);
    struct redis_conn *c = e->probe_conn;
    int64_t left = cerb__ms_left(deadline);
    if (!c) {
        int64_t cms = left < e->rc->connect_timeout_ms ? left : e->rc->connect_timeout_ms;
        st = cerb__redis_conn_open(e, cms, left, &c);
    } else {
        st = cerb__redis_conn_set_timeout(e, c, left);
    }
    struct redis_marker_view mv;
    bool lost = false;
    for (int attempt = 0; st == CERB_OK; attempt++) {
        const char *acq[6] = {token, lease, "0", "0", mv.value, "0"};
        const char *rel[4] = {token, "0", "0", mv.value};
        redisReply *r[3];
        size_t got = 0;
        cerb_outcome oc;

        st = cerb__redis_marker_for(e, c, &ks, &mv);
        if (st != CERB_OK)
            break;
        st = append_eval(e, c, e->sha[REDIS_SCRIPT_ACQUIRE], REDIS_SCRIPT_KEYS, &ks, 6, acq);
        if (st == CERB_OK)
            st = append_eval(e, c, e->sha[REDIS_SCRIPT_RELEASE], REDIS_SCRIPT_KEYS, &ks, 4, rel);
        if (st == CERB_OK) {
            const char *argv[3] = {"PEXPIRE", ks.k[REDIS_F], fttl};
            size_t argl[3] = {7, ks.len[REDIS_F], strlen(fttl)};
            st = cerb__redis_append(c, 3, argv, argl);
        }
        if (st == CERB_OK)
            st = cerb__redis_exchange(e, c, "probe", r, &got, &oc);
        if (st == CERB_OK) {
            bool noscript = cerb__redis_is_noscript(r[0]) || cerb__redis_is_noscript(r[1]);
            if (noscript && attempt == 0) {
                st = reload(e, c, REDIS_SCRIPT_ACQUIRE);
                if (st == CERB_OK)
                    st = reload(e, c, REDIS_SCRIPT_RELEASE);
                for (size_t i = 0; i < got; i++)
                    freeReplyObject(r[i]);
                if (st == CERB_OK && cerb__ms_left(deadline) > 0)
                    continue;
                if (st == CERB_OK)
                    st = cerb__error_set(CERB_EIO, "redis %s: probe: no time left", e->where);
                break;
            }
            static const char *const what[3] = {"probe acquire", "probe release",
                                                "probe PEXPIRE"};
            /* A probe notices a loss of data too (and reports every hold
             * LOST) even when nobody here locks: the server answered. */
            lost = cerb__redis_is_lost(r[0]);
            struct redis_acquire_result ar;
            int code;
            for (int i = 0; i < 3 && st == CERB_OK; i++) {
                bool ok = i == 0   ? cerb__redis_read_acquire(r[0], &ar) != REDIS_READ_BAD
                          : i == 1 ? cerb__redis_read_release(r[1], &code) != REDIS_READ_BAD
                                   : r[2]->type == REDIS_REPLY_INTEGER;
                if (!ok) {
                    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r[i]};
                    st = cerb__redis_fail(e->where, what[i], &f, &oc);
                }
            }
        }
        for (size_t i = 0; i < got; i++)
            freeReplyObject(r[i]);
        break;
    }
    if (st == CERB_OK && lost)
        st = marker_moved(e, c, &ks, &mv, NULL);
    if (c && (st != CERB_OK || c->broken)) {
        /* Whatever went wrong, the next probe starts on a new connection. */
        cerb__redis_conn_free(c);
        c = NULL;
    }
    e->probe_conn = c;
    cerb__mutex_unlock(&e->probe_mu);
    cerb__redis_keys_free(&ks);
    return st;
}
