/*
 * pg_key.c — a lock name's advisory key (pg.key), so that other libraries'
 * session locks and ours on the same name exclude each other:
 *
 *   dl          DistributedLock (madelson, Postgres): an ASCII name of at
 *               most 9 characters is packed 7 bits a character, then one 0
 *               bit, then 1 bits (no two such names collide); 16 hex digits
 *               are the bigint they spell; "XXXXXXXX,XXXXXXXX" (8 hex digits
 *               each) is the pair of ints; anything else is hashed: SHA-1
 *               of the UTF-8 bytes, the first 8 bytes read little-endian.
 *               A hashed key also equals pals' key with no application name.
 *   pals:APP    pals with an application name: SHA-1 of "APP.name", the
 *               same 8 bytes.
 *   tooz        OpenStack tooz's pgsql driver: the pair (md5[0], md5[1]),
 *               65 536 keys in all, so unrelated names share some.
 *   int         the name is a decimal bigint, used as is.
 */
#include "internal_posix.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "pg_internal.h"

static bool digest(const char *alg, const void *a, size_t alen, const void *b, size_t blen,
                   unsigned char out[EVP_MAX_MD_SIZE])
{
    unsigned int n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_get_digestbyname(alg), NULL) == 1 &&
              EVP_DigestUpdate(ctx, a, alen) == 1 && (blen == 0 || EVP_DigestUpdate(ctx, b, blen) == 1) &&
              EVP_DigestFinal_ex(ctx, out, &n) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
}

static int64_t le64(const unsigned char *h)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | h[i];
    return (int64_t)v;
}

static bool hex8(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

static void set_pair(struct pg_key *out, uint32_t a, uint32_t b)
{
    out->pair = true;
    out->k1 = (int32_t)a;
    out->k2 = (int32_t)b;
    out->k = (int64_t)((uint64_t)a << 32 | b);
}

static cerb_status key_dl(const char *name, struct pg_key *out)
{
    size_t n = strlen(name);
    bool ascii = true;
    for (size_t i = 0; i < n; i++)
        ascii = ascii && (unsigned char)name[i] < 128;
    memset(out, 0, sizeof *out);
    if (ascii && n <= 9) {
        uint64_t v = 0;
        for (size_t i = 0; i < n; i++)
            v = v << 7 | (unsigned char)name[i];
        v <<= 1;
        for (size_t i = n; i < 9; i++)
            v = v << 7 | 0x7f;
        out->k = (int64_t)v;
        return CERB_OK;
    }
    uint32_t a, b;
    if (n == 17 && name[8] == ',' && hex8(name, &a) && hex8(name + 9, &b)) {
        set_pair(out, a, b);
        return CERB_OK;
    }
    if (n == 16 && hex8(name, &a) && hex8(name + 8, &b)) {
        out->k = (int64_t)((uint64_t)a << 32 | b);
        return CERB_OK;
    }
    unsigned char h[EVP_MAX_MD_SIZE];
    if (!digest("SHA1", name, n, NULL, 0, h))
        return cerb__error_set(CERB_ENOMEM, "pg: SHA-1 failed");
    out->k = le64(h);
    return CERB_OK;
}

cerb_status cerb__pg_key(const char *mode, const char *name, struct pg_key *out)
{
    unsigned char h[EVP_MAX_MD_SIZE];
    memset(out, 0, sizeof *out);
    if (strcmp(mode, "dl") == 0)
        return key_dl(name, out);
    if (strcmp(mode, "tooz") == 0) {
        if (!digest("MD5", name, strlen(name), NULL, 0, h))
            return cerb__error_set(CERB_ENOMEM, "pg: MD5 failed");
        set_pair(out, h[0], h[1]);
        return CERB_OK;
    }
    if (strncmp(mode, "pals:", 5) == 0) {
        size_t al = strlen(mode + 5), nl = strlen(name);
        char *s = cerb__malloc(al + 1 + nl);
        if (!s)
            return cerb__error_set(CERB_ENOMEM, "pg: out of memory");
        memcpy(s, mode + 5, al);
        s[al] = '.';
        memcpy(s + al + 1, name, nl);
        bool ok = digest("SHA1", s, al + 1 + nl, NULL, 0, h);
        cerb__free(s);
        if (!ok)
            return cerb__error_set(CERB_ENOMEM, "pg: SHA-1 failed");
        out->k = le64(h);
        return CERB_OK;
    }
    if (strcmp(mode, "int") == 0) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(name, &end, 10);
        if (errno != 0 || end == name || *end != '\0' || name[0] == ' ' || name[0] == '+')
            return cerb__error_set(CERB_EINVAL,
                                   "pg: with pg.key = \"int\" a lock name must be a decimal "
                                   "64-bit integer, not \"%s\"",
                                   name);
        out->k = (int64_t)v;
        return CERB_OK;
    }
    return cerb__error_set(CERB_ECONFIG, "pg: unknown pg.key \"%s\"", mode);
}
