/*
 * serve_holds.c — the table of holds `cerberus serve` keeps for its callers.
 *
 * A caller gets an id, 32 hex characters from 16 bytes of OpenSSL's
 * RAND_bytes, so that ids cannot be guessed by another local user of the
 * socket and never repeat in practice. The table is a singly linked list
 * under one mutex: lookups are rare next to the network round trips they
 * stand beside, and a hold is always taken out of the table before it is
 * released, so the library is never called with the mutex held and two
 * DELETEs of one id release it once (the second finds nothing: 404).
 *
 * Each entry records when it was acquired or last kept alive, and its
 * window (its lease): serve_expiry.c takes out and releases the holds whose
 * caller was silent for longer, so a caller that dies never keeps a name.
 * A caller listening to /v1/holds/{hold}/events counts as alive: an entry
 * with a stream open (listeners > 0) is never expired, and its window
 * starts again when the last stream closes.
 *
 * Event streams wait on the table's condition variable (monotonic, with
 * the deadline of their next heartbeat). It is signalled when a hold is
 * taken out, when the library reports a hold lost and when the server
 * stops. The lost callback runs on the library's callback thread and must
 * not block: it only takes the table's mutex (held for lookups only), sets
 * the entry's flag and broadcasts. Its user data is the table, never the
 * entry, which a DELETE may free first. Nor can the table be trusted
 * blindly: cerb_hold_free() does not wait for a lost callback already
 * running, so one may still run after the server freed the table at its
 * stop. Every table is therefore on a list of live tables under a mutex
 * that lives as long as the program, and the callback touches its table
 * only while it finds it there; the destroy takes the table off that list
 * (waiting for a callback inside) before it frees anything.
 *
 * A keepalive for a hold the library reported lost (or whose state is
 * LOST) answers LOST and takes the hold out: renewing the caller's window
 * would let it believe it still holds a name another caller may now hold.
 *
 * An entry is published before the lost callback is set on its hold
 * (the callback finds holds in the table); while it is being added it is
 * marked so that the expiry thread leaves it alone, since freeing the hold
 * under cerb__serve_holds_add would be a use after free.
 *
 * At the stop, the holds left are released by CERB_SERVE_STOP_THREADS
 * threads taking entries off one list, none started past a deadline: each
 * release is bounded only by the engine's timeouts, so one after another a
 * silent server made the stop outlast a service manager's timeout. Holds
 * not released then are not freed here (freeing releases): their lost
 * callback is removed and the client keeps them, to be ended by their
 * lease (or by cerb_client_close's own release).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "serve_internal.h"

/* The tables the lost callback may touch (see above). Lock order: this
 * mutex, then a table's. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cerb__serve_holds *live_head;

void cerb__serve_holds_init(struct cerb__serve_holds *t)
{
    pthread_condattr_t ca;

    if (pthread_mutex_init(&t->mu, NULL) != 0 || pthread_condattr_init(&ca) != 0 ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&t->changed, &ca) != 0)
        abort();
    pthread_condattr_destroy(&ca);
    t->stopping = false;
    t->heartbeat_ms = CERB_SERVE_HEARTBEAT_MS;
    t->head = NULL;
    cerb__serve_lock(&live_mu);
    t->live_next = live_head;
    live_head = t;
    cerb__serve_unlock(&live_mu);
    cerb__serve_attempts_init(&t->attempts);
}

/* The library's lost callback (its callback thread): records, signals. */
static void on_lost(cerb_hold *hold, void *ud)
{
    struct cerb__serve_holds *t = ud, *l;

    cerb__serve_lock(&live_mu);
    for (l = live_head; l && l != t; l = l->live_next)
        ;
    if (l) {
        cerb__serve_lock(&t->mu);
        for (struct cerb__serve_hold *h = t->head; h; h = h->next) {
            if (h->hold == hold) {
                h->lost = true;
                pthread_cond_broadcast(&t->changed);
                break;
            }
        }
        cerb__serve_unlock(&t->mu);
    }
    cerb__serve_unlock(&live_mu);
}

static struct cerb__serve_hold *find(struct cerb__serve_holds *t, const char *id)
{
    for (struct cerb__serve_hold *h = t->head; h; h = h->next)
        if (strcmp(h->id, id) == 0)
            return h;
    return NULL;
}

bool cerb__serve_holds_listen(struct cerb__serve_holds *t, const char *id,
                              int64_t *heartbeat_ms)
{
    struct cerb__serve_hold *h;

    cerb__serve_lock(&t->mu);
    h = find(t, id);
    if (h)
        h->listeners++;
    *heartbeat_ms = t->heartbeat_ms;
    cerb__serve_unlock(&t->mu);
    return h != NULL;
}

void cerb__serve_holds_set_heartbeat(struct cerb__serve_holds *t, int64_t ms)
{
    cerb__serve_lock(&t->mu);
    t->heartbeat_ms = ms;
    cerb__serve_unlock(&t->mu);
}

void cerb__serve_holds_unlisten(struct cerb__serve_holds *t, const char *id)
{
    struct cerb__serve_hold *h;

    cerb__serve_lock(&t->mu);
    h = find(t, id);
    if (h) {
        assert(h->listeners > 0);
        h->listeners--;
        h->last_seen_ns = cerb__serve_now_ns();
    }
    cerb__serve_unlock(&t->mu);
}

enum cerb__serve_event cerb__serve_holds_wait(struct cerb__serve_holds *t, const char *id,
                                              int64_t deadline_ns)
{
    struct timespec dl = {(time_t)(deadline_ns / 1000000000),
                          (long)(deadline_ns % 1000000000)};
    enum cerb__serve_event ev;

    cerb__serve_lock(&t->mu);
    for (;;) {
        struct cerb__serve_hold *h = find(t, id);
        int rc;
        if (t->stopping) {
            ev = CERB_SERVE_EV_STOP;
            break;
        }
        if (!h) {
            ev = CERB_SERVE_EV_GONE;
            break;
        }
        if (h->lost) {
            ev = CERB_SERVE_EV_LOST;
            break;
        }
        rc = pthread_cond_timedwait(&t->changed, &t->mu, &dl);
        if (rc == ETIMEDOUT) {
            ev = CERB_SERVE_EV_TIMEOUT;
            break;
        }
        if (rc != 0)
            abort();
    }
    cerb__serve_unlock(&t->mu);
    return ev;
}

void cerb__serve_holds_stop_streams(struct cerb__serve_holds *t)
{
    cerb__serve_lock(&t->mu);
    t->stopping = true;
    pthread_cond_broadcast(&t->changed);
    cerb__serve_unlock(&t->mu);
}

cerb_status cerb__serve_holds_add(struct cerb__serve_holds *t, cerb_hold *hold,
                                  int64_t window_ms, char id[CERB_SERVE_HOLD_ID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[CERB_SERVE_HOLD_ID_LEN / 2];
    struct cerb__serve_hold *h;

    if (RAND_bytes(raw, (int)sizeof raw) != 1)
        return CERB_EIO;
    h = calloc(1, sizeof *h);
    if (!h)
        return CERB_ENOMEM;
    for (size_t i = 0; i < sizeof raw; i++) {
        h->id[2 * i] = hex[raw[i] >> 4];
        h->id[2 * i + 1] = hex[raw[i] & 15];
    }
    h->id[CERB_SERVE_HOLD_ID_LEN] = '\0';
    h->hold = hold;
    h->window_ns = window_ms * 1000000;
    h->adding = true;
    memcpy(id, h->id, sizeof h->id);
    cerb__serve_lock(&t->mu);
    h->next = t->head;
    t->head = h;
    cerb__serve_unlock(&t->mu);
    /* Nobody knows the id yet and the expiry thread skips it, so the entry
     * is still there: a hold already lost is reported at once (queued) and
     * found. */
    cerb_hold_on_lost(hold, on_lost, t);
    cerb__serve_lock(&t->mu);
    h->adding = false;
    h->last_seen_ns = cerb__serve_now_ns();
    cerb__serve_unlock(&t->mu);
    return CERB_OK;
}

cerb_hold *cerb__serve_holds_take(struct cerb__serve_holds *t, const char *id)
{
    cerb_hold *hold = NULL;

    cerb__serve_lock(&t->mu);
    for (struct cerb__serve_hold **p = &t->head; *p; p = &(*p)->next) {
        if (strcmp((*p)->id, id) == 0) {
            struct cerb__serve_hold *h = *p;
            *p = h->next;
            hold = h->hold;
            free(h);
            pthread_cond_broadcast(&t->changed); /* its streams end */
            break;
        }
    }
    cerb__serve_unlock(&t->mu);
    return hold;
}

bool cerb__serve_holds_info(struct cerb__serve_holds *t, const char *id,
                            enum cerb_lock_state *state, int64_t *valid_ms)
{
    struct cerb__serve_hold *h;

    cerb__serve_lock(&t->mu);
    h = find(t, id);
    if (h) {
        /* Never block, take no lock the lost callback holds; the hold is
         * the table's while the mutex is held. A stream is open on it (a
         * heartbeat asks), so the window does not run: the library's
         * deadline alone bounds it. */
        *state = h->lost ? CERB_LOCK_LOST : cerb_hold_state(h->hold);
        *valid_ms = *state == CERB_LOCK_LOST ? 0 : cerb_hold_valid_ms(h->hold);
    }
    cerb__serve_unlock(&t->mu);
    return h != NULL;
}

cerb_status cerb__serve_holds_touch(struct cerb__serve_holds *t, const char *id,
                                    cerb_hold **lost, enum cerb_lock_state *state,
                                    int64_t *valid_ms)
{
    cerb_status st = CERB_NOT_OWNER;

    *lost = NULL;
    *state = CERB_LOCK_FREE;
    *valid_ms = 0;
    cerb__serve_lock(&t->mu);
    for (struct cerb__serve_hold **p = &t->head; *p; p = &(*p)->next) {
        struct cerb__serve_hold *h = *p;
        if (strcmp(h->id, id) != 0)
            continue;
        /* The flag may not be set yet when the state already says LOST
         * (the callback is queued): ask the hold too. It is the table's
         * while the mutex is held, so it cannot be freed meanwhile, and
         * cerb_hold_state takes no lock that the callback holds. */
        enum cerb_lock_state ls = h->lost ? CERB_LOCK_LOST : cerb_hold_state(h->hold);
        if (ls == CERB_LOCK_LOST) {
            *p = h->next;
            *lost = h->hold;
            free(h);
            pthread_cond_broadcast(&t->changed); /* its streams end */
            st = CERB_LOST;
        } else {
            h->last_seen_ns = cerb__serve_now_ns();
            *state = ls;
            /* Nor beyond the window this keepalive just started: a caller
             * that counts it down never outlives the server's keeping. */
            *valid_ms = cerb_hold_valid_ms(h->hold);
            if (*valid_ms > h->window_ns / 1000000)
                *valid_ms = h->window_ns / 1000000;
            st = CERB_OK;
        }
        break;
    }
    cerb__serve_unlock(&t->mu);
    return st;
}

size_t cerb__serve_holds_take_expired(struct cerb__serve_holds *t, cerb_hold **out,
                                      size_t max)
{
    int64_t now = cerb__serve_now_ns();
    size_t n = 0;

    cerb__serve_lock(&t->mu);
    for (struct cerb__serve_hold **p = &t->head; *p && n < max;) {
        struct cerb__serve_hold *h = *p;
        if (h->listeners == 0 && !h->adding && now - h->last_seen_ns > h->window_ns) {
            *p = h->next;
            out[n++] = h->hold;
            free(h);
            pthread_cond_broadcast(&t->changed);
        } else {
            p = &h->next;
        }
    }
    cerb__serve_unlock(&t->mu);
    return n;
}

/* The stop's release of the holds left: CERB_SERVE_STOP_THREADS threads
 * take entries off one list until it is empty or the deadline passed.
 * Each release is bounded by the engine's timeouts, so the stop takes at
 * most its budget and then one release. */
struct release_all {
    pthread_mutex_t mu;
    struct cerb__serve_hold *next; /* not taken yet */
    int64_t deadline_ns;
    size_t released;
};

static void *release_some(void *ud)
{
    struct release_all *ra = ud;

    for (;;) {
        struct cerb__serve_hold *h;
        cerb__serve_lock(&ra->mu);
        h = ra->next;
        if (!h || cerb__serve_now_ns() >= ra->deadline_ns) {
            cerb__serve_unlock(&ra->mu);
            return NULL;
        }
        ra->next = h->next;
        cerb__serve_unlock(&ra->mu);
        cerb_hold_free(h->hold); /* releases it first */
        free(h);
        cerb__serve_lock(&ra->mu);
        ra->released++;
        cerb__serve_unlock(&ra->mu);
    }
}

void cerb__serve_holds_destroy(struct cerb__serve_holds *t, int64_t budget_ms,
                               size_t *released, size_t *left)
{
    struct release_all ra = {.released = 0};
    pthread_t th[CERB_SERVE_STOP_THREADS];
    size_t n = 0, started = 0;

    cerb__serve_lock(&t->mu);
    ra.next = t->head;
    t->head = NULL;
    cerb__serve_unlock(&t->mu);
    for (struct cerb__serve_hold *h = ra.next; h; h = h->next)
        n++;
    if (pthread_mutex_init(&ra.mu, NULL) != 0)
        abort();
    ra.deadline_ns = cerb__serve_now_ns() + (budget_ms > 0 ? budget_ms : 0) * INT64_C(1000000);
    /* A thread per hold up to the limit; none when there are none. If no
     * thread can be made, this one releases them (still by the deadline). */
    while (started < n && started < CERB_SERVE_STOP_THREADS &&
           pthread_create(&th[started], NULL, release_some, &ra) == 0)
        started++;
    if (n > 0 && started == 0)
        release_some(&ra);
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&ra.mu);
    *released = ra.released;
    *left = 0;
    /* Past the deadline: these are not released by the server; their
     * server lease ends them (the client's close tries one release more
     * per engine, cerb_client_close). The hold objects are the client's
     * to free then; no lost callback may reach this table any more. */
    while (ra.next) {
        struct cerb__serve_hold *h = ra.next;
        ra.next = h->next;
        cerb_hold_on_lost(h->hold, NULL, NULL);
        free(h);
        (*left)++;
    }
    cerb__serve_attempts_destroy(&t->attempts); /* unfinished: failed */
    /* Off the live list: a lost callback still running for a hold freed
     * above has finished with the table once this returns. */
    cerb__serve_lock(&live_mu);
    for (struct cerb__serve_holds **p = &live_head; *p; p = &(*p)->live_next) {
        if (*p == t) {
            *p = t->live_next;
            break;
        }
    }
    cerb__serve_unlock(&live_mu);
    if (pthread_cond_destroy(&t->changed) != 0 || pthread_mutex_destroy(&t->mu) != 0)
        abort();
}
