/*
 * quant_data.h — deterministic test data for the quantization tests.
 *
 * A fixed-seed xorshift64* generator, so every run (and every machine) sees
 * the same rows, and the two distributions the error bounds are measured
 * on: Gaussian N(0, 1) and Student-t with 3 degrees of freedom, whose heavy
 * tails (infinite kurtosis) stand in for the outliers of real weight rows.
 * Also the relative RMSE every accuracy bound is stated in.
 */
#ifndef MOE_TEST_QUANT_DATA_H
#define MOE_TEST_QUANT_DATA_H

#include <math.h>
#include <stdint.h>

typedef struct test_rng {
    uint64_t state;
} test_rng;

static inline uint64_t test_rng_next(test_rng *r) {
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return r->state * 0x2545F4914F6CDD1Dull;
}

/* Uniform in (0, 1): 53 random bits, never exactly 0. */
static inline double test_rng_uniform(test_rng *r) {
    return ((double)(test_rng_next(r) >> 11) + 0.5) * 0x1p-53;
}

/* Standard normal by Box-Muller (one value per call, the other discarded). */
static inline double test_rng_gauss(test_rng *r) {
    const double u = test_rng_uniform(r), v = test_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Student-t, 3 degrees of freedom: z / sqrt(chi2_3 / 3). */
static inline double test_rng_student3(test_rng *r) {
    const double z = test_rng_gauss(r);
    double chi2 = 0.0;
    for (int k = 0; k < 3; k++) {
        const double g = test_rng_gauss(r);
        chi2 += g * g;
    }
    return z / sqrt(chi2 / 3.0);
}

typedef enum test_dist { TEST_DIST_GAUSS, TEST_DIST_STUDENT3 } test_dist;

static inline void test_fill(float *x, int64_t n, test_dist dist, uint64_t seed) {
    test_rng r = {seed};
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(dist == TEST_DIST_GAUSS ? test_rng_gauss(&r) : test_rng_student3(&r));
}

/* ||x - y|| / ||x||, accumulated in double. */
static inline double test_relative_rmse(const float *x, const float *y, int64_t n) {
    double err = 0.0, ref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)x[i] - y[i];
        err += d * d;
        ref += (double)x[i] * x[i];
    }
    return sqrt(err / ref);
}

#endif
