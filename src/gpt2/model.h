/* model.h — GPT-2 (llm.c's CPU reference architecture) in fp32 on the CPU.
 *
 * Pre-LayerNorm transformer, learned position embeddings, GELU (tanh), causal self-attention,
 * tied input/output embeddings. Parameters are laid out exactly in llm.c's order (see
 * gpt2_param_sizes) so the flat parameter array is what an llm.c model file stores.
 *
 * Memory is allocated once in gpt2_create for a fixed maximum batch B x T; forward and
 * backward never allocate. The flat parameter and gradient arrays are padded to
 * `padded_params` floats so data-parallel shards can be equal-sized; padding stays zero. */
#ifndef DEADPOOL_MODEL_H
#define DEADPOOL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define GPT2_NUM_PARAM_TENSORS 16

typedef struct {
    int max_seq_len;       /* maxT */
    int vocab_size;        /* V: real tokens */
    int padded_vocab_size; /* Vp >= V, rows V..Vp-1 of wte are never used as targets */
    int num_layers;        /* L */
    int num_heads;         /* NH, divides channels */
    int channels;          /* C */
} GPT2Config;

typedef struct GPT2 GPT2;

/* Fills *cfg for a named preset ("tiny", "small", "gpt2-124m"). Returns 0, or -1 if unknown. */
int gpt2_preset(const char *name, GPT2Config *cfg);
/* Returns NULL if cfg is consistent, else a static message naming the bad field. */
const char *gpt2_config_check(const GPT2Config *cfg);
/* Sizes (in floats) of the 16 parameter tensors in llm.c order:
 * wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C) attprojw (L,C,C)
 * attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C)
 * lnfw (C) lnfb (C). */
void gpt2_param_sizes(const GPT2Config *cfg, size_t sizes[GPT2_NUM_PARAM_TENSORS]);
size_t gpt2_num_params(const GPT2Config *cfg);

/* Allocates parameters, gradients and activations for batches up to B x T (T <= maxT).
 * padded_params >= gpt2_num_params (0 means no padding). Returns NULL on allocation failure. */
GPT2 *gpt2_create(const GPT2Config *cfg, int B, int T, size_t padded_params);
void gpt2_free(GPT2 *m);

const GPT2Config *gpt2_config(const GPT2 *m);
float *gpt2_params(GPT2 *m);      /* flat, padded_params floats */
float *gpt2_grads(GPT2 *m);       /* flat, padded_params floats */
size_t gpt2_padded_params(const GPT2 *m);

/* GPT-2 initialisation, a pure function of seed: weights N(0, 0.02), residual projections
 * (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. */
void gpt2_init_params(GPT2 *m, uint64_t seed);

/* Forward pass on inputs/targets (B x T token ids, B, T within the create-time maximum).
 * Returns the mean cross-entropy loss over the B*T positions; with targets == NULL it only
 * computes logits and returns -1. Returns NaN (saying why on stderr) if B or T is out of
 * range or a token is outside [0, V). */
float gpt2_forward(GPT2 *m, const int *inputs, const int *targets, int B, int T);
/* Backward pass of the last forward (which must have had targets). ADDS d(loss_scale * mean
 * loss)/d(params) into the gradients, so several micro-batches accumulate. */
void gpt2_backward(GPT2 *m, float loss_scale);
void gpt2_zero_grad(GPT2 *m);
/* A check (asked between layers) that another thread may turn true to abandon the
 * forward/backward in flight: forward then returns NaN and backward returns early, leaving
 * the gradients undefined. Used when a peer failed and the step will be rolled back anyway.
 * NULL = none. */
void gpt2_set_abort_check(GPT2 *m, int (*aborted)(const void *arg), const void *arg);

/* Probabilities (B,T,Vp) of the last forward, for sampling and tests. */
const float *gpt2_probs(const GPT2 *m);

#endif
