/*
 * token.h — owner tokens: 16 random bytes from the OS CSPRNG (through
 * libcrypto) as 32 lowercase hex characters, fresh per acquisition. The same
 * shape as redis-py's Lock tokens, so the two are indistinguishable on the
 * wire.
 */
#ifndef CERB_TOKEN_H
#define CERB_TOKEN_H

#include "cerberus.h"

#define CERB_TOKEN_LEN 32

/* Fill out[33] with a fresh token. CERB_EIO if the CSPRNG fails. */
cerb_status cerb__token_new(char out[CERB_TOKEN_LEN + 1]);
/* Bumped in the child by every fork(): a client remembers the value it was
 * opened under, and refuses calls from a forked child (its threads and
 * connections stayed in the parent; its holds are the parent's). */
unsigned cerb__fork_generation(void);

#endif
