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
 * A block takes a chunk of up to DQ_CHUNK elements of one row: its threads
 * dequantize the chunk's units into shared memory, then write the chunk
 * with coalesced stores, as f32 or as bf16 rounded to nearest even. A chunk
 * is whole format blocks, so its body and meta pointers are a valid row
 * start for F::load with unit indices counted from the chunk (every
 * format's load addresses its block as body + (u / UNITS) * BODY and
 * meta + (u / UNITS) * META).
 */
#ifndef MOE_CUDA_DEQUANT_CUH
#define MOE_CUDA_DEQUANT_CUH

#include "cuda/cuda_compat.cuh"
#include "cuda/cuda_internal.h"

#define DQ_CHUNK   2048
#define DQ_THREADS 256

/* f32 -> bf16 bits, round to nearest even; a NaN stays a (quiet) NaN. */
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class F>
__global__ void __launch_bounds__(DQ_THREADS)
    dequant_kernel(const dmat m, const int *experts, int64_t out_stride, void *out, bool bf16) {
    __shared__ float chunk_vals[DQ_CHUNK];
    const int chunks = (m.cols + DQ_CHUNK - 1) / DQ_CHUNK;
    const int row = blockIdx.x / chunks, first = (blockIdx.x - row * chunks) * DQ_CHUNK;
    const int n = min(DQ_CHUNK, m.cols - first), first_block = first / F::BLOCK;
    const int64_t e = experts ? experts[blockIdx.y] : blockIdx.y;
    const uint8_t *body = m.body + e * m.expert_stride + row * m.row_stride + (int64_t)first_block * F::BODY;
    const uint8_t *meta = m.meta + e * m.meta_expert_stride + row * m.meta_row_stride + (int64_t)first_block * F::META;
    const int units = n / F::BLOCK * F::UNITS;
    for (int u = threadIdx.x; u < units; u += blockDim.x)
        F::dequant(F::load(body, meta, u), u, chunk_vals);
    __syncthreads();
    const int64_t at = blockIdx.y * out_stride + (int64_t)row * m.cols + first;
    if (bf16) { /* n is a multiple of 32: whole pairs */
        unsigned *o = (unsigned *)((uint16_t *)out + at);
        for (int i = 2 * threadIdx.x; i < n; i += 2 * blockDim.x)
            o[i / 2] = f32_to_bf16_bits(chunk_vals[i]) | (unsigned)f32_to_bf16_bits(chunk_vals[i + 1]) << 16;
    } else {
        float *o = (float *)out + at;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            o[i] = chunk_vals[i];
    }
}

template <class F>
void launch_dequant(const dmat *m, const int *experts, int n, void *out, int64_t out_stride, bool bf16,
                    cudaStream_t st) {
    const int chunks = (m->cols + DQ_CHUNK - 1) / DQ_CHUNK;
    LAUNCH(dequant_kernel<F>, dim3((unsigned)(m->rows * chunks), (unsigned)n), DQ_THREADS, 0, st, *m, experts,
           out_stride, out, bf16);
}

#endif
