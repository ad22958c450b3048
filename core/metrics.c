/*
 * metrics.c — cerb_metrics_text(): the client's state in the Prometheus
 * text exposition format 0.0.4, for a /metrics endpoint or node_exporter's
 * textfile collector (`cerberus status --prometheus`).
 *
 * Everything is read from counters the library keeps anyway (the ones
 * cerb_engine_info() reports) plus two histograms per engine: how long a
 * successful acquisition waited (from the call to the grant; reentrant
 * acquisitions are not counted) and how long a hold lasted (grant to
 * release or to the release that found it lost). Names follow Prometheus
 * conventions: the `cerberus_` prefix, base units (seconds), `_total` on
 * counters, one `engine` label per engine series. The histogram buckets
 * cover a loopback round trip (0.5 ms) up to a lease-length wait (30 s),
 * and hold times up to an hour (cron-like jobs run under `cerberus run`).
 *
 * The text is built in a growing buffer; a failed allocation gives
 * CERB_ENOMEM and nothing half-written.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "internal.h"
#include "metrics.h"

#define MS INT64_C(1000000)
#define S INT64_C(1000000000)

static const int64_t wait_le[CERB_HISTO_BUCKETS] = {
    MS / 2, 1 * MS, 2 * MS + MS / 2, 5 * MS, 10 * MS, 25 * MS, 50 * MS, 100 * MS,
    250 * MS, 500 * MS, 1 * S, 2 * S + S / 2, 5 * S, 10 * S, 30 * S, 60 * S};
static const int64_t hold_le[CERB_HISTO_BUCKETS] = {
    1 * MS, 5 * MS, 10 * MS, 50 * MS, 100 * MS, 500 * MS, 1 * S, 5 * S,
    10 * S, 30 * S, 60 * S, 300 * S, 600 * S, 1800 * S, 3600 * S, 7200 * S};

static const int64_t *bounds(enum cerb_histo_kind kind)
{
    return kind == CERB_HISTO_WAIT ? wait_le : hold_le;
}

void cerb__histo_observe(struct cerb_histo *h, enum cerb_histo_kind kind, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    const int64_t *le = bounds(kind);
    int b = 0;
    while (b < CERB_HISTO_BUCKETS && ns > le[b])
        b++;
    atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

struct buf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *q = cerb__realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* A label value, escaped as the format asks (backslash, quote, newline). */
static void put_label(struct buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            put(b, "\\\\");
        else if (*v == '"')
            put(b, "\\\"");
        else if (*v == '\n')
            put(b, "\\n");
        else
            put(b, "%c", *v);
    }
}

static void header(struct buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `name{engine="e"[,extra]} value` */
static void sample(struct buf *b, const char *name, const char *engine, const char *extra,
                   const char *value)
{
    put(b, "%s{engine=\"", name);
    put_label(b, engine);
    put(b, "\"%s%s} %s\n", extra ? "," : "", extra ? extra : "", value);
}

static void sample_u(struct buf *b, const char *name, const char *engine, const char *extra,
                     uint64_t v)
{
    char s[32];
    snprintf(s, sizeof s, "%" PRIu64, v);
    sample(b, name, engine, extra, s);
}

static void seconds(char *out, size_t n, int64_t ns)
{
    snprintf(out, n, "%.9g", (double)ns / (double)S);
}

static void histogram(struct buf *b, const char *name, const char *engine,
                      const struct cerb_histo *h, enum cerb_histo_kind kind)
{
    const int64_t *le = bounds(kind);
    uint64_t cum = 0;
    char extra[64], v[32];
    /* An observation adds its bucket before the count: read the count
     * first and clamp, so no bucket exceeds _count (and they stay
     * monotone) while observations race with this read. */
    uint64_t count = atomic_load(&h->count);
    for (int i = 0; i <= CERB_HISTO_BUCKETS; i++) {
        cum += atomic_load(&h->bucket[i]);
        uint64_t shown = cum < count ? cum : count;
        if (i < CERB_HISTO_BUCKETS) {
            char s[32];
            seconds(s, sizeof s, le[i]);
            snprintf(extra, sizeof extra, "le=\"%s\"", s);
        } else {
            snprintf(extra, sizeof extra, "le=\"+Inf\"");
            shown = count;
        }
        char nm[96];
        snprintf(nm, sizeof nm, "%s_bucket", name);
        sample_u(b, nm, engine, extra, shown);
    }
    char nm[96];
    snprintf(nm, sizeof nm, "%s_sum", name);
    seconds(v, sizeof v, (int64_t)atomic_load(&h->sum_ns));
    sample(b, nm, engine, NULL, v);
    snprintf(nm, sizeof nm, "%s_count", name);
    sample_u(b, nm, engine, NULL, count);
}

static const char *const breaker_names[] = {"closed", "open", "half_open", "disabled",
                                            "forced_open"};

cerb_status cerb_metrics_text(cerb_client *c, char **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "cerb_metrics_text: out is NULL");
    *out = NULL;
    if (!cerb__client_ok(c))
        return cerb__client_refused(c, "cerb_metrics_text");
    struct buf b = {cerb__malloc(4096), 0, 4096, false};
    if (!b.p)
        return cerb__error_set(CERB_ENOMEM, "cerb_metrics_text: out of memory");
    b.p[0] = '\0';

    size_t n = c->n_engines;
    struct cerb_engine_info info[CERB_MAX_ENGINES];
    for (size_t i = 0; i < n; i++)
        if (cerb_engine_info(c, c->engines[i].name, &info[i]) != CERB_OK)
            memset(&info[i], 0, sizeof info[i]);

    header(&b, "cerberus_engine_active", "gauge",
           "1 for the engine new acquisitions go to, 0 for the others.");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_engine_active", c->engines[i].name, NULL,
                 info[i].active ? 1 : 0);
    header(&b, "cerberus_engine_breaker_state", "gauge",
           "The engine's circuit breaker: 1 for its current state, 0 for the others.");
    for (size_t i = 0; i < n; i++)
        for (int s = 0; s < (int)(sizeof breaker_names / sizeof breaker_names[0]); s++) {
            char extra[48];
            snprintf(extra, sizeof extra, "state=\"%s\"", breaker_names[s]);
            sample_u(&b, "cerberus_engine_breaker_state", c->engines[i].name, extra,
                     (int)info[i].breaker == s ? 1 : 0);
        }
    header(&b, "cerberus_engine_breaker_transitions_total", "counter",
           "State changes of the engine's circuit breaker.");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_engine_breaker_transitions_total", c->engines[i].name, NULL,
                 info[i].breaker_transitions);
    header(&b, "cerberus_engine_probe_latency_seconds", "gauge",
           "Latency of the engine's last health probe (absent before the first).");
    for (size_t i = 0; i < n; i++) {
        if (info[i].last_probe_us < 0)
            continue;
        char v[32];
        seconds(v, sizeof v, info[i].last_probe_us * 1000);
        sample(&b, "cerberus_engine_probe_latency_seconds", c->engines[i].name, NULL, v);
    }
    header(&b, "cerberus_acquisitions_total", "counter", "Locks granted by the engine.");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_acquisitions_total", c->engines[i].name, NULL, info[i].acquires);
    header(&b, "cerberus_engine_failures_total", "counter",
           "Hard failures (I/O, protocol) of calls to the engine.");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_engine_failures_total", c->engines[i].name, NULL,
                 info[i].failures);
    header(&b, "cerberus_lost_holds_total", "counter",
           "Holds on the engine reported LOST to their holder.");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_lost_holds_total", c->engines[i].name, NULL, info[i].lost);
    header(&b, "cerberus_guard_begins_total", "counter",
           "cerb_guard_begin() answers while the engine was active, by result.");
    for (size_t i = 0; i < n; i++) {
        sample_u(&b, "cerberus_guard_begins_total", c->engines[i].name, "result=\"ok\"",
                 info[i].guard_begins);
        sample_u(&b, "cerberus_guard_begins_total", c->engines[i].name, "result=\"duplicate\"",
                 info[i].guard_duplicates);
        sample_u(&b, "cerberus_guard_begins_total", c->engines[i].name, "result=\"busy\"",
                 info[i].guard_busy);
        sample_u(&b, "cerberus_guard_begins_total", c->engines[i].name, "result=\"degraded\"",
                 info[i].guard_degraded);
    }
    header(&b, "cerberus_election_terms_total", "counter",
           "Leader-election terms won on the engine (campaigns that returned OK).");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_election_terms_total", c->engines[i].name, NULL,
                 atomic_load(&c->engines[i].terms));
    header(&b, "cerberus_election_proclaims_total", "counter",
           "Values proclaimed by leaders on the engine (confirmed).");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_election_proclaims_total", c->engines[i].name, NULL,
                 atomic_load(&c->engines[i].proclaims));
    header(&b, "cerberus_semaphore_acquisitions_total", "counter",
           "Semaphore acquisitions granted on the engine (each of one or more permits).");
    for (size_t i = 0; i < n; i++)
        sample_u(&b, "cerberus_semaphore_acquisitions_total", c->engines[i].name, NULL,
                 atomic_load(&c->engines[i].sem_grants));
    header(&b, "cerberus_rwlock_holds_total", "counter",
           "Read-write lock holds granted on the engine, by mode (reentries not counted).");
    for (size_t i = 0; i < n; i++) {
        sample_u(&b, "cerberus_rwlock_holds_total", c->engines[i].name, "mode=\"read\"",
                 atomic_load(&c->engines[i].read_grants));
        sample_u(&b, "cerberus_rwlock_holds_total", c->engines[i].name, "mode=\"write\"",
                 atomic_load(&c->engines[i].write_grants));
    }
    header(&b, "cerberus_acquire_wait_seconds", "histogram",
           "Time from a lock call to its grant, for granted acquisitions.");
    for (size_t i = 0; i < n; i++)
        histogram(&b, "cerberus_acquire_wait_seconds", c->engines[i].name,
                  &c->engines[i].wait_h, CERB_HISTO_WAIT);
    header(&b, "cerberus_hold_duration_seconds", "histogram",
           "Time from a grant to its release (or to the release of a lost hold).");
    for (size_t i = 0; i < n; i++)
        histogram(&b, "cerberus_hold_duration_seconds", c->engines[i].name,
                  &c->engines[i].hold_h, CERB_HISTO_HOLD);

    header(&b, "cerberus_engine_switches_total", "counter",
           "Engine switches of this client (automatic and manual).");
    put(&b, "cerberus_engine_switches_total %" PRIu64 "\n", n ? info[0].switches : 0);
    header(&b, "cerberus_holds", "gauge", "Locks this client holds now.");
    put(&b, "cerberus_holds %" PRId64 "\n", (int64_t)atomic_load(&c->holds_in_force));
    header(&b, "cerberus_fencing_epoch", "gauge",
           "The configuration's epoch: the high 16 bits of fencing tokens.");
    put(&b, "cerberus_fencing_epoch %" PRId64 "\n", n ? info[0].epoch : 0);

    if (b.oom) {
        cerb__free(b.p);
        return cerb__error_set(CERB_ENOMEM, "cerb_metrics_text: out of memory");
    }
    *out = b.p;
    return CERB_OK;
}

void cerb_free(void *p)
{
    cerb__free(p);
}
