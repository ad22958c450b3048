/*
 * redis_cluster.c — the routing instance of Redis Cluster mode
 * (redis_cluster.h): the slot map, the node instances, and every engine
 * operation sent to the master of its lock's slot with redirections
 * followed.
 *
 * The map. CLUSTER SLOTS, asked of the nodes known (the configured seeds,
 * then every node learnt), one at a time, on a short-lived connection;
 * the first full answer replaces the map. A MOVED answer sets its slot at
 * once and the map is read again on the next refresh; a refused or timed
 * out connection refreshes the map at most every REDIS_REDISCOVER_MIN_MS.
 * Nodes are only ever added (a failed master keeps its instance, idle),
 * so an instance pointer taken under the map's mutex stays valid until
 * close.
 *
 * Routing one operation: take the master of the slot (refreshing the map
 * if the slot is unknown), clear the thread's redirect record, run the
 * single-mode operation on that node's instance, and look at the record:
 *   MOVED     the slot is elsewhere: set it, go there (a new node gets an
 *             instance); a MOVED straight back to the node that sent us on
 *             (SETSLOT NODE reaches the nodes one by one) pauses first;
 *   ASK       the slot is migrating and this key is on the target: run the
 *             operation there once with ASKING before every request
 *             (redis_conn.c; the marker is only read there, redis_marker.c);
 *   TRYAGAIN, CLUSTERDOWN: pause REDIS_CLUSTER_RETRY_MS and run it again,
 *             until the operation's deadline;
 *   no record, an I/O failure whose outcome is NO: refresh the map; if the
 *             slot's master changed (a failover), run it there.
 * At most REDIS_MAX_REDIRECTS hops between two pauses: a migration's rounds
 * of ASK and TRYAGAIN are bounded by the deadline, a loop without pauses by
 * the count. Every request of an operation takes part, not only its first:
 * a single-mode operation returns as soon as one of its requests is
 * answered with a redirect (the marker read, a waiter's re-check or BLPOP
 * in the middle of its wait, a pipelined renewal), and a waiter cut short
 * that way is run again where the answer points, its queue entry having
 * moved with the slot (redis_wait.c). A redirect answer means the server
 * ran nothing, so running the operation again is safe; an operation whose
 * outcome is UNKNOWN is returned as it is, for the core to settle
 * (check_owner routes the same way).
 */
#include "internal_posix.h"

#include "redis_cluster.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_guard.h"
#include "redis_scripts.h"
#include "redis_sentinel.h"

/* ---- slots ---- */

/*
 * CRC16-CCITT (XModem), the function the Redis Cluster specification names
 * for key slots (cluster-spec, "Keys distribution model", crc16.c in the
 * Redis sources). hiredis 0.14 has none and nothing else on the machine
 * exports it; the table is generated at first use from the polynomial.
 */
static uint16_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++)
            c = (uint16_t)((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
        crc_table[i] = c;
    }
}

static uint16_t crc16(const char *s, size_t n)
{
    uint16_t c = 0;
    for (size_t i = 0; i < n; i++)
        c = (uint16_t)((c << 8) ^ crc_table[((c >> 8) ^ (unsigned char)s[i]) & 0xff]);
    return c;
}

void cerb__redis_hash_tag(const char *key, size_t len, size_t *start, size_t *tlen)
{
    const char *o = memchr(key, '{', len);
    if (o) {
        size_t s = (size_t)(o - key) + 1;
        const char *c = memchr(key + s, '}', len - s);
        if (c && c > key + s) {
            *start = s;
            *tlen = (size_t)(c - (key + s));
            return;
        }
    }
    *start = 0;
    *tlen = len;
}

unsigned cerb__redis_key_slot(const char *key, size_t len)
{
    size_t s, n;
    pthread_once(&crc_once, crc_init);
    cerb__redis_hash_tag(key, len, &s, &n);
    return crc16(key + s, n) & (REDIS_SLOTS - 1);
}

/* Each slot's marker tag: the smallest number whose decimal text hashes to
 * it (every slot is covered below 110 000). */
static void make_tags(struct redis_cluster *cl)
{
    int left = REDIS_SLOTS;
    for (int i = 0; i < REDIS_SLOTS; i++)
        cl->tag[i] = UINT32_MAX;
    for (uint32_t n = 0; left > 0; n++) {
        char b[16];
        int l = snprintf(b, sizeof b, "%u", (unsigned)n);
        unsigned s = cerb__redis_key_slot(b, (size_t)l);
        if (cl->tag[s] == UINT32_MAX) {
            cl->tag[s] = n;
            left--;
        }
    }
}

unsigned cerb__redis_slot_tag(unsigned slot)
{
    for (unsigned n = 0;; n++) {
        char b[16];
        int l = snprintf(b, sizeof b, "%u", n);
        if (cerb__redis_key_slot(b, (size_t)l) == slot)
            return n;
    }
}

/* ---- nodes and the map ---- */

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* The node host:port, made (with its instance) if new; its index, or -1
 * with the error set. Caller holds cl->mu. */
static int node_index(cerb_engine *top, const char *host, int port)
{
    struct redis_cluster *cl = top->cl;
    for (int i = 0; i < cl->n_nodes; i++)
        if (cl->nodes[i]->port == port && strcmp(cl->nodes[i]->host, host) == 0)
            return i;
    if (cl->n_nodes >= REDIS_CLUSTER_MAX_NODES) {
        cerb__error_set(CERB_EIO, "redis %s: more than %d nodes", top->where,
                        REDIS_CLUSTER_MAX_NODES);
        return -1;
    }
    struct redis_cluster_node *n = cerb__calloc(1, sizeof *n);
    if (!n) {
        cerb__error_set(CERB_ENOMEM, "redis: out of memory for a cluster node");
        return -1;
    }
    snprintf(n->host, sizeof n->host, "%s", host);
    n->port = port;
    if (cerb__redis_node_new(top, n) != CERB_OK) {
        cerb__free(n);
        return -1;
    }
    cl->nodes[cl->n_nodes] = n;
    CERB_LOG_D("redis %s: node %s:%d", top->where, host, port);
    return cl->n_nodes++;
}

/* "host:port" → host, port. */
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

/* Ask one node for CLUSTER SLOTS and install the answer. */
static cerb_status slots_from(cerb_engine *top, const char *host, int port, int64_t deadline_ns)
{
    const struct cerb_redis_config *rc = top->rc;
    int64_t left = cerb__ms_left(deadline_ns);
    int64_t cms = left < rc->connect_timeout_ms ? left : rc->connect_timeout_ms;
    if (cms <= 0)
        return cerb__error_set(CERB_TIMEOUT, "redis %s: no time left to read the slot map",
                               top->where);
    redisContext *c = redisConnectWithTimeout(host, port, tv_ms(cms));
    if (!c)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for a connection");
    if (c->err) {
        cerb_status st = cerb__error_set(CERB_EIO, "redis %s:%d: connect: %s", host, port,
                                         c->errstr);
        redisFree(c);
        return st;
    }
    int64_t oms = left < rc->op_timeout_ms ? left : rc->op_timeout_ms;
    redisSetTimeout(c, tv_ms(oms > 0 ? oms : 1));
    redisReply *r = NULL;
    cerb_status st = CERB_OK;
    if (rc->password && rc->password[0]) {
        r = rc->user && rc->user[0] ? redisCommand(c, "AUTH %s %s", rc->user, rc->password)
                                    : redisCommand(c, "AUTH %s", rc->password);
        if (!r || r->type == REDIS_REPLY_ERROR)
            st = cerb__error_set(CERB_EIO, "redis %s:%d: AUTH refused", host, port);
        if (r)
            freeReplyObject(r);
        r = NULL;
    }
    if (st == CERB_OK)
        r = redisCommand(c, "CLUSTER SLOTS");
    if (st == CERB_OK && (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0))
        st = cerb__error_set(r && r->type == REDIS_REPLY_ERROR ? CERB_ECONFIG : CERB_EIO,
                             "redis %s:%d: CLUSTER SLOTS: %s", host, port,
                             !r ? (c->errstr[0] ? c->errstr : "no answer")
                             : r->type == REDIS_REPLY_ERROR ? r->str : "no slots");
    struct redis_cluster *cl = top->cl;
    int covered = 0;
    if (st == CERB_OK) {
        int16_t *map = cerb__malloc(sizeof cl->slot_node);
        if (!map)
            st = cerb__error_set(CERB_ENOMEM, "redis: out of memory for the slot map");
        for (int i = 0; map && i < REDIS_SLOTS; i++)
            map[i] = -1;
        cerb__mutex_lock(&cl->mu);
        for (size_t i = 0; st == CERB_OK && i < r->elements; i++) {
            redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
                e->element[0]->type != REDIS_REPLY_INTEGER ||
                e->element[1]->type != REDIS_REPLY_INTEGER ||
                e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
                e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
                e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
                continue;
            long long lo = e->element[0]->integer, hi = e->element[1]->integer;
            const char *mh = e->element[2]->element[0]->str;
            int mp = (int)e->element[2]->element[1]->integer;
            if (lo < 0 || hi >= REDIS_SLOTS || lo > hi || mp <= 0 || mp > 65535)
                continue;
            /* An empty host means "the node you asked". */
            int ni = node_index(top, mh[0] ? mh : host, mp);
            if (ni < 0) {
                st = CERB_ENOMEM;
                break;
            }
            for (long long sl = lo; sl <= hi; sl++)
                map[sl] = (int16_t)ni;
            covered += (int)(hi - lo + 1);
        }
        if (st == CERB_OK && covered > 0)
            memcpy(cl->slot_node, map, sizeof cl->slot_node);
        cerb__mutex_unlock(&cl->mu);
        cerb__free(map);
    }
    if (r)
        freeReplyObject(r);
    redisFree(c);
    if (st == CERB_OK && covered < REDIS_SLOTS)
        CERB_LOG_W("redis %s: %s:%d serves a map of %d slots of %d", top->where, host, port,
                   covered, REDIS_SLOTS);
    return st;
}

/*
 * Read the map again: from the nodes known, then the seeds. `force` skips
 * the rate limit (open, a slot no node serves).
 */
static cerb_status refresh(cerb_engine *top, int64_t deadline_ns, bool force)
{
    struct redis_cluster *cl = top->cl;
    cerb__mutex_lock(&cl->refresh_mu);
    int64_t now = cerb_monotime();
    if (!force && now - cl->last_refresh_ns < REDIS_REDISCOVER_MIN_MS * CERB_NS_PER_MS) {
        cerb__mutex_unlock(&cl->refresh_mu);
        return CERB_OK;
    }
    cl->last_refresh_ns = now;
    char why[CERB_ERROR_MAX] = "no node to ask";
    cerb_status st = CERB_UNAVAILABLE;
    /* Known nodes first (a seed may be the one that died). */
    cerb__mutex_lock(&cl->mu);
    int n = cl->n_nodes;
    cerb__mutex_unlock(&cl->mu);
    /* Starting with the node that answered last: a dead one (a failed
     * master keeps its place in the list) is not tried first every time. */
    for (int k = 0; k < n && st != CERB_OK; k++) {
        int i = (cl->refresh_next + k) % n;
        char host[256];
        int port;
        cerb__mutex_lock(&cl->mu);
        snprintf(host, sizeof host, "%s", cl->nodes[i]->host);
        port = cl->nodes[i]->port;
        cerb__mutex_unlock(&cl->mu);
        st = slots_from(top, host, port, deadline_ns);
        if (st != CERB_OK)
            cerb__error_copy(why, sizeof why);
        else
            cl->refresh_next = i;
    }
    for (size_t i = 0; i < top->rc->n_nodes && st != CERB_OK; i++) {
        char host[256];
        int port;
        if (!split_hostport(top->rc->nodes[i], host, sizeof host, &port))
            continue;
        st = slots_from(top, host, port, deadline_ns);
        if (st != CERB_OK)
            cerb__error_copy(why, sizeof why);
    }
    cerb__mutex_unlock(&cl->refresh_mu);
    if (st != CERB_OK)
        return cerb__error_set(st == CERB_ECONFIG ? st : CERB_EIO,
                               "redis %s: no node gave the slot map (last: %s)", top->where, why);
    return CERB_OK;
}

/* The instance serving slot s now (reading the map again if unknown, at
 * most every REDIS_REDISCOVER_MIN_MS), or NULL with the error set. */
static cerb_engine *node_for(cerb_engine *top, int slot, int64_t deadline_ns)
{
    struct redis_cluster *cl = top->cl;
    for (int round = 0; round < 2; round++) {
        cerb__mutex_lock(&cl->mu);
        int i = cl->slot_node[slot];
        cerb_engine *e = i >= 0 ? cl->nodes[i]->e : NULL;
        cerb__mutex_unlock(&cl->mu);
        if (e)
            return e;
        /* Rate-limited: a cluster that lost a slot is not asked again for
         * every lock of a renewal batch. */
        if (round == 0 && refresh(top, deadline_ns, false) != CERB_OK)
            return NULL;
    }
    cerb__error_set(CERB_UNAVAILABLE, "redis %s: no master serves slot %d", top->where, slot);
    return NULL;
}

/* MOVED: slot s is on host:port now. The instance, or NULL. */
static cerb_engine *moved(cerb_engine *top, int slot, const char *host, int port)
{
    struct redis_cluster *cl = top->cl;
    cerb__mutex_lock(&cl->mu);
    int i = node_index(top, host, port);
    cerb_engine *e = NULL;
    if (i >= 0) {
        if (slot >= 0)
            cl->slot_node[slot] = (int16_t)i;
        e = cl->nodes[i]->e;
    }
    cerb__mutex_unlock(&cl->mu);
    return e;
}

cerb_status cerb__redis_cluster_open(cerb_engine *top)
{
    if (top->rc->n_nodes == 0)
        return cerb__error_set(CERB_ECONFIG, "redis.mode = \"cluster\" needs redis.nodes");
    struct redis_cluster *cl = cerb__calloc(1, sizeof *cl);
    if (!cl)
        return cerb__error_set(CERB_ENOMEM, "redis: out of memory for the slot map");
    cerb__mutex_init(&cl->mu);
    cerb__mutex_init(&cl->refresh_mu);
    cerb__mutex_init(&cl->mk_mu);
    for (int i = 0; i < REDIS_SLOTS; i++)
        cl->slot_node[i] = -1;
    make_tags(cl);
    top->cl = cl;
    int64_t deadline = cerb__deadline_in(top->rc->connect_timeout_ms + top->rc->op_timeout_ms);
    cerb_status st = refresh(top, deadline, true);
    if (st != CERB_OK)
        return st;
    /* The scripts, loaded once through the master of slot 0: their SHAs are
     * the same on every node (a node without them answers NOSCRIPT, and
     * the script layer loads them there). */
    cerb_engine *n = node_for(top, 0, deadline);
    if (!n)
        return cerb__error_set(CERB_EIO, "redis %s: %s", top->where, cerb_last_error());
    struct redis_conn *c;
    st = cerb__redis_get(n, deadline, &c);
    if (st == CERB_OK) {
        st = cerb__redis_scripts_load(n, c);
        cerb__redis_put(n, c);
    }
    if (st != CERB_OK)
        return st;
    memcpy(top->sha, n->sha, sizeof top->sha);
    cerb__mutex_lock(&cl->mu);
    for (int i = 0; i < cl->n_nodes; i++)
        memcpy(cl->nodes[i]->e->sha, n->sha, sizeof n->sha);
    cerb__mutex_unlock(&cl->mu);
    return CERB_OK;
}

void cerb__redis_cluster_close(cerb_engine *top)
{
    struct redis_cluster *cl = top->cl;
    if (!cl)
        return;
    for (int i = 0; i < cl->n_nodes; i++) {
        cerb__redis_node_close(cl->nodes[i]->e);
        cerb__free(cl->nodes[i]);
    }
    for (int i = 0; i < REDIS_SLOTS; i++)
        cerb__free(cl->mk[i]);
    cerb__mutex_destroy(&cl->mu);
    cerb__mutex_destroy(&cl->refresh_mu);
    cerb__mutex_destroy(&cl->mk_mu);
    cerb__free(cl);
    top->cl = NULL;
}

/* ---- routing ---- */

/* One operation on one node instance. */
typedef cerb_status (*node_op)(cerb_engine *e, void *arg, cerb_outcome *oc);

/* A bounded back-off before asking again (TRYAGAIN: the migration moves
 * the rest of the keys in a moment), not a synchronisation; never past the
 * deadline. */
static void pause_ms(int64_t ms, int64_t deadline_ns)
{
    if (deadline_ns != CERB_DEADLINE_NEVER) {
        int64_t left = cerb__ms_left(deadline_ns);
        if (left < ms)
            ms = left > 0 ? left : 0;
    }
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/*
 * Run op for slot until it gets an answer, following redirects. *last (when
 * not NULL) is the kind of the last redirect that went unfollowed: the
 * deadline came while the slot was TRYAGAIN or CLUSTERDOWN, or the hops ran
 * out; NONE when the answer is the operation's own.
 *
 * Only a status of CERB_EIO with outcome NO is a redirect to follow: one
 * request was answered with it and the operation returned at once, so
 * nothing ran. An operation that ended otherwise (a timed-out wait, an
 * interrupt) may have had a follow-up request redirected; it is done.
 *
 * Hops are counted between pauses: a chain of MOVED and ASK answers without
 * progress (two nodes that disagree about the slot) ends after
 * REDIS_MAX_REDIRECTS, while a migration's ASK, TRYAGAIN, ASK ... rounds,
 * each with a pause, go on until the deadline. A MOVED back to the node that
 * just sent us on is such a disagreement for a moment (SETSLOT NODE reaches
 * the nodes one at a time): pause first, as for TRYAGAIN.
 */
static cerb_status route_ex(cerb_engine *top, int slot, int64_t deadline_ns, node_op op,
                            void *arg, enum redis_redirect_kind *last)
{
    cerb_engine *e = node_for(top, slot, deadline_ns);
    cerb_engine *ask = NULL, *from = NULL;
    int hops = 0;
    if (last)
        *last = REDIS_REDIR_NONE;
    if (!e)
        return CERB_UNAVAILABLE;
    for (;;) {
        cerb_outcome oc = CERB_OUTCOME_NO;
        struct redis_redirect rd;
        cerb_engine *ran = ask ? ask : e;
        cerb__redis_redirect_clear();
        cerb__redis_set_asking(ask != NULL);
        cerb_status st = op(ran, arg, &oc);
        cerb__redis_set_asking(false);
        cerb__redis_redirect_take(&rd);
        ask = NULL;
        if (st == CERB_OK || st == CERB_NOT_OWNER || st == CERB_BUSY || oc != CERB_OUTCOME_NO)
            return st;
        if (st != CERB_EIO)
            rd.kind = REDIS_REDIR_NONE;
        bool time_left = deadline_ns == CERB_DEADLINE_NEVER || cerb__ms_left(deadline_ns) > 0;
        if (rd.kind != REDIS_REDIR_NONE)
            CERB_LOG_D("redis %s: slot %d: %s%s%s%.0d", top->where, slot,
                       rd.kind == REDIS_REDIR_MOVED  ? "MOVED to "
                       : rd.kind == REDIS_REDIR_ASK  ? "ASK "
                       : rd.kind == REDIS_REDIR_DOWN ? "CLUSTERDOWN"
                                                     : "TRYAGAIN",
                       rd.kind <= REDIS_REDIR_ASK ? rd.host : "",
                       rd.kind <= REDIS_REDIR_ASK ? ":" : "", rd.kind <= REDIS_REDIR_ASK ? rd.port : 0);
        if (last)
            *last = rd.kind;
        switch (rd.kind) {
        case REDIS_REDIR_MOVED:
        case REDIS_REDIR_ASK: {
            bool set = rd.kind == REDIS_REDIR_MOVED && rd.slot == slot;
            cerb_engine *to = moved(top, set ? slot : -1, rd.host, rd.port);
            if (!to)
                return st;
            if (rd.kind == REDIS_REDIR_MOVED) {
                /* Other slots may have moved with it. */
                cerb__mutex_lock(&top->cl->refresh_mu);
                top->cl->last_refresh_ns = 0;
                cerb__mutex_unlock(&top->cl->refresh_mu);
                if (to == from && time_left) {
                    pause_ms(REDIS_CLUSTER_RETRY_MS, deadline_ns);
                    hops = 0;
                }
                from = ran;
                e = to;
            } else {
                from = ran;
                ask = to;
            }
            if (++hops > REDIS_MAX_REDIRECTS)
                return st;
            continue;
        }
        case REDIS_REDIR_TRYAGAIN:
        case REDIS_REDIR_DOWN:
            if (!time_left)
                return st;
            pause_ms(REDIS_CLUSTER_RETRY_MS, deadline_ns);
            hops = 0;
            from = NULL;
            if (rd.kind == REDIS_REDIR_DOWN) {
                refresh(top, deadline_ns, false);
                cerb_engine *n = node_for(top, slot, deadline_ns);
                if (n)
                    e = n;
            }
            continue;
        case REDIS_REDIR_NONE:
            break;
        }
        /* No redirect: an I/O failure (or a server refusal) whose request
         * did not run. The master may have failed over: read the map and
         * go again if the slot has another master now. */
        if (st != CERB_EIO && st != CERB_UNAVAILABLE)
            return st; /* a wait that timed out, an interrupt, a refusal */
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        if (!time_left || refresh(top, deadline_ns, false) != CERB_OK)
            return cerb__error_set(st, "%s", why);
        cerb_engine *n = node_for(top, slot, deadline_ns);
        if (!n || n == e)
            return cerb__error_set(st, "%s", why);
        e = n;
        if (++hops > REDIS_MAX_REDIRECTS)
            return cerb__error_set(st, "%s", why);
    }
}

static cerb_status route(cerb_engine *top, int slot, int64_t deadline_ns, node_op op, void *arg)
{
    return route_ex(top, slot, deadline_ns, op, arg, NULL);
}

cerb_status cerb__redis_cl_route(cerb_engine *top, const char *key, size_t len,
                                 int64_t deadline_ns,
                                 cerb_status (*op)(cerb_engine *, void *, cerb_outcome *),
                                 void *arg)
{
    return route(top, (int)cerb__redis_key_slot(key, len), deadline_ns, op, arg);
}

static int lock_slot(cerb_engine *top, const char *name)
{
    const char *prefix = top->rc->prefix ? top->rc->prefix : "";
    size_t pl = strlen(prefix), nl = strlen(name);
    char buf[512], *k = pl + nl <= sizeof buf ? buf : cerb__malloc(pl + nl);
    if (!k)
        return 0; /* out of memory: any slot; the node answers MOVED */
    memcpy(k, prefix, pl);
    memcpy(k + pl, name, nl);
    int s = (int)cerb__redis_key_slot(k, pl + nl);
    if (k != buf)
        cerb__free(k);
    return s;
}

static int64_t op_deadline(cerb_engine *top)
{
    return cerb__deadline_in(top->rc->op_timeout_ms);
}

/* acquire */
struct acq_arg {
    cerb_engine_lock *lk;
    int64_t deadline_ns;
    const atomic_int *intr;
    cerb_grant *g;
};

static cerb_status acq_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct acq_arg *a = arg;
    /* A wait that redirects keep sending back here (a slot left half
     * migrated, with no deadline) still ends on an interrupt. */
    if (a->intr && atomic_load(a->intr)) {
        *oc = a->g->outcome = CERB_OUTCOME_NO;
        return cerb__error_set(CERB_INTERRUPTED, "wait for \"%s\" interrupted", a->lk->name);
    }
    cerb_status st = cerb__redis_op_acquire(e, a->lk, a->deadline_ns, a->intr, a->g);
    *oc = a->g->outcome;
    return st;
}

/* Leave the queue of lk's name (a waiter giving up, redis_wait.c). */
static cerb_status leave_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    cerb_engine_lock *lk = arg;
    struct redis_keys ks;
    cerb_status st = cerb__redis_keys_init(&ks, e, lk->name, lk->token);
    if (st == CERB_OK) {
        st = cerb__redis_leave(e, &ks, lk);
        cerb__redis_keys_free(&ks);
    }
    /* The leave is run again only after a redirect (it did not run). */
    *oc = st == CERB_OK || cerb__redis_redirect_peek() != REDIS_REDIR_NONE ? CERB_OUTCOME_NO
                                                                            : CERB_OUTCOME_UNKNOWN;
    return st;
}

/* Was our token left in the queue by a wait a redirect cut short
 * (redis_lock_priv.queued)? Clears the mark. */
static bool queued_take(cerb_engine *top, cerb_engine_lock *lk)
{
    struct redis_lock_priv *p = lk->priv;
    if (!p)
        return false;
    cerb__mutex_lock(top->wmu);
    bool q = p->queued;
    p->queued = false;
    cerb__mutex_unlock(top->wmu);
    return q;
}

/*
 * acquire, routed like every operation: a wait whose re-check or BLPOP is
 * redirected comes back here and goes on where the answer points (our
 * queue entry moved with the slot). When it ends without the lock and a
 * redirect cut it (or its leave) short, the token may still be queued on
 * the node it was cut on: the leave is routed here, and until it is
 * confirmed the outcome is UNKNOWN (the entry lapses by its deadline, a
 * lock handed to us by its short lease). A wait whose deadline came while
 * the slot answered TRYAGAIN timed out: the server kept saying "in a
 * moment", which is no failure of the engine.
 */
cerb_status cerb__redis_cl_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                   const atomic_int *interrupted, cerb_grant *grant)
{
    struct acq_arg a = {lk, deadline_ns, interrupted, grant};
    int slot = lock_slot(e, lk->name);
    enum redis_redirect_kind last;
    /* A try (deadline 0) still gets the operation timeout to find its node. */
    int64_t dl = deadline_ns == 0 ? op_deadline(e) : deadline_ns;
    cerb_status st = route_ex(e, slot, dl, acq_op, &a, &last);
    if (queued_take(e, lk) && st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        cerb_status ls = route(e, slot, op_deadline(e), leave_op, lk);
        if (ls != CERB_OK) {
            grant->outcome = CERB_OUTCOME_UNKNOWN;
            return cerb__error_set(st, "%s (and leaving the queue failed: %s)", why,
                                   cerb_last_error());
        }
        /* Left: nothing held or queued, whatever the lost answer was. */
        grant->outcome = CERB_OUTCOME_NO;
        cerb__error_set(st, "%s", why);
    }
    if (st == CERB_EIO && deadline_ns != 0 && last == REDIS_REDIR_TRYAGAIN &&
        grant->outcome == CERB_OUTCOME_NO && cerb__ms_left(deadline_ns) <= 0) {
        cerb__error_prefix("wait for \"%s\" timed out while its slot was being migrated",
                           lk->name);
        st = CERB_TIMEOUT;
    }
    return st;
}

/* renew, check */
struct grant_arg {
    cerb_engine_lock *lk;
    cerb_grant *g;
};

static cerb_status renew_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct grant_arg *a = arg;
    cerb_status st = cerb__redis_op_renew(e, a->lk, a->g);
    *oc = a->g->outcome;
    return st;
}

cerb_status cerb__redis_cl_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct grant_arg a = {lk, grant};
    return route(e, lock_slot(e, lk->name), op_deadline(e), renew_op, &a);
}

static cerb_status check_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct grant_arg *a = arg;
    cerb_status st = cerb__redis_op_check(e, a->lk, a->g);
    *oc = a->g->outcome;
    return st;
}

cerb_status cerb__redis_cl_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant)
{
    struct grant_arg a = {lk, grant};
    return route(e, lock_slot(e, lk->name), op_deadline(e), check_op, &a);
}

/* release: its outcome is not reported; only a redirect is run again. */
static cerb_status release_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    cerb_status st = cerb__redis_op_release(e, arg);
    *oc = st == CERB_OK || cerb__redis_redirect_peek() != REDIS_REDIR_NONE ? CERB_OUTCOME_NO
                                                                           : CERB_OUTCOME_UNKNOWN;
    return st;
}

cerb_status cerb__redis_cl_release(cerb_engine *e, cerb_engine_lock *lk)
{
    return route(e, lock_slot(e, lk->name), op_deadline(e), release_op, lk);
}

static cerb_status held_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    *oc = CERB_OUTCOME_NO;
    return cerb__redis_op_held(e, arg);
}

cerb_status cerb__redis_cl_held(cerb_engine *e, const char *name)
{
    return route(e, lock_slot(e, name), op_deadline(e), held_op, (void *)(uintptr_t)name);
}

/* inspect: read on the master of the name's slot. */
struct inspect_arg {
    const char *name;
    struct cerb_holders *out;
};

static cerb_status inspect_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct inspect_arg *a = arg;
    *oc = CERB_OUTCOME_NO;
    return cerb__redis_op_inspect(e, a->name, a->out);
}

cerb_status cerb__redis_cl_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct inspect_arg a = {name, out};
    return route(e, lock_slot(e, name), op_deadline(e), inspect_op, &a);
}

/* election (redis_election.c): proclaim and leader on the master of the
 * name's slot, like check and inspect. */
struct proclaim_arg {
    cerb_engine_lock *lk;
    const void *value;
    size_t n;
    cerb_outcome *oc;
};

static cerb_status proclaim_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct proclaim_arg *a = arg;
    cerb_status st = cerb__redis_op_proclaim(e, a->lk, a->value, a->n, a->oc);
    *oc = *a->oc;
    return st;
}

cerb_status cerb__redis_cl_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *value,
                                    size_t n, cerb_outcome *outcome)
{
    struct proclaim_arg a = {lk, value, n, outcome};
    return route(e, lock_slot(e, lk->name), op_deadline(e), proclaim_op, &a);
}

struct leader_arg {
    const char *name;
    int variant;
    cerb_leader_rec *out;
};

static cerb_status leader_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct leader_arg *a = arg;
    *oc = CERB_OUTCOME_NO;
    cerb__leader_rec_clear(a->out); /* a redirected try may have filled nothing, or more */
    return cerb__redis_op_leader(e, a->name, a->variant, a->out);
}

cerb_status cerb__redis_cl_leader(cerb_engine *e, const char *name, int variant,
                                  cerb_leader_rec *out)
{
    struct leader_arg a = {name, variant, out};
    return route(e, lock_slot(e, name), op_deadline(e), leader_op, &a);
}

/* probe: the lock path on the master of the probe name's slot. */
static cerb_status probe_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    *oc = CERB_OUTCOME_NO;
    return cerb__redis_op_probe(e, *(int64_t *)arg);
}

cerb_status cerb__redis_cl_probe(cerb_engine *e, int64_t timeout_ms)
{
    return route(e, lock_slot(e, e->probe_name), cerb__deadline_in(timeout_ms), probe_op,
                 &timeout_ms);
}

/*
 * Renewals in a batch: grouped by node, one pipeline per node as in single
 * mode; an item that failed with something other than a definitive answer
 * (a redirect in the middle of a migration, a failover) is renewed again
 * alone, routed.
 */
void cerb__redis_cl_renew_batch(cerb_engine *top, cerb_renew_item *items, size_t n)
{
    struct redis_cluster *cl = top->cl;
    cerb_renew_item *tmp = cerb__malloc(n * sizeof *tmp);
    size_t *idx = cerb__malloc(n * sizeof *idx);
    cerb_engine **owner = cerb__malloc(n * sizeof *owner);
    if (!tmp || !idx || !owner) {
        for (size_t i = 0; i < n; i++)
            items[i].st = cerb__redis_cl_renew(top, items[i].lk, &items[i].grant);
        cerb__free(tmp);
        cerb__free(idx);
        cerb__free(owner);
        return;
    }
    for (size_t i = 0; i < n; i++)
        owner[i] = node_for(top, lock_slot(top, items[i].lk->name), op_deadline(top));
    cerb__mutex_lock(&cl->mu);
    int nn = cl->n_nodes;
    cerb__mutex_unlock(&cl->mu);
    for (int ni = -1; ni < nn; ni++) {
        cerb_engine *e = NULL;
        if (ni >= 0) {
            cerb__mutex_lock(&cl->mu);
            e = cl->nodes[ni]->e;
            cerb__mutex_unlock(&cl->mu);
        }
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (owner[i] == e) {
                tmp[m] = items[i];
                idx[m++] = i;
            }
        if (m == 0)
            continue;
        if (e) {
            cerb__redis_op_renew_batch(e, tmp, m);
        } else {
            for (size_t j = 0; j < m; j++)
                tmp[j].st = CERB_UNAVAILABLE;
        }
        for (size_t j = 0; j < m; j++) {
            cerb_renew_item *it = &items[idx[j]];
            *it = tmp[j];
            if (it->st != CERB_OK && it->st != CERB_NOT_OWNER &&
                it->grant.outcome == CERB_OUTCOME_NO) {
                memset(&it->grant, 0, sizeof it->grant);
                it->grant.outcome = CERB_OUTCOME_NO;
                it->st = cerb__redis_cl_renew(top, it->lk, &it->grant);
            }
        }
    }
    cerb__free(tmp);
    cerb__free(idx);
    cerb__free(owner);
}

/* ---- guard records: one key each, routed by its slot ---- */

static int guard_slot(cerb_engine *top, const cerb_guard_rec *rec)
{
    char key[1024];
    size_t len;
    if (cerb__redis_guard_key(top, rec, key, sizeof key, &len) != CERB_OK)
        return 0;
    return (int)cerb__redis_key_slot(key, len);
}

struct guard_arg {
    const cerb_guard_rec *rec;
    cerb_grant *g;
    void **result;
    size_t *result_len;
    int ok;
    const void *res;
    size_t len;
    int64_t keep_ms;
    cerb_outcome *oc;
    cerb_guard_found *found;
};

static cerb_status gbegin_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct guard_arg *a = arg;
    cerb_status st = cerb__redis_guard_begin(e, a->rec, a->g, a->result, a->result_len);
    *oc = a->g->outcome;
    return st;
}

cerb_status cerb__redis_cl_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                       void **result, size_t *result_len)
{
    struct guard_arg a = {.rec = rec, .g = g, .result = result, .result_len = result_len};
    return route(e, guard_slot(e, rec), op_deadline(e), gbegin_op, &a);
}

static cerb_status grenew_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct guard_arg *a = arg;
    cerb_status st = cerb__redis_guard_renew(e, a->rec, a->g);
    *oc = a->g->outcome;
    return st;
}

cerb_status cerb__redis_cl_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    struct guard_arg a = {.rec = rec, .g = g};
    return route(e, guard_slot(e, rec), op_deadline(e), grenew_op, &a);
}

static cerb_status gfinish_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct guard_arg *a = arg;
    cerb_status st = cerb__redis_guard_finish(e, a->rec, a->ok, a->res, a->len, a->keep_ms, a->oc);
    *oc = a->oc ? *a->oc : CERB_OUTCOME_NO;
    return st;
}

cerb_status cerb__redis_cl_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                        const void *result, size_t len, int64_t keep_ms,
                                        cerb_outcome *oc)
{
    struct guard_arg a = {.rec = rec, .ok = ok, .res = result, .len = len, .keep_ms = keep_ms,
                          .oc = oc};
    return route(e, guard_slot(e, rec), op_deadline(e), gfinish_op, &a);
}

static cerb_status gcheck_op(cerb_engine *e, void *arg, cerb_outcome *oc)
{
    struct guard_arg *a = arg;
    *oc = CERB_OUTCOME_NO;
    return cerb__redis_guard_check(e, a->rec, a->found);
}

cerb_status cerb__redis_cl_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                       cerb_guard_found *found)
{
    struct guard_arg a = {.rec = rec, .found = found};
    return route(e, guard_slot(e, rec), op_deadline(e), gcheck_op, &a);
}

void cerb__redis_cl_stats(cerb_engine *top, struct redis_counters *sum)
{
    struct redis_cluster *cl = top->cl;
    memset(sum, 0, sizeof *sum);
    cerb__mutex_lock(&cl->mu);
    for (int i = 0; i < cl->n_nodes; i++) {
        struct redis_counters *c = &cl->nodes[i]->e->stats;
        cerb__redis_counters_add(sum, c);
    }
    cerb__mutex_unlock(&cl->mu);
}
