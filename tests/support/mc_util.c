/*
 * mc_util.c — the test memcached: port, configuration, raw requests (see
 * mc_util.h). A raw request opens its own connection, bounded by 2 s.
 */
#include "internal_posix.h"

#include "mc_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "test_util.h"

int mc_test_port(void) { return cerb_test_env_port("CERB_MEMCACHED_PORT", 21211); }

char *mc_test_config(const char *mc_extra, const char *extra)
{
    static const char fmt[] =
        "engines = (\"memcached\");\nmemcached = { servers = (\"127.0.0.1:%d\"); %s };\n%s\n";
    const char *me = mc_extra ? mc_extra : "", *ex = extra ? extra : "";
    int len = snprintf(NULL, 0, fmt, mc_test_port(), me, ex);
    char *s = malloc((size_t)len + 1);
    if (s)
        snprintf(s, (size_t)len + 1, fmt, mc_test_port(), me, ex);
    return s;
}

void mc_test_key(const char *prefix, const char *name, char *out, size_t len, int *b64)
{
    prefix = prefix ? prefix : "";
    size_t pl = strlen(prefix), nl = strlen(name);
    int safe = pl + nl <= 250;
    for (size_t i = 0; i < nl && safe; i++)
        safe = (unsigned char)name[i] > 0x20 && (unsigned char)name[i] != 0x7f;
    if (safe) {
        snprintf(out, len, "%s%s", prefix, name);
        *b64 = 0;
        return;
    }
    unsigned char raw[512];
    unsigned int dl = 0;
    memcpy(raw, prefix, pl);
    EVP_Digest(name, nl, raw + pl, &dl, EVP_sha256(), NULL);
    char enc[700];
    EVP_EncodeBlock((unsigned char *)enc, raw, (int)(pl + dl));
    snprintf(out, len, "%s", enc);
    *b64 = 1;
}

char *mc_test_cmd(int port, const char *line)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char req[1024];
    int n = snprintf(req, sizeof req, "%s\r\n", line);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || send(fd, req, (size_t)n, 0) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 65536, got = 0;
    char *buf = malloc(cap);
    while (buf && got + 1 < cap) {
        ssize_t r = recv(fd, buf + got, cap - 1 - got, 0);
        if (r <= 0) {
            free(buf);
            buf = NULL;
            break;
        }
        got += (size_t)r;
        buf[got] = '\0';
        /* Complete: a last line that is not a VA header (whose value line
         * follows), or a VA's value line. */
        if (got >= 2 && buf[got - 2] == '\r' && buf[got - 1] == '\n') {
            if (strncmp(buf, "STAT", 4) == 0) {
                if (strstr(buf, "END\r\n"))
                    break;
                continue;
            }
            if (strncmp(buf, "VA ", 3) == 0 && strchr(buf, '\n') == buf + got - 1)
                continue;
            break;
        }
    }
    close(fd);
    return buf;
}

int mc_test_item(int port, const char *name, char *value, int64_t *ttl_s)
{
    char key[600], req[700];
    int b64 = 0;
    mc_test_key(NULL, name, key, sizeof key, &b64);
    snprintf(req, sizeof req, "mg %s v t%s", key, b64 ? " b" : "");
    char *r = mc_test_cmd(port, req);
    if (!r)
        return -1;
    int rc = -1;
    long vlen = 0;
    long long t = -1;
    if (strncmp(r, "EN", 2) == 0) {
        rc = 0;
    } else if (sscanf(r, "VA %ld t%lld", &vlen, &t) == 2) {
        rc = 1;
        const char *v = strchr(r, '\n');
        if (value) {
            snprintf(value, 65, "%.*s", (int)(vlen < 64 ? vlen : 64), v ? v + 1 : "");
        }
        if (ttl_s)
            *ttl_s = t;
    }
    free(r);
    return rc;
}

int mc_test_records(const char *name) { return mc_test_item(mc_test_port(), name, NULL, NULL); }
