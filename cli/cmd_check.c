/*
 * cmd_check.c — `cerberus [-c FILE] check [FILE...]`: validate configuration
 * files with the library's own parser (config/config.h), the very code a
 * client runs at open and at reload, so "ok" here means a client accepts the
 * file. Each file gives `FILE: ok` on stdout or its first error as
 * `file:line: message` on stderr (the parser stops at the first error, in
 * file order). Without FILE arguments the file found by the usual lookup is
 * checked; when there is none, the built-in defaults are, which always pass.
 * Exit status 78 (EX_CONFIG) when any file fails.
 *
 * A valid file that holds a password (redis.password,
 * redis.sentinel_password, zk.password, etcd.password, or credentials in an
 * etcd endpoint URL) and that its group or others may read gets a warning
 * on stderr, as ssh warns about a private key others can read; the exit
 * status stays what the validation says (a warning, not an error: the file
 * works, and some deployments share it on purpose).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
    "A valid file that holds a password and that group or others can read\n"
    "gets a warning on stderr (chmod 600 it); the exit status is unchanged.\n"
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

static bool set(const char *s)
{
    return s && s[0];
}

/* Does endpoint URL @u carry userinfo ("scheme://user:pass@host")? */
static bool has_userinfo(const char *u)
{
    const char *a = strstr(u, "://");
    if (!a)
        return false;
    a += 3;
    size_t al = strcspn(a, "/?#");
    const char *at = memchr(a, '@', al);
    return at != NULL;
}

/* A URI whose user part carries a password ("scheme://user:pw@host"). */
static bool uri_password(const char *u)
{
    const char *a = strstr(u, "://");
    if (!a)
        return false;
    a += 3;
    size_t al = strcspn(a, "/?#");
    const char *at = memchr(a, '@', al);
    return at && memchr(a, ':', (size_t)(at - a)) != NULL;
}

/* The first key of @cfg that holds a password, or NULL. */
static const char *password_key(const struct cerb_config *cfg)
{
    if (set(cfg->redis.password))
        return "redis.password";
    if (set(cfg->redis.sentinel_password))
        return "redis.sentinel_password";
    if (set(cfg->zk.password))
        return "zk.password";
    if (set(cfg->etcd.password))
        return "etcd.password";
    if (set(cfg->pg.conninfo) && (strstr(cfg->pg.conninfo, "password") || uri_password(cfg->pg.conninfo)))
        return "pg.conninfo (a password in the connection string)";
    if (set(cfg->pg.notify_conninfo) &&
        (strstr(cfg->pg.notify_conninfo, "password") || uri_password(cfg->pg.notify_conninfo)))
        return "pg.notify_conninfo (a password in the connection string)";
    for (size_t i = 0; i < cfg->etcd.n_endpoints; i++)
        if (cfg->etcd.endpoints[i] && has_userinfo(cfg->etcd.endpoints[i]))
            return "etcd.endpoints (credentials in the URL)";
    return NULL;
}

/* Warns when @path holds a password and its group or others may read it. */
static void warn_if_exposed(const char *path, const struct cerb_config *cfg)
{
    struct stat sb;
    const char *key = password_key(cfg);
    if (!key || stat(path, &sb) != 0 || !(sb.st_mode & (S_IRGRP | S_IROTH)))
        return;
    fprintf(stderr,
            "cerberus: warning: %s holds a password (%s) and is readable by %s (mode %04o); "
            "make it private: chmod 600 %s\n",
            path, key,
            (sb.st_mode & S_IRGRP) && (sb.st_mode & S_IROTH) ? "group and others"
            : (sb.st_mode & S_IRGRP)                        ? "group"
                                                            : "others",
            (unsigned)(sb.st_mode & 07777), path);
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
    if (path)
        warn_if_exposed(path, cfg);
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
