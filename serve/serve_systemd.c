/*
 * serve_systemd.c — what `cerberus serve` does for systemd, by hand (no
 * libsystemd): readiness notification (Type=notify) and socket activation.
 *
 * Notification (sd_notify(3)'s protocol): when $NOTIFY_SOCKET is set, each
 * state ("READY=1", "RELOADING=1\nMONOTONIC_USEC=…", "STOPPING=1") is one
 * datagram on a fresh AF_UNIX SOCK_DGRAM socket sent to that address; a
 * name starting with '@' is in the abstract namespace (its first byte
 * becomes NUL, and the address length counts only the name's bytes). A
 * send that fails is returned to the caller, which logs it: systemd would
 * then time the start out, which is the right outcome for a service that
 * cannot say it is ready.
 *
 * Socket activation (sd_listen_fds(3)): when $LISTEN_PID is this process
 * and $LISTEN_FDS is N >= 1, the sockets are the descriptors 3 .. 3+N-1,
 * already bound and listening. They are marked close-on-exec, and
 * LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are unset so that nothing this
 * process starts takes them for its own. serve.c then checks each (a
 * listening stream socket, unix or TCP) and serves on it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "serve_internal.h"

cerb_status cerb__serve_notify(const char *state, char *err, size_t errlen)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    socklen_t salen;
    size_t n;
    ssize_t sent;
    int fd;

    if (!path || !path[0])
        return CERB_OK;
    n = strlen(path);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof sa.sun_path) {
        snprintf(err, errlen, "NOTIFY_SOCKET=%.200s: not a unix socket address", path);
        return CERB_EINVAL;
    }
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "NOTIFY_SOCKET: socket: %s", strerror(errno));
        return CERB_EIO;
    }
    sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    if (sent < 0)
        snprintf(err, errlen, "NOTIFY_SOCKET=%.200s: %s", path, strerror(errno));
    close(fd);
    return sent < 0 ? CERB_EIO : CERB_OK;
}

cerb_status cerb__serve_notify_reloading(char *err, size_t errlen)
{
    struct timespec ts;
    char state[96];

    /* systemd (since 253) wants the monotonic time of the reload's start
     * with RELOADING=1, to tell this reload from an earlier one. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(state, sizeof state, "RELOADING=1\nMONOTONIC_USEC=%lld",
             (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000);
    return cerb__serve_notify(state, err, errlen);
}

/* The decimal value of environment variable @name in [min, max], or -1. */
static long env_number(const char *name, long min, long max)
{
    const char *v = getenv(name);
    char *end;
    long n;

    if (!v || !v[0])
        return -1;
    errno = 0;
    n = strtol(v, &end, 10);
    if (errno || *end || n < min || n > max)
        return -1;
    return n;
}

cerb_status cerb__serve_listen_fds(int *fds, size_t max, size_t *n, char *err,
                                   size_t errlen)
{
    long pid = env_number("LISTEN_PID", 1, 0x7fffffffL);
    long count = env_number("LISTEN_FDS", 1, 1024);
    cerb_status st = CERB_OK;

    *n = 0;
    if (pid != (long)getpid() || count < 1) {
        /* Not ours (or none): leave the variables to whoever they are for. */
        return CERB_OK;
    }
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    for (long i = 0; i < count; i++) {
        int fd = SD_LISTEN_FDS_START + (int)i;
        int fl = fcntl(fd, F_GETFD);
        if (fl < 0) {
            snprintf(err, errlen, "LISTEN_FDS=%ld: descriptor %d is not open", count, fd);
            return CERB_EINVAL;
        }
        fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
        if ((size_t)i >= max) {
            snprintf(err, errlen, "LISTEN_FDS=%ld: more than %zu sockets", count, max);
            st = CERB_EINVAL;
            continue;
        }
        fds[(*n)++] = fd;
    }
    return st;
}
