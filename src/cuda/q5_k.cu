/*
 * q5_k.cu — Q5_K on the GPU: the family twin of src/quant/q5_k.c.
 *
 * Device layout: the GGUF block as it is (176 bytes = 11 x 16: header,
 * 32 bytes of fifth bits qh, 128 bytes of nibbles). No meta array.
 *
 * Unit c (0..7): nibble chunk c (bytes 48 + 16c), the 16 qh bytes of the
 * same l range (16 + 16 (c % 2)) and the header: as Q4_K's unit, with bit
 * 2g (low nibbles) or 2g + 1 (high nibbles) of each qh byte as the code's
 * bit 4. 3 loads per unit, 2 units per lane in flight.
 */
#include "cuda/kernels.cuh"
#include "cuda/k_quant.cuh"

struct fmt_q5_k {
    static constexpr int TYPE = MOE_TYPE_Q5_K, ACT = ACT_Q8K, N = 2;
    static constexpr int BLOCK = 256, BODY = 176, META = 0, UNITS = 8;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q, qh, h;
    };
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        const uint8_t *blk = body + (u >> 3) * BODY;
        raw r;
        r.q = M::u4(blk + 48 + 16 * (u & 7));
        r.qh = M::u4(blk + 16 + 16 * (u & 1));
        r.h = M::u4(blk);
        return r;
    }
    /* codes of the unit's 16 low-nibble and 16 high-nibble weights, 4 per word */
    static __device__ __forceinline__ void codes(const raw &r, int g, unsigned lo[4], unsigned hi[4]) {
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = (w[i] & 0x0f0f0f0f) | (((qh[i] >> (2 * g)) & 0x01010101) << 4);
            hi[i] = ((w[i] >> 4) & 0x0f0f0f0f) | (((qh[i] >> (2 * g + 1)) & 0x01010101) << 4);
        }
    }
    typedef k_act act;
    static __device__ __forceinline__ act load_act(const act_view &a, int act_off, int u) {
        return k_load_act(a, act_off, u);
    }
    static __device__ __forceinline__ float dot_act(const raw &r, const act_view &, const act &x) {
        unsigned lo[4], hi[4];
        codes(r, x.g, lo, hi);
        const int al[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w}, ah[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
        int dot_lo = 0, dot_hi = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            dot_lo = __dp4a((int)lo[i], al[i], dot_lo);
            dot_hi = __dp4a((int)hi[i], ah[i], dot_hi);
        }
        return k_combine(r.h.x, k_group_scales(r.h, x.g), dot_lo, dot_hi, x);
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        return dot_act(r, a, load_act(a, act_off, u));
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        unsigned lo[4], hi[4];
        codes(r, (u & 7) >> 1, lo, hi);
        k_unit_dequant(r.h, lo, hi, u, out);
    }
};

/* The prefill's expert products from the codes (expert_codes.cuh): as
 * Q4_K's (nibbles at byte 48 on), with bit 2g (low codes) or 2g + 1 (high
 * codes) of qh byte 16 h + 4 t + i as the code's bit 4. */
struct q5_k_codes {
    static __device__ __forceinline__ uint2 at(const uint8_t *row, int g, int h, int t) {
        const unsigned w = *(const unsigned *)(row + 48 + 32 * g + 16 * h + 4 * t);
        const unsigned qh = *(const unsigned *)(row + 16 + 16 * h + 4 * t);
        return make_uint2((w & 0x0f0f0f0f) | (((qh >> (2 * g)) & 0x01010101) << 4),
                          ((w >> 4) & 0x0f0f0f0f) | (((qh >> (2 * g + 1)) & 0x01010101) << 4));
    }
};
template <>
struct expert_codes<fmt_q5_k> : k_scale_min_codes<q5_k_codes> {};

DEFINE_CUDA_FORMAT(fmt_q5_k, q5_k)
