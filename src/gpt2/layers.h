/* layers.h — the GPT-2 building blocks, each a forward and a backward function.
 *
 * Shapes are in the comments: B batch, T time, C channels, OC output channels, NH heads,
 * V vocabulary, Vp padded vocabulary. Backward functions ADD into their d-outputs (dinp,
 * dweight, ...), as in llm.c, so gradients accumulate across layers and micro-batches.
 * Matrix products go through cblas_sgemm. */
#ifndef DEADPOOL_LAYERS_H
#define DEADPOOL_LAYERS_H

/* out (B,T,C) = wte[inp] + wpe[t]; inp (B,T) ints; wte (V,C); wpe (maxT,C) */
void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);

/* out (B,T,C) = LayerNorm(inp) * weight + bias; mean, rstd (B,T) cached for backward */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int B, int T, int C);
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int B, int T, int C);

/* out (B,T,OC) = inp (B,T,C) @ weight^T (OC,C) + bias (OC); bias may be NULL */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int B, int T, int C, int OC);
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int B, int T, int C, int OC);

/* out (B,T,C) = causal multi-head attention of qkv (B,T,3C) = [q | k | v];
 * preatt, att (B,NH,T,T) cached for backward (att is 0 above the diagonal). In the backward,
 * dpreatt and datt are scratch, overwritten rather than accumulated; dinp accumulates. */
void attention_forward(float *out, float *preatt, float *att, const float *inp, int B, int T, int C, int NH);
void attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout, const float *inp,
                        const float *att, int B, int T, int C, int NH);

/* out (N) = GELU(inp) with the tanh approximation */
void gelu_forward(float *out, const float *inp, int N);
void gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out (N) = inp1 + inp2; out must not overlap the inputs */
void residual_forward(float *out, const float *inp1, const float *inp2, int N);
void residual_backward(float *dinp1, float *dinp2, const float *dout, int N);

/* probs (B,T,Vp) = softmax(logits (B,T,Vp)) over the first V entries (the rest are 0) */
void softmax_forward(float *probs, const float *logits, int B, int T, int V, int Vp);
/* losses (B,T) = -log probs[target] */
void crossentropy_forward(float *losses, const float *probs, const int *targets, int B, int T, int Vp);
/* dlogits (B,T,Vp) += (probs - onehot(target)) * dlosses; entries >= V stay untouched */
void crossentropy_softmax_backward(float *dlogits, const float *dlosses, const float *probs,
                                   const int *targets, int B, int T, int V, int Vp);

#endif
