/*
 * etcd_queue_util.h — for test_etcd_semaphore.c and test_etcd_rwlock.c:
 * the keys of a queue with their values (etcd_util.h's etcd_test_keys
 * gives keys only), a key's value, and the predicates the suites wait on.
 * Raw gateway requests through etcd_test_post(); base64 written out here
 * (a few lines) so the suites need nothing beyond etcd_util.
 */
#ifndef CERB_ETCD_QUEUE_UTIL_H
#define CERB_ETCD_QUEUE_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cerberus.h"
#include "etcd_util.h"

static const char qu_b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void qu_b64(const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned char)in[i] << 16;
        if (i + 1 < n)
            v |= (unsigned char)in[i + 1] << 8;
        if (i + 2 < n)
            v |= (unsigned char)in[i + 2];
        out[o++] = qu_b64c[(v >> 18) & 63];
        out[o++] = qu_b64c[(v >> 12) & 63];
        out[o++] = i + 1 < n ? qu_b64c[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? qu_b64c[v & 63] : '=';
    }
    out[o] = '\0';
}

static size_t qu_unb64(const char *in, char *out, size_t max)
{
    size_t o = 0;
    unsigned v = 0;
    int bits = 0;
    for (; *in && *in != '='; in++) {
        const char *p = strchr(qu_b64c, *in);
        if (!p)
            break;
        v = (v << 6) | (unsigned)(p - qu_b64c);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 < max)
                out[o++] = (char)((v >> bits) & 0xff);
        }
    }
    out[o] = '\0';
    return o;
}

struct qu_kv {
    char key[600];
    char value[64];
    int64_t create_revision;
    int64_t lease;
};

static int64_t qu_i64(const json_t *o, const char *f)
{
    const json_t *v = json_object_get(o, f);
    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10)
                             : json_is_integer(v) ? json_integer_value(v) : 0;
}

/* The keys under @prefix with their values, by create revision; how many
 * there are (may exceed max), or -1. */
static int qu_keys(const char *prefix, struct qu_kv *out, int max)
{
    char k[1024], e[1024], body[2300], end[600];
    size_t n = strlen(prefix);
    if (n == 0 || n >= sizeof end)
        return -1;
    memcpy(end, prefix, n + 1);
    end[n - 1]++;
    qu_b64(prefix, n, k);
    qu_b64(end, n, e);
    snprintf(body, sizeof body,
             "{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":\"ASCEND\","
             "\"sort_target\":\"CREATE\"}",
             k, e);
    long st = 0;
    json_t *r = etcd_test_post(etcd_test_port(), "/v3/kv/range", body, NULL, &st);
    if (!r || st != 200) {
        json_decref(r);
        return -1;
    }
    int count = (int)qu_i64(r, "count");
    const json_t *kvs = json_object_get(r, "kvs");
    for (int i = 0; i < max && i < (int)json_array_size(kvs); i++) {
        const json_t *kv = json_array_get(kvs, (size_t)i);
        const char *kk = json_string_value(json_object_get(kv, "key"));
        const char *vv = json_string_value(json_object_get(kv, "value"));
        qu_unb64(kk ? kk : "", out[i].key, sizeof out[i].key);
        qu_unb64(vv ? vv : "", out[i].value, sizeof out[i].value);
        out[i].create_revision = qu_i64(kv, "create_revision");
        out[i].lease = qu_i64(kv, "lease");
    }
    json_decref(r);
    return count;
}

/* The value of @key into @buf; 1 found, 0 absent, -1 error. */
__attribute__((unused)) static int qu_get(const char *key, char *buf, size_t n)
{
    char k[1024], body[1100];
    qu_b64(key, strlen(key), k);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", k);
    long st = 0;
    json_t *r = etcd_test_post(etcd_test_port(), "/v3/kv/range", body, NULL, &st);
    if (!r || st != 200) {
        json_decref(r);
        return -1;
    }
    const json_t *kv = json_array_get(json_object_get(r, "kvs"), 0);
    int found = kv != NULL;
    const char *vv = kv ? json_string_value(json_object_get(kv, "value")) : NULL;
    if (n)
        qu_unb64(vv ? vv : "", buf, n);
    json_decref(r);
    return found;
}

/* Waiting for a number of keys under a prefix. */
struct qu_count {
    const char *prefix;
    int n;
};

__attribute__((unused)) static bool qu_count_is(void *ud)
{
    struct qu_count *c = ud;
    struct qu_kv kv[1];
    return qu_keys(c->prefix, kv, 0) == c->n;
}

/* Waiting for holders and waiters as cerb_inspect() lists them. */
struct qu_members {
    cerb_client *c;
    int kind;
    const char *name;
    size_t holders, waiters;
};

__attribute__((unused)) static bool qu_members_are(void *ud)
{
    struct qu_members *m = ud;
    cerb_holder_info *v = NULL;
    size_t n = 0, h = 0, w = 0;
    if (cerb_inspect(m->c, m->kind, m->name, NULL, &v, &n) != CERB_OK)
        return false;
    for (size_t i = 0; i < n; i++)
        *(v[i].waiting ? &w : &h) += 1;
    cerb_holders_free(v, n);
    return h == m->holders && w == m->waiters;
}

#endif
