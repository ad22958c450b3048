/*
 * pg_notify.c — lease mode's waiters woken by NOTIFY instead of polling.
 *
 * In lease mode (behind a transaction pooler) nothing queues on the
 * server, so a waiter would poll. With pg.notify_conninfo, one session per
 * client that reaches the server directly LISTENs on PG_NOTIFY_CHANNEL,
 * and every release in lease mode sends the name (hex) there in its own
 * statement (PG_RELEASE_N; delivered when it commits). A thread reads the
 * notifications and wakes the waiters of that name. The LISTEN(7) order
 * holds: a waiter registers before it looks at the row, and the listener
 * listened before any waiter registered, so a release that commits after
 * the look is heard. A listener that loses its session wakes every waiter
 * (they poll until it is back) and reconnects every second.
 */
#include "internal_posix.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "pg_internal.h"

struct pg_listener {
    pthread_t thread;
    atomic_bool stop;
    cerb_mutex mu;
    cerb_cond cv;
    bool live;                 /* listening now */
    struct pg_waiter *waiters;
};

/* Wake the waiters of hex (all of them when hex is NULL). */
static void wake(struct pg_listener *l, const char *hex)
{
    cerb__mutex_lock(&l->mu);
    for (struct pg_waiter *w = l->waiters; w; w = w->next)
        if (!hex || strcmp(w->hex, hex) == 0)
            w->woken = true;
    cerb__cond_broadcast(&l->cv);
    cerb__mutex_unlock(&l->mu);
}

static void set_live(struct pg_listener *l, bool live)
{
    cerb__mutex_lock(&l->mu);
    l->live = live;
    cerb__mutex_unlock(&l->mu);
    /* Either way the waiters look again: a release may have gone unheard
     * while nobody listened. */
    wake(l, NULL);
}

/* Sleep up to ms unless told to stop. */
static void pause_ms(struct pg_listener *l, int64_t ms)
{
    while (ms > 0 && !atomic_load(&l->stop)) {
        int64_t step = ms < 100 ? ms : 100;
        cerb__nap_ms(step);
        ms -= step;
    }
}

static PGconn *listen_session(cerb_engine *e)
{
    PGconn *pg = NULL;
    PGresult *res = NULL;
    bool broken = false;
    char ss[6];
    if (cerb__pg_connect_to(e->pc->notify_conninfo, e->password,
                            cerb__deadline_in(e->pc->connect_timeout_ms), &pg) != CERB_OK)
        return NULL;
    if (cerb__pg_exec(pg, -1, "LISTEN " PG_NOTIFY_CHANNEL, 0, NULL, NULL, NULL,
                      cerb__deadline_in(e->pc->op_timeout_ms), &res, &broken, ss) != CERB_OK) {
        PQfinish(pg);
        return NULL;
    }
    PQclear(res);
    return pg;
}

static void *listener_main(void *arg)
{
    cerb_engine *e = arg;
    struct pg_listener *l = e->lis;
    PGconn *pg = NULL;
    bool said = false;
    while (!atomic_load(&l->stop)) {
        if (!pg) {
            pg = listen_session(e);
            if (!pg) {
                if (!said)
                    CERB_LOG_W("pg: cannot listen on pg.notify_conninfo (%s); waiters poll",
                               cerb_last_error());
                said = true;
                pause_ms(l, 1000);
                continue;
            }
            said = false;
            set_live(l, true);
        }
        struct pollfd p = {.fd = PQsocket(pg), .events = POLLIN};
        int r = poll(&p, 1, 200);
        if (r < 0 && errno != EINTR)
            r = -2;
        if (r == -2 || (r > 0 && PQconsumeInput(pg) == 0)) {
            PQfinish(pg);
            pg = NULL;
            set_live(l, false);
            continue;
        }
        PGnotify *n;
        while ((n = PQnotifies(pg)) != NULL) {
            wake(l, n->extra);
            PQfreemem(n);
        }
    }
    if (pg)
        PQfinish(pg);
    return NULL;
}

cerb_status cerb__pg_listener_start(cerb_engine *e)
{
    if (e->pc->mode != CERB_SQL_LEASE || !e->pc->notify_conninfo || !e->pc->notify_conninfo[0])
        return CERB_OK;
    struct pg_listener *l = cerb__calloc(1, sizeof *l);
    if (!l)
        return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
    cerb__mutex_init(&l->mu);
    cerb__cond_init(&l->cv);
    e->lis = l;
    if (pthread_create(&l->thread, NULL, listener_main, e) != 0) {
        e->lis = NULL;
        cerb__cond_destroy(&l->cv);
        cerb__mutex_destroy(&l->mu);
        cerb__free(l);
        return cerb__error_set(CERB_ENOMEM, "pg: cannot start the listener thread");
    }
    return CERB_OK;
}

void cerb__pg_listener_stop(cerb_engine *e)
{
    struct pg_listener *l = e->lis;
    if (!l)
        return;
    atomic_store(&l->stop, true);
    pthread_join(l->thread, NULL);
    cerb__cond_destroy(&l->cv);
    cerb__mutex_destroy(&l->mu);
    cerb__free(l);
    e->lis = NULL;
}

bool cerb__pg_listener_live(cerb_engine *e)
{
    if (!e->lis)
        return false;
    cerb__mutex_lock(&e->lis->mu);
    bool live = e->lis->live;
    cerb__mutex_unlock(&e->lis->mu);
    return live;
}

void cerb__pg_waiter_add(cerb_engine *e, struct pg_waiter *w)
{
    if (!e->lis)
        return;
    cerb__mutex_lock(&e->lis->mu);
    w->woken = false;
    w->next = e->lis->waiters;
    e->lis->waiters = w;
    cerb__mutex_unlock(&e->lis->mu);
}

bool cerb__pg_waiter_wait(cerb_engine *e, struct pg_waiter *w, int64_t ms)
{
    if (!e->lis) {
        cerb__nap_ms(ms);
        return false;
    }
    int64_t deadline = cerb__deadline_in(ms);
    cerb__mutex_lock(&e->lis->mu);
    while (!w->woken && e->lis->live && cerb__ms_left(deadline) > 0)
        cerb__cond_wait_until(&e->lis->cv, &e->lis->mu, deadline);
    bool woken = w->woken;
    w->woken = false;
    bool live = e->lis->live;
    cerb__mutex_unlock(&e->lis->mu);
    if (!live && !woken && cerb__ms_left(deadline) > 0)
        cerb__nap_ms(cerb__ms_left(deadline)); /* no listener: the caller polls */
    return woken;
}

void cerb__pg_waiter_remove(cerb_engine *e, struct pg_waiter *w)
{
    if (!e->lis)
        return;
    cerb__mutex_lock(&e->lis->mu);
    for (struct pg_waiter **p = &e->lis->waiters; *p; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            break;
        }
    }
    cerb__mutex_unlock(&e->lis->mu);
}
