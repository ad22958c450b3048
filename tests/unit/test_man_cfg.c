/*
 * test_man_cfg.c — man/cerberus.cfg.5 documents exactly the keys the parser
 * accepts, with the parser's types, ranges, defaults and reload rules.
 *
 * The page is hand-written prose, but every key's entry opens with one
 * line in a fixed form that this suite derives from the schema table
 * (config/schema.c, the table parse.c, validate.c and reload.c are driven
 * by), for example
 *
 *   .TP
 *   \fBredis.port\fR (integer, 1 to 65535; default \fB6379\fR; restart to change)
 *
 * (the default being the one the parser gives a configuration built from
 * nothing), followed by at least one line of prose, inside the `.SS`
 * section whose first word is the key's group (`Top` for top-level keys).
 * The suite reads the page and reports, each with the exact fix:
 *  - a key the parser accepts that the page lacks (the line to paste and
 *    the section to paste it into);
 *  - an entry whose line differs from the schema's (default, range, type,
 *    enum values, reloadable or not): the page's line and the right one;
 *  - an entry naming a key the parser does not accept, or one named twice;
 *  - an entry with no prose, or outside its group's section.
 * Every problem is printed before the test fails, so one run lists them all.
 *
 * The page is $CERB_MAN_CFG_PAGE when set (to check another copy), else
 * $CERB_SOURCE_DIR/man/cerberus.cfg.5.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "schema.h"

#define MAX_LINES 4096
#define LINE_MAX_LEN 1024

struct page {
    const char *path;
    char *lines[MAX_LINES];
    size_t n;
};

/* One documented key: where its entry line is. */
struct entry {
    char path[128];
    size_t line; /* index into page.lines */
};

static void page_load(struct page *p)
{
    const char *env = getenv("CERB_MAN_CFG_PAGE");
    const char *src = getenv("CERB_SOURCE_DIR");
    static char path[4096];
    char buf[LINE_MAX_LEN];
    FILE *f;

    if (env && *env)
        snprintf(path, sizeof path, "%s", env);
    else
        snprintf(path, sizeof path, "%s/man/cerberus.cfg.5", src ? src : ".");
    p->path = path;
    p->n = 0;
    f = fopen(path, "r");
    if (!f)
        fail_msg("%s: cannot open the configuration man page", path);
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = '\0';
        if (p->n == MAX_LINES)
            fail_msg("%s: more than %d lines", path, MAX_LINES);
        p->lines[p->n] = strdup(buf);
        assert_non_null(p->lines[p->n]);
        p->n++;
    }
    fclose(f);
}

static void page_free(struct page *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->lines[i]);
}

/* ---- the entry line the schema implies ---- */

/* Appends printf output to buf (bounded). */
static void cat(char *buf, size_t len, const char *fmt, ...)
{
    size_t off = strlen(buf);
    va_list ap;

    if (off >= len)
        return;
    va_start(ap, fmt);
    vsnprintf(buf + off, len - off, fmt, ap);
    va_end(ap);
}

/* An integer as roff writes it: a minus sign is \- (a bare - is a hyphen). */
static void cat_int(char *buf, size_t len, int64_t v)
{
    if (v < 0)
        cat(buf, len, "\\-%" PRId64, -v);
    else
        cat(buf, len, "%" PRId64, v);
}

/* A string in double quotes, roff's escape character written as \e. */
static void cat_quoted(char *buf, size_t len, const char *s)
{
    cat(buf, len, "\"");
    for (; *s; s++) {
        if (*s == '\\')
            cat(buf, len, "\\e");
        else if (*s == '-')
            cat(buf, len, "\\-");
        else
            cat(buf, len, "%c", *s);
    }
    cat(buf, len, "\"");
}

static const char *enum_name(const struct cerb__cfg_key *k, int64_t v)
{
    for (const struct cerb__cfg_enum *e = k->enums; e->name; e++)
        if (e->value == v)
            return e->name;
    return "?";
}

/*
 * The entry line of key @k. Type, range, enum spellings and the reload
 * flag come from the row; the default is read from @def, a configuration
 * the parser built from nothing, so it is the value a client really gets.
 */
static void expected_line(const struct cerb__cfg_key *k,
                          const struct cerb_config *def, char *buf, size_t len)
{
    buf[0] = '\0';
    cat(buf, len, "\\fB%s\\fR (", k->path);
    switch (k->type) {
    case CERB__CFG_INT:
    case CERB__CFG_INT64:
        cat(buf, len, "integer, ");
        cat_int(buf, len, k->min);
        cat(buf, len, " to ");
        cat_int(buf, len, k->max);
        cat(buf, len, "; default \\fB");
        cat_int(buf, len, cerb__cfg_get_int(k, def));
        break;
    case CERB__CFG_BOOL:
        cat(buf, len, "boolean; default \\fB%s",
            cerb__cfg_get_int(k, def) ? "true" : "false");
        break;
    case CERB__CFG_STRING:
        cat(buf, len, "string; default \\fB");
        cat_quoted(buf, len, cerb__cfg_get_str(k, def));
        break;
    case CERB__CFG_STRLIST:
        cat(buf, len, "list of ");
        cat_int(buf, len, k->min);
        cat(buf, len, " to ");
        cat_int(buf, len, k->max);
        cat(buf, len, " strings; default \\fB(");
        for (size_t i = 0; i < cerb__cfg_list_len(k, def); i++) {
            cat(buf, len, i ? ", " : "");
            cat_quoted(buf, len, cerb__cfg_list_get(k, def, i));
        }
        cat(buf, len, ")");
        break;
    case CERB__CFG_ENUM:
        cat(buf, len, "one of");
        for (const struct cerb__cfg_enum *e = k->enums; e->name; e++) {
            cat(buf, len, e == k->enums ? " " : ", ");
            cat_quoted(buf, len, e->name);
        }
        cat(buf, len, "; default \\fB");
        cat_quoted(buf, len, enum_name(k, cerb__cfg_get_int(k, def)));
        break;
    }
    cat(buf, len, "\\fR; %s)",
        (k->flags & CERB__CFG_RELOADABLE) ? "reloadable" : "restart to change");
}

/* "redis" for "redis.port", "Top" for "epoch". */
static void group_of(const char *path, char *out, size_t len)
{
    const char *dot = strchr(path, '.');
    if (!dot)
        snprintf(out, len, "Top");
    else
        snprintf(out, len, "%.*s", (int)(dot - path), path);
}

/* ---- reading the page ---- */

/*
 * If line is an entry line, `\fBPATH\fR (`, copies PATH into out and
 * returns true. PATH is letters, digits, '_' and '.'.
 */
static bool entry_path(const char *line, char *out, size_t len)
{
    const char *p;
    size_t n;

    if (strncmp(line, "\\fB", 3) != 0)
        return false;
    p = line + 3;
    n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_.");
    if (n == 0 || n >= len || strncmp(p + n, "\\fR (", 5) != 0)
        return false;
    memcpy(out, p, n);
    out[n] = '\0';
    return true;
}

/* The first word of the `.SS` heading in force at line i ("" before any). */
static void section_at(const struct page *p, size_t i, char *out, size_t len)
{
    out[0] = '\0';
    while (i-- > 0) {
        const char *l = p->lines[i];
        if (strncmp(l, ".SH", 3) == 0)
            return; /* a new .SH ends the subsections above it */
        if (strncmp(l, ".SS ", 4) == 0) {
            l += 4;
            l += strspn(l, " \"");
            snprintf(out, len, "%.*s", (int)strcspn(l, " \""), l);
            return;
        }
    }
}

static size_t collect(const struct page *p, struct entry *e, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < p->n && n < max; i++)
        if (entry_path(p->lines[i], e[n].path, sizeof e[n].path))
            e[n++].line = i;
    return n;
}

static const struct entry *find_entry(const struct entry *e, size_t n,
                                      const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(e[i].path, path) == 0)
            return &e[i];
    return NULL;
}

/* ---- the tests ---- */

/* Every key the parser accepts has its entry, right and in place. */
static void test_every_schema_key_documented(void **state)
{
    static struct page p;
    static struct entry e[MAX_LINES];
    struct cerb_config *def = NULL;
    size_t n, problems = 0;

    (void)state;
    assert_int_equal(cerb__config_defaults(&def), CERB_OK);
    page_load(&p);
    n = collect(&p, e, MAX_LINES);
    for (size_t i = 0; i < cerb__cfg_nkeys; i++) {
        const struct cerb__cfg_key *k = &cerb__cfg_keys[i];
        const struct entry *d = find_entry(e, n, k->path);
        char want[LINE_MAX_LEN], group[64], sect[64];

        expected_line(k, def, want, sizeof want);
        group_of(k->path, group, sizeof group);
        if (!d) {
            print_error("%s: key \"%s\" is accepted by the parser "
                        "(config/schema.c) but missing from the page.\n"
                        "  Add it to section `.SS %s...` as:\n"
                        ".TP\n%s\n<one sentence: what it does>\n",
                        p.path, k->path, group, want);
            problems++;
            continue;
        }
        if (strcmp(p.lines[d->line], want) != 0) {
            print_error("%s:%zu: key \"%s\" differs from config/schema.c "
                        "(type, range, default, enum values or reloadable).\n"
                        "  page:   %s\n  schema: %s\n"
                        "  Replace the page's line with the schema's.\n",
                        p.path, d->line + 1, k->path, p.lines[d->line], want);
            problems++;
        }
        if (d->line == 0 || strcmp(p.lines[d->line - 1], ".TP") != 0) {
            print_error("%s:%zu: key \"%s\": its line must follow a .TP line\n",
                        p.path, d->line + 1, k->path);
            problems++;
        }
        if (d->line + 1 >= p.n || p.lines[d->line + 1][0] == '.' ||
            p.lines[d->line + 1][0] == '\0') {
            print_error("%s:%zu: key \"%s\" has no description: add a "
                        "sentence of what it does on the next line\n",
                        p.path, d->line + 1, k->path);
            problems++;
        }
        section_at(&p, d->line, sect, sizeof sect);
        if (strcmp(sect, group) != 0) {
            print_error("%s:%zu: key \"%s\" is in section \"%s\"; move it to "
                        "the section `.SS %s...`\n",
                        p.path, d->line + 1, k->path, sect, group);
            problems++;
        }
    }
    page_free(&p);
    cerb__config_free(def);
    if (problems)
        fail_msg("%zu problem(s) between config/schema.c and the page "
                 "(listed above)", problems);
}

/* The page names no key the parser would refuse, and none twice. */
static void test_every_documented_key_accepted(void **state)
{
    static struct page p;
    static struct entry e[MAX_LINES];
    size_t n, problems = 0;

    (void)state;
    page_load(&p);
    n = collect(&p, e, MAX_LINES);
    for (size_t i = 0; i < n; i++) {
        if (cerb__cfg_key_index(e[i].path) < 0) {
            print_error("%s:%zu: the page documents key \"%s\", which the "
                        "parser does not accept (not in config/schema.c): "
                        "remove its entry, or add the key to the schema\n",
                        p.path, e[i].line + 1, e[i].path);
            problems++;
        }
        if (find_entry(e, i, e[i].path)) {
            print_error("%s:%zu: key \"%s\" is documented twice: keep one\n",
                        p.path, e[i].line + 1, e[i].path);
            problems++;
        }
    }
    /* A page whose entries all went unrecognised would pass the loop. */
    if (n == 0) {
        print_error("%s: no key entries found (\\fBPATH\\fR (...) lines)\n",
                    p.path);
        problems++;
    }
    page_free(&p);
    if (problems)
        fail_msg("%zu problem(s) in the page's key entries (listed above)",
                 problems);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_schema_key_documented),
        cmocka_unit_test(test_every_documented_key_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
