/*
 * fault_engine.c — the "fault" engine: the local engine behind a switch that
 * fails chosen calls. FAULT_AFTER runs the real call and then reports an I/O
 * error with outcome UNKNOWN, which is exactly what a timeout after the
 * request was sent looks like to the core. A delay makes calls slow (a
 * loaded server) or stall until a simulated op timeout (a frozen one), and
 * fault_engine_emit() plays the engine's asynchronous events (session lost).
 */
#define _POSIX_C_SOURCE 200809L
#include "fault_engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "error.h"

extern const struct cerb_engine_ops cerb__local_engine_ops;
#define INNER (&cerb__local_engine_ops)

struct plan {
    atomic_long countdown; /* calls left before the fault; 0 = off */
    atomic_bool persistent;
    atomic_int kind;
    atomic_bool tripped;
};

static struct plan plans[FAULT_NOPS];
static atomic_long calls[FAULT_NOPS];
static atomic_long batch_calls; /* faultbatch's renew_batch calls */
/* faultbatch: this name's renewals fail; the caller's string, which must
 * outlive the setting (a literal): only the pointer changes, atomically. */
static _Atomic(const char *) batch_fail_name;
static atomic_long faults;
static atomic_long delay_ms[FAULT_NOPS];
static atomic_bool delay_stall[FAULT_NOPS];
static atomic_long ttl_div;

/* Open instances and their clients' event sinks, for fault_engine_emit. */
#define MAX_INSTANCES 16
static pthread_mutex_t inst_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    cerb_engine *e;
    void (*event)(void *, cerb_engine_event, const char *, const char *);
    void *ud;
} insts[MAX_INSTANCES];

void fault_engine_delay(enum fault_op op, long ms, bool stall)
{
    atomic_store(&delay_stall[op], stall);
    atomic_store(&delay_ms[op], ms);
}

int fault_engine_emit(int ev, const char *name)
{
    int n = 0;
    pthread_mutex_lock(&inst_mu);
    for (int i = 0; i < MAX_INSTANCES; i++)
        if (insts[i].e && insts[i].event) {
            insts[i].event(insts[i].ud, (cerb_engine_event)ev, name, NULL);
            n++;
        }
    pthread_mutex_unlock(&inst_mu);
    return n;
}

/* The configured latency of op: true when the call must then stall. */
static bool delayed(enum fault_op op)
{
    enum fault_op which = atomic_load(&delay_ms[op]) ? op : FAULT_ANY;
    long ms = atomic_load(&delay_ms[which]);
    if (ms <= 0)
        return false;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
    return atomic_load(&delay_stall[which]);
}

static cerb_status stalled(cerb_grant *g)
{
    atomic_fetch_add(&faults, 1);
    if (g)
        g->outcome = CERB_OUTCOME_UNKNOWN;
    return cerb__error_set(CERB_TIMEOUT, "fault: injected stall (server frozen)");
}

void fault_engine_set(enum fault_op op, long nth, bool persistent, enum fault_kind kind)
{
    atomic_store(&plans[op].persistent, persistent);
    atomic_store(&plans[op].kind, kind);
    atomic_store(&plans[op].tripped, false);
    atomic_store(&plans[op].countdown, nth);
}

void fault_engine_reset(void)
{
    for (int i = 0; i < FAULT_NOPS; i++) {
        atomic_store(&plans[i].countdown, 0);
        atomic_store(&plans[i].tripped, false);
        atomic_store(&calls[i], 0);
        atomic_store(&delay_ms[i], 0);
    }
    atomic_store(&faults, 0);
    atomic_store(&ttl_div, 0);
    atomic_store(&batch_calls, 0);
    atomic_store(&batch_fail_name, NULL);
}

void fault_engine_ttl_div(long div) { atomic_store(&ttl_div, div); }

long fault_engine_calls(enum fault_op op) { return atomic_load(&calls[op]); }
long fault_engine_faults(void) { return atomic_load(&faults); }

/* -1 no fault, else the fault kind. */
static int check_plan(struct plan *p)
{
    if (atomic_load(&p->tripped))
        return atomic_load(&p->persistent) ? atomic_load(&p->kind) : -1;
    long c = atomic_load(&p->countdown);
    if (c <= 0)
        return -1;
    if (atomic_fetch_sub(&p->countdown, 1) == 1) {
        atomic_store(&p->tripped, true);
        return atomic_load(&p->kind);
    }
    return -1;
}

static int should_fail(enum fault_op op)
{
    atomic_fetch_add(&calls[op], 1);
    atomic_fetch_add(&calls[FAULT_ANY], 1);
    int k = check_plan(&plans[op]);
    if (k < 0)
        k = check_plan(&plans[FAULT_ANY]);
    if (k >= 0)
        atomic_fetch_add(&faults, 1);
    return k;
}

static cerb_status f_open(const cerb_engine_env *env, cerb_engine **out)
{
    cerb_status st = INNER->open(env, out);
    if (st != CERB_OK)
        return st;
    pthread_mutex_lock(&inst_mu);
    for (int i = 0; i < MAX_INSTANCES; i++)
        if (!insts[i].e) {
            insts[i].e = *out;
            insts[i].event = env->event;
            insts[i].ud = env->ud;
            break;
        }
    pthread_mutex_unlock(&inst_mu);
    return st;
}

static void f_close(cerb_engine *e)
{
    pthread_mutex_lock(&inst_mu);
    for (int i = 0; i < MAX_INSTANCES; i++)
        if (insts[i].e == e)
            insts[i].e = NULL;
    pthread_mutex_unlock(&inst_mu);
    INNER->close(e);
}

static cerb_status injected(cerb_grant *g, int kind)
{
    if (g)
        g->outcome = kind == FAULT_AFTER ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "fault: injected %s failure",
                           kind == FAULT_AFTER ? "reply-lost" : "connect");
}

/* The local engine's table for lk's primitive when it is a queued one. */
static const struct cerb_queue_methods *inner_queue(const cerb_engine_lock *lk)
{
    return lk->prim == CERB_PRIM_SEMAPHORE ? INNER->semaphore
           : lk->prim == CERB_PRIM_RWLOCK  ? INNER->rwlock
                                           : NULL;
}

static cerb_status f_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                             const atomic_int *intr, cerb_grant *g)
{
    int k = should_fail(FAULT_ACQUIRE);
    if (delayed(FAULT_ACQUIRE))
        return stalled(g);
    if (k == FAULT_BEFORE)
        return injected(g, k);
    const struct cerb_queue_methods *q = inner_queue(lk);
    cerb_status st = q ? q->acquire(e, lk, deadline_ns, intr, g)
                       : INNER->acquire(e, lk, deadline_ns, intr, g);
    if ((k == FAULT_AFTER && st == CERB_OK) || k == FAULT_LOST_REPLY)
        return injected(g, FAULT_AFTER);
    long div = atomic_load(&ttl_div);
    if (st == CERB_OK && div > 1)
        g->ttl_ms /= div;
    return st;
}

static cerb_status f_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    int k = should_fail(FAULT_RENEW);
    if (delayed(FAULT_RENEW))
        return stalled(g);
    if (k == FAULT_BEFORE)
        return injected(g, k);
    const struct cerb_queue_methods *q = inner_queue(lk);
    cerb_status st = q ? q->renew(e, lk, g) : INNER->renew(e, lk, g);
    return k == FAULT_AFTER ? injected(g, k) : st;
}

static cerb_status f_release(cerb_engine *e, cerb_engine_lock *lk)
{
    int k = should_fail(FAULT_RELEASE);
    if (delayed(FAULT_RELEASE))
        return stalled(NULL);
    if (k == FAULT_BEFORE)
        return injected(NULL, k);
    const struct cerb_queue_methods *q = inner_queue(lk);
    cerb_status st = q ? q->release(e, lk) : INNER->release(e, lk);
    return k == FAULT_AFTER ? injected(NULL, k) : st;
}

static cerb_status f_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    int k = should_fail(FAULT_CHECK);
    if (delayed(FAULT_CHECK))
        return stalled(g);
    if (k >= 0)
        return injected(g, k);
    const struct cerb_queue_methods *q = inner_queue(lk);
    return q ? q->check_owner(e, lk, g) : INNER->check_owner(e, lk, g);
}

static void f_cancel(cerb_engine *e, cerb_engine_lock *lk) { INNER->cancel(e, lk); }

static cerb_status f_probe(cerb_engine *e, int64_t timeout_ms) { return INNER->probe(e, timeout_ms); }

/* Elections: the local engine's, except that the value is proclaimed after
 * the grant (as on redis), through a proclaim that can be failed or slowed. */
static cerb_status f_proclaim(cerb_engine *e, cerb_engine_lock *lk, const void *v, size_t n,
                              cerb_outcome *oc)
{
    int k = should_fail(FAULT_PROCLAIM);
    if (delayed(FAULT_PROCLAIM)) {
        *oc = CERB_OUTCOME_UNKNOWN;
        return stalled(NULL);
    }
    if (k == FAULT_BEFORE) {
        *oc = CERB_OUTCOME_NO;
        return injected(NULL, k);
    }
    cerb_status st = INNER->election->proclaim(e, lk, v, n, oc);
    if (k == FAULT_AFTER && st == CERB_OK) {
        *oc = CERB_OUTCOME_UNKNOWN;
        return injected(NULL, k);
    }
    return st;
}

static cerb_status f_leader(cerb_engine *e, const char *name, int variant, cerb_leader_rec *out)
{
    return INNER->election->leader(e, name, variant, out);
}

static const struct cerb_election_methods fault_election = {
    .version = CERB_ELECTION_METHODS_V1,
    .flags = 0,
    .proclaim = f_proclaim,
    .leader = f_leader,
};

/* Semaphores and read-write locks: the local engine's queues through the
 * faulty acquire, renew, release and check above. */
static cerb_status f_sem_held(cerb_engine *e, const char *name)
{
    return INNER->semaphore->held(e, name);
}

static cerb_status f_rw_held(cerb_engine *e, const char *name)
{
    return INNER->rwlock->held(e, name);
}

static cerb_status f_sem_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    return INNER->semaphore->inspect(e, name, out);
}

static cerb_status f_rw_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    return INNER->rwlock->inspect(e, name, out);
}

static cerb_status f_fits(cerb_engine *e, const cerb_engine_lock *lk)
{
    return inner_queue(lk)->fits(e, lk);
}

static const struct cerb_queue_methods fault_semaphore = {
    .version = CERB_QUEUE_METHODS_V1, .acquire = f_acquire, .renew = f_renew,
    .release = f_release, .check_owner = f_check, .held = f_sem_held,
    .inspect = f_sem_inspect, .fits = f_fits};

static const struct cerb_queue_methods fault_rwlock = {
    .version = CERB_QUEUE_METHODS_V1, .acquire = f_acquire, .renew = f_renew,
    .release = f_release, .check_owner = f_check, .held = f_rw_held,
    .inspect = f_rw_inspect, .fits = f_fits};

/* "faultbatch": renewals in batches, as a Redis pipeline: one delay (a
 * slow server's round trip) for the whole batch, then each hold's. */
static void f_renew_batch(cerb_engine *e, cerb_renew_item *items, size_t n)
{
    atomic_fetch_add(&batch_calls, 1);
    bool stall = delayed(FAULT_RENEW);
    for (size_t i = 0; i < n; i++) {
        const char *fail = atomic_load(&batch_fail_name);
        if (fail && strcmp(items[i].lk->name, fail) == 0) {
            items[i].st = cerb__error_set(CERB_UNAVAILABLE, "fault: node of %s down", fail);
            continue;
        }
        if (stall) {
            items[i].st = stalled(&items[i].grant);
            continue;
        }
        const struct cerb_queue_methods *q = inner_queue(items[i].lk);
        items[i].st = q ? q->renew(e, items[i].lk, &items[i].grant)
                        : INNER->renew(e, items[i].lk, &items[i].grant);
    }
}

/* The methods both tables share: the local engine with faults injected. */
#define FAULT_OPS_COMMON                                                      \
    .version = CERB_ENGINE_OPS_V5, .caps = CERB_CAP_FENCING | CERB_CAP_WAIT,  \
    .lock_priv_size = 64, /* covers the local engine's per-hold state */      \
    .open = f_open, .close = f_close, .acquire = f_acquire, .renew = f_renew, \
    .release = f_release, .check_owner = f_check, .cancel = f_cancel,         \
    .probe = f_probe, .election = &fault_election, .semaphore = &fault_semaphore, \
    .rwlock = &fault_rwlock

static const struct cerb_engine_ops fault_ops = {FAULT_OPS_COMMON, .name = "fault"};

/* The gate's question (is the name held?), failed and slowed as a check. */
static cerb_status f_held(cerb_engine *e, const char *name)
{
    int k = should_fail(FAULT_CHECK);
    if (delayed(FAULT_CHECK))
        return stalled(NULL);
    if (k >= 0)
        return injected(NULL, k);
    return INNER->held(e, name);
}

/* "faultheld": the same engine answering the safe-switch gate's question,
 * so that it can be the gated engine of a switch. */
static const struct cerb_engine_ops fault_held_ops = {FAULT_OPS_COMMON, .name = "faultheld",
                                                      .held = f_held};

static const struct cerb_engine_ops fault_batch_ops = {FAULT_OPS_COMMON, .name = "faultbatch",
                                                       .renew_batch = f_renew_batch};

long fault_engine_batch_calls(void) { return atomic_load(&batch_calls); }

void fault_engine_batch_fail(const char *name)
{
    atomic_store(&batch_fail_name, name);
}

void fault_engine_register(void)
{
    cerb__engines_builtin();
    cerb__engine_register(&fault_ops);
    cerb__engine_register(&fault_held_ops);
    cerb__engine_register(&fault_batch_ops);
}
