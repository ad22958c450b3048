/*
 * cmd_holders.c — `cerberus [-c FILE] holders [--semaphore | --rwlock] NAME`:
 * who holds lock NAME (or semaphore, or read-write lock NAME) on each
 * configured engine, and who waits for it, in queue order.
 *
 * A thin user of cerb_lock_inspect (DESIGN.md §13): the engines read their
 * own layouts over their own connections, credentials and TLS, and this
 * file only prints what they say, one engine after the other in
 * configuration order, in the format of each engine's lines below (the
 * same the command printed when it read the servers itself). The
 * configuration is parsed first (for the engine list, and so that a broken
 * file is exit 78 before anything connects); then a client is opened on
 * it. An engine that cannot answer is "ENGINE: unreachable" (or "error"),
 * with the reason on stderr, and the others are still shown. The
 * in-process "local" engine cannot be seen from another process.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "config.h"

const char cerb__cli_holders_usage[] =
    "Usage: cerberus [-c FILE] holders [--semaphore | --rwlock | --election] NAME\n"
    "\n"
    "Show who holds lock NAME on every configured engine, in configuration\n"
    "order: the owner, the time its lease has left where the engine has one,\n"
    "the engine's fencing counter (the low 48 bits of the holder's fencing\n"
    "token), and the waiters in queue order. Reads the servers through the\n"
    "library (cerb_inspect), with the engines' own connections,\n"
    "credentials and timeouts; it takes no lock and changes none (the\n"
    "client it opens makes its usual session and health probes).\n"
    "\n"
    "  --semaphore  NAME is a semaphore: every permit holder (\"permits K of\n"
    "               N\"), then the waiters in queue order\n"
    "  --rwlock     NAME is a read-write lock: every reader and writer\n"
    "               (\"read\", \"write\"), then the waiters in queue order\n"
    "  --election   NAME is a leader election: its leader, as `cerberus\n"
    "               leader NAME` prints it (and takes its options)\n"
    "\n"
    "  redis: 2 holding: 3f9c...e1 (permits 1 of 4, 8412 ms left, fence 17), 9a...\n"
    "\n"
    "  redis: held by 3f9c...e1, 8412 ms left, fence 17\n"
    "  redis: waiting: 77ab...02, 01cd...9e\n"
    "  zk: held by _c_0b6e...-lock-0000000004 (session 0x1000a2f3c0001), fence 388\n"
    "  zk: waiting: _c_91d2...-lock-0000000005 (session 0x1000a2f3c0002)\n"
    "  etcd: held by 694d7a1b2c3d4e5f, 7 s left (TTL 10 s), fence 1207\n"
    "  etcd: waiting: 694d7a1b2c3d4e61\n"
    "  local: in-process, not visible from here\n"
    "\n"
    "redis: the owner token and the key's PTTL; the fence is {KEY}\\x1ffence.\n"
    "zk: the lock node (Curator's _c_<uuid>-lock-<seq> under zk.root/NAME)\n"
    "  and the session it lives with; the fence is the node's czxid plus\n"
    "  the fence offset in the node fence-offset next to zk.root.\n"
    "etcd: the key under etcd.prefix NAME/ (the contender's lease in hex),\n"
    "  the lease's time to live; the fence is the key's create revision\n"
    "  plus the fence offset the key holds.\n"
    "A server that cannot be reached prints \"ENGINE: unreachable\", with\n"
    "the reason on stderr; the other engines are still shown.\n"
    "\n"
    "Exit status: 0 ok, 69 a server could not be asked, 78 configuration\n"
    "error, 64 usage (or NAME is not a valid lock name on some engine).\n";

void cerb__cli_print_bytes(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            putchar(c);
        else
            printf("\\x%02x", c);
    }
}

static void print_str(const char *s)
{
    cerb__cli_print_bytes(s, strlen(s));
}

/* An owner; on etcd "" is a key equal to the name's prefix itself. */
static void print_owner(const char *engine, const char *owner)
{
    if (!owner[0] && strcmp(engine, "etcd") == 0)
        printf("(the prefix key itself)");
    else
        print_str(owner);
}

/* What the zk engine appends to the holder's detail when its fence is an
 * upper bound (engine_zk/zk_inspect.c): printed after the fence instead. */
#define ZK_FENCE_AT_MOST "; fence at most"

/* zk: "OWNER (session 0x..., data "...")". */
static void print_zk_owner(const cerb_holder_info *h)
{
    const char *note = strstr(h->detail, ZK_FENCE_AT_MOST);
    size_t dl = note ? (size_t)(note - h->detail) : strlen(h->detail);
    print_str(h->owner);
    printf(" (");
    cerb__cli_print_bytes(h->detail, dl);
    printf(")");
}

/* The holder's line, after "ENGINE: held by ". */
static void print_holder(const char *engine, const cerb_holder_info *h)
{
    if (strcmp(engine, "zk") == 0) {
        print_zk_owner(h);
        if (h->fence == 0)
            printf(", fence unknown (the fence offset node holds no number)\n");
        else if (strstr(h->detail, ZK_FENCE_AT_MOST))
            printf(", fence at most %" PRIu64 " (the fence offset was raised since)\n",
                   h->fence);
        else
            printf(", fence %" PRIu64 "\n", h->fence);
        return;
    }
    print_owner(engine, h->owner);
    if (strcmp(engine, "etcd") == 0) {
        if (h->ttl_ms >= 0)
            printf(", %" PRId64 " s left (%s)", h->ttl_ms / 1000, h->detail);
        else if (strcmp(h->detail, "lease expired") == 0)
            printf(", lease %s expired", h->owner);
        else
            printf(", no expiry");
        printf(", fence %" PRIu64 "\n", h->fence);
        return;
    }
    if (h->ttl_ms >= 0)
        printf(", %" PRId64 " ms left", h->ttl_ms);
    else
        printf(", no expiry");
    if (h->fence)
        printf(", fence %" PRIu64, h->fence);
    if (h->detail[0] && strcmp(engine, "redis") != 0)
        printf(" (%s)", h->detail);
    printf("\n");
}

/* A semaphore's or read-write lock's member: "OWNER (DETAIL, N ms left,
 * fence F)". */
static void print_member(const char *e, const cerb_holder_info *h)
{
    print_owner(e, h->owner);
    printf(" (%s", h->detail);
    if (!h->waiting && h->ttl_ms >= 0)
        printf(", %" PRId64 " ms left", h->ttl_ms);
    if (!h->waiting && h->fence)
        printf(", fence %" PRIu64, h->fence);
    printf(")");
}

/* Prints engine @e's lines for a queued primitive: its holders (many at
 * once), then its waiters. */
static void print_queue(const char *e, const cerb_holder_info *v, size_t n)
{
    size_t held = 0;
    while (held < n && !v[held].waiting)
        held++;
    if (held == 0) {
        printf("%s: free\n", e);
    } else {
        printf("%s: %zu holding: ", e, held);
        for (size_t k = 0; k < held; k++) {
            if (k)
                printf(", ");
            print_member(e, &v[k]);
        }
        printf("\n");
    }
    for (size_t k = held; k < n; k++) {
        printf(k == held ? "%s: waiting: " : ", ", e);
        print_member(e, &v[k]);
    }
    if (n > held)
        printf("\n");
}

/* Prints engine @e's lines from its entries v[0..n). */
static void print_engine(const char *e, const cerb_holder_info *v, size_t n)
{
    size_t i = 0;
    if (n > 0 && !v[0].waiting) {
        printf("%s: held by ", e);
        print_holder(e, &v[0]);
        i = 1;
    } else {
        printf("%s: free\n", e);
    }
    for (size_t k = i; k < n; k++) {
        printf(k == i ? "%s: waiting: " : ", ", e);
        if (strcmp(e, "zk") == 0)
            print_zk_owner(&v[k]);
        else
            print_owner(e, v[k].owner);
    }
    if (n > i)
        printf("\n");
}

/* Prints engine @e's line for a failed inspection; returns the exit code. */
static int print_failure(const char *e, cerb_status st, const char *why)
{
    switch (st) {
    case CERB_EINVAL: /* the name, refused by this engine's rule */
        printf("%s: not a valid lock name here\n", e);
        cerb__cli_error("%s", why);
        return CLI_EXIT_USAGE;
    case CERB_ENOMEM:
        cerb__cli_error("%s: out of memory", e);
        return CLI_EXIT_OSERR;
    case CERB_EIO:
    case CERB_TIMEOUT:
    case CERB_UNAVAILABLE:
        printf("%s: unreachable\n", e);
        cerb__cli_error("%s: unreachable: %s", e, why);
        return CLI_EXIT_UNAVAILABLE;
    default:
        printf("%s: error\n", e);
        cerb__cli_error("%s: %s", e, why);
        return cerb__cli_exit_code(st);
    }
}

/* `holders [--semaphore | --rwlock] [--] NAME`: -1 to go on with *name and
 * *kind, or the exit code (printed). */
static int parse_args(int argc, char **argv, const char **name, int *kind)
{
    *kind = CERB_KIND_LOCK;
    for (int i = 1; i < argc; i++) {
        if (cerb__cli_is_help(argv[i])) {
            fputs(cerb__cli_holders_usage, stdout);
            return CLI_EXIT_OK;
        }
        if (strcmp(argv[i], "--semaphore") == 0 || strcmp(argv[i], "--rwlock") == 0) {
            if (*kind != CERB_KIND_LOCK)
                return cerb__cli_usage_error("holders", "one of --semaphore, --rwlock and "
                                                        "--election");
            *kind = argv[i][2] == 's' ? CERB_KIND_SEMAPHORE : CERB_KIND_RWLOCK;
            continue;
        }
        if (strcmp(argv[i], "--") == 0 && i + 1 < argc) {
            if (*name || i + 2 != argc)
                return cerb__cli_usage_error("holders", "one NAME");
            *name = argv[i + 1];
            break;
        }
        if (argv[i][0] == '-')
            return cerb__cli_usage_error("holders", "unknown option '%s'", argv[i]);
        if (*name)
            return cerb__cli_usage_error("holders", "one NAME");
        *name = argv[i];
    }
    if (!*name)
        return cerb__cli_usage_error("holders", "NAME is missing");
    if (!cerb__cli_name_ok(*name))
        return cerb__cli_usage_error("holders", "bad lock name (1-255 bytes, no "
                                                "control characters)");
    return -1;
}

/* `holders --election ...` is `leader ...`: argv without the flag in @out
 * (argc - 1 entries); false when the flag is not there. */
static bool as_leader(int argc, char **argv, char **out)
{
    int k = 0;
    bool found = false;
    for (int i = 0; i < argc; i++) {
        if (!found && i > 0 && strcmp(argv[i], "--election") == 0) {
            found = true;
            continue;
        }
        if (strcmp(argv[i], "--") == 0 && !found)
            return false;
        if (k < argc - 1)
            out[k++] = argv[i];
    }
    return found;
}

int cerb__cli_holders_parse(int argc, char **argv)
{
    const char *name = NULL;
    int kind;
    char *largv[argc > 0 ? argc : 1];
    if (as_leader(argc, argv, largv))
        return cerb__cli_leader_parse(argc - 1, largv);
    return parse_args(argc, argv, &name, &kind);
}

int cerb__cli_holders(const struct cerb__cli *cli, int argc, char **argv)
{
    const char *name = NULL;
    struct cerb_config *cfg = NULL;
    cerb_client *c = NULL;
    cerb_status st;
    int rc, kind;

    char *largv[argc > 0 ? argc : 1];
    if (as_leader(argc, argv, largv))
        return cerb__cli_leader(cli, argc - 1, largv);
    rc = parse_args(argc, argv, &name, &kind);
    if (rc >= 0)
        return rc;
    rc = CLI_EXIT_OK;
    st = cli->config_path ? cerb__config_from_file(cli->config_path, &cfg)
                          : cerb__config_defaults(&cfg);
    if (st != CERB_OK) {
        cerb__cli_error("%s", cerb_last_error());
        return cerb__cli_exit_code(st);
    }
    /* Engines that do not answer are reported below, one line each: the
     * library's warnings about them would say it twice. */
    cerb__cli_log_init(cli, CERB_LOG_ERROR);
    st = cerb_client_open(&c, cli->config_path);
    if (st != CERB_OK && st != CERB_ECONFIG && st != CERB_ENOMEM) {
        /* Not one engine would open: each is unreachable. */
        char why[512];
        snprintf(why, sizeof why, "%s", cerb_last_error());
        for (size_t i = 0; i < cfg->n_engines; i++) {
            fflush(stdout);
            int r = print_failure(cfg->engines[i], st, why);
            if (rc == CLI_EXIT_OK)
                rc = r;
        }
    } else if (st != CERB_OK) {
        cerb__cli_error("%s", cerb_last_error());
        rc = cerb__cli_exit_code(st);
    }
    for (size_t i = 0; c && i < cfg->n_engines; i++) {
        const char *e = cfg->engines[i];
        cerb_holder_info *v = NULL;
        size_t n = 0;
        int r = CLI_EXIT_OK;
        fflush(stdout);
        if (strcmp(e, "local") == 0) {
            printf("local: in-process, not visible from here\n");
            continue;
        }
        st = cerb_inspect(c, kind, name, e, &v, &n);
        if (st == CERB_OK && kind != CERB_KIND_LOCK)
            print_queue(e, v, n);
        else if (st == CERB_OK)
            print_engine(e, v, n);
        else
            r = print_failure(e, st, cerb_last_error());
        cerb_holders_free(v, n);
        fflush(stdout);
        if (r != CLI_EXIT_OK && rc == CLI_EXIT_OK)
            rc = r;
    }
    cerb_client_close(c);
    cerb__config_free(cfg);
    return rc;
}
