/*
 * internal.h — the core's shared structures: client, per-name slot, hold,
 * lock handle. Not installed; engines never include it.
 *
 * Ownership map:
 *   cerb_client ─┬─ engines[] (ops + instance + counters)
 *                ├─ names: hash table of cerb_slot, one per lock name in use
 *                │    cerb_slot ─ local wait queue + the current hold
 *                │                (which thread, how many times, which engine)
 *                ├─ handles: list of cerb_lock (each refers to one slot)
 *                └─ watchdog: renews holds, detects and reports loss
 * A slot lives while a handle refers to it. A hold lives from a grant until
 * the release returns (and the watchdog has let go of it).
 */
#ifndef CERB_INTERNAL_H
#define CERB_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../config/config.h"
#include "../failover/breaker.h"
#include "cerberus.h"
#include "engine.h"
#include "error.h"
#include "metrics.h"
#include "sync.h"

#define CERB_CLIENT_MAGIC 0x43455242u /* "CERB" */
#define CERB_LOCK_MAGIC 0x4c4f434bu   /* "LOCK" */
#define CERB_DEAD_MAGIC 0xdeadbeefu

/* Fraction of a lease the local deadline gives up for clock drift between
 * us and the server (plus a fixed 2 ms), as Redlock does. */
#define CERB_DRIFT_PERMILLE 10
#define CERB_DRIFT_FIXED_MS 2

struct cerb_client_engine {
    cerb_client *client;         /* back pointer for engine events */
    int idx;
    char name[CERB_ENGINE_NAME_MAX];
    const struct cerb_engine_ops *ops;
    cerb_engine *_Atomic e;      /* NULL until opened (set once, open_mu) */
    atomic_uint_fast64_t acquires, failures, lost;
    /* cerb_guard_begin() answers while this engine was active (guard.c) */
    atomic_uint_fast64_t guard_begins, guard_dups, guard_busy, guard_degraded;
    /* election.c: terms won (campaigns that returned OK) and proclaims
     * confirmed on this engine */
    atomic_uint_fast64_t terms, proclaims;
    /* semaphore.c: acquisitions granted; rwlock.c: read and write holds
     * granted (not counting reentries). */
    atomic_uint_fast64_t sem_grants, read_grants, write_grants;
    struct cerb_histo wait_h, hold_h;   /* acquire wait, hold time (metrics.c) */
    atomic_int_fast64_t last_probe_us;
    /* health, under client->fo_mu (pending_ok is batched lock-free) */
    struct cerb_breaker brk;
    int64_t healthy_since_ms;
    /* Safe switch (health.c): acquisitions elsewhere ask this engine
     * first while `gated` — for as long as it answers. Set when we leave
     * it (or start elsewhere while it may hold names); ended only by
     * switching back to it. Silence for its grace lets acquisitions pass
     * (holds there have expired) until it answers again. */
    /* Written under fo_mu; atomic so that the acquire path can see "not
     * gated" without taking fo_mu. */
    atomic_bool gated;
    int64_t gate_from_ns;        /* when the gate was set */
    /* Last time this engine answered anything of ours: a probe, a held()
     * question, a successful lock call (renewals included). */
    atomic_int_fast64_t last_ok_ns;
    int64_t ask_fail_ns;         /* last held() question that got no answer */
    int64_t quiet_from_ns;       /* first call or question that got no answer
                                    since the last answer: the gate's grace
                                    runs from here (fo_mu) */
    atomic_int_fast64_t grant_after_ns; /* switched back to: no grant before */
    atomic_uint_fast64_t pending_ok;
    /* The highest fence (with its epoch) this client was granted here: a
     * grant on another engine must rank above it (lock.c, fence_floor). */
    atomic_uint_fast64_t max_fence;
    /* Closure records (closure.c): the closed record this client wants
     * here was last seen at closure_seen_ns (0: not seen, lapsed or not
     * wanted) for client epoch closure_epoch; answers "free" kept in slots
     * are good only under the current closure_gen. */
    atomic_int_fast64_t closure_seen_ns;
    atomic_int_fast64_t closure_epoch;
    atomic_uint_fast64_t closure_gen;
    atomic_bool closure_warned;
    atomic_uint_fast64_t gate_questions; /* held() asked by the gate */
    /* The last time the record wanted here (closed or open) was read as
     * wanted (not reset by a lapse): holds granted elsewhere without a claim
     * here are valid no longer than a lease past it (closure.c,
     * cerb__closure_cap). */
    atomic_int_fast64_t closure_ok_ns;
    char log_note[160];          /* a breaker transition to log once fo_mu
                                    is released (health.c), "" when none */
    uint64_t transitions;
};

struct cerb_engine_hold;
struct cerb_slot;
struct cerb_watchdog;

/* A thread waiting in this process for a slot (on its stack). */
struct cerb_waiter {
    struct cerb_waiter *next, *prev;    /* slot's local queue */
    struct cerb_waiter *hnext;          /* handle's interruptible waiters */
    cerb_lock *handle;
    cerb_cond cond;                     /* signalled when it may proceed */
    bool interruptible;
    atomic_int interrupted;
    struct cerb_engine_hold *engine_hold;      /* set while it calls the engine */
    /* The flag the engine watches while this waiter is in acquire(): set
     * by an interrupt, or by a switch (with `moved`), which makes the
     * acquisition carry on on the new engine. */
    atomic_int stop;
    atomic_int moved;
    bool gate_said;                     /* the safe-switch gate refused */
    struct cerb_waiter *cnext, *cprev;  /* client's in-engine list */
};

struct cerb_engine_hold {
    cerb_engine_lock lk;                 /* lk.name points at slot->name */
    struct cerb_slot *slot;
    int engine_idx;
    int64_t epoch;                       /* read with engine_idx (route) */
    uint64_t fence;                      /* already with the epoch */
    _Atomic int64_t valid_until_ns;      /* conservative local deadline */
    int64_t next_renew_ns;
    int64_t granted_ns;                  /* when the caller was granted it */
    bool renew;
    bool renew_once;                     /* extend once now (short hand-off
                                            lease or a settled ambiguity),
                                            even when renew is off */
    atomic_int state;                    /* enum cerb_lock_state */
    bool lost_reported;
    cerb_lock *owner_handle;             /* whose lost callback to call */
    /* watchdog bookkeeping, under the watchdog mutex */
    struct cerb_engine_hold *wd_next, *wd_prev;
    bool wd_linked, wd_busy;
    int renew_failures;
    int64_t orphan_until_ns;             /* orphans: give up after this */
    bool wd_sending;                     /* wd_busy and its renewal is on the
                                            wire (else only queued) */
    /* Claims (lock.c): while another engine is gated and answers, a grant
     * also takes the name there with the same token, renewed like a hold
     * and released with it, so that engine itself refuses processes that
     * did not switch. A claim has claim_of set; its loss while that engine
     * answers ("not owner", session expired) makes claim_of LOST. */
    struct cerb_engine_hold *claim_of;
    struct cerb_engine_hold *claims;            /* this hold's claims (claim_next) */
    struct cerb_engine_hold *claim_next;
    int64_t failing_since_ns;            /* first failed renewal since the
                                            last good one; 0 = none */
    /* Engines (bit i) whose closure record this grant relied on instead of
     * a claim: its deadline is capped by cerb__closure_cap (closure.c). */
    uint32_t relies;
};

struct cerb_slot {
    char *name;
    unsigned refs;                       /* handles referring to it */
    struct cerb_slot *next;              /* hash chain */
    cerb_mutex mu;
    cerb_cond cond;
    struct cerb_waiter *qhead, *qtail;   /* local FIFO */
    bool occupied;                       /* a thread holds or is acquiring */
    uint64_t holder_tid;                 /* 0 = none */
    unsigned count;                      /* reentrant holds */
    struct cerb_engine_hold *hold;
    /* A slot of its own for one primitive's handle (cerb__slot_private):
     * not in the client's table, so no other handle shares its line; prim
     * says which primitive's layout the switch gate asks about. */
    bool unlisted;
    int prim;
    /* Engine i said the name was free after its closure record was seen
     * (closure.c), under closure_gen free_gen[i]; 0 = not asked. Only the
     * thread that occupies the slot reads or writes it. */
    uint64_t free_gen[CERB_MAX_ENGINES];
};

struct cerb_lock {
    atomic_uint magic;
    cerb_client *client;
    struct cerb_slot *slot;
    int64_t lease_ms;                    /* 0 = config default */
    bool renew, fair;
    bool renew_set, fair_set;            /* false = config default */
    /* under slot->mu */
    struct cerb_waiter *iwaiters;        /* interruptible waiters */
    unsigned nwaiting;                   /* all threads inside an acquire */
    bool intr_pending;
    void (*lost_cb)(cerb_lock *, void *);
    void *lost_ud;
    cerb_lock *next, *prev;              /* client's handle list */
    struct cerb_hold *as_hold;           /* the hold object this handle is
                                            part of (hold.c), else NULL */
    /* What its holds are for (engine.h, enum cerb_prim): 0 for a lock. A
     * leader election's handles (election.c) carry the layout and the
     * value each term starts with (copied into the engine hold), and the
     * election whose lost callback a term's loss queues. */
    int prim, variant;
    const void *value;
    size_t value_len;
    struct cerb_election *election;
    /* A semaphore's limit and the permits each hold takes (semaphore.c);
     * a read-write lock's handle (rwlock.c), whose callback a loss queues. */
    int64_t limit;
    unsigned count;
    struct cerb_rwlock *rwlock;
};

/* slot->holder_tid of a hold owned by an object (hold.c): no thread's id
 * (cerb__thread_id counts from 1), so no thread re-enters it. Which object
 * holds it is s->hold->owner_handle, the hold's private handle. */
#define CERB_HOLDER_OBJECT UINT64_MAX
/* The engine hold that hold object h's private handle `l` holds, or NULL
 * (released, lost and given back, never granted). slot->mu held. */
#define CERB__OBJECT_HOLD(s, l)                                                \
    ((s)->holder_tid == CERB_HOLDER_OBJECT && (s)->hold && (s)->hold->owner_handle == (l) \
         ? (s)->hold                                                            \
         : NULL)
#define CERB_HOLD_MAGIC 0x484f4c44u   /* "HOLD" */

/*
 * A hold owned by an object (cerb_lock_acquire). It embeds a private lock
 * handle, first, through which it waits, holds and is told of a loss like
 * any handle: one allocation, so the callback thread that keeps a handle's
 * memory alive while its callback runs (notify.c) keeps the hold's too.
 */
struct cerb_hold {
    cerb_lock l;                         /* first (see above) */
    atomic_uint magic;
    /* Held across a release, so that a second release or the free waits
     * for one in flight instead of freeing what it still uses. */
    cerb_mutex release_mu;
    bool released;                       /* under release_mu */
    uint64_t fence;
    /* under l.slot->mu */
    void (*cb)(struct cerb_hold *, void *);
    void (*permit_cb)(cerb_permit *, void *); /* a permit's (semaphore.c), instead of cb */
    void *cb_ud;
    bool told;                           /* a lost callback was queued */
    char err[CERB_ERROR_MAX];            /* the last failed call's text */
};

/* A cancel (cancel.c): fire ends the call it is attached to. */
struct cerb_cancel {
    cerb_mutex mu;                       /* before any slot->mu */
    atomic_int fired;
    bool in_use;                         /* a call has it (mu) */
    cerb_lock *waiting;                  /* that call's handle, when it can be
                                            interrupted (mu) */
    char err[CERB_ERROR_MAX];
};

#define CERB_NAME_BUCKETS 256

struct cerb_client {
    atomic_uint magic;
    cerb_mutex mu;                       /* cfg, names, handles, switch cb */
    struct cerb_config *cfg;             /* current (reloadable keys) */
    struct cerb_config *boot_cfg;        /* the engines' config, for life */
    size_t n_engines;
    struct cerb_client_engine engines[CERB_MAX_ENGINES];
    atomic_int current;
    cerb_mutex open_mu;                  /* serialises engine opens */
    /* failover state, under fo_mu */
    cerb_mutex fo_mu;
    int pinned;                          /* -1: auto */
    atomic_int_fast64_t epoch;           /* fences' high 16 bits: the
                                            configuration's epoch */
    atomic_int_fast64_t holds_in_force;  /* granted and not yet released */
    uint64_t switches;
    struct cerb_prober *prober;          /* prober.c */
    struct cerb_config_watch *config_watch; /* config_watch.c */
    cerb_mutex inflight_mu;              /* before any slot->mu */
    struct cerb_waiter *inflight;        /* acquisitions inside an engine */
    struct cerb_slot *names[CERB_NAME_BUCKETS];
    cerb_lock *handles;
    struct cerb_watchdog *_Atomic wd;    /* engine events may arrive early */
    unsigned fork_gen;                   /* cerb__fork_generation() at open */
    int64_t lease_hwm_ms;                /* longest lock.lease_ms seen (mu) */
    /* current and epoch as one word (epoch << 8 | current), written under
     * fo_mu with them: an acquisition takes its engine and the epoch its
     * fence will carry in one read, so a switch in between cannot give an
     * old engine's counter the new epoch (tokens would go backwards). */
    atomic_uint_fast64_t route;
    struct cerb_notify *nt;              /* callback thread (notify.c) */
    /* The pinned engine while it is not current (it would not open), else
     * -1; written under fo_mu with pinned and current (health.c). */
    atomic_int pin_pending;
    /* ---- the idempotency guard (guard/, DESIGN.md §11) ----
     * Its handles and renewer, made on first use (guard_renew.c); ended
     * by cerb__guard_close_all() in cerb_client_close(). */
    struct cerb_guard_set *_Atomic guards;
    /* closure.c: how long a closure record seen stays trusted (half a
     * lease), and when a refusal last reloaded the file. */
    atomic_int_fast64_t closure_window_ns;
    atomic_int_fast64_t closure_lease_ms;  /* lease_hwm_ms, for the cap */
    atomic_bool closure_claims;            /* failover.switch_claims */
    atomic_int_fast64_t closure_reload_ns;
    atomic_int_fast64_t closure_reload_want; /* a refusal's record epoch: reload */
    atomic_uint_fast64_t closure_reloads;    /* reloads asked for, done */
    /* Started no thread (cerb__client_open_manual): the caller runs the
     * probe rounds, the watchdog and the callbacks as steps. */
    bool manual;
};

/* The engine new acquisitions go to, and the epoch they carry. */
static inline int cerb__route(cerb_client *c, int64_t *epoch)
{
    uint64_t r = atomic_load(&c->route);
    *epoch = (int64_t)(r >> 8);
    return (int)(r & 0xff);
}
/* Refresh c->route from c->current and c->epoch; fo_mu held. */
static inline void cerb__route_update(cerb_client *c)
{
    atomic_store(&c->route, ((uint64_t)atomic_load(&c->epoch) << 8) |
                                (uint64_t)(atomic_load(&c->current) & 0xff));
}

/* client.c */
bool cerb__client_ok(const cerb_client *c);
/* Whether @c is a client opened before fork() by the parent of this
 * process; cerb__client_refused sets EINVAL saying so (else "bad client"),
 * prefixed by @what, and returns it. */
bool cerb__client_forked(const cerb_client *c);
cerb_status cerb__client_refused(const cerb_client *c, const char *what);
/* Snapshot of settings that a lock call needs, read under the client lock. */
struct cerb_call_cfg {
    int64_t lease_ms;
    bool renew, fair;
    struct cerb_retry_config retry;
    int64_t epoch;
};
void cerb__client_call_cfg(cerb_client *c, struct cerb_call_cfg *out);
/* A copy of the reloadable failover settings (and the longest lock.lease_ms
 * this client has had, which every grace must cover), taken under c->mu: a reload frees the configuration it replaces, so other threads
 * must not keep pointers into c->cfg. May be called with fo_mu held (lock
 * order: fo_mu, then c->mu). */
void cerb__client_failover_cfg(cerb_client *c, struct cerb_failover_config *fo, int64_t *lease_ms);
struct cerb_slot *cerb__slot_get(cerb_client *c, const char *name);
/* A new slot for @name that no lookup finds (struct cerb_slot.unlisted),
 * for the handles of one primitive's acquisition; NULL on OOM. */
struct cerb_slot *cerb__slot_private(cerb_client *c, const char *name, int prim);
/* One more reference to s (a hold sharing its handle's private slot). */
void cerb__slot_ref(cerb_client *c, struct cerb_slot *s);
void cerb__slot_put(cerb_client *c, struct cerb_slot *s);

/*
 * A client that starts no background thread, for the deterministic
 * simulation (tests/sim/): like cerb_client_open(path), but probe rounds
 * (cerb__prober_round), the watchdog's work (cerb__watchdog_step) and the
 * queued callbacks (cerb__notify_run) happen only when the caller runs
 * them, and the configuration file is reloaded only by cerb_client_reload.
 * Everything else — and production clients — is unchanged.
 */
cerb_status cerb__client_open_manual(cerb_client **out, const char *path);

/* lock.c */
/* A live handle the API may take: not a hold object's private handle
 * (a cerb_hold * passed where a cerb_lock * is expected). */
bool cerb__lock_ok(const cerb_lock *l);
/* A live handle, a hold's private one included (hold.c, cancel.c). */
bool cerb__lock_alive(const cerb_lock *l);
/* cerb_lock_interrupt for any live handle. */
void cerb__lock_interrupt(cerb_lock *l);
/* EINVAL for a handle cerb__lock_ok refused: "@what", or why its client
 * cannot be used in a forked child. */
cerb_status cerb__lock_refused(const cerb_lock *l, const char *what);
/* inflight.c: acquisitions inside an engine call (lock.c adds and removes
 * them); after a switch to engine `to` those waiting elsewhere move there. */
void cerb__inflight_add(cerb_client *c, struct cerb_waiter *w);
void cerb__inflight_del(cerb_client *c, struct cerb_waiter *w);
void cerb__inflight_follow_switch(cerb_client *c, int to);
cerb_status cerb__lock_acquire(cerb_lock *l, int64_t deadline_ns, bool interruptible,
                               bool try_only);
cerb_status cerb__lock_release_all(cerb_lock *l);
/* An acquisition for thread `me` (reentrant) or for CERB_HOLDER_OBJECT
 * (not reentrant: the handle's hold object). */
cerb_status cerb__lock_acquire_as(cerb_lock *l, int64_t deadline_ns, bool interruptible,
                                  bool try_only, uint64_t me);
/* The state of a hold in force: its own, or LOST once its deadline (with
 * the records it relies on) has passed, before the watchdog looks.
 * slot->mu held. */
enum cerb_lock_state cerb__hold_state(cerb_client *c, const struct cerb_engine_hold *h);
/* Release the object hold of handle l; CERB_NOT_OWNER when it has none. */
cerb_status cerb__lock_release_object(cerb_lock *l);
/* The engine index of the hold the calling thread (or, for a hold
 * object's handle, the object) has through l; -1 when none. */
int cerb__lock_engine_idx(cerb_lock *l);
/* Does a thread hold the name through handle l, or wait in it? */
bool cerb__lock_busy(cerb_lock *l);
/* A lock name every configured engine accepts; CERB_EINVAL with the reason. */
cerb_status cerb__lock_name_check(cerb_client *c, const char *name);
/* Free an engine hold with what it owns (its priv and value). */
void cerb__engine_hold_free(struct cerb_engine_hold *h);
/* Make h a hold for prim in layout variant, with its own copy of value
 * (len bytes; ignored for the mutex). CERB_ENOMEM. */
cerb_status cerb__engine_hold_prim(struct cerb_engine_hold *h, int prim, int variant,
                                   const void *value, size_t len);
/* A handle filled with its options: join @name's slot and the client's
 * list, and come alive (magic). */
cerb_status cerb__lock_enlist(cerb_client *c, const char *name, cerb_lock *l);
/* As cerb__lock_enlist, on slot s (a reference the handle takes over). */
void cerb__lock_enlist_slot(cerb_client *c, struct cerb_slot *s, cerb_lock *l);
/* cerb_lock_new with a private slot for primitive prim (semaphore.c,
 * rwlock.c): its holds queue on the server only. */
cerb_status cerb__lock_new_private(cerb_client *c, const char *name, const cerb_lock_opts *opts,
                                   int prim, cerb_lock **out);
/* Leave the client's list and the slot, and free l (or leave it to the
 * callback thread while its lost callback runs). Holds nothing. */
void cerb__lock_retire(cerb_lock *l);
/* cancel.c: take @k for one call through handle @l (NULL: a call that
 * cannot be interrupted midway). CERB_OK, CERB_INTERRUPTED (already
 * fired) or CERB_EINVAL (another call has it). */
cerb_status cerb__cancel_attach(cerb_cancel *k, cerb_lock *l);
/* A call given @k (may be NULL) failed before attaching it: keep its
 * text there too, unless another call has it. Returns st. */
cerb_status cerb__cancel_note(cerb_cancel *k, cerb_status st);
/* The call is over: keep its error text (none for CERB_OK) and let go. */
void cerb__cancel_detach(cerb_cancel *k, cerb_status st);

/* waitq.c — the local FIFO per slot. slot->mu held for all. */
void cerb__waitq_push(struct cerb_slot *s, struct cerb_waiter *w);
void cerb__waitq_remove(struct cerb_slot *s, struct cerb_waiter *w);
/* Wait until w is at the head and the slot is not occupied, or deadline, or
 * interrupt. Returns CERB_OK (w still queued, caller takes the slot),
 * CERB_TIMEOUT or CERB_INTERRUPTED (w removed). */
cerb_status cerb__waitq_wait(struct cerb_slot *s, struct cerb_waiter *w,
                             int64_t deadline_ns);
/* The slot became free: wake the head waiter. */
void cerb__waitq_wake(struct cerb_slot *s);

/* watchdog.c */
cerb_status cerb__watchdog_start(cerb_client *c);
void cerb__watchdog_stop(cerb_client *c);
/* A manual client: do what the watchdog's threads would have done by now
 * (losses, due renewals sent and applied, orphans released). Returns the
 * time it wants to run next (CERB_DEADLINE_NEVER: nothing tracked). */
int64_t cerb__watchdog_step(cerb_client *c);
/* A manual client: the deadline thread's part of a step alone (no I/O);
 * returns when it wants to look again. */
int64_t cerb__watchdog_deadlines(cerb_client *c);
/* Start tracking a fresh hold (renewal and loss detection). */
void cerb__watchdog_add(cerb_client *c, struct cerb_engine_hold *h);
/* Stop tracking; withdraws a queued renewal of h and waits for one on the
 * wire (one engine call, bounded by its op timeout), so that a release is
 * never overtaken by a renewal. Never waits for a callback. */
void cerb__watchdog_remove(cerb_client *c, struct cerb_engine_hold *h);
/* Take over a hold whose acquire may have landed on a failing engine:
 * release it there in the background until definite, or until its lease
 * must have run out; then free it. */
void cerb__watchdog_orphan(cerb_client *c, struct cerb_engine_hold *h);
/* Engine event sink (cerb_engine_env.event). */
void cerb__watchdog_event(void *ud, cerb_engine_event ev, const char *name,
                          const char *token);

/* notify.c — the callback thread: lost and switch callbacks run there, one
 * at a time, with no library mutex held; nothing in the library waits for
 * them. Enqueueing takes only the notifier's leaf mutex. */
cerb_status cerb__notify_start(cerb_client *c);
/* Queue l's lost callback (cb, ud as set when the loss was found). Returns
 * false only when out of memory (the caller tries again later). */
bool cerb__notify_lost(cerb_client *c, cerb_lock *l, void (*cb)(cerb_lock *, void *), void *ud);
/* Queue guard attempt g's lost callback (guard_renew.c); as above. */
bool cerb__notify_guard_lost(cerb_client *c, cerb_guard *g, void (*cb)(cerb_guard *, void *),
                             void *ud);
/* Queue hold object h's lost callback (watchdog.c, hold.c); as above. */
bool cerb__notify_hold_lost(cerb_client *c, struct cerb_hold *h, void (*cb)(cerb_hold *, void *),
                            void *ud);
/* Queue the lost callback of hold object o (a permit's or a hold's) once;
 * o->l.slot->mu held. False only when out of memory. */
bool cerb__hold_tell_locked(cerb_client *c, struct cerb_hold *o);
/* Queue permit p's lost callback; as cerb__notify_hold_lost. */
bool cerb__notify_permit_lost(cerb_client *c, cerb_permit *p, void (*cb)(cerb_permit *, void *),
                              void *ud);
/* Queue read-write lock rw's lost callback (rwlock.c); as above. */
bool cerb__notify_rwlock_lost(cerb_client *c, cerb_rwlock *rw, void (*cb)(cerb_rwlock *, void *),
                              void *ud);
/* A hold of rw's was lost (watchdog.c): queue rw's callback (its leaf
 * mutex taken here). False only when out of memory. */
bool cerb__rwlock_lost(cerb_client *c, cerb_rwlock *rw);
/* Queue election e's lost callback (election.c); as above. */
bool cerb__notify_election_lost(cerb_client *c, cerb_election *e,
                                void (*cb)(cerb_election *, void *), void *ud);
/* The term held through hold object o of election e is lost (watchdog.c):
 * queue e's callback once per term, unless o is no longer e's term. The
 * term's slot->mu held. False only when out of memory. */
bool cerb__election_lost_locked(cerb_client *c, cerb_election *e, struct cerb_hold *o);
/* Queue a switch callback (names copied), if one is registered. */
void cerb__notify_switch(cerb_client *c, const char *from, const char *to, const char *why);
void cerb__notify_set_switch_cb(cerb_client *c,
                                void (*cb)(const char *, const char *, const char *, void *),
                                void *ud);
/* A handle (a cerb_lock or a cerb_guard) is being freed (magic already
 * dead): drop its queued callbacks.
 * Returns true when its callback is running: the notifier then frees the
 * handle's memory when the callback returns, and the caller must not. */
bool cerb__notify_forget(cerb_client *c, const void *obj);
/* A manual client: call the queued callbacks now, on this thread, with no
 * library mutex held. */
void cerb__notify_run(cerb_client *c);
/* Close, first step: no callback starts from now on; queued ones are
 * dropped. Never waits for a running callback. */
void cerb__notify_stop(cerb_client *c);
/* Close, last step: join the thread, or — when a callback is still
 * running — leave it to free the client's memory (returns true: the caller
 * must not free c). */
bool cerb__notify_finish(cerb_client *c);

/* health.c — breakers, selection, switching, safe-switch gate */
int64_t cerb__now_ms(void);
void cerb__health_init(cerb_client *c);
/* A real call's outcome on engine idx (only hard failures count as bad;
 * successes are batched without a lock). */
void cerb__health_ok(cerb_client *c, int idx);
void cerb__health_fail(cerb_client *c, int idx, const char *what);
/* A probe's outcome (prober thread). */
void cerb__health_probe(cerb_client *c, int idx, bool ok, int64_t latency_us);
/* Re-run the selector; switches when it says so. */
void cerb__health_reselect(cerb_client *c);
/* Switch to `to`; `pin` 1 pins it, 0 leaves pinning alone, -1 unpins.
 * Returns the new current index. */
int cerb__client_switch(cerb_client *c, int to, const char *why, int pin);
#define CERB_PIN_CONFIG 2 /* pin value: pinned by the configuration file */
/* Wait until engine idx may grant `name`: every engine switched away from
 * within its grace period must confirm the name is free there, or the
 * grace must run out. CERB_OK, CERB_BUSY (deadline 0), CERB_TIMEOUT,
 * CERB_INTERRUPTED. */
cerb_status cerb__switch_gate(cerb_client *c, int idx, struct cerb_slot *s,
                              const cerb_engine_lock *lk, int64_t deadline_ns,
                              const atomic_int *intr);
/* Is any engine other than idx gated (so a grant on idx must be checked
 * against it once more)? Lock-free. */
bool cerb__gate_any(cerb_client *c, int idx);
/* Must a grant on idx of slot s be confirmed after it (asked again, claims
 * taken)? True when some engine other than idx is gated and did not say s
 * was free under the closure record seen now (closure.c): a process that
 * did not switch may be granted there. */
bool cerb__gate_confirm_any(cerb_client *c, int idx, const struct cerb_slot *s);
/* Is engine i gated and answering (not in its question back-off), so that
 * a grant elsewhere should take a claim there? Lock-free but for fo_mu. */
bool cerb__gate_claimable(cerb_client *c, int i);
/* Whether engine i is gated (the guard consults it: it may hold records);
 * if so, *heard_ns = the latest of when the gate was set, its last answer
 * and its first silence since: others may have written there until then. */
bool cerb__gate_heard(cerb_client *c, int i, int64_t *heard_ns);
/* A claim or question to gated engine i got no answer (back-off). */
void cerb__gate_no_answer(cerb_client *c, int i);

/* closure.c — closure records (DESIGN.md §5) */
/* Read, and write where missing or older, the record this client's file
 * wants on every open engine (at open, after a reload, each probe round). */
void cerb__closure_round(cerb_client *c);
/* Is engine i closed to every grant by a record seen recently at this
 * client's epoch? Then *gen = the generation answers are kept under. */
bool cerb__closure_holds(cerb_client *c, int i, uint64_t *gen);
/* Engine i refused a grant by a record of record_epoch: when that is newer
 * than ours, ask the probe thread to reload the file (no I/O here). */
void cerb__closure_refused(cerb_client *c, int i, int64_t record_epoch);
/* The engines (bits) a grant on idx of slot s relies on by their closure
 * records rather than a claim: gated, closed by a record seen now. */
uint32_t cerb__closure_relied(cerb_client *c, int idx);
/* How long a hold relying on the records of `mask` may stay valid: a
 * lease, less drift, past the last reading of each as wanted (a record lost
 * after it is restored before anyone is granted there only if a client
 * reads it within the quarantine of a lease).
 * CERB_DEADLINE_NEVER for none. */
int64_t cerb__closure_cap(cerb_client *c, uint32_t mask);
/* A hold's deadline with the bound of the records it relies on. */
int64_t cerb__hold_until(cerb_client *c, const struct cerb_engine_hold *h);
/* The probe thread: the reload asked for, if any (at most every 200 ms);
 * closure_reloads counts the requests handled. */
void cerb__closure_reload_if_wanted(cerb_client *c);

/* prober.c: the probe thread (only with two or more engines). */
cerb_status cerb__prober_start(cerb_client *c);
void cerb__prober_stop(cerb_client *c);
/* config_watch.c: the configuration file's watch (failover.watch_config),
 * calling `reload` (cerb_client_reload) when the file changes. */
cerb_status cerb__config_watch_start(cerb_client *c, cerb_status (*reload)(cerb_client *c));
void cerb__config_watch_stop(cerb_client *c);
/* One probe round: probe (or open) every engine, feed the breakers, let the
 * selector switch. The probe thread runs it every probe_interval_ms; a
 * manual client's caller runs it itself. */
void cerb__prober_round(cerb_client *c);
/* Open engine i if it is not (bounded by its connect timeout). */
cerb_status cerb__client_open_engine(cerb_client *c, size_t i);

/* Deadline from a grant: sent + ttl × (1 − drift); NEVER for ttl 0
 * (watchdog.c). */
int64_t cerb__grant_deadline(const cerb_grant *g);
/* Public fencing token from an engine counter and the epoch. */
uint64_t cerb__fence_compose(int64_t epoch, uint64_t counter);

/* guard/guard_renew.c: end every guard handle still open, stop the guard
 * renewer (cerb_client_close, after the watchdog, before the engines). */
void cerb__guard_close_all(cerb_client *c);
/* A manual client: what the guard's renewers and deadline thread would have
 * done by now (claims past their deadline LOST, due renewals and orphans
 * sent). Returns when it wants to run next (CERB_DEADLINE_NEVER: nothing). */
int64_t cerb__guard_step(cerb_client *c);
/* A manual client: the guard's deadline thread alone (no I/O). */
int64_t cerb__guard_deadlines(cerb_client *c);

#endif
