/*
 * parse.c — libconfig text → struct cerb_config.
 *
 * Algorithm: start from a struct filled with every row's default (schema.c),
 * let libconfig parse the text (its syntax errors carry a line), then walk
 * the setting tree in file order. Each setting's dotted path is looked up in
 * the schema: a key is type-checked, range-checked, value-checked and stored
 * over its default; a known group is descended into; anything else is an
 * unknown key. Walking the tree, rather than looking up the keys we know,
 * is what catches typos such as `redis.prot`, and doing it in file order
 * makes the first error reported the first one in the file. The line of
 * each key is remembered so that cross-field rules (validate.c) can point at
 * it too. Every message reads `FILE:LINE: message`, FILE being the path of
 * the file or "config" for text. On any failure the half-built struct is
 * freed with cerb__config_free(), which works at every stage because each
 * heap field is either NULL or owned.
 */
#include "internal_posix.h"

#include <errno.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc.h"
#include "error.h"
#include "schema.h"

struct pctx {
    const char *file;                    /* name used in messages */
    struct cerb_config *cfg;
    unsigned lines[CERB__CFG_MAX_KEYS];  /* source line per schema row */
};

static cerb_status fail(const struct pctx *c, const config_setting_t *s,
                        const char *fmt, ...) CERB_PRINTF(3, 4);

static cerb_status fail(const struct pctx *c, const config_setting_t *s,
                        const char *fmt, ...)
{
    char why[CERB_ERROR_MAX];
    va_list ap;
    /* A setting read through @include carries its own file name. */
    const char *file = config_setting_source_file(s);

    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return cerb__cfg_error_at(file ? file : c->file,
                              config_setting_source_line(s), why);
}

/* ---- defaults and free ---- */

static cerb_status apply_defaults(struct cerb_config *cfg)
{
    cerb_status st = CERB_OK;

    for (size_t i = 0; i < cerb__cfg_nkeys && st == CERB_OK; i++) {
        const struct cerb__cfg_key *k = &cerb__cfg_keys[i];
        switch (k->type) {
        case CERB__CFG_INT:
        case CERB__CFG_INT64:
        case CERB__CFG_BOOL:
        case CERB__CFG_ENUM:
            cerb__cfg_set_int(k, cfg, k->def);
            break;
        case CERB__CFG_STRING:
            st = cerb__cfg_set_str(k, cfg, k->def_str);
            break;
        case CERB__CFG_STRLIST:
            cerb__cfg_list_clear(k, cfg);
            st = cerb__cfg_list_push(k, cfg, k->def_str);
            break;
        }
    }
    return st;
}

void cerb__config_forget_path(struct cerb_config *cfg)
{
    if (!cfg)
        return;
    cerb__free(cfg->path);
    cfg->path = NULL;
}

void cerb__config_free(struct cerb_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        const struct cerb__cfg_key *k = &cerb__cfg_keys[i];
        if (k->type == CERB__CFG_STRLIST) {
            cerb__cfg_list_clear(k, cfg);
        } else if (k->type == CERB__CFG_STRING && !k->inline_len) {
            char **pp = (char **)(void *)((char *)cfg + k->offset);
            cerb__free(*pp);
            *pp = NULL;
        }
    }
    cerb__free(cfg->path);
    cerb__free(cfg);
}

static cerb_status new_default(struct cerb_config **out)
{
    struct cerb_config *cfg = cerb__calloc(1, sizeof *cfg);
    cerb_status st;

    *out = NULL;
    if (!cfg)
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    st = apply_defaults(cfg);
    if (st != CERB_OK) {
        cerb__config_free(cfg);
        return st;
    }
    *out = cfg;
    return CERB_OK;
}

cerb_status cerb__config_defaults(struct cerb_config **out)
{
    if (!out)
        return cerb__error_set(CERB_EINVAL, "out is NULL");
    return new_default(out);
}

/* ---- one key ---- */

static bool is_int(const config_setting_t *s)
{
    /* libconfig 1.5 types a literal as int unless it has an L suffix. */
    int t = config_setting_type(s);
    return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
}

/* Type, length and value checks of one string (a key or a list item). */
static cerb_status take_string(struct pctx *c, const struct cerb__cfg_key *k,
                               const config_setting_t *s, const char *what,
                               const char **out)
{
    char why[CERB_ERROR_MAX];
    const char *v;

    if (config_setting_type(s) != CONFIG_TYPE_STRING)
        return fail(c, s, "%s: expected %s", k->path, what);
    v = config_setting_get_string(s);
    if (!cerb__cfg_check_str(k, v, why, sizeof why))
        return fail(c, s, "%s", why);
    if (k->inline_len && strlen(v) >= k->inline_len)
        return fail(c, s, "%s: \"%s\" is longer than %zu bytes", k->path, v,
                    k->inline_len - 1);
    *out = v;
    return CERB_OK;
}

static cerb_status parse_list(struct pctx *c, const struct cerb__cfg_key *k,
                              const config_setting_t *s)
{
    int t = config_setting_type(s);
    int n;
    cerb_status st;

    if (t != CONFIG_TYPE_LIST && t != CONFIG_TYPE_ARRAY)
        return fail(c, s, "%s: expected a list of strings", k->path);
    n = config_setting_length(s);
    if (n < k->min || n > k->max)
        return fail(c, s, "%s: expected %lld..%lld entries, got %d", k->path,
                    (long long)k->min, (long long)k->max, n);
    cerb__cfg_list_clear(k, c->cfg);
    for (int i = 0; i < n; i++) {
        const char *v = NULL;
        st = take_string(c, k, config_setting_get_elem(s, (unsigned)i),
                         "a list of strings", &v);
        if (st == CERB_OK)
            st = cerb__cfg_list_push(k, c->cfg, v);
        if (st != CERB_OK)
            return st;
    }
    return CERB_OK;
}

static cerb_status parse_key(struct pctx *c, const struct cerb__cfg_key *k,
                             const config_setting_t *s)
{
    char why[CERB_ERROR_MAX];
    const char *v = NULL;
    int64_t i;
    cerb_status st;

    switch (k->type) {
    case CERB__CFG_INT:
    case CERB__CFG_INT64:
        if (!is_int(s))
            return fail(c, s, "%s: expected an integer", k->path);
        i = (int64_t)config_setting_get_int64(s);
        if (!cerb__cfg_check_int(k, i, why, sizeof why))
            return fail(c, s, "%s", why);
        cerb__cfg_set_int(k, c->cfg, i);
        return CERB_OK;
    case CERB__CFG_BOOL:
        if (config_setting_type(s) != CONFIG_TYPE_BOOL)
            return fail(c, s, "%s: expected true or false", k->path);
        cerb__cfg_set_int(k, c->cfg, config_setting_get_bool(s));
        return CERB_OK;
    case CERB__CFG_STRING:
        st = take_string(c, k, s, "a string", &v);
        return st == CERB_OK ? cerb__cfg_set_str(k, c->cfg, v) : st;
    case CERB__CFG_ENUM:
        st = take_string(c, k, s, "a string", &v);
        if (st != CERB_OK)
            return st;
        for (const struct cerb__cfg_enum *e = k->enums; e->name; e++)
            if (strcmp(e->name, v) == 0)
                cerb__cfg_set_int(k, c->cfg, e->value);
        return CERB_OK;
    case CERB__CFG_STRLIST:
        return parse_list(c, k, s);
    }
    return fail(c, s, "%s: bad schema row", k->path);
}

/* ---- the tree walk ---- */

static cerb_status parse_group(struct pctx *c, const config_setting_t *grp,
                               const char *prefix)
{
    int n = config_setting_length(grp);

    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(grp, (unsigned)i);
        const char *name = config_setting_name(s);
        char path[256];
        int len, idx;
        cerb_status st;

        len = prefix ? snprintf(path, sizeof path, "%s.%s", prefix, name)
                     : snprintf(path, sizeof path, "%s", name);
        /* A cut-off path must not match a real key by accident. */
        idx = len < (int)sizeof path ? cerb__cfg_key_index(path) : -1;
        if (idx >= 0) {
            st = parse_key(c, &cerb__cfg_keys[idx], s);
            c->lines[idx] = config_setting_source_line(s);
        } else if (!prefix && cerb__cfg_is_group(path)) {
            /* Keys nest one level deep: "redis.port", never deeper. */
            st = config_setting_is_group(s)
                     ? parse_group(c, s, path)
                     : fail(c, s, "%s: expected a group { ... }", path);
        } else if (strcmp(path, "redis.pool") == 0) {
            /* Retired: a fixed pool that small held 8 threads to half the
             * server's speed. Said plainly rather than ignored. */
            st = fail(c, s, "redis.pool was replaced by redis.pool_max: connections now open "
                            "on demand up to it (default 64) and close when idle; remove "
                            "redis.pool, or write redis.pool_max");
        } else {
            st = fail(c, s, "unknown key \"%s\"", path);
        }
        if (st != CERB_OK)
            return st;
    }
    return CERB_OK;
}

/*
 * Build from a libconfig tree that was read successfully. `file` names the
 * source in messages; `path` (may be NULL) is stored in the result.
 */
static cerb_status build(config_t *lc, const char *file, const char *path,
                         struct cerb_config **out)
{
    struct pctx c;
    cerb_status st;

    memset(&c, 0, sizeof c);
    c.file = file;
    st = new_default(&c.cfg);
    if (st != CERB_OK)
        return st;
    if (path && !(c.cfg->path = cerb__strdup(path)))
        st = cerb__error_set(CERB_ENOMEM, "out of memory");
    if (st == CERB_OK)
        st = parse_group(&c, config_root_setting(lc), NULL);
    if (st == CERB_OK)
        st = cerb__config_validate(c.cfg, file, c.lines);
    if (st != CERB_OK) {
        cerb__config_free(c.cfg);
        return st;
    }
    *out = c.cfg;
    return CERB_OK;
}

static cerb_status libconfig_error(const config_t *lc, const char *file)
{
    const char *efile = config_error_file(lc);
    const char *text = config_error_text(lc);

    return cerb__cfg_error_at(efile ? efile : file,
                              (unsigned)config_error_line(lc),
                              text ? text : "parse error");
}

cerb_status cerb__config_from_string(const char *text,
                                     struct cerb_config **out)
{
    config_t lc;
    cerb_status st;

    if (!out)
        return cerb__error_set(CERB_EINVAL, "out is NULL");
    *out = NULL;
    if (!text)
        return cerb__error_set(CERB_EINVAL, "config text is NULL");
    config_init(&lc);
    if (config_read_string(&lc, text))
        st = build(&lc, "config", NULL, out);
    else
        st = libconfig_error(&lc, "config");
    config_destroy(&lc);
    return st;
}

static cerb_status open_error(const char *path, int err)
{
    char msg[128];
    if (strerror_r(err, msg, sizeof msg) != 0)
        snprintf(msg, sizeof msg, "error %d", err);
    return cerb__error_set(CERB_ECONFIG, "%s: cannot read: %s", path, msg);
}

cerb_status cerb__config_from_file(const char *path, struct cerb_config **out)
{
    config_t lc;
    struct stat sb;
    FILE *fp;
    int ok, err;
    cerb_status st;

    if (!out)
        return cerb__error_set(CERB_EINVAL, "out is NULL");
    *out = NULL;
    if (!path)
        return cerb__error_set(CERB_EINVAL, "config path is NULL");
    /* Opened here rather than by config_read_file() so that the reason
     * (errno) reaches the message, and a directory, which reads as an
     * empty and thus valid file, is refused. */
    fp = fopen(path, "r");
    if (!fp)
        return open_error(path, errno);
    if (fstat(fileno(fp), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(fp);
        return open_error(path, EISDIR);
    }
    config_init(&lc);
    ok = config_read(&lc, fp);
    err = ferror(fp) ? errno : 0;
    fclose(fp);
    if (err)
        st = open_error(path, err);
    else if (ok)
        st = build(&lc, path, path, out);
    else
        st = libconfig_error(&lc, path);
    config_destroy(&lc);
    return st;
}
