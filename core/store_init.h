/*
 * store_init.h — the table an engine registers to prepare its store for
 * first use (cerb_store_init, `cerberus init`, DESIGN.md §5).
 *
 * Preparing a store is not a lock operation: it runs once per deployment,
 * from an operator's command, on a store no client has opened yet (opening
 * one is what it must avoid: a redis client that opens a new server makes
 * its marker with a quarantine). So it is a table of its own, as SQLite
 * keeps sqlite3_io_methods apart from sqlite3_vfs, and cerb_engine_ops
 * stays the mutex. An engine whose store needs nothing registers no table
 * and is reported as such. Engines may include this header besides
 * engine.h; builtin.c lists the tables compiled in.
 */
#ifndef CERB_STORE_INIT_H
#define CERB_STORE_INIT_H

#include <stddef.h>

#include "cerberus.h"

struct cerb_config;

#define CERB_STORE_OPS_V1 1

struct cerb_store_ops {
    int version;      /* CERB_STORE_OPS_V1 */
    const char *name; /* the engine's name, as in `engines` */
    /*
     * Prepare the store cfg configures for this engine. flags:
     * CERB_STORE_INIT_* (include/cerberus.h). Sets *result and writes one
     * line for a human into line[0 .. len) (without the engine's name,
     * which the caller puts first): what was done, what was found, or why
     * it refused. Returns CERB_OK with PREPARED, ALREADY or NOTHING;
     * CERB_BUSY with REFUSED (nothing was changed, unless the line says
     * what was); an error status with FAILED. Bounded by the engine's
     * configured connect and operation timeouts (the engine documents how
     * many of them). Called from any thread, with no client open.
     */
    cerb_status (*init)(const struct cerb_config *cfg, unsigned flags,
                        cerb_store_result *result, char *line, size_t len);
};

/* The table of engine `name` compiled into this library, or NULL when the
 * engine has none (its store needs nothing) (builtin.c). */
const struct cerb_store_ops *cerb__store_ops_find(const char *name);

#endif
