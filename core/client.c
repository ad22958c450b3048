/*
 * client.c — the client: configuration snapshot, the opened engines, the
 * current engine and switching, the table of per-name slots.
 *
 * Configuration is two pointers. `boot_cfg` is what the engines were opened
 * with and lives as long as the client, because engines keep pointers into
 * it and their keys cannot change at run time. `cfg` is the current
 * snapshot for reloadable keys (lock defaults, retry, epoch, active); a
 * reload parses and validates a whole new struct, checks that no immutable
 * key changed, and swaps the pointer under the client mutex. Readers copy
 * what they need under that mutex (cerb__client_call_cfg), so a reload
 * never shows a half-applied file.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"
#include "token.h"







/* ---- open / close ---- */


static cerb_status client_open(cerb_client **out, struct cerb_config *cfg, bool manual)
{
    cerb_client *c = cerb__calloc(1, sizeof *c);
    cerb_status st, first_err = CERB_OK;
    char first_msg[CERB_ERROR_MAX] = "";

    if (!c) {
        cerb__config_free(cfg);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    cerb__mutex_init(&c->mu);
    cerb__mutex_init(&c->open_mu);
    cerb__mutex_init(&c->inflight_mu);
    c->cfg = c->boot_cfg = cfg;
    c->manual = manual;
    c->lease_hwm_ms = cfg->lock.lease_ms;
    c->n_engines = cfg->n_engines;
    for (size_t i = 0; i < cfg->n_engines; i++) {
        struct cerb_client_engine *ce = &c->engines[i];
        snprintf(ce->name, sizeof ce->name, "%s", cfg->engines[i]);
        ce->client = c;
        ce->idx = (int)i;
        atomic_init(&ce->last_probe_us, -1);
        ce->ops = cerb__engine_find(ce->name);
        if (!ce->ops) {
            st = CERB_ECONFIG;
            goto fail;
        }
    }
    c->fork_gen = cerb__fork_generation();
    atomic_store(&c->magic, CERB_CLIENT_MAGIC);

    /* Open every engine; the client works as long as one answers. */
    int want = strcmp(cfg->active, "auto") == 0 ? -1 : cerb__config_engine_index(cfg, cfg->active);
    int current = -1;
    for (size_t i = 0; i < c->n_engines; i++) {
        st = cerb__client_open_engine(c, i);
        if (st != CERB_OK && first_err == CERB_OK) {
            first_err = st;
            cerb__error_copy(first_msg, sizeof first_msg);
        }
        if (st == CERB_OK && current < 0 && (want < 0 || want == (int)i))
            current = (int)i;
    }
    if (current < 0) {
        for (size_t i = 0; i < c->n_engines && current < 0; i++)
            if (c->engines[i].e)
                current = (int)i;
    }
    if (current < 0) {
        st = first_err == CERB_EIO ? CERB_UNAVAILABLE : first_err;
        if (st == CERB_OK)
            st = CERB_UNAVAILABLE;
        cerb__error_set(st, "no engine could be opened: %s", first_msg);
        goto fail;
    }
    atomic_store(&c->current, current);
    cerb__health_init(c);
    /* A client that starts after a switch checks the records once now, so
     * its first acquisitions need not ask the engines it does not use
     * before and after each grant (closure.c). */
    cerb__closure_round(c);
    st = cerb__notify_start(c);
    if (st == CERB_OK) {
        st = cerb__watchdog_start(c);
        if (st == CERB_OK) {
            st = cerb__prober_start(c);
            if (st == CERB_OK) {
                st = cerb__config_watch_start(c, cerb_client_reload);
                if (st != CERB_OK)
                    cerb__prober_stop(c);
            }
            if (st != CERB_OK)
                cerb__watchdog_stop(c);
        }
        if (st != CERB_OK) {
            cerb__notify_stop(c);
            cerb__notify_finish(c);
        }
    }
    if (st != CERB_OK) {
        cerb__mutex_destroy(&c->fo_mu);
        goto fail;
    }
    *out = c;
    return CERB_OK;
fail:
    atomic_store(&c->magic, CERB_DEAD_MAGIC);
    for (size_t i = 0; i < c->n_engines; i++)
        if (c->engines[i].ops)
            cerb__engine_close(c->engines[i].ops, c->engines[i].e);
    cerb__config_free(cfg);
    cerb__mutex_destroy(&c->open_mu);
    cerb__mutex_destroy(&c->inflight_mu);
    cerb__mutex_destroy(&c->mu);
    cerb__free(c);
    return st;
}

cerb_status cerb_client_open(cerb_client **out, const char *path)
{
    struct cerb_config *cfg = NULL;
    cerb_status st;

    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_client_open: out is NULL");
    *out = NULL;
    st = path ? cerb__config_from_file(path, &cfg) : cerb__config_defaults(&cfg);
    if (st != CERB_OK)
        return st;
    return client_open(out, cfg, false);
}

cerb_status cerb__client_open_manual(cerb_client **out, const char *path)
{
    struct cerb_config *cfg = NULL;
    if (!out || !path)
        return cerb__error_set(CERB_EINVAL, "cerb__client_open_manual: out or path is NULL");
    *out = NULL;
    cerb_status st = cerb__config_from_file(path, &cfg);
    if (st != CERB_OK)
        return st;
    return client_open(out, cfg, true);
}

cerb_status cerb__client_open_config(cerb_client **out, struct cerb_config *cfg)
{
    if (!out) {
        cerb__config_free(cfg);
        return cerb__error_set(CERB_EINVAL, "cerb__client_open_config: out is NULL");
    }
    *out = NULL;
    if (!cfg)
        return cerb__error_set(CERB_EINVAL, "cerb__client_open_config: cfg is NULL");
    return client_open(out, cfg, false);
}

cerb_status cerb_client_open_string(cerb_client **out, const char *text)
{
    struct cerb_config *cfg = NULL;
    cerb_status st;

    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_client_open_string: out is NULL");
    *out = NULL;
    if (!text)
        return cerb__error_set(CERB_EINVAL, "cerb_client_open_string: text is NULL");
    st = cerb__config_from_string(text, &cfg);
    if (st != CERB_OK)
        return st;
    return client_open(out, cfg, false);
}

/*
 * Close is bounded: no callback is waited for (a running one is left to
 * finish on its own thread, see notify.c); the renewers finish the chunk
 * they are sending (one op timeout each, in parallel); each hold is then
 * released once, and once an engine has failed to answer a release the
 * rest of its holds are left to expire rather than costing an op timeout
 * each. Then the engines are closed.
 */
void cerb_client_close(cerb_client *c)
{
    if (!cerb__client_ok(c))
        return;
    atomic_store(&c->magic, CERB_DEAD_MAGIC);
    /* No callback starts from here on: the promise holds before anything
     * that could queue one is stopped. */
    cerb__notify_stop(c);
    cerb__config_watch_stop(c);
    cerb__prober_stop(c);
    cerb__watchdog_stop(c);
    cerb__guard_close_all(c); /* guard attempts left open (guard/) */
    bool silent[CERB_MAX_ENGINES] = {false};
    size_t left[CERB_MAX_ENGINES] = {0};
    while (c->handles) {
        cerb_lock *l = c->handles;
        struct cerb_slot *s = l->slot;
        if (s->hold && s->hold->owner_handle == l) {
            struct cerb_engine_hold *h = s->hold;
            struct cerb_client_engine *ce = &c->engines[h->engine_idx];
            if (silent[h->engine_idx]) {
                left[h->engine_idx]++;
            } else {
                cerb_status st = cerb__engine_release(ce->ops, ce->e, &h->lk);
                if (st != CERB_OK && st != CERB_NOT_OWNER)
                    silent[h->engine_idx] = true; /* not answering: leases end the rest */
            }
            while (h->claims) { /* claims on engines switched from (lock.c) */
                struct cerb_engine_hold *k = h->claims;
                h->claims = k->claim_next;
                struct cerb_client_engine *ke = &c->engines[k->engine_idx];
                if (!silent[k->engine_idx]) {
                    cerb_status st = cerb__engine_release(ke->ops, ke->e, &k->lk);
                    if (st != CERB_OK && st != CERB_NOT_OWNER)
                        silent[k->engine_idx] = true;
                }
                cerb__engine_hold_free(k);
            }
            s->hold = NULL;
            s->count = 0;
            s->holder_tid = 0;
            s->occupied = false;
            cerb__engine_hold_free(h);
        }
        c->handles = l->next;
        atomic_store(&l->magic, CERB_DEAD_MAGIC);
        cerb__slot_put(c, s);
        if (!cerb__notify_forget(c, l)) /* else its running callback still reads it */
            cerb__free(l);
    }
    for (size_t i = 0; i < c->n_engines; i++) {
        if (left[i])
            CERB_LOG_W("close: engine %s did not answer a release; %zu more lock(s) there are "
                       "left to expire with their lease", c->engines[i].name, left[i]);
        cerb__engine_close(c->engines[i].ops, c->engines[i].e);
    }
    if (c->cfg != c->boot_cfg)
        cerb__config_free(c->cfg);
    cerb__config_free(c->boot_cfg);
    cerb__mutex_destroy(&c->fo_mu);
    cerb__mutex_destroy(&c->open_mu);
    cerb__mutex_destroy(&c->inflight_mu);
    cerb__mutex_destroy(&c->mu);
    if (!cerb__notify_finish(c)) /* else a running callback may still read c->magic */
        cerb__free(c);
}

/* ---- switching ---- */

const char *cerb_engine_current(cerb_client *c)
{
    if (!cerb__client_ok(c))
        return NULL;
    return c->engines[atomic_load(&c->current)].name;
}

const char *cerb_engine_switch(cerb_client *c)
{
    if (!cerb__client_ok(c))
        return NULL;
    int cur = atomic_load(&c->current);
    for (size_t k = 1; k <= c->n_engines; k++) {
        int i = (int)((cur + k) % c->n_engines);
        if (cerb__client_open_engine(c, (size_t)i) == CERB_OK)
            return c->engines[cerb__client_switch(c, i, "manual switch", 1)].name;
    }
    return c->engines[cur].name;
}

const char *cerb_engine_switch_to(cerb_client *c, const char *name)
{
    if (!cerb__client_ok(c)) {
        cerb__client_refused(c, "cerb_engine_switch_to");
        return NULL;
    }
    if (!name) {
        cerb__error_set(CERB_EINVAL, "cerb_engine_switch_to: name is NULL");
        return NULL;
    }
    if (strcmp(name, "auto") == 0) {
        /* Back to automatic selection from wherever we are. */
        int cur = atomic_load(&c->current);
        cerb__client_switch(c, cur, "auto", -1);
        cerb__health_reselect(c);
        return c->engines[atomic_load(&c->current)].name;
    }
    for (size_t i = 0; i < c->n_engines; i++) {
        if (strcmp(c->engines[i].name, name) != 0)
            continue;
        if (cerb__client_open_engine(c, i) != CERB_OK)
            return NULL;
        return c->engines[cerb__client_switch(c, (int)i, "manual switch", 1)].name;
    }
    char names[128] = "";
    for (size_t i = 0; i < c->n_engines; i++) {
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", c->engines[i].name);
    }
    cerb__error_set(CERB_EINVAL, "engine \"%s\" is not configured (configured: %s)", name, names);
    return NULL;
}

cerb_status cerb_client_on_switch(cerb_client *c,
                                  void (*cb)(const char *, const char *, const char *, void *),
                                  void *ud)
{
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_client_on_switch");
    cerb__notify_set_switch_cb(c, cb, ud);
    return CERB_OK;
}

cerb_status cerb_engine_info(cerb_client *c, const char *name, struct cerb_engine_info *out)
{
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_engine_info");
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_engine_info: out is NULL");
    int cur = atomic_load(&c->current);
    int idx = name ? -1 : cur;
    for (size_t i = 0; name && i < c->n_engines; i++)
        if (strcmp(c->engines[i].name, name) == 0)
            idx = (int)i;
    if (idx < 0)
        return cerb__error_set(CERB_EINVAL, "engine \"%s\" is not configured", name);
    struct cerb_client_engine *ce = &c->engines[idx];
    memset(out, 0, sizeof *out);
    out->name = ce->name;
    out->active = idx == cur;
    cerb__mutex_lock(&c->fo_mu);
    out->wanted = c->pinned == idx && idx != cur;
    out->breaker = cerb__breaker_state(&ce->brk);
    out->breaker_transitions = ce->transitions;
    out->switches = c->switches;
    out->epoch = atomic_load(&c->epoch);
    cerb__mutex_unlock(&c->fo_mu);
    out->last_probe_us = atomic_load(&ce->last_probe_us);
    out->acquires = atomic_load(&ce->acquires);
    out->failures = atomic_load(&ce->failures);
    out->lost = atomic_load(&ce->lost);
    out->guard_begins = atomic_load(&ce->guard_begins);
    out->guard_duplicates = atomic_load(&ce->guard_dups);
    out->guard_busy = atomic_load(&ce->guard_busy);
    out->guard_degraded = atomic_load(&ce->guard_degraded);
    out->gate_questions = atomic_load(&ce->gate_questions);
    uint64_t gen;
    out->closed_epoch = cerb__closure_holds(c, idx, &gen) ? atomic_load(&ce->closure_epoch) : 0;
    struct cerb_engine_stats es;
    cerb__engine_stats(ce->ops, ce->e, &es);
    out->acquire_calls = es.acquire_calls;
    out->wakeups = es.wakeups;
    out->handoffs = es.handoffs;
    return CERB_OK;
}

/* ---- reload ---- */

cerb_status cerb_client_reload(cerb_client *c)
{
    struct cerb_config *next = NULL, *old;
    cerb_status st;

    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_client_reload");
    if (!c->boot_cfg->path)
        return cerb__error_set(CERB_EINVAL, "cerb_client_reload: client has no config file");
    st = cerb__config_from_file(c->boot_cfg->path, &next);
    if (st != CERB_OK)
        return st;
    st = cerb__config_reloadable(c->boot_cfg, next);
    if (st != CERB_OK) {
        cerb__config_free(next);
        return st;
    }
    char active[CERB_ENGINE_NAME_MAX], old_active[CERB_ENGINE_NAME_MAX];
    snprintf(active, sizeof active, "%s", next->active);
    int64_t epoch = next->epoch;
    cerb__mutex_lock(&c->mu);
    old = c->cfg;
    int64_t old_epoch = old->epoch;
    snprintf(old_active, sizeof old_active, "%s", old->active);
    c->cfg = next;
    /* The longest lease this client has been configured with: holds taken
     * before a reload shortened lock.lease_ms still run on the old one. */
    if (next->lock.lease_ms > c->lease_hwm_ms)
        c->lease_hwm_ms = next->lock.lease_ms;
    cerb__mutex_unlock(&c->mu);
    if (old != c->boot_cfg)
        cerb__config_free(old);
    /* `next` may be replaced by a concurrent reload from here on. A raised
     * epoch (cerberus switch) orders every later grant above earlier ones. */
    int64_t want = epoch;
    cerb__mutex_lock(&c->fo_mu);
    if (atomic_load(&c->epoch) < want) {
        atomic_store(&c->epoch, want);
        cerb__route_update(c);
    }
    cerb__mutex_unlock(&c->fo_mu);
    st = CERB_OK;
    if (strcmp(active, old_active) != 0) {
        int i = strcmp(active, "auto") == 0 ? -1 : cerb__config_engine_index(c->boot_cfg, active);
        if (i < 0) {
            cerb__client_switch(c, atomic_load(&c->current), "config: active = auto", -1);
            cerb__health_reselect(c);
        } else if (cerb__client_open_engine(c, (size_t)i) == CERB_OK) {
            cerb__client_switch(c, i, "config: active engine changed", CERB_PIN_CONFIG);
        } else {
            /* Every other process may have moved: keep the wish (the
             * prober reopens the engine each round and the selector
             * applies the pin once it is open) and say the switch failed. */
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            cerb__client_switch(c, i, "config: active engine changed", CERB_PIN_CONFIG);
            st = cerb__error_set(CERB_UNAVAILABLE,
                                 "configuration reloaded, but active engine %s would not open "
                                 "(%s); retried every probe round, and until it opens nothing "
                                 "is granted here (with a switch grace)",
                                 active, why);
            CERB_LOG_E("%s", cerb_last_error());
        }
    }
    /* A new epoch or active engine: record it on the engines (closure.c)
     * now rather than at the next probe round. */
    if (strcmp(active, old_active) != 0 || epoch != old_epoch)
        cerb__closure_round(c);
    CERB_LOG_I("configuration reloaded from %s", c->boot_cfg->path);
    return st;
}
