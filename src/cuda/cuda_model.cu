/*
 * cuda_model.cu — the format table and the upload of a model's weights.
 *
 * Every weight goes into one device allocation (the arena), laid out by a
 * dry run of the same code that later copies: the first pass only adds up
 * sizes, so the error for a model that does not fit names the exact bytes
 * needed and free before anything is allocated. Matrices keep their quant
 * type; each family file (q4_k.cu, ...) says how its blocks are laid out on
 * the device and repacks rows on the host when the GGUF block is not a
 * multiple of 16 bytes. The routed experts of one projection of one layer
 * become one slab, expert e at e * expert_stride, whether the file has
 * them merged (one copy) or as separate tensors. Norm and bias vectors are
 * f32 (the model already converted them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

extern "C" {
#include "cuda/cuda_backend.h"
#include "quant/quant.h"
}

extern const cuda_format cuda_format_f32, cuda_format_f16, cuda_format_bf16, cuda_format_q8_0, cuda_format_q4_0,
    cuda_format_q5_0, cuda_format_iq4_nl, cuda_format_q4_k, cuda_format_q5_k, cuda_format_q6_k;

static const cuda_format *const formats[] = {
    &cuda_format_f32,  &cuda_format_f16,    &cuda_format_bf16, &cuda_format_q8_0, &cuda_format_q4_0,
    &cuda_format_q5_0, &cuda_format_iq4_nl, &cuda_format_q4_k, &cuda_format_q5_k, &cuda_format_q6_k,
};

const cuda_format *cuda_format_of(int type) {
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i]->type == type) return formats[i];
    return NULL;
}

cudaError_t cuda_allow_smem_all(int bytes) {
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0] && e == cudaSuccess; i++) e = formats[i]->allow_smem(bytes);
    return e;
}

cudaError_t cuda_allow_stream_smem(size_t smem_optin) {
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0] && e == cudaSuccess; i++)
        e = formats[i]->allow_stream_smem((int)smem_optin);
    return e;
}

bool cuda_available(void) {
    static int cached = -1;
    if (cached < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) (void)cudaGetLastError();
        cached = e == cudaSuccess && n > 0;
    }
    return cached == 1;
}

/* ---------------------------------------------------------------- uploads */

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static uint8_t *place(uploader *u, size_t bytes) {
    size_t at = align256(u->used);
    u->used = at + bytes;
    return u->dry ? NULL : u->base + at;
}

static moe_status copy_up(uploader *u, void *dst, const void *src, size_t bytes) {
    moe_error *err = u->err;
    if (u->dry || bytes == 0) return MOE_OK;
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return MOE_OK;
}

const float *upload_vec(uploader *u, const vec *v) {
    if (u->status != MOE_OK || !v->data) return NULL;
    float *dst = (float *)place(u, (size_t)v->n * sizeof(float));
    u->status = copy_up(u, dst, v->data, (size_t)v->n * sizeof(float));
    return dst;
}

/* The repacked rows [r0, r1) of one matrix into the staging buffer. */
static void repack_rows(const cuda_format *f, const uint8_t *src, size_t src_row, int r0, int r1, int nb,
                        size_t row_stride, size_t meta_stride, uint8_t *body, uint8_t *meta) {
    for (int r = r0; r < r1; r++) {
        uint8_t *b = body + (size_t)(r - r0) * row_stride, *m = meta + (size_t)(r - r0) * meta_stride;
        memset(b, 0, row_stride);
        if (f->repack) f->repack(src + (size_t)r * src_row, b, m, nb);
        else memcpy(b, src + (size_t)r * src_row, src_row);
    }
}

moe_status upload_rows(uploader *u, int type, int n_experts, const uint8_t *const *srcs, int64_t rows, int64_t cols,
                       const char *name, dmat *out) {
    moe_error *err = u->err;
    memset(out, 0, sizeof *out);
    if (u->status != MOE_OK) return u->status;
    const cuda_format *f = cuda_format_of(type);
    if (!f)
        return u->status = moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                         "tensor %s has type %s, which the CUDA backend has no kernels for "
                                         "(it runs f32 f16 bf16 q8_0 q4_0 q5_0 iq4_nl q4_k q5_k q6_k; use --device cpu "
                                         "or moe quantize)",
                                         name, quant_format_of((uint32_t)type)->name);
    /* Quantized activations come in blocks of 32; f32 ones in 16-byte units
     * (8 values covers f32, f16 and bf16 rows). */
    const int multiple = f->act == ACT_F32 ? 8 : 32;
    if (cols % multiple != 0 || cols % f->block != 0 || rows > (1 << 30) || cols > (1 << 24))
        return u->status = moe_error_set(err, MOE_ERR_UNSUPPORTED,
                                         "tensor %s: %lld x %lld is not a shape the CUDA kernels take (columns must "
                                         "be a multiple of %d and of %d)",
                                         name, (long long)rows, (long long)cols, multiple, f->block);
    const int nb = (int)(cols / f->block);
    const size_t src_row = quant_row_bytes((moe_type)type, cols);
    const size_t row_stride = align16((size_t)nb * f->body), meta_stride = (size_t)nb * f->meta;
    const size_t expert_body = (size_t)rows * row_stride, expert_meta = (size_t)rows * meta_stride;
    uint8_t *body = place(u, (size_t)n_experts * expert_body);
    uint8_t *meta = f->meta ? place(u, (size_t)n_experts * expert_meta) : NULL;
    out->body = body;
    out->meta = meta;
    out->row_stride = (int64_t)row_stride;
    out->meta_row_stride = (int64_t)meta_stride;
    out->expert_stride = (int64_t)expert_body;
    out->meta_expert_stride = (int64_t)expert_meta;
    out->rows = (int)rows;
    out->cols = (int)cols;
    out->units = nb * f->units;
    out->type = type;
    out->units_magic = div_magic(out->units);
    out->rows_magic = div_magic(out->rows);
    if (u->dry) return MOE_OK;
    for (int e = 0; e < n_experts; e++) {
        if (!f->repack && row_stride == src_row) { /* the GGUF rows are the device rows */
            if ((u->status = copy_up(u, body + e * expert_body, srcs[e], expert_body)) != MOE_OK) return u->status;
            continue;
        }
        /* through the staging buffer, a chunk of rows at a time */
        const size_t per_row = row_stride + meta_stride;
        int chunk = (int)(u->staging_bytes / per_row);
        if (chunk < 1) return u->status = moe_error_set(err, MOE_ERR_NOMEM, "staging buffer too small for %s", name);
        for (int r0 = 0; r0 < rows; r0 += chunk) {
            int r1 = r0 + chunk < rows ? r0 + chunk : (int)rows;
            uint8_t *sb = u->staging, *sm = u->staging + (size_t)chunk * row_stride;
            repack_rows(f, srcs[e], src_row, r0, r1, nb, row_stride, meta_stride, sb, sm);
            if ((u->status = copy_up(u, body + e * expert_body + (size_t)r0 * row_stride, sb,
                                     (size_t)(r1 - r0) * row_stride)) != MOE_OK ||
                (meta && (u->status = copy_up(u, meta + e * expert_meta + (size_t)r0 * meta_stride, sm,
                                              (size_t)(r1 - r0) * meta_stride)) != MOE_OK))
                return u->status;
        }
    }
    return MOE_OK;
}

static dmat upload_matrix(uploader *u, const matrix *m, const char *name) {
    dmat d;
    memset(&d, 0, sizeof d);
    if (!m->data) return d;
    const uint8_t *src = m->data;
    upload_rows(u, m->type, 1, &src, m->rows, m->cols, name, &d);
    return d;
}

static dmat upload_experts(uploader *u, const expert_set *set, int n_experts, const char *name) {
    dmat d;
    upload_rows(u, set->type, n_experts, set->data, set->rows, set->cols, name, &d);
    return d;
}

static void check_same_type(uploader *u, const dmat *a, const dmat *b, const char *what, int layer) {
    if (u->status == MOE_OK && a->type != b->type)
        u->status = moe_error_set(u->err, MOE_ERR_UNSUPPORTED,
                                  "blk.%d: the %s gate and up projections have different types (%s, %s); the CUDA "
                                  "backend fuses them and needs one type",
                                  layer, what, quant_format_of((uint32_t)a->type)->name,
                                  quant_format_of((uint32_t)b->type)->name);
}

static void upload_layer(uploader *u, const model *m, int l, cuda_layer *w) {
    const model_config *c = &m->config;
    const layer_weights *lw = &m->layers[l];
    char name[96];
#define NAME(role) (snprintf(name, sizeof name, "blk.%d.%s", l, role), name)
    w->attn_norm = upload_vec(u, &lw->attn_norm);
    w->ffn_norm = upload_vec(u, &lw->ffn_norm);
    w->wq = upload_matrix(u, &lw->wq, NAME("attn_q.weight"));
    w->wk = upload_matrix(u, &lw->wk, NAME("attn_k.weight"));
    w->wv = upload_matrix(u, &lw->wv, NAME("attn_v.weight"));
    w->wo = upload_matrix(u, &lw->wo, NAME("attn_output.weight"));
    w->bq = upload_vec(u, &lw->bq);
    w->bk = upload_vec(u, &lw->bk);
    w->bv = upload_vec(u, &lw->bv);
    w->q_norm = upload_vec(u, &lw->q_norm);
    w->k_norm = upload_vec(u, &lw->k_norm);
    if (c->n_experts == 0) {
        w->ffn_gate = upload_matrix(u, &lw->ffn_gate, NAME("ffn_gate.weight"));
        w->ffn_up = upload_matrix(u, &lw->ffn_up, NAME("ffn_up.weight"));
        w->ffn_down = upload_matrix(u, &lw->ffn_down, NAME("ffn_down.weight"));
        check_same_type(u, &w->ffn_gate, &w->ffn_up, "FFN", l);
    } else {
        w->router = upload_matrix(u, &lw->router, NAME("ffn_gate_inp.weight"));
        w->exp_gate = upload_experts(u, &lw->exp_gate, c->n_experts, NAME("ffn_gate_exps.weight"));
        w->exp_up = upload_experts(u, &lw->exp_up, c->n_experts, NAME("ffn_up_exps.weight"));
        w->exp_down = upload_experts(u, &lw->exp_down, c->n_experts, NAME("ffn_down_exps.weight"));
        check_same_type(u, &w->exp_gate, &w->exp_up, "expert", l);
        w->has_shared = lw->sh_gate.data != NULL;
        if (w->has_shared) {
            w->sh_gate = upload_matrix(u, &lw->sh_gate, NAME("ffn_gate_shexp.weight"));
            w->sh_up = upload_matrix(u, &lw->sh_up, NAME("ffn_up_shexp.weight"));
            w->sh_down = upload_matrix(u, &lw->sh_down, NAME("ffn_down_shexp.weight"));
            w->sh_gate_inp = upload_vec(u, &lw->sh_gate_inp);
            check_same_type(u, &w->sh_gate, &w->sh_up, "shared expert", l);
        }
    }
#undef NAME
}

static moe_status upload_model(uploader *u, cuda_model *g) {
    const model *m = g->m;
    g->token_embd = upload_matrix(u, &m->token_embd, "token_embd.weight");
    g->output = m->config.tied_embeddings ? g->token_embd : upload_matrix(u, &m->output, "output.weight");
    g->output_norm = upload_vec(u, &m->output_norm);
    g->rope_freqs = upload_vec(u, &m->rope_freqs);
    for (int l = 0; l < m->config.n_layers && u->status == MOE_OK; l++) upload_layer(u, m, l, &g->layers[l]);
    return u->status;
}

/* ---------------------------------------------------------------- the model */

static moe_status check_config(const model_config *c, moe_error *err) {
    const int G = c->n_heads / c->n_kv_heads;
    if (!cuda_attention_supported(G, c->head_dim, c->n_rot, 1))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "the CUDA attention has no kernel for heads of %d dimensions (%d rotated), %d query heads "
                             "per KV head (it takes even sizes up to 32, or 64, 128, 256 dimensions, and up to 16 query heads)",
                             c->head_dim, c->n_rot, G);
    if (c->n_experts && c->n_experts_used > MAX_EXPERTS_USED)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "the CUDA backend routes to at most %d experts per token, not %d",
                             MAX_EXPERTS_USED, c->n_experts_used);
    if (c->n_experts > MAX_ROUTED_EXPERTS)
        return moe_error_set(err, MOE_ERR_UNSUPPORTED, "the CUDA backend routes among at most %d experts, not %d",
                             MAX_ROUTED_EXPERTS, c->n_experts);
    /* the FFN kernels divide their flattened streams of rows and units by div_magic */
    const uint64_t k = c->n_experts ? (uint64_t)c->n_experts_used : 1, rows = c->n_experts ? c->n_ff_expert : c->n_ff;
    if (k * rows * rows >= ((uint64_t)1 << 32))
        return moe_error_set(err, MOE_ERR_UNSUPPORTED,
                             "the CUDA FFN kernels need experts a token x rows^2 below 2^32, not %d x %d^2", (int)k,
                             (int)rows);
    return MOE_OK;
}

moe_status cuda_model_new(const model *m, cuda_model **out, moe_error *err) {
    *out = NULL;
    if (!cuda_available()) return moe_error_set(err, MOE_ERR_UNSUPPORTED, "no CUDA GPU found (use --device cpu)");
    moe_status st = check_config(&m->config, err);
    if (st != MOE_OK) return st;
    cuda_model *g = (cuda_model *)calloc(1, sizeof *g);
    cuda_layer *layers = (cuda_layer *)calloc((size_t)m->config.n_layers, sizeof *layers);
    if (!g || !layers) {
        free(g), free(layers);
        return moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    }
    g->m = m;
    g->layers = layers;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    snprintf(g->device_name, sizeof g->device_name, "%s", prop.name);
    g->n_sm = prop.multiProcessorCount;
    g->smem_optin = prop.sharedMemPerBlockOptin;

    uploader u;
    memset(&u, 0, sizeof u);
    u.dry = true;
    u.err = err;
    if ((st = upload_model(&u, g)) != MOE_OK) {
        cuda_model_free(g);
        return st;
    }
    size_t need = u.used, free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t reserve = (size_t)256 << 20; /* activations, the KV cache of a short context, the runtime */
    if (need + reserve > free_b) {
        st = moe_error_set(err, MOE_ERR_NOMEM,
                           "the model does not fit on the GPU: its weights need %.2f GB (plus %.2f GB for the KV "
                           "cache and activations) but %s has %.2f GB free of %.2f GB (use --device cpu)",
                           need / 1e9, reserve / 1e9, g->device_name, free_b / 1e9, total_b / 1e9);
        cuda_model_free(g);
        return st;
    }
    cudaError_t e = cudaMalloc(&g->arena, need);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cuda_model_free(g);
        return moe_error_set(err, MOE_ERR_NOMEM, "cannot allocate %.2f GB of GPU memory for the weights (%s)", need / 1e9,
                             cudaGetErrorName(e));
    }
    g->arena_bytes = need;
    u.dry = false;
    u.used = 0;
    u.base = g->arena;
    u.staging_bytes = (size_t)64 << 20;
    u.staging = (uint8_t *)malloc(u.staging_bytes);
    if (!u.staging) st = moe_error_set(err, MOE_ERR_NOMEM, "out of memory");
    else st = upload_model(&u, g);
    free(u.staging);
    if (st != MOE_OK) {
        cuda_model_free(g);
        return st;
    }
    *out = g;
    return MOE_OK;
}

void cuda_model_free(cuda_model *g) {
    if (!g) return;
    if (g->arena) cudaFree(g->arena);
    free(g->layers);
    free(g);
}

size_t cuda_model_bytes(const cuda_model *g) { return g->arena_bytes; }
const char *cuda_model_device_name(const cuda_model *g) { return g->device_name; }
