/*
 * test_zk_rwlock.c — read-write locks on the zk engine in Curator's
 * InterProcessReadWriteLock layout (engine_zk/zk_rwlock.c): node names on
 * the wire (_c_<uuid>-__READ__<seq>, _c_<uuid>-__WRIT__<seq>), readers
 * sharing, a writer excluded and excluding, a reader behind a waiting
 * writer waiting (FIFO, no writer starvation), fences growing, nothing left
 * behind after a refusal, a killed reader freed by its session's expiry,
 * and inspect's output. Holds are per thread and handle: the suite uses one
 * client (and handle) per reader in the main thread, and a thread for a
 * waiter.
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

static cerb_client *open_client(void)
{
    char *cfg = cerb_test_zk_config(NULL, NULL, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static cerb_rwlock *rwl(cerb_client *c, const char *name)
{
    cerb_rwlock *rw = NULL;
    assert_int_equal(cerb_rwlock_new(c, name, NULL, &rw), CERB_OK);
    return rw;
}

static int kids(zhandle_t *zh, const char *name, struct String_vector *out)
{
    char *p = cerb_test_zk_lock_path(name);
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

/* _c_<uuid v8>-<mark><10 digits> */
static void assert_node(const char *nm, const char *mark)
{
    assert_int_equal(strncmp(nm, "_c_", 3), 0);
    assert_int_equal(nm[3 + 14], '8');
    assert_int_equal(nm[3 + 36], '-');
    assert_int_equal(strncmp(nm + 3 + 37, mark, 8), 0);
    assert_int_equal(strlen(nm), 3 + 37 + 8 + 10);
}

/* A thread waiting for a lock mode. */
struct waiter {
    cerb_rwlock *rw;
    bool write;
    int64_t wait_ms;
    cerb_status st;
    uint64_t fence;
    atomic_bool done, release;
};

static bool w_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }
static bool w_release(void *ud) { return atomic_load(&((struct waiter *)ud)->release); }

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = w->write ? cerb_rwlock_write_trylock_for(w->rw, w->wait_ms)
                     : cerb_rwlock_read_trylock_for(w->rw, w->wait_ms);
    if (w->st == CERB_OK)
        w->fence = cerb_rwlock_fencing_token(w->rw);
    atomic_store(&w->done, true);
    if (w->st == CERB_OK) {
        wait_until(w_release, w, 30000);
        w->st = w->write ? cerb_rwlock_write_unlock(w->rw) : cerb_rwlock_read_unlock(w->rw);
    }
    return NULL;
}

struct nkids {
    zhandle_t *zh;
    const char *name;
    int n;
};

static bool kids_are(void *ud)
{
    struct nkids *k = ud;
    return kids(k->zh, k->name, NULL) == k->n;
}

static void test_layout_share_exclude_fifo(void **state)
{
    (void)state;
    char *name = test_name("rw-fifo");
    cerb_client *c1 = open_client(), *c2 = open_client(), *c3 = open_client();
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_rwlock *r1 = rwl(c1, name), *r2 = rwl(c2, name), *r3 = rwl(c3, name);

    /* Two readers share; the node names are Curator's. */
    assert_int_equal(cerb_rwlock_read_trylock_for(r1, 0), CERB_OK);
    uint64_t f1 = cerb_rwlock_fencing_token(r1);
    assert_int_equal(cerb_rwlock_read_trylock_for(r2, 0), CERB_OK);
    uint64_t f2 = cerb_rwlock_fencing_token(r2);
    assert_true(f1 > 0 && f2 > f1);
    struct String_vector v;
    assert_int_equal(kids(zh, name, &v), 2);
    assert_node(v.data[0], "__READ__");
    assert_node(v.data[1], "__READ__");
    deallocate_String_vector(&v);

    /* A writer is refused, and leaves nothing behind. */
    assert_int_equal(cerb_rwlock_write_trylock_for(r3, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_trylock_for(r3, 200), CERB_TIMEOUT);
    assert_int_equal(kids(zh, name, NULL), 2);

    /* A writer queues (thread); a new reader behind it waits. */
    struct waiter w = {.rw = r3, .write = true, .wait_ms = 20000};
    pthread_t tw;
    assert_int_equal(pthread_create(&tw, NULL, waiter_main, &w), 0);
    struct nkids k3 = {zh, name, 3};
    assert_wait_until(kids_are, &k3, 10000);
    assert_int_equal(kids(zh, name, &v), 3);
    int writers = 0;
    for (int i = 0; i < v.count; i++)
        if (strstr(v.data[i], "__WRIT__")) {
            assert_node(v.data[i], "__WRIT__");
            writers++;
        }
    assert_int_equal(writers, 1);
    deallocate_String_vector(&v);
    cerb_client *c4 = open_client();
    cerb_rwlock *r4 = rwl(c4, name);
    assert_int_equal(cerb_rwlock_read_trylock_for(r4, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_read_trylock_for(r4, 300), CERB_TIMEOUT);
    assert_false(atomic_load(&w.done));

    /* inspect: two readers hold, the writer waits. */
    cerb_holder_info *hv = NULL;
    size_t n = 0;
    assert_int_equal(cerb_inspect(c4, CERB_KIND_RWLOCK, name, NULL, &hv, &n), CERB_OK);
    assert_int_equal(n, 3);
    assert_int_equal(hv[0].waiting, 0);
    assert_int_equal(strncmp(hv[0].detail, "read", 4), 0);
    assert_int_equal(hv[0].fence, f1 & ((UINT64_C(1) << 48) - 1));
    assert_int_equal(hv[1].waiting, 0);
    assert_int_equal(strncmp(hv[1].detail, "read", 4), 0);
    assert_int_equal(hv[2].waiting, 1);
    assert_int_equal(strncmp(hv[2].detail, "write", 5), 0);
    cerb_holders_free(hv, n);

    /* The readers leave: the writer gets it, alone. */
    assert_int_equal(cerb_rwlock_read_unlock(r1), CERB_OK);
    assert_false(atomic_load(&w.done));
    assert_int_equal(cerb_rwlock_read_unlock(r2), CERB_OK);
    assert_wait_until(w_done, &w, 10000);
    assert_int_equal(w.st, CERB_OK);
    assert_true(w.fence > f2);
    assert_int_equal(cerb_rwlock_read_trylock_for(r4, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_trylock_for(r1, 0), CERB_BUSY);

    /* A reader waits behind the holding writer and gets in after it. */
    struct waiter rd = {.rw = r4, .write = false, .wait_ms = 20000};
    pthread_t tr;
    assert_int_equal(pthread_create(&tr, NULL, waiter_main, &rd), 0);
    struct nkids k2 = {zh, name, 2};
    assert_wait_until(kids_are, &k2, 10000);
    atomic_store(&w.release, true);
    pthread_join(tw, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_wait_until(w_done, &rd, 10000);
    assert_int_equal(rd.st, CERB_OK);
    assert_true(rd.fence > w.fence);
    atomic_store(&rd.release, true);
    pthread_join(tr, NULL);
    assert_int_equal(rd.st, CERB_OK);
    assert_int_equal(kids(zh, name, NULL), 0);

    cerb_rwlock_free(r4);
    cerb_rwlock_free(r3);
    cerb_rwlock_free(r2);
    cerb_rwlock_free(r1);
    cerb_test_zk_close(zh);
    cerb_client_close(c4);
    cerb_client_close(c3);
    cerb_client_close(c2);
    cerb_client_close(c1);
    free(name);
}

/* ---- a killed reader's hold goes with its session ---- */

static int reader_role(int argc, char **argv)
{
    if (argc != 2)
        return 99;
    int ready_fd = atoi(argv[1]);
    char *cfg = cerb_test_zk_config(NULL, "session_timeout_ms = 1500;", NULL);
    cerb_client *c = NULL;
    if (!cfg || cerb_client_open_string(&c, cfg) != CERB_OK)
        return 100;
    free(cfg);
    cerb_rwlock *rw = NULL;
    if (cerb_rwlock_new(c, argv[0], NULL, &rw) != CERB_OK ||
        cerb_rwlock_read_trylock_for(rw, 10000) != CERB_OK)
        return 101;
    char b = 'r';
    if (write(ready_fd, &b, 1) != 1)
        return 102;
    for (;;)
        pause(); /* killed by the parent */
}

static void test_killed_reader_frees_lock(void **state)
{
    (void)state;
    char *name = test_name("rw-expire");
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    char ready_s[16];
    snprintf(ready_s, sizeof ready_s, "%d", ready[1]);
    char *args[] = {name, ready_s, NULL};
    int keep[] = {ready[1], -1};
    pid_t pid = cerb_test_spawn_self("reader", args, keep);
    assert_true(pid > 0);
    close(ready[1]);
    char b;
    assert_int_equal(cerb_test_read_within(ready[0], &b, 1, 20000), 1);

    cerb_client *c = open_client();
    cerb_rwlock *rw = rwl(c, name);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 0), CERB_BUSY);
    kill(pid, SIGKILL);
    assert_int_equal(cerb_test_wait(pid, 10000), 128 + SIGKILL);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 30000), CERB_OK);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_OK);
    close(ready[0]);
    cerb_rwlock_free(rw);
    cerb_client_close(c);
    free(name);
}

static const struct cerb_test_role roles[] = {{"reader", reader_role}, {NULL, NULL}};

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_share_exclude_fifo),
        cmocka_unit_test(test_killed_reader_frees_lock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
