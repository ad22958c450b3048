/*
 * switch_closure.c — an operator's switch as an event the engines know
 * (DESIGN.md §5, core/closure.c), on a real redis (the engine left) and a
 * real ZooKeeper (the engine switched to), both the shared test servers.
 *
 * Every case uses a redis prefix and a zk root of its own: a closure record
 * is one per store and prefix, and would close the shared servers to every
 * other suite's clients at lower epochs.
 *
 *   - a laggard — a process on the old file that never reloads — is refused
 *     on the engine the switch closed, and is not granted there;
 *   - a laggard that can read the new file follows it when refused: it is
 *     granted on the new engine, with the new epoch in its token;
 *   - the steady state after a switch asks the engine left once per name,
 *     takes no claims there, and no question after the grant;
 *   - a name held on the engine left before the switch is still refused on
 *     the new engine while that hold lives, and granted once it is released;
 *     a semaphore's permit held there likewise keeps the new engine from
 *     granting any permit of the name (no claims are taken on a closed
 *     engine, so permits granted on the new one would not be counted
 *     there: a spare permit is not enough), until it is released;
 *   - the record, lost with the server's data, is written back by
 *     the clients that follow the file, and the answers kept before are not
 *     trusted meanwhile.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "cerberus.h"
#include "test_util.h"
#include "zk_util.h"

#define LEASE_MS 2000

struct store {
    char *prefix; /* redis prefix */
    char *root;   /* zk root */
};

static void store_init(struct store *s)
{
    /* With its marker written: a first grant under a new prefix would
     * otherwise wait a quarantine, and hide what the cases look at. */
    s->prefix = cerb_test_redis_namespace("closure", 0);
    assert_non_null(s->prefix);
    s->prefix[strlen(s->prefix) - 1] = '\0'; /* the ':' is added below */
    char *r = test_name("/closure");
    size_t n = strlen(r) + sizeof "/locks";
    s->root = malloc(n);
    assert_non_null(s->root);
    snprintf(s->root, n, "%s/locks", r); /* the record sits next to the root */
    free(r);
}

static void store_free(struct store *s)
{
    free(s->prefix);
    free(s->root);
}

/* A file listing redis then zk, with `active` and `epoch`; watch says
 * whether the client follows it by itself. */
static char *write_cfg_fo(const struct store *s, const char *active, int epoch, bool watch,
                          const char *fo_extra)
{
    char *p = cerb_test_write_config(
        "engines = (\"redis\", \"zk\");\n"
        "active = \"%s\";\n"
        "epoch = %d;\n"
        "lock = { lease_ms = %d; };\n"
        "failover = { watch_config = %s; probe_interval_ms = 100; probe_timeout_ms = 100; %s };\n"
        "redis = { host = \"127.0.0.1\"; port = %d; prefix = \"%s:\"; };\n"
        "zk = { hosts = \"127.0.0.1:%d\"; root = \"%s\"; };\n",
        active, epoch, LEASE_MS, watch ? "true" : "false", fo_extra, cerb_test_redis_port(), s->prefix,
        cerb_test_zk_port(), s->root);
    assert_non_null(p);
    return p;
}

static char *write_cfg(const struct store *s, const char *active, int epoch, bool watch)
{
    return write_cfg_fo(s, active, epoch, watch, "");
}

static cerb_client *open_file(const char *path)
{
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open(&c, path);
    if (st != CERB_OK)
        fail_msg("open %s: %s: %s", path, cerb_strerror(st), cerb_last_error());
    return c;
}

/* Does redis hold the key <prefix>:<name>? */
static bool redis_has(const struct store *s, const char *name)
{
    redisContext *rc = redisConnect("127.0.0.1", cerb_test_redis_port());
    assert_true(rc && !rc->err);
    redisReply *r = redisCommand(rc, "EXISTS %s:%s", s->prefix, name);
    assert_non_null(r);
    bool has = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    redisFree(rc);
    return has;
}

/* What a loss of the data does to this case's prefix (the server is shared:
 * no FLUSHALL): the marker and the record are gone. */
static void redis_lose_data(const struct store *s)
{
    redisContext *rc = redisConnect("127.0.0.1", cerb_test_redis_port());
    assert_true(rc && !rc->err);
    redisReply *r = redisCommand(rc, "DEL %s:\x1f" "cerberus %s:\x1f" "cerberus\x1f" "closure",
                                 s->prefix, s->prefix);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 2);
    freeReplyObject(r);
    redisFree(rc);
}

static struct cerb_engine_info info(cerb_client *c, const char *engine)
{
    struct cerb_engine_info in;
    assert_int_equal(cerb_engine_info(c, engine, &in), CERB_OK);
    return in;
}

/* A laggard on the old file is refused where the switch closed, and holds
 * nothing there. */
static void test_laggard_refused(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *old = write_cfg(&s, "redis", 1, false);
    char *cur = write_cfg(&s, "zk", 2, true);
    cerb_client *lag = open_file(old);
    cerb_client *fol = open_file(cur); /* writes the records */
    char *name = test_name("lag");
    cerb_lock *l = cerb_test_handle(lag, name);
    assert_non_null(l);

    cerb_status st = cerb_lock_trylock(l);
    print_message("laggard: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_int_equal(st, CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "epoch 2"));
    assert_false(redis_has(&s, name));
    /* Not a failure of redis: its breaker stays closed. */
    assert_int_equal(info(lag, "redis").breaker, CERB_BREAKER_CLOSED);

    cerb_lock_free(l);
    cerb_client_close(lag);
    cerb_client_close(fol);
    free(name);
    cerb_test_remove_file(old);
    cerb_test_remove_file(cur);
    store_free(&s);
}

/* A laggard whose file has moved on follows it when refused. */
static void test_laggard_follows(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *path = write_cfg(&s, "redis", 1, false);
    cerb_client *lag = open_file(path);
    char *next = write_cfg(&s, "zk", 2, false);
    assert_int_equal(rename(next, path), 0);
    free(next);
    cerb_client *fol = open_file(path);
    char *name = test_name("follow");
    cerb_lock *l = cerb_test_handle(lag, name);
    assert_non_null(l);

    /* A trylock is refused at once (the file is read again on the probe
     * thread); a wait follows the file. */
    assert_int_equal(cerb_lock_trylock_for(l, 5000), CERB_OK);
    uint64_t fence = cerb_lock_fencing_token(l);
    print_message("laggard granted on %s, fence epoch %llu\n", cerb_engine_current(lag),
                  (unsigned long long)(fence >> 48));
    assert_string_equal(cerb_engine_current(lag), "zk");
    assert_int_equal(fence >> 48, 2);
    assert_false(redis_has(&s, name));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    cerb_lock_free(l);
    cerb_client_close(lag);
    cerb_client_close(fol);
    free(name);
    cerb_test_remove_file(path);
    store_free(&s);
}

#define NAMES 4
#define ROUNDS 50

/* After the switch, the engine left is asked once per name, and nothing is
 * claimed there. */
static void test_steady_state_asks_once(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *path = write_cfg(&s, "zk", 2, true);
    cerb_client *c = open_file(path);
    assert_int_equal(info(c, "redis").closed_epoch, 2);
    cerb_lock *l[NAMES];
    char *names[NAMES];
    for (int i = 0; i < NAMES; i++) {
        char p[16];
        snprintf(p, sizeof p, "steady%d", i);
        names[i] = test_name(p);
        l[i] = cerb_test_handle(c, names[i]);
        assert_non_null(l[i]);
    }
    struct cerb_engine_info before = info(c, "redis");
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < NAMES; i++) {
            assert_int_equal(cerb_lock_trylock(l[i]), CERB_OK);
            assert_int_equal(cerb_lock_unlock(l[i]), CERB_OK);
        }
    struct cerb_engine_info after = info(c, "redis");
    uint64_t asked = after.gate_questions - before.gate_questions;
    uint64_t claims = after.acquire_calls - before.acquire_calls;
    print_message("%d acquisitions: %llu questions to redis, %llu claims\n", NAMES * ROUNDS,
                  (unsigned long long)asked, (unsigned long long)claims);
    /* A lapse of the record's freshness (a stalled prober on a loaded
     * machine) may ask again: allow one more round of questions. */
    assert_true(asked <= 2 * NAMES);
    assert_int_equal(claims, 0);

    for (int i = 0; i < NAMES; i++) {
        cerb_lock_free(l[i]);
        free(names[i]);
    }
    cerb_client_close(c);
    cerb_test_remove_file(path);
    store_free(&s);
}

/* A hold from before the switch is respected on the new engine while it
 * lives; its release frees the name there. */
static void test_hold_before_switch_respected(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *old = write_cfg(&s, "redis", 1, false);
    cerb_client *holder = open_file(old);
    char *name = test_name("before");
    cerb_lock *h = cerb_test_handle(holder, name);
    cerb_status hs = cerb_lock_trylock(h);
    if (hs != CERB_OK)
        fail_msg("holder: %s: %s", cerb_status_name(hs), cerb_last_error());

    char *cur = write_cfg(&s, "zk", 2, true);
    cerb_client *c = open_file(cur);
    cerb_lock *l = cerb_test_handle(c, name);
    for (int i = 0; i < 3; i++)
        assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    /* Renewed past the lease: still respected. */
    cerb_test_let_time_pass(LEASE_MS + LEASE_MS / 2);
    assert_int_equal(cerb_lock_state(h), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(h), CERB_OK);
    cerb_status st = cerb_lock_trylock(l);
    print_message("after the release: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    cerb_lock_free(l);
    cerb_lock_free(h);
    cerb_client_close(c);
    cerb_client_close(holder);
    free(name);
    cerb_test_remove_file(old);
    cerb_test_remove_file(cur);
    store_free(&s);
}

/* A permit of a semaphore of 2 stands on the closed engine: the new engine
 * grants no permit of the name while it does (chaos redis-zk-prims found
 * three permits of two: each permit granted on zk saw one on redis and
 * room for itself, and none on zk counted there). */
static void test_permit_before_switch_respected(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *old = write_cfg(&s, "redis", 1, false);
    cerb_client *holder = open_file(old);
    char *name = test_name("sem-before");
    cerb_semaphore *sh = NULL, *sc = NULL;
    assert_int_equal(cerb_semaphore_new(holder, name, 2, NULL, &sh), CERB_OK);
    cerb_permit *ph = NULL, *p1 = NULL, *p2 = NULL;
    cerb_status hs = cerb_semaphore_acquire(sh, 1, 5000, NULL, &ph);
    if (hs != CERB_OK)
        fail_msg("holder: %s: %s", cerb_status_name(hs), cerb_last_error());

    char *cur = write_cfg(&s, "zk", 2, true);
    cerb_client *c = open_file(cur);
    assert_int_equal(cerb_semaphore_new(c, name, 2, NULL, &sc), CERB_OK);
    cerb_status st = cerb_semaphore_acquire(sc, 1, 0, NULL, &p1);
    print_message("a permit beside one on the closed engine: %s: %s\n", cerb_status_name(st),
                  cerb_last_error());
    if (st == CERB_OK) {
        /* Had it been granted, a second must not be: three of two. */
        assert_int_equal(cerb_semaphore_acquire(sc, 1, 0, NULL, &p2), CERB_BUSY);
    }
    assert_int_equal(st, CERB_BUSY);
    assert_int_equal(cerb_permit_free(ph), CERB_OK);
    st = cerb_semaphore_acquire(sc, 1, 3000, NULL, &p1);
    print_message("after the release: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(sc, 1, 3000, NULL, &p2), CERB_OK);
    assert_int_equal(cerb_permit_free(p1), CERB_OK);
    assert_int_equal(cerb_permit_free(p2), CERB_OK);

    cerb_semaphore_free(sc);
    cerb_semaphore_free(sh);
    cerb_client_close(c);
    cerb_client_close(holder);
    free(name);
    cerb_test_remove_file(old);
    cerb_test_remove_file(cur);
    store_free(&s);
}

/* The engine left loses its data (the name's key with it): its answer is
 * not "free" before the quarantine after the loss ends, since the holder
 * from before the loss may not know yet. */
static void test_question_during_quarantine(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *old = write_cfg(&s, "redis", 1, false);
    cerb_client *holder = open_file(old);
    char *name = test_name("quarantined");
    cerb_lock *h = cerb_test_handle(holder, name);
    assert_int_equal(cerb_lock_trylock(h), CERB_OK);
    char *cur = write_cfg(&s, "zk", 2, true);
    cerb_client *c = open_file(cur);
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);

    redisContext *rc = redisConnect("127.0.0.1", cerb_test_redis_port());
    assert_true(rc && !rc->err);
    redisReply *r = redisCommand(rc, "DEL %s:%s %s:\x1f" "cerberus", s.prefix, name, s.prefix);
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(rc);
    cerb_status st = cerb_lock_trylock(l);
    print_message("after the loss: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_int_equal(st, CERB_BUSY);

    cerb_lock_free(l);
    cerb_lock_free(h);
    cerb_client_close(c);
    cerb_client_close(holder);
    free(name);
    cerb_test_remove_file(old);
    cerb_test_remove_file(cur);
    store_free(&s);
}

/* failover.switch_claims: a client of another library on the engine left
 * (a redis-py style SET NX on the key) stays excluded while the name is
 * held on the new engine. */
static void test_switch_claims_exclude_other_libraries(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *cur = write_cfg_fo(&s, "zk", 2, true, "switch_claims = true;");
    cerb_client *c = open_file(cur);
    char *name = test_name("foreign");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    redisContext *rc = redisConnect("127.0.0.1", cerb_test_redis_port());
    assert_true(rc && !rc->err);
    redisReply *r = redisCommand(rc, "SET %s:%s other NX PX 10000", s.prefix, name);
    assert_non_null(r);
    print_message("redis-py style SET NX while held on zk: %s\n",
                  r->type == REDIS_REPLY_NIL ? "refused" : "granted");
    assert_int_equal(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    r = redisCommand(rc, "SET %s:%s other NX PX 10000", s.prefix, name);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS); /* the claim went with the hold */
    freeReplyObject(r);
    redisFree(rc);

    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
    cerb_test_remove_file(cur);
    store_free(&s);
}

/* `cerberus switch auto` (epoch 3) reopens every engine: a client on the
 * new file is granted on the first engine at the new epoch, and a process
 * still pinned to zk at epoch 2 is refused there too. */
static void test_switch_auto_reopens(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *pinned = write_cfg(&s, "zk", 2, false);
    cerb_client *lag = open_file(pinned);
    char *autof = write_cfg(&s, "auto", 3, true);
    cerb_client *c = open_file(autof);
    assert_int_equal(info(c, "redis").closed_epoch, 0);
    char *name = test_name("reopen");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_string_equal(cerb_engine_current(c), "redis");
    assert_int_equal(cerb_lock_fencing_token(l) >> 48, 3);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock *ll = cerb_test_handle(lag, name);
    cerb_status st = cerb_lock_trylock(ll);
    print_message("epoch 2 on zk after the switch to auto: %s: %s\n", cerb_status_name(st),
                  cerb_last_error());
    assert_int_equal(st, CERB_UNAVAILABLE);

    cerb_lock_free(ll);
    cerb_lock_free(l);
    cerb_client_close(c);
    cerb_client_close(lag);
    free(name);
    cerb_test_remove_file(pinned);
    cerb_test_remove_file(autof);
    store_free(&s);
}

struct closed_again {
    cerb_client *c;
};

static bool closed_again(void *ud)
{
    struct closed_again *a = ud;
    return info(a->c, "redis").closed_epoch == 2;
}

/* The record lost with the data is written back, and a laggard is refused
 * again once the quarantine after the loss ends. */
static void test_record_lost_with_data(void **state)
{
    (void)state;
    struct store s;
    store_init(&s);
    char *cur = write_cfg(&s, "zk", 2, true);
    cerb_client *c = open_file(cur);
    assert_int_equal(info(c, "redis").closed_epoch, 2);
    char *name = test_name("flushed");
    cerb_lock *l = cerb_test_handle(c, name);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);

    redis_lose_data(&s);
    /* The next probe rounds see the record gone and write it back. */
    struct closed_again a = {c};
    assert_wait_until(closed_again, &a, 5000);

    char *old = write_cfg(&s, "redis", 1, false);
    cerb_client *lag = open_file(old);
    cerb_lock *ll = cerb_test_handle(lag, name);
    cerb_status st = cerb_lock_trylock(ll);
    print_message("laggard after the loss: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_true(st == CERB_UNAVAILABLE || st == CERB_BUSY);
    assert_false(redis_has(&s, name));

    cerb_lock_free(ll);
    cerb_lock_free(l);
    cerb_client_close(lag);
    cerb_client_close(c);
    free(name);
    cerb_test_remove_file(old);
    cerb_test_remove_file(cur);
    store_free(&s);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_laggard_refused),
        cmocka_unit_test(test_laggard_follows),
        cmocka_unit_test(test_steady_state_asks_once),
        cmocka_unit_test(test_hold_before_switch_respected),
        cmocka_unit_test(test_record_lost_with_data),
        cmocka_unit_test(test_permit_before_switch_respected),
        cmocka_unit_test(test_question_during_quarantine),
        cmocka_unit_test(test_switch_claims_exclude_other_libraries),
        cmocka_unit_test(test_switch_auto_reopens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
