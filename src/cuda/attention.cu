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
 * The cost of a decode attention is the latency of dependent loads, not
 * bandwidth, so a block issues everything it needs first (its q, k, v, the
 * norm weights, the position's RoPE row and its first tile of cached keys
 * and values) and only then waits. It works through its range in tiles of
 * ATTN_TILE positions: the tile's keys and values in shared memory (each
 * thread's loads issued before its stores), the G x TILE scores
 * from there (rows padded by one float: no bank conflicts), and folds the
 * tile into running (max, sum, output) statistics: the online softmax.
 * Each block prepares its own copy of the G query heads and of the new key
 * and value (normalised, rotated) from the q|k|v projection: a few hundred
 * redundant flops in exchange for no extra launch. The block whose range
 * holds the current position writes the new key and value to the cache and
 * uses them from shared memory; other blocks only read earlier positions,
 * so nobody reads a cache entry while it is written.
 *
 * When one block covers the whole range (up to ATTN_MIN_CHUNK positions)
 * it writes the output itself. Otherwise each block leaves, per query
 * head, its max m, sum l and unnormalised output o; the last of the active
 * blocks of a KV head (an atomic ticket) merges the splits:
 * out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), reading every
 * (m, l) in one pass and every o_s in another.
 *
 * The code is kept small (loops are not unrolled, the accumulators live in
 * shared memory): a kernel's instructions are fetched from memory at every
 * layer, since the weights streaming through L2 evict them, and Nsight
 * Compute showed the first version (190 KB of code) waiting on instruction
 * fetches for most of its 25 us.
 *
 * RoPE angles come from a table made on the host at state creation with
 * the CPU's formula (double pow, cos and sin, then float), so both
 * backends rotate by the same floats. The KV cache is f32 so the GPU's
 * attention sees the CPU's numbers.
 */
#include "cuda/kernels.cuh"

#define ATTN_THREADS 256
#define ATTN_TILE 32
#define ATTN_MIN_CHUNK 32

/* Shared memory, in floats: q (G*hd), new k and v (hd each), the K and V
 * tiles (TILE rows of hd + 1; the merge reuses them for 2 S G floats),
 * scores (G*TILE), per-head running max, sum and rescale (3G), the norm
 * weights and RoPE row (2 hd + n_rot), the outputs (G*hd), then 32
 * doubles of scratch and the ticket flag. */
__host__ __device__ inline size_t attn_tiles_floats(int G, int hd, int n_splits) {
    size_t tiles = 2 * (size_t)ATTN_TILE * (hd + 1), merge = 2 * (size_t)n_splits * G;
    return tiles > merge ? tiles : merge;
}

__device__ __forceinline__ float *attn_scores(float *sm, int G, int hd, int n_splits) {
    return sm + G * hd + 2 * hd + attn_tiles_floats(G, hd, n_splits);
}

size_t cuda_attention_smem(int G, int hd, int n_rot, int n_splits) {
    size_t floats = (size_t)G * hd + 2 * (size_t)hd + attn_tiles_floats(G, hd, n_splits) + (size_t)G * ATTN_TILE +
                    3 * (size_t)G + 2 * (size_t)hd + (size_t)n_rot + (size_t)G * hd;
    return sizeof(float) * floats + 8 + 32 * sizeof(double) + 16;
}

bool cuda_attention_supported(int G, int hd, int n_splits) {
    return hd % 32 == 0 && ATTN_THREADS % (hd / 4) == 0 && n_splits >= 1;
}

__device__ __forceinline__ void rms_in_place(float *p, int n, const float *w, float eps, int lane) {
    double ss = 0.0; /* in double, as cpu_rmsnorm: the same scale, bit for bit */
    #pragma unroll 1
    for (int d = lane; d < n; d += 32) ss += (double)p[d] * p[d];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, off);
    const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    __syncwarp();
    #pragma unroll 1
    for (int d = lane; d < n; d += 32) p[d] = p[d] * scale * w[d];
    __syncwarp();
}

/* The G query heads and the new key and value of KV head g, normalised
 * and rotated, into shared memory (`w`: hd + hd + n_rot floats of scratch
 * for the per-head norm weights and the RoPE row). The caller has issued
 * its tile loads already; these loads overlap them. Ends with a barrier. */
__device__ void prepare_qkv(const attn_args &a, int g, int pos, float *qs, float *ks, float *vs, float *w,
                            double *scratch) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, half = a.n_rot / 2;
    const int kv_dim = a.n_kv * hd, q_dim = a.n_heads * hd;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const float *q_in = a.qkv + g * G * hd, *k_in = a.qkv + q_dim + g * hd, *v_in = a.qkv + q_dim + kv_dim + g * hd;
    const bool per_head = a.qk_norm == QK_NORM_PER_HEAD;
    float *qn = w, *kn = w + hd, *cs = w + 2 * hd; /* cos[half] | sin[half] */
    const float *rope = a.rope + (int64_t)pos * a.n_rot;
    const int n_in = G * hd + 2 * hd + (per_head ? 2 * hd : 0) + a.n_rot;
    #pragma unroll 1
    for (int i = tid; i < n_in; i += nt) {
        int j = i;
        if (j < G * hd) qs[j] = q_in[j];
        else if ((j -= G * hd) < hd) ks[j] = k_in[j];
        else if ((j -= hd) < hd) vs[j] = v_in[j];
        else if ((j -= hd) < a.n_rot) cs[j] = rope[j];
        else if ((j -= a.n_rot) < hd) qn[j] = a.q_norm[j];
        else kn[j - hd] = a.k_norm[j - hd];
    }
    __syncthreads();
    /* q/k norm: per head (Qwen3) or over the whole projections (OLMoE) */
    if (per_head) {
        #pragma unroll 1
        for (int v = warp; v <= G; v += nw) rms_in_place(v < G ? qs + v * hd : ks, hd, v < G ? qn : kn, a.eps, lane);
    } else if (a.qk_norm == QK_NORM_FULL) {
        double sq = 0.0, sk = 0.0;
        #pragma unroll 1
        for (int i = tid; i < q_dim; i += nt) sq += (double)a.qkv[i] * a.qkv[i];
        #pragma unroll 1
        for (int i = tid; i < kv_dim; i += nt) sk += (double)a.qkv[q_dim + i] * a.qkv[q_dim + i];
        sq = block_sum_double(sq, scratch);
        sk = block_sum_double(sk, scratch);
        const float scale_q = (float)(1.0 / sqrt(sq / (double)q_dim + (double)a.eps));
        const float scale_k = (float)(1.0 / sqrt(sk / (double)kv_dim + (double)a.eps));
        #pragma unroll 1
        for (int i = tid; i < G * hd; i += nt) qs[i] = qs[i] * scale_q * a.q_norm[g * G * hd + i];
        #pragma unroll 1
        for (int i = tid; i < hd; i += nt) ks[i] = ks[i] * scale_k * a.k_norm[g * hd + i];
    }
    __syncthreads();
    /* RoPE on the first n_rot dimensions of each head */
    #pragma unroll 1
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

/* Tile loads: the K and V rows [p0, p0 + n) of this KV head (2n rows of
 * hd / 4 float4s, keys then values). A thread takes column tid % (hd / 4)
 * of every (ATTN_THREADS / (hd / 4))-th row, TILE_LOADS rows a round.
 * Row `pos` (the new token) is skipped here and copied from shared memory
 * later. */
#define TILE_LOADS 8
struct tile_round {
    float4 r[TILE_LOADS];
};

__device__ __forceinline__ int tile_rounds(int n, int hd) {
    const int rows_per_load = ATTN_THREADS / (hd / 4);
    return (2 * n + rows_per_load * TILE_LOADS - 1) / (rows_per_load * TILE_LOADS);
}

__device__ __forceinline__ void tile_issue(const float *k_cache, const float *v_cache, int kv_dim, int hd, int p0,
                                           int n, int pos, int round, tile_round &t) {
    const int q4 = hd / 4, step = ATTN_THREADS / q4, c = threadIdx.x % q4;
    const int first_row = threadIdx.x / q4 + round * TILE_LOADS * step;
#pragma unroll
    for (int j = 0; j < TILE_LOADS; j++) {
        const int row = first_row + j * step, value = row >= n, p = p0 + row - value * n;
        if (row < 2 * n && p != pos)
            t.r[j] = *(const float4 *)((value ? v_cache : k_cache) + (int64_t)p * kv_dim + 4 * c);
    }
}

/* Into the padded tiles (rows of hd + 1 floats: no bank conflicts). */
__device__ __forceinline__ void tile_store(int hd, int p0, int n, int pos, int round, const tile_round &t,
                                           float *kt, float *vt) {
    const int q4 = hd / 4, step = ATTN_THREADS / q4, c = threadIdx.x % q4;
    const int first_row = threadIdx.x / q4 + round * TILE_LOADS * step;
#pragma unroll
    for (int j = 0; j < TILE_LOADS; j++) {
        const int row = first_row + j * step, value = row >= n, r = row - value * n;
        if (row < 2 * n && p0 + r != pos) {
            float *dst = (value ? vt : kt) + r * (hd + 1) + 4 * c;
            dst[0] = t.r[j].x, dst[1] = t.r[j].y, dst[2] = t.r[j].z, dst[3] = t.r[j].w;
        }
    }
}

/* The tile of rows [p0, p0 + n) into shared memory; t holds its first
 * round already when preloaded (the caller issued it), and is reused. */
__device__ __forceinline__ void load_tile(const float *k_cache, const float *v_cache, int kv_dim, int hd, int p0, int n,
                                          int pos, tile_round &t, bool preloaded, const float *ks, const float *vs,
                                          float *kt, float *vt) {
    const int rounds = tile_rounds(n, hd);
#pragma unroll 1
    for (int r = 0; r < rounds; r++) {
        if (r > 0 || !preloaded) tile_issue(k_cache, v_cache, kv_dim, hd, p0, n, pos, r, t);
        tile_store(hd, p0, n, pos, r, t, kt, vt);
    }
    if (pos >= p0 && pos < p0 + n)
#pragma unroll 1
        for (int d = threadIdx.x; d < hd; d += blockDim.x)
            kt[(pos - p0) * (hd + 1) + d] = ks[d], vt[(pos - p0) * (hd + 1) + d] = vs[d];
}

/* The last block of a KV head combines the splits' (m, l, o). */
__device__ void merge_splits(const attn_args &a, int g, int n_active, float *ml) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, S = a.n_splits;
    const float *part = a.part + (size_t)g * S * G * (hd + 2);
    /* ml[2 (s G + h)] = m, then l; afterwards ml[2 (s G + h)] = e^(m_s - M) / L */
    #pragma unroll 1
    for (int t = threadIdx.x; t < 2 * n_active * G; t += blockDim.x)
        ml[t] = __ldcg(part + (size_t)(t >> 1) * (hd + 2) + (t & 1));
    __syncthreads();
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float M = -INFINITY, L = 0.0f;
        #pragma unroll 1
        for (int s = 0; s < n_active; s++) M = fmaxf(M, ml[2 * (s * G + h)]);
        #pragma unroll 1
        for (int s = 0; s < n_active; s++) {
            float *f = ml + 2 * (s * G + h);
            f[0] = expf(f[0] - M);
            L += f[1] * f[0];
        }
        #pragma unroll 1
        for (int s = 0; s < n_active; s++) ml[2 * (s * G + h)] /= L;
    }
    __syncthreads();
    #pragma unroll 1
    for (int t = threadIdx.x; t < G * hd; t += blockDim.x) {
        const int h = t / hd, d = t - h * hd;
        float out = 0.0f;
        int s = 0;
        #pragma unroll 1
        for (; s + 8 <= n_active; s += 8) {
            float o[8];
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = __ldcg(part + (size_t)((s + j) * G + h) * (hd + 2) + 2 + d);
#pragma unroll
            for (int j = 0; j < 8; j++) out += o[j] * ml[2 * ((s + j) * G + h)];
        }
        #pragma unroll 1
        for (; s < n_active; s++) out += __ldcg(part + (size_t)(s * G + h) * (hd + 2) + 2 + d) * ml[2 * (s * G + h)];
        a.out[(g * G + h) * hd + d] = out;
    }
}

/* This block's range [start, end) for the G heads of KV head g: running
 * (max, sum) per head and unnormalised outputs acc (G * hd, shared
 * memory; each thread owns the entries t = tid + k * nt) over its tiles. */
__device__ __forceinline__ void attend_range(const attn_args &a, int g, int pos, int start, int end,
                                             tile_round &first, float *sm, float *acc) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, kv_dim = a.n_kv * hd;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
    float *qs = sm, *ks = qs + G * hd, *vs = ks + hd, *kt = vs + hd, *vt = kt + ATTN_TILE * (hd + 1);
    float *sc = attn_scores(sm, G, hd, a.n_splits), *run_m = sc + G * ATTN_TILE, *run_l = run_m + G,
          *rescale = run_l + G;
    const float *k_cache = a.k_cache + g * hd, *v_cache = a.v_cache + g * hd;
    if (tid < G) run_m[tid] = -INFINITY, run_l[tid] = 0.0f;
    #pragma unroll 1
    for (int t = tid; t < G * hd; t += nt) acc[t] = 0.0f;
    const float scale = 1.0f / sqrtf((float)hd);
    #pragma unroll 1
    for (int p0 = start; p0 < end; p0 += ATTN_TILE) {
        const int n = min(ATTN_TILE, end - p0);
        load_tile(k_cache, v_cache, kv_dim, hd, p0, n, pos, first, p0 == start, ks, vs, kt, vt);
        __syncthreads();
        /* scores: a thread per (head, position), the dot from shared memory */
        #pragma unroll 1
        for (int t = tid; t < G * ATTN_TILE; t += nt) {
            const int h = t / ATTN_TILE, p = t - h * ATTN_TILE;
            float dot = 0.0f;
            if (p < n) {
                const float *q = qs + h * hd, *k = kt + p * (hd + 1);
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains, not one of hd */
#pragma unroll 1
                for (int d = 0; d < hd; d += 4)
#pragma unroll
                    for (int i = 0; i < 4; i++) part[i] += q[d + i] * k[d + i];
                dot = (part[0] + part[1]) + (part[2] + part[3]);
            }
            sc[t] = p < n ? dot * scale : -INFINITY;
        }
        __syncthreads();
        /* online softmax: a warp per head folds the tile into (m, l) */
        #pragma unroll 1
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
        #pragma unroll 1
        for (int t = tid; t < G * hd; t += nt) {
            const int h = t / hd, d = t - h * hd;
            const float *e = sc + h * ATTN_TILE, *v = vt + d;
            float o = acc[t] * rescale[h];
#pragma unroll 1
            for (int p = 0; p < n; p++) o += e[p] * v[p * (hd + 1)];
            acc[t] = o;
        }
        __syncthreads(); /* the tiles are reloaded next */
    }
}

__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(const attn_args a) {
    DYN_SMEM(float, sm);
    const int G = a.n_heads / a.n_kv, hd = a.hd, g = blockIdx.x, split = blockIdx.y, S = a.n_splits;
    const int kv_dim = a.n_kv * hd, tid = threadIdx.x, nt = blockDim.x;
    pdl_wait();
    pdl_launch_dependents();
    const int pos = a.step[1], n_pos = pos + 1;
    const int chunk = max(ATTN_MIN_CHUNK, (n_pos + S - 1) / S), n_active = (n_pos + chunk - 1) / chunk;
    const int start = split * chunk, end = min(start + chunk, n_pos);
    if (start >= end) return; /* past the position: not counted by the merge */
    float *qs = sm, *ks = qs + G * hd, *vs = ks + hd, *kt = vs + hd;
    float *sc = attn_scores(sm, G, hd, S), *stats = sc + G * ATTN_TILE; /* run_m, run_l, rescale: 3G */
    float *prep = stats + 3 * G;                                              /* 2 hd + n_rot */
    double *scratch = (double *)(((uintptr_t)(prep + 2 * hd + a.n_rot + G * hd) + 7) & ~(uintptr_t)7); /* 32 */
    int *flag = (int *)(scratch + 32);
    const float *k_cache = a.k_cache + g * hd, *v_cache = a.v_cache + g * hd;

    tile_round first; /* issued before the q|k|v preparation waits on its own loads */
    tile_issue(k_cache, v_cache, kv_dim, hd, start, min(ATTN_TILE, end - start), pos, 0, first);
    prepare_qkv(a, g, pos, qs, ks, vs, prep, scratch);
    if (pos >= start && pos < end)
        #pragma unroll 1
        for (int d = tid; d < hd; d += nt) {
            a.k_cache[(int64_t)pos * kv_dim + g * hd + d] = ks[d];
            a.v_cache[(int64_t)pos * kv_dim + g * hd + d] = vs[d];
        }
    float *acc = prep + 2 * hd + a.n_rot; /* G * hd outputs, after the norm weights and RoPE row */
    attend_range(a, g, pos, start, end, first, sm, acc);
    const float *run_m = stats, *run_l = stats + G;
    if (n_active == 1) { /* the whole range was this block's */
        #pragma unroll 1
        for (int t = tid; t < G * hd; t += nt) a.out[g * G * hd + t] = acc[t] / run_l[t / hd];
        return;
    }
    float *part = a.part + (size_t)(g * S + split) * G * (hd + 2);
    #pragma unroll 1
    for (int t = tid; t < G * hd; t += nt) part[(t / hd) * (hd + 2) + 2 + t % hd] = acc[t];
    if (tid < G) part[tid * (hd + 2)] = run_m[tid], part[tid * (hd + 2) + 1] = run_l[tid];
    /* the last active block of this KV head merges the splits */
    if (!last_block(a.counters + g, n_active, flag)) return;
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
