/*
 * cpu_ops.h — the element-wise and per-row operations of the forward pass,
 * in f32 with the accumulations that matter in double-free f32 order. Each
 * has a float64 twin in the tests.
 */
#ifndef MOE_CPU_OPS_H
#define MOE_CPU_OPS_H

#include <stdint.h>

#include "model/model.h"

/* out = x / rms(x) * weight over n elements (out may alias x). */
void cpu_rmsnorm(float *out, const float *x, const float *weight, int64_t n, float eps);

/* 1 / rms(x) over n elements, the scale cpu_rmsnorm applies. */
float cpu_rms_scale(const float *x, int64_t n, float eps);

/* Rotate the first n_rot dimensions of each of n_heads heads (head_dim
 * apart) by position pos. freq_factors (n_rot/2) divide the frequencies when
 * not NULL (Llama-3.1 style); freq_scale scales positions (linear scaling). */
void cpu_rope(float *x, int n_heads, int head_dim, int n_rot, int pos, float base, float freq_scale,
              const float *freq_factors, rope_style style);

/* In place: x = softmax(x). */
void cpu_softmax(float *x, int64_t n);

/* Softmax without its division, in place: x[i] = e^(x[i] - max), the
 * largest x to *max, and the sum of the exponentials (in double) returned.
 * A partial softmax, to be merged with others (the attention's spans). */
double cpu_softmax_unnormalised(float *x, int64_t n, float *max);

/* out[i] = silu(gate[i]) * up[i]. */
void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n);

/* Indices of the k largest of x[0..n) (ties: lower index first), by
 * descending value. */
void cpu_top_k(const float *x, int n, int k, int *ids);

/* One token's routing: logits[0..n_experts) become probabilities in place
 * (softmax, or 1/(1+e^-l) when sigmoid), the k largest go to ids, and
 * their probabilities, divided by their sum when norm_topk, times scale,
 * to weights. */
void cpu_route(float *logits, int n_experts, int k, bool sigmoid, bool norm_topk, float scale, int *ids,
               float *weights);

#endif
