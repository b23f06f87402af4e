/*
 * test_cpu_ops.c — each operation of the CPU forward pass against a naive
 * float64 implementation written here from the definitions.
 */
#include <stdlib.h>

#include "cpu/cpu_ops.h"
#include "test.h"

static uint64_t rng = 88172645463325252ull;

static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (rng >> 11) * (1.0 / 9007199254740992.0);
}

static float gauss(void) { return (float)(sqrt(-2 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform())); }

static double max_rel_err(const float *got, const double *want, int n) {
    double worst = 0, scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]) / (scale > 0 ? scale : 1));
    return worst;
}

static void test_rmsnorm(void) {
    enum { N = 4096 };
    static float x[N], w[N], out[N];
    static double want[N];
    for (int i = 0; i < N; i++) x[i] = gauss() * 3, w[i] = gauss();
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < N; i++) want[i] = x[i] / sqrt(ss / N + 1e-6) * w[i];
    cpu_rmsnorm(out, x, w, N, 1e-6f);
    CHECKF(max_rel_err(out, want, N) < 1e-6, "%g", max_rel_err(out, want, N));
    cpu_rmsnorm(x, x, w, N, 1e-6f); /* in place */
    CHECK(max_rel_err(x, want, N) < 1e-6);
}

/* RoPE from its definition: dimension pair (a, b) of every head rotates by
 * pos * scale * base^(-2i/n_rot) / factor_i. */
static void rope_reference(double *x, int n_heads, int head_dim, int n_rot, int pos, double base, double scale,
                           const float *factors, rope_style style) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < n_rot / 2; i++) {
            double theta = pos * scale * pow(base, -2.0 * i / n_rot) / (factors ? factors[i] : 1.0);
            int a = style == ROPE_NEOX ? i : 2 * i, b = style == ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
            double *v = x + h * head_dim, x0 = v[a], x1 = v[b];
            v[a] = x0 * cos(theta) - x1 * sin(theta);
            v[b] = x0 * sin(theta) + x1 * cos(theta);
        }
}

static void check_rope(rope_style style, int n_rot, bool with_factors, float scale) {
    enum { HEADS = 4, DIM = 64 };
    float x[HEADS * DIM], factors[DIM / 2];
    double want[HEADS * DIM];
    for (int i = 0; i < DIM / 2; i++) factors[i] = 1.0f + (float)uniform() * 8;
    for (int pos = 0; pos < 5000; pos += 997) {
        for (int i = 0; i < HEADS * DIM; i++) want[i] = x[i] = gauss();
        cpu_rope(x, HEADS, DIM, n_rot, pos, 10000.0f, scale, with_factors ? factors : NULL, style);
        rope_reference(want, HEADS, DIM, n_rot, pos, 10000.0, scale, with_factors ? factors : NULL, style);
        double err = max_rel_err(x, want, HEADS * DIM);
        CHECKF(err < 1e-6, "style %d n_rot %d pos %d: %g", style, n_rot, pos, err);
    }
}

static void test_rope(void) {
    check_rope(ROPE_NORM, 64, false, 1.0f);
    check_rope(ROPE_NEOX, 64, false, 1.0f);
    check_rope(ROPE_NEOX, 32, false, 1.0f); /* partial rotation: the rest is untouched */
    check_rope(ROPE_NORM, 64, true, 0.25f);
    check_rope(ROPE_NEOX, 64, true, 1.0f);
}

static void test_softmax(void) {
    enum { N = 1000 };
    float x[N];
    double want[N], max = -1e300, sum = 0;
    for (int i = 0; i < N; i++) x[i] = gauss() * 20, max = fmax(max, x[i]);
    for (int i = 0; i < N; i++) sum += want[i] = exp(x[i] - max);
    for (int i = 0; i < N; i++) want[i] /= sum;
    cpu_softmax(x, N);
    CHECK(max_rel_err(x, want, N) < 1e-6);
}

static void test_swiglu(void) {
    enum { N = 777 };
    float g[N], u[N], out[N];
    double want[N];
    for (int i = 0; i < N; i++) {
        g[i] = gauss() * 4, u[i] = gauss();
        want[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
    }
    cpu_swiglu(out, g, u, N);
    CHECK(max_rel_err(out, want, N) < 1e-6);
}

static void test_top_k(void) {
    float x[128];
    int ids[8];
    for (int trial = 0; trial < 100; trial++) {
        for (int i = 0; i < 128; i++) x[i] = (float)(int)(gauss() * 4); /* many ties */
        cpu_top_k(x, 128, 8, ids);
        for (int j = 0; j < 8; j++) {
            int larger = 0, tied_before = 0; /* rank of ids[j] by (value desc, index asc) */
            for (int i = 0; i < 128; i++) {
                larger += x[i] > x[ids[j]];
                tied_before += x[i] == x[ids[j]] && i < ids[j];
            }
            CHECKF(larger + tied_before == j, "trial %d slot %d: id %d has rank %d", trial, j, ids[j], larger + tied_before);
        }
    }
}

int main(void) {
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_softmax);
    RUN(test_swiglu);
    RUN(test_top_k);
    return test_summary();
}
