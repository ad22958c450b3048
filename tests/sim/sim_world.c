/*
 * sim_world.c — the simulated clock and the clients' background work.
 *
 * One OS thread runs the whole world. The library's clock and naps are
 * hooked (cerb__clock_set_hooks): cerb_monotime() reads `now_ns`, and a nap
 * (a retry back-off, a gate's pause, a scripted server's op timeout) moves
 * it forward. The clients are manual (cerb__client_open_manual): their
 * threads' work is done here at the simulated times those threads would
 * wake — the watchdog when cerb__watchdog_step asks to run next, the
 * guard's renewers and deadline thread when cerb__guard_step does, a probe
 * round every probe_interval_ms ± 20 %, queued callbacks right after each.
 *
 * Time passes in two ways. Between calls, sim_advance() jumps from one due
 * timer to the next. Inside a call, a nap passes time the same way, so
 * other clients (and the calling client's own background work, as its
 * threads would) act while the caller waits or backs off. A nap inside
 * background work does not nest more of it; only every client's deadline
 * scan and callbacks (no I/O, as the deadline and callback threads) keep
 * up meanwhile. Background work that overruns a caller's nap is not
 * charged to the caller (sim_stolen_ns). Paused and crashed clients'
 * background work does not run; their clock goes on.
 */
#include "internal_posix.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "internal.h"
#include "script_engine.h"
#include "sim.h"

const char *const sim_names[SIM_NAMES] = {"orders", "stock", "ledger"};
/* Two keys share a scope and one key two scopes: each pair is its own
 * record, which only the record id's hashing of both keeps apart. */
const char *const sim_gscopes[SIM_GKEYS] = {"pay", "pay", "pay", "ship"};
const char *const sim_gkeys[SIM_GKEYS] = {"o-1", "o-2", "o-3", "o-1"};

/* Far from 0: the core takes 0 for "never set" in places. */
#define SIM_EPOCH_NS (INT64_C(1000) * 1000000000)
#define PROBE_INTERVAL_MS 100

static int64_t now_ns;
static int64_t stolen_ns; /* see nap() */
static int timer_depth;
static struct sim_world *world;

int64_t sim_now(void) { return now_ns; }

static uint64_t rng_state;

static uint64_t wrand(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * UINT64_C(2685821657736338717);
}

void sim_log(struct sim_world *w, const char *fmt, ...)
{
    if (!w->p.verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("[%4d %8.3f] ", w->step, (double)(now_ns - SIM_EPOCH_NS) / 1e9);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static void run_timers_until(int64_t target);

/*
 * Inside background work, time passes while only the deadline threads (no
 * I/O) and the callback threads of every running client keep up: they
 * never wait for a renewer, a prober or a caller in production either.
 */
static void deadlines_until(int64_t target)
{
    for (int guard = 0; guard < 10000; guard++) {
        int64_t next = target;
        for (int i = 0; i < world->p.n_clients; i++) {
            struct sim_client *k = &world->cl[i];
            if (k->paused || k->crashed || !k->c)
                continue;
            int64_t d = cerb__watchdog_deadlines(k->c);
            /* The guard's scan only once its last step's answer is due:
             * that answer is no later than its earliest deadline, which
             * only a call of the client's own can bring forward (a new
             * claim), and a call refreshes it (nap, sim_call_end). */
            int64_t gd = k->next_guard_ns;
            if (now_ns >= gd)
                gd = cerb__guard_deadlines(k->c);
            if (gd < d)
                d = gd;
            cerb__notify_run(k->c);
            if (d < next)
                next = d;
        }
        if (next <= now_ns)
            next = now_ns + CERB_NS_PER_MS; /* due now was just handled */
        if (next >= target)
            break;
        now_ns = next;
    }
    now_ns = target;
}

static void nap(int64_t ms)
{
    int64_t target = now_ns + ms * CERB_NS_PER_MS;
    if (!world || world->closing) {
        now_ns = target;
        return;
    }
    if (timer_depth > 0) {
        timer_depth++;
        deadlines_until(target);
        timer_depth--;
        return;
    }
    /* Another thread of the caller's process may interrupt its wait. */
    if ((world->intr_target || world->intr_cancel) && !world->intr_sent && wrand() % 8 == 0) {
        world->intr_sent = true;
        if (world->intr_target)
            cerb_lock_interrupt(world->intr_target);
        else
            cerb_cancel_fire(world->intr_cancel);
    }
    /* What the call did so far may have given the caller's guard
     * renewers work: begin takes its claim before it asks the engines
     * switched from, and would have woken them for it; they look now
     * rather than at the time they last gave (until the call ends, or a
     * claim can lapse while the same call still waits on a silent engine). */
    struct sim_client *c = world->caller;
    if (c && !c->busy)
        c->next_guard_ns = now_ns;
    run_timers_until(target);
    /* Background work that began within the nap ran on this one thread and
     * may have carried the clock past its end; in production it runs on
     * threads of its own and the caller wakes on time. */
    if (now_ns > target)
        stolen_ns += now_ns - target;
}

int64_t sim_stolen_ns(void) { return stolen_ns; }

static int64_t hook_now(void) { return now_ns; }

void sim_clock_reset(struct sim_world *w)
{
    world = w;
    now_ns = SIM_EPOCH_NS;
    stolen_ns = 0;
    timer_depth = 0;
    rng_state = w->p.seed * UINT64_C(0x9e3779b97f4a7c15) + 1;
    cerb__clock_set_hooks(hook_now, nap);
    cerb__rand_seed(w->p.seed + 7);
}

bool sim_write_config(struct sim_world *w)
{
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", w->cfg_path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return false;
    fprintf(f,
            "engines = (\"sa\", \"sb\");\n"
            "active = \"%s\";\n"
            "epoch = %lld;\n"
            "lock = { lease_ms = %lld; };\n"
            "retry = { max = 2; backoff_ms = 20; backoff_max_ms = 200; };\n"
            "failover = { probe_interval_ms = %d; probe_timeout_ms = %lld; "
            "consecutive_failures = 3; open_ms = 1000; half_open_successes = 2; "
            "failback_after_ms = 2000; switch_grace_ms = %lld; watch_config = false; };\n"
            "guard = { running_ms = %lld; keep_ms = %lld; };\n",
            w->active, (long long)w->epoch, (long long)w->p.lease_ms, PROBE_INTERVAL_MS,
            (long long)w->p.fail_ms, (long long)w->p.switch_grace_ms,
            (long long)w->p.running_ms, (long long)w->p.keep_ms);
    fclose(f);
    return rename(tmp, w->cfg_path) == 0;
}

static void lost_cb(cerb_lock *l, void *ud)
{
    struct sim_hold *h = ud;
    (void)l;
    if (h->count > 0 && h->lost_cb_ns == 0)
        h->lost_cb_ns = now_ns;
    world->lost_cbs++;
}

void sim_hold_lost_cb(cerb_hold *o, void *ud)
{
    struct sim_hold *h = ud;
    if (h->obj == o && h->lost_cb_ns == 0)
        h->lost_cb_ns = now_ns;
    world->lost_cbs++;
}

bool sim_guard_starved(const struct sim_world *w, const struct sim_client *k)
{
    return w->p.broken && strcmp(w->p.broken, "guard-starve") == 0 && k->id == 1;
}

/* The watchdog's and the guard's work of client k due by now, then its
 * callbacks; k->busy and timer_depth are the caller's. The guard's step
 * runs when it said it would, or after a user call (`call`): only the
 * client's guard calls give its renewers new work (claims, orphans), so a
 * probe round or the watchdog waking it up would find nothing due. */
static void client_steps(struct sim_client *k, bool call)
{
    k->next_wd_ns = cerb__watchdog_step(k->c);
    if (sim_guard_starved(world, k))
        k->next_guard_ns = CERB_DEADLINE_NEVER;
    else if (call || now_ns >= k->next_guard_ns)
        k->next_guard_ns = cerb__guard_step(k->c);
    cerb__notify_run(k->c);
}

/* Background work of client k that is due by now; returns nothing. */
static void run_client_timers(struct sim_client *k)
{
    if (k->paused || k->crashed || k->busy || !k->c)
        return;
    k->busy = true;
    timer_depth++;
    if (now_ns >= k->next_probe_ns) {
        cerb__prober_round(k->c);
        int64_t iv = PROBE_INTERVAL_MS, j = iv / 5;
        k->next_probe_ns = now_ns + (iv - j + (int64_t)(wrand() % (uint64_t)(2 * j + 1))) *
                                        CERB_NS_PER_MS;
    }
    client_steps(k, false);
    timer_depth--;
    k->busy = false;
}

static int64_t client_due(const struct sim_client *k)
{
    if (k->paused || k->crashed || k->busy || !k->c)
        return CERB_DEADLINE_NEVER;
    int64_t d = k->next_wd_ns < k->next_probe_ns ? k->next_wd_ns : k->next_probe_ns;
    return k->next_guard_ns < d ? k->next_guard_ns : d;
}

static void run_timers_until(int64_t target)
{
    for (int guard = 0; guard < 100000; guard++) {
        int best = -1;
        int64_t due = target;
        for (int i = 0; i < world->p.n_clients; i++) {
            int64_t d = client_due(&world->cl[i]);
            if (d <= due) {
                due = d;
                best = i;
            }
        }
        if (best < 0)
            break;
        if (due > now_ns)
            now_ns = due;
        run_client_timers(&world->cl[best]);
    }
    if (target > now_ns)
        now_ns = target;
}

void sim_advance(struct sim_world *w, int64_t ms)
{
    (void)w;
    run_timers_until(now_ns + ms * CERB_NS_PER_MS);
}

void sim_call_begin(struct sim_world *w, struct sim_client *k)
{
    w->caller = k;
    cerb__notify_run(k->c); /* what its callback thread would have done */
}

void sim_call_end(struct sim_world *w, struct sim_client *k)
{
    w->caller = NULL;
    /* The call's effects on its watchdog and guard renewers (a claim to
     * renew, an orphan to delete), as their wake-ups would. */
    k->busy = true;
    timer_depth++;
    client_steps(k, true);
    timer_depth--;
    k->busy = false;
}

void sim_resume(struct sim_world *w, struct sim_client *k)
{
    k->paused = false;
    if (k->reload_due) {
        k->reload_due = false;
        cerb_status st = cerb_client_reload(k->c);
        sim_log(w, "client %d reloads on resume: %s", k->id, cerb_status_name(st));
    }
    run_client_timers(k);
}

bool sim_open_client(struct sim_world *w, int i)
{
    struct sim_client *k = &w->cl[i];
    memset(k, 0, sizeof *k);
    k->id = i + 1;
    script_engine_next_client(k->id);
    cerb_status st = cerb__client_open_manual(&k->c, w->cfg_path);
    script_engine_next_client(0);
    if (st != CERB_OK) {
        /* No engine would open (all down or cut off): as a process's
         * start would, it fails; the caller may try again later. */
        sim_log(w, "client %d cannot open: %s", k->id, cerb_last_error());
        k->c = NULL;
        return false;
    }
    for (int n = 0; n < SIM_NAMES; n++) {
        if (cerb_lock_new(k->c, sim_names[n], NULL, &k->h[n].l) != CERB_OK) {
            fprintf(stderr, "sim: lock_new: %s\n", cerb_last_error());
            exit(2);
        }
        cerb_lock_on_lost(k->h[n].l, lost_cb, &k->h[n]);
    }
    k->next_probe_ns = now_ns + (int64_t)(wrand() % PROBE_INTERVAL_MS) * CERB_NS_PER_MS;
    k->next_wd_ns = now_ns;
    k->next_guard_ns = now_ns;
    return true;
}

bool sim_open_clients(struct sim_world *w)
{
    for (int i = 0; i < w->p.n_clients; i++)
        if (!sim_open_client(w, i)) {
            fprintf(stderr, "sim: open client %d: %s\n", i + 1, cerb_last_error());
            return false;
        }
    return true;
}

void sim_close_clients(struct sim_world *w)
{
    w->closing = true;
    for (int i = 0; i < w->p.n_clients; i++) {
        struct sim_client *k = &w->cl[i];
        if (!k->c)
            continue;
        /* A crashed process's memory goes with it; here it is freed. */
        cerb_client_close(k->c);
        k->c = NULL;
    }
    world = NULL;
    cerb__clock_set_hooks(NULL, NULL);
}

bool sim_was_cut(const struct sim_world *w, const struct sim_client *k, int server, int64_t since)
{
    if (script_engine_get((enum script_server)server).cut & (UINT32_C(1) << k->id))
        return true;
    return w->cut_end_ns[k->id - 1][server] >= since && w->cut_end_ns[k->id - 1][server] != 0;
}
