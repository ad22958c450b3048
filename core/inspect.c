/*
 * inspect.c — cerb_inspect, cerb_lock_inspect / cerb_holders_free (DESIGN.md §13), and the
 * checking shim of the engines' inspect method (cerb_engine_ops version 3).
 *
 * "Who holds this name, and who waits for it?" is answered by each engine
 * from its own layout, over its own connections, with its own credentials
 * and TLS: the engine already knows all of that, so nothing outside it (the
 * `cerberus holders` command included) has to know it a second time. The
 * engine appends entries, holder first and then the waiters in queue
 * order, through cerb__holders_add(), which copies the strings so that an
 * engine can pass its reply buffers; the shim fills in the engine's name
 * and drops what an engine added before failing, so a caller sees either an
 * engine's whole answer or none of it.
 *
 * Asking every engine (engine = NULL) asks the open ones in configuration
 * order and keeps going past a failure: an operator looking for a holder
 * wants what the engines that answer say, and the status (the first
 * failure) still tells that the answer is partial.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"

#define INSPECT_NAME_MAX 255

cerb_status cerb__holders_add(struct cerb_holders *h, const char *owner, size_t owner_len,
                              int waiting, uint64_t fence, int64_t ttl_ms, const char *detail)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 4;
        cerb_holder_info *v = cerb__realloc(h->v, cap * sizeof *v);
        if (!v)
            return cerb__error_set(CERB_ENOMEM, "out of memory");
        h->v = v;
        h->cap = cap;
    }
    const char *nul = memchr(owner, '\0', owner_len);
    if (nul)
        owner_len = (size_t)(nul - owner);
    char *o = cerb__malloc(owner_len + 1);
    char *d = cerb__strdup(detail ? detail : "");
    if (!o || !d) {
        cerb__free(o);
        cerb__free(d);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    memcpy(o, owner, owner_len);
    o[owner_len] = '\0';
    h->v[h->n++] = (cerb_holder_info){.engine = "", .owner = o, .waiting = waiting ? 1 : 0,
                                      .fence = fence, .ttl_ms = ttl_ms, .detail = d};
    return CERB_OK;
}

void cerb_holders_free(cerb_holder_info *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++) {
        cerb__free((char *)v[i].owner);
        cerb__free((char *)v[i].detail);
    }
    cerb__free(v);
}

void cerb__holders_clear(struct cerb_holders *h)
{
    cerb_holders_free(h->v, h->n);
    memset(h, 0, sizeof *h);
}

bool cerb__engine_has_inspect(const struct cerb_engine_ops *ops)
{
    return ops && ops->version >= CERB_ENGINE_OPS_V3 && ops->inspect;
}

cerb_status cerb__engine_inspect(const struct cerb_engine_ops *ops, cerb_engine *e,
                                 const char *name, int prim, struct cerb_holders *out)
{
    const struct cerb_queue_methods *q = NULL;
    if (prim == CERB_PRIM_SEMAPHORE || prim == CERB_PRIM_RWLOCK) {
        if (!cerb__engine_has_prim(ops, prim))
            return cerb__error_set(CERB_UNAVAILABLE, "engine %s has no %s", ops->name,
                                   cerb__prim_name(prim));
        q = prim == CERB_PRIM_SEMAPHORE ? ops->semaphore : ops->rwlock;
    } else if (!cerb__engine_has_inspect(ops))
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s cannot be inspected",
                               ops ? ops->name : "?");
    if (!e)
        return cerb__error_set(CERB_UNAVAILABLE, "engine %s is not open", ops->name);
    cerb_status st = cerb__engine_check_name(ops, name);
    if (st != CERB_OK)
        return st;
    /* The engine appends to a list of its own: on a failure, what it had
     * added is dropped and `out` is as it was. */
    struct cerb_holders mine = {0};
    st = q ? q->inspect(e, name, &mine) : ops->inspect(e, name, &mine);
    if (st == CERB_OK && mine.n > 0) {
        size_t need = out->n + mine.n;
        if (need > out->cap) {
            cerb_holder_info *v = cerb__realloc(out->v, need * sizeof *v);
            if (!v)
                st = cerb__error_set(CERB_ENOMEM, "out of memory");
            else {
                out->v = v;
                out->cap = need;
            }
        }
        if (st == CERB_OK) {
            for (size_t i = 0; i < mine.n; i++) {
                mine.v[i].engine = ops->name;
                out->v[out->n++] = mine.v[i];
            }
            cerb__free(mine.v); /* the strings moved to out */
            return CERB_OK;
        }
    }
    cerb__holders_clear(&mine);
    return st;
}

/* The core's rule for every lock name (as cerb_lock_new applies it). */
static cerb_status name_ok(const char *name)
{
    if (!name)
        return cerb__error_set(CERB_EINVAL, "cerb_lock_inspect: name is NULL");
    size_t n = strnlen(name, INSPECT_NAME_MAX + 1);
    if (n == 0)
        return cerb__error_set(CERB_EINVAL, "lock name is empty");
    if (n > INSPECT_NAME_MAX)
        return cerb__error_set(CERB_EINVAL, "lock name is longer than %d bytes",
                               INSPECT_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x20 || ch == 0x7f)
            return cerb__error_set(CERB_EINVAL,
                                   "lock name has a control character (0x%02x) at byte %zu", ch, i);
    }
    return CERB_OK;
}

/* One configured engine, by index; opened first when asked by name. */
static cerb_status inspect_one(cerb_client *c, size_t i, const char *name, int prim, bool open,
                               struct cerb_holders *out)
{
    struct cerb_client_engine *ce = &c->engines[i];
    /* A name this engine cannot represent is refused before anything
     * connects: it would be refused whether the server answers or not. */
    cerb_status st = cerb__engine_check_name(ce->ops, name);
    if (st == CERB_OK && open && !ce->e)
        st = cerb__client_open_engine(c, i); /* its error names the engine */
    if (st == CERB_OK) {
        st = cerb__engine_inspect(ce->ops, ce->e, name, prim, out);
        if (st != CERB_OK) {
            /* Engines name themselves ("zk 127.0.0.1:2181: ..."); the
             * shim's and the name check's messages do not. */
            char why[CERB_ERROR_MAX];
            cerb__error_copy(why, sizeof why);
            if (strncmp(why, ce->name, strlen(ce->name)) != 0 &&
                strncmp(why, "engine ", 7) != 0)
                cerb__error_prefix("%s", ce->name);
        }
    }
    return st;
}

_Static_assert((int)CERB_KIND_LOCK == (int)CERB_PRIM_MUTEX &&
                   (int)CERB_KIND_SEMAPHORE == (int)CERB_PRIM_SEMAPHORE &&
                   (int)CERB_KIND_RWLOCK == (int)CERB_PRIM_RWLOCK,
               "a kind is the primitive it inspects");

cerb_status cerb_lock_inspect(cerb_client *c, const char *name, const char *engine,
                              cerb_holder_info **out, size_t *n)
{
    return cerb_inspect(c, CERB_KIND_LOCK, name, engine, out, n);
}

cerb_status cerb_inspect(cerb_client *c, int kind, const char *name, const char *engine,
                         cerb_holder_info **out, size_t *n)
{
    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!out || !n)
        return cerb__error_set(CERB_EINVAL, "cerb_lock_inspect: out or n is NULL");
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_lock_inspect");
    if (kind != CERB_KIND_LOCK && kind != CERB_KIND_SEMAPHORE && kind != CERB_KIND_RWLOCK)
        return cerb__error_set(CERB_EINVAL, "cerb_inspect: kind %d (0 lock, 2 semaphore, "
                                            "3 read-write lock; an election's leader: "
                                            "cerb_election_leader)", kind);
    cerb_status st = name_ok(name);
    if (st != CERB_OK)
        return st;

    struct cerb_holders h = {0};
    if (engine) {
        size_t i = 0;
        while (i < c->n_engines && strcmp(c->engines[i].name, engine) != 0)
            i++;
        if (i == c->n_engines) {
            char names[128] = "";
            for (size_t k = 0; k < c->n_engines; k++) {
                size_t len = strlen(names);
                snprintf(names + len, sizeof names - len, "%s%s", k ? ", " : "",
                         c->engines[k].name);
            }
            return cerb__error_set(CERB_EINVAL,
                                   "engine \"%s\" is not configured (configured: %s)", engine,
                                   names);
        }
        st = inspect_one(c, i, name, kind, true, &h);
    } else {
        char first[CERB_ERROR_MAX] = "";
        for (size_t i = 0; i < c->n_engines; i++) {
            if (!c->engines[i].e)
                continue;
            cerb_status s = inspect_one(c, i, name, kind, false, &h);
            if (s != CERB_OK && st == CERB_OK) {
                st = s;
                cerb__error_copy(first, sizeof first);
            }
        }
        if (st != CERB_OK)
            cerb__error_set(st, "%s", first);
    }
    *out = h.v;
    *n = h.n;
    return st;
}
