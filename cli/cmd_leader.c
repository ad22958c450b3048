/*
 * cmd_leader.c — `cerberus leader [-q] [--layout latch|selector] NAME`:
 * who leads election NAME (DESIGN.md §16), asked of the engine in use (and
 * of an engine switched from whose terms may still stand).
 *
 * One line: `ENGINE: leader VALUE (term N, M ms left, OWNER)`, or
 * `ENGINE: no leader`. With -q only the value (nothing for none). A leader
 * whose value cannot be read (another library's lock on the name) says so.
 * Exit 0 with a leader, 75 with none, 69 when it cannot be known.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

const char cerb__cli_leader_usage[] =
    "Usage: cerberus [-c FILE] leader [-q] [--layout latch|selector] NAME\n"
    "\n"
    "Print who leads election NAME: its value, the term's number on the\n"
    "engine, the time left on its lease, and the engine's name for it.\n"
    "\n"
    "Options:\n"
    "  -q, --quiet           print only the value (nothing when none leads)\n"
    "  --layout latch|selector\n"
    "                        ZooKeeper: the candidates' layout (default:\n"
    "                        latch)\n"
    "\n"
    "Exit status: 0 somebody leads; 75 nobody leads; 69 it cannot be known\n"
    "(an engine that does not answer or has no leader election); 78\n"
    "configuration error; 64 usage.\n";

struct leader_opts {
    const char *name;
    bool quiet;
    int layout;
};

static int parse_args(int argc, char **argv, struct leader_opts *o, bool *help)
{
    const char *v;
    int i, m;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cerb__cli_is_help(a)) {
            *help = true;
            return 0;
        } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            o->quiet = true;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--layout", NULL, &v)) != 0) {
            if (m > 0 && strcmp(v, "latch") == 0)
                o->layout = CERB_ELECTION_LAYOUT_LATCH;
            else if (m > 0 && strcmp(v, "selector") == 0)
                o->layout = CERB_ELECTION_LAYOUT_SELECTOR;
            else
                return cerb__cli_usage_error("leader", "--layout takes latch or selector");
        } else if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cerb__cli_usage_error("leader", "unknown option '%s'", a);
        } else {
            break;
        }
    }
    if (i >= argc)
        return cerb__cli_usage_error("leader", "NAME is missing");
    if (i + 1 < argc)
        return cerb__cli_usage_error("leader", "one NAME only");
    o->name = argv[i];
    if (!cerb__cli_name_ok(o->name))
        return cerb__cli_usage_error("leader", "bad election name (1-255 bytes, no control "
                                               "characters)");
    return 0;
}

int cerb__cli_leader_parse(int argc, char **argv)
{
    struct leader_opts o;
    bool help = false;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_leader_usage, stdout);
        return CLI_EXIT_OK;
    }
    return rc ? rc : -1;
}

int cerb__cli_leader(const struct cerb__cli *cli, int argc, char **argv)
{
    struct leader_opts o;
    cerb_client *client = NULL;
    bool help = false;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_leader_usage, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    rc = cerb__cli_open_client(cli, &client);
    if (rc)
        return rc;
    cerb_leader_info li;
    cerb_status st = cerb_election_leader(client, o.name, o.layout, &li);
    if (st != CERB_OK) {
        cerb__cli_error("leader: %s: %s", o.name, cerb_last_error());
        rc = cerb__cli_exit_code(st);
    } else if (!li.has_leader) {
        if (!o.quiet)
            printf("%s: no leader\n", li.engine);
        rc = CLI_EXIT_NOT_OBTAINED;
    } else {
        if (o.quiet) {
            if (li.value_known)
                cerb__cli_print_bytes(li.value, li.value_len);
        } else {
            printf("%s: leader ", li.engine);
            if (li.value_known) {
                putchar('"');
                cerb__cli_print_bytes(li.value, li.value_len);
                putchar('"');
            } else {
                fputs("(value unknown: not a Cerberus candidate, or not yet proclaimed)", stdout);
            }
            printf(" (term %" PRIu64, li.term);
            if (li.ttl_ms >= 0)
                printf(", %" PRId64 " ms left", li.ttl_ms);
            fputs(", ", stdout);
            cerb__cli_print_bytes(li.owner, strlen(li.owner));
            putchar(')');
        }
        if (!o.quiet || li.value_known)
            putchar('\n');
        rc = CLI_EXIT_OK;
    }
    cerb_leader_info_clear(&li);
    fflush(stdout);
    cerb_client_close(client);
    return rc;
}
