/*
 * redis_wait.c — acquire with waiting, and cancel().
 *
 * One run of the acquire script either grants the lock or, when the caller
 * may wait, puts its token in the name's FIFO queue ({K}:q, with a deadline
 * in {K}:d). The waiter then blocks in BLPOP on its own wake list
 * {K}:w:<token> and reacts to what arrives:
 *   "f<fence>"  the release script handed it the lock: return the grant at
 *               once (the lease is the short hand-off lease; the core
 *               extends it immediately);
 *   "w"         a non-fair release freed the lock: run acquire again;
 *   nothing     the BLPOP timed out: time for a scheduled re-check.
 * Re-checks run the acquire script again. They refresh the waiter's deadline
 * (so the release script does not skip it as dead) and notice what sends no
 * wake-up: a redis-py client's release, or a holder whose lease ran out.
 * The live head of the queue re-checks every REDIS_HEAD_POLL_MS (sooner
 * when the holder's PTTL ends sooner); the others only every
 * REDIS_TAIL_POLL_MS, to stay alive, since a release wakes only the head.
 *
 * Time is kept here, not by BLPOP. Redis serves blocking timeouts on its
 * cron tick (100 ms at the default hz 10: a 1 ms BLPOP answers after
 * 100 ms), so the waiter sends BLPOP with the time to its next re-check and
 * then poll()s the socket itself in slices of REDIS_INTR_SLICE_MS, bounded
 * by the caller's deadline: the deadline and the interrupt flag are honoured
 * on time whatever the server's tick. A wait that ends with a BLPOP still
 * outstanding (deadline, interrupt, error) closes that connection, which
 * cancels the BLPOP on the server.
 *
 * cancel() breaks a wait without a round trip: the waiter registers its
 * socket in lk->priv (under e->wmu: the instance's wait_mu, or in cluster
 * mode the routing instance's, which cancel() is called on), and cancel() shuts that socket
 * down, which wakes poll() at once. The core calls cancel() while holding
 * its own lock and promises cerb_lock_interrupt() never blocks on the
 * network, so pushing a message to the wake list from the caller's thread
 * is not an option.
 *
 * Giving up (deadline, interrupt, error) runs the release script in leave
 * mode, which removes the token from the queue and, if the lock was handed
 * to this waiter meanwhile, passes it on. Only when that cannot be confirmed
 * is the outcome UNKNOWN: then the entry lapses by its deadline and a
 * handed lock by its short lease.
 *
 * In cluster mode the wait belongs to one master while the name's slot may
 * move under it (CLUSTER SETSLOT, MIGRATE). A re-check or a BLPOP answered
 * with a redirect ran nothing: the wait neither goes on nor leaves here,
 * but returns it at once to the router (redis_cluster.c), which runs the
 * acquisition again where the answer points; the acquire script is
 * idempotent per token and finds our queue entry there, moved with the
 * slot. A leave answered with a redirect is left to the router as well
 * (redis_lock_priv.queued).
 */
#include "internal_posix.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "redis_marker.h"
#include "redis_replies.h"
#include "redis_scripts.h"

/* Redis answers a timed-out BLPOP on its next cron tick, up to this late. */
#define REDIS_BLPOP_TICK_MS 100

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t ns_to_ms_ceil(int64_t ns)
{
    return ns <= 0 ? 0 : (ns + CERB_NS_PER_MS - 1) / CERB_NS_PER_MS;
}

static void grant_fill(cerb_grant *g, uint64_t fence, int64_t sent_ns, int64_t ttl_ms)
{
    g->fence = fence;
    g->sent_ns = sent_ns;
    g->ttl_ms = ttl_ms;
    g->outcome = CERB_OUTCOME_YES;
}

/* When the next re-check is due, after a run of acquire sent at sent_ns. */
static int64_t next_check_at(const cerb_engine_lock *lk, const struct redis_acquire_result *res,
                             int64_t sent_ns)
{
    int64_t iv = res->head ? REDIS_HEAD_POLL_MS : REDIS_TAIL_POLL_MS;

    /* The holder's lease ends sooner: look then. Behind a live head in a
     * fair queue that is the head's business, not ours. */
    if ((res->head || !lk->fair) && res->pttl >= 0 && res->pttl + 1 < iv)
        iv = res->pttl + 1;
    return sent_ns + iv * CERB_NS_PER_MS;
}

/* Cluster: remember who was behind us as the head (redis_lock_priv). */
static void note_next(cerb_engine *e, cerb_engine_lock *lk, const char *next)
{
    struct redis_lock_priv *p = lk->priv;
    if (!p || !e->cl)
        return;
    cerb__mutex_lock(e->wmu);
    snprintf(p->next, sizeof p->next, "%s", next);
    cerb__mutex_unlock(e->wmu);
}

/* Cluster: is st a redirect (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) that the
 * server answered instead of running the request? The wait then returns
 * it to the router at once (see the file comment). */
static bool redirected(const cerb_engine *e, cerb_status st, cerb_outcome oc)
{
    return e->cl && st == CERB_EIO && oc == CERB_OUTCOME_NO &&
           cerb__redis_redirect_peek() != REDIS_REDIR_NONE;
}

/* Cluster: our token may be left in the queue by a wait cut short by a
 * redirect (redis_lock_priv.queued), or no longer is. */
static void note_queued(cerb_engine *e, const cerb_engine_lock *lk, bool on)
{
    struct redis_lock_priv *p = lk->priv;
    if (!p || !e->cl)
        return;
    cerb__mutex_lock(e->wmu);
    p->queued = on;
    cerb__mutex_unlock(e->wmu);
}

/* ---- cancel ---- */

void cerb__redis_wait_register(cerb_engine *e, cerb_engine_lock *lk, const struct redis_conn *bc)
{
    struct redis_lock_priv *p = lk->priv;

    if (!p)
        return;
    cerb__mutex_lock(e->wmu);
    p->waiting = true;
    p->cancelled = false;
    p->fd = bc->ctx->fd;
    cerb__mutex_unlock(e->wmu);
}

/* Stop being cancellable; true when cancel() hit the registered socket. */
bool cerb__redis_wait_unregister(cerb_engine *e, cerb_engine_lock *lk)
{
    struct redis_lock_priv *p = lk->priv;
    bool hit;

    if (!p)
        return false;
    cerb__mutex_lock(e->wmu);
    hit = p->cancelled;
    p->waiting = false;
    p->cancelled = false;
    cerb__mutex_unlock(e->wmu);
    return hit;
}

void cerb__redis_op_cancel(cerb_engine *e, cerb_engine_lock *lk)
{
    struct redis_lock_priv *p = lk->priv;

    if (!p)
        return;
    cerb__mutex_lock(e->wmu);
    /* The socket stays open until the waiter unregisters (it frees the
     * connection only after that), so fd cannot name another file here. */
    if (p->waiting && !p->cancelled) {
        shutdown(p->fd, SHUT_RDWR);
        p->cancelled = true;
    }
    cerb__mutex_unlock(e->wmu);
}

/*
 * After a failure on the blocking connection: was it cancel()? Then drop
 * the connection (its socket is shut down) and go on waiting; the caller
 * looks at the interrupt flag next. What the lost request or reply said is
 * unknown (a hand-off message may have been on its way), so the next step
 * is a run of acquire, which finds out.
 */
static bool cancel_hit(cerb_engine *e, cerb_engine_lock *lk, struct redis_conn **bc,
                       int64_t *next_check, bool *woken)
{
    if (!cerb__redis_wait_unregister(e, lk))
        return false;
    REDIS_COUNT(e, cancel_wakeups);
    cerb__redis_redirect_clear(); /* whatever the failure said is moot */
    (*bc)->broken = true;
    cerb__redis_block_put(e, *bc);
    *bc = NULL;
    *next_check = 0;
    *woken = true;
    return true;
}

/* ---- giving up ---- */

/*
 * Leave the queue (passing on a lock handed to us meanwhile) and return
 * `st`, keeping its message. `bc` is used when it is clean, else a pool
 * connection. If the leave is not confirmed, the outcome is UNKNOWN.
 */
static cerb_status give_up(cerb_engine *e, struct redis_conn *bc, struct redis_keys *ks,
                           const cerb_engine_lock *lk, cerb_status st, cerb_grant *g)
{
    char why[CERB_ERROR_MAX];
    cerb_status ls;
    cerb_outcome oc = CERB_OUTCOME_NO;

    cerb__error_copy(why, sizeof why);
    note_queued(e, lk, false);
    if (bc && !bc->broken) {
        int code;
        REDIS_COUNT(e, leaves);
        ls = cerb__redis_run_release(e, bc, ks, lk, 1, &code, &oc);
    } else {
        ls = cerb__redis_leave(e, ks, lk);
    }
    if (ls != CERB_OK && redirected(e, ls, oc)) {
        /* The leave did not run here: the router leaves where the answer
         * points. The redirect is the leave's, not the wait's answer. The
         * outcome stays what it was until then. */
        cerb__redis_redirect_clear();
        note_queued(e, lk, true);
        return cerb__error_set(st, "%s", why);
    }
    if (ls != CERB_OK) {
        g->outcome = CERB_OUTCOME_UNKNOWN;
        if (st == CERB_TIMEOUT || st == CERB_INTERRUPTED) {
            cerb__error_prefix("leaving the queue of \"%s\" after %s", ks->k[REDIS_K],
                               st == CERB_TIMEOUT ? "the wait timed out" : "an interrupt");
            return ls;
        }
        return cerb__error_set(st, "%s (and leaving the queue failed)", why);
    }
    g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(st, "%s", why);
}

/* ---- the wait ---- */

static cerb_status wait_loop(cerb_engine *e, cerb_engine_lock *lk, struct redis_keys *ks,
                             int64_t deadline_ns, const atomic_int *intr,
                             struct redis_acquire_result res, int64_t last_sent, cerb_grant *g)
{
    struct redis_conn *bc = NULL;
    bool inflight = false; /* a BLPOP on bc awaits its reply */
    bool woken = false;    /* the next re-check answers a wake-up, not the timer */
    int64_t blpop_due = 0; /* past this, the BLPOP's reply is overdue */
    int64_t next_check = next_check_at(lk, &res, last_sent);
    cerb_outcome oc = CERB_OUTCOME_NO;
    cerb_status st;

    note_next(e, lk, res.next);

    for (;;) {
        if (intr && atomic_load(intr)) {
            st = cerb__error_set(CERB_INTERRUPTED, "wait for \"%s\" interrupted", ks->k[REDIS_K]);
            break;
        }
        if (!bc) {
            st = cerb__redis_block_get(e, &bc);
            if (st != CERB_OK)
                break;
            cerb__redis_wait_register(e, lk, bc);
            inflight = false;
            /* Registered, then the flag again: an interrupt that came
             * before the registration is seen here, one after it shuts the
             * socket down. */
            if (intr && atomic_load(intr)) {
                st = cerb__error_set(CERB_INTERRUPTED, "wait for \"%s\" interrupted",
                                     ks->k[REDIS_K]);
                break;
            }
        }
        int64_t now = cerb_monotime();
        if (now >= deadline_ns) {
            st = cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out", ks->k[REDIS_K]);
            break;
        }

        if (!inflight && now >= next_check) {
            int64_t sent;
            if (!woken)
                REDIS_COUNT(e, acquire_polls);
            woken = false;
            int64_t left = cerb__ms_left(deadline_ns);
            st = cerb__redis_run_acquire(e, bc, ks, lk, left > 0 ? left : 1, &res, &sent, &oc);
            if (st != CERB_OK && res.closed_epoch) {
                g->closed_epoch = res.closed_epoch; /* the script left the queue */
                break;
            }
            if (st != CERB_OK) {
                if (cancel_hit(e, lk, &bc, &next_check, &woken))
                    continue;
                break;
            }
            last_sent = sent;
            note_next(e, lk, res.next);
            if (res.granted) {
                grant_fill(g, res.fence, sent, lk->lease_ms);
                break;
            }
            next_check = next_check_at(lk, &res, sent);
            continue;
        }

        if (!inflight) {
            int64_t t = ns_to_ms_ceil(min64(next_check, deadline_ns) - now);
            char tmo[32];
            if (t < 1)
                t = 1;
            snprintf(tmo, sizeof tmo, "%lld.%03lld", (long long)(t / 1000),
                     (long long)(t % 1000));
            const char *argv[3] = {"BLPOP", ks->k[REDIS_W], tmo};
            size_t argl[3] = {5, ks->len[REDIS_W], strlen(tmo)};
            st = cerb__redis_append(bc, 3, argv, argl);
            if (st == CERB_OK)
                st = cerb__redis_send(e, bc, "BLPOP", &oc);
            if (st != CERB_OK) {
                if (cancel_hit(e, lk, &bc, &next_check, &woken))
                    continue;
                break;
            }
            inflight = true;
            blpop_due = now + (t + REDIS_BLPOP_TICK_MS + e->rc->op_timeout_ms) * CERB_NS_PER_MS;
        }

        /* Sleep on the socket until a reply, the deadline, or the next look
         * at the interrupt flag. */
        struct pollfd pfd = {.fd = bc->ctx->fd, .events = POLLIN};
        int64_t slice = ns_to_ms_ceil(min64(deadline_ns - now, REDIS_INTR_SLICE_MS * CERB_NS_PER_MS));
        int pr = poll(&pfd, 1, (int)(slice > 0 ? slice : 1));
        if (pr < 0 && errno != EINTR) {
            bc->broken = true;
            st = cerb__error_set(CERB_EIO, "redis %s: poll: %s", e->where, strerror(errno));
            break;
        }
        if (pr <= 0) {
            if (cerb_monotime() > blpop_due) {
                bc->broken = true;
                st = cerb__error_set(CERB_EIO, "redis %s: BLPOP: no reply", e->where);
                break;
            }
            continue;
        }

        redisReply *r;
        st = cerb__redis_recv(e, bc, "BLPOP", &r, &oc);
        inflight = false;
        if (st != CERB_OK) {
            if (cancel_hit(e, lk, &bc, &next_check, &woken))
                continue;
            break;
        }
        if (r->type == REDIS_REPLY_NIL) {
            freeReplyObject(r);
            continue;
        }
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            r->element[1]->type == REDIS_REPLY_STRING) {
            uint64_t fence;
            const char *msg = r->element[1]->str;
            size_t mlen = r->element[1]->len;
            char next[sizeof ((struct redis_lock_priv *)0)->next] = "";
            /* Cluster: a hand-off names the waiter now at the head after
             * us ("f<fence> <token>"), whose wake list our release names. */
            const char *sp = e->cl ? memchr(msg, ' ', mlen) : NULL;
            if (sp && (size_t)(msg + mlen - sp - 1) < sizeof next) {
                memcpy(next, sp + 1, (size_t)(msg + mlen - sp - 1));
                next[msg + mlen - sp - 1] = '\0';
                mlen = (size_t)(sp - msg);
            }
            enum redis_read rv = cerb__redis_read_wake(msg, mlen, &fence);
            REDIS_COUNT(e, wakeups);
            if (rv == REDIS_READ_YES) {
                int64_t ttl = min64(lk->lease_ms, REDIS_HANDOFF_TTL_MS);
                freeReplyObject(r);
                /* The hand-off came after our last acquire run: that run
                 * found the lock not ours and emptied this list, so the
                 * message is newer and its lease started after last_sent.
                 * If half of it is gone already, a run of acquire extends
                 * it (or finds it lost) before we say yes. */
                if (cerb_monotime() - last_sent < ttl * CERB_NS_PER_MS / 2) {
                    note_next(e, lk, next);
                    grant_fill(g, fence, last_sent, ttl);
                    REDIS_COUNT(e, handoffs_received);
                    st = CERB_OK;
                    break;
                }
            } else {
                freeReplyObject(r); /* "w" (or anything else): look again */
                if (rv == REDIS_READ_BAD)
                    CERB_LOG_W("redis %s: a wake list held a message that is no hand-off; "
                               "looking again", e->where);
            }
            woken = true;
            next_check = 0;
            continue;
        }
        struct redis_failure f = {.phase = REDIS_PHASE_REPLY, .reply = r};
        st = cerb__redis_fail(e->where, "BLPOP", &f, &oc);
        freeReplyObject(r);
        break;
    }

    if (bc) {
        if (cerb__redis_wait_unregister(e, lk) || inflight)
            bc->broken = true; /* shut down by cancel(), or a BLPOP is pending */
    }
    if (st != CERB_OK && redirected(e, st, oc))
        note_queued(e, lk, true); /* a re-check or BLPOP was redirected */
    else if (st != CERB_OK)
        st = give_up(e, bc, ks, lk, st, g);
    cerb__redis_block_put(e, bc);
    return st;
}

/*
 * redis.min_replicas_ack = n > 0: a grant counts only once n replicas have
 * it. WAIT covers the writes of the connection it is sent on, and a
 * hand-off was written by the releaser's; so run acquire once more on one
 * connection (our token holds the key: it extends it, a write of ours after
 * the grant in the replication stream) and WAIT there, in one round trip.
 * Not confirmed within the operation timeout: release it (token compared)
 * and report an error — never a hold the replicas may not have. A release
 * that fails leaves the key to its lease: nobody holds it.
 */
cerb_status cerb__redis_confirm_replicas(cerb_engine *e, struct redis_keys *ks,
                                         cerb_engine_lock *lk, cerb_grant *g, int64_t deadline_ns)
{
    int n = e->rc->min_replicas_ack;
    /* WAIT gives up at the operation timeout, or at the caller's deadline
     * when that comes first (a timed lock must return by it). */
    int64_t wait_ms = e->rc->op_timeout_ms;
    if (deadline_ns > 0 && deadline_ns != CERB_DEADLINE_NEVER) {
        int64_t left = cerb__ms_left(deadline_ns);
        if (left < wait_ms)
            wait_ms = left > 1 ? left : 1;
    }
    struct redis_conn *c;
    struct redis_acquire_result res;
    int64_t sent;
    cerb_outcome oc;
    cerb_status st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_run_acquire(e, c, ks, lk, 0, &res, &sent, &oc);
        if (st == CERB_OK && !res.granted)
            st = cerb__error_set(CERB_LOST, "redis %s: \"%s\" was lost before its replicas "
                                 "confirmed it", e->where, ks->k[REDIS_K]);
    }
    long long acked = -1;
    if (st == CERB_OK) {
        char nb[16], tb[24];
        snprintf(nb, sizeof nb, "%d", n);
        snprintf(tb, sizeof tb, "%lld", (long long)wait_ms);
        const char *argv[3] = {"WAIT", nb, tb};
        size_t argl[3] = {4, strlen(nb), strlen(tb)};
        redisReply *r = NULL;
        size_t got = 0;
        /* WAIT blocks up to its own timeout: give the socket that long. */
        st = cerb__redis_conn_set_timeout(e, c, 2 * e->rc->op_timeout_ms);
        if (st == CERB_OK)
            st = cerb__redis_append(c, 3, argv, argl);
        if (st == CERB_OK)
            st = cerb__redis_exchange(e, c, "WAIT", &r, &got, &oc);
        if (st == CERB_OK && r->type == REDIS_REPLY_INTEGER)
            acked = r->integer;
        else if (st == CERB_OK)
            st = cerb__error_set(CERB_EPROTO, "redis %s: WAIT answered no number", e->where);
        if (r)
            freeReplyObject(r);
        if (st == CERB_OK)
            st = cerb__redis_conn_set_timeout(e, c, e->rc->op_timeout_ms);
    }
    if (c)
        cerb__redis_put(e, c);
    if (st == CERB_OK && acked >= n) {
        /* The extension counts from this run's send. */
        g->sent_ns = sent;
        g->ttl_ms = lk->lease_ms;
        return CERB_OK;
    }
    char why[CERB_ERROR_MAX];
    if (st == CERB_OK)
        snprintf(why, sizeof why, "%lld of %d replicas confirmed it within %lld ms", acked, n,
                 (long long)wait_ms);
    else
        cerb__error_copy(why, sizeof why);
    cerb__redis_op_release(e, lk);
    g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "redis %s: \"%s\" granted, but not acknowledged (%s): "
                           "released", e->where, ks->k[REDIS_K], why);
}

cerb_status cerb__redis_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                   const atomic_int *interrupted, cerb_grant *grant)
{
    struct redis_keys ks;
    struct redis_acquire_result res = {0}; /* read below also when no run was made */
    struct redis_conn *c;
    int64_t sent = 0, wait_ms = 0;
    cerb_status st = cerb__redis_keys_init(&ks, e, lk->name, lk->token);

    cerb__redis_marker_note_lease(e, lk->lease_ms);

    if (st != CERB_OK)
        return st;
    note_next(e, lk, ""); /* a new acquisition: nobody known behind us */
    if (deadline_ns != 0)
        wait_ms = cerb__ms_left(deadline_ns);
    grant->outcome = CERB_OUTCOME_NO;
    st = cerb__redis_get(e, cerb__deadline_in(e->rc->op_timeout_ms), &c);
    if (st == CERB_OK) {
        st = cerb__redis_run_acquire(e, c, &ks, lk, wait_ms, &res, &sent, &grant->outcome);
        cerb__redis_put(e, c);
    }
    grant->closed_epoch = res.closed_epoch;
    if (st != CERB_OK) {
        /* The lost request may have queued us: leave, which also settles
         * the question (nothing held, nothing queued) when it succeeds. */
        if (wait_ms > 0 && grant->outcome == CERB_OUTCOME_UNKNOWN)
            st = give_up(e, NULL, &ks, lk, st, grant);
    } else if (res.granted) {
        grant_fill(grant, res.fence, sent, lk->lease_ms);
    } else if (deadline_ns == 0 && res.quarantine) {
        st = cerb__error_set(CERB_BUSY, "redis %s: \"%s\": no grants for %lld ms yet: the "
                             "server lost its data and holders elsewhere may not know",
                             e->where, ks.k[REDIS_K], (long long)res.pttl);
    } else if (deadline_ns == 0) {
        st = cerb__error_set(CERB_BUSY, "redis %s: \"%s\" is held by another owner", e->where,
                             ks.k[REDIS_K]);
    } else if (wait_ms == 0) {
        st = cerb__error_set(CERB_TIMEOUT, "wait for \"%s\" timed out", ks.k[REDIS_K]);
    } else {
        st = wait_loop(e, lk, &ks, deadline_ns, interrupted, res, sent, grant);
    }
    if (st == CERB_OK && e->rc->min_replicas_ack > 0)
        st = cerb__redis_confirm_replicas(e, &ks, lk, grant, deadline_ns);
    if (st == CERB_OK)
        REDIS_COUNT(e, grants);
    cerb__redis_keys_free(&ks);
    return st;
}
