/*
 * expert_codes.cuh — the batched prefill's expert products for formats
 * whose codes become the tensor cores' A fragments in registers (Q4_K,
 * Q5_K and Q6_K, expert_codes<F> in their family files): the same product as
 * expert_gemm.cuh (Y = X W^T for every tile of one expert's tokens, bf16
 * operands, f32 sums, mma.sync m16n8k16) without the weight tile in
 * shared memory as f32.
 *
 * Why (bench/decode-plan.md, fact 65 and the issue's prefill list): in
 * expert_gemm.cuh a 256-column step of a block took about 6.6 us, loading,
 * dequantizing into 64 KB of f32 and multiplying one after the other,
 * with 4 warps reading and rounding every A fragment twice. Here:
 * - the step's raw blocks and token columns arrive by cp.async while the
 *   step before is multiplied (EC_STAGES buffers), no registers held;
 * - each warp owns 16 rows and decodes their codes straight into A
 *   fragments (no shared-memory round trip, no fragment read twice);
 * - the columns of a 16-column mma step are permuted: lane t's four
 *   columns (2t, 2t + 1, 2t + 8, 2t + 9 in PTX's order) are the format's
 *   adjacent columns 4t .. 4t + 3, one 32-bit word of codes (two steps'
 *   worth: low and high nibbles) and one 8-byte load of a token's bf16.
 *   A sum does not depend on its order of terms, so A and B only have to
 *   agree;
 * - a tile's empty 8-token groups are skipped (512-token prompts give
 *   Qwen3-30B-A3B's experts 32 tokens each: half a 64-token tile).
 * The A values are the generic kernel's (s * q - m in f32, rounded to
 * bf16: codes_f32), or, in three instructions a pair instead of seven,
 * computed in bf16 (codes_bf16, MOE_CUDA_EXPERT_CODES=bf16).
 *
 * A block: EC_ROWS rows (8 warps of 16) x EG_TOKENS tokens of one tile,
 * one format block of columns a step. Token rows in shared memory are
 * padded to 32 bytes past a multiple of 128, so a half warp's 8-byte
 * loads (4 tokens x 4 lanes) hit 32 banks; the raw rows keep the format's
 * stride (144 bytes for Q4_K, 176 Q5_K, 208 Q6_K: 4 words past a multiple
 * of 32 in each), whose 32-bit words of 8 rows x 4 lanes also do. A
 * format whose scale lives in the meta array (Q6_K's d) has the step's
 * meta of each row staged beside the rows: loaded a step ahead into a
 * register (2 bytes are too few for cp.async) and stored once the step
 * before is multiplied.
 */
#ifndef MOE_CUDA_EXPERT_CODES_CUH
#define MOE_CUDA_EXPERT_CODES_CUH

#include <stdlib.h>
#include <string.h>

#include "cuda/expert_gemm.cuh"

/* Formats opt in (q4_k.cu, q5_k.cu, q6_k.cu) with
 *   template <class MATH, class MUL>
 *   static void fragments(const uint8_t *ra, const uint8_t *rb, uint16_t ma, uint16_t mb, int t, MUL mul):
 * for rows g (ra, meta ma) and g + 8 (rb, mb) of a warp's 16, one format
 * block each in shared memory, call mul(a, col) for each 16-column step
 * of the block, a the lane's A fragments (ec_step), col the first of its
 * four columns. */
template <class F>
struct expert_codes {
    static constexpr bool value = false;
};

/* A pair of codes (bytes i and i + 1 of c, below 128) as weights
 * s * q - m, bf16, two ways: */

/* in f32, rounded to bf16 (the generic kernel's values: k_unit_dequant) */
struct codes_f32 {
    struct scale {
        float s, m;
    };
    static __device__ __forceinline__ scale of(float s, float m) { return scale{s, m}; }
    static __device__ __forceinline__ unsigned pair(unsigned c, int i, const scale &k) {
        const float q0 = __int_as_float((int)__byte_perm(c, 0x4b000000u, 0x7540 + i)) - 8388608.0f; /* exact */
        const float q1 = __int_as_float((int)__byte_perm(c, 0x4b000000u, 0x7541 + i)) - 8388608.0f;
        return bf16_pair(k.s * q0 - k.m, k.s * q1 - k.m);
    }
};

/* in bf16 pairs: the codes as 128 + q (exponent bits 0x43 above them)
 * less 128, exact, then one fused multiply-add with s and -m rounded to
 * bf16: 3 instructions a pair instead of 7, the scale's rounding shared
 * by a sub-block's weights (MOE_CUDA_EXPERT_CODES=bf16) */
struct codes_bf16 {
    struct scale {
        unsigned s, neg_m;
    };
    static __device__ __forceinline__ scale of(float s, float m) { return scale{bf16_pair(s, s), bf16_pair(-m, -m)}; }
    static __device__ __forceinline__ unsigned pair(unsigned c, int i, const scale &k) {
        const unsigned biased = __byte_perm(c, 0x43u, 0x4040 + i + ((i + 1) << 8));
        return bf16x2_fma(k.s, bf16x2_sub(biased, 0x43004300u), k.neg_m);
    }
};

/* One 16-column mma step of rows g (codes ca, weights s * q - m of sa)
 * and g + 8 (cb, sb): lane t's four columns are bytes 0-3 of its words
 * (the permutation at the top). */
template <class MATH, class MUL>
__device__ __forceinline__ void ec_step(unsigned ca, unsigned cb, const typename MATH::scale &sa,
                                        const typename MATH::scale &sb, int col, MUL &mul) {
    const unsigned a[4] = {MATH::pair(ca, 0, sa), MATH::pair(cb, 0, sb), MATH::pair(ca, 2, sa), MATH::pair(cb, 2, sb)};
    mul(a, col);
}

#define EC_ROWS    128
#define EC_THREADS 256
#define EC_STAGES  2
#define EC_XS      (256 + 16) /* bf16 a token row of a step: 544 bytes */

/* A stage: the rows' format blocks, their meta (16-byte aligned), the tokens. */
template <class F>
__host__ __device__ constexpr size_t ec_meta_at(void) {
    return (size_t)EC_ROWS * F::BODY;
}
template <class F>
__host__ __device__ constexpr size_t ec_tokens_at(void) {
    return ec_meta_at<F>() + (F::META ? ((size_t)EC_ROWS * F::META + 15) / 16 * 16 : 0);
}
template <class F>
__host__ __device__ constexpr size_t expert_codes_stage_bytes(void) {
    return ec_tokens_at<F>() + (size_t)EG_TOKENS * EC_XS * sizeof(uint16_t);
}

/* Row r of the block (of matrix `which`, or with SWIGLU gate rows then
 * the same up rows): its matrix and its row there, rows past a matrix
 * repeating its last. */
template <bool SWIGLU>
__device__ __forceinline__ const dmat &ec_row(const expert_gemm_args &a, int which, int m0, int r, int64_t *row) {
    const int second = r >= EC_ROWS / 2;
    const dmat &m = a.w[SWIGLU ? second : which];
    *row = min(m0 + r - (SWIGLU ? second * EC_ROWS / 2 : 0), m.rows - 1);
    return m;
}

/* The meta (the format's 2-byte scale of a block) of step k of the rows
 * that thread owns (threads 0 .. EC_ROWS - 1, a row each), from global
 * memory: loaded a step ahead and stored by ec_store_meta. */
template <class F, bool SWIGLU>
__device__ __forceinline__ uint16_t ec_load_meta(const expert_gemm_args &a, int which, int m0, int64_t e, int k) {
    static_assert(F::META == 0 || F::META == 2, "a step's meta is one 2-byte scale a row");
    if (F::META == 0 || threadIdx.x >= EC_ROWS) return 0;
    int64_t row;
    const dmat &m = ec_row<SWIGLU>(a, which, m0, threadIdx.x, &row);
    return ldg_u16(m.meta + e * m.meta_expert_stride + row * m.meta_row_stride + (int64_t)k * F::META);
}

template <class F>
__device__ __forceinline__ void ec_store_meta(uint8_t *raw, uint16_t meta) {
    if (F::META && threadIdx.x < EC_ROWS) ((uint16_t *)(raw + ec_meta_at<F>()))[threadIdx.x] = meta;
}

/* Step k (format block k of every row) of the block's rows and tokens
 * into stage buffer `raw`, as one cp.async group (the meta aside: above).
 * The rows: m0 on of matrix `which` (or with SWIGLU the first half gate
 * rows m0 on, the second the same up rows). Token rows past the tile's
 * last 8-token group are never read and not copied. (The matrices are
 * read from the kernel's parameters at each step: held in registers
 * across the steps, they spilled.) */
template <class F, bool SWIGLU>
__device__ __forceinline__ void ec_stage(uint8_t *raw, const expert_gemm_args &a, int which, int m0, int64_t e,
                                         const uint16_t *x, int count, int k) {
    constexpr int chunks = F::BODY / 16;
    for (int i = threadIdx.x; i < EC_ROWS * chunks; i += EC_THREADS) {
        const int r = i / chunks, c = i - r * chunks;
        int64_t row;
        const dmat &m = ec_row<SWIGLU>(a, which, m0, r, &row);
        cp_async16(raw + r * F::BODY + 16 * c, m.body + e * m.expert_stride + row * m.row_stride + (int64_t)k * F::BODY + 16 * c,
                   true);
    }
    uint16_t *xs = (uint16_t *)(raw + ec_tokens_at<F>());
    const int per_row = F::BLOCK / 8, tokens = (count + 7) & ~7;
    for (int i = threadIdx.x; i < tokens * per_row; i += EC_THREADS) {
        const int n = i / per_row, c = i - n * per_row;
        cp_async16(xs + n * EC_XS + 8 * c, x + (n < count ? n : 0) * a.ldx + (int64_t)k * F::BLOCK + 8 * c, n < count);
    }
    cp_async_commit();
}

/* This warp's 16 rows x the tile's tokens over the stage's columns. */
template <class F, class MATH>
__device__ __forceinline__ void ec_multiply(float acc[8][4], const uint8_t *raw, int groups) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row = 16 * warp + g;
    const uint8_t *ra = raw + row * F::BODY;
    const uint16_t *meta = (const uint16_t *)(raw + ec_meta_at<F>());
    const uint16_t ma = F::META ? meta[row] : 0, mb = F::META ? meta[row + 8] : 0;
    const uint16_t *xs = (const uint16_t *)(raw + ec_tokens_at<F>()) + g * EC_XS;
    expert_codes<F>::template fragments<MATH>(ra, ra + 8 * F::BODY, ma, mb, t, [&](const unsigned a[4], int col) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < groups) {
                const uint2 bj = *(const uint2 *)(xs + 8 * j * EC_XS + col);
                const unsigned b[2] = {bj.x, bj.y};
                mma_bf16_m16n8k16(acc[j], a, b);
            }
    });
}

/* The block's products into y, row by row of the block's matrix. */
template <class Y>
__device__ __forceinline__ void ec_store(const expert_gemm_args &a, float acc[8][4], int m0, int which, int64_t r0,
                                         int count) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    Y *y = (Y *)a.y + r0 * a.ldy + which * a.w[0].rows;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int row = m0 + 16 * warp + g + 8 * (v >> 1), n = 8 * j + 2 * t + (v & 1);
            if (row < a.w[0].rows && n < count) eg_store(y + (int64_t)n * a.ldy + row, acc[j][v]);
        }
}

/* SwiGLU of the block's gate rows (warps 0-3) and up rows (warps 4-7,
 * the same lanes' values handed over in shared memory, which the steps
 * are done with) into bf16 h, as swiglu_kernel (prefill.cu) computes it. */
__device__ __forceinline__ void ec_store_swiglu(const expert_gemm_args &a, float acc[8][4], float *up, int m0,
                                                int64_t r0, int count) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    float *mine = up + (warp & 3) * 8 * 4 * 32 + lane;
    if (warp >= 4)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) mine[(4 * j + v) * 32] = acc[j][v];
    __syncthreads();
    if (warp >= 4) return;
    uint16_t *h = (uint16_t *)a.y + r0 * a.ldy;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int row = m0 + 16 * warp + g + 8 * (v >> 1), n = 8 * j + 2 * t + (v & 1);
            const float gi = acc[j][v];
            if (row < a.w[0].rows && n < count)
                h[(int64_t)n * a.ldy + row] = f32_to_bf16_bits(gi / (1.0f + expf(-gi)) * mine[(4 * j + v) * 32]);
        }
}

/* Block (row tile, token tile) as in expert_gemm_kernel; with SWIGLU a
 * row tile is EC_ROWS / 2 gate rows and the same up rows. */
template <class F, class Y, class MATH, bool SWIGLU>
__global__ void __launch_bounds__(EC_THREADS, 2) expert_codes_kernel(const expert_gemm_args a) {
    if (a.n_tiles && (int)blockIdx.y >= *a.n_tiles) return;
    DYN_SMEM(uint8_t, smem);
    const int *tile = a.tiles + 3 * blockIdx.y;
    const int64_t e = tile[0], r0 = tile[1];
    const int count = tile[2], groups = (count + 7) >> 3;
    const int row_tiles = SWIGLU ? gridDim.x : (a.w[0].rows + EC_ROWS - 1) / EC_ROWS, which = blockIdx.x / row_tiles;
    const int m0 = (blockIdx.x - which * row_tiles) * (SWIGLU ? EC_ROWS / 2 : EC_ROWS);
    const uint16_t *x = a.x + r0 * a.ldx;
    const int steps = a.w[0].cols / F::BLOCK;
    const size_t stage = expert_codes_stage_bytes<F>();
    static_assert(EC_STAGES == 2, "the meta is loaded one step ahead");
    float acc[8][4] = {};
    ec_stage<F, SWIGLU>(smem, a, which, m0, e, x, count, 0);
    ec_store_meta<F>(smem, ec_load_meta<F, SWIGLU>(a, which, m0, e, 0));
    for (int k = 0; k < steps; k++) {
        /* step k's group has landed once only step k + 1's is in flight */
        uint16_t next_meta = 0;
        if (k + 1 < steps) {
            ec_stage<F, SWIGLU>(smem + (k + 1) % 2 * stage, a, which, m0, e, x, count, k + 1);
            next_meta = ec_load_meta<F, SWIGLU>(a, which, m0, e, k + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* every thread's copies of step k are visible */
        ec_multiply<F, MATH>(acc, smem + k % 2 * stage, groups);
        if (k + 1 < steps) ec_store_meta<F>(smem + (k + 1) % 2 * stage, next_meta);
        __syncthreads(); /* step k's buffer is free for step k + 2, step k + 1's meta is visible */
    }
    if constexpr (SWIGLU) ec_store_swiglu(a, acc, (float *)smem, m0, r0, count);
    else ec_store<Y>(a, acc, m0, which, r0, count);
}

template <class F, class Y, class MATH, bool SWIGLU>
void launch_expert_codes_as(const expert_gemm_args *a, int n_tiles, cudaStream_t st) {
    void (*kernel)(const expert_gemm_args) = expert_codes_kernel<F, Y, MATH, SWIGLU>;
    const int smem = (int)(EC_STAGES * expert_codes_stage_bytes<F>());
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); /* else the launch fails */
    const int row_tiles = SWIGLU ? (a->w[0].rows + EC_ROWS / 2 - 1) / (EC_ROWS / 2)
                                 : a->pair * ((a->w[0].rows + EC_ROWS - 1) / EC_ROWS);
    LAUNCH(kernel, dim3((unsigned)row_tiles, (unsigned)n_tiles), EC_THREADS, smem, st, *a);
}

template <class F, class MATH>
void launch_expert_codes_with(const expert_gemm_args *a, int n_tiles, cudaStream_t st) {
    if (a->swiglu) launch_expert_codes_as<F, uint16_t, MATH, true>(a, n_tiles, st);
    else if (a->y_bf16) launch_expert_codes_as<F, uint16_t, MATH, false>(a, n_tiles, st);
    else launch_expert_codes_as<F, float, MATH, false>(a, n_tiles, st);
}

/* MOE_CUDA_EXPERT_CODES: 0 the generic kernel for every format, bf16
 * the codes' weights in bf16 pairs (codes_bf16), else in f32 (A/B
 * switches). */
enum { CODES_OFF, CODES_F32, CODES_BF16 };
inline int expert_codes_mode(void) {
    const char *v = getenv("MOE_CUDA_EXPERT_CODES");
    return v && v[0] == '0' ? CODES_OFF : v && strcmp(v, "bf16") == 0 ? CODES_BF16 : CODES_F32;
}

/* Whether format F's expert products come from its codes: it has them,
 * its blocks are a step, and the switch above is not off. */
template <class F>
bool expert_products_from_codes(void) {
    if constexpr (expert_codes<F>::value && F::BLOCK == 256) return expert_codes_mode() != CODES_OFF;
    return false;
}

/* The format table's expert products: from the codes where
 * expert_products_from_codes, else expert_gemm.cuh's kernel. false, with
 * nothing launched, when the format's blocks and the matrices' columns
 * leave no step, or SwiGLU was asked of the generic kernel. */
template <class F>
bool launch_expert_products(const expert_gemm_args *a, int n_tiles, cudaStream_t st) {
    if constexpr (expert_codes<F>::value && F::BLOCK == 256) {
        const int mode = expert_codes_mode();
        if (mode != CODES_OFF) {
            if (a->w[0].cols % F::BLOCK) return false;
            if (n_tiles == 0) return true;
            if (mode == CODES_BF16) launch_expert_codes_with<F, codes_bf16>(a, n_tiles, st);
            else launch_expert_codes_with<F, codes_f32>(a, n_tiles, st);
            return true;
        }
    }
    return !a->swiglu && launch_expert_gemm<F>(a, n_tiles, st);
}

#endif
