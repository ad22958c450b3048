/*
 * redis_init.c — `cerberus init` for the redis engine (redis_init.h): write
 * the data-loss markers (redis_marker.h) with the server's replication id
 * and no quarantine, on a deployment no client has used, so that the first
 * grant does not wait a lease.
 *
 * Why it must refuse. A server restarted without its data looks new: no
 * marker. A client that finds it so quarantines it for a lease, because
 * holders from before the loss may not know yet. Writing the marker by
 * hand ends that protection, so init looks for every sign of earlier use it
 * can see cheaply and refuses (writing nothing) unless forced:
 *   - a marker that records another replication id, or none (it may have
 *     come back with a snapshot), or that is malformed;
 *   - a quarantine in force (a client found the marker missing);
 *   - no marker, but the server evicted keys or ran FLUSHALL/FLUSHDB since
 *     it started (INFO stats, INFO commandstats), or holds Cerberus keys
 *     (any key with the byte 0x1f: fence counters, queues, wake lists,
 *     guard records) in a slot whose marker is missing, looked for with
 *     SCAN for at most REDIS_INIT_SCAN_OPS operation timeouts (not done
 *     within them: refused, it could not be checked).
 * A restart without data that nothing else betrays (no key left, a new
 * process with fresh counters) cannot be told from a new server: that is
 * the documented danger of the command, and why it is an operator's.
 *
 * Algorithm, per master (single: the server; sentinel: the master the
 * sentinels name; cluster: each master serving slots, its markers
 * "{tag}<prefix>\x1fcerberus" for each of its slots):
 *   1. one pipelined round trip: INFO replication, stats and commandstats,
 *      DBSIZE, TIME, SCRIPT LOAD of the write script, and GET of every
 *      marker; each marker is judged: missing, prepared (this history, no
 *      quarantine in force), or a sign of earlier use;
 *   2. where markers are missing: the other signs above;
 * then, when no master showed a sign (or with --force), for every master:
 *   3. one pipelined round trip: the write script for each marker that is
 *      not prepared. It decides again atomically on the server, so a client
 *      that made a marker in between is not overwritten (counted as
 *      refused), and with --force it keeps a marker's id: clients that know
 *      it go on, and the quarantine they wait for ends at once;
 *   4. WAIT for the master's connected replicas (half an operation
 *      timeout), so a failover right after init does not lose the markers.
 * So a refusal writes nothing anywhere, and a store that is already
 * prepared gets no write at all (init twice is harmless).
 */
#include "internal_posix.h"

#include "redis_init.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "config.h"
#include "error.h"
#include "log.h"
#include "redis_cluster.h"
#include "redis_conn.h"
#include "redis_marker.h"
#include "redis_scripts.h"
#include "redis_sentinel.h"

extern const struct cerb_engine_ops cerb__redis_engine_ops;

/* KEYS M, ARGV id replid force: the marker made ("new"), found prepared
 * ("ok"), found otherwise ("used"), or, with force "1", rewritten with no
 * quarantine and this replid, keeping its id when it has one ("forced"). */
static const char lua_init[] =
    "local m = redis.call('GET', KEYS[1])\n"
    "local tail = ' 0'\n"
    "if ARGV[2] ~= '' then tail = tail .. ' ' .. ARGV[2] end\n"
    "if not m then\n"
    "  redis.call('SET', KEYS[1], ARGV[1] .. tail)\n"
    "  return 'new'\n"
    "end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local id, q, r = string.match(m, '^(%S+) (%d+) ?(%x*)$')\n"
    "if id and r == ARGV[2] and tonumber(q) <= now then return 'ok' end\n"
    "if ARGV[3] ~= '1' then return 'used' end\n"
    "redis.call('SET', KEYS[1], (id or ARGV[1]) .. tail)\n"
    "return 'forced'\n";

/* What a marker is, as read in step 1. */
enum mk_state { MK_MISSING, MK_PREPARED, MK_USED };

/* Requests of step 1 before the GETs. */
enum { RQ_REPL, RQ_STATS, RQ_CMDS, RQ_DBSIZE, RQ_TIME, RQ_LOAD, RQ_FIXED };

struct master {
    cerb_engine *e;          /* the instance whose connection c is */
    struct redis_conn *c;
    bool pooled;             /* c is e's pool connection (cluster) */
    char where[300];
    int *slots;              /* cluster: the slots it serves, ascending */
    size_t n;                /* its markers: slots, or 1 */
    unsigned char *st;       /* per marker: enum mk_state */
    char replid[48];
    long long replicas, evicted, flushes, dbsize;
    long long now_ms;        /* server time at step 1 */
    char sha[41];
    size_t missing, prepared, used;
    char why[512];           /* the first sign of earlier use seen */
    size_t made, already, forced, late;
    long long acked;
};

struct job {
    const struct cerb_config *cfg;
    const struct cerb_redis_config *rc;
    bool force;
    cerb_engine *top;        /* cluster: the routing instance */
    cerb_engine *bare;       /* single, sentinel: an instance to connect with */
    struct master *m;
    size_t nm;
    char where[300];
};

/* ---- INFO answers ---- */

/* The value of "key:" in an INFO answer, into out; false when absent. */
static bool info_field(const redisReply *r, const char *key, char *out, size_t len)
{
    size_t kl = strlen(key);
    if (!r || r->type != REDIS_REPLY_STRING)
        return false;
    const char *s = r->str, *end = r->str + r->len;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        if (le > s && le[-1] == '\r')
            le--;
        size_t n = (size_t)(le - s);
        if (n > kl && memcmp(s, key, kl) == 0 && s[kl] == ':' && n - kl - 1 < len) {
            memcpy(out, s + kl + 1, n - kl - 1);
            out[n - kl - 1] = '\0';
            return true;
        }
        s = nl ? nl + 1 : end;
    }
    return false;
}

static long long info_num(const redisReply *r, const char *key)
{
    char v[64];
    return info_field(r, key, v, sizeof v) ? strtoll(v, NULL, 10) : 0;
}

/* "calls=N,..." of a cmdstat_ line. */
static long long info_calls(const redisReply *r, const char *cmd)
{
    char v[256];
    if (!info_field(r, cmd, v, sizeof v) || strncmp(v, "calls=", 6) != 0)
        return 0;
    return strtoll(v + 6, NULL, 10);
}

/* ---- markers ---- */

static size_t marker_key(const struct job *j, const struct master *m, size_t i, char *buf,
                         size_t len)
{
    long tag = -1;
    if (m->slots)
        tag = (long)j->top->cl->tag[m->slots[i]];
    return cerb__redis_marker_key(buf, len, j->rc->prefix, tag);
}

/* " (slot N)" in cluster mode, "" otherwise. */
static const char *slot_text(const struct master *m, size_t i, char *buf, size_t len)
{
    if (!m->slots)
        return "";
    snprintf(buf, len, " (slot %d)", m->slots[i]);
    return buf;
}

/* Note a sign of earlier use on marker i (the first one's text is kept). */
static void mark_used(struct master *m, size_t i, const char *fmt, ...) CERB_PRINTF(3, 4);
static void mark_used(struct master *m, size_t i, const char *fmt, ...)
{
    if (m->st[i] == MK_MISSING)
        m->missing--;
    else if (m->st[i] == MK_PREPARED)
        m->prepared--;
    else
        return;
    m->st[i] = MK_USED;
    m->used++;
    if (m->why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
}

/* Judge the marker GET answered with r (step 1). */
static void judge(struct master *m, size_t i, const redisReply *r)
{
    char sl[32];
    const char *s = slot_text(m, i, sl, sizeof sl);
    struct redis_marker_view v;
    char rec[64];

    if (r->type == REDIS_REPLY_NIL) {
        m->st[i] = MK_MISSING;
        m->missing++;
        return;
    }
    m->st[i] = MK_PREPARED;
    m->prepared++;
    if (!cerb__redis_marker_parse(r, &v, rec, sizeof rec)) {
        mark_used(m, i, "%s: its marker%s is not one Cerberus writes", m->where, s);
    } else if (strcmp(rec, m->replid) != 0) {
        if (!rec[0])
            mark_used(m, i, "%s: its marker%s records no replication id (written by hand or "
                      "by an older version), so it may have come back with a snapshot",
                      m->where, s);
        else
            mark_used(m, i, "%s: its marker%s records replication id %s, the server's is %s: "
                      "it restarted or failed over since", m->where, s, rec,
                      m->replid[0] ? m->replid : "unknown");
    } else if (strtoll(v.qend, NULL, 10) > m->now_ms) {
        long long left = strtoll(v.qend, NULL, 10) - m->now_ms;
        mark_used(m, i, "%s: a quarantine is in force%s until server time %s ms (%lld.%01lld s "
                  "from now): a client found the marker missing or the history changed",
                  m->where, s, v.qend, left / 1000, left % 1000 / 100);
    }
}

/* Is r a cluster redirect (the slot is not served here now)? */
static bool is_redirect(const redisReply *r)
{
    static const char *const kinds[] = {"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"};
    if (r->type != REDIS_REPLY_ERROR)
        return false;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (strncmp(r->str, kinds[k], strlen(kinds[k])) == 0)
            return true;
    return false;
}

static void free_replies(redisReply **r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i])
            freeReplyObject(r[i]);
}

static cerb_status bad_reply(struct master *m, const char *what, const redisReply *r)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(m->where, what, &f, NULL);
}

/* Step 1: what the master is and what its markers are. */
static cerb_status read_master(struct job *j, struct master *m)
{
    size_t nreq = RQ_FIXED + m->n;
    redisReply **r = cerb__calloc(nreq, sizeof *r);
    size_t got = 0;
    cerb_status st = r ? CERB_OK : cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    static const char *const fixed[RQ_FIXED][3] = {
        {"INFO", "replication", NULL}, {"INFO", "stats", NULL}, {"INFO", "commandstats", NULL},
        {"DBSIZE", NULL, NULL},        {"TIME", NULL, NULL},    {"SCRIPT", "LOAD", lua_init}};

    for (int k = 0; st == CERB_OK && k < RQ_FIXED; k++) {
        const char *argv[3];
        size_t argl[3];
        int argc = 0;
        while (argc < 3 && fixed[k][argc]) {
            argv[argc] = fixed[k][argc];
            argl[argc] = strlen(argv[argc]);
            argc++;
        }
        st = cerb__redis_append(m->c, argc, argv, argl);
    }
    for (size_t i = 0; st == CERB_OK && i < m->n; i++) {
        char key[1100];
        size_t kl = marker_key(j, m, i, key, sizeof key);
        if (kl == 0) {
            st = cerb__error_set(CERB_ECONFIG, "redis: redis.prefix is too long");
            break;
        }
        const char *argv[2] = {"GET", key};
        size_t argl[2] = {3, kl};
        st = cerb__redis_append(m->c, 2, argv, argl);
    }
    if (st == CERB_OK)
        st = cerb__redis_exchange(m->e, m->c, "init: read the markers", r, &got, NULL);
    else
        m->c->broken = true; /* requests appended, never to be sent */
    if (st != CERB_OK)
        goto out;
    /* INFO may be renamed away or denied: then those checks are not made,
     * as the engine itself does without a replid. */
    if (!info_field(r[RQ_REPL], "master_replid", m->replid, sizeof m->replid))
        m->replid[0] = '\0';
    m->replicas = info_num(r[RQ_REPL], "connected_slaves");
    m->evicted = info_num(r[RQ_STATS], "evicted_keys");
    m->flushes = info_calls(r[RQ_CMDS], "cmdstat_flushall") +
                 info_calls(r[RQ_CMDS], "cmdstat_flushdb");
    if (r[RQ_DBSIZE]->type != REDIS_REPLY_INTEGER) {
        st = bad_reply(m, "DBSIZE", r[RQ_DBSIZE]);
        goto out;
    }
    m->dbsize = r[RQ_DBSIZE]->integer;
    const redisReply *t = r[RQ_TIME];
    if (t->type != REDIS_REPLY_ARRAY || t->elements != 2 ||
        t->element[0]->type != REDIS_REPLY_STRING || t->element[1]->type != REDIS_REPLY_STRING) {
        st = bad_reply(m, "TIME", t);
        goto out;
    }
    m->now_ms = strtoll(t->element[0]->str, NULL, 10) * 1000 +
                strtoll(t->element[1]->str, NULL, 10) / 1000;
    if (r[RQ_LOAD]->type != REDIS_REPLY_STRING || r[RQ_LOAD]->len != 40) {
        st = bad_reply(m, "SCRIPT LOAD", r[RQ_LOAD]);
        goto out;
    }
    memcpy(m->sha, r[RQ_LOAD]->str, 41);
    for (size_t i = 0; i < m->n; i++) {
        const redisReply *g = r[RQ_FIXED + i];
        char sl[32];
        if (is_redirect(g)) {
            st = cerb__error_set(CERB_EIO, "redis %s: %s%s: the slot is moving; run init again "
                                 "once it has settled", m->where, g->str,
                                 slot_text(m, i, sl, sizeof sl));
            goto out;
        }
        if (g->type == REDIS_REPLY_ERROR) /* WRONGTYPE: something else is there */
            mark_used(m, i, "%s: its marker key%s holds something else (%s)", m->where,
                      slot_text(m, i, sl, sizeof sl), g->str);
        else
            judge(m, i, g);
    }
out:
    if (r)
        free_replies(r, got);
    cerb__free(r);
    return st;
}

/* The index of slot s among m's slots, or -1. */
static long slot_index(const struct master *m, int s)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->slots[mid] == s)
            return (long)mid;
        if (m->slots[mid] < s)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* A Cerberus key k was found: a sign when its slot's marker is missing. */
static void key_found(struct master *m, const char *k, size_t kl)
{
    long i = m->slots ? slot_index(m, (int)cerb__redis_key_slot(k, kl)) : 0;
    if (i < 0 || m->st[i] != MK_MISSING)
        return;
    char shown[160];
    size_t o = 0;
    for (size_t p = 0; p < kl && o + 5 < sizeof shown; p++) {
        unsigned char ch = (unsigned char)k[p];
        o += (size_t)snprintf(shown + o, sizeof shown - o, ch < 0x20 || ch >= 0x7f ? "\\x%02x"
                                                                                  : "%c", ch);
    }
    mark_used(m, (size_t)i, "%s: no marker, but Cerberus keys (\"%s\"): the marker was evicted, "
              "deleted or flushed alone", m->where, shown);
}

/* Step 2: where markers are missing, the other signs of earlier use. */
static cerb_status look_for_use(struct job *j, struct master *m)
{
    if (m->missing == 0)
        return CERB_OK;
    if (m->evicted > 0 || m->flushes > 0) {
        for (size_t i = 0; i < m->n; i++)
            if (m->st[i] == MK_MISSING)
                mark_used(m, i, m->evicted > 0
                                    ? "%s: no marker, and the server evicted %lld keys since it "
                                      "started: the marker may have been one of them"
                                    : "%s: no marker, and FLUSHALL or FLUSHDB ran %lld times "
                                      "since the server started",
                          m->where, m->evicted > 0 ? m->evicted : m->flushes);
        return CERB_OK;
    }
    /* Every key is one of the markers read: nothing else to look at. */
    if (m->dbsize <= (long long)(m->prepared + m->used))
        return CERB_OK;
    int64_t budget = REDIS_INIT_SCAN_OPS * j->rc->op_timeout_ms;
    int64_t dl = cerb__deadline_in(budget);
    char cursor[32] = "0";
    do {
        if (cerb__ms_left(dl) <= 0) {
            for (size_t i = 0; i < m->n; i++)
                if (m->st[i] == MK_MISSING)
                    mark_used(m, i, "%s: no marker, and its %lld keys could not all be looked "
                              "at for Cerberus' within %lld ms", m->where, m->dbsize,
                              (long long)budget);
            return CERB_OK;
        }
        const char *argv[6] = {"SCAN", cursor, "MATCH", "*" REDIS_SEP "*", "COUNT", "1000"};
        size_t argl[6] = {4, strlen(cursor), 5, 3, 5, 4};
        redisReply *r = NULL;
        size_t got = 0;
        cerb_status st = cerb__redis_append(m->c, 6, argv, argl);
        if (st == CERB_OK)
            st = cerb__redis_exchange(m->e, m->c, "init: SCAN", &r, &got, NULL);
        if (st != CERB_OK)
            return st;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof cursor ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            st = bad_reply(m, "SCAN", r);
            freeReplyObject(r);
            return st;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
        const redisReply *keys = r->element[1];
        for (size_t k = 0; k < keys->elements; k++)
            if (keys->element[k]->type == REDIS_REPLY_STRING)
                key_found(m, keys->element[k]->str, keys->element[k]->len);
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0 && m->missing > 0);
    return CERB_OK;
}

/* Step 3 and 4: write the markers that are not prepared (with force, the
 * used ones too). */
static cerb_status write_master(struct job *j, struct master *m, const char *id)
{
    size_t want = m->missing + (j->force ? m->used : 0), got = 0;
    if (want == 0)
        return CERB_OK;
    redisReply **r = cerb__calloc(want, sizeof *r);
    if (!r)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    cerb_status st = CERB_OK;
    for (size_t i = 0; st == CERB_OK && i < m->n; i++) {
        if (m->st[i] == MK_PREPARED || (m->st[i] == MK_USED && !j->force))
            continue;
        char key[1100];
        size_t kl = marker_key(j, m, i, key, sizeof key);
        const char *argv[7] = {"EVALSHA", m->sha, "1", key, id, m->replid, j->force ? "1" : "0"};
        size_t argl[7] = {7, 40, 1, kl, strlen(id), strlen(m->replid), 1};
        st = cerb__redis_append(m->c, 7, argv, argl);
    }
    if (st == CERB_OK)
        st = cerb__redis_exchange(m->e, m->c, "init: write the markers", r, &got, NULL);
    else
        m->c->broken = true;
    for (size_t k = 0; st == CERB_OK && k < got; k++) {
        const redisReply *a = r[k];
        if (a->type != REDIS_REPLY_STRING && a->type != REDIS_REPLY_STATUS) {
            st = is_redirect(a) ? cerb__error_set(CERB_EIO, "redis %s: %s: a slot moved while "
                                                  "init wrote; run it again", m->where, a->str)
                                : bad_reply(m, "init script", a);
        } else if (strcmp(a->str, "new") == 0) {
            m->made++;
        } else if (strcmp(a->str, "ok") == 0) {
            m->already++;
        } else if (strcmp(a->str, "forced") == 0) {
            m->forced++;
        } else {
            m->late++;
        }
    }
    free_replies(r, got);
    cerb__free(r);
    if (st != CERB_OK || m->made + m->forced == 0 || m->replicas <= 0)
        return st;
    /* Best effort: a master that fails over before its replicas have the
     * markers loses them, and the first client quarantines as if init had
     * not run (safe, only slow). */
    char nrep[24], wms[24];
    snprintf(nrep, sizeof nrep, "%lld", m->replicas);
    snprintf(wms, sizeof wms, "%lld", (long long)(j->rc->op_timeout_ms / 2 + 1));
    const char *argv[3] = {"WAIT", nrep, wms};
    size_t argl[3] = {4, strlen(nrep), strlen(wms)};
    redisReply *w = NULL;
    st = cerb__redis_append(m->c, 3, argv, argl);
    if (st == CERB_OK)
        st = cerb__redis_exchange(m->e, m->c, "init: WAIT", &w, &got, NULL);
    if (st == CERB_OK && w->type == REDIS_REPLY_INTEGER)
        m->acked = w->integer;
    if (w)
        freeReplyObject(w);
    return st;
}

/* ---- the deployment: which masters, connected ---- */

static cerb_status master_alloc(struct master *m, size_t n)
{
    m->n = n;
    m->st = cerb__calloc(n, 1);
    return m->st ? CERB_OK : cerb__error_set(CERB_ENOMEM, "redis: out of memory");
}

/* Single or sentinel: a bare instance (no marker key, so connecting runs
 * no history script: nothing is written before the verdict). */
static cerb_status setup_one(struct job *j)
{
    cerb_engine *e = j->bare = cerb__calloc(1, sizeof *e);
    j->m = cerb__calloc(1, sizeof *j->m);
    if (!e || !j->m)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    e->cfg = j->cfg;
    e->rc = j->rc;
    e->env.cfg = j->cfg;
    if (j->rc->mode == CERB_REDIS_SENTINEL)
        snprintf(e->where, sizeof e->where, "master \"%s\" (sentinels)", j->rc->master_name);
    else
        snprintf(e->where, sizeof e->where, "%s:%d", j->rc->host, j->rc->port);
    snprintf(j->where, sizeof j->where, "%s", e->where);
    cerb__redis_addr_init(e);
    j->nm = 1;
    struct master *m = &j->m[0];
    m->e = e;
    cerb_status st = master_alloc(m, 1);
    if (st == CERB_OK)
        st = cerb__redis_conn_open(e, j->rc->connect_timeout_ms, j->rc->op_timeout_ms, &m->c);
    if (st != CERB_OK)
        return st;
    if (j->rc->mode == CERB_REDIS_SENTINEL) {
        cerb__mutex_lock(&e->addr_mu);
        snprintf(m->where, sizeof m->where, "master \"%s\" at %s:%d", j->rc->master_name,
                 e->addr_host, e->addr_port);
        cerb__mutex_unlock(&e->addr_mu);
        snprintf(j->where, sizeof j->where, "%s", m->where);
    } else {
        snprintf(m->where, sizeof m->where, "%s", e->where);
    }
    return CERB_OK;
}

/* Cluster: the engine's own routing instance reads the slot map (opening
 * it makes no marker: slots are marked on first use), then one master per
 * node that serves slots, on its pool connection. */
static cerb_status setup_cluster(struct job *j)
{
    cerb_engine_env env = {.cfg = j->cfg};
    cerb_status st = cerb__redis_engine_ops.open(&env, &j->top);
    if (st != CERB_OK)
        return st;
    struct redis_cluster *cl = j->top->cl;
    size_t count[REDIS_CLUSTER_MAX_NODES] = {0};
    int16_t owner[REDIS_SLOTS];
    cerb__mutex_lock(&cl->mu);
    int nn = cl->n_nodes;
    memcpy(owner, cl->slot_node, sizeof owner);
    cerb_engine *node_e[REDIS_CLUSTER_MAX_NODES];
    for (int i = 0; i < nn; i++)
        node_e[i] = cl->nodes[i]->e;
    cerb__mutex_unlock(&cl->mu);
    for (int s = 0; s < REDIS_SLOTS; s++) {
        if (owner[s] < 0)
            return cerb__error_set(CERB_EIO, "redis %s: no master serves slot %d: init needs "
                                   "the whole cluster up", j->top->where, s);
        count[owner[s]]++;
    }
    j->m = cerb__calloc((size_t)nn, sizeof *j->m);
    if (!j->m)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    size_t idx[REDIS_CLUSTER_MAX_NODES] = {0};
    int map[REDIS_CLUSTER_MAX_NODES];
    for (int i = 0; i < nn; i++) {
        map[i] = -1;
        if (count[i] == 0)
            continue;
        struct master *m = &j->m[j->nm];
        map[i] = (int)j->nm++;
        m->e = node_e[i];
        snprintf(m->where, sizeof m->where, "%s", m->e->where);
        m->slots = cerb__calloc(count[i], sizeof *m->slots);
        if (!m->slots || master_alloc(m, count[i]) != CERB_OK)
            return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    }
    for (int s = 0; s < REDIS_SLOTS; s++) {
        struct master *m = &j->m[map[owner[s]]];
        m->slots[idx[owner[s]]++] = s;
    }
    snprintf(j->where, sizeof j->where, "%s", j->top->where);
    for (size_t k = 0; k < j->nm; k++) {
        struct master *m = &j->m[k];
        st = cerb__redis_get(m->e, cerb__deadline_in(j->rc->connect_timeout_ms), &m->c);
        if (st != CERB_OK)
            return st;
        m->pooled = true;
    }
    return CERB_OK;
}

static void teardown(struct job *j)
{
    for (size_t k = 0; j->m && k < j->nm; k++) {
        struct master *m = &j->m[k];
        if (m->c && m->pooled)
            cerb__redis_put(m->e, m->c);
        else
            cerb__redis_conn_free(m->c);
        cerb__free(m->slots);
        cerb__free(m->st);
    }
    cerb__free(j->m);
    if (j->top)
        cerb__redis_engine_ops.close(j->top);
    if (j->bare) {
        cerb__redis_addr_destroy(j->bare);
        cerb__free(j->bare);
    }
}

/* ---- the verdict ---- */

static const char hint[] =
    "the server may have lost its data, and preparing it would end the quarantine that "
    "protects holders from before the loss; if it is new, or no client of it from before is "
    "alive, run `cerberus init --force`";

static cerb_status init_redis(const struct cerb_config *cfg, unsigned flags,
                              cerb_store_result *result, char *line, size_t len)
{
    struct job j = {.cfg = cfg, .rc = &cfg->redis, .force = (flags & CERB_STORE_INIT_FORCE) != 0};
    size_t total = 0, used = 0, missing = 0, made = 0, already = 0, forced = 0, late = 0;
    long long acked = 0, replicas = 0;
    const char *why = "";
    char id[32];
    cerb_status st;

    *result = CERB_STORE_FAILED;
    st = cfg->redis.mode == CERB_REDIS_CLUSTER ? setup_cluster(&j) : setup_one(&j);
    for (size_t k = 0; st == CERB_OK && k < j.nm; k++)
        st = read_master(&j, &j.m[k]);
    for (size_t k = 0; st == CERB_OK && !j.force && k < j.nm; k++)
        st = look_for_use(&j, &j.m[k]);
    if (st != CERB_OK) {
        snprintf(line, len, "%s: %s", j.where[0] ? j.where : "?", cerb_last_error());
        teardown(&j);
        return st;
    }
    for (size_t k = 0; k < j.nm; k++) {
        total += j.m[k].n;
        used += j.m[k].used;
        missing += j.m[k].missing;
        if (!why[0] && j.m[k].why[0])
            why = j.m[k].why;
    }
    bool cluster = j.top != NULL;
    char count[96] = "";
    if (cluster)
        snprintf(count, sizeof count, " (%zu slot markers on %zu masters)", total, j.nm);
    if (used > 0 && !j.force) {
        *result = CERB_STORE_REFUSED;
        if (cluster)
            snprintf(line, len, "%s: refused, nothing written: %zu of %zu slots show earlier use, "
                     "e.g. %s; %s", j.where, used, total, why, hint);
        else
            snprintf(line, len, "%s: refused, nothing written: %s; %s", j.where,
                     strstr(why, ": ") ? strstr(why, ": ") + 2 : why, hint);
        teardown(&j);
        return CERB_BUSY;
    }
    if (used == 0 && missing == 0) {
        *result = CERB_STORE_ALREADY;
        snprintf(line, len, "%s: already prepared%s: %s with the server's replication id, no "
                 "quarantine in force; nothing written", j.where, count,
                 cluster ? "every slot has its marker" : "its marker is there");
        teardown(&j);
        return CERB_OK;
    }
    snprintf(id, sizeof id, "init-%016llx", (unsigned long long)cerb__rand_below(UINT64_MAX));
    for (size_t k = 0; st == CERB_OK && k < j.nm; k++) {
        st = write_master(&j, &j.m[k], id);
        made += j.m[k].made;
        already += j.m[k].already;
        forced += j.m[k].forced;
        late += j.m[k].late;
        acked += j.m[k].acked;
        replicas += j.m[k].replicas;
    }
    char rep[96] = "";
    if (replicas > 0)
        snprintf(rep, sizeof rep, "; %lld of %lld replicas confirmed", acked, replicas);
    if (st != CERB_OK) {
        snprintf(line, len, "%s: %s (%zu markers written before it: run init again)", j.where,
                 cerb_last_error(), made + forced);
    } else if (late > 0) {
        *result = CERB_STORE_REFUSED;
        st = CERB_BUSY;
        snprintf(line, len, "%s: refused in part: %zu markers were made by a client meanwhile "
                 "(it quarantines those); %zu written%s", j.where, late, made + forced, rep);
    } else if (!cluster) {
        *result = CERB_STORE_PREPARED;
        const char *was = strstr(why, ": ") ? strstr(why, ": ") + 2 : why;
        snprintf(line, len, "%s: prepared: marker %s, replication id %s, no quarantine%s%s%s",
                 j.where, forced ? "rewritten with --force (its id kept)" : "written",
                 j.m[0].replid[0] ? j.m[0].replid : "unknown (INFO denied)",
                 forced ? " (it showed: " : "", forced ? was : "", forced ? ")" : "");
        if (rep[0])
            snprintf(line + strlen(line), len - strlen(line), "%s", rep);
    } else {
        char more[96] = "";
        size_t had = total - made - forced;
        *result = CERB_STORE_PREPARED;
        if (forced)
            snprintf(more, sizeof more, ", %zu rewritten with --force", forced);
        if (had)
            snprintf(more + strlen(more), sizeof more - strlen(more), ", %zu already prepared",
                     had);
        snprintf(line, len, "%s: prepared%s: %zu written%s, no quarantine%s", j.where, count,
                 made, more, rep);
    }
    teardown(&j);
    return st;
}

const struct cerb_store_ops cerb__redis_store_ops = {
    .version = CERB_STORE_OPS_V1,
    .name = "redis",
    .init = init_redis,
};
