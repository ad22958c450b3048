/*
 * config_watch.c — the thread that follows the configuration file and
 * reloads it when it changes (cerb_client_reload(), given by client.c), so operators move every
 * process at once by editing the file (`cerberus switch`).
 *
 * The reload itself is client.c's, handed in at start, so this file
 * depends on nothing above it. It runs apart from the prober (prober.c) so that a slow probe round never
 * delays following a switch: every other process moves at once, and one
 * lagging behind would grant on the engine they left. It uses inotify on
 * the file's directory (a `cerberus switch` writes a temporary file and
 * renames it over the original, seen as one event) and falls back to
 * comparing inode, size and mtime every 250 ms when inotify is unavailable.
 * It sleeps in poll(2) on a self-pipe and the inotify descriptor, so a
 * change is acted on at once and stopping never waits for a sleep to end
 * (only for a reload in progress).
 */
#include "internal_posix.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"
#include "log.h"

struct cerb_config_watch {
    cerb_client *c;
    cerb_status (*reload)(cerb_client *c); /* client.c's cerb_client_reload */
    pthread_t thread;
    bool have_thread;
    int stop_pipe[2];
    int ino_fd;          /* -1 without inotify */
    char *dir, *base;    /* the config file's directory and name */
    struct stat last;    /* for the polling fallback */
    bool have_last;
};

static bool file_changed(struct cerb_config_watch *w)
{
    struct stat st;
    if (stat(w->c->boot_cfg->path, &st) != 0)
        return false; /* gone for a moment during a replace: look again later */
    bool changed = w->have_last &&
                   (st.st_ino != w->last.st_ino || st.st_size != w->last.st_size ||
                    st.st_mtim.tv_sec != w->last.st_mtim.tv_sec ||
                    st.st_mtim.tv_nsec != w->last.st_mtim.tv_nsec);
    w->last = st;
    w->have_last = true;
    return changed;
}

static void reload(struct cerb_config_watch *w)
{
    cerb_status st = w->reload(w->c);
    if (st != CERB_OK)
        CERB_LOG_E("configuration %s not reloaded, the old one stays: %s", w->c->boot_cfg->path,
                   cerb_last_error());
}

/* Drain inotify events; true when one names our file. */
static bool ino_hit(struct cerb_config_watch *w)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool hit = false;
    for (;;) {
        ssize_t n = read(w->ino_fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (char *q = buf; q < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)q;
            if (ev->len && strcmp(ev->name, w->base) == 0)
                hit = true;
            q += sizeof *ev + ev->len;
        }
    }
    return hit;
}

/* Sleep up to wait_ms on the stop pipe and the inotify descriptor.
 * Returns -1 on stop, else poll's revents for inotify (0 on timeout). */
static int nap_or_stop(struct cerb_config_watch *w, int64_t wait_ms)
{
    struct pollfd fds[2] = {{w->stop_pipe[0], POLLIN, 0}, {w->ino_fd, POLLIN, 0}};
    int rc = poll(fds, w->ino_fd >= 0 ? 2 : 1, (int)wait_ms);
    if (rc > 0 && (fds[0].revents & POLLIN))
        return -1;
    return rc > 0 && w->ino_fd >= 0 ? fds[1].revents : 0;
}

static void *watch_main(void *arg)
{
    struct cerb_config_watch *w = arg;
    for (;;) {
        int ev = nap_or_stop(w, w->ino_fd >= 0 ? 1000 : 250);
        if (ev < 0)
            break;
        bool changed = w->ino_fd >= 0 ? (ev & POLLIN) && ino_hit(w) && file_changed(w)
                                      : file_changed(w);
        if (changed)
            reload(w);
    }
    return NULL;
}

static void watch_free(struct cerb_config_watch *w)
{
    if (w->ino_fd >= 0)
        close(w->ino_fd);
    close(w->stop_pipe[0]);
    close(w->stop_pipe[1]);
    cerb__free(w->dir);
    cerb__free(w->base);
    cerb__free(w);
}

cerb_status cerb__config_watch_start(cerb_client *c, cerb_status (*reload_fn)(cerb_client *c))
{
    if (c->manual || !c->boot_cfg->path || !c->cfg->failover.watch_config)
        return CERB_OK;
    struct cerb_config_watch *w = cerb__calloc(1, sizeof *w);
    if (!w)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    w->c = c;
    w->reload = reload_fn;
    w->ino_fd = -1;
    if (pipe(w->stop_pipe) != 0) {
        cerb__free(w);
        return cerb__error_set(CERB_EIO, "config watch: pipe: %s", strerror(errno));
    }
    const char *path = c->boot_cfg->path;
    const char *slash = strrchr(path, '/');
    w->dir = slash ? cerb__malloc((size_t)(slash - path) + 2) : cerb__strdup(".");
    w->base = cerb__strdup(slash ? slash + 1 : path);
    if (!w->dir || !w->base)
        goto oom;
    if (slash) {
        size_t n = (size_t)(slash - path);
        memcpy(w->dir, path, n ? n : 1);
        w->dir[n ? n : 1] = '\0';
    }
    w->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ino_fd >= 0 &&
        inotify_add_watch(w->ino_fd, w->dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0) {
        close(w->ino_fd);
        w->ino_fd = -1;
    }
    if (w->ino_fd < 0)
        CERB_LOG_I("config watch: inotify unavailable, polling %s", path);
    file_changed(w);
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0)
        goto oom;
    w->have_thread = true;
    c->config_watch = w;
    return CERB_OK;
oom:
    watch_free(w);
    return cerb__error_set(CERB_ENOMEM, "cannot start the configuration watch");
}

void cerb__config_watch_stop(cerb_client *c)
{
    struct cerb_config_watch *w = c->config_watch;
    if (!w)
        return;
    ssize_t n = write(w->stop_pipe[1], "x", 1);
    (void)n;
    if (w->have_thread)
        pthread_join(w->thread, NULL);
    watch_free(w);
    c->config_watch = NULL;
}
