/*
 * sim_main.c — cerb_sim: seeded random schedules over the simulated world,
 * checked against §5a after every step.
 *
 * A seed fixes everything: the world's shape (clients, lease), the
 * schedule, the library's jitter and the simulated clock, so a failing seed
 * replays exactly with `cerb_sim --seed N [--steps K] [--verbose]`. Each
 * step is one of: a call (trylock, trylock_for with a wait — sometimes
 * interrupted by "another thread" — a reentrant acquire, unlock), time
 * passing, or a fault — a client paused (its threads stop, its clock runs
 * on) and resumed, a client crashed (frozen for good: its holds stop
 * renewing) and its process started again as a new client, a client
 * partitioned from one server that the
 * others still reach, a reply lost after the server applied the request
 * (acquire, renewal or release), a gray failure (probes fail, lock calls
 * work), a server down and up, an in-process switch
 * (cerb_engine_switch_to) or a configuration switch (`cerberus switch`:
 * active and epoch rewritten, every running client reloads; paused ones on
 * resume). A schedule ends healed, with time for every lease to run out.
 *
 *   cerb_sim [--seeds N] [--first-seed S] [--minutes M] [--seed N] [--steps K]
 *            [--verbose] [--broken grant-twice|grace0] [--expect-violation]
 *
 * Exit 0 when no seed violated §5a (or, with --expect-violation, when one
 * did: the self-test that the oracle can fail).
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "internal.h"
#include "script_engine.h"
#include "sim.h"

static uint64_t rs;
/* Longest overrun seen (took - wait) per kind: trylock, trylock_for, unlock. */
static int64_t max_over[3];

static uint64_t rnd(void)
{
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return rs * UINT64_C(2685821657736338717);
}

static int pick(int n) { return (int)(rnd() % (uint64_t)n); }

static struct sim_client *running_client(struct sim_world *w)
{
    for (int tries = 0; tries < 8; tries++) {
        struct sim_client *k = &w->cl[pick(w->p.n_clients)];
        if (!k->paused && !k->crashed)
            return k;
    }
    return NULL;
}

static const char *srv_name(int s) { return s ? "sb" : "sa"; }

/*
 * The documented bounds (include/cerberus.h), in op timeouts (fail_ms):
 * an acquisition beyond its wait: the acquire, a re-check of a lost reply,
 * a question to each other engine before and after the grant, a claim
 * there and a release when it says the name is held (3 + 3 per other
 * engine); an unlock: 1 + retry.max tries with the back-offs between
 * them, a claim's release per other engine and a renewal on the wire.
 */
#define RETRY_MAX 2
#define BACKOFF_MAX_MS 200
static int64_t acquire_bound_ns(const struct sim_world *w, int64_t wait_ms)
{
    int64_t ops = 3 + 3 * (SIM_SERVERS - 1);
    return ((wait_ms > 0 ? wait_ms : 0) + ops * w->p.fail_ms) * CERB_NS_PER_MS;
}

static int64_t unlock_bound_ns(const struct sim_world *w)
{
    int64_t ops = 1 + RETRY_MAX + (SIM_SERVERS - 1) + 1;
    return (ops * w->p.fail_ms + RETRY_MAX * BACKOFF_MAX_MS) * CERB_NS_PER_MS;
}

static void do_acquire(struct sim_world *w, struct sim_client *k)
{
    int n = pick(SIM_NAMES);
    struct sim_hold *sh = &k->h[n];
    static const int64_t waits[] = {-2, 0, 20, 150, 600, 2500};
    int64_t wait = waits[pick(6)];
    sim_call_begin(w, k);
    /* Some waits are interrupted by "another thread" (sim_world.c, nap). */
    w->intr_target = wait > 0 && pick(4) == 0 ? sh->l : NULL;
    w->intr_sent = false;
    int64_t t0 = sim_now(), s0 = sim_stolen_ns();
    cerb_status st = wait == -2 ? cerb_lock_trylock(sh->l) : cerb_lock_trylock_for(sh->l, wait);
    int64_t took = sim_now() - t0 - (sim_stolen_ns() - s0);
    w->intr_target = NULL;
    if (st == CERB_INTERRUPTED)
        w->interrupted++;
    if (w->intr_sent && st != CERB_INTERRUPTED)
        sim_log(w, "  interrupted while it was already returning %s", cerb_status_name(st));
    w->calls++;
    sim_log(w, "client %d %s(%s, %lld) -> %s (%lld ms)%s%s", k->id,
            wait == -2 ? "trylock" : "trylock_for", sim_names[n], (long long)wait,
            cerb_status_name(st), (long long)(took / CERB_NS_PER_MS), st != CERB_OK ? ": " : "",
            st != CERB_OK ? cerb_last_error() : "");
    char what[128];
    snprintf(what, sizeof what, "client %d acquire \"%s\" wait %lld", k->id, sim_names[n],
             (long long)wait);
    int kind = wait == -2 || wait == 0 ? 0 : 1;
    int64_t over = took - (wait > 0 ? wait : 0) * CERB_NS_PER_MS;
    if (over > max_over[kind])
        max_over[kind] = over;
    sim_check_bound(w, what, took, acquire_bound_ns(w, wait));
    if (st == CERB_OK) {
        if (sh->count++ == 0) {
            w->grants++;
            sim_check_grant(w, k, n);
            struct cerb_hold *h = sh->l->slot->hold;
            char claims[16] = "";
            for (struct cerb_hold *q = h ? h->claims : NULL; q; q = q->claim_next)
                snprintf(claims + strlen(claims), sizeof claims - strlen(claims), " %s",
                         srv_name(q->engine_idx));
            sim_log(w, "  granted on %s, token %#llx, claims:%s", srv_name(sh->engine),
                    (unsigned long long)sh->fence, claims[0] ? claims : " none");
        }
    } else if (st == CERB_BUSY || st == CERB_TIMEOUT) {
        w->busy++;
    } else {
        w->errors++;
    }
    sim_call_end(w, k);
}

static void do_unlock(struct sim_world *w)
{
    for (int tries = 0; tries < 8; tries++) {
        struct sim_client *k = running_client(w);
        if (!k)
            return;
        int n = pick(SIM_NAMES);
        struct sim_hold *sh = &k->h[n];
        if (sh->count == 0)
            continue;
        sim_call_begin(w, k);
        int64_t t0 = sim_now(), s0 = sim_stolen_ns();
        cerb_status st = cerb_lock_unlock(sh->l);
        int64_t took = sim_now() - t0 - (sim_stolen_ns() - s0);
        w->calls++;
        sh->count--;
        sim_log(w, "client %d unlock(%s) -> %s (%lld ms)", k->id, sim_names[n],
                cerb_status_name(st), (long long)(took / CERB_NS_PER_MS));
        char what[128];
        snprintf(what, sizeof what, "client %d unlock \"%s\"", k->id, sim_names[n]);
        if (took > max_over[2])
            max_over[2] = took;
        sim_check_bound(w, what, took, unlock_bound_ns(w));
        sim_call_end(w, k);
        return;
    }
}

static void set_knob(int s, void (*f)(struct script_knobs *, void *), void *arg)
{
    struct script_knobs kn = script_engine_get((enum script_server)s);
    f(&kn, arg);
    script_engine_set((enum script_server)s, kn);
}

static void k_cut(struct script_knobs *kn, void *a) { kn->cut ^= *(uint32_t *)a; }
static void k_down(struct script_knobs *kn, void *a) { (void)a; kn->down = !kn->down; }
static void k_gray(struct script_knobs *kn, void *a)
{
    (void)a;
    kn->probe_fails = !kn->probe_fails;
}
static void k_lose(struct script_knobs *kn, void *a)
{
    int what = *(int *)a;
    if (what == 0)
        kn->lose_acquire = true;
    else if (what == 1)
        kn->lose_renew = true;
    else
        kn->lose_release = true;
}
static void k_heal(struct script_knobs *kn, void *a)
{
    (void)a;
    kn->cut = 0;
    kn->down = false;
    kn->probe_fails = false;
}

static void config_switch(struct sim_world *w, const char *active)
{
    snprintf(w->active, sizeof w->active, "%s", active);
    w->epoch++;
    if (!sim_write_config(w)) {
        fprintf(stderr, "sim: cannot write %s\n", w->cfg_path);
        exit(2);
    }
    sim_log(w, "cerberus switch: active %s, epoch %lld", active, (long long)w->epoch);
    for (int i = 0; i < w->p.n_clients; i++) {
        struct sim_client *k = &w->cl[i];
        if (k->crashed)
            continue;
        if (k->paused) {
            k->reload_due = true;
            continue;
        }
        sim_call_begin(w, k);
        int64_t t0 = sim_now(), s0 = sim_stolen_ns();
        cerb_status st = cerb_client_reload(k->c);
        sim_check_bound(w, "reload", sim_now() - t0 - (sim_stolen_ns() - s0),
                        SIM_SERVERS * w->p.fail_ms * CERB_NS_PER_MS);
        sim_log(w, "  client %d reload -> %s", k->id, cerb_status_name(st));
        sim_call_end(w, k);
    }
    /* Grants from now on rank above every earlier one; a paused client
     * that has not reloaded grants nothing until it resumes and does. */
    sim_check_epoch_bump(w);
}

static void do_fault(struct sim_world *w)
{
    int r = pick(100);
    if (r < 12) { /* pause or resume */
        struct sim_client *k = &w->cl[pick(w->p.n_clients)];
        if (k->crashed)
            return;
        if (k->paused) {
            sim_log(w, "client %d resumes", k->id);
            sim_resume(w, k);
        } else {
            sim_log(w, "client %d paused", k->id);
            k->paused = true;
        }
    } else if (r < 16) { /* crash: one client at most, restarted once */
        for (int i = 0; i < w->p.n_clients; i++) {
            if (!w->cl[i].crashed)
                continue;
            if (w->p.n_clients < SIM_MAX_CLIENTS && w->restarts == 0) {
                /* The process starts again: a new client (the old one's
                 * holds stay in the oracle until their deadlines). */
                if (!sim_open_client(w, w->p.n_clients))
                    return; /* no engine opens now: another time */
                w->restarts++;
                w->p.n_clients++;
                sim_log(w, "client %d restarts as client %d", w->cl[i].id, w->p.n_clients);
            }
            return;
        }
        struct sim_client *k = &w->cl[pick(w->p.n_clients)];
        sim_log(w, "client %d crashes", k->id);
        k->crashed = true;
    } else if (r < 34) { /* partition one client from one server, or heal it */
        int s = pick(SIM_SERVERS);
        struct sim_client *k = &w->cl[pick(w->p.n_clients)];
        uint32_t bit = UINT32_C(1) << k->id;
        if (script_engine_get((enum script_server)s).cut & bit)
            w->cut_end_ns[k->id - 1][s] = sim_now(); /* healed now */
        set_knob(s, k_cut, &bit);
        sim_log(w, "partition toggled on %s: cut mask %#x", srv_name(s),
                (unsigned)script_engine_get((enum script_server)s).cut);
    } else if (r < 52) { /* a reply lost after the request took effect */
        int s = pick(SIM_SERVERS), what = pick(3);
        set_knob(s, k_lose, &what);
        sim_log(w, "%s: next %s reply lost", srv_name(s),
                what == 0 ? "acquire" : what == 1 ? "renewal" : "release");
    } else if (r < 60) { /* a gray failure: probes fail, lock calls work */
        int s = pick(SIM_SERVERS);
        set_knob(s, k_gray, NULL);
        sim_log(w, "%s probes %s", srv_name(s),
                script_engine_get((enum script_server)s).probe_fails ? "fail (gray)" : "answer");
    } else if (r < 70) { /* server down or up */
        int s = pick(SIM_SERVERS);
        if (script_engine_get((enum script_server)s).down)
            w->up_again_ns[s] = sim_now();
        set_knob(s, k_down, NULL);
        sim_log(w, "%s %s", srv_name(s), script_engine_get((enum script_server)s).down ? "down" : "up");
    } else if (r < 84) { /* in-process switch */
        struct sim_client *k = running_client(w);
        if (!k)
            return;
        const char *to = srv_name(pick(SIM_SERVERS));
        sim_call_begin(w, k);
        const char *now = cerb_engine_switch_to(k->c, to);
        sim_log(w, "client %d switch_to(%s) -> %s", k->id, to, now ? now : "NULL");
        sim_call_end(w, k);
    } else { /* configuration switch with an epoch bump */
        static const char *const act[] = {"auto", "sa", "sb"};
        config_switch(w, act[pick(3)]);
    }
}

static long tot_grants, tot_calls, tot_lost, tot_partition, tot_outage, tot_intr, tot_restarts;

/* One seed. Returns the violations it found. */
static long run_seed(struct sim_params p)
{
    static struct sim_world w;
    memset(&w, 0, sizeof w);
    w.p = p;
    rs = p.seed * UINT64_C(0xd1342543de82ef95) + 0x2545f4914f6cdd1d;
    for (int i = 0; i < 4; i++)
        rnd();
    /* The world's shape comes from the seed too. */
    if (w.p.n_clients == 0)
        w.p.n_clients = 2 + pick(3);
    if (w.p.lease_ms == 0) {
        static const int64_t leases[] = {300, 1000, 3000};
        w.p.lease_ms = leases[pick(3)];
    }
    w.p.fail_ms = 50;
    if (w.p.broken && strcmp(w.p.broken, "grace0") == 0)
        w.p.switch_grace_ms = 0;
    w.epoch = 1;
    snprintf(w.active, sizeof w.active, "auto");
    snprintf(w.cfg_path, sizeof w.cfg_path, "%s/cerb_sim_%d.cfg",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());

    long before = sim_check_violations();
    script_engine_reset();
    sim_check_reset();
    sim_clock_reset(&w);
    struct script_knobs kn;
    memset(&kn, 0, sizeof kn);
    kn.fail_ms = w.p.fail_ms;
    kn.grant_twice = w.p.broken && strcmp(w.p.broken, "grant-twice") == 0;
    script_engine_set(SCRIPT_A, kn);
    kn.grant_twice = false;
    script_engine_set(SCRIPT_B, kn);
    if (!sim_write_config(&w) || !sim_open_clients(&w)) {
        fprintf(stderr, "sim: seed %llu: setup failed\n", (unsigned long long)p.seed);
        exit(2);
    }
    sim_log(&w, "seed %llu: %d clients, lease %lld ms, switch_grace_ms %lld",
            (unsigned long long)p.seed, w.p.n_clients, (long long)w.p.lease_ms,
            (long long)w.p.switch_grace_ms);

    for (w.step = 1; w.step <= p.steps; w.step++) {
        int r = pick(100);
        if (r < 35) {
            struct sim_client *k = running_client(&w);
            if (k)
                do_acquire(&w, k);
        } else if (r < 60) {
            do_unlock(&w);
        } else if (r < 85 || !w.p.faults) {
            int64_t ms = pick(4) == 0 ? 1 + pick((int)w.p.lease_ms * 2) : 1 + pick(100);
            sim_log(&w, "time passes: %lld ms", (long long)ms);
            sim_advance(&w, ms);
        } else {
            do_fault(&w);
        }
        sim_check_step(&w);
        if (sim_check_violations() > before && !p.verbose)
            break; /* the first is what the replay shows */
    }
    /* Heal, resume, and let every lease and grace run out: no violation
     * may appear while the world settles either. */
    for (int s = 0; s < SIM_SERVERS; s++) {
        struct script_knobs cur = script_engine_get((enum script_server)s);
        for (int i = 0; i < w.p.n_clients; i++)
            if (cur.cut & (UINT32_C(1) << w.cl[i].id))
                w.cut_end_ns[i][s] = sim_now();
        if (cur.down)
            w.up_again_ns[s] = sim_now();
        set_knob(s, k_heal, NULL);
    }
    for (int i = 0; i < w.p.n_clients; i++)
        if (w.cl[i].paused)
            sim_resume(&w, &w.cl[i]);
    for (int i = 0; i < 20 && sim_check_violations() == before; i++) {
        sim_advance(&w, w.p.lease_ms / 2);
        sim_check_step(&w);
    }
    sim_close_clients(&w);
    unlink(w.cfg_path);

    tot_grants += w.grants;
    tot_calls += w.calls;
    tot_lost += w.lost_cbs;
    tot_partition += w.partition_overlaps;
    tot_intr += w.interrupted;
    tot_restarts += w.restarts;
    tot_outage += w.outage_overlaps;
    if (p.verbose)
        printf("seed %llu: %ld calls, %ld grants, %ld busy/timeout, %ld errors, %ld lost callbacks\n",
               (unsigned long long)p.seed, w.calls, w.grants, w.busy, w.errors, w.lost_cbs);
    return sim_check_violations() - before;
}

/* --verbose: the library's log lines, on the simulated clock. */
static void log_line(cerb_log_level level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    printf("[     %8.3f]     lib: %s\n", (double)(sim_now() % 1000000000000) / 1e9, line);
}

static void usage(void)
{
    fprintf(stderr, "usage: cerb_sim [--seeds N] [--first-seed S] [--minutes M] [--seed N] "
                    "[--steps K] [--verbose] [--broken grant-twice|grace0] [--expect-violation] "
                    "[--no-faults]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct sim_params p = {.steps = 300, .switch_grace_ms = -1, .faults = true};
    long seeds = 100;
    uint64_t first = 1;
    double minutes = 0;
    bool one = false, expect = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--seeds") == 0 && v) {
            seeds = atol(v);
            i++;
        } else if (strcmp(a, "--first-seed") == 0 && v) {
            first = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--minutes") == 0 && v) {
            minutes = atof(v);
            seeds = -1;
            i++;
        } else if (strcmp(a, "--seed") == 0 && v) {
            first = strtoull(v, NULL, 10);
            one = true;
            i++;
        } else if (strcmp(a, "--steps") == 0 && v) {
            p.steps = atoi(v);
            i++;
        } else if (strcmp(a, "--verbose") == 0) {
            p.verbose = true;
        } else if (strcmp(a, "--broken") == 0 && v) {
            p.broken = v;
            if (strcmp(v, "grant-twice") != 0 && strcmp(v, "grace0") != 0)
                usage();
            i++;
        } else if (strcmp(a, "--expect-violation") == 0) {
            expect = true;
        } else if (strcmp(a, "--no-faults") == 0) {
            p.faults = false;
        } else {
            usage();
        }
    }
    if (one)
        seeds = 1;
    /* The library logs to stderr at warning level; the schedule is what
     * matters here (shown with --verbose). */
    if (!p.verbose)
        cerb_log_set(NULL, NULL, CERB_LOG_OFF);
    else
        cerb_log_set(log_line, NULL, CERB_LOG_INFO);
    script_engine_register();

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long ran = 0, failed = 0;
    for (uint64_t s = first;; s++) {
        if (seeds >= 0 && ran >= seeds)
            break;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (seeds < 0 && el >= minutes * 60)
            break;
        p.seed = s;
        long v = run_seed(p);
        ran++;
        if (v > 0) {
            failed++;
            printf("seed %llu FAILED (%ld violation%s); replay: %s --seed %llu%s%s --verbose\n",
                   (unsigned long long)s, v, v > 1 ? "s" : "", argv[0], (unsigned long long)s,
                   p.broken ? " --broken " : "", p.broken ? p.broken : "");
            if (expect)
                break;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("cerb_sim: %ld seeds (from %llu, %d steps each%s%s) in %.1f s (%.0f seeds/s): "
           "%ld failed\n",
           ran, (unsigned long long)first, p.steps, p.broken ? ", broken " : "",
           p.broken ? p.broken : "", el, el > 0 ? (double)ran / el : 0.0, failed);
    printf("cerb_sim: %ld calls (%ld interrupted), %ld grants, %ld lost callbacks, %ld restarts; "
           "overlaps counted as limits: %ld across a partition, %ld after an outage a client "
           "did not see\n",
           tot_calls, tot_intr, tot_grants, tot_lost, tot_restarts, tot_partition, tot_outage);
    printf("cerb_sim: longest calls beyond their wait: trylock %.0f ms, trylock_for %.0f ms, "
           "unlock %.0f ms\n", (double)max_over[0] / 1e6, (double)max_over[1] / 1e6,
           (double)max_over[2] / 1e6);
    if (expect) {
        if (failed == 0)
            printf("cerb_sim: expected the oracle to report a violation; it did not\n");
        return failed > 0 ? 0 : 1;
    }
    return failed > 0 ? 1 : 0;
}
