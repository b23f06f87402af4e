/*
 * iq4_nl.cu — IQ4_NL on the GPU: the family twin of src/quant/iq4_nl.c.
 *
 * Device layout: as Q4_0 (16-byte body of nibbles, 2-byte meta d). The
 * nibbles index GGML's 16-entry int8 codebook; four lookups at a time are
 * three __byte_perm of the table held as four immediates (no memory
 * lookups), then dp4a against Q8_0 activations. 4 units in flight.
 */
#include "cuda/fp16_scale.cuh"

static constexpr unsigned pack4(int a, int b, int c, int d) {
    return (unsigned)(a & 0xff) | (unsigned)(b & 0xff) << 8 | (unsigned)(c & 0xff) << 16 | (unsigned)(d & 0xff) << 24;
}

struct fmt_iq4_nl : fp16_scale_block<16>, smem_act<fmt_iq4_nl> {
    static constexpr int TYPE = MOE_TYPE_IQ4_NL, ACT = ACT_Q80, N = 4;
    static constexpr int BLOCK = 32;
    static constexpr unsigned T0 = pack4(-127, -104, -83, -65), T1 = pack4(-49, -35, -22, -10);
    static constexpr unsigned T2 = pack4(1, 13, 25, 38), T3 = pack4(53, 69, 89, 113);
    /* codebook values of the four nibbles of the low 16 bits of v */
    static __device__ __forceinline__ unsigned lookup4(unsigned v) {
        const unsigned lo = __byte_perm(T0, T1, v), hi = __byte_perm(T2, T3, v);
        return __byte_perm(lo, hi, 0x3210u | ((v & 0x8888u) >> 1));
    }
    /* byte j of w: low nibble -> element j (lo), high -> element j + 16 (hi) */
    static __device__ __forceinline__ void values(unsigned w, unsigned *lo, unsigned *hi) {
        const unsigned t0 = lookup4(w & 0xffff), t1 = lookup4(w >> 16);
        *lo = __byte_perm(t0, t1, 0x6420u);
        *hi = __byte_perm(t0, t1, 0x7531u);
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const int e = act_off + 32 * u;
        const int4 lo4 = *(const int4 *)(a.q + e), hi4 = *(const int4 *)(a.q + e + 16);
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const int al[4] = {lo4.x, lo4.y, lo4.z, lo4.w}, ah[4] = {hi4.x, hi4.y, hi4.z, hi4.w};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            unsigned lo, hi;
            values(w[i], &lo, &hi);
            s = __dp4a((int)lo, al[i], s);
            s = __dp4a((int)hi, ah[i], s);
        }
        return (float)s * (h2f((uint16_t)r.d) * a.d[e >> 5]);
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const float d = h2f((uint16_t)r.d);
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            unsigned lo, hi;
            values(w[i], &lo, &hi);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                out[32 * u + 4 * i + k] = (float)(int8_t)((lo >> (8 * k)) & 0xff) * d;
                out[32 * u + 16 + 4 * i + k] = (float)(int8_t)((hi >> (8 * k)) & 0xff) * d;
            }
        }
    }
};

DEFINE_CUDA_FORMAT(fmt_iq4_nl, iq4_nl)
