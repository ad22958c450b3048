/*
 * serve.c — the HTTP server of `cerberus serve`: its socket, its
 * libmicrohttpd daemon, and the collection of each request's body before
 * serve_routes.c answers it.
 *
 * The unix socket is made here (socket, bind, chmod 0660, listen) and
 * handed to MHD with MHD_OPTION_LISTEN_SOCKET, so that its mode is set
 * before anyone can connect. MHD runs a thread per connection
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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "serve.h"
#include "serve_internal.h"

/* How long a stop lets the requests being answered finish. */
#define DRAIN_MS 5000

struct request {
    size_t len;
    bool too_big;
    char body[CERB_SERVE_MAX_BODY + 1];
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct cerb__serve *s = cls;
    struct request *rq = *con_cls;

    (void)version;
    if (!rq) {
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
    struct cerb__serve *s = cls;

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

cerb_status cerb__serve_start(cerb_client *client, const char *unix_path,
                              struct cerb__serve **out, char *err, size_t errlen)
{
    struct cerb__serve *s;
    cerb_status st;

    *out = NULL;
    s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(unix_path))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return CERB_ENOMEM;
    }
    s->client = client;
    s->fd = -1;
    cerb__serve_holds_init(&s->holds);
    cerb__serve_waits_init(&s->waits);
    st = cerb__serve_expiry_start(&s->expiry, &s->holds);
    if (st != CERB_OK) {
        snprintf(err, errlen, "cannot start the expiry thread");
        goto fail;
    }
    s->fd = listen_unix(unix_path, err, errlen);
    if (s->fd < 0) {
        st = errno == ENAMETOOLONG ? CERB_EINVAL : CERB_EIO;
        goto fail;
    }
    s->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
                                     MHD_USE_THREAD_PER_CONNECTION,
                                 0, NULL, NULL, on_request, s,
                                 MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->fd,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_END);
    if (!s->daemon) {
        snprintf(err, errlen, "unix:%s: the HTTP server would not start", unix_path);
        st = CERB_EIO;
        close(s->fd);
        unlink(s->path);
        goto fail;
    }
    *out = s;
    return CERB_OK;

fail:
    cerb__serve_expiry_stop(&s->expiry);
    cerb__serve_holds_destroy(&s->holds);
    cerb__serve_waits_destroy(&s->waits);
    free(s->path);
    free(s);
    return st;
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
    cerb__serve_waits_drain(&s->waits, DRAIN_MS);
    MHD_stop_daemon(s->daemon);
    cerb__serve_expiry_stop(&s->expiry);
    cerb__serve_waits_destroy(&s->waits);
    cerb__serve_holds_destroy(&s->holds);
    unlink(s->path);
    free(s->path);
    free(s);
}
