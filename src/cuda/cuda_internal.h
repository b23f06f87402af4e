/*
 * cuda_internal.h — what the .cu files of the CUDA backend share: the
 * device-side descriptions of weights (dmat), the arguments of each kernel,
 * the per-format table, and the uploaded model. Private to src/cuda (C++).
 */
#ifndef MOE_CUDA_INTERNAL_H
#define MOE_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_compat.cuh"

extern "C" {
#include "cuda/cuda_backend.h"
#include "model/model.h"
}

enum { ACT_Q8K, ACT_Q80, ACT_F32 };                 /* activation (dot) types */
enum { EPI_NONE, EPI_ARGMAX };                      /* gemv epilogues */
enum { MAX_EXPERTS_USED = 32, MAX_ROUTED_EXPERTS = 256, MAX_SEGS = 3 };
#define GEMV_THREADS 512 /* threads of a matrix-vector block (kernels.cuh) */
#define GEMV_WARPS (GEMV_THREADS / 32)

/* A weight matrix on the device (or a slab of experts of one shape). */
struct dmat {
    const uint8_t *body;        /* rows of block bodies, 16-byte aligned */
    const uint8_t *meta;        /* per-block meta (scales), or NULL */
    int64_t row_stride;         /* bytes between rows of bodies */
    int64_t meta_row_stride;    /* bytes between rows of meta */
    int64_t expert_stride;      /* bytes between experts' bodies (slabs) */
    int64_t meta_expert_stride; /* bytes between experts' meta */
    int rows, cols, units;      /* units: the 16-byte work items of a row */
    int type;                   /* moe_type */
    unsigned units_magic;       /* div_magic(units): a unit stream's term, t / units */
    unsigned rows_magic;        /* div_magic(rows): a row stream's expert, row / rows */
};

/* ceil(2^32 / d) for d >= 2 (0 for d = 1): t / d = umulhi(t, magic) for
 * every t with t * d < 2^32 (the error t * (magic - 2^32 / d) / 2^32 stays
 * below the 1 / d that separates t / d from the next integer). */
inline unsigned div_magic(int d) { return d > 1 ? (unsigned)((((uint64_t)1 << 32) + d - 1) / (uint64_t)d) : 0u; }

/* t / d by div_magic's multiply-high, not a division (some twenty
 * instructions, in every unit of the expert kernels). */
__host__ __device__ inline int div_by_magic(int t, int d, unsigned magic) {
#ifdef __CUDA_ARCH__
    return d == 1 ? t : (int)__umulhi((unsigned)t, magic);
#else
    return d == 1 ? t : (int)(((uint64_t)(unsigned)t * magic) >> 32);
#endif
}

/* ---------------------------------------------------------------- kernel arguments */

/* The input of a matrix product: n f32 values at src (16-byte aligned, n a
 * multiple of 32), RMSNorm'ed with `norm` when it is not NULL. */
struct act_in {
    const float *src;
    const float *norm;
    float eps;
    int n;
};

/* Routing as cpu_route (src/cpu/cpu_ops.c): softmax (gating 0) or
 * sigmoid over the router's logits, the k largest, their weights
 * renormalised (norm_topk) and scaled. */
struct route_spec {
    const float *logits; /* n_experts logits */
    int n_experts, k, gating, norm_topk;
    float w_scale;
};

struct gemv_seg {
    dmat w;
    float *out;
    const float *bias; /* or NULL */
    int accumulate;    /* out[r] += ... (residual) instead of = */
};

struct gemv_args {
    act_in in;
    gemv_seg seg[MAX_SEGS];
    int n_seg;
    int seg_end[MAX_SEGS]; /* cumulative rows */
    int lanes;             /* lanes per row, a power of two <= 32 */
    int stages;            /* > 0: the rows streamed through shared memory, this many tiles (gemv_stream_stages) */
    int epilogue;
    unsigned *counter; /* the argmax's last-block ticket */
    /* argmax */
    float *part_val;
    int *part_idx;
    int *step;    /* [0] token, [1] position */
    int *history; /* history[pos] = the argmax after position pos */
    uint64_t *trace; /* timeline marks (cuda_compat.cuh), or NULL */
};

struct ffn_up_args {
    act_in in;
    dmat gate, up;     /* routed slabs (or a dense FFN's matrices) */
    int n_routed;      /* slots of routed experts in this launch (0: none) */
    route_spec route;  /* logits set: every block routes (route_warp) */
    int *route_ids;    /* and block 0 publishes the ids and weights for ffn_down */
    float *route_w;
    const int *ids;    /* else the expert of each slot; NULL: expert 0 (dense) */
    dmat sh_gate, sh_up;
    int has_shared;
    int h_shared_off;  /* where the shared expert's hidden state starts in h */
    float *h;
    const float *shgate_w; /* the shared expert's gate vector, or NULL */
    float *shgate_out;
    int lanes;
    int act_ready; /* the input was final before the launch before passed its wait (a MoE FFN after its
                      router): staged before this launch's wait */
    uint64_t *trace;
};

struct ffn_down_args {
    act_in in;
    dmat down;
    int n_routed;
    const int *ids;       /* the expert of each slot (ffn_up's block 0 writes them) */
    const float *route_w; /* and its weight; NULL: weight 1 */
    int routed_act_stride;
    dmat sh_down;
    int has_shared;
    const float *shgate;  /* NULL: weight 1 */
    int shared_act_off;
    float *x;
    int x_ready; /* x was not written by the launch before: its first rows are read before the wait */
    int lanes;
    uint64_t *trace;
};

/* The phases of moe_ffn's launch, parted by grid barriers. */
enum moe_ffn_phase { PHASE_O, PHASE_ROUTER, PHASE_GATE_UP, PHASE_DOWN, MOE_FFN_PHASES };

/* The MoE half of a layer in one launch (moe_ffn.cuh): x += Wo att, the
 * router's logits of RMSNorm(x), the routing, then x += the k chosen
 * experts' SwiGLU FFNs of it. No shared expert, no biases; the router F32. */
struct moe_ffn_args {
    act_in att;         /* o's input: the attention's output */
    dmat wo;
    float *x;           /* the residual stream, updated twice */
    act_in x_in;        /* x with the FFN's norm: the router's and experts' input */
    dmat router;
    float *logits;      /* the router's (route.logits, written here) */
    route_spec route;
    int *route_ids;     /* block 0 publishes the routing (cuda_state_peek) */
    float *route_w;
    dmat gate, up, down; /* slabs */
    float *h;           /* k x n_ff */
    uint64_t *barrier;  /* grid_sync's counter */
    int o_lanes, up_lanes, down_lanes;
    uint64_t *trace[MOE_FFN_PHASES]; /* each phase's marks, in its stage's slots; NULL: untraced */
};

struct moe_ffn_fn {
    void (*launch)(const moe_ffn_args *, int grid, size_t smem, cudaStream_t, bool pdl);
    int (*occupancy)(size_t smem); /* blocks a multiprocessor; 0: cannot run */
};

/* How the decode attention shares its work among blocks (attention.cu), by
 * the context's length: a block a query head (short), a block a KV head
 * with warps a query head, a block a KV head scoring heads in groups
 * (long). */
enum attn_way { ATTN_HEAD_BLOCKS, ATTN_PER_HEAD, ATTN_GROUPED, ATTN_WAYS };

struct attn_args {
    const float *qkv;              /* q (n_heads*hd), k, v (n_kv*hd each) */
    const float *q_norm, *k_norm;  /* or NULL */
    int qk_norm;                   /* qk_norm_kind */
    float eps;
    const float *rope;             /* (n_ctx, n_rot): cos | sin of each position's angles */
    int n_rot, neox;
    void *k_cache, *v_cache;       /* this layer: (n_ctx, n_kv*hd), f32 or (kv_f16) f16 bits */
    bool kv_f16;
    const int *step;
    float *out;                    /* (n_heads*hd) */
    float *part_out;               /* (n_kv, n_splits, G, hd) */
    float *part_ml;                /* (n_kv, n_splits, G, 2): m, l */
    unsigned *counters;            /* (n_heads): one a block of a split's heads */
    int n_heads, n_kv, hd, n_splits;
    int way;                       /* attn_way */
    uint64_t *trace;
};

/* ---------------------------------------------------------------- formats */

typedef void (*repack_fn)(const uint8_t *src_row, uint8_t *body_row, uint8_t *meta_row, int nb);

/* The batched prefill's experts' products from quantized weights
 * (expert_gemm.cuh): y rows = x rows W^T, per tile of one expert's tokens. */
struct expert_gemm_args {
    dmat w[2];         /* the experts' matrix, or a pair stacked along y's columns (gate, up) */
    int pair;          /* 1 or 2 */
    const int *tiles;  /* per token tile: expert, first row of x and y, rows (at most EG_TOKENS) */
    const int *n_tiles; /* NULL, or on the device: how many of the grid's tiles there are (the rest exit) */
    const uint16_t *x; /* bf16 rows, ldx apart */
    int64_t ldx;
    void *y; /* rows ldy apart: f32, or bf16 if y_bf16 */
    int64_t ldy;
    bool y_bf16;
    bool swiglu; /* y = silu(x W0^T) * (x W1^T), bf16 rows of w[0].rows (from the codes only) */
};

struct cuda_format {
    int type;                 /* moe_type */
    const char *name;
    int block;                /* elements per block */
    int body, meta, units;    /* bytes per block of body and meta; units per block */
    int act;                  /* ACT_* */
    int n;                    /* units per lane per batch */
    repack_fn repack;         /* NULL: the GGUF block is the body */
    void (*gemv)(const gemv_args *, int grid, size_t smem, cudaStream_t, bool pdl);
    void (*up)(const ffn_up_args *, int grid, size_t smem, cudaStream_t, bool pdl);
    void (*down)(const ffn_down_args *, int grid, size_t smem, cudaStream_t, bool pdl);
    void (*embed)(const dmat *, const int *step, float *x, cudaStream_t, bool pdl);
    int (*occupancy)(int kernel, size_t smem); /* 0 gemv, 1 up, 2 down: blocks per SM */
    cudaError_t (*allow_smem)(int bytes);
    cudaError_t (*allow_stream_smem)(int bytes); /* gemv's ROWS_STREAM launches */
    /* Prefill: matrices experts[i] (NULL: i) of a slab, i < n, to plain
     * row-major f32 or bf16 at out + i * out_stride elements (dequant.cuh). */
    void (*dequant)(const dmat *m, const int *experts, int n, void *out, int64_t out_stride, bool bf16, cudaStream_t);
    /* Prefill: the experts' products of n_tiles token tiles; false, with
     * nothing launched, where the columns leave the kernel no step. */
    bool (*expert_gemm)(const expert_gemm_args *a, int n_tiles, cudaStream_t);
    /* Whether those products come from the codes (expert_codes.cuh), which
     * pay at any number of tokens an expert. */
    bool (*expert_codes)(void);
    /* Decode: the MoE half of a layer in one launch, for formats whose
     * units can be read from shared memory (moe_ffn.cuh); else NULLs. */
    moe_ffn_fn moe_ffn;
};

/* The format of a weight type; NULL when the CUDA backend has no kernels. */
const cuda_format *cuda_format_of(int type);

/* ---------------------------------------------------------------- the uploaded model */

struct cuda_layer {
    const float *attn_norm, *ffn_norm;
    dmat wq, wk, wv, wo;
    const float *bq, *bk, *bv; /* or NULL */
    const float *q_norm, *k_norm;
    dmat ffn_gate, ffn_up, ffn_down; /* dense */
    dmat router;
    dmat exp_gate, exp_up, exp_down; /* slabs */
    dmat sh_gate, sh_up, sh_down;
    const float *sh_gate_inp;
    bool has_shared;
};

struct cuda_model {
    const model *m;
    int device;
    char device_name[256];
    int n_sm;
    size_t smem_optin;
    uint8_t *arena;          /* every weight, one allocation */
    size_t arena_bytes;
    dmat token_embd, output;
    const float *output_norm, *rope_freqs;
    cuda_layer *layers;
};

/* ---------------------------------------------------------------- uploads (cuda_model.cu) */

/* Places weights in an arena; with dry set it only adds up the bytes. */
struct uploader {
    uint8_t *base;
    size_t used;
    bool dry;
    uint8_t *staging; /* host buffer for repacking */
    size_t staging_bytes;
    moe_error *err;
    moe_status status;
};

/* n_experts matrices of rows x cols of `type` (GGUF rows at srcs[e]) as
 * one slab. Errors name the tensor. */
moe_status upload_rows(uploader *u, int type, int n_experts, const uint8_t *const *srcs, int64_t rows, int64_t cols,
                       const char *name, dmat *out);
const float *upload_vec(uploader *u, const vec *v);

/* Raise the dynamic shared memory limit of every kernel to `bytes`. */
cudaError_t cuda_allow_smem_all(int bytes);
/* The same for the launches that stream their rows through shared memory
 * (gemv_stream_stages), to all a block may have (smem_optin): they alone
 * may ask for it (kernels with static shared memory could not). */
cudaError_t cuda_allow_stream_smem(size_t smem_optin);

/* ---------------------------------------------------------------- launch geometry */

__host__ __device__ inline size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Shared memory of a staged activation of n elements (scratch excluded). */
__host__ __device__ inline size_t act_bytes(int kind, int n) {
    if (kind == ACT_F32) return align16((size_t)n * 4);
    if (kind == ACT_Q80) return align16((size_t)n) + align16((size_t)n / 32 * 4);
    return align16((size_t)n) + align16((size_t)n / 256 * 4) + align16((size_t)n / 16 * 2);
}

/* Dynamic shared memory of a gemv-family launch: the activation and the
 * block-sum scratch (at least 64 floats: the argmax's flag and partials). */
__host__ __device__ inline size_t gemv_smem(int kind, int n) { return act_bytes(kind, n) + 64 * sizeof(float); }

/* gemv_kernel's ROWS_STREAM (kernels.cuh, row_stream): a tile is a row
 * group a warp; its shared memory after the staged activation holds
 * `stages` tiles (body rows, then meta rows) and two barriers a stage. */
__host__ __device__ inline int gemv_tile_rows(int lanes) { return GEMV_WARPS * (32 / lanes); }

struct gemv_stream_layout {
    size_t tiles, stage_bytes, bars, total; /* offsets and sizes in bytes */
};

__host__ __device__ inline gemv_stream_layout gemv_stream_layout_of(const dmat &w, int lanes, int act, int n, int stages) {
    gemv_stream_layout l;
    l.tiles = (gemv_smem(act, n) + 127) & ~(size_t)127;
    l.stage_bytes = ((size_t)gemv_tile_rows(lanes) * (size_t)(w.row_stride + w.meta_row_stride) + 127) & ~(size_t)127;
    l.bars = l.tiles + (size_t)stages * l.stage_bytes;
    l.total = l.bars + (size_t)stages * 2 * sizeof(uint64_t);
    return l;
}

#define GEMV_MAX_STAGES 8

/* Whether a one-segment product of w (no residual) streams its rows
 * (row_stream), and with how many tiles in flight: those that fit in a
 * block's `smem_optin` bytes of shared memory, at least 2 (0: it does not
 * stream). Rows of one batch a lane (n_per_lane units: ROWS_ACT's shape)
 * whose body and meta rows keep 16-byte alignment, w of min_bytes or
 * more (min_bytes < 0: none). */
inline int gemv_stream_stages(const dmat &w, int lanes, int n_per_lane, int act, size_t smem_optin, int64_t min_bytes) {
    const int64_t bytes = (int64_t)w.rows * (w.row_stride + w.meta_row_stride);
    if (min_bytes < 0 || bytes < min_bytes || w.units > lanes * n_per_lane || w.row_stride % 16 ||
        w.meta_row_stride % 16 || (uintptr_t)w.body % 16 || (uintptr_t)w.meta % 16)
        return 0;
    const gemv_stream_layout one = gemv_stream_layout_of(w, lanes, act, w.cols, 1);
    const size_t per = one.stage_bytes + 2 * sizeof(uint64_t);
    if (smem_optin < one.tiles + 2 * per) return 0;
    const size_t stages = (smem_optin - one.tiles) / per;
    return stages > GEMV_MAX_STAGES ? GEMV_MAX_STAGES : (int)stages;
}

/* A streamed product's launch: its shared memory, and a block a
 * multiprocessor (fewer for fewer tiles), the tiles split evenly. */
inline void gemv_stream_launch(const dmat &w, int lanes, int act, int stages, int n_sm, size_t *smem, int *grid) {
    const int tiles = (w.rows + gemv_tile_rows(lanes) - 1) / gemv_tile_rows(lanes);
    *smem = gemv_stream_layout_of(w, lanes, act, w.cols, stages).total;
    *grid = tiles < n_sm ? tiles : n_sm;
}

/* Blocks of a matrix-vector launch over `rows` rows (GEMV_WARPS * 32 /
 * lanes a block): at most one a multiprocessor for a layer's small
 * matrices, a launch with rows for four or more such passes (the output
 * head) as many as the occupancy allows. Measured (bench/decode-plan.md):
 * a second block a multiprocessor, room for the next launch's blocks to
 * start beside this one's, made the step slower with programmatic
 * dependent launch. max_grid: 0 for no further cap. */
inline int gemv_grid(int n_sm, int occupancy, int rows, int lanes, int max_grid) {
    const int per_block = GEMV_WARPS * (32 / lanes);
    const int need = (rows + per_block - 1) / per_block;
    int grid = need >= 4 * n_sm ? occupancy * n_sm : n_sm;
    if (grid > need) grid = need;
    if (max_grid > 0 && grid > max_grid) grid = max_grid;
    return grid > 0 ? grid : 1;
}

/* Lanes per row: enough that each lane has about n units of the row. */
inline int pick_lanes(int units, int n) {
    int per = (units + n - 1) / n, lanes = 1;
    while (lanes < per && lanes < 32) lanes <<= 1;
    return lanes;
}

/* Units a lane of ffn_up takes from each row of a batch: it loads a pair
 * of rows (gate and up) at once, so half the format's (pair_batch's NP). */
inline int up_units(const cuda_format *f) { return f->n > 1 ? f->n / 2 : 1; }

/* The expert kernels' lanes per row for rows of `units`, a lane taking
 * n of them a batch, >> shift (at least 1: `moe lab` also times fewer
 * lanes a row). */
inline int shifted_lanes(int units, int n, int shift) {
    const int lanes = pick_lanes(units, n) >> shift;
    return lanes > 0 ? lanes : 1;
}
inline int up_lanes(const cuda_format *f, int units, int shift = 0) { return shifted_lanes(units, up_units(f), shift); }
inline int down_lanes(const cuda_format *f, int units, int shift = 0) { return shifted_lanes(units, f->n, shift); }

/* ---------------------------------------------------------------- a sequence (cuda_forward.cu) */

/* A sequence's device state: KV cache, activations, the captured step. */
struct cuda_state {
    cuda_model *g;
    const model *m;
    int n_ctx;
    cuda_options opt;
    cudaStream_t stream;
    uint8_t *mem;
    size_t bytes;
    void *k_cache, *v_cache;  /* (n_layers, n_ctx, kv_dim), f32 or (opt.kv_f16) f16 bits */
    float *x;                 /* (n_embd) residual stream */
    float *qkv;               /* (q_dim + 2 kv_dim) */
    float *att;               /* (q_dim) */
    float *router;            /* (n_experts) logits */
    float *route_w;           /* (k) the routing, from ffn_up's block 0 */
    int *route_ids;           /* (k) */
    float *shgate;            /* (1) */
    float *h;                 /* (k n_ff_expert + n_ff_shared) or (n_ff) */
    float *logits;            /* (n_vocab) */
    float *attn_part_out;     /* (n_kv, splits, G, hd) */
    float *attn_part_ml;      /* (n_kv, splits, G, 2) */
    float *part_val;          /* (max grid) argmax partials */
    int *part_idx;
    int *step;                /* [0] token, [1] position */
    int *history;             /* (n_ctx + 1) argmax after each position */
    float *rope;              /* (n_ctx, n_rot) cos | sin, see attention.cu */
    unsigned *counters;       /* [0] argmax, [1..] attention, one a query head */
    uint64_t *grid_bar;       /* grid_sync's counter (moe_ffn launches, all of one grid size) */
    int moe_ffn_grid;         /* > 0: the MoE layers run moe_ffn, this many blocks */
    size_t moe_ffn_smem;
    int q_dim, kv_dim, n_ff_routed, h_len;
    int attn_splits;            /* blocks a KV head (per head, grouped) */
    int attn_head_splits;       /* blocks a query head (head blocks) */
    int attn_head_blocks_until; /* positions (pos + 1) up to which head blocks run */
    int attn_grouped_from;      /* positions (pos + 1) from which the attention scores heads in groups */
    int attn_way;               /* attn_way of the step being enqueued */
    int max_grid;
    cudaGraphExec_t graph[ATTN_WAYS]; /* the step captured with each way of the attention */
    bool graph_ready[ATTN_WAYS];
    unsigned skip_stages; /* stages left out of the step (1 << CUDA_STAGE_*): profiling only */
    cudaEvent_t ev[2];
    /* stage profile (cuda_profile_step): an event after every stage */
    cudaEvent_t *prof_ev;
    int *prof_stage;
    double *prof_bytes;
    int prof_n, prof_cap, prof_pos;
    bool prof_on;
    /* the timeline of one layer (cuda_timeline_layer): marks of each stage's launch */
    uint64_t *trace;      /* (CUDA_STAGE_COUNT, trace_blocks, TRACE_POINTS), made on first use */
    int trace_blocks, trace_layer;
    bool trace_on;
    struct prefill_scratch *prefill; /* the batched prefill's scratch (prefill.cu), made on first use */
    struct top_scratch *top;         /* cuda_top_logits' scratch (top_logits.cu), made on first use */
};

/* Bytes of a KV cache element: f32, or f16 with opt.kv_f16. */
static inline size_t cuda_kv_element_bytes(const cuda_state *s) { return s->opt.kv_f16 ? 2 : 4; }

/* Layer l's (n_ctx, kv_dim) part of a cache. */
static inline void *cuda_layer_cache(const cuda_state *s, void *cache, int l) {
    return (uint8_t *)cache + (size_t)l * s->n_ctx * s->kv_dim * cuda_kv_element_bytes(s);
}

/* The top logits (top_logits.cu): cuda_top_logits on the n_vocab logits
 * at (device) `logits`, on `stream`, with the scratch at *scratch (made on
 * first use, freed by cuda_top_scratch_free); cuda_top_free frees a
 * state's. */
moe_status cuda_top_logits_at(struct top_scratch **scratch, const float *logits, int n_vocab, cudaStream_t stream,
                              int n, const int32_t *extra, int n_extra, sampler_candidate *top, int *n_found,
                              float *extra_logits, moe_error *err);
void cuda_top_scratch_free(struct top_scratch *s);
void cuda_top_free(cuda_state *s);

/* The router of an F32 matrix (float.cu): logits, the RMSNorm fused, one
 * block per expert. The expert launches route from the logits. */
bool cuda_router_fits(const gemv_args *a);
void cuda_router(const gemv_args *a, cudaStream_t st, bool pdl);
/* Routing of n_tokens tokens' logits (n_experts apart), a warp each: ids
 * and weights k apart (the batched prefill). */
void cuda_route(const route_spec *r, const float *logits, int n_tokens, float *weights, int *ids, cudaStream_t st,
                bool pdl);

/* Attention (attention.cu). */
void cuda_attention(const attn_args *a, cudaStream_t st, bool pdl);
bool cuda_attention_supported(int G, int hd, int n_rot, int n_splits);
cudaError_t cuda_attention_setup(int G, int hd);
int cuda_attention_grouped_from(int G, int hd, int n_splits, bool kv_f16);
int cuda_attention_head_blocks_until(int G, int hd);
int cuda_attention_splits(int n_sm, int n_heads, int n_kv, int hd, bool head_blocks, bool kv_f16);
int cuda_attention_way(int pos, int head_blocks_until, int grouped_from);
void cuda_rope_table(const model_config *c, const float *rope_freqs, int n_ctx, float *out);

#endif
