/*
 * main.c — the `cerberus` command: global options, configuration lookup,
 * dispatch to a subcommand, and the helpers every subcommand shares.
 *
 * Command line: `cerberus [-c FILE] [-v] COMMAND [ARGS...]`. Global options
 * end at the first word that is not one of them, which names the command;
 * the command parses the rest itself (so `run`'s CMD and its options are
 * never touched here). `cerberus help COMMAND` and `COMMAND --help` print the
 * same man-page-style text.
 *
 * Configuration lookup (DESIGN.md §6), first match wins: `-c FILE`,
 * `$CERBERUS_CONFIG` when set and not empty, `./cerberus.cfg`,
 * `/etc/cerberus/cerberus.cfg`; with none of them the library's defaults,
 * which use the in-process "local" engine. An explicit choice (-c or the
 * environment) is used even when the file does not exist, so a typo is
 * reported instead of silently falling through to another file; the two
 * well-known paths count only when they exist.
 *
 * Exit codes are sysexits(3) values (cli.h); 75 means the lock was not
 * obtained and 76 that it was lost while the command ran.
 *
 * Parsing is kept apart from running: cerb__cli_parse_global() reads the
 * global options and cerb__cli_parse_command() a command's arguments (each
 * command's own parser, the one its run uses), both without connecting,
 * reading a file or starting anything, so the fuzz harness
 * tests/fuzz/fuzz_cli_args.c can call them on any argv. main() itself is in
 * cerberus.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define ETC_CONFIG "/etc/cerberus/cerberus.cfg"
#define CWD_CONFIG "cerberus.cfg"

static const char main_usage[] =
    "Usage: cerberus [-c FILE] [-v] COMMAND [ARGS...]\n"
    "\n"
    "Distributed locks that keep working when their store fails.\n"
    "\n"
    "Commands:\n"
    "  run [-n | -w MS] [--on-lost kill|ignore] [--lease MS] NAME -- CMD [ARG...]\n"
    "                    hold lock NAME while CMD runs; exit with CMD's status\n"
    "  status [--json | --prometheus]\n"
    "                    engines, breaker states, active engine, probe latency\n"
    "  switch [ENGINE|auto]\n"
    "                    set `active` in the config file (running clients follow)\n"
    "  check [FILE...]   validate the configuration\n"
    "  holders NAME      who holds lock NAME on each engine (--semaphore, --rwlock, --election)\n"
    "  once [-n | -w MS] [--on-lost kill|ignore] [--keep DURATION] SCOPE KEY -- CMD [ARG...]\n"
    "                    run CMD unless KEY already succeeded in SCOPE\n"
    "  init [--force]    prepare the configured stores for their first use\n"
    "  serve [--listen unix:PATH|ADDR:PORT]... [--token-file FILE]\n"
    "                    serve locks over HTTP (unix socket, loopback TCP)\n"
    "  elect [-n | -w MS] [--value V] [--lease MS] NAME -- CMD [ARG...]\n"
    "                    run CMD while leader of election NAME\n"
    "  leader [-q] [--layout latch|selector] NAME\n"
    "                    who leads election NAME\n"
    "  help [COMMAND]    this text, or a command's\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE  configuration file; without it: $CERBERUS_CONFIG,\n"
    "                     ./cerberus.cfg, /etc/cerberus/cerberus.cfg, else the\n"
    "                     built-in defaults (in-process \"local\" engine)\n"
    "  -v, --verbose      say more (twice: library debug lines)\n"
    "  -h, --help         this text\n"
    "  -V, --version      the version\n"
    "\n"
    "Exit status: 0 ok, 64 usage, 65 `init` refused a store in use, 69 no\n"
    "engine reachable, 75 lock not obtained, 76 lock lost, 78 configuration\n"
    "error; `run` and `once` pass on CMD's.\n";

struct command {
    const char *name;
    int (*fn)(const struct cerb__cli *, int, char **);
    int (*parse)(int, char **);
    const char *usage;
};

static const struct command commands[] = {
    {"run", cerb__cli_run, cerb__cli_run_parse, cerb__cli_run_usage},
    {"status", cerb__cli_status, cerb__cli_status_parse, cerb__cli_status_usage},
    {"switch", cerb__cli_switch, cerb__cli_switch_parse, cerb__cli_switch_usage},
    {"check", cerb__cli_check, cerb__cli_check_parse, cerb__cli_check_usage},
    {"holders", cerb__cli_holders, cerb__cli_holders_parse, cerb__cli_holders_usage},
    {"once", cerb__cli_once, cerb__cli_once_parse, cerb__cli_once_usage},
    {"init", cerb__cli_init, cerb__cli_init_parse, cerb__cli_init_usage},
    {"serve", cerb__cli_serve, cerb__cli_serve_parse, cerb__cli_serve_usage},
    {"elect", cerb__cli_elect, cerb__cli_elect_parse, cerb__cli_elect_usage},
    {"leader", cerb__cli_leader, cerb__cli_leader_parse, cerb__cli_leader_usage},
};

/* ---- shared helpers ---- */

void cerb__cli_error(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* What went to stdout so far comes first on a shared terminal. */
    fflush(stdout);
    /* One write per line, so lines of concurrent processes do not mix. */
    fprintf(stderr, "cerberus: %s\n", msg);
}

int cerb__cli_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cerberus: %s%s%s\nTry 'cerberus %s%s--help'.\n",
            cmd ? cmd : "", cmd ? ": " : "", msg, cmd ? cmd : "",
            cmd ? " " : "");
    return CLI_EXIT_USAGE;
}

bool cerb__cli_is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

int cerb__cli_exit_code(cerb_status st)
{
    switch (st) {
    case CERB_OK:
    case CERB_DUPLICATE: /* `once`: the operation already succeeded */
        return CLI_EXIT_OK;
    case CERB_BUSY:
    case CERB_TIMEOUT:
    case CERB_INTERRUPTED:
        return CLI_EXIT_NOT_OBTAINED;
    case CERB_LOST:
        return CLI_EXIT_LOST;
    case CERB_UNAVAILABLE:
    case CERB_EIO:
    case CERB_EPROTO:
        return CLI_EXIT_UNAVAILABLE;
    case CERB_EINVAL:
        return CLI_EXIT_USAGE;
    case CERB_ECONFIG:
        return CLI_EXIT_CONFIG;
    case CERB_ENOMEM:
        return CLI_EXIT_OSERR;
    case CERB_NOT_OWNER:
    case CERB_STATUS_COUNT:
        break;
    }
    /* After the switch on purpose: -Wswitch names a status added later. */
    return CLI_EXIT_SOFTWARE;
}

bool cerb__cli_parse_ms(const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    long long v;

    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end != '\0' || v < min || v > max)
        return false;
    *out = (int64_t)v;
    return true;
}

bool cerb__cli_name_ok(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > 255)
        return false;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

const char *cerb__cli_config_name(const struct cerb__cli *cli)
{
    return cli->config_path ? cli->config_path : "(defaults)";
}

const char *cerb__cli_error_in(const char *path, const char *msg, char *buf,
                               size_t len)
{
    if (strncmp(msg, "config:", 7) == 0)
        snprintf(buf, len, "%s:%s", path, msg + 7);
    else
        snprintf(buf, len, "%s", msg);
    return buf;
}

static void log_sink(cerb_log_level level, const char *line, void *ud)
{
    static const char *const names[] = {"debug", "info", "warning", "error"};

    (void)ud;
    if ((int)level >= 0 && level < CERB_LOG_OFF)
        fprintf(stderr, "cerberus: %s: %s\n", names[level], line);
}

void cerb__cli_log_init(const struct cerb__cli *cli, cerb_log_level quiet)
{
    cerb_log_level lvl = cli->verbose >= 2   ? CERB_LOG_DEBUG
                         : cli->verbose == 1 ? CERB_LOG_INFO
                                             : quiet;
    cerb_log_set(log_sink, NULL, lvl);
}

int cerb__cli_open_client(const struct cerb__cli *cli, cerb_client **out)
{
    cerb_status st;

    cerb__cli_log_init(cli, CERB_LOG_WARN);
    st = cerb_client_open(out, cli->config_path);
    if (st == CERB_OK)
        return CLI_EXIT_OK;
    /* A config error already reads `file:line: message`. */
    if (st == CERB_ECONFIG)
        cerb__cli_error("%s", cerb_last_error());
    else
        cerb__cli_error("%s: %s", cerb__cli_config_name(cli), cerb_last_error());
    return cerb__cli_exit_code(st);
}

/* ---- configuration lookup ---- */

static void find_config(struct cerb__cli *cli, const char *opt_path)
{
    const char *env = getenv("CERBERUS_CONFIG");

    if (opt_path) {
        cli->config_path = opt_path;
        cli->origin = CLI_CONFIG_OPTION;
    } else if (env && *env) {
        cli->config_path = env;
        cli->origin = CLI_CONFIG_ENV;
    } else if (access(CWD_CONFIG, F_OK) == 0) {
        cli->config_path = CWD_CONFIG;
        cli->origin = CLI_CONFIG_CWD;
    } else if (access(ETC_CONFIG, F_OK) == 0) {
        cli->config_path = ETC_CONFIG;
        cli->origin = CLI_CONFIG_ETC;
    } else {
        cli->config_path = NULL;
        cli->origin = CLI_CONFIG_NONE;
    }
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

static int help(int argc, char **argv)
{
    const struct command *c;

    if (argc < 2) {
        fputs(main_usage, stdout);
        return CLI_EXIT_OK;
    }
    /* `help` has no page of its own: the summary is what it prints. */
    if (strcmp(argv[1], "help") == 0) {
        fputs(main_usage, stdout);
        return CLI_EXIT_OK;
    }
    c = find_command(argv[1]);
    if (!c)
        return cerb__cli_usage_error(NULL, "unknown command '%s'", argv[1]);
    fputs(c->usage, stdout);
    return CLI_EXIT_OK;
}

int cerb__cli_parse_global(int argc, char **argv, struct cerb__cli_args *out)
{
    int i;

    out->opt_path = NULL;
    out->verbose = 0;
    out->cmd = argc;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0) {
            if (++i >= argc)
                return cerb__cli_usage_error(NULL, "%s needs a FILE", a);
            out->opt_path = argv[i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            out->opt_path = a + 9;
        } else if (strncmp(a, "-c", 2) == 0) {
            out->opt_path = a + 2;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            out->verbose++;
        } else if (strcmp(a, "-vv") == 0) {
            out->verbose += 2;
        } else if (cerb__cli_is_help(a)) {
            fputs(main_usage, stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            printf("cerberus %d.%d.%d\n", CERB_VERSION_MAJOR, CERB_VERSION_MINOR,
                   CERB_VERSION_PATCH);
            return CLI_EXIT_OK;
        } else if (a[0] == '-') {
            return cerb__cli_usage_error(NULL, "unknown option '%s'", a);
        } else {
            break;
        }
    }
    if (i >= argc) {
        fputs(main_usage, stderr);
        return CLI_EXIT_USAGE;
    }
    if (out->opt_path && !*out->opt_path)
        return cerb__cli_usage_error(NULL, "-c needs a FILE");
    out->cmd = i;
    return -1;
}

int cerb__cli_parse_command(int argc, char **argv)
{
    const struct command *c;

    if (strcmp(argv[0], "help") == 0)
        return help(argc, argv);
    c = find_command(argv[0]);
    if (!c)
        return cerb__cli_usage_error(NULL, "unknown command '%s'", argv[0]);
    return c->parse(argc, argv);
}

int cerb__cli_main(int argc, char **argv)
{
    struct cerb__cli cli = {NULL, CLI_CONFIG_NONE, 0};
    struct cerb__cli_args a;
    const struct command *c;
    int rc, i;

    rc = cerb__cli_parse_global(argc, argv, &a);
    if (rc >= 0)
        return rc;
    i = a.cmd;
    cli.verbose = a.verbose;
    if (strcmp(argv[i], "help") == 0)
        return help(argc - i, argv + i);
    c = find_command(argv[i]);
    if (!c)
        return cerb__cli_usage_error(NULL, "unknown command '%s'", argv[i]);
    find_config(&cli, a.opt_path);
    return c->fn(&cli, argc - i, argv + i);
}
