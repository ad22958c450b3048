/*
 * prober.c — two background threads per client:
 *   - the probe thread probes every engine every probe_interval_ms (± 20 %
 *     jitter, so many clients do not probe in step) with probe_timeout_ms,
 *     by the engine's canary on the lock path, and feeds the result to its
 *     breaker; reopens engines that could not be opened (a probe failure
 *     each time; this is also how a pin on an engine that would not open
 *     is applied once it does); lets the selector move new acquisitions
 *     after every round;
 *   - the watch thread follows the configuration file and reloads it when
 *     it changes, never waiting behind a slow probe round.
 *
 * The file watch uses inotify on the file's directory (so a `cerberus
 * switch`, which writes a temporary file and renames it over the original,
 * is seen as one event) and falls back to comparing inode, size and mtime
 * every 250 ms when inotify is unavailable. Both threads sleep in poll(2)
 * on a shared self-pipe (the watch thread on the inotify descriptor too), so
 * a file change is acted on at once and cerb__prober_stop() never waits for
 * a sleep to end (only for a probe round in flight).
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
#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"

struct cerb_prober {
    cerb_client *c;
    pthread_t probe_thread, watch_thread;
    bool have_probe_thread, have_watch_thread;
    int stop_pipe[2];
    int ino_fd;          /* -1 without inotify */
    char *dir, *base;    /* the config file's directory and name */
    struct stat last;    /* for the polling fallback */
    bool have_last;
};

static bool file_changed(struct cerb_prober *p)
{
    struct stat st;
    if (stat(p->c->boot_cfg->path, &st) != 0)
        return false; /* gone for a moment during a replace: look again later */
    bool changed = p->have_last &&
                   (st.st_ino != p->last.st_ino || st.st_size != p->last.st_size ||
                    st.st_mtim.tv_sec != p->last.st_mtim.tv_sec ||
                    st.st_mtim.tv_nsec != p->last.st_mtim.tv_nsec);
    p->last = st;
    p->have_last = true;
    return changed;
}

static void reload(struct cerb_prober *p)
{
    cerb_status st = cerb_client_reload(p->c);
    if (st != CERB_OK)
        CERB_LOG_E("configuration %s not reloaded, the old one stays: %s", p->c->boot_cfg->path,
                   cerb_last_error());
}

/* Drain inotify events; true when one names our file. */
static bool ino_hit(struct cerb_prober *p)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool hit = false;
    for (;;) {
        ssize_t n = read(p->ino_fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (char *q = buf; q < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)q;
            if (ev->len && strcmp(ev->name, p->base) == 0)
                hit = true;
            q += sizeof *ev + ev->len;
        }
    }
    return hit;
}

void cerb__prober_round(cerb_client *c)
{
    struct cerb_failover_config fo;
    cerb__client_failover_cfg(c, &fo, NULL);
    int64_t timeout = fo.probe_timeout_ms;
    for (size_t i = 0; i < c->n_engines; i++) {
        struct cerb_client_engine *ce = &c->engines[i];
        int64_t t0 = cerb_monotime();
        cerb_status st = ce->e ? cerb__engine_probe(ce->ops, ce->e, timeout)
                               : cerb__client_open_engine(c, i);
        int64_t us = (cerb_monotime() - t0) / 1000;
        /* A busy canary still proves the engine answers. */
        bool ok = st == CERB_OK || st == CERB_BUSY;
        if (!ok)
            CERB_LOG_D("probe of %s failed: %s", ce->name, cerb_last_error());
        cerb__health_probe(c, (int)i, ok, ok ? us : -1);
    }
    cerb__health_reselect(c);
}

/* Sleep up to wait_ms on the stop pipe (and fd when >= 0). Returns -1 on
 * stop, else poll's revents for fd (0 on timeout). */
static int nap_or_stop(struct cerb_prober *p, int fd, int64_t wait_ms)
{
    struct pollfd fds[2] = {{p->stop_pipe[0], POLLIN, 0}, {fd, POLLIN, 0}};
    if (wait_ms < 0)
        wait_ms = 0;
    if (wait_ms > INT32_MAX)
        wait_ms = INT32_MAX;
    int rc = poll(fds, fd >= 0 ? 2 : 1, (int)wait_ms);
    if (rc > 0 && (fds[0].revents & POLLIN))
        return -1;
    return rc > 0 && fd >= 0 ? fds[1].revents : 0;
}

/* The probe thread: one round every probe_interval_ms ± 20 %. A round can
 * take long (an engine that will not open costs its connect timeout). */
static void *probe_main(void *arg)
{
    struct cerb_prober *p = arg;
    cerb_client *c = p->c;
    for (;;) {
        cerb__prober_round(c);
        struct cerb_failover_config fo;
        cerb__client_failover_cfg(c, &fo, NULL);
        int64_t iv = fo.probe_interval_ms;
        int64_t jitter = iv / 5;
        int64_t d = iv - jitter + (int64_t)cerb__rand_below((uint64_t)(2 * jitter + 1));
        if (nap_or_stop(p, -1, d) < 0)
            break;
    }
    return NULL;
}

/* The file-watch thread, apart from the probes so that a slow probe round
 * never delays following a `cerberus switch` (every other process moves at
 * once; one lagging behind would grant on the engine they left). */
static void *watch_main(void *arg)
{
    struct cerb_prober *p = arg;
    for (;;) {
        int ev = nap_or_stop(p, p->ino_fd, p->ino_fd >= 0 ? 1000 : 250);
        if (ev < 0)
            break;
        bool changed = p->ino_fd >= 0 ? (ev & POLLIN) && ino_hit(p) && file_changed(p)
                                      : file_changed(p);
        if (changed)
            reload(p);
    }
    return NULL;
}

static void prober_free(struct cerb_prober *p)
{
    if (p->ino_fd >= 0)
        close(p->ino_fd);
    close(p->stop_pipe[0]);
    close(p->stop_pipe[1]);
    cerb__free(p->dir);
    cerb__free(p->base);
    cerb__free(p);
}

cerb_status cerb__prober_start(cerb_client *c)
{
    bool watch = c->boot_cfg->path && c->cfg->failover.watch_config;
    bool probing = c->n_engines > 1;
    if (c->manual || (!watch && !probing))
        return CERB_OK;
    struct cerb_prober *p = cerb__calloc(1, sizeof *p);
    if (!p)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    p->c = c;
    p->ino_fd = -1;
    if (pipe(p->stop_pipe) != 0) {
        cerb__free(p);
        return cerb__error_set(CERB_EIO, "prober: pipe: %s", strerror(errno));
    }
    if (watch) {
        const char *path = c->boot_cfg->path;
        const char *slash = strrchr(path, '/');
        p->dir = slash ? cerb__malloc((size_t)(slash - path) + 2) : cerb__strdup(".");
        p->base = cerb__strdup(slash ? slash + 1 : path);
        if (!p->dir || !p->base)
            goto oom;
        if (slash) {
            size_t n = (size_t)(slash - path);
            memcpy(p->dir, path, n ? n : 1);
            p->dir[n ? n : 1] = '\0';
        }
        p->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (p->ino_fd >= 0 &&
            inotify_add_watch(p->ino_fd, p->dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0) {
            close(p->ino_fd);
            p->ino_fd = -1;
        }
        if (p->ino_fd < 0)
            CERB_LOG_I("config watch: inotify unavailable, polling %s", path);
        file_changed(p);
    }
    if (probing) {
        if (pthread_create(&p->probe_thread, NULL, probe_main, p) != 0)
            goto oom;
        p->have_probe_thread = true;
    }
    if (watch) {
        if (pthread_create(&p->watch_thread, NULL, watch_main, p) != 0)
            goto oom;
        p->have_watch_thread = true;
    }
    c->prober = p;
    return CERB_OK;
oom:
    c->prober = p;
    cerb__prober_stop(c);
    return cerb__error_set(CERB_ENOMEM, "cannot start the prober");
}

void cerb__prober_stop(cerb_client *c)
{
    struct cerb_prober *p = c->prober;
    if (!p)
        return;
    ssize_t w = write(p->stop_pipe[1], "x", 1);
    (void)w;
    if (p->have_probe_thread)
        pthread_join(p->probe_thread, NULL);
    if (p->have_watch_thread)
        pthread_join(p->watch_thread, NULL);
    prober_free(p);
    c->prober = NULL;
}
