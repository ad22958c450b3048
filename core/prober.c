/*
 * prober.c — the probe thread of a client with more than one engine: every
 * probe_interval_ms (± 20 % jitter, so many clients do not probe in step)
 * it probes every engine with probe_timeout_ms, by the engine's canary on
 * the lock path, and feeds the result to its breaker (health.c); reopens
 * engines that could not be opened (a probe failure each time; this is
 * also how a pin on an engine that would not open is applied once it does);
 * and lets the selector move new acquisitions after every round. It sleeps
 * in poll(2) on a self-pipe, so cerb__prober_stop() never waits for a sleep
 * to end (only for a probe round in flight). The breakers, windows and the
 * selector it drives are pure state machines in failover/; following the
 * configuration file is config_watch.c's thread.
 */
#include "internal_posix.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"

struct cerb_prober {
    cerb_client *c;
    pthread_t probe_thread;
    bool have_probe_thread;
    int stop_pipe[2];
};

void cerb__prober_round(cerb_client *c)
{
    struct cerb_failover_config fo;
    /* The closure records first: holds that rely on them are bounded by
     * how recently they were read, and the probes (or an engine that will
     * not open) can take a connect timeout each. */
    cerb__closure_round(c);
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
    cerb__closure_reload_if_wanted(c);
}

/* Sleep up to wait_ms on the stop pipe. Returns -1 on stop, else 0. */
static int nap_or_stop(struct cerb_prober *p, int64_t wait_ms)
{
    struct pollfd fds[1] = {{p->stop_pipe[0], POLLIN, 0}};
    if (wait_ms < 0)
        wait_ms = 0;
    if (wait_ms > INT32_MAX)
        wait_ms = INT32_MAX;
    int rc = poll(fds, 1, (int)wait_ms);
    return rc > 0 && (fds[0].revents & POLLIN) ? -1 : 0;
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
        if (nap_or_stop(p, d) < 0)
            break;
    }
    return NULL;
}

static void prober_free(struct cerb_prober *p)
{
    close(p->stop_pipe[0]);
    close(p->stop_pipe[1]);
    cerb__free(p);
}

cerb_status cerb__prober_start(cerb_client *c)
{
    if (c->manual || c->n_engines < 2)
        return CERB_OK;
    struct cerb_prober *p = cerb__calloc(1, sizeof *p);
    if (!p)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    p->c = c;
    if (pipe(p->stop_pipe) != 0) {
        cerb__free(p);
        return cerb__error_set(CERB_EIO, "prober: pipe: %s", strerror(errno));
    }
    if (pthread_create(&p->probe_thread, NULL, probe_main, p) != 0) {
        prober_free(p);
        return cerb__error_set(CERB_ENOMEM, "cannot start the prober");
    }
    p->have_probe_thread = true;
    c->prober = p;
    return CERB_OK;
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
    prober_free(p);
    c->prober = NULL;
}
