/*
 * test_redis_election.c — leader election on a real redis-server through
 * the public API (cerb_election_*), and what it leaves on the wire: K holds
 * the term's owner token as a lock's does, and {K}^_value "<token> <value>"
 * is written before campaign returns and trusted only while its token is
 * K's. Cases: campaign / BUSY / leader / proclaim / resign with fences
 * growing term after term; two Cerberus candidates through the fair
 * hand-off, where leader() never pairs one term's owner with another's
 * value; a term taken behind its holder (lost once, proclaim CERB_LOST);
 * the quarantine after a loss of data (UNKNOWN, never "nobody"); and
 * redis-py's Lock exactly as tooz calls it, both ways. A lease that runs
 * out with the server paused is in test_redis_election_pause.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cerberus.h"
#include "test_util.h"

#define FENCE_MASK ((UINT64_C(1) << 48) - 1)

static cerb_client *open_client(const char *redis_extra)
{
    char *cfg = cerb_test_redis_config(redis_extra, NULL);
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    free(cfg);
    return c;
}

static cerb_election *candidate(cerb_client *c, const char *name, int64_t lease_ms)
{
    cerb_election_opts o = CERB_ELECTION_OPTS_INIT;
    o.lease_ms = lease_ms;
    cerb_election *e = NULL;
    if (cerb_election_new(c, name, &o, &e) != CERB_OK)
        fail_msg("election_new: %s", cerb_last_error());
    return e;
}

static redisContext *raw(void)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", cerb_test_redis_port(), tv);
    assert_non_null(r);
    assert_int_equal(r->err, 0);
    redisSetTimeout(r, tv);
    return r;
}

/* GET of a key (binary-safe), NULL when missing. */
static char *raw_get(const char *key)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "GET %b", key, strlen(key));
    char *v = rep && rep->type == REDIS_REPLY_STRING ? strndup(rep->str, rep->len) : NULL;
    freeReplyObject(rep);
    redisFree(r);
    return v;
}

static void raw_cmd(const char *fmt, const char *key, const char *arg)
{
    redisContext *r = raw();
    redisReply *rep = arg ? redisCommand(r, fmt, key, strlen(key), arg, strlen(arg))
                          : redisCommand(r, fmt, key, strlen(key));
    assert_non_null(rep);
    assert_int_not_equal(rep->type, REDIS_REPLY_ERROR);
    freeReplyObject(rep);
    redisFree(r);
}

/* {K}^_value of a name (no redis.prefix). */
static char *value_key(const char *name)
{
    size_t n = strlen(name) + 16;
    char *k = malloc(n);
    snprintf(k, n, "{%s}\x1f" "value", name);
    return k;
}

static bool is_token(const char *s)
{
    if (!s || strlen(s) != 32)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

/* "<token> <value>" in V for K's current token? */
static bool v_names_k(const char *name, const char *value)
{
    char *k = raw_get(name), *vk = value_key(name), *v = raw_get(vk);
    bool ok = false;
    if (k && v) {
        size_t kl = strlen(k);
        ok = strncmp(v, k, kl) == 0 && v[kl] == ' ' && strcmp(v + kl + 1, value) == 0;
    }
    free(k);
    free(v);
    free(vk);
    return ok;
}

/* cerb_election_leader into li, asserting CERB_OK. */
static void leader(cerb_client *c, const char *name, cerb_leader_info *li)
{
    cerb_status st = cerb_election_leader(c, name, 0, li);
    if (st != CERB_OK)
        fail_msg("leader: %s: %s", cerb_status_name(st), cerb_last_error());
    assert_string_equal(li->engine, "redis");
}

static void assert_leads_with(cerb_client *obs, const char *name, cerb_election *e,
                              const char *value)
{
    cerb_leader_info li;
    leader(obs, name, &li);
    assert_int_equal(li.has_leader, 1);
    assert_int_equal(li.value_known, 1);
    assert_int_equal(li.value_len, strlen(value));
    assert_memory_equal(li.value, value, li.value_len);
    /* The counter reported is the term's fence on the engine. */
    assert_int_equal(li.term, cerb_election_fencing_token(e) & FENCE_MASK);
    assert_true(li.ttl_ms > 0);
    char *k = raw_get(name);
    assert_non_null(k);
    assert_string_equal(li.owner, k);
    free(k);
    cerb_leader_info_clear(&li);
}

static void assert_nobody(cerb_client *obs, const char *name)
{
    cerb_leader_info li;
    leader(obs, name, &li);
    assert_int_equal(li.has_leader, 0);
    cerb_leader_info_clear(&li);
}

/* ---- the public API on the wire ---- */

static void test_campaign_proclaim_resign(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(NULL), *c2 = open_client(NULL), *obs = open_client(NULL);
    char *name = test_name("el-api");
    cerb_election *a = candidate(c1, name, 5000), *b = candidate(c2, name, 5000);

    assert_nobody(obs, name);
    assert_int_equal(cerb_election_campaign(a, "node-a", 6, 0, NULL), CERB_OK);
    uint64_t fa = cerb_election_fencing_token(a);
    assert_true(fa > 0);
    /* K is a lock's: the owner token (redis-py's shape), not the value. */
    char *k = raw_get(name);
    assert_true(is_token(k));
    free(k);
    assert_true(v_names_k(name, "node-a"));
    assert_leads_with(obs, name, a, "node-a");

    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_BUSY);
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 200, NULL), CERB_TIMEOUT);
    assert_int_equal(cerb_election_proclaim(b, "x", 1), CERB_NOT_OWNER);

    /* Proclaim changes the value in place (binary-safe, idempotent). */
    static const char bin[] = {'n', 0, 'd', ' ', '\xff'};
    assert_int_equal(cerb_election_proclaim(a, bin, sizeof bin), CERB_OK);
    assert_int_equal(cerb_election_proclaim(a, bin, sizeof bin), CERB_OK);
    cerb_leader_info li;
    leader(obs, name, &li);
    assert_int_equal(li.value_known, 1);
    assert_int_equal(li.value_len, sizeof bin);
    assert_memory_equal(li.value, bin, sizeof bin);
    cerb_leader_info_clear(&li);
    assert_int_equal(cerb_election_proclaim(a, "node-a:2", 8), CERB_OK);
    assert_leads_with(obs, name, a, "node-a:2");

    assert_int_equal(cerb_election_resign(a), CERB_OK);
    assert_null(raw_get(name));
    assert_nobody(obs, name); /* V is left behind, and ignored without K */
    assert_int_equal(cerb_election_campaign(b, "node-b", 6, 0, NULL), CERB_OK);
    uint64_t fb = cerb_election_fencing_token(b);
    assert_true(fb > fa);
    assert_leads_with(obs, name, b, "node-b");
    assert_int_equal(cerb_election_resign(b), CERB_OK);
    /* An empty value is a value. */
    assert_int_equal(cerb_election_campaign(a, NULL, 0, 0, NULL), CERB_OK);
    assert_true(cerb_election_fencing_token(a) > fb);
    assert_leads_with(obs, name, a, "");
    assert_int_equal(cerb_election_free(a), CERB_OK); /* resigns */
    assert_nobody(obs, name);

    cerb_election_free(b);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(obs);
    free(name);
}

/* ---- the fair hand-off between two Cerberus candidates ---- */

/* Someone (at least n) waits in the name's server queue ({K}^_q). */
struct qlen {
    const char *name;
    long long n;
};

static bool queue_has(void *ud)
{
    struct qlen *q = ud;
    size_t n = strlen(q->name) + 8;
    char *k = malloc(n);
    snprintf(k, n, "{%s}\x1f" "q", q->name);
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "LLEN %b", k, strlen(k));
    bool yes = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer >= q->n;
    freeReplyObject(rep);
    redisFree(r);
    free(k);
    return yes;
}

struct second {
    cerb_election *e;
    const char *name;
    atomic_int done;
    cerb_status st;
    bool v_was_written; /* V named K's token with our value as campaign returned */
};

static void *second_main(void *p)
{
    struct second *s = p;
    s->st = cerb_election_campaign(s->e, "vb", 2, 10000, NULL);
    if (s->st == CERB_OK)
        s->v_was_written = v_names_k(s->name, "vb");
    atomic_store(&s->done, 1);
    return NULL;
}

static bool second_done(void *ud) { return atomic_load(&((struct second *)ud)->done) != 0; }

#define MAX_SEEN 4096

struct seen {
    char owner[96];
    char value[8];
    int known;
};

struct observer {
    cerb_client *c;
    const char *name;
    atomic_int stop;
    struct seen *seen;
    atomic_int reads, errors;
    char err[256];
};

/* leader() over and over through the hand-off, each answer kept for the
 * check afterwards (both tokens are known only then). */
static void *observer_main(void *p)
{
    struct observer *o = p;
    while (!atomic_load(&o->stop) && atomic_load(&o->reads) < MAX_SEEN) {
        cerb_leader_info li;
        if (cerb_election_leader(o->c, o->name, 0, &li) != CERB_OK) {
            if (atomic_fetch_add(&o->errors, 1) == 0)
                snprintf(o->err, sizeof o->err, "%s", cerb_last_error());
            continue;
        }
        struct seen *x = &o->seen[atomic_load(&o->reads)];
        snprintf(x->owner, sizeof x->owner, "%s", li.has_leader ? li.owner : "");
        x->known = li.has_leader && li.value_known;
        snprintf(x->value, sizeof x->value, "%s", x->known ? (const char *)li.value : "");
        cerb_leader_info_clear(&li);
        atomic_fetch_add(&o->reads, 1); /* x is complete */
    }
    return NULL;
}

struct reads_at {
    struct observer *o;
    int n;
};

static bool reads_reached(void *ud)
{
    struct reads_at *r = ud;
    return atomic_load(&r->o->reads) >= r->n || atomic_load(&r->o->errors) > 0;
}

/* A read naming A's token carries A's value or none, one naming B's
 * carries B's or none; no read names anyone else. */
static int mismatches(struct observer *o, const char *tok_a, const char *tok_b,
                      int *of_b)
{
    int bad = 0;
    *of_b = 0;
    for (int i = 0; i < atomic_load(&o->reads); i++) {
        const struct seen *x = &o->seen[i];
        bool is_a = strcmp(x->owner, tok_a) == 0, is_b = strcmp(x->owner, tok_b) == 0;
        *of_b += is_b;
        if (!x->owner[0])
            continue;
        if ((!is_a && !is_b) || (x->known && strcmp(x->value, is_a ? "va" : "vb") != 0)) {
            if (bad++ == 0)
                print_message("read %d: owner %s value %s\n", i, x->owner, x->value);
        }
    }
    return bad;
}

static void test_handoff_pairs_term_and_value(void **state)
{
    (void)state;
    cerb_client *c1 = open_client(NULL), *c2 = open_client(NULL), *obs = open_client(NULL);
    char *name = test_name("el-handoff");
    cerb_election *a = candidate(c1, name, 5000);
    assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_OK);
    uint64_t fa = cerb_election_fencing_token(a);
    struct second s = {candidate(c2, name, 5000), name, 0, CERB_OK, false};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, second_main, &s), 0);
    /* B queued on the server, so that A's release hands K to it. */
    struct qlen q = {name, 1};
    assert_wait_until(queue_has, &q, 5000);
    assert_false(atomic_load(&s.done));

    struct observer o = {.c = obs, .name = name, .seen = calloc(MAX_SEEN, sizeof(struct seen))};
    char tok_a[40], tok_b[40];
    char *k = raw_get(name);
    snprintf(tok_a, sizeof tok_a, "%s", k);
    free(k);
    pthread_t ot;
    assert_int_equal(pthread_create(&ot, NULL, observer_main, &o), 0);
    struct reads_at r = {&o, 3};
    assert_wait_until(reads_reached, &r, 5000);
    assert_int_equal(cerb_election_resign(a), CERB_OK);
    assert_wait_until(second_done, &s, 5000);
    assert_int_equal(s.st, CERB_OK);
    assert_true(s.v_was_written);
    k = raw_get(name);
    snprintf(tok_b, sizeof tok_b, "%s", k);
    free(k);
    r.n = atomic_load(&o.reads) + 3; /* a few reads of the new term */
    assert_wait_until(reads_reached, &r, 5000);
    atomic_store(&o.stop, 1);
    pthread_join(ot, NULL);
    pthread_join(t, NULL);
    if (atomic_load(&o.errors))
        fail_msg("%d leader reads failed (%d good), the first: %s", atomic_load(&o.errors),
                 atomic_load(&o.reads), o.err);
    assert_true(o.reads > 0);
    int of_b;
    assert_int_equal(mismatches(&o, tok_a, tok_b, &of_b), 0);
    assert_true(of_b > 0); /* the observer saw the new term too */
    free(o.seen);
    assert_true(cerb_election_fencing_token(s.e) > fa);
    assert_leads_with(obs, name, s.e, "vb");
    /* The hand-off happened on the server (B was not elected by polling). */
    struct cerb_engine_info info;
    assert_int_equal(cerb_engine_info(c1, "redis", &info), CERB_OK);
    assert_true(info.handoffs >= 1);

    cerb_election_free(s.e);
    cerb_election_free(a);
    cerb_client_close(c1);
    cerb_client_close(c2);
    cerb_client_close(obs);
    free(name);
}

/* Three candidates of three clients: elected one at a time, in the order
 * they joined the server's queue, each with its value before its campaign
 * returns and a fence above the last. */
struct cand {
    cerb_election *e;
    const char *name, *value;
    atomic_int done;
    cerb_status st;
    bool v_was_written;
};

static void *cand_main(void *p)
{
    struct cand *x = p;
    x->st = cerb_election_campaign(x->e, x->value, strlen(x->value), 10000, NULL);
    if (x->st == CERB_OK)
        x->v_was_written = v_names_k(x->name, x->value);
    atomic_store(&x->done, 1);
    return NULL;
}

static bool cand_done(void *ud) { return atomic_load(&((struct cand *)ud)->done) != 0; }

static void test_elected_in_arrival_order(void **state)
{
    (void)state;
    cerb_client *c0 = open_client(NULL), *c1 = open_client(NULL), *c2 = open_client(NULL);
    char *name = test_name("el-order");
    cerb_election *lead = candidate(c0, name, 5000);
    assert_int_equal(cerb_election_campaign(lead, "first", 5, 0, NULL), CERB_OK);
    struct cand w1 = {candidate(c1, name, 5000), name, "second", 0, CERB_OK, false};
    struct cand w2 = {candidate(c2, name, 5000), name, "third", 0, CERB_OK, false};
    pthread_t t1, t2;
    struct qlen q = {name, 1};
    assert_int_equal(pthread_create(&t1, NULL, cand_main, &w1), 0);
    assert_wait_until(queue_has, &q, 5000);
    q.n = 2;
    assert_int_equal(pthread_create(&t2, NULL, cand_main, &w2), 0);
    assert_wait_until(queue_has, &q, 5000);

    assert_int_equal(cerb_election_resign(lead), CERB_OK);
    assert_wait_until(cand_done, &w1, 5000);
    assert_int_equal(w1.st, CERB_OK);
    assert_true(w1.v_was_written);
    assert_false(atomic_load(&w2.done)); /* one leader at a time */
    assert_leads_with(c0, name, w1.e, "second");
    uint64_t f1 = cerb_election_fencing_token(w1.e);
    assert_true(f1 > cerb_election_fencing_token(lead));

    assert_int_equal(cerb_election_resign(w1.e), CERB_OK);
    assert_wait_until(cand_done, &w2, 5000);
    assert_int_equal(w2.st, CERB_OK);
    assert_true(w2.v_was_written);
    assert_true(cerb_election_fencing_token(w2.e) > f1);
    assert_leads_with(c0, name, w2.e, "third");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    cerb_election_free(w2.e);
    cerb_election_free(w1.e);
    cerb_election_free(lead);
    cerb_client_close(c0);
    cerb_client_close(c1);
    cerb_client_close(c2);
    free(name);
}

/* A term granted but not proclaimed yet (handed over, or a holder that
 * never proclaims): V still names the last term; leader() says "value
 * unknown", not the old value. The term behind whose back K changed is
 * lost: proclaim says so and the callback runs once. */
static atomic_int lost_calls;
static void on_lost(cerb_election *e, void *ud)
{
    (void)e;
    (void)ud;
    atomic_fetch_add(&lost_calls, 1);
}
static bool lost_seen(void *ud)
{
    (void)ud;
    return atomic_load(&lost_calls) > 0;
}

static void test_stale_value_never_shown(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL), *obs = open_client(NULL);
    char *name = test_name("el-stale");
    cerb_election *a = candidate(c, name, 5000);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_election_on_lost(a, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_OK);
    /* As a releaser's script hands K to the next waiter's token. */
    static const char other[] = "0123456789abcdef0123456789abcdef";
    raw_cmd("SET %b %b PX 5000", name, other);
    cerb_leader_info li;
    leader(obs, name, &li);
    assert_int_equal(li.has_leader, 1);
    assert_string_equal(li.owner, other);
    assert_int_equal(li.value_known, 0);
    assert_null(li.value);
    cerb_leader_info_clear(&li);

    /* A's proclaim compares K on the server: nothing is written. */
    char *vk = value_key(name), *before = raw_get(vk);
    assert_int_equal(cerb_election_proclaim(a, "va2", 3), CERB_LOST);
    char *after = raw_get(vk);
    assert_string_equal(before, after);
    assert_wait_until(lost_seen, NULL, 3000);
    assert_int_equal(cerb_election_state(a), CERB_LOCK_LOST);
    assert_int_equal(cerb_election_proclaim(a, "va3", 3), CERB_LOST);
    assert_int_equal(cerb_election_resign(a), CERB_LOST);
    cerb_test_let_time_pass(300); /* no second call comes */
    assert_int_equal(atomic_load(&lost_calls), 1);
    char *k = raw_get(name);
    assert_string_equal(k, other); /* the resign left the new owner alone */
    free(k);
    free(before);
    free(after);
    free(vk);
    cerb_election_free(a);
    cerb_client_close(c);
    cerb_client_close(obs);
    free(name);
}

/* The key deleted behind the leader: the watchdog's renewal finds it gone
 * and the lost callback runs once; proclaim then answers CERB_LOST. */
static void test_lost_when_key_deleted(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL);
    char *name = test_name("el-del");
    cerb_election *a = candidate(c, name, 1500);
    atomic_store(&lost_calls, 0);
    assert_int_equal(cerb_election_on_lost(a, on_lost, NULL), CERB_OK);
    assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_OK);
    raw_cmd("DEL %b", name, NULL);
    assert_wait_until(lost_seen, NULL, 3000);
    assert_int_equal(cerb_election_state(a), CERB_LOCK_LOST);
    assert_int_equal(cerb_election_proclaim(a, "vb", 2), CERB_LOST);
    cerb_test_let_time_pass(300);
    assert_int_equal(atomic_load(&lost_calls), 1);
    assert_int_equal(cerb_election_resign(a), CERB_LOST);
    /* A new term of the same candidate. */
    assert_int_equal(cerb_election_campaign(a, "vc", 2, 0, NULL), CERB_OK);
    assert_true(v_names_k(name, "vc"));
    assert_int_equal(cerb_election_resign(a), CERB_OK);
    cerb_election_free(a);
    cerb_client_close(c);
    free(name);
}

static long long raw_pttl(const char *key)
{
    redisContext *r = raw();
    redisReply *rep = redisCommand(r, "PTTL %b", key, strlen(key));
    long long v = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -999;
    freeReplyObject(rep);
    redisFree(r);
    return v;
}

struct vttl {
    const char *vk;
};

static bool v_ttl_long(void *ud)
{
    return raw_pttl(((struct vttl *)ud)->vk) > 3600 * 1000LL;
}

/* A term's renewals keep its value key alive (a day past each renewal),
 * so a term that lasts longer than the day keeps its value: shortened by
 * hand, V's expiry is pushed back by the next renewal. A lock's renewal
 * does not touch V. */
static void test_renewal_keeps_value_key(void **state)
{
    (void)state;
    cerb_client *c = open_client(NULL);
    char *name = test_name("el-vttl");
    char *vk = value_key(name);
    cerb_election *a = candidate(c, name, 900);
    assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_OK);
    long long t = raw_pttl(vk);
    assert_true(t > 3600 * 1000LL && t <= 86400 * 1000LL);
    raw_cmd("PEXPIRE %b %b", vk, "5000");
    assert_true(raw_pttl(vk) <= 5000);
    struct vttl w = {vk};
    assert_wait_until(v_ttl_long, &w, 3000); /* a renewal every ~300 ms */
    assert_true(v_names_k(name, "va"));
    assert_int_equal(cerb_election_resign(a), CERB_OK);

    /* A lock of the same name renews K alone. */
    cerb_lock_opts lo = CERB_LOCK_OPTS_INIT;
    lo.lease_ms = 900;
    lo.renew = 1;
    cerb_lock *l = NULL;
    assert_int_equal(cerb_lock_new(c, name, &lo, &l), CERB_OK);
    assert_int_equal(cerb_lock_lock(l), CERB_OK);
    raw_cmd("PEXPIRE %b %b", vk, "5000");
    cerb_test_let_time_pass(1000); /* three renewals */
    assert_true(raw_pttl(vk) <= 5000);
    assert_int_equal(cerb_lock_unlock(l), CERB_OK);
    cerb_lock_free(l);
    cerb_election_free(a);
    cerb_client_close(c);
    free(vk);
    free(name);
}

/* After a loss of data nobody can say who leads until the quarantine ends:
 * leader() is CERB_UNAVAILABLE, never "nobody". A prefix of its own gives
 * this test a server that has no Cerberus marker yet (as after a restart
 * without persistence): opening makes one, with a quarantine. Deleting it
 * again (a second loss) is noticed by the leader script itself ("L"), which
 * learns the new marker and answers under it. */
static void test_quarantine_is_unknown(void **state)
{
    (void)state;
    char extra[96], prefix[48], mk[64];
    snprintf(prefix, sizeof prefix, "elq%d-%lld:", (int)getpid(), (long long)cerb_test_now_ms());
    snprintf(extra, sizeof extra, "prefix = \"%s\";", prefix);
    snprintf(mk, sizeof mk, "%s\x1f" "cerberus", prefix);
    cerb_client *c = open_client(extra);
    char *name = test_name("el-quar");
    cerb_election *a = candidate(c, name, 1500);
    assert_int_equal(cerb_election_campaign(a, "va", 2, 0, NULL), CERB_BUSY);
    cerb_leader_info li;
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "quarantine"));
    assert_int_equal(li.has_leader, 0);
    cerb_leader_info_clear(&li);
    raw_cmd("DEL %b", mk, NULL);
    assert_int_equal(cerb_election_leader(c, name, 0, &li), CERB_UNAVAILABLE);
    assert_non_null(strstr(cerb_last_error(), "quarantine"));
    cerb_leader_info_clear(&li);
    char *m = raw_get(mk);
    assert_non_null(m); /* learnt again (made by the leader read) */
    free(m);
    cerb_election_free(a);
    cerb_client_close(c);
    raw_cmd("DEL %b", mk, NULL);
    free(name);
}

/* ---- redis-py's Lock, as tooz calls it ---- */

/* Holds the lock (tooz: r.lock(name, timeout, thread_local=False)) until
 * the release file appears (bounded), then releases. */
static const char *PY_HOLD =
    "import os, sys, time, redis\n"
    "port, name, held, release = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]\n"
    "r = redis.Redis(host='127.0.0.1', port=port)\n"
    "l = r.lock(name, timeout=10, thread_local=False)\n"
    "if not l.acquire(blocking=True, blocking_timeout=5): sys.exit(2)\n"
    "open(held, 'w').close()\n"
    "end = time.monotonic() + 10\n"
    "while not os.path.exists(release) and time.monotonic() < end: time.sleep(0.01)\n"
    "l.release()\n"
    "sys.exit(0)\n";

/* Exit 0 when acquire(blocking=False) gives `expect` (1/0); releases after. */
static const char *PY_TRY =
    "import sys, redis\n"
    "port, name, expect = int(sys.argv[1]), sys.argv[2], sys.argv[3] == '1'\n"
    "r = redis.Redis(host='127.0.0.1', port=port)\n"
    "l = r.lock(name, timeout=10, thread_local=False)\n"
    "got = l.acquire(blocking=False)\n"
    "if got: l.release()\n"
    "sys.exit(0 if got == expect else 1)\n";

static int py_available(void)
{
    char *argv[] = {(char *)cerb_test_python(), "-c", "import redis", NULL};
    return cerb_test_run(argv, 20000) == 0;
}

static bool file_exists(void *ud)
{
    struct stat st;
    return stat(ud, &st) == 0;
}

static void test_redispy_holder_blocks_campaign(void **state)
{
    (void)state;
    if (!py_available())
        fail_msg("python3-redis is required (scripts/test.sh installs it)");
    char *name = test_name("el-py-holds");
    char held[64], release[64], port[16];
    snprintf(held, sizeof held, "/tmp/cerb-elpy-held-%d", (int)getpid());
    snprintf(release, sizeof release, "/tmp/cerb-elpy-release-%d", (int)getpid());
    snprintf(port, sizeof port, "%d", cerb_test_redis_port());
    unlink(held);
    unlink(release);
    char *argv[] = {(char *)cerb_test_python(), "-c", (char *)PY_HOLD, port, name, held, release,
                    NULL};
    pid_t py = cerb_test_spawn(argv);
    assert_true(py > 0);
    assert_wait_until(file_exists, held, 10000);

    cerb_client *c = open_client(NULL);
    cerb_election *e = candidate(c, name, 5000);
    assert_int_equal(cerb_election_campaign(e, "ours", 4, 0, NULL), CERB_BUSY);
    cerb_leader_info li;
    leader(c, name, &li);
    assert_int_equal(li.has_leader, 1);
    assert_int_equal(li.value_known, 0); /* redis-py proclaims nothing */
    char *k = raw_get(name);
    assert_non_null(k);
    assert_string_equal(li.owner, k);
    assert_true(li.ttl_ms > 0 && li.ttl_ms <= 10000);
    free(k);
    cerb_leader_info_clear(&li);
    /* redis-py releases without notifying; the waiting candidate is
     * elected by its bounded re-check. */
    FILE *f = fopen(release, "w");
    fclose(f);
    assert_int_equal(cerb_election_campaign(e, "ours", 4, 5000, NULL), CERB_OK);
    assert_int_equal(cerb_test_wait(py, 10000), 0);
    assert_true(v_names_k(name, "ours"));
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    cerb_election_free(e);
    cerb_client_close(c);
    unlink(held);
    unlink(release);
    free(name);
}

static void redispy_blocked_on(const char *name)
{
    char port[16];
    snprintf(port, sizeof port, "%d", cerb_test_redis_port());
    cerb_client *c = open_client(NULL);
    cerb_election *e = candidate(c, name, 5000);
    assert_int_equal(cerb_election_campaign(e, "node-1", 6, 0, NULL), CERB_OK);
    char *argv0[] = {(char *)cerb_test_python(), "-c", (char *)PY_TRY, port, (char *)name, "0",
                     NULL};
    assert_int_equal(cerb_test_run(argv0, 20000), 0);
    char *k = raw_get(name);
    assert_true(is_token(k)); /* a token, not "node-1" */
    free(k);
    assert_true(v_names_k(name, "node-1"));
    assert_int_equal(cerb_election_resign(e), CERB_OK);
    char *argv1[] = {(char *)cerb_test_python(), "-c", (char *)PY_TRY, port, (char *)name, "1",
                     NULL};
    assert_int_equal(cerb_test_run(argv1, 20000), 0);
    cerb_election_free(e);
    cerb_client_close(c);
}

static void test_redispy_blocked_while_we_lead(void **state)
{
    (void)state;
    if (!py_available())
        fail_msg("python3-redis is required (scripts/test.sh installs it)");
    char *name = test_name("el-py-waits");
    redispy_blocked_on(name);
    /* tooz's key for a group's leader lock is a valid election name. */
    char tooz[160];
    snprintf(tooz, sizeof tooz, "b'_tooz'_b'leader_of_%s'_lock", name);
    redispy_blocked_on(tooz);
    free(name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_campaign_proclaim_resign),
        cmocka_unit_test(test_handoff_pairs_term_and_value),
        cmocka_unit_test(test_elected_in_arrival_order),
        cmocka_unit_test(test_stale_value_never_shown),
        cmocka_unit_test(test_lost_when_key_deleted),
        cmocka_unit_test(test_renewal_keeps_value_key),
        cmocka_unit_test(test_quarantine_is_unknown),
        cmocka_unit_test(test_redispy_holder_blocks_campaign),
        cmocka_unit_test(test_redispy_blocked_while_we_lead),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
