/*
 * store_init.c — cerb_store_init / cerb_store_reports_free: prepare the
 * configured stores for their first use (DESIGN.md §5, `cerberus init`).
 *
 * The configuration is parsed as a client would, and each configured
 * engine in order gets its store_init table's init (store_init.h), or the
 * answer "nothing to do" when it registered none. No client is opened: a
 * client's open is exactly what would spoil a new redis server (it makes
 * the marker with a quarantine). Every engine is tried even after one
 * fails or refuses, since they are independent stores and the operator
 * wants to hear about all of them; the status is the first one that is not
 * ready, so a script can stop on it.
 */
#include "internal_posix.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "engine.h"
#include "error.h"
#include "internal.h"
#include "store_init.h"

#define STORE_LINE_MAX 1024

void cerb_store_reports_free(cerb_store_report *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        cerb__free((char *)v[i].text);
    cerb__free(v);
}

/* One engine: its table's answer, or "nothing to do". */
static void init_one(const struct cerb_config *cfg, const char *name, unsigned flags,
                     cerb_store_report *r, char *line, size_t len)
{
    const struct cerb_store_ops *so = cerb__store_ops_find(name);
    const struct cerb_engine_ops *eo = cerb__engine_find(name);
    char body[STORE_LINE_MAX];

    r->engine = so ? so->name : eo ? eo->name : "?";
    if (!so || so->version < CERB_STORE_OPS_V1 || !so->init) {
        r->result = CERB_STORE_NOTHING;
        r->status = CERB_OK;
        snprintf(line, len, "%s: nothing to do (what it needs is made at the first grant, "
                 "without a wait)", r->engine);
        return;
    }
    body[0] = '\0';
    r->result = CERB_STORE_FAILED;
    r->status = so->init(cfg, flags, &r->result, body, sizeof body);
    if (r->status != CERB_OK && r->result != CERB_STORE_REFUSED)
        r->result = CERB_STORE_FAILED;
    if (r->result == CERB_STORE_REFUSED)
        r->status = CERB_BUSY;
    if (!body[0])
        snprintf(body, sizeof body, "%s", r->status == CERB_OK ? "done" : cerb_last_error());
    snprintf(line, len, "%s %s", r->engine, body);
}

cerb_status cerb_store_init(const char *config_path, unsigned flags, cerb_store_report **out,
                            size_t *n)
{
    struct cerb_config *cfg = NULL;
    cerb_status st;

    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!out || !n)
        return cerb__error_set(CERB_EINVAL, "cerb_store_init: NULL out or n");
    if (flags & ~CERB_STORE_INIT_FORCE)
        return cerb__error_set(CERB_EINVAL, "cerb_store_init: unknown flags 0x%x", flags);
    cerb__engines_builtin();
    st = config_path ? cerb__config_from_file(config_path, &cfg) : cerb__config_defaults(&cfg);
    if (st != CERB_OK)
        return st;
    cerb_store_report *v = cerb__calloc(cfg->n_engines, sizeof *v);
    if (!v) {
        cerb__config_free(cfg);
        return cerb__error_set(CERB_ENOMEM, "out of memory");
    }
    cerb_status first = CERB_OK;
    char first_text[STORE_LINE_MAX] = "";
    for (size_t i = 0; i < cfg->n_engines; i++) {
        char line[STORE_LINE_MAX];
        init_one(cfg, cfg->engines[i], flags, &v[i], line, sizeof line);
        v[i].text = cerb__strdup(line);
        if (!v[i].text) {
            cerb_store_reports_free(v, i);
            cerb__config_free(cfg);
            return cerb__error_set(CERB_ENOMEM, "out of memory");
        }
        if (first == CERB_OK && v[i].status != CERB_OK) {
            first = v[i].status;
            snprintf(first_text, sizeof first_text, "%s", line);
        }
    }
    *out = v;
    *n = cfg->n_engines;
    cerb__config_free(cfg);
    if (first != CERB_OK)
        return cerb__error_set(first, "%s", first_text);
    return CERB_OK;
}
