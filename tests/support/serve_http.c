/*
 * serve_http.c — see serve_http.h. Each request is an easy handle of its
 * own (no connection kept between requests), with a 20 s bound.
 */
#include "serve_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t serve_http_collect(char *p, size_t size, size_t n, void *ud)
{
    char **buf = ud;
    size_t old = *buf ? strlen(*buf) : 0, add = size * n;
    char *b = realloc(*buf, old + add + 1);

    if (!b)
        return 0;
    memcpy(b + old, p, add);
    b[old + add] = '\0';
    *buf = b;
    return add;
}

CURLcode serve_http_try(const char *sock, unsigned port, const char *header,
                        const char *method, const char *path, const char *body,
                        bool keep_text, struct serve_http_reply *r)
{
    /* As long as the path: a fixed buffer would cut a long one. */
    size_t ulen = strlen(path) + sizeof "http://127.0.0.1:65535";
    char *url = malloc(ulen), *text = NULL, *type = NULL;
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    CURL *c = url && h ? curl_easy_init() : NULL;
    CURLcode rc;

    memset(r, 0, sizeof *r);
    if (c && header && !(h = curl_slist_append(h, header))) {
        curl_easy_cleanup(c);
        c = NULL;
    }
    if (!c) {
        free(url);
        curl_slist_free_all(h);
        return CURLE_OUT_OF_MEMORY;
    }
    if (port) {
        snprintf(url, ulen, "http://127.0.0.1:%u%s", port, path);
        curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    } else {
        snprintf(url, ulen, "http://localhost%s", path);
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, serve_http_collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &text);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
    if (curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type) == CURLE_OK && type)
        snprintf(r->type, sizeof r->type, "%s", type);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    free(url);
    if (rc == CURLE_OK && text)
        r->body = json_loads(text, JSON_ALLOW_NUL, NULL);
    if (keep_text)
        r->text = text;
    else
        free(text);
    return rc;
}

const char *serve_http_str(const struct serve_http_reply *r, const char *key)
{
    const char *v = json_string_value(json_object_get(r->body, key));
    return v ? v : "";
}
