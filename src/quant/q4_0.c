/*
 * q4_0.c — Q4_0 and Q4_1: 4-bit integers with one scale (and for Q4_1 one
 * minimum) per block of 32.
 *
 * Q4_0 block, 18 bytes, 4.5 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..17  qs[16] nibbles: byte j holds element j in its low nibble
 *                        and element j + 16 in its high nibble
 *   element = (q - 8) * d, q in 0..15
 *
 * Q4_1 block, 20 bytes, 5 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..3   m      fp16 minimum
 *   bytes  4..19  qs[16] nibbles, laid out as in Q4_0
 *   element = q * d + m
 *
 * Quantization follows GGML's reference exactly. Q4_0 takes the value of
 * largest magnitude, max (with its sign), and sets d = max / -8: max is
 * q = 0 exactly, and the asymmetric code range (-8..7 after the offset)
 * only clips an element of the opposite sign and nearly equal magnitude,
 * whose q = 16 becomes 15. Rounding is trunc(x / d + 8.5): to nearest,
 * halves up. Q4_1 spans [min, max] with d = (max - min) / 15.
 *
 * Dot products: Q4_0 against Q8_0 activations, Q4_1 against Q8_1, whose
 * precomputed s = d_a * sum(q_a) turns the minimum's contribution
 * m * sum(a) into one multiply per block.
 */
#include "quant/formats.h"

#include <float.h>
#include <math.h>

#include "quant/block.h"
#include "quant/weight_blocks.h"

enum { QK4 = 32, HALF4 = QK4 / 2 };

/* trunc(v) clipped to 0..15. Comparing before converting keeps a NaN or
 * infinite input (a corrupt weight) from the undefined float-to-int cast. */
static uint8_t nibble_clip(float v) {
    if (!(v > 0.0f)) return 0;
    return v >= 15.0f ? 15 : (uint8_t)v;
}

/* The element of largest magnitude, sign kept; the first one on ties. */
static float block_signed_max(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* sum_j (q_j - 8) * a_j over one block, exact in int32. */
static int32_t q4_0_block_dot(const uint8_t *qs, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < HALF4; j++)
        sum += ((qs[j] & 0x0f) - 8) * a[j] + ((qs[j] >> 4) - 8) * a[j + HALF4];
    return sum;
}

/* sum_j q_j * a_j over one block, exact in int32. */
static int32_t q4_1_block_dot(const uint8_t *qs, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < HALF4; j++) sum += (qs[j] & 0x0f) * a[j] + (qs[j] >> 4) * a[j + HALF4];
    return sum;
}

void q4_0_dequantize(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        const float d = block_load_fp16(b[i].d);
        for (int j = 0; j < HALF4; j++) {
            dst[j] = ((b[i].qs[j] & 0x0f) - 8) * d;
            dst[j + HALF4] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void q4_0_quantize(const float *src, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        const float d = block_signed_max(src) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_store_fp16(b[i].d, d);
        for (int j = 0; j < HALF4; j++) {
            const uint8_t lo = nibble_clip(src[j] * id + 8.5f);
            const uint8_t hi = nibble_clip(src[j + HALF4] * id + 8.5f);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

float q4_0_dot(const void *weights, const void *activations, int64_t n) {
    const block_q4_0 *w = weights;
    const block_q8_0 *a = activations;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4; i++)
        sum += q4_0_block_dot(w[i].qs, a[i].qs) * (block_load_fp16(w[i].d) * block_load_fp16(a[i].d));
    return sum;
}

void q4_1_dequantize(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        const float d = block_load_fp16(b[i].d);
        const float m = block_load_fp16(b[i].m);
        for (int j = 0; j < HALF4; j++) {
            dst[j] = (b[i].qs[j] & 0x0f) * d + m;
            dst[j + HALF4] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

void q4_1_quantize(const float *src, void *dst, int64_t n) {
    block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4; j++) {
            if (src[j] < min) min = src[j];
            if (src[j] > max) max = src[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_store_fp16(b[i].d, d);
        block_store_fp16(b[i].m, min);
        for (int j = 0; j < HALF4; j++) {
            const uint8_t lo = nibble_clip((src[j] - min) * id + 0.5f);
            const uint8_t hi = nibble_clip((src[j + HALF4] - min) * id + 0.5f);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

float q4_1_dot(const void *weights, const void *activations, int64_t n) {
    const block_q4_1 *w = weights;
    const block_q8_1 *a = activations;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK4; i++) {
        const float dd = block_load_fp16(w[i].d) * block_load_fp16(a[i].d);
        sum += dd * q4_1_block_dot(w[i].qs, a[i].qs) + block_load_fp16(w[i].m) * block_load_fp16(a[i].s);
    }
    return sum;
}
