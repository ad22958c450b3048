/*
 * test_secrets.c — no password reaches a log line or an error (issue 14
 * item 5). An etcd endpoint may carry credentials as URL userinfo
 * (`http://user:pass@host:port`); the library used to print endpoints whole
 * in connection errors. Here a client is opened on such an endpoint whose
 * port refuses connections (a real failing connection, no server), with a
 * log sink capturing every line at debug level: neither the lines nor
 * cerb_last_error() may contain the password, while they still name the
 * host and port. The same for a configuration error about the endpoint,
 * and for the redaction helper itself (cerb__redact_urls, core/error.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cerberus.h"
#include "error.h"

#define SECRET "pa55-Secret"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char captured[1 << 16];
static size_t captured_len;

static void sink(cerb_log_level level, const char *line, void *ud)
{
    (void)level;
    (void)ud;
    pthread_mutex_lock(&mu);
    int n = snprintf(captured + captured_len, sizeof captured - captured_len, "%s\n", line);
    if (n > 0 && captured_len + (size_t)n < sizeof captured)
        captured_len += (size_t)n;
    pthread_mutex_unlock(&mu);
}

static bool captured_has(const char *s)
{
    pthread_mutex_lock(&mu);
    bool r = strstr(captured, s) != NULL;
    pthread_mutex_unlock(&mu);
    return r;
}

static void redacts(const char *in, const char *want)
{
    char buf[256];
    cerb__redact_urls(in, buf, sizeof buf);
    assert_string_equal(buf, want);
}

static void test_helper(void **state)
{
    (void)state;
    redacts("http://127.0.0.1:2379", "http://127.0.0.1:2379");
    redacts("http://user:" SECRET "@h:1", "http://user:***@h:1");
    redacts("https://tok" SECRET "@h:1/v3/kv", "https://***@h:1/v3/kv");
    redacts("a http://u:p@h:1, b https://v:q@k:2/x: refused",
            "a http://u:***@h:1, b https://v:***@k:2/x: refused");
    /* An '@' after the authority is not userinfo. */
    redacts("http://h:1/a@b", "http://h:1/a@b");
    redacts("etcd \"http://u:p@h:1\": bad", "etcd \"http://u:***@h:1\": bad");
    redacts("no url here, user@host", "no url here, user@host");
    /* Cut to the buffer, still terminated and redacted. */
    char small[12];
    cerb__redact_urls("http://u:" SECRET "@h:1", small, sizeof small);
    assert_null(strstr(small, "Secret"));
    assert_true(strlen(small) < sizeof small);
}

static void test_failing_connection(void **state)
{
    (void)state;
    const char *cfg = "engines = (\"etcd\");\n"
                      "etcd = { endpoints = (\"http://root:" SECRET "@127.0.0.1:1\");\n"
                      "  connect_timeout_ms = 200; op_timeout_ms = 200; };\n";
    cerb_client *c = NULL;
    captured_len = 0;
    captured[0] = '\0';
    assert_int_equal(cerb_log_set(sink, NULL, CERB_LOG_DEBUG), CERB_OK);
    cerb_status st = cerb_client_open_string(&c, cfg);
    cerb_log_set(NULL, NULL, CERB_LOG_WARN);
    if (st == CERB_ECONFIG && strstr(cerb_last_error(), "unknown engine"))
        skip(); /* built without etcd */
    assert_int_not_equal(st, CERB_OK);
    const char *err = cerb_last_error();
    print_message("error: %s\nlog:\n%s", err, captured);
    assert_null(strstr(err, SECRET));
    assert_non_null(strstr(err, "127.0.0.1"));
    assert_false(captured_has(SECRET));
    assert_true(captured_len > 0); /* the failure was logged, redacted */
    assert_true(captured_has("127.0.0.1"));
}

static void test_config_error(void **state)
{
    (void)state;
    /* A scheme the parser refuses: the message quotes the endpoint. */
    const char *cfg = "engines = (\"etcd\");\n"
                      "etcd = { endpoints = (\"ftp://root:" SECRET "@127.0.0.1:1\"); };\n";
    cerb_client *c = NULL;
    cerb_status st = cerb_client_open_string(&c, cfg);
    assert_int_not_equal(st, CERB_OK);
    print_message("error: %s\n", cerb_last_error());
    assert_null(strstr(cerb_last_error(), SECRET));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_helper),
        cmocka_unit_test(test_failing_connection),
        cmocka_unit_test(test_config_error),
    };
    return cmocka_run_group_tests_name("secrets", tests, NULL, NULL);
}
