/*
 * q5_0.cu — Q5_0 on the GPU: the family twin of src/quant/q5_0.c (the
 * q4_k recipes fall back to it for rows shorter than 256, as in the tiny
 * synthetic models).
 *
 * Device layout: the 22-byte GGUF block is split into a 16-byte body (the
 * low nibbles, as Q4_0) and an 8-byte meta: d (fp16), 2 bytes of zero
 * padding, qh (u32: bit j is bit 4 of element j). Unit = one block; the
 * fifth bits are spread into bit 4 of each byte, codes minus 16 with
 * __vsub4, dp4a against Q8_0 activations. 4 units in flight.
 */
#include "cuda/kernels.cuh"

struct fmt_q5_0 : smem_act<fmt_q5_0> {
    static constexpr int TYPE = MOE_TYPE_Q5_0, ACT = ACT_Q80, N = 4;
    static constexpr int BLOCK = 32, BODY = 16, META = 8, UNITS = 1;
    static void repack(const uint8_t *src, uint8_t *body, uint8_t *meta, int nb) {
        for (int b = 0; b < nb; b++) {
            const uint8_t *s = src + (size_t)b * 22;
            uint8_t *m = meta + (size_t)b * 8;
            memcpy(m, s, 2);
            m[2] = m[3] = 0;
            memcpy(m + 4, s + 2, 4);
            memcpy(body + (size_t)b * 16, s + 6, 16);
        }
    }
    struct raw {
        uint4 q;
        uint2 m;
    };
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *meta, int u) {
        raw r;
        r.q = M::u4(body + 16 * u);
        r.m = M::u8(meta + 8 * u);
        return r;
    }
    /* bits 0..3 of b to bit 4 of bytes 0..3 */
    static __device__ __forceinline__ unsigned spread(unsigned b) {
        return (b & 1) << 4 | (b & 2) << 11 | (b & 4) << 18 | (b & 8) << 25;
    }
    static __device__ __forceinline__ void codes(const raw &r, int i, unsigned *lo, unsigned *hi) {
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, qh = r.m.y;
        *lo = __vsub4((w[i] & 0x0f0f0f0f) | spread((qh >> (4 * i)) & 15), 0x10101010u);
        *hi = __vsub4(((w[i] >> 4) & 0x0f0f0f0f) | spread((qh >> (16 + 4 * i)) & 15), 0x10101010u);
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const int e = act_off + 32 * u;
        const int4 lo4 = *(const int4 *)(a.q + e), hi4 = *(const int4 *)(a.q + e + 16);
        const int al[4] = {lo4.x, lo4.y, lo4.z, lo4.w}, ah[4] = {hi4.x, hi4.y, hi4.z, hi4.w};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            unsigned lo, hi;
            codes(r, i, &lo, &hi);
            s = __dp4a((int)lo, al[i], s);
            s = __dp4a((int)hi, ah[i], s);
        }
        return (float)s * (h2f((uint16_t)(r.m.x & 0xffff)) * a.d[e >> 5]);
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const float d = h2f((uint16_t)(r.m.x & 0xffff));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            unsigned lo, hi;
            codes(r, i, &lo, &hi);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                out[32 * u + 4 * i + k] = (float)(int8_t)((lo >> (8 * k)) & 0xff) * d;
                out[32 * u + 16 + 4 * i + k] = (float)(int8_t)((hi >> (8 * k)) & 0xff) * d;
            }
        }
    }
};

DEFINE_CUDA_FORMAT(fmt_q5_0, q5_0)
