/*
 * test_serve_dapr.c — the Dapr-compatible façade of `cerberus serve`
 * (serve/serve_dapr.c, docs/dapr.md) in-process, spoken to with libcurl as a
 * Dapr SDK in HTTP mode speaks to daprd.
 *
 * With the built-in "local" engine (no server): lock A → success:true, lock
 * B → false, lock A again → false (not reentrant), unlock B → 2, unlock A →
 * 0, again → 1; daprd's validation and error bodies, in daprd's order
 * (malformed JSON or a field of the wrong type 400 ERR_MALFORMED_REQUEST,
 * expiry ≤ 0 400 ERR_EXPIRY_NOT_POSITIVE, empty resource 400
 * ERR_RESOURCE_ID_EMPTY, empty owner 400 ERR_OWNER_EMPTY, another store 404
 * ERR_LOCK_NOT_FOUND, "||" in the resource 500 ERR_TRY_LOCK / ERR_UNLOCK),
 * each with nothing held after it; the expiry frees the name when it
 * passes, not before, and the owner's unlock is then 1; a name held by a
 * native /v1 hold is another owner's (lock false, unlock 2); concurrent lock
 * calls for one resource give exactly one success; --dapr-app-id's
 * `lock||ID||R` names and --dapr-store's store; /v1.0/metadata,
 * /v1.0/healthz[/outbound] 204; a hold the library lost is unlock 1 and the
 * name can be locked again at once; over TCP `dapr-api-token` is accepted
 * on the Dapr routes (only there), a wrong one is 401. With the "fault"
 * engine (tests/support/fault_engine.c, which cannot be inspected): an
 * engine failure is 500 ERR_TRY_LOCK / ERR_UNLOCK, and an unlock where this
 * server holds nothing asks the engine by a try that keeps nothing.
 *
 * With CERB_DAPR_REDIS=1 (ctest's integration_serve_dapr_redis, on the
 * shared redis fixture) only the interop case runs: with --dapr-app-id and
 * redis.prefix "", a raw `SET lock||app||R owner NX EX 30` (what a Dapr
 * sidecar's Redis lock store sends) makes the façade answer success:false
 * and unlock 2, and a façade lock makes that SET NX fail.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#include "cerberus.h"
#include "fault_engine.h"
#include "serve.h"
#include "serve_http.h"
#include "test_util.h"

#define TOKEN "dapr-test-token-0123456789"

struct fixture {
    char dir[64];
    char sock[128];
    cerb_client *client;
    struct cerb__serve *serve;
    unsigned port; /* TCP, when the case listens there */
};

/* One request, on the unix socket (@port 0) or on TCP 127.0.0.1:@port
 * with the header @header (NULL: none); no cmocka asserts (threads). */
static CURLcode try_request(struct fixture *f, unsigned port, const char *header,
                            const char *method, const char *path, const char *body,
                            struct serve_http_reply *r)
{
    return serve_http_try(f->sock, port, header, method, path, body, false, r);
}

static struct serve_http_reply request(struct fixture *f, const char *method, const char *path,
                            const char *body)
{
    struct serve_http_reply r;
    CURLcode rc = try_request(f, 0, NULL, method, path, body, &r);

    if (rc != CURLE_OK)
        fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    return r;
}

/* POST /v1.0-alpha1/lock/@store; the reply's "success" (fails on any other
 * answer). */
static bool dapr_lock(struct fixture *f, const char *store, const char *resource,
                      const char *owner, int expiry)
{
    char path[256], body[512];
    struct serve_http_reply r;
    json_t *v;
    bool ok;

    snprintf(path, sizeof path, "/v1.0-alpha1/lock/%s", store);
    snprintf(body, sizeof body,
             "{\"resourceId\": \"%s\", \"lockOwner\": \"%s\", \"expiryInSeconds\": %d}",
             resource, owner, expiry);
    r = request(f, "POST", path, body);
    if (r.code != 200)
        fail_msg("lock %s %s: HTTP %ld", resource, owner, r.code);
    v = json_object_get(r.body, "success");
    if (!json_is_boolean(v))
        fail_msg("lock %s %s: no boolean success", resource, owner);
    ok = json_is_true(v);
    assert_int_equal(json_object_size(r.body), 1);
    json_decref(r.body);
    return ok;
}

/* POST /v1.0-alpha1/unlock/@store; the reply's "status". */
static int dapr_unlock(struct fixture *f, const char *store, const char *resource,
                       const char *owner)
{
    char path[256], body[512];
    struct serve_http_reply r;
    json_t *v;
    int st;

    snprintf(path, sizeof path, "/v1.0-alpha1/unlock/%s", store);
    snprintf(body, sizeof body, "{\"resourceId\": \"%s\", \"lockOwner\": \"%s\"}", resource,
             owner);
    r = request(f, "POST", path, body);
    if (r.code != 200)
        fail_msg("unlock %s %s: HTTP %ld", resource, owner, r.code);
    v = json_object_get(r.body, "status");
    if (!json_is_integer(v))
        fail_msg("unlock %s %s: no integer status", resource, owner);
    st = (int)json_integer_value(v);
    json_decref(r.body);
    return st;
}

/* A request answered with daprd's error body: HTTP @code, @error_code. */
static void assert_dapr_error(struct fixture *f, const char *path, const char *body,
                              long code, const char *error_code)
{
    struct serve_http_reply r = request(f, "POST", path, body);

    if (r.code != code)
        fail_msg("%s %s: HTTP %ld, not %ld", path, body, r.code, code);
    assert_non_null(r.body);
    assert_string_equal(json_string_value(json_object_get(r.body, "errorCode")), error_code);
    assert_non_null(json_string_value(json_object_get(r.body, "message")));
    assert_int_equal(json_object_size(r.body), 2);
    json_decref(r.body);
}

static int open_fixture(void **state, const char *config)
{
    struct fixture *f = calloc(1, sizeof *f);
    char err[256];

    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/cerb-dapr-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->sock, sizeof f->sock, "%s/serve.sock", f->dir);
    if (cerb_client_open_string(&f->client, config) != CERB_OK)
        fail_msg("open: %s", cerb_last_error());
    if (cerb__serve_start(f->client, f->sock, &f->serve, err, sizeof err) != CERB_OK)
        fail_msg("cerb__serve_start: %s", err);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return open_fixture(state, "engines = (\"local\");\n");
}

/* A client that does not renew leases: a hold is lost at its lease's end. */
static int setup_no_renew(void **state)
{
    return open_fixture(state, "engines = (\"local\");\n"
                               "lock = { renew = false; lease_ms = 300; };\n");
}

static int setup_fault(void **state)
{
    fault_engine_register();
    fault_engine_reset();
    return open_fixture(state, "engines = (\"fault\");\n");
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    cerb__serve_stop(f->serve);
    cerb_client_close(f->client);
    fault_engine_reset();
    rmdir(f->dir);
    free(f);
    return 0;
}

/* How many hold the name, as cerb_lock_inspect sees it. */
static size_t holders(struct fixture *f, const char *name)
{
    cerb_holder_info *v = NULL;
    size_t n = 0, held = 0;

    assert_int_equal(cerb_lock_inspect(f->client, name, NULL, &v, &n), CERB_OK);
    for (size_t i = 0; i < n; i++)
        held += !v[i].waiting;
    cerb_holders_free(v, n);
    return held;
}

/* The SDK's sequence (reach.md §2.3) and the not-reentrant rule. */
static void test_lock_unlock(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-basic");

    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 1); /* nobody */
    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 30));
    assert_int_equal(holders(f, res), 1); /* the name is the resource id */
    assert_false(dapr_lock(f, "cerberus", res, "owner-B", 30));
    assert_false(dapr_lock(f, "cerberus", res, "owner-A", 30)); /* not reentrant */
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-B"), 2);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 0);
    assert_int_equal(holders(f, res), 0);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 1);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-B"), 1);
    /* Free again: B gets it, and A is now the other owner. */
    assert_true(dapr_lock(f, "cerberus", res, "owner-B", 30));
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 2);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-B"), 0);
    free(res);
}

/* daprd's checks, codes and order; nothing is held after any of them. */
static void test_validation(void **state)
{
    struct fixture *f = *state;
    const char *L = "/v1.0-alpha1/lock/cerberus", *U = "/v1.0-alpha1/unlock/cerberus";
    char body[512];

    assert_dapr_error(f, L, "{\"resourceId\": ", 400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, L, "[1, 2]", 400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, L, "", 400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, U, "nope", 400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, L,
                      "{\"resourceId\": 7, \"lockOwner\": \"o\", \"expiryInSeconds\": 5}",
                      400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, L,
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\", \"expiryInSeconds\": 1.5}",
                      400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, L,
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\", \"expiryInSeconds\": "
                      "2147483648}",
                      400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, L,
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\", \"expiryInSeconds\": "
                      "\"x\"}",
                      400, "ERR_MALFORMED_REQUEST");
    assert_dapr_error(f, U, "{\"resourceId\": \"v\", \"lockOwner\": false}", 400,
                      "ERR_MALFORMED_REQUEST");
    /* The expiry is checked first, then the resource, then the owner. */
    assert_dapr_error(f, L, "{\"resourceId\": \"\", \"lockOwner\": \"\", \"expiryInSeconds\": 0}",
                      400, "ERR_EXPIRY_NOT_POSITIVE");
    assert_dapr_error(f, L, "{\"resourceId\": \"v\", \"lockOwner\": \"o\"}", 400,
                      "ERR_EXPIRY_NOT_POSITIVE");
    assert_dapr_error(f, L,
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\", \"expiryInSeconds\": -3}",
                      400, "ERR_EXPIRY_NOT_POSITIVE");
    assert_dapr_error(f, L, "{\"resourceId\": \"\", \"lockOwner\": \"\", \"expiryInSeconds\": 5}",
                      400, "ERR_RESOURCE_ID_EMPTY");
    assert_dapr_error(f, L, "{\"lockOwner\": \"o\", \"expiryInSeconds\": 5}", 400,
                      "ERR_RESOURCE_ID_EMPTY");
    assert_dapr_error(f, L, "{\"resourceId\": \"v\", \"expiryInSeconds\": 5}", 400,
                      "ERR_OWNER_EMPTY");
    assert_dapr_error(f, U, "{\"resourceId\": \"\", \"lockOwner\": \"o\"}", 400,
                      "ERR_RESOURCE_ID_EMPTY");
    assert_dapr_error(f, U, "{\"resourceId\": \"v\", \"lockOwner\": \"\"}", 400,
                      "ERR_OWNER_EMPTY");
    /* Checked before the store, as daprd does. */
    assert_dapr_error(f, "/v1.0-alpha1/lock/other",
                      "{\"resourceId\": \"v\", \"lockOwner\": \"\", \"expiryInSeconds\": 5}",
                      400, "ERR_OWNER_EMPTY");
    assert_dapr_error(f, "/v1.0-alpha1/lock/other",
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\", \"expiryInSeconds\": 5}",
                      404, "ERR_LOCK_NOT_FOUND");
    assert_dapr_error(f, "/v1.0-alpha1/unlock/other",
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\"}", 404,
                      "ERR_LOCK_NOT_FOUND");
    /* daprd's key separator: refused as its GetModifiedLockKey does. */
    assert_dapr_error(f, L,
                      "{\"resourceId\": \"a||b\", \"lockOwner\": \"o\", \"expiryInSeconds\": 5}",
                      500, "ERR_TRY_LOCK");
    assert_dapr_error(f, U, "{\"resourceId\": \"a||b\", \"lockOwner\": \"o\"}", 500,
                      "ERR_UNLOCK");
    assert_int_equal(holders(f, "a||b"), 0);
    /* A name the library refuses (a control character, too long). */
    assert_dapr_error(f, L,
                      "{\"resourceId\": \"a\\u0001b\", \"lockOwner\": \"o\", "
                      "\"expiryInSeconds\": 5}",
                      400, "ERR_TRY_LOCK");
    {
        char longres[300];
        memset(longres, 'r', sizeof longres - 1);
        longres[sizeof longres - 1] = '\0';
        snprintf(body, sizeof body,
                 "{\"resourceId\": \"%s\", \"lockOwner\": \"o\", \"expiryInSeconds\": 5}",
                 longres);
        assert_dapr_error(f, L, body, 400, "ERR_TRY_LOCK");
    }
    /* Nothing of that was held: the names are free for anyone. */
    assert_int_equal(holders(f, "v"), 0);
    assert_true(dapr_lock(f, "cerberus", "v", "someone", 5));
    assert_int_equal(dapr_unlock(f, "cerberus", "v", "someone"), 0);
    /* The proto's field names, and an int32 as a string, as protojson takes. */
    {
        struct serve_http_reply r = request(f, "POST", L,
                                 "{\"resource_id\": \"v\", \"lock_owner\": \"o\", "
                                 "\"expiry_in_seconds\": \"5\"}");
        assert_int_equal(r.code, 200);
        assert_true(json_is_true(json_object_get(r.body, "success")));
        json_decref(r.body);
        assert_int_equal(dapr_unlock(f, "cerberus", "v", "o"), 0);
    }
}

struct expiry_probe {
    struct fixture *f;
    const char *res;
};

static bool b_gets_it(void *ud)
{
    struct expiry_probe *p = ud;
    return dapr_lock(p->f, "cerberus", p->res, "owner-B", 30);
}

/* The hold ends when expiryInSeconds passed, not before. */
static void test_expiry(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-expiry");
    struct expiry_probe p = {f, res};
    int64_t t0 = cerb_test_now_ms(), t1;

    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 1));
    assert_false(dapr_lock(f, "cerberus", res, "owner-B", 30));
    assert_wait_until(b_gets_it, &p, 5000);
    t1 = cerb_test_now_ms();
    assert_true(t1 - t0 >= 950);
    assert_true(t1 - t0 < 3000);
    /* A's hold expired and B holds the name now: A's unlock is 2. */
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 2);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-B"), 0);
    /* And alone: an expired hold's unlock is 1. */
    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 1));
    {
        struct expiry_probe q = {f, res};
        assert_wait_until(b_gets_it, &q, 5000);
    }
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-B"), 0);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 1);
    free(res);
}

/* A name held through the native API (or by another process, or a Dapr
 * sidecar) is another owner's. */
static void test_held_elsewhere(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-native");
    char path[256], del[128];
    struct serve_http_reply r;

    snprintf(path, sizeof path, "/v1/locks/%s/acquire", res);
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 200);
    snprintf(del, sizeof del, "/v1/holds/%s",
             json_string_value(json_object_get(r.body, "hold")));
    json_decref(r.body);
    assert_false(dapr_lock(f, "cerberus", res, "owner-A", 30));
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 2);
    assert_int_equal(holders(f, res), 1); /* the unlock took nothing */
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 1);
    /* Dapr's hold is busy for the native API. */
    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 30));
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 409);
    json_decref(r.body);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 0);
    free(res);
}

#define RACERS 8
#define ROUNDS 5

struct racer {
    struct fixture *f;
    const char *res;
    char owner[32];
    pthread_barrier_t *go;
    atomic_int *wins;
    atomic_int *errors;
};

static void *race(void *ud)
{
    struct racer *r = ud;
    char body[256];
    struct serve_http_reply rep;

    snprintf(body, sizeof body,
             "{\"resourceId\": \"%s\", \"lockOwner\": \"%s\", \"expiryInSeconds\": 30}",
             r->res, r->owner);
    pthread_barrier_wait(r->go);
    if (try_request(r->f, 0, NULL, "POST", "/v1.0-alpha1/lock/cerberus", body, &rep) !=
            CURLE_OK ||
        rep.code != 200 || !json_is_boolean(json_object_get(rep.body, "success")))
        atomic_fetch_add(r->errors, 1);
    else if (json_is_true(json_object_get(rep.body, "success")))
        atomic_fetch_add(r->wins, 1);
    json_decref(rep.body);
    return NULL;
}

/* RACERS lock calls at once for one resource, with one owner or with
 * several: exactly one succeeds, and that owner can unlock. */
static void test_concurrent_lock(void **state)
{
    struct fixture *f = *state;

    for (int round = 0; round < ROUNDS; round++) {
        bool same_owner = round % 2 == 0;
        char *res = test_name("dapr-race");
        pthread_barrier_t go;
        pthread_t th[RACERS];
        struct racer rs[RACERS];
        atomic_int wins = 0, errors = 0;
        int released = 0;

        assert_int_equal(pthread_barrier_init(&go, NULL, RACERS), 0);
        for (int i = 0; i < RACERS; i++) {
            rs[i] = (struct racer){f, res, "", &go, &wins, &errors};
            snprintf(rs[i].owner, sizeof rs[i].owner, "owner-%d", same_owner ? 0 : i);
            assert_int_equal(pthread_create(&th[i], NULL, race, &rs[i]), 0);
        }
        for (int i = 0; i < RACERS; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&go);
        assert_int_equal(atomic_load(&errors), 0);
        assert_int_equal(atomic_load(&wins), 1);
        /* Exactly one owner's unlock releases it: the others are 2 before
         * it, 1 after. */
        for (int i = 0; i < (same_owner ? 1 : RACERS); i++) {
            int st = dapr_unlock(f, "cerberus", res, rs[i].owner);
            if (released)
                assert_int_equal(st, 1);
            else
                assert_true(st == 0 || st == 2);
            released += st == 0;
        }
        assert_int_equal(released, 1);
        assert_int_equal(holders(f, res), 0);
        free(res);
    }
}

/* --dapr-app-id and --dapr-store. */
static void test_app_id_and_store(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-app");
    char name[256], err[256];

    assert_int_equal(cerb__serve_set_dapr(f->serve, "", NULL, err, sizeof err), CERB_EINVAL);
    assert_int_equal(cerb__serve_set_dapr(f->serve, "a/b", NULL, err, sizeof err),
                     CERB_EINVAL);
    assert_int_equal(cerb__serve_set_dapr(f->serve, "s", "x||y", err, sizeof err),
                     CERB_EINVAL);
    assert_int_equal(cerb__serve_set_dapr(f->serve, "s", "", err, sizeof err), CERB_EINVAL);
    assert_int_equal(cerb__serve_set_dapr(f->serve, "lockstore", "myapp", err, sizeof err),
                     CERB_OK);
    snprintf(name, sizeof name, "lock||myapp||%s", res);
    assert_true(dapr_lock(f, "lockstore", res, "owner-A", 30));
    assert_int_equal(holders(f, name), 1);
    assert_int_equal(holders(f, res), 0);
    /* The default store is no longer served. */
    assert_dapr_error(f, "/v1.0-alpha1/lock/cerberus",
                      "{\"resourceId\": \"v\", \"lockOwner\": \"o\", \"expiryInSeconds\": 5}",
                      404, "ERR_LOCK_NOT_FOUND");
    assert_int_equal(dapr_unlock(f, "lockstore", res, "owner-B"), 2);
    assert_int_equal(dapr_unlock(f, "lockstore", res, "owner-A"), 0);
    assert_int_equal(holders(f, name), 0);
    {
        struct serve_http_reply r = request(f, "GET", "/v1.0/metadata", NULL);
        json_t *comp;
        assert_int_equal(r.code, 200);
        assert_string_equal(json_string_value(json_object_get(r.body, "id")), "myapp");
        comp = json_array_get(json_object_get(r.body, "components"), 0);
        assert_string_equal(json_string_value(json_object_get(comp, "name")), "lockstore");
        json_decref(r.body);
    }
    free(res);
}

static void test_metadata_healthz(void **state)
{
    struct fixture *f = *state;
    struct serve_http_reply r = request(f, "GET", "/v1.0/metadata", NULL);
    json_t *comp;

    assert_int_equal(r.code, 200);
    assert_non_null(r.body);
    assert_string_equal(json_string_value(json_object_get(r.body, "id")), "cerberus");
    comp = json_array_get(json_object_get(r.body, "components"), 0);
    assert_string_equal(json_string_value(json_object_get(comp, "name")), "cerberus");
    assert_string_equal(json_string_value(json_object_get(comp, "type")), "lock.cerberus");
    json_decref(r.body);
    r = request(f, "GET", "/v1.0/healthz", NULL);
    assert_int_equal(r.code, 204);
    assert_null(r.body);
    r = request(f, "GET", "/v1.0/healthz/outbound", NULL);
    assert_int_equal(r.code, 204);
    /* Only the lock API is served; a GET of a lock route is not it. */
    r = request(f, "GET", "/v1.0/state/x", NULL);
    assert_int_equal(r.code, 404);
    assert_string_equal(json_string_value(json_object_get(r.body, "errorCode")),
                        "ERR_NOT_FOUND");
    json_decref(r.body);
    r = request(f, "GET", "/v1.0-alpha1/lock/cerberus", NULL);
    assert_int_equal(r.code, 404);
    json_decref(r.body);
}

struct lost_probe {
    struct fixture *f;
    const char *name;
};

static bool hold_gone(void *ud)
{
    struct lost_probe *p = ud;
    return holders(p->f, p->name) == 0;
}

/* A hold the library lost (no renewal here, so at its lease's end): its
 * owner's unlock is 1, and the name is granted again at once. */
static void test_lost_hold(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-lost");
    struct lost_probe p = {f, res};

    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 60));
    assert_wait_until(hold_gone, &p, 5000); /* the lease (300 ms) ran out */
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 1);
    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 60));
    assert_wait_until(hold_gone, &p, 5000);
    /* Another owner locks at once, not after the 60 s window. */
    assert_true(dapr_lock(f, "cerberus", res, "owner-B", 60));
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 2);
    free(res);
}

/* Over TCP, Dapr's routes take `dapr-api-token` as well as the bearer
 * token; the native routes only the bearer token. */
static void test_tcp_dapr_token(void **state)
{
    struct fixture *f = *state;
    char err[256], *res = test_name("dapr-tcp");
    char body[256];
    struct serve_http_reply r;

    assert_int_equal(cerb__serve_listen_tcp(f->serve, "127.0.0.1:0", TOKEN, &f->port, err,
                                            sizeof err),
                     CERB_OK);
    snprintf(body, sizeof body,
             "{\"resourceId\": \"%s\", \"lockOwner\": \"o\", \"expiryInSeconds\": 30}", res);
    assert_int_equal(try_request(f, f->port, NULL, "POST", "/v1.0-alpha1/lock/cerberus",
                                 body, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 401);
    json_decref(r.body);
    assert_int_equal(try_request(f, f->port, "dapr-api-token: " TOKEN "x", "POST",
                                 "/v1.0-alpha1/lock/cerberus", body, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 401);
    json_decref(r.body);
    assert_int_equal(try_request(f, f->port, "dapr-api-token: dapr-test-token", "GET",
                                 "/v1.0/metadata", NULL, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 401);
    json_decref(r.body);
    assert_int_equal(holders(f, res), 0);
    assert_int_equal(try_request(f, f->port, "dapr-api-token: " TOKEN, "POST",
                                 "/v1.0-alpha1/lock/cerberus", body, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 200);
    assert_true(json_is_true(json_object_get(r.body, "success")));
    json_decref(r.body);
    assert_int_equal(try_request(f, f->port, "dapr-api-token: " TOKEN, "GET",
                                 "/v1.0/healthz", NULL, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 204);
    /* The bearer token works on Dapr's routes too. */
    snprintf(body, sizeof body, "{\"resourceId\": \"%s\", \"lockOwner\": \"o\"}", res);
    assert_int_equal(try_request(f, f->port, "Authorization: Bearer " TOKEN, "POST",
                                 "/v1.0-alpha1/unlock/cerberus", body, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 200);
    assert_int_equal(json_integer_value(json_object_get(r.body, "status")), 0);
    json_decref(r.body);
    /* dapr-api-token is not a key to the native API. */
    assert_int_equal(try_request(f, f->port, "dapr-api-token: " TOKEN, "GET", "/healthz",
                                 NULL, &r),
                     CURLE_OK);
    assert_int_equal(r.code, 401);
    json_decref(r.body);
    free(res);
}

/* An engine failure: 500 ERR_TRY_LOCK on lock, 500 ERR_UNLOCK on unlock. */
static void test_engine_failure(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-fail");
    char body[256];

    snprintf(body, sizeof body,
             "{\"resourceId\": \"%s\", \"lockOwner\": \"o\", \"expiryInSeconds\": 30}", res);
    fault_engine_set(FAULT_ACQUIRE, 1, true, FAULT_BEFORE);
    assert_dapr_error(f, "/v1.0-alpha1/lock/cerberus", body, 500, "ERR_TRY_LOCK");
    fault_engine_reset();
    assert_true(dapr_lock(f, "cerberus", res, "o", 30));
    fault_engine_set(FAULT_RELEASE, 1, true, FAULT_BEFORE);
    snprintf(body, sizeof body, "{\"resourceId\": \"%s\", \"lockOwner\": \"o\"}", res);
    assert_dapr_error(f, "/v1.0-alpha1/unlock/cerberus", body, 500, "ERR_UNLOCK");
    fault_engine_reset();
    free(res);
}

/* An engine that cannot be inspected: an unlock where this server holds
 * nothing asks by a try, which keeps nothing. */
static void test_uninspectable_engine(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-noinspect");
    char path[256], del[128];
    struct serve_http_reply r;

    /* Free: 1, and the probe's grant was released at once. */
    assert_int_equal(dapr_unlock(f, "cerberus", res, "o"), 1);
    assert_true(dapr_lock(f, "cerberus", res, "o", 30));
    assert_int_equal(dapr_unlock(f, "cerberus", res, "o"), 0);
    /* Held by a native hold: 2, and the hold is untouched. */
    snprintf(path, sizeof path, "/v1/locks/%s/acquire", res);
    r = request(f, "POST", path, "{\"wait_ms\": 0}");
    assert_int_equal(r.code, 200);
    snprintf(del, sizeof del, "/v1/holds/%s",
             json_string_value(json_object_get(r.body, "hold")));
    json_decref(r.body);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "o"), 2);
    r = request(f, "DELETE", del, NULL);
    assert_int_equal(r.code, 200);
    json_decref(r.body);
    /* A failing probe: 500 ERR_UNLOCK, not a guess. */
    {
        char body[256];
        snprintf(body, sizeof body, "{\"resourceId\": \"%s\", \"lockOwner\": \"o\"}", res);
        fault_engine_set(FAULT_ACQUIRE, 1, true, FAULT_BEFORE);
        assert_dapr_error(f, "/v1.0-alpha1/unlock/cerberus", body, 500, "ERR_UNLOCK");
        fault_engine_reset();
    }
    free(res);
}

/* ---- interop with a Dapr sidecar's Redis lock store (redis fixture) ---- */

static int setup_redis(void **state)
{
    char *text = cerb_test_redis_config("prefix = \"\";", NULL), cfg[512], err[256];
    struct fixture *f;
    int rc;

    assert_non_null(text);
    snprintf(cfg, sizeof cfg, "%s", text);
    free(text); /* before open_fixture, which may fail the case */
    rc = open_fixture(state, cfg);
    f = *state;
    assert_int_equal(cerb__serve_set_dapr(f->serve, "cerberus", "interop-app", err, sizeof err),
                     CERB_OK);
    return rc;
}

static void test_redis_interop(void **state)
{
    struct fixture *f = *state;
    char *res = test_name("dapr-redis");
    char key[256];
    redisContext *rc = redisConnect("127.0.0.1", cerb_test_redis_port());
    redisReply *rep;

    assert_non_null(rc);
    assert_int_equal(rc->err, 0);
    snprintf(key, sizeof key, "lock||interop-app||%s", res);
    /* A sidecar holds it (standalone.go's TryLock): the façade is refused. */
    rep = redisCommand(rc, "SET %s %s NX EX 30", key, "sidecar-owner");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STATUS); /* OK */
    freeReplyObject(rep);
    assert_false(dapr_lock(f, "cerberus", res, "owner-A", 30));
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 2);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "sidecar-owner"), 2);
    /* The sidecar's key is untouched; it unlocks (DEL), then the façade
     * locks, and the sidecar's SET NX fails. */
    rep = redisCommand(rc, "GET %s", key);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "sidecar-owner");
    freeReplyObject(rep);
    freeReplyObject(redisCommand(rc, "DEL %s", key));
    assert_true(dapr_lock(f, "cerberus", res, "owner-A", 30));
    rep = redisCommand(rc, "SET %s %s NX EX 30", key, "sidecar-owner");
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);
    assert_int_equal(dapr_unlock(f, "cerberus", res, "owner-A"), 0);
    /* Released: the sidecar gets it now. */
    rep = redisCommand(rc, "SET %s %s NX EX 30", key, "sidecar-owner");
    assert_int_equal(rep->type, REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    freeReplyObject(redisCommand(rc, "DEL %s", key));
    redisFree(rc);
    free(res);
}

int main(void)
{
    const struct CMUnitTest local[] = {
        cmocka_unit_test_setup_teardown(test_lock_unlock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expiry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_elsewhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_app_id_and_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metadata_healthz, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_hold, setup_no_renew, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_dapr_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_failure, setup_fault, teardown),
        cmocka_unit_test_setup_teardown(test_uninspectable_engine, setup_fault, teardown),
    };
    const struct CMUnitTest redis[] = {
        cmocka_unit_test_setup_teardown(test_redis_interop, setup_redis, teardown),
    };
    const char *r = getenv("CERB_DAPR_REDIS");
    int rc;

    cerb_test_debug_aids();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (r && strcmp(r, "1") == 0)
        rc = cmocka_run_group_tests_name("serve_dapr_redis", redis, NULL, NULL);
    else
        rc = cmocka_run_group_tests_name("serve_dapr", local, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
