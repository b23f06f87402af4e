/*
 * mxfp4.c — MXFP4 (OCP microscaling FP4): 32 FP4 E2M1 values sharing one
 * power-of-two scale, as GGML stores it.
 *
 * Block, 17 bytes, 4.25 bits per weight:
 *   byte   0      e      E8M0 shared exponent (unsigned, bias 127)
 *   bytes  1..16  qs[16] E2M1 codes: byte j holds element j in its low
 *                        nibble and element j + 16 in its high nibble
 *   element = kvalues[code] * 2^(e - 128)
 *
 * An E2M1 code is sign(bit 3), exponent(bits 2..1), mantissa(bit 0), worth
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. GGML keeps those values
 * doubled, as the integers kvalues = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ...,
 * -12}, so dot products can run on int8, and halves the scale instead:
 * 2^(e - 128) = 2^(e - 127) / 2 (ggml_e8m0_to_fp32_half). For e < 2 that is
 * a float subnormal, 2^-128 or 2^-127. E8M0's NaN, e = 255, is not special:
 * GGML decodes it as 2^127, and so do we. With e = 254 the codes worth 8 and
 * 12 overflow float to infinity, as they do in GGML.
 *
 * Quantization is GGML's reference: e = floor(log2(amax)) - 2 + 127, which
 * puts amax in [4, 8) times the unit 2^(e-127), i.e. among the top codes,
 * and each element takes the code whose value is nearest (the first in
 * code order on a tie, so +0 over -0 and the smaller magnitude between two
 * codes). GGML converts a negative float exponent to uint8_t, which is
 * undefined; we clamp e to 0..254 there (amax < 2^-125 or infinite).
 * log2f is used rather than the float's exponent field so the rounding of
 * log2f just below a power of two matches GGML's.
 *
 * Dot products take Q8_0 activations.
 */
#include "quant/formats.h"

#include <math.h>

#include "quant/block.h"
#include "quant/weight_blocks.h"

enum { QK_MX = 32, HALF_MX = QK_MX / 2, MX_CODES = 16 };

static const int8_t mxfp4_values[MX_CODES] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) as a float, built from its bits. */
static float mxfp4_half_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return block_bits_to_f32(bits);
}

static uint8_t mxfp4_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    const float e = floorf(log2f(amax)) - 2.0f + 127.0f;
    return (uint8_t)(e <= 0.0f ? 0.0f : e >= 254.0f ? 254.0f : e);
}

/* The code whose value times `scale` is nearest to x; first wins on ties. */
static uint8_t mxfp4_nearest(float x, float scale) {
    uint8_t best = 0;
    float best_err = fabsf(mxfp4_values[0] * scale - x);
    for (uint8_t k = 1; k < MX_CODES; k++) {
        const float err = fabsf(mxfp4_values[k] * scale - x);
        if (err < best_err) {
            best = k;
            best_err = err;
        }
    }
    return best;
}

void mxfp4_dequantize(const void *src, float *dst, int64_t n) {
    const block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK_MX; i++, dst += QK_MX) {
        const float d = mxfp4_half_scale(b[i].e);
        for (int j = 0; j < HALF_MX; j++) {
            dst[j] = mxfp4_values[b[i].qs[j] & 0x0f] * d;
            dst[j + HALF_MX] = mxfp4_values[b[i].qs[j] >> 4] * d;
        }
    }
}

void mxfp4_quantize(const float *src, void *dst, int64_t n) {
    block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / QK_MX; i++, src += QK_MX) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MX; j++)
            if (fabsf(src[j]) > amax) amax = fabsf(src[j]);
        b[i].e = mxfp4_exponent(amax);
        const float d = mxfp4_half_scale(b[i].e);
        for (int j = 0; j < HALF_MX; j++)
            b[i].qs[j] = (uint8_t)(mxfp4_nearest(src[j], d) | mxfp4_nearest(src[j + HALF_MX], d) << 4);
    }
}

/* sum_j kvalues[code_j] * a_j over one block, exact in int32. */
static int32_t mxfp4_block_dot(const uint8_t *qs, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < HALF_MX; j++)
        sum += mxfp4_values[qs[j] & 0x0f] * a[j] + mxfp4_values[qs[j] >> 4] * a[j + HALF_MX];
    return sum;
}

float mxfp4_dot(const void *weights, const void *activations, int64_t n) {
    const block_mxfp4 *w = weights;
    const block_q8_0 *a = activations;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_MX; i++)
        sum += (block_load_fp16(a[i].d) * mxfp4_half_scale(w[i].e)) * mxfp4_block_dot(w[i].qs, a[i].qs);
    return sum;
}
