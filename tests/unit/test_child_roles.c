/*
 * test_child_roles.c — the suites' child processes (test_util.h): a role
 * started by cerb_test_spawn_self() while the suite runs threads starts
 * threads of its own (a fork of such a process cannot under
 * ThreadSanitizer, which killed integration_zk_guard's children and left
 * the suite waiting for them), keeps only the descriptors it is given, and
 * cannot start roles itself; cerb_test_read_within() sees a dead child as
 * end of file at once and gives up on a silent one at its deadline. The
 * ThreadSanitizer pass of scripts/test.sh runs this suite (label forks).
 */
#include "internal_posix.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_util.h"

/* Role "threads" (report_fd): starts and joins a thread, says 't'. */
static void *nothing(void *arg)
{
    return arg;
}

static int threads_role(int argc, char **argv)
{
    if (argc != 1)
        return 99;
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 100;
    return write(atoi(argv[0]), "t", 1) == 1 ? 0 : 101;
}

/* Role "fds" (report_fd, kept_fd, other_fd): says whether kept_fd is open
 * and other_fd closed ('y') or not ('n'). */
static int fds_role(int argc, char **argv)
{
    if (argc != 3)
        return 99;
    bool kept = fcntl(atoi(argv[1]), F_GETFD) >= 0;
    bool other = fcntl(atoi(argv[2]), F_GETFD) >= 0 || errno != EBADF;
    return write(atoi(argv[0]), kept && !other ? "y" : "n", 1) == 1 ? 0 : 101;
}

/* Role "nested" (report_fd): says 'y' when it may not start a role. */
static int nested_role(int argc, char **argv)
{
    if (argc != 1)
        return 99;
    pid_t p = cerb_test_spawn_self("threads", NULL, NULL);
    bool refused = p < 0 && errno == EPERM;
    if (p > 0)
        cerb_test_wait(p, 5000);
    return write(atoi(argv[0]), refused ? "y" : "n", 1) == 1 ? 0 : 101;
}

/* Role "quiet": exits at once, saying nothing. */
static int quiet_role(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 3;
}

static const struct cerb_test_role roles[] = {
    {"threads", threads_role},
    {"fds", fds_role},
    {"nested", nested_role},
    {"quiet", quiet_role},
    {NULL, NULL},
};

/* A thread of the suite's that lives while a child is started. */
struct sleeper {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
};

static void *sleeper_main(void *arg)
{
    struct sleeper *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Start @role with the write end of a new pipe (plus @extra args), and
 * return its one-byte answer, read within 20 s ('?' on none). */
static char ask(const char *role, const char *extra1, const char *extra2, const int *extra_keep)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    char w[16];
    snprintf(w, sizeof w, "%d", p[1]);
    char *args[] = {w, (char *)extra1, (char *)extra2, NULL};
    int keep[] = {p[1], extra_keep ? *extra_keep : -1, -1};
    pid_t pid = cerb_test_spawn_self(role, args, keep);
    assert_true(pid > 0);
    close(p[1]);
    char b = '?';
    ssize_t k = cerb_test_read_within(p[0], &b, 1, 20000);
    close(p[0]);
    assert_int_equal(cerb_test_wait(pid, 20000), 0);
    return k == 1 ? b : '?';
}

static void test_role_starts_threads_while_the_suite_runs_threads(void **state)
{
    (void)state;
    struct sleeper s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, sleeper_main, &s), 0);
    char b = ask("threads", NULL, NULL, NULL);
    pthread_mutex_lock(&s.mu);
    s.stop = true;
    pthread_cond_signal(&s.cv);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(b, 't');
}

static void test_role_keeps_only_the_descriptors_given(void **state)
{
    (void)state;
    int kept[2], other[2];
    assert_int_equal(pipe(kept), 0);
    assert_int_equal(pipe(other), 0);
    char k[16], o[16];
    snprintf(k, sizeof k, "%d", kept[0]);
    snprintf(o, sizeof o, "%d", other[0]);
    assert_int_equal(ask("fds", k, o, &kept[0]), 'y');
    close(kept[0]);
    close(kept[1]);
    close(other[0]);
    close(other[1]);
}

static void test_role_cannot_start_roles(void **state)
{
    (void)state;
    assert_int_equal(ask("nested", NULL, NULL, NULL), 'y');
}

static void test_dead_child_is_end_of_file_at_once(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    int keep[] = {p[1], -1};
    pid_t pid = cerb_test_spawn_self("quiet", NULL, keep);
    assert_true(pid > 0);
    close(p[1]);
    int64_t t0 = cerb_test_now_ms();
    char b;
    assert_int_equal(cerb_test_read_within(p[0], &b, 1, 20000), 0);
    assert_true(cerb_test_now_ms() - t0 < 10000);
    assert_int_equal(cerb_test_wait(pid, 10000), 3);
    close(p[0]);
}

static void test_silent_writer_times_out(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    int64_t t0 = cerb_test_now_ms();
    char b;
    errno = 0;
    assert_int_equal(cerb_test_read_within(p[0], &b, 1, 200), -1);
    assert_int_equal(errno, ETIMEDOUT);
    assert_true(cerb_test_now_ms() - t0 >= 200);
    close(p[0]);
    close(p[1]);
}

int main(int argc, char **argv)
{
    cerb_test_roles(argc, argv, roles);
    cerb_test_debug_aids();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_role_starts_threads_while_the_suite_runs_threads),
        cmocka_unit_test(test_role_keeps_only_the_descriptors_given),
        cmocka_unit_test(test_role_cannot_start_roles),
        cmocka_unit_test(test_dead_child_is_end_of_file_at_once),
        cmocka_unit_test(test_silent_writer_times_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
