/*
 * test_interop_curator_queue.c — Cerberus' zk semaphores and read-write
 * locks against Apache Curator's InterProcessSemaphoreV2 (its limit in a
 * SharedCount at <path>/count) and InterProcessReadWriteLock (Debian's
 * jars, driven by tests/interop/curator/CuratorQueuePeer.java) on the same
 * paths, both ways: Curator holds → Cerberus waits or is refused, and gets
 * in on Curator's release; Cerberus holds → Curator waits, and gets in on
 * ours. Without javac or the Curator jars the tests are skipped.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
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

/* The shared helper compiles the other peers; ours is compiled here, into
 * the same directory, against the same jars. */
static int setup(void **state)
{
    (void)state;
    classpath = cerb_test_curator_classpath(&classdir);
    if (!classpath)
        return 0;
    char src[4096];
    snprintf(src, sizeof src, "%s/tests/interop/curator/CuratorQueuePeer.java",
             cerb_test_source_dir());
    char *argv[] = {"javac", "-nowarn", "-d", classdir, "-cp", classpath, src, NULL};
    int rc = cerb_test_run(argv, 120000);
    if (rc != 0) {
        fprintf(stderr, "javac CuratorQueuePeer.java exited with %d\n", rc);
        return -1;
    }
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

/* Start the peer on `name` in `mode` ("sem" with max, or "rw"). */
static void peer_start(struct cerb_test_proc *p, const char *name, const char *mode,
                       const char *max)
{
    if (!classpath)
        skip();
    char hosts[64];
    snprintf(hosts, sizeof hosts, "127.0.0.1:%d", cerb_test_zk_port());
    char *path = cerb_test_zk_lock_path(name);
    char *argv[] = {"java", "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                    classpath, "CuratorQueuePeer", hosts, path, (char *)mode, (char *)max,
                    NULL};
    assert_int_equal(cerb_test_proc_start(p, argv), 0);
    free(path);
    char *line = cerb_test_proc_line(p, 30000);
    if (!line || strcmp(line, "READY") != 0)
        fail_msg("Curator peer did not start: %s", line ? line : "(no output)");
    free(line);
}

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

static void ask(struct cerb_test_proc *p, const char *cmd, const char *want, int64_t ms)
{
    free(peer_ask(p, cmd, want, ms));
}

static void peer_end(struct cerb_test_proc *p)
{
    cerb_test_proc_send(p, "quit");
    free(cerb_test_proc_line(p, 10000));
    assert_int_equal(cerb_test_proc_end(p, 15000), 0);
}

/* ---- semaphore ---- */

static void test_semaphore_both_ways(void **state)
{
    (void)state;
    char *name = test_name("cur-sem");
    struct cerb_test_proc peer;
    peer_start(&peer, name, "sem", "2"); /* seeds <path>/count with 2 */
    cerb_client *c = open_client();
    cerb_semaphore *s = NULL, *s3 = NULL;
    assert_int_equal(cerb_semaphore_new(c, name, 2, NULL, &s), CERB_OK);
    assert_int_equal(cerb_semaphore_new(c, name, 3, NULL, &s3), CERB_OK);
    cerb_permit *p = NULL, *q = NULL;

    /* Curator holds both: we are refused, and a limit of 3 is a mismatch
     * with its SharedCount while it is in use. */
    ask(&peer, "acquire 2 10000", "ACQUIRED 2", 15000);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_BUSY);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 300, NULL, &p), CERB_TIMEOUT);
    assert_int_equal(cerb_semaphore_acquire(s3, 1, 0, NULL, &p), CERB_ECONFIG);
    ask(&peer, "children leases", "CHILDREN 2 ", 10000); /* nothing of ours left */
    ask(&peer, "children locks", "CHILDREN 0", 10000);
    /* One back: ours. */
    ask(&peer, "release", "RELEASED 2", 10000);
    ask(&peer, "acquire 1 10000", "ACQUIRED 1", 15000);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 5000, NULL, &p), CERB_OK);
    /* Full again (one each): Curator is refused by ours. */
    ask(&peer, "acquire 1 300", "TIMEOUT", 10000);
    /* Curator waits; our release lets it in. */
    assert_int_equal(cerb_test_proc_send(&peer, "acquire 1 15000"), 0);
    assert_int_equal(cerb_permit_release(p), CERB_OK);
    ask(&peer, NULL, "ACQUIRED 1", 15000);
    /* And we wait behind Curator: its release lets us in. */
    ask(&peer, "count", "COUNT 2", 10000);
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &q), CERB_BUSY);
    ask(&peer, "release", "RELEASED 2", 10000);
    assert_int_equal(cerb_semaphore_acquire(s, 2, 5000, NULL, &q), CERB_OK);
    ask(&peer, "acquire 1 300", "TIMEOUT", 10000);
    cerb_permit_free(q);
    cerb_permit_free(p);
    ask(&peer, "acquire 2 5000", "ACQUIRED 2", 10000);
    ask(&peer, "release", "RELEASED 2", 10000);
    peer_end(&peer);
    cerb_semaphore_free(s3);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(name);
}

/* Our stored limit is what a Curator SharedCount reads. */
static void test_semaphore_count_read_by_curator(void **state)
{
    (void)state;
    char *name = test_name("cur-count");
    cerb_client *c = open_client();
    cerb_semaphore *s = NULL;
    assert_int_equal(cerb_semaphore_new(c, name, 5, NULL, &s), CERB_OK);
    cerb_permit *p = NULL;
    assert_int_equal(cerb_semaphore_acquire(s, 1, 0, NULL, &p), CERB_OK);
    struct cerb_test_proc peer;
    peer_start(&peer, name, "sem", "1"); /* its seed loses to the stored 5 */
    ask(&peer, "count", "COUNT 5", 10000);
    ask(&peer, "acquire 4 10000", "ACQUIRED 4", 15000);
    ask(&peer, "acquire 1 300", "TIMEOUT", 10000);
    ask(&peer, "release", "RELEASED 4", 10000);
    cerb_permit_free(p);
    peer_end(&peer);
    cerb_semaphore_free(s);
    cerb_client_close(c);
    free(name);
}

/* ---- read-write lock ---- */

struct nkids {
    zhandle_t *zh;
    const char *path;
    int n;
};

static bool kids_are(void *ud)
{
    struct nkids *k = ud;
    int rc;
    return cerb_test_zk_children(k->zh, k->path, NULL, &rc) == k->n;
}

static void test_rwlock_both_ways(void **state)
{
    (void)state;
    char *name = test_name("cur-rw");
    struct cerb_test_proc peer;
    peer_start(&peer, name, "rw", NULL);
    cerb_client *c = open_client();
    cerb_rwlock *rw = NULL;
    assert_int_equal(cerb_rwlock_new(c, name, NULL, &rw), CERB_OK);

    /* Curator writes: we can neither read nor write. */
    ask(&peer, "wacquire 10000", "ACQUIRED", 15000);
    assert_int_equal(cerb_rwlock_read_trylock_for(rw, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 300), CERB_TIMEOUT);
    ask(&peer, "children .", "CHILDREN 1 ", 10000);
    ask(&peer, "wrelease", "RELEASED", 10000);
    /* We read: Curator reads too, but cannot write. */
    assert_int_equal(cerb_rwlock_read_trylock_for(rw, 5000), CERB_OK);
    ask(&peer, "racquire 5000", "ACQUIRED", 10000);
    ask(&peer, "rrelease", "RELEASED", 10000);
    ask(&peer, "wacquire 300", "TIMEOUT", 10000);
    /* Curator's writer waits; our read unlock lets it in. */
    assert_int_equal(cerb_test_proc_send(&peer, "wacquire 15000"), 0);
    /* Once its writer queued behind our reader, a new reader of ours waits
     * (FIFO across both libraries): seen from another client. */
    cerb_client *c2 = open_client();
    cerb_rwlock *rw2 = NULL;
    assert_int_equal(cerb_rwlock_new(c2, name, NULL, &rw2), CERB_OK);
    char *path = cerb_test_zk_lock_path(name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    struct nkids two = {zh, path, 2};
    assert_wait_until(kids_are, &two, 10000);
    assert_int_equal(cerb_rwlock_read_trylock_for(rw2, 0), CERB_BUSY);
    assert_int_equal(cerb_rwlock_read_unlock(rw), CERB_OK);
    ask(&peer, NULL, "ACQUIRED", 15000);
    /* We write behind Curator's writer; its release lets us in. */
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 0), CERB_BUSY);
    ask(&peer, "wrelease", "RELEASED", 10000);
    assert_int_equal(cerb_rwlock_write_trylock_for(rw, 5000), CERB_OK);
    ask(&peer, "racquire 300", "TIMEOUT", 10000);
    /* Curator's reader waits for our writer. */
    assert_int_equal(cerb_test_proc_send(&peer, "racquire 15000"), 0);
    assert_wait_until(kids_are, &two, 10000);
    assert_int_equal(cerb_rwlock_write_unlock(rw), CERB_OK);
    ask(&peer, NULL, "ACQUIRED", 15000);
    ask(&peer, "rrelease", "RELEASED", 10000);
    ask(&peer, "children .", "CHILDREN 0", 10000);
    peer_end(&peer);
    cerb_test_zk_close(zh);
    free(path);
    cerb_rwlock_free(rw2);
    cerb_rwlock_free(rw);
    cerb_client_close(c2);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_semaphore_both_ways),
        cmocka_unit_test(test_semaphore_count_read_by_curator),
        cmocka_unit_test(test_rwlock_both_ways),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
