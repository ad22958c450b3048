/*
 * etcd_engine.c — the "etcd" engine table, and the glue that opens and
 * closes an instance, probes it and reports its counters.
 *
 * The engine speaks etcd's concurrency.Mutex layout over the v3 JSON
 * gateway (HTTP/1.1 + JSON, libcurl + jansson), so `etcdctl lock NAME` and a
 * Cerberus lock on the same name exclude each other. Where the work is done:
 *   etcd_http.c    handles, endpoints (sticky, rotated on failure), auth,
 *                  the unary request and its retry rules
 *   etcd_errors.c  curl / HTTP / gRPC failures to cerb_status
 *   etcd_json.c    request builders, answer parsers, base64
 *   etcd_lease.c   the session lease, its keepalive thread, orphan keys
 *   etcd_mutex.c   acquire (and trylock), waiting, renew, release, check
 *   etcd_fence.c   the fence offset added to create revisions (floors)
 *   etcd_closure.c the switch closure record that acquire checks
 *   etcd_watch.c   the waiter's watch on its predecessor; cancel
 *   etcd_guard.c   the idempotency guard's records and their leases
 *   etcd_queue.c   semaphore and read-write lock members: acquire, wait,
 *                  release, check, inspect (tables: etcd_semaphore.c, with
 *                  the stored limit, and etcd_rwlock.c)
 * open() authenticates (when a user is set), reads under the prefix (a
 * lease grant needs no credentials, a read does) and grants the session
 * lease, all within the connect + operation timeouts, so unreachable
 * endpoints, something that is not the v3 gateway, or missing or bad
 * credentials fail open() with a message naming the endpoint.
 */
#include "internal_posix.h"

#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "log.h"

/* Longest etcd.prefix accepted: keys stay small, and a hold never needs
 * more than a stack buffer or one allocation per request. */
#define ETCD_PREFIX_MAX 1024

static void etcd_close(cerb_engine *e)
{
    if (!e)
        return;
    cerb__etcd_session_stop(e);
    cerb__etcd_guard_destroy(e);
    cerb__etcd_http_destroy(&e->http);
    cerb__etcd_fence_destroy(e);
    cerb__etcd_closure_destroy(e);
    cerb__mutex_destroy(&e->wait_mu);
    cerb__free(e);
}

/*
 * etcd before 3.4.28 / 3.5.11 has a leader that, paused (a stalled disk, a
 * stopped process) and then resumed after the others elected a new one,
 * revokes the leases it thinks have expired and forwards the revocation to
 * the new leader (etcd#12528, #15247, fixed by #16822): keys whose session
 * was kept alive all along vanish, and a waiter is granted while the holder
 * still believes it holds — nothing a client can prevent (the chaos suite's
 * etcd3-oldleader scenario shows it on Debian's 3.4.23). Said at open, with
 * the version, at info level (a `cerberus run` in cron prints nothing on
 * success; the README says it too); an answer we cannot read says nothing.
 */
static void warn_old_server(cerb_engine *e, int64_t deadline)
{
    struct etcd_call call = {.what = "version", .path = "/version", .deadline_ns = deadline,
                             .idempotent = true};
    if (cerb__etcd_call(e, &call) != CERB_OK)
        return;
    const char *v = json_string_value(json_object_get(call.resp, "etcdserver"));
    int maj = 0, min = 0, pat = 0;
    if (v && sscanf(v, "%d.%d.%d", &maj, &min, &pat) == 3 &&
        (maj < 3 || (maj == 3 && (min < 4 || (min == 4 && pat < 28) || (min == 5 && pat < 11)))))
        CERB_LOG_I("etcd %s: server %s revokes live sessions' leases when a paused leader "
                   "resumes (etcd#15247, fixed in 3.4.28 and 3.5.11): a lock can then be "
                   "granted while its holder still holds it; upgrade the server",
                   cerb__etcd_endpoint(&e->http), v);
    json_decref(call.resp);
}

static cerb_status etcd_open(const cerb_engine_env *env, cerb_engine **out)
{
    cerb_engine *e;
    cerb_status st;

    *out = NULL;
    if (!env || !env->cfg)
        return cerb__error_set(CERB_EINVAL, "etcd: no configuration");
    const struct cerb_etcd_config *ec = &env->cfg->etcd;
    if (ec->n_endpoints == 0)
        return cerb__error_set(CERB_ECONFIG, "etcd: no endpoints configured");
    if (ec->prefix && strlen(ec->prefix) > ETCD_PREFIX_MAX)
        return cerb__error_set(CERB_ECONFIG, "etcd: prefix longer than %d bytes",
                               ETCD_PREFIX_MAX);
    e = cerb__calloc(1, sizeof *e);
    if (!e)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    e->cfg = env->cfg;
    e->ec = ec;
    e->env = *env;
    st = cerb__etcd_http_init(&e->http, ec);
    if (st != CERB_OK) {
        cerb__free(e);
        return st;
    }
    cerb__mutex_init(&e->wait_mu);
    cerb__etcd_session_init(e);
    st = cerb__etcd_fence_init(e);
    if (st == CERB_OK)
        st = cerb__etcd_closure_init(e);
    if (st == CERB_OK)
        st = cerb__etcd_guard_init(e);
    if (st != CERB_OK) {
        etcd_close(e);
        return st;
    }
    /* Authenticate, then read under the prefix (which is what fails when
     * the server wants credentials we lack: a lease grant needs none),
     * then the session. */
    int64_t deadline = cerb__deadline_in(ec->connect_timeout_ms + ec->op_timeout_ms);
    st = cerb__etcd_authenticate(e, deadline, atomic_load(&e->http.auth_gen));
    if (st == CERB_OK)
        st = cerb__etcd_probe_read(e, deadline);
    if (st == CERB_OK)
        st = cerb__etcd_session_start(e, deadline);
    if (st != CERB_OK) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        etcd_close(e);
        return cerb__error_set(st, "%s", why);
    }
    warn_old_server(e, cerb__deadline_in(ec->op_timeout_ms));
    CERB_LOG_D("etcd %s: engine open (%zu endpoints, lease %llx, TTL %llds)",
               cerb__etcd_endpoint(&e->http), e->http.n_ep, (unsigned long long)e->sess.id,
               (long long)e->ttl_s);
    *out = e;
    return CERB_OK;
}

/*
 * The probe is a linearizable range of one key under the prefix (nothing
 * is ever stored there; count only): it needs a member that answers, that
 * has a leader (`Grpc-Metadata-hasleader`) and that can confirm it with a
 * quorum (ReadIndex) — what a lock needs — tried over the endpoints within
 * timeout_ms. Not GET /health: etcd 3.4 answers it with a quorum *write*
 * (a v2 QGET through raft, fsync included), which the prober would send
 * several times a second per client. It acquires nothing, so a closure
 * record never refuses it: a closed engine still probes healthy, as it
 * must for the clients that still hold locks there.
 */
static cerb_status etcd_probe(cerb_engine *e, int64_t timeout_ms)
{
    return cerb__etcd_probe_read(e, cerb__deadline_in(timeout_ms));
}

cerb_status cerb__etcd_probe_read(cerb_engine *e, int64_t deadline_ns)
{
    static const char probe_key[] = "__cerberus_probe__";
    size_t pl = e->ec->prefix ? strlen(e->ec->prefix) : 0;
    char *key = cerb__malloc(pl + sizeof probe_key);
    if (!key)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    memcpy(key, e->ec->prefix, pl);
    memcpy(key + pl, probe_key, sizeof probe_key);
    json_t *req = json_pack("{s:o, s:b}", "key", cerb__etcd_json_bytes(key, strlen(key)),
                            "count_only", 1);
    cerb__free(key);
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    struct etcd_call call = {.what = "probe",
                             .path = "/v3/kv/range",
                             .body = req,
                             .deadline_ns = deadline_ns,
                             .idempotent = true};
    cerb_status st = cerb__etcd_call(e, &call);
    json_decref(req);
    if (st == CERB_OK)
        json_decref(call.resp);
    return st;
}

/*
 * Is `name` held by anyone (the safe-switch question)? A linearizable
 * count of the keys under "<prefix><name>/": a holder or any queued
 * contender (ours, etcdctl's) answers BUSY, none OK. One round trip,
 * bounded by the operation timeout. Counting waiters is what the closure
 * record needs (engine.h, version 4): a key queued before the record was
 * stored can still become the holder without another write, so "free"
 * must mean that no such key exists; once the record is stored no key of a
 * refused epoch can be added, so a "free" answered after it stays true for
 * those clients.
 */
static cerb_status etcd_held(cerb_engine *e, const char *name)
{
    struct etcd_key k;
    cerb_status st = cerb__etcd_key_init(&k, e->ec->prefix, name, 0);
    if (st != CERB_OK)
        return st;
    struct etcd_range_req rq = {.key = k.k, .key_len = k.pfx_len, .end = k.end,
                                .end_len = strlen(k.end), .count_only = true};
    json_t *req = cerb__etcd_range_json(&rq);
    cerb__etcd_key_free(&k);
    if (!req)
        return cerb__error_set(CERB_ENOMEM, "etcd: out of memory");
    struct etcd_call call = {.what = "held",
                             .path = "/v3/kv/range",
                             .body = req,
                             .deadline_ns = cerb__deadline_in(e->ec->op_timeout_ms),
                             .idempotent = true};
    st = cerb__etcd_call(e, &call);
    json_decref(req);
    if (st != CERB_OK)
        return st;
    struct etcd_range_res rr;
    st = cerb__etcd_parse_range(call.resp, &rr);
    json_decref(call.resp);
    if (st != CERB_OK)
        return st;
    cerb__etcd_kv_clear(&rr.first);
    if (rr.count > 0)
        return cerb__error_set(CERB_BUSY, "etcd: \"%s\" is held (%lld keys)", name,
                               (long long)rr.count);
    return CERB_OK;
}

static void etcd_stats(cerb_engine *e, struct cerb_engine_stats *out)
{
    out->acquire_calls = atomic_load_explicit(&e->stats.acquire_calls, memory_order_relaxed);
    out->wakeups = atomic_load_explicit(&e->stats.wakeups, memory_order_relaxed);
    out->handoffs = 0; /* a release only deletes; the next waiter takes it */
}

/*
 * A name is the key prefix "<name>/": a name with a '/' would put its keys
 * under another name's prefix ("a/b/<lease>" is under "a/"), and the lock
 * "a" would then queue behind holders of "a/b".
 */
static cerb_status etcd_check_name(const char *name)
{
    if (strchr(name, '/'))
        return cerb__error_set(CERB_EINVAL,
                               "etcd lock names cannot contain '/': the lock \"%s\" would share "
                               "its key prefix with another lock",
                               name);
    return CERB_OK;
}

const struct cerb_engine_ops cerb__etcd_engine_ops = {
    .version = CERB_ENGINE_OPS_V5,
    .name = "etcd",
    .caps = CERB_CAP_FENCING | CERB_CAP_FAIR_QUEUE | CERB_CAP_WAIT | CERB_CAP_CROSS_PROCESS |
            CERB_CAP_FENCE_FLOOR,
    .lock_priv_size = sizeof(struct etcd_lock_priv),
    .open = etcd_open,
    .close = etcd_close,
    .acquire = cerb__etcd_op_acquire,
    .renew = cerb__etcd_op_renew,
    .release = cerb__etcd_op_release,
    .check_owner = cerb__etcd_op_check,
    .cancel = cerb__etcd_op_cancel,
    .probe = etcd_probe,
    .held = etcd_held,
    .stats = etcd_stats,
    .check_name = etcd_check_name,
    .hold_bound_ms = cerb__etcd_hold_bound,
    .guard_begin = cerb__etcd_guard_begin,
    .guard_renew = cerb__etcd_guard_renew,
    .guard_finish = cerb__etcd_guard_finish,
    .guard_check = cerb__etcd_guard_check,
    /* version 3: inspection (etcd_inspect.c) */
    .inspect = cerb__etcd_op_inspect,
    /* version 4: switch closure records (etcd_closure.c) */
    .closure_get = cerb__etcd_op_closure_get,
    .closure_put = cerb__etcd_op_closure_put,
    /* version 5: leader election in etcdctl elect's layout (etcd_election.c) */
    .election = &cerb__etcd_election,
    /* semaphores and read-write locks (etcd_queue.c, etcd_semaphore.c,
     * etcd_rwlock.c) */
    .semaphore = &cerb__etcd_semaphore,
    .rwlock = &cerb__etcd_rwlock,
};
