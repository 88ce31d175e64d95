/* A minimal test harness: CHECK records a failure and goes on; tests end with check_done(),
 * which prints "N passed, M failed" and returns the exit status (77 = skipped, for ctest). */
#ifndef TLLM_CHECK_H
#define TLLM_CHECK_H

#include <stddef.h>
#include <stdio.h>

extern int check_passed, check_failed;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (cond) {                                                               \
            check_passed++;                                                       \
        } else {                                                                  \
            check_failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

#define CHECK_SKIP 77

int check_done(void);

/* A whole file in a NUL-terminated heap buffer (NULL if unreadable); *n = its length. */
char *check_slurp(const char *path, size_t *n);

#endif
