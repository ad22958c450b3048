/*
 * cmd_run.c — `cerberus run [-n | -w MS] [--on-lost kill|ignore] [--lease MS]
 * NAME -- CMD [ARG...]`: hold lock NAME while CMD runs, the flock(1) habit
 * for jobs that must run once across hosts.
 *
 * Sequence:
 *  1. Block the signals we handle (INT TERM HUP QUIT USR1 USR2 ALRM CHLD)
 *     before the client starts its threads, so every thread inherits the
 *     mask and the signals are only ever read from one signalfd. A signal
 *     that was ignored when we started (nohup, background jobs) is left
 *     ignored. TTOU is
 *     blocked too, so that we may hand the terminal to CMD and take it back
 *     while in the background.
 *  2. Acquire: -n is one attempt, -w MS waits at most MS, and by default the
 *     wait is unbounded but interruptible. A helper thread watches the
 *     signalfd during the wait; INT, TERM, HUP or QUIT interrupt the wait
 *     (cerb_lock_interrupt) and the command exits 75 without running CMD,
 *     as it does when the lock is not obtained.
 *  3. Start CMD with fork+exec in a process group of its own, so signals and
 *     a kill reach its children too; when we are the foreground job of a
 *     terminal, the terminal is handed to that group (and taken back if CMD
 *     stops, so Ctrl-Z suspends the pair). An exec failure comes back over a
 *     close-on-exec pipe and gives 127 (not found) or 126. Descriptors the
 *     library opened (server connections) are marked close-on-exec in the
 *     child; those we were started with are passed on untouched. CMD gets
 *     CERBERUS_LOCK_NAME and CERBERUS_FENCING_TOKEN in its environment, the
 *     latter to hand to the storage it writes. With --on-lost kill the child
 *     also asks the kernel for SIGTERM should cerberus itself die, since it
 *     would then run unprotected.
 *  4. Supervise with poll() on the signalfd and a pipe the lost callback
 *     writes: the callback runs on a library thread and only sets a flag and
 *     writes one byte, the main loop does the rest. Signals we receive are
 *     forwarded to CMD's process group. A lost lock with --on-lost kill
 *     sends SIGTERM to the group and SIGKILL after the grace (--grace,
 *     default 5 s); with --on-lost ignore it is reported and CMD goes on.
 *  5. When CMD is reaped, release (from the thread that acquired, since holds
 *     are per thread) and exit with CMD's status: its exit code, 128+N when
 *     it died of signal N, or 76 if the lock was lost (callback, or the
 *     release finding it lost) and --on-lost is kill.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "cli.h"

extern char **environ;

const char cerb__cli_run_usage[] =
    "Usage: cerberus [-c FILE] run [-n | -w MS] [--on-lost kill|ignore]\n"
    "                [--lease MS] [--grace MS] [-v] NAME -- CMD [ARG...]\n"
    "\n"
    "Hold lock NAME while CMD runs, renewing it, and release it when CMD\n"
    "exits. Only one `cerberus run NAME` at a time runs its CMD, across every\n"
    "host that shares the configuration's engines.\n"
    "\n"
    "Options:\n"
    "  -n, --no-wait         one attempt; exit 75 at once if NAME is held\n"
    "  -w, --wait MS         wait at most MS milliseconds, then exit 75\n"
    "                        (default: wait until obtained)\n"
    "  --on-lost kill        if the lock is lost while CMD runs, send CMD's\n"
    "                        process group SIGTERM, SIGKILL after the grace,\n"
    "                        and exit 76 (the default)\n"
    "  --on-lost ignore      report the loss on stderr and let CMD finish\n"
    "  --lease MS            server-side lease, renewed at a third of it\n"
    "                        (default: lock.lease_ms of the configuration)\n"
    "  --grace MS            SIGTERM to SIGKILL delay on loss (default 5000)\n"
    "  -v, --verbose         report the hold and the release on stderr\n"
    "\n"
    "CMD runs in its own process group (the terminal's foreground group when\n"
    "cerberus was), with CERBERUS_LOCK_NAME and CERBERUS_FENCING_TOKEN set.\n"
    "SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM sent to\n"
    "cerberus are forwarded to that group. While waiting for the lock,\n"
    "SIGINT, SIGTERM, SIGHUP or SIGQUIT abandon the wait (exit 75). Nothing\n"
    "is printed on success without -v, nor when the lock is not obtained.\n"
    "Without a configuration file the lock is the in-process \"local\" engine,\n"
    "which excludes nothing across processes unless local.dir is set.\n"
    "\n"
    "Exit status: CMD's exit status, or 128+N if it died of signal N;\n"
    "75 the lock was not obtained (held, -w expired, wait interrupted);\n"
    "76 the lock was lost while CMD ran (--on-lost kill); 69 no engine\n"
    "reachable; 78 configuration error; 126/127 CMD could not be run;\n"
    "64 usage.\n";

#define DEFAULT_GRACE_MS 5000
#define FD_BITMAP_MAX 65536 /* descriptors above are left alone */
#define FD_SLACK 64         /* opened by library threads after our scan */

struct run_opts {
    const char *verb;  /* "run", or the command that borrowed the child code */
    const char *kind;  /* what can be lost: "lock", "attempt" */
    const char *name;
    char **cmd;
    bool try_only;
    int64_t wait_ms; /* -1: until obtained */
    bool kill_on_lost;
    int64_t lease_ms; /* 0: the configuration's */
    int64_t grace_ms;
    int verbose;
};

struct run_state {
    int sfd;             /* signalfd of `handled` */
    int lost_pipe[2];    /* the lost callback writes one byte */
    int stop_pipe[2];    /* ends the wait watcher */
    atomic_int lost;
    atomic_int wait_signal; /* signal that abandoned the wait, or 0 */
    cerb_lock *lock;
    sigset_t orig_mask;  /* restored in CMD */
    sigset_t handled;
    int tty;             /* terminal handed to CMD, or -1 */
    pid_t child;
    int fd_hi;           /* highest descriptor open just before fork */
};

/* Descriptors open when we started: CMD inherits these, and only these. */
static unsigned char inherited_fds[FD_BITMAP_MAX / 8];

static const int handled_signals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                                      SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD};

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGINT:
        return "SIGINT";
    case SIGTERM:
        return "SIGTERM";
    case SIGHUP:
        return "SIGHUP";
    case SIGQUIT:
        return "SIGQUIT";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGUSR2:
        return "SIGUSR2";
    case SIGALRM:
        return "SIGALRM";
    case SIGKILL:
        return "SIGKILL";
    default:
        return "a signal";
    }
}

/* Signals that end the wait for the lock. */
static bool ends_wait(int sig)
{
    return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- descriptors ---- */

static void fd_mark(int fd)
{
    if (fd >= 0 && fd < FD_BITMAP_MAX)
        inherited_fds[fd / 8] |= (unsigned char)(1u << (fd % 8));
}

static bool fd_inherited(int fd)
{
    return fd >= FD_BITMAP_MAX || (inherited_fds[fd / 8] & (1u << (fd % 8)));
}

/* The highest open descriptor; with @mark, records every open one. */
static int scan_fds(bool mark)
{
    DIR *d = opendir("/proc/self/fd");
    int hi = 2;

    if (!d) {
        for (int fd = 0; fd < 1024; fd++)
            if (fcntl(fd, F_GETFD) != -1) {
                if (mark)
                    fd_mark(fd);
                hi = fd;
            }
        return hi;
    }
    int self = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        int fd = atoi(e->d_name);
        if (fd == self)
            continue;
        if (mark)
            fd_mark(fd);
        if (fd > hi)
            hi = fd;
    }
    closedir(d);
    return hi;
}

/*
 * pipe() with both ends close-on-exec (and non-blocking with @nonblock).
 * pipe2() would do it in one call but is a GNU extension in this libc; no
 * thread of ours forks, so the gap between the calls cannot leak a pipe.
 */
static int make_pipe(int p[2], bool nonblock)
{
    if (pipe(p) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        if (fcntl(p[i], F_SETFD, FD_CLOEXEC) != 0 ||
            (nonblock && fcntl(p[i], F_SETFL, O_NONBLOCK) != 0)) {
            int e = errno;
            close(p[0]);
            close(p[1]);
            errno = e;
            return -1;
        }
    }
    return 0;
}

/* ---- options ---- */

/* cli.h */
int cerb__cli_opt_val(int argc, char **argv, int *i, const char *lng, const char *shrt,
                      const char **val)
{
    const char *a = argv[*i];
    size_t ll = strlen(lng);

    if (strcmp(a, lng) == 0 || (shrt && strcmp(a, shrt) == 0)) {
        if (*i + 1 >= argc)
            return -1;
        *val = argv[++*i];
        return 1;
    }
    if (strncmp(a, lng, ll) == 0 && a[ll] == '=') {
        *val = a + ll + 1;
        return 1;
    }
    if (shrt && strncmp(a, shrt, 2) == 0 && a[2] != '\0') {
        *val = a + 2;
        return 1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct run_opts *o, bool *help)
{
    const char *v;
    bool wait_set = false;
    int i, m;

    o->verb = "run";
    o->kind = "lock";
    o->wait_ms = -1;
    o->kill_on_lost = true;
    o->grace_ms = DEFAULT_GRACE_MS;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (cerb__cli_is_help(a)) {
            *help = true;
            return 0;
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--no-wait") == 0) {
            o->try_only = true;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->verbose++;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--wait", "-w", &v)) != 0) {
            if (m < 0 || !cerb__cli_parse_ms(v, 0, INT64_MAX / 2, &o->wait_ms))
                return cerb__cli_usage_error("run", "-w needs a number of milliseconds");
            wait_set = true;
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--on-lost", NULL, &v)) != 0) {
            if (m > 0 && strcmp(v, "kill") == 0)
                o->kill_on_lost = true;
            else if (m > 0 && strcmp(v, "ignore") == 0)
                o->kill_on_lost = false;
            else
                return cerb__cli_usage_error("run", "--on-lost takes kill or ignore");
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--lease", NULL, &v)) != 0) {
            if (m < 0 || !cerb__cli_parse_ms(v, 100, 86400000, &o->lease_ms))
                return cerb__cli_usage_error("run", "--lease takes 100..86400000 milliseconds");
        } else if ((m = cerb__cli_opt_val(argc, argv, &i, "--grace", NULL, &v)) != 0) {
            if (m < 0 || !cerb__cli_parse_ms(v, 0, 86400000, &o->grace_ms))
                return cerb__cli_usage_error("run", "--grace takes 0..86400000 milliseconds");
        } else if (a[0] == '-' && a[1] != '\0') {
            return cerb__cli_usage_error("run", "unknown option '%s'", a);
        } else {
            break;
        }
    }
    if (o->try_only && wait_set)
        return cerb__cli_usage_error("run", "-n and -w exclude each other");
    if (i >= argc)
        return cerb__cli_usage_error("run", "NAME is missing");
    o->name = argv[i++];
    if (!cerb__cli_name_ok(o->name))
        return cerb__cli_usage_error("run", "bad lock name (1-255 bytes, no control characters)");
    /* `--` before CMD is the documented form; a CMD not starting with '-'
     * is accepted without it. */
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    if (i >= argc)
        return cerb__cli_usage_error("run", "CMD is missing (NAME -- CMD [ARG...])");
    o->cmd = argv + i;
    return 0;
}

/* ---- signals and the wait ---- */

static int setup_signals(struct run_state *rs)
{
    sigset_t block;

    sigemptyset(&rs->handled);
    for (size_t i = 0; i < sizeof handled_signals / sizeof handled_signals[0]; i++) {
        int sig = handled_signals[i];
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) != 0)
            return -1;
        if (sa.sa_handler == SIG_IGN && sig == SIGCHLD) {
            /* Ignored SIGCHLD reaps children by itself: waitpid() would
             * never see CMD's status. */
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = SIG_DFL;
            sigemptyset(&sa.sa_mask);
            if (sigaction(SIGCHLD, &sa, NULL) != 0)
                return -1;
        } else if (sa.sa_handler == SIG_IGN) {
            /* Ignored when we started (nohup, a background job): stays
             * ignored, for us and for CMD. A blocked signal would be
             * queued even though ignored, so it is not blocked. */
            continue;
        }
        sigaddset(&rs->handled, sig);
    }
    block = rs->handled;
    sigaddset(&block, SIGTTOU);
    if (pthread_sigmask(SIG_BLOCK, &block, &rs->orig_mask) != 0)
        return -1;
    rs->sfd = signalfd(-1, &rs->handled, SFD_NONBLOCK | SFD_CLOEXEC);
    return rs->sfd < 0 ? -1 : 0;
}

/* Tell the supervisor: a flag and a byte, nothing more (a library
 * thread's callback calls it). */
static void mark_lost(struct run_state *rs)
{
    char b = 'L';

    atomic_store(&rs->lost, 1);
    if (write(rs->lost_pipe[1], &b, 1) < 0) {
        /* The pipe is non-blocking and one byte is enough: a full pipe
         * already says "lost". */
    }
}

static void on_lost(cerb_lock *l, void *ud)
{
    (void)l;
    mark_lost(ud);
}

/* Watches the signalfd while the main thread waits for the lock. */
static void *wait_watcher(void *ud)
{
    struct run_state *rs = ud;
    struct pollfd p[2] = {{rs->sfd, POLLIN, 0}, {rs->stop_pipe[0], POLLIN, 0}};

    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return NULL;
        }
        if (p[1].revents)
            return NULL;
        struct signalfd_siginfo si;
        while (read(rs->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            /* Before CMD exists there is nobody to forward the rest to. */
            if (ends_wait((int)si.ssi_signo)) {
                atomic_store(&rs->wait_signal, (int)si.ssi_signo);
                cerb_lock_interrupt(rs->lock);
                return NULL;
            }
        }
    }
}

static cerb_status acquire(struct run_state *rs, const struct run_opts *o)
{
    if (o->try_only)
        return cerb_lock_trylock(rs->lock);
    if (o->wait_ms >= 0)
        return cerb_lock_trylock_for(rs->lock, o->wait_ms);
    return cerb_lock_lock_interruptibly(rs->lock);
}

/* ---- the child ---- */

/*
 * Our environment without the variables we set for CMD (CERBERUS_LOCK_NAME,
 * CERBERUS_FENCING_TOKEN, and `elect`'s CERBERUS_ELECTION_NAME and
 * CERBERUS_LEADER_VALUE), then @own (fresh ones). The strings stay owned by
 * their owners.
 */
static char **child_env(char **own, size_t nown)
{
    size_t n = 0, k = 0;
    char **env;

    while (environ && environ[n])
        n++;
    env = calloc(n + nown + 1, sizeof *env);
    if (!env)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "CERBERUS_LOCK_NAME=", 19) != 0 &&
            strncmp(environ[i], "CERBERUS_FENCING_TOKEN=", 23) != 0 &&
            strncmp(environ[i], "CERBERUS_ELECTION_NAME=", 23) != 0 &&
            strncmp(environ[i], "CERBERUS_LEADER_VALUE=", 22) != 0)
            env[k++] = environ[i];
    for (size_t i = 0; i < nown; i++)
        env[k++] = own[i];
    env[k] = NULL;
    return env;
}

/* printf into a malloc'd string; NULL when out of memory. */
static char *str_printf(const char *fmt, ...) CERB_CLI_PRINTF(1, 2);

static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    int n;
    char *s;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(s = malloc((size_t)n + 1)))
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/*
 * Starts CMD. Returns 0, or the errno of a failed fork/exec in *err with
 * the child already reaped (*exec_failed tells which).
 */
static int spawn(struct run_state *rs, const struct run_opts *o, char **env,
                 bool *exec_failed)
{
    int ep[2], e = 0;
    ssize_t n;

    *exec_failed = false;
    if (make_pipe(ep, false) != 0)
        return errno;
    rs->fd_hi = scan_fds(false) + FD_SLACK;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        e = errno;
        close(ep[0]);
        close(ep[1]);
        return e;
    }
    if (pid == 0) {
        /* The child of a threaded parent: async-signal-safe calls only. */
        pid_t parent = getppid();
        setpgid(0, 0);
        if (rs->tty >= 0)
            tcsetpgrp(rs->tty, getpid()); /* TTOU is blocked: allowed */
#ifdef __linux__
        if (o->kill_on_lost) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent)
                _exit(CLI_EXIT_LOST); /* cerberus died already */
        }
#endif
        (void)parent;
        for (int fd = 3; fd <= rs->fd_hi; fd++)
            if (fd != ep[1] && !fd_inherited(fd))
                fcntl(fd, F_SETFD, FD_CLOEXEC);
        pthread_sigmask(SIG_SETMASK, &rs->orig_mask, NULL);
        environ = env;
        execvp(o->cmd[0], o->cmd);
        e = errno;
        if (write(ep[1], &e, sizeof e) < 0) {
            /* Nothing more a dying child can do. */
        }
        _exit(CLI_EXIT_NOT_FOUND);
    }
    close(ep[1]);
    /* EOF: exec succeeded (the pipe closed on exec); else the child's errno. */
    do
        n = read(ep[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    close(ep[0]);
    if (n == (ssize_t)sizeof e) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        if (rs->tty >= 0)
            tcsetpgrp(rs->tty, getpgrp()); /* it may have taken the terminal */
        *exec_failed = true;
        return e;
    }
    rs->child = pid;
    return 0;
}

/* CMD stopped (Ctrl-Z): stop with it, and on resume let it go on. */
static void follow_stop(struct run_state *rs)
{
    if (rs->tty < 0)
        return; /* not a job of ours: someone else stopped it */
    tcsetpgrp(rs->tty, getpgrp());
    kill(getpid(), SIGSTOP);
    /* Continued: `fg` gave us the terminal back, `bg` did not. */
    if (tcgetpgrp(rs->tty) == getpgrp())
        tcsetpgrp(rs->tty, rs->child);
    kill(-rs->child, SIGCONT);
}

/*
 * Runs until CMD is reaped; returns its wait status. Forwards signals,
 * acts on a lost lock.
 */
static int supervise(struct run_state *rs, const struct run_opts *o)
{
    struct pollfd p[2] = {{rs->sfd, POLLIN, 0}, {rs->lost_pipe[0], POLLIN, 0}};
    int64_t kill_at = -1;
    bool lost_seen = false;
    pid_t me = getpid();

    for (;;) {
        int timeout = -1;
        if (kill_at >= 0) {
            int64_t left = kill_at - mono_ms();
            timeout = left > 0 ? (int)(left < INT32_MAX ? left : INT32_MAX) : 0;
        }
        if (poll(p, 2, timeout) < 0) {
            /* Every signal we take is blocked, so EINTR means we were
             * stopped and continued; anything else: look at the child. */
            if (errno != EINTR)
                cerb__cli_error("run: poll: %s", strerror(errno));
            p[0].revents = errno == EINTR ? 0 : POLLIN;
            p[1].revents = 0;
        }
        if (kill_at >= 0 && mono_ms() >= kill_at) {
            cerb__cli_error("%s: %s: CMD still running %" PRId64 " ms after SIGTERM; "
                            "sending SIGKILL", o->verb, o->name, o->grace_ms);
            kill(-rs->child, SIGKILL);
            kill_at = -1;
        }
        if (p[1].revents) {
            char buf[64];
            while (read(rs->lost_pipe[0], buf, sizeof buf) > 0)
                ;
            if (!lost_seen) {
                lost_seen = true;
                if (o->kill_on_lost) {
                    cerb__cli_error("%s: %s %s lost; stopping CMD (SIGTERM, "
                                    "SIGKILL after %" PRId64 " ms)",
                                    o->verb, o->kind, o->name, o->grace_ms);
                    kill(-rs->child, SIGTERM);
                    kill_at = mono_ms() + o->grace_ms;
                } else {
                    cerb__cli_error("%s: %s %s lost; CMD goes on (--on-lost ignore)",
                                    o->verb, o->kind, o->name);
                }
            }
        }
        if (!p[0].revents)
            continue;
        struct signalfd_siginfo si;
        while (read(rs->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            int sig = (int)si.ssi_signo;
            if (sig == SIGCHLD)
                continue; /* reaped below, whatever the count */
            /* Our own group kill comes back to us when CMD shares our
             * terminal's signals; never echo it. */
            if ((pid_t)si.ssi_pid == me)
                continue;
            if (o->verbose)
                cerb__cli_error("%s: forwarding %s to CMD", o->verb, sig_name(sig));
            kill(-rs->child, sig);
        }
        for (;;) {
            int ws;
            pid_t r = waitpid(rs->child, &ws, WNOHANG | WUNTRACED);
            if (r < 0 && errno == EINTR)
                continue;
            if (r == rs->child && WIFSTOPPED(ws)) {
                follow_stop(rs);
                continue;
            }
            if (r == rs->child)
                return ws;
            if (r < 0) {
                /* ECHILD cannot happen for a child we have not reaped. */
                cerb__cli_error("run: waitpid: %s", strerror(errno));
                return W_EXITCODE(CLI_EXIT_SOFTWARE, 0);
            }
            break;
        }
    }
}

/* ---- the command ---- */

static void close_pair(int p[2])
{
    for (int i = 0; i < 2; i++)
        if (p[i] >= 0)
            close(p[i]);
    p[0] = p[1] = -1;
}

int cerb__cli_run_parse(int argc, char **argv)
{
    struct run_opts o;
    bool help = false;
    int rc;

    memset(&o, 0, sizeof o);
    rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_run_usage, stdout);
        return CLI_EXIT_OK;
    }
    return rc ? rc : -1;
}

int cerb__cli_run(const struct cerb__cli *cli, int argc, char **argv)
{
    struct run_opts o;
    struct run_state rs;
    cerb_client *client = NULL;
    cerb_lock_opts lopts = CERB_LOCK_OPTS_INIT;
    pthread_t watcher;
    bool watching = false, help = false, held = false;
    char **env = NULL, *own_env[2] = {NULL, NULL};
    cerb_status st;
    int rc;

    memset(&o, 0, sizeof o);
    rc = parse_args(argc, argv, &o, &help);
    if (help) {
        fputs(cerb__cli_run_usage, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    o.verbose += cli->verbose;

    memset(&rs, 0, sizeof rs);
    rs.sfd = -1;
    rs.lost_pipe[0] = rs.lost_pipe[1] = rs.stop_pipe[0] = rs.stop_pipe[1] = -1;
    rs.tty = -1;
    atomic_init(&rs.lost, 0);
    atomic_init(&rs.wait_signal, 0);
    /* Before any thread or descriptor of ours exists. */
    scan_fds(true);
    if (setup_signals(&rs) != 0 || make_pipe(rs.lost_pipe, true) != 0 ||
        make_pipe(rs.stop_pipe, false) != 0) {
        cerb__cli_error("run: %s", strerror(errno));
        rc = CLI_EXIT_OSERR;
        goto out;
    }
    if (isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp())
        rs.tty = STDIN_FILENO;

    rc = cerb__cli_open_client(cli, &client);
    if (rc)
        goto out;
    lopts.lease_ms = o.lease_ms;
    lopts.renew = 1;
    st = cerb_lock_new(client, o.name, &lopts, &rs.lock);
    if (st == CERB_OK)
        st = cerb_lock_on_lost(rs.lock, on_lost, &rs);
    if (st != CERB_OK) {
        cerb__cli_error("run: %s", cerb_last_error());
        rc = cerb__cli_exit_code(st);
        goto out;
    }

    if (pthread_create(&watcher, NULL, wait_watcher, &rs) != 0) {
        cerb__cli_error("run: cannot start a thread");
        rc = CLI_EXIT_OSERR;
        goto out;
    }
    watching = true;
    st = acquire(&rs, &o);
    if (write(rs.stop_pipe[1], "x", 1) < 0) {
        /* A pipe nobody else writes cannot be full. */
    }
    pthread_join(watcher, NULL);
    watching = false;
    held = st == CERB_OK;
    if (atomic_load(&rs.wait_signal)) {
        /* A signal during the wait wins even over a grant that raced it. */
        if (o.verbose)
            cerb__cli_error("run: %s: %s while waiting; CMD not run", o.name,
                            sig_name(atomic_load(&rs.wait_signal)));
        rc = CLI_EXIT_NOT_OBTAINED;
        goto out;
    }
    if (st != CERB_OK) {
        rc = cerb__cli_exit_code(st);
        if (rc != CLI_EXIT_NOT_OBTAINED)
            cerb__cli_error("run: %s: %s", o.name, cerb_last_error());
        else if (o.verbose)
            cerb__cli_error("run: %s: not obtained: %s", o.name, cerb_last_error());
        goto out;
    }

    uint64_t fence = cerb_lock_fencing_token(rs.lock);
    if (o.verbose)
        /* Not "on <engine>": the lock may have been granted on another
         * engine than the current one (a wait begun before a switch). */
        cerb__cli_error("run: holding %s, fencing token %" PRIu64 " (epoch %" PRIu64
                        ", engine counter %" PRIu64 ")",
                        o.name, fence, fence >> 48, fence & ((UINT64_C(1) << 48) - 1));
    own_env[0] = str_printf("CERBERUS_LOCK_NAME=%s", o.name);
    own_env[1] = str_printf("CERBERUS_FENCING_TOKEN=%" PRIu64, fence);
    env = own_env[0] && own_env[1] ? child_env(own_env, 2) : NULL;
    if (!env) {
        cerb__cli_error("run: out of memory");
        rc = CLI_EXIT_OSERR;
        goto out;
    }
    bool exec_failed;
    int err = spawn(&rs, &o, env, &exec_failed);
    if (err) {
        cerb__cli_error("run: %s: %s", exec_failed ? o.cmd[0] : "fork", strerror(err));
        rc = !exec_failed     ? CLI_EXIT_OSERR
             : err == ENOENT ? CLI_EXIT_NOT_FOUND
                             : CLI_EXIT_CANNOT_EXEC;
        goto out;
    }

    int ws = supervise(&rs, &o);
    if (rs.tty >= 0)
        tcsetpgrp(rs.tty, getpgrp()); /* the terminal back, before we print */
    if (WIFEXITED(ws))
        rc = WEXITSTATUS(ws);
    else if (WIFSIGNALED(ws))
        rc = 128 + WTERMSIG(ws);
    else
        rc = CLI_EXIT_SOFTWARE;

    /* Release from this thread: it is the one that holds. */
    st = cerb_lock_unlock(rs.lock);
    held = false;
    bool lost = atomic_load(&rs.lost) != 0;
    if (st == CERB_LOST) {
        /* The loss was found by the release, after CMD ended: CMD may have
         * run part of its time unprotected. */
        if (!lost)
            cerb__cli_error("run: lock %s was lost before CMD finished", o.name);
        lost = true;
    } else if (st != CERB_OK) {
        cerb__cli_error("run: %s: release not confirmed (%s); the lease expires by itself",
                        o.name, cerb_last_error());
    } else if (o.verbose) {
        cerb__cli_error("run: released %s", o.name);
    }
    if (lost && o.kill_on_lost)
        rc = CLI_EXIT_LOST;

out:
    if (watching) {
        if (write(rs.stop_pipe[1], "x", 1) < 0) {
            /* A pipe nobody else writes cannot be full. */
        }
        pthread_join(watcher, NULL);
    }
    if (held)
        cerb_lock_unlock(rs.lock);
    free(env);
    free(own_env[0]);
    free(own_env[1]);
    cerb_lock_free(rs.lock);
    cerb_client_close(client);
    if (rs.sfd >= 0)
        close(rs.sfd);
    close_pair(rs.lost_pipe);
    close_pair(rs.stop_pipe);
    return rc;
}

/* ---- the child handling of `run`, for `once` (cmd_once.c) ----
 *
 * `once` runs CMD exactly as `run` does (steps 1, 3 and 4 above: signals
 * read from one signalfd, CMD in its own process group with the terminal,
 * our descriptors closed on exec, signals forwarded), with no lock: it
 * never sees a lost callback, so CMD is never stopped for a loss.
 */
struct cerb__cli_child {
    struct run_state rs;
    struct run_opts o;
};

int cerb__cli_child_prepare(const char *what, struct cerb__cli_child **out)
{
    struct cerb__cli_child *ch = calloc(1, sizeof *ch);
    *out = NULL;
    if (!ch) {
        cerb__cli_error("%s: out of memory", what);
        return CLI_EXIT_OSERR;
    }
    ch->rs.sfd = -1;
    ch->rs.lost_pipe[0] = ch->rs.lost_pipe[1] = ch->rs.stop_pipe[0] = ch->rs.stop_pipe[1] = -1;
    ch->rs.tty = -1;
    atomic_init(&ch->rs.lost, 0);
    atomic_init(&ch->rs.wait_signal, 0);
    ch->o.verb = what;
    ch->o.kind = "attempt";
    ch->o.name = what;
    ch->o.grace_ms = DEFAULT_GRACE_MS;
    scan_fds(true);
    if (setup_signals(&ch->rs) != 0 || make_pipe(ch->rs.lost_pipe, true) != 0) {
        cerb__cli_error("%s: %s", what, strerror(errno));
        cerb__cli_child_free(ch);
        return CLI_EXIT_OSERR;
    }
    if (isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp())
        ch->rs.tty = STDIN_FILENO;
    *out = ch;
    return CLI_EXIT_OK;
}

int cerb__cli_child_wait_signal(struct cerb__cli_child *ch, int64_t timeout_ms)
{
    struct pollfd p = {ch->rs.sfd, POLLIN, 0};
    int64_t end = mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = end - mono_ms();
        if (left < 0)
            left = 0;
        int n = poll(&p, 1, (int)(left < INT32_MAX ? left : INT32_MAX));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        struct signalfd_siginfo si;
        while (read(ch->rs.sfd, &si, sizeof si) == (ssize_t)sizeof si)
            if (ends_wait((int)si.ssi_signo))
                return (int)si.ssi_signo;
        if (left == 0)
            return 0;
    }
}

int cerb__cli_child_run(struct cerb__cli_child *ch, char **cmd, int verbose)
{
    return cerb__cli_child_run_env(ch, cmd, NULL, 0, verbose);
}

int cerb__cli_child_run_env(struct cerb__cli_child *ch, char **cmd, char **own, size_t nown,
                            int verbose)
{
    char **env = child_env(own, nown);
    bool exec_failed;
    int rc;

    if (!env) {
        cerb__cli_error("%s: out of memory", ch->o.verb);
        return CLI_EXIT_OSERR;
    }
    ch->o.cmd = cmd;
    ch->o.verbose = verbose;
    int err = spawn(&ch->rs, &ch->o, env, &exec_failed);
    if (err) {
        cerb__cli_error("%s: %s: %s", ch->o.verb, exec_failed ? cmd[0] : "fork", strerror(err));
        free(env);
        return !exec_failed ? CLI_EXIT_OSERR
               : err == ENOENT ? CLI_EXIT_NOT_FOUND
                               : CLI_EXIT_CANNOT_EXEC;
    }
    int ws = supervise(&ch->rs, &ch->o);
    if (ch->rs.tty >= 0)
        tcsetpgrp(ch->rs.tty, getpgrp());
    if (WIFEXITED(ws))
        rc = WEXITSTATUS(ws);
    else if (WIFSIGNALED(ws))
        rc = 128 + WTERMSIG(ws);
    else
        rc = CLI_EXIT_SOFTWARE;
    free(env);
    return rc;
}

void cerb__cli_child_on_lost(struct cerb__cli_child *ch, const char *name, bool kill)
{
    ch->o.name = name;
    ch->o.kill_on_lost = kill;
}

void cerb__cli_child_lost(struct cerb__cli_child *ch)
{
    mark_lost(&ch->rs);
}

bool cerb__cli_child_was_lost(struct cerb__cli_child *ch)
{
    return atomic_load(&ch->rs.lost) != 0;
}

void cerb__cli_child_free(struct cerb__cli_child *ch)
{
    if (!ch)
        return;
    if (ch->rs.sfd >= 0)
        close(ch->rs.sfd);
    close_pair(ch->rs.lost_pipe);
    close_pair(ch->rs.stop_pipe);
    free(ch);
}
