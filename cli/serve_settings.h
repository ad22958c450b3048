/*
 * serve_settings.h — the settings of `cerberus serve`, from the serve.*
 * keys of the configuration file and the command line (serve_settings.c),
 * shared by cmd_serve.c (start, SIGHUP) and its --check.
 */
#ifndef CERB_CLI_SERVE_SETTINGS_H
#define CERB_CLI_SERVE_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>

#include "cli.h"
#include "config.h"
#include "serve.h"

/* What the command line said (NULL / 0: not given; the file decides). */
struct cerb__serve_flags {
    const char *listen[CERB_SERVE_MAX_LISTEN]; /* unix:PATH or ADDR:PORT */
    size_t n;
    const char *token_file;
    const char *socket_group;
    const char *socket_mode;
    bool allow_remote;
    bool check; /* --check */
    const char *dapr_store, *dapr_app_id; /* the Dapr façade (NULL: defaults) */
};

/* The settings in force: the flags over the file over the defaults. */
struct cerb__serve_settings {
    struct cerb_config *cfg;                   /* the file's (or defaults) */
    const char *listen[CERB_SERVE_MAX_LISTEN]; /* into the flags or cfg */
    size_t n;
    bool listen_from_flags;
    bool tcp;                 /* one of them is TCP */
    const char *token_file;   /* NULL: none */
    const char *socket_group; /* NULL: none */
    struct cerb__serve_opts opts;
    const char *dapr_store, *dapr_app_id; /* the flags' (NULL: defaults) */
};

/*
 * cerb__cli_serve_settings — read the file of @cli (none: defaults) and
 * combine it with @f into @out, checking everything that can be checked
 * without making a socket: every listen address (shape; loopback unless
 * allow_remote), a TCP address with no token file, the socket group (it
 * must exist), the socket mode. Each problem is printed on stderr
 * ("cerberus: ..."); every one of them is looked for, not only the first.
 * Returns: CLI_EXIT_OK; CLI_EXIT_USAGE when a problem is in the flags
 * alone; CLI_EXIT_CONFIG otherwise. @out is filled either way; free it
 * with cerb__cli_serve_settings_free.
 */
int cerb__cli_serve_settings(const struct cerb__cli *cli, const struct cerb__serve_flags *f,
                             struct cerb__serve_settings *out);
void cerb__cli_serve_settings_free(struct cerb__serve_settings *s);

/*
 * cerb__cli_serve_read_token — the bearer token: the first line of @path,
 * refused when the file cannot be read, when its first line is empty, or
 * when every user may read or write it (mode o+r or o+w: the token would
 * be no secret). Returns CERB_OK with *@out (free it with
 * cerb__config_free_secret), else CERB_ECONFIG with the reason in @err
 * (which never holds the token).
 */
cerb_status cerb__cli_serve_read_token(const char *path, char **out, char *err,
                                       size_t errlen);

#endif /* CERB_CLI_SERVE_SETTINGS_H */
