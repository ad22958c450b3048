/*
 * guard_engine.c — the checking shims for the guard's engine methods
 * (cerb_engine_ops version 2, DESIGN.md §11).
 *
 * Like the lock shims in engine.c, these are the only way the core reaches
 * an engine's guard: each checks that the table is new enough to have the
 * slot and that the engine filled it (the four methods come as a group:
 * guard_begin present means the engine has a guard), resets what the engine
 * reports so a forgotten field reads as "no effect", and turns "this engine
 * has no guard" into CERB_UNAVAILABLE with a message naming the engine, so
 * the caller's on_unavailable policy decides. They live apart from engine.c
 * so that the lock shims and the guard's can change independently.
 */
#include "internal_posix.h"

#include "engine.h"

#include <string.h>

#include "alloc.h"
#include "error.h"

bool cerb__engine_has_guard(const struct cerb_engine_ops *ops)
{
    return ops && ops->version >= CERB_ENGINE_OPS_V2 && ops->guard_begin &&
           ops->guard_renew && ops->guard_finish && ops->guard_check;
}

/* Why an engine has no guard. Memcached refuses it for good: a record
 * that says "done" can be evicted before keep_ms, and then a duplicate
 * runs — a guard that silently lets duplicates through is worse than
 * none (the caller's on_unavailable policy then decides knowingly). */
static const char *why_none(const char *name)
{
    if (name && strcmp(name, "memcached") == 0)
        return "memcached: the idempotency guard is refused: its records could be evicted";
    return NULL;
}

static cerb_status no_guard(const struct cerb_engine_ops *ops, cerb_engine *e)
{
    const char *why = why_none(ops ? ops->name : NULL);
    if (!cerb__engine_has_guard(ops) && why)
        return cerb__error_set(CERB_UNAVAILABLE, "%s", why);
    if (!cerb__engine_has_guard(ops))
        return cerb__error_set(CERB_UNAVAILABLE,
                               "engine %s has no idempotency guard (not implemented for it yet)",
                               ops ? ops->name : "?");
    if (!e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s is not open", ops->name);
    return CERB_OK;
}

cerb_status cerb__engine_guard_begin(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_guard_rec *rec, cerb_grant *grant,
                                     void **result, size_t *result_len)
{
    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    *result = NULL;
    *result_len = 0;
    cerb_status st = no_guard(ops, e);
    if (st != CERB_OK)
        return st;
    st = ops->guard_begin(e, rec, grant, result, result_len);
    if (st == CERB_OK)
        grant->outcome = CERB_OUTCOME_YES;
    else if (grant->outcome == CERB_OUTCOME_YES)
        grant->outcome = CERB_OUTCOME_UNKNOWN; /* an error cannot be a claim */
    if (st != CERB_DUPLICATE && *result) { /* only a duplicate has one */
        cerb__free(*result);
        *result = NULL;
        *result_len = 0;
    }
    return st;
}

cerb_status cerb__engine_guard_renew(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_guard_rec *rec, cerb_grant *grant)
{
    memset(grant, 0, sizeof *grant);
    grant->outcome = CERB_OUTCOME_NO;
    cerb_status st = no_guard(ops, e);
    if (st != CERB_OK)
        return st;
    return ops->guard_renew(e, rec, grant);
}

cerb_status cerb__engine_guard_finish(const struct cerb_engine_ops *ops, cerb_engine *e,
                                      const cerb_guard_rec *rec, int succeeded,
                                      const void *result, size_t len, int64_t keep_ms,
                                      cerb_outcome *outcome)
{
    *outcome = CERB_OUTCOME_NO;
    cerb_status st = no_guard(ops, e);
    if (st != CERB_OK)
        return st;
    st = ops->guard_finish(e, rec, succeeded ? 1 : 0, result, len, keep_ms, outcome);
    if (st == CERB_OK)
        *outcome = CERB_OUTCOME_YES;
    else if (*outcome == CERB_OUTCOME_YES)
        *outcome = CERB_OUTCOME_UNKNOWN;
    return st;
}

cerb_status cerb__engine_guard_check(const struct cerb_engine_ops *ops, cerb_engine *e,
                                     const cerb_guard_rec *rec, cerb_guard_found *found)
{
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = no_guard(ops, e);
    if (st != CERB_OK)
        return st;
    return ops->guard_check(e, rec, found);
}
