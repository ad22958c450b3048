/*
 * redis_sentinel.h — where the Redis master is (redis.mode = "sentinel").
 *
 * In single mode the address is redis.host:redis.port for good. In sentinel
 * mode the engine asks the sentinels (`SENTINEL get-master-addr-by-name`,
 * any that answers, with redis.sentinel_password) and every connection to
 * the answer checks that it is a master (INFO replication, redis_conn.c).
 * The address carries a generation: a connection made to an older one is
 * closed when it comes back to the pool, so after a failover nothing keeps
 * writing to the old master. The engine asks the sentinels again whenever
 * the master may have moved — a connection refused or timed out, a server
 * that says it is a replica, a READONLY answer — at most once per
 * REDIS_REDISCOVER_MIN_MS, so a dead deployment is not hammered — and as
 * soon as a sentinel announces +switch-master (cerb__redis_watch_start).
 */
#ifndef CERB_REDIS_SENTINEL_H
#define CERB_REDIS_SENTINEL_H

#include <stddef.h>
#include <stdint.h>

#include "redis_conn.h"

#define REDIS_REDISCOVER_MIN_MS 100

/* Set up the address (single: the configured one; sentinel: none yet). */
void cerb__redis_addr_init(cerb_engine *e);
void cerb__redis_addr_destroy(cerb_engine *e);

/*
 * The address to connect to now, and its generation. In sentinel mode,
 * asks the sentinels first when the master may have moved (bounded by
 * deadline_ns and the connect timeout per sentinel).
 */
cerb_status cerb__redis_addr_get(cerb_engine *e, int64_t deadline_ns, char *host, size_t hlen,
                                 int *port, uint64_t *gen);

/* The master may have moved: ask the sentinels before the next connect. */
void cerb__redis_addr_suspect(cerb_engine *e);

/* The current generation (cheap; a connection older than it is closed). */
uint64_t cerb__redis_addr_gen(cerb_engine *e);

/*
 * Sentinel mode: a thread subscribed to +switch-master on one sentinel (the
 * next one when it goes away) moves the address as soon as the sentinels
 * announce a failover of our master, before any call fails on the old one.
 * After every (re)subscription the master is asked for again, for an
 * announcement missed meanwhile. Stop joins the thread within
 * REDIS_WATCH_SLICE_MS. No-ops in other modes.
 */
#define REDIS_WATCH_SLICE_MS 100
cerb_status cerb__redis_watch_start(cerb_engine *e);
void cerb__redis_watch_stop(cerb_engine *e);

#endif
