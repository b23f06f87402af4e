/*
 * dequant.cuh — weight matrices dequantized to plain rows of f32 or bf16,
 * for the batched prefill's tensor-core GEMMs (prefill.cu). Written once
 * over a format's unit functions (F::load, F::dequant: the decode kernels'
 * own) and instantiated per format by DEFINE_CUDA_FORMAT (kernels.cuh),
 * which puts the launch in the format table as cuda_format::dequant.
 *
 * What is dequantized: n matrices of a slab, matrix experts[i] (i itself
 * when experts is NULL) to out + i * out_stride elements, each row-major
 * (rows x cols). A dense weight is a slab of one; rows of a matrix picked
 * by index (the embedding of a chunk's tokens) are a slab whose "experts"
 * are one row each (expert_stride = row_stride).
 *
 * A block takes a chunk of up to DQ_CHUNK elements of each of a few rows
 * (as many as give every thread a unit: a chunk of a 768-wide row has 24
 * Q4_K units, so 10 rows; of a 2048-wide one, 64 and 4 rows), dequantizes
 * their units into shared memory, then writes the chunks with coalesced
 * 16-byte stores, as f32 or as bf16 rounded to nearest even. (One row a
 * block, three quarters of the threads idle while the units loaded, took
 * 81 ms of pp512's 165 on Qwen3-30B-A3B; this takes 78, about 1 TB/s
 * read and written: bench/results/2026-12-03-s18. The suspect now is the
 * shared-memory writes: a K-quant unit writes runs of 16 floats that start
 * on bank 0 or 16 in every lane, a 16-way conflict a store.) A chunk is
 * whole format blocks, so its body and meta pointers are a valid row start
 * for F::load with unit indices counted from the chunk (every format's
 * load addresses its block as body + (u / UNITS) * BODY and
 * meta + (u / UNITS) * META).
 */
#ifndef MOE_CUDA_DEQUANT_CUH
#define MOE_CUDA_DEQUANT_CUH

#include "cuda/cuda_compat.cuh"
#include "cuda/cuda_internal.h"

#define DQ_CHUNK   2048
#define DQ_VALUES  8192 /* floats of shared memory a block: 32 KB */
#define DQ_THREADS 256

/* f32 -> bf16 bits, round to nearest even; a NaN stays a (quiet) NaN. */
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* a in the low half, b in the high one, each rounded to nearest even (one
 * cvt on the GPU). */
__device__ __forceinline__ unsigned bf16_pair(float a, float b) {
#ifdef MOE_CUDA_SIM
    return f32_to_bf16_bits(a) | (unsigned)f32_to_bf16_bits(b) << 16;
#else
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
#endif
}

/* Pairs of bf16 (low half first) a - b and a * b + c, each half rounded
 * once to nearest even (sub.rn.bf16x2, fma.rn.bf16x2). The simulator
 * computes in double, where these results of bf16 operands are exact,
 * and rounds that once (a float between would round twice). */
#ifdef MOE_CUDA_SIM
static inline uint16_t bf16_of_double(double r) {
    const float f = (float)r;
    unsigned u = __float_as_uint(f);
    if ((u & 0xffffu) == 0x8000u && (double)f != r) u += fabs(r) > fabs((double)f) ? 1 : -1; /* off the tie f landed on */
    return f32_to_bf16_bits(__uint_as_float(u));
}
static inline double bf16_half(unsigned pair, int h) { return bf16_bits_to_f32(pair >> (16 * h) & 0xffffu); }
static inline unsigned bf16x2_sub(unsigned a, unsigned b) {
    return bf16_of_double(bf16_half(a, 0) - bf16_half(b, 0)) | (unsigned)bf16_of_double(bf16_half(a, 1) - bf16_half(b, 1)) << 16;
}
static inline unsigned bf16x2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned r = 0;
    for (int h = 0; h < 2; h++) r |= (unsigned)bf16_of_double(bf16_half(a, h) * bf16_half(b, h) + bf16_half(c, h)) << (16 * h);
    return r;
}
#else
__device__ __forceinline__ unsigned bf16x2_sub(unsigned a, unsigned b) {
    unsigned r;
    asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ unsigned bf16x2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
#endif

/* Rows a block dequantizes: one unit a thread, within DQ_VALUES. */
template <class F>
inline int dequant_rows_per_block(const dmat &m) {
    const int chunk = m.cols < DQ_CHUNK ? m.cols : DQ_CHUNK, units = chunk / F::BLOCK * F::UNITS;
    int rows = DQ_THREADS / units;
    if (rows > DQ_VALUES / chunk) rows = DQ_VALUES / chunk;
    if (rows > m.rows) rows = m.rows;
    return rows < 1 ? 1 : rows;
}

/* Unit u of row `row` of matrix e, units counted from format block
 * first_block on (the dequantization's chunks and the expert GEMM's
 * steps start there). */
template <class F>
__device__ __forceinline__ typename F::raw load_unit(const dmat &m, int64_t e, int64_t row, int first_block, int u) {
    return F::load(m.body + e * m.expert_stride + row * m.row_stride + (int64_t)first_block * F::BODY,
                   m.meta + e * m.meta_expert_stride + row * m.meta_row_stride + (int64_t)first_block * F::META, u);
}

template <class F>
__global__ void __launch_bounds__(DQ_THREADS)
    dequant_kernel(const dmat m, const int *experts, int64_t out_stride, void *out, bool bf16, int rows_per_block) {
    __shared__ float4 vals4[DQ_VALUES / 4]; /* float4: aligned for the stores' reads */
    float *vals = (float *)vals4;
    const int chunks = (m.cols + DQ_CHUNK - 1) / DQ_CHUNK;
    const int row0 = blockIdx.x / chunks * rows_per_block, first = (blockIdx.x % chunks) * DQ_CHUNK;
    const int rows = min(rows_per_block, m.rows - row0);
    const int n = min(DQ_CHUNK, m.cols - first), first_block = first / F::BLOCK, units = n / F::BLOCK * F::UNITS;
    const int64_t e = experts ? experts[blockIdx.y] : blockIdx.y;
    for (int t = threadIdx.x; t < rows * units; t += blockDim.x) {
        const int r = t / units, u = t - r * units;
        F::dequant(load_unit<F>(m, e, row0 + r, first_block, u), u, vals + r * n);
    }
    __syncthreads();
    /* n is a multiple of 32, so each row's chunk is whole groups of 8 */
    for (int i = 8 * threadIdx.x; i < rows * n; i += 8 * blockDim.x) {
        const int r = i / n, c = i - r * n;
        const int64_t at = blockIdx.y * out_stride + (int64_t)(row0 + r) * m.cols + first + c;
        const float4 a = *(const float4 *)(vals + i), b = *(const float4 *)(vals + i + 4);
        if (bf16) {
            uint4 o;
            o.x = bf16_pair(a.x, a.y), o.y = bf16_pair(a.z, a.w), o.z = bf16_pair(b.x, b.y), o.w = bf16_pair(b.z, b.w);
            *(uint4 *)((uint16_t *)out + at) = o;
        } else {
            float4 *o = (float4 *)((float *)out + at);
            o[0] = a, o[1] = b;
        }
    }
}

template <class F>
void launch_dequant(const dmat *m, const int *experts, int n, void *out, int64_t out_stride, bool bf16,
                    cudaStream_t st) {
    const int chunks = (m->cols + DQ_CHUNK - 1) / DQ_CHUNK, rows = dequant_rows_per_block<F>(*m);
    const unsigned blocks = (unsigned)((m->rows + rows - 1) / rows * chunks);
    LAUNCH(dequant_kernel<F>, dim3(blocks, (unsigned)n), DQ_THREADS, 0, st, *m, experts, out_stride, out, bf16, rows);
}

#endif
