/*
 * serve.c — the HTTP server of `cerberus serve`: its socket, its
 * libmicrohttpd daemon, and the collection of each request's body before
 * serve_routes.c answers it.
 *
 * Every socket is made here and handed to its own MHD daemon with
 * MHD_OPTION_LISTEN_SOCKET: a unix socket (socket, bind, chmod 0660,
 * listen), so that its mode is set before anyone can connect, or a TCP one
 * on a loopback address only (127.0.0.0/8 or ::1), whose port is then
 * known from getsockname (port 0 lets the kernel choose). The daemons share
 * the routes; each has its listener as cls, which says whether the
 * connection is TCP. A TCP request must carry `Authorization: Bearer
 * TOKEN`, compared in constant time (CRYPTO_memcmp after a length check)
 * before its body is read; without it, or with another, it is answered
 * 401 UNAUTHORIZED. The unix socket needs no token: its mode is the
 * control. The token is never logged nor put in an answer. MHD runs a thread per connection
 * (MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION): a
 * blocking acquisition then holds only its own connection's thread.
 *
 * MHD calls the access handler several times per request: first with no
 * body (we allocate the request's buffer in *con_cls, or refuse at once a
 * body whose Content-Length is over CERB_SERVE_MAX_BODY), then with each
 * piece of the body (appended; a chunked body that grows beyond the limit
 * marks the request too big and the rest is dropped), then once more with
 * nothing left, when the request is answered. The buffer is freed by the
 * completion callback, whichever way the request ended.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "serve.h"
#include "serve_internal.h"

/* How long a stop lets the requests being answered finish. */
#define DRAIN_MS 5000

struct request {
    size_t len;
    bool too_big;
    char body[CERB_SERVE_MAX_BODY + 1];
};

/* Whether the request carries `Authorization: Bearer @token` or, on
 * Dapr's routes (@dapr), Dapr's `dapr-api-token: @token`. The comparison
 * takes the same time whichever byte differs. */
static bool authorized(struct MHD_Connection *conn, const char *token, bool dapr)
{
    static const char scheme[] = "Bearer ";
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    const char *dh = dapr ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                        "dapr-api-token")
                          : NULL;
    size_t n = strlen(token);

    if (dh && strlen(dh) == n && CRYPTO_memcmp(dh, token, n) == 0)
        return true;
    if (!h || strncasecmp(h, scheme, sizeof scheme - 1) != 0)
        return false;
    h += sizeof scheme - 1;
    return strlen(h) == n && CRYPTO_memcmp(h, token, n) == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct cerb__serve_listener *l = cls;
    struct cerb__serve *s = l->s;
    struct request *rq = *con_cls;

    (void)version;
    if (!rq) {
        if (l->token && !authorized(conn, l->token, cerb__serve_dapr_path(url)))
            return cerb__serve_reply_unauthorized(
                conn, "this TCP socket needs the header Authorization: Bearer TOKEN, "
                      "with the token of the server's --token-file");
        /* A body announced too big is refused before it is read: MHD then
         * discards it and closes the connection. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > CERB_SERVE_MAX_BODY)
            return cerb__serve_reply_error(conn, CERB_EINVAL, "body: more than 4096 bytes");
        rq = calloc(1, sizeof *rq);
        if (!rq)
            return MHD_NO;
        *con_cls = rq;
        cerb__serve_waits_enter(&s->waits);
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        if (rq->too_big || n > CERB_SERVE_MAX_BODY - rq->len) {
            rq->too_big = true;
        } else {
            memcpy(rq->body + rq->len, upload_data, n);
            rq->len += n;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    rq->body[rq->len] = '\0';
    if (rq->too_big)
        return cerb__serve_reply_error(conn, CERB_EINVAL, "body: more than 4096 bytes");
    return cerb__serve_route(s, conn, method, url, rq->body, rq->len);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct cerb__serve *s = ((struct cerb__serve_listener *)cls)->s;

    (void)conn;
    (void)toe;
    if (*con_cls) {
        free(*con_cls);
        *con_cls = NULL;
        cerb__serve_waits_leave(&s->waits);
    }
}

/* The listening socket at @path, mode 0660; -1 with @err written. */
static int listen_unix(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    struct stat st;
    int fd;

    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "unix:%s: path too long for a socket", path);
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* A server that still answers there keeps its socket; a file that
     * nobody answers on was left by one that died, and is replaced. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        snprintf(err, errlen, "unix:%s: another server is listening there", path);
        close(fd);
        errno = EADDRINUSE;
        return -1;
    }
    close(fd);
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "unix:%s: exists and is not a socket", path);
        errno = EEXIST;
        return -1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(path, 0660) != 0 ||
        listen(fd, 64) != 0) {
        snprintf(err, errlen, "unix:%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

cerb_status cerb__serve_tcp_parse(const char *addr, struct sockaddr_storage *sa,
                                  socklen_t *salen, char *err, size_t errlen)
{
    char host[64];
    const char *colon, *h = addr, *port;
    size_t hl;
    char *end;
    unsigned long p;

    memset(sa, 0, sizeof *sa);
    if (addr[0] == '[') {
        const char *close_br = strchr(addr, ']');
        if (!close_br || close_br[1] != ':')
            goto bad;
        h = addr + 1;
        hl = (size_t)(close_br - h);
        port = close_br + 2;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || strchr(addr, ':') != colon)
            goto bad;
        hl = (size_t)(colon - addr);
        port = colon + 1;
    }
    if (hl == 0 || hl >= sizeof host || !port[0])
        goto bad;
    memcpy(host, h, hl);
    host[hl] = '\0';
    if (strspn(port, "0123456789") != strlen(port) || strlen(port) > 5)
        goto bad;
    p = strtoul(port, &end, 10);
    if (p > 65535)
        goto bad;
    if (addr[0] != '[') {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        if (inet_pton(AF_INET, host, &in->sin_addr) != 1)
            goto bad;
        if ((ntohl(in->sin_addr.s_addr) >> 24) != 127)
            goto not_loopback;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)p);
        *salen = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
        if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
            goto bad;
        if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
            goto not_loopback;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)p);
        *salen = sizeof *in6;
    }
    return CERB_OK;
bad:
    snprintf(err, errlen, "%s: not an address ADDRESS:PORT (127.0.0.1:PORT, [::1]:PORT)",
             addr);
    return CERB_EINVAL;
not_loopback:
    snprintf(err, errlen, "%s: TCP is served on loopback addresses only (127.0.0.0/8, ::1)",
             addr);
    return CERB_EINVAL;
}

/* A listening TCP socket at @sa; its port in *port; -1 with @err written. */
static int listen_tcp(const char *addr, const struct sockaddr_storage *sa, socklen_t salen,
                      unsigned *port, char *err, size_t errlen)
{
    struct sockaddr_storage got;
    socklen_t gotlen = sizeof got;
    int one = 1;
    int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (sa->ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
        bind(fd, (const struct sockaddr *)sa, salen) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&got, &gotlen) != 0) {
        snprintf(err, errlen, "%s: %s", addr, strerror(errno));
        close(fd);
        return -1;
    }
    *port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                            : ((struct sockaddr_in *)&got)->sin_port);
    return fd;
}

/* Hands @fd to a new daemon answering for @s (the next listener, which
 * takes @path and @token); CERB_OK, or CERB_EIO/CERB_ENOMEM with @fd closed
 * and @path removed. */
static cerb_status add_listener(struct cerb__serve *s, int fd, const char *path,
                                const char *token, const char *what, char *err,
                                size_t errlen)
{
    struct cerb__serve_listener *l;

    if (s->n_listeners == CERB_SERVE_MAX_LISTENERS) {
        snprintf(err, errlen, "%s: more than %d sockets", what, CERB_SERVE_MAX_LISTENERS);
        goto fail;
    }
    l = &s->listeners[s->n_listeners];
    memset(l, 0, sizeof *l);
    l->s = s;
    if ((path && !(l->path = strdup(path))) || (token && !(l->token = strdup(token)))) {
        snprintf(err, errlen, "out of memory");
        goto fail_free;
    }
    l->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
                                     MHD_USE_THREAD_PER_CONNECTION,
                                 0, NULL, NULL, on_request, l,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
                                 MHD_OPTION_END);
    if (!l->daemon) {
        snprintf(err, errlen, "%s: the HTTP server would not start", what);
        goto fail_free;
    }
    s->n_listeners++;
    return CERB_OK;

fail_free:
    if (l->token)
        OPENSSL_cleanse(l->token, strlen(l->token));
    free(l->token);
    free(l->path);
    memset(l, 0, sizeof *l);
fail:
    close(fd);
    if (path)
        unlink(path);
    return CERB_EIO;
}

cerb_status cerb__serve_listen_unix(struct cerb__serve *s, const char *path, char *err,
                                    size_t errlen)
{
    char what[160];
    int fd = listen_unix(path, err, errlen);

    if (fd < 0)
        return errno == ENAMETOOLONG ? CERB_EINVAL : CERB_EIO;
    snprintf(what, sizeof what, "unix:%.150s", path);
    return add_listener(s, fd, path, NULL, what, err, errlen);
}

cerb_status cerb__serve_listen_tcp(struct cerb__serve *s, const char *addr,
                                   const char *token, unsigned *port, char *err,
                                   size_t errlen)
{
    struct sockaddr_storage sa;
    socklen_t salen;
    unsigned p = 0;
    cerb_status st = cerb__serve_tcp_parse(addr, &sa, &salen, err, errlen);
    int fd;

    if (st != CERB_OK)
        return st;
    if (!token || !token[0]) {
        snprintf(err, errlen, "%s: TCP needs a bearer token (--token-file)", addr);
        return CERB_EINVAL;
    }
    fd = listen_tcp(addr, &sa, salen, &p, err, errlen);
    if (fd < 0)
        return CERB_EIO;
    st = add_listener(s, fd, NULL, token, addr, err, errlen);
    if (st == CERB_OK && port)
        *port = p;
    return st;
}

cerb_status cerb__serve_start(cerb_client *client, const char *unix_path,
                              struct cerb__serve **out, char *err, size_t errlen)
{
    struct cerb__serve *s;
    cerb_status st;

    *out = NULL;
    s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return CERB_ENOMEM;
    }
    s->client = client;
    cerb__serve_holds_init(&s->holds);
    cerb__serve_waits_init(&s->waits);
    st = cerb__serve_dapr_new(&s->dapr);
    if (st != CERB_OK) {
        snprintf(err, errlen, "out of memory");
        goto fail_dapr;
    }
    st = cerb__serve_expiry_start(&s->expiry, &s->holds, &s->waits);
    if (st != CERB_OK) {
        snprintf(err, errlen, "cannot start the expiry thread");
        goto fail;
    }
    if (unix_path) {
        st = cerb__serve_listen_unix(s, unix_path, err, errlen);
        if (st != CERB_OK)
            goto fail;
    }
    *out = s;
    return CERB_OK;

fail:
    cerb__serve_expiry_stop(&s->expiry);
    cerb__serve_dapr_free(s->dapr);
fail_dapr:
    cerb__serve_holds_destroy(&s->holds);
    cerb__serve_waits_destroy(&s->waits);
    free(s);
    return st;
}

void cerb__serve_set_heartbeat_ms(struct cerb__serve *s, int64_t ms)
{
    cerb__serve_holds_set_heartbeat(&s->holds, ms);
}

void cerb__serve_stop(struct cerb__serve *s)
{
    if (!s)
        return;
    /* Acquisitions waiting now end with 503 INTERRUPTED and new ones are
     * refused; the answers being made are sent (for a bounded time); then
     * MHD closes the connections and the listening socket and joins its
     * threads, the expiry thread stops, and the holds left are released. */
    cerb__serve_waits_stop(&s->waits);
    cerb__serve_holds_stop_streams(&s->holds); /* event streams end */
    cerb__serve_waits_drain(&s->waits, DRAIN_MS);
    for (size_t i = 0; i < s->n_listeners; i++)
        MHD_stop_daemon(s->listeners[i].daemon);
    cerb__serve_expiry_stop(&s->expiry);
    cerb__serve_waits_destroy(&s->waits);
    cerb__serve_holds_destroy(&s->holds);
    cerb__serve_dapr_free(s->dapr);
    for (size_t i = 0; i < s->n_listeners; i++) {
        struct cerb__serve_listener *l = &s->listeners[i];
        if (l->path)
            unlink(l->path);
        if (l->token)
            OPENSSL_cleanse(l->token, strlen(l->token));
        free(l->path);
        free(l->token);
    }
    free(s);
}
