/*
 * cpu_kernels_x86.h — what the AVX2 and AVX-512 kernel files share: two
 * lookup tables, the helpers both levels use, and the kernels' names.
 * Private to src/cpu.
 *
 * The block layouts (block_q8_0, block_q8_1 and block_q8_k for the
 * activations, weight_blocks.h's for the weights) and the little-endian
 * field readers come from src/quant. Every vector load in the kernels is
 * unaligned, so a row may sit at any address, as in a memory-mapped GGUF
 * file.
 */
#ifndef MOE_CPU_KERNELS_X86_H
#define MOE_CPU_KERNELS_X86_H

#include <stdint.h>
#include <string.h>

#include "quant/block.h"
#include "quant/k_quant.h"
#include "quant/weight_blocks.h"

/* Unrolls the short fixed loops over vector registers completely, so that
 * their arrays of registers stay in registers: GCC at -O2 otherwise keeps
 * some of them as loops over stack arrays, which halves the kernels' speed. */
#define UNROLL _Pragma("GCC unroll 8")

/* The codebooks of IQ4_NL (iq4_nl.c) and MXFP4 (mxfp4.c, values doubled),
 * as 16-byte tables for a byte shuffle to look nibbles up in. Not every file
 * that includes this header uses them. */
__attribute__((unused)) static const int8_t x86_iq4_nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};
__attribute__((unused)) static const int8_t x86_mxfp4_values[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

#if defined(__x86_64__)
#include <immintrin.h>

#define X86_AVX2_TARGET   "avx2,fma,f16c"
#define X86_AVX512_TARGET X86_AVX2_TARGET ",avx512f,avx512bw,avx512vnni"
#define X86_AVX2_INLINE   static inline __attribute__((target(X86_AVX2_TARGET), always_inline))

/* Software prefetch of the weights this far ahead of the block in hand.
 * The hardware prefetchers alone leave one core's kernels well short of the
 * memory's read rate: on an Intel Xeon of the Sapphire Rapids generation,
 * prefetching 2 to 6 KiB ahead made the kernels 30-50% faster on rows
 * streaming from RAM (bench/cpu_kernels_bench.c), with no clear winner
 * inside that range.
 * Rows of a matrix are contiguous, so running past the end of a row warms
 * the next one. The address is formed as an integer because it may lie
 * outside the row; a prefetch never faults. */
#define X86_PREFETCH_AHEAD 4096

static inline void x86_prefetch(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64)
        _mm_prefetch((const char *)((uintptr_t)p + X86_PREFETCH_AHEAD + off), _MM_HINT_T0);
}

/* The float factors of blocks of 32 are computed four blocks at a time: the
 * four fp16 values are gathered in a general register and converted with
 * one instruction. One conversion per value would cost about three
 * cross-lane operations per block, and those, not the arithmetic, would
 * bound the kernels. Both levels use these (AVX-512 includes AVX2). */
X86_AVX2_INLINE __m128 x86_load4_fp16(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    const uint64_t bits = block_load_u16(p0) | (uint64_t)block_load_u16(p1) << 16 | (uint64_t)block_load_u16(p2) << 32 |
                          (uint64_t)block_load_u16(p3) << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)bits));
}

/* The fp16 field `field` of four consecutive blocks, as four floats. */
#define X86_FP16_X4(blocks, field)                                                                                     \
    x86_load4_fp16((blocks)[0].field, (blocks)[1].field, (blocks)[2].field, (blocks)[3].field)

/* A kernel over blocks of 32, four at a time, for either level: `attr` its
 * target, `vec` its float vector with `zero` and `reduce2` (the sum of
 * both accumulators' lanes), quad_fn(w, a, acc) the level's four-block
 * step. The last 1..3 blocks are copied next to zero blocks, whose products
 * and factors are 0, so they take the same path. */
#define X86_QUAD_KERNEL(attr, vec, zero, reduce2, name, quad_fn, w_type, a_type)                                       \
    attr float name(const void *weights, const void *activations, int64_t n) {                                         \
        const w_type *w = weights;                                                                                     \
        const a_type *a = activations;                                                                                 \
        const int64_t blocks = n / 32;                                                                                 \
        vec acc[2] = {zero, zero};                                                                                     \
        int64_t i = 0;                                                                                                 \
        for (; i + 4 <= blocks; i += 4) {                                                                              \
            x86_prefetch(&w[i], 4 * sizeof *w);                                                                        \
            quad_fn(&w[i], &a[i], acc);                                                                                \
        }                                                                                                              \
        if (i < blocks) {                                                                                              \
            w_type w_last[4] = {0};                                                                                    \
            a_type a_last[4] = {0};                                                                                    \
            memcpy(w_last, &w[i], (size_t)(blocks - i) * sizeof *w);                                                   \
            memcpy(a_last, &a[i], (size_t)(blocks - i) * sizeof *a);                                                   \
            quad_fn(w_last, a_last, acc);                                                                              \
        }                                                                                                              \
        return reduce2(acc[0], acc[1]);                                                                                \
    }

/* A multi-row kernel (cpu_dot_rows_fn) over super-blocks for either level:
 * block_fn(w, a, acc) once a row with the same super-block, whose decoding
 * (codes, scales) depends on the weights alone, so the compiler computes it
 * once for all rows; each row's accumulator takes the single-row kernel's
 * steps, so its sum is that kernel's bit for bit. `reduce` sums a vector's
 * lanes as the single-row kernel does. */
#define X86_SUPER_ROWS_KERNEL(attr, vec, zero, reduce, name, block_fn, w_type)                                         \
    attr void name(const void *weights, const void *activations, size_t a_stride, int64_t n, float *out) {            \
        const w_type *w = weights;                                                                                     \
        const block_q8_k *a[CPU_DOT_ROWS];                                                                             \
        vec acc[CPU_DOT_ROWS];                                                                                         \
        UNROLL                                                                                                         \
        for (int r = 0; r < CPU_DOT_ROWS; r++)                                                                         \
            a[r] = (const block_q8_k *)((const uint8_t *)activations + r * a_stride), acc[r] = zero;                   \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                                       \
            x86_prefetch(&w[i], sizeof *w);                                                                            \
            UNROLL                                                                                                     \
            for (int r = 0; r < CPU_DOT_ROWS; r++)                                                                     \
                acc[r] = block_fn(&w[i], &a[r][i], acc[r]);                                                            \
        }                                                                                                              \
        UNROLL                                                                                                         \
        for (int r = 0; r < CPU_DOT_ROWS; r++)                                                                         \
            out[r] = reduce(acc[r]);                                                                                   \
    }

/* MXFP4's E8M0 scale halved, 2^(e - 128), for four consecutive blocks, to go
 * with the doubled values (mxfp4.c explains why). Built from its bits:
 * (e - 1) << 23, or the subnormal 0x00200000 << e for e < 2. */
X86_AVX2_INLINE __m128 x86_mxfp4_scales(const block_mxfp4 *w) {
    const uint32_t bytes = w[0].e | (uint32_t)w[1].e << 8 | (uint32_t)w[2].e << 16 | (uint32_t)w[3].e << 24;
    const __m128i e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)bytes));
    const __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    const __m128i subnormal = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
    const __m128i is_subnormal = _mm_cmpgt_epi32(_mm_set1_epi32(2), e);
    return _mm_castsi128_ps(_mm_blendv_epi8(normal, subnormal, is_subnormal));
}

/* The eight 6-bit scales (bytes 0..7) and eight mins (bytes 8..15) of a
 * Q4_K / Q5_K super-block from its 12 packed bytes, as k_scale_min_get
 * (k_quant.h) gives them, four at a time in 32-bit words w0..w2:
 *   scales 0..3 = w0 & 0x3f3f3f3f   scales 4..7 = (w2 & 0x0f0f0f0f) | (w0 >> 2 & 0x30303030)
 *   mins 0..3   = w1 & 0x3f3f3f3f   mins 4..7   = (w2 >> 4 & 0x0f0f0f0f) | (w1 >> 2 & 0x30303030)
 * The 16-byte load ends inside the block (its next field), unused. Done in
 * a vector register: unpacking in general registers and moving the scales
 * over one by one made the Q4_K and Q5_K kernels 15-30% slower. */
X86_AVX2_INLINE __m128i x86_k_scales_unpack(const uint8_t *packed) {
    const __m128i words = _mm_loadu_si128((const __m128i *)packed);
    const __m128i low = _mm_srlv_epi32(_mm_shuffle_epi32(words, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i high = _mm_srli_epi32(_mm_shuffle_epi32(words, _MM_SHUFFLE(1, 1, 0, 0)), 2);
    return _mm_or_si128(_mm_and_si128(low, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)),
                        _mm_and_si128(high, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
}
#endif

/* The kernels, with quant_dot_fn's signature and contract. Defined only in
 * x86-64 builds; run only where cpu_kernels.c found the level's features. */
#define X86_KERNELS(isa)                                                                                               \
    float cpu_##isa##_dot_f32(const void *w, const void *x, int64_t n);                                                \
    float cpu_##isa##_dot_f16(const void *w, const void *x, int64_t n);                                                \
    float cpu_##isa##_dot_bf16(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q4_0(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q4_1(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q5_0(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q5_1(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q8_0(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_iq4_nl(const void *w, const void *x, int64_t n);                                             \
    float cpu_##isa##_dot_mxfp4(const void *w, const void *x, int64_t n);                                              \
    float cpu_##isa##_dot_q4_k(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q5_k(const void *w, const void *x, int64_t n);                                               \
    float cpu_##isa##_dot_q6_k(const void *w, const void *x, int64_t n);

X86_KERNELS(avx2)
X86_KERNELS(avx512)

#undef X86_KERNELS

/* The multi-row kernels (cpu_dot_rows_fn) of the super-block formats. */
#define X86_ROWS_KERNELS(isa)                                                                                          \
    void cpu_##isa##_dot_rows_q4_k(const void *w, const void *x, size_t x_stride, int64_t n, float *out);              \
    void cpu_##isa##_dot_rows_q5_k(const void *w, const void *x, size_t x_stride, int64_t n, float *out);              \
    void cpu_##isa##_dot_rows_q6_k(const void *w, const void *x, size_t x_stride, int64_t n, float *out);

X86_ROWS_KERNELS(avx2)
X86_ROWS_KERNELS(avx512)

#undef X86_ROWS_KERNELS

/* n f16 values (any address) to floats with F16C, exactly as
 * quant_format.dequantize of F16; both levels use it. */
void cpu_avx2_f16_to_f32(const void *src, float *dst, int64_t n);

#endif
