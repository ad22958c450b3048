/*
 * redlock_util.h — helpers for the suites of the redis engine's Redlock
 * mode: the masters' ports (CERB_REDLOCK_PORT = the first, the others
 * follow; CERB_REDLOCK_NODES, default 3), a config for them, raw access to
 * one node (hiredis), and pausing, killing and restarting one node through
 * scripts/servers.sh (which stops only the PIDs it recorded).
 */
#ifndef CERB_TEST_REDLOCK_UTIL_H
#define CERB_TEST_REDLOCK_UTIL_H

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "test_util.h"

static inline int rl_base_port(void)
{
    const char *s = getenv("CERB_REDLOCK_PORT");
    return s && *s ? atoi(s) : 26411;
}

static inline int rl_nodes(void)
{
    const char *s = getenv("CERB_REDLOCK_NODES");
    return s && *s ? atoi(s) : 3;
}

/* `engines = ("redis"); redis = { mode = "redlock"; nodes = (...); <redis_extra> }; <extra>` */
static inline char *rl_config(const char *redis_extra, const char *extra)
{
    char nodes[512] = "";
    size_t off = 0;
    for (int i = 0; i < rl_nodes(); i++)
        off += (size_t)snprintf(nodes + off, sizeof nodes - off, "%s\"127.0.0.1:%d\"",
                                i ? ", " : "", rl_base_port() + i);
#define RL_CONFIG_FMT "engines = (\"redis\");\nredis = { mode = \"redlock\"; nodes = (%s); %s };\n%s\n"
    const char *re = redis_extra ? redis_extra : "", *ex = extra ? extra : "";
    int len = snprintf(NULL, 0, RL_CONFIG_FMT, nodes, re, ex);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, RL_CONFIG_FMT, nodes, re, ex);
    return s;
}

/* A raw connection to node i (NULL when it does not answer within 1 s). */
static inline redisContext *rl_raw(int i)
{
    struct timeval tv = {1, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", rl_base_port() + i, tv);
    if (!r || r->err) {
        if (r)
            redisFree(r);
        return NULL;
    }
    redisSetTimeout(r, tv);
    return r;
}

/* Does node i hold key `name` (1), not (0), or not answer (-1)? */
static inline int rl_has_key(int i, const char *name)
{
    redisContext *r = rl_raw(i);
    if (!r)
        return -1;
    redisReply *k = redisCommand(r, "EXISTS %s", name);
    int n = k && k->type == REDIS_REPLY_INTEGER ? (int)k->integer : -1;
    if (k)
        freeReplyObject(k);
    redisFree(r);
    return n;
}

/* How many nodes hold key `name`. */
static inline int rl_key_count(const char *name)
{
    int n = 0;
    for (int i = 0; i < rl_nodes(); i++)
        n += rl_has_key(i, name) == 1;
    return n;
}

/* SET name value PX ms on node i (another client's partial grant). */
static inline int rl_set(int i, const char *name, const char *value, long long px)
{
    redisContext *r = rl_raw(i);
    if (!r)
        return -1;
    redisReply *k = redisCommand(r, "SET %s %s PX %lld", name, value, px);
    int ok = k && k->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (k)
        freeReplyObject(k);
    redisFree(r);
    return ok;
}

/* The PID servers.sh recorded for node i, or -1. */
static inline pid_t rl_pid(int i)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/redis-%d.pid", cerb_test_state_dir(), rl_base_port() + i);
    FILE *f = fopen(path, "r");
    long pid = -1;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1)
            pid = -1;
        fclose(f);
    }
    return (pid_t)pid;
}

/* scripts/servers.sh CMD redis --port <node i's>: 0 on success. */
static inline int rl_servers(const char *cmd, int i)
{
    char port[16];
    char script[1024];
    snprintf(port, sizeof port, "%d", rl_base_port() + i);
    snprintf(script, sizeof script, "%s/scripts/servers.sh", cerb_test_source_dir());
    char *const argv[] = {"bash", script, (char *)cmd, "redis", "--port", port, NULL};
    return cerb_test_run(argv, 60000);
}

static inline int rl_pause(int i) { return kill(rl_pid(i), SIGSTOP); }
static inline int rl_resume(int i) { return kill(rl_pid(i), SIGCONT); }

/* Stop node i (servers.sh: its PID, its data directory removed; the test
 * servers persist nothing) and start it again empty: a restart without its
 * data, with a new run_id, and not prepared by `cerberus init` (that is
 * for a new server: a restarted one has no marker, so its clients
 * quarantine it). */
static inline int rl_restart_empty(int i)
{
    if (rl_servers("stop", i) != 0)
        return -1;
    setenv("CERB_REDIS_UNMARKED", "1", 1);
    int rc = rl_servers("start", i);
    unsetenv("CERB_REDIS_UNMARKED");
    return rc;
}

#endif
