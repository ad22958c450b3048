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

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "cerberus.h"

struct cerb__serve;

/* How many sockets one server listens on at most. */
#define CERB_SERVE_MAX_LISTEN 8

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
 * "[::1]:PORT", a loopback address only (127.0.0.0/8, ::1); port 0 lets
 * the kernel choose, and the port listened on is written to *@port (when
 * not NULL). Every request on it must carry `Authorization: Bearer
 * @token` (else 401 UNAUTHORIZED).
 * Returns: CERB_OK; CERB_EINVAL for an address that is not loopback or not
 * of that shape, or no (or an empty) @token; CERB_EIO when the socket or
 * its server cannot be made; the reason in @err.
 * Ownership: @token is copied (and wiped at stop); it is never logged.
 */
cerb_status cerb__serve_listen_tcp(struct cerb__serve *s, const char *addr,
                                   const char *token, unsigned *port, char *err,
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

/*
 * cerb__serve_stop — stop answering (requests being answered finish
 * first), release and free every hold the server keeps, remove the socket
 * file and free @s. NULL does nothing. The client is left open.
 */
void cerb__serve_stop(struct cerb__serve *s);

#endif /* CERB_SERVE_H */
