/*
 * cli_capture.h — run a command (the `cerberus` binary, mostly) with its
 * stdout and stderr captured, within a deadline, and time when a given text
 * first shows on its stderr: "how long from the start of `cerberus run` to
 * the grant" is the time from the spawn to its `-v` line "run: holding",
 * measured on the monotonic clock of this process, with no clock of the
 * child's involved.
 *
 * Ownership: cerb_test_capture_free() frees what the result holds.
 */
#ifndef CERB_TEST_CLI_CAPTURE_H
#define CERB_TEST_CLI_CAPTURE_H

#include <stdint.h>

struct cerb_test_capture {
    int status;       /* as cerb_test_wait(): exit code, 128+signal, or < 0 */
    char *out, *err;  /* everything written, NUL-terminated (never NULL) */
    int64_t mark_ms;  /* ms from the spawn until `mark` was on stderr; -1 */
};

/*
 * Run argv[0] (PATH searched) with argv, stdin /dev/null, in its own
 * process group; read both outputs until they close and the child exits,
 * at most timeout_ms in all (then its group is killed: status
 * CERB_TEST_CHILD_TIMEOUT). mark may be NULL. Returns 0, or -1 when it
 * could not be started (errno).
 */
int cerb_test_capture_run(char *const argv[], const char *mark, int64_t timeout_ms,
                          struct cerb_test_capture *res);

void cerb_test_capture_free(struct cerb_test_capture *res);

/* How many times needle occurs in hay. */
int cerb_test_count(const char *hay, const char *needle);

#endif
