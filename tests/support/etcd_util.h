/*
 * etcd_util.h — helpers for suites that run against a real etcd: the
 * suite's port, configuration text for the etcd engine, raw requests to the
 * v3 JSON gateway (to look at and tamper with the server behind the
 * library's back: list the keys of a lock, revoke a lease, put a foreign
 * key), the server's PID from scripts/servers.sh, private clusters, and
 * finding the leader.
 *
 * Environment (set by cerb_add_suite): CERB_ETCD_PORT (default 22379; the
 * exclusive server for *_pause / *_cluster suites), CERB_STATE_DIR,
 * CERB_SOURCE_DIR.
 *
 * Raw requests use their own libcurl handle and jansson, independent of the
 * engine under test; keys are base64 by libcrypto.
 *
 * Ownership: returned `char *` and arrays are malloc'd (free()); json_t
 * results are new references (json_decref). Thread-safety: any thread.
 */
#ifndef CERB_ETCD_UTIL_H
#define CERB_ETCD_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* $CERB_ETCD_PORT, or 22379. */
int etcd_test_port(void);

/*
 * Config text for one etcd engine on the given client ports (NULL/0 = this
 * suite's server): engines = ("etcd"); etcd = { endpoints = (...);
 * <etcd_extra> }; <extra>. Either extra may be NULL.
 * Returns: malloc'd text, or NULL on out of memory.
 */
char *etcd_test_config(const char *etcd_extra, const char *extra);
char *etcd_test_config_ports(const int *ports, size_t n, const char *etcd_extra,
                             const char *extra);

/*
 * POST @body (JSON text) to http://127.0.0.1:@port@path (2 s timeout), with
 * `Authorization: @token` when token is not NULL.
 * Returns: the parsed answer (also an error body), NULL when there was no
 * parseable answer; *status (may be NULL) gets the HTTP status (0 = none).
 */
json_t *etcd_test_post(int port, const char *path, const char *body, const char *token,
                       long *status);

/* One key of a lock as the server has it. */
struct etcd_test_kv {
    char key[512];
    int64_t create_revision;
    int64_t lease;
};

/*
 * The keys under @prefix (e.g. "name/"), sorted by create revision, at most
 * @max into @out. Returns: how many exist (may exceed max), or -1.
 */
int etcd_test_keys(int port, const char *prefix, struct etcd_test_kv *out, int max);

/* Put @key (empty value) with @lease (0 = none). Returns 0 or -1. */
int etcd_test_put(int port, const char *key, int64_t lease);
/* Put @key with value @value (NUL-terminated) and @lease (0 = none).
 * Returns 0 or -1. */
int etcd_test_put_value(int port, const char *key, const char *value, int64_t lease);
/* Delete @key. Returns the number deleted, or -1. */
int etcd_test_delete(int port, const char *key);
/* Grant a lease of @ttl_s; returns its ID or -1. */
int64_t etcd_test_grant(int port, int64_t ttl_s);
/* Revoke @lease. Returns 0 (also when it was gone already) or -1. */
int etcd_test_revoke(int port, int64_t lease);
/* The lease ID in the key "<prefix><name>/<hex>"; 0 when not of that form. */
int64_t etcd_test_key_lease(const char *key);

/*
 * The engine's fence offset for etcd.prefix @prefix ("" = none): the
 * decimal value of the key "<prefix>__cerberus_fence__", which every grant
 * adds to its key's create revision. Returns it, 0 when the key is absent,
 * -1 when it cannot be read.
 */
int64_t etcd_test_fence_offset(int port, const char *prefix);

/* PID of the etcd on @port (from CERB_STATE_DIR/etcd-<port>.pid), or -1. */
pid_t etcd_test_pid(int port);

/*
 * SIGSTOP the etcd on @port and wait until the kernel reports it stopped;
 * it is resumed by etcd_test_resume() and, should a failed assertion skip
 * that, at exit. Only for suites that own their server (*_pause, *_cluster).
 * Returns 0 or -1.
 */
int etcd_test_pause(int port);
int etcd_test_resume(int port);

/*
 * `scripts/servers.sh @cmd etcd --port @port --nodes @nodes` (30 s
 * deadline). Returns: its exit status as cerb_test_run() gives it.
 */
int etcd_test_servers(const char *cmd, int port, int nodes);

/*
 * Which of @ports (client ports of one cluster) is the leader, asking each
 * live member (maintenance/status) until one answers with a leader it
 * can place. Returns the index in @ports, or -1.
 */
int etcd_test_leader(const int *ports, size_t n);

/* Run `etcdctl` (ETCDCTL_API=3) against @port with @args (NULL-ended)
 * in the background. Returns the child's PID or -1. Stop it with
 * cerb_test_wait() or kill it (its process group). */
pid_t etcd_test_etcdctl(int port, const char *const *args);

#endif
