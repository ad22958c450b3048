/*
 * etcd_semaphore.c — the etcd engine's semaphores (ops->semaphore): the
 * table, and the stored limit the acquire txn checks (etcd_queue.c has
 * the members, their queue and its rule).
 *
 * Layout (docs/semaphore.md, "## etcd"). The members of semaphore NAME are
 * lease keys under Q = <prefix>NAME/, the prefix of `etcdctl lock NAME`,
 * ranked by create revision: Q<session lease hex> (a further member of the
 * same session: Q<lease hex>.<token>), value "<fence offset>" for one
 * permit — with a limit of 1 this is exactly etcdctl lock's layout, and a
 * Cerberus lock's — or "<fence offset>,<k>" for k permits. A member is
 * granted when the permits of the members ahead of it plus its own fit
 * the limit; a key without such a value (etcdctl's) is one permit.
 *
 * The limit. L = <prefix>NAME.limit holds it in decimal, without a lease:
 * a key with no '/' after the prefix is in no lock's range. The acquire
 * txn that puts a member compares it, in one of three ways:
 *   EQUAL   value(L) == our limit (the usual case, no extra request);
 *   CREATE  L absent (create_revision == 0): the txn puts L with ours;
 *   RESET   L holds another limit and the queue was empty when read: the
 *           txn compares L's mod revision and that the queue is still
 *           empty (create_revision over [Q, end(Q)) == 0), and puts ours.
 * The failure branch reads L and counts Q, so the next try knows which
 * way to go: another limit with members in the queue is refused with
 * CERB_ECONFIG naming both (grant->no_prim: final). So L only changes
 * while nobody is queued: every member in the queue was put under the
 * limit L holds (unless someone deletes L by hand while members exist:
 * then the next caller's limit is stored). L stays when the queue
 * drains (one small key per semaphore name, permanent: delete it to
 * forget the name); an empty queue takes the next caller's limit, as on
 * the local engine.
 */
#include "internal_posix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "etcd_internal.h"
#include "etcd_json.h"
#include "etcd_queue.h"

static size_t limit_text(int64_t limit, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%lld", (long long)limit);
    return k > 0 && (size_t)k < n ? (size_t)k : 0;
}

void cerb__etcd_qlimit_start(struct etcd_qlimit *l)
{
    l->mode = ETCD_QLIMIT_EQUAL;
    l->mod = 0;
}

int cerb__etcd_qlimit_cmp(cerb_engine *e, const cerb_engine_lock *lk,
                          const struct etcd_qkeys *qk, const struct etcd_qlimit *l, json_t *cmp)
{
    (void)e;
    char t[24];
    size_t tn = limit_text(lk->limit, t, sizeof t);
    switch (l->mode) {
    case ETCD_QLIMIT_EQUAL:
        return json_array_append_new(cmp, cerb__etcd_cmp_value(qk->lim, qk->lim_len, "EQUAL", t,
                                                               tn));
    case ETCD_QLIMIT_CREATE:
        return json_array_append_new(cmp, cerb__etcd_cmp_create(qk->lim, qk->lim_len, NULL, 0,
                                                                "EQUAL", 0));
    case ETCD_QLIMIT_RESET:
        if (json_array_append_new(cmp, cerb__etcd_cmp_key(qk->lim, qk->lim_len, ETCD_TARGET_MOD,
                                                          "EQUAL", l->mod)))
            return -1;
        return json_array_append_new(cmp, cerb__etcd_cmp_create(qk->q, qk->q_len, qk->q_end,
                                                                qk->q_end_len, "EQUAL", 0));
    }
    return -1;
}

int cerb__etcd_qlimit_put(const cerb_engine_lock *lk, const struct etcd_qkeys *qk,
                          const struct etcd_qlimit *l, json_t *succ)
{
    if (l->mode == ETCD_QLIMIT_EQUAL)
        return 0;
    char t[24];
    size_t tn = limit_text(lk->limit, t, sizeof t);
    return json_array_append_new(succ, cerb__etcd_op_put(qk->lim, qk->lim_len, t, tn, 0));
}

int cerb__etcd_qlimit_reads(const struct etcd_qkeys *qk, json_t *fail)
{
    struct etcd_range_req l = {.key = qk->lim, .key_len = qk->lim_len};
    struct etcd_range_req q = {.key = qk->q, .key_len = qk->q_len, .end = qk->q_end,
                               .end_len = qk->q_end_len, .count_only = true};
    if (json_array_append_new(fail, cerb__etcd_op_range(&l)))
        return -1;
    return json_array_append_new(fail, cerb__etcd_op_range(&q));
}

/* The decimal limit in value v[0..n); false when it is none. */
static bool parse_limit(const char *v, size_t n, int64_t *out)
{
    char buf[24];
    if (!v || n == 0 || n >= sizeof buf || v[0] < '0' || v[0] > '9')
        return false;
    memcpy(buf, v, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (*end || errno || x < 1)
        return false;
    *out = x;
    return true;
}

cerb_status cerb__etcd_qlimit_learn(cerb_engine *e, const cerb_engine_lock *lk,
                                    const json_t *responses, size_t at, struct etcd_qlimit *l,
                                    bool *changed)
{
    struct etcd_range_res lr = {0}, qr = {0};
    const json_t *a = cerb__etcd_txn_range(responses, at);
    const json_t *b = cerb__etcd_txn_range(responses, at + 1);
    *changed = false;
    if (!a || !b)
        return cerb__error_set(CERB_EPROTO, "etcd %s: queue txn: no limit read",
                               cerb__etcd_endpoint(&e->http));
    cerb_status st = cerb__etcd_parse_range(a, &lr);
    if (st == CERB_OK)
        st = cerb__etcd_parse_range(b, &qr);
    if (st != CERB_OK) {
        cerb__etcd_kv_clear(&lr.first);
        cerb__etcd_kv_clear(&qr.first);
        return st;
    }
    struct etcd_qlimit next = {ETCD_QLIMIT_EQUAL, 0};
    int64_t stored = 0;
    if (lr.n_kvs == 0) {
        next.mode = ETCD_QLIMIT_CREATE;
    } else if (parse_limit(lr.first.value, lr.first.value ? lr.first.value_len : 0, &stored) &&
               stored == lk->limit) {
        next.mode = ETCD_QLIMIT_EQUAL;
    } else if (qr.count == 0) {
        next.mode = ETCD_QLIMIT_RESET;
        next.mod = lr.first.mod_revision;
    } else {
        char shown[40];
        if (stored > 0)
            snprintf(shown, sizeof shown, "%lld", (long long)stored);
        else
            snprintf(shown, sizeof shown, "\"%.24s\"", lr.first.value ? lr.first.value : "");
        st = cerb__error_set(CERB_ECONFIG,
                             "semaphore \"%s\": etcd %s has a limit of %s stored (key %s), "
                             "this caller asks %lld",
                             lk->name, cerb__etcd_endpoint(&e->http), shown, lr.first.key,
                             (long long)lk->limit);
    }
    if (st == CERB_OK) {
        *changed = next.mode != l->mode || next.mod != l->mod;
        *l = next;
    }
    cerb__etcd_kv_clear(&lr.first);
    cerb__etcd_kv_clear(&qr.first);
    return st;
}

cerb_status cerb__etcd_qlimit_parse(const json_t *range, int64_t *limit)
{
    struct etcd_range_res r = {0};
    *limit = 1;
    if (!range)
        return cerb__error_set(CERB_EPROTO, "etcd: the limit read is not a range");
    cerb_status st = cerb__etcd_parse_range(range, &r);
    if (st == CERB_OK && r.n_kvs > 0 &&
        !parse_limit(r.first.value, r.first.value ? r.first.value_len : 0, limit))
        *limit = 1;
    cerb__etcd_kv_clear(&r.first);
    return st;
}

static cerb_status sem_held(cerb_engine *e, const char *name)
{
    return cerb__etcd_queue_held(e, CERB_PRIM_SEMAPHORE, name);
}

static cerb_status sem_inspect(cerb_engine *e, const char *name, struct cerb_holders *out)
{
    return cerb__etcd_queue_inspect(e, CERB_PRIM_SEMAPHORE, name, out);
}

const struct cerb_queue_methods cerb__etcd_semaphore = {
    .version = CERB_QUEUE_METHODS_V1,
    .acquire = cerb__etcd_queue_acquire,
    .renew = cerb__etcd_op_renew, /* the session's keepalive, as the mutex */
    .release = cerb__etcd_queue_release,
    .check_owner = cerb__etcd_queue_check,
    .held = sem_held,
    .inspect = sem_inspect,
};
