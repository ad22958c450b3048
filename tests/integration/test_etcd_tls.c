/*
 * test_etcd_tls.c — the etcd engine over https with client certificates,
 * against a private etcd this suite starts (scripts/servers.sh with
 * CERB_ETCD_TLS_DIR: a throwaway CA, a server certificate for 127.0.0.1
 * and a client certificate, made by openssl) on $CERB_ETCD_PORT + 60 and
 * stops by PID:
 *  - with etcd.ca_file, cert_file and key_file two clients exclude each
 *    other and fences increase, as over http;
 *  - a server certificate from another CA, a missing client certificate,
 *    and plain http to the https port each fail with a clear error within
 *    the configured timeouts (never a hang, never a grant);
 *  - a TLS file that does not exist is named in the error when the client
 *    opens.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "etcd_util.h"
#include "test_util.h"
#include "zk_util.h"

static int tls_port;
static char *tls_dir;

/* The TLS keys of the etcd block; NULL leaves a file out. */
static char *tls_cfg(const char *scheme, const char *ca, const char *cert, const char *key)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf,
                     "engines = (\"etcd\");\n"
                     "etcd = { endpoints = (\"%s://127.0.0.1:%d\");\n"
                     "  connect_timeout_ms = 500; op_timeout_ms = 1000;\n",
                     scheme, tls_port);
    if (ca)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "  ca_file = \"%s/%s\";\n", tls_dir, ca);
    if (cert)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "  cert_file = \"%s/%s\";\n", tls_dir, cert);
    if (key)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "  key_file = \"%s/%s\";\n", tls_dir, key);
    snprintf(buf + n, sizeof buf - (size_t)n, "};\n");
    char *s = strdup(buf);
    assert_non_null(s);
    return s;
}

static int group_setup(void **state)
{
    (void)state;
    tls_port = etcd_test_port() + 60;
    char tmpl[] = "/tmp/cerberus-etcd-tls.XXXXXX";
    if (!mkdtemp(tmpl))
        return -1;
    tls_dir = strdup(tmpl);
    setenv("CERB_ETCD_TLS_DIR", tls_dir, 1);
    int rc = etcd_test_servers("start", tls_port, 1);
    unsetenv("CERB_ETCD_TLS_DIR");
    return rc == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    setenv("CERB_ETCD_TLS_DIR", tls_dir, 1);
    etcd_test_servers("stop", tls_port, 1);
    unsetenv("CERB_ETCD_TLS_DIR");
    cerb_test_remove_tree(tls_dir);
    tls_dir = NULL;
    return 0;
}

static cerb_client *open_ok(const char *cfg)
{
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st != CERB_OK)
        fail_msg("open: %s: %s", cerb_status_name(st), cerb_last_error());
    return c;
}

static cerb_lock *mk(cerb_client *c, const char *name)
{
    cerb_lock *l = NULL;
    if (cerb_lock_new(c, name, NULL, &l) != CERB_OK)
        fail_msg("lock_new: %s", cerb_last_error());
    return l;
}

static void test_mutual_tls_locks(void **state)
{
    (void)state;
    char *cfg = tls_cfg("https", "ca.crt", "client.crt", "client.key");
    cerb_client *a = open_ok(cfg), *b = open_ok(cfg);
    char *name = test_name("tls");
    cerb_lock *la = mk(a, name), *lb = mk(b, name);

    assert_int_equal(cerb_lock_trylock(la), CERB_OK);
    uint64_t f1 = cerb_lock_fencing_token(la);
    assert_int_equal(cerb_lock_trylock(lb), CERB_BUSY);
    assert_int_equal(cerb_lock_unlock(la), CERB_OK);
    assert_int_equal(cerb_lock_trylock_for(lb, 2000), CERB_OK);
    assert_true(cerb_lock_fencing_token(lb) > f1);
    assert_int_equal(cerb_lock_unlock(lb), CERB_OK);

    cerb_lock_free(la);
    cerb_lock_free(lb);
    cerb_client_close(a);
    cerb_client_close(b);
    free(name);
    free(cfg);
}

/*
 * A configuration the server refuses: the open's probe fails (CERB_UNAVAILABLE:
 * no engine could be opened) — or, should it pass, the lock call fails with
 * CERB_EIO — never a grant, within the configured bounds, and the message
 * says what went wrong.
 */
static void expect_refused(const char *cfg, const char *why_re, int64_t max_ms)
{
    cerb_client *c = NULL;
    int64_t t0 = cerb_test_now_ms();
    cerb_status st = cerb_client_open_string(&c, cfg);
    if (st == CERB_OK) {
        char *name = test_name("tls-refused");
        cerb_lock *l = mk(c, name);
        st = cerb_lock_trylock_for(l, 1500);
        assert_int_not_equal(st, CERB_OK);
        cerb_lock_free(l);
        free(name);
    }
    int64_t took = cerb_test_now_ms() - t0;
    const char *msg = cerb_last_error();
    print_message("refused (%s, %lld ms): %s\n", cerb_status_name(st), (long long)took, msg);
    assert_true(st == CERB_UNAVAILABLE || st == CERB_EIO);
    assert_true(took < max_ms);
    if (!strstr(msg, why_re))
        fail_msg("error \"%s\" does not mention \"%s\"", msg, why_re);
    cerb_client_close(c);
}

static void test_wrong_ca_refused(void **state)
{
    (void)state;
    char *cfg = tls_cfg("https", "other-ca.crt", "client.crt", "client.key");
    /* Refused in the handshake, before any request: not retried. */
    expect_refused(cfg, "certificate", 1000);
    free(cfg);
}

static void test_missing_client_cert_refused(void **state)
{
    (void)state;
    char *cfg = tls_cfg("https", "ca.crt", NULL, NULL);
    expect_refused(cfg, "bad certificate", 6000);
    free(cfg);
}

static void test_plain_http_to_tls_port_refused(void **state)
{
    (void)state;
    char *cfg = tls_cfg("http", NULL, NULL, NULL);
    expect_refused(cfg, "http://127.0.0.1", 6000);
    free(cfg);
}

static void test_missing_file_named_at_open(void **state)
{
    (void)state;
    char *cfg = tls_cfg("https", "no-such-ca.crt", "client.crt", "client.key");
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    assert_int_not_equal(st, CERB_OK);
    assert_null(c);
    print_message("missing file: %s: %s\n", cerb_status_name(st), cerb_last_error());
    assert_non_null(strstr(cerb_last_error(), "no-such-ca.crt"));
    free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_tls_locks),
        cmocka_unit_test(test_wrong_ca_refused),
        cmocka_unit_test(test_missing_client_cert_refused),
        cmocka_unit_test(test_plain_http_to_tls_port_refused),
        cmocka_unit_test(test_missing_file_named_at_open),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
