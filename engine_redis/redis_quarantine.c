/*
 * redis_quarantine.c — the warning that a server is quarantined
 * (redis_quarantine.h).
 *
 * The issue it answers: a first `cerberus run` on a new server took ten
 * seconds and printed nothing, because the engine cannot tell a new server
 * from one that restarted without its data and waits one lease either way.
 * So the warning says which server, why, until when in the server's time
 * and how long from now, and that `cerberus init` avoids the wait on a new
 * server (but not on one that lost its data, where the wait is the point).
 *
 * Once per quarantine. Each instance keeps the server time up to which its
 * last warning covers (q_said_until). A quarantine that begins before then
 * is part of the same wait as far as a reader is concerned (in a Cluster:
 * the next slot of the node, made at its first use a moment later): it
 * extends the cover, goes to the debug log and is counted; the next
 * warning says how many there were. Times are the one server's, so no
 * clock of ours is compared with it.
 */
#include "internal_posix.h"

#include "redis_quarantine.h"

#include <stdio.h>

#include "log.h"

static const char *reason(enum redis_q_why why)
{
    switch (why) {
    case REDIS_Q_MISSING:
        return "the server has no Cerberus marker: it is new, or it lost its data (a restart "
               "without persistence, FLUSHALL, eviction) and holders from before may not know "
               "yet";
    case REDIS_Q_FOUND:
        return "a quarantine another client began is in force (it found no marker, or the "
               "server's history changed)";
    case REDIS_Q_HISTORY:
        return "the server's replication id changed: a restart or a failover may have "
               "dropped the last writes, and holders from before may not know yet";
    case REDIS_Q_NO_REPLID:
        return "the marker records no replication id (written by hand or by an older "
               "version), so it may have come back with an older snapshot";
    case REDIS_Q_LOSS:
        return "the server lost its data: every hold here is LOST; idempotency-guard records "
               "written before went with it (an operation done then may run again)";
    }
    return "?";
}

void cerb__redis_quarantine_say(cerb_engine *e, enum redis_q_why why, int slot,
                                long long qend_ms, long long now_ms, const char *detail)
{
    long long left = qend_ms - now_ms;
    if (left <= 0 && why != REDIS_Q_LOSS)
        return;
    cerb__mutex_lock(&e->marker_mu);
    /* A loss in single mode is always said: every hold was just told LOST. */
    bool say = now_ms >= e->q_said_until || (why == REDIS_Q_LOSS && slot < 0);
    unsigned more = say ? e->q_unsaid : 0;
    if (say)
        e->q_unsaid = 0;
    else
        e->q_unsaid++;
    if (qend_ms > e->q_said_until)
        e->q_said_until = qend_ms;
    cerb__mutex_unlock(&e->marker_mu);

    char where[96] = "", dt[192] = "", also[96] = "";
    if (slot >= 0)
        snprintf(where, sizeof where, " in slot %d (and in each slot of this node at its first "
                 "use)", slot);
    if (detail && detail[0])
        snprintf(dt, sizeof dt, " (%s)", detail);
    if (more)
        snprintf(also, sizeof also, " [%u more quarantines here since the last warning]", more);
    if (left < 0)
        left = 0;
    if (!say) {
        CERB_LOG_D("redis %s: quarantined%s until server time %lld ms (%lld ms from now): %s%s",
                   e->where, where, qend_ms, left, reason(why), dt);
        return;
    }
    CERB_LOG_W("redis %s: quarantined: no grant%s before server time %lld ms (%lld.%03lld s "
               "from now): %s%s%s%s",
               e->where, where, qend_ms, left / 1000, left % 1000, reason(why), dt,
               why == REDIS_Q_LOSS ? ""
                                   : "; on a new server, `cerberus init` before the first "
                                     "client avoids this wait (never run it on one that lost "
                                     "its data)",
               also);
}
