/*
 * fp16_scale.cuh — what the formats whose GGUF block is an fp16 scale d
 * followed by its codes (Q4_0 and IQ4_NL: 16 bytes of nibbles; Q8_0: 32
 * bytes of int8) share on the device: the block split into a body of codes
 * and a 2-byte meta (d), and a unit's load. BODY_BYTES / 16 units a block;
 * the lanes of one block read its d from one address.
 */
#ifndef MOE_CUDA_FP16_SCALE_CUH
#define MOE_CUDA_FP16_SCALE_CUH

#include <string.h>

#include "cuda/kernels.cuh"

template <int BODY_BYTES>
struct fp16_scale_block {
    static constexpr int BODY = BODY_BYTES, META = 2, UNITS = BODY_BYTES / 16;
    static void repack(const uint8_t *src, uint8_t *body, uint8_t *meta, int nb) {
        for (int b = 0; b < nb; b++) {
            memcpy(meta + (size_t)b * 2, src + (size_t)b * (2 + BODY), 2);
            memcpy(body + (size_t)b * BODY, src + (size_t)b * (2 + BODY) + 2, BODY);
        }
    }
    struct raw {
        uint4 q;
        unsigned d;
    };
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *meta, int u) {
        raw r;
        r.q = M::u4(body + 16 * u);
        r.d = M::u16(meta + 2 * (u / UNITS));
        return r;
    }
};

#endif
