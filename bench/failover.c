/*
 * failover.c — the `failover` scenario: how long new acquisitions stall when
 * the primary engine dies, and how often a flapping primary makes clients
 * switch.
 *
 * The bench cannot kill a server it did not start, so the operator gives
 * two shell commands: --fail-cmd (e.g. `kill -9 $(cat redis.pid)`) and
 * --restore-cmd (start it again). bench/failover.sh wraps both around test
 * servers started by scripts/servers.sh.
 *
 * Time to first grant: W clients (each its own cerb_client, as separate
 * processes would be) lock and unlock distinct names in a loop with short
 * waits. After a warm-up the fail command runs; the time from then to the
 * first grant made by any other engine than the primary is the figure. It
 * is measured twice, with switch_grace_ms = 0 (availability first: target
 * ≤ 1 s) and with the safe default (the old engine's lease plus drift:
 * target ≤ lease + 1 s), restoring the primary in between.
 *
 * Flapping: the primary is failed and restored every period/2 for the
 * flap duration while the clients keep locking; the report gives the
 * switches counted by the clients (cerb_engine_info().switches), summed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "scenarios.h"

#define FO_CLIENTS 4

struct fo_run {
    cerb_client *c[FO_CLIENTS];
    const char *primary;
    atomic_bool stop;
    atomic_llong first_other_ns; /* first grant not on the primary */
    atomic_ullong grants;
};

struct fo_worker {
    struct fo_run *run;
    int idx;
};

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *fo_body(void *arg)
{
    struct fo_worker *w = arg;
    struct fo_run *r = w->run;
    char name[64];
    cerb_lock *l = NULL;
    snprintf(name, sizeof name, "bench-fo-%ld-%d", (long)getpid(), w->idx);
    if (cerb_lock_new(r->c[w->idx], name, NULL, &l) != CERB_OK)
        return NULL;
    while (!atomic_load(&r->stop)) {
        if (cerb_lock_trylock_for(l, 200) != CERB_OK)
            continue;
        atomic_fetch_add(&r->grants, 1);
        struct cerb_engine_info info;
        if (cerb_engine_info(r->c[w->idx], NULL, &info) == CERB_OK &&
            strcmp(info.name, r->primary) != 0) {
            long long zero = 0;
            atomic_compare_exchange_strong(&r->first_other_ns, &zero, (long long)bench_now_ns());
        }
        cerb_lock_unlock(l);
    }
    cerb_lock_free(l);
    return NULL;
}

static int run_cmd(const char *what, const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) {
        bench_errorf("%s command failed (status %d): %s", what, rc, cmd);
        return -1;
    }
    return 0;
}

/* One client per worker, as separate processes would have. */
static int open_clients(const struct bench_engine *e, struct fo_run *r)
{
    for (int i = 0; i < FO_CLIENTS; i++) {
        cerb_status st = e->config_path ? cerb_client_open(&r->c[i], e->config_path)
                                        : cerb_client_open_string(&r->c[i], e->config_text);
        if (st != CERB_OK) {
            bench_errorf("open: %s", cerb_last_error());
            return -1;
        }
    }
    return 0;
}

static void close_clients(struct fo_run *r)
{
    for (int i = 0; i < FO_CLIENTS; i++)
        cerb_client_close(r->c[i]);
}

/* Wait (bounded) until every client is back on the primary. */
static int wait_primary(struct fo_run *r, int64_t timeout_ms)
{
    int64_t end = bench_now_ns() + timeout_ms * 1000000;
    while (bench_now_ns() < end) {
        int all = 1;
        for (int i = 0; i < FO_CLIENTS; i++)
            all &= strcmp(cerb_engine_current(r->c[i]), r->primary) == 0;
        if (all)
            return 0;
        nap_ms(20);
    }
    return -1;
}

static int start_workers(struct fo_run *r, pthread_t *t, struct fo_worker *w)
{
    for (int i = 0; i < FO_CLIENTS; i++) {
        w[i] = (struct fo_worker){r, i};
        if (pthread_create(&t[i], NULL, fo_body, &w[i]) != 0)
            return -1;
    }
    return 0;
}

static void stop_workers(struct fo_run *r, pthread_t *t)
{
    atomic_store(&r->stop, true);
    for (int i = 0; i < FO_CLIENTS; i++)
        pthread_join(t[i], NULL);
}

/* One outage: returns ms to the first grant elsewhere, or -1. */
static double one_outage(const struct bench_engine *e, const struct bench_fo_opts *fo,
                         const char *config_path)
{
    struct bench_engine e2 = *e;
    e2.config_path = config_path;
    struct fo_run r = {.primary = e->cfg->engines[0]};
    pthread_t t[FO_CLIENTS];
    struct fo_worker w[FO_CLIENTS];
    double ms = -1;

    if (open_clients(&e2, &r) != 0)
        return -1;
    if (wait_primary(&r, 10000) != 0) {
        bench_errorf("clients are not on the primary %s: is it up?", r.primary);
        close_clients(&r);
        return -1;
    }
    if (start_workers(&r, t, w) != 0) {
        close_clients(&r);
        return -1;
    }
    nap_ms(1000); /* warm-up on the primary */
    int64_t t_fail = bench_now_ns();
    if (run_cmd("--fail-cmd", fo->fail_cmd) == 0) {
        int64_t end = t_fail + (fo->max_wait_ms) * 1000000;
        while (bench_now_ns() < end && atomic_load(&r.first_other_ns) == 0)
            nap_ms(5);
        long long first = atomic_load(&r.first_other_ns);
        if (first)
            ms = (double)(first - t_fail) / 1e6;
        else
            bench_errorf("no grant on another engine within %lld ms", (long long)fo->max_wait_ms);
    }
    stop_workers(&r, t);
    close_clients(&r);
    if (run_cmd("--restore-cmd", fo->restore_cmd) != 0)
        return -1;
    return ms;
}

int bench_failover(const struct bench_engine *e, const struct bench_fo_opts *fo,
                   struct bench_result *out, size_t *n_out)
{
    *n_out = 0;
    if (!e->config_path || e->cfg->n_engines < 2) {
        bench_errorf("failover needs -c FILE with at least two engines (the first is killed)");
        return -1;
    }
    if (!fo->fail_cmd || !fo->restore_cmd) {
        bench_errorf("failover needs --fail-cmd and --restore-cmd");
        return -1;
    }
    /* Two files prepared by the caller's config: FILE (default grace) and
     * FILE with grace 0, given as --grace0-config. */
    const char *paths[2] = {fo->grace0_config, e->config_path};
    const char *labels[2] = {"grace 0", "default grace"};
    for (int k = 0; k < 2; k++) {
        if (!paths[k])
            continue;
        fprintf(stderr, "cerberus-bench: failover (%s): failing %s ...\n", labels[k],
                e->cfg->engines[0]);
        double ms = one_outage(e, fo, paths[k]);
        if (ms < 0)
            return -1;
        struct bench_result *r = &out[(*n_out)++];
        memset(r, 0, sizeof *r);
        snprintf(r->scenario, sizeof r->scenario, "failover");
        snprintf(r->engine, sizeof r->engine, "%.7s>%.7s", e->cfg->engines[0], e->cfg->engines[1]);
        r->threads = FO_CLIENTS;
        r->p50_us = ms * 1000; /* the one figure: time to first grant */
        r->ratio = -1;
        snprintf(r->note, sizeof r->note, "%s: first grant on the secondary %.0f ms after the primary failed",
                 labels[k], ms);
    }
    if (fo->flap_s > 0) {
        struct fo_run r = {.primary = e->cfg->engines[0]};
        pthread_t t[FO_CLIENTS];
        struct fo_worker w[FO_CLIENTS];
        if (open_clients(e, &r) != 0 || wait_primary(&r, 10000) != 0 ||
            start_workers(&r, t, w) != 0)
            return -1;
        int64_t end = bench_now_ns() + (int64_t)fo->flap_s * 1000000000;
        int flips = 0;
        while (bench_now_ns() < end) {
            if (run_cmd("--fail-cmd", fo->fail_cmd) != 0)
                break;
            nap_ms(fo->flap_period_ms / 2);
            if (run_cmd("--restore-cmd", fo->restore_cmd) != 0)
                break;
            nap_ms(fo->flap_period_ms / 2);
            flips++;
        }
        stop_workers(&r, t);
        uint64_t switches = 0;
        for (int i = 0; i < FO_CLIENTS; i++) {
            struct cerb_engine_info info;
            if (cerb_engine_info(r.c[i], NULL, &info) == CERB_OK)
                switches += info.switches;
        }
        close_clients(&r);
        struct bench_result *res = &out[(*n_out)++];
        memset(res, 0, sizeof *res);
        snprintf(res->scenario, sizeof res->scenario, "flapping");
        snprintf(res->engine, sizeof res->engine, "%.7s>%.7s", e->cfg->engines[0], e->cfg->engines[1]);
        res->threads = FO_CLIENTS;
        res->ops = atomic_load(&r.grants);
        res->ratio = -1;
        snprintf(res->note, sizeof res->note,
                 "%d outages of %d ms in %d s: %.1f switches per client (%llu in all)", flips,
                 fo->flap_period_ms / 2, fo->flap_s, (double)switches / FO_CLIENTS,
                 (unsigned long long)switches);
    }
    return 0;
}
