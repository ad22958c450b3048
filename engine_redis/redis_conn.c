/*
 * redis_conn.c — connections of the Redis engine: set-up, the command pool,
 * blocking connections for waiters, and the pipelined exchange every request
 * goes through.
 *
 * Set-up. hiredis 0.14's redisConnectWithTimeout bounds only the connect;
 * without redisSetTimeout afterwards a command can block forever, so every
 * connection gets its socket timeout right after connecting (the operation
 * timeout). A waiter never reads a BLPOP reply before poll() says it has
 * arrived, so blocking connections get the operation timeout too. AUTH and
 * SELECT go out together in one round trip.
 *
 * The pool. An array of `redis.pool_max` slots, connected on demand, and a
 * stack of free slot indexes under a mutex: the most recently returned
 * (warm) connection is reused first, an unconnected slot last, so the pool
 * opens as many connections as threads call at once and no more; a caller
 * finding every slot busy waits on a monotonic condition variable at most
 * until its deadline. The coldest connection (just above the unconnected
 * slots) is closed when it has been idle for `redis.pool_idle_ms` and others
 * stay open: a burst's connections go away once the burst is over. Idle
 * blocking connections close the same way. A
 * connection that failed is freed when it comes back and its slot
 * reconnects on next use: hiredis kills a context after a timeout, and the
 * core settles ambiguities only on a connection whose last request did not
 * time out (engine.h, check_owner). A connection idle for a while is first
 * checked with a zero-timeout poll(): a healthy idle connection has nothing
 * to read, so anything there is the server's close (a restart, its idle
 * `timeout`), and the slot reconnects instead of failing one request with a
 * false "outcome unknown".
 *
 * The exchange. Requests are formatted by hiredis into the connection's own
 * buffer and written by send() with MSG_NOSIGNAL, not by hiredis' write():
 * a dead peer must not raise SIGPIPE in the host process, and writing
 * ourselves tells exactly whether a failure came before the request left
 * (outcome NO) or after (UNKNOWN). The replies are then read with
 * redisGetReply, which finds nothing to write and only reads.
 */
#include "internal_posix.h"

#include "redis_conn.h"
#include "redis_marker.h"
#include "redis_sentinel.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"

static struct timeval ms_to_tv(int64_t ms)
{
    struct timeval tv;
    if (ms < 1)
        ms = 1;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
    return tv;
}

/* Decimal digits of v into the end of buf[0..21); returns the first. */
static char *put_dec(char *end, size_t v)
{
    *--end = '\0';
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return end;
}

/*
 * Append one request in RESP framing (`*N`, then `$len` + bytes per
 * argument) straight into the connection's output buffer. This is the hot
 * path of every lock call: hiredis' redisFormatCommandArgv mallocs and runs
 * sprintf per argument, which was a quarter of the client's CPU in the
 * 8-thread bench. Replies are still parsed by hiredis.
 */
cerb_status cerb__redis_append(struct redis_conn *c, int argc, const char **argv,
                               const size_t *argvlen)
{
    char num[24];
    size_t need = 1 + 21 + 2;
    for (int i = 0; i < argc; i++)
        need += 1 + 21 + 2 + argvlen[i] + 2;
    if (c->out_len + need > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 512;
        while (cap < c->out_len + need)
            cap *= 2;
        char *p = cerb__realloc(c->out, cap);
        if (!p)
            return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a request");
        c->out = p;
        c->out_cap = cap;
    }
    char *w = c->out + c->out_len;
    *w++ = '*';
    for (const char *d = put_dec(num + sizeof num, (size_t)argc); *d;)
        *w++ = *d++;
    *w++ = '\r';
    *w++ = '\n';
    for (int i = 0; i < argc; i++) {
        *w++ = '$';
        for (const char *d = put_dec(num + sizeof num, argvlen[i]); *d;)
            *w++ = *d++;
        *w++ = '\r';
        *w++ = '\n';
        memcpy(w, argv[i], argvlen[i]);
        w += argvlen[i];
        *w++ = '\r';
        *w++ = '\n';
    }
    c->out_len = (size_t)(w - c->out);
    c->pending++;
    return CERB_OK;
}

static _Thread_local bool tl_asking;

void cerb__redis_set_asking(bool on) { tl_asking = on; }

bool cerb__redis_asking(void) { return tl_asking; }

/* The decimal at *p, up to its "\r\n"; moves *p past both. */
static bool resp_num(const char **p, const char *end, size_t *v)
{
    const char *s = *p;
    size_t x = 0;
    if (s >= end || *s < '0' || *s > '9')
        return false;
    while (s < end && *s >= '0' && *s <= '9')
        x = x * 10 + (size_t)(*s++ - '0');
    if (end - s < 2 || s[0] != '\r' || s[1] != '\n')
        return false;
    *p = s + 2;
    *v = x;
    return true;
}

static bool name_is(const char *name, size_t len, const char *want)
{
    return len == strlen(want) && strncasecmp(name, want, len) == 0;
}

/*
 * Cluster ASK: the n requests in[0..len) as they go to the target, in a new
 * buffer (*out, freed by the caller). The target serves the migrating slot
 * only to a request right after ASKING, and the flag lasts one request, so
 * ASKING goes before each — except inside MULTI ... EXEC: the flag lasts
 * the whole transaction there, and an ASKING in it would be queued and
 * answered by EXEC. c->asked says which replies to come follow an ASKING.
 * The requests are this file's own framing (cerb__redis_append).
 */
static cerb_status ask_each(cerb_engine *e, struct redis_conn *c, const char *in, size_t len,
                            size_t n, char **out, size_t *out_len)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    const size_t al = sizeof asking - 1;
    if (c->ask_cap < n) {
        unsigned char *a = cerb__realloc(c->asked, n);
        if (!a)
            return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a request");
        c->asked = a;
        c->ask_cap = n;
    }
    char *buf = cerb__malloc(len + n * al), *w = buf;
    if (!buf)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a request");
    const char *p = in, *end = in + len;
    bool multi = false;
    for (size_t i = 0; i < n; i++) {
        const char *start = p, *name = "";
        size_t argc, nl = 0;
        bool ok = p < end && *p++ == '*' && resp_num(&p, end, &argc);
        for (size_t a = 0; ok && a < argc; a++) {
            size_t l;
            ok = p < end && *p++ == '$' && resp_num(&p, end, &l) && (size_t)(end - p) >= l + 2;
            if (ok && a == 0)
                name = p, nl = l;
            if (ok)
                p += l + 2;
        }
        if (!ok) {
            cerb__free(buf);
            return cerb__error_set(CERB_EPROTO, "redis %s: a request in the buffer is not "
                                   "framed as it was appended", e->where);
        }
        c->asked[i] = !multi;
        if (!multi) {
            memcpy(w, asking, al);
            w += al;
        }
        memcpy(w, start, (size_t)(p - start));
        w += p - start;
        if (name_is(name, nl, "MULTI"))
            multi = true;
        else if (name_is(name, nl, "EXEC") || name_is(name, nl, "DISCARD"))
            multi = false;
    }
    *out = buf;
    *out_len = (size_t)(w - buf);
    return CERB_OK;
}

cerb_status cerb__redis_send(cerb_engine *e, struct redis_conn *c, const char *what,
                             cerb_outcome *outcome)
{
    size_t n = c->pending;
    const char *p = c->out;
    size_t left = c->out_len;
    size_t written = 0;
    char *asked_buf = NULL;

    c->out_len = 0;
    c->pending = 0;
    c->ask_n = c->ask_rd = 0;
    if (outcome)
        *outcome = CERB_OUTCOME_NO;
    REDIS_COUNT(e, round_trips);
    if (!c->ctx || c->broken) {
        c->broken = true;
        struct redis_failure f = {.phase = REDIS_PHASE_SEND, .sys_errno = ENOTCONN};
        return cerb__redis_fail(e->where, what, &f, outcome);
    }
    if (tl_asking && n > 0) {
        cerb_status st = ask_each(e, c, p, left, n, &asked_buf, &left);
        if (st != CERB_OK)
            return st; /* nothing left: outcome NO */
        p = asked_buf;
        c->ask_n = n;
    }
    while (left > 0) {
        ssize_t k = send(c->ctx->fd, p, left, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            c->broken = true;
            struct redis_failure f = {.phase = REDIS_PHASE_SEND,
                                      .sys_errno = errno,
                                      .timeout_ms = c->timeout_ms};
            cerb_status st = cerb__redis_fail(e->where, what, &f, outcome);
            /* Redis runs only whole commands, but in a pipeline the ones
             * before the cut may have been whole. */
            if (outcome && n > 1 && written > 0)
                *outcome = CERB_OUTCOME_UNKNOWN;
            cerb__free(asked_buf);
            return st;
        }
        p += k;
        left -= (size_t)k;
        written += (size_t)k;
    }
    cerb__free(asked_buf);
    return CERB_OK;
}

cerb_status cerb__redis_recv(cerb_engine *e, struct redis_conn *c, const char *what,
                             redisReply **r, cerb_outcome *outcome)
{
    void *rep = NULL;

    *r = NULL;
    if (c->ask_rd < c->ask_n) {
        bool asked = c->asked[c->ask_rd++];
        if (c->ask_rd == c->ask_n)
            c->ask_n = c->ask_rd = 0;
        /* ASKING's answer; a failure to read it is reported by the read
         * below. */
        if (asked && c->ctx && !c->broken && redisGetReply(c->ctx, &rep) == REDIS_OK && rep) {
            freeReplyObject(rep);
            rep = NULL;
        }
    }
    if (redisGetReply(c->ctx, &rep) != REDIS_OK || !rep) {
        c->broken = true;
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY,
                                  .err = c->ctx->err ? c->ctx->err : REDIS_ERR_IO,
                                  .errstr = c->ctx->errstr,
                                  .timeout_ms = c->timeout_ms};
        return cerb__redis_fail(e->where, what, &f, outcome);
    }
    *r = rep;
    return CERB_OK;
}

cerb_status cerb__redis_exchange(cerb_engine *e, struct redis_conn *c, const char *what,
                                 redisReply **r, size_t *n_read, cerb_outcome *outcome)
{
    size_t n = c->pending;
    cerb_status st;

    *n_read = 0;
    for (size_t i = 0; i < n; i++)
        r[i] = NULL;
    st = cerb__redis_send(e, c, what, outcome);
    for (size_t i = 0; st == CERB_OK && i < n; i++) {
        st = cerb__redis_recv(e, c, what, &r[i], outcome);
        if (st == CERB_OK)
            (*n_read)++;
    }
    /* A master that became a replica answers writes with READONLY: this
     * connection is to the wrong server now; find the master again. */
    for (size_t i = 0; i < *n_read; i++)
        if (r[i]->type == REDIS_REPLY_ERROR && r[i]->len >= 8 &&
            memcmp(r[i]->str, "READONLY", 8) == 0) {
            c->broken = true;
            cerb__redis_addr_suspect(e);
        }
    if (st != CERB_OK)
        cerb__redis_addr_suspect(e);
    return st;
}

static void free_replies(redisReply **r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i])
            freeReplyObject(r[i]);
}

/* Check one set-up reply: anything but an error is fine. */
static cerb_status setup_reply(cerb_engine *e, const char *what, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ERROR)
        return CERB_OK;
    struct redis_failure f = {.phase = REDIS_PHASE_CONNECT, .reply = r};
    return cerb__redis_fail(e->where, what, &f, NULL);
}

/*
 * From an INFO replication answer: the role (into role, "" when absent) and
 * master_replid (into replid, "" when absent or malformed).
 */
static void parse_replication(const redisReply *r, char *role, size_t rolel, char *replid,
                              size_t replidl)
{
    role[0] = replid[0] = '\0';
    if (r->type != REDIS_REPLY_STRING)
        return;
    const char *s = r->str, *end = r->str + r->len;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        if (le > s && le[-1] == '\r')
            le--;
        size_t n = (size_t)(le - s);
        if (n > 5 && memcmp(s, "role:", 5) == 0 && n - 5 < rolel) {
            memcpy(role, s + 5, n - 5);
            role[n - 5] = '\0';
        } else if (n > 14 && memcmp(s, "master_replid:", 14) == 0 && n - 14 < replidl) {
            bool hex = true;
            for (size_t i = 14; i < n; i++)
                hex = hex && ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'));
            if (hex) {
                memcpy(replid, s + 14, n - 14);
                replid[n - 14] = '\0';
            }
        }
        s = nl ? nl + 1 : end;
    }
}

/* From an INFO answer: the value of the line "<key>..." into out ("" when
 * absent, too long or not [0-9a-z-]). */
static void parse_field(const redisReply *r, const char *key, char *out, size_t outl)
{
    size_t kl = strlen(key);
    out[0] = '\0';
    if (r->type != REDIS_REPLY_STRING)
        return;
    const char *s = r->str, *end = r->str + r->len;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        if (le > s && le[-1] == '\r')
            le--;
        size_t n = (size_t)(le - s);
        if (n > kl && memcmp(s, key, kl) == 0 && n - kl < outl) {
            for (size_t i = kl; i < n; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') || s[i] == '-'))
                    return;
            memcpy(out, s + kl, n - kl);
            out[n - kl] = '\0';
            return;
        }
        s = nl ? nl + 1 : end;
    }
}

/* Connect c (whose ctx is NULL) and run the set-up commands. */
static cerb_status conn_connect(cerb_engine *e, struct redis_conn *c, int64_t connect_ms,
                                int64_t timeout_ms)
{
    const struct cerb_redis_config *rc = e->rc;
    char host[256];
    int port;
    uint64_t gen;
    cerb_status st = cerb__redis_addr_get(e, cerb__deadline_in(connect_ms + timeout_ms), host,
                                          sizeof host, &port, &gen);
    if (st != CERB_OK)
        return st;
    redisContext *ctx = redisConnectWithTimeout(host, port, ms_to_tv(connect_ms));

    REDIS_COUNT(e, connects);
    if (!ctx)
        return cerb__error_set(CERB_ENOMEM, "redis %s: cannot allocate a connection", e->where);
    if (ctx->err) {
        struct redis_failure f = {.phase = REDIS_PHASE_CONNECT,
                                  .err = ctx->err,
                                  .errstr = ctx->errstr,
                                  .timeout_ms = connect_ms};
        st = cerb__redis_fail(e->where, "connect", &f, NULL);
        redisFree(ctx);
        cerb__redis_addr_suspect(e);
        return st;
    }
    if (redisSetTimeout(ctx, ms_to_tv(timeout_ms)) != REDIS_OK) {
        struct redis_failure f = {.phase = REDIS_PHASE_CONNECT,
                                  .err = ctx->err ? ctx->err : REDIS_ERR_IO,
                                  .errstr = ctx->errstr};
        st = cerb__redis_fail(e->where, "set socket timeout", &f, NULL);
        redisFree(ctx);
        return st;
    }
    c->ctx = ctx;
    c->gen = gen;
    c->broken = false;
    c->timeout_ms = timeout_ms;
    c->out_len = 0;
    c->ask_n = c->ask_rd = 0;
    c->pending = 0;

    /* AUTH (ACL form when a user is set) and SELECT, one round trip. */
    const char *argv[3];
    size_t argl[3];
    const char *names[4];
    int n = 0;
    char db[16];
    st = CERB_OK;
    if (rc->user && rc->user[0]) {
        argv[0] = "AUTH", argv[1] = rc->user, argv[2] = rc->password ? rc->password : "";
        for (int i = 0; i < 3; i++)
            argl[i] = strlen(argv[i]);
        st = cerb__redis_append(c, 3, argv, argl);
        names[n++] = "AUTH";
    } else if (rc->password && rc->password[0]) {
        argv[0] = "AUTH", argv[1] = rc->password;
        for (int i = 0; i < 2; i++)
            argl[i] = strlen(argv[i]);
        st = cerb__redis_append(c, 2, argv, argl);
        names[n++] = "AUTH";
    }
    if (st == CERB_OK && rc->db != 0) {
        snprintf(db, sizeof db, "%d", rc->db);
        argv[0] = "SELECT", argv[1] = db;
        for (int i = 0; i < 2; i++)
            argl[i] = strlen(argv[i]);
        st = cerb__redis_append(c, 2, argv, argl);
        names[n++] = "SELECT";
    }
    /* The server's history (redis_marker.h): which replication id it has,
     * and that it is a master (a replica refuses our writes). */
    if (st == CERB_OK) {
        argv[0] = "INFO", argv[1] = "replication";
        argl[0] = 4, argl[1] = 11;
        st = cerb__redis_append(c, 2, argv, argl);
        names[n++] = "INFO replication";
    }
    /* A Redlock node: whether it may evict keys (redis_redlock.h), same
     * round trip. */
    if (st == CERB_OK && e->rl_node) {
        argv[0] = "INFO", argv[1] = "memory";
        argl[0] = 4, argl[1] = 6;
        st = cerb__redis_append(c, 2, argv, argl);
        names[n++] = "INFO memory";
    }
    char role[16] = "", replid[48] = "";
    c->policy[0] = '\0';
    if (st == CERB_OK) {
        redisReply *r[4];
        size_t got;
        st = cerb__redis_exchange(e, c, names[0], r, &got, NULL);
        /* AUTH and SELECT only: the INFO answers are read below. */
        size_t ninfo = e->rl_node ? 2 : 1;
        for (size_t i = 0; st == CERB_OK && i + ninfo < got; i++)
            st = setup_reply(e, names[i], r[i]);
        /* INFO may be renamed away on a hardened server: then no history
         * check, as before. */
        int ri = e->rl_node ? n - 2 : n - 1; /* INFO replication's reply */
        if (st == CERB_OK && got == (size_t)n && r[ri]->type != REDIS_REPLY_ERROR)
            parse_replication(r[ri], role, sizeof role, replid, sizeof replid);
        if (st == CERB_OK && got == (size_t)n && e->rl_node)
            parse_field(r[n - 1], "maxmemory_policy:", c->policy, sizeof c->policy);
        free_replies(r, got);
    }
    if (st == CERB_OK && role[0] && strcmp(role, "master") != 0) {
        st = cerb__error_set(CERB_EIO, "redis %s: %s:%d is a %s, not a master: it would "
                             "refuse (or lose) our writes", e->where, host, port, role);
        cerb__redis_addr_suspect(e);
    }
    /* A Redlock node whose history or eviction policy cannot be read could
     * come back from an old snapshot, or drop keys, unseen: not used. */
    if (st == CERB_OK && e->rl_node && (!replid[0] || !c->policy[0]))
        st = cerb__error_set(CERB_EIO, "redis %s: redlock needs INFO replication and INFO "
                             "memory (master_replid, maxmemory_policy), which this server does "
                             "not give this user: allow INFO, or a restart from an older "
                             "snapshot or an eviction could not be seen", e->where);
    if (st == CERB_OK && !replid[0] && !atomic_exchange(&e->replid_warned, true))
        CERB_LOG_W("redis %s: INFO replication gives no master_replid (renamed, or denied to "
                   "this user): a restart from an older snapshot or a promoted replica cannot "
                   "be told from the marker, and holds written after it may be granted again "
                   "at once; allow INFO to this user", e->where);
    if (st == CERB_OK && e->marker_key)
        st = cerb__redis_marker_history(e, c, replid);
    if (st != CERB_OK) {
        redisFree(c->ctx);
        c->ctx = NULL;
        c->broken = false;
        c->out_len = 0;
        c->pending = 0;
    }
    return st;
}

cerb_status cerb__redis_conn_open(cerb_engine *e, int64_t connect_ms, int64_t timeout_ms,
                                  struct redis_conn **out)
{
    struct redis_conn *c = cerb__calloc(1, sizeof *c);

    *out = NULL;
    if (!c)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a connection");
    c->slot = -1;
    cerb_status st = conn_connect(e, c, connect_ms, timeout_ms);
    if (st != CERB_OK) {
        cerb__redis_conn_free(c);
        return st;
    }
    *out = c;
    return CERB_OK;
}

void cerb__redis_conn_free(struct redis_conn *c)
{
    if (!c)
        return;
    if (c->ctx)
        redisFree(c->ctx);
    cerb__free(c->out);
    cerb__free(c->asked);
    cerb__free(c);
}

cerb_status cerb__redis_conn_set_timeout(cerb_engine *e, struct redis_conn *c,
                                         int64_t timeout_ms)
{
    if (c->timeout_ms == timeout_ms)
        return CERB_OK;
    if (redisSetTimeout(c->ctx, ms_to_tv(timeout_ms)) != REDIS_OK) {
        c->broken = true;
        struct redis_failure f = {.phase = REDIS_PHASE_SEND, .sys_errno = errno};
        return cerb__redis_fail(e->where, "set socket timeout", &f, NULL);
    }
    c->timeout_ms = timeout_ms;
    return CERB_OK;
}

/* ---- the command pool ---- */

cerb_status cerb__redis_pool_init(cerb_engine *e)
{
    struct redis_pool *p = &e->pool;
    int n = e->rc->pool_max > 0 ? e->rc->pool_max : 1;

    p->size = n;
    p->slots = cerb__calloc((size_t)n, sizeof *p->slots);
    p->free_slots = cerb__calloc((size_t)n, sizeof *p->free_slots);
    p->max_idle = n;
    p->idle = cerb__calloc((size_t)n, sizeof *p->idle);
    if (!p->slots || !p->free_slots || !p->idle) {
        cerb__free(p->slots);
        cerb__free(p->free_slots);
        cerb__free(p->idle);
        memset(p, 0, sizeof *p);
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for the pool");
    }
    /* Slot 0 on top of the stack: open() connects it first. */
    for (int i = 0; i < n; i++) {
        p->slots[i].slot = i;
        p->free_slots[i] = n - 1 - i;
    }
    p->n_free = n;
    cerb__mutex_init(&p->mu);
    cerb__cond_init(&p->cond);
    return CERB_OK;
}

void cerb__redis_pool_destroy(cerb_engine *e)
{
    struct redis_pool *p = &e->pool;

    if (!p->slots)
        return;
    for (int i = 0; i < p->size; i++) {
        if (p->slots[i].ctx)
            redisFree(p->slots[i].ctx);
        cerb__free(p->slots[i].out);
        cerb__free(p->slots[i].asked);
    }
    for (int i = 0; i < p->n_idle; i++)
        cerb__redis_conn_free(p->idle[i]);
    cerb__free(p->slots);
    cerb__free(p->free_slots);
    cerb__free(p->idle);
    cerb__cond_destroy(&p->cond);
    cerb__mutex_destroy(&p->mu);
    memset(p, 0, sizeof *p);
}

/* Idle longer than this, a connection is checked before use. */
#define IDLE_CHECK_NS (1000 * CERB_NS_PER_MS)

/*
 * Close the coldest free command connection if it has idled past
 * redis.pool_idle_ms and a warmer free one stays open; p->mu held (free
 * slots are touched only under it; slots in use are their thread's). Free
 * slots run from unconnected (bottom) to warm (top), so the coldest is the
 * first connected one from the bottom. Its context is returned for the
 * caller to free after unlocking (close() outside the lock).
 */
static redisContext *pool_trim(struct redis_pool *p, int64_t now, int64_t idle_ns)
{
    int coldest = -1, open = 0;
    for (int i = 0; i < p->n_free; i++)
        if (p->slots[p->free_slots[i]].ctx && open++ == 0)
            coldest = p->free_slots[i];
    if (open < 2 || now - p->slots[coldest].idle_since < idle_ns)
        return NULL;
    redisContext *ctx = p->slots[coldest].ctx;
    p->slots[coldest].ctx = NULL;
    p->closed_idle++;
    return ctx;
}

/* Did the server close (or write to) this idle connection? */
static bool idle_conn_dead(struct redis_conn *c)
{
    if (!c->ctx || cerb_monotime() - c->idle_since < IDLE_CHECK_NS)
        return false;
    struct pollfd pfd = {.fd = c->ctx->fd, .events = POLLIN};
    return poll(&pfd, 1, 0) != 0;
}

cerb_status cerb__redis_get(cerb_engine *e, int64_t deadline_ns, struct redis_conn **out)
{
    struct redis_pool *p = &e->pool;
    int idx;

    *out = NULL;
    cerb__mutex_lock(&p->mu);
    while (p->n_free == 0) {
        if (cerb__cond_wait_until(&p->cond, &p->mu, deadline_ns) && p->n_free == 0) {
            cerb__mutex_unlock(&p->mu);
            return cerb__error_set(CERB_EIO,
                                   "redis %s: all %d connections stayed busy for %lld ms",
                                   e->where, p->size, (long long)e->rc->op_timeout_ms);
        }
    }
    idx = p->free_slots[--p->n_free];
    cerb__mutex_unlock(&p->mu);

    struct redis_conn *c = &p->slots[idx];
    if (idle_conn_dead(c) || (c->ctx && c->gen != cerb__redis_addr_gen(e))) {
        redisFree(c->ctx);
        c->ctx = NULL;
    }
    if (!c->ctx) {
        cerb_status st = conn_connect(e, c, e->rc->connect_timeout_ms, e->rc->op_timeout_ms);
        if (st != CERB_OK) {
            cerb__redis_put(e, c);
            return st;
        }
    }
    *out = c;
    return CERB_OK;
}

bool cerb__redis_has_warm(cerb_engine *e)
{
    struct redis_pool *p = &e->pool;
    cerb__mutex_lock(&p->mu);
    bool warm = p->n_free > 0 && p->slots[p->free_slots[p->n_free - 1]].ctx != NULL;
    cerb__mutex_unlock(&p->mu);
    return warm;
}

void cerb__redis_put(cerb_engine *e, struct redis_conn *c)
{
    struct redis_pool *p = &e->pool;

    if (!c)
        return;
    if (c->ctx && (c->broken || c->ctx->err)) {
        redisFree(c->ctx);
        c->ctx = NULL;
    }
    c->broken = false;
    c->out_len = 0;
    c->pending = 0;
    c->idle_since = cerb_monotime();
    cerb__mutex_lock(&p->mu);
    if (c->ctx) {
        p->free_slots[p->n_free++] = c->slot;
    } else {
        /* Unconnected: to the bottom, so warm connections go first. */
        memmove(p->free_slots + 1, p->free_slots, (size_t)p->n_free * sizeof *p->free_slots);
        p->free_slots[0] = c->slot;
        p->n_free++;
    }
    redisContext *cold = pool_trim(p, c->idle_since, e->rc->pool_idle_ms * CERB_NS_PER_MS);
    cerb__cond_signal(&p->cond);
    cerb__mutex_unlock(&p->mu);
    if (cold)
        redisFree(cold);
}

/* ---- blocking connections ---- */

cerb_status cerb__redis_block_get(cerb_engine *e, struct redis_conn **out)
{
    struct redis_pool *p = &e->pool;

    for (;;) {
        struct redis_conn *c = NULL;
        cerb__mutex_lock(&p->mu);
        if (p->n_idle > 0)
            c = p->idle[--p->n_idle];
        cerb__mutex_unlock(&p->mu);
        if (!c)
            break;
        if (!idle_conn_dead(c) && c->gen == cerb__redis_addr_gen(e)) {
            *out = c;
            return CERB_OK;
        }
        cerb__redis_conn_free(c);
    }
    /* The socket timeout bounds replies already under way: the waiter
     * polls the socket with its own timeouts before it reads. */
    return cerb__redis_conn_open(e, e->rc->connect_timeout_ms, e->rc->op_timeout_ms, out);
}

void cerb__redis_block_put(cerb_engine *e, struct redis_conn *c)
{
    struct redis_pool *p = &e->pool;

    if (!c)
        return;
    struct redis_conn *cold = NULL;
    if (!c->broken && c->ctx && !c->ctx->err) {
        c->out_len = 0;
        c->pending = 0;
        int64_t now = c->idle_since = cerb_monotime();
        cerb__mutex_lock(&p->mu);
        if (p->n_idle < p->max_idle) {
            p->idle[p->n_idle++] = c;
            c = NULL;
        }
        /* The oldest idle blocking connection (bottom of the stack) goes
         * once it has idled past the limit. */
        if (p->n_idle > 1 && now - p->idle[0]->idle_since >= e->rc->pool_idle_ms * CERB_NS_PER_MS) {
            cold = p->idle[0];
            memmove(p->idle, p->idle + 1, (size_t)(p->n_idle - 1) * sizeof *p->idle);
            p->n_idle--;
            p->closed_idle++;
        }
        cerb__mutex_unlock(&p->mu);
    }
    cerb__redis_conn_free(c);
    cerb__redis_conn_free(cold);
}
