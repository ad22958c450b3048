/*
 * reload.c — which differences between two configurations a running client
 * can take, and engine lookup by name.
 *
 * A reload parses and validates the new file into a fresh struct (parse.c);
 * the client then asks cerb__config_reloadable() whether it may swap it in.
 * The answer comes from the schema flags, as with Redis' IMMUTABLE_CONFIG:
 * every IMMUTABLE row (the engine list and every redis., zk., etcd. and
 * local. key) must compare equal, because engines are opened once with
 * those settings; RELOADABLE rows (lock, retry, failover, active, epoch) may
 * differ. Rows are compared in table order, so the message names the first
 * immutable key in documentation order that changed.
 */
#include "internal_posix.h"

#include <string.h>

#include "error.h"
#include "schema.h"

static bool same(const struct cerb__cfg_key *k, const struct cerb_config *a,
                 const struct cerb_config *b)
{
    size_t n;

    switch (k->type) {
    case CERB__CFG_INT:
    case CERB__CFG_INT64:
    case CERB__CFG_BOOL:
    case CERB__CFG_ENUM:
        return cerb__cfg_get_int(k, a) == cerb__cfg_get_int(k, b);
    case CERB__CFG_STRING:
        return strcmp(cerb__cfg_get_str(k, a), cerb__cfg_get_str(k, b)) == 0;
    case CERB__CFG_STRLIST:
        /* Order matters: it is the failover order. */
        n = cerb__cfg_list_len(k, a);
        if (n != cerb__cfg_list_len(k, b))
            return false;
        for (size_t i = 0; i < n; i++)
            if (strcmp(cerb__cfg_list_get(k, a, i),
                       cerb__cfg_list_get(k, b, i)) != 0)
                return false;
        return true;
    }
    return false;
}

cerb_status cerb__config_reloadable(const struct cerb_config *cur,
                                    const struct cerb_config *next)
{
    if (!cur || !next)
        return cerb__error_set(CERB_EINVAL, "no configuration");
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        const struct cerb__cfg_key *k = &cerb__cfg_keys[i];
        if ((k->flags & CERB__CFG_IMMUTABLE) && !same(k, cur, next))
            return cerb__error_set(
                CERB_ECONFIG,
                "%s: key \"%s\" cannot change while running (restart to "
                "apply)",
                next->path ? next->path : "config", k->path);
    }
    return CERB_OK;
}

int cerb__config_engine_index(const struct cerb_config *cfg, const char *name)
{
    if (!cfg || !name)
        return -1;
    for (size_t i = 0; i < cfg->n_engines && i < CERB_MAX_ENGINES; i++)
        if (strcmp(cfg->engines[i], name) == 0)
            return (int)i;
    return -1;
}
