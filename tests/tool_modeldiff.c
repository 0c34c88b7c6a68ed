/* tool_modeldiff.c — compares two llm.c model files parameter by parameter.
 * usage: modeldiff A.bin B.bin TOL   prints the largest absolute difference and exits 0 when it
 * is <= TOL (TOL 0 demands bit-identical parameters), 1 when larger, 2 on a bad file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "modelfile.h"

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: modeldiff A.bin B.bin TOL\n"); return 2; }
    GPT2Config ca, cb;
    char err[1024];
    if (modelfile_read_config(argv[1], &ca, err, sizeof err) || modelfile_read_config(argv[2], &cb, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (memcmp(&ca, &cb, sizeof ca) != 0) { fprintf(stderr, "model shapes differ\n"); return 1; }
    size_t n = gpt2_num_params(&ca);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (modelfile_read(argv[1], &ca, a, err, sizeof err) || modelfile_read(argv[2], &cb, b, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    double max_abs = 0.0;
    size_t at = 0, differing = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (a[i] != b[i]) differing++;
        if (d > max_abs) { max_abs = d; at = i; }
    }
    double tol = atof(argv[3]);
    printf("params %zu, differing %zu, max |a-b| %.3g at %zu (tolerance %.3g)\n", n, differing, max_abs, at, tol);
    free(a);
    free(b);
    return max_abs <= tol ? 0 : 1;
}
