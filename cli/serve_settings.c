/*
 * serve_settings.c — the settings `cerberus serve` runs with: the serve.*
 * keys of the configuration file (parsed by the library's own parser, so
 * their errors read `file:line: message`), each overridden by its flag
 * (--listen replaces the whole serve.listen list), then checked as far as
 * can be without making a socket. `serve --check` runs exactly this and
 * stops; the server runs it and starts.
 *
 * Every problem is printed, not only the first, so that one --check lists
 * them all. A problem found in the flags alone is a usage error (64), as
 * before the file could say the same things; anything that involves the
 * file (or the system: an unknown group, the token file) is a
 * configuration error (78).
 *
 * The token file: its first line is the token. It is refused when every
 * user may read it or write it (mode o+r, o+w): a token anyone on the host
 * can read protects nothing, and a refusal at start is noticed where a
 * warning is not. Owner and group modes are the operator's business.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "serve_settings.h"

#define UNIX_PREFIX "unix:"

cerb_status cerb__cli_serve_read_token(const char *path, char **out, char *err,
                                       size_t errlen)
{
    struct stat st;

    *out = NULL;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
        return CERB_ECONFIG;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "token file %s: not a regular file", path);
        return CERB_ECONFIG;
    }
    if (st.st_mode & (S_IROTH | S_IWOTH)) {
        snprintf(err, errlen,
                 "token file %s: every user may %s it (mode %04o): "
                 "chmod o-rwx %s",
                 path, (st.st_mode & S_IROTH) ? "read" : "write",
                 (unsigned)(st.st_mode & 07777), path);
        return CERB_ECONFIG;
    }
    if (cerb__config_read_secret("token file", path, out) != CERB_OK) {
        snprintf(err, errlen, "%s", cerb_last_error());
        return CERB_ECONFIG;
    }
    if (!*out || !(*out)[0]) {
        snprintf(err, errlen, "token file %s: the first line (the token) is empty", path);
        cerb__config_free_secret(*out);
        *out = NULL;
        return CERB_ECONFIG;
    }
    return CERB_OK;
}

/* An octal mode up to 0777 with owner read and write, as the key's check. */
static bool parse_mode(const char *s, unsigned *mode)
{
    char *end = NULL;
    long m;

    if (s[0] < '0' || s[0] > '7' || strlen(s) > 4)
        return false;
    m = strtol(s, &end, 8);
    if (*end || m < 0 || m > 0777 || (m & 0600) != 0600)
        return false;
    *mode = (unsigned)m;
    return true;
}

/* The gid of group @name (a name, or a number), or -1. */
static long group_id(const char *name)
{
    struct group gr, *res = NULL;
    char buf[4096];
    char *end;
    long n;

    if (getgrnam_r(name, &gr, buf, sizeof buf, &res) == 0 && res)
        return (long)res->gr_gid;
    n = strtol(name, &end, 10);
    if (name[0] >= '0' && name[0] <= '9' && !*end && n >= 0)
        return n;
    return -1;
}

int cerb__cli_serve_settings(const struct cerb__cli *cli, const struct cerb__serve_flags *f,
                             struct cerb__serve_settings *out)
{
    static const struct cerb__serve_opts defaults = CERB__SERVE_OPTS_INIT;
    const struct cerb_serve_config *sc;
    int rc = CLI_EXIT_OK;
    cerb_status st;

    memset(out, 0, sizeof *out);
    out->opts = defaults;
    st = cli->config_path ? cerb__config_from_file(cli->config_path, &out->cfg)
                          : cerb__config_defaults(&out->cfg);
    if (st != CERB_OK) {
        cerb__cli_error("%s", cerb_last_error());
        return CLI_EXIT_CONFIG;
    }
    sc = &out->cfg->serve;
    out->opts.allow_remote = f->allow_remote || sc->allow_remote;
    out->opts.max_connections = sc->max_connections;
    out->opts.max_body = sc->max_body;
    out->opts.idle_timeout_s = sc->idle_timeout_s;
    out->opts.rate_limit = sc->rate_limit;
    out->opts.rate_burst = sc->rate_burst;
    out->opts.drain_ms = sc->drain_ms;
    out->opts.keepalive_ms = sc->keepalive_ms;

    out->listen_from_flags = f->n > 0;
    if (f->n > 0) {
        memcpy(out->listen, f->listen, f->n * sizeof f->listen[0]);
        out->n = f->n;
    } else {
        for (size_t i = 0; i < sc->n_listen && i < CERB_SERVE_MAX_LISTEN; i++)
            out->listen[out->n++] = sc->listen[i];
    }
    for (size_t i = 0; i < out->n; i++) {
        const char *spec = out->listen[i];
        struct sockaddr_storage sa;
        socklen_t salen;
        char err[256];
        if (strncmp(spec, UNIX_PREFIX, strlen(UNIX_PREFIX)) == 0) {
            if (!spec[strlen(UNIX_PREFIX)]) {
                cerb__cli_error("serve: listen unix: needs a PATH");
                rc = out->listen_from_flags ? CLI_EXIT_USAGE : CLI_EXIT_CONFIG;
            }
            continue;
        }
        out->tcp = true;
        if (cerb__serve_tcp_addr(spec, out->opts.allow_remote, &sa, &salen, err,
                                 sizeof err) != CERB_OK) {
            cerb__cli_error("serve: listen %s", err);
            if (rc == CLI_EXIT_OK)
                rc = out->listen_from_flags && !sc->allow_remote ? CLI_EXIT_USAGE
                                                                 : CLI_EXIT_CONFIG;
        }
    }

    out->dapr_store = f->dapr_store;
    out->dapr_app_id = f->dapr_app_id;
    out->token_file = f->token_file ? f->token_file
                      : sc->token_file[0] ? sc->token_file
                                          : NULL;
    if (out->tcp && !out->token_file) {
        cerb__cli_error("serve: TCP (listen ADDR:PORT) needs a token file: --token-file FILE "
                        "or serve.token_file");
        if (rc == CLI_EXIT_OK)
            rc = out->listen_from_flags ? CLI_EXIT_USAGE : CLI_EXIT_CONFIG;
    }

    out->socket_group = f->socket_group ? f->socket_group
                        : sc->socket_group[0] ? sc->socket_group
                                              : NULL;
    if (out->socket_group) {
        out->opts.socket_gid = group_id(out->socket_group);
        if (out->opts.socket_gid < 0) {
            cerb__cli_error("serve: socket group \"%s\": no such group", out->socket_group);
            rc = CLI_EXIT_CONFIG;
        }
    }
    if (!parse_mode(f->socket_mode ? f->socket_mode : sc->socket_mode,
                    &out->opts.socket_mode)) {
        /* The file's value passed the key's own check: this is the flag. */
        cerb__cli_error("serve: --socket-mode \"%s\": an octal mode up to 0777 with owner "
                        "read and write (like 0660)", f->socket_mode);
        if (rc == CLI_EXIT_OK)
            rc = CLI_EXIT_USAGE;
    }
    return rc;
}

void cerb__cli_serve_settings_free(struct cerb__serve_settings *s)
{
    cerb__config_free(s->cfg);
    memset(s, 0, sizeof *s);
}
