/*
 * guard_fault_engine.h — the "gfault" engine: the local engine (locks and
 * in-memory guard records) whose guard calls fail on purpose, for the
 * guard's ambiguity and failure paths, which a real server cannot be made
 * to take on demand. GFAULT_BEFORE fails without effect (connection
 * refused); GFAULT_AFTER applies the call and then reports an I/O error
 * with outcome UNKNOWN (the reply lost after a timeout). Register with
 * guard_fault_register(), then open a client with `engines = ("gfault");`.
 */
#ifndef CERB_GUARD_FAULT_ENGINE_H
#define CERB_GUARD_FAULT_ENGINE_H

#include <stdbool.h>

enum gfault_op { GFAULT_BEGIN, GFAULT_RENEW, GFAULT_FINISH, GFAULT_CHECK, GFAULT_NOPS };
enum gfault_kind { GFAULT_BEFORE, GFAULT_AFTER };

/* Fail the nth call of op from now (1-based); persistent: and every later
 * one. nth 0 disables. */
void guard_fault_set(enum gfault_op op, long nth, bool persistent, enum gfault_kind kind);
void guard_fault_reset(void);
/* Calls of op since the last reset. */
long guard_fault_calls(enum gfault_op op);
void guard_fault_register(void);
/* Call fn(ud) inside every guard begin, before it reaches the store (a
 * cancel fired while a begin is on its way); NULL removes it. */
void guard_fault_on_begin(void (*fn)(void *), void *ud);

#endif
