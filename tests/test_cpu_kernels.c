/*
 * test_cpu_kernels.c — every dot kernel at every ISA level this CPU has,
 * against the portable kernel and against a float64 dot product of the
 * dequantized rows. A level the CPU lacks is reported as skipped.
 *
 * Rows, for every supported weight type: 1, 3 and 13 blocks (odd counts
 * reach the kernels' tails; for the float types, whose block is one
 * element, they are shorter than one vector), 4096, 4096 + 3 blocks and
 * 13824 elements, and the last two again at odd addresses. Weights are
 * Gaussian or Student-t (outliers), quantized with the format's quantizer;
 * activations are Gaussian, or +-1 so that every code is +-127 and the
 * kernels' int16 stages see their largest products; both are quantized to
 * the dot type. MXFP4 also gets rows whose block scales are float
 * subnormals. Each row has its own seed.
 *
 * Tolerance, relative to sum |w_i a_i| over the dequantized values: 1e-5.
 * Integer sums are exact in every kernel, so what differs is float
 * rounding: the order in which block sums are added, FMA against multiply
 * then add, and (K-quants) rounding partial int32 sums to float. The worst
 * ratios seen are printed per type and level. Measured on an AVX-512 Xeon:
 * at most 2.3e-7 (Q5_1, whose minimum's term cancels much of the codes'
 * term), 1.2e-7 or less for every other format, and the portable kernels
 * themselves within 5e-8 of float64; the tolerance leaves a margin of ~40.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_kernels_x86.h"
#include "quant_data.h"
#include "test.h"

#define REL_TOL 1e-5

enum { N_LENGTHS = 6, FIRST_MISALIGNED = 4 };

typedef enum act_kind { ACT_GAUSS, ACT_SIGNS } act_kind;

/* How a row's data is drawn: weights from w_dist times w_scale, activations
 * of a_kind times a_scale. */
typedef struct row_case {
    test_dist w_dist;
    double w_scale;
    act_kind a_kind;
    double a_scale;
    moe_type only; /* MOE_TYPE_COUNT: every type */
} row_case;

static const row_case cases[] = {
    {TEST_DIST_GAUSS, 1.0, ACT_GAUSS, 1.0, MOE_TYPE_COUNT},
    {TEST_DIST_STUDENT3, 1.0, ACT_GAUSS, 1.0, MOE_TYPE_COUNT},
    {TEST_DIST_GAUSS, 1.0, ACT_SIGNS, 1.0, MOE_TYPE_COUNT},
    /* MXFP4 blocks with E8M0 exponents 0 and 1, whose scales are float
     * subnormals; activations large enough (Q8_0 scales near fp16's top)
     * that the products stay normal floats. */
    {TEST_DIST_GAUSS, 0x1p-125, ACT_GAUSS, 0x1p19, MOE_TYPE_MXFP4},
};

/* One test row: quantized weights and activations (at w and a, possibly
 * odd addresses inside the buffers) and the float64 truth. */
typedef struct test_row {
    int64_t n;
    uint8_t *w_buf, *a_buf;
    const uint8_t *w, *a;
    double exact;     /* sum w_i a_i of the dequantized rows */
    double magnitude; /* sum |w_i a_i| */
} test_row;

/* Worst |kernel - portable| and |kernel - exact|, over magnitude. */
static double worst_vs_portable[CPU_ISA_COUNT][MOE_TYPE_COUNT];
static double worst_vs_exact[CPU_ISA_COUNT][MOE_TYPE_COUNT];

static void *checked_malloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void fill_activations(float *x, int64_t n, act_kind kind, uint64_t seed) {
    if (kind == ACT_GAUSS) {
        test_fill(x, n, TEST_DIST_GAUSS, seed);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = (i >> 4) & 1 ? -1.0f : 1.0f;
}

static double fp16_at(const uint8_t *p) { return fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Q4_1 and Q5_1 take their minimum's term as m * s, where Q8_1's s is
 * d * sum(q) rounded to fp16 when the activations are quantized (by design,
 * as in GGML). The truth uses that s too: it adds m * (s - sum of the
 * block's dequantized activations) per block. m is bytes 2..3 of both
 * weight blocks; s is bytes 2..3 of a Q8_1 block. */
static double q8_1_min_correction(const quant_format *fmt, const uint8_t *w, const uint8_t *a, const float *a_deq,
                                  int64_t n) {
    const size_t a_bytes = quant_format_of(MOE_TYPE_Q8_1)->block_bytes;
    double correction = 0.0;
    for (int64_t b = 0; b < n / 32; b++) {
        double sum = 0.0;
        for (int j = 0; j < 32; j++)
            sum += a_deq[32 * b + j];
        correction += fp16_at(w + b * fmt->block_bytes + 2) * (fp16_at(a + b * a_bytes + 2) - sum);
    }
    return correction;
}

static test_row make_row(const quant_format *fmt, int64_t n, const row_case *c, int misaligned, uint64_t seed) {
    const quant_format *dot = quant_format_of(fmt->dot_type);
    test_row row = {.n = n};
    float *w_f = checked_malloc((size_t)n * sizeof(float)), *a_f = checked_malloc((size_t)n * sizeof(float));
    float *w_deq = checked_malloc((size_t)n * sizeof(float)), *a_deq = checked_malloc((size_t)n * sizeof(float));
    row.w_buf = checked_malloc(quant_row_bytes(fmt->type, n) + 64);
    row.a_buf = checked_malloc(quant_row_bytes(dot->type, n) + 64);
    /* Float activations must stay float-aligned; quantized data may sit
     * anywhere. */
    row.w = row.w_buf + (misaligned ? 1 : 0);
    row.a = row.a_buf + (misaligned ? (dot->type == MOE_TYPE_F32 ? 4 : 3) : 0);

    test_fill(w_f, n, c->w_dist, seed);
    fill_activations(a_f, n, c->a_kind, seed ^ 0x9e3779b97f4a7c15ull);
    for (int64_t i = 0; i < n; i++) {
        w_f[i] = (float)(w_f[i] * c->w_scale);
        a_f[i] = (float)(a_f[i] * c->a_scale);
    }
    fmt->quantize(w_f, (void *)row.w, n);
    dot->quantize(a_f, (void *)row.a, n);
    fmt->dequantize(row.w, w_deq, n);
    dot->dequantize(row.a, a_deq, n);
    for (int64_t i = 0; i < n; i++) {
        row.exact += (double)w_deq[i] * a_deq[i];
        row.magnitude += fabs((double)w_deq[i] * a_deq[i]);
    }
    if (dot->type == MOE_TYPE_Q8_1 && fmt->type != MOE_TYPE_Q8_1)
        row.exact += q8_1_min_correction(fmt, row.w, row.a, a_deq, n);
    free(w_f);
    free(a_f);
    free(w_deq);
    free(a_deq);
    return row;
}

static void free_row(test_row *row) {
    free(row->w_buf);
    free(row->a_buf);
}

static void check_row(const quant_format *fmt, cpu_isa isa, const test_row *row) {
    const quant_dot_fn kernel = cpu_dot_kernel_at(fmt->type, isa);
    CHECKF(kernel != NULL, "%s has no %s kernel", fmt->name, cpu_isa_name(isa));
    if (!kernel) return;
    const double got = kernel(row->w, row->a, row->n);
    const double portable = fmt->dot(row->w, row->a, row->n);
    const double vs_portable = fabs(got - portable) / row->magnitude;
    const double vs_exact = fabs(got - row->exact) / row->magnitude;
    CHECKF(isfinite(got) && vs_portable <= REL_TOL, "%s %s n=%lld: %.9g, portable %.9g (%.2g of sum|wa|)", fmt->name,
           cpu_isa_name(isa), (long long)row->n, got, portable, vs_portable);
    CHECKF(isfinite(got) && vs_exact <= REL_TOL, "%s %s n=%lld: %.9g, float64 %.9g (%.2g of sum|wa|)", fmt->name,
           cpu_isa_name(isa), (long long)row->n, got, row->exact, vs_exact);
    if (vs_portable > worst_vs_portable[isa][fmt->type]) worst_vs_portable[isa][fmt->type] = vs_portable;
    if (vs_exact > worst_vs_exact[isa][fmt->type]) worst_vs_exact[isa][fmt->type] = vs_exact;
}

static void check_format(const quant_format *fmt, cpu_isa isa) {
    const int64_t b = fmt->block_size;
    /* From FIRST_MISALIGNED on, at aligned and at odd addresses. */
    const int64_t lengths[N_LENGTHS] = {b, 3 * b, 13 * b, 4096, 4096 + 3 * b, 13824};
    for (int k = 0; k < N_LENGTHS; k++) {
        for (int misaligned = 0; misaligned <= (k >= FIRST_MISALIGNED); misaligned++) {
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                if (cases[c].only != MOE_TYPE_COUNT && cases[c].only != fmt->type) continue;
                const uint64_t seed = 1 + fmt->type * 1000003ull + (uint64_t)k * 7919 + c * 104729 + misaligned;
                test_row row = make_row(fmt, lengths[k], &cases[c], misaligned, seed);
                check_row(fmt, isa, &row);
                free_row(&row);
            }
        }
    }
}

static void check_level(cpu_isa isa) {
    for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++)
        if (quant_is_supported((moe_type)t)) check_format(quant_format_of(t), isa);
}

static void test_level_portable(void) { check_level(CPU_ISA_PORTABLE); }
static void test_level_avx2(void) { check_level(CPU_ISA_AVX2); }
static void test_level_avx512(void) { check_level(CPU_ISA_AVX512); }

/* The weight types the x86 levels accelerate: each must have a kernel of
 * its own there, not the lower level's, or the table lost an entry. */
static const moe_type accelerated[] = {
    MOE_TYPE_F32,  MOE_TYPE_F16,    MOE_TYPE_BF16,  MOE_TYPE_Q4_0, MOE_TYPE_Q4_1, MOE_TYPE_Q5_0, MOE_TYPE_Q5_1,
    MOE_TYPE_Q8_0, MOE_TYPE_IQ4_NL, MOE_TYPE_MXFP4, MOE_TYPE_Q4_K, MOE_TYPE_Q5_K, MOE_TYPE_Q6_K,
};

static void test_kernel_table(void) {
    const cpu_isa top = cpu_isa_detected();
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++) {
            const quant_dot_fn kernel = cpu_dot_kernel_at((moe_type)t, (cpu_isa)isa);
            const bool expected = quant_is_supported((moe_type)t) && isa <= (int)top;
            CHECKF((kernel != NULL) == expected, "type %u at %s", t, cpu_isa_name((cpu_isa)isa));
        }
    }
    for (int isa = CPU_ISA_AVX2; isa <= (int)top; isa++)
        for (size_t k = 0; k < sizeof accelerated / sizeof accelerated[0]; k++)
            CHECKF(cpu_dot_kernel_at(accelerated[k], (cpu_isa)isa) !=
                       cpu_dot_kernel_at(accelerated[k], (cpu_isa)(isa - 1)),
                   "%s has no kernel of its own at %s", quant_format_of(accelerated[k])->name,
                   cpu_isa_name((cpu_isa)isa));
    CHECK(cpu_dot_kernel_at(MOE_TYPE_Q2_K, CPU_ISA_PORTABLE) == NULL);
    CHECK(cpu_dot_kernel_at(MOE_TYPE_Q4_K, CPU_ISA_COUNT) == NULL);
}

/* main sets MOE_CPU_ISA=portable before the first call into cpu_kernels. */
static void test_env_forces_portable(void) {
    CHECK(strcmp(cpu_kernel_isa(), "portable") == 0);
    for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++)
        if (quant_is_supported((moe_type)t)) CHECK(cpu_dot_kernel((moe_type)t) == quant_format_of(t)->dot);
}

/* The multi-row kernels of every level the CPU has: each of CPU_DOT_ROWS
 * activation rows (at an odd stride) gets the single-row kernel's bits, at
 * several lengths; a level without one for a type says NULL. */
static void test_rows_kernels(void) {
    int found = 0;
    for (int isa = 0; isa <= (int)cpu_isa_detected(); isa++) {
        for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++) {
            const cpu_dot_rows_fn rows = cpu_dot_rows_kernel_at((moe_type)t, (cpu_isa)isa);
            if (!rows) continue;
            found++;
            const quant_format *fmt = quant_format_of(t), *dot = quant_format_of(fmt->dot_type);
            const int64_t lengths[] = {256, 2048, 4096 + 256};
            for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
                const int64_t n = lengths[k];
                const size_t a_stride = quant_row_bytes(dot->type, n) + 3;
                test_row w = make_row(fmt, n, &cases[0], 1, 11 + t + k);
                uint8_t *acts = checked_malloc(CPU_DOT_ROWS * a_stride);
                float *x = checked_malloc((size_t)n * sizeof *x), got[CPU_DOT_ROWS];
                for (int r = 0; r < CPU_DOT_ROWS; r++) {
                    fill_activations(x, n, cases[r % (sizeof cases / sizeof cases[0])].a_kind, 100 + r);
                    dot->quantize(x, acts + r * a_stride, n);
                }
                rows(w.w, acts, a_stride, n, got);
                const quant_dot_fn single = cpu_dot_kernel_at((moe_type)t, (cpu_isa)isa);
                for (int r = 0; r < CPU_DOT_ROWS; r++) {
                    const float want = single(w.w, acts + r * a_stride, n);
                    CHECKF(memcmp(&got[r], &want, sizeof want) == 0, "%s %s n=%lld row %d: %.9g, one row %.9g",
                           fmt->name, cpu_isa_name((cpu_isa)isa), (long long)n, r, got[r], want);
                }
                free(acts), free(x);
                free_row(&w);
            }
        }
    }
    CHECK(cpu_dot_rows_kernel_at(MOE_TYPE_Q4_K, CPU_ISA_PORTABLE) == NULL);
    if (cpu_isa_detected() >= CPU_ISA_AVX2) CHECK(found >= 3 * (int)cpu_isa_detected()); /* Q4_K, Q5_K, Q6_K a level */
}

/* Every f16 bit pattern, from an odd address, widened by F16C as by the
 * portable conversion, bit for bit (NaNs quieted alike); the chosen level's
 * widener is the portable one under MOE_CPU_ISA=portable. */
static void test_f16_widening(void) {
    enum { N = 1 << 16 };
    uint8_t *bytes = malloc(2 * N + 1);
    float *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    for (int i = 0; i < N; i++) bytes[1 + 2 * i] = (uint8_t)i, bytes[2 + 2 * i] = (uint8_t)(i >> 8);
    quant_format_of(MOE_TYPE_F16)->dequantize(bytes + 1, want, N);
    CHECK(cpu_f16_to_f32_kernel() == quant_format_of(MOE_TYPE_F16)->dequantize);
#if defined(__x86_64__)
    if (cpu_isa_detected() >= CPU_ISA_AVX2) {
        for (int n = 0; n <= 17; n++) { /* the tails */
            memset(got, 0xff, N * sizeof *got);
            cpu_avx2_f16_to_f32(bytes + 1 + 2 * 1000, got, n);
            CHECKF(memcmp(got, want + 1000, (size_t)n * sizeof *got) == 0 && isnan(got[n]), "n = %d", n);
        }
        cpu_avx2_f16_to_f32(bytes + 1, got, N);
        int wrong = 0;
        for (int i = 0; i < N; i++) wrong += memcmp(&got[i], &want[i], sizeof got[i]) != 0;
        CHECKF(wrong == 0, "%d of the 65536 f16 values widen otherwise with F16C", wrong);
    }
#endif
    free(bytes), free(want), free(got);
}

static void print_worst(cpu_isa top) {
    printf("worst |kernel - portable| and |kernel - float64|, over sum |w a| (tolerance %.0e):\n", REL_TOL);
    for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++) {
        if (!quant_is_supported((moe_type)t)) continue;
        printf("  %-7s", quant_format_of(t)->name);
        for (int isa = 0; isa <= (int)top; isa++)
            printf("  %s %.1e %.1e", cpu_isa_name((cpu_isa)isa), worst_vs_portable[isa][t], worst_vs_exact[isa][t]);
        printf("\n");
    }
}

int main(void) {
    setenv("MOE_CPU_ISA", "portable", 1);
    const cpu_isa top = cpu_isa_detected();
    printf("ISA levels:");
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++)
        printf(" %s %s;", cpu_isa_name((cpu_isa)isa), isa <= (int)top ? "tested" : "SKIPPED (this CPU lacks it)");
    printf("\n");

    RUN(test_kernel_table);
    RUN(test_env_forces_portable);
    RUN(test_f16_widening);
    RUN(test_rows_kernels);
    RUN(test_level_portable);
    if (top >= CPU_ISA_AVX2)
        RUN(test_level_avx2);
    else
        printf("skip test_level_avx2 (this CPU lacks it)\n");
    if (top >= CPU_ISA_AVX512)
        RUN(test_level_avx512);
    else
        printf("skip test_level_avx512 (this CPU lacks it)\n");
    print_worst(top);
    return test_summary();
}
