/*
 * redis_semaphore.c — the semaphore layout on Redis: npm redis-semaphore's
 * sorted set, and what Cerberus keeps beside it (docs/semaphore.md, "##
 * redis"). The operations are redis_queue.c's; this file has the keys, the
 * scripts and the reading of an inspection.
 *
 * Keys, B = redis.prefix + "semaphore:" + name (npm's key with an ioredis
 * keyPrefix equal to redis.prefix), ^_ the byte 0x1f:
 *   B                 zset, npm's: one member per permit held, score = the
 *                     server time (ms) of its acquire or last refresh; a
 *                     hold of one permit is the member <token>, of k > 1 the
 *                     members <token>_0 .. <token>_<k-1> (npm MultiSemaphore).
 *                     PEXPIRE at least the longest lease in force.
 *   {B}^_sem:limit    string: the limit stored while B or the queue has
 *                     members.
 *   {B}^_sem:h        hash: our members, token -> "g k lease 0 fence" (holds)
 *                     or "w k lease alive_ms floor" (waiters; floor: the
 *                     fence floor their grant must pass).
 *   {B}^_sem:q        list: waiting tokens, FIFO.
 *   {B}^_sem:fence    counter: the last grant's fence (a day's TTL).
 *   {B}^_sem:w:<tok>  list: a waiter's wake-ups: "w" (look again) or
 *                     "f<fence>" (granted by a hand-off).
 *
 * The rule. Every script first drops the dead: our holds whose score +
 * their own lease passed (or whose members a peer removed), our waiters
 * whose alive deadline passed, and peers' members older than now − the
 * caller's lease (npm's own cleanup, with its lockTimeout). A caller is
 * granted when no live waiter is ahead of it in the queue and ZCARD(B) + k
 * <= limit; otherwise a caller that may wait joins the queue's tail. Only
 * the head may take permits, so a request for several is not passed by
 * smaller ones behind it. npm peers do not queue: they take a permit
 * whenever ZCARD < limit, and may overtake our head (documented).
 *
 * Hand-off (grant_heads): a release, a leave, and every acquire before it
 * looks at its caller, grant the waiters at the head of the queue whose k
 * permits fit, in order, in the same script: members ZADDed at now, a
 * fence above the floor stored in their entry, a lease of min(theirs,
 * REDIS_HANDOFF_TTL_MS) (the core extends it at once, as a lock's hand-off,
 * so a waiter that died after its last re-check blocks the permits that
 * long), and "f<fence>" pushed on their wake lists: a woken waiter holds
 * already (redis_queue.c). During the quarantine, or while the closure
 * record says closed (single and Sentinel mode), the head is only woken
 * ("w") when it fits, and its own acquire decides; a renewal that finds
 * its hold expired only wakes too. npm releases notify nobody: the head
 * re-checks every REDIS_HEAD_POLL_MS, the others every REDIS_TAIL_POLL_MS
 * (to stay alive); anyone's acquire hands the room over.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "redis_queue.h"

#define LUA_SEM_COMMON                                                           \
    "local Z, H, Q, F, L, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7]\n" \
    "local WB = string.sub(W, 1, #W - #tok)\n"                                   \
    "local ALIVE, WTTL = " REDIS_Q_STR(REDIS_ALIVE_MS) ", " REDIS_Q_STR(REDIS_WAKE_TTL_MS) "\n" \
    "local CAP = " REDIS_Q_STR(REDIS_HANDOFF_TTL_MS) "\n"                         \
    "local function parse(v)\n"                                                  \
    "  if not v then return nil end\n"                                           \
    "  local st, n, ls, dl, f = string.match(v, '^(%a) (%d+) (%d+) (%d+) (%d+)$')\n" \
    "  if not st then return nil end\n"                                          \
    "  return {st = st, n = tonumber(n), lease = tonumber(ls), dl = tonumber(dl), f = tonumber(f)}\n" \
    "end\n"                                                                      \
    "local function mem(tk, n, i)\n"                                             \
    "  if n == 1 then return tk end\n"                                           \
    "  return tk .. '_' .. i\n"                                                  \
    "end\n"                                                                      \
    "local function zrem_all(tk, n)\n"                                           \
    "  for i = 0, n - 1 do redis.call('ZREM', Z, mem(tk, n, i)) end\n"           \
    "end\n"                                                                      \
    "local function sweep(now, lease)\n"                                         \
    "  local all = redis.call('HGETALL', H)\n"                                   \
    "  for i = 1, #all, 2 do\n"                                                  \
    "    local tk, e = all[i], parse(all[i + 1])\n"                              \
    "    local dead = true\n"                                                    \
    "    if e and e.st == 'g' then\n"                                            \
    "      local s = redis.call('ZSCORE', Z, mem(tk, e.n, 0))\n"                 \
    "      dead = not s or tonumber(s) + e.lease < now\n"                        \
    "      if dead then zrem_all(tk, e.n) end\n"                                 \
    "    elseif e then\n"                                                        \
    "      dead = e.dl < now\n"                                                  \
    "      if dead then redis.call('LREM', Q, 1, tk) end\n"                      \
    "    else\n"                                                                 \
    "      redis.call('LREM', Q, 1, tk)\n"                                       \
    "    end\n"                                                                  \
    "    if dead then redis.call('HDEL', H, tk) end\n"                           \
    "  end\n"                                                                    \
    "  for _, m in ipairs(redis.call('ZRANGEBYSCORE', Z, '-inf', now - lease)) do\n" \
    "    local tk = string.match(m, '^(.+)_%d+$') or m\n"                        \
    "    if redis.call('HEXISTS', H, tk) == 0 and redis.call('HEXISTS', H, m) == 0 then\n" \
    "      redis.call('ZREM', Z, m)\n"                                           \
    "    end\n"                                                                  \
    "  end\n"                                                                    \
    "end\n"                                                                      \
    "local function keep(ms)\n"                                                  \
    "  for _, k in ipairs({Z, H, Q, L}) do\n"                                    \
    "    local p = redis.call('PTTL', k)\n"                                      \
    "    if p ~= -2 and p < ms then redis.call('PEXPIRE', k, ms) end\n"          \
    "  end\n"                                                                    \
    "end\n"                                                                      \
    LUA_Q_FENCE                                                                  \
    "local function closed(cf)\n"                                                \
    "  return cf and string.find(redis.call('GET', KEYS[6] .. '\\31closure') or '',\n" \
    "                            ' closed', 1, true) ~= nil\n"                    \
    "end\n"                                                                      \
    "local function grant_heads(now, tick, qend, hand, stop)\n"                   \
    "  local lim, card, kl = tonumber(redis.call('GET', L) or ''), nil, 0\n"      \
    "  while true do\n"                                                          \
    "    local h = redis.call('LINDEX', Q, 0)\n"                                 \
    "    if not h or h == stop then break end\n"                                 \
    "    local e = parse(redis.call('HGET', H, h))\n"                            \
    "    if not e or e.st ~= 'w' then break end\n"                               \
    "    card = card or redis.call('ZCARD', Z)\n"                                \
    "    if lim and card + e.n > lim then break end\n"                           \
    "    if not hand or not lim or now < qend or e.dl < now then\n"              \
    "      wake(h)\n"                                                            \
    "      break\n"                                                              \
    "    end\n"                                                                  \
    "    local f = next_fence(tick, e.f)\n"                                      \
    "    for i = 0, e.n - 1 do redis.call('ZADD', Z, now, mem(h, e.n, i)) end\n" \
    "    card = card + e.n\n"                                                    \
    "    redis.call('HSET', H, h, string.format('g %d %d 0 %d', e.n, math.min(e.lease, CAP), f))\n" \
    "    redis.call('LPOP', Q)\n"                                                \
    "    local w = WB .. h\n"                                                    \
    "    redis.call('DEL', w)\n"                                                 \
    "    redis.call('RPUSH', w, string.format('f%d', f))\n"                      \
    "    redis.call('PEXPIRE', w, WTTL)\n"                                       \
    "    if e.lease > kl then kl = e.lease end\n"                                \
    "  end\n"                                                                    \
    "  if kl > 0 then keep(math.max(kl, ALIVE + WTTL)) end\n"                    \
    "end\n"                                                                      \
    "local function forget(tk)\n"                                                \
    "  local e = parse(redis.call('HGET', H, tk))\n"                             \
    "  if e and e.st == 'g' then zrem_all(tk, e.n) else redis.call('LREM', Q, 1, tk) end\n" \
    "  redis.call('HDEL', H, tk)\n"                                              \
    "  redis.call('DEL', W)\n"                                                   \
    "  return e\n"                                                               \
    "end\n"

/* KEYS Z H Q F L M W, ARGV token k limit lease wait marker floor [epoch].
 * A grant answers its fence; "busy" {0, hint_ms, head, quarantine}; a
 * stored limit that differs {'E', limit} (nothing changed); the closure
 * record refusing {'C', record} (our member removed); another marker "L". */
const char cerb__redis_lua_sem_acquire[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(6, 6)
    LUA_SEM_COMMON
    LUA_Q_CLOSURE(6, "      forget(tok)\n")
    LUA_Q_CLOCK(6)
    "local cnt, lim, lease, wait = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "local FL = tonumber(ARGV[7]) or 0\n"
    "local KEEP = math.max(lease, ALIVE + WTTL)\n"
    "sweep(now, lease)\n"
    "local e = parse(redis.call('HGET', H, tok))\n"
    "if e and e.st == 'g' then\n"
    "  for i = 0, e.n - 1 do redis.call('ZADD', Z, now, mem(tok, e.n, i)) end\n"
    "  redis.call('HSET', H, tok, string.format('g %d %d 0 %d', e.n, lease, e.f))\n"
    "  redis.call('DEL', W)\n"
    "  keep(KEEP)\n"
    "  return e.f\n"
    "end\n"
    "local card, qn = redis.call('ZCARD', Z), redis.call('LLEN', Q)\n"
    "local sl = redis.call('GET', L)\n"
    "if sl and (card > 0 or qn > 0) and tonumber(sl) ~= lim then return {'E', sl} end\n"
    "local HAND = not closed(ARGV[8] ~= nil)\n"
    "if qn > 0 then\n"
    "  grant_heads(now, tick, QEND, HAND, tok)\n"
    "  card = redis.call('ZCARD', Z)\n"
    "end\n"
    "local ahead, pos = 0, nil\n"
    "for i, w in ipairs(redis.call('LRANGE', Q, 0, -1)) do\n"
    "  if w == tok then pos = i break end\n"
    "  ahead = ahead + 1\n"
    "end\n"
    "if now >= QEND and ahead == 0 and card + cnt <= lim then\n"
    "  local f = next_fence(tick, FL)\n"
    "  for i = 0, cnt - 1 do redis.call('ZADD', Z, now, mem(tok, cnt, i)) end\n"
    "  redis.call('HSET', H, tok, string.format('g %d %d 0 %d', cnt, lease, f))\n"
    "  if pos then redis.call('LREM', Q, 1, tok) end\n"
    "  redis.call('DEL', W)\n"
    "  redis.call('SET', L, ARGV[3])\n"
    "  keep(KEEP)\n"
    "  grant_heads(now, tick, QEND, HAND, nil)\n"
    "  return f\n"
    "end\n"
    "redis.call('DEL', W)\n"
    "local head = 0\n"
    "if wait > 0 then\n"
    "  redis.call('HSET', H, tok, string.format('w %d %d %d %d', cnt, lease, now + math.min(wait, ALIVE), FL))\n"
    "  if not pos then redis.call('RPUSH', Q, tok) end\n"
    "  if ahead == 0 then head = 1 end\n"
    "  redis.call('SET', L, ARGV[3])\n"
    "  keep(KEEP)\n"
    "end\n"
    "local hint = -1\n"
    "local o = redis.call('ZRANGE', Z, 0, 0, 'WITHSCORES')\n"
    "if o[2] then hint = math.max(0, tonumber(o[2]) + lease - now) end\n"
    "local quar = 0\n"
    "if now < QEND then\n"
    "  quar = 1\n"
    "  if hint < QEND - now then hint = QEND - now end\n"
    "end\n"
    "return {0, hint, head, quar}\n";

/* KEYS Z H Q F L M W, ARGV token leave marker lease [closure]. Takes the
 * token's members and queue entry out, then hands the room to the heads
 * that fit (nothing while the closure record says closed, with closure
 * "1": single and Sentinel mode). 1 when it
 * was a live hold (or leave), 0 when not ours; "L" another marker. */
const char cerb__redis_lua_sem_release[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(6, 3)
    LUA_SEM_COMMON
    LUA_Q_CLOCK(3)
    "local lease = tonumber(ARGV[4])\n"
    "local e = parse(redis.call('HGET', H, tok))\n"
    "local ok = 0\n"
    "if e and e.st == 'g' then\n"
    "  local s = redis.call('ZSCORE', Z, mem(tok, e.n, 0))\n"
    "  if s and tonumber(s) + e.lease >= now then ok = 1 end\n"
    "end\n"
    "forget(tok)\n"
    "sweep(now, lease)\n"
    "grant_heads(now, tick, QEND, not closed(ARGV[5] == '1'), nil)\n"
    "if redis.call('ZCARD', Z) == 0 and redis.call('LLEN', Q) == 0 then redis.call('DEL', L) end\n"
    "if ARGV[2] == '1' then return 1 end\n"
    "return ok\n";

/* KEYS Z H Q F L M W, ARGV token lease marker. The hold's fence, its
 * members' scores set to now; -1 when it is no live hold. */
const char cerb__redis_lua_sem_renew[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(6, 3)
    LUA_SEM_COMMON
    LUA_Q_CLOCK(3)
    "local lease = tonumber(ARGV[2])\n"
    "local e = parse(redis.call('HGET', H, tok))\n"
    "if not e or e.st ~= 'g' then return -1 end\n"
    "local s = redis.call('ZSCORE', Z, mem(tok, e.n, 0))\n"
    "if not s or tonumber(s) + e.lease < now then\n"
    "  forget(tok)\n"
    "  grant_heads(now, tick, QEND, false, nil)\n"
    "  return -1\n"
    "end\n"
    "for i = 0, e.n - 1 do redis.call('ZADD', Z, now, mem(tok, e.n, i)) end\n"
    "redis.call('HSET', H, tok, string.format('g %d %d 0 %d', e.n, lease, e.f))\n"
    "keep(math.max(lease, ALIVE + WTTL))\n"
    "return e.f\n";

/* KEYS Z H Q F L M W, ARGV token marker. {fence, ms left} or {-1, 0}. */
const char cerb__redis_lua_sem_check[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(6, 2)
    LUA_SEM_COMMON
    LUA_Q_CLOCK(2)
    "local e = parse(redis.call('HGET', H, tok))\n"
    "if not e or e.st ~= 'g' then return {-1, 0} end\n"
    "local s = redis.call('ZSCORE', Z, mem(tok, e.n, 0))\n"
    "if not s or tonumber(s) + e.lease < now then return {-1, 0} end\n"
    "return {e.f, tonumber(s) + e.lease - now}\n";

/* KEYS Z H Q F L M W (W of token ""), ARGV marker. 1 when B has a member
 * (a peer's included: a stale one counts until npm's own expiry drops it),
 * 0 when not, 2 during the quarantine after a loss of data. */
const char cerb__redis_lua_sem_held[] =
    "local tok = ''\n"
    LUA_MARKER_CHECK(6, 1)
    LUA_Q_CLOCK(1)
    "if now < QEND then return 2 end\n"
    "if redis.call('ZCARD', KEYS[1]) > 0 then return 1 end\n"
    "return 0\n";

/* KEYS Z H Q F L M W, ARGV token k limit lease marker. Read-only (the
 * switch gate's question, engine.h's fits): would a new member of k
 * permits be granted at the tail now? 0 yes, 1 no, 2 during the
 * quarantine after a loss of data. Counted: the permits of every live
 * member, waiting or holding, peers' members included (live as the sweep
 * keeps them: score > now - lease), the token's own left out; against the
 * stored limit while any live member is there, else the caller's. */
const char cerb__redis_lua_sem_fits[] =
    "local tok = ARGV[1]\n"
    LUA_MARKER_CHECK(6, 5)
    LUA_SEM_COMMON
    LUA_Q_CLOCK(5)
    "if now < QEND then return 2 end\n"
    "local cnt, lim, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local used, live, inh = 0, false, {}\n"
    "local all = redis.call('HGETALL', H)\n"
    "for i = 1, #all, 2 do\n"
    "  local tk, e = all[i], parse(all[i + 1])\n"
    "  inh[tk] = true\n"
    "  local n = 0\n"
    "  if e and e.st == 'g' then\n"
    "    local s = redis.call('ZSCORE', Z, mem(tk, e.n, 0))\n"
    "    if s and tonumber(s) + e.lease >= now then n = e.n end\n"
    "  elseif e and e.dl >= now then\n"
    "    n = e.n\n"
    "  end\n"
    "  if n > 0 then live = true end\n"
    "  if tk ~= tok then used = used + n end\n"
    "end\n"
    "for _, m in ipairs(redis.call('ZRANGEBYSCORE', Z, string.format('(%d', now - lease), '+inf')) do\n"
    "  local tk = string.match(m, '^(.+)_%d+$') or m\n"
    "  if not inh[tk] and not inh[m] then\n"
    "    live = true\n"
    "    if tk ~= tok and m ~= tok then used = used + 1 end\n"
    "  end\n"
    "end\n"
    "local sl = tonumber(redis.call('GET', L) or '')\n"
    "if live and sl then lim = sl end\n"
    "if used + cnt <= lim then return 0 end\n"
    "return 1\n";

/* KEYS Z H Q F L M W. Read-only: {now, limit or '', Z with scores, H,
 * Q}. */
const char cerb__redis_lua_sem_inspect[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "return {now, redis.call('GET', KEYS[5]) or '', redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'),\n"
    "        redis.call('HGETALL', KEYS[2]), redis.call('LRANGE', KEYS[3], 0, -1)}\n";

/* Our member entry `tok` of the H listing, parsed. */
struct sem_entry {
    char st;
    unsigned long n;
    long long lease, dl;
    unsigned long long fence;
};

static bool find_entry(const redisReply *h, const char *tok, size_t tl, struct sem_entry *out)
{
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const redisReply *f = h->element[i], *v = h->element[i + 1];
        if (f->type != REDIS_REPLY_STRING || f->len != tl || memcmp(f->str, tok, tl) != 0 ||
            v->type != REDIS_REPLY_STRING)
            continue;
        return sscanf(v->str, "%c %lu %lld %lld %llu", &out->st, &out->n, &out->lease, &out->dl,
                      &out->fence) == 5;
    }
    return false;
}

static cerb_status sem_read_inspect(cerb_engine *e, const char *name, const redisReply *r,
                                    struct cerb_holders *out)
{
    (void)name;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 5 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[2]->type != REDIS_REPLY_ARRAY || r->element[3]->type != REDIS_REPLY_ARRAY ||
        r->element[4]->type != REDIS_REPLY_ARRAY) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        return cerb__redis_fail(e->where, "semaphore inspect", &f, NULL);
    }
    long long now = r->element[0]->integer;
    const char *limit = r->element[1]->len ? r->element[1]->str : "?";
    const redisReply *z = r->element[2], *h = r->element[3], *q = r->element[4];
    char detail[64];
    cerb_status st = CERB_OK;

    /* Holders in the order of their scores; ours once per hold. */
    for (size_t i = 0; st == CERB_OK && i + 1 < z->elements; i += 2) {
        const redisReply *m = z->element[i], *sc = z->element[i + 1];
        if (m->type != REDIS_REPLY_STRING || sc->type != REDIS_REPLY_STRING)
            continue;
        long long score = strtoll(sc->str, NULL, 10);
        size_t tl = m->len;
        const char *us = NULL;
        for (size_t j = m->len; j > 0 && !us; j--)
            if (m->str[j - 1] == '_')
                us = m->str + j - 1;
        struct sem_entry en;
        bool ours = find_entry(h, m->str, m->len, &en) && en.n == 1;
        if (!ours && us && us > m->str) {
            tl = (size_t)(us - m->str);
            ours = find_entry(h, m->str, tl, &en) && en.n > 1;
            /* One entry per hold: only its member _0. */
            if (ours && strcmp(us, "_0") != 0)
                continue;
        }
        if (ours && en.st == 'g') {
            long long left = score + en.lease - now;
            if (left < 0)
                continue; /* dead, dropped by the next script */
            snprintf(detail, sizeof detail, "permits %lu of %s", en.n, limit);
            st = cerb__holders_add(out, m->str, tl, 0, en.fence, left, detail);
        } else if (!ours) {
            snprintf(detail, sizeof detail, "permits 1 of %s", limit);
            st = cerb__holders_add(out, m->str, m->len, 0, 0, -1, detail);
        }
    }
    for (size_t i = 0; st == CERB_OK && i < q->elements; i++) {
        const redisReply *t = q->element[i];
        struct sem_entry en;
        if (t->type != REDIS_REPLY_STRING || !find_entry(h, t->str, t->len, &en) ||
            en.st != 'w' || en.dl < now)
            continue;
        snprintf(detail, sizeof detail, "permits %lu of %s", en.n, limit);
        st = cerb__holders_add(out, t->str, t->len, 1, 0, -1, detail);
    }
    return st;
}

const struct redis_qkind cerb__redis_qkind_sem = {
    .prim = CERB_PRIM_SEMAPHORE,
    .infix = "semaphore:",
    .nkeys = 7,
    .keys = {{REDIS_QK_BASE, NULL},
             {REDIS_QK_HELPER, "sem:h"},
             {REDIS_QK_HELPER, "sem:q"},
             {REDIS_QK_HELPER, "sem:fence"},
             {REDIS_QK_HELPER, "sem:limit"},
             {REDIS_QK_MARK, NULL},
             {REDIS_QK_WAKE, "sem:w:"}},
    .acquire = REDIS_SCRIPT_SEM_ACQUIRE,
    .release = REDIS_SCRIPT_SEM_RELEASE,
    .renew = REDIS_SCRIPT_SEM_RENEW,
    .check = REDIS_SCRIPT_SEM_CHECK,
    .held = REDIS_SCRIPT_SEM_HELD,
    .inspect = REDIS_SCRIPT_SEM_INSPECT,
    .fits = REDIS_SCRIPT_SEM_FITS,
    .read_inspect = sem_read_inspect,
};
