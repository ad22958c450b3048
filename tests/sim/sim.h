/*
 * sim.h — the deterministic simulation of the core (issue 11 §2).
 *
 * A world of a few clients (manual clients: no threads) over the two
 * scripted servers "sa" and "sb", on a simulated clock. sim_world.c owns the
 * clock and runs each client's background work (watchdog, guard renewers,
 * probe rounds, callbacks) at the simulated times its threads would;
 * sim_check.c is the oracle of DESIGN.md §5a and of its adaptation to the
 * idempotency guard (§11), told of every grant, release, guard call and
 * step; sim_main.c draws a seeded schedule of calls and faults and reports.
 */
#ifndef CERB_SIM_H
#define CERB_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "cerberus.h"

#define SIM_MAX_CLIENTS 5
#define SIM_NAMES 3
#define SIM_SERVERS 2
#define SIM_GKEYS 4          /* guard operations: (scope, key) pairs */
#define SIM_GRESULTS 64      /* results given to a successful finish, per key */
#define SIM_GSUCCESSES 8     /* successes remembered per key */

/* A client's hold of one name, as the application sees it. */
struct sim_hold {
    cerb_lock *l;            /* the client's handle for the name */
    unsigned count;          /* reentrant holds (0: not held) */
    cerb_hold *obj;          /* held by a hold object instead (count 1) */
    int engine;              /* where it was granted (0 sa, 1 sb) */
    char token[33];          /* owner token on that server */
    uint64_t fence;          /* public fencing token */
    int64_t granted_ns;      /* when the call returned it */
    int64_t lost_cb_ns;      /* lost callback ran (0: not yet) */
    bool lost_late_reported;
    bool partition_overlap;  /* granted over a hold it could not see (below) */
    /* At its grant: which servers this client could not reach (down or cut
     * off: no claim could be taken there), and how often each client had
     * switched engines. */
    bool unreachable_at_grant[SIM_SERVERS];
    uint64_t switches_at_grant[SIM_MAX_CLIENTS];
};

/* What the oracle keeps of an attempt's begin: where its record went and
 * what the world looked like then (the limits are judged from it). */
struct sim_begin_ctx {
    int engine;              /* the engine its record is on (0 sa, 1 sb) */
    int client;              /* its client's id */
    int64_t sent_ns;         /* when begin was called */
    int64_t begun_ns;        /* when it returned */
    bool unreachable_at_begin[SIM_SERVERS]; /* down, slow or cut off then */
    uint64_t switches_at_begin[SIM_MAX_CLIENTS];
};

/* A client's attempt at one guard operation, as the application sees it. */
struct sim_attempt {
    cerb_guard *g;           /* begin returned CERB_OK and it is not freed */
    int seq;                 /* numbers its result: unique per world */
    bool degraded;           /* cerb_guard_degraded() at begin */
    bool limit_overlap;      /* began over another attempt as a limit (counted) */
    struct sim_begin_ctx b;
    int64_t lost_cb_ns;      /* its lost callback ran (0: not yet) */
    int lost_cbs;            /* times it ran */
    /* LOST before begin returned (its claim lapsed while begin asked the
     * other engines): the callback, set after that, is not called — the
     * loss was found when none was set (cerb_guard_on_lost). */
    bool lost_at_begin;
    /* A finish(1) whose answer was lost left it open: the record may be a
     * done-record since then, kept keep_ms from that request (0: none). */
    int64_t unconfirmed_done_ns;
    bool late_reported, server_reported;
};

/* A success the application was told of: finish(1) returned CERB_OK. */
struct sim_success {
    int64_t from_ns, until_ns; /* answered CERB_DUPLICATE within these */
    struct sim_begin_ctx b;    /* its attempt's */
    int mirrors;               /* engines its mirror claims were on (bits) */
    bool degraded;             /* its attempt was degraded (an engine not asked) */
    int64_t keep_ms;           /* its attempt's */
};

struct sim_client {
    int id;                  /* also its script_engine client id (1..) */
    cerb_client *c;
    bool paused, crashed;
    bool reload_due;         /* the config changed while it was paused */
    bool busy;               /* inside a call or a timer: no timer of its own */
    int64_t next_wd_ns, next_probe_ns, next_guard_ns;
    struct sim_hold h[SIM_NAMES];
    struct sim_attempt a[SIM_GKEYS];
};

struct sim_params {
    uint64_t seed;
    int steps;
    bool verbose;
    int n_clients;
    int64_t lease_ms;
    int64_t fail_ms;         /* what a call with no answer costs: an op timeout */
    int64_t switch_grace_ms; /* -1: the safe default */
    const char *broken;      /* NULL, or a --broken mode (sim_main.c) */
    bool faults;             /* false: calls only, no fault (a baseline) */
    int64_t running_ms;      /* the guard's claims (guard.running_ms) */
    int64_t keep_ms;         /* guard.keep_ms */
};

/* The guard's statistics, per world and in total (sim_main.c prints them). */
enum sim_gstat {
    GS_BEGINS, GS_OK, GS_DEGRADED, GS_WITH_MIRRORS, GS_DUPS, GS_BUSY, GS_UNAVAILABLE,
    GS_OTHER,                /* begin answered none of the above */
    GS_FINISHES, GS_FINISH_OK, GS_FINISH_LOST,
    GS_FINISH_OPEN,          /* a success not confirmed: the attempt stays open */
    GS_FREES, GS_LOST_CBS,
    GS_SILENCED,             /* engines made silent while attempts had mirrors there */
    /* overlaps counted as limits */
    GS_OVERLAP_DEGRADED, GS_OVERLAP_WIPED, GS_OVERLAP_PARTITION, GS_OVERLAP_OUTAGE,
    GS_OVERLAP_KEEP,         /* a success kept longer than a later call assumed */
    GS_LOST_AT_BEGIN,        /* LOST as begin returned */
    GS_COUNT
};

struct sim_world {
    struct sim_params p;
    struct sim_client cl[SIM_MAX_CLIENTS];
    char cfg_path[256];
    int64_t epoch;
    char active[8];
    int step;
    bool closing;            /* teardown: naps only pass time */
    cerb_lock *intr_target;  /* the handle a call waits on, interruptible */
    cerb_cancel *intr_cancel; /* or the cancel of a hold object's call */
    struct sim_client *caller; /* inside a user call of this client */
    bool intr_sent;          /* interrupted once during this call */
    /* Partitions: when each client was last cut off each server (0 never).
     * A client cut off the engine others hold a name on cannot tell them
     * from a dead server: after the grace it grants, a documented limit
     * (README, "What a partition can still do") that the oracle counts
     * apart instead of failing. */
    int64_t cut_end_ns[SIM_MAX_CLIENTS][SIM_SERVERS];
    int64_t up_again_ns[SIM_SERVERS]; /* when each server last came back up
                                         (or answered in time again, after slow) */
    int64_t wiped_ns[SIM_SERVERS];    /* when each lost its guard records */
    long partition_overlaps;
    long outage_overlaps;    /* see sim_check.c, "outage" */
    /* The guard: successes and stored results per operation. */
    struct sim_success gsucc[SIM_GKEYS][SIM_GSUCCESSES];
    int n_gsucc[SIM_GKEYS];
    char gresults[SIM_GKEYS][SIM_GRESULTS][24];
    int n_gresults[SIM_GKEYS];
    int gseq;
    /* statistics */
    long grants, busy, timeouts, errors, lost_cbs, calls, interrupted, restarts;
    long gs[GS_COUNT];       /* the guard's (enum sim_gstat) */
};

extern const char *const sim_names[SIM_NAMES];

/* sim_world.c */
int64_t sim_now(void);
/* Simulated time callers spent waiting for other clients' background work
 * that overran their naps (one OS thread runs all): not theirs to count. */
int64_t sim_stolen_ns(void);
/* Install the clock hooks and start the clock for a new seed. */
void sim_clock_reset(struct sim_world *w);
void sim_log(struct sim_world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Write the shared configuration file (active, epoch) for the world. */
bool sim_write_config(struct sim_world *w);
bool sim_open_clients(struct sim_world *w);
/* Open client slot i (a process starting, or restarting after a crash). */
bool sim_open_client(struct sim_world *w, int i);
void sim_close_clients(struct sim_world *w);
/* Let `ms` of simulated time pass, running every client's background work
 * at the times its threads would have (paused and crashed clients' not). */
void sim_advance(struct sim_world *w, int64_t ms);
/* Around a user call of client k: callbacks delivered, its timers
 * refreshed after. */
void sim_call_begin(struct sim_world *w, struct sim_client *k);
void sim_call_end(struct sim_world *w, struct sim_client *k);
/* Was client k cut off `server` at any time since `since`? */
bool sim_was_cut(const struct sim_world *w, const struct sim_client *k, int server, int64_t since);
/* Resume a paused client: its pending reload, then its overdue work. */
void sim_resume(struct sim_world *w, struct sim_client *k);
/* The broken mode "guard-starve": client k's guard renewer and deadline
 * thread never run. */
bool sim_guard_starved(const struct sim_world *w, const struct sim_client *k);
/* A hold object's lost callback (ud: its struct sim_hold). */
void sim_hold_lost_cb(cerb_hold *o, void *ud);

/* The guard operations: scope and key of each. */
extern const char *const sim_gscopes[SIM_GKEYS];
extern const char *const sim_gkeys[SIM_GKEYS];

/* sim_check.c — the oracle. Each returns the number of violations found
 * (printed with the step). */
void sim_check_reset(void);
/* A call of client k granted name n (count 0 -> 1). */
int sim_check_grant(struct sim_world *w, struct sim_client *k, int n);
/* Every invariant that can be looked at between steps. */
int sim_check_step(struct sim_world *w);
/* A call took `took_ns` and was allowed `bound_ns`; reported as `inv`
 * ("5a.4" for the lock's calls, "G.d" for the guard's). */
int sim_check_bound(struct sim_world *w, const char *inv, const char *what, int64_t took_ns,
                    int64_t bound_ns);
/* A configuration switch (epoch bump) took effect in every running client. */
void sim_check_epoch_bump(struct sim_world *w);
/* A guard begin of client k on operation i returned st (at sim_now(),
 * called at t0); for CERB_DUPLICATE, the result it answered. The attempt's
 * context (k->a[i].b) is filled for CERB_OK. */
int sim_check_guard_begin(struct sim_world *w, struct sim_client *k, int i, cerb_status st,
                          const void *result, size_t len, int64_t t0);
/* A finish of client k's attempt on operation i (called at t0, with the
 * result the world made) returned st; before the handle is freed. */
int sim_check_guard_finish(struct sim_world *w, struct sim_client *k, int i, int succeeded,
                           const char *result, cerb_status st, int64_t t0);
/* A guard finish or free took `took_ns`; cerberus.h allows `doc_ops`
 * operation timeouts per claim, for an attempt with `mirrors` claims on
 * engines switched from besides its own. */
int sim_check_guard_bound(struct sim_world *w, const char *what, int64_t took_ns, int doc_ops,
                          int mirrors);
/* A guard lost callback ran now, for handle g. */
int sim_check_guard_lost_cb(struct sim_world *w, const cerb_guard *g);
/* Has server s been silent (down or slow) at any time since `since`? */
bool sim_was_silent(const struct sim_world *w, int server, int64_t since);
/* The kinds of violation reported (the --expect-violation check). */
bool sim_check_reported(const char *inv);
long sim_check_violations(void);

#endif
