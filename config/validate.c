/*
 * validate.c — the rules a configuration must satisfy beyond its syntax.
 *
 * Two kinds of rule live here. Value checks look at one string at a time
 * (an engine name is registered in this build, zk.root is an absolute path
 * without a trailing '/', an etcd endpoint is an http:// or https:// URL);
 * the schema rows point at them, and the parser runs them as it reads each
 * value so the error names the exact line. cerb__config_validate() then
 * checks a whole struct: it re-runs every row's range and value check (so
 * it is complete on its own, for a struct from any source) and the rules
 * that tie keys together, which only make sense once everything is read.
 * For those it reports the line of the key that was set in the file.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "error.h"
#include "schema.h"

bool cerb__cfg_check_engine(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len)
{
    char names[256];

    (void)k;
    cerb__engines_builtin();
    /* The length tests first: a registered name always fits the buffer,
     * and an empty or over-long one must not reach the registry, where an
     * empty name could be read as "the default engine". */
    if (s[0] != '\0' && strlen(s) < CERB_ENGINE_NAME_MAX &&
        cerb__engine_find(s))
        return true;
    cerb__engine_names(names, sizeof names);
    snprintf(why, len, "unknown engine \"%s\" (available: %s)", s, names);
    return false;
}

bool cerb__cfg_check_active(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len)
{
    if (strcmp(s, "auto") == 0)
        return true;
    return cerb__cfg_check_engine(k, s, why, len);
}

bool cerb__cfg_check_zk_root(const struct cerb__cfg_key *k, const char *s,
                             char *why, size_t len)
{
    size_t n = strlen(s);
    /* Lock nodes are created as <root>/<name>/…, so the root must be a
     * valid ZooKeeper path that a '/' can follow: absolute, no empty
     * component, no trailing slash (which also rules out "/" itself). */
    if (n > 1 && s[0] == '/' && s[n - 1] != '/' && !strstr(s, "//"))
        return true;
    snprintf(why, len,
             "%s: \"%s\" must be an absolute path without a trailing '/'",
             k->path, s);
    return false;
}

static bool has_prefix_and_more(const char *s, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(s, prefix, n) == 0 && s[n] != '\0';
}

bool cerb__cfg_check_endpoint(const struct cerb__cfg_key *k, const char *s,
                              char *why, size_t len)
{
    if (has_prefix_and_more(s, "http://") ||
        has_prefix_and_more(s, "https://"))
        return true;
    snprintf(why, len, "%s: \"%s\" must start with http:// or https://",
             k->path, s);
    return false;
}

/* "host:port" (an IPv6 host in brackets: "[::1]:26379"), port 1..65535. */
bool cerb__cfg_check_hostport(const struct cerb__cfg_key *k, const char *s,
                              char *why, size_t len)
{
    const char *colon = strrchr(s, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (colon && colon != s && end && end != colon + 1 && *end == '\0' && port >= 1 &&
        port <= 65535)
        return true;
    snprintf(why, len, "%s: \"%s\" must be host:port (port 1..65535)", k->path, s);
    return false;
}

bool cerb__cfg_check_listen(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len)
{
    /* The shape only: whether a TCP address may be listened on (loopback,
     * serve.allow_remote) is the serve command's to say, at start and in
     * `cerberus serve --check`. Port 0 lets the kernel choose. */
    const char *colon = strrchr(s, ':');
    char *end = NULL;
    long port;

    if (strncmp(s, "unix:", 5) == 0) {
        if (s[5] == '/' && strlen(s + 5) < 108)
            return true;
        snprintf(why, len, "%s: \"%s\": unix: needs an absolute path shorter than 108 bytes",
                 k->path, s);
        return false;
    }
    port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon && colon != s && end && end != colon + 1 && *end == '\0' && port >= 0 &&
        port <= 65535)
        return true;
    snprintf(why, len, "%s: \"%s\" must be unix:PATH or ADDRESS:PORT", k->path, s);
    return false;
}

bool cerb__cfg_check_socket_mode(const struct cerb__cfg_key *k, const char *s,
                                 char *why, size_t len)
{
    /* Octal as chmod(1) writes it; the owner (the server's user) keeps
     * read and write, so that a mode cannot lock the service out of its
     * own socket. */
    char *end = NULL;
    long m = strtol(s, &end, 8);

    if (s[0] >= '0' && s[0] <= '7' && end && *end == '\0' && strlen(s) <= 4 && m >= 0 &&
        m <= 0777 && (m & 0600) == 0600)
        return true;
    snprintf(why, len, "%s: \"%s\" must be an octal mode up to 0777 with owner "
             "read and write (like \"0660\")", k->path, s);
    return false;
}

bool cerb__cfg_check_nonempty(const struct cerb__cfg_key *k, const char *s,
                              char *why, size_t len)
{
    if (s[0] != '\0')
        return true;
    snprintf(why, len, "%s: must not be empty", k->path);
    return false;
}

bool cerb__cfg_check_sql_ident(const struct cerb__cfg_key *k, const char *s,
                               char *why, size_t len)
{
    /* The engines splice this one name into their SQL (quoted), since an
     * identifier cannot be a bound parameter: so it is held to a pattern
     * that no quoting trick can escape, and to the servers' 63/64-byte
     * identifier limits. */
    size_t n = strlen(s);
    bool ok = n >= 1 && n <= 63 && !(s[0] >= '0' && s[0] <= '9');
    for (size_t i = 0; ok && i < n; i++) {
        char c = s[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_';
    }
    if (ok)
        return true;
    snprintf(why, len,
             "%s: \"%s\" must be 1 to 63 letters, digits or '_', not starting with a digit",
             k->path, s);
    return false;
}

bool cerb__cfg_check_pg_key(const struct cerb__cfg_key *k, const char *s,
                            char *why, size_t len)
{
    if (strcmp(s, "dl") == 0 || strcmp(s, "int") == 0 || strcmp(s, "tooz") == 0 ||
        (strncmp(s, "pals:", 5) == 0 && s[5] != '\0'))
        return true;
    snprintf(why, len, "%s: \"%s\" must be \"dl\", \"int\", \"tooz\" or \"pals:<app>\"",
             k->path, s);
    return false;
}

bool cerb__cfg_check_mysql_key(const struct cerb__cfg_key *k, const char *s,
                               char *why, size_t len)
{
    if (strcmp(s, "dl") == 0 || strcmp(s, "raw") == 0)
        return true;
    snprintf(why, len, "%s: \"%s\" must be \"dl\" or \"raw\"", k->path, s);
    return false;
}

bool cerb__cfg_check_mc_prefix(const struct cerb__cfg_key *k, const char *s,
                               char *why, size_t len)
{
    size_t n = strlen(s);
    if (n > 150) {
        snprintf(why, len, "%s: longer than 150 bytes", k->path);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch <= 0x20 || ch == 0x7f) {
            snprintf(why, len, "%s: \"%s\" holds a space or a control character, which a "
                     "memcached key cannot", k->path, s);
            return false;
        }
    }
    return true;
}

/* ---- whole-struct validation ---- */

struct vctx {
    const char *file;
    const unsigned *lines;
};

/* Line of the first of the keys that was set in the source, else 0. */
static unsigned line_of(const struct vctx *v, const char *a, const char *b)
{
    const char *paths[2] = {a, b};
    if (!v->lines)
        return 0;
    for (int i = 0; i < 2; i++) {
        int idx = paths[i] ? cerb__cfg_key_index(paths[i]) : -1;
        if (idx >= 0 && v->lines[idx])
            return v->lines[idx];
    }
    return 0;
}

static cerb_status check_row(const struct vctx *v,
                             const struct cerb__cfg_key *k,
                             const struct cerb_config *cfg)
{
    char why[CERB_ERROR_MAX];
    unsigned line = line_of(v, k->path, NULL);
    const char *s;
    size_t n;

    switch (k->type) {
    case CERB__CFG_INT:
    case CERB__CFG_INT64:
    case CERB__CFG_BOOL:
    case CERB__CFG_ENUM:
        if (!cerb__cfg_check_int(k, cerb__cfg_get_int(k, cfg), why,
                                 sizeof why))
            return cerb__cfg_error_at(v->file, line, why);
        return CERB_OK;
    case CERB__CFG_STRING:
        s = cerb__cfg_get_str(k, cfg);
        if (!s) {
            snprintf(why, sizeof why, "%s: missing", k->path);
            return cerb__cfg_error_at(v->file, line, why);
        }
        if (!cerb__cfg_check_str(k, s, why, sizeof why))
            return cerb__cfg_error_at(v->file, line, why);
        return CERB_OK;
    case CERB__CFG_STRLIST:
        n = cerb__cfg_list_len(k, cfg);
        if (n < (size_t)k->min || n > (size_t)k->max) {
            snprintf(why, sizeof why,
                     "%s: expected %" PRId64 "..%" PRId64 " entries, got %zu",
                     k->path, k->min, k->max, n);
            return cerb__cfg_error_at(v->file, line, why);
        }
        for (size_t i = 0; i < n; i++) {
            s = cerb__cfg_list_get(k, cfg, i);
            if (!s || !cerb__cfg_check_str(k, s, why, sizeof why)) {
                if (!s)
                    snprintf(why, sizeof why, "%s: missing entry", k->path);
                return cerb__cfg_error_at(v->file, line, why);
            }
        }
        return CERB_OK;
    }
    return cerb__cfg_error_at(v->file, line, "bad schema row");
}

static cerb_status check_engines(const struct vctx *v,
                                 const struct cerb_config *cfg)
{
    char why[CERB_ERROR_MAX];

    /* Each engine is opened once and selected by name: a repeat would be
     * two instances answering to one name. */
    for (size_t i = 0; i < cfg->n_engines; i++)
        for (size_t j = i + 1; j < cfg->n_engines; j++)
            if (strcmp(cfg->engines[i], cfg->engines[j]) == 0) {
                snprintf(why, sizeof why, "engine \"%s\" is listed twice",
                         cfg->engines[i]);
                return cerb__cfg_error_at(v->file,
                                          line_of(v, "engines", NULL), why);
            }
    if (strcmp(cfg->active, "auto") != 0 &&
        cerb__config_engine_index(cfg, cfg->active) < 0) {
        snprintf(why, sizeof why, "active engine \"%s\" is not listed in engines",
                 cfg->active);
        return cerb__cfg_error_at(v->file, line_of(v, "active", "engines"),
                                  why);
    }
    return CERB_OK;
}

static cerb_status check_timing(const struct vctx *v,
                                const struct cerb_config *cfg)
{
    char why[CERB_ERROR_MAX];

    /* Full-jitter backoff draws from [0, min(cap, base·2^n)]: a cap below
     * the base would shrink every delay below the configured base. */
    if (cfg->retry.backoff_max_ms < cfg->retry.backoff_ms) {
        snprintf(why, sizeof why,
                 "retry.backoff_max_ms (%" PRId64
                 ") must be >= retry.backoff_ms (%" PRId64 ")",
                 cfg->retry.backoff_max_ms, cfg->retry.backoff_ms);
        return cerb__cfg_error_at(
            v->file, line_of(v, "retry.backoff_max_ms", "retry.backoff_ms"),
            why);
    }
    /* A probe that may outlast the interval would overlap the next one. */
    if (cfg->failover.probe_timeout_ms > cfg->failover.probe_interval_ms) {
        snprintf(why, sizeof why,
                 "failover.probe_timeout_ms (%" PRId64
                 ") must be <= failover.probe_interval_ms (%" PRId64 ")",
                 cfg->failover.probe_timeout_ms,
                 cfg->failover.probe_interval_ms);
        return cerb__cfg_error_at(v->file,
                                  line_of(v, "failover.probe_timeout_ms",
                                          "failover.probe_interval_ms"),
                                  why);
    }
    return CERB_OK;
}

static cerb_status check_guard(const struct vctx *v,
                               const struct cerb_config *cfg)
{
    /* -1 keeps a success forever; 0 would keep it for no time at all, so
     * every duplicate would run again: surely not what was meant. */
    if (cfg->guard.keep_ms == 0)
        return cerb__cfg_error_at(v->file, line_of(v, "guard.keep_ms", NULL),
                                  "guard.keep_ms: 0 keeps nothing; use -1 (forever) "
                                  "or a duration in ms");
    return CERB_OK;
}

static cerb_status check_memcached(const struct vctx *v, const struct cerb_config *cfg)
{
    /* memcached does not replicate, and client-side hashing over several
     * servers moves a name to another server when one drops out: two
     * holders. One server, until a quorum mode exists. */
    if (cfg->memcached.n_servers != 1)
        return cerb__cfg_error_at(v->file, line_of(v, "memcached.servers", NULL),
                                  "memcached.servers: exactly one server (several would be "
                                  "hashed over, and a name would move when one drops out)");
    return CERB_OK;
}

cerb_status cerb__config_validate(const struct cerb_config *cfg,
                                  const char *file, const unsigned *lines)
{
    struct vctx v = {file ? file : "config", lines};
    cerb_status st;

    if (!cfg)
        return cerb__error_set(CERB_EINVAL, "no configuration");
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        st = check_row(&v, &cerb__cfg_keys[i], cfg);
        if (st != CERB_OK)
            return st;
    }
    st = check_engines(&v, cfg);
    if (st == CERB_OK)
        st = check_timing(&v, cfg);
    if (st == CERB_OK)
        st = check_guard(&v, cfg);
    if (st == CERB_OK)
        st = check_memcached(&v, cfg);
    return st;
}
