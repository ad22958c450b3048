/*
 * zk_layout.c — names, paths and the order of a lock's children in Curator's
 * InterProcessMutex layout (see zk_layout.h).
 *
 * Ordering. A lock's children sort by the text after their last "lock-";
 * for every node Curator or we create that text is the server's 10-digit,
 * zero-padded sequence, so string order is creation order. One listing is
 * read in a single pass, without sorting: we only need how many children
 * come before ours (zero means we hold the lock) and which one comes just
 * before (the predecessor a waiter watches). Ties on the key, which only a
 * hand-made foreign node could produce, are broken by the whole name so
 * that the answer is deterministic.
 *
 * Name validation follows the server's PathUtils.validatePath on one
 * component, read as UTF-8 the way the server decodes it; an undecodable
 * byte would become U+FFFD on the server, which it then refuses, so
 * invalid UTF-8 is refused here with a clearer reason. The server checks
 * Java chars, so a code point above U+FFFF (a surrogate pair there) is
 * refused too.
 */
#include "internal_posix.h"

#include "zk_layout.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zookeeper/zookeeper.h>

#include "alloc.h"
#include "error.h"

const char *cerb__zk_child_key_mark(const char *name, const char *mark)
{
    const char *key = name, *p = name;
    size_t n = strlen(mark);

    while ((p = strstr(p, mark)) != NULL) {
        key = p + n;
        p++;
    }
    return key;
}

const char ZK_RW_ORDER[] = "(read-write order)";

const char *cerb__zk_child_key_rw(const char *name)
{
    return cerb__zk_child_key_mark(cerb__zk_child_key_mark(name, ZK_READ_MARK), ZK_WRITE_MARK);
}

bool cerb__zk_child_is_writer(const char *name) { return strstr(name, ZK_WRITE_MARK) != NULL; }

/* The key of child `name` in the order `mark` names. */
static const char *order_key(const char *name, const char *mark)
{
    return mark == ZK_RW_ORDER ? cerb__zk_child_key_rw(name) : cerb__zk_child_key_mark(name, mark);
}

const char *cerb__zk_child_key(const char *name)
{
    return cerb__zk_child_key_mark(name, ZK_LOCK_MARK);
}

bool cerb__zk_child_has_uuid(const char *name, const char *uuid)
{
    size_t pl = strlen(ZK_PROTECT_PREFIX);
    return strncmp(name, ZK_PROTECT_PREFIX, pl) == 0 &&
           strncmp(name + pl, uuid, ZK_UUID_LEN) == 0 && name[pl + ZK_UUID_LEN] == '-';
}

bool cerb__zk_child_is_ours(const char *name)
{
    size_t pl = strlen(ZK_PROTECT_PREFIX);
    if (strncmp(name, ZK_PROTECT_PREFIX, pl) != 0 || strlen(name) <= pl + ZK_UUID_LEN)
        return false;
    const char *u = name + pl;
    /* 8-4-4-4-12: the version is the first digit of the third group. */
    return u[8] == '-' && u[13] == '-' && u[14] == '0' + ZK_OUR_UUID_VERSION &&
           u[18] == '-' && u[23] == '-' && u[ZK_UUID_LEN] == '-';
}

const char *cerb__zk_basename(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static char *concat3(const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = cerb__malloc(la + lb + lc + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, c, lc + 1);
    return s;
}

char *cerb__zk_join(const char *dir, const char *child)
{
    /* The root is the only path that ends in '/'. */
    return concat3(dir, strcmp(dir, "/") == 0 ? "" : "/", child);
}

char *cerb__zk_sibling_path(const char *root, const char *node)
{
    size_t dir = (size_t)(strrchr(root, '/') - root);
    size_t n = dir + 1 + strlen(node) + 1;
    char *path = cerb__malloc(n);
    if (path) {
        memcpy(path, root, dir);
        snprintf(path + dir, n - dir, "/%s", node);
    }
    return path;
}

char *cerb__zk_fence_path(const char *root)
{
    return cerb__zk_sibling_path(root, ZK_FENCE_NODE);
}

bool cerb__zk_fence_parse(const char *data, int len, uint64_t *out)
{
    if (!data || len <= 0 || len > 20)
        return false;
    uint64_t v = 0;
    for (int i = 0; i < len; i++) {
        if (data[i] < '0' || data[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(data[i] - '0');
        if (v >= UINT64_C(1) << 48)
            return false;
    }
    *out = v;
    return true;
}

char *cerb__zk_parent_path(const char *root, const char *name)
{
    return cerb__zk_join(root, name);
}

char *cerb__zk_node_prefix_mark(const char *parent, const char *uuid, const char *mark)
{
    char tail[sizeof ZK_PROTECT_PREFIX + ZK_UUID_LEN + 1 + 16];
    snprintf(tail, sizeof tail, "%s%s-%s", ZK_PROTECT_PREFIX, uuid, mark);
    return concat3(parent, "/", tail);
}

char *cerb__zk_node_prefix(const char *parent, const char *uuid)
{
    return cerb__zk_node_prefix_mark(parent, uuid, ZK_LOCK_MARK);
}

/* Is child a (key ka, name a) ordered before b (key kb, name b)? */
static bool before(const char *ka, const char *a, const char *kb, const char *b)
{
    int c = strcmp(ka, kb);
    return c < 0 || (c == 0 && strcmp(a, b) < 0);
}

void cerb__zk_children_analyze(const struct String_vector *v, const char *self,
                               const char *uuid, struct zk_children *out)
{
    cerb__zk_children_analyze_mark(v, self, uuid, ZK_LOCK_MARK, out);
}

void cerb__zk_children_analyze_mark(const struct String_vector *v, const char *self,
                                    const char *uuid, const char *mark,
                                    struct zk_children *out)
{
    const char *self_key = self ? order_key(self, mark) : NULL;
    const char *pred = NULL, *pred_key = NULL, *wpred = NULL, *wpred_key = NULL;
    const bool rw = mark == ZK_RW_ORDER;

    memset(out, 0, sizeof *out);
    out->n_children = v ? (size_t)v->count : 0;
    for (size_t i = 0; i < out->n_children; i++) {
        const char *c = v->data[i];
        if (uuid && cerb__zk_child_has_uuid(c, uuid) && out->n_mine < ZK_MAX_MINE) {
            char *m = cerb__strdup(c);
            if (m)
                out->mine[out->n_mine++] = m;
            else
                out->oom = true;
        }
        if (!self)
            continue;
        if (strcmp(c, self) == 0) {
            out->found_self = true;
            continue;
        }
        const char *k = order_key(c, mark);
        if (!before(k, c, self_key, self))
            continue;
        out->n_lower++;
        if (!pred || before(pred_key, pred, k, c)) {
            pred = c;
            pred_key = k;
        }
        if (rw && cerb__zk_child_is_writer(c)) {
            out->n_wlower++;
            if (!wpred || before(wpred_key, wpred, k, c)) {
                wpred = c;
                wpred_key = k;
            }
        }
    }
    if (pred) {
        out->pred = cerb__strdup(pred);
        if (!out->pred)
            out->oom = true;
    }
    if (wpred) {
        out->wpred = cerb__strdup(wpred);
        if (!out->wpred)
            out->oom = true;
    }
}

void cerb__zk_children_clear(struct zk_children *c)
{
    cerb__free(c->pred);
    cerb__free(c->wpred);
    for (size_t i = 0; i < c->n_mine; i++)
        cerb__free(c->mine[i]);
    memset(c, 0, sizeof *c);
}

/* Decode one UTF-8 sequence at s; returns its length (0 = invalid). */
static size_t utf8_decode(const unsigned char *s, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t n;
    uint32_t c, min;
    if ((s[0] & 0xe0) == 0xc0) {
        n = 2;
        c = s[0] & 0x1f;
        min = 0x80;
    } else if ((s[0] & 0xf0) == 0xe0) {
        n = 3;
        c = s[0] & 0x0f;
        min = 0x800;
    } else if ((s[0] & 0xf8) == 0xf0) {
        n = 4;
        c = s[0] & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff)
        return 0; /* overlong or out of range */
    *cp = c;
    return n;
}

cerb_status cerb__zk_check_name(const char *name)
{
    const unsigned char *s = (const unsigned char *)name;

    if (!name || !name[0])
        return cerb__error_set(CERB_EINVAL, "zk: the name is empty");
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return cerb__error_set(CERB_EINVAL,
                               "zk: \"%s\" is not a valid ZooKeeper node name (relative path)",
                               name);
    for (size_t i = 0; s[i];) {
        uint32_t cp = 0;
        size_t n = utf8_decode(s + i, &cp);
        if (n == 0)
            return cerb__error_set(CERB_EINVAL,
                                   "zk: the name is not valid UTF-8 (byte 0x%02x at %zu)", s[i],
                                   i);
        if (cp == '/')
            return cerb__error_set(CERB_EINVAL,
                                   "zk: the name has a '/' at byte %zu: a lock name must be "
                                   "one ZooKeeper path component",
                                   i);
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || (cp >= 0xd800 && cp <= 0xf8ff) ||
            cp >= 0xfff0)
            return cerb__error_set(CERB_EINVAL,
                                   "zk: the name has U+%04X at byte %zu, which ZooKeeper "
                                   "refuses in paths",
                                   (unsigned)cp, i);
        i += n;
    }
    return CERB_OK;
}
