/* layers.c — forward and backward passes of the GPT-2 layers, following llm.c's CPU reference
 * (train_gpt2.c) layer by layer, in fp32 on one thread, with every matrix product (attention
 * included) in cblas_sgemm.
 *
 * Where this departs from llm.c's loops it does so for speed and stays deterministic (results
 * depend only on the inputs and the sizes):
 * - reductions (sums, dot products, maxima) keep 16 partial accumulators in a fixed order, and
 *   element-wise loops run in fixed chunks of 16, because GCC's -O2 vectoriser only takes loops
 *   whose trip count is a known multiple of the vector width, and float reductions only when
 *   their order is spelled out (no -ffast-math);
 * - exp is a polynomial (exp_approx, < 1 ulp) that vectorises, where libm's expf/tanhf would be
 *   called once per element; GELU uses the identity 0.5 (1 + tanh u) = 1 / (1 + exp(-2u));
 * - the attention softmax backward is the O(T) per row form att * (datt - <att, datt>) instead
 *   of llm.c's O(T^2) double loop; same mathematics;
 * - causal attention computes, per block of ATT_BLOCK query rows, only the keys up to the
 *   block's last row, so most of the masked upper triangle is never multiplied. */
#include "layers.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16      /* partial accumulators and element-wise chunk length */
#define ATT_BLOCK 64  /* query rows per attention sgemm block */

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */

/* ------------------------------------------------------------------------------------------ */
/* vectorisable helpers                                                                        */
/* GCC only trusts restrict on parameters, so the hot loops live in functions whose pointer
 * parameters are restrict-qualified (aliasing checks are beyond -O2's vectoriser). */

static float lanes_sum(float acc[LANES]) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

static float sum_f(const float *restrict x, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    for (int j = 0; i + j < n; j++) acc[j] += x[i + j];
    return lanes_sum(acc);
}

static float dot_f(const float *restrict x, const float *restrict y, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * y[i + j];
    for (int j = 0; i + j < n; j++) acc[j] += x[i + j] * y[i + j];
    return lanes_sum(acc);
}

/* NaNs are skipped, as in llm.c's `if (v > maxval)`; exp_approx passes them on anyway */
static float max_f(const float *restrict x, int n) {
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = x[0];
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; i + j < n; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] = acc[j + w] > acc[j] ? acc[j + w] : acc[j];
    return acc[0];
}

/* |x| limited to lim, sign kept. Done on the bits with an integer min: a float compare-and-
 * select would be control flow that -O2 does not if-convert (trapping math). */
static inline float clamp_abs(float x, float lim) {
    uint32_t bx, bl;
    memcpy(&bx, &x, sizeof bx);
    memcpy(&bl, &lim, sizeof bl);
    uint32_t mag = bx & 0x7fffffffu;
    mag = mag < bl ? mag : bl; /* NaN magnitudes are above any limit; the (x - x) below restores NaN */
    bx = (bx & 0x80000000u) | mag;
    memcpy(&x, &bx, sizeof x);
    return x;
}

/* exp(x) within 1 ulp for |x| <= 87.6; 0 below (where expf is subnormal), 1.65e38 above 88,
 * NaN for NaN or infinite x. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and Cephes'
 * degree-6 polynomial for exp(r); 2^n is built in the exponent bits (n = -127 gives 0). */
static inline float exp_approx(float x) {
    float xc = clamp_abs(x, 88.0f);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s + (x - x);
}

/* y[i] = exp(x[i] - m) */
static void exp_shift(float *restrict y, const float *restrict x, float m, int n) {
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) y[i + j] = exp_approx(x[i + j] - m);
    for (; i < n; i++) y[i] = exp_approx(x[i] - m);
}

static void scale_f(float *restrict x, float s, int n) {
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) x[i + j] *= s;
    for (; i < n; i++) x[i] *= s;
}

static void div_f(float *restrict x, float s, int n) { /* x /= s */
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) x[i + j] /= s;
    for (; i < n; i++) x[i] /= s;
}

static void axpy_f(float *restrict y, float a, const float *restrict x, int n) { /* y += a x */
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) y[i + j] += x[i + j] * a;
    for (; i < n; i++) y[i] += x[i] * a;
}

static void acc_f(float *restrict y, const float *restrict x, int n) { /* y += x */
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) y[i + j] += x[i + j];
    for (; i < n; i++) y[i] += x[i];
}

static void add_f(float *restrict y, const float *restrict a, const float *restrict b, int n) { /* y = a + b */
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) y[i + j] = a[i + j] + b[i + j];
    for (; i < n; i++) y[i] = a[i] + b[i];
}

/* ------------------------------------------------------------------------------------------ */
/* encoder                                                                                     */

void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C) {
    // out is (B,T,C), inp is (B,T) token ids, wte is (V,C), wpe is (maxT,C)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            add_f(out + ((size_t)b * T + t) * C, wte + (size_t)inp[b * T + t] * C, wpe + (size_t)t * C, C);
        }
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C) {
    // dwte is (V,C), dwpe is (maxT,C), dout is (B,T,C), inp is (B,T)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            acc_f(dwte + (size_t)inp[b * T + t] * C, dout_bt, C);
            acc_f(dwpe + (size_t)t * C, dout_bt, C);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* layernorm                                                                                   */

static float sqdev_f(const float *restrict x, float m, int n) { /* sum (x - m)^2 */
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float d = x[i + j] - m;
            acc[j] += d * d;
        }
    for (int j = 0; i + j < n; j++) {
        float d = x[i + j] - m;
        acc[j] += d * d;
    }
    return lanes_sum(acc);
}

static void layernorm_row(float *restrict o, const float *restrict x, const float *restrict w,
                          const float *restrict bs, float m, float s, int n) {
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) o[i + j] = (s * (x[i + j] - m)) * w[i + j] + bs[i + j];
    for (; i < n; i++) o[i] = (s * (x[i] - m)) * w[i] + bs[i];
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int B, int T, int C) {
    // inp and out are (B,T,C), weight and bias are (C), mean and rstd are (B,T)
    const float eps = 1e-5f;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const float *x = inp + r * C;
        float m = sum_f(x, C) / C;
        // variance about the mean (two passes, as llm.c), without bias correction
        float v = sqdev_f(x, m, C) / C;
        float s = 1.0f / sqrtf(v + eps);
        layernorm_row(out + r * C, x, weight, bias, m, s, C);
        mean[r] = m;
        rstd[r] = s;
    }
}

/* one row of layernorm backward; dx, dw, db accumulate */
static void layernorm_backward_row(float *restrict dx, float *restrict dw, float *restrict db,
                                   const float *restrict dy, const float *restrict x,
                                   const float *restrict w, float m, float s, int C) {
    // the two reductions: mean of dnorm and of dnorm * norm
    float a1[LANES] = {0}, a2[LANES] = {0};
    int i = 0;
    for (; i + LANES <= C; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float norm = (x[i + j] - m) * s;
            float dnorm = w[i + j] * dy[i + j];
            a1[j] += dnorm;
            a2[j] += dnorm * norm;
        }
    for (int j = 0; i + j < C; j++) {
        float norm = (x[i + j] - m) * s;
        float dnorm = w[i + j] * dy[i + j];
        a1[j] += dnorm;
        a2[j] += dnorm * norm;
    }
    const float dnorm_mean = lanes_sum(a1) / C;
    const float dnorm_norm_mean = lanes_sum(a2) / C;
    i = 0;
    for (; i + LANES <= C; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float norm = (x[i + j] - m) * s;
            float dnorm = w[i + j] * dy[i + j];
            db[i + j] += dy[i + j];
            dw[i + j] += norm * dy[i + j];
            dx[i + j] += ((dnorm - dnorm_mean) - norm * dnorm_norm_mean) * s;
        }
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * dy[i];
        db[i] += dy[i];
        dw[i] += norm * dy[i];
        dx[i] += ((dnorm - dnorm_mean) - norm * dnorm_norm_mean) * s;
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
    // dinp, dout and inp are (B,T,C), dweight, dbias and weight are (C), mean and rstd are (B,T)
    for (size_t r = 0; r < (size_t)B * T; r++)
        layernorm_backward_row(dinp + r * C, dweight, dbias, dout + r * C, inp + r * C, weight, mean[r], rstd[r], C);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul                                                                                      */

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int B, int T, int C, int OC) {
    // inp is (B,T,C), weight is (OC,C), bias is (OC) or NULL, out is (B,T,OC)
    const int BT = B * T;
    float beta = 0.0f;
    if (bias != NULL) {
        // start from the bias and let sgemm accumulate: saves the pass sgemm makes for beta = 0
        for (int r = 0; r < BT; r++) memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int B, int T, int C, int OC) {
    // dinp and inp are (B,T,C), dweight and weight are (OC,C), dbias is (OC) or NULL, dout is (B,T,OC)
    const int BT = B * T;
    // dinp += dout @ weight
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    // dweight += dout^T @ inp
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias != NULL) {
        for (int r = 0; r < BT; r++) acc_f(dbias, dout + (size_t)r * OC, OC);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* attention                                                                                   */

void attention_forward(float *out, float *preatt, float *att, const float *inp, int B, int T, int C, int NH) {
    // inp is (B,T,3C) holding [query | key | value], each split into NH heads of hs = C/NH
    // preatt and att are (B,NH,T,T): scaled scores and their causal softmax
    // out is (B,T,C)
    // preatt entries above the diagonal are left unspecified; att's are exactly 0
    const int C3 = 3 * C;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = inp + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *pre = preatt + ((size_t)b * NH + h) * T * T;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + h * hs;
            for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                const int i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T; // rows i0..i1-1 see keys 0..i1-1
                const int rows = i1 - i0;
                // pre[i0:i1, 0:i1] = scale * q[i0:i1] @ k[0:i1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, hs, scale, q + (size_t)i0 * C3, C3,
                            k, C3, 0.0f, pre + (size_t)i0 * T, T);
                for (int t = i0; t < i1; t++) {
                    const float *pre_t = pre + (size_t)t * T;
                    float *a_t = a + (size_t)t * T;
                    // softmax over keys 0..t; max subtracted for range only
                    const float maxval = max_f(pre_t, t + 1);
                    exp_shift(a_t, pre_t, maxval, t + 1);
                    const float expsum = sum_f(a_t, t + 1);
                    scale_f(a_t, expsum == 0.0f ? 0.0f : 1.0f / expsum, t + 1);
                    memset(a_t + t + 1, 0, (size_t)(T - t - 1) * sizeof(float)); // causal mask
                }
                // o[i0:i1] = att[i0:i1, 0:i1] @ v[0:i1]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, i1, 1.0f, a + (size_t)i0 * T, T,
                            v, C3, 0.0f, o + (size_t)i0 * C, C);
            }
        }
    }
}

/* dp = scale * att * (datt - <att, datt>) over one row's n visible keys */
static void softmax_backward_row(float *restrict dp, const float *restrict a, const float *restrict da,
                                 float scale, int n) {
    const float d = dot_f(a, da, n);
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) dp[i + j] = scale * (a[i + j] * (da[i + j] - d));
    for (; i < n; i++) dp[i] = scale * (a[i] * (da[i] - d));
}

void attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout, const float *inp,
                        const float *att, int B, int T, int C, int NH) {
    // dinp and inp are (B,T,3C) [q | k | v], dout is (B,T,C), att is (B,NH,T,T)
    // dpreatt and datt are (B,NH,T,T) scratch: overwritten (on and below the diagonal, up to
    // the end of each row's block), not accumulated; dinp is accumulated
    const int C3 = 3 * C;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = inp + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *dq = dinp + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C;
            float *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            float *da = datt + ((size_t)b * NH + h) * T * T;
            float *dp = dpreatt + ((size_t)b * NH + h) * T * T;
            const float *dout_h = dout + (size_t)b * T * C + h * hs;
            for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                const int i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T;
                const int rows = i1 - i0;
                // datt[i0:i1, 0:i1] = dout[i0:i1] @ v[0:i1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, hs, 1.0f, dout_h + (size_t)i0 * C, C,
                            v, C3, 0.0f, da + (size_t)i0 * T, T);
                // dv[0:i1] += att[i0:i1, 0:i1]^T @ dout[i0:i1]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, rows, 1.0f, a + (size_t)i0 * T, T,
                            dout_h + (size_t)i0 * C, C, 1.0f, dv, C3);
                // softmax backward: dpre = att * (datt - <att, datt>), times the score scale
                for (int t = i0; t < i1; t++) {
                    softmax_backward_row(dp + (size_t)t * T, a + (size_t)t * T, da + (size_t)t * T, scale, t + 1);
                    memset(dp + (size_t)t * T + t + 1, 0, (size_t)(i1 - t - 1) * sizeof(float)); // masked keys in the block
                }
                // dq[i0:i1] += dpre[i0:i1, 0:i1] @ k[0:i1]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, i1, 1.0f, dp + (size_t)i0 * T, T,
                            k, C3, 1.0f, dq + (size_t)i0 * C3, C3);
                // dk[0:i1] += dpre[i0:i1, 0:i1]^T @ q[i0:i1]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, rows, 1.0f, dp + (size_t)i0 * T, T,
                            q + (size_t)i0 * C3, C3, 1.0f, dk, C3);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* GELU                                                                                        */

/* exp(-2u) is limited to e^87 so that 1 / (1 + e) stays a normal float: subnormals are slow,
 * and GELU there is below 1e-36 either way */
static inline float gelu_exp_m2u(float x) {
    float u = GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x);
    return exp_approx(clamp_abs(-2.0f * u, 87.0f));
}

void gelu_forward(float *restrict o, const float *restrict x, int N) {
    // o and x are (N); o = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3)
    int i = 0;
    for (; i + LANES <= N; i += LANES)
        for (int j = 0; j < LANES; j++) o[i + j] = x[i + j] / (1.0f + gelu_exp_m2u(x[i + j]));
    for (; i < N; i++) o[i] = x[i] / (1.0f + gelu_exp_m2u(x[i]));
}

/* d/dx [x sig(2u)] = sig + x * 2 sig (1 - sig) * du/dx, sig = 1 / (1 + e), 1 - sig = e * sig;
 * equal to llm.c's 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx without cancellation in 1 - tanh^2 */
static inline float gelu_grad(float x) {
    float e = gelu_exp_m2u(x);
    float sig = 1.0f / (1.0f + e);
    float dudx = GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
    return sig + x * (2.0f * sig * (e * sig)) * dudx;
}

void gelu_backward(float *restrict dx, const float *restrict x, const float *restrict dy, int N) {
    // dx, x and dy are (N)
    int i = 0;
    for (; i + LANES <= N; i += LANES)
        for (int j = 0; j < LANES; j++) dx[i + j] += gelu_grad(x[i + j]) * dy[i + j];
    for (; i < N; i++) dx[i] += gelu_grad(x[i]) * dy[i];
}

/* ------------------------------------------------------------------------------------------ */
/* residual                                                                                    */

void residual_forward(float *out, const float *inp1, const float *inp2, int N) {
    // out, inp1 and inp2 are (N); out must not overlap the inputs
    add_f(out, inp1, inp2, N);
}

void residual_backward(float *dinp1, float *dinp2, const float *dout, int N) {
    // dinp1, dinp2 and dout are (N)
    acc_f(dinp1, dout, N);
    acc_f(dinp2, dout, N);
}

/* ------------------------------------------------------------------------------------------ */
/* softmax and cross-entropy                                                                   */

void softmax_forward(float *probs, const float *logits, int B, int T, int V, int Vp) {
    // probs and logits are (B,T,Vp); only the first V of each row are real tokens
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const float *x = logits + r * Vp;
        float *p = probs + r * Vp;
        const float maxval = max_f(x, V);
        exp_shift(p, x, maxval, V);
        div_f(p, sum_f(p, V), V);
        memset(p + V, 0, (size_t)(Vp - V) * sizeof(float)); // padded tokens are never predicted
    }
}

void crossentropy_forward(float *losses, const float *probs, const int *targets, int B, int T, int Vp) {
    // losses is (B,T), probs is (B,T,Vp), targets is (B,T) token ids
    for (size_t r = 0; r < (size_t)B * T; r++) losses[r] = -logf(probs[r * Vp + targets[r]]);
}

void crossentropy_softmax_backward(float *dlogits, const float *dlosses, const float *probs,
                                   const int *targets, int B, int T, int V, int Vp) {
    // dlogits and probs are (B,T,Vp), dlosses and targets are (B,T)
    for (size_t r = 0; r < (size_t)B * T; r++) {
        float *dl = dlogits + r * Vp;
        const float *p = probs + r * Vp;
        const float dloss = dlosses[r];
        const int ix = targets[r];
        const float dl_ix = dl[ix];
        axpy_f(dl, dloss, p, V);
        dl[ix] = dl_ix + (p[ix] - 1.0f) * dloss; // the one-hot entry, rounded as llm.c's (p - 1) * dloss
    }
}
