/*
 * q6_k.cu — Q6_K on the GPU: the family twin of src/quant/q6_k.c.
 *
 * Device layout: the GGUF block is 210 bytes, not a multiple of 16, so it
 * is split: the body is its first 208 bytes (ql 0..127, qh 128..191,
 * scales 192..207, in GGUF order), the meta array holds d (fp16). Same
 * bytes as the file, all 16-byte aligned.
 *
 * Unit t (0..3) of a block: half hf = t / 2 and l = l0..l0+15 with
 * l0 = 16 (t % 2). Its three chunks ql[64hf + l], ql[64hf + 32 + l] and
 * qh[32hf + l] hold the four weights 128hf + 32k + l, k = 0..3: low
 * nibbles of the first chunk (k = 0) and of the second (k = 1), high
 * nibbles of the first (k = 2) and the second (k = 3), bits 2k..2k+1 of qh
 * on top. Each k is 16 weights of one sub-block j = 8hf + 2k + l0/16 with
 * its signed 8-bit scale from the scales chunk. dp4a of the codes against
 * Q8_K less 32 times the 16 activations' sum:  d * d8 * sum_k sc_j * dot_k.
 * 4 loads + a 2-byte meta load per unit, 2 units per lane in flight.
 */
#include "cuda/kernels.cuh"

struct fmt_q6_k {
    static constexpr int TYPE = MOE_TYPE_Q6_K, ACT = ACT_Q8K, N = 2;
    static constexpr int BLOCK = 256, BODY = 208, META = 2, UNITS = 4;
    static void repack(const uint8_t *src, uint8_t *body, uint8_t *meta, int nb) {
        for (int b = 0; b < nb; b++) {
            memcpy(body + (size_t)b * 208, src + (size_t)b * 210, 208);
            memcpy(meta + (size_t)b * 2, src + (size_t)b * 210 + 208, 2);
        }
    }
    struct raw {
        uint4 a, b, h, s;
        unsigned d;
    };
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *meta, int u) {
        const int blk = u >> 2, t = u & 3, hf = t >> 1, l0 = (t & 1) * 16;
        const uint8_t *p = body + blk * BODY;
        raw r;
        r.a = M::u4(p + 64 * hf + l0);
        r.b = M::u4(p + 64 * hf + 32 + l0);
        r.h = M::u4(p + 128 + 32 * hf + l0);
        r.s = M::u4(p + 192);
        r.d = M::u16(meta + 2 * blk);
        return r;
    }
    /* the 16 codes (0..63) of weights 128hf + 32k + l0 + i, 4 per word */
    static __device__ __forceinline__ void codes(const raw &r, int k, unsigned q[4]) {
        const unsigned A[4] = {r.a.x, r.a.y, r.a.z, r.a.w}, B[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
        const unsigned H[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            unsigned nib = k == 0 ? A[i] : k == 1 ? B[i] : k == 2 ? A[i] >> 4 : B[i] >> 4;
            q[i] = (nib & 0x0f0f0f0f) | (((H[i] >> (2 * k)) & 0x03030303) << 4);
        }
    }
    /* the signed scale of sub-block 8hf + 2k + t0: word 2hf + k / 2 of the
     * scales chunk, picked with selects (an array indexed at run time
     * would live in local memory) */
    static __device__ __forceinline__ int scale(const raw &r, int hf, int k, int t0) {
        const unsigned w = k < 2 ? (hf ? r.s.z : r.s.x) : (hf ? r.s.w : r.s.y);
        return (int)(int8_t)((w >> (8 * (2 * (k & 1) + t0))) & 0xff);
    }
    /* A unit's Q8_K activation, in registers: a kernel whose rows take one
     * batch each loads it once and multiplies every row with it (load_act,
     * dot_act: kernels.cuh), instead of reading it from shared memory per
     * row: the streamed head's warps waited on those loads most of all
     * (decode-plan fact 75). */
    struct act {
        int4 a[4];      /* codes of the activations of weights 128hf + 32k + l0 + i */
        int minus32[4]; /* -32 times each k's 16 codes' sum (the codes' offset) */
        float d;        /* the Q8_K block's scale */
        int t;          /* the unit's t */
    };
    static __device__ __forceinline__ act load_act(const act_view &a, int act_off, int u) {
        const int blk = u >> 2, t = u & 3, e0 = act_off + blk * 256 + 128 * (t >> 1) + (t & 1) * 16;
        act x;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x.a[k] = *(const int4 *)(a.q + e0 + 32 * k);
            x.minus32[k] = -32 * (int)a.s16[(e0 + 32 * k) >> 4];
        }
        x.d = a.d[(act_off + blk * 256) >> 8];
        x.t = t;
        return x;
    }
    /* (q - 32) . a as q . a - 32 sum(a): the 16 codes' sum is staged
     * (Q8_K's s16), and the per-byte subtraction was three of a word's six
     * instructions (the head is bound by them) */
    static __device__ __forceinline__ float dot_act(const raw &r, const act_view &, const act &x) {
        const int hf = x.t >> 1, t0 = x.t & 1;
        int sum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned q[4];
            codes(r, k, q);
            const int ai[4] = {x.a[k].x, x.a[k].y, x.a[k].z, x.a[k].w};
            int dk = x.minus32[k];
#pragma unroll
            for (int i = 0; i < 4; i++) dk = __dp4a((int)q[i], ai[i], dk);
            sum += scale(r, hf, k, t0) * dk;
        }
        return h2f((uint16_t)r.d) * x.d * (float)sum;
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        return dot_act(r, a, load_act(a, act_off, u));
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const int blk = u >> 2, t = u & 3, hf = t >> 1, l0 = (t & 1) * 16;
        const float d = h2f((uint16_t)r.d);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned q[4];
            codes(r, k, q);
            const float s = d * (float)scale(r, hf, k, l0 >> 4);
            float *y = out + blk * 256 + 128 * hf + 32 * k + l0;
            /* rotated per lane pair, as k_unit_dequant's runs (k_quant.cuh) */
            const int rot = (threadIdx.x >> 1) & 15;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int i = (j + rot) & 15, w = i >> 2;
                const unsigned qw = w == 0 ? q[0] : w == 1 ? q[1] : w == 2 ? q[2] : q[3];
                y[i] = s * (float)((int)((qw >> (8 * (i & 3))) & 0xff) - 32);
            }
        }
    }
};

/* The prefill's expert products from the codes (expert_codes.cuh): for
 * half hf and lane t's columns l = l0 + 4t .. + 3 of each run of 32, the
 * words of ql at 64 hf + l and 64 hf + 32 + l and of qh at 128 + 32 hf + l
 * hold the codes of weights 128 hf + 32 k + l, k = 0..3 (as codes above),
 * sub-block 8 hf + 2 k + l0 / 16 with scale d * sc: s q - 32 s. */
template <>
struct expert_codes<fmt_q6_k> {
    static constexpr bool value = true;
    template <class MATH, class MUL>
    static __device__ __forceinline__ void fragments(const uint8_t *ra, const uint8_t *rb, uint16_t ma, uint16_t mb, int t,
                                                     MUL mul) {
        const float da = h2f(ma), db = h2f(mb);
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int l0 = 0; l0 < 32; l0 += 16)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int l = l0 + 4 * t, ql = 64 * hf + 32 * (k & 1) + l, qh = 128 + 32 * hf + l, j = 8 * hf + 2 * k + l0 / 16;
                    const auto codes_of = [&](const uint8_t *row) {
                        return ((*(const unsigned *)(row + ql) >> 4 * (k >> 1)) & 0x0f0f0f0f) |
                               (((*(const unsigned *)(row + qh) >> 2 * k) & 0x03030303) << 4);
                    };
                    const float sa = da * (float)(int8_t)ra[192 + j], sb = db * (float)(int8_t)rb[192 + j];
                    ec_step<MATH>(codes_of(ra), codes_of(rb), MATH::of(sa, 32.0f * sa), MATH::of(sb, 32.0f * sb),
                                  128 * hf + 32 * k + l, mul);
                }
    }
};

DEFINE_CUDA_FORMAT(fmt_q6_k, q6_k)
