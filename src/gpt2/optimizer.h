/* optimizer.h — AdamW on one rank's shard, global-norm clipping, cosine LR with warmup.
 * Follows llm.c: bias-corrected moments, decoupled weight decay on every parameter, and
 * train_gpt2.cu's schedule (linear warmup, cosine decay to final_lr_frac * lr). */
#ifndef DEADPOOL_OPTIMIZER_H
#define DEADPOOL_OPTIMIZER_H

#include <stddef.h>

typedef struct {
    float lr;            /* peak learning rate */
    float beta1, beta2, eps;
    float weight_decay;
    float grad_clip;     /* max global gradient norm; <= 0 disables clipping */
    int warmup_steps;
    int total_steps;     /* the schedule's horizon */
    float final_lr_frac; /* lr at the end of the cosine, as a fraction of lr */
} AdamWConfig;

AdamWConfig adamw_defaults(void);

/* Learning rate of 0-based `step`. */
float adamw_lr(const AdamWConfig *c, int step);

/* Global L2 norm of g[0..n), accumulated in double in index order (deterministic). */
double grad_global_norm(const float *g, size_t n);
/* Factor the gradients are multiplied by so that their norm is at most grad_clip. */
float grad_clip_scale(const AdamWConfig *c, double norm);

/* One AdamW step over a shard, out of place: parameters and moments are read from the _in
 * arrays and written to the _out ones (which may be the same: in place); all n floats.
 * grad_scale multiplies each gradient first (averaging over ranks and clipping); t is the
 * 1-based step for bias correction. */
void adamw_update(float *p_out, const float *p_in, const float *grads, float *m_out, const float *m_in, float *v_out,
                  const float *v_in, size_t n, const AdamWConfig *c, float lr, float grad_scale, int t);

#endif
