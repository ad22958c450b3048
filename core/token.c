/*
 * token.c — fresh owner tokens from RAND_bytes. Uniqueness is what makes the
 * server-side compare in release and renew safe, so the bytes come from a
 * CSPRNG, not from a clock or a counter.
 */
#include "token.h"

#include <openssl/rand.h>

#include "error.h"

cerb_status cerb__token_new(char out[CERB_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[CERB_TOKEN_LEN / 2];

    if (RAND_bytes(raw, (int)sizeof raw) != 1)
        return cerb__error_set(CERB_EIO, "token: RAND_bytes failed");
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[CERB_TOKEN_LEN] = '\0';
    return CERB_OK;
}
