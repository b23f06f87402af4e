/*
 * cuda_forward.cu — a sequence on the GPU: its state, the decode step, and
 * the step's capture in a CUDA graph.
 *
 * The decode step (enqueue_step) reads top to bottom like the design:
 *
 *   embedding row of step[0]
 *   per layer:
 *     q|k|v = W (RMSNorm x) (+ bias)                     gemv (norm fused)
 *     q/k norm, RoPE, append k v, attention               attention
 *     x += Wo att                                          gemv (residual)
 *     router logits                                        router
 *     softmax|sigmoid, top-k, weights; then               (each block routes)
 *     h = silu(G_e xn) * (U_e xn), k experts (+ shared)    ffn_up
 *     x += sum w_e D_e h_e (+ g D_sh h_sh)                 ffn_down
 *   logits = W_out (RMSNorm x), argmax -> step[0], step[1] += 1
 *
 * Six launches per MoE layer, no host round trip: the token and position
 * live in device memory (step), so the captured graph serves every
 * position. Matrices of different types in one group (q, k, v) get one
 * launch per type. A launch's grid is sized to the kernel's occupancy on
 * this GPU (persistent blocks) and its lanes per row to the row length.
 *
 * Scratch memory of a state is one allocation, the KV cache included.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.cuh"
#include "cuda/prefill.h"

extern "C" {
#include "common/median.h"
#include "cuda/cuda_backend.h"
}

static bool env_flag(const char *name, bool fallback) {
    const char *v = getenv(name);
    return v && *v ? v[0] != '0' : fallback;
}

/* ---------------------------------------------------------------- stage profile */

static const char *const stage_names[CUDA_STAGE_COUNT] = {
    "embedding",          "attn norm + q/k/v",    "qk-norm/rope/kv/attention", "o + residual",
    "ffn norm + router",  "experts gate/up (+sh)", "shared gate/up",            "experts down (+sh)",
    "shared down",        "o + router + experts (one launch)", "final norm + head + argmax"};

static double dmat_bytes(const dmat *m) { return (double)m->rows * (double)(m->row_stride + m->meta_row_stride); }

/* Profiling only: an event after the launches of `stage`, which read `bytes`. */
static void mark(cuda_state *s, int stage, double bytes) {
    if (!s->prof_on || s->prof_n >= s->prof_cap) return;
    cudaEventRecord(s->prof_ev[s->prof_n], s->stream);
    s->prof_stage[s->prof_n] = stage;
    s->prof_bytes[s->prof_n] = bytes;
    s->prof_n++;
}

/* False for a stage left out of the step (cuda_profile_step measures what
 * each stage costs inside the graph by leaving it out). */
static bool live(const cuda_state *s, int stage) { return !(s->skip_stages >> stage & 1u); }

/* Where the launch of `stage` in `layer` leaves its timeline marks: NULL
 * but in the traced layer of a traced capture. */
static uint64_t *trace_of(const cuda_state *s, int layer, int stage) {
    return s->trace_on && layer == s->trace_layer ? s->trace + (size_t)stage * s->trace_blocks * TRACE_POINTS : NULL;
}

__global__ void set_step_kernel(int *step, int token, int pos) {
    pdl_wait();
    step[0] = token;
    step[1] = pos;
}

/* ---------------------------------------------------------------- launches */

static int grid_for(const cuda_state *s, const cuda_format *f, int kernel, size_t smem, int rows, int lanes) {
    return gemv_grid(s->g->n_sm, f->occupancy(kernel, smem), rows, lanes, s->max_grid);
}

typedef struct gemv_out {
    const dmat *w;
    float *out;
    const float *bias;
} gemv_out;

/* How a MoE layer routes: from the router launch's logits. */
static route_spec route_of(const cuda_state *s) {
    const model_config *c = &s->m->config;
    return route_spec{s->router, c->n_experts, c->n_experts_used, c->gating == GATING_SIGMOID, c->norm_topk,
                      c->expert_weights_scale};
}

/* What a gemv() launch is for: the router's logits (F32: router_kernel),
 * the head's launch takes the argmax. */
enum { GEMV_PLAIN, GEMV_ROUTER, GEMV_HEAD };

/* y = W in for each output; one launch per weight type among them. */
static void gemv(cuda_state *s, act_in in, const gemv_out *outs, int n, bool accumulate, int kind, uint64_t *trace) {
    bool done[MAX_SEGS] = {false, false, false};
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        const cuda_format *f = cuda_format_of(outs[i].w->type);
        gemv_args a;
        memset(&a, 0, sizeof a);
        a.in = in;
        int rows = 0;
        for (int j = i; j < n; j++) {
            if (done[j] || outs[j].w->type != outs[i].w->type) continue;
            done[j] = true;
            gemv_seg *sg = &a.seg[a.n_seg];
            sg->w = *outs[j].w;
            sg->out = outs[j].out;
            sg->bias = outs[j].bias;
            sg->accumulate = accumulate;
            rows += outs[j].w->rows;
            a.seg_end[a.n_seg++] = rows;
        }
        a.lanes = pick_lanes(outs[i].w->units, f->n);
        a.epilogue = kind == GEMV_HEAD ? EPI_ARGMAX : EPI_NONE;
        a.trace = trace;
        if (kind == GEMV_HEAD) {
            a.counter = s->counters;
            a.part_val = s->part_val;
            a.part_idx = s->part_idx;
            a.step = s->step;
            a.history = s->history;
        }
        if (kind == GEMV_ROUTER && cuda_router_fits(&a)) {
            cuda_router(&a, s->stream, s->opt.pdl);
            continue;
        }
        /* one matrix without a residual may stream, at this state's threshold */
        const long long min = a.n_seg == 1 && !accumulate && s->opt.gemv_stream_min > 0 ? s->opt.gemv_stream_min : -1;
        a.stages = gemv_stream_stages(a.seg[0].w, a.lanes, f->n, f->act, s->g->smem_optin, min);
        size_t smem = gemv_smem(f->act, in.n);
        int grid;
        if (a.stages) gemv_stream_launch(a.seg[0].w, a.lanes, f->act, a.stages, s->g->n_sm, &smem, &grid);
        else grid = grid_for(s, f, 0, smem, rows, a.lanes);
        f->gemv(&a, grid, smem, s->stream, s->opt.pdl);
    }
}

static void embed(cuda_state *s) {
    const dmat *e = &s->g->token_embd;
    if (live(s, CUDA_STAGE_EMBED)) cuda_format_of(e->type)->embed(e, s->step, s->x, s->stream, s->opt.pdl);
    mark(s, CUDA_STAGE_EMBED, (double)e->row_stride + e->meta_row_stride);
}

static void attention_block(cuda_state *s, int l, bool with_o) {
    const model_config *c = &s->m->config;
    const cuda_layer *w = &s->g->layers[l];
    act_in in = {s->x, w->attn_norm, c->rms_eps, c->n_embd};
    gemv_out qkv[3] = {{&w->wq, s->qkv, w->bq},
                       {&w->wk, s->qkv + s->q_dim, w->bk},
                       {&w->wv, s->qkv + s->q_dim + s->kv_dim, w->bv}};
    if (live(s, CUDA_STAGE_QKV)) gemv(s, in, qkv, 3, false, GEMV_PLAIN, trace_of(s, l, CUDA_STAGE_QKV));
    mark(s, CUDA_STAGE_QKV, dmat_bytes(&w->wq) + dmat_bytes(&w->wk) + dmat_bytes(&w->wv));

    attn_args a;
    memset(&a, 0, sizeof a);
    a.qkv = s->qkv;
    a.q_norm = w->q_norm;
    a.k_norm = w->k_norm;
    a.qk_norm = c->arch->qk_norm;
    a.eps = c->rms_eps;
    a.rope = s->rope;
    a.n_rot = c->n_rot;
    a.neox = c->arch->rope == ROPE_NEOX;
    a.k_cache = cuda_layer_cache(s, s->k_cache, l);
    a.v_cache = cuda_layer_cache(s, s->v_cache, l);
    a.kv_f16 = s->opt.kv_f16;
    a.step = s->step;
    a.out = s->att;
    a.part_out = s->attn_part_out;
    a.part_ml = s->attn_part_ml;
    a.counters = s->counters + 1;
    a.n_heads = c->n_heads;
    a.n_kv = c->n_kv_heads;
    a.hd = c->head_dim;
    a.way = s->attn_way;
    a.n_splits = a.way == ATTN_HEAD_BLOCKS ? s->attn_head_splits : s->attn_splits;
    a.trace = trace_of(s, l, CUDA_STAGE_ATTENTION);
    if (live(s, CUDA_STAGE_ATTENTION)) cuda_attention(&a, s->stream, s->opt.pdl);
    mark(s, CUDA_STAGE_ATTENTION, 2.0 * (s->prof_pos + 1) * s->kv_dim * sizeof(float));
    if (!with_o) return;

    act_in att = {s->att, NULL, 0.0f, s->q_dim};
    gemv_out o = {&w->wo, s->x, NULL};
    if (live(s, CUDA_STAGE_O)) gemv(s, att, &o, 1, true, GEMV_PLAIN, trace_of(s, l, CUDA_STAGE_O));
    mark(s, CUDA_STAGE_O, dmat_bytes(&w->wo));
}

/* h = silu(gate x) * (up x) for `n_routed` slots of a slab (a dense FFN:
 * one slot, expert 0) and/or the shared expert. */
static void ffn_up(cuda_state *s, act_in in, const dmat *gate, const dmat *up, int n_routed, const cuda_layer *w,
                   bool shared, uint64_t *trace) {
    const cuda_format *f = cuda_format_of(n_routed ? gate->type : w->sh_gate.type);
    ffn_up_args a;
    memset(&a, 0, sizeof a);
    a.in = in;
    int rows = 0, units = 0;
    if (n_routed) {
        a.gate = *gate, a.up = *up, a.n_routed = n_routed;
        if (s->m->config.n_experts) a.route = route_of(s), a.route_ids = s->route_ids, a.route_w = s->route_w;
        rows += n_routed * gate->rows;
        units = gate->units;
    }
    if (shared) {
        a.sh_gate = w->sh_gate, a.sh_up = w->sh_up, a.has_shared = 1;
        a.shgate_w = w->sh_gate_inp;
        a.shgate_out = s->shgate;
        rows += w->sh_gate.rows;
        if (!units) units = w->sh_gate.units;
    }
    a.h = s->h;
    a.h_shared_off = s->n_ff_routed;
    /* x comes from the o projection, two launches back when a router (or
     * the routed experts' launch) ran in between */
    a.act_ready = s->m->config.n_experts > 0 && live(s, CUDA_STAGE_ROUTER);
    a.lanes = up_lanes(f, units);
    a.trace = trace;
    const size_t smem = gemv_smem(f->act, in.n);
    f->up(&a, grid_for(s, f, 1, smem, rows, a.lanes), smem, s->stream, s->opt.pdl);
}

/* x += sum_j w_j down_j h_j (+ g * down_sh h_sh). */
static void ffn_down(cuda_state *s, const dmat *down, int n_routed, const cuda_layer *w, bool shared,
                     uint64_t *trace) {
    const cuda_format *f = cuda_format_of(n_routed ? down->type : w->sh_down.type);
    ffn_down_args a;
    memset(&a, 0, sizeof a);
    int first = n_routed ? 0 : s->n_ff_routed, len = 0, units = 0;
    if (n_routed) {
        a.down = *down, a.n_routed = n_routed;
        if (s->m->config.n_experts) a.ids = s->route_ids, a.route_w = s->route_w;
        a.routed_act_stride = down->cols;
        len = n_routed * down->cols;
        units = n_routed * down->units;
    }
    if (shared) {
        a.sh_down = w->sh_down, a.has_shared = 1;
        a.shgate = w->sh_gate_inp ? s->shgate : NULL;
        a.shared_act_off = s->n_ff_routed - first;
        len = s->n_ff_routed - first + w->sh_down.cols;
        units += w->sh_down.units;
    }
    a.in = act_in{s->h + first, NULL, 0.0f, len};
    a.x = s->x;
    a.x_ready = n_routed > 0; /* a shared expert's down of its own follows the routed down, which writes x */
    a.lanes = down_lanes(f, units);
    a.trace = trace;
    const size_t smem = gemv_smem(f->act, len);
    int rows = n_routed ? down->rows : w->sh_down.rows;
    f->down(&a, grid_for(s, f, 2, smem, rows, a.lanes), smem, s->stream, s->opt.pdl);
}

static void ffn_block(cuda_state *s, int l) {
    const model_config *c = &s->m->config;
    const cuda_layer *w = &s->g->layers[l];
    act_in in = {s->x, w->ffn_norm, c->rms_eps, c->n_embd};
    if (c->n_experts == 0) {
        if (live(s, CUDA_STAGE_UP)) ffn_up(s, in, &w->ffn_gate, &w->ffn_up, 1, w, false, trace_of(s, l, CUDA_STAGE_UP));
        mark(s, CUDA_STAGE_UP, dmat_bytes(&w->ffn_gate) + dmat_bytes(&w->ffn_up));
        if (live(s, CUDA_STAGE_DOWN)) ffn_down(s, &w->ffn_down, 1, w, false, trace_of(s, l, CUDA_STAGE_DOWN));
        mark(s, CUDA_STAGE_DOWN, dmat_bytes(&w->ffn_down));
        return;
    }
    gemv_out r = {&w->router, s->router, NULL};
    if (live(s, CUDA_STAGE_ROUTER)) gemv(s, in, &r, 1, false, GEMV_ROUTER, trace_of(s, l, CUDA_STAGE_ROUTER));
    mark(s, CUDA_STAGE_ROUTER, dmat_bytes(&w->router));
    const int k = c->n_experts_used;
    const bool sh = w->has_shared;
    const double sh_up = sh ? dmat_bytes(&w->sh_gate) + dmat_bytes(&w->sh_up) : 0, sh_down = sh ? dmat_bytes(&w->sh_down) : 0;
    const bool up_together = sh && w->sh_gate.type == w->exp_gate.type;
    if (live(s, CUDA_STAGE_UP))
        ffn_up(s, in, &w->exp_gate, &w->exp_up, k, w, up_together, trace_of(s, l, CUDA_STAGE_UP));
    mark(s, CUDA_STAGE_UP, k * (dmat_bytes(&w->exp_gate) + dmat_bytes(&w->exp_up)) + (up_together ? sh_up : 0));
    if (sh && !up_together) {
        if (live(s, CUDA_STAGE_SH_UP)) ffn_up(s, in, NULL, NULL, 0, w, true, trace_of(s, l, CUDA_STAGE_SH_UP));
        mark(s, CUDA_STAGE_SH_UP, sh_up);
    }
    const bool down_together = sh && w->sh_down.type == w->exp_down.type;
    if (live(s, CUDA_STAGE_DOWN))
        ffn_down(s, &w->exp_down, k, w, down_together, trace_of(s, l, CUDA_STAGE_DOWN));
    mark(s, CUDA_STAGE_DOWN, k * dmat_bytes(&w->exp_down) + (down_together ? sh_down : 0));
    if (sh && !down_together) {
        if (live(s, CUDA_STAGE_SH_DOWN)) ffn_down(s, NULL, 0, w, true, trace_of(s, l, CUDA_STAGE_SH_DOWN));
        mark(s, CUDA_STAGE_SH_DOWN, sh_down);
    }
}

/* What moe_ffn needs of layer l (the same shapes in every layer). */
static moe_ffn_args moe_ffn_args_of(const cuda_state *s, int l) {
    const model_config *c = &s->m->config;
    const cuda_layer *w = &s->g->layers[l];
    moe_ffn_args a;
    memset(&a, 0, sizeof a);
    a.att = act_in{s->att, NULL, 0.0f, s->q_dim};
    a.wo = w->wo;
    a.x = s->x;
    a.x_in = act_in{s->x, w->ffn_norm, c->rms_eps, c->n_embd};
    a.router = w->router;
    a.route = route_of(s);
    a.logits = s->router;
    a.route_ids = s->route_ids;
    a.route_w = s->route_w;
    a.gate = w->exp_gate, a.up = w->exp_up, a.down = w->exp_down;
    a.h = s->h;
    a.barrier = s->grid_bar;
    const int k = c->n_experts_used, blocks = s->g->n_sm; /* moe_ffn_grid_of's grid */
    a.o_lanes = moe_ffn_lanes(max_share(w->wo.rows, blocks), w->wo.units);
    a.up_lanes = moe_ffn_lanes(max_share(k * w->exp_gate.rows, blocks), w->exp_gate.units);
    a.down_lanes = moe_ffn_lanes(max_share(w->exp_down.rows, blocks), k * w->exp_down.units);
    a.trace[PHASE_O] = trace_of(s, l, CUDA_STAGE_O);
    a.trace[PHASE_ROUTER] = trace_of(s, l, CUDA_STAGE_ROUTER);
    a.trace[PHASE_GATE_UP] = trace_of(s, l, CUDA_STAGE_UP);
    a.trace[PHASE_DOWN] = trace_of(s, l, CUDA_STAGE_DOWN);
    return a;
}

/* The grid moe_ffn runs this model's MoE layers with (one block a
 * multiprocessor, each with its share of every phase's rows in shared
 * memory), or 0 where it cannot: not asked for, a shared expert, a router
 * that is not F32, o and the experts not of one format that has it, or
 * rows that do not fit. */
static int moe_ffn_grid_of(const cuda_state *s, size_t *smem) {
    const model_config *c = &s->m->config;
    if (!s->opt.moe_ffn || c->n_experts == 0 || c->n_experts_used > MAX_EXPERTS_USED || c->n_embd % 4) return 0;
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *w = &s->g->layers[l];
        const int t = w->exp_gate.type;
        if (w->has_shared || w->router.type != MOE_TYPE_F32 || w->wo.type != t || w->exp_up.type != t ||
            w->exp_down.type != t || !cuda_format_of(t)->moe_ffn.launch)
            return 0;
    }
    const moe_ffn_args a = moe_ffn_args_of(s, 0);
    const int grid = s->g->n_sm;
    *smem = moe_ffn_layout_of(a, grid).total;
    if (*smem > s->g->smem_optin || cuda_format_of(a.gate.type)->moe_ffn.occupancy(*smem) < 1) return 0;
    return grid;
}

static void moe_ffn(cuda_state *s, int l) {
    const model_config *c = &s->m->config;
    const cuda_layer *w = &s->g->layers[l];
    const moe_ffn_args a = moe_ffn_args_of(s, l);
    if (live(s, CUDA_STAGE_MOE_FFN))
        cuda_format_of(w->exp_gate.type)->moe_ffn.launch(&a, s->moe_ffn_grid, s->moe_ffn_smem, s->stream, s->opt.pdl);
    mark(s, CUDA_STAGE_MOE_FFN,
         dmat_bytes(&w->wo) + dmat_bytes(&w->router) +
             c->n_experts_used * (dmat_bytes(&w->exp_gate) + dmat_bytes(&w->exp_up) + dmat_bytes(&w->exp_down)));
}

static void head(cuda_state *s) {
    const model_config *c = &s->m->config;
    act_in in = {s->x, s->g->output_norm, c->rms_eps, c->n_embd};
    gemv_out o = {&s->g->output, s->logits, NULL};
    if (live(s, CUDA_STAGE_HEAD)) gemv(s, in, &o, 1, false, GEMV_HEAD, NULL);
    mark(s, CUDA_STAGE_HEAD, dmat_bytes(&s->g->output));
}

/* One decoded token: the whole model, top to bottom. */
static void enqueue_step(cuda_state *s) {
    embed(s);
    for (int l = 0; l < s->m->config.n_layers; l++) {
        const bool one_launch = s->moe_ffn_grid > 0;
        attention_block(s, l, !one_launch);
        if (one_launch) moe_ffn(s, l);
        else ffn_block(s, l);
    }
    head(s);
}

/* ---------------------------------------------------------------- running steps */

static moe_status set_step(cuda_state *s, int token, int pos, moe_error *err) {
    LAUNCH_PDL(false, set_step_kernel, 1, 1, 0, s->stream, s->step, token, pos);
    CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

/* Which captured step serves position pos: the attention's way changes
 * with the context's length (attention.cu). */
static int step_variant(const cuda_state *s, int pos) {
    return cuda_attention_way(pos, s->attn_head_blocks_until, s->attn_grouped_from);
}

/* The step at position pos (set on the device by set_step or by the step
 * before). */
static moe_status run_step(cuda_state *s, int pos, moe_error *err) {
    const int v = step_variant(s, pos);
    s->attn_way = v;
    if (!s->opt.graph) {
        enqueue_step(s);
        CUDA_CHECK(cudaGetLastError());
        return MOE_OK;
    }
    if (!s->graph_ready[v]) {
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
        enqueue_step(s);
        CUDA_CHECK(cudaStreamEndCapture(s->stream, &graph));
        cudaError_t e = cudaGraphInstantiate(&s->graph[v], graph, 0);
        cudaGraphDestroy(graph);
        CUDA_CHECK(e);
        s->graph_ready[v] = true;
    }
    CUDA_CHECK(cudaGraphLaunch(s->graph[v], s->stream));
    return MOE_OK;
}

moe_status cuda_forward(cuda_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                        moe_error *err) {
    const int vocab = s->m->config.n_vocab;
    if (n <= 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "no tokens to process");
    if (pos < 0 || (int64_t)pos + n > s->n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE, "positions %d..%d exceed the context of %d tokens", pos, pos + n - 1,
                             s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return moe_error_set(err, MOE_ERR_RANGE, "token id %d is outside the vocabulary of %d", tokens[i], vocab);
    if (cuda_prefill_batched(s, n)) return cuda_prefill(s, tokens, n, pos, logits, all_logits, err);
    moe_status st = MOE_OK;
    for (int i = 0; i < n && st == MOE_OK; i++) {
        if ((st = set_step(s, tokens[i], pos + i, err)) != MOE_OK || (st = run_step(s, pos + i, err)) != MOE_OK) break;
        float *out = !logits ? NULL : all_logits ? logits + (size_t)i * vocab : i == n - 1 ? logits : NULL;
        if (out) CUDA_CHECK(cudaMemcpyAsync(out, s->logits, (size_t)vocab * sizeof(float), cudaMemcpyDeviceToHost, s->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    CUDA_CHECK(cudaGetLastError());
    return st;
}

moe_status cuda_decode_greedy(cuda_state *s, int32_t token, int pos, int n, int32_t *out, float *ms, moe_error *err) {
    if (n <= 0 || pos < 0 || (int64_t)pos + n > s->n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE, "decoding %d tokens from position %d exceeds the context of %d", n, pos,
                             s->n_ctx);
    moe_status st = set_step(s, token, pos, err);
    if (st != MOE_OK) return st;
    CUDA_CHECK(cudaEventRecord(s->ev[0], s->stream));
    for (int i = 0; i < n && st == MOE_OK; i++) st = run_step(s, pos + i, err);
    CUDA_CHECK(cudaEventRecord(s->ev[1], s->stream));
    CUDA_CHECK(cudaEventSynchronize(s->ev[1]));
    if (st != MOE_OK) return st;
    if (ms) CUDA_CHECK(cudaEventElapsedTime(ms, s->ev[0], s->ev[1]));
    if (out) CUDA_CHECK(cudaMemcpy(out, s->history + pos, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

moe_status cuda_prefill_timed(cuda_state *s, const int32_t *tokens, int n, float *ms, moe_error *err) {
    if (n <= 0 || n > s->n_ctx) return moe_error_set(err, MOE_ERR_RANGE, "%d prompt tokens do not fit in %d", n, s->n_ctx);
    moe_status st = MOE_OK;
    const bool batched = cuda_prefill_batched(s, n);
    CUDA_CHECK(cudaEventRecord(s->ev[0], s->stream));
    if (batched) st = cuda_prefill(s, tokens, n, 0, NULL, false, err);
    for (int i = 0; !batched && i < n && st == MOE_OK; i++)
        if ((st = set_step(s, tokens[i], i, err)) == MOE_OK) st = run_step(s, i, err);
    CUDA_CHECK(cudaEventRecord(s->ev[1], s->stream));
    CUDA_CHECK(cudaEventSynchronize(s->ev[1]));
    if (st == MOE_OK && ms) CUDA_CHECK(cudaEventElapsedTime(ms, s->ev[0], s->ev[1]));
    return st;
}

/* The captured step is dropped when what it captured changes (profiling:
 * stages left out, the timeline's marks); the next run_step captures anew. */
static void drop_graph(cuda_state *s) {
    for (int v = 0; v < ATTN_WAYS; v++) {
        if (s->graph_ready[v]) cudaGraphExecDestroy(s->graph[v]);
        s->graph_ready[v] = false;
    }
}

/* Microseconds a token of `n` graph replays from position pos, with the
 * stages in `skip` left out of the captured step. A step the graph is
 * captured in runs first, untimed: the GPU idles while the host captures
 * and instantiates, which timed replays would count (it did until the
 * fifteenth session: bench/decode-plan.md, fact 45). */
static moe_status graph_step_us(cuda_state *s, unsigned skip, int32_t token, int pos, int n, float *us, moe_error *err) {
    if (s->skip_stages != skip) drop_graph(s);
    s->skip_stages = skip;
    const bool graph = s->opt.graph;
    s->opt.graph = true;
    float ms = 0;
    const bool captured = s->graph_ready[step_variant(s, pos)];
    moe_status st = captured ? MOE_OK : cuda_decode_greedy(s, token, pos, 1, NULL, NULL, err);
    if (st == MOE_OK) st = cuda_decode_greedy(s, token, pos, n, NULL, &ms, err);
    s->opt.graph = graph;
    *us = ms * 1e3f / n;
    return st;
}

/* What each stage costs inside the graph: the step's time less its time
 * with the stage left out (launch gaps and overlap included), interleaved
 * over reps and the median taken. */
static moe_status profile_in_graph(cuda_state *s, int32_t token, int pos, int reps, cuda_stage_profile *out,
                                   moe_error *err) {
    int stages[CUDA_STAGE_COUNT + 1], n = 0;
    stages[n++] = -1; /* the whole step */
    for (int k = 0; k < CUDA_STAGE_COUNT; k++)
        if (out->launches[k]) stages[n++] = k;
    double *t = (double *)calloc((size_t)n * reps, sizeof(double));
    if (!t) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    moe_status st = MOE_OK;
    /* the step as decoding runs it: with PDL, which the per-stage events
     * leave out (bench/decode-plan.md, fact 47) */
    const bool pdl = s->opt.pdl;
    drop_graph(s);
    s->opt.pdl = true;
    for (int r = -1; r < reps && st == MOE_OK; r++) /* r = -1: warm-up, one capture per variant */
        for (int v = 0; v < n && st == MOE_OK; v++) {
            float us = 0;
            st = graph_step_us(s, stages[v] < 0 ? 0u : 1u << stages[v], token, pos, CUDA_PROFILE_SPAN, &us, err);
            if (r >= 0) t[(size_t)v * reps + r] = us;
        }
    if (st == MOE_OK) {
        out->graph_total_us = median_sort(t, reps);
        for (int v = 1; v < n; v++) out->graph_us[stages[v]] = out->graph_total_us - median_sort(t + (size_t)v * reps, reps);
    }
    free(t);
    drop_graph(s);
    s->opt.pdl = pdl;
    s->skip_stages = 0;
    return st;
}

moe_status cuda_profile_step(cuda_state *s, int32_t token, int pos, int reps, cuda_stage_profile *out, moe_error *err) {
    memset(out, 0, sizeof *out);
    if (reps <= 0 || pos < 0 || pos + CUDA_PROFILE_SPAN > s->n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE, "profiling positions %d..%d of a context of %d", pos,
                             pos + CUDA_PROFILE_SPAN - 1, s->n_ctx);
    if (!s->prof_ev) {
        s->prof_cap = 4 + 8 * s->m->config.n_layers;
        s->prof_ev = (cudaEvent_t *)calloc((size_t)s->prof_cap, sizeof *s->prof_ev);
        s->prof_stage = (int *)calloc((size_t)s->prof_cap, sizeof *s->prof_stage);
        s->prof_bytes = (double *)calloc((size_t)s->prof_cap, sizeof *s->prof_bytes);
        if (!s->prof_ev || !s->prof_stage || !s->prof_bytes) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
        for (int i = 0; i < s->prof_cap; i++) CUDA_CHECK(cudaEventCreate(&s->prof_ev[i]));
    }
    float *per = (float *)calloc((size_t)reps * (CUDA_STAGE_COUNT + 1), sizeof(float));
    if (!per) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    moe_status st = MOE_OK;
    s->prof_pos = pos;
    s->attn_way = step_variant(s, pos);
    for (int r = -1; r < reps && st == MOE_OK; r++) { /* r = -1: warm-up */
        if ((st = set_step(s, token, pos, err)) != MOE_OK) break;
        s->prof_on = true;
        s->prof_n = 0;
        mark(s, -1, 0);
        enqueue_step(s); /* launch by launch, no graph */
        s->prof_on = false;
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaEventSynchronize(s->prof_ev[s->prof_n - 1]);
        if (e != cudaSuccess) {
            st = moe_error_set(err, MOE_ERR_IO, "profiled step failed: %s", cudaGetErrorName(e));
            break;
        }
        if (r < 0) continue;
        float *row = per + (size_t)r * (CUDA_STAGE_COUNT + 1);
        for (int i = 1; i < s->prof_n; i++) {
            float ms = 0;
            if (cudaEventElapsedTime(&ms, s->prof_ev[i - 1], s->prof_ev[i]) != cudaSuccess) ms = 0;
            row[s->prof_stage[i]] += ms * 1e3f;
            if (r == 0) {
                out->bytes[s->prof_stage[i]] += s->prof_bytes[i];
                out->launches[s->prof_stage[i]]++;
            }
        }
        float ms = 0;
        if (cudaEventElapsedTime(&ms, s->prof_ev[0], s->prof_ev[s->prof_n - 1]) != cudaSuccess) ms = 0;
        row[CUDA_STAGE_COUNT] = ms * 1e3f;
    }
    if (st == MOE_OK) {
        double *col = (double *)malloc((size_t)reps * sizeof(double));
        for (int k = 0; k <= CUDA_STAGE_COUNT && col; k++) {
            for (int r = 0; r < reps; r++) col[r] = per[(size_t)r * (CUDA_STAGE_COUNT + 1) + k];
            double med = median_sort(col, reps);
            if (k < CUDA_STAGE_COUNT) out->us[k] = med;
            else out->total_us = med;
        }
        free(col);
        for (int k = 0; k < CUDA_STAGE_COUNT; k++) out->names[k] = stage_names[k];
        out->n_stages = CUDA_STAGE_COUNT;
        out->pos = pos;
        out->reps = reps;
    }
    free(per);
    out->graph_reps = reps < 5 ? reps : 5; /* each variant is captured anew: fewer */
    return st == MOE_OK ? profile_in_graph(s, token, pos, out->graph_reps, out, err) : st;
}

/* ---------------------------------------------------------------- the timeline of a layer */

enum { TL_ENTRY_FIRST, TL_ENTRY_LAST, TL_WAITED_FIRST, TL_WAITED_LAST, TL_STAGED_MEDIAN, TL_STAGED_LAST,
       TL_WORKED_MEDIAN, TL_WORKED_LAST, TL_DONE, TL_FIELDS };

/* One launch's marks (blocks x TRACE_POINTS, 0: not marked) as the
 * timeline's fields, microseconds from t0; the number of blocks that
 * entered. `tmp`: room for `blocks` values. */
static int timeline_fields(const uint64_t *marks, int blocks, uint64_t t0, double *field, double *tmp) {
    auto us = [&](uint64_t t) { return ((double)t - (double)t0) * 1e-3; };
    int entered = 0;
    double first[TRACE_POINTS], last[TRACE_POINTS], median[TRACE_POINTS];
    for (int p = 0; p < TRACE_POINTS; p++) {
        int n = 0;
        for (int b = 0; b < blocks; b++) {
            const uint64_t t = marks[(size_t)b * TRACE_POINTS + p];
            if (t) tmp[n++] = us(t);
        }
        median[p] = n ? median_sort(tmp, n) : NAN; /* sorted: the first and last marks at the ends */
        first[p] = n ? tmp[0] : NAN, last[p] = n ? tmp[n - 1] : NAN;
        if (p == TRACE_ENTRY) entered = n;
    }
    /* the launch's end: its last work mark or epilogue mark, whichever is later */
    const double done = isnan(last[TRACE_EXIT]) ? last[TRACE_WORKED] : fmax(last[TRACE_WORKED], last[TRACE_EXIT]);
    const double v[TL_FIELDS] = {first[TRACE_ENTRY],   last[TRACE_ENTRY],   first[TRACE_WAITED],
                                 last[TRACE_WAITED],   median[TRACE_STAGED], last[TRACE_STAGED],
                                 median[TRACE_WORKED], last[TRACE_WORKED],  done};
    memcpy(field, v, sizeof v);
    return entered;
}

/* The smallest non-zero difference between two marks of one replay. */
static double timer_step_ns(uint64_t *marks, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (marks[i]) marks[k++] = marks[i];
    qsort(marks, k, sizeof *marks, [](const void *a, const void *b) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y ? 1 : 0;
    });
    double step = INFINITY;
    for (size_t i = 1; i < k; i++)
        if (marks[i] > marks[i - 1]) step = fmin(step, (double)(marks[i] - marks[i - 1]));
    return step;
}

/* Replays the traced graph `reps` times at pos and takes each field's
 * median; `vals`: reps x CUDA_STAGE_COUNT x TL_FIELDS. */
static moe_status trace_replays(cuda_state *s, int32_t token, int pos, int reps, double *vals, int *blocks,
                                double *resolution, moe_error *err) {
    const size_t n = (size_t)CUDA_STAGE_COUNT * s->trace_blocks * TRACE_POINTS;
    uint64_t *marks = (uint64_t *)malloc(n * sizeof *marks);
    double *tmp = (double *)malloc((size_t)s->trace_blocks * sizeof *tmp);
    if (!marks || !tmp) {
        free(marks), free(tmp);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    moe_status st = MOE_OK;
    for (int r = -1; r < reps && st == MOE_OK; r++) { /* r = -1: warm-up (and the capture) */
        cudaError_t e = cudaMemsetAsync(s->trace, 0, n * sizeof *marks, s->stream);
        if (e == cudaSuccess && (st = set_step(s, token, pos, err)) == MOE_OK && (st = run_step(s, pos, err)) == MOE_OK)
            e = cudaMemcpyAsync(marks, s->trace, n * sizeof *marks, cudaMemcpyDeviceToHost, s->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
        if (e != cudaSuccess) st = moe_error_set(err, MOE_ERR_IO, "traced step failed: %s", cudaGetErrorName(e));
        if (st != MOE_OK || r < 0) continue;
        /* t0: the first wait that returned in the layer's first launch */
        uint64_t t0 = 0;
        for (int k = 0; k < CUDA_STAGE_COUNT && !t0; k++)
            for (int b = 0; b < s->trace_blocks; b++) {
                const uint64_t t = marks[((size_t)k * s->trace_blocks + b) * TRACE_POINTS + TRACE_WAITED];
                if (t && (!t0 || t < t0)) t0 = t;
            }
        for (int k = 0; k < CUDA_STAGE_COUNT; k++)
            blocks[k] = timeline_fields(marks + (size_t)k * s->trace_blocks * TRACE_POINTS, s->trace_blocks, t0,
                                        vals + ((size_t)r * CUDA_STAGE_COUNT + k) * TL_FIELDS, tmp);
        *resolution = fmin(*resolution, timer_step_ns(marks, n));
    }
    free(marks);
    free(tmp);
    return st;
}

moe_status cuda_timeline_layer(cuda_state *s, int32_t token, int pos, int layer, int reps, cuda_timeline *out,
                               moe_error *err) {
    memset(out, 0, sizeof *out);
    const model_config *c = &s->m->config;
    if (reps <= 0 || layer < 0 || layer >= c->n_layers || pos < 0 || pos >= s->n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE, "no layer %d or position %d to trace", layer, pos);
    if (!s->trace) {
        int most = s->max_grid;
        if (c->n_kv_heads * s->attn_splits > most) most = c->n_kv_heads * s->attn_splits;
        if (c->n_heads * s->attn_head_splits > most) most = c->n_heads * s->attn_head_splits;
        if (c->n_experts > most) most = c->n_experts;
        if (s->moe_ffn_grid > most) most = s->moe_ffn_grid;
        s->trace_blocks = most;
        CUDA_CHECK(cudaMalloc(&s->trace, (size_t)CUDA_STAGE_COUNT * most * TRACE_POINTS * sizeof(uint64_t)));
    }
    double *vals = (double *)malloc((size_t)reps * CUDA_STAGE_COUNT * TL_FIELDS * sizeof(double));
    double *col = (double *)malloc((size_t)reps * sizeof(double));
    if (!vals || !col) {
        free(vals), free(col);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    drop_graph(s);
    const bool graph = s->opt.graph;
    s->opt.graph = true;
    s->trace_on = true, s->trace_layer = layer;
    int blocks[CUDA_STAGE_COUNT];
    out->resolution_ns = INFINITY;
    moe_status st = trace_replays(s, token, pos, reps, vals, blocks, &out->resolution_ns, err);
    s->trace_on = false;
    s->opt.graph = graph;
    drop_graph(s);
    for (int k = 0; st == MOE_OK && k < CUDA_STAGE_COUNT; k++) {
        if (!blocks[k]) continue;
        double f[TL_FIELDS];
        for (int i = 0; i < TL_FIELDS; i++) {
            for (int r = 0; r < reps; r++) col[r] = vals[((size_t)r * CUDA_STAGE_COUNT + k) * TL_FIELDS + i];
            f[i] = median_sort(col, reps);
        }
        out->stages[out->n++] = cuda_timeline_stage{k, blocks[k], f[TL_ENTRY_FIRST], f[TL_ENTRY_LAST],
                                                    f[TL_WAITED_FIRST], f[TL_WAITED_LAST], f[TL_STAGED_MEDIAN],
                                                    f[TL_STAGED_LAST], f[TL_WORKED_MEDIAN], f[TL_WORKED_LAST],
                                                    f[TL_DONE]};
    }
    out->layer = layer, out->pos = pos, out->reps = reps;
    free(vals);
    free(col);
    return st;
}

/* ---------------------------------------------------------------- the state */


cuda_options cuda_default_options(void) {
    cuda_options o;
    o.graph = env_flag("MOE_CUDA_GRAPH", true);
    o.pdl = env_flag("MOE_CUDA_PDL", true); /* MOE_CUDA_PDL=0: plain graph edges */
    o.moe_ffn = env_flag("MOE_CUDA_MOE_FFN", false);
    const char *mb = getenv("MOE_CUDA_STREAM_MB"); /* stream products of this many MB or more */
    o.gemv_stream_min = mb && *mb ? (long long)(atof(mb) * (1 << 20)) : 0;
    return o;
}

/* Carve `bytes` (256-aligned) from a running offset; with base NULL only count. */
static void *carve(uint8_t *base, size_t *used, size_t bytes) {
    size_t at = (*used + 255) & ~(size_t)255;
    *used = at + bytes;
    return base ? base + at : NULL;
}

static void lay_out(cuda_state *s, uint8_t *base, size_t *used) {
    const model_config *c = &s->m->config;
    const int G = c->n_heads / c->n_kv_heads;
    const size_t cache = (size_t)c->n_layers * s->n_ctx * s->kv_dim;
    *used = 0;
    s->k_cache = carve(base, used, cache * cuda_kv_element_bytes(s));
    s->v_cache = carve(base, used, cache * cuda_kv_element_bytes(s));
    s->x = (float *)carve(base, used, (size_t)c->n_embd * sizeof(float));
    s->qkv = (float *)carve(base, used, (size_t)(s->q_dim + 2 * s->kv_dim) * sizeof(float));
    s->att = (float *)carve(base, used, (size_t)s->q_dim * sizeof(float));
    s->router = (float *)carve(base, used, (size_t)(c->n_experts + 1) * sizeof(float));
    s->route_w = (float *)carve(base, used, (size_t)MAX_EXPERTS_USED * sizeof(float));
    s->route_ids = (int *)carve(base, used, (size_t)MAX_EXPERTS_USED * sizeof(int));
    s->shgate = (float *)carve(base, used, sizeof(float));
    s->h = (float *)carve(base, used, (size_t)s->h_len * sizeof(float));
    s->logits = (float *)carve(base, used, (size_t)c->n_vocab * sizeof(float));
    const size_t n_parts = (size_t)c->n_kv_heads * s->attn_splits * G;
    s->attn_part_out = (float *)carve(base, used, n_parts * c->head_dim * sizeof(float));
    s->attn_part_ml = (float *)carve(base, used, n_parts * 2 * sizeof(float));
    s->part_val = (float *)carve(base, used, (size_t)s->max_grid * sizeof(float));
    s->part_idx = (int *)carve(base, used, (size_t)s->max_grid * sizeof(int));
    s->step = (int *)carve(base, used, 2 * sizeof(int));
    s->history = (int *)carve(base, used, (size_t)(s->n_ctx + 1) * sizeof(int));
    s->counters = (unsigned *)carve(base, used, (size_t)(1 + c->n_heads) * sizeof(unsigned));
    s->grid_bar = (uint64_t *)carve(base, used, sizeof(uint64_t));
    s->rope = (float *)carve(base, used, (size_t)s->n_ctx * c->n_rot * sizeof(float));
}

/* The largest dynamic shared memory any launch of this model asks for
 * (but those that stream their rows: cuda_allow_stream_smem). */
static size_t max_smem(const cuda_state *s) {
    const model_config *c = &s->m->config;
    size_t most = 0;
    const int inputs[] = {c->n_embd, s->q_dim, s->h_len};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        size_t b = gemv_smem(ACT_F32, inputs[i]); /* f32 staging is the largest */
        if (b > most) most = b;
    }
    return most;
}

static moe_status upload_rope_table(cuda_state *s, moe_error *err) {
    const model_config *c = &s->m->config;
    const size_t n = (size_t)s->n_ctx * c->n_rot;
    float *table = (float *)malloc(n * sizeof(float));
    if (!table) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory for the RoPE table (%zu floats)", n);
    cuda_rope_table(c, s->m->rope_freqs.data, s->n_ctx, table);
    cudaError_t e = cudaMemcpy(s->rope, table, n * sizeof(float), cudaMemcpyHostToDevice);
    free(table);
    CUDA_CHECK(e);
    return MOE_OK;
}

/* The kernels' shared memory limits, the state's memory (need bytes), its
 * stream and events; *failed names the step that failed. */
static cudaError_t set_up_device(cuda_state *s, size_t smem, size_t need, const char **failed) {
    cudaError_t e;
    *failed = "the kernels' shared memory limit";
    if ((e = cuda_allow_smem_all((int)smem)) != cudaSuccess) return e;
    /* only where products stream (MOE_CUDA_STREAM_MB): a streamed instance
     * with static shared memory fails here (cuda_allow_stream_smem) */
    *failed = "the streamed products' shared memory limit";
    if (s->opt.gemv_stream_min > 0 && (e = cuda_allow_stream_smem(s->g->smem_optin)) != cudaSuccess) return e;
    *failed = "the allocation";
    if ((e = cudaMalloc(&s->mem, need)) != cudaSuccess) return e;
    *failed = "a stream or event";
    if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess) return e;
    if ((e = cudaEventCreate(&s->ev[0])) != cudaSuccess) return e;
    return cudaEventCreate(&s->ev[1]);
}

moe_status cuda_state_new(cuda_model *g, int n_ctx, const cuda_options *opts, cuda_state **out, moe_error *err) {
    *out = NULL;
    const model *m = g->m;
    const model_config *c = &m->config;
    if (n_ctx <= 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "context (%d) must be positive", n_ctx);
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!s) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    s->g = g;
    s->m = m;
    s->n_ctx = n_ctx;
    s->opt = opts ? *opts : cuda_default_options();
    s->q_dim = c->n_heads * c->head_dim;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    if (c->n_experts) {
        s->n_ff_routed = c->n_experts_used * c->n_ff_expert;
        s->h_len = s->n_ff_routed + c->n_ff_shared;
    } else {
        s->n_ff_routed = c->n_ff;
        s->h_len = c->n_ff;
    }
    const int G = c->n_heads / c->n_kv_heads;
    const bool f16 = s->opt.kv_f16;
    s->attn_splits = cuda_attention_splits(g->n_sm, c->n_heads, c->n_kv_heads, c->head_dim, false, f16);
    s->attn_head_splits = cuda_attention_splits(g->n_sm, c->n_heads, c->n_kv_heads, c->head_dim, true, f16);
    s->attn_grouped_from = cuda_attention_grouped_from(G, c->head_dim, s->attn_splits, f16);
    s->attn_head_blocks_until = cuda_attention_head_blocks_until(G, c->head_dim);
    s->max_grid = g->n_sm * 32;

    size_t need = 0, free_b = 0, total_b = 0;
    lay_out(s, NULL, &need);
    moe_status st = MOE_OK;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        free(s);
        CUDA_CHECK(e);
    }
    if (need > free_b) {
        free(s);
        return moe_error_set(err, MOE_ERR_NOMEM,
                             "a context of %d positions needs %.2f GB of GPU memory (KV cache %.2f GB) but %.2f GB are "
                             "free on %s (lower --ctx-size)",
                             n_ctx, need / 1e9, 2.0 * c->n_layers * n_ctx * s->kv_dim * cuda_kv_element_bytes(s) / 1e9, free_b / 1e9,
                             g->device_name);
    }
    size_t smem = max_smem(s);
    if (smem > g->smem_optin) {
        free(s);
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "the model's activations need %zu bytes of shared memory per block, the GPU has %zu", smem,
                             g->smem_optin);
    }
    const char *failed = NULL;
    if ((e = set_up_device(s, smem, need, &failed)) != cudaSuccess) {
        (void)cudaGetLastError();
        st = moe_error_set(err, e == cudaErrorMemoryAllocation ? MOE_ERR_NOMEM : MOE_ERR_IO,
                           "cannot set up the GPU state (%.2f GB): %s: %s", need / 1e9, failed, cudaGetErrorName(e));
        cuda_state_free(s);
        return st;
    }
    s->bytes = need;
    lay_out(s, s->mem, &need);
    /* Zero everything (counters must start at 0; no stale NaN in the cache). */
    e = cudaMemset(s->mem, 0, s->bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cuda_state_free(s);
        return moe_error_set(err, MOE_ERR_IO, "cannot clear the GPU state: %s", cudaGetErrorName(e));
    }
    s->moe_ffn_grid = moe_ffn_grid_of(s, &s->moe_ffn_smem);
    if ((st = upload_rope_table(s, err)) != MOE_OK) {
        cuda_state_free(s);
        return st;
    }
    *out = s;
    return MOE_OK;
}

void cuda_state_free(cuda_state *s) {
    if (!s) return;
    drop_graph(s);
    for (int i = 0; s->prof_ev && i < s->prof_cap; i++)
        if (s->prof_ev[i]) cudaEventDestroy(s->prof_ev[i]);
    free(s->prof_ev);
    free(s->prof_stage);
    free(s->prof_bytes);
    if (s->ev[0]) cudaEventDestroy(s->ev[0]);
    if (s->ev[1]) cudaEventDestroy(s->ev[1]);
    cuda_prefill_free(s);
    cuda_top_free(s);
    if (s->trace) cudaFree(s->trace);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->mem) cudaFree(s->mem);
    free(s);
}

size_t cuda_state_bytes(const cuda_state *s) { return s->bytes; }
bool cuda_state_one_launch_ffn(const cuda_state *s) { return s->moe_ffn_grid > 0; }

/* ---------------------------------------------------------------- bandwidth */

__global__ void fill_kernel(uint4 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned v = (unsigned)i * 2654435761u + 12345u;
        p[i] = uint4{v, v ^ 0x5bd1e995u, v + 0x9e3779b9u, ~v};
    }
}

/* Folds the buffer with 16-byte loads, four in flight per thread. */
__global__ void __launch_bounds__(256) read_kernel(const uint4 *p, size_t n, unsigned *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = ldg16(p + i), b = ldg16(p + i + stride), c = ldg16(p + i + 2 * stride), d = ldg16(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = ldg16(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc; /* keeps the loads; practically never taken */
}

moe_status cuda_read_bandwidth(size_t bytes, int runs, double *gbps, moe_error *err) {
    if (!cuda_available()) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA GPU found");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    size_t n = bytes / 16;
    uint4 *buf = NULL;
    unsigned *sink = NULL;
    cudaEvent_t a = NULL, b = NULL;
    moe_status st = MOE_OK;
    cudaError_t e = cudaMalloc(&buf, n * 16);
    if (e == cudaSuccess) e = cudaMalloc(&sink, sizeof(unsigned));
    if (e == cudaSuccess) e = cudaEventCreate(&a);
    if (e == cudaSuccess) e = cudaEventCreate(&b);
    if (e == cudaSuccess) {
        LAUNCH(fill_kernel, prop.multiProcessorCount * 8, 256, 0, 0, buf, n);
        const int grid = prop.multiProcessorCount * 8;
        for (int r = -2; r < runs && e == cudaSuccess; r++) {
            cudaEventRecord(a, 0);
            LAUNCH(read_kernel, grid, 256, 0, 0, buf, n, sink);
            cudaEventRecord(b, 0);
            e = cudaEventSynchronize(b);
            float ms = 0;
            if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
            if (r >= 0 && e == cudaSuccess) gbps[r] = (double)(n * 16) / (ms * 1e-3) / 1e9;
        }
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = moe_error_set(err, e == cudaErrorMemoryAllocation ? MOE_ERR_NOMEM : MOE_ERR_IO,
                           "read-bandwidth probe over %.2f GB failed: %s", bytes / 1e9, cudaGetErrorName(e));
    }
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaFree(sink);
    cudaFree(buf);
    return st;
}

moe_status cuda_memory_info(size_t *used, size_t *total, moe_error *err) {
    size_t free_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, total));
    *used = *total - free_b;
    return MOE_OK;
}

/* Debugging: copy an activation buffer of the state to the host ("x",
 * "qkv", "att", "h", "logits"); n floats. */
moe_status cuda_state_peek(cuda_state *s, const char *what, float *out, int n, moe_error *err) {
    const float *src = !strcmp(what, "x") ? s->x : !strcmp(what, "qkv") ? s->qkv : !strcmp(what, "att") ? s->att
                       : !strcmp(what, "h") ? s->h : !strcmp(what, "logits") ? s->logits : NULL;
    if (!src) return moe_error_set(err, MOE_ERR_INVALID_ARG, "no buffer '%s'", what);
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    CUDA_CHECK(cudaMemcpy(out, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    return MOE_OK;
}
