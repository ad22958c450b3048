/*
 * serve_inspect.c — the read-only routes of `cerberus serve`:
 *
 *   GET /v1/status        {"current": NAME, "engines": [{"name", "active",
 *                         "breaker", "wanted", "last_probe_us", counters...}]}
 *                         from cerb_engine_current and cerb_engine_info, in
 *                         the shape of `cerberus status --json`;
 *   GET /v1/locks/{name}  {"name", "holders": [{"engine", "owner", "waiting",
 *                         "fence", "ttl_ms", "detail"}]} from
 *                         cerb_lock_inspect (every open engine), as
 *                         `cerberus holders` prints it.
 *
 * The public API has no call that lists the configured engines, and
 * serve/ sees the client only; the status therefore asks cerb_engine_info
 * for each built-in engine name (and the current engine), and lists those
 * the client knows. TODO: an engine registered under another name is
 * listed only while it is the current one.
 * Fences are decimal strings, as the acquisition's fencing_token.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "serve_internal.h"

/* The breaker's names as `cerberus status` and the library's log spell them. */
static const char *breaker_name(cerb_breaker_state st)
{
    switch (st) {
    case CERB_BREAKER_CLOSED:
        return "closed";
    case CERB_BREAKER_OPEN:
        return "open";
    case CERB_BREAKER_HALF_OPEN:
        return "half_open";
    case CERB_BREAKER_DISABLED:
        return "disabled";
    case CERB_BREAKER_FORCED_OPEN:
        return "forced_open";
    }
    return "unknown"; /* after the switch: -Wswitch names a new state */
}

static json_t *engine_json(const struct cerb_engine_info *in)
{
    json_t *e = json_pack("{s:s, s:b, s:s, s:b}", "name", in->name, "active", in->active,
                          "breaker", breaker_name(in->breaker), "wanted", in->wanted);
    const struct {
        const char *key;
        uint64_t v;
    } counters[] = {
        {"acquires", in->acquires},
        {"failures", in->failures},
        {"lost", in->lost},
        {"acquire_calls", in->acquire_calls},
        {"wakeups", in->wakeups},
        {"handoffs", in->handoffs},
        {"breaker_transitions", in->breaker_transitions},
        {"switches", in->switches},
    };

    if (!e)
        return NULL;
    json_object_set_new(e, "last_probe_us", in->last_probe_us < 0
                                                ? json_null()
                                                : json_integer((json_int_t)in->last_probe_us));
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++)
        json_object_set_new(e, counters[k].key, json_integer((json_int_t)counters[k].v));
    json_object_set_new(e, "epoch", json_integer((json_int_t)in->epoch));
    return e;
}

enum MHD_Result cerb__serve_status(struct cerb__serve *s, struct MHD_Connection *conn)
{
    static const char *const builtin[] = {"redis", "zk", "etcd", "local"};
    const char *current = cerb_engine_current(s->client);
    json_t *o = json_object(), *arr = json_array();
    bool current_listed = false;

    if (!o || !arr) {
        json_decref(o);
        json_decref(arr);
        return MHD_NO;
    }
    for (size_t i = 0; i <= sizeof builtin / sizeof builtin[0]; i++) {
        const char *name = i < sizeof builtin / sizeof builtin[0] ? builtin[i] : current;
        struct cerb_engine_info in;
        if (!name || (i == sizeof builtin / sizeof builtin[0] && current_listed))
            continue;
        if (cerb_engine_info(s->client, name, &in) != CERB_OK)
            continue; /* not configured */
        if (current && strcmp(name, current) == 0)
            current_listed = true;
        json_array_append_new(arr, engine_json(&in));
    }
    json_object_set_new(o, "current", current ? json_string(current) : json_null());
    json_object_set_new(o, "engines", arr);
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, o);
}

enum MHD_Result cerb__serve_inspect(struct cerb__serve *s, struct MHD_Connection *conn,
                                    const char *name)
{
    cerb_holder_info *v = NULL;
    size_t n = 0;
    cerb_status st = cerb_lock_inspect(s->client, name, NULL, &v, &n);
    json_t *o, *arr;
    char fence[24];

    if (st != CERB_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", cerb_last_error());
        cerb_holders_free(v, n);
        return cerb__serve_reply_error(conn, st, why);
    }
    arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        snprintf(fence, sizeof fence, "%" PRIu64, v[i].fence);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:b, s:s, s:I, s:s}", "engine",
                                             v[i].engine ? v[i].engine : "", "owner",
                                             v[i].owner ? v[i].owner : "", "waiting",
                                             v[i].waiting, "fence", fence, "ttl_ms",
                                             (json_int_t)v[i].ttl_ms, "detail",
                                             v[i].detail ? v[i].detail : ""));
    }
    cerb_holders_free(v, n);
    o = json_pack("{s:s, s:o}", "name", name, "holders", arr);
    if (!o)
        return MHD_NO;
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, o);
}
