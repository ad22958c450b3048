/*
 * client_state.c — what the rest of the core reads of a client: whether a
 * handle is a live client of this process, copies of its reloadable
 * settings (taken under its mutex, so a call works with one consistent
 * set), its table of lock names (slots, reference-counted), and opening an
 * engine on first use. client.c builds and tears down clients and owns
 * their threads; the files below it (health.c, lock.c, prober.c, guard/)
 * use only this, so none of them calls back up into client.c.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"
#include "log.h"
#include "token.h"

bool cerb__client_ok(const cerb_client *c)
{
    /* In a forked child the client is the parent's: refused (EINVAL). */
    return c && atomic_load(&((cerb_client *)c)->magic) == CERB_CLIENT_MAGIC &&
           c->fork_gen == cerb__fork_generation();
}

bool cerb__client_forked(const cerb_client *c)
{
    return c && atomic_load(&((cerb_client *)c)->magic) == CERB_CLIENT_MAGIC &&
           c->fork_gen != cerb__fork_generation();
}

cerb_status cerb__client_refused(const cerb_client *c, const char *what)
{
    if (cerb__client_forked(c))
        return cerb__error_set(CERB_EINVAL, "%s: the client was opened before fork(), in the "
                               "parent: its connections, threads and locks are the parent's; "
                               "open a new client in the child", what);
    return cerb__error_set(CERB_EINVAL, "%s: bad client", what);
}

void cerb__client_failover_cfg(cerb_client *c, struct cerb_failover_config *fo, int64_t *lease_ms)
{
    cerb__mutex_lock(&c->mu);
    *fo = c->cfg->failover;
    if (lease_ms)
        *lease_ms = c->lease_hwm_ms;
    cerb__mutex_unlock(&c->mu);
}

void cerb__client_call_cfg(cerb_client *c, struct cerb_call_cfg *out)
{
    cerb__mutex_lock(&c->mu);
    out->lease_ms = c->cfg->lock.lease_ms;
    out->renew = c->cfg->lock.renew;
    out->fair = c->cfg->lock.fair;
    out->retry = c->cfg->retry;
    out->epoch = c->cfg->epoch;
    cerb__mutex_unlock(&c->mu);
}

static unsigned name_hash(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % CERB_NAME_BUCKETS;
}

struct cerb_slot *cerb__slot_get(cerb_client *c, const char *name)
{
    unsigned b = name_hash(name);
    struct cerb_slot *s;

    cerb__mutex_lock(&c->mu);
    for (s = c->names[b]; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            break;
    if (!s) {
        s = cerb__calloc(1, sizeof *s);
        if (s && !(s->name = cerb__strdup(name))) {
            cerb__free(s);
            s = NULL;
        }
        if (s) {
            cerb__mutex_init(&s->mu);
            cerb__cond_init(&s->cond);
            s->next = c->names[b];
            c->names[b] = s;
        }
    }
    if (s)
        s->refs++;
    cerb__mutex_unlock(&c->mu);
    return s;
}

struct cerb_slot *cerb__slot_private(cerb_client *c, const char *name, int prim)
{
    (void)c;
    struct cerb_slot *s = cerb__calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (!(s->name = cerb__strdup(name))) {
        cerb__free(s);
        return NULL;
    }
    cerb__mutex_init(&s->mu);
    cerb__cond_init(&s->cond);
    s->unlisted = true;
    s->prim = prim;
    s->refs = 1;
    return s;
}

void cerb__slot_ref(cerb_client *c, struct cerb_slot *s)
{
    cerb__mutex_lock(&c->mu);
    s->refs++;
    cerb__mutex_unlock(&c->mu);
}

void cerb__slot_put(cerb_client *c, struct cerb_slot *s)
{
    cerb__mutex_lock(&c->mu);
    if (--s->refs == 0) {
        struct cerb_slot **pp = &c->names[name_hash(s->name)];
        while (!s->unlisted && *pp != s)
            pp = &(*pp)->next;
        if (!s->unlisted)
            *pp = s->next;
        cerb__mutex_destroy(&s->mu);
        cerb__cond_destroy(&s->cond);
        cerb__free(s->name);
        cerb__free(s);
    }
    cerb__mutex_unlock(&c->mu);
}

cerb_status cerb__client_open_engine(cerb_client *c, size_t i)
{
    struct cerb_client_engine *ce = &c->engines[i];
    cerb_engine_env env = {c->boot_cfg, cerb__watchdog_event, ce};
    cerb_engine *e = NULL;

    cerb__mutex_lock(&c->open_mu);
    if (ce->e) {
        cerb__mutex_unlock(&c->open_mu);
        return CERB_OK;
    }
    cerb_status st = cerb__engine_open(ce->ops, &env, &e);
    if (st != CERB_OK)
        cerb__error_prefix("engine %s", ce->name);
    else
        ce->e = e;
    cerb__mutex_unlock(&c->open_mu);
    if (st != CERB_OK) /* the log sink is never called under a library mutex */
        CERB_LOG_W("%s", cerb_last_error());
    return st;
}
