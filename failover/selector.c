/*
 * selector.c — the active-engine rule of DESIGN.md §5.
 *
 *   pinned (active = "<engine>" or a manual switch) → that engine, whatever
 *     its health: operators asked for it — once it has an instance; until
 *     it opens, the pin is a wish and the automatic rules below choose;
 *   auto, current usable → stay, except fail back to an engine earlier in
 *     configuration order once it has stayed usable for failback_after_ms
 *     (never by itself with failback = "manual");
 *   auto, current not usable → the first usable engine in order;
 *   nothing usable → stay (calls fail fast and keep feeding the breakers).
 * "Usable" is breaker CLOSED or DISABLED on an opened engine; HALF_OPEN is
 * not: only probes go there until it closes.
 */
#include "selector.h"

bool cerb__sel_usable(const struct cerb_sel_engine *e)
{
    return e->open && (e->st == CERB_BREAKER_CLOSED || e->st == CERB_BREAKER_DISABLED);
}

int cerb__select(const struct cerb_sel_in *in, const char **why)
{
    *why = NULL;
    if (in->n == 0)
        return in->current;
    if (in->pinned >= 0 && (size_t)in->pinned < in->n && in->e[in->pinned].open) {
        if (in->pinned != in->current)
            *why = "pinned";
        return in->pinned;
    }
    int cur = in->current >= 0 && (size_t)in->current < in->n ? in->current : 0;
    if (cerb__sel_usable(&in->e[cur])) {
        if (!in->failback_auto)
            return cur;
        for (int i = 0; i < cur; i++) {
            const struct cerb_sel_engine *e = &in->e[i];
            if (cerb__sel_usable(e) && in->now_ms - e->healthy_since_ms >= in->failback_after_ms) {
                *why = "failback: healthy again";
                return i;
            }
        }
        return cur;
    }
    for (size_t i = 0; i < in->n; i++) {
        if (cerb__sel_usable(&in->e[i])) {
            *why = in->e[cur].open ? "breaker open" : "engine not open";
            return (int)i;
        }
    }
    return cur;
}
