/*
 * rl_peer.c — a Cerberus lock holder in Redlock mode, driven line by line,
 * for the interop tests of other Redlock clients on the same masters
 * (tests/node/redlock/redlock.test.mjs spawns it and speaks to it over its
 * stdin and stdout; tests/integration/test_interop_redispy_redlock.c runs
 * its own clients in-process instead).
 *
 * Usage: rl_peer PORTS PREFIX NAME LEASE_MS
 *   PORTS: the masters' ports on 127.0.0.1, comma-separated ("26411,26412,26413")
 * Commands (one per line), each answered with one line:
 *   trylock            -> "ok <fence>" | "err <STATUS> <message>"
 *   lock WAIT_MS       -> "ok <fence>" | "err <STATUS> <message>"
 *   unlock             -> "ok" | "err <STATUS> <message>"
 *   state              -> "ok FREE|VALID|SUSPECT|LOST"
 *   crash              -> no answer: exits at once without releasing, as a
 *                         killed holder would (its keys stay until their PX)
 *   quit               -> exits 0, the lock released if held
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cerberus.h"

static const char *state_name(enum cerb_lock_state s)
{
    switch (s) {
    case CERB_LOCK_FREE:
        return "FREE";
    case CERB_LOCK_VALID:
        return "VALID";
    case CERB_LOCK_SUSPECT:
        return "SUSPECT";
    case CERB_LOCK_LOST:
        return "LOST";
    }
    return "?";
}

static void answer(cerb_status st, const cerb_lock *l, int with_fence)
{
    if (st != CERB_OK)
        printf("err %s %s\n", cerb_status_name(st), cerb_last_error());
    else if (with_fence)
        printf("ok %llu\n", (unsigned long long)cerb_lock_fencing_token(l));
    else
        printf("ok\n");
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: rl_peer PORTS PREFIX NAME LEASE_MS\n");
        return 64;
    }
    char nodes[512] = "", cfg[1024];
    char ports[256];
    snprintf(ports, sizeof ports, "%s", argv[1]);
    for (char *save = NULL, *p = strtok_r(ports, ",", &save); p;
         p = strtok_r(NULL, ",", &save)) {
        size_t len = strlen(nodes);
        snprintf(nodes + len, sizeof nodes - len, "%s\"127.0.0.1:%s\"", len ? ", " : "", p);
    }
    snprintf(cfg, sizeof cfg,
             "engines = (\"redis\");\n"
             "lock = { lease_ms = %s; renew = true; fair = false; };\n"
             "redis = { mode = \"redlock\"; nodes = (%s); redlock_fence = \"quorum\";\n"
             "  prefix = \"%s\"; connect_timeout_ms = 500; op_timeout_ms = 500; };\n",
             argv[4], nodes, argv[2]);
    cerb_client *c = NULL;
    cerb_lock *l = NULL;
    if (cerb_client_open_string(&c, cfg) != CERB_OK ||
        cerb_lock_new(c, argv[3], NULL, &l) != CERB_OK) {
        fprintf(stderr, "rl_peer: %s\n", cerb_last_error());
        return 1;
    }
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        long long wait_ms;
        if (strncmp(line, "trylock", 7) == 0) {
            answer(cerb_lock_trylock(l), l, 1);
        } else if (sscanf(line, "lock %lld", &wait_ms) == 1) {
            answer(cerb_lock_trylock_for(l, wait_ms), l, 1);
        } else if (strncmp(line, "unlock", 6) == 0) {
            answer(cerb_lock_unlock(l), l, 0);
        } else if (strncmp(line, "state", 5) == 0) {
            printf("ok %s\n", state_name(cerb_lock_state(l)));
        } else if (strncmp(line, "crash", 5) == 0) {
            _exit(0);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        } else {
            printf("err EINVAL unknown command\n");
        }
    }
    while (cerb_lock_hold_count(l) > 0)
        cerb_lock_unlock(l);
    cerb_lock_free(l);
    cerb_client_close(c);
    return 0;
}
