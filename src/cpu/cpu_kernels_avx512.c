/*
 * cpu_kernels_avx512.c — dot kernels for x86-64 CPUs with AVX-512 F, BW and
 * VNNI (besides AVX2, FMA and F16C).
 *
 * As in cpu_kernels_avx2.c, every function carries the target attribute and
 * runs only where cpu_kernels.c found the features. The shape is the same:
 * exact int32 sums per block, converted and scaled into float accumulators.
 * What 512 bits change:
 *
 * - Blocks of 32 go two to a register. An odd last block is paired with a
 *   block of zeros, whose products and scale are 0.
 * - VNNI's _mm512_dpbusd_epi32 adds four unsigned-by-signed byte products
 *   straight into int32, with no saturating int16 stage, so signed weights
 *   need no sign trick: w + 128 is unsigned and sum((w + 128) x) - 128 sum(x)
 *   is exact for every int8 x.
 * - K-quants keep _mm512_maddubs_epi16 (their codes are small, and their
 *   scales apply per 16 or 32 weights, which int16 pairs suit) and fold the
 *   scale multiply into the int32 sum with _mm512_dpwssd_epi32.
 */
#include "cpu/cpu_kernels_x86.h"

#if defined(__x86_64__)

#include <immintrin.h>

#define AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vnni"
#define AVX512 __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((target(AVX512_TARGET), always_inline))

AVX512_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
AVX512_INLINE __m512i load64(const void *p) { return _mm512_loadu_si512(p); }

AVX512_INLINE float load_fp16(const uint8_t *p) { return _cvtsh_ss(block_load_u16(p)); }

/* [lo | hi] as one register. */
AVX512_INLINE __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* The two block scales of a pair: d0 in lanes 0..7, d1 in lanes 8..15. */
AVX512_INLINE __m512 pair_scale(float d0, float d1) {
    return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
}

AVX512_INLINE __m512 scale_add(__m512i sums, __m512 scale, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc);
}

/* The nibbles of two blocks (16 bytes each) -> 64 bytes 0..15 in element
 * order: block 0's low nibbles, its high ones, then block 1's. */
AVX512_INLINE __m512i unpack_nibble_pair(const uint8_t *qs0, const uint8_t *qs1) {
    const __m256i packed = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)qs1),
                                            _mm_loadu_si128((const __m128i *)qs0));
    /* 128-bit lanes: qs0, qs1, qs0 >> 4, qs1 >> 4; reorder to 0, 2, 1, 3. */
    const __m512i halves = join(packed, _mm256_srli_epi16(packed, 4));
    const __m512i ordered = _mm512_shuffle_i64x2(halves, halves, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm512_and_si512(ordered, _mm512_set1_epi8(0x0f));
}

/* Sums of (u - offset) * x over each four bytes, as 16 int32: u unsigned,
 * x signed, both exact in dpbusd's int32 sums. */
AVX512_INLINE __m512i dot_offset(__m512i u, int offset, __m512i x) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i products = _mm512_dpbusd_epi32(zero, u, x);
    if (offset == 0) return products;
    return _mm512_sub_epi32(products, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)offset), x));
}

/* Byte j of the result is 16 where bit j of the two blocks' fifth bits is
 * set: block 0's u32 in bits 0..31, block 1's in bits 32..63. */
AVX512_INLINE __m512i fifth_bit_pair(const uint8_t *qh0, const uint8_t *qh1) {
    const uint64_t bits = block_load_u32(qh0) | (uint64_t)block_load_u32(qh1) << 32;
    return _mm512_maskz_set1_epi8(bits, 0x10);
}

/* Codebook values + 128 (all in 0..255) for the nibbles of two blocks. */
AVX512_INLINE __m512i lookup_nibble_pair(const int8_t table[16], const uint8_t *qs0, const uint8_t *qs1) {
    const __m512i signed_lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)table));
    const __m512i lut = _mm512_xor_si512(signed_lut, _mm512_set1_epi8((char)0x80));
    return _mm512_shuffle_epi8(lut, unpack_nibble_pair(qs0, qs1));
}

/* ---------------------------------------------------------------- pairs of 32 */

AVX512_INLINE __m512 q4_0_pair(const block_q4_0 *w0, const block_q4_0 *w1, const block_q8_0 *a0,
                               const block_q8_0 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i sums = dot_offset(unpack_nibble_pair(w0->qs, w1->qs), 8, x);
    return scale_add(sums, pair_scale(load_fp16(w0->d) * load_fp16(a0->d), load_fp16(w1->d) * load_fp16(a1->d)), acc);
}

/* The per-block term m * s of the formats with a minimum, added to lane 0. */
AVX512_INLINE __m512 add_mins(__m512 acc, float v) {
    return _mm512_add_ps(acc, _mm512_maskz_mov_ps(1, _mm512_set1_ps(v)));
}

AVX512_INLINE __m512 q4_1_pair(const block_q4_1 *w0, const block_q4_1 *w1, const block_q8_1 *a0,
                               const block_q8_1 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i sums = dot_offset(unpack_nibble_pair(w0->qs, w1->qs), 0, x);
    acc = add_mins(acc, load_fp16(w0->m) * load_fp16(a0->s) + load_fp16(w1->m) * load_fp16(a1->s));
    return scale_add(sums, pair_scale(load_fp16(w0->d) * load_fp16(a0->d), load_fp16(w1->d) * load_fp16(a1->d)), acc);
}

AVX512_INLINE __m512 q5_0_pair(const block_q5_0 *w0, const block_q5_0 *w1, const block_q8_0 *a0,
                               const block_q8_0 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i codes = _mm512_or_si512(unpack_nibble_pair(w0->qs, w1->qs), fifth_bit_pair(w0->qh, w1->qh));
    const __m512i sums = dot_offset(codes, 16, x);
    return scale_add(sums, pair_scale(load_fp16(w0->d) * load_fp16(a0->d), load_fp16(w1->d) * load_fp16(a1->d)), acc);
}

AVX512_INLINE __m512 q5_1_pair(const block_q5_1 *w0, const block_q5_1 *w1, const block_q8_1 *a0,
                               const block_q8_1 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i codes = _mm512_or_si512(unpack_nibble_pair(w0->qs, w1->qs), fifth_bit_pair(w0->qh, w1->qh));
    const __m512i sums = dot_offset(codes, 0, x);
    acc = add_mins(acc, load_fp16(w0->m) * load_fp16(a0->s) + load_fp16(w1->m) * load_fp16(a1->s));
    return scale_add(sums, pair_scale(load_fp16(w0->d) * load_fp16(a0->d), load_fp16(w1->d) * load_fp16(a1->d)), acc);
}

AVX512_INLINE __m512 q8_0_pair(const block_q8_0 *w0, const block_q8_0 *w1, const block_q8_0 *a0,
                               const block_q8_0 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i biased = _mm512_xor_si512(join(load32(w0->qs), load32(w1->qs)), _mm512_set1_epi8((char)0x80));
    const __m512i sums = dot_offset(biased, 128, x);
    return scale_add(sums, pair_scale(load_fp16(w0->d) * load_fp16(a0->d), load_fp16(w1->d) * load_fp16(a1->d)), acc);
}

AVX512_INLINE __m512 iq4_nl_pair(const block_iq4_nl *w0, const block_iq4_nl *w1, const block_q8_0 *a0,
                                 const block_q8_0 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i sums = dot_offset(lookup_nibble_pair(x86_iq4_nl_values, w0->qs, w1->qs), 128, x);
    return scale_add(sums, pair_scale(load_fp16(w0->d) * load_fp16(a0->d), load_fp16(w1->d) * load_fp16(a1->d)), acc);
}

AVX512_INLINE __m512 mxfp4_pair(const block_mxfp4 *w0, const block_mxfp4 *w1, const block_q8_0 *a0,
                                const block_q8_0 *a1, __m512 acc) {
    const __m512i x = join(load32(a0->qs), load32(a1->qs));
    const __m512i sums = dot_offset(lookup_nibble_pair(x86_mxfp4_values, w0->qs, w1->qs), 128, x);
    const __m512 scale = pair_scale(load_fp16(a0->d) * x86_mxfp4_half_scale(w0->e),
                                    load_fp16(a1->d) * x86_mxfp4_half_scale(w1->e));
    return scale_add(sums, scale, acc);
}

/* A kernel over pairs of 32-element blocks. */
#define PAIR_KERNEL(name, pair_fn, w_type, a_type)                                   \
    AVX512 float name(const void *weights, const void *activations, int64_t n) {    \
        static const w_type zero_w;                                                 \
        static const a_type zero_a;                                                 \
        const w_type *w = weights;                                                  \
        const a_type *a = activations;                                              \
        const int64_t blocks = n / 32;                                              \
        __m512 acc = _mm512_setzero_ps();                                           \
        for (int64_t i = 0; i < blocks; i += 2) {                                   \
            const int pair = i + 1 < blocks;                                        \
            acc = pair_fn(&w[i], pair ? &w[i + 1] : &zero_w, &a[i], pair ? &a[i + 1] : &zero_a, acc); \
        }                                                                           \
        return _mm512_reduce_add_ps(acc);                                           \
    }

PAIR_KERNEL(cpu_avx512_dot_q4_0, q4_0_pair, block_q4_0, block_q8_0)
PAIR_KERNEL(cpu_avx512_dot_q4_1, q4_1_pair, block_q4_1, block_q8_1)
PAIR_KERNEL(cpu_avx512_dot_q5_0, q5_0_pair, block_q5_0, block_q8_0)
PAIR_KERNEL(cpu_avx512_dot_q5_1, q5_1_pair, block_q5_1, block_q8_1)
PAIR_KERNEL(cpu_avx512_dot_q8_0, q8_0_pair, block_q8_0, block_q8_0)
PAIR_KERNEL(cpu_avx512_dot_iq4_nl, iq4_nl_pair, block_iq4_nl, block_q8_0)
PAIR_KERNEL(cpu_avx512_dot_mxfp4, mxfp4_pair, block_mxfp4, block_q8_0)

/* ---------------------------------------------------------------- K-quants */

/* 16 int16 scales, each repeated over one 256-bit half: s0 in the low, s1
 * in the high one. */
AVX512_INLINE __m512i half_scales(uint8_t s0, uint8_t s1) {
    return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(s0), _mm512_set1_epi16(s1));
}

/* Q4_K / Q5_K once the codes are unpacked: codes[g] holds the 64 codes of
 * group g (sub-blocks 2g and 2g + 1), 0..31, so a maddubs pair is at most
 * 2 * 31 * 128 and an int32 lane (32 products times a 6-bit scale) stays
 * below 2^24 and converts to float exactly. The mins enter through the
 * activations' bsums, m_j * (bsum_2j + bsum_2j+1), in the low 8 lanes. */
AVX512_INLINE __m512 k_scale_min_sum(const __m512i codes[4], const uint8_t sm[16], const uint8_t *d,
                                     const uint8_t *dmin, const block_q8_k *a, __m512 acc) {
    __m512i sums = _mm512_setzero_si512();
    for (int g = 0; g < 4; g++) {
        const __m512i p = _mm512_maddubs_epi16(codes[g], load64(a->qs + 64 * g));
        sums = _mm512_dpwssd_epi32(sums, p, half_scales(sm[2 * g], sm[2 * g + 1]));
    }
    const __m128i m = _mm_loadl_epi64((const __m128i *)(sm + 8));
    const __m256i min_sums = _mm256_madd_epi16(load32(a->bsums), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)));
    const float ad = k_q8_d(a);
    acc = scale_add(sums, _mm512_set1_ps(load_fp16(d) * ad), acc);
    const __m512 mins = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(min_sums));
    return _mm512_fnmadd_ps(mins, _mm512_set1_ps(load_fp16(dmin) * ad), acc);
}

AVX512_INLINE __m512 q4_k_block(const block_q4_k *w, const block_q8_k *a, __m512 acc) {
    uint8_t sm[16];
    x86_k_scales_unpack(w->scales, sm);
    __m512i codes[4];
    for (int g = 0; g < 4; g++) {
        const __m256i q = load32(w->qs + 32 * g);
        codes[g] = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), _mm512_set1_epi8(0x0f));
    }
    return k_scale_min_sum(codes, sm, w->d, w->dmin, a, acc);
}

/* Q5_K's fifth bits: bit 2g (2g + 1) of qh byte l belongs to the first
 * (second) half of group g. `high` holds qh in its low half and qh >> 1 in
 * its high half, so both bits in play sit at bit 0; each group moves them
 * to bit 4 and then shifts by 2. The 16-bit shifts leak across bytes only
 * into bits the 0x10 mask drops: a low byte's bit 0 stays its own for up to
 * 7 bits of right shift. */
AVX512_INLINE __m512 q5_k_block(const block_q5_k *w, const block_q8_k *a, __m512 acc) {
    uint8_t sm[16];
    x86_k_scales_unpack(w->scales, sm);
    const __m256i qh = load32(w->qh);
    __m512i high = join(qh, _mm256_srli_epi16(qh, 1)), codes[4];
    for (int g = 0; g < 4; g++) {
        const __m256i q = load32(w->qs + 32 * g);
        const __m512i nibbles = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), _mm512_set1_epi8(0x0f));
        const __m512i bit4 = _mm512_and_si512(_mm512_slli_epi16(high, 4), _mm512_set1_epi8(0x10));
        codes[g] = _mm512_or_si512(nibbles, bit4);
        high = _mm512_srli_epi16(high, 2);
    }
    return k_scale_min_sum(codes, sm, w->d, w->dmin, a, acc);
}

/* Q6_K as in cpu_kernels_avx2.c (codes kept unsigned, 0..63, the +32 taken
 * out through the bsums), 64 codes to a register: a half's ql bytes are
 * [ql0 | ql1] and `high` is [qh | qh >> 2], so the four runs of 32 pair up
 * as [run 0 | run 1] and [run 2 | run 3]. Register p of half h covers
 * sub-blocks 8h + 4p .. 8h + 4p + 3, 8 int16 each, whose scales `index`
 * gathers. */
AVX512_INLINE __m512 q6_k_block(const block_q6_k *w, const block_q8_k *a, __m512 acc) {
    const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
    const __m512i low = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
    __m512i index = _mm512_cvtepu8_epi16(_mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                           0x0101010101010101, 0));
    __m512i sums = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        const __m512i ql = load64(w->ql + 64 * h);
        const __m256i qh = load32(w->qh + 32 * h);
        const __m512i high = join(qh, _mm256_srli_epi16(qh, 2));
        const __m512i codes[2] = {
            _mm512_or_si512(_mm512_and_si512(ql, low), _mm512_and_si512(_mm512_slli_epi16(high, 4), top)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), _mm512_and_si512(high, top)),
        };
        for (int p = 0; p < 2; p++) {
            const __m512i products = _mm512_maddubs_epi16(codes[p], load64(a->qs + 128 * h + 64 * p));
            const __m512i sc = _mm512_permutexvar_epi16(index, _mm512_zextsi256_si512(scales));
            sums = _mm512_dpwssd_epi32(sums, products, sc);
            index = _mm512_add_epi16(index, _mm512_set1_epi16(4));
        }
    }
    const __m256i offset = _mm256_madd_epi16(load32(a->bsums), scales);
    sums = _mm512_sub_epi32(sums, _mm512_zextsi256_si512(_mm256_slli_epi32(offset, 5)));
    return scale_add(sums, _mm512_set1_ps(load_fp16(w->d) * k_q8_d(a)), acc);
}

/* A super-block kernel; each super-block has ample independent work, so one
 * accumulator will do. */
#define SUPER_KERNEL(name, block_fn, w_type)                                      \
    AVX512 float name(const void *weights, const void *activations, int64_t n) { \
        const w_type *w = weights;                                               \
        const block_q8_k *a = activations;                                       \
        __m512 acc = _mm512_setzero_ps();                                        \
        for (int64_t i = 0; i < n / QK_K; i++) acc = block_fn(&w[i], &a[i], acc); \
        return _mm512_reduce_add_ps(acc);                                        \
    }

SUPER_KERNEL(cpu_avx512_dot_q4_k, q4_k_block, block_q4_k)
SUPER_KERNEL(cpu_avx512_dot_q5_k, q5_k_block, block_q5_k)
SUPER_KERNEL(cpu_avx512_dot_q6_k, q6_k_block, block_q6_k)

/* ---------------------------------------------------------------- floats */

AVX512_INLINE __m512 load16_f32(const uint8_t *p) { return _mm512_loadu_ps(p); }
AVX512_INLINE __m512 load16_f16(const uint8_t *p) { return _mm512_cvtph_ps(load32(p)); }
AVX512_INLINE __m512 load16_bf16(const uint8_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load32(p)), 16));
}
AVX512_INLINE float load1_f32(const uint8_t *p) { return block_bits_to_f32(block_load_u32(p)); }
AVX512_INLINE float load1_f16(const uint8_t *p) { return load_fp16(p); }
AVX512_INLINE float load1_bf16(const uint8_t *p) { return block_bf16_to_f32(block_load_u16(p)); }

/* Four accumulators of 16 lanes, then 16 at a time, then the last n % 16
 * one at a time. */
#define FLOAT_KERNEL(name, load16, load1, bytes)                                         \
    AVX512 float name(const void *weights, const void *activations, int64_t n) {        \
        const uint8_t *w = weights;                                                      \
        const float *x = activations;                                                    \
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),  \
                         _mm512_setzero_ps()};                                           \
        int64_t i = 0;                                                                   \
        for (; i + 64 <= n; i += 64)                                                     \
            for (int k = 0; k < 4; k++)                                                  \
                acc[k] = _mm512_fmadd_ps(load16(w + (i + 16 * k) * (bytes)),             \
                                         _mm512_loadu_ps(x + i + 16 * k), acc[k]);       \
        for (; i + 16 <= n; i += 16)                                                     \
            acc[0] = _mm512_fmadd_ps(load16(w + i * (bytes)), _mm512_loadu_ps(x + i), acc[0]); \
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]),    \
                                                       _mm512_add_ps(acc[2], acc[3])));  \
        for (; i < n; i++) sum += load1(w + i * (bytes)) * x[i];                         \
        return sum;                                                                      \
    }

FLOAT_KERNEL(cpu_avx512_dot_f32, load16_f32, load1_f32, 4)
FLOAT_KERNEL(cpu_avx512_dot_f16, load16_f16, load1_f16, 2)
FLOAT_KERNEL(cpu_avx512_dot_bf16, load16_bf16, load1_bf16, 2)

#endif
