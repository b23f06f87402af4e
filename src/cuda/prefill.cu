/*
 * prefill.cu — a prompt on the GPU in chunks of 512 to 2048 tokens
 * (pass_tokens) that go through each layer together, every matrix product a tensor-core
 * GEMM (bf16 operands, f32 accumulation: cuBLAS for the dense ones, the
 * experts' in expert_codes.cuh or expert_gemm.cuh), instead of one decode
 * step per token.
 * Per chunk of T tokens:
 *
 *   embedding rows (dequantized, f32)                    x (T, n_embd)
 *   per layer:
 *     RMSNorm -> bf16                                     norm_kernel
 *     q|k|v = W xn                                        one GEMM
 *     bias, q/k norm, RoPE, k and v into the cache        qk_prepare_kernel
 *     causal attention over the cache (GQA)               attention_kernel
 *     x += Wo att                                         GEMM onto x
 *     RMSNorm; a dense SwiGLU FFN, or:
 *       router logits (f32 GEMM), softmax|sigmoid, top-k  route_kernel
 *       the (token, slot) pairs grouped by expert         group_kernel
 *       gate|up GEMM, SwiGLU, down GEMM per expert        over its tokens,
 *         each product of all experts one launch          expert_codes.cuh
 *       x += sum_j w_j out_j                              scatter_kernel
 *       the shared expert (sigmoid-gated), as dense
 *   output head on the positions asked for                the decode's gemv
 *
 * Weights stay quantized in memory. The experts' products read them so,
 * Q4_K's, Q5_K's and Q6_K's decoding their codes into the tensor cores'
 * operands in registers (expert_codes.cuh), the others dequantizing tile by tile in shared
 * memory (expert_gemm.cuh). Each
 * dense matrix is dequantized to bf16 into one reusable scratch just
 * before its cuBLAS GEMM (the format table's dequant, dequant.cuh), as are
 * the experts, a batch at a time, on the other paths MOE_CUDA_EXPERTS
 * picks (grouped, each), which cost a read of the quantized weights and a
 * write and read of bf16 per chunk (more than the GEMMs themselves up to
 * 512 tokens: below). Experts are read only
 * when some token of the chunk chose them. That cost is why short runs
 * stay with the decode step: a chunk of a MoE model costs about the same
 * once most experts are chosen, so the batched prefill pays only from
 * about E / k tokens on (E experts, k a token). Measured on
 * Qwen3-30B-A3B Q4_K with the experts from the codes (an H100,
 * bench/results/2026-12-05-s25, MOE_CUDA_PREFILL_MIN=1 against
 * MOE_CUDA_PREFILL=0): batched pp8 575 tok/s, pp16 922, pp32 1539, pp64
 * 2790; token by token 644, 648, 638, 624, so the crossover is near 10
 * (it was near 30 with the experts dequantized into bf16 first, 2 E / k;
 * 5 E / k before that). E / k = 16 here. Dense models go batched from
 * PREFILL_MIN_TOKENS.
 * Where a chunk's time goes is `moe bench --profile`'s prefill table
 * (cuda_prefill_profile_run): after the nineteenth session
 * (bench/results/2026-12-03-s19, run 5), 512 tokens took 84 ms there (the
 * experts' fused products 49, the attention 26) and 2048 took 336 (the
 * attention 237: quadratic, on CUDA cores). With the attention on tensor
 * cores (attention_mma_kernel, the twenty-first session) 512 take 61 ms
 * (the attention 5, the experts 46): pp512 8597 tok/s, pp2048 16150
 * (bench/results/2026-12-04-s21).
 * With the experts from the codes (the twenty-fourth session,
 * bench/results/2026-12-05-s24, an H100) 512 tokens take 34 ms (the
 * experts 18) and the fused products pay at every length.
 *
 * Grouping by expert runs on the device (group_kernel) where the fused
 * products take the experts whatever the routing; the other paths need
 * it on the host (each expert's cuBLAS GEMM has its token count as a
 * dimension): one copy and one stream sync per MoE layer.
 *
 * Precision: the residual stream, the KV cache (f32, the layout the decode
 * step reads), norms, RoPE, attention, router logits and routing weights
 * are f32 as on the CPU; only GEMM operands are rounded to bf16 (8-bit
 * mantissa: ~3e-3 relative per product), and the routed experts' down
 * products (their gate|up too on the grouped paths, which cuBLAS's
 * grouped call returns in bf16 only). The head goes through
 * the decode step's gemv, so the logits see the CPU's activation
 * quantization.
 *
 * The simulator build (MOE_CUDA_SIM) runs the prefill too, its cuBLAS
 * calls as plain loops (cublas_sim.h), so CI covers the grouping, the
 * passes and the kernels here.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.cuh"
#include "cuda/prefill.h"
#include "quant/block.h"

#ifdef MOE_CUDA_SIM
#include "cuda/cublas_sim.h"
#else
#include <cublas_v2.h>
#endif

#define PREFILL_CHUNK        512                /* tokens per pass through the layers, at least */
#define PREFILL_CHUNK_MAX    2048               /* and at most: see pass_tokens */
#define PREFILL_SCRATCH_PART 0.05               /* of the weights' bytes, that a longer pass may take */
#define PREFILL_MIN_TOKENS   16                 /* fewer go through the decode step (see the top) */
#define PREFILL_EXPERT_BYTES ((int64_t)256 << 20) /* bf16 scratch for one batch of experts: a few % of a 17 GB model */
#define ROW_THREADS          256
#define ATT_THREADS          256
#define ATT_TILE             32 /* keys a block holds at once: a lane each in the softmax */
#define ATT_MAX_G            16 /* query heads per KV head (check_config) */

/* ---------------------------------------------------------------- per-token rows */

/* out16 (and out32 unless NULL) = x, RMSNorm'ed with w unless w is NULL;
 * one block per row of n. The scale as cpu_rmsnorm: sum of squares in
 * double. */
static __global__ void __launch_bounds__(ROW_THREADS)
    norm_kernel(const float *x, const float *w, float eps, int n, float *out32, uint16_t *out16) {
    __shared__ double scratch[32];
    const int64_t at = (int64_t)blockIdx.x * n;
    float scale = 1.0f;
    if (w) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            ss += (double)x[at + i] * x[at + i];
        scale = rms_scale(block_sum_double(ss, scratch), n, eps);
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = w ? x[at + i] * scale * w[i] : x[at + i];
        if (out32) out32[at + i] = v;
        out16[at + i] = f32_to_bf16_bits(v);
    }
}

/* A product's value: f32, or bf16 bits (the experts' grouped products). */
__device__ __forceinline__ float product_value(float v) { return v; }
__device__ __forceinline__ float product_value(uint16_t v) { return bf16_bits_to_f32(v); }

/* h[r] = silu(g) * u * scale[r] (bf16) from row r of gu = [g (ff) | u (ff)]. */
template <class T>
static __global__ void __launch_bounds__(ROW_THREADS)
    swiglu_kernel(uint16_t *h, const T *gu, int ff, const float *scale) {
    const int64_t r = blockIdx.x;
    const T *g = gu + r * 2 * ff, *u = g + ff;
    const float s = scale ? scale[r] : 1.0f;
    for (int i = threadIdx.x; i < ff; i += blockDim.x) {
        const float gi = product_value(g[i]);
        h[r * ff + i] = f32_to_bf16_bits(gi / (1.0f + expf(-gi)) * product_value(u[i]) * s);
    }
}

/* out[t] = sigmoid(xn[t] . w): the shared expert's gate, a warp per token,
 * in double as the CPU. */
static __global__ void shared_gate_kernel(float *out, const float *xn, const float *w, int n) {
    const float *x = xn + (int64_t)blockIdx.x * n;
    double dot = 0.0;
    for (int i = threadIdx.x; i < n; i += 32)
        dot += (double)x[i] * w[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        dot += __shfl_xor_sync(FULL_MASK, dot, off);
    if (threadIdx.x == 0) out[blockIdx.x] = (float)(1.0 / (1.0 + exp(-dot)));
}

/* Expert e's token tiles (expert, first row, rows: at most EG_TOKENS)
 * for its count rows from row start on, at tiles + 3 n on; returns n
 * past them. */
static __host__ __device__ int list_expert_tiles(int *tiles, int n, int e, int start, int count) {
    for (int r = 0; r < count; r += EG_TOKENS, n++)
        tiles[3 * n] = e, tiles[3 * n + 1] = start + r, tiles[3 * n + 2] = count - r < EG_TOKENS ? count - r : EG_TOKENS;
    return n;
}

/* group_by_expert and list_tiles on the device, into index as the host
 * lays it out (used experts and tiles in expert order), the tiles'
 * count in *n_tiles; one block. A row's place among its expert's rows
 * comes from an atomic, so it varies from run to run, the products do
 * not: a token's column of a product is summed alike wherever it sits in
 * a tile, and the combine reads the rows by slot. */
static __global__ void __launch_bounds__(1024)
    group_kernel(int *index, int *n_tiles, const int *ids, int R, int k, int E, int cap_rows) {
    DYN_SMEM(int, count);
    int *fill = count + E, *row_token = index, *slot_row = index + cap_rows, *used = slot_row + cap_rows;
    int *tiles = used + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < R; i += blockDim.x) atomicAdd(&count[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int n_used = 0, n = 0;
        for (int e = 0, at = 0; e < E; at += count[e++]) {
            fill[e] = at;
            if (count[e]) used[n_used++] = e;
            n = list_expert_tiles(tiles, n, e, at, count[e]);
        }
        *n_tiles = n;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        const int r = atomicAdd(&fill[ids[i]], 1);
        row_token[r] = i / k;
        slot_row[i] = r;
    }
}

/* dst row r = src row row_token[r]: the inputs of the grouped experts. */
static __global__ void gather_rows_kernel(uint16_t *dst, const uint16_t *src, const int *row_token, int n) {
    const uint4 *from = (const uint4 *)(src + (int64_t)row_token[blockIdx.x] * n);
    uint4 *to = (uint4 *)(dst + (int64_t)blockIdx.x * n);
    for (int i = threadIdx.x; i < n / 8; i += blockDim.x)
        to[i] = from[i];
}

/* x[t] += sum_j w[t, j] * out[slot_row[t k + j]], j in slot order (the
 * CPU's order); one block per token, no atomics. */
static __global__ void __launch_bounds__(ROW_THREADS)
    scatter_kernel(float *x, const uint16_t *out, const float *weights, const int *slot_row, int k, int n) {
    const int64_t t = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float acc = x[t * n + i];
        for (int j = 0; j < k; j++)
            acc += weights[t * k + j] * product_value(out[(int64_t)slot_row[t * k + j] * n + i]);
        x[t * n + i] = acc;
    }
}

/* ---------------------------------------------------------------- attention */

/* One layer's attention for T new tokens at positions pos..pos+T-1. */
struct prefill_attn {
    float *qkv; /* (T, qkv_stride): q | k | v, rotated in place */
    int qkv_stride;
    const float *bq, *bk, *bv;    /* or NULL */
    const float *q_norm, *k_norm; /* or NULL */
    int qk_norm;                  /* qk_norm_kind */
    float eps;
    const float *rope;        /* (n_ctx, n_rot): cos | sin of each position's angles (attention.cu) */
    int n_rot, neox;
    void *k_cache, *v_cache;  /* this layer: (n_ctx, kv_dim), f32 or (kv_f16) f16 bits */
    bool kv_f16;
    float *out;               /* (T, q_dim) */
    int pos, n_heads, n_kv, hd;
};

/* Element i of a KV cache, f32 or f16 bits; four from i, a multiple of 4. */
static __device__ float cache_get(const void *cache, int64_t i, bool f16) {
    return f16 ? h2f(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}

static __device__ float4 cache_get4(const void *cache, int64_t i, bool f16) {
    if (!f16) return *(const float4 *)((const float *)cache + i);
    const uint2 t = *(const uint2 *)((const uint16_t *)cache + i);
    const float2 lo = h2f2(t.x), hi = h2f2(t.y);
    const float4 v = {lo.x, lo.y, hi.x, hi.y};
    return v;
}

static __device__ void cache_put(void *cache, int64_t i, float v, bool f16) {
    if (f16) ((uint16_t *)cache)[i] = f2h(v);
    else ((float *)cache)[i] = v;
}

/* RMSNorm of one head in place, by one warp (the scale as cpu_rmsnorm). */
static __device__ void rms_head(float *p, int n, const float *w, float eps, int lane) {
    const float scale = rms_scale(sum_squares_strided(p, n, lane), n, eps);
    for (int d = lane; d < n; d += 32)
        p[d] = p[d] * scale * w[d];
}

/* One token per block, as qk_norm_and_rope in cpu_forward.c: biases, q/k
 * norm (per head or over the whole projection), RoPE of q and k, then k
 * and v into the cache. All of a chunk's keys are in the cache before the
 * attention kernel starts. */
static __global__ void __launch_bounds__(ROW_THREADS) qk_prepare_kernel(const prefill_attn a) {
    __shared__ double scratch[32];
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const int pos = a.pos + blockIdx.x, half = a.n_rot / 2;
    const int q_dim = a.n_heads * a.hd, kv_dim = a.n_kv * a.hd;
    float *q = a.qkv + (int64_t)blockIdx.x * a.qkv_stride, *k = q + q_dim, *v = k + kv_dim;
    for (int i = tid; a.bq && i < q_dim; i += nt)
        q[i] += a.bq[i];
    for (int i = tid; a.bk && i < kv_dim; i += nt)
        k[i] += a.bk[i];
    for (int i = tid; a.bv && i < kv_dim; i += nt)
        v[i] += a.bv[i];
    const float *rope_cs = a.rope + (int64_t)pos * a.n_rot;
    __syncthreads();
    if (a.qk_norm == QK_NORM_PER_HEAD) {
        for (int h = warp; h < a.n_heads + a.n_kv; h += nw)
            rms_head(h < a.n_heads ? q + h * a.hd : k + (h - a.n_heads) * a.hd, a.hd,
                     h < a.n_heads ? a.q_norm : a.k_norm, a.eps, lane);
    } else if (a.qk_norm == QK_NORM_FULL) {
        double sq = 0.0, sk = 0.0;
        for (int i = tid; i < q_dim; i += nt)
            sq += (double)q[i] * q[i];
        for (int i = tid; i < kv_dim; i += nt)
            sk += (double)k[i] * k[i];
        const float scale_q = rms_scale(block_sum_double(sq, scratch), q_dim, a.eps);
        const float scale_k = rms_scale(block_sum_double(sk, scratch), kv_dim, a.eps);
        for (int i = tid; i < q_dim; i += nt)
            q[i] = q[i] * scale_q * a.q_norm[i];
        for (int i = tid; i < kv_dim; i += nt)
            k[i] = k[i] * scale_k * a.k_norm[i];
    }
    __syncthreads();
    for (int j = tid; j < (a.n_heads + a.n_kv) * half; j += nt) {
        const int h = j / half, i = j - h * half;
        float *p = h < a.n_heads ? q + h * a.hd : k + (h - a.n_heads) * a.hd;
        const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
        const float c = rope_cs[i], s = rope_cs[half + i], x0 = p[ia], x1 = p[ib];
        p[ia] = x0 * c - x1 * s;
        p[ib] = x0 * s + x1 * c;
    }
    __syncthreads();
    for (int i = tid; i < kv_dim; i += nt) {
        cache_put(a.k_cache, (int64_t)pos * kv_dim + i, k[i], a.kv_f16);
        cache_put(a.v_cache, (int64_t)pos * kv_dim + i, v[i], a.kv_f16);
    }
}

/* The attention's tiles: a block takes up to ATT_ROWS query rows (QT
 * tokens x the G query heads of one KV head) and walks the keys ATT_TILE
 * (a warp's width) at a time, each tile of keys and values copied to
 * shared memory once for all its rows. One token a block, as before the
 * eighteenth session, read every cached key and value from L2 once per
 * token and summed each score across a warp: 36 ms of pp512's 165 on
 * Qwen3-30B-A3B (bench/results/2026-12-03-s18). */
#define ATT_ROWS 64

static __host__ __device__ int attention_tokens(int G) { return ATT_ROWS / G > 0 ? ATT_ROWS / G : 1; }

/* Floats of shared memory: q and k rows padded by one (the scores read
 * them down a column), v, the scores, and m, l and the correction a row. */
static size_t attention_smem(int hd) {
    return sizeof(float) * ((size_t)(ATT_ROWS + ATT_TILE) * (hd + 1) + (size_t)ATT_TILE * hd +
                            (size_t)ATT_ROWS * ATT_TILE + 3 * ATT_ROWS);
}

/* Block (b, g): tokens b QT .. of the chunk, the G query heads of KV head
 * g (row r = token (r / G), head (r % G)), over positions 0..pos+t each,
 * with an online softmax (running max m, sum l; earlier sums rescaled by
 * e^(m_old - m_new)). Scores: a thread takes 2 rows x 4 keys of a tile;
 * the softmax a warp a row, a lane a key; the values a thread a dimension
 * of 256 / hd rows apart, SLOTS rows at most (an instance for heads up
 * to 128 wide, 32, and one up to 256, 64: the accumulators are registers). */
template <int SLOTS>
static __global__ void __launch_bounds__(ATT_THREADS) attention_kernel(const prefill_attn a, int T) {
    DYN_SMEM(float, sm);
    const int G = a.n_heads / a.n_kv, hd = a.hd, g = blockIdx.y, QT = attention_tokens(G), q0 = blockIdx.x * QT;
    const int R = min(QT, T - q0) * G, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kv_dim = a.n_kv * hd, q_dim = a.n_heads * hd, hp = hd + 1, last = a.pos + q0 + R / G; /* keys < last */
    float *qs = sm, *ks = qs + ATT_ROWS * hp, *vs = ks + ATT_TILE * hp, *sc = vs + ATT_TILE * hd, *m = sc + ATT_ROWS * ATT_TILE,
          *l = m + ATT_ROWS, *corr = l + ATT_ROWS;
    for (int i = tid; i < R * hd; i += ATT_THREADS) {
        const int r = i / hd, d = i - r * hd;
        qs[r * hp + d] = a.qkv[(int64_t)(q0 + r / G) * a.qkv_stride + (g * G + r % G) * hd + d];
    }
    if (tid < R) m[tid] = -INFINITY, l[tid] = 0.0f;
    const int row_groups = ATT_THREADS / hd, d_own = tid % hd, r_own = tid / hd; /* the values' rows */
    float acc[SLOTS];
#pragma unroll
    for (int k = 0; k < SLOTS; k++)
        acc[k] = 0.0f;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int k0 = 0; k0 < last; k0 += ATT_TILE) {
        const int n = min(ATT_TILE, last - k0);
        __syncthreads(); /* the tile before is done with ks, vs and sc */
        for (int i = tid; i < n * hd; i += ATT_THREADS) {
            const int j = i / hd, d = i - j * hd;
            const int64_t at = (int64_t)(k0 + j) * kv_dim + g * hd + d;
            ks[j * hp + d] = cache_get(a.k_cache, at, a.kv_f16);
            vs[j * hd + d] = cache_get(a.v_cache, at, a.kv_f16);
        }
        __syncthreads();
        const int tx = tid & 7, ty = tid >> 3;
        for (int r = ty; r < R; r += ATT_THREADS / 8) {
            float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int d = 0; d < hd; d++) {
                const float q = qs[r * hp + d];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    dot[i] += q * ks[(tx + 8 * i) * hp + d];
            }
            const int visible = a.pos + q0 + r / G + 1 - k0; /* keys of this tile the row sees */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = tx + 8 * i;
                sc[r * ATT_TILE + j] = j < n && j < visible ? dot[i] * scale : -INFINITY;
            }
        }
        __syncthreads();
        for (int r = warp; r < R; r += ATT_THREADS / 32) {
            const float s = sc[r * ATT_TILE + lane], m_new = fmaxf(m[r], warp_max(s));
            const float e = s == -INFINITY ? 0.0f : expf(s - m_new); /* m_new is finite: key 0 is in every row */
            sc[r * ATT_TILE + lane] = e;
            const float sum = warp_sum(e);
            if (lane == 0) {
                corr[r] = expf(m[r] - m_new); /* 0 on the first tile */
                l[r] = l[r] * corr[r] + sum;
                m[r] = m_new;
            }
        }
        __syncthreads();
        if (r_own >= row_groups) continue;
#pragma unroll
        for (int k = 0; k < SLOTS; k++) {
            const int r = r_own + k * row_groups;
            if (r < R) acc[k] *= corr[r];
        }
        for (int j = 0; j < n; j++) {
            const float v = vs[j * hd + d_own];
#pragma unroll
            for (int k = 0; k < SLOTS; k++) {
                const int r = r_own + k * row_groups;
                if (r < R) acc[k] += sc[r * ATT_TILE + j] * v;
            }
        }
    }
    if (r_own >= row_groups) return;
#pragma unroll
    for (int k = 0; k < SLOTS; k++) {
        const int r = r_own + k * row_groups;
        if (r < R) a.out[(int64_t)(q0 + r / G) * q_dim + (g * G + r % G) * hd + d_own] = acc[k] / l[r];
    }
}

/* The same attention on tensor cores (flash attention): scores and
 * values as mma.sync on bf16 tiles of q, k and v with f32 sums, for heads
 * of 64 and 128 dims. A block takes ATT_ROWS rows as attention_kernel
 * does, a warp 16 of them; keys come ATT_MMA_KEYS at a time, k as rows and
 * v transposed in shared memory (each padded by 8, so that the fragments'
 * 32-bit reads hit 32 banks). A warp's scores stay in the accumulators of
 * the first product, whose layout is that of the second's A operand (rows
 * g and g + 8, columns 2t, 2t + 1 of each 8 keys), so the online softmax
 * and the probabilities never leave registers. PTX fragments as in
 * mma_bf16_m16n8k16 (lane 4 g + t). Operands rounded to bf16, as the
 * prefill's other products (within ~1e-2 of the float64 reference). */
#define ATT_MMA_KEYS    64
#define ATT_MMA_THREADS 128 /* 4 warps x 16 rows = ATT_ROWS */

static size_t attention_mma_smem(int hd) {
    return sizeof(uint16_t) * ((size_t)ATT_MMA_KEYS * (hd + 8) + (size_t)hd * (ATT_MMA_KEYS + 8));
}

/* Keys k0.. (up to `last`, zeros after) of KV head g into ks (rows) and vt
 * (transposed), rounded to bf16. */
template <int HD>
static __device__ void stage_keys_bf16(const prefill_attn &a, int g, int k0, int last, uint16_t *ks, uint16_t *vt) {
    const int kv_dim = a.n_kv * HD;
    for (int i = threadIdx.x; i < ATT_MMA_KEYS * HD / 4; i += ATT_MMA_THREADS) {
        const int j = i / (HD / 4), d = (i - j * (HD / 4)) * 4, key = k0 + j;
        float4 k = {0.0f, 0.0f, 0.0f, 0.0f}, v = k;
        if (key < last) {
            const int64_t at = (int64_t)key * kv_dim + g * HD + d;
            k = cache_get4(a.k_cache, at, a.kv_f16), v = cache_get4(a.v_cache, at, a.kv_f16);
        }
        const uint2 kb = {bf16_pair(k.x, k.y), bf16_pair(k.z, k.w)};
        *(uint2 *)(ks + j * (HD + 8) + d) = kb;
        const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int c = 0; c < 4; c++) vt[(d + c) * (ATT_MMA_KEYS + 8) + j] = f32_to_bf16_bits(vv[c]);
    }
}

/* A warp's 16 query rows of head group g as A fragments: 16 rows x HD,
 * HD / 16 slices of 16 dims (zeros for rows past R). */
template <int HD>
static __device__ __forceinline__ void load_query_fragments(const prefill_attn &a, int g, int q0, int R,
                                                            const int row[2], unsigned qa[HD / 16][4]) {
    const int G = a.n_heads / a.n_kv, t = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 lo = make_float2(0, 0), hi = lo;
            if (row[h] < R) {
                const float *q = a.qkv + (int64_t)(q0 + row[h] / G) * a.qkv_stride + (g * G + row[h] % G) * HD + 16 * kk + 2 * t;
                lo = *(const float2 *)q, hi = *(const float2 *)(q + 8);
            }
            qa[kk][h] = bf16_pair(lo.x, lo.y), qa[kk][2 + h] = bf16_pair(hi.x, hi.y);
        }
}

/* The scores of the warp's rows against the staged keys: 8 keys a fragment. */
template <int HD>
static __device__ __forceinline__ void tile_scores(const uint16_t *ks, const unsigned qa[HD / 16][4],
                                                   float sc[ATT_MMA_KEYS / 8][4]) {
    const int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < ATT_MMA_KEYS / 8; n++) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        const uint16_t *kr = ks + (n * 8 + gq) * (HD + 8) + 2 * t;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const unsigned b[2] = {*(const unsigned *)(kr + 16 * kk), *(const unsigned *)(kr + 16 * kk + 8)};
            mma_bf16_m16n8k16(sc[n], qa[kk], b);
        }
    }
}

/* The online softmax over a tile of keys from k0, in place: each of the
 * lane's two rows (h: sc[n][2h], sc[n][2h + 1]) masked past what it sees,
 * scaled, exponentiated against the new running max; corr: what the
 * output so far is to be multiplied by. */
static __device__ __forceinline__ void softmax_tile(float sc[ATT_MMA_KEYS / 8][4], int k0, const int seen[2],
                                                    float scale, float m[2], float l[2], float corr[2]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = m[h];
#pragma unroll
        for (int n = 0; n < ATT_MMA_KEYS / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int key = k0 + n * 8 + 2 * t + c;
                float &v = sc[n][2 * h + c];
                v = key <= seen[h] ? v * scale : -INFINITY;
                mx = fmaxf(mx, v);
            }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2)); /* finite: key 0 is in every row's first tile */
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < ATT_MMA_KEYS / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float &v = sc[n][2 * h + c];
                v = v == -INFINITY ? 0.0f : expf(v - mx);
                sum += v;
            }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        corr[h] = expf(m[h] - mx); /* 0 on the first tile */
        l[h] = l[h] * corr[h] + sum;
        m[h] = mx;
    }
}

/* The output rescaled by corr, plus the tile's probabilities (the
 * scores' accumulators, as A fragments) times its values. */
template <int HD>
static __device__ __forceinline__ void accumulate_values(const uint16_t *vt, const float sc[ATT_MMA_KEYS / 8][4],
                                                         const float corr[2], float o[HD / 8][4]) {
    const int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];
#pragma unroll
    for (int kk = 0; kk < ATT_MMA_KEYS / 16; kk++) {
        const unsigned pa[4] = {bf16_pair(sc[2 * kk][0], sc[2 * kk][1]), bf16_pair(sc[2 * kk][2], sc[2 * kk][3]),
                                bf16_pair(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                bf16_pair(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            const uint16_t *vr = vt + (n * 8 + gq) * (ATT_MMA_KEYS + 8) + 16 * kk + 2 * t;
            const unsigned b[2] = {*(const unsigned *)vr, *(const unsigned *)(vr + 8)};
            mma_bf16_m16n8k16(o[n], pa, b);
        }
    }
}

template <int HD>
static __global__ void __launch_bounds__(ATT_MMA_THREADS) attention_mma_kernel(const prefill_attn a, int T) {
    DYN_SMEM(uint16_t, ks);
    uint16_t *vt = ks + ATT_MMA_KEYS * (HD + 8);
    const int G = a.n_heads / a.n_kv, g = blockIdx.y, QT = attention_tokens(G), q0 = blockIdx.x * QT;
    const int R = min(QT, T - q0) * G, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, t = lane & 3;
    const int q_dim = a.n_heads * HD, last = a.pos + q0 + R / G; /* keys < last */
    /* this lane's two rows (gq and gq + 8 of the warp's 16) and where they look */
    int row[2], seen[2]; /* seen: keys <= seen are visible; padding rows see key 0 only */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        row[h] = warp * 16 + gq + 8 * h;
        seen[h] = row[h] < R ? a.pos + q0 + row[h] / G : 0;
    }
    unsigned qa[HD / 16][4];
    load_query_fragments<HD>(a, g, q0, R, row, qa);
    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const float scale = 1.0f / sqrtf((float)HD);
    for (int k0 = 0; k0 < last; k0 += ATT_MMA_KEYS) {
        __syncthreads(); /* the tile before is done with */
        stage_keys_bf16<HD>(a, g, k0, last, ks, vt);
        __syncthreads();
        float sc[ATT_MMA_KEYS / 8][4], corr[2];
        tile_scores<HD>(ks, qa, sc);
        softmax_tile(sc, k0, seen, scale, m, l, corr);
        accumulate_values<HD>(vt, sc, corr, o);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (row[h] >= R) continue;
        float *out = a.out + (int64_t)(q0 + row[h] / G) * q_dim + (g * G + row[h] % G) * HD + 2 * t;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) *(float2 *)(out + 8 * n) = make_float2(o[n][2 * h] / l[h], o[n][2 * h + 1] / l[h]);
    }
}

/* The attention on tensor cores where the heads are 64 or 128 wide, unless
 * MOE_CUDA_ATTN_MMA=0 (read at every launch, so a test can compare both). */
static bool attention_on_mma(int hd) {
    const char *v = getenv("MOE_CUDA_ATTN_MMA");
    return !(v && strcmp(v, "0") == 0) && (hd == 64 || hd == 128);
}

/* Both launches: the chunk's keys and values into the cache, then attention. */
static void launch_attention(const prefill_attn *a, int T, cudaStream_t st) {
    LAUNCH(qk_prepare_kernel, T, ROW_THREADS, 0, st, *a);
    const int QT = attention_tokens(a->n_heads / a->n_kv);
    const size_t smem = attention_smem(a->hd);
    const dim3 grid((T + QT - 1) / QT, a->n_kv);
    if (attention_on_mma(a->hd)) {
        if (a->hd == 64) LAUNCH(attention_mma_kernel<64>, grid, ATT_MMA_THREADS, attention_mma_smem(64), st, *a, T);
        else LAUNCH(attention_mma_kernel<128>, grid, ATT_MMA_THREADS, attention_mma_smem(128), st, *a, T);
        return;
    }
    /* a failure to allow the shared memory fails the launch */
    if (a->hd <= 128) {
        (void)cudaFuncSetAttribute(attention_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        LAUNCH(attention_kernel<32>, grid, ATT_THREADS, smem, st, *a, T);
    } else {
        (void)cudaFuncSetAttribute(attention_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        LAUNCH(attention_kernel<64>, grid, ATT_THREADS, smem, st, *a, T);
    }
}

/* ---------------------------------------------------------------- scratch */

/* The arguments of the experts' products as cublasGemmGroupedBatchedEx
 * calls, one a batch and product (gate|up, down): a group per used expert,
 * since each has its own token count (n). m, k and the leading dimensions
 * are the same in every group, but cuBLAS takes them as arrays too. The
 * grouped call has no bf16 x bf16 -> f32 form, so the products come out in
 * bf16 (as their inputs already are). */
#if CUBLAS_VERSION >= 120500
#define GROUPED_GEMM 1
#else
#define GROUPED_GEMM 0
#endif
enum { GU, DN };     /* the two products of an expert */
enum { PA, PB, PC }; /* a product's pointer arrays: weights, inputs, outputs */
struct expert_gemms {
    bool on;                        /* cleared if the library turns the call down */
    int experts;                    /* E: the length of every array */
    void *host_mem;                 /* the host arrays below */
    int *n;                         /* each used expert's rows */
    int *embd, *ff, *ff2, *ones;    /* n_embd, ff, 2 ff and group sizes, E times */
    float *alpha, *beta;            /* 1 and 0 */
    cublasOperation_t *op_t, *op_n; /* transposed weights, plain inputs */
    const void **ptr_host, **ptr;   /* pinned and device: [product][array][used expert] */
};

struct prefill_scratch {
    cublasHandle_t blas;
    int cap;           /* tokens per chunk */
    int k;             /* routed slots per token (1: dense) */
    int batch_experts; /* experts dequantized at once */
    int64_t w16_elems;
    uint8_t *mem;
    int *tokens;               /* (n_ctx) the prompt */
    float *x, *xn;             /* (cap, n_embd) residual stream, normalised f32 (router, shared gate) */
    uint16_t *x16;             /* (cap, max(n_embd, q_dim)) bf16 GEMM input */
    float *qkv, *att;          /* (cap, q_dim + 2 kv_dim), (cap, q_dim) */
    float *gu;                 /* (rows, 2 ff) gate | up products */
    uint16_t *h16;             /* (rows, ff) SwiGLU, bf16 */
    uint16_t *w16;             /* dequantized weights */
    uint16_t *xs16;            /* (cap k, n_embd) inputs grouped by expert */
    uint16_t *gu16;            /* gu's memory as (cap k, 2 ff) bf16: the experts' gate | up */
    uint16_t *eo16;            /* (cap k, n_embd) expert outputs, grouped, bf16 */
    float *router_w, *logits;  /* (n_experts, n_embd) f32 router, (cap, n_experts) */
    float *route_w, *shgate;   /* (cap, k), (cap) */
    int *route_ids;            /* (cap, k) */
    int *index;                /* row_token (cap k) | slot_row (cap k) | used experts (n_experts) | token tiles */
    int *n_tiles;              /* the token tiles, where group_kernel listed them */
    int *host;                 /* pinned: route ids (cap k) | the index as uploaded */
    int *count, *start, *fill; /* per expert, host */
    cuda_prefill_profile *prof; /* cuda_prefill_profile_run's, else NULL */
    double phase_start;         /* its clock at the last phase's end */
    int calls;                  /* GEMM calls so far (cuBLAS, expert_gemm) */
    int experts_path;           /* EXPERTS_AUTO, _FUSED, _GROUPED or _EACH: pick_expert_path */
    expert_gemms g;             /* else: as grouped calls on dequantized weights */
};

/* MOE_CUDA_PREFILL=0 runs prompts through the decode step token by token
 * (to check the decode path on its own). */
bool cuda_prefill_batched(const cuda_state *s, int n) {
    const char *v = getenv("MOE_CUDA_PREFILL");
    return n >= cuda_prefill_min_tokens(s->m) && (!v || v[0] != '0');
}

#define BLAS_CHECK(call)                                                                                               \
    do {                                                                                                               \
        cublasStatus_t blas_e_ = (call);                                                                               \
        if (blas_e_ != CUBLAS_STATUS_SUCCESS)                                                                          \
            return moe_error_set(err, MOE_ERR_IO, "cuBLAS error %s at %s:%d in %s", cublasGetStatusName(blas_e_),      \
                                 __FILE__, __LINE__, #call);                                                           \
    } while (0)

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Elements of the bf16 weight scratch: the largest dense matrix group of a
 * layer (q|k|v, a gate|up pair), or a batch of experts' three matrices. */
static int64_t weight_scratch(const model_config *c, int *batch_experts) {
    const int64_t d = c->n_embd, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t most = max64((q + 2 * kv) * d, 2 * (int64_t)(c->n_experts ? c->n_ff_shared : c->n_ff) * d);
    *batch_experts = 0;
    if (c->n_experts) {
        const int64_t per_expert = 3 * (int64_t)c->n_ff_expert * d, fit = PREFILL_EXPERT_BYTES / (2 * per_expert);
        *batch_experts = fit < 1 ? 1 : fit > c->n_experts ? c->n_experts : (int)fit;
        most = max64(most, *batch_experts * per_expert);
    }
    return most;
}

/* `bytes` at a 256-aligned running offset; with base NULL only counted. */
static void *take(uint8_t *base, size_t *used, size_t bytes) {
    const size_t at = (*used + 255) & ~(size_t)255;
    *used = at + bytes;
    return base ? base + at : NULL;
}

/* Token tiles of `rows` routed rows over n_experts at most: the rows in
 * whole tiles, and a part-filled one per expert. */
static int max_tiles(int rows, int n_experts) { return (rows + EG_TOKENS - 1) / EG_TOKENS + n_experts; }

static void lay_out(const cuda_state *s, prefill_scratch *p, uint8_t *base, size_t *used) {
    const model_config *c = &s->m->config;
    const size_t T = p->cap, R = T * p->k, d = c->n_embd, E = c->n_experts, q = s->q_dim, kv = s->kv_dim;
    const size_t gu = c->n_experts ? (size_t)max64(R * 2 * c->n_ff_expert, T * 2 * c->n_ff_shared) : T * 2 * c->n_ff;
    *used = 0;
    p->tokens = (int *)take(base, used, (size_t)s->n_ctx * sizeof(int));
    p->x = (float *)take(base, used, T * d * sizeof(float));
    p->xn = (float *)take(base, used, T * d * sizeof(float));
    p->x16 = (uint16_t *)take(base, used, T * (d > q ? d : q) * sizeof(uint16_t));
    p->qkv = (float *)take(base, used, T * (q + 2 * kv) * sizeof(float));
    p->att = (float *)take(base, used, T * q * sizeof(float));
    p->gu = (float *)take(base, used, gu * sizeof(float));
    p->h16 = (uint16_t *)take(base, used, gu / 2 * sizeof(uint16_t));
    p->w16 = (uint16_t *)take(base, used, (size_t)p->w16_elems * sizeof(uint16_t));
    if (!E) return;
    p->xs16 = (uint16_t *)take(base, used, R * d * sizeof(uint16_t));
    p->gu16 = (uint16_t *)p->gu;
    p->eo16 = (uint16_t *)take(base, used, R * d * sizeof(uint16_t));
    p->router_w = (float *)take(base, used, E * d * sizeof(float));
    p->logits = (float *)take(base, used, T * E * sizeof(float));
    p->route_w = (float *)take(base, used, R * sizeof(float));
    p->shgate = (float *)take(base, used, T * sizeof(float));
    p->route_ids = (int *)take(base, used, R * sizeof(int));
    p->index = (int *)take(base, used, (2 * R + E + 3 * max_tiles((int)R, (int)E)) * sizeof(int));
    p->n_tiles = (int *)take(base, used, sizeof(int));
    p->g.ptr = (const void **)take(base, used, 6 * E * sizeof(void *));
}

static void free_scratch(prefill_scratch *p) {
    if (p->blas) cublasDestroy(p->blas);
    if (p->mem) cudaFree(p->mem);
    if (p->host) cudaFreeHost(p->host);
    if (p->g.ptr_host) cudaFreeHost(p->g.ptr_host);
    free(p->g.host_mem);
    free(p->count);
    free(p);
}

void cuda_prefill_free(cuda_state *s) {
    if (s->prefill) free_scratch(s->prefill);
    s->prefill = NULL;
}

/* The grouped calls' host arrays that stay the same: false if out of
 * memory. */
static bool set_up_expert_gemms(expert_gemms *g, const model_config *c) {
    const int E = c->n_experts;
    g->host_mem = calloc(E, 5 * sizeof(int) + 2 * sizeof(float) + 2 * sizeof(cublasOperation_t));
    if (!g->host_mem) return false;
    g->op_t = (cublasOperation_t *)g->host_mem, g->op_n = g->op_t + E;
    g->alpha = (float *)(g->op_n + E), g->beta = g->alpha + E;
    g->n = (int *)(g->beta + E), g->embd = g->n + E, g->ff = g->embd + E, g->ff2 = g->ff + E, g->ones = g->ff2 + E;
    for (int j = 0; j < E; j++) {
        g->op_t[j] = CUBLAS_OP_T, g->op_n[j] = CUBLAS_OP_N;
        g->alpha[j] = 1.0f, g->beta[j] = 0.0f;
        g->embd[j] = c->n_embd, g->ff[j] = c->n_ff_expert, g->ff2[j] = 2 * c->n_ff_expert, g->ones[j] = 1;
    }
    g->experts = E;
    return true;
}

/* MOE_CUDA_EXPERTS picks how the experts' products run: "fused" (from
 * the quantized weights, expert_gemm.cuh), "grouped" (dequantized, a
 * grouped cuBLAS call a batch of experts) or "each" (dequantized, a call
 * per expert, as a library without the grouped call does); by default
 * each chunk picks (fused_fits). The tests and `moe bench` compare them. */
enum { EXPERTS_AUTO, EXPERTS_FUSED, EXPERTS_GROUPED, EXPERTS_EACH };
static void pick_expert_path(prefill_scratch *p) {
    const char *v = getenv("MOE_CUDA_EXPERTS");
    p->experts_path = !v                          ? EXPERTS_AUTO
                      : strcmp(v, "fused") == 0   ? EXPERTS_FUSED
                      : strcmp(v, "grouped") == 0 ? EXPERTS_GROUPED
                      : strcmp(v, "each") == 0    ? EXPERTS_EACH
                                                  : EXPERTS_AUTO;
    p->g.on = GROUPED_GEMM && p->experts_path != EXPERTS_EACH;
}

/* Tokens a pass through the layers takes (p->cap) and the scratch's bytes
 * for it. Each pass dequantizes every expert its tokens chose anew, half
 * of a 512-token pass of Qwen3-30B-A3B (bench/decode-plan.md, fact 56), so
 * a pass is as long as the context allows up to PREFILL_CHUNK_MAX, while
 * its scratch stays within PREFILL_SCRATCH_PART of the weights (at least
 * PREFILL_CHUNK tokens whatever it takes). MOE_CUDA_PREFILL_CHUNK=N caps
 * it lower: the tests' way to run one prompt in several passes. */
static size_t pass_tokens(cuda_state *s, prefill_scratch *p) {
    const char *v = getenv("MOE_CUDA_PREFILL_CHUNK");
    const int most = v && atoi(v) >= PREFILL_MIN_TOKENS ? atoi(v) : PREFILL_CHUNK_MAX;
    const double budget = PREFILL_SCRATCH_PART * (double)cuda_model_bytes(s->g);
    size_t bytes = 0;
    for (int cap = PREFILL_CHUNK_MAX; cap >= PREFILL_MIN_TOKENS; cap /= 2) {
        p->cap = s->n_ctx < cap ? s->n_ctx : cap;
        if (p->cap > most) continue;
        lay_out(s, p, NULL, &bytes);
        if ((double)bytes <= budget || p->cap <= PREFILL_CHUNK) break;
    }
    return bytes;
}

static moe_status make_scratch(cuda_state *s, moe_error *err) {
    const model_config *c = &s->m->config;
    prefill_scratch *p = (prefill_scratch *)calloc(1, sizeof *p);
    if (!p) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    p->k = c->n_experts ? c->n_experts_used : 1;
    p->w16_elems = weight_scratch(c, &p->batch_experts);
    size_t bytes = pass_tokens(s, p);
    const size_t R = (size_t)p->cap * p->k, E = c->n_experts;
    cudaError_t e = cudaMalloc(&p->mem, bytes);
    if (e == cudaSuccess && E) e = cudaMallocHost(&p->host, (3 * R + E + 3 * max_tiles((int)R, (int)E)) * sizeof(int));
    if (e == cudaSuccess && E) e = cudaMallocHost((void **)&p->g.ptr_host, 6 * E * sizeof(void *));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free_scratch(p);
        return moe_error_set(err, e == cudaErrorMemoryAllocation ? MOE_ERR_NOMEM : MOE_ERR_IO,
                             "the batched prefill needs %.2f GB of GPU memory for its scratch: %s", bytes / 1e9,
                             cudaGetErrorName(e));
    }
    p->count = (int *)calloc(3 * E + 1, sizeof(int));
    if (!p->count) {
        free_scratch(p);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    p->start = p->count + E, p->fill = p->start + E;
    if (E && !set_up_expert_gemms(&p->g, c)) {
        free_scratch(p);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    pick_expert_path(p);
    cublasStatus_t b = cublasCreate(&p->blas);
    if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetStream(p->blas, s->stream);
    if (b != CUBLAS_STATUS_SUCCESS) {
        free_scratch(p);
        return moe_error_set(err, MOE_ERR_IO, "cannot set up cuBLAS: %s", cublasGetStatusName(b));
    }
    lay_out(s, p, p->mem, &bytes);
    s->prefill = p;
    return MOE_OK;
}

/* ---------------------------------------------------------------- products */

/* Y = W X^T (+ Y): W m x k bf16 rows, X n rows of k bf16, Y n rows of ldy
 * values of y_type, f32 or bf16 (the first m written). Column-major, as
 * cuBLAS sees it: Y^T (m x n) = W (the k x m matrix W^T, transposed) times
 * X^T (k x n). */
static cublasStatus_t gemm_bf16_as(prefill_scratch *p, const uint16_t *w, int m, int k, const uint16_t *x, int n,
                                   void *y, cudaDataType_t y_type, int ldy, bool accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    p->calls++;
    return cublasGemmEx(p->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta,
                        y, y_type, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static cublasStatus_t gemm_bf16(prefill_scratch *p, const uint16_t *w, int m, int k, const uint16_t *x, int n,
                                float *y, int ldy, bool accumulate) {
    return gemm_bf16_as(p, w, m, k, x, n, y, CUDA_R_32F, ldy, accumulate);
}

/* The same in f32 throughout (the handle keeps the default math mode: no
 * TF32): the router, whose top-k must see what the CPU's f32 product sees. */
static cublasStatus_t gemm_f32(prefill_scratch *p, const float *w, int m, int k, const float *x, int n, float *y) {
    const float one = 1.0f, zero = 0.0f;
    p->calls++;
    return cublasGemmEx(p->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_32F, k, x, CUDA_R_32F, k, &zero, y,
                        CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static void dequant(const cuda_state *s, const dmat *m, const int *experts, int n, void *out, int64_t out_stride,
                    bool bf16) {
    cuda_format_of(m->type)->dequant(m, experts, n, out, out_stride, bf16, s->stream);
}

/* With a profile on (cuda_prefill_profile_run): the phase just submitted,
 * waited for and timed from the end of the one before. */
static moe_status phase_done(cuda_state *s, int phase, moe_error *err) {
    prefill_scratch *p = s->prefill;
    if (!p->prof) return MOE_OK;
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    const double now = monotonic_seconds();
    p->prof->ms[phase] += (now - p->phase_start) * 1e3;
    p->prof->calls[phase] += p->calls;
    p->phase_start = now;
    p->calls = 0;
    return MOE_OK;
}
#define PHASE_DONE(s, phase)                                                                                           \
    do {                                                                                                               \
        const moe_status phase_st_ = phase_done(s, phase, err);                                                        \
        if (phase_st_ != MOE_OK) return phase_st_;                                                                     \
    } while (0)

/* ---------------------------------------------------------------- a layer */

static moe_status attention_layer(cuda_state *s, int l, int T, int pos, moe_error *err) {
    prefill_scratch *p = s->prefill;
    const model_config *c = &s->m->config;
    const cuda_layer *w = &s->g->layers[l];
    const int d = c->n_embd, q = s->q_dim, kv = s->kv_dim;
    LAUNCH(norm_kernel, T, ROW_THREADS, 0, s->stream, p->x, w->attn_norm, c->rms_eps, d, (float *)NULL, p->x16);
    dequant(s, &w->wq, NULL, 1, p->w16, 0, true);
    dequant(s, &w->wk, NULL, 1, p->w16 + (int64_t)q * d, 0, true);
    dequant(s, &w->wv, NULL, 1, p->w16 + (int64_t)(q + kv) * d, 0, true);
    BLAS_CHECK(gemm_bf16(p, p->w16, q + 2 * kv, d, p->x16, T, p->qkv, q + 2 * kv, false));
    PHASE_DONE(s, CUDA_PF_QKV);
    prefill_attn a;
    memset(&a, 0, sizeof a);
    a.qkv = p->qkv;
    a.qkv_stride = q + 2 * kv;
    a.bq = w->bq, a.bk = w->bk, a.bv = w->bv;
    a.q_norm = w->q_norm, a.k_norm = w->k_norm;
    a.qk_norm = c->arch->qk_norm;
    a.eps = c->rms_eps;
    a.rope = s->rope;
    a.n_rot = c->n_rot, a.neox = c->arch->rope == ROPE_NEOX;
    a.k_cache = cuda_layer_cache(s, s->k_cache, l);
    a.v_cache = cuda_layer_cache(s, s->v_cache, l);
    a.kv_f16 = s->opt.kv_f16;
    a.out = p->att;
    a.pos = pos, a.n_heads = c->n_heads, a.n_kv = c->n_kv_heads, a.hd = c->head_dim;
    launch_attention(&a, T, s->stream);
    PHASE_DONE(s, CUDA_PF_ATTENTION);
    LAUNCH(norm_kernel, T, ROW_THREADS, 0, s->stream, p->att, (const float *)NULL, 0.0f, q, (float *)NULL, p->x16);
    dequant(s, &w->wo, NULL, 1, p->w16, 0, true);
    BLAS_CHECK(gemm_bf16(p, p->w16, d, q, p->x16, T, p->x, d, true));
    PHASE_DONE(s, CUDA_PF_O);
    return MOE_OK;
}

/* x += down(silu(gate xn) * (up xn)) for the chunk's tokens, each scaled
 * by sigmoid(xn . gate_inp) when gate_inp is given (the shared expert). */
static moe_status swiglu_ffn(cuda_state *s, const dmat *gate, const dmat *up, const dmat *down, const float *gate_inp,
                             int T, moe_error *err) {
    prefill_scratch *p = s->prefill;
    const int d = s->m->config.n_embd, ff = gate->rows;
    dequant(s, gate, NULL, 1, p->w16, 0, true);
    dequant(s, up, NULL, 1, p->w16 + (int64_t)ff * d, 0, true);
    BLAS_CHECK(gemm_bf16(p, p->w16, 2 * ff, d, p->x16, T, p->gu, 2 * ff, false));
    if (gate_inp) LAUNCH(shared_gate_kernel, T, 32, 0, s->stream, p->shgate, p->xn, gate_inp, d);
    LAUNCH(swiglu_kernel<float>, T, ROW_THREADS, 0, s->stream, p->h16, (const float *)p->gu, ff,
           gate_inp ? (const float *)p->shgate : NULL);
    dequant(s, down, NULL, 1, p->w16, 0, true);
    BLAS_CHECK(gemm_bf16(p, p->w16, d, ff, p->h16, T, p->x, d, true));
    PHASE_DONE(s, CUDA_PF_DENSE_FFN);
    return MOE_OK;
}

/* Counting sort of the chunk's (token, slot) pairs by expert, stable: the
 * rows of expert e are start[e] .. start[e] + count[e] - 1, in token
 * order. Fills the index to upload (row -> token, pair -> row, the experts
 * used in ascending id) and returns how many experts are used. */
static int group_by_expert(prefill_scratch *p, int T, int n_experts) {
    const int k = p->k, R = T * k, cap_rows = p->cap * k;
    const int *ids = p->host;
    int *row_token = p->host + cap_rows, *slot_row = row_token + cap_rows, *used = slot_row + cap_rows;
    memset(p->count, 0, (size_t)n_experts * sizeof(int));
    for (int i = 0; i < R; i++)
        p->count[ids[i]]++;
    int n_used = 0;
    for (int e = 0, at = 0; e < n_experts; at += p->count[e++]) {
        p->start[e] = p->fill[e] = at;
        if (p->count[e]) used[n_used++] = e;
    }
    for (int i = 0; i < R; i++) {
        const int r = p->fill[ids[i]]++;
        row_token[r] = i / k;
        slot_row[i] = r;
    }
    return n_used;
}

/* The grouped calls' rows and pointers for the chunk's n_used experts,
 * uploaded: expert j's weights sit in slot j % batch_experts of the
 * weight scratch (expert_batch), its rows from start[used[j]] on. */
static moe_status point_expert_gemms(cuda_state *s, const cuda_layer *w, int n_used, moe_error *err) {
    prefill_scratch *p = s->prefill;
    expert_gemms *g = &p->g;
    const int64_t d = s->m->config.n_embd, ff = w->exp_gate.rows, E = g->experts;
    const int *used = p->host + 3 * p->cap * p->k;
    const uint16_t *gate_up = p->w16, *down = p->w16 + (int64_t)p->batch_experts * 2 * ff * d;
    const void **at[2][3];
    for (int prod = 0; prod < 2; prod++)
        for (int arr = 0; arr < 3; arr++)
            at[prod][arr] = g->ptr_host + (prod * 3 + arr) * E;
    for (int j = 0; j < n_used; j++) {
        const int64_t slot = j % p->batch_experts, r0 = p->start[used[j]];
        g->n[j] = p->count[used[j]];
        at[GU][PA][j] = gate_up + slot * 2 * ff * d;
        at[GU][PB][j] = p->xs16 + r0 * d;
        at[GU][PC][j] = p->gu16 + r0 * 2 * ff;
        at[DN][PA][j] = down + slot * ff * d;
        at[DN][PB][j] = p->h16 + r0 * ff;
        at[DN][PC][j] = p->eo16 + r0 * d;
    }
    CUDA_CHECK(cudaMemcpyAsync(g->ptr, g->ptr_host, 6 * E * sizeof(void *), cudaMemcpyHostToDevice, s->stream));
    return MOE_OK;
}

/* One product of experts used[b0 .. b0+nb) as one grouped call.
 * CUBLAS_STATUS_NOT_SUPPORTED (a library without the call) turns the
 * grouped calls off. */
static cublasStatus_t grouped_product(prefill_scratch *p, int prod, int b0, int nb) {
    expert_gemms *g = &p->g;
    if (!g->on) return CUBLAS_STATUS_NOT_SUPPORTED;
#if GROUPED_GEMM
    const int E = g->experts, *m = prod == GU ? g->ff2 : g->embd, *k = prod == GU ? g->embd : g->ff;
    const void *const *ptr = g->ptr + prod * 3 * E + b0;
    p->calls++;
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        p->blas, g->op_t, g->op_n, m, g->n + b0, k, g->alpha, ptr + PA * E, CUDA_R_16BF, k, ptr + PB * E, CUDA_R_16BF,
        k, g->beta, (void *const *)(ptr + PC * E), CUDA_R_16BF, m, nb, g->ones, CUBLAS_COMPUTE_32F);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) g->on = false;
    return st;
#else
    (void)prod, (void)b0, (void)nb;
    return CUBLAS_STATUS_NOT_SUPPORTED;
#endif
}

/* One product (gate|up or down) of experts used[b0 .. b0+nb): grouped,
 * or a call per expert where the library has no grouped call. */
static moe_status experts_product(prefill_scratch *p, int prod, int b0, int nb, moe_error *err) {
    const cublasStatus_t st = grouped_product(p, prod, b0, nb);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
        BLAS_CHECK(st);
        return MOE_OK;
    }
    const expert_gemms *g = &p->g;
    const int E = g->experts, m = prod == GU ? g->ff2[0] : g->embd[0], k = prod == GU ? g->embd[0] : g->ff[0];
    const void *const *ptr = g->ptr_host + prod * 3 * E;
    for (int j = b0; j < b0 + nb; j++)
        BLAS_CHECK(gemm_bf16_as(p, (const uint16_t *)ptr[PA * E + j], m, k, (const uint16_t *)ptr[PB * E + j], g->n[j],
                                (void *)ptr[PC * E + j], CUDA_R_16BF, m, false));
    return MOE_OK;
}

/* Experts used[b0 .. b0+nb) of the chunk: their weights dequantized
 * together, then gate|up, SwiGLU and down over each one's rows. */
static moe_status expert_batch(cuda_state *s, const cuda_layer *w, int b0, int nb, moe_error *err) {
    prefill_scratch *p = s->prefill;
    const int d = s->m->config.n_embd, ff = w->exp_gate.rows, cap_rows = p->cap * p->k;
    const int *used = p->host + 3 * cap_rows + b0, *used_dev = p->index + 2 * cap_rows + b0;
    uint16_t *gate_up = p->w16, *down = p->w16 + (int64_t)p->batch_experts * 2 * ff * d;
    dequant(s, &w->exp_gate, used_dev, nb, gate_up, (int64_t)2 * ff * d, true);
    dequant(s, &w->exp_up, used_dev, nb, gate_up + (int64_t)ff * d, (int64_t)2 * ff * d, true);
    dequant(s, &w->exp_down, used_dev, nb, down, (int64_t)ff * d, true);
    PHASE_DONE(s, CUDA_PF_EXPERT_DEQUANT);
    moe_status st = experts_product(p, GU, b0, nb, err);
    if (st != MOE_OK) return st;
    const int first = p->start[used[0]], end = p->start[used[nb - 1]] + p->count[used[nb - 1]];
    LAUNCH(swiglu_kernel<uint16_t>, end - first, ROW_THREADS, 0, s->stream, p->h16 + (int64_t)first * ff,
           (const uint16_t *)p->gu16 + (int64_t)first * 2 * ff, ff, (const float *)NULL);
    PHASE_DONE(s, CUDA_PF_EXPERT_UP);
    if ((st = experts_product(p, DN, b0, nb, err)) != MOE_OK) return st;
    PHASE_DONE(s, CUDA_PF_EXPERT_DOWN);
    return MOE_OK;
}

/* Whether the fused products take this layer's experts (R rows over
 * n_used experts): gate and up of one format, every matrix's columns in
 * whole steps of the kernel, and by default, unless every matrix's
 * products come from its codes, at most FUSED_ROWS_AN_EXPERT tokens an
 * expert on average. The generic fused kernel dequantizes an expert's
 * weights again for each EG_TOKENS of its tokens, the other paths
 * dequantize once a chunk and use cuBLAS's tuned GEMMs. On Qwen3-30B-A3B
 * Q4_K (bench/results/2026-12-03-s19, runs 3 and 4): pp512 (32 an expert)
 * 6141 tok/s fused against 5622 grouped; pp1024 (64) 6011 against 7100
 * and pp2048 5118 against 6263. From the codes (bench/results/2026-12-05-s24,
 * H100): pp1024 20331 fused against 11304 grouped, pp2048 20534 against
 * 15007. */
#define FUSED_ROWS_AN_EXPERT 32
static bool fused_can(const cuda_layer *w) {
    const cuda_format *fu = cuda_format_of(w->exp_gate.type), *fd = cuda_format_of(w->exp_down.type);
    return w->exp_up.type == w->exp_gate.type && expert_gemm_step(w->exp_gate.cols, fu->block) &&
           expert_gemm_step(w->exp_down.cols, fd->block);
}

/* Whether the fused products take the layer's experts whatever the
 * routing: then the device groups the rows (group_kernel) and the host
 * waits for nothing. */
static bool fused_whatever(const prefill_scratch *p, const cuda_layer *w) {
    const bool any_length = cuda_format_of(w->exp_gate.type)->expert_codes() && cuda_format_of(w->exp_down.type)->expert_codes();
    return fused_can(w) && (p->experts_path == EXPERTS_FUSED || (p->experts_path == EXPERTS_AUTO && any_length));
}

/* Otherwise (the host grouped the rows): whether they take this routing. */
static bool fused_fits(const prefill_scratch *p, const cuda_layer *w, int R, int n_used) {
    return fused_can(w) && p->experts_path == EXPERTS_AUTO && R <= FUSED_ROWS_AN_EXPERT * n_used;
}

/* The token tiles of the fused products after the index in p->host:
 * (expert, first row, rows) for every EG_TOKENS rows of each used expert.
 * Returns how many. */
static int list_tiles(prefill_scratch *p, int n_used) {
    const int cap_rows = p->cap * p->k, *used = p->host + 3 * cap_rows;
    int *tiles = (int *)used + p->g.experts, n = 0;
    for (int j = 0; j < n_used; j++) n = list_expert_tiles(tiles, n, used[j], p->start[used[j]], p->count[used[j]]);
    return n;
}

/* The experts' products over the R grouped rows in two launches of
 * expert_gemm.cuh: gate|up (f32) into gu, then down (bf16) into eo16,
 * SwiGLU between them; n_tiles token tiles, or at most that many where
 * the device counted them (on_device). */
static moe_status fused_experts(cuda_state *s, const cuda_layer *w, int R, int n_tiles, bool on_device,
                                moe_error *err) {
    prefill_scratch *p = s->prefill;
    const int d = s->m->config.n_embd, ff = w->exp_gate.rows;
    expert_gemm_args a;
    memset(&a, 0, sizeof a);
    a.w[0] = w->exp_gate, a.w[1] = w->exp_up, a.pair = 2;
    a.tiles = p->index + 2 * p->cap * p->k + p->g.experts;
    a.n_tiles = on_device ? p->n_tiles : NULL;
    a.x = p->xs16, a.ldx = d;
    a.swiglu = cuda_format_of(w->exp_gate.type)->expert_codes(); /* SwiGLU in the products' kernel */
    if (a.swiglu) a.y = p->h16, a.ldy = ff, a.y_bf16 = true;
    else a.y = p->gu, a.ldy = 2 * ff, a.y_bf16 = false;
    (void)cuda_format_of(w->exp_gate.type)->expert_gemm(&a, n_tiles, s->stream); /* fused_fits said it fits */
    p->calls++;
    if (!a.swiglu)
        LAUNCH(swiglu_kernel<float>, R, ROW_THREADS, 0, s->stream, p->h16, (const float *)p->gu, ff, (const float *)NULL);
    PHASE_DONE(s, CUDA_PF_EXPERT_UP);
    a.w[0] = w->exp_down, a.pair = 1, a.swiglu = false;
    a.x = p->h16, a.ldx = ff;
    a.y = p->eo16, a.ldy = d, a.y_bf16 = true;
    (void)cuda_format_of(w->exp_down.type)->expert_gemm(&a, n_tiles, s->stream);
    p->calls++;
    PHASE_DONE(s, CUDA_PF_EXPERT_DOWN);
    return MOE_OK;
}

static moe_status moe_ffn(cuda_state *s, const cuda_layer *w, int T, moe_error *err) {
    prefill_scratch *p = s->prefill;
    const model_config *c = &s->m->config;
    const int d = c->n_embd, E = c->n_experts, k = p->k, cap_rows = p->cap * k;
    dequant(s, &w->router, NULL, 1, p->router_w, 0, false);
    BLAS_CHECK(gemm_f32(p, p->router_w, E, d, p->xn, T, p->logits));
    const route_spec r = {NULL, E, k, c->gating == GATING_SIGMOID, c->norm_topk, c->expert_weights_scale};
    cuda_route(&r, p->logits, T, p->route_w, p->route_ids, s->stream, false);
    const bool on_device = fused_whatever(p, w);
    int n_used = 0, n_tiles;
    moe_status st = MOE_OK;
    if (on_device) {
        const int R = T * k;
        LAUNCH(group_kernel, 1, 1024, 2 * E * sizeof(int), s->stream, p->index, p->n_tiles, (const int *)p->route_ids, R,
               k, E, cap_rows);
        n_tiles = max_tiles(R, E); /* the most there can be */
    } else {
        CUDA_CHECK(cudaMemcpyAsync(p->host, p->route_ids, (size_t)T * k * sizeof(int), cudaMemcpyDeviceToHost, s->stream));
        CUDA_CHECK(cudaStreamSynchronize(s->stream));
        n_used = group_by_expert(p, T, E), n_tiles = fused_fits(p, w, T * k, n_used) ? list_tiles(p, n_used) : 0;
        CUDA_CHECK(cudaMemcpyAsync(p->index, p->host + cap_rows, (size_t)(2 * cap_rows + E + 3 * n_tiles) * sizeof(int),
                                   cudaMemcpyHostToDevice, s->stream));
        if (!n_tiles && (st = point_expert_gemms(s, w, n_used, err)) != MOE_OK) return st;
    }
    LAUNCH(gather_rows_kernel, T * k, 64, 0, s->stream, p->xs16, (const uint16_t *)p->x16, (const int *)p->index, d);
    PHASE_DONE(s, CUDA_PF_ROUTE);
    if (n_tiles && (st = fused_experts(s, w, T * k, n_tiles, on_device, err)) != MOE_OK) return st;
    for (int b0 = 0; !n_tiles && b0 < n_used; b0 += p->batch_experts) {
        const int nb = n_used - b0 < p->batch_experts ? n_used - b0 : p->batch_experts;
        if ((st = expert_batch(s, w, b0, nb, err)) != MOE_OK) return st;
    }
    LAUNCH(scatter_kernel, T, ROW_THREADS, 0, s->stream, p->x, (const uint16_t *)p->eo16, (const float *)p->route_w,
           (const int *)p->index + cap_rows, k, d);
    PHASE_DONE(s, CUDA_PF_COMBINE);
    if (!w->has_shared) return MOE_OK;
    return swiglu_ffn(s, &w->sh_gate, &w->sh_up, &w->sh_down, w->sh_gate_inp, T, err);
}

static moe_status ffn_layer(cuda_state *s, int l, int T, moe_error *err) {
    prefill_scratch *p = s->prefill;
    const model_config *c = &s->m->config;
    const cuda_layer *w = &s->g->layers[l];
    LAUNCH(norm_kernel, T, ROW_THREADS, 0, s->stream, p->x, w->ffn_norm, c->rms_eps, c->n_embd, p->xn, p->x16);
    if (c->n_experts) return moe_ffn(s, w, T, err);
    return swiglu_ffn(s, &w->ffn_gate, &w->ffn_up, &w->ffn_down, NULL, T, err);
}

/* ---------------------------------------------------------------- a chunk */

/* Logits of the chunk's last n_out positions to out (host; NULL: only
 * the last stays on the device), one decode gemv each (norm fused,
 * activations quantized as the CPU does). */
static moe_status head(cuda_state *s, int T, int n_out, float *out, moe_error *err) {
    const model_config *c = &s->m->config;
    const dmat *w = &s->g->output;
    const cuda_format *f = cuda_format_of(w->type);
    gemv_args a;
    memset(&a, 0, sizeof a);
    a.seg[0].w = *w;
    a.seg[0].out = s->logits;
    a.n_seg = 1;
    a.seg_end[0] = w->rows;
    a.lanes = pick_lanes(w->units, f->n);
    a.epilogue = EPI_NONE;
    const size_t smem = gemv_smem(f->act, c->n_embd);
    const int grid = gemv_grid(s->g->n_sm, f->occupancy(0, smem), w->rows, a.lanes, s->max_grid);
    for (int i = 0; i < n_out; i++) {
        a.in = act_in{s->prefill->x + (size_t)(T - n_out + i) * c->n_embd, s->g->output_norm, c->rms_eps, c->n_embd};
        f->gemv(&a, grid, smem, s->stream, false);
        if (out)
            CUDA_CHECK(cudaMemcpyAsync(out + (size_t)i * c->n_vocab, s->logits, (size_t)c->n_vocab * sizeof(float),
                                       cudaMemcpyDeviceToHost, s->stream));
    }
    return MOE_OK;
}

/* Tokens done..done+T-1 of the prompt at positions pos..; the logits of
 * its last n_out positions to out. */
static moe_status run_chunk(cuda_state *s, int done, int T, int pos, float *out, int n_out, moe_error *err) {
    const model_config *c = &s->m->config;
    dmat rows = s->g->token_embd; /* the chosen rows as a slab of one-row matrices */
    rows.rows = 1;
    rows.expert_stride = rows.row_stride;
    rows.meta_expert_stride = rows.meta_row_stride;
    dequant(s, &rows, s->prefill->tokens + done, T, s->prefill->x, c->n_embd, false);
    PHASE_DONE(s, CUDA_PF_EMBED);
    moe_status st = MOE_OK;
    for (int l = 0; l < c->n_layers && st == MOE_OK; l++)
        if ((st = attention_layer(s, l, T, pos, err)) == MOE_OK) st = ffn_layer(s, l, T, err);
    if (st == MOE_OK && n_out) st = head(s, T, n_out, out, err);
    if (st == MOE_OK) PHASE_DONE(s, CUDA_PF_HEAD);
    CUDA_CHECK(cudaGetLastError());
    return st;
}

moe_status cuda_prefill(cuda_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                        moe_error *err) {
    moe_status st = s->prefill ? MOE_OK : make_scratch(s, err);
    if (st != MOE_OK) return st;
    const prefill_scratch *p = s->prefill;
    const size_t vocab = (size_t)s->m->config.n_vocab;
    CUDA_CHECK(cudaMemcpyAsync(p->tokens, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, s->stream));
    for (int done = 0; done < n && st == MOE_OK; done += p->cap) {
        const int T = n - done < p->cap ? n - done : p->cap;
        const bool last = done + T == n;
        float *out = !logits ? NULL : all_logits ? logits + done * vocab : last ? logits : NULL;
        /* the last position's logits always land on the device (cuda_top_logits) */
        st = run_chunk(s, done, T, pos + done, out, out && all_logits ? T : last ? 1 : 0, err);
    }
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    return st;
}

static const char *const phase_names[CUDA_PF_COUNT] = {
    "embedding",    "norm + q|k|v",       "q/k norm, RoPE, cache + attention", "o + residual",
    "ffn norm + router + grouping by expert", "experts dequantized", "experts gate|up + SwiGLU", "experts down",
    "experts combined + residual",            "dense or shared FFN", "head"};

moe_status cuda_prefill_profile_run(cuda_state *s, const int32_t *tokens, int n, cuda_prefill_profile *out,
                                    moe_error *err) {
    if (n > s->n_ctx) return moe_error_set(err, MOE_ERR_RANGE, "%d prompt tokens do not fit in %d", n, s->n_ctx);
    if (!cuda_prefill_batched(s, n))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "%d tokens do not take the batched prefill", n);
    moe_status st = s->prefill ? MOE_OK : make_scratch(s, err);
    if (st != MOE_OK) return st;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < CUDA_PF_COUNT; i++)
        out->names[i] = phase_names[i];
    out->tokens = n;
    prefill_scratch *p = s->prefill;
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    p->prof = out;
    p->calls = 0;
    p->phase_start = monotonic_seconds();
    const double t0 = p->phase_start;
    st = cuda_prefill(s, tokens, n, 0, NULL, false, err);
    out->total_ms = (monotonic_seconds() - t0) * 1e3;
    p->prof = NULL;
    return st;
}


/* ---------------------------------------------------------------- when to batch */

int cuda_prefill_min_tokens(const model *m) {
    const char *v = getenv("MOE_CUDA_PREFILL_MIN"); /* a measurement's override: batch from this many */
    if (v && atoi(v) >= 1) return atoi(v);
    const model_config *c = &m->config;
    const int moe_min = c->n_experts ? c->n_experts / c->n_experts_used : 0; /* see the top */
    return moe_min > PREFILL_MIN_TOKENS ? moe_min : PREFILL_MIN_TOKENS;
}

/* ---------------------------------------------------------------- kernel tests */

typedef struct test_allocs {
    void *p[16];
    int n;
} test_allocs;

static cudaError_t test_alloc(test_allocs *t, void **p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e == cudaSuccess) t->p[t->n++] = *p;
    return e;
}

static void test_free(test_allocs *t) {
    cudaDeviceSynchronize();
    for (int i = 0; i < t->n; i++)
        cudaFree(t->p[i]);
}

/* A device copy of bytes at src, into *out. */
static cudaError_t test_upload_bytes(test_allocs *t, const void *src, size_t bytes, void **out) {
    cudaError_t e = test_alloc(t, out, bytes);
    return e == cudaSuccess ? cudaMemcpy(*out, src, bytes, cudaMemcpyHostToDevice) : e;
}

/* A device copy of n floats at src (NULL stays NULL). */
static cudaError_t test_upload(test_allocs *t, const float *src, size_t n, const float **out) {
    void *p = NULL;
    const cudaError_t e = src ? test_upload_bytes(t, src, n * sizeof(float), &p) : cudaSuccess;
    *out = (const float *)p;
    return e;
}

/* A test's launch (e: its launch error) waited for and its output of
 * bytes at dev copied to out: the first error, cleared. */
static cudaError_t test_download(cudaError_t e, void *out, const void *dev, size_t bytes) {
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(out, dev, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}

/* A slab of n_experts matrices (GGUF rows, contiguous) through the model's
 * upload, repacking included. */
static moe_status test_upload_slab(moe_type type, int n_experts, int rows, int cols, const void *w, test_allocs *t,
                                   dmat *m, moe_error *err) {
    if (n_experts > 256) return moe_error_set(err, MOE_ERR_RANGE, "at most 256 experts in a test");
    const uint8_t *srcs[256];
    const size_t bytes = quant_row_bytes(type, cols) * (size_t)rows;
    for (int e = 0; e < n_experts; e++)
        srcs[e] = (const uint8_t *)w + e * bytes;
    uploader u;
    memset(&u, 0, sizeof u);
    u.err = err;
    u.dry = true;
    if (upload_rows(&u, type, n_experts, srcs, rows, cols, "test", m) != MOE_OK) return u.status;
    void *arena = NULL;
    CUDA_CHECK(test_alloc(t, &arena, u.used));
    u.dry = false;
    u.used = 0;
    u.base = (uint8_t *)arena;
    u.staging_bytes = (size_t)16 << 20;
    u.staging = (uint8_t *)malloc(u.staging_bytes);
    if (!u.staging) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    moe_status st = upload_rows(&u, type, n_experts, srcs, rows, cols, "test", m);
    free(u.staging);
    return st;
}

moe_status cuda_test_dequant(moe_type type, int n_experts, int rows, int cols, const void *w, const int32_t *experts,
                             int n_pick, bool bf16, void *out, moe_error *err) {
    const cuda_format *f = cuda_format_of(type);
    if (!f) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA kernels for type %d", (int)type);
    test_allocs t;
    memset(&t, 0, sizeof t);
    dmat m;
    void *d_out = NULL, *d_ids = NULL;
    const size_t out_bytes = (size_t)n_pick * rows * cols * (bf16 ? 2 : 4);
    moe_status st = test_upload_slab(type, n_experts, rows, cols, w, &t, &m, err);
    if (st == MOE_OK) {
        cudaError_t e = test_alloc(&t, &d_out, out_bytes);
        if (e == cudaSuccess && experts) e = test_upload_bytes(&t, experts, (size_t)n_pick * sizeof(int), &d_ids);
        if (e == cudaSuccess) e = cudaMemset(d_out, 0xff, out_bytes);
        if (e == cudaSuccess) {
            f->dequant(&m, (const int *)d_ids, n_pick, d_out, (int64_t)rows * cols, bf16, 0);
            e = cudaGetLastError();
        }
        if ((e = test_download(e, out, d_out, out_bytes)) != cudaSuccess)
            st = moe_error_set(err, MOE_ERR_IO, "dequant test (%s, %d x %d): %s", f->name, rows, cols,
                               cudaGetErrorName(e));
    }
    test_free(&t);
    return st;
}

moe_status cuda_test_expert_gemm(moe_type type, int n_experts, int rows, int cols, const void *gate, const void *up,
                                 const uint16_t *x, int n_rows, const int *tiles, int n_tiles, int out, void *y,
                                 moe_error *err) {
    const cuda_format *f = cuda_format_of(type);
    if (!f) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA kernels for type %d", (int)type);
    if (!expert_gemm_step(cols, f->block))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no step of the expert GEMM divides %d columns", cols);
    if (out == CUDA_TEST_EG_SWIGLU && !f->expert_codes())
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "%s: SwiGLU in the experts' products needs their codes", f->name);
    test_allocs t;
    memset(&t, 0, sizeof t);
    expert_gemm_args a;
    memset(&a, 0, sizeof a);
    void *d_x = NULL, *d_tiles = NULL, *d_y = NULL;
    const size_t y_bytes = (size_t)n_rows * rows * (out == CUDA_TEST_EG_F32 ? 8 : out == CUDA_TEST_EG_BF16 ? 4 : 2);
    moe_status st = test_upload_slab(type, n_experts, rows, cols, gate, &t, &a.w[0], err);
    if (st == MOE_OK) st = test_upload_slab(type, n_experts, rows, cols, up, &t, &a.w[1], err);
    if (st == MOE_OK) {
        cudaError_t e = test_upload_bytes(&t, x, (size_t)n_rows * cols * sizeof(uint16_t), &d_x);
        if (e == cudaSuccess) e = test_upload_bytes(&t, tiles, (size_t)n_tiles * 3 * sizeof(int), &d_tiles);
        if (e == cudaSuccess) e = test_alloc(&t, &d_y, y_bytes);
        if (e == cudaSuccess) e = cudaMemset(d_y, 0xff, y_bytes);
        if (e == cudaSuccess) {
            a.pair = 2;
            a.tiles = (const int *)d_tiles;
            a.x = (const uint16_t *)d_x, a.ldx = cols;
            a.y = d_y, a.ldy = out == CUDA_TEST_EG_SWIGLU ? rows : 2 * rows;
            a.y_bf16 = out != CUDA_TEST_EG_F32, a.swiglu = out == CUDA_TEST_EG_SWIGLU;
            (void)f->expert_gemm(&a, n_tiles, 0);
            e = cudaGetLastError();
        }
        if ((e = test_download(e, y, d_y, y_bytes)) != cudaSuccess)
            st = moe_error_set(err, MOE_ERR_IO, "expert GEMM test (%s, %d x %d): %s", f->name, rows, cols,
                               cudaGetErrorName(e));
    }
    test_free(&t);
    return st;
}

/* The decode step's RoPE table (cuda_rope_table) for a test's angles. */
static cudaError_t upload_rope_table(test_allocs *t, const cuda_test_attention *c, const float **out) {
    model_config rc;
    memset(&rc, 0, sizeof rc);
    rc.rope_base = c->rope_base, rc.rope_freq_scale = c->freq_scale, rc.n_rot = c->n_rot;
    float *table = (float *)malloc((size_t)c->n_ctx * c->n_rot * sizeof(float));
    if (!table) return cudaErrorMemoryAllocation;
    cuda_rope_table(&rc, c->rope_freqs, c->n_ctx, table);
    cudaError_t e = test_upload(t, table, (size_t)c->n_ctx * c->n_rot, out);
    free(table);
    return e;
}

/* What both attention tests put on the device: q|k|v, the q/k norms, the
 * RoPE table, the cache (filled below pos, poisoned from pos on: written,
 * or never read) and the poisoned output. */
typedef struct attn_test_io {
    const float *qkv, *q_norm, *k_norm, *rope;
    void *k_cache, *v_cache; /* f32, or f16 bits (cuda_test_attention.kv_f16) */
    float *out;
} attn_test_io;

/* n floats of a test's cache at `at` on the device, in the cache's type. */
static cudaError_t cache_upload(void *at, const float *src, size_t n, bool f16) {
    if (!f16) return cudaMemcpy(at, src, n * sizeof(float), cudaMemcpyHostToDevice);
    uint16_t *bits = (uint16_t *)malloc(n * sizeof *bits + 1);
    if (!bits) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < n; i++) bits[i] = block_f32_to_fp16(src[i]);
    cudaError_t e = cudaMemcpy(at, bits, n * sizeof *bits, cudaMemcpyHostToDevice);
    free(bits);
    return e;
}

static cudaError_t cache_download(float *dst, const void *at, size_t n, bool f16) {
    if (!f16) return cudaMemcpy(dst, at, n * sizeof(float), cudaMemcpyDeviceToHost);
    uint16_t *bits = (uint16_t *)malloc(n * sizeof *bits + 1);
    if (!bits) return cudaErrorMemoryAllocation;
    cudaError_t e = cudaMemcpy(bits, at, n * sizeof *bits, cudaMemcpyDeviceToHost);
    for (size_t i = 0; e == cudaSuccess && i < n; i++) dst[i] = block_fp16_to_f32(bits[i]);
    free(bits);
    return e;
}

static cudaError_t upload_attention_io(test_allocs *t, const cuda_test_attention *c, const float *k_cache,
                                       const float *v_cache, attn_test_io *io) {
    const int T = c->n_tokens, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    const size_t elem = c->kv_f16 ? 2 : 4, cache_n = (size_t)c->n_ctx * kv_dim, filled = (size_t)c->pos * kv_dim;
    const size_t qn = c->qk_norm == QK_NORM_FULL ? q_dim : c->head_dim,
                 kn = c->qk_norm == QK_NORM_FULL ? kv_dim : c->head_dim;
    cudaError_t e = test_upload(t, c->qkv, (size_t)T * (q_dim + 2 * kv_dim), &io->qkv);
    if (e == cudaSuccess) e = test_upload(t, c->q_norm, qn, &io->q_norm);
    if (e == cudaSuccess) e = test_upload(t, c->k_norm, kn, &io->k_norm);
    if (e == cudaSuccess) e = upload_rope_table(t, c, &io->rope);
    if (e == cudaSuccess) e = test_alloc(t, &io->k_cache, cache_n * elem);
    if (e == cudaSuccess) e = test_alloc(t, &io->v_cache, cache_n * elem);
    if (e == cudaSuccess) e = test_alloc(t, (void **)&io->out, (size_t)T * q_dim * sizeof(float));
    if (e == cudaSuccess) e = cudaMemset(io->out, 0xff, (size_t)T * q_dim * sizeof(float));
    if (e == cudaSuccess) e = cache_upload(io->k_cache, k_cache, filled, c->kv_f16);
    if (e == cudaSuccess) e = cache_upload(io->v_cache, v_cache, filled, c->kv_f16);
    /* all ones: a NaN in f32 and in f16 */
    if (e == cudaSuccess) e = cudaMemset((uint8_t *)io->k_cache + filled * elem, 0xff, (cache_n - filled) * elem);
    if (e == cudaSuccess) e = cudaMemset((uint8_t *)io->v_cache + filled * elem, 0xff, (cache_n - filled) * elem);
    return e;
}

/* After the launch: the output and the whole cache back to the host. */
static moe_status download_attention_io(cudaError_t e, const cuda_test_attention *c, const attn_test_io *io,
                                        float *k_cache, float *v_cache, float *out, const char *what, moe_error *err) {
    const size_t cache_n = (size_t)c->n_ctx * c->n_kv_heads * c->head_dim;
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemcpy(out, io->out, (size_t)c->n_tokens * c->n_heads * c->head_dim * sizeof(float),
                       cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cache_download(k_cache, io->k_cache, cache_n, c->kv_f16);
    if (e == cudaSuccess) e = cache_download(v_cache, io->v_cache, cache_n, c->kv_f16);
    if (e == cudaSuccess) return MOE_OK;
    (void)cudaGetLastError();
    return moe_error_set(err, MOE_ERR_IO, "%s attention test: %s", what, cudaGetErrorName(e));
}

moe_status cuda_test_prefill_attention(const cuda_test_attention *c, float *k_cache, float *v_cache, float *out,
                                       moe_error *err) {
    const int T = c->n_tokens, q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
    if (c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > ATT_MAX_G || c->head_dim % 2 || c->head_dim > 256 ||
        c->n_rot > c->head_dim || c->pos + T > c->n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE, "attention test: a shape the kernels do not take");
    test_allocs t;
    memset(&t, 0, sizeof t);
    attn_test_io io;
    prefill_attn a;
    memset(&a, 0, sizeof a);
    cudaError_t e = upload_attention_io(&t, c, k_cache, v_cache, &io);
    if (e == cudaSuccess) e = test_upload(&t, c->bq, q_dim, &a.bq);
    if (e == cudaSuccess) e = test_upload(&t, c->bk, kv_dim, &a.bk);
    if (e == cudaSuccess) e = test_upload(&t, c->bv, kv_dim, &a.bv);
    if (e == cudaSuccess) {
        a.qkv = (float *)io.qkv; /* rotated in place: the test's own copy */
        a.qkv_stride = q_dim + 2 * kv_dim;
        a.q_norm = io.q_norm, a.k_norm = io.k_norm, a.rope = io.rope;
        a.k_cache = io.k_cache, a.v_cache = io.v_cache, a.kv_f16 = c->kv_f16, a.out = io.out;
        a.qk_norm = c->qk_norm;
        a.eps = c->eps;
        a.n_rot = c->n_rot, a.neox = c->neox;
        a.pos = c->pos, a.n_heads = c->n_heads, a.n_kv = c->n_kv_heads, a.hd = c->head_dim;
        launch_attention(&a, T, 0);
        e = cudaGetLastError();
    }
    moe_status st = download_attention_io(e, c, &io, k_cache, v_cache, out, "prefill", err);
    test_free(&t);
    return st;
}

moe_status cuda_test_decode_attention(const cuda_test_attention *c, int n_splits, float *k_cache, float *v_cache,
                                      float *out, moe_error *err) {
    if (c->n_tokens != 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->bq || c->bk || c->bv ||
        c->pos >= c->n_ctx || !cuda_attention_supported(c->n_heads / c->n_kv_heads, c->head_dim, c->n_rot, n_splits))
        return moe_error_set(err, MOE_ERR_RANGE, "decode attention test: a shape the kernel does not take");
    const size_t n_parts = (size_t)n_splits * c->n_heads; /* (n_kv, n_splits, G) */
    const int G = c->n_heads / c->n_kv_heads;
    test_allocs t;
    memset(&t, 0, sizeof t);
    attn_test_io io;
    attn_args a;
    memset(&a, 0, sizeof a);
    const int step[2] = {0, c->pos};
    cudaError_t e = cuda_attention_setup(G, c->head_dim);
    if (e == cudaSuccess) e = upload_attention_io(&t, c, k_cache, v_cache, &io);
    if (e == cudaSuccess) e = test_alloc(&t, (void **)&a.part_out, n_parts * c->head_dim * sizeof(float));
    if (e == cudaSuccess) e = test_alloc(&t, (void **)&a.part_ml, n_parts * 2 * sizeof(float));
    if (e == cudaSuccess) e = test_alloc(&t, (void **)&a.counters, (size_t)c->n_heads * sizeof(unsigned));
    if (e == cudaSuccess) e = test_alloc(&t, (void **)&a.step, sizeof step);
    if (e == cudaSuccess) e = cudaMemset(a.counters, 0, (size_t)c->n_heads * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemcpy((void *)a.step, step, sizeof step, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        a.qkv = io.qkv, a.q_norm = io.q_norm, a.k_norm = io.k_norm, a.rope = io.rope;
        a.k_cache = io.k_cache, a.v_cache = io.v_cache, a.kv_f16 = c->kv_f16, a.out = io.out;
        a.qk_norm = c->qk_norm;
        a.eps = c->eps;
        a.n_rot = c->n_rot, a.neox = c->neox;
        a.n_heads = c->n_heads, a.n_kv = c->n_kv_heads, a.hd = c->head_dim, a.n_splits = n_splits;
        a.way = cuda_attention_way(c->pos, cuda_attention_head_blocks_until(G, c->head_dim),
                                   cuda_attention_grouped_from(G, c->head_dim, n_splits, c->kv_f16));
        cuda_attention(&a, 0, false);
        e = cudaGetLastError();
    }
    moe_status st = download_attention_io(e, c, &io, k_cache, v_cache, out, "decode", err);
    test_free(&t);
    return st;
}
