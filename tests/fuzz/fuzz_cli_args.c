/*
 * fuzz_cli_args.c — libFuzzer harness of the `cerberus` command's argument
 * parsing (cli/main.c cerb__cli_parse_global, then the command's own parser
 * through cerb__cli_parse_command), which never connects or runs anything.
 *
 * The input is an argv: words separated by NUL bytes (at most 32), after
 * argv[0] = "cerberus". Properties: no crash, undefined behaviour or leak;
 * the answer is "go on" (-1), 0 (help, version) or 64 (usage error) and
 * nothing else; the global parser's command index is inside argv; `run` and
 * `holders` go on only with a name the library would accept (1..255 bytes,
 * no control characters).
 *
 * What the parsers print (help texts, usage errors) is sent to /dev/null
 * while they run, or the log would hold one line per execution; set
 * CERB_FUZZ_VERBOSE=1 to see it (when replaying one input).
 */
#include "internal_posix.h"

#include <fcntl.h>
#include <unistd.h>

#include "cli.h"
#include "fuzz.h"

#define MAX_WORDS 32

static int devnull = -1, saved_out = -1, saved_err = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *v = getenv("CERB_FUZZ_VERBOSE");
    if (v && *v == '1')
        return 0;
    devnull = open("/dev/null", O_WRONLY);
    saved_out = dup(1);
    saved_err = dup(2);
    if (devnull < 0 || saved_out < 0 || saved_err < 0)
        abort();
    return 0;
}

static void quiet(bool on)
{
    if (devnull < 0)
        return;
    fflush(stdout);
    fflush(stderr);
    dup2(on ? devnull : saved_out, 1);
    dup2(on ? devnull : saved_err, 2);
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 255)
        return false;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    return true;
}

/* The NAME `run` / `holders` would use, found independently of the parser:
 * run: the first word after the options; holders: the only word. Only
 * checked when the parser said "go on". */
static const char *run_name(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            return i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-w") == 0 || strcmp(a, "--wait") == 0 || strcmp(a, "--on-lost") == 0 ||
            strcmp(a, "--lease") == 0 || strcmp(a, "--grace") == 0) {
            i++;
            continue;
        }
        if (a[0] == '-' && a[1] != '\0')
            continue;
        return a;
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    char *argv[MAX_WORDS + 2];
    int argc = 0;

    if (!buf)
        abort();
    if (size)
        memcpy(buf, data, size);
    buf[size] = '\0';
    argv[argc++] = "cerberus";
    for (size_t i = 0; i <= size && argc <= MAX_WORDS;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;

    struct cerb__cli_args a;
    quiet(true);
    int rc = cerb__cli_parse_global(argc, argv, &a);
    int rc2 = -2;
    if (rc == -1 && a.cmd < argc)
        rc2 = cerb__cli_parse_command(argc - a.cmd, argv + a.cmd);
    quiet(false);

    FUZZ_CHECK(rc == -1 || rc == CLI_EXIT_OK || rc == CLI_EXIT_USAGE, "global: %d", rc);
    if (rc == -1) {
        FUZZ_CHECK(a.cmd >= 1 && a.cmd < argc, "command index %d of %d", a.cmd, argc);
        FUZZ_CHECK(!a.opt_path || a.opt_path[0], "an empty -c FILE went through");
        FUZZ_CHECK(rc2 == -1 || rc2 == CLI_EXIT_OK || rc2 == CLI_EXIT_USAGE, "command: %d", rc2);
        const char *cmd = argv[a.cmd];
        if (rc2 == -1 && strcmp(cmd, "run") == 0) {
            const char *n = run_name(argc - a.cmd, argv + a.cmd);
            FUZZ_CHECK(n && name_ok(n), "run went on with a bad NAME");
        }
        if (rc2 == -1 && strcmp(cmd, "holders") == 0) {
            const char *n = argv[argc - 1];
            FUZZ_CHECK(name_ok(n), "holders went on with a bad NAME");
        }
    }
    free(buf);
    return 0;
}
