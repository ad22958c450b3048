/*
 * serve.h — the internal API of `cerberus serve` (DESIGN.md §15): start the
 * HTTP lock service on a client, stop it. Used by cli/cmd_serve.c and by
 * tests/integration/test_serve.c; nothing here is library API.
 *
 * Like cli/, serve/ is a user of the public header only: a handler parses
 * the request, calls cerb_*, formats the answer.
 */
#ifndef CERB_SERVE_H
#define CERB_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "cerberus.h"

struct cerb__serve;

/* How many sockets one server listens on at most. */
#define CERB_SERVE_MAX_LISTEN 8

/*
 * The operator's settings of a server (the serve.* keys of the
 * configuration file, DESIGN.md §15, overridden by the command line). The
 * first group applies to the sockets made after cerb__serve_configure;
 * the second at once, to the next request (a reload may change it).
 */
struct cerb__serve_opts {
    bool allow_remote;     /* TCP on any address, not only loopback */
    int max_connections;   /* per socket; beyond it a connection is closed */
    int max_body;          /* bytes; a larger body is 400 */
    int idle_timeout_s;    /* an idle connection is closed; 0 never */
    long socket_gid;       /* a unix socket's group; -1 the server's own */
    unsigned socket_mode;  /* a unix socket's mode (0660) */

    int rate_limit;        /* requests a second per socket; 0 no limit */
    int rate_burst;        /* requests at once; 0 = rate_limit */
    int64_t drain_ms;      /* how long a stop lets answers finish */
    int64_t keepalive_ms;  /* the window of a hold acquired without lease_ms */
};

/* The defaults, those of the configuration keys. */
#define CERB__SERVE_OPTS_INIT                                                          \
    {.allow_remote = false, .max_connections = 512, .max_body = 4096,                  \
     .idle_timeout_s = 60, .socket_gid = -1, .socket_mode = 0660, .rate_limit = 0,      \
     .rate_burst = 0, .drain_ms = 5000, .keepalive_ms = 10000}

/*
 * cerb__serve_start — answer the /v1 routes with @client, from threads of
 * the HTTP server, on the unix socket @unix_path (made here, mode 0660; a
 * socket file nobody answers on is replaced, one a live server answers on
 * is left alone: CERB_EIO). With @unix_path NULL it listens nowhere yet:
 * add sockets with cerb__serve_listen_unix/_tcp (at most
 * CERB_SERVE_MAX_LISTEN in all).
 * Thread-safety: start, the listen calls and stop are made by one thread,
 * one after the other; requests are answered meanwhile.
 * Returns: CERB_OK with *out set; CERB_EINVAL for a path too long for a
 * unix socket; CERB_EIO when the socket or the server cannot be made;
 * CERB_ENOMEM. On failure the reason is written to @err (@errlen bytes).
 * Ownership: the client stays the caller's, and must outlive the server;
 * stop it with cerb__serve_stop().
 */
cerb_status cerb__serve_start(cerb_client *client, const char *unix_path,
                              struct cerb__serve **out, char *err, size_t errlen);

/*
 * cerb__serve_listen_unix — listen on one more unix socket @path, as
 * cerb__serve_start does (mode 0660, no token). Same returns.
 */
cerb_status cerb__serve_listen_unix(struct cerb__serve *s, const char *path, char *err,
                                    size_t errlen);

/*
 * cerb__serve_listen_tcp — listen on TCP at @addr, "A.B.C.D:PORT" or
 * "[::1]:PORT", a loopback address only (127.0.0.0/8, ::1) unless the
 * server was configured with allow_remote; port 0 lets
 * the kernel choose, and the port listened on is written to *@port (when
 * not NULL). Every request on it must carry `Authorization: Bearer
 * @token` (else 401 UNAUTHORIZED).
 * Returns: CERB_OK; CERB_EINVAL for an address that is not loopback (and
 * not allowed) or not of that shape, or no (or an empty) @token; CERB_EIO when the socket or
 * its server cannot be made; the reason in @err.
 * Ownership: @token is copied (and wiped at stop); it is never logged.
 */
cerb_status cerb__serve_listen_tcp(struct cerb__serve *s, const char *addr,
                                   const char *token, unsigned *port, char *err,
                                   size_t errlen);

/*
 * cerb__serve_configure — the settings of @s from now on: the limits,
 * windows and drain at once; the socket settings for the sockets listened
 * on after the call (call it between cerb__serve_start and the first
 * listen). A reload calls it again with the new values.
 * Thread-safety: any thread, while requests are answered.
 * Ownership: @o is copied.
 */
void cerb__serve_configure(struct cerb__serve *s, const struct cerb__serve_opts *o);

/*
 * cerb__serve_set_token — replace the bearer token of every TCP socket
 * (a reload re-read the token file). @token is copied; the old copies are
 * wiped. Requests checked after the call need the new one.
 * Returns: CERB_OK; CERB_EINVAL for a NULL or empty token; CERB_ENOMEM
 * (the old token is then kept).
 * Thread-safety: any thread, while requests are answered.
 */
cerb_status cerb__serve_set_token(struct cerb__serve *s, const char *token);

/*
 * cerb__serve_listen_fd — serve on @fd, a socket already bound and
 * listening that this process was given (systemd socket activation):
 * a unix stream socket (no token; its file stays, it is systemd's) or a
 * TCP one, which needs @token and, on an address that is not loopback,
 * allow_remote. @fd is checked with getsockopt (SO_TYPE, SO_ACCEPTCONN)
 * and getsockname. The address served is written to @name (@namelen).
 * Returns: CERB_OK, @fd then owned by the server; CERB_EINVAL for a
 * socket of another kind or a TCP one the rules refuse (the reason in
 * @err), @fd left open; CERB_EIO when its server cannot start, @fd closed.
 */
cerb_status cerb__serve_listen_fd(struct cerb__serve *s, int fd, const char *token,
                                  char *name, size_t namelen, char *err, size_t errlen);

/*
 * cerb__serve_tcp_addr — the socket address of @addr, "A.B.C.D:PORT" or
 * "[V6]:PORT", without listening. Without @allow_remote only a loopback
 * address (127.0.0.0/8, ::1) is taken.
 * Returns: CERB_OK; CERB_EINVAL with the reason in @err (not of the
 * shape; not loopback and not allowed).
 */
cerb_status cerb__serve_tcp_addr(const char *addr, bool allow_remote,
                                 struct sockaddr_storage *sa, socklen_t *salen, char *err,
                                 size_t errlen);

/*
 * cerb__serve_tcp_parse — the socket address of @addr as
 * cerb__serve_listen_tcp takes it, without listening: CERB_OK, or
 * CERB_EINVAL with the reason in @err (not of the shape, not loopback).
 * For a command line to refuse an address before it starts anything.
 */
cerb_status cerb__serve_tcp_parse(const char *addr, struct sockaddr_storage *sa,
                                  socklen_t *salen, char *err, size_t errlen);

/*
 * cerb__serve_set_heartbeat_ms — the period of `event: heartbeat` on the
 * event streams opened from now on (CERB_SERVE_HEARTBEAT_MS, 5 s, unless
 * set); for tests, right after cerb__serve_start.
 */
void cerb__serve_set_heartbeat_ms(struct cerb__serve *s, int64_t ms);

/*
 * cerb__serve_set_dapr — the Dapr façade's store name (the {store} of
 * /v1.0-alpha1/lock/{store}; "cerberus" unless set) and app id: with
 * @app_id, resource R is the lock `lock||@app_id||R` (daprd's default key
 * layout, so a Dapr sidecar's Redis lock and this server exclude each
 * other), without (NULL) it is the lock R.
 * Returns: CERB_OK; CERB_EINVAL for an empty store or one with '/', "||"
 * or a control character, or such an app id (the reason in @err);
 * CERB_ENOMEM.
 * Thread-safety: as cerb__serve_listen_unix (right after the start).
 * Ownership: both are copied.
 */
cerb_status cerb__serve_set_dapr(struct cerb__serve *s, const char *store,
                                 const char *app_id, char *err, size_t errlen);
/* cerb__serve_dapr_check — what cerb__serve_set_dapr refuses, without a
 * server: CERB_OK, or CERB_EINVAL with the reason in @err. */
cerb_status cerb__serve_dapr_check(const char *store, const char *app_id, char *err,
                                   size_t errlen);

/*
 * cerb__serve_notify — tell systemd @state ("READY=1", "STOPPING=1") over
 * $NOTIFY_SOCKET, one datagram (a path, or '@' for an abstract name);
 * nothing when it is not set. cerb__serve_notify_reloading sends
 * "RELOADING=1" with MONOTONIC_USEC, the reload's start.
 * Returns: CERB_OK (sent, or nothing to do); CERB_EINVAL for a
 * NOTIFY_SOCKET that is not such an address; CERB_EIO when the send
 * failed; the reason in @err.
 * Thread-safety: any thread.
 */
cerb_status cerb__serve_notify(const char *state, char *err, size_t errlen);
cerb_status cerb__serve_notify_reloading(char *err, size_t errlen);

/*
 * cerb__serve_listen_fds — the sockets systemd passed to this process:
 * when $LISTEN_PID is getpid() and $LISTEN_FDS is N >= 1, the descriptors
 * 3 .. 3+N-1 (made close-on-exec) in @fds (at most @max) and N in *@n;
 * the LISTEN_* variables are unset. *@n is 0 when none were passed to
 * this process.
 * Returns: CERB_OK; CERB_EINVAL when one is not open or there are more
 * than @max (the reason in @err).
 * Thread-safety: call once, before threads read the environment.
 */
cerb_status cerb__serve_listen_fds(int *fds, size_t max, size_t *n, char *err,
                                   size_t errlen);

/*
 * cerb__serve_logv — write one record `TIME LEVEL EVENT key=value...` on
 * stderr (serve_log.c): @fields is a NULL-terminated list of key, value
 * pairs, a NULL value being left out; values are quoted when they need to
 * be. CERB_SERVE_LOG(level, event, "key", value, ...) builds the list.
 * Never pass a secret.
 * Thread-safety: any thread; records do not interleave.
 */
void cerb__serve_logv(cerb_log_level level, const char *event, const char *const *fields);
#define CERB_SERVE_LOG(level, event, ...) \
    cerb__serve_logv((level), (event), (const char *const[]){__VA_ARGS__, NULL})

/*
 * cerb__serve_log_library — a cerb_log_set() sink writing the library's
 * lines as the server's one-line records (event `library`).
 * Thread-safety: any thread.
 */
void cerb__serve_log_library(cerb_log_level level, const char *line, void *ud);

/*
 * cerb__serve_stop — stop answering (requests being answered finish
 * first, within serve.drain_ms), release the holds the server keeps (in
 * parallel, starting none once what the drain left of serve.drain_ms, at
 * least 1 s, has passed: the rest are left to expire with their lease, and
 * the client keeps them until cerb_client_close), remove its socket files
 * (those still its own) and free @s. NULL does nothing. The client is left
 * open.
 */
void cerb__serve_stop(struct cerb__serve *s);

/*
 * cerb__serve_stop_report — the same, and says how it went: in
 * *@released the holds it released (the `stop` record also counts those
 * left to expire, holds_left), in *@drained whether every answer
 * being made was sent within the drain (serve.drain_ms). It writes the
 * `stop` log record itself.
 */
void cerb__serve_stop_report(struct cerb__serve *s, size_t *released, bool *drained);

#endif /* CERB_SERVE_H */
