/*
 * guard_fault_engine.c — the "gfault" engine (guard_fault_engine.h): the
 * local engine's table with its guard methods behind a switch that fails
 * chosen calls, the guard's counterpart of fault_engine.c (kept apart so
 * that the lock suites' engine stays a version-1 table without a guard).
 */
#define _POSIX_C_SOURCE 200809L
#include "guard_fault_engine.h"

#include <stdatomic.h>
#include <string.h>

#include "alloc.h"
#include "engine.h"
#include "error.h"

extern const struct cerb_engine_ops cerb__local_engine_ops;
#define INNER (&cerb__local_engine_ops)

struct gplan {
    atomic_long countdown;
    atomic_bool persistent;
    atomic_int kind;
    atomic_bool tripped;
};

static struct gplan plans[GFAULT_NOPS];
static atomic_long ncalls[GFAULT_NOPS];

void guard_fault_set(enum gfault_op op, long nth, bool persistent, enum gfault_kind kind)
{
    atomic_store(&plans[op].tripped, false);
    atomic_store(&plans[op].kind, kind);
    atomic_store(&plans[op].persistent, persistent);
    atomic_store(&plans[op].countdown, nth);
}

void guard_fault_reset(void)
{
    guard_fault_on_begin(NULL, NULL);
    for (int i = 0; i < GFAULT_NOPS; i++) {
        guard_fault_set((enum gfault_op)i, 0, false, GFAULT_BEFORE);
        atomic_store(&ncalls[i], 0);
    }
}

long guard_fault_calls(enum gfault_op op)
{
    return atomic_load(&ncalls[op]);
}

/* -1: no fault this call; else the kind to inject. */
static int should_fail(enum gfault_op op)
{
    struct gplan *p = &plans[op];
    atomic_fetch_add(&ncalls[op], 1);
    if (atomic_load(&p->tripped) && atomic_load(&p->persistent))
        return atomic_load(&p->kind);
    long left = atomic_load(&p->countdown);
    while (left > 0) {
        if (atomic_compare_exchange_weak(&p->countdown, &left, left - 1)) {
            if (left == 1) {
                atomic_store(&p->tripped, true);
                return atomic_load(&p->kind);
            }
            return -1;
        }
    }
    return -1;
}

static cerb_status injected(int kind, cerb_outcome *oc)
{
    if (oc)
        *oc = kind == GFAULT_AFTER ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
    return cerb__error_set(CERB_EIO, "gfault: injected %s failure",
                           kind == GFAULT_AFTER ? "reply-lost" : "connection");
}

static void (*_Atomic on_begin)(void *);
static void *_Atomic on_begin_ud;

void guard_fault_on_begin(void (*fn)(void *), void *ud)
{
    atomic_store(&on_begin_ud, ud);
    atomic_store(&on_begin, fn);
}

static cerb_status g_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g, void **res,
                           size_t *len)
{
    void (*fn)(void *) = atomic_load(&on_begin);
    if (fn)
        fn(atomic_load(&on_begin_ud));
    int k = should_fail(GFAULT_BEGIN);
    if (k == GFAULT_BEFORE)
        return injected(k, &g->outcome);
    cerb_status st = INNER->guard_begin(e, rec, g, res, len);
    if (k == GFAULT_AFTER) {
        if (*res) { /* the answer is lost with its result */
            cerb__free(*res);
            *res = NULL;
            *len = 0;
        }
        return injected(k, &g->outcome);
    }
    return st;
}

static cerb_status g_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    int k = should_fail(GFAULT_RENEW);
    if (k == GFAULT_BEFORE)
        return injected(k, &g->outcome);
    cerb_status st = INNER->guard_renew(e, rec, g);
    return k == GFAULT_AFTER ? injected(k, &g->outcome) : st;
}

static cerb_status g_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok, const void *res,
                            size_t len, int64_t keep_ms, cerb_outcome *oc)
{
    int k = should_fail(GFAULT_FINISH);
    if (k == GFAULT_BEFORE)
        return injected(k, oc);
    cerb_status st = INNER->guard_finish(e, rec, ok, res, len, keep_ms, oc);
    return k == GFAULT_AFTER ? injected(k, oc) : st;
}

static cerb_status g_check(cerb_engine *e, const cerb_guard_rec *rec, cerb_guard_found *found)
{
    int k = should_fail(GFAULT_CHECK);
    if (k >= 0)
        return injected(k, NULL);
    return INNER->guard_check(e, rec, found);
}

static struct cerb_engine_ops gfault_ops;

void guard_fault_register(void)
{
    static atomic_bool made;
    cerb__engines_builtin();
    if (atomic_exchange(&made, true))
        return; /* registered already: the table must not change */
    gfault_ops = *INNER;
    gfault_ops.name = "gfault";
    gfault_ops.guard_begin = g_begin;
    gfault_ops.guard_renew = g_renew;
    gfault_ops.guard_finish = g_finish;
    gfault_ops.guard_check = g_check;
    cerb__engine_register(&gfault_ops);
}
