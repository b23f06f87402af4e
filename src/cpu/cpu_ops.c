/* cpu_ops.c — see cpu_ops.h. */
#include "cpu/cpu_ops.h"

#include <math.h>

float cpu_rms_scale(const float *x, int64_t n, float eps) {
    /* The sum of squares in double: rows of 4096+ values of mixed magnitude
     * lose digits in f32, and this is the reference. */
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / (double)n + eps));
}

void cpu_rmsnorm(float *out, const float *x, const float *weight, int64_t n, float eps) {
    const float scale = cpu_rms_scale(x, n, eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

void cpu_rope(float *x, int n_heads, int head_dim, int n_rot, int pos, float base, float freq_scale,
              const float *freq_factors, rope_style style) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        double freq = pow((double)base, -2.0 * i / n_rot);
        if (freq_factors) freq /= freq_factors[i];
        double angle = (double)pos * freq_scale * freq;
        float c = (float)cos(angle), s = (float)sin(angle);
        for (int h = 0; h < n_heads; h++) {
            float *head = x + (int64_t)h * head_dim;
            int a = style == ROPE_NEOX ? i : 2 * i;
            int b = style == ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = head[a], x1 = head[b];
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

double cpu_softmax_unnormalised(float *x, int64_t n, float *max) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    *max = m;
    return sum;
}

void cpu_softmax(float *x, int64_t n) {
    float max;
    const double sum = cpu_softmax_unnormalised(x, n, &max);
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void cpu_route(float *logits, int n_experts, int k, bool sigmoid, bool norm_topk, float scale, int *ids,
               float *weights) {
    if (sigmoid)
        for (int e = 0; e < n_experts; e++) logits[e] = 1.0f / (1.0f + expf(-logits[e]));
    else
        cpu_softmax(logits, n_experts);
    cpu_top_k(logits, n_experts, k, ids);
    float sum = 0;
    for (int j = 0; j < k; j++) sum += weights[j] = logits[ids[j]];
    for (int j = 0; j < k; j++) {
        if (norm_topk) weights[j] /= sum;
        weights[j] *= scale;
    }
}

void cpu_top_k(const float *x, int n, int k, int *ids) {
    /* k is small (<= 16 in every model we run): insertion into a sorted list. */
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (count == k && !(x[i] > x[ids[k - 1]])) continue;
        int at = count < k ? count++ : k - 1;
        while (at > 0 && x[i] > x[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
    }
}
