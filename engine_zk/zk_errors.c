/*
 * zk_errors.c — ZooKeeper result codes to cerb_status, in exactly one
 * function.
 *
 * The C client reports trouble in two places: the return value of a zoo_a*
 * call (the request was refused before it was queued: bad path, handle
 * closing or expired, no memory) and the rc of its completion (the server's
 * answer, or ZCONNECTIONLOSS / ZCLOSING when the connection went away with
 * the request in flight). Only the second kind can leave a write in doubt:
 * a create that was written to the socket may have been applied even though
 * no answer came, so its outcome is UNKNOWN and the mutex layer settles it
 * (zk_cleanup.c: list the parent, adopt the child carrying our uuid and our
 * session). Every other failure certainly changed nothing.
 */
#include "internal_posix.h"

#include "zk_errors.h"

#include <zookeeper/zookeeper.h>

#include "error.h"

bool cerb__zk_rc_ambiguous(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZCLOSING ||
           rc == CERB_ZK_RC_ABANDONED;
}

bool cerb__zk_rc_is_answer(int rc)
{
    /* Server errors are numbered from ZAPIERROR down; ZOK is an answer. A
     * few "API errors" are made up by the client (closing, nothing, no
     * watcher), not answers. */
    if (rc == ZOK)
        return true;
    return rc < ZAPIERROR && rc != ZCLOSING && rc != ZNOTHING && rc != ZSESSIONEXPIRED &&
           rc != ZAUTHFAILED && rc > CERB_ZK_RC_NOMEM;
}

static const char *rc_text(int rc)
{
    if (rc == CERB_ZK_RC_NOMEM)
        return "out of memory";
    if (rc == CERB_ZK_RC_ABANDONED)
        return "no answer in time";
    return zerror(rc);
}

cerb_status cerb__zk_fail(const char *hosts, const char *what, const char *path, int rc,
                          bool sent, cerb_outcome *outcome)
{
    cerb_outcome oc = CERB_OUTCOME_NO;
    cerb_status st;

    switch (rc) {
    case ZCONNECTIONLOSS:
    case ZOPERATIONTIMEOUT:
    case ZCLOSING:
    case CERB_ZK_RC_ABANDONED:
        st = CERB_EIO;
        if (sent)
            oc = CERB_OUTCOME_UNKNOWN;
        break;
    case ZSESSIONEXPIRED:
    case ZSESSIONMOVED:
    case ZINVALIDSTATE:
    case ZTHROTTLEDOP:
    case ZNOTREADONLY:
    case ZSYSTEMERROR:
    case ZSSLCONNECTIONERROR:
    case ZSESSIONCLOSEDREQUIRESASLAUTH:
        st = CERB_EIO;
        break;
    case ZNOAUTH:
    case ZAUTHFAILED:
    case ZINVALIDACL:
        st = CERB_EIO;
        break;
    case ZBADARGUMENTS:
        st = CERB_EINVAL;
        break;
    case ZMARSHALLINGERROR:
    case CERB_ZK_RC_NOMEM:
        st = CERB_ENOMEM;
        break;
    default:
        st = CERB_EPROTO;
        break;
    }
    if (outcome)
        *outcome = oc;
    return cerb__error_set(st, "zk %s: %s%s%s: %s", hosts, what, path ? " " : "",
                           path ? path : "", rc_text(rc));
}
