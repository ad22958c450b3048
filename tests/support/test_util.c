/*
 * test_util.c — helpers shared by the cmocka suites (see test_util.h).
 *
 * Every wait here is a poll under a deadline on CLOCK_MONOTONIC: the pause
 * between polls starts at 1 ms and doubles up to 20 ms, so a condition that
 * turns true quickly is seen quickly while a long wait does not spin. This is
 * the one place tests may nanosleep, and only as a poll interval: the result
 * never depends on how long the pause was, only on the condition.
 *
 * Server PIDs come from the PID files scripts/servers.sh writes, so a test
 * signals exactly the server its fixture started. A paused server is always
 * resumed at exit (atexit), because a failed cmocka assertion jumps over the
 * test's own resume call and would leave the server stopped for every later
 * test in the suite.
 *
 * A child that runs the suite's own code while the suite has threads is
 * the suite's binary started again in a role (cerb_test_spawn_self), not a
 * fork: it begins with one thread and no inherited locks, keeps only the
 * descriptors it is given, and dies with its parent, so neither a lock
 * held at the fork nor ThreadSanitizer's refusal of threads in such a
 * child can leave the parent waiting on it.
 */
#include "internal_posix.h"

#include "test_util.h"

#include "cerberus.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h> /* cmocka.h wants these first */
#include <stddef.h>
#include <cmocka.h>

#define POLL_MIN_MS 1
#define POLL_MAX_MS 20
#define STATE_DIR_MAX 4096

void cerb_test_debug_aids(void)
{
    if (getenv("CERB_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CERB_TEST_FILTER"));
    if (getenv("CERB_TEST_DEBUG"))
        cerb_log_set(NULL, NULL, CERB_LOG_DEBUG);
}

int64_t cerb_test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cerb_test_let_time_pass(int64_t ms)
{
    int64_t until = cerb_test_now_ms() + ms;
    for (int64_t left = ms; left > 0; left = until - cerb_test_now_ms()) {
        struct timespec ts = {(time_t)(left / 1000), (long)(left % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Poll pause: a fixed interval, not synchronisation (see file comment). */
static void poll_pause(int64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Next poll interval: doubled, capped, and never past the deadline. */
static int64_t next_pause(int64_t *pause_ms, int64_t deadline_ms)
{
    int64_t left = deadline_ms - cerb_test_now_ms();
    int64_t p = *pause_ms < left ? *pause_ms : left;
    if (*pause_ms < POLL_MAX_MS)
        *pause_ms = *pause_ms * 2 > POLL_MAX_MS ? POLL_MAX_MS : *pause_ms * 2;
    return p > 0 ? p : 0;
}

bool wait_until(cerb_test_pred pred, void *ud, int64_t timeout_ms)
{
    int64_t deadline = cerb_test_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    int64_t pause = POLL_MIN_MS;
    for (;;) {
        if (pred(ud))
            return true;
        if (cerb_test_now_ms() >= deadline)
            return pred(ud);
        poll_pause(next_pause(&pause, deadline));
    }
}

/* ------------------------------------------------------------ environment */

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return (v && *v) ? v : def;
}

int cerb_test_redis_port(void)
{
    const char *v = getenv("CERB_REDIS_PORT");
    if (v && *v) {
        char *end;
        long p = strtol(v, &end, 10);
        if (*end == '\0' && p > 0 && p < 65536)
            return (int)p;
    }
    return 26379;
}

static char default_state_dir[64];
static pthread_once_t default_state_once = PTHREAD_ONCE_INIT;

static void init_default_state_dir(void)
{
    snprintf(default_state_dir, sizeof default_state_dir,
             "/tmp/cerberus-servers-%lu", (unsigned long)getuid());
}

const char *cerb_test_state_dir(void)
{
    /* Same default as scripts/servers.sh: /tmp/cerberus-servers-$UID. */
    const char *v = getenv("CERB_STATE_DIR");
    if (v && *v)
        return v;
    pthread_once(&default_state_once, init_default_state_dir);
    return default_state_dir;
}

const char *cerb_test_source_dir(void) { return env_or("CERB_SOURCE_DIR", "."); }
const char *cerb_test_build_dir(void) { return env_or("CERB_BUILD_DIR", "."); }
const char *cerb_test_python(void)
{
    return env_or("CERB_PYTHON", "/usr/bin/python3");
}

/* ------------------------------------------------------------------ names */

static atomic_uint name_counter;

char *test_name(const char *prefix)
{
    uint32_t rnd = 0;
    /* getrandom never fails for 4 bytes once the pool is initialised; if it
     * somehow does, the pid and counter alone are still unique per run. */
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd = (uint32_t)cerb_test_now_ms();
    unsigned n = atomic_fetch_add(&name_counter, 1u) + 1u;
    const char *p = prefix ? prefix : "t";
    int len = snprintf(NULL, 0, "%s-%ld-%u-%08x", p, (long)getpid(), n,
                       (unsigned)rnd);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, "%s-%ld-%u-%08x", p, (long)getpid(), n,
                 (unsigned)rnd);
    return s;
}

/* ---------------------------------------------------------------- configs */

char *cerb_test_write_config(const char *fmt, ...)
{
    const char *tmp = env_or("TMPDIR", "/tmp");
    size_t n = strlen(tmp) + sizeof "/cerb-test-XXXXXX.cfg";
    char *path = malloc(n);
    if (!path)
        return NULL;
    snprintf(path, n, "%s/cerb-test-XXXXXX.cfg", tmp);
    int fd = mkstemps(path, 4);
    if (fd < 0) {
        int e = errno;
        free(path);
        errno = e;
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int e = errno;
        close(fd);
        cerb_test_remove_file(path);
        errno = e;
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vfprintf(f, fmt, ap);
    va_end(ap);
    if (fclose(f) != 0 || w < 0) {
        int e = errno;
        cerb_test_remove_file(path);
        errno = e ? e : EIO;
        return NULL;
    }
    return path;
}

char *cerb_test_redis_config(const char *redis_extra, const char *extra)
{
    static const char fmt[] =
        "engines = (\"redis\");\n"
        "redis = { host = \"127.0.0.1\"; port = %d; %s };\n"
        "%s\n";
    const char *re = redis_extra ? redis_extra : "";
    const char *ex = extra ? extra : "";
    int port = cerb_test_redis_port();
    int len = snprintf(NULL, 0, fmt, port, re, ex);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, fmt, port, re, ex);
    return s;
}

void cerb_test_remove_file(char *path)
{
    if (!path)
        return;
    unlink(path);
    free(path);
}

/* -------------------------------------------------------- child processes */

/* Child side of spawn/fork: own process group (so a timeout kills all it
 * started), stdin from /dev/null (a child must never wait on the tty). */
static void child_setup(void)
{
    setpgid(0, 0);
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, STDIN_FILENO);
        if (fd != STDIN_FILENO)
            close(fd);
    }
}

pid_t cerb_test_spawn(char *const argv[])
{
    if (!argv || !argv[0]) {
        errno = EINVAL;
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        child_setup();
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pid); /* also from the parent: no race with the kill */
    return pid;
}

pid_t cerb_test_fork(int (*fn)(void *ud), void *ud)
{
    if (!fn) {
        errno = EINVAL;
        return -1;
    }
    fflush(NULL); /* or buffered output would be written twice */
    pid_t pid = fork();
    if (pid == 0) {
        child_setup();
        int rc = fn(ud);
        fflush(NULL);
        _exit(rc & 0xff);
    }
    if (pid > 0)
        setpgid(pid, pid);
    return pid;
}

extern char **environ;

#define ROLE_FLAG "--cerb-test-role"
#define ROLE_MAX_ARGS 32
#define ROLE_MAX_FDS 16

/* Child side of cerb_test_spawn_self, between fork and exec: only
 * async-signal-safe calls (the parent may have threads). Closes every
 * descriptor from 3 up but the sorted @keep (n of them). */
static void close_all_but(const int *keep, int n)
{
    unsigned lo = 3;
    for (int i = 0; i <= n; i++) {
        unsigned hi = i < n ? (unsigned)keep[i] : ~0U;
        if (hi > lo && syscall(SYS_close_range, lo, hi - 1, 0) != 0) {
            /* Kernels before 5.9: one by one, up to a bound. */
            for (unsigned fd = lo; fd < hi && fd < 65536; fd++)
                close((int)fd);
        }
        if (i < n)
            lo = (unsigned)keep[i] + 1;
    }
}

pid_t cerb_test_spawn_self(const char *role, char *const args[], const int keep_fds[])
{
    if (getenv("CERB_TEST_ROLE")) {
        errno = EPERM;
        return -1;
    }
    /* Everything the child needs is built here, before the fork. */
    char *argv[ROLE_MAX_ARGS + 4];
    int argc = 0;
    argv[argc++] = "/proc/self/exe";
    argv[argc++] = ROLE_FLAG;
    argv[argc++] = (char *)role;
    for (int i = 0; args && args[i]; i++) {
        if (i == ROLE_MAX_ARGS) {
            errno = E2BIG;
            return -1;
        }
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;
    int keep[ROLE_MAX_FDS], nkeep = 0;
    for (int i = 0; keep_fds && keep_fds[i] >= 0; i++) {
        if (nkeep == ROLE_MAX_FDS) {
            errno = E2BIG;
            return -1;
        }
        int fd = keep_fds[i], j = nkeep++;
        for (; j > 0 && keep[j - 1] > fd; j--) /* sorted, for close_all_but */
            keep[j] = keep[j - 1];
        keep[j] = fd;
    }
    if (access("/proc/self/exe", X_OK) != 0)
        return -1;
    /* The environment plus CERB_TEST_ROLE, in an array of its own: setenv()
     * would race with the getenv() of this process's other threads. */
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = malloc((nenv + 2) * sizeof *envp);
    size_t rlen = strlen("CERB_TEST_ROLE=") + strlen(role) + 1;
    char *mark = malloc(rlen);
    if (!envp || !mark) {
        free(envp);
        free(mark);
        errno = ENOMEM;
        return -1;
    }
    snprintf(mark, rlen, "CERB_TEST_ROLE=%s", role);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++) {
        if (strncmp(environ[i], "CERB_TEST_ROLE=", 15) != 0)
            envp[k++] = environ[i];
    }
    envp[k++] = mark;
    envp[k] = NULL;

    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    int e = errno;
    if (pid == 0) {
        child_setup();
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the parent died before the prctl */
            _exit(126);
        close_all_but(keep, nkeep);
        for (int i = 0; i < nkeep; i++) /* pipes are often made O_CLOEXEC */
            fcntl(keep[i], F_SETFD, 0);
        execve(argv[0], argv, envp);
        _exit(127);
    }
    free(envp);
    free(mark);
    if (pid > 0)
        setpgid(pid, pid);
    errno = e;
    return pid;
}

void cerb_test_roles(int argc, char **argv, const struct cerb_test_role roles[])
{
    if (argc < 3 || strcmp(argv[1], ROLE_FLAG) != 0)
        return;
    for (int i = 0; roles[i].name; i++) {
        if (strcmp(roles[i].name, argv[2]) == 0) {
            int rc = roles[i].main(argc - 3, argv + 3);
            fflush(NULL);
            _exit(rc & 0xff);
        }
    }
    fprintf(stderr, "%s: no role '%s' in this suite\n", argv[0], argv[2]);
    _exit(127);
}

ssize_t cerb_test_read_within(int fd, void *buf, size_t n, int64_t timeout_ms)
{
    int64_t deadline = cerb_test_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    size_t got = 0;
    while (got < n) {
        int64_t left = deadline - cerb_test_now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r <= 0)
            continue;
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k < 0 && errno != EINTR && errno != EAGAIN)
            return -1;
        if (k == 0)
            break;
        if (k > 0)
            got += (size_t)k;
    }
    return (ssize_t)got;
}

static int decode_status(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return CERB_TEST_CHILD_ERROR;
}

int cerb_test_wait(pid_t pid, int64_t timeout_ms)
{
    if (pid <= 0) {
        errno = EINVAL;
        return CERB_TEST_CHILD_ERROR;
    }
    int st;
    if (timeout_ms < 0) {
        pid_t r;
        while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
        }
        return r == pid ? decode_status(st) : CERB_TEST_CHILD_ERROR;
    }
    int64_t deadline = cerb_test_now_ms() + timeout_ms;
    int64_t pause = POLL_MIN_MS;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return decode_status(st);
        if (r < 0 && errno != EINTR)
            return CERB_TEST_CHILD_ERROR;
        if (cerb_test_now_ms() >= deadline)
            break;
        poll_pause(next_pause(&pause, deadline));
    }
    /* Deadline: kill the child's whole group and reap the child, so no test
     * leaves a process behind. */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return CERB_TEST_CHILD_TIMEOUT;
}

int cerb_test_run(char *const argv[], int64_t timeout_ms)
{
    pid_t pid = cerb_test_spawn(argv);
    if (pid < 0)
        return CERB_TEST_CHILD_ERROR;
    return cerb_test_wait(pid, timeout_ms);
}

int cerb_test_servers_run(const char *cmd, const char *what, int port, int64_t timeout_ms)
{
    char script[STATE_DIR_MAX];
    char p[16];
    snprintf(script, sizeof script, "%s/scripts/servers.sh",
             cerb_test_source_dir());
    snprintf(p, sizeof p, "%d", port);
    char *argv[] = {"bash", script, (char *)cmd, (char *)what, "--port", p, NULL};
    return cerb_test_run(argv, timeout_ms);
}

int cerb_test_servers(const char *cmd)
{
    return cerb_test_servers_run(cmd, "redis", cerb_test_redis_port(), 30000);
}

int cerb_test_env_port(const char *var, int def)
{
    const char *s = getenv(var);
    int p = s ? atoi(s) : 0;
    return p > 0 && p < 65000 ? p : def;
}

/* ----------------------------------------------------- pausing the server */

/* One-letter process state from /proc/<pid>/stat ('R', 'S', 'T', 'Z'...), or
 * 0 when the process does not exist. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name is in parentheses and may hold spaces or ')': the
     * state is the character after the last ") ". */
    char *rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ' || rp[2] == '\0')
        return 0;
    return rp[2];
}

pid_t cerb_test_server_pid(const char *engine, int port)
{
    char path[STATE_DIR_MAX];
    snprintf(path, sizeof path, "%s/%s-%d.pid", cerb_test_state_dir(), engine, port);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long pid = -1;
    if (fscanf(f, "%ld", &pid) != 1)
        pid = -1;
    fclose(f);
    if (pid <= 0)
        return -1;
    char st = proc_state((pid_t)pid);
    if (st == 0 || st == 'Z' || st == 'X')
        return -1;
    return (pid_t)pid;
}

/* PIDs we paused and have not resumed yet (0 = free slot), resumed at exit
 * should a failed assertion skip the resume. */
#define MAX_PAUSED 64
static pid_t paused[MAX_PAUSED];
static pthread_mutex_t paused_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t resume_once = PTHREAD_ONCE_INIT;

static void resume_at_exit(void)
{
    pthread_mutex_lock(&paused_mu);
    for (int i = 0; i < MAX_PAUSED; i++)
        if (paused[i] > 0) {
            kill(paused[i], SIGCONT);
            paused[i] = 0;
        }
    pthread_mutex_unlock(&paused_mu);
}

static void register_resume_at_exit(void) { atexit(resume_at_exit); }

static bool is_stopped(void *ud)
{
    return proc_state(*(pid_t *)ud) == 'T';
}

static bool is_running(void *ud)
{
    char st = proc_state(*(pid_t *)ud);
    return st != 'T' && st != 't';
}

int cerb_test_pause_pid(pid_t pid)
{
    if (pid <= 0)
        return -1;
    pthread_once(&resume_once, register_resume_at_exit);
    pthread_mutex_lock(&paused_mu);
    for (int i = 0; i < MAX_PAUSED; i++)
        if (paused[i] <= 0 || paused[i] == pid) {
            paused[i] = pid;
            break;
        }
    pthread_mutex_unlock(&paused_mu);
    if (kill(pid, SIGSTOP) != 0)
        return -1;
    /* kill() returns before the stop takes effect: wait until it has. */
    return wait_until(is_stopped, &pid, 5000) ? 0 : -1;
}

int cerb_test_resume_pid(pid_t pid)
{
    if (pid <= 0)
        return -1;
    pthread_mutex_lock(&paused_mu);
    for (int i = 0; i < MAX_PAUSED; i++)
        if (paused[i] == pid)
            paused[i] = 0;
    pthread_mutex_unlock(&paused_mu);
    if (kill(pid, SIGCONT) != 0)
        return -1;
    return wait_until(is_running, &pid, 5000) ? 0 : -1;
}

pid_t cerb_test_redis_pid(void) { return cerb_test_server_pid("redis", cerb_test_redis_port()); }

int cerb_test_redis_pause(void) { return cerb_test_pause_pid(cerb_test_redis_pid()); }

int cerb_test_redis_resume(void) { return cerb_test_resume_pid(cerb_test_redis_pid()); }

cerb_client *cerb_test_open(const char *text)
{
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, text);
    if (st != CERB_OK)
        fprintf(stderr, "open: %s: %s\n", cerb_status_name(st), cerb_last_error());
    return c;
}

cerb_lock *cerb_test_handle(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    cerb_status st = cerb_lock_new(c, name, NULL, &l);
    if (st != CERB_OK)
        fprintf(stderr, "lock_new \"%s\": %s: %s\n", name, cerb_status_name(st),
                cerb_last_error());
    return l;
}
