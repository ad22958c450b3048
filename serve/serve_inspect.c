/*
 * serve_inspect.c — the read-only routes of `cerberus serve`:
 *
 *   GET /v1/status        {"current": NAME, "engines": [{"name", "active",
 *                         "breaker", "wanted", "last_probe_us", counters...,
 *                         "epoch", "closed_epoch"}]} from cerb_engine_current
 *                         and cerb_engine_info (every field), one entry per
 *                         configured engine in configuration order;
 *   GET /v1/locks/{name}  {"name", "holders": [{"engine", "owner", "waiting",
 *                         "fence", "ttl_ms", "detail"}]} from
 *                         cerb_lock_inspect (every open engine), as
 *                         `cerberus holders` prints it.
 *
 * The public API has no call that lists the configured engines, and
 * serve/ sees the client only; their names, in configuration order, come
 * from the metrics text (cerb_metrics_text lists every configured engine,
 * in that order, under cerberus_engine_active{engine="NAME"}), as the
 * Python package's Client.status() finds them, and each is then asked
 * with cerb_engine_info. Should the metrics text fail (no memory), the
 * current engine alone is listed.
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
        {"guard_begins", in->guard_begins},
        {"guard_duplicates", in->guard_duplicates},
        {"guard_busy", in->guard_busy},
        {"guard_degraded", in->guard_degraded},
        {"gate_questions", in->gate_questions},
    };

    if (!e)
        return NULL;
    json_object_set_new(e, "last_probe_us", in->last_probe_us < 0
                                                ? json_null()
                                                : json_integer((json_int_t)in->last_probe_us));
    for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++)
        json_object_set_new(e, counters[k].key, json_integer((json_int_t)counters[k].v));
    json_object_set_new(e, "epoch", json_integer((json_int_t)in->epoch));
    json_object_set_new(e, "closed_epoch", json_integer((json_int_t)in->closed_epoch));
    return e;
}

/* The label value that starts at @p (after `engine="`), unescaped
 * (\\, \" and \n, as the format escapes them), as a new JSON string;
 * NULL when it does not end on its line. */
static json_t *label_value(const char *p)
{
    char buf[256];
    size_t n = 0;

    for (; *p && *p != '"' && *p != '\n'; p++) {
        char c = *p;
        if (c == '\\') {
            p++;
            if (*p == 'n')
                c = '\n';
            else if (*p == '\\' || *p == '"')
                c = *p;
            else
                return NULL;
        }
        if (n + 1 >= sizeof buf)
            return NULL;
        buf[n++] = c;
    }
    if (*p != '"')
        return NULL;
    return json_stringn(buf, n);
}

/* The configured engines' names in configuration order (a JSON array of
 * strings), read from the client's metrics; NULL when they cannot be. */
static json_t *engine_names(cerb_client *client)
{
    static const char marker[] = "cerberus_engine_active{engine=\"";
    char *text = NULL;
    json_t *names;

    if (cerb_metrics_text(client, &text) != CERB_OK)
        return NULL;
    names = json_array();
    for (const char *line = text; names && line && *line;) {
        const char *nl = strchr(line, '\n');
        if (strncmp(line, marker, sizeof marker - 1) == 0) {
            json_t *name = label_value(line + sizeof marker - 1);
            size_t i;
            json_t *v;
            bool seen = false;
            json_array_foreach(names, i, v) {
                if (name && json_equal(v, name))
                    seen = true;
            }
            if (name && !seen)
                json_array_append(names, name);
            json_decref(name);
        }
        line = nl ? nl + 1 : NULL;
    }
    cerb_free(text);
    return names;
}

enum MHD_Result cerb__serve_status(struct cerb__serve *s, struct MHD_Connection *conn)
{
    const char *current = cerb_engine_current(s->client);
    json_t *o = json_object(), *arr = json_array(), *names = engine_names(s->client), *v;
    size_t i;

    if (!names && current)
        names = json_pack("[s]", current);
    if (!o || !arr || !names) {
        json_decref(o);
        json_decref(arr);
        json_decref(names);
        return MHD_NO;
    }
    json_array_foreach(names, i, v) {
        struct cerb_engine_info in;
        if (cerb_engine_info(s->client, json_string_value(v), &in) != CERB_OK)
            continue; /* not an engine after all */
        json_array_append_new(arr, engine_json(&in));
    }
    json_decref(names);
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
    return cerb__serve_reply_json(conn, MHD_HTTP_OK, o);
}
