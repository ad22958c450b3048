/*
 * secret.c — a password kept in a file named by the configuration
 * (pg.password_file, mysql.password_file): its first line, without the
 * line end. One reader for every engine and its `cerberus init`, so the
 * rules (first line only, at most 1023 bytes, the copy on the stack wiped)
 * are the same everywhere.
 */
#include "internal_posix.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "error.h"

cerb_status cerb__config_read_secret(const char *what, const char *path, char **out)
{
    char buf[1024];
    *out = NULL;
    if (!path || !path[0])
        return CERB_OK;
    FILE *f = fopen(path, "re");
    if (!f)
        return cerb__error_set(CERB_ECONFIG, "%s: cannot read the password file %s: %s", what,
                               path, strerror(errno));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    bool err = ferror(f) != 0;
    fclose(f);
    if (err)
        return cerb__error_set(CERB_ECONFIG, "%s: cannot read the password file %s", what, path);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    *out = cerb__strdup(buf);
    memset(buf, 0, sizeof buf);
    return *out ? CERB_OK : cerb__error_set(CERB_ENOMEM, "%s: out of memory", what);
}

void cerb__config_free_secret(char *s)
{
    if (!s)
        return;
    memset(s, 0, strlen(s));
    cerb__free(s);
}
