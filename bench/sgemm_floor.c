/* sgemm_floor.c — the matrix-product floor of one `small` training step on this machine.
 *
 * Runs exactly the cblas_sgemm calls one forward + backward of the `small` preset issues
 * (B=4, T=256, C=384, 6 layers, 6 heads, vocabulary 256), one BLAS thread, and prints the
 * median time of REPS repetitions with the GFLOP/s it implies. A training step cannot be
 * faster than this on this machine; bench/step_time.sh prints it beside the step time.
 * usage: sgemm_floor [REPS] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { B = 4, T = 256, C = 384, L = 6, NH = 6, HS = C / NH, V = 256 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static float *buffer(size_t n) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

/* Forward out(M,N) = inp(M,K) @ w(N,K)^T, and its backward: dinp(M,K) += dout @ w,
 * dw(N,K) += dout^T @ inp. Returns the flops. */
static double linear(float *inp, float *w, float *out, float *dinp, float *dw, int M, int N, int K) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, inp, K, w, K, 0.0f, out, N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, out, N, w, K, 1.0f, dinp, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, out, N, inp, K, 1.0f, dw, K);
    return 3.0 * 2.0 * M * N * K;
}

/* Per (batch, head): scores(T,T) = q @ k^T, out(T,HS) = att @ v, and the backward's four. */
static double attention(float *q, float *k, float *att, float *out) {
    double flops = 0;
    for (int bh = 0; bh < B * NH; bh++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, q, 3 * C, k, 3 * C, 0.0f, att, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, att, T, k, 3 * C, 0.0f, out, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, out, C, k, 3 * C, 0.0f, att, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, att, T, out, C, 0.0f, q, 3 * C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, att, T, k, 3 * C, 0.0f, out, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, att, T, q, 3 * C, 0.0f, k, 3 * C);
        flops += 6 * 2.0 * T * T * HS;
    }
    return flops;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > 100) reps = 5;
    openblas_set_num_threads(1);
    size_t M = (size_t)B * T;
    float *x = buffer(M * 4 * C), *dx = buffer(M * 4 * C), *y = buffer(M * 4 * C);
    float *w = buffer((size_t)4 * C * C), *dw = buffer((size_t)4 * C * C), *wte = buffer((size_t)V * C);
    float *att = buffer((size_t)T * T);
    double times[100], flops = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        flops = 0;
        for (int l = 0; l < L; l++) {
            flops += linear(x, w, y, dx, dw, (int)M, 3 * C, C);     /* qkv */
            flops += attention(y, y + C, att, x);
            flops += linear(x, w, y, dx, dw, (int)M, C, C);         /* attention projection */
            flops += linear(x, w, y, dx, dw, (int)M, 4 * C, C);     /* fc */
            flops += linear(y, w, x, dx, dw, (int)M, C, 4 * C);     /* fc projection */
        }
        flops += linear(x, wte, y, dx, dw, (int)M, V, C);           /* tied-embedding logits */
        times[r] = now_s() - t0;
    }
    qsort(times, (size_t)reps, sizeof times[0], compare);
    double med = times[reps / 2];
    printf("sgemm floor of one small step (B=%d T=%d, one thread): %.3f s median of %d, %.1f GFLOP/s\n", B, T, med, reps,
           flops / med / 1e9);
    return 0;
}
