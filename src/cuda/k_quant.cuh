/*
 * k_quant.cuh — what the K-quant family files (q4_k.cu, q5_k.cu) share on
 * the device: the 6-bit scales and mins of sub-block j from a block's
 * 16-byte header (bytes 4..15 = h.y, h.z, h.w), as k_scale_min_get in
 * src/quant/k_quant.h reads them.
 */
#ifndef MOE_CUDA_K_QUANT_CUH
#define MOE_CUDA_K_QUANT_CUH

#include "cuda/cuda_compat.cuh"

__device__ __forceinline__ void k_scale_min(const uint4 &h, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = (h.y >> (8 * j)) & 63;
        *m = (h.z >> (8 * j)) & 63;
    } else {
        const int s = 8 * (j - 4);
        *sc = ((h.w >> s) & 0x0f) | (((h.y >> s) >> 6 & 3) << 4);
        *m = ((h.w >> s) >> 4 & 0x0f) | (((h.z >> s) >> 6 & 3) << 4);
    }
}

#endif
