/*
 * proxy.c — a loopback TCP proxy the chaos nemesis puts between clients and
 * one server, to make the network fail in the ways a process signal cannot.
 *
 *   cerb_chaos_proxy --listen PORT --target PORT --mode-file FILE
 *                    [--seconds S] [--pid-file FILE]
 *
 * Both ends are 127.0.0.1. The mode is the first line of FILE, re-read every
 * 50 ms, so the nemesis changes it with an atomic rename:
 *   pass        forward both ways
 *   delay MS    hold every reply MS ms before forwarding it (a gray failure:
 *               choose MS above probe_timeout_ms and below op_timeout_ms)
 *   blackhole   accept and read nothing, answer nothing (a partition: what
 *               is in flight is delivered when the mode returns to pass, as
 *               TCP would after a healed partition)
 *   drop        forward requests, then drop the reply and reset both
 *               connections: the request ran, the client cannot know
 *               (an ambiguous outcome). Dropping bytes inside a stream would
 *               be a fault TCP never shows, so the connection dies instead.
 * One thread per connection pair, each looping on poll() with a 50 ms timeout
 * so it sees mode changes; at most 256 pairs. The process exits after
 * --seconds (default 3600) or on SIGTERM.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum mode { MODE_PASS, MODE_DELAY, MODE_BLACKHOLE, MODE_DROP };

static _Atomic int g_mode = MODE_PASS;
static _Atomic int g_delay_ms = 0;
static _Atomic int g_pairs = 0;
static volatile sig_atomic_t g_stop = 0;
static int g_target;

static void on_term(int sig)
{
    (void)sig;
    g_stop = 1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_stop) {
    }
}

static void read_mode(const char *file)
{
    FILE *f = fopen(file, "r");
    char line[64] = "pass";
    if (f) {
        if (!fgets(line, sizeof(line), f))
            snprintf(line, sizeof(line), "pass");
        fclose(f);
    }
    int ms = 0;
    if (strncmp(line, "delay", 5) == 0 && sscanf(line + 5, "%d", &ms) == 1 && ms > 0) {
        atomic_store(&g_delay_ms, ms);
        atomic_store(&g_mode, MODE_DELAY);
    } else if (strncmp(line, "blackhole", 9) == 0) {
        atomic_store(&g_mode, MODE_BLACKHOLE);
    } else if (strncmp(line, "drop", 4) == 0) {
        atomic_store(&g_mode, MODE_DROP);
    } else {
        atomic_store(&g_mode, MODE_PASS);
    }
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reset rather than FIN: the client sees its connection fail. */
static void close_reset(int fd)
{
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(fd);
}

static void *pair_main(void *arg)
{
    int cfd = (int)(intptr_t)arg;
    int sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_target)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (sfd < 0 || connect(sfd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (sfd >= 0)
            close(sfd);
        close_reset(cfd);
        atomic_fetch_sub(&g_pairs, 1);
        return NULL;
    }
    int one = 1;
    setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[16384];
    while (!g_stop) {
        int mode = atomic_load(&g_mode);
        if (mode == MODE_BLACKHOLE) {
            sleep_ms(50);
            continue;
        }
        struct pollfd p[2] = {{cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
        int r = poll(p, 2, 50);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        if (r == 0)
            continue;
        /* Re-read: a blackhole that began during the poll must hold. */
        mode = atomic_load(&g_mode);
        if (mode == MODE_BLACKHOLE)
            continue;
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(cfd, buf, sizeof(buf), 0);
            if (n <= 0 || write_all(sfd, buf, (size_t)n) != 0)
                break;
        }
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(sfd, buf, sizeof(buf), 0);
            if (n <= 0)
                break;
            if (mode == MODE_DROP) {
                close_reset(cfd);
                close_reset(sfd);
                atomic_fetch_sub(&g_pairs, 1);
                return NULL;
            }
            if (mode == MODE_DELAY)
                sleep_ms(atomic_load(&g_delay_ms));
            if (write_all(cfd, buf, (size_t)n) != 0)
                break;
        }
    }
    close(cfd);
    close(sfd);
    atomic_fetch_sub(&g_pairs, 1);
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"listen", 1, 0, 'l'}, {"target", 1, 0, 't'},
                                       {"mode-file", 1, 0, 'm'}, {"seconds", 1, 0, 's'},
                                       {"pid-file", 1, 0, 'p'}, {0, 0, 0, 0}};
    int listen_port = 0, seconds = 3600, c;
    const char *mode_file = NULL, *pid_file = NULL;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'l': listen_port = atoi(optarg); break;
        case 't': g_target = atoi(optarg); break;
        case 'm': mode_file = optarg; break;
        case 's': seconds = atoi(optarg); break;
        case 'p': pid_file = optarg; break;
        default:
            fprintf(stderr, "usage: cerb_chaos_proxy --listen PORT --target PORT "
                            "--mode-file FILE [--seconds S] [--pid-file FILE]\n");
            return 2;
        }
    }
    if (listen_port <= 0 || g_target <= 0 || !mode_file) {
        fprintf(stderr, "cerb_chaos_proxy: --listen, --target and --mode-file are required\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in la = {.sin_family = AF_INET, .sin_port = htons((uint16_t)listen_port)};
    la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&la, sizeof(la)) != 0 || listen(lfd, 128) != 0) {
        fprintf(stderr, "cerb_chaos_proxy: 127.0.0.1:%d: %s\n", listen_port, strerror(errno));
        return 1;
    }
    if (pid_file) {
        FILE *f = fopen(pid_file, "w");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
    }
    read_mode(mode_file);
    int64_t end = now_ms() + (int64_t)seconds * 1000;
    while (!g_stop && now_ms() < end) {
        struct pollfd p = {lfd, POLLIN, 0};
        int r = poll(&p, 1, 50);
        read_mode(mode_file);
        if (r <= 0)
            continue;
        int cfd = accept(lfd, NULL, NULL);
        if (cfd < 0)
            continue;
        if (atomic_load(&g_pairs) >= 256) {
            close_reset(cfd);
            continue;
        }
        atomic_fetch_add(&g_pairs, 1);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, pair_main, (void *)(intptr_t)cfd) != 0) {
            atomic_fetch_sub(&g_pairs, 1);
            close_reset(cfd);
        }
        pthread_attr_destroy(&at);
    }
    g_stop = 1;
    close(lfd);
    /* Let the pair threads see g_stop (each polls every 50 ms). */
    for (int i = 0; i < 40 && atomic_load(&g_pairs) > 0; i++)
        sleep_ms(50);
    return 0;
}
