/*
 * attention.cu — one layer's attention for one new token, in one launch:
 * q/k norm, RoPE, appending k and v to the cache, and attention over the
 * cache split across blocks (flash-decoding).
 *
 * Grid: (KV heads, splits); block (g, s) serves the G = n_heads / n_kv
 * query heads that share KV head g (GQA: the keys and values are read once
 * for all G) over positions [s * chunk, (s + 1) * chunk) clipped to the
 * current position. Every block prepares its own copy of the G query heads
 * and of the new key and value (normalised, rotated) from the q|k|v
 * projection: redundant work of a few hundred flops, in exchange for no
 * extra launch. The block whose range holds the current position writes
 * the new key and value to the cache; it uses them from shared memory, and
 * the other blocks only read earlier positions, so nobody reads a cache
 * entry while it is written.
 *
 * Each block leaves, per query head, the running max m, the sum l of
 * exp(score - m) and the unnormalised sum of exp(score - m) * v; the last
 * block of a KV head to finish (an atomic ticket) merges the splits:
 * out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M). The position comes
 * from device memory, so the grid covers the whole context and blocks past
 * the position only take their ticket; the same launch serves every
 * position and can live in a CUDA graph.
 *
 * Ranges are short (attn_chunk, 32 positions): a decode step at position
 * p keeps n_kv * p / 32 blocks busy, each with little serial work, which is
 * what the step's latency wants at the contexts measured so far. The merge
 * is a loop over the splits, linear in the context: at thousands of
 * positions a two-level merge (or longer ranges) will pay.
 *
 * RoPE angles are computed as the CPU does (double pow, cos and sin, then
 * float), once per pair index for the block. The KV cache is f32 so the
 * GPU's attention sees the CPU's numbers; f16 halves the bytes read per
 * position and is the obvious next step once long contexts matter.
 */
#include "cuda/kernels.cuh"

#define ATTN_THREADS 128
#define ATTN_MAX_G 16

size_t cuda_attention_smem(int G, int hd, int chunk, int n_rot) {
    /* q (G*hd), k, v (hd each), scores (G*chunk), m|l (2G), cos|sin (n_rot), scratch 32 */
    return sizeof(float) * ((size_t)G * hd + 2 * (size_t)hd + (size_t)G * chunk + 2 * (size_t)G + (size_t)n_rot + 72) + 16;
}

__device__ __forceinline__ void rms_in_place(float *p, int n, const float *w, float eps, int lane) {
    double ss = 0.0; /* in double, as cpu_rmsnorm: the same scale, bit for bit */
    for (int d = lane; d < n; d += 32) ss += (double)p[d] * p[d];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, off);
    const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    __syncwarp();
    for (int d = lane; d < n; d += 32) p[d] = p[d] * scale * w[d];
    __syncwarp();
}

__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(const attn_args a) {
    DYN_SMEM(float, sm);
    pdl_wait();
    pdl_launch_dependents();
    const int G = a.n_heads / a.n_kv, hd = a.hd, g = blockIdx.x, split = blockIdx.y;
    const int kv_dim = a.n_kv * hd, q_dim = a.n_heads * hd, half = a.n_rot / 2;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5, nt = blockDim.x;
    const int pos = a.step[1], n_pos = pos + 1;
    const int start = split * a.chunk, end = min(start + a.chunk, n_pos);
    float *qs = sm, *ks = qs + G * hd, *vs = ks + hd, *sc = vs + hd, *ml = sc + G * a.chunk;
    float *cs = ml + 2 * G, *scratch = (float *)(((uintptr_t)(cs + a.n_rot) + 7) & ~(uintptr_t)7); /* 32 doubles */
    int *flag = (int *)(scratch + 66);
    float *k_cache = a.k_cache + g * hd, *v_cache = a.v_cache + g * hd;
    if (start < end) {
        const float *q_in = a.qkv + g * G * hd, *k_in = a.qkv + q_dim + g * hd, *v_in = a.qkv + q_dim + kv_dim + g * hd;
        for (int i = tid; i < G * hd; i += nt) qs[i] = q_in[i];
        for (int i = tid; i < hd; i += nt) ks[i] = k_in[i], vs[i] = v_in[i];
        for (int i = tid; i < half; i += nt) {
            double freq = pow((double)a.rope_base, -2.0 * i / a.n_rot);
            if (a.rope_freqs) freq /= a.rope_freqs[i];
            double angle = (double)pos * (double)a.freq_scale * freq;
            cs[i] = (float)cos(angle);
            cs[half + i] = (float)sin(angle);
        }
        __syncthreads();
        /* q/k norm: per head (Qwen3) or over the whole projections (OLMoE) */
        if (a.qk_norm == QK_NORM_PER_HEAD) {
            for (int v = warp; v <= G; v += nw)
                rms_in_place(v < G ? qs + v * hd : ks, hd, v < G ? a.q_norm : a.k_norm, a.eps, lane);
        } else if (a.qk_norm == QK_NORM_FULL) {
            double sq = 0.0, sk = 0.0;
            for (int i = tid; i < q_dim; i += nt) sq += (double)a.qkv[i] * a.qkv[i];
            for (int i = tid; i < kv_dim; i += nt) sk += (double)a.qkv[q_dim + i] * a.qkv[q_dim + i];
            sq = block_sum_double(sq, (double *)scratch);
            sk = block_sum_double(sk, (double *)scratch);
            const float scale_q = (float)(1.0 / sqrt(sq / (double)q_dim + (double)a.eps));
            const float scale_k = (float)(1.0 / sqrt(sk / (double)kv_dim + (double)a.eps));
            for (int i = tid; i < G * hd; i += nt) qs[i] = qs[i] * scale_q * a.q_norm[g * G * hd + i];
            for (int i = tid; i < hd; i += nt) ks[i] = ks[i] * scale_k * a.k_norm[g * hd + i];
        }
        __syncthreads();
        /* RoPE on the first n_rot dimensions of each head */
        for (int t = tid; t < (G + 1) * half; t += nt) {
            const int v = t / half, i = t - v * half;
            float *p = v < G ? qs + v * hd : ks;
            const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
            const float c = cs[i], s = cs[half + i], x0 = p[ia], x1 = p[ib];
            p[ia] = x0 * c - x1 * s;
            p[ib] = x0 * s + x1 * c;
        }
        __syncthreads();
        if (pos >= start && pos < end)
            for (int d = tid; d < hd; d += nt) {
                k_cache[(int64_t)pos * kv_dim + d] = ks[d];
                v_cache[(int64_t)pos * kv_dim + d] = vs[d];
            }
        /* scores: a warp per position, lanes over dimensions */
        const float scale = 1.0f / sqrtf((float)hd);
        const int nd = hd / 32;
        for (int p = start + warp; p < end; p += nw) {
            const float *key = p == pos ? ks : k_cache + (int64_t)p * kv_dim;
            float kr[8];
#pragma unroll
            for (int j = 0; j < 8; j++) kr[j] = j < nd ? key[lane + 32 * j] : 0.0f;
            for (int h = 0; h < G; h++) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < nd) dot += qs[h * hd + lane + 32 * j] * kr[j];
                dot = warp_sum(dot);
                if (lane == 0) sc[h * a.chunk + p - start] = dot * scale;
            }
        }
        __syncthreads();
        /* softmax statistics of this range, per head */
        const int n = end - start;
        for (int h = warp; h < G; h += nw) {
            float m = -INFINITY;
            for (int p = lane; p < n; p += 32) m = fmaxf(m, sc[h * a.chunk + p]);
            m = warp_max(m);
            float l = 0.0f;
            for (int p = lane; p < n; p += 32) {
                float e = expf(sc[h * a.chunk + p] - m);
                sc[h * a.chunk + p] = e;
                l += e;
            }
            l = warp_sum(l);
            if (lane == 0) ml[2 * h] = m, ml[2 * h + 1] = l;
        }
        __syncthreads();
        /* unnormalised outputs: a thread per dimension, G accumulators */
        float *part = a.part + (size_t)(g * a.n_splits + split) * G * (hd + 2);
        for (int d = tid; d < hd; d += nt) {
            float acc[ATTN_MAX_G];
#pragma unroll
            for (int h = 0; h < ATTN_MAX_G; h++) acc[h] = 0.0f;
#pragma unroll 4
            for (int p = start; p < end; p++) {
                const float v = p == pos ? vs[d] : v_cache[(int64_t)p * kv_dim + d];
#pragma unroll
                for (int h = 0; h < ATTN_MAX_G; h++)
                    if (h < G) acc[h] += sc[h * a.chunk + p - start] * v;
            }
#pragma unroll
            for (int h = 0; h < ATTN_MAX_G; h++)
                if (h < G) part[h * (hd + 2) + 2 + d] = acc[h];
        }
        if (tid < G) part[tid * (hd + 2)] = ml[2 * tid], part[tid * (hd + 2) + 1] = ml[2 * tid + 1];
    }
    /* the last block of this KV head merges the splits */
    __threadfence();
    __syncthreads();
    if (tid == 0) *flag = atomicAdd(&a.counters[g], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    const int n_active = (n_pos + a.chunk - 1) / a.chunk;
    for (int t = tid; t < G * hd; t += nt) {
        const int h = t / hd, d = t - h * hd;
        float M = -INFINITY;
        for (int s = 0; s < n_active; s++)
            M = fmaxf(M, __ldcg(a.part + ((size_t)(g * a.n_splits + s) * G + h) * (hd + 2)));
        float L = 0.0f, O = 0.0f;
        for (int s = 0; s < n_active; s++) {
            const float *p = a.part + ((size_t)(g * a.n_splits + s) * G + h) * (hd + 2);
            const float f = expf(__ldcg(p) - M);
            L += __ldcg(p + 1) * f;
            O += __ldcg(p + 2 + d) * f;
        }
        a.out[(g * G + h) * hd + d] = O / L;
    }
    __syncthreads();
    if (tid == 0) a.counters[g] = 0;
}

void cuda_attention(const attn_args *a, size_t smem, cudaStream_t st, bool pdl) {
    LAUNCH_PDL(pdl, attention_kernel, dim3(a->n_kv, a->n_splits), ATTN_THREADS, smem, st, *a);
}

cudaError_t cuda_attention_allow_smem(int bytes) {
    return cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
