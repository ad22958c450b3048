/*
 * mc_internal.h — the memcached engine instance and what its files share.
 *
 * Layout (DESIGN.md §4, docs/engines.md): one item per lock name, key
 * `<memcached.prefix><name>` (or, for a name memcached cannot carry as a
 * key, the binary key prefix || SHA-256(name) sent base64-encoded with the
 * meta `b` flag), value the 32 hex chars of the owner token, expiry the
 * lease in whole seconds rounded up plus two. Acquire is an add-mode `ms`;
 * renew a CAS-checked `ms`, release a CAS-checked `md`: one round trip
 * each, owner-checked on the server by the CAS the grant returned.
 *
 * Restarts. memcached keeps nothing across a restart and its CAS counter
 * starts again, so an old holder's CAS could match a new holder's item.
 * Every new connection therefore reads the server's fingerprint (pid and
 * start time, `stats`) before it carries any lock command; a fingerprint
 * that differs from the last one seen starts a new generation, tells every
 * hold of the instance LOST, and the holds of older generations never send
 * their CAS again (mc_lock.c compares the connection's generation with the
 * hold's). A direct TCP connection cannot outlive the process it talks to,
 * which is what makes this sound; behind a proxy it would not be (the docs
 * say so).
 *
 * Files: mc_conn.c (sockets with deadlines, the line reader, the pool, the
 * fingerprint), mc_proto.c (keys, meta requests, reply parsing),
 * mc_errors.c (replies and wire failures → cerb_status), mc_lock.c (the
 * lock methods), mc_engine.c (the table, open, close).
 */
#ifndef CERB_MC_INTERNAL_H
#define CERB_MC_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "config.h"
#include "engine.h"
#include "sync.h"

/* memcached's key limit, and the longest item expiry it reads as relative
 * (anything above is an absolute Unix time). */
#define MC_KEY_MAX 250
#define MC_TTL_REL_MAX 2592000
/* Seconds added to every expiry (cerb__mc_ttl_s says why). */
#define MC_TTL_MARGIN_S 2
/* A waiter polls at most this long between two looks (and looks at its
 * interrupt flag in between at least every MC_SLICE_MS). */
#define MC_POLL_MAX_MS 100
#define MC_SLICE_MS 50

/* One connection: a socket, a read buffer, and the generation (server
 * process) it was checked against when it was opened. */
struct mc_conn {
    int fd;
    uint64_t gen;
    size_t rpos, rlen;
    struct mc_conn *next;  /* idle list */
    char rbuf[4096];
};

/* A key ready to send: the text token and whether it is base64 (`b`). */
struct mc_key {
    char k[MC_KEY_MAX + 8];
    bool b64;
};

/* A parsed reply line: its two-letter code and the flags we read. */
struct mc_reply {
    char code[3];       /* "HD", "NS", "EX", "NF", "VA", "EN", "MN", … */
    bool has_cas, has_ttl;
    uint64_t cas;       /* c<cas> */
    int64_t ttl_s;      /* t<ttl>: -1 no expiry */
    long vlen;          /* VA <len>: value length, else -1 */
    char value[80];     /* the value (VA), NUL-terminated, cut at 79 bytes */
};

/* A server process as a client can tell it: `stats` pid and start time
 * (time - uptime), and the nonce of the marker item found there. */
struct mc_fp {
    long pid;
    long long start;
    char nonce[33];
};

#define MC_SEEN_MAX 16

struct cerb_engine {
    const struct cerb_config *cfg;
    const struct cerb_memcached_config *mc;
    cerb_engine_env env;
    char host[256];
    char port[8];
    /* The address, resolved once at open (one address only). */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct mc_key mkey;     /* the marker's key (mc_marker.c) */
    int64_t q_s;            /* the quarantine, in server seconds */
    /* The pool: idle connections, and how many are open (idle or taken). */
    cerb_mutex mu;
    cerb_cond cv;
    struct mc_conn *idle;
    int open, max;
    /* The server process (mc_marker.c). fp_mu orders a generation change
     * with the LOST event it sends, so that no grant on the new process
     * comes before that event. Lock order: fp_mu, then mu. */
    cerb_mutex fp_mu;
    bool fp_known;
    struct mc_fp fp;              /* the current one */
    int64_t fp_since_ns;          /* when it became current */
    struct mc_fp seen[MC_SEEN_MAX];
    int n_seen;
    uint64_t warned_gen;          /* settings warned about for this generation */
    uint64_t q_said_gen;          /* quarantine warned about for this generation */
    _Atomic bool fatal;           /* two processes answer: grants refused */
    char fatal_why[640];
    _Atomic uint64_t gen;
    atomic_int_fast64_t q_until_ns; /* the current generation's quarantine end (monotonic) */
    atomic_int_fast64_t max_ttl_ms;  /* the longest expiry sent (hold_bound) */
    struct {
        atomic_uint_fast64_t acquire_calls;
        atomic_uint_fast64_t restarts;
    } stats;
};

/* Per hold (lk->priv): the CAS of our item and the generation it is on. */
struct mc_lock_priv {
    uint64_t cas;   /* 0: unknown (never sent: `C0` means "no check") */
    uint64_t gen;
};

/* ---- mc_conn.c ---- */
/* A connection from the pool (a fresh one is fingerprinted first, which may
 * start a new generation and report LOST). CERB_EIO/CERB_TIMEOUT when none
 * can be had by the deadline. */
cerb_status cerb__mc_take(cerb_engine *e, int64_t deadline_ns, struct mc_conn **out);
/* Give it back; broken (a failure or a timeout on it) closes it. */
void cerb__mc_give(cerb_engine *e, struct mc_conn *c, bool broken);
void cerb__mc_pool_close(cerb_engine *e);
/* Send len bytes, then read one reply line (and its value block for VA),
 * by the deadline. On failure *sent says whether any byte left: the caller
 * then treats the outcome as unknown, and the connection as broken. */
cerb_status cerb__mc_call(struct mc_conn *c, const char *req, size_t len, int64_t deadline_ns,
                          struct mc_reply *r, bool *sent);
/* Read one more reply (the second of a pipelined pair). */
cerb_status cerb__mc_read_reply(struct mc_conn *c, int64_t deadline_ns, struct mc_reply *r);
/* Send a request whose answer is a list of lines up to "END" (stats);
 * each line is handed to fn. */
cerb_status cerb__mc_call_lines(struct mc_conn *c, const char *req, int64_t deadline_ns,
                                void (*fn)(void *ud, const char *line), void *ud);

/* Close every idle connection of a generation before gen (a new one
 * began: those talk to a process that is gone). */
void cerb__mc_pool_drop_older(cerb_engine *e, uint64_t gen);
/* Resolve host:port once (open); CERB_ECONFIG when it names more than one
 * address. */
cerb_status cerb__mc_resolve(cerb_engine *e);

/* ---- mc_marker.c ---- */
/* The marker key, the quarantine length (open; no I/O). */
cerb_status cerb__mc_marker_init(cerb_engine *e);
/* A new connection, before any command: the server's settings, its
 * fingerprint and marker (made when missing), and the connection's
 * generation. An error with *late: it reached a process seen before (a
 * late connection): close it and open another. */
cerb_status cerb__mc_fingerprint(cerb_engine *e, struct mc_conn *c, int64_t deadline_ns,
                                 bool *late);
/* ms left of the quarantine of generation gen (0: none, or gen is not the
 * current one). */
int64_t cerb__mc_quarantine_left(cerb_engine *e, uint64_t gen);
/* The nonce of generation gen into out (33 bytes); false when gen is not
 * the current one. */
bool cerb__mc_gen_nonce(cerb_engine *e, uint64_t gen, char *out);
/* A grant found the marker changed: drop pooled connections so that the
 * next one fingerprints the server again. */
void cerb__mc_marker_suspect(cerb_engine *e);

/* ---- mc_proto.c ---- */
/* The key of `name` under prefix. */
cerb_status cerb__mc_key(const char *prefix, const char *name, struct mc_key *out);
/* Seconds to send for a lease: ceil(ms / 1000) + MC_TTL_MARGIN_S; never 0,
 * which memcached reads as "never expires". CERB_EINVAL above 30 days.
 * Why 2: memcached's clock is a 1 s timer re-armed from inside its own
 * handler, so its ticks drift later (1.1-1.5 ms/s measured); just before
 * the drift crosses a second boundary its current_time lags real time by
 * almost 2 s, then jumps by 2. An item stored in that window with T<n>
 * can die after n - 2 s (measured: 12 ms after a T2 store). One second of
 * margin is thus not enough; two are. */
cerb_status cerb__mc_ttl_s(int64_t lease_ms, int64_t *ttl_s);
/* Parse one reply line (without CRLF). CERB_EPROTO on an error reply or
 * an unknown shape. */
cerb_status cerb__mc_parse(const char *line, struct mc_reply *r);
/* Format a meta request into buf; returns its length, or 0 when it does
 * not fit. `ms`: the token as value. */
size_t cerb__mc_fmt_ms(char *buf, size_t len, const struct mc_key *k, int64_t ttl_s,
                       bool add_mode, uint64_t cas, const char *token);
size_t cerb__mc_fmt(char *buf, size_t len, const char *verb, const struct mc_key *k,
                    const char *flags);

/* ---- mc_errors.c ---- */
/* A reply code that is none of the expected ones: CERB_EPROTO with it. */
cerb_status cerb__mc_unexpected(const char *what, const struct mc_reply *r);
/* A failed call: the outcome for the caller (NO when nothing was sent). */
cerb_outcome cerb__mc_outcome(bool sent);

/* ---- mc_lock.c ---- */
cerb_status cerb__mc_op_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__mc_op_renew(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__mc_op_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__mc_op_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__mc_op_held(cerb_engine *e, const char *name);
cerb_status cerb__mc_op_probe(cerb_engine *e, int64_t timeout_ms);
cerb_status cerb__mc_op_inspect(cerb_engine *e, const char *name, struct cerb_holders *out);

#endif
