/*
 * fuzz_names_etcd.c — the etcd part of fuzz_names.c (see there): the key
 * <prefix><name>/<lease hex> of an accepted name, and its range.
 */
#include "internal_posix.h"

#include "engine.h"
#include "etcd_internal.h"
#include "fuzz.h"

extern const struct cerb_engine_ops cerb__etcd_engine_ops;

void fuzz_names_etcd(const char *name);

static bool accepted(const struct cerb_engine_ops *ops, const char *s, size_t n)
{
    if (!fuzz_name_contract_ok(s, n))
        return false;
    char *c = fuzz_cstr((const uint8_t *)s, n);
    bool ok = cerb__engine_check_name(ops, c) == CERB_OK;
    free(c);
    return ok;
}

static void etcd_key(const char *name)
{
    static const char *const prefixes[] = {"", "/cerberus/"};
    size_t nl = strlen(name);

    for (size_t p = 0; p < 2; p++) {
        struct etcd_key k;
        const char *pf = prefixes[p];
        size_t pl = strlen(pf);
        FUZZ_CHECK(cerb__etcd_key_init(&k, pf, name, INT64_C(0x694d8a2f5e1c3b7)) == CERB_OK,
                   "key_init");
        FUZZ_CHECK(k.pfx_len == pl + nl + 1 && memcmp(k.k, pf, pl) == 0 &&
                       memcmp(k.k + pl, name, nl) == 0 && k.k[pl + nl] == '/',
                   "key is not prefix+name+/");
        /* The key is inside its own range [P+name/, end). */
        FUZZ_CHECK(memcmp(k.k, k.end, k.pfx_len) < 0, "key not below its range end");
        /* ... and inside no other accepted name's range P+n2/. */
        for (size_t j = pl + 1; j < k.len; j++)
            if (k.k[j] == '/' && j != pl + nl)
                FUZZ_CHECK(!accepted(&cerb__etcd_engine_ops, k.k + pl, j - pl),
                           "etcd: key \"%s\" is in lock \"%.*s\"'s range", k.k, (int)(j - pl),
                           k.k + pl);
        cerb__etcd_key_free(&k);
    }
}

void fuzz_names_etcd(const char *name)
{
    if (cerb__engine_check_name(&cerb__etcd_engine_ops, name) == CERB_OK)
        etcd_key(name);
}
