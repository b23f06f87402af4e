/*
 * cpu_kernels.c — picks the dot kernels: portable (src/quant), AVX2
 * (cpu_kernels_avx2.c) or AVX-512 (cpu_kernels_avx512.c).
 *
 * The CPU is examined once, on first use, under pthread_once so concurrent
 * first calls agree; MOE_CPU_ISA may then lower the level (see
 * cpu_kernels.h). A level without a kernel of its own for a type uses the
 * next lower level's: Q8_1 and Q8_K, which only activations use in practice,
 * have the portable kernels at every level. Non-x86 builds have the portable
 * level only.
 */
#include "cpu/cpu_kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels_x86.h"

#if defined(__x86_64__)
#include <cpuid.h>

#define X86_TABLE(isa)                                                                                                 \
    {                                                                                                                  \
        [MOE_TYPE_F32] = cpu_##isa##_dot_f32, [MOE_TYPE_F16] = cpu_##isa##_dot_f16,                                    \
        [MOE_TYPE_BF16] = cpu_##isa##_dot_bf16, [MOE_TYPE_Q4_0] = cpu_##isa##_dot_q4_0,                                \
        [MOE_TYPE_Q4_1] = cpu_##isa##_dot_q4_1, [MOE_TYPE_Q5_0] = cpu_##isa##_dot_q5_0,                                \
        [MOE_TYPE_Q5_1] = cpu_##isa##_dot_q5_1, [MOE_TYPE_Q8_0] = cpu_##isa##_dot_q8_0,                                \
        [MOE_TYPE_IQ4_NL] = cpu_##isa##_dot_iq4_nl, [MOE_TYPE_MXFP4] = cpu_##isa##_dot_mxfp4,                          \
        [MOE_TYPE_Q4_K] = cpu_##isa##_dot_q4_k, [MOE_TYPE_Q5_K] = cpu_##isa##_dot_q5_k,                                \
        [MOE_TYPE_Q6_K] = cpu_##isa##_dot_q6_k,                                                                        \
    }

/* Each level's own kernels; NULL where it has none (the portable row is
 * quant_format.dot, looked up in src/quant). */
static const quant_dot_fn level_kernels[CPU_ISA_COUNT][MOE_TYPE_COUNT] = {
    [CPU_ISA_AVX2] = X86_TABLE(avx2),
    [CPU_ISA_AVX512] = X86_TABLE(avx512),
};

/* The multi-row kernels, where a level has them for a type. */
#define X86_ROWS_TABLE(isa)                                                                                            \
    {                                                                                                                  \
        [MOE_TYPE_Q4_K] = cpu_##isa##_dot_rows_q4_k, [MOE_TYPE_Q5_K] = cpu_##isa##_dot_rows_q5_k,                      \
        [MOE_TYPE_Q6_K] = cpu_##isa##_dot_rows_q6_k,                                                                   \
    }

static const cpu_dot_rows_fn level_rows_kernels[CPU_ISA_COUNT][MOE_TYPE_COUNT] = {
    [CPU_ISA_AVX2] = X86_ROWS_TABLE(avx2),
    [CPU_ISA_AVX512] = X86_ROWS_TABLE(avx512),
};

/* F16C has no __builtin_cpu_supports name in every compiler (clang 14 lacks
 * it), so ask CPUID directly. Its registers are the AVX ones, whose OS
 * support the avx2 check already covers. */
static int has_f16c(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
}

/* __builtin_cpu_supports also checks that the OS saves the AVX and AVX-512
 * registers (XCR0), not just that the CPU has the instructions. */
static cpu_isa detect(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !has_f16c()) return CPU_ISA_PORTABLE;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        return CPU_ISA_AVX512;
    return CPU_ISA_AVX2;
}
#else
static const quant_dot_fn level_kernels[CPU_ISA_COUNT][MOE_TYPE_COUNT];
static const cpu_dot_rows_fn level_rows_kernels[CPU_ISA_COUNT][MOE_TYPE_COUNT];

static cpu_isa detect(void) { return CPU_ISA_PORTABLE; }
#endif

static const char *const isa_names[CPU_ISA_COUNT] = {"portable", "avx2", "avx512"};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static cpu_isa isa_detected, isa_chosen;

/* MOE_CPU_ISA is a debugging aid: a value that cannot apply is reported
 * once on stderr, so that a typo does not silently test the wrong level. */
static void isa_init(void) {
    isa_detected = isa_chosen = detect();
    const char *request = getenv("MOE_CPU_ISA");
    if (!request || !*request) return;
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (strcmp(request, isa_names[isa]) != 0) continue;
        if (isa > (int)isa_detected)
            fprintf(stderr, "moe: MOE_CPU_ISA=%s, but this CPU only has %s\n", request, isa_names[isa_detected]);
        else
            isa_chosen = (cpu_isa)isa;
        return;
    }
    fprintf(stderr, "moe: MOE_CPU_ISA=%s ignored: expected portable, avx2 or avx512\n", request);
}

cpu_isa cpu_isa_detected(void) {
    pthread_once(&isa_once, isa_init);
    return isa_detected;
}

const char *cpu_isa_name(cpu_isa isa) { return (unsigned)isa < CPU_ISA_COUNT ? isa_names[isa] : NULL; }

quant_dot_fn cpu_dot_kernel_at(moe_type weight_type, cpu_isa isa) {
    const quant_format *format = quant_format_of((uint32_t)weight_type);
    if (!format || !format->dot || (unsigned)isa >= CPU_ISA_COUNT || isa > cpu_isa_detected()) return NULL;
    for (int level = isa; level > CPU_ISA_PORTABLE; level--)
        if (level_kernels[level][weight_type]) return level_kernels[level][weight_type];
    return format->dot;
}

quant_dot_fn cpu_dot_kernel(moe_type weight_type) {
    pthread_once(&isa_once, isa_init);
    return cpu_dot_kernel_at(weight_type, isa_chosen);
}

/* Only a level's own: a lower level's multi-row kernel would not match
 * this level's single-row one bit for bit. */
cpu_dot_rows_fn cpu_dot_rows_kernel_at(moe_type weight_type, cpu_isa isa) {
    if ((unsigned)weight_type >= MOE_TYPE_COUNT || (unsigned)isa >= CPU_ISA_COUNT || isa > cpu_isa_detected())
        return NULL;
    return level_rows_kernels[isa][weight_type];
}

cpu_dot_rows_fn cpu_dot_rows_kernel(moe_type weight_type) {
    pthread_once(&isa_once, isa_init);
    return cpu_dot_rows_kernel_at(weight_type, isa_chosen);
}

quant_dequantize_fn cpu_f16_to_f32_kernel(void) {
    pthread_once(&isa_once, isa_init);
#if defined(__x86_64__)
    if (isa_chosen >= CPU_ISA_AVX2) return cpu_avx2_f16_to_f32;
#endif
    return quant_format_of(MOE_TYPE_F16)->dequantize;
}

const char *cpu_kernel_isa(void) {
    pthread_once(&isa_once, isa_init);
    return isa_names[isa_chosen];
}
