/*
 * redis_rwlock.c — the read-write lock layout on Redis, Cerberus' own
 * (docs/rwlock.md, "## redis"): one FIFO queue per name, in arrival order,
 * readers and writers together. The operations are redis_queue.c's; this
 * file has the keys, the scripts and the reading of an inspection.
 *
 * Keys, B = redis.prefix + name (the lock key, never written here), ^_ the
 * byte 0x1f, all in B's cluster slot:
 *   {B}^_rw:q         zset: the queue; member "r:<token>" or "w:<token>",
 *                     score = a ticket, the highest score + 1 when joining.
 *   {B}^_rw:d         hash: token -> "<state> <mode> <lease> <deadline> <fence>",
 *                     state g (granted; deadline = end of its lease) or w
 *                     (waiting; deadline = alive until, refreshed by its
 *                     re-checks), mode r or w, times in server ms.
 *   {B}^_rw:fence     counter: the last grant's fence (a day's TTL).
 *   {B}^_rw:w:<tok>   list: a waiter's wake-ups ("w").
 *
 * The rule, over the live members in ticket order (every script first drops
 * the members whose deadline passed, granted or waiting): a reader is
 * granted when no writer is ahead of it, a writer when it is first. So a
 * reader behind a waiting writer waits (no writer starves), grants are made
 * in queue order, and the holders are a prefix of the queue.
 *
 * Wake-ups: a member leaving (release, give-up, or expiry found by any
 * script) wakes every waiting member the rule now grants — the readers up
 * to the first writer, or that writer when it is first — once each (a
 * wake list that already holds a "w" is not pushed again). A woken member
 * runs acquire and is granted there. Waiters re-check on a timer only to
 * stay alive (REDIS_TAIL_POLL_MS) and to see a holder's lease run out.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "redis_queue.h"

#define LUA_RW_COMMON                                                            \
    "local RQ, RD, F, W = KEYS[1], KEYS[2], KEYS[3], KEYS[5]\n"                  \
    "local WB = string.sub(W, 1, #W - #tok)\n"                                   \
    "local ALIVE, WTTL = " REDIS_Q_STR(REDIS_ALIVE_MS) ", " REDIS_Q_STR(REDIS_WAKE_TTL_MS) "\n" \
    "local function parse(v)\n"                                                  \
    "  if not v then return nil end\n"                                           \
    "  local st, md, ls, dl, f = string.match(v, '^(%a) (%a) (%d+) (%d+) (%d+)$')\n" \
    "  if not st then return nil end\n"                                          \
    "  return {st = st, md = md, lease = tonumber(ls), dl = tonumber(dl), f = tonumber(f)}\n" \
    "end\n"                                                                      \
    "local function sweep(now)\n"                                                \
    "  local gone = false\n"                                                     \
    "  for _, m in ipairs(redis.call('ZRANGE', RQ, 0, -1)) do\n"                 \
    "    local tk = string.sub(m, 3)\n"                                          \
    "    local e = parse(redis.call('HGET', RD, tk))\n"                          \
    "    if not e or e.dl < now or e.md ~= string.sub(m, 1, 1) then\n"           \
    "      redis.call('ZREM', RQ, m)\n"                                          \
    "      if e and e.md == string.sub(m, 1, 1) then redis.call('HDEL', RD, tk) end\n" \
    "      gone = true\n"                                                        \
    "    end\n"                                                                  \
    "  end\n"                                                                    \
    "  return gone\n"                                                            \
    "end\n"                                                                      \
    "local function keep(ms)\n"                                                  \
    "  for _, k in ipairs({RQ, RD}) do\n"                                        \
    "    local p = redis.call('PTTL', k)\n"                                      \
    "    if p ~= -2 and p < ms then redis.call('PEXPIRE', k, ms) end\n"          \
    "  end\n"                                                                    \
    "end\n"                                                                      \
    LUA_Q_FENCE                                                                  \
    "local function wake_ready()\n"                                              \
    "  for i, m in ipairs(redis.call('ZRANGE', RQ, 0, -1)) do\n"                 \
    "    local md, tk = string.sub(m, 1, 1), string.sub(m, 3)\n"                 \
    "    if md == 'w' and i > 1 then return end\n"                               \
    "    local e = parse(redis.call('HGET', RD, tk))\n"                          \
    "    if e and e.st == 'w' then wake(tk) end\n"                               \
    "    if md == 'w' then return end\n"                                         \
    "  end\n"                                                                    \
    "end\n"                                                                      \
    "local function forget(tk)\n"                                                \
    "  local e = parse(redis.call('HGET', RD, tk))\n"                            \
    "  redis.call('ZREM', RQ, 'r:' .. tk, 'w:' .. tk)\n"                         \
    "  redis.call('HDEL', RD, tk)\n"                                             \
    "  redis.call('DEL', W)\n"                                                   \
    "  return e\n"                                                               \
    "end\n"

/* KEYS RQ RD F M W, ARGV token mode(r|w) - lease wait marker floor
 * [epoch]. A grant answers its fence; "busy" {0, hint_ms, head,
 * quarantine} (head: every member ahead holds); the closure record
 * refusing {'C', record}; another marker "L". */
const char cerb__redis_lua_rw_acquire[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(4, 6)
    LUA_RW_COMMON
    LUA_Q_CLOSURE(4, "      forget(tok)\n      wake_ready()\n")
    LUA_Q_CLOCK(6)
    "local md, lease, wait = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "local FL = tonumber(ARGV[7]) or 0\n"
    "local KEEP = math.max(lease, ALIVE + WTTL)\n"
    "local me = md .. ':' .. tok\n"
    "local gone = sweep(now)\n"
    "local e = parse(redis.call('HGET', RD, tok))\n"
    "if e and e.st == 'g' and e.md == md then\n"
    "  redis.call('HSET', RD, tok, string.format('g %s %d %d %d', md, lease, now + lease, e.f))\n"
    "  redis.call('DEL', W)\n"
    "  keep(KEEP)\n"
    "  if gone then wake_ready() end\n"
    "  return e.f\n"
    "end\n"
    "local first, wahead, found, allg, hint = nil, false, false, true, -1\n"
    "for _, m in ipairs(redis.call('ZRANGE', RQ, 0, -1)) do\n"
    "  if m == me then found = true break end\n"
    "  first = first or m\n"
    "  if string.sub(m, 1, 1) == 'w' then wahead = true end\n"
    "  local a = parse(redis.call('HGET', RD, string.sub(m, 3)))\n"
    "  if not a or a.st ~= 'g' then allg = false\n"
    "  elseif hint < 0 or a.dl - now < hint then hint = a.dl - now end\n"
    "end\n"
    "local ok = (md == 'w' and not first) or (md == 'r' and not wahead)\n"
    "local function join()\n"
    "  if found then return end\n"
    "  local top = redis.call('ZRANGE', RQ, -1, -1, 'WITHSCORES')\n"
    "  redis.call('ZADD', RQ, top[2] and tonumber(top[2]) + 1 or 1, me)\n"
    "end\n"
    "if now >= QEND and ok then\n"
    "  join()\n"
    "  local f = next_fence(tick, FL)\n"
    "  redis.call('HSET', RD, tok, string.format('g %s %d %d %d', md, lease, now + lease, f))\n"
    "  redis.call('DEL', W)\n"
    "  keep(KEEP)\n"
    "  if gone then wake_ready() end\n"
    "  return f\n"
    "end\n"
    "redis.call('DEL', W)\n"
    "local head = 0\n"
    "if wait > 0 then\n"
    "  join()\n"
    "  redis.call('HSET', RD, tok, string.format('w %s %d %d 0', md, lease, now + math.min(wait, ALIVE)))\n"
    "  keep(KEEP)\n"
    "  if allg then head = 1 end\n"
    "end\n"
    "if gone then wake_ready() end\n"
    "local quar = 0\n"
    "if now < QEND then\n"
    "  quar = 1\n"
    "  if hint < QEND - now then hint = QEND - now end\n"
    "end\n"
    "return {0, hint, head, quar}\n";

/* KEYS RQ RD F M W, ARGV token leave marker lease. 1 when it was a live
 * hold (or leave), 0 when not ours; "L" another marker. */
const char cerb__redis_lua_rw_release[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(4, 3)
    LUA_RW_COMMON
    LUA_Q_CLOCK(3)
    "local e = forget(tok)\n"
    "sweep(now)\n"
    "wake_ready()\n"
    "if ARGV[2] == '1' then return 1 end\n"
    "if e and e.st == 'g' and e.dl >= now then return 1 end\n"
    "return 0\n";

/* KEYS RQ RD F M W, ARGV token lease marker. The fence, or -1. */
const char cerb__redis_lua_rw_renew[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(4, 3)
    LUA_RW_COMMON
    LUA_Q_CLOCK(3)
    "local lease = tonumber(ARGV[2])\n"
    "local e = parse(redis.call('HGET', RD, tok))\n"
    "if not e or e.st ~= 'g' then return -1 end\n"
    "if e.dl < now then\n"
    "  forget(tok)\n"
    "  sweep(now)\n"
    "  wake_ready()\n"
    "  return -1\n"
    "end\n"
    "redis.call('HSET', RD, tok, string.format('g %s %d %d %d', e.md, lease, now + lease, e.f))\n"
    "keep(math.max(lease, ALIVE + WTTL))\n"
    "return e.f\n";

/* KEYS RQ RD F M W, ARGV token marker. {fence, ms left} or {-1, 0}. */
const char cerb__redis_lua_rw_check[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(4, 2)
    LUA_RW_COMMON
    LUA_Q_CLOCK(2)
    "local e = parse(redis.call('HGET', RD, tok))\n"
    "if not e or e.st ~= 'g' or e.dl < now then return {-1, 0} end\n"
    "return {e.f, e.dl - now}\n";

/* KEYS RQ RD F M W (W of token ""), ARGV marker. 1 when a live member
 * holds, 0 when none, 2 during the quarantine after a loss of data. */
const char cerb__redis_lua_rw_held[] =
    "local tok = ''\n"
    LUA_MARKER_CHECK(4, 1)
    LUA_RW_COMMON
    LUA_Q_CLOCK(1)
    "if now < QEND then return 2 end\n"
    "for _, v in ipairs(redis.call('HVALS', RD)) do\n"
    "  local e = parse(v)\n"
    "  if e and e.st == 'g' and e.dl >= now then return 1 end\n"
    "end\n"
    "return 0\n";

/* KEYS RQ RD F M W. Read-only: {now, RQ with scores, RD}. */
const char cerb__redis_lua_rw_inspect[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "return {now, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('HGETALL', KEYS[2])}\n";

static cerb_status rw_read_inspect(cerb_engine *e, const char *name, const redisReply *r,
                                   struct cerb_holders *out)
{
    (void)name;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_ARRAY ||
        r->element[2]->type != REDIS_REPLY_ARRAY) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        return cerb__redis_fail(e->where, "rwlock inspect", &f, NULL);
    }
    long long now = r->element[0]->integer;
    const redisReply *q = r->element[1], *d = r->element[2];
    cerb_status st = CERB_OK;
    /* Two passes, holders then waiters; each in ticket order (the holders
     * are a prefix of the queue, save members a script will drop). */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; st == CERB_OK && i + 1 < q->elements; i += 2) {
            const redisReply *m = q->element[i];
            if (m->type != REDIS_REPLY_STRING || m->len < 3)
                continue;
            const char *tk = m->str + 2;
            size_t tl = m->len - 2;
            for (size_t j = 0; j + 1 < d->elements; j += 2) {
                const redisReply *f = d->element[j], *v = d->element[j + 1];
                char s, md;
                long long lease, dl;
                unsigned long long fence;
                if (f->type != REDIS_REPLY_STRING || f->len != tl || memcmp(f->str, tk, tl) != 0 ||
                    v->type != REDIS_REPLY_STRING ||
                    sscanf(v->str, "%c %c %lld %lld %llu", &s, &md, &lease, &dl, &fence) != 5)
                    continue;
                if (dl < now || md != m->str[0] || (s == 'g') != (pass == 0))
                    break;
                st = cerb__holders_add(out, tk, tl, pass, s == 'g' ? fence : 0,
                                       s == 'g' ? dl - now : -1, md == 'w' ? "write" : "read");
                break;
            }
        }
    }
    return st;
}

const struct redis_qkind cerb__redis_qkind_rw = {
    .prim = CERB_PRIM_RWLOCK,
    .infix = "",
    .nkeys = 5,
    .keys = {{REDIS_QK_HELPER, "rw:q"},
             {REDIS_QK_HELPER, "rw:d"},
             {REDIS_QK_HELPER, "rw:fence"},
             {REDIS_QK_MARK, NULL},
             {REDIS_QK_WAKE, "rw:w:"}},
    .acquire = REDIS_SCRIPT_RW_ACQUIRE,
    .release = REDIS_SCRIPT_RW_RELEASE,
    .renew = REDIS_SCRIPT_RW_RENEW,
    .check = REDIS_SCRIPT_RW_CHECK,
    .held = REDIS_SCRIPT_RW_HELD,
    .inspect = REDIS_SCRIPT_RW_INSPECT,
    .read_inspect = rw_read_inspect,
};
