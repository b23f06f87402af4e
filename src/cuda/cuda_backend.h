/*
 * cuda_backend.h — the CUDA backend's C entry points: upload a model, make
 * a sequence state, run tokens. The same shape as the CPU backend
 * (cpu/cpu.h): cuda_forward takes and returns what cpu_forward does, so the
 * engine switches between them with one branch.
 *
 * A cuda_model holds every weight in device memory (uploaded once; the
 * routed experts of a layer as one slab per projection, indexed by expert
 * id on the device). A cuda_state holds a sequence's KV cache (f32) and
 * activations, and the decode step captured as a CUDA graph: embedding,
 * every layer, output head and greedy argmax, with the token and position
 * read from device memory, so one graph serves every position and a decode
 * loop never returns to the host (cuda_decode_greedy).
 *
 * Builds without CUDA get inline stubs: cuda_available() is false and the
 * constructors fail with a message that says the build has no CUDA.
 */
#ifndef MOE_CUDA_BACKEND_H
#define MOE_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_model cuda_model;
typedef struct cuda_state cuda_state;

/* Launch options of a state; the defaults come from the environment:
 * MOE_CUDA_GRAPH=0 launches the step's kernels one by one instead of
 * replaying a graph, MOE_CUDA_PDL=0 turns off programmatic dependent launch. */
typedef struct cuda_options {
    bool graph;
    bool pdl;
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

/* As cpu_forward: tokens[0..n) at positions pos.., logits of every position
 * (all_logits) or of the last, n_vocab floats each; logits may be NULL. */
moe_status cuda_forward(cuda_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                        moe_error *err);

/* ---- measurement hooks (moe bench, tests) */

/* Feed `token` at `pos`, then decode n tokens greedily on the device: each
 * step's argmax is the next step's input, no host round trip. The n
 * tokens go to out (may be NULL); *ms is the GPU time of the n steps (CUDA
 * events), the first step included. */
moe_status cuda_decode_greedy(cuda_state *s, int32_t token, int pos, int n, int32_t *out, float *ms, moe_error *err);

/* tokens[0..n) at positions 0..n-1 one step at a time (the prefill of this
 * milestone), timed with CUDA events; no logits come back. */
moe_status cuda_prefill_timed(cuda_state *s, const int32_t *tokens, int n, float *ms, moe_error *err);

/* Stage profile of one decode step (moe bench --profile): the step is
 * launched kernel by kernel (no graph, no PDL overlap) with a CUDA event
 * after every stage, `reps` times (after a warm-up) at position `pos`
 * (which rewrites that position's cache entry; earlier positions should
 * have been filled). Per stage, summed over the layers: the median
 * microseconds, the weight (and KV cache) bytes it reads, its launches. */
enum {
    CUDA_STAGE_EMBED, CUDA_STAGE_QKV, CUDA_STAGE_ATTENTION, CUDA_STAGE_O, CUDA_STAGE_ROUTER, CUDA_STAGE_UP,
    CUDA_STAGE_SH_UP, CUDA_STAGE_DOWN, CUDA_STAGE_SH_DOWN, CUDA_STAGE_HEAD, CUDA_STAGE_COUNT
};
typedef struct cuda_stage_profile {
    const char *names[CUDA_STAGE_COUNT];
    double us[CUDA_STAGE_COUNT];    /* median over reps, per token */
    double bytes[CUDA_STAGE_COUNT]; /* per token */
    int launches[CUDA_STAGE_COUNT]; /* per token */
    double total_us;                /* first event to last: the whole step */
    int n_stages, pos, reps;
} cuda_stage_profile;
moe_status cuda_profile_step(cuda_state *s, int32_t token, int pos, int reps, cuda_stage_profile *out, moe_error *err);

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

/* y[rows] = W x, x of cols floats, through the decode step's gemv kernel. */
moe_status cuda_test_gemv(moe_type type, int rows, int cols, const void *w, const float *x, float *y, moe_error *err);

/* The routed-expert kernels on slabs of n_experts experts (GGUF layout,
 * gate and up n_ff x n_embd, down n_embd x n_ff): h[k][n_ff] =
 * silu(gate_id x) * (up_id x) for the k experts ids[], then
 * y = y0 + sum_j w[j] down_{ids[j]} h_j. */
moe_status cuda_test_experts(moe_type type, moe_type down_type, int n_experts, int k, int n_ff, int n_embd,
                             const void *gate, const void *up, const void *down, const int32_t *ids,
                             const float *weights, const float *x, const float *y0, float *h, float *y,
                             moe_error *err);

#else /* no CUDA in this build */

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

#endif

#ifdef __cplusplus
}
#endif
#endif
