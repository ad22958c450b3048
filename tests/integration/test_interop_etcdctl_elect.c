/*
 * test_interop_etcdctl_elect.c — Cerberus elections and `etcdctl elect`
 * (Debian etcd-client 3.4.23, Go's concurrency.Election) on the same name
 * take turns, both ways, and each reads the other's value:
 *  - etcdctl leads: our try is BUSY and leader() returns its proposal and
 *    its lease; etcdctl ends (SIGINT: it resigns) and our waiting candidate
 *    is elected, which `etcdctl elect -l` prints with our value;
 *  - we lead: a new `etcdctl elect NAME B` waits, `etcdctl get --prefix
 *    NAME/` shows our value, proclaim changes what the observer prints, and
 *    after our resign etcdctl is elected;
 *  - etcdctl's leader killed with SIGKILL stays leader (its key lives with
 *    its lease); revoking that lease elects our waiter at once;
 *  - `etcdctl lock NAME` (the same layout: concurrency.Mutex) is blocked
 *    while we lead and gets the lock after our resign.
 * etcdctl's output is read line by line through a pipe; 3.4.23's `elect`
 * has no --ttl (its session lease is 60 s), so it is always ended by
 * SIGINT, never left to expire.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "etcd_util.h"
#include "test_util.h"
#include "zk_util.h"

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

static cerb_election *candidate(cerb_client *c, const char *name)
{
    cerb_election *e = NULL;
    if (cerb_election_new(c, name, NULL, &e) != CERB_OK)
        fail_msg("election_new: %s", cerb_last_error());
    return e;
}

/* `etcdctl ARGS...` with its stdout on a pipe. */
static void ctl_start(struct cerb_test_proc *p, const char *const *args)
{
    char ep[64];
    char *argv[16];
    int n = 0;
    snprintf(ep, sizeof ep, "--endpoints=http://127.0.0.1:%d", etcd_test_port());
    argv[n++] = "etcdctl";
    argv[n++] = ep;
    for (size_t i = 0; args[i] && n < 15; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    setenv("ETCDCTL_API", "3", 1);
    assert_int_equal(cerb_test_proc_start(p, argv), 0);
}

/* The next line etcdctl prints within ms, which must be `want` (a prefix
 * match when `prefix`). */
static void ctl_expect(struct cerb_test_proc *p, const char *want, bool prefix, int64_t ms)
{
    char *line = cerb_test_proc_line(p, ms);
    if (!line)
        fail_msg("etcdctl printed nothing within %lld ms (expected \"%s\")", (long long)ms,
                 want);
    if (prefix ? strncmp(line, want, strlen(want)) != 0 : strcmp(line, want) != 0)
        fail_msg("etcdctl printed \"%s\", expected \"%s\"", line, want);
    free(line);
}

/* Stop etcdctl with SIGINT (elect resigns, lock unlocks) and reap it. */
static void ctl_stop(struct cerb_test_proc *p)
{
    kill(p->pid, SIGINT);
    cerb_test_proc_end(p, 10000);
}

struct nkeys {
    const char *name;
    int n;
};

static bool has_nkeys(void *ud)
{
    struct nkeys *q = ud;
    struct etcd_test_kv kv[8];
    char p[512];
    snprintf(p, sizeof p, "%s/", q->name);
    return etcd_test_keys(etcd_test_port(), p, kv, 8) == q->n;
}

struct waiter {
    cerb_election *e;
    const char *value;
    atomic_int done;
    cerb_status st;
};

static void *campaign_thread(void *p)
{
    struct waiter *w = p;
    w->st = cerb_election_campaign(w->e, w->value, strlen(w->value), 20000, NULL);
    atomic_store(&w->done, 1);
    return NULL;
}

static bool w_done(void *ud) { return atomic_load(&((struct waiter *)ud)->done) != 0; }

/* etcdctl leads; we wait and are elected when it resigns. */
static void test_etcdctl_leads(void **state)
{
    (void)state;
    char *name = test_name("ctl-elect");
    struct cerb_test_proc ctl;
    const char *args[] = {"elect", name, "ctl-proposal", NULL};
    ctl_start(&ctl, args);
    char kp[512];
    snprintf(kp, sizeof kp, "%s/", name);
    ctl_expect(&ctl, kp, true, 10000); /* its key: elected */
    ctl_expect(&ctl, "ctl-proposal", false, 5000);
    struct etcd_test_kv kv[4];
    assert_int_equal(etcd_test_keys(etcd_test_port(), kp, kv, 4), 1);

    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name);
    assert_int_equal(cerb_election_campaign(e, "ours", 4, 0, NULL), CERB_BUSY);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_OK);
    assert_true(li.has_leader);
    assert_true(li.value_known);
    assert_int_equal(li.value_len, strlen("ctl-proposal"));
    assert_memory_equal(li.value, "ctl-proposal", li.value_len);
    char hex[32];
    snprintf(hex, sizeof hex, "%llx", (unsigned long long)kv[0].lease);
    assert_string_equal(li.owner, hex);
    assert_true(li.term >= (uint64_t)kv[0].create_revision);
    cerb_leader_info_clear(&li);

    struct waiter w = {e, "ours", 0, CERB_OK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, campaign_thread, &w), 0);
    struct nkeys q2 = {name, 2};
    assert_wait_until(has_nkeys, &q2, 5000);
    assert_false(atomic_load(&w.done));
    ctl_stop(&ctl); /* etcdctl resigns */
    assert_wait_until(w_done, &w, 5000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    /* Our key came after etcdctl's: a higher counter. */
    uint64_t low = cerb_election_fencing_token(e) & ((UINT64_C(1) << 48) - 1);
    assert_true(low > (uint64_t)kv[0].create_revision);

    /* The observer sees us, with our value. */
    struct cerb_test_proc obs;
    const char *oargs[] = {"elect", "-l", name, NULL};
    ctl_start(&obs, oargs);
    ctl_expect(&obs, kp, true, 10000);
    ctl_expect(&obs, "ours", false, 5000);
    ctl_stop(&obs);

    assert_int_equal(cerb_election_free(e), CERB_OK);
    cerb_client_close(c);
    free(name);
}

/* etcdctl's leader killed (kill -9: no resign): its key stays with its
 * 60 s lease; revoking that lease elects our waiter at once. */
static void test_etcdctl_killed(void **state)
{
    (void)state;
    char *name = test_name("ctl-killed");
    struct cerb_test_proc ctl;
    const char *args[] = {"elect", name, "doomed", NULL};
    ctl_start(&ctl, args);
    char kp[512];
    snprintf(kp, sizeof kp, "%s/", name);
    ctl_expect(&ctl, kp, true, 10000);
    ctl_expect(&ctl, "doomed", false, 5000);
    struct etcd_test_kv kv[4];
    assert_int_equal(etcd_test_keys(etcd_test_port(), kp, kv, 4), 1);

    cerb_client *c = open_client();
    struct waiter w = {candidate(c, name), "heir", 0, CERB_OK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, campaign_thread, &w), 0);
    struct nkeys q2 = {name, 2};
    assert_wait_until(has_nkeys, &q2, 5000);
    kill(-ctl.pid, SIGKILL);
    cerb_test_proc_end(&ctl, 5000);
    /* Its key outlives it: still the leader. */
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_OK);
    assert_true(li.has_leader);
    assert_memory_equal(li.value, "doomed", 6);
    cerb_leader_info_clear(&li);
    assert_false(atomic_load(&w.done));
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(etcd_test_revoke(etcd_test_port(), kv[0].lease), 0);
    assert_wait_until(w_done, &w, 5000);
    pthread_join(t, NULL);
    assert_int_equal(w.st, CERB_OK);
    assert_true(cerb_test_now_ms() - t0 < 2000); /* the watch fired */
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_OK);
    assert_memory_equal(li.value, "heir", 4);
    cerb_leader_info_clear(&li);
    assert_int_equal(cerb_election_free(w.e), CERB_OK);
    cerb_client_close(c);
    free(name);
}

static bool ran_get(const char *name, const char *want_value)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ETCDCTL_API=3 etcdctl --endpoints=http://127.0.0.1:%d get --prefix '%s/' "
             "--limit=1 --sort-by=CREATE --order=ASCEND",
             etcd_test_port(), name);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char key[512] = "", value[512] = "";
    bool got = fgets(key, sizeof key, f) && fgets(value, sizeof value, f);
    pclose(f);
    value[strcspn(value, "\n")] = '\0';
    return got && strncmp(key, name, strlen(name)) == 0 && strcmp(value, want_value) == 0;
}

/* We lead; etcdctl waits, observes, and is elected after our resign. */
static void test_we_lead(void **state)
{
    (void)state;
    char *name = test_name("cerb-elect");
    char kp[512];
    snprintf(kp, sizeof kp, "%s/", name);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name);
    assert_int_equal(cerb_election_campaign(e, "ours-1", 6, 0, NULL), CERB_OK);

    struct cerb_test_proc obs;
    const char *oargs[] = {"elect", "-l", name, NULL};
    ctl_start(&obs, oargs);
    ctl_expect(&obs, kp, true, 10000);
    ctl_expect(&obs, "ours-1", false, 5000);

    struct cerb_test_proc ctl;
    const char *args[] = {"elect", name, "B", NULL};
    ctl_start(&ctl, args);
    struct nkeys q2 = {name, 2};
    assert_wait_until(has_nkeys, &q2, 10000); /* queued behind us */
    /* Not elected while we lead: nothing printed in a while. */
    char *line = cerb_test_proc_line(&ctl, 1000);
    if (line)
        fail_msg("etcdctl elect printed \"%s\" while we lead", line);
    assert_true(ran_get(name, "ours-1"));

    assert_int_equal(cerb_election_proclaim(e, "ours-2", 6), CERB_OK);
    ctl_expect(&obs, kp, true, 5000);
    ctl_expect(&obs, "ours-2", false, 5000);
    assert_true(ran_get(name, "ours-2"));
    line = cerb_test_proc_line(&ctl, 200);
    if (line)
        fail_msg("etcdctl elect printed \"%s\" while we lead", line);

    assert_int_equal(cerb_election_resign(e), CERB_OK);
    ctl_expect(&ctl, kp, true, 5000); /* elected */
    ctl_expect(&ctl, "B", false, 5000);
    ctl_expect(&obs, kp, true, 5000);
    ctl_expect(&obs, "B", false, 5000);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_OK);
    assert_true(li.has_leader);
    assert_int_equal(li.value_len, 1);
    assert_memory_equal(li.value, "B", 1);
    cerb_leader_info_clear(&li);
    ctl_stop(&ctl);
    ctl_stop(&obs);
    struct nkeys q0 = {name, 0};
    assert_wait_until(has_nkeys, &q0, 5000);
    assert_int_equal(cerb_election_free(e), CERB_OK);
    cerb_client_close(c);
    free(name);
}

/* `etcdctl lock NAME` waits while we lead, and gets it after our resign. */
static void test_lock_blocked_while_we_lead(void **state)
{
    (void)state;
    char *name = test_name("cerb-elect-lock");
    char kp[512];
    snprintf(kp, sizeof kp, "%s/", name);
    cerb_client *c = open_client();
    cerb_election *e = candidate(c, name);
    assert_int_equal(cerb_election_campaign(e, "leader", 6, 0, NULL), CERB_OK);

    struct cerb_test_proc lk;
    const char *args[] = {"lock", name, NULL};
    ctl_start(&lk, args);
    struct nkeys q2 = {name, 2};
    assert_wait_until(has_nkeys, &q2, 10000);
    char *line = cerb_test_proc_line(&lk, 1000);
    if (line)
        fail_msg("etcdctl lock printed \"%s\" while we lead", line);
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    ctl_expect(&lk, kp, true, 5000); /* it has the lock now */
    ctl_stop(&lk);
    struct nkeys q0 = {name, 0};
    assert_wait_until(has_nkeys, &q0, 5000);
    assert_int_equal(cerb_election_free(e), CERB_OK);
    cerb_client_close(c);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_etcdctl_leads),
        cmocka_unit_test(test_etcdctl_killed),
        cmocka_unit_test(test_we_lead),
        cmocka_unit_test(test_lock_blocked_while_we_lead),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
