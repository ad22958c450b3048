/*
 * etcd_inspect.c — inspect(): who holds a lock name on etcd and who waits
 * for it (cerb_lock_inspect, DESIGN.md §13), in the layout of etcd's
 * concurrency.Mutex (etcd_mutex.c), the one `etcdctl lock NAME` uses too,
 * through the engine's own gateway client (endpoints, rotation, TLS, auth
 * token: etcd_http.c).
 *
 * Every contender for NAME is one key P + <its session lease ID in hex>
 * under the prefix P = <etcd.prefix><NAME>/, attached to that lease. The key
 * with the lowest create revision holds the lock, the others wait in
 * create-revision order. So one range read of [P, end(P)) sorted by create
 * revision gives the holder and the queue at one revision; a second
 * request, /v3/lease/timetolive on the holder's lease, gives the time that
 * lease has left (whole seconds: that is what etcd keeps) and the TTL it
 * was granted, which is the holder's detail ("TTL 10 s"). The owner of an
 * entry is its key without the prefix: the contender's lease in hex. The
 * holder's create revision plus the fence offset its value holds
 * (etcd_fence.c; none in etcdctl's keys) is the engine's fencing counter,
 * the low 48 bits of the token the holder was given. A key without a lease
 * is held until someone deletes it ("no lease", ttl_ms -1); a lease the
 * server no longer knows is "lease expired" (the key goes with it).
 * Both reads are idempotent and bounded together by the operation timeout.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "etcd_internal.h"
#include "etcd_json.h"

/* The fence offset a Cerberus key was put with (its value), which its fence
 * adds to the create revision; 0 for a key without one (etcdctl's). */
static int64_t fence_offset(const json_t *kv)
{
    const char *b64 = json_string_value(json_object_get(kv, "value"));
    char *v = NULL;
    size_t n = 0;
    int64_t off = 0;

    if (b64 && cerb__etcd_b64_decode(b64, &v, &n) == CERB_OK && !cerb__etcd_fence_parse(v, n, &off))
        off = 0;
    cerb__free(v);
    return off;
}

/* The holder's lease: seconds left (-1 = the server no longer knows it) and
 * the TTL it was granted. */
static cerb_status lease_ttl(cerb_engine *e, int64_t lease, int64_t deadline, int64_t *ttl,
                             int64_t *granted)
{
    json_t *answer;
    cerb_status st = cerb__etcd_post(e, "inspect: lease time to live", "/v3/lease/timetolive",
                                     json_pack("{s:o}", "ID", cerb__etcd_json_i64(lease)),
                                     deadline, NULL, &answer);
    if (st != CERB_OK)
        return st;
    *ttl = -1;
    *granted = 0;
    if (cerb__etcd_get_i64(answer, "TTL", ttl) != CERB_OK ||
        cerb__etcd_get_i64(answer, "grantedTTL", granted) != CERB_OK)
        st = cerb__error_set(CERB_EPROTO, "etcd %s: lease time to live: unexpected answer",
                             cerb__etcd_endpoint(&e->http));
    json_decref(answer);
    return st;
}

cerb_status cerb__etcd_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    struct etcd_key k;
    int64_t deadline = cerb__deadline_in(e->ec->op_timeout_ms);
    cerb_status st = cerb__etcd_key_init(&k, e->ec->prefix, name, 0);
    if (st != CERB_OK)
        return st;
    struct etcd_range_req rq = {.key = k.k,
                                .key_len = k.pfx_len,
                                .end = k.end,
                                .end_len = strlen(k.end),
                                .sort_order = ETCD_SORT_ASCEND,
                                .sort_target = ETCD_TARGET_CREATE};
    json_t *answer;
    st = cerb__etcd_post(e, "inspect: range", "/v3/kv/range", cerb__etcd_range_json(&rq),
                         deadline, NULL, &answer);
    if (st != CERB_OK) {
        cerb__etcd_key_free(&k);
        return st;
    }
    const json_t *kvs = json_object_get(answer, "kvs");
    size_t n = json_is_array(kvs) ? json_array_size(kvs) : 0;
    for (size_t i = 0; st == CERB_OK && i < n; i++) {
        const json_t *kv = json_array_get(kvs, i);
        const char *b64 = json_string_value(json_object_get(kv, "key"));
        char *key = NULL, detail[64] = "";
        size_t kl = 0;
        int64_t lease = 0, rev = 0, ttl = -1, granted = 0;
        if (!b64 || cerb__etcd_b64_decode(b64, &key, &kl) != CERB_OK ||
            cerb__etcd_get_i64(kv, "lease", &lease) != CERB_OK ||
            cerb__etcd_get_i64(kv, "create_revision", &rev) != CERB_OK) {
            cerb__free(key);
            st = cerb__error_set(CERB_EPROTO, "etcd %s: inspect: range: unexpected answer",
                                 cerb__etcd_endpoint(&e->http));
            break;
        }
        uint64_t fence = 0;
        if (i == 0) { /* the holder: its lease and its fence */
            if (lease == 0) {
                snprintf(detail, sizeof detail, "no lease");
            } else {
                st = lease_ttl(e, lease, deadline, &ttl, &granted);
                if (st == CERB_OK && ttl >= 0)
                    snprintf(detail, sizeof detail, "TTL %" PRId64 " s", granted);
                else if (st == CERB_OK)
                    snprintf(detail, sizeof detail, "lease expired");
            }
            fence = (uint64_t)(rev + fence_offset(kv));
        }
        const char *owner = kl > k.pfx_len ? key + k.pfx_len : "";
        if (st == CERB_OK)
            st = cerb__holders_add(out, owner, kl > k.pfx_len ? kl - k.pfx_len : 0, i > 0, fence,
                                   ttl >= 0 ? ttl * 1000 : -1, detail);
        cerb__free(key);
    }
    json_decref(answer);
    cerb__etcd_key_free(&k);
    return st;
}
