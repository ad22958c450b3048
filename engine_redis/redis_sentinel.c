/*
 * redis_sentinel.c — finding the master through the sentinels
 * (redis_sentinel.h).
 *
 * Discovery asks the sentinels in turn, starting with the one that answered
 * last, and takes the first answer; the connection that follows checks the
 * role, so a sentinel that is behind (it still names the old master, now a
 * replica) costs one more round, not a write to a replica. One discovery at
 * a time (disc_mu); threads that need the address meanwhile wait for it
 * rather than ask again.
 */
#include "internal_posix.h"

#include "redis_sentinel.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "log.h"

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

void cerb__redis_addr_init(cerb_engine *e)
{
    cerb__mutex_init(&e->addr_mu);
    cerb__mutex_init(&e->disc_mu);
    atomic_store(&e->addr_gen, 1);
    if (e->rc->mode == CERB_REDIS_SENTINEL) {
        e->addr_host[0] = '\0';
        e->addr_port = 0;
        atomic_store(&e->addr_suspect, true);
    } else {
        snprintf(e->addr_host, sizeof e->addr_host, "%s", e->rc->host);
        e->addr_port = e->rc->port;
        atomic_store(&e->addr_suspect, false);
    }
}

void cerb__redis_addr_destroy(cerb_engine *e)
{
    cerb__mutex_destroy(&e->addr_mu);
    cerb__mutex_destroy(&e->disc_mu);
}

void cerb__redis_addr_suspect(cerb_engine *e)
{
    if (e->rc->mode == CERB_REDIS_SENTINEL)
        atomic_store(&e->addr_suspect, true);
}

uint64_t cerb__redis_addr_gen(cerb_engine *e) { return atomic_load(&e->addr_gen); }

/* "host:port" → host, port (the config checked the shape). */
static bool split_hostport(const char *s, char *host, size_t hlen, int *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return false;
    size_t n = (size_t)(colon - s);
    if (s[0] == '[' && n >= 2 && s[n - 1] == ']')
        s++, n -= 2;
    if (n >= hlen)
        return false;
    memcpy(host, s, n);
    host[n] = '\0';
    *port = atoi(colon + 1);
    return *port > 0 && *port < 65536;
}

/* Ask one sentinel. CERB_OK with host/port, or an error naming it. */
static cerb_status ask_one(cerb_engine *e, const char *sentinel, int64_t deadline_ns, char *host,
                           size_t hlen, int *port)
{
    char shost[256];
    int sport;
    if (!split_hostport(sentinel, shost, sizeof shost, &sport))
        return cerb__error_set(CERB_ECONFIG, "redis: sentinel \"%s\" is not host:port", sentinel);
    int64_t left = cerb__ms_left(deadline_ns);
    int64_t cms = left < e->rc->connect_timeout_ms ? left : e->rc->connect_timeout_ms;
    if (cms <= 0)
        return cerb__error_set(CERB_TIMEOUT, "redis: no time left to ask the sentinels");
    redisContext *c = redisConnectWithTimeout(shost, sport, tv_ms(cms));
    if (!c)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a sentinel connection");
    cerb_status st = CERB_OK;
    if (c->err) {
        st = cerb__error_set(CERB_EIO, "sentinel %s: connect: %s", sentinel, c->errstr);
        redisFree(c);
        return st;
    }
    int64_t oms = left < e->rc->op_timeout_ms ? left : e->rc->op_timeout_ms;
    redisSetTimeout(c, tv_ms(oms > 0 ? oms : 1));
    redisReply *r;
    const char *pw = e->rc->sentinel_password;
    if (pw && pw[0]) {
        r = redisCommand(c, "AUTH %s", pw);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            st = cerb__error_set(CERB_EIO, "sentinel %s: AUTH refused%s%s", sentinel,
                                 r ? ": " : "", r ? r->str : "");
            if (r)
                freeReplyObject(r);
            redisFree(c);
            return st;
        }
        freeReplyObject(r);
    }
    r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", e->rc->master_name);
    if (!r) {
        st = cerb__error_set(CERB_EIO, "sentinel %s: no answer (%s)", sentinel,
                             c->errstr[0] ? c->errstr : "connection lost");
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
               r->element[0]->type == REDIS_REPLY_STRING &&
               r->element[1]->type == REDIS_REPLY_STRING && r->element[0]->len < hlen &&
               atoi(r->element[1]->str) > 0 && atoi(r->element[1]->str) < 65536) {
        memcpy(host, r->element[0]->str, r->element[0]->len);
        host[r->element[0]->len] = '\0';
        *port = atoi(r->element[1]->str);
    } else if (r->type == REDIS_REPLY_NIL) {
        st = cerb__error_set(CERB_ECONFIG, "sentinel %s does not know a master named \"%s\"",
                             sentinel, e->rc->master_name);
    } else {
        st = cerb__error_set(CERB_EPROTO, "sentinel %s: unexpected answer to "
                             "get-master-addr-by-name%s%s", sentinel,
                             r->type == REDIS_REPLY_ERROR ? ": " : "",
                             r->type == REDIS_REPLY_ERROR ? r->str : "");
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return st;
}

static cerb_status discover(cerb_engine *e, int64_t deadline_ns)
{
    const struct cerb_redis_config *rc = e->rc;
    char host[256], why[CERB_ERROR_MAX] = "";
    int port = 0;
    cerb_status st = CERB_UNAVAILABLE;
    size_t n = rc->n_sentinels;
    for (size_t k = 0; k < n; k++) {
        size_t i = (e->sentinel_next + k) % n;
        st = ask_one(e, rc->sentinels[i], deadline_ns, host, sizeof host, &port);
        if (st == CERB_OK) {
            e->sentinel_next = i;
            break;
        }
        cerb__error_copy(why, sizeof why);
        if (st == CERB_ECONFIG || st == CERB_TIMEOUT)
            break;
    }
    if (st != CERB_OK)
        return cerb__error_set(st == CERB_ECONFIG ? st : CERB_EIO,
                               "redis: no sentinel named the master \"%s\" (last: %s)",
                               rc->master_name, why);
    cerb__mutex_lock(&e->addr_mu);
    bool moved = strcmp(host, e->addr_host) != 0 || port != e->addr_port;
    if (moved) {
        if (e->addr_port != 0)
            REDIS_COUNT(e, master_switches);
        snprintf(e->addr_host, sizeof e->addr_host, "%s", host);
        e->addr_port = port;
        atomic_fetch_add(&e->addr_gen, 1);
    }
    cerb__mutex_unlock(&e->addr_mu);
    if (moved)
        CERB_LOG_W("redis %s: the sentinels name %s:%d as the master", e->where, host, port);
    return CERB_OK;
}

cerb_status cerb__redis_addr_get(cerb_engine *e, int64_t deadline_ns, char *host, size_t hlen,
                                 int *port, uint64_t *gen)
{
    if (e->rc->mode == CERB_REDIS_SENTINEL && atomic_load(&e->addr_suspect)) {
        cerb__mutex_lock(&e->disc_mu);
        int64_t now = cerb_monotime();
        /* addr_mu: the +switch-master subscriber writes the address too. */
        cerb__mutex_lock(&e->addr_mu);
        bool known = e->addr_port != 0;
        cerb__mutex_unlock(&e->addr_mu);
        if (atomic_load(&e->addr_suspect) &&
            (!known || now - e->last_discover_ns >= REDIS_REDISCOVER_MIN_MS * CERB_NS_PER_MS)) {
            e->last_discover_ns = now;
            cerb_status st = discover(e, deadline_ns);
            if (st == CERB_OK)
                atomic_store(&e->addr_suspect, false);
            else if (!known) {
                cerb__mutex_unlock(&e->disc_mu);
                return st;
            }
            /* else: keep trying the last known master until the next round */
        }
        cerb__mutex_unlock(&e->disc_mu);
    }
    cerb__mutex_lock(&e->addr_mu);
    snprintf(host, hlen, "%s", e->addr_host);
    *port = e->addr_port;
    *gen = atomic_load(&e->addr_gen);
    cerb__mutex_unlock(&e->addr_mu);
    if (*port == 0)
        return cerb__error_set(CERB_UNAVAILABLE, "redis: no master known yet");
    return CERB_OK;
}

/* ---- the +switch-master subscriber ---- */

/* Connect to sentinel i, AUTH, SUBSCRIBE +switch-master. NULL on failure. */
static redisContext *watch_connect(cerb_engine *e, size_t i)
{
    char host[256];
    int port;
    if (!split_hostport(e->rc->sentinels[i], host, sizeof host, &port))
        return NULL;
    redisContext *c = redisConnectWithTimeout(host, port, tv_ms(e->rc->connect_timeout_ms));
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv_ms(e->rc->op_timeout_ms));
    redisReply *r;
    const char *pw = e->rc->sentinel_password;
    if (pw && pw[0]) {
        r = redisCommand(c, "AUTH %s", pw);
        bool ok = r && r->type != REDIS_REPLY_ERROR;
        if (r)
            freeReplyObject(r);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    r = redisCommand(c, "SUBSCRIBE +switch-master");
    bool ok = r && r->type == REDIS_REPLY_ARRAY;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* "<name> <old ip> <old port> <new ip> <new port>": ours? Then move. */
static void watch_message(cerb_engine *e, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    char msg[600], name[256], oip[256], nip[256];
    int oport, nport;
    if (r->element[2]->len >= sizeof msg)
        return;
    memcpy(msg, r->element[2]->str, r->element[2]->len);
    msg[r->element[2]->len] = '\0';
    if (sscanf(msg, "%255s %255s %d %255s %d", name, oip, &oport, nip, &nport) != 5 ||
        strcmp(name, e->rc->master_name) != 0 || nport <= 0 || nport > 65535)
        return;
    cerb__mutex_lock(&e->addr_mu);
    bool moved = strcmp(nip, e->addr_host) != 0 || nport != e->addr_port;
    if (moved) {
        snprintf(e->addr_host, sizeof e->addr_host, "%s", nip);
        e->addr_port = nport;
        atomic_fetch_add(&e->addr_gen, 1);
        REDIS_COUNT(e, master_switches);
    }
    cerb__mutex_unlock(&e->addr_mu);
    if (moved)
        CERB_LOG_W("redis %s: +switch-master: the sentinels name %s:%d as the master",
                   e->where, nip, nport);
}

static void *watch_main(void *arg)
{
    cerb_engine *e = arg;
    redisContext *c = NULL;
    size_t next = 0;
    while (!atomic_load(&e->watch_stop)) {
        if (!c) {
            c = watch_connect(e, next);
            next = (next + 1) % e->rc->n_sentinels;
            if (!c) {
                /* The next sentinel after a pause (it may be the one down). */
                poll(NULL, 0, REDIS_WATCH_SLICE_MS);
                continue;
            }
            /* An announcement may have gone by while we were not listening. */
            cerb__redis_addr_suspect(e);
        }
        void *rep = NULL;
        if (redisGetReplyFromReader(c, &rep) != REDIS_OK) {
            redisFree(c);
            c = NULL;
            continue;
        }
        if (rep) {
            watch_message(e, rep);
            freeReplyObject(rep);
            continue;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int k = poll(&pfd, 1, REDIS_WATCH_SLICE_MS);
        if (k > 0 && redisBufferRead(c) != REDIS_OK) {
            redisFree(c);
            c = NULL;
        }
    }
    if (c)
        redisFree(c);
    return NULL;
}

cerb_status cerb__redis_watch_start(cerb_engine *e)
{
    if (e->rc->mode != CERB_REDIS_SENTINEL || e->rc->n_sentinels == 0)
        return CERB_OK;
    atomic_store(&e->watch_stop, false);
    if (pthread_create(&e->watch_thread, NULL, watch_main, e) != 0)
        return cerb__error_set(CERB_ENOMEM, "redis %s: cannot start the sentinel subscriber",
                               e->where);
    e->watch_started = true;
    return CERB_OK;
}

void cerb__redis_watch_stop(cerb_engine *e)
{
    if (!e->watch_started)
        return;
    atomic_store(&e->watch_stop, true);
    pthread_join(e->watch_thread, NULL);
    e->watch_started = false;
}
