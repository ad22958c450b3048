/*
 * etcd_queue.h — what etcd_queue.c (the members of a queued primitive),
 * etcd_semaphore.c (the stored limit, the semaphore table) and
 * etcd_rwlock.c (the read-write lock table) share. The layouts are in
 * etcd_queue.c's opening comment and in docs/semaphore.md, docs/rwlock.md.
 */
#ifndef CERB_ETCD_QUEUE_H
#define CERB_ETCD_QUEUE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* The keys of one member (one allocation, NUL-terminated strings). */
struct etcd_qkeys {
    char *k;            /* the member's key */
    size_t len;
    char *q;            /* the queue: members are [q, q_end) */
    size_t q_len;
    char *q_end;
    size_t q_end_len;
    char *b;            /* the blocking range [b, b_end): q, or q + "write/" */
    size_t b_len;
    char *b_end;
    size_t b_end_len;
    char *lim;          /* semaphore: <prefix><name>.limit; else NULL */
    size_t lim_len;
    char *mem;
};

/* The keys for a member of `prim` on `name` in `variant` (read-write:
 * enum cerb_rw_mode), put with `lease`; the token-named key when alt (a
 * read-write lock member always has it). CERB_OK or CERB_ENOMEM. */
cerb_status cerb__etcd_qkeys_init(struct etcd_qkeys *qk, const char *prefix, int prim,
                                  const char *name, int variant, int64_t lease,
                                  const char *token, bool alt);
void cerb__etcd_qkeys_free(struct etcd_qkeys *qk);

/* A member's value: "<offset>" or "<offset>,<count>" (count > 1). Its
 * length in buf, 0 when buf is too small. Parse: *off -1 when the value
 * holds no offset (etcdctl's empty one); *count 1 unless it says more. */
size_t cerb__etcd_qvalue_format(int64_t off, unsigned count, char *buf, size_t n);
void cerb__etcd_qvalue_parse(const char *v, size_t n, int64_t *off, unsigned *count);

/* The queue methods, for both tables (prim in lk or as an argument). */
cerb_status cerb__etcd_queue_acquire(cerb_engine *e, cerb_engine_lock *lk, int64_t deadline_ns,
                                     const atomic_int *interrupted, cerb_grant *grant);
cerb_status cerb__etcd_queue_release(cerb_engine *e, cerb_engine_lock *lk);
cerb_status cerb__etcd_queue_check(cerb_engine *e, cerb_engine_lock *lk, cerb_grant *grant);
cerb_status cerb__etcd_queue_held(cerb_engine *e, int prim, const char *name);
cerb_status cerb__etcd_queue_inspect(cerb_engine *e, int prim, const char *name,
                                     struct cerb_holders *out);

/* ---- the stored limit (etcd_semaphore.c) ---- */

/* How the acquire txn treats the limit key L. */
enum etcd_qlimit_mode {
    ETCD_QLIMIT_EQUAL,   /* compare value(L) == ours */
    ETCD_QLIMIT_CREATE,  /* L absent: compare that, put ours with the member */
    ETCD_QLIMIT_RESET    /* L another, queue empty: compare both, put ours */
};
struct etcd_qlimit {
    enum etcd_qlimit_mode mode;
    int64_t mod;         /* RESET: L's mod revision as read */
};
void cerb__etcd_qlimit_start(struct etcd_qlimit *l);
/* Append the txn's compares / success puts / failure reads for the limit
 * (0, or -1 when out of memory). */
int cerb__etcd_qlimit_cmp(cerb_engine *e, const cerb_engine_lock *lk,
                          const struct etcd_qkeys *qk, const struct etcd_qlimit *l,
                          json_t *cmp);
int cerb__etcd_qlimit_put(const cerb_engine_lock *lk, const struct etcd_qkeys *qk,
                          const struct etcd_qlimit *l, json_t *succ);
int cerb__etcd_qlimit_reads(const struct etcd_qkeys *qk, json_t *fail);
/* Learn from a failed txn's responses (L at `at`, the queue's count at
 * at + 1) how to send it next: *changed when the mode or revision moved;
 * CERB_ECONFIG naming both limits when another is stored and the queue
 * has members; CERB_EPROTO. */
cerb_status cerb__etcd_qlimit_learn(cerb_engine *e, const cerb_engine_lock *lk,
                                    const json_t *responses, size_t at, struct etcd_qlimit *l,
                                    bool *changed);
/* The limit in a read of L (1, etcdctl lock's, when absent). */
cerb_status cerb__etcd_qlimit_parse(const json_t *range, int64_t *limit);

#endif
