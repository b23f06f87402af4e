/*
 * attention.cu — one layer's attention for one new token, in one launch:
 * q/k norm, RoPE, appending k and v to the cache, and attention over the
 * cache split across blocks (flash-decoding).
 *
 * Grid: (KV heads, S splits), S fixed per state (at most 32); a block is
 * 16 warps, W = 16 / G for each of the G query heads sharing KV head g
 * (GQA: a key or value row is read from memory once and from L1 by the
 * other warps). A lane holds DPL = hd / 32 consecutive dimensions of its
 * head, so a score is a warp sum. The W warps of a head take turns over
 * the block's positions, a batch each, and fold their running softmax
 * into the first's through shared memory (one block barrier): a block
 * covers W times the positions a round trip that one warp a head would.
 *
 * The position comes from device memory, so ranges are cut on the device:
 * chunk = ceil((pos + 1) / S) in whole rounds of W batches, and blocks
 * past the end return at once; one launch serves every position and lives
 * in the CUDA graph. All S splits are used, since the merge reads up to
 * 32 of them in one round: the fewest batches a warp is the shortest path.
 * A warp walks its range in batches of BATCH positions whose key and value
 * loads are all issued before the first is used: a decode attention costs
 * the latency of dependent loads, not bandwidth. Each batch updates the
 * running (max m, sum l, output) of the online softmax once. The first
 * batch is loaded into registers before the launch's wait (cached
 * positions never depend on the launch before) and the rest of the range
 * pulled into L2; at short contexts a warp has one batch, so no load
 * follows the wait but q, k and v's. The norms' weights and the
 * position's rotation are in registers before the wait too.
 *
 * Every warp prepares its query head and its own copy of the new key and
 * value (normalised, rotated; a few hundred redundant flops instead of a
 * launch). The block whose range holds the current position writes them to
 * the cache; other blocks only read earlier positions, so no cache entry is
 * read while it is written.
 *
 * When one block covers the whole range it writes the output itself.
 * Otherwise each block leaves, per head, its unnormalised output and its m
 * and l (two arrays, so the outputs stay 16-byte aligned);
 * the last active block of the KV head (an atomic ticket) merges them,
 * all 16 warps at once: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
 *
 * The code is kept small on purpose: a kernel's instructions are fetched
 * from memory at every layer (the weights streaming through L2 evict
 * them), and Nsight Compute showed an earlier, unrolled version (190 KB of
 * code) waiting on instruction fetches for most of its 25 us.
 *
 * RoPE angles come from a table made on the host at state creation with
 * the CPU's formula (double pow, cos and sin, then float), so both
 * backends rotate by the same floats. The KV cache is f32 so the GPU's
 * attention sees the CPU's numbers.
 */
#include "cuda/kernels.cuh"

/* Dimensions per lane (hd / 32) -> positions whose loads are in flight
 * together (their keys and values: 2 * 32 registers). */
template <int DPL>
struct attn_shape {
    static constexpr int BATCH = 32 / DPL;
    /* the first batch loaded before the wait; 256-dim heads would spill */
    static constexpr bool PRELOAD = DPL <= 4;
};

#define ATTN_WARPS 16                 /* a block: ATTN_WARPS / G warps for each of its G query heads */
#define ATTN_THREADS (32 * ATTN_WARPS)
#define ATTN_MAX_G ATTN_WARPS         /* query heads per KV head */
#define ATTN_MAX_SPLITS 32            /* blocks per KV head: the m and l of one a lane in the merge */

/* Warps a query head: the positions of a block are dealt out among them. */
__host__ __device__ static inline int attn_warps_per_head(int G) { return ATTN_WARPS / G; }

/* A plain load, or one from L2 (ld.cg) for what other blocks of this
 * launch wrote, which this multiprocessor's L1 may hold from an earlier
 * layer. */
template <bool L2, class T>
__device__ __forceinline__ T load_one(const T *p) {
    if constexpr (L2) return __ldcg(p);
    else return *p;
}

/* This lane's DPL dims at p; `mine` is false for the idle lanes of a head
 * narrower than a warp (hd < 32, one dim a lane): zeros, nothing stored. */
template <int DPL, bool L2 = false>
__device__ __forceinline__ void load_dims(const float *p, float *v, bool mine) {
    if (!mine) {
#pragma unroll
        for (int i = 0; i < DPL; i++) v[i] = 0.0f;
    } else if (DPL == 1) {
        v[0] = load_one<L2>(p);
    } else if (DPL == 2) {
        float2 t = load_one<L2>((const float2 *)p);
        v[0] = t.x, v[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i += 4) {
            float4 t = load_one<L2>((const float4 *)(p + i));
            v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
        }
    }
}

template <int DPL>
__device__ __forceinline__ void store_dims(float *p, const float *v, bool mine) {
    if (!mine) return;
#pragma unroll
    for (int i = 0; i < DPL; i++) p[i] = v[i];
}

/* The RMS scales of q and k (sums of squares ssq over nq values, ssk over
 * nk), the two chains of double division and square root side by side.
 * Not inlined, as the one-scale function it replaced was when four call
 * sites shared it; prepare is now its only caller, and an inlined build
 * has not been measured. */
__device__ __noinline__ float2 head_rms_scales(double ssq, int nq, double ssk, int nk, float eps) {
    return make_float2(rms_scale(ssq, nq, eps), rms_scale(ssk, nk, eps));
}

template <int DPL>
__device__ __forceinline__ double sum_squares(const float *x) {
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < DPL; i++) ss += (double)x[i] * x[i];
    return warp_sum_double(ss);
}

/* What a warp's head needs besides q, k and v, none of it written by the
 * launch before: loaded into registers before the wait. The norms'
 * weights of this lane's dims, and the cosine and sine that rotate each
 * of its dims (NEOX pairs (i, i + n_rot/2), normal pairs (2i, 2i + 1)). */
template <int DPL>
struct head_consts {
    float wq[DPL], wk[DPL], c[DPL], s[DPL];
};

template <int DPL>
__device__ __forceinline__ void load_head_consts(const attn_args &a, int g, int h, int pos, head_consts<DPL> &hc) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, d0 = (threadIdx.x & 31) * DPL, half = a.n_rot / 2;
    const bool mine = d0 < hd;
    if (a.qk_norm == QK_NORM_PER_HEAD) {
        load_dims<DPL>(a.q_norm + d0, hc.wq, mine);
        load_dims<DPL>(a.k_norm + d0, hc.wk, mine);
    } else if (a.qk_norm == QK_NORM_FULL) { /* one weight a dim of all heads, not of one */
        load_dims<DPL>(a.q_norm + (g * G + h) * hd + d0, hc.wq, mine);
        load_dims<DPL>(a.k_norm + g * hd + d0, hc.wk, mine);
    }
    const float *cs = a.rope + (int64_t)pos * a.n_rot; /* cos[half] | sin[half] */
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = d0 + i, pair = a.neox ? (d < half ? d : d - half) : d / 2;
        hc.c[i] = d < a.n_rot ? cs[pair] : 1.0f;
        hc.s[i] = d < a.n_rot ? cs[half + pair] : 0.0f;
    }
}

/* RoPE on this lane's dims of a head: NEOX pairs sit in different lanes (a
 * shuffle), normal pairs in one lane (two neighbouring lanes when a lane
 * has one dim). Dims past n_rot stay as they are. */
template <int DPL>
__device__ __forceinline__ void rope_head(float *x, const head_consts<DPL> &hc, int n_rot, bool neox, int lane) {
    const int half = n_rot / 2, d0 = lane * DPL;
    if (neox) {
        const int other = half / DPL; /* lanes between partners */
        float partner[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++)
            partner[i] = __shfl_sync(FULL_MASK, x[i], d0 < half ? lane + other : lane - other);
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = d0 + i;
            if (d >= n_rot) break;
            const float c = hc.c[i], s = hc.s[i];
            x[i] = d < half ? x[i] * c - partner[i] * s : partner[i] * s + x[i] * c;
        }
    } else if (DPL == 1) {
        const float partner = __shfl_xor_sync(FULL_MASK, x[0], 1);
        if (d0 < n_rot) {
            const float c = hc.c[0], s = hc.s[0];
            x[0] = d0 % 2 == 0 ? x[0] * c - partner * s : partner * s + x[0] * c;
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i += 2) {
            if (d0 + i >= n_rot) break;
            const float c = hc.c[i], s = hc.s[i], x0 = x[i], x1 = x[i + 1];
            x[i] = x0 * c - x1 * s;
            x[i + 1] = x0 * s + x1 * c;
        }
    }
}

/* This warp's query head h and the new key and value of KV head g,
 * normalised and rotated, in registers. */
template <int DPL>
__device__ __forceinline__ void prepare(const attn_args &a, const head_consts<DPL> &hc, int g, int h, float *q,
                                        float *k, float *v) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, lane = threadIdx.x & 31, d0 = lane * DPL;
    const int q_dim = a.n_heads * hd, kv_dim = a.n_kv * hd;
    const bool mine = d0 < hd;
    load_dims<DPL>(a.qkv + (g * G + h) * hd + d0, q, mine);
    load_dims<DPL>(a.qkv + q_dim + g * hd + d0, k, mine);
    load_dims<DPL>(a.qkv + q_dim + kv_dim + g * hd + d0, v, mine);
    if (a.qk_norm != QK_NORM_NONE) {
        const bool full = a.qk_norm == QK_NORM_FULL;
        double ssq, ssk; /* side by side, not in one branch each */
        if (full) {
            ssq = sum_squares_strided(a.qkv, q_dim, lane);
            ssk = sum_squares_strided(a.qkv + q_dim, kv_dim, lane);
        } else {
            ssq = sum_squares<DPL>(q);
            ssk = sum_squares<DPL>(k);
        }
        const float2 scale = head_rms_scales(ssq, full ? q_dim : hd, ssk, full ? kv_dim : hd, a.eps);
#pragma unroll
        for (int i = 0; i < DPL; i++) q[i] = q[i] * scale.x * hc.wq[i], k[i] = k[i] * scale.y * hc.wk[i];
    }
    rope_head<DPL>(q, hc, a.n_rot, a.neox, lane);
    rope_head<DPL>(k, hc, a.n_rot, a.neox, lane);
}

/* The keys and values of B consecutive positions, a lane's dims of each. */
template <int DPL>
struct kv_batch {
    static constexpr int B = attn_shape<DPL>::BATCH;
    float k[B][DPL], v[B][DPL];
};

/* Positions p0, p0 + 1, ... of a batch from the cache, all loads issued
 * together; the new position (not cached yet) and those past the end get
 * zeros (put_new fills the new one in once it is made). */
template <int DPL>
__device__ __forceinline__ void load_cached(const attn_args &a, int g, int pos, int p0, int end, kv_batch<DPL> &b) {
    const int kv_dim = a.n_kv * a.hd, d0 = (threadIdx.x & 31) * DPL;
    const bool mine = d0 < a.hd;
    const float *k_cache = a.k_cache + g * a.hd + d0, *v_cache = a.v_cache + g * a.hd + d0;
#pragma unroll
    for (int j = 0; j < kv_batch<DPL>::B; j++) {
        const int p = p0 + j;
        const bool cached = p < end && p != pos;
        load_dims<DPL>(k_cache + (int64_t)p * kv_dim, b.k[j], mine && cached);
        load_dims<DPL>(v_cache + (int64_t)p * kv_dim, b.v[j], mine && cached);
    }
}

/* The new position's key and value into the batch that holds it (one
 * batch of the launch: a uniform branch for the others). */
template <int DPL>
__device__ __forceinline__ void put_new(kv_batch<DPL> &b, int p0, int pos, const float *k_new, const float *v_new) {
    if (pos < p0 || pos >= p0 + kv_batch<DPL>::B) return;
#pragma unroll
    for (int j = 0; j < kv_batch<DPL>::B; j++)
        if (p0 + j == pos)
#pragma unroll
            for (int i = 0; i < DPL; i++) b.k[j][i] = k_new[i], b.v[j][i] = v_new[i];
}

/* N sums over the warp at once (N a power of two <= 32), scattered: each
 * level of the butterfly halves the values a lane holds (n of them, at
 * lane distance 16 n / N), keeping the half its partner gives away, so
 * lane L ends with the sum of value L >> scatter_shift(N). The additions
 * are warp_sum's, pair for pair, so each sum is the same float; N - 1 + 5
 * - log2 N shuffles instead of 5 N, independent of each other. v is
 * overwritten. */
template <int N, int n = N>
__device__ __forceinline__ float warp_sum_scatter(float *v, int lane) {
    if constexpr (n == 1) {
#pragma unroll
        for (int off = 16 / N; off > 0; off >>= 1) v[0] += __shfl_xor_sync(FULL_MASK, v[0], off);
        return v[0];
    } else {
        constexpr int off = 16 * n / N;
        const bool hi = lane & off;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float keep = hi ? v[i + n / 2] : v[i], give = hi ? v[i] : v[i + n / 2];
            v[i] = keep + __shfl_xor_sync(FULL_MASK, give, off);
        }
        return warp_sum_scatter<N, n / 2>(v, lane);
    }
}

/* log2 of the lanes that share one value of warp_sum_scatter<N>. */
__host__ __device__ constexpr int scatter_shift(int n) {
    int shift = 0;
    for (; n < 32; n *= 2) shift++;
    return shift;
}

/* One batch into the running (m, l, acc) of the online softmax. Its B
 * scores are summed together, lane L holding position p0 + (L >> S)'s, so
 * each lane takes one exponential, not B; the batch's maximum and sum are
 * reduced over the lanes that hold different positions. */
template <int DPL>
__device__ __forceinline__ void attend_batch(const kv_batch<DPL> &b, int p0, int end, const float *q, float scale,
                                             float &m, float &l, float *acc) {
    constexpr int B = kv_batch<DPL>::B, S = scatter_shift(B);
    const int lane = threadIdx.x & 31;
    float dot[B];
#pragma unroll
    for (int j = 0; j < B; j++) {
        dot[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) dot[j] += q[i] * b.k[j][i];
    }
    float sc = warp_sum_scatter<B>(dot, lane) * scale;
    if (p0 + (lane >> S) >= end) sc = -INFINITY;
    float m_batch = sc;
#pragma unroll
    for (int off = 16; off >= (1 << S); off >>= 1) m_batch = fmaxf(m_batch, __shfl_xor_sync(FULL_MASK, m_batch, off));
    const float m_new = fmaxf(m, m_batch);
    const float r = expf(m - m_new); /* m = -inf first: r = 0 */
    const float e = expf(sc - m_new); /* past the end: 0 */
    float e_sum = e;
#pragma unroll
    for (int off = 16; off >= (1 << S); off >>= 1) e_sum += __shfl_xor_sync(FULL_MASK, e_sum, off);
    l = l * r + e_sum;
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] *= r;
#pragma unroll
    for (int j = 0; j < B; j++) {
        const float e_j = __shfl_sync(FULL_MASK, e, j << S);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] += e_j * b.v[j][i];
    }
    m = m_new;
}

/* A warp's batches of [p0, end), every `step` positions, into (m, l,
 * acc); the first batch (`b`) was loaded before the launch's wait. One
 * copy of the batch's code serves every batch (code size, see the top of
 * this file). */
template <int DPL>
__device__ __forceinline__ void attend(const attn_args &a, int g, int pos, int p0, int end, int step, const float *q,
                                       const float *k_new, const float *v_new, kv_batch<DPL> &b, float &m,
                                       float &l, float *acc) {
    const float scale = 1.0f / sqrtf((float)a.hd);
#pragma unroll 1
    while (p0 < end) {
        put_new<DPL>(b, p0, pos, k_new, v_new);
        attend_batch<DPL>(b, p0, end, q, scale, m, l, acc);
        if ((p0 += step) < end) load_cached<DPL>(a, g, pos, p0, end, b);
    }
}

/* Folds the (m, l, acc) of warps 1..W-1 of each head into warp 0's, through
 * shared memory: (W - 1) * G slots of hd floats (16-byte aligned), then
 * their (m, l). Warp 0 of a head always has positions, so its m is finite
 * and an idle warp's (m = -inf) weighs exp(-inf) = 0. */
template <int DPL>
__device__ __forceinline__ void fold_warps(float *slots, int W, int G, int h, int w, int hd, float &m, float &l,
                                           float *acc) {
    const int lane = threadIdx.x & 31, d0 = lane * DPL;
    const bool mine = d0 < hd;
    float2 *ml = (float2 *)(slots + (W - 1) * G * hd);
    if (w > 0) {
        const int slot = (w - 1) * G + h;
        store_dims<DPL>(slots + slot * hd + d0, acc, mine);
        if (lane == 0) ml[slot] = make_float2(m, l);
    }
    __syncthreads();
    if (w > 0) return;
#pragma unroll 1
    for (int j = 1; j < W; j++) {
        const int slot = (j - 1) * G + h;
        float o[DPL];
        load_dims<DPL>(slots + slot * hd + d0, o, mine);
        const float2 other = ml[slot];
        const float M = fmaxf(m, other.x), r = expf(m - M), r_other = expf(other.x - M);
        l = l * r + other.y * r_other;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] = acc[i] * r + o[i] * r_other;
        m = M;
    }
}

/* The last block of KV head g merges its n active splits (n <= 32): warp
 * (h, w) takes head h's splits w, w + W, ..., MB a round, every lane holding
 * the m and l of split `lane`; the W sums meet in shared memory and warp 0
 * of the head writes the output. */
template <int DPL>
__device__ __forceinline__ void merge_splits(const attn_args &a, float *slots, int W, int g, int h, int w, int n) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, lane = threadIdx.x & 31, d0 = lane * DPL;
    const bool mine = d0 < hd;
    const int first = g * a.n_splits * G + h, stride = G * hd; /* (g, split 0, h); floats between splits */
    constexpr int MB = 48 / DPL < 12 ? 48 / DPL : 12; /* 16 spills at DPL 4 */
    const float *part = a.part_out + (size_t)first * hd + d0 + w * stride;
    const float2 ml = lane < n ? __ldcg((const float2 *)a.part_ml + first + lane * G) : make_float2(-INFINITY, 0.0f);
    float out[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) out[i] = 0.0f;
    float f = 0.0f, inv_l = 0.0f;
#pragma unroll 1
    for (int s0 = w; s0 < n; s0 += W * MB, part += W * MB * stride) {
        float o[MB][DPL];
#pragma unroll
        for (int j = 0; j < MB; j++) load_dims<DPL, true>(part + j * W * stride, o[j], mine && s0 + j * W < n);
        if (s0 == w) { /* the softmax's total over the splits, while the first round's loads are in flight */
            const float M = warp_max(ml.x);
            f = lane < n ? expf(ml.x - M) : 0.0f;
            inv_l = 1.0f / warp_sum(ml.y * f);
        }
#pragma unroll
        for (int j = 0; j < MB; j++) {
            const int s = s0 + j * W; /* uniform over the warp */
            const float f_s = __shfl_sync(FULL_MASK, f, s & 31); /* outside the condition: no branch around it */
            const float wt = s < n ? f_s * inv_l : 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) out[i] += wt * o[j][i];
        }
    }
    if (W > 1) { /* warps 1..W-1 hand their sums to warp 0 */
        if (w > 0) store_dims<DPL>(slots + ((w - 1) * G + h) * hd + d0, out, mine);
        __syncthreads();
        if (w > 0) return;
#pragma unroll 1
        for (int j = 1; j < W; j++) {
            float o[DPL];
            load_dims<DPL>(slots + ((j - 1) * G + h) * hd + d0, o, mine);
#pragma unroll
            for (int i = 0; i < DPL; i++) out[i] += o[i];
        }
    }
    store_dims<DPL>(a.out + (g * G + h) * hd + d0, out, mine);
}

template <int DPL>
__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(const attn_args a) {
    DYN_SMEM(float, slots);
    __shared__ int flag;
    constexpr int B = attn_shape<DPL>::BATCH;
    const int G = a.n_heads / a.n_kv, W = attn_warps_per_head(G), hd = a.hd, g = blockIdx.x, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, h = warp % G, w = warp / G, lane = threadIdx.x & 31, d0 = lane * DPL;
    const int kv_dim = a.n_kv * hd, step = W * B;
    const bool mine = d0 < hd;
    trace_mark(a.trace, TRACE_ENTRY);
    /* The position and the cached keys and values were written by earlier
     * steps, complete before the launch before this one passed its own
     * wait: the range's rows are pulled into L2 while that launch runs. */
    const int pos = __ldcg(a.step + 1), n_pos = pos + 1;
    /* Every split in use, each a whole number of block batches (W warps a
     * head, B positions a warp): the merge reads at most 32 splits in one
     * round, so the fewest batches a warp is the best cut. */
    const int chunk = ((n_pos + a.n_splits - 1) / a.n_splits + step - 1) / step * step;
    const int n_active = (n_pos + chunk - 1) / chunk;
    const int start = split * chunk, end = min(start + chunk, n_pos);
    /* Each warp's first batch in registers, the rest of the range into L2. */
    constexpr bool preload = attn_shape<DPL>::PRELOAD;
    kv_batch<DPL> first;
    if constexpr (preload) load_cached<DPL>(a, g, pos, start + w * B, end, first);
    const int lines = (hd * (int)sizeof(float) + 127) / 128, from = preload ? start + step : start;
    for (int t = threadIdx.x; t < 2 * (end - from) * lines; t += blockDim.x) {
        const int p = from + t / (2 * lines), c = t % (2 * lines);
        const float *cache = c < lines ? a.k_cache : a.v_cache;
        prefetch_l2((const uint8_t *)(cache + (int64_t)p * kv_dim + g * hd) + 128 * (c % lines));
    }
    head_consts<DPL> hc; /* the norms' weights and the rotation */
    if (start < end) load_head_consts<DPL>(a, g, h, pos, hc);
    pdl_wait(); /* q, k, v of this position */
    pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    if (start >= end) return; /* past the position: not counted by the merge */

    float q[DPL], k[DPL], v[DPL];
    prepare<DPL>(a, hc, g, h, q, k, v);
    trace_mark(a.trace, TRACE_STAGED);
    if constexpr (!preload) load_cached<DPL>(a, g, pos, start + w * B, end, first);
    if (warp == 0 && pos >= start && pos < end) {
        store_dims<DPL>(a.k_cache + (int64_t)pos * kv_dim + g * hd + d0, k, mine);
        store_dims<DPL>(a.v_cache + (int64_t)pos * kv_dim + g * hd + d0, v, mine);
    }
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    attend<DPL>(a, g, pos, start + w * B, end, step, q, k, v, first, m, l, acc);
    if (W > 1) fold_warps<DPL>(slots, W, G, h, w, hd, m, l, acc);
    trace_mark(a.trace, TRACE_WORKED);

    if (w == 0) {
        if (n_active == 1) { /* the whole range was this block's */
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] /= l;
            store_dims<DPL>(a.out + (g * G + h) * hd + d0, acc, mine);
        } else {
            const int slot = (g * a.n_splits + split) * G + h;
            store_dims<DPL>(a.part_out + (size_t)slot * hd + d0, acc, mine);
            if (lane == 0) ((float2 *)a.part_ml)[slot] = make_float2(m, l);
        }
    }
    if (n_active == 1 || !last_block(a.counters + g, n_active, &flag)) return;
    merge_splits<DPL>(a, slots, W, g, h, w, n_active);
    trace_mark(a.trace, TRACE_EXIT);
}

/* A lane holds hd / 32 dims (one, or none, below 32), rotary pairs must not straddle lanes unevenly,
 * a block is at most ATTN_MAX_G warps, and the merge reads at most ATTN_MAX_SPLITS splits. */
bool cuda_attention_supported(int G, int hd, int n_rot, int n_splits) {
    const int dims_per_lane = hd > 32 ? hd / 32 : 1;
    return ((hd <= 32 && hd % 2 == 0) || hd == 64 || hd == 128 || hd == 256) && n_rot % 2 == 0 &&
           (n_rot / 2) % dims_per_lane == 0 && G >= 1 &&
           G <= ATTN_MAX_G && n_splits >= 1 && n_splits <= ATTN_MAX_SPLITS;
}

/* The kernel for heads of hd dims (hd / 32 a lane). */
typedef void (*attention_fn)(const attn_args);
static attention_fn attention_kernel_for(int hd) {
    return hd <= 32 ? attention_kernel<1> : hd == 64 ? attention_kernel<2> : hd == 128 ? attention_kernel<4>
                                                                                      : attention_kernel<8>;
}

/* The threads and the shared memory (fold_warps' slots) of a block. */
static int attn_threads(int G) { return 32 * G * attn_warps_per_head(G); }
static size_t attn_smem(int G, int hd) { return (size_t)(attn_warps_per_head(G) - 1) * G * (hd + 2) * sizeof(float); }

/* Blocks per KV head: as many as fit on the GPU at once (a long context
 * is then read by every multiprocessor, so more of its loads are in
 * flight), at most the merge's ATTN_MAX_SPLITS. */
int cuda_attention_splits(int n_sm, int n_heads, int n_kv, int hd) {
    const int G = n_heads / n_kv;
    int per_sm = 1;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel_for(hd), attn_threads(G),
                                                                  attn_smem(G, hd));
    if (e != cudaSuccess || per_sm < 1) per_sm = 1;
    int splits = per_sm * n_sm / n_kv;
    return splits < 1 ? 1 : splits > ATTN_MAX_SPLITS ? ATTN_MAX_SPLITS : splits;
}

void cuda_attention(const attn_args *a, cudaStream_t st, bool pdl) {
    const int G = a->n_heads / a->n_kv;
    LAUNCH_PDL(pdl, attention_kernel_for(a->hd), dim3(a->n_kv, a->n_splits), attn_threads(G), attn_smem(G, a->hd), st,
               *a);
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
