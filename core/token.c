/*
 * token.c — fresh owner tokens. Uniqueness is what makes the server-side
 * compare in release and renew safe, so the bytes come from the CSPRNG
 * (OpenSSL's RAND_bytes), never from a clock or a counter.
 *
 * RAND_bytes costs a lock, a DRBG step and a getpid() fork check per call,
 * which showed up as a syscall per acquisition in the bench. So each thread
 * draws a batch of random bytes at once and hands out 16 at a time. A batch
 * must never be shared by two processes, or both would issue the same
 * tokens: a pthread_atfork child handler bumps a generation number, and a
 * thread whose batch is from an older generation throws it away. (After
 * fork() only the forking thread exists in the child, so its batch is the
 * only one that could have been copied.)
 */
#include "internal_posix.h"

#include "token.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "error.h"

#define TOKEN_BYTES (CERB_TOKEN_LEN / 2)
#define BATCH_TOKENS 32

static atomic_uint fork_generation = 1;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static _Thread_local unsigned char batch[TOKEN_BYTES * BATCH_TOKENS];
static _Thread_local unsigned batch_left;
static _Thread_local unsigned batch_generation;

static void in_child(void) { atomic_fetch_add(&fork_generation, 1); }
static void install_atfork(void) { pthread_atfork(NULL, NULL, in_child); }

unsigned cerb__fork_generation(void)
{
    pthread_once(&atfork_once, install_atfork);
    return atomic_load_explicit(&fork_generation, memory_order_relaxed);
}

cerb_status cerb__token_new(char out[CERB_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";

    pthread_once(&atfork_once, install_atfork);
    unsigned gen = atomic_load_explicit(&fork_generation, memory_order_relaxed);
    if (batch_left == 0 || batch_generation != gen) {
        if (RAND_bytes(batch, (int)sizeof batch) != 1)
            return cerb__error_set(CERB_EIO, "token: RAND_bytes failed");
        batch_left = BATCH_TOKENS;
        batch_generation = gen;
    }
    batch_left--;
    unsigned char *raw = batch + (size_t)batch_left * TOKEN_BYTES;
    for (size_t i = 0; i < TOKEN_BYTES; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    memset(raw, 0, TOKEN_BYTES); /* a used token is not kept around */
    out[CERB_TOKEN_LEN] = '\0';
    return CERB_OK;
}
