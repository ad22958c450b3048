/*
 * cmd_serve.c — `cerberus [-c FILE] serve [--listen unix:PATH|ADDR:PORT]...
 * [--token-file FILE] [--allow-remote] [--socket-group NAME] [--socket-mode
 * MODE] [--dapr-store NAME] [--dapr-app-id ID] [--check]`: the HTTP lock service (DESIGN.md §15) until SIGINT or
 * SIGTERM.
 *
 * The settings are the serve.* keys of the configuration file with the
 * flags over them (serve_settings.c), checked before anything starts;
 * --check stops there. Every listen address is a socket of its own: unix
 * sockets need no token (their group and mode are the control); TCP is
 * served on loopback addresses (any with allow_remote) and only with a
 * token file, whose first line is the bearer token every TCP request must
 * carry (never logged). Under systemd socket activation the sockets passed
 * (LISTEN_FDS) are served instead, under the same rules.
 *
 * The signals (INT, TERM, HUP) are blocked before the client opens and
 * the server starts, so every thread either makes inherits the mask and
 * only the main thread, in sigwait(), ever takes them. SIGHUP reloads:
 * cerb_client_reload() (a bad file keeps the old configuration, and the
 * error is logged), then, when it took, the reloadable serve keys (rate
 * limit, drain, keepalive window); the token file is re-read either way
 * (a bad one keeps the old token); the sockets stay. systemd hears
 * RELOADING=1 before and READY=1 after. On INT or TERM it hears STOPPING=1,
 * the server stops (requests being answered finish within serve.drain_ms),
 * every hold it keeps is released, and the client is closed.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "serve.h"
#include "serve_settings.h"

#define DEFAULT_SOCKET "/run/cerberus/cerberus.sock"

const char cerb__cli_serve_usage[] =
    "Usage: cerberus [-c FILE] serve [--listen unix:PATH|ADDR:PORT]...\n"
    "                [--token-file FILE] [--allow-remote] [--socket-group NAME]\n"
    "                [--socket-mode MODE] [--dapr-store NAME] [--dapr-app-id ID]\n"
    "                [--check]\n"
    "\n"
    "Serve locks over HTTP/1.1 with JSON, one library client for every\n"
    "request, until SIGINT or SIGTERM; then release every hold and exit.\n"
    "SIGHUP reloads the configuration and re-reads the token file.\n"
    "\n"
    "  --listen unix:PATH   a unix socket, mode 0660, no token (default\n"
    "                       serve.listen, unix:/run/cerberus/cerberus.sock)\n"
    "  --listen ADDR:PORT   TCP on a loopback address: 127.0.0.0/8 as\n"
    "                       127.0.0.1:PORT, or [::1]:PORT; needs a token file\n"
    "  --token-file FILE    its first line is the bearer token; refused when\n"
    "                       every user may read it (serve.token_file)\n"
    "  --allow-remote       TCP on any address, still with the token\n"
    "                       (serve.allow_remote)\n"
    "  --socket-group NAME  the unix sockets' group (serve.socket_group)\n"
    "  --socket-mode MODE   the unix sockets' mode, octal (serve.socket_mode)\n"
    "  --dapr-store NAME    the Dapr lock store the Dapr routes answer for\n"
    "                       (default cerberus)\n"
    "  --dapr-app-id ID     Dapr resource R is the lock lock||ID||R, the key a\n"
    "                       Dapr sidecar's Redis lock store uses (default: R)\n"
    "  --check              check the configuration, the addresses, the token\n"
    "                       file and the group; print \"ok\" or the problems;\n"
    "                       serve nothing\n"
    "--listen may be given several times, unix and TCP together, and replaces\n"
    "serve.listen. Every TCP request, /healthz included, must carry the\n"
    "header `Authorization: Bearer TOKEN`; without it or with another token it\n"
    "is answered 401 {\"status\": \"UNAUTHORIZED\"} with WWW-Authenticate: Bearer.\n"
    "Under systemd: READY=1 once every socket listens (Type=notify), and the\n"
    "sockets of a socket unit (LISTEN_FDS) are served instead of --listen.\n"
    "\n"
    "Routes:\n"
    "  GET    /healthz                     {\"ok\": true}\n"
    "  POST   /v1/locks/NAME/acquire       {\"wait_ms\": N, \"lease_ms\": N}, both\n"
    "         optional -> {\"hold\", \"fencing_token\", \"engine\"}\n"
    "  POST   /v1/holds/HOLD/keepalive     {\"ok\": true, \"state\", \"valid_ms\"}\n"
    "  GET    /v1/holds/HOLD/events        text/event-stream: `event: heartbeat`\n"
    "         every 5 s (state, valid_ms), `event: lost` when the hold is\n"
    "         lost, `event: released` when it is released; then it ends\n"
    "  DELETE /v1/holds/HOLD               {\"released\": true}\n"
    "  GET    /v1/locks/NAME               {\"name\", \"holders\": [...]}\n"
    "  GET    /v1/status                   {\"current\", \"engines\": [...]}\n"
    "  POST   /v1/switch                   {\"engine\": NAME} (optional) ->\n"
    "         {\"from\", \"to\"}\n"
    "  GET    /metrics                     Prometheus text\n"
    "  POST   /v1/guard/SCOPE/KEY/begin    {\"running_ms\", \"keep_ms\",\n"
    "         \"on_unavailable\"} -> {\"state\": \"run\", \"attempt\"} or\n"
    "         {\"state\": \"duplicate\", \"result\"}\n"
    "  POST   /v1/guard/SCOPE/KEY/finish   {\"attempt\", \"succeeded\", \"result\"}\n"
    "  POST   /v1/guard/attempts/ID/keepalive\n"
    "  POST   /v1.0-alpha1/lock/STORE      Dapr: {\"resourceId\", \"lockOwner\",\n"
    "         \"expiryInSeconds\"} -> {\"success\"}; POST /v1.0-alpha1/unlock/STORE\n"
    "         -> {\"status\": 0..3}; GET /v1.0/metadata, /v1.0/healthz. Over TCP\n"
    "         the header dapr-api-token: TOKEN is accepted there too\n"
    "A hold nobody listens to (events) and nobody keeps alive or releases\n"
    "within its lease_ms (serve.keepalive_ms, 10000, when not given) is\n"
    "released. On SIGINT or SIGTERM, waiting acquisitions and event streams\n"
    "end, answers being made are sent (at most serve.drain_ms, 5 s), holds\n"
    "are released.\n"
    "Errors are {\"status\": NAME, \"error\": TEXT} with HTTP 409 busy, 408\n"
    "timeout, 503 unavailable, 400 bad input, 404 unknown hold, 410 lost, 401 no or\n"
    "wrong token (TCP), 429 RATE_LIMITED (serve.rate_limit) with Retry-After.\n"
    "Logs: one line per record on stderr, TIME LEVEL EVENT key=value...\n"
    "\n"
    "Exit status: 0 stopped by a signal (or --check found nothing), 64 usage,\n"
    "69 no engine reachable, 71 a socket could not be made, 78 configuration\n"
    "error (a token file unreadable, empty or readable by every user; an\n"
    "unknown group).\n";

#define UNIX_PREFIX "unix:"

static bool is_unix(const char *spec)
{
    return strncmp(spec, UNIX_PREFIX, strlen(UNIX_PREFIX)) == 0;
}

/* Matches the valued option @name at argv[*i]: 0 no, 1 yes (*val set), or
 * the exit code of a usage error (no value, or an empty one). */
static int opt(int argc, char **argv, int *i, const char *name, const char *what,
               const char **val)
{
    int m = cerb__cli_opt_val(argc, argv, i, name, NULL, val);
    if (m < 0 || (m > 0 && !(*val)[0]))
        return cerb__cli_usage_error("serve", "%s needs %s", name, what);
    return m;
}

/* `serve [--listen SPEC]... [--token-file FILE] ...`: -1 to go on with *f,
 * or the exit code. Reads no file: the fuzzer runs it. Each option is one
 * block; the checks that need the file are serve_settings.c's. */
static int parse_args(int argc, char **argv, struct cerb__serve_flags *f)
{
    memset(f, 0, sizeof *f);
    for (int i = 1; i < argc; i++) {
        const char *val = NULL;
        int m;
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_serve_usage, stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--check") == 0) {
            f->check = true;
            continue;
        }
        if (strcmp(argv[i], "--allow-remote") == 0) {
            f->allow_remote = true;
            continue;
        }
        if ((m = opt(argc, argv, &i, "--token-file", "FILE", &val)) != 0) {
            if (m != 1)
                return m;
            f->token_file = val;
            continue;
        }
        if ((m = opt(argc, argv, &i, "--socket-group", "NAME", &val)) != 0) {
            if (m != 1)
                return m;
            f->socket_group = val;
            continue;
        }
        if ((m = opt(argc, argv, &i, "--socket-mode", "MODE", &val)) != 0) {
            if (m != 1)
                return m;
            f->socket_mode = val;
            continue;
        }
        /* The Dapr façade's store name and app id (serve_dapr.c). */
        if ((m = opt(argc, argv, &i, "--dapr-store", "NAME", &val)) != 0) {
            if (m != 1)
                return m;
            f->dapr_store = val;
            continue;
        }
        if ((m = opt(argc, argv, &i, "--dapr-app-id", "ID", &val)) != 0) {
            if (m != 1)
                return m;
            f->dapr_app_id = val;
            continue;
        }
        m = cerb__cli_opt_val(argc, argv, &i, "--listen", NULL, &val);
        if (m < 0)
            return cerb__cli_usage_error("serve", "--listen needs unix:PATH or ADDR:PORT");
        if (m == 0)
            return cerb__cli_usage_error("serve", "unknown argument '%s'", argv[i]);
        if (f->n == CERB_SERVE_MAX_LISTEN)
            return cerb__cli_usage_error("serve", "more than %d --listen",
                                         CERB_SERVE_MAX_LISTEN);
        if (is_unix(val)) {
            if (!val[strlen(UNIX_PREFIX)])
                return cerb__cli_usage_error("serve", "--listen unix: needs a PATH");
        } else {
            /* The shape here; loopback or not once the file is read. */
            struct sockaddr_storage sa;
            socklen_t salen;
            char err[256];
            if (cerb__serve_tcp_addr(val, true, &sa, &salen, err, sizeof err) != CERB_OK)
                return cerb__cli_usage_error("serve", "--listen %s", err);
        }
        f->listen[f->n++] = val;
    }
    /* Refused here, so that --check says what the start would. */
    if (f->dapr_store || f->dapr_app_id) {
        char err[256];
        if (cerb__serve_dapr_check(f->dapr_store ? f->dapr_store : "cerberus", f->dapr_app_id,
                                   err, sizeof err) != CERB_OK)
            return cerb__cli_usage_error("serve", "%s", err);
    }
    return -1;
}

int cerb__cli_serve_parse(int argc, char **argv)
{
    struct cerb__serve_flags f;
    return parse_args(argc, argv, &f);
}

/* Tells systemd @state (when it listens), logging a failure. */
static void notify(const char *state)
{
    char err[256];
    if (cerb__serve_notify(state, err, sizeof err) != CERB_OK)
        CERB_SERVE_LOG(CERB_LOG_WARN, "notify", "error", err);
}

/* Starts the server on the sockets systemd passed (@fds), else on every
 * listen address of @set; the exit code. */
static int start(cerb_client *c, const struct cerb__serve_settings *set, const char *token,
                 const int *fds, size_t n_fds, struct cerb__serve **s)
{
    char err[512], name[160];

    if (cerb__serve_start(c, NULL, s, err, sizeof err) != CERB_OK) {
        cerb__cli_error("serve: %s", err);
        return CLI_EXIT_OSERR;
    }
    cerb__serve_configure(*s, &set->opts);
    if ((set->dapr_store || set->dapr_app_id) &&
        cerb__serve_set_dapr(*s, set->dapr_store ? set->dapr_store : "cerberus",
                             set->dapr_app_id, err, sizeof err) != CERB_OK) {
        cerb__cli_error("serve: %s", err);
        return CLI_EXIT_USAGE;
    }
    for (size_t i = 0; i < n_fds; i++) {
        cerb_status st = cerb__serve_listen_fd(*s, fds[i], token, name, sizeof name, err,
                                               sizeof err);
        if (st != CERB_OK) {
            cerb__cli_error("serve: %s", err);
            return st == CERB_EINVAL ? CLI_EXIT_CONFIG : CLI_EXIT_OSERR;
        }
    }
    for (size_t i = 0; n_fds == 0 && i < set->n; i++) {
        const char *spec = set->listen[i];
        cerb_status st;
        if (is_unix(spec))
            st = cerb__serve_listen_unix(*s, spec + strlen(UNIX_PREFIX), err, sizeof err);
        else
            st = cerb__serve_listen_tcp(*s, spec, token, NULL, err, sizeof err);
        if (st != CERB_OK) {
            cerb__cli_error("serve: %s", err);
            return st == CERB_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_OSERR;
        }
    }
    return CLI_EXIT_OK;
}

/* SIGHUP: the library's reload, then the serve keys it accepted, then the
 * token file; systemd hears RELOADING=1 before and READY=1 after. */
static void reload(const struct cerb__cli *cli, const struct cerb__serve_flags *f,
                   cerb_client *c, struct cerb__serve *s, bool tcp)
{
    struct cerb__serve_settings set;
    const char *token_file = NULL;
    char err[512], *token = NULL;
    cerb_status st;
    bool applied = false;

    if (cerb__serve_notify_reloading(err, sizeof err) != CERB_OK)
        CERB_SERVE_LOG(CERB_LOG_WARN, "notify", "error", err);
    st = cli->config_path ? cerb_client_reload(c) : CERB_OK;
    if (st != CERB_OK && st != CERB_UNAVAILABLE) {
        /* The old configuration stays, serve keys included. */
        CERB_SERVE_LOG(CERB_LOG_ERROR, "reload", "config", cerb__cli_config_name(cli),
                       "status", cerb_status_name(st), "error", cerb_last_error(), "kept",
                       "old configuration");
    } else if (cerb__cli_serve_settings(cli, f, &set) == CLI_EXIT_OK) {
        struct cerb__serve_opts o = set.opts;
        cerb__serve_configure(s, &o);
        applied = true;
        token_file = f->token_file ? f->token_file : set.token_file;
        if (tcp && token_file) {
            if (cerb__cli_serve_read_token(token_file, &token, err, sizeof err) != CERB_OK) {
                CERB_SERVE_LOG(CERB_LOG_ERROR, "reload", "error", err, "kept", "old token");
            } else if (cerb__serve_set_token(s, token) != CERB_OK) {
                CERB_SERVE_LOG(CERB_LOG_ERROR, "reload", "error", "out of memory", "kept",
                               "old token");
            }
            cerb__config_free_secret(token);
        }
        cerb__cli_serve_settings_free(&set);
    } else {
        cerb__cli_serve_settings_free(&set);
        CERB_SERVE_LOG(CERB_LOG_ERROR, "reload", "config", cerb__cli_config_name(cli),
                       "error", "the serve settings are refused (above)", "kept",
                       "old serve settings");
    }
    if (applied)
        CERB_SERVE_LOG(CERB_LOG_INFO, "reload", "config", cerb__cli_config_name(cli),
                       "status", cerb_status_name(st), "token",
                       tcp && token_file ? "re-read" : NULL);
    notify("READY=1");
}

/* --check: the settings and the token file, then "ok" or the exit code. */
static int check(const struct cerb__serve_settings *set, int rc)
{
    char err[512], *token = NULL;

    if (set->cfg && set->token_file) {
        if (cerb__cli_serve_read_token(set->token_file, &token, err, sizeof err) != CERB_OK) {
            cerb__cli_error("serve: %s", err);
            rc = rc == CLI_EXIT_OK ? CLI_EXIT_CONFIG : rc;
        }
        cerb__config_free_secret(token);
    }
    if (rc == CLI_EXIT_OK)
        puts("ok");
    return rc;
}

int cerb__cli_serve(const struct cerb__cli *cli, int argc, char **argv)
{
    struct cerb__serve_flags f;
    struct cerb__serve_settings set;
    cerb_client *c = NULL;
    struct cerb__serve *s = NULL;
    char *token = NULL, err[512], nfd[16];
    int fds[CERB_SERVE_MAX_LISTEN];
    size_t n_fds = 0;
    sigset_t sigs, orig;
    int rc, sig = 0;

    rc = parse_args(argc, argv, &f);
    if (rc >= 0)
        return rc;
    /* The environment is read before any thread starts. */
    if (!f.check &&
        cerb__serve_listen_fds(fds, CERB_SERVE_MAX_LISTEN, &n_fds, err, sizeof err) !=
            CERB_OK) {
        cerb__cli_error("serve: %s", err);
        return CLI_EXIT_CONFIG;
    }
    rc = cerb__cli_serve_settings(cli, &f, &set);
    if (f.check) {
        rc = check(&set, rc);
        cerb__cli_serve_settings_free(&set);
        return rc;
    }
    /* Sockets passed by systemd replace the listen addresses, which then
     * are not judged (a TCP one among the passed needs the token, though,
     * and says so when it is adopted). */
    if (rc != CLI_EXIT_OK && !(n_fds > 0 && set.cfg))
        goto out_set;
    rc = CLI_EXIT_OK;
    if (set.token_file && (set.tcp || n_fds > 0)) {
        if (cerb__cli_serve_read_token(set.token_file, &token, err, sizeof err) != CERB_OK) {
            cerb__cli_error("serve: %s", err);
            rc = CLI_EXIT_CONFIG;
            goto out_set;
        }
    }
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    if (pthread_sigmask(SIG_BLOCK, &sigs, &orig) != 0) {
        cerb__cli_error("serve: cannot block signals");
        rc = CLI_EXIT_OSERR;
        goto out_set;
    }
    /* The library's lines become records of the server's log too. */
    cerb_log_set(cerb__serve_log_library, NULL,
                 cli->verbose >= 2 ? CERB_LOG_DEBUG
                 : cli->verbose    ? CERB_LOG_INFO
                                   : CERB_LOG_WARN);
    {
        cerb_status st = cerb_client_open(&c, cli->config_path);
        if (st != CERB_OK) {
            if (st == CERB_ECONFIG)
                cerb__cli_error("%s", cerb_last_error());
            else
                cerb__cli_error("%s: %s", cerb__cli_config_name(cli), cerb_last_error());
            rc = cerb__cli_exit_code(st);
            goto out;
        }
    }
    rc = start(c, &set, token, fds, n_fds, &s);
    /* Each TCP socket keeps a copy of the token; this one is wiped now. */
    cerb__config_free_secret(token);
    token = NULL;
    if (rc != CLI_EXIT_OK)
        goto out;
    snprintf(nfd, sizeof nfd, "%zu", n_fds);
    {
        char pid[24];
        const char *engine = cerb_engine_current(c);
        snprintf(pid, sizeof pid, "%ld", (long)getpid());
        CERB_SERVE_LOG(CERB_LOG_INFO, "start", "config", cerb__cli_config_name(cli), "engine",
                       engine ? engine : "", "pid", pid, "systemd_sockets",
                       n_fds ? nfd : NULL);
    }
    notify("READY=1");
    for (;;) {
        while (sigwait(&sigs, &sig) != 0)
            ;
        if (sig != SIGHUP)
            break;
        CERB_SERVE_LOG(CERB_LOG_INFO, "signal", "signal", "SIGHUP", "action", "reload");
        reload(cli, &f, c, s, set.tcp || n_fds > 0);
    }
    notify("STOPPING=1");
    CERB_SERVE_LOG(CERB_LOG_INFO, "signal", "signal", sig == SIGINT ? "SIGINT" : "SIGTERM",
                   "action", "stop");
out:
    cerb__config_free_secret(token);
    cerb__serve_stop(s);
    cerb_client_close(c);
    pthread_sigmask(SIG_SETMASK, &orig, NULL);
out_set:
    cerb__config_free_secret(token);
    cerb__cli_serve_settings_free(&set);
    return rc;
}
