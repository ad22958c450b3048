/*
 * test_etcd_semaphore.c — semaphores on the etcd engine (etcd_queue.c,
 * etcd_semaphore.c), against the suite's etcd:
 *  - the layout on the wire: <name>/<lease hex> (value "<offset>") for the
 *    session's first member, <name>/<lease hex>.<token> for a further one,
 *    "<offset>,<k>" for k permits, the limit in <name>.limit; fences are
 *    create revision + offset and grow;
 *  - the stored limit: another limit is refused (CERB_ECONFIG naming both,
 *    nothing left queued), an empty queue takes the next caller's;
 *  - first come, first served: a request for two permits is not passed by
 *    a later one for one; inspect lists holders then waiters;
 *  - a holder whose lease is revoked frees its permit (and is told LOST);
 *    a waiter whose process died (a key whose lease nobody keeps alive)
 *    blocks the line only until its lease ends;
 *  - interop with `etcdctl lock` for a semaphore of 1, both ways.
 * Every test ends with no key of the name left.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "etcd_queue_util.h"
#include "etcd_util.h"
#include "test_util.h"

#define FENCE_LOW(f) ((f) & ((UINT64_C(1) << 48) - 1))

static cerb_client *open_client(void)
{
    char *cfg = etcd_test_config(NULL, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    free(cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_semaphore *sem(cerb_client *c, const char *name, int64_t n)
{
    cerb_semaphore *s = NULL;
    if (cerb_semaphore_new(c, name, n, NULL, &s) != CERB_OK)
        fail_msg("semaphore_new: %s", cerb_last_error());
    return s;
}

static void expect_keys(const char *name, int n)
{
    char p[300];
    snprintf(p, sizeof p, "%s/", name);
    struct qu_count c = {p, n};
    assert_wait_until(qu_count_is, &c, 5000);
}

static void expect_members(cerb_client *c, const char *name, size_t holders, size_t waiters)
{
    struct qu_members m = {c, CERB_KIND_SEMAPHORE, name, holders, waiters};
    assert_wait_until(qu_members_are, &m, 5000);
}

static void drop_limit(const char *name)
{
    char k[600];
    snprintf(k, sizeof k, "%s.limit", name);
    etcd_test_delete(etcd_test_port(), k);
}

struct taker {
    cerb_semaphore *s;
    unsigned k;
    int64_t wait_ms;
    cerb_permit *p;
    cerb_status st;
    int64_t at;
    atomic_int done;
};

static void *take_main(void *arg)
{
    struct taker *t = arg;
    t->st = cerb_semaphore_acquire(t->s, t->k, t->wait_ms, NULL, &t->p);
    t->at = cerb_test_now_ms();
    atomic_store(&t->done, 1);
    return NULL;
}

static bool taker_done(void *ud) { return atomic_load(&((struct taker *)ud)->done) != 0; }

/* ---- layout ---- */

static void test_layout_on_the_wire(void **state)
{
    (void)state;
    char *name = test_name("sem-wire");
    char p[300], lk[300], v[64];
    snprintf(p, sizeof p, "%s/", name);
    snprintf(lk, sizeof lk, "%s.limit", name);
    cerb_client *a = open_client(), *b = open_client();
    cerb_semaphore *sa = sem(a, name, 4), *sb = sem(b, name, 4);
    cerb_permit *p1 = NULL, *p2 = NULL, *p3 = NULL;
    assert_int_equal(cerb_semaphore_acquire(sa, 1, 0, NULL, &p1), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(sa, 1, 0, NULL, &p2), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(sb, 2, 0, NULL, &p3), CERB_OK);

    struct qu_kv kv[8];
    assert_int_equal(qu_keys(p, kv, 8), 3);
    /* The first member of a session: exactly etcdctl lock's key. */
    char want[600];
    snprintf(want, sizeof want, "%s%llx", p, (unsigned long long)kv[0].lease);
    assert_string_equal(kv[0].key, want);
    /* A second member of the same session: its token after a dot. */
    assert_int_equal(kv[1].lease, kv[0].lease);
    assert_memory_equal(kv[1].key, want, strlen(want));
    assert_int_equal(kv[1].key[strlen(want)], '.');
    assert_int_equal(strlen(kv[1].key + strlen(want) + 1), 32);
    /* Another session, two permits. */
    snprintf(want, sizeof want, "%s%llx", p, (unsigned long long)kv[2].lease);
    assert_string_equal(kv[2].key, want);
    assert_true(kv[2].lease != kv[0].lease);
    /* Values: the fence offset, then ",k" for k > 1; fence = revision + offset. */
    int64_t off = etcd_test_fence_offset(etcd_test_port(), "");
    assert_true(off >= 0);
    char o1[32], o2[32];
    snprintf(o1, sizeof o1, "%lld", (long long)off);
    snprintf(o2, sizeof o2, "%lld,2", (long long)off);
    assert_string_equal(kv[0].value, o1);
    assert_string_equal(kv[1].value, o1);
    assert_string_equal(kv[2].value, o2);
    uint64_t f1 = cerb_permit_fencing_token(p1), f2 = cerb_permit_fencing_token(p2),
             f3 = cerb_permit_fencing_token(p3);
    assert_int_equal(FENCE_LOW(f1), (uint64_t)(kv[0].create_revision + off));
    assert_int_equal(FENCE_LOW(f2), (uint64_t)(kv[1].create_revision + off));
    assert_int_equal(FENCE_LOW(f3), (uint64_t)(kv[2].create_revision + off));
    assert_true(f1 < f2 && f2 < f3);
    /* The limit, outside the members' prefix, without a lease. */
    assert_int_equal(qu_get(lk, v, sizeof v), 1);
    assert_string_equal(v, "4");

    /* Inspect: holders in create order, their permits of the limit. */
    cerb_holder_info *hv = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(b, CERB_KIND_SEMAPHORE, name, NULL, &hv, &n), CERB_OK);
    assert_int_equal(n, 3);
    assert_string_equal(hv[0].detail, "permits 1 of 4");
    assert_string_equal(hv[2].detail, "permits 2 of 4");
    assert_string_equal(hv[0].owner, kv[0].key + strlen(p));
    assert_int_equal(hv[2].fence, (uint64_t)(kv[2].create_revision + off));
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(hv[i].waiting, 0);
        assert_true(hv[i].ttl_ms > 0);
    }
    cerb_holders_free(hv, n);

    /* Released permits leave: the next one ranks above all. */
    assert_int_equal(cerb_permit_release(p1), CERB_OK);
    assert_int_equal(cerb_permit_release(p1), CERB_NOT_OWNER);
    expect_keys(name, 2);
    cerb_permit *p4 = NULL;
    assert_int_equal(cerb_semaphore_acquire(sb, 1, 0, NULL, &p4), CERB_OK);
    assert_true(cerb_permit_fencing_token(p4) > f3);
    cerb_permit_free(p1);
    cerb_permit_free(p2);
    cerb_permit_free(p3);
    cerb_permit_free(p4);
    expect_keys(name, 0);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    cerb_client_close(a);
    cerb_client_close(b);
    drop_limit(name);
    free(name);
}

/* ---- the stored limit ---- */

static void test_limit_key_and_mismatch(void **state)
{
    (void)state;
    char *name = test_name("sem-limit");
    char lk[600], v[64];
    snprintf(lk, sizeof lk, "%s.limit", name);
    cerb_client *a = open_client(), *b = open_client();
    cerb_semaphore *two = sem(a, name, 2), *five = sem(b, name, 5);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(two, 1, 0, NULL, &p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(five, 1, 1000, NULL, &q), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "limit of 2"));
    assert_non_null(strstr(cerb_last_error(), "asks 5"));
    assert_null(q);
    expect_keys(name, 1); /* nothing of the refused caller stays queued */
    assert_int_equal(qu_get(lk, v, sizeof v), 1);
    assert_string_equal(v, "2");
    /* Drained, the name takes the next caller's limit (L stays meanwhile). */
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    expect_keys(name, 0);
    assert_int_equal(qu_get(lk, v, sizeof v), 1);
    assert_string_equal(v, "2");
    assert_int_equal(cerb_semaphore_acquire(five, 5, 0, NULL, &q), CERB_OK);
    assert_int_equal(qu_get(lk, v, sizeof v), 1);
    assert_string_equal(v, "5");
    /* Now the 2 is refused, also by trylock. */
    assert_int_equal(cerb_semaphore_acquire(two, 1, 0, NULL, &p), CERB_ECONFIG);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    /* Something that is no limit, with nobody queued, is replaced too. */
    assert_int_equal(etcd_test_put_value(etcd_test_port(), lk, "garbage", 0), 0);
    assert_int_equal(cerb_semaphore_acquire(two, 2, 0, NULL, &p), CERB_OK);
    assert_int_equal(qu_get(lk, v, sizeof v), 1);
    assert_string_equal(v, "2");
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(two);
    cerb_semaphore_free(five);
    cerb_client_close(a);
    cerb_client_close(b);
    drop_limit(name);
    free(name);
}

/* ---- FIFO ---- */

static void test_fifo_big_request_not_passed(void **state)
{
    (void)state;
    char *name = test_name("sem-fifo");
    cerb_client *a = open_client(), *b = open_client(), *c = open_client(), *obs = open_client();
    cerb_semaphore *sa = sem(a, name, 2), *sb = sem(b, name, 2), *sc = sem(c, name, 2);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(sa, 1, 0, NULL, &p), CERB_OK);
    struct taker big = {.s = sb, .k = 2, .wait_ms = 10000};
    struct taker small = {.s = sc, .k = 1, .wait_ms = 10000};
    pthread_t tb, ts;
    pthread_create(&tb, NULL, take_main, &big);
    expect_members(obs, name, 1, 1);
    pthread_create(&ts, NULL, take_main, &small);
    expect_members(obs, name, 1, 2);
    /* One permit is free, but the small request is behind the big one. */
    assert_int_equal(atomic_load(&small.done), 0);
    cerb_holder_info *hv = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(obs, CERB_KIND_SEMAPHORE, name, NULL, &hv, &n), CERB_OK);
    assert_int_equal(n, 3);
    assert_int_equal(hv[0].waiting, 0);
    assert_int_equal(hv[1].waiting, 1);
    assert_string_equal(hv[1].detail, "permits 2 of 2");
    assert_int_equal(hv[2].waiting, 1);
    assert_int_equal(hv[1].fence, 0);
    cerb_holders_free(hv, n);
    uint64_t f0 = cerb_permit_fencing_token(p);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_wait_until(taker_done, &big, 5000);
    pthread_join(tb, NULL);
    assert_int_equal(big.st, CERB_OK);
    assert_true(cerb_permit_fencing_token(big.p) > f0);
    expect_members(obs, name, 1, 1);
    assert_int_equal(atomic_load(&small.done), 0);
    assert_int_equal(cerb_permit_free(big.p), CERB_OK);
    assert_wait_until(taker_done, &small, 5000);
    pthread_join(ts, NULL);
    assert_int_equal(small.st, CERB_OK);
    assert_int_equal(cerb_permit_free(small.p), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    cerb_semaphore_free(sc);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_client_close(c);
    cerb_client_close(obs);
    drop_limit(name);
    free(name);
}

/* ---- holders and waiters that go away ---- */

static void on_lost(cerb_permit *p, void *ud)
{
    (void)p;
    atomic_fetch_add((atomic_int *)ud, 1);
}

static bool flag_set(void *ud) { return atomic_load((atomic_int *)ud) > 0; }

static void test_revoked_holder_frees_its_permit(void **state)
{
    (void)state;
    char *name = test_name("sem-revoke");
    char p[300];
    snprintf(p, sizeof p, "%s/", name);
    cerb_client *a = open_client(), *b = open_client();
    cerb_semaphore *sa = sem(a, name, 2), *sb = sem(b, name, 2);
    cerb_permit *pa = NULL, *pb = NULL;
    assert_int_equal(cerb_semaphore_acquire(sa, 2, 0, NULL, &pa), CERB_OK);
    atomic_int lost = 0;
    assert_int_equal(cerb_permit_on_lost(pa, on_lost, &lost), CERB_OK);
    struct taker w = {.s = sb, .k = 1, .wait_ms = 10000};
    pthread_t t;
    pthread_create(&t, NULL, take_main, &w);
    expect_keys(name, 2);
    struct qu_kv kv[2];
    assert_int_equal(qu_keys(p, kv, 2), 2);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_revoke(etcd_test_port(), kv[0].lease), 0);
    assert_wait_until(taker_done, &w, 5000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.at - t0 < 2000); /* the delete woke it, not a timer */
    assert_wait_until(flag_set, &lost, 15000);
    assert_int_equal(cerb_permit_state(pa), CERB_LOCK_LOST);
    cerb_permit_free(pa);
    assert_int_equal(cerb_permit_free(w.p), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    cerb_client_close(a);
    cerb_client_close(b);
    (void)pb;
    drop_limit(name);
    free(name);
}

/* A waiter whose process died: its key (here put by hand, as a dead
 * client left it) stays until its lease ends, and no longer. */
static void test_dead_waiter_does_not_block(void **state)
{
    (void)state;
    char *name = test_name("sem-deadwaiter");
    char p[300], k[400];
    snprintf(p, sizeof p, "%s/", name);
    cerb_client *a = open_client(), *b = open_client();
    cerb_semaphore *sa = sem(a, name, 1), *sb = sem(b, name, 1);
    cerb_permit *pa = NULL;
    assert_int_equal(cerb_semaphore_acquire(sa, 1, 0, NULL, &pa), CERB_OK);
    int64_t dead = etcd_test_grant(etcd_test_port(), 2);
    assert_true(dead > 0);
    snprintf(k, sizeof k, "%s%llx", p, (unsigned long long)dead);
    assert_int_equal(etcd_test_put(etcd_test_port(), k, dead), 0);
    struct taker w = {.s = sb, .k = 1, .wait_ms = 15000};
    pthread_t t;
    pthread_create(&t, NULL, take_main, &w);
    expect_keys(name, 3);
    assert_int_equal(cerb_permit_free(pa), CERB_OK);
    int64_t t0 = cerb_test_now_ms();
    assert_wait_until(taker_done, &w, 10000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    /* It waited for the dead member's lease (2 s from its grant), no more. */
    assert_true(w.at - t0 < 5000);
    struct qu_kv kv[2];
    assert_int_equal(qu_keys(p, kv, 2), 1);
    assert_int_equal(cerb_permit_free(w.p), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    cerb_client_close(a);
    cerb_client_close(b);
    drop_limit(name);
    free(name);
}

/* Timed-out, cancelled and busy attempts leave nothing queued. */
static void test_failed_attempts_leave_nothing(void **state)
{
    (void)state;
    char *name = test_name("sem-nothing");
    cerb_client *a = open_client(), *b = open_client();
    cerb_semaphore *sa = sem(a, name, 3), *sb = sem(b, name, 3);
    cerb_permit *pa = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(sa, 2, 0, NULL, &pa), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(sb, 2, 0, NULL, &q), CERB_BUSY);
    expect_keys(name, 1);
    assert_int_equal(cerb_semaphore_acquire(sb, 2, 300, NULL, &q), CERB_TIMEOUT);
    expect_keys(name, 1);
    cerb_cancel *k = NULL;
    assert_int_equal(cerb_cancel_new(&k), CERB_OK);
    cerb_cancel_fire(k);
    assert_int_equal(cerb_semaphore_acquire(sb, 2, -1, k, &q), CERB_INTERRUPTED);
    cerb_cancel_free(k);
    expect_keys(name, 1);
    assert_int_equal(cerb_semaphore_acquire(sb, 1, 0, NULL, &q), CERB_OK);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    assert_int_equal(cerb_permit_free(pa), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(sa);
    cerb_semaphore_free(sb);
    cerb_client_close(a);
    cerb_client_close(b);
    drop_limit(name);
    free(name);
}

/* ---- interop with etcdctl lock (a semaphore of 1) ---- */

static void test_etcdctl_holds_semaphore_waits(void **state)
{
    (void)state;
    char *name = test_name("sem-ctl-holds");
    const char *args[] = {"lock", name, "--ttl=10", NULL};
    pid_t pid = etcd_test_etcdctl(etcd_test_port(), args);
    assert_true(pid > 0);
    expect_keys(name, 1);
    cerb_client *c = open_client();
    cerb_semaphore *s = sem(c, name, 1);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_BUSY);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 200, NULL, &p), CERB_TIMEOUT);
    expect_keys(name, 1);
    struct taker w = {.s = s, .k = 1, .wait_ms = 20000};
    pthread_t t;
    pthread_create(&t, NULL, take_main, &w);
    expect_keys(name, 2);
    cerb_holder_info *hv = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(c, CERB_KIND_SEMAPHORE, name, NULL, &hv, &n), CERB_OK);
    assert_int_equal(n, 2);
    assert_int_equal(hv[0].waiting, 0); /* etcdctl's key: one permit */
    assert_string_equal(hv[0].detail, "permits 1 of 1");
    assert_int_equal(hv[1].waiting, 1);
    cerb_holders_free(hv, n);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_wait_until(taker_done, &w, 15000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.at - t0 < 1000);
    cerb_test_wait(pid, 10000);
    assert_int_equal(cerb_permit_free(w.p), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    drop_limit(name);
    free(name);
}

static bool file_exists(void *ud)
{
    struct stat sb;
    return stat(ud, &sb) == 0;
}

static void test_semaphore_holds_etcdctl_waits(void **state)
{
    (void)state;
    char *name = test_name("sem-cerb-holds");
    char dir[] = "/tmp/cerb-etcdctl-sem-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char mark[600], cmd[700];
    snprintf(mark, sizeof mark, "%s/ran", dir);
    snprintf(cmd, sizeof cmd, "touch %s", mark);
    cerb_client *c = open_client();
    cerb_semaphore *s = sem(c, name, 1);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    const char *args[] = {"lock", name, "--", "sh", "-c", cmd, NULL};
    pid_t pid = etcd_test_etcdctl(etcd_test_port(), args);
    assert_true(pid > 0);
    expect_keys(name, 2);
    assert_false(file_exists(mark));
    /* And a second Cerberus permit waits too, behind etcdctl. */
    cerb_permit *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &q), CERB_BUSY);
    assert_int_equal(cerb_permit_free(p), CERB_OK);
    assert_wait_until(file_exists, mark, 5000);
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    expect_keys(name, 0);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &q), CERB_OK);
    assert_int_equal(cerb_permit_free(q), CERB_OK);
    expect_keys(name, 0);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    unlink(mark);
    rmdir(dir);
    drop_limit(name);
    free(name);
}

int main(void)
{
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_on_the_wire),
        cmocka_unit_test(test_limit_key_and_mismatch),
        cmocka_unit_test(test_fifo_big_request_not_passed),
        cmocka_unit_test(test_revoked_holder_frees_its_permit),
        cmocka_unit_test(test_dead_waiter_does_not_block),
        cmocka_unit_test(test_failed_attempts_leave_nothing),
        cmocka_unit_test(test_etcdctl_holds_semaphore_waits),
        cmocka_unit_test(test_semaphore_holds_etcdctl_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
