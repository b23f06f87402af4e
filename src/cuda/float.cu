/*
 * float.cu — F32, F16 and BF16 on the GPU: the family twin of
 * src/quant/float.c.
 *
 * Device layout: rows as in the file (16-byte aligned when the row length
 * is a multiple of 4 (F32) or 8 (F16, BF16), which the upload checks).
 * Unit = 16 bytes (4 or 8 weights) against f32 activations in shared
 * memory, fused multiply-adds in f32: the CPU reference multiplies and adds
 * in f32 too, in another order. 4 units per lane in flight.
 */
#include "cuda/kernels.cuh"

struct fmt_f32 : smem_act<fmt_f32> {
    static constexpr int TYPE = MOE_TYPE_F32, ACT = ACT_F32, N = 4;
    static constexpr int BLOCK = 4, BODY = 16, META = 0, UNITS = 1;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q;
    };
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        return raw{M::u4(body + 16 * u)};
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const float4 x = *(const float4 *)(a.f + act_off + 4 * u);
        return __int_as_float((int)r.q.x) * x.x + __int_as_float((int)r.q.y) * x.y + __int_as_float((int)r.q.z) * x.z +
               __int_as_float((int)r.q.w) * x.w;
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        out[4 * u] = __int_as_float((int)r.q.x);
        out[4 * u + 1] = __int_as_float((int)r.q.y);
        out[4 * u + 2] = __int_as_float((int)r.q.z);
        out[4 * u + 3] = __int_as_float((int)r.q.w);
    }
};

/* F16 and BF16: 8 halves per unit, converted by `CONV` */
template <int T, bool BF>
struct fmt_half : smem_act<fmt_half<T, BF>> {
    static constexpr int TYPE = T, ACT = ACT_F32, N = 4;
    static constexpr int BLOCK = 8, BODY = 16, META = 0, UNITS = 1;
    static constexpr repack_fn repack = nullptr;
    struct raw {
        uint4 q;
    };
    static __device__ __forceinline__ float conv(unsigned bits) {
        return BF ? bf16_bits_to_f32(bits & 0xffff) : h2f((uint16_t)(bits & 0xffff));
    }
    template <class M = from_global>
    static __device__ __forceinline__ raw load(const uint8_t *body, const uint8_t *, int u) {
        return raw{M::u4(body + 16 * u)};
    }
    static __device__ __forceinline__ float dot(const raw &r, const act_view &a, int act_off, int u) {
        const float4 x0 = *(const float4 *)(a.f + act_off + 8 * u), x1 = *(const float4 *)(a.f + act_off + 8 * u + 4);
        float s = conv(r.q.x) * x0.x;
        s += conv(r.q.x >> 16) * x0.y;
        s += conv(r.q.y) * x0.z;
        s += conv(r.q.y >> 16) * x0.w;
        s += conv(r.q.z) * x1.x;
        s += conv(r.q.z >> 16) * x1.y;
        s += conv(r.q.w) * x1.z;
        s += conv(r.q.w >> 16) * x1.w;
        return s;
    }
    static __device__ __forceinline__ void dequant(const raw &r, int u, float *out) {
        const unsigned w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[8 * u + 2 * i] = conv(w[i]);
            out[8 * u + 2 * i + 1] = conv(w[i] >> 16);
        }
    }
};

typedef fmt_half<MOE_TYPE_F16, false> fmt_f16;
typedef fmt_half<MOE_TYPE_BF16, true> fmt_bf16;

DEFINE_CUDA_FORMAT(fmt_f32, f32)
DEFINE_CUDA_FORMAT(fmt_f16, f16)
DEFINE_CUDA_FORMAT(fmt_bf16, bf16)

/* ---------------------------------------------------------------- the router */

/* logits = W_r RMSNorm(x) for an F32 router; the expert launches route
 * from them. One block per expert with the row spread over all its
 * threads, so all of the router's loads are in flight at once: the
 * generic GEMV puts a router's 128 rows on 16 blocks, a warp a row, four
 * dependent round trips each. One pass over x after the wait: the norm's
 * scale factors out of the sum (logit = scale * sum w_i g_i x_i), so the
 * sum of squares (in double, as stage_act) and the dot share one block
 * reduction. */
#define ROUTER_THREADS 256

/* The block's sums of (ss, dot); every thread gets them. */
__device__ __forceinline__ void block_sum_pair(double *ss, float *dot, double *ss_scratch, float *dot_scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double s = warp_sum_double(*ss);
    float d = warp_sum(*dot);
    if (lane == 0) ss_scratch[warp] = s, dot_scratch[warp] = d;
    __syncthreads();
    s = lane < nw ? ss_scratch[lane] : 0.0;
    d = lane < nw ? dot_scratch[lane] : 0.0f;
    *ss = warp_sum_double(s);
    *dot = warp_sum(d);
}

__global__ void __launch_bounds__(ROUTER_THREADS) router_kernel(const gemv_args a) {
    __shared__ double ss_scratch[32];
    __shared__ float dot_scratch[32];
    const dmat &w = a.seg[0].w;
    const int n = a.in.n, e = blockIdx.x, tid = threadIdx.x;
    trace_mark(a.trace, TRACE_ENTRY);
    const float *row = (const float *)(w.body + (int64_t)e * w.row_stride);
    /* The row in registers before the wait (weights never depend on the
     * launch before): its DRAM round trip overlaps that launch and the norm. */
    constexpr int PER = 4; /* 16-byte loads a thread; rows longer than PER * 4 * ROUTER_THREADS loop */
    uint4 r[PER];
    float4 nw[PER]; /* and the norm's weights, which no launch writes */
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = (tid + k * ROUTER_THREADS) * 4;
        if (i < n) r[k] = ldg16(row + i), nw[k] = *(const float4 *)(a.in.norm + i);
    }
    pdl_wait();
    pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    double ss = 0.0;
    float dot = 0.0f;
    for (int k = 0, i = tid * 4; i < n; k++, i += ROUTER_THREADS * 4) {
        const float4 v = *(const float4 *)(a.in.src + i);
        uint4 c;
        float4 g;
        if (k < PER) {
#pragma unroll
            for (int j = 0; j < PER; j++)
                if (j == k) c = r[j], g = nw[j];
        } else {
            c = ldg16(row + i), g = *(const float4 *)(a.in.norm + i);
        }
        ss += squares4(v);
        dot += __int_as_float((int)c.x) * (v.x * g.x) + __int_as_float((int)c.y) * (v.y * g.y) +
               __int_as_float((int)c.z) * (v.z * g.z) + __int_as_float((int)c.w) * (v.w * g.w);
    }
    block_sum_pair(&ss, &dot, ss_scratch, dot_scratch);
    if (tid == 0) a.seg[0].out[e] = dot * rms_scale(ss, n, a.in.eps);
    trace_mark(a.trace, TRACE_WORKED);
}

bool cuda_router_fits(const gemv_args *a) {
    return a->n_seg == 1 && a->seg[0].w.type == MOE_TYPE_F32 && a->in.norm && a->in.n % 4 == 0 && !a->seg[0].bias &&
           !a->seg[0].accumulate;
}

void cuda_router(const gemv_args *a, cudaStream_t st, bool pdl) {
    LAUNCH_PDL(pdl, router_kernel, a->seg[0].w.rows, ROUTER_THREADS, 0, st, *a);
}

#define ROUTE_WARPS 8 /* tokens a block */

/* Warp w of block b routes token b * ROUTE_WARPS + w. */
static __global__ void route_kernel(route_spec r, int n_tokens, const float *logits, float *weights, int *ids) {
    pdl_wait();
    pdl_launch_dependents();
    const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= n_tokens) return;
    r.logits = logits + (int64_t)t * r.n_experts;
    route_warp(r, weights + (int64_t)t * r.k, ids + (int64_t)t * r.k);
}

void cuda_route(const route_spec *r, const float *logits, int n_tokens, float *weights, int *ids, cudaStream_t st,
                bool pdl) {
    LAUNCH_PDL(pdl, route_kernel, (n_tokens + ROUTE_WARPS - 1) / ROUTE_WARPS, 32 * ROUTE_WARPS, 0, st, *r, n_tokens,
               logits, weights, ids);
}
