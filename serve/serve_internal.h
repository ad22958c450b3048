/*
 * serve_internal.h — what the files of serve/ share: the server's state,
 * the hold table (serve_holds.c), the guard's open attempts
 * (serve_guard.c), the JSON replies (serve_reply.c), the server's own
 * metrics (serve_metrics.c) and the routes (serve_routes.c, parsed by
 * serve_parse.c). Internal functions are prefixed cerb__serve_.
 */
#ifndef CERB_SERVE_INTERNAL_H
#define CERB_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>

#include "cerberus.h"
#include "serve.h"
#include "serve_parse.h"

/* ---- small helpers every file uses ---- */

/* CLOCK_MONOTONIC in nanoseconds: every deadline and window of the server. */
static inline int64_t cerb__serve_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A mutex that cannot fail but for a bug: abort, as the library does. */
static inline void cerb__serve_lock(pthread_mutex_t *mu)
{
    if (pthread_mutex_lock(mu) != 0)
        abort();
}

static inline void cerb__serve_unlock(pthread_mutex_t *mu)
{
    if (pthread_mutex_unlock(mu) != 0)
        abort();
}

/* Request bodies larger than this are refused with 400, unless
 * serve.max_body says another size (cerb__serve_configure). */
#define CERB_SERVE_MAX_BODY 4096

/* A hold id: 16 random bytes as 32 lowercase hex characters. */
#define CERB_SERVE_HOLD_ID_LEN CERB_SERVE_ID_LEN

/* ---- the guard's open attempts (serve_guard.c) ---- */

/*
 * An attempt begun with POST /v1/guard/{scope}/{key}/begin (CERB_OK) and
 * not finished yet, by id. Like a hold it belongs to the server: any
 * request may finish it; a caller that neither finishes it nor keeps it
 * alive within its window loses it (freed: counted as failed, the record
 * deleted, so a retry may run). `busy` marks one whose finish is running
 * (a handle is used by one thread at a time): a second finish is refused
 * and the expiry leaves it alone.
 */
struct cerb__serve_attempt {
    char id[CERB_SERVE_ID_LEN + 1];
    cerb_guard *g;
    char *scope;
    char *key;
    size_t key_len;
    int64_t last_seen_ns; /* begin, a keepalive or a finish that left it open */
    int64_t window_ns;
    bool busy;
    /* Finished with CERB_OK: kept (g freed) for its window so that a
     * finish repeated after a lost answer gets the same answer, not 404. */
    bool done;
    bool done_succeeded;
    struct cerb__serve_attempt *next;
};

struct cerb__serve_attempts {
    pthread_mutex_t mu;
    struct cerb__serve_attempt *head;
    size_t n; /* open ones (not done) */
};

void cerb__serve_attempts_init(struct cerb__serve_attempts *t);
/* Takes out and frees (cerb_guard_free: failed) the attempts whose window
 * passed with no finish running; the count. */
size_t cerb__serve_attempts_expire(struct cerb__serve_attempts *t);
/* How many are open now. */
size_t cerb__serve_attempts_count(struct cerb__serve_attempts *t);
/* Frees every attempt left (failed), then the table's mutex. */
void cerb__serve_attempts_destroy(struct cerb__serve_attempts *t);

/* ---- the hold table (serve_holds.c) ---- */

/*
 * The holds the server keeps for its callers, by id. A hold belongs to the
 * server, not to the HTTP thread that acquired it: any request may release
 * it. The table is a linked list under one mutex; it is short-lived work
 * (a lookup), and no call into the library is made with the mutex held.
 */
struct cerb__serve_hold {
    char id[CERB_SERVE_HOLD_ID_LEN + 1];
    cerb_hold *hold;
    int64_t last_seen_ns; /* acquisition or last keepalive (CLOCK_MONOTONIC, ns) */
    int64_t window_ns;    /* released when nothing is heard for this long */
    unsigned listeners;   /* event streams open on it: it is kept alive */
    bool lost;            /* the library said it was lost (on_lost) */
    bool adding;          /* cerb__serve_holds_add is not done with it: not expired */
    struct cerb__serve_hold *next;
};

struct cerb__serve_holds {
    pthread_mutex_t mu;
    pthread_cond_t changed; /* CLOCK_MONOTONIC; a hold lost or taken out, or the stop */
    bool stopping;          /* event streams end */
    int64_t heartbeat_ms;   /* the event streams' heartbeat period */
    struct cerb__serve_hold *head;
    struct cerb__serve_holds *live_next; /* the tables the lost callback may reach */
    /* The guard's open attempts ride on the hold table's life, which the
     * server's start and stop (serve.c) already run: holds_init inits
     * them, the expiry thread expires them, holds_destroy frees them. */
    struct cerb__serve_attempts attempts;
};

/* How often an event stream says `event: heartbeat`. */
#define CERB_SERVE_HEARTBEAT_MS 5000

void cerb__serve_holds_init(struct cerb__serve_holds *t);
/* Adds @hold under a new random id, written to @id (33 bytes); it is
 * released when no keepalive comes for @window_ms. Returns CERB_OK;
 * CERB_ENOMEM or CERB_EIO (no randomness); the hold is then still the
 * caller's. */
cerb_status cerb__serve_holds_add(struct cerb__serve_holds *t, cerb_hold *hold,
                                  int64_t window_ms, char id[CERB_SERVE_HOLD_ID_LEN + 1]);
/* Removes up to @max holds whose window passed and returns them in @out
 * (now the caller's, to release); the count. */
size_t cerb__serve_holds_take_expired(struct cerb__serve_holds *t, cerb_hold **out,
                                      size_t max);
/* Removes the hold with @id from the table and returns it (now the
 * caller's), or NULL when there is none. */
cerb_hold *cerb__serve_holds_take(struct cerb__serve_holds *t, const char *id);
/* Records a keepalive for @id. Returns CERB_OK with the hold's state
 * (VALID or SUSPECT) in *@state and cerb_hold_valid_ms() in *@valid_ms;
 * CERB_NOT_OWNER when there is no such hold; CERB_LOST when the hold was
 * lost: it is then taken out of the table and returned in *@lost (now the
 * caller's, to free), since keeping it alive would tell the caller it
 * still holds the name. */
cerb_status cerb__serve_holds_touch(struct cerb__serve_holds *t, const char *id,
                                    cerb_hold **lost, enum cerb_lock_state *state,
                                    int64_t *valid_ms);
/* The state and cerb_hold_valid_ms() of hold @id, read now (for a
 * heartbeat); false when there is no such hold. */
bool cerb__serve_holds_info(struct cerb__serve_holds *t, const char *id,
                            enum cerb_lock_state *state, int64_t *valid_ms);
/* An event stream opens on hold @id (which then is not expired while it
 * listens), with the heartbeat period now in *@heartbeat_ms; false when
 * there is no such hold. */
bool cerb__serve_holds_listen(struct cerb__serve_holds *t, const char *id,
                              int64_t *heartbeat_ms);
/* The heartbeat period of the streams opened from now on. */
void cerb__serve_holds_set_heartbeat(struct cerb__serve_holds *t, int64_t ms);
/* It closes: the hold's window starts again from now. */
void cerb__serve_holds_unlisten(struct cerb__serve_holds *t, const char *id);
enum cerb__serve_event {
    CERB_SERVE_EV_TIMEOUT, /* the deadline came: time for a heartbeat */
    CERB_SERVE_EV_LOST,    /* the hold was lost */
    CERB_SERVE_EV_GONE,    /* it is no longer in the table (released) */
    CERB_SERVE_EV_STOP     /* the server stops */
};
/* Waits until something happens to hold @id, at most until @deadline_ns
 * (CLOCK_MONOTONIC). */
enum cerb__serve_event cerb__serve_holds_wait(struct cerb__serve_holds *t, const char *id,
                                              int64_t deadline_ns);
/* Ends every event stream (they stop waiting and close). */
void cerb__serve_holds_stop_streams(struct cerb__serve_holds *t);
/* How many threads release the holds left at a stop. */
#define CERB_SERVE_STOP_THREADS 8
/* The least time a stop gives those releases, whatever serve.drain_ms. */
#define CERB_SERVE_STOP_RELEASE_MIN_MS 1000
/*
 * cerb__serve_holds_destroy — release the holds left, in parallel
 * (CERB_SERVE_STOP_THREADS threads), starting none after @budget_ms (the
 * ones in flight then finish: one engine timeout at most); then free the
 * table and its mutex. The holds not released are left to expire with
 * their server lease: the client keeps them until cerb_client_close.
 * Returns: in *@released the holds released, in *@left those left.
 * Thread-safety: once, after the expiry thread and the HTTP daemons stopped.
 */
void cerb__serve_holds_destroy(struct cerb__serve_holds *t, int64_t budget_ms,
                               size_t *released, size_t *left);

/* ---- requests and acquisitions in progress (serve_waits.c) ---- */

struct cerb__serve_waits {
    pthread_mutex_t mu;
    pthread_cond_t idle; /* CLOCK_MONOTONIC; signalled when requests is 0 */
    size_t requests;     /* being answered now */
    cerb_cancel **v; /* the cancels of the acquisitions waiting now */
    int *fds;        /* and their callers' sockets (-1: unknown) */
    size_t n, cap;
    bool stopped;    /* after cerb__serve_waits_stop: no new ones */
};

void cerb__serve_waits_init(struct cerb__serve_waits *w);
/* Registers the cancel of an acquisition about to start, with the socket
 * @fd of its caller's connection (-1: none known), watched by
 * cerb__serve_waits_watch. Returns CERB_OK; CERB_UNAVAILABLE once the
 * server is stopping; CERB_ENOMEM. */
cerb_status cerb__serve_waits_add(struct cerb__serve_waits *w, cerb_cancel *c, int fd);
/* Fires the cancel of every registered acquisition whose caller hung up
 * (its connection closed): nobody would take the hold it waits for.
 * Called by the expiry thread every tick. */
void cerb__serve_waits_watch(struct cerb__serve_waits *w);
/* Whether the peer of connection socket @fd has hung up (closed, or the
 * connection broke); false for -1. Never blocks. */
bool cerb__serve_hung_up(int fd);
/* Unregisters it once the acquisition returned (before freeing it). */
void cerb__serve_waits_remove(struct cerb__serve_waits *w, cerb_cancel *c);
/* Refuses new acquisitions and fires every registered cancel. */
void cerb__serve_waits_stop(struct cerb__serve_waits *w);
/* A request starts (first call of the access handler) / is done (MHD's
 * completion callback: its answer was sent or its connection dropped). */
void cerb__serve_waits_enter(struct cerb__serve_waits *w);
void cerb__serve_waits_leave(struct cerb__serve_waits *w);
/* Waits until no request is being answered, at most @timeout_ms; true
 * when none is left. */
bool cerb__serve_waits_drain(struct cerb__serve_waits *w, int64_t timeout_ms);
/* Frees the set (nothing may be registered). */
void cerb__serve_waits_destroy(struct cerb__serve_waits *w);

/* ---- the release of silent callers' holds (serve_expiry.c) ---- */

/* The keepalive window of a hold acquired without lease_ms, and of a guard
 * attempt begun without running_ms: serve.keepalive_ms (10000 unless
 * configured; a reload changes it for those begun after it). Its uses are
 * in routes, where the server is `s`. */
#define CERB_SERVE_DEFAULT_WINDOW_MS cerb__serve_keepalive_ms(s)

struct cerb__serve_expiry {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* CLOCK_MONOTONIC */
    bool stop;
    bool started;
    pthread_t thread;
};

struct cerb__serve_holds;
/* Starts the thread that releases expired holds of @holds and cancels the
 * acquisitions of @waits whose callers hung up; CERB_OK or CERB_ENOMEM (no
 * thread). */
cerb_status cerb__serve_expiry_start(struct cerb__serve_expiry *e,
                                     struct cerb__serve_holds *holds,
                                     struct cerb__serve_waits *waits);
/* Stops and joins it (nothing when it did not start). */
void cerb__serve_expiry_stop(struct cerb__serve_expiry *e);

/* ---- event streams (serve_events.c) ---- */

/* Answers GET /v1/holds/{@id}/events: a text/event-stream response that
 * says `event: heartbeat` every heartbeat_ms and `event: lost` when the
 * hold is lost, until the caller goes away, the hold is released or lost,
 * or the server stops; 404 for an unknown hold. */
enum MHD_Result cerb__serve_events(struct cerb__serve_holds *t,
                                   struct MHD_Connection *conn, const char *id);

/* ---- inspection (serve_inspect.c) ---- */

/* GET /v1/status: the engines, their breakers, the current engine. */
enum MHD_Result cerb__serve_status(struct cerb__serve *s, struct MHD_Connection *conn);
/* GET /v1/locks/{@name}: its holders and waiters (cerb_lock_inspect). */
enum MHD_Result cerb__serve_inspect(struct cerb__serve *s, struct MHD_Connection *conn,
                                    const char *name);

/* ---- the guard routes (serve_guard.c) ---- */

struct cerb__serve;
/* POST /v1/guard/{scope}/{key}/begin, .../finish, and
 * /v1/guard/attempts/{id}/keepalive (rq parsed by serve_parse.c). */
enum MHD_Result cerb__serve_guard_begin(struct cerb__serve *s, struct MHD_Connection *conn,
                                        const struct cerb__serve_req *rq);
enum MHD_Result cerb__serve_guard_finish(struct cerb__serve *s, struct MHD_Connection *conn,
                                         const struct cerb__serve_req *rq);
enum MHD_Result cerb__serve_guard_keepalive(struct cerb__serve *s,
                                            struct MHD_Connection *conn, const char *id);

/* ---- the server's own metrics (serve_metrics.c) ---- */

/* A request was routed to @rt (this thread answers it): the code of its
 * reply is noted, and counted by cerb__serve_metrics_leave(). */
void cerb__serve_metrics_enter(enum cerb__serve_rt rt);
/* Counts the request under its route and reply's code (200 for an
 * answer not made by serve_reply.c: an event stream). */
void cerb__serve_metrics_leave(enum MHD_Result ret);
/* serve_reply.c queued a reply with @code; one made outside a route (a 401,
 * a body too big) is counted at once under route "unrouted". */
void cerb__serve_metrics_replied(unsigned code);
/* GET /metrics: cerb_metrics_text and the server's own families. */
enum MHD_Result cerb__serve_metrics(struct cerb__serve *s, struct MHD_Connection *conn);
/* ---- limits (serve_limits.c) ---- */

/* A token bucket: the rate limit of one listening socket. */
struct cerb__serve_bucket {
    pthread_mutex_t mu;
    double tokens;   /* -1 before the first request: then full */
    int64_t last_ns; /* CLOCK_MONOTONIC of the last refill */
};

void cerb__serve_bucket_init(struct cerb__serve_bucket *b);
void cerb__serve_bucket_destroy(struct cerb__serve_bucket *b);
/* Takes one token at @now_ns with @rate a second and at most @burst (0 =
 * @rate) kept; true when there was one (always when @rate is 0), else
 * false with the whole seconds until there is one in *@retry_after_s. */
bool cerb__serve_bucket_take(struct cerb__serve_bucket *b, int rate, int burst,
                             int64_t now_ns, unsigned *retry_after_s);
/* 429 {"status": "RATE_LIMITED", "error": …} with Retry-After. */
enum MHD_Result cerb__serve_reply_rate_limited(struct MHD_Connection *conn,
                                               unsigned retry_after_s);

/* ---- log records (serve_log.c) ---- */

/* The reasons whose records are written at most once a second. */
enum cerb__serve_log_reason {
    CERB_SERVE_LOG_RATE,        /* a request answered 429 */
    CERB_SERVE_LOG_CONNECTIONS, /* a connection refused: serve.max_connections */
    CERB_SERVE_LOG_HTTP,        /* another complaint of libmicrohttpd */
    CERB_SERVE_LOG_REASONS
};

/* The same as a warning, at most once a second for @reason (the next one
 * says how many were held back). */
void cerb__serve_log_limited(enum cerb__serve_log_reason reason, const char *event,
                             const char *const *fields);

/* ---- systemd (serve_systemd.c) ---- */

/* The first descriptor systemd passes (sd_listen_fds(3)). */
#define SD_LISTEN_FDS_START 3

/* ---- the server ---- */

#define CERB_SERVE_MAX_LISTENERS CERB_SERVE_MAX_LISTEN

struct cerb__serve;

/*
 * One listening socket and the MHD daemon answering on it; every daemon
 * shares the routes, and this (its cls) says whether a request came over
 * TCP, where it must carry the bearer token.
 */
struct cerb__serve_listener {
    struct cerb__serve *s;
    struct MHD_Daemon *daemon;
    char *path;  /* a unix socket's file, removed at stop; NULL for TCP and
                    for a socket systemd passed (it is systemd's) */
    dev_t path_dev; /* that file's identity after bind: the stop removes it */
    ino_t path_ino; /* only while lstat still finds this one there */
    char *token; /* TCP: the bearer token every request must carry (wiped at
                    stop; replaced under s->token_mu by cerb__serve_set_token) */
    bool needs_token; /* token != NULL, fixed when the socket is made: read
                         without the mutex by every request */
    char name[160]; /* "unix:PATH" or "ADDR:PORT", for the log */
    struct cerb__serve_bucket bucket; /* serve.rate_limit */
    _Atomic unsigned connections;     /* open now (serve.max_connections) */
};

struct cerb__serve {
    cerb_client *client;
    struct cerb__serve_listener listeners[CERB_SERVE_MAX_LISTENERS];
    size_t n_listeners;
    struct cerb__serve_holds holds;
    struct cerb__serve_waits waits;
    struct cerb__serve_expiry expiry;
    struct cerb__serve_dapr *dapr; /* the Dapr façade's state (serve_dapr.c) */
    struct cerb__serve_opts opts;  /* sockets made from now on; limits */
    pthread_mutex_t opts_mu;       /* opts (a reload changes them) */
    pthread_mutex_t token_mu;      /* the listeners' tokens */
};

/* serve.keepalive_ms, as configured now (any thread). */
int64_t cerb__serve_keepalive_ms(struct cerb__serve *s);

/* ---- replies (serve_reply.c) ---- */

/* Queues @body (a JSON object, stolen) with HTTP @code. */
enum MHD_Result cerb__serve_reply_json(struct MHD_Connection *conn, unsigned code,
                                       json_t *body);
/* {"status": NAME, "error": TEXT} with the HTTP code that stands for @st. */
enum MHD_Result cerb__serve_reply_error(struct MHD_Connection *conn, cerb_status st,
                                        const char *text);
/* 401 {"status": "UNAUTHORIZED", "error": @text} with WWW-Authenticate:
 * Bearer (a TCP request without the right token). */
enum MHD_Result cerb__serve_reply_unauthorized(struct MHD_Connection *conn,
                                               const char *text);
/* {"errorCode": @error_code, "message": @message} with HTTP @code, daprd's
 * error body (serve_dapr.c); @message may echo the caller's bytes (made
 * UTF-8 here). Returns what MHD_queue_response returned. Any thread. */
enum MHD_Result cerb__serve_reply_dapr_error(struct MHD_Connection *conn, unsigned code,
                                             const char *error_code, const char *message);
/* 405 {"status": "EINVAL", "error": ...} with Allow: @allow (copied), for
 * @method on a path that only @allow take. Returns what MHD_queue_response
 * returned. Any thread. */
enum MHD_Result cerb__serve_reply_method(struct MHD_Connection *conn, const char *method,
                                         const char *allow);
/*
 * cerb__serve_utf8 — a copy of @text (NULL: "") in which every byte that is
 * not part of a well-formed UTF-8 sequence is U+FFFD, so that jansson can
 * carry it. Returns: the copy (free it), NULL when out of memory.
 * Thread-safety: any thread. The error replies apply it to their text.
 */
char *cerb__serve_utf8(const char *text);
/* The HTTP code for a library status. */
unsigned cerb__serve_http_code(cerb_status st);
/* @text (@len bytes, copied) as @content_type with HTTP @code. */
enum MHD_Result cerb__serve_reply_text(struct MHD_Connection *conn, unsigned code,
                                       const char *content_type, const char *text,
                                       size_t len);

/* ---- routes (serve_routes.c) ---- */

/*
 * Answers one complete request: @body is its body (NUL-terminated, @len
 * bytes). Returns what MHD_queue_response returned.
 */
enum MHD_Result cerb__serve_route(struct cerb__serve *s, struct MHD_Connection *conn,
                                  const char *method, const char *url,
                                  const char *body, size_t len);

/* ---- the Dapr-compatible façade (serve_dapr.c) ---- */

/* Its store name, key prefix and the owners of the holds it granted. */
struct cerb__serve_dapr;

/* A façade serving the store "cerberus" with no app id. Returns CERB_OK
 * with *@out set, or CERB_ENOMEM. Ownership: free it with
 * cerb__serve_dapr_free() once no request runs (after the daemons
 * stopped); the holds it granted are in the hold table, released there. */
cerb_status cerb__serve_dapr_new(struct cerb__serve_dapr **out);
/* Frees it; NULL does nothing. */
void cerb__serve_dapr_free(struct cerb__serve_dapr *d);
/* Whether @url is one of Dapr's (/v1.0/..., /v1.0-alpha1/...): answered by
 * cerb__serve_dapr_route, and over TCP authorised by `dapr-api-token`
 * as well as by the bearer token. Thread-safety: any thread (pure). */
bool cerb__serve_dapr_path(const char *url);
/* Answers a request on a Dapr route (see serve_dapr.c), with daprd's
 * bodies and codes. Returns what MHD_queue_response returned.
 * Thread-safety: any number of requests at once. */
enum MHD_Result cerb__serve_dapr_route(struct cerb__serve *s, struct MHD_Connection *conn,
                                       const char *method, const char *url,
                                       const char *body, size_t len);

#endif /* CERB_SERVE_INTERNAL_H */
