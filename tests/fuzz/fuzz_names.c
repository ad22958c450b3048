/*
 * fuzz_names.c — libFuzzer harness of lock names: the core's check
 * (cerb_lock_new on a client), each engine's check_name, and what each
 * engine builds from an accepted name — Redis' keys, ZooKeeper's paths,
 * etcd's key and range.
 *
 * Properties, for every name:
 *  - the core accepts exactly the names of its contract: 1..255 bytes, no
 *    control character (cerberus.h; the CLI's check says the same);
 *  - nothing crashes, misbehaves or leaks, for accepted and refused names;
 *  - a name every check accepts yields keys of the documented layout, and
 *    **no other accepted name can reach them**: Redis' lock key K = P+name
 *    is never one of another name's helper keys (fence counter, queue,
 *    waiter data, wake lists; their layout is learnt from keys_init, so
 *    the check follows a change of it), whatever the prefix P; etcd's key
 *    P+name/<lease> lies in no other name's range P+n2/; ZooKeeper's
 *    parent path is exactly one component under the root, and the node
 *    name's ordering and uuid parse do not depend on the lock name. A collision would let one lock's
 *    holder change another lock's state (its fence counter, its queue).
 *
 *  - the idempotency guard's scope follows the same rule: cerb_guard_begin
 *    refuses exactly the scopes the contract refuses (CERB_EINVAL), and
 *    with an accepted scope and the input as the key (any bytes) it runs
 *    the operation (a fresh key: CERB_OK), which finish(0) deletes again.
 *
 * The input is the name itself (bytes up to the first NUL).
 */
#include "internal_posix.h"

#include "alloc.h"
#include "engine.h"
#include "fuzz.h"

#ifdef CERB_WITH_REDIS
#include "redis_scripts.h"
extern const struct cerb_engine_ops cerb__redis_engine_ops;
#endif
#ifdef CERB_WITH_ZK
#include "zk_layout.h"
extern const struct cerb_engine_ops cerb__zk_engine_ops;
#endif
#ifdef CERB_WITH_ETCD
/* fuzz_names_etcd.c: etcd's private header cannot share a file with
 * Redis' (each defines struct cerb_engine). */
void fuzz_names_etcd(const char *name);
#endif

static cerb_client *client;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* One in-process client for the whole run: the core's check is
     * reached through cerb_lock_new(). */
    if (cerb_client_open_string(&client, "engines = (\"local\");\n") != CERB_OK) {
        fprintf(stderr, "fuzz_names: cannot open a client: %s\n", cerb_last_error());
        abort();
    }
    return 0;
}

/* Would every check take the name s[0..n)? (The core's rule, then the
 * engine's.) */
static bool accepted(const struct cerb_engine_ops *ops, const char *s, size_t n)
{
    if (!fuzz_name_contract_ok(s, n))
        return false;
    char *c = fuzz_cstr((const uint8_t *)s, n);
    bool ok = cerb__engine_check_name(ops, c) == CERB_OK;
    free(c);
    return ok;
}

#ifdef CERB_WITH_REDIS
#define REDIS_TOKEN "5b1f0a52-3f0e-4c1b-9b7e-2f5d8c9e0a11:1"

/*
 * The layout of helper key i for prefix P, learnt from the engine itself
 * (so this check follows a change of layout): keys_init for the name
 * "@NAME@" gives pre + "@NAME@" + suf (+ the token for the wake list).
 */
static void redis_layout(const char *prefix, int i, char *pre, char *suf, size_t cap)
{
    struct redis_keys ks;
    FUZZ_CHECK(cerb__redis_keys_build(&ks, prefix, "@NAME@", REDIS_TOKEN, NULL) == CERB_OK, "keys_init");
    const char *at = strstr(ks.k[i], "@NAME@");
    FUZZ_CHECK(at != NULL, "helper key %d does not contain the name", i);
    size_t pl = (size_t)(at - ks.k[i]), sl = strlen(at + 6);
    if (i == REDIS_W)
        sl -= strlen(REDIS_TOKEN);
    FUZZ_CHECK(pl < cap && sl < cap, "layout too long");
    memcpy(pre, ks.k[i], pl);
    pre[pl] = '\0';
    memcpy(suf, at + 6, sl);
    suf[sl] = '\0';
    cerb__redis_keys_free(&ks);
}

/* Is the lock key K (= P + name) helper key i of another accepted name n2,
 * i.e. pre + n2 + suf (+ any token for the wake list)? */
static void redis_no_collision(const char *prefix, const char *key, size_t klen)
{
    static const char *const what[REDIS_NKEYS] = {"lock", "fence", "queue", "data", "wake list"};
    char pre[256], suf[256];

    for (int i = REDIS_F; i < REDIS_NKEYS; i++) {
        redis_layout(prefix, i, pre, suf, sizeof pre);
        size_t pl = strlen(pre), sl = strlen(suf);
        if (klen <= pl + sl || memcmp(key, pre, pl) != 0)
            continue;
        if (i != REDIS_W) {
            if (memcmp(key + klen - sl, suf, sl) == 0)
                FUZZ_CHECK(!accepted(&cerb__redis_engine_ops, key + pl, klen - pl - sl),
                           "redis: lock key \"%.*s\" is the %s key of lock \"%.*s\"",
                           (int)klen, key, what[i], (int)(klen - pl - sl), key + pl);
            continue;
        }
        /* The wake list: the name ends at any occurrence of suf that a
         * (non-empty) token follows. */
        for (size_t j = pl; j + sl < klen; j++)
            if (memcmp(key + j, suf, sl) == 0)
                FUZZ_CHECK(!accepted(&cerb__redis_engine_ops, key + pl, j - pl),
                           "redis: lock key \"%.*s\" is a wake list of lock \"%.*s\"",
                           (int)klen, key, (int)(j - pl), key + pl);
    }
}

static void redis_keys(const char *name)
{
    static const char *const prefixes[] = {"", "app:", "{", "{{"};
    size_t nl = strlen(name);

    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++) {
        struct redis_keys ks;
        const char *pf = prefixes[p];
        size_t pl = strlen(pf);
        FUZZ_CHECK(cerb__redis_keys_build(&ks, pf, name, REDIS_TOKEN, NULL) == CERB_OK, "keys_init");
        FUZZ_CHECK(ks.len[REDIS_K] == pl + nl && memcmp(ks.k[REDIS_K], pf, pl) == 0 &&
                       memcmp(ks.k[REDIS_K] + pl, name, nl) == 0,
                   "K is not prefix+name (redis-py's layout)");
        for (int i = 0; i < REDIS_NKEYS; i++)
            FUZZ_CHECK(strlen(ks.k[i]) == ks.len[i], "key %d: length", i);
        redis_no_collision(pf, ks.k[REDIS_K], ks.len[REDIS_K]);
        cerb__redis_keys_free(&ks);
    }
}
#endif

#ifdef CERB_WITH_ZK
static void zk_paths(const char *name)
{
    static const char *const roots[] = {"/cerberus/locks", "/"};
    static const char uuid[] = "5b1f0a52-3f0e-4c1b-9b7e-2f5d8c9e0a11";

    FUZZ_CHECK(!strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0,
               "zk accepted a name that is not one path component");
    for (size_t r = 0; r < 2; r++) {
        char *parent = cerb__zk_parent_path(roots[r], name);
        FUZZ_CHECK(parent != NULL, "parent_path");
        FUZZ_CHECK(strcmp(cerb__zk_basename(parent), name) == 0, "basename(parent) != name");
        char *pfx = cerb__zk_node_prefix(parent, uuid);
        FUZZ_CHECK(pfx != NULL, "node_prefix");
        size_t n = strlen(pfx);
        char *node = malloc(n + 11);
        if (!node)
            abort();
        memcpy(node, pfx, n);
        memcpy(node + n, "0000000042", 11);
        const char *child = cerb__zk_basename(node);
        FUZZ_CHECK(cerb__zk_child_has_uuid(child, uuid), "our node lost its uuid");
        FUZZ_CHECK(strcmp(cerb__zk_child_key(child), "0000000042") == 0,
                   "our node's ordering key depends on the name");
        free(node);
        cerb__free(pfx);
        cerb__free(parent);
    }
}
#endif


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 2 * FUZZ_NAME_MAX)
        return 0; /* longer names are refused by length alone */
    char *name = fuzz_cstr(data, size);
    size_t n = strlen(name);
    cerb_lock *l = NULL;

    cerb_guard *g = NULL;
    cerb_status gs = cerb_guard_begin(client, name, data, size, NULL, &g);
    if (fuzz_name_contract_ok(name, n)) {
        /* A key seen before is a duplicate of a finished attempt: every
         * attempt here is deleted (finish 0), so none is. */
        FUZZ_CHECK(gs == CERB_OK, "guard: an accepted scope gave %s (%s)", cerb_status_name(gs),
                   cerb_last_error());
        if (g) {
            FUZZ_CHECK(cerb_guard_finish(g, 0, NULL, 0) == CERB_OK, "guard: finish(0): %s",
                       cerb_last_error());
            cerb_guard_free(g);
        }
    } else {
        FUZZ_CHECK(gs == CERB_EINVAL && !g, "guard: a refused scope gave %s",
                   cerb_status_name(gs));
    }

    cerb_status st = cerb_lock_new(client, name, NULL, &l);
    FUZZ_CHECK((st == CERB_OK) == fuzz_name_contract_ok(name, n), "core said %s for a name the contract %s",
               cerb_status_name(st), fuzz_name_contract_ok(name, n) ? "accepts" : "refuses");
    if (l)
        cerb_lock_free(l);
#ifdef CERB_FUZZ_PLANTED
    /* The planted defect of the fuzz_planted build: an accepted name that
     * ends in "~~", which no kept input has. It proves that a finding fails
     * the run (ctest fuzz_planted replays one; scripts/fuzz.sh's self-test
     * must find one). */
    FUZZ_CHECK(!(st == CERB_OK && n >= 2 && name[n - 1] == '~' && name[n - 2] == '~'),
               "the planted defect was found");
#endif
    if (st != CERB_OK) {
        FUZZ_CHECK(st == CERB_EINVAL, "core refused with %s", cerb_status_name(st));
        free(name);
        return 0;
    }
#ifdef CERB_WITH_REDIS
    if (cerb__engine_check_name(&cerb__redis_engine_ops, name) == CERB_OK)
        redis_keys(name);
#endif
#ifdef CERB_WITH_ZK
    if (cerb__engine_check_name(&cerb__zk_engine_ops, name) == CERB_OK)
        zk_paths(name);
#endif
#ifdef CERB_WITH_ETCD
    fuzz_names_etcd(name);
#endif
    free(name);
    return 0;
}
