/*
 * q6_k.c — Q6_K: 6-bit codes with a signed 8-bit scale per sub-block of 16,
 * in super-blocks of 256 (GGML's block_q6_K). Symmetric: no min.
 *
 * Block layout, 210 bytes for 256 weights = 6.5625 bits per weight, d
 * little-endian. Weights come in two halves h = 0, 1 of 128; within a half,
 * l = 0..31 indexes four weights 128 h + l, +32, +64, +96:
 *
 *   bytes   0..127  ql     bits 0..3 of the codes, 64 bytes per half:
 *                     byte 64 h + l:      low nibble  = weight 128 h + l
 *                                         high nibble = weight 128 h + 64 + l
 *                     byte 64 h + 32 + l: low nibble  = weight 128 h + 32 + l
 *                                         high nibble = weight 128 h + 96 + l
 *   bytes 128..191  qh     bits 4..5 of the codes, 32 bytes per half:
 *                     byte 128 + 32 h + l: bits 0..1 weight 128 h + l
 *                                          bits 2..3 weight 128 h + 32 + l
 *                                          bits 4..5 weight 128 h + 64 + l
 *                                          bits 6..7 weight 128 h + 96 + l
 *   bytes 192..207  scales int8, scale j of sub-block j = weights 16 j..16 j+15
 *   bytes 208..209  d      fp16, factor of the scales
 *
 * Weight i decodes to (d * scale_{i/16}) * (q_i - 32), q_i in 0..63, in
 * float. d * scale is exact (11 + 8 significant bits), so the one rounding
 * is of the final product and the result is bit-exact with GGML's to_float.
 */
#include "quant/formats.h"
#include "quant/k_quant.h"
#include "quant/weight_blocks.h"

/* Codes minus 32 (-32..31), in weight order. */
static void q6_k_unpack(const block_q6_k *b, int8_t q[QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *y = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            y[l] = (int8_t)(((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32);
            y[l + 32] = (int8_t)(((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32);
            y[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            y[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

/* Codes 0..63 in weight order into ql and qh. */
static void q6_k_pack(const uint8_t q[QK_K], block_q6_k *b) {
    for (int h = 0; h < 2; h++) {
        uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        const uint8_t *x = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((x[l] & 0x0f) | (x[l + 64] & 0x0f) << 4);
            ql[l + 32] = (uint8_t)((x[l + 32] & 0x0f) | (x[l + 96] & 0x0f) << 4);
            qh[l] = (uint8_t)(x[l] >> 4 | (x[l + 32] >> 4) << 2 | (x[l + 64] >> 4) << 4 |
                              (x[l + 96] >> 4) << 6);
        }
    }
}

/* GGML's quantize_row_q6_K_ref: a symmetric search per sub-block, then the
 * 16 scales as int8 against the one of largest magnitude, which maps to
 * -128 (so d takes the opposite sign of that scale), then every weight
 * requantized against its scale as stored. */
static void q6_k_quantize_block(const float *x, block_q6_k *b) {
    float scales[QK_K / 16], max_scale = 0, max_abs = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        scales[j] = k_search_scale_symmetric(x + 16 * j, 16, 32);
        if (fabsf(scales[j]) > max_abs) {
            max_abs = fabsf(scales[j]);
            max_scale = scales[j];
        }
    }
    memset(b, 0, sizeof *b);
    if (max_abs < 1e-15f) return; /* d = 0: every weight decodes to 0 */
    float iscale = -128.0f / max_scale;
    block_store_fp16(b->d, 1 / iscale);
    for (int j = 0; j < QK_K / 16; j++) {
        b->scales[j] = (int8_t)k_round_clamped(iscale * scales[j], -128, 127);
    }
    float d = block_load_fp16(b->d);
    uint8_t q[QK_K];
    for (int j = 0; j < QK_K / 16; j++) {
        float scale = d * b->scales[j];
        for (int l = 0; l < 16; l++) {
            int code = scale == 0 ? 0 : k_round_clamped(x[16 * j + l] / scale, -32, 31);
            q[16 * j + l] = (uint8_t)(code + 32);
        }
    }
    q6_k_pack(q, b);
}

void q6_k_dequantize(const void *src, float *dst, int64_t n) {
    const block_q6_k *blocks = src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q6_k *b = &blocks[i];
        q6_k_unpack(b, q);
        float d = block_load_fp16(b->d);
        float *y = dst + i * QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            float scale = d * b->scales[j];
            for (int l = 0; l < 16; l++) y[16 * j + l] = scale * q[16 * j + l];
        }
    }
}

void q6_k_quantize(const float *src, void *dst, int64_t n) {
    block_q6_k *blocks = dst;
    for (int64_t i = 0; i < n / QK_K; i++) q6_k_quantize_block(src + i * QK_K, &blocks[i]);
}

/* Signed codes times activations, so the -32 offset costs nothing and any
 * int8 activations are safe: |sum| <= 16 * 32 * 128 * 128 * 16 < 2^31. */
static float q6_k_block_dot(const block_q6_k *b, const block_q8_k *a) {
    int8_t q[QK_K];
    q6_k_unpack(b, q);
    int32_t sum = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        int32_t dot = 0;
        for (int l = 0; l < 16; l++) dot += q[16 * j + l] * a->qs[16 * j + l];
        sum += b->scales[j] * dot;
    }
    return block_load_fp16(b->d) * k_q8_d(a) * (float)sum;
}

float q6_k_dot(const void *weights, const void *activations, int64_t n) {
    const block_q6_k *w = weights;
    const block_q8_k *a = activations;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) sum += q6_k_block_dot(&w[i], &a[i]);
    return sum;
}
