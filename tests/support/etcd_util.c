/*
 * etcd_util.c — raw access to the test etcd for the suites (see
 * etcd_util.h): one libcurl request per call (a fresh easy handle, HTTP/1.1,
 * 2 s timeout, `Grpc-Metadata-hasleader: true`), JSON by jansson, base64 by
 * libcrypto. Deliberately separate from the engine's own client code, so a
 * test checks the engine against an independent reading of the server.
 */
#include "internal_posix.h"

#include "etcd_util.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

int etcd_test_port(void)
{
    const char *v = getenv("CERB_ETCD_PORT");
    int p = v ? atoi(v) : 0;
    return p > 0 && p < 65536 ? p : 22379;
}

char *etcd_test_config_ports(const int *ports, size_t n, const char *etcd_extra,
                             const char *extra)
{
    char eps[1024] = "";
    int one = etcd_test_port();
    if (!ports || n == 0) {
        ports = &one;
        n = 1;
    }
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(eps);
        snprintf(eps + l, sizeof eps - l, "%s\"http://127.0.0.1:%d\"", i ? ", " : "", ports[i]);
    }
#define CONFIG_FMT "engines = (\"etcd\");\netcd = { endpoints = (%s); %s };\n%s\n"
    size_t len = sizeof CONFIG_FMT + strlen(eps) + (etcd_extra ? strlen(etcd_extra) : 0) +
                 (extra ? strlen(extra) : 0);
    char *s = malloc(len);
    if (s)
        snprintf(s, len, CONFIG_FMT, eps, etcd_extra ? etcd_extra : "", extra ? extra : "");
    return s;
}

char *etcd_test_config(const char *etcd_extra, const char *extra)
{
    return etcd_test_config_ports(NULL, 0, etcd_extra, extra);
}

/* ---- raw requests ---- */

struct body {
    char *p;
    size_t n;
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct body *b = ud;
    size_t k = size * n;
    char *q = realloc(b->p, b->n + k + 1);
    if (!q)
        return 0;
    memcpy(q + b->n, p, k);
    b->p = q;
    b->n += k;
    b->p[b->n] = '\0';
    return k;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_curl(void) { curl_global_init(CURL_GLOBAL_ALL); }

json_t *etcd_test_post(int port, const char *path, const char *body, const char *token,
                       long *status)
{
    char url[256], auth[1024];
    struct body b = {0};
    struct curl_slist *h = NULL;
    json_t *j = NULL;

    pthread_once(&once, init_curl);
    if (status)
        *status = 0;
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Grpc-Metadata-hasleader: true");
    h = curl_slist_append(h, "Expect:");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: %s", token);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "{}");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    if (curl_easy_perform(c) == CURLE_OK) {
        long st = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
        if (status)
            *status = st;
        if (b.p)
            j = json_loadb(b.p, b.n, 0, NULL);
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(b.p);
    return j;
}

static void b64(const char *s, size_t n, char *out, size_t outlen)
{
    if (4 * ((n + 2) / 3) + 1 > outlen) {
        out[0] = '\0';
        return;
    }
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
}

static int unb64(const char *s, char *out, size_t outlen)
{
    size_t n = strlen(s);
    if (n % 4 || n / 4 * 3 + 1 > outlen)
        return -1;
    int k = EVP_DecodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
    if (k < 0)
        return -1;
    while (n > 0 && s[n - 1] == '=') {
        n--;
        k--;
    }
    out[k] = '\0';
    return k;
}

static int64_t i64_of(const json_t *o, const char *name)
{
    const json_t *v = json_object_get(o, name);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    return 0;
}

int etcd_test_keys(int port, const char *prefix, struct etcd_test_kv *out, int max)
{
    char k[1024], e[1024], body[4096], end[512];
    size_t n = strlen(prefix);
    if (n == 0 || n >= sizeof end)
        return -1;
    memcpy(end, prefix, n);
    end[n - 1]++;
    b64(prefix, n, k, sizeof k);
    b64(end, n, e, sizeof e);
    snprintf(body, sizeof body,
             "{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":\"ASCEND\","
             "\"sort_target\":\"CREATE\",\"keys_only\":true}",
             k, e);
    long st;
    json_t *r = etcd_test_post(port, "/v3/kv/range", body, NULL, &st);
    if (!r || st != 200) {
        json_decref(r);
        return -1;
    }
    int count = (int)i64_of(r, "count");
    const json_t *kvs = json_object_get(r, "kvs");
    for (int i = 0; i < max && i < (int)json_array_size(kvs); i++) {
        const json_t *kv = json_array_get(kvs, (size_t)i);
        const json_t *key = json_object_get(kv, "key");
        if (!json_is_string(key) ||
            unb64(json_string_value(key), out[i].key, sizeof out[i].key) < 0)
            out[i].key[0] = '\0';
        out[i].create_revision = i64_of(kv, "create_revision");
        out[i].lease = i64_of(kv, "lease");
    }
    json_decref(r);
    return count;
}

int etcd_test_put(int port, const char *key, int64_t lease)
{
    char k[1024], body[2048];
    long st;
    b64(key, strlen(key), k, sizeof k);
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"lease\":\"%lld\"}", k, (long long)lease);
    json_t *r = etcd_test_post(port, "/v3/kv/put", body, NULL, &st);
    json_decref(r);
    return st == 200 ? 0 : -1;
}

int etcd_test_put_value(int port, const char *key, const char *value, int64_t lease)
{
    char k[1024], v[256], body[2048];
    long st;
    b64(key, strlen(key), k, sizeof k);
    b64(value, strlen(value), v, sizeof v);
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%lld\"}", k, v,
             (long long)lease);
    json_t *r = etcd_test_post(port, "/v3/kv/put", body, NULL, &st);
    json_decref(r);
    return st == 200 ? 0 : -1;
}

int64_t etcd_test_fence_offset(int port, const char *prefix)
{
    char key[600], k[1024], body[2048], v[64];
    long st;
    snprintf(key, sizeof key, "%s__cerberus_fence__", prefix ? prefix : "");
    b64(key, strlen(key), k, sizeof k);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
    json_t *r = etcd_test_post(port, "/v3/kv/range", body, NULL, &st);
    if (!r || st != 200) {
        json_decref(r);
        return -1;
    }
    const json_t *kv = json_array_get(json_object_get(r, "kvs"), 0);
    const json_t *val = json_object_get(kv, "value");
    int64_t off = 0;
    if (kv && json_is_string(val) && unb64(json_string_value(val), v, sizeof v) >= 0)
        off = strtoll(v, NULL, 10);
    else if (kv)
        off = -1;
    json_decref(r);
    return off;
}

int etcd_test_delete(int port, const char *key)
{
    char k[1024], body[2048];
    long st;
    b64(key, strlen(key), k, sizeof k);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
    json_t *r = etcd_test_post(port, "/v3/kv/deleterange", body, NULL, &st);
    int n = r && st == 200 ? (int)i64_of(r, "deleted") : -1;
    json_decref(r);
    return n;
}

int64_t etcd_test_grant(int port, int64_t ttl_s)
{
    char body[128];
    long st;
    snprintf(body, sizeof body, "{\"TTL\":\"%lld\"}", (long long)ttl_s);
    json_t *r = etcd_test_post(port, "/v3/lease/grant", body, NULL, &st);
    int64_t id = r && st == 200 ? i64_of(r, "ID") : -1;
    json_decref(r);
    return id;
}

int etcd_test_revoke(int port, int64_t lease)
{
    char body[128];
    long st;
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", (long long)lease);
    json_t *r = etcd_test_post(port, "/v3/lease/revoke", body, NULL, &st);
    json_decref(r);
    return st == 200 || st == 404 ? 0 : -1;
}

int64_t etcd_test_key_lease(const char *key)
{
    const char *slash = strrchr(key, '/');
    if (!slash || !slash[1])
        return 0;
    char *end;
    unsigned long long v = strtoull(slash + 1, &end, 16);
    return *end == '\0' ? (int64_t)v : 0;
}

pid_t etcd_test_pid(int port)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/etcd-%d.pid", cerb_test_state_dir(), port);
    FILE *f = fopen(path, "r");
    long pid = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%ld", &pid) != 1)
        pid = -1;
    fclose(f);
    return (pid_t)pid;
}

int etcd_test_servers(const char *cmd, int port, int nodes)
{
    char script[4096], p[16], n[16];
    snprintf(script, sizeof script, "%s/scripts/servers.sh", cerb_test_source_dir());
    snprintf(p, sizeof p, "%d", port);
    snprintf(n, sizeof n, "%d", nodes);
    char *argv[] = {"bash", script, (char *)cmd, "etcd", "--port", p, "--nodes", n, NULL};
    return cerb_test_run(argv, 30000);
}

/* Member IDs are uint64: compared as the decimal strings the gateway
 * sends (they overflow int64). */
static void id_of(const json_t *o, const char *name, char *out, size_t len)
{
    const json_t *v = json_object_get(o, name);
    snprintf(out, len, "%s", json_is_string(v) ? json_string_value(v) : "");
}

int etcd_test_leader(const int *ports, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        long st;
        char leader[32], me[32];
        json_t *r = etcd_test_post(ports[i], "/v3/maintenance/status", "{}", NULL, &st);
        if (!r || st != 200) {
            json_decref(r);
            continue;
        }
        id_of(r, "leader", leader, sizeof leader);
        json_decref(r);
        if (!leader[0])
            continue;
        for (size_t j = 0; j < n; j++) {
            json_t *s = etcd_test_post(ports[j], "/v3/maintenance/status", "{}", NULL, &st);
            id_of(json_object_get(s, "header"), "member_id", me, sizeof me);
            json_decref(s);
            if (strcmp(me, leader) == 0)
                return (int)j;
        }
    }
    return -1;
}

pid_t etcd_test_etcdctl(int port, const char *const *args)
{
    char ep[64];
    char *argv[32];
    int n = 0;
    snprintf(ep, sizeof ep, "--endpoints=http://127.0.0.1:%d", port);
    argv[n++] = "etcdctl";
    argv[n++] = ep;
    for (size_t i = 0; args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    setenv("ETCDCTL_API", "3", 1);
    return cerb_test_spawn(argv);
}

/* ---- pausing ---- */

int etcd_test_pause(int port) { return cerb_test_pause_pid(etcd_test_pid(port)); }

int etcd_test_resume(int port) { return cerb_test_resume_pid(etcd_test_pid(port)); }
