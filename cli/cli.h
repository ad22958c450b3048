/*
 * cli.h — what the files of the `cerberus` command share: the resolved
 * global options, the exit codes, message and parsing helpers, and one entry
 * point per subcommand (cmd_*.c). Nothing here is library API; the command
 * uses the library through include/cerberus.h, plus config/config.h for the
 * commands that read or rewrite a configuration file themselves.
 */
#ifndef CERB_CLI_H
#define CERB_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

#if defined(__GNUC__)
#define CERB_CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CERB_CLI_PRINTF(a, b)
#endif

/*
 * Exit codes. The numbers are sysexits(3) values so that cron wrappers and
 * supervisors already know them; 75 and 76 are given the meanings of
 * DESIGN.md §7 ("not obtained", "lost").
 */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_USAGE = 64,       /* EX_USAGE: bad arguments */
    CLI_EXIT_DATAERR = 65,     /* EX_DATAERR: `init` refused a store that
                                  shows signs of earlier use */
    CLI_EXIT_UNAVAILABLE = 69, /* EX_UNAVAILABLE: no engine could be reached */
    CLI_EXIT_SOFTWARE = 70,    /* EX_SOFTWARE: an unexpected library answer */
    CLI_EXIT_OSERR = 71,       /* EX_OSERR: fork, pipe, out of memory */
    CLI_EXIT_CANTCREAT = 73,   /* EX_CANTCREAT: cannot write the config file */
    CLI_EXIT_NOT_OBTAINED = 75,/* EX_TEMPFAIL: the lock was not obtained */
    CLI_EXIT_LOST = 76,        /* the lock was lost while CMD ran */
    CLI_EXIT_CONFIG = 78,      /* EX_CONFIG: bad or missing configuration */
    CLI_EXIT_CANNOT_EXEC = 126,/* CMD found but could not be executed */
    CLI_EXIT_NOT_FOUND = 127   /* CMD not found (as a shell says) */
};

/* Where the configuration came from (DESIGN.md §6 lookup order). */
enum cli_config_origin {
    CLI_CONFIG_OPTION,   /* -c FILE */
    CLI_CONFIG_ENV,      /* $CERBERUS_CONFIG */
    CLI_CONFIG_CWD,      /* ./cerberus.cfg */
    CLI_CONFIG_ETC,      /* /etc/cerberus/cerberus.cfg */
    CLI_CONFIG_NONE      /* no file: defaults, engine "local" */
};

/* The global options, resolved by main.c before a subcommand runs. */
struct cerb__cli {
    const char *config_path;        /* NULL with CLI_CONFIG_NONE */
    enum cli_config_origin origin;
    int verbose;                    /* -v given (any number of times) */
};

/* Subcommands: argv[0] is the subcommand's name; return the exit code. */
int cerb__cli_run(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_status(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_switch(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_check(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_holders(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_once(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_init(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_serve(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_elect(const struct cerb__cli *cli, int argc, char **argv);
int cerb__cli_leader(const struct cerb__cli *cli, int argc, char **argv);

/*
 * The same commands' argument parsers alone: each returns -1 when the
 * arguments are good (the command would go on to run), or the exit code the
 * command returns at once, having printed what it prints (its --help text
 * on stdout, a usage error on stderr). They connect nowhere, read no file
 * and keep nothing.
 */
int cerb__cli_run_parse(int argc, char **argv);
int cerb__cli_status_parse(int argc, char **argv);
int cerb__cli_switch_parse(int argc, char **argv);
int cerb__cli_elect_parse(int argc, char **argv);
int cerb__cli_leader_parse(int argc, char **argv);
int cerb__cli_check_parse(int argc, char **argv);
int cerb__cli_holders_parse(int argc, char **argv);
int cerb__cli_once_parse(int argc, char **argv);
int cerb__cli_init_parse(int argc, char **argv);
int cerb__cli_serve_parse(int argc, char **argv);

/* The global options of the command line (main.c). */
struct cerb__cli_args {
    const char *opt_path; /* -c FILE, --config FILE, -cFILE; or NULL */
    int verbose;          /* -v, --verbose (-vv counts 2) */
    int cmd;              /* index in argv of the command word */
};

/*
 * Parses `cerberus [-c FILE] [-v] COMMAND ...` up to COMMAND. Returns -1
 * with out->cmd set, or the exit code the command line ends with at once
 * (-h, -V, a usage error: printed).
 */
int cerb__cli_parse_global(int argc, char **argv, struct cerb__cli_args *out);

/* Parses argv[0] (a command name, or "help") and its arguments with that
 * command's parser; -1 or an exit code as above. */
int cerb__cli_parse_command(int argc, char **argv);

/* The whole command: parse, find the configuration, run (cerberus.c). */
int cerb__cli_main(int argc, char **argv);

/* Prints s[0..n) with bytes that are not printable ASCII (and '\\') as \xNN. */
void cerb__cli_print_bytes(const char *s, size_t n);

/* Usage texts (man-page style), printed by --help and by `cerberus help`. */
extern const char cerb__cli_run_usage[];
extern const char cerb__cli_status_usage[];
extern const char cerb__cli_switch_usage[];
extern const char cerb__cli_check_usage[];
extern const char cerb__cli_holders_usage[];
extern const char cerb__cli_once_usage[];
extern const char cerb__cli_init_usage[];
extern const char cerb__cli_serve_usage[];
extern const char cerb__cli_elect_usage[];
extern const char cerb__cli_leader_usage[];

/*
 * CMD run the way `run` runs it (cmd_run.c), for `once`: prepare before the
 * client is opened (signals are then read from one signalfd, which every
 * library thread's mask leaves alone), wait for a signal that abandons a
 * wait (INT TERM HUP QUIT; returns it, or 0 after @timeout_ms), run CMD
 * (its exit code, 128+N, 126/127, 71), free. @what names the command in
 * messages.
 */
/*
 * Matches option @lng (and @shrt, may be NULL) at argv[*i] with its value
 * given as the next word, attached (-w100) or after '=' (--wait=100).
 * Returns 0 no match, 1 matched (*val set, *i advanced past a separate
 * value), -1 matched without a value. (cmd_run.c; run and once share it.)
 */
int cerb__cli_opt_val(int argc, char **argv, int *i, const char *lng, const char *shrt,
                      const char **val);

struct cerb__cli_child;
int cerb__cli_child_prepare(const char *what, struct cerb__cli_child **out);
int cerb__cli_child_wait_signal(struct cerb__cli_child *ch, int64_t timeout_ms);
int cerb__cli_child_run(struct cerb__cli_child *ch, char **cmd, int verbose);
/* As cerb__cli_child_run, with @own ("NAME=value" strings, @nown of them)
 * added to CMD's environment. */
int cerb__cli_child_run_env(struct cerb__cli_child *ch, char **cmd, char **own, size_t nown,
                            int verbose);
void cerb__cli_child_free(struct cerb__cli_child *ch);
/* What a loss while CMD runs does (before cerb__cli_child_run): @name in
 * messages; @kill sends CMD SIGTERM (SIGKILL 5 s later), else CMD goes on. */
void cerb__cli_child_on_lost(struct cerb__cli_child *ch, const char *name, bool kill);
/* A loss (any thread, e.g. a library callback: a flag and a byte). */
void cerb__cli_child_lost(struct cerb__cli_child *ch);
bool cerb__cli_child_was_lost(struct cerb__cli_child *ch);

/* "cerberus: <message>\n" on stderr. */
void cerb__cli_error(const char *fmt, ...) CERB_CLI_PRINTF(1, 2);

/* Reports a usage error for subcommand @cmd and returns CLI_EXIT_USAGE. */
int cerb__cli_usage_error(const char *cmd, const char *fmt, ...)
    CERB_CLI_PRINTF(2, 3);

/* True for "-h" and "--help". */
bool cerb__cli_is_help(const char *arg);

/* The exit code that stands for a library status. */
int cerb__cli_exit_code(cerb_status st);

/*
 * Parses a decimal count of milliseconds in [min, max] (the whole string,
 * no sign, no suffix). Returns false for anything else.
 */
bool cerb__cli_parse_ms(const char *s, int64_t min, int64_t max, int64_t *out);

/*
 * Checks a lock name the way the library does (1–255 bytes, no control
 * characters), so a command can refuse it with a usage error before it
 * connects anywhere.
 */
bool cerb__cli_name_ok(const char *name);

/*
 * Opens a client on the resolved configuration and routes the library's
 * log lines to stderr as "cerberus: <level>: <line>" (warnings and worse;
 * everything with -v). On failure prints the reason and returns the exit
 * code (78 for a bad file, 69 when no engine answers); else CLI_EXIT_OK.
 */
int cerb__cli_open_client(const struct cerb__cli *cli, cerb_client **out);
/* Just the log routing of cerb__cli_open_client: lines of @quiet and
 * worse without -v (for a command that opens its client itself). */
void cerb__cli_log_init(const struct cerb__cli *cli, cerb_log_level quiet);

/*
 * A human name for the resolved configuration in messages: the path, or
 * "(defaults)" when no file was found.
 */
const char *cerb__cli_config_name(const struct cerb__cli *cli);

/*
 * Replaces a leading "config:" (the name the parser gives to text it was
 * handed as a string) by @path, so errors about a rewritten file point at
 * the file. Writes into @buf and returns it.
 */
const char *cerb__cli_error_in(const char *path, const char *msg, char *buf,
                               size_t len);

#endif /* CERB_CLI_H */
