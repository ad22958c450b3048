/*
 * zk_guard_sweep.h — the zk guard's sweeper: one thread per engine
 * instance that deletes expired records nobody asks for again
 * (zk_guard_sweep.c says how, and what it costs).
 */
#ifndef CERB_ZK_GUARD_SWEEP_H
#define CERB_ZK_GUARD_SWEEP_H

#include "engine.h"

struct zk_sweeper;

/* A sweeper, not started (NULL: out of memory). */
struct zk_sweeper *cerb__zk_sweeper_new(void);
/* Stop it (between or during its waits), join its thread, free. */
void cerb__zk_sweeper_free(struct zk_sweeper *sw);
/* A begin on e: starts e's sweeper the first time. */
void cerb__zk_sweeper_begin(cerb_engine *e);
/* This client made a record: counted for the sweeper's budget, and a
 * pass brought forward when enough were made. Lock-free but for that. */
void cerb__zk_sweeper_made(struct zk_sweeper *sw);

#endif
