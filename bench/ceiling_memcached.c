/*
 * ceiling_memcached.c — the raw ceiling of the memcached engine: what a
 * hand-written client of the meta protocol sends for the engine's layout
 * (DESIGN.md §4: one item per lock, its CAS the ownership) with no library
 * logic, so the bench can say what fraction of the server's speed the
 * engine keeps.
 *
 * A session is one blocking TCP connection to memcached.servers[0] (the
 * engine has one server), TCP_NODELAY, bounded by memcached.op_timeout_ms.
 * Keys are memcached.prefix + the bench's name (short and plain: sent as
 * they are, as the engine sends such names):
 *   try      ms <key> 32 T10 ME c\r\n<token>\r\n   add mode: HD c<cas> | NS c0
 *   release  md <key> C<cas>\r\n                   HD (the CAS of our grant)
 *   ping     mn\r\n                                MN (the round trip)
 * An uncontended cycle is try + release: two round trips, as the engine's
 * lock + unlock. The contended ceiling retries an NS at once. Left out on
 * purpose, as library logic: the restart fingerprint of every new
 * connection, the lease's TTL rounding, the waiter's `mg t` look and its
 * naps, the reread of a CAS after a lost reply, the pool.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "scenarios.h"

#define MC_KEY_MAX 250

struct mc_sess {
    int fd;
    const char *prefix;
    uint64_t cas; /* of the item our last try wrote; one thread per session */
    char in[512];
    size_t have;
};

static void sess_err(char *err, size_t errlen, const char *what, const char *detail)
{
    snprintf(err, errlen, "memcached %s: %s", what, detail);
}

static void *mc_open(const struct bench_engine *e, char *err, size_t errlen)
{
    const struct cerb_memcached_config *mc = &e->cfg->memcached;
    if (mc->n_servers < 1) {
        sess_err(err, errlen, "open", "no memcached.servers");
        return NULL;
    }
    char host[256];
    const char *s = mc->servers[0], *colon = strrchr(s, ':');
    size_t hl = colon ? (size_t)(colon - s) : 0;
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        s++;
        hl -= 2;
    }
    if (!colon || hl == 0 || hl >= sizeof host) {
        sess_err(err, errlen, "open", "bad memcached.servers address");
        return NULL;
    }
    memcpy(host, s, hl);
    host[hl] = '\0';

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(host, colon + 1, &hints, &ai);
    if (gai != 0) {
        sess_err(err, errlen, "resolve", gai_strerror(gai));
        return NULL;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    struct timeval tv = {.tv_sec = mc->op_timeout_ms / 1000,
                         .tv_usec = (mc->op_timeout_ms % 1000) * 1000};
    int one = 1;
    /* The send timeout bounds connect() too (Linux). */
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        snprintf(err, errlen, "memcached connect to %s: %s", mc->servers[0], strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    struct mc_sess *ms = calloc(1, sizeof *ms);
    if (!ms) {
        close(fd);
        sess_err(err, errlen, "open", "out of memory");
        return NULL;
    }
    ms->fd = fd;
    ms->prefix = mc->prefix ? mc->prefix : "";
    return ms;
}

static void mc_close(void *p)
{
    struct mc_sess *s = p;
    if (!s)
        return;
    close(s->fd);
    free(s);
}

/* Send @req (@len bytes) and read one reply line into @line (no CRLF).
 * Returns 0, or -1 with @err. */
static int exchange(struct mc_sess *s, const char *req, size_t len, char *line, size_t cap,
                    char *err, size_t errlen)
{
    for (size_t off = 0; off < len;) {
        ssize_t n = send(s->fd, req + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            sess_err(err, errlen, "send", n < 0 ? strerror(errno) : "closed");
            return -1;
        }
        off += (size_t)n;
    }
    for (;;) {
        char *eol = s->have ? memchr(s->in, '\n', s->have) : NULL;
        if (eol) {
            size_t l = (size_t)(eol - s->in);
            size_t keep = l > 0 && s->in[l - 1] == '\r' ? l - 1 : l;
            if (keep >= cap)
                keep = cap - 1;
            memcpy(line, s->in, keep);
            line[keep] = '\0';
            s->have -= l + 1;
            memmove(s->in, eol + 1, s->have);
            return 0;
        }
        if (s->have == sizeof s->in) {
            sess_err(err, errlen, "reply", "line too long");
            return -1;
        }
        ssize_t n = recv(s->fd, s->in + s->have, sizeof s->in - s->have, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            sess_err(err, errlen, "recv",
                     n == 0 ? "closed" : errno == EAGAIN ? "timed out" : strerror(errno));
            return -1;
        }
        s->have += (size_t)n;
    }
}

/* The CAS of a reply line's c flag (" c<cas>"), or 0. */
static uint64_t reply_cas(const char *line)
{
    const char *c = strstr(line, " c");
    return c ? strtoull(c + 2, NULL, 10) : 0;
}

/* Returns 1 when @name was added with @token (its CAS kept), 0 when the
 * item exists (someone holds it), -1 with @err. */
static int mc_try(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct mc_sess *s = p;
    char req[MC_KEY_MAX + 128], line[256];
    int n = snprintf(req, sizeof req, "ms %s%s %zu T10 ME c\r\n%s\r\n", s->prefix, name,
                     strlen(token), token);
    if (n < 0 || (size_t)n >= sizeof req) {
        sess_err(err, errlen, "ms", "key too long");
        return -1;
    }
    if (exchange(s, req, (size_t)n, line, sizeof line, err, errlen) != 0)
        return -1;
    /* NS carries the flags asked for too ("NS c0"). */
    if (strncmp(line, "NS", 2) == 0 && (line[2] == '\0' || line[2] == ' '))
        return 0;
    if (strncmp(line, "HD", 2) != 0 || (s->cas = reply_cas(line)) == 0) {
        sess_err(err, errlen, "ms (add)", line);
        return -1;
    }
    return 1;
}

static int mc_release(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    struct mc_sess *s = p;
    char req[MC_KEY_MAX + 64], line[256];
    (void)token; /* the CAS of our grant is the owner check */
    int n = snprintf(req, sizeof req, "md %s%s C%" PRIu64 "\r\n", s->prefix, name, s->cas);
    if (n < 0 || (size_t)n >= sizeof req) {
        sess_err(err, errlen, "md", "key too long");
        return -1;
    }
    if (exchange(s, req, (size_t)n, line, sizeof line, err, errlen) != 0)
        return -1;
    if (strcmp(line, "HD") != 0) {
        sess_err(err, errlen, "md (ours)", line);
        return -1;
    }
    return 0;
}

static int mc_cycle(void *p, const char *name, const char *token, char *err, size_t errlen)
{
    int got = mc_try(p, name, token, err, errlen);
    if (got == 0)
        snprintf(err, errlen, "memcached ms (add) of \"%s\": NS, held by someone else", name);
    if (got != 1)
        return -1;
    return mc_release(p, name, token, err, errlen);
}

static int mc_round_trip(void *p, char *err, size_t errlen)
{
    char line[64];
    if (exchange(p, "mn\r\n", 4, line, sizeof line, err, errlen) != 0)
        return -1;
    if (strcmp(line, "MN") != 0) {
        sess_err(err, errlen, "mn", line);
        return -1;
    }
    return 0;
}

const struct bench_ceiling bench_ceiling_memcached = {
    "memcached", mc_open, mc_cycle, mc_round_trip, mc_close,
};

const struct bench_contended_ceiling bench_contended_ceiling_memcached = {
    .engine = "memcached",
    .open = mc_open,
    .try_acquire = mc_try,
    .release = mc_release,
    .close = mc_close,
};
