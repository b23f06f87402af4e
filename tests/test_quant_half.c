/*
 * test_quant_half.c — fp16 and bf16 conversions, exhaustively over all
 * 65536 bit patterns of each, against values computed here from the
 * formats' definitions:
 *
 *   fp16: sign, 5-bit exponent e (bias 15), 10-bit mantissa m:
 *         e = 0: m * 2^-24; e = 31: inf (m = 0) or NaN; else (1024 + m) * 2^(e-25)
 *   bf16: the top 16 bits of a binary32.
 *
 * Rounding to nearest even is checked at every midpoint between adjacent
 * representable values and one float ulp either side of it. NaNs stay NaN
 * with their sign (fp16 NaN -> f32 keeps the payload and comes out quiet;
 * f32 NaN -> fp16 is the quiet NaN 0x7e00, as GGML converts).
 */
#include <float.h>
#include <stdint.h>

#include "quant/quant.h"
#include "test.h"

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float float_of(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static bool fp16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

/* The value of a non-NaN fp16 pattern, from the definition. */
static double fp16_value(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0) return sign * ldexp(m, -24);
    if (e == 31) return sign * INFINITY;
    return sign * ldexp(1024 + m, e - 25);
}

static void test_fp16_to_f32_every_pattern(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fp16_to_f32((uint16_t)h);
        if (fp16_is_nan((uint16_t)h)) {
            /* NaN, same sign, payload in the top mantissa bits, quiet bit set */
            const uint32_t b = bits_of(f);
            bad += !isnan(f) || (b >> 31) != (h >> 15) || ((b >> 13) & 0x3ff) != ((h & 0x3ff) | 0x200);
        } else {
            const float want = (float)fp16_value((uint16_t)h);
            bad += bits_of(f) != bits_of(want); /* also tells -0 from +0 */
        }
    }
    CHECKF(bad == 0, "%d patterns convert wrong", bad);
}

static void test_fp16_round_trip_every_pattern(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t back = f32_to_fp16(fp16_to_f32((uint16_t)h));
        const uint16_t want = fp16_is_nan((uint16_t)h) ? (uint16_t)((h & 0x8000) | 0x7e00) : (uint16_t)h;
        if (back != want && bad++ < 5) fprintf(stderr, "  %04x -> %04x\n", h, back);
    }
    CHECKF(bad == 0, "%d patterns do not round-trip", bad);
}

/* Between each pair of adjacent finite fp16 values (both signs): the exact
 * midpoint goes to the one with an even mantissa, a float ulp off it goes
 * to the nearer one. The top pair is 65504 and 65536 (infinity). */
static void test_fp16_rounds_to_nearest_even(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
            const uint16_t lo = (uint16_t)(sign | h), hi = (uint16_t)(sign | (h + 1));
            const double hi_value = h + 1 == 0x7c00 ? (sign ? -65536.0 : 65536.0) : fp16_value(hi);
            const float mid = (float)((fp16_value(lo) + hi_value) / 2); /* exact: 12 bits */
            const uint16_t even = (h & 1) ? hi : lo;
            bad += f32_to_fp16(mid) != even;
            bad += f32_to_fp16(nextafterf(mid, 0.0f)) != lo;
            bad += f32_to_fp16(nextafterf(mid, sign ? -INFINITY : INFINITY)) != hi;
        }
    }
    CHECKF(bad == 0, "%d roundings wrong", bad);
}

static void test_fp16_special_values(void) {
    CHECK(f32_to_fp16(INFINITY) == 0x7c00);
    CHECK(f32_to_fp16(-INFINITY) == 0xfc00);
    CHECK(f32_to_fp16(1e10f) == 0x7c00);
    CHECK(f32_to_fp16(-FLT_MAX) == 0xfc00);
    CHECK(f32_to_fp16(65504.0f) == 0x7bff);
    CHECK(f32_to_fp16(65519.996f) == 0x7bff);
    CHECK(f32_to_fp16(65520.0f) == 0x7c00);
    CHECK(f32_to_fp16(0.0f) == 0x0000);
    CHECK(f32_to_fp16(-0.0f) == 0x8000);
    CHECK(f32_to_fp16(1e-10f) == 0x0000);
    CHECK(f32_to_fp16(-1e-10f) == 0x8000);
    CHECK(f32_to_fp16(FLT_TRUE_MIN) == 0x0000);
    CHECK(f32_to_fp16(0x1p-24f) == 0x0001);
    CHECK(f32_to_fp16(0x1p-25f) == 0x0000);             /* tie, to even */
    CHECK(f32_to_fp16(0x1.000002p-25f) == 0x0001);
    CHECK(f32_to_fp16(0x1p-14f) == 0x0400);             /* smallest normal */
    CHECK(f32_to_fp16(0x1.ffcp-15f) == 0x0400);         /* tie between 0x03ff and it */
    CHECK(f32_to_fp16(1.0f) == 0x3c00);
    CHECK(f32_to_fp16(-2.0f) == 0xc000);
    CHECK(f32_to_fp16(NAN) == 0x7e00);
    CHECK(f32_to_fp16(-NAN) == 0xfe00);
    CHECK(f32_to_fp16(float_of(0x7f800001)) == 0x7e00); /* signalling, payload below fp16's */
    CHECK(isinf(fp16_to_f32(0x7c00)) && fp16_to_f32(0x7c00) > 0);
    CHECK(isinf(fp16_to_f32(0xfc00)) && fp16_to_f32(0xfc00) < 0);
    CHECK(isnan(fp16_to_f32(0x7c01)));
    CHECK(fp16_to_f32(0x0001) == 0x1p-24f);
    CHECK(fp16_to_f32(0x7bff) == 65504.0f);
}

static void test_bf16_to_f32_every_pattern(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) bad += bits_of(bf16_to_f32((uint16_t)h)) != h << 16;
    CHECKF(bad == 0, "%d patterns convert wrong", bad);
}

static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* Round trip of every pattern; NaN comes back NaN with its sign and the
 * quiet bit set. Then every midpoint between adjacent values, including the
 * subnormals and the step from the largest finite value to infinity. */
static void test_bf16_round_trip_and_ties(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t back = f32_to_bf16(bf16_to_f32((uint16_t)h));
        bad += back != (bf16_is_nan((uint16_t)h) ? (h | 0x40) : h);
        if ((h & 0x7fff) >= 0x7f80) continue; /* no finite successor */
        const uint32_t mid = h << 16 | 0x8000;
        const uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
        bad += f32_to_bf16(float_of(mid)) != even;
        bad += f32_to_bf16(float_of(mid - 1)) != h;
        bad += f32_to_bf16(float_of(mid + 1)) != h + 1;
    }
    CHECKF(bad == 0, "%d conversions wrong", bad);
}

static void test_bf16_special_values(void) {
    CHECK(f32_to_bf16(FLT_MAX) == 0x7f80); /* beyond the largest bf16 + half an ulp */
    CHECK(f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(f32_to_bf16(-0.0f) == 0x8000);
    CHECK(f32_to_bf16(FLT_TRUE_MIN) == 0x0000); /* subnormals are rounded, not flushed */
    CHECK(f32_to_bf16(float_of(0x00018000)) == 0x0002);
    CHECK(f32_to_bf16(float_of(0x7f800001)) == 0x7fc0); /* NaN, not infinity */
    CHECK(f32_to_bf16(float_of(0xff800001)) == 0xffc0);
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
}

int main(void) {
    RUN(test_fp16_to_f32_every_pattern);
    RUN(test_fp16_round_trip_every_pattern);
    RUN(test_fp16_rounds_to_nearest_even);
    RUN(test_fp16_special_values);
    RUN(test_bf16_to_f32_every_pattern);
    RUN(test_bf16_round_trip_and_ties);
    RUN(test_bf16_special_values);
    return test_summary();
}
