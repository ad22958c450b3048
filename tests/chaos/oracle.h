/*
 * oracle.h — the chaos suite's shared-memory oracle (DESIGN.md §5a, §14).
 *
 * Every worker process maps one file and records into it, from inside each
 * critical section, who is holding which name since when, with which fencing
 * token and on which engine; the lost callback and cerb_lock_state() record
 * when a holder was told LOST; every public call records its duration and its
 * documented bound. All processes run on one host, so CLOCK_MONOTONIC is one
 * exact real-time axis for all of them. The report then counts what §5a
 * forbids: unsafe overlaps, token regressions, tokens of 0 and overrunning
 * calls, and what it requires: acquisitions on every engine. Guard attempts
 * (cerb_guard_begin) are recorded the same way as claims without a token,
 * with the successes that must keep their key from running again (§11).
 *
 * Not part of the library: test code, built only under tests/chaos/.
 */
#ifndef CERB_CHAOS_ORACLE_H
#define CERB_CHAOS_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORACLE_MAX_NAMES 16     /* distinct lock names per scenario */
#define ORACLE_MAX_HOLDERS 64   /* simultaneous holds of one name (P × T) */
#define ORACLE_MAX_ENGINES 8    /* engine names, "?" when unknown */
#define ORACLE_MAX_CLIENTS 64   /* client ids (worker processes) */
#define ORACLE_MAX_MARKS 32     /* `cerberus switch` marks */
#define ORACLE_MAX_NOTES 64     /* first anomalies kept verbatim */
#define ORACLE_NAME_MAX 64
#define ORACLE_NOTE_MAX 200

typedef struct oracle oracle;

/* The counts a scenario is judged by. */
typedef struct oracle_report {
    uint64_t acquisitions;                       /* enters, all engines */
    uint64_t acq_engine[ORACLE_MAX_ENGINES];     /* enters per engine id */
    char engine_name[ORACLE_MAX_ENGINES][16];    /* "" for unused ids */
    uint64_t overlaps_explained;  /* older holder told LOST before newer entered */
    uint64_t overlaps_unsafe;     /* §5a.1 broken */
    uint64_t token_regressions;   /* §5a.3 broken: per engine, per client, after a switch */
    uint64_t zero_tokens;         /* a hold with token 0 */
    uint64_t reruns;              /* a guard key run again within keep_ms of a success (§11) */
    uint64_t overruns;            /* calls longer than their bound + 1 s (§5a.4) */
    uint64_t calls;
    uint64_t lost;                /* holders told LOST */
    uint64_t max_overrun_ms;      /* worst (duration - bound), ms, over all calls */
    unsigned notes;               /* anomalies written to the note list */
} oracle_report;

/*
 * oracle_create — make (truncate) @path and map it as a fresh oracle.
 * oracle_open — map an existing oracle (workers, the report tool).
 * Returns: the oracle, or NULL with errno set. Close with oracle_close().
 */
oracle *oracle_create(const char *path);
oracle *oracle_open(const char *path);
void oracle_close(oracle *o);

/* The clock every record uses: CLOCK_MONOTONIC in ns. */
int64_t oracle_now(void);

/*
 * oracle_enter — @client (its process, one cerb_client) entered the critical
 * section of @name, granted @token by @engine ("?" when it cannot tell) at
 * @t_ns. Checks, against every hold of @name still inside: overlap (explained
 * when that holder was told LOST at or before @t_ns); against earlier grants:
 * token regressions. Returns: a holder id for oracle_leave/oracle_told_lost,
 * or -1 when the tables are full (counted as a note).
 * Thread-safety: any thread of any process mapping the file.
 */
int oracle_enter(oracle *o, const char *name, int client, uint64_t token,
                 const char *engine, int64_t t_ns);

/*
 * oracle_enter_claim — as oracle_enter, for a hold that has no fencing
 * token: an idempotency-guard attempt at the key @name
 * (cerb_guard_begin returned CERB_OK at @t_ns for a call begun at
 * @t_begin_ns). Overlaps are judged as for locks (an attempt whose claim
 * was lost is told so through cerb_guard_on_lost/cerb_guard_state); no
 * token is judged. A claim granted although a success of @name
 * (oracle_done) was certainly still kept — the begin was sent after that
 * finish returned and answered before the finish was sent + its keep_ms —
 * is a rerun.
 * Returns: a holder id, as oracle_enter.
 */
int oracle_enter_claim(oracle *o, const char *name, int client, const char *engine,
                       int64_t t_begin_ns, int64_t t_ns);

/*
 * oracle_enter_unfenced — as oracle_enter, for a lock granted by an engine
 * that has no fencing token (memcached; the token it reports carries
 * the client's epoch and no counter): the
 * overlap rule alone, no token rule, no rerun rule. Returns: a holder id,
 * as oracle_enter.
 */
int oracle_enter_unfenced(oracle *o, const char *name, int client, const char *engine,
                          int64_t t_ns);

/* What a shared hold is (oracle_enter_shared). */
enum oracle_share { ORACLE_PERMITS = 1, ORACLE_READ = 2, ORACLE_WRITE = 3 };

/*
 * oracle_enter_shared — as oracle_enter, for a hold that may share its name
 * (DESIGN.md §16): @share ORACLE_PERMITS with @weight permits of a
 * semaphore of @cap; ORACLE_READ or ORACLE_WRITE of a read-write lock
 * (@weight and @cap ignored). Unsafe when, counting only the holders inside
 * that were not told LOST by @t_ns: the permits inside plus @weight exceed
 * @cap; a writer enters with anybody inside; a reader enters with a writer
 * inside. Tokens: never 0, above every settled switch floor, and above
 * every exclusive grant's (a writer's) recorded before on the engine; a
 * writer's, like a lock's, above every grant's recorded before on the
 * engine (it is granted only once those ahead have left). Concurrent
 * shared grants record in any order, so among them no order is judged.
 */
int oracle_enter_shared(oracle *o, const char *name, int client, uint64_t token,
                        const char *engine, int64_t t_ns, enum oracle_share share,
                        unsigned weight, unsigned cap);

/*
 * oracle_done — cerb_guard_finish(succeeded = 1) of the key @name,
 * called at @t0_ns with keep @keep_ms, returned CERB_OK at @t1_ns: the
 * done-record was written between the two, so no attempt at @name may begin
 * from @t1_ns until @t0_ns + @keep_ms.
 */
void oracle_done(oracle *o, const char *name, int64_t t0_ns, int64_t t1_ns, int64_t keep_ms);

/* oracle_leave — the holder left the critical section at @t_ns. */
void oracle_leave(oracle *o, int holder, int64_t t_ns);

/*
 * oracle_told_lost — the holder was told LOST (callback, or cerb_lock_state)
 * at @t_ns. Only the first report counts. A holder id of -1 is ignored.
 */
void oracle_told_lost(oracle *o, int holder, int64_t t_ns);

/*
 * oracle_call — a public call @what took [@t0_ns, @t1_ns] with a documented
 * bound of @bound_ms; longer than bound + 1 s counts as an overrun.
 */
void oracle_call(oracle *o, const char *what, int64_t t0_ns, int64_t t1_ns,
                 int64_t bound_ms);

/*
 * oracle_mark_switch — a `cerberus switch` finished at @t_ns (epoch bump).
 * Every grant that enters after @t_ns + @settle_ms (the time clients take to
 * reload the file) must rank above every grant that entered before @t_ns.
 */
void oracle_mark_switch(oracle *o, int64_t t_ns, int64_t settle_ms);

/* oracle_report_get — a snapshot of the counts. */
void oracle_report_get(oracle *o, oracle_report *out);

/*
 * oracle_note_get — the @i-th anomaly note (0-based), or NULL past the end.
 * The pointer lives as long as the mapping.
 */
const char *oracle_note_get(oracle *o, unsigned i);

#endif
