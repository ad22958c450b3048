/*
 * serve_http.h — the serve suites' HTTP client (libcurl): one request to
 * an in-process `cerberus serve`, over its unix socket or loopback TCP,
 * with the answer's code, its JSON body and, when asked, its text and
 * content type. Used by tests/integration/test_serve*.c.
 */
#ifndef CERB_TEST_SERVE_HTTP_H
#define CERB_TEST_SERVE_HTTP_H

#include <stdbool.h>

#include <curl/curl.h>
#include <jansson.h>

struct serve_http_reply {
    long code;
    json_t *body;  /* the body as JSON (NUL bytes allowed); NULL when not JSON */
    char *text;    /* the body as sent: kept only when asked (keep_text) */
    char type[96]; /* its Content-Type */
};

/*
 * serve_http_try — @method @path (sent as it is, however long) with
 * @body (NULL: none) to the server on unix socket @sock, or, when @port is
 * not 0, on TCP 127.0.0.1:@port, with one more header line @header (NULL:
 * none). No cmocka asserts: threads may call it.
 * Returns: the transfer's code; on CURLE_OK *@r holds the answer (free
 * r->body with json_decref, and r->text, when @keep_text, with free).
 */
CURLcode serve_http_try(const char *sock, unsigned port, const char *header,
                        const char *method, const char *path, const char *body,
                        bool keep_text, struct serve_http_reply *r);

/* A libcurl write callback that appends to the NUL-terminated heap string
 * *(char **)@ud (NULL at first; free it). */
size_t serve_http_collect(char *p, size_t size, size_t n, void *ud);

/* The string member @key of the reply's JSON body, or "". */
const char *serve_http_str(const struct serve_http_reply *r, const char *key);

#endif
