/*
 * q4_0.cu — Q4_0 on the GPU: the family twin of src/quant/q4_0.c.
 *
 * Device layout: the 18-byte GGUF block is split into a 16-byte body (the
 * nibbles: byte j holds element j low, element j + 16 high) and a 2-byte
 * meta (d). Unit = one block. Codes minus 8 with __vsub4, dp4a against
 * Q8_0 activations: sum * (d_w * d_a), as the CPU. 4 units in flight.
 */
#include "cuda/fp16_scale.cuh"

struct fmt_q4_0 : fp16_scale_block<16>, smem_act<fmt_q4_0> {
    static constexpr int TYPE = MOE_TYPE_Q4_0, ACT = ACT_Q80, N = 4;
    static constexpr int BLOCK = 32;
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const int e = act_off + 32 * u;
        const int4 lo4 = *(const int4 *)(a.q + e), hi4 = *(const int4 *)(a.q + e + 16);
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const int lo[4] = {lo4.x, lo4.y, lo4.z, lo4.w}, hi[4] = {hi4.x, hi4.y, hi4.z, hi4.w};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s = __dp4a((int)__vsub4(w[i] & 0x0f0f0f0f, 0x08080808u), lo[i], s);
            s = __dp4a((int)__vsub4((w[i] >> 4) & 0x0f0f0f0f, 0x08080808u), hi[i], s);
        }
        return (float)s * (h2f((uint16_t)r.d) * a.d[e >> 5]);
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const float d = h2f((uint16_t)r.d);
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        /* every lane's run starts on bank 0: rotated per lane, 2-way instead of 32-way */
        const int rot = threadIdx.x & 15;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int j = (i + rot) & 15, k = j >> 2;
            const unsigned wk = k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3];
            const unsigned byte = (wk >> (8 * (j & 3))) & 0xff;
            out[32 * u + j] = (float)((int)(byte & 15) - 8) * d;
            out[32 * u + 16 + j] = (float)((int)(byte >> 4) - 8) * d;
        }
    }
};

DEFINE_CUDA_FORMAT(fmt_q4_0, q4_0)
