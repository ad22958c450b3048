/*
 * mc_util.h — helpers for suites that run against the test memcached
 * (scripts/servers.d/memcached.sh): its port, a configuration naming it,
 * and a raw connection to look at (or tamper with) the items the engine
 * keeps, with the engine's key rule (engine_memcached/mc_proto.c).
 */
#ifndef CERB_TEST_MC_UTIL_H
#define CERB_TEST_MC_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* $CERB_MEMCACHED_PORT, else 21211. */
int mc_test_port(void);
/* `engines = ("memcached"); memcached = { servers = ("127.0.0.1:<port>");
 * <mc_extra> }; <extra>`, malloc'd. */
char *mc_test_config(const char *mc_extra, const char *extra);
/* The key the engine uses for `name` under `prefix` (NULL = ""), as sent:
 * *b64 says whether it goes with the `b` flag. */
void mc_test_key(const char *prefix, const char *name, char *out, size_t len, int *b64);
/* Send one request line (CRLF added) to the server on port and return the
 * whole answer up to and including the first line that is not a VA header
 * (or "END"), malloc'd; NULL on failure. */
char *mc_test_cmd(int port, const char *line);
/* The item of `name` (prefix ""): 1 when present, 0 when not, -1 on error;
 * its value (up to 64 bytes) and TTL in seconds (-1: none) when asked. */
int mc_test_item(int port, const char *name, char *value, int64_t *ttl_s);
/* The number of the engine's records for `name`: the item, or none. */
int mc_test_records(const char *name);

#endif
