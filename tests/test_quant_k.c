/*
 * test_quant_k.c — the K-quants (Q4_K, Q5_K, Q6_K and the activation format
 * Q8_K) against their definitions:
 *   (a) hand-built blocks decode to values worked out by hand from GGML's
 *       block layouts (literal spot values plus an element-by-element
 *       decoder written here from the layout comment, not from src/);
 *   (b) quantize -> dequantize error stays within measured bounds, and the
 *       scale searches beat a plain min/max quantizer of the same format;
 *   (c) dot products with Q8_K activations agree with float64 references;
 *   (d) Q8_K codes, d and bsums follow GGML's quantize_row_q8_K_ref;
 *   (e) zero, constant and one-spike rows survive, quantizing is
 *       deterministic, and the format table binds these kernels.
 */
#include <stdint.h>
#include <stdlib.h>

#include "quant/formats.h"
#include "quant/quant.h"
#include "test.h"

#define QK 256

/* ------------------------------------------------------------ helpers */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static int16_t get_i16(const uint8_t *p) {
    return (int16_t)(uint16_t)(p[0] | p[1] << 8);
}

/* Blocks are little-endian whatever the host, so floats go through bytes. */
static float get_f32(const uint8_t *p) {
    uint32_t bits = 0;
    for (int i = 0; i < 4; i++) bits |= (uint32_t)p[i] << (8 * i);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void put_f32(uint8_t *p, float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(bits >> (8 * i));
}

/* splitmix64: a fixed seed gives the same data on every run. */
static uint64_t rng_state;

static double rng_uniform(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
}

static double rng_gaussian(void) {
    double u = rng_uniform(), v = rng_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Student-t with 3 degrees of freedom: heavy tails like real weight rows. */
static double rng_student_t3(void) {
    double z = rng_gaussian(), chi2 = 0;
    for (int k = 0; k < 3; k++) {
        double g = rng_gaussian();
        chi2 += g * g;
    }
    return z / sqrt(chi2 / 3.0);
}

enum { DATA_GAUSSIAN, DATA_STUDENT_T3 };

static float *make_data(int kind, int64_t n, uint64_t seed) {
    float *x = malloc((size_t)n * sizeof *x);
    rng_state = seed;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)(kind == DATA_GAUSSIAN ? rng_gaussian() : rng_student_t3());
    }
    return x;
}

static double rel_rmse(const float *x, const float *y, int64_t n) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        ref += (double)x[i] * x[i];
    }
    return sqrt(err / ref);
}

/* ------------------------------------------- (a) hand-built blocks: Q4_K/Q5_K */

/* Scales and mins of the eight sub-blocks, and the 12 bytes they pack to,
 * worked out by hand from the layout: bytes 0..3 = scale j | (scale j+4 >> 4)
 * << 6, bytes 4..7 = min j | (min j+4 >> 4) << 6, bytes 8..11 = (scale j+4 &
 * 15) | (min j+4 & 15) << 4. Sub-blocks 4..7 use values above 15 so that the
 * high-bit packing matters, e.g. scale 6 = 48 = 0b11'0000: low nibble 0 in
 * byte 10, top bits 3 in bits 6..7 of byte 2. */
static const uint8_t hand_scale[8] = {1, 2, 3, 63, 17, 33, 48, 5};
static const uint8_t hand_min[8] = {0, 7, 63, 9, 20, 1, 40, 62};
static const uint8_t hand_packed[12] = {0x41, 0x82, 0xc3, 0x3f, 0x40, 0x07,
                                        0xbf, 0xc9, 0x41, 0x11, 0x80, 0xe5};

static uint8_t hand_qs(int i) { return (uint8_t)(i * 37 + 11); }
static uint8_t hand_qh(int i) { return (uint8_t)(i * 53 + 7); }

/* Q4_K: d, dmin, 12 scale bytes, 128 bytes of nibbles. */
static void build_q4_k(uint8_t b[144], uint16_t d, uint16_t dmin) {
    put_u16(b, d);
    put_u16(b + 2, dmin);
    memcpy(b + 4, hand_packed, 12);
    for (int i = 0; i < 128; i++) b[16 + i] = hand_qs(i);
}

/* Q5_K: d, dmin, 12 scale bytes, 32 bytes qh, 128 bytes of nibbles. */
static void build_q5_k(uint8_t b[176], uint16_t d, uint16_t dmin) {
    put_u16(b, d);
    put_u16(b + 2, dmin);
    memcpy(b + 4, hand_packed, 12);
    for (int i = 0; i < 32; i++) b[16 + i] = hand_qh(i);
    for (int i = 0; i < 128; i++) b[48 + i] = hand_qs(i);
}

/* The 4-bit part of weight i: group g = i / 64 owns 32 bytes; the first 32
 * weights of a group are the low nibbles, the next 32 the high nibbles. */
static int nibble_of(int i) {
    int g = i / 64, w = i % 64;
    uint8_t byte = hand_qs(32 * g + w % 32);
    return w < 32 ? byte & 15 : byte >> 4;
}

/* Q5_K's fifth bit: byte w % 32 of qh, bit 2 g (+1 for the high half). */
static int high_bit_of(int i) {
    int g = i / 64, w = i % 64;
    return (hand_qh(w % 32) >> (2 * g + (w >= 32))) & 1;
}

/* The definition as GGML's to_float evaluates it, in float. */
static float scale_min_value(float d, float dmin, int i, int q) {
    float d1 = d * (float)hand_scale[i / 32];
    float m1 = dmin * (float)hand_min[i / 32];
    return d1 * (float)q - m1;
}

static void check_scale_min_block(quant_dequantize_fn dequantize, const uint8_t *block, float d,
                                  float dmin, int bits) {
    float y[QK];
    dequantize(block, y, QK);
    int mismatches = 0;
    for (int i = 0; i < QK; i++) {
        int q = nibble_of(i) + (bits == 5 ? 16 * high_bit_of(i) : 0);
        float want = scale_min_value(d, dmin, i, q);
        if (memcmp(&want, &y[i], sizeof want) != 0) mismatches++;
    }
    CHECKF(mismatches == 0, "%d of 256 weights differ from the definition", mismatches);
}

static void test_q4_k_hand_block(void) {
    uint8_t b[144];
    float y[QK];
    /* d = 0x3400 = 0.25, dmin = 0x3000 = 0.125: every value below is exact. */
    build_q4_k(b, 0x3400, 0x3000);
    q4_k_dequantize(b, y, QK);
    /* Weight 0: sub-block 0 (scale 1, min 0), low nibble of qs[0] = 0x0b. */
    CHECK(y[0] == 2.75f);
    /* Weight 32: sub-block 1 (2, 7), high nibble of qs[0] = 0. */
    CHECK(y[32] == -0.875f);
    /* Weight 150: group 2, low half, qs[86] = 0x79; sub-block 4 (17, 20). */
    CHECK(y[150] == 35.75f);
    /* Weight 180: group 2, high half, qs[84] = 0x2f; sub-block 5 (33, 1). */
    CHECK(y[180] == 16.375f);
    /* Weight 200: group 3, low half, qs[104] = 0x13; sub-block 6 (48, 40). */
    CHECK(y[200] == 31.0f);
    /* Weight 255: group 3, high half, qs[127] = 0x66; sub-block 7 (5, 62). */
    CHECK(y[255] == -0.25f);
    check_scale_min_block(q4_k_dequantize, b, 0.25f, 0.125f, 4);
    /* d = 0x2e66 = 0.0999755859375, dmin = 0x3555 = 0.333251953125 use all
     * 11 bits of fp16 precision, so the values round and must match to the
     * bit the definition evaluated in float. */
    build_q4_k(b, 0x2e66, 0x3555);
    check_scale_min_block(q4_k_dequantize, b, 0.0999755859375f, 0.333251953125f, 4);
}

static void test_q5_k_hand_block(void) {
    uint8_t b[176];
    float y[QK];
    build_q5_k(b, 0x3400, 0x3000);
    q5_k_dequantize(b, y, QK);
    /* Weight 0: nibble 11, qh[0] = 0x07 bit 0 set: q = 27, sub-block 0. */
    CHECK(y[0] == 6.75f);
    /* Weight 1: qs[1] = 0x30 low nibble 0, qh[1] = 0x3c bit 0 clear. */
    CHECK(y[1] == 0.0f);
    /* Weight 33: high nibble of qs[1] = 3, qh[1] bit 1 clear; (2, 7). */
    CHECK(y[33] == 0.625f);
    /* Weight 100: group 1 high half, qs[36] = 0x3f -> 3, qh[4] = 0xdb bit 3
     * set -> q = 19; sub-block 3 (63, 9): 0.25 * 63 * 19 - 0.125 * 9. */
    CHECK(y[100] == 298.125f);
    /* Weight 150: group 2 low half, nibble 9, qh[22] = 0xad bit 4 set. */
    CHECK(y[150] == 103.75f);
    /* Weight 255: nibble 6, qh[31] = 0x72 bit 7 clear; (5, 62). */
    CHECK(y[255] == -0.25f);
    check_scale_min_block(q5_k_dequantize, b, 0.25f, 0.125f, 5);
    build_q5_k(b, 0x2e66, 0x3555);
    check_scale_min_block(q5_k_dequantize, b, 0.0999755859375f, 0.333251953125f, 5);
}

/* ------------------------------------------------ (a) hand-built blocks: Q6_K */

/* Signed sub-block scales, including both int8 extremes and a zero. */
static const int8_t hand_q6_scale[16] = {1,  -1,  2,  -3,  127, -128, 5, -7,
                                         64, -64, 10, -10, 33,  -33,  0, 100};

static uint8_t hand_ql(int i) { return (uint8_t)(i * 29 + 5); }
static uint8_t hand_q6_qh(int i) { return (uint8_t)(i * 71 + 3); }

/* Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d. */
static void build_q6_k(uint8_t b[210], uint16_t d) {
    for (int i = 0; i < 128; i++) b[i] = hand_ql(i);
    for (int i = 0; i < 64; i++) b[128 + i] = hand_q6_qh(i);
    memcpy(b + 192, hand_q6_scale, 16);
    put_u16(b + 208, d);
}

/* Code 0..63 of weight i: half h = i / 128, quarter k, lane l. Quarters 0, 1
 * are the low nibbles of ql bytes l and 32 + l, quarters 2, 3 the high
 * nibbles of the same bytes; qh byte l holds bits 2k..2k+1 for quarter k. */
static int q6_code_of(int i) {
    int h = i / 128, k = (i % 128) / 32, l = i % 32;
    uint8_t low = hand_ql(64 * h + l + 32 * (k % 2));
    int nibble = k >= 2 ? low >> 4 : low & 15;
    int high = (hand_q6_qh(32 * h + l) >> (2 * k)) & 3;
    return nibble | high << 4;
}

static void check_q6_k_block(const uint8_t *block, float d) {
    float y[QK];
    q6_k_dequantize(block, y, QK);
    int mismatches = 0;
    for (int i = 0; i < QK; i++) {
        float ds = d * (float)hand_q6_scale[i / 16];
        float want = ds * (float)(q6_code_of(i) - 32);
        if (memcmp(&want, &y[i], sizeof want) != 0) mismatches++;
    }
    CHECKF(mismatches == 0, "%d of 256 weights differ from the definition", mismatches);
}

static void test_q6_k_hand_block(void) {
    uint8_t b[210];
    float y[QK];
    build_q6_k(b, 0x3400); /* d = 0.25 */
    q6_k_dequantize(b, y, QK);
    /* Weight 0: ql[0] = 0x05 low, qh[0] = 0x03 bits 0..1 = 3: q = 53. */
    CHECK(y[0] == 5.25f);
    /* Weight 40: quarter 1, ql[40] = 0x4d low 13, qh[8] = 0x3b bits 2..3 = 2:
     * q = 45; scale 2 = 2. */
    CHECK(y[40] == 6.5f);
    /* Weight 70: quarter 2, ql[6] = 0xb3 high 11, qh[6] = 0xad bits 4..5 = 2:
     * q = 43; scale 4 = 127. */
    CHECK(y[70] == 349.25f);
    /* Weight 100: quarter 3, q = 1; scale 6 = 5: 0.25 * 5 * -31. */
    CHECK(y[100] == -38.75f);
    /* Weight 200: second half, q = 18; scale 12 = 33. */
    CHECK(y[200] == -115.5f);
    /* Weight 230: scale 14 = 0. */
    CHECK(y[230] == 0.0f);
    /* Weight 255: ql[127] = 0x68 high 6, qh[63] = 0x7c bits 6..7 = 1: q = 22;
     * scale 15 = 100. */
    CHECK(y[255] == -250.0f);
    check_q6_k_block(b, 0.25f);
    /* A negative d with a full mantissa (0xae66 = -0.0999755859375). */
    build_q6_k(b, 0xae66);
    check_q6_k_block(b, -0.0999755859375f);
}

/* --------------------------------------------------- (a) hand-built: Q8_K */

static void test_q8_k_hand_block(void) {
    uint8_t b[292] = {0};
    float d = -0.375f, y[QK];
    put_f32(b, d);
    for (int i = 0; i < QK; i++) b[4 + i] = (uint8_t)(i * 7 - 100);
    q8_k_dequantize(b, y, QK);
    CHECK(y[0] == 37.5f);     /* qs = -100 */
    CHECK(y[20] == -15.0f);   /* 140 - 100 = 40 */
    CHECK(y[255] == 40.125f); /* 1685 mod 256 = 149 = int8 -107 */
    int mismatches = 0;
    for (int i = 0; i < QK; i++) mismatches += y[i] != d * (float)(int8_t)b[4 + i];
    CHECK(mismatches == 0);
}

/* -------------------------------------------------- (b) quantization error */

/* A plain quantizer of the same storage: per sub-block min/max (Q4_K, Q5_K)
 * or absmax (Q6_K) scales, no search, with the sub-block scales rounded the
 * way the format stores them. It returns reconstructed floats. */
static float fp16_round(float x) { return fp16_to_f32(f32_to_fp16(x)); }

static float round_clamp(double v, double lo, double hi) {
    return (float)fmin(hi, fmax(lo, nearbyint(v)));
}

static void naive_scale_min(const float *x, float *y, int nmax) {
    float scale[8], neg_min[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = x[32 * j];
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        scale[j] = (hi - lo) / nmax;
        neg_min[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, neg_min[j]);
    }
    float d = fp16_round(max_scale / 63), dmin = fp16_round(max_min / 63);
    for (int j = 0; j < 8; j++) {
        float s = d * round_clamp(d ? scale[j] / d : 0, 0, 63);
        float m = dmin * round_clamp(dmin ? neg_min[j] / dmin : 0, 0, 63);
        for (int l = 0; l < 32; l++) {
            float q = s ? round_clamp((x[32 * j + l] + m) / s, 0, nmax) : 0;
            y[32 * j + l] = s * q - m;
        }
    }
}

static void naive_q4_k(const float *x, float *y) { naive_scale_min(x, y, 15); }
static void naive_q5_k(const float *x, float *y) { naive_scale_min(x, y, 31); }

static void naive_q6_k(const float *x, float *y) {
    float scale[16], max_abs = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0, max = 0;
        for (int l = 0; l < 16; l++) {
            if (fabsf(x[16 * j + l]) > amax) {
                amax = fabsf(x[16 * j + l]);
                max = x[16 * j + l];
            }
        }
        scale[j] = max / -32; /* the extreme maps to code -32 exactly */
        max_abs = fmaxf(max_abs, amax / 32);
    }
    float d = fp16_round(max_abs / 127);
    for (int j = 0; j < 16; j++) {
        float s = d * round_clamp(d ? scale[j] / d : 0, -127, 127);
        for (int l = 0; l < 16; l++) {
            y[16 * j + l] = s * (s ? round_clamp(x[16 * j + l] / s, -32, 31) : 0);
        }
    }
}

typedef void (*naive_fn)(const float *x, float *y);

/* What one data set must meet: the relative RMSE, and the ratio of that to
 * the plain quantizer's (0 where there is no plain one to compare). */
typedef struct error_bound {
    double rmse, ratio;
} error_bound;

typedef struct k_format {
    const char *name;
    size_t block_bytes;
    quant_quantize_fn quantize;
    quant_dequantize_fn dequantize;
    quant_dot_fn dot;
    naive_fn naive; /* NULL for Q8_K, which has no search */
    error_bound gaussian, heavy;
} k_format;

/*
 * Relative RMSE ||x - deq(q(x))|| / ||x|| on 65536 values, fixed seeds
 * (Gaussian: seed 1, Student-t with 3 degrees of freedom: seed 2), measured
 * with gcc 12 on x86-64. Each RMSE bound is the measurement times 1.15,
 * rounded up to 3 significant digits. Also in tests/QUANT_ERROR_BOUNDS.md.
 *
 * "plain" is the min/max (absmax for Q6_K) quantizer above. Beating it is
 * not enough to show that the searches run: Q6_K's least-squares refit of
 * the absmax scale alone beats it by 1.8% (gaussian) and 0.5% (t3), a third
 * of the full search's gain (0.01846 and 0.02640 without the grid). So the
 * ratio to plain must keep at least half of its measured gain:
 * bound = 1 - (1 - measured) / 2.
 *
 *   format  gaussian  student-t3  bound g.  bound t3  plain g.  plain t3  ratio g.  ratio t3
 *   q4_k    0.07118   0.09214     0.0819    0.106     0.07829   0.10424   0.909     0.884
 *   q5_k    0.03607   0.04711     0.0415    0.0542    0.03816   0.04947   0.945     0.952
 *   q6_k    0.01778   0.02606     0.0205    0.0300    0.01880   0.02653   0.946     0.982
 *   q8_k    0.00695   0.01845     0.00800   0.0213    -         -         -         -
 *
 *   ratio bounds (gaussian, t3): q4_k 0.955, 0.942; q5_k 0.973, 0.977;
 *   q6_k 0.973, 0.992.
 */
static const k_format k_formats[] = {
    {"q4_k", 144, q4_k_quantize, q4_k_dequantize, q4_k_dot, naive_q4_k,
     {0.0819, 0.955}, {0.106, 0.942}},
    {"q5_k", 176, q5_k_quantize, q5_k_dequantize, q5_k_dot, naive_q5_k,
     {0.0415, 0.973}, {0.0542, 0.977}},
    {"q6_k", 210, q6_k_quantize, q6_k_dequantize, q6_k_dot, naive_q6_k,
     {0.0205, 0.973}, {0.0300, 0.992}},
    {"q8_k", 292, q8_k_quantize, q8_k_dequantize, q8_k_dot, NULL, {0.00800, 0}, {0.0213, 0}},
};
#define N_FORMATS (sizeof k_formats / sizeof k_formats[0])

enum { N_ERROR = 65536 };

static double roundtrip_rmse(const k_format *f, const float *x, int64_t n) {
    uint8_t *q = malloc((size_t)(n / QK) * f->block_bytes);
    float *y = malloc((size_t)n * sizeof *y);
    f->quantize(x, q, n);
    f->dequantize(q, y, n);
    double e = rel_rmse(x, y, n);
    free(q);
    free(y);
    return e;
}

static double naive_rmse(const k_format *f, const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i += QK) f->naive(x + i, y + i);
    double e = rel_rmse(x, y, n);
    free(y);
    return e;
}

static void check_error(const k_format *f, const float *x, const char *data, error_bound bound) {
    double e = roundtrip_rmse(f, x, N_ERROR);
    printf("  %s %-10s rel. RMSE %.5f (bound %.3g)", f->name, data, e, bound.rmse);
    CHECKF(e <= bound.rmse, "%s on %s: %.5f > %.3g", f->name, data, e, bound.rmse);
    if (f->naive) {
        double naive = naive_rmse(f, x, N_ERROR);
        printf(", plain %.5f, ratio %.4f (bound %.3g)", naive, e / naive, bound.ratio);
        CHECKF(e / naive <= bound.ratio, "%s on %s: the search gains too little over plain "
               "min/max: %.5f vs %.5f", f->name, data, e, naive);
    }
    printf("\n");
}

static void test_quantization_error(void) {
    float *gauss = make_data(DATA_GAUSSIAN, N_ERROR, 1);
    float *heavy = make_data(DATA_STUDENT_T3, N_ERROR, 2);
    for (size_t k = 0; k < N_FORMATS; k++) {
        check_error(&k_formats[k], gauss, "gaussian", k_formats[k].gaussian);
        check_error(&k_formats[k], heavy, "student-t3", k_formats[k].heavy);
    }
    free(gauss);
    free(heavy);
}

/* ----------------------------------------------------------- (c) dot products */

enum { N_DOT = 8192 };

/*
 * Two references for each weight format:
 *  - exact: float64 sum of dequantized weights times dequantized Q8_K
 *    activations. The kernel's integer sums are exact; it differs only by
 *    float32 rounding of a few products per block (terms up to ~3x the
 *    block's sum |w a| when mins are large) and of the running sum over 32
 *    blocks: at most ~40 float32 epsilons of sum |w a|, so 4e-6 of it is
 *    allowed. Measured: 1e-10 .. 6e-9 of it.
 *  - original: float64 sum against the float activations. The difference
 *    is the Q8_K rounding, uniform within +-d/2 per value with d =
 *    max|a| / 127 of its block; allowed 5 standard deviations of that sum,
 *    5 sqrt(sum w^2 d^2 / 12), plus the exact tolerance.
 */
static void check_dot(const k_format *f, const float *w, const float *a) {
    uint8_t *qw = malloc((size_t)(N_DOT / QK) * f->block_bytes + 1);
    uint8_t *qa = malloc((size_t)(N_DOT / QK) * 292);
    float *dw = malloc(N_DOT * sizeof *dw), *da = malloc(N_DOT * sizeof *da);
    f->quantize(w, qw + 1, N_DOT); /* at an odd address: kernels need no alignment */
    q8_k_quantize(a, qa, N_DOT);
    f->dequantize(qw + 1, dw, N_DOT);
    q8_k_dequantize(qa, da, N_DOT);
    double exact = 0, magnitude = 0, original = 0, variance = 0;
    for (int i = 0; i < N_DOT; i++) {
        exact += (double)dw[i] * da[i];
        magnitude += fabs((double)dw[i] * da[i]);
        original += (double)dw[i] * a[i];
    }
    for (int b = 0; b < N_DOT / QK; b++) {
        double amax = 0;
        for (int l = 0; l < QK; l++) amax = fmax(amax, fabs(a[b * QK + l]));
        double step = amax / 127;
        for (int l = 0; l < QK; l++) {
            variance += (double)dw[b * QK + l] * dw[b * QK + l] * step * step / 12;
        }
    }
    double got = f->dot(qw + 1, qa, N_DOT), tight = 4e-6 * magnitude;
    printf("  %s dot %.6f: exact %.6f (|diff| %.2g of sum |w a|), original %.6f (|diff| %.2g sd)\n",
           f->name, got, exact, fabs(got - exact) / magnitude, original,
           fabs(got - original) / sqrt(variance));
    CHECKF(fabs(got - exact) <= tight, "%s: %.9g vs %.9g", f->name, got, exact);
    CHECKF(fabs(got - original) <= tight + 5 * sqrt(variance), "%s: %.9g vs %.9g", f->name, got,
           original);
    free(qw);
    free(qa);
    free(dw);
    free(da);
}

static void test_dot_products(void) {
    float *w = make_data(DATA_STUDENT_T3, N_DOT, 3);
    float *a = make_data(DATA_GAUSSIAN, N_DOT, 4);
    /* Shift the weights so the mins of Q4_K / Q5_K are not symmetric. */
    for (int i = 0; i < N_DOT; i++) w[i] += 0.25f;
    for (size_t k = 0; k < N_FORMATS; k++) check_dot(&k_formats[k], w, a);
    free(w);
    free(a);
}

/* --------------------------------------------------------------- (d) Q8_K */

/* Block 0's extreme is -127/64, so iscale = -127 / max = 64 exactly and the
 * codes are 64 x rounded half to even; block 1's extreme is +127/64, so the
 * codes flip sign and d is negative (d = 1 / iscale, GGML's convention). */
static void test_q8_k_quantizer(void) {
    float x[2 * QK];
    int want[2 * QK];
    for (int i = 0; i < QK; i++) {
        int k = (i * 37) % 253 - 126; /* -126..126 */
        x[i] = (float)k / 64;
        want[i] = k;
        x[QK + i] = (float)k / 64;
        want[QK + i] = -k;
    }
    x[5] = -127.0f / 64; want[5] = -127;
    x[QK + 9] = 127.0f / 64; want[QK + 9] = -127;
    x[6] = 2.5f / 64; want[6] = 2;    /* ties go to even */
    x[7] = 3.5f / 64; want[7] = 4;
    x[8] = -0.5f / 64; want[8] = 0;
    x[10] = 5.25f / 64; want[10] = 5;
    uint8_t q[2 * 292];
    q8_k_quantize(x, q, 2 * QK);
    CHECK(get_f32(q) == 1.0f / 64);
    CHECK(get_f32(q + 292) == -1.0f / 64);
    int mismatches = 0;
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < QK; i++) mismatches += (int8_t)q[292 * b + 4 + i] != want[QK * b + i];
    }
    CHECKF(mismatches == 0, "%d codes differ", mismatches);
}

static void test_q8_k_bsums(void) {
    enum { N = 16 * QK };
    float *x = make_data(DATA_STUDENT_T3, N, 5);
    uint8_t *q = malloc((N / QK) * 292);
    q8_k_quantize(x, q, N);
    int wrong = 0, out_of_range = 0;
    for (int b = 0; b < N / QK; b++) {
        const uint8_t *block = q + 292 * b;
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) {
                int v = (int8_t)block[4 + 16 * j + l];
                sum += v;
                out_of_range += v < -127;
            }
            wrong += get_i16(block + 260 + 2 * j) != sum;
        }
    }
    CHECKF(wrong == 0, "%d of %d bsums wrong", wrong, N / 16);
    CHECK(out_of_range == 0);
    free(x);
    free(q);
}

/* ------------------------------------------------------------- edge cases */

/* An all-zero row: every format stores something that decodes to zeros. */
static void test_zero_rows(void) {
    float x[QK] = {0}, y[QK];
    uint8_t q[292];
    for (size_t k = 0; k < N_FORMATS; k++) {
        const k_format *f = &k_formats[k];
        f->quantize(x, q, QK);
        for (int i = 0; i < QK; i++) y[i] = 1;
        f->dequantize(q, y, QK);
        int nonzero = 0;
        for (int i = 0; i < QK; i++) nonzero += y[i] != 0;
        CHECKF(nonzero == 0, "%s: %d nonzero", f->name, nonzero);
    }
}

/* Constant and one-spike blocks: no NaN, the spike survives, zeros stay
 * near zero; and quantizing twice gives the same bytes. */
static void test_awkward_blocks(void) {
    float x[2 * QK], y[2 * QK];
    for (int i = 0; i < QK; i++) {
        x[i] = -3.0f;
        x[QK + i] = 0;
    }
    x[QK + 77] = 1000.0f;
    uint8_t q1[2 * 292], q2[2 * 292];
    for (size_t k = 0; k < N_FORMATS; k++) {
        const k_format *f = &k_formats[k];
        f->quantize(x, q1, 2 * QK);
        f->quantize(x, q2, 2 * QK);
        CHECKF(memcmp(q1, q2, 2 * f->block_bytes) == 0, "%s is not deterministic", f->name);
        f->dequantize(q1, y, 2 * QK);
        double worst = 0;
        for (int i = 0; i < 2 * QK; i++) {
            if (i != QK + 77) worst = fmax(worst, fabs((double)y[i] - x[i]));
        }
        CHECKF(worst <= 0.01 * 3.0, "%s: off by %g away from the spike", f->name, worst);
        CHECKF(fabs(y[QK + 77] - 1000.0) <= 10.0, "%s: spike decodes to %g", f->name, y[QK + 77]);
    }
}

/* ---------------------------------------------------------- format table */

static void test_table_binds_kernels(void) {
    static const struct {
        moe_type type;
        size_t bytes;
        quant_dequantize_fn dequantize;
        quant_quantize_fn quantize;
        quant_dot_fn dot;
    } want[] = {
        {MOE_TYPE_Q4_K, 144, q4_k_dequantize, q4_k_quantize, q4_k_dot},
        {MOE_TYPE_Q5_K, 176, q5_k_dequantize, q5_k_quantize, q5_k_dot},
        {MOE_TYPE_Q6_K, 210, q6_k_dequantize, q6_k_quantize, q6_k_dot},
        {MOE_TYPE_Q8_K, 292, q8_k_dequantize, q8_k_quantize, q8_k_dot},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const quant_format *f = quant_format_of(want[k].type);
        CHECK(f != NULL);
        if (!f) continue;
        CHECK(f->block_size == QK);
        CHECK(f->block_bytes == want[k].bytes);
        CHECK(f->dequantize == want[k].dequantize);
        CHECK(f->quantize == want[k].quantize);
        CHECK(f->dot == want[k].dot);
        CHECK(f->dot_type == MOE_TYPE_Q8_K);
    }
}

int main(void) {
    RUN(test_q4_k_hand_block);
    RUN(test_q5_k_hand_block);
    RUN(test_q6_k_hand_block);
    RUN(test_q8_k_hand_block);
    RUN(test_quantization_error);
    RUN(test_dot_products);
    RUN(test_q8_k_quantizer);
    RUN(test_q8_k_bsums);
    RUN(test_zero_rows);
    RUN(test_awkward_blocks);
    RUN(test_table_binds_kernels);
    return test_summary();
}
