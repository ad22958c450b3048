/*
 * sim_main.c — cerb_sim: seeded random schedules over the simulated world,
 * checked against §5a (and its guard form, G.a-G.d in sim_check.c) after
 * every step.
 *
 * A seed fixes everything: the world's shape (clients, lease, the guard's
 * running_ms and keep_ms), the schedule, the library's jitter and the
 * simulated clock, so a failing seed replays exactly with
 * `cerb_sim --seed N [--steps K] [--verbose]`. Each step is one of: a lock
 * call (trylock, trylock_for with a wait — sometimes interrupted by
 * "another thread" — a reentrant acquire, unlock), a guard call on one of
 * a few (scope, key) operations (begin, with a lost callback set on each
 * attempt; finish with success or failure; free without finishing — so an
 * attempt is held a random while, through whatever happens meanwhile),
 * time passing, or a fault — a client paused (its threads stop, its clock
 * runs on) and resumed, a client crashed (frozen for good: its holds and
 * claims stop renewing) and its process started again as a new client, a
 * client partitioned from one server that the others still reach, a reply
 * lost after the server applied the request (acquire, renewal or release;
 * guard begin, renewal or finish), a gray failure (probes fail, lock calls
 * work) or slow renewals, a server down and up, or slow (past the
 * operation timeout: requests land as the client gives up), an engine
 * silenced (down or slow) while attempts hold mirror claims there (the
 * class of issue 22's finding 1: a silent engine switched from must cost
 * its own claims only), a server's guard records lost (a restart without
 * its data), an in-process switch (cerb_engine_switch_to) or a
 * configuration switch (`cerberus switch`: active and epoch rewritten,
 * every running client reloads; paused ones on resume); switches give the
 * attempts begun after them mirror claims on the engine switched from. A
 * schedule ends healed, with time for every lease to run out.
 *
 *   cerb_sim [--seeds N] [--first-seed S] [--minutes M] [--seed N] [--steps K]
 *            [--verbose] [--broken MODE] [--expect-violation]
 *
 * Exit 0 when no seed violated an invariant (or, with --expect-violation,
 * when the broken mode's invariant was reported: the self-test that the
 * oracle can fail; see broken_modes).
 */
#include "internal_posix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "guard.h"
#include "internal.h"
#include "script_engine.h"
#include "sim.h"

static uint64_t rs;
/* Longest overrun seen (took - wait) per kind: trylock, trylock_for, unlock. */
static int64_t max_over[3];
/* Longest guard calls, in operation timeouts: begin, finish, free. */
static double max_gcall[3];

/*
 * --broken modes: the oracle must report the invariant each one breaks.
 * The lock's: a server that grants a held name, and switch_grace_ms = 0
 * with holders on an engine that went silent. The guard's: sa's
 * guard_begin claims a record another attempt's claim holds (G.a); client
 * 1's guard renewer and deadline thread never run (G.b: its claims lapse
 * and nobody tells it); sa's finish(1) deletes the record instead of
 * keeping it (G.c); sa's guard calls that get no answer take four
 * operation timeouts (G.d).
 */
static const struct {
    const char *name, *breaks;
} broken_modes[] = {
    {"grant-twice", "5a.1"},       {"grace0", "5a.1"},        {"guard-grant-twice", "G.a"},
    {"guard-starve", "G.b"},       {"guard-forget", "G.c"},   {"guard-stall", "G.d"},
};
#define N_BROKEN (sizeof broken_modes / sizeof broken_modes[0])

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
    /* A third of the acquisitions of a name not held take a hold object
     * (not reentrant: a name it holds is not asked for again). */
    if (sh->obj)
        return;
    bool as_obj = sh->count == 0 && pick(3) == 0;
    cerb_cancel *cancel = NULL;
    if (as_obj && cerb_cancel_new(&cancel) != CERB_OK) {
        fprintf(stderr, "sim: cerb_cancel_new: %s\n", cerb_last_error());
        exit(2);
    }
    sim_call_begin(w, k);
    /* Some waits are interrupted by "another thread" (sim_world.c, nap):
     * the handle's waiters, or the hold object's call by its cancel. */
    bool intr = wait > 0 && pick(4) == 0;
    w->intr_target = intr && !as_obj ? sh->l : NULL;
    w->intr_cancel = intr && as_obj ? cancel : NULL;
    w->intr_sent = false;
    int64_t t0 = sim_now(), s0 = sim_stolen_ns();
    cerb_status st = as_obj       ? cerb_lock_acquire(sh->l, wait < 0 ? 0 : wait, cancel, &sh->obj)
                     : wait == -2 ? cerb_lock_trylock(sh->l)
                                  : cerb_lock_trylock_for(sh->l, wait);
    int64_t took = sim_now() - t0 - (sim_stolen_ns() - s0);
    w->intr_target = NULL;
    w->intr_cancel = NULL;
    cerb_cancel_free(cancel);
    if (as_obj && st == CERB_OK)
        cerb_hold_on_lost(sh->obj, sim_hold_lost_cb, sh);
    if (st == CERB_INTERRUPTED)
        w->interrupted++;
    if (w->intr_sent && st != CERB_INTERRUPTED)
        sim_log(w, "  interrupted while it was already returning %s", cerb_status_name(st));
    w->calls++;
    sim_log(w, "client %d %s(%s, %lld) -> %s (%lld ms)%s%s", k->id,
            as_obj ? "acquire" : wait == -2 ? "trylock" : "trylock_for", sim_names[n], (long long)wait,
            cerb_status_name(st), (long long)(took / CERB_NS_PER_MS), st != CERB_OK ? ": " : "",
            st != CERB_OK ? cerb_last_error() : "");
    char what[128];
    snprintf(what, sizeof what, "client %d acquire \"%s\" wait %lld", k->id, sim_names[n],
             (long long)wait);
    int kind = wait == -2 || wait == 0 ? 0 : 1;
    int64_t over = took - (wait > 0 ? wait : 0) * CERB_NS_PER_MS;
    if (over > max_over[kind])
        max_over[kind] = over;
    sim_check_bound(w, "5a.4", what, took, acquire_bound_ns(w, wait));
    if (st == CERB_OK) {
        if (sh->count++ == 0) {
            w->grants++;
            sim_check_grant(w, k, n);
            struct cerb_engine_hold *h = sh->l->slot->hold;
            char claims[16] = "";
            for (struct cerb_engine_hold *q = h ? h->claims : NULL; q; q = q->claim_next)
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
        bool obj = sh->obj != NULL;
        cerb_status st = obj ? cerb_hold_free(sh->obj) : cerb_lock_unlock(sh->l);
        int64_t took = sim_now() - t0 - (sim_stolen_ns() - s0);
        w->calls++;
        sh->count--;
        sh->obj = NULL;
        sim_log(w, "client %d %s(%s) -> %s (%lld ms)", k->id, obj ? "hold_free" : "unlock",
                sim_names[n], cerb_status_name(st), (long long)(took / CERB_NS_PER_MS));
        char what[128];
        snprintf(what, sizeof what, "client %d unlock \"%s\"", k->id, sim_names[n]);
        if (took > max_over[2])
            max_over[2] = took;
        sim_check_bound(w, "5a.4", what, took, unlock_bound_ns(w));
        sim_call_end(w, k);
        return;
    }
}

/* ------------------------------------------------------------ the guard */

static const int64_t g_keeps[] = {500, 2000, 5000};

static void guard_lost_cb(cerb_guard *g, void *ud)
{
    struct sim_world *w = ud;
    w->gs[GS_LOST_CBS]++;
    sim_check_guard_lost_cb(w, g);
}

static int n_mirrors(const cerb_guard *g)
{
    int n = 0;
    for (const cerb_guard *m = g->mirrors; m; m = m->mirror_next)
        n++;
    return n;
}

static void note_gcall(int kind, int64_t took_ns, const struct sim_world *w)
{
    double ops = (double)took_ns / (double)(w->p.fail_ms * CERB_NS_PER_MS);
    if (ops > max_gcall[kind])
        max_gcall[kind] = ops;
}

static void guard_begin(struct sim_world *w, struct sim_client *k, int i)
{
    struct sim_attempt *a = &k->a[i];
    cerb_guard_opts o = CERB_GUARD_OPTS_INIT;
    o.running_ms = pick(3) ? w->p.running_ms : 0; /* 0: the configuration's, the same */
    o.keep_ms = pick(3) ? g_keeps[pick(3)] : 0;
    o.on_unavailable = pick(6) == 0 ? CERB_GUARD_ALLOW : -1;
    sim_call_begin(w, k);
    cerb_guard *g = NULL;
    int64_t t0 = sim_now(), s0 = sim_stolen_ns();
    cerb_status st = cerb_guard_begin(k->c, sim_gscopes[i], sim_gkeys[i], strlen(sim_gkeys[i]),
                                      &o, &g);
    int64_t took = sim_now() - t0 - (sim_stolen_ns() - s0);
    w->calls++;
    w->gs[GS_BEGINS]++;
    sim_log(w, "client %d guard_begin(%s/%s, keep %lld%s) -> %s (%lld ms)%s%s", k->id,
            sim_gscopes[i], sim_gkeys[i], (long long)o.keep_ms,
            o.on_unavailable == CERB_GUARD_ALLOW ? ", allow" : "", cerb_status_name(st),
            (long long)(took / CERB_NS_PER_MS), st != CERB_OK ? ": " : "",
            st != CERB_OK ? cerb_last_error() : "");
    char what[128];
    snprintf(what, sizeof what, "client %d guard_begin %s/%s", k->id, sim_gscopes[i],
             sim_gkeys[i]);
    /* One request to each engine, and one more (the re-check, which is
     * the retry) when its answer was lost (cerberus.h). */
    note_gcall(0, took, w);
    sim_check_bound(w, "G.d", what, took, 2 * SIM_SERVERS * w->p.fail_ms * CERB_NS_PER_MS);
    if (st == CERB_OK) {
        a->g = g;
        a->seq = ++w->gseq;
        w->gs[GS_OK]++;
        w->gs[GS_DEGRADED] += cerb_guard_degraded(g);
        w->gs[GS_WITH_MIRRORS] += g->mirrors != NULL;
        sim_check_guard_begin(w, k, i, st, NULL, 0, t0);
        cerb_guard_on_lost(g, guard_lost_cb, w);
        if (cerb_guard_state(g) == CERB_LOCK_LOST) {
            a->lost_at_begin = true;
            w->gs[GS_LOST_AT_BEGIN]++;
            sim_log(w, "  LOST already: its claim lapsed while begin asked elsewhere");
        }
        sim_log(w, "  attempt %d on %s, mirrors on:%s%s%s", a->seq, srv_name(g->engine_idx),
                g->mirrors ? "" : " none", g->mirrors ? " " : "",
                g->mirrors ? srv_name(g->mirrors->engine_idx) : "");
    } else if (st == CERB_DUPLICATE) {
        size_t len = 0;
        const void *res = cerb_guard_result(g, &len);
        w->gs[GS_DUPS]++;
        sim_log(w, "  duplicate of \"%.*s\"", (int)len, res ? (const char *)res : "");
        sim_check_guard_begin(w, k, i, st, res, len, t0);
        cerb_guard_free(g);
    } else if (st == CERB_BUSY) {
        w->gs[GS_BUSY]++;
    } else if (st == CERB_UNAVAILABLE) {
        w->gs[GS_UNAVAILABLE]++;
    } else {
        w->gs[GS_OTHER]++;
        sim_check_guard_begin(w, k, i, st, NULL, 0, t0); /* reported there */
    }
    sim_call_end(w, k);
}

/* finish(succeeded) or, with free_only, a free without finishing. */
static void guard_end(struct sim_world *w, struct sim_client *k, int i, int succeeded,
                      bool free_only)
{
    struct sim_attempt *a = &k->a[i];
    char result[24];
    snprintf(result, sizeof result, "r%d.%d", k->id, a->seq);
    int mirrors = n_mirrors(a->g);
    sim_call_begin(w, k);
    int64_t t0 = sim_now(), s0 = sim_stolen_ns();
    cerb_status st = free_only ? cerb_guard_free(a->g)
                               : cerb_guard_finish(a->g, succeeded, result, strlen(result));
    int64_t took = sim_now() - t0 - (sim_stolen_ns() - s0);
    w->calls++;
    sim_log(w, "client %d guard_%s(%s/%s%s) -> %s (%lld ms)%s%s", k->id,
            free_only ? "free" : "finish", sim_gscopes[i], sim_gkeys[i],
            free_only ? "" : succeeded ? ", ok" : ", failed", cerb_status_name(st),
            (long long)(took / CERB_NS_PER_MS), st != CERB_OK ? ": " : "",
            st != CERB_OK ? cerb_last_error() : "");
    char what[128];
    snprintf(what, sizeof what, "client %d guard_%s %s/%s (%d mirrors)", k->id,
             free_only ? "free" : "finish", sim_gscopes[i], sim_gkeys[i], mirrors);
    /* finish: a request, a re-check and a retry; free: the renewal on the
     * wire and one delete (cerberus.h). */
    note_gcall(free_only ? 2 : 1, took, w);
    sim_check_guard_bound(w, what, took, free_only ? 2 : 3, mirrors);
    if (free_only) {
        w->gs[GS_FREES]++;
        a->g = NULL;
        sim_call_end(w, k);
        return;
    }
    w->gs[GS_FINISHES]++;
    w->gs[GS_FINISH_OK] += st == CERB_OK;
    w->gs[GS_FINISH_LOST] += st == CERB_LOST;
    sim_check_guard_finish(w, k, i, succeeded, result, st, t0);
    if (a->g->kind == CERB_GUARD_RUNNING) {
        /* A success not confirmed: the attempt stays open, renewed. */
        w->gs[GS_FINISH_OPEN]++;
        sim_log(w, "  attempt %d stays open (state %d)", a->seq, (int)cerb_guard_state(a->g));
    } else {
        cerb_guard_free(a->g); /* finished: no request */
        a->g = NULL;
    }
    sim_call_end(w, k);
}

static void do_guard(struct sim_world *w, struct sim_client *k)
{
    int i = pick(SIM_GKEYS);
    if (!k->a[i].g) {
        guard_begin(w, k, i);
        return;
    }
    int r = pick(10);
    if (r < 5)
        guard_end(w, k, i, 1, false);
    else if (r < 7)
        guard_end(w, k, i, 0, false);
    else if (r < 9)
        guard_end(w, k, i, 0, true);
    else
        sim_log(w, "client %d's attempt at %s/%s runs on (state %d)", k->id, sim_gscopes[i],
                sim_gkeys[i], (int)cerb_guard_state(k->a[i].g));
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
static void k_slow_renew(struct script_knobs *kn, void *a)
{
    kn->renew_delay_ms = kn->renew_delay_ms ? 0 : *(int64_t *)a;
}
static void k_slow(struct script_knobs *kn, void *a)
{
    (void)a;
    kn->slow = !kn->slow;
}
static const char *const lose_what[] = {"acquire", "renewal", "release", "guard begin",
                                        "guard renewal", "guard finish"};
static void k_lose(struct script_knobs *kn, void *a)
{
    switch (*(int *)a) {
    case 0: kn->lose_acquire = true; break;
    case 1: kn->lose_renew = true; break;
    case 2: kn->lose_release = true; break;
    case 3: kn->lose_guard_begin = true; break;
    case 4: kn->lose_guard_renew = true; break;
    default: kn->lose_guard_finish = true; break;
    }
}
static void k_heal(struct script_knobs *kn, void *a)
{
    (void)a;
    kn->cut = 0;
    kn->down = false;
    kn->slow = false;
    kn->probe_fails = false;
    kn->renew_delay_ms = 0;
}

/* Server s down, or slow, stops: it answers in time again. */
static void note_up(struct sim_world *w, int s)
{
    struct script_knobs kn = script_engine_get((enum script_server)s);
    if (kn.down || kn.slow)
        w->up_again_ns[s] = sim_now();
}

static void do_switch(struct sim_world *w)
{
    struct sim_client *k = running_client(w);
    if (!k)
        return;
    const char *to = srv_name(pick(SIM_SERVERS));
    sim_call_begin(w, k);
    const char *now = cerb_engine_switch_to(k->c, to);
    sim_log(w, "client %d switch_to(%s) -> %s", k->id, to, now ? now : "NULL");
    sim_call_end(w, k);
}

/* Finding 1's class: the engine that open attempts hold mirror claims on
 * goes silent (down, or slower than the operation timeout). With none,
 * a switch, so that the attempts begun next get some. */
static void silence_mirrors(struct sim_world *w)
{
    int per[SIM_SERVERS] = {0};
    for (int j = 0; j < w->p.n_clients; j++)
        for (int i = 0; i < SIM_GKEYS; i++)
            for (const cerb_guard *m = w->cl[j].a[i].g ? w->cl[j].a[i].g->mirrors : NULL; m;
                 m = m->mirror_next)
                per[m->engine_idx]++;
    if (!per[0] && !per[1]) {
        do_switch(w);
        return;
    }
    int s = per[0] && per[1] ? pick(2) : per[1] ? 1 : 0;
    struct script_knobs kn = script_engine_get((enum script_server)s);
    if (kn.down || kn.slow)
        return;
    if (pick(2))
        kn.down = true;
    else
        kn.slow = true;
    script_engine_set((enum script_server)s, kn);
    w->gs[GS_SILENCED]++;
    sim_log(w, "%s goes silent (%s) with %d mirror claims there", srv_name(s),
            kn.down ? "down" : "slow", per[s]);
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
        sim_check_bound(w, "5a.4", "reload", sim_now() - t0 - (sim_stolen_ns() - s0),
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
    if (r < 11) { /* pause or resume */
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
    } else if (r < 15) { /* crash: one client at most, restarted once */
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
    } else if (r < 30) { /* partition one client from one server, or heal it */
        int s = pick(SIM_SERVERS);
        struct sim_client *k = &w->cl[pick(w->p.n_clients)];
        uint32_t bit = UINT32_C(1) << k->id;
        if (script_engine_get((enum script_server)s).cut & bit)
            w->cut_end_ns[k->id - 1][s] = sim_now(); /* healed now */
        set_knob(s, k_cut, &bit);
        sim_log(w, "partition toggled on %s: cut mask %#x", srv_name(s),
                (unsigned)script_engine_get((enum script_server)s).cut);
    } else if (r < 46) { /* a reply lost after the request took effect */
        int s = pick(SIM_SERVERS), what = pick(6);
        set_knob(s, k_lose, &what);
        sim_log(w, "%s: next %s reply lost", srv_name(s), lose_what[what]);
    } else if (r < 52) { /* a gray failure (probes fail, calls work), or slow renewals */
        int s = pick(SIM_SERVERS);
        if (pick(2)) {
            set_knob(s, k_gray, NULL);
            sim_log(w, "%s probes %s", srv_name(s),
                    script_engine_get((enum script_server)s).probe_fails ? "fail (gray)"
                                                                         : "answer");
        } else {
            int64_t ms = w->p.fail_ms * 3 / 5; /* slow, yet within the op timeout */
            set_knob(s, k_slow_renew, &ms);
            sim_log(w, "%s renewals take %lld ms", srv_name(s),
                    (long long)script_engine_get((enum script_server)s).renew_delay_ms);
        }
    } else if (r < 60) { /* server down or up */
        int s = pick(SIM_SERVERS);
        if (script_engine_get((enum script_server)s).down)
            note_up(w, s);
        set_knob(s, k_down, NULL);
        sim_log(w, "%s %s", srv_name(s), script_engine_get((enum script_server)s).down ? "down" : "up");
    } else if (r < 65) { /* server slower than the op timeout, or in time again */
        int s = pick(SIM_SERVERS);
        if (script_engine_get((enum script_server)s).slow)
            note_up(w, s);
        set_knob(s, k_slow, NULL);
        sim_log(w, "%s %s", srv_name(s),
                script_engine_get((enum script_server)s).slow ? "slow (past the op timeout)"
                                                              : "in time again");
    } else if (r < 71) {
        silence_mirrors(w);
    } else if (r < 73) { /* a restart without data, for the guard's records */
        int s = pick(SIM_SERVERS);
        script_engine_guard_wipe((enum script_server)s);
        w->wiped_ns[s] = sim_now();
        sim_log(w, "%s loses its guard records (restarted without its data)", srv_name(s));
    } else if (r < 87) { /* in-process switch */
        do_switch(w);
    } else { /* configuration switch with an epoch bump */
        static const char *const act[] = {"auto", "sa", "sb"};
        config_switch(w, act[pick(3)]);
    }
}

static long tot_grants, tot_calls, tot_lost, tot_partition, tot_outage, tot_intr, tot_restarts;
static long tg[GS_COUNT]; /* the guard's (enum sim_gstat) */

/* Where the configuration file goes: $TMPDIR, else /dev/shm when it is a
 * writable directory, else /tmp. Every switch rewrites the file (a rename
 * over it) and every client parses it again: on a disk file system that
 * journaling cost a third of the run's time. */
static const char *cfg_dir(void)
{
    const char *t = getenv("TMPDIR");
    if (t && *t)
        return t;
    return access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
}

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
    /* The guard's claims are of the order of the lease, so renewals,
     * silences and losses meet them as often. */
    static const int64_t runnings[] = {300, 1000, 3000};
    w.p.running_ms = runnings[pick(3)];
    w.p.keep_ms = g_keeps[pick(3)];
    w.p.fail_ms = 50;
    if (w.p.broken && strcmp(w.p.broken, "grace0") == 0)
        w.p.switch_grace_ms = 0;
    w.epoch = 1;
    snprintf(w.active, sizeof w.active, "auto");
    snprintf(w.cfg_path, sizeof w.cfg_path, "%s/cerb_sim_%d.cfg", cfg_dir(), (int)getpid());

    long before = sim_check_violations();
    script_engine_reset();
    sim_check_reset();
    sim_clock_reset(&w);
    struct script_knobs kn;
    memset(&kn, 0, sizeof kn);
    kn.fail_ms = w.p.fail_ms;
    kn.grant_twice = w.p.broken && strcmp(w.p.broken, "grant-twice") == 0;
    kn.guard_grant_twice = w.p.broken && strcmp(w.p.broken, "guard-grant-twice") == 0;
    kn.guard_forget_done = w.p.broken && strcmp(w.p.broken, "guard-forget") == 0;
    kn.guard_stall_ms = w.p.broken && strcmp(w.p.broken, "guard-stall") == 0 ? 4 * w.p.fail_ms : 0;
    script_engine_set(SCRIPT_A, kn);
    kn.grant_twice = kn.guard_grant_twice = kn.guard_forget_done = false;
    kn.guard_stall_ms = 0;
    script_engine_set(SCRIPT_B, kn);

    if (!sim_write_config(&w) || !sim_open_clients(&w)) {
        fprintf(stderr, "sim: seed %llu: setup failed\n", (unsigned long long)p.seed);
        exit(2);
    }
    sim_log(&w, "seed %llu: %d clients, lease %lld ms, switch_grace_ms %lld, guard running %lld "
                "ms, keep %lld ms",
            (unsigned long long)p.seed, w.p.n_clients, (long long)w.p.lease_ms,
            (long long)w.p.switch_grace_ms, (long long)w.p.running_ms, (long long)w.p.keep_ms);

    for (w.step = 1; w.step <= p.steps; w.step++) {
        int r = pick(100);
        if (r < 27) {
            struct sim_client *k = running_client(&w);
            if (k)
                do_acquire(&w, k);
        } else if (r < 46) {
            do_unlock(&w);
        } else if (r < 64) {
            struct sim_client *k = running_client(&w);
            if (k)
                do_guard(&w, k);
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
        note_up(&w, s);
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
    for (int i = 0; i < GS_COUNT; i++)
        tg[i] += w.gs[i];
    if (p.verbose)
        printf("seed %llu: %ld calls, %ld grants, %ld busy/timeout, %ld errors, %ld lost "
               "callbacks; guard: %ld begins (%ld ok, %ld duplicate, %ld busy), %ld finishes, "
               "%ld lost callbacks\n",
               (unsigned long long)p.seed, w.calls, w.grants, w.busy, w.errors, w.lost_cbs,
               w.gs[GS_BEGINS], w.gs[GS_OK], w.gs[GS_DUPS], w.gs[GS_BUSY], w.gs[GS_FINISHES],
               w.gs[GS_LOST_CBS]);
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
                    "[--steps K] [--verbose] [--broken MODE] [--expect-violation] "
                    "[--no-faults]\n  MODE:");
    for (size_t i = 0; i < N_BROKEN; i++)
        fprintf(stderr, " %s", broken_modes[i].name);
    fprintf(stderr, "\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct sim_params p = {.steps = 300, .switch_grace_ms = -1, .faults = true};
    long seeds = 100;
    uint64_t first = 1;
    double minutes = 0;
    bool one = false, expect = false;
    const char *breaks = NULL;
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
            for (size_t m = 0; m < N_BROKEN; m++)
                if (strcmp(v, broken_modes[m].name) == 0)
                    breaks = broken_modes[m].breaks;
            if (!breaks)
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
            if (expect && breaks && sim_check_reported(breaks))
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
    printf("cerb_sim: guard: %ld begins: %ld ok (%ld degraded, %ld with mirror claims), %ld "
           "duplicate, %ld busy, %ld unavailable, %ld other; %ld finishes: %ld ok, %ld lost, %ld "
           "left open; %ld frees; %ld lost callbacks; %ld engines silenced under mirror "
           "claims\n",
           tg[GS_BEGINS], tg[GS_OK], tg[GS_DEGRADED], tg[GS_WITH_MIRRORS], tg[GS_DUPS],
           tg[GS_BUSY], tg[GS_UNAVAILABLE], tg[GS_OTHER], tg[GS_FINISHES], tg[GS_FINISH_OK],
           tg[GS_FINISH_LOST], tg[GS_FINISH_OPEN], tg[GS_FREES], tg[GS_LOST_CBS], tg[GS_SILENCED]);
    printf("cerb_sim: guard: overlaps counted as limits: %ld degraded (allow), %ld records "
           "lost, %ld across a partition, %ld after an outage a client did not see, %ld "
           "successes kept longer than a later call assumed\n",
           tg[GS_OVERLAP_DEGRADED], tg[GS_OVERLAP_WIPED], tg[GS_OVERLAP_PARTITION],
           tg[GS_OVERLAP_OUTAGE], tg[GS_OVERLAP_KEEP]);
    printf("cerb_sim: guard: longest calls in operation timeouts: begin %.1f, finish %.1f, "
           "free %.1f; %ld attempts LOST as begin returned\n", max_gcall[0], max_gcall[1],
           max_gcall[2], tg[GS_LOST_AT_BEGIN]);
    if (expect) {
        bool caught = breaks ? sim_check_reported(breaks) : failed > 0;
        if (!caught)
            printf("cerb_sim: expected the oracle to report %s; it did not\n",
                   breaks ? breaks : "a violation");
        return caught ? 0 : 1;
    }
    return failed > 0 ? 1 : 0;
}
