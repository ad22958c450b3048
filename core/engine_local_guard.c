/*
 * engine_local_guard.c — the local engine's idempotency-guard records
 * (cerb_engine_ops version 2, DESIGN.md §11).
 *
 * In-process mode keeps one process-wide table of records keyed by the
 * record id (sharded, each shard a hash table that grows with it: see
 * "in memory" below), so two clients of one process see each other's
 * records exactly as two processes would on a server. A record is a state
 * (running or done), the token of the attempt that wrote it, an expiry on
 * the library clock (CERB_DEADLINE_NEVER for "keep forever") and, once
 * done, the result.
 * An expired record counts as absent, as a server's TTL would, and is freed
 * when its bucket is next visited or swept (a few buckets per operation),
 * so expired records do not accumulate.
 *
 * File mode (`local.dir` set, the same switch as the local engine's locks)
 * keeps each record in <dir>/guard/<id>, so processes on one host share
 * them: `cerberus once` runs from cron rely on it. Each step takes an
 * exclusive flock on the record file and, holding it, checks that the path
 * still names the file it locked (a delete unlinks the file under the
 * flock, and a step that opened the old file starts again). The expiry is
 * written in the file on CLOCK_BOOTTIME (the library clock), which every
 * process of the host shares. The content is "R" or "D", the 32-char token,
 * the 20-digit expiry in ns (0 = never), then the result bytes, written to
 * a temporary file renamed over the record (a writer killed mid-write
 * leaves no torn record). Expired files are deleted when they are next
 * touched and by a sweep of the directory every SWEEP_NS, run by the begin
 * that finds it due (which also removes temporary files left by a killed
 * writer).
 */
#include "internal_posix.h"

#include "engine.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "alloc.h"
#include "clock.h"
#include "engine_local.h"
#include "error.h"
#include "sync.h"

#define NSHARDS 16       /* a power of two */
#define MIN_BUCKETS 64   /* per shard; a power of two */
#define SWEEP_BUCKETS 2  /* buckets each operation sweeps for expired records */
#define MOVE_BUCKETS 8   /* old buckets each operation moves while resizing */
#define HDR_LEN (1 + 32 + 20)
#define FLOCK_WAIT_NS (1000 * CERB_NS_PER_MS)
#define SWEEP_NS (60 * INT64_C(1000) * CERB_NS_PER_MS)

/* ------------------------------------------------------------ in memory */

/*
 * The table is NSHARDS shards, each with its own mutex and its own chained
 * hash table, so threads working on different records rarely meet on a
 * lock. A record is keyed by its id's 32-byte binary SHA-256 (the id is its
 * 64-char hex form): its first 8 bytes pick the bucket, its last byte the
 * shard, and a lookup compares the first 8 bytes before the rest.
 *
 * A shard doubles its buckets when it holds more records than buckets. The
 * rehash is incremental, so no operation pays for the whole shard: the new
 * table takes the place of the old one at once, and each operation on the
 * shard then moves the next MOVE_BUCKETS old buckets into it (dropping
 * expired records on the way), plus, first, the old bucket of the key it
 * is about to look up; so a lookup only ever searches the new table. The
 * old table is gone after old_n / MOVE_BUCKETS operations, long before the
 * new one can fill (that takes nbuckets / 2 more inserts); a shard does not
 * start another resize while one is under way (chains grow a little
 * meanwhile).
 *
 * Expired records are freed when their bucket is walked and by a sweep:
 * each operation on a shard also walks the next SWEEP_BUCKETS buckets of
 * it, so every expired record is freed within nbuckets / SWEEP_BUCKETS
 * operations on its shard. At the end of each full sweep a shard holding
 * fewer than one record per 8 buckets shrinks, the same incremental way, to
 * about two buckets a record, so a table that grew for a burst gives them
 * back.
 */
struct grec {
    uint8_t key[32];     /* the id, as binary */
    char state;          /* 'R' running, 'D' done */
    char token[33];
    int64_t expires_ns;  /* CERB_DEADLINE_NEVER: kept forever */
    void *result;
    size_t len;
    struct grec *next;
};

struct gshard {
    cerb_mutex mu;
    struct grec **buckets;  /* nbuckets chains; NULL until the first record */
    size_t nbuckets;        /* a power of two, >= MIN_BUCKETS once allocated */
    size_t count;           /* records held, expired ones not yet freed too */
    size_t sweep_at;        /* the next bucket the sweep walks */
    struct grec **old;      /* while resizing: the table being emptied */
    size_t old_n;           /* its buckets */
    size_t move_at;         /* old buckets below it are moved (all NULL) */
};

#define GSHARD_INIT {{PTHREAD_MUTEX_INITIALIZER}, NULL, 0, 0, 0, NULL, 0, 0}
static struct gshard gshards[NSHARDS] = {
    GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT,
    GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT,
    GSHARD_INIT, GSHARD_INIT, GSHARD_INIT, GSHARD_INIT,
};

/* The id's binary form; CERB_EINVAL for an id that is not 64 hex chars
 * (the guard only makes SHA-256 ids: this is a programming error). */
static cerb_status key_of(const char *id, uint8_t key[32])
{
    size_t n = 0;
    if (strlen(id) != 64 || !OPENSSL_hexstr2buf_ex(key, 32, &n, id, '\0') || n != 32)
        return cerb__error_set(CERB_EINVAL, "local: guard id is not a SHA-256 in hex");
    return CERB_OK;
}

static uint64_t key_hash(const uint8_t key[32])
{
    uint64_t h;
    memcpy(&h, key, sizeof h);
    return h;
}

static struct gshard *shard_of(const uint8_t key[32])
{
    return &gshards[key[31] & (NSHARDS - 1)];
}

static bool key_equal(const struct grec *r, const uint8_t key[32])
{
    /* The first 8 bytes (the bucket's hash) differ for nearly every other
     * record of a chain: compare them alone first. */
    return key_hash(r->key) == key_hash(key) && memcmp(r->key, key, 32) == 0;
}

static void grec_free(struct grec *r)
{
    cerb__free(r->result);
    cerb__free(r);
}

/* Free chain *pp's expired records; s->mu held. */
static void chain_sweep(struct gshard *s, struct grec **pp, int64_t now)
{
    while (*pp) {
        struct grec *r = *pp;
        if (r->expires_ns <= now) {
            *pp = r->next;
            grec_free(r);
            s->count--;
        } else {
            pp = &r->next;
        }
    }
}

/* Move old bucket i's live records into the new table, freeing the
 * expired ones; s->mu held. */
static void move_bucket(struct gshard *s, size_t i, int64_t now)
{
    struct grec *r = s->old[i];
    s->old[i] = NULL;
    while (r) {
        struct grec *next = r->next;
        if (r->expires_ns <= now) {
            grec_free(r);
            s->count--;
        } else {
            size_t j = key_hash(r->key) & (s->nbuckets - 1);
            r->next = s->buckets[j];
            s->buckets[j] = r;
        }
        r = next;
    }
}

/* Carry a resize under way MOVE_BUCKETS old buckets further; s->mu held. */
static void resize_step(struct gshard *s, int64_t now)
{
    for (int i = 0; i < MOVE_BUCKETS && s->old; i++) {
        move_bucket(s, s->move_at, now);
        if (++s->move_at == s->old_n) {
            cerb__free(s->old);
            s->old = NULL;
            s->old_n = 0;
        }
    }
}

/* Start moving s to a table of n buckets (the records follow in
 * resize_step); s->mu held, no resize under way. Keeps the table as it is
 * if the new one cannot be had: longer chains, still correct. */
static void resize_start(struct gshard *s, size_t n)
{
    struct grec **nb = cerb__calloc(n, sizeof *nb);
    if (!nb)
        return;
    s->old = s->buckets;
    s->old_n = s->nbuckets;
    s->move_at = 0;
    s->buckets = nb;
    s->nbuckets = n;
    s->sweep_at = 0;
}

/* Walk the next SWEEP_BUCKETS buckets for expired records and, at the end of
 * a full pass, give back buckets a shrunken shard no longer needs; s->mu
 * held. */
static void shard_sweep(struct gshard *s, int64_t now)
{
    for (int i = 0; i < SWEEP_BUCKETS && s->nbuckets; i++) {
        chain_sweep(s, &s->buckets[s->sweep_at], now);
        if (++s->sweep_at == s->nbuckets) {
            s->sweep_at = 0;
            if (!s->old && s->nbuckets > MIN_BUCKETS && s->count < s->nbuckets / 8) {
                size_t n = MIN_BUCKETS;
                while (n < 2 * s->count)
                    n *= 2;
                resize_start(s, n);
                break; /* the cursor starts again on the new table */
            }
        }
    }
}

/* Lock key's shard, sweep a little of it, carry a resize under way further,
 * and find key's live record (freeing its bucket's expired ones). Returns
 * the locked shard. */
static struct gshard *shard_enter(const uint8_t key[32], int64_t *now, struct grec **found)
{
    struct gshard *s = shard_of(key);
    cerb__mutex_lock(&s->mu);
    *now = cerb_monotime();
    *found = NULL;
    if (!s->nbuckets)
        return s;
    shard_sweep(s, *now); /* may start a shrink: before the moves */
    resize_step(s, *now);
    if (s->old) /* this key's old bucket too: the lookup needs only the new table */
        move_bucket(s, key_hash(key) & (s->old_n - 1), *now);
    struct grec **head = &s->buckets[key_hash(key) & (s->nbuckets - 1)];
    chain_sweep(s, head, *now);
    for (struct grec *r = *head; r; r = r->next)
        if (key_equal(r, key)) {
            *found = r;
            break;
        }
    return s;
}

/* Link a new record into s, growing s first if it is full; s->mu held. */
static cerb_status shard_insert(struct gshard *s, struct grec *r)
{
    if (!s->nbuckets) {
        s->buckets = cerb__calloc(MIN_BUCKETS, sizeof *s->buckets);
        if (!s->buckets)
            return cerb__error_set(CERB_ENOMEM, "local: out of memory");
        s->nbuckets = MIN_BUCKETS;
    } else if (s->count >= s->nbuckets && !s->old) {
        resize_start(s, s->nbuckets * 2);
    }
    size_t i = key_hash(r->key) & (s->nbuckets - 1);
    r->next = s->buckets[i];
    s->buckets[i] = r;
    s->count++;
    return CERB_OK;
}

static void grec_delete(struct gshard *s, struct grec *victim)
{
    for (struct grec **pp = &s->buckets[key_hash(victim->key) & (s->nbuckets - 1)]; *pp;
         pp = &(*pp)->next)
        if (*pp == victim) {
            *pp = victim->next;
            grec_free(victim);
            s->count--;
            return;
        }
}

static cerb_status copy_result(const void *src, size_t len, void **out, size_t *out_len)
{
    char *p = cerb__malloc(len + 1);
    if (!p)
        return cerb__error_set(CERB_ENOMEM, "local: out of memory");
    if (len)
        memcpy(p, src, len);
    p[len] = '\0';
    *out = p;
    *out_len = len;
    return CERB_OK;
}

static void claim_grant(const cerb_guard_rec *rec, int64_t now, cerb_grant *g)
{
    g->sent_ns = now;
    g->ttl_ms = rec->running_ms;
}

static cerb_status mem_begin(const cerb_guard_rec *rec, cerb_grant *g, void **res, size_t *len)
{
    uint8_t key[32];
    cerb_status st = key_of(rec->id, key);
    if (st != CERB_OK)
        return st;
    int64_t now;
    struct grec *r;
    struct gshard *s = shard_enter(key, &now, &r);
    if (!r) {
        r = cerb__calloc(1, sizeof *r);
        if (!r) {
            cerb__mutex_unlock(&s->mu);
            return cerb__error_set(CERB_ENOMEM, "local: out of memory");
        }
        memcpy(r->key, key, sizeof r->key);
        memcpy(r->token, rec->token, sizeof r->token);
        r->state = 'R';
        r->expires_ns = now + rec->running_ms * CERB_NS_PER_MS;
        st = shard_insert(s, r);
        if (st == CERB_OK)
            claim_grant(rec, now, g);
        else
            cerb__free(r);
    } else if (r->state == 'D') {
        st = copy_result(r->result, r->len, res, len);
        if (st == CERB_OK)
            st = CERB_DUPLICATE;
    } else if (strcmp(r->token, rec->token) == 0) {
        g->sent_ns = now;
        g->ttl_ms = (r->expires_ns - now) / CERB_NS_PER_MS;
        st = CERB_OK; /* ours already: a re-sent begin */
    } else {
        st = CERB_BUSY;
    }
    cerb__mutex_unlock(&s->mu);
    return st;
}

static cerb_status mem_renew(const cerb_guard_rec *rec, cerb_grant *g)
{
    uint8_t key[32];
    cerb_status st = key_of(rec->id, key);
    if (st != CERB_OK)
        return st;
    st = CERB_NOT_OWNER;
    int64_t now;
    struct grec *r;
    struct gshard *s = shard_enter(key, &now, &r);
    if (r && r->state == 'R' && strcmp(r->token, rec->token) == 0) {
        r->expires_ns = now + rec->running_ms * CERB_NS_PER_MS;
        claim_grant(rec, now, g);
        st = CERB_OK;
    }
    cerb__mutex_unlock(&s->mu);
    return st;
}

static cerb_status mem_finish(const cerb_guard_rec *rec, int ok, const void *result, size_t len,
                              int64_t keep_ms)
{
    uint8_t key[32];
    cerb_status st = key_of(rec->id, key);
    if (st != CERB_OK)
        return st;
    st = CERB_NOT_OWNER;
    int64_t now;
    struct grec *r;
    struct gshard *s = shard_enter(key, &now, &r);
    if (r && strcmp(r->token, rec->token) == 0) {
        if (r->state == 'D') {
            st = ok ? CERB_OK : CERB_NOT_OWNER; /* a re-sent success */
        } else if (!ok) {
            grec_delete(s, r);
            st = CERB_OK;
        } else {
            void *copy = NULL;
            size_t n = 0;
            st = copy_result(result, len, &copy, &n);
            if (st == CERB_OK) {
                r->result = copy;
                r->len = n;
                r->state = 'D';
                r->expires_ns = keep_ms < 0 ? CERB_DEADLINE_NEVER
                                            : now + keep_ms * CERB_NS_PER_MS;
            }
        }
    }
    cerb__mutex_unlock(&s->mu);
    return st;
}

static cerb_guard_found found_of(char state, const char *token, const cerb_guard_rec *rec)
{
    if (strcmp(token, rec->token) != 0)
        return CERB_GUARD_FOUND_OTHER;
    return state == 'D' ? CERB_GUARD_FOUND_DONE : CERB_GUARD_FOUND_RUNNING;
}

static cerb_status mem_check(const cerb_guard_rec *rec, cerb_guard_found *found)
{
    uint8_t key[32];
    cerb_status st = key_of(rec->id, key);
    if (st != CERB_OK)
        return st;
    int64_t now;
    struct grec *r;
    struct gshard *s = shard_enter(key, &now, &r);
    *found = r ? found_of(r->state, r->token, rec) : CERB_GUARD_FOUND_NONE;
    cerb__mutex_unlock(&s->mu);
    return CERB_OK;
}

/* ------------------------------------------------------------ file mode */

struct frec {
    char state;          /* 'R', 'D', or 0 when there is no record */
    char token[33];
    int64_t expires_ns;  /* CERB_DEADLINE_NEVER for 0 in the file */
    char *result;        /* cerb__malloc'd (NUL after) */
    size_t len;
};

static cerb_status guard_dir(cerb_engine *e, char *out, size_t n)
{
    const char *dir = cerb__local_dir(e);
    if ((size_t)snprintf(out, n, "%s/guard", dir) >= n)
        return cerb__error_set(CERB_EINVAL, "local: guard directory path too long");
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        return cerb__error_set(CERB_EIO, "local: mkdir %s: %s", out, strerror(errno));
    return CERB_OK;
}

/* Open and flock the record file at `path`, the one the path names when
 * the lock is held. Returns the fd, or -1 with the error set in *st. */
static int flocked_open(const char *path, bool create, cerb_status *st)
{
    int64_t deadline = cerb_monotime() + FLOCK_WAIT_NS;
    for (;;) {
        int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
        if (fd < 0) {
            if (errno == ENOENT && !create) {
                *st = CERB_OK;
                return -1; /* no record */
            }
            *st = cerb__error_set(CERB_EIO, "local: open %s: %s", path, strerror(errno));
            return -1;
        }
        while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno != EWOULDBLOCK && errno != EINTR) {
                *st = cerb__error_set(CERB_EIO, "local: flock %s: %s", path, strerror(errno));
                close(fd);
                return -1;
            }
            if (cerb_monotime() >= deadline) {
                *st = cerb__error_set(CERB_TIMEOUT, "local: %s stayed locked", path);
                close(fd);
                return -1;
            }
            cerb__nap_ms(1);
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
            return fd;
        close(fd); /* deleted (and maybe made again) meanwhile: start over */
    }
}

/* Read the record in fd; an expired one reads as none. */
static cerb_status frec_read(int fd, struct frec *r, int64_t now)
{
    memset(r, 0, sizeof *r);
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return cerb__error_set(CERB_EIO, "local: fstat: %s", strerror(errno));
    if (sb.st_size < HDR_LEN)
        return CERB_OK; /* empty: just made, or never written */
    size_t n = (size_t)sb.st_size;
    char *buf = cerb__malloc(n + 1);
    if (!buf)
        return cerb__error_set(CERB_ENOMEM, "local: out of memory");
    ssize_t got = pread(fd, buf, n, 0);
    if (got != (ssize_t)n || (buf[0] != 'R' && buf[0] != 'D')) {
        cerb__free(buf);
        return cerb__error_set(CERB_EPROTO, "local: guard record file is damaged");
    }
    char num[21];
    memcpy(num, buf + 33, 20);
    num[20] = '\0';
    int64_t exp = (int64_t)strtoll(num, NULL, 10);
    r->expires_ns = exp == 0 ? CERB_DEADLINE_NEVER : exp;
    if (r->expires_ns <= now) {
        cerb__free(buf);
        return CERB_OK; /* expired: none */
    }
    r->state = buf[0];
    memcpy(r->token, buf + 1, 32);
    r->token[32] = '\0';
    r->len = n - HDR_LEN;
    memmove(buf, buf + HDR_LEN, r->len);
    buf[r->len] = '\0';
    r->result = buf;
    return CERB_OK;
}

/* Replace the record at `path` (whose current file the caller has
 * flocked): the new content goes to a temporary file renamed over the path,
 * so a process killed mid-write leaves the old record or the new one, never
 * a torn one. Waiters on the old file's flock then find the path names
 * another file and open it again (flocked_open). */
static cerb_status frec_write(const char *path, char state, const char *token,
                              int64_t expires_ns, const void *result, size_t len)
{
    char tmp[4300], hdr[HDR_LEN + 1];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    snprintf(hdr, sizeof hdr, "%c%.32s%020" PRId64, state, token,
             expires_ns == CERB_DEADLINE_NEVER ? (int64_t)0 : expires_ns);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return cerb__error_set(CERB_EIO, "local: create %s: %s", tmp, strerror(errno));
    bool ok = pwrite(fd, hdr, HDR_LEN, 0) == HDR_LEN &&
              (!len || pwrite(fd, result, len, HDR_LEN) == (ssize_t)len);
    int err = errno;
    close(fd);
    if (!ok || rename(tmp, path) != 0) {
        if (ok)
            err = errno;
        unlink(tmp);
        return cerb__error_set(CERB_EIO, "local: write guard record %s: %s", path, strerror(err));
    }
    return CERB_OK;
}

static cerb_status file_path(cerb_engine *e, const cerb_guard_rec *rec, char *out, size_t n)
{
    char dir[4096];
    cerb_status st = guard_dir(e, dir, sizeof dir);
    if (st != CERB_OK)
        return st;
    if ((size_t)snprintf(out, n, "%s/%s", dir, rec->id) >= n)
        return cerb__error_set(CERB_EINVAL, "local: guard directory path too long");
    return CERB_OK;
}

/* Delete expired record files (each under its flock). */
static void file_sweep(cerb_engine *e)
{
    static cerb_mutex sweep_mu = {PTHREAD_MUTEX_INITIALIZER};
    static int64_t last_sweep_ns;
    int64_t now = cerb_monotime();
    cerb__mutex_lock(&sweep_mu);
    bool due = last_sweep_ns == 0 || now - last_sweep_ns >= SWEEP_NS;
    if (due)
        last_sweep_ns = now;
    cerb__mutex_unlock(&sweep_mu);
    char dir[4096], path[4096 + 300];
    if (!due || guard_dir(e, dir, sizeof dir) != CERB_OK)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (strlen(de->d_name) > 64 && strstr(de->d_name, ".tmp.")) {
            /* A writer killed between create and rename left it. */
            struct stat sb;
            if (stat(path, &sb) == 0 && time(NULL) - sb.st_mtime > SWEEP_NS / 1000000000)
                unlink(path);
            continue;
        }
        if (strlen(de->d_name) != 64)
            continue;
        cerb_status st;
        int fd = flocked_open(path, false, &st);
        if (fd < 0)
            continue;
        struct frec r;
        if (frec_read(fd, &r, now) == CERB_OK && r.state == 0)
            unlink(path);
        cerb__free(r.result);
        close(fd);
    }
    closedir(d);
}

static cerb_status file_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                              void **res, size_t *len)
{
    char path[4200];
    cerb_status st = file_path(e, rec, path, sizeof path);
    if (st != CERB_OK)
        return st;
    file_sweep(e);
    int fd = flocked_open(path, true, &st);
    if (fd < 0)
        return st;
    int64_t now = cerb_monotime();
    struct frec r;
    st = frec_read(fd, &r, now);
    if (st == CERB_OK) {
        if (r.state == 0) {
            st = frec_write(path, 'R', rec->token, now + rec->running_ms * CERB_NS_PER_MS, NULL, 0);
            if (st == CERB_OK)
                claim_grant(rec, now, g);
        } else if (r.state == 'D') {
            *res = r.result;
            *len = r.len;
            r.result = NULL;
            st = CERB_DUPLICATE;
        } else if (strcmp(r.token, rec->token) == 0) {
            g->sent_ns = now;
            g->ttl_ms = (r.expires_ns - now) / CERB_NS_PER_MS;
        } else {
            st = CERB_BUSY;
        }
    }
    cerb__free(r.result);
    close(fd);
    return st;
}

static cerb_status file_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    char path[4200];
    cerb_status st = file_path(e, rec, path, sizeof path);
    if (st != CERB_OK)
        return st;
    int fd = flocked_open(path, false, &st);
    if (fd < 0)
        return st == CERB_OK ? CERB_NOT_OWNER : st;
    int64_t now = cerb_monotime();
    struct frec r;
    st = frec_read(fd, &r, now);
    if (st == CERB_OK) {
        if (r.state == 'R' && strcmp(r.token, rec->token) == 0) {
            st = frec_write(path, 'R', rec->token, now + rec->running_ms * CERB_NS_PER_MS, NULL, 0);
            if (st == CERB_OK)
                claim_grant(rec, now, g);
        } else {
            st = CERB_NOT_OWNER;
        }
    }
    cerb__free(r.result);
    close(fd);
    return st;
}

static cerb_status file_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                               const void *result, size_t len, int64_t keep_ms)
{
    char path[4200];
    cerb_status st = file_path(e, rec, path, sizeof path);
    if (st != CERB_OK)
        return st;
    int fd = flocked_open(path, false, &st);
    if (fd < 0)
        return st == CERB_OK ? CERB_NOT_OWNER : st;
    int64_t now = cerb_monotime();
    struct frec r;
    st = frec_read(fd, &r, now);
    if (st == CERB_OK) {
        if (r.state == 0 || strcmp(r.token, rec->token) != 0) {
            st = CERB_NOT_OWNER;
        } else if (r.state == 'D') {
            st = ok ? CERB_OK : CERB_NOT_OWNER;
        } else if (!ok) {
            if (unlink(path) != 0)
                st = cerb__error_set(CERB_EIO, "local: unlink %s: %s", path, strerror(errno));
        } else {
            st = frec_write(path, 'D', rec->token,
                            keep_ms < 0 ? CERB_DEADLINE_NEVER : now + keep_ms * CERB_NS_PER_MS,
                            result, len);
        }
    }
    cerb__free(r.result);
    close(fd);
    return st;
}

static cerb_status file_check(cerb_engine *e, const cerb_guard_rec *rec, cerb_guard_found *found)
{
    char path[4200];
    *found = CERB_GUARD_FOUND_NONE;
    cerb_status st = file_path(e, rec, path, sizeof path);
    if (st != CERB_OK)
        return st;
    int fd = flocked_open(path, false, &st);
    if (fd < 0)
        return st;
    struct frec r;
    st = frec_read(fd, &r, cerb_monotime());
    if (st == CERB_OK && r.state)
        *found = found_of(r.state, r.token, rec);
    cerb__free(r.result);
    close(fd);
    return st;
}

/* ------------------------------------------------------------ the methods */

cerb_status cerb__local_guard_begin(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g,
                                    void **result, size_t *len)
{
    if (cerb__local_dir(e))
        return file_begin(e, rec, g, result, len);
    return mem_begin(rec, g, result, len);
}

cerb_status cerb__local_guard_renew(cerb_engine *e, const cerb_guard_rec *rec, cerb_grant *g)
{
    if (cerb__local_dir(e))
        return file_renew(e, rec, g);
    return mem_renew(rec, g);
}

cerb_status cerb__local_guard_finish(cerb_engine *e, const cerb_guard_rec *rec, int ok,
                                     const void *result, size_t len, int64_t keep_ms,
                                     cerb_outcome *outcome)
{
    (void)outcome; /* a local step is never in doubt */
    if (cerb__local_dir(e))
        return file_finish(e, rec, ok, result, len, keep_ms);
    return mem_finish(rec, ok, result, len, keep_ms);
}

cerb_status cerb__local_guard_check(cerb_engine *e, const cerb_guard_rec *rec,
                                    cerb_guard_found *found)
{
    if (cerb__local_dir(e))
        return file_check(e, rec, found);
    return mem_check(rec, found);
}

size_t cerb__local_guard_count(void)
{
    size_t n = 0;
    for (unsigned i = 0; i < NSHARDS; i++) {
        struct gshard *s = &gshards[i];
        cerb__mutex_lock(&s->mu);
        int64_t now = cerb_monotime();
        for (size_t b = 0; b < s->nbuckets; b++)
            for (struct grec *r = s->buckets[b]; r; r = r->next)
                n += r->expires_ns > now;
        for (size_t b = 0; b < s->old_n; b++)
            for (struct grec *r = s->old[b]; r; r = r->next)
                n += r->expires_ns > now;
        cerb__mutex_unlock(&s->mu);
    }
    return n;
}

void cerb__local_guard_stats(size_t *stored, size_t *buckets)
{
    *stored = 0;
    *buckets = 0;
    for (unsigned i = 0; i < NSHARDS; i++) {
        struct gshard *s = &gshards[i];
        cerb__mutex_lock(&s->mu);
        *stored += s->count;
        *buckets += (s->nbuckets ? s->nbuckets : MIN_BUCKETS) + s->old_n;
        cerb__mutex_unlock(&s->mu);
    }
}
