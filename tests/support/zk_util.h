/*
 * zk_util.h — helpers for the ZooKeeper suites (test_zk*.c,
 * test_interop_curator*.c): the suite's server port and config text, a raw
 * libzookeeper_mt client to look at the server behind the library's back,
 * pausing and killing test servers by PID, starting ensembles with
 * scripts/servers.sh, compiling the Java peers, and a child process driven
 * line by line through pipes.
 *
 * Environment (set by cerb_add_suite): CERB_ZK_PORT (this suite's server,
 * default 22181), CERB_STATE_DIR, CERB_SOURCE_DIR, CERB_BUILD_DIR.
 *
 * Ownership: `char *` results are malloc'd (free()); raw handles are closed
 * with cerb_test_zk_close(). Thread-safety: any thread, except pause/resume
 * of one server, which a suite drives from one thread.
 */
#ifndef CERB_TEST_ZK_UTIL_H
#define CERB_TEST_ZK_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <zookeeper/zookeeper.h>

#include "test_util.h"

/* $CERB_ZK_PORT, or 22181. */
int cerb_test_zk_port(void);

/* The lock root the suites use (the engine's default). */
#define CERB_TEST_ZK_ROOT "/cerberus/locks"

/*
 * Config text for one zk engine: `engines = ("zk"); zk = { hosts = "<hosts>";
 * <zk_extra> }; <extra>`; hosts NULL = "127.0.0.1:<cerb_test_zk_port()>".
 * Returns: malloc'd text, NULL on out of memory.
 */
char *cerb_test_zk_config(const char *hosts, const char *zk_extra, const char *extra);

/*
 * A raw client on `hosts` (NULL: this suite's server), with digest auth
 * "user:password" when auth is non-NULL, connected within 10 s.
 * Returns: the handle, or NULL.
 */
zhandle_t *cerb_test_zk_connect(const char *hosts, const char *auth);
void cerb_test_zk_close(zhandle_t *zh);

/* Children of `path` (sorted), or -1 with the ZooKeeper code in *rc.
 * Names go to out (may be NULL); free them with deallocate_String_vector. */
int cerb_test_zk_children(zhandle_t *zh, const char *path, struct String_vector *out, int *rc);

/* "<root>/<name>", malloc'd. */
char *cerb_test_zk_lock_path(const char *name);

/* The engine's fence offset node for CERB_TEST_ZK_ROOT (a sibling of the
 * root, engine_zk/zk_fence.c). */
#define CERB_TEST_ZK_FENCE_PATH "/cerberus/fence-offset"

/* The offset that node holds now (its decimal data); 0 when it does not
 * exist (yet). *mzxid (may be NULL) gets its mzxid, 0 when missing. */
uint64_t cerb_test_zk_fence_offset(zhandle_t *zh, int64_t *mzxid);

/* PID of the test server on `port` (scripts/servers.sh's PID file), or -1. */
pid_t cerb_test_zk_pid(int port);

/* SIGSTOP / SIGCONT the server on `port` and wait until the kernel says so
 * (a paused server is resumed at exit if a test forgets). 0 or -1. */
int cerb_test_zk_pause(int port);
int cerb_test_zk_resume(int port);

/* `scripts/servers.sh <cmd> zk --port <port> --nodes <nodes>`, 60 s
 * deadline. Returns its exit status (see cerb_test_run). */
int cerb_test_zk_servers(const char *cmd, int port, int nodes);

/* The `srvr` mode of the server on `port` ("leader", "follower",
 * "standalone"), written to mode; 0, or -1 when it does not answer in 2 s. */
int cerb_test_zk_mode(int port, char *mode, size_t len);

/*
 * Compile the .java files of tests/interop/curator into a fresh directory under
 * $CERB_BUILD_DIR (javac, 120 s deadline) and return the classpath to run
 * them with (Debian's Curator jars, slf4j-nop, that directory), malloc'd;
 * NULL when javac or the jars are missing or compilation failed (why on
 * stderr). *dir receives the directory (malloc'd) for
 * cerb_test_remove_tree().
 */
char *cerb_test_curator_classpath(char **dir);

/* rm -rf a directory made by the helpers above, and free(dir). */
void cerb_test_remove_tree(char *dir);

/* ---- a child process spoken to line by line ---- */

struct cerb_test_proc {
    pid_t pid;
    FILE *in;   /* its stdin */
    int out_fd; /* its stdout */
    char buf[8192];
    size_t len;
};

/* Start argv (PATH searched) with pipes on stdin and stdout; stderr is
 * inherited. 0, or -1. */
int cerb_test_proc_start(struct cerb_test_proc *p, char *const argv[]);
/* Send one line (a newline is added). 0, or -1. */
int cerb_test_proc_send(struct cerb_test_proc *p, const char *line);
/* The next line of its stdout within timeout_ms (without the newline),
 * malloc'd; NULL on timeout or end of output. */
char *cerb_test_proc_line(struct cerb_test_proc *p, int64_t timeout_ms);
/* Close its stdin, wait timeout_ms for it to exit (then SIGKILL). Exit
 * status as cerb_test_wait(). */
int cerb_test_proc_end(struct cerb_test_proc *p, int64_t timeout_ms);

#endif
