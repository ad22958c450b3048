/*
 * sim_check.c — the simulation's oracle: DESIGN.md §5a, checked on the
 * simulated clock after every grant and every step.
 *
 *  §5a.1 No silent overlap. When a client is granted a name, every other
 *        client holding it must have been told LOST before the server
 *        granted it: its hold flagged LOST, or its conservative deadline
 *        (what cerb_lock_state goes by) at or before the grant's time on
 *        the server. Between steps, at most one hold of a name may be VALID
 *        or SUSPECT (a hold that came back from LOST would show here).
 *        Two overlaps are limits of the design, counted apart: across a
 *        partition (README, "What a partition can still do"), and an
 *        "outage" one — a hold on engine X whose claim on engine Y could not
 *        be taken (Y down at the grant) or lapsed (Y down since: a claim
 *        whose engine goes silent goes dormant, README "Processes that
 *        switch at different times"), and a client that never switched
 *        since (paused through the outage, or its breaker never opened)
 *        granted the name on Y once it was back, before the holder heard Y
 *        again. That client saw nothing to ask about; only fencing tokens
 *        protect the resource then. The same when a client that found X
 *        silent for its grace is granted on Y just after X came back (the
 *        gate's question back-off, health.c) while another was granted
 *        on X.
 *  §5a.2 LOST in time. A hold that is not LOST must still be the server's:
 *        its token there, and its deadline no later than the server's
 *        lease end (the engine's own expiry). A running client's lost
 *        callback must have fired once its deadline passed, allowing for
 *        the op timeouts one background task may spend before another runs
 *        (one OS thread runs them all).
 *  §5a.3 Tokens only grow: never 0; strictly increasing per name per
 *        engine, per client and name across its own switches, and above
 *        every token granted before the last epoch bump (`cerberus
 *        switch`).
 *  §5a.4 Every call returns within its bound, in simulated time.
 * A violation is printed with the seed and step; sim_main.c prints the
 * command that replays it.
 */
#include "internal_posix.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "internal.h"
#include "script_engine.h"
#include "sim.h"

/* How long a partition's or an outage's effects outlast it: a client hears
 * the engine again at its next probe or question (the gate's 250 ms
 * back-off, a probe interval with jitter): what it did meanwhile still
 * followed from the silence. */
#define ECHO_NS (400 * CERB_NS_PER_MS)

static long violations;
static uint64_t last_engine_fence[SIM_NAMES][SIM_SERVERS];
static uint64_t last_client_fence[SIM_MAX_CLIENTS][SIM_NAMES];
static uint64_t max_fence[SIM_NAMES];
static uint64_t epoch_floor[SIM_NAMES];

void sim_check_reset(void)
{
    memset(last_engine_fence, 0, sizeof last_engine_fence);
    memset(last_client_fence, 0, sizeof last_client_fence);
    memset(max_fence, 0, sizeof max_fence);
    memset(epoch_floor, 0, sizeof epoch_floor);
}

long sim_check_violations(void) { return violations; }

static int report(struct sim_world *w, const char *inv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int report(struct sim_world *w, const char *inv, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("VIOLATION %s seed %llu step %d t=%.3fs: ", inv, (unsigned long long)w->p.seed, w->step,
           (double)(sim_now() % (INT64_C(1000) * 1000000000)) / 1e9);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    violations++;
    return 1;
}

/* The library's hold behind a handle the calling thread holds. */
static struct cerb_hold *hold_of(const struct sim_hold *sh)
{
    return sh->count > 0 && sh->l->slot->hold ? sh->l->slot->hold : NULL;
}

int sim_check_grant(struct sim_world *w, struct sim_client *k, int n)
{
    int bad = 0;
    struct sim_hold *sh = &k->h[n];
    struct cerb_hold *h = hold_of(sh);
    if (!h)
        return report(w, "internal", "client %d granted \"%s\" without a hold", k->id,
                      sim_names[n]);
    sh->engine = h->engine_idx;
    memcpy(sh->token, h->lk.token, sizeof sh->token);
    sh->fence = cerb_lock_fencing_token(sh->l);
    sh->granted_ns = sim_now();
    sh->lost_cb_ns = 0;
    sh->lost_late_reported = false;
    sh->partition_overlap = false;
    for (int e = 0; e < SIM_SERVERS; e++) {
        struct script_knobs kn = script_engine_get((enum script_server)e);
        sh->unreachable_at_grant[e] = kn.down || (kn.cut & (UINT32_C(1) << k->id));
    }
    for (int j = 0; j < w->p.n_clients; j++)
        sh->switches_at_grant[j] = w->cl[j].c->switches;

    /* When the server granted it: the overlap question is asked then. */
    struct script_record rec;
    script_engine_record((enum script_server)sh->engine, sim_names[n], &rec);
    int64_t t_grant = strcmp(rec.token, sh->token) == 0 ? rec.granted_ns : sim_now();

    for (int j = 0; j < w->p.n_clients; j++) {
        struct sim_client *o = &w->cl[j];
        if (o == k || o->h[n].count == 0)
            continue;
        struct cerb_hold *oh = hold_of(&o->h[n]);
        if (!oh)
            continue;
        bool flagged = atomic_load(&oh->state) == CERB_LOCK_LOST;
        /* Either side cut off the other's engine since the older grant:
         * the newer could not ask it, or the older could not claim the
         * name on the newer's engine. */
        int64_t since = o->h[n].granted_ns - ECHO_NS;
        bool cut = o->h[n].engine != sh->engine &&
                   (sim_was_cut(w, k, o->h[n].engine, since) ||
                    sim_was_cut(w, o, sh->engine, since));
        struct script_knobs yk = script_engine_get((enum script_server)sh->engine);
        bool y_down = o->h[n].unreachable_at_grant[sh->engine] || yk.down ||
                      w->up_again_ns[sh->engine] >= since;
        /* Or the older's engine X came back just before the newer grant
         * on Y: the newer client, which had found X silent for its grace,
         * does not ask X again for the gate's back-off (health.c, "One
         * window stays") and takes no claim there meanwhile. */
        struct script_knobs xk = script_engine_get((enum script_server)o->h[n].engine);
        bool x_back = !xk.down && w->up_again_ns[o->h[n].engine] >= t_grant - ECHO_NS;
        bool outage = o->h[n].engine != sh->engine &&
                      ((y_down && k->c->switches == o->h[n].switches_at_grant[k->id - 1]) ||
                       x_back);
        if (!flagged && oh->valid_until_ns > t_grant && !cut && outage) {
            sh->partition_overlap = true;
            w->outage_overlaps++;
            sim_log(w, "  overlap with client %d's hold on %s, whose claim on %s an outage kept; "
                       "client %d never switched since: the outage limit, counted",
                    o->id, o->h[n].engine ? "sb" : "sa", sh->engine ? "sb" : "sa", k->id);
        } else if (!flagged && oh->valid_until_ns > t_grant && cut) {
            sh->partition_overlap = true;
            w->partition_overlaps++;
            sim_log(w, "  overlap with client %d's hold on %s across a partition: the "
                       "documented limit, counted", o->id, o->h[n].engine ? "sb" : "sa");
        } else if (!flagged && oh->valid_until_ns > t_grant) {
            for (struct cerb_hold *q = oh->claims; q; q = q->claim_next)
                sim_log(w, "  client %d's claim on %s: state %d, deadline %.3f, failing since %.3f",
                        o->id, q->engine_idx ? "sb" : "sa", atomic_load(&q->state),
                        (double)(q->valid_until_ns % 1000000000000) / 1e9,
                        (double)(q->failing_since_ns % 1000000000000) / 1e9);
            bad += report(w, "5a.1",
                          "client %d granted \"%s\" on %s (fence %#llx) at %.3f while client %d "
                          "holds it on %s, not told LOST (state %d, deadline %.3f)",
                          k->id, sim_names[n], sh->engine ? "sb" : "sa",
                          (unsigned long long)sh->fence, (double)(t_grant % 1000000000000) / 1e9,
                          o->id, o->h[n].engine ? "sb" : "sa", atomic_load(&oh->state),
                          (double)(oh->valid_until_ns % 1000000000000) / 1e9);
        }
    }

    uint64_t f = sh->fence;
    if (f == 0)
        bad += report(w, "5a.3", "client %d granted \"%s\" with token 0", k->id, sim_names[n]);
    if (f <= last_engine_fence[n][sh->engine])
        bad += report(w, "5a.3", "\"%s\" on %s: token %#llx after %#llx", sim_names[n],
                      sh->engine ? "sb" : "sa", (unsigned long long)f,
                      (unsigned long long)last_engine_fence[n][sh->engine]);
    if (f <= last_client_fence[k->id - 1][n])
        bad += report(w, "5a.3", "client %d \"%s\": token %#llx after its own %#llx", k->id,
                      sim_names[n], (unsigned long long)f,
                      (unsigned long long)last_client_fence[k->id - 1][n]);
    if (f <= epoch_floor[n])
        bad += report(w, "5a.3", "\"%s\": token %#llx not above %#llx, granted before the "
                      "last epoch bump", sim_names[n], (unsigned long long)f,
                      (unsigned long long)epoch_floor[n]);
    if (f > last_engine_fence[n][sh->engine])
        last_engine_fence[n][sh->engine] = f;
    if (f > last_client_fence[k->id - 1][n])
        last_client_fence[k->id - 1][n] = f;
    if (f > max_fence[n])
        max_fence[n] = f;
    return bad;
}

void sim_check_epoch_bump(struct sim_world *w)
{
    (void)w;
    memcpy(epoch_floor, max_fence, sizeof epoch_floor);
}

int sim_check_step(struct sim_world *w)
{
    int bad = 0;
    int64_t now = sim_now();
    /* The deadline threads run whatever else waits (sim_world.c), to the
     * millisecond the simulation steps them by. */
    int64_t tol = 2 * CERB_NS_PER_MS;
    for (int n = 0; n < SIM_NAMES; n++) {
        int live = 0, first = -1;
        for (int j = 0; j < w->p.n_clients; j++) {
            struct sim_client *k = &w->cl[j];
            struct sim_hold *sh = &k->h[n];
            struct cerb_hold *h = hold_of(sh);
            if (!h)
                continue;
            enum cerb_lock_state st = cerb_lock_state(sh->l);
            if (st != CERB_LOCK_LOST && sh->partition_overlap) {
                /* counted at its grant; the server checks below still apply */
            } else if (st != CERB_LOCK_LOST) {
                if (live++ == 0)
                    first = k->id;
                else
                    bad += report(w, "5a.1", "\"%s\": clients %d and %d both hold it, neither LOST",
                                  sim_names[n], first, k->id);
                struct script_record rec;
                script_engine_record((enum script_server)h->engine_idx, sim_names[n], &rec);
                if (strcmp(rec.token, h->lk.token) != 0)
                    bad += report(w, "5a.2",
                                  "client %d believes it holds \"%s\" on %s (state %d, deadline "
                                  "%.3f) but the server has %s",
                                  k->id, sim_names[n], h->engine_idx ? "sb" : "sa", st,
                                  (double)(h->valid_until_ns % 1000000000000) / 1e9,
                                  rec.token[0] ? "another owner" : "no owner");
                else if (h->valid_until_ns > rec.until_ns)
                    bad += report(w, "5a.2",
                                  "client %d's deadline for \"%s\" (%.3f) is after the server's "
                                  "lease end (%.3f)",
                                  k->id, sim_names[n], (double)(h->valid_until_ns % 1000000000000) / 1e9,
                                  (double)(rec.until_ns % 1000000000000) / 1e9);
            }
            if (!k->paused && !k->crashed && sh->lost_cb_ns == 0 && !sh->lost_late_reported &&
                h->valid_until_ns != CERB_DEADLINE_NEVER && now >= h->valid_until_ns + tol) {
                sh->lost_late_reported = true;
                bad += report(w, "5a.2",
                              "client %d's hold of \"%s\" passed its deadline %.3f; no lost "
                              "callback by %.3f",
                              k->id, sim_names[n], (double)(h->valid_until_ns % 1000000000000) / 1e9,
                              (double)(now % 1000000000000) / 1e9);
            }
        }
    }
    return bad;
}

int sim_check_bound(struct sim_world *w, const char *what, int64_t took_ns, int64_t bound_ns)
{
    if (took_ns <= bound_ns)
        return 0;
    return report(w, "5a.4", "%s took %.3f s, bound %.3f s", what, (double)took_ns / 1e9,
                  (double)bound_ns / 1e9);
}
