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
    GPT2Part part;                            /* which layers and which tensor slice (whole: {1,0,0,L}) */
    int Ll, Cq, NHl, H;                       /* local layers, attention width C/tp, heads NH/tp, MLP 4C/tp */
    int (*tp_allreduce)(void *arg, float *buf, size_t n); /* sum over the tensor-parallel group */
    void *tp_arg;
    int sibling;                              /* shares params and grads with another (gpt2_create_sibling) */
    int maxB, maxT;                           /* create-time limits */
    size_t num_params, padded_params;
    size_t sizes[GPT2_NUM_PARAM_TENSORS];
    float *params, *grads;                    /* flat, padded_params floats each */
    float *p[GPT2_NUM_PARAM_TENSORS];         /* tensor views into params */
    float *g[GPT2_NUM_PARAM_TENSORS];         /* tensor views into grads */

    /* activations of the last forward, laid out for its B, T (llm.c's ActivationTensors); with
     * a part, L is its Ll layers and C/NH/4C in attention and MLP are the slice's Cq/NHl/H */
    float *encoded;                           /* (B,T,C): the embedding, or the stage's input */
    float *ln1, *ln1_mean, *ln1_rstd;         /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *qkv;                               /* (L,B,T,3C) */
    float *atty;                              /* (L,B,T,C) */
    float *att;                               /* (L,B,NH,T,T) */
    float *residual2;                         /* (L,B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd;         /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *fch, *fch_gelu;                    /* (L,B,T,4C) */
    float *residual3;                         /* (L,B,T,C): the last layer's is the stage's output */
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

GPT2Part gpt2_whole(const GPT2Config *cfg) { return (GPT2Part){1, 0, 0, cfg->num_layers}; }

const char *gpt2_part_check(const GPT2Config *cfg, const GPT2Part *part) {
    if (part->tp < 1 || part->tp_rank < 0 || part->tp_rank >= part->tp) return "tensor slice outside 0..tp-1";
    if (cfg->num_heads % part->tp != 0) return "num_heads is not divisible by the tensor-parallel degree";
    if (part->layer0 < 0 || part->layer1 > cfg->num_layers || part->layer0 >= part->layer1)
        return "the stage's layers are not a non-empty part of 0..num_layers";
    return NULL;
}

static int part_first(const GPT2Part *q) { return q->layer0 == 0; }
static int part_last(const GPT2Config *cfg, const GPT2Part *q) { return q->layer1 == cfg->num_layers; }

void gpt2_part_param_sizes(const GPT2Config *cfg, const GPT2Part *q, size_t sizes[GPT2_NUM_PARAM_TENSORS]) {
    const size_t Vp = cfg->padded_vocab_size, C = cfg->channels, maxT = cfg->max_seq_len;
    const size_t Ll = (size_t)(q->layer1 - q->layer0), Cq = C / q->tp, H = 4 * C / q->tp;
    const int first = part_first(q), last = part_last(cfg, q);
    sizes[WTE] = first || last ? Vp * C : 0; /* tied: the first stage embeds, the last projects */
    sizes[WPE] = first ? maxT * C : 0;
    sizes[LN1W] = Ll * C;
    sizes[LN1B] = Ll * C;
    sizes[QKVW] = Ll * (3 * Cq) * C;  /* column-parallel: this slice's heads of q, k and v */
    sizes[QKVB] = Ll * (3 * Cq);
    sizes[ATTPROJW] = Ll * C * Cq;    /* row-parallel: this slice's input columns */
    sizes[ATTPROJB] = Ll * C;
    sizes[LN2W] = Ll * C;
    sizes[LN2B] = Ll * C;
    sizes[FCW] = Ll * H * C;          /* column-parallel */
    sizes[FCB] = Ll * H;
    sizes[FCPROJW] = Ll * C * H;      /* row-parallel */
    sizes[FCPROJB] = Ll * C;
    sizes[LNFW] = last ? C : 0;
    sizes[LNFB] = last ? C : 0;
}

size_t gpt2_part_num_params(const GPT2Config *cfg, const GPT2Part *part) {
    size_t sizes[GPT2_NUM_PARAM_TENSORS], n = 0;
    gpt2_part_param_sizes(cfg, part, sizes);
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) n += sizes[i];
    return n;
}

/* rows x width floats between full (row stride fstride) and local (row stride lstride) */
static void copy_block(float *full, float *local, size_t rows, size_t width, size_t fstride, size_t lstride, int to_part) {
    for (size_t r = 0; r < rows; r++) {
        if (to_part) memcpy(local + r * lstride, full + r * fstride, width * sizeof(float));
        else memcpy(full + r * fstride, local + r * lstride, width * sizeof(float));
    }
}

void gpt2_part_map(const GPT2Config *cfg, const GPT2Part *q, float *full, float *local, int to_part) {
    size_t fs[GPT2_NUM_PARAM_TENSORS], ls[GPT2_NUM_PARAM_TENSORS];
    gpt2_param_sizes(cfg, fs);
    gpt2_part_param_sizes(cfg, q, ls);
    const size_t C = cfg->channels, Cq = C / q->tp, H = 4 * C / q->tp, t = (size_t)q->tp_rank;
    size_t fo = 0, lo = 0;
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) {
        float *f = full + fo, *l = local + lo;
        int per_layer = i != WTE && i != WPE && i != LNFW && i != LNFB;
        if (!per_layer && ls[i] > 0) copy_block(f, l, 1, fs[i], 0, 0, to_part);
        for (int layer = q->layer0; layer < q->layer1 && per_layer; layer++) {
            size_t k = (size_t)(layer - q->layer0);
            switch (i) {
            case QKVW: case QKVB: { /* rows j*C + t*Cq .. + Cq of each of q, k, v */
                size_t w = i == QKVW ? C : 1;
                for (size_t j = 0; j < 3; j++)
                    copy_block(f + (size_t)layer * 3 * C * w + (j * C + t * Cq) * w, l + k * 3 * Cq * w + j * Cq * w, Cq, w,
                               w, w, to_part);
                break;
            }
            case FCW: case FCB: { /* rows t*H .. + H */
                size_t w = i == FCW ? C : 1;
                copy_block(f + (size_t)layer * 4 * C * w + t * H * w, l + k * H * w, H, w, w, w, to_part);
                break;
            }
            case ATTPROJW: /* columns t*Cq .. + Cq of every row */
                copy_block(f + (size_t)layer * C * C + t * Cq, l + k * C * Cq, C, Cq, C, Cq, to_part);
                break;
            case FCPROJW:
                copy_block(f + (size_t)layer * C * 4 * C + t * H, l + k * C * H, C, H, 4 * C, H, to_part);
                break;
            default: /* per-layer vectors of C, the same on every slice */
                copy_block(f + (size_t)layer * C, l + k * C, 1, C, C, C, to_part);
                break;
            }
        }
        fo += fs[i];
        lo += ls[i];
    }
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
    const size_t L = m->Ll, C = m->cfg.channels, Cq = m->Cq, H = m->H, NH = m->NHl;
    const size_t Vp = part_last(&m->cfg, &m->part) ? m->cfg.padded_vocab_size : 0; /* only the last stage has logits */
    const size_t BT = (size_t)m->maxB * m->maxT, BNHTT = (size_t)m->maxB * NH * m->maxT * m->maxT;
    m->encoded = carve(c, BT * C);
    m->ln1 = carve(c, L * BT * C);
    m->ln1_mean = carve(c, L * BT);
    m->ln1_rstd = carve(c, L * BT);
    m->qkv = carve(c, L * BT * 3 * Cq);
    m->atty = carve(c, L * BT * Cq);
    m->att = carve(c, L * BNHTT);
    m->residual2 = carve(c, L * BT * C);
    m->ln2 = carve(c, L * BT * C);
    m->ln2_mean = carve(c, L * BT);
    m->ln2_rstd = carve(c, L * BT);
    m->fch = carve(c, L * BT * H);
    m->fch_gelu = carve(c, L * BT * H);
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
    m->datty = carve(c, BT * Cq);
    m->dqkv = carve(c, BT * 3 * Cq);
    m->dfch = carve(c, BT * H);
    m->dfch_gelu = carve(c, BT * H);
    m->dpreatt = carve(c, BNHTT);
    m->datt = carve(c, BNHTT);
    m->dlogits = carve(c, BT * Vp);
    m->dlosses = carve(c, BT);
}

/* The activations (and the tokens' copies) of m, for its maxB x maxT. 0 / -1. */
static int alloc_activations(GPT2 *m) {
    Carver count = {NULL, 0};
    carve_activations(m, &count);
    m->acts_memory = alloc_floats(count.used);
    m->inputs = calloc((size_t)m->maxB * m->maxT, sizeof(int));
    m->targets = calloc((size_t)m->maxB * m->maxT, sizeof(int));
    if (!m->acts_memory || !m->inputs || !m->targets) return -1;
    Carver c = {m->acts_memory, 0};
    carve_activations(m, &c);
    return 0;
}

GPT2 *gpt2_create(const GPT2Config *cfg, int B, int T, size_t padded_params) {
    if (gpt2_config_check(cfg) != NULL) return NULL;
    GPT2Part whole = gpt2_whole(cfg);
    return gpt2_create_part(cfg, &whole, B, T, padded_params);
}

GPT2 *gpt2_create_part(const GPT2Config *cfg, const GPT2Part *part, int B, int T, size_t padded_params) {
    if (gpt2_config_check(cfg) != NULL || gpt2_part_check(cfg, part) != NULL || B <= 0 || T <= 0 ||
        T > cfg->max_seq_len)
        return NULL;
    size_t num_params = gpt2_part_num_params(cfg, part);
    if (padded_params == 0) padded_params = num_params;
    if (padded_params < num_params) return NULL;

    GPT2 *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->cfg = *cfg;
    m->part = *part;
    m->Ll = part->layer1 - part->layer0;
    m->Cq = cfg->channels / part->tp;
    m->NHl = cfg->num_heads / part->tp;
    m->H = 4 * cfg->channels / part->tp;
    m->maxB = B;
    m->maxT = T;
    m->num_params = num_params;
    m->padded_params = padded_params;
    gpt2_part_param_sizes(cfg, part, m->sizes);

    m->params = alloc_floats(padded_params);
    m->grads = alloc_floats(padded_params);
    if (!m->params || !m->grads || alloc_activations(m) != 0) {
        gpt2_free(m);
        return NULL;
    }
    size_t off = 0;
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) {
        m->p[i] = m->params + off;
        m->g[i] = m->grads + off;
        off += m->sizes[i];
    }
    return m;
}

GPT2 *gpt2_create_sibling(GPT2 *base) {
    GPT2 *m = malloc(sizeof *m);
    if (m == NULL) return NULL;
    *m = *base;
    m->sibling = 1;
    m->has_targets = 0;
    m->acts_memory = NULL;
    m->inputs = m->targets = NULL;
    if (alloc_activations(m) != 0) {
        gpt2_free(m);
        return NULL;
    }
    return m;
}

void gpt2_free(GPT2 *m) {
    if (m == NULL) return;
    if (!m->sibling) {
        free(m->params);
        free(m->grads);
    }
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

void gpt2_init_full(const GPT2Config *cfg, float *full, uint64_t seed) {
    size_t sizes[GPT2_NUM_PARAM_TENSORS];
    gpt2_param_sizes(cfg, sizes);
    const float residual_std = 0.02f / sqrtf(2.0f * cfg->num_layers);
    memset(full, 0, gpt2_num_params(cfg) * sizeof(float)); /* biases stay 0 */
    uint64_t state = seed;
    float *p = full;
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; p += sizes[i], i++) {
        switch (i) {
        case WTE: /* only the V real rows, as llm.c: padded rows stay 0 and get no gradient */
            fill_normal(p, (size_t)cfg->vocab_size * cfg->channels, 0.02f, &state);
            break;
        case WPE: case QKVW: case FCW:
            fill_normal(p, sizes[i], 0.02f, &state);
            break;
        case ATTPROJW: case FCPROJW: /* projections into the residual stream, GPT-2's 1/sqrt(2L) */
            fill_normal(p, sizes[i], residual_std, &state);
            break;
        case LN1W: case LN2W: case LNFW:
            for (size_t j = 0; j < sizes[i]; j++) p[j] = 1.0f;
            break;
        default:
            break;
        }
    }
}

static int whole_model(const GPT2 *m) { return m->part.tp == 1 && m->part.layer0 == 0 && m->Ll == m->cfg.num_layers; }

void gpt2_load_full(GPT2 *m, const float *full) {
    memset(m->params, 0, m->padded_params * sizeof(float)); /* the padding stays 0 */
    gpt2_part_map(&m->cfg, &m->part, (float *)full, m->params, 1);
}

int gpt2_init_params(GPT2 *m, uint64_t seed) {
    if (whole_model(m)) {
        memset(m->params, 0, m->padded_params * sizeof(float));
        gpt2_init_full(&m->cfg, m->params, seed);
        return 0;
    }
    /* A part draws the whole model's stream and keeps its own slice: every layout starts from
     * the same model. */
    float *full = malloc(gpt2_num_params(&m->cfg) * sizeof(float));
    if (full == NULL) return -1;
    gpt2_init_full(&m->cfg, full, seed);
    gpt2_load_full(m, full);
    free(full);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* forward / backward                                                                          */

/* Sums buf over the tensor-parallel group (Megatron's g in forward, f in backward). 0 / -1. */
static int tp_reduce(GPT2 *m, float *buf, size_t n) {
    if (m->part.tp == 1) return 0;
    return m->tp_allreduce ? m->tp_allreduce(m->tp_arg, buf, n) : -1;
}

void gpt2_set_tp_allreduce(GPT2 *m, int (*fn)(void *arg, float *buf, size_t n), void *arg) {
    m->tp_allreduce = fn;
    m->tp_arg = arg;
}

/* out (BT, C) += bias (C) */
static void add_bias(float *out, const float *bias, size_t BT, int C) {
    for (size_t i = 0; i < BT; i++)
        for (int c = 0; c < C; c++) out[i * C + c] += bias[c];
}

/* A row-parallel projection: this slice's partial product, summed over the group, plus the
 * bias once. With tp 1 it is llm.c's matmul with its bias. 0 / -1. */
static int row_parallel(GPT2 *m, float *out, const float *inp, const float *w, const float *b, int B, int T, int Cin,
                        int OC) {
    if (m->part.tp == 1) {
        matmul_forward(out, inp, w, b, B, T, Cin, OC);
        return 0;
    }
    matmul_forward(out, inp, w, NULL, B, T, Cin, OC);
    if (tp_reduce(m, out, (size_t)B * T * OC) != 0) return -1;
    add_bias(out, b, (size_t)B * T, OC);
    return 0;
}

static int check_tokens(const int *tok, int n, int V, const char *what) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V) {
            fprintf(stderr, "gpt2_forward: %s token out of range [0, %d) at position %d\n", what, V, i);
            return -1;
        }
    return 0;
}

float gpt2_forward(GPT2 *m, const int *inputs, const int *targets, int B, int T) {
    return gpt2_forward_part(m, inputs, targets, NULL, B, T);
}

float gpt2_forward_part(GPT2 *m, const int *inputs, const int *targets, const float *x_in, int B, int T) {
    const int V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size, L = m->Ll;
    const int NH = m->NHl, C = m->cfg.channels, Cq = m->Cq, H = m->H;
    const int first = part_first(&m->part), last = part_last(&m->cfg, &m->part);
    m->has_targets = 0;
    if (B <= 0 || T <= 0 || B > m->maxB || T > m->maxT) {
        fprintf(stderr, "gpt2_forward: B=%d T=%d outside the create-time 1..%d x 1..%d\n", B, T, m->maxB, m->maxT);
        return NAN;
    }
    if ((first && (inputs == NULL || check_tokens(inputs, B * T, V, "input") != 0)) || (!first && x_in == NULL) ||
        (last && targets != NULL && check_tokens(targets, B * T, V, "target") != 0))
        return NAN;
    m->B = B;
    m->T = T;
    if (first) memcpy(m->inputs, inputs, (size_t)B * T * sizeof(int));
    if (last && targets != NULL) memcpy(m->targets, targets, (size_t)B * T * sizeof(int));

    const size_t BTC = (size_t)B * T * C, BT = (size_t)B * T, BNHTT = (size_t)B * NH * T * T;
    float **p = m->p;
    if (first) encoder_forward(m->encoded, inputs, p[WTE], p[WPE], B, T, C);
    else memcpy(m->encoded, x_in, BTC * sizeof(float));
    for (int l = 0; l < L; l++) {
        if (aborted(m)) return NAN;
        const float *residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * BTC;
        float *l_ln1 = m->ln1 + l * BTC, *l_ln1_mean = m->ln1_mean + l * BT, *l_ln1_rstd = m->ln1_rstd + l * BT;
        float *l_qkv = m->qkv + l * 3 * BT * Cq, *l_atty = m->atty + l * BT * Cq, *l_att = m->att + l * BNHTT;
        float *l_residual2 = m->residual2 + l * BTC;
        float *l_ln2 = m->ln2 + l * BTC, *l_ln2_mean = m->ln2_mean + l * BT, *l_ln2_rstd = m->ln2_rstd + l * BT;
        float *l_fch = m->fch + l * BT * H, *l_fch_gelu = m->fch_gelu + l * BT * H;
        float *l_residual3 = m->residual3 + l * BTC;

        layernorm_forward(l_ln1, l_ln1_mean, l_ln1_rstd, residual, p[LN1W] + l * C, p[LN1B] + l * C, B, T, C);
        matmul_forward(l_qkv, l_ln1, p[QKVW] + (size_t)l * 3 * Cq * C, p[QKVB] + l * 3 * Cq, B, T, C, 3 * Cq);
        attention_forward(l_atty, m->preatt, l_att, l_qkv, B, T, Cq, NH);
        if (aborted(m)) return NAN; /* also within a layer: a doomed step holds a core the recovery needs */
        if (row_parallel(m, m->proj, l_atty, p[ATTPROJW] + (size_t)l * C * Cq, p[ATTPROJB] + l * C, B, T, Cq, C) != 0)
            return NAN;
        residual_forward(l_residual2, residual, m->proj, (int)BTC);
        layernorm_forward(l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, p[LN2W] + l * C, p[LN2B] + l * C, B, T, C);
        matmul_forward(l_fch, l_ln2, p[FCW] + (size_t)l * H * C, p[FCB] + l * H, B, T, C, H);
        gelu_forward(l_fch_gelu, l_fch, (int)(BT * H));
        if (aborted(m)) return NAN;
        if (row_parallel(m, m->proj, l_fch_gelu, p[FCPROJW] + (size_t)l * C * H, p[FCPROJB] + l * C, B, T, H, C) != 0)
            return NAN;
        residual_forward(l_residual3, l_residual2, m->proj, (int)BTC);
    }
    if (!last) { /* the output is residual3 of the last layer (gpt2_part_output) */
        m->has_targets = 1;
        return 0.0f;
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

const float *gpt2_part_output(const GPT2 *m) { return m->residual3 + (size_t)(m->Ll - 1) * m->B * m->T * m->cfg.channels; }
const float *gpt2_part_dinput(const GPT2 *m) { return m->dresidual; }

void gpt2_zero_grad(GPT2 *m) { memset(m->grads, 0, m->padded_params * sizeof(float)); }

void gpt2_backward(GPT2 *m, float loss_scale) { gpt2_backward_part(m, loss_scale, NULL); }

int gpt2_backward_part(GPT2 *m, float loss_scale, const float *dout) {
    if (!m->has_targets) {
        fprintf(stderr, "gpt2_backward: the last forward had no targets (or failed); nothing done\n");
        return -1;
    }
    const int B = m->B, T = m->T, V = m->cfg.vocab_size, Vp = m->cfg.padded_vocab_size;
    const int L = m->Ll, NH = m->NHl, C = m->cfg.channels, Cq = m->Cq, H = m->H;
    const size_t BTC = (size_t)B * T * C, BT = (size_t)B * T, BNHTT = (size_t)B * NH * T * T;
    float **p = m->p, **g = m->g;

    if (part_last(&m->cfg, &m->part)) {
        const float dloss = loss_scale / (float)BT;
        for (size_t i = 0; i < BT; i++) m->dlosses[i] = dloss;
        memset(m->dlogits, 0, BT * Vp * sizeof(float)); /* the padded columns must stay 0 */
        crossentropy_softmax_backward(m->dlogits, m->dlosses, m->probs, m->targets, B, T, V, Vp);
        memset(m->dln, 0, BTC * sizeof(float));
        matmul_backward(m->dln, g[WTE], NULL, m->dlogits, m->lnf, p[WTE], B, T, C, Vp);
        memset(m->dresidual, 0, BTC * sizeof(float));
        layernorm_backward(m->dresidual, g[LNFW], g[LNFB], m->dln, m->residual3 + (L - 1) * BTC, p[LNFW],
                           m->lnf_mean, m->lnf_rstd, B, T, C);
    } else {
        if (dout == NULL) return -1;
        memcpy(m->dresidual, dout, BTC * sizeof(float));
    }

    /* dresidual carries the residual stream's gradient down the layers. residual_backward of
     * llm.c only copies it into the two branches (into zeroed buffers, so exactly), hence the
     * branches read dresidual directly and the layernorms add into it in place: the same
     * floats as llm.c's separate dresidual2/3 buffers, without the copies. With tensor
     * parallelism the gradient into a layernorm's output is the sum of the slices' column-
     * parallel matmuls' (Megatron's f): one allreduce per branch. */
    for (int l = L - 1; l >= 0; l--) {
        if (aborted(m)) return -1;
        const float *residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * BTC;
        const float *l_ln1 = m->ln1 + l * BTC, *l_ln1_mean = m->ln1_mean + l * BT, *l_ln1_rstd = m->ln1_rstd + l * BT;
        const float *l_qkv = m->qkv + l * 3 * BT * Cq, *l_atty = m->atty + l * BT * Cq, *l_att = m->att + l * BNHTT;
        const float *l_residual2 = m->residual2 + l * BTC;
        const float *l_ln2 = m->ln2 + l * BTC, *l_ln2_mean = m->ln2_mean + l * BT, *l_ln2_rstd = m->ln2_rstd + l * BT;
        const float *l_fch = m->fch + l * BT * H, *l_fch_gelu = m->fch_gelu + l * BT * H;

        /* MLP branch: dresidual is d(residual3) = d(fcproj) */
        memset(m->dfch_gelu, 0, BT * H * sizeof(float));
        matmul_backward(m->dfch_gelu, g[FCPROJW] + (size_t)l * C * H, g[FCPROJB] + l * C, m->dresidual, l_fch_gelu,
                        p[FCPROJW] + (size_t)l * C * H, B, T, H, C);
        memset(m->dfch, 0, BT * H * sizeof(float));
        gelu_backward(m->dfch, l_fch, m->dfch_gelu, (int)(BT * H));
        memset(m->dln, 0, BTC * sizeof(float));
        matmul_backward(m->dln, g[FCW] + (size_t)l * H * C, g[FCB] + l * H, m->dfch, l_ln2, p[FCW] + (size_t)l * H * C,
                        B, T, C, H);
        if (tp_reduce(m, m->dln, BTC) != 0) return -1;
        layernorm_backward(m->dresidual, g[LN2W] + l * C, g[LN2B] + l * C, m->dln, l_residual2, p[LN2W] + l * C,
                           l_ln2_mean, l_ln2_rstd, B, T, C);

        if (aborted(m)) return -1;
        /* attention branch: dresidual is now d(residual2) = d(attproj) */
        memset(m->datty, 0, BT * Cq * sizeof(float));
        matmul_backward(m->datty, g[ATTPROJW] + (size_t)l * C * Cq, g[ATTPROJB] + l * C, m->dresidual, l_atty,
                        p[ATTPROJW] + (size_t)l * C * Cq, B, T, Cq, C);
        memset(m->dqkv, 0, 3 * BT * Cq * sizeof(float));
        attention_backward(m->dqkv, m->dpreatt, m->datt, m->datty, l_qkv, l_att, B, T, Cq, NH);
        if (aborted(m)) return -1;
        memset(m->dln, 0, BTC * sizeof(float));
        matmul_backward(m->dln, g[QKVW] + (size_t)l * 3 * Cq * C, g[QKVB] + l * 3 * Cq, m->dqkv, l_ln1,
                        p[QKVW] + (size_t)l * 3 * Cq * C, B, T, C, 3 * Cq);
        if (tp_reduce(m, m->dln, BTC) != 0) return -1;
        layernorm_backward(m->dresidual, g[LN1W] + l * C, g[LN1B] + l * C, m->dln, residual, p[LN1W] + l * C,
                           l_ln1_mean, l_ln1_rstd, B, T, C);
    }
    if (part_first(&m->part)) encoder_backward(g[WTE], g[WPE], m->dresidual, m->inputs, B, T, C);
    return 0;
}

/* Sum of squares of this part's gradients, each parameter of the whole model counted on one
 * part only: tensors that every slice holds whole (layernorms, the row-parallel biases, the
 * embeddings) on slice 0, the tied embedding on the first stage. */
double gpt2_part_grad_sumsq(const GPT2 *m) {
    double s = 0.0;
    for (int i = 0; i < GPT2_NUM_PARAM_TENSORS; i++) {
        int split = i == QKVW || i == QKVB || i == ATTPROJW || i == FCW || i == FCB || i == FCPROJW;
        if (!split && m->part.tp_rank != 0) continue;
        if (i == WTE && !part_first(&m->part)) continue;
        const float *g = m->g[i];
        for (size_t j = 0; j < m->sizes[i]; j++) s += (double)g[j] * g[j];
    }
    return s;
}

float *gpt2_wte_grad(GPT2 *m, size_t *n) {
    *n = m->sizes[WTE];
    return m->g[WTE];
}
