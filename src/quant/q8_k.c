/*
 * q8_k.c — Q8_K: the activation format of the K-quant dot products (GGML's
 * block_q8_K). Weights are never stored in it; activations are quantized to
 * it right before a Q4_K / Q5_K / Q6_K dot product.
 *
 * Block layout, 292 bytes for 256 values = 9.125 bits per value, multi-byte
 * fields little-endian:
 *
 *   bytes   0..3    d      float32 (not fp16 as in the weight formats)
 *   bytes   4..259  qs     int8, value i = d * qs[i]
 *   bytes 260..291  bsums  int16, bsums[j] = qs[16 j] + ... + qs[16 j + 15]
 *
 * The bsums let a weight format with a per-sub-block min fold the min into
 * one multiply per sub-block: sum_i (s q_i - m) a_i = s sum q_i a_i -
 * m sum a_i.
 *
 * The quantizer is GGML's quantize_row_q8_K_ref: the value of largest
 * magnitude maps to -127 exactly (d = 1 / (-127 / max)), the rest round
 * to nearest, so codes stay in -127..127 and never reach -128.
 */
#include "quant/formats.h"
#include "quant/k_quant.h"

static void q8_k_quantize_block(const float *x, block_q8_k *b) {
    float max = 0, amax = 0;
    for (int i = 0; i < QK_K; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    memset(b, 0, sizeof *b);
    if (amax == 0) return;
    float iscale = -127.0f / max;
    /* So small that 127 / max overflows: store zeros too. GGML's codes for
     * such a block are garbage, with d = 0 all the same. */
    if (!isfinite(iscale)) return;
    for (int i = 0; i < QK_K; i++) b->qs[i] = (int8_t)k_round_clamped(iscale * x[i], -127, 127);
    for (int j = 0; j < QK_K / 16; j++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += b->qs[16 * j + l];
        block_store_u16(b->bsums + 2 * j, (uint16_t)(int16_t)sum);
    }
    block_store_u32(b->d, block_f32_to_bits(1 / iscale));
}

void q8_k_quantize(const float *src, void *dst, int64_t n) {
    block_q8_k *blocks = dst;
    for (int64_t i = 0; i < n / QK_K; i++) q8_k_quantize_block(src + i * QK_K, &blocks[i]);
}

void q8_k_dequantize(const void *src, float *dst, int64_t n) {
    const block_q8_k *blocks = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d = k_q8_d(&blocks[i]);
        for (int l = 0; l < QK_K; l++) dst[i * QK_K + l] = d * blocks[i].qs[l];
    }
}

/* Q8_K against Q8_K, for completeness of the format table: one int32 sum
 * per block (|sum| <= 256 * 128 * 128 = 2^22). */
float q8_k_dot(const void *weights, const void *activations, int64_t n) {
    const block_q8_k *w = weights, *a = activations;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t dot = 0;
        for (int l = 0; l < QK_K; l++) dot += w[i].qs[l] * a[i].qs[l];
        sum += k_q8_d(&w[i]) * k_q8_d(&a[i]) * (float)dot;
    }
    return sum;
}
