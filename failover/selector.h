/*
 * selector.h — which engine new acquisitions go to. A pure function of the
 * engines' health and the time (given, never read), so every rule can be
 * tested with a fake clock.
 */
#ifndef CERB_SELECTOR_H
#define CERB_SELECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cerberus.h"

struct cerb_sel_engine {
    bool open;                 /* an engine instance exists */
    enum cerb_breaker_state st;
    int64_t healthy_since_ms;  /* when it last became usable */
};

struct cerb_sel_in {
    size_t n;
    const struct cerb_sel_engine *e;
    int current;
    int pinned;                /* -1: auto */
    bool failback_auto;
    int64_t failback_after_ms;
    int64_t now_ms;
};

/* Usable for new acquisitions: open, breaker closed or disabled. */
bool cerb__sel_usable(const struct cerb_sel_engine *e);

/*
 * The engine to use: the pinned one if pinned; else the current one while
 * usable, unless an engine earlier in configuration order has been usable
 * for failback_after_ms (and failback is automatic); else the first usable
 * one in order; else the current one (nothing better to do). *why is set to
 * a static reason when the answer differs from `current`.
 */
int cerb__select(const struct cerb_sel_in *in, const char **why);

#endif
