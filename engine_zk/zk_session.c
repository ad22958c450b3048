/*
 * zk_session.c — the engine's ZooKeeper session and the keeper thread that
 * watches over it.
 *
 * States of a session, as the C client reports them to our session watcher
 * (on its completion thread; the watcher only records and signals):
 *
 *   connecting ──connected──▶ CONNECTED ──socket lost──▶ DISCONNECTED
 *        ▲                        ▲                          │
 *        │                        └──reconnected, same id────┤
 *        │                                                   │
 *        └──── new session ◀── REPLACE ◀── expired (told on reconnect),
 *                                          auth failed, or still
 *                                          disconnected when its
 *                                          timeout has surely passed
 *
 * The keeper thread turns these into what the core needs:
 *  - DISCONNECTED: event SUSPECT for every hold; renew() answers CERB_EIO.
 *  - reconnected with the same session: a heartbeat at once, then every
 *    held node is checked with one pipelined batch of exists (gone, or no
 *    longer ephemeral of this session: event LOST for that hold), then
 *    VALID for every hold.
 *  - REPLACE: the session's generation ends: event LOST for every hold
 *    (name and token NULL), blocked waiters are woken to start over, the
 *    handle is unhooked and closed (without holding any lock: closing can
 *    block for seconds) and a new session is made; acquisitions wait for it
 *    to connect. The client library learns of an expiry only when it
 *    reconnects, so the keeper does not wait for that: once the last
 *    answered request was sent more than the negotiated timeout (less the
 *    drift) ago and the session is still disconnected, the server may have
 *    expired it and someone else may hold our locks, so it is given up.
 *  - every sixth of the negotiated timeout while connected: a heartbeat
 *    (exists on "/"), whose answer moves the session's last_ok_ns. The C
 *    client pings on its own too, but we cannot see when its pings are
 *    answered, and renew() must report a send time the server has
 *    acknowledged (ZK_HEARTBEATS in zk_session.h says why a sixth).
 *  - a new session that does not connect within the connect timeout is
 *    closed and another made after a backoff (ZK_START_BACKOFF_*), so a
 *    dead ensemble costs a few connection attempts, not a spinning core.
 *  - pending deletions (zk_cleanup.c) are retried whenever connected, and
 *    so are the "holding" marks of held nodes that did not land
 *    (zk_mutex.c, announce), every ZK_MARK_RETRY_MS, a few times each.
 * Events go to the core from the keeper thread only, never from the C
 * client's threads, which must not block.
 */
#include "internal_posix.h"

#include "zk_session.h"

#include <errno.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "zk_call.h"
#include "zk_errors.h"
#include "zk_mutex.h"

/* Marks of held nodes that did not land are sent again this often. */
#define ZK_MARK_RETRY_MS 200
/* How often the keeper looks around at the latest. */
#define ZK_KEEPER_MAX_SLEEP_MS 1000
/* A new session that does not connect within the connect timeout is
 * closed, and the next one made after a backoff doubling between these
 * (a caller waiting for a connection shortens it to the minimum): with a
 * host list of several servers that all refuse, the C client reconnects in
 * a tight loop that would otherwise burn a core for as long as the
 * ensemble is down. */
#define ZK_START_BACKOFF_MIN_MS 500
#define ZK_START_BACKOFF_MAX_MS 8000

/* ---- small helpers ---- */

void cerb__zk_wake_waiters_locked(cerb_engine *e)
{
    for (struct zk_lock_priv *p = e->waiting; p; p = p->next)
        if (p->w)
            cerb__cond_signal(&p->w->cond);
}

void cerb__zk_keeper_poke_locked(cerb_engine *e, unsigned pend)
{
    e->pend |= pend;
    cerb__cond_signal(&e->keeper_cond);
}

int64_t cerb__zk_call_deadline(cerb_engine *e, int64_t bound_ns)
{
    /* The negotiated timeout, which the server may have raised above ours:
     * the C client drops a silent connection after 2/3 of that one. */
    int64_t session = atomic_load(&e->max_timeout_ms);
    if (session < e->zc->session_timeout_ms)
        session = e->zc->session_timeout_ms;
    int64_t guard = cerb__deadline_in(session + e->zc->connect_timeout_ms + 2000);
    return bound_ns > 0 && bound_ns < guard ? bound_ns : guard;
}

struct zk_session *cerb__zk_session_begin(cerb_engine *e)
{
    if (pthread_rwlock_rdlock(&e->zh_lock) != 0)
        abort();
    return e->cur;
}

void cerb__zk_session_end(cerb_engine *e)
{
    if (pthread_rwlock_unlock(&e->zh_lock) != 0)
        abort();
}

static void wrlock(cerb_engine *e)
{
    if (pthread_rwlock_wrlock(&e->zh_lock) != 0)
        abort();
}

void cerb__zk_state_locked(cerb_engine *e, struct zk_state *out)
{
    struct zk_session *s = e->cur;
    memset(out, 0, sizeof *out);
    out->gen = e->gen_counter;
    if (s && s->gen == e->gen_counter) {
        out->id = s->id;
        out->connected = s->connected;
        out->dead = s->dead;
        out->timeout_ms = s->timeout_ms;
        out->last_ok_ns = atomic_load(&s->last_ok_ns);
    } else {
        out->dead = false; /* being replaced: not connected yet */
    }
}

void cerb__zk_state(cerb_engine *e, struct zk_state *out)
{
    cerb__mutex_lock(&e->mu);
    cerb__zk_state_locked(e, out);
    cerb__mutex_unlock(&e->mu);
}

static void emit(cerb_engine *e, cerb_engine_event ev, const char *name, const char *token)
{
    if (e->env.event)
        e->env.event(e->env.ud, ev, name, token);
}

/* ---- the C client's session events (its completion thread) ---- */

static void session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct zk_session *s = ctx;
    cerb_engine *e = s->e;
    (void)path;

    if (type != ZOO_SESSION_EVENT)
        return;
    cerb__mutex_lock(&e->mu);
    if (s->gen != e->gen_counter || s->dead) {
        cerb__mutex_unlock(&e->mu); /* a session being replaced */
        return;
    }
    if (state == ZOO_CONNECTED_STATE) {
        const clientid_t *cid = zoo_client_id(zh);
        int64_t id = cid ? cid->client_id : 0;
        if (s->ever_connected && id != s->id) {
            /* Cannot happen with this client (an expiry comes first), but a
             * different session means our ephemerals are not ours. */
            CERB_LOG_W("zk %s: session changed from 0x%llx to 0x%llx", e->hosts,
                       (unsigned long long)s->id, (unsigned long long)id);
            s->dead = true;
            s->connected = false;
            cerb__zk_keeper_poke_locked(e, ZK_PEND_REPLACE);
        } else {
            s->id = id;
            s->timeout_ms = zoo_recv_timeout(zh);
            /* What the server granted, which can differ from what we asked
             * in either direction ([min, max]SessionTimeout): the server
             * keeps a silent session, and our nodes, this long. */
            int64_t cur = atomic_load(&e->max_timeout_ms);
            while (cur < s->timeout_ms &&
                   !atomic_compare_exchange_weak(&e->max_timeout_ms, &cur, s->timeout_ms))
                ;
            s->connected = true;
            cerb__zk_keeper_poke_locked(e, ZK_PEND_CONNECTED);
            s->ever_connected = true;
        }
    } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
        CERB_LOG_W("zk %s: session 0x%llx %s", e->hosts, (unsigned long long)s->id,
                   state == ZOO_EXPIRED_SESSION_STATE ? "expired" : "failed authentication");
        s->dead = true;
        s->connected = false;
        cerb__zk_keeper_poke_locked(e, ZK_PEND_REPLACE);
    } else if (s->connected) {
        s->connected = false;
        cerb__zk_keeper_poke_locked(e, ZK_PEND_DISCONNECTED);
    }
    cerb__cond_broadcast(&e->state_cond);
    cerb__zk_wake_waiters_locked(e);
    cerb__mutex_unlock(&e->mu);
}

static void auth_done(int rc, const void *data)
{
    const struct zk_session *s = data;
    if (rc != ZOK)
        CERB_LOG_W("zk %s: digest authentication: %s", s->e->hosts, zerror(rc));
}

cerb_status cerb__zk_session_open(cerb_engine *e, uint64_t gen, watcher_fn watcher,
                                  struct zk_session **out)
{
    struct zk_session *s = cerb__calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    s->e = e;
    s->gen = gen;
    s->created_ns = cerb_monotime();
    atomic_init(&s->last_ok_ns, 0);
    cerb__mutex_init(&s->out_mu);
    cerb__zk_log_setup();
    errno = 0;
    s->zh = zookeeper_init2(e->zc->hosts, watcher, (int)e->zc->session_timeout_ms, NULL,
                            s, 0, cerb__zk_log_line);
    if (!s->zh) {
        int err = errno;
        cerb__mutex_destroy(&s->out_mu);
        cerb__free(s);
        return cerb__error_set(err == ENOMEM ? CERB_ENOMEM : CERB_EIO,
                               "zk %s: cannot start a client: %s", e->hosts,
                               err == EINVAL ? "bad host list" : strerror(err));
    }
    /* By default the client resolves the host list again every time its
     * I/O thread looks at the socket: a getaddrinfo (files opened, a
     * socket to the resolver) per request and per reply. Resolve only when
     * (re)connecting; measured: most of the library's system time under
     * load went there. */
    zoo_set_servers_resolution_delay(s->zh, -1);
    /* Queued now, sent first on every (re)connect by the client itself,
     * so our requests always run authenticated. */
    if (e->auth) {
        int rc = zoo_add_auth(s->zh, "digest", e->auth, (int)strlen(e->auth), auth_done, s);
        if (rc != ZOK)
            CERB_LOG_W("zk %s: digest authentication: %s", e->hosts, zerror(rc));
    }
    ZK_COUNT(e, sessions);
    *out = s;
    return CERB_OK;
}

void cerb__zk_session_close(struct zk_session *s)
{
    if (!s)
        return;
    zookeeper_close(s->zh);
    cerb__zk_session_drop_outstanding(s);
    cerb__mutex_destroy(&s->out_mu);
    cerb__free(s);
}

/* ---- keeper ---- */

/* When does a disconnected session count as lost? 0 = not applicable. */
static int64_t giveup_at(const struct zk_session *s)
{
    if (!s || !s->ever_connected || s->connected || s->dead || s->timeout_ms <= 0)
        return 0;
    int64_t base = atomic_load(&s->last_ok_ns);
    if (base == 0)
        return 0; /* nothing answered yet: the heartbeat at connect failed */
    int64_t keep = s->timeout_ms - s->timeout_ms * ZK_DRIFT_PERMILLE / 1000;
    return base + keep * CERB_NS_PER_MS;
}

/*
 * Unhook and close the current session (mu held on entry and exit; dropped
 * inside, since closing can block for seconds). With `lost`, its
 * generation ends first: every hold on it is reported LOST and blocked
 * waiters are woken to start over on the next session.
 */
static void end_session(cerb_engine *e, bool lost)
{
    struct zk_session *old = e->cur;
    bool had = old && old->ever_connected;

    if (lost) {
        e->gen_counter++;
        for (struct zk_lock_priv *p = e->held; p; p = p->next)
            p->gone = true;
    }
    if (old) {
        old->dead = true;
        old->connected = false;
    }
    cerb__cond_broadcast(&e->state_cond);
    cerb__zk_wake_waiters_locked(e);
    cerb__mutex_unlock(&e->mu);

    if (lost && had) {
        CERB_LOG_W("zk %s: session 0x%llx lost; every hold on it is lost, making a new one",
                   e->hosts, (unsigned long long)old->id);
        emit(e, CERB_EV_LOST, NULL, NULL);
    }
    if (lost)
        e->suspect_told = false; /* keeper only */
    wrlock(e);
    cerb__mutex_lock(&e->mu);
    if (e->cur == old)
        e->cur = NULL;
    cerb__mutex_unlock(&e->mu);
    cerb__zk_session_end(e);
    cerb__zk_session_close(old);
    cerb__mutex_lock(&e->mu);
}

/* Make a session for the current generation (mu held on entry and exit). */
static void start_session(cerb_engine *e)
{
    uint64_t gen = e->gen_counter;
    struct zk_session *s;

    cerb__mutex_unlock(&e->mu);
    if (cerb__zk_session_open(e, gen, session_watcher, &s) != CERB_OK)
        CERB_LOG_W("%s", cerb_last_error());
    wrlock(e);
    cerb__mutex_lock(&e->mu);
    if (s && !e->cur && e->gen_counter == gen) {
        e->cur = s;
        s = NULL;
    }
    if (!e->cur) {
        e->pend |= ZK_PEND_START;
        e->start_at_ns = cerb_monotime() + ZK_START_BACKOFF_MIN_MS * CERB_NS_PER_MS;
    }
    cerb__cond_broadcast(&e->state_cond);
    cerb__mutex_unlock(&e->mu);
    cerb__zk_session_end(e);
    cerb__zk_session_close(s); /* only when another generation raced us (cannot) */
    cerb__mutex_lock(&e->mu);
}

/* Time between heartbeats on session s (mu held): a sixth of the session
 * timeout, or of the shortest lease held (see ZK_HEARTBEATS). */
static int64_t hb_interval_ns(cerb_engine *e, const struct zk_session *s)
{
    int64_t ms = s->timeout_ms / ZK_HEARTBEATS;
    for (struct zk_lock_priv *p = e->held; p; p = p->next)
        if (p->lk->lease_ms / ZK_HEARTBEATS < ms)
            ms = p->lk->lease_ms / ZK_HEARTBEATS;
    if (ms < ZK_HEARTBEAT_MIN_MS)
        ms = ZK_HEARTBEAT_MIN_MS;
    return ms * CERB_NS_PER_MS;
}

/* Fire a heartbeat (mu not held). Its completion moves last_ok_ns. */
static void heartbeat(cerb_engine *e)
{
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return;
    struct zk_session *s = cerb__zk_session_begin(e);
    if (s)
        cerb__zk_call_exists(c, s, "/");
    cerb__zk_session_end(e);
    cerb__zk_call_put(c); /* the completion frees it */
}

/* After a reconnect with the same session: is every held node still ours?
 * Emits LOST for each that is not, then VALID; false when it could not
 * tell (the connection went again). */
struct held_copy {
    struct zk_lock_priv *p;
    char *name, *token, *node;
    int slot;
};

static bool verify_held(cerb_engine *e)
{
    struct held_copy *hc = NULL;
    size_t n = 0, cap = 0;
    struct zk_state st;
    bool ok = true;

    cerb__mutex_lock(&e->mu);
    cerb__zk_state_locked(e, &st);
    for (struct zk_lock_priv *p = e->held; p && ok; p = p->next) {
        if (p->gone || p->gen != st.gen || !p->node)
            continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            struct held_copy *nh = cerb__realloc(hc, ncap * sizeof *nh);
            if (!nh) {
                ok = false;
                break;
            }
            hc = nh;
            cap = ncap;
        }
        struct held_copy *h = &hc[n];
        h->p = p;
        h->name = cerb__strdup(p->lk->name);
        h->token = cerb__strdup(p->lk->token);
        h->node = cerb__strdup(p->node);
        n++;
        if (!h->name || !h->token || !h->node)
            ok = false;
    }
    cerb__mutex_unlock(&e->mu);

    struct zk_call *c = ok && n ? cerb__zk_call_new(n) : NULL;
    if (c) {
        struct zk_session *s = cerb__zk_session_begin(e);
        if (s && s->gen == st.gen)
            for (size_t i = 0; i < n; i++)
                hc[i].slot = cerb__zk_call_exists(c, s, hc[i].node);
        else
            ok = false;
        cerb__zk_session_end(e);
        if (ok && !cerb__zk_call_wait(c, cerb__zk_call_deadline(e, 0)))
            ok = false;
        for (size_t i = 0; ok && i < n; i++) {
            int rc = c->res[hc[i].slot].rc;
            if (rc == ZOK && c->res[hc[i].slot].stat.ephemeralOwner == st.id)
                continue;
            if (rc != ZOK && rc != ZNONODE) {
                ok = false; /* unsure: stay SUSPECT, try again next time */
                break;
            }
            cerb__mutex_lock(&e->mu);
            for (struct zk_lock_priv *p = e->held; p; p = p->next)
                if (p == hc[i].p && p->node && strcmp(p->node, hc[i].node) == 0)
                    p->gone = true;
            cerb__mutex_unlock(&e->mu);
            CERB_LOG_W("zk %s: lock node %s is gone after the reconnect", e->hosts, hc[i].node);
            emit(e, CERB_EV_LOST, hc[i].name, hc[i].token);
        }
        cerb__zk_call_put(c);
    } else if (n) {
        ok = false;
    }
    for (size_t i = 0; i < n; i++) {
        cerb__free(hc[i].name);
        cerb__free(hc[i].token);
        cerb__free(hc[i].node);
    }
    cerb__free(hc);
    if (ok)
        emit(e, CERB_EV_VALID, NULL, NULL);
    return ok;
}

static void *keeper_main(void *arg)
{
    cerb_engine *e = arg;
    int64_t reap_at = 0, mark_at = 0;

    cerb__mutex_lock(&e->mu);
    while (!e->stop) {
        int64_t now = cerb_monotime();
        struct zk_session *s = e->cur;
        int64_t gu = giveup_at(s);
        int64_t stale = s && !s->ever_connected && !s->dead
                            ? s->created_ns + e->zc->connect_timeout_ms * CERB_NS_PER_MS
                            : 0;

        if (e->pend & ZK_PEND_REPLACE) {
            e->pend &= ~(unsigned)ZK_PEND_REPLACE;
            end_session(e, true);
            e->backoff_ms = 0;
            start_session(e);
            continue;
        }
        if (gu && now >= gu) {
            CERB_LOG_W("zk %s: no connection for the session timeout (%lld ms)", e->hosts,
                       (long long)s->timeout_ms);
            end_session(e, true);
            e->backoff_ms = 0;
            start_session(e);
            continue;
        }
        if (stale && now >= stale) {
            /* A new session that never connected: close it and try again
             * later (no hold can be on it, the generation stays). */
            end_session(e, false);
            e->backoff_ms = e->backoff_ms ? e->backoff_ms * 2 : ZK_START_BACKOFF_MIN_MS;
            if (e->backoff_ms > ZK_START_BACKOFF_MAX_MS)
                e->backoff_ms = ZK_START_BACKOFF_MAX_MS;
            e->pend |= ZK_PEND_START;
            e->start_at_ns = cerb_monotime() + e->backoff_ms * CERB_NS_PER_MS;
            continue;
        }
        if ((e->pend & ZK_PEND_START) && now >= e->start_at_ns) {
            e->pend &= ~(unsigned)ZK_PEND_START;
            if (!e->cur)
                start_session(e);
            continue;
        }
        if (e->pend & ZK_PEND_DISCONNECTED) {
            e->pend &= ~(unsigned)ZK_PEND_DISCONNECTED;
            e->suspect_told = true;
            cerb__mutex_unlock(&e->mu);
            CERB_LOG_I("zk %s: disconnected; holds are in doubt", e->hosts);
            emit(e, CERB_EV_SUSPECT, NULL, NULL);
            cerb__mutex_lock(&e->mu);
            continue;
        }
        if (e->pend & ZK_PEND_CONNECTED) {
            e->pend &= ~(unsigned)ZK_PEND_CONNECTED;
            if (!s || !s->connected)
                continue;
            e->backoff_ms = 0;
            bool told = e->suspect_told;
            cerb__mutex_unlock(&e->mu);
            heartbeat(e);
            /* Only after a SUSPECT is there doubt to resolve (and the first
             * connect happens while the core is still setting up). */
            bool valid = told && verify_held(e);
            cerb__mutex_lock(&e->mu);
            if (valid)
                e->suspect_told = false;
            e->next_hb_ns = cerb_monotime() + hb_interval_ns(e, s);
            reap_at = 0;
            continue;
        }
        if ((e->pend & ZK_PEND_MARK) && s && s->connected && now >= mark_at) {
            e->pend &= ~(unsigned)ZK_PEND_MARK;
            cerb__mutex_unlock(&e->mu);
            cerb__zk_marks_retry(e);
            cerb__mutex_lock(&e->mu);
            /* A mark refused again is not resent at once. */
            mark_at = cerb_monotime() + ZK_MARK_RETRY_MS * CERB_NS_PER_MS;
            continue;
        }
        if (s && s->connected && e->reap && now >= reap_at) {
            cerb__mutex_unlock(&e->mu);
            bool left = cerb__zk_reap_run(e);
            cerb__mutex_lock(&e->mu);
            reap_at = left ? cerb_monotime() + 200 * CERB_NS_PER_MS : 0;
            continue;
        }
        if (s && s->connected && now >= e->next_hb_ns) {
            e->next_hb_ns = now + hb_interval_ns(e, s);
            cerb__mutex_unlock(&e->mu);
            heartbeat(e);
            cerb__mutex_lock(&e->mu);
            continue;
        }
        int64_t wake = now + ZK_KEEPER_MAX_SLEEP_MS * CERB_NS_PER_MS;
        if (s && s->connected && e->next_hb_ns < wake)
            wake = e->next_hb_ns;
        if (gu && gu < wake)
            wake = gu;
        if (stale && stale < wake)
            wake = stale;
        if ((e->pend & ZK_PEND_START) && e->start_at_ns < wake)
            wake = e->start_at_ns;
        if (s && s->connected && e->reap && reap_at < wake)
            wake = reap_at;
        if (s && s->connected && (e->pend & ZK_PEND_MARK) && mark_at < wake)
            wake = mark_at;
        if (wake > now)
            cerb__cond_wait_until(&e->keeper_cond, &e->mu, wake);
    }
    cerb__mutex_unlock(&e->mu);
    return NULL;
}

/* ---- start, stop, waiting ---- */

cerb_status cerb__zk_wait_connected(cerb_engine *e, int64_t deadline_ns, const atomic_int *intr,
                                    uint64_t want_gen, struct zk_state *st)
{
    cerb_status rc = CERB_OK;

    cerb__mutex_lock(&e->mu);
    for (;;) {
        cerb__zk_state_locked(e, st);
        if (want_gen && st->gen != want_gen) {
            rc = cerb__error_set(CERB_NOT_OWNER, "zk %s: the session was lost", e->hosts);
            break;
        }
        if (st->connected)
            break;
        if (!e->cur && (e->pend & ZK_PEND_START)) {
            /* Someone needs a session: do not wait out a long backoff. */
            int64_t soon = cerb_monotime() + ZK_START_BACKOFF_MIN_MS * CERB_NS_PER_MS;
            if (e->start_at_ns > soon) {
                e->start_at_ns = soon;
                cerb__cond_signal(&e->keeper_cond);
            }
        }
        if (intr && atomic_load(intr)) {
            rc = cerb__error_set(CERB_INTERRUPTED, "interrupted");
            break;
        }
        int64_t now = cerb_monotime();
        if (now >= deadline_ns) {
            rc = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
            break;
        }
        int64_t until = now + ZK_INTR_SLICE_MS * CERB_NS_PER_MS;
        cerb__cond_wait_until(&e->state_cond, &e->mu, until < deadline_ns ? until : deadline_ns);
    }
    cerb__mutex_unlock(&e->mu);
    return rc;
}

cerb_status cerb__zk_session_start(cerb_engine *e)
{
    struct zk_state st;
    cerb_status rc;

    if (pthread_rwlock_init(&e->zh_lock, NULL) != 0)
        return cerb__error_set(CERB_ENOMEM, "zk %s: cannot make a lock", e->hosts);
    cerb__mutex_init(&e->mu);
    cerb__cond_init(&e->state_cond);
    cerb__cond_init(&e->keeper_cond);
    e->gen_counter = 1;
    rc = cerb__zk_session_open(e, 1, session_watcher, &e->cur);
    if (rc != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        cerb__zk_session_stop(e);
        return cerb__error_set(rc, "%s", why);
    }
    if (pthread_create(&e->keeper, NULL, keeper_main, e) != 0) {
        cerb__zk_session_stop(e);
        return cerb__error_set(CERB_ENOMEM, "zk %s: cannot start the session thread", e->hosts);
    }
    e->keeper_started = true;
    rc = cerb__zk_wait_connected(e, cerb__deadline_in(e->zc->connect_timeout_ms), NULL, 0, &st);
    if (rc != CERB_OK) {
        cerb__zk_session_stop(e);
        return cerb__error_set(CERB_EIO, "zk %s: no session within the connect timeout (%lld ms)",
                               e->hosts, (long long)e->zc->connect_timeout_ms);
    }
    CERB_LOG_D("zk %s: session 0x%llx, timeout %lld ms", e->hosts, (unsigned long long)st.id,
               (long long)st.timeout_ms);
    return CERB_OK;
}

void cerb__zk_session_stop(cerb_engine *e)
{
    if (e->keeper_started) {
        cerb__mutex_lock(&e->mu);
        e->stop = true;
        cerb__cond_signal(&e->keeper_cond);
        cerb__mutex_unlock(&e->mu);
        pthread_join(e->keeper, NULL);
        e->keeper_started = false;
    }
    struct zk_session *s = e->cur;
    e->cur = NULL;
    cerb__zk_session_close(s);
    cerb__zk_reap_free(e);
    cerb__cond_destroy(&e->keeper_cond);
    cerb__cond_destroy(&e->state_cond);
    cerb__mutex_destroy(&e->mu);
    pthread_rwlock_destroy(&e->zh_lock);
}

/* ---- the hold bound ---- */

int64_t cerb__zk_op_hold_bound(cerb_engine *e)
{
    return atomic_load(&e->max_timeout_ms);
}

/* ---- probe ---- */

cerb_status cerb__zk_op_probe(cerb_engine *e, int64_t timeout_ms)
{
    int64_t deadline = cerb__deadline_in(timeout_ms);
    struct zk_state st;
    cerb_status rc;

    cerb__zk_state(e, &st);
    if (!st.connected)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    struct zk_call *c = cerb__zk_call_new(1);
    if (!c)
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s ? cerb__zk_call_exists(c, s, e->zc->root) : -1;
    cerb__zk_session_end(e);
    if (k < 0) {
        rc = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    } else if (!cerb__zk_call_wait(c, deadline)) {
        rc = cerb__error_set(CERB_EIO, "zk %s: probe: no answer within %lld ms", e->hosts,
                             (long long)timeout_ms);
    } else if (c->res[k].rc == ZOK || c->res[k].rc == ZNONODE) {
        rc = CERB_OK;
    } else {
        rc = cerb__zk_fail(e->hosts, "probe: exists", e->zc->root, c->res[k].rc,
                           c->res[k].sent, NULL);
    }
    cerb__zk_call_put(c);
    return rc;
}

/* ---- held (the safe-switch question) ---- */

/*
 * Is `name` held by anyone? One getChildren of its lock node: any child —
 * a holder or a queued contender, ours or Curator's — answers BUSY (a
 * contender may be granted at any moment), no node or no children OK.
 * That a waiter counts is what the closure record needs (zk_closure.c): a
 * node created before the record was stored may still become a grant
 * after it, so "free" must mean no node at all. The listing is sent on
 * this instance's session after whatever closure_get it answered, so it
 * sees every node created before that record (a new session is made, in
 * the server's order, after the old one's reads). Bounded by the connect
 * timeout, like the other short calls.
 */
cerb_status cerb__zk_op_held(cerb_engine *e, const char *name)
{
    int64_t deadline = cerb__deadline_in(e->zc->connect_timeout_ms);
    struct zk_state st;
    cerb_status rc;

    cerb__zk_state(e, &st);
    if (!st.connected)
        return cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    char *parent = cerb__zk_parent_path(e->zc->root, name);
    struct zk_call *c = parent ? cerb__zk_call_new(1) : NULL;
    if (!c) {
        cerb__free(parent);
        return cerb__error_set(CERB_ENOMEM, "zk %s: out of memory", e->hosts);
    }
    struct zk_session *s = cerb__zk_session_begin(e);
    int k = s ? cerb__zk_call_children(c, s, parent, -1, NULL, NULL) : -1;
    cerb__zk_session_end(e);
    if (k < 0) {
        rc = cerb__error_set(CERB_EIO, "zk %s: not connected", e->hosts);
    } else if (!cerb__zk_call_wait(c, deadline)) {
        rc = cerb__error_set(CERB_EIO, "zk %s: is \"%s\" held: no answer within %lld ms",
                             e->hosts, name, (long long)e->zc->connect_timeout_ms);
    } else if (c->res[k].rc == ZNONODE) {
        rc = CERB_OK;
    } else if (c->res[k].rc == ZOK) {
        rc = c->res[k].kids.n_children == 0
                 ? CERB_OK
                 : cerb__error_set(CERB_BUSY, "zk %s: \"%s\" is held", e->hosts, name);
    } else {
        rc = cerb__zk_fail(e->hosts, "held: children", parent, c->res[k].rc, c->res[k].sent,
                           NULL);
    }
    cerb__zk_call_put(c);
    cerb__free(parent);
    return rc;
}
