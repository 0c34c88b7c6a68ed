/* test_model.c — the whole GPT-2 of src/model.c: gradients against finite differences of the
 * loss, the forward against an independent double-precision GPT-2, bit-for-bit determinism, micro-batch gradient accumulation, that SGD learns, presets,
 * parameter counts, config validation and padding. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "layout.h"
#include "model.h"

static const char *tensor_names[GPT2_NUM_PARAM_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng_u32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (rng_u32() >> 8) * (1.0f / 16777216.0f); }

/* L=2 so the gradient has to flow through the residual stream of one layer into another */
static GPT2Config small_test_config(void) {
    return (GPT2Config){.max_seq_len = 8, .vocab_size = 32, .padded_vocab_size = 40,
                        .num_layers = 2, .num_heads = 2, .channels = 16};
}

static void random_tokens(int *x, int n, int V) {
    for (int i = 0; i < n; i++) x[i] = (int)(rng_u32() % (uint32_t)V);
}

/* fmax that lets NaN win, so a NaN result cannot pass a `worst < tol` check */
static double nanmax(double a, double b) { return isnan(a) || isnan(b) ? NAN : fmax(a, b); }

static int all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return 0;
    return 1;
}

/* parameters well away from GPT-2's init, so that every term of the model matters */
static void randomize_params(GPT2 *m, const GPT2Config *cfg) {
    size_t sizes[GPT2_NUM_PARAM_TENSORS], off = 0;
    gpt2_param_sizes(cfg, sizes);
    float *params = gpt2_params(m);
    for (int t = 0; t < GPT2_NUM_PARAM_TENSORS; t++) {
        int is_lnw = t == 2 || t == 8 || t == 14;
        for (size_t i = 0; i < sizes[t]; i++) params[off + i] = is_lnw ? rng_uniform(0.6f, 1.4f) : rng_uniform(-0.3f, 0.3f);
        if (t == 0) /* wte's padded rows stay 0, as after gpt2_init_params */
            memset(params + (size_t)cfg->vocab_size * cfg->channels, 0,
                   (size_t)(cfg->padded_vocab_size - cfg->vocab_size) * cfg->channels * sizeof(float));
        off += sizes[t];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* an independent GPT-2 forward in double, written from the definition (pre-LayerNorm blocks,
 * learned positions, tanh GELU, causal attention, tied embeddings), for test_reference_forward */

static void ref_layernorm(double *out, const double *x, const float *w, const float *b, int C) {
    double m = 0.0, v = 0.0;
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= C;
    for (int i = 0; i < C; i++) out[i] = (x[i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
}

/* out (OC) = W (OC,IC) x (IC) + b */
static void ref_linear(double *out, const double *x, const float *W, const float *b, int IC, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < IC; i++) s += (double)W[(size_t)o * IC + i] * x[i];
        out[o] = s;
    }
}

/* returns the mean loss; probs (B,T,V) */
static double ref_forward(const float *params, const GPT2Config *cfg, const int *in, const int *tg, int B, int T,
                          double *probs) {
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, V = cfg->vocab_size, hs = C / NH;
    size_t sizes[GPT2_NUM_PARAM_TENSORS];
    const float *P[GPT2_NUM_PARAM_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    for (int t = 0, off = 0; t < GPT2_NUM_PARAM_TENSORS; off += (int)sizes[t], t++) P[t] = params + off;
    double *x = malloc(sizeof(double) * T * C), *h = malloc(sizeof(double) * T * C), *qkv = malloc(sizeof(double) * T * 3 * C);
    double *y = malloc(sizeof(double) * T * C), *f = malloc(sizeof(double) * 4 * C), *tmp = malloc(sizeof(double) * C);
    double *logit = malloc(sizeof(double) * V), loss = 0.0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) x[t * C + c] = (double)P[0][in[b * T + t] * C + c] + P[1][t * C + c];
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < T; t++) {
                ref_layernorm(h + t * C, x + t * C, P[2] + l * C, P[3] + l * C, C);
                ref_linear(qkv + t * 3 * C, h + t * C, P[4] + (size_t)l * 3 * C * C, P[5] + l * 3 * C, C, 3 * C);
            }
            for (int hd = 0; hd < NH; hd++)
                for (int t = 0; t < T; t++) {
                    double s[64], mx = -1e300, sum = 0.0;
                    for (int u = 0; u <= t; u++) {
                        s[u] = 0.0;
                        for (int i = 0; i < hs; i++) s[u] += qkv[t * 3 * C + hd * hs + i] * qkv[u * 3 * C + C + hd * hs + i];
                        s[u] /= sqrt((double)hs);
                        mx = fmax(mx, s[u]);
                    }
                    for (int u = 0; u <= t; u++) sum += (s[u] = exp(s[u] - mx));
                    for (int i = 0; i < hs; i++) {
                        double o = 0.0;
                        for (int u = 0; u <= t; u++) o += s[u] / sum * qkv[u * 3 * C + 2 * C + hd * hs + i];
                        y[t * C + hd * hs + i] = o;
                    }
                }
            for (int t = 0; t < T; t++) {
                ref_linear(tmp, y + t * C, P[6] + (size_t)l * C * C, P[7] + l * C, C, C);
                for (int c = 0; c < C; c++) x[t * C + c] += tmp[c];
                ref_layernorm(h + t * C, x + t * C, P[8] + l * C, P[9] + l * C, C);
                ref_linear(f, h + t * C, P[10] + (size_t)l * 4 * C * C, P[11] + l * 4 * C, C, 4 * C);
                for (int i = 0; i < 4 * C; i++)
                    f[i] = 0.5 * f[i] * (1.0 + tanh(sqrt(2.0 / M_PI) * (f[i] + 0.044715 * f[i] * f[i] * f[i])));
                ref_linear(tmp, f, P[12] + (size_t)l * C * 4 * C, P[13] + l * C, 4 * C, C);
                for (int c = 0; c < C; c++) x[t * C + c] += tmp[c];
            }
        }
        for (int t = 0; t < T; t++) {
            ref_layernorm(h + t * C, x + t * C, P[14], P[15], C);
            ref_linear(logit, h + t * C, P[0], NULL, C, V); /* tied: the first V rows of wte */
            double mx = -1e300, sum = 0.0;
            for (int v = 0; v < V; v++) mx = fmax(mx, logit[v]);
            for (int v = 0; v < V; v++) sum += exp(logit[v] - mx);
            for (int v = 0; v < V; v++) probs[((size_t)b * T + t) * V + v] = exp(logit[v] - mx) / sum;
            loss += log(sum) + mx - logit[tg[b * T + t]];
        }
    }
    free(x), free(h), free(qkv), free(y), free(f), free(tmp), free(logit);
    return loss / (B * T);
}

/* The forward pass is the GPT-2 of the definition: loss and probabilities agree with the
 * double-precision reference to fp32 accuracy (1e-5). */
static void test_reference_forward(void) {
    GPT2Config cfg = small_test_config();
    const int B = 2, T = 8, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    GPT2 *m = gpt2_create(&cfg, B, T, 0);
    CHECK(m != NULL, "gpt2_create");
    if (!m) return;
    randomize_params(m, &cfg);
    int inputs[16], targets[16];
    random_tokens(inputs, B * T, V);
    random_tokens(targets, B * T, V);
    double *ref_probs = malloc(sizeof(double) * B * T * V);
    double ref_loss = ref_forward(gpt2_params(m), &cfg, inputs, targets, B, T, ref_probs);
    float loss = gpt2_forward(m, inputs, targets, B, T);
    CHECK(fabs(loss - ref_loss) <= 1e-5 * ref_loss, "loss %.8g, reference %.8g", loss, ref_loss);
    double worst = 0.0;
    for (int r = 0; r < B * T; r++)
        for (int v = 0; v < V; v++) worst = nanmax(worst, fabs(gpt2_probs(m)[r * Vp + v] - ref_probs[r * V + v]));
    CHECK(worst < 1e-5, "probabilities differ from the reference by %g", worst);
    free(ref_probs);
    gpt2_free(m);
}

/* (a) Whole-model gradient check. The parameters are drawn larger than GPT-2's init (std 0.02
 * gives gradients too small to tell from finite-difference noise) and the biases and
 * LayerNorm weights nonzero, so every tensor has O(1e-2..1e-1) gradients.
 * Central differences with eps = 1e-2 of the float loss: rounding noise ~ 3e-7 / 2e-2 ~ 1e-5 and
 * truncation ~ eps^2 f''' / 6. Tolerance |numeric - analytic| <= 5e-5 + 5e-3 * |analytic|; the
 * worst sample seen is at 1/4 of it. */
static void test_gradcheck(void) {
    GPT2Config cfg = small_test_config();
    const int B = 2, T = 8, V = cfg.vocab_size, C = cfg.channels;
    GPT2 *m = gpt2_create(&cfg, B, T, 0);
    CHECK(m != NULL, "gpt2_create");
    if (!m) return;
    size_t sizes[GPT2_NUM_PARAM_TENSORS], off = 0;
    gpt2_param_sizes(&cfg, sizes);
    float *params = gpt2_params(m), *grads = gpt2_grads(m);
    randomize_params(m, &cfg);
    int inputs[16], targets[16];
    random_tokens(inputs, B * T, V);
    random_tokens(targets, B * T, V);

    gpt2_zero_grad(m);
    float loss = gpt2_forward(m, inputs, targets, B, T);
    CHECK(isfinite(loss) && loss > 0.0f, "loss %g", loss);
    gpt2_backward(m, 1.0f);

    const float eps = 1e-2f;
    for (int t = 0; t < GPT2_NUM_PARAM_TENSORS; t++) {
        int bad = 0, nonzero = 0;
        for (int s = 0; s < 8; s++) {
            size_t i = off + rng_u32() % sizes[t];
            if (t == 0 && s < 6) i = rng_u32() % ((size_t)V * C); /* mostly real rows of wte */
            if (t == 1 && s < 6) i = off + rng_u32() % ((size_t)T * C); /* mostly used rows of wpe */
            float orig = params[i], xp = orig + eps, xm = orig - eps;
            params[i] = xp;
            double lp = gpt2_forward(m, inputs, targets, B, T);
            params[i] = xm;
            double lm = gpt2_forward(m, inputs, targets, B, T);
            params[i] = orig;
            double numeric = (lp - lm) / ((double)xp - (double)xm), analytic = grads[i];
            nonzero += fabs(analytic) > 1e-3;
            if (!(fabs(numeric - analytic) <= 5e-5 + 5e-3 * fabs(analytic))) {
                fprintf(stderr, "  %s[%zu]: numeric %.6g analytic %.6g\n", tensor_names[t], i - off, numeric, analytic);
                bad++;
            }
        }
        CHECK(bad == 0, "%s: %d of 8 gradient entries off", tensor_names[t], bad);
        CHECK(nonzero > 0, "%s: no sampled gradient above 1e-3, the check proves nothing", tensor_names[t]);
        off += sizes[t];
    }
    gpt2_free(m);
}

/* (b) Same seed, same inputs: identical parameters, loss and gradients, bit for bit. */
static void test_determinism(void) {
    GPT2Config cfg = small_test_config();
    const int B = 2, T = 8;
    size_t pad = gpt2_num_params(&cfg) + 37;
    GPT2 *a = gpt2_create(&cfg, B, T, pad), *b = gpt2_create(&cfg, B, T, pad), *c = gpt2_create(&cfg, B, T, pad);
    CHECK(a && b && c, "gpt2_create");
    if (!a || !b || !c) return;
    gpt2_init_params(a, 1234);
    gpt2_init_params(b, 1234);
    gpt2_init_params(c, 1235);
    CHECK(memcmp(gpt2_params(a), gpt2_params(b), pad * sizeof(float)) == 0, "same seed, different parameters");
    CHECK(memcmp(gpt2_params(a), gpt2_params(c), pad * sizeof(float)) != 0, "different seeds, same parameters");

    int inputs[16], targets[16];
    random_tokens(inputs, B * T, cfg.vocab_size);
    random_tokens(targets, B * T, cfg.vocab_size);
    gpt2_zero_grad(a);
    gpt2_zero_grad(b);
    float la = gpt2_forward(a, inputs, targets, B, T);
    gpt2_backward(a, 1.0f);
    float lb = gpt2_forward(b, inputs, targets, B, T);
    gpt2_backward(b, 1.0f);
    CHECK(memcmp(&la, &lb, sizeof la) == 0, "losses differ: %.9g vs %.9g", la, lb);
    CHECK(memcmp(gpt2_grads(a), gpt2_grads(b), pad * sizeof(float)) == 0, "gradients differ between models");

    /* and a rerun on the same model, after other work has dirtied its buffers */
    float *g1 = malloc(pad * sizeof(float));
    memcpy(g1, gpt2_grads(a), pad * sizeof(float));
    int other[16];
    random_tokens(other, B * T, cfg.vocab_size);
    gpt2_forward(a, other, inputs, B, T);
    gpt2_backward(a, 3.0f);
    gpt2_zero_grad(a);
    float la2 = gpt2_forward(a, inputs, targets, B, T);
    gpt2_backward(a, 1.0f);
    CHECK(memcmp(&la, &la2, sizeof la) == 0, "rerun loss differs: %.9g vs %.9g", la, la2);
    CHECK(memcmp(g1, gpt2_grads(a), pad * sizeof(float)) == 0, "rerun gradients differ");
    free(g1);
    gpt2_free(a);
    gpt2_free(b);
    gpt2_free(c);
}

/* (c) Two micro-batches with loss_scale 0.5 each accumulate to the gradient of their
 * concatenation with scale 1. Tolerance per tensor: max |difference| <= 1e-5 * max |gradient|
 * (the sums are reassociated, so elements that cancel differ by more than 1e-5 of themselves). */
static void test_accumulation(void) {
    GPT2Config cfg = small_test_config();
    const int B = 4, T = 8;
    const size_t pad = gpt2_num_params(&cfg) + 100;
    GPT2 *m = gpt2_create(&cfg, B, T, pad);
    CHECK(m != NULL, "gpt2_create");
    if (!m) return;
    gpt2_init_params(m, 7);
    int inputs[32], targets[32];
    random_tokens(inputs, B * T, cfg.vocab_size);
    random_tokens(targets, B * T, cfg.vocab_size);

    gpt2_zero_grad(m);
    float l1 = gpt2_forward(m, inputs, targets, 2, T);
    gpt2_backward(m, 0.5f);
    float l2 = gpt2_forward(m, inputs + 2 * T, targets + 2 * T, 2, T);
    gpt2_backward(m, 0.5f);
    float *acc = malloc(pad * sizeof(float));
    memcpy(acc, gpt2_grads(m), pad * sizeof(float));

    gpt2_zero_grad(m);
    float lfull = gpt2_forward(m, inputs, targets, B, T);
    gpt2_backward(m, 1.0f);
    const float *full = gpt2_grads(m);
    CHECK(fabsf(lfull - 0.5f * (l1 + l2)) < 1e-6f * lfull, "loss %.9g vs mean of halves %.9g", lfull, 0.5f * (l1 + l2));

    size_t sizes[GPT2_NUM_PARAM_TENSORS], off = 0;
    gpt2_param_sizes(&cfg, sizes);
    for (int t = 0; t < GPT2_NUM_PARAM_TENSORS; t++) {
        double maxg = 0.0, maxd = 0.0;
        for (size_t i = off; i < off + sizes[t]; i++) {
            maxg = nanmax(maxg, fabs(full[i]));
            maxd = nanmax(maxd, fabs((double)full[i] - acc[i]));
        }
        CHECK(maxg > 0.0, "%s: zero gradient", tensor_names[t]);
        CHECK(maxd <= 1e-5 * maxg, "%s: accumulated differs by %g (max gradient %g)", tensor_names[t], maxd, maxg);
        off += sizes[t];
    }
    CHECK(all_zero(acc + off, pad - off) && all_zero(full + off, pad - off), "gradient padding is not zero");
    /* wte's padded rows are never a target: no gradient */
    CHECK(all_zero(full + (size_t)cfg.vocab_size * cfg.channels,
                   (size_t)(cfg.padded_vocab_size - cfg.vocab_size) * cfg.channels), "padded wte rows got gradient");
    free(acc);
    gpt2_free(m);
}

/* (d) Plain SGD on a repeating sequence drives the loss down. */
static void test_sgd_learns(void) {
    GPT2Config cfg = {.max_seq_len = 16, .vocab_size = 16, .padded_vocab_size = 16,
                      .num_layers = 2, .num_heads = 4, .channels = 32};
    const int B = 2, T = 16;
    GPT2 *m = gpt2_create(&cfg, B, T, 0);
    CHECK(m != NULL, "gpt2_create");
    if (!m) return;
    gpt2_init_params(m, 42);
    const int pattern[6] = {3, 1, 4, 1, 5, 9};
    int inputs[32], targets[32];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = pattern[(b + t) % 6];
            targets[b * T + t] = pattern[(b + t + 1) % 6];
        }
    float *params = gpt2_params(m), *grads = gpt2_grads(m);
    size_t n = gpt2_padded_params(m);
    float first = 0.0f, last = 0.0f;
    for (int step = 0; step < 60; step++) {
        gpt2_zero_grad(m);
        last = gpt2_forward(m, inputs, targets, B, T);
        if (step == 0) first = last;
        gpt2_backward(m, 1.0f);
        for (size_t i = 0; i < n; i++) params[i] -= 0.1f * grads[i];
    }
    CHECK(isfinite(last) && last < 0.5f * first, "SGD: loss %g -> %g", first, last);
    gpt2_free(m);
}

/* (e) presets, parameter counts and layout */
static void test_presets(void) {
    GPT2Config cfg;
    CHECK(gpt2_preset("tiny", &cfg) == 0, "tiny");
    CHECK(cfg.num_layers == 2 && cfg.channels == 64 && cfg.num_heads == 4 && cfg.max_seq_len == 64 &&
              cfg.vocab_size == 256 && cfg.padded_vocab_size == 256, "tiny preset values");
    CHECK(gpt2_config_check(&cfg) == NULL, "tiny is rejected");
    CHECK(gpt2_preset("small", &cfg) == 0, "small");
    CHECK(cfg.num_layers == 6 && cfg.channels == 384 && cfg.num_heads == 6 && cfg.max_seq_len == 256 &&
              cfg.vocab_size == 256 && cfg.padded_vocab_size == 256, "small preset values");
    CHECK(gpt2_config_check(&cfg) == NULL, "small is rejected");
    CHECK(gpt2_preset("gpt2-124m", &cfg) == 0, "gpt2-124m");
    CHECK(cfg.num_layers == 12 && cfg.channels == 768 && cfg.num_heads == 12 && cfg.max_seq_len == 1024 &&
              cfg.vocab_size == 50257 && cfg.padded_vocab_size == 50304, "gpt2-124m preset values");
    CHECK(gpt2_config_check(&cfg) == NULL, "gpt2-124m is rejected");
    CHECK(gpt2_preset("gpt2-xxl", &cfg) == -1, "unknown preset accepted");
    CHECK(gpt2_preset("micro", &cfg) == 0, "micro");
    CHECK(cfg.num_layers == 1 && cfg.channels == 32 && cfg.num_heads == 2 && cfg.max_seq_len == 32 &&
              cfg.vocab_size == 256 && cfg.padded_vocab_size == 256, "micro preset values");
    CHECK(gpt2_config_check(&cfg) == NULL, "micro is rejected");

    /* Vp C + maxT C + L (12 C^2 + 13 C) + 2 C */
    const char *names[4] = {"micro", "tiny", "small", "gpt2-124m"};
    const size_t expected[4] = {21984, 120576, 10844160, 124475904}; /* the last is llm.c's count */
    for (int i = 0; i < 4; i++) {
        gpt2_preset(names[i], &cfg);
        size_t C = cfg.channels, L = cfg.num_layers;
        size_t formula = cfg.padded_vocab_size * C + cfg.max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
        CHECK(formula == expected[i] && gpt2_num_params(&cfg) == expected[i], "%s: %zu params, formula %zu, expected %zu",
              names[i], gpt2_num_params(&cfg), formula, expected[i]);
    }

    size_t sizes[GPT2_NUM_PARAM_TENSORS], sum = 0;
    gpt2_preset("small", &cfg);
    gpt2_param_sizes(&cfg, sizes);
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) sum += sizes[i];
    const size_t C = 384, L = 6;
    const size_t want[GPT2_NUM_PARAM_TENSORS] = {256 * C, 256 * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                                                 L * C, L * C, L * 4 * C * C, L * 4 * C, L * 4 * C * C, L * C, C, C};
    CHECK(memcmp(sizes, want, sizeof want) == 0 && sum == gpt2_num_params(&cfg), "small: tensor sizes not llm.c's");
}

static void check_rejected(GPT2Config cfg, const char *field) {
    const char *msg = gpt2_config_check(&cfg);
    CHECK(msg != NULL && strstr(msg, field) != NULL, "bad %s: message '%s'", field, msg ? msg : "(accepted)");
    CHECK(gpt2_create(&cfg, 1, 1, 0) == NULL, "gpt2_create accepted a bad %s", field);
}

static void test_config_check(void) {
    GPT2Config good = small_test_config(), c;
    CHECK(gpt2_config_check(&good) == NULL, "good config rejected: %s", gpt2_config_check(&good));
    c = good, c.channels = 18, c.num_heads = 4;
    check_rejected(c, "channels");
    c = good, c.channels = 18, c.num_heads = 4;
    check_rejected(c, "num_heads");
    c = good, c.max_seq_len = 0;
    check_rejected(c, "max_seq_len");
    c = good, c.vocab_size = 0;
    check_rejected(c, "vocab_size");
    c = good, c.padded_vocab_size = 0;
    check_rejected(c, "padded_vocab_size");
    c = good, c.num_layers = 0;
    check_rejected(c, "num_layers");
    c = good, c.num_heads = 0;
    check_rejected(c, "num_heads");
    c = good, c.channels = 0;
    check_rejected(c, "channels");
    c = good, c.padded_vocab_size = good.vocab_size - 1;
    check_rejected(c, "padded_vocab_size");
    c = good, c.channels = -16;
    check_rejected(c, "channels");
}

/* padding, limits and the probabilities-only forward */
static void test_padding_and_limits(void) {
    GPT2Config cfg = small_test_config();
    const size_t n = gpt2_num_params(&cfg);
    CHECK(gpt2_create(&cfg, 2, 8, n - 1) == NULL, "padded_params < num_params accepted");
    CHECK(gpt2_create(&cfg, 2, 9, 0) == NULL, "T > max_seq_len accepted");
    CHECK(gpt2_create(&cfg, 0, 8, 0) == NULL, "B = 0 accepted");
    GPT2 *m = gpt2_create(&cfg, 2, 8, n + 1000);
    CHECK(m != NULL, "gpt2_create");
    if (!m) return;
    CHECK(gpt2_padded_params(m) == n + 1000, "padded_params %zu", gpt2_padded_params(m));
    CHECK(memcmp(gpt2_config(m), &cfg, sizeof cfg) == 0, "gpt2_config");
    gpt2_init_params(m, 99);
    float *p = gpt2_params(m);
    CHECK(all_zero(p + n, 1000), "parameter padding not zero after init");
    CHECK(all_zero(p + (size_t)cfg.vocab_size * cfg.channels, (size_t)(cfg.padded_vocab_size - cfg.vocab_size) * cfg.channels),
          "padded wte rows not zero after init");
    /* init statistics: wte ~ N(0, 0.02), attprojw ~ N(0, 0.02 / sqrt(2L)), ln1w = 1, qkvb = 0 */
    size_t sizes[GPT2_NUM_PARAM_TENSORS], offs[GPT2_NUM_PARAM_TENSORS], off = 0;
    gpt2_param_sizes(&cfg, sizes);
    for (int t = 0; t < GPT2_NUM_PARAM_TENSORS; t++) offs[t] = off, off += sizes[t];
    double s2 = 0.0;
    for (size_t i = 0; i < sizes[4]; i++) s2 += (double)p[offs[4] + i] * p[offs[4] + i];
    CHECK(fabs(sqrt(s2 / sizes[4]) - 0.02) < 0.002, "qkvw std %g", sqrt(s2 / sizes[4]));
    s2 = 0.0;
    for (size_t i = 0; i < sizes[6]; i++) s2 += (double)p[offs[6] + i] * p[offs[6] + i];
    CHECK(fabs(sqrt(s2 / sizes[6]) - 0.01) < 0.002, "attprojw std %g, want 0.02/sqrt(4)", sqrt(s2 / sizes[6]));
    CHECK(p[offs[2]] == 1.0f && p[offs[14] + cfg.channels - 1] == 1.0f && all_zero(p + offs[5], sizes[5]),
          "LayerNorm weights 1, biases 0");

    int inputs[16], bad[16];
    random_tokens(inputs, 16, cfg.vocab_size);
    memcpy(bad, inputs, sizeof bad);
    bad[5] = cfg.vocab_size;
    CHECK(isnan(gpt2_forward(m, bad, NULL, 2, 8)), "out-of-range token accepted");
    CHECK(isnan(gpt2_forward(m, inputs, NULL, 3, 8)), "B above the create-time maximum accepted");
    CHECK(gpt2_forward(m, inputs, NULL, 2, 8) == -1.0f, "forward without targets must return -1");
    const float *probs = gpt2_probs(m);
    double worst = 0.0;
    int pad_zero = 1;
    for (int r = 0; r < 16; r++) {
        double s = 0.0;
        for (int i = 0; i < cfg.vocab_size; i++) s += probs[r * cfg.padded_vocab_size + i];
        for (int i = cfg.vocab_size; i < cfg.padded_vocab_size; i++) pad_zero &= probs[r * cfg.padded_vocab_size + i] == 0.0f;
        worst = nanmax(worst, fabs(s - 1.0));
    }
    CHECK(worst < 1e-5 && pad_zero, "probabilities: rows sum to 1 +- %g, padded zero %d", worst, pad_zero);
    /* shorter sequences than the maximum work and agree with the prefix of a longer one (causal) */
    float p4[4 * 40];
    gpt2_forward(m, inputs, NULL, 1, 4);
    memcpy(p4, gpt2_probs(m), sizeof p4);
    gpt2_forward(m, inputs, NULL, 1, 8);
    double dmax = 0.0;
    for (int i = 0; i < 4 * 40; i++) dmax = nanmax(dmax, fabs(p4[i] - gpt2_probs(m)[i]));
    CHECK(dmax < 1e-6, "causality: a prefix's probabilities change with later tokens by %g", dmax);
    gpt2_free(m);
}


/* (d) Model parallelism: the whole model against its four parts for tp 2 x pp 2 (each slice
 * on a thread of its own, the tensor-parallel allreduce over a barrier, summing slice 0 + 1 in
 * that order on both). The parts' map covers every parameter; their loss and gradients (the
 * tied wte's summed over the first and the last stage) equal the whole model's within fp32
 * reassociation: max |difference| <= 1e-4 * max |gradient| per tensor. */
#include <pthread.h>

typedef struct {
    pthread_barrier_t *bar;
    float **slot; /* slot[slice] = the buffer each slice sums */
    int slice;
} TPFake;

static int fake_tp_allreduce(void *arg, float *buf, size_t n) {
    TPFake *f = arg;
    f->slot[f->slice] = buf;
    pthread_barrier_wait(f->bar);
    float *sum = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) sum[i] = f->slot[0][i] + f->slot[1][i];
    pthread_barrier_wait(f->bar); /* both read before either writes */
    memcpy(buf, sum, n * sizeof(float));
    free(sum);
    pthread_barrier_wait(f->bar);
    return 0;
}

typedef struct {
    GPT2 *m;
    const int *in, *tg;
    const float *x_in, *dout;
    int B, T, backward;
    float loss;
} PartJob;

static void *run_part(void *arg) {
    PartJob *j = arg;
    if (j->backward) j->loss = (float)gpt2_backward_part(j->m, 1.0f, j->dout);
    else j->loss = gpt2_forward_part(j->m, j->in, j->tg, j->x_in, j->B, j->T);
    return NULL;
}

/* runs the two slices of one stage at once */
static void run_stage(GPT2 *s0, GPT2 *s1, PartJob proto, float *loss) {
    PartJob j[2] = {proto, proto};
    j[0].m = s0;
    j[1].m = s1;
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run_part, &j[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    if (loss) *loss = j[0].loss;
    CHECK(memcmp(&j[0].loss, &j[1].loss, sizeof(float)) == 0, "the two slices disagree: %g vs %g", j[0].loss, j[1].loss);
}

static void test_parts(void) {
    GPT2Config cfg = small_test_config();
    const int B = 2, T = 8;
    size_t n = gpt2_num_params(&cfg);
    GPT2 *whole = gpt2_create(&cfg, B, T, 0), *part[2][2];
    CHECK(whole != NULL, "gpt2_create");
    if (!whole) return;
    gpt2_init_params(whole, 99);
    pthread_barrier_t bar[2];
    float *slots[2][2];
    TPFake fake[2][2];
    float *back = calloc(n, sizeof(float));
    for (int p = 0; p < 2; p++) {
        pthread_barrier_init(&bar[p], NULL, 2);
        for (int t = 0; t < 2; t++) {
            GPT2Part q = {2, t, p, p + 1};
            CHECK(gpt2_part_check(&cfg, &q) == NULL, "part %d,%d rejected", p, t);
            part[p][t] = gpt2_create_part(&cfg, &q, B, T, 0);
            gpt2_init_params(part[p][t], 99);
            fake[p][t] = (TPFake){&bar[p], slots[p], t};
            gpt2_set_tp_allreduce(part[p][t], fake_tp_allreduce, &fake[p][t]);
            gpt2_part_map(&cfg, &q, back, gpt2_params(part[p][t]), 0);
            gpt2_zero_grad(part[p][t]);
        }
    }
    CHECK(memcmp(back, gpt2_params(whole), n * sizeof(float)) == 0, "the parts' parameters do not cover the whole model");
    GPT2Part bad = {3, 0, 0, 2};
    CHECK(gpt2_part_check(&cfg, &bad) != NULL, "tp 3 of 2 heads accepted");

    int in[16], tg[16];
    random_tokens(in, B * T, cfg.vocab_size);
    random_tokens(tg, B * T, cfg.vocab_size);
    gpt2_zero_grad(whole);
    float lw = gpt2_forward(whole, in, tg, B, T);
    gpt2_backward(whole, 1.0f);
    float l0, l1;
    run_stage(part[0][0], part[0][1], (PartJob){.in = in, .tg = tg, .B = B, .T = T}, &l0);
    CHECK(memcmp(gpt2_part_output(part[0][0]), gpt2_part_output(part[0][1]), (size_t)B * T * cfg.channels * 4) == 0,
          "the slices' outputs differ");
    run_stage(part[1][0], part[1][1], (PartJob){.in = in, .tg = tg, .x_in = gpt2_part_output(part[0][0]), .B = B, .T = T},
              &l1);
    CHECK(fabsf(l1 - lw) <= 1e-5f * fabsf(lw), "loss: parts %.9g, whole %.9g", l1, lw);
    run_stage(part[1][0], part[1][1], (PartJob){.backward = 1}, NULL);
    run_stage(part[0][0], part[0][1], (PartJob){.backward = 1, .dout = gpt2_part_dinput(part[1][0])}, NULL);

    /* every part's gradients against the whole model's, mapped into the part's layout */
    double sumsq = 0.0;
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < 2; t++) {
            GPT2Part q = {2, t, p, p + 1};
            size_t ln = gpt2_part_num_params(&cfg, &q), sizes[GPT2_NUM_PARAM_TENSORS];
            gpt2_part_param_sizes(&cfg, &q, sizes);
            float *want = calloc(ln, sizeof(float)), *got = gpt2_grads(part[p][t]);
            gpt2_part_map(&cfg, &q, gpt2_grads(whole), want, 1);
            size_t nw, nw_other;
            float *wte = gpt2_wte_grad(part[p][t], &nw), *wte_other = gpt2_wte_grad(part[1 - p][t], &nw_other);
            for (size_t i = 0; i < nw; i++) wte[i] += wte_other[i]; /* the tied embedding's two halves */
            size_t off = 0;
            for (int k = 0; k < GPT2_NUM_PARAM_TENSORS; k++) {
                double worst = 0, scale = 0;
                for (size_t i = 0; i < sizes[k]; i++) {
                    worst = nanmax(worst, fabs((double)got[off + i] - want[off + i]));
                    scale = fmax(scale, fabs(want[off + i]));
                }
                CHECK(worst <= 1e-4 * scale + 1e-12, "part (%d,%d) %s: max |diff| %.3g, max |grad| %.3g", p, t,
                      tensor_names[k], worst, scale);
                off += sizes[k];
            }
            sumsq += gpt2_part_grad_sumsq(part[p][t]); /* with the summed wte, as the trainer has it */
            for (size_t i = 0; i < nw; i++) wte[i] -= wte_other[i];
            free(want);
        }
    double whole_sumsq = 0.0;
    for (size_t i = 0; i < n; i++) whole_sumsq += (double)gpt2_grads(whole)[i] * gpt2_grads(whole)[i];
    CHECK(fabs(sumsq - whole_sumsq) <= 1e-4 * whole_sumsq, "gradient norm^2: parts %.9g, whole %.9g", sumsq, whole_sumsq);
    for (int p = 0; p < 2; p++) {
        for (int t = 0; t < 2; t++) gpt2_free(part[p][t]);
        pthread_barrier_destroy(&bar[p]);
    }
    free(back);
    gpt2_free(whole);
}

/* (e) The layout: Megatron's order (tensor innermost, then data, pipeline outermost), every
 * rank a coordinate and back, the layers split evenly, bad degrees refused with the option. */
static void test_layout(void) {
    GPT2Config cfg = small_test_config(); /* 2 heads, 2 layers */
    Layout l;
    char err[256];
    CHECK(layout_make(8, 2, 2, &cfg, &l, err, sizeof err) == 0 && l.dp == 2, "8 ranks tp 2 pp 2: %s", err);
    Coord c = layout_coord(&l, 5);
    CHECK(c.t == 1 && c.d == 0 && c.p == 1, "rank 5 is (d %d, p %d, t %d), expected (0, 1, 1)", c.d, c.p, c.t);
    c = layout_coord(&l, 2);
    CHECK(c.t == 0 && c.d == 1 && c.p == 0, "rank 2 is (d %d, p %d, t %d), expected (1, 0, 0)", c.d, c.p, c.t);
    for (int r = 0; r < 8; r++) CHECK(layout_rank(&l, layout_coord(&l, r)) == r, "rank %d does not round-trip", r);
    CHECK(layout_make(6, 2, 2, &cfg, &l, err, sizeof err) != 0 && strstr(err, "--tp 2 x --pp 2"), "6 ranks: %s", err);
    CHECK(layout_make(4, 4, 1, &cfg, &l, err, sizeof err) != 0 && strstr(err, "--tp: expected a divisor of the model's 2"),
          "tp 4 of 2 heads: %s", err);
    CHECK(layout_make(4, 1, 4, &cfg, &l, err, sizeof err) != 0 && strstr(err, "--pp: expected at most the model's 2"),
          "pp 4 of 2 layers: %s", err);
    int a, b, prev = 0;
    for (int p = 0; p < 3; p++) { /* 7 layers in 3 stages: 3 2 2 */
        layout_stage_layers(7, 3, p, &a, &b);
        CHECK(a == prev && b - a == (p == 0 ? 3 : 2), "stage %d of 7 layers / 3: [%d, %d)", p, a, b);
        prev = b;
    }
}

int main(void) {
    RUN_TEST(test_reference_forward);
    RUN_TEST(test_gradcheck);
    RUN_TEST(test_determinism);
    RUN_TEST(test_accumulation);
    RUN_TEST(test_sgd_learns);
    RUN_TEST(test_presets);
    RUN_TEST(test_config_check);
    RUN_TEST(test_padding_and_limits);
    RUN_TEST(test_parts);
    RUN_TEST(test_layout);
    TEST_MAIN_END();
}
