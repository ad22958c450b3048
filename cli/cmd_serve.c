/*
 * cmd_serve.c — `cerberus [-c FILE] serve [--listen unix:PATH|ADDR:PORT]...
 * [--token-file FILE]`: the HTTP lock service (DESIGN.md §15) until SIGINT
 * or SIGTERM.
 *
 * Every --listen is a socket of its own: unix sockets need no token (their
 * mode 0660 is the control); TCP is served on loopback addresses only and
 * only with --token-file, whose first line is the bearer token every TCP
 * request must carry (never logged). The arguments are checked before
 * anything starts, so a non-loopback address or TCP without a token file
 * is a usage error (64).
 *
 * The signals are blocked before the client opens and the server starts,
 * so every thread either makes inherits the mask and only the main thread,
 * in sigwait(), ever takes them. On one of them the server stops (requests
 * being answered finish), every hold it keeps is released, and the client
 * is closed. The server itself is serve/ (cerb__serve_start/stop), which
 * tests/integration/test_serve.c runs in-process.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config.h"
#include "serve.h"

/* Spelled out in the usage too: scripts/doc-check.py reads a usage text
 * as string literals only, and checks the options it names. */
#define DEFAULT_SOCKET "/run/cerberus/cerberus.sock"

const char cerb__cli_serve_usage[] =
    "Usage: cerberus [-c FILE] serve [--listen unix:PATH|ADDR:PORT]...\n"
    "                                [--token-file FILE]\n"
    "                                [--dapr-store NAME] [--dapr-app-id ID]\n"
    "\n"
    "Serve locks over HTTP/1.1 with JSON, one library client for every\n"
    "request, until SIGINT or SIGTERM; then release every hold and exit.\n"
    "\n"
    "  --listen unix:PATH   a unix socket, mode 0660, no token (default\n"
    "                       unix:/run/cerberus/cerberus.sock when no --listen)\n"
    "  --listen ADDR:PORT   TCP on a loopback address only: 127.0.0.0/8 as\n"
    "                       127.0.0.1:PORT, or [::1]:PORT; needs --token-file\n"
    "  --token-file FILE    its first line is the bearer token\n"
    "  --dapr-store NAME    the Dapr lock store the Dapr routes answer for\n"
    "                       (default cerberus)\n"
    "  --dapr-app-id ID     Dapr resource R is the lock lock||ID||R, the key a\n"
    "                       Dapr sidecar's Redis lock store uses (default: R)\n"
    "--listen may be given several times, unix and TCP together. Every TCP\n"
    "request, /healthz included, must carry the header\n"
    "`Authorization: Bearer TOKEN`; without it or with another token it is\n"
    "answered 401 {\"status\": \"UNAUTHORIZED\"} with WWW-Authenticate: Bearer.\n"
    "\n"
    "Routes:\n"
    "  GET    /healthz                     {\"ok\": true}\n"
    "  POST   /v1/locks/NAME/acquire       {\"wait_ms\": N, \"lease_ms\": N}, both\n"
    "         optional -> {\"hold\", \"fencing_token\", \"engine\"}\n"
    "  POST   /v1/holds/HOLD/keepalive     {\"ok\": true}\n"
    "  GET    /v1/holds/HOLD/events        text/event-stream: `event: heartbeat`\n"
    "         every 5 s, `event: lost` when the hold is lost; it ends when\n"
    "         the hold is released or lost\n"
    "  DELETE /v1/holds/HOLD               {\"released\": true}\n"
    "  GET    /v1/locks/NAME               {\"name\", \"holders\": [...]}\n"
    "  GET    /v1/status                   {\"current\", \"engines\": [...]}\n"
    "  POST   /v1.0-alpha1/lock/STORE      Dapr: {\"resourceId\", \"lockOwner\",\n"
    "         \"expiryInSeconds\"} -> {\"success\"}; POST /v1.0-alpha1/unlock/STORE\n"
    "         -> {\"status\": 0..3}; GET /v1.0/metadata, /v1.0/healthz. Over TCP\n"
    "         the header dapr-api-token: TOKEN is accepted there too\n"
    "A hold nobody listens to (events) and nobody keeps alive or releases\n"
    "within its lease_ms (10000 when not given) is released. On SIGINT or\n"
    "SIGTERM, waiting acquisitions and event streams end, answers being made\n"
    "are sent (at most 5 s), holds are released.\n"
    "Errors are {\"status\": NAME, \"error\": TEXT} with HTTP 409 busy, 408\n"
    "timeout, 503 unavailable, 400 bad input, 404 unknown hold, 401 no or\n"
    "wrong token (TCP).\n"
    "\n"
    "Exit status: 0 stopped by a signal, 64 usage, 69 no engine reachable,\n"
    "71 a socket could not be made, 78 configuration error (an unreadable\n"
    "or empty token file too).\n";

#define UNIX_PREFIX "unix:"

struct serve_args {
    const char *listen[CERB_SERVE_MAX_LISTEN]; /* unix:PATH or ADDR:PORT */
    size_t n;
    bool tcp; /* one of them is TCP */
    const char *token_file;
    const char *dapr_store, *dapr_app_id; /* the Dapr façade; NULL: defaults */
};

static bool is_unix(const char *spec)
{
    return strncmp(spec, UNIX_PREFIX, strlen(UNIX_PREFIX)) == 0;
}

/* `serve [--listen SPEC]... [--token-file FILE]`: -1 to go on with *a, or
 * the exit code. Reads no file: the fuzzer runs it. */
static int parse_args(int argc, char **argv, struct serve_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *val = NULL;
        int m;
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_serve_usage, stdout);
            return CLI_EXIT_OK;
        }
        m = cerb__cli_opt_val(argc, argv, &i, "--token-file", NULL, &val);
        if (m < 0 || (m > 0 && !val[0]))
            return cerb__cli_usage_error("serve", "--token-file needs FILE");
        if (m > 0) {
            a->token_file = val;
            continue;
        }
        /* The Dapr façade's store name and app id (serve_dapr.c). */
        m = cerb__cli_opt_val(argc, argv, &i, "--dapr-store", NULL, &val);
        if (m < 0 || (m > 0 && !val[0]))
            return cerb__cli_usage_error("serve", "--dapr-store needs NAME");
        if (m > 0) {
            a->dapr_store = val;
            continue;
        }
        m = cerb__cli_opt_val(argc, argv, &i, "--dapr-app-id", NULL, &val);
        if (m < 0 || (m > 0 && !val[0]))
            return cerb__cli_usage_error("serve", "--dapr-app-id needs ID");
        if (m > 0) {
            a->dapr_app_id = val;
            continue;
        }
        m = cerb__cli_opt_val(argc, argv, &i, "--listen", NULL, &val);
        if (m < 0)
            return cerb__cli_usage_error("serve", "--listen needs unix:PATH or ADDR:PORT");
        if (m == 0)
            return cerb__cli_usage_error("serve", "unknown argument '%s'", argv[i]);
        if (a->n == CERB_SERVE_MAX_LISTEN)
            return cerb__cli_usage_error("serve", "more than %d --listen",
                                         CERB_SERVE_MAX_LISTEN);
        if (is_unix(val)) {
            if (!val[strlen(UNIX_PREFIX)])
                return cerb__cli_usage_error("serve", "--listen unix: needs a PATH");
        } else {
            struct sockaddr_storage sa;
            socklen_t salen;
            char err[256];
            if (cerb__serve_tcp_parse(val, &sa, &salen, err, sizeof err) != CERB_OK)
                return cerb__cli_usage_error("serve", "--listen %s", err);
            a->tcp = true;
        }
        a->listen[a->n++] = val;
    }
    if (a->tcp && !a->token_file)
        return cerb__cli_usage_error("serve", "TCP (--listen ADDR:PORT) needs "
                                              "--token-file FILE");
    if (a->n == 0)
        a->listen[a->n++] = UNIX_PREFIX DEFAULT_SOCKET;
    return -1;
}

int cerb__cli_serve_parse(int argc, char **argv)
{
    struct serve_args a;
    return parse_args(argc, argv, &a);
}

/* Starts the server on every socket of @a; the exit code. */
static int start(cerb_client *c, const struct serve_args *a, const char *token,
                 struct cerb__serve **s)
{
    char err[512];

    if (cerb__serve_start(c, NULL, s, err, sizeof err) != CERB_OK) {
        cerb__cli_error("serve: %s", err);
        return CLI_EXIT_OSERR;
    }
    if ((a->dapr_store || a->dapr_app_id) &&
        cerb__serve_set_dapr(*s, a->dapr_store ? a->dapr_store : "cerberus", a->dapr_app_id,
                             err, sizeof err) != CERB_OK) {
        cerb__cli_error("serve: %s", err);
        return CLI_EXIT_USAGE;
    }
    for (size_t i = 0; i < a->n; i++) {
        const char *spec = a->listen[i];
        unsigned port = 0;
        cerb_status st;
        if (is_unix(spec))
            st = cerb__serve_listen_unix(*s, spec + strlen(UNIX_PREFIX), err, sizeof err);
        else
            st = cerb__serve_listen_tcp(*s, spec, token, &port, err, sizeof err);
        if (st != CERB_OK) {
            cerb__cli_error("serve: %s", err);
            return st == CERB_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_OSERR;
        }
        if (is_unix(spec))
            fprintf(stderr, "cerberus: serve: listening on %s\n", spec);
        else
            fprintf(stderr, "cerberus: serve: listening on %s (port %u, bearer token)\n",
                    spec, port);
    }
    return CLI_EXIT_OK;
}

int cerb__cli_serve(const struct cerb__cli *cli, int argc, char **argv)
{
    struct serve_args a;
    cerb_client *c = NULL;
    struct cerb__serve *s = NULL;
    char *token = NULL;
    sigset_t sigs, orig;
    int rc, sig = 0;

    rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (a.tcp) {
        if (cerb__config_read_secret("serve --token-file", a.token_file, &token) !=
            CERB_OK) {
            cerb__cli_error("%s", cerb_last_error());
            return CLI_EXIT_CONFIG;
        }
        if (!token || !token[0]) {
            cerb__cli_error("serve --token-file %s: the first line (the token) is empty",
                            a.token_file);
            cerb__config_free_secret(token);
            return CLI_EXIT_CONFIG;
        }
    }
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &sigs, &orig) != 0) {
        cerb__cli_error("serve: cannot block signals");
        cerb__config_free_secret(token);
        return CLI_EXIT_OSERR;
    }
    rc = cerb__cli_open_client(cli, &c);
    if (rc != CLI_EXIT_OK)
        goto out;
    rc = start(c, &a, token, &s);
    /* Each TCP socket keeps a copy of the token; this one is wiped now. */
    cerb__config_free_secret(token);
    token = NULL;
    if (rc != CLI_EXIT_OK)
        goto out;
    while (sigwait(&sigs, &sig) != 0)
        ;
    fprintf(stderr, "cerberus: serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
out:
    cerb__config_free_secret(token);
    cerb__serve_stop(s);
    cerb_client_close(c);
    pthread_sigmask(SIG_SETMASK, &orig, NULL);
    return rc;
}
