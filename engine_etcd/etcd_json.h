/*
 * etcd_json.h — the JSON of the etcd v3 gateway: request builders and
 * response parsers (jansson), and base64 for keys (libcrypto).
 *
 * Conventions of the gateway that every function here follows: keys and
 * values travel as base64 strings; 64-bit integers are decimal strings (we
 * send them as strings and accept both forms back); fields with a zero
 * value are omitted from answers (a missing `create_revision` is 0, a
 * missing `succeeded` is false, a missing `kvs` is empty); unknown request
 * fields are ignored silently, so every field name below was checked
 * against a real server.
 *
 * Ownership: builders return a new reference (json_decref it) or NULL when
 * out of memory; builders that take json_t arguments steal them, even on
 * failure. Parsers borrow their input; strings they return are
 * cerb__malloc'd and documented per function.
 */
#ifndef CERB_ETCD_JSON_H
#define CERB_ETCD_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

/* ---- base64 (EVP_EncodeBlock / EVP_DecodeBlock) ---- */

/* NUL-terminated base64 of p[0..n) (cerb__malloc'd), or NULL on OOM. */
char *cerb__etcd_b64_encode(const void *p, size_t n);
/* Decode NUL-terminated base64 `s` into *out (cerb__malloc'd, NUL-terminated
 * for convenience) and *n. CERB_EPROTO for text that is not base64,
 * CERB_ENOMEM. */
cerb_status cerb__etcd_b64_decode(const char *s, char **out, size_t *n);

/* ---- field helpers ---- */

/* A JSON string holding base64 of p[0..n). */
json_t *cerb__etcd_json_bytes(const void *p, size_t n);
/* A JSON string holding the decimal text of v (how the gateway writes int64). */
json_t *cerb__etcd_json_i64(int64_t v);
/*
 * Read int64 field `name` of `obj`: a decimal string or a JSON integer; an
 * absent field (or null) is 0, as the gateway omits zero values.
 * Returns: CERB_OK, or CERB_EPROTO when present but not an int64.
 */
cerb_status cerb__etcd_get_i64(const json_t *obj, const char *name, int64_t *out);
/* Read bool field `name`; absent = false. CERB_EPROTO for another type. */
cerb_status cerb__etcd_get_bool(const json_t *obj, const char *name, bool *out);

/* A lock key's value as the fence offset it was put with (decimal, below
 * 2^48; etcd_fence.c): false when it holds none (a key not put by the
 * engine's acquire txn, e.g. etcdctl's). */
bool cerb__etcd_fence_parse(const char *s, size_t n, int64_t *out);

/* ---- request builders ---- */

/* Sort orders and targets, spelled as the gateway's enum names. */
#define ETCD_SORT_ASCEND "ASCEND"
#define ETCD_SORT_DESCEND "DESCEND"
#define ETCD_TARGET_CREATE "CREATE"
#define ETCD_TARGET_MOD "MOD"
#define ETCD_TARGET_VERSION "VERSION"

/* A RangeRequest. `end` NULL = one key; 0-valued numbers are left out. */
struct etcd_range_req {
    const char *key;
    size_t key_len;
    const char *end;
    size_t end_len;
    int64_t limit;
    const char *sort_order;  /* NULL, ETCD_SORT_ASCEND or _DESCEND */
    const char *sort_target; /* NULL (KEY) or ETCD_TARGET_CREATE */
    int64_t max_create_revision;
    int64_t revision;        /* read as of this revision; 0 = now */
    bool keys_only;
    bool count_only;
};

json_t *cerb__etcd_range_json(const struct etcd_range_req *r);
/* Txn operations: {"request_range": ...}, {"request_put": {key, value,
 * lease}} (an empty value and lease 0 are left out: value may be NULL),
 * {"request_delete_range": {key}}. */
json_t *cerb__etcd_op_range(const struct etcd_range_req *r);
json_t *cerb__etcd_op_put(const char *key, size_t key_len, const char *value, size_t value_len,
                          int64_t lease);
json_t *cerb__etcd_op_delete(const char *key, size_t key_len);
/* A Compare on create_revision of key (or of every key in [key, end) when
 * end is not NULL): `result` is "EQUAL", "GREATER", "LESS" or "NOT_EQUAL". */
json_t *cerb__etcd_cmp_create(const char *key, size_t key_len, const char *end, size_t end_len,
                              const char *result, int64_t rev);
/* A Compare on one key's ETCD_TARGET_MOD (mod_revision) or
 * ETCD_TARGET_VERSION (version); a missing key compares as 0. */
json_t *cerb__etcd_cmp_key(const char *key, size_t key_len, const char *target,
                           const char *result, int64_t v);
/* A Compare on one key's value: value(key) `result` value[0..n). A missing
 * key compares as an empty value. */
json_t *cerb__etcd_cmp_value(const char *key, size_t key_len, const char *result,
                             const void *value, size_t n);
/* A TxnRequest; each argument is an array or NULL (left out); all stolen. */
json_t *cerb__etcd_txn(json_t *compare, json_t *success, json_t *failure);
/* Arrays of 1 or 2 elements (stolen; b may be NULL for one). */
json_t *cerb__etcd_list(json_t *a, json_t *b);

/*
 * The end of the prefix range for `p[0..n)`: p with its last byte that is
 * not 0xff incremented and what follows it dropped (clientv3's
 * GetPrefixRangeEnd). Writes at most max(n, 1) bytes to out; a prefix of
 * only 0xff bytes gives the single byte "\0", which etcd reads as "to the
 * end of the keyspace".
 */
void cerb__etcd_prefix_end(const char *p, size_t n, char *out, size_t *out_n);

/* ---- response parsers ---- */

/* One key-value. `key` and `value` (NULL when the answer has none: empty,
 * or keys_only) are decoded, NUL-terminated and cerb__malloc'd (free with
 * cerb__etcd_kv_clear). */
struct etcd_kv {
    char *key;
    size_t key_len;
    char *value;
    size_t value_len;
    int64_t create_revision, mod_revision, version, lease;
};
void cerb__etcd_kv_clear(struct etcd_kv *kv);

/* A RangeResponse, first kv only (locks ask for limit 1). */
struct etcd_range_res {
    int64_t count;     /* keys in the range (the gateway omits 0) */
    size_t n_kvs;      /* kvs returned */
    struct etcd_kv first; /* valid when n_kvs > 0 */
};
/* Parse a RangeResponse object. CERB_OK, CERB_EPROTO, CERB_ENOMEM. Clear
 * out->first afterwards. */
cerb_status cerb__etcd_parse_range(const json_t *rr, struct etcd_range_res *out);

/* The revision in `obj`.header.revision (0 when absent). */
cerb_status cerb__etcd_header_rev(const json_t *obj, int64_t *rev);

/*
 * A TxnResponse: succeeded (absent = false), the header revision and the
 * responses array (borrowed, may be empty). `want` > 0 checks that exactly
 * that many responses came back.
 */
cerb_status cerb__etcd_parse_txn(const json_t *resp, size_t want, bool *succeeded, int64_t *rev,
                                 const json_t **responses);
/* responses[i] unwrapped: the "response_range" object, or NULL if it is
 * not one. */
const json_t *cerb__etcd_txn_range(const json_t *responses, size_t i);

/* The error body {"error","message","code"} of a failed call, or the
 * in-band {"error": {"grpc_code"|"code", "message"}} of a stream. */
struct etcd_error_body {
    int code;          /* gRPC code; -1 when the text is not such a body */
    char message[256];
};
void cerb__etcd_parse_error(const char *body, size_t len, struct etcd_error_body *out);
/* The same on a parsed object; false when it is not an error object. */
bool cerb__etcd_error_of(const json_t *root, struct etcd_error_body *out);

/* One line of a watch stream. */
struct etcd_watch_msg {
    bool is_error;           /* in-band {"error": ...}: code/message below */
    int code;
    char message[256];
    bool created, canceled;
    int64_t header_rev;
    int64_t compact_revision; /* canceled because start_revision was compacted */
    char cancel_reason[256];
    int n_events;
    int n_delete;            /* DELETE events (a PUT has no "type": zero value) */
};
/* Parse one newline-delimited message. CERB_EPROTO for a line that is not
 * a watch message. */
cerb_status cerb__etcd_parse_watch_line(const char *line, size_t len, struct etcd_watch_msg *m);

/* The keys of the DELETE events of one watch-stream line: fn(ud, key,
 * len) for each, in order (the key is decoded; borrowed for the call).
 * CERB_EPROTO for a line that is not a watch message, CERB_ENOMEM. */
cerb_status cerb__etcd_watch_line_deletes(const char *line, size_t len,
                                          void (*fn)(void *ud, const char *key, size_t n),
                                          void *ud);

/* Each kv of a RangeResponse, decoded (key and value as in struct etcd_kv,
 * borrowed for the call: fn must copy what it keeps); fn returns false to
 * stop with CERB_ENOMEM. CERB_EPROTO for an answer that is not one. */
cerb_status cerb__etcd_range_each(const json_t *rr,
                                  bool (*fn)(void *ud, const struct etcd_kv *kv), void *ud);

/* A lease keepalive answer (the "result" object): ID and TTL; a TTL absent
 * or 0 means the lease is gone. */
cerb_status cerb__etcd_parse_keepalive(const json_t *result, int64_t *id, int64_t *ttl);

#endif
