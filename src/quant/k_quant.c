/*
 * k_quant.c — the parts of the K-quants that several formats share: packing
 * of the 6-bit scales and mins, GGML's scale searches, and the quantizer,
 * dequantizer and dot product of a scale/min super-block (Q4_K and Q5_K
 * differ only in how they pack its codes).
 *
 * The searches follow GGML's reference quantizers step for step and in the
 * same float operation order, so what we write is what llama.cpp's own
 * reference quantizer writes: byte for byte on every block we compared
 * (4096 blocks each of Gaussian, Student-t and offset data against libggml's
 * quantize_row_q{4,5,6,8}_K_ref).
 */
#include "quant/k_quant.h"

#include <stdbool.h>

void k_scale_min_pack(const uint8_t scales[8], const uint8_t mins[8],
                      uint8_t packed[K_SCALE_BYTES]) {
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)(scales[j] | (scales[j + 4] >> 4) << 6);
        packed[j + 4] = (uint8_t)(mins[j] | (mins[j + 4] >> 4) << 6);
        packed[j + 8] = (uint8_t)((scales[j + 4] & 0x0f) | (mins[j + 4] & 0x0f) << 4);
    }
}

/* ------------------------------------------------------------ affine search */

/* Codes of x for the inverse scale iscale and offset min. */
static void codes_affine(const float *x, int n, float iscale, float min, int nmax, uint8_t *codes) {
    for (int i = 0; i < n; i++) codes[i] = (uint8_t)k_round_clamped(iscale * (x[i] - min), 0, nmax);
}

static float weighted_error(const float *x, const float *w, const uint8_t *codes, int n,
                            float scale, float min) {
    float error = 0;
    for (int i = 0; i < n; i++) {
        float diff = scale * codes[i] + min - x[i];
        error += w[i] * (diff * diff);
    }
    return error;
}

/* Weighted least squares for scale and min with the codes fixed; a positive
 * min is clamped to 0 and the scale refitted through the origin. False when
 * the system is singular (all codes equal). sum_w = sum w, sum_x = sum w x. */
static bool fit_scale_min(const float *x, const float *w, const uint8_t *codes, int n,
                          float sum_w, float sum_x, float *scale, float *min) {
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; i++) {
        float wl = w[i] * codes[i];
        sum_l += wl;
        sum_l2 += wl * codes[i];
        sum_xl += wl * x[i];
    }
    float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) return false;
    *scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    *min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (*min > 0) {
        *min = 0;
        *scale = sum_xl / sum_l2;
    }
    return true;
}

float k_search_scale_min(const float *x, const float *weights, int n, int nmax,
                         k_search_grid grid, float *neg_min) {
    float lo = x[0], hi = x[0], sum_w = 0, sum_x = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        *neg_min = -lo;
        return 0;
    }
    uint8_t codes[32];
    float iscale = nmax / (hi - lo);
    float best_scale = 1 / iscale, best_min = lo;
    codes_affine(x, n, iscale, lo, nmax, codes);
    float best_error = weighted_error(x, weights, codes, n, best_scale, best_min);
    /* As in GGML, each candidate grid is laid over the best min found so far. */
    for (int step = 0; step <= grid.nstep; step++) {
        iscale = (grid.rmin + grid.rdelta * (float)step + (float)nmax) / (hi - best_min);
        codes_affine(x, n, iscale, best_min, nmax, codes);
        float scale, min;
        if (!fit_scale_min(x, weights, codes, n, sum_w, sum_x, &scale, &min)) continue;
        float error = weighted_error(x, weights, codes, n, scale, min);
        if (error < best_error) {
            best_error = error;
            best_scale = scale;
            best_min = min;
        }
    }
    *neg_min = -best_min;
    return best_scale;
}

/* --------------------------------------------------------- symmetric search */

/* sum w x l and sum w l^2, w = x^2, for the codes of inverse scale iscale. */
static void symmetric_sums(const float *x, int n, int nmax, float iscale, float *sum_lx,
                           float *sum_l2) {
    float lx = 0, l2 = 0; /* locals: the outputs might alias x */
    for (int i = 0; i < n; i++) {
        int l = k_round_clamped(iscale * x[i], -nmax, nmax - 1);
        float w = x[i] * x[i];
        lx += w * x[i] * l;
        l2 += w * l * l;
    }
    *sum_lx = lx;
    *sum_l2 = l2;
}

float k_search_scale_symmetric(const float *x, int n, int nmax) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < 1e-15f) return 0;
    /* The least-squares scale of codes L is sum_lx / sum_l2 and it removes
     * sum_lx^2 / sum_l2 from the error, so the best grid point maximises
     * that ratio. Step 0 is the plain absmax scale. */
    float sum_lx, sum_l2;
    symmetric_sums(x, n, nmax, -nmax / max, &sum_lx, &sum_l2);
    float scale = sum_l2 ? sum_lx / sum_l2 : 0, best = scale * sum_lx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0) continue;
        symmetric_sums(x, n, nmax, -(nmax + 0.1f * step) / max, &sum_lx, &sum_l2);
        if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
            scale = sum_lx / sum_l2;
            best = scale * sum_lx;
        }
    }
    return scale;
}

/* ---------------------------------------------------- scale/min super-block */

/* One sub-block of 32: weights favour large magnitudes over the RMS floor. */
static float search_sub_block(const float *x, int nmax, k_search_grid grid, float *neg_min) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; l++) sum_x2 += x[l] * x[l];
    float av_x = sqrtf(sum_x2 / 32);
    float weights[32];
    for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[l]);
    return k_search_scale_min(x, weights, 32, nmax, grid, neg_min);
}

/* The 8 scales and 8 mins as 6-bit multiples of d = (largest scale) / 63
 * and dmin = (largest min) / 63. */
static void quantize_scales_mins(const float scales[8], const float mins[8],
                                 k_scale_min_block *out) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)k_round_clamped(inv_scale * scales[j], 0, 63);
        lm[j] = (uint8_t)k_round_clamped(inv_min * mins[j], 0, 63);
    }
    k_scale_min_pack(ls, lm, out->scales);
    out->d = block_f32_to_fp16(max_scale / 63.0f);
    out->dmin = block_f32_to_fp16(max_min / 63.0f);
}

/* Codes against the scales as they will be decoded (fp16 d times 6 bits),
 * which undoes part of the scale rounding. */
static void requantize(const float x[QK_K], int nmax, k_scale_min_block *out) {
    float d = block_fp16_to_f32(out->d), dmin = block_fp16_to_f32(out->dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        k_scale_min_get(out->scales, j, &sc, &m);
        float scale = d * sc, min = dmin * m;
        uint8_t *q = out->q + 32 * j;
        if (scale == 0) {
            memset(q, 0, 32); /* every code decodes to -min */
            continue;
        }
        for (int l = 0; l < 32; l++) {
            q[l] = (uint8_t)k_round_clamped((x[32 * j + l] + min) / scale, 0, nmax);
        }
    }
}

void k_quantize_scale_min(const float x[QK_K], int nmax, k_search_grid grid,
                          k_scale_min_block *out) {
    float scales[8], mins[8];
    for (int j = 0; j < 8; j++) scales[j] = search_sub_block(x + 32 * j, nmax, grid, &mins[j]);
    quantize_scales_mins(scales, mins, out);
    requantize(x, nmax, out);
}

void k_dequantize_scale_min(const k_scale_min_block *b, float y[QK_K]) {
    float d = block_fp16_to_f32(b->d), dmin = block_fp16_to_f32(b->dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        k_scale_min_get(b->scales, j, &sc, &m);
        float scale = d * sc, min = dmin * m;
        for (int l = 0; l < 32; l++) y[32 * j + l] = scale * b->q[32 * j + l] - min;
    }
}

float k_dot_scale_min(const k_scale_min_block *b, const block_q8_k *a) {
    /* No overflow for any int8 qs and int16 bsums: |codes . qs| <= 32 * 31 *
     * 128 per sub-block, times scale 63 times 8 sub-blocks < 2^26; the min
     * sum is at most 8 * 63 * 2 * 2^15 < 2^25. */
    int32_t sum_q = 0, sum_m = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        k_scale_min_get(b->scales, j, &sc, &m);
        int32_t dot = 0;
        for (int l = 0; l < 32; l++) dot += b->q[32 * j + l] * a->qs[32 * j + l];
        sum_q += sc * dot;
        sum_m += m * (k_q8_bsum(a, 2 * j) + k_q8_bsum(a, 2 * j + 1));
    }
    float ad = k_q8_d(a);
    float d = block_fp16_to_f32(b->d) * ad, dmin = block_fp16_to_f32(b->dmin) * ad;
    return d * (float)sum_q - dmin * (float)sum_m;
}
