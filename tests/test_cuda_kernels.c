/*
 * test_cuda_kernels.c — the CUDA backend's matrix kernels against the CPU's
 * dot products (src/quant), on fresh random inputs, every output poisoned
 * with NaN before the launch. Skipped (exit 77) without a GPU.
 *
 *  - gemv, every type the GPU runs, at row counts that leave partial warps
 *    and blocks and at row lengths of 1 to 16 blocks: each y[r] against the
 *    CPU's dot of row r with the activations quantized to the format's dot
 *    type (the GPU quantizes them the same way, so the integer sums agree
 *    and only the order of float additions differs). Tolerance 2e-5 of
 *    sum |w_i x_i| (float64, dequantized).
 *  - the routed experts by id (gate|up with SwiGLU, then down with the
 *    weighted combine into a residual), mixed types: h against the CPU
 *    (relative L2 1e-5), y - y0 against the CPU's down products of the
 *    GPU's own h (tolerance as above).
 *
 * The worst ratio seen per type is printed, so a drift shows before it
 * fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "test.h"

#ifdef MOE_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "quant/quant.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static float gauss(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* rows x cols random weights of `type` (GGUF layout); *deq gets them back as floats. */
static uint8_t *random_matrix(moe_type type, int rows, int cols, float sigma, float **deq) {
    const quant_format *f = quant_format_of(type);
    size_t row_bytes = quant_row_bytes(type, cols);
    uint8_t *w = xmalloc(row_bytes * rows);
    float *v = xmalloc(sizeof(float) * cols);
    *deq = xmalloc(sizeof(float) * (size_t)rows * cols);
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < cols; i++) v[i] = gauss() * sigma;
        f->quantize(v, w + r * row_bytes, cols);
        f->dequantize(w + r * row_bytes, *deq + (size_t)r * cols, cols);
    }
    free(v);
    return w;
}

/* The CPU's y = W x: x quantized to the format's dot type, then its dot. */
static void cpu_gemv(moe_type type, const uint8_t *w, int rows, int cols, const float *x, float *y) {
    const quant_format *f = quant_format_of(type), *a = quant_format_of(f->dot_type);
    uint8_t *xq = xmalloc(quant_row_bytes(a->type, cols));
    a->quantize(x, xq, cols);
    size_t row_bytes = quant_row_bytes(type, cols);
    for (int r = 0; r < rows; r++) y[r] = f->dot(w + r * row_bytes, xq, cols);
    free(xq);
}

static double magnitude(const float *deq_row, const float *x, int cols) {
    double m = 0;
    for (int i = 0; i < cols; i++) m += fabs((double)deq_row[i] * x[i]);
    return m;
}

#define TOL 2e-5

static double worst[MOE_TYPE_COUNT];

static void check_gemv(moe_type type, int rows, int cols) {
    float *deq, *x = xmalloc(sizeof(float) * cols), *y = xmalloc(sizeof(float) * rows), *ref = xmalloc(sizeof(float) * rows);
    uint8_t *w = random_matrix(type, rows, cols, 1.0f / sqrtf((float)cols), &deq);
    for (int i = 0; i < cols; i++) x[i] = gauss();
    moe_error err = {0};
    moe_status st = cuda_test_gemv(type, rows, cols, w, x, y, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    if (st == MOE_OK) {
        cpu_gemv(type, w, rows, cols, x, ref);
        int bad = 0;
        for (int r = 0; r < rows; r++) {
            double mag = magnitude(deq + (size_t)r * cols, x, cols), diff = fabs((double)y[r] - ref[r]);
            double ratio = mag > 0 ? diff / mag : diff;
            if (!(ratio <= TOL)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s %dx%d row %d: gpu %.9g cpu %.9g (|diff| / sum|wx| = %.3g)\n",
                            quant_format_of(type)->name, rows, cols, r, y[r], ref[r], ratio);
            } else if (ratio > worst[type]) {
                worst[type] = ratio;
            }
        }
        CHECKF(bad == 0, "%s %dx%d: %d of %d rows off", quant_format_of(type)->name, rows, cols, bad, rows);
    }
    free(deq), free(x), free(y), free(ref), free(w);
}

static const moe_type gpu_types[] = {MOE_TYPE_Q4_K, MOE_TYPE_Q5_K, MOE_TYPE_Q6_K, MOE_TYPE_Q8_0, MOE_TYPE_Q4_0,
                                     MOE_TYPE_Q5_0, MOE_TYPE_IQ4_NL, MOE_TYPE_F32, MOE_TYPE_F16, MOE_TYPE_BF16};

static void test_gemv_every_type(void) {
    for (size_t t = 0; t < sizeof gpu_types / sizeof gpu_types[0]; t++) {
        moe_type type = gpu_types[t];
        int block = (int)quant_format_of(type)->block_size;
        int unit = block >= 256 ? 256 : 32;
        /* row lengths of 1, 3 and 8 blocks of 256 (or 32), 2048 and 768 (the
         * 30B-A3B shapes); row counts odd, tiny and large */
        const int shapes[][2] = {{1, unit}, {37, 3 * unit}, {200, 8 * unit}, {515, 2048}, {64, 768}, {2053, 512}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            if (shapes[s][1] % unit == 0) check_gemv(type, shapes[s][0], shapes[s][1]);
        printf("  gemv %-7s worst |gpu - cpu| / sum|wx| = %.3g\n", quant_format_of(type)->name, worst[type]);
    }
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_experts(moe_type type, moe_type down_type, int n_experts, int k, int n_ff, int n_embd) {
    const char *tn = quant_format_of(type)->name, *dn = quant_format_of(down_type)->name;
    float *gd, *ud, *dd;
    size_t gate_bytes = quant_row_bytes(type, n_embd) * n_ff, down_bytes = quant_row_bytes(down_type, n_ff) * n_embd;
    uint8_t *gate = random_matrix(type, n_experts * n_ff, n_embd, 1.0f / sqrtf((float)n_embd), &gd);
    uint8_t *up = random_matrix(type, n_experts * n_ff, n_embd, 1.0f / sqrtf((float)n_embd), &ud);
    uint8_t *down = random_matrix(down_type, n_experts * n_embd, n_ff, 1.0f / sqrtf((float)n_ff), &dd);
    int32_t ids[32];
    float weights[32], *x = xmalloc(sizeof(float) * n_embd), *y0 = xmalloc(sizeof(float) * n_embd);
    float *y = xmalloc(sizeof(float) * n_embd), *h = xmalloc(sizeof(float) * k * n_ff);
    float *href = xmalloc(sizeof(float) * k * n_ff), *g = xmalloc(sizeof(float) * n_ff), *u = xmalloc(sizeof(float) * n_ff);
    float *part = xmalloc(sizeof(float) * n_embd);
    for (int j = 0; j < k; j++) {
        ids[j] = (int32_t)((j * 7 + 3) % n_experts); /* distinct, not in order */
        weights[j] = 0.1f + (float)uniform();
    }
    for (int i = 0; i < n_embd; i++) x[i] = gauss(), y0[i] = gauss();
    moe_error err = {0};
    moe_status st = cuda_test_experts(type, down_type, n_experts, k, n_ff, n_embd, gate, up, down, ids, weights, x, y0, h, y, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    if (st == MOE_OK) {
        for (int j = 0; j < k; j++) {
            cpu_gemv(type, gate + ids[j] * gate_bytes, n_ff, n_embd, x, g);
            cpu_gemv(type, up + ids[j] * gate_bytes, n_ff, n_embd, x, u);
            for (int r = 0; r < n_ff; r++) href[j * n_ff + r] = g[r] / (1.0f + expf(-g[r])) * u[r];
        }
        double e = rel_l2(h, href, (size_t)k * n_ff);
        CHECKF(e <= 1e-5, "experts %s/%s: h relative L2 error %.3g", tn, dn, e);
        /* down, on the GPU's own h: y = y0 + sum_j w_j D_j h_j */
        int bad = 0;
        double worst_ratio = 0;
        double *want = calloc(n_embd, sizeof(double)), *mag = calloc(n_embd, sizeof(double));
        for (int j = 0; j < k; j++) {
            cpu_gemv(down_type, down + ids[j] * down_bytes, n_embd, n_ff, h + j * n_ff, part);
            for (int r = 0; r < n_embd; r++) {
                want[r] += (double)weights[j] * part[r];
                mag[r] += weights[j] * magnitude(dd + ((size_t)ids[j] * n_embd + r) * n_ff, h + j * n_ff, n_ff);
            }
        }
        for (int r = 0; r < n_embd; r++) {
            double ratio = fabs(((double)y[r] - y0[r]) - want[r]) / (mag[r] > 0 ? mag[r] : 1);
            if (!(ratio <= TOL) && bad++ < 3)
                fprintf(stderr, "  experts %s/%s row %d: gpu %.9g cpu %.9g (ratio %.3g)\n", tn, dn, r, y[r] - y0[r], want[r], ratio);
            if (ratio > worst_ratio) worst_ratio = ratio;
        }
        CHECKF(bad == 0, "experts %s/%s: %d of %d rows of y off", tn, dn, bad, n_embd);
        printf("  experts %s/%s k=%d: h rel L2 %.3g, y worst ratio %.3g\n", tn, dn, k, e, worst_ratio);
        free(want), free(mag);
    }
    free(gd), free(ud), free(dd), free(gate), free(up), free(down), free(x), free(y0), free(y), free(h), free(href);
    free(g), free(u), free(part);
}

static void test_experts_by_id(void) {
    check_experts(MOE_TYPE_Q4_K, MOE_TYPE_Q4_K, 16, 8, 768, 512);
    check_experts(MOE_TYPE_Q4_K, MOE_TYPE_Q6_K, 16, 4, 512, 256);
    check_experts(MOE_TYPE_Q8_0, MOE_TYPE_Q8_0, 8, 2, 96, 128);
    check_experts(MOE_TYPE_Q5_0, MOE_TYPE_Q8_0, 8, 2, 64, 128);
    check_experts(MOE_TYPE_F32, MOE_TYPE_BF16, 8, 3, 64, 96);
}

int main(void) {
    if (!cuda_available()) {
        printf("skipped: no CUDA GPU\n");
        return 77;
    }
    RUN(test_gemv_every_type);
    RUN(test_experts_by_id);
    return test_summary();
}

#else
int main(void) {
    printf("skipped: this build has no CUDA backend\n");
    return 77;
}
#endif
