/*
 * cuda_backend.h — the CUDA backend's C entry points: upload a model, make
 * a sequence state, run tokens. The same shape as the CPU backend
 * (cpu/cpu.h): cuda_forward takes and returns what cpu_forward does, so the
 * engine switches between them with one branch.
 *
 * A cuda_model holds every weight in device memory (uploaded once; the
 * routed experts of a layer as one slab per projection, indexed by expert
 * id on the device). A cuda_state holds a sequence's KV cache (f32, or f16
 * with cuda_options.kv_f16, rounded as the CPU's is: cpu/cpu.h) and
 * activations, and the decode step captured as a CUDA graph: embedding,
 * every layer, output head and greedy argmax, with the token and position
 * read from device memory, so one graph serves every position and a decode
 * loop never returns to the host (cuda_decode_greedy).
 *
 * The step leaves the logits on the GPU; the engine samples from the
 * largest few of them (cuda_top_logits) when its sampler allows, and
 * copies them all only when it needs every one.
 *
 * Builds without CUDA get inline versions that report no GPU:
 * cuda_available() is false and the constructors fail with a message that
 * says the build has no CUDA.
 */
#ifndef MOE_CUDA_BACKEND_H
#define MOE_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "moe.h"
#include "sample/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_model cuda_model;
typedef struct cuda_state cuda_state;

/* Launch options of a state; the defaults come from the environment:
 * MOE_CUDA_GRAPH=0 launches the step's kernels one by one instead of
 * replaying a graph, MOE_CUDA_PDL=0 turns off programmatic dependent launch
 * (on by default: each kernel loads its first weights before it waits for
 * the one before, which `moe bench` measures faster). */
typedef struct cuda_options {
    bool graph;
    bool pdl;
    bool moe_ffn; /* a MoE layer's o projection, router and experts in one launch, where they fit */
    /* bytes: a one-matrix product of this many or more streams its rows
     * through shared memory (the output head: faster in `moe lab`, a little
     * slower in the decode step on an H100, bench/decode-plan.md fact 73);
     * 0: none */
    long long gemv_stream_min;
    bool kv_f16; /* the KV cache in f16 (moe_session_params.kv_type; false by default) */
} cuda_options;

#ifdef MOE_HAVE_CUDA

/* True when this build has CUDA and the machine has a GPU the runtime sees. */
bool cuda_available(void);

/* Upload the weights of `m` (which must outlive the result). Fails with the
 * bytes needed and free when they do not fit, and names any tensor whose
 * type has no GPU kernels. */
moe_status cuda_model_new(const model *m, cuda_model **out, moe_error *err);
void cuda_model_free(cuda_model *g);
size_t cuda_model_bytes(const cuda_model *g); /* device bytes of the weights */
const char *cuda_model_device_name(const cuda_model *g);

cuda_options cuda_default_options(void);
/* A sequence of up to n_ctx positions; opts NULL: the defaults. */
moe_status cuda_state_new(cuda_model *g, int n_ctx, const cuda_options *opts, cuda_state **out, moe_error *err);
void cuda_state_free(cuda_state *s);
size_t cuda_state_bytes(const cuda_state *s); /* device bytes of the KV cache and activations */
bool cuda_state_one_launch_ffn(const cuda_state *s); /* the MoE layers run as one launch (options.moe_ffn) */

/* As cpu_forward: tokens[0..n) at positions pos.., logits of every position
 * (all_logits) or of the last, n_vocab floats each; logits may be NULL. */
moe_status cuda_forward(cuda_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                        moe_error *err);

/* The last position's logits stay on the GPU (cuda_forward fills them
 * whether or not it copies them out); these two read them. */

/* All n_vocab of them to out. */
moe_status cuda_last_logits(cuda_state *s, float *out, moe_error *err);

/* The n largest (1 <= n <= CUDA_TOP_MAX) to top, by the sampler's ranking
 * (larger first, the lower id among equals; -inf never), *n_found of them
 * (fewer than n only when fewer are finite), and the logits of the tokens
 * extra[0..n_extra) (n_extra <= CUDA_TOP_EXTRA_MAX) to extra_logits: what
 * sampler_sample_top needs. MOE_ERR_FORMAT when a logit is NaN or +inf,
 * MOE_ERR_UNSUPPORTED when n or n_extra is out of range. */
enum { CUDA_TOP_MAX = 512, CUDA_TOP_EXTRA_MAX = 1024 };
moe_status cuda_top_logits(cuda_state *s, int n, const int32_t *extra, int n_extra, sampler_candidate *top,
                           int *n_found, float *extra_logits, moe_error *err);

/* Whether cuda_forward runs n tokens batched (src/cuda/prefill.cu): this
 * build has cuBLAS (the simulator's has not), MOE_CUDA_PREFILL is not 0, and
 * n is large enough to pay for dequantizing the weights (shorter runs are
 * faster as decode steps). Otherwise they go token by token. */
bool cuda_prefill_batched(const cuda_state *s, int n);
/* The n from which that pays on model m (MoE models: about 2 x experts /
 * experts a token, as measured; see prefill.cu). */
int cuda_prefill_min_tokens(const model *m);

/* ---- measurement hooks (moe bench, tests) */

/* Feed `token` at `pos`, then decode n tokens greedily on the device: each
 * step's argmax is the next step's input, no host round trip. The n
 * tokens go to out (may be NULL); *ms is the GPU time of the n steps (CUDA
 * events), the first step included. */
moe_status cuda_decode_greedy(cuda_state *s, int32_t token, int pos, int n, int32_t *out, float *ms, moe_error *err);

/* tokens[0..n) at positions 0..n-1 as cuda_forward runs them (batched for
 * n > 1 where the build has cuBLAS), timed with CUDA events; no logits
 * come back. */
moe_status cuda_prefill_timed(cuda_state *s, const int32_t *tokens, int n, float *ms, moe_error *err);

/* Where a batched prefill's time goes (moe bench --profile with a
 * prompt): tokens[0..n) at positions 0.. run once more with the stream
 * synchronised after each phase of each layer. Per phase, summed over the
 * layers: the wall milliseconds from the end of the phase before (the
 * host's submission included, which bounds a phase of many small calls)
 * and the GEMM calls made (cuBLAS, expert_gemm.cuh). Only for prompts the batched prefill takes
 * (cuda_prefill_batched); elsewhere MOE_ERR_UNSUPPORTED. */
enum {
    CUDA_PF_EMBED, CUDA_PF_QKV, CUDA_PF_ATTENTION, CUDA_PF_O, CUDA_PF_ROUTE, CUDA_PF_EXPERT_DEQUANT, CUDA_PF_EXPERT_UP,
    CUDA_PF_EXPERT_DOWN, CUDA_PF_COMBINE, CUDA_PF_DENSE_FFN, CUDA_PF_HEAD, CUDA_PF_COUNT
};
typedef struct cuda_prefill_profile {
    const char *names[CUDA_PF_COUNT];
    double ms[CUDA_PF_COUNT];
    int calls[CUDA_PF_COUNT];
    double total_ms;
    int tokens;
} cuda_prefill_profile;
moe_status cuda_prefill_profile_run(cuda_state *s, const int32_t *tokens, int n, cuda_prefill_profile *out,
                                    moe_error *err);

/* Stage profile of one decode step (moe bench --profile): the step is
 * launched kernel by kernel (no graph, no PDL overlap) with a CUDA event
 * after every stage, `reps` times (after a warm-up) at position `pos`
 * (which rewrites that position's cache entry; earlier positions should
 * have been filled). Per stage, summed over the layers: the median
 * microseconds, the weight (and KV cache) bytes it reads, its launches.
 * Then, in the CUDA graph: the step's time less its time with the stage
 * left out, over CUDA_PROFILE_SPAN replays from pos (what the stage costs
 * where it runs, launch gap included). */
enum {
    CUDA_STAGE_EMBED, CUDA_STAGE_QKV, CUDA_STAGE_ATTENTION, CUDA_STAGE_O, CUDA_STAGE_ROUTER, CUDA_STAGE_UP,
    CUDA_STAGE_SH_UP, CUDA_STAGE_DOWN, CUDA_STAGE_SH_DOWN, CUDA_STAGE_MOE_FFN, CUDA_STAGE_HEAD, CUDA_STAGE_COUNT
};
typedef struct cuda_stage_profile {
    const char *names[CUDA_STAGE_COUNT];
    double us[CUDA_STAGE_COUNT];    /* median over reps, per token */
    double bytes[CUDA_STAGE_COUNT]; /* per token */
    int launches[CUDA_STAGE_COUNT]; /* per token */
    double total_us;                /* first event to last: the whole step */
    double graph_us[CUDA_STAGE_COUNT]; /* in the graph: the step less the step without the stage */
    double graph_total_us;             /* in the graph: the whole step */
    int n_stages, pos, reps, graph_reps;
} cuda_stage_profile;
/* Positions from pos that cuda_profile_step decodes (n_ctx >= pos + this). */
#define CUDA_PROFILE_SPAN 16
moe_status cuda_profile_step(cuda_state *s, int32_t token, int pos, int reps, cuda_stage_profile *out, moe_error *err);

/* The timeline of one layer inside the graph (moe bench --profile): the
 * step captured with that layer's launches marking the GPU's global timer
 * (thread 0 of every block: at entry, when its wait for the launch before
 * returns, when its input is staged, when its work is done, and when the
 * last block's epilogue -- the attention's merge -- is done),
 * replayed `reps` times at position pos. Microseconds from the first wait
 * of the layer's first launch; each the median over the replays. */
typedef struct cuda_timeline_stage {
    int stage, blocks;           /* CUDA_STAGE_*; blocks that marked their entry */
    double entry_first, entry_last;
    double waited_first, waited_last;
    double staged_median, staged_last;
    double worked_median, worked_last;
    double done; /* the launch's end: its last block's work or epilogue */
} cuda_timeline_stage;
typedef struct cuda_timeline {
    cuda_timeline_stage stages[CUDA_STAGE_COUNT];
    int n, layer, pos, reps;
    double resolution_ns; /* the smallest step seen between two marks */
} cuda_timeline;
moe_status cuda_timeline_layer(cuda_state *s, int32_t token, int pos, int layer, int reps, cuda_timeline *out,
                               moe_error *err);

/* Read bandwidth of this GPU: a kernel folds a buffer of `bytes` (made of
 * non-zero data) with 16-byte loads; GB/s of each of `runs` timed runs
 * after two warm-ups go to gbps[0..runs). */
moe_status cuda_read_bandwidth(size_t bytes, int runs, double *gbps, moe_error *err);

/* Device memory of the process as the driver reports it: used and total bytes. */
moe_status cuda_memory_info(size_t *used, size_t *total, moe_error *err);

/* Debugging: copy n floats of an activation buffer ("x", "qkv", "att",
 * "h", "logits") to the host after the last step. */
moe_status cuda_state_peek(cuda_state *s, const char *what, float *out, int n, moe_error *err);

/* ---- kernel tests: one launch on fresh device buffers, outputs poisoned
 * (NaN) first. Weights are rows in their GGUF layout. */

/* t / d as the expert kernels divide their flattened indices (div_magic's
 * multiply-high), for t >= 0 and t * d < 2^32. */
int cuda_test_div_magic(int t, int d);

/* x (n floats) staged as the matrix kernels stage their input, for
 * dot_type MOE_TYPE_Q8_K or MOE_TYPE_Q8_0, with the RMSNorm of weights
 * `norm` (eps) when given: fully normalised as ffn_up stages it
 * (full_norm), else times the weights as the matrix products do, the RMS
 * scale apart. Out: codes[n], scales[n / 256 or n / 32], for Q8_K
 * sums[n / 16] (each 16 codes' sum; NULL for Q8_0), and in *norm_scale
 * the factor the products take (the RMS scale; 1 with full_norm or
 * without a norm). */
moe_status cuda_test_stage(moe_type dot_type, const float *x, const float *norm, float eps, int n, bool full_norm,
                           int8_t *codes, float *scales, int16_t *sums, float *norm_scale, moe_error *err);

/* y[rows] = W x, x of cols floats, through the decode step's gemv kernel;
 * stream: its rows streamed through shared memory, three tiles a block,
 * which only the shapes of cuda_test_gemv_streams take. */
moe_status cuda_test_gemv(moe_type type, int rows, int cols, const void *w, const float *x, float *y, bool stream,
                          moe_error *err);
bool cuda_test_gemv_streams(moe_type type, int cols);

/* The routed-expert kernels on slabs of n_experts experts (GGUF layout,
 * gate and up n_ff x n_embd, down n_embd x n_ff): h[k][n_ff] =
 * silu(gate_id x) * (up_id x) for the k experts ids[], then
 * y = y0 + sum_j w[j] down_{ids[j]} h_j.
 * - With logits (n_experts of them) the kernels route themselves instead,
 *   as in the decode step: softmax (sigmoid: 1/(1+e^-l)), the top k, their
 *   weights renormalised. ids and weights are then not read: ffn_down
 *   takes what ffn_up's block 0 publishes.
 * - Given ids reach ffn_down late, from a launch it overlaps (programmatic
 *   dependent launch): the ids it reads before its wait are wrong, and it
 *   must take the right ones after.
 * - lanes_shift: each kernel runs with its decode lanes per row >>
 *   lanes_shift (at least 1), as `moe lab` times them. */
typedef struct cuda_test_expert_io {
    moe_type type, down_type;
    int n_experts, k, n_ff, n_embd;
    const void *gate, *up, *down;
    const int32_t *ids;
    const float *weights;
    const float *logits; /* or NULL */
    int sigmoid;
    int lanes_shift;
    const float *x, *y0;
    float *h, *y; /* out */
} cuda_test_expert_io;

moe_status cuda_test_experts(const cuda_test_expert_io *io, moe_error *err);

/* cuda_top_logits on logits[0..n_vocab) copied to the GPU, run twice. */
moe_status cuda_test_top_logits(const float *logits, int n_vocab, int n, const int32_t *extra, int n_extra,
                                sampler_candidate *top, int *n_found, float *extra_logits, moe_error *err);

/* The prefill's dequantization: n_pick matrices of a slab of n_experts
 * (rows x cols each, GGUF layout, contiguous), experts[i] or i when
 * experts is NULL, to out as row-major f32 or bf16 bits, rows * cols
 * elements apart. */
moe_status cuda_test_dequant(moe_type type, int n_experts, int rows, int cols, const void *w, const int32_t *experts,
                             int n_pick, bool bf16, void *out, moe_error *err);

/* The prefill's experts' products from quantized weights (expert_codes.cuh,
 * expert_gemm.cuh) for the pair of slabs gate and up (W and U, as in
 * cuda_test_dequant): per tile (expert, first row, rows) of tiles, row r
 * of y is row r of x (n_rows x cols, bf16 bits) times the expert's
 * [W | U]^T (n_rows x 2 rows, f32 or bf16 bits), or silu(x W^T) * (x U^T)
 * (n_rows x rows, bf16 bits: a format whose products come from its
 * codes). Rows of no tile stay poisoned. */
enum { CUDA_TEST_EG_F32, CUDA_TEST_EG_BF16, CUDA_TEST_EG_SWIGLU };
/* Whether type's expert products come from its codes (expert_codes.cuh),
 * as the format table answers it. */
bool cuda_test_expert_codes(moe_type type);
moe_status cuda_test_expert_gemm(moe_type type, int n_experts, int rows, int cols, const void *gate, const void *up,
                                 const uint16_t *x, int n_rows, const int *tiles, int n_tiles, int out, void *y,
                                 moe_error *err);

/* One layer of the prefill's attention: n_tokens new tokens at positions
 * pos.. with their q|k|v projections (n_tokens x (q_dim + 2 kv_dim)). */
typedef struct cuda_test_attention {
    int n_tokens, pos, n_ctx;
    int n_heads, n_kv_heads, head_dim, n_rot;
    bool neox;
    qk_norm_kind qk_norm;
    float eps, rope_base, freq_scale;
    const float *rope_freqs;      /* n_rot / 2, or NULL */
    const float *q_norm, *k_norm; /* head_dim (per head) or q_dim / kv_dim (full), or NULL */
    const float *bq, *bk, *bv;    /* or NULL */
    const float *qkv;
    bool kv_f16; /* the cache in f16: filled positions rounded to it on the way in */
} cuda_test_attention;

/* k_cache, v_cache: (n_ctx, kv_dim), positions < pos read, the new ones
 * written back (positions past them come back poisoned: never read nor
 * written; an f16 cache widened to f32); out: (n_tokens, q_dim). */
moe_status cuda_test_prefill_attention(const cuda_test_attention *a, float *k_cache, float *v_cache, float *out,
                                       moe_error *err);

/* The decode step's attention (attention.cu) for the one token at pos
 * (n_tokens 1, no biases), its cache split over n_splits blocks per KV head
 * (per head block with head blocks), the way the position's (as the
 * MOE_CUDA_ATTN_* variables set it); k_cache, v_cache and out as above. */
moe_status cuda_test_decode_attention(const cuda_test_attention *a, int n_splits, float *k_cache, float *v_cache,
                                      float *out, moe_error *err);

/* ---- the kernel lab (moe lab; lab.cu): the decode kernels on device
 * copies of weights given in GGUF layout, each beside a pure read of the
 * same bytes walked the same way; medians of `reps` timed batches. */

enum { CUDA_LAB_MAX_REPS = 1000 };

typedef struct cuda_lab_timing {
    double us, read_us; /* per launch: the production kernel, the pure read */
    double bytes;       /* weight bytes one launch reads */
    int grid, lanes;    /* the production launch: blocks, lanes per row */
    int stages;         /* > 0: its rows streamed through shared memory, this many tiles in flight */
    int occupancy, read_occupancy; /* blocks per SM: the kernel's, the pure read's */
    int depth;          /* the pure read's 16-byte loads in flight per lane */
    int copies, batch;  /* weight copies rotated; launches per timed batch */
} cuda_lab_timing;

typedef struct cuda_lab_chain {
    double plain_us, graph_us, pdl_us; /* per launch: on a stream, one graph, a graph with PDL */
    double barrier_us;                 /* per step of one resident kernel, steps parted by grid barriers */
    double acq_rel_barrier_us;         /* the same with a release/acquire barrier (no fences) */
} cuda_lab_chain;

/* One warp running kb KB of straight-line code once: with L2 and the
 * multiprocessors' instruction caches swept just before (cold), and again
 * right after (hot). */
typedef struct cuda_lab_code {
    int kb;
    double cold_us, hot_us; /* medians, from the code's first instruction to its last */
    int sweep_mb, flush_kb; /* what ran before the cold run: an L2 sweep, other code on every SM */
} cuda_lab_code;

/* How one block stages an activation (kernels.cuh): as the matrix
 * products do (x * w, the RMS scale apart), as ffn_up does (the full
 * norm), without a norm, or just its first chunk's loads and one barrier
 * (the floor under the others). */
enum { CUDA_LAB_STAGE_PRODUCTS, CUDA_LAB_STAGE_NORMED, CUDA_LAB_STAGE_PLAIN, CUDA_LAB_STAGE_LOADS, CUDA_LAB_STAGE_WAYS };

/* One staging timed in every block of a launch of one block an SM, from a
 * barrier at its entry to the staging's last barrier: with L2 and the
 * instruction caches swept before it (cold, as between two layers of the
 * decode step) and right after that (hot); medians over the runs of the
 * blocks' median and of their largest (last). */
typedef struct cuda_lab_stage {
    moe_type dot; /* MOE_TYPE_Q8_K, MOE_TYPE_Q8_0 or MOE_TYPE_F32 */
    int how, n;   /* CUDA_LAB_STAGE_*, values staged */
    double cold_us, cold_last_us, hot_us, hot_last_us;
} cuda_lab_stage;

/* The GPU's name and number of SMs. */
moe_status cuda_lab_device(char *name, size_t len, int *n_sm, moe_error *err);
/* gemv_kernel on rows x cols of `type` (GGUF rows at w); stream: its rows
 * streamed through shared memory (cuda_test_gemv_streams' shapes). */
moe_status cuda_lab_gemv(moe_type type, int rows, int cols, const void *w, int reps, bool stream, cuda_lab_timing *out,
                         moe_error *err);
/* ffn_up (k experts of gate and up, n_ff x n_embd) and ffn_down (n_embd x
 * n_ff) by ids that change every launch: scattered over the slab, or
 * (neighbours) k adjacent experts; slabs and lanes_shift as in
 * cuda_test_experts. */
moe_status cuda_lab_experts(moe_type type, int n_experts, int k, bool neighbours, int lanes_shift, int n_ff, int n_embd,
                            const void *gate, const void *up, const void *down, int reps, cuda_lab_timing *up_out,
                            cuda_lab_timing *down_out, moe_error *err);
/* What a sampled token pays to bring the top n of n_vocab logits (and
 * n_extra penalised ones) to the host (cuda_top_logits: launch, copies,
 * sync), or with n = 0 all of the logits: the median host-clock
 * microseconds of reps calls after a warm-up. */
moe_status cuda_lab_top_logits(int n_vocab, int n, int n_extra, int reps, double *us, moe_error *err);
/* A chain of `launches` dependent kernels of blocks x threads. */
moe_status cuda_lab_launch_chain(int launches, int blocks, int threads, int reps, cuda_lab_chain *out, moe_error *err);
/* cuda_lab_code of kb = 4, 16 or 64, reps times after a warm-up. */
moe_status cuda_lab_code_fetch(int kb, int reps, cuda_lab_code *out, moe_error *err);
/* cuda_lab_stage of n values of dot type `dot`, staged `how`, reps times
 * after a warm-up; the norm's weights are given for every way but
 * CUDA_LAB_STAGE_PLAIN. */
moe_status cuda_lab_staging(moe_type dot, int how, int n, int reps, cuda_lab_stage *out, moe_error *err);

#else /* no CUDA in this build */

enum { CUDA_TOP_MAX = 0, CUDA_TOP_EXTRA_MAX = 0 };

static inline bool cuda_available(void) { return false; }
static inline moe_status cuda_no_cuda(moe_error *err) {
    if (err) {
        err->code = MOE_ERR_UNSUPPORTED;
        snprintf(err->message, sizeof err->message, "this build of moe.c has no CUDA backend (use --device cpu)");
    }
    return MOE_ERR_UNSUPPORTED;
}
static inline moe_status cuda_model_new(const model *m, cuda_model **out, moe_error *err) {
    (void)m;
    *out = NULL;
    return cuda_no_cuda(err);
}
static inline void cuda_model_free(cuda_model *g) { (void)g; }
static inline cuda_options cuda_default_options(void) { return (cuda_options){0}; }
static inline const char *cuda_model_device_name(const cuda_model *g) { (void)g; return "none"; }
static inline moe_status cuda_state_new(cuda_model *g, int n_ctx, const cuda_options *o, cuda_state **out,
                                        moe_error *err) {
    (void)g, (void)n_ctx, (void)o;
    *out = NULL;
    return cuda_no_cuda(err);
}
static inline void cuda_state_free(cuda_state *s) { (void)s; }
static inline moe_status cuda_forward(cuda_state *s, const int32_t *tokens, int n, int pos, float *logits,
                                      bool all_logits, moe_error *err) {
    (void)s, (void)tokens, (void)n, (void)pos, (void)logits, (void)all_logits;
    return cuda_no_cuda(err);
}
static inline moe_status cuda_last_logits(cuda_state *s, float *out, moe_error *err) {
    (void)s, (void)out;
    return cuda_no_cuda(err);
}
static inline moe_status cuda_top_logits(cuda_state *s, int n, const int32_t *extra, int n_extra,
                                         sampler_candidate *top, int *n_found, float *extra_logits, moe_error *err) {
    (void)s, (void)n, (void)extra, (void)n_extra, (void)top, (void)n_found, (void)extra_logits;
    return cuda_no_cuda(err);
}

#endif

#ifdef __cplusplus
}
#endif
#endif
