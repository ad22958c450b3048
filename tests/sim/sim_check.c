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
 *
 * The guard (§11), §5a adapted to its attempts, "G.*" in the reports:
 *  G.a No two attempts of one operation run at once. When a begin returns
 *      CERB_OK, every other attempt of that (scope, key) still open (begun
 *      with CERB_OK, neither finished nor freed, its process not crashed)
 *      must have been told LOST: cerb_guard_state() = LOST and its lost
 *      callback queued or called (a paused process can have neither run:
 *      the state alone, which it reads from the deadline on resuming).
 *      Between steps, at most one open attempt per operation is not LOST.
 *      Counted apart instead, the documented limits: either attempt
 *      degraded (on_unavailable = allow: cerb_guard_degraded()), the two
 *      records on different engines across a partition or after an
 *      outage as §5a.1 counts them, and records a server lost (restarted
 *      without its data).
 *  G.b LOST in time. An open attempt that is not LOST holds each of its
 *      claims (its own and its mirrors on engines switched from) on that
 *      claim's server, with a conservative deadline no later than the
 *      record's expiry there; its lost callback runs once, seeing LOST,
 *      once the earliest claim deadline passed or the server said a claim
 *      is gone (running clients, as §5a.2), and never for a freed handle.
 *      An attempt already LOST as begin returned (its claim lapsed while
 *      begin waited on an engine switched from) is not called back: the
 *      loss was found when no callback was set (cerb_guard_on_lost).
 *  G.c A success (finish(1) returned CERB_OK) is answered CERB_DUPLICATE
 *      by every begin within keep_ms of the finish, with a result that a
 *      finish stored; the same limits are counted apart, and one more: an
 *      engine that does not answer is taken to hold records for keep_ms
 *      (the later call's or the configuration's, the longer) plus
 *      running_ms after it last answered (cerberus.h), so a success kept
 *      longer by its own keep_ms, on an engine silent for the later
 *      begin, does not keep that begin out.
 *  G.d Every guard call returns within its bound (cerberus.h, Blocking),
 *      in operation timeouts: begin, a request to each engine and its
 *      re-check, which is the retry (2 per engine); finish, a request, a
 *      re-check and a retry (3); free, the renewal on the wire and one
 *      delete (2); each per claim, the attempt's own and one per mirror.
 * A violation is printed with the seed and step; sim_main.c prints the
 * command that replays it.
 */
#include "internal_posix.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "guard.h"
#include "internal.h"
#include "script_engine.h"
#include "sim.h"

/* How long a partition's or an outage's effects outlast it: a client hears
 * the engine again at its next probe or question (the gate's 250 ms
 * back-off, a probe interval with jitter): what it did meanwhile still
 * followed from the silence. */
#define ECHO_NS (400 * CERB_NS_PER_MS)

static long violations;
/* The invariants reported so far (any seed), for --expect-violation. */
static char reported[16][8];
static int n_reported;
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

bool sim_check_reported(const char *inv)
{
    for (int i = 0; i < n_reported; i++)
        if (strcmp(reported[i], inv) == 0)
            return true;
    return false;
}

static int report(struct sim_world *w, const char *inv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int report(struct sim_world *w, const char *inv, const char *fmt, ...)
{
    va_list ap;
    if (!sim_check_reported(inv) && n_reported < 16)
        snprintf(reported[n_reported++], sizeof reported[0], "%s", inv);
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
static struct cerb_engine_hold *hold_of(const struct sim_hold *sh)
{
    return sh->count > 0 && sh->l->slot->hold ? sh->l->slot->hold : NULL;
}

int sim_check_grant(struct sim_world *w, struct sim_client *k, int n)
{
    int bad = 0;
    struct sim_hold *sh = &k->h[n];
    struct cerb_engine_hold *h = hold_of(sh);
    if (!h)
        return report(w, "internal", "client %d granted \"%s\" without a hold", k->id,
                      sim_names[n]);
    sh->engine = h->engine_idx;
    memcpy(sh->token, h->lk.token, sizeof sh->token);
    sh->fence = sh->obj ? cerb_hold_fencing_token(sh->obj) : cerb_lock_fencing_token(sh->l);
    sh->granted_ns = sim_now();
    sh->lost_cb_ns = 0;
    sh->lost_late_reported = false;
    sh->partition_overlap = false;
    for (int e = 0; e < SIM_SERVERS; e++) {
        struct script_knobs kn = script_engine_get((enum script_server)e);
        sh->unreachable_at_grant[e] = kn.down || kn.slow || (kn.cut & (UINT32_C(1) << k->id));
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
        struct cerb_engine_hold *oh = hold_of(&o->h[n]);
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
        bool y_down = o->h[n].unreachable_at_grant[sh->engine] || yk.down || yk.slow ||
                      w->up_again_ns[sh->engine] >= since;
        /* Or the older's engine X came back just before the newer grant
         * on Y: the newer client, which had found X silent for its grace,
         * does not ask X again for the gate's back-off (health.c, "One
         * window stays") and takes no claim there meanwhile. */
        struct script_knobs xk = script_engine_get((enum script_server)o->h[n].engine);
        bool x_back = !xk.down && !xk.slow && w->up_again_ns[o->h[n].engine] >= t_grant - ECHO_NS;
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
            for (struct cerb_engine_hold *q = oh->claims; q; q = q->claim_next)
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

static int guard_step(struct sim_world *w);

int sim_check_step(struct sim_world *w)
{
    int bad = guard_step(w);
    int64_t now = sim_now();
    /* The deadline threads run whatever else waits (sim_world.c), to the
     * millisecond the simulation steps them by. */
    int64_t tol = 2 * CERB_NS_PER_MS;
    for (int n = 0; n < SIM_NAMES; n++) {
        int live = 0, first = -1;
        for (int j = 0; j < w->p.n_clients; j++) {
            struct sim_client *k = &w->cl[j];
            struct sim_hold *sh = &k->h[n];
            struct cerb_engine_hold *h = hold_of(sh);
            if (!h)
                continue;
            enum cerb_lock_state st = sh->obj ? cerb_hold_state(sh->obj) : cerb_lock_state(sh->l);
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

int sim_check_bound(struct sim_world *w, const char *inv, const char *what, int64_t took_ns,
                    int64_t bound_ns)
{
    if (took_ns <= bound_ns)
        return 0;
    return report(w, inv, "%s took %.3f s, bound %.3f s", what, (double)took_ns / 1e9,
                  (double)bound_ns / 1e9);
}

/* ------------------------------------------------------------ the guard */

static const char *srv(int e) { return e ? "sb" : "sa"; }

static double at(int64_t ns) { return (double)(ns % 1000000000000) / 1e9; }

bool sim_was_silent(const struct sim_world *w, int server, int64_t since)
{
    struct script_knobs kn = script_engine_get((enum script_server)server);
    return kn.down || kn.slow || w->up_again_ns[server] >= since;
}

/* The engines an attempt's mirror claims are on, as bits. */
static int mirror_bits(const cerb_guard *g)
{
    int bits = 0;
    for (const cerb_guard *m = g->mirrors; m; m = m->mirror_next)
        bits |= 1 << m->engine_idx;
    return bits;
}

enum limit { LIMIT_NONE, LIMIT_WIPED, LIMIT_PARTITION, LIMIT_OUTAGE };

/*
 * Whether a begin of client k whose record is on engine y, returning CERB_OK
 * at t while the older attempt `o` (record on x, mirrors on the engines in
 * `o_mirrors`) still runs or its success still keeps duplicates out, is a
 * documented limit rather than a bug: a server on either side lost its
 * records since o began; or, the records being on different engines, one
 * side was cut off the other's engine since (a partition), or y was silent
 * for o (no claim of o's there: its begin passed it over, or its mirror
 * lapsed, or its done-record was not written) and k never switched since,
 * so it saw no engine to ask; or x came back just before, inside the
 * gate's question back-off, which is §5a.1's outage.
 */
static enum limit limit_of(struct sim_world *w, const struct sim_begin_ctx *o, int o_mirrors,
                           struct sim_client *k, int y, int64_t t)
{
    int64_t since = o->sent_ns - ECHO_NS;
    int x = o->engine;
    for (int e = 0; e < SIM_SERVERS; e++)
        if (w->wiped_ns[e] >= since && (e == x || e == y || (o_mirrors & (1 << e))))
            return LIMIT_WIPED;
    if (x == y)
        return LIMIT_NONE;
    struct sim_client *oc = &w->cl[o->client - 1];
    if (sim_was_cut(w, k, x, since) || sim_was_cut(w, oc, y, since))
        return LIMIT_PARTITION;
    struct script_knobs xk = script_engine_get((enum script_server)x);
    bool y_silent = o->unreachable_at_begin[y] || sim_was_silent(w, y, since);
    bool x_back = !xk.down && !xk.slow && w->up_again_ns[x] >= t - ECHO_NS;
    if ((y_silent && k->c->switches == o->switches_at_begin[k->id - 1]) || x_back)
        return LIMIT_OUTAGE;
    return LIMIT_NONE;
}

static const char *count_limit(struct sim_world *w, enum limit lim)
{
    switch (lim) {
    case LIMIT_WIPED:
        w->gs[GS_OVERLAP_WIPED]++;
        return "a server lost its records";
    case LIMIT_PARTITION:
        w->gs[GS_OVERLAP_PARTITION]++;
        return "across a partition";
    case LIMIT_OUTAGE:
        w->gs[GS_OVERLAP_OUTAGE]++;
        return "after an outage it did not see";
    case LIMIT_NONE:
        break;
    }
    return "";
}

/* Was the older attempt o (of client oc) told LOST, as G.a asks? */
static bool told_lost(const struct sim_client *oc, const struct sim_attempt *o)
{
    if (cerb_guard_state(o->g) != CERB_LOCK_LOST)
        return false;
    return oc->paused || o->lost_cb_ns != 0 || o->g->lost_told;
}

static void fill_ctx(struct sim_world *w, struct sim_client *k, const cerb_guard *g, int64_t t0,
                     struct sim_begin_ctx *b)
{
    b->engine = g->engine_idx;
    b->client = k->id;
    b->sent_ns = t0;
    b->begun_ns = sim_now();
    for (int e = 0; e < SIM_SERVERS; e++) {
        struct script_knobs kn = script_engine_get((enum script_server)e);
        b->unreachable_at_begin[e] = kn.down || kn.slow || (kn.cut & (UINT32_C(1) << k->id));
    }
    for (int j = 0; j < SIM_MAX_CLIENTS; j++)
        b->switches_at_begin[j] = j < w->p.n_clients && w->cl[j].c ? w->cl[j].c->switches : 0;
}

int sim_check_guard_begin(struct sim_world *w, struct sim_client *k, int i, cerb_status st,
                          const void *result, size_t len, int64_t t0)
{
    int bad = 0;
    if (st == CERB_DUPLICATE) {
        if (w->n_gresults[i] >= SIM_GRESULTS)
            return 0; /* too many to remember: not judged */
        for (int r = 0; r < w->n_gresults[i]; r++)
            if (strlen(w->gresults[i][r]) == len && memcmp(w->gresults[i][r], result, len) == 0)
                return 0;
        return report(w, "G.c", "client %d's begin of %s/%s answered DUPLICATE with \"%.*s\", "
                      "which no finish stored", k->id, sim_gscopes[i], sim_gkeys[i],
                      (int)(len < 40 ? len : 40), result ? (const char *)result : "");
    }
    if (st == CERB_BUSY || st == CERB_UNAVAILABLE)
        return 0;
    if (st != CERB_OK) /* valid arguments, memory enough: nothing else is documented */
        return report(w, "internal", "client %d's begin of %s/%s returned %s: %s", k->id,
                      sim_gscopes[i], sim_gkeys[i], cerb_status_name(st), cerb_last_error());
    struct sim_attempt *a = &k->a[i];
    int64_t now = sim_now();
    fill_ctx(w, k, a->g, t0, &a->b);
    a->degraded = cerb_guard_degraded(a->g) != 0;
    a->limit_overlap = false;
    a->lost_cb_ns = 0;
    a->lost_cbs = 0;
    a->lost_at_begin = false;
    a->unconfirmed_done_ns = 0;
    a->late_reported = a->server_reported = false;
    int y = a->b.engine;

    for (int j = 0; j < w->p.n_clients; j++) {
        struct sim_client *oc = &w->cl[j];
        struct sim_attempt *o = &oc->a[i];
        if (o == a || !o->g || oc->crashed || told_lost(oc, o))
            continue;
        if (a->degraded || o->degraded) {
            a->limit_overlap = true;
            w->gs[GS_OVERLAP_DEGRADED]++;
            sim_log(w, "  runs alongside client %d's attempt, one of them degraded "
                       "(on_unavailable = allow): the documented limit, counted", oc->id);
            continue;
        }
        enum limit lim = limit_of(w, &o->b, mirror_bits(o->g), k, y, now);
        if (lim != LIMIT_NONE) {
            a->limit_overlap = true;
            const char *why = count_limit(w, lim);
            sim_log(w, "  runs alongside client %d's attempt on %s, %s: a limit, counted",
                    oc->id, srv(o->b.engine), why);
            continue;
        }
        bad += report(w, "G.a",
                      "client %d began %s/%s on %s (mirrors %#x) while client %d's attempt, begun "
                      "on %s at %.3f (mirrors %#x), runs, not told LOST (state %d, deadline "
                      "%.3f, callback %s)",
                      k->id, sim_gscopes[i], sim_gkeys[i], srv(y), mirror_bits(a->g), oc->id,
                      srv(o->b.engine), at(o->b.begun_ns), mirror_bits(o->g),
                      (int)cerb_guard_state(o->g), at(atomic_load(&o->g->valid_until_ns)),
                      o->lost_cb_ns ? "called" : o->g->lost_told ? "queued" : "not queued");
    }

    for (int n = 0; n < w->n_gsucc[i] && n < SIM_GSUCCESSES; n++) {
        const struct sim_success *sc = &w->gsucc[i][n];
        if (now < sc->from_ns || now >= sc->until_ns)
            continue;
        if (a->degraded || (sc->degraded && sc->b.engine != y)) {
            w->gs[GS_OVERLAP_DEGRADED]++;
            sim_log(w, "  a success of client %d keeps it out, but one side is degraded "
                       "(on_unavailable = allow): the documented limit, counted", sc->b.client);
            continue;
        }
        int64_t assumed = a->g->keep_ms > w->p.keep_ms ? a->g->keep_ms : w->p.keep_ms;
        int x = sc->b.engine;
        if (x != y && sc->keep_ms > assumed &&
            (sim_was_silent(w, x, now - ECHO_NS) || sim_was_cut(w, k, x, now - ECHO_NS))) {
            w->gs[GS_OVERLAP_KEEP]++;
            sim_log(w, "  a success of client %d keeps it out on %s for %lld ms, longer than this "
                       "call assumes of a silent engine (%lld ms): the documented limit, counted",
                    sc->b.client, srv(x), (long long)sc->keep_ms, (long long)assumed);
            continue;
        }
        enum limit lim = limit_of(w, &sc->b, sc->mirrors, k, y, now);
        if (lim != LIMIT_NONE) {
            const char *why = count_limit(w, lim);
            sim_log(w, "  a success of client %d (on %s) keeps it out, %s: a limit, counted",
                    sc->b.client, srv(sc->b.engine), why);
            continue;
        }
        bad += report(w, "G.c",
                      "client %d began %s/%s on %s (CERB_OK) %.3f s after client %d's success "
                      "on %s (mirrors %#x) was recorded; it keeps duplicates out until %.3f",
                      k->id, sim_gscopes[i], sim_gkeys[i], srv(y),
                      (double)(now - sc->from_ns) / 1e9, sc->b.client, srv(sc->b.engine),
                      sc->mirrors, at(sc->until_ns));
    }
    return bad;
}

int sim_check_guard_finish(struct sim_world *w, struct sim_client *k, int i, int succeeded,
                           const char *result, cerb_status st, int64_t t0)
{
    struct sim_attempt *a = &k->a[i];
    /* Whatever it returned, the result may be stored now. */
    if (succeeded && w->n_gresults[i] < SIM_GRESULTS)
        snprintf(w->gresults[i][w->n_gresults[i]++], sizeof w->gresults[i][0], "%s", result);
    if (succeeded && st != CERB_OK && a->g->kind == CERB_GUARD_RUNNING && !a->unconfirmed_done_ns)
        a->unconfirmed_done_ns = t0;
    /* A degraded attempt's success touches no server: nothing keeps a
     * duplicate out. */
    if (!succeeded || st != CERB_OK || a->g->degraded)
        return 0;
    /* A ring of the latest: a success begun while an older one is in force
     * is itself a G.c violation or a counted limit, so only a pile-up of
     * limits could push one still in force out. */
    struct sim_success *sc = &w->gsucc[i][w->n_gsucc[i]++ % SIM_GSUCCESSES];
    sc->from_ns = sim_now();
    /* From the request, not the answer: the record's keep_ms may have
     * started as soon as it left — or with an earlier finish whose answer
     * was lost: a finish sent again finds the done-record and answers
     * CERB_OK without extending it. */
    int64_t from = a->unconfirmed_done_ns ? a->unconfirmed_done_ns : t0;
    sc->until_ns = a->g->keep_ms < 0 ? CERB_DEADLINE_NEVER : from + a->g->keep_ms * CERB_NS_PER_MS;
    sc->b = a->b;
    sc->mirrors = mirror_bits(a->g);
    sc->degraded = a->degraded;
    sc->keep_ms = a->g->keep_ms;
    return 0;
}

int sim_check_guard_bound(struct sim_world *w, const char *what, int64_t took_ns, int doc_ops,
                          int mirrors)
{
    /* Per claim (cerberus.h): the attempt's own and each mirror's. */
    int64_t op = w->p.fail_ms * CERB_NS_PER_MS;
    return sim_check_bound(w, "G.d", what, took_ns, doc_ops * (1 + mirrors) * op);
}

int sim_check_guard_lost_cb(struct sim_world *w, const cerb_guard *g)
{
    for (int j = 0; j < w->p.n_clients; j++)
        for (int i = 0; i < SIM_GKEYS; i++) {
            struct sim_attempt *a = &w->cl[j].a[i];
            if (a->g != g)
                continue;
            int bad = 0;
            if (a->lost_cbs++ == 0)
                a->lost_cb_ns = sim_now();
            else
                bad += report(w, "G.b", "client %d's lost callback for %s/%s ran %d times",
                              w->cl[j].id, sim_gscopes[i], sim_gkeys[i], a->lost_cbs);
            if (cerb_guard_state(g) != CERB_LOCK_LOST)
                bad += report(w, "G.b", "client %d's lost callback for %s/%s ran in state %d",
                              w->cl[j].id, sim_gscopes[i], sim_gkeys[i], (int)cerb_guard_state(g));
            sim_log(w, "  client %d told: its attempt at %s/%s is LOST", w->cl[j].id,
                    sim_gscopes[i], sim_gkeys[i]);
            return bad;
        }
    return report(w, "G.b", "a lost callback ran for a guard handle no attempt holds (freed?)");
}

/* The earliest deadline of an attempt's claims. */
static int64_t claims_deadline(const cerb_guard *g)
{
    int64_t d = atomic_load(&((cerb_guard *)g)->valid_until_ns);
    for (const cerb_guard *m = g->mirrors; m; m = m->mirror_next) {
        int64_t md = atomic_load(&((cerb_guard *)m)->valid_until_ns);
        if (md < d)
            d = md;
    }
    return d;
}

/* G.b on the servers: a claim of an attempt that is not LOST is its
 * server's, and its deadline no later than the record's expiry there. */
static int check_claim(struct sim_world *w, struct sim_client *k, int i, struct sim_attempt *a,
                       const cerb_guard *c)
{
    int e = c->engine_idx;
    if (w->wiped_ns[e] >= a->b.sent_ns - ECHO_NS)
        return 0; /* the server lost it: counted where it mattered (G.a) */
    struct script_guard_record rec;
    script_engine_guard_record((enum script_server)e, c->rec.id, &rec);
    int64_t until = atomic_load(&((cerb_guard *)c)->valid_until_ns);
    const char *what = NULL;
    if (!rec.state)
        what = "no record";
    else if (strcmp(rec.token, c->rec.token) != 0)
        what = "another attempt's record";
    else if (rec.state == 'R' && until > rec.expires_ns)
        what = "its claim expiring earlier";
    if (!what || a->server_reported)
        return 0;
    a->server_reported = true;
    return report(w, "G.b",
                  "client %d's attempt at %s/%s is not LOST (state %d, %s claim deadline %.3f) "
                  "but %s has %s (expiry %.3f)",
                  k->id, sim_gscopes[i], sim_gkeys[i], (int)cerb_guard_state(a->g),
                  c->parent ? "mirror" : "its", at(until), srv(e), what,
                  rec.state ? at(rec.expires_ns) : 0.0);
}

static int guard_step(struct sim_world *w)
{
    int bad = 0;
    int64_t now = sim_now();
    int64_t tol = 2 * CERB_NS_PER_MS; /* as §5a.2's */
    for (int i = 0; i < SIM_GKEYS; i++) {
        int live = 0, first = -1;
        for (int j = 0; j < w->p.n_clients; j++) {
            struct sim_client *k = &w->cl[j];
            struct sim_attempt *a = &k->a[i];
            if (!a->g || k->crashed || a->g->degraded)
                continue; /* no attempt, or one that holds no claim */
            enum cerb_lock_state st = cerb_guard_state(a->g);
            if (st != CERB_LOCK_LOST) {
                /* Limits were counted at the newer begin. */
                bool counts = !a->limit_overlap && !a->degraded;
                if (counts && live++ == 0)
                    first = k->id;
                else if (counts)
                    bad += report(w, "G.a", "%s/%s: the attempts of clients %d and %d both run, "
                                  "neither LOST", sim_gscopes[i], sim_gkeys[i], first, k->id);
                bad += check_claim(w, k, i, a, a->g);
                for (const cerb_guard *m = a->g->mirrors; m; m = m->mirror_next)
                    bad += check_claim(w, k, i, a, m);
            }
            int64_t d = claims_deadline(a->g);
            bool due = atomic_load(&a->g->cstate) == CERB_LOCK_LOST || now >= d + tol;
            if (!k->paused && a->lost_cb_ns == 0 && !a->lost_at_begin && !a->late_reported &&
                due) {
                a->late_reported = true;
                bad += report(w, "G.b",
                              "client %d's attempt at %s/%s passed its deadline %.3f (state %d); "
                              "no lost callback by %.3f",
                              k->id, sim_gscopes[i], sim_gkeys[i], at(d), (int)st, at(now));
            }
        }
    }
    return bad;
}
