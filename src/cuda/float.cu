/*
 * float.cu — F32, F16 and BF16 on the GPU: the family twin of
 * src/quant/float.c.
 *
 * Device layout: rows as in the file (16-byte aligned when the row length
 * is a multiple of 4 (F32) or 8 (F16, BF16), which the upload checks).
 * Unit = 16 bytes (4 or 8 weights) against f32 activations in shared
 * memory, fused multiply-adds in f32: the CPU reference multiplies and adds
 * in f32 too, in another order. 4 units per lane in flight.
 */
#include "cuda/kernels.cuh"

struct fmt_f32 {
    static constexpr int TYPE = MOE_TYPE_F32, ACT = ACT_F32, N = 4;
    static constexpr int BLOCK = 4, BODY = 16, META = 0, UNITS = 1;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q;
    };
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        return raw{ldg16(body + 16 * u)};
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const float4 x = *(const float4 *)(a.f + act_off + 4 * u);
        return __int_as_float((int)r.q.x) * x.x + __int_as_float((int)r.q.y) * x.y + __int_as_float((int)r.q.z) * x.z +
               __int_as_float((int)r.q.w) * x.w;
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        out[4 * u] = __int_as_float((int)r.q.x);
        out[4 * u + 1] = __int_as_float((int)r.q.y);
        out[4 * u + 2] = __int_as_float((int)r.q.z);
        out[4 * u + 3] = __int_as_float((int)r.q.w);
    }
};

/* F16 and BF16: 8 halves per unit, converted by `CONV` */
template <int T, bool BF>
struct fmt_half {
    static constexpr int TYPE = T, ACT = ACT_F32, N = 4;
    static constexpr int BLOCK = 8, BODY = 16, META = 0, UNITS = 1;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q;
    };
    static __device__ __forceinline__ float conv(unsigned bits) {
        return BF ? bf16_bits_to_f32(bits & 0xffff) : h2f((uint16_t)(bits & 0xffff));
    }
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        return raw{ldg16(body + 16 * u)};
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const float4 x0 = *(const float4 *)(a.f + act_off + 8 * u), x1 = *(const float4 *)(a.f + act_off + 8 * u + 4);
        float s = conv(r.q.x) * x0.x;
        s += conv(r.q.x >> 16) * x0.y;
        s += conv(r.q.y) * x0.z;
        s += conv(r.q.y >> 16) * x0.w;
        s += conv(r.q.z) * x1.x;
        s += conv(r.q.z >> 16) * x1.y;
        s += conv(r.q.w) * x1.z;
        s += conv(r.q.w >> 16) * x1.w;
        return s;
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[8 * u + 2 * i] = conv(w[i]);
            out[8 * u + 2 * i + 1] = conv(w[i] >> 16);
        }
    }
};

typedef fmt_half<MOE_TYPE_F16, false> fmt_f16;
typedef fmt_half<MOE_TYPE_BF16, true> fmt_bf16;

DEFINE_CUDA_FORMAT(fmt_f32, f32)
DEFINE_CUDA_FORMAT(fmt_f16, f16)
DEFINE_CUDA_FORMAT(fmt_bf16, bf16)
