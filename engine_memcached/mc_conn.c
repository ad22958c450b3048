/*
 * mc_conn.c — connections to memcached: a small text client of our own,
 * the pool, and the restart fingerprint.
 *
 * Why not libmemcached: Debian's libmemcached (1.1.4) speaks neither the
 * meta commands (ms/mg/md) nor a CAS-checked delete, so with it a release
 * could only be a get followed by an unconditional delete — the race every
 * memcached lock library has (a holder whose lease ran out deletes the next
 * holder's lock). The meta protocol is line-based, so a client is a socket,
 * a buffered line reader and poll(2) with the caller's deadline.
 *
 * Every socket is non-blocking and every wait is bounded by a deadline: a
 * paused server (SIGSTOP) accepts bytes and never answers. A call that
 * fails after its first byte left may have taken effect, so the caller
 * reports UNKNOWN and the connection is closed (never pooled again): no
 * later request can read the late answer of an earlier one.
 *
 * A new connection is checked before it carries any command
 * (cerb__mc_fingerprint, mc_marker.c). A pooled one is looked at before
 * reuse: readable (EOF or stray bytes: its server went away) means it is
 * closed instead, so a routine restart does not cost one failed call per
 * idle connection (which would open the breaker).
 */
/* POLLRDHUP (Linux): a peer that closed its end reads as ready. */
#define _GNU_SOURCE 1
#include "internal_posix.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "mc_internal.h"

/* Wait for fd to be ready for `events` until the deadline: 1 ready, 0 the
 * deadline passed, -1 an error. */
static int wait_fd(int fd, short events, int64_t deadline_ns)
{
    for (;;) {
        int64_t left = cerb__ms_left(deadline_ns);
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (r > 0)
            return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -1 : 1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

cerb_status cerb__mc_resolve(cerb_engine *e)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(e->host, e->port, &hints, &res);
    if (rc != 0)
        return cerb__error_set(CERB_EIO, "memcached: %s:%s: %s", e->host, e->port,
                               gai_strerror(rc));
    /* Several addresses could be several servers (a round-robin name, a
     * VIP in a rolling update): a name held on each. One only. */
    int n = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        bool dup = false;
        for (struct addrinfo *bi = res; bi != ai; bi = bi->ai_next)
            dup = dup || (bi->ai_addrlen == ai->ai_addrlen &&
                          memcmp(bi->ai_addr, ai->ai_addr, ai->ai_addrlen) == 0);
        if (!dup)
            n++;
    }
    if (n != 1 || res->ai_addrlen > sizeof e->addr) {
        freeaddrinfo(res);
        return cerb__error_set(CERB_ECONFIG,
                               "memcached.servers: %s resolves to %d addresses: name one "
                               "server by one address (several could be several memcached "
                               "processes, each granting the same names)",
                               e->host, n);
    }
    memcpy(&e->addr, res->ai_addr, res->ai_addrlen);
    e->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return CERB_OK;
}

static cerb_status dial(cerb_engine *e, int64_t deadline_ns, int *out)
{
    const struct sockaddr *sa = (const struct sockaddr *)&e->addr;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cerb__error_set(CERB_EIO, "memcached: socket: %s", strerror(errno));
    int one = 1, err = 0;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, sa, e->addrlen) != 0 && errno != EINPROGRESS) {
        err = errno;
        close(fd);
        return cerb__error_set(CERB_EIO, "memcached: %s:%s: %s", e->host, e->port,
                               strerror(err));
    }
    int w = wait_fd(fd, POLLOUT, deadline_ns);
    socklen_t sl = sizeof err;
    if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 && err == 0) {
        *out = fd;
        return CERB_OK;
    }
    if (w < 0)
        err = errno;
    close(fd);
    if (w == 0)
        return cerb__error_set(CERB_EIO, "memcached: %s:%s: no connection in time", e->host,
                               e->port);
    return cerb__error_set(CERB_EIO, "memcached: %s:%s: %s", e->host, e->port,
                           strerror(err ? err : ECONNREFUSED));
}

static cerb_status send_all(struct mc_conn *c, const char *p, size_t len, int64_t deadline_ns,
                            bool *sent)
{
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            *sent = true;
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(c->fd, POLLOUT, deadline_ns);
            if (w == 0)
                return cerb__error_set(CERB_EIO, "memcached: no answer from the server in time");
            if (w > 0)
                continue;
        }
        return cerb__error_set(CERB_EIO, "memcached: send: %s", strerror(errno));
    }
    return CERB_OK;
}

/* Fill the read buffer with at least one more byte. */
static cerb_status fill(struct mc_conn *c, int64_t deadline_ns)
{
    if (c->rpos > 0 && c->rpos == c->rlen)
        c->rpos = c->rlen = 0;
    if (c->rpos > 0 && c->rlen == sizeof c->rbuf) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->rlen == sizeof c->rbuf)
        return cerb__error_set(CERB_EPROTO, "memcached: a reply line longer than %zu bytes",
                               sizeof c->rbuf);
    for (;;) {
        ssize_t n = recv(c->fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, 0);
        if (n > 0) {
            c->rlen += (size_t)n;
            return CERB_OK;
        }
        if (n == 0)
            return cerb__error_set(CERB_EIO, "memcached: the server closed the connection");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return cerb__error_set(CERB_EIO, "memcached: recv: %s", strerror(errno));
        int w = wait_fd(c->fd, POLLIN, deadline_ns);
        if (w == 0)
            return cerb__error_set(CERB_EIO, "memcached: no answer from the server in time");
        if (w < 0)
            return cerb__error_set(CERB_EIO, "memcached: poll: %s", strerror(errno));
    }
}

/* The next line, without its CRLF, NUL-terminated in the buffer (valid
 * until the next read). */
static cerb_status read_line(struct mc_conn *c, int64_t deadline_ns, char **line)
{
    for (;;) {
        char *start = c->rbuf + c->rpos;
        size_t have = c->rlen - c->rpos;
        char *nl = have ? memchr(start, '\n', have) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - start);
            if (n > 0 && start[n - 1] == '\r')
                n--;
            start[n] = '\0';
            c->rpos += (size_t)(nl - start) + 1;
            *line = start;
            return CERB_OK;
        }
        cerb_status st = fill(c, deadline_ns);
        if (st != CERB_OK)
            return st;
    }
}

/* Read a value block of vlen bytes plus CRLF; keep its head in r->value. */
static cerb_status read_value(struct mc_conn *c, int64_t deadline_ns, struct mc_reply *r)
{
    size_t need = (size_t)r->vlen + 2, got = 0, kept = 0;
    while (got < need) {
        if (c->rpos == c->rlen) {
            cerb_status st = fill(c, deadline_ns);
            if (st != CERB_OK)
                return st;
        }
        size_t take = c->rlen - c->rpos;
        if (take > need - got)
            take = need - got;
        for (size_t i = 0; i < take; i++, got++)
            if (got < (size_t)r->vlen && kept + 1 < sizeof r->value)
                r->value[kept++] = c->rbuf[c->rpos + i];
        c->rpos += take;
    }
    r->value[kept] = '\0';
    return CERB_OK;
}

cerb_status cerb__mc_read_reply(struct mc_conn *c, int64_t deadline_ns, struct mc_reply *r)
{
    char *line = NULL;
    cerb_status st = read_line(c, deadline_ns, &line);
    if (st == CERB_OK)
        st = cerb__mc_parse(line, r);
    if (st == CERB_OK && r->vlen >= 0)
        st = read_value(c, deadline_ns, r);
    return st;
}

cerb_status cerb__mc_call(struct mc_conn *c, const char *req, size_t len, int64_t deadline_ns,
                          struct mc_reply *r, bool *sent)
{
    *sent = false;
    cerb_status st = send_all(c, req, len, deadline_ns, sent);
    if (st == CERB_OK)
        st = cerb__mc_read_reply(c, deadline_ns, r);
    return st;
}

cerb_status cerb__mc_call_lines(struct mc_conn *c, const char *req, int64_t deadline_ns,
                                void (*fn)(void *ud, const char *line), void *ud)
{
    bool sent = false;
    cerb_status st = send_all(c, req, strlen(req), deadline_ns, &sent);
    while (st == CERB_OK) {
        char *line = NULL;
        st = read_line(c, deadline_ns, &line);
        if (st != CERB_OK)
            break;
        if (strcmp(line, "END") == 0)
            return CERB_OK;
        if (strncmp(line, "ERROR", 5) == 0 || strncmp(line, "SERVER_ERROR", 12) == 0 ||
            strncmp(line, "CLIENT_ERROR", 12) == 0)
            return cerb__error_set(CERB_EPROTO, "memcached: %s: %s", req, line);
        fn(ud, line);
    }
    return st;
}

/* ---- the pool ---- */

static void conn_free(struct mc_conn *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    cerb__free(c);
}

static cerb_status conn_open(cerb_engine *e, int64_t deadline_ns, struct mc_conn **out)
{
    struct mc_conn *c = cerb__calloc(1, sizeof *c);
    if (!c)
        return cerb__error_set(CERB_ENOMEM, "memcached: out of memory");
    c->fd = -1;
    int64_t dl = cerb__deadline_in(e->mc->connect_timeout_ms + e->mc->op_timeout_ms);
    if (deadline_ns < dl)
        dl = deadline_ns;
    cerb_status st = CERB_OK;
    /* A late connection (to a process seen before) is closed and another
     * opened, a few times at most. */
    for (int i = 0; i < 3; i++) {
        bool late = false;
        st = dial(e, dl, &c->fd);
        if (st == CERB_OK)
            st = cerb__mc_fingerprint(e, c, dl, &late);
        if (st == CERB_OK) {
            *out = c;
            return CERB_OK;
        }
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
        c->rpos = c->rlen = 0;
        if (!late)
            break;
    }
    conn_free(c);
    return st;
}

/* A pooled connection its server has closed (or that has stray bytes to
 * read) is of no use: readable now means exactly that. */
static bool stale(const struct mc_conn *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) != 0;
}

cerb_status cerb__mc_take(cerb_engine *e, int64_t deadline_ns, struct mc_conn **out)
{
    *out = NULL;
    cerb__mutex_lock(&e->mu);
    for (;;) {
        if (e->idle) {
            struct mc_conn *c = e->idle;
            e->idle = c->next;
            c->next = NULL;
            if (stale(c)) {
                e->open--;
                conn_free(c);
                continue;
            }
            cerb__mutex_unlock(&e->mu);
            *out = c;
            return CERB_OK;
        }
        if (e->open < e->max)
            break;
        if (cerb__cond_wait_until(&e->cv, &e->mu, deadline_ns)) {
            cerb__mutex_unlock(&e->mu);
            return cerb__error_set(CERB_EIO,
                                   "memcached: every pooled connection stayed busy "
                                   "(memcached.pool = %d)", e->max);
        }
    }
    e->open++;
    cerb__mutex_unlock(&e->mu);
    cerb_status st = conn_open(e, deadline_ns, out);
    if (st != CERB_OK) {
        cerb__mutex_lock(&e->mu);
        e->open--;
        cerb__cond_signal(&e->cv);
        cerb__mutex_unlock(&e->mu);
    }
    return st;
}

void cerb__mc_give(cerb_engine *e, struct mc_conn *c, bool broken)
{
    if (!c)
        return;
    /* A connection with bytes left unread is out of step: never reuse it. */
    broken = broken || c->rpos != c->rlen;
    cerb__mutex_lock(&e->mu);
    if (broken) {
        e->open--;
    } else {
        c->next = e->idle;
        e->idle = c;
    }
    cerb__cond_signal(&e->cv);
    cerb__mutex_unlock(&e->mu);
    if (broken)
        conn_free(c);
}

void cerb__mc_pool_close(cerb_engine *e)
{
    cerb__mutex_lock(&e->mu);
    struct mc_conn *c = e->idle;
    e->idle = NULL;
    cerb__mutex_unlock(&e->mu);
    while (c) {
        struct mc_conn *next = c->next;
        conn_free(c);
        c = next;
    }
}

void cerb__mc_pool_drop_older(cerb_engine *e, uint64_t gen)
{
    struct mc_conn *drop = NULL;
    cerb__mutex_lock(&e->mu);
    for (struct mc_conn **pp = &e->idle; *pp;) {
        struct mc_conn *c = *pp;
        if (c->gen < gen) {
            *pp = c->next;
            c->next = drop;
            drop = c;
            e->open--;
        } else {
            pp = &c->next;
        }
    }
    cerb__cond_broadcast(&e->cv);
    cerb__mutex_unlock(&e->mu);
    while (drop) {
        struct mc_conn *next = drop->next;
        conn_free(drop);
        drop = next;
    }
}
