/*
 * redis_ns.c — a redis key prefix of a test's own, ready for use
 * (test_util.h, cerb_test_redis_namespace).
 */
#include "internal_posix.h"

#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

char *cerb_test_redis_namespace(const char *tag, int port)
{
    char *base = test_name(tag);
    if (!base)
        return NULL;
    size_t n = strlen(base) + 2;
    char *prefix = malloc(n);
    if (!prefix) {
        free(base);
        return NULL;
    }
    snprintf(prefix, n, "%s:", base);
    free(base);
    redisContext *rc = redisConnect("127.0.0.1", port > 0 ? port : cerb_test_redis_port());
    redisReply *r = rc && !rc->err ? redisCommand(rc, "INFO replication") : NULL;
    char replid[64] = "";
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "master_replid:") : NULL;
    if (p)
        sscanf(p + strlen("master_replid:"), "%63[0-9a-f]", replid);
    if (r)
        freeReplyObject(r);
    /* The marker a server started empty gets (scripts/servers.sh): no
     * quarantine before the first grant under this prefix. */
    char key[256], val[128];
    snprintf(key, sizeof key, "%s\x1f" "cerberus", prefix);
    snprintf(val, sizeof val, "test-ns-%d 0 %s", (int)getpid(), replid);
    r = rc && !rc->err && replid[0] ? redisCommand(rc, "SET %s %s", key, val) : NULL;
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (rc)
        redisFree(rc);
    if (!ok) {
        free(prefix);
        return NULL;
    }
    return prefix;
}
