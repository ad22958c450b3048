/*
 * redis_conn.h — the Redis engine instance and its connections.
 *
 * hiredis 0.14 contexts are not thread-safe, and a context blocked in BLPOP
 * can do nothing else, so an engine keeps three kinds of connection:
 *  - a pool of up to `redis.pool_max` command connections for short requests,
 *    handed out under a mutex, waiting at most the operation timeout for one;
 *  - blocking connections for waiters (BLPOP on a wake list), one per
 *    waiting thread for the length of its wait, a few kept idle for reuse;
 *  - one probe connection, so that health probes measure the server and not
 *    the pool's queue.
 * Every connection is set up the same way: connect within the connect
 * timeout, socket timeouts set (hiredis 0.14 applies the connect timeout
 * only to connect), AUTH and SELECT pipelined in one round trip. A
 * connection that saw an I/O error or a timeout is freed, never reused, so
 * an ambiguity is always settled on a healthy connection.
 */
#ifndef CERB_REDIS_CONN_H
#define CERB_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "engine.h"
#include "redis_errors.h"
#include "redis_stats.h"
#include "sync.h"

/* How often a blocked waiter looks at its interrupt flag, at the latest. */
#define REDIS_INTR_SLICE_MS 100

/* A marker value (redis_marker.h): "<16 hex> <digits>", NUL, room to spare. */
#define REDIS_MARKER_MAX 128

/* Scripts, in the order of their SHA slots (redis_scripts.c). */
enum redis_script {
    REDIS_SCRIPT_ACQUIRE,
    REDIS_SCRIPT_RELEASE, /* release, and leave for a waiter that gives up */
    REDIS_SCRIPT_RENEW,
    REDIS_SCRIPT_CHECK,
    REDIS_SCRIPT_HELD,    /* the safe switch's question (held()) */
    REDIS_SCRIPT_PROCLAIM, /* an election term's value (redis_election.c) */
    REDIS_SCRIPT_LEADER,   /* who leads an election, read-only */
    /* Semaphores and read-write locks (redis_queue.c). */
    REDIS_SCRIPT_SEM_ACQUIRE,
    REDIS_SCRIPT_SEM_RELEASE,
    REDIS_SCRIPT_SEM_RENEW,
    REDIS_SCRIPT_SEM_CHECK,
    REDIS_SCRIPT_SEM_HELD,
    REDIS_SCRIPT_SEM_INSPECT,
    REDIS_SCRIPT_SEM_FITS,  /* the switch gate's question (fits()), read-only */
    REDIS_SCRIPT_RW_ACQUIRE,
    REDIS_SCRIPT_RW_RELEASE,
    REDIS_SCRIPT_RW_RENEW,
    REDIS_SCRIPT_RW_CHECK,
    REDIS_SCRIPT_RW_HELD,
    REDIS_SCRIPT_RW_INSPECT,
    REDIS_SCRIPT_RW_FITS,
    REDIS_SCRIPT_COUNT
};

struct redis_conn {
    redisContext *ctx;  /* NULL until connected (command pool slots) */
    char *out;          /* requests formatted, not yet sent */
    size_t out_len, out_cap;
    size_t pending;     /* replies expected for what is in `out` */
    int64_t timeout_ms; /* socket timeout in force (for messages) */
    int64_t idle_since; /* monotonic ns when last given back */
    int slot;           /* index in the command pool; -1 otherwise */
    bool broken;        /* I/O error or timeout: free, never reuse */
    /* Cluster ASK (cerb__redis_set_asking): for each reply still to come of
     * the last send, in order, whether an ASKING went before its request
     * (its +OK is dropped first); ask_n = 0 when none did. */
    unsigned char *asked;
    size_t ask_cap, ask_n, ask_rd;
    uint64_t gen;       /* the master address generation it connected to */
    char policy[32];    /* redlock node: maxmemory_policy at connect
                           (INFO memory) */
};

struct redis_pool {
    cerb_mutex mu;
    cerb_cond cond;            /* a command slot was put back */
    int size;
    struct redis_conn *slots;  /* `size` command connections */
    int *free_slots;           /* stack of free slot indexes (warm on top) */
    int n_free;
    struct redis_conn **idle;  /* idle blocking connections */
    int n_idle, max_idle;
    uint64_t closed_idle;      /* connections closed for idling (tests) */
};

struct cerb_engine {
    const struct cerb_config *cfg;
    const struct cerb_redis_config *rc;
    cerb_engine_env env;
    char where[300];                   /* "host:port" for messages */
    char sha[REDIS_SCRIPT_COUNT][41];  /* SCRIPT LOAD results, set at open */
    struct redis_pool pool;
    cerb_mutex probe_mu;               /* guards probe_conn */
    struct redis_conn *probe_conn;
    char probe_name[64];               /* reserved lock name of this instance */
    cerb_mutex wait_mu;                /* guards waiter registrations (cancel) */
    cerb_mutex *wmu;                   /* the one in use: &wait_mu, or in a
                                          cluster node the routing instance's */
    /* Cluster mode (redis_cluster.h): the routing instance owns `cl`; each
     * master node is an instance of its own (single mode, its own pool and
     * probe) that shares `cl` for the per-slot markers. */
    struct redis_cluster *cl;
    bool cl_top;
    /* Redlock mode (redis_redlock.h): the routing instance owns `rl`; each
     * master is an instance of its own (rl_node: its own data-loss marker
     * and history check, its eviction policy read at every connect). */
    struct redis_redlock *rl;
    bool rl_top;
    bool rl_node;
    char *marker_key;                  /* redis_marker.h */
    size_t marker_key_len;
    _Atomic int64_t quarantine_ms;     /* after a loss: the longest lease
                                          this instance used + drift */
    cerb_mutex marker_mu;              /* guards marker, marker_qend */
    char marker[REDIS_MARKER_MAX];     /* the value every script sends */
    char marker_qend[24];              /* its quarantine end, server ms */
    char replid_seen[48];              /* server's replid last recorded (marker_mu) */
    long long q_said_until;            /* marker_mu: server ms the last quarantine
                                          warning covers (redis_quarantine.h) */
    unsigned q_unsaid;                 /* marker_mu: quarantines begun under it */
    atomic_bool replid_warned;         /* said once: INFO gives no replid */
    char *closure_key;                 /* redis_closure.h; NULL in a cluster */
    size_t closure_key_len;
    /* Where the master is (redis_sentinel.h). */
    cerb_mutex addr_mu;                /* guards addr_host, addr_port */
    char addr_host[256];
    int addr_port;
    atomic_uint_fast64_t addr_gen;
    atomic_bool addr_suspect;          /* ask the sentinels before connecting */
    cerb_mutex disc_mu;                /* one discovery at a time */
    int64_t last_discover_ns;          /* disc_mu */
    size_t sentinel_next;              /* disc_mu: the one that answered last */
    pthread_t watch_thread;            /* +switch-master subscriber (sentinel mode) */
    bool watch_started;
    atomic_bool watch_stop;
    struct redis_counters stats;
};

/*
 * Per-hold state (ops->lock_priv_size): which socket a waiter is blocked
 * on, so cancel() can break the wait without a round trip. Guarded by
 * e->wait_mu; `fd` is valid only while `waiting`.
 */
struct redis_lock_priv {
    bool waiting;
    bool cancelled;
    int fd;
    char next[64]; /* cluster: the waiter right behind us at our last run of
                      acquire (our release names its wake list), "" = none */
    bool queued;   /* cluster: a redirect cut a wait (or its leave) short, so
                      our token may still be in the name's queue: the router
                      runs the acquisition again where it points, or leaves */
    uint64_t rl_fence; /* redlock: the grant's fence (T), 0 = none known */
    char rl_value[33]; /* redlock: what this hold's last attempt wrote on the
                          nodes (attempt 0 the token, later ones its first
                          half + fresh random: a late DEL of an abandoned
                          attempt can never match a later one) */
    unsigned rl_attempts; /* redlock: attempts made for this hold */
    bool rl_abandoned;    /* redlock: the last attempt failed and its release
                             was sent: never reported as held */
};

/* Set up and tear down the pools (no connection is made). */
cerb_status cerb__redis_pool_init(cerb_engine *e);
void cerb__redis_pool_destroy(cerb_engine *e);

/*
 * Open a connection: connect within `connect_ms`, socket timeout
 * `timeout_ms`, then AUTH/SELECT as configured. On failure the status and
 * last error name host:port. Ownership: free with cerb__redis_conn_free().
 */
cerb_status cerb__redis_conn_open(cerb_engine *e, int64_t connect_ms, int64_t timeout_ms,
                                  struct redis_conn **out);
void cerb__redis_conn_free(struct redis_conn *c);
/* Change the socket timeout of an open connection. */
cerb_status cerb__redis_conn_set_timeout(cerb_engine *e, struct redis_conn *c,
                                         int64_t timeout_ms);

/* Take a command connection, connected, waiting for a free one until
 * `deadline_ns`. Give it back with cerb__redis_put(); a broken one is freed
 * there and its slot reconnects on next use. */
cerb_status cerb__redis_get(cerb_engine *e, int64_t deadline_ns, struct redis_conn **out);
/* Would cerb__redis_get hand out an open connection now (no connect)? A
 * hint: another thread may take it first. */
bool cerb__redis_has_warm(cerb_engine *e);
void cerb__redis_put(cerb_engine *e, struct redis_conn *c);

/* Take or return a blocking (BLPOP) connection. */
cerb_status cerb__redis_block_get(cerb_engine *e, struct redis_conn **out);
void cerb__redis_block_put(cerb_engine *e, struct redis_conn *c);

/*
 * Pipelining: append requests, then exchange them in one round trip.
 * cerb__redis_append returns CERB_OK or CERB_ENOMEM.
 * cerb__redis_exchange sends everything appended (send() with MSG_NOSIGNAL:
 * a library must not die of SIGPIPE) and reads one reply per request into
 * r[0 .. pending). On an I/O failure it returns the mapped status, sets
 * *outcome, marks the connection broken and leaves r[i] NULL for replies
 * not read (*n_read tells how many were). Error replies are returned as
 * replies: the caller decides. Ownership: the caller frees each r[i] with
 * freeReplyObject().
 */
cerb_status cerb__redis_append(struct redis_conn *c, int argc, const char **argv,
                               const size_t *argvlen);
cerb_status cerb__redis_exchange(cerb_engine *e, struct redis_conn *c, const char *what,
                                 redisReply **r, size_t *n_read, cerb_outcome *outcome);
/* The two halves of an exchange, for a waiter that polls the socket between
 * them: send what is appended; read one reply. Same failure rules. */
cerb_status cerb__redis_send(cerb_engine *e, struct redis_conn *c, const char *what,
                             cerb_outcome *outcome);
cerb_status cerb__redis_recv(cerb_engine *e, struct redis_conn *c, const char *what,
                             redisReply **r, cerb_outcome *outcome);

/* Cluster ASK redirection: while set (this thread), every request sent
 * goes out right after an ASKING on the same connection (a MULTI ... EXEC
 * after one, before its MULTI), whose reply recv drops. */
void cerb__redis_set_asking(bool on);
/* Is it set? */
bool cerb__redis_asking(void);

#endif
