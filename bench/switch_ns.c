/*
 * switch_ns.c — namespaces of their own for each round of the switch
 * scenario (scenario_switch.c).
 *
 * Why. A client at epoch >= 2 writes a closure record on every engine of
 * its file (core/closure.c): "open from E" on the active one, "closed from
 * E" on the others. Records are permanent and there is one per store
 * namespace. Every round of the scenario takes a fresh copy of the same
 * file from its epoch to the next, with another engine active: on shared
 * namespaces the second round finds records at its own epoch that say
 * otherwise ("two files share one epoch") and is refused, and so is any
 * later run at that epoch or below. So each round, and each of its two
 * clients, runs in namespaces no one else uses, nested in the file's own so
 * that credentials and ACLs limited to those still reach them:
 *
 *   redis.prefix P        ->  P + "<tag>:"
 *   zk.root      /a/b     ->  /a/<tag>/b   (record /a/<tag>/b.cerberus-closure,
 *                                           under the round's own node, which
 *                                           the cleanup removes whole)
 *   etcd.prefix  P        ->  P + "<tag>/"
 *
 * with <tag> = "cerb-bench-<pid>-<random>-<n>-<side>": n counts the rounds
 * of this process, side is "sw" (the switched client) or "alone". The
 * random part keeps a later process that gets the same pid out of what an
 * interrupted run left. A Redis Cluster keeps no record (the engine keeps
 * the full gate there), so its prefix stays the file's: a new one would
 * have no marker in any slot and quarantine each slot's first grant.
 *
 * The copy's text is the file's, edited: the value of `prefix` (or `root`)
 * in the top-level group of the engine is replaced, or the setting is
 * added at the start of the group, or the group is appended. The lexical
 * rules are those cli/cmd_switch.c follows (strings with escapes, `#`, `//`
 * and block comments, nesting by {} () []); the result is parsed with the
 * library's parser and must say exactly the new namespaces, or the round
 * does not run.
 *
 * A fresh Redis prefix has no data-loss marker (engine_redis/redis_marker.h):
 * the first client would make one with a quarantine of a lease before the
 * first grant, and the measured rounds could include it. bench_ns_prepare
 * writes the marker scripts/servers.sh writes for a server it starts empty,
 * "<id> 0 <master_replid>": no quarantine, and the server's history as of
 * now. bench_ns_remove deletes what the round left in its namespaces once
 * its clients are closed — best effort: a failure is a note, and a run
 * that is interrupted leaves its records (a few small keys or nodes, under
 * names no one else uses).
 */
#include <hiredis/hiredis.h>
#ifdef CERB_WITH_ZK
#include <zookeeper/zookeeper.h>
#endif
#ifdef CERB_WITH_ETCD
#include <jansson.h>
#endif

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "scenarios.h"

/* The rounds this process has started (the bench's main thread runs them
 * one after another). */
static unsigned ns_rounds;

/* ---- the text ---- */

/* Skip blanks and comments in [p, n); the next significant index. */
static size_t lex_skip(const char *t, size_t n, size_t p)
{
    while (p < n) {
        char c = t[p];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v') {
            p++;
        } else if (c == '#' || (c == '/' && p + 1 < n && t[p + 1] == '/')) {
            while (p < n && t[p] != '\n')
                p++;
        } else if (c == '/' && p + 1 < n && t[p + 1] == '*') {
            const char *e = strstr(t + p + 2, "*/");
            p = e && (size_t)(e - t) + 2 <= n ? (size_t)(e - t) + 2 : n;
        } else {
            break;
        }
    }
    return p;
}

/* @p is at an opening quote: the index just past the closing one. */
static size_t lex_string_end(const char *t, size_t n, size_t p)
{
    for (p++; p < n && t[p] != '"'; p++)
        if (t[p] == '\\' && p + 1 < n)
            p++;
    return p < n ? p + 1 : n;
}

/* @p is at an opening bracket: the index just past its closing one. */
static size_t lex_close(const char *t, size_t n, size_t p)
{
    int depth = 0;
    while ((p = lex_skip(t, n, p)) < n) {
        char c = t[p];
        if (c == '"') {
            p = lex_string_end(t, n, p);
        } else if (c == '{' || c == '(' || c == '[') {
            depth++;
            p++;
        } else if (c == '}' || c == ')' || c == ']') {
            p++;
            if (--depth == 0)
                return p;
        } else {
            p++;
        }
    }
    return n;
}

static bool name_start(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '*';
}

static bool name_char(char c)
{
    return name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

struct ns_span {
    size_t start, end; /* the value: literal(s), a bracketed group, a token */
    bool found;
};

/* The value of setting @key among the settings of [p, n) at their own level:
 * what nested groups, lists, strings and comments hold never matches. */
static struct ns_span lex_find(const char *t, size_t n, size_t p, const char *key)
{
    struct ns_span sp = {0, 0, false};
    size_t klen = strlen(key);

    while ((p = lex_skip(t, n, p)) < n) {
        char c = t[p];
        if (c == '"') {
            p = lex_string_end(t, n, p);
        } else if (c == '{' || c == '(' || c == '[') {
            p = lex_close(t, n, p);
        } else if (name_start(c)) {
            size_t s = p;
            while (p < n && name_char(t[p]))
                p++;
            if (p - s != klen || memcmp(t + s, key, klen) != 0)
                continue;
            size_t q = lex_skip(t, n, p);
            if (q >= n || (t[q] != '=' && t[q] != ':'))
                continue;
            q = lex_skip(t, n, q + 1);
            sp.start = sp.end = q;
            if (q < n && t[q] == '"') {
                /* Adjacent literals concatenate: "ap" "p:". */
                while (q < n && t[q] == '"') {
                    sp.end = lex_string_end(t, n, q);
                    q = lex_skip(t, n, sp.end);
                }
            } else if (q < n && t[q] == '{') {
                sp.end = lex_close(t, n, q);
            } else {
                while (q < n && (name_char(t[q]) || t[q] == '+' || t[q] == '.'))
                    q++;
                sp.end = q;
            }
            sp.found = sp.end > sp.start;
            return sp;
        } else {
            p++;
        }
    }
    return sp;
}

/* @s as a libconfig string literal (malloc'd), or NULL. */
static char *quote(const char *s)
{
    char *q = malloc(4 * strlen(s) + 3), *o = q;
    if (!q)
        return NULL;
    *o++ = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            o += sprintf(o, "\\x%02x", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = '\0';
    return q;
}

/* @t (malloc'd, consumed) with @group.@key set to the string @val. Returns
 * the new text (malloc'd), or NULL when out of memory. */
static char *set_string(char *t, const char *group, const char *key, const char *val)
{
    size_t n = strlen(t);
    struct ns_span g = lex_find(t, n, 0, group);
    char *lit = quote(val), *ins = NULL, *out = NULL;
    size_t at = n, cut = n; /* [at, cut) of t is replaced by ins */

    if (g.found && t[g.start] != '{') {
        /* Not a group: left as it is, for the check to report. */
        free(lit);
        return t;
    }
    if (!lit) {
        free(t);
        return NULL;
    }
    size_t room = strlen(group) + strlen(key) + strlen(lit) + 32;
    if (!(ins = malloc(room)))
        goto done;
    if (!g.found) {
        snprintf(ins, room, "\n%s = { %s = %s; };\n", group, key, lit);
    } else {
        struct ns_span k = lex_find(t, g.end - 1, g.start + 1, key);
        if (k.found) {
            at = k.start;
            cut = k.end;
            snprintf(ins, room, "%s", lit);
        } else {
            at = cut = g.start + 1;
            snprintf(ins, room, " %s = %s;", key, lit);
        }
    }
    size_t il = strlen(ins);
    if ((out = malloc(n - (cut - at) + il + 1)) != NULL) {
        memcpy(out, t, at);
        memcpy(out + at, ins, il);
        memcpy(out + at + il, t + cut, n - cut + 1);
    }
done:
    free(ins);
    free(lit);
    free(t);
    return out;
}

/* ---- the namespaces ---- */

static bool listed(const struct cerb_config *cfg, const char *engine)
{
    return cerb__config_engine_index(cfg, engine) >= 0;
}

/* The namespaces of @tag nested in those of @cfg, into @ns. Returns 0, or -1
 * when out of memory. */
static int ns_values(struct bench_ns *ns, const struct cerb_config *cfg)
{
    const char *tag = ns->tag;
    if (listed(cfg, "redis") && cfg->redis.mode != CERB_REDIS_CLUSTER) {
        const char *p = cfg->redis.prefix ? cfg->redis.prefix : "";
        size_t len = strlen(p) + strlen(tag) + 2;
        if (!(ns->redis_prefix = malloc(len)))
            return -1;
        snprintf(ns->redis_prefix, len, "%s%s:", p, tag);
    }
    if (listed(cfg, "zk")) {
        /* zk.root is validated absolute, not "/", no trailing '/'. */
        const char *r = cfg->zk.root, *slash = strrchr(r, '/');
        size_t len = strlen(r) + strlen(tag) + 2;
        if (!(ns->zk_root = malloc(len)) || !(ns->zk_top = malloc(len)))
            return -1;
        snprintf(ns->zk_top, len, "%.*s/%s", (int)(slash - r), r, tag);
        snprintf(ns->zk_root, len, "%s%s", ns->zk_top, slash);
    }
    if (listed(cfg, "etcd")) {
        const char *p = cfg->etcd.prefix ? cfg->etcd.prefix : "";
        size_t len = strlen(p) + strlen(tag) + 2;
        if (!(ns->etcd_prefix = malloc(len)))
            return -1;
        snprintf(ns->etcd_prefix, len, "%s%s/", p, tag);
    }
    return 0;
}

/* Whether @cfg says exactly the namespaces of @ns; else prints which not. */
static bool ns_check(const struct bench_ns *ns, const struct cerb_config *cfg, const char *what)
{
    const struct {
        const char *key, *want, *got;
    } v[] = {
        {"redis.prefix", ns->redis_prefix, cfg->redis.prefix},
        {"zk.root", ns->zk_root, cfg->zk.root},
        {"etcd.prefix", ns->etcd_prefix, cfg->etcd.prefix},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (!v[i].want || (v[i].got && strcmp(v[i].want, v[i].got) == 0))
            continue;
        bench_errorf("switch: cannot give the copy of %s a namespace of its own: %s reads "
                     "\"%s\" after the edit, not \"%s\" (write the engine's settings as one "
                     "top-level group, e.g. redis = { ... };)",
                     what, v[i].key, v[i].got ? v[i].got : "", v[i].want);
        return false;
    }
    return true;
}

unsigned bench_ns_round(void)
{
    return ++ns_rounds;
}

int bench_ns_make(struct bench_ns *ns, const char *text, unsigned round, const char *side,
                  const char *what)
{
    static unsigned salt;
    struct cerb_config *cfg = NULL;

    memset(ns, 0, sizeof *ns);
    /* Drawn once per process: a pid alone may come back after an
     * interrupted run left its records. Without entropy (getrandom fails
     * only on kernels before 3.17), the monotonic clock's nanoseconds. */
    if (!salt && getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt)
        salt = (unsigned)bench_now_ns();
    snprintf(ns->tag, sizeof ns->tag, "cerb-bench-%ld-%08x-%u-%s", (long)getpid(), salt, round,
             side);
    if (cerb__config_from_string(text, &cfg) != CERB_OK) {
        bench_errorf("switch: %s: %s", what, cerb_last_error());
        return -1;
    }
    char *t = strdup(text);
    if (ns_values(ns, cfg) != 0 || !t)
        goto oom;
    cerb__config_free(cfg);
    cfg = NULL;
    if (ns->redis_prefix && !(t = set_string(t, "redis", "prefix", ns->redis_prefix)))
        goto oom;
    if (ns->zk_root && !(t = set_string(t, "zk", "root", ns->zk_root)))
        goto oom;
    if (ns->etcd_prefix && !(t = set_string(t, "etcd", "prefix", ns->etcd_prefix)))
        goto oom;
    if (cerb__config_from_string(t, &ns->cfg) != CERB_OK) {
        bench_errorf("switch: cannot give the copy of %s namespaces of its own: the edited "
                     "text does not parse: %s", what, cerb_last_error());
        free(t);
        bench_ns_free(ns);
        return -1;
    }
    ns->text = t;
    if (!ns_check(ns, ns->cfg, what)) {
        bench_ns_free(ns);
        return -1;
    }
    return 0;

oom:
    bench_errorf("out of memory");
    free(t);
    cerb__config_free(cfg);
    bench_ns_free(ns);
    return -1;
}

void bench_ns_free(struct bench_ns *ns)
{
    free(ns->redis_prefix);
    free(ns->zk_root);
    free(ns->zk_top);
    free(ns->etcd_prefix);
    free(ns->text);
    cerb__config_free(ns->cfg);
    memset(ns, 0, sizeof *ns);
}

/* Whether @engine is one @only names (NULL: every one). */
static bool touches(const char *only, const char *engine)
{
    return !only || strcmp(only, engine) == 0;
}

/* A raw Redis session on the server of @ns's configuration, or NULL
 * (printed, as a failure when @fail, else as a note). */
static void *redis_sess(const struct bench_ns *ns, struct bench_engine *be, bool fail)
{
    char err[BENCH_ERR_MAX];
    memset(be, 0, sizeof *be);
    snprintf(be->name, sizeof be->name, "redis");
    be->cfg = ns->cfg;
    if (bench_redis_addr_init(&be->redis, ns->cfg) != 0) {
        bench_errorf("out of memory");
        return NULL;
    }
    void *s = bench_redis_open(be, err, sizeof err);
    if (!s) {
        if (fail)
            bench_errorf("switch: %s", err);
        else
            fprintf(stderr, "cerberus-bench: note: %s: the keys under \"%s\" are left there\n",
                    err, ns->redis_prefix);
        bench_redis_addr_free(&be->redis);
    }
    return s;
}

int bench_ns_prepare(const struct bench_ns *ns, const char *only)
{
    struct bench_engine be;
    if (!ns->redis_prefix || !touches(only, "redis"))
        return 0;
    void *s = redis_sess(ns, &be, true);
    if (!s)
        return -1;
    redisContext *c = bench_redis_context(s);
    redisReply *r = redisCommand(c, "INFO replication");
    char replid[64] = "";
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "master_replid:") : NULL;
    if (p)
        sscanf(p + strlen("master_replid:"), "%63[0-9a-f]", replid);
    if (r)
        freeReplyObject(r);
    /* As scripts/servers.sh marks a server it starts empty: the prefix is
     * new, nothing can be held under it, so no quarantine (qend 0), and the
     * history the server has now. NX: a marker already there (a round that
     * could not be told apart) is the one its clients know. */
    char key[1024], val[160];
    snprintf(key, sizeof key, "%s\x1f" "cerberus", ns->redis_prefix);
    snprintf(val, sizeof val, "%s 0%s%s", ns->tag, replid[0] ? " " : "", replid);
    r = redisCommand(c, "SET %s %s NX", key, val);
    int rc = r && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_NIL) ? 0 : -1;
    if (rc != 0)
        bench_errorf("switch: redis: cannot write the marker of prefix \"%s\": %s",
                     ns->redis_prefix,
                     r && r->type == REDIS_REPLY_ERROR ? r->str
                                                       : c->errstr[0] ? c->errstr : "no answer");
    if (r)
        freeReplyObject(r);
    bench_redis_close(s);
    bench_redis_addr_free(&be.redis);
    return rc;
}

/* Delete every key that matches @pat on @c (SCAN + DEL). Returns 0 or -1. */
static int redis_del_matching(redisContext *c, const char *pat)
{
    char cursor[32] = "0";
    int rc = 0;
    /* SCAN returns every key present throughout; the round's clients are
     * closed, so none appears under the prefix meanwhile. */
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pat);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            if (r)
                freeReplyObject(r);
            return -1;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements; i++) {
            redisReply *d = redisCommand(c, "DEL %b", keys->element[i]->str,
                                         (size_t)keys->element[i]->len);
            if (!d || d->type != REDIS_REPLY_INTEGER)
                rc = -1;
            if (d)
                freeReplyObject(d);
        }
        freeReplyObject(r);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    return rc;
}

/* Delete every key of the Redis prefix of @ns: P* (a name's key, the
 * marker, the closure record) and {P* (a name's helper keys, hash-tagged
 * "{K}\x1f...", redis_scripts.h). Returns 0 or -1 (noted). */
static int remove_redis(const struct bench_ns *ns)
{
    struct bench_engine be;
    void *s = redis_sess(ns, &be, false);
    if (!s)
        return -1;
    redisContext *c = bench_redis_context(s);
    /* "{" + the prefix as a glob, its own *?[]\ matched literally, + "*". */
    size_t n = strlen(ns->redis_prefix);
    char *pat = malloc(2 * n + 3), *o = pat;
    int rc = -1;
    const bool oom = !pat;
    if (pat) {
        *o++ = '{';
        for (const char *p = ns->redis_prefix; *p; p++) {
            if (strchr("*?[]\\", *p))
                *o++ = '\\';
            *o++ = *p;
        }
        *o++ = '*';
        *o = '\0';
        rc = redis_del_matching(c, pat + 1) == 0 && redis_del_matching(c, pat) == 0 ? 0 : -1;
    }
    free(pat);
    if (rc != 0)
        fprintf(stderr, "cerberus-bench: note: redis: could not remove every key under \"%s\": "
                        "%s\n", ns->redis_prefix,
                oom ? "out of memory" : c->errstr[0] ? c->errstr : "unexpected answer");
    bench_redis_close(s);
    bench_redis_addr_free(&be.redis);
    return rc;
}

#ifdef CERB_WITH_ZK
/* Delete @path and everything under it; ZNONODE counts as done. The tree
 * is the round's: its root, the lock names' containers, the record and the
 * fence node, a few levels deep. */
static int zk_delete_tree(zhandle_t *zh, const char *path, int depth)
{
    struct String_vector kids = {0, NULL};
    int rc = zoo_get_children(zh, path, 0, &kids);
    if (rc == ZNONODE)
        return ZOK;
    if (rc != ZOK)
        return rc;
    for (int i = 0; i < kids.count && rc == ZOK; i++) {
        size_t len = strlen(path) + strlen(kids.data[i]) + 2;
        char *child = malloc(len);
        if (!child) {
            rc = ZSYSTEMERROR;
            break;
        }
        snprintf(child, len, "%s/%s", path, kids.data[i]);
        rc = depth < 16 ? zk_delete_tree(zh, child, depth + 1) : ZNOTEMPTY;
        free(child);
    }
    deallocate_String_vector(&kids);
    if (rc == ZOK) {
        rc = zoo_delete(zh, path, -1);
        if (rc == ZNONODE)
            rc = ZOK;
    }
    return rc;
}

static int remove_zk(const struct bench_ns *ns)
{
    struct bench_engine be = {.cfg = ns->cfg};
    char err[BENCH_ERR_MAX];
    void *s = bench_zk_open(&be, err, sizeof err);
    if (!s) {
        fprintf(stderr, "cerberus-bench: note: %s: %s left there\n", err, ns->zk_top);
        return -1;
    }
    int rc = zk_delete_tree(bench_zk_handle(s), ns->zk_top, 0);
    if (rc != ZOK)
        fprintf(stderr, "cerberus-bench: note: zk %s: could not remove %s: %s\n",
                ns->cfg->zk.hosts, ns->zk_top, zerror(rc));
    bench_zk_close(s);
    return rc == ZOK ? 0 : -1;
}
#endif

#ifdef CERB_WITH_ETCD
static int remove_etcd(const struct bench_ns *ns)
{
    struct bench_engine be = {.cfg = ns->cfg};
    char err[BENCH_ERR_MAX];
    void *s = bench_etcd_open(&be, err, sizeof err);
    int rc = -1;
    if (s) {
        /* The range of every key that starts with the prefix: its last
         * byte raised by one ('/' to '0') ends it. */
        size_t n = strlen(ns->etcd_prefix);
        char *end = strdup(ns->etcd_prefix);
        if (end) {
            end[n - 1]++;
            rc = bench_etcd_post(s, "/v3/kv/deleterange",
                                 json_pack("{s:o, s:o}", "key",
                                           bench_etcd_b64(ns->etcd_prefix, n), "range_end",
                                           bench_etcd_b64(end, n)),
                                 NULL, err, sizeof err);
            free(end);
        } else {
            snprintf(err, sizeof err, "out of memory");
        }
    }
    if (rc != 0)
        fprintf(stderr, "cerberus-bench: note: %s: the keys under \"%s\" are left there\n",
                err, ns->etcd_prefix);
    bench_etcd_close(s);
    return rc;
}
#endif

int bench_ns_remove(const struct bench_ns *ns, const char *only)
{
    int rc = 0;
    if (!ns->cfg)
        return 0;
    if (ns->redis_prefix && touches(only, "redis"))
        rc |= remove_redis(ns);
#ifdef CERB_WITH_ZK
    if (ns->zk_top && touches(only, "zk"))
        rc |= remove_zk(ns);
#endif
#ifdef CERB_WITH_ETCD
    if (ns->etcd_prefix && touches(only, "etcd"))
        rc |= remove_etcd(ns);
#endif
    return rc ? -1 : 0;
}
