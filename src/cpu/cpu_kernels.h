/*
 * cpu_kernels.h — the fastest dot product this CPU has for each format.
 *
 * The portable kernels are quant_format.dot (src/quant). On x86-64 CPUs with
 * AVX2 or AVX-512 (checked once, at run time) faster twins replace them:
 * cpu_kernels_avx2.c and cpu_kernels_avx512.c. A fast kernel returns the
 * portable one's result up to the order of float additions; integer sums are
 * exact in both. tests/test_cpu_kernels.c holds every level the CPU has to
 * that on random rows, and bench/cpu_kernels_bench.c times them.
 *
 * The environment variable MOE_CPU_ISA=portable|avx2|avx512 lowers the level
 * cpu_dot_kernel picks from (it never raises it past what the CPU has), to
 * compare levels or to rule a fast kernel out when chasing a wrong result.
 */
#ifndef MOE_CPU_KERNELS_H
#define MOE_CPU_KERNELS_H

#include "quant/quant.h"

/* Instruction-set levels, lowest first. AVX2 means AVX2 + FMA + F16C (Intel
 * Haswell, AMD Zen and later); AVX512 adds AVX-512 F, BW and VNNI (Intel Ice
 * Lake / Cascade Lake, AMD Zen 4 and later). */
typedef enum cpu_isa {
    CPU_ISA_PORTABLE,
    CPU_ISA_AVX2,
    CPU_ISA_AVX512,
    CPU_ISA_COUNT,
} cpu_isa;

/* The dot kernel for weights of `weight_type` against activations quantized
 * to its dot_type, at the level chosen for this process. Never NULL for a
 * supported type; NULL for a type without kernels. */
quant_dot_fn cpu_dot_kernel(moe_type weight_type);

/* Several activation rows against one weight row, the weights decoded once
 * for all: out[r] = the level's dot of the weights with the activations at
 * activations + r * a_stride bytes, for r < CPU_DOT_ROWS, bit for bit what
 * the single-row kernel gives (a batch's products use it: every row of a
 * prompt's tokens gets the same sums as one token alone). */
enum { CPU_DOT_ROWS = 4 };
typedef void (*cpu_dot_rows_fn)(const void *weights, const void *activations, size_t a_stride, int64_t n, float *out);

/* The multi-row kernel of the type at the chosen level, or at `isa`; NULL
 * where the level has none (then the single-row kernel does each row). */
cpu_dot_rows_fn cpu_dot_rows_kernel(moe_type weight_type);
cpu_dot_rows_fn cpu_dot_rows_kernel_at(moe_type weight_type, cpu_isa isa);

/* The fastest conversion of n f16 values (any address) to floats at the
 * chosen level (F16C from AVX2 up): exact, as the F16 format's dequantize. */
quant_dequantize_fn cpu_f16_to_f32_kernel(void);

/* "avx512", "avx2" or "portable": the level cpu_dot_kernel picks from. */
const char *cpu_kernel_isa(void);

/* The highest level this CPU runs, whatever MOE_CPU_ISA says. */
cpu_isa cpu_isa_detected(void);

/* "portable", "avx2", "avx512"; NULL for an out-of-range value. */
const char *cpu_isa_name(cpu_isa isa);

/* The kernel level `isa` uses for the type, for tests and benchmarks that
 * compare levels. A level with no kernel of its own for the type uses the
 * next lower level's. NULL when the CPU lacks the level or the type has no
 * kernels. */
quant_dot_fn cpu_dot_kernel_at(moe_type weight_type, cpu_isa isa);

#endif
