/*
 * serve.c — the HTTP server of `cerberus serve`: its socket, its
 * libmicrohttpd daemon, and the collection of each request's body before
 * serve_routes.c answers it.
 *
 * Every socket is made here (or adopted from systemd, serve_systemd.c) and
 * handed to its own MHD daemon with MHD_OPTION_LISTEN_SOCKET: a unix
 * socket (socket, bind, chown to serve.socket_group, chmod serve.
 * socket_mode, listen), so that its group and mode are set before anyone
 * can connect. A file already at the path is replaced only when it is a
 * socket and a non-blocking connect() to it is refused (ECONNREFUSED:
 * nobody listens, a dead server's file); any other answer (a server, a full
 * backlog, no permission) or a file that is no socket is left alone and
 * the start fails. The file's st_dev/st_ino are kept after bind, and the
 * stop removes the path only while lstat still finds that file there (a
 * newer server may have replaced it). Or a TCP one on a loopback address (127.0.0.0/8 or ::1), or
 * on any address with serve.allow_remote, whose port is then known from
 * getsockname (port 0 lets the kernel choose). Each daemon has the limits
 * of serve.max_connections (MHD_OPTION_CONNECTION_LIMIT: at the limit MHD
 * stops accepting, so a new connection waits in the socket's backlog until
 * one closes; we count connections, MHD_OPTION_NOTIFY_CONNECTION, to log
 * that the limit was reached) and serve.idle_timeout_s
 * (MHD_OPTION_CONNECTION_TIMEOUT), and sends its complaints to the log
 * (MHD_OPTION_EXTERNAL_LOGGER), at most one a second per reason. The daemons share
 * the routes; each has its listener as cls, which says whether the
 * connection is TCP. A TCP request must carry `Authorization: Bearer
 * TOKEN`, compared in constant time (CRYPTO_memcmp after a length check)
 * before its body is read; without it, or with another, it is answered
 * 401 UNAUTHORIZED. The unix socket needs no token: its mode is the
 * control. The token is never logged nor put in an answer; a reload may
 * replace it (cerb__serve_set_token), so it is read under token_mu. Before
 * the token, the socket's rate limit (serve_limits.c) is applied, so that
 * guessing tokens is limited too. MHD runs a thread per connection
 * (MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION): a
 * blocking acquisition then holds only its own connection's thread.
 *
 * MHD calls the access handler several times per request: first with no
 * body (we allocate the request's buffer in *con_cls, or refuse at once a
 * body whose Content-Length is over serve.max_body), then with each
 * piece of the body (appended; a chunked body that grows beyond the limit
 * marks the request too big and the rest is dropped), then once more with
 * nothing left, when the request is answered. The buffer is freed by the
 * completion callback, whichever way the request ended.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "serve.h"
#include "serve_internal.h"

struct request {
    size_t len, max;
    bool too_big;
    bool stream; /* an event stream: no idle timeout while it runs */
    char body[]; /* max + 1 bytes */
};

/* Whether @given is the listener's token (the caller holds token_mu). The
 * comparison takes the same time whichever byte differs. */
static bool token_is(const struct cerb__serve_listener *l, const char *given)
{
    return given && strlen(given) == strlen(l->token) &&
           CRYPTO_memcmp(given, l->token, strlen(given)) == 0;
}

/* Whether the request carries `Authorization: Bearer TOKEN` with the
 * listener's token or, on Dapr's routes (@dapr), Dapr's `dapr-api-token:
 * TOKEN`, as the Dapr SDKs send it. */
static bool authorized(struct MHD_Connection *conn, struct cerb__serve_listener *l, bool dapr)
{
    static const char scheme[] = "Bearer ";
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    const char *dh = dapr ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                        "dapr-api-token")
                          : NULL;
    bool ok;

    if (h && strncasecmp(h, scheme, sizeof scheme - 1) == 0)
        h += sizeof scheme - 1;
    else
        h = NULL;
    cerb__serve_lock(&l->s->token_mu);
    ok = token_is(l, h) || token_is(l, dh);
    cerb__serve_unlock(&l->s->token_mu);
    return ok;
}

/* The socket's rate limit: true to go on, else the request was answered
 * 429 (in *@ret). */
static bool rate_ok(struct cerb__serve_listener *l, struct MHD_Connection *conn,
                    enum MHD_Result *ret)
{
    struct cerb__serve *s = l->s;
    unsigned retry = 1;
    int rate, burst;
    char secs[16];

    cerb__serve_lock(&s->opts_mu);
    rate = s->opts.rate_limit;
    burst = s->opts.rate_burst;
    cerb__serve_unlock(&s->opts_mu);
    if (cerb__serve_bucket_take(&l->bucket, rate, burst, cerb__serve_now_ns(), &retry))
        return true;
    snprintf(secs, sizeof secs, "%u", retry);
    cerb__serve_log_limited(CERB_SERVE_LOG_RATE, "limit",
                            (const char *const[]){"reason", "rate", "socket", l->name,
                                                  "retry_after_s", secs, NULL});
    *ret = cerb__serve_reply_rate_limited(conn, retry);
    return false;
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
        enum MHD_Result ret;
        size_t max;
        char why[64];
        if (!rate_ok(l, conn, &ret))
            return ret;
        if (l->needs_token && !authorized(conn, l, cerb__serve_dapr_path(url)))
            return cerb__serve_reply_unauthorized(
                conn, "this TCP socket needs the header Authorization: Bearer TOKEN, "
                      "with the token of the server's token file");
        cerb__serve_lock(&s->opts_mu);
        max = (size_t)s->opts.max_body;
        cerb__serve_unlock(&s->opts_mu);
        /* A body announced too big is refused before it is read: MHD then
         * discards it and closes the connection. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > max) {
            snprintf(why, sizeof why, "body: more than %zu bytes", max);
            return cerb__serve_reply_error(conn, CERB_EINVAL, why);
        }
        rq = calloc(1, sizeof *rq + max + 1);
        if (!rq)
            return MHD_NO;
        rq->max = max;
        *con_cls = rq;
        /* An event stream is silent between heartbeats, longer than a
         * short idle timeout, and MHD would cut it while the reader waits
         * (it checks the timeout before the event is sent): the stream
         * notices a caller gone by its heartbeat instead, so its
         * connection has no timeout until the request completes. */
        rq->stream = strcmp(method, MHD_HTTP_METHOD_GET) == 0 && strlen(url) > 7 &&
                     strcmp(url + strlen(url) - 7, "/events") == 0;
        if (rq->stream)
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
        cerb__serve_waits_enter(&s->waits);
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        if (rq->too_big || n > rq->max - rq->len) {
            rq->too_big = true;
        } else {
            memcpy(rq->body + rq->len, upload_data, n);
            rq->len += n;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    rq->body[rq->len] = '\0';
    if (rq->too_big) {
        char why[64];
        snprintf(why, sizeof why, "body: more than %zu bytes", rq->max);
        return cerb__serve_reply_error(conn, CERB_EINVAL, why);
    }
    return cerb__serve_route(s, conn, method, url, rq->body, rq->len);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct cerb__serve *s = ((struct cerb__serve_listener *)cls)->s;

    (void)toe;
    if (*con_cls) {
        if (((struct request *)*con_cls)->stream) {
            unsigned idle;
            cerb__serve_lock(&s->opts_mu);
            idle = (unsigned)s->opts.idle_timeout_s;
            cerb__serve_unlock(&s->opts_mu);
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, idle);
        }
        free(*con_cls);
        *con_cls = NULL;
        cerb__serve_waits_leave(&s->waits);
    }
}

/* A connection opens or closes on a listener: at the limit, a record
 * (once a second at most) says new ones now wait. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct cerb__serve_listener *l = cls;
    unsigned n, max;
    char ns[16];

    (void)conn;
    (void)socket_context;
    if (code != MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_sub(&l->connections, 1);
        return;
    }
    n = atomic_fetch_add(&l->connections, 1) + 1;
    cerb__serve_lock(&l->s->opts_mu);
    max = (unsigned)l->s->opts.max_connections;
    cerb__serve_unlock(&l->s->opts_mu);
    if (n < max)
        return;
    snprintf(ns, sizeof ns, "%u", n);
    cerb__serve_log_limited(CERB_SERVE_LOG_CONNECTIONS, "limit",
                            (const char *const[]){"reason", "connections", "socket", l->name,
                                                  "open", ns, "then",
                                                  "new connections wait", NULL});
}

/* libmicrohttpd's complaints (MHD_OPTION_EXTERNAL_LOGGER): a connection
 * refused at serve.max_connections is a limit record, anything else an
 * http one; both at most once a second, since a flood would repeat them. */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt,
                                                              va_list ap)
{
    char msg[512];
    size_t n;

    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    if (strstr(msg, "connection limit") || strstr(msg, "Connection limit"))
        cerb__serve_log_limited(CERB_SERVE_LOG_CONNECTIONS, "limit",
                                (const char *const[]){"reason", "connections", "msg",
                                                      msg, NULL});
    else
        cerb__serve_log_limited(CERB_SERVE_LOG_HTTP, "http",
                                (const char *const[]){"msg", msg, NULL});
}

/* What is at @path (@sa) before a socket is made there: 0 when nothing
 * is, or a socket nobody listens on (a dead server's file, removed here);
 * -1 with @err written when a file that is no socket is there, a server
 * answers there, or we cannot tell. Only ECONNREFUSED means that nobody
 * listens: EAGAIN is a live server whose backlog is full, EACCES one we
 * may not reach, and either must keep its socket. The connect is
 * non-blocking, so a full backlog cannot hang the start. */
static int clear_stale(const char *path, const struct sockaddr_un *sa, char *err,
                       size_t errlen)
{
    struct stat st;
    int fd, rc;

    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "unix:%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "unix:%s: exists and is not a socket (left alone)", path);
        errno = EEXIST;
        return -1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    rc = connect(fd, (const struct sockaddr *)sa, sizeof *sa);
    if (rc == 0 || errno == EAGAIN || errno == EINPROGRESS) {
        snprintf(err, errlen, "unix:%s: another server is listening there%s", path,
                 rc == 0 ? "" : " (its backlog is full)");
        close(fd);
        errno = EADDRINUSE;
        return -1;
    }
    if (errno != ECONNREFUSED) {
        int e = errno;
        snprintf(err, errlen,
                 "unix:%s: cannot tell whether a server listens there (%s); "
                 "left alone: remove it if it is stale",
                 path, strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    close(fd);
    /* Nobody listens: the file of a server that died. */
    if (unlink(path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "unix:%s: cannot remove a stale socket: %s", path,
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* Removes @path only if it is still the socket file @dev/@ino (the one this
 * server made): another server may have replaced it since. */
static void unlink_own(const char *path, dev_t dev, ino_t ino)
{
    struct stat st;

    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev &&
        st.st_ino == ino)
        unlink(path);
}

/* The listening socket at @path, with @gid (-1: left) and @mode, its
 * file's identity in *@dev/@ino; -1 with @err written. */
static int listen_unix(const char *path, long gid, unsigned mode, dev_t *dev, ino_t *ino,
                       char *err, size_t errlen)
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
    /* A server that still answers there keeps its socket; a file that
     * nobody answers on was left by one that died, and is replaced. */
    if (clear_stale(path, &sa, err, errlen) != 0)
        return -1;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* Nobody can connect before listen(): the group and mode are set
     * first. bind() never replaces a file: one made meanwhile is EADDRINUSE. */
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        snprintf(err, errlen, "unix:%s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (lstat(path, &st) != 0) {
        snprintf(err, errlen, "unix:%s: gone after bind: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    *dev = st.st_dev;
    *ino = st.st_ino;
    if (gid >= 0 && chown(path, (uid_t)-1, (gid_t)gid) != 0) {
        snprintf(err, errlen, "unix:%s: cannot give it group %ld: %s", path, gid,
                 strerror(errno));
        goto fail;
    }
    if (chmod(path, mode) != 0 || listen(fd, 64) != 0) {
        snprintf(err, errlen, "unix:%s: %s", path, strerror(errno));
        goto fail;
    }
    return fd;
fail:
    close(fd);
    unlink_own(path, *dev, *ino);
    return -1;
}

/* Whether @sa is a loopback address (127.0.0.0/8, ::1). */
static bool is_loopback(const struct sockaddr_storage *sa)
{
    if (sa->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return false;
}

cerb_status cerb__serve_tcp_addr(const char *addr, bool allow_remote,
                                 struct sockaddr_storage *sa, socklen_t *salen, char *err,
                                 size_t errlen)
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
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)p);
        *salen = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
        if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
            goto bad;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)p);
        *salen = sizeof *in6;
    }
    if (!allow_remote && !is_loopback(sa)) {
        snprintf(err, errlen,
                 "%s: TCP is served on loopback addresses only (127.0.0.0/8, ::1) "
                 "unless serve.allow_remote (--allow-remote) is set",
                 addr);
        return CERB_EINVAL;
    }
    return CERB_OK;
bad:
    snprintf(err, errlen, "%s: not an address ADDRESS:PORT (127.0.0.1:PORT, [::1]:PORT)",
             addr);
    return CERB_EINVAL;
}

cerb_status cerb__serve_tcp_parse(const char *addr, struct sockaddr_storage *sa,
                                  socklen_t *salen, char *err, size_t errlen)
{
    return cerb__serve_tcp_addr(addr, false, sa, salen, err, errlen);
}

/* The port of @sa. */
static unsigned port_of(const struct sockaddr_storage *sa)
{
    return ntohs(sa->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)sa)->sin6_port
                                           : ((const struct sockaddr_in *)sa)->sin_port);
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
    *port = port_of(&got);
    return fd;
}

/* Hands @fd to a new daemon answering for @s (the next listener, which
 * takes @path and @token, named @what); CERB_OK, or CERB_EIO/CERB_ENOMEM
 * with @fd closed and @path removed. */
static cerb_status add_listener(struct cerb__serve *s, int fd, const char *path,
                                dev_t dev, ino_t ino, const char *token, const char *what,
                                char *err, size_t errlen)
{
    struct cerb__serve_listener *l;
    struct cerb__serve_opts o;

    if (s->n_listeners == CERB_SERVE_MAX_LISTENERS) {
        snprintf(err, errlen, "%s: more than %d sockets", what, CERB_SERVE_MAX_LISTENERS);
        goto fail;
    }
    cerb__serve_lock(&s->opts_mu);
    o = s->opts;
    cerb__serve_unlock(&s->opts_mu);
    l = &s->listeners[s->n_listeners];
    memset(l, 0, sizeof *l);
    l->s = s;
    snprintf(l->name, sizeof l->name, "%s", what);
    if ((path && !(l->path = strdup(path))) || (token && !(l->token = strdup(token)))) {
        snprintf(err, errlen, "out of memory");
        goto fail_free;
    }
    l->needs_token = l->token != NULL;
    l->path_dev = dev;
    l->path_ino = ino;
    cerb__serve_bucket_init(&l->bucket);
    /* At the limit a connection waits in the backlog (listen(2)'s 64)
     * until one closes; an idle one is closed after the timeout,
     * which MHD counts from the connection's last activity and never
     * while our handler runs (a blocking acquisition, an event stream's
     * reader waiting for its next event). */
    l->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
                                     MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
                                 0, NULL, NULL, on_request, l,
                                 /* first, or MHD complains on stderr */
                                 MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                                 MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned int)o.max_connections,
                                 MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned int)o.idle_timeout_s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, l,
                                 MHD_OPTION_END);
    if (!l->daemon) {
        snprintf(err, errlen, "%s: the HTTP server would not start", what);
        cerb__serve_bucket_destroy(&l->bucket);
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
        unlink_own(path, dev, ino);
    return CERB_EIO;
}

cerb_status cerb__serve_listen_unix(struct cerb__serve *s, const char *path, char *err,
                                    size_t errlen)
{
    char what[160];
    long gid;
    unsigned mode;
    cerb_status st;
    dev_t dev = 0;
    ino_t ino = 0;
    int fd;

    cerb__serve_lock(&s->opts_mu);
    gid = s->opts.socket_gid;
    mode = s->opts.socket_mode;
    cerb__serve_unlock(&s->opts_mu);
    fd = listen_unix(path, gid, mode, &dev, &ino, err, errlen);
    if (fd < 0)
        return errno == ENAMETOOLONG ? CERB_EINVAL : CERB_EIO;
    snprintf(what, sizeof what, "unix:%.150s", path);
    st = add_listener(s, fd, path, dev, ino, NULL, what, err, errlen);
    if (st == CERB_OK) {
        char m[8];
        snprintf(m, sizeof m, "%04o", mode);
        CERB_SERVE_LOG(CERB_LOG_INFO, "listen", "addr", what, "auth", "none", "mode", m);
    }
    return st;
}

cerb_status cerb__serve_listen_tcp(struct cerb__serve *s, const char *addr,
                                   const char *token, unsigned *port, char *err,
                                   size_t errlen)
{
    struct sockaddr_storage sa;
    socklen_t salen;
    unsigned p = 0;
    bool remote;
    cerb_status st;
    int fd;

    cerb__serve_lock(&s->opts_mu);
    remote = s->opts.allow_remote;
    cerb__serve_unlock(&s->opts_mu);
    st = cerb__serve_tcp_addr(addr, remote, &sa, &salen, err, errlen);
    if (st != CERB_OK)
        return st;
    if (!token || !token[0]) {
        snprintf(err, errlen, "%s: TCP needs a bearer token (--token-file)", addr);
        return CERB_EINVAL;
    }
    fd = listen_tcp(addr, &sa, salen, &p, err, errlen);
    if (fd < 0)
        return CERB_EIO;
    st = add_listener(s, fd, NULL, 0, 0, token, addr, err, errlen);
    if (st == CERB_OK) {
        char ps[8];
        snprintf(ps, sizeof ps, "%u", p);
        CERB_SERVE_LOG(CERB_LOG_INFO, "listen", "addr", addr, "port", ps, "auth", "bearer",
                       "remote", is_loopback(&sa) ? NULL : "yes");
        if (port)
            *port = p;
    }
    return st;
}

cerb_status cerb__serve_listen_fd(struct cerb__serve *s, int fd, const char *token,
                                  char *name, size_t namelen, char *err, size_t errlen)
{
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa, ol;
    int type = 0, acc = 0;
    char host[INET6_ADDRSTRLEN], what[160];
    bool remote;
    cerb_status st;

    ol = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ol) != 0 || type != SOCK_STREAM) {
        snprintf(err, errlen, "passed descriptor %d: not a stream socket", fd);
        return CERB_EINVAL;
    }
    ol = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &ol) != 0 || !acc) {
        snprintf(err, errlen, "passed descriptor %d: not listening", fd);
        return CERB_EINVAL;
    }
    memset(&sa, 0, sizeof sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
        snprintf(err, errlen, "passed descriptor %d: %s", fd, strerror(errno));
        return CERB_EINVAL;
    }
    cerb__serve_lock(&s->opts_mu);
    remote = s->opts.allow_remote;
    cerb__serve_unlock(&s->opts_mu);
    if (sa.ss_family == AF_UNIX) {
        const struct sockaddr_un *un = (const struct sockaddr_un *)&sa;
        /* An abstract or unnamed socket has no file: its name is shown
         * with '@' (abstract) or as "(unnamed)". */
        if (salen > offsetof(struct sockaddr_un, sun_path) && un->sun_path[0])
            snprintf(what, sizeof what, "unix:%.150s", un->sun_path);
        else if (salen > offsetof(struct sockaddr_un, sun_path) + 1)
            snprintf(what, sizeof what, "unix:@%.*s",
                     (int)(salen - offsetof(struct sockaddr_un, sun_path) - 1),
                     un->sun_path + 1);
        else
            snprintf(what, sizeof what, "unix:(unnamed)");
        /* No path: the file is systemd's (the socket unit removes it). */
        st = add_listener(s, fd, NULL, 0, 0, NULL, what, err, errlen);
        if (st == CERB_OK)
            CERB_SERVE_LOG(CERB_LOG_INFO, "listen", "addr", what, "auth", "none", "from",
                           "systemd");
    } else if (sa.ss_family == AF_INET || sa.ss_family == AF_INET6) {
        const void *a = sa.ss_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)&sa)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)&sa)->sin6_addr;
        char ps[8];
        inet_ntop(sa.ss_family, a, host, sizeof host);
        snprintf(what, sizeof what, sa.ss_family == AF_INET ? "%s:%u" : "[%s]:%u", host,
                 port_of(&sa));
        if (!remote && !is_loopback(&sa)) {
            snprintf(err, errlen,
                     "passed socket %s: TCP is served on loopback addresses only "
                     "(127.0.0.0/8, ::1) unless serve.allow_remote (--allow-remote) is set",
                     what);
            return CERB_EINVAL;
        }
        if (!token || !token[0]) {
            snprintf(err, errlen, "passed socket %s: TCP needs a bearer token "
                                  "(serve.token_file, --token-file)", what);
            return CERB_EINVAL;
        }
        snprintf(ps, sizeof ps, "%u", port_of(&sa));
        st = add_listener(s, fd, NULL, 0, 0, token, what, err, errlen);
        if (st == CERB_OK)
            CERB_SERVE_LOG(CERB_LOG_INFO, "listen", "addr", what, "port", ps, "auth",
                           "bearer", "remote", is_loopback(&sa) ? NULL : "yes", "from",
                           "systemd");
    } else {
        snprintf(err, errlen, "passed descriptor %d: neither a unix nor a TCP socket", fd);
        return CERB_EINVAL;
    }
    if (st == CERB_OK && name)
        snprintf(name, namelen, "%s", what);
    return st;
}

void cerb__serve_configure(struct cerb__serve *s, const struct cerb__serve_opts *o)
{
    cerb__serve_lock(&s->opts_mu);
    s->opts = *o;
    cerb__serve_unlock(&s->opts_mu);
}

int64_t cerb__serve_keepalive_ms(struct cerb__serve *s)
{
    int64_t ms;

    cerb__serve_lock(&s->opts_mu);
    ms = s->opts.keepalive_ms;
    cerb__serve_unlock(&s->opts_mu);
    return ms;
}

cerb_status cerb__serve_set_token(struct cerb__serve *s, const char *token)
{
    char *copies[CERB_SERVE_MAX_LISTENERS] = {NULL};

    if (!token || !token[0])
        return CERB_EINVAL;
    /* Every copy is made before any is swapped: out of memory keeps the
     * old token on every socket, never a mix. */
    for (size_t i = 0; i < s->n_listeners; i++) {
        if (s->listeners[i].needs_token && !(copies[i] = strdup(token))) {
            for (size_t j = 0; j < i; j++)
                if (copies[j]) {
                    OPENSSL_cleanse(copies[j], strlen(copies[j]));
                    free(copies[j]);
                }
            return CERB_ENOMEM;
        }
    }
    cerb__serve_lock(&s->token_mu);
    for (size_t i = 0; i < s->n_listeners; i++) {
        struct cerb__serve_listener *l = &s->listeners[i];
        char *old = l->token;
        if (!old)
            continue;
        l->token = copies[i];
        copies[i] = old;
    }
    cerb__serve_unlock(&s->token_mu);
    for (size_t i = 0; i < s->n_listeners; i++)
        if (copies[i]) {
            OPENSSL_cleanse(copies[i], strlen(copies[i]));
            free(copies[i]);
        }
    return CERB_OK;
}

cerb_status cerb__serve_start(cerb_client *client, const char *unix_path,
                              struct cerb__serve **out, char *err, size_t errlen)
{
    static const struct cerb__serve_opts defaults = CERB__SERVE_OPTS_INIT;
    struct cerb__serve *s;
    cerb_status st;

    *out = NULL;
    s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return CERB_ENOMEM;
    }
    s->client = client;
    s->opts = defaults;
    if (pthread_mutex_init(&s->opts_mu, NULL) != 0 ||
        pthread_mutex_init(&s->token_mu, NULL) != 0)
        abort();
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
    {
        size_t released, left; /* none yet */
        cerb__serve_holds_destroy(&s->holds, 0, &released, &left);
    }
    cerb__serve_waits_destroy(&s->waits);
    pthread_mutex_destroy(&s->opts_mu);
    pthread_mutex_destroy(&s->token_mu);
    free(s);
    return st;
}

void cerb__serve_set_heartbeat_ms(struct cerb__serve *s, int64_t ms)
{
    cerb__serve_holds_set_heartbeat(&s->holds, ms);
}

void cerb__serve_stop_report(struct cerb__serve *s, size_t *released, bool *drained)
{
    char held[24], ms[24], kept[24];
    int64_t drain_ms, t0, budget_ms;
    size_t left;
    bool done;

    *released = 0;
    *drained = true;
    if (!s)
        return;
    drain_ms = s->opts.drain_ms; /* one thread: nothing changes it now */
    t0 = cerb__serve_now_ns();
    /* Acquisitions waiting now end with 503 INTERRUPTED and new ones are
     * refused; the answers being made are sent (for a bounded time); then
     * MHD closes the connections and the listening socket and joins its
     * threads, the expiry thread stops, and the holds left are released. */
    cerb__serve_waits_stop(&s->waits);
    cerb__serve_holds_stop_streams(&s->holds); /* event streams end */
    done = cerb__serve_waits_drain(&s->waits, drain_ms);
    for (size_t i = 0; i < s->n_listeners; i++)
        MHD_stop_daemon(s->listeners[i].daemon);
    cerb__serve_expiry_stop(&s->expiry);
    cerb__serve_waits_destroy(&s->waits);
    /* The releases get what the drain left of serve.drain_ms, at least
     * CERB_SERVE_STOP_RELEASE_MIN_MS: one after another, each bounded only
     * by the engine's timeouts, 100 holds on a silent server took minutes,
     * past a service manager's stop timeout. Those not released by then
     * expire with their lease. */
    budget_ms = drain_ms - (cerb__serve_now_ns() - t0) / 1000000;
    if (budget_ms < CERB_SERVE_STOP_RELEASE_MIN_MS)
        budget_ms = CERB_SERVE_STOP_RELEASE_MIN_MS;
    cerb__serve_holds_destroy(&s->holds, budget_ms, released, &left);
    cerb__serve_dapr_free(s->dapr);
    for (size_t i = 0; i < s->n_listeners; i++) {
        struct cerb__serve_listener *l = &s->listeners[i];
        if (l->path) /* only if still ours: a newer server may be there */
            unlink_own(l->path, l->path_dev, l->path_ino);
        if (l->token)
            OPENSSL_cleanse(l->token, strlen(l->token));
        free(l->path);
        free(l->token);
        cerb__serve_bucket_destroy(&l->bucket);
    }
    pthread_mutex_destroy(&s->opts_mu);
    pthread_mutex_destroy(&s->token_mu);
    free(s);
    snprintf(held, sizeof held, "%zu", *released);
    snprintf(kept, sizeof kept, "%zu", left);
    snprintf(ms, sizeof ms, "%lld", (long long)drain_ms);
    CERB_SERVE_LOG(done && left == 0 ? CERB_LOG_INFO : CERB_LOG_WARN, "stop",
                   "holds_released", held, "drained", done ? "yes" : "no", "drain_ms", ms,
                   "holds_left", kept);
    *drained = done;
}

void cerb__serve_stop(struct cerb__serve *s)
{
    size_t n;
    bool drained;

    cerb__serve_stop_report(s, &n, &drained);
}
