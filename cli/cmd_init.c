/*
 * cmd_init.c — `cerberus [-c FILE] init [--force]`: prepare the configured
 * stores for their first use (cerb_store_init, DESIGN.md §5), so the first
 * lock on a new Redis server is not delayed a lease by the quarantine a
 * client must impose on a server it cannot tell from one that lost its
 * data.
 *
 * One line per configured engine: what was prepared, found already
 * prepared or needs nothing on stdout; a refusal or a failure on stderr.
 * The exit status is that of the first engine that is not ready, in
 * configuration order (the library tries every engine either way): 65 for
 * a store that shows signs of earlier use (the operator must decide:
 * --force), the usual mapping otherwise (69 unreachable, 78 a bad file).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

const char cerb__cli_init_usage[] =
    "Usage: cerberus [-c FILE] init [--force]\n"
    "\n"
    "Prepare the configured stores for their first use, so that the first\n"
    "lock on a new store does not wait. Redis: write the data-loss marker\n"
    "with the server's replication id and no quarantine (on the Sentinel\n"
    "master, or in each of the 16384 slots of a Cluster, on the master that\n"
    "serves it). Without it the first client cannot tell the new server from\n"
    "one restarted without its data, and grants nothing for one lease.\n"
    "ZooKeeper, etcd and local need nothing (\"nothing to do\"). Running it\n"
    "again on a prepared store changes nothing (\"already prepared\").\n"
    "\n"
    "Run it only on a new server. On one that lost its data (restarted\n"
    "without persistence, FLUSHALL, eviction) it would end the quarantine\n"
    "that protects the holders from before the loss, and a name one of them\n"
    "still holds could be granted again. So a store that shows any sign of\n"
    "earlier use is refused and left as it is: a marker with another\n"
    "replication id or none, a quarantine in force, Cerberus keys without a\n"
    "marker, keys evicted or a FLUSHALL since the server started. A restart\n"
    "without data that leaves no such sign cannot be detected.\n"
    "\n"
    "Options:\n"
    "  --force   prepare a store even when it shows signs of earlier use:\n"
    "            you know no holder from before is alive\n"
    "\n"
    "Exit status: 0 every store prepared, already prepared or needing\n"
    "nothing; 65 a store refused (signs of earlier use; nothing written\n"
    "there); 69 a store could not be reached; 78 configuration error;\n"
    "64 usage.\n";

static int parse(int argc, char **argv, bool *force, bool *help)
{
    *force = *help = false;
    for (int i = 1; i < argc; i++) {
        if (cerb__cli_is_help(argv[i]))
            *help = true;
        else if (strcmp(argv[i], "--force") == 0)
            *force = true;
        else if (argv[i][0] == '-')
            return cerb__cli_usage_error("init", "unknown option '%s'", argv[i]);
        else
            return cerb__cli_usage_error("init", "unexpected argument '%s'", argv[i]);
    }
    return 0;
}

int cerb__cli_init_parse(int argc, char **argv)
{
    bool force, help;
    int rc = parse(argc, argv, &force, &help);
    if (rc)
        return rc;
    if (help) {
        fputs(cerb__cli_init_usage, stdout);
        return CLI_EXIT_OK;
    }
    return -1;
}

int cerb__cli_init(const struct cerb__cli *cli, int argc, char **argv)
{
    bool force, help;
    int rc = parse(argc, argv, &force, &help);
    if (rc)
        return rc;
    if (help) {
        fputs(cerb__cli_init_usage, stdout);
        return CLI_EXIT_OK;
    }
    cerb__cli_log_init(cli, CERB_LOG_WARN);
    cerb_store_report *rep = NULL;
    size_t n = 0;
    cerb_status st = cerb_store_init(cli->config_path, force ? CERB_STORE_INIT_FORCE : 0, &rep,
                                     &n);
    if (!rep) {
        /* The file itself: its error already reads `file:line: message`. */
        if (st == CERB_ECONFIG)
            cerb__cli_error("%s", cerb_last_error());
        else
            cerb__cli_error("init: %s: %s", cerb__cli_config_name(cli), cerb_last_error());
        return cerb__cli_exit_code(st);
    }
    rc = CLI_EXIT_OK;
    for (size_t i = 0; i < n; i++) {
        switch (rep[i].result) {
        case CERB_STORE_PREPARED:
        case CERB_STORE_ALREADY:
        case CERB_STORE_NOTHING:
            printf("%s\n", rep[i].text);
            break;
        case CERB_STORE_REFUSED:
            cerb__cli_error("init: %s", rep[i].text);
            if (rc == CLI_EXIT_OK)
                rc = CLI_EXIT_DATAERR;
            break;
        case CERB_STORE_FAILED:
            cerb__cli_error("init: %s", rep[i].text);
            if (rc == CLI_EXIT_OK)
                rc = cerb__cli_exit_code(rep[i].status);
            break;
        }
    }
    fflush(stdout);
    cerb_store_reports_free(rep, n);
    return rc;
}
