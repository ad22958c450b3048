/*
 * cmd_serve.c — `cerberus [-c FILE] serve [--listen unix:PATH]`: the HTTP
 * lock service (DESIGN.md §15) until SIGINT or SIGTERM.
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
#include "serve.h"

#define DEFAULT_SOCKET "/run/cerberus/cerberus.sock"

const char cerb__cli_serve_usage[] =
    "Usage: cerberus [-c FILE] serve [--listen unix:PATH]\n"
    "\n"
    "Serve locks over HTTP/1.1 with JSON on a unix socket (mode 0660), one\n"
    "library client for every request, until SIGINT or SIGTERM; then\n"
    "release every hold and exit.\n"
    "\n"
    "  --listen unix:PATH  the socket (default unix:" DEFAULT_SOCKET ")\n"
    "\n"
    "Routes:\n"
    "  GET    /healthz                     {\"ok\": true}\n"
    "  POST   /v1/locks/NAME/acquire       {\"wait_ms\": N, \"lease_ms\": N}, both\n"
    "         optional -> {\"hold\", \"fencing_token\", \"engine\"}\n"
    "  POST   /v1/holds/HOLD/keepalive     {\"ok\": true}\n"
    "  DELETE /v1/holds/HOLD               {\"released\": true}\n"
    "A hold neither kept alive nor released within its lease_ms (10000 when\n"
    "not given) is released. On SIGINT or SIGTERM, waiting acquisitions end\n"
    "with 503, answers being made are sent (at most 5 s), holds released.\n"
    "Errors are {\"status\": NAME, \"error\": TEXT} with HTTP 409 busy, 408\n"
    "timeout, 503 unavailable, 400 bad input, 404 unknown hold.\n"
    "\n"
    "Exit status: 0 stopped by a signal, 64 usage, 69 no engine reachable,\n"
    "71 the socket could not be made, 78 configuration error.\n";

#define UNIX_PREFIX "unix:"

/* `serve [--listen unix:PATH]`: -1 to go on with *path, or the exit code. */
static int parse_args(int argc, char **argv, const char **path)
{
    *path = DEFAULT_SOCKET;
    for (int i = 1; i < argc; i++) {
        const char *val = NULL;
        int m;
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_serve_usage, stdout);
            return CLI_EXIT_OK;
        }
        m = cerb__cli_opt_val(argc, argv, &i, "--listen", NULL, &val);
        if (m < 0)
            return cerb__cli_usage_error("serve", "--listen needs unix:PATH");
        if (m == 0)
            return cerb__cli_usage_error("serve", "unknown argument '%s'", argv[i]);
        if (strncmp(val, UNIX_PREFIX, strlen(UNIX_PREFIX)) != 0 ||
            !val[strlen(UNIX_PREFIX)])
            return cerb__cli_usage_error("serve", "--listen takes unix:PATH (TCP is "
                                                  "not served yet)");
        *path = val + strlen(UNIX_PREFIX);
    }
    return -1;
}

int cerb__cli_serve_parse(int argc, char **argv)
{
    const char *path;
    return parse_args(argc, argv, &path);
}

int cerb__cli_serve(const struct cerb__cli *cli, int argc, char **argv)
{
    const char *path;
    cerb_client *c = NULL;
    struct cerb__serve *s = NULL;
    sigset_t sigs, orig;
    char err[512];
    int rc, sig = 0;

    rc = parse_args(argc, argv, &path);
    if (rc >= 0)
        return rc;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &sigs, &orig) != 0) {
        cerb__cli_error("serve: cannot block signals");
        return CLI_EXIT_OSERR;
    }
    rc = cerb__cli_open_client(cli, &c);
    if (rc != CLI_EXIT_OK)
        goto out;
    if (cerb__serve_start(c, path, &s, err, sizeof err) != CERB_OK) {
        cerb__cli_error("serve: %s", err);
        rc = CLI_EXIT_OSERR;
        goto out;
    }
    fprintf(stderr, "cerberus: serve: listening on unix:%s\n", path);
    while (sigwait(&sigs, &sig) != 0)
        ;
    fprintf(stderr, "cerberus: serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
out:
    cerb__serve_stop(s);
    cerb_client_close(c);
    pthread_sigmask(SIG_SETMASK, &orig, NULL);
    return rc;
}
