/* copy_floor.c — the floor of one replica copy on this machine.
 *
 * A same-machine holder replicates a rank's generation with one copy out of the owner's
 * memory (process_vm_readv in 256 KiB chunks, each checksummed while in L2: replica.c, PULL).
 * This prints what moving BYTES that way costs on one core when nothing else runs, beside the
 * same through a cache-resident bounce buffer and streaming stores (which skip reading the
 * destination), a plain memcpy within one process and a read-only pass (the least any copy
 * must do), all on transparent huge pages and from a cold cache, as the holder meets the
 * state after a training step. The median of REPS repetitions each. docs/BENCHMARKS.md compares it with
 * the holder's CPU per generation inside a job. No CRC here: its cost is the holder's
 * holder_cpu_ms minus this copy.
 * usage: copy_floor [MIB] [REPS]   (default 31 MiB: `small`'s state per rank at 4 ranks) */
#include <emmintrin.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

#define CHUNK (256u << 10)
#define EVICT (128u << 20) /* larger than the last-level cache */

/* A buffer on transparent huge pages (the project's alloc_huge), written once. */
static unsigned char *huge(size_t bytes) {
    unsigned char *p = alloc_huge(bytes);
    if (p) memset(p, 0x5a, bytes);
    return p;
}

/* dst = src with streaming stores (no read of the destination lines); 64-byte aligned. */
static void copy_streaming(unsigned char *dst, const unsigned char *src, size_t n) {
    for (size_t i = 0; i + 64 <= n; i += 64) {
        __m128i a = _mm_load_si128((const __m128i *)(src + i)), b = _mm_load_si128((const __m128i *)(src + i + 16)),
                c = _mm_load_si128((const __m128i *)(src + i + 32)), d = _mm_load_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return v[n / 2];
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)(argc > 1 ? atof(argv[1]) : 31.0) * (1u << 20);
    int reps = argc > 2 ? atoi(argv[2]) : 21;
    if (bytes == 0 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: copy_floor [MIB > 0] [REPS 1..1000]\n");
        return 2;
    }
    unsigned char *src = huge(bytes), *dst = huge(bytes), *evict = huge(EVICT);
    double *t_vm = calloc((size_t)reps, sizeof *t_vm), *t_memcpy = calloc((size_t)reps, sizeof *t_memcpy),
           *t_read = calloc((size_t)reps, sizeof *t_read), *t_bounce = calloc((size_t)reps, sizeof *t_bounce);
    unsigned char *bounce = huge(CHUNK);
    if (!src || !dst || !evict || !t_vm || !t_memcpy || !t_read || !t_bounce || !bounce) {
        fprintf(stderr, "copy_floor: out of memory\n");
        return 1;
    }
    /* The owner: a child with its own state on huge pages (not the parent's src inherited:
     * a copy-on-write break would leave it on small pages), whose address comes back over a
     * pipe; it waits until killed. */
    int fd[2];
    if (pipe(fd) != 0) { perror("pipe"); return 1; }
    pid_t owner = fork();
    if (owner < 0) { perror("fork"); return 1; }
    if (owner == 0) {
        unsigned char *state = huge(bytes);
        if (state)
            for (size_t i = 0; i < bytes; i += 64) state[i] = (unsigned char)(i >> 6);
        if (write(fd[1], &state, sizeof state) != (ssize_t)sizeof state) _exit(1);
        pause();
        _exit(0);
    }
    unsigned char *remote_state = NULL;
    if (read(fd[0], &remote_state, sizeof remote_state) != (ssize_t)sizeof remote_state || !remote_state) {
        fprintf(stderr, "copy_floor: the owner process could not set up its state\n");
        kill(owner, SIGKILL);
        return 1;
    }
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        memset(evict, r, EVICT);
        double t0 = now_ms();
        for (size_t off = 0; off < bytes; off += CHUNK) {
            size_t n = bytes - off < CHUNK ? bytes - off : CHUNK;
            struct iovec local = {dst + off, n}, remote = {remote_state + off, n};
            if (process_vm_readv(owner, &local, 1, &remote, 1, 0) != (ssize_t)n) {
                perror("process_vm_readv");
                kill(owner, SIGKILL);
                return 1;
            }
        }
        t_vm[r] = now_ms() - t0;

        memset(evict, r + 3, EVICT);
        t0 = now_ms();
        for (size_t off = 0; off < bytes; off += CHUNK) {
            size_t n = bytes - off < CHUNK ? bytes - off : CHUNK;
            struct iovec local = {bounce, n}, remote = {remote_state + off, n};
            if (process_vm_readv(owner, &local, 1, &remote, 1, 0) != (ssize_t)n) {
                perror("process_vm_readv");
                kill(owner, SIGKILL);
                return 1;
            }
            copy_streaming(dst + off, bounce, n);
        }
        t_bounce[r] = now_ms() - t0;

        memset(evict, r + 1, EVICT);
        t0 = now_ms();
        memcpy(dst, src, bytes);
        t_memcpy[r] = now_ms() - t0;

        memset(evict, r + 2, EVICT);
        t0 = now_ms();
        const uint64_t *w = (const uint64_t *)src;
        uint64_t acc[8] = {0};
        for (size_t i = 0; i + 8 <= bytes / 8; i += 8)
            for (int k = 0; k < 8; k++) acc[k] ^= w[i + k];
        t_read[r] = now_ms() - t0;
        for (int k = 0; k < 8; k++) sink ^= acc[k];
    }
    kill(owner, SIGKILL);
    waitpid(owner, NULL, 0);
    double mib = (double)bytes / (1u << 20), vm = median(t_vm, reps), mc = median(t_memcpy, reps),
           rd = median(t_read, reps), bo = median(t_bounce, reps);
    printf("%.1f MiB from a cold cache, one core, median of %d:\n", mib, reps);
    const char *label[] = {"process_vm_readv from another process, 256 KiB chunks",
                           "the same via a cached bounce buffer, streaming stores", "memcpy within this process",
                           "read only (the least a copy does)"};
    double ms[] = {vm, bo, mc, rd};
    for (int i = 0; i < 4; i++) printf("  %-54s %6.2f ms  (%.1f GB/s)\n", label[i], ms[i], bytes / ms[i] / 1e6);
    return sink == 42 ? 3 : 0; /* keeps the read pass */
}
