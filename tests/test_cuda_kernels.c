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
 *    sum |w_i x_i| (float64, dequantized). Shapes of one batch a lane
 *    also with their rows streamed through shared memory (the output
 *    head's way), several tiles a block.
 *  - the routed experts by id (gate|up with SwiGLU, then down with the
 *    weighted combine into a residual), mixed types: h against the CPU
 *    (relative L2 1e-5), y - y0 against the CPU's down products of the
 *    GPU's own h (tolerance as above); given the ids, or routing
 *    themselves from router logits (softmax or sigmoid, up to 256
 *    experts) against the CPU's top-k.
 *  - the prefill's dequantization to plain rows, every type, f32 and bf16,
 *    picked experts of a slab and rows of more than one 2048-element chunk:
 *    against the CPU's dequantize, within 1e-6 of the row's largest value
 *    (the GPU may fuse a multiply-add the CPU rounds twice) plus, for
 *    bf16, half a bf16 unit in the last place (2^-8 relative).
 *  - the prefill's attention (biases, q/k norm per head or whole, RoPE of
 *    both pairings with frequency factors and linear scaling, GQA up to 16
 *    query heads per KV head, the chunk's k and v into the cache, causal
 *    attention across several 64-position tiles) against float64 on the
 *    host: relative L2 1e-5 per token; cache rows before the chunk
 *    untouched, after it never written.
 *  - the decode step's attention (one token; its cache split over 1 to 32
 *    blocks per KV head and merged, 1 to 16 warps a query head) against
 *    the same float64 attention, to the same limits.
 *  - the top logits sampling on the device reads, against a full sort.
 *  - a kernel's staging of its input (RMSNorm or none, then Q8_K or Q8_0)
 *    against the CPU's rmsnorm and quantizer: the same codes, scales and
 *    sums bit for bit, on inputs with planted ties of magnitude (the first
 *    sets the sign), all-zero blocks and a block of tiny values.
 *
 * The worst ratio seen per type is printed, so a drift shows before it
 * fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#ifdef MOE_HAVE_CUDA
#include "cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"
#include "quant/block.h"
#include "quant/k_quant.h"
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

static void check_gemv(moe_type type, int rows, int cols, bool stream) {
    float *deq, *x = xmalloc(sizeof(float) * cols), *y = xmalloc(sizeof(float) * rows), *ref = xmalloc(sizeof(float) * rows);
    uint8_t *w = random_matrix(type, rows, cols, 1.0f / sqrtf((float)cols), &deq);
    for (int i = 0; i < cols; i++) x[i] = gauss();
    moe_error err = {0};
    moe_status st = cuda_test_gemv(type, rows, cols, w, x, y, stream, &err);
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
        CHECKF(bad == 0, "%s %dx%d%s: %d of %d rows off", quant_format_of(type)->name, rows, cols,
               stream ? " streamed" : "", bad, rows);
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
         * 30B-A3B shapes), and 8192 (more than one batch of units a row for
         * every type: the activation read per batch, not kept in registers);
         * row counts odd, tiny and large */
        const int shapes[][2] = {{1, unit}, {37, 3 * unit}, {200, 8 * unit}, {515, 2048}, {64, 768}, {2053, 512},
                                 {41, 8192}};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (shapes[s][1] % unit) continue;
            check_gemv(type, shapes[s][0], shapes[s][1], false);
            /* the output head's way, where the shape takes it */
            if (cuda_test_gemv_streams(type, shapes[s][1])) check_gemv(type, shapes[s][0], shapes[s][1], true);
        }
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

/* How check_experts gives the kernels their experts. */
enum { GIVEN_IDS, ROUTE_SOFTMAX, ROUTE_SIGMOID };

/* The CPU's routing (cpu_route, renormalised) of logits the caller keeps. */
static void route_on_cpu(const float *logits, int n_experts, int k, bool sigmoid, int32_t *ids, float *weights) {
    float *p = xmalloc(sizeof(float) * n_experts);
    memcpy(p, logits, sizeof(float) * n_experts);
    cpu_route(p, n_experts, k, sigmoid, true, 1.0f, ids, weights);
    free(p);
}

static void check_experts_with(moe_type type, moe_type down_type, int n_experts, int k, int n_ff, int n_embd,
                               int routing, int lanes_shift) {
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
    float *part = xmalloc(sizeof(float) * n_embd), *logits = NULL;
    if (routing == GIVEN_IDS) {
        for (int j = 0; j < k; j++) {
            ids[j] = (int32_t)((j * 7 + 3) % n_experts); /* distinct, not in order */
            weights[j] = 0.1f + (float)uniform();
        }
    } else {
        logits = xmalloc(sizeof(float) * n_experts);
        for (int e = 0; e < n_experts; e++) logits[e] = 2.0f * gauss();
        route_on_cpu(logits, n_experts, k, routing == ROUTE_SIGMOID, ids, weights);
    }
    for (int i = 0; i < n_embd; i++) x[i] = gauss(), y0[i] = gauss();
    moe_error err = {0};
    const cuda_test_expert_io io = {type, down_type, n_experts, k, n_ff, n_embd, gate, up, down, ids, weights, logits,
                                    routing == ROUTE_SIGMOID, lanes_shift, x, y0, h, y};
    moe_status st = cuda_test_experts(&io, &err);
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
        static const char *how[] = {"given ids", "softmax routing", "sigmoid routing"};
        printf("  experts %s/%s k=%d of %d, %s, lanes >> %d: h rel L2 %.3g, y worst ratio %.3g\n", tn, dn, k,
               n_experts, how[routing], lanes_shift, e, worst_ratio);
        free(want), free(mag);
    }
    free(gd), free(ud), free(dd), free(gate), free(up), free(down), free(x), free(y0), free(y), free(h), free(href);
    free(g), free(u), free(part), free(logits);
}

static void check_experts(moe_type type, moe_type down_type, int n_experts, int k, int n_ff, int n_embd, int routing) {
    check_experts_with(type, down_type, n_experts, k, n_ff, n_embd, routing, 0);
}

static void test_experts_by_id(void) {
    check_experts(MOE_TYPE_Q4_K, MOE_TYPE_Q4_K, 16, 8, 768, 512, GIVEN_IDS);
    check_experts(MOE_TYPE_Q4_K, MOE_TYPE_Q6_K, 16, 4, 512, 256, GIVEN_IDS);
    check_experts(MOE_TYPE_Q8_0, MOE_TYPE_Q8_0, 8, 2, 96, 128, GIVEN_IDS);
    check_experts(MOE_TYPE_Q5_0, MOE_TYPE_Q8_0, 8, 2, 64, 128, GIVEN_IDS);
    check_experts(MOE_TYPE_F32, MOE_TYPE_BF16, 8, 3, 64, 96, GIVEN_IDS);
    check_experts(MOE_TYPE_Q4_K, MOE_TYPE_Q4_K, 128, 8, 256, 256, ROUTE_SOFTMAX);
    check_experts(MOE_TYPE_Q8_0, MOE_TYPE_Q8_0, 60, 4, 64, 128, ROUTE_SOFTMAX);
    check_experts(MOE_TYPE_Q8_0, MOE_TYPE_Q8_0, 256, 32, 64, 64, ROUTE_SIGMOID);
    check_experts(MOE_TYPE_F32, MOE_TYPE_F32, 3, 3, 32, 64, ROUTE_SIGMOID);
    /* the lanes `moe lab` also times: half and a quarter of the decode's */
    check_experts_with(MOE_TYPE_Q4_K, MOE_TYPE_Q4_K, 16, 8, 512, 512, GIVEN_IDS, 1);
    check_experts_with(MOE_TYPE_Q4_K, MOE_TYPE_Q4_K, 16, 8, 512, 512, ROUTE_SOFTMAX, 2);
}

static double worst_dq[MOE_TYPE_COUNT], worst_dq16[MOE_TYPE_COUNT];

static void check_dequant(moe_type type, int n_experts, int rows, int cols, const int32_t *picks, int n_pick) {
    float *deq;
    uint8_t *w = random_matrix(type, n_experts * rows, cols, 1.0f, &deq);
    const size_t n = (size_t)n_pick * rows * cols;
    float *got = xmalloc(n * sizeof(float));
    uint16_t *got16 = xmalloc(n * sizeof(uint16_t));
    moe_error err = {0};
    moe_status st = cuda_test_dequant(type, n_experts, rows, cols, w, picks, n_pick, false, got, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    if (st == MOE_OK) st = cuda_test_dequant(type, n_experts, rows, cols, w, picks, n_pick, true, got16, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    int bad = 0;
    for (int i = 0; i < n_pick && st == MOE_OK; i++)
        for (int r = 0; r < rows; r++) {
            const float *want = deq + ((size_t)(picks ? picks[i] : i) * rows + r) * cols;
            const size_t at = ((size_t)i * rows + r) * cols;
            double row_max = 0;
            for (int c = 0; c < cols; c++)
                row_max = fmax(row_max, fabs(want[c]));
            for (int c = 0; c < cols; c++) {
                const double tol = 1e-6 * row_max, tol16 = ldexp(fabs(want[c]), -8) + tol;
                const double e = fabs((double)got[at + c] - want[c]),
                             e16 = fabs((double)bf16_to_f32(got16[at + c]) - want[c]);
                worst_dq[type] = fmax(worst_dq[type], row_max > 0 ? e / row_max : e);
                worst_dq16[type] = fmax(worst_dq16[type], want[c] != 0 ? e16 / fabs(want[c]) : e16);
                if ((!(e <= tol) || !(e16 <= tol16)) && bad++ < 3)
                    fprintf(stderr, "  dequant %s: matrix %d row %d col %d: cpu %.9g gpu %.9g bf16 %.9g\n",
                            quant_format_of(type)->name, i, r, c, want[c], got[at + c], bf16_to_f32(got16[at + c]));
            }
        }
    CHECKF(bad == 0, "dequant %s %dx%d: %d values off", quant_format_of(type)->name, rows, cols, bad);
    free(w), free(deq), free(got), free(got16);
}

static void test_dequant_every_type(void) {
    for (size_t t = 0; t < sizeof gpu_types / sizeof gpu_types[0]; t++) {
        const int unit = quant_format_of(gpu_types[t])->block_size >= 256 ? 256 : 32;
        const int32_t picks[] = {3, 0, 2};
        check_dequant(gpu_types[t], 1, 3, unit, NULL, 1);
        check_dequant(gpu_types[t], 1, 5, 2048 + 2 * unit, NULL, 1); /* a chunk and a part */
        check_dequant(gpu_types[t], 4, 7, 2 * unit, picks, 3);
        printf("  dequant %-7s worst |gpu - cpu| / row max %.3g; bf16: / |cpu| %.3g\n", quant_format_of(gpu_types[t])->name,
               worst_dq[gpu_types[t]], worst_dq16[gpu_types[t]]);
    }
}

/* SwiGLU in the experts' products from the codes (expert_codes.cuh): h =
 * silu(g) * u against the same kernel's own g | u (f32) for gate w and
 * another up matrix, rounded to bf16 as the prefill's swiglu_kernel. */
static void check_expert_swiglu(moe_type type, int experts, int rows, int cols, const uint8_t *w, const uint16_t *x,
                                int tokens, const int *tiles, int n_tiles) {
    float *up_deq;
    uint8_t *up = random_matrix(type, experts * rows, cols, 1.0f / sqrtf((float)cols), &up_deq);
    float *gu = xmalloc((size_t)tokens * 2 * rows * sizeof(float));
    uint16_t *h = xmalloc((size_t)tokens * rows * sizeof(uint16_t));
    moe_error err = {0};
    moe_status st = cuda_test_expert_gemm(type, experts, rows, cols, w, up, x, tokens, tiles, n_tiles, CUDA_TEST_EG_F32, gu, &err);
    if (st == MOE_OK)
        st = cuda_test_expert_gemm(type, experts, rows, cols, w, up, x, tokens, tiles, n_tiles, CUDA_TEST_EG_SWIGLU, h, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    int bad = 0;
    for (int t = 0; t < tokens && st == MOE_OK; t++)
        for (int r = 0; r < rows; r++) {
            const float g = gu[(size_t)t * 2 * rows + r], u = gu[(size_t)t * 2 * rows + rows + r];
            const float want = g / (1.0f + expf(-g)) * u, have = bf16_to_f32(h[(size_t)t * rows + r]);
            if (!(fabsf(have - want) <= 0x1p-8f * fabsf(want) + 1e-30f) && bad++ < 3)
                fprintf(stderr, "  expert swiglu %s: token %d row %d: want %.7g got %.7g\n", quant_format_of(type)->name, t, r,
                        want, have);
        }
    CHECKF(bad == 0, "expert swiglu %s %dx%d: %d values off", quant_format_of(type)->name, rows, cols, bad);
    printf("  expert gemm %-7s %d x %d, SwiGLU: %d of %d values off\n", quant_format_of(type)->name, rows, cols, bad,
           tokens * rows);
    free(up), free(up_deq), free(gu), free(h);
}

/* The fused expert GEMM of every type against the CPU's dequantized
 * weights: two experts' tokens in tiles of 64 and a part (the first expert's
 * rows past the last full tile), rows not a multiple of the kernel's 64,
 * columns in several steps; both halves of the pair, f32 and bf16 out. */
static void check_expert_gemm(moe_type type, int rows, int cols) {
    enum { EXPERTS = 3, TOKENS = 150 };
    float *deq;
    uint8_t *w = random_matrix(type, EXPERTS * rows, cols, 1.0f / sqrtf((float)cols), &deq);
    uint16_t *x = xmalloc((size_t)TOKENS * cols * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)TOKENS * cols; i++) {
        const float v = gauss();
        uint32_t bits;
        memcpy(&bits, &v, 4);
        x[i] = (uint16_t)(bits >> 16); /* any bf16 will do: the reference takes the same value */
    }
    const int tiles[] = {2, 0, 64, 2, 64, 6, 0, 70, 64, 0, 134, 16}; /* expert 2: rows 0-69, expert 0: 70-149 */
    const size_t n = (size_t)TOKENS * 2 * rows;
    float *got = xmalloc(n * sizeof(float));
    uint16_t *got16 = xmalloc(n * sizeof(uint16_t));
    moe_error err = {0};
    moe_status st = cuda_test_expert_gemm(type, EXPERTS, rows, cols, w, w, x, TOKENS, tiles, 4, CUDA_TEST_EG_F32, got, &err);
    if (st == MOE_OK)
        st = cuda_test_expert_gemm(type, EXPERTS, rows, cols, w, w, x, TOKENS, tiles, 4, CUDA_TEST_EG_BF16, got16, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    int bad = 0;
    double worst_eg = 0;
    for (int t = 0; t < TOKENS && st == MOE_OK; t++) {
        const float *we = deq + (size_t)(t < 70 ? 2 : 0) * rows * cols;
        for (int r = 0; r < 2 * rows; r++) {
            double want = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                const double p = (double)we[(size_t)(r % rows) * cols + c] * bf16_to_f32(x[(size_t)t * cols + c]);
                want += p, mag += fabs(p);
            }
            const size_t at = (size_t)t * 2 * rows + r;
            const double e = fabs(got[at] - want) / mag, e16 = fabs(bf16_to_f32(got16[at]) - want) / mag;
            worst_eg = fmax(worst_eg, e);
            /* the weights rounded to bf16: 2^-9 of each product at most */
            if ((!(e <= 4e-3) || !(e16 <= 8e-3)) && bad++ < 3)
                fprintf(stderr, "  expert gemm %s: token %d row %d: cpu %.7g gpu %.7g bf16 %.7g\n",
                        quant_format_of(type)->name, t, r, want, got[at], bf16_to_f32(got16[at]));
        }
    }
    CHECKF(bad == 0, "expert gemm %s %dx%d: %d values off", quant_format_of(type)->name, rows, cols, bad);
    if (st == MOE_OK && cuda_test_expert_codes(type)) check_expert_swiglu(type, EXPERTS, rows, cols, w, x, TOKENS, tiles, 4);
    const char *codes = getenv("MOE_CUDA_EXPERT_CODES");
    printf("  expert gemm %-7s %d x %d%s%s: worst |gpu - cpu| / sum |w x| %.3g\n", quant_format_of(type)->name, rows, cols,
           codes ? ", codes " : "", codes ? codes : "", worst_eg);
    free(w), free(deq), free(x), free(got), free(got16);
}

static void test_expert_gemm_every_type(void) {
    for (size_t t = 0; t < sizeof gpu_types / sizeof gpu_types[0]; t++)
        check_expert_gemm(gpu_types[t], 96, quant_format_of(gpu_types[t])->block_size >= 256 ? 512 : 320);
    /* the kernel from the codes (expert_codes.cuh): two tiles of its 128
     * rows, the second part empty, and 4 steps, so that its stage buffers
     * are reused; then its weights computed in bf16 pairs */
    CHECKF(cuda_test_expert_codes(MOE_TYPE_Q4_K) && cuda_test_expert_codes(MOE_TYPE_Q5_K) &&
               cuda_test_expert_codes(MOE_TYPE_Q6_K),
           "Q4_K, Q5_K and Q6_K experts not from their codes");
    for (size_t t = 0; t < sizeof gpu_types / sizeof gpu_types[0]; t++)
        if (cuda_test_expert_codes(gpu_types[t])) check_expert_gemm(gpu_types[t], 200, 1024);
    setenv("MOE_CUDA_EXPERT_CODES", "bf16", 1);
    for (size_t t = 0; t < sizeof gpu_types / sizeof gpu_types[0]; t++)
        if (cuda_test_expert_codes(gpu_types[t])) check_expert_gemm(gpu_types[t], 200, 1024);
    unsetenv("MOE_CUDA_EXPERT_CODES");
}

typedef struct attn_case {
    int T, pos, n_heads, n_kv, hd, n_rot;
    bool neox, bias, freqs;
    qk_norm_kind qk_norm;
    float freq_scale;
} attn_case;

static float *gauss_array(size_t n, float mean, float sigma) {
    float *v = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = mean + sigma * gauss();
    return v;
}

static void rms_double(double *x, int n, const float *w) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double scale = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++)
        x[i] *= scale * w[i];
}

static void rope_double(double *head, int n_rot, int pos, const float *freqs, float freq_scale, bool neox) {
    for (int i = 0; i < n_rot / 2; i++) {
        double freq = pow(10000.0, -2.0 * i / n_rot) / (freqs ? freqs[i] : 1.0);
        double angle = pos * (double)freq_scale * freq, c = cos(angle), s = sin(angle);
        const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        const double x0 = head[a], x1 = head[b];
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

/* The chunk's rotated q (T x q_dim) and the cache after it, in float64. */
static void attention_inputs_double(const cuda_test_attention *a, const float *k_in, const float *v_in, double *q,
                                    double *kc, double *vc) {
    const int hd = a->head_dim, q_dim = a->n_heads * hd, kv_dim = a->n_kv_heads * hd, stride = q_dim + 2 * kv_dim;
    for (size_t i = 0; i < (size_t)a->pos * kv_dim; i++)
        kc[i] = k_in[i], vc[i] = v_in[i];
    for (int t = 0; t < a->n_tokens; t++) {
        const float *row = a->qkv + (size_t)t * stride;
        double *qt = q + (size_t)t * q_dim, *k = kc + (size_t)(a->pos + t) * kv_dim,
               *v = vc + (size_t)(a->pos + t) * kv_dim;
        for (int i = 0; i < q_dim; i++)
            qt[i] = row[i] + (a->bq ? a->bq[i] : 0.0);
        for (int i = 0; i < kv_dim; i++) {
            k[i] = row[q_dim + i] + (a->bk ? a->bk[i] : 0.0);
            v[i] = row[q_dim + kv_dim + i] + (a->bv ? a->bv[i] : 0.0);
        }
        if (a->qk_norm == QK_NORM_FULL) {
            rms_double(qt, q_dim, a->q_norm);
            rms_double(k, kv_dim, a->k_norm);
        }
        for (int h = 0; h < a->n_heads + a->n_kv_heads; h++) {
            double *head = h < a->n_heads ? qt + h * hd : k + (h - a->n_heads) * hd;
            if (a->qk_norm == QK_NORM_PER_HEAD) rms_double(head, hd, h < a->n_heads ? a->q_norm : a->k_norm);
            rope_double(head, a->n_rot, a->pos + t, a->rope_freqs, a->freq_scale, a->neox);
        }
    }
}

/* Causal softmax attention of token t, head h over the float64 cache. */
static void attend_double(const cuda_test_attention *a, const double *q, const double *kc, const double *vc, int t,
                          int h, double *out) {
    const int hd = a->head_dim, kv_dim = a->n_kv_heads * hd, g = h / (a->n_heads / a->n_kv_heads),
              n_pos = a->pos + t + 1;
    double *p = xmalloc((size_t)n_pos * sizeof(double)), max = -INFINITY, sum = 0;
    for (int j = 0; j < n_pos; j++) {
        double dot = 0;
        for (int i = 0; i < hd; i++)
            dot += q[(size_t)t * a->n_heads * hd + h * hd + i] * kc[(size_t)j * kv_dim + g * hd + i];
        p[j] = dot / sqrt((double)hd);
        max = fmax(max, p[j]);
    }
    for (int j = 0; j < n_pos; j++)
        sum += p[j] = exp(p[j] - max);
    for (int i = 0; i < hd; i++) {
        double o = 0;
        for (int j = 0; j < n_pos; j++)
            o += p[j] * vc[(size_t)j * kv_dim + g * hd + i];
        out[i] = o / sum;
    }
    free(p);
}

static double rel_l2_double(const float *got, const double *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - want[i];
        num += d * d, den += want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* The attention's output with an f16 cache: now and then the GPU's float
 * key rounds to the f16 neighbour of float64's (a 2^-11 step). */
#define F16_CACHE_TOL 1e-4

static double f16_round(double x) { return block_fp16_to_f32(block_f32_to_fp16((float)x)); }

/* One layer's attention on the GPU against float64: the prefill's
 * (n_splits 0) or, for one token, the decode step's over n_splits blocks
 * per KV head. tol: the output's relative L2 bound (bf16 operands on
 * tensor cores take 1e-2). With an f16 cache (kv_f16) the cached rows are
 * f16 values, the new rows must be within f16's rounding of float64's,
 * and the output is held to float64's attention over the rounded rows. */
static void check_attention(const attn_case *k, int n_splits, const char *way, double tol, bool kv_f16) {
    const int hd = k->hd, q_dim = k->n_heads * hd, kv_dim = k->n_kv * hd, n_ctx = k->pos + k->T + 5;
    const size_t cache_n = (size_t)n_ctx * kv_dim;
    const bool full = k->qk_norm == QK_NORM_FULL;
    cuda_test_attention a = {.n_tokens = k->T,
                             .pos = k->pos,
                             .n_ctx = n_ctx,
                             .n_heads = k->n_heads,
                             .n_kv_heads = k->n_kv,
                             .head_dim = hd,
                             .n_rot = k->n_rot,
                             .neox = k->neox,
                             .qk_norm = k->qk_norm,
                             .eps = 1e-6f,
                             .rope_base = 10000.0f,
                             .freq_scale = k->freq_scale,
                             .kv_f16 = kv_f16};
    float *freqs = k->freqs ? gauss_array((size_t)k->n_rot / 2, 2.0f, 0.5f) : NULL;
    float *qn = k->qk_norm ? gauss_array(full ? q_dim : hd, 1.0f, 0.2f) : NULL;
    float *kn = k->qk_norm ? gauss_array(full ? kv_dim : hd, 1.0f, 0.2f) : NULL;
    float *bq = k->bias ? gauss_array(q_dim, 0.0f, 0.5f) : NULL, *bk = k->bias ? gauss_array(kv_dim, 0.0f, 0.5f) : NULL;
    float *bv = k->bias ? gauss_array(kv_dim, 0.0f, 0.5f) : NULL;
    float *qkv = gauss_array((size_t)k->T * (q_dim + 2 * kv_dim), 0.0f, 1.0f);
    float *k_in = gauss_array(cache_n, 0.0f, 1.0f), *v_in = gauss_array(cache_n, 0.0f, 1.0f);
    for (size_t i = 0; kv_f16 && i < cache_n; i++) k_in[i] = (float)f16_round(k_in[i]), v_in[i] = (float)f16_round(v_in[i]);
    float *k_gpu = xmalloc(cache_n * sizeof(float)), *v_gpu = xmalloc(cache_n * sizeof(float));
    float *out = xmalloc((size_t)k->T * q_dim * sizeof(float));
    memcpy(k_gpu, k_in, cache_n * sizeof(float));
    memcpy(v_gpu, v_in, cache_n * sizeof(float));
    a.rope_freqs = freqs, a.q_norm = qn, a.k_norm = kn, a.bq = bq, a.bk = bk, a.bv = bv, a.qkv = qkv;
    char label[128];
    snprintf(label, sizeof label, "T=%d pos=%d heads %d/%d hd %d rot %d%s%s qk_norm %d splits %d%s%s", k->T, k->pos,
             k->n_heads, k->n_kv, hd, k->n_rot, k->neox ? " neox" : "", k->bias ? " bias" : "", (int)k->qk_norm,
             n_splits, way, kv_f16 ? " f16" : "");
    moe_error err = {0};
    moe_status st = n_splits ? cuda_test_decode_attention(&a, n_splits, k_gpu, v_gpu, out, &err)
                             : cuda_test_prefill_attention(&a, k_gpu, v_gpu, out, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    if (st == MOE_OK) {
        double *q = xmalloc((size_t)k->T * q_dim * sizeof(double)), *want = xmalloc((size_t)hd * sizeof(double));
        double *kc = xmalloc(cache_n * sizeof(double)), *vc = xmalloc(cache_n * sizeof(double));
        attention_inputs_double(&a, k_in, v_in, q, kc, vc);
        const size_t before = (size_t)k->pos * kv_dim, chunk = (size_t)k->T * kv_dim;
        CHECKF(memcmp(k_gpu, k_in, before * sizeof(float)) == 0 && memcmp(v_gpu, v_in, before * sizeof(float)) == 0,
               "%s: cache rows before the chunk changed", label);
        double ek = rel_l2_double(k_gpu + before, kc + before, chunk),
               ev = rel_l2_double(v_gpu + before, vc + before, chunk);
        const double cache_tol = kv_f16 ? 1e-3 : 1e-5; /* f16: 2^-11 relative at most an element */
        CHECKF(ek <= cache_tol && ev <= cache_tol, "%s: new cache rows: k rel L2 %.3g, v %.3g", label, ek, ev);
        for (size_t i = before; kv_f16 && i < before + chunk; i++) kc[i] = f16_round(kc[i]), vc[i] = f16_round(vc[i]);
        bool untouched = true;
        for (size_t i = before + chunk; i < cache_n; i++)
            untouched &= isnan(k_gpu[i]) && isnan(v_gpu[i]);
        CHECKF(untouched, "%s: cache rows after the chunk were written", label);
        double worst_out = 0;
        for (int t = 0; t < k->T; t++) {
            double *ref = xmalloc((size_t)q_dim * sizeof(double));
            for (int h = 0; h < k->n_heads; h++) {
                attend_double(&a, q, kc, vc, t, h, want);
                memcpy(ref + h * hd, want, (size_t)hd * sizeof(double));
            }
            double e = rel_l2_double(out + (size_t)t * q_dim, ref, q_dim);
            if (!(e <= worst_out)) worst_out = e;
            free(ref);
        }
        CHECKF(worst_out <= tol, "%s: attention output rel L2 %.3g", label, worst_out);
        printf("  %s attention %-62s worst rel L2 %.3g (cache k %.2g v %.2g)\n",
               n_splits ? "decode" : tol >= 1e-2 ? "prefill (mma)" : "prefill", label, worst_out, ek, ev);
        free(q), free(want), free(kc), free(vc);
    }
    free(freqs), free(qn), free(kn), free(bq), free(bk), free(bv), free(qkv), free(k_in), free(v_in);
    free(k_gpu), free(v_gpu), free(out);
}

static void test_prefill_attention(void) {
    const attn_case cases[] = {
        {70, 100, 8, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, /* Qwen3 */
        {33, 0, 4, 4, 64, 64, true, false, false, QK_NORM_FULL, 1.0f},         /* OLMoE */
        {17, 5, 14, 2, 64, 64, true, true, false, QK_NORM_NONE, 1.0f},         /* Qwen2: biases, G = 7 */
        {40, 31, 8, 2, 128, 128, false, false, true, QK_NORM_NONE, 0.25f},     /* Llama 3: factors, scaling */
        {3, 200, 16, 1, 256, 64, true, false, false, QK_NORM_PER_HEAD, 1.0f},  /* G = 16, hd 256, partial RoPE */
        {129, 0, 2, 2, 32, 32, false, false, false, QK_NORM_NONE, 1.0f},       /* hd 32, three tiles */
        {20, 9, 4, 2, 24, 24, true, false, false, QK_NORM_PER_HEAD, 1.0f},     /* hd 24: part of a warp */
        {12, 3, 8, 2, 8, 8, false, false, false, QK_NORM_NONE, 1.0f},         /* hd 8 */
    };
    /* on CUDA cores (MOE_CUDA_ATTN_MMA=0), then on tensor cores where the
     * heads are 64 or 128 wide (the default) */
    setenv("MOE_CUDA_ATTN_MMA", "0", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_attention(&cases[i], 0, "", 1e-5, false);
    setenv("MOE_CUDA_ATTN_MMA", "1", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_attention(&cases[i], 0, "", cases[i].hd == 64 || cases[i].hd == 128 ? 1e-2 : 1e-5, false);
    /* an f16 cache, both kernels */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_attention(&cases[i], 0, "", cases[i].hd == 64 || cases[i].hd == 128 ? 1e-2 : F16_CACHE_TOL, true);
    setenv("MOE_CUDA_ATTN_MMA", "0", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_attention(&cases[i], 0, "", F16_CACHE_TOL, true);
    unsetenv("MOE_CUDA_ATTN_MMA");
}

/* The decode step's attention all three ways (attention.cu): one token
 * after pos cached ones, split over 1 to 32 blocks per KV head or query
 * head (the merge), 1 to 16 warps a query head per head, 16 with head
 * blocks, 2 to 8 query heads a warp and 1 to 4 head groups a block grouped
 * (the fold of a block's warps), every lane width. */
static void test_decode_attention(void) {
    const struct {
        attn_case k;
        int n_splits;
    } cases[] = {
        {{1, 0, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 32},  /* Qwen3 (G = 8), the first token */
        {{1, 10, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 32},   /* 1 split per head, 3 grouped */
        {{1, 2040, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 32}, /* 32 splits to merge */
        {{1, 100, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 32},  /* 7 splits of 32 active */
        {{1, 50, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 4},    /* 4 short splits */
        {{1, 600, 4, 4, 64, 64, true, false, false, QK_NORM_FULL, 1.0f}, 8},          /* MHA, 3 splits active */
        {{1, 700, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 5},   /* 9 batches a warp, grouped 3 */
        {{1, 1500, 16, 2, 128, 128, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 2},  /* 47 batches a warp, grouped 12 */
        {{1, 130, 4, 4, 64, 64, true, false, false, QK_NORM_FULL, 1.0f}, 3},        /* OLMoE: MHA, per head only */
        {{1, 77, 14, 2, 64, 64, true, false, false, QK_NORM_NONE, 1.0f}, 7},        /* Qwen2: G = 7, per head only */
        {{1, 300, 8, 2, 128, 128, false, false, true, QK_NORM_NONE, 0.25f}, 16},    /* Llama 3 */
        {{1, 40, 8, 2, 128, 128, false, false, true, QK_NORM_NONE, 0.25f}, 2},      /* 2 splits */
        {{1, 200, 16, 1, 256, 64, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 9},  /* G = 16, hd 256: grouped 4 x 4 */
        {{1, 90, 2, 2, 32, 32, false, false, false, QK_NORM_NONE, 1.0f}, 2},        /* hd 32 */
        {{1, 45, 4, 2, 24, 24, true, false, false, QK_NORM_PER_HEAD, 1.0f}, 4},     /* hd 24: part of a warp */
        {{1, 60, 4, 2, 6, 6, false, false, false, QK_NORM_NONE, 1.0f}, 3},         /* hd 6: six lanes a head */
    };
    /* per head, head blocks wherever G > 1 (at every position: their merges too), grouped wherever the heads have
     * groups (a power of two above 1); the cache in f32, then in f16 */
    const struct {
        const char *until, *from, *name;
    } ways[] = {{"0", "2147483647", " per head"}, {"2147483647", "2147483647", " head blocks"}, {"0", "0", " grouped"}};
    for (int f16 = 0; f16 <= 1; f16++)
        for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
            setenv("MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL", ways[w].until, 1);
            setenv("MOE_CUDA_ATTN_GROUPED_FROM", ways[w].from, 1);
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                check_attention(&cases[i].k, cases[i].n_splits, ways[w].name, f16 ? F16_CACHE_TOL : 1e-5, f16);
        }
    unsetenv("MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL");
    unsetenv("MOE_CUDA_ATTN_GROUPED_FROM");
}

/* ---------------------------------------------------------------- top logits */

static int cmp_rank(const void *pa, const void *pb) {
    const sampler_candidate *a = pa, *b = pb;
    if (a->value != b->value) return a->value < b->value ? 1 : -1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Logits in steps of 1/4 (ties everywhere), every 7th -inf, some huge. */
static void tied_logits(float *l, int n) {
    for (int i = 0; i < n; i++) l[i] = roundf(gauss() * 12.0f) * 0.25f;
    for (int i = 3; i < n; i += 7) l[i] = -INFINITY;
    if (n > 10) l[n / 2] = 3e38f, l[n / 3] = -3e38f;
}

static void check_top(int n_vocab, int n, int n_extra) {
    float *l = xmalloc(sizeof(float) * n_vocab), extra_logits[64];
    sampler_candidate *ref = xmalloc(sizeof *ref * n_vocab), *top = xmalloc(sizeof *top * CUDA_TOP_MAX);
    int32_t extra[64];
    tied_logits(l, n_vocab);
    for (int i = 0; i < n_extra; i++) extra[i] = (int32_t)(uniform() * n_vocab);
    int finite = 0;
    for (int i = 0; i < n_vocab; i++)
        if (l[i] != -INFINITY) ref[finite++] = (sampler_candidate){i, l[i]};
    qsort(ref, (size_t)finite, sizeof *ref, cmp_rank);
    moe_error err = {0};
    int found = -1;
    moe_status st = cuda_test_top_logits(l, n_vocab, n, extra, n_extra, top, &found, extra_logits, &err);
    CHECKF(st == MOE_OK, "vocab %d, top %d: %s", n_vocab, n, err.message);
    const int expect = finite < n ? finite : n;
    CHECKF(found == expect, "vocab %d, top %d: %d found, %d expected", n_vocab, n, found, expect);
    int bad = 0;
    for (int i = 0; st == MOE_OK && i < expect && i < found; i++) bad += top[i].id != ref[i].id || top[i].value != ref[i].value;
    for (int i = 0; st == MOE_OK && i < n_extra; i++) bad += memcmp(&extra_logits[i], &l[extra[i]], sizeof(float)) != 0;
    CHECKF(bad == 0, "vocab %d, top %d: %d wrong", n_vocab, n, bad);
    free(l), free(ref), free(top);
}

/* The GPU's top logits (cuda_top_logits, what sampling on the device
 * reads) against a full sort by the sampler's ranking: same ids, same
 * values, same order; -0 and +0 one value; the extra ids' logits bit for
 * bit; a NaN or +inf logit reported by its lowest id; nothing finite,
 * nothing found. */
static void test_top_logits(void) {
    const int cases[][3] = {{1, 1, 0}, {7, 40, 3}, {1000, 1, 0}, {1000, 104, 64}, {4099, 512, 10},
                            {151936, 40, 0}, {151936, 104, 64}, {151936, 1, 5}, {262144, 300, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_top(cases[i][0], cases[i][1], cases[i][2]);
    enum { N = 5000 };
    static float l[N];
    sampler_candidate top[8];
    int found = -1;
    moe_error err = {0};
    for (int i = 0; i < N; i++) l[i] = i % 3 ? 0.0f : -0.0f; /* one value to the sampler: the lowest ids win */
    CHECK(cuda_test_top_logits(l, N, 8, NULL, 0, top, &found, NULL, &err) == MOE_OK && found == 8);
    for (int i = 0; i < 8; i++) CHECKF(top[i].id == i, "signed zeros: place %d holds token %d", i, top[i].id);
    for (int i = 0; i < N; i++) l[i] = -INFINITY;
    CHECK(cuda_test_top_logits(l, N, 8, NULL, 0, top, &found, NULL, &err) == MOE_OK && found == 0);
    l[4321] = NAN, l[777] = INFINITY, l[10] = 1.0f;
    CHECK(cuda_test_top_logits(l, N, 8, NULL, 0, top, &found, NULL, &err) == MOE_ERR_FORMAT);
    CHECKF(strstr(err.message, "token 777") != NULL, "%s", err.message);
    CHECK(cuda_test_top_logits(l, N, CUDA_TOP_MAX + 1, NULL, 0, top, &found, NULL, &err) == MOE_ERR_UNSUPPORTED);
}

/* n values of x with the cases planted that decide a block's scale: in
 * block 0 the largest magnitude twice, negative first; in block 1 the same,
 * positive first; block 2 all zeros; block 3 one value; block 4 tiny
 * values (1e-30: the reciprocal scale stays finite). Blocks of `per`. */
static void plant_stage_cases(float *x, int n, int per) {
    for (int i = 0; i < n; i++) x[i] = gauss();
    x[3] = -9.0f, x[per - 5] = 9.0f;
    x[per + 7] = 9.5f, x[per + 9] = -9.5f;
    for (int i = 0; i < per; i++) x[2 * per + i] = 0.0f, x[3 * per + i] = 0.0f, x[4 * per + i] *= 1e-30f;
    x[3 * per + per / 2] = -0.25f;
}

/* The staging against the dot type's quantizer of x and, with a norm, its
 * RMS scale: of cpu_rmsnorm(x) with full_norm (ffn_up's), else of x times
 * the norm's weights (the products', as cpu_forward's norm_rows), the
 * scale cpu_rms_scale's. */
static void check_stage(moe_type dot, int n, int with_norm, bool full_norm) {
    const int per = dot == MOE_TYPE_Q8_K ? QK_K : 32;
    float *x = xmalloc(sizeof(float) * n), *norm = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    float *scales = xmalloc(sizeof(float) * (n / per));
    int8_t *codes = xmalloc((size_t)n);
    int16_t *sums = xmalloc(sizeof(int16_t) * (n / 16));
    uint8_t *ref = xmalloc(quant_row_bytes(dot, n));
    plant_stage_cases(x, n, per);
    for (int i = 0; i < n; i++) norm[i] = 1.0f + 0.25f * gauss();
    norm[3] = norm[per - 5], norm[per + 7] = norm[per + 9]; /* the planted ties survive the norm */
    if (with_norm && full_norm) cpu_rmsnorm(y, x, norm, n, 1e-6f);
    else
        for (int i = 0; i < n; i++) y[i] = with_norm ? x[i] * norm[i] : x[i];
    quant_format_of(dot)->quantize(y, ref, n);
    const float want_scale = with_norm && !full_norm ? cpu_rms_scale(x, n, 1e-6f) : 1.0f;
    moe_error err = {0};
    float got_scale = 0.0f;
    moe_status st =
        cuda_test_stage(dot, x, with_norm ? norm : NULL, 1e-6f, n, full_norm, codes, scales, sums, &got_scale, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    CHECKF(st != MOE_OK || memcmp(&got_scale, &want_scale, sizeof got_scale) == 0,
           "%s, %d values%s: norm scale gpu %.9g cpu %.9g", quant_format_of(dot)->name, n,
           full_norm ? " fully normalised" : "", got_scale, want_scale);
    int bad = 0;
    for (int b = 0; st == MOE_OK && b < n / per && !bad; b++) {
        const int8_t *qs;
        float d;
        if (dot == MOE_TYPE_Q8_K) {
            const block_q8_k *blk = (const block_q8_k *)ref + b;
            qs = blk->qs, d = block_bits_to_f32(block_load_u32(blk->d));
            for (int j = 0; j < QK_K / 16; j++) bad |= (int16_t)block_load_u16(blk->bsums + 2 * j) != sums[b * 16 + j];
        } else {
            const block_q8_0 *blk = (const block_q8_0 *)ref + b;
            qs = blk->qs, d = block_fp16_to_f32(block_load_u16(blk->d));
        }
        bad |= memcmp(qs, codes + b * per, (size_t)per) != 0 || memcmp(&d, &scales[b], sizeof d) != 0;
        CHECKF(!bad, "%s, %d values%s%s: block %d differs (scale gpu %.9g cpu %.9g)", quant_format_of(dot)->name, n,
               with_norm ? " with a norm" : "", full_norm ? " fully normalised" : "", b, scales[b], d);
    }
    free(x), free(norm), free(y), free(scales), free(codes), free(sums), free(ref);
}

static void test_stage_exact(void) {
    const moe_type dots[] = {MOE_TYPE_Q8_K, MOE_TYPE_Q8_0};
    const int lengths[] = {2048, 6144}; /* one chunk a warp, and two for some warps */
    for (int t = 0; t < 2; t++)
        for (int l = 0; l < 2; l++)
            for (int with_norm = 0; with_norm < 2; with_norm++)
                for (int full_norm = 0; full_norm < 2; full_norm++)
                    check_stage(dots[t], lengths[l], with_norm, full_norm);
}

/* moe lab's staging probe: a block's time is positive and the last block's
 * no shorter than the median; sizes the staging cannot take are refused. */
static void test_lab_staging(void) {
    moe_error err = {0};
    cuda_lab_stage g;
    moe_status st = cuda_lab_staging(MOE_TYPE_Q8_K, CUDA_LAB_STAGE_PRODUCTS, 2048, 1, &g, &err);
    CHECKF(st == MOE_OK, "%s", err.message);
    CHECKF(st != MOE_OK || (g.cold_us > 0 && g.cold_last_us >= g.cold_us && g.hot_us > 0 && g.hot_last_us >= g.hot_us),
           "cold %.3f (last %.3f), hot %.3f (last %.3f)", g.cold_us, g.cold_last_us, g.hot_us, g.hot_last_us);
    CHECK(cuda_lab_staging(MOE_TYPE_Q8_K, CUDA_LAB_STAGE_NORMED, 2000, 1, &g, &err) == MOE_ERR_RANGE);
    CHECKF(strstr(err.message, "q8_k") != NULL, "%s", err.message);
    CHECK(cuda_lab_staging(MOE_TYPE_Q4_K, CUDA_LAB_STAGE_PLAIN, 2048, 1, &g, &err) == MOE_ERR_RANGE);
    CHECK(cuda_lab_staging(MOE_TYPE_F32, CUDA_LAB_STAGE_WAYS, 2048, 1, &g, &err) == MOE_ERR_RANGE);
}

/* The expert kernels' division by a multiply-high, at and around every
 * multiple of d up to the bound t * d < 2^32 it promises, and at random t. */
static void test_div_magic(void) {
    uint64_t state = 0x9e3779b97f4a7c15ull;
    int bad = 0;
    for (int d = 1; d <= 1 << 16 && !bad; d += d < 512 ? 1 : d / 64) {
        const uint64_t limit = ((uint64_t)1 << 32) / (uint64_t)d; /* t < limit: t * d < 2^32 */
        const uint64_t t_max = limit < ((uint64_t)1 << 31) ? limit : ((uint64_t)1 << 31);
        for (uint64_t q = 0; q * d < t_max && !bad; q += 1 + q / 8) {
            const int64_t around[3] = {(int64_t)(q * d) - 1, (int64_t)(q * d), (int64_t)(q * d) + d - 1};
            for (int i = 0; i < 3; i++) {
                const int64_t t = around[i];
                if (t < 0 || (uint64_t)t >= t_max) continue;
                if (cuda_test_div_magic((int)t, d) != (int)(t / d)) bad = 1;
                CHECKF(!bad, "%lld / %d gave %d", (long long)t, d, cuda_test_div_magic((int)t, d));
            }
        }
        for (int i = 0; i < 64 && !bad; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const int t = (int)((state >> 33) % t_max);
            if (cuda_test_div_magic(t, d) != t / d) bad = 1;
            CHECKF(!bad, "%d / %d gave %d", t, d, cuda_test_div_magic(t, d));
        }
    }
}

int main(void) {
    if (!cuda_available()) {
        printf("skipped: no CUDA GPU\n");
        return 77;
    }
    RUN(test_gemv_every_type);
    RUN(test_experts_by_id);
    RUN(test_dequant_every_type);
    RUN(test_expert_gemm_every_type);
    RUN(test_prefill_attention);
    RUN(test_decode_attention);
    RUN(test_top_logits);
    RUN(test_div_magic);
    RUN(test_stage_exact);
    RUN(test_lab_staging);
    return test_summary();
}

#else
int main(void) {
    printf("skipped: this build has no CUDA backend\n");
    return 77;
}
#endif
