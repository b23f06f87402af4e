/*
 * cpu_kernels_bench.c — how close each CPU dot kernel comes to the memory's
 * read bandwidth, per weight format and ISA level. A micro-benchmark, not a
 * test: it checks nothing (tests/test_cpu_kernels.c does).
 *
 * For each format, a matrix-vector product on one thread: 4096 columns and
 * as many rows as fill the weight buffer, y[r] = dot(row r, x), with x one
 * activation row quantized to the format's dot type. The buffer defaults to
 * twice the last-level cache and at least 64 MiB, so the weights stream
 * from RAM as they do in decode. Its rows are 16 distinct rows quantized
 * from Gaussian data with the format's quantizer, repeated: the reference
 * quantizers are too slow to fill hundreds of MiB, and the kernels' speed
 * does not depend on the values.
 *
 * The ceiling is a plain read of the same bytes: a sum of 32-bit words with
 * AVX2, four accumulators, with the same software prefetch as the kernels
 * (without it a plain read is slower than the kernels on one core). Each
 * run times the read and then every level's kernel over the matrix, so a
 * disturbance from other processes hits all columns alike; a figure is the
 * median over --runs runs (default 10) after 2 warm-up runs. GB/s counts
 * weight bytes only (the activation row stays in cache).
 *
 * Usage: cpu_kernels_bench [--mib N] [--runs N] [TYPE...]
 *   TYPE as GGML names it (q4_k, f16, ...); default every supported type.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/median.h"
#include "cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { COLS = 4096, DISTINCT_ROWS = 16, WARMUP = 2, MAX_RUNS = 100, PREFETCH_AHEAD = 4096 };

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Keeps the compiler from dropping work whose result nobody reads. */
static volatile float sink_f;
static volatile uint32_t sink_u;

static uint32_t sum_tail(const uint8_t *p, size_t i, size_t bytes, uint32_t total) {
    for (; i + 4 <= bytes; i += 4) {
        uint32_t word;
        memcpy(&word, p + i, sizeof word);
        total += word;
    }
    return total;
}

#if defined(__x86_64__)
/* Four accumulators, written out: GCC keeps an array of them in memory,
 * which would make this ceiling slower than the kernels. */
__attribute__((target("avx2"))) static uint32_t read_words_avx2(const uint8_t *p, size_t bytes) {
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    __m256i acc2 = _mm256_setzero_si256(), acc3 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        _mm_prefetch((const char *)((uintptr_t)p + i + PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch((const char *)((uintptr_t)p + i + PREFETCH_AHEAD + 64), _MM_HINT_T0);
        acc0 = _mm256_add_epi32(acc0, _mm256_loadu_si256((const __m256i *)(p + i)));
        acc1 = _mm256_add_epi32(acc1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        acc2 = _mm256_add_epi32(acc2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        acc3 = _mm256_add_epi32(acc3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(acc0, acc1), _mm256_add_epi32(acc2, acc3));
    uint32_t lanes[8], total = 0;
    _mm256_storeu_si256((__m256i *)lanes, sum);
    for (int k = 0; k < 8; k++)
        total += lanes[k];
    return sum_tail(p, i, bytes, total);
}
#endif

/* Where AVX2 is missing, whatever the compiler makes of the same sum. */
static uint32_t read_words_plain(const uint8_t *p, size_t bytes) {
    uint32_t acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
    size_t i = 0;
    for (; i + 16 <= bytes; i += 16) {
        uint32_t words[4];
        memcpy(words, p + i, sizeof words);
        acc0 += words[0];
        acc1 += words[1];
        acc2 += words[2];
        acc3 += words[3];
    }
    return sum_tail(p, i, bytes, acc0 + acc1 + acc2 + acc3);
}

static uint32_t read_words(const uint8_t *p, size_t bytes) {
#if defined(__x86_64__)
    if (cpu_isa_detected() >= CPU_ISA_AVX2) return read_words_avx2(p, bytes);
#endif
    return read_words_plain(p, bytes);
}

/* A matrix of weights in one format and the activation row for it. */
typedef struct bench_matrix {
    uint8_t *weights;
    size_t row_bytes;
    int64_t rows;
    void *x;
} bench_matrix;

/* Seconds for one pass of `dot` over the matrix (dot NULL: the plain read). */
static double time_pass(const bench_matrix *m, quant_dot_fn dot) {
    const double start = now_seconds();
    if (!dot) {
        sink_u = read_words(m->weights, (size_t)m->rows * m->row_bytes);
        return now_seconds() - start;
    }
    float sum = 0.0f;
    for (int64_t r = 0; r < m->rows; r++)
        sum += dot(m->weights + (size_t)r * m->row_bytes, m->x, COLS);
    sink_f = sum;
    return now_seconds() - start;
}

/* A pseudo-Gaussian row: the sum of four uniforms, centred and scaled, is
 * close enough for weights whose values do not matter to the speed. */
static void gaussian(float *v, int64_t n, uint64_t *state) {
    for (int64_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int k = 0; k < 4; k++) {
            *state = *state * 6364136223846793005ull + 1442695040888963407ull;
            s += (float)(*state >> 40) * 0x1p-24f;
        }
        v[i] = (s - 2.0f) * 1.7320508f;
    }
}

/* Fills as many rows of `fmt` as fit in `capacity` bytes and quantizes the
 * activation row. */
static bench_matrix prepare(const quant_format *fmt, uint8_t *buffer, size_t capacity, void *x_buf) {
    float values[COLS];
    uint64_t state = 42;
    bench_matrix m = {buffer, quant_row_bytes(fmt->type, COLS), 0, x_buf};
    m.rows = (int64_t)(capacity / m.row_bytes);
    for (int64_t r = 0; r < DISTINCT_ROWS; r++) {
        gaussian(values, COLS, &state);
        fmt->quantize(values, buffer + (size_t)r * m.row_bytes, COLS);
    }
    for (int64_t r = DISTINCT_ROWS; r < m.rows; r++)
        memcpy(buffer + (size_t)r * m.row_bytes, buffer + (size_t)(r % DISTINCT_ROWS) * m.row_bytes, m.row_bytes);
    gaussian(values, COLS, &state);
    quant_format_of(fmt->dot_type)->quantize(values, x_buf, COLS);
    return m;
}

/* Column 0 is the plain read; column 1 + isa is that level's kernel, NULL
 * where the CPU lacks the level or it only reuses the level below's. */
static void bench_format(const quant_format *fmt, uint8_t *buffer, size_t capacity, void *x_buf, int runs) {
    const bench_matrix m = prepare(fmt, buffer, capacity, x_buf);
    const double bytes = (double)m.rows * (double)m.row_bytes;
    quant_dot_fn kernels[1 + CPU_ISA_COUNT] = {NULL};
    const char *notes[1 + CPU_ISA_COUNT] = {NULL};
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        kernels[1 + isa] = cpu_dot_kernel_at(fmt->type, (cpu_isa)isa);
        if (!kernels[1 + isa])
            notes[1 + isa] = "(no CPU support)";
        else if (isa > 0 && kernels[1 + isa] == cpu_dot_kernel_at(fmt->type, (cpu_isa)(isa - 1)))
            notes[1 + isa] = "(as level below)";
        if (notes[1 + isa]) kernels[1 + isa] = NULL;
    }
    static double seconds[1 + CPU_ISA_COUNT][MAX_RUNS];
    for (int run = -WARMUP; run < runs; run++) {
        for (int c = 0; c <= CPU_ISA_COUNT; c++) {
            if (c > 0 && !kernels[c]) continue;
            const double s = time_pass(&m, kernels[c]);
            if (run >= 0) seconds[c][run] = s;
        }
    }
    const double ceiling = bytes / median_sort(seconds[0], runs) / 1e9;
    printf("%-7s %7lld %7.1f %9.2f ", fmt->name, (long long)m.rows, bytes / 1e6, ceiling);
    for (int c = 1; c <= CPU_ISA_COUNT; c++) {
        if (notes[c]) {
            printf(" %16s", notes[c]);
            continue;
        }
        const double gbps = bytes / median_sort(seconds[c], runs) / 1e9;
        printf(" %8.2f (%4.0f%%)", gbps, 100.0 * gbps / ceiling);
    }
    printf("\n");
    fflush(stdout);
}

static size_t default_capacity(void) {
    long llc = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    const size_t floor_bytes = (size_t)64 << 20;
    return llc > 0 && (size_t)llc * 2 > floor_bytes ? (size_t)llc * 2 : floor_bytes;
}

static int usage(void) {
    fprintf(stderr, "usage: cpu_kernels_bench [--mib N] [--runs N (1..%d)] [TYPE...]\n", MAX_RUNS);
    return 2;
}

static bool wanted(const quant_format *fmt, char **types, int n_types) {
    for (int i = 0; i < n_types; i++)
        if (quant_format_by_name(types[i]) == fmt) return true;
    return n_types == 0;
}

int main(int argc, char **argv) {
    size_t capacity = default_capacity();
    int runs = 10, first_type = argc;
    for (int i = 1; i < argc && first_type == argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            const long mib = atol(argv[++i]);
            if (mib < 1) return usage();
            capacity = (size_t)mib << 20;
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
            if (runs < 1 || runs > MAX_RUNS) return usage();
        } else if (argv[i][0] == '-') {
            return usage();
        } else {
            first_type = i;
        }
    }
    for (int i = first_type; i < argc; i++) {
        const quant_format *fmt = quant_format_by_name(argv[i]);
        if (!fmt || !quant_is_supported(fmt->type)) {
            fprintf(stderr, "cpu_kernels_bench: %s is not a type with CPU kernels\n", argv[i]);
            return 2;
        }
    }

    uint8_t *buffer = aligned_alloc(64, (capacity + 63) / 64 * 64);
    void *x_buf = aligned_alloc(64, 64 * 1024);
    if (!buffer || !x_buf) {
        fprintf(stderr, "cpu_kernels_bench: cannot allocate %zu MiB\n", capacity >> 20);
        return 1;
    }
    printf("cpu_kernels_bench: 1 thread, %d columns, up to %zu MiB of weights per type, median of %d runs after %d "
           "warm-up; this CPU has levels up to %s\n",
           COLS, capacity >> 20, runs, WARMUP, cpu_isa_name(cpu_isa_detected()));
    printf("GB/s of weight bytes; in parentheses, the share of the read ceiling (AVX2 sum of 32-bit words over the "
           "same bytes)\n");
    printf("%-7s %7s %7s %9s  %16s %16s %16s\n", "type", "rows", "MB", "read GB/s", "portable", "avx2", "avx512");
    for (uint32_t t = 0; t < MOE_TYPE_COUNT; t++) {
        const quant_format *fmt = quant_format_of(t);
        if (quant_is_supported((moe_type)t) && wanted(fmt, argv + first_type, argc - first_type))
            bench_format(fmt, buffer, capacity, x_buf, runs);
    }
    free(buffer);
    free(x_buf);
    return 0;
}
