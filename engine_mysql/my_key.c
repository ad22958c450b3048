/*
 * my_key.c — a lock name's GET_LOCK name (mysql.key), so that other
 * libraries' GET_LOCKs and ours on the same name exclude each other:
 *
 *   dl    DistributedLock (madelson, MySqlDistributedLock.GetSafeName): a
 *         name with no uppercase letter and at most 64 characters is used
 *         as is. Any other is hashed: SHA-512 of its UTF-8 bytes, the first
 *         160 bits written as 32 characters of base32 (alphabet a-z2-7)
 *         taking 5 bits at a time from the least significant end of a bit
 *         buffer fed byte by byte (byte k enters at bit 8k); the name,
 *         lowercased, gives the first 32 characters before the hash.
 *         DistributedLock lowercases with .NET's invariant culture; this
 *         does it for ASCII only, so a name with any byte >= 0x80 is always
 *         hashed here, and its prefix stops at its first such byte: such
 *         names are not promised to match DistributedLock's.
 *   raw   the name itself, at most 64 characters of valid UTF-8 (tooz).
 *         GET_LOCK names are case-insensitive on MySQL, so names that
 *         differ only in case share one GET_LOCK there (they wait for each
 *         other; they never exclude less); MariaDB (10.11, checked)
 *         compares them byte for byte.
 */
#include "internal_posix.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "my_internal.h"

static const char b32[] = "abcdefghijklmnopqrstuvwxyz234567";

/* 32 base32 characters of the first 160 bits of SHA-512(name). */
static cerb_status dl_hash(const char *name, size_t len, char out[33])
{
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned int hn = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha512(), NULL) == 1 &&
              EVP_DigestUpdate(ctx, name, len) == 1 && EVP_DigestFinal_ex(ctx, h, &hn) == 1;
    EVP_MD_CTX_free(ctx);
    if (!ok || hn < 20)
        return cerb__error_set(CERB_ENOMEM, "mysql: cannot hash the name (libcrypto)");
    unsigned buf = 0;
    int bits = 0, k = 0;
    for (int c = 0; c < 32; c++) {
        if (bits < 5) {
            buf |= (unsigned)h[k++] << bits;
            bits += 8;
        }
        out[c] = b32[buf & 31u];
        buf >>= 5;
        bits -= 5;
    }
    out[32] = '\0';
    return CERB_OK;
}

/* Characters of valid UTF-8 text, or -1 when it is not valid UTF-8. */
static long utf8_chars(const unsigned char *s)
{
    long n = 0;
    while (*s) {
        int extra = *s < 0x80 ? 0 : (*s & 0xe0) == 0xc0 ? 1 : (*s & 0xf0) == 0xe0 ? 2
                                   : (*s & 0xf8) == 0xf0 ? 3 : -1;
        if (extra < 0 || (extra == 1 && *s < 0xc2))
            return -1;
        s++;
        for (int i = 0; i < extra; i++, s++)
            if ((*s & 0xc0) != 0x80)
                return -1;
        n++;
    }
    return n;
}

cerb_status cerb__my_lname(const char *mode, const char *name, char *out, size_t len)
{
    size_t n = strlen(name);
    if (len < MY_LNAME_MAX * 4 + 1)
        return cerb__error_set(CERB_EINVAL, "mysql: internal: lname buffer too small");
    if (mode && strcmp(mode, "raw") == 0) {
        long c = utf8_chars((const unsigned char *)name);
        if (c < 0)
            return cerb__error_set(CERB_EINVAL,
                                   "mysql: with mysql.key = \"raw\" a name must be UTF-8 text "
                                   "(it is the GET_LOCK name)");
        if (c > MY_LNAME_MAX)
            return cerb__error_set(CERB_EINVAL,
                                   "mysql: with mysql.key = \"raw\" a name has at most %d "
                                   "characters (GET_LOCK's limit); \"%.20s...\" has %ld; use "
                                   "mysql.key = \"dl\" to hash long names",
                                   MY_LNAME_MAX, name, c);
        snprintf(out, len, "%s", name);
        return CERB_OK;
    }
    if (mode && strcmp(mode, "dl") != 0)
        return cerb__error_set(CERB_EINVAL, "mysql: unknown mysql.key \"%s\"", mode);
    bool as_is = n <= MY_LNAME_MAX;
    for (size_t i = 0; i < n && as_is; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c >= 0x80 || (c >= 'A' && c <= 'Z'))
            as_is = false;
    }
    if (as_is) {
        snprintf(out, len, "%s", name);
        return CERB_OK;
    }
    char hash[33];
    cerb_status st = dl_hash(name, n, hash);
    if (st != CERB_OK)
        return st;
    size_t p = 0;
    for (; p < n && p < 32; p++) {
        unsigned char c = (unsigned char)name[p];
        if (c >= 0x80)
            break;
        out[p] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    }
    memcpy(out + p, hash, 33);
    return CERB_OK;
}
