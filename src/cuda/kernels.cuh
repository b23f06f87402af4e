/*
 * kernels.cuh — the matrix-vector kernels of the decode step, written once
 * and instantiated per weight format by the family files (q4_k.cu, ...).
 *
 * Device layout of a weight matrix (see cuda_model.cu, which uploads it):
 * each row is `nb` blocks of the format; a block is split into a BODY of a
 * multiple of 16 bytes (the codes, and for the K-quants with a min their
 * 16-byte header) and an optional small META (the fp16 scale of the
 * 32-element families and of Q6_K, plus Q5_0's fifth bits) kept in a
 * separate array. Rows of bodies are 16-byte aligned, so every weight byte
 * is read with one coalesced 16-byte load; formats whose GGUF blocks are
 * already multiples of 16 bytes (Q4_K 144, Q5_K 176, the float types) are
 * copied as they are. Routed experts are one slab per layer and projection,
 * expert e at e * expert_stride.
 *
 * A row is cut into UNITS: one 16-byte body chunk (Q6_K: three) plus the
 * block's header or meta, which the lanes working on one block load from
 * the same address (one transaction). L lanes (a power of two, chosen per
 * launch from the row length) share a row: lane `sub` takes units sub,
 * sub + L, ..., N of them per batch, all N loads issued before the first
 * is used, then the L partial sums are reduced with shuffles. A warp thus
 * works on 32 / L rows at once; grids are sized to the occupancy and loop
 * over rows (persistent), so the activation is staged once per block.
 *
 * Activations: every block reads the f32 input (the residual stream, or
 * the FFN hidden state), applies the RMSNorm when asked, and quantizes it
 * into shared memory exactly as the CPU reference does for the format's
 * dot type: Q8_K (256 per block, f32 scale, sums of 16) for the K-quants,
 * Q8_0 (32 per block, fp16 scale) for Q8_0, Q4_0, Q5_0 and IQ4_NL, f32 for
 * the float types. Same input, same codes, so the integer dot products are
 * those of the CPU and only the order of float additions differs (the GPU
 * and the CPU agree to ~1e-6 relative; see tests/test_cuda_kernels.c).
 * Redundant across blocks (a few KB read from L2 each), but it removes a
 * launch and a dependent step from every matrix product.
 *
 * Three kernels use this machinery:
 *   gemv_kernel     y = W x (+ bias) (+= into y): q|k|v, o + residual,
 *                   the router (last block: softmax/sigmoid, top-k,
 *                   weights), the output head (last block: argmax).
 *   ffn_up_kernel   h = silu(G x) * (U x) for the k routed experts read by
 *                   id from device memory, plus the shared expert, in one
 *                   launch; block 0 also computes the shared expert's
 *                   sigmoid gate.
 *   ffn_down_kernel x += sum_j w_j D_{id_j} h_j + g * D_sh h_sh: every
 *                   output row reads the k experts' rows (flattened into
 *                   one stream of units) and writes the residual once, no
 *                   atomics, deterministic.
 */
#ifndef MOE_CUDA_KERNELS_CUH
#define MOE_CUDA_KERNELS_CUH

#include <math.h>

#include "cuda/cuda_compat.cuh"
#include "cuda/cuda_internal.h"

#define GEMV_THREADS 512
#define GEMV_WARPS (GEMV_THREADS / 32)

/* ---------------------------------------------------------------- activations */

/* Where the staged activation of n elements lives in shared memory. */
struct act_view {
    const int8_t *q;    /* codes (Q8_K, Q8_0) */
    const float *d;     /* scale per 256 (Q8_K) or per 32 (Q8_0) */
    const int16_t *s16; /* Q8_K: sum of each 16 codes */
    const float *f;     /* f32 activations */
};

__device__ __forceinline__ act_view act_view_of(int kind, uint8_t *smem, int n) {
    act_view v = {NULL, NULL, NULL, NULL};
    if (kind == ACT_F32) {
        v.f = (const float *)smem;
    } else {
        v.q = (const int8_t *)smem;
        v.d = (const float *)(smem + align16((size_t)n));
        if (kind == ACT_Q8K) v.s16 = (const int16_t *)(smem + align16((size_t)n) + align16((size_t)n / 256 * 4));
    }
    return v;
}

/* A reduction over the block by a warp reduction; every thread gets the
 * result. scratch: 32 values. */
template <class T, class WarpReduce>
__device__ __forceinline__ T block_reduce(T v, T *scratch, T identity, WarpReduce warp_reduce) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_reduce(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : identity;
    return warp_reduce(v);
}

__device__ __forceinline__ float block_sum(float v, float *scratch) {
    return block_reduce(v, scratch, 0.0f, [](float x) { return warp_sum(x); });
}

__device__ __forceinline__ float block_max(float v, float *scratch) {
    return block_reduce(v, scratch, -INFINITY, [](float x) { return warp_max(x); });
}

/* Sums in double: the RMSNorm's sum of squares. The CPU sums squares in
 * double, which makes the sum all but independent of the order; doing the
 * same here makes the norm's scale bit-identical to the CPU's, so the
 * activations quantized after a norm get the CPU's codes exactly. */
__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ double block_sum_double(double v, double *scratch) {
    return block_reduce(v, scratch, 0.0, [](double x) { return warp_sum_double(x); });
}

/* Sum of squares of n floats in double, the warp striding over them. */
__device__ __forceinline__ double sum_squares_strided(const float *x, int n, int lane) {
    double ss = 0.0;
    for (int i = lane; i < n; i += 32) ss += (double)x[i] * x[i];
    return warp_sum_double(ss);
}

/* The RMSNorm scale of n values whose squares sum to ss, in double as
 * cpu_rmsnorm computes it: the CPU's scale bit for bit. */
__device__ __forceinline__ float rms_scale(double ss, int n, float eps) {
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}


/* Normalise and quantize `in` into shared memory as `kind`. When gate_w is
 * given, also computes sigmoid(dot(normalised input, gate_w)) and block 0
 * stores it in *gate_out (the shared expert's gate). Ends with a barrier. */
__device__ __forceinline__ void stage_act(int kind, const act_in &in, uint8_t *smem, const float *gate_w,
                                          float *gate_out) {
    const int n = in.n, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    float *scratch = (float *)(smem + act_bytes(kind, n));
    float scale = 1.0f;
    if (in.norm) {
        double ss = 0.0;
                for (int i = tid * 4; i < n; i += nt * 4) {
            float4 v = *(const float4 *)(in.src + i);
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        scale = rms_scale(block_sum_double(ss, (double *)scratch), n, in.eps);
    }
    if (gate_w) {
        float dot = 0.0f;
        for (int i = tid; i < n; i += nt) {
            float v = in.src[i];
            if (in.norm) v = v * scale * in.norm[i];
            dot += v * gate_w[i];
        }
        dot = block_sum(dot, scratch);
        if (tid == 0 && blockIdx.x == 0) *gate_out = 1.0f / (1.0f + expf(-dot));
    }
    if (kind == ACT_F32) {
        float *f = (float *)smem;
        for (int i = tid * 4; i < n; i += nt * 4) {
            float4 v = *(const float4 *)(in.src + i);
            if (in.norm) {
                float4 w = *(const float4 *)(in.norm + i);
                v.x = v.x * scale * w.x, v.y = v.y * scale * w.y, v.z = v.z * scale * w.z, v.w = v.w * scale * w.w;
            }
            *(float4 *)(f + i) = v;
        }
        __syncthreads();
        return;
    }
    int8_t *q = (int8_t *)smem;
    float *d = (float *)(smem + align16((size_t)n));
    int16_t *s16 = (int16_t *)(smem + align16((size_t)n) + align16((size_t)n / 256 * 4));
    /* A warp takes 256 values, 8 per lane: lane l holds [256 c + 8 l, +8). */
        for (int c = warp; c * 256 < n; c += nw) {
        const int base = c * 256 + lane * 8;
        const bool valid = base < n; /* n is a multiple of 32: all 8 or none */
        float v[8];
        if (valid) {
            float4 a = *(const float4 *)(in.src + base), b = *(const float4 *)(in.src + base + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            if (in.norm) {
                float4 wa = *(const float4 *)(in.norm + base), wb = *(const float4 *)(in.norm + base + 4);
                float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
                for (int k = 0; k < 8; k++) v[k] = v[k] * scale * w[k];
            }
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = 0.0f;
        }
        int codes[8];
        if (kind == ACT_Q8K) {
            /* q8_k.c: the value of largest magnitude (the first one) maps to -127 */
            float amax = 0.0f, vmax = 0.0f;
            int imax = 0x7fffffff;
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (fabsf(v[k]) > amax) amax = fabsf(v[k]), vmax = v[k], imax = base + k;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                float oa = __shfl_xor_sync(FULL_MASK, amax, off), ov = __shfl_xor_sync(FULL_MASK, vmax, off);
                int oi = __shfl_xor_sync(FULL_MASK, imax, off);
                if (oa > amax || (oa == amax && oi < imax)) amax = oa, vmax = ov, imax = oi;
            }
            float iscale = amax != 0.0f ? -127.0f / vmax : 0.0f;
            bool zero = amax == 0.0f || !isfinite(iscale);
            int sum = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                codes[k] = zero ? 0 : __float2int_rn(fminf(fmaxf(iscale * v[k], -127.0f), 127.0f));
                sum += codes[k];
            }
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            if (valid && (lane & 1) == 0) s16[base >> 4] = (int16_t)sum;
            if (lane == 0) d[c] = zero ? 0.0f : 1.0f / iscale;
        } else {
            /* q8_0.c: d = amax / 127, q = round(x / d) */
            float amax = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) amax = fmaxf(amax, fabsf(v[k]));
            amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 2));
            float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) codes[k] = (int)roundf(fminf(fmaxf(v[k] * id, -127.0f), 127.0f));
            if (valid && (lane & 3) == 0) d[base >> 5] = f2h_round(dd);
        }
        if (valid) {
            uint2 packed;
            packed.x = (codes[0] & 0xff) | (codes[1] & 0xff) << 8 | (codes[2] & 0xff) << 16 | (unsigned)(codes[3] & 0xff) << 24;
            packed.y = (codes[4] & 0xff) | (codes[5] & 0xff) << 8 | (codes[6] & 0xff) << 16 | (unsigned)(codes[7] & 0xff) << 24;
            *(uint2 *)(q + base) = packed;
        }
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- row dot products */

/* Partial dot product of one row (this lane's units) with the staged
 * activation at element offset act_off. */
template <class F>
__device__ __forceinline__ float dot_units(const uint8_t *body, const uint8_t *meta, int U, const act_view &a,
                                           int act_off, int L, int sub) {
    float acc = 0.0f;
        for (int u0 = sub; u0 < U; u0 += L * F::N) {
        typename F::raw r[F::N];
#pragma unroll
        for (int k = 0; k < F::N; k++)
            if (u0 + k * L < U) r[k] = F::load(body, meta, u0 + k * L);
#pragma unroll
        for (int k = 0; k < F::N; k++)
            if (u0 + k * L < U) acc += F::dot(r[k], a, act_off, u0 + k * L);
    }
    return acc;
}

/* Two rows at once (gate and up of one FFN row), each against the same
 * activation: 2 * NP loads in flight. */
template <class F>
__device__ __forceinline__ void dot_units_pair(const uint8_t *body_a, const uint8_t *meta_a, const uint8_t *body_b,
                                               const uint8_t *meta_b, int U, const act_view &act, int L, int sub,
                                               float *out_a, float *out_b) {
    constexpr int NP = F::N > 1 ? F::N / 2 : 1;
    float acc_a = 0.0f, acc_b = 0.0f;
        for (int u0 = sub; u0 < U; u0 += L * NP) {
        typename F::raw ra[NP], rb[NP];
#pragma unroll
        for (int k = 0; k < NP; k++)
            if (u0 + k * L < U) {
                ra[k] = F::load(body_a, meta_a, u0 + k * L);
                rb[k] = F::load(body_b, meta_b, u0 + k * L);
            }
#pragma unroll
        for (int k = 0; k < NP; k++)
            if (u0 + k * L < U) {
                acc_a += F::dot(ra[k], act, 0, u0 + k * L);
                acc_b += F::dot(rb[k], act, 0, u0 + k * L);
            }
    }
    *out_a = acc_a;
    *out_b = acc_b;
}

/* Row `row` of T experts of a slab, flattened into one stream of T * U
 * units: unit t belongs to term j = t / U (expert ids[j], weight w[j],
 * activation at j * act_stride). */
template <class F>
__device__ __forceinline__ float dot_terms(const dmat &m, int row, int T, const int *ids, const float *w,
                                           int act_stride, const act_view &a, int L, int sub) {
    const int U = m.units, total = T * U;
    float acc = 0.0f;
        for (int t0 = sub; t0 < total; t0 += L * F::N) {
        typename F::raw r[F::N];
#pragma unroll
        for (int k = 0; k < F::N; k++) {
            int t = t0 + k * L;
            if (t < total) {
                int j = t / U, e = ids ? ids[j] : 0;
                r[k] = F::load(m.body + e * m.expert_stride + (int64_t)row * m.row_stride,
                               m.meta + e * m.meta_expert_stride + (int64_t)row * m.meta_row_stride, t - j * U);
            }
        }
#pragma unroll
        for (int k = 0; k < F::N; k++) {
            int t = t0 + k * L;
            if (t < total) {
                int j = t / U;
                acc += w[j] * F::dot(r[k], a, j * act_stride, t - j * U);
            }
        }
    }
    return acc;
}

/* The last block to arrive at `counter` returns true (and resets it for
 * the next launch); the writes of every block before are visible to it. */
__device__ __forceinline__ bool last_block(unsigned *counter, unsigned n_blocks, int *flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned ticket = atomicAdd(counter, 1u);
        *flag = ticket == n_blocks - 1;
        if (*flag) *counter = 0;
    }
    __syncthreads();
    bool last = *flag != 0;
    if (last) __threadfence();
    return last;
}

/* L2 prefetch of a block's first rows, so that their DRAM round trip
 * overlaps the staging of the activation: n rows of row_bytes scattered
 * over matrices and experts, row i at row_at(i). */
template <class RowAt>
__device__ __forceinline__ void prefetch_row_set(int n, int64_t row_bytes, RowAt row_at) {
    const int lines = (int)((row_bytes + 127) >> 7);
    for (int t = threadIdx.x; t < n * lines; t += blockDim.x) {
        const int i = t / lines;
        prefetch_l2(row_at(i) + (int64_t)(t - i * lines) * 128);
    }
}

/* ---------------------------------------------------------------- gemv */

/* Router: softmax or sigmoid over the logits, the k largest (lowest id on
 * ties), their weights renormalised and scaled: route_tokens in
 * cpu_forward.c. The whole (last) block: each thread ranks its experts by
 * counting the better ones, so the top k cost one pass, not k. p: the
 * router's part of gemv_smem(). */
__device__ __forceinline__ void route_on_device(const gemv_args &a, float *p) {
    const int tid = threadIdx.x, nt = blockDim.x, n = a.n_experts;
    const float *logits = a.seg[0].out;
    float *chosen_w = p + ((n + 3) & ~3); /* k floats, k ints, then 32 floats of scratch */
    int *chosen_id = (int *)(chosen_w + MAX_EXPERTS_USED);
    float *scratch = (float *)(chosen_id + MAX_EXPERTS_USED);
    float m = -INFINITY;
    for (int i = tid; i < n; i += nt) {
        p[i] = __ldcg(logits + i);
        m = fmaxf(m, p[i]);
    }
    if (a.gating == 0) {
        m = block_max(m, scratch);
        float sum = 0.0f;
        for (int i = tid; i < n; i += nt) {
            p[i] = expf(p[i] - m);
            sum += p[i];
        }
        sum = block_sum(sum, scratch);
        const float inv = (float)(1.0 / (double)sum);
        for (int i = tid; i < n; i += nt) p[i] *= inv;
    } else {
        for (int i = tid; i < n; i += nt) p[i] = 1.0f / (1.0f + expf(-p[i]));
    }
    __syncthreads();
    /* a strict order (NaN last), so the ranks are a permutation and every
     * chosen id is in range */
    for (int i = tid; i < n; i += nt) {
        const float v = isnan(p[i]) ? -INFINITY : p[i];
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const float w = isnan(p[j]) ? -INFINITY : p[j];
            rank += w > v || (w == v && j < i);
        }
        if (rank < a.k) chosen_w[rank] = p[i], chosen_id[rank] = i;
#ifdef MOE_CUDA_SIM
        if (rank == a.k) scratch[0] = v; /* the best expert not chosen, for the trace */
#endif
    }
    __syncthreads();
    if (tid != 0) return;
#ifdef MOE_CUDA_SIM
    if (getenv("MOE_SIM_TRACE_ROUTES")) {
        fprintf(stderr, "route:");
        for (int j = 0; j < a.k; j++) fprintf(stderr, " %d:%.9g", chosen_id[j], chosen_w[j]);
        fprintf(stderr, " | next %.9g\n", a.k < n ? scratch[0] : -INFINITY);
    }
#endif
    float sum = 0.0f;
    for (int j = 0; j < a.k; j++) sum += chosen_w[j];
    for (int j = 0; j < a.k; j++) {
        float w = chosen_w[j];
        if (a.norm_topk) w /= sum;
        a.route_w[j] = w * a.w_scale;
        a.route_ids[j] = chosen_id[j];
    }
}

/* EPI is the launch's epilogue (EPI_NONE, EPI_ROUTER, EPI_ARGMAX), a
 * template parameter so that the plain products carry no routing or argmax
 * code: a kernel's code is fetched from memory at every layer (the weights
 * stream through L2), and small code starts sooner. */
template <class F, int EPI>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(const gemv_args a) {
    DYN_SMEM(uint8_t, smem);
    const int L = a.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int total = a.seg_end[a.n_seg - 1];
    const int first = blockIdx.x * GEMV_WARPS * G;
    prefetch_row_set(max(0, min(GEMV_WARPS * G, total - first)), a.seg[0].w.row_stride, [&](int i) {
        int s = 0;
        while (s + 1 < a.n_seg && first + i >= a.seg_end[s]) s++;
        const dmat &w = a.seg[s].w;
        return w.body + (int64_t)(first + i - (s ? a.seg_end[s - 1] : 0)) * w.row_stride;
    });
    pdl_wait();
    pdl_launch_dependents();
    stage_act(F::ACT, a.in, smem, NULL, NULL);
    const act_view av = act_view_of(F::ACT, smem, a.in.n);
    float best = -INFINITY;
    int best_row = 0x7fffffff;
        for (int base = (blockIdx.x * GEMV_WARPS + warp) * G; base < total; base += gridDim.x * GEMV_WARPS * G) {
        const int row = base + grp;
        const bool valid = row < total;
        int s = 0;
        while (s + 1 < a.n_seg && row >= a.seg_end[s]) s++;
        const int r = row - (s ? a.seg_end[s - 1] : 0);
        float acc = 0.0f;
        if (valid) {
            const dmat &w = a.seg[s].w;
            acc = dot_units<F>(w.body + (int64_t)r * w.row_stride, w.meta + (int64_t)r * w.meta_row_stride, w.units,
                               av, 0, L, sub);
        }
        acc = group_sum(acc, L);
        if (valid && sub == 0) {
            const gemv_seg &sg = a.seg[s];
            if (sg.bias) acc += sg.bias[r];
            if (sg.accumulate) acc += sg.out[r];
            sg.out[r] = acc;
            if (acc > best || (acc == best && r < best_row)) best = acc, best_row = r;
        }
    }
    if (EPI == EPI_NONE) return;
    int *flag = (int *)smem;
    if (EPI == EPI_ROUTER) {
        if (last_block(a.counter, gridDim.x, flag)) route_on_device(a, (float *)(smem + 16));
        return;
    }
    /* EPI_ARGMAX: the block's best row, then the best of all blocks */
    float *red_v = (float *)(smem + 16);
    int *red_i = (int *)(smem + 16 + 4 * GEMV_WARPS);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, best, off);
        int oi = __shfl_xor_sync(FULL_MASK, best_row, off);
        if (ov > best || (ov == best && oi < best_row)) best = ov, best_row = oi;
    }
    __syncthreads();
    if (lane == 0) red_v[warp] = best, red_i[warp] = best_row;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < GEMV_WARPS; w++)
            if (red_v[w] > best || (red_v[w] == best && red_i[w] < best_row)) best = red_v[w], best_row = red_i[w];
        a.part_val[blockIdx.x] = best;
        a.part_idx[blockIdx.x] = best_row;
    }
    if (!last_block(a.counter, gridDim.x, flag) || threadIdx.x != 0) return;
    best = -INFINITY, best_row = 0x7fffffff;
    for (unsigned b = 0; b < gridDim.x; b++) {
        float v = __ldcg(a.part_val + b);
        int i = __ldcg(a.part_idx + b);
        if (v > best || (v == best && i < best_row)) best = v, best_row = i;
    }
    if (best_row == 0x7fffffff) best_row = 0;
    const int pos = a.step[1];
    if (a.history) a.history[pos] = best_row;
    a.step[0] = best_row; /* the next step decodes it at the next position */
    a.step[1] = pos + 1;
}

/* ---------------------------------------------------------------- FFN */

template <class F>
__global__ void __launch_bounds__(GEMV_THREADS) ffn_up_kernel(const ffn_up_args a) {
    DYN_SMEM(uint8_t, smem);
    const int L = a.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int R = a.gate.rows, routed_rows = a.n_routed * R;
    const int total = routed_rows + (a.has_shared ? a.sh_gate.rows : 0);
    pdl_wait();
    pdl_launch_dependents();
    /* the block's first gate and up rows (the ids are known now) */
    const int first = blockIdx.x * GEMV_WARPS * G;
    prefetch_row_set(2 * max(0, min(GEMV_WARPS * G, total - first)), (a.n_routed ? a.gate : a.sh_gate).row_stride,
                     [&](int i) {
                         const int row = first + i / 2;
                         const bool routed = row < routed_rows;
                         const int j = routed ? row / R : 0, r = routed ? row - j * R : row - routed_rows;
                         const dmat &m = routed ? (i & 1 ? a.up : a.gate) : (i & 1 ? a.sh_up : a.sh_gate);
                         const int e = routed && a.ids ? a.ids[j] : 0;
                         return m.body + e * m.expert_stride + (int64_t)r * m.row_stride;
                     });
    stage_act(F::ACT, a.in, smem, a.shgate_w, a.shgate_out);
    const act_view av = act_view_of(F::ACT, smem, a.in.n);
        for (int base = (blockIdx.x * GEMV_WARPS + warp) * G; base < total; base += gridDim.x * GEMV_WARPS * G) {
        const int row = base + grp;
        const bool valid = row < total;
        float g = 0.0f, u = 0.0f;
        int out = 0;
        if (valid) {
            const dmat *mg, *mu;
            int r, e = 0;
            if (row < routed_rows) {
                int j = row / R;
                r = row - j * R;
                e = a.ids ? a.ids[j] : 0;
                mg = &a.gate, mu = &a.up;
                out = row;
            } else {
                r = row - routed_rows;
                mg = &a.sh_gate, mu = &a.sh_up;
                out = a.h_shared_off + r;
            }
            dot_units_pair<F>(mg->body + e * mg->expert_stride + (int64_t)r * mg->row_stride,
                              mg->meta + e * mg->meta_expert_stride + (int64_t)r * mg->meta_row_stride,
                              mu->body + e * mu->expert_stride + (int64_t)r * mu->row_stride,
                              mu->meta + e * mu->meta_expert_stride + (int64_t)r * mu->meta_row_stride, mg->units, av,
                              L, sub, &g, &u);
        }
        g = group_sum(g, L);
        u = group_sum(u, L);
        if (valid && sub == 0) a.h[out] = g / (1.0f + expf(-g)) * u; /* cpu_swiglu */
    }
}

template <class F>
__global__ void __launch_bounds__(GEMV_THREADS) ffn_down_kernel(const ffn_down_args a) {
    DYN_SMEM(uint8_t, smem);
    __shared__ int ids[MAX_EXPERTS_USED];
    __shared__ float weights[MAX_EXPERTS_USED];
    __shared__ float sh_weight;
    const int L = a.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int total = a.n_routed ? a.down.rows : a.sh_down.rows;
    pdl_wait();
    pdl_launch_dependents();
    if (threadIdx.x < a.n_routed) {
        ids[threadIdx.x] = a.ids ? a.ids[threadIdx.x] : 0;
        weights[threadIdx.x] = a.route_w ? a.route_w[threadIdx.x] : 1.0f;
    }
    if (threadIdx.x == 0) sh_weight = a.shgate ? *a.shgate : 1.0f;
    /* the block's first rows of each routed expert and of the shared one */
    const int first = blockIdx.x * GEMV_WARPS * G, n_first = max(0, min(GEMV_WARPS * G, total - first));
    if (a.n_routed)
        prefetch_row_set(n_first * a.n_routed, a.down.row_stride, [&](int i) {
            const int j = i % a.n_routed, e = a.ids ? a.ids[j] : 0;
            return a.down.body + e * a.down.expert_stride + (int64_t)(first + i / a.n_routed) * a.down.row_stride;
        });
    if (a.has_shared)
        prefetch_row_set(n_first, a.sh_down.row_stride,
                         [&](int i) { return a.sh_down.body + (int64_t)(first + i) * a.sh_down.row_stride; });
    stage_act(F::ACT, a.in, smem, NULL, NULL); /* ends with a barrier */
    const act_view av = act_view_of(F::ACT, smem, a.in.n);
        for (int base = (blockIdx.x * GEMV_WARPS + warp) * G; base < total; base += gridDim.x * GEMV_WARPS * G) {
        const int row = base + grp;
        const bool valid = row < total;
        float acc = 0.0f;
        if (valid && a.n_routed)
            acc = dot_terms<F>(a.down, row, a.n_routed, ids, weights, a.routed_act_stride, av, L, sub);
        if (valid && a.has_shared) {
            const dmat &m = a.sh_down;
            acc += sh_weight * dot_units<F>(m.body + (int64_t)row * m.row_stride, m.meta + (int64_t)row * m.meta_row_stride,
                                            m.units, av, a.shared_act_off, L, sub);
        }
        acc = group_sum(acc, L);
        if (valid && sub == 0) a.x[row] += acc;
    }
}

/* ---------------------------------------------------------------- embedding */

template <class F>
__global__ void embed_kernel(const dmat m, const int *step, float *x) {
    pdl_wait();
    pdl_launch_dependents();
    int tok = step[0];
    if (tok < 0 || tok >= m.rows) tok = 0;
    const uint8_t *body = m.body + (int64_t)tok * m.row_stride, *meta = m.meta + (int64_t)tok * m.meta_row_stride;
    for (int u = blockIdx.x * blockDim.x + threadIdx.x; u < m.units; u += gridDim.x * blockDim.x)
        F::dequant(F::load(body, meta, u), u, x);
}

/* ---------------------------------------------------------------- instantiation */

#include "cuda/dequant.cuh"

/* Everything a family file provides for its format F: the kernels and the
 * table entry cuda_formats[] points at (cuda_model.cu); the prefill's
 * dequantization comes from dequant.cuh. */
#define DEFINE_CUDA_FORMAT(F, ident)                                                                             \
    static void ident##_gemv(const gemv_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {            \
        if (a->epilogue == EPI_ROUTER)                                                                         \
            LAUNCH_PDL(pdl, (gemv_kernel<F, EPI_ROUTER>), grid, GEMV_THREADS, smem, st, *a);                   \
        else if (a->epilogue == EPI_ARGMAX)                                                                    \
            LAUNCH_PDL(pdl, (gemv_kernel<F, EPI_ARGMAX>), grid, GEMV_THREADS, smem, st, *a);                   \
        else                                                                                                   \
            LAUNCH_PDL(pdl, (gemv_kernel<F, EPI_NONE>), grid, GEMV_THREADS, smem, st, *a);                     \
    }                                                                                                          \
    static void ident##_up(const ffn_up_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {            \
        LAUNCH_PDL(pdl, ffn_up_kernel<F>, grid, GEMV_THREADS, smem, st, *a);                                   \
    }                                                                                                          \
    static void ident##_down(const ffn_down_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {        \
        LAUNCH_PDL(pdl, ffn_down_kernel<F>, grid, GEMV_THREADS, smem, st, *a);                                 \
    }                                                                                                          \
    static void ident##_embed(const dmat *m, const int *step, float *x, cudaStream_t st, bool pdl) {            \
        int grid = (m->units + 255) / 256;                                                                     \
        LAUNCH_PDL(pdl, embed_kernel<F>, grid, 256, 0, st, *m, step, x);                                       \
    }                                                                                                          \
    static int ident##_occupancy(int kernel, size_t smem) {                                                    \
        int n = 0;                                                                                             \
        cudaError_t e = kernel == 0   ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_kernel<F, EPI_ROUTER>, GEMV_THREADS, smem) \
                        : kernel == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ffn_up_kernel<F>, GEMV_THREADS, smem) \
                                      : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ffn_down_kernel<F>, GEMV_THREADS, smem); \
        return e == cudaSuccess && n > 0 ? n : 1;                                                              \
    }                                                                                                          \
    static cudaError_t ident##_allow_smem(int bytes) {                                                         \
        cudaError_t e = cudaFuncSetAttribute(gemv_kernel<F, EPI_NONE>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); \
        if (e == cudaSuccess)                                                                                  \
            e = cudaFuncSetAttribute(gemv_kernel<F, EPI_ROUTER>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); \
        if (e == cudaSuccess)                                                                                  \
            e = cudaFuncSetAttribute(gemv_kernel<F, EPI_ARGMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); \
        if (e == cudaSuccess)                                                                                  \
            e = cudaFuncSetAttribute(ffn_up_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);   \
        if (e == cudaSuccess)                                                                                  \
            e = cudaFuncSetAttribute(ffn_down_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); \
        return e;                                                                                              \
    }                                                                                                          \
    extern const cuda_format cuda_format_##ident = {                                                           \
        F::TYPE, #ident, F::BLOCK, F::BODY, F::META, F::UNITS, F::ACT, F::N, F::repack,                        \
        ident##_gemv, ident##_up, ident##_down, ident##_embed, ident##_occupancy, ident##_allow_smem,           \
        launch_dequant<F>};

#endif
