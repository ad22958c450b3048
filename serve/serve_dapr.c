/*
 * serve_dapr.c — the Dapr-compatible façade of `cerberus serve` (DESIGN.md
 * §15, docs/dapr.md): Dapr's distributed lock API (alpha1) as daprd serves
 * it over HTTP, so that the Dapr SDKs in HTTP mode lock through Cerberus
 * unchanged.
 *
 *   POST /v1.0-alpha1/lock/{store}    {"resourceId", "lockOwner",
 *                                     "expiryInSeconds"} → {"success": bool}
 *   POST /v1.0-alpha1/unlock/{store}  {"resourceId", "lockOwner"} →
 *                                     {"status": 0..3}
 *   GET  /v1.0/metadata               {"id", "components": [the store]}
 *   GET  /v1.0/healthz[/outbound]     204
 *
 * Errors are daprd's: {"errorCode": "ERR_...", "message"} with daprd's HTTP
 * codes, checked in daprd's order (pkg/api/universal/lock.go): a body that
 * is not JSON, or a field of the wrong type, 400 ERR_MALFORMED_REQUEST;
 * then (lock only) expiryInSeconds ≤ 0, 400 ERR_EXPIRY_NOT_POSITIVE; an
 * empty resourceId, 400 ERR_RESOURCE_ID_EMPTY; an empty lockOwner, 400
 * ERR_OWNER_EMPTY; another store than ours, 404 ERR_LOCK_NOT_FOUND; a
 * resourceId with "||" (daprd's key separator), 500 ERR_TRY_LOCK /
 * ERR_UNLOCK as daprd answers it; an engine failure 500 ERR_TRY_LOCK /
 * ERR_UNLOCK.
 *
 * The name: the resourceId, or `lock||<app-id>||<resourceId>` with an app
 * id (daprd's default keyPrefix "appid"), so that on the redis engine with
 * redis.prefix "" the key is the one a Dapr sidecar's own Redis lock store
 * writes (SET NX with the owner as value) and the two exclude each other.
 *
 * The semantics are daprd's Redis store's, kept by a library hold:
 *  - lock is a try (wait 0). A grant becomes a hold of the server's hold
 *    table (serve_holds.c) whose window is expiryInSeconds: nothing keeps
 *    it alive, so serve_expiry.c releases it when the window passes, as
 *    Redis expires daprd's key. Its lease is the library's (lock.lease_ms,
 *    renewed by the library): a daemon that dies frees the name within
 *    one lease, not after expiryInSeconds. (The expiry is not passed as
 *    lease_ms: that may not exceed lock.lease_ms when redis is an engine.)
 *  - The same owner locking again while it holds gets success:false, as
 *    from daprd (not reentrant): the library refuses a second hold of the
 *    name, in this process too, so of two concurrent lock calls for one
 *    name exactly one succeeds, whoever the owners.
 *  - unlock by the owner releases: 0; when its hold expired, was lost or
 *    was released: 1; another owner's hold here: 2; when this server holds
 *    nothing for the name, cerb_lock_inspect says whether anybody else
 *    does (another daemon, a Dapr sidecar on the same Redis): 2, else 1.
 *    An engine that cannot be inspected is asked by a try that, when it
 *    is granted, is released at once (no hold is kept): BUSY is 2. An
 *    engine failure is 500 ERR_UNLOCK.
 *
 * The owners: a list of (name, owner, hold id) under its own mutex, one
 * entry per name this server granted (the library allows one hold per
 * name). An entry is checked against the hold table (peeked, never
 * touched: a keepalive would stretch Dapr's fixed expiry) before it is
 * believed: the expiry thread may have released its hold. The mutex is
 * held while a grant's hold is put in the hold table and its entry made,
 * and while an unlock looks up the entry and takes its hold out, so an
 * unlock never sees half of a grant; no library call that goes to an
 * engine is made under it. Entries whose hold is gone are pruned when
 * the list has doubled since the last sweep.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

#define LOCK_PREFIX "/v1.0-alpha1/lock/"
#define UNLOCK_PREFIX "/v1.0-alpha1/unlock/"
#define DEFAULT_STORE "cerberus"
#define KEY_SEP "||"

/* Dapr's UnlockResponse.Status. */
enum unlock_status {
    UNLOCK_SUCCESS = 0,
    UNLOCK_DOES_NOT_EXIST = 1,
    UNLOCK_BELONGS_TO_OTHERS = 2,
    UNLOCK_INTERNAL_ERROR = 3
};

struct owner_entry {
    char *name;  /* the lock name (with the key prefix) */
    char *owner; /* Dapr's lockOwner */
    char id[CERB_SERVE_HOLD_ID_LEN + 1];
    struct owner_entry *next;
};

struct cerb__serve_dapr {
    pthread_mutex_t mu;
    char *store;  /* the one store name served */
    char *app_id; /* NULL: a name is the resourceId */
    struct owner_entry *head;
    size_t n, prune_at;
};

cerb_status cerb__serve_dapr_new(struct cerb__serve_dapr **out)
{
    struct cerb__serve_dapr *d = calloc(1, sizeof *d);

    *out = NULL;
    if (!d)
        return CERB_ENOMEM;
    d->store = strdup(DEFAULT_STORE);
    if (!d->store) {
        free(d);
        return CERB_ENOMEM;
    }
    if (pthread_mutex_init(&d->mu, NULL) != 0)
        abort();
    d->prune_at = 64;
    *out = d;
    return CERB_OK;
}

static void entry_free(struct owner_entry *e)
{
    free(e->name);
    free(e->owner);
    free(e);
}

void cerb__serve_dapr_free(struct cerb__serve_dapr *d)
{
    if (!d)
        return;
    while (d->head) {
        struct owner_entry *e = d->head;
        d->head = e->next;
        entry_free(e);
    }
    if (pthread_mutex_destroy(&d->mu) != 0)
        abort();
    free(d->store);
    free(d->app_id);
    free(d);
}

/* Whether @s is usable in a name: not empty, no control character, no
 * "||" (daprd's separator: `lock||a||b||c` would be ambiguous). */
static bool plain(const char *s)
{
    if (!s[0] || strstr(s, KEY_SEP))
        return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

cerb_status cerb__serve_dapr_check(const char *store, const char *app_id, char *err,
                                   size_t errlen)
{
    if (!store || !plain(store) || strchr(store, '/')) {
        snprintf(err, errlen, "--dapr-store: a store name is not empty and has no '/', "
                              "no \"||\" and no control character");
        return CERB_EINVAL;
    }
    if (app_id && !plain(app_id)) {
        snprintf(err, errlen, "--dapr-app-id: an app id is not empty and has no \"||\" "
                              "and no control character");
        return CERB_EINVAL;
    }
    return CERB_OK;
}

cerb_status cerb__serve_set_dapr(struct cerb__serve *s, const char *store,
                                 const char *app_id, char *err, size_t errlen)
{
    struct cerb__serve_dapr *d = s->dapr;
    char *st = NULL, *app = NULL;

    if (cerb__serve_dapr_check(store, app_id, err, errlen) != CERB_OK)
        return CERB_EINVAL;
    if (!(st = strdup(store)) || (app_id && !(app = strdup(app_id)))) {
        free(st);
        snprintf(err, errlen, "out of memory");
        return CERB_ENOMEM;
    }
    cerb__serve_lock(&d->mu);
    free(d->store);
    free(d->app_id);
    d->store = st;
    d->app_id = app;
    cerb__serve_unlock(&d->mu);
    return CERB_OK;
}

bool cerb__serve_dapr_path(const char *url)
{
    return strncmp(url, "/v1.0/", 6) == 0 || strncmp(url, "/v1.0-alpha1/", 13) == 0;
}

/* ---- replies ---- */

/* daprd's error body {"errorCode", "message"} with HTTP @code. */
static enum MHD_Result dapr_error(struct MHD_Connection *conn, unsigned code,
                                  const char *error_code, const char *message)
{
    /* The message may echo the caller's bytes: serve_reply.c makes it UTF-8. */
    return cerb__serve_reply_dapr_error(conn, code, error_code, message);
}

static enum MHD_Result reply_success(struct MHD_Connection *conn, bool success)
{
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, json_pack("{s:b}", "success", success));
}

static enum MHD_Result reply_status(struct MHD_Connection *conn, enum unlock_status st)
{
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, json_pack("{s:i}", "status", (int)st));
}

/* 204 with no body, as daprd answers its health checks. */
static enum MHD_Result reply_no_content(struct MHD_Connection *conn)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret;

    if (!r)
        return MHD_NO;
    ret = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- requests ---- */

struct dapr_request {
    const char *resource; /* borrowed from the parsed body */
    const char *owner;
    json_int_t expiry;
};

/* The member @camel (or its proto name @snake, which protojson accepts
 * too) of @obj, or NULL. */
static json_t *member(json_t *obj, const char *camel, const char *snake)
{
    json_t *m = json_object_get(obj, camel);
    return m ? m : json_object_get(obj, snake);
}

/* A string field: "" when absent (proto3's default); false when not a
 * string. */
static bool get_string(json_t *obj, const char *camel, const char *snake, const char **out)
{
    json_t *m = member(obj, camel, snake);

    *out = "";
    if (!m || json_is_null(m))
        return true;
    if (!json_is_string(m))
        return false;
    *out = json_string_value(m);
    return true;
}

/* expiryInSeconds, an int32: a JSON integer, or a string of one (protojson
 * takes both); 0 when absent; false otherwise (1.5, "x", 2^31). */
static bool get_int32(json_t *obj, const char *camel, const char *snake, json_int_t *out)
{
    json_t *m = member(obj, camel, snake);

    *out = 0;
    if (!m || json_is_null(m))
        return true;
    if (json_is_integer(m)) {
        *out = json_integer_value(m);
    } else if (json_is_string(m)) {
        const char *s = json_string_value(m);
        char *end;
        long long v;
        errno = 0;
        v = strtoll(s, &end, 10);
        if (!s[0] || *end || errno)
            return false;
        *out = (json_int_t)v;
    } else {
        return false;
    }
    return *out >= INT32_MIN && *out <= INT32_MAX;
}

/* Parses @body into *@rq (whose strings live in *@doc: decref it), or
 * answers 400 ERR_MALFORMED_REQUEST and returns false (*@ret set). */
static bool parse(struct MHD_Connection *conn, const char *body, size_t len, bool lock,
                  json_t **doc, struct dapr_request *rq, enum MHD_Result *ret)
{
    json_error_t jerr;
    char why[256];
    json_t *req = json_loadb(body, len, 0, &jerr);

    *doc = NULL;
    if (!req || !json_is_object(req)) {
        snprintf(why, sizeof why, "failed deserializing HTTP body: %s",
                 req ? "not a JSON object" : jerr.text);
        json_decref(req);
        *ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, "ERR_MALFORMED_REQUEST", why);
        return false;
    }
    if (!get_string(req, "resourceId", "resource_id", &rq->resource) ||
        !get_string(req, "lockOwner", "lock_owner", &rq->owner) ||
        (lock && !get_int32(req, "expiryInSeconds", "expiry_in_seconds", &rq->expiry))) {
        json_decref(req);
        *ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, "ERR_MALFORMED_REQUEST",
                          "failed deserializing HTTP body: resourceId and lockOwner are "
                          "strings, expiryInSeconds a 32-bit integer");
        return false;
    }
    *doc = req;
    return true;
}

/* daprd's checks after parsing, in its order (lockValidateRequest); the
 * name is then written to @name. Returns false with *@ret answered. */
static bool validate(struct cerb__serve_dapr *d, struct MHD_Connection *conn,
                     const char *store, const struct dapr_request *rq, bool lock,
                     char *name, size_t cap, enum MHD_Result *ret)
{
    const char *fail_code = lock ? "ERR_TRY_LOCK" : "ERR_UNLOCK";
    char why[320];
    bool ours;
    int n;

    if (lock && rq->expiry <= 0) {
        *ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, "ERR_EXPIRY_NOT_POSITIVE",
                          "expiry in seconds is not positive");
        return false;
    }
    if (!rq->resource[0]) {
        *ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, "ERR_RESOURCE_ID_EMPTY",
                          "lock resource id is empty");
        return false;
    }
    if (!rq->owner[0]) {
        *ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, "ERR_OWNER_EMPTY",
                          "lock owner is empty");
        return false;
    }
    cerb__serve_lock(&d->mu);
    ours = strcmp(store, d->store) == 0;
    if (ours && d->app_id)
        n = snprintf(name, cap, "lock" KEY_SEP "%s" KEY_SEP "%s", d->app_id, rq->resource);
    else
        n = snprintf(name, cap, "%s", rq->resource);
    cerb__serve_unlock(&d->mu);
    if (!ours) {
        snprintf(why, sizeof why, "lock %.200s is not found", store);
        *ret = dapr_error(conn, MHD_HTTP_NOT_FOUND, "ERR_LOCK_NOT_FOUND", why);
        return false;
    }
    if (strstr(rq->resource, KEY_SEP)) {
        /* daprd's GetModifiedLockKey refuses it, answered as a store
         * failure: the same code and HTTP status here. */
        snprintf(why, sizeof why, "%s: resource id \"%.200s\" must not contain \"||\"",
                 lock ? "failed to try acquiring lock" : "failed to release lock",
                 rq->resource);
        *ret = dapr_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, fail_code, why);
        return false;
    }
    if (n < 0 || (size_t)n >= cap) {
        *ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, fail_code,
                          "lock resource id is too long for a lock name");
        return false;
    }
    return true;
}

/* ---- the owners ---- */

static struct owner_entry **find(struct cerb__serve_dapr *d, const char *name)
{
    struct owner_entry **p = &d->head;
    while (*p && strcmp((*p)->name, name) != 0)
        p = &(*p)->next;
    return p;
}

/* What the hold table says of @id, without touching it: a deadline in the
 * past makes the wait a look. */
static enum cerb__serve_event peek(struct cerb__serve *s, const char *id)
{
    return cerb__serve_holds_wait(&s->holds, id, 0);
}

/* Takes out of the list (mutex held) every entry whose hold is gone, once
 * the list has doubled since the last sweep. */
static void prune(struct cerb__serve *s, struct cerb__serve_dapr *d)
{
    if (d->n < d->prune_at)
        return;
    for (struct owner_entry **p = &d->head; *p;) {
        if (peek(s, (*p)->id) == CERB_SERVE_EV_GONE) {
            struct owner_entry *e = *p;
            *p = e->next;
            entry_free(e);
            d->n--;
        } else {
            p = &(*p)->next;
        }
    }
    d->prune_at = d->n * 2 > 64 ? d->n * 2 : 64;
}

/* Forgets the entry at @p (mutex held). */
static void forget(struct cerb__serve_dapr *d, struct owner_entry **p)
{
    struct owner_entry *e = *p;
    *p = e->next;
    entry_free(e);
    d->n--;
}

/* ---- lock ---- */

/* A try of @name for a hold (wait 0), with a cancel the server's stop
 * fires; the status, the reason in @why. */
static cerb_status try_acquire(struct cerb__serve *s, const char *name, cerb_hold **hold,
                               char *why, size_t cap)
{
    cerb_lock *lk = NULL;
    cerb_cancel *cancel = NULL;
    cerb_status st = cerb_lock_new(s->client, name, NULL, &lk);

    *hold = NULL;
    if (st != CERB_OK) {
        snprintf(why, cap, "%s", cerb_last_error());
        return st;
    }
    st = cerb_cancel_new(&cancel);
    if (st == CERB_OK) {
        st = cerb__serve_waits_add(&s->waits, cancel, -1); /* a try: no wait to cut short */
        if (st == CERB_OK) {
            st = cerb_lock_acquire(lk, 0, cancel, hold);
            cerb__serve_waits_remove(&s->waits, cancel);
            snprintf(why, cap, "%s", cerb_cancel_error(cancel));
        } else {
            snprintf(why, cap, "%s", st == CERB_UNAVAILABLE ? "the server is stopping"
                                                            : "out of memory");
        }
        cerb_cancel_free(cancel);
    } else {
        snprintf(why, cap, "%s", cerb_last_error());
    }
    cerb_lock_free(lk); /* allowed once the acquisition returned */
    return st;
}

/* Records a grant: its hold in the table with the window @expiry_s, and
 * its owner. CERB_OK, or the table's error (the hold is then the
 * caller's). */
static cerb_status record(struct cerb__serve *s, struct cerb__serve_dapr *d,
                          const char *name, const char *owner, cerb_hold *hold,
                          json_int_t expiry_s)
{
    struct owner_entry *e = calloc(1, sizeof *e), **p;
    cerb_status st = CERB_ENOMEM;

    if (!e || !(e->name = strdup(name)) || !(e->owner = strdup(owner))) {
        if (e)
            entry_free(e);
        return CERB_ENOMEM;
    }
    cerb__serve_lock(&d->mu);
    st = cerb__serve_holds_add(&s->holds, hold, (int64_t)expiry_s * 1000, e->id);
    if (st == CERB_OK) {
        /* An entry left for the name is stale: the library granted the
         * name, so no other hold of it is kept here. */
        p = find(d, name);
        if (*p)
            forget(d, p);
        prune(s, d);
        e->next = d->head;
        d->head = e;
        d->n++;
    }
    cerb__serve_unlock(&d->mu);
    if (st != CERB_OK)
        entry_free(e);
    return st;
}

static enum MHD_Result dapr_lock(struct cerb__serve *s, struct MHD_Connection *conn,
                                 const char *store, const char *body, size_t len)
{
    struct cerb__serve_dapr *d = s->dapr;
    struct dapr_request rq = {"", "", 0};
    enum MHD_Result ret;
    json_t *doc;
    cerb_hold *hold = NULL, *stale = NULL;
    cerb_status st;
    char name[1024], why[512];

    if (!parse(conn, body, len, true, &doc, &rq, &ret))
        return ret;
    if (!validate(d, conn, store, &rq, true, name, sizeof name, &ret))
        goto out;
    /* A hold of the name this server still keeps but the library lost is
     * taken out first, so that the name can be granted again at once
     * rather than when its window passes. */
    cerb__serve_lock(&d->mu);
    {
        struct owner_entry **p = find(d, name);
        if (*p) {
            enum cerb__serve_event ev = peek(s, (*p)->id);
            if (ev == CERB_SERVE_EV_LOST)
                stale = cerb__serve_holds_take(&s->holds, (*p)->id);
            if (ev == CERB_SERVE_EV_LOST || ev == CERB_SERVE_EV_GONE)
                forget(d, p);
        }
    }
    cerb__serve_unlock(&d->mu);
    cerb_hold_free(stale); /* lost: nothing to release on the engine */
    st = try_acquire(s, name, &hold, why, sizeof why);
    if (st == CERB_BUSY) {
        ret = reply_success(conn, false);
        goto out;
    }
    if (st == CERB_EINVAL) {
        char msg[600];
        snprintf(msg, sizeof msg, "failed to try acquiring lock: %s", why);
        ret = dapr_error(conn, MHD_HTTP_BAD_REQUEST, "ERR_TRY_LOCK", msg);
        goto out;
    }
    if (st == CERB_OK && (st = record(s, d, name, rq.owner, hold, rq.expiry)) != CERB_OK) {
        snprintf(why, sizeof why, "cannot record the hold (%s)", cerb_status_name(st));
        cerb_hold_free(hold);
    }
    if (st != CERB_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "failed to try acquiring lock: %s", why);
        ret = dapr_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "ERR_TRY_LOCK", msg);
        goto out;
    }
    ret = reply_success(conn, true);
out:
    json_decref(doc);
    return ret;
}

/* ---- unlock ---- */

/* Whether anybody holds @name while this server keeps no hold of it:
 * UNLOCK_BELONGS_TO_OTHERS or UNLOCK_DOES_NOT_EXIST, or
 * UNLOCK_INTERNAL_ERROR with the reason in @why. */
static enum unlock_status held_elsewhere(struct cerb__serve *s, const char *name, char *why,
                                         size_t cap)
{
    cerb_holder_info *v = NULL;
    size_t n = 0;
    cerb_status st = cerb_lock_inspect(s->client, name, NULL, &v, &n);
    bool held = false;
    cerb_hold *hold = NULL;

    for (size_t i = 0; i < n; i++)
        held = held || !v[i].waiting;
    if (st != CERB_OK)
        snprintf(why, cap, "%s", cerb_last_error());
    cerb_holders_free(v, n);
    if (held)
        return UNLOCK_BELONGS_TO_OTHERS; /* whatever the other engines said */
    if (st == CERB_OK)
        return UNLOCK_DOES_NOT_EXIST;
    if (st != CERB_UNAVAILABLE)
        return UNLOCK_INTERNAL_ERROR;
    /* An engine that cannot be inspected (or is not open): a try says.
     * Granted, it is released at once: no hold is kept, and the name was
     * free, so nobody lost anything by it. */
    st = try_acquire(s, name, &hold, why, cap);
    if (st == CERB_BUSY)
        return UNLOCK_BELONGS_TO_OTHERS;
    if (st != CERB_OK)
        return UNLOCK_INTERNAL_ERROR;
    st = cerb_hold_free(hold);
    if (st != CERB_OK) {
        snprintf(why, cap, "a probe of the name could not be released (%s): it "
                           "expires with its lease", cerb_status_name(st));
        return UNLOCK_INTERNAL_ERROR;
    }
    return UNLOCK_DOES_NOT_EXIST;
}

static enum MHD_Result dapr_unlock(struct cerb__serve *s, struct MHD_Connection *conn,
                                   const char *store, const char *body, size_t len)
{
    struct cerb__serve_dapr *d = s->dapr;
    struct dapr_request rq = {"", "", 0};
    enum MHD_Result ret;
    enum unlock_status us = UNLOCK_DOES_NOT_EXIST;
    enum cerb__serve_event ev = CERB_SERVE_EV_GONE;
    bool mine = false, others = false;
    json_t *doc;
    cerb_hold *hold = NULL, *stale = NULL;
    char name[1024], why[512] = "";

    if (!parse(conn, body, len, false, &doc, &rq, &ret))
        return ret;
    if (!validate(d, conn, store, &rq, false, name, sizeof name, &ret))
        goto out;
    cerb__serve_lock(&d->mu);
    {
        struct owner_entry **p = find(d, name);
        if (*p) {
            ev = peek(s, (*p)->id);
            if (strcmp((*p)->owner, rq.owner) == 0) {
                /* Ours, in whatever state: it ends here. */
                mine = true;
                hold = cerb__serve_holds_take(&s->holds, (*p)->id);
                forget(d, p);
            } else if (ev == CERB_SERVE_EV_TIMEOUT || ev == CERB_SERVE_EV_STOP) {
                others = true; /* another owner's live hold */
            } else {
                /* Another owner's hold, expired or lost: it holds nothing. */
                if (ev == CERB_SERVE_EV_LOST)
                    stale = cerb__serve_holds_take(&s->holds, (*p)->id);
                forget(d, p);
            }
        }
    }
    cerb__serve_unlock(&d->mu);
    cerb_hold_free(stale);
    if (others) {
        us = UNLOCK_BELONGS_TO_OTHERS;
    } else if (mine) {
        /* No hold in the table: the expiry thread took it between the
         * look and the take, so it expired. */
        if (!hold || ev == CERB_SERVE_EV_LOST) {
            us = UNLOCK_DOES_NOT_EXIST;
        } else {
            cerb_status st = cerb_hold_release(hold);
            if (st == CERB_OK)
                us = UNLOCK_SUCCESS;
            else if (st == CERB_LOST || st == CERB_NOT_OWNER)
                us = UNLOCK_DOES_NOT_EXIST;
            else {
                us = UNLOCK_INTERNAL_ERROR;
                snprintf(why, sizeof why, "%s (the lease expires by itself)",
                         cerb_hold_error(hold));
            }
        }
        cerb_hold_free(hold);
    } else {
        us = held_elsewhere(s, name, why, sizeof why);
    }
    if (us == UNLOCK_INTERNAL_ERROR) {
        char msg[600];
        snprintf(msg, sizeof msg, "failed to release lock: %s", why);
        ret = dapr_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "ERR_UNLOCK", msg);
    } else {
        ret = reply_status(conn, us);
    }
out:
    json_decref(doc);
    return ret;
}

/* ---- metadata ---- */

static enum MHD_Result dapr_metadata(struct cerb__serve *s, struct MHD_Connection *conn)
{
    struct cerb__serve_dapr *d = s->dapr;
    json_t *o;

    cerb__serve_lock(&d->mu);
    o = json_pack("{s:s, s:s, s:[], s:[{s:s, s:s, s:s, s:[]}], s:{}}", "id",
                  d->app_id ? d->app_id : "cerberus", "runtimeVersion", cerb_version(),
                  "enabledFeatures", "components", "name", d->store, "type",
                  "lock.cerberus", "version", "v1", "capabilities", "extended");
    cerb__serve_unlock(&d->mu);
    if (!o)
        return MHD_NO;
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, o);
}

/* The store of @url under @prefix into @out, or false (empty, a '/' in
 * it, too long). */
static bool store_of(const char *url, const char *prefix, char *out, size_t cap)
{
    size_t pl = strlen(prefix), n;

    if (strncmp(url, prefix, pl) != 0)
        return false;
    url += pl;
    n = strlen(url);
    if (n == 0 || n >= cap || strchr(url, '/'))
        return false;
    memcpy(out, url, n + 1);
    return true;
}

enum MHD_Result cerb__serve_dapr_route(struct cerb__serve *s, struct MHD_Connection *conn,
                                       const char *method, const char *url,
                                       const char *body, size_t len)
{
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    char store[256];

    if (post && store_of(url, LOCK_PREFIX, store, sizeof store))
        return dapr_lock(s, conn, store, body, len);
    if (post && store_of(url, UNLOCK_PREFIX, store, sizeof store))
        return dapr_unlock(s, conn, store, body, len);
    if (get && strcmp(url, "/v1.0/metadata") == 0)
        return dapr_metadata(s, conn);
    if (get && (strcmp(url, "/v1.0/healthz") == 0 ||
                strcmp(url, "/v1.0/healthz/outbound") == 0))
        return reply_no_content(conn);
    return dapr_error(conn, MHD_HTTP_NOT_FOUND, "ERR_NOT_FOUND",
                      "cerberus serve answers only Dapr's lock API (POST "
                      "/v1.0-alpha1/lock/STORE, /v1.0-alpha1/unlock/STORE), GET "
                      "/v1.0/metadata and /v1.0/healthz");
}
