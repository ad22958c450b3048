/*
 * mc_proto.c — the memcached meta protocol as the engine speaks it: keys,
 * expiries, requests and reply lines (memcached 1.6.18, checked against a
 * live server).
 *
 * Requests used (`<k>` the key, `b` when it is base64):
 *   ms <k> 32 T<ttl> ME c [b]\r\n<token>\r\n   acquire: add mode; HD c<cas> | NS
 *   ms <k> 32 T<ttl> C<cas> c [b]\r\n<token>\r\n renew: HD c<cas> | EX | NF
 *   md <k> C<cas> [b]                          release: HD | EX | NF
 *   mg <k> v c t [b]                           check, inspect: VA 32 c<cas> t<ttl> | EN
 *   mg <k> t [b]                               a waiter's look: HD t<ttl> | EN
 * A reply carries the flags asked for, in any order; t-1 means no expiry.
 *
 * Keys. memcached takes keys of at most 250 bytes without spaces or control
 * characters. A name that fits with the prefix is sent as it is, so another
 * client's `add` lock on the same key (Symfony, tooz, Laravel) excludes
 * with ours; any other name becomes the binary key prefix || SHA-256(name),
 * sent base64-encoded with the `b` flag (OpenSSL for both).
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "error.h"
#include "mc_internal.h"

static bool key_safe(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch <= 0x20 || ch == 0x7f)
            return false;
    }
    return true;
}

cerb_status cerb__mc_key(const char *prefix, const char *name, struct mc_key *out)
{
    size_t pl = strlen(prefix), nl = strlen(name);
    if (pl + nl <= MC_KEY_MAX && key_safe(name, nl)) {
        memcpy(out->k, prefix, pl);
        memcpy(out->k + pl, name, nl);
        out->k[pl + nl] = '\0';
        out->b64 = false;
        return CERB_OK;
    }
    /* The config check keeps the prefix to 150 bytes, so prefix and digest
     * encode to at most 244 characters. */
    unsigned char raw[150 + 32];
    unsigned int dl = 0;
    if (pl > 150)
        return cerb__error_set(CERB_ECONFIG, "memcached: the prefix is longer than 150 bytes");
    memcpy(raw, prefix, pl);
    if (!EVP_Digest(name, nl, raw + pl, &dl, EVP_sha256(), NULL) || dl != 32)
        return cerb__error_set(CERB_ENOMEM, "memcached: SHA-256 failed");
    int n = EVP_EncodeBlock((unsigned char *)out->k, raw, (int)(pl + 32));
    out->k[n] = '\0';
    out->b64 = true;
    return CERB_OK;
}

cerb_status cerb__mc_ttl_s(int64_t lease_ms, int64_t *ttl_s)
{
    if (lease_ms <= 0)
        return cerb__error_set(CERB_EINVAL, "memcached: a lease of %lld ms", (long long)lease_ms);
    int64_t s = (lease_ms + 999) / 1000 + MC_TTL_MARGIN_S;
    if (s > MC_TTL_REL_MAX)
        return cerb__error_set(CERB_EINVAL,
                               "memcached: a lease of %lld ms is above 30 days, which memcached "
                               "would read as an absolute time",
                               (long long)lease_ms);
    *ttl_s = s;
    return CERB_OK;
}

cerb_status cerb__mc_parse(const char *line, struct mc_reply *r)
{
    memset(r, 0, sizeof *r);
    r->vlen = -1;
    r->ttl_s = -1;
    if (strncmp(line, "ERROR", 5) == 0 || strncmp(line, "CLIENT_ERROR", 12) == 0 ||
        strncmp(line, "SERVER_ERROR", 12) == 0)
        return cerb__error_set(CERB_EPROTO, "memcached: the server answered \"%.200s\"", line);
    if (strlen(line) < 2 || (line[2] != '\0' && line[2] != ' '))
        return cerb__error_set(CERB_EPROTO, "memcached: unexpected reply \"%.200s\"", line);
    memcpy(r->code, line, 2);
    const char *p = line + 2;
    if (strcmp(r->code, "VA") == 0) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1048576)
            return cerb__error_set(CERB_EPROTO, "memcached: bad value length in \"%.200s\"",
                                   line);
        r->vlen = v;
        p = end;
    }
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        char f = *p++;
        char *end = (char *)p;
        if (f == 'c') {
            r->cas = strtoull(p, &end, 10);
            r->has_cas = end != p;
        } else if (f == 't') {
            r->ttl_s = strtoll(p, &end, 10);
            r->has_ttl = end != p;
        }
        p = end;
        while (*p && *p != ' ')
            p++;
    }
    return CERB_OK;
}

size_t cerb__mc_fmt_ms(char *buf, size_t len, const struct mc_key *k, int64_t ttl_s,
                       bool add_mode, uint64_t cas, const char *token)
{
    char mode[32];
    if (add_mode)
        snprintf(mode, sizeof mode, "ME");
    else
        snprintf(mode, sizeof mode, "C%" PRIu64, cas);
    int n = snprintf(buf, len, "ms %s %zu T%" PRId64 " %s c%s\r\n%s\r\n", k->k, strlen(token),
                     ttl_s, mode, k->b64 ? " b" : "", token);
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}

size_t cerb__mc_fmt(char *buf, size_t len, const char *verb, const struct mc_key *k,
                    const char *flags)
{
    int n = snprintf(buf, len, "%s %s%s%s%s\r\n", verb, k->k, flags[0] ? " " : "", flags,
                     k->b64 ? " b" : "");
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}
