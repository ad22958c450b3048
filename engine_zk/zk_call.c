/*
 * zk_call.c — batches of asynchronous requests (see zk_call.h).
 *
 * Life of a call: cerb__zk_call_new() (one reference, the caller's) →
 * submits (each takes a reference and counts one pending completion before
 * the request can possibly complete; a request the client refuses is
 * finished in place) → cerb__zk_call_wait() → cerb__zk_call_put(). Every
 * completion finishes its slot under the call's mutex, signals (after the
 * unlock) when it was the last one, updates the session's last answered
 * send time, and drops its reference outside the mutex; whoever drops the last reference frees the
 * call and everything its slots own.
 */
#include "internal_posix.h"

#include "zk_call.h"

#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "zk_errors.h"
#include "zk_session.h"

struct zk_call *cerb__zk_call_new(size_t n)
{
    struct zk_call *c = cerb__calloc(1, sizeof *c + n * sizeof c->res[0]);
    if (!c)
        return NULL;
    cerb__mutex_init(&c->mu);
    cerb__cond_init(&c->cond);
    atomic_init(&c->refs, 1);
    c->n = n;
    return c;
}

static void call_free(struct zk_call *c)
{
    for (size_t i = 0; i < c->used; i++) {
        cerb__free(c->res[i].path);
        cerb__free(c->res[i].mpath);
        cerb__free(c->res[i].self);
        cerb__free(c->res[i].uuid);
        cerb__free(c->res[i].buf);
        for (int k = 0; k < c->res[i].n_names; k++)
            cerb__free(c->res[i].names[k]);
        cerb__free(c->res[i].names);
        cerb__free(c->res[i].gm);
        cerb__zk_children_clear(&c->res[i].kids);
    }
    cerb__cond_destroy(&c->cond);
    cerb__mutex_destroy(&c->mu);
    cerb__free(c);
}

void cerb__zk_call_put(struct zk_call *c)
{
    if (c && atomic_fetch_sub(&c->refs, 1) == 1)
        call_free(c);
}

/* Raise *slot to v if v is larger. */
static void atomic_max64(_Atomic int64_t *slot, int64_t v)
{
    int64_t cur = atomic_load(slot);
    while (cur < v && !atomic_compare_exchange_weak(slot, &cur, v))
        ;
}

/* Run by every completion: note the session alive (before the waiter can
 * see the answer, so a grant never reports an older send time), store rc,
 * count down, signal, let go. */
static void unlist(struct zk_res *r)
{
    struct zk_session *s = r->call->sess;
    if (!s)
        return;
    cerb__mutex_lock(&s->out_mu);
    if (!r->listed)
        r->done_early = true;
    if (r->listed) {
        if (r->oprev)
            r->oprev->onext = r->onext;
        else
            s->outstanding = r->onext;
        if (r->onext)
            r->onext->oprev = r->oprev;
        r->listed = false;
    }
    cerb__mutex_unlock(&s->out_mu);
}

static void finish(struct zk_res *r, int rc)
{
    struct zk_call *c = r->call;
    unlist(r);
    if (c->sess && cerb__zk_rc_is_answer(rc))
        atomic_max64(&c->sess->last_ok_ns, c->sent_ns);
    cerb__mutex_lock(&c->mu);
    r->rc = rc;
    bool last = --c->pending == 0;
    cerb__mutex_unlock(&c->mu);
    /* Signalled after the unlock, so the waiter does not wake only to block
     * on the mutex this thread still holds; our reference keeps c alive. */
    if (last)
        cerb__cond_broadcast(&c->cond);
    cerb__zk_call_put(c);
}

/* ---- completions (on the C client's completion thread) ---- */

static void create_done(int rc, const char *path, const struct Stat *stat, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    if (rc == ZOK && path) {
        r->path = cerb__strdup(path);
        if (!r->path)
            rc = CERB_ZK_RC_NOMEM;
    }
    if (rc == ZOK && stat) {
        r->stat = *stat;
        r->has_stat = true;
    }
    finish(r, rc);
}

static void children_done(int rc, const struct String_vector *v, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    if (rc == ZOK) {
        /* Our name: given, or from a create earlier in this batch, whose
         * completion ran before this one on this same thread. */
        const char *self = r->self;
        if (!self && r->self_from >= 0 && r->call->res[r->self_from].path)
            self = cerb__zk_basename(r->call->res[r->self_from].path);
        cerb__zk_children_analyze_mark(v, self, r->uuid, r->mark ? r->mark : ZK_LOCK_MARK,
                                       &r->kids);
        if (r->kids.oom)
            rc = CERB_ZK_RC_NOMEM;
    }
    finish(r, rc);
}

/* Copy the names of a listing into r (names, n_names); the new rc. */
static int copy_names(struct zk_res *r, int rc, const struct String_vector *v)
{
    if (rc == ZOK && v && v->count > 0) {
        r->names = cerb__calloc((size_t)v->count, sizeof *r->names);
        if (!r->names) {
            rc = CERB_ZK_RC_NOMEM;
        } else {
            for (int i = 0; i < v->count && rc == ZOK; i++) {
                r->names[i] = cerb__strdup(v->data[i]);
                if (!r->names[i])
                    rc = CERB_ZK_RC_NOMEM;
                else
                    r->n_names = i + 1;
            }
        }
    }
    return rc;
}

static void wchildren_done(int rc, const struct String_vector *v, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    /* The names too: a semaphore's waiter counts the leases and looks for
     * its own (zk_semaphore.c); a lock node has none. */
    rc = copy_names(r, rc, v);
    r->rc = rc;
    if (r->on_done)
        r->on_done(r);
    finish(r, rc);
}

static void stat_done(int rc, const struct Stat *stat, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    if (rc == ZOK && stat) {
        r->stat = *stat;
        r->has_stat = true;
    }
    finish(r, rc);
}

static void set_done(int rc, const struct Stat *stat, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    r->rc = rc;
    if (r->on_done)
        r->on_done(r);
    stat_done(rc, stat, data);
}

/* The multi's path buffer becomes the result's path; the zxid is the
 * setData's mzxid (the transaction's). */
static void multi_done(int rc, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    if (rc == ZOK) {
        r->path = r->mpath;
        r->mpath = NULL;
        r->zxid = r->mstat.mzxid;
        if (!r->path || !r->mres[r->mpos[ZK_MULTI_TOUCH]].stat)
            rc = CERB_ZK_RC_NOMEM; /* cannot happen: the client fills both */
    }
    finish(r, rc);
}

static void void_done(int rc, const void *data)
{
    finish((struct zk_res *)data, rc);
}

static void sync_done(int rc, const char *value, const void *data)
{
    (void)value;
    finish((struct zk_res *)data, rc);
}

static void data_done(int rc, const char *value, int len, const struct Stat *stat,
                      const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    r->data_len = rc == ZOK && value ? len : -1;
    if (r->data_len > 0)
        memcpy(r->data, value,
               (size_t)(len < (int)sizeof r->data ? len : (int)sizeof r->data));
    r->rc = rc;
    if (r->on_done)
        r->on_done(r);
    stat_done(rc, stat, data);
}

static void getdata_done(int rc, const char *value, int len, const struct Stat *stat,
                         const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    r->data_len = -1;
    if (rc == ZOK && value && len >= 0) {
        r->buf = cerb__malloc((size_t)len + 1);
        if (!r->buf) {
            rc = CERB_ZK_RC_NOMEM;
        } else {
            memcpy(r->buf, value, (size_t)len);
            r->buf[len] = '\0';
            r->data_len = len;
        }
    }
    stat_done(rc, stat, data);
}

static void list_done(int rc, const struct String_vector *v, const void *data)
{
    struct zk_res *r = (struct zk_res *)data;
    finish(r, copy_names(r, rc, v));
}

/* ---- submitting ---- */

/* Claim the next slot and count its completion as pending. */
static struct zk_res *slot_begin(struct zk_call *c, struct zk_session *s, enum zk_req kind)
{
    struct zk_res *r = &c->res[c->used++];
    r->call = c;
    r->kind = kind;
    r->self_from = -1;
    if (!c->sess) {
        c->sess = s;
        c->sent_ns = cerb_monotime();
    }
    atomic_fetch_add(&c->refs, 1);
    cerb__mutex_lock(&c->mu);
    c->pending++;
    cerb__mutex_unlock(&c->mu);
    return r;
}

/* After the zoo_a* call: a refusal finishes the slot here (no completion
 * will come). Returns the slot index. */
static int slot_end(struct zk_call *c, struct zk_res *r, int api_rc)
{
    if (api_rc == ZOK) {
        r->sent = true;
        struct zk_session *s = c->sess;
        cerb__mutex_lock(&s->out_mu);
        /* Unless its completion already ran (unlist found it unlisted):
         * then it is finished and must not be listed. */
        if (!r->done_early) {
            r->onext = s->outstanding;
            r->oprev = NULL;
            if (s->outstanding)
                s->outstanding->oprev = r;
            s->outstanding = r;
            r->listed = true;
        }
        cerb__mutex_unlock(&s->out_mu);
    } else {
        cerb__mutex_lock(&c->mu);
        r->rc = api_rc;
        c->pending--;
        cerb__mutex_unlock(&c->mu);
        atomic_fetch_sub(&c->refs, 1); /* the caller still holds one */
    }
    return (int)(r - c->res);
}

int cerb__zk_call_create(struct zk_call *c, struct zk_session *s, const char *path,
                         const char *data, const struct ACL_vector *acl, int mode)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_CREATE);
    int rc = zoo_acreate2(s->zh, path, data, data ? (int)strlen(data) : -1, acl, mode,
                          create_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_children(struct zk_call *c, struct zk_session *s, const char *path,
                           int self_from, const char *self, const char *uuid)
{
    return cerb__zk_call_children_mark(c, s, path, self_from, self, uuid, ZK_LOCK_MARK);
}

int cerb__zk_call_children_mark(struct zk_call *c, struct zk_session *s, const char *path,
                                int self_from, const char *self, const char *uuid,
                                const char *mark)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_CHILDREN);
    r->mark = mark;
    r->self_from = self_from;
    /* Copies: the answer may come after the caller gave up and freed
     * what it passed (a waiter past its deadline drops its node's name). */
    r->self = self ? cerb__strdup(self) : NULL;
    r->uuid = uuid ? cerb__strdup(uuid) : NULL;
    if ((self && !r->self) || (uuid && !r->uuid))
        return slot_end(c, r, CERB_ZK_RC_NOMEM); /* not sent */
    int rc = zoo_aget_children(s->zh, path, 0, children_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_exists(struct zk_call *c, struct zk_session *s, const char *path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_EXISTS);
    int rc = zoo_aexists(s->zh, path, 0, stat_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_sync(struct zk_call *c, struct zk_session *s, const char *path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_SYNC);
    int rc = zoo_async(s->zh, path, sync_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_delete(struct zk_call *c, struct zk_session *s, const char *path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_DELETE);
    int rc = zoo_adelete(s->zh, path, -1, void_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_wget(struct zk_call *c, struct zk_session *s, const char *path,
                       watcher_fn watcher, void *watcher_ctx, void (*on_done)(struct zk_res *),
                       void *owner, uint64_t owner_id)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_WGET);
    r->on_done = on_done;
    r->owner = owner;
    r->owner_id = owner_id;
    int rc = zoo_awget(s->zh, path, watcher, watcher_ctx, data_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_set(struct zk_call *c, struct zk_session *s, const char *path,
                      const char *data, int version, void (*on_done)(struct zk_res *),
                      void *owner, uint64_t owner_id)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_SET);
    r->on_done = on_done;
    r->owner = owner;
    r->owner_id = owner_id;
    int rc = zoo_aset(s->zh, path, data, (int)strlen(data), version, set_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_set_bytes(struct zk_call *c, struct zk_session *s, const char *path,
                            const void *data, int len, int version,
                            void (*on_done)(struct zk_res *), void *owner, uint64_t owner_id)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_SET);
    r->on_done = on_done;
    r->owner = owner;
    r->owner_id = owner_id;
    int rc = zoo_aset(s->zh, path, len > 0 ? data : "", len > 0 ? len : 0, version, set_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_get(struct zk_call *c, struct zk_session *s, const char *path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_GET);
    int rc = zoo_aget(s->zh, path, 0, data_done, r);
    return slot_end(c, r, rc);
}

/*
 * zoo_amulti on a handle that is already unrecoverable (its session
 * expired, or authentication failed) frees memory it never owned: it stops
 * preparing ops at the first that fails, then still frees each later op's
 * path from a request it never filled in, a stale pointer (in practice an
 * earlier op's path, the caller's, and more than once). Seen with
 * libzookeeper_mt 3.8; test_multi_on_expired_session. So such a handle is
 * answered here, as the library would answer it, without the call. Only
 * the client's I/O thread turns a handle unrecoverable, so one can still
 * turn during the call itself: a window of the microseconds the call takes
 * to prepare its ops, once per session's end.
 */
static int amulti(zhandle_t *zh, int n, const zoo_op_t *ops, zoo_op_result_t *res,
                  void_completion_t done, const void *data)
{
    if (zoo_state(zh) < 0) /* the library's own test for unrecoverable */
        return ZINVALIDSTATE;
    return zoo_amulti(zh, n, ops, res, done, data);
}

int cerb__zk_call_lock_multi(struct zk_call *c, struct zk_session *s, const char *check_path,
                             int check_version, const char *closure_path, int closure_version,
                             const char *prefix, const void *data, int data_len,
                             const struct ACL_vector *acl, const char *touch_path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_LOCK_MULTI);
    /* The server appends a 10-digit sequence. */
    size_t len = strlen(prefix) + 16;
    r->mpath = cerb__malloc(len);
    if (!r->mpath)
        return slot_end(c, r, ZMARSHALLINGERROR); /* not sent */
    for (int i = 0; i < ZK_MULTI_OPS; i++) {
        r->mres[i].err = CERB_ZK_RC_ABANDONED;
        r->mpos[i] = -1;
    }
    /* The ops are serialized by zoo_amulti itself; only the results, the
     * path buffer and the stat are written later. */
    zoo_op_t ops[ZK_MULTI_OPS];
    int n = 0;
    r->mpos[ZK_MULTI_CHECK] = (signed char)n;
    zoo_check_op_init(&ops[n++], check_path, check_version);
    if (closure_path) {
        r->mpos[ZK_MULTI_CLOSURE] = (signed char)n;
        zoo_check_op_init(&ops[n++], closure_path, closure_version);
    }
    r->mpos[ZK_MULTI_CREATE] = (signed char)n;
    zoo_create_op_init(&ops[n++], prefix, data_len >= 0 ? data : NULL, data_len, acl,
                       ZOO_EPHEMERAL_SEQUENTIAL, r->mpath, (int)len);
    r->mpos[ZK_MULTI_TOUCH] = (signed char)n;
    zoo_set_op_init(&ops[n++], touch_path, NULL, -1, -1, &r->mstat);
    int rc = amulti(s->zh, n, ops, r->mres, multi_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_multi_err(const struct zk_res *r, int op)
{
    return r->mpos[op] < 0 ? ZOK : r->mres[r->mpos[op]].err;
}

int cerb__zk_call_getdata(struct zk_call *c, struct zk_session *s, const char *path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_GETDATA);
    int rc = zoo_aget(s->zh, path, 0, getdata_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_list(struct zk_call *c, struct zk_session *s, const char *path)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_LIST);
    int rc = zoo_aget_children(s->zh, path, 0, list_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_multi(struct zk_call *c, struct zk_session *s, const zoo_op_t *ops, int n)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_MULTI);
    if (n < 1 || n > ZK_GMULTI_MAX)
        return slot_end(c, r, ZBADARGUMENTS); /* not sent */
    r->gm = cerb__calloc(1, sizeof *r->gm);
    if (!r->gm)
        return slot_end(c, r, ZMARSHALLINGERROR); /* not sent */
    r->gm->n = n;
    for (int i = 0; i < n; i++)
        r->gm->res[i].err = CERB_ZK_RC_ABANDONED;
    int rc = amulti(s->zh, n, ops, r->gm->res, void_done, r);
    return slot_end(c, r, rc);
}

int cerb__zk_call_wchildren(struct zk_call *c, struct zk_session *s, const char *path,
                            watcher_fn watcher, void *watcher_ctx,
                            void (*on_done)(struct zk_res *), void *owner, uint64_t owner_id)
{
    struct zk_res *r = slot_begin(c, s, ZK_REQ_WCHILDREN);
    r->on_done = on_done;
    r->owner = owner;
    r->owner_id = owner_id;
    int rc = zoo_awget_children(s->zh, path, watcher, watcher_ctx, wchildren_done, r);
    return slot_end(c, r, rc);
}

bool cerb__zk_call_wait(struct zk_call *c, int64_t deadline_ns)
{
    bool done;
    cerb__mutex_lock(&c->mu);
    while (c->pending > 0)
        if (cerb__cond_wait_until(&c->cond, &c->mu, deadline_ns))
            break;
    done = c->pending == 0;
    cerb__mutex_unlock(&c->mu);
    return done;
}

void cerb__zk_session_drop_outstanding(struct zk_session *s)
{
    cerb__mutex_lock(&s->out_mu);
    struct zk_res *r = s->outstanding;
    s->outstanding = NULL;
    for (struct zk_res *x = r; x; x = x->onext)
        x->listed = false;
    cerb__mutex_unlock(&s->out_mu);
    while (r) {
        struct zk_res *next = r->onext;
        finish(r, ZCLOSING); /* may free r's call */
        r = next;
    }
}

int cerb__zk_call_wait_rc(struct cerb_engine *e, struct zk_call *c, int k, int64_t bound_ns,
                          bool *sent)
{
    *sent = k >= 0 && c->res[k].sent;
    if (k < 0)
        return ZINVALIDSTATE; /* not this session any more */
    if (!cerb__zk_call_wait(c, cerb__zk_call_deadline(e, bound_ns)))
        return CERB_ZK_RC_ABANDONED;
    return c->res[k].rc;
}
