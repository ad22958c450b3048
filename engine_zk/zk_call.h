/*
 * zk_call.h — asynchronous ZooKeeper requests sent back to back and waited
 * for together.
 *
 * A call is a small batch: the caller submits one or more requests on one
 * session (zoo_a* functions return at once; the C client sends them from the
 * calling thread), then waits until every completion has run. The server
 * answers a session's requests in order, so a create and a getChildren
 * submitted together cost one round trip, and the listing already contains
 * the node just created.
 *
 * Completions run on the C client's single completion thread and must not
 * block: each one stores its result in its slot, counts down, and signals
 * the call's condition variable. A call is reference-counted (the caller
 * plus one per request in flight), so a caller that stops waiting at its
 * deadline (cerb__zk_call_put without a finished wait) leaves the call to
 * be freed by the last completion; the C client runs every completion
 * exactly once, with ZCLOSING at the latest when the handle is closed.
 *
 * A completion that carries a server answer proves the session was alive
 * when the batch was sent: it raises the session's last_ok_ns to the
 * batch's send time, which is what renew() reports (zk_session.h).
 */
#ifndef CERB_ZK_CALL_H
#define CERB_ZK_CALL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zookeeper/zookeeper.h>

#include "sync.h"
#include "zk_layout.h"

struct zk_session;

enum zk_req {
    ZK_REQ_CREATE,   /* zoo_acreate2: path + stat of the new node */
    ZK_REQ_CHILDREN, /* zoo_aget_children: analysed at once (zk_children) */
    ZK_REQ_EXISTS,   /* zoo_aexists: stat */
    ZK_REQ_DELETE,   /* zoo_adelete, any version */
    ZK_REQ_WGET,     /* zoo_awget: arms a data watch; its data is kept */
    ZK_REQ_WCHILDREN, /* zoo_awget_children: arms a child watch */
    ZK_REQ_SET,      /* zoo_aset; on_done sees the answer */
    ZK_REQ_GET,      /* zoo_aget, no watch: data and stat */
    ZK_REQ_LOCK_MULTI, /* zoo_amulti: check(s) + create + setData (below) */
    ZK_REQ_GETDATA,  /* zoo_aget, no watch: the whole data (buf) and stat */
    ZK_REQ_LIST,     /* zoo_aget_children: the names, copied (names) */
    ZK_REQ_MULTI,    /* zoo_amulti of up to ZK_GMULTI_MAX given ops (gm) */
    ZK_REQ_SYNC      /* zoo_async: the server catches up with the leader */
};

/* The most operations one generic transaction (the guard's) carries. */
#define ZK_GMULTI_MAX 4

/* A generic transaction's per-operation results (err, in op order; err
 * is CERB_ZK_RC_ABANDONED until the server answered). Owned by its slot. */
struct zk_gmulti {
    int n;
    zoo_op_result_t res[ZK_GMULTI_MAX];
};

/* The operations of a LOCK_MULTI, in the order they are sent; the closure
 * check is left out for an acquisition without an epoch, so an operation's
 * result is found through cerb__zk_multi_err(). The closure check comes
 * before the create: a create refused for a missing parent would otherwise
 * hide a changed record, and the parents would be made for nothing. */
enum { ZK_MULTI_CHECK, ZK_MULTI_CLOSURE, ZK_MULTI_CREATE, ZK_MULTI_TOUCH, ZK_MULTI_OPS };

/* One request's result. Valid to read once the call is finished. */
struct zk_session;
/* After zookeeper_close() returned (no completion can run any more): finish
 * every slot of s that was sent and never completed, with ZCLOSING. */
void cerb__zk_session_drop_outstanding(struct zk_session *s);

struct zk_res {
    struct zk_call *call;
    struct zk_res *onext, *oprev; /* the session's sent, unanswered slots */
    bool listed;
    bool done_early;     /* completed before it could be listed */
    enum zk_req kind;
    int rc;              /* ZOK, a ZooKeeper code, or CERB_ZK_RC_* */
    bool sent;           /* accepted by the client: a completion came */
    bool has_stat;
    struct Stat stat;    /* CREATE, EXISTS, WGET, GET, SET when rc == ZOK */
    char *path;          /* CREATE, LOCK_MULTI: the node's full path (owned) */
    char data[24];       /* WGET, GET: the first bytes of the node's data */
    int data_len;        /* WGET, GET: its full length (-1: none) */
    /* LOCK_MULTI: each operation's result (err is CERB_ZK_RC_ABANDONED
     * until the server answered), and the zxid of the transaction — the
     * created node's czxid — when rc == ZOK. What the client writes into
     * (mres, the path buffer, the stat) is the call's: the answer may come
     * after the caller stopped waiting. */
    zoo_op_result_t mres[ZK_MULTI_OPS];
    signed char mpos[ZK_MULTI_OPS]; /* each operation's place in mres, -1
                                       when not sent */
    char *mpath;
    struct Stat mstat;
    int64_t zxid;
    /* GETDATA: a copy of the node's whole data with a NUL after it
     * (owned; NULL when the node has none), its length in data_len.
     * LIST, WCHILDREN: copies of the children's names (owned), n_names of them.
     * MULTI: the operations' results (owned). */
    char *buf;
    char **names;
    int n_names;
    struct zk_gmulti *gm;
    /* WGET, WCHILDREN: run on the completion thread before the call
     * counts it done, in order with the session's watch events. */
    void (*on_done)(struct zk_res *r);
    void *owner;
    uint64_t owner_id;
    /* CHILDREN: who we are (our name, or the CREATE slot naming us, or
     * neither) and whose uuid to collect, both copied (owned): the answer
     * may outlive the caller's strings; the analysis of the listing. */
    int self_from;
    char *self;
    char *uuid;
    const char *mark;    /* CHILDREN: the layout's mark (a constant) */
    struct zk_children kids;
};

struct zk_call {
    cerb_mutex mu;
    cerb_cond cond;
    atomic_int refs;
    int pending;               /* submitted, completion not yet run */
    int64_t sent_ns;           /* monotonic time before the first submit */
    struct zk_session *sess;   /* where the requests went */
    size_t n, used;
    struct zk_res res[];
};

/* A call with room for n requests; NULL on out of memory. */
struct zk_call *cerb__zk_call_new(size_t n);

/*
 * Submit one request on session s (whose handle the caller keeps open for
 * the duration of the submit: zk_session.h, cerb__zk_session_begin).
 * Returns the slot index; when the client refuses the request its slot is
 * finished at once with the refusal code (sent = false). What a completion
 * reads is the call's own (children: copies of self and uuid; out of
 * memory finishes the slot with CERB_ZK_RC_NOMEM), so a caller may free
 * its strings as soon as the submit returns, even if it stops waiting.
 */
int cerb__zk_call_create(struct zk_call *c, struct zk_session *s, const char *path,
                         const char *data, const struct ACL_vector *acl, int mode);
int cerb__zk_call_children(struct zk_call *c, struct zk_session *s, const char *path,
                           int self_from, const char *self, const char *uuid);
/* The same, the listing ordered by `mark` (ZK_LOCK_MARK or ZK_LATCH_MARK,
 * a string constant: it is not copied). */
int cerb__zk_call_children_mark(struct zk_call *c, struct zk_session *s, const char *path,
                                int self_from, const char *self, const char *uuid,
                                const char *mark);
int cerb__zk_call_exists(struct zk_call *c, struct zk_session *s, const char *path);
int cerb__zk_call_delete(struct zk_call *c, struct zk_session *s, const char *path);
int cerb__zk_call_wget(struct zk_call *c, struct zk_session *s, const char *path,
                       watcher_fn watcher, void *watcher_ctx, void (*on_done)(struct zk_res *),
                       void *owner, uint64_t owner_id);
/* Write `data` if the node's version is `version` (-1: any). on_done (may
 * be NULL) runs on the completion thread with the answer. */
int cerb__zk_call_set(struct zk_call *c, struct zk_session *s, const char *path,
                      const char *data, int version, void (*on_done)(struct zk_res *),
                      void *owner, uint64_t owner_id);
/* The same with `len` bytes of `data` (any bytes, 0 for empty data). */
int cerb__zk_call_set_bytes(struct zk_call *c, struct zk_session *s, const char *path,
                            const void *data, int len, int version,
                            void (*on_done)(struct zk_res *), void *owner, uint64_t owner_id);
/* Read a node's data (the first sizeof data bytes) and stat; no watch. */
int cerb__zk_call_get(struct zk_call *c, struct zk_session *s, const char *path);
/*
 * One transaction: check that `check_path` has version `check_version`,
 * and (closure_path non-NULL) that `closure_path` has `closure_version`,
 * create `prefix` (EPHEMERAL_SEQUENTIAL, `data_len` bytes of `data`; -1:
 * no data), and rewrite the data of
 * `touch_path` (any version, no data) only to learn the transaction's zxid
 * from its stat: the C client's multi has no create2, and that zxid is the
 * new node's czxid (zk_mutex.c: the fence). All or nothing; rc is the
 * first failing operation's code, cerb__zk_multi_err() tells which one.
 */
int cerb__zk_call_lock_multi(struct zk_call *c, struct zk_session *s, const char *check_path,
                             int check_version, const char *closure_path, int closure_version,
                             const char *prefix, const void *data, int data_len,
                             const struct ACL_vector *acl, const char *touch_path);
/* A finished LOCK_MULTI's result for operation `op` (ZK_MULTI_*): the
 * server's code, CERB_ZK_RC_ABANDONED when it did not answer, ZOK for an
 * operation that was not sent. */
int cerb__zk_multi_err(const struct zk_res *r, int op);
/* The whole data and stat of a node (GETDATA), no watch. */
int cerb__zk_call_getdata(struct zk_call *c, struct zk_session *s, const char *path);
/* The names of a node's children (LIST), every one kept (res.names), no
 * watch: the guard's sweep, and inspection, where the whole queue is the
 * answer. */
int cerb__zk_call_list(struct zk_call *c, struct zk_session *s, const char *path);
/*
 * One transaction of n (<= ZK_GMULTI_MAX) operations made with the
 * zoo_*_op_init functions. They must not ask for anything to be written
 * back later (create: no path buffer; set: no stat): the answer may come
 * after the caller stopped waiting. The ops are serialized before this
 * returns, so their paths and data may be freed then. rc is the first
 * failing operation's code; gm->res tells which.
 */
int cerb__zk_call_multi(struct zk_call *c, struct zk_session *s, const zoo_op_t *ops, int n);
/* A sync: the session's server applies everything the leader committed
 * before it, so reads sent after it on this session see writes made
 * through other sessions (ZooKeeper orders only one session's requests). */
int cerb__zk_call_sync(struct zk_call *c, struct zk_session *s, const char *path);
int cerb__zk_call_wchildren(struct zk_call *c, struct zk_session *s, const char *path,
                            watcher_fn watcher, void *watcher_ctx,
                            void (*on_done)(struct zk_res *), void *owner, uint64_t owner_id);

/* Wait until every submitted request is answered (true) or the deadline
 * passes (false). */
bool cerb__zk_call_wait(struct zk_call *c, int64_t deadline_ns);
/* Wait for c's answers within the engine's bound, then slot k's result
 * code: ZINVALIDSTATE when k < 0 (not submitted on this session),
 * CERB_ZK_RC_ABANDONED when no answer came in time. *sent says whether
 * slot k's request left. */
struct cerb_engine;
int cerb__zk_call_wait_rc(struct cerb_engine *e, struct zk_call *c, int k, int64_t bound_ns,
                          bool *sent);

/* Drop the caller's reference. Results are not to be read afterwards; a
 * call still in flight is freed by its last completion. NULL: no-op. */
void cerb__zk_call_put(struct zk_call *c);

#endif
