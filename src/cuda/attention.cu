/*
 * attention.cu — one layer's attention for one new token, in one launch:
 * q/k norm, RoPE, appending k and v to the cache, and attention over the
 * cache split across blocks (flash-decoding).
 *
 * Grid: (KV heads, S splits), S fixed per state (at most 32); a block is
 * up to 16 warps. A lane holds DPL = hd / 32 consecutive dimensions, so a
 * score is a warp sum. The position comes from device memory, so ranges
 * are cut on the device and blocks past the end return at once; one
 * launch serves every position and lives in the CUDA graph. A warp walks
 * its range in batches of B positions whose key and value loads are all
 * issued before the first is used: a decode attention costs the latency
 * of dependent loads, not bandwidth. Each batch updates the running (max
 * m, sum l, output) of the online softmax once; its scores are summed
 * together, scattered (warp_sum_scatter), each lane ending with one. The
 * first batch is loaded into registers before the launch's wait (cached
 * positions never depend on the launch before) and the rest of the range
 * pulled into L2; the norms' weights and the position's rotation are in
 * registers before the wait too.
 *
 * Three ways to share the work among blocks and warps (attn_way), picked
 * by the position (the host captures the decode step once with each and
 * replays the one for the position, cuda_forward.cu):
 *  - head blocks (the shortest contexts): a block a query head, its 16
 *    warps taking turns over the block's positions, so that a block covers
 *    16 batches a round: up to 128 positions (Qwen3) one block takes them
 *    all, one batch a warp loaded before the wait, and there is no merge,
 *    where the per-head way merges up to 32 splits of 8 heads (a third of
 *    its launch, decode-plan facts 76 and 78). The G blocks of a KV head
 *    read its rows from L2, 8 times the per-head way's L2 traffic: past one
 *    round the per-head way is faster again (fact 80).
 *  - per head: a block a KV head, W = 16 / G warps for each of its G query
 *    heads; a key or value row is read from memory once and from L1 by the
 *    other heads' warps. The same code as head blocks, with G heads a
 *    block: every warp prepares its head and its own copy of the new key
 *    and value (a few hundred redundant flops instead of a barrier).
 *  - grouped (cuda_attention_grouped_from, G a power of two above 1): a
 *    warp scores HP heads at once against each key it loads (up to 8, at
 *    most 32 / DPL so that their outputs fit in 32 registers), and the
 *    positions are dealt out among the 16 / (G / HP) warps of a head group:
 *    a block covers HP times the positions a round. A batch's code is HP
 *    times longer, and a kernel's code is fetched from memory at every
 *    layer (the weights streaming through L2 evict it), so this pays only
 *    at depth, where a warp's chain of batches is what counts
 *    (decode-plan facts 64 and 67).
 * The code is kept small on purpose: Nsight Compute showed an earlier,
 * unrolled version (190 KB of code) waiting on instruction fetches for most
 * of its 25 us.
 *
 * The block whose range holds the current position (the one of the KV
 * head's first query head, with head blocks) writes the new key and value
 * to the cache; other blocks only read earlier positions, so no cache entry
 * is read while it is written. A block's warps fold their (m, l, output)
 * through shared memory. When one block covers the whole range it writes
 * the output itself. Otherwise each block leaves, per head, its
 * unnormalised output and its m and l (two arrays, so the outputs stay
 * 16-byte aligned); the last active block of the same heads (an atomic
 * ticket) merges them: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
 *
 * RoPE angles come from a table made on the host at state creation with
 * the CPU's formula (double pow, cos and sin, then float), so both
 * backends rotate by the same floats. The KV cache is f32 or f16
 * (attn_args.kv_f16, a session's --cache-type f16): half the bytes a
 * position, which at depth are most of what a step reads besides the
 * weights. An f16 cache's new key and value are rounded before they are
 * used, so that a step attends to what the later steps read back, as the
 * CPU's f16 cache does (cpu/cpu.h): the GPU sees the CPU's numbers either
 * way. The kernels are instances per cache element
 * (float, or uint16_t holding f16 bits), not one with a run-time switch:
 * their registers are at the limit (see head blocks below). An f16 batch
 * holds the cache's bits, two dims a register, widened where they are
 * used (kv_row): in the per-head way it takes twice the positions of an
 * f32 batch in the same registers, so a warp's chain of batches is half
 * as long (attn_shape).
 */
#include "cuda/kernels.cuh"

#include <climits>

#define ATTN_WARPS 16                 /* a block, at most */
#define ATTN_THREADS (32 * ATTN_WARPS)
#define ATTN_MAX_G ATTN_WARPS         /* query heads per KV head */
#define ATTN_MAX_SPLITS 32            /* blocks per KV head: the m and l of one a lane in the merge */

/* Per head: warps a query head, among which the positions of a block are
 * dealt out. */
__host__ __device__ static inline int attn_warps_per_head(int G) { return ATTN_WARPS / G; }

/* Grouped: query heads a warp scores together, at most 8 (the scattered
 * sum of a batch takes 32 scores) and 32 / DPL (its outputs in 32
 * registers); and the warps of a head group. */
__host__ __device__ constexpr int attn_heads_per_warp(int dpl, int G) {
    return (G < 8 ? G : 8) * dpl <= 32 ? (G < 8 ? G : 8) : 32 / dpl;
}
__host__ __device__ static inline int attn_warps_per_group(int G, int hp) { return ATTN_WARPS / (G / hp); }

/* Registers a lane's DPL dims of one cached row take in a batch: one a
 * dim in f32, one a pair of dims in f16 (kv_row). */
__host__ __device__ constexpr int kv_row_regs(int dpl, bool f16) { return f16 ? (dpl + 1) / 2 : dpl; }

/* Positions a batch of one head a warp holds (attn_shape's, for the
 * host): their keys and values in 2 x 32 registers, so a wide batch of an
 * f16 cache holds twice the positions of an f32 one. */
__host__ __device__ constexpr int attn_per_head_batch(int dpl, bool wide_f16) {
    return 32 / kv_row_regs(dpl, wide_f16);
}

/* Cache element, dimensions per lane and heads per warp -> positions
 * whose loads are in flight together: their keys and values in 2 x 32
 * registers, 2 x 16 where a warp has several heads (their outputs and
 * scores need the rest; more spilled). WIDE (the per-head way): an f16
 * cache's batch takes as many positions as its registers hold, twice an
 * f32 batch's, so a warp's chain of batches is half as long. Head blocks
 * keep f32's batch: at their short contexts a batch twice as long on
 * half the warps was 2.3% slower (decode-plan fact 85); several heads a
 * warp too: twice the positions spilled at 256-dim heads. */
template <class KV, int DPL, int HP, bool WIDE = false>
struct attn_shape {
    static constexpr int KV_REGS = HP == 1 ? 32 : 16, ROW_REGS = kv_row_regs(DPL, WIDE && sizeof(KV) == 2);
    static constexpr int BATCH = 32 / HP < KV_REGS / ROW_REGS ? 32 / HP : KV_REGS / ROW_REGS;
    /* the first batch loaded before the wait; 256-dim heads would spill */
    static constexpr bool PRELOAD = DPL <= 4;
};

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

/* A lane's DPL dims of one cached row as a batch holds them (load, or
 * set from the new position's floats) and hands them to the arithmetic
 * (widen): f32 as they are; f16 as the cache's bits, two a register, so
 * that a batch holds twice the positions (attn_shape). */
template <class KV, int DPL>
struct kv_row;

template <int DPL>
struct kv_row<float, DPL> {
    float d[DPL];
    __device__ __forceinline__ void load(const float *p, bool mine) { load_dims<DPL>(p, d, mine); }
    __device__ __forceinline__ void set(const float *v) {
#pragma unroll
        for (int i = 0; i < DPL; i++) d[i] = v[i];
    }
    __device__ __forceinline__ void widen(float *v) const {
#pragma unroll
        for (int i = 0; i < DPL; i++) v[i] = d[i];
    }
};

template <int DPL>
struct kv_row<uint16_t, DPL> {
    static constexpr int REGS = kv_row_regs(DPL, true);
    unsigned w[REGS];
    __device__ __forceinline__ void load(const uint16_t *p, bool mine) {
        if (!mine) {
#pragma unroll
            for (int i = 0; i < REGS; i++) w[i] = 0; /* +0 in f16 */
        } else if (DPL == 1) {
            w[0] = *p;
        } else if (DPL == 2) {
            w[0] = *(const unsigned *)p;
        } else {
#pragma unroll
            for (int i = 0; i < REGS; i += 2) {
                const uint2 t = *(const uint2 *)(p + 2 * i);
                w[i] = t.x, w[i + 1] = t.y;
            }
        }
    }
    /* v holds f16 values already (round_to_cache), so the bits are exact */
    __device__ __forceinline__ void set(const float *v) {
        if constexpr (DPL == 1) {
            w[0] = f2h(v[0]);
        } else {
#pragma unroll
            for (int i = 0; i < REGS; i++) w[i] = f2h(v[2 * i]) | (unsigned)f2h(v[2 * i + 1]) << 16;
        }
    }
    __device__ __forceinline__ void widen(float *v) const {
        if constexpr (DPL == 1) {
            v[0] = h2f((uint16_t)w[0]);
        } else {
#pragma unroll
            for (int i = 0; i < REGS; i++) {
                const float2 f = h2f2(w[i]);
                v[2 * i] = f.x, v[2 * i + 1] = f.y;
            }
        }
    }
};

template <int DPL>
__device__ __forceinline__ void store_kv(float *p, const float *v, bool mine) {
    store_dims<DPL>(p, v, mine);
}

template <int DPL>
__device__ __forceinline__ void store_kv(uint16_t *p, const float *v, bool mine) {
    if (!mine) return;
#pragma unroll
    for (int i = 0; i < DPL; i++) p[i] = f2h(v[i]);
}

/* The new position's key or value as a cache of KV holds it. */
template <class KV, int DPL>
__device__ __forceinline__ void round_to_cache(float *v) {
    if constexpr (std::is_same<KV, uint16_t>::value) {
#pragma unroll
        for (int i = 0; i < DPL; i++) v[i] = f2h_round(v[i]);
    }
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
template <class KV, int DPL, int HP, bool WIDE>
struct kv_batch {
    static constexpr int B = attn_shape<KV, DPL, HP, WIDE>::BATCH;
    kv_row<KV, DPL> k[B], v[B];
};

/* Positions p0, p0 + 1, ... of a batch from the cache, all loads issued
 * together; the new position (not cached yet) and those past the end get
 * zeros (put_new fills the new one in once it is made). */
template <class KV, int DPL, int HP, bool WIDE>
__device__ __forceinline__ void load_cached(const attn_args &a, int g, int pos, int p0, int end,
                                            kv_batch<KV, DPL, HP, WIDE> &b) {
    const int kv_dim = a.n_kv * a.hd, d0 = (threadIdx.x & 31) * DPL;
    const bool mine = d0 < a.hd;
    const KV *k_cache = (const KV *)a.k_cache + g * a.hd + d0, *v_cache = (const KV *)a.v_cache + g * a.hd + d0;
#pragma unroll
    for (int j = 0; j < kv_batch<KV, DPL, HP, WIDE>::B; j++) {
        const int p = p0 + j;
        const bool cached = p < end && p != pos;
        b.k[j].load(k_cache + (int64_t)p * kv_dim, mine && cached);
        b.v[j].load(v_cache + (int64_t)p * kv_dim, mine && cached);
    }
}

/* The new position's key and value into the batch that holds it (one
 * batch of the launch: a uniform branch for the others). */
template <class KV, int DPL, int HP, bool WIDE>
__device__ __forceinline__ void put_new(kv_batch<KV, DPL, HP, WIDE> &b, int p0, int pos, const float *k_new,
                                        const float *v_new) {
    constexpr int B = kv_batch<KV, DPL, HP, WIDE>::B;
    if (pos < p0 || pos >= p0 + B) return;
#pragma unroll
    for (int j = 0; j < B; j++)
        if (p0 + j == pos) b.k[j].set(k_new), b.v[j].set(v_new);
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

/* A warp's online softmax over its head group: (m, l) of the head whose
 * score this lane holds (head hh = (lane >> S) / B of the batch layout,
 * the same in every batch), and the HP heads' outputs at this lane's
 * dims, not yet divided by l. */
template <int DPL, int HP>
struct softmax_state {
    float m, l, acc[HP][DPL];
};

/* A warp's query heads, this lane's dims of head hh: per head its one
 * head in registers, grouped its group's from shared memory. */
template <int DPL>
struct query_in_regs {
    float q[DPL];
    __device__ __forceinline__ void head(int, float *out) const {
#pragma unroll
        for (int i = 0; i < DPL; i++) out[i] = q[i];
    }
};

template <int DPL>
struct query_in_smem {
    const float *q_s; /* hd floats a head */
    int hd;
    __device__ __forceinline__ void head(int hh, float *out) const {
        const int d0 = (threadIdx.x & 31) * DPL;
        load_dims<DPL>(q_s + hh * hd + d0, out, d0 < hd);
    }
};

/* One batch into the running state. Its HP x B scores are summed
 * together, lane L holding score (L >> S) = hh * B + j (head hh, position
 * p0 + j), so each lane takes one exponential; a head's maximum and sum
 * are reduced over the lanes of its B positions. */
template <class KV, int DPL, int HP, bool WIDE, class Q>
__device__ __forceinline__ void attend_batch(const kv_batch<KV, DPL, HP, WIDE> &b, int p0, int end, const Q &query,
                                             float scale, softmax_state<DPL, HP> &st) {
    constexpr int B = kv_batch<KV, DPL, HP, WIDE>::B, N = HP * B, S = scatter_shift(N);
    const int lane = threadIdx.x & 31;
    float dot[N];
#pragma unroll
    for (int hh = 0; hh < HP; hh++) {
        float q[DPL];
        query.head(hh, q);
#pragma unroll
        for (int j = 0; j < B; j++) {
            float k[DPL], d = 0.0f;
            b.k[j].widen(k);
#pragma unroll
            for (int i = 0; i < DPL; i++) d += q[i] * k[i];
            dot[hh * B + j] = d;
        }
    }
    float sc = warp_sum_scatter<N>(dot, lane) * scale;
    if (p0 + (lane >> S) % B >= end) sc = -INFINITY;
    float m_batch = sc;
#pragma unroll
    for (int off = (B / 2) << S; off >= (1 << S); off >>= 1)
        m_batch = fmaxf(m_batch, __shfl_xor_sync(FULL_MASK, m_batch, off));
    const float m_new = fmaxf(st.m, m_batch);
    const float r = expf(st.m - m_new); /* m = -inf first: r = 0 */
    const float e = expf(sc - m_new);   /* past the end: 0 */
    float e_sum = e;
#pragma unroll
    for (int off = (B / 2) << S; off >= (1 << S); off >>= 1) e_sum += __shfl_xor_sync(FULL_MASK, e_sum, off);
    st.l = st.l * r + e_sum;
    st.m = m_new;
#pragma unroll
    for (int hh = 0; hh < HP; hh++) {
        const float r_h = HP == 1 ? r : __shfl_sync(FULL_MASK, r, (hh * B) << S); /* one head: r is the warp's */
#pragma unroll
        for (int i = 0; i < DPL; i++) st.acc[hh][i] *= r_h;
#pragma unroll
        for (int j = 0; j < B; j++) {
            const float e_j = __shfl_sync(FULL_MASK, e, (hh * B + j) << S);
            float v[DPL];
            b.v[j].widen(v);
#pragma unroll
            for (int i = 0; i < DPL; i++) st.acc[hh][i] += e_j * v[i];
        }
    }
}

/* A warp's batches of [p0, end), every `step` positions, into its state;
 * the first batch (`b`) was loaded before the launch's wait. One copy of
 * the batch's code serves every batch (code size, see the top of this
 * file). */
template <class KV, int DPL, int HP, bool WIDE, class Q>
__device__ __forceinline__ void attend(const attn_args &a, int g, int pos, int p0, int end, int step, const Q &query,
                                       const float *k_new, const float *v_new, kv_batch<KV, DPL, HP, WIDE> &b,
                                       softmax_state<DPL, HP> &st) {
    const float scale = 1.0f / sqrtf((float)a.hd);
#pragma unroll 1
    while (p0 < end) {
        put_new(b, p0, pos, k_new, v_new);
        attend_batch(b, p0, end, query, scale, st);
        if ((p0 += step) < end) load_cached(a, g, pos, p0, end, b);
    }
}

/* A state with nothing in it yet. */
template <int DPL, int HP>
__device__ __forceinline__ void clear_state(softmax_state<DPL, HP> &st) {
    st.m = -INFINITY, st.l = 0.0f;
#pragma unroll
    for (int hh = 0; hh < HP; hh++)
#pragma unroll
        for (int i = 0; i < DPL; i++) st.acc[hh][i] = 0.0f;
}

/* This block's range of the position's n_pos: every split in use, each a
 * whole number of rounds of `round` positions (the fewest batches a warp
 * is the shortest path); n_active splits have positions. */
__device__ __forceinline__ int split_range(const attn_args &a, int n_pos, int round, int &start, int &end) {
    const int chunk = ((n_pos + a.n_splits - 1) / a.n_splits + round - 1) / round * round;
    start = blockIdx.y * chunk, end = min(start + chunk, n_pos);
    return (n_pos + chunk - 1) / chunk;
}

/* The range's rows after `from` pulled into L2 (the first batches are
 * loaded into registers). */
template <class KV>
__device__ __forceinline__ void prefetch_range(const attn_args &a, int g, int from, int end) {
    const int hd = a.hd, kv_dim = a.n_kv * hd, lines = (hd * (int)sizeof(KV) + 127) / 128;
    for (int t = threadIdx.x; t < 2 * (end - from) * lines; t += blockDim.x) {
        const int p = from + t / (2 * lines), c = t % (2 * lines);
        const KV *cache = (const KV *)(c < lines ? a.k_cache : a.v_cache);
        prefetch_l2((const uint8_t *)(cache + (int64_t)p * kv_dim + g * hd) + 128 * (c % lines));
    }
}

/* k and v of the position into the cache (this lane's dims). */
template <class KV, int DPL>
__device__ __forceinline__ void append_kv(const attn_args &a, int g, int pos, const float *k, const float *v) {
    const int kv_dim = a.n_kv * a.hd, d0 = (threadIdx.x & 31) * DPL;
    store_kv<DPL>((KV *)a.k_cache + (int64_t)pos * kv_dim + g * a.hd + d0, k, d0 < a.hd);
    store_kv<DPL>((KV *)a.v_cache + (int64_t)pos * kv_dim + g * a.hd + d0, v, d0 < a.hd);
}

/* ---------------------------------------------------------------- a block's fold */

/* A warp leaves its state in shared memory: outputs slots[w][head] (hd
 * floats each), (m, l) in ml[w][head], head = hg * HP + hh of the block's
 * Gb. */
template <int DPL, int HP, int B>
__device__ __forceinline__ void leave_state(const softmax_state<DPL, HP> &st, float *slots, float2 *ml, int Gb, int hg,
                                            int w, int hd) {
    constexpr int S = scatter_shift(HP * B);
    const int lane = threadIdx.x & 31, d0 = lane * DPL;
#pragma unroll
    for (int hh = 0; hh < HP; hh++) store_dims<DPL>(slots + (w * Gb + hg * HP + hh) * hd + d0, st.acc[hh], d0 < hd);
    if (lane % (B << S) == 0) ml[w * Gb + hg * HP + lane / (B << S)] = make_float2(st.m, st.l);
}

/* The weights of up to 32 partial softmaxes, lane i holding part i's (m,
 * l) and (-inf, 0) past the last: e^(m_i - M) at lane i; M, the largest
 * m, and L = sum_i l_i e^(m_i - M) at every lane. */
__device__ __forceinline__ float part_weight(float2 ml, float &M, float &L) {
    M = warp_max(ml.x);
    const float f = expf(ml.x - M);
    L = warp_sum(ml.y * f);
    return f;
}

/* Folds the states the first `busy` warps of each of the block's Gb heads
 * left (those with positions; heads h0.. of KV head g): warp hb < Gb weighs
 * head hb's, its lane w warp w's, in place of their m, and leaves (M, L) in
 * head_ml; every thread then sums the weighted outputs of its values and
 * writes the block's result: the output itself when the block covered the
 * whole range, else its part for the merge. All warps at once, where
 * fold_head_warps is one warp's chain. */
__device__ __forceinline__ void fold_block_warps(const attn_args &a, const float *slots, float2 *ml, float2 *head_ml,
                                                 int Gb, int h0, int busy, int g, int split, int n_active) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < Gb) {
        float M, L;
        const float f = part_weight(lane < busy ? ml[lane * Gb + warp] : make_float2(-INFINITY, 0.0f), M, L);
        if (lane < busy) ml[lane * Gb + warp].x = f;
        if (lane == 0) head_ml[warp] = make_float2(M, L);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < Gb * hd; t += blockDim.x) {
        const int hb = t / hd, d = t % hd, head = h0 + hb;
        float o = 0.0f;
        for (int w = 0; w < busy; w++) o += ml[w * Gb + hb].x * slots[(w * Gb + hb) * hd + d];
        const float2 ML = head_ml[hb];
        if (n_active == 1) { /* the whole range was this block's */
            a.out[(g * G + head) * hd + d] = o / ML.y;
        } else {
            const int slot = (g * a.n_splits + split) * G + head;
            a.part_out[(size_t)slot * hd + d] = o;
            if (d == 0) ((float2 *)a.part_ml)[slot] = ML;
        }
    }
}

/* ---------------------------------------------------------------- per head */

/* Folds the (m, l, acc) of warps 1..W-1 of each of the block's Gb heads
 * into warp 0's, through shared memory: (W - 1) * Gb slots of hd floats
 * (16-byte aligned), then their (m, l); hb is the warp's head of the
 * block's. Warp 0 of a head always has positions, so its m is finite and
 * an idle warp's (m = -inf) weighs exp(-inf) = 0. One warp's chain of W -
 * 1 steps: for the per-head way's few warps a head. */
template <int DPL>
__device__ __forceinline__ void fold_head_warps(float *slots, int W, int Gb, int hb, int w, int hd, float &m, float &l,
                                                float *acc) {
    const int lane = threadIdx.x & 31, d0 = lane * DPL;
    const bool mine = d0 < hd;
    float2 *ml = (float2 *)(slots + (W - 1) * Gb * hd);
    if (w > 0) {
        const int slot = (w - 1) * Gb + hb;
        store_dims<DPL>(slots + slot * hd + d0, acc, mine);
        if (lane == 0) ml[slot] = make_float2(m, l);
    }
    __syncthreads();
    if (w > 0) return;
#pragma unroll 1
    for (int j = 1; j < W; j++) {
        const int slot = (j - 1) * Gb + hb;
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

/* The last block of the same heads merges their n active splits (n <= 32):
 * warp (h, w) takes head h's splits w, w + W, ..., MB a round, every lane
 * holding the m and l of split `lane`; the W sums meet in shared memory
 * (slots by hb, the head's place among the block's Gb) and warp 0 of the
 * head writes the output. */
template <int DPL>
__device__ __forceinline__ void merge_head_splits(const attn_args &a, float *slots, int W, int Gb, int g, int h, int hb,
                                                  int w, int n) {
    const int G = a.n_heads / a.n_kv, hd = a.hd, lane = threadIdx.x & 31, d0 = lane * DPL;
    const bool mine = d0 < hd;
    const int first = g * a.n_splits * G + h, stride = G * hd; /* (g, split 0, h); floats between splits */
    constexpr int MB = 48 / DPL < 12 ? 48 / DPL : 12;          /* 16 spills at DPL 4 */
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
            const int s = s0 + j * W;                            /* uniform over the warp */
            const float f_s = __shfl_sync(FULL_MASK, f, s & 31); /* outside the condition: no branch around it */
            const float wt = s < n ? f_s * inv_l : 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) out[i] += wt * o[j][i];
        }
    }
    if (W > 1) { /* warps 1..W-1 hand their sums to warp 0 */
        if (w > 0) store_dims<DPL>(slots + ((w - 1) * Gb + hb) * hd + d0, out, mine);
        __syncthreads();
        if (w > 0) return;
#pragma unroll 1
        for (int j = 1; j < W; j++) {
            float o[DPL];
            load_dims<DPL>(slots + ((j - 1) * Gb + hb) * hd + d0, o, mine);
#pragma unroll
            for (int i = 0; i < DPL; i++) out[i] += o[i];
        }
    }
    store_dims<DPL>(a.out + (g * G + h) * hd + d0, out, mine);
}

/* Head blocks: the block's shared memory, in floats: the W warps' outputs
 * and their (m, l) for fold_block_warps, and its head's (M, L); the
 * merge's W - 1 slots fit in it. */
static int head_block_smem_floats(int hd) { return attn_warps_per_head(1) * (hd + 2) + 2; }

/* The per-head way and head blocks (see the top of this file): the block's
 * Gb heads from h0 of KV head g; warp (hb, w) takes head h0 + hb, hb = warp
 * % Gb, and every W-th batch of the block's range from w. */
template <class KV, int DPL, int GB>
__device__ __forceinline__ void attention_per_head(const attn_args &a, float *smem, int *flag, int pos) {
    constexpr bool HEAD_BLOCKS = GB > 0, WIDE = !HEAD_BLOCKS;
    constexpr int B = attn_shape<KV, DPL, 1, WIDE>::BATCH;
    static_assert(B == attn_per_head_batch(DPL, WIDE && sizeof(KV) == 2), "the host's switch points count these");
    const int G = a.n_heads / a.n_kv, Gb = HEAD_BLOCKS ? GB : G, W = attn_warps_per_head(Gb), hd = a.hd;
    const int g = HEAD_BLOCKS ? blockIdx.x / (G / GB) : blockIdx.x, split = blockIdx.y;
    const int h0 = HEAD_BLOCKS ? blockIdx.x % (G / GB) * GB : 0;
    const int warp = threadIdx.x >> 5, hb = warp % Gb, h = h0 + hb, w = warp / Gb, lane = threadIdx.x & 31;
    const int d0 = lane * DPL;
    const bool mine = d0 < hd;
    int start, end;
    const int n_active = split_range(a, pos + 1, W * B, start, end);
    /* Each warp's first batch in registers, the rest of the range into L2. */
    constexpr bool preload = attn_shape<KV, DPL, 1, WIDE>::PRELOAD;
    kv_batch<KV, DPL, 1, WIDE> first;
    if constexpr (preload) load_cached(a, g, pos, start + w * B, end, first);
    prefetch_range<KV>(a, g, preload ? start + W * B : start, end);
    head_consts<DPL> hc; /* the norms' weights and the rotation */
    if (start < end) load_head_consts<DPL>(a, g, h, pos, hc);
    pdl_wait(); /* q, k, v of this position */
    pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    if (start >= end) return; /* past the position: not counted by the merge */

    query_in_regs<DPL> query;
    float k[DPL], v[DPL];
    prepare<DPL>(a, hc, g, h, query.q, k, v);
    round_to_cache<KV, DPL>(k);
    round_to_cache<KV, DPL>(v);
    trace_mark(a.trace, TRACE_STAGED);
    if constexpr (!preload) load_cached(a, g, pos, start + w * B, end, first);
    if (warp == 0 && h == 0 && pos >= start && pos < end) append_kv<KV, DPL>(a, g, pos, k, v);
    softmax_state<DPL, 1> st;
    clear_state(st);
    attend(a, g, pos, start + w * B, end, W * B, query, k, v, first, st);
    if constexpr (HEAD_BLOCKS) {
        float2 *ml = (float2 *)(smem + W * Gb * hd), *head_ml = ml + W * Gb;
        leave_state<DPL, 1, B>(st, smem, ml, Gb, hb, w, hd);
        __syncthreads();
        fold_block_warps(a, smem, ml, head_ml, Gb, h0, min(W, (end - start + B - 1) / B), g, split, n_active);
    } else {
        if (W > 1) fold_head_warps<DPL>(smem, W, Gb, hb, w, hd, st.m, st.l, st.acc[0]);
        if (w == 0 && n_active == 1) { /* the whole range was this block's */
#pragma unroll
            for (int i = 0; i < DPL; i++) st.acc[0][i] /= st.l;
            store_dims<DPL>(a.out + (g * G + h) * hd + d0, st.acc[0], mine);
        } else if (w == 0) {
            const int slot = (g * a.n_splits + split) * G + h;
            store_dims<DPL>(a.part_out + (size_t)slot * hd + d0, st.acc[0], mine);
            if (lane == 0) ((float2 *)a.part_ml)[slot] = make_float2(st.m, st.l);
        }
    }
    trace_mark(a.trace, TRACE_WORKED);
    if (n_active == 1 || !last_block(a.counters + blockIdx.x, n_active, flag)) return;
    merge_head_splits<DPL>(a, smem, W, Gb, g, h, hb, w, n_active);
    trace_mark(a.trace, TRACE_EXIT);
}

/* ---------------------------------------------------------------- grouped */

/* Grouped: shared memory, in floats: the query heads (G x hd), the new
 * key and value (2 x hd), then the warps' states (W x G x hd outputs, W x
 * G (m, l) and each head's folded (M, L)), whose room the merge reuses:
 * the per-head merge's (16 / G - 1) x G slots fit in W x G = 16 HP. */
static int grouped_smem_floats(int G, int hd, int hp) {
    return G * hd + 2 * hd + attn_warps_per_group(G, hp) * G * (hd + 2) + 2 * G;
}

/* The grouped way (see the top of this file): warp (hg, w) takes heads
 * hg * HP .. hg * HP + HP - 1 and every W-th batch of the block's range
 * from w. Warp h < G prepares query head h into shared memory (q_s), warp
 * 0 the new key and value too (kv_new). */
template <class KV, int DPL, int HP>
__device__ __forceinline__ void attention_grouped(const attn_args &a, float *smem, int *flag, int pos) {
    constexpr int B = attn_shape<KV, DPL, HP>::BATCH;
    const int G = a.n_heads / a.n_kv, W = attn_warps_per_group(G, HP), hd = a.hd, g = blockIdx.x, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, hg = warp / W, w = warp % W, lane = threadIdx.x & 31, d0 = lane * DPL;
    const bool mine = d0 < hd;
    float *q_s = smem, *kv_new = q_s + G * hd, *slots = kv_new + 2 * hd;
    float2 *ml = (float2 *)(slots + W * G * hd), *head_ml = ml + W * G;
    int start, end;
    const int n_active = split_range(a, pos + 1, B, start, end);
    constexpr bool preload = attn_shape<KV, DPL, HP>::PRELOAD;
    kv_batch<KV, DPL, HP, false> first;
    if constexpr (preload) load_cached(a, g, pos, start + w * B, end, first);
    prefetch_range<KV>(a, g, preload ? start + W * B : start, end);
    head_consts<DPL> hc; /* the norms' weights and the rotation of query head `warp` */
    if (start < end && warp < G) load_head_consts<DPL>(a, g, warp, pos, hc);
    pdl_wait(); /* q, k, v of this position */
    pdl_launch_dependents();
    trace_mark(a.trace, TRACE_WAITED);
    if (start >= end) return; /* past the position: not counted by the merge */

    if (warp < G) {
        float q[DPL], k[DPL], v[DPL];
        prepare<DPL>(a, hc, g, warp, q, k, v);
        store_dims<DPL>(q_s + warp * hd + d0, q, mine);
        if (warp == 0) {
            round_to_cache<KV, DPL>(k);
            round_to_cache<KV, DPL>(v);
            store_dims<DPL>(kv_new + d0, k, mine);
            store_dims<DPL>(kv_new + hd + d0, v, mine);
            if (pos >= start && pos < end) append_kv<KV, DPL>(a, g, pos, k, v);
        }
    }
    __syncthreads();
    trace_mark(a.trace, TRACE_STAGED);
    if constexpr (!preload) load_cached(a, g, pos, start + w * B, end, first);
    float k_new[DPL], v_new[DPL];
    load_dims<DPL>(kv_new + d0, k_new, mine);
    load_dims<DPL>(kv_new + hd + d0, v_new, mine);
    softmax_state<DPL, HP> st;
    clear_state(st);
    attend(a, g, pos, start + w * B, end, W * B, query_in_smem<DPL>{q_s + hg * HP * hd, hd}, k_new, v_new, first,
           st);
    leave_state<DPL, HP, B>(st, slots, ml, G, hg, w, hd);
    __syncthreads();
    fold_block_warps(a, slots, ml, head_ml, G, 0, min(W, (end - start + B - 1) / B), g, split, n_active);
    trace_mark(a.trace, TRACE_WORKED);
    if (n_active == 1 || !last_block(a.counters + g, n_active, flag)) return;
    /* the per-head merge: its warps' layout needs only 16 warps, G x 16 / G */
    merge_head_splits<DPL>(a, slots, attn_warps_per_head(G), G, g, warp % G, warp % G, warp / G, n_active);
    trace_mark(a.trace, TRACE_EXIT);
}

/* ---------------------------------------------------------------- kernels */

/* GB query heads a block: 1 (head blocks), or 0 for all G of a KV head
 * (the per-head way). A kernel a way, not one with a switch: together
 * they spill (128 registers at 16 warps). */
template <class KV, int DPL, int GB>
__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(const attn_args a) {
    DYN_SMEM(float, smem);
    __shared__ int flag;
    trace_mark(a.trace, TRACE_ENTRY);
    /* The position and the cached keys and values were written by earlier
     * steps, complete before the launch before this one passed its own
     * wait: the range's rows are pulled into L2 while that launch runs. */
    attention_per_head<KV, DPL, GB>(a, smem, &flag, __ldcg(a.step + 1));
}

template <class KV, int DPL, int HP>
__global__ void __launch_bounds__(ATTN_THREADS) attention_grouped_kernel(const attn_args a) {
    DYN_SMEM(float, smem);
    __shared__ int flag;
    trace_mark(a.trace, TRACE_ENTRY);
    attention_grouped<KV, DPL, HP>(a, smem, &flag, __ldcg(a.step + 1)); /* as above */
}

/* The dims a lane holds of an hd-dim head: hd / 32 (one, or none, below 32). */
static int dims_per_lane(int hd) { return hd > 32 ? hd / 32 : 1; }

/* Rotary pairs must not straddle lanes unevenly, a block is at most ATTN_MAX_G warps, and the merge reads at most
 * ATTN_MAX_SPLITS splits. */
bool cuda_attention_supported(int G, int hd, int n_rot, int n_splits) {
    return ((hd <= 32 && hd % 2 == 0) || hd == 64 || hd == 128 || hd == 256) && n_rot % 2 == 0 &&
           (n_rot / 2) % dims_per_lane(hd) == 0 && G >= 1 && G <= ATTN_MAX_G && n_splits >= 1 &&
           n_splits <= ATTN_MAX_SPLITS;
}

/* Heads a warp in the grouped way for G heads of hd dims: 1 (none) unless
 * G is a power of two above 1. */
static int grouped_hp(int G, int hd) {
    return G > 1 && (G & (G - 1)) == 0 ? attn_heads_per_warp(dims_per_lane(hd), G) : 1;
}

/* The kernel for heads of hd dims (hd / 32 a lane), per head or grouped. */
typedef void (*attention_fn)(const attn_args);
template <class KV, int DPL>
static attention_fn grouped_kernel_with(int hp) {
    return hp == 2   ? attention_grouped_kernel<KV, DPL, 2>
           : hp == 4 ? attention_grouped_kernel<KV, DPL, 4>
                     : attention_grouped_kernel<KV, DPL, 8>;
}

template <class KV, int GB>
static attention_fn per_head_kernel_for(int hd) {
    return hd <= 32    ? attention_kernel<KV, 1, GB>
           : hd == 64  ? attention_kernel<KV, 2, GB>
           : hd == 128 ? attention_kernel<KV, 4, GB>
                       : attention_kernel<KV, 8, GB>;
}

template <class KV>
static attention_fn kernel_for_cache(int G, int hd, int way) {
    const int hp = grouped_hp(G, hd);
    if (way == ATTN_HEAD_BLOCKS) return per_head_kernel_for<KV, 1>(hd);
    if (way == ATTN_PER_HEAD || hp == 1) return per_head_kernel_for<KV, 0>(hd);
    if (hd > 128) return hp == 2 ? attention_grouped_kernel<KV, 8, 2> : attention_grouped_kernel<KV, 8, 4>;
    return hd <= 32   ? grouped_kernel_with<KV, 1>(hp)
           : hd == 64 ? grouped_kernel_with<KV, 2>(hp)
                      : grouped_kernel_with<KV, 4>(hp);
}

static attention_fn attention_kernel_for(int G, int hd, int way, bool kv_f16) {
    return kv_f16 ? kernel_for_cache<uint16_t>(G, hd, way) : kernel_for_cache<float>(G, hd, way);
}

/* The way a launch for G heads of hd dims takes: grouped only where the
 * heads have groups, and for G = 1 head blocks are the per-head way. */
static int way_for(int way, int G, int hd) {
    if ((way == ATTN_GROUPED && grouped_hp(G, hd) == 1) || (way == ATTN_HEAD_BLOCKS && G == 1)) return ATTN_PER_HEAD;
    return way;
}

/* A block's threads: 16 warps, but W a head for the per-head way's G heads. */
static int attn_threads(int G, int way) {
    return way == ATTN_PER_HEAD ? 32 * G * attn_warps_per_head(G) : ATTN_THREADS;
}

/* Shared memory: per head, the fold's (W - 1) x G slots of hd floats and
 * their (m, l); head blocks and grouped: see above. */
static size_t attn_smem(int G, int hd, int way) {
    const int floats = way == ATTN_GROUPED       ? grouped_smem_floats(G, hd, grouped_hp(G, hd))
                       : way == ATTN_HEAD_BLOCKS ? head_block_smem_floats(hd)
                                                 : (attn_warps_per_head(G) - 1) * G * (hd + 2);
    return (size_t)floats * sizeof(float);
}

/* A count of positions from the environment variable `name` (0: none), or `fallback`. */
static int env_positions(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

/* Positions a batch of one head a warp holds: wide with an f16 cache
 * (the per-head way) or f32's (head blocks, an f32 cache). */
static int per_head_batch(int hd, bool wide_f16) { return attn_per_head_batch(dims_per_lane(hd), wide_f16); }

/* Positions (pos + 1) from which the grouped way runs: where the per-head
 * way would give a warp 4 batches or more (decode-plan fact 67: 2048
 * positions for Qwen3-30B-A3B on an H200, 32 splits, an f32 cache; 4096
 * with an f16 cache's wide batches, decode-plan fact 85), or
 * MOE_CUDA_ATTN_GROUPED_FROM; never where G is not a power of two above 1. */
int cuda_attention_grouped_from(int G, int hd, int n_splits, bool kv_f16) {
    if (grouped_hp(G, hd) == 1) return INT_MAX;
    const int batch = per_head_batch(hd, kv_f16);
    return env_positions("MOE_CUDA_ATTN_GROUPED_FROM", 4 * attn_warps_per_head(G) * batch * n_splits);
}

/* Positions (pos + 1) up to which head blocks run: while one block takes
 * them all, a batch a warp (128 for Qwen3-30B-A3B; decode-plan fact 80:
 * 1.9% faster at tg128 on an H100, and 1.5-2.6% slower than the per-head
 * way at 128 to 576 positions, where they merge splits), or
 * MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL; never for G = 1, where they are the
 * per-head way. */
int cuda_attention_head_blocks_until(int G, int hd) {
    if (G == 1) return 0;
    return env_positions("MOE_CUDA_ATTN_HEAD_BLOCKS_UNTIL", attn_warps_per_head(1) * per_head_batch(hd, false));
}

/* The way for the position (its thresholds from the two above). */
int cuda_attention_way(int pos, int head_blocks_until, int grouped_from) {
    return pos + 1 >= grouped_from ? ATTN_GROUPED : pos + 1 <= head_blocks_until ? ATTN_HEAD_BLOCKS : ATTN_PER_HEAD;
}

/* Lets the grouped kernels for (G, hd) take their shared memory (past
 * 48 KB for Qwen3's 8 heads a warp); at state creation, never inside a
 * capture. */
cudaError_t cuda_attention_setup(int G, int hd) {
    if (grouped_hp(G, hd) == 1) return cudaSuccess;
    const int smem = (int)attn_smem(G, hd, ATTN_GROUPED);
    cudaError_t e = cudaFuncSetAttribute(attention_kernel_for(G, hd, ATTN_GROUPED, false),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attention_kernel_for(G, hd, ATTN_GROUPED, true),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return e;
}

/* Blocks per KV head (per query head with head_blocks): as many as fit on
 * the GPU at once (a long context is then read by every multiprocessor,
 * so more of its loads are in flight), at most the merge's
 * ATTN_MAX_SPLITS. */
int cuda_attention_splits(int n_sm, int n_heads, int n_kv, int hd, bool head_blocks, bool kv_f16) {
    const int G = n_heads / n_kv, way = way_for(head_blocks ? ATTN_HEAD_BLOCKS : ATTN_PER_HEAD, G, hd);
    int per_sm = 1;
    cudaError_t e = cuda_attention_setup(G, hd);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel_for(G, hd, way, kv_f16),
                                                          attn_threads(G, way), attn_smem(G, hd, way));
    if (e != cudaSuccess || per_sm < 1) per_sm = 1;
    int splits = per_sm * n_sm / (way == ATTN_HEAD_BLOCKS ? n_heads : n_kv);
    return splits < 1 ? 1 : splits > ATTN_MAX_SPLITS ? ATTN_MAX_SPLITS : splits;
}

/* a->n_splits are the way's: blocks a query head with head blocks, a KV
 * head otherwise. */
void cuda_attention(const attn_args *a, cudaStream_t st, bool pdl) {
    const int G = a->n_heads / a->n_kv;
    attn_args k = *a;
    k.way = way_for(a->way, G, a->hd);
    LAUNCH_PDL(pdl, attention_kernel_for(G, k.hd, k.way, k.kv_f16),
               dim3(k.way == ATTN_HEAD_BLOCKS ? k.n_heads : k.n_kv, k.n_splits), attn_threads(G, k.way),
               attn_smem(G, k.hd, k.way), st, k);
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
