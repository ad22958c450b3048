/*
 * cmd_status.c — `cerberus [-c FILE] status [--json]`: the configured
 * engines as a client sees them: which one is active, its breaker state, the
 * latency of the last health probe and the counters of cerb_engine_info().
 *
 * The command opens a client of its own, so the counters are those of this
 * short-lived client (what opening and probing saw), not of other processes;
 * the breaker states and probe latencies are what a fresh client finds
 * after its first probe round, which the command waits for (bounded). The
 * `active` setting and `epoch` come from the file itself. When no engine can
 * be opened at all the client cannot be built; the configured engines are
 * then listed as unreachable and the exit status is 69, which is what a
 * monitoring check wants to see. JSON is built with jansson. --prometheus
 * prints cerb_metrics_text() of that client (for node_exporter's textfile
 * collector), after `cerberus_up` (0 when no engine could be opened: then
 * it is the only sample).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "config.h"

const char cerb__cli_status_usage[] =
    "Usage: cerberus [-c FILE] status [--json | --prometheus]\n"
    "\n"
    "Show the configured engines in failover order: the one new\n"
    "acquisitions go to (*), its circuit-breaker state, the latency of the\n"
    "last health probe, and the counters of a client opened for the purpose\n"
    "(acquires, failures, lost, acquire calls, wake-ups, hand-offs), with the\n"
    "file's `active` setting and `epoch`.\n"
    "\n"
    "Options:\n"
    "  --json         one JSON object on stdout instead of the table\n"
    "  --prometheus   the Prometheus text format (0.0.4) instead, for\n"
    "                 node_exporter's textfile collector\n"
    "\n"
    "Exit status: 0 ok, 69 no engine reachable, 78 configuration error.\n";

/* The breaker's names as the library's log spells them. */
static const char *breaker_name(enum cerb_breaker_state s)
{
    switch (s) {
    case CERB_BREAKER_CLOSED:
        return "closed";
    case CERB_BREAKER_OPEN:
        return "open";
    case CERB_BREAKER_HALF_OPEN:
        return "half_open";
    case CERB_BREAKER_DISABLED:
        return "disabled";
    case CERB_BREAKER_FORCED_OPEN:
        return "forced_open";
    }
    return "unknown"; /* after the switch: -Wswitch names a new state */
}

/* One engine's row; `have` is false when there was no client to ask. */
struct row {
    const char *name;
    bool have;
    struct cerb_engine_info info;
};

static json_t *to_json(const struct cerb__cli *cli, const struct cerb_config *cfg,
                       const char *current, const struct row *rows,
                       const char *error)
{
    json_t *o = json_object(), *arr = json_array();

    if (!o || !arr) {
        json_decref(o);
        json_decref(arr);
        return NULL;
    }
    json_object_set_new(o, "config", cli->config_path ? json_string(cli->config_path)
                                                      : json_null());
    json_object_set_new(o, "active", json_string(cfg->active));
    json_object_set_new(o, "current", current ? json_string(current) : json_null());
    json_object_set_new(o, "epoch", json_integer((json_int_t)cfg->epoch));
    if (error)
        json_object_set_new(o, "error", json_string(error));
    for (size_t i = 0; i < cfg->n_engines; i++) {
        const struct row *r = &rows[i];
        json_t *e = json_object();
        if (!e)
            continue;
        json_object_set_new(e, "name", json_string(r->name));
        if (r->have) {
            const struct cerb_engine_info *in = &r->info;
            json_object_set_new(e, "active", json_boolean(in->active));
            json_object_set_new(e, "breaker", json_string(breaker_name(in->breaker)));
            json_object_set_new(e, "last_probe_us",
                                in->last_probe_us < 0 ? json_null()
                                                      : json_integer((json_int_t)in->last_probe_us));
        } else {
            /* No client: nothing is known but the name. */
            json_object_set_new(e, "active", json_false());
            json_object_set_new(e, "breaker", json_null());
            json_object_set_new(e, "last_probe_us", json_null());
        }
        const struct {
            const char *key;
            uint64_t v;
        } counters[] = {
            {"acquires", r->info.acquires},   {"failures", r->info.failures},
            {"lost", r->info.lost},           {"acquire_calls", r->info.acquire_calls},
            {"wakeups", r->info.wakeups},     {"handoffs", r->info.handoffs},
            {"breaker_transitions", r->info.breaker_transitions},
            {"switches", r->info.switches},
        };
        for (size_t k = 0; k < sizeof counters / sizeof counters[0]; k++)
            json_object_set_new(e, counters[k].key,
                                r->have ? json_integer((json_int_t)counters[k].v) : json_null());
        json_object_set_new(e, "client_epoch", r->have ? json_integer(r->info.epoch) : json_null());
        json_array_append_new(arr, e);
    }
    json_object_set_new(o, "engines", arr);
    return o;
}

static void print_table(const struct cerb__cli *cli, const struct cerb_config *cfg,
                        const char *current, const struct row *rows)
{
    printf("config:  %s\n", cerb__cli_config_name(cli));
    printf("active:  %s", cfg->active);
    if (current && strcmp(current, cfg->active) != 0)
        printf(" (now %s)", current);
    printf("\nepoch:   %" PRId64 "\n\n", cfg->epoch);
    printf("  %-8s %-11s %9s %9s %9s %6s %9s %9s %9s\n", "ENGINE", "BREAKER",
           "PROBE", "ACQUIRES", "FAILURES", "LOST", "CALLS", "WAKEUPS",
           "HANDOFFS");
    for (size_t i = 0; i < cfg->n_engines; i++) {
        const struct row *r = &rows[i];
        const struct cerb_engine_info *in = &r->info;
        char probe[32];
        if (!r->have) {
            printf("  %-8s %-11s\n", r->name, "unreachable");
            continue;
        }
        if (in->last_probe_us < 0)
            snprintf(probe, sizeof probe, "-");
        else
            snprintf(probe, sizeof probe, "%.2fms", (double)in->last_probe_us / 1000.0);
        printf("%c %-8s %-11s %9s %9" PRIu64 " %9" PRIu64 " %6" PRIu64 " %9" PRIu64
               " %9" PRIu64 " %9" PRIu64 "\n",
               in->active ? '*' : ' ', r->name, breaker_name(in->breaker), probe,
               in->acquires, in->failures, in->lost, in->acquire_calls, in->wakeups,
               in->handoffs);
    }
}

/*
 * A client that has just opened has not probed its engines yet. Give its
 * prober one round (interval plus jitter plus timeout, from the file) to
 * report every engine, so PROBE and BREAKER show what a running client
 * sees. Bounded, and over as soon as every engine has a probe result or an
 * opened breaker.
 */
static void wait_first_probe(cerb_client *c, const struct cerb_config *cfg)
{
    int64_t budget = cfg->failover.probe_interval_ms * 6 / 5 +
                     cfg->failover.probe_timeout_ms + 50;
    struct timespec now, nap = {0, 10 * 1000 * 1000};
    int64_t deadline;

    if (budget > 5000)
        budget = 5000;
    clock_gettime(CLOCK_MONOTONIC, &now);
    deadline = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + budget;
    for (;;) {
        bool all = true;
        for (size_t i = 0; i < cfg->n_engines && all; i++) {
            struct cerb_engine_info in;
            if (cerb_engine_info(c, cfg->engines[i], &in) == CERB_OK &&
                in.last_probe_us < 0 && in.breaker == CERB_BREAKER_CLOSED)
                all = false;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (all || (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 >= deadline)
            return;
        nanosleep(&nap, NULL);
    }
}

enum format { TABLE, JSON, PROMETHEUS };

/* `status [--json | --prometheus]`: -1 to go on, or the exit code (printed). */
static int parse_args(int argc, char **argv, enum format *fmt)
{
    for (int i = 1; i < argc; i++) {
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_status_usage, stdout);
            return CLI_EXIT_OK;
        }
        enum format f = strcmp(argv[i], "--json") == 0         ? JSON
                        : strcmp(argv[i], "--prometheus") == 0 ? PROMETHEUS
                                                               : TABLE;
        if (f != TABLE && *fmt != TABLE && *fmt != f)
            return cerb__cli_usage_error("status", "--json and --prometheus exclude each other");
        if (f != TABLE)
            *fmt = f;
        else
            return cerb__cli_usage_error("status", "unexpected argument '%s'", argv[i]);
    }
    return -1;
}

int cerb__cli_status_parse(int argc, char **argv)
{
    enum format fmt = TABLE;
    return parse_args(argc, argv, &fmt);
}

int cerb__cli_status(const struct cerb__cli *cli, int argc, char **argv)
{
    struct cerb_config *cfg = NULL;
    cerb_client *client = NULL;
    struct row rows[CERB_MAX_ENGINES];
    const char *current = NULL;
    char error[1024] = "";
    enum format fmt = TABLE;
    cerb_status st;
    int rc = CLI_EXIT_OK;

    rc = parse_args(argc, argv, &fmt);
    if (rc >= 0)
        return rc;
    rc = CLI_EXIT_OK;
    /* The file's own view (active setting, epoch, engine list). */
    st = cli->config_path ? cerb__config_from_file(cli->config_path, &cfg)
                          : cerb__config_defaults(&cfg);
    if (st != CERB_OK) {
        cerb__cli_error("%s", cerb_last_error());
        return cerb__cli_exit_code(st);
    }
    rc = cerb__cli_open_client(cli, &client);
    if (rc == CLI_EXIT_CONFIG) {
        cerb__config_free(cfg);
        return rc;
    }
    if (rc != CLI_EXIT_OK)
        snprintf(error, sizeof error, "%s", cerb_last_error());
    if (client) {
        wait_first_probe(client, cfg);
        current = cerb_engine_current(client);
    }
    for (size_t i = 0; i < cfg->n_engines; i++) {
        memset(&rows[i], 0, sizeof rows[i]);
        rows[i].name = cfg->engines[i];
        rows[i].have = client && cerb_engine_info(client, cfg->engines[i], &rows[i].info) == CERB_OK;
    }
    if (fmt == PROMETHEUS) {
        char *text = NULL;
        printf("# HELP cerberus_up 1 when a client could open an engine of the configuration.\n"
               "# TYPE cerberus_up gauge\ncerberus_up %d\n", client ? 1 : 0);
        if (client && cerb_metrics_text(client, &text) == CERB_OK)
            fputs(text, stdout);
        else if (client) {
            cerb__cli_error("status: %s", cerb_last_error());
            rc = CLI_EXIT_OSERR;
        }
        cerb_free(text);
    } else if (fmt == JSON) {
        json_t *o = to_json(cli, cfg, current, rows, error[0] ? error : NULL);
        char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        if (s) {
            printf("%s\n", s);
            free(s);
        } else {
            cerb__cli_error("status: out of memory");
            rc = CLI_EXIT_OSERR;
        }
        json_decref(o);
    } else {
        print_table(cli, cfg, current, rows);
    }
    cerb_client_close(client);
    cerb__config_free(cfg);
    return rc;
}
