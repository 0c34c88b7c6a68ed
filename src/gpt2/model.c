/* model.c — GPT-2 as llm.c's train_gpt2.c defines it: parameters in llm.c's order and layout,
 * the forward pass caching per-layer activations, and the backward pass reusing them.
 *
 * All memory is allocated in gpt2_create for the maximum batch B x T. Activation gradients are
 * scratch for one layer at a time (the backward pass walks the layers in order and never needs
 * two at once), so they cost O(B T C) rather than llm.c's O(L B T C); preatt is likewise
 * shared by the layers, since the backward pass only needs att. */
#include "model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "util.h"

/* tensor indices, llm.c order */
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };

struct GPT2 {
    GPT2Config cfg;
    int maxB, maxT;                           /* create-time limits */
    size_t num_params, padded_params;
    size_t sizes[GPT2_NUM_PARAM_TENSORS];
    float *params, *grads;                    /* flat, padded_params floats each */
    float *p[GPT2_NUM_PARAM_TENSORS];         /* tensor views into params */
    float *g[GPT2_NUM_PARAM_TENSORS];         /* tensor views into grads */

    /* activations of the last forward, laid out for its B, T (llm.c's ActivationTensors) */
    float *encoded;                           /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd;         /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *qkv;                               /* (L,B,T,3C) */
    float *atty;                              /* (L,B,T,C) */
    float *att;                               /* (L,B,NH,T,T) */
    float *residual2;                         /* (L,B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd;         /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *fch, *fch_gelu;                    /* (L,B,T,4C) */
    float *residual3;                         /* (L,B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd;         /* (B,T,C), (B,T), (B,T) */
    float *logits, *probs;                    /* (B,T,Vp) */
    float *losses;                            /* (B,T) */
    float *preatt;                            /* (B,NH,T,T), any layer's, not needed by backward */
    float *proj;                              /* (B,T,C), attproj / fcproj before the residual add */

    /* activation gradients: one layer's worth, reused */
    float *dresidual;                         /* (B,T,C) gradient of the residual stream */
    float *dln;                               /* (B,T,C) of ln1 / ln2 / lnf outputs */
    float *datty;                             /* (B,T,C) */
    float *dqkv;                              /* (B,T,3C) */
    float *dfch, *dfch_gelu;                  /* (B,T,4C) */
    float *dpreatt, *datt;                    /* (B,NH,T,T) */
    float *dlogits;                           /* (B,T,Vp) */
    float *dlosses;                           /* (B,T) */

    float *acts_memory;                       /* one block holding everything above */
    int *inputs, *targets;                    /* (B,T) copies of the last forward's tokens */
    int B, T;                                 /* of the last forward */
    int has_targets;                          /* last forward computed losses: backward allowed */
    int (*aborted)(const void *arg);          /* asked between layers: stop the pass early */
    const void *aborted_arg;
};

void gpt2_set_abort_check(GPT2 *m, int (*aborted)(const void *arg), const void *arg) {
    m->aborted = aborted;
    m->aborted_arg = arg;
}

static int aborted(const GPT2 *m) { return m->aborted && m->aborted(m->aborted_arg); }

/* ------------------------------------------------------------------------------------------ */
/* configuration                                                                               */

int gpt2_preset(const char *name, GPT2Config *cfg) {
    if (strcmp(name, "micro") == 0) {
        /* 22K parameters: for jobs of 64 and more ranks on a few cores, where the collectives'
         * latency and the control plane are what is measured, not the arithmetic */
        *cfg = (GPT2Config){.max_seq_len = 32, .vocab_size = 256, .padded_vocab_size = 256,
                            .num_layers = 1, .num_heads = 2, .channels = 32};
    } else if (strcmp(name, "tiny") == 0) {
        *cfg = (GPT2Config){.max_seq_len = 64, .vocab_size = 256, .padded_vocab_size = 256,
                            .num_layers = 2, .num_heads = 4, .channels = 64};
    } else if (strcmp(name, "small") == 0) {
        *cfg = (GPT2Config){.max_seq_len = 256, .vocab_size = 256, .padded_vocab_size = 256,
                            .num_layers = 6, .num_heads = 6, .channels = 384};
    } else if (strcmp(name, "gpt2-124m") == 0) {
        /* llm.c pads 50257 to 50304 = 393 * 128 so the logits matmul has friendly sizes */
        *cfg = (GPT2Config){.max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304,
                            .num_layers = 12, .num_heads = 12, .channels = 768};
    } else {
        return -1;
    }
    return 0;
}

const char *gpt2_config_check(const GPT2Config *cfg) {
    if (cfg->max_seq_len <= 0) return "max_seq_len must be positive";
    if (cfg->vocab_size <= 0) return "vocab_size must be positive";
    if (cfg->padded_vocab_size < cfg->vocab_size) return "padded_vocab_size must be >= vocab_size";
    if (cfg->num_layers <= 0) return "num_layers must be positive";
    if (cfg->num_heads <= 0) return "num_heads must be positive";
    if (cfg->channels <= 0) return "channels must be positive";
    if (cfg->channels % cfg->num_heads != 0) return "channels must be divisible by num_heads";
    /* the largest per-tensor index (L * 4C * C, Vp * C) must fit the int arithmetic of BLAS */
    if ((double)cfg->num_layers * 4.0 * cfg->channels * cfg->channels > 2147483647.0 ||
        (double)cfg->padded_vocab_size * cfg->channels > 2147483647.0)
        return "channels too large for num_layers / padded_vocab_size";
    return NULL;
}

void gpt2_param_sizes(const GPT2Config *cfg, size_t sizes[GPT2_NUM_PARAM_TENSORS]) {
    const size_t Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers, maxT = cfg->max_seq_len;
    sizes[WTE] = Vp * C;
    sizes[WPE] = maxT * C;
    sizes[LN1W] = L * C;
    sizes[LN1B] = L * C;
    sizes[QKVW] = L * (3 * C) * C;
    sizes[QKVB] = L * (3 * C);
    sizes[ATTPROJW] = L * C * C;
    sizes[ATTPROJB] = L * C;
    sizes[LN2W] = L * C;
    sizes[LN2B] = L * C;
    sizes[FCW] = L * (4 * C) * C;
    sizes[FCB] = L * (4 * C);
    sizes[FCPROJW] = L * C * (4 * C);
    sizes[FCPROJB] = L * C;
    sizes[LNFW] = C;
    sizes[LNFB] = C;
}

size_t gpt2_num_params(const GPT2Config *cfg) {
    size_t sizes[GPT2_NUM_PARAM_TENSORS], n = 0;
    gpt2_param_sizes(cfg, sizes);
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) n += sizes[i];
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* create / free                                                                               */

/* zeroed, huge-page backed, or NULL */
static float *alloc_floats(size_t n) {
    size_t bytes = n * sizeof(float);
    float *x = alloc_huge(bytes);
    if (x != NULL) memset(x, 0, bytes);
    return x;
}

/* carves consecutive 64-byte aligned tensors out of one block; with base == NULL only counts */
typedef struct {
    float *base;
    size_t used;
} Carver;

static float *carve(Carver *c, size_t n) {
    float *x = c->base ? c->base + c->used : NULL;
    c->used += (n + 15) / 16 * 16;
    return x;
}

static void carve_activations(GPT2 *m, Carver *c) {
    const size_t L = m->cfg.num_layers, C = m->cfg.channels, NH = m->cfg.num_heads, Vp = m->cfg.padded_vocab_size;
    const size_t BT = (size_t)m->maxB * m->maxT, BNHTT = (size_t)m->maxB * NH * m->maxT * m->maxT;
    m->encoded = carve(c, BT * C);
    m->ln1 = carve(c, L * BT * C);
    m->ln1_mean = carve(c, L * BT);
    m->ln1_rstd = carve(c, L * BT);
    m->qkv = carve(c, L * BT * 3 * C);
    m->atty = carve(c, L * BT * C);
    m->att = carve(c, L * BNHTT);
    m->residual2 = carve(c, L * BT * C);
    m->ln2 = carve(c, L * BT * C);
    m->ln2_mean = carve(c, L * BT);
    m->ln2_rstd = carve(c, L * BT);
    m->fch = carve(c, L * BT * 4 * C);
    m->fch_gelu = carve(c, L * BT * 4 * C);
    m->residual3 = carve(c, L * BT * C);
    m->lnf = carve(c, BT * C);
    m->lnf_mean = carve(c, BT);
    m->lnf_rstd = carve(c, BT);
    m->logits = carve(c, BT * Vp);
    m->probs = carve(c, BT * Vp);
    m->losses = carve(c, BT);
    m->preatt = carve(c, BNHTT);
    m->proj = carve(c, BT * C);
    m->dresidual = carve(c, BT * C);
    m->dln = carve(c, BT * C);
    m->datty = carve(c, BT * C);
    m->dqkv = carve(c, BT * 3 * C);
    m->dfch = carve(c, BT * 4 * C);
    m->dfch_gelu = carve(c, BT * 4 * C);
    m->dpreatt = carve(c, BNHTT);
    m->datt = carve(c, BNHTT);
    m->dlogits = carve(c, BT * Vp);
    m->dlosses = carve(c, BT);
}

GPT2 *gpt2_create(const GPT2Config *cfg, int B, int T, size_t padded_params) {
    if (gpt2_config_check(cfg) != NULL || B <= 0 || T <= 0 || T > cfg->max_seq_len) return NULL;
    size_t num_params = gpt2_num_params(cfg);
    if (padded_params == 0) padded_params = num_params;
    if (padded_params < num_params) return NULL;

    GPT2 *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->cfg = *cfg;
    m->maxB = B;
    m->maxT = T;
    m->num_params = num_params;
    m->padded_params = padded_params;
    gpt2_param_sizes(cfg, m->sizes);

    Carver count = {NULL, 0};
    carve_activations(m, &count);
    m->params = alloc_floats(padded_params);
    m->grads = alloc_floats(padded_params);
    m->acts_memory = alloc_floats(count.used);
    m->inputs = calloc((size_t)B * T, sizeof(int));
    m->targets = calloc((size_t)B * T, sizeof(int));
    if (!m->params || !m->grads || !m->acts_memory || !m->inputs || !m->targets) {
        gpt2_free(m);
        return NULL;
    }
    Carver c = {m->acts_memory, 0};
    carve_activations(m, &c);

    size_t off = 0;
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) {
        m->p[i] = m->params + off;
        m->g[i] = m->grads + off;
        off += m->sizes[i];
    }
    return m;
}

void gpt2_free(GPT2 *m) {
    if (m == NULL) return;
    free(m->params);
    free(m->grads);
    free(m->acts_memory);
    free(m->inputs);
    free(m->targets);
    free(m);
}

const GPT2Config *gpt2_config(const GPT2 *m) { return &m->cfg; }
float *gpt2_params(GPT2 *m) { return m->params; }
float *gpt2_grads(GPT2 *m) { return m->grads; }
size_t gpt2_padded_params(const GPT2 *m) { return m->padded_params; }
const float *gpt2_probs(const GPT2 *m) { return m->probs; }

/* ------------------------------------------------------------------------------------------ */
/* initialisation                                                                              */

/* splitmix64: a full-period 64-bit generator, so the stream is a function of the seed alone */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* x[0..n) ~ N(0, std) by Box-Muller, both outputs of each pair used; computed in double so
 * the float results do not depend on libm's float rounding */
static void fill_normal(float *x, size_t n, float std, uint64_t *state) {
    const double two_pi = 6.283185307179586;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((splitmix64(state) >> 11) + 1) * (1.0 / 9007199254740992.0); /* (0, 1] */
        double u2 = (splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);       /* [0, 1) */
        double r = sqrt(-2.0 * log(u1)) * std;
        x[i] = (float)(r * cos(two_pi * u2));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(two_pi * u2));
    }
}

void gpt2_init_params(GPT2 *m, uint64_t seed) {
    const GPT2Config *cfg = &m->cfg;
    const float residual_std = 0.02f / sqrtf(2.0f * cfg->num_layers);
    memset(m->params, 0, m->padded_params * sizeof(float)); /* biases, and the padding, stay 0 */
    uint64_t state = seed;
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) {
        switch (i) {
        case WTE: /* only the V real rows, as llm.c: padded rows stay 0 and get no gradient */
            fill_normal(m->p[i], (size_t)cfg->vocab_size * cfg->channels, 0.02f, &state);
            break;
        case WPE: case QKVW: case FCW:
            fill_normal(m->p[i], m->sizes[i], 0.02f, &state);
            break;
        case ATTPROJW: case FCPROJW: /* projections into the residual stream, GPT-2's 1/sqrt(2L) */
            fill_normal(m->p[i], m->sizes[i], residual_std, &state);
            break;
        case LN1W: case LN2W: case LNFW:
            for (size_t j = 0; j < m->sizes[i]; j++) m->p[i][j] = 1.0f;
            break;
        default:
            break;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* forward / backward                                                                          */

float gpt2_forward(GPT2 *m, const int *inputs, const int *targets, int B, int T) {
    const int V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size, L = m->cfg.num_layers;
    const int NH = m->cfg.num_heads, C = m->cfg.channels;
    m->has_targets = 0;
    if (B <= 0 || T <= 0 || B > m->maxB || T > m->maxT) {
        fprintf(stderr, "gpt2_forward: B=%d T=%d outside the create-time 1..%d x 1..%d\n", B, T, m->maxB, m->maxT);
        return NAN;
    }
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets != NULL && (targets[i] < 0 || targets[i] >= V))) {
            fprintf(stderr, "gpt2_forward: token out of range [0, %d) at position %d\n", V, i);
            return NAN;
        }
    }
    m->B = B;
    m->T = T;
    memcpy(m->inputs, inputs, (size_t)B * T * sizeof(int));
    if (targets != NULL) memcpy(m->targets, targets, (size_t)B * T * sizeof(int));

    const size_t BTC = (size_t)B * T * C, BT = (size_t)B * T, BNHTT = (size_t)B * NH * T * T;
    float **p = m->p;
    encoder_forward(m->encoded, inputs, p[WTE], p[WPE], B, T, C);
    for (int l = 0; l < L; l++) {
        if (aborted(m)) return NAN;
        const float *residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * BTC;
        float *l_ln1 = m->ln1 + l * BTC, *l_ln1_mean = m->ln1_mean + l * BT, *l_ln1_rstd = m->ln1_rstd + l * BT;
        float *l_qkv = m->qkv + l * 3 * BTC, *l_atty = m->atty + l * BTC, *l_att = m->att + l * BNHTT;
        float *l_residual2 = m->residual2 + l * BTC;
        float *l_ln2 = m->ln2 + l * BTC, *l_ln2_mean = m->ln2_mean + l * BT, *l_ln2_rstd = m->ln2_rstd + l * BT;
        float *l_fch = m->fch + l * 4 * BTC, *l_fch_gelu = m->fch_gelu + l * 4 * BTC;
        float *l_residual3 = m->residual3 + l * BTC;

        layernorm_forward(l_ln1, l_ln1_mean, l_ln1_rstd, residual, p[LN1W] + l * C, p[LN1B] + l * C, B, T, C);
        matmul_forward(l_qkv, l_ln1, p[QKVW] + (size_t)l * 3 * C * C, p[QKVB] + l * 3 * C, B, T, C, 3 * C);
        attention_forward(l_atty, m->preatt, l_att, l_qkv, B, T, C, NH);
        if (aborted(m)) return NAN; /* also within a layer: a doomed step holds a core the recovery needs */
        matmul_forward(m->proj, l_atty, p[ATTPROJW] + (size_t)l * C * C, p[ATTPROJB] + l * C, B, T, C, C);
        residual_forward(l_residual2, residual, m->proj, (int)BTC);
        layernorm_forward(l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, p[LN2W] + l * C, p[LN2B] + l * C, B, T, C);
        matmul_forward(l_fch, l_ln2, p[FCW] + (size_t)l * 4 * C * C, p[FCB] + l * 4 * C, B, T, C, 4 * C);
        gelu_forward(l_fch_gelu, l_fch, (int)(4 * BTC));
        if (aborted(m)) return NAN;
        matmul_forward(m->proj, l_fch_gelu, p[FCPROJW] + (size_t)l * 4 * C * C, p[FCPROJB] + l * C, B, T, 4 * C, C);
        residual_forward(l_residual3, l_residual2, m->proj, (int)BTC);
    }
    const float *residual = m->residual3 + (L - 1) * BTC;
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, residual, p[LNFW], p[LNFB], B, T, C);
    matmul_forward(m->logits, m->lnf, p[WTE], NULL, B, T, C, Vp); /* tied embeddings */
    softmax_forward(m->probs, m->logits, B, T, V, Vp);
    if (targets == NULL) return -1.0f;

    crossentropy_forward(m->losses, m->probs, targets, B, T, Vp);
    double sum = 0.0; /* double: the mean of up to ~1e6 losses should not depend on float drift */
    for (size_t i = 0; i < BT; i++) sum += m->losses[i];
    m->has_targets = 1;
    return (float)(sum / (double)BT);
}

void gpt2_zero_grad(GPT2 *m) { memset(m->grads, 0, m->padded_params * sizeof(float)); }

void gpt2_backward(GPT2 *m, float loss_scale) {
    if (!m->has_targets) {
        fprintf(stderr, "gpt2_backward: the last forward had no targets (or failed); nothing done\n");
        return;
    }
    const int B = m->B, T = m->T, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    const int L = m->cfg.num_layers, NH = m->cfg.num_heads, C = m->cfg.channels;
    const size_t BTC = (size_t)B * T * C, BT = (size_t)B * T, BNHTT = (size_t)B * NH * T * T;
    float **p = m->p, **g = m->g;

    const float dloss = loss_scale / (float)BT;
    for (size_t i = 0; i < BT; i++) m->dlosses[i] = dloss;
    memset(m->dlogits, 0, BT * Vp * sizeof(float)); /* the padded columns must stay 0 */
    crossentropy_softmax_backward(m->dlogits, m->dlosses, m->probs, m->targets, B, T, V, Vp);
    memset(m->dln, 0, BTC * sizeof(float));
    matmul_backward(m->dln, g[WTE], NULL, m->dlogits, m->lnf, p[WTE], B, T, C, Vp);
    memset(m->dresidual, 0, BTC * sizeof(float));
    layernorm_backward(m->dresidual, g[LNFW], g[LNFB], m->dln, m->residual3 + (L - 1) * BTC, p[LNFW],
                       m->lnf_mean, m->lnf_rstd, B, T, C);

    /* dresidual carries the residual stream's gradient down the layers. residual_backward of
     * llm.c only copies it into the two branches (into zeroed buffers, so exactly), hence the
     * branches read dresidual directly and the layernorms add into it in place: the same
     * floats as llm.c's separate dresidual2/3 buffers, without the copies. */
    for (int l = L - 1; l >= 0; l--) {
        if (aborted(m)) return;
        const float *residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * BTC;
        const float *l_ln1 = m->ln1 + l * BTC, *l_ln1_mean = m->ln1_mean + l * BT, *l_ln1_rstd = m->ln1_rstd + l * BT;
        const float *l_qkv = m->qkv + l * 3 * BTC, *l_atty = m->atty + l * BTC, *l_att = m->att + l * BNHTT;
        const float *l_residual2 = m->residual2 + l * BTC;
        const float *l_ln2 = m->ln2 + l * BTC, *l_ln2_mean = m->ln2_mean + l * BT, *l_ln2_rstd = m->ln2_rstd + l * BT;
        const float *l_fch = m->fch + l * 4 * BTC, *l_fch_gelu = m->fch_gelu + l * 4 * BTC;

        /* MLP branch: dresidual is d(residual3) = d(fcproj) */
        memset(m->dfch_gelu, 0, 4 * BTC * sizeof(float));
        matmul_backward(m->dfch_gelu, g[FCPROJW] + (size_t)l * 4 * C * C, g[FCPROJB] + l * C, m->dresidual,
                        l_fch_gelu, p[FCPROJW] + (size_t)l * 4 * C * C, B, T, 4 * C, C);
        memset(m->dfch, 0, 4 * BTC * sizeof(float));
        gelu_backward(m->dfch, l_fch, m->dfch_gelu, (int)(4 * BTC));
        memset(m->dln, 0, BTC * sizeof(float));
        matmul_backward(m->dln, g[FCW] + (size_t)l * 4 * C * C, g[FCB] + l * 4 * C, m->dfch, l_ln2,
                        p[FCW] + (size_t)l * 4 * C * C, B, T, C, 4 * C);
        layernorm_backward(m->dresidual, g[LN2W] + l * C, g[LN2B] + l * C, m->dln, l_residual2, p[LN2W] + l * C,
                           l_ln2_mean, l_ln2_rstd, B, T, C);

        if (aborted(m)) return;
        /* attention branch: dresidual is now d(residual2) = d(attproj) */
        memset(m->datty, 0, BTC * sizeof(float));
        matmul_backward(m->datty, g[ATTPROJW] + (size_t)l * C * C, g[ATTPROJB] + l * C, m->dresidual, l_atty,
                        p[ATTPROJW] + (size_t)l * C * C, B, T, C, C);
        memset(m->dqkv, 0, 3 * BTC * sizeof(float));
        attention_backward(m->dqkv, m->dpreatt, m->datt, m->datty, l_qkv, l_att, B, T, C, NH);
        if (aborted(m)) return;
        memset(m->dln, 0, BTC * sizeof(float));
        matmul_backward(m->dln, g[QKVW] + (size_t)l * 3 * C * C, g[QKVB] + l * 3 * C, m->dqkv, l_ln1,
                        p[QKVW] + (size_t)l * 3 * C * C, B, T, C, 3 * C);
        layernorm_backward(m->dresidual, g[LN1W] + l * C, g[LN1B] + l * C, m->dln, residual, p[LN1W] + l * C,
                           l_ln1_mean, l_ln1_rstd, B, T, C);
    }
    encoder_backward(g[WTE], g[WPE], m->dresidual, m->inputs, B, T, C);
}
