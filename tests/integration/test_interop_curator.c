/*
 * test_interop_curator.c — Cerberus' zk engine and Apache Curator's
 * InterProcessMutex (Debian's jars, driven by tests/interop/curator/
 * CuratorPeer.java) on the same lock path exclude each other both ways,
 * and queue in one line: a Curator waiter behind a Cerberus holder gets the
 * lock on its release, and a Cerberus waiter behind a Curator holder too.
 * The Java sources are compiled here, into the build directory, with a
 * deadline; without javac or the Curator jars the tests are skipped.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"
#include "zk_util.h"

static char *classpath, *classdir;

static int setup(void **state)
{
    (void)state;
    classpath = cerb_test_curator_classpath(&classdir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(classpath);
    cerb_test_remove_tree(classdir);
    return 0;
}

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

/* Start a Curator peer on lock `name`; fails the test unless it is READY. */
static void peer_start(struct cerb_test_proc *p, const char *name)
{
    if (!classpath)
        skip();
    char hosts[64];
    snprintf(hosts, sizeof hosts, "127.0.0.1:%d", cerb_test_zk_port());
    char *path = cerb_test_zk_lock_path(name);
    char *argv[] = {"java", "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                    classpath, "CuratorPeer", hosts, path, NULL};
    assert_int_equal(cerb_test_proc_start(p, argv), 0);
    free(path);
    char *line = cerb_test_proc_line(p, 30000);
    if (!line || strcmp(line, "READY") != 0)
        fail_msg("Curator peer did not start: %s", line ? line : "(no output)");
    free(line);
}

/* Send a command, expect an answer starting with `want`; return it. */
static char *peer_ask(struct cerb_test_proc *p, const char *cmd, const char *want,
                      int64_t timeout_ms)
{
    if (cmd)
        assert_int_equal(cerb_test_proc_send(p, cmd), 0);
    char *line = cerb_test_proc_line(p, timeout_ms);
    if (!line || strncmp(line, want, strlen(want)) != 0)
        fail_msg("Curator peer: \"%s\" answered \"%s\", want \"%s...\"", cmd ? cmd : "(wait)",
                 line ? line : "(nothing)", want);
    return line;
}

static void peer_end(struct cerb_test_proc *p)
{
    cerb_test_proc_send(p, "quit");
    free(cerb_test_proc_line(p, 10000));
    assert_int_equal(cerb_test_proc_end(p, 15000), 0);
}

/* ---- Curator holds: Cerberus is told BUSY, then gets it ---- */

static void test_curator_holds_cerberus_excluded(void **state)
{
    (void)state;
    char *name = test_name("cur-holds");
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    cerb_client *c = open_client();
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, NULL, &l), CERB_OK);

    char *ans = peer_ask(&peer, "acquire 10000", "ACQUIRED", 15000);
    /* Curator's node, in the layout we speak. */
    assert_non_null(strstr(ans, "_c_"));
    assert_non_null(strstr(ans, "-lock-0"));
    free(ans);
    assert_int_equal(cerb_lock_trylock(l), CERB_BUSY);
    assert_int_equal(cerb_lock_trylock_for(l, 300), CERB_TIMEOUT);
    free(peer_ask(&peer, "children", "CHILDREN 1 ", 10000)); /* nothing of ours left */
    free(peer_ask(&peer, "release", "RELEASED", 10000));
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    /* And now Curator is excluded by us. */
    free(peer_ask(&peer, "acquire 300", "TIMEOUT", 10000));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    free(peer_ask(&peer, "acquire 5000", "ACQUIRED", 10000));
    free(peer_ask(&peer, "release", "RELEASED", 10000));
    peer_end(&peer);
    cerb_lock_free(l);
    cerb_client_close(c);
    free(name);
}

/* ---- one queue: Cerberus holds, Curator waits, Cerberus waits ---- */

/* Holds are per thread: the waiter locks, and unlocks when told to. */
struct waiter {
    cerb_lock *l;
    cerb_status st, unlock_st;
    atomic_bool done, release, released;
};

static bool told_to_release(void *ud) { return atomic_load(&((struct waiter *)ud)->release); }

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_lock_trylock_for(w->l, 20000);
    atomic_store(&w->done, true);
    if (w->st == CERB_OK) {
        wait_until(told_to_release, w, 60000);
        w->unlock_st = cerb_lock_unlock(w->l);
    }
    atomic_store(&w->released, true);
    return NULL;
}

static bool waiter_released(void *ud) { return atomic_load(&((struct waiter *)ud)->released); }

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

struct kids {
    zhandle_t *zh;
    const char *path;
    int want;
};
static bool kids_are(void *ud)
{
    struct kids *k = ud;
    return cerb_test_zk_children(k->zh, k->path, NULL, NULL) == k->want;
}

static void test_mixed_queue_is_fifo(void **state)
{
    (void)state;
    char *name = test_name("cur-queue");
    char *path = cerb_test_zk_lock_path(name);
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c1 = open_client(), *c2 = open_client();
    cerb_lock *a = NULL, *b = NULL;
    assert_int_equal(cerb_lock_new(c1, name, NULL, &a), CERB_OK);
    assert_int_equal(cerb_lock_new(c2, name, NULL, &b), CERB_OK);

    /* Cerberus a holds; Curator queues second; Cerberus b third. */
    assert_int_equal(cerb_lock_lock(a), CERB_OK);
    assert_int_equal(cerb_test_proc_send(&peer, "acquire 20000"), 0);
    struct kids two = {zh, path, 2}, three = {zh, path, 3};
    assert_wait_until(kids_are, &two, 10000);
    struct waiter w = {.l = b};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    assert_wait_until(kids_are, &three, 10000);

    /* a's release goes to Curator, not to b. */
    assert_int_equal(cerb_lock_unlock(a), CERB_OK);
    free(peer_ask(&peer, NULL, "ACQUIRED", 10000));
    assert_false(wait_until(waiter_done, &w, 300));
    /* Curator's release goes to b. */
    free(peer_ask(&peer, "release", "RELEASED", 10000));
    assert_wait_until(waiter_done, &w, 10000);
    assert_int_equal(w.st, CERB_OK);
    /* While b holds, Curator waits behind it, and gets it after. */
    free(peer_ask(&peer, "acquire 300", "TIMEOUT", 10000));
    assert_int_equal(cerb_test_proc_send(&peer, "acquire 20000"), 0);
    assert_wait_until(kids_are, &two, 10000);
    atomic_store(&w.release, true);
    assert_wait_until(waiter_released, &w, 10000);
    pthread_join(t, NULL);
    assert_int_equal(w.unlock_st, CERB_OK);
    free(peer_ask(&peer, NULL, "ACQUIRED", 10000));
    free(peer_ask(&peer, "release", "RELEASED", 10000));
    struct kids none = {zh, path, 0};
    assert_wait_until(kids_are, &none, 5000);

    peer_end(&peer);
    cerb_test_zk_close(zh);
    cerb_lock_free(a);
    cerb_lock_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(path);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curator_holds_cerberus_excluded),
        cmocka_unit_test(test_mixed_queue_is_fifo),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
