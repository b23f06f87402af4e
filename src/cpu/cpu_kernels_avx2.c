/*
 * cpu_kernels_avx2.c — dot kernels for x86-64 CPUs with AVX2, FMA and F16C.
 *
 * Every function carries the target attribute (AVX2 below) instead of the
 * file being built with -mavx2: the build stays portable, and this code runs
 * only where cpu_kernels.c found the features at run time.
 *
 * The quantized kernels share one shape, as GGML's do: the integer products
 * of a block are summed exactly in int32 lanes, converted to float and
 * scaled by the block's factors with one FMA into a float accumulator.
 * _mm256_maddubs_epi16 does the multiplying: unsigned bytes times signed
 * bytes, neighbouring products added into int16 with saturation. Each use
 * states why its pairs stay within int16, which keeps the sums exact;
 * _mm256_madd_epi16 then widens to int32. Weight codes are mostly unsigned
 * already (Q4_0's q - 8 is applied afterwards, as 8 * sum(x)); signed
 * weights move their sign onto the activations (dot_signed). Blocks of 32
 * go four at a time so that their fp16 factors convert together; the
 * weights are prefetched ahead of use (x86_prefetch says why).
 *
 * Results equal the portable kernels' up to the order of float additions;
 * tests/test_cpu_kernels.c measures the difference.
 */
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_kernels_x86.h"

#if defined(__x86_64__)

#define AVX2        __attribute__((target(X86_AVX2_TARGET)))
#define AVX2_INLINE X86_AVX2_INLINE

AVX2_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

AVX2_INLINE float load_fp16(const uint8_t *p) { return _cvtsh_ss(block_load_u16(p)); }

AVX2_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* 16 bytes of packed nibbles -> 32 bytes 0..15, low nibbles first: element
 * order in every 32-element format. The load broadcasts to both halves and
 * a per-qword shift picks the nibbles, which keeps the work off the one
 * port that does cross-lane shuffles. */
AVX2_INLINE __m256i unpack_nibbles(const uint8_t *qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f));
}

/* Sums of four products u * x (u unsigned, x signed) as 8 int32. Exact when
 * no two neighbouring products add up beyond int16. */
AVX2_INLINE __m256i dot_unsigned(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

/* Sums of (code - offset) * x for codes 0..31 and offset <= 16. Codes and
 * offset stay unsigned for maddubs; the pairs are at most 2 * 31 * 128 and
 * 2 * 16 * 128, and so is their difference: all within int16. */
AVX2_INLINE __m256i dot_offset(__m256i codes, int offset, __m256i x) {
    const __m256i products = _mm256_maddubs_epi16(codes, x);
    const __m256i offsets = _mm256_maddubs_epi16(_mm256_set1_epi8((char)offset), x);
    return _mm256_madd_epi16(_mm256_sub_epi16(products, offsets), _mm256_set1_epi16(1));
}

/* Sums of w * x for signed w and x: maddubs wants one operand unsigned, so
 * the sign of w moves onto x (|w| * (sign(w) x) = w x, and both are 0 where
 * w is). |w| <= 128 and |x| <= 127 bound a pair by 2 * 128 * 127 < 2^15.
 * An activation of -128 would keep its sign when flipped; the quantizers of
 * every activation format emit -127..127 only (as GGML's do, which rely on
 * the same trick). */
AVX2_INLINE __m256i dot_signed(__m256i w, __m256i x) {
    return dot_unsigned(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* Byte j of the result is 16 where bit j of the little-endian u32 at qh is
 * set, else 0: the fifth bits of a Q5 block's codes. Each byte first takes
 * the byte of qh that holds its bit, then tests its own bit there. */
AVX2_INLINE __m256i fifth_bits(const uint8_t *qh) {
    const __m256i which_byte = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)block_load_u32(qh)), which_byte);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* The 32 signed values of a block's nibbles in a 16-entry table. */
AVX2_INLINE __m256i lookup_nibbles(const int8_t table[16], const uint8_t *qs) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return _mm256_shuffle_epi8(lut, unpack_nibbles(qs));
}

/* ---------------------------------------------------------------- blocks of 32 */

/* acc[k % 2] += sums[k] * scales[k] for four blocks whose factors were
 * converted together (x86_load4_fp16): each block broadcasts its lane. Two
 * accumulators, so that consecutive FMAs do not wait for each other. */
AVX2_INLINE void add_quad(const __m256i sums[4], __m128 scales, __m256 acc[2]) {
    const __m256 wide = _mm256_castps128_ps256(scales); /* only lanes 0..3 are read */
    UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256 scale = _mm256_permutevar8x32_ps(wide, _mm256_set1_epi32(k));
        acc[k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[k]), scale, acc[k & 1]);
    }
}

/* The per-block terms m * s of the formats with a minimum, which do not
 * depend on the elements, into lanes 0..3. */
AVX2_INLINE __m256 add_mins(__m256 acc, __m128 mins) { return _mm256_add_ps(acc, _mm256_zextps128_ps256(mins)); }

AVX2_INLINE void q4_0_quad(const block_q4_0 *w, const block_q8_0 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++)
        sums[k] = dot_offset(unpack_nibbles(w[k].qs), 8, load32(a[k].qs));
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

/* Codes 0..15: pairs at most 2 * 15 * 128. */
AVX2_INLINE void q4_1_quad(const block_q4_1 *w, const block_q8_1 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++)
        sums[k] = dot_unsigned(unpack_nibbles(w[k].qs), load32(a[k].qs));
    acc[0] = add_mins(acc[0], _mm_mul_ps(X86_FP16_X4(w, m), X86_FP16_X4(a, s)));
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX2_INLINE void q5_0_quad(const block_q5_0 *w, const block_q8_0 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i codes = _mm256_or_si256(unpack_nibbles(w[k].qs), fifth_bits(w[k].qh));
        sums[k] = dot_offset(codes, 16, load32(a[k].qs));
    }
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

/* Codes 0..31: pairs at most 2 * 31 * 128. */
AVX2_INLINE void q5_1_quad(const block_q5_1 *w, const block_q8_1 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i codes = _mm256_or_si256(unpack_nibbles(w[k].qs), fifth_bits(w[k].qh));
        sums[k] = dot_unsigned(codes, load32(a[k].qs));
    }
    acc[0] = add_mins(acc[0], _mm_mul_ps(X86_FP16_X4(w, m), X86_FP16_X4(a, s)));
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX2_INLINE void q8_0_quad(const block_q8_0 *w, const block_q8_0 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++)
        sums[k] = dot_signed(load32(w[k].qs), load32(a[k].qs));
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX2_INLINE void iq4_nl_quad(const block_iq4_nl *w, const block_q8_0 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++)
        sums[k] = dot_signed(lookup_nibbles(x86_iq4_nl_values, w[k].qs), load32(a[k].qs));
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(w, d), X86_FP16_X4(a, d)), acc);
}

AVX2_INLINE void mxfp4_quad(const block_mxfp4 *w, const block_q8_0 *a, __m256 acc[2]) {
    __m256i sums[4];
    UNROLL
    for (int k = 0; k < 4; k++)
        sums[k] = dot_signed(lookup_nibbles(x86_mxfp4_values, w[k].qs), load32(a[k].qs));
    add_quad(sums, _mm_mul_ps(X86_FP16_X4(a, d), x86_mxfp4_scales(w)), acc);
}

AVX2_INLINE float sum2(__m256 a, __m256 b) { return hsum(_mm256_add_ps(a, b)); }

#define QUAD_KERNEL(name, quad_fn, w_type, a_type) \
    X86_QUAD_KERNEL(AVX2, __m256, _mm256_setzero_ps(), sum2, name, quad_fn, w_type, a_type)

QUAD_KERNEL(cpu_avx2_dot_q4_0, q4_0_quad, block_q4_0, block_q8_0)
QUAD_KERNEL(cpu_avx2_dot_q4_1, q4_1_quad, block_q4_1, block_q8_1)
QUAD_KERNEL(cpu_avx2_dot_q5_0, q5_0_quad, block_q5_0, block_q8_0)
QUAD_KERNEL(cpu_avx2_dot_q5_1, q5_1_quad, block_q5_1, block_q8_1)
QUAD_KERNEL(cpu_avx2_dot_q8_0, q8_0_quad, block_q8_0, block_q8_0)
QUAD_KERNEL(cpu_avx2_dot_iq4_nl, iq4_nl_quad, block_iq4_nl, block_q8_0)
QUAD_KERNEL(cpu_avx2_dot_mxfp4, mxfp4_quad, block_mxfp4, block_q8_0)

/* ---------------------------------------------------------------- K-quants */

AVX2_INLINE __m256 scale_add(__m256i sums, float scale, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(scale), acc);
}

/* Int16 element j of each 128-bit half, everywhere in that half: the byte
 * indices for _mm256_shuffle_epi8. */
AVX2_INLINE __m256i pick_int16(int j_low, int j_high) {
    return _mm256_set_m128i(_mm_set1_epi16((short)((2 * j_high + 1) << 8 | 2 * j_high)),
                            _mm_set1_epi16((short)((2 * j_low + 1) << 8 | 2 * j_low)));
}

/* The scale-and-min super-block (Q4_K, Q5_K) once its codes are unpacked:
 * lo[g] and hi[g] hold the codes of sub-blocks 2g and 2g + 1. Codes 0..31
 * bound a maddubs pair by 2 * 31 * 128; an int32 lane gathers 32 products
 * times a 6-bit scale, below 2^24, so it also converts to float exactly.
 * The eight scales, as int16 in both halves of one register, are picked
 * per sub-block with an in-lane shuffle. The mins enter through the
 * activations' bsums: m_j * (bsum_2j + bsum_2j+1), each min repeated for
 * the two bsums of its sub-block, which madd pairs. */
AVX2_INLINE __m256 k_scale_min_sum(const __m256i lo[4], const __m256i hi[4], const uint8_t *packed_scales,
                                   const uint8_t *d, const uint8_t *dmin, const block_q8_k *a, __m256 acc) {
    const __m128i scales_mins = x86_k_scales_unpack(packed_scales);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales_mins));
    __m256i sums = _mm256_setzero_si256();
    UNROLL
    for (int g = 0; g < 4; g++) {
        const __m256i p_lo = _mm256_maddubs_epi16(lo[g], load32(a->qs + 64 * g));
        const __m256i p_hi = _mm256_maddubs_epi16(hi[g], load32(a->qs + 64 * g + 32));
        const __m256i s_lo = _mm256_shuffle_epi8(scales, pick_int16(2 * g, 2 * g));
        const __m256i s_hi = _mm256_shuffle_epi8(scales, pick_int16(2 * g + 1, 2 * g + 1));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(p_lo, s_lo));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(p_hi, s_hi));
    }
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scales_mins, scales_mins));
    const __m256i min_sums = _mm256_madd_epi16(load32(a->bsums), mins);
    const float ad = k_q8_d(a);
    acc = scale_add(sums, load_fp16(d) * ad, acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_sums), _mm256_set1_ps(load_fp16(dmin) * ad), acc);
}

AVX2_INLINE __m256 q4_k_block(const block_q4_k *w, const block_q8_k *a, __m256 acc) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i lo[4], hi[4];
    UNROLL
    for (int g = 0; g < 4; g++) {
        const __m256i q = load32(w->qs + 32 * g);
        lo[g] = _mm256_and_si256(q, low);
        hi[g] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    }
    return k_scale_min_sum(lo, hi, w->scales, w->d, w->dmin, a, acc);
}

/* Q5_K's fifth bits: bit 2g (2g + 1) of qh byte l belongs to the first
 * (second) half of group g. Each step moves the two bits in play to bit 4
 * and then shifts qh down by 2. The shifts are 16-bit (AVX2 has no 8-bit
 * ones) and so leak bits across the byte boundary, but only into bits the
 * 0x10 mask drops: a low byte's bits 0..1 stay its own for up to 6 bits of
 * right shift. */
AVX2_INLINE __m256 q5_k_block(const block_q5_k *w, const block_q8_k *a, __m256 acc) {
    const __m256i low = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    __m256i high = load32(w->qh), lo[4], hi[4];
    UNROLL
    for (int g = 0; g < 4; g++) {
        const __m256i q = load32(w->qs + 32 * g);
        lo[g] = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_and_si256(_mm256_slli_epi16(high, 4), bit4));
        hi[g] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                _mm256_and_si256(_mm256_slli_epi16(high, 3), bit4));
        high = _mm256_srli_epi16(high, 2);
    }
    return k_scale_min_sum(lo, hi, w->scales, w->d, w->dmin, a, acc);
}

/* The four runs of 32 codes (0..63) of one half of a Q6_K block, from its
 * 64 ql bytes and 32 qh bytes (layout in q6_k.c). The 16-bit shifts leak
 * across bytes only into bits the 0x30 mask drops. */
AVX2_INLINE void q6_k_codes(const uint8_t *ql, const uint8_t *qh, __m256i codes[4]) {
    const __m256i low = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30);
    const __m256i l0 = load32(ql), l1 = load32(ql + 32), h = load32(qh);
    codes[0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), top));
    codes[1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(h, 2), top));
    codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(h, top));
    codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                               _mm256_and_si256(_mm256_srli_epi16(h, 2), top));
}

/* Q6_K's codes are q + 32 with q signed; they stay unsigned (0..63, a
 * maddubs pair at most 2 * 63 * 128) and the offset leaves at the end as
 * 32 * sum_j scale_j * bsum_j. Run k of half h spans sub-blocks 8h + 2k and
 * 8h + 2k + 1, whose scales an in-lane shuffle picks from the half's eight,
 * held as int16 in both halves of a register. */
AVX2_INLINE __m256 q6_k_block(const block_q6_k *w, const block_q8_k *a, __m256 acc) {
    __m256i sums = _mm256_setzero_si256(), codes[4];
    UNROLL
    for (int h = 0; h < 2; h++) {
        const __m128i half_scales = _mm_loadl_epi64((const __m128i *)(w->scales + 8 * h));
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(half_scales));
        q6_k_codes(w->ql + 64 * h, w->qh + 32 * h, codes);
        UNROLL
        for (int k = 0; k < 4; k++) {
            const __m256i p = _mm256_maddubs_epi16(codes[k], load32(a->qs + 128 * h + 32 * k));
            const __m256i sc = _mm256_shuffle_epi8(scales, pick_int16(2 * k, 2 * k + 1));
            sums = _mm256_add_epi32(sums, _mm256_madd_epi16(p, sc));
        }
    }
    const __m256i all_scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w->scales));
    const __m256i offset = _mm256_madd_epi16(load32(a->bsums), all_scales);
    sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(offset, 5));
    return scale_add(sums, load_fp16(w->d) * k_q8_d(a), acc);
}

/* A super-block kernel; each super-block has ample independent work, so one
 * accumulator will do. */
#define SUPER_KERNEL(name, block_fn, w_type)                                                                           \
    AVX2 float name(const void *weights, const void *activations, int64_t n) {                                         \
        const w_type *w = weights;                                                                                     \
        const block_q8_k *a = activations;                                                                             \
        __m256 acc = _mm256_setzero_ps();                                                                              \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                                       \
            x86_prefetch(&w[i], sizeof *w);                                                                            \
            acc = block_fn(&w[i], &a[i], acc);                                                                         \
        }                                                                                                              \
        return hsum(acc);                                                                                              \
    }

SUPER_KERNEL(cpu_avx2_dot_q4_k, q4_k_block, block_q4_k)
SUPER_KERNEL(cpu_avx2_dot_q5_k, q5_k_block, block_q5_k)
SUPER_KERNEL(cpu_avx2_dot_q6_k, q6_k_block, block_q6_k)

/* Their multi-row twins (cpu_kernels_x86.h). */
X86_SUPER_ROWS_KERNEL(AVX2, __m256, _mm256_setzero_ps(), hsum, cpu_avx2_dot_rows_q4_k, q4_k_block, block_q4_k)
X86_SUPER_ROWS_KERNEL(AVX2, __m256, _mm256_setzero_ps(), hsum, cpu_avx2_dot_rows_q5_k, q5_k_block, block_q5_k)
X86_SUPER_ROWS_KERNEL(AVX2, __m256, _mm256_setzero_ps(), hsum, cpu_avx2_dot_rows_q6_k, q6_k_block, block_q6_k)

/* ---------------------------------------------------------------- floats */

/* Eight weights as floats, and one for the tail, from any address. */
AVX2_INLINE __m256 load8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }
AVX2_INLINE __m256 load8_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
AVX2_INLINE __m256 load8_bf16(const uint8_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
AVX2_INLINE float load1_f32(const uint8_t *p) { return block_bits_to_f32(block_load_u32(p)); }
AVX2_INLINE float load1_f16(const uint8_t *p) { return load_fp16(p); }
AVX2_INLINE float load1_bf16(const uint8_t *p) { return block_bf16_to_f32(block_load_u16(p)); }

/* A float kernel: four accumulators of 8 lanes, then 8 at a time, then one
 * at a time for the last n % 8. */
#define FLOAT_KERNEL(name, load8, load1, bytes)                                                                        \
    AVX2 float name(const void *weights, const void *activations, int64_t n) {                                         \
        const uint8_t *w = weights;                                                                                    \
        const float *x = activations;                                                                                  \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};          \
        int64_t i = 0;                                                                                                 \
        for (; i + 32 <= n; i += 32) {                                                                                 \
            x86_prefetch(w + i * (bytes), 32 * (bytes));                                                               \
            UNROLL                                                                                                     \
            for (int k = 0; k < 4; k++)                                                                                \
                acc[k] = _mm256_fmadd_ps(load8(w + (i + 8 * k) * (bytes)), _mm256_loadu_ps(x + i + 8 * k), acc[k]);    \
        }                                                                                                              \
        for (; i + 8 <= n; i += 8)                                                                                     \
            acc[0] = _mm256_fmadd_ps(load8(w + i * (bytes)), _mm256_loadu_ps(x + i), acc[0]);                          \
        float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));                 \
        for (; i < n; i++)                                                                                             \
            sum += load1(w + i * (bytes)) * x[i];                                                                      \
        return sum;                                                                                                    \
    }

FLOAT_KERNEL(cpu_avx2_dot_f32, load8_f32, load1_f32, 4)
FLOAT_KERNEL(cpu_avx2_dot_f16, load8_f16, load1_f16, 2)
FLOAT_KERNEL(cpu_avx2_dot_bf16, load8_bf16, load1_bf16, 2)

AVX2 void cpu_avx2_f16_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_f16(s + 2 * i));
    for (; i < n; i++) dst[i] = load1_f16(s + 2 * i);
}

#endif
