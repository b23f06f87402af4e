/*
 * q8_0.c — Q8_0 and its activation twin Q8_1: 8-bit integers with one scale
 * per block of 32.
 *
 * Q8_0 block, 34 bytes, 8.5 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..33  qs[32] int8, element j is qs[j] * d
 *
 * Q8_1 block, 36 bytes, 9 bits per weight:
 *   bytes  0..1   d      fp16 scale
 *   bytes  2..3   s      fp16, d * sum(qs): lets the Q4_1 / Q5_1 dot products
 *                        apply their block minimum with one multiply
 *   bytes  4..35  qs[32] int8, element j is qs[j] * d
 *
 * Quantization is GGML's reference: d = amax / 127 and q = roundf(x / d)
 * (computed as x * (1/d)), so the largest magnitude maps to +-127. Q8_1 is
 * the activation format of Q4_1 and Q5_1; as weights it dots with itself.
 */
#include "quant/formats.h"

#include <math.h>

#include "quant/block.h"

enum { QK8 = 32 };

/* The structs are in block.h: the other 32-element families read them as
 * their dot products' activations. */
_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(block_q8_1) == 36, "Q8_1 block is 36 bytes");

/* Quantizes 32 floats to int8 with GGML's rule; returns the float scale d
 * (the caller stores it as fp16) and the sum of the quants in *sum. The
 * clamp changes nothing for finite input (|x / d| <= 127 up to rounding)
 * but keeps a NaN from the undefined float-to-int cast. */
static float q8_block_quantize(const float *x, int8_t *qs, int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < QK8; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int total = 0;
    for (int j = 0; j < QK8; j++) {
        qs[j] = (int8_t)roundf(fminf(fmaxf(x[j] * id, -127.0f), 127.0f));
        total += qs[j];
    }
    *sum = total;
    return d;
}

/* Sum of products of two rows of 32 int8: exact in int32 (|sum| < 2^19). */
static int32_t q8_block_dot(const int8_t *a, const int8_t *b) {
    int32_t sum = 0;
    for (int j = 0; j < QK8; j++) sum += (int32_t)a[j] * b[j];
    return sum;
}

void q8_0_dequantize(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8; i++, dst += QK8) {
        const float d = block_load_fp16(b[i].d);
        for (int j = 0; j < QK8; j++) dst[j] = b[i].qs[j] * d;
    }
}

void q8_0_quantize(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8; i++, src += QK8) {
        int sum;
        block_store_fp16(b[i].d, q8_block_quantize(src, b[i].qs, &sum));
    }
}

float q8_0_dot(const void *weights, const void *activations, int64_t n) {
    const block_q8_0 *w = weights;
    const block_q8_0 *a = activations;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8; i++)
        sum += q8_block_dot(w[i].qs, a[i].qs) * (block_load_fp16(w[i].d) * block_load_fp16(a[i].d));
    return sum;
}

void q8_1_dequantize(const void *src, float *dst, int64_t n) {
    const block_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK8; i++, dst += QK8) {
        const float d = block_load_fp16(b[i].d);
        for (int j = 0; j < QK8; j++) dst[j] = b[i].qs[j] * d;
    }
}

void q8_1_quantize(const float *src, void *dst, int64_t n) {
    block_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK8; i++, src += QK8) {
        int sum;
        const float d = q8_block_quantize(src, b[i].qs, &sum);
        block_store_fp16(b[i].d, d);
        block_store_fp16(b[i].s, (float)sum * d);
    }
}

float q8_1_dot(const void *weights, const void *activations, int64_t n) {
    const block_q8_1 *w = weights;
    const block_q8_1 *a = activations;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8; i++)
        sum += q8_block_dot(w[i].qs, a[i].qs) * (block_load_fp16(w[i].d) * block_load_fp16(a[i].d));
    return sum;
}
