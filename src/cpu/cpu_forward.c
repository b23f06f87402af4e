/*
 * cpu_forward.c — one forward pass over a batch of tokens, top to bottom:
 *
 *   embedding rows
 *   per layer:
 *     RMSNorm -> q, k, v (+bias) -> q/k norm -> RoPE -> append k, v to cache
 *     causal attention over the cache (GQA) -> o -> + residual
 *     RMSNorm -> dense SwiGLU FFN, or router -> top-k -> experts (+ shared)
 *     -> + residual
 *   final RMSNorm -> output head -> logits
 */
#include "cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/thread_pool.h"
#include "cpu/cpu_attention.h"
#include "cpu/cpu_matmul.h"
#include "cpu/cpu_ops.h"

struct cpu_state {
    const model *m;
    thread_pool *pool;
    int n_ctx, max_batch;
    int q_dim, kv_dim, ff_dim;
    cpu_attention kv; /* the KV cache and the attention over it */
    /* batch activations, max_batch rows each */
    float *x;        /* (B, n_embd) residual stream */
    float *xn;       /* (B, n_embd) normalised input of a block (norm_rows, products_input) */
    float *xn_scale; /* (B) with products_input, each row's RMS scale */
    float *q;        /* (B, q_dim) */
    float *k, *v;  /* (B, kv_dim) */
    float *att;    /* (B, q_dim) attention output */
    float *gate, *up; /* (B * slots, ff_dim) FFN hidden */
    float *ffn_out;   /* (B, n_embd) */
    float *gathered;  /* (B, n_embd) the inputs of the tokens routed to one expert */
    float *expert_out; /* (B * n_experts_used, n_embd) */
    float *router;    /* (B, n_experts) */
    int *route_ids;   /* (B, n_experts_used) */
    float *route_w;   /* (B, n_experts_used) */
    quantized_rows xq, hq;
};

/* ------------------------------------------------------------ setup */

static float *alloc_floats(size_t n, bool *ok) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) *ok = false;
    return p;
}

moe_status cpu_state_new(const model *m, const cpu_state_params *p, cpu_state **out, moe_error *err) {
    const model_config *c = &m->config;
    const int n_ctx = p->n_ctx, max_batch = p->max_batch;
    *out = NULL;
    if (n_ctx <= 0 || max_batch <= 0)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "context (%d) and batch (%d) must be positive", n_ctx, max_batch);
    if (p->kv_type != MOE_KV_F32 && p->kv_type != MOE_KV_F16)
        return moe_error_set(err, MOE_ERR_INVALID_ARG, "unknown KV cache type %d (f32 or f16)", (int)p->kv_type);
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    s->m = m;
    s->n_ctx = n_ctx;
    s->max_batch = max_batch;
    s->q_dim = c->n_heads * c->head_dim;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    int k = c->n_experts ? c->n_experts_used : 1;
    s->ff_dim = c->n_experts ? (c->n_ff_expert > c->n_ff_shared ? c->n_ff_expert : c->n_ff_shared) : c->n_ff;
    s->pool = thread_pool_new(p->n_threads);
    bool ok = s->pool != NULL;
    ok = ok && cpu_attention_init(&s->kv, c, n_ctx, max_batch, thread_pool_size(s->pool), p->kv_type);
    size_t B = (size_t)max_batch;
    s->x = alloc_floats(B * c->n_embd, &ok);
    s->xn = alloc_floats(B * c->n_embd, &ok);
    s->xn_scale = alloc_floats(B, &ok);
    s->q = alloc_floats(B * s->q_dim, &ok);
    s->k = alloc_floats(B * s->kv_dim, &ok);
    s->v = alloc_floats(B * s->kv_dim, &ok);
    s->att = alloc_floats(B * s->q_dim, &ok);
    s->gate = alloc_floats(B * k * s->ff_dim, &ok);
    s->up = alloc_floats(B * k * s->ff_dim, &ok);
    s->ffn_out = alloc_floats(B * c->n_embd, &ok);
    s->gathered = alloc_floats(B * c->n_embd, &ok);
    s->expert_out = alloc_floats(B * k * c->n_embd, &ok);
    s->router = alloc_floats(B * (c->n_experts ? c->n_experts : 1), &ok);
    s->route_w = alloc_floats(B * k, &ok);
    s->route_ids = calloc(B * k, sizeof *s->route_ids);
    if (!ok || !s->route_ids) {
        cpu_state_free(s);
        return moe_error_set(err, MOE_ERR_NOMEM, "cannot allocate the CPU state (KV cache of %d positions: %.1f MB)",
                             n_ctx, s->kv.format ? cpu_attention_cache_bytes(&s->kv) / 1e6 : 0.0);
    }
    *out = s;
    return MOE_OK;
}

void cpu_state_free(cpu_state *s) {
    if (!s) return;
    thread_pool_free(s->pool);
    cpu_attention_free(&s->kv);
    float *buffers[] = {s->x,   s->xn,      s->xn_scale, s->q,          s->k,      s->v,      s->att,
                        s->gate, s->up,     s->ffn_out,  s->gathered,   s->expert_out, s->router, s->route_w};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) free(buffers[i]);
    free(s->route_ids);
    quantized_rows_free(&s->xq);
    quantized_rows_free(&s->hq);
    free(s);
}

int cpu_state_n_ctx(const cpu_state *s) { return s->n_ctx; }

/* ------------------------------------------------------------ helpers */

/* y (n rows of w->rows) = w x, x being n rows of w->cols. */
static int matmul(cpu_state *s, const matrix *w, const float *x, int n, int64_t x_stride, float *y) {
    if (cpu_quantize_rows(s->pool, &s->xq, w->type, x, n, w->cols, x_stride) != 0) return -1;
    cpu_matmul(s->pool, w, &s->xq, y, w->rows);
    return 0;
}

static void norm_rows(float *out, const float *x, const vec *w, int n, int64_t dim, float eps) {
    for (int t = 0; t < n; t++) cpu_rmsnorm(out + t * dim, x + t * dim, w->data, dim, eps);
}

/* The input of the matrix products behind a norm, as the GPU's gemv_kernel
 * stages it: out = x * weight, the RMS scale of each row to scale[t], which
 * multiplies the row's products (matmul_normed) instead of the row. Its
 * codes are those of the full norm up to float rounding; the reference
 * quantizes the same values as the GPU (kernels.cuh, stage_act). */
static void products_input(float *out, float *scale, const float *x, const vec *w, int n, int64_t dim, float eps) {
    for (int t = 0; t < n; t++) {
        scale[t] = cpu_rms_scale(x + t * dim, dim, eps);
        for (int64_t i = 0; i < dim; i++) out[t * dim + i] = x[t * dim + i] * w->data[i];
    }
}

/* y = w x for x from products_input: row t's products times scale[t]. */
static int matmul_normed(cpu_state *s, const matrix *w, const float *x, const float *scale, int n, float *y) {
    if (matmul(s, w, x, n, w->cols, y)) return -1;
    for (int t = 0; t < n; t++)
        for (int64_t i = 0; i < w->rows; i++) y[t * w->rows + i] *= scale[t];
    return 0;
}

static void add_bias(float *y, const vec *b, int n) {
    if (!b->data) return;
    for (int t = 0; t < n; t++)
        for (int64_t i = 0; i < b->n; i++) y[t * b->n + i] += b->data[i];
}

/* ------------------------------------------------------------ attention */

static void qk_norm_and_rope(cpu_state *s, const layer_weights *w, int n, int pos) {
    const model_config *c = &s->m->config;
    const float *factors = s->m->rope_freqs.data;
    for (int t = 0; t < n; t++) {
        float *q = s->q + (int64_t)t * s->q_dim, *k = s->k + (int64_t)t * s->kv_dim;
        if (c->arch->qk_norm == QK_NORM_FULL) {
            cpu_rmsnorm(q, q, w->q_norm.data, s->q_dim, c->rms_eps);
            cpu_rmsnorm(k, k, w->k_norm.data, s->kv_dim, c->rms_eps);
        } else if (c->arch->qk_norm == QK_NORM_PER_HEAD) {
            for (int h = 0; h < c->n_heads; h++) cpu_rmsnorm(q + h * c->head_dim, q + h * c->head_dim, w->q_norm.data, c->head_dim, c->rms_eps);
            for (int h = 0; h < c->n_kv_heads; h++) cpu_rmsnorm(k + h * c->head_dim, k + h * c->head_dim, w->k_norm.data, c->head_dim, c->rms_eps);
        }
        cpu_rope(q, c->n_heads, c->head_dim, c->n_rot, pos + t, c->rope_base, c->rope_freq_scale, factors, c->arch->rope);
        cpu_rope(k, c->n_kv_heads, c->head_dim, c->n_rot, pos + t, c->rope_base, c->rope_freq_scale, factors, c->arch->rope);
    }
}

static int attention_block(cpu_state *s, int l, int n, int pos) {
    const model_config *c = &s->m->config;
    const layer_weights *w = &s->m->layers[l];
    products_input(s->xn, s->xn_scale, s->x, &w->attn_norm, n, c->n_embd, c->rms_eps);
    if (matmul_normed(s, &w->wq, s->xn, s->xn_scale, n, s->q) || matmul_normed(s, &w->wk, s->xn, s->xn_scale, n, s->k) ||
        matmul_normed(s, &w->wv, s->xn, s->xn_scale, n, s->v))
        return -1;
    add_bias(s->q, &w->bq, n);
    add_bias(s->k, &w->bk, n);
    add_bias(s->v, &w->bv, n);
    qk_norm_and_rope(s, w, n, pos);
    /* appended first: an f16 cache's attention sees the rounded rows, as later steps do */
    cpu_attention_append(&s->kv, l, pos, n, s->k, s->v);
    cpu_attention_run(&s->kv, s->pool, l, pos, n, s->q, s->att);
    if (matmul(s, &w->wo, s->att, n, s->q_dim, s->ffn_out)) return -1;
    for (int64_t i = 0; i < (int64_t)n * c->n_embd; i++) s->x[i] += s->ffn_out[i];
    return 0;
}

/* ------------------------------------------------------------ FFN */

/* out (n rows of n_embd) = down(silu(gate x) * up x) for a dense or shared
 * expert. */
static int swiglu_ffn(cpu_state *s, const matrix *gate, const matrix *up, const matrix *down, const float *x, int n,
                      float *out) {
    int64_t ff = gate->rows;
    if (matmul(s, gate, x, n, gate->cols, s->gate) || matmul(s, up, x, n, up->cols, s->up)) return -1;
    cpu_swiglu(s->gate, s->gate, s->up, (int64_t)n * ff);
    return matmul(s, down, s->gate, n, ff, out);
}

/* Router logits -> the k experts of each token and their weights. */
static void route_tokens(cpu_state *s, int n) {
    const model_config *c = &s->m->config;
    int k = c->n_experts_used;
    for (int t = 0; t < n; t++)
        cpu_route(s->router + (int64_t)t * c->n_experts, c->n_experts, k, c->gating == GATING_SIGMOID, c->norm_topk,
                  c->expert_weights_scale, s->route_ids + (int64_t)t * k, s->route_w + (int64_t)t * k);
}

static matrix expert_matrix(const expert_set *set, int e) {
    return (matrix){set->data[e], set->type, set->rows, set->cols, set->row_bytes};
}

/* Routed experts, grouped: each expert runs once over the tokens that chose
 * it, its rows read once for all of them. Outputs land in expert_out at
 * (token, slot) and are summed with the routing weights afterwards. */
static int run_experts(cpu_state *s, const layer_weights *w, int n) {
    const model_config *c = &s->m->config;
    int k = c->n_experts_used;
    int64_t ff = c->n_ff_expert, d = c->n_embd;
    int *slots = malloc((size_t)n * k * sizeof *slots);
    if (!slots) return -1;
    int status = 0;
    for (int e = 0; e < c->n_experts && status == 0; e++) {
        int m = 0; /* the (token, slot) pairs routed to e; a token picks e at most once */
        for (int i = 0; i < n * k; i++)
            if (s->route_ids[i] == e) slots[m++] = i;
        if (m == 0) continue;
        for (int j = 0; j < m; j++)
            memcpy(s->gathered + j * d, s->xn + (int64_t)(slots[j] / k) * d, (size_t)d * sizeof(float));
        matrix gate = expert_matrix(&w->exp_gate, e), up = expert_matrix(&w->exp_up, e);
        matrix down = expert_matrix(&w->exp_down, e);
        status = matmul(s, &gate, s->gathered, m, d, s->gate) || matmul(s, &up, s->gathered, m, d, s->up);
        if (status) break;
        cpu_swiglu(s->gate, s->gate, s->up, (int64_t)m * ff);
        status = matmul(s, &down, s->gate, m, ff, s->ffn_out);
        for (int j = 0; j < m && !status; j++)
            memcpy(s->expert_out + (int64_t)slots[j] * d, s->ffn_out + j * d, (size_t)d * sizeof(float));
    }
    free(slots);
    return status;
}

static float sigmoid_dot(const float *a, const float *b, int64_t n) {
    double dot = 0;
    for (int64_t i = 0; i < n; i++) dot += (double)a[i] * b[i];
    return (float)(1.0 / (1.0 + exp(-dot)));
}

/* The router multiplies as the GPU's do (products_input: gemv_kernel, and
 * float.cu's router_kernel for an F32 router); the experts take the fully
 * normalised input, as ffn_up stages it. */
static int moe_ffn(cpu_state *s, const layer_weights *w, int n) {
    const model_config *c = &s->m->config;
    int k = c->n_experts_used;
    int64_t d = c->n_embd;
    products_input(s->xn, s->xn_scale, s->x, &w->ffn_norm, n, d, c->rms_eps);
    if (matmul_normed(s, &w->router, s->xn, s->xn_scale, n, s->router)) return -1;
    route_tokens(s, n);
    norm_rows(s->xn, s->x, &w->ffn_norm, n, d, c->rms_eps);
    if (run_experts(s, w, n)) return -1;
    for (int t = 0; t < n; t++) {
        float *x = s->x + t * d;
        for (int j = 0; j < k; j++) {
            float weight = s->route_w[t * k + j];
            const float *y = s->expert_out + ((int64_t)t * k + j) * d;
            for (int64_t i = 0; i < d; i++) x[i] += weight * y[i];
        }
    }
    if (!w->sh_gate.data) return 0;
    if (swiglu_ffn(s, &w->sh_gate, &w->sh_up, &w->sh_down, s->xn, n, s->ffn_out)) return -1;
    for (int t = 0; t < n; t++) {
        float g = w->sh_gate_inp.data ? sigmoid_dot(s->xn + t * d, w->sh_gate_inp.data, d) : 1.0f;
        for (int64_t i = 0; i < d; i++) s->x[t * d + i] += g * s->ffn_out[t * d + i];
    }
    return 0;
}

static int ffn_block(cpu_state *s, int l, int n) {
    const model_config *c = &s->m->config;
    const layer_weights *w = &s->m->layers[l];
    if (c->n_experts) return moe_ffn(s, w, n);
    norm_rows(s->xn, s->x, &w->ffn_norm, n, c->n_embd, c->rms_eps);
    if (swiglu_ffn(s, &w->ffn_gate, &w->ffn_up, &w->ffn_down, s->xn, n, s->ffn_out)) return -1;
    for (int64_t i = 0; i < (int64_t)n * c->n_embd; i++) s->x[i] += s->ffn_out[i];
    return 0;
}

/* ------------------------------------------------------------ the pass */

static void embed(cpu_state *s, const int32_t *tokens, int n) {
    const matrix *e = &s->m->token_embd;
    const quant_format *f = quant_format_of(e->type);
    for (int t = 0; t < n; t++) f->dequantize(e->data + (size_t)tokens[t] * e->row_bytes, s->x + (int64_t)t * e->cols, e->cols);
}

/* Logits of the last `n_out` of the n rows. */
static int head(cpu_state *s, int n, int n_out, float *logits) {
    const model_config *c = &s->m->config;
    int first = n - n_out;
    products_input(s->xn, s->xn_scale, s->x + (int64_t)first * c->n_embd, &s->m->output_norm, n_out, c->n_embd,
                   c->rms_eps);
    return matmul_normed(s, &s->m->output, s->xn, s->xn_scale, n_out, logits);
}

static moe_status forward_step(cpu_state *s, const int32_t *tokens, int n, int pos, float *logits, int n_out,
                               moe_error *err) {
    embed(s, tokens, n);
    for (int l = 0; l < s->m->config.n_layers; l++)
        if (attention_block(s, l, n, pos) || ffn_block(s, l, n))
            return moe_error_set(err, MOE_ERR_NOMEM, "out of memory in layer %d", l);
    if (logits && n_out > 0 && head(s, n, n_out, logits))
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory in the output head");
    return MOE_OK;
}

static moe_status check_input(const cpu_state *s, const int32_t *tokens, int n, int pos, moe_error *err) {
    if (n <= 0) return moe_error_set(err, MOE_ERR_INVALID_ARG, "no tokens to process");
    if (pos < 0 || (int64_t)pos + n > s->n_ctx)
        return moe_error_set(err, MOE_ERR_RANGE, "positions %d..%d exceed the context of %d tokens", pos, pos + n - 1,
                             s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->m->config.n_vocab)
            return moe_error_set(err, MOE_ERR_RANGE, "token id %d is outside the vocabulary of %d", tokens[i],
                                 s->m->config.n_vocab);
    return MOE_OK;
}

moe_status cpu_forward(cpu_state *s, const int32_t *tokens, int n, int pos, float *logits, bool all_logits,
                       moe_error *err) {
    moe_status st = check_input(s, tokens, n, pos, err);
    int64_t vocab = s->m->config.n_vocab;
    for (int done = 0; st == MOE_OK && done < n; done += s->max_batch) {
        int step = n - done < s->max_batch ? n - done : s->max_batch;
        bool last = done + step == n;
        float *out = !logits ? NULL : all_logits ? logits + (int64_t)done * vocab : last ? logits : NULL;
        int n_out = all_logits ? step : last ? 1 : 0;
        st = forward_step(s, tokens + done, step, pos + done, out, n_out, err);
    }
    return st;
}
