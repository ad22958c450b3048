/*
 * etcd_json.c — building the gateway's requests and reading its answers.
 *
 * Requests are built as jansson objects and serialised by the HTTP layer;
 * keys go through base64 (libcrypto's EVP_EncodeBlock, never a hand-made
 * table) and int64 fields are written as decimal strings, the form the
 * gateway itself uses. Enum fields use their names ("CREATE", "DESCEND"),
 * which the gateway accepts, and which fail loudly (HTTP 400) if misspelt,
 * where a misspelt field name would be ignored.
 *
 * Answers are read leniently where the gateway is lenient and strictly
 * where it matters: every absent field is a zero value (the gateway omits
 * them: a failed txn has no `succeeded`, an empty range no `kvs` nor
 * `count`, a DELETE event a `type` but a PUT event none, a keepalive for a
 * dead lease no `TTL`), an int64 may come as a string or a number, and a
 * field of the wrong type is a protocol error rather than a silent zero.
 */
#include "internal_posix.h"

#include "etcd_json.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "etcd_errors.h"

/* ---- base64 ---- */

char *cerb__etcd_b64_encode(const void *p, size_t n)
{
    /* EVP_EncodeBlock takes an int length: keys are far below that. */
    if (n > (size_t)(1 << 28))
        return NULL;
    size_t out_len = 4 * ((n + 2) / 3) + 1;
    char *out = cerb__malloc(out_len);
    if (!out)
        return NULL;
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)p, (int)n);
    return out;
}

cerb_status cerb__etcd_b64_decode(const char *s, char **out, size_t *n)
{
    size_t len = strlen(s);

    *out = NULL;
    *n = 0;
    if (len % 4 != 0 || len > (size_t)(1 << 28))
        return cerb__error_set(CERB_EPROTO, "etcd: bad base64 (length %zu)", len);
    char *buf = cerb__malloc(len / 4 * 3 + 1);
    if (!buf)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory decoding base64");
    int k = len ? EVP_DecodeBlock((unsigned char *)buf, (const unsigned char *)s, (int)len) : 0;
    if (k < 0) {
        cerb__free(buf);
        return cerb__error_set(CERB_EPROTO, "etcd: bad base64 \"%.40s\"", s);
    }
    /* EVP_DecodeBlock counts the bytes the padding stands for. */
    size_t pad = 0;
    while (pad < 2 && len > pad && s[len - 1 - pad] == '=')
        pad++;
    if ((size_t)k < pad) {
        cerb__free(buf);
        return cerb__error_set(CERB_EPROTO, "etcd: bad base64 \"%.40s\"", s);
    }
    *n = (size_t)k - pad;
    buf[*n] = '\0';
    *out = buf;
    return CERB_OK;
}

/* ---- field helpers ---- */

json_t *cerb__etcd_json_bytes(const void *p, size_t n)
{
    char *b = cerb__etcd_b64_encode(p, n);
    if (!b)
        return NULL;
    json_t *j = json_string(b);
    cerb__free(b);
    return j;
}

json_t *cerb__etcd_json_i64(int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return json_string(buf);
}

cerb_status cerb__etcd_get_i64(const json_t *obj, const char *name, int64_t *out)
{
    const json_t *v = json_object_get(obj, name);

    *out = 0;
    if (!v || json_is_null(v))
        return CERB_OK;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return CERB_OK;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (s[0] != '\0' && *end == '\0' && errno == 0) {
            *out = (int64_t)x;
            return CERB_OK;
        }
    }
    return cerb__error_set(CERB_EPROTO, "etcd: field \"%s\" is not a 64-bit integer", name);
}

cerb_status cerb__etcd_get_bool(const json_t *obj, const char *name, bool *out)
{
    const json_t *v = json_object_get(obj, name);

    *out = false;
    if (!v || json_is_null(v))
        return CERB_OK;
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return CERB_OK;
    }
    return cerb__error_set(CERB_EPROTO, "etcd: field \"%s\" is not a boolean", name);
}

/* ---- builders ---- */

/* Set obj[name] = v (stolen); on any failure drop obj and return NULL. */
static json_t *put(json_t *obj, const char *name, json_t *v)
{
    if (json_object_set_new(obj, name, v) != 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* Wrap v (stolen) as {name: v}. */
static json_t *wrap(const char *name, json_t *v)
{
    if (!v)
        return NULL;
    return put(json_object(), name, v);
}

json_t *cerb__etcd_range_json(const struct etcd_range_req *r)
{
    json_t *o = put(json_object(), "key", cerb__etcd_json_bytes(r->key, r->key_len));
    if (o && r->end)
        o = put(o, "range_end", cerb__etcd_json_bytes(r->end, r->end_len));
    if (o && r->limit > 0)
        o = put(o, "limit", cerb__etcd_json_i64(r->limit));
    if (o && r->sort_order)
        o = put(o, "sort_order", json_string(r->sort_order));
    if (o && r->sort_target)
        o = put(o, "sort_target", json_string(r->sort_target));
    if (o && r->max_create_revision > 0)
        o = put(o, "max_create_revision", cerb__etcd_json_i64(r->max_create_revision));
    if (o && r->revision > 0)
        o = put(o, "revision", cerb__etcd_json_i64(r->revision));
    if (o && r->keys_only)
        o = put(o, "keys_only", json_true());
    if (o && r->count_only)
        o = put(o, "count_only", json_true());
    return o;
}

json_t *cerb__etcd_op_range(const struct etcd_range_req *r)
{
    return wrap("request_range", cerb__etcd_range_json(r));
}

json_t *cerb__etcd_op_put(const char *key, size_t key_len, const char *value, size_t value_len,
                          int64_t lease)
{
    json_t *o = put(json_object(), "key", cerb__etcd_json_bytes(key, key_len));
    if (o && value && value_len > 0)
        o = put(o, "value", cerb__etcd_json_bytes(value, value_len));
    if (o && lease != 0)
        o = put(o, "lease", cerb__etcd_json_i64(lease));
    return wrap("request_put", o);
}

json_t *cerb__etcd_op_delete(const char *key, size_t key_len)
{
    return wrap("request_delete_range",
                put(json_object(), "key", cerb__etcd_json_bytes(key, key_len)));
}

json_t *cerb__etcd_cmp_create(const char *key, size_t key_len, const char *end, size_t end_len,
                              const char *result, int64_t rev)
{
    json_t *o = put(json_object(), "key", cerb__etcd_json_bytes(key, key_len));
    if (o && end)
        o = put(o, "range_end", cerb__etcd_json_bytes(end, end_len));
    if (o)
        o = put(o, "target", json_string("CREATE"));
    if (o)
        o = put(o, "result", json_string(result));
    if (o)
        o = put(o, "create_revision", cerb__etcd_json_i64(rev));
    return o;
}

json_t *cerb__etcd_cmp_value(const char *key, size_t key_len, const char *result,
                             const void *value, size_t n)
{
    json_t *o = put(json_object(), "key", cerb__etcd_json_bytes(key, key_len));
    if (o)
        o = put(o, "target", json_string("VALUE"));
    if (o)
        o = put(o, "result", json_string(result));
    if (o)
        o = put(o, "value", cerb__etcd_json_bytes(value, n));
    return o;
}

json_t *cerb__etcd_cmp_key(const char *key, size_t key_len, const char *target,
                           const char *result, int64_t v)
{
    const char *field = strcmp(target, ETCD_TARGET_MOD) == 0 ? "mod_revision" : "version";
    json_t *o = put(json_object(), "key", cerb__etcd_json_bytes(key, key_len));
    if (o)
        o = put(o, "target", json_string(target));
    if (o)
        o = put(o, "result", json_string(result));
    if (o)
        o = put(o, field, cerb__etcd_json_i64(v));
    return o;
}

json_t *cerb__etcd_txn(json_t *compare, json_t *success, json_t *failure)
{
    json_t *o = json_object();
    bool bad = !o;

    if (compare && !bad)
        bad = !(o = put(o, "compare", compare)), compare = NULL;
    if (success && !bad)
        bad = !(o = put(o, "success", success)), success = NULL;
    if (failure && !bad)
        bad = !(o = put(o, "failure", failure)), failure = NULL;
    /* Whatever was not handed over is still ours to drop. */
    json_decref(compare);
    json_decref(success);
    json_decref(failure);
    return bad ? NULL : o;
}

json_t *cerb__etcd_list(json_t *a, json_t *b)
{
    json_t *arr = json_array();
    int rc = json_array_append_new(arr, a);
    if (b)
        rc |= json_array_append_new(arr, b);
    if (rc != 0 || !arr) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

void cerb__etcd_prefix_end(const char *p, size_t n, char *out, size_t *out_n)
{
    for (size_t i = n; i > 0; i--) {
        unsigned char c = (unsigned char)p[i - 1];
        if (c < 0xff) {
            memcpy(out, p, i - 1);
            out[i - 1] = (char)(c + 1);
            *out_n = i;
            return;
        }
    }
    out[0] = '\0';
    *out_n = 1;
}

/* ---- parsers ---- */

void cerb__etcd_kv_clear(struct etcd_kv *kv)
{
    cerb__free(kv->key);
    cerb__free(kv->value);
    memset(kv, 0, sizeof *kv);
}

static cerb_status parse_kv(const json_t *j, struct etcd_kv *kv)
{
    cerb_status st;

    memset(kv, 0, sizeof *kv);
    if (!json_is_object(j))
        return cerb__error_set(CERB_EPROTO, "etcd: a kv is not an object");
    const json_t *k = json_object_get(j, "key");
    if (!json_is_string(k))
        return cerb__error_set(CERB_EPROTO, "etcd: a kv has no key");
    st = cerb__etcd_b64_decode(json_string_value(k), &kv->key, &kv->key_len);
    const json_t *v = json_object_get(j, "value");
    if (st == CERB_OK && v && !json_is_null(v)) {
        if (json_is_string(v))
            st = cerb__etcd_b64_decode(json_string_value(v), &kv->value, &kv->value_len);
        else
            st = cerb__error_set(CERB_EPROTO, "etcd: a kv's value is not a string");
    }
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(j, "create_revision", &kv->create_revision);
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(j, "mod_revision", &kv->mod_revision);
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(j, "version", &kv->version);
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(j, "lease", &kv->lease);
    if (st != CERB_OK)
        cerb__etcd_kv_clear(kv);
    return st;
}

cerb_status cerb__etcd_parse_range(const json_t *rr, struct etcd_range_res *out)
{
    memset(out, 0, sizeof *out);
    if (!json_is_object(rr))
        return cerb__error_set(CERB_EPROTO, "etcd: range response is not an object");
    cerb_status st = cerb__etcd_get_i64(rr, "count", &out->count);
    if (st != CERB_OK)
        return st;
    const json_t *kvs = json_object_get(rr, "kvs");
    if (!kvs || json_is_null(kvs))
        return CERB_OK;
    if (!json_is_array(kvs))
        return cerb__error_set(CERB_EPROTO, "etcd: \"kvs\" is not an array");
    out->n_kvs = json_array_size(kvs);
    if (out->n_kvs == 0)
        return CERB_OK;
    st = parse_kv(json_array_get(kvs, 0), &out->first);
    if (st != CERB_OK)
        out->n_kvs = 0;
    return st;
}

cerb_status cerb__etcd_header_rev(const json_t *obj, int64_t *rev)
{
    const json_t *h = json_object_get(obj, "header");
    *rev = 0;
    if (!h)
        return CERB_OK;
    if (!json_is_object(h))
        return cerb__error_set(CERB_EPROTO, "etcd: \"header\" is not an object");
    return cerb__etcd_get_i64(h, "revision", rev);
}

cerb_status cerb__etcd_parse_txn(const json_t *resp, size_t want, bool *succeeded, int64_t *rev,
                                 const json_t **responses)
{
    cerb_status st;

    *responses = NULL;
    if (!json_is_object(resp))
        return cerb__error_set(CERB_EPROTO, "etcd: txn response is not an object");
    st = cerb__etcd_get_bool(resp, "succeeded", succeeded);
    if (st == CERB_OK)
        st = cerb__etcd_header_rev(resp, rev);
    if (st != CERB_OK)
        return st;
    const json_t *r = json_object_get(resp, "responses");
    if (r && !json_is_array(r))
        return cerb__error_set(CERB_EPROTO, "etcd: txn \"responses\" is not an array");
    size_t n = r ? json_array_size(r) : 0;
    if (want > 0 && n != want)
        return cerb__error_set(CERB_EPROTO, "etcd: txn answered %zu responses, expected %zu", n,
                               want);
    *responses = r; /* NULL when omitted: json_array_size(NULL) is 0 */
    return CERB_OK;
}

const json_t *cerb__etcd_txn_range(const json_t *responses, size_t i)
{
    const json_t *o = json_array_get(responses, i);
    const json_t *rr = json_object_get(o, "response_range");
    return json_is_object(rr) ? rr : NULL;
}

bool cerb__etcd_error_of(const json_t *root, struct etcd_error_body *out)
{
    const json_t *e, *code, *msg;

    out->code = -1;
    out->message[0] = '\0';
    if (!json_is_object(root))
        return false;
    e = json_object_get(root, "error");
    if (json_is_object(e)) {
        /* In-band stream error: {"error": {"grpc_code", "http_code",
         * "message", "http_status"}}. */
        code = json_object_get(e, "grpc_code");
        if (!code)
            code = json_object_get(e, "code");
        msg = json_object_get(e, "message");
    } else if (e) {
        /* Unary error body: {"error": "...", "message": "...", "code": n}. */
        code = json_object_get(root, "code");
        msg = json_object_get(root, "message");
        if (!json_is_string(msg))
            msg = e;
    } else {
        return false;
    }
    out->code = json_is_integer(code) ? (int)json_integer_value(code) : ETCD_GRPC_UNKNOWN;
    snprintf(out->message, sizeof out->message, "%s",
             json_is_string(msg) ? json_string_value(msg) : "");
    return true;
}

void cerb__etcd_parse_error(const char *body, size_t len, struct etcd_error_body *out)
{
    json_t *root = json_loadb(body, len, JSON_DISABLE_EOF_CHECK, NULL);
    if (!cerb__etcd_error_of(root, out)) {
        out->code = -1;
        /* Not a gateway error body: keep the text for the message. */
        size_t n = len < sizeof out->message - 1 ? len : sizeof out->message - 1;
        while (n > 0 && (body[n - 1] == '\n' || body[n - 1] == '\r' || body[n - 1] == ' '))
            n--;
        memcpy(out->message, body, n);
        out->message[n] = '\0';
    }
    json_decref(root);
}

cerb_status cerb__etcd_parse_watch_line(const char *line, size_t len, struct etcd_watch_msg *m)
{
    json_error_t jerr;
    cerb_status st = CERB_OK;

    memset(m, 0, sizeof *m);
    json_t *root = json_loadb(line, len, 0, &jerr);
    if (!root)
        return cerb__error_set(CERB_EPROTO, "etcd: watch stream: bad JSON (%s)", jerr.text);
    struct etcd_error_body eb;
    if (cerb__etcd_error_of(root, &eb)) {
        m->is_error = true;
        m->code = eb.code;
        snprintf(m->message, sizeof m->message, "%s", eb.message);
        json_decref(root);
        return CERB_OK;
    }
    const json_t *r = json_object_get(root, "result");
    if (!json_is_object(r)) {
        json_decref(root);
        return cerb__error_set(CERB_EPROTO, "etcd: watch stream: a line without \"result\"");
    }
    st = cerb__etcd_header_rev(r, &m->header_rev);
    if (st == CERB_OK)
        st = cerb__etcd_get_bool(r, "created", &m->created);
    if (st == CERB_OK)
        st = cerb__etcd_get_bool(r, "canceled", &m->canceled);
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(r, "compact_revision", &m->compact_revision);
    const json_t *reason = json_object_get(r, "cancel_reason");
    if (json_is_string(reason))
        snprintf(m->cancel_reason, sizeof m->cancel_reason, "%s", json_string_value(reason));
    const json_t *ev = json_object_get(r, "events");
    if (st == CERB_OK && ev && !json_is_array(ev))
        st = cerb__error_set(CERB_EPROTO, "etcd: watch stream: \"events\" is not an array");
    if (st == CERB_OK && ev) {
        size_t i;
        const json_t *e;
        json_array_foreach(ev, i, e) {
            const json_t *t = json_object_get(e, "type");
            m->n_events++;
            /* PUT is the zero value of the enum and is omitted. */
            if (json_is_string(t) && strcmp(json_string_value(t), "DELETE") == 0)
                m->n_delete++;
            else if (json_is_integer(t) && json_integer_value(t) == 1)
                m->n_delete++;
        }
    }
    json_decref(root);
    return st;
}

cerb_status cerb__etcd_watch_line_deletes(const char *line, size_t len,
                                          void (*fn)(void *ud, const char *key, size_t n),
                                          void *ud)
{
    json_error_t jerr;
    json_t *root = json_loadb(line, len, 0, &jerr);
    if (!root)
        return cerb__error_set(CERB_EPROTO, "etcd: watch stream: bad JSON (%s)", jerr.text);
    cerb_status st = CERB_OK;
    const json_t *ev = json_object_get(json_object_get(root, "result"), "events");
    size_t i;
    const json_t *e;
    json_array_foreach(ev, i, e) {
        const json_t *t = json_object_get(e, "type");
        bool del = (json_is_string(t) && strcmp(json_string_value(t), "DELETE") == 0) ||
                   (json_is_integer(t) && json_integer_value(t) == 1);
        const char *b64 = json_string_value(json_object_get(json_object_get(e, "kv"), "key"));
        if (!del || !b64)
            continue;
        char *key = NULL;
        size_t n = 0;
        st = cerb__etcd_b64_decode(b64, &key, &n);
        if (st != CERB_OK)
            break;
        fn(ud, key, n);
        cerb__free(key);
    }
    json_decref(root);
    return st;
}

cerb_status cerb__etcd_range_each(const json_t *rr,
                                  bool (*fn)(void *ud, const struct etcd_kv *kv), void *ud)
{
    if (!json_is_object(rr))
        return cerb__error_set(CERB_EPROTO, "etcd: a range answer is not an object");
    const json_t *kvs = json_object_get(rr, "kvs");
    if (kvs && !json_is_array(kvs))
        return cerb__error_set(CERB_EPROTO, "etcd: \"kvs\" is not an array");
    size_t i;
    const json_t *o;
    cerb_status st = CERB_OK;
    json_array_foreach(kvs, i, o) {
        struct etcd_kv kv = {0};
        const char *kb = json_string_value(json_object_get(o, "key"));
        const char *vb = json_string_value(json_object_get(o, "value"));
        if (!kb)
            st = cerb__error_set(CERB_EPROTO, "etcd: a kv without a key");
        if (st == CERB_OK)
            st = cerb__etcd_b64_decode(kb, &kv.key, &kv.key_len);
        if (st == CERB_OK && vb)
            st = cerb__etcd_b64_decode(vb, &kv.value, &kv.value_len);
        if (st == CERB_OK)
            st = cerb__etcd_get_i64(o, "create_revision", &kv.create_revision);
        if (st == CERB_OK)
            st = cerb__etcd_get_i64(o, "mod_revision", &kv.mod_revision);
        if (st == CERB_OK)
            st = cerb__etcd_get_i64(o, "version", &kv.version);
        if (st == CERB_OK)
            st = cerb__etcd_get_i64(o, "lease", &kv.lease);
        if (st == CERB_OK && !fn(ud, &kv))
            st = cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
        cerb__etcd_kv_clear(&kv);
        if (st != CERB_OK)
            break;
    }
    return st;
}

cerb_status cerb__etcd_parse_keepalive(const json_t *result, int64_t *id, int64_t *ttl)
{
    *id = *ttl = 0;
    if (!json_is_object(result))
        return cerb__error_set(CERB_EPROTO, "etcd: keepalive answer is not an object");
    cerb_status st = cerb__etcd_get_i64(result, "ID", id);
    if (st == CERB_OK)
        st = cerb__etcd_get_i64(result, "TTL", ttl);
    return st;
}
