/*
 * zk_guard_sweep.c — the zk guard's sweeper: the expiry of records on a
 * server that has none (zk_guard.c has the layout and the methods).
 *
 * Records that expire and are never asked for again are removed by a
 * sweeper thread per engine instance, started by the first begin. Its
 * passes come first at a random point of the first ZK_GUARD_SWEEP_MS, then
 * every ZK_GUARD_SWEEP_MS (± 20 %), and earlier once this client made
 * enough records to pay for (a client that lives a few seconds must still
 * delete about as many as it makes, or records pile up when clients come
 * and go).
 *
 * Listing. A pass that finds no fresh listing lists the base, takes up to
 * ZK_GUARD_SWEEP_SCOPES scopes (rotating), lists them, keeps a window of
 * each one's names from a random place (sweepers of other clients start
 * elsewhere), and deletes the scopes it found empty. The passes of the
 * next ZK_GUARD_SWEEP_MS read on from that window instead of listing
 * again: in a big scope of live records, listing it cost the server more
 * than the reads a pass then makes. A scope whose window runs out while
 * its records are still expiring, and which held more names than the
 * window, is listed again on its own (at once, or by the next pass when
 * the budget ran out with it), so a backlog bigger than the window is
 * cleared as fast as when every pass listed.
 *
 * Reading. Records are read in batches of ZK_GUARD_SWEEP_RECS, the
 * server's time read once a pass, and the expired ones deleted by version
 * with their token nodes: a probe of ZK_GUARD_SWEEP_PROBE per scope, then
 * batches while a quarter of the last had expired, up to a budget that
 * grows with the records this client made. So expired records do not pile
 * up, whatever the rate of begins. A batch costs two round trips (three
 * with tokenless records), a pass one more for the server's time, and a
 * listing two or three (one for a scope listed again); a pass rests half
 * as long as each batch took (sweep_pace), is skipped while disconnected
 * (its listing dropped), and close stops it between and during its waits.
 *
 * Deleting is judged as a begin judges a record it finds: by the server's
 * time against the record's mtime and life (cerb__zkg_expired_at), and
 * done by version with the token node, so a record renewed, finished or
 * taken over since it was read stays.
 */
#include "internal_posix.h"

#include "zk_guard_sweep.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "sync.h"
#include "zk_call.h"
#include "zk_guard.h"
#include "zk_guard_impl.h"
#include "zk_guard_pool.h"
#include "zk_session.h"

#define ZK_GUARD_SWEEP_MS 5000
#define ZK_GUARD_SWEEP_SCOPES 64
#define ZK_GUARD_SWEEP_RECS 128
/* A scope's first batch in a pass: a probe, since in a scope of live
 * records it finds nothing to delete (that read costs the client's begins
 * time; early passes come every ZK_GUARD_SWEEP_EARLY records made or
 * more). */
#define ZK_GUARD_SWEEP_PROBE 32
/* Records a pass may read at least (the budget); twice as many more as
 * this client made records since the last pass. A scope's reads stop
 * sooner when a batch finds few expired. */
#define ZK_GUARD_SWEEP_FLOOR 256
/* The first pass comes at a random point of the first ZK_GUARD_SWEEP_MS
 * after the first begin (clients started together, like cron jobs, do not
 * list together; a client that lives a second sweeps with a chance of one
 * in five, which over many such clients deletes far more than they make).
 * A pass comes early once this client made ZK_GUARD_SWEEP_EARLY records
 * since the last, or an eighth of the records the last listing found when
 * that is more, up to ZK_GUARD_SWEEP_EARLY_MAX: were every such pass to
 * list, listing would cost at most 8 names per record made until the
 * scopes hold 32 768 records, and past that a pass still comes every
 * 4 096 records made, since a
 * backlog that large is what needs clearing. A client that makes records
 * faster than the timer's passes pay for them, and lives a few seconds,
 * so still deletes about twice as many as it makes. */
#define ZK_GUARD_SWEEP_EARLY 1024
#define ZK_GUARD_SWEEP_EARLY_MAX 4096
#define ZK_GUARD_SWEEP_CREDIT_MAX ((size_t)1 << 22)
/* Names a listing keeps for the passes after it: at most
 * ZK_GUARD_SWEEP_WINDOW of a scope, and ZK_GUARD_SWEEP_CACHE in all (some
 * 6 MiB; a bigger scope is read a window at a time, one per listing). */
#define ZK_GUARD_SWEEP_WINDOW 8192
#define ZK_GUARD_SWEEP_CACHE 65536

/* A scope as the sweeper last listed it: a window of its records' names
 * from a random place, and how far the passes read. */
struct sweep_scope {
    char *path;
    char **names;
    size_t n, next;
    size_t total;  /* names the listing found: more than n, a window */
    bool relist;   /* its window ran out while records were expiring */
};

struct zk_sweeper {
    cerb_mutex mu;
    cerb_cond cond;    /* the sweeper's sleep; stop */
    bool started;      /* (mu) */
    atomic_bool stop;
    pthread_t thread;
    /* The sweeper thread's own. */
    size_t cursor;
    uint64_t rnd;
    size_t credit;              /* reads owed for records made */
    /* The last listing, read from by the passes that follow while it is
     * fresh (cache_fresh). */
    struct sweep_scope *cache;
    size_t n_cache;
    int64_t cache_ns;           /* monotonic, when it was listed */
    atomic_uint_fast64_t made;  /* records this client made since the last pass */
    atomic_uint_fast64_t early; /* made this many: the next pass now */
    atomic_uint_fast64_t passes, listings, relists; /* for tests */
    int64_t fresh_ms;           /* ZK_GUARD_SWEEP_MS; tests change it */
    size_t window;              /* ZK_GUARD_SWEEP_WINDOW; likewise */
};

struct zk_sweeper *cerb__zk_sweeper_new(void)
{
    struct zk_sweeper *sw = cerb__calloc(1, sizeof *sw);
    if (!sw)
        return NULL;
    cerb__mutex_init(&sw->mu);
    cerb__cond_init(&sw->cond);
    atomic_init(&sw->stop, false);
    atomic_init(&sw->made, 0);
    atomic_init(&sw->early, ZK_GUARD_SWEEP_EARLY);
    atomic_init(&sw->passes, 0);
    atomic_init(&sw->listings, 0);
    atomic_init(&sw->relists, 0);
    sw->rnd = (uint64_t)cerb_monotime() ^ (uint64_t)(uintptr_t)sw;
    sw->fresh_ms = ZK_GUARD_SWEEP_MS;
    sw->window = ZK_GUARD_SWEEP_WINDOW;
    return sw;
}

/* A record made: counted for the sweeper's budget, which is woken (once)
 * when the count reaches the early mark. */
void cerb__zk_sweeper_made(struct zk_sweeper *sw)
{
    uint64_t n = atomic_fetch_add_explicit(&sw->made, 1, memory_order_relaxed) + 1;
    if (n == atomic_load_explicit(&sw->early, memory_order_relaxed)) {
        cerb__mutex_lock(&sw->mu);
        cerb__cond_signal(&sw->cond);
        cerb__mutex_unlock(&sw->mu);
    }
}

/* A call of n requests made by `submit`, waited for; NULL when it could
 * not be sent or answered in time. */
static struct zk_call *sweep_call(cerb_engine *e, size_t n,
                                  void (*submit)(struct zk_call *, struct zk_session *, void *),
                                  void *ud)
{
    struct zk_call *c = cerb__zk_call_new(n ? n : 1);
    if (!c)
        return NULL;
    struct zk_session *s = cerb__zk_session_begin(e);
    if (s)
        submit(c, s, ud);
    cerb__zk_session_end(e);
    int64_t deadline = cerb__zk_call_deadline(e, cerb__zkg_bound(e));
    if (!s || !cerb__zkg_call_wait(c, deadline, &e->guard->sweeper->stop)) {
        cerb__zk_call_put(c);
        return NULL;
    }
    return c;
}

struct sweep {
    cerb_engine *e;
    char **paths;  /* scopes, then records */
    size_t n;
    const bool *del;
    char **toks;   /* token node paths of expired records */
    const int *vers;
};

static void submit_list(struct zk_call *c, struct zk_session *s, void *ud)
{
    struct sweep *w = ud;
    for (size_t i = 0; i < w->n; i++)
        cerb__zk_call_list(c, s, w->paths[i]);
}

static void submit_get(struct zk_call *c, struct zk_session *s, void *ud)
{
    struct sweep *w = ud;
    for (size_t i = 0; i < w->n; i++)
        cerb__zk_call_getdata(c, s, w->paths[i]);
}

static void submit_delete(struct zk_call *c, struct zk_session *s, void *ud)
{
    struct sweep *w = ud;
    for (size_t i = 0; i < w->n; i++) {
        if (!w->del[i])
            continue;
        zoo_op_t ops[2];
        if (!w->toks && !w->vers) {
            cerb__zk_call_delete(c, s, w->paths[i]); /* an empty scope */
            continue;
        }
        if (!w->toks) {
            zoo_delete_op_init(&ops[0], w->paths[i], w->vers[i]);
            cerb__zk_call_multi(c, s, ops, 1);
            continue;
        }
        zoo_delete_op_init(&ops[0], w->toks[i], -1);
        zoo_delete_op_init(&ops[1], w->paths[i], w->vers[i]);
        cerb__zk_call_multi(c, s, ops, 2);
    }
}

static void free_strs(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        cerb__free(v[i]);
    cerb__free(v);
}

static uint64_t next_rnd(struct zk_sweeper *sw)
{
    sw->rnd = sw->rnd * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
    return sw->rnd >> 33;
}

/* One batch of records (paths): read, then the expired ones deleted by
 * version with their token nodes. The server's time is read after the
 * first batch's reads, once a pass (*now_ms 0 until then): an earlier
 * reading is a lower bound for later batches, so it judges fewer records
 * expired, never more; one clock write a pass, not one a batch. Answers
 * how many went; *failed when a request was not answered or the server's
 * time could not be read, and *unread as well when that happened before
 * any delete was sent (the batch is then as if never read). */
static size_t sweep_records(cerb_engine *e, char **recs, size_t n_rec, int64_t *now_ms,
                            bool *failed, bool *unread)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    size_t n_gone = 0;
    *failed = *unread = true;
    if (n_rec && !atomic_load(&sw->stop)) {
        struct sweep w = {.e = e, .paths = recs, .n = n_rec};
        struct zk_call *c = sweep_call(e, n_rec, submit_get, &w);
        if (c && *now_ms == 0 && cerb__zkg_server_now(e, now_ms, &sw->stop) != CERB_OK)
            *now_ms = 0;
        int64_t now = *now_ms;
        if (c && now != 0) {
            *failed = *unread = false;
            bool *del = cerb__calloc(n_rec, sizeof *del);
            char **toks = cerb__calloc(n_rec, sizeof *toks);
            int *vers = cerb__calloc(n_rec, sizeof *vers);
            size_t n_del = 0;
            for (size_t i = 0; i < n_rec && del && toks && vers; i++) {
                const struct zk_res *r = &c->res[i];
                struct rec_view v;
                if (r->rc != ZOK || !cerb__zkg_rec_parse(r->buf, r->data_len, &v) ||
                    !cerb__zkg_expired_at(now, r->stat.mtime, v.life))
                    continue;
                toks[i] = cerb__zkg_path(recs[i], v.token, NULL);
                if (!toks[i])
                    continue;
                del[i] = true;
                vers[i] = r->stat.version;
                n_del++;
            }
            if (n_del) {
                w = (struct sweep){.e = e, .paths = recs, .n = n_rec, .del = del, .toks = toks,
                                   .vers = vers};
                struct zk_call *d = sweep_call(e, n_del, submit_delete, &w);
                /* A record without its token node (made by hand?) is
                 * deleted by its version alone. */
                size_t n_again = 0, j = 0;
                for (size_t i = 0; d && i < n_rec; i++) {
                    if (!del[i])
                        continue;
                    const struct zk_res *r = &d->res[j++];
                    n_gone += r->rc == ZOK;
                    del[i] = r->rc == ZNONODE && cerb__zkg_failed_op(r) == 0;
                    n_again += del[i];
                }
                bool answered = d != NULL;
                *failed = !answered;
                cerb__zk_call_put(d);
                if (answered && n_again && !atomic_load(&sw->stop)) {
                    w.toks = NULL;
                    struct zk_call *d2 = sweep_call(e, n_again, submit_delete, &w);
                    for (size_t i = 0; d2 && i < d2->used; i++)
                        n_gone += d2->res[i].rc == ZOK;
                    cerb__zk_call_put(d2);
                }
            }
            cerb__free(del);
            free_strs(toks, n_rec);
            cerb__free(vers);
        }
        cerb__zk_call_put(c);
    }
    return n_gone;
}

/* After a batch that took `took_ns`, rest half as long (at most a second;
 * close ends the rest): the sweeper's requests share the session, in order, with
 * every begin and finish of this client, so a sweeper that ran batch after
 * batch held them up (the guard bench's duplicates at 8 threads went from
 * 0.86 to 0.13 of the raw ceiling while a backlog was swept, before the
 * budget of sweep_once bounded a pass to what this client made). Two
 * thirds of the session's time deletes thousands of records a second. */
static void sweep_pace(struct zk_sweeper *sw, int64_t took_ns)
{
    int64_t rest = took_ns / 2;
    if (rest > 1000 * CERB_NS_PER_MS)
        rest = 1000 * CERB_NS_PER_MS;
    int64_t until = cerb_monotime() + rest;
    cerb__mutex_lock(&sw->mu);
    while (!atomic_load(&sw->stop) && cerb_monotime() < until)
        cerb__cond_wait_until(&sw->cond, &sw->mu, until);
    cerb__mutex_unlock(&sw->mu);
}

/* Free the listing the passes read from. */
static void cache_drop(struct zk_sweeper *sw)
{
    for (size_t i = 0; i < sw->n_cache; i++) {
        free_strs(sw->cache[i].names, sw->cache[i].n);
        cerb__free(sw->cache[i].path);
    }
    cerb__free(sw->cache);
    sw->cache = NULL;
    sw->n_cache = 0;
}

/* The last listing still has names to read (or a scope to list again),
 * and is recent enough that records made since are a small part of what
 * the scopes hold. */
static bool cache_fresh(const struct zk_sweeper *sw)
{
    if (!sw->n_cache || cerb_monotime() - sw->cache_ns >= sw->fresh_ms * CERB_NS_PER_MS)
        return false;
    for (size_t i = 0; i < sw->n_cache; i++)
        if (sw->cache[i].next < sw->cache[i].n || sw->cache[i].relist)
            return true;
    return false;
}

/* Names kept per scope when a listing holds n_scopes: the window, and the
 * whole listing's names within ZK_GUARD_SWEEP_CACHE. */
static size_t window_size(const struct zk_sweeper *sw, size_t n_scopes)
{
    size_t w = ZK_GUARD_SWEEP_CACHE / n_scopes;
    return w > sw->window ? sw->window : w;
}

/* Keep a window of a listing's names r (all n of them) in sc, from a
 * random place (sweepers of other clients start elsewhere). False when
 * out of memory (sc keeps the names copied so far). */
static bool window_fill(struct zk_sweeper *sw, struct sweep_scope *sc, const struct zk_res *r,
                        size_t window)
{
    size_t n = (size_t)r->n_names, take = n < window ? n : window;
    size_t off = n ? (size_t)next_rnd(sw) % n : 0;
    free_strs(sc->names, sc->n);
    sc->names = NULL;
    sc->n = sc->next = 0;
    sc->total = n;
    sc->relist = false;
    if (!take)
        return true;
    if (!(sc->names = cerb__calloc(take, sizeof *sc->names)))
        return false;
    for (size_t j = 0; j < take; j++) {
        if (!(sc->names[j] = cerb__strdup(r->names[(off + j) % n])))
            return false;
        sc->n++;
    }
    return true;
}

/* List one scope again, for a new window of its names (the rest of a
 * backlog bigger than the window); a scope gone (NONODE) keeps none. False
 * when unanswered, answered with another error, or out of memory: the
 * scope stays flagged, for the next pass. */
static bool scope_relist(cerb_engine *e, struct sweep_scope *sc)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    sc->relist = true; /* until a new window is in */
    struct sweep w = {.e = e, .paths = &sc->path, .n = 1};
    struct zk_call *c = sweep_call(e, 1, submit_list, &w);
    if (!c)
        return false;
    int rc = c->res[0].rc;
    bool ok = rc == ZOK || rc == ZNONODE;
    if (ok) {
        atomic_fetch_add(&sw->relists, 1);
        struct zk_res none = {0};
        /* n_cache > 0: sc is one of them */
        ok = window_fill(sw, sc, rc == ZOK ? &c->res[0] : &none, window_size(sw, sw->n_cache));
    }
    cerb__zk_call_put(c);
    return ok;
}

/* List the base, take up to ZK_GUARD_SWEEP_SCOPES scopes (rotating), list
 * them, and keep a window of each one's names, from a random place
 * (sweepers of other clients start elsewhere), for this pass and the next
 * ones; scopes found empty are deleted. Sets the early mark from the
 * records listed. False when a list went unanswered (or out of memory). */
static bool sweep_list(cerb_engine *e)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    cache_drop(sw);
    char *base = e->guard->base;
    struct sweep w = {.e = e, .paths = &base, .n = 1};
    struct zk_call *c = sweep_call(e, 1, submit_list, &w);
    if (!c)
        return false;
    size_t n_sc = c->res[0].rc == ZOK ? (size_t)c->res[0].n_names : 0;
    size_t take_sc = n_sc < ZK_GUARD_SWEEP_SCOPES ? n_sc : ZK_GUARD_SWEEP_SCOPES;
    char **scopes = take_sc ? cerb__calloc(take_sc, sizeof *scopes) : NULL;
    size_t first = 0;
    cerb__mutex_lock(&sw->mu);
    first = n_sc ? sw->cursor % n_sc : 0;
    sw->cursor += take_sc;
    cerb__mutex_unlock(&sw->mu);
    bool oom = take_sc && !scopes;
    for (size_t i = 0; i < take_sc && !oom; i++) {
        scopes[i] = cerb__zkg_path(base, c->res[0].names[(first + i) % n_sc], NULL);
        oom = !scopes[i];
    }
    cerb__zk_call_put(c);
    if (oom || take_sc == 0 || atomic_load(&sw->stop)) {
        free_strs(scopes, take_sc);
        return false;
    }
    w = (struct sweep){.e = e, .paths = scopes, .n = take_sc};
    c = sweep_call(e, take_sc, submit_list, &w);
    sw->cache = c ? cerb__calloc(take_sc, sizeof *sw->cache) : NULL;
    if (!sw->cache) {
        cerb__zk_call_put(c);
        free_strs(scopes, take_sc);
        return false;
    }
    atomic_fetch_add(&sw->listings, 1);
    sw->cache_ns = cerb_monotime();
    size_t window = window_size(sw, take_sc), n_listed = 0, n_empty = 0;
    bool *empty = cerb__calloc(take_sc, sizeof *empty);
    for (size_t i = 0; i < take_sc; i++)
        n_listed += c->res[i].rc == ZOK ? (size_t)c->res[i].n_names : 0;
    for (size_t i = 0; i < take_sc; i++) {
        const struct zk_res *r = &c->res[i];
        size_t n = r->rc == ZOK ? (size_t)r->n_names : 0;
        if (r->rc == ZOK && n == 0 && empty) {
            empty[i] = true;
            n_empty++;
        }
        if (n == 0)
            continue;
        struct sweep_scope *sc = &sw->cache[sw->n_cache++];
        sc->path = scopes[i];
        scopes[i] = NULL;
        if (!window_fill(sw, sc, r, window))
            break; /* out of memory: what was kept so far */
    }
    cerb__zk_call_put(c);
    CERB_LOG_D("zk %s: guard sweep listed %zu record(s) in %zu scope(s)", e->hosts, n_listed,
               take_sc);
    /* The next pass comes early after this client made an eighth as many
     * records as were listed (see ZK_GUARD_SWEEP_EARLY). */
    size_t early = n_listed / 8;
    early = early < ZK_GUARD_SWEEP_EARLY       ? ZK_GUARD_SWEEP_EARLY
            : early > ZK_GUARD_SWEEP_EARLY_MAX ? ZK_GUARD_SWEEP_EARLY_MAX
                                               : early;
    atomic_store(&sw->early, early);
    if (n_empty && !atomic_load(&sw->stop)) {
        /* Scopes found empty: the server removes empty containers too, but
         * only every few seconds or minutes (znode.container.checkIntervalMs).
         * A begin that creates a record meanwhile makes the delete fail
         * (NOTEMPTY), or finds the scope gone and makes it again. */
        w = (struct sweep){.e = e, .paths = scopes, .n = take_sc, .del = empty};
        cerb__zk_call_put(sweep_call(e, n_empty, submit_delete, &w));
    }
    cerb__free(empty);
    free_strs(scopes, take_sc);
    return true;
}

/* Read the listing's scopes on from where the passes before stopped (see
 * sweep_once), spending *budget; the server's time is read once, into
 * *now. A scope whose window runs out while its last batch still found a
 * quarter or more expired, and whose listing found more names than the
 * window kept, is listed again (the rest of a backlog): at once, once a
 * pass, or by the next pass when the budget ran out with it. Answers how
 * many records went. It ends early when the server did not answer or
 * its time could not be read (a batch left unjudged is read again by the
 * next pass to reach the scope), close stopped it, or out of memory (the
 * credit left is kept). */
static size_t sweep_cache(cerb_engine *e, size_t *budget, int64_t *now)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    size_t n_sc = sw->n_cache, n_gone = 0;
    size_t s0 = n_sc ? (size_t)next_rnd(sw) % n_sc : 0; /* the budget may not reach them all */
    char **recs = cerb__calloc(ZK_GUARD_SWEEP_RECS, sizeof *recs);
    bool stop = !recs;
    for (size_t t = 0; t < n_sc && !stop; t++) {
        struct sweep_scope *sc = &sw->cache[(s0 + t) % n_sc];
        bool relisted = false;
        if (sc->relist && *budget > 0) {
            relisted = true;
            stop = !scope_relist(e, sc);
        }
        for (bool probe = true; sc->next < sc->n && !stop && *budget > 0; probe = false) {
            size_t n_rec = 0, cap = probe ? ZK_GUARD_SWEEP_PROBE : ZK_GUARD_SWEEP_RECS;
            size_t from = sc->next;
            for (; sc->next < sc->n && n_rec < cap && n_rec < *budget; sc->next++) {
                char *path = cerb__zkg_path(sc->path, sc->names[sc->next], NULL);
                if (!path) {
                    stop = true; /* out of memory: the next pass */
                    break;
                }
                recs[n_rec++] = path;
            }
            int64_t t0 = cerb_monotime();
            bool no_answer, unread;
            size_t gone = sweep_records(e, recs, n_rec, now, &no_answer, &unread);
            n_gone += gone;
            if (no_answer) {
                /* The next pass to reach this scope reads a batch it could
                 * not judge again (credit kept for it): the listing may
                 * serve passes for a while yet. A batch whose deletes went
                 * unanswered is not: they most likely happened. */
                stop = true;
                if (unread)
                    sc->next = from;
            } else {
                *budget -= n_rec;
                if (*budget < sw->credit)
                    sw->credit = *budget; /* the floor goes first */
            }
            sweep_pace(sw, cerb_monotime() - t0);
            for (size_t k = 0; k < n_rec; k++) {
                cerb__free(recs[k]);
                recs[k] = NULL;
            }
            stop = stop || atomic_load(&sw->stop);
            if (gone < (n_rec + 3) / 4)
                break;
            if (sc->next == sc->n && sc->total > sc->n && !stop) {
                if (*budget == 0 || relisted) {
                    sc->relist = true; /* the next pass */
                } else {
                    relisted = true;
                    stop = !scope_relist(e, sc);
                }
            }
        }
    }
    cerb__free(recs);
    return n_gone;
}

/* One pass: see the file comment. False when it did not get as far as
 * taking this client's count of records made (disconnected, a list
 * unanswered): the next pass waits for its time then. */
static bool sweep_once(cerb_engine *e)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    struct zk_state ss;
    cerb__zk_state(e, &ss);
    if (!ss.connected) {
        cache_drop(sw); /* stale by the time the session is back */
        return false;
    }
    /* A pass reads on from the last listing while it is fresh: listing a
     * scope of live records costs the server (and this client's begins,
     * which share the session) more than the few reads a pass then makes,
     * and a client that makes records fast brings passes forward. */
    if (!cache_fresh(sw) && !sweep_list(e))
        return false;

    /* The scopes' records in batches of ZK_GUARD_SWEEP_RECS: a probe of
     * ZK_GUARD_SWEEP_PROBE per scope, and batches while a quarter or more
     * of the last one had expired, up to a budget of ZK_GUARD_SWEEP_FLOOR
     * reads plus twice the records this client made and not yet paid for.
     * So each client sweeps at least as fast as it makes records, and
     * expired ones stay below about as many as the live ones whatever the
     * rate of begins (a fixed budget fell behind any steady rate above it,
     * and they piled up on the server); the floor clears what clients that
     * left behind. A scope of long-kept records is not read whole every
     * pass. Reads owed for records made carry over until they expire: a
     * pass that runs while they are still live finds too few expired to go
     * on. */
    uint64_t made = atomic_exchange(&sw->made, 0);
    sw->credit += made > ZK_GUARD_SWEEP_CREDIT_MAX ? ZK_GUARD_SWEEP_CREDIT_MAX : (size_t)made * 2;
    if (sw->credit > ZK_GUARD_SWEEP_CREDIT_MAX)
        sw->credit = ZK_GUARD_SWEEP_CREDIT_MAX;
    size_t budget = ZK_GUARD_SWEEP_FLOOR + sw->credit, budget0 = budget;
    int64_t now = 0; /* the server's time, read once */
    size_t n_gone = sweep_cache(e, &budget, &now);
    CERB_LOG_D("zk %s: guard sweep pass: %" PRIu64 " made, budget %zu left of %zu, %zu expired "
               "record(s) deleted", e->hosts, made, budget, budget0, n_gone);
    atomic_fetch_add(&sw->passes, 1);
    return true;
}

/* Made enough records since the last pass to bring the next forward. */
static bool sweep_due(struct zk_sweeper *sw)
{
    return atomic_load_explicit(&sw->made, memory_order_relaxed) >=
           atomic_load_explicit(&sw->early, memory_order_relaxed);
}

static void *sweeper_main(void *arg)
{
    cerb_engine *e = arg;
    struct zk_sweeper *sw = e->guard->sweeper;
    cerb__mutex_lock(&sw->mu);
    /* The first pass at a random point of the first interval. */
    int64_t ms = (int64_t)(next_rnd(sw) % ZK_GUARD_SWEEP_MS);
    bool ran = true;
    while (!atomic_load(&sw->stop)) {
        int64_t next = cerb_monotime() + ms * CERB_NS_PER_MS;
        while (!atomic_load(&sw->stop) && cerb_monotime() < next && !(ran && sweep_due(sw)))
            cerb__cond_wait_until(&sw->cond, &sw->mu, next);
        if (atomic_load(&sw->stop))
            break;
        cerb__mutex_unlock(&sw->mu);
        cerb__zk_guard_pool_tend(e->gpool);
        ran = sweep_once(e);
        cerb__mutex_lock(&sw->mu);
        int64_t span = ZK_GUARD_SWEEP_MS * 2 / 5; /* ± 20 % */
        ms = ZK_GUARD_SWEEP_MS - span / 2 + (int64_t)(next_rnd(sw) % (uint64_t)span);
    }
    cerb__mutex_unlock(&sw->mu);
    return NULL;
}

void cerb__zk_guard_sweep_tune(cerb_engine *e, int64_t fresh_ms, size_t window)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    cerb__mutex_lock(&sw->mu); /* the thread starts under it: no race */
    if (sw->started) {
        CERB_LOG_W("zk %s: guard sweeper tuned after its start: ignored", e->hosts);
    } else {
        if (fresh_ms > 0)
            sw->fresh_ms = fresh_ms;
        if (window > 0)
            sw->window = window;
    }
    cerb__mutex_unlock(&sw->mu);
}

void cerb__zk_guard_sweep_counts(cerb_engine *e, uint64_t *passes, uint64_t *listings,
                                 uint64_t *relists)
{
    *passes = atomic_load(&e->guard->sweeper->passes);
    *listings = atomic_load(&e->guard->sweeper->listings);
    *relists = atomic_load(&e->guard->sweeper->relists);
}

void cerb__zk_sweeper_begin(cerb_engine *e)
{
    struct zk_sweeper *sw = e->guard->sweeper;
    cerb__mutex_lock(&sw->mu);
    if (!sw->started && !atomic_load(&sw->stop)) {
        if (pthread_create(&sw->thread, NULL, sweeper_main, e) == 0)
            sw->started = true;
        else
            CERB_LOG_W("zk %s: cannot start the guard sweeper; expired records are removed "
                       "only when asked for", e->hosts);
    }
    cerb__mutex_unlock(&sw->mu);
}

void cerb__zk_sweeper_free(struct zk_sweeper *sw)
{
    if (!sw)
        return;
    cerb__mutex_lock(&sw->mu);
    atomic_store(&sw->stop, true);
    cerb__cond_signal(&sw->cond);
    bool started = sw->started;
    cerb__mutex_unlock(&sw->mu);
    if (started)
        pthread_join(sw->thread, NULL);
    cache_drop(sw);
    cerb__cond_destroy(&sw->cond);
    cerb__mutex_destroy(&sw->mu);
    cerb__free(sw);
}
