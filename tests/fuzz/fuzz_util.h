/* fuzz_util.h — shared by the libFuzzer harnesses in tests/fuzz (see tests/fuzz/run.sh and
 * docs/RELIABILITY.md): the input as a file for the parsers that take a path, and checks
 * that end the run the way a sanitizer finding does. */
#ifndef DEADPOOL_FUZZ_UTIL_H
#define DEADPOOL_FUZZ_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property of the parser's contract does not hold: report and abort, which libFuzzer
 * records as a crash (and saves the input), like any sanitizer finding. */
#define FUZZ_CHECK(cond, ...)                                                         \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* alloc_huge (src/common/util.c) rounds every buffer up to whole 2 MiB and aligns it so: the
 * fuzz binaries are linked with -Wl,--wrap=alloc_huge and get this exact-size malloc instead,
 * so ASan sees the first byte past what was asked for (inside a 2 MiB rounding it would not),
 * and no execution pays for mapping 2 MiB regions. */
void *__wrap_alloc_huge(size_t bytes);
void *__wrap_alloc_huge(size_t bytes) { return malloc(bytes ? bytes : 1); }

/* An error message must say something and name the file it is about. */
#define FUZZ_CHECK_ERR(err, path) \
    FUZZ_CHECK((err)[0] != 0 && strstr((err), (path)) != NULL, "error message '%s' does not name '%s'", (err), (path))

/* The input as a file: one memfd, rewritten for every input, opened by path through
 * /proc/self/fd like any file. Returns that path. */
static inline const char *fuzz_memfd_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz_input", MFD_CLOEXEC);
        FUZZ_CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate: %s", strerror(errno));
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        FUZZ_CHECK(w > 0, "pwrite: %s", strerror(errno));
        done += (size_t)w;
    }
    return path;
}

static char fuzz_root[128];

static inline int fuzz_remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline void fuzz_root_remove(void) {
    if (fuzz_root[0]) nftw(fuzz_root, fuzz_remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Writes the input to ROOT/rel (its directories made as needed), ROOT a directory made once
 * under /dev/shm (or /tmp) and removed at exit. Returns ROOT. */
static inline const char *fuzz_tree_file(const char *rel, const uint8_t *data, size_t size) {
    if (!fuzz_root[0]) {
        snprintf(fuzz_root, sizeof fuzz_root, "/dev/shm/dp_fuzz_XXXXXX");
        if (!mkdtemp(fuzz_root)) {
            snprintf(fuzz_root, sizeof fuzz_root, "/tmp/dp_fuzz_XXXXXX");
            FUZZ_CHECK(mkdtemp(fuzz_root) != NULL, "mkdtemp: %s", strerror(errno));
        }
        atexit(fuzz_root_remove);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_root, rel);
    FILE *f = fopen(path, "wb");
    for (char *slash = path + strlen(fuzz_root) + 1; !f && errno == ENOENT && (slash = strchr(slash, '/')); slash++) {
        *slash = 0;
        FUZZ_CHECK(mkdir(path, 0700) == 0 || errno == EEXIST, "%s: %s", path, strerror(errno));
        *slash = '/';
        f = fopen(path, "wb");
    }
    FUZZ_CHECK(f != NULL, "%s: %s", path, strerror(errno));
    FUZZ_CHECK(size == 0 || fwrite(data, 1, size, f) == size, "%s: short write", path);
    FUZZ_CHECK(fclose(f) == 0, "%s: close failed", path);
    return fuzz_root;
}

#endif
