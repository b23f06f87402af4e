/*
 * q8_0.cu — Q8_0 on the GPU: the family twin of src/quant/q8_0.c.
 *
 * Device layout: the 34-byte GGUF block is split into a 32-byte body (the
 * int8 codes) and a 2-byte meta (d, fp16): same bytes, 16-byte aligned.
 * Unit = one 16-byte half block (2 per block), so the lanes of a row read
 * consecutive 16-byte chunks; the two lanes of a block read its d from one
 * address. Against Q8_0 activations: sum_i q_i a_i * (d_w * d_a), as the
 * CPU, per half. 4 units per lane in flight.
 */
#include "cuda/fp16_scale.cuh"

struct fmt_q8_0 : fp16_scale_block<32>, smem_act<fmt_q8_0> {
    static constexpr int TYPE = MOE_TYPE_Q8_0, ACT = ACT_Q80, N = 4;
    static constexpr int BLOCK = 32;
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const int e = act_off + 16 * u;
        const int4 av = *(const int4 *)(a.q + e);
        int s = __dp4a((int)r.q.x, av.x, 0);
        s = __dp4a((int)r.q.y, av.y, s);
        s = __dp4a((int)r.q.z, av.z, s);
        s = __dp4a((int)r.q.w, av.w, s);
        return (float)s * (h2f((uint16_t)r.d) * a.d[e >> 5]);
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const float d = h2f((uint16_t)r.d);
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const int rot = (threadIdx.x >> 1) & 15; /* runs rotated per lane pair, as k_unit_dequant's */
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int i = (j + rot) & 15, k = i >> 2;
            const unsigned wk = k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3];
            out[16 * u + i] = (float)(int8_t)((wk >> (8 * (i & 3))) & 0xff) * d;
        }
    }
};

DEFINE_CUDA_FORMAT(fmt_q8_0, q8_0)
