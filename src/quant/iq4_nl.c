/*
 * iq4_nl.c — IQ4_NL: 4-bit indices into a fixed non-linear codebook, one
 * scale per block of 32.
 *
 * Block, 18 bytes, 4.5 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..17  qs[16] 4-bit codebook indices: byte j holds element j in
 *                        its low nibble and element j + 16 in its high one
 *   element = kvalues[index] * d
 *
 * The codebook (GGML's kvalues_iq4nl) is denser near zero, where most of a
 * weight row's values are, than the uniform grid of Q4_0, which is why
 * IQ4_NL beats Q4_0 at the same size.
 *
 * Quantization is GGML's reference (quantize_iq4_nl without an importance
 * matrix): each element is weighted by x^2 and the scale is chosen by a
 * search. Candidate inverse scales are 127 / max and (t - 127) / max for
 * t = -7..7, max being the element of largest magnitude with its sign (the
 * negative candidates map max onto the -127 end of the codebook, which
 * reaches further than +113). For each candidate every element takes its
 * nearest codebook entry, and the weighted least-squares scale for those
 * indices, sum(w q x) / sum(w q^2), is scored by the weighted error it
 * removes, sum(w q x)^2 / sum(w q^2). The best scale is stored, and the
 * indices are chosen again as the nearest entries for that scale.
 *
 * Dot products take Q8_0 activations.
 */
#include "quant/formats.h"

#include <math.h>

#include "quant/block.h"
#include "quant/weight_blocks.h"

enum { QK_NL = 32, HALF_NL = QK_NL / 2, NL_LEVELS = 16, NL_TRIES = 7 };

/* Below this the block is treated as all zeros (GGML's GROUP_MAX_EPS). */
#define NL_ZERO_BLOCK 1e-15f

static const int8_t iq4nl_values[NL_LEVELS] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* Index of the codebook entry nearest to v; a tie goes to the larger entry.
 * Comparing 2v with the sum of two neighbours is the midpoint test without
 * a rounding division. Counting passed midpoints needs no branches. */
static int iq4nl_nearest(float v) {
    const float v2 = v + v;
    int index = 0;
    for (int k = 1; k < NL_LEVELS; k++) index += v2 >= (float)(iq4nl_values[k - 1] + iq4nl_values[k]);
    return index;
}

/* The weighted fit of one block for inverse scale `inv`: every element
 * takes its nearest entry; returns sum(w q x) and sets *sum_q2 = sum(w q^2).
 * The products keep GGML's order, (w * q) * x, so results match it bit for
 * bit. */
static float iq4nl_fit(const float *x, const float *w, float inv, float *sum_q2) {
    float sum_qx = 0.0f, sum_qq = 0.0f;
    for (int j = 0; j < QK_NL; j++) {
        const float q = iq4nl_values[iq4nl_nearest(inv * x[j])];
        sum_qx += w[j] * q * x[j];
        sum_qq += w[j] * q * q;
    }
    *sum_q2 = sum_qq;
    return sum_qx;
}

/* The scale of one block by the search described at the top; 0 for a block
 * of (near) zeros. Cost: 16 fits of 32 elements. */
static float iq4nl_block_scale(const float *x) {
    float w[QK_NL], amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK_NL; j++) {
        w[j] = x[j] * x[j];
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    if (amax < NL_ZERO_BLOCK) return 0.0f;
    float sum_q2;
    float sum_qx = iq4nl_fit(x, w, 1.0f / (max / 127.0f), &sum_q2);
    float d = sum_q2 > 0.0f ? sum_qx / sum_q2 : 0.0f;
    float best = d * sum_qx;
    for (int t = -NL_TRIES; t <= NL_TRIES; t++) {
        sum_qx = iq4nl_fit(x, w, (float)(t + iq4nl_values[0]) / max, &sum_q2);
        if (sum_q2 > 0.0f && sum_qx * sum_qx > best * sum_q2) {
            d = sum_qx / sum_q2;
            best = d * sum_qx;
        }
    }
    return d;
}

void iq4_nl_dequantize(const void *src, float *dst, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK_NL; i++, dst += QK_NL) {
        const float d = block_load_fp16(b[i].d);
        for (int j = 0; j < HALF_NL; j++) {
            dst[j] = iq4nl_values[b[i].qs[j] & 0x0f] * d;
            dst[j + HALF_NL] = iq4nl_values[b[i].qs[j] >> 4] * d;
        }
    }
}

void iq4_nl_quantize(const float *src, void *dst, int64_t n) {
    block_iq4_nl *b = dst;
    for (int64_t i = 0; i < n / QK_NL; i++, src += QK_NL) {
        const float d = iq4nl_block_scale(src);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_store_fp16(b[i].d, d);
        for (int j = 0; j < HALF_NL; j++) {
            const int lo = iq4nl_nearest(id * src[j]);
            const int hi = iq4nl_nearest(id * src[j + HALF_NL]);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* sum_j kvalues[index_j] * a_j over one block, exact in int32. */
static int32_t iq4nl_block_dot(const uint8_t *qs, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < HALF_NL; j++)
        sum += iq4nl_values[qs[j] & 0x0f] * a[j] + iq4nl_values[qs[j] >> 4] * a[j + HALF_NL];
    return sum;
}

float iq4_nl_dot(const void *weights, const void *activations, int64_t n) {
    const block_iq4_nl *w = weights;
    const block_q8_0 *a = activations;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_NL; i++)
        sum += iq4nl_block_dot(w[i].qs, a[i].qs) * (block_load_fp16(w[i].d) * block_load_fp16(a[i].d));
    return sum;
}
