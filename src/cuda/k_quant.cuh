/*
 * k_quant.cuh — what the K-quant family files (q4_k.cu, q5_k.cu) share on
 * the device: the 6-bit scales and mins of sub-block j from a block's
 * 16-byte header (bytes 4..15 = h.y, h.z, h.w), the values k_scale_min_get
 * in src/quant/k_quant.h reads, and a unit's dot product and
 * dequantization once the format has unpacked its codes.
 *
 * Unit u of a block (8 a block) covers group g = (u % 8) / 2 of 64 weights,
 * half hh = u % 2: codes lo[] are weights 64g + 16hh + i (sub-block 2g),
 * hi[] weights 64g + 32 + 16hh + i (sub-block 2g + 1), four a word.
 * Against Q8_K activations (k_combine), with dot_* from 4 dp4a each and
 * s_* the activation sums of those 16. The prefill's tensor-core operands
 * of both formats come from k_scale_min_fragments.
 */
#ifndef MOE_CUDA_K_QUANT_CUH
#define MOE_CUDA_K_QUANT_CUH

#include "cuda/kernels.cuh"

/* The scales and mins of sub-blocks 2g and 2g + 1 (g = 0..3), packed as
 * the bytes sc0 | sc1 << 8 | m0 << 16 | m1 << 24 (6 bits each), the form
 * k_combine multiplies with two dp2a. Without branches (lanes of a warp
 * work on different groups; a branch on g would run both ways):
 * sub-blocks 0..3 are the low 6 bits of bytes of h.y (mins h.z); 4..7
 * take 4 bits from h.w (low nibbles scales, high mins) and 2 from the top
 * of the bytes of h.y (h.z). `second` is all ones for g >= 2, so the
 * choice is a bitwise select; one byte permutation picks the pair. */
__device__ __forceinline__ unsigned k_group_scales(const uint4 &h, int g) {
    const unsigned second = 0u - (unsigned)(g >> 1);
    const unsigned sc = (((h.w & 0x0f0f0f0f) | ((h.y >> 2) & 0x30303030)) & second) | (h.y & 0x3f3f3f3f & ~second);
    const unsigned mn = ((((h.w >> 4) & 0x0f0f0f0f) | ((h.z >> 2) & 0x30303030)) & second) | (h.z & 0x3f3f3f3f & ~second);
    return __byte_perm(sc, mn, 0x5410 + 0x2222 * (g & 1));
}

/* A unit's Q8_K activation, in registers: a kernel loads it once and
 * multiplies every row it visits with it (load_act, dot_act: kernels.cuh). */
struct k_act {
    int4 lo, hi; /* codes of the activations of the unit's lo and hi weights */
    int sums;    /* the sums of those 16 and 16 codes: lo | hi << 16 */
    float d;     /* the Q8_K block's scale */
    int g;       /* the unit's group of 64 weights */
};

__device__ __forceinline__ k_act k_load_act(const act_view &a, int act_off, int u) {
    const int b = u >> 3, c = u & 7, g = c >> 1, hh = c & 1;
    const int e = act_off + b * 256 + 64 * g + 16 * hh;
    k_act x;
    x.lo = *(const int4 *)(a.q + e);
    x.hi = *(const int4 *)(a.q + e + 32);
    x.sums = (a.s16[e >> 4] & 0xffff) | (int)((unsigned)a.s16[(e + 32) >> 4] << 16);
    x.d = a.d[(act_off + b * 256) >> 8];
    x.g = g;
    return x;
}

/* The unit's contribution from its two integer dot products, with dm
 * the block's d | dmin << 16 (fp16) and sm its group's packed scales:
 *     d8 * (d * (sc0 * dot_lo + sc1 * dot_hi) - dmin * (m0 * s_lo + m1 * s_hi))
 * Both integer sums are one dp2a each: |dot_*| <= 16 * 15 * 127 and the
 * activation sums fit 16 bits. */
__device__ __forceinline__ float k_combine(unsigned dm, unsigned sm, int dot_lo, int dot_hi, const k_act &x) {
    const int sum_q = __dp2a_lo((int)__byte_perm((unsigned)dot_lo, (unsigned)dot_hi, 0x5410), (int)sm, 0);
    const int sum_m = __dp2a_hi(x.sums, (int)sm, 0);
    const float d = h2f((uint16_t)(dm & 0xffff)) * x.d, dmin = h2f((uint16_t)(dm >> 16)) * x.d;
    return d * (float)sum_q - dmin * (float)sum_m;
}

__device__ __forceinline__ void k_unit_dequant(const uint4 &h, const unsigned lo[4], const unsigned hi[4], int u,
                                               float *out) {
    const int b = u >> 3, c = u & 7, g = c >> 1, hh = c & 1;
    const unsigned sm = k_group_scales(h, g);
    const float d = h2f((uint16_t)(h.x & 0xffff)), dmin = h2f((uint16_t)(h.x >> 16));
    const float s0 = d * (sm & 0xff), n0 = dmin * ((sm >> 16) & 0xff), s1 = d * ((sm >> 8) & 0xff),
                n1 = dmin * (sm >> 24);
    float *y = out + b * 256 + 64 * g + 16 * hh;
    /* Each pair of lanes starts its run at another of the 16 places: the
     * runs of a warp's units start on bank 0 or 16 (hh), so in order every
     * store of the warp would hit two banks (16-way conflicts writing to
     * shared memory, dequant.cuh); rotated, its 32 lanes hit 32. */
    const int rot = (threadIdx.x >> 1) & 15;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        const int i = (k + rot) & 15, w = i >> 2, shift = 8 * (i & 3);
        const unsigned lw = w == 0 ? lo[0] : w == 1 ? lo[1] : w == 2 ? lo[2] : lo[3];
        const unsigned hw = w == 0 ? hi[0] : w == 1 ? hi[1] : w == 2 ? hi[2] : hi[3];
        y[i] = s0 * (float)((lw >> shift) & 0xff) - n0;
        y[32 + i] = s1 * (float)((hw >> shift) & 0xff) - n1;
    }
}

/* The prefill's A fragments of a Q4_K or Q5_K block (expert_codes.cuh's
 * fragments): four groups of 64 columns, each a sub-block of low codes
 * and one of high codes with a 6-bit scale and min from the 16-byte
 * header (d | dmin | packed scales). CODES::at(row, g, h, t) gives lane
 * t's word of group g's low codes (.x, columns 64 g + 16 h + 4 t .. + 3)
 * and of its high codes (.y, 32 columns further on). */
template <class MATH, class CODES, class MUL>
__device__ __forceinline__ void k_scale_min_fragments(const uint8_t *ra, const uint8_t *rb, int t, MUL &mul) {
    const uint4 ha = *(const uint4 *)ra, hb = *(const uint4 *)rb;
    const float da = h2f((uint16_t)(ha.x & 0xffff)), dmina = h2f((uint16_t)(ha.x >> 16));
    const float db = h2f((uint16_t)(hb.x & 0xffff)), dminb = h2f((uint16_t)(hb.x >> 16));
#pragma unroll
    for (int g = 0; g < 4; g++) {
        const unsigned sa = k_group_scales(ha, g), sb = k_group_scales(hb, g);
        const typename MATH::scale lo_a = MATH::of(da * (float)(sa & 0xff), dmina * (float)((sa >> 16) & 0xff));
        const typename MATH::scale lo_b = MATH::of(db * (float)(sb & 0xff), dminb * (float)((sb >> 16) & 0xff));
        const typename MATH::scale hi_a = MATH::of(da * (float)((sa >> 8) & 0xff), dmina * (float)(sa >> 24));
        const typename MATH::scale hi_b = MATH::of(db * (float)((sb >> 8) & 0xff), dminb * (float)(sb >> 24));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int col = 64 * g + 16 * h + 4 * t;
            const uint2 wa = CODES::at(ra, g, h, t), wb = CODES::at(rb, g, h, t);
            ec_step<MATH>(wa.x, wb.x, lo_a, lo_b, col, mul);
            ec_step<MATH>(wa.y, wb.y, hi_a, hi_b, col + 32, mul);
        }
    }
}

/* expert_codes of a format whose blocks k_scale_min_fragments reads. */
template <class CODES>
struct k_scale_min_codes {
    static constexpr bool value = true;
    template <class MATH, class MUL>
    static __device__ __forceinline__ void fragments(const uint8_t *ra, const uint8_t *rb, uint16_t, uint16_t, int t,
                                                     MUL mul) {
        k_scale_min_fragments<MATH, CODES>(ra, rb, t, mul);
    }
};

#endif
