/*
 * guard_cancel.c — cerb_guard_begin_ex: a guard attempt's begin with a
 * cancel.
 *
 * A begin sends a bounded number of requests, each bounded by an operation
 * timeout, so it is not interrupted midway: a cancel fired before the call
 * returns ends it with CERB_INTERRUPTED, and whatever it got is given up
 * first — a claim it took is finished as failed (its record deleted, so a
 * retry may begin at once), a duplicate's answer dropped.
 */
#include "internal_posix.h"

#include "error.h"
#include "internal.h"

cerb_status cerb_guard_begin_ex(cerb_client *c, const char *scope, const void *key,
                                size_t key_len, const cerb_guard_opts *opts, cerb_cancel *cancel,
                                cerb_guard **out)
{
    if (!out)
        return cerb__cancel_note(cancel,
                                 cerb__error_set(CERB_EINVAL, "cerb_guard_begin_ex: out is NULL"));
    *out = NULL;
    if (!cancel)
        return cerb_guard_begin(c, scope, key, key_len, opts, out);
    cerb_status st = cerb__cancel_attach(cancel, NULL);
    if (st != CERB_OK)
        return st;
    st = cerb_guard_begin(c, scope, key, key_len, opts, out);
    if (cerb_cancel_fired(cancel) && (st == CERB_OK || st == CERB_DUPLICATE)) {
        cerb_guard *g = *out;
        *out = NULL;
        cerb_status fs = st == CERB_OK ? cerb_guard_finish(g, 0, NULL, 0) : CERB_OK;
        cerb_guard_free(g);
        st = cerb__error_set(CERB_INTERRUPTED, "cancelled; %s",
                             st == CERB_DUPLICATE ? "the duplicate's answer was dropped"
                             : fs == CERB_OK      ? "the claim taken meanwhile was given up"
                                                  : "the claim taken meanwhile is deleted in the "
                                                    "background (or ends with its running time)");
    } else if (cerb_cancel_fired(cancel) && st != CERB_INTERRUPTED) {
        char why[CERB_ERROR_MAX];
        cerb__error_copy(why, sizeof why);
        st = cerb__error_set(CERB_INTERRUPTED, "cancelled (%s: %s)", cerb_status_name(st), why);
    }
    cerb__cancel_detach(cancel, st);
    return st;
}
