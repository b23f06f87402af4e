/*
 * q5_0.c — Q5_0 and Q5_1: 5-bit integers with one scale (and for Q5_1 one
 * minimum) per block of 32. The low four bits of each code are packed like
 * Q4_0's nibbles; the fifth bits sit together in one little-endian u32.
 *
 * Q5_0 block, 22 bytes, 5.5 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..5   qh     u32, bit j is bit 4 of element j's code (j = 0..31)
 *   bytes  6..21  qs[16] byte j: low nibble = bits 0..3 of element j,
 *                        high nibble = bits 0..3 of element j + 16
 *   element = (q - 16) * d, q in 0..31
 *
 * Q5_1 block, 24 bytes, 6 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..3   m      fp16 minimum
 *   bytes  4..7   qh     as in Q5_0
 *   bytes  8..23  qs[16] as in Q5_0
 *   element = q * d + m
 *
 * Quantization is GGML's reference: Q5_0 sets d = max / -16 from the value
 * of largest magnitude (sign kept) and rounds with trunc(x / d + 16.5),
 * clipped to 31; Q5_1 spans [min, max] with d = (max - min) / 31.
 * Dot products: Q5_0 against Q8_0 activations, Q5_1 against Q8_1.
 */
#include "quant/formats.h"

#include <float.h>
#include <math.h>

#include "quant/block.h"
#include "quant/weight_blocks.h"

enum { QK5 = 32, HALF5 = QK5 / 2 };

/* The 32 codes (0..31) of a block from its nibbles and high bits. */
static void q5_unpack(const uint8_t *qs, const uint8_t *qh_bytes, uint8_t codes[QK5]) {
    const uint32_t qh = block_load_u32(qh_bytes);
    for (int j = 0; j < HALF5; j++) {
        codes[j] = (uint8_t)((qs[j] & 0x0f) | ((qh >> j) & 1u) << 4);
        codes[j + HALF5] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + HALF5)) & 1u) << 4);
    }
}

static void q5_pack(const uint8_t codes[QK5], uint8_t *qs, uint8_t *qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < HALF5; j++) {
        qs[j] = (uint8_t)((codes[j] & 0x0f) | (codes[j + HALF5] & 0x0f) << 4);
        qh |= (uint32_t)(codes[j] >> 4) << j | (uint32_t)(codes[j + HALF5] >> 4) << (j + HALF5);
    }
    block_store_u32(qh_bytes, qh);
}

/* trunc(v) clipped to 0..31, with no float-to-int cast of NaN or inf. */
static uint8_t code5_clip(float v) {
    if (!(v > 0.0f)) return 0;
    return v >= 31.0f ? 31 : (uint8_t)v;
}

/* sum_j (code_j - offset) * a_j over one block, exact in int32. */
static int32_t q5_block_dot(const uint8_t codes[QK5], int offset, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < QK5; j++) sum += (codes[j] - offset) * a[j];
    return sum;
}

void q5_0_dequantize(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    uint8_t codes[QK5];
    for (int64_t i = 0; i < n / QK5; i++, dst += QK5) {
        const float d = block_load_fp16(b[i].d);
        q5_unpack(b[i].qs, b[i].qh, codes);
        for (int j = 0; j < QK5; j++) dst[j] = (codes[j] - 16) * d;
    }
}

void q5_0_quantize(const float *src, void *dst, int64_t n) {
    block_q5_0 *b = dst;
    uint8_t codes[QK5];
    for (int64_t i = 0; i < n / QK5; i++, src += QK5) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5; j++) {
            if (fabsf(src[j]) > amax) {
                amax = fabsf(src[j]);
                max = src[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_store_fp16(b[i].d, d);
        for (int j = 0; j < QK5; j++) codes[j] = code5_clip(src[j] * id + 16.5f);
        q5_pack(codes, b[i].qs, b[i].qh);
    }
}

float q5_0_dot(const void *weights, const void *activations, int64_t n) {
    const block_q5_0 *w = weights;
    const block_q8_0 *a = activations;
    uint8_t codes[QK5];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK5; i++) {
        q5_unpack(w[i].qs, w[i].qh, codes);
        sum += q5_block_dot(codes, 16, a[i].qs) * (block_load_fp16(w[i].d) * block_load_fp16(a[i].d));
    }
    return sum;
}

void q5_1_dequantize(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    uint8_t codes[QK5];
    for (int64_t i = 0; i < n / QK5; i++, dst += QK5) {
        const float d = block_load_fp16(b[i].d);
        const float m = block_load_fp16(b[i].m);
        q5_unpack(b[i].qs, b[i].qh, codes);
        for (int j = 0; j < QK5; j++) dst[j] = codes[j] * d + m;
    }
}

void q5_1_quantize(const float *src, void *dst, int64_t n) {
    block_q5_1 *b = dst;
    uint8_t codes[QK5];
    for (int64_t i = 0; i < n / QK5; i++, src += QK5) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5; j++) {
            if (src[j] < min) min = src[j];
            if (src[j] > max) max = src[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_store_fp16(b[i].d, d);
        block_store_fp16(b[i].m, min);
        for (int j = 0; j < QK5; j++) codes[j] = code5_clip((src[j] - min) * id + 0.5f);
        q5_pack(codes, b[i].qs, b[i].qh);
    }
}

float q5_1_dot(const void *weights, const void *activations, int64_t n) {
    const block_q5_1 *w = weights;
    const block_q8_1 *a = activations;
    uint8_t codes[QK5];
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK5; i++) {
        q5_unpack(w[i].qs, w[i].qh, codes);
        const float dd = block_load_fp16(w[i].d) * block_load_fp16(a[i].d);
        sum += dd * q5_block_dot(codes, 0, a[i].qs) + block_load_fp16(w[i].m) * block_load_fp16(a[i].s);
    }
    return sum;
}
