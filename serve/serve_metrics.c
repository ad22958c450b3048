/*
 * serve_metrics.c — GET /metrics: the client's metrics (cerb_metrics_text,
 * DESIGN.md §13) followed by the server's own, in the Prometheus text
 * format 0.0.4 (text/plain; version=0.0.4):
 *
 *   cerberus_serve_requests_total{route,code}  counter: requests answered,
 *       by route (serve_parse.c's names; "unknown" for no such route,
 *       "unrouted" for one refused before routing: 401, a body too big)
 *       and HTTP code; a series appears with its first request
 *   cerberus_serve_holds          gauge: holds kept for callers now
 *   cerberus_serve_event_streams  gauge: event streams open now
 *   cerberus_serve_attempts       gauge: guard attempts open now
 *
 * The request counters are process-wide atomics (one server per process
 * in `cerberus serve`; tests compare before and after), bumped once per
 * request: the route is noted in a thread-local when the request is routed
 * (a connection's requests run on its own thread, one after the other),
 * serve_reply.c notes the code it queued, and the count is made when the
 * route returns. The gauges are counted when scraped, under the tables'
 * mutexes (held for a walk of the list, as for any lookup).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

/* The codes the routes answer; anything else is counted as "other". */
static const unsigned codes[] = {200, 400, 401, 404, 408, 409, 410, 500, 503};
#define N_CODES (sizeof codes / sizeof codes[0] + 1)
#define UNROUTED CERB_SERVE_RT_COUNT

static atomic_ulong requests[CERB_SERVE_RT_COUNT + 1][N_CODES];

static _Thread_local struct {
    bool routing;
    enum cerb__serve_rt rt;
    unsigned code;
} cur;

static size_t code_index(unsigned code)
{
    for (size_t i = 0; i < N_CODES - 1; i++)
        if (codes[i] == code)
            return i;
    return N_CODES - 1;
}

static void count(size_t rt, unsigned code)
{
    atomic_fetch_add_explicit(&requests[rt][code_index(code)], 1, memory_order_relaxed);
}

void cerb__serve_metrics_enter(enum cerb__serve_rt rt)
{
    cur.routing = true;
    cur.rt = rt < CERB_SERVE_RT_COUNT ? rt : CERB_SERVE_RT_NONE;
    cur.code = 0;
}

void cerb__serve_metrics_replied(unsigned code)
{
    if (cur.routing)
        cur.code = code;
    else
        count(UNROUTED, code);
}

void cerb__serve_metrics_leave(enum MHD_Result ret)
{
    if (cur.routing && (cur.code || ret == MHD_YES))
        count(cur.rt, cur.code ? cur.code : MHD_HTTP_OK); /* no code: a stream */
    cur.routing = false;
}

/* Appends to a growing string; false when out of memory. */
struct text {
    char *p;
    size_t len, cap;
};

static bool put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool put(struct text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        int n;
        va_start(ap, fmt);
        n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return false;
        if (t->p && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return true;
        }
        size_t cap = t->cap * 2 + (size_t)n + 256;
        char *q = realloc(t->p, cap);
        if (!q)
            return false;
        t->p = q;
        t->cap = cap;
    }
}

enum MHD_Result cerb__serve_metrics(struct cerb__serve *s, struct MHD_Connection *conn)
{
    struct text t = {NULL, 0, 0};
    char *lib = NULL;
    size_t holds = 0, streams = 0;
    bool ok;
    enum MHD_Result ret;
    cerb_status st = cerb_metrics_text(s->client, &lib);

    if (st != CERB_OK)
        return cerb__serve_reply_error(conn, st, cerb_last_error());
    if (pthread_mutex_lock(&s->holds.mu) != 0)
        abort();
    for (struct cerb__serve_hold *h = s->holds.head; h; h = h->next) {
        holds++;
        streams += h->listeners;
    }
    if (pthread_mutex_unlock(&s->holds.mu) != 0)
        abort();
    ok = put(&t, "%s", lib);
    cerb_free(lib);
    ok = ok && put(&t, "# HELP cerberus_serve_requests_total Requests answered by cerberus "
                       "serve, by route and HTTP status code.\n"
                       "# TYPE cerberus_serve_requests_total counter\n");
    for (size_t r = 0; ok && r <= CERB_SERVE_RT_COUNT; r++) {
        const char *route = r == UNROUTED ? "unrouted" : cerb__serve_rt_name((enum cerb__serve_rt)r);
        for (size_t c = 0; ok && c < N_CODES; c++) {
            unsigned long n = atomic_load_explicit(&requests[r][c], memory_order_relaxed);
            char code[8];
            if (n == 0)
                continue;
            if (c < N_CODES - 1)
                snprintf(code, sizeof code, "%u", codes[c]);
            else
                snprintf(code, sizeof code, "other");
            ok = put(&t, "cerberus_serve_requests_total{route=\"%s\",code=\"%s\"} %lu\n",
                     route, code, n);
        }
    }
    ok = ok &&
         put(&t,
             "# HELP cerberus_serve_holds Holds cerberus serve keeps for its callers now.\n"
             "# TYPE cerberus_serve_holds gauge\ncerberus_serve_holds %zu\n"
             "# HELP cerberus_serve_event_streams Hold event streams open now.\n"
             "# TYPE cerberus_serve_event_streams gauge\ncerberus_serve_event_streams %zu\n"
             "# HELP cerberus_serve_attempts Guard attempts begun over HTTP and not "
             "finished yet.\n"
             "# TYPE cerberus_serve_attempts gauge\ncerberus_serve_attempts %zu\n",
             holds, streams, cerb__serve_attempts_count(&s->holds.attempts));
    if (!ok) {
        free(t.p);
        return MHD_NO;
    }
    ret = cerb__serve_reply_text(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                                 t.p, t.len);
    free(t.p);
    return ret;
}
