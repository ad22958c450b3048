/*
 * fault_engine.h — a test engine that wraps the local engine and makes its
 * calls fail on purpose: the Nth call of a kind, once or from then on, either
 * before the request "leaves" (outcome NO) or after it took effect with the
 * answer lost (outcome UNKNOWN: the ambiguous timeout), or slowly.
 * Register it with fault_engine_register(), then open a client with
 * `engines = ("fault");`.
 */
#ifndef CERB_FAULT_ENGINE_H
#define CERB_FAULT_ENGINE_H

#include <stdbool.h>

enum fault_op {
    FAULT_ACQUIRE, FAULT_RENEW, FAULT_RELEASE, FAULT_CHECK,
    FAULT_PROCLAIM, /* an election's proclaim (the table has no value at grant) */
    FAULT_ANY, FAULT_NOPS
};

enum fault_kind {
    FAULT_BEFORE, /* fail without effect: connection refused */
    FAULT_AFTER,  /* the call takes effect, the reply is lost */
    FAULT_LOST_REPLY /* acquire: whatever it answered (a refusal too), the
                        reply is lost (outcome UNKNOWN) */
};

/* Fail the nth call (1-based, counted from now) of op; with persistent,
 * also every later one. nth = 0 disables. */
void fault_engine_set(enum fault_op op, long nth, bool persistent, enum fault_kind kind);
/* Clear every plan and counter. */
void fault_engine_reset(void);
/* Calls made of op since the last reset, and faults injected. */
long fault_engine_calls(enum fault_op op);
long fault_engine_faults(void);
/* From now until reset, every call of op (FAULT_ANY: every call) first takes
 * ms, like a slow server; with stall it then fails as a frozen server does
 * at the op timeout — a timeout with outcome UNKNOWN, without effect.
 * ms = 0 turns it off. */
void fault_engine_delay(enum fault_op op, long ms, bool stall);
/* From now until reset, every grant reports 1/div of the lease it got
 * (div > 1): the client's deadline then comes well before the server's,
 * as with a server whose clock runs slow. 0 or 1 turns it off. */
void fault_engine_ttl_div(long div);
/* Deliver engine event ev (cerb_engine_event) for lock `name` (NULL: every
 * hold) from every open fault engine instance to its client, as an engine
 * does when its session is lost. Returns the number of instances told. */
int fault_engine_emit(int ev, const char *name);
/* "faultbatch": from now until reset, renewals of lock @name in a batch
 * fail (UNAVAILABLE, answered at once) while the others of the batch go
 * through, as with a Redis Cluster node down. @name must outlive the
 * setting (a string literal): it is not copied. */
void fault_engine_batch_fail(const char *name);
/* renew_batch calls of "faultbatch" since the last reset. */
long fault_engine_batch_calls(void);
/* Register "fault", "faultheld" (the same engine, answering the
 * safe-switch gate's question as a check: it can be a gated engine) and
 * "faultbatch" (renewals in batches, one delay per batch, as a Redis
 * pipeline) (idempotent). All three have the local engine's elections,
 * semaphores and read-write locks. */
void fault_engine_register(void);

#endif
