/*
 * test.h — the few macros every unit test uses.
 *
 * A test file defines static void test_x(void) functions and a main that
 * runs them with RUN(test_x) and returns test_summary(). A failing CHECK
 * prints the expression, file and line and marks the current test failed but
 * keeps going, so one run shows every failure. Each executable is one CTest
 * test; CTest prints the closing count of the suite.
 */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

/* unused in a file that only includes this header for RUN or test_summary */
__attribute__((unused)) static int test_failures_total, test_failed_now, tests_run, tests_failed;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);         \
            test_failed_now = 1;                                                      \
            test_failures_total++;                                                    \
        }                                                                             \
    } while (0)

/* CHECK with a printf-style explanation of the values involved. */
#define CHECKF(cond, ...)                                                             \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            test_failed_now = 1;                                                      \
            test_failures_total++;                                                    \
        }                                                                             \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
    CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %.3g)",       \
           (double)(a), (double)(b), (double)(tol))

#define RUN(fn)                                                                       \
    do {                                                                              \
        test_failed_now = 0;                                                          \
        fn();                                                                         \
        tests_run++;                                                                  \
        if (test_failed_now) tests_failed++;                                          \
        printf("%s %s\n", test_failed_now ? "FAIL" : "ok  ", #fn);                    \
    } while (0)

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", tests_run - tests_failed, tests_failed);
    return tests_failed ? 1 : 0;
}

#endif
