/*
 * test_token.c — owner tokens: 32 lowercase hex characters, never repeated
 * within a thread, across threads, or between a parent and a child forked
 * while the parent had unused random bytes in its batch.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_util.h"
#include "token.h"

#define N 2000

static int cmp(const void *a, const void *b) { return strcmp(a, b); }

static void test_shape_and_uniqueness(void **state)
{
    (void)state;
    static char toks[N][CERB_TOKEN_LEN + 1];
    for (int i = 0; i < N; i++) {
        assert_int_equal(cerb__token_new(toks[i]), CERB_OK);
        assert_int_equal(strlen(toks[i]), CERB_TOKEN_LEN);
        for (int j = 0; j < CERB_TOKEN_LEN; j++)
            assert_non_null(strchr("0123456789abcdef", toks[i][j]));
    }
    qsort(toks, N, sizeof toks[0], cmp);
    for (int i = 1; i < N; i++)
        assert_string_not_equal(toks[i - 1], toks[i]);
}

static void test_fork_does_not_repeat_tokens(void **state)
{
    (void)state;
    char first[CERB_TOKEN_LEN + 1], parent[CERB_TOKEN_LEN + 1], child[CERB_TOKEN_LEN + 1];
    int fds[2];
    assert_int_equal(cerb__token_new(first), CERB_OK); /* batch now has unused bytes */
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char t[CERB_TOKEN_LEN + 1];
        cerb__token_new(t);
        ssize_t w = write(fds[1], t, CERB_TOKEN_LEN);
        _exit(w == CERB_TOKEN_LEN ? 0 : 1);
    }
    close(fds[1]); /* a dead child is then end of file, not a wait forever */
    assert_int_equal(cerb__token_new(parent), CERB_OK);
    assert_int_equal(cerb_test_read_within(fds[0], child, CERB_TOKEN_LEN, 10000), CERB_TOKEN_LEN);
    child[CERB_TOKEN_LEN] = '\0';
    assert_int_equal(cerb_test_wait(pid, 10000), 0);
    assert_string_not_equal(parent, child);
    close(fds[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_and_uniqueness),
        cmocka_unit_test(test_fork_does_not_repeat_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
