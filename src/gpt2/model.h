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

/* The part of the model one rank of a Megatron-style layout holds: tensor slice tp_rank of tp
 * (attention heads and MLP hidden units; qkv and fc column-parallel, attproj and fcproj
 * row-parallel) of the layers [layer0, layer1) (its pipeline stage). The first stage holds the
 * embeddings, the last the final layernorm and (tied) wte for the logits; every slice holds the
 * layernorms, the row-parallel biases and the embeddings whole. {1, 0, 0, L} is the model. */
typedef struct {
    int tp, tp_rank;
    int layer0, layer1;
} GPT2Part;
GPT2Part gpt2_whole(const GPT2Config *cfg);
/* NULL if part is a valid part of cfg, else a static message saying what is wrong. */
const char *gpt2_part_check(const GPT2Config *cfg, const GPT2Part *part);
/* The part's 16 tensors, in llm.c order, with their local shapes (0 for tensors it lacks). */
void gpt2_part_param_sizes(const GPT2Config *cfg, const GPT2Part *part, size_t sizes[GPT2_NUM_PARAM_TENSORS]);
size_t gpt2_part_num_params(const GPT2Config *cfg, const GPT2Part *part);
/* Copies the part's parameters between the whole model's flat vector and the part's:
 * to_part 1: full -> local, 0: local -> the part's elements of full (the rest untouched). */
void gpt2_part_map(const GPT2Config *cfg, const GPT2Part *part, float *full, float *local, int to_part);

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
/* The same for a part (gpt2_create is the whole model's). */
GPT2 *gpt2_create_part(const GPT2Config *cfg, const GPT2Part *part, int B, int T, size_t padded_params);
/* Another set of activations for the same parameters and gradients (a pipeline stage keeps one
 * per micro-batch in flight). Free it before the base. */
GPT2 *gpt2_create_sibling(GPT2 *base);
void gpt2_free(GPT2 *m);

const GPT2Config *gpt2_config(const GPT2 *m);
float *gpt2_params(GPT2 *m);      /* flat, padded_params floats */
float *gpt2_grads(GPT2 *m);       /* flat, padded_params floats */
size_t gpt2_padded_params(const GPT2 *m);

/* GPT-2 initialisation, a pure function of seed: weights N(0, 0.02), residual projections
 * (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. A part gets its
 * slice of the whole model's initialisation. 0, or -1 without memory. */
int gpt2_init_params(GPT2 *m, uint64_t seed);
/* The whole model's initialisation into full[0 .. gpt2_num_params(cfg)) (what
 * gpt2_init_params gives the whole model). */
void gpt2_init_full(const GPT2Config *cfg, float *full, uint64_t seed);
/* The part's parameters from the whole model's flat vector (gpt2_num_params floats). */
void gpt2_load_full(GPT2 *m, const float *full);

/* Forward pass on inputs/targets (B x T token ids, B, T within the create-time maximum).
 * Returns the mean cross-entropy loss over the B*T positions; with targets == NULL it only
 * computes logits and returns -1. Returns NaN (saying why on stderr) if B or T is out of
 * range or a token is outside [0, V). */
float gpt2_forward(GPT2 *m, const int *inputs, const int *targets, int B, int T);
/* Backward pass of the last forward (which must have had targets). ADDS d(loss_scale * mean
 * loss)/d(params) into the gradients, so several micro-batches accumulate. */
void gpt2_backward(GPT2 *m, float loss_scale);
/* The same for a part. forward: the first stage embeds `inputs`, another starts from x_in
 * (B,T,C: the previous stage's output); the last stage with targets returns the mean loss,
 * another returns 0 with its output at gpt2_part_output. backward: the last stage starts from
 * its loss, another from dout (B,T,C: the gradient of its output); afterwards the gradient of
 * its input is at gpt2_part_dinput (not the first stage). With tp > 1 both call the
 * tensor-parallel allreduce (gpt2_set_tp_allreduce) twice per layer; if it fails, forward
 * returns NaN and backward -1. */
float gpt2_forward_part(GPT2 *m, const int *inputs, const int *targets, const float *x_in, int B, int T);
int gpt2_backward_part(GPT2 *m, float loss_scale, const float *dout);
const float *gpt2_part_output(const GPT2 *m);
const float *gpt2_part_dinput(const GPT2 *m);
void gpt2_set_tp_allreduce(GPT2 *m, int (*fn)(void *arg, float *buf, size_t n), void *arg);
/* Sum of squares of the part's gradients, counting each of the model's parameters on one part
 * only; summed over all parts it is the whole model's. */
double gpt2_part_grad_sumsq(const GPT2 *m);
/* The tied embedding's gradient (n = 0 on a middle stage): the first and the last stage sum
 * theirs. */
float *gpt2_wte_grad(GPT2 *m, size_t *n);
void gpt2_zero_grad(GPT2 *m);
/* A check (asked between layers) that another thread may turn true to abandon the
 * forward/backward in flight: forward then returns NaN and backward returns early, leaving
 * the gradients undefined. Used when a peer failed and the step will be rolled back anyway.
 * NULL = none. */
void gpt2_set_abort_check(GPT2 *m, int (*aborted)(const void *arg), const void *arg);

/* Probabilities (B,T,Vp) of the last forward, for sampling and tests. */
const float *gpt2_probs(const GPT2 *m);

#endif
