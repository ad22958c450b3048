/*
 * redis_init_master.c — one master's part of `cerberus init` (redis_init.h):
 * read what it is and what its markers are (step 1 of redis_init.c), look
 * for the other signs of earlier use where markers are missing (step 2),
 * and write the markers that are not prepared (steps 3 and 4). Each step is
 * one pipelined round trip on the master's connection, whatever the number
 * of markers (16384 spread over the masters of a Cluster), except the SCAN,
 * which goes on for at most REDIS_INIT_SCAN_OPS operation timeouts.
 */
#include "internal_posix.h"

#include "redis_init.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "redis_cluster.h"
#include "redis_marker.h"
#include "redis_scripts.h"

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

/* Requests of step 1 before the GETs. */
enum { RQ_REPL, RQ_STATS, RQ_CMDS, RQ_DBSIZE, RQ_TIME, RQ_LOAD, RQ_FIXED };

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

static size_t marker_key(const struct redis_init_job *j, const struct redis_init_master *m, size_t i, char *buf,
                         size_t len)
{
    long tag = -1;
    if (m->slots)
        tag = (long)j->top->cl->tag[m->slots[i]];
    return cerb__redis_marker_key(buf, len, j->rc->prefix, tag);
}

/* " (slot N)" in cluster mode, "" otherwise. */
static const char *slot_text(const struct redis_init_master *m, size_t i, char *buf, size_t len)
{
    if (!m->slots)
        return "";
    snprintf(buf, len, " (slot %d)", m->slots[i]);
    return buf;
}

/* Note a sign of earlier use on marker i (the first one's text is kept). */
static void mark_used(struct redis_init_master *m, size_t i, const char *fmt, ...) CERB_PRINTF(3, 4);
static void mark_used(struct redis_init_master *m, size_t i, const char *fmt, ...)
{
    if (m->st[i] == REDIS_MK_MISSING)
        m->missing--;
    else if (m->st[i] == REDIS_MK_PREPARED)
        m->prepared--;
    else
        return;
    m->st[i] = REDIS_MK_USED;
    m->used++;
    if (m->why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
}

/* Judge the marker GET answered with r (step 1). */
static void judge(struct redis_init_master *m, size_t i, const redisReply *r)
{
    char sl[32];
    const char *s = slot_text(m, i, sl, sizeof sl);
    struct redis_marker_view v;
    char rec[64];

    if (r->type == REDIS_REPLY_NIL) {
        m->st[i] = REDIS_MK_MISSING;
        m->missing++;
        return;
    }
    m->st[i] = REDIS_MK_PREPARED;
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

static cerb_status bad_reply(struct redis_init_master *m, const char *what, const redisReply *r)
{
    struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
    return cerb__redis_fail(m->where, what, &f, NULL);
}

/* Step 1: what the master is and what its markers are. */
cerb_status cerb__redis_init_read(struct redis_init_job *j, struct redis_init_master *m)
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
static long slot_index(const struct redis_init_master *m, int s)
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
static void key_found(struct redis_init_master *m, const char *k, size_t kl)
{
    long i = m->slots ? slot_index(m, (int)cerb__redis_key_slot(k, kl)) : 0;
    if (i < 0 || m->st[i] != REDIS_MK_MISSING)
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
cerb_status cerb__redis_init_look(struct redis_init_job *j, struct redis_init_master *m)
{
    if (m->missing == 0)
        return CERB_OK;
    if (m->evicted > 0 || m->flushes > 0) {
        for (size_t i = 0; i < m->n; i++)
            if (m->st[i] == REDIS_MK_MISSING)
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
                if (m->st[i] == REDIS_MK_MISSING)
                    mark_used(m, i, "%s: no marker, and its %lld keys could not all be looked "
                              "at for Cerberus' within %lld ms", m->where, m->dbsize,
                              (long long)budget);
            return CERB_OK;
        }
        const char *argv[6] = {"SCAN", cursor, "MATCH", "*" REDIS_SEP "*", "COUNT",
                               REDIS_INIT_SCAN_COUNT};
        size_t argl[6] = {4, strlen(cursor), 5, 3, 5, sizeof REDIS_INIT_SCAN_COUNT - 1};
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
cerb_status cerb__redis_init_write(struct redis_init_job *j, struct redis_init_master *m, const char *id)
{
    size_t want = m->missing + (j->force ? m->used : 0), got = 0;
    if (want == 0)
        return CERB_OK;
    redisReply **r = cerb__calloc(want, sizeof *r);
    if (!r)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory");
    cerb_status st = CERB_OK;
    for (size_t i = 0; st == CERB_OK && i < m->n; i++) {
        if (m->st[i] == REDIS_MK_PREPARED || (m->st[i] == REDIS_MK_USED && !j->force))
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
