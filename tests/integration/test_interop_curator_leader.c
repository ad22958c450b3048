/*
 * test_interop_curator_leader.c — leader election between Cerberus' zk
 * engine and Apache Curator 5.4's recipes (Debian's jars, driven by
 * tests/interop/curator/CuratorLeaderPeer.java), on the same path, both
 * ways:
 *   - LeaderLatch (our default layout): a Curator latch that leads makes
 *     our try BUSY and cerb_election_leader report its participant id; it
 *     closes, our waiting candidate is elected with a larger fence; we
 *     lead, Curator's latch waits and its getLeader() reports our value,
 *     and what we proclaim; we resign, it leads; Cerberus and Curator
 *     candidates are elected in the order they came; a proclaim that would
 *     strand a Curator latch waiting right behind us is refused; a Curator
 *     leader killed stays leader until its session expires.
 *   - LeaderSelector (our selector layout): a Curator selector and our
 *     candidate exclude each other, each waits for the other's release, and
 *     the selector's getLeader() reports what we proclaim.
 * Compiled here with javac; skipped without javac or the Curator jars.
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

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "test_util.h"
#include "zk_util.h"

#define LOW48(x) ((x) & ((UINT64_C(1) << 48) - 1))

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

static cerb_election *candidate(cerb_client *c, const char *name, int layout)
{
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.layout = layout;
    cerb_election *e = NULL;
    assert_int_equal(cerb_election_new(c, name, &o, &e), CERB_OK);
    return e;
}

/* Start a Curator peer on election `name`; fails the test unless READY. */
static void peer_start(struct cerb_test_proc *p, const char *name)
{
    if (!classpath)
        skip();
    char hosts[64];
    snprintf(hosts, sizeof hosts, "127.0.0.1:%d", cerb_test_zk_port());
    char *path = cerb_test_zk_lock_path(name);
    char *argv[] = {"java", "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                    classpath, "CuratorLeaderPeer", hosts, path, NULL};
    assert_int_equal(cerb_test_proc_start(p, argv), 0);
    free(path);
    char *line = cerb_test_proc_line(p, 30000);
    if (!line || strcmp(line, "READY") != 0)
        fail_msg("Curator peer did not start: %s", line ? line : "(no output)");
    free(line);
}

/* Send a command (NULL: only read), expect an answer equal to `want`. */
static void peer_ask(struct cerb_test_proc *p, const char *cmd, const char *want,
                     int64_t timeout_ms)
{
    if (cmd)
        assert_int_equal(cerb_test_proc_send(p, cmd), 0);
    char *line = cerb_test_proc_line(p, timeout_ms);
    if (!line || strcmp(line, want) != 0)
        fail_msg("Curator peer: \"%s\" answered \"%s\", want \"%s\"", cmd ? cmd : "(wait)",
                 line ? line : "(nothing)", want);
    free(line);
}

static void peer_end(struct cerb_test_proc *p)
{
    cerb_test_proc_send(p, "quit");
    free(cerb_test_proc_line(p, 10000));
    assert_int_equal(cerb_test_proc_end(p, 15000), 0);
}

/* Who leads, as we read it: the value ("" unknown), NULL for nobody. */
static char *leader_value(cerb_client *c, const char *name, int layout, uint64_t *term)
{
    cerb_leader_info li;
    cerb_status st = cerb_election_leader(c, name, layout, &li);
    if (st != CERB_OK)
        fail_msg("leader: %s: %s", cerb_status_name(st), cerb_last_error());
    char *v = NULL;
    if (li.has_leader) {
        v = strndup(li.value_known ? (const char *)li.value : "", li.value_len);
        if (term)
            *term = li.term;
    }
    cerb_leader_info_clear(&li);
    return v;
}

struct waiter {
    cerb_election *e;
    const char *value;
    cerb_status st;
    atomic_bool done;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    w->st = cerb_election_campaign(w->e, w->value, strlen(w->value), 20000, NULL);
    atomic_store(&w->done, true);
    return NULL;
}

static bool w_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done); }

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

/* ---- a Curator LeaderLatch leads; then our waiting candidate ---- */

static void test_curator_latch_leads(void **state)
{
    (void)state;
    char *name = test_name("cur-latch");
    char *path = cerb_test_zk_lock_path(name);
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name, CERB_ELECTION_LAYOUT_DEFAULT);

    peer_ask(&peer, "latch cur-1", "STARTED", 10000);
    peer_ask(&peer, "await 10000", "LEADER", 15000);
    assert_int_equal(cerb_election_campaign(e, "cerb-1", 6, 0, NULL), CERB_BUSY);
    uint64_t cur_term = 0;
    char *v = leader_value(c, name, CERB_ELECTION_LAYOUT_DEFAULT, &cur_term);
    assert_non_null(v);
    assert_string_equal(v, "cur-1"); /* Curator's participant id */
    free(v);
    assert_true(cur_term > 0);

    /* Our candidate queues behind Curator's and is elected when it closes. */
    struct waiter w = {.e = e, .value = "cerb-1"};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    struct kids two = {zh, path, 2};
    assert_wait_until(kids_are, &two, 10000);
    assert_false(atomic_load(&w.done));
    peer_ask(&peer, "close", "CLOSED", 10000);
    assert_wait_until(w_done, &w, 10000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_true(LOW48(cerb_election_fencing_token(e)) > cur_term);
    v = leader_value(c, name, 0, NULL);
    assert_string_equal(v, "cerb-1");
    free(v);
    peer_ask(&peer, "leader", "LEADER_ID cerb-1", 10000);

    assert_int_equal(cerb_election_resign(e), CERB_OK);
    peer_ask(&peer, "leader", "NONE", 10000);
    peer_end(&peer);
    cerb_election_free(e);
    cerb_client_close(c);
    cerb_test_zk_close(zh);
    free(path);
    free(name);
}

/* ---- we lead: Curator's latch waits and reads our value ---- */

static void test_cerberus_leads_latch(void **state)
{
    (void)state;
    char *name = test_name("cur-we-lead");
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name, CERB_ELECTION_LAYOUT_LATCH);

    peer_ask(&peer, "leader", "NONE", 10000);
    assert_int_equal(cerb_election_campaign(e, "cerb-1", 6, 0, NULL), CERB_OK);
    peer_ask(&peer, "leader", "LEADER_ID cerb-1", 10000);
    /* What we proclaim is what Curator's getLeader() reports. */
    assert_int_equal(cerb_election_proclaim(e, "cerb-2", 6), CERB_OK);
    peer_ask(&peer, "leader", "LEADER_ID cerb-2", 10000);

    peer_ask(&peer, "latch cur-2", "STARTED", 10000);
    peer_ask(&peer, "await 300", "TIMEOUT", 10000);
    peer_ask(&peer, "has", "FOLLOWER", 10000);
    peer_ask(&peer, "leader", "LEADER_ID cerb-2", 10000);
    char *v = leader_value(c, name, 0, NULL);
    assert_string_equal(v, "cerb-2");
    free(v);

    /* We resign: Curator's latch leads, and we read its id. */
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    peer_ask(&peer, "await 10000", "LEADER", 15000);
    peer_ask(&peer, "leader", "LEADER_ID cur-2", 10000);
    v = leader_value(c, name, 0, NULL);
    assert_string_equal(v, "cur-2");
    free(v);
    assert_int_equal(cerb_election_campaign(e, "cerb-3", 6, 0, NULL), CERB_BUSY);
    peer_ask(&peer, "close", "CLOSED", 10000);
    assert_int_equal(cerb_election_campaign(e, "cerb-3", 6, 10000, NULL), CERB_OK);

    peer_end(&peer);
    cerb_election_free(e);
    cerb_client_close(c);
    free(name);
}

/* ---- a Curator leader killed: elected only once its session expired ---- */

static void test_killed_curator_leader(void **state)
{
    (void)state;
    char *name = test_name("cur-kill");
    char *path = cerb_test_zk_lock_path(name);
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name, 0);

    peer_ask(&peer, "latch cur-1", "STARTED", 10000);
    peer_ask(&peer, "await 10000", "LEADER", 15000);
    struct waiter w = {.e = e, .value = "cerb-1"};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    struct kids two = {zh, path, 2};
    assert_wait_until(kids_are, &two, 10000);

    /* No close, no deletion: its node lives as long as its 10 s session,
     * and so does its term. */
    int64_t killed = cerb_monotime();
    assert_int_equal(kill(peer.pid, SIGKILL), 0);
    cerb_test_proc_end(&peer, 10000);
    assert_wait_until(w_done, &w, 30000);
    int64_t waited_ms = (cerb_monotime() - killed) / 1000000;
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    if (waited_ms < 6000)
        fail_msg("elected %lld ms after the Curator leader was killed, before its 10 s session "
                 "could expire",
                 (long long)waited_ms);
    char *v = leader_value(c, name, 0, NULL);
    assert_string_equal(v, "cerb-1");
    free(v);

    cerb_election_free(e);
    cerb_client_close(c);
    cerb_test_zk_close(zh);
    free(path);
    free(name);
}

/* ---- one line: Cerberus leads, a Curator latch waits, Cerberus waits ---- */

static void test_mixed_latch_queue_in_order(void **state)
{
    (void)state;
    char *name = test_name("cur-line");
    char *path = cerb_test_zk_lock_path(name);
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c1 = open_client(), *c2 = open_client();
    cerb_election *a = candidate(c1, name, 0), *b = candidate(c2, name, 0);

    assert_int_equal(cerb_election_campaign(a, "cerb-a", 6, 0, NULL), CERB_OK);
    peer_ask(&peer, "latch cur-2", "STARTED", 10000);
    struct kids two = {zh, path, 2}, three = {zh, path, 3};
    assert_wait_until(kids_are, &two, 10000);
    struct waiter w = {.e = b, .value = "cerb-b"};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    assert_wait_until(kids_are, &three, 10000);

    /* a's resignation goes to Curator, which came second, not to b. */
    uint64_t fa = cerb_election_fencing_token(a);
    assert_int_equal(cerb_election_resign(a), CERB_OK);
    peer_ask(&peer, "await 10000", "LEADER", 15000);
    assert_false(atomic_load(&w.done));
    char *v = leader_value(c1, name, 0, NULL);
    assert_string_equal(v, "cur-2");
    free(v);
    /* Curator's goes to b. */
    peer_ask(&peer, "close", "CLOSED", 10000);
    assert_wait_until(w_done, &w, 10000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_true(LOW48(cerb_election_fencing_token(b)) > LOW48(fa));
    peer_ask(&peer, "leader", "LEADER_ID cerb-b", 10000);

    peer_end(&peer);
    cerb_election_free(b);
    cerb_election_free(a);
    cerb_client_close(c2);
    cerb_client_close(c1);
    cerb_test_zk_close(zh);
    free(path);
    free(name);
}

/* ---- LeaderSelector: a Curator selector and ours exclude each other ---- */

static void test_selector_exclusion(void **state)
{
    (void)state;
    char *name = test_name("cur-sel");
    char *path = cerb_test_zk_lock_path(name);
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    zhandle_t *zh = cerb_test_zk_connect(NULL, NULL);
    assert_non_null(zh);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name, CERB_ELECTION_LAYOUT_SELECTOR);

    /* Curator's selector leads: we are BUSY, then wait for it. */
    peer_ask(&peer, "selector cur-s", "STARTED", 10000);
    peer_ask(&peer, NULL, "TAKEN", 10000);
    assert_int_equal(cerb_election_campaign(e, "cerb-s", 6, 0, NULL), CERB_BUSY);
    char *v = leader_value(c, name, CERB_ELECTION_LAYOUT_SELECTOR, NULL);
    assert_string_equal(v, "cur-s");
    free(v);
    v = leader_value(c, name, CERB_ELECTION_LAYOUT_LATCH, NULL);
    assert_null(v); /* not a latch */
    struct waiter w = {.e = e, .value = "cerb-s"};
    pthread_t t;
    pthread_create(&t, NULL, waiter_main, &w);
    struct kids two = {zh, path, 2};
    assert_wait_until(kids_are, &two, 10000);
    assert_false(atomic_load(&w.done));
    peer_ask(&peer, "resign", "RESIGNED", 10000);
    assert_wait_until(w_done, &w, 10000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    peer_ask(&peer, "sleader", "LEADER_ID cerb-s", 10000);
    peer_ask(&peer, "sclose", "CLOSED", 10000);

    /* We lead: a new Curator selector waits, reads what we proclaim, and
     * takes leadership when we resign (a data change does not strand a
     * selector's waiter: it lists again on any event). */
    peer_ask(&peer, "selector cur-t", "STARTED", 10000);
    struct kids two_again = {zh, path, 2};
    assert_wait_until(kids_are, &two_again, 10000);
    char *line = cerb_test_proc_line(&peer, 500);
    assert_null(line); /* no TAKEN while we lead */
    assert_int_equal(cerb_election_proclaim(e, "cerb-s2", 7), CERB_OK);
    peer_ask(&peer, "sleader", "LEADER_ID cerb-s2", 10000);
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    peer_ask(&peer, NULL, "TAKEN", 10000);
    peer_ask(&peer, "sleader", "LEADER_ID cur-t", 10000);
    peer_ask(&peer, "resign", "RESIGNED", 10000);

    peer_end(&peer);
    cerb_election_free(e);
    cerb_client_close(c);
    cerb_test_zk_close(zh);
    free(path);
    free(name);
}

/*
 * Curator 5.4's LeaderLatch watches its predecessor with a getData watch
 * and acts on NodeDeleted only: a proclaim (NodeDataChanged) while it waits
 * right behind our node would use up its watch, and it would never learn of
 * our term's end (the election would stall behind it). Such a proclaim is
 * refused with CERB_BUSY, nothing written, and the latch is elected when we
 * resign.
 */
static void test_latch_proclaim_refused_before_curator(void **state)
{
    (void)state;
    char *name = test_name("cur-refuse");
    struct cerb_test_proc peer;
    peer_start(&peer, name);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name, CERB_ELECTION_LAYOUT_LATCH);
    assert_int_equal(cerb_election_campaign(e, "cerb-1", 6, 0, NULL), CERB_OK);
    peer_ask(&peer, "latch cur-2", "STARTED", 10000);
    peer_ask(&peer, "await 300", "TIMEOUT", 10000);
    assert_int_equal(cerb_election_proclaim(e, "cerb-2", 6), CERB_BUSY);
    assert_non_null(strstr(cerb_last_error(), "LeaderLatch"));
    peer_ask(&peer, "leader", "LEADER_ID cerb-1", 10000);
    assert_int_equal(cerb_election_state(e), CERB_LOCK_VALID);
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    peer_ask(&peer, "await 10000", "LEADER", 15000);
    peer_ask(&peer, "leader", "LEADER_ID cur-2", 10000);
    peer_end(&peer);
    cerb_election_free(e);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curator_latch_leads),
        cmocka_unit_test(test_cerberus_leads_latch),
        cmocka_unit_test(test_mixed_latch_queue_in_order),
        cmocka_unit_test(test_killed_curator_leader),
        cmocka_unit_test(test_selector_exclusion),
        cmocka_unit_test(test_latch_proclaim_refused_before_curator),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
