/*
 * test_util.h — small helpers every suite may use: waiting on a condition
 * with a deadline (never a sleep to synchronise), the test server's port and
 * PID from the environment ctest sets, unique lock names so suites can share
 * one server in parallel, temporary config files, child processes with a
 * deadline, and pausing the test redis-server (SIGSTOP/SIGCONT).
 *
 * Environment (set by cerb_add_suite in cmake/CerbTesting.cmake):
 *   CERB_REDIS_PORT  port of this suite's redis-server (default 26379)
 *   CERB_STATE_DIR   where scripts/servers.sh keeps PID files
 *                    (default /tmp/cerberus-servers-$UID, as servers.sh)
 *   CERB_SOURCE_DIR, CERB_BUILD_DIR, CERB_PYTHON
 *
 * Ownership: functions returning `char *` return malloc'd memory the caller
 * frees with free(); LSan runs on every suite, so a forgotten free fails it.
 * Thread-safety: all functions are safe to call from any thread, except the
 * pause/resume pair, which a suite should drive from one thread.
 */
#ifndef CERB_TEST_UTIL_H
#define CERB_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#if defined(__GNUC__)
#define CERB_TEST_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CERB_TEST_PRINTF(f, a)
#endif

/*
 * cerb_test_debug_aids — for a suite's main, before its tests run:
 * CERB_TEST_FILTER=<glob> runs only the tests whose names match, and
 * CERB_TEST_DEBUG=1 turns the library's debug log on.
 */
void cerb_test_debug_aids(void);

/* ------------------------------------------------------------- waiting */

/* A condition polled by wait_until(); returns true once it holds. */
typedef bool (*cerb_test_pred)(void *ud);

/*
 * wait_until — poll @pred(@ud) until it returns true or @timeout_ms passes on
 * the monotonic clock. The pause between polls grows from 1 ms to 20 ms; it is
 * a poll interval under a deadline, not a synchronising sleep.
 * Returns: true when the predicate held (checked once more at the deadline),
 * false on timeout.
 */
bool wait_until(cerb_test_pred pred, void *ud, int64_t timeout_ms);

/* assert_wait_until — cmocka assertion form of wait_until (include cmocka.h
 * first). */
#define assert_wait_until(pred, ud, timeout_ms)                                \
    assert_true(wait_until((pred), (ud), (timeout_ms)))

/* Monotonic milliseconds (for measuring in tests). */
int64_t cerb_test_now_ms(void);

/*
 * cerb_test_let_time_pass — let @ms of real time pass. Only where the time
 * itself is what a test checks (a lease or claim that must run out, a fault
 * that must last), or where a state nothing can observe must be reached;
 * never to wait for an event (wait_until does that).
 */
void cerb_test_let_time_pass(int64_t ms);

/* --------------------------------------------------------- environment */

/* $CERB_REDIS_PORT, or 26379. */
int cerb_test_redis_port(void);

/* $CERB_STATE_DIR, $CERB_SOURCE_DIR, $CERB_BUILD_DIR, $CERB_PYTHON, with the
 * defaults servers.sh / a source-tree build would use ("." for the dirs,
 * "/usr/bin/python3"). Returns: strings owned by the environment or static;
 * do not free. */
const char *cerb_test_state_dir(void);
const char *cerb_test_source_dir(void);
const char *cerb_test_build_dir(void);
const char *cerb_test_python(void);

/* --------------------------------------------------------------- names */

/*
 * test_name — a lock name no other test, suite or run uses:
 * "<prefix>-<pid>-<counter>-<8 random hex>", e.g. "mutex-4242-3-9f31c2aa".
 * Returns: a malloc'd string (free() it); NULL only on out of memory.
 */
char *test_name(const char *prefix);

/* ------------------------------------------------------------- configs */

/*
 * cerb_test_write_config — write printf(@fmt, ...) to a new file
 * "<TMPDIR>/cerb-test-XXXXXX.cfg".
 * Returns: the file's path (malloc'd) or NULL with errno set. Remove it with
 * cerb_test_remove_file(), which also frees the path.
 */
char *cerb_test_write_config(const char *fmt, ...) CERB_TEST_PRINTF(1, 2);

/*
 * cerb_test_redis_config — config text for one redis engine on this suite's
 * test server: `engines = ("redis"); redis = { host = "127.0.0.1";
 * port = <port>; <redis_extra> }; <extra>`. Either extra may be NULL.
 * E.g. cerb_test_redis_config("op_timeout_ms = 200;", "lock = { lease_ms = 1000; };")
 * Returns: malloc'd text (free() it), for cerb_client_open_string(); NULL on
 * out of memory.
 */
char *cerb_test_redis_config(const char *redis_extra, const char *extra);

/*
 * cerb_test_open — a client from configuration text, or NULL with the
 * status and cerb_last_error() printed on stderr (callers assert non-NULL).
 * cerb_test_handle — a handle on @name with default options, or NULL the
 * same way. Both are plain wrappers so suites stop repeating them.
 */
struct cerb_client;
struct cerb_lock;
struct cerb_client *cerb_test_open(const char *text);
struct cerb_lock *cerb_test_handle(struct cerb_client *c, const char *name);

/*
 * cerb_test_redis_namespace — a key prefix "<tag>-<unique>:" of the caller's
 * own on the redis at @port (0: cerb_test_redis_port()), with its data-loss
 * marker written as scripts/servers.sh writes the default one, so the first
 * grant under it does not wait a quarantine. For cases that write closure
 * records (a bumped epoch): those are one per prefix and would refuse other
 * suites' clients on the shared server.
 * Returns: malloc'd prefix, or NULL when the server could not be prepared.
 */
char *cerb_test_redis_namespace(const char *tag, int port);

/* unlink(@path) and free(@path). NULL does nothing. */
void cerb_test_remove_file(char *path);

/* ---------------------------------------------------- child processes */

/* Exit codes from cerb_test_wait()/cerb_test_run() that are not the child's: */
#define CERB_TEST_CHILD_TIMEOUT (-2) /* deadline passed; the child was killed */
#define CERB_TEST_CHILD_ERROR (-1)   /* fork/exec/wait failed (errno kept) */

/*
 * cerb_test_spawn — start @argv[0] (PATH searched) with @argv, stdin from
 * /dev/null, stdout/stderr inherited. The child runs in its own process
 * group so cerb_test_wait() can kill whatever it started.
 * Returns: the child's PID, or -1. The child execs a program that does not
 * exist → it exits with 127.
 */
pid_t cerb_test_spawn(char *const argv[]);

/*
 * cerb_test_fork — run @fn(@ud) in a forked child and _exit() with its
 * return value (exit() handlers and cmocka's state are bypassed). Only
 * async-signal-safe work is strictly safe in the child of a threaded parent,
 * and under ThreadSanitizer it dies at its first thread: fork before any
 * thread exists (a test of what a fork inherits), else use a role
 * (cerb_test_spawn_self below).
 * Returns: the child's PID, or -1.
 */
pid_t cerb_test_fork(int (*fn)(void *ud), void *ud);

/*
 * Roles: children that run this suite's own code in a fresh process image.
 * A forked copy of a process with threads (a client's I/O threads, a
 * janitor) inherits locks those threads may hold, and ThreadSanitizer kills
 * such a child at its first thread ("starting new threads after
 * multi-threaded fork is not supported"). So a child that opens clients is
 * started as the suite's binary again (/proc/self/exe), single-threaded,
 * told which role to play on its command line; main() hands over to it
 * first thing:
 *
 *     static const struct cerb_test_role roles[] = {{"child", child_main}, {NULL, NULL}};
 *     int main(int argc, char **argv)
 *     {
 *         cerb_test_roles(argc, argv, roles);
 *         ...
 *
 * A role gets strings only: what it needs from the parent (a config text,
 * a key, pipe descriptors kept across the exec) comes as arguments.
 */
struct cerb_test_role {
    const char *name;
    int (*main)(int argc, char **argv); /* the role's arguments only */
};

/*
 * cerb_test_spawn_self — start this suite's binary as @role with @args
 * (NULL-terminated; NULL for none). The child keeps descriptors 0-2 and
 * those in @keep_fds (ended by -1; NULL for none) at the same numbers;
 * every other descriptor is closed. It runs in its own process group (as
 * cerb_test_spawn), has CERB_TEST_ROLE=@role in its environment, and is
 * killed when the thread that spawned it exits (PR_SET_PDEATHSIG), so a
 * failed assertion in the parent cannot leave it blocked forever. A role
 * cannot spawn roles (errno EPERM): a suite whose main() forgot the
 * hand-over would otherwise run itself again and again.
 * Returns: the child's PID, or -1 (errno).
 */
pid_t cerb_test_spawn_self(const char *role, char *const args[], const int keep_fds[]);

/*
 * cerb_test_roles — when this process was started by cerb_test_spawn_self(),
 * run its role from @roles (ended by a NULL name) with the role's
 * arguments, and end the process with the role's status (127 for an
 * unknown role) by _exit(), as a forked child ends: no exit handlers, so
 * neither cmocka's nor LeakSanitizer's check at exit (a child whose
 * ZooKeeper session expired holds the C client's upstream leak,
 * ZOOKEEPER-2894, see tests/chaos/lsan.supp).
 * Returns: only when this process is not a role (the suite goes on).
 */
void cerb_test_roles(int argc, char **argv, const struct cerb_test_role roles[]);

/*
 * cerb_test_read_within — read @n bytes from @fd, waiting at most
 * @timeout_ms in all (poll on the monotonic clock): a child that died or
 * hangs fails the test instead of blocking it.
 * Returns: @n; fewer at end of file (the writer closed or died); -1 on
 * error or at the deadline (errno ETIMEDOUT).
 */
ssize_t cerb_test_read_within(int fd, void *buf, size_t n, int64_t timeout_ms);

/*
 * cerb_test_wait — wait at most @timeout_ms (negative: forever) for child
 * @pid. On the deadline the child's process group gets SIGKILL and is
 * reaped.
 * Returns: the exit status (0..255), 128 + signal number when killed by a
 * signal, CERB_TEST_CHILD_TIMEOUT, or CERB_TEST_CHILD_ERROR.
 */
int cerb_test_wait(pid_t pid, int64_t timeout_ms);

/* cerb_test_run — cerb_test_spawn() then cerb_test_wait(). Same returns. */
int cerb_test_run(char *const argv[], int64_t timeout_ms);

/*
 * cerb_test_servers — run `scripts/servers.sh @cmd redis --port <port>` for
 * this suite's server (restart it after a test stopped it: "start").
 * Returns: the script's exit status as cerb_test_run() does (30 s deadline).
 */
int cerb_test_servers(const char *cmd);

/* The same for any deployment servers.sh knows (@what: "redis", "sentinel",
 * "cluster", "zk", …) on base port @port, with its own deadline. */
int cerb_test_servers_run(const char *cmd, const char *what, int port, int64_t timeout_ms);

/* A port from environment variable @var (CERB_SENTINEL_PORT, …), or @def
 * when it is unset or not a port. */
int cerb_test_env_port(const char *var, int def);

/* ------------------------------------------------- pausing the server */

/*
 * cerb_test_server_pid — PID of a test server of @engine ("redis", "zk",
 * "etcd") on @port, read from "<CERB_STATE_DIR>/<engine>-<port>.pid"
 * (scripts/servers.sh). Returns: the PID, or -1 when it is not alive.
 */
pid_t cerb_test_server_pid(const char *engine, int port);

/*
 * cerb_test_pause_pid / cerb_test_resume_pid — SIGSTOP (SIGCONT) @pid and
 * wait until the kernel reports it stopped (running). A paused process is
 * also resumed at exit, should a failed assertion skip the resume.
 * Returns: 0, or -1.
 */
int cerb_test_pause_pid(pid_t pid);
int cerb_test_resume_pid(pid_t pid);

/*
 * cerb_test_redis_pid — PID of this suite's redis-server, read from
 * "<CERB_STATE_DIR>/redis-<port>.pid" written by scripts/servers.sh.
 * Returns: the PID, or -1 when there is no such (live) server.
 */
pid_t cerb_test_redis_pid(void);

/*
 * cerb_test_redis_pause — SIGSTOP this suite's redis-server and wait (with a
 * deadline) until the kernel reports it stopped, so the very next request
 * is sure to go unanswered. A paused server is resumed by
 * cerb_test_redis_resume(), and — should a failed assertion skip that — at
 * process exit (atexit), so one failing test does not starve the others.
 * Only for suites that own their server (see tests/CMakeLists.txt: name the
 * file *_pause* or *fault*, or put it in tests/fault/).
 * Returns: 0, or -1 when the server's PID is unknown or it did not stop.
 */
int cerb_test_redis_pause(void);

/* cerb_test_redis_resume — SIGCONT it and wait until it runs again.
 * Returns: 0, or -1. Resuming a running server is a no-op that returns 0. */
int cerb_test_redis_resume(void);

#endif /* CERB_TEST_UTIL_H */
