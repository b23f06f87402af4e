/*
 * test_quant_blocks.c — the block layouts of the 32-element families and
 * the float formats, byte by byte.
 *
 * Dequantization: blocks are written out here byte by byte (fp16 scale bit
 * patterns, nibbles, high bits, E8M0 exponents) and every element is
 * compared, bit for bit, with the value the format's definition gives,
 * computed here with ldexp and small integers. Edge cases: subnormal and
 * negative fp16 scales, Q5 high bits on elements 0, 15, 16 and 31, MXFP4
 * exponents 0, 1, 254 and 255.
 *
 * Quantization: small blocks whose codes follow by hand from GGML's rules
 * (which element sets the scale, how halves round, where codes clip), and
 * four blocks per format whose bytes were produced by ggml itself
 * (libggml-base 0.25.1, commit 0ad4a86: quantize_row_<t>_ref, and for
 * IQ4_NL quantize_iq4_nl, the quantizer llama-quantize uses) from inputs
 * that are exact floats, so no libm difference can move them.
 */
#include <float.h>
#include <stdint.h>

#include "quant/quant.h"
#include "quant_data.h"
#include "test.h"

static const int8_t iq4nl_codebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
/* E2M1 values by code; code 8 is -0 in E2M1 but GGML's integer table makes it
 * +0, and a file's bits must decode as GGML decodes them. */
static const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6};

static void dequantize(moe_type type, const void *blocks, float *out, int64_t n) {
    quant_format_of(type)->dequantize(blocks, out, n);
}

static void quantize(moe_type type, const float *x, void *blocks, int64_t n) {
    quant_format_of(type)->quantize(x, blocks, n);
}

/* Element-wise bit-exact comparison (so -0 differs from +0, inf matches). */
static int count_mismatches(const float *got, const double *want, int n, const char *what) {
    int bad = 0;
    for (int j = 0; j < n; j++) {
        const float w = (float)want[j];
        if (memcmp(&got[j], &w, sizeof w) != 0 && bad++ < 4)
            fprintf(stderr, "  %s[%d] = %.9g, expected %.9g\n", what, j, got[j], w);
    }
    return bad;
}

/* --------------------------------------------------------------- F32/F16/BF16 */

static void test_float_rows(void) {
    const uint8_t f32_bytes[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc1}; /* 1, -8 */
    const uint8_t f16_bytes[6] = {0x00, 0x3c, 0x01, 0x00, 0xff, 0xfb}; /* 1, 2^-24, -65504 */
    const uint8_t bf16_bytes[4] = {0x80, 0x3f, 0x49, 0xc0};            /* 1, -3.140625 */
    float out[3];
    dequantize(MOE_TYPE_F32, f32_bytes, out, 2);
    CHECK(out[0] == 1.0f && out[1] == -8.0f);
    dequantize(MOE_TYPE_F16, f16_bytes, out, 3);
    CHECK(out[0] == 1.0f && out[1] == 0x1p-24f && out[2] == -65504.0f);
    dequantize(MOE_TYPE_BF16, bf16_bytes, out, 2);
    CHECK(out[0] == 1.0f && out[1] == -3.140625f);
    uint8_t bytes[8];
    const float x[2] = {1.0f, -3.14159f};
    quantize(MOE_TYPE_BF16, x, bytes, 2);
    CHECK(memcmp(bytes, bf16_bytes, 4) == 0);
    quantize(MOE_TYPE_F16, x, bytes, 2);
    CHECK(bytes[0] == 0x00 && bytes[1] == 0x3c && bytes[2] == 0x48 && bytes[3] == 0xc2);
}

/* --------------------------------------------------------------- Q8_0 / Q8_1 */

static void test_q8_0_dequantize(void) {
    /* d = 0x3800 = 0.5; then d = 0x0001 = 2^-24 (subnormal); d = 0xc000 = -2 */
    const uint16_t scales[3] = {0x3800, 0x0001, 0xc000};
    const double d[3] = {0.5, 0x1p-24, -2.0};
    uint8_t blocks[3 * 34];
    double want[96];
    for (int b = 0; b < 3; b++) {
        blocks[34 * b] = scales[b] & 0xff;
        blocks[34 * b + 1] = scales[b] >> 8;
        for (int j = 0; j < 32; j++) {
            const int q = j == 0 ? -128 : j == 1 ? 127 : j * 8 - 130;
            blocks[34 * b + 2 + j] = (uint8_t)(int8_t)q;
            want[32 * b + j] = q * d[b];
        }
    }
    float out[96];
    dequantize(MOE_TYPE_Q8_0, blocks, out, 96);
    CHECK(count_mismatches(out, want, 96, "q8_0") == 0);
}

static void test_q8_1_dequantize(void) {
    /* d = 0x2e66 = 0.0999755859375, s = 0x5555 (ignored by dequantization) */
    uint8_t block[36] = {0x66, 0x2e, 0x55, 0x55};
    double want[32];
    for (int j = 0; j < 32; j++) {
        block[4 + j] = (uint8_t)(int8_t)(j - 16);
        want[j] = (j - 16) * 0.0999755859375;
    }
    float out[32];
    dequantize(MOE_TYPE_Q8_1, block, out, 32);
    CHECK(count_mismatches(out, want, 32, "q8_1") == 0);
}

/* amax = 127 gives d = 1 exactly: codes are roundf(x), halves away from 0. */
static void test_q8_quantize_by_hand(void) {
    float x[32] = {127.0f, -127.0f, 63.5f, -63.5f, 0.49f, -2.5f, 1.5f, 100.2f};
    const int8_t want[8] = {127, -127, 64, -64, 0, -3, 2, 100};
    uint8_t q0[34], q1[36];
    quantize(MOE_TYPE_Q8_0, x, q0, 32);
    quantize(MOE_TYPE_Q8_1, x, q1, 32);
    CHECK(q0[0] == 0x00 && q0[1] == 0x3c);
    CHECK(q1[0] == 0x00 && q1[1] == 0x3c);
    for (int j = 0; j < 8; j++)
        CHECKF((int8_t)q0[2 + j] == want[j] && (int8_t)q1[4 + j] == want[j], "j=%d", j);
    for (int j = 8; j < 32; j++) CHECK(q0[2 + j] == 0 && q1[4 + j] == 0);
    /* s = d * sum(q) = 127 - 127 + 64 - 64 + 0 - 3 + 2 + 100 = 99 = 0x5630 */
    CHECK(q1[2] == 0x30 && q1[3] == 0x56);
}

/* --------------------------------------------------------------- Q4_0 / Q4_1 */

static void test_q4_0_dequantize(void) {
    /* Byte j: low nibble j & 15 (element j), high nibble 15 - j (element
     * j + 16). d = 0x3c00 = 1, then 0x8001 = -2^-24 (negative subnormal). */
    const uint16_t scales[2] = {0x3c00, 0x8001};
    const double d[2] = {1.0, -0x1p-24};
    uint8_t blocks[2 * 18];
    double want[64];
    for (int b = 0; b < 2; b++) {
        blocks[18 * b] = scales[b] & 0xff;
        blocks[18 * b + 1] = scales[b] >> 8;
        for (int j = 0; j < 16; j++) {
            blocks[18 * b + 2 + j] = (uint8_t)(j | (15 - j) << 4);
            want[32 * b + j] = (j - 8) * d[b];
            want[32 * b + 16 + j] = (15 - j - 8) * d[b];
        }
    }
    float out[64];
    dequantize(MOE_TYPE_Q4_0, blocks, out, 64);
    CHECK(count_mismatches(out, want, 64, "q4_0") == 0);
}

static void test_q4_1_dequantize(void) {
    /* d = 0x3800 = 0.5, m = 0xbc00 = -1; element = q * 0.5 - 1 */
    uint8_t block[20] = {0x00, 0x38, 0x00, 0xbc};
    double want[32];
    for (int j = 0; j < 16; j++) {
        const int lo = (j * 7) & 15, hi = (j * 5 + 3) & 15;
        block[4 + j] = (uint8_t)(lo | hi << 4);
        want[j] = lo * 0.5 - 1.0;
        want[16 + j] = hi * 0.5 - 1.0;
    }
    float out[32];
    dequantize(MOE_TYPE_Q4_1, block, out, 32);
    CHECK(count_mismatches(out, want, 32, "q4_1") == 0);
}

/* Q4_0: the element of largest magnitude is -16 (x[0]), so d = -16 / -8 = 2
 * and codes are trunc(x / 2 + 8.5) clipped to 15. */
static void test_q4_0_quantize_by_hand(void) {
    float x[32] = {-16.0f, 14.0f, 16.0f, 1.0f, -1.0f, 0.99f, -15.0f, 3.0f};
    x[16] = 15.9f; /* 16.45 -> 16 -> clipped to 15 */
    x[17] = -3.0f; /* 7.0 */
    const uint8_t lo_want[8] = {0, 15, 15, 9, 8, 8, 1, 10};
    uint8_t q[18];
    quantize(MOE_TYPE_Q4_0, x, q, 32);
    CHECK(q[0] == 0x00 && q[1] == 0x40); /* fp16 2.0 */
    for (int j = 0; j < 8; j++) CHECKF((q[2 + j] & 15) == lo_want[j], "element %d", j);
    CHECK(q[2] >> 4 == 15 && q[3] >> 4 == 7);
    for (int j = 2; j < 16; j++) CHECKF(q[2 + j] >> 4 == 8, "element %d", 16 + j);
    for (int j = 8; j < 16; j++) CHECKF((q[2 + j] & 15) == 8, "element %d", j);
}

/* Q4_1: min -1, max 14, so d = 1 and m = -1; codes trunc(x + 1 + 0.5). */
static void test_q4_1_quantize_by_hand(void) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = 0.0f;
    x[0] = -1.0f, x[1] = 14.0f, x[2] = 0.5f, x[3] = 0.49f, x[16] = 13.6f;
    uint8_t q[20];
    quantize(MOE_TYPE_Q4_1, x, q, 32);
    CHECK(q[0] == 0x00 && q[1] == 0x3c && q[2] == 0x00 && q[3] == 0xbc);
    CHECK((q[4] & 15) == 0 && (q[5] & 15) == 15 && (q[6] & 15) == 2 && (q[7] & 15) == 1);
    CHECK(q[4] >> 4 == 15); /* 13.6 + 1.5 = 15.1 */
    CHECK((q[8] & 15) == 1 && q[8] >> 4 == 1);
}

/* --------------------------------------------------------------- Q5_0 / Q5_1 */

/* qh = 0x80018001: the fifth bit set for elements 0, 15, 16 and 31 only. */
static void q5_codes(uint8_t *qh, uint8_t *qs, int codes[32]) {
    const uint32_t high = 0x80018001u;
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(high >> (8 * i));
    for (int j = 0; j < 16; j++) {
        const int lo = (j * 3) & 15, hi = (j * 11 + 5) & 15;
        qs[j] = (uint8_t)(lo | hi << 4);
        codes[j] = lo | (int)((high >> j) & 1) << 4;
        codes[16 + j] = hi | (int)((high >> (16 + j)) & 1) << 4;
    }
}

static void test_q5_0_dequantize(void) {
    /* d = 0x3c00 = 1 then d = 0x83ff = -(1023 * 2^-24), the largest negative subnormal */
    const uint16_t scales[2] = {0x3c00, 0x83ff};
    const double d[2] = {1.0, -1023 * 0x1p-24};
    uint8_t blocks[2 * 22];
    double want[64];
    for (int b = 0; b < 2; b++) {
        int codes[32];
        blocks[22 * b] = scales[b] & 0xff;
        blocks[22 * b + 1] = scales[b] >> 8;
        q5_codes(blocks + 22 * b + 2, blocks + 22 * b + 6, codes);
        for (int j = 0; j < 32; j++) want[32 * b + j] = (codes[j] - 16) * d[b];
    }
    CHECK(want[0] == 0.0 && want[15] == 13.0 && want[16] == 5.0 && want[31] == 10.0); /* by hand */
    float out[64];
    dequantize(MOE_TYPE_Q5_0, blocks, out, 64);
    CHECK(count_mismatches(out, want, 64, "q5_0") == 0);
}

static void test_q5_1_dequantize(void) {
    /* d = 0x3400 = 0.25, m = 0x4000 = 2 */
    uint8_t block[24] = {0x00, 0x34, 0x00, 0x40};
    int codes[32];
    q5_codes(block + 4, block + 8, codes);
    double want[32];
    for (int j = 0; j < 32; j++) want[j] = codes[j] * 0.25 + 2.0;
    float out[32];
    dequantize(MOE_TYPE_Q5_1, block, out, 32);
    CHECK(count_mismatches(out, want, 32, "q5_1") == 0);
}

/* Q5_0: x[5] = -32 sets d = 2; codes trunc(x / 2 + 16.5) clipped to 31.
 * Codes 16..31 must show up in qh. */
static void test_q5_0_quantize_by_hand(void) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = 0.0f; /* code 16: high bit set everywhere */
    x[5] = -32.0f; /* 0 */
    x[6] = 30.0f;  /* 31 */
    x[7] = 32.0f;  /* 32 -> 31 */
    x[20] = -1.0f; /* 16 */
    x[21] = -1.2f; /* 15.9 -> 15 */
    uint8_t q[22];
    quantize(MOE_TYPE_Q5_0, x, q, 32);
    CHECK(q[0] == 0x00 && q[1] == 0x40);
    const uint32_t qh = q[2] | (uint32_t)q[3] << 8 | (uint32_t)q[4] << 16 | (uint32_t)q[5] << 24;
    CHECKF(qh == ~((1u << 5) | (1u << 21)), "qh %08x", qh);
    CHECK((q[6 + 5] & 15) == 0 && (q[6 + 6] & 15) == 15 && (q[6 + 7] & 15) == 15);
    CHECK(q[6 + 4] >> 4 == 0 && q[6 + 5] >> 4 == 15);
}

/* Q5_1: min 0, max 31, so d = 1, m = 0 and codes are trunc(x + 0.5). */
static void test_q5_1_quantize_by_hand(void) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)j;
    x[3] = 2.5f;   /* 3 */
    x[17] = 16.4f; /* 16 */
    uint8_t q[24];
    quantize(MOE_TYPE_Q5_1, x, q, 32);
    CHECK(q[0] == 0x00 && q[1] == 0x3c && q[2] == 0x00 && q[3] == 0x00);
    const uint32_t qh = q[4] | (uint32_t)q[5] << 8 | (uint32_t)q[6] << 16 | (uint32_t)q[7] << 24;
    CHECKF(qh == 0xffff0000u, "qh %08x", qh);
    for (int j = 0; j < 16; j++) {
        const int hi = j == 1 ? 0 : j; /* element 17's code is 16: its nibble is 0 */
        CHECKF(q[8 + j] == (j | hi << 4), "byte %d = %02x", j, q[8 + j]);
    }
}

/* --------------------------------------------------------------- IQ4_NL */

static void test_iq4_nl_dequantize(void) {
    /* d = 0x3c00 = 1 then 0xb800 = -0.5; byte j = index j | index (15 - j) << 4 */
    const uint16_t scales[2] = {0x3c00, 0xb800};
    const double d[2] = {1.0, -0.5};
    uint8_t blocks[2 * 18];
    double want[64];
    for (int b = 0; b < 2; b++) {
        blocks[18 * b] = scales[b] & 0xff;
        blocks[18 * b + 1] = scales[b] >> 8;
        for (int j = 0; j < 16; j++) {
            blocks[18 * b + 2 + j] = (uint8_t)(j | (15 - j) << 4);
            want[32 * b + j] = iq4nl_codebook[j] * d[b];
            want[32 * b + 16 + j] = iq4nl_codebook[15 - j] * d[b];
        }
    }
    float out[64];
    dequantize(MOE_TYPE_IQ4_NL, blocks, out, 64);
    CHECK(count_mismatches(out, want, 64, "iq4_nl") == 0);
}

/* A block that is exactly codebook * 0.01, its largest magnitude on the
 * -127 entry: one of the searched scales is exactly right, so the codes
 * must come back as written and d as fp16(0.01) = 0x211f. */
static void test_iq4_nl_quantize_exact_block(void) {
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = iq4nl_codebook[(j * 5) & 15] * 0.01f;
    uint8_t q[18];
    quantize(MOE_TYPE_IQ4_NL, x, q, 32);
    CHECKF(q[0] == 0x1f && q[1] == 0x21, "d = %02x%02x", q[1], q[0]);
    for (int j = 0; j < 16; j++) {
        const int lo = (j * 5) & 15, hi = ((j + 16) * 5) & 15;
        CHECKF(q[2 + j] == (lo | hi << 4), "byte %d = %02x", j, q[2 + j]);
    }
}

/* All zeros: scale 0 and every index on the entry nearest 0 (+1, index 8). */
static void test_iq4_nl_quantize_zero_block(void) {
    const float x[32] = {0};
    uint8_t q[18];
    quantize(MOE_TYPE_IQ4_NL, x, q, 32);
    CHECK(q[0] == 0 && q[1] == 0);
    for (int j = 0; j < 16; j++) CHECK(q[2 + j] == 0x88);
}

/* --------------------------------------------------------------- MXFP4 */

static void test_mxfp4_dequantize(void) {
    /* element = e2m1(code) * 2^(e - 127): e = 127 gives the E2M1 values
     * themselves; 0 and 1 give float subnormals; with 254 (2^127) the
     * codes worth 2 and more reach 2^128 and overflow to infinity; 255 is
     * 2^128 in GGML (not NaN), so everything but 0 and +-0.5 is infinite. */
    const uint8_t exps[6] = {127, 0, 1, 254, 255, 130};
    uint8_t blocks[6 * 17];
    double want[6 * 32];
    for (int b = 0; b < 6; b++) {
        blocks[17 * b] = exps[b];
        for (int j = 0; j < 16; j++) {
            const int lo = j, hi = (j * 7 + 2) & 15;
            blocks[17 * b + 1 + j] = (uint8_t)(lo | hi << 4);
            want[32 * b + j] = ldexp(e2m1[lo], exps[b] - 127);
            want[32 * b + 16 + j] = ldexp(e2m1[hi], exps[b] - 127);
        }
    }
    CHECK(isinf((float)want[3 * 32 + 4]) && !isinf((float)want[3 * 32 + 3])); /* 2^128, 1.5 * 2^127 */
    float out[6 * 32];
    dequantize(MOE_TYPE_MXFP4, blocks, out, 6 * 32);
    CHECK(count_mismatches(out, want, 6 * 32, "mxfp4") == 0);
    CHECK(out[32 + 1] == 0x1p-128f); /* e = 0, code 1: 0.5 * 2^-127 */
}

/* amax = 6 gives e = floor(log2 6) - 2 + 127 = 127: the E2M1 values are
 * exact, ties go to the first code (the smaller magnitude; +0 over -0). */
static void test_mxfp4_quantize_by_hand(void) {
    float x[32] = {6.0f, -6.0f, 0.5f, -0.5f, 2.5f, -2.5f, 0.0f, -0.1f, 5.0f, 1.25f, -0.25f, 0.3f, 3.0f};
    x[16] = -4.0f, x[17] = 1.5f;
    const uint8_t lo_want[13] = {7, 15, 1, 9, 4, 12, 0, 0, 6, 2, 0, 1, 5};
    uint8_t q[17];
    quantize(MOE_TYPE_MXFP4, x, q, 32);
    CHECKF(q[0] == 127, "e = %d", q[0]);
    for (int j = 0; j < 13; j++)
        CHECKF((q[1 + j] & 15) == lo_want[j], "element %d code %d", j, q[1 + j] & 15);
    CHECK(q[1] >> 4 == 14 && q[2] >> 4 == 3);
    /* amax = 0.75 -> floor(log2) = -1 -> e = 124; amax = 0 -> e = 0 */
    float y[64] = {0.75f};
    quantize(MOE_TYPE_MXFP4, y, q, 32);
    CHECK(q[0] == 124 && (q[1] & 15) == 7);
    quantize(MOE_TYPE_MXFP4, y + 32, q, 32);
    CHECK(q[0] == 0);
    for (int j = 1; j < 17; j++) CHECK(q[j] == 0);
}

/* --------------------------------------------------------------- golden */

/* Bytes ggml 0.25.1 wrote for golden_input(); see the top of the file. */
static const uint8_t golden_q4_0[] = {
    0x8a, 0xaf, 0x64, 0x86, 0x81, 0x86, 0x87, 0x8d, 0x86, 0xc5, 0x8a, 0xf5,
    0xda, 0x08, 0x63, 0x88, 0x88, 0xf8, 0x03, 0x2f, 0x88, 0x98, 0xa8, 0x84,
    0x08, 0x94, 0xb8, 0x75, 0x98, 0x2d, 0x88, 0x38, 0x3b, 0x88, 0xd8, 0x89,
    0xe8, 0xaf, 0x88, 0x73, 0x85, 0x85, 0x8f, 0x88, 0x88, 0xa4, 0x8e, 0x29,
    0x88, 0x38, 0x91, 0x80, 0xa1, 0x8d, 0xe8, 0x2f, 0x5c, 0x8f, 0x78, 0x98,
    0x3b, 0x88, 0x88, 0x67, 0x07, 0x86, 0x8f, 0x80, 0xf6, 0x78, 0x84, 0xf8,
};
static const uint8_t golden_q4_1[] = {
    0xf3, 0x2f, 0x5d, 0xbb, 0x9b, 0x79, 0x7e, 0x89, 0x88, 0x72, 0x79, 0x4b,
    0x76, 0x0a, 0x25, 0xf8, 0xad, 0x88, 0x77, 0x07, 0x3b, 0x2e, 0x03, 0xbb,
    0x99, 0xa9, 0xb9, 0x94, 0x09, 0xa5, 0xc9, 0x86, 0xa9, 0x3f, 0x99, 0x39,
    0x4c, 0x99, 0xe9, 0x9a, 0x0c, 0x30, 0x46, 0xbb, 0x77, 0x8c, 0x7a, 0x7a,
    0x70, 0x77, 0x77, 0x6b, 0x71, 0xd7, 0x77, 0xc7, 0x6e, 0x7f, 0x5e, 0x73,
    0x25, 0x30, 0xe8, 0xbb, 0x4b, 0x8f, 0x78, 0x87, 0x3b, 0x88, 0x88, 0x56,
    0x07, 0x86, 0x8e, 0x70, 0xf6, 0x78, 0x84, 0xe8,
};
static const uint8_t golden_q5_0[] = {
    0x8a, 0xab, 0x20, 0xe5, 0xe6, 0xe7, 0xd8, 0x0d, 0x02, 0xfc, 0xff, 0x0a,
    0x0c, 0x89, 0x04, 0xfa, 0xb5, 0x0f, 0xb5, 0x00, 0x00, 0xf0, 0x03, 0x2b,
    0x47, 0xfb, 0x6f, 0xe5, 0x00, 0x20, 0x41, 0x08, 0x0f, 0x19, 0x60, 0xfa,
    0x10, 0x5b, 0x0f, 0x50, 0x66, 0x00, 0xa0, 0x01, 0xe8, 0xab, 0x71, 0x8f,
    0xfd, 0xf5, 0x00, 0xf6, 0x0a, 0x09, 0x0f, 0x00, 0x00, 0x39, 0x0c, 0x31,
    0x00, 0x60, 0x13, 0x00, 0x43, 0x09, 0xe8, 0x2b, 0x77, 0xa4, 0x6a, 0xd6,
    0x98, 0x0f, 0xe0, 0x1f, 0x66, 0x00, 0x00, 0xbd, 0x0e, 0x0d, 0x1d, 0xf0,
    0xfc, 0xf0, 0x08, 0xe0,
};
static const uint8_t golden_q5_1[] = {
    0xb1, 0x2b, 0x5d, 0xbb, 0xdf, 0x3a, 0x19, 0x38, 0x27, 0xf3, 0xfd, 0x03,
    0x01, 0xf5, 0xf3, 0x76, 0xfc, 0x15, 0x5a, 0xf0, 0x4a, 0x00, 0xff, 0x0f,
    0x08, 0x2a, 0x03, 0xbb, 0x57, 0xff, 0xef, 0xe5, 0x33, 0x52, 0x73, 0x39,
    0x02, 0x4a, 0x93, 0x1c, 0x43, 0x5f, 0x22, 0x63, 0x79, 0x32, 0xe3, 0x34,
    0xd6, 0x2b, 0x46, 0xbb, 0x8e, 0x70, 0x02, 0x0a, 0xff, 0x09, 0xf5, 0xf6,
    0xf0, 0xff, 0xff, 0xc6, 0xf2, 0xbd, 0xff, 0x9f, 0xdc, 0xff, 0xbc, 0xf5,
    0x02, 0x2c, 0xe8, 0xbb, 0x77, 0xa4, 0x6a, 0xd6, 0x97, 0x0e, 0xe0, 0x1f,
    0x66, 0x00, 0x00, 0xbd, 0x0e, 0x0d, 0x1d, 0xf0, 0xfc, 0xf0, 0x07, 0xd0,
};
static const uint8_t golden_q8_0[] = {
    0x9a, 0x1f, 0x42, 0x1a, 0x6f, 0x1c, 0x0b, 0xad, 0x1d, 0x36, 0xe4, 0x2e,
    0xd9, 0x05, 0x57, 0x02, 0x00, 0x00, 0x18, 0x00, 0x00, 0x05, 0x06, 0x00,
    0xfd, 0xc0, 0xfd, 0x8a, 0xac, 0x7f, 0x27, 0x03, 0x00, 0x84, 0x11, 0x1f,
    0x00, 0xfe, 0x05, 0xbf, 0xfa, 0xc6, 0x00, 0xd3, 0x03, 0x55, 0xfc, 0x00,
    0x2d, 0xff, 0x00, 0x09, 0x02, 0x11, 0x1e, 0x00, 0x81, 0x0a, 0x2c, 0xf6,
    0x0a, 0xa5, 0xfe, 0xad, 0xb3, 0x03, 0x4d, 0x01, 0xf8, 0x1f, 0x02, 0x50,
    0x31, 0x35, 0x8b, 0xff, 0x00, 0x39, 0x9e, 0xf5, 0x00, 0x04, 0x69, 0x7f,
    0x69, 0xb5, 0xff, 0x0c, 0x00, 0x01, 0x00, 0x00, 0x00, 0xe7, 0x00, 0x63,
    0x00, 0x4d, 0xf5, 0xff, 0xe1, 0x00, 0xf8, 0x1f, 0x3c, 0x75, 0x00, 0xf9,
    0x30, 0x00, 0x00, 0xeb, 0xf2, 0xe8, 0x67, 0x82, 0xe0, 0xff, 0xbd, 0x00,
    0xcb, 0x00, 0xf3, 0x08, 0xb1, 0x00, 0x00, 0xdb, 0x81, 0x00, 0x07, 0xfb,
    0x7b, 0xf8, 0x00, 0x6b,
};
static const uint8_t golden_q8_1[] = {
    0x9a, 0x1f, 0x4e, 0x3b, 0x42, 0x1a, 0x6f, 0x1c, 0x0b, 0xad, 0x1d, 0x36,
    0xe4, 0x2e, 0xd9, 0x05, 0x57, 0x02, 0x00, 0x00, 0x18, 0x00, 0x00, 0x05,
    0x06, 0x00, 0xfd, 0xc0, 0xfd, 0x8a, 0xac, 0x7f, 0x27, 0x03, 0x00, 0x84,
    0x11, 0x1f, 0x5a, 0xbe, 0x00, 0xfe, 0x05, 0xbf, 0xfa, 0xc6, 0x00, 0xd3,
    0x03, 0x55, 0xfc, 0x00, 0x2d, 0xff, 0x00, 0x09, 0x02, 0x11, 0x1e, 0x00,
    0x81, 0x0a, 0x2c, 0xf6, 0x0a, 0xa5, 0xfe, 0xad, 0xb3, 0x03, 0x4d, 0x01,
    0xf8, 0x1f, 0x3a, 0x42, 0x02, 0x50, 0x31, 0x35, 0x8b, 0xff, 0x00, 0x39,
    0x9e, 0xf5, 0x00, 0x04, 0x69, 0x7f, 0x69, 0xb5, 0xff, 0x0c, 0x00, 0x01,
    0x00, 0x00, 0x00, 0xe7, 0x00, 0x63, 0x00, 0x4d, 0xf5, 0xff, 0xe1, 0x00,
    0xf8, 0x1f, 0x1b, 0xb5, 0x3c, 0x75, 0x00, 0xf9, 0x30, 0x00, 0x00, 0xeb,
    0xf2, 0xe8, 0x67, 0x82, 0xe0, 0xff, 0xbd, 0x00, 0xcb, 0x00, 0xf3, 0x08,
    0xb1, 0x00, 0x00, 0xdb, 0x81, 0x00, 0x07, 0xfb, 0x7b, 0xf8, 0x00, 0x6b,
};
static const uint8_t golden_iq4_nl[] = {
    0xd9, 0x9f, 0x63, 0x86, 0x81, 0x76, 0x77, 0x8e, 0x86, 0xd4, 0x8a, 0xf4,
    0xeb, 0x07, 0x52, 0x88, 0x88, 0xf8, 0x18, 0x1f, 0x88, 0x98, 0xa8, 0x83,
    0x07, 0x93, 0xb8, 0x74, 0x98, 0x2e, 0x88, 0x28, 0x2b, 0x88, 0xd8, 0x89,
    0x07, 0xa0, 0x88, 0x72, 0x84, 0x84, 0x8f, 0x88, 0x88, 0xa4, 0x8e, 0x19,
    0x88, 0x28, 0x91, 0x80, 0xa1, 0x8d, 0xf8, 0x1f, 0x4c, 0x8f, 0x78, 0x97,
    0x2c, 0x88, 0x88, 0x56, 0x07, 0x86, 0x8f, 0x70, 0xf5, 0x78, 0x83, 0xf8,
};
static const uint8_t golden_mxfp4[] = {
    0x7c, 0x36, 0x03, 0x07, 0x13, 0x11, 0x0e, 0x03, 0xe5, 0x0b, 0xf5, 0xfc,
    0x71, 0x47, 0x00, 0x00, 0xf0, 0x7c, 0x00, 0x20, 0x31, 0x0e, 0xf9, 0x1d,
    0x40, 0x9c, 0x10, 0xf6, 0x00, 0xe0, 0xe5, 0x00, 0x60, 0x01, 0x7c, 0x00,
    0x17, 0x05, 0x05, 0x0f, 0x00, 0x00, 0xb6, 0x0f, 0x79, 0x00, 0x60, 0x97,
    0x07, 0xc7, 0x0e, 0x7c, 0xd6, 0x07, 0xa0, 0x19, 0xe5, 0x00, 0x00, 0xcb,
    0xfa, 0x0b, 0x17, 0x9f, 0x7c, 0x90, 0x0e, 0x70,
};

/* 128 heavy-tailed values k^3 / 2^24, k uniform in -255..255: exact floats. */
static void golden_input(float x[128]) {
    test_rng r = {0x5eed0001u};
    for (int i = 0; i < 128; i++) {
        const int k = (int)(test_rng_next(&r) % 511) - 255;
        x[i] = (float)(k * k * k) / 16777216.0f;
    }
}

static void check_golden(moe_type type, const uint8_t *golden, size_t size) {
    float x[128];
    uint8_t q[4 * 36];
    golden_input(x);
    CHECK(quant_row_bytes(type, 128) == size);
    quantize(type, x, q, 128);
    size_t first = size;
    for (size_t i = size; i-- > 0;)
        if (q[i] != golden[i]) first = i;
    CHECKF(first == size, "%s differs from ggml at byte %zu: %02x, ggml %02x", quant_format_of(type)->name,
           first, q[first], golden[first]);
}

static void test_quantize_matches_ggml(void) {
    check_golden(MOE_TYPE_Q4_0, golden_q4_0, sizeof golden_q4_0);
    check_golden(MOE_TYPE_Q4_1, golden_q4_1, sizeof golden_q4_1);
    check_golden(MOE_TYPE_Q5_0, golden_q5_0, sizeof golden_q5_0);
    check_golden(MOE_TYPE_Q5_1, golden_q5_1, sizeof golden_q5_1);
    check_golden(MOE_TYPE_Q8_0, golden_q8_0, sizeof golden_q8_0);
    check_golden(MOE_TYPE_Q8_1, golden_q8_1, sizeof golden_q8_1);
    check_golden(MOE_TYPE_IQ4_NL, golden_iq4_nl, sizeof golden_iq4_nl);
    check_golden(MOE_TYPE_MXFP4, golden_mxfp4, sizeof golden_mxfp4);
}

/* Kernels read blocks at any address (rows come from mmap). */
static void test_unaligned_blocks(void) {
    const moe_type types[] = {MOE_TYPE_F32,  MOE_TYPE_F16,  MOE_TYPE_BF16, MOE_TYPE_Q8_0,
                              MOE_TYPE_Q4_0, MOE_TYPE_Q4_1, MOE_TYPE_Q5_0, MOE_TYPE_Q5_1,
                              MOE_TYPE_Q8_1, MOE_TYPE_IQ4_NL, MOE_TYPE_MXFP4};
    float x[128], a[128], b[128];
    golden_input(x);
    unsigned char aligned[4 * 36 * 4 + 8], shifted[4 * 36 * 4 + 8];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const size_t bytes = quant_row_bytes(types[t], 128);
        quantize(types[t], x, aligned, 128);
        quantize(types[t], x, shifted + 1, 128);
        CHECK(memcmp(aligned, shifted + 1, bytes) == 0);
        dequantize(types[t], aligned, a, 128);
        dequantize(types[t], shifted + 1, b, 128);
        CHECKF(memcmp(a, b, sizeof a) == 0, "%s", quant_format_of(types[t])->name);
    }
}

/* A corrupt row (NaN, infinities, huge and tiny values) quantizes without
 * crashing or undefined behaviour, and blocks stay independent: a clean
 * block next to a corrupt one comes out as it does on its own. */
static void test_quantize_survives_bad_values(void) {
    const moe_type types[] = {MOE_TYPE_F16,  MOE_TYPE_BF16, MOE_TYPE_Q8_0, MOE_TYPE_Q8_1,
                              MOE_TYPE_Q4_0, MOE_TYPE_Q4_1, MOE_TYPE_Q5_0, MOE_TYPE_Q5_1,
                              MOE_TYPE_IQ4_NL, MOE_TYPE_MXFP4};
    float x[128], clean[32], a[64], b[32]; /* golden_input fills 128 */
    golden_input(x);
    memcpy(clean, x + 32, sizeof clean);
    const float bad[6] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e-40f};
    for (int j = 0; j < 32; j++) x[j] = bad[j % 6];
    unsigned char q[64 * 2], q_clean[32 * 2]; /* F16 and BF16 are the largest */
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        quantize(types[t], x, q, 64);
        dequantize(types[t], q, a, 64);
        quantize(types[t], clean, q_clean, 32);
        dequantize(types[t], q_clean, b, 32);
        CHECKF(memcmp(a + 32, b, sizeof b) == 0, "%s", quant_format_of(types[t])->name);
    }
}

int main(void) {
    RUN(test_float_rows);
    RUN(test_q8_0_dequantize);
    RUN(test_q8_1_dequantize);
    RUN(test_q8_quantize_by_hand);
    RUN(test_q4_0_dequantize);
    RUN(test_q4_1_dequantize);
    RUN(test_q4_0_quantize_by_hand);
    RUN(test_q4_1_quantize_by_hand);
    RUN(test_q5_0_dequantize);
    RUN(test_q5_1_dequantize);
    RUN(test_q5_0_quantize_by_hand);
    RUN(test_q5_1_quantize_by_hand);
    RUN(test_iq4_nl_dequantize);
    RUN(test_iq4_nl_quantize_exact_block);
    RUN(test_iq4_nl_quantize_zero_block);
    RUN(test_mxfp4_dequantize);
    RUN(test_mxfp4_quantize_by_hand);
    RUN(test_quantize_matches_ggml);
    RUN(test_unaligned_blocks);
    RUN(test_quantize_survives_bad_values);
    return test_summary();
}
