/* harness.h — a tiny test harness: each test function reports "ok"/"not ok" lines that
 * tests/run_all.sh counts. A test binary exits non-zero if any check failed. */
#ifndef DEADPOOL_TEST_HARNESS_H
#define DEADPOOL_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int th_failed_checks;
static int th_passed, th_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "  check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            th_failed_checks++;                                                 \
        }                                                                       \
    } while (0)

#define RUN_TEST(fn)                                                            \
    do {                                                                        \
        int before_ = th_failed_checks;                                         \
        fn();                                                                   \
        if (th_failed_checks == before_) { th_passed++; printf("ok - %s\n", #fn); } \
        else { th_failed++; printf("not ok - %s\n", #fn); }                     \
        fflush(stdout);                                                         \
    } while (0)

#define TEST_MAIN_END() return th_failed ? 1 : 0

/* Resident memory of this process in bytes (0 if /proc cannot tell): tests that check a
 * buffer was faulted in ahead of use compare it before and after. */
static inline size_t th_resident_bytes(void) {
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

#endif
