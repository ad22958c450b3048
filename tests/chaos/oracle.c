/*
 * oracle.c — the chaos suite's shared-memory oracle (see oracle.h).
 *
 * Layout. One file, mapped MAP_SHARED by every worker process, holds a fixed
 * struct: a table of lock names, each with its own spinlock (a C11
 * atomic_flag: lock-free, hence valid across processes in shared memory),
 * the holds of that name currently inside their critical section, and the
 * highest token granted so far per engine, per client and over all engines;
 * a table of engine names; `cerberus switch` marks; counters; and a short
 * list of anomaly notes kept verbatim for the report.
 *
 * Algorithm. oracle_enter() takes the name's spinlock, so the enters and
 * leaves of one name are totally ordered: each new hold is compared with
 * every hold still inside (an overlap is explained when that older holder's
 * told-LOST time is set and not after the new enter, else unsafe — §5a.1),
 * and its token with the maxima of earlier grants (a token not above the
 * engine's, or the client's, previous maximum, or not above the floor of a
 * switch mark that has settled, is a regression — §5a.3; 0 is counted
 * apart). The spinlock is held for a few hundred instructions, never across
 * a library call, and workers are never killed by the nemesis, so it cannot
 * be left held. Holder ids carry a generation so a late lost callback cannot
 * mark the next hold that reuses the slot. A hold whose process has died
 * (kill(pid, 0) fails with ESRCH) ends when the next enter of its name finds
 * it: a crashed worker is a failure of its own, not a stream of overlaps.
 *
 * Guard attempts are holds without a token (oracle_enter_claim): the same
 * overlap rule, no token rule. Each name also keeps its latest success
 * window (oracle_done): the interval in which the done-record certainly
 * existed on the server, from the finish's return to the finish's send +
 * keep_ms; a claim whose whole begin call lies inside it ran the operation
 * twice (a rerun).
 *
 * Locks granted by an engine without fencing (memcached: no counter survives
 * its restart) are holds without a token too (oracle_enter_unfenced): the
 * overlap rule alone.
 */
#include "oracle.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ORACLE_MAGIC 0x4345524243484f31ull /* "CERBCHO1" */
#define HOLDER_IDX_BITS 10                  /* 16 names × 64 holders */

_Static_assert(ORACLE_MAX_NAMES * ORACLE_MAX_HOLDERS <= (1 << HOLDER_IDX_BITS),
               "holder index must fit its bits");

struct holder {
    int used;
    int client;
    pid_t pid; /* the recording process, to tell a holder that died inside */
    int engine;
    unsigned gen;
    uint64_t token;
    int64_t t_enter;
    int64_t t_lost; /* 0 = not told */
    bool fenced;    /* a lock's hold (token judged), not a guard claim */
    int share;      /* 0 exclusive, else enum oracle_share */
    unsigned weight;
};

struct name_slot {
    atomic_flag lock;
    char name[ORACLE_NAME_MAX];
    uint64_t max_engine[ORACLE_MAX_ENGINES];
    uint64_t max_client[ORACLE_MAX_CLIENTS];
    uint64_t max_all;
    uint64_t max_excl_engine[ORACLE_MAX_ENGINES]; /* writers' (shared names) */
    uint64_t floor[ORACLE_MAX_MARKS]; /* max_all when mark i was made */
    struct holder h[ORACLE_MAX_HOLDERS];
    /* The latest success of this guard key: done certainly from done_from
     * until done_until (0: none). */
    int64_t done_from, done_until;
};

struct mark {
    int64_t t;
    int64_t settle_ns;
};

struct oracle_shm {
    uint64_t magic;
    int64_t t0; /* oracle_create time: notes give times as offsets from it */
    atomic_flag lock; /* names, engines, marks, notes */
    unsigned nnames;
    unsigned nengines;
    unsigned nmarks;
    unsigned nnotes;
    char engine[ORACLE_MAX_ENGINES][16];
    struct mark marks[ORACLE_MAX_MARKS];
    _Atomic uint64_t acq_engine[ORACLE_MAX_ENGINES];
    _Atomic uint64_t acquisitions, overlaps_explained, overlaps_unsafe;
    _Atomic uint64_t token_regressions, zero_tokens, reruns, overruns, calls, lost;
    _Atomic uint64_t max_overrun_ms;
    char notes[ORACLE_MAX_NOTES][ORACLE_NOTE_MAX];
    struct name_slot names[ORACLE_MAX_NAMES];
};

struct oracle {
    struct oracle_shm *s;
};

static void spin_lock(atomic_flag *f)
{
    while (atomic_flag_test_and_set_explicit(f, memory_order_acquire))
        sched_yield();
}

static void spin_unlock(atomic_flag *f)
{
    atomic_flag_clear_explicit(f, memory_order_release);
}

int64_t oracle_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static oracle *map_file(int fd)
{
    void *p = mmap(NULL, sizeof(struct oracle_shm), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        errno = e;
        return NULL;
    }
    oracle *o = calloc(1, sizeof(*o));
    if (!o) {
        munmap(p, sizeof(struct oracle_shm));
        errno = ENOMEM;
        return NULL;
    }
    o->s = p;
    return o;
}

oracle *oracle_create(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    /* ftruncate zero-fills: every counter 0, every flag clear. */
    if (ftruncate(fd, (off_t)sizeof(struct oracle_shm)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    oracle *o = map_file(fd);
    if (o) {
        o->s->magic = ORACLE_MAGIC;
        o->s->t0 = oracle_now();
        /* The engine id 0 is "?": a grant whose engine the worker could not tell. */
        strcpy(o->s->engine[0], "?");
        o->s->nengines = 1;
    }
    return o;
}

oracle *oracle_open(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    off_t size = lseek(fd, 0, SEEK_END);
    if (size != (off_t)sizeof(struct oracle_shm)) {
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    oracle *o = map_file(fd);
    if (o && o->s->magic != ORACLE_MAGIC) {
        oracle_close(o);
        errno = EINVAL;
        return NULL;
    }
    return o;
}

void oracle_close(oracle *o)
{
    if (!o)
        return;
    munmap(o->s, sizeof(struct oracle_shm));
    free(o);
}

static void note(oracle *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note(oracle *o, const char *fmt, ...)
{
    struct oracle_shm *s = o->s;
    spin_lock(&s->lock);
    if (s->nnotes < ORACLE_MAX_NOTES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->notes[s->nnotes], ORACLE_NOTE_MAX, fmt, ap);
        va_end(ap);
        s->nnotes++;
    }
    spin_unlock(&s->lock);
}

static void atomic_max(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v)) {
    }
}

/* The index of @name (added when new), or -1 when the table is full. */
static int name_index(struct oracle_shm *s, const char *name)
{
    int idx = -1;
    spin_lock(&s->lock);
    for (unsigned i = 0; i < s->nnames; i++)
        if (strncmp(s->names[i].name, name, ORACLE_NAME_MAX - 1) == 0) {
            idx = (int)i;
            break;
        }
    if (idx < 0 && s->nnames < ORACLE_MAX_NAMES) {
        idx = (int)s->nnames;
        snprintf(s->names[idx].name, ORACLE_NAME_MAX, "%s", name);
        s->nnames++;
    }
    spin_unlock(&s->lock);
    return idx;
}

static int engine_index(struct oracle_shm *s, const char *engine)
{
    int idx = 0;
    if (!engine || !*engine)
        return 0;
    spin_lock(&s->lock);
    for (unsigned i = 0; i < s->nengines; i++)
        if (strncmp(s->engine[i], engine, sizeof(s->engine[i]) - 1) == 0) {
            idx = (int)i;
            goto out;
        }
    if (s->nengines < ORACLE_MAX_ENGINES) {
        idx = (int)s->nengines;
        snprintf(s->engine[idx], sizeof(s->engine[idx]), "%s", engine);
        s->nengines++;
    }
out:
    spin_unlock(&s->lock);
    return idx;
}

/* The floor a grant entering at @t must exceed: the highest mark floor that
 * has settled by @t, or 0. Caller holds the name's lock; marks only grow. */
static uint64_t settled_floor(struct oracle_shm *s, struct name_slot *n, int64_t t)
{
    uint64_t f = 0;
    spin_lock(&s->lock);
    for (unsigned i = 0; i < s->nmarks; i++)
        if (t > s->marks[i].t + s->marks[i].settle_ns && n->floor[i] > f)
            f = n->floor[i];
    spin_unlock(&s->lock);
    return f;
}

/* A redis done-record's PX counts from the server's millisecond clock,
 * which may truncate its start by up to a millisecond: a rerun is judged
 * this much inside the window, never at its edge. */
#define DONE_SLACK_NS 5000000

/* Does a hold entering as (share, weight) of a name of capacity cap
 * conflict with holder h, given the weight of the others inside? Locks and
 * claims (share 0) conflict with everybody. */
static bool conflicts(int share, unsigned weight, unsigned cap, const struct holder *h,
                      unsigned inside_weight)
{
    if (share == 0 || h->share == 0)
        return true;
    if (share == ORACLE_PERMITS)
        return h->share != ORACLE_PERMITS || inside_weight + weight > cap;
    return share == ORACLE_WRITE || h->share == ORACLE_WRITE;
}

/* What enter() records: a fenced hold (token judged), a guard claim, or a
 * lock of an engine without fencing (memcached): no token, no reruns. */
enum kind { K_FENCED, K_CLAIM, K_UNFENCED };

static int enter(oracle *o, const char *name, int client, enum kind kind, uint64_t token,
                 const char *engine, int64_t t_begin_ns, int64_t t_ns, int share,
                 unsigned weight, unsigned cap)
{
    struct oracle_shm *s = o->s;
    int ni = name_index(s, name);
    if (ni < 0 || client < 0 || client >= ORACLE_MAX_CLIENTS) {
        note(o, "oracle full: name %s client %d not recorded", name, client);
        return -1;
    }
    int ei = engine_index(s, engine);
    struct name_slot *n = &s->names[ni];
    int id = -1;
    bool fenced = kind == K_FENCED;

    spin_lock(&n->lock);
    atomic_fetch_add(&s->acquisitions, 1);
    atomic_fetch_add(&s->acq_engine[ei], 1);

    /* The permits inside held by holders not told LOST by t_ns: a new
     * permit conflicts only when they and it exceed the limit. */
    unsigned inside = 0;
    for (int j = 0; share == ORACLE_PERMITS && j < ORACLE_MAX_HOLDERS; j++) {
        const struct holder *h = &n->h[j];
        if (h->used && h->share == ORACLE_PERMITS && !(h->t_lost != 0 && h->t_lost <= t_ns))
            inside += h->weight;
    }

    for (int j = 0; j < ORACLE_MAX_HOLDERS; j++) {
        struct holder *h = &n->h[j];
        if (!h->used)
            continue;
        if (h->pid != getpid() && kill(h->pid, 0) != 0 && errno == ESRCH) {
            /* Its process died inside (a crash the driver reports): a dead
             * process touches nothing, so its hold ends here, not an overlap. */
            h->used = 0;
            note(o, "client %d (pid %d) died inside %s (token %#llx)", h->client,
                 (int)h->pid, name, (unsigned long long)h->token);
            continue;
        }
        if (!conflicts(share, weight, cap, h, inside))
            continue;
        if (h->t_lost != 0 && h->t_lost <= t_ns) {
            atomic_fetch_add(&s->overlaps_explained, 1);
        } else if (fenced) {
            atomic_fetch_add(&s->overlaps_unsafe, 1);
            note(o, "UNSAFE overlap on %s: client %d token %#llx (%s) entered at "
                 "+%.3fs while client %d token %#llx (%s) inside since +%.3fs, %s",
                 name, client, (unsigned long long)token, s->engine[ei],
                 (t_ns - s->t0) / 1e9, h->client, (unsigned long long)h->token,
                 s->engine[h->engine], (h->t_enter - s->t0) / 1e9,
                 h->t_lost ? "told LOST only after" : "never told LOST");
        } else {
            atomic_fetch_add(&s->overlaps_unsafe, 1);
            note(o, "UNSAFE overlap on %s %s: client %d (%s) began at +%.3fs "
                 "while client %d (%s) running since +%.3fs, %s",
                 kind == K_CLAIM ? "guard key" : "unfenced lock", name, client,
                 s->engine[ei], (t_ns - s->t0) / 1e9, h->client, s->engine[h->engine],
                 (h->t_enter - s->t0) / 1e9,
                 h->t_lost ? "told LOST only after" : "never told LOST");
        }
    }

    if (kind == K_UNFENCED) {
        /* Nothing to judge beyond the overlap. */
    } else if (!fenced) {
        /* §11: a success keeps its key from running again for keep_ms. */
        if (n->done_until != 0 && t_begin_ns > n->done_from &&
            t_ns + DONE_SLACK_NS < n->done_until) {
            atomic_fetch_add(&s->reruns, 1);
            note(o, "rerun of guard key %s: client %d (%s) began at +%.3fs (sent "
                 "+%.3fs), a success kept it until +%.3fs",
                 name, client, s->engine[ei], (t_ns - s->t0) / 1e9,
                 (t_begin_ns - s->t0) / 1e9, (n->done_until - s->t0) / 1e9);
        }
    } else if (token == 0) {
        atomic_fetch_add(&s->zero_tokens, 1);
        note(o, "token 0 on %s: client %d (%s) at +%.3fs", name, client,
             s->engine[ei], (t_ns - s->t0) / 1e9);
    } else {
        /* §5a.3: strictly increasing per engine (engine 0 = unknown, not
         * judged), per client, and above every settled switch floor. */
        const char *why = NULL;
        uint64_t prev = 0;
        uint64_t fl = settled_floor(s, n, t_ns);
        bool ordered = share == 0 || share == ORACLE_WRITE;
        if (ei != 0 && ordered && token <= n->max_engine[ei]) {
            why = "engine";
            prev = n->max_engine[ei];
        } else if (ei != 0 && !ordered && token <= n->max_excl_engine[ei]) {
            why = "engine, after a writer";
            prev = n->max_excl_engine[ei];
        } else if (ordered && token <= n->max_client[client]) {
            why = "client";
            prev = n->max_client[client];
        } else if (token <= fl) {
            why = "switch";
            prev = fl;
        }
        if (why) {
            atomic_fetch_add(&s->token_regressions, 1);
            note(o, "token regression (%s) on %s: client %d (%s) got %#llx "
                 "at +%.3fs, not above %#llx", why, name, client, s->engine[ei],
                 (unsigned long long)token, (t_ns - s->t0) / 1e9, (unsigned long long)prev);
        }
        if (ei != 0 && token > n->max_engine[ei])
            n->max_engine[ei] = token;
        if (ei != 0 && share == ORACLE_WRITE && token > n->max_excl_engine[ei])
            n->max_excl_engine[ei] = token;
        if (token > n->max_client[client])
            n->max_client[client] = token;
        if (token > n->max_all)
            n->max_all = token;
    }

    for (int j = 0; j < ORACLE_MAX_HOLDERS; j++) {
        struct holder *h = &n->h[j];
        if (h->used)
            continue;
        h->used = 1;
        h->client = client;
        h->pid = getpid();
        h->engine = ei;
        h->gen = (h->gen + 1) & ((1u << (31 - HOLDER_IDX_BITS)) - 1);
        h->token = token;
        h->t_enter = t_ns;
        h->t_lost = 0;
        h->fenced = fenced;
        h->share = share;
        h->weight = weight;
        id = (int)(h->gen << HOLDER_IDX_BITS) | (ni * ORACLE_MAX_HOLDERS + j);
        break;
    }
    spin_unlock(&n->lock);
    if (id < 0)
        note(o, "oracle full: more than %d holds of %s", ORACLE_MAX_HOLDERS, name);
    return id;
}

int oracle_enter(oracle *o, const char *name, int client, uint64_t token,
                 const char *engine, int64_t t_ns)
{
    return enter(o, name, client, K_FENCED, token, engine, t_ns, t_ns, 0, 1, 1);
}

int oracle_enter_shared(oracle *o, const char *name, int client, uint64_t token,
                        const char *engine, int64_t t_ns, enum oracle_share share,
                        unsigned weight, unsigned cap)
{
    return enter(o, name, client, K_FENCED, token, engine, t_ns, t_ns, (int)share,
                 share == ORACLE_PERMITS ? weight : 1, cap);
}

int oracle_enter_claim(oracle *o, const char *name, int client, const char *engine,
                       int64_t t_begin_ns, int64_t t_ns)
{
    return enter(o, name, client, K_CLAIM, 0, engine, t_begin_ns, t_ns, 0, 1, 1);
}

int oracle_enter_unfenced(oracle *o, const char *name, int client, const char *engine,
                          int64_t t_ns)
{
    return enter(o, name, client, K_UNFENCED, 0, engine, t_ns, t_ns, 0, 1, 1);
}

void oracle_done(oracle *o, const char *name, int64_t t0_ns, int64_t t1_ns, int64_t keep_ms)
{
    struct oracle_shm *s = o->s;
    int ni = name_index(s, name);
    if (ni < 0) {
        note(o, "oracle full: success of %s not recorded", name);
        return;
    }
    struct name_slot *n = &s->names[ni];
    int64_t until = t0_ns + keep_ms * 1000000;
    spin_lock(&n->lock);
    /* Successes of one key do not overlap (or that was counted): the
     * latest one ends last, unless it was given a shorter keep. */
    if (until > n->done_until) {
        n->done_from = t1_ns;
        n->done_until = until;
    }
    spin_unlock(&n->lock);
}

/* The holder @id names, with its name's lock taken, or NULL (lock not taken)
 * for a stale or bad id. */
static struct holder *holder_get(struct oracle_shm *s, int id, struct name_slot **np)
{
    if (id < 0)
        return NULL;
    unsigned idx = (unsigned)id & ((1u << HOLDER_IDX_BITS) - 1);
    unsigned gen = (unsigned)id >> HOLDER_IDX_BITS;
    if (idx >= ORACLE_MAX_NAMES * ORACLE_MAX_HOLDERS)
        return NULL;
    struct name_slot *n = &s->names[idx / ORACLE_MAX_HOLDERS];
    struct holder *h = &n->h[idx % ORACLE_MAX_HOLDERS];
    spin_lock(&n->lock);
    if (!h->used || h->gen != gen) {
        spin_unlock(&n->lock);
        return NULL;
    }
    *np = n;
    return h;
}

void oracle_leave(oracle *o, int holder, int64_t t_ns)
{
    struct name_slot *n;
    struct holder *h = holder_get(o->s, holder, &n);
    (void)t_ns;
    if (!h)
        return;
    h->used = 0;
    spin_unlock(&n->lock);
}

void oracle_told_lost(oracle *o, int holder, int64_t t_ns)
{
    struct name_slot *n;
    struct holder *h = holder_get(o->s, holder, &n);
    if (!h)
        return;
    if (h->t_lost == 0) {
        h->t_lost = t_ns;
        atomic_fetch_add(&o->s->lost, 1);
    }
    spin_unlock(&n->lock);
}

void oracle_call(oracle *o, const char *what, int64_t t0_ns, int64_t t1_ns,
                 int64_t bound_ms)
{
    struct oracle_shm *s = o->s;
    int64_t took_ms = (t1_ns - t0_ns) / 1000000;
    atomic_fetch_add(&s->calls, 1);
    if (took_ms > bound_ms)
        atomic_max(&s->max_overrun_ms, (uint64_t)(took_ms - bound_ms));
    if (took_ms > bound_ms + 1000) {
        atomic_fetch_add(&s->overruns, 1);
        note(o, "overrun: %s took %lld ms from +%.3fs, bound %lld ms", what,
             (long long)took_ms, (t0_ns - s->t0) / 1e9, (long long)bound_ms);
    }
}

void oracle_mark_switch(oracle *o, int64_t t_ns, int64_t settle_ms)
{
    struct oracle_shm *s = o->s;
    spin_lock(&s->lock);
    unsigned m = s->nmarks;
    unsigned nn = s->nnames;
    spin_unlock(&s->lock);
    if (m >= ORACLE_MAX_MARKS) {
        note(o, "oracle full: switch mark at +%.3fs not recorded", (t_ns - s->t0) / 1e9);
        return;
    }
    /* Floors first, then publish the mark: a grant can only be judged
     * against a mark whose floors are all written. */
    for (unsigned i = 0; i < nn; i++) {
        struct name_slot *n = &s->names[i];
        spin_lock(&n->lock);
        n->floor[m] = n->max_all;
        spin_unlock(&n->lock);
    }
    spin_lock(&s->lock);
    if (s->nmarks == m) {
        s->marks[m].t = t_ns;
        s->marks[m].settle_ns = settle_ms * 1000000;
        s->nmarks++;
    }
    spin_unlock(&s->lock);
}

void oracle_report_get(oracle *o, oracle_report *r)
{
    struct oracle_shm *s = o->s;
    memset(r, 0, sizeof(*r));
    spin_lock(&s->lock);
    for (unsigned i = 0; i < s->nengines; i++) {
        snprintf(r->engine_name[i], sizeof(r->engine_name[i]), "%s", s->engine[i]);
        r->acq_engine[i] = atomic_load(&s->acq_engine[i]);
    }
    r->notes = s->nnotes;
    spin_unlock(&s->lock);
    r->acquisitions = atomic_load(&s->acquisitions);
    r->overlaps_explained = atomic_load(&s->overlaps_explained);
    r->overlaps_unsafe = atomic_load(&s->overlaps_unsafe);
    r->token_regressions = atomic_load(&s->token_regressions);
    r->zero_tokens = atomic_load(&s->zero_tokens);
    r->reruns = atomic_load(&s->reruns);
    r->overruns = atomic_load(&s->overruns);
    r->calls = atomic_load(&s->calls);
    r->lost = atomic_load(&s->lost);
    r->max_overrun_ms = atomic_load(&s->max_overrun_ms);
}

const char *oracle_note_get(oracle *o, unsigned i)
{
    struct oracle_shm *s = o->s;
    spin_lock(&s->lock);
    unsigned n = s->nnotes;
    spin_unlock(&s->lock);
    return i < n ? s->notes[i] : NULL;
}
