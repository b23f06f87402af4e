/*
 * float.c — the unquantized formats: F32, F16 and BF16.
 *
 * Each is a "block" of one element (block_size 1), little-endian:
 *
 *   F32   bytes 0..3  IEEE binary32                      32 bits per weight
 *   F16   bytes 0..1  IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits)
 *                                                         16 bits per weight
 *   BF16  bytes 0..1  the top half of a binary32 (1 sign, 8 exponent,
 *                     7 mantissa bits)                    16 bits per weight
 *
 * Their dot products take float activations (dot_type F32): converting the
 * activations would only lose precision and save nothing, since a float
 * weight row is read once per token anyway.
 *
 * The dot kernels keep DOT_LANES independent partial sums so the compiler
 * can put them in one vector register without reassociating float adds,
 * which it may not do on its own.
 */
#include "quant/formats.h"

#include <string.h>

#include "quant/block.h"

_Static_assert(sizeof(float) == 4, "F32 rows are IEEE binary32");

enum { DOT_LANES = 8 };

float fp16_to_f32(uint16_t h) { return block_fp16_to_f32(h); }
uint16_t f32_to_fp16(float f) { return block_f32_to_fp16(f); }
float bf16_to_f32(uint16_t h) { return block_bf16_to_f32(h); }
uint16_t f32_to_bf16(float f) { return block_f32_to_bf16(f); }

static float f32_load(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* The lanes in a fixed order, then the tail: the same sum whether or not
 * the compiler vectorised the loop. */
static float lanes_sum(const float acc[DOT_LANES], float tail) {
    float sum = 0.0f;
    for (int k = 0; k < DOT_LANES; k++) sum += acc[k];
    return sum + tail;
}

void f32_dequantize(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void f32_quantize(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

float f32_dot(const void *weights, const void *activations, int64_t n) {
    const uint8_t *w = weights;
    const float *x = activations;
    float acc[DOT_LANES] = {0};
    int64_t i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int k = 0; k < DOT_LANES; k++) acc[k] += f32_load(w + 4 * (i + k)) * x[i + k];
    float tail = 0.0f;
    for (; i < n; i++) tail += f32_load(w + 4 * i) * x[i];
    return lanes_sum(acc, tail);
}

void f16_dequantize(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = block_load_fp16(s + 2 * i);
}

void f16_quantize(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) block_store_fp16(d + 2 * i, src[i]);
}

float f16_dot(const void *weights, const void *activations, int64_t n) {
    const uint8_t *w = weights;
    const float *x = activations;
    float acc[DOT_LANES] = {0};
    int64_t i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int k = 0; k < DOT_LANES; k++) acc[k] += block_load_fp16(w + 2 * (i + k)) * x[i + k];
    float tail = 0.0f;
    for (; i < n; i++) tail += block_load_fp16(w + 2 * i) * x[i];
    return lanes_sum(acc, tail);
}

void bf16_dequantize(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = block_bf16_to_f32(block_load_u16(s + 2 * i));
}

void bf16_quantize(const float *src, void *dst, int64_t n) {
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) block_store_u16(d + 2 * i, block_f32_to_bf16(src[i]));
}

float bf16_dot(const void *weights, const void *activations, int64_t n) {
    const uint8_t *w = weights;
    const float *x = activations;
    float acc[DOT_LANES] = {0};
    int64_t i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int k = 0; k < DOT_LANES; k++)
            acc[k] += block_bf16_to_f32(block_load_u16(w + 2 * (i + k))) * x[i + k];
    float tail = 0.0f;
    for (; i < n; i++) tail += block_bf16_to_f32(block_load_u16(w + 2 * i)) * x[i];
    return lanes_sum(acc, tail);
}
