/*
 * sim.h — the deterministic simulation of the core (issue 11 §2).
 *
 * A world of a few clients (manual clients: no threads) over the two
 * scripted servers "sa" and "sb", on a simulated clock. sim_world.c owns the
 * clock and runs each client's background work (watchdog, probe rounds,
 * callbacks) at the simulated times its threads would; sim_check.c is the
 * oracle of DESIGN.md §5a, told of every grant, release and step;
 * sim_main.c draws a seeded schedule of calls and faults and reports.
 */
#ifndef CERB_SIM_H
#define CERB_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "cerberus.h"

#define SIM_MAX_CLIENTS 5
#define SIM_NAMES 3
#define SIM_SERVERS 2

/* A client's hold of one name, as the application sees it. */
struct sim_hold {
    cerb_lock *l;            /* the client's handle for the name */
    unsigned count;          /* reentrant holds (0: not held) */
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

struct sim_client {
    int id;                  /* also its script_engine client id (1..) */
    cerb_client *c;
    bool paused, crashed;
    bool reload_due;         /* the config changed while it was paused */
    bool busy;               /* inside a call or a timer: no timer of its own */
    int64_t next_wd_ns, next_probe_ns;
    struct sim_hold h[SIM_NAMES];
};

struct sim_params {
    uint64_t seed;
    int steps;
    bool verbose;
    int n_clients;
    int64_t lease_ms;
    int64_t fail_ms;         /* what a call with no answer costs: an op timeout */
    int64_t switch_grace_ms; /* -1: the safe default */
    const char *broken;      /* NULL, "grant-twice" or "grace0" */
    bool faults;             /* false: calls only, no fault (a baseline) */
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
    bool intr_sent;          /* interrupted once during this call */
    /* Partitions: when each client was last cut off each server (0 never).
     * A client cut off the engine others hold a name on cannot tell them
     * from a dead server: after the grace it grants, a documented limit
     * (README, "What a partition can still do") that the oracle counts
     * apart instead of failing. */
    int64_t cut_end_ns[SIM_MAX_CLIENTS][SIM_SERVERS];
    int64_t up_again_ns[SIM_SERVERS]; /* when each server last came back up */
    long partition_overlaps;
    long outage_overlaps;    /* see sim_check.c, "outage" */
    /* statistics */
    long grants, busy, timeouts, errors, lost_cbs, calls, interrupted, restarts;
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

/* sim_check.c — the oracle. Each returns the number of violations found
 * (printed with the step). */
void sim_check_reset(void);
/* A call of client k granted name n (count 0 -> 1). */
int sim_check_grant(struct sim_world *w, struct sim_client *k, int n);
/* Every invariant that can be looked at between steps. */
int sim_check_step(struct sim_world *w);
/* A call took `took_ns` and was allowed `bound_ns`. */
int sim_check_bound(struct sim_world *w, const char *what, int64_t took_ns, int64_t bound_ns);
/* A configuration switch (epoch bump) took effect in every running client. */
void sim_check_epoch_bump(struct sim_world *w);
long sim_check_violations(void);

#endif
