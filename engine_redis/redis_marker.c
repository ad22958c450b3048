/*
 * redis_marker.c — the marker key that tells the engine its server lost
 * the data (redis_marker.h), and what the engine does when it has.
 *
 * How long the quarantine is. A hold's local deadline is at most one lease
 * after its last renewal was sent, and that renewal ran before the loss; a
 * marker found missing "now" therefore covers every hold of the lost data
 * with a quarantine of the longest lease this instance has used (at least
 * lock.lease_ms) plus drift (1 % + 2 ms, as the core's deadline) from now. The server cannot tell a first start from a restart
 * without its data, so a server never used before also waits one lease
 * before its first grant (Redlock's "delayed restart"), unless whoever
 * starts it runs `cerberus init` first (redis_init.c), and every instance
 * that waits says so once (redis_quarantine.h). The quarantine is the lease of the instance
 * that found the marker missing; clients of one server should share
 * lock.lease_ms (the core refuses per-lock leases beyond it with redis).
 *
 * The marker is made by a script that only writes when it is missing, so
 * every instance that notices a loss adopts the one marker the first made,
 * and its quarantine.
 */
#include "internal_posix.h"

#include "redis_marker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_cluster.h"
#include "redis_quarantine.h"
#include "redis_scripts.h"

/* KEYS M, ARGV candidate-id quarantine-ms replid asking: {the marker, 1
 * when this run made it (it was missing; with the server's replid when
 * known), server time ms}; nil when missing and asking is "1". The time
 * tells the caller how long a quarantine in force has left. */
static const char lua_marker[] =
    "local m = redis.call('GET', KEYS[1])\n"
    "if not m and ARGV[4] == '1' then return false end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "if m then return {m, 0, now} end\n"
    "m = ARGV[1] .. ' ' .. string.format('%d', now + tonumber(ARGV[2]))\n"
    "if ARGV[3] ~= '' then m = m .. ' ' .. ARGV[3] end\n"
    "redis.call('SET', KEYS[1], m)\n"
    "return {m, 1, now}\n";

/* KEYS M, ARGV replid quarantine-ms: record a new history (redis_marker.h,
 * cerb__redis_marker_history). Answers {M as it is now, 1 when this run
 * raised its quarantine, server time ms, the replid M recorded before}, or
 * nil when missing (a loss: the first script's "L" makes a new one). */
static const char lua_history[] =
    "local m = redis.call('GET', KEYS[1])\n"
    "if not m then return false end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local id, q, r = string.match(m, '^(%S+) (%d+) ?(%x*)$')\n"
    "if not id or r == ARGV[1] then return {m, 0, now, r or ''} end\n"
    "q = tonumber(q)\n"
    "local nq = now + tonumber(ARGV[2])\n"
    "if q < nq then q = nq end\n"
    "m = id .. ' ' .. string.format('%d', q) .. ' ' .. ARGV[1]\n"
    "redis.call('SET', KEYS[1], m)\n"
    "return {m, 1, now, r}\n";

/* What the marker or history script answered (a table, see above). */
struct marker_answer {
    const redisReply *m; /* the marker's value */
    bool changed;        /* made (marker) or raised (history) by this run */
    long long now_ms;    /* server time */
    char before[48];     /* history: the replid recorded before ("" none) */
};

static bool parse_answer(const redisReply *r, struct marker_answer *a)
{
    memset(a, 0, sizeof *a);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_INTEGER || r->element[2]->type != REDIS_REPLY_INTEGER)
        return false;
    a->m = r->element[0];
    a->changed = r->element[1]->integer == 1;
    a->now_ms = r->element[2]->integer;
    if (r->elements > 3 && r->element[3]->type == REDIS_REPLY_STRING &&
        r->element[3]->len < sizeof a->before) {
        memcpy(a->before, r->element[3]->str, r->element[3]->len);
        a->before[r->element[3]->len] = '\0';
    }
    return true;
}

/* Say a quarantine that v's marker is in (or began) (redis_quarantine.h). */
static void say(cerb_engine *e, enum redis_q_why why, int slot,
                const struct redis_marker_view *v, long long now_ms, const char *detail)
{
    cerb__redis_quarantine_say(e, why, slot, strtoll(v->qend, NULL, 10), now_ms, detail);
}

size_t cerb__redis_marker_key(char *buf, size_t len, const char *prefix, long tag)
{
    static const char tail[] = REDIS_SEP "cerberus";
    char head[24] = "";
    if (!prefix)
        prefix = "";
    if (tag >= 0)
        snprintf(head, sizeof head, "{%ld}", tag);
    size_t hl = strlen(head), pl = strlen(prefix);
    if (hl + pl + sizeof tail > len)
        return 0;
    memcpy(buf, head, hl);
    memcpy(buf + hl, prefix, pl);
    memcpy(buf + hl + pl, tail, sizeof tail);
    return hl + pl + sizeof tail - 1;
}

cerb_status cerb__redis_marker_init(cerb_engine *e)
{
    const char *prefix = e->rc->prefix ? e->rc->prefix : "";
    size_t need = strlen(prefix) + sizeof REDIS_SEP "cerberus";
    int64_t lease = e->cfg->lock.lease_ms;

    e->marker_key = cerb__malloc(need);
    if (!e->marker_key)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    e->marker_key_len = cerb__redis_marker_key(e->marker_key, need, prefix, -1);
    e->quarantine_ms = lease + lease / 100 + 2;
    e->marker[0] = '\0';
    e->marker_qend[0] = '\0';
    cerb__mutex_init(&e->marker_mu);
    return CERB_OK;
}

void cerb__redis_marker_note_lease(cerb_engine *e, int64_t lease_ms)
{
    int64_t q = lease_ms + lease_ms / 100 + 2;
    int64_t cur = atomic_load_explicit(&e->quarantine_ms, memory_order_relaxed);
    while (cur < q && !atomic_compare_exchange_weak(&e->quarantine_ms, &cur, q))
        ;
}

void cerb__redis_marker_destroy(cerb_engine *e)
{
    if (!e->marker_key)
        return;
    cerb__free(e->marker_key);
    e->marker_key = NULL;
    cerb__mutex_destroy(&e->marker_mu);
}

/* replid may be NULL (not wanted). */
bool cerb__redis_marker_parse(const redisReply *r, struct redis_marker_view *v, char *replid,
                              size_t rlen)
{
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len >= REDIS_MARKER_MAX)
        return false;
    const char *s = r->str, *end = r->str + r->len;
    const char *sp = memchr(s, ' ', r->len);
    if (!sp || sp == s)
        return false;
    const char *q = sp + 1, *qe = memchr(q, ' ', (size_t)(end - q));
    if (!qe)
        qe = end;
    size_t il = (size_t)(sp - s), ql = (size_t)(qe - q);
    if (il >= sizeof v->value || ql == 0 || ql >= sizeof v->qend)
        return false;
    for (size_t i = 0; i < ql; i++)
        if (q[i] < '0' || q[i] > '9')
            return false;
    size_t rl = qe < end ? (size_t)(end - qe - 1) : 0;
    if (replid && rl >= rlen)
        return false;
    memcpy(v->value, s, il);
    v->value[il] = '\0';
    memcpy(v->qend, q, ql);
    v->qend[ql] = '\0';
    if (replid) {
        memcpy(replid, qe + (rl ? 1 : 0), rl);
        replid[rl] = '\0';
    }
    return true;
}

/* Run the marker script on c for the marker at key: the marker as it is on
 * the server now, and the replid it records (into rec, when not NULL);
 * whether this run made it, and the server's time (when not NULL). */
static cerb_status read_marker_at(cerb_engine *e, struct redis_conn *c, const char *key,
                                  size_t klen, struct redis_marker_view *v, char *rec,
                                  size_t reclen, bool *made, long long *now_ms)
{
    struct marker_answer a;
    char cand[17], qlen[24], rid[sizeof e->replid_seen];
    redisReply *r = NULL;
    size_t got = 0;
    cerb_outcome oc;

    snprintf(cand, sizeof cand, "%016llx", (unsigned long long)cerb__rand_below(UINT64_MAX));
    snprintf(qlen, sizeof qlen, "%lld", (long long)atomic_load(&e->quarantine_ms));
    cerb__mutex_lock(&e->marker_mu);
    memcpy(rid, e->replid_seen, sizeof rid);
    cerb__mutex_unlock(&e->marker_mu);
    /*
     * Cluster, on the target of an ASK: that answer was about the key of
     * another request (a wake list, the lock key), and the marker may still
     * be on the source. Making one here would fork the slot's history (and
     * the migration of the real one then fails: BUSYKEY). So only read; a
     * marker not here yet is the server's "try again".
     */
    bool asking = cerb__redis_asking();
    const char *argv[8] = {"EVAL", lua_marker, "1", key, cand, qlen, rid, asking ? "1" : "0"};
    size_t argl[8] = {4, sizeof lua_marker - 1, 1, klen, strlen(cand),
                      strlen(qlen), strlen(rid), 1};
    cerb_status st = cerb__redis_append(c, 8, argv, argl);
    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, "marker", &r, &got, &oc);
    if (st != CERB_OK)
        return st;
    if (asking && r->type == REDIS_REPLY_NIL) {
        char tryagain[] = "TRYAGAIN the marker has not reached the migration's target";
        redisReply ta = {.type = REDIS_REPLY_ERROR, .str = tryagain, .len = sizeof tryagain - 1};
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = &ta};
        st = cerb__redis_fail(e->where, "marker", &f, NULL);
    } else if (!parse_answer(r, &a) || !cerb__redis_marker_parse(a.m, v, rec, reclen)) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        st = cerb__redis_fail(e->where, "marker", &f, NULL);
    } else {
        if (made)
            *made = a.changed;
        if (now_ms)
            *now_ms = a.now_ms;
    }
    freeReplyObject(r);
    return st;
}

static cerb_status read_marker(cerb_engine *e, struct redis_conn *c, struct redis_marker_view *v,
                               bool *made, long long *now_ms)
{
    return read_marker_at(e, c, e->marker_key, e->marker_key_len, v, NULL, 0, made, now_ms);
}

cerb_status cerb__redis_marker_fetch(cerb_engine *e, struct redis_conn *c)
{
    struct redis_marker_view v;
    bool made = false;
    long long now = 0;
    cerb_status st = read_marker(e, c, &v, &made, &now);
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&e->marker_mu);
    memcpy(e->marker, v.value, sizeof e->marker);
    memcpy(e->marker_qend, v.qend, sizeof e->marker_qend);
    cerb__mutex_unlock(&e->marker_mu);
    /* The wait this instance's first grants will have, said at open (a
     * quarantine the history check at connect raised is said already). */
    say(e, made ? REDIS_Q_MISSING : REDIS_Q_FOUND, -1, &v, now, NULL);
    return CERB_OK;
}

void cerb__redis_marker_get(cerb_engine *e, struct redis_marker_view *v)
{
    cerb__mutex_lock(&e->marker_mu);
    memcpy(v->value, e->marker, sizeof v->value);
    memcpy(v->qend, e->marker_qend, sizeof v->qend);
    cerb__mutex_unlock(&e->marker_mu);
}

bool cerb__redis_is_lost(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_STRING && r->len == 1 && r->str[0] == 'L';
}

/* Tell every hold of the instance that the data went (once per loss), and
 * the quarantine of the marker now (v) in force. */
static void report_loss(cerb_engine *e, int slot, const char *old,
                        const struct redis_marker_view *v, long long now_ms)
{
    char detail[REDIS_MARKER_MAX + 32];
    REDIS_COUNT(e, data_losses);
    snprintf(detail, sizeof detail, "marker \"%s\" gone", old);
    say(e, REDIS_Q_LOSS, slot, v, now_ms, detail);
    if (e->env.event)
        e->env.event(e->env.ud, CERB_EV_LOST, NULL, NULL);
}

/* Run the history script on the marker at key for the server's replid: *v
 * is the marker as it is now, *a what the script said (a->m is not kept);
 * *missing when there is none. */
static cerb_status history_at(cerb_engine *e, struct redis_conn *c, const char *key, size_t klen,
                              const char *replid, struct redis_marker_view *v,
                              struct marker_answer *a, bool *missing)
{
    char qlen[24];
    redisReply *r = NULL;
    size_t got = 0;
    cerb_outcome oc;
    snprintf(qlen, sizeof qlen, "%lld", (long long)atomic_load(&e->quarantine_ms));
    const char *argv[6] = {"EVAL", lua_history, "1", key, replid, qlen};
    size_t argl[6] = {4, sizeof lua_history - 1, 1, klen, strlen(replid), strlen(qlen)};
    cerb_status st = cerb__redis_append(c, 6, argv, argl);
    *missing = false;
    if (st == CERB_OK)
        st = cerb__redis_exchange(e, c, "marker history", &r, &got, &oc);
    if (st != CERB_OK)
        return st;
    if (r->type == REDIS_REPLY_NIL) {
        *missing = true;
    } else if (!parse_answer(r, a) || !cerb__redis_marker_parse(a->m, v, NULL, 0)) {
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        st = cerb__redis_fail(e->where, "marker history", &f, NULL);
    }
    a->m = NULL;
    freeReplyObject(r);
    return st;
}

/* The quarantine a history check raised (a->changed), said. */
static void say_history(cerb_engine *e, int slot, const struct redis_marker_view *v,
                        const struct marker_answer *a, const char *replid)
{
    char detail[160];
    if (!a->changed)
        return;
    snprintf(detail, sizeof detail, "replication id %s, the marker recorded %s", replid,
             a->before[0] ? a->before : "none");
    say(e, a->before[0] ? REDIS_Q_HISTORY : REDIS_Q_NO_REPLID, slot, v, a->now_ms, detail);
}

cerb_status cerb__redis_marker_for(cerb_engine *e, struct redis_conn *c,
                                   const struct redis_keys *ks, struct redis_marker_view *v)
{
    if (!e->cl || !ks || !ks->mk) {
        cerb__redis_marker_get(e, v);
        return CERB_OK;
    }
    struct redis_cluster *cl = e->cl;
    char node_rid[sizeof e->replid_seen], rec[sizeof e->replid_seen];
    cerb__mutex_lock(&e->marker_mu);
    memcpy(node_rid, e->replid_seen, sizeof node_rid);
    cerb__mutex_unlock(&e->marker_mu);
    cerb__mutex_lock(&cl->mk_mu);
    struct redis_slot_marker *sm = cl->mk[ks->slot];
    if (sm && strcmp(sm->replid, node_rid) == 0) {
        *v = sm->v;
        cerb__mutex_unlock(&cl->mk_mu);
        return CERB_OK;
    }
    cerb__mutex_unlock(&cl->mk_mu);

    /* First use of the slot, or its node's history is not the one the
     * slot was checked against (a failover, a restart, or the slot moved
     * to another master): read (or make) the marker, and raise its
     * quarantine when the history it records is not the node's. */
    struct redis_marker_view nv;
    bool made = false, raised = false;
    long long now = 0;
    cerb_status st = read_marker_at(e, c, ks->mk, ks->mk_len, &nv, rec, sizeof rec, &made, &now);
    if (st == CERB_OK && node_rid[0] && strcmp(rec, node_rid) != 0) {
        bool missing;
        struct marker_answer a;
        st = history_at(e, c, ks->mk, ks->mk_len, node_rid, &nv, &a, &missing);
        if (st == CERB_OK && missing)
            st = cerb__error_set(CERB_EIO, "redis %s: slot %d: its marker went while it was "
                                 "read", e->where, ks->slot);
        /* A failover, a restart, or the slot moved to another master. */
        if (st == CERB_OK && a.changed) {
            raised = true;
            say_history(e, ks->slot, &nv, &a, node_rid);
        }
    }
    if (st != CERB_OK)
        return st;
    bool fire = false;
    char old[REDIS_MARKER_MAX] = "";
    cerb__mutex_lock(&cl->mk_mu);
    sm = cl->mk[ks->slot];
    if (!sm)
        sm = cl->mk[ks->slot] = cerb__calloc(1, sizeof *sm);
    if (!sm) {
        cerb__mutex_unlock(&cl->mk_mu);
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a slot marker");
    }
    if (sm->v.value[0] && strcmp(sm->v.value, nv.value) != 0) {
        memcpy(old, sm->v.value, sizeof old);
        fire = true;
    }
    sm->v = nv;
    memcpy(sm->replid, node_rid, sizeof sm->replid);
    *v = nv;
    cerb__mutex_unlock(&cl->mk_mu);
    if (fire)
        report_loss(e, ks->slot, old, &nv, now);
    else if (!raised)
        say(e, made ? REDIS_Q_MISSING : REDIS_Q_FOUND, ks->slot, &nv, now, NULL);
    return CERB_OK;
}

/* Cluster: cerb__redis_marker_lost for the slot of ks. */
static cerb_status slot_marker_lost(cerb_engine *e, struct redis_conn *c,
                                    const struct redis_keys *ks,
                                    const struct redis_marker_view *sent)
{
    struct redis_cluster *cl = e->cl;
    struct redis_marker_view now;
    struct redis_conn *own = NULL;
    char node_rid[sizeof e->replid_seen];
    bool fire = false;

    cerb__mutex_lock(&cl->mk_mu);
    struct redis_slot_marker *sm = cl->mk[ks->slot];
    bool moved = !sm || strcmp(sm->v.value, sent->value) != 0;
    cerb__mutex_unlock(&cl->mk_mu);
    if (moved)
        return CERB_OK;
    if (!c || c->broken) {
        cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &own);
        if (st != CERB_OK)
            return st;
        c = own;
    }
    long long now_ms = 0;
    cerb_status st = read_marker_at(e, c, ks->mk, ks->mk_len, &now, NULL, 0, NULL, &now_ms);
    if (own)
        cerb__redis_put(e, own);
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&e->marker_mu);
    memcpy(node_rid, e->replid_seen, sizeof node_rid);
    cerb__mutex_unlock(&e->marker_mu);
    cerb__mutex_lock(&cl->mk_mu);
    if (strcmp(sm->v.value, sent->value) == 0 && strcmp(now.value, sent->value) != 0) {
        sm->v = now;
        memcpy(sm->replid, node_rid, sizeof sm->replid);
        fire = true;
    }
    cerb__mutex_unlock(&cl->mk_mu);
    if (fire)
        report_loss(e, ks->slot, sent->value, &now, now_ms);
    return CERB_OK;
}

cerb_status cerb__redis_marker_lost(cerb_engine *e, struct redis_conn *c,
                                    const struct redis_keys *ks,
                                    const struct redis_marker_view *sent)
{
    struct redis_marker_view now;
    struct redis_conn *own = NULL;
    cerb_status st;
    bool fire = false;

    if (e->cl && ks && ks->mk)
        return slot_marker_lost(e, c, ks, sent);

    cerb__mutex_lock(&e->marker_mu);
    bool moved = strcmp(e->marker, sent->value) != 0;
    cerb__mutex_unlock(&e->marker_mu);
    if (moved)
        return CERB_OK; /* another operation of ours noticed first */
    if (!c || c->broken) {
        st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &own);
        if (st != CERB_OK)
            return st;
        c = own;
    }
    long long now_ms = 0;
    st = read_marker(e, c, &now, NULL, &now_ms);
    if (own)
        cerb__redis_put(e, own);
    if (st != CERB_OK)
        return st;
    cerb__mutex_lock(&e->marker_mu);
    if (strcmp(e->marker, sent->value) == 0 && strcmp(now.value, sent->value) != 0) {
        memcpy(e->marker, now.value, sizeof e->marker);
        memcpy(e->marker_qend, now.qend, sizeof e->marker_qend);
        fire = true;
    }
    cerb__mutex_unlock(&e->marker_mu);
    if (fire)
        report_loss(e, -1, sent->value, &now, now_ms);
    return CERB_OK;
}

cerb_status cerb__redis_marker_history(cerb_engine *e, struct redis_conn *c, const char *replid)
{
    if (!replid[0] || strlen(replid) >= sizeof e->replid_seen)
        return CERB_OK;
    if (e->cl) {
        /* Cluster: the node's history only; each slot is checked against it
         * on its next use (cerb__redis_marker_for). */
        cerb__mutex_lock(&e->marker_mu);
        memcpy(e->replid_seen, replid, strlen(replid) + 1);
        cerb__mutex_unlock(&e->marker_mu);
        return CERB_OK;
    }
    cerb__mutex_lock(&e->marker_mu);
    bool seen = strcmp(e->replid_seen, replid) == 0;
    cerb__mutex_unlock(&e->marker_mu);
    if (seen)
        return CERB_OK;

    struct redis_marker_view v;
    struct marker_answer a;
    bool missing;
    cerb_status st = history_at(e, c, e->marker_key, e->marker_key_len, replid, &v, &a, &missing);
    if (st != CERB_OK)
        return st;
    if (missing) {
        /* Missing: a loss, which the next script's "L" handles; the new
         * marker is made with this replid. */
        cerb__mutex_lock(&e->marker_mu);
        memcpy(e->replid_seen, replid, strlen(replid) + 1);
        cerb__mutex_unlock(&e->marker_mu);
        return CERB_OK;
    }
    cerb__mutex_lock(&e->marker_mu);
    bool had = e->replid_seen[0] != '\0';
    bool ours = strcmp(e->marker, v.value) == 0;
    /* Another instance raised it first: this one waits too, and says so. */
    bool raised = ours && strcmp(e->marker_qend, v.qend) != 0;
    memcpy(e->replid_seen, replid, strlen(replid) + 1);
    if (ours)
        memcpy(e->marker_qend, v.qend, sizeof e->marker_qend);
    cerb__mutex_unlock(&e->marker_mu);
    if (a.changed)
        say_history(e, -1, &v, &a, replid);
    else if (raised)
        say(e, REDIS_Q_FOUND, -1, &v, a.now_ms, NULL);
    else if (had)
        CERB_LOG_I("redis %s: server replid now %s", e->where, replid);
    return CERB_OK;
}
