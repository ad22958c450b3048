/*
 * zk_util.c — ZooKeeper helpers for the test suites (see zk_util.h).
 *
 * The raw client uses the C client's synchronous API, which zookeeper.h
 * declares only with THREADED defined; the support library is compiled
 * without the ZooKeeper target's definitions, so this file defines it
 * itself. Servers are found through scripts/servers.sh's PID files and
 * signalled by PID only. The child-process helper reads the child's stdout
 * with poll() under a deadline, so a hung Java peer fails a test instead
 * of hanging it.
 */
#ifndef THREADED
#define THREADED 1
#endif
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

/* Every support file is built into every suite's library; without the
 * ZooKeeper client headers (CERB_WITH_ZK off) this one is empty. */
#if defined(__has_include)
#if !__has_include(<zookeeper/zookeeper.h>)
#define CERB_TEST_NO_ZK 1
#endif
#endif

#ifndef CERB_TEST_NO_ZK
#include "zk_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PATH_MAX_LEN 4096

int cerb_test_zk_port(void)
{
    const char *s = getenv("CERB_ZK_PORT");
    int p = s ? atoi(s) : 0;
    return p > 0 && p < 65536 ? p : 22181;
}

char *cerb_test_zk_config(const char *hosts, const char *zk_extra, const char *extra)
{
    char h[64];
    if (!hosts) {
        snprintf(h, sizeof h, "127.0.0.1:%d", cerb_test_zk_port());
        hosts = h;
    }
#define ZK_CONFIG_FMT "engines = (\"zk\");\nzk = { hosts = \"%s\"; %s };\n%s\n"
    size_t n = sizeof ZK_CONFIG_FMT + strlen(hosts) + (zk_extra ? strlen(zk_extra) : 0) +
               (extra ? strlen(extra) : 0);
    char *t = malloc(n);
    if (t)
        snprintf(t, n, ZK_CONFIG_FMT, hosts, zk_extra ? zk_extra : "", extra ? extra : "");
    return t;
}

/* ---- raw client ---- */

struct conn_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int state;
};

static void raw_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    struct conn_wait *w = ctx;
    (void)zh;
    (void)path;
    if (type != ZOO_SESSION_EVENT)
        return;
    pthread_mutex_lock(&w->mu);
    w->state = state;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static void drop_log(const char *msg) { (void)msg; }

/* One wait struct per handle, kept until close (the watcher may fire late). */
struct raw {
    zhandle_t *zh;
    struct conn_wait w;
    struct raw *next;
};
static pthread_mutex_t raws_mu = PTHREAD_MUTEX_INITIALIZER;
static struct raw *raws;

zhandle_t *cerb_test_zk_connect(const char *hosts, const char *auth)
{
    char h[64];
    struct raw *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (!hosts) {
        snprintf(h, sizeof h, "127.0.0.1:%d", cerb_test_zk_port());
        hosts = h;
    }
    pthread_mutex_init(&r->w.mu, NULL);
    pthread_cond_init(&r->w.cond, NULL);
    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    r->zh = zookeeper_init2(hosts, raw_watcher, 10000, NULL, &r->w, 0, drop_log);
    if (!r->zh) {
        free(r);
        return NULL;
    }
    if (auth)
        zoo_add_auth(r->zh, "digest", auth, (int)strlen(auth), NULL, NULL);
    int64_t deadline = cerb_test_now_ms() + 10000;
    pthread_mutex_lock(&r->w.mu);
    while (r->w.state != ZOO_CONNECTED_STATE && cerb_test_now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->w.cond, &r->w.mu, &ts);
    }
    int ok = r->w.state == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&r->w.mu);
    if (!ok) {
        zookeeper_close(r->zh);
        free(r);
        return NULL;
    }
    pthread_mutex_lock(&raws_mu);
    r->next = raws;
    raws = r;
    pthread_mutex_unlock(&raws_mu);
    return r->zh;
}

void cerb_test_zk_close(zhandle_t *zh)
{
    if (!zh)
        return;
    zookeeper_close(zh);
    pthread_mutex_lock(&raws_mu);
    for (struct raw **pp = &raws; *pp; pp = &(*pp)->next)
        if ((*pp)->zh == zh) {
            struct raw *r = *pp;
            *pp = r->next;
            free(r);
            break;
        }
    pthread_mutex_unlock(&raws_mu);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int cerb_test_zk_children(zhandle_t *zh, const char *path, struct String_vector *out, int *rc)
{
    struct String_vector v = {0, NULL};
    int r = zoo_get_children(zh, path, 0, &v);
    if (rc)
        *rc = r;
    if (r != ZOK)
        return -1;
    if (v.count > 1)
        qsort(v.data, (size_t)v.count, sizeof v.data[0], cmp_str);
    int n = v.count;
    if (out)
        *out = v;
    else
        deallocate_String_vector(&v);
    return n;
}

char *cerb_test_zk_lock_path(const char *name)
{
    size_t n = strlen(CERB_TEST_ZK_ROOT) + 1 + strlen(name) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", CERB_TEST_ZK_ROOT, name);
    return p;
}

uint64_t cerb_test_zk_fence_offset(zhandle_t *zh, int64_t *mzxid)
{
    char buf[32];
    int len = sizeof buf - 1;
    struct Stat st;
    if (mzxid)
        *mzxid = 0;
    if (zoo_get(zh, CERB_TEST_ZK_FENCE_PATH, 0, buf, &len, &st) != ZOK || len < 0)
        return 0;
    buf[len] = '\0';
    if (mzxid)
        *mzxid = st.mzxid;
    return strtoull(buf, NULL, 10);
}

/* ---- servers ---- */

pid_t cerb_test_zk_pid(int port) { return cerb_test_server_pid("zk", port); }

int cerb_test_zk_pause(int port) { return cerb_test_pause_pid(cerb_test_zk_pid(port)); }

int cerb_test_zk_resume(int port) { return cerb_test_resume_pid(cerb_test_zk_pid(port)); }

int cerb_test_zk_servers(const char *cmd, int port, int nodes)
{
    char script[PATH_MAX_LEN], p[16], n[16];
    snprintf(script, sizeof script, "%s/scripts/servers.sh", cerb_test_source_dir());
    snprintf(p, sizeof p, "%d", port);
    snprintf(n, sizeof n, "%d", nodes);
    char *argv[] = {"bash", script, (char *)cmd, "zk", "--port", p, "--nodes", n, NULL};
    return cerb_test_run(argv, 60000);
}

int cerb_test_zk_mode(int port, char *mode, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[2048];
    size_t got = 0;
    int rc = -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "srvr", 4) == 4) {
        ssize_t r;
        while (got < sizeof buf - 1 && (r = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
            got += (size_t)r;
        buf[got] = '\0';
        char *m = strstr(buf, "Mode: ");
        if (m) {
            m += 6;
            size_t k = strcspn(m, "\r\n");
            if (k >= len)
                k = len - 1;
            memcpy(mode, m, k);
            mode[k] = '\0';
            rc = 0;
        }
    }
    close(fd);
    return rc;
}

/* ---- Java ---- */

char *cerb_test_curator_classpath(char **dir_out)
{
    static const char *jars = "/usr/share/java";
    char dir[PATH_MAX_LEN], src1[PATH_MAX_LEN], src2[PATH_MAX_LEN], src3[PATH_MAX_LEN];
    char rjar[PATH_MAX_LEN];
    *dir_out = NULL;
    snprintf(rjar, sizeof rjar, "%s/curator-recipes.jar", jars);
    if (access(rjar, R_OK) != 0) {
        fprintf(stderr, "zk_util: %s missing (Debian package libcurator-recipes-java)\n", rjar);
        return NULL;
    }
    snprintf(dir, sizeof dir, "%s/interop-curator-%ld", cerb_test_build_dir(), (long)getpid());
    mkdir(dir, 0700);
    snprintf(src1, sizeof src1, "%s/tests/interop/curator/CuratorPeer.java",
             cerb_test_source_dir());
    snprintf(src2, sizeof src2, "%s/tests/interop/curator/CuratorBench.java",
             cerb_test_source_dir());
    snprintf(src3, sizeof src3, "%s/tests/interop/curator/CuratorLeaderPeer.java",
             cerb_test_source_dir());
    char *argv[] = {"javac", "-nowarn", "-d", dir, "-cp", rjar, src1, src2, src3, NULL};
    int rc = cerb_test_run(argv, 120000);
    if (rc != 0) {
        fprintf(stderr, "zk_util: javac exited with %d (Debian package default-jdk-headless)\n",
                rc);
        char *d = strdup(dir);
        cerb_test_remove_tree(d);
        return NULL;
    }
    size_t n = strlen(rjar) + strlen(jars) + strlen(dir) + 64;
    char *cp = malloc(n);
    if (cp)
        snprintf(cp, n, "%s:%s/slf4j-nop.jar:%s", rjar, jars, dir);
    *dir_out = strdup(dir);
    return cp;
}

void cerb_test_remove_tree(char *dir)
{
    if (!dir)
        return;
    /* Only what the helpers made: a directory under the build dir. */
    if (strstr(dir, "/interop-curator-")) {
        char *argv[] = {"rm", "-rf", "--", dir, NULL};
        cerb_test_run(argv, 30000);
    }
    free(dir);
}

/* ---- child process with pipes ---- */

int cerb_test_proc_start(struct cerb_test_proc *p, char *const argv[])
{
    int in[2], out[2];
    memset(p, 0, sizeof *p);
    if (pipe(in) != 0)
        return -1;
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(in[0], STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    setpgid(pid, pid);
    close(in[0]);
    close(out[1]);
    fcntl(in[1], F_SETFD, FD_CLOEXEC);
    fcntl(out[0], F_SETFD, FD_CLOEXEC);
    p->pid = pid;
    p->in = fdopen(in[1], "w");
    p->out_fd = out[0];
    if (!p->in) {
        close(in[1]);
        close(out[0]);
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return 0;
}

int cerb_test_proc_send(struct cerb_test_proc *p, const char *line)
{
    if (fprintf(p->in, "%s\n", line) < 0 || fflush(p->in) != 0)
        return -1;
    return 0;
}

char *cerb_test_proc_line(struct cerb_test_proc *p, int64_t timeout_ms)
{
    int64_t deadline = cerb_test_now_ms() + timeout_ms;
    for (;;) {
        char *nl = memchr(p->buf, '\n', p->len);
        if (nl) {
            size_t k = (size_t)(nl - p->buf);
            char *line = malloc(k + 1);
            if (!line)
                return NULL;
            memcpy(line, p->buf, k);
            line[k] = '\0';
            memmove(p->buf, nl + 1, p->len - k - 1);
            p->len -= k + 1;
            return line;
        }
        int64_t left = deadline - cerb_test_now_ms();
        if (left <= 0 || p->len == sizeof p->buf)
            return NULL;
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
        if (r < 0 && errno != EINTR)
            return NULL;
        if (r <= 0)
            continue;
        ssize_t n = read(p->out_fd, p->buf + p->len, sizeof p->buf - p->len);
        if (n <= 0)
            return NULL;
        p->len += (size_t)n;
    }
}

int cerb_test_proc_end(struct cerb_test_proc *p, int64_t timeout_ms)
{
    if (p->in)
        fclose(p->in);
    p->in = NULL;
    int rc = p->pid > 0 ? cerb_test_wait(p->pid, timeout_ms) : CERB_TEST_CHILD_ERROR;
    if (p->out_fd > 0)
        close(p->out_fd);
    p->out_fd = -1;
    p->pid = 0;
    return rc;
}

#endif /* CERB_TEST_NO_ZK */
