/*
 * q4_k.cu — Q4_K on the GPU: the family twin of src/quant/q4_k.c.
 *
 * Device layout: the GGUF block as it is (144 bytes = 9 x 16: a 16-byte
 * header d | dmin | 12 bytes of packed 6-bit scales and mins, then 128
 * bytes of nibbles), so rows are copied, not repacked. No meta array.
 *
 * Unit g (0..3) of a block is group g: its 32 bytes of nibbles 32g..32g+31
 * (two loads, both halves of the group; see k_quant.cuh), whose low
 * nibbles are sub-block 2g and high nibbles 2g + 1, so the unit's scales
 * are decoded once. The 4 lanes of a block load its header from one
 * address. 3 loads per unit, 2 units per lane in flight (N = 2).
 *
 * The two 16-byte halves of a lane's unit share 32-byte sectors that the
 * neighbouring loads of the warp only half use, so they go through L1
 * (the second load finds the sector the first brought).
 */
#include "cuda/kernels.cuh"
#include "cuda/k_quant.cuh"

struct fmt_q4_k {
    static constexpr int TYPE = MOE_TYPE_Q4_K, ACT = ACT_Q8K, N = 2;
    static constexpr int BLOCK = 256, BODY = 144, META = 0, UNITS = 4;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q[2], h;
    };
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        const uint8_t *blk = body + (u >> 2) * BODY;
        raw r;
        r.q[0] = ldg16_l1(blk + 16 + 32 * (u & 3));
        r.q[1] = ldg16_l1(blk + 32 + 32 * (u & 3));
        r.h = ldg16(blk);
        return r;
    }
    /* codes of the group's halves: 16 low-nibble and 16 high-nibble weights each, 4 per word */
    static __device__ __forceinline__ void codes(const raw &r, unsigned (&lo)[2][4], unsigned (&hi)[2][4]) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const unsigned w[4] = {r.q[k].x, r.q[k].y, r.q[k].z, r.q[k].w};
#pragma unroll
            for (int i = 0; i < 4; i++) lo[k][i] = w[i] & 0x0f0f0f0f, hi[k][i] = (w[i] >> 4) & 0x0f0f0f0f;
        }
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        unsigned lo[2][4], hi[2][4];
        codes(r, lo, hi);
        return k_group_dot<2>(r.h, lo, hi, a, act_off, u >> 2, u & 3, 0);
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        unsigned lo[2][4], hi[2][4];
        codes(r, lo, hi);
        k_group_dequant<2>(r.h, lo, hi, u >> 2, u & 3, 0, out);
    }
};

DEFINE_CUDA_FORMAT(fmt_q4_k, q4_k)
