/*
 * q4_k.c — Q4_K: 4-bit codes with a 6-bit scale and a 6-bit min per
 * sub-block of 32, in super-blocks of 256 (GGML's block_q4_K).
 *
 * Block layout, 144 bytes for 256 weights = 4.5 bits per weight, multi-byte
 * fields little-endian:
 *
 *   bytes   0..1    d      fp16, factor of the 6-bit sub-block scales
 *   bytes   2..3    dmin   fp16, factor of the 6-bit sub-block mins
 *   bytes   4..15   scales 8 scales and 8 mins of 6 bits, packed:
 *                     byte  4 + j (j = 0..3): bits 0..5 scale j,
 *                                             bits 6..7 bits 4..5 of scale j+4
 *                     byte  8 + j (j = 0..3): bits 0..5 min j,
 *                                             bits 6..7 bits 4..5 of min j+4
 *                     byte 12 + j (j = 0..3): bits 0..3 bits 0..3 of scale j+4,
 *                                             bits 4..7 bits 0..3 of min j+4
 *   bytes  16..143  qs     4-bit codes q, 32 bytes per group of 64 weights:
 *                     byte 16 + 32 g + l (g = 0..3, l = 0..31):
 *                       low nibble  = q of weight 64 g + l
 *                       high nibble = q of weight 64 g + 32 + l
 *
 * Weight i lies in sub-block j = i / 32 and decodes to
 *     (d * scale_j) * q_i - (dmin * min_j)
 * in float; the products are exact, so this is bit-exact with GGML's
 * to_float.
 */
#include "quant/formats.h"
#include "quant/k_quant.h"
#include "quant/weight_blocks.h"

/* GGML's quantize_row_q4_K_ref search: grid of 21 inverse scales
 * (15 - 1 + 0.1 i) / range, i = 0..20. */
static const k_search_grid q4_k_grid = {-1.0f, 0.1f, 20};

static void q4_k_load(const block_q4_k *b, k_scale_min_block *out) {
    out->d = block_load_u16(b->d);
    out->dmin = block_load_u16(b->dmin);
    memcpy(out->scales, b->scales, K_SCALE_BYTES);
    for (int g = 0; g < 4; g++) {
        for (int l = 0; l < 32; l++) {
            out->q[64 * g + l] = b->qs[32 * g + l] & 0x0f;
            out->q[64 * g + 32 + l] = b->qs[32 * g + l] >> 4;
        }
    }
}

static void q4_k_store(const k_scale_min_block *in, block_q4_k *b) {
    block_store_u16(b->d, in->d);
    block_store_u16(b->dmin, in->dmin);
    memcpy(b->scales, in->scales, K_SCALE_BYTES);
    for (int g = 0; g < 4; g++) {
        for (int l = 0; l < 32; l++) {
            b->qs[32 * g + l] = (uint8_t)(in->q[64 * g + l] | in->q[64 * g + 32 + l] << 4);
        }
    }
}

void q4_k_dequantize(const void *src, float *dst, int64_t n) {
    const block_q4_k *blocks = src;
    k_scale_min_block b;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q4_k_load(&blocks[i], &b);
        k_dequantize_scale_min(&b, dst + i * QK_K);
    }
}

void q4_k_quantize(const float *src, void *dst, int64_t n) {
    block_q4_k *blocks = dst;
    k_scale_min_block b;
    for (int64_t i = 0; i < n / QK_K; i++) {
        k_quantize_scale_min(src + i * QK_K, 15, q4_k_grid, &b);
        q4_k_store(&b, &blocks[i]);
    }
}

float q4_k_dot(const void *weights, const void *activations, int64_t n) {
    const block_q4_k *w = weights;
    const block_q8_k *a = activations;
    k_scale_min_block b;
    float sum = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        q4_k_load(&w[i], &b);
        sum += k_dot_scale_min(&b, &a[i]);
    }
    return sum;
}
