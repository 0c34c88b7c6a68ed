/* optimizer.c — AdamW, gradient clipping and the learning-rate schedule. */
#include "optimizer.h"

#include <math.h>

AdamWConfig adamw_defaults(void) {
    AdamWConfig c = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f,
                     .grad_clip = 1.0f, .warmup_steps = 0, .total_steps = 1, .final_lr_frac = 0.1f};
    return c;
}

float adamw_lr(const AdamWConfig *c, int step) {
    if (step < c->warmup_steps) return c->lr * (float)(step + 1) / (float)c->warmup_steps;
    int decay_steps = c->total_steps - c->warmup_steps;
    if (decay_steps <= 0) return c->lr;
    double ratio = (double)(step - c->warmup_steps) / decay_steps;
    if (ratio > 1.0) ratio = 1.0;
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    double min_lr = (double)c->lr * c->final_lr_frac;
    return (float)(min_lr + coeff * ((double)c->lr - min_lr));
}

double grad_global_norm(const float *g, size_t n) {
    /* Eight fixed lanes break the add dependency chain while keeping the order a function of n. */
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lane[k] += (double)g[i + k] * g[i + k];
    for (; i < n; i++) lane[0] += (double)g[i] * g[i];
    double s = 0.0;
    for (int k = 0; k < 8; k++) s += lane[k];
    return sqrt(s);
}

float grad_clip_scale(const AdamWConfig *c, double norm) {
    if (c->grad_clip <= 0.0f || norm <= c->grad_clip) return 1.0f;
    return (float)(c->grad_clip / norm);
}

void adamw_update(float *p_out, const float *p_in, const float *grads, float *m_out, const float *m_in, float *v_out,
                  const float *v_in, size_t n, const AdamWConfig *c, float lr, float grad_scale, int t) {
    float b1 = c->beta1, b2 = c->beta2;
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = b1 * m_in[i] + (1.0f - b1) * g;
        float vi = b2 * v_in[i] + (1.0f - b2) * g * g;
        m_out[i] = mi;
        v_out[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float p = p_in[i];
        p_out[i] = p - lr * (mhat / (sqrtf(vhat) + c->eps) + c->weight_decay * p);
    }
}
