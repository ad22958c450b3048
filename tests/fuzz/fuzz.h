/*
 * fuzz.h — what the harnesses of tests/fuzz/ share.
 *
 * A harness is a libFuzzer target: LLVMFuzzerTestOneInput() takes one input
 * and returns 0; a finding is an abort() (FUZZ_CHECK), a sanitizer report or
 * a leak, which libFuzzer and the replay main (replay_main.c) both turn into
 * a failure. The checks are properties that must hold for every input, not
 * expected outputs: the corpus holds real inputs, the fuzzer mutates them.
 */
#ifndef CERB_FUZZ_H
#define CERB_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Abort with the failed property and the harness' explanation. */
#define FUZZ_CHECK(cond, ...)                                                    \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "fuzz: %s:%d: property failed: %s\n", __FILE__,      \
                    __LINE__, #cond);                                            \
            fprintf(stderr, "fuzz: " __VA_ARGS__);                               \
            fputc('\n', stderr);                                                 \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* data[0..size) as a NUL-terminated heap string (free it); embedded NULs
 * end it early, as they would for any C string API. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    if (size)
        memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* Lock names: the contract of cerberus.h (1..255 bytes, no control
 * character), written independently of core/lock.c. */
#define FUZZ_NAME_MAX 255
static inline bool fuzz_name_contract_ok(const char *s, size_t n)
{
    if (n == 0 || n > FUZZ_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
            return false;
    return true;
}

#endif
