/*
 * cmd_check.c — `cerberus [-c FILE] check [FILE...]`: validate configuration
 * files with the library's own parser (config/config.h), the very code a
 * client runs at open and at reload, so "ok" here means a client accepts the
 * file. Each file gives `FILE: ok` on stdout or its first error as
 * `file:line: message` on stderr (the parser stops at the first error, in
 * file order). Without FILE arguments the file found by the usual lookup is
 * checked; when there is none, the built-in defaults are, which always pass.
 * Exit status 78 (EX_CONFIG) when any file fails.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config.h"

const char cerb__cli_check_usage[] =
    "Usage: cerberus [-c FILE] check [FILE...]\n"
    "\n"
    "Validate configuration files with the parser every client uses: key\n"
    "names, types, ranges, the engine list and cross-key rules. Prints\n"
    "`FILE: ok`, or the first error as `file:line: message`. Without FILE,\n"
    "checks the file -c or the lookup finds ($CERBERUS_CONFIG, ./cerberus.cfg,\n"
    "/etc/cerberus/cerberus.cfg).\n"
    "\n"
    "Options:\n"
    "  -v   (global) also print a summary of each valid file\n"
    "\n"
    "Exit status: 0 all valid, 78 an error in some file, 64 usage.\n";

static void summary(const struct cerb_config *cfg)
{
    printf("  engines:");
    for (size_t i = 0; i < cfg->n_engines; i++)
        printf("%s%s", i ? ", " : " ", cfg->engines[i]);
    printf("\n  active: %s\n  epoch: %" PRId64 "\n  lock.lease_ms: %" PRId64 "\n",
           cfg->active, cfg->epoch, cfg->lock.lease_ms);
}

/* Checks one file (NULL = the defaults); returns true when valid. */
static bool check_one(const char *path, int verbose)
{
    struct cerb_config *cfg = NULL;
    cerb_status st = path ? cerb__config_from_file(path, &cfg)
                          : cerb__config_defaults(&cfg);

    if (st != CERB_OK) {
        /* Already `file:line: message` (or `file: cannot read: ...`). */
        fprintf(stderr, "%s\n", cerb_last_error());
        return false;
    }
    printf("%s: ok\n", path ? path : "(defaults)");
    if (verbose)
        summary(cfg);
    cerb__config_free(cfg);
    return true;
}

/* `check [--] [FILE...]`: -1 to go on with *first the index of the first
 * FILE (argc: none), or the exit code (printed). */
static int parse_args(int argc, char **argv, int *first)
{
    *first = argc;
    for (int i = 1; i < argc && *first == argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            *first = i + 1;
        } else if (cerb__cli_is_help(a)) {
            fputs(cerb__cli_check_usage, stdout);
            return CLI_EXIT_OK;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cerb__cli_usage_error("check", "unknown option '%s'", a);
        } else {
            *first = i;
        }
    }
    return -1;
}

int cerb__cli_check_parse(int argc, char **argv)
{
    int first;
    return parse_args(argc, argv, &first);
}

int cerb__cli_check(const struct cerb__cli *cli, int argc, char **argv)
{
    int first; /* index of the first FILE */
    bool ok = true;
    int rc = parse_args(argc, argv, &first);

    if (rc >= 0)
        return rc;
    if (first >= argc)
        return check_one(cli->config_path, cli->verbose) ? CLI_EXIT_OK
                                                         : CLI_EXIT_CONFIG;
    /* Every file is checked, so one run reports all the broken ones. */
    for (int i = first; i < argc; i++)
        ok = check_one(argv[i], cli->verbose) && ok;
    return ok ? CLI_EXIT_OK : CLI_EXIT_CONFIG;
}
