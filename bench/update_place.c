/* update_place.c — what an out-of-place AdamW update costs against an in-place one.
 *
 * Zero-copy snapshots make the update after each snapshot out of place: it reads generation
 * k - 1 from one block and writes generation k into the other, so the snapshot stays intact
 * (docs/DESIGN.md, "The state is the snapshot"). Writing to other lines than it reads costs
 * the memory traffic of fetching those lines first. This times the trainer's adamw_update on
 * one rank's shard both ways, alternating, from a cold cache (as after a forward and
 * backward pass), on transparent huge pages, and prints the medians.
 * usage: update_place [FLOATS] [REPS]   (default 2708000: `small`'s shard per rank at 4 ranks) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "util.h"

#define EVICT (128u << 20) /* larger than the last-level cache */

/* A buffer of n floats on transparent huge pages (the project's alloc_huge), zeroed. */
static float *huge(size_t n) {
    float *p = alloc_huge(n * sizeof(float));
    if (p) memset(p, 0, n * sizeof(float));
    return p;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 2708000;
    int reps = argc > 2 ? atoi(argv[2]) : 41;
    if (n == 0 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: update_place [FLOATS > 0] [REPS 1..1000]\n");
        return 2;
    }
    /* p, m, v of two generations, the gradients, and memory to evict the cache with */
    float *a[3], *b[3], *g = huge(n);
    unsigned char *evict = malloc(EVICT);
    double *t_in = calloc((size_t)reps, sizeof *t_in), *t_out = calloc((size_t)reps, sizeof *t_out);
    for (int i = 0; i < 3; i++) { a[i] = huge(n); b[i] = huge(n); }
    if (!g || !evict || !t_in || !t_out || !a[0] || !a[1] || !a[2] || !b[0] || !b[1] || !b[2]) {
        fprintf(stderr, "update_place: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        a[0][i] = b[0][i] = g[i];
    }
    AdamWConfig c = adamw_defaults();
    for (int r = 0; r < reps; r++) {
        memset(evict, r, EVICT);
        double t0 = now_ms();
        adamw_update(a[0], a[0], g, a[1], a[1], a[2], a[2], n, &c, 1e-4f, 1.0f, r + 1);
        t_in[r] = now_ms() - t0;

        memset(evict, r + 1, EVICT);
        t0 = now_ms();
        adamw_update(b[0], a[0], g, b[1], a[1], b[2], a[2], n, &c, 1e-4f, 1.0f, r + 1);
        t_out[r] = now_ms() - t0;
    }
    qsort(t_in, (size_t)reps, sizeof *t_in, by_value);
    qsort(t_out, (size_t)reps, sizeof *t_out, by_value);
    double in = t_in[reps / 2], out = t_out[reps / 2];
    printf("AdamW on %zu floats (%.1f MiB of parameters and moments), cold cache, median of %d:\n", n,
           3.0 * n * sizeof(float) / (1u << 20), reps);
    printf("  in place      %6.2f ms\n  out of place  %6.2f ms  (%+.2f ms)\n", in, out, out - in);
    return 0;
}
