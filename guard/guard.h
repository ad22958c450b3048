/*
 * guard.h — the idempotency guard's handle and its renewer, shared by the
 * files of guard/ (not installed; engines never include it).
 *
 * A handle is one answer of cerb_guard_begin(): a running attempt (its
 * claim renewed by the client's guard renewer until finish or free), a
 * duplicate (the stored result), or a degraded attempt (no record: the
 * engine could not answer and the policy allowed running unprotected).
 * Every handle of a client is on the client's guard set, so that
 * cerb_client_close() can end and free the ones still open. An attempt that
 * also claimed the record on engines switched from has a mirror handle per
 * such claim on the set too, renewed like its own claim and ended with it.
 */
#ifndef CERB_GUARD_H
#define CERB_GUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cerberus.h"
#include "engine.h"

#define CERB_GUARD_MAGIC 0x47524431u /* "GRD1" */

enum cerb_guard_kind {
    CERB_GUARD_RUNNING,   /* begun with CERB_OK; finish not yet called */
    CERB_GUARD_DUPLICATE, /* begin answered CERB_DUPLICATE */
    CERB_GUARD_FINISHED   /* finish was called (whatever it returned) */
};

struct cerb_guard {
    atomic_uint magic;
    cerb_client *client;
    cerb_guard_rec rec;            /* rec.scope points at `scope` */
    char *scope;
    int engine_idx;                /* where the record lives */
    int64_t keep_ms;               /* -1 forever */
    int64_t max_result;
    int kind;                      /* enum cerb_guard_kind */
    bool degraded;                 /* no record: the active engine could not answer */
    bool unconsulted;              /* an engine switched from could not answer (ALLOW) */
    /* Claims of this attempt on engines switched from (guard.c consult):
     * handles of their own on the renewer's list, kind RUNNING, with
     * `parent` set, ended with their parent. Their rec.scope points at
     * the parent's scope (their `scope` is NULL). */
    struct cerb_guard *parent, *mirrors, *mirror_next;
    bool tracked;                  /* on the client's set (guard_renew.c) */
    void *result;                  /* cerb__malloc'd, NUL after; or NULL */
    size_t result_len;
    /* Renewer bookkeeping, under the set's mutex. */
    struct cerb_guard *next, *prev; /* the client's guard set */
    bool renewing;                 /* its claim is renewed */
    bool busy;                     /* a renewal is on the wire */
    bool past;                     /* its deadline was declared passed */
    int64_t next_renew_ns;
    _Atomic int64_t valid_until_ns; /* conservative local end of the claim */
    /* This claim's state, VALID, SUSPECT (its last renewal failed) or LOST
     * (its deadline passed unrenewed, or the server said it is gone): LOST
     * is final. A mirror that is lost makes its attempt LOST too. */
    atomic_int cstate;
    /* The attempt's lost callback (not a mirror's), under the set's mutex;
     * called once (lost_told), as the lock's is. */
    void (*lost_cb)(struct cerb_guard *, void *);
    void *lost_ud;
    bool lost_told;
    atomic_bool ended;             /* the attempt holds no claim any more */
};

/* guard_renew.c — the client's set of guard handles and its renewer
 * thread (started with the first running attempt). */
/* Add a handle to its client's set; with renew, schedule its claim's
 * renewal from the grant. CERB_ENOMEM (or a thread error) on failure. */
cerb_status cerb__guard_track(struct cerb_guard *g, const cerb_grant *grant, bool renew);
/* Stop renewing g, waiting for a renewal on the wire (one engine call). */
void cerb__guard_stop_renew(struct cerb_guard *g);
/* Take g off its client's set (renewal stopped first). */
void cerb__guard_untrack(struct cerb_guard *g);
/* A claim of rec on engine idx that may have landed though its request
 * failed (sent at sent_ns): deleted in the background until confirmed or
 * until it must have expired. */
void cerb__guard_orphan(cerb_client *c, const cerb_guard_rec *rec, int idx, int64_t sent_ns);
/* A success not confirmed on engine idx (a mirror's done-write): written
 * in the background, with a copy of the result, until confirmed, found
 * lost, or until_ns (when the claim there may have run out). */
void cerb__guard_orphan_done(cerb_client *c, const cerb_guard_rec *rec, int idx,
                             int64_t until_ns, const void *result, size_t len, int64_t keep_ms);
/* Renew g's claim again (a finish that certainly did not land leaves the
 * attempt open), starting now. */
void cerb__guard_resume_renew(struct cerb_guard *g);
/* Client close: stop the renewer and end every handle still open (an
 * unfinished attempt is deleted as failed, once per answering engine),
 * freeing them. Safe when no guard was ever used. */
void cerb__guard_close_all(cerb_client *c);
/* The attempt's state (cerb_guard_state): its claim's and its mirrors',
 * the worst of them, read under the set's mutex. */
enum cerb_lock_state cerb__guard_state(const struct cerb_guard *g);
/* Take g's mirror list off it, under the set's mutex (free). */
struct cerb_guard *cerb__guard_take_mirrors(struct cerb_guard *g);
/* Set the attempt's lost callback (cerb_guard_on_lost). */
void cerb__guard_set_lost_cb(struct cerb_guard *g, void (*cb)(struct cerb_guard *, void *),
                             void *ud);
/* guard.c: end an open attempt as failed and free the handle's memory
 * (used by close; g is already off the set). `silent` skips the server. */
cerb_status cerb__guard_end(struct cerb_guard *g, bool silent);

#endif
