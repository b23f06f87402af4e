/*
 * cpu_kernels_x86.h — what the AVX2 and AVX-512 kernel files share: the
 * block layouts of the weight formats, two lookup tables, the unpacking of
 * Q4_K / Q5_K scales, and the kernels' names. Private to src/cpu.
 *
 * The activation blocks (block_q8_0, block_q8_1, block_q8_k) and the
 * little-endian field readers come from src/quant's block.h and k_quant.h.
 * The weight blocks are private to their files in src/quant, so their
 * layouts are restated here with their sizes asserted; the opening comment of
 * the file named beside each is the authority, and tests/test_cpu_kernels.c
 * would catch a drift. Every vector load in the kernels is unaligned, so a
 * row may sit at any address, as in a memory-mapped GGUF file.
 */
#ifndef MOE_CPU_KERNELS_X86_H
#define MOE_CPU_KERNELS_X86_H

#include <stdint.h>
#include <string.h>

#include "quant/block.h"
#include "quant/k_quant.h"

typedef struct block_q4_0 { /* q4_0.c */
    uint8_t d[2];
    uint8_t qs[16];
} block_q4_0;
_Static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");

typedef struct block_q4_1 { /* q4_0.c */
    uint8_t d[2];
    uint8_t m[2];
    uint8_t qs[16];
} block_q4_1;
_Static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");

typedef struct block_q5_0 { /* q5_0.c */
    uint8_t d[2];
    uint8_t qh[4];
    uint8_t qs[16];
} block_q5_0;
_Static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");

typedef struct block_q5_1 { /* q5_0.c */
    uint8_t d[2];
    uint8_t m[2];
    uint8_t qh[4];
    uint8_t qs[16];
} block_q5_1;
_Static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");

typedef struct block_iq4_nl { /* iq4_nl.c */
    uint8_t d[2];
    uint8_t qs[16];
} block_iq4_nl;
_Static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");

typedef struct block_mxfp4 { /* mxfp4.c */
    uint8_t e;
    uint8_t qs[16];
} block_mxfp4;
_Static_assert(sizeof(block_mxfp4) == 17, "MXFP4 block is 17 bytes");

typedef struct block_q4_k { /* q4_k.c */
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[K_SCALE_BYTES];
    uint8_t qs[QK_K / 2];
} block_q4_k;
_Static_assert(sizeof(block_q4_k) == 144, "Q4_K block is 144 bytes");

typedef struct block_q5_k { /* q5_k.c */
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[K_SCALE_BYTES];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_k;
_Static_assert(sizeof(block_q5_k) == 176, "Q5_K block is 176 bytes");

typedef struct block_q6_k { /* q6_k.c */
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint8_t d[2];
} block_q6_k;
_Static_assert(sizeof(block_q6_k) == 210, "Q6_K block is 210 bytes");

/* The codebooks of IQ4_NL (iq4_nl.c) and MXFP4 (mxfp4.c, values doubled),
 * as 16-byte tables for a byte shuffle to look nibbles up in. Not every file
 * that includes this header uses them. */
__attribute__((unused)) static const int8_t x86_iq4_nl_values[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};
__attribute__((unused)) static const int8_t x86_mxfp4_values[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

/* 2^(e - 128): MXFP4's E8M0 scale halved, to go with the doubled values
 * (mxfp4.c explains why); a float subnormal for e < 2. */
static inline float x86_mxfp4_half_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return block_bits_to_f32(bits);
}

/* The eight 6-bit scales of a Q4_K / Q5_K super-block into out[0..7] and
 * its eight mins into out[8..15], four at a time in 32-bit words: the same
 * values as k_scale_min_get (k_quant.h) for j = 0..7. Words are read
 * little-endian, which x86 is. */
static inline void x86_k_scales_unpack(const uint8_t packed[K_SCALE_BYTES], uint8_t out[16]) {
    uint32_t w[3];
    memcpy(w, packed, sizeof w);
    const uint32_t unpacked[4] = {
        w[0] & 0x3f3f3f3fu,                                             /* scales 0..3 */
        (w[2] & 0x0f0f0f0fu) | ((w[0] >> 6) & 0x03030303u) << 4,        /* scales 4..7 */
        w[1] & 0x3f3f3f3fu,                                             /* mins 0..3 */
        ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 6) & 0x03030303u) << 4, /* mins 4..7 */
    };
    memcpy(out, unpacked, sizeof unpacked);
}

/* The kernels, with quant_dot_fn's signature and contract. Defined only in
 * x86-64 builds; run only where cpu_kernels.c found the level's features. */
#define X86_KERNELS(isa)                                                       \
    float cpu_##isa##_dot_f32(const void *w, const void *x, int64_t n);       \
    float cpu_##isa##_dot_f16(const void *w, const void *x, int64_t n);       \
    float cpu_##isa##_dot_bf16(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q4_0(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q4_1(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q5_0(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q5_1(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q8_0(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_iq4_nl(const void *w, const void *x, int64_t n);    \
    float cpu_##isa##_dot_mxfp4(const void *w, const void *x, int64_t n);     \
    float cpu_##isa##_dot_q4_k(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q5_k(const void *w, const void *x, int64_t n);      \
    float cpu_##isa##_dot_q6_k(const void *w, const void *x, int64_t n);

X86_KERNELS(avx2)
X86_KERNELS(avx512)

#undef X86_KERNELS

#endif
