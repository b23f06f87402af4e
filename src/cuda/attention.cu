/*
 * attention.cu — one layer's attention for one new token, in one launch:
 * q/k norm, RoPE, appending k and v to the cache, and attention over the
 * cache split across blocks (flash-decoding).
 *
 * Grid: (KV heads, S splits), S fixed per state. Block (g, s) serves the
 * G = n_heads / n_kv query heads that share KV head g (GQA: keys and values
 * are read once for all G) over its range of the positions 0..pos. The
 * position comes from device memory, so the ranges are cut on the device:
 * chunk = max(ATTN_MIN_CHUNK, ceil((pos + 1) / S)), and blocks past the end
 * only take their ticket; one launch serves every position and lives in
 * the CUDA graph.
 *
 * A block works through its range in tiles of ATTN_TILE positions: it
 * copies the tile's keys and values to shared memory with every load
 * issued before the first is used (the cost of a decode attention is the
 * latency of dependent loads, not bandwidth), computes the G x TILE scores
 * from there (rows padded by one float: no bank conflicts), and folds the
 * tile into running (max, sum, output) statistics: the online softmax.
 * Each block prepares its own copy of the G query heads and of the new key
 * and value (normalised, rotated) from the q|k|v projection: a few hundred
 * redundant flops in exchange for no extra launch. The block whose range
 * holds the current position writes the new key and value to the cache and
 * uses them from shared memory; other blocks only read earlier positions,
 * so nobody reads a cache entry while it is written.
 *
 * Each block leaves, per query head, its max m, sum l and unnormalised
 * output o; the last block of a KV head to finish (an atomic ticket)
 * merges the splits: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M),
 * with the per-split factors computed once in shared memory and the
 * loads of the o_s issued together.
 *
 * RoPE angles come from a table made on the host at state creation with
 * the CPU's formula (double pow, cos and sin, then float), so both
 * backends rotate by the same floats. The KV cache is f32 so the GPU's
 * attention sees the CPU's numbers.
 */
#include "cuda/kernels.cuh"

#define ATTN_THREADS 256
#define ATTN_TILE 32
#define ATTN_MIN_CHUNK 16
#define ATTN_MAX_PAIRS 2 /* (head, position) scores per thread: G * TILE <= 2 * 256 */
#define ATTN_MAX_OUT 16  /* (head, dim) outputs per thread: G * hd <= 16 * 256 */

/* Shared memory, in floats: q (G*hd), new k and v (hd each), the K and V
 * tiles (TILE rows of hd + 1), scores (G*TILE), per-head running max, sum
 * and rescale factor (3G), then 72 floats of scratch (block sums in
 * double, the ticket flag) — the merge reuses the tiles. */
size_t cuda_attention_smem(int G, int hd, int n_splits) {
    size_t tiles = 2 * (size_t)ATTN_TILE * (hd + 1), merge = 2 * (size_t)n_splits * G;
    size_t floats = (size_t)G * hd + 2 * (size_t)hd + (tiles > merge ? tiles : merge) + (size_t)G * ATTN_TILE +
                    3 * (size_t)G + 72;
    return sizeof(float) * floats + 16;
}

bool cuda_attention_supported(int G, int hd, int n_splits) {
    return hd % 32 == 0 && hd <= 512 && G * ATTN_TILE <= ATTN_MAX_PAIRS * ATTN_THREADS &&
           G * hd <= ATTN_MAX_OUT * ATTN_THREADS && n_splits >= 1;
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

/* The G query heads and the new key and value of KV head g, normalised
 * and rotated, into shared memory. Ends with a barrier. */
__device__ void prepare_qkv(const attn_args &a, int g, int pos, float *qs, float *ks, float *vs, double *scratch) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, half = a.n_rot / 2;
    const int kv_dim = a.n_kv * hd, q_dim = a.n_heads * hd;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const float *q_in = a.qkv + g * G * hd, *k_in = a.qkv + q_dim + g * hd, *v_in = a.qkv + q_dim + kv_dim + g * hd;
    for (int i = tid; i < G * hd; i += nt) qs[i] = q_in[i];
    for (int i = tid; i < hd; i += nt) ks[i] = k_in[i], vs[i] = v_in[i];
    __syncthreads();
    /* q/k norm: per head (Qwen3) or over the whole projections (OLMoE) */
    if (a.qk_norm == QK_NORM_PER_HEAD) {
        for (int v = warp; v <= G; v += nw)
            rms_in_place(v < G ? qs + v * hd : ks, hd, v < G ? a.q_norm : a.k_norm, a.eps, lane);
    } else if (a.qk_norm == QK_NORM_FULL) {
        double sq = 0.0, sk = 0.0;
        for (int i = tid; i < q_dim; i += nt) sq += (double)a.qkv[i] * a.qkv[i];
        for (int i = tid; i < kv_dim; i += nt) sk += (double)a.qkv[q_dim + i] * a.qkv[q_dim + i];
        sq = block_sum_double(sq, scratch);
        sk = block_sum_double(sk, scratch);
        const float scale_q = (float)(1.0 / sqrt(sq / (double)q_dim + (double)a.eps));
        const float scale_k = (float)(1.0 / sqrt(sk / (double)kv_dim + (double)a.eps));
        for (int i = tid; i < G * hd; i += nt) qs[i] = qs[i] * scale_q * a.q_norm[g * G * hd + i];
        for (int i = tid; i < hd; i += nt) ks[i] = ks[i] * scale_k * a.k_norm[g * hd + i];
    }
    __syncthreads();
    /* RoPE on the first n_rot dimensions of each head */
    const float *cs = a.rope + (int64_t)pos * a.n_rot; /* cos[half] | sin[half] */
    for (int t = tid; t < (G + 1) * half; t += nt) {
        const int v = t / half, i = t - v * half;
        float *p = v < G ? qs + v * hd : ks;
        const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
        const float c = cs[i], s = cs[half + i], x0 = p[ia], x1 = p[ib];
        p[ia] = x0 * c - x1 * s;
        p[ib] = x0 * s + x1 * c;
    }
    __syncthreads();
}

/* Rows [p0, p0 + n) of this KV head's keys and values into the padded
 * tiles; row `pos` (the new token) comes from shared memory. All loads of
 * a thread are issued before its stores. */
__device__ __forceinline__ void load_tile(const attn_args &a, const float *k_cache, const float *v_cache, int p0, int n,
                                          int pos, const float *ks, const float *vs, float *kt, float *vt) {
    const int hd = a.hd, kv_dim = a.n_kv * hd, q4 = hd / 4, per = 2 * ATTN_TILE * 128 / 4 / ATTN_THREADS;
    /* 2 * TILE rows of hd / 4 float4: at most `per` per thread for hd <= 128, looped beyond */
    for (int base = threadIdx.x; base < 2 * n * q4; base += per * ATTN_THREADS) {
        float4 r[per];
#pragma unroll
        for (int j = 0; j < per; j++) {
            const int t = base + j * ATTN_THREADS;
            if (t >= 2 * n * q4) break;
            const int which = t / (n * q4), rem = t - which * n * q4, row = rem / q4, c = rem - row * q4;
            const int p = p0 + row;
            const float *src = p == pos ? (which ? vs : ks) : (which ? v_cache : k_cache) + (int64_t)p * kv_dim;
            r[j] = *(const float4 *)(src + 4 * c);
        }
#pragma unroll
        for (int j = 0; j < per; j++) {
            const int t = base + j * ATTN_THREADS;
            if (t >= 2 * n * q4) break;
            const int which = t / (n * q4), rem = t - which * n * q4, row = rem / q4, c = rem - row * q4;
            float *dst = (which ? vt : kt) + row * (hd + 1) + 4 * c;
            dst[0] = r[j].x, dst[1] = r[j].y, dst[2] = r[j].z, dst[3] = r[j].w;
        }
    }
}

/* The last block of a KV head combines the splits' (m, l, o). */
__device__ void merge_splits(const attn_args &a, int g, int n_active, float *factors) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, S = a.n_splits;
    const float *part = a.part + (size_t)g * S * G * (hd + 2);
    /* factors[s * G + h] = e^(m_s - M) / L */
    float *m = factors, *f = factors + S * G;
    for (int t = threadIdx.x; t < n_active * G; t += blockDim.x) m[t] = __ldcg(part + (size_t)t * (hd + 2));
    __syncthreads();
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < n_active; s++) M = fmaxf(M, m[s * G + h]);
        for (int s = 0; s < n_active; s++) {
            f[s * G + h] = expf(m[s * G + h] - M);
            L += __ldcg(part + (size_t)(s * G + h) * (hd + 2) + 1) * f[s * G + h];
        }
        for (int s = 0; s < n_active; s++) f[s * G + h] /= L;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * hd; t += blockDim.x) {
        const int h = t / hd, d = t - h * hd;
        float out = 0.0f;
        int s = 0;
        for (; s + 4 <= n_active; s += 4) {
            float o[4];
#pragma unroll
            for (int j = 0; j < 4; j++) o[j] = __ldcg(part + (size_t)((s + j) * G + h) * (hd + 2) + 2 + d);
#pragma unroll
            for (int j = 0; j < 4; j++) out += o[j] * f[(s + j) * G + h];
        }
        for (; s < n_active; s++) out += __ldcg(part + (size_t)(s * G + h) * (hd + 2) + 2 + d) * f[s * G + h];
        a.out[(g * G + h) * hd + d] = out;
    }
}

__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(const attn_args a) {
    DYN_SMEM(float, sm);
    pdl_wait();
    pdl_launch_dependents();
    const int G = a.n_heads / a.n_kv, hd = a.hd, g = blockIdx.x, split = blockIdx.y, S = a.n_splits;
    const int kv_dim = a.n_kv * hd, tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    const int pos = a.step[1], n_pos = pos + 1;
    const int chunk = max(ATTN_MIN_CHUNK, (n_pos + S - 1) / S), n_active = (n_pos + chunk - 1) / chunk;
    const int start = split * chunk, end = min(start + chunk, n_pos);
    const size_t tiles = 2 * (size_t)ATTN_TILE * (hd + 1), merge = 2 * (size_t)S * G;
    float *qs = sm, *ks = qs + G * hd, *vs = ks + hd, *kt = vs + hd, *vt = kt + ATTN_TILE * (hd + 1);
    float *sc = kt + (tiles > merge ? tiles : merge), *run_m = sc + G * ATTN_TILE, *run_l = run_m + G,
          *rescale = run_l + G;
    double *scratch = (double *)(((uintptr_t)(rescale + G) + 7) & ~(uintptr_t)7); /* 32 doubles */
    int *flag = (int *)(scratch + 33);
    const float *k_cache = a.k_cache + g * hd, *v_cache = a.v_cache + g * hd;
    if (start < end) {
        prepare_qkv(a, g, pos, qs, ks, vs, scratch);
        if (pos >= start && pos < end)
            for (int d = tid; d < hd; d += nt) {
                a.k_cache[(int64_t)pos * kv_dim + g * hd + d] = ks[d];
                a.v_cache[(int64_t)pos * kv_dim + g * hd + d] = vs[d];
            }
        if (tid < G) run_m[tid] = -INFINITY, run_l[tid] = 0.0f;
        float acc[ATTN_MAX_OUT];
#pragma unroll
        for (int j = 0; j < ATTN_MAX_OUT; j++) acc[j] = 0.0f;
        const float scale = 1.0f / sqrtf((float)hd);
        for (int p0 = start; p0 < end; p0 += ATTN_TILE) {
            const int n = min(ATTN_TILE, end - p0);
            load_tile(a, k_cache, v_cache, p0, n, pos, ks, vs, kt, vt);
            __syncthreads();
            /* scores: a thread per (head, position), the dot from shared memory */
#pragma unroll
            for (int j = 0; j < ATTN_MAX_PAIRS; j++) {
                const int t = tid + j * nt, h = t / ATTN_TILE, p = t - h * ATTN_TILE;
                if (h < G) {
                    float dot = 0.0f;
                    if (p < n) {
                        const float *q = qs + h * hd, *k = kt + p * (hd + 1);
                        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains, not one of hd */
                        for (int d = 0; d < hd; d += 4)
#pragma unroll
                            for (int i = 0; i < 4; i++) part[i] += q[d + i] * k[d + i];
                        dot = (part[0] + part[1]) + (part[2] + part[3]);
                    }
                    sc[t] = p < n ? dot * scale : -INFINITY;
                }
            }
            __syncthreads();
            /* online softmax: a warp per head folds the tile into (m, l) */
            for (int h = warp; h < G; h += nt >> 5) {
                const float s = sc[h * ATTN_TILE + lane]; /* TILE == 32 */
                const float m_old = run_m[h], m_new = fmaxf(m_old, warp_max(s));
                const float e = lane < n ? expf(s - m_new) : 0.0f;
                sc[h * ATTN_TILE + lane] = e;
                const float l = warp_sum(e);
                if (lane == 0) {
                    const float r = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                    rescale[h] = r;
                    run_l[h] = run_l[h] * r + l;
                    run_m[h] = m_new;
                }
            }
            __syncthreads();
            /* outputs: a thread per (head, dim), rescaled, plus this tile's values */
#pragma unroll
            for (int j = 0; j < ATTN_MAX_OUT; j++) {
                const int t = tid + j * nt, h = t / hd, d = t - h * hd;
                if (h < G) {
                    float o = acc[j] * rescale[h];
                    const float *e = sc + h * ATTN_TILE, *v = vt + d;
                    for (int p = 0; p < n; p++) o += e[p] * v[p * (hd + 1)];
                    acc[j] = o;
                }
            }
            __syncthreads(); /* the tiles are reloaded next */
        }
        float *part = a.part + (size_t)(g * S + split) * G * (hd + 2);
#pragma unroll
        for (int j = 0; j < ATTN_MAX_OUT; j++) {
            const int t = tid + j * nt, h = t / hd, d = t - h * hd;
            if (h < G) part[h * (hd + 2) + 2 + d] = acc[j];
        }
        if (tid < G) part[tid * (hd + 2)] = run_m[tid], part[tid * (hd + 2) + 1] = run_l[tid];
    }
    /* the last block of this KV head merges the splits */
    if (!last_block(a.counters + g, gridDim.y, flag)) return;
    merge_splits(a, g, n_active, kt);
}

void cuda_attention(const attn_args *a, size_t smem, cudaStream_t st, bool pdl) {
    LAUNCH_PDL(pdl, attention_kernel, dim3(a->n_kv, a->n_splits), ATTN_THREADS, smem, st, *a);
}

cudaError_t cuda_attention_allow_smem(int bytes) {
    return cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

/* cos | sin of every position's RoPE angles, as cpu_rope computes them. */
void cuda_rope_table(const model_config *c, const float *rope_freqs, int n_ctx, float *out) {
    const int half = c->n_rot / 2;
    for (int i = 0; i < half; i++) {
        double freq = pow((double)c->rope_base, -2.0 * i / c->n_rot);
        if (rope_freqs) freq /= rope_freqs[i];
        for (int pos = 0; pos < n_ctx; pos++) {
            double angle = (double)pos * c->rope_freq_scale * freq;
            out[(int64_t)pos * c->n_rot + i] = (float)cos(angle);
            out[(int64_t)pos * c->n_rot + half + i] = (float)sin(angle);
        }
    }
}
