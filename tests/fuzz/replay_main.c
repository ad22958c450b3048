/*
 * replay_main.c — main() for a libFuzzer harness built without libFuzzer.
 *
 * The normal build (gcc, ASan+UBSan) links every harness of tests/fuzz/ with
 * this file instead of -fsanitize=fuzzer, and ctest runs it on the kept
 * corpus: each argument is a file or a directory of files, and each file is
 * one input, passed to LLVMFuzzerTestOneInput() exactly as libFuzzer would
 * (a heap copy of exactly its size, so the sanitizers see a read past the
 * end). A harness signals a finding by aborting, as under libFuzzer. Files
 * are replayed in name order, so a failure is reproducible; no input at all
 * is an error (a corpus path that moved must not pass silently).
 */
#include "internal_posix.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat sb;

    if (!f || fstat(fileno(f), &sb) != 0) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replay every regular file of dir (not recursive); returns the count or -1. */
static long replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char **names = NULL;
    size_t n = 0, cap = 0;
    long done = 0;

    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s\n", dir);
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof *names);
            if (!names)
                abort();
        }
        names[n] = strdup(de->d_name);
        if (!names[n++])
            abort();
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && done >= 0; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            done = replay_file(path) == 0 ? done + 1 : -1;
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return done;
}

int main(int argc, char **argv)
{
    long total = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        long n;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        n = S_ISDIR(sb.st_mode) ? replay_dir(argv[i]) : replay_file(argv[i]) == 0 ? 1 : -1;
        if (n < 0)
            return 1;
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no input found\n");
        return 1;
    }
    printf("replay: %ld inputs, no finding\n", total);
    return 0;
}
