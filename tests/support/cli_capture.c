/*
 * cli_capture.c — a child's stdout and stderr captured with a deadline
 * (cli_capture.h). Both pipes are drained in one poll() loop, so a child
 * that fills one while we read the other cannot block; the deadline is on
 * the monotonic clock, and a child still running at it is killed with its
 * group, as cerb_test_wait() does.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli_capture.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

struct buf {
    char *p;
    size_t n, cap;
};

static int append(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int cerb_test_capture_run(char *const argv[], const char *mark, int64_t timeout_ms,
                          struct cerb_test_capture *res)
{
    int po[2], pe[2];
    memset(res, 0, sizeof *res);
    res->mark_ms = -1;
    if (pipe(po) != 0)
        return -1;
    if (pipe(pe) != 0) {
        close(po[0]);
        close(po[1]);
        return -1;
    }
    int64_t t0 = cerb_test_now_ms();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int dn = open("/dev/null", O_RDONLY);
        if (dn >= 0)
            dup2(dn, STDIN_FILENO);
        dup2(po[1], STDOUT_FILENO);
        dup2(pe[1], STDERR_FILENO);
        close(po[0]);
        close(pe[0]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    setpgid(pid, pid);
    struct buf out = {0}, err = {0};
    struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int64_t deadline = t0 + timeout_ms;
    int open_fds = 2;
    while (open_fds > 0) {
        int64_t left = deadline - cerb_test_now_ms();
        if (left <= 0)
            break;
        int r = poll(fds, 2, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char chunk[4096];
            ssize_t n = read(fds[i].fd, chunk, sizeof chunk);
            if (n > 0) {
                append(i ? &err : &out, chunk, (size_t)n);
                if (i && mark && res->mark_ms < 0 && err.p && strstr(err.p, mark))
                    res->mark_ms = cerb_test_now_ms() - t0;
            } else if (n == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    int64_t left = deadline - cerb_test_now_ms();
    res->status = cerb_test_wait(pid, left > 0 ? left : 0);
    res->out = out.p ? out.p : strdup("");
    res->err = err.p ? err.p : strdup("");
    return 0;
}

void cerb_test_capture_free(struct cerb_test_capture *res)
{
    free(res->out);
    free(res->err);
    res->out = res->err = NULL;
}

int cerb_test_count(const char *hay, const char *needle)
{
    int n = 0;
    size_t nl = strlen(needle);
    for (const char *p = hay; nl && (p = strstr(p, needle)) != NULL; p += nl)
        n++;
    return n;
}
