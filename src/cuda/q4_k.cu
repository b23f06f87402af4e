/*
 * q4_k.cu — Q4_K on the GPU: the family twin of src/quant/q4_k.c.
 *
 * Device layout: the GGUF block as it is (144 bytes = 9 x 16: a 16-byte
 * header d | dmin | 12 bytes of packed 6-bit scales and mins, then 128
 * bytes of nibbles), so rows are copied, not repacked. No meta array.
 *
 * Unit c (0..7) of a block is its 16-byte chunk of nibbles 16c..16c+15:
 * the low nibbles are the unit's lo codes, the high ones its hi codes (see
 * k_quant.cuh for the unit's weights and its dot product). The 8 lanes of
 * a block load its header from one address. 2 loads per unit, 4 units per
 * lane in flight (N = 4). The unit's activation can live in registers
 * (act, k_act): kernels that visit many rows with the same units load it
 * once. A unit loaded before a kernel's wait is prepared there (prep: its
 * group's scales and mins decoded, 6 registers instead of 8), so that
 * after the wait only the dot products and their combination remain.
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
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        const uint8_t *blk = body + (u >> 3) * BODY;
        raw r;
        r.q = M::u4(blk + 16 + 16 * (u & 7));
        r.h = M::u4(blk);
        return r;
    }
    /* The unit with the scales of its group g decoded (unit_prep): what a
     * kernel makes of the batches it loads before its wait, so that the
     * decoding is done there and not after it. */
    struct prep {
        uint4 q;
        unsigned dm, sm; /* d | dmin << 16; k_group_scales */
    };
    static __device__ __forceinline__ prep prepare(const raw &r, int g) { return prep{r.q, r.h.x, k_group_scales(r.h, g)}; }
    /* Against activations in registers: the low nibbles as they are, the
     * high ones masked in place (16 times the code, an unsigned byte) and
     * the sum divided by 16, exactly: no shift per word. */
    typedef k_act act;
    static __device__ __forceinline__ act load_act(const act_view &a, int act_off, int u) {
        return k_load_act(a, act_off, u);
    }
    static __device__ __forceinline__ float dot_act(const prep &p, const act_view &, const act &x) {
        const unsigned w[4] = {p.q.x, p.q.y, p.q.z, p.q.w};
        const int al[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w}, ah[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
        int dot_lo = 0, dot_hi16 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            dot_lo = __dp4a((int)(w[i] & 0x0f0f0f0f), al[i], dot_lo);
            dot_hi16 = dp4a_u8s8(w[i] & 0xf0f0f0f0, ah[i], dot_hi16);
        }
        return k_combine(p.dm, p.sm, dot_lo, dot_hi16 >> 4, x);
    }
    static __device__ __forceinline__ float dot_act(const raw &r, const act_view &a, const act &x) {
        return dot_act(prepare(r, x.g), a, x);
    }
    template <class R>
    static __device__ __forceinline__ float dot(const R &r, const act_view &a, int act_off, int u) {
        return dot_act(r, a, load_act(a, act_off, u));
    }
    /* codes of the unit's 16 low-nibble and 16 high-nibble weights, 4 per word */
    static __device__ __forceinline__ void codes(const raw &r, unsigned lo[4], unsigned hi[4]) {
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) lo[i] = w[i] & 0x0f0f0f0f, hi[i] = (w[i] >> 4) & 0x0f0f0f0f;
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        unsigned lo[4], hi[4];
        codes(r, lo, hi);
        k_unit_dequant(r.h, lo, hi, u, out);
    }
};

template <>
struct row_ahead<fmt_q4_k> {
    static constexpr bool value = true;
};

template <>
struct unit_prep<fmt_q4_k> {
    typedef fmt_q4_k::prep type;
    static __device__ __forceinline__ type of(const fmt_q4_k::raw &r, int u) { return fmt_q4_k::prepare(r, (u & 7) >> 1); }
    static __device__ __forceinline__ void pin(type &p) {
        pin_reg(p.dm);
        pin_reg(p.sm);
    }
};

/* A unit of a row in shared memory (moe_ffn.cuh): the same two 16-byte
 * words, read from there. */
template <>
struct shared_units<fmt_q4_k> {
    static constexpr bool value = true;
    static __device__ __forceinline__ fmt_q4_k::raw load(const uint8_t *row, int u) {
        const uint8_t *blk = row + (u >> 3) * fmt_q4_k::BODY;
        return fmt_q4_k::raw{*(const uint4 *)(blk + 16 + 16 * (u & 7)), *(const uint4 *)blk};
    }
};

/* The prefill's expert products from the codes (expert_codes.cuh): group
 * g's 32 bytes of nibbles, lane t's word of each half h (bytes 16 h + 4 t
 * on), are the low codes of sub-block 2g and the high codes of 2g + 1. */
struct q4_k_codes {
    static __device__ __forceinline__ uint2 at(const uint8_t *row, int g, int h, int t) {
        const unsigned w = *(const unsigned *)(row + 16 + 32 * g + 16 * h + 4 * t);
        return make_uint2(w & 0x0f0f0f0f, (w >> 4) & 0x0f0f0f0f);
    }
};
template <>
struct expert_codes<fmt_q4_k> : k_scale_min_codes<q4_k_codes> {};

DEFINE_CUDA_FORMAT(fmt_q4_k, q4_k)
