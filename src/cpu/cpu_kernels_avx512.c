/*
 * cpu_kernels_avx512.c — dot kernels for x86-64 CPUs with AVX-512 F, BW and
 * VNNI (besides AVX2, FMA and F16C).
 *
 * As in cpu_kernels_avx2.c, every function carries the target attribute and
 * runs only where cpu_kernels.c found the features. The shape is the same:
 * exact int32 sums per block, converted and scaled into float accumulators.
 * What 512 bits change:
 *
 * - Blocks of 32 go two to a register, four per step (their fp16 factors
 *   convert together, as at the AVX2 level).
 * - VNNI's _mm512_dpbusd_epi32 adds four unsigned-by-signed byte products
 *   straight into int32, with no saturating int16 stage, so signed weights
 *   (Q8_0's, and IQ4_NL's and MXFP4's codebook values) need no sign trick:
 *   w + 128 is unsigned and sum((w + 128) x) - 128 sum(x) is exact for
 *   every int8 x.
 * - K-quants keep _mm512_maddubs_epi16 (their codes are small, and their
 *   scales apply per 16 or 32 weights, which int16 pairs suit) and fold the
 *   scale multiply into the int32 sum with _mm512_dpwssd_epi32.
 */
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_kernels_x86.h"

#if defined(__x86_64__)

#define AVX512        __attribute__((target(X86_AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((target(X86_AVX512_TARGET), always_inline))

AVX512_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
AVX512_INLINE __m512i load64(const void *p) { return _mm512_loadu_si512(p); }

AVX512_INLINE float load_fp16(const uint8_t *p) { return _cvtsh_ss(block_load_u16(p)); }

/* [lo | hi] as one register. */
AVX512_INLINE __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* The nibbles of two blocks (16 bytes each) -> 64 bytes 0..15 in element
 * order: block 0's low nibbles, its high ones, then block 1's. Each block's
 * bytes are broadcast to two 128-bit lanes and a per-qword shift picks the
 * nibbles, which keeps the work off the shuffle port. */
AVX512_INLINE __m512i unpack_nibble_pair(const uint8_t *qs0, const uint8_t *qs1) {
    const __m512i both = join(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs0)),
                              _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs1)));
    const __m512i shifted = _mm512_srlv_epi64(both, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
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

/* The activations of two Q8_0 / Q8_1 blocks. */
#define Q8_PAIR(a) join(load32((a)[0].qs), load32((a)[1].qs))

/* ---------------------------------------------------------------- blocks of 32 */

/* Blocks of 32 go four at a time, two to a register, so that their factors
 * are computed together (see x86_load4_fp16). add_quad spreads the four
 * factors over the two registers, each over the 8 lanes of its block. */
AVX512_INLINE void add_quad(__m512i sums01, __m512i sums23, __m128 scales, __m512 acc[2]) {
    const __m512 wide = _mm512_castps128_ps512(scales); /* only lanes 0..3 are read */
    const __m512i first = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 scale01 = _mm512_permutexvar_ps(first, wide);
    const __m512 scale23 = _mm512_permutexvar_ps(_mm512_add_epi32(first, _mm512_set1_epi32(2)), wide);
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums01), scale01, acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums23), scale23, acc[1]);
}

/* The per-block terms m * s of the formats with a minimum, which do not
 * depend on the elements, into lanes 0..3. */
AVX512_INLINE __m512 add_mins(__m512 acc, __m128 mins) { return _mm512_add_ps(acc, _mm512_zextps128_ps512(mins)); }

AVX512_INLINE __m512i q4_0_sums(const block_q4_0 *w, const block_q8_0 *a) {
    return dot_offset(unpack_nibble_pair(w[0].qs, w[1].qs), 8, Q8_PAIR(a));
}

AVX512_INLINE void q4_0_quad(const block_q4_0 *w, const block_q8_0 *a, __m512 acc[2]) {
    add_quad(q4_0_sums(w, a), q4_0_sums(w + 2, a + 2), _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX512_INLINE __m512i q4_1_sums(const block_q4_1 *w, const block_q8_1 *a) {
    return dot_offset(unpack_nibble_pair(w[0].qs, w[1].qs), 0, Q8_PAIR(a));
}

AVX512_INLINE void q4_1_quad(const block_q4_1 *w, const block_q8_1 *a, __m512 acc[2]) {
    acc[0] = add_mins(acc[0], _mm_mul_ps(X86_FP16_X4(w, m), X86_FP16_X4(a, s)));
    add_quad(q4_1_sums(w, a), q4_1_sums(w + 2, a + 2), _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

/* The codes (0..31) of two Q5_0 or Q5_1 blocks. */
#define Q5_CODES(w) _mm512_or_si512(unpack_nibble_pair((w)[0].qs, (w)[1].qs), fifth_bit_pair((w)[0].qh, (w)[1].qh))

AVX512_INLINE void q5_0_quad(const block_q5_0 *w, const block_q8_0 *a, __m512 acc[2]) {
    const __m512i sums01 = dot_offset(Q5_CODES(w), 16, Q8_PAIR(a));
    const __m512i sums23 = dot_offset(Q5_CODES(w + 2), 16, Q8_PAIR(a + 2));
    add_quad(sums01, sums23, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX512_INLINE void q5_1_quad(const block_q5_1 *w, const block_q8_1 *a, __m512 acc[2]) {
    const __m512i sums01 = dot_offset(Q5_CODES(w), 0, Q8_PAIR(a));
    const __m512i sums23 = dot_offset(Q5_CODES(w + 2), 0, Q8_PAIR(a + 2));
    acc[0] = add_mins(acc[0], _mm_mul_ps(X86_FP16_X4(w, m), X86_FP16_X4(a, s)));
    add_quad(sums01, sums23, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

/* Signed weights w as w + 128 (flipping the top bit), offset 128. */
AVX512_INLINE __m512i q8_0_sums(const block_q8_0 *w, const block_q8_0 *a) {
    const __m512i biased = _mm512_xor_si512(Q8_PAIR(w), _mm512_set1_epi8((char)0x80));
    return dot_offset(biased, 128, Q8_PAIR(a));
}

AVX512_INLINE void q8_0_quad(const block_q8_0 *w, const block_q8_0 *a, __m512 acc[2]) {
    add_quad(q8_0_sums(w, a), q8_0_sums(w + 2, a + 2), _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX512_INLINE void iq4_nl_quad(const block_iq4_nl *w, const block_q8_0 *a, __m512 acc[2]) {
    const __m512i sums01 = dot_offset(lookup_nibble_pair(x86_iq4_nl_values, w[0].qs, w[1].qs), 128, Q8_PAIR(a));
    const __m512i sums23 = dot_offset(lookup_nibble_pair(x86_iq4_nl_values, w[2].qs, w[3].qs), 128, Q8_PAIR(a + 2));
    add_quad(sums01, sums23, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX512_INLINE void mxfp4_quad(const block_mxfp4 *w, const block_q8_0 *a, __m512 acc[2]) {
    const __m512i sums01 = dot_offset(lookup_nibble_pair(x86_mxfp4_values, w[0].qs, w[1].qs), 128, Q8_PAIR(a));
    const __m512i sums23 = dot_offset(lookup_nibble_pair(x86_mxfp4_values, w[2].qs, w[3].qs), 128, Q8_PAIR(a + 2));
    add_quad(sums01, sums23, _mm_mul_ps(X86_FP16_X4(a, d), x86_mxfp4_scales(w)), acc);
}

AVX512_INLINE float sum2(__m512 a, __m512 b) { return _mm512_reduce_add_ps(_mm512_add_ps(a, b)); }

#define QUAD_KERNEL(name, quad_fn, w_type, a_type) \
    X86_QUAD_KERNEL(AVX512, __m512, _mm512_setzero_ps(), sum2, name, quad_fn, w_type, a_type)

QUAD_KERNEL(cpu_avx512_dot_q4_0, q4_0_quad, block_q4_0, block_q8_0)
QUAD_KERNEL(cpu_avx512_dot_q4_1, q4_1_quad, block_q4_1, block_q8_1)
QUAD_KERNEL(cpu_avx512_dot_q5_0, q5_0_quad, block_q5_0, block_q8_0)
QUAD_KERNEL(cpu_avx512_dot_q5_1, q5_1_quad, block_q5_1, block_q8_1)
QUAD_KERNEL(cpu_avx512_dot_q8_0, q8_0_quad, block_q8_0, block_q8_0)
QUAD_KERNEL(cpu_avx512_dot_iq4_nl, iq4_nl_quad, block_iq4_nl, block_q8_0)
QUAD_KERNEL(cpu_avx512_dot_mxfp4, mxfp4_quad, block_mxfp4, block_q8_0)

/* ---------------------------------------------------------------- K-quants */

AVX512_INLINE __m512 scale_add(__m512i sums, float scale, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(scale), acc);
}

/* Q4_K / Q5_K once the codes are unpacked: codes[g] holds the 64 codes of
 * group g (sub-blocks 2g and 2g + 1), 0..31, so a maddubs pair is at most
 * 2 * 31 * 128 and an int32 lane (32 products times a 6-bit scale) stays
 * below 2^24 and converts to float exactly. The scales of the two
 * sub-blocks, as int16 over the matching 256-bit halves, come from one
 * permute. The mins enter through the activations' bsums,
 * m_j * (bsum_2j + bsum_2j+1), in the low 8 lanes. */
AVX512_INLINE __m512 k_scale_min_sum(const __m512i codes[4], const uint8_t *packed_scales, const uint8_t *d,
                                     const uint8_t *dmin, const block_q8_k *a, __m512 acc) {
    const __m128i scales_mins = x86_k_scales_unpack(packed_scales);
    const __m512i scales = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(scales_mins));
    __m512i sums = _mm512_setzero_si512();
    UNROLL
    for (int g = 0; g < 4; g++) {
        const __m512i p = _mm512_maddubs_epi16(codes[g], load64(a->qs + 64 * g));
        const __m512i index = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((short)(2 * g)),
                                                      _mm512_set1_epi16((short)(2 * g + 1)));
        sums = _mm512_dpwssd_epi32(sums, p, _mm512_permutexvar_epi16(index, scales));
    }
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scales_mins, scales_mins));
    const __m256i min_sums = _mm256_madd_epi16(load32(a->bsums), mins);
    const float ad = k_q8_d(a);
    acc = scale_add(sums, load_fp16(d) * ad, acc);
    const __m512 min_f = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(min_sums));
    return _mm512_fnmadd_ps(min_f, _mm512_set1_ps(load_fp16(dmin) * ad), acc);
}

/* 32 bytes in both halves of a register, the high half shifted right by
 * `shift` bits (per qword: a broadcast load and a variable shift, no
 * cross-lane shuffle). */
AVX512_INLINE __m512i halves_shifted(const uint8_t *p, int shift) {
    const __m512i both = _mm512_broadcast_i64x4(load32(p));
    return _mm512_srlv_epi64(both, _mm512_set_epi64(shift, shift, shift, shift, 0, 0, 0, 0));
}

/* Group g's 64 codes: the low nibbles of its 32 bytes, then the high ones. */
AVX512_INLINE __m512i q4_k_nibbles(const uint8_t *qs, int g) {
    return _mm512_and_si512(halves_shifted(qs + 32 * g, 4), _mm512_set1_epi8(0x0f));
}

AVX512_INLINE __m512 q4_k_block(const block_q4_k *w, const block_q8_k *a, __m512 acc) {
    __m512i codes[4];
    UNROLL
    for (int g = 0; g < 4; g++)
        codes[g] = q4_k_nibbles(w->qs, g);
    return k_scale_min_sum(codes, w->scales, w->d, w->dmin, a, acc);
}

/* Q5_K's fifth bits: bit 2g (2g + 1) of qh byte l belongs to the first
 * (second) half of group g. `high` holds qh in its low half and qh >> 1 in
 * its high half, so both bits in play sit at bit 0; each group moves them
 * to bit 4 and then shifts by 2. The 64- and 16-bit shifts leak bits in at
 * the top of each byte, but a byte's bit 0 stays its own for up to 7 bits
 * of right shift, and the shift left by 4 leaks only into bits the 0x10
 * mask drops. */
AVX512_INLINE __m512 q5_k_block(const block_q5_k *w, const block_q8_k *a, __m512 acc) {
    __m512i high = halves_shifted(w->qh, 1), codes[4];
    UNROLL
    for (int g = 0; g < 4; g++) {
        const __m512i bit4 = _mm512_and_si512(_mm512_slli_epi16(high, 4), _mm512_set1_epi8(0x10));
        codes[g] = _mm512_or_si512(q4_k_nibbles(w->qs, g), bit4);
        high = _mm512_srli_epi16(high, 2);
    }
    return k_scale_min_sum(codes, w->scales, w->d, w->dmin, a, acc);
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
    __m512i index =
        _mm512_cvtepu8_epi16(_mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    __m512i sums = _mm512_setzero_si512();
    UNROLL
    for (int h = 0; h < 2; h++) {
        const __m512i ql = load64(w->ql + 64 * h);
        const __m256i qh = load32(w->qh + 32 * h);
        const __m512i high = join(qh, _mm256_srli_epi16(qh, 2));
        const __m512i codes[2] = {
            _mm512_or_si512(_mm512_and_si512(ql, low), _mm512_and_si512(_mm512_slli_epi16(high, 4), top)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), _mm512_and_si512(high, top)),
        };
        UNROLL
        for (int p = 0; p < 2; p++) {
            const __m512i products = _mm512_maddubs_epi16(codes[p], load64(a->qs + 128 * h + 64 * p));
            const __m512i sc = _mm512_permutexvar_epi16(index, _mm512_zextsi256_si512(scales));
            sums = _mm512_dpwssd_epi32(sums, products, sc);
            index = _mm512_add_epi16(index, _mm512_set1_epi16(4));
        }
    }
    const __m256i offset = _mm256_madd_epi16(load32(a->bsums), scales);
    sums = _mm512_sub_epi32(sums, _mm512_zextsi256_si512(_mm256_slli_epi32(offset, 5)));
    return scale_add(sums, load_fp16(w->d) * k_q8_d(a), acc);
}

/* A super-block kernel; each super-block has ample independent work, so one
 * accumulator will do. */
#define SUPER_KERNEL(name, block_fn, w_type)                                                                           \
    AVX512 float name(const void *weights, const void *activations, int64_t n) {                                       \
        const w_type *w = weights;                                                                                     \
        const block_q8_k *a = activations;                                                                             \
        __m512 acc = _mm512_setzero_ps();                                                                              \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                                       \
            x86_prefetch(&w[i], sizeof *w);                                                                            \
            acc = block_fn(&w[i], &a[i], acc);                                                                         \
        }                                                                                                              \
        return _mm512_reduce_add_ps(acc);                                                                              \
    }

SUPER_KERNEL(cpu_avx512_dot_q4_k, q4_k_block, block_q4_k)
SUPER_KERNEL(cpu_avx512_dot_q5_k, q5_k_block, block_q5_k)
SUPER_KERNEL(cpu_avx512_dot_q6_k, q6_k_block, block_q6_k)

/* Their multi-row twins (cpu_kernels_x86.h). */
X86_SUPER_ROWS_KERNEL(AVX512, __m512, _mm512_setzero_ps(), _mm512_reduce_add_ps, cpu_avx512_dot_rows_q4_k, q4_k_block,
                      block_q4_k)
X86_SUPER_ROWS_KERNEL(AVX512, __m512, _mm512_setzero_ps(), _mm512_reduce_add_ps, cpu_avx512_dot_rows_q5_k, q5_k_block,
                      block_q5_k)
X86_SUPER_ROWS_KERNEL(AVX512, __m512, _mm512_setzero_ps(), _mm512_reduce_add_ps, cpu_avx512_dot_rows_q6_k, q6_k_block,
                      block_q6_k)

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
#define FLOAT_KERNEL(name, load16, load1, bytes)                                                                       \
    AVX512 float name(const void *weights, const void *activations, int64_t n) {                                       \
        const uint8_t *w = weights;                                                                                    \
        const float *x = activations;                                                                                  \
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};          \
        int64_t i = 0;                                                                                                 \
        for (; i + 64 <= n; i += 64) {                                                                                 \
            x86_prefetch(w + i * (bytes), 64 * (bytes));                                                               \
            UNROLL                                                                                                     \
            for (int k = 0; k < 4; k++)                                                                                \
                acc[k] = _mm512_fmadd_ps(load16(w + (i + 16 * k) * (bytes)), _mm512_loadu_ps(x + i + 16 * k), acc[k]); \
        }                                                                                                              \
        for (; i + 16 <= n; i += 16)                                                                                   \
            acc[0] = _mm512_fmadd_ps(load16(w + i * (bytes)), _mm512_loadu_ps(x + i), acc[0]);                         \
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))); \
        for (; i < n; i++)                                                                                             \
            sum += load1(w + i * (bytes)) * x[i];                                                                      \
        return sum;                                                                                                    \
    }

FLOAT_KERNEL(cpu_avx512_dot_f32, load16_f32, load1_f32, 4)
FLOAT_KERNEL(cpu_avx512_dot_f16, load16_f16, load1_f16, 2)
FLOAT_KERNEL(cpu_avx512_dot_bf16, load16_bf16, load1_bf16, 2)

#endif
