/*
 * q4_k.cu — Q4_K on the GPU: the family twin of src/quant/q4_k.c.
 *
 * Device layout: the GGUF block as it is (144 bytes = 9 x 16: a 16-byte
 * header d | dmin | 12 bytes of packed 6-bit scales and mins, then 128
 * bytes of nibbles), so rows are copied, not repacked. No meta array.
 *
 * Unit c (0..7) of a block is its 16-byte chunk of nibbles 16c..16c+15:
 * group g = c / 2 of 64 weights, half hh = c % 2; low nibbles are weights
 * 64g + 16hh + i (sub-block 2g), high nibbles 64g + 32 + 16hh + i
 * (sub-block 2g + 1), i = 0..15. The 8 lanes of a block load its header
 * from one address. Against Q8_K activations:
 *     d8 * (d * (sc0 * dot_lo + sc1 * dot_hi) - dmin * (m0 * s_lo + m1 * s_hi))
 * with dot_* from 4 dp4a each and s_* the activation sums of those 16.
 * 2 loads per unit, 4 units per lane in flight (N = 4).
 */
#include "cuda/kernels.cuh"
#include "cuda/k_quant.cuh"

struct fmt_q4_k {
    static constexpr int TYPE = MOE_TYPE_Q4_K, ACT = ACT_Q8K, N = 4;
    static constexpr int BLOCK = 256, BODY = 144, META = 0, UNITS = 8;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q, h;
    };
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        const uint8_t *blk = body + (u >> 3) * BODY;
        raw r;
        r.q = ldg16(blk + 16 + 16 * (u & 7));
        r.h = ldg16(blk);
        return r;
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const int b = u >> 3, c = u & 7, g = c >> 1, hh = c & 1;
        int sc0, m0, sc1, m1;
        k_scale_min(r.h, 2 * g, &sc0, &m0);
        k_scale_min(r.h, 2 * g + 1, &sc1, &m1);
        const int e = act_off + b * 256 + 64 * g + 16 * hh;
        const int4 lo = *(const int4 *)(a.q + e), hi = *(const int4 *)(a.q + e + 32);
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const int al[4] = {lo.x, lo.y, lo.z, lo.w}, ah[4] = {hi.x, hi.y, hi.z, hi.w};
        int dot_lo = 0, dot_hi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            dot_lo = __dp4a((int)(w[i] & 0x0f0f0f0f), al[i], dot_lo);
            dot_hi = __dp4a((int)((w[i] >> 4) & 0x0f0f0f0f), ah[i], dot_hi);
        }
        const int sum_q = sc0 * dot_lo + sc1 * dot_hi;
        const int sum_m = m0 * a.s16[e >> 4] + m1 * a.s16[(e + 32) >> 4];
        const float ad = a.d[(act_off + b * 256) >> 8];
        const float d = h2f((uint16_t)(r.h.x & 0xffff)) * ad, dmin = h2f((uint16_t)(r.h.x >> 16)) * ad;
        return d * (float)sum_q - dmin * (float)sum_m;
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const int b = u >> 3, c = u & 7, g = c >> 1, hh = c & 1;
        int sc0, m0, sc1, m1;
        k_scale_min(r.h, 2 * g, &sc0, &m0);
        k_scale_min(r.h, 2 * g + 1, &sc1, &m1);
        const float d = h2f((uint16_t)(r.h.x & 0xffff)), dmin = h2f((uint16_t)(r.h.x >> 16));
        const float s0 = d * sc0, n0 = dmin * m0, s1 = d * sc1, n1 = dmin * m1;
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        float *y = out + b * 256 + 64 * g + 16 * hh;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            unsigned byte = (w[i >> 2] >> (8 * (i & 3))) & 0xff;
            y[i] = s0 * (float)(byte & 15) - n0;
            y[32 + i] = s1 * (float)(byte >> 4) - n1;
        }
    }
};

DEFINE_CUDA_FORMAT(fmt_q4_k, q4_k)
