/*
 * test_core_safety.c — the core's side of DESIGN.md §5a, on the scripted
 * engines "sa" and "sb" (tests/support/script_engine.h), which can be made
 * to do what a real server does only by chance: refuse to open, fail only
 * the health probes while lock calls succeed (a gray failure), lose a reply,
 * report a short TTL, run code in the middle of an acquire.
 *
 * Each case names the defect of issue 10 it reproduces; every one failed on
 * the code before its fix.
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "clock.h"
#include "script_engine.h"
#include "test_util.h"

/* Fast probes, breakers that open after 3 failed probes and stay open. */
#define FAST_FO                                                                                    \
    "probe_interval_ms = 20; probe_timeout_ms = 10; consecutive_failures = 3; "                    \
    "open_ms = 600000; half_open_successes = 1; "

static cerb_client *open_text(const char *fmt, ...) CERB_TEST_PRINTF(1, 2);
static cerb_client *open_text(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    cerb_client *c = cerb_test_open(text);
    assert_non_null(c);
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock *l = cerb_test_handle(c, name);
    assert_non_null(l);
    return l;
}

/* A lost callback that raises a flag the test waits on. */
static atomic_int lost_flag;
static void on_lost_flag(cerb_lock *l, void *ud)
{
    (void)l;
    (void)ud;
    atomic_store(&lost_flag, 1);
}

static bool lost_seen(void *ud)
{
    (void)ud;
    return atomic_load(&lost_flag) != 0;
}

static int setup(void **state)
{
    (void)state;
    script_engine_register();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    script_engine_reset();
    return 0;
}

struct on_engine {
    cerb_client *c;
    const char *name;
};

static bool is_on(void *ud)
{
    struct on_engine *o = ud;
    const char *cur = cerb_engine_current(o->c);
    return cur && strcmp(cur, o->name) == 0;
}

/*
 * Item 1: `active` names an engine that would not open. The client starts
 * on another; the prober must not switch to the pinned engine before it has
 * an instance (the next trylock dereferenced NULL), and must switch once it
 * opens.
 */
static void test_pinned_engine_that_never_opened(void **state)
{
    (void)state;
    script_engine_set(SCRIPT_B, (struct script_knobs){.open_fails = true});
    /* No grace: this case is about the crash, not the gate a pinned
     * client keeps on an engine it could not open. */
    cerb_client *c = open_text("engines = (\"sa\", \"sb\"); active = \"sb\"; "
                               "failover = { " FAST_FO "switch_grace_ms = 0; };");
    assert_string_equal(cerb_engine_current(c), "sa");
    cerb_lock *l = mk(c, "pin-unopened");
    /* Many probe rounds pass while we lock: every call must work. */
    int64_t end = cerb_test_now_ms() + 300;
    while (cerb_test_now_ms() < end) {
        assert_int_equal(cerb_lock_trylock(l), CERB_OK);
        assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    }
    assert_string_equal(cerb_engine_current(c), "sa");
    /* Once it opens, the pin is applied. */
    script_engine_set(SCRIPT_B, (struct script_knobs){0});
    struct on_engine o = {c, "sb"};
    assert_wait_until(is_on, &o, 3000);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Review of item 4: while the engine the configuration pins would not open
 * here, this client must not grant on another one — every process that
 * could open it has moved there and does not look at this engine's grants.
 * With a switch grace nothing is granted until the pin is applied.
 */
static void test_nothing_granted_while_pin_pending(void **state)
{
    (void)state;
    script_engine_set(SCRIPT_B, (struct script_knobs){.open_fails = true});
    cerb_client *c = open_text("engines = (\"sa\", \"sb\"); active = \"sb\"; "
                               "lock = { lease_ms = 300; }; failover = { " FAST_FO "};");
    cerb_lock *l = mk(c, "pin-pending");
    assert_int_not_equal(cerb_lock_trylock(l), CERB_OK);
    assert_non_null(strstr(cerb_last_error(), "not open here"));
    assert_int_equal(cerb_lock_trylock_for(l, 700), CERB_TIMEOUT); /* past any grace */
    char tok[33];
    assert_false(script_engine_holder(SCRIPT_A, "pin-pending", tok));
    script_engine_set(SCRIPT_B, (struct script_knobs){0});
    struct on_engine o = {c, "sb"};
    assert_wait_until(is_on, &o, 3000);
    assert_int_equal(cerb_lock_trylock_for(l, 2000), CERB_OK);
    assert_true(script_engine_holder(SCRIPT_B, "pin-pending", tok));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Item 2: a gray failure of the old engine — its probes time out, its lock
 * calls (renewals) still succeed. Every breaker opens and both clients move
 * to sb; the holder on sa stays VALID (its renewals succeed), so the gate
 * must keep asking sa and refuse the name, whatever the grace.
 */
static void test_gray_failure_gate_keeps_asking(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 400; }; "
                      "failover = { " FAST_FO "failback = \"manual\"; };";
    cerb_client *a = open_text("%s", cfg);
    cerb_client *b = open_text("%s", cfg);
    cerb_lock *la = mk(a, "gray"), *lb = mk(b, "gray");
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);

    script_engine_set(SCRIPT_A, (struct script_knobs){.probe_fails = true});
    struct on_engine oa = {a, "sb"}, ob = {b, "sb"};
    assert_wait_until(is_on, &oa, 3000);
    assert_wait_until(is_on, &ob, 3000);

    /* Three leases: far past any grace computed from the 400 ms lease. */
    cerb_status st = cerb_lock_trylock_for(lb, 1200);
    assert_int_not_equal(st, CERB_OK);
    assert_int_equal(cerb_lock_state(la), CERB_LOCK_VALID);
    char tok[33];
    assert_false(script_engine_holder(SCRIPT_B, "gray", tok));

    /* Released on sa: the gate's question now says free. */
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(lb, 1000), CERB_OK);
    assert_true(script_engine_holder(SCRIPT_B, "gray", tok));
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
}

/*
 * Item 3: a per-lock lease longer than the configured one, with more than
 * one engine and the default (safe) grace, would outlive the grace: refused.
 */
static void test_per_lock_lease_beyond_grace_refused(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 1000; };");
    cerb_lock *l = NULL;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 20000;
    assert_int_equal(cerb_lock_new(c, "long-lease", &o, &l), CERB_EINVAL);
    assert_null(l);
    assert_non_null(strstr(cerb_last_error(), "switch_grace_ms"));
    o.lease_ms = 1000; /* up to the configured lease is fine */
    assert_int_equal(cerb_lock_new(c, "long-lease", &o, &l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);

    /* One engine, or an explicit grace: nothing to outlive. */
    c = open_text("engines = (\"sa\"); lock = { lease_ms = 1000; };");
    o.lease_ms = 20000;
    assert_int_equal(cerb_lock_new(c, "long-lease", &o, &l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
    c = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 1000; }; "
                  "failover = { switch_grace_ms = 30000; };");
    assert_int_equal(cerb_lock_new(c, "long-lease", &o, &l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
}

static bool is_lost(void *ud) { return cerb_lock_state(ud) == CERB_LOCK_LOST; }

/*
 * Item 6: an acquire whose reply was lost is settled by check_owner, which
 * says how long the server keeps the key (a Redis hand-off key: PX 2000).
 * The hold's deadline must follow that answer, not a full lease from t0:
 * with renewals failing, LOST comes when the server's TTL runs out.
 */
static void test_settled_grant_uses_server_ttl(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); lock = { lease_ms = 10000; };");
    cerb_lock *l = mk(c, "settle-ttl");
    script_engine_set(SCRIPT_A, (struct script_knobs){
                                    .lose_acquire = true, .check_ttl_ms = 300, .renew_fails = true});
    int64_t t0 = cerb_test_now_ms();
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_wait_until(is_lost, l, 5000);
    int64_t took = cerb_test_now_ms() - t0;
    fprintf(stderr, "settled hold lost after %lld ms (server TTL 300 ms)\n", (long long)took);
    assert_true(took <= 1000);
    cerb_lock_unlock(l);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Items 10 and 19: a switch between choosing the engine and the grant. The
 * grant on the old engine must carry the epoch it was chosen under, or the
 * next grant on the new engine (lower counter, same epoch) goes backwards.
 */
static cerb_client *switch_client;
static void switch_to_sb(void *ud)
{
    (void)ud;
    cerb_engine_switch_to(switch_client, "sb");
}

static void test_epoch_captured_with_engine(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\", \"sb\"); failover = { switch_grace_ms = 0; };");
    switch_client = c;
    cerb_lock *l = mk(c, "epoch-race");
    script_engine_set_fence(SCRIPT_A, "epoch-race", 100);
    script_engine_set(SCRIPT_A, (struct script_knobs){.before_grant = switch_to_sb});
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    uint64_t f1 = cerb_lock_fencing_token(l);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_string_equal(cerb_engine_current(c), "sb");
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    uint64_t f2 = cerb_lock_fencing_token(l);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    fprintf(stderr, "tokens %#llx then %#llx\n", (unsigned long long)f1, (unsigned long long)f2);
    assert_true(f2 > f1);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Review of items 10/19 (§5a.3, found by the chaos suite, redis-zk seed
 * 32): one name, one engine, two clients. X has switched sa → sb → sa by
 * itself, Y never switched. Bits that count a client's own switches rank
 * X's grant above Y's later one on the same engine: Y's token went
 * backwards. And X's own tokens must still grow across its switches, when
 * the engine it goes to has the lower counter.
 */
static void test_tokens_ordered_across_clients_on_one_engine(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); failover = { switch_grace_ms = 0; "
                      "failback = \"manual\"; };";
    cerb_client *x = open_text("%s", cfg), *y = open_text("%s", cfg);
    cerb_lock *lx = mk(x, "order"), *ly = mk(y, "order");
    script_engine_set_fence(SCRIPT_A, "order", 1000);
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK);
    uint64_t x1 = cerb_lock_fencing_token(lx);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);

    assert_string_equal(cerb_engine_switch_to(x, "sb"), "sb"); /* sb's counter is 0 */
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK);
    uint64_t x2 = cerb_lock_fencing_token(lx);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    assert_string_equal(cerb_engine_switch_to(x, "sa"), "sa");
    assert_int_equal(cerb_lock_trylock(lx), CERB_OK);
    uint64_t x3 = cerb_lock_fencing_token(lx);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);

    assert_int_equal(cerb_lock_trylock(ly), CERB_OK); /* Y, on sa all along */
    uint64_t y1 = cerb_lock_fencing_token(ly);
    assert_int_equal(cerb_lock_unlock(ly), CERB_OK);
    fprintf(stderr, "X: %#llx (sa) %#llx (sb) %#llx (sa); then Y on sa: %#llx\n",
            (unsigned long long)x1, (unsigned long long)x2, (unsigned long long)x3,
            (unsigned long long)y1);
    assert_true(x2 > x1); /* X's own, across its switches */
    assert_true(x3 > x2);
    assert_true(y1 > x3); /* one engine, successive grants, any client */
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

/*
 * Item 16: failback. Both clients moved to sb while sa was down, sa stayed
 * silent past its grace, then came back. P1 fails back to sa; P2 (manual
 * failback) stays on sb. P2's gate on sa must come back with sa's answers,
 * and the check-then-act window — P1 asks sb "free?", P2 is granted on sb,
 * P1 is granted on sa — must be closed.
 */
struct p2 {
    cerb_lock *l;
    cerb_status st;
};

static void p2_tries(void *ud)
{
    struct p2 *p = ud;
    p->st = cerb_lock_trylock(p->l);
}

static void test_failback_gate_both_ways(void **state)
{
    (void)state;
#define FAILBACK_CFG(MODE)                                                                         \
    "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "                                     \
    "failover = { probe_interval_ms = 20; probe_timeout_ms = 10; consecutive_failures = 3; "       \
    "open_ms = 50; half_open_successes = 1; failback_after_ms = 0; failback = \"" MODE "\"; };"
    cerb_client *p1 = open_text("%s", FAILBACK_CFG("auto"));
    cerb_client *p2 = open_text("%s", FAILBACK_CFG("manual"));
    cerb_lock *l1 = mk(p1, "failback"), *l2 = mk(p2, "failback");

    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});
    struct on_engine o1 = {p1, "sb"}, o2 = {p2, "sb"};
    assert_wait_until(is_on, &o1, 3000);
    assert_wait_until(is_on, &o2, 3000);
    /* sa silent past its grace: P2's gate on sa lifts (trylock passes it). */
    int64_t end = cerb_test_now_ms() + 2000;
    cerb_status st;
    while ((st = cerb_lock_trylock(l2)) != CERB_OK && cerb_test_now_ms() < end)
        ;
    assert_int_equal(st, CERB_OK);
    assert_int_equal(cerb_lock_unlock(l2), CERB_OK);

    /* sa is back: P1 fails back, P2 stays on sb. */
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    struct on_engine b1 = {p1, "sa"};
    assert_wait_until(is_on, &b1, 3000);
    assert_string_equal(cerb_engine_current(p2), "sb");

    /* Right after failing back P1 waits until every client can have heard
     * sa again (two probe intervals + the question back-off), then holds on
     * sa: P2 must see it through its gate on sa. */
    int64_t t_back = cerb_test_now_ms();
    cerb_status first = cerb_lock_trylock(l1);
    if (first != CERB_OK && cerb_test_now_ms() - t_back < 200)
        assert_non_null(strstr(cerb_last_error(), "switched back"));
    if (first != CERB_OK)
        assert_int_equal(cerb_lock_trylock_for(l1, 2000), CERB_OK);
    assert_int_not_equal(cerb_lock_trylock(l2), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l1), CERB_OK);

    /* The window: P2 is granted on sb in the middle of P1's acquire on sa,
     * after P1's gate asked sb. At most one of them may hold. */
    struct p2 p = {l2, CERB_EIO};
    script_engine_set(SCRIPT_A, (struct script_knobs){.before_grant = p2_tries,
                                                      .before_grant_ud = &p});
    cerb_status s1 = cerb_lock_trylock(l1);
    fprintf(stderr, "window: P1 %s, P2 %s\n", cerb_status_name(s1), cerb_status_name(p.st));
    assert_false(s1 == CERB_OK && p.st == CERB_OK);
    if (s1 == CERB_OK)
        assert_int_equal(cerb_lock_unlock(l1), CERB_OK);
    cerb_lock_free(l1);
    cerb_lock_free(l2);
    cerb_client_close(p1);
    cerb_client_close(p2);
}

/*
 * Review of item 16: a grant settled by check_owner after a lost reply is
 * checked against the gated engine after it, like any grant.
 */
static void test_settled_grant_checked_after(void **state)
{
    (void)state;
    cerb_client *x = open_text("engines = (\"sa\");");
    cerb_client *y = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                               "failover = { failback = \"manual\"; };");
    assert_string_equal(cerb_engine_switch_to(y, "sb"), "sb"); /* gates sa */
    cerb_lock *lx = mk(x, "settled-window"), *ly = mk(y, "settled-window");
    struct p2 p = {lx, CERB_EIO};
    script_engine_set(SCRIPT_B, (struct script_knobs){.lose_acquire = true,
                                                      .before_grant = p2_tries,
                                                      .before_grant_ud = &p});
    cerb_status sy = cerb_lock_trylock(ly);
    fprintf(stderr, "settled window: X %s, Y %s\n", cerb_status_name(p.st), cerb_status_name(sy));
    assert_int_equal(p.st, CERB_OK);
    assert_int_not_equal(sy, CERB_OK);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

/*
 * Review of items 2/16 (critical): processes that switch at different
 * times. Y switched to sb (its breaker opened), X did not (its stayed
 * closed). Y's grant on sb passed Y's questions to sa; X, granting on sa,
 * asks nobody. Y's claim on sa makes sa itself refuse X while Y holds.
 */
static void test_unswitched_process_refused_by_claim(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                      "failover = { " FAST_FO "failback = \"manual\"; };";
    cerb_client *x = open_text("%s", cfg);
    cerb_client *y = open_text("%s", cfg);
    assert_string_equal(cerb_engine_switch_to(y, "sb"), "sb");
    assert_string_equal(cerb_engine_current(x), "sa");
    cerb_lock *lx = mk(x, "unswitched"), *ly = mk(y, "unswitched");
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK);
    char tok[33];
    assert_true(script_engine_holder(SCRIPT_B, "unswitched", tok));
    /* Held well past the lease: the claim is renewed with the hold. */
    assert_int_equal(cerb_lock_trylock_for(lx, 900), CERB_TIMEOUT);
    assert_int_equal(cerb_lock_state(ly), CERB_LOCK_VALID);
    assert_int_equal(cerb_lock_unlock(ly), CERB_OK);
    /* Released with the hold: sa grants X again. */
    assert_int_equal(cerb_lock_trylock_for(lx, 1000), CERB_OK);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

/*
 * A claim the engine says is gone while that engine answers (here: its
 * leases all expired, as on a server restarted without data) would let the
 * processes there take the name: the hold it protects is told LOST.
 */
static void test_claim_gone_makes_hold_lost(void **state)
{
    (void)state;
    cerb_client *y = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 600; }; "
                               "failover = { " FAST_FO "failback = \"manual\"; };");
    assert_string_equal(cerb_engine_switch_to(y, "sb"), "sb");
    cerb_lock *ly = mk(y, "claim-gone");
    atomic_store(&lost_flag, 0);
    assert_int_equal(cerb_lock_on_lost(ly, on_lost_flag, NULL), CERB_OK);
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK);
    char tok[33];
    assert_true(script_engine_holder(SCRIPT_A, "claim-gone", tok)); /* the claim */
    script_engine_expire_all(SCRIPT_A);
    assert_wait_until(lost_seen, NULL, 2000);
    assert_int_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    assert_int_equal(cerb_lock_unlock(ly), CERB_LOST);
    /* Gone between two renewals and unlocked at once: unlock says so. */
    assert_int_equal(cerb_lock_trylock_for(ly, 2000), CERB_OK);
    script_engine_expire_all(SCRIPT_A);
    assert_int_equal(cerb_lock_unlock(ly), CERB_LOST);
    cerb_lock_free(ly);
    cerb_client_close(y);
}

/*
 * A claim whose renewals fail while its engine answers everything else (a
 * gray failure: probes and questions answered) expires there and lets
 * others take the name: the hold is told LOST. So it is when the engine
 * looks silent from here: it may answer the others (one lost reply is
 * enough to look silent; cerb_sim seed 707472 had another client granted
 * there while the hold stayed VALID). The hold ends with its claim.
 */
static void test_claim_expiry_while_engine_answers(void **state)
{
    (void)state;
    cerb_client *y = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 400; }; "
                               "failover = { " FAST_FO "failback = \"manual\"; };");
    assert_string_equal(cerb_engine_switch_to(y, "sb"), "sb");
    cerb_lock *ly = mk(y, "claim-expiry");
    atomic_store(&lost_flag, 0);
    assert_int_equal(cerb_lock_on_lost(ly, on_lost_flag, NULL), CERB_OK);
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){.renew_fails = true});
    assert_wait_until(lost_seen, NULL, 2000);
    assert_int_equal(cerb_lock_unlock(ly), CERB_LOST);

    /* The same with sa silent: the hold ends with its claim, within its
     * lease (400 ms) of the claim's last renewal. */
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    atomic_store(&lost_flag, 0);
    assert_int_equal(cerb_lock_trylock_for(ly, 2000), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});
    int64_t t0 = cerb_test_now_ms();
    assert_wait_until(lost_seen, NULL, 2000);
    fprintf(stderr, "sa silent: the hold was told LOST after %lld ms\n",
            (long long)(cerb_test_now_ms() - t0));
    assert_true(cerb_test_now_ms() - t0 <= 1000);
    assert_int_equal(cerb_lock_unlock(ly), CERB_LOST);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_lock_free(ly);
    cerb_client_close(y);
}

/*
 * Item 15: a reentrant lock() on a hold whose deadline has passed is not a
 * success, even before the renewal thread has marked it (here it is stuck
 * in a slow renewal of another hold).
 */
static void test_reentrant_lock_on_expired_hold(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); lock = { lease_ms = 300; };");
    cerb_lock *busy = mk(c, "reent-busy");
    cerb_lock *l = NULL;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.renew = 0;
    assert_int_equal(cerb_lock_new(c, "reent-expired", &o, &l), CERB_OK);
    assert_int_equal(cerb_lock_trylock(busy), CERB_OK);
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    /* The renewal of `busy` (due at 100 ms) now takes 1.5 s. */
    script_engine_set(SCRIPT_A, (struct script_knobs){.renew_delay_ms = 1500});
    assert_wait_until(is_lost, l, 2000);
    cerb_status st = cerb_lock_lock(l);
    if (st != CERB_LOST)
        fprintf(stderr, "lock on an expired hold: %s (%s), state %d, count %u\n",
                cerb_status_name(st), cerb_last_error(), cerb_lock_state(l), cerb_lock_hold_count(l));
    assert_int_equal(st, CERB_LOST);
    assert_int_equal(cerb_lock_unlock(l), CERB_LOST);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_lock_unlock(busy);
    cerb_lock_free(l);
    cerb_lock_free(busy);
    cerb_client_close(c);
}

/*
 * Item 15: a release whose first reply was lost is retried; the retry's
 * "not owner" means our first attempt deleted the key, not that the hold
 * was lost: unlock reports CERB_OK.
 */
static void test_retried_release_after_lost_reply(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); lock = { lease_ms = 5000; };");
    cerb_lock *l = mk(c, "release-retry");
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){.lose_release = true});
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    char tok[33];
    assert_false(script_engine_holder(SCRIPT_A, "release-retry", tok));
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Issue 25: a second release (or the free) of a hold while a release is in
 * flight on another thread waits for it: before, it answered at once and
 * the free that followed freed the hold and its slot under the release.
 */
struct slow_release {
    cerb_hold *h;
    cerb_status st;
    atomic_bool done;
};

static void *slow_release_main(void *arg)
{
    struct slow_release *r = arg;
    r->st = cerb_hold_release(r->h);
    atomic_store(&r->done, true);
    return NULL;
}

static bool engine_failed(void *ud)
{
    struct cerb_engine_info info;
    return cerb_engine_info(ud, "sa", &info) == CERB_OK && info.failures >= 1;
}

static void test_hold_release_in_flight(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); lock = { lease_ms = 5000; }; "
                               "retry = { max = 3; backoff_ms = 1; };");
    cerb_lock *l = mk(c, "hold-in-flight");
    cerb_hold *h = NULL;
    assert_int_equal(cerb_lock_acquire(l, 0, NULL, &h), CERB_OK);
    cerb_lock_free(l); /* the hold alone keeps the name's slot */
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true, .fail_ms = 200});
    struct slow_release r = {.h = h};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, slow_release_main, &r), 0);
    assert_wait_until(engine_failed, c, 3000); /* its first attempt failed: it retries */
    assert_false(atomic_load(&r.done));
    assert_int_equal(cerb_hold_release(h), CERB_NOT_OWNER);
    assert_true(atomic_load(&r.done)); /* it waited for the one in flight */
    pthread_join(t, NULL);
    assert_int_equal(r.st, CERB_EIO);
    assert_non_null(strstr(cerb_hold_error(h), "already released"));
    assert_int_equal(cerb_hold_free(h), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_client_close(c);
}

/*
 * Issue 25: a cancel fired while the grant lands (inside the engine's
 * acquire) ends the call with CERB_INTERRUPTED and leaves nothing on the
 * server.
 */
static void fire_cancel(void *ud) { cerb_cancel_fire(ud); }

static void test_cancel_during_grant(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); lock = { lease_ms = 5000; };");
    cerb_lock *l = mk(c, "cancel-grant");
    cerb_cancel *k = NULL;
    assert_int_equal(cerb_cancel_new(&k), CERB_OK);
    struct script_knobs kn = {0};
    kn.before_grant = fire_cancel;
    kn.before_grant_ud = k;
    script_engine_set(SCRIPT_A, kn);
    cerb_hold *h = NULL;
    assert_int_equal(cerb_lock_acquire(l, -1, k, &h), CERB_INTERRUPTED);
    assert_null(h);
    char tok[33];
    assert_false(script_engine_holder(SCRIPT_A, "cancel-grant", tok));
    assert_non_null(strstr(cerb_cancel_error(k), "cancel-grant"));
    /* The name is free in this process too. */
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    /* A bad call given the cancel says why there too. */
    assert_int_equal(cerb_lock_acquire(l, -5, k, &h), CERB_EINVAL);
    assert_non_null(strstr(cerb_cancel_error(k), "wait_ms"));
    /* A hold passed where a lock handle is expected is refused. */
    assert_int_equal(cerb_lock_acquire(l, 0, NULL, &h), CERB_OK);
    assert_int_equal(cerb_lock_free((cerb_lock *)(void *)h), CERB_EINVAL);
    assert_int_equal(cerb_lock_trylock((cerb_lock *)(void *)h), CERB_EINVAL);
    assert_int_equal(cerb_hold_free(h), CERB_OK);
    cerb_cancel_free(k);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Item 15: a forked child must not release (or otherwise use) its parent's
 * client: its calls are refused with CERB_EINVAL, naming the fork, and the
 * parent's hold is untouched.
 */
static void test_forked_child_refused(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); lock = { lease_ms = 5000; };");
    cerb_lock *l = mk(c, "fork-child");
    assert_int_equal(cerb_lock_trylock(l), CERB_OK);
    cerb_lock *lh = mk(c, "fork-hold");
    cerb_hold *h = NULL;
    assert_int_equal(cerb_lock_acquire(lh, 0, NULL, &h), CERB_OK);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child's copy of the calling thread "holds" the lock. */
        int bad = 0;
        bad |= cerb_lock_unlock(l) != CERB_EINVAL;
        /* The error says why (issue 25): the client is the parent's. */
        bad |= (strstr(cerb_last_error(), "fork()") == NULL) << 1;
        bad |= cerb_lock_trylock(l) != CERB_EINVAL;
        bad |= (strstr(cerb_last_error(), "fork()") == NULL) << 2;
        cerb_lock *l2 = NULL;
        bad |= (cerb_lock_new(c, "fork-child-2", NULL, &l2) != CERB_EINVAL) << 3;
        bad |= (strstr(cerb_last_error(), "fork()") == NULL) << 4;
        bad |= cerb_lock_fencing_token(l) != 0;
        /* Holds owned by objects too: a new one, and the parent's. */
        cerb_hold *h2 = NULL;
        bad |= (cerb_lock_acquire(lh, 0, NULL, &h2) != CERB_EINVAL) << 5;
        bad |= (strstr(cerb_last_error(), "fork()") == NULL) << 6;
        bad |= (cerb_hold_release(h) != CERB_EINVAL) << 7;
        bad |= (strstr(cerb_last_error(), "fork()") == NULL) << 8;
        bad |= (cerb_hold_state(h) != CERB_LOCK_FREE) << 9;
        if (bad)
            fprintf(stderr, "forked child: failed checks %#x\n", (unsigned)bad);
        _exit(bad != 0);
    }
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    char tok[33];
    assert_true(script_engine_holder(SCRIPT_A, "fork-child", tok));
    assert_true(script_engine_holder(SCRIPT_A, "fork-hold", tok));
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    assert_int_equal(cerb_hold_free(h), CERB_OK);
    cerb_lock_free(lh);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Item 15: a trylock whose reply was lost re-checks once, as documented —
 * not retry.max + 1 times — and leaves the late grant to the background
 * release (nobody holds the name once it is done).
 */
static bool name_free(void *ud)
{
    char tok[33];
    return !script_engine_holder(SCRIPT_A, ud, tok);
}

static void test_trylock_rechecks_once(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\"); retry = { max = 5; backoff_ms = 1; };");
    cerb_lock *l = mk(c, "try-bound");
    script_engine_set(SCRIPT_A, (struct script_knobs){.lose_acquire = true, .check_fails = true});
    assert_int_equal(cerb_lock_trylock(l), CERB_EIO);
    assert_int_equal(script_engine_check_calls(SCRIPT_A), 1);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    assert_wait_until(name_free, "try-bound", 3000);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Item 8: the log sink is never called with a library mutex held — here
 * the breaker-transition line, which was written under the failover mutex:
 * a sink that asks the client for engine info deadlocked.
 */
static cerb_client *sink_client;
static atomic_int sink_breaker_lines;
static void asking_sink(cerb_log_level level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    struct cerb_engine_info info;
    if (strstr(line, "breaker") && sink_client &&
        cerb_engine_info(sink_client, "sa", &info) == CERB_OK)
        atomic_fetch_add(&sink_breaker_lines, 1);
}

static bool sink_heard(void *ud)
{
    (void)ud;
    return atomic_load(&sink_breaker_lines) > 0;
}

static void test_log_sink_may_call_the_library(void **state)
{
    (void)state;
    cerb_client *c = open_text("engines = (\"sa\", \"sb\"); failover = { " FAST_FO "};");
    sink_client = c;
    atomic_store(&sink_breaker_lines, 0);
    assert_int_equal(cerb_log_set(asking_sink, NULL, CERB_LOG_WARN), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){.probe_fails = true});
    assert_wait_until(sink_heard, NULL, 3000);
    assert_int_equal(cerb_log_set(NULL, NULL, CERB_LOG_WARN), CERB_OK);
    sink_client = NULL;
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_client_close(c);
}

/* Replace the file at path atomically, as `cerberus switch` does. */
static void rewrite(const char *path, const char *text)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, path), 0);
}

#define RELOAD_CFG(ACTIVE, EXTRA)                                                                  \
    "engines = (\"sa\", \"sb\"); active = \"" ACTIVE "\"; " EXTRA                               \
    "failover = { " FAST_FO "switch_grace_ms = 0; watch_config = false; };\n"

/*
 * Review of item 17: the redis engine's quarantine after a data loss lasts
 * lock.lease_ms in a process that finds the loss without holds of its own,
 * so with redis configured no per-lock lease may be longer (whatever the
 * switch grace).
 */
static void test_redis_quarantine_bounds_leases(void **state)
{
    (void)state;
    /* redis on a closed port (never opens); sa serves. */
    cerb_client *c = open_text("engines = (\"sa\", \"redis\"); "
                               "redis = { port = 1; connect_timeout_ms = 50; }; "
                               "lock = { lease_ms = 1000; }; "
                               "failover = { " FAST_FO "switch_grace_ms = 30000; };");
    cerb_lock *l = NULL;
    cerb_lock_opts o = CERB_LOCK_OPTS_INIT;
    o.lease_ms = 5000;
    assert_int_equal(cerb_lock_new(c, "quarantine", &o, &l), CERB_EINVAL);
    assert_non_null(strstr(cerb_last_error(), "quarantine"));
    o.lease_ms = 1000;
    assert_int_equal(cerb_lock_new(c, "quarantine", &o, &l), CERB_OK);
    cerb_lock_free(l);
    cerb_client_close(c);
}

/*
 * Item 3: a reload that shortens lock.lease_ms must not shorten the grace
 * below the leases of holds taken before it.
 */
static void test_grace_covers_leases_before_reload(void **state)
{
    (void)state;
    const char *fo = "failover = { " FAST_FO "watch_config = false; };\n";
    char text[512];
    snprintf(text, sizeof text, "engines = (\"sa\", \"sb\"); lock = { lease_ms = 1000; }; %s", fo);
    char *path = cerb_test_write_config("%s", text);
    assert_non_null(path);
    cerb_client *a = NULL, *b = NULL;
    assert_int_equal(cerb_client_open(&a, path), CERB_OK);
    assert_int_equal(cerb_client_open(&b, path), CERB_OK);
    cerb_lock *la = mk(a, "hwm"), *lb = mk(b, "hwm");
    atomic_store(&lost_flag, 0);
    assert_int_equal(cerb_lock_on_lost(la, on_lost_flag, NULL), CERB_OK);
    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    snprintf(text, sizeof text, "engines = (\"sa\", \"sb\"); lock = { lease_ms = 200; }; %s", fo);
    rewrite(path, text);
    assert_int_equal(cerb_client_reload(a), CERB_OK);
    assert_int_equal(cerb_client_reload(b), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});
    struct on_engine ob = {b, "sb"};
    assert_wait_until(is_on, &ob, 3000);
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    /* Granted only once the older holder was told. */
    assert_int_equal(atomic_load(&lost_flag), 1);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_unlock(la);
    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
    cerb_test_remove_file(path);
}

/*
 * Found by the simulation (cerb_sim --seed 816): a client that pins the
 * engine it is already on (cerb_engine_switch_to(current)) stays there when
 * its breaker opens, as a pin should — but gated nothing, unlike a pin from
 * the configuration. Another client that failed over granted a name on sb
 * while sa was down (rightly: every hold on sa had expired); once sa was
 * back, the pinned client granted the same name on sa without asking sb.
 */
static void test_pin_of_current_engine_gates_the_others(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                      "failover = { " FAST_FO "};";
    cerb_client *x = open_text("%s", cfg);
    cerb_client *y = open_text("%s", cfg);
    assert_string_equal(cerb_engine_switch_to(y, "sa"), "sa"); /* a pin, no move */
    cerb_lock *lx = mk(x, "pin-current");
    cerb_lock *ly = mk(y, "pin-current");

    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});
    struct on_engine o = {x, "sb"};
    assert_wait_until(is_on, &o, 3000);
    assert_string_equal(cerb_engine_current(y), "sa");
    /* sa silent for its grace: X is granted on sb. */
    assert_int_equal(cerb_lock_trylock_for(lx, 3000), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});

    cerb_status st = cerb_lock_trylock(ly);
    if (st == CERB_OK)
        fprintf(stderr, "pinned client granted on sa while X holds on sb (state %d)\n",
                cerb_lock_state(lx));
    assert_int_equal(st, CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

static bool time_passed(void *ud)
{
    return cerb_test_now_ms() >= *(int64_t *)ud;
}

/*
 * Found by the simulation (cerb_sim --seed 380): the gate let a name pass
 * once the engine switched from had been silent for its grace counted from
 * the last time it answered *this* client. A client that hears it only by
 * its probes heard it last up to a probe interval before it went down, and
 * other clients renewed holds there in between: X granted on sb while Y's
 * hold on sa, renewed after X's last probe, was still in force. The grace
 * must run from when the engine was first found silent.
 */
static void test_grace_counts_from_silence_not_last_answer(void **state)
{
    (void)state;
    /* X probes rarely: it hears sa only at its first round. */
    cerb_client *x = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                               "failover = { probe_interval_ms = 5000; };");
    cerb_client *y = open_text("engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; };");
    assert_string_equal(cerb_engine_switch_to(x, "sb"), "sb"); /* sa gated, answering */
    cerb_lock *lx = mk(x, "grace-from-silence");
    cerb_lock *ly = mk(y, "grace-from-silence");
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK); /* on sa, renewed every 100 ms */
    /* Longer than the grace since X last heard sa; Y kept renewing. */
    int64_t until = cerb_test_now_ms() + 450;
    assert_wait_until(time_passed, &until, 2000);
    assert_int_not_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});

    cerb_status st = cerb_lock_trylock(lx);
    if (st == CERB_OK)
        assert_int_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    assert_int_equal(st, CERB_BUSY);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_lock_unlock(ly);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

struct lease_gap {
    const char *name;
    struct script_record sa, sb;
};

/* The hold's lease on sb ends more than 10 ms after its claim's on sa. */
static bool claim_ends_first(void *ud)
{
    struct lease_gap *g = ud;
    bool ha = script_engine_record(SCRIPT_A, g->name, &g->sa);
    bool hb = script_engine_record(SCRIPT_B, g->name, &g->sb);
    return ha && hb && g->sb.until_ns > g->sa.until_ns + 10 * CERB_NS_PER_MS;
}

/*
 * Found by the simulation (cerb_sim --seed 106063): a hold's deadline was
 * its own lease's alone. Its claim on the engine switched from had been
 * renewed earlier than the hold (the hold's renewal had lost its reply and
 * was retried), and the process paused: the claim's lease ran out on sa and
 * a process that never switched was granted the name there, while the
 * paused holder's deadline said VALID for a while longer. A hold whose
 * claim answers is valid no longer than the claim.
 */
static void test_hold_deadline_within_its_claims(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; };";
    cerb_client *y = open_text("%s", cfg);
    cerb_client *z = open_text("%s", cfg); /* stays on sa */
    assert_string_equal(cerb_engine_switch_to(y, "sb"), "sb");
    cerb_lock *ly = mk(y, "claim-bounds-hold");
    cerb_lock *lz = mk(z, "claim-bounds-hold");
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK); /* on sb, claimed on sa */
    struct script_knobs kb = {.lose_renew = true};
    script_engine_set(SCRIPT_B, kb); /* the hold's renewal is retried */
    struct lease_gap g = {"claim-bounds-hold", {{0}, 0, 0, 0}, {{0}, 0, 0, 0}};
    assert_wait_until(claim_ends_first, &g, 2000);
    /* The process pauses until between the two lease ends. */
    int64_t mid = g.sa.until_ns + (g.sb.until_ns - g.sa.until_ns) / 2;
    cerb__clock_test_suspend((mid - cerb_monotime()) / CERB_NS_PER_MS + 1);
    cerb_status st = cerb_lock_trylock(lz);
    enum cerb_lock_state sy = cerb_lock_state(ly);
    if (st == CERB_OK && sy != CERB_LOCK_LOST)
        fprintf(stderr, "Z granted on sa while Y's hold on sb says %d\n", sy);
    assert_false(st == CERB_OK && sy != CERB_LOCK_LOST);
    if (st == CERB_OK)
        cerb_lock_unlock(lz);
    cerb_lock_unlock(ly);
    cerb_lock_free(ly);
    cerb_lock_free(lz);
    cerb_client_close(y);
    cerb_client_close(z);
}

/*
 * Found by the simulation (cerb_sim --seed 402399): in a gray failure
 * (probes time out, lock calls work) a client's breaker opens and it
 * switches away, its failed probes being all it hears of the engine; the
 * gate then counted the engine silent since the switch, while other clients
 * kept renewing holds there. When the engine really went down, the first
 * question went unanswered and the name passed at once: only lock-path
 * requests left unanswered are silence.
 */
static void test_gray_probes_are_not_silence(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                      "failover = { " FAST_FO "};";
    cerb_client *x = open_text("%s", cfg);
    cerb_client *y = open_text("%s", cfg);
    cerb_lock *lx = mk(x, "gray-silence");
    cerb_lock *ly = mk(y, "gray-silence");
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK); /* on sa */
    script_engine_set(SCRIPT_A, (struct script_knobs){.probe_fails = true});
    struct on_engine o = {x, "sb"};
    assert_wait_until(is_on, &o, 3000);
    /* Longer than the grace since X switched; Y renews on sa meanwhile. */
    int64_t until = cerb_test_now_ms() + 450;
    assert_wait_until(time_passed, &until, 2000);
    assert_int_not_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});

    cerb_status st = cerb_lock_trylock(lx);
    if (st == CERB_OK)
        assert_int_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    assert_int_equal(st, CERB_BUSY);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_lock_unlock(ly);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

/*
 * Found by the simulation (cerb_sim --seed 503269 --steps 1000): the start
 * of a silence was kept from a lock call that failed long before the switch
 * (the engine answered nothing else of ours since: its probes failed in a
 * gray failure, and calls on the current engine are not recorded), so when
 * the engine really went down, much later, its grace seemed long over. A
 * silence observed before the switch says nothing about after it.
 */
static void test_silence_before_switch_is_stale(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                      "failover = { " FAST_FO "};";
    cerb_client *x = open_text("%s", cfg);
    cerb_client *y = open_text("%s", cfg);
    cerb_lock *lx = mk(x, "stale-silence");
    cerb_lock *ly = mk(y, "stale-silence");
    cerb_lock *lt = mk(x, "stale-silence-t1");
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK); /* on sa */
    /* One failed lock call of X on sa, then sa answers lock calls only. */
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});
    assert_int_not_equal(cerb_lock_trylock(lt), CERB_OK);
    script_engine_set(SCRIPT_A, (struct script_knobs){.probe_fails = true});
    struct on_engine o = {x, "sb"};
    assert_wait_until(is_on, &o, 3000);
    int64_t until = cerb_test_now_ms() + 450; /* past the grace since the switch */
    assert_wait_until(time_passed, &until, 2000);
    assert_int_not_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});

    cerb_status st = cerb_lock_trylock(lx);
    if (st == CERB_OK)
        assert_int_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    assert_int_equal(st, CERB_BUSY);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_lock_unlock(ly);
    cerb_lock_free(lt);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

/*
 * Found by the simulation (cerb_sim --seed 622887): an acquisition whose
 * reply was lost on sa carried on on sb with the same token, and the grant
 * there took its claim on sa with that token too. The background release of
 * the old request (which had landed) then released the claim, the two
 * being one token to the server, and a process that never switched was
 * granted the name on sa while the hold on sb stood.
 */
static void test_orphan_release_spares_the_claim(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 1000; };";
    cerb_client *x = open_text("%s", cfg);
    cerb_client *z = open_text("%s", cfg); /* stays on sa */
    cerb_lock *lx = mk(x, "orphan-claim");
    cerb_lock *lz = mk(z, "orphan-claim");
    switch_client = x;
    /* X's acquire lands on sa with its reply lost, X switched meanwhile;
     * the first release of the old request takes effect but is not
     * confirmed, so it is sent again later, after the claim. */
    script_engine_set(SCRIPT_A, (struct script_knobs){.before_grant = switch_to_sb,
                                                      .lose_acquire = true,
                                                      .lose_release = true});
    assert_int_equal(cerb_lock_trylock_for(lx, 3000), CERB_OK);
    assert_string_equal(cerb_engine_current(x), "sb");
    int64_t until = cerb_test_now_ms() + 600; /* the orphan is released again */
    assert_wait_until(time_passed, &until, 2000);
    cerb_status st = cerb_lock_trylock(lz);
    if (st == CERB_OK)
        fprintf(stderr, "Z granted on sa while X holds on sb (state %d)\n", cerb_lock_state(lx));
    assert_int_equal(st, CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(lx), CERB_OK);
    cerb_lock_free(lx);
    cerb_lock_free(lz);
    cerb_client_close(x);
    cerb_client_close(z);
}

/*
 * Found by the simulation (cerb_sim --seed 607816): a claim on the engine
 * switched from lost its reply, which started a silence there; the claim
 * had landed, and its background release was answered — but that answer
 * was not counted, and the client heard nothing else from the engine (its
 * probes failed in a gray failure) while other clients renewed there. When
 * the engine went down, the next unanswered question found the silence
 * "begun" long before and the name passed at once. Every answer counts,
 * the background releases' too.
 */
static void test_orphan_release_answer_counts(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; };";
    cerb_client *x = open_text("%s", cfg);
    cerb_client *y = open_text("%s", cfg);
    assert_string_equal(cerb_engine_switch_to(x, "sb"), "sb"); /* sa gated */
    cerb_lock *lx = mk(x, "orphan-answer");
    cerb_lock *ly = mk(y, "orphan-answer");
    cerb_lock *lt = mk(x, "orphan-answer-t1");
    assert_int_equal(cerb_lock_trylock(ly), CERB_OK); /* on sa */
    /* X's claim on sa lands, its reply lost; sa's probes fail from now on. */
    script_engine_set(SCRIPT_A, (struct script_knobs){.lose_acquire = true, .probe_fails = true});
    if (cerb_lock_trylock(lt) == CERB_OK) /* the gate may or may not let it stand */
        cerb_lock_unlock(lt);
    int64_t until = cerb_test_now_ms() + 700;
    assert_wait_until(time_passed, &until, 2000);
    assert_int_not_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    script_engine_set(SCRIPT_A, (struct script_knobs){.down = true});

    cerb_status st = cerb_lock_trylock(lx);
    if (st == CERB_OK)
        assert_int_equal(cerb_lock_state(ly), CERB_LOCK_LOST);
    assert_int_equal(st, CERB_BUSY);
    script_engine_set(SCRIPT_A, (struct script_knobs){0});
    cerb_lock_unlock(ly);
    cerb_lock_free(lt);
    cerb_lock_free(lx);
    cerb_lock_free(ly);
    cerb_client_close(x);
    cerb_client_close(y);
}

/*
 * Items 10/19 (review): a wait that began before a `cerberus switch`
 * bumped the epoch, on the engine that stays current, is granted after the
 * bump: its token must rank above grants made before the bump.
 */
struct waiter_arg {
    cerb_lock *l;
    atomic_int done;
    cerb_status st;
    uint64_t fence;
};

static void *wait_main(void *arg)
{
    struct waiter_arg *a = arg;
    a->st = cerb_lock_trylock_for(a->l, 5000);
    a->fence = cerb_lock_fencing_token(a->l);
    if (a->st == CERB_OK)
        cerb_lock_unlock(a->l);
    atomic_store(&a->done, 1);
    return NULL;
}

static bool waiter_done(void *ud) { return atomic_load(&((struct waiter_arg *)ud)->done) != 0; }

static void test_wait_across_epoch_bump(void **state)
{
    (void)state;
    const char *fo = "failover = { " FAST_FO "watch_config = false; };\n";
    char text[512];
    snprintf(text, sizeof text, "engines = (\"sa\", \"sb\"); epoch = 1; %s", fo);
    char *path = cerb_test_write_config("%s", text);
    assert_non_null(path);
    cerb_client *c = NULL, *d = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    assert_int_equal(cerb_client_open(&d, path), CERB_OK);
    cerb_lock *lc = mk(c, "bump"), *ld = mk(d, "bump");
    assert_int_equal(cerb_lock_trylock(ld), CERB_OK);
    struct waiter_arg a = {.l = lc};
    pthread_t t;
    pthread_create(&t, NULL, wait_main, &a);
    assert_false(wait_until(waiter_done, &a, 100)); /* c is waiting */
    snprintf(text, sizeof text, "engines = (\"sa\", \"sb\"); epoch = 2; %s", fo);
    rewrite(path, text);
    assert_int_equal(cerb_client_reload(c), CERB_OK);
    assert_int_equal(cerb_lock_unlock(ld), CERB_OK);
    assert_wait_until(waiter_done, &a, 5000);
    pthread_join(t, NULL);
    assert_int_equal(a.st, CERB_OK);
    fprintf(stderr, "granted after the bump with epoch %llu\n",
            (unsigned long long)(a.fence >> 48));
    assert_true((a.fence >> 48) >= 2u);
    cerb_lock_free(lc);
    cerb_lock_free(ld);
    cerb_client_close(c);
    cerb_client_close(d);
    cerb_test_remove_file(path);
}

/*
 * Item 3: the grace covers what the server granted (ZooKeeper's negotiated
 * session timeout, etcd's TTL) when that is longer than the configuration
 * says: here the old engine reports holds outliving their holder by 1.5 s.
 */
static void test_grace_covers_server_hold_bound(void **state)
{
    (void)state;
    script_engine_set(SCRIPT_A, (struct script_knobs){.hold_bound_ms = 1500});
    const char *cfg = "engines = (\"sa\", \"sb\"); lock = { lease_ms = 300; }; "
                      "failover = { " FAST_FO "failback = \"manual\"; };";
    cerb_client *b = open_text("%s", cfg);
    cerb_lock *lb = mk(b, "bound");
    script_engine_set(SCRIPT_A, (struct script_knobs){.hold_bound_ms = 1500, .down = true});
    int64_t t0 = cerb_test_now_ms();
    struct on_engine ob = {b, "sb"};
    assert_wait_until(is_on, &ob, 3000);
    assert_int_equal(cerb_lock_trylock_for(lb, 5000), CERB_OK);
    int64_t took = cerb_test_now_ms() - t0;
    fprintf(stderr, "granted on sb %lld ms after sa went down (hold bound 1500 ms)\n",
            (long long)took);
    assert_true(took >= 1400);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);
    cerb_lock_free(lb);
    cerb_client_close(b);
}

/*
 * Item 4: a reload that moves `active` to an engine that fails to open once
 * was never applied, and said OK. The wish is kept and applied when the
 * engine opens; the reload reports the failed switch, and engine info
 * shows the engine as wanted.
 */
static void test_reload_to_unopened_engine_is_kept(void **state)
{
    (void)state;
    script_engine_set(SCRIPT_B, (struct script_knobs){.open_fails = true});
    char *path = cerb_test_write_config("%s", RELOAD_CFG("sa", ""));
    assert_non_null(path);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    assert_string_equal(cerb_engine_current(c), "sa");
    rewrite(path, RELOAD_CFG("sb", ""));
    assert_int_equal(cerb_client_reload(c), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "sb"));
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c, "sb", &info), CERB_OK);
    assert_int_equal(info.wanted, 1);
    assert_string_equal(cerb_engine_current(c), "sa");
    script_engine_set(SCRIPT_B, (struct script_knobs){0});
    struct on_engine o = {c, "sb"};
    assert_wait_until(is_on, &o, 3000);
    assert_int_equal(cerb_engine_info(c, "sb", &info), CERB_OK);
    assert_int_equal(info.wanted, 0);
    cerb_client_close(c);
    cerb_test_remove_file(path);
}

struct epoch_seen {
    cerb_client *c;
    int64_t want;
};

static bool epoch_is(void *ud)
{
    struct epoch_seen *e = ud;
    struct cerb_engine_info info;
    return cerb_engine_info(e->c, NULL, &info) == CERB_OK && info.epoch == e->want;
}

static bool opening(void *ud) { return script_engine_open_calls(SCRIPT_B) > *(long *)ud; }

/*
 * Item 4: the file watch shared a thread with the probes, so a probe round
 * stuck opening a dead engine (its connect timeout) delayed following the
 * file — a `cerberus switch` every other process had followed.
 */
static void test_file_watch_not_delayed_by_probes(void **state)
{
    (void)state;
    script_engine_set(SCRIPT_B, (struct script_knobs){.open_fails = true});
    const char *fo = "failover = { " FAST_FO "switch_grace_ms = 0; };\n";
    char *path = cerb_test_write_config("engines = (\"sa\", \"sb\"); epoch = 1; %s", fo);
    assert_non_null(path);
    cerb_client *c = NULL;
    assert_int_equal(cerb_client_open(&c, path), CERB_OK);
    /* From now on an attempt to open sb takes 1.5 s. */
    long before = script_engine_open_calls(SCRIPT_B);
    script_engine_set(SCRIPT_B, (struct script_knobs){.open_fails = true, .open_delay_ms = 1500});
    assert_wait_until(opening, &before, 3000);
    char text[512];
    snprintf(text, sizeof text, "engines = (\"sa\", \"sb\"); epoch = 2; %s", fo);
    int64_t t0 = cerb_test_now_ms();
    rewrite(path, text);
    struct epoch_seen e = {c, 2};
    assert_wait_until(epoch_is, &e, 5000);
    int64_t took = cerb_test_now_ms() - t0;
    fprintf(stderr, "file change followed after %lld ms during a 1.5 s probe round\n",
            (long long)took);
    assert_true(took < 500);
    script_engine_set(SCRIPT_B, (struct script_knobs){0});
    cerb_client_close(c);
    cerb_test_remove_file(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pinned_engine_that_never_opened, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_granted_while_pin_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gray_failure_gate_keeps_asking, setup, teardown),
        cmocka_unit_test_setup_teardown(test_per_lock_lease_beyond_grace_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_settled_grant_uses_server_ttl, setup, teardown),
        cmocka_unit_test_setup_teardown(test_epoch_captured_with_engine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokens_ordered_across_clients_on_one_engine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failback_gate_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_settled_grant_checked_after, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unswitched_process_refused_by_claim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_gone_makes_hold_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_expiry_while_engine_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reentrant_lock_on_expired_hold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retried_release_after_lost_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hold_release_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_during_grant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forked_child_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trylock_rechecks_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_sink_may_call_the_library, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grace_covers_leases_before_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_quarantine_bounds_leases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grace_covers_server_hold_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_across_epoch_bump, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_of_current_engine_gates_the_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grace_counts_from_silence_not_last_answer, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hold_deadline_within_its_claims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gray_probes_are_not_silence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silence_before_switch_is_stale, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orphan_release_spares_the_claim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orphan_release_answer_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_to_unopened_engine_is_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_watch_not_delayed_by_probes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
