/*
 * test_quant_accuracy.c — how much each format loses, and whether its dot
 * product computes what its blocks mean.
 *
 * Round-trip error: relative RMSE ||x - deq(q(x))|| / ||x|| over 65536
 * fixed-seed values (quant_data.h), Gaussian and Student-t with 3 degrees
 * of freedom. Bounds are the measured value times about 1.15, rounded up;
 * tests/QUANT_ERROR_BOUNDS.md carries the same table.
 *
 *   format   gaussian   student-t   bound (gaussian / student-t)
 *   f32      0          0           0 / 0 (exact)
 *   f16      0.000206   0.000204    0.00024 / 0.00024
 *   bf16     0.001667   0.001636    0.00195 / 0.0019
 *   q8_0     0.005329   0.008669    0.0062 / 0.0100
 *   q8_1     0.005329   0.008669    0.0062 / 0.0100
 *   q4_0     0.085372   0.128734    0.099 / 0.149
 *   q4_1     0.078112   0.101219    0.090 / 0.117
 *   q5_0     0.042371   0.067401    0.049 / 0.078
 *   q5_1     0.037704   0.048968    0.044 / 0.057
 *   iq4_nl   0.075809   0.103014    0.088 / 0.119
 *   mxfp4    0.114684   0.140672    0.132 / 0.162
 *
 * IQ4_NL's scale search must also beat the plain choice d = max / -127
 * (nearest codebook entries) by at least 3% on Gaussian data (measured:
 * 0.0758 against 0.0798, 5%).
 *
 * Dot products, against a float64 reference:
 *   kernel:  dot(q(w), q_a(x)) against sum deq(w) * deq_a(q_a(x)). Only
 *            float rounding separates them: each product and partial sum
 *            rounds once, so the tolerance is (terms + 3) * FLT_EPSILON *
 *            sum |deq(w) * deq_a(x)|, terms being blocks (integer kernels,
 *            exact within a block) or elements / 8 (float formats, 8
 *            lanes), counted over one chunk of 4096 at most since
 *            quant_dot_f32 adds chunks in double. Q4_1 and Q5_1 also use the activations' fp16 s =
 *            d * sum(q) for their minimum: + 2^-10 * sum_blocks |m| |sum a|.
 *   end to end: quant_dot_f32(q(w), x) against sum deq(w) * x, which adds
 *            the activations' own rounding: per element uniform in
 *            +-d_a / 2 (d_a = amax / 127 of its block), independent, so
 *            its standard deviation is sigma = sqrt(sum deq(w)^2 d_a^2 / 12);
 *            the tolerance is the kernel's plus 6 sigma plus the scale's
 *            fp16 rounding, 2^-11 * sum_blocks |sum deq(w) x|. A wrong
 *            nibble or a dropped block costs about |dot| ~ sqrt(n), far
 *            above 6 sigma (about 0.04 sqrt(n) for Gaussian rows).
 */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include "quant/quant.h"
#include "quant_data.h"
#include "test.h"

enum { N_ROUND_TRIP = 65536 };

typedef struct rmse_case {
    moe_type type;
    double bound[2]; /* gaussian, student-t */
} rmse_case;

static const rmse_case rmse_cases[] = {
    {MOE_TYPE_F32, {0.0, 0.0}},          {MOE_TYPE_F16, {0.00024, 0.00024}},
    {MOE_TYPE_BF16, {0.00195, 0.0019}},  {MOE_TYPE_Q8_0, {0.0062, 0.0100}},
    {MOE_TYPE_Q8_1, {0.0062, 0.0100}},   {MOE_TYPE_Q4_0, {0.099, 0.149}},
    {MOE_TYPE_Q4_1, {0.090, 0.117}},     {MOE_TYPE_Q5_0, {0.049, 0.078}},
    {MOE_TYPE_Q5_1, {0.044, 0.057}},     {MOE_TYPE_IQ4_NL, {0.088, 0.119}},
    {MOE_TYPE_MXFP4, {0.132, 0.162}},
};

static const uint64_t seeds[2] = {0x5eed0002u, 0x5eed0003u};

static double round_trip_rmse(moe_type type, const float *x, int64_t n) {
    const quant_format *f = quant_format_of(type);
    unsigned char *q = malloc(quant_row_bytes(type, n));
    float *y = malloc((size_t)n * sizeof *y);
    f->quantize(x, q, n);
    f->dequantize(q, y, n);
    const double rmse = test_relative_rmse(x, y, n);
    free(q);
    free(y);
    return rmse;
}

static void test_round_trip_error(void) {
    float *x = malloc(N_ROUND_TRIP * sizeof *x);
    for (int dist = 0; dist < 2; dist++) {
        test_fill(x, N_ROUND_TRIP, (test_dist)dist, seeds[dist]);
        for (size_t c = 0; c < sizeof rmse_cases / sizeof rmse_cases[0]; c++) {
            const double rmse = round_trip_rmse(rmse_cases[c].type, x, N_ROUND_TRIP);
            printf("  %-7s %-9s rmse %.6f (bound %.5f)\n", quant_format_of(rmse_cases[c].type)->name,
                   dist ? "student-t" : "gaussian", rmse, rmse_cases[c].bound[dist]);
            CHECKF(rmse <= rmse_cases[c].bound[dist], "%s: %.6f", quant_format_of(rmse_cases[c].type)->name,
                   rmse);
        }
    }
    free(x);
}

static const int8_t iq4nl_codebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

/* IQ4_NL with the scale fixed at max / -127 (fp16) and nearest entries. */
static void iq4_nl_plain(const float *x, float *y, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[b + j]) > amax) amax = fabsf(x[b + j]), max = x[b + j];
        const float d = fp16_to_f32(f32_to_fp16(max / -127.0f));
        for (int j = 0; j < 32; j++) {
            float best = iq4nl_codebook[0] * d;
            for (int k = 1; k < 16; k++) {
                const float v = iq4nl_codebook[k] * d;
                if (fabsf(v - x[b + j]) < fabsf(best - x[b + j])) best = v;
            }
            y[b + j] = best;
        }
    }
}

static void test_iq4_nl_search_beats_plain_scale(void) {
    float *x = malloc(N_ROUND_TRIP * sizeof *x), *y = malloc(N_ROUND_TRIP * sizeof *y);
    test_fill(x, N_ROUND_TRIP, TEST_DIST_GAUSS, seeds[0]);
    iq4_nl_plain(x, y, N_ROUND_TRIP);
    const double plain = test_relative_rmse(x, y, N_ROUND_TRIP);
    const double searched = round_trip_rmse(MOE_TYPE_IQ4_NL, x, N_ROUND_TRIP);
    CHECKF(searched <= 0.97 * plain, "searched %.6f, plain %.6f", searched, plain);
    free(x);
    free(y);
}

/* ------------------------------------------------------------ dot products */

/* One row of weights, quantized and dequantized, and float activations. */
typedef struct dot_case {
    const quant_format *w, *a;
    int64_t n;
    unsigned char *wq;
    float *wd, *x;
} dot_case;

static dot_case dot_case_make(moe_type type, int64_t n, test_dist wdist, test_dist xdist) {
    dot_case c = {.w = quant_format_of(type), .n = n};
    c.a = quant_format_of(c.w->dot_type);
    c.wq = malloc(quant_row_bytes(type, n));
    c.wd = malloc((size_t)n * sizeof(float));
    c.x = malloc((size_t)n * sizeof(float));
    test_fill(c.wd, n, wdist, 0xd07u + (uint64_t)type);
    test_fill(c.x, n, xdist, 0xac7u + (uint64_t)type);
    c.w->quantize(c.wd, c.wq, n);
    c.w->dequantize(c.wq, c.wd, n);
    return c;
}

static void dot_case_free(dot_case *c) {
    free(c->wq);
    free(c->wd);
    free(c->x);
}

/* The fp16 minimum m of block b of a Q4_1 / Q5_1 row (bytes 2..3). */
static float block_min(const dot_case *c, int64_t b) {
    const unsigned char *p = c->wq + b * (int64_t)c->w->block_bytes;
    return fp16_to_f32((uint16_t)(p[2] | p[3] << 8));
}

/* Float rounding allowed between a dot kernel and the exact sum of
 * deq(w) * act over the row (see the top of the file). quant_dot_f32 adds
 * chunks of at most DOT_CHUNK elements in double (quant.c), so rounding
 * accumulates over one chunk at most. */
enum { DOT_CHUNK = 4096 };

static double kernel_tolerance(const dot_case *c, const float *act) {
    const double chunk = (double)(c->n < DOT_CHUNK ? c->n : DOT_CHUNK);
    const double terms = c->w->block_size == 1 ? chunk / 8 : chunk / c->w->block_size;
    const int64_t bs = c->a->block_size;
    double abs_sum = 0.0, min_term = 0.0;
    for (int64_t b = 0; b < c->n / bs; b++) {
        double act_sum = 0.0;
        for (int64_t j = b * bs; j < (b + 1) * bs; j++) {
            abs_sum += fabs((double)c->wd[j] * act[j]);
            act_sum += act[j];
        }
        if (c->a->type == MOE_TYPE_Q8_1)
            min_term += fabs((double)block_min(c, b)) * (fabs(act_sum) * 0x1p-10 + 0x1p-24);
    }
    return (terms + 3) * FLT_EPSILON * abs_sum + min_term;
}

static double reference_dot(const float *w, const float *x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)w[i] * x[i];
    return sum;
}

/* The activations' rounding: 6 sigma of the sum of independent uniform
 * errors plus the fp16 scale's rounding (see the top of the file). */
static double activation_tolerance(const dot_case *c) {
    if (c->a->type == MOE_TYPE_F32) return 0.0;
    const int64_t bs = c->a->block_size;
    double variance = 0.0, scale_term = 0.0;
    for (int64_t b = 0; b < c->n / bs; b++) {
        double amax = 0.0, w2 = 0.0, block_dot = 0.0;
        for (int64_t j = b * bs; j < (b + 1) * bs; j++) {
            amax = fmax(amax, fabs(c->x[j]));
            w2 += (double)c->wd[j] * c->wd[j];
            block_dot += (double)c->wd[j] * c->x[j];
        }
        const double d = amax / 127.0;
        variance += w2 * d * d / 12.0;
        scale_term += fabs(block_dot) * 0x1p-11;
    }
    return 6.0 * sqrt(variance) + scale_term;
}

/* The kernel on quantized activations against the exact dot product of
 * what both rows dequantize to; then quant_dot_f32 on one chunk, which
 * must be that same kernel call. */
static void check_kernel(moe_type type, int64_t n) {
    dot_case c = dot_case_make(type, n, TEST_DIST_STUDENT3, TEST_DIST_GAUSS);
    float *act = malloc((size_t)n * sizeof *act);
    void *aq = c.x;
    if (c.a->type != MOE_TYPE_F32) {
        aq = malloc(quant_row_bytes(c.a->type, n));
        c.a->quantize(c.x, aq, n);
        c.a->dequantize(aq, act, n);
    } else {
        memcpy(act, c.x, (size_t)n * sizeof *act);
    }
    const float got = c.w->dot(c.wq, aq, n);
    const double want = reference_dot(c.wd, act, n), tol = kernel_tolerance(&c, act);
    CHECKF(fabs(got - want) <= tol, "%s n=%lld: %.9g vs %.9g (tol %.3g)", c.w->name, (long long)n, got, want,
           tol);
    CHECKF(quant_dot_f32(type, c.wq, c.x, n) == got, "%s n=%lld", c.w->name, (long long)n);
    if (aq != c.x) free(aq);
    free(act);
    dot_case_free(&c);
}

static const moe_type own_formats[] = {MOE_TYPE_F32,  MOE_TYPE_F16,  MOE_TYPE_BF16, MOE_TYPE_Q8_0,
                                       MOE_TYPE_Q8_1, MOE_TYPE_Q4_0, MOE_TYPE_Q4_1, MOE_TYPE_Q5_0,
                                       MOE_TYPE_Q5_1, MOE_TYPE_IQ4_NL, MOE_TYPE_MXFP4};
enum { N_OWN = sizeof own_formats / sizeof own_formats[0] };

static void test_dot_kernels(void) {
    for (int t = 0; t < N_OWN; t++) {
        check_kernel(own_formats[t], 32);
        check_kernel(own_formats[t], 4096);
    }
    /* Float rows need not be a multiple of the 8 lanes. */
    const moe_type float_formats[] = {MOE_TYPE_F32, MOE_TYPE_F16, MOE_TYPE_BF16};
    for (int t = 0; t < 3; t++) {
        check_kernel(float_formats[t], 7);
        check_kernel(float_formats[t], 4093);
    }
}

static void check_end_to_end(moe_type type, int64_t n, test_dist wdist, test_dist xdist) {
    dot_case c = dot_case_make(type, n, wdist, xdist);
    const double got = quant_dot_f32(type, c.wq, c.x, n);
    const double want = reference_dot(c.wd, c.x, n);
    const double tol = kernel_tolerance(&c, c.x) + activation_tolerance(&c);
    CHECKF(fabs(got - want) <= tol, "%s n=%lld: %.9g vs %.9g (tol %.3g)", c.w->name, (long long)n, got, want,
           tol);
    dot_case_free(&c);
}

/* Rows of one block, one chunk, several chunks with a short last one, and
 * over a million elements; the K-quants ride along for quant_dot_f32's
 * 256-element blocks. */
static void test_dot_f32_end_to_end(void) {
    const int64_t lengths[] = {4096, 3 * 4096 + 5 * 256};
    for (int t = 0; t < N_OWN; t++) {
        check_end_to_end(own_formats[t], 32, TEST_DIST_GAUSS, TEST_DIST_GAUSS);
        for (int l = 0; l < 2; l++) {
            check_end_to_end(own_formats[t], lengths[l], TEST_DIST_GAUSS, TEST_DIST_STUDENT3);
            check_end_to_end(own_formats[t], lengths[l], TEST_DIST_STUDENT3, TEST_DIST_GAUSS);
        }
    }
    const moe_type k_quants[] = {MOE_TYPE_Q4_K, MOE_TYPE_Q5_K, MOE_TYPE_Q6_K};
    for (int t = 0; t < 3; t++) check_end_to_end(k_quants[t], lengths[1], TEST_DIST_GAUSS, TEST_DIST_GAUSS);
    check_end_to_end(MOE_TYPE_Q4_0, (1 << 20) + 96, TEST_DIST_GAUSS, TEST_DIST_GAUSS);
    check_end_to_end(MOE_TYPE_F16, (1 << 20) + 3, TEST_DIST_GAUSS, TEST_DIST_GAUSS);
}

int main(void) {
    RUN(test_round_trip_error);
    RUN(test_iq4_nl_search_beats_plain_scale);
    RUN(test_dot_kernels);
    RUN(test_dot_f32_end_to_end);
    return test_summary();
}
