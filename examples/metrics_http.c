/*
 * metrics_http.c — a service that embeds Cerberus and serves its metrics on
 * /metrics for Prometheus to scrape (cerb_metrics_text()).
 *
 *   metrics_http [-c CFG] [-p PORT] [-n REQUESTS] NAME
 *
 * One worker thread stands in for the service's real work: it takes the lock
 * NAME, holds it a few milliseconds and releases it, in a loop. The main
 * thread listens on 127.0.0.1:PORT (default 9464, the port range Prometheus
 * exporters use; 0 picks a free one, printed as "listening on PORT") and
 * answers `GET /metrics` with the text exposition format (Content-Type
 * text/plain; version=0.0.4), anything else with 404. It is deliberately
 * small: one connection at a time, a bounded request read, close after each
 * answer — a real service would hang the handler on its own HTTP server.
 * With -n it exits after that many answers (so a test can run it to the end).
 *
 * Configuration: -c FILE, else $CERBERUS_CONFIG, else ./cerberus.cfg (the
 * lookup of the cerberus tools).
 *
 * Exit status: 0, 1 on a runtime error, 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

#include <cerberus.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;

struct work {
    cerb_client *client;
    const char *name;
};

static void *worker(void *arg)
{
    struct work *w = arg;
    cerb_lock *l = NULL;
    if (cerb_lock_new(w->client, w->name, NULL, &l) != CERB_OK) {
        fprintf(stderr, "metrics_http: lock %s: %s\n", w->name, cerb_last_error());
        return NULL;
    }
    struct timespec hold = {0, 5 * 1000 * 1000};
    while (!atomic_load(&stop)) {
        if (cerb_lock_trylock_for(l, 200) == CERB_OK) {
            nanosleep(&hold, NULL); /* the work the lock protects */
            cerb_lock_unlock(l);
        }
    }
    cerb_lock_free(l);
    return NULL;
}

static void answer(int fd, const char *status, const char *type, const char *body)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, type, strlen(body));
    if (write(fd, head, (size_t)n) < 0 || write(fd, body, strlen(body)) < 0)
        perror("metrics_http: write");
}

/* Read the request line (bounded) and answer it. */
static void serve(int fd, cerb_client *c)
{
    char req[1024];
    size_t got = 0;
    while (got < sizeof req - 1 && !memchr(req, '\n', got)) {
        ssize_t r = read(fd, req + got, sizeof req - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    req[got] = '\0';
    if (strncmp(req, "GET /metrics ", 13) != 0 && strncmp(req, "GET /metrics?", 13) != 0) {
        answer(fd, "404 Not Found", "text/plain", "try /metrics\n");
        return;
    }
    char *text = NULL;
    if (cerb_metrics_text(c, &text) != CERB_OK) {
        answer(fd, "500 Internal Server Error", "text/plain", cerb_last_error());
        return;
    }
    answer(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", text);
    cerb_free(text);
}

int main(int argc, char **argv)
{
    const char *cfg = NULL;
    int port = 9464;
    long requests = -1;
    int opt;
    while ((opt = getopt(argc, argv, "c:p:n:")) != -1) {
        switch (opt) {
        case 'c': cfg = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'n': requests = atol(optarg); break;
        default: goto usage;
        }
    }
    if (optind != argc - 1 || port < 0 || port > 65535)
        goto usage;

    cerb_client *c = NULL;
    if (cerb_client_open(&c, cfg) != CERB_OK) {
        fprintf(stderr, "metrics_http: %s\n", cerb_last_error());
        return 1;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 16) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0) {
        perror("metrics_http: listen");
        cerb_client_close(c);
        return 1;
    }
    printf("listening on %d\n", ntohs(a.sin_port));
    fflush(stdout);

    struct work w = {c, argv[optind]};
    pthread_t t;
    if (pthread_create(&t, NULL, worker, &w) != 0) {
        fprintf(stderr, "metrics_http: cannot start the worker\n");
        close(ls);
        cerb_client_close(c);
        return 1;
    }
    for (long served = 0; requests < 0 || served < requests; served++) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            perror("metrics_http: accept");
            break;
        }
        serve(fd, c);
        close(fd);
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    close(ls);
    cerb_client_close(c);
    return 0;

usage:
    fprintf(stderr, "usage: metrics_http [-c CFG] [-p PORT] [-n REQUESTS] NAME\n");
    return 2;
}
