/*
 * script_engine.h — two in-memory engines, "sa" and "sb", whose server the
 * test scripts: each keeps a table of names (owner token, lease end, fence
 * counter) shared by every client of the process, as one server would be,
 * and can be made to refuse to open, to fail every call (down), to fail only
 * its health probes while lock calls still succeed (a gray failure), to lose
 * the reply of the next acquire after it took effect, or to answer
 * check_owner with a chosen TTL. For unit tests of the core's failover and
 * ambiguity logic only: real engines are tested against real servers.
 *
 * Register with script_engine_register(), then open clients with
 * `engines = ("sa", "sb");`.
 *
 * For the simulation (tests/sim/) each client can be told apart
 * (script_engine_next_client before it opens): a partition cuts one client
 * off a server others still reach. Every wait and every failed call's
 * latency passes through cerb__nap_ms and every lease is on cerb_monotime,
 * so under the simulation's clock hooks the servers run on simulated time.
 */
#ifndef CERB_SCRIPT_ENGINE_H
#define CERB_SCRIPT_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

enum script_server { SCRIPT_A = 0, SCRIPT_B = 1 };

struct script_knobs {
    bool open_fails;      /* open() refuses: engine never opened */
    int64_t open_delay_ms; /* open() first takes this long (a slow connect) */
    bool down;            /* every call fails with EIO, outcome NO */
    bool probe_fails;     /* probes fail (time out); lock calls succeed */
    bool lose_acquire;    /* next granted acquire reports EIO, outcome UNKNOWN */
    int64_t check_ttl_ms; /* > 0: check_owner reports this TTL */
    bool renew_fails;     /* renewals fail with EIO, outcome NO */
    int64_t renew_delay_ms; /* every renewal first takes this long */
    bool lose_release;    /* next release takes effect, reports EIO */
    bool check_fails;     /* check_owner fails with EIO (no answer) */
    bool lose_renew;      /* next renewal takes effect, reports EIO */
    uint32_t cut;         /* bit i: client i (script_engine_next_client)
                             is partitioned off: its calls fail, EIO, NO */
    int64_t fail_ms;      /* a call that gets no answer (down, cut, reply
                             lost) first takes this long: an op timeout */
    bool grant_twice;     /* BROKEN on purpose: acquire grants a name held
                             by another token (the simulation's self-test) */
    int64_t hold_bound_ms; /* what hold_bound_ms() reports (0 = unknown) */
    /* Called once, without the server's mutex, inside the next acquire
     * just before it looks at the table (then cleared). */
    void (*before_grant)(void *ud);
    void *before_grant_ud;
};

/* Register "sa" and "sb" (idempotent) and clear both servers. */
void script_engine_register(void);
/* The client id (0..31) the next open() records for its instance; 0 is
 * everyone's by default. */
void script_engine_next_client(int id);
/* A copy of server s's knobs (to change one and set them back). */
struct script_knobs script_engine_get(enum script_server s);
/* Server s's record of a name. */
struct script_record {
    char token[33];      /* "" when free (released or expired) */
    int64_t until_ns;    /* lease end, on cerb_monotime */
    int64_t granted_ns;  /* when this token was granted it */
    uint64_t fence;      /* the counter (only grows) */
};
/* Fill *out with server s's record of `name`; true when held now. */
bool script_engine_record(enum script_server s, const char *name, struct script_record *out);
/* Clear the tables and knobs of both servers. */
void script_engine_reset(void);
/* Change a server's knobs (copied under its mutex). */
void script_engine_set(enum script_server s, struct script_knobs k);
/* The token holding `name` on server s now ("" when free); copied into
 * out (33 bytes). Returns true when held. */
bool script_engine_holder(enum script_server s, const char *name, char out[33]);
/* Expire every lease on server s (as a server restarted without data would
 * after its TTLs), keeping the fence counters. */
void script_engine_expire_all(enum script_server s);
/* Set the fence counter of `name` on server s (the next grant gets v+1). */
void script_engine_set_fence(enum script_server s, const char *name, uint64_t v);
/* Calls of open() made on server s (counted as they start). */
long script_engine_open_calls(enum script_server s);
/* Calls of check_owner() made on server s. */
long script_engine_check_calls(enum script_server s);
/* Calls of held() answered by server s. */
long script_engine_held_calls(enum script_server s);

#endif
