/*
 * fuzz_config.c — libFuzzer harness of the configuration parser
 * (config/parse.c, validate.c, schema.c through cerb__config_from_string).
 *
 * Property: every text gives either a configuration or CERB_ECONFIG whose
 * message reads `config:LINE: message` (or `config: message` for a rule
 * about the file as a whole, where no line exists); never a crash, an
 * undefined behaviour or a leak (the build's sanitizers). A configuration
 * that parses satisfies the invariants config.h promises its consumers,
 * reloading it over itself and over the defaults never crashes, and the
 * same text parses the same way twice (no hidden state).
 *
 * Texts with `@include` are skipped: libconfig would read the named file
 * from this machine (a fuzzer can spell /dev/stdin), which is the user's
 * own file, not input.
 */
#include "internal_posix.h"

#include <ctype.h>

#include "config.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/* `config:` then `LINE: ` or ` `, then a non-empty message. */
static int well_formed(const char *msg)
{
    const char *p = msg;
    if (strncmp(p, "config:", 7) != 0)
        return 0;
    p += 7;
    if (isdigit((unsigned char)*p)) {
        while (isdigit((unsigned char)*p))
            p++;
        if (*p++ != ':')
            return 0;
    }
    return *p == ' ' && p[1] != '\0';
}

static void check_config(const struct cerb_config *c)
{
    FUZZ_CHECK(c->n_engines >= 1 && c->n_engines <= CERB_MAX_ENGINES, "n_engines %zu",
               c->n_engines);
    for (size_t i = 0; i < c->n_engines; i++)
        FUZZ_CHECK(memchr(c->engines[i], '\0', CERB_ENGINE_NAME_MAX) && c->engines[i][0],
                   "engine %zu not a terminated name", i);
    FUZZ_CHECK(strcmp(c->active, "auto") == 0 || cerb__config_engine_index(c, c->active) >= 0,
               "active \"%s\" is neither auto nor a listed engine", c->active);
    FUZZ_CHECK(c->lock.lease_ms >= 100 && c->lock.lease_ms <= 86400000, "lease_ms %lld",
               (long long)c->lock.lease_ms);
    FUZZ_CHECK(c->retry.backoff_max_ms >= c->retry.backoff_ms, "backoff_max < backoff");
    FUZZ_CHECK(c->failover.switch_grace_ms >= -1, "switch_grace_ms %lld",
               (long long)c->failover.switch_grace_ms);
    FUZZ_CHECK(c->etcd.n_endpoints >= 1 && c->etcd.n_endpoints <= CERB_MAX_ENDPOINTS,
               "etcd endpoints %zu", c->etcd.n_endpoints);
    for (size_t i = 0; i < c->etcd.n_endpoints; i++)
        FUZZ_CHECK(c->etcd.endpoints[i] != NULL, "etcd endpoint %zu NULL", i);
    FUZZ_CHECK(c->redis.host && c->redis.prefix && c->zk.hosts && c->zk.root && c->etcd.prefix &&
                   c->local.dir,
               "a string key is NULL");
    FUZZ_CHECK(c->zk.root[0] == '/', "zk.root \"%s\" not absolute", c->zk.root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    struct cerb_config *cfg = NULL, *again = NULL, *def = NULL;

    if (strstr(text, "@include")) {
        free(text);
        return 0;
    }
    cerb_status st = cerb__config_from_string(text, &cfg);
    if (st == CERB_OK) {
        FUZZ_CHECK(cfg != NULL, "CERB_OK without a configuration");
        check_config(cfg);
        FUZZ_CHECK(cerb__config_from_string(text, &again) == CERB_OK,
                   "the same text failed the second time: %s", cerb_last_error());
        FUZZ_CHECK(cerb__config_reloadable(cfg, again) == CERB_OK,
                   "a text is not a reload of itself: %s", cerb_last_error());
        if (cerb__config_defaults(&def) == CERB_OK) {
            (void)cerb__config_reloadable(def, cfg);
            (void)cerb__config_reloadable(cfg, def);
        }
        cerb__config_free(again);
        cerb__config_free(def);
        cerb__config_free(cfg);
    } else {
        FUZZ_CHECK(cfg == NULL, "a failure left a configuration");
        FUZZ_CHECK(st == CERB_ECONFIG || st == CERB_ENOMEM, "status %s",
                   cerb_status_name(st));
        const char *msg = cerb_last_error();
        FUZZ_CHECK(st == CERB_ENOMEM || well_formed(msg),
                   "the error is not `config:LINE: message`: \"%s\"", msg);
    }
    free(text);
    return 0;
}
