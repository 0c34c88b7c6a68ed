/* test_layers.c — every GPT-2 layer of src/layers.c: the forward pass against a direct
 * double-precision evaluation of its definition, and the backward pass against central finite
 * differences of the forward.
 *
 * Gradient checks use the scalar objective L = sum(out * w) for fixed random w, evaluated in
 * double, so the backward is run with dout = w. Backward functions add into their d-outputs,
 * so those start from random values and the check is on what was added.
 * Tolerance: |numeric - analytic| <= 1e-4 + 1e-3 * max(|numeric|, |analytic|), with
 * perturbation eps = 1e-2. The fp32 rounding of the forward puts ~1e-7 of noise on L, i.e.
 * ~1e-4 on a difference quotient with eps = 1e-3, too close to a tight tolerance; with eps = 1e-2
 * noise and truncation error (eps^2 f''' / 6) both stay ~5x below it, and a 1% error in any
 * gradient entry of order 1 still fails. Sizes are chosen so the 16-wide vector loops run both
 * their full chunks and their scalar tails. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "layers.h"

#define EPS 1e-2f
#define RTOL 1e-3
#define ATOL 1e-4

/* ------------------------------------------------------------------------------------------ */
/* utilities                                                                                   */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint32_t rng_u32(void) { /* xorshift64*, reproducible test data */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (rng_u32() >> 8) * (1.0f / 16777216.0f); }

static float *rand_array(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
    return x;
}

static float *copy_array(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double dot_w(const float *out, const float *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * w[i];
    return s;
}

/* the objective L(x) of one gradient check: reruns the layer's forward on the current inputs */
typedef double (*objective_fn)(void *ctx);

/* Compares the analytic gradient (after - before of a d-buffer) with central differences of
 * obj in x, on all entries when n <= max_samples, else on max_samples random ones.
 * Returns the number of mismatches (each reported). */
static int gradcheck(const char *what, objective_fn obj, void *ctx, float *x, size_t n,
                     const float *d_after, const float *d_before, int max_samples) {
    int bad = 0, samples = n <= (size_t)max_samples ? (int)n : max_samples;
    double worst = 0.0;
    for (int s = 0; s < samples; s++) {
        size_t i = n <= (size_t)max_samples ? (size_t)s : rng_u32() % n;
        float orig = x[i];
        float xp = orig + EPS, xm = orig - EPS;
        x[i] = xp;
        double lp = obj(ctx);
        x[i] = xm;
        double lm = obj(ctx);
        x[i] = orig;
        double numeric = (lp - lm) / ((double)xp - (double)xm);
        double analytic = (double)d_after[i] - (double)(d_before ? d_before[i] : 0.0f);
        double err = fabs(numeric - analytic);
        double tol = ATOL + RTOL * fmax(fabs(numeric), fabs(analytic));
        if (!(err / tol <= worst)) worst = err / tol; /* NaN sticks */
        if (!(err <= tol)) {
            if (bad < 5) fprintf(stderr, "  %s[%zu]: numeric %.6g analytic %.6g\n", what, i, numeric, analytic);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "  %s: %d of %d entries off (worst err/tol %.3g)\n", what, bad, samples, worst);
    return bad;
}

/* infinite if any entry is NaN (fmax would skip it) */
static double max_abs_diff(const float *a, const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        m = fmax(m, d);
    }
    return m;
}

/* fmax that lets NaN win, so a NaN result cannot pass a `worst < tol` check */
static double nanmax(double a, double b) { return isnan(a) || isnan(b) ? NAN : fmax(a, b); }

/* ------------------------------------------------------------------------------------------ */
/* encoder                                                                                     */

typedef struct {
    float *out, *wte, *wpe, *w;
    int *inp;
    int B, T, C;
} EncoderCtx;

static double encoder_obj(void *p) {
    EncoderCtx *c = p;
    encoder_forward(c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_w(c->out, c->w, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void) {
    const int B = 2, T = 5, C = 20, V = 7, maxT = 6;
    int inp[10] = {1, 3, 3, 0, 6, 3, 1, 1, 5, 2}; /* repeated tokens: their gradients must add */
    EncoderCtx c = {malloc(sizeof(float) * B * T * C), rand_array((size_t)V * C, -1, 1),
                    rand_array((size_t)maxT * C, -1, 1), rand_array((size_t)B * T * C, -1, 1), inp, B, T, C};
    encoder_obj(&c);
    int exact = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                exact &= c.out[(b * T + t) * C + i] == c.wte[inp[b * T + t] * C + i] + c.wpe[t * C + i];
    CHECK(exact, "encoder_forward is not wte[token] + wpe[t]");

    float *dwte0 = rand_array((size_t)V * C, -1, 1), *dwpe0 = rand_array((size_t)maxT * C, -1, 1);
    float *dwte = copy_array(dwte0, (size_t)V * C), *dwpe = copy_array(dwpe0, (size_t)maxT * C);
    encoder_backward(dwte, dwpe, c.w, inp, B, T, C);
    CHECK(gradcheck("dwte", encoder_obj, &c, c.wte, (size_t)V * C, dwte, dwte0, 1000) == 0, "encoder dwte");
    CHECK(gradcheck("dwpe", encoder_obj, &c, c.wpe, (size_t)maxT * C, dwpe, dwpe0, 1000) == 0, "encoder dwpe");
    free(c.out), free(c.wte), free(c.wpe), free(c.w), free(dwte0), free(dwpe0), free(dwte), free(dwpe);
}

/* ------------------------------------------------------------------------------------------ */
/* layernorm                                                                                   */

typedef struct {
    float *out, *mean, *rstd, *inp, *weight, *bias, *w;
    int B, T, C;
} LayernormCtx;

static double layernorm_obj(void *p) {
    LayernormCtx *c = p;
    layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->weight, c->bias, c->B, c->T, c->C);
    return dot_w(c->out, c->w, (size_t)c->B * c->T * c->C);
}

static void test_layernorm(void) {
    const int B = 2, T = 5, C = 20;
    const size_t N = (size_t)B * T * C;
    LayernormCtx c = {malloc(N * sizeof(float)), malloc(B * T * sizeof(float)), malloc(B * T * sizeof(float)),
                      rand_array(N, -2, 3), rand_array(C, 0.5f, 1.5f), rand_array(C, -1, 1), rand_array(N, -1, 1),
                      B, T, C};
    layernorm_obj(&c);
    double *ref = malloc(N * sizeof(double));
    double worst_stat = 0.0;
    for (int r = 0; r < B * T; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += c.inp[r * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (c.inp[r * C + i] - m) * (c.inp[r * C + i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++) ref[r * C + i] = (c.inp[r * C + i] - m) * s * c.weight[i] + c.bias[i];
        worst_stat = nanmax(worst_stat, fabs(c.mean[r] - m) + fabs(c.rstd[r] - s) / s);
    }
    CHECK(max_abs_diff(c.out, ref, N) < 1e-5, "layernorm forward off by %g", max_abs_diff(c.out, ref, N));
    CHECK(worst_stat < 1e-5, "layernorm mean/rstd off by %g", worst_stat);

    float *dinp0 = rand_array(N, -1, 1), *dw0 = rand_array(C, -1, 1), *db0 = rand_array(C, -1, 1);
    float *dinp = copy_array(dinp0, N), *dw = copy_array(dw0, C), *db = copy_array(db0, C);
    layernorm_backward(dinp, dw, db, c.w, c.inp, c.weight, c.mean, c.rstd, B, T, C);
    CHECK(gradcheck("ln dinp", layernorm_obj, &c, c.inp, N, dinp, dinp0, 1000) == 0, "layernorm dinp");
    CHECK(gradcheck("ln dweight", layernorm_obj, &c, c.weight, C, dw, dw0, 1000) == 0, "layernorm dweight");
    CHECK(gradcheck("ln dbias", layernorm_obj, &c, c.bias, C, db, db0, 1000) == 0, "layernorm dbias");
    free(c.out), free(c.mean), free(c.rstd), free(c.inp), free(c.weight), free(c.bias), free(c.w);
    free(ref), free(dinp0), free(dw0), free(db0), free(dinp), free(dw), free(db);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul                                                                                      */

typedef struct {
    float *out, *inp, *weight, *bias, *w;
    int B, T, C, OC;
} MatmulCtx;

static double matmul_obj(void *p) {
    MatmulCtx *c = p;
    matmul_forward(c->out, c->inp, c->weight, c->bias, c->B, c->T, c->C, c->OC);
    return dot_w(c->out, c->w, (size_t)c->B * c->T * c->OC);
}

static void check_matmul(int with_bias) {
    const int B = 2, T = 5, C = 12, OC = 20;
    const size_t NI = (size_t)B * T * C, NO = (size_t)B * T * OC, NW = (size_t)OC * C;
    MatmulCtx c = {malloc(NO * sizeof(float)), rand_array(NI, -1, 1), rand_array(NW, -1, 1),
                   with_bias ? rand_array(OC, -1, 1) : NULL, rand_array(NO, -1, 1), B, T, C, OC};
    matmul_obj(&c);
    double *ref = malloc(NO * sizeof(double));
    for (int r = 0; r < B * T; r++)
        for (int o = 0; o < OC; o++) {
            double s = with_bias ? c.bias[o] : 0.0;
            for (int i = 0; i < C; i++) s += (double)c.inp[r * C + i] * c.weight[o * C + i];
            ref[r * OC + o] = s;
        }
    CHECK(max_abs_diff(c.out, ref, NO) < 1e-5, "matmul forward (bias %d) off by %g", with_bias, max_abs_diff(c.out, ref, NO));

    float *dinp0 = rand_array(NI, -1, 1), *dw0 = rand_array(NW, -1, 1), *db0 = rand_array(OC, -1, 1);
    float *dinp = copy_array(dinp0, NI), *dw = copy_array(dw0, NW), *db = copy_array(db0, OC);
    matmul_backward(dinp, dw, with_bias ? db : NULL, c.w, c.inp, c.weight, B, T, C, OC);
    CHECK(gradcheck("mm dinp", matmul_obj, &c, c.inp, NI, dinp, dinp0, 1000) == 0, "matmul dinp (bias %d)", with_bias);
    CHECK(gradcheck("mm dweight", matmul_obj, &c, c.weight, NW, dw, dw0, 1000) == 0, "matmul dweight (bias %d)", with_bias);
    if (with_bias) {
        CHECK(gradcheck("mm dbias", matmul_obj, &c, c.bias, OC, db, db0, 1000) == 0, "matmul dbias");
    } else {
        CHECK(memcmp(db, db0, OC * sizeof(float)) == 0, "matmul_backward touched dbias it was not given");
    }
    free(c.out), free(c.inp), free(c.weight), free(c.bias), free(c.w);
    free(ref), free(dinp0), free(dw0), free(db0), free(dinp), free(dw), free(db);
}

static void test_matmul_bias(void) { check_matmul(1); }
static void test_matmul_nobias(void) { check_matmul(0); }

/* ------------------------------------------------------------------------------------------ */
/* attention                                                                                   */

typedef struct {
    float *out, *preatt, *att, *inp, *w;
    int B, T, C, NH;
} AttentionCtx;

static double attention_obj(void *p) {
    AttentionCtx *c = p;
    attention_forward(c->out, c->preatt, c->att, c->inp, c->B, c->T, c->C, c->NH);
    return dot_w(c->out, c->w, (size_t)c->B * c->T * c->C);
}

/* llm.c's loops in double: out and att */
static void attention_reference(double *out, double *att, const float *inp, int B, int T, int C, int NH) {
    const int C3 = 3 * C, hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double *row = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
                double maxval = -1e300, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + h * hs + C;
                    double s = 0.0;
                    for (int i = 0; i < hs; i++) s += (double)q[i] * k[i];
                    row[t2] = s * scale;
                    maxval = fmax(maxval, row[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += (row[t2] = exp(row[t2] - maxval));
                double *a = att + (((size_t)b * NH + h) * T + t) * T;
                for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? row[t2] / sum : 0.0;
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double s = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) s += a[t2] * inp[((size_t)b * T + t2) * C3 + h * hs + 2 * C + i];
                    o[i] = s;
                }
            }
    free(row);
}

static void check_attention(int B, int T, int C, int NH, int samples) {
    const size_t NI = (size_t)B * T * 3 * C, NO = (size_t)B * T * C, NA = (size_t)B * NH * T * T;
    AttentionCtx c = {malloc(NO * sizeof(float)), malloc(NA * sizeof(float)), malloc(NA * sizeof(float)),
                      rand_array(NI, -1.5f, 1.5f), rand_array(NO, -1, 1), B, T, C, NH};
    /* stale values in the buffers must not leak into the results */
    for (size_t i = 0; i < NA; i++) c.preatt[i] = c.att[i] = NAN;
    attention_obj(&c);
    double *ref_out = malloc(NO * sizeof(double)), *ref_att = malloc(NA * sizeof(double));
    attention_reference(ref_out, ref_att, c.inp, B, T, C, NH);
    CHECK(max_abs_diff(c.out, ref_out, NO) < 1e-5, "attention out (T=%d) off by %g", T, max_abs_diff(c.out, ref_out, NO));
    CHECK(max_abs_diff(c.att, ref_att, NA) < 1e-6, "attention att (T=%d) off by %g", T, max_abs_diff(c.att, ref_att, NA));
    int masked_zero = 1;
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int t2 = t + 1; t2 < T; t2++) masked_zero &= c.att[(bh * T + t) * T + t2] == 0.0f;
    CHECK(masked_zero, "attention: masked (future) entries of att are not exactly 0");

    float *dinp0 = rand_array(NI, -1, 1), *dinp = copy_array(dinp0, NI);
    float *dpreatt = malloc(NA * sizeof(float)), *datt = malloc(NA * sizeof(float));
    for (size_t i = 0; i < NA; i++) dpreatt[i] = datt[i] = NAN; /* scratch: must be overwritten, not read */
    attention_backward(dinp, dpreatt, datt, c.w, c.inp, c.att, B, T, C, NH);
    CHECK(gradcheck("att dinp", attention_obj, &c, c.inp, NI, dinp, dinp0, samples) == 0, "attention dinp (T=%d)", T);
    free(c.out), free(c.preatt), free(c.att), free(c.inp), free(c.w);
    free(ref_out), free(ref_att), free(dinp0), free(dinp), free(dpreatt), free(datt);
}

static void test_attention(void) { check_attention(2, 20, 24, 2, 200); }
/* longer than one 64-row block of the blocked causal sgemm */
static void test_attention_multiblock(void) { check_attention(1, 140, 8, 2, 120); }

/* ------------------------------------------------------------------------------------------ */
/* GELU                                                                                        */

typedef struct {
    float *out, *inp, *w;
    int N;
} GeluCtx;

static double gelu_obj(void *p) {
    GeluCtx *c = p;
    gelu_forward(c->out, c->inp, c->N);
    return dot_w(c->out, c->w, c->N);
}

static void test_gelu(void) {
    const int N = 2 * 5 * 20;
    GeluCtx c = {malloc(N * sizeof(float)), rand_array(N, -5, 5), rand_array(N, -1, 1), N};
    gelu_obj(&c);
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        double x = c.inp[i];
        double ref = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        worst = nanmax(worst, fabs(c.out[i] - ref) / (1e-6 + fabs(ref)));
    }
    CHECK(worst < 1e-5, "gelu forward relative error %g", worst);
    float ext_in[5] = {-30.0f, -10.0f, 0.0f, 10.0f, 30.0f}, ext_out[5];
    gelu_forward(ext_out, ext_in, 5);
    CHECK(fabsf(ext_out[0]) < 1e-30f && fabsf(ext_out[1]) < 1e-30f && ext_out[2] == 0.0f && ext_out[3] == 10.0f &&
              ext_out[4] == 30.0f, "gelu tails: %g %g %g %g %g", ext_out[0], ext_out[1], ext_out[2], ext_out[3], ext_out[4]);
    float nan_in = NAN, nan_out;
    gelu_forward(&nan_out, &nan_in, 1);
    CHECK(isnan(nan_out), "gelu(NaN) = %g, NaN must propagate", nan_out);

    float *dinp0 = rand_array(N, -1, 1), *dinp = copy_array(dinp0, N);
    gelu_backward(dinp, c.inp, c.w, N);
    CHECK(gradcheck("gelu dinp", gelu_obj, &c, c.inp, N, dinp, dinp0, 1000) == 0, "gelu dinp");
    free(c.out), free(c.inp), free(c.w), free(dinp0), free(dinp);
}

/* ------------------------------------------------------------------------------------------ */
/* residual                                                                                    */

typedef struct {
    float *out, *a, *b, *w;
    int N;
} ResidualCtx;

static double residual_obj(void *p) {
    ResidualCtx *c = p;
    residual_forward(c->out, c->a, c->b, c->N);
    return dot_w(c->out, c->w, c->N);
}

static void test_residual(void) {
    const int N = 2 * 5 * 20;
    ResidualCtx c = {malloc(N * sizeof(float)), rand_array(N, -1, 1), rand_array(N, -1, 1), rand_array(N, -1, 1), N};
    residual_obj(&c);
    int exact = 1;
    for (int i = 0; i < N; i++) exact &= c.out[i] == c.a[i] + c.b[i];
    CHECK(exact, "residual_forward is not inp1 + inp2");
    float *d10 = rand_array(N, -1, 1), *d20 = rand_array(N, -1, 1);
    float *d1 = copy_array(d10, N), *d2 = copy_array(d20, N);
    residual_backward(d1, d2, c.w, N);
    CHECK(gradcheck("res dinp1", residual_obj, &c, c.a, N, d1, d10, 1000) == 0, "residual dinp1");
    CHECK(gradcheck("res dinp2", residual_obj, &c, c.b, N, d2, d20, 1000) == 0, "residual dinp2");
    free(c.out), free(c.a), free(c.b), free(c.w), free(d10), free(d20), free(d1), free(d2);
}

/* ------------------------------------------------------------------------------------------ */
/* softmax + cross-entropy                                                                     */

typedef struct {
    float *probs, *losses, *logits, *w;
    int *targets;
    int B, T, V, Vp;
} CrossentropyCtx;

static double crossentropy_obj(void *p) {
    CrossentropyCtx *c = p;
    softmax_forward(c->probs, c->logits, c->B, c->T, c->V, c->Vp);
    crossentropy_forward(c->losses, c->probs, c->targets, c->B, c->T, c->Vp);
    return dot_w(c->losses, c->w, (size_t)c->B * c->T);
}

static void test_softmax_crossentropy(void) {
    const int B = 2, T = 5, V = 21, Vp = 24;
    const size_t NL = (size_t)B * T * Vp;
    int targets[10] = {0, 20, 5, 5, 11, 3, 19, 7, 1, 16};
    CrossentropyCtx c = {malloc(NL * sizeof(float)), malloc(B * T * sizeof(float)), rand_array(NL, -3, 3),
                         rand_array(B * T, 0.1f, 1), targets, B, T, V, Vp};
    for (int r = 0; r < B * T; r++) /* padded logits must not matter, however large */
        for (int i = V; i < Vp; i++) c.logits[r * Vp + i] = 50.0f;
    crossentropy_obj(&c);
    double worst_p = 0.0, worst_l = 0.0, worst_sum = 0.0;
    int pad_zero = 1;
    for (int r = 0; r < B * T; r++) {
        double mx = -1e300, sum = 0.0, psum = 0.0;
        for (int i = 0; i < V; i++) mx = fmax(mx, c.logits[r * Vp + i]);
        for (int i = 0; i < V; i++) sum += exp(c.logits[r * Vp + i] - mx);
        for (int i = 0; i < V; i++) {
            double p = exp(c.logits[r * Vp + i] - mx) / sum;
            worst_p = nanmax(worst_p, fabs(c.probs[r * Vp + i] - p) / p);
            psum += c.probs[r * Vp + i];
        }
        for (int i = V; i < Vp; i++) pad_zero &= c.probs[r * Vp + i] == 0.0f;
        double loss = -(c.logits[r * Vp + targets[r]] - mx - log(sum));
        worst_l = nanmax(worst_l, fabs(c.losses[r] - loss));
        worst_sum = nanmax(worst_sum, fabs(psum - 1.0));
    }
    CHECK(worst_p < 1e-5, "softmax relative error %g", worst_p);
    CHECK(worst_sum < 1e-5, "softmax rows sum to 1 +- %g", worst_sum);
    CHECK(pad_zero, "softmax: padded probabilities are not 0");
    CHECK(worst_l < 1e-5, "crossentropy error %g", worst_l);

    float big_logits[20], big_probs[20];
    for (int i = 0; i < 20; i++) big_logits[i] = 1000.0f + i;
    softmax_forward(big_probs, big_logits, 1, 1, 20, 20);
    CHECK(fabsf(big_probs[19] - 0.6321f) < 1e-3f && big_probs[0] > 0.0f, "softmax of large logits: %g", big_probs[19]);

    float *dl0 = rand_array(NL, -1, 1), *dl = copy_array(dl0, NL);
    crossentropy_softmax_backward(dl, c.w, c.probs, targets, B, T, V, Vp);
    int pad_untouched = 1;
    for (int r = 0; r < B * T; r++)
        for (int i = V; i < Vp; i++) pad_untouched &= dl[r * Vp + i] == dl0[r * Vp + i];
    CHECK(pad_untouched, "crossentropy_softmax_backward touched padded columns");
    CHECK(gradcheck("ce dlogits", crossentropy_obj, &c, c.logits, NL, dl, dl0, 1000) == 0, "softmax+crossentropy dlogits");
    free(c.probs), free(c.losses), free(c.logits), free(c.w), free(dl0), free(dl);
}

int main(void) {
    RUN_TEST(test_encoder);
    RUN_TEST(test_layernorm);
    RUN_TEST(test_matmul_bias);
    RUN_TEST(test_matmul_nobias);
    RUN_TEST(test_attention);
    RUN_TEST(test_attention_multiblock);
    RUN_TEST(test_gelu);
    RUN_TEST(test_residual);
    RUN_TEST(test_softmax_crossentropy);
    TEST_MAIN_END();
}
