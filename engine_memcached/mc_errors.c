/*
 * mc_errors.c — the one place where what memcached answered (or failed to)
 * becomes a cerb_status and an outcome.
 *
 * A reply code the command cannot give is a protocol error (CERB_EPROTO,
 * with the line). A call that failed on the wire or ran out of time is
 * CERB_EIO; its outcome is UNKNOWN as soon as one byte of the request left
 * (the server may have run it, and its answer is lost with the connection,
 * which mc_conn.c closes), NO otherwise.
 */
#include "internal_posix.h"

#include "error.h"
#include "mc_internal.h"

cerb_status cerb__mc_unexpected(const char *what, const struct mc_reply *r)
{
    return cerb__error_set(CERB_EPROTO, "memcached: %s: unexpected reply \"%s\"", what, r->code);
}

cerb_outcome cerb__mc_outcome(bool sent)
{
    return sent ? CERB_OUTCOME_UNKNOWN : CERB_OUTCOME_NO;
}
