/*
 * script_engine.c — the "sa" and "sb" test engines (script_engine.h).
 *
 * Each server is a small table of names behind one mutex: the owner token,
 * the lease end on the core's clock (an expired lease is free, as a server's
 * TTL would be), and a fence counter that only grows. A waiting acquire
 * polls the table every 2 ms until its deadline or its stop flag, which is
 * enough for tests of the core's logic and keeps the engine obvious. The
 * knobs are read under the same mutex, so a test flips a fault between two
 * calls without races.
 *
 * The guard's records (engine ops version 2) sit in a second small table of
 * the same server, keyed by record id: a state (running or done), the token
 * of the attempt that wrote it, an expiry on the core's clock (an expired
 * record is absent, as a server's TTL would make it) and, once done, the
 * result. Each method is one step under the mutex with the semantics of the
 * local engine's in-memory records (core/engine_local_guard.c), and every
 * knob that makes a lock call go unanswered (down, cut, slow, lost replies)
 * makes a guard call go unanswered the same way, so the core's ambiguity
 * handling meets the same faults on both paths.
 */
#define _POSIX_C_SOURCE 200809L
#include "script_engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "engine.h"
#include "error.h"

#define MAX_NAMES 256
#define MAX_GRECS 256

struct grecord {
    char id[65];
    char state;          /* 'R' running, 'D' done; 0: a free slot */
    char token[33];
    int64_t expires_ns;  /* CERB_DEADLINE_NEVER: kept forever */
    char *result;        /* malloc'd; NULL for none */
    size_t len;
};

struct entry {
    char name[256];
    char token[33];
    int64_t until_ns;
    int64_t granted_ns;
    uint64_t fence;
};

struct server {
    pthread_mutex_t mu;
    struct entry e[MAX_NAMES];
    size_t n;
    struct script_knobs k;
    struct grecord g[MAX_GRECS];
    size_t ng;           /* slots of g ever used: the rest are free */
    atomic_long guard_calls;
    atomic_long held_calls;
    atomic_long open_calls;
    atomic_long check_calls;
};

static struct server servers[2] = {{.mu = PTHREAD_MUTEX_INITIALIZER},
                                   {.mu = PTHREAD_MUTEX_INITIALIZER}};

#define MAX_CLIENTS 32

struct cerb_engine {
    struct server *srv;
    int client; /* script_engine_next_client; bit in knobs.cut */
};

static atomic_int next_client;

/* Find or add; mu held. NULL when the table is full. */
static struct entry *find(struct server *s, const char *name, bool add)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->e[i].name, name) == 0)
            return &s->e[i];
    if (!add || s->n == MAX_NAMES)
        return NULL;
    struct entry *e = &s->e[s->n++];
    memset(e, 0, sizeof *e);
    strncpy(e->name, name, sizeof e->name - 1);
    return e;
}

static bool held_now(const struct entry *e, int64_t now)
{
    return e && e->token[0] && now < e->until_ns;
}

static cerb_status down(cerb_grant *g)
{
    if (g)
        g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "script: server down");
}

/* A read that a slow server did not answer in time (nothing to apply):
 * said apart from a server down, so a step log tells the two faults. */
static cerb_status slow_read(cerb_grant *g)
{
    if (g)
        g->outcome = CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "script: server slow (no reply in time)");
}

/* No answer for this client: down, or cut off from it. mu held. */
static bool unreachable(const struct cerb_engine *eng)
{
    return eng->srv->k.down || (eng->srv->k.cut & (UINT32_C(1) << eng->client));
}

/* A call that got no answer first waits its op timeout; mu not held. */
static void no_answer_delay(int64_t ms)
{
    if (ms > 0)
        cerb__nap_ms(ms);
}

static cerb_status open_common(struct server *s, cerb_engine **out)
{
    /* One instance per server and client id: nothing to free. */
    static struct cerb_engine inst[2][MAX_CLIENTS];
    int id = atomic_load(&next_client);
    atomic_fetch_add(&s->open_calls, 1);
    pthread_mutex_lock(&s->mu);
    bool fails = s->k.open_fails || s->k.down || (s->k.cut & (UINT32_C(1) << id));
    int64_t delay = s->k.open_delay_ms;
    pthread_mutex_unlock(&s->mu);
    if (delay > 0)
        cerb__nap_ms(delay);
    if (fails)
        return cerb__error_set(CERB_EIO, "script: open refused");
    struct cerb_engine *e = &inst[s - servers][id];
    /* A slot always holds the same values; written once, so that another
     * client's prober reading it (two clients of one id in a test) never
     * races a write (TSan). */
    if (e->srv != s)
        e->srv = s;
    if (e->client != id)
        e->client = id;
    *out = e;
    return CERB_OK;
}

static cerb_status a_open(const cerb_engine_env *env, cerb_engine **out)
{
    (void)env;
    return open_common(&servers[SCRIPT_A], out);
}

static cerb_status b_open(const cerb_engine_env *env, cerb_engine **out)
{
    (void)env;
    return open_common(&servers[SCRIPT_B], out);
}

static void s_close(cerb_engine *e) { (void)e; }

/* One attempt; mu held. */
static cerb_status try_once(struct server *s, cerb_engine_lock *lk, cerb_grant *g)
{
    int64_t now = cerb_monotime();
    struct entry *e = find(s, lk->name, true);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "script: table full");
    if (held_now(e, now) && strcmp(e->token, lk->token) != 0 && !s->k.grant_twice)
        return CERB_BUSY;
    if (!held_now(e, now) || strcmp(e->token, lk->token) != 0)
        e->granted_ns = now;
    memcpy(e->token, lk->token, sizeof e->token);
    e->until_ns = now + lk->lease_ms * CERB_NS_PER_MS;
    if (e->fence < lk->fence_floor)
        e->fence = lk->fence_floor;
    g->fence = ++e->fence;
    g->sent_ns = now;
    g->ttl_ms = lk->lease_ms;
    g->outcome = CERB_OUTCOME_YES;
    return CERB_OK;
}

static cerb_status s_acquire(cerb_engine *eng, cerb_engine_lock *lk, int64_t deadline_ns,
                             const atomic_int *stop, cerb_grant *g)
{
    struct server *s = eng->srv;
    memset(g, 0, sizeof *g);
    pthread_mutex_lock(&s->mu);
    void (*hook)(void *) = s->k.before_grant;
    void *hook_ud = s->k.before_grant_ud;
    s->k.before_grant = NULL;
    pthread_mutex_unlock(&s->mu);
    if (hook)
        hook(hook_ud);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int64_t fail_ms = s->k.fail_ms;
        if (unreachable(eng)) {
            pthread_mutex_unlock(&s->mu);
            no_answer_delay(fail_ms);
            return down(g);
        }
        if (s->k.slow) {
            pthread_mutex_unlock(&s->mu);
            no_answer_delay(fail_ms);
            pthread_mutex_lock(&s->mu);
            try_once(s, lk, g);
            pthread_mutex_unlock(&s->mu);
            memset(g, 0, sizeof *g);
            g->outcome = CERB_OUTCOME_UNKNOWN;
            return cerb__error_set(CERB_EIO, "script: server slow (no reply in time)");
        }
        cerb_status st = try_once(s, lk, g);
        bool lose = st == CERB_OK && s->k.lose_acquire;
        if (lose)
            s->k.lose_acquire = false;
        pthread_mutex_unlock(&s->mu);
        if (lose) {
            no_answer_delay(fail_ms);
            g->outcome = CERB_OUTCOME_UNKNOWN;
            return cerb__error_set(CERB_EIO, "script: reply lost");
        }
        if (st != CERB_BUSY)
            return st;
        if (deadline_ns == 0)
            return CERB_BUSY;
        if (stop && atomic_load(stop))
            return CERB_INTERRUPTED;
        if (cerb_monotime() >= deadline_ns)
            return CERB_TIMEOUT;
        cerb__nap_ms(2);
    }
}

static cerb_status s_renew(cerb_engine *eng, cerb_engine_lock *lk, cerb_grant *g)
{
    struct server *s = eng->srv;
    memset(g, 0, sizeof *g);
    pthread_mutex_lock(&s->mu);
    int64_t delay = s->k.renew_delay_ms;
    pthread_mutex_unlock(&s->mu);
    if (delay > 0)
        cerb__nap_ms(delay);
    pthread_mutex_lock(&s->mu);
    int64_t fail_ms = s->k.fail_ms;
    if (unreachable(eng) || s->k.renew_fails) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(fail_ms);
        return down(g);
    }
    bool slow = s->k.slow;
    if (slow) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(fail_ms);
        pthread_mutex_lock(&s->mu);
    }
    int64_t now = cerb_monotime();
    struct entry *e = find(s, lk->name, false);
    cerb_status st = CERB_NOT_OWNER;
    if (held_now(e, now) && strcmp(e->token, lk->token) == 0) {
        e->until_ns = now + lk->lease_ms * CERB_NS_PER_MS;
        g->fence = e->fence;
        g->sent_ns = now;
        g->ttl_ms = lk->lease_ms;
        st = CERB_OK;
    }
    if (slow) {
        pthread_mutex_unlock(&s->mu);
        memset(g, 0, sizeof *g);
        g->outcome = CERB_OUTCOME_UNKNOWN;
        return cerb__error_set(CERB_EIO, "script: server slow (no reply in time)");
    }
    bool lose = st == CERB_OK && s->k.lose_renew;
    if (lose)
        s->k.lose_renew = false;
    pthread_mutex_unlock(&s->mu);
    if (lose) {
        no_answer_delay(fail_ms);
        memset(g, 0, sizeof *g);
        return cerb__error_set(CERB_EIO, "script: renewal reply lost");
    }
    return st;
}

static cerb_status s_release(cerb_engine *eng, cerb_engine_lock *lk)
{
    struct server *s = eng->srv;
    pthread_mutex_lock(&s->mu);
    int64_t fail_ms = s->k.fail_ms;
    if (unreachable(eng)) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(fail_ms);
        return down(NULL);
    }
    bool slow = s->k.slow;
    if (slow) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(fail_ms);
        pthread_mutex_lock(&s->mu);
    }
    struct entry *e = find(s, lk->name, false);
    cerb_status st = CERB_NOT_OWNER;
    if (held_now(e, cerb_monotime()) && strcmp(e->token, lk->token) == 0) {
        e->token[0] = '\0';
        st = CERB_OK;
    }
    if (slow) {
        pthread_mutex_unlock(&s->mu);
        return cerb__error_set(CERB_EIO, "script: server slow (no reply in time)");
    }
    bool lose = st == CERB_OK && s->k.lose_release;
    if (lose)
        s->k.lose_release = false;
    pthread_mutex_unlock(&s->mu);
    if (lose) {
        no_answer_delay(fail_ms);
        return cerb__error_set(CERB_EIO, "script: release reply lost");
    }
    return st;
}

static cerb_status s_check(cerb_engine *eng, cerb_engine_lock *lk, cerb_grant *g)
{
    struct server *s = eng->srv;
    memset(g, 0, sizeof *g);
    atomic_fetch_add(&s->check_calls, 1);
    pthread_mutex_lock(&s->mu);
    int64_t fail_ms = s->k.fail_ms;
    if (unreachable(eng) || s->k.check_fails || s->k.slow) {
        bool slow = s->k.slow && !unreachable(eng) && !s->k.check_fails;
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(fail_ms);
        return slow ? slow_read(g) : down(g);
    }
    int64_t now = cerb_monotime();
    struct entry *e = find(s, lk->name, false);
    cerb_status st = CERB_NOT_OWNER;
    if (held_now(e, now) && strcmp(e->token, lk->token) == 0) {
        g->fence = e->fence;
        g->sent_ns = now;
        g->ttl_ms = (e->until_ns - now) / CERB_NS_PER_MS;
        if (s->k.check_ttl_ms > 0) {
            g->ttl_ms = s->k.check_ttl_ms;
            e->until_ns = now + s->k.check_ttl_ms * CERB_NS_PER_MS;
        }
        st = CERB_OK;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

static cerb_status s_probe(cerb_engine *eng, int64_t timeout_ms)
{
    struct server *s = eng->srv;
    pthread_mutex_lock(&s->mu);
    bool bad = unreachable(eng) || s->k.probe_fails || s->k.slow;
    int64_t fail_ms = s->k.fail_ms < timeout_ms ? s->k.fail_ms : timeout_ms;
    pthread_mutex_unlock(&s->mu);
    if (bad)
        no_answer_delay(fail_ms);
    return bad ? cerb__error_set(CERB_EIO, "script: probe timed out") : CERB_OK;
}

static cerb_status s_held(cerb_engine *eng, const char *name)
{
    struct server *s = eng->srv;
    pthread_mutex_lock(&s->mu);
    int64_t fail_ms = s->k.fail_ms;
    if (unreachable(eng) || s->k.slow) {
        bool slow = !unreachable(eng);
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(fail_ms);
        return slow ? slow_read(NULL) : down(NULL);
    }
    atomic_fetch_add(&s->held_calls, 1);
    bool h = held_now(find(s, name, false), cerb_monotime());
    pthread_mutex_unlock(&s->mu);
    return h ? CERB_BUSY : CERB_OK;
}

static int64_t s_hold_bound(cerb_engine *eng)
{
    struct server *s = eng->srv;
    pthread_mutex_lock(&s->mu);
    int64_t b = s->k.hold_bound_ms;
    pthread_mutex_unlock(&s->mu);
    return b;
}


/* ------------------------------------------------------------ guard */

static void grec_drop(struct grecord *r)
{
    free(r->result);
    memset(r, 0, sizeof *r);
}

/* The live record `id`, or NULL; an expired one is dropped on the way.
 * mu held. */
static struct grecord *gfind(struct server *s, const char *id, int64_t now)
{
    for (size_t i = 0; i < s->ng; i++) {
        struct grecord *r = &s->g[i];
        if (!r->state || strcmp(r->id, id) != 0)
            continue;
        if (r->expires_ns <= now) {
            grec_drop(r);
            return NULL;
        }
        return r;
    }
    return NULL;
}

/* A free slot for `id` (expired records give theirs back); mu held. */
static struct grecord *gadd(struct server *s, const char *id, int64_t now)
{
    for (size_t i = 0; i < MAX_GRECS; i++) {
        struct grecord *r = &s->g[i];
        if (r->state && r->expires_ns <= now)
            grec_drop(r);
        if (!r->state) {
            memcpy(r->id, id, sizeof r->id);
            if (i >= s->ng)
                s->ng = i + 1;
            return r;
        }
    }
    return NULL;
}

/*
 * Whether guard call on eng gets an answer; mu held. When it does not,
 * *wait_ms is what the call costs before it fails. *late is set when the
 * server is slow: the caller waits fail_ms first (mu released), then
 * applies the request and reports its reply lost.
 */
static bool guard_unanswered(const struct cerb_engine *eng, int64_t *wait_ms, bool *late)
{
    struct server *s = eng->srv;
    *wait_ms = s->k.guard_stall_ms > 0 ? s->k.guard_stall_ms : s->k.fail_ms;
    *late = s->k.slow;
    atomic_fetch_add(&s->guard_calls, 1);
    return unreachable(eng);
}

/* Wait out a slow server's delay; mu held on entry and on return. */
static void arrive_late(struct server *s, int64_t wait_ms)
{
    pthread_mutex_unlock(&s->mu);
    no_answer_delay(wait_ms);
    pthread_mutex_lock(&s->mu);
}

static cerb_status reply_lost(cerb_outcome *oc, const char *what)
{
    *oc = CERB_OUTCOME_UNKNOWN;
    return cerb__error_set(CERB_EIO, "script: %s reply lost", what);
}

static cerb_status s_guard_begin(cerb_engine *eng, const cerb_guard_rec *rec, cerb_grant *g,
                                 void **result, size_t *result_len)
{
    struct server *s = eng->srv;
    int64_t wait_ms;
    bool late;
    pthread_mutex_lock(&s->mu);
    if (guard_unanswered(eng, &wait_ms, &late)) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(wait_ms);
        return down(g);
    }
    if (late)
        arrive_late(s, wait_ms);
    int64_t now = cerb_monotime();
    struct grecord *r = gfind(s, rec->id, now);
    cerb_status st = CERB_OK;
    bool ours = r && r->state == 'R' && strcmp(r->token, rec->token) == 0;
    if (!r || (r->state == 'R' && !ours && s->k.guard_grant_twice)) {
        if (!r)
            r = gadd(s, rec->id, now);
        if (!r) {
            pthread_mutex_unlock(&s->mu);
            return cerb__error_set(CERB_ENOMEM, "script: guard table full");
        }
        r->state = 'R';
        memcpy(r->token, rec->token, sizeof r->token);
        r->expires_ns = now + rec->running_ms * CERB_NS_PER_MS;
        g->sent_ns = now;
        g->ttl_ms = rec->running_ms;
    } else if (r->state == 'D') {
        char *copy = cerb__malloc(r->len + 1);
        if (!copy) {
            pthread_mutex_unlock(&s->mu);
            return cerb__error_set(CERB_ENOMEM, "script: out of memory");
        }
        if (r->len)
            memcpy(copy, r->result, r->len);
        copy[r->len] = '\0';
        *result = copy;
        *result_len = r->len;
        st = CERB_DUPLICATE;
    } else if (ours) {
        g->sent_ns = now; /* a re-sent begin: the claim as it stands */
        g->ttl_ms = (r->expires_ns - now) / CERB_NS_PER_MS;
    } else {
        st = CERB_BUSY;
    }
    bool lose = late || s->k.lose_guard_begin;
    s->k.lose_guard_begin = false;
    pthread_mutex_unlock(&s->mu);
    if (!lose)
        return st;
    if (!late)
        no_answer_delay(wait_ms);
    if (st == CERB_DUPLICATE) {
        cerb__free(*result);
        *result = NULL;
        *result_len = 0;
    }
    memset(g, 0, sizeof *g);
    return reply_lost(&g->outcome, "guard begin");
}

static cerb_status s_guard_renew(cerb_engine *eng, const cerb_guard_rec *rec, cerb_grant *g)
{
    struct server *s = eng->srv;
    int64_t wait_ms;
    bool late;
    pthread_mutex_lock(&s->mu);
    int64_t delay = s->k.renew_delay_ms;
    pthread_mutex_unlock(&s->mu);
    if (delay > 0)
        cerb__nap_ms(delay);
    pthread_mutex_lock(&s->mu);
    if (guard_unanswered(eng, &wait_ms, &late) || s->k.renew_fails) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(wait_ms);
        return down(g);
    }
    if (late)
        arrive_late(s, wait_ms);
    int64_t now = cerb_monotime();
    struct grecord *r = gfind(s, rec->id, now);
    cerb_status st = CERB_NOT_OWNER;
    if (r && r->state == 'R' && strcmp(r->token, rec->token) == 0) {
        r->expires_ns = now + rec->running_ms * CERB_NS_PER_MS;
        g->sent_ns = now;
        g->ttl_ms = rec->running_ms;
        st = CERB_OK;
    }
    bool lose = late || s->k.lose_guard_renew;
    s->k.lose_guard_renew = false;
    pthread_mutex_unlock(&s->mu);
    if (!lose)
        return st;
    if (!late)
        no_answer_delay(wait_ms);
    memset(g, 0, sizeof *g);
    return reply_lost(&g->outcome, "guard renewal");
}

static cerb_status s_guard_finish(cerb_engine *eng, const cerb_guard_rec *rec, int succeeded,
                                  const void *result, size_t len, int64_t keep_ms,
                                  cerb_outcome *outcome)
{
    struct server *s = eng->srv;
    int64_t wait_ms;
    bool late;
    pthread_mutex_lock(&s->mu);
    if (guard_unanswered(eng, &wait_ms, &late)) {
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(wait_ms);
        *outcome = CERB_OUTCOME_NO;
        return cerb__error_set(CERB_EIO, "script: server down");
    }
    if (late)
        arrive_late(s, wait_ms);
    int64_t now = cerb_monotime();
    struct grecord *r = gfind(s, rec->id, now);
    cerb_status st = CERB_NOT_OWNER;
    if (r && strcmp(r->token, rec->token) == 0) {
        if (r->state == 'D') {
            st = succeeded ? CERB_OK : CERB_NOT_OWNER; /* a re-sent success */
        } else if (!succeeded || s->k.guard_forget_done) {
            grec_drop(r);
            st = CERB_OK;
        } else {
            char *copy = malloc(len + 1);
            if (!copy) {
                pthread_mutex_unlock(&s->mu);
                return cerb__error_set(CERB_ENOMEM, "script: out of memory");
            }
            if (len)
                memcpy(copy, result, len);
            copy[len] = '\0';
            r->state = 'D';
            r->result = copy;
            r->len = len;
            r->expires_ns = keep_ms < 0 ? CERB_DEADLINE_NEVER : now + keep_ms * CERB_NS_PER_MS;
            st = CERB_OK;
        }
    }
    bool lose = late || s->k.lose_guard_finish;
    s->k.lose_guard_finish = false;
    pthread_mutex_unlock(&s->mu);
    if (!lose)
        return st;
    if (!late)
        no_answer_delay(wait_ms);
    return reply_lost(outcome, "guard finish");
}

static cerb_status s_guard_check(cerb_engine *eng, const cerb_guard_rec *rec,
                                 cerb_guard_found *found)
{
    struct server *s = eng->srv;
    int64_t wait_ms;
    bool late;
    pthread_mutex_lock(&s->mu);
    if (guard_unanswered(eng, &wait_ms, &late) || late || s->k.check_fails) {
        bool slow = late && !unreachable(eng) && !s->k.check_fails;
        pthread_mutex_unlock(&s->mu);
        no_answer_delay(wait_ms);
        return slow ? slow_read(NULL) : down(NULL);
    }
    struct grecord *r = gfind(s, rec->id, cerb_monotime());
    if (!r)
        *found = CERB_GUARD_FOUND_NONE;
    else if (strcmp(r->token, rec->token) != 0)
        *found = CERB_GUARD_FOUND_OTHER;
    else
        *found = r->state == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
    pthread_mutex_unlock(&s->mu);
    return CERB_OK;
}

#define SCRIPT_OPS(NAME, OPEN)                                                                    \
    {                                                                                             \
        .version = CERB_ENGINE_OPS_V2, .name = NAME,                                              \
        .caps = CERB_CAP_FENCING | CERB_CAP_WAIT | CERB_CAP_FENCE_FLOOR, .lock_priv_size = 0,     \
        .open = OPEN, .close = s_close, .acquire = s_acquire, .renew = s_renew,                   \
        .release = s_release, .check_owner = s_check, .probe = s_probe, .held = s_held,           \
        .hold_bound_ms = s_hold_bound, .guard_begin = s_guard_begin,                              \
        .guard_renew = s_guard_renew, .guard_finish = s_guard_finish,                             \
        .guard_check = s_guard_check,                                                             \
    }

static const struct cerb_engine_ops sa_ops = SCRIPT_OPS("sa", a_open);
static const struct cerb_engine_ops sb_ops = SCRIPT_OPS("sb", b_open);

void script_engine_reset(void)
{
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&servers[i].mu);
        servers[i].n = 0;
        memset(&servers[i].k, 0, sizeof servers[i].k);
        for (size_t j = 0; j < MAX_GRECS; j++)
            grec_drop(&servers[i].g[j]);
        servers[i].ng = 0;
        atomic_store(&servers[i].guard_calls, 0);
        atomic_store(&servers[i].held_calls, 0);
        atomic_store(&servers[i].check_calls, 0);
        pthread_mutex_unlock(&servers[i].mu);
    }
}

void script_engine_register(void)
{
    cerb__engines_builtin();
    cerb__engine_register(&sa_ops); /* a second registration is refused: fine */
    cerb__engine_register(&sb_ops);
    script_engine_reset();
}

void script_engine_set(enum script_server s, struct script_knobs k)
{
    pthread_mutex_lock(&servers[s].mu);
    servers[s].k = k;
    pthread_mutex_unlock(&servers[s].mu);
}

bool script_engine_holder(enum script_server s, const char *name, char out[33])
{
    pthread_mutex_lock(&servers[s].mu);
    struct entry *e = find(&servers[s], name, false);
    bool h = held_now(e, cerb_monotime());
    memcpy(out, h ? e->token : "", h ? 33 : 1);
    pthread_mutex_unlock(&servers[s].mu);
    return h;
}

void script_engine_expire_all(enum script_server s)
{
    pthread_mutex_lock(&servers[s].mu);
    for (size_t i = 0; i < servers[s].n; i++)
        servers[s].e[i].until_ns = 0;
    pthread_mutex_unlock(&servers[s].mu);
}

void script_engine_set_fence(enum script_server s, const char *name, uint64_t v)
{
    pthread_mutex_lock(&servers[s].mu);
    struct entry *e = find(&servers[s], name, true);
    if (e)
        e->fence = v;
    pthread_mutex_unlock(&servers[s].mu);
}

void script_engine_next_client(int id)
{
    atomic_store(&next_client, id >= 0 && id < MAX_CLIENTS ? id : 0);
}

struct script_knobs script_engine_get(enum script_server s)
{
    pthread_mutex_lock(&servers[s].mu);
    struct script_knobs k = servers[s].k;
    pthread_mutex_unlock(&servers[s].mu);
    return k;
}

bool script_engine_record(enum script_server s, const char *name, struct script_record *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&servers[s].mu);
    struct entry *e = find(&servers[s], name, false);
    bool h = held_now(e, cerb_monotime());
    if (h)
        memcpy(out->token, e->token, sizeof out->token);
    if (e) {
        out->until_ns = e->until_ns;
        out->granted_ns = e->granted_ns;
        out->fence = e->fence;
    }
    pthread_mutex_unlock(&servers[s].mu);
    return h;
}

long script_engine_open_calls(enum script_server s) { return atomic_load(&servers[s].open_calls); }

long script_engine_check_calls(enum script_server s) { return atomic_load(&servers[s].check_calls); }

long script_engine_held_calls(enum script_server s) { return atomic_load(&servers[s].held_calls); }

bool script_engine_guard_record(enum script_server s, const char *id,
                                struct script_guard_record *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&servers[s].mu);
    struct grecord *r = gfind(&servers[s], id, cerb_monotime());
    if (r) {
        out->state = r->state;
        memcpy(out->token, r->token, sizeof out->token);
        out->expires_ns = r->expires_ns;
    }
    pthread_mutex_unlock(&servers[s].mu);
    return r != NULL;
}

void script_engine_guard_wipe(enum script_server s)
{
    pthread_mutex_lock(&servers[s].mu);
    for (size_t j = 0; j < MAX_GRECS; j++)
        grec_drop(&servers[s].g[j]);
    pthread_mutex_unlock(&servers[s].mu);
}

long script_engine_guard_calls(enum script_server s)
{
    return atomic_load(&servers[s].guard_calls);
}
