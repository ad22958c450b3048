/*
 * fault_engine.c — the "fault" engine: the local engine behind a switch that
 * fails chosen calls. FAULT_AFTER runs the real call and then reports an I/O
 * error with outcome UNKNOWN, which is exactly what a timeout after the
 * request was sent looks like to the core.
 */
#define _POSIX_C_SOURCE 200809L
#include "fault_engine.h"

#include <stdatomic.h>
#include <string.h>

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
static atomic_long faults;

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
    }
    atomic_store(&faults, 0);
}

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
    return INNER->open(env, out);
}

static void f_close(cerb_engine *e) { INNER->close(e); }

static cerb_status injected(cerb_grant *g, int kind)
{
    if (g)
        g->outcome = kind == FAULT_AFTER ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "fault: injected %s failure",
                           kind == FAULT_AFTER ? "reply-lost" : "connect");
}

static cerb_status f_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                             const atomic_int *intr, cerb_grant *g)
{
    int k = should_fail(FAULT_ACQUIRE);
    if (k == FAULT_BEFORE)
        return injected(g, k);
    cerb_status st = INNER->acquire(e, lk, deadline_ns, intr, g);
    if (k == FAULT_AFTER && st == CERB_OK)
        return injected(g, k);
    return st;
}

static cerb_status f_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    int k = should_fail(FAULT_RENEW);
    if (k == FAULT_BEFORE)
        return injected(g, k);
    cerb_status st = INNER->renew(e, lk, g);
    return k == FAULT_AFTER ? injected(g, k) : st;
}

static cerb_status f_release(cerb_engine *e, cerb_engine_lock *lk)
{
    int k = should_fail(FAULT_RELEASE);
    if (k == FAULT_BEFORE)
        return injected(NULL, k);
    cerb_status st = INNER->release(e, lk);
    return k == FAULT_AFTER ? injected(NULL, k) : st;
}

static cerb_status f_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *g)
{
    int k = should_fail(FAULT_CHECK);
    if (k >= 0)
        return injected(g, k);
    return INNER->check_owner(e, lk, g);
}

static void f_cancel(cerb_engine *e, cerb_engine_lock *lk) { INNER->cancel(e, lk); }

static cerb_status f_probe(cerb_engine *e, int64_t timeout_ms) { return INNER->probe(e, timeout_ms); }

static const struct cerb_engine_ops fault_ops = {
    .version = CERB_ENGINE_OPS_V1,
    .name = "fault",
    .caps = CERB_CAP_FENCING | CERB_CAP_WAIT,
    .lock_priv_size = 64, /* covers the local engine's per-hold state */
    .open = f_open,
    .close = f_close,
    .acquire = f_acquire,
    .renew = f_renew,
    .release = f_release,
    .check_owner = f_check,
    .cancel = f_cancel,
    .probe = f_probe,
};

void fault_engine_register(void)
{
    cerb__engines_builtin();
    cerb__engine_register(&fault_ops);
}
