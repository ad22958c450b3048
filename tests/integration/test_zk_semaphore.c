/*
 * test_zk_semaphore.c — semaphores on the zk engine in Curator's
 * InterProcessSemaphoreV2 layout (engine_zk/zk_semaphore.c), checked on the
 * wire with a raw client: lease nodes under <root>/<name>/leases sharing one
 * protection uuid per acquisition, nothing left on locks/, the stored limit
 * as a 4-byte big-endian SharedCount at <root>/<name>/count (mismatch
 * refused while in use, replaced when idle), FIFO (a big request is not
 * passed by a small one), fences growing, nothing left behind after a
 * refusal or a timeout, a killed holder's permit freed by its session's
 * expiry, and inspect's output.
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
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"
#include "zk_util.h"

static cerb_client *open_client(const char *zk_extra)
{
    char *cfg = cerb_test_zk_config(NULL, zk_extra, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static cerb_semaphore *sem(cerb_client *c, const char *name, int64_t limit)
{
    cerb_semaphore *s = NULL;
    assert_int_equal(cerb_semaphore_new(c, name, limit, NULL, &s), CERB_OK);
    return s;
}

/* "<root>/<name>/<sub>", malloc'd. */
static char *sub_path(const char *name, const char *sub)
{
    char *base = cerb_test_zk_lock_path(name);
    size_t n = strlen(base) + strlen(sub) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", base, sub);
    free(base);
    return p;
}

/* Children of <root>/<name>/<sub> (0 when it does not exist). */
static int n_sub(zhandle_t *zh, const char *name, const char *sub, struct String_vector *out)
{
    char *p = sub_path(name, sub);
    int rc;
    struct String_vector v = {0, NULL};
    int n = cerb_test_zk_children(zh, p, &v, &rc);
    free(p);
    if (n < 0) {
        assert_int_equal(rc, ZNONODE);
        n = 0;
    }
    if (out)
        *out = v;
    else
        deallocate_String_vector(&v);
    return n;
}

/* The stored limit (4-byte big-endian), -1 when absent, -2 when malformed. */
static int64_t stored_limit(zhandle_t *zh, const char *name)
{
    char *p = sub_path(name, "count");
    char buf[16];
    int len = sizeof buf;
    struct Stat st;
    int rc = zoo_get(zh, p, 0, buf, &len, &st);
    free(p);
    if (rc == ZNONODE)
        return -1;
    assert_int_equal(rc, ZOK);
    if (len != 4)
        return -2;
    const unsigned char *u = (const unsigned char *)buf;
    return (int64_t)((uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3]);
}

static void set_limit(zhandle_t *zh, const char *name, int32_t v)
{
    char *p = sub_path(name, "count");
    char b[4] = {(char)(v >> 24), (char)(v >> 16), (char)(v >> 8), (char)v};
    assert_int_equal(zoo_set(zh, p, b, 4, -1), ZOK);
    free(p);
}

/* ---- the layout on the wire, the limit node, fences ---- */

static void test_layout_limit_and_fences(void **state)
{
    (void)state;
    char *name = test_name("sem-layout");
    cerb_client *c = open_client(NULL);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_semaphore *s = sem(c, name, 3);

    cerb_permit *p1 = NULL, *p2 = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 2, 0, NULL, &p1), CERB_OK);
    assert_int_equal(cerb_permit_count(p1), 2);
    struct String_vector v;
    assert_int_equal(n_sub(zh, name, "leases", &v), 2);
    /* _c_<uuid>-lease-<10 digits>, one uuid for the acquisition, ours (v8). */
    for (int i = 0; i < 2; i++) {
        const char *nm = v.data[i];
        assert_int_equal(strncmp(nm, "_c_", 3), 0);
        assert_int_equal(nm[3 + 14], '8');
        assert_int_equal(strncmp(nm + 3 + 36, "-lease-", 7), 0);
        assert_int_equal(strlen(nm), 3 + 36 + 7 + 10);
        assert_int_equal(strncmp(nm, v.data[0], 3 + 36), 0);
    }
    deallocate_String_vector(&v);
    assert_int_equal(n_sub(zh, name, "locks", NULL), 0); /* released after the grant */
    assert_int_equal(stored_limit(zh, name), 3);

    uint64_t f1 = cerb_permit_fencing_token(p1);
    assert_true(f1 > 0);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p2), CERB_OK);
    uint64_t f2 = cerb_permit_fencing_token(p2);
    assert_true(f2 > f1);
    assert_int_equal(n_sub(zh, name, "leases", NULL), 3);
    /* Full: one more is refused at once, and leaves nothing behind. */
    cerb_permit *p3 = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p3), CERB_BUSY);
    assert_null(p3);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 200, NULL, &p3), CERB_TIMEOUT);
    assert_int_equal(n_sub(zh, name, "leases", NULL), 3);
    assert_int_equal(n_sub(zh, name, "locks", NULL), 0);

    assert_int_equal(cerb_permit_release(p1), CERB_OK);
    assert_int_equal(n_sub(zh, name, "leases", NULL), 1);
    assert_int_equal(cerb_semaphore_acquire(s, 2, 0, NULL, &p3), CERB_OK);
    assert_true(cerb_permit_fencing_token(p3) > f2);
    cerb_permit_free(p3);
    cerb_permit_free(p2);
    cerb_permit_free(p1);
    assert_int_equal(n_sub(zh, name, "leases", NULL), 0);
    assert_int_equal(stored_limit(zh, name), 3); /* kept, for a SharedCount reader */
    cerb_semaphore_free(s);
    cerb_test_zk_close(zh);
    cerb_client_close(c);
    free(name);
}

/* ---- the stored limit: refused while in use, replaced when idle ---- */

static void test_limit_mismatch(void **state)
{
    (void)state;
    char *name = test_name("sem-limit");
    cerb_client *c = open_client(NULL);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_semaphore *s3 = sem(c, name, 3), *s4 = sem(c, name, 4);
    cerb_permit *p = NULL, *q = NULL;
    assert_int_equal(cerb_semaphore_acquire(s3, 1, 0, NULL, &p), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(s4, 1, 1000, NULL, &q), CERB_ECONFIG);
    assert_non_null(strstr(cerb_last_error(), "3"));
    assert_non_null(strstr(cerb_last_error(), "4"));
    assert_null(q);
    assert_int_equal(n_sub(zh, name, "leases", NULL), 1);
    assert_int_equal(n_sub(zh, name, "locks", NULL), 0);
    cerb_permit_free(p);
    /* Idle: the next caller's limit is stored. */
    assert_int_equal(cerb_semaphore_acquire(s4, 1, 0, NULL, &q), CERB_OK);
    assert_int_equal(stored_limit(zh, name), 4);
    assert_int_equal(cerb_semaphore_acquire(s3, 1, 0, NULL, &p), CERB_ECONFIG);
    cerb_permit_free(q);
    /* A Curator SharedCount user changes it: we follow the node. */
    set_limit(zh, name, 7);
    cerb_semaphore *s7 = sem(c, name, 7);
    assert_int_equal(cerb_semaphore_acquire(s7, 1, 0, NULL, &q), CERB_OK);
    assert_int_equal(cerb_semaphore_acquire(s4, 1, 0, NULL, &p), CERB_ECONFIG);
    cerb_permit_free(q);
    cerb_semaphore_free(s7);
    cerb_semaphore_free(s4);
    cerb_semaphore_free(s3);
    cerb_test_zk_close(zh);
    cerb_client_close(c);
    free(name);
}

/* ---- FIFO: a big request is not passed by a small one ---- */

struct taker {
    cerb_semaphore *s;
    unsigned k;
    int64_t wait_ms;
    cerb_permit *p;
    cerb_status st;
    atomic_bool done;
};

static void *taker_main(void *arg)
{
    struct taker *t = arg;
    t->st = cerb_semaphore_acquire(t->s, t->k, t->wait_ms, NULL, &t->p);
    atomic_store(&t->done, true);
    return NULL;
}

static bool taker_done(void *ud) { return atomic_load(&((struct taker *)ud)->done); }

struct queued {
    zhandle_t *zh;
    const char *name;
    int n;
};

static bool locks_queued(void *ud)
{
    struct queued *q = ud;
    return n_sub(q->zh, q->name, "locks", NULL) == q->n;
}

static void test_fifo_big_request_not_passed(void **state)
{
    (void)state;
    char *name = test_name("sem-fifo");
    cerb_client *c = open_client(NULL), *c2 = open_client(NULL);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_semaphore *s = sem(c, name, 2), *s2 = sem(c2, name, 2);
    cerb_permit *a = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &a), CERB_OK);

    /* B asks for both permits and waits (holding locks/, with its two
     * leases made: three leases for a limit of two). */
    struct taker b = {.s = s2, .k = 2, .wait_ms = 20000};
    pthread_t tb;
    assert_int_equal(pthread_create(&tb, NULL, taker_main, &b), 0);
    struct queued q = {zh, name, 1};
    assert_wait_until(locks_queued, &q, 10000);
    assert_false(atomic_load(&b.done));

    /* C asks for one — one is free, but B is ahead: C waits. */
    cerb_permit *cp = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &cp), CERB_BUSY);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 300, NULL, &cp), CERB_TIMEOUT);
    assert_false(atomic_load(&b.done));

    /* inspect: A holds 1 of 2; B's two leases wait. */
    cerb_holder_info *v = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(c, CERB_KIND_SEMAPHORE, name, NULL, &v, &n), CERB_OK);
    assert_int_equal(n, 2);
    assert_int_equal(v[0].waiting, 0);
    assert_non_null(strstr(v[0].detail, "permits 1 of 2"));
    assert_int_equal(v[0].fence, cerb_permit_fencing_token(a) & ((UINT64_C(1) << 48) - 1));
    assert_int_equal(v[1].waiting, 1);
    assert_non_null(strstr(v[1].detail, "permits 2 of 2"));
    cerb_holders_free(v, n);

    /* A leaves: B gets both. */
    assert_int_equal(cerb_permit_release(a), CERB_OK);
    assert_wait_until(taker_done, &b, 10000);
    pthread_join(tb, NULL);
    assert_int_equal(b.st, CERB_OK);
    assert_int_equal(cerb_permit_count(b.p), 2);
    assert_true(cerb_permit_fencing_token(b.p) > cerb_permit_fencing_token(a));
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &cp), CERB_BUSY);
    cerb_permit_free(b.p);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &cp), CERB_OK);
    cerb_permit_free(cp);
    cerb_permit_free(a);
    assert_int_equal(n_sub(zh, name, "leases", NULL), 0);
    assert_int_equal(n_sub(zh, name, "locks", NULL), 0);
    cerb_semaphore_free(s2);
    cerb_semaphore_free(s);
    cerb_test_zk_close(zh);
    cerb_client_close(c2);
    cerb_client_close(c);
    free(name);
}

/* ---- a killed holder's permit comes back with its session's expiry ---- */

static int holder_role(int argc, char **argv)
{
    if (argc != 2)
        return 99;
    int ready_fd = atoi(argv[1]);
    char *cfg = cerb_test_zk_config(NULL, "session_timeout_ms = 1500;", NULL);
    cerb_client *c = NULL;
    if (!cfg || cerb_client_open_string(&c, cfg) != CERB_OK)
        return 100;
    free(cfg);
    cerb_semaphore *s = NULL;
    cerb_permit *p = NULL;
    if (cerb_semaphore_new(c, argv[0], 1, NULL, &s) != CERB_OK ||
        cerb_semaphore_acquire(s, 1, 10000, NULL, &p) != CERB_OK)
        return 101;
    char b = 'r';
    if (write(ready_fd, &b, 1) != 1)
        return 102;
    for (;;)
        pause(); /* killed by the parent */
}

static void test_killed_holder_frees_permit(void **state)
{
    (void)state;
    char *name = test_name("sem-expire");
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    char ready_s[16];
    snprintf(ready_s, sizeof ready_s, "%d", ready[1]);
    char *args[] = {name, ready_s, NULL};
    int keep[] = {ready[1], -1};
    pid_t pid = cerb_test_spawn_self("holder", args, keep);
    assert_true(pid > 0);
    close(ready[1]);
    char b;
    assert_int_equal(cerb_test_read_within(ready[0], &b, 1, 20000), 1);

    cerb_client *c = open_client(NULL);
    cerb_semaphore *s = sem(c, name, 1);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_BUSY);
    kill(pid, SIGKILL);
    assert_int_equal(cerb_test_wait(pid, 10000), 128 + SIGKILL);
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_semaphore_acquire(s, 1, 30000, NULL, &p), CERB_OK);
    int64_t waited = cerb_test_now_ms() - t0;
    assert_true(waited < 25000);
    cerb_permit_free(p);
    close(ready[0]);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(name);
}

static const struct cerb_test_role roles[] = {{"holder", holder_role}, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_limit_and_fences),
        cmocka_unit_test(test_limit_mismatch),
        cmocka_unit_test(test_fifo_big_request_not_passed),
        cmocka_unit_test(test_killed_holder_frees_permit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
