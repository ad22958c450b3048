/*
 * cmd_switch.c — `cerberus [-c FILE] switch [ENGINE|auto]`: flip every
 * client that watches the configuration file to another engine by rewriting
 * the file's top-level `active` setting and bumping its `epoch` (the high 16
 * bits of every fencing token, so all grants after the switch rank above all
 * grants before it). Without ENGINE it prints the `active` setting.
 *
 * The rewrite keeps the operator's file as written: the text is edited, not
 * regenerated, so comments, layout and key order survive. A small scanner
 * that knows libconfig's lexical rules (strings with escapes, `#`, `//` and
 * block comments, nesting by {} () []) finds the two settings at nesting
 * depth 0 and replaces only their value tokens; a setting that is absent is
 * appended at the end. The new text must then parse and validate with the
 * library's own parser, must say exactly the new active engine and epoch,
 * and must differ from the old one in no key a running client refuses to
 * reload; otherwise nothing is written.
 *
 * Writing is atomic: the new text goes to a temporary file in the same
 * directory (same file system), is given the old file's mode (and owner,
 * when we may), fsynced, renamed over the file and the directory fsynced.
 * Readers therefore see the old file or the new one, never a mix, and
 * watchers see one rename. A symlink is followed, and its target replaced.
 * Two concurrent switches are serialised with flock on the file itself;
 * because the winner replaces that file, the loser re-checks after getting
 * the lock that the path still names the file it locked, and starts over
 * on the new one when it does not, so no epoch bump is lost.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"

const char cerb__cli_switch_usage[] =
    "Usage: cerberus [-c FILE] switch [ENGINE|auto]\n"
    "\n"
    "Point every client that uses the configuration file at ENGINE (or back\n"
    "to automatic failover with `auto`). Rewrites the top-level settings\n"
    "`active = \"ENGINE\";` and `epoch = N+1;` in place, keeping comments and\n"
    "layout, validates the result with the library's parser, and replaces\n"
    "the file atomically (temporary file, fsync, rename). Running clients\n"
    "that watch the file (failover.watch_config, the default) reload it and\n"
    "send new acquisitions to ENGINE; locks they already hold stay on the old\n"
    "engine until released or lost. The epoch bump makes every fencing token\n"
    "granted afterwards larger than any granted before. It then writes the new\n"
    "epoch's closure records on the engines (it opens the new file once): each\n"
    "engine left refuses processes still on an older file, which reload and\n"
    "follow, and is asked at most once per name afterwards.\n"
    "\n"
    "Without ENGINE, prints the current `active` setting.\n"
    "\n"
    "Needs a real file: -c FILE, $CERBERUS_CONFIG, ./cerberus.cfg or\n"
    "/etc/cerberus/cerberus.cfg.\n"
    "\n"
    "Exit status: 0 done (or nothing to change), 78 invalid file, ENGINE not\n"
    "in `engines`, no file, or epoch at its maximum; 73 the file could not be\n"
    "written; 64 usage.\n";

#define MAX_CONFIG_BYTES (16 * 1024 * 1024)
#define MAX_EPOCH 65535 /* config/schema.c: the fence's high 16 bits */

/* A configuration file read under its lock. */
struct cfg_file {
    char path[PATH_MAX];  /* symlinks resolved */
    int fd;               /* open, flock'ed */
    struct stat st;
    char *text;
    size_t len;
};

static void cfg_file_close(struct cfg_file *f)
{
    if (f->fd >= 0)
        close(f->fd); /* drops the flock */
    f->fd = -1;
    free(f->text);
    f->text = NULL;
}

static int read_all(int fd, char **out, size_t *out_len)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);

    if (!buf)
        return ENOMEM;
    for (;;) {
        if (len == cap) {
            char *nb;
            if (cap >= MAX_CONFIG_BYTES) {
                free(buf);
                return EFBIG;
            }
            cap *= 2;
            nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return ENOMEM;
            }
            buf = nb;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            free(buf);
            return err;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return 0;
}

/*
 * Opens, locks and reads the file @path names. Returns 0 or an exit code
 * (after printing why).
 */
static int cfg_file_open(struct cfg_file *f, const char *path)
{
    f->fd = -1;
    f->text = NULL;
    /* A switch racing ours may replace the file between our open and our
     * lock; then we locked a file nobody reads any more: start over. A
     * bounded number of rounds, since each one means someone else won. */
    for (int round = 0; round < 100; round++) {
        struct stat now;
        if (!realpath(path, f->path)) {
            cerb__cli_error("%s: %s", path, strerror(errno));
            return CLI_EXIT_CONFIG;
        }
        f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) {
            cerb__cli_error("%s: %s", f->path, strerror(errno));
            return CLI_EXIT_CONFIG;
        }
        while (flock(f->fd, LOCK_EX) != 0) {
            if (errno != EINTR) {
                cerb__cli_error("%s: cannot lock: %s", f->path, strerror(errno));
                cfg_file_close(f);
                return CLI_EXIT_CANTCREAT;
            }
        }
        if (fstat(f->fd, &f->st) != 0 || stat(f->path, &now) != 0) {
            cerb__cli_error("%s: %s", f->path, strerror(errno));
            cfg_file_close(f);
            return CLI_EXIT_CONFIG;
        }
        if (now.st_dev != f->st.st_dev || now.st_ino != f->st.st_ino) {
            cfg_file_close(f);
            continue;
        }
        if (!S_ISREG(f->st.st_mode)) {
            cerb__cli_error("%s: not a regular file", f->path);
            cfg_file_close(f);
            return CLI_EXIT_CONFIG;
        }
        int err = read_all(f->fd, &f->text, &f->len);
        if (err) {
            cerb__cli_error("%s: cannot read: %s", f->path, strerror(err));
            cfg_file_close(f);
            return CLI_EXIT_CONFIG;
        }
        if (strlen(f->text) != f->len) {
            cerb__cli_error("%s: contains a NUL byte", f->path);
            cfg_file_close(f);
            return CLI_EXIT_CONFIG;
        }
        return 0;
    }
    cerb__cli_error("%s: keeps being replaced by another writer", path);
    return CLI_EXIT_CANTCREAT;
}

/* ---- the scanner ---- */

struct span {
    size_t start, end; /* [start, end) of the value; start == end: absent */
    bool found;
};

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '*';
}

static bool is_name_char(char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments from @p; returns the next significant index. */
static size_t skip_space(const char *t, size_t n, size_t p)
{
    while (p < n) {
        char c = t[p];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' ||
            c == '\v') {
            p++;
        } else if (c == '#' || (c == '/' && p + 1 < n && t[p + 1] == '/')) {
            while (p < n && t[p] != '\n')
                p++;
        } else if (c == '/' && p + 1 < n && t[p + 1] == '*') {
            const char *e = strstr(t + p + 2, "*/");
            p = e ? (size_t)(e - t) + 2 : n;
        } else {
            break;
        }
    }
    return p;
}

/* @p is at an opening quote: returns the index just past the closing one. */
static size_t skip_string(const char *t, size_t n, size_t p)
{
    for (p++; p < n && t[p] != '"'; p++)
        if (t[p] == '\\' && p + 1 < n)
            p++;
    return p < n ? p + 1 : n;
}

/*
 * Finds the value of top-level setting @key: its string literal(s) when
 * @want_string, else its scalar token. Settings inside groups, lists and
 * arrays, and text inside strings and comments, never match.
 */
static struct span find_setting(const char *t, size_t n, const char *key,
                                bool want_string)
{
    struct span sp = {0, 0, false};
    size_t klen = strlen(key);
    int depth = 0;
    size_t p = 0;

    while ((p = skip_space(t, n, p)) < n) {
        char c = t[p];
        if (c == '"') {
            p = skip_string(t, n, p);
        } else if (c == '{' || c == '(' || c == '[') {
            depth++;
            p++;
        } else if (c == '}' || c == ')' || c == ']') {
            depth--;
            p++;
        } else if (is_name_start(c)) {
            size_t s = p;
            while (p < n && is_name_char(t[p]))
                p++;
            if (depth != 0 || p - s != klen || memcmp(t + s, key, klen) != 0)
                continue;
            size_t q = skip_space(t, n, p);
            if (q >= n || (t[q] != '=' && t[q] != ':'))
                continue;
            q = skip_space(t, n, q + 1);
            sp.start = sp.end = q;
            if (want_string) {
                /* Adjacent literals concatenate: "red" "is". */
                while (q < n && t[q] == '"') {
                    sp.end = skip_string(t, n, q);
                    q = skip_space(t, n, sp.end);
                }
            } else {
                while (q < n && (is_name_char(t[q]) || t[q] == '+' || t[q] == '.'))
                    q++;
                sp.end = q;
            }
            sp.found = sp.end > sp.start;
            return sp;
        } else {
            p++;
        }
    }
    return sp;
}

/* Growing output buffer. */
struct buf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void buf_add(struct buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_str(struct buf *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

/*
 * The new text: @text with the values of `active` and `epoch` replaced (or
 * the settings appended). Returns NULL when out of memory.
 */
static char *rewrite(const char *text, size_t n, const char *active,
                     int64_t epoch)
{
    struct span sa = find_setting(text, n, "active", true);
    struct span se = find_setting(text, n, "epoch", false);
    char active_val[64], epoch_val[32];
    struct {
        struct span sp;
        const char *val;
    } edits[2];
    struct buf b = {NULL, 0, 0, false};
    size_t pos = 0;
    int ne = 0;

    snprintf(active_val, sizeof active_val, "\"%s\"", active);
    snprintf(epoch_val, sizeof epoch_val, "%" PRId64, epoch);
    /* Apply the edits in file order. */
    if (sa.found && se.found && se.start < sa.start) {
        edits[ne].sp = se, edits[ne++].val = epoch_val;
        edits[ne].sp = sa, edits[ne++].val = active_val;
    } else {
        if (sa.found)
            edits[ne].sp = sa, edits[ne++].val = active_val;
        if (se.found)
            edits[ne].sp = se, edits[ne++].val = epoch_val;
    }
    for (int i = 0; i < ne; i++) {
        buf_add(&b, text + pos, edits[i].sp.start - pos);
        buf_str(&b, edits[i].val);
        pos = edits[i].sp.end;
    }
    buf_add(&b, text + pos, n - pos);
    if (!sa.found || !se.found) {
        if (b.len > 0 && b.p[b.len - 1] != '\n')
            buf_str(&b, "\n");
        if (!sa.found) {
            buf_str(&b, "active = ");
            buf_str(&b, active_val);
            buf_str(&b, ";\n");
        }
        if (!se.found) {
            buf_str(&b, "epoch = ");
            buf_str(&b, epoch_val);
            buf_str(&b, ";                      # bumped by `cerberus switch`\n");
        }
    }
    if (b.oom || !b.p) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ---- atomic replace ---- */

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Replaces f->path by @text atomically. Returns 0 or an exit code. */
static int replace_file(const struct cfg_file *f, const char *text)
{
    char dir[PATH_MAX], tmp[PATH_MAX + 32];
    const char *slash = strrchr(f->path, '/');
    const char *base = slash ? slash + 1 : f->path;
    int fd, err = 0, dfd;

    /* realpath() gave an absolute path: there is a slash, maybe the root. */
    snprintf(dir, sizeof dir, "%s", f->path);
    if (slash && slash != f->path)
        dir[slash - f->path] = '\0';
    else
        snprintf(dir, sizeof dir, "%s", slash ? "/" : ".");
    if (snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, base) >= (int)sizeof tmp) {
        cerb__cli_error("%s: path too long", f->path);
        return CLI_EXIT_CANTCREAT;
    }
    fd = mkstemp(tmp);
    if (fd < 0) {
        cerb__cli_error("%s: cannot create a temporary file: %s", dir, strerror(errno));
        return CLI_EXIT_CANTCREAT;
    }
    /* The new file must look like the old one to whoever reads it. */
    if (fchmod(fd, f->st.st_mode & 07777) != 0)
        err = errno;
    if (!err && (f->st.st_uid != geteuid() || f->st.st_gid != getegid()) &&
        fchown(fd, f->st.st_uid, f->st.st_gid) != 0 && errno != EPERM)
        err = errno;
    if (!err)
        err = write_all(fd, text, strlen(text));
    if (!err && fsync(fd) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, f->path) != 0)
        err = errno;
    if (err) {
        cerb__cli_error("%s: cannot write: %s", f->path, strerror(err));
        unlink(tmp);
        return CLI_EXIT_CANTCREAT;
    }
    /* The rename is durable once the directory is. */
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL)
            cerb__cli_error("warning: %s: fsync: %s", dir, strerror(errno));
        close(dfd);
    }
    return 0;
}

/* ---- the command ---- */

static void engine_list(const struct cerb_config *cfg, char *out, size_t len)
{
    size_t used = 0;

    out[0] = '\0';
    for (size_t i = 0; i < cfg->n_engines && used < len; i++) {
        int w = snprintf(out + used, len - used, "%s%s", i ? ", " : "", cfg->engines[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* Parses @text as the file @path; prints the error and returns NULL. */
static struct cerb_config *parse_text(const char *path, const char *text)
{
    struct cerb_config *cfg = NULL;
    char msg[1024];

    if (cerb__config_from_string(text, &cfg) != CERB_OK) {
        cerb__cli_error("%s", cerb__cli_error_in(path, cerb_last_error(), msg, sizeof msg));
        return NULL;
    }
    return cfg;
}

static void explain(const struct cfg_file *f, const struct cerb_config *old,
                    const struct cerb_config *cfg)
{
    char names[256];

    engine_list(cfg, names, sizeof names);
    printf("%s: active \"%s\" -> \"%s\", epoch %" PRId64 " -> %" PRId64 "\n",
           f->path, old->active, cfg->active, old->epoch, cfg->epoch);
    if (!cfg->failover.watch_config)
        printf("failover.watch_config is false: running clients change only "
               "when they call cerb_client_reload().\n");
    else
        printf("Running clients watching this file reload it and send new "
               "acquisitions to ");
    if (cfg->failover.watch_config && strcmp(cfg->active, "auto") == 0)
        printf("the first engine in order (%s) whose breaker is closed.\n", names);
    else if (cfg->failover.watch_config)
        printf("%s.\n", cfg->active);
    printf("Locks already held stay on their engine until released or lost; "
           "fencing tokens granted from now on rank above all earlier ones "
           "(epoch %" PRId64 ").\n",
           cfg->epoch);
}

/*
 * Write the new epoch's closure records now (core/closure.c), rather than
 * when the first process reloads: a client opened on the new file writes
 * them at open. From then on every engine that answered refuses processes
 * still on an older file, and the engines left need not be asked about a
 * name more than once. Says what each engine now records.
 */
static void record(const char *path, const struct cerb_config *cfg)
{
    if (cfg->n_engines < 2)
        return;
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open(&c, path);
    if (st != CERB_OK) {
        printf("Closure records not written (%s): clients write them when they "
               "open or reload this file.\n",
               cerb_last_error());
        return;
    }
    bool autom = strcmp(cfg->active, "auto") == 0;
    for (size_t i = 0; i < cfg->n_engines; i++) {
        struct cerb_engine_info in;
        const char *e = cfg->engines[i];
        if (cerb_engine_info(c, e, &in) != CERB_OK)
            continue;
        if (in.closed_epoch == cfg->epoch)
            printf("  %s: closed from epoch %" PRId64 " (processes on older files are "
                   "refused there)\n", e, cfg->epoch);
        else if (autom || strcmp(e, cfg->active) == 0)
            printf("  %s: open from epoch %" PRId64 "\n", e, cfg->epoch);
        else
            printf("  %s: no closure record (not reachable, or it keeps none): "
                   "acquisitions elsewhere ask it before and after each grant while "
                   "it answers\n", e);
    }
    cerb_client_close(c);
}

/* `switch [ENGINE|auto]`: -1 to go on (*engine NULL when not given), or
 * the exit code (printed). */
static int parse_args(int argc, char **argv, const char **engine)
{
    for (int i = 1; i < argc; i++) {
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_switch_usage, stdout);
            return CLI_EXIT_OK;
        }
        if (argv[i][0] == '-')
            return cerb__cli_usage_error("switch", "unknown option '%s'", argv[i]);
        if (*engine)
            return cerb__cli_usage_error("switch", "one ENGINE at most");
        *engine = argv[i];
    }
    return -1;
}

int cerb__cli_switch_parse(int argc, char **argv)
{
    const char *engine = NULL;
    return parse_args(argc, argv, &engine);
}

int cerb__cli_switch(const struct cerb__cli *cli, int argc, char **argv)
{
    const char *engine = NULL;
    struct cfg_file f;
    struct cerb_config *old = NULL, *cfg = NULL;
    char *text = NULL;
    int rc;

    rc = parse_args(argc, argv, &engine);
    if (rc >= 0)
        return rc;
    if (!cli->config_path) {
        cerb__cli_error("switch: no configuration file (give -c FILE, set "
                        "$CERBERUS_CONFIG, or create ./cerberus.cfg or "
                        "/etc/cerberus/cerberus.cfg)");
        return CLI_EXIT_CONFIG;
    }
    rc = cfg_file_open(&f, cli->config_path);
    if (rc)
        return rc;
    old = parse_text(f.path, f.text);
    if (!old) {
        rc = CLI_EXIT_CONFIG;
        goto out;
    }
    if (!engine) {
        printf("%s\n", old->active);
        if (cli->verbose)
            printf("epoch %" PRId64 "\n", old->epoch);
        goto out;
    }
    if (strcmp(engine, "auto") != 0 && cerb__config_engine_index(old, engine) < 0) {
        char names[256];
        engine_list(old, names, sizeof names);
        cerb__cli_error("switch: engine \"%s\" is not configured in %s "
                        "(engines: %s; or \"auto\")",
                        engine, f.path, names);
        rc = CLI_EXIT_CONFIG;
        goto out;
    }
    if (strcmp(old->active, engine) == 0) {
        printf("%s: active is already \"%s\" (epoch %" PRId64 "); file unchanged\n",
               f.path, engine, old->epoch);
        goto out;
    }
    if (old->epoch >= MAX_EPOCH) {
        cerb__cli_error("switch: %s: epoch is %" PRId64 ", the largest the "
                        "fencing tokens can carry; it cannot be bumped",
                        f.path, old->epoch);
        rc = CLI_EXIT_CONFIG;
        goto out;
    }
    text = rewrite(f.text, f.len, engine, old->epoch + 1);
    if (!text) {
        cerb__cli_error("out of memory");
        rc = CLI_EXIT_OSERR;
        goto out;
    }
    /* Trust nothing: the edit must say what we meant and nothing else. */
    cfg = parse_text(f.path, text);
    if (!cfg) {
        cerb__cli_error("switch: the rewritten %s does not validate; file unchanged",
                        f.path);
        rc = CLI_EXIT_CONFIG;
        goto out;
    }
    if (strcmp(cfg->active, engine) != 0 || cfg->epoch != old->epoch + 1 ||
        cerb__config_reloadable(old, cfg) != CERB_OK) {
        cerb__cli_error("switch: could not edit %s as intended (active = \"%s\", "
                        "epoch = %" PRId64 " after the edit); file unchanged",
                        f.path, cfg->active, cfg->epoch);
        rc = CLI_EXIT_SOFTWARE;
        goto out;
    }
    rc = replace_file(&f, text);
    if (rc == 0) {
        explain(&f, old, cfg);
        fflush(stdout);
        record(f.path, cfg);
    }
out:
    cerb__config_free(cfg);
    cerb__config_free(old);
    free(text);
    cfg_file_close(&f);
    return rc;
}
