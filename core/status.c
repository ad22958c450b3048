/*
 * status.c — names and texts of the status codes, generated from the one
 * X-macro list in cerberus.h so that no parallel table can fall out of step.
 */
#include "cerberus.h"

#define CERB__COUNT_ONE(name, text) +1
_Static_assert(CERB_STATUS_COUNT == 0 CERB_STATUS_MAP(CERB__COUNT_ONE),
               "status enum and CERB_STATUS_MAP disagree");

const char *cerb_strerror(cerb_status st)
{
    switch (st) {
#define CERB__TEXT(name, text) case CERB_##name: return text;
        CERB_STATUS_MAP(CERB__TEXT)
#undef CERB__TEXT
    case CERB_STATUS_COUNT:
        break;
    }
    /* After the switch on purpose: -Wswitch reports a missing case. */
    return "unknown status";
}

#define CERB__STR(x) #x
#define CERB__XSTR(x) CERB__STR(x)
const char *cerb_version(void)
{
    return CERB__XSTR(CERB_VERSION_MAJOR) "." CERB__XSTR(CERB_VERSION_MINOR) "." CERB__XSTR(
        CERB_VERSION_PATCH);
}

const char *cerb_status_name(cerb_status st)
{
    switch (st) {
#define CERB__NAME(name, text) case CERB_##name: return #name;
        CERB_STATUS_MAP(CERB__NAME)
#undef CERB__NAME
    case CERB_STATUS_COUNT:
        break;
    }
    return "UNKNOWN";
}
