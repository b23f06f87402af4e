/*
 * k_quant.h — what the K-quant files (q4_k.c, q5_k.c, q6_k.c, q8_k.c) share.
 * Private to src/quant.
 *
 * GGML's K-quants group QK_K = 256 weights into a super-block that carries
 * one or two fp16 factors; its sub-blocks (32 or 16 weights) carry small
 * integer scales relative to them. The weight formats' dot products take
 * activations quantized to Q8_K (its layout is documented in q8_k.c).
 *
 * This header holds the pieces more than one format uses: the Q8_K block,
 * GGML's rounding, the packed 6-bit scales and mins of Q4_K and Q5_K, and
 * the scale searches of GGML's reference quantizers (k_quant.c). Block
 * structs follow block.h: byte arrays only, multi-byte fields little-endian
 * through its helpers, so a row may sit at any address.
 */
#ifndef MOE_QUANT_K_QUANT_H
#define MOE_QUANT_K_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/block.h"

#define QK_K 256
#define K_SCALE_BYTES 12 /* 8 six-bit scales + 8 six-bit mins of Q4_K / Q5_K */

/* Q8_K: the activation side of every K-quant dot product (see q8_k.c). */
typedef struct block_q8_k {
    uint8_t d[4];                 /* float32, x = d * qs */
    int8_t qs[QK_K];              /* -127..127 from the quantizer, any int8 accepted */
    uint8_t bsums[QK_K / 16 * 2]; /* int16 sum of each run of 16 qs */
} block_q8_k;
_Static_assert(sizeof(block_q8_k) == 292, "block_q8_k is 292 bytes");

static inline float k_q8_d(const block_q8_k *b) {
    return block_bits_to_f32(block_load_u32(b->d));
}

static inline int k_q8_bsum(const block_q8_k *b, int j) {
    return (int16_t)block_load_u16(b->bsums + 2 * j);
}

/* Round to nearest, ties to even, the way GGML's nearest_int does: adding
 * 1.5 * 2^23 leaves the rounded integer in the low mantissa bits. Exact for
 * |x| < 2^22; larger inputs (and NaN) give some value in [-2^22, 2^22), never
 * undefined behaviour, which the callers' clamps then bound. */
static inline int k_nearest_int(float x) {
    float biased = x + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

/* k_nearest_int of v clamped to lo..hi first, so out-of-range values and
 * NaN (which goes to lo) still land on a valid code. Same result as GGML's
 * round-then-clamp wherever that one is defined. This runs in the innermost
 * loop of every search, so it is written as the two comparisons x86's
 * maxss / minss implement (NaN yields the second operand); fminf / fmaxf
 * would be library calls without -ffinite-math-only. */
static inline int k_round_clamped(float v, int lo, int hi) {
    v = v > (float)lo ? v : (float)lo;
    v = v < (float)hi ? v : (float)hi;
    return k_nearest_int(v);
}

/* The scale and the min of sub-block j (0..7) from the 12 packed bytes of
 * Q4_K / Q5_K. Sub-blocks 0..3 keep theirs in the low 6 bits of bytes j and
 * j + 4; sub-blocks 4..7 keep their low 4 bits in the nibbles of byte j + 4
 * and their top 2 bits in the spare top bits of bytes j - 4 (scale) and j
 * (min). This is GGML's get_scale_min_k4. */
static inline void k_scale_min_get(const uint8_t packed[K_SCALE_BYTES], int j, uint8_t *scale,
                                   uint8_t *min) {
    if (j < 4) {
        *scale = packed[j] & 63;
        *min = packed[j + 4] & 63;
    } else {
        *scale = (uint8_t)((packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4));
        *min = (uint8_t)((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
    }
}

/* The inverse of k_scale_min_get for all eight sub-blocks; values 0..63. */
void k_scale_min_pack(const uint8_t scales[8], const uint8_t mins[8],
                      uint8_t packed[K_SCALE_BYTES]);

/* The grid of candidate inverse scales make_qkx2_quants tries:
 * (nmax + rmin + rdelta * i) / (max - min) for i = 0..nstep. */
typedef struct k_search_grid {
    float rmin, rdelta;
    int nstep;
} k_search_grid;

/* Best affine fit x ~ scale * L - neg_min, L in 0..nmax, min <= 0 (the
 * offset is never positive, so zero stays representable), minimising the
 * weighted squared error. GGML's make_qkx2_quants: start from the min/max
 * fit, then for every inverse scale on the grid round to codes and solve the
 * 2x2 least-squares problem for scale and min; keep the best. n <= 32.
 * Returns the scale and stores -min (>= 0) in *neg_min. */
float k_search_scale_min(const float *x, const float *weights, int n, int nmax,
                         k_search_grid grid, float *neg_min);

/* Best symmetric fit x ~ scale * L, L in -nmax..nmax-1, weighting each
 * element by x^2 (GGML's make_qx_quants with rmse_type 1): try the inverse
 * scales -(nmax + 0.1 i) / max for i = -9..9, take the least-squares scale
 * of the best. `max` is the element of largest magnitude, so the scale may
 * be negative. Returns 0 for a block whose magnitude is below 1e-15. */
float k_search_scale_symmetric(const float *x, int n, int nmax);

/* A Q4_K / Q5_K super-block with its codes unpacked, one byte each: what
 * the two formats share before (after) they bit-pack (unpack) the codes. */
typedef struct k_scale_min_block {
    uint16_t d;                    /* fp16 bits, factor of the sub-block scales */
    uint16_t dmin;                 /* fp16 bits, factor of the sub-block mins */
    uint8_t scales[K_SCALE_BYTES]; /* packed as k_scale_min_get reads */
    uint8_t q[QK_K];               /* codes 0..nmax in element order */
} k_scale_min_block;

/* GGML's quantize_row_q4_K_ref / q5_K_ref up to the bit packing: searches
 * each sub-block of 32 (weights av|x| + |x|, `grid`), quantizes the scales and
 * mins to 6 bits against the largest of each, then requantizes every
 * element against the scales as stored. */
void k_quantize_scale_min(const float x[QK_K], int nmax, k_search_grid grid,
                          k_scale_min_block *out);

/* Q4_K / Q5_K to float: y = (d * scale_j) * q - dmin * min_j, as GGML's
 * to_float computes it. Both products are exact in float (an fp16 has 11
 * significant bits, a scale 6, a code 5), so the one rounding is that of the
 * subtraction and the result is bit-exact with GGML's, FMA or not. */
void k_dequantize_scale_min(const k_scale_min_block *b, float y[QK_K]);

/* Dot product of a Q4_K / Q5_K super-block with a Q8_K block: integer sums
 * per sub-block; the mins enter through the activations' bsums. */
float k_dot_scale_min(const k_scale_min_block *b, const block_q8_k *a);

#endif
