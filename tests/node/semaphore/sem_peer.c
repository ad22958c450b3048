/*
 * sem_peer.c — a Cerberus semaphore holder driven line by line, for the
 * npm redis-semaphore interop test (tests/node/semaphore/semaphore.test.mjs
 * spawns it and speaks to it over its stdin and stdout).
 *
 * Usage: sem_peer PORT PREFIX NAME LIMIT LEASE_MS
 * Commands (one per line), each answered with one line:
 *   acquire K WAIT_MS  -> "ok <fence>" | "err <STATUS> <message>"
 *   release            -> "ok" | "err <STATUS> <message>"  (the last permit taken)
 *   holders            -> "ok <n> <owner>:<detail>,..." (cerb_inspect)
 *   quit               -> exits 0, every permit released
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cerberus.h"

#define MAX_PERMITS 64

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: sem_peer PORT PREFIX NAME LIMIT LEASE_MS\n");
        return 64;
    }
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "engines = (\"redis\");\nredis = { host = \"127.0.0.1\"; port = %s; prefix = \"%s\"; };\n",
             argv[1], argv[2]);
    cerb_client *c = NULL;
    cerb_semaphore *s = NULL;
    cerb_semaphore_opts o = CERB_SEMAPHORE_OPTS_INIT;
    o.lease_ms = atoll(argv[5]);
    if (cerb_client_open_string(&c, cfg) != CERB_OK ||
        cerb_semaphore_new(c, argv[3], atoll(argv[4]), &o, &s) != CERB_OK) {
        fprintf(stderr, "sem_peer: %s\n", cerb_last_error());
        return 1;
    }
    cerb_permit *held[MAX_PERMITS];
    int n = 0;
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        unsigned k;
        long long wait_ms;
        if (sscanf(line, "acquire %u %lld", &k, &wait_ms) == 2) {
            cerb_permit *p = NULL;
            cerb_status st = n < MAX_PERMITS ? cerb_semaphore_acquire(s, k, wait_ms, NULL, &p)
                                             : CERB_EINVAL;
            if (st == CERB_OK) {
                held[n++] = p;
                printf("ok %llu\n", (unsigned long long)cerb_permit_fencing_token(p));
            } else {
                printf("err %s %s\n", cerb_status_name(st), cerb_last_error());
            }
        } else if (strncmp(line, "release", 7) == 0) {
            cerb_status st = n > 0 ? cerb_permit_free(held[--n]) : CERB_EINVAL;
            if (st == CERB_OK)
                printf("ok\n");
            else
                printf("err %s %s\n", cerb_status_name(st), cerb_last_error());
        } else if (strncmp(line, "holders", 7) == 0) {
            cerb_holder_info *v = NULL;
            size_t m = 0;
            cerb_status st = cerb_inspect(c, CERB_KIND_SEMAPHORE, argv[3], "redis", &v, &m);
            if (st != CERB_OK) {
                printf("err %s %s\n", cerb_status_name(st), cerb_last_error());
                continue;
            }
            printf("ok %zu", m);
            for (size_t i = 0; i < m; i++)
                printf("%s%s:%s:%d", i ? "," : " ", v[i].owner, v[i].detail, v[i].waiting);
            printf("\n");
            cerb_holders_free(v, m);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        } else {
            printf("err EINVAL unknown command\n");
        }
    }
    while (n > 0)
        cerb_permit_free(held[--n]);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    return 0;
}
