/*
 * script_engine.h — two in-memory engines, "sa" and "sb", whose server the
 * test scripts: each keeps a table of names (owner token, lease end, fence
 * counter) shared by every client of the process, as one server would be,
 * and can be made to refuse to open, to fail every call (down), to fail only
 * its health probes while lock calls still succeed (a gray failure), to lose
 * the reply of the next acquire after it took effect, or to answer
 * check_owner with a chosen TTL. Each server also keeps the idempotency
 * guard's records (cerb_engine_ops version 2: id, running or done, token,
 * expiry, result), under the same knobs as the names, plus a few of the
 * guard's own (lost replies, a slow server, broken variants for the
 * simulation's self-tests). For unit tests of the core's failover and
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
    /* A server slower than the client's operation timeout: every request
     * reaches it fail_ms late, just as the client gives up, and then takes
     * effect (lock and guard calls alike) while the client reports EIO
     * with outcome UNKNOWN; reads (check_owner, held, guard_check) and
     * probes simply fail after fail_ms. */
    bool slow;
    /* The next guard call of each kind takes effect, then reports EIO
     * with outcome UNKNOWN (its reply lost). renew_fails, renew_delay_ms
     * and check_fails apply to the guard's renewals and checks too. */
    bool lose_guard_begin, lose_guard_renew, lose_guard_finish;
    /* BROKEN on purpose, for the simulation's self-tests of its guard
     * oracle: guard_begin claims a record that another attempt's claim
     * holds; guard_finish(1) deletes the record instead of keeping it;
     * a guard call that gets no answer takes guard_stall_ms (> 0) instead
     * of fail_ms, as an engine ignoring its operation timeout would. */
    bool guard_grant_twice;
    bool guard_forget_done;
    int64_t guard_stall_ms;
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
/* Server s's guard record `id` (64 hex chars), as a check of the server
 * would read it now: state 'R' (running) or 'D' (done), 0 when there is
 * none (never written, deleted or expired). */
struct script_guard_record {
    char state;
    char token[33];
    int64_t expires_ns;  /* on cerb_monotime; CERB_DEADLINE_NEVER: kept forever */
};
/* Fill *out with server s's record `id`; true when there is one. */
bool script_engine_guard_record(enum script_server s, const char *id,
                                struct script_guard_record *out);
/* Drop every guard record of server s (as a server restarted without its
 * data would), leaving the names alone. */
void script_engine_guard_wipe(enum script_server s);
/* Guard calls made on server s (answered or not) since the last reset. */
long script_engine_guard_calls(enum script_server s);
/* Calls of open() made on server s (counted as they start). */
long script_engine_open_calls(enum script_server s);
/* Calls of check_owner() made on server s. */
long script_engine_check_calls(enum script_server s);
/* Calls of held() answered by server s. */
long script_engine_held_calls(enum script_server s);

#endif
