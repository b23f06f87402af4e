/*
 * expert_gemm.cuh — the batched prefill's expert products straight from
 * the quantized weights, on tensor cores: for every tile of tokens routed
 * to an expert, Y = X W^T (X the tokens' bf16 rows, W the expert's matrix,
 * or a pair of them stacked: gate | up), bf16 operands and f32 sums
 * (mma.sync m16n8k16). Written once over a format's unit functions
 * (F::load, F::dequant, the decode kernels' own) and put in the format
 * table by DEFINE_CUDA_FORMAT (kernels.cuh) as cuda_format::expert_gemm.
 *
 * Why not dequantize and call cuBLAS: a 512-token pass of Qwen3-30B-A3B
 * chooses nearly all 128 experts of every layer, and writing them out as
 * bf16 and reading them back moved 8 times the quantized bytes (43 of
 * pp512's 109 ms went to the dequantization alone after its bank
 * conflicts were fixed: bench/results/2026-12-03-s19). Here each block
 * reads its weight tile once in its quantized form and dequantizes it in
 * shared memory, where the tensor cores read it.
 *
 * A block: EG_ROWS weight rows (one matrix of the pair) x EG_TOKENS
 * tokens of one expert (a "tile" of the host's list), over the columns
 * in steps of kt (EG_K or fewer: whole format blocks). Per step the
 * tokens' bf16 columns are copied to shared memory (cp.async) and the
 * rows' units dequantized there as f32 (F::dequant's own output), then 8
 * warps (4 along the rows x 2 along the tokens) each take 16 rows x 32
 * tokens: 4 mma of 16 x 8 per 16 columns, the A fragments rounded to
 * bf16 as they are read. Rows of shared memory are padded by 8 elements
 * so a warp's fragment reads hit 32 distinct banks.
 *
 * Measured on Qwen3-30B-A3B Q4_K (bench/results/2026-12-03-s19): loading
 * each unit after the one before had landed took 62 ms of pp512's 130
 * for gate|up; all of a thread's loads in flight together, 32 ms. Two
 * variants were slower and were dropped: the weight tile in bf16 (38 ms)
 * and, on top of it, the next step's tokens and weights fetched during
 * the multiply (40 ms).
 */
#ifndef MOE_CUDA_EXPERT_GEMM_CUH
#define MOE_CUDA_EXPERT_GEMM_CUH

#include "cuda/cuda_compat.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/dequant.cuh"

#define EG_ROWS    64
#define EG_TOKENS  64
#define EG_K       256 /* columns a step, at most */
#define EG_THREADS 256
#define EG_WS      (EG_K + 8) /* floats a row of the weight tile */
#define EG_XS      (EG_K + 8) /* bf16 a row of the token tile */
#define EG_WARP_NT 4 /* a warp's tokens in 8-token mma tiles: 16 rows x 32 tokens a warp, 4 x 2 warps */

inline size_t expert_gemm_smem(void) {
    return (size_t)EG_ROWS * EG_WS * sizeof(float) + (size_t)EG_TOKENS * EG_XS * sizeof(uint16_t);
}

/* Columns a step for a format: the most of EG_K that is whole format
 * blocks, 16-column mma steps and divides cols; 0 when none does. */
inline int expert_gemm_step(int cols, int block) {
    for (int kt = EG_K; kt >= 16; kt /= 2)
        if (kt % block == 0 && cols % kt == 0) return kt;
    return 0;
}

/* The token tile into xs: rows n < count of x (ldx apart), columns k0 ..
 * k0 + kt, 16 bytes a copy, all in flight at once (cp.async: no
 * registers); rows past count are zeros. */
__device__ __forceinline__ void eg_stage_tokens(uint16_t *xs, const uint16_t *x, int64_t ldx, int count, int k0,
                                                int kt) {
    const int per_row = kt / 8;
    for (int i = threadIdx.x; i < EG_TOKENS * per_row; i += EG_THREADS) {
        const int n = i / per_row, c = i - n * per_row;
        cp_async16(xs + n * EG_XS + 8 * c, x + (n < count ? n : 0) * ldx + k0 + 8 * c, n < count);
    }
}

#define EG_LOADS 4 /* units a thread loads before it dequantizes them */

/* The weight tile into ws: rows m0 .. m0 + EG_ROWS of expert e's matrix,
 * columns k0 .. k0 + kt, as f32 (rows past the matrix repeat its last:
 * their products are never stored). A thread's units are loaded
 * EG_LOADS at a time before any is dequantized, so that a step waits for
 * one round trip, not one a unit. */
template <class F>
__device__ __forceinline__ void eg_stage_weights(float *ws, const dmat &m, int64_t e, int m0, int k0, int kt) {
    const int units = kt / F::BLOCK * F::UNITS, first_block = k0 / F::BLOCK, total = EG_ROWS * units;
    for (int t0 = threadIdx.x; t0 < total; t0 += EG_LOADS * EG_THREADS) {
        typename F::raw raw[EG_LOADS];
#pragma unroll
        for (int i = 0; i < EG_LOADS; i++) {
            const int t = t0 + i * EG_THREADS, r = t / units, u = t - r * units;
            if (t >= total) break;
            raw[i] = load_unit<F>(m, e, min(m0 + r, m.rows - 1), first_block, u);
        }
#pragma unroll
        for (int i = 0; i < EG_LOADS; i++) {
            const int t = t0 + i * EG_THREADS, r = t / units, u = t - r * units;
            if (t >= total) break;
            F::dequant(raw[i], u, ws + r * EG_WS);
        }
    }
}

/* This warp's 16 rows x 32 tokens over one step of kt columns, from the
 * PTX fragments (lane 4g + t): A rows g and g + 8 of ws rounded to bf16
 * as they are read, B token g of xs as it is, each at columns 2t, 2t + 1
 * and 8 on. A row's fragments are read by the 2 warps of its tokens (by
 * 4 with warps of 32 rows x 16 tokens: more shared-memory reads and
 * roundings a multiply). */
__device__ __forceinline__ void eg_multiply(float acc[EG_WARP_NT][4], const float *ws, const uint16_t *xs, int kt) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const float *w = ws + (16 * (warp & 3) + g) * EG_WS + 2 * t;
    const uint16_t *x = xs + (32 * (warp >> 2) + g) * EG_XS + 2 * t;
    for (int k = 0; k < kt; k += 16) {
        unsigned a[4], b[EG_WARP_NT][2];
        const float *wk = w + k;
        const float2 p0 = *(const float2 *)wk, p1 = *(const float2 *)(wk + 8 * EG_WS);
        const float2 p2 = *(const float2 *)(wk + 8), p3 = *(const float2 *)(wk + 8 * EG_WS + 8);
        a[0] = bf16_pair(p0.x, p0.y), a[1] = bf16_pair(p1.x, p1.y);
        a[2] = bf16_pair(p2.x, p2.y), a[3] = bf16_pair(p3.x, p3.y);
#pragma unroll
        for (int j = 0; j < EG_WARP_NT; j++) {
            const uint16_t *xj = x + 8 * j * EG_XS + k;
            b[j][0] = *(const unsigned *)xj, b[j][1] = *(const unsigned *)(xj + 8);
        }
#pragma unroll
        for (int j = 0; j < EG_WARP_NT; j++) mma_bf16_m16n8k16(acc[j], a, b[j]);
    }
}

__device__ __forceinline__ void eg_store(float *y, float v) { *y = v; }
__device__ __forceinline__ void eg_store(uint16_t *y, float v) { *y = f32_to_bf16_bits(v); }

/* Block (row tile, token tile): tile = (expert, first row of x and y,
 * rows) from a.tiles, none past *a.n_tiles where the device counted
 * them. Row tile r is matrix r / row_tiles of the pair. */
template <class F, class Y>
__global__ void __launch_bounds__(EG_THREADS) expert_gemm_kernel(const expert_gemm_args a, int kt) {
    if (a.n_tiles && (int)blockIdx.y >= *a.n_tiles) return;
    DYN_SMEM(float, ws);
    uint16_t *xs = (uint16_t *)(ws + EG_ROWS * EG_WS);
    const int *tile = a.tiles + 3 * blockIdx.y;
    const int64_t e = tile[0], r0 = tile[1];
    const int count = tile[2], row_tiles = (a.w[0].rows + EG_ROWS - 1) / EG_ROWS;
    const int which = blockIdx.x / row_tiles, m0 = (blockIdx.x - which * row_tiles) * EG_ROWS;
    const dmat &m = a.w[which];
    float acc[EG_WARP_NT][4] = {};
    for (int k0 = 0; k0 < m.cols; k0 += kt) {
        __syncthreads(); /* the step before is done with ws and xs */
        eg_stage_tokens(xs, a.x + r0 * a.ldx, a.ldx, count, k0, kt);
        eg_stage_weights<F>(ws, m, e, m0, k0, kt);
        cp_async_wait_all();
        __syncthreads();
        eg_multiply(acc, ws, xs, kt);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    Y *y = (Y *)a.y + r0 * a.ldy + which * a.w[0].rows;
#pragma unroll
    for (int j = 0; j < EG_WARP_NT; j++)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int row = m0 + 16 * (warp & 3) + g + 8 * (v >> 1);
            const int n = 32 * (warp >> 2) + 8 * j + 2 * t + (v & 1);
            if (row < m.rows && n < count) eg_store(y + (int64_t)n * a.ldy + row, acc[j][v]);
        }
}

template <class F, class Y>
void launch_expert_gemm_as(const expert_gemm_args *a, dim3 grid, int kt, cudaStream_t st) {
    void (*kernel)(const expert_gemm_args, int) = expert_gemm_kernel<F, Y>;
    const int smem = (int)expert_gemm_smem();
    (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); /* else the launch fails */
    LAUNCH(kernel, grid, EG_THREADS, smem, st, *a, kt);
}

/* false when the format's blocks and the matrices' columns leave no step. */
template <class F>
bool launch_expert_gemm(const expert_gemm_args *a, int n_tiles, cudaStream_t st) {
    const int kt = expert_gemm_step(a->w[0].cols, F::BLOCK);
    if (!kt || n_tiles == 0) return kt != 0;
    const dim3 grid((unsigned)(a->pair * ((a->w[0].rows + EG_ROWS - 1) / EG_ROWS)), (unsigned)n_tiles);
    if (a->y_bf16) launch_expert_gemm_as<F, uint16_t>(a, grid, kt, st);
    else launch_expert_gemm_as<F, float>(a, grid, kt, st);
    return true;
}

#endif
