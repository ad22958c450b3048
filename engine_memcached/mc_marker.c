/*
 * mc_marker.c — which memcached process a connection talks to, and the
 * quarantine after a loss (the memcached side of DESIGN.md §5a).
 *
 * memcached keeps nothing across a restart (nor across flush_all, nor an
 * evicted item), and its CAS counter starts again at 1. Two dangers follow:
 * a holder elsewhere that has not yet noticed still believes it holds a name
 * the new process would grant at once; and an old CAS sent to the new
 * process could match a new holder's item. So every new connection, before
 * any command:
 *
 *   1. `stats`: pid and start time (time - uptime, printed from one clock
 *      reading, so fixed for the life of a process), and uptime;
 *   2. `mn` and `stats settings`: the server must do what the engine relies
 *      on (meta protocol, CAS on, no evictions unless allowed) — again on
 *      every connection, so a server restarted with other flags is refused
 *      as one would be at open;
 *   3. the marker, an item under a key no lock name can produce (the binary
 *      key 0x01 "marker", sent base64 with `b`; one per server, whatever
 *      memcached.prefix), no expiry, holding
 *      "<128-bit nonce, hex> <quarantine end, server uptime seconds>". A
 *      missing one (a new process, flush_all, an eviction) is made in add
 *      mode with end = uptime + Q; when another client made it first, its
 *      marker is adopted. While the server's uptime is below the end, no
 *      name is granted: a holder that has not talked to the server since
 *      the loss is by then past its own lease and told LOST by its
 *      deadline. Q = lock.lease_ms + drift + 3 s (clients of one server
 *      share lock.lease_ms: the core refuses longer per-lock leases with
 *      memcached, as with redis); the 3 s cover memcached's coarse and late
 *      clock (mc_internal.h, cerb__mc_ttl_s). The end is turned into our
 *      monotonic clock as reply time + (end - uptime + 2) s: uptime lags
 *      real time (by up to 2 s), never leads it, so that errs long.
 *
 * The generation is (pid, start, nonce): any change starts a new one, tells
 * every hold of the instance LOST, closes the idle connections of older
 * ones, and the holds of older generations never send their CAS again
 * (mc_lock.c). Fingerprints seen are kept: a connection whose `stats` went
 * out before the current one was recorded and that reached an earlier one
 * is late (it read the old process just before it went): it is closed and
 * another opened. An earlier fingerprint read after that means two
 * processes answer at the one address (a proxy, a VIP during a rolling
 * update): fatal, every grant is refused from then on.
 */
#include "internal_posix.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "clock.h"
#include "error.h"
#include "internal.h"
#include "log.h"
#include "mc_internal.h"

cerb_status cerb__mc_marker_init(cerb_engine *e)
{
    /* One marker per server, whatever the prefix: a loss is the whole
     * server's, and clients under several prefixes then wait one
     * quarantine, not one each. No lock key can be it: a plain key has no
     * control byte, a hashed one is prefix || 0x01 || 32 bytes. */
    static const char raw[] = "\x01marker";
    int n = EVP_EncodeBlock((unsigned char *)e->mkey.k, (const unsigned char *)raw,
                            (int)sizeof raw - 1);
    e->mkey.k[n] = '\0';
    e->mkey.b64 = true;
    int64_t lease = e->cfg->lock.lease_ms;
    int64_t q_ms = lease + lease * CERB_DRIFT_PERMILLE / 1000 + CERB_DRIFT_FIXED_MS + 3000;
    e->q_s = (q_ms + 999) / 1000;
    return CERB_OK;
}

/* ---- the server's settings ---- */

struct settings {
    int evictions; /* 1 on, 0 off, -1 not said */
    int cas;       /* 1 yes, 0 no, -1 not said */
    int automove;  /* slab_automove: 0 off, >0 on, -1 not said */
};

static void settings_line(void *ud, const char *line)
{
    struct settings *s = ud;
    int v;
    if (strcmp(line, "STAT evictions on") == 0)
        s->evictions = 1;
    else if (strcmp(line, "STAT evictions off") == 0)
        s->evictions = 0;
    else if (strcmp(line, "STAT cas_enabled yes") == 0)
        s->cas = 1;
    else if (strcmp(line, "STAT cas_enabled no") == 0)
        s->cas = 0;
    else if (sscanf(line, "STAT slab_automove %d", &v) == 1)
        s->automove = v;
}

static cerb_status check_settings(cerb_engine *e, struct mc_conn *c, int64_t dl,
                                  struct settings *s)
{
    struct mc_reply r;
    bool sent;
    cerb_status st = cerb__mc_call(c, "mn\r\n", 4, dl, &r, &sent);
    if (st == CERB_EPROTO || (st == CERB_OK && strcmp(r.code, "MN") != 0))
        return cerb__error_set(CERB_ECONFIG,
                               "memcached: %s:%s does not speak the meta protocol (memcached "
                               "1.6 or later is needed for owner-checked release and renew)",
                               e->host, e->port);
    if (st != CERB_OK)
        return st;
    *s = (struct settings){-1, -1, -1};
    st = cerb__mc_call_lines(c, "stats settings\r\n", dl, settings_line, s);
    if (st != CERB_OK)
        return st;
    if (s->cas == 0)
        return cerb__error_set(CERB_ECONFIG,
                               "memcached: %s:%s runs with CAS disabled (-C): release and renew "
                               "are checked by CAS; start it without -C",
                               e->host, e->port);
    if (s->evictions == 1 && !e->mc->allow_evictions)
        return cerb__error_set(CERB_ECONFIG,
                               "memcached: %s:%s evicts items when memory is short (evictions "
                               "on): a lock could vanish before its lease ends and another "
                               "client take it; start memcached with -M (--disable-evictions), "
                               "or give locks a dedicated instance and set "
                               "memcached.allow_evictions = true",
                               e->host, e->port);
    return CERB_OK;
}

/* ---- stats ---- */

struct fp_read {
    long pid;
    long long time, uptime;
    int seen;
};

static void fp_line(void *ud, const char *line)
{
    struct fp_read *f = ud;
    if (sscanf(line, "STAT pid %ld", &f->pid) == 1)
        f->seen |= 1;
    else if (sscanf(line, "STAT uptime %lld", &f->uptime) == 1)
        f->seen |= 2;
    else if (sscanf(line, "STAT time %lld", &f->time) == 1)
        f->seen |= 4;
}

/* ---- the marker ---- */

static bool parse_marker(const struct mc_reply *r, char *nonce, long long *qend)
{
    char extra;
    if (strcmp(r->code, "VA") != 0 || r->vlen < 34 || r->vlen > 60)
        return false;
    if (sscanf(r->value, "%32[0-9a-f] %lld%c", nonce, qend, &extra) != 2 || strlen(nonce) != 32)
        return false;
    return *qend >= 0;
}

/* Read the marker, or make it (end = uptime + Q) when missing. */
static cerb_status marker_fetch(cerb_engine *e, struct mc_conn *c, int64_t dl, long long uptime,
                                char *nonce, long long *qend, bool *made)
{
    char req[512];
    struct mc_reply r;
    bool sent;
    *made = false;
    for (int i = 0; i < 3; i++) {
        size_t len = cerb__mc_fmt(req, sizeof req, "mg", &e->mkey, "v");
        cerb_status st = cerb__mc_call(c, req, len, dl, &r, &sent);
        if (st != CERB_OK)
            return st;
        if (strcmp(r.code, "VA") == 0) {
            if (!parse_marker(&r, nonce, qend))
                return cerb__error_set(CERB_EPROTO,
                                       "memcached: %s:%s: the Cerberus marker holds \"%s\", not "
                                       "\"<nonce> <end>\" (written by something else?)",
                                       e->host, e->port, r.value);
            return CERB_OK;
        }
        if (strcmp(r.code, "EN") != 0)
            return cerb__mc_unexpected("mg (marker)", &r);
        unsigned char rnd[16];
        if (RAND_bytes(rnd, sizeof rnd) != 1)
            return cerb__error_set(CERB_EIO, "memcached: no random bytes for the marker");
        char value[64];
        for (size_t k = 0; k < sizeof rnd; k++)
            snprintf(value + 2 * k, 3, "%02x", rnd[k]);
        snprintf(value + 32, sizeof value - 32, " %lld", uptime + (long long)e->q_s);
        /* Add mode, no T: no expiry. */
        int n = snprintf(req, sizeof req, "ms %s %zu ME b\r\n%s\r\n", e->mkey.k, strlen(value),
                         value);
        if (n <= 0 || (size_t)n >= sizeof req)
            return cerb__error_set(CERB_EINVAL, "memcached: marker request too long");
        st = cerb__mc_call(c, req, (size_t)n, dl, &r, &sent);
        if (st != CERB_OK)
            return st;
        if (strcmp(r.code, "HD") == 0) {
            memcpy(nonce, value, 32);
            nonce[32] = '\0';
            *qend = uptime + e->q_s;
            *made = true;
            return CERB_OK;
        }
        if (strcmp(r.code, "NS") != 0)
            return cerb__mc_unexpected("ms (marker)", &r);
        /* Another client made it first: read theirs. */
    }
    return cerb__error_set(CERB_EIO, "memcached: %s:%s: the marker kept vanishing", e->host,
                           e->port);
}

/* ---- generations ---- */

static bool fp_eq(const struct mc_fp *a, const struct mc_fp *b)
{
    return a->pid == b->pid && a->start == b->start && strcmp(a->nonce, b->nonce) == 0;
}

static bool fp_seen(const cerb_engine *e, const struct mc_fp *f)
{
    for (int i = 0; i < e->n_seen && i < MC_SEEN_MAX; i++)
        if (fp_eq(&e->seen[i], f))
            return true;
    return false;
}

static void say_quarantine(cerb_engine *e, bool made, long long secs)
{
    CERB_LOG_W("memcached %s:%s: quarantined: no grant for %lld s of server time: %s; on a new "
               "server, `cerberus init` before the first client avoids this wait (never run it "
               "on one that lost its items)",
               e->host, e->port, secs,
               made ? "the server has no Cerberus marker: it is new, or it restarted or lost its "
                      "items (flush_all, eviction), and holders from before may not know yet"
                    : "a quarantine another client began is in force (it found no marker)");
}

cerb_status cerb__mc_fingerprint(cerb_engine *e, struct mc_conn *c, int64_t dl, bool *late)
{
    *late = false;
    if (atomic_load(&e->fatal))
        return cerb__error_set(CERB_EPROTO, "%s", e->fatal_why);
    int64_t sent_ns = cerb_monotime();
    struct fp_read f = {0, 0, 0, 0};
    cerb_status st = cerb__mc_call_lines(c, "stats\r\n", dl, fp_line, &f);
    if (st != CERB_OK)
        return st;
    if (f.seen != 7)
        return cerb__error_set(CERB_EPROTO, "memcached: `stats` lacks pid, uptime or time");
    struct settings s;
    st = check_settings(e, c, dl, &s);
    if (st != CERB_OK)
        return st;
    struct mc_fp fp = {.pid = f.pid, .start = f.time - f.uptime};
    long long qend = 0;
    bool made = false;
    st = marker_fetch(e, c, dl, f.uptime, fp.nonce, &qend, &made);
    if (st != CERB_OK)
        return st;
    int64_t recv_ns = cerb_monotime();
    int64_t q_until = qend > f.uptime ? recv_ns + (qend - f.uptime + 2) * CERB_NS_PER_MS * 1000
                                      : 0;

    cerb__mutex_lock(&e->fp_mu);
    if (e->fp_known && fp_eq(&fp, &e->fp)) {
        c->gen = atomic_load(&e->gen);
        if (q_until > atomic_load(&e->q_until_ns))
            atomic_store(&e->q_until_ns, q_until);
        cerb__mutex_unlock(&e->fp_mu);
        return CERB_OK;
    }
    if (e->fp_known && fp_seen(e, &fp)) {
        if (sent_ns < e->fp_since_ns) {
            /* Read from a process before the current one was recorded. */
            cerb__mutex_unlock(&e->fp_mu);
            *late = true;
            return cerb__error_set(CERB_EIO, "memcached: %s:%s: a late connection to an earlier "
                                   "server process", e->host, e->port);
        }
        snprintf(e->fatal_why, sizeof e->fatal_why,
                 "memcached: two memcached processes answer at %s:%s (pid %ld and pid %ld, "
                 "alternately): each could grant the same name; every grant is refused (check "
                 "for a proxy or a shared address in front of memcached)",
                 e->host, e->port, fp.pid, e->fp.pid);
        atomic_store(&e->fatal, true);
        cerb__mutex_unlock(&e->fp_mu);
        CERB_LOG_E("%s", e->fatal_why);
        if (e->env.event)
            e->env.event(e->env.ud, CERB_EV_LOST, NULL, NULL);
        return cerb__error_set(CERB_EPROTO, "%s", e->fatal_why);
    }
    /* A process (or a marker) not seen before: a new generation. */
    bool first = !e->fp_known;
    struct mc_fp was = e->fp;
    uint64_t g = atomic_fetch_add(&e->gen, 1) + 1;
    e->fp = fp;
    e->fp_known = true;
    e->fp_since_ns = cerb_monotime();
    e->seen[e->n_seen % MC_SEEN_MAX] = fp;
    e->n_seen++;
    atomic_store(&e->q_until_ns, q_until);
    c->gen = g;
    if (!first) {
        atomic_fetch_add(&e->stats.restarts, 1);
        CERB_LOG_W("memcached: %s:%s is another server process or lost its items (pid %ld "
                   "started at %lld, marker %.8s…; was pid %ld started at %lld, marker %.8s…): "
                   "every hold there is lost (generation %llu)",
                   e->host, e->port, fp.pid, fp.start, fp.nonce, was.pid, was.start, was.nonce,
                   (unsigned long long)g);
        if (e->env.event)
            e->env.event(e->env.ud, CERB_EV_LOST, NULL, NULL);
        cerb__mc_pool_drop_older(e, g);
    }
    if (s.automove > 0 && e->warned_gen != g)
        CERB_LOG_W("memcached: %s:%s moves slab pages (slab_automove %d): a page move can evict "
                   "live items even with -M, and a lock with them; start memcached with "
                   "-o slab_automove=0",
                   e->host, e->port, s.automove);
    e->warned_gen = g;
    bool say = q_until > 0 && e->q_said_gen != g;
    e->q_said_gen = g;
    cerb__mutex_unlock(&e->fp_mu);
    if (say)
        say_quarantine(e, made, qend - f.uptime);
    return CERB_OK;
}

int64_t cerb__mc_quarantine_left(cerb_engine *e, uint64_t gen)
{
    if (gen != atomic_load(&e->gen))
        return 0;
    int64_t left = atomic_load(&e->q_until_ns) - cerb_monotime();
    return left > 0 ? (left + CERB_NS_PER_MS - 1) / CERB_NS_PER_MS : 0;
}

bool cerb__mc_gen_nonce(cerb_engine *e, uint64_t gen, char *out)
{
    cerb__mutex_lock(&e->fp_mu);
    bool ok = e->fp_known && gen == atomic_load(&e->gen);
    if (ok)
        memcpy(out, e->fp.nonce, 33);
    cerb__mutex_unlock(&e->fp_mu);
    return ok;
}

void cerb__mc_marker_suspect(cerb_engine *e)
{
    cerb__mc_pool_drop_older(e, UINT64_MAX);
}
