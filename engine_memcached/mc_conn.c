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
 * The fingerprint (mc_internal.h says why): a new connection sends `stats`
 * before anything else and reads `pid` and `time` − `uptime` (the start
 * time: memcached prints both from one clock reading, so the difference is
 * fixed for the life of a process). A fingerprint other than the last one
 * seen starts a new generation and reports LOST for every hold, under
 * fp_mu, so a connection to the new process is handed out only after that
 * report.
 */
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

static cerb_status dial(cerb_engine *e, int64_t deadline_ns, int *out)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(e->host, e->port, &hints, &res);
    if (rc != 0)
        return cerb__error_set(CERB_EIO, "memcached: %s:%s: %s", e->host, e->port,
                               gai_strerror(rc));
    cerb_status st = CERB_EIO;
    int err = 0;
    bool late = false;
    for (struct addrinfo *ai = res; ai && st != CERB_OK; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
            err = errno;
            close(fd);
            continue;
        }
        int w = wait_fd(fd, POLLOUT, deadline_ns);
        socklen_t sl = sizeof err;
        if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 && err == 0) {
            *out = fd;
            st = CERB_OK;
            break;
        }
        late = late || w == 0;
        if (w < 0)
            err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (st == CERB_OK)
        return CERB_OK;
    if (late)
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

cerb_status cerb__mc_call(struct mc_conn *c, const char *req, size_t len, int64_t deadline_ns,
                          struct mc_reply *r, bool *sent)
{
    *sent = false;
    cerb_status st = send_all(c, req, len, deadline_ns, sent);
    char *line = NULL;
    if (st == CERB_OK)
        st = read_line(c, deadline_ns, &line);
    if (st == CERB_OK)
        st = cerb__mc_parse(line, r);
    if (st == CERB_OK && r->vlen >= 0)
        st = read_value(c, deadline_ns, r);
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

/* ---- the fingerprint ---- */

struct fp {
    long pid;
    long long time, uptime;
    int seen;
};

static void fp_line(void *ud, const char *line)
{
    struct fp *f = ud;
    if (sscanf(line, "STAT pid %ld", &f->pid) == 1)
        f->seen |= 1;
    else if (sscanf(line, "STAT uptime %lld", &f->uptime) == 1)
        f->seen |= 2;
    else if (sscanf(line, "STAT time %lld", &f->time) == 1)
        f->seen |= 4;
}

/* Read the fingerprint on c and give c its generation. */
static cerb_status fingerprint(cerb_engine *e, struct mc_conn *c, int64_t deadline_ns)
{
    struct fp f = {0, 0, 0, 0};
    cerb_status st = cerb__mc_call_lines(c, "stats\r\n", deadline_ns, fp_line, &f);
    if (st != CERB_OK)
        return st;
    if (f.seen != 7)
        return cerb__error_set(CERB_EPROTO, "memcached: `stats` lacks pid, uptime or time");
    long long start = f.time - f.uptime;
    cerb__mutex_lock(&e->fp_mu);
    if (!e->fp_known) {
        e->fp_known = true;
    } else if (f.pid != e->fp_pid || start != e->fp_start) {
        /* A new process: the items, our holds among them, are gone, and
         * its CAS counter started again. */
        uint64_t g = atomic_fetch_add(&e->gen, 1) + 1;
        atomic_fetch_add(&e->stats.restarts, 1);
        CERB_LOG_W("memcached: %s:%s restarted (pid %ld started at %lld, was pid %ld started at "
                   "%lld): every hold there is lost (generation %llu)",
                   e->host, e->port, f.pid, start, e->fp_pid, e->fp_start,
                   (unsigned long long)g);
        if (e->env.event)
            e->env.event(e->env.ud, CERB_EV_LOST, NULL, NULL);
    }
    e->fp_pid = f.pid;
    e->fp_start = start;
    c->gen = atomic_load(&e->gen);
    cerb__mutex_unlock(&e->fp_mu);
    return CERB_OK;
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
    cerb_status st = dial(e, dl, &c->fd);
    if (st == CERB_OK)
        st = fingerprint(e, c, dl);
    if (st != CERB_OK) {
        conn_free(c);
        return st;
    }
    *out = c;
    return CERB_OK;
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
