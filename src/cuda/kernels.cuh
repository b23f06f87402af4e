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
 * works on 32 / L rows at once; grids are sized by gemv_grid and loop over
 * rows (persistent), so the activation is staged once per block.
 *
 * Latency, not bytes, bounds these launches (a layer's matrices are 1-18
 * MB, a few microseconds of DRAM time each). So a kernel loads the first
 * batch of its first row before it waits for the launch before it
 * (programmatic dependent launch; weights never depend on that launch)
 * and before it stages the activation: the DRAM round trip overlaps the
 * previous launch's tail, the wait and the staging. What of a unit's
 * decoding needs no activation (Q4_K's scales: unit_prep) is done there
 * too, off the instructions that follow the wait. When every row of a
 * launch takes one batch, a lane meets the same units in every row, so it
 * loads their activation from shared memory once, into registers (act,
 * load_act, dot_act: the K-quants keep codes, sums and scale there); the
 * extra registers leave one 512-thread block a multiprocessor.
 *
 * Activations: every block reads the f32 input (the residual stream, or
 * the FFN hidden state), applies the RMSNorm when asked (in the matrix
 * products its scale multiplies the results instead: stage_act), and
 * quantizes it into shared memory exactly as the CPU reference does for
 * the format's dot type: Q8_K (256 per block, f32 scale, sums of 16) for
 * the K-quants, Q8_0 (32 per block, fp16 scale) for Q8_0, Q4_0, Q5_0 and
 * IQ4_NL, f32 for the float types. Same input, same codes, so the integer dot products are
 * those of the CPU and only the order of float additions differs (the GPU
 * and the CPU agree to ~1e-6 relative; see tests/test_cuda_kernels.c).
 * Redundant across blocks (a few KB read from L2 each), but it removes a
 * launch and a dependent step from every matrix product.
 *
 * Three kernels use this machinery:
 *   gemv_kernel     y = W x (+ bias) (+= into y): q|k|v, o + residual,
 *                   a router's logits, the output head (last block:
 *                   argmax).
 *   ffn_up_kernel   h = silu(G x) * (U x) for the k routed experts, plus
 *                   the shared expert, in one launch; block 0 also
 *                   computes the shared expert's sigmoid gate. Behind a
 *                   router it stages x before its wait (x was final two
 *                   launches back), so only the routing follows the wait.
 *   ffn_down_kernel x += sum_j w_j D_{id_j} h_j + g * D_sh h_sh: every
 *                   output row reads the k experts' rows (flattened into
 *                   one stream of units) and writes the residual once, no
 *                   atomics, deterministic.
 * Routing (route_warp) is a warp's, from the router's logits in device
 * memory: every block of ffn_up routes for itself, so no launch waits on a
 * router's last block, and its block 0 publishes the routing for ffn_down.
 */
#ifndef MOE_CUDA_KERNELS_CUH
#define MOE_CUDA_KERNELS_CUH

#include <math.h>

#include <type_traits>

#include "cuda/cuda_compat.cuh"
#include "cuda/cuda_internal.h"

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
    /* ss / n: for the usual widths, powers of two, the same value by one
     * multiplication by 2^-k instead of a double division's chain of
     * dependent steps */
    const double mean =
        (n & (n - 1)) == 0 ? ss * __longlong_as_double((long long)(1023 - (__ffs(n) - 1)) << 52) : ss / (double)n;
    return (float)(1.0 / sqrt(mean + (double)eps));
}


__device__ __forceinline__ void load8(const float *p, float *v) {
    const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* Where stage_act writes an activation of n values as Q8_K or Q8_0 (what
 * act_view_of reads). */
struct act_dest {
    int8_t *q;
    float *d;
    int16_t *s16;
};

__device__ __forceinline__ act_dest act_dest_of(uint8_t *smem, int n) {
    return act_dest{(int8_t *)smem, (float *)(smem + align16((size_t)n)),
                    (int16_t *)(smem + align16((size_t)n) + align16((size_t)n / 256 * 4))};
}

/* Chunk c of 256 values into shared memory as `kind` (Q8_K or Q8_0), a
 * warp's: lane l holds v = values [256 c + 8 l, +8), `valid` when they are
 * inside the input (n is a multiple of 32: all 8 or none). */
__device__ __forceinline__ void quantize_chunk(int kind, const float *v, int c, bool valid, const act_dest &a) {
    const int lane = threadIdx.x & 31, base = c * 256 + lane * 8;
    int codes[8];
    if (kind == ACT_Q8K) {
        /* q8_k.c: the value of largest magnitude (the first one) maps to -127 */
        float amax = 0.0f, vmax = 0.0f;
        int imax = 0;
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (fabsf(v[k]) > amax) amax = fabsf(v[k]), vmax = v[k], imax = base + k;
        /* The warp's largest magnitude, then the first index holding it and
         * that value's sign: two warp reductions (redux.sync) instead of
         * five rounds of three shuffles, on the staging's critical path.
         * Magnitudes are non-negative floats (NaN never wins above), which
         * order as their bits do. */
        const unsigned top = __reduce_max_sync(FULL_MASK, __float_as_uint(amax));
        const unsigned first = __reduce_min_sync(
            FULL_MASK, amax > 0.0f && __float_as_uint(amax) == top ? (unsigned)imax * 2 + (vmax < 0.0f) : 0xffffffffu);
        amax = __uint_as_float(top);
        vmax = first & 1 ? -amax : amax;
        float iscale = amax != 0.0f ? -127.0f / vmax : 0.0f;
        bool zero = amax == 0.0f || !isfinite(iscale);
        int sum = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            codes[k] = zero ? 0 : __float2int_rn(fminf(fmaxf(iscale * v[k], -127.0f), 127.0f));
            sum += codes[k];
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        if (valid && (lane & 1) == 0) a.s16[base >> 4] = (int16_t)sum;
        if (lane == 0) a.d[c] = zero ? 0.0f : 1.0f / iscale;
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
        if (valid && (lane & 3) == 0) a.d[base >> 5] = f2h_round(dd);
    }
    if (valid) {
        uint2 packed;
        packed.x = (codes[0] & 0xff) | (codes[1] & 0xff) << 8 | (codes[2] & 0xff) << 16 | (unsigned)(codes[3] & 0xff) << 24;
        packed.y = (codes[4] & 0xff) | (codes[5] & 0xff) << 8 | (codes[6] & 0xff) << 16 | (unsigned)(codes[7] & 0xff) << 24;
        *(uint2 *)(a.q + base) = packed;
    }
}

/* Values [256 c + 8 lane, +8) of `in` (v) and of its norm weights (w;
 * ones without), zeros past the end (n is a multiple of 32: all 8 or none). */
__device__ __forceinline__ void load_chunk_values(const act_in &in, int c, float *v) {
    const int base = c * 256 + (threadIdx.x & 31) * 8;
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = 0.0f;
    if (base < in.n) load8(in.src + base, v);
}

__device__ __forceinline__ void load_chunk_norm(const act_in &in, int c, float *w) {
    const int base = c * 256 + (threadIdx.x & 31) * 8;
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = 1.0f;
    if (base < in.n && in.norm) load8(in.norm + base, w);
}

__device__ __forceinline__ void load_chunk(const act_in &in, int c, float *v, float *w) {
    load_chunk_values(in, c, v);
    load_chunk_norm(in, c, w);
}

/* Four values' squares summed in double, in their order. */
__device__ __forceinline__ double squares4(const float4 &v) {
    return (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
}

__device__ __forceinline__ double chunk_squares(const float *v) {
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < 8; k++) ss += (double)v[k] * v[k];
    return ss;
}

/* The sum of n doubles: sixteen (a block's warps, GEMV_WARPS) as a tree
 * of four levels, since the products' staging waits on it (with
 * rms_scale's multiplication, 0.1 us of it: bench/decode-plan.md, fact
 * 38); other counts in order. */
__device__ __forceinline__ double sum_doubles(const double *p, int n) {
    if (n != 16) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += p[i];
        return s;
    }
    const double a = (p[0] + p[1]) + (p[2] + p[3]), b = (p[4] + p[5]) + (p[6] + p[7]);
    const double c = (p[8] + p[9]) + (p[10] + p[11]), d = (p[12] + p[13]) + (p[14] + p[15]);
    return (a + b) + (c + d);
}

/* Two stagings, each measured where it runs (bench/decode-plan.md, fact
 * 34). Behind a norm, the matrix products (gemv_kernel: q|k|v, a router,
 * the head) stage x * w, whose codes are those of the full norm up to
 * float rounding (a block's largest magnitude scales with it), and
 * multiply each row's result by the RMS scale s: s, a block-wide double
 * sum, a square root and a division, is then off the path to the codes.
 * ffn_up stages before its wait, where that path is hidden anyway, and
 * quantizes the fully normalised input (stage_act_normed): with the
 * products' staging its rows ran 1 us slower. cpu_forward.c multiplies the
 * same way, so that both quantize the same values. */

/* The products' staging after each thread has written its part and, with
 * a norm, summed its inputs' squares (ss): the barrier that publishes the
 * activation, then s from the warps' sums, which every thread computes for
 * itself; 1 without a norm. scratch: 64 floats. */
__device__ __forceinline__ float finish_staging(const act_in &in, double ss, float *scratch) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double *warp_ss = (double *)scratch;
    if (in.norm) {
        ss = warp_sum_double(ss);
        if ((threadIdx.x & 31) == 0) warp_ss[warp] = ss;
    }
    __syncthreads();
    if (!in.norm) return 1.0f;
    return rms_scale(sum_doubles(warp_ss, nw), in.n, in.eps);
}

/* stage_act for the float formats: the input (times the norm's weights) as f32. */
__device__ __forceinline__ float stage_f32(const act_in &in, float *f, float *scratch) {
    double ss = 0.0;
    for (int i = threadIdx.x * 4; i < in.n; i += blockDim.x * 4) {
        float4 v = *(const float4 *)(in.src + i);
        if (in.norm) {
            const float4 w = *(const float4 *)(in.norm + i);
            ss += squares4(v);
            v.x *= w.x, v.y *= w.y, v.z *= w.z, v.w *= w.w;
        }
        *(float4 *)(f + i) = v;
    }
    return finish_staging(in, ss, scratch);
}

/* The products' staging of `in` into shared memory as `kind`: x, times the
 * norm's weights w when given. Returns the factor every product with it
 * takes: the RMS scale with a norm, 1 without. Ends with a barrier.
 * AHEAD: a warp with several chunks (ffn_down's 24 for 16 warps) loads the
 * next one's values before it quantizes this one, one L2 round trip
 * instead of two (the norm's weights, when there is a norm, after); the
 * kernels whose warps take one chunk at most leave out its registers. */
template <bool AHEAD = false>
__device__ __forceinline__ float stage_act(int kind, const act_in &in, uint8_t *smem) {
    const int n = in.n, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *scratch = (float *)(smem + act_bytes(kind, n));
    if (kind == ACT_F32) return stage_f32(in, (float *)smem, scratch);
    /* A warp takes 256 values, 8 per lane: lane l holds [256 c + 8 l, +8).
     * (Two chunks a round, their loads issued together, made the kernels'
     * code 8-20% larger and the step slower: bench/decode-plan.md, fact 20.) */
    const act_dest dest = act_dest_of(smem, n);
    double ss = 0.0;
    float v[8];
    load_chunk_values(in, warp, v);
    for (int c = warp; c * 256 < n; c += nw) {
        float w[8], next[8];
        const bool more = (c + nw) * 256 < n;
        if (AHEAD && more) load_chunk_values(in, c + nw, next);
        load_chunk_norm(in, c, w);
        if (in.norm) ss += chunk_squares(v);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] *= w[k];
        quantize_chunk(kind, v, c, c * 256 + (threadIdx.x & 31) * 8 < n, dest);
        if (!more) break;
        if (AHEAD)
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = next[k];
        else
            load_chunk_values(in, c + nw, v);
    }
    return finish_staging(in, ss, scratch);
}

/* The shared expert's gate, sigmoid(dot(normalised input, gate_w)), to
 * *gate_out by block 0. */
__device__ __forceinline__ void shared_gate(const act_in &in, float scale, const float *gate_w, float *gate_out,
                                            float *scratch) {
    float dot = 0.0f;
    for (int i = threadIdx.x; i < in.n; i += blockDim.x) {
        float v = in.src[i];
        if (in.norm) v = v * scale * in.norm[i];
        dot += v * gate_w[i];
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0 && blockIdx.x == 0) *gate_out = 1.0f / (1.0f + expf(-dot));
}

/* The RMS scale of `in` (1 without a norm), the first chunk of its warp's
 * values already in v: a block-wide sum, so every thread gets it. */
__device__ __forceinline__ float block_rms_scale(const act_in &in, const float *v, float *scratch) {
    if (!in.norm) return 1.0f;
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double ss = chunk_squares(v);
    for (int c = warp + nw; c * 256 < in.n; c += nw) {
        float v2[8], w2[8];
        load_chunk(in, c, v2, w2);
        ss += chunk_squares(v2);
    }
    return rms_scale(block_sum_double(ss, (double *)scratch), in.n, in.eps);
}

/* stage_act_normed for the float formats. */
__device__ __forceinline__ void stage_f32_normed(const act_in &in, float *f, const float *gate_w, float *gate_out,
                                                 float *scratch) {
    const int n = in.n, tid = threadIdx.x, nt = blockDim.x;
    float scale = 1.0f;
    if (in.norm) {
        double ss = 0.0;
        for (int i = tid * 4; i < n; i += nt * 4) {
            float4 v = *(const float4 *)(in.src + i);
            ss += squares4(v);
        }
        scale = rms_scale(block_sum_double(ss, (double *)scratch), n, in.eps);
    }
    if (gate_w) shared_gate(in, scale, gate_w, gate_out, scratch);
    for (int i = tid * 4; i < n; i += nt * 4) {
        float4 v = *(const float4 *)(in.src + i);
        if (in.norm) {
            float4 w = *(const float4 *)(in.norm + i);
            v.x = v.x * scale * w.x, v.y = v.y * scale * w.y, v.z = v.z * scale * w.z, v.w = v.w * scale * w.w;
        }
        *(float4 *)(f + i) = v;
    }
    __syncthreads();
}

/* ffn_up's staging: `in` fully normalised (cpu_rmsnorm) and quantized
 * into shared memory as `kind`. When gate_w is given, also computes
 * sigmoid(dot(normalised input, gate_w)) and block 0 stores it in
 * *gate_out (the shared expert's gate). Ends with a barrier. */
__device__ __forceinline__ void stage_act_normed(int kind, const act_in &in, uint8_t *smem, const float *gate_w,
                                                 float *gate_out) {
    const int n = in.n, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *scratch = (float *)(smem + act_bytes(kind, n));
    if (kind == ACT_F32) {
        stage_f32_normed(in, (float *)smem, gate_w, gate_out, scratch);
        return;
    }
    /* The warp's first chunk, with the norm's weights, is loaded once for
     * both the sum of squares and the codes: one L2 round trip for inputs
     * up to 256 values a warp (4096 in a block), not two. */
    float v[8], w[8];
    load_chunk(in, warp, v, w);
    const float scale = block_rms_scale(in, v, scratch);
    if (gate_w) shared_gate(in, scale, gate_w, gate_out, scratch);
    const act_dest dest = act_dest_of(smem, n);
    for (int c = warp; c * 256 < n; c += nw) {
        if (c != warp) load_chunk(in, c, v, w);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = v[k] * scale * w[k];
        quantize_chunk(kind, v, c, c * 256 + (threadIdx.x & 31) * 8 < n, dest);
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- activations in registers */

/* What a unit multiplies with. A kernel whose rows take one batch each
 * visits every row with the same units, so it loads their activation once
 * (load_act) and multiplies each row's weights with it (dot_act): for the
 * K-quants that removes the activation's shared-memory loads and address
 * arithmetic from every row (about half of a unit's instructions). This is
 * the default for formats that keep reading shared memory: `act` is only
 * where the unit's activation is. */
template <class F>
struct smem_act {
    struct act {
        int off, u;
    };
    static __device__ __forceinline__ act load_act(const act_view &, int off, int u) { return act{off, u}; }
    template <class R>
    static __device__ __forceinline__ float dot_act(const R &r, const act_view &a, const act &x) {
        return F::dot(r, a, x.off, x.u);
    }
};

template <class F, int NB = F::N>
struct act_batch {
    typename F::act x[NB];
};

template <class F, int NB = F::N>
__device__ __forceinline__ void load_acts(act_batch<F, NB> &b, const act_view &a, int act_off, int U, int u0, int L) {
#pragma unroll
    for (int k = 0; k < NB; k++)
        if (u0 + k * L < U) b.x[k] = F::load_act(a, act_off, u0 + k * L);
}

/* ---------------------------------------------------------------- row dot products */

/* The N units a lane loads together: units u0, u0 + L, ..., of one row.
 * A kernel loads its first batch before it waits for the kernel before it
 * (weights never depend on it) and before it stages the activation, so the
 * first DRAM round trip overlaps both; later batches load as they go. */
template <class F, class R = typename F::raw>
struct unit_batch {
    R r[F::N];
};

/* What a unit's loads become before the activation is known: a format
 * whose decoding does not need it (Q4_K's scales: q4_k.cu) specializes
 * this, and the kernels prepare the batches they load before their wait
 * (prepare_batch), so that this work is done while they wait, not after.
 * Others use their loads as they are. */
template <class F>
struct unit_prep {
    typedef typename F::raw type;
    static __device__ __forceinline__ type of(const typename F::raw &r, int) { return r; }
    static __device__ __forceinline__ void pin(type &) {}
};

template <class F>
using prep_batch = unit_batch<F, typename unit_prep<F>::type>;

/* b's units (u0, u0 + L, ... below U) prepared, and made to be so here:
 * called before the kernel's wait. unit_prep looks only at a unit's place
 * in its block (u % UNITS), so u0 may count along a stream of whole rows. */
template <class F>
__device__ __forceinline__ prep_batch<F> prepare_batch(const unit_batch<F> &b, int U, int u0, int L) {
    prep_batch<F> p;
#pragma unroll
    for (int k = 0; k < F::N; k++)
        if (u0 + k * L < U) {
            p.r[k] = unit_prep<F>::of(b.r[k], u0 + k * L);
            unit_prep<F>::pin(p.r[k]);
        }
    return p;
}

template <class F, int NB = F::N, class M = from_global>
__device__ __forceinline__ void load_batch(unit_batch<F> &b, const uint8_t *body, const uint8_t *meta, int U, int u0,
                                           int L) {
#pragma unroll
    for (int k = 0; k < NB; k++)
        if (u0 + k * L < U) b.r[k] = F::template load<M>(body, meta, u0 + k * L);
}

template <class F, int NB = F::N, class R>
__device__ __forceinline__ float dot_batch(const unit_batch<F, R> &b, int U, int u0, int L, const act_view &a,
                                           int act_off) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < NB; k++)
        if (u0 + k * L < U) acc += F::dot(b.r[k], a, act_off, u0 + k * L);
    return acc;
}

template <class F, int NB = F::N>
__device__ __forceinline__ float dot_batch_act(const unit_batch<F> &b, const act_batch<F, NB> &x, int U, int u0, int L,
                                               const act_view &a) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < NB; k++)
        if (u0 + k * L < U) acc += F::dot_act(b.r[k], a, x.x[k]);
    return acc;
}

/* do_row(base, pre) over a warp's rows start, start + stride, ... below
 * total: the first with `first` (its batch loaded before the wait), the
 * others with NULL. Peeled, so that `first` is dead after the first row. */
template <class B, class DoRow>
__device__ __forceinline__ void for_each_row(int start, int stride, int total, const B &first, DoRow do_row) {
    if (start < total) do_row(start, &first);
    for (int base = start + stride; base < total; base += stride) do_row(base, (const B *)NULL);
}

/* Partial dot product of one row (this lane's units) with the staged
 * activation at element offset act_off; `first`, when given, is the row's
 * first batch, already loaded (raw, or prepared: then it takes its own
 * code, the loop the rest). */
template <class F, class R = typename F::raw>
__device__ __forceinline__ float dot_units(const uint8_t *body, const uint8_t *meta, int U, const act_view &a,
                                           int act_off, int L, int sub, const unit_batch<F, R> *first = NULL) {
    float acc = 0.0f;
    int u0 = sub;
    if constexpr (!std::is_same<R, typename F::raw>::value) {
        if (first) {
            acc = dot_batch<F>(*first, U, u0, L, a, act_off);
            u0 += L * F::N;
        }
    }
    for (; u0 < U; u0 += L * F::N) {
        unit_batch<F> b;
        if constexpr (std::is_same<R, typename F::raw>::value) {
            if (first && u0 == sub) b = *first;
            else load_batch<F>(b, body, meta, U, u0, L);
        } else {
            load_batch<F>(b, body, meta, U, u0, L);
        }
        acc += dot_batch<F>(b, U, u0, L, a, act_off);
    }
    return acc;
}

/* Two rows at once (gate and up of one FFN row), each against the same
 * activation: 2 * NP loads in flight; `first`: both rows' first batches. */
template <class F>
struct pair_batch {
    static constexpr int NP = F::N > 1 ? F::N / 2 : 1;
    unit_batch<F> a, b;
};

template <class F>
__device__ __forceinline__ void load_pair(pair_batch<F> &p, const uint8_t *body_a, const uint8_t *meta_a,
                                          const uint8_t *body_b, const uint8_t *meta_b, int U, int u0, int L) {
    load_batch<F, pair_batch<F>::NP>(p.a, body_a, meta_a, U, u0, L);
    load_batch<F, pair_batch<F>::NP>(p.b, body_b, meta_b, U, u0, L);
}

template <class F>
__device__ __forceinline__ void dot_units_pair(const uint8_t *body_a, const uint8_t *meta_a, const uint8_t *body_b,
                                               const uint8_t *meta_b, int U, const act_view &act, int L, int sub,
                                               float *out_a, float *out_b, const pair_batch<F> *first = NULL) {
    constexpr int NP = pair_batch<F>::NP;
    float acc_a = 0.0f, acc_b = 0.0f;
        for (int u0 = sub; u0 < U; u0 += L * NP) {
        pair_batch<F> p;
        if (first && u0 == sub) p = *first;
        else load_pair<F>(p, body_a, meta_a, body_b, meta_b, U, u0, L);
        acc_a += dot_batch<F, NP>(p.a, U, u0, L, act, 0);
        acc_b += dot_batch<F, NP>(p.b, U, u0, L, act, 0);
    }
    *out_a = acc_a;
    *out_b = acc_b;
}

/* Row `row` of T experts of a slab, flattened into one stream of T * U
 * units: unit t belongs to term j = t / U (expert ids[j], weight w[j],
 * activation at j * act_stride). */
template <class F, class IdOf>
__device__ __forceinline__ void load_terms(unit_batch<F> &b, const dmat &m, int row, int T, IdOf id_of, int t0, int L) {
    const int U = m.units, total = T * U;
#pragma unroll
    for (int k = 0; k < F::N; k++) {
        const int t = t0 + k * L;
        if (t < total) {
            const int j = div_by_magic(t, U, m.units_magic), e = id_of(j);
            b.r[k] = F::load(m.body + e * m.expert_stride + (int64_t)row * m.row_stride,
                             m.meta + e * m.meta_expert_stride + (int64_t)row * m.meta_row_stride, t - j * U);
        }
    }
}

/* The first TERM_BATCHES batches of a row of terms, loaded before the
 * wait: the experts' down rows (8 x 768 Q4_K: six units a lane, two
 * batches) then need no load round trip after it. */
#define TERM_BATCHES 2
template <class F, class R = typename F::raw>
struct term_batches {
    unit_batch<F, R> b[TERM_BATCHES];
};

template <class F>
using prep_terms = term_batches<F, typename unit_prep<F>::type>;

/* prepare_batch of each of f's batches, the stream's total units given */
template <class F>
__device__ __forceinline__ prep_terms<F> prepare_terms(const term_batches<F> &f, int total, int sub, int L) {
    prep_terms<F> p;
#pragma unroll
    for (int i = 0; i < TERM_BATCHES; i++) p.b[i] = prepare_batch<F>(f.b[i], total, sub + i * L * F::N, L);
    return p;
}

template <class F, class IdOf>
__device__ __forceinline__ void load_first_terms(term_batches<F> &f, const dmat &m, int row, int T, IdOf id_of, int sub,
                                                 int L) {
#pragma unroll
    for (int i = 0; i < TERM_BATCHES; i++) load_terms<F>(f.b[i], m, row, T, id_of, sub + i * L * F::N, L);
}

/* One batch of terms (units t0, t0 + L, ...) against the activation. */
template <class F, class R>
__device__ __forceinline__ float dot_term_batch(const unit_batch<F, R> &b, int t0, const dmat &m, int total, const float *w,
                                                int act_stride, const act_view &a, int L) {
    const int U = m.units;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < F::N; k++) {
        const int t = t0 + k * L;
        if (t < total) {
            const int j = div_by_magic(t, U, m.units_magic);
            acc += w[j] * F::dot(b.r[k], a, j * act_stride, t - j * U);
        }
    }
    return acc;
}

template <class F, class R = typename F::raw>
__device__ __forceinline__ float dot_terms(const dmat &m, int row, int T, const int *ids, const float *w,
                                           int act_stride, const act_view &a, int L, int sub,
                                           const term_batches<F, R> *first = NULL) {
    const int U = m.units, total = T * U, step = L * F::N;
    float acc = 0.0f;
    int t0 = sub;
    if (first) /* unrolled: the batches stay in registers */
#pragma unroll
        for (int i = 0; i < TERM_BATCHES; i++, t0 += step) acc += dot_term_batch<F>(first->b[i], t0, m, total, w, act_stride, a, L);
    for (; t0 < total; t0 += step) {
        unit_batch<F> b;
        load_terms<F>(b, m, row, T, [&](int j) { return ids ? ids[j] : 0; }, t0, L);
        acc += dot_term_batch<F>(b, t0, m, total, w, act_stride, a, L);
    }
    return acc;
}

/* L2 prefetch of n floats that a kernel reads only after its wait but that
 * no launch writes (norm weights, a RoPE row), issued before the wait: the
 * weights streaming through L2 evict such small constants between layers,
 * and their DRAM round trip would otherwise follow the wait. */
__device__ __forceinline__ void prefetch_floats(const float *p, int n) {
    if (!p) return;
    for (int i = threadIdx.x * 32; i < n; i += blockDim.x * 32) prefetch_l2(p + i);
}

/* ---------------------------------------------------------------- gemv */

/* The order routing ranks experts by: probability first (NaN as -inf, -0
 * as +0), then the lower id; one integer compare. 0 ranks below every key. */
__device__ __forceinline__ uint64_t route_key(float p, int id) {
    if (isnan(p)) p = -INFINITY;
    if (p == 0.0f) p = 0.0f;
    uint32_t u = __float_as_uint(p);
    u = u & 0x80000000u ? ~u : u | 0x80000000u;
    return (uint64_t)u << 32 | (0xffffffffu - (uint32_t)id);
}

/* The probability a key's high word was made from (route_key undone). */
__device__ __forceinline__ float route_key_prob(uint32_t hi) {
    return __uint_as_float(hi & 0x80000000u ? hi & 0x7fffffffu : ~hi);
}

/* One warp routes one token, in registers: cpu_route on the logits at r.logits, the k experts and their weights to
 * ids[0..k) and weights[0..k) (lanes < k write; weights may be NULL). No
 * block barrier and no shared memory, so every block of ffn_up routes for
 * itself instead of waiting on a router's last block (decode-plan fact
 * 24): k rounds of a two-word warp max (redux.sync) over each lane's best
 * remaining key. PER: experts a lane (n_experts <= 32 PER). */
template <int PER>
__device__ __forceinline__ void route_warp_of(const route_spec &r, float *weights, int *ids) {
    const int lane = threadIdx.x & 31, n = r.n_experts;
    float p[PER];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        p[i] = lane + 32 * i < n ? __ldcg(r.logits + lane + 32 * i) : -INFINITY;
        m = fmaxf(m, p[i]);
    }
    if (r.gating == 0) {
        m = warp_max(m);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (lane + 32 * i < n) sum += p[i] = expf(p[i] - m);
        const float inv = (float)(1.0 / (double)warp_sum(sum));
#pragma unroll
        for (int i = 0; i < PER; i++) p[i] *= inv;
    } else {
#pragma unroll
        for (int i = 0; i < PER; i++) p[i] = 1.0f / (1.0f + expf(-p[i]));
    }
    uint64_t key[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) key[i] = lane + 32 * i < n ? route_key(p[i], lane + 32 * i) : 0;
    float sum = 0.0f, my_w = 0.0f; /* the sum in the CPU's order: rank 0 first */
    int my_id = 0;
#pragma unroll 1 /* a round is a dependent chain: unrolled it only grows the code */
    for (int j = 0; j < r.k; j++) {
        uint64_t best = 0;
#pragma unroll
        for (int i = 0; i < PER; i++) best = key[i] > best ? key[i] : best;
        const uint32_t hi = __reduce_max_sync(FULL_MASK, (uint32_t)(best >> 32));
        const uint32_t lo = __reduce_max_sync(FULL_MASK, (uint32_t)(best >> 32) == hi ? (uint32_t)best : 0u);
        const uint64_t win = (uint64_t)hi << 32 | lo;
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (key[i] == win) key[i] = 0;
        const float w = route_key_prob(hi);
        sum += w;
        if (lane == j) my_w = w, my_id = (int)(0xffffffffu - lo);
    }
    if (lane < r.k) {
        if (r.norm_topk) my_w /= sum;
        if (weights) weights[lane] = my_w * r.w_scale;
        ids[lane] = my_id;
    }
}

/* The instance a router's size runs: 128 experts or fewer (Qwen3, OLMoE,
 * Mixtral) run half the code of 256 (each KB of it is fetched cold every
 * layer, decode-plan fact 20). */
__device__ __forceinline__ void route_warp(const route_spec &r, float *weights, int *ids) {
    static_assert(MAX_ROUTED_EXPERTS == 256, "route_warp's instances cover 256 experts");
    if (r.n_experts <= 128) route_warp_of<4>(r, weights, ids);
    else route_warp_of<8>(r, weights, ids);
}

/* route_warp for block 0 of ffn_up: the ids to its shared slot_ids and to
 * ids/weights in device memory, fenced before the launch of ffn_down
 * (which reads them before its wait, and checks them after it). */
__device__ __forceinline__ void publish_route(const route_spec &r, int *slot_ids, int *ids, float *weights) {
    route_warp(r, weights, slot_ids);
    const int lane = threadIdx.x & 31;
    if (lane < r.k) ids[lane] = slot_ids[lane];
    __threadfence();
    pdl_launch_dependents();
}

/* Rows a warp visits up to which gemv_kernel prefetches the next row
 * rather than keep the activation in registers, for the formats that opt
 * in with row_ahead (moe lab, Q4_K: the 4096 x 2048 projection 5.1 -> 4.8
 * us; the head's 36 rows a warp would go 56 -> 64 us; Q6_K and Q5_K got
 * no faster and Q6_K spilled registers). */
#define FEW_ROWS 4
template <class F>
struct row_ahead {
    static constexpr bool value = false;
};

/* How gemv_kernel walks its rows, chosen on the host per launch (gemv_rows)
 * and a template parameter like the epilogue, so that a kernel carries
 * only the code of its own way: ROWS_AHEAD, one batch a row and a few rows
 * a warp, the next row's batch loaded before this one is multiplied (the
 * layers' projections); ROWS_ACT, one batch a row and many rows, the
 * activation in registers; ROWS_STREAM, the same with the rows streamed
 * through shared memory (row_stream: the output head); ROWS_LOOP, rows of
 * several batches. */
enum { ROWS_AHEAD, ROWS_ACT, ROWS_STREAM, ROWS_LOOP };

template <class F>
inline int gemv_rows(int units, int lanes, int total, int grid, int stages) {
    const int stride = grid * GEMV_WARPS * (32 / lanes);
    if (stages > 0) return ROWS_STREAM; /* gemv_stream_stages' shapes take one batch a row */
    if (row_ahead<F>::value && units <= lanes * F::N && total <= FEW_ROWS * stride) return ROWS_AHEAD;
    return units <= lanes * F::N ? ROWS_ACT : ROWS_LOOP;
}

/* ROWS_STREAM: a block's rows, a run of whole tiles of a row group a warp
 * (gemv_tile_rows), arrive in shared memory by bulk copies, `stages` tiles
 * in flight: thread 0 issues the first ones before the kernel's wait, and
 * each later one as soon as every warp has read the stage it refills into
 * registers. A multiprocessor then keeps 100 KB or more of the matrix in
 * flight, where registers held a row or two a warp (bench/decode-plan.md,
 * fact 73). A stage has two barriers: `full`, whose phase ends when its
 * tile has landed, and `empty`, whose phase ends when the block's warps
 * have each arrived done with it; so a warp that finishes a tile goes on
 * to the next one that has landed without waiting for the others (a block
 * barrier a tile left the arithmetic of every warp in step, fact 74), and
 * a stage is refilled while its rows are multiplied, not after (fact 75).
 * Layout after the staged activation (gemv_stream_layout_of): stages x
 * (body rows, then meta rows), then the full and the empty barriers. */
struct row_stream {
    const dmat *w;
    uint8_t *tiles;
    uint64_t *full, *empty;
    int rows_per_tile, stages, stage_bytes, total, first, n; /* this block's tiles first .. first + n */

    /* The barriers initialised and the first tiles' copies issued, by
     * thread 0 (the kernel's first block barrier publishes the barriers);
     * act: the activation's kind (ACT_*), staged before the tiles. */
    __device__ __forceinline__ row_stream(const gemv_args &a, uint8_t *smem, int act)
        : w(&a.seg[0].w), rows_per_tile(gemv_tile_rows(a.lanes)), stages(a.stages), total(a.seg_end[0]) {
        const gemv_stream_layout l = gemv_stream_layout_of(*w, a.lanes, act, a.in.n, stages);
        tiles = smem + l.tiles, full = (uint64_t *)(smem + l.bars), empty = full + stages;
        stage_bytes = (int)l.stage_bytes;
        const int all = (total + rows_per_tile - 1) / rows_per_tile;
        first = (int)((int64_t)all * blockIdx.x / gridDim.x);
        n = (int)((int64_t)all * (blockIdx.x + 1) / gridDim.x) - first;
        if (threadIdx.x == 0) {
            for (int s = 0; s < stages; s++) mbar_init(&full[s]), mbar_init(&empty[s], GEMV_WARPS);
            for (int i = 0; i < stages && i < n; i++) issue(i);
        }
    }
    /* thread 0: the copies of this block's tile i into its stage */
    __device__ __forceinline__ void issue(int i) {
        const int r0 = (first + i) * rows_per_tile, rows = min(rows_per_tile, total - r0), s = i % stages;
        const unsigned body_bytes = (unsigned)(rows * w->row_stride), meta_bytes = (unsigned)(rows * w->meta_row_stride);
        mbar_expect(&full[s], body_bytes + meta_bytes);
        bulk_copy(body(i, 0), w->body + (int64_t)r0 * w->row_stride, body_bytes, &full[s]);
        if (meta_bytes) bulk_copy(meta(i, 0), w->meta + (int64_t)r0 * w->meta_row_stride, meta_bytes, &full[s]);
    }
    /* Tile i once it has landed: its first row. Every thread calls it, in order. */
    __device__ __forceinline__ int wait(int i) const {
        mbar_wait(&full[i % stages], (unsigned)(i / stages) & 1u);
        return (first + i) * rows_per_tile;
    }
    /* This warp has read its rows of tile i into registers (every lane
     * calls it); thread 0 then refills the stage with tile i + stages once
     * every warp has, so the copy is in flight while the rows are
     * multiplied. The arrival releases the warp's reads (mbarrier.arrive's
     * release semantics) before the copy may overwrite them. */
    __device__ __forceinline__ void release(int i) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[i % stages]);
        if (threadIdx.x == 0 && i + stages < n) {
            mbar_wait(&empty[i % stages], (unsigned)(i / stages) & 1u);
            issue(i + stages);
        }
    }
    /* the body and meta of row r of tile i */
    __device__ __forceinline__ uint8_t *body(int i, int r) const {
        return tiles + (size_t)(i % stages) * stage_bytes + (size_t)r * w->row_stride;
    }
    __device__ __forceinline__ uint8_t *meta(int i, int r) const {
        return tiles + (size_t)(i % stages) * stage_bytes + (size_t)rows_per_tile * w->row_stride +
               (size_t)r * w->meta_row_stride;
    }
};

/* What kernels that do not stream hold in its place. */
struct no_stream {};

/* The largest (value, row) of the block's threads, the lowest row among
 * equals, into thread 0's; red_v and red_i: GEMV_WARPS each of shared
 * scratch. Every thread calls it. */
__device__ __forceinline__ void block_best(float &best, int &best_row, float *red_v, int *red_i) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, best, off);
        const int oi = __shfl_xor_sync(FULL_MASK, best_row, off);
        if (ov > best || (ov == best && oi < best_row)) best = ov, best_row = oi;
    }
    __syncthreads();
    if (lane == 0) red_v[warp] = best, red_i[warp] = best_row;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < GEMV_WARPS; w++)
            if (red_v[w] > best || (red_v[w] == best && red_i[w] < best_row)) best = red_v[w], best_row = red_i[w];
}

/* EPI is the launch's epilogue (EPI_NONE, EPI_ARGMAX), a template
 * parameter so that the plain products carry no argmax code: a kernel's
 * code is fetched from memory at every layer (the weights stream through
 * L2), and small code starts sooner. */
template <class F, int EPI, int ROWS>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(const gemv_args a) {
    DYN_SMEM(uint8_t, smem);
    trace_mark(a.trace, TRACE_ENTRY);
    const int L = a.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int total = a.seg_end[a.n_seg - 1];
    const int start = (blockIdx.x * GEMV_WARPS + warp) * G, stride = gridDim.x * GEMV_WARPS * G;
    /* row -> its segment and the row's weights */
    auto locate = [&](int row, int *seg, int *r) {
        int s = 0;
        while (s + 1 < a.n_seg && row >= a.seg_end[s]) s++;
        *seg = s;
        *r = row - (s ? a.seg_end[s - 1] : 0);
    };
    /* row's batch into b, if the row exists */
    auto load_row = [&](int row, unit_batch<F> &b) {
        if (row >= total) return;
        int s, r;
        locate(row, &s, &r);
        const dmat &w = a.seg[s].w;
        load_batch<F>(b, w.body + (int64_t)r * w.row_stride, w.meta + (int64_t)r * w.meta_row_stride, w.units, sub, L);
    };
    /* The old value a residual row (accumulate) adds to, 0 for others. The
     * one residual product, o, follows the attention, so x was written two
     * launches or more before and may be read before the wait: the row's
     * store then follows its dot product without an L2 round trip. */
    auto residual = [&](int row) {
        if (row >= total) return 0.0f;
        int s, r;
        locate(row, &s, &r);
        return a.seg[s].accumulate ? __ldcg(a.seg[s].out + r) : 0.0f;
    };
    const int U = a.seg[0].w.units; /* every segment multiplies the same input */
    unit_batch<F> first, second;
    /* ROWS_STREAM: the first tiles' copies issued */
    auto stream = [&] {
        if constexpr (ROWS == ROWS_STREAM) return row_stream(a, smem, F::ACT);
        else return no_stream{};
    }();
    if constexpr (ROWS != ROWS_STREAM) load_row(start + grp, first);
    /* ROWS_AHEAD: a warp's second row too (q|k|v: a fifth of the warps
     * have one, and loaded after the wait it was the launch's tail), and
     * both prepared before the wait */
    prep_batch<F> pfirst, psecond;
    float old_first = 0.0f, old_second = 0.0f;
    if constexpr (ROWS == ROWS_AHEAD) {
        old_first = residual(start + grp), old_second = residual(start + grp + stride);
        load_row(start + grp + stride, second);
        if (start + grp < total) pfirst = prepare_batch<F>(first, U, sub, L);
        if (start + grp + stride < total) psecond = prepare_batch<F>(second, U, sub, L);
    }
    prefetch_floats(a.in.norm, a.in.n);
    pdl_wait();
    pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    const float norm_scale = stage_act(F::ACT, a.in, smem);
    trace_mark(a.trace, TRACE_STAGED);
    const act_view av = act_view_of(F::ACT, smem, a.in.n);
    float best = -INFINITY;
    int best_row = 0x7fffffff;
    /* a row's lanes' partial sums: the group's sum to the output (every
     * lane calls it); a residual row adds `old` if it was read before
     * (have_old), else its output as it is now */
    auto finish_row = [&](int row, float acc, float old, bool have_old) {
        acc = group_sum(acc, L) * norm_scale;
        if (row >= total || sub != 0) return;
        int s, r;
        locate(row, &s, &r);
        const gemv_seg &sg = a.seg[s];
        if (sg.bias) acc += sg.bias[r];
        if (sg.accumulate) acc += have_old ? old : sg.out[r];
        sg.out[r] = acc;
        if (acc > best || (acc == best && r < best_row)) best = acc, best_row = r;
    };
    /* row by row with `dot_row(w, r, pre)`, the first row from `first` */
    auto run = [&](auto dot_row) {
        auto do_row = [&](int base, const unit_batch<F> *pre) {
            const int row = base + grp;
            int s = 0, r = 0;
            if (row < total) locate(row, &s, &r);
            finish_row(row, row < total ? dot_row(a.seg[s].w, r, pre) : 0.0f, 0.0f, false);
        };
        for_each_row(start, stride, total, first, do_row);
    };
    if constexpr (ROWS == ROWS_AHEAD) {
        /* One batch a row, a few rows a warp (the layers' projections):
         * the first two rows were loaded and prepared before the wait, and
         * each later row is loaded as the row two before it is done, so
         * that one is always in flight. The activation is read from shared
         * memory: two batches leave no registers for it, and for a row or
         * two loading it into registers does not pay. */
        unit_batch<F> b, next;
        auto step = [&](int row, const auto &batch, float old, unit_batch<F> &load_into) {
            finish_row(row, row < total ? dot_batch<F>(batch, U, sub, L, av, 0) : 0.0f, old, true);
            load_row(row + 2 * stride, load_into);
        };
        if (start < total) step(start + grp, pfirst, old_first, b);
        if (start + stride < total) step(start + stride + grp, psecond, old_second, next);
        for (int base = start + 2 * stride; base < total; base += stride) {
            const int row = base + grp;
            finish_row(row, row < total ? dot_batch<F>(b, U, sub, L, av, 0) : 0.0f, 0.0f, false);
            b = next;
            load_row(row + 2 * stride, next);
        }
    } else if constexpr (ROWS == ROWS_STREAM) {
        act_batch<F> x;
        load_acts<F>(x, av, 0, U, sub, L);
        const int r = warp * G + grp; /* this lane's row of each tile */
        for (int i = 0; i < stream.n; i++) {
            const int row = stream.wait(i) + r;
            unit_batch<F> b;
            if (row < total) load_batch<F, F::N, from_shared>(b, stream.body(i, r), stream.meta(i, r), U, sub, L);
            stream.release(i);
            finish_row(row, row < total ? dot_batch_act<F>(b, x, U, sub, L, av) : 0.0f, 0.0f, false);
        }
    } else if constexpr (ROWS == ROWS_ACT) {
        act_batch<F> x;
        load_acts<F>(x, av, 0, U, sub, L);
        run([&](const dmat &w, int r, const unit_batch<F> *pre) {
            unit_batch<F> b;
            if (pre) b = *pre;
            else load_batch<F>(b, w.body + (int64_t)r * w.row_stride, w.meta + (int64_t)r * w.meta_row_stride, U, sub, L);
            return dot_batch_act<F>(b, x, U, sub, L, av);
        });
    } else {
        run([&](const dmat &w, int r, const unit_batch<F> *pre) {
            return dot_units<F>(w.body + (int64_t)r * w.row_stride, w.meta + (int64_t)r * w.meta_row_stride, U, av, 0,
                                L, sub, pre);
        });
    }
    trace_block_mark(a.trace, TRACE_WORKED);
    if (EPI == EPI_NONE) return;
    int *flag = (int *)smem;
    /* EPI_ARGMAX: the block's best row, then the best of all blocks, the
     * last block's threads reading the blocks' partials side by side
     * (thread 0 alone read them one round trip after another) */
    float *red_v = (float *)(smem + 16);
    int *red_i = (int *)(smem + 16 + 4 * GEMV_WARPS);
    block_best(best, best_row, red_v, red_i);
    if (threadIdx.x == 0) {
        a.part_val[blockIdx.x] = best;
        a.part_idx[blockIdx.x] = best_row;
    }
    if (!last_block(a.counter, gridDim.x, flag)) return;
    best = -INFINITY, best_row = 0x7fffffff;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        const float v = __ldcg(a.part_val + b);
        const int i = __ldcg(a.part_idx + b);
        if (v > best || (v == best && i < best_row)) best = v, best_row = i;
    }
    block_best(best, best_row, red_v, red_i);
    if (threadIdx.x != 0) return;
    if (best_row == 0x7fffffff) best_row = 0;
    const int pos = a.step[1];
    if (a.history) a.history[pos] = best_row;
    a.step[0] = best_row; /* the next step decodes it at the next position */
    a.step[1] = pos + 1;
}

/* ---------------------------------------------------------------- FFN */

/* ACT_REGS: one batch a row (units <= lanes * NP), the activation in
 * registers; a template parameter as gemv_kernel's ROWS. SHARED: the
 * launch has a shared expert or is a dense FFN, as ffn_down's (without the
 * shared gate's code, Qwen3's decode ran 617.0 vs 610.4 tok/s: fact 35). */
template <class F, bool ACT_REGS, bool SHARED>
__global__ void __launch_bounds__(GEMV_THREADS) ffn_up_kernel(const ffn_up_args a) {
    DYN_SMEM(uint8_t, smem);
    const int L = a.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int R = a.gate.rows, routed_rows = a.n_routed * R;
    const int total = routed_rows + (SHARED && a.has_shared ? a.sh_gate.rows : 0);
    const float *shgate_w = SHARED ? a.shgate_w : NULL;
    const int start = (blockIdx.x * GEMV_WARPS + warp) * G, stride = gridDim.x * GEMV_WARPS * G;
    /* row -> the gate and up rows it multiplies */
    struct pair_rows {
        const uint8_t *gb, *gm, *ub, *um;
    };
    __shared__ int slot_ids[MAX_EXPERTS_USED];
    auto locate = [&](int row) {
        const bool routed = !SHARED || row < routed_rows;
        const int j = routed ? div_by_magic(row, R, a.gate.rows_magic) : 0, r = routed ? row - j * R : row - routed_rows;
        const int e = routed ? slot_ids[j] : 0;
        const dmat &mg = routed ? a.gate : a.sh_gate, &mu = routed ? a.up : a.sh_up;
        pair_rows p;
        p.gb = mg.body + e * mg.expert_stride + (int64_t)r * mg.row_stride;
        p.gm = mg.meta + e * mg.meta_expert_stride + (int64_t)r * mg.meta_row_stride;
        p.ub = mu.body + e * mu.expert_stride + (int64_t)r * mu.row_stride;
        p.um = mu.meta + e * mu.meta_expert_stride + (int64_t)r * mu.meta_row_stride;
        return p;
    };
    const int U = a.n_routed ? a.gate.units : a.sh_gate.units;
    trace_mark(a.trace, TRACE_ENTRY);
    if (a.act_ready) {
        stage_act_normed(F::ACT, a.in, smem, shgate_w, a.shgate_out);
    } else {
        prefetch_floats(a.in.norm, a.in.n);
        prefetch_floats(shgate_w, a.in.n);
    }
    pdl_wait(); /* the router's logits */
    /* Block 0 publishes the routing for ffn_down, which reads it before its
     * own wait: block 0 lets it launch only once the routing is written. */
    const bool publishes = a.route.logits && blockIdx.x == 0;
    if (!publishes) pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    /* once a block: a warp's later rows then locate theirs without an L2 round trip */
    if (a.route.logits) {
        if (warp == 0 && publishes) publish_route(a.route, slot_ids, a.route_ids, a.route_w);
        else if (warp == 0) route_warp(a.route, NULL, slot_ids);
    } else if (threadIdx.x < a.n_routed) {
        slot_ids[threadIdx.x] = a.ids ? __ldcg(a.ids + threadIdx.x) : 0;
    }
    __syncthreads();
    if (a.act_ready) trace_mark(a.trace, TRACE_STAGED);
    pair_batch<F> first;
    if (start + grp < total) {
        const pair_rows p = locate(start + grp);
        load_pair<F>(first, p.gb, p.gm, p.ub, p.um, U, sub, L);
    }
    if (!a.act_ready) {
        stage_act_normed(F::ACT, a.in, smem, shgate_w, a.shgate_out);
        trace_mark(a.trace, TRACE_STAGED);
    }
    const act_view av = act_view_of(F::ACT, smem, a.in.n);
    /* a row's lanes' partial sums of gate and up: h to its place (every lane calls it) */
    auto finish_row = [&](int row, float g, float u) {
        g = group_sum(g, L);
        u = group_sum(u, L);
        if (row < total && sub == 0)
            a.h[!SHARED || row < routed_rows ? row : a.h_shared_off + row - routed_rows] = g / (1.0f + expf(-g)) * u; /* cpu_swiglu */
    };
    constexpr int NP = pair_batch<F>::NP;
    if constexpr (ACT_REGS) {
        /* One batch a row: the activation in registers, and each row's
         * batch loaded before the row before it is multiplied, so that a
         * warp's rows (about three for Qwen3's 8 x 768) overlap their round
         * trips instead of taking one each. */
        act_batch<F, NP> x;
        load_acts<F, NP>(x, av, 0, U, sub, L);
        pair_batch<F> b = first;
        for (int base = start; base < total; base += stride) {
            const int row = base + grp;
            pair_batch<F> next;
            if (row + stride < total) {
                const pair_rows p = locate(row + stride);
                load_pair<F>(next, p.gb, p.gm, p.ub, p.um, U, sub, L);
            }
            float g = 0.0f, u = 0.0f;
            if (row < total) {
                g = dot_batch_act<F, NP>(b.a, x, U, sub, L, av);
                u = dot_batch_act<F, NP>(b.b, x, U, sub, L, av);
            }
            finish_row(row, g, u);
            b = next;
        }
    } else {
        auto do_row = [&](int base, const pair_batch<F> *pre) {
            const int row = base + grp;
            float g = 0.0f, u = 0.0f;
            if (row < total) {
                const pair_rows p = locate(row);
                dot_units_pair<F>(p.gb, p.gm, p.ub, p.um, U, av, L, sub, &g, &u, pre);
            }
            finish_row(row, g, u);
        };
        for_each_row(start, stride, total, first, do_row);
    }
    trace_block_mark(a.trace, TRACE_WORKED);
}

/* SHARED: the launch has a shared expert (a template parameter: a MoE
 * without one carries none of its code). */
template <class F, bool SHARED>
__global__ void __launch_bounds__(GEMV_THREADS) ffn_down_kernel(const ffn_down_args a) {
    DYN_SMEM(uint8_t, smem);
    __shared__ int guessed[MAX_EXPERTS_USED], ids[MAX_EXPERTS_USED];
    __shared__ float weights[MAX_EXPERTS_USED];
    __shared__ float sh_weight;
    __shared__ int guessed_wrong;
    __shared__ float x_first[GEMV_THREADS]; /* x of the first row of each row group, at its lane 0 */
    const int L = a.lanes, G = 32 / L, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (L - 1), grp = lane / L;
    const int total = a.n_routed ? a.down.rows : a.sh_down.rows;
    const int start = (blockIdx.x * GEMV_WARPS + warp) * G, stride = gridDim.x * GEMV_WARPS * G;
    trace_mark(a.trace, TRACE_ENTRY);
    /* The ids come from the launch before (ffn_up's block 0, which writes
     * them before it lets this launch start): read before the wait they are
     * a guess, right but for a race the PDL contract does not rule out, that
     * lets the first rows load before it; checked after the wait. */
    if (a.n_routed) {
        if (threadIdx.x < a.n_routed) guessed[threadIdx.x] = a.ids ? __ldcg(a.ids + threadIdx.x) : 0;
        if (threadIdx.x == 0) guessed_wrong = 0;
        __syncthreads();
    }
    term_batches<F> loaded;
    prep_terms<F> first; /* prepared before the wait */
    if (start + grp < total) {
        if (a.n_routed) {
            load_first_terms<F>(loaded, a.down, start + grp, a.n_routed, [&](int j) { return guessed[j]; }, sub, L);
            first = prepare_terms<F>(loaded, a.n_routed * a.down.units, sub, L);
        } else if (SHARED) {
            const dmat &m = a.sh_down;
            const int row = start + grp;
            load_batch<F>(loaded.b[0], m.body + (int64_t)row * m.row_stride, m.meta + (int64_t)row * m.meta_row_stride,
                          m.units, sub, L);
            first.b[0] = prepare_batch<F>(loaded.b[0], m.units, sub, L);
        }
    }
    /* The first row's residual, when the launch before did not write it
     * (x_ready: the routed or dense down, after ffn_up), is read before the
     * wait (see gemv_kernel's residual), into shared memory: a register
     * held across the wait spilled. */
    const bool x_early = a.x_ready && sub == 0 && start + grp < total;
    if (x_early) x_first[threadIdx.x] = __ldcg(a.x + start + grp);
    pdl_wait();
    pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    if (threadIdx.x < a.n_routed) {
        ids[threadIdx.x] = a.ids ? __ldcg(a.ids + threadIdx.x) : 0;
        weights[threadIdx.x] = a.route_w ? __ldcg(a.route_w + threadIdx.x) : 1.0f;
        if (ids[threadIdx.x] != guessed[threadIdx.x]) guessed_wrong = 1;
    }
    if (threadIdx.x == 0) sh_weight = a.shgate ? *a.shgate : 1.0f;
    stage_act<true>(F::ACT, a.in, smem); /* no norm; ends with a barrier */
    trace_mark(a.trace, TRACE_STAGED);
    if (a.n_routed && guessed_wrong && start + grp < total) { /* the rows loaded before the wait are the wrong experts' */
        term_batches<F> reloaded;
        load_first_terms<F>(reloaded, a.down, start + grp, a.n_routed, [&](int j) { return ids[j]; }, sub, L);
        first = prepare_terms<F>(reloaded, a.n_routed * a.down.units, sub, L);
    }
    const act_view av = act_view_of(F::ACT, smem, a.in.n);
    auto do_row = [&](int base, const prep_terms<F> *pre) {
        const int row = base + grp;
        const bool valid = row < total;
        float acc = 0.0f;
        if (valid && a.n_routed)
            acc = dot_terms<F>(a.down, row, a.n_routed, ids, weights, a.routed_act_stride, av, L, sub, pre);
        if (SHARED && valid && a.has_shared) {
            const dmat &m = a.sh_down;
            const uint8_t *body = m.body + (int64_t)row * m.row_stride, *meta = m.meta + (int64_t)row * m.meta_row_stride;
            /* `first` holds the shared expert's row only when no routed one came first */
            acc += sh_weight * (a.n_routed || !pre ? dot_units<F>(body, meta, m.units, av, a.shared_act_off, L, sub)
                                                   : dot_units<F>(body, meta, m.units, av, a.shared_act_off, L, sub,
                                                                  &pre->b[0]));
        }
        acc = group_sum(acc, L);
        if (valid && sub == 0) a.x[row] = acc + (pre && x_early ? x_first[threadIdx.x] : a.x[row]);
    };
    for_each_row(start, stride, total, first, do_row);
    trace_block_mark(a.trace, TRACE_WORKED);
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
#include "cuda/expert_codes.cuh"
#include "cuda/moe_ffn.cuh"

/* The launches of a format's kernels, each picking the instance for the
 * launch's shape (gemv_rows, ffn_up's ACT_REGS and SHARED, ffn_down's SHARED). */
template <class F, int EPI>
static void launch_gemv_as(const gemv_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {
    const int rows = gemv_rows<F>(a->seg[0].w.units, a->lanes, a->seg_end[a->n_seg - 1], grid, a->stages);
    if (rows == ROWS_AHEAD) LAUNCH_PDL(pdl, (gemv_kernel<F, EPI, ROWS_AHEAD>), grid, GEMV_THREADS, smem, st, *a);
    else if (rows == ROWS_ACT) LAUNCH_PDL(pdl, (gemv_kernel<F, EPI, ROWS_ACT>), grid, GEMV_THREADS, smem, st, *a);
    else if (rows == ROWS_STREAM) LAUNCH_PDL(pdl, (gemv_kernel<F, EPI, ROWS_STREAM>), grid, GEMV_THREADS, smem, st, *a);
    else LAUNCH_PDL(pdl, (gemv_kernel<F, EPI, ROWS_LOOP>), grid, GEMV_THREADS, smem, st, *a);
}

template <class F>
static void launch_gemv(const gemv_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {
    if (a->epilogue == EPI_ARGMAX) launch_gemv_as<F, EPI_ARGMAX>(a, grid, smem, st, pdl);
    else launch_gemv_as<F, EPI_NONE>(a, grid, smem, st, pdl);
}

template <class F, bool SHARED>
static void launch_up_as(const ffn_up_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {
    const int units = a->n_routed ? a->gate.units : a->sh_gate.units;
    if (units <= a->lanes * pair_batch<F>::NP)
        LAUNCH_PDL(pdl, (ffn_up_kernel<F, true, SHARED>), grid, GEMV_THREADS, smem, st, *a);
    else LAUNCH_PDL(pdl, (ffn_up_kernel<F, false, SHARED>), grid, GEMV_THREADS, smem, st, *a);
}

template <class F>
static void launch_up(const ffn_up_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {
    if (a->has_shared) launch_up_as<F, true>(a, grid, smem, st, pdl);
    else launch_up_as<F, false>(a, grid, smem, st, pdl);
}

template <class F>
static void launch_down(const ffn_down_args *a, int grid, size_t smem, cudaStream_t st, bool pdl) {
    if (a->has_shared) LAUNCH_PDL(pdl, (ffn_down_kernel<F, true>), grid, GEMV_THREADS, smem, st, *a);
    else LAUNCH_PDL(pdl, (ffn_down_kernel<F, false>), grid, GEMV_THREADS, smem, st, *a);
}

template <class F>
static void launch_embed(const dmat *m, const int *step, float *x, cudaStream_t st, bool pdl) {
    const int grid = (m->units + 255) / 256;
    LAUNCH_PDL(pdl, embed_kernel<F>, grid, 256, 0, st, *m, step, x);
}

/* Blocks a multiprocessor of kernel 0 (gemv), 1 (ffn_up), 2 (ffn_down);
 * the instances of one kernel differ in code, not in their limits. */
template <class F>
static int format_occupancy(int kernel, size_t smem) {
    int n = 0;
    cudaError_t e = kernel == 0   ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemv_kernel<F, EPI_NONE, ROWS_ACT>, GEMV_THREADS, smem)
                    : kernel == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ffn_up_kernel<F, true, false>, GEMV_THREADS, smem)
                                  : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ffn_down_kernel<F, false>, GEMV_THREADS, smem);
    return e == cudaSuccess && n > 0 ? n : 1;
}

template <class K>
static cudaError_t allow_smem_of(K kernel, int bytes, cudaError_t e) {
    return e == cudaSuccess ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) : e;
}

template <class F>
static cudaError_t format_allow_stream_smem(int bytes) {
    cudaError_t e = allow_smem_of(gemv_kernel<F, EPI_NONE, ROWS_STREAM>, bytes, cudaSuccess);
    return allow_smem_of(gemv_kernel<F, EPI_ARGMAX, ROWS_STREAM>, bytes, e);
}

template <class F>
static cudaError_t format_allow_smem(int bytes) {
    cudaError_t e = cudaSuccess;
    e = allow_smem_of(gemv_kernel<F, EPI_NONE, ROWS_AHEAD>, bytes, e);
    e = allow_smem_of(gemv_kernel<F, EPI_NONE, ROWS_ACT>, bytes, e);
    e = allow_smem_of(gemv_kernel<F, EPI_NONE, ROWS_LOOP>, bytes, e);
    e = allow_smem_of(gemv_kernel<F, EPI_ARGMAX, ROWS_AHEAD>, bytes, e);
    e = allow_smem_of(gemv_kernel<F, EPI_ARGMAX, ROWS_ACT>, bytes, e);
    e = allow_smem_of(gemv_kernel<F, EPI_ARGMAX, ROWS_LOOP>, bytes, e);
    e = allow_smem_of(ffn_up_kernel<F, true, false>, bytes, e);
    e = allow_smem_of(ffn_up_kernel<F, false, false>, bytes, e);
    e = allow_smem_of(ffn_up_kernel<F, true, true>, bytes, e);
    e = allow_smem_of(ffn_up_kernel<F, false, true>, bytes, e);
    e = allow_smem_of(ffn_down_kernel<F, true>, bytes, e);
    return allow_smem_of(ffn_down_kernel<F, false>, bytes, e);
}

/* Everything a family file provides for its format F: the table entry
 * cuda_formats[] points at (cuda_model.cu); the prefill's dequantization
 * and experts' products come from dequant.cuh, expert_gemm.cuh and
 * expert_codes.cuh. */
#define DEFINE_CUDA_FORMAT(F, ident)                                                                              \
    extern const cuda_format cuda_format_##ident = {                                                            \
        F::TYPE,          #ident,         F::BLOCK,        F::BODY,         F::META,                 F::UNITS,  \
        F::ACT,           F::N,           F::repack,       launch_gemv<F>,  launch_up<F>,            launch_down<F>, \
        launch_embed<F>,  format_occupancy<F>, format_allow_smem<F>, format_allow_stream_smem<F>, launch_dequant<F>, \
        launch_expert_products<F>, expert_products_from_codes<F>, moe_ffn_of<F>()};

#endif
